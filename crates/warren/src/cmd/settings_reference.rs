//! The check that `warren.example.toml`, the settings' reference, documents every key
//! `warren.toml` takes: the keys are read from the structs the file is parsed into (with
//! `deny_unknown_fields`, so these are exactly the keys warren accepts), the documented
//! ones from the example file, commented out or not. A key added to a section without a
//! line in the example file fails the suite, naming the key.

use std::collections::{BTreeMap, BTreeSet};

/// The sources of the structs `warren.toml` is read into.
const SOURCES: [&str; 3] = [
    include_str!("config.rs"),
    include_str!("../../../warren-kubernetes/src/deploy.rs"),
    include_str!("../../../warren-e2b/src/config.rs"),
];

/// The reference.
pub(crate) const EXAMPLE: &str = include_str!("../../../../warren.example.toml");

/// The struct the whole file is.
const ROOT: &str = "ConfigFile";

/// Each struct's fields and their types, by the struct's name.
type Structs = BTreeMap<String, Vec<(String, String)>>;

/// The `pub struct Name { pub field: Type, ... }` items of `sources`.
fn structs(sources: &[&str]) -> Structs {
    let mut found = Structs::new();
    for source in sources {
        let mut current: Option<String> = None;
        for line in source.lines() {
            if let Some(rest) = line.strip_prefix("pub struct ") {
                current = rest
                    .strip_suffix(" {")
                    .map(|name| name.trim().to_owned())
                    .filter(|name| !name.contains('<'));
                continue;
            }
            if line == "}" {
                current = None;
                continue;
            }
            let (Some(name), Some(field)) = (&current, line.strip_prefix("    pub ")) else {
                continue;
            };
            if let Some((key, ty)) = field.strip_suffix(',').and_then(|f| f.split_once(": ")) {
                if !key.contains('(') {
                    found
                        .entry(name.clone())
                        .or_default()
                        .push((key.to_owned(), ty.to_owned()));
                }
            }
        }
    }
    found
}

/// What a field's type makes of its key.
enum Shape {
    /// One value.
    Leaf,
    /// A table: a struct of the sources.
    Table(String),
    /// Entries a user names, each a struct of the sources (`[quotas.users.NAME]`).
    NamedTables(String),
    /// Entries a user names, each a value (`[sandbox_env]`).
    NamedValues,
}

fn last_segment(ty: &str) -> &str {
    ty.rsplit("::").next().unwrap_or(ty).trim()
}

fn shape(ty: &str, structs: &Structs) -> Shape {
    let ty = ty.trim();
    let ty = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    if let Some(inner) = ty
        .strip_prefix("BTreeMap<String, ")
        .and_then(|t| t.strip_suffix('>'))
    {
        let value = last_segment(inner);
        return if structs.contains_key(value) {
            Shape::NamedTables(value.to_owned())
        } else {
            Shape::NamedValues
        };
    }
    let name = last_segment(ty);
    if structs.contains_key(name) {
        Shape::Table(name.to_owned())
    } else {
        Shape::Leaf
    }
}

/// Every key warren accepts, dotted from the root; a name a user picks is `*`.
fn accepted(structs: &Structs) -> BTreeSet<String> {
    fn walk(structs: &Structs, name: &str, prefix: &str, out: &mut BTreeSet<String>) {
        for (key, ty) in structs.get(name).into_iter().flatten() {
            let path = format!("{prefix}{key}");
            match shape(ty, structs) {
                Shape::Leaf | Shape::NamedValues => {
                    out.insert(path);
                }
                Shape::Table(inner) => walk(structs, &inner, &format!("{path}."), out),
                Shape::NamedTables(inner) => walk(structs, &inner, &format!("{path}.*."), out),
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(structs, ROOT, "", &mut out);
    out
}

/// What the lines under a table header are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lines {
    /// Keys of a struct.
    Keys,
    /// Entries a user names, each a table written inline (`name = { key = … }`).
    NamedTables,
    /// Entries a user names, each a value.
    NamedValues,
}

/// The dotted path of a table header (names a user picks as `*`), and what its lines are.
fn table(structs: &Structs, header: &str) -> (String, Lines) {
    let mut path: Vec<String> = Vec::new();
    let mut current = Some(ROOT.to_owned());
    let mut named = false;
    for segment in header.split('.') {
        if named {
            path.push("*".to_owned());
            named = false;
            continue;
        }
        path.push(segment.to_owned());
        let ty = current
            .as_ref()
            .and_then(|name| structs.get(name))
            .and_then(|fields| fields.iter().find(|(key, _)| key == segment))
            .map(|(_, ty)| ty.clone());
        current = match ty.map(|ty| shape(&ty, structs)) {
            Some(Shape::Table(inner)) => Some(inner),
            Some(Shape::NamedTables(inner)) => {
                named = true;
                Some(inner)
            }
            _ => None,
        };
    }
    let lines = match (named, current) {
        (true, _) => Lines::NamedTables,
        (false, Some(_)) => Lines::Keys,
        (false, None) => Lines::NamedValues,
    };
    (path.join("."), lines)
}

/// Every key the example file documents (a line `key = …`, commented out or not), dotted
/// from the root as [`accepted`] writes them.
fn documented(structs: &Structs, example: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut section = String::new();
    let mut lines = Lines::Keys;
    for line in example.lines() {
        let text = line.trim_start_matches('#').trim();
        if let Some(header) = text.strip_prefix('[').and_then(|t| t.split(']').next()) {
            if !header.is_empty() && !header.contains(' ') {
                let (path, kind) = table(structs, header);
                // A table of named values documents the key that holds them.
                out.insert(path.clone());
                lines = kind;
                section = path;
                continue;
            }
        }
        let Some((key, value)) = text.split_once('=') else {
            continue;
        };
        let key = key.trim().trim_matches('"');
        if key.is_empty() || key.contains(' ') {
            continue;
        }
        let prefix = if section.is_empty() {
            String::new()
        } else {
            format!("{section}.")
        };
        match lines {
            Lines::Keys => {
                out.insert(format!("{prefix}{key}"));
            }
            Lines::NamedTables => {
                // `python = { backend = "docker", image = "…" }`
                let inline = value.trim().trim_start_matches('{');
                for pair in inline.split(',') {
                    if let Some((inner, _)) = pair.split_once('=') {
                        out.insert(format!("{prefix}*.{}", inner.trim()));
                    }
                }
            }
            Lines::NamedValues => {}
        }
    }
    out
}

/// The keys warren accepts that the example file does not document.
fn undocumented(sources: &[&str], example: &str) -> Vec<String> {
    let structs = structs(sources);
    let documented = documented(&structs, example);
    accepted(&structs)
        .into_iter()
        .filter(|key| !documented.contains(key))
        .collect()
}

/// Every key `warren.toml` takes, from its structs.
pub(crate) fn accepted_keys() -> BTreeSet<String> {
    accepted(&structs(&SOURCES))
}

/// Every key `warren.example.toml` documents.
pub(crate) fn example_keys() -> BTreeSet<String> {
    documented(&structs(&SOURCES), EXAMPLE)
}

#[test]
fn the_example_file_documents_every_key_warren_toml_takes() {
    let structs = structs(&SOURCES);
    assert!(
        accepted(&structs).len() > 80,
        "the structs of warren.toml were not found: {:?}",
        structs.keys()
    );
    let missing = undocumented(&SOURCES, EXAMPLE);
    assert!(
        missing.is_empty(),
        "warren.example.toml lacks these keys of warren.toml (`*` is a name you pick): {missing:?}"
    );
}

#[test]
fn a_key_missing_from_the_example_file_is_named() {
    let source = "pub struct ConfigFile {\n    pub listen: Option<SocketAddr>,\n    \
                  pub limits: LimitsSection,\n    pub env: BTreeMap<String, String>,\n    \
                  pub users: BTreeMap<String, User>,\n}\n\
                  pub struct LimitsSection {\n    pub pids_max: Option<u64>,\n    \
                  pub nofile: Option<u64>,\n}\n\
                  pub struct User {\n    pub bytes: Option<u64>,\n}\n";
    let example = "listen = \"127.0.0.1:7878\"\n[limits]\n# pids_max = 512\nnofile = 1024\n\
                   [env]\n# A = \"b\"\n# [users.alice]\n# bytes = 1\n";
    assert!(undocumented(&[source], example).is_empty());
    let without = example.replace("# pids_max = 512\n", "");
    assert_eq!(undocumented(&[source], &without), ["limits.pids_max"]);
    let without = example.replace("# [users.alice]\n# bytes = 1\n", "");
    assert_eq!(undocumented(&[source], &without), ["users.*.bytes"]);
    let without = example.replace("[env]\n# A = \"b\"\n", "");
    assert_eq!(undocumented(&[source], &without), ["env"]);
}
