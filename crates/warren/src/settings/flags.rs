//! `warren serve`'s flags, made from the table: one per setting that has one, its help the
//! setting's documentation with its variable, file key and default.

use std::collections::BTreeMap;

use clap::{Arg, ArgAction, ArgMatches, Command};

use super::{Default, Kind, Setting, SETTINGS};

/// The values given on `warren serve`'s command line, by setting key.
#[derive(Debug, Clone, PartialEq, Eq, core::default::Default)]
pub struct ServeArgs {
    pub flags: BTreeMap<&'static str, String>,
}

/// The flag of `setting`.
fn arg(setting: &'static Setting, flag: &'static str) -> Arg {
    let mut help = setting.doc.to_owned();
    if let Some(var) = setting.env {
        help.push_str(&format!(" [env: {var}]"));
    }
    if setting.file {
        help.push_str(&format!(" [file: {}]", setting.key));
    }
    match setting.default {
        Default::Value(value) => help.push_str(&format!(" [default: {}]", value().render())),
        Default::Unset(text) => help.push_str(&format!(" [default: {text}]")),
    }
    let arg = Arg::new(setting.key)
        .long(flag)
        .help(help)
        .aliases(setting.old.flags.iter().copied());
    match setting.kind {
        Kind::Bool => arg.action(ArgAction::SetTrue),
        Kind::Choice(words) => {
            arg.action(ArgAction::Set)
                .value_parser(clap::builder::PossibleValuesParser::new(
                    words.iter().copied(),
                ))
        }
        _ => arg.action(ArgAction::Set).value_name(match setting.kind {
            Kind::Path => "PATH",
            Kind::Address => "HOST:PORT",
            Kind::Integer => "N",
            _ => "TEXT",
        }),
    }
}

impl clap::Args for ServeArgs {
    fn augment_args(command: Command) -> Command {
        SETTINGS
            .iter()
            .fold(command, |command, setting| match setting.flag {
                Some(flag) => command.arg(arg(setting, flag)),
                None => command,
            })
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

impl clap::FromArgMatches for ServeArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = BTreeMap::new();
        for setting in SETTINGS.iter().filter(|setting| setting.flag.is_some()) {
            let value = match setting.kind {
                Kind::Bool => matches.get_flag(setting.key).then(|| "true".to_owned()),
                _ => matches.get_one::<String>(setting.key).cloned(),
            };
            if let Some(value) = value {
                flags.insert(setting.key, value);
            }
        }
        Ok(Self { flags })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::{FromArgMatches, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parse(argv: &[&str]) -> Result<ServeArgs, clap::Error> {
        let matches = <Serve as clap::CommandFactory>::command()
            .try_get_matches_from(std::iter::once("serve").chain(argv.iter().copied()))?;
        Ok(Serve::from_arg_matches(&matches)?.args)
    }

    #[test]
    fn every_flag_of_the_table_is_a_flag_of_serve_and_lands_on_its_key() {
        let parsed =
            parse(&["--listen", "127.0.0.1:0", "--docker", "--backend", "docker"]).unwrap();
        assert_eq!(parsed.flags["listen"], "127.0.0.1:0");
        assert_eq!(parsed.flags["docker.enabled"], "true");
        assert_eq!(parsed.flags["backend"], "docker");
        assert!(parse(&["--backend", "docker-ish"]).is_err());
        let help = <Serve as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        for setting in SETTINGS {
            if let Some(flag) = setting.flag {
                assert!(help.contains(&format!("--{flag}")), "--{flag}");
            }
            if let (Some(var), Some(_)) = (setting.env, setting.flag) {
                assert!(help.contains(var), "{var}");
            }
        }
    }

    #[test]
    fn old_flag_names_still_work() {
        for setting in SETTINGS {
            for old in setting.old.flags {
                let value = match setting.kind {
                    Kind::Choice(words) => words[0],
                    _ => "1",
                };
                let argv: Vec<String> = match setting.kind {
                    Kind::Bool => vec![format!("--{old}")],
                    _ => vec![format!("--{old}"), value.to_owned()],
                };
                let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                let parsed = parse(&argv).unwrap();
                assert!(parsed.flags.contains_key(setting.key), "--{old}");
            }
        }
    }
}
