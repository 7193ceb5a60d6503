//! `docs/settings.md`, rendered from the table, and the checks that the reference, the
//! example file and the file's schema name every setting.

use super::{Check, Default, Setting};

/// The section a key is documented under: the part before its first dot.
fn section(key: &str) -> &str {
    key.split_once('.').map_or("", |(section, _)| section)
}

/// A Markdown table cell: pipes escaped, and `<` outside code spans so `<data_dir>` shows.
fn cell(text: &str) -> String {
    text.split('`')
        .enumerate()
        .map(|(n, part)| match n % 2 {
            0 => part.replace('<', "&lt;"),
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("`")
        .replace('|', "\\|")
        .replace('\n', " ")
}

fn code(text: &str) -> String {
    format!("`{text}`")
}

/// `docs/settings.md` for `settings`.
pub fn render(settings: &[Setting]) -> String {
    let mut out = String::from(
        "# Settings of `warren serve`\n\n\
         <!-- Rendered from crates/warren/src/settings/table.rs by `WARREN_BLESS=1 cargo test \
         -p warren --features memory-backend --bin warren settings`; edit the table there. -->\n\n\
         Each setting is read from its flag, else its environment variable, else its key in \
         the file `--config` names (`warren.toml`; [warren.example.toml](../warren.example.toml) \
         shows every key), else its default. A bad value stops warren at start-up, naming \
         where it came from; so do unknown keys of the file, with their line. An old name \
         still works, and warren logs a warning saying the new one; a file setting a key \
         under both names is refused.\n",
    );
    let mut current = None;
    for setting in settings {
        let this = section(setting.key);
        if current != Some(this) {
            current = Some(this);
            out.push_str(&match this {
                "" => "\n## The server\n\n".to_owned(),
                name => format!("\n## [{name}]\n\n"),
            });
            out.push_str(
                "| key | flag | variable | type | default | meaning |\n|---|---|---|---|---|---|\n",
            );
        }
        let key = if setting.file {
            code(setting.key)
        } else {
            format!("({}, not in the file)", setting.key)
        };
        let flag = setting
            .flag
            .map(|flag| code(&format!("--{flag}")))
            .unwrap_or_default();
        let env = setting.env.map(code).unwrap_or_default();
        let mut kind = setting.kind.describe();
        match (setting.unit, setting.check) {
            (_, Check::Seconds) => kind.push_str(", seconds, at least 1"),
            (unit, Check::AtLeast(min)) => kind.push_str(&format!(", {unit}, at least {min}")),
            ("", Check::Any) => {}
            (unit, Check::Any) => kind.push_str(&format!(", {unit}")),
        }
        let default = match setting.default {
            Default::Value(value) => code(&value().render()),
            Default::Unset(text) => text.to_owned(),
        };
        let mut doc = setting.doc.to_owned();
        let old = setting.old;
        let old_names: Vec<String> = old
            .keys
            .iter()
            .map(|key| code(key))
            .chain(old.flags.iter().map(|flag| code(&format!("--{flag}"))))
            .chain(old.envs.iter().map(|var| code(var)))
            .collect();
        if !old_names.is_empty() {
            doc.push_str(&format!(
                " Old names, still accepted: {}.",
                old_names.join(", ")
            ));
        }
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            cell(&key),
            cell(&flag),
            cell(&env),
            cell(&kind),
            cell(&default),
            cell(&doc)
        ));
    }
    out
}

/// The keys of the file `settings` names that `documented` (the keys a document shows)
/// lacks. A structured setting is documented by its key or any key under it.
pub fn missing<'s>(
    settings: &'s [Setting],
    documented: &std::collections::BTreeSet<String>,
) -> Vec<&'s str> {
    settings
        .iter()
        .filter(|setting| setting.file)
        .filter(|setting| {
            let under = format!("{}.", setting.key);
            !documented
                .iter()
                .any(|key| key == setting.key || key.starts_with(&under))
        })
        .map(|setting| setting.key)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::{Kind, Old, Value, SETTINGS};
    use super::*;
    use crate::cmd::settings_reference;

    /// `docs/settings.md` is the table, rendered: a setting added without rendering it
    /// fails this test. `WARREN_BLESS=1` writes it.
    #[test]
    fn the_settings_reference_is_the_table_rendered() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/settings.md");
        let rendered = render(SETTINGS);
        if std::env::var_os("WARREN_BLESS").is_some() {
            std::fs::write(&path, &rendered).unwrap();
        }
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == rendered,
            "docs/settings.md is not the table in crates/warren/src/settings/table.rs; run \
             `WARREN_BLESS=1 cargo test -p warren --features memory-backend --bin warren \
             settings` and commit it"
        );
    }

    #[test]
    fn the_example_file_shows_every_setting_of_the_table() {
        let missing = missing(SETTINGS, &settings_reference::example_keys());
        assert!(
            missing.is_empty(),
            "warren.example.toml lacks these settings of the table: {missing:?}"
        );
    }

    #[test]
    fn every_key_the_file_takes_is_a_setting_of_the_table_and_the_reverse() {
        let accepted = settings_reference::accepted_keys();
        let file_keys: Vec<&Setting> = SETTINGS.iter().filter(|s| s.file).collect();
        let covered = |key: &str| {
            file_keys.iter().any(|setting| {
                key == setting.key
                    || setting.old.keys.contains(&key)
                    || (matches!(setting.kind, Kind::Structured(_))
                        && key.starts_with(&format!("{}.", setting.key)))
            })
        };
        let not_in_table: Vec<&String> = accepted.iter().filter(|key| !covered(key)).collect();
        assert!(
            not_in_table.is_empty(),
            "warren.toml takes these keys the settings table lacks: {not_in_table:?}"
        );
        let not_in_file: Vec<&str> = file_keys
            .iter()
            .map(|setting| setting.key)
            .filter(|key| {
                !accepted.contains(*key)
                    && !accepted.iter().any(|k| k.starts_with(&format!("{key}.")))
            })
            .collect();
        assert!(
            not_in_file.is_empty(),
            "the settings table has keys warren.toml does not take: {not_in_file:?}"
        );
    }

    /// A value the example file states (not commented out) is the table's default: the
    /// default is stated once, in the table, and the example cannot drift from it.
    #[test]
    fn the_values_the_example_file_states_are_the_defaults() {
        let example: toml::Table = toml::from_str(settings_reference::EXAMPLE).unwrap();
        let empty = toml::Table::new();
        let env = |_: &str| None;
        let defaults = super::super::Resolved::resolve(&super::super::Sources {
            flags: std::collections::BTreeMap::new(),
            env: &env,
            file: &empty,
        })
        .unwrap();
        let stated = super::super::Resolved::resolve(&super::super::Sources {
            flags: std::collections::BTreeMap::new(),
            env: &env,
            file: &example,
        })
        .unwrap();
        let mut checked = 0;
        for setting in SETTINGS.iter().filter(|s| s.file) {
            if matches!(setting.kind, Kind::Structured(_)) {
                continue;
            }
            if stated.origin(setting.key) != defaults.origin(setting.key) {
                checked += 1;
                let value = match setting.kind {
                    Kind::Integer => stated.integer(setting.key).map(Value::Integer),
                    Kind::Bool => stated.boolean(setting.key).map(Value::Bool),
                    Kind::Address => stated.address(setting.key).map(Value::Address),
                    Kind::Path => stated.path(setting.key).map(Value::Path),
                    _ => stated.text(setting.key).map(Value::Text),
                };
                let Default::Value(default) = setting.default else {
                    panic!(
                        "warren.example.toml sets {} = {value:?}, which has no default: comment it out",
                        setting.key
                    );
                };
                assert_eq!(
                    value,
                    Some(default()),
                    "{} in warren.example.toml",
                    setting.key
                );
            }
        }
        assert!(
            checked > 25,
            "only {checked} values of the example were checked"
        );
    }

    #[test]
    fn a_setting_the_example_file_lacks_is_named() {
        static TABLE: &[Setting] = &[
            Setting {
                key: "listen",
                file: true,
                flag: Some("listen"),
                env: None,
                old: Old::NONE,
                kind: Kind::Address,
                unit: "",
                default: Default::Unset("none"),
                check: Check::Any,
                doc: "Where to listen.",
            },
            Setting {
                key: "lifecycle.brand_new_s",
                file: true,
                flag: None,
                env: None,
                old: Old::NONE,
                kind: Kind::Integer,
                unit: "seconds",
                default: Default::Value(|| Value::Integer(5)),
                check: Check::Seconds,
                doc: "A setting someone added to the table only.",
            },
            Setting {
                key: "sandbox_env",
                file: true,
                flag: None,
                env: None,
                old: Old::NONE,
                kind: Kind::Structured("table"),
                unit: "",
                default: Default::Unset("none"),
                check: Check::Any,
                doc: "Variables.",
            },
        ];
        let documented: BTreeSet<String> = ["listen", "lifecycle.idle_timeout_s", "sandbox_env"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        assert_eq!(missing(TABLE, &documented), ["lifecycle.brand_new_s"]);
        let rendered = render(TABLE);
        assert!(
            rendered.contains("| `lifecycle.brand_new_s` |"),
            "{rendered}"
        );
        assert!(
            rendered.contains("integer, seconds, at least 1"),
            "{rendered}"
        );
        // And the real example file lacks it too: the check would fail the suite.
        assert!(
            missing(TABLE, &settings_reference::example_keys()).contains(&"lifecycle.brand_new_s")
        );
    }
}
