//! The settings of `warren serve` as data: one [`Setting`] per key, from which the flags
//! (`flags`), the resolution of flags over variables over the file (`resolve`) and the
//! reference `docs/settings.md` (`reference`) are made.
//!
//! A module of the binary rather than a crate of its own: the defaults it states come from
//! the library crates (`ProvisionerConfig::new`, `RuntimeLimits::default`, `E2bConfig`), so
//! it sits above them, and nothing but `warren serve` reads it.

mod flags;
#[cfg(test)]
mod reference;
mod resolve;
mod table;
mod typed;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use flags::ServeArgs;
pub use resolve::{check_renames, Resolved, Sources};
pub use table::SETTINGS;
pub use typed::{BackendChoice, LocalRoot, LogFormat, ServeSettings};

/// One setting of `warren serve`.
#[derive(Debug)]
pub struct Setting {
    /// The dotted key in `warren.toml` (`lifecycle.idle_timeout_s`), or the setting's name
    /// when the file cannot hold it (`file` false).
    pub key: &'static str,
    /// Whether `warren.toml` takes the key.
    pub file: bool,
    /// The long flag, without `--`.
    pub flag: Option<&'static str>,
    /// The environment variable.
    pub env: Option<&'static str>,
    /// Former names that still work: flags (without `--`), variables and file keys.
    pub old: Old,
    pub kind: Kind,
    /// What a number counts (`seconds`, `bytes`), empty when nothing.
    pub unit: &'static str,
    pub default: Default,
    pub check: Check,
    /// One paragraph for the reference and `--help`.
    pub doc: &'static str,
}

/// Former names of a setting, still accepted (a file naming both the old and the new key
/// is refused, naming both).
#[derive(Debug, Clone, Copy)]
pub struct Old {
    pub flags: &'static [&'static str],
    pub envs: &'static [&'static str],
    pub keys: &'static [&'static str],
}

impl Old {
    pub const NONE: Self = Self {
        flags: &[],
        envs: &[],
        keys: &[],
    };
}

/// What a setting's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    /// Text never shown back (logs, errors, the reference's defaults).
    Secret,
    Path,
    Address,
    Integer,
    Bool,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// Not a single value: a table of named entries, a list or a network policy, read by
    /// the section of `warren.toml` that holds it. The table documents it; the flags and
    /// the resolution leave it to that section.
    Structured(&'static str),
}

impl Kind {
    /// The word the reference uses for the type.
    pub fn describe(self) -> String {
        match self {
            Self::Text | Self::Secret => "string".to_owned(),
            Self::Path => "path".to_owned(),
            Self::Address => "host:port".to_owned(),
            Self::Integer => "integer".to_owned(),
            Self::Bool => "boolean".to_owned(),
            Self::Choice(words) => words
                .iter()
                .map(|word| format!("`{word}`"))
                .collect::<Vec<_>>()
                .join(" | "),
            Self::Structured(what) => what.to_owned(),
        }
    }
}

/// A setting's value when nothing sets it.
#[derive(Debug, Clone, Copy)]
pub enum Default {
    /// A value, computed from the one place that states it.
    Value(fn() -> Value),
    /// Unset; warren then does what the text says (computed at start-up, or off).
    Unset(&'static str),
}

/// What a value must satisfy beyond its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Any,
    /// An integer at least this.
    AtLeast(u64),
    /// A number of seconds, at least one.
    Seconds,
}

/// A resolved value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Text(String),
    Path(PathBuf),
    Address(SocketAddr),
    Integer(u64),
    Bool(bool),
}

impl Value {
    /// As the reference and `--help` show it (TOML's syntax).
    pub fn render(&self) -> String {
        match self {
            Self::Text(text) => format!("{text:?}"),
            Self::Path(path) => format!("{:?}", path.display().to_string()),
            Self::Address(address) => format!("\"{address}\""),
            Self::Integer(n) => n.to_string(),
            Self::Bool(b) => b.to_string(),
        }
    }
}

/// The setting of `key`; a key not in the table is a mistake of warren's code.
pub fn setting(key: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|setting| setting.key == key)
        .unwrap_or_else(|| panic!("{key} is not in the settings table"))
}
