//! Resolution: each setting of the table from its flag, else its variable, else the file,
//! else its default, parsed to its kind and checked, errors naming where the value came
//! from. Pure: the environment is a function and the file a parsed table, so every rule
//! is tested without starting the binary.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};

use super::{setting, Check, Default, Kind, Setting, Value, SETTINGS};

/// What a resolution reads.
pub struct Sources<'a> {
    /// Values given on the command line, by key, as typed.
    pub flags: BTreeMap<&'static str, String>,
    /// The environment.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// `warren.toml`, parsed (empty without `--config`).
    pub file: &'a toml::Table,
}

/// Where a resolved value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Flag(&'static str),
    Env(&'static str),
    /// The key as the file spells it (an old name, perhaps).
    File(&'static str),
    Default,
}

impl Origin {
    /// How an error names it.
    pub fn describe(&self) -> String {
        match self {
            Self::Flag(flag) => format!("--{flag}"),
            Self::Env(var) => (*var).to_owned(),
            Self::File(key) => format!("{key} in the configuration"),
            Self::Default => "the default".to_owned(),
        }
    }
}

/// Every single-valued setting, resolved.
#[derive(Debug)]
pub struct Resolved {
    values: BTreeMap<&'static str, (Option<Value>, Origin)>,
    /// Old names used, to log once logging is set up.
    pub notices: Vec<String>,
}

/// A raw value before parsing.
enum Raw {
    Text(String),
    Toml(toml::Value),
}

impl Resolved {
    pub fn resolve(sources: &Sources<'_>) -> anyhow::Result<Self> {
        let mut values = BTreeMap::new();
        let mut notices = Vec::new();
        for setting in SETTINGS {
            if matches!(setting.kind, Kind::Structured(_)) {
                continue;
            }
            let Some((raw, origin)) = find(setting, sources, &mut notices)? else {
                let default = match setting.default {
                    Default::Value(value) => Some(value()),
                    Default::Unset(_) => None,
                };
                values.insert(setting.key, (default, Origin::Default));
                continue;
            };
            let value =
                parse(setting, raw).map_err(|error| anyhow!("{}: {error}", origin.describe()))?;
            check(setting, &value, &origin)?;
            values.insert(setting.key, (Some(value), origin));
        }
        Ok(Self { values, notices })
    }

    fn get(&self, key: &str) -> Option<&Value> {
        let setting = setting(key);
        self.values
            .get(setting.key)
            .unwrap_or_else(|| panic!("{key} is structured: its section reads it"))
            .0
            .as_ref()
    }

    /// Where `key`'s value came from.
    pub fn origin(&self, key: &str) -> &Origin {
        &self.values[setting(key).key].1
    }

    pub fn text(&self, key: &str) -> Option<String> {
        match self.get(key) {
            Some(Value::Text(text)) => Some(text.clone()),
            None => None,
            other => panic!("{key} is not text: {other:?}"),
        }
    }

    pub fn path(&self, key: &str) -> Option<PathBuf> {
        match self.get(key) {
            Some(Value::Path(path)) => Some(path.clone()),
            None => None,
            other => panic!("{key} is not a path: {other:?}"),
        }
    }

    pub fn address(&self, key: &str) -> Option<SocketAddr> {
        match self.get(key) {
            Some(Value::Address(address)) => Some(*address),
            None => None,
            other => panic!("{key} is not an address: {other:?}"),
        }
    }

    pub fn integer(&self, key: &str) -> Option<u64> {
        match self.get(key) {
            Some(Value::Integer(n)) => Some(*n),
            None => None,
            other => panic!("{key} is not an integer: {other:?}"),
        }
    }

    pub fn boolean(&self, key: &str) -> Option<bool> {
        match self.get(key) {
            Some(Value::Bool(b)) => Some(*b),
            None => None,
            other => panic!("{key} is not a boolean: {other:?}"),
        }
    }

    pub fn duration(&self, key: &str) -> Option<Duration> {
        self.integer(key).map(Duration::from_secs)
    }

    /// A setting whose default is a value: never unset.
    pub fn required<T>(&self, key: &str, get: impl Fn(&Self, &str) -> Option<T>) -> T {
        get(self, key).unwrap_or_else(|| panic!("{key} has a default"))
    }
}

/// The first source that sets `setting`: its flag, its variable (or an old one), its key
/// in the file (or an old one; both is a mistake).
fn find(
    setting: &'static Setting,
    sources: &Sources<'_>,
    notices: &mut Vec<String>,
) -> anyhow::Result<Option<(Raw, Origin)>> {
    if let (Some(flag), Some(value)) = (setting.flag, sources.flags.get(setting.key)) {
        return Ok(Some((Raw::Text(value.clone()), Origin::Flag(flag))));
    }
    for (var, old) in setting
        .env
        .iter()
        .map(|var| (*var, false))
        .chain(setting.old.envs.iter().map(|var| (*var, true)))
    {
        // An empty variable is unset, except a secret's: an empty token or key is a
        // mistake to report, not a reason to fall back to another source.
        let set = |value: &String| !value.is_empty() || setting.kind == Kind::Secret;
        if let Some(value) = (sources.env)(var).filter(set) {
            if old {
                notices.push(format!(
                    "{var} is an old name of {}: it still works; rename it",
                    setting.env.unwrap_or(setting.key)
                ));
            }
            return Ok(Some((Raw::Text(value), Origin::Env(var))));
        }
    }
    if !setting.file {
        return Ok(None);
    }
    let mut found: Option<(Raw, Origin)> = None;
    for (key, old) in
        std::iter::once((setting.key, false)).chain(setting.old.keys.iter().map(|key| (*key, true)))
    {
        let Some(value) = lookup(sources.file, key) else {
            continue;
        };
        if let Some((_, Origin::File(first))) = &found {
            bail!(
                "{first} and {key} in the configuration are the same setting ({key} is its \
                 old name); keep {}",
                setting.key
            );
        }
        if old {
            notices.push(format!(
                "{key} in the configuration is now called {}: it still works; rename it",
                setting.key
            ));
        }
        found = Some((Raw::Toml(value.clone()), Origin::File(key)));
    }
    Ok(found)
}

/// Refuses a file that sets a setting under its old key and its new one, naming both
/// (checked before the file's schema, which would only say "duplicate field").
pub fn check_renames(file: &toml::Table) -> anyhow::Result<()> {
    for setting in SETTINGS.iter().filter(|setting| setting.file) {
        for old in setting.old.keys {
            if lookup(file, setting.key).is_some() && lookup(file, old).is_some() {
                bail!(
                    "{} and {old} in the configuration are the same setting ({old} is its \
                     old name); keep {}",
                    setting.key,
                    setting.key
                );
            }
        }
    }
    Ok(())
}

/// The value at a dotted key of the file.
fn lookup<'t>(file: &'t toml::Table, key: &str) -> Option<&'t toml::Value> {
    let mut parts = key.split('.');
    let mut value = file.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

fn parse(setting: &Setting, raw: Raw) -> anyhow::Result<Value> {
    let text = match raw {
        Raw::Text(text) => text,
        Raw::Toml(toml::Value::String(text)) => text,
        Raw::Toml(toml::Value::Integer(n)) if setting.kind == Kind::Integer => {
            return u64::try_from(n)
                .map(Value::Integer)
                .map_err(|_| anyhow!("{n} is not a whole number of at least 0"));
        }
        Raw::Toml(toml::Value::Boolean(b)) if setting.kind == Kind::Bool => {
            return Ok(Value::Bool(b))
        }
        Raw::Toml(other) => bail!(
            "expected {}, found {}",
            setting.kind.describe(),
            other.type_str()
        ),
    };
    Ok(match setting.kind {
        Kind::Text | Kind::Secret => Value::Text(text),
        Kind::Path => Value::Path(PathBuf::from(text)),
        Kind::Address => {
            Value::Address(text.parse().map_err(|_| {
                anyhow!("{text:?} is not an address (host:port, e.g. 127.0.0.1:7878)")
            })?)
        }
        Kind::Integer => Value::Integer(
            text.trim()
                .parse()
                .map_err(|_| anyhow!("{text:?} is not a whole number"))?,
        ),
        Kind::Bool => Value::Bool(match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => bail!("{text:?} is not true or false"),
        }),
        Kind::Choice(words) => {
            let word = text.trim().to_ascii_lowercase();
            if !words.contains(&word.as_str()) {
                bail!("{text:?}: use {}", one_of(words));
            }
            Value::Text(word)
        }
        Kind::Structured(_) => unreachable!("structured settings are not resolved"),
    })
}

/// `"a", "b" or "c"`.
pub fn one_of(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|word| format!("{word:?}")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

fn check(setting: &Setting, value: &Value, origin: &Origin) -> anyhow::Result<()> {
    let Value::Integer(n) = value else {
        return Ok(());
    };
    let subject = match origin {
        Origin::File(key) => format!("{key} in the configuration"),
        other => format!("{} ({})", setting.key, other.describe()),
    };
    match setting.check {
        Check::Any => Ok(()),
        Check::Seconds if *n == 0 => bail!("{subject} must be at least 1 second"),
        Check::AtLeast(min) if *n < min => bail!("{subject} must be at least {min}"),
        _ => Ok(()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Resolves flags, variables and a file's text.
    pub(crate) fn resolve(
        flags: &[(&'static str, &str)],
        env: &[(&str, &str)],
        file: &str,
    ) -> anyhow::Result<Resolved> {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let lookup = move |name: &str| env.get(name).cloned();
        let file: toml::Table = toml::from_str(file).unwrap();
        Resolved::resolve(&Sources {
            flags: flags.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            env: &lookup,
            file: &file,
        })
    }

    #[test]
    fn a_flag_wins_over_its_variable_which_wins_over_the_file_which_wins_over_the_default() {
        let key = "lifecycle.idle_timeout_s";
        let file = "[lifecycle]\nidle_timeout_s = 30\n";
        let env = [("WARREN_IDLE_TIMEOUT", "20")];
        let all = resolve(&[(key, "10")], &env, file).unwrap();
        assert_eq!(
            (all.integer(key), all.origin(key)),
            (Some(10), &Origin::Flag("idle-timeout"))
        );
        let no_flag = resolve(&[], &env, file).unwrap();
        assert_eq!(no_flag.integer(key), Some(20));
        let file_only = resolve(&[], &[], file).unwrap();
        assert_eq!(file_only.integer(key), Some(30));
        let nothing = resolve(&[], &[], "").unwrap();
        assert_eq!(
            nothing.integer(key),
            Some(
                warren_provisioner::ProvisionerConfig::new("/")
                    .idle_timeout
                    .as_secs()
            )
        );
        assert_eq!(nothing.origin(key), &Origin::Default);
    }

    #[test]
    fn a_bad_value_is_refused_naming_where_it_came_from() {
        for (flags, env, file, expected) in [
            (&[("lifecycle.idle_timeout_s", "0")][..], &[][..], "", "(--idle-timeout) must be at least 1 second"),
            (&[], &[("WARREN_LISTEN", "nowhere")][..], "", "WARREN_LISTEN: \"nowhere\" is not an address"),
            (&[], &[], "backend = \"docker-ish\"", "backend in the configuration: \"docker-ish\": use \"local\", \"docker\", \"kubernetes\" or \"memory\""),
            (&[], &[], "[limits]\nmemory_bytes = 0", "limits.memory_bytes in the configuration must be at least 1"),
            (&[], &[], "[exec]\nmax_timeout_s = -5", "exec.max_timeout_s in the configuration: -5 is not a whole number"),
            (&[], &[("WARREN_DOCKER", "maybe")], "", "WARREN_DOCKER: \"maybe\" is not true or false"),
            (&[], &[], "listen = 7878", "listen in the configuration: expected host:port, found integer"),
        ] {
            let error = resolve(flags, env, file).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn an_empty_variable_is_unset_unless_a_secret_and_booleans_take_the_usual_words() {
        let resolved = resolve(&[], &[("WARREN_LISTEN", "")], "").unwrap();
        assert_eq!(resolved.origin("listen"), &Origin::Default);
        let token = resolve(&[], &[("WARREN_TOKEN", "")], "").unwrap();
        assert_eq!(
            token.text("token").as_deref(),
            Some(""),
            "an empty secret is refused later"
        );
        for (word, expected) in [("1", true), ("yes", true), ("off", false), ("FALSE", false)] {
            let resolved = resolve(&[], &[("WARREN_DOCKER", word)], "").unwrap();
            assert_eq!(resolved.boolean("docker.enabled"), Some(expected), "{word}");
        }
    }

    #[test]
    fn old_names_of_the_tier_and_of_e2bs_timeouts_still_work_and_say_the_new_name() {
        for (flags, env, file) in [
            (&[("tier", "gvisor")][..], &[][..], ""),
            (&[], &[("WARREN_ISOLATION", "gvisor")][..], ""),
            (&[], &[], "isolation = \"gvisor\""),
        ] {
            let resolved = resolve(flags, env, file).unwrap();
            assert_eq!(
                resolved.text("tier").as_deref(),
                Some("gvisor"),
                "{env:?} {file}"
            );
            if flags.is_empty() {
                assert!(
                    resolved
                        .notices
                        .iter()
                        .any(|notice| notice.to_lowercase().contains("tier")),
                    "{:?}",
                    resolved.notices
                );
            }
        }
        // The new variable wins over the old one.
        let both = resolve(
            &[],
            &[("WARREN_TIER", "kernel"), ("WARREN_ISOLATION", "gvisor")],
            "",
        )
        .unwrap();
        assert_eq!(both.text("tier").as_deref(), Some("kernel"));
        let old = resolve(
            &[],
            &[],
            "[e2b]\ndefault_timeout_s = 60\nmax_timeout_s = 600",
        )
        .unwrap();
        assert_eq!(old.integer("e2b.sandbox_timeout_s"), Some(60));
        assert_eq!(old.integer("e2b.max_sandbox_timeout_s"), Some(600));
        assert!(old.notices[0].contains(
            "e2b.default_timeout_s in the configuration is now called e2b.sandbox_timeout_s"
        ));
        assert_eq!(
            old.origin("e2b.sandbox_timeout_s"),
            &Origin::File("e2b.default_timeout_s")
        );
    }

    #[test]
    fn a_file_naming_a_setting_by_its_old_and_new_key_is_refused_naming_both() {
        let error = resolve(
            &[],
            &[],
            "[e2b]\nsandbox_timeout_s = 60\ndefault_timeout_s = 60",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("e2b.sandbox_timeout_s and e2b.default_timeout_s")
                && error.contains("keep e2b.sandbox_timeout_s"),
            "{error}"
        );
    }

    #[test]
    fn settings_with_nothing_to_say_stay_unset() {
        let resolved = resolve(&[], &[], "").unwrap();
        assert_eq!(resolved.path("data_dir"), None);
        assert_eq!(resolved.text("state.url"), None);
        assert_eq!(one_of(&["a"]), "\"a\"");
    }
}
