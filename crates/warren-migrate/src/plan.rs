//! Reading a DeerFlow deployment's layout into a [`Plan`]: every item it holds and where
//! it goes, decided before anything is copied (I36).
//!
//! The layout is DeerFlow's public one, read strictly: at each structural level only the
//! names DeerFlow writes are accepted, so an unreleased intermediate layout (or a
//! directory that is not DeerFlow's at all) fails here, naming what it found, instead of
//! being half-migrated.
//!
//! ```text
//! {source}/users/{user_id}/threads/{thread_id}/user-data/…   a thread of a user
//! {source}/threads/{thread_id}/user-data/…                   a thread from before users
//! {source}/skills/public/{slug}/…                            skills every user got
//! {source}/skills/custom/{slug}/…                            skills users installed
//! {source}/memory.json, {source}/agents/,
//! {source}/users/{user_id}/memory.json, …/agents/            not workspace files: left alone
//! ```

use std::ffi::OsStr;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use warren_core::{Uid, Workdir};
use warren_fs::{Kind, WorkspaceRoot};

use crate::MigrateError;

/// How deep an item's tree may go (warren-fs's own walk limit).
const MAX_DEPTH: u32 = 256;
/// Most entries one item may hold.
const MAX_ENTRIES: usize = 5_000_000;

/// What a source item is, and so where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A thread's `user-data`: becomes the workdir `threads/<thread_id>/user-data`.
    Thread,
    /// A skill of `skills/public`: becomes a directory of the operator's shared skills.
    SharedSkill,
    /// A skill of `skills/custom`: becomes the uid's personal skill `agents/skills/<slug>`.
    PersonalSkill,
}

impl ItemKind {
    /// The name the journal keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Thread => "thread",
            Self::SharedSkill => "shared_skill",
            Self::PersonalSkill => "personal_skill",
        }
    }

    /// The kind a journal name stands for.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Thread, Self::SharedSkill, Self::PersonalSkill]
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

/// One source item and its deterministic target.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlannedItem {
    /// Unique within the migration, and the order items are migrated in.
    pub key: String,
    /// What it is.
    pub kind: ItemKind,
    /// Its directory, relative to the source.
    pub source: String,
    /// The uid whose UserWorkspace receives it (`None`: the operator's shared skills).
    pub uid: Option<Uid>,
    /// The target directory: relative to the uid's UserWorkspace, or to the shared skill
    /// directory.
    pub target: String,
    /// Regular files in it (hard links counted once per name).
    pub files: u64,
    /// Bytes of file content.
    pub bytes: u64,
}

/// Everything a migration will do, before it does any of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// The source directory (canonical).
    pub source: PathBuf,
    /// The items, ordered by key.
    pub items: Vec<PlannedItem>,
    /// What the source holds that is not workspace files, left where it is.
    pub left_alone: Vec<String>,
}

impl Plan {
    /// Files of every item.
    pub fn files(&self) -> u64 {
        self.items.iter().map(|item| item.files).sum()
    }

    /// Bytes of every item.
    pub fn bytes(&self) -> u64 {
        self.items.iter().map(|item| item.bytes).sum()
    }

    /// A digest of what the plan decides: a rerun whose source plans differently (the
    /// source changed, so the old system was not stopped) is refused against it.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        for item in &self.items {
            for field in [
                item.key.as_str(),
                item.kind.as_str(),
                item.source.as_str(),
                item.uid.as_ref().map_or("", |uid| uid.as_str()),
                item.target.as_str(),
            ] {
                hasher.update((field.len() as u64).to_le_bytes());
                hasher.update(field.as_bytes());
            }
            hasher.update(item.files.to_le_bytes());
            hasher.update(item.bytes.to_le_bytes());
        }
        hex::encode(hasher.finalize())
    }
}

/// What the operator's configuration gives the plan.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// The uid of threads from before DeerFlow had users, and of custom skills when no
    /// user's threads are migrated.
    pub default_uid: Uid,
    /// Whether the operator has a shared skill directory (`[skills] shared_dir`).
    pub has_shared_skills: bool,
}

/// Reads the DeerFlow layout under `source` into a plan. Nothing is written.
pub fn plan_deerflow(source: &WorkspaceRoot, options: &PlanOptions) -> Result<Plan, MigrateError> {
    let mut planner = Planner {
        source,
        threads: Vec::new(),
        public_skills: Vec::new(),
        custom_skills: Vec::new(),
        left_alone: Vec::new(),
    };
    for entry in planner.level("", "users/, threads/, skills/, memory.json or agents/")? {
        match (entry.name.as_str(), entry.kind) {
            ("users", Kind::Dir) => planner.users()?,
            ("threads", Kind::Dir) => planner.threads("threads", &options.default_uid)?,
            ("skills", Kind::Dir) => planner.skills()?,
            ("memory.json", Kind::File) | ("agents", Kind::Dir) => {
                planner.left_alone.push(entry.path)
            }
            _ => {
                return Err(unknown(
                    &entry,
                    "users/, threads/, skills/, memory.json or agents/",
                ))
            }
        }
    }
    planner.finish(options)
}

/// An entry of one structural level.
struct LevelEntry {
    name: String,
    path: String,
    kind: Kind,
}

struct Planner<'a> {
    source: &'a WorkspaceRoot,
    /// (uid, thread id, source path).
    threads: Vec<(Uid, String, String)>,
    /// (slug, source path).
    public_skills: Vec<(String, String)>,
    custom_skills: Vec<(String, String)>,
    left_alone: Vec<String>,
}

impl Planner<'_> {
    /// The entries directly in `dir` (relative to the source), by name. Names that are not
    /// UTF-8 have no place in DeerFlow's structure, so they are refused here.
    fn level(&self, dir: &str, expected: &str) -> Result<Vec<LevelEntry>, MigrateError> {
        let listing = self
            .source
            .list(dir, 1, 100_000)
            .map_err(MigrateError::fs(format!("list {}", shown(dir))))?;
        if listing.truncated {
            return Err(MigrateError::UnknownSchema {
                path: shown(dir),
                found: "a directory of more than 100000 entries".to_owned(),
                expected: expected.to_owned(),
            });
        }
        let mut entries = Vec::new();
        for entry in listing.entries {
            let Some(path) = entry.os_path.to_str() else {
                return Err(MigrateError::UnknownSchema {
                    path: entry.path,
                    found: "a name that is not UTF-8".to_owned(),
                    expected: expected.to_owned(),
                });
            };
            let name = path.rsplit('/').next().unwrap_or(path).to_owned();
            // Placeholders a checkout or an editor leaves; never part of DeerFlow's data.
            if name == ".gitkeep" && entry.kind == Kind::File {
                continue;
            }
            entries.push(LevelEntry {
                name,
                path: path.to_owned(),
                kind: entry.kind,
            });
        }
        Ok(entries)
    }

    fn users(&mut self) -> Result<(), MigrateError> {
        const EXPECTED: &str = "a directory per user id";
        for user in self.level("users", EXPECTED)? {
            if user.kind != Kind::Dir || !deerflow_id(&user.name, 128) {
                return Err(unknown(&user, EXPECTED));
            }
            let uid = Uid::new(user.name.clone()).map_err(|error| MigrateError::UnknownSchema {
                path: user.path.clone(),
                found: format!("a user id warren cannot use ({error})"),
                expected: EXPECTED.to_owned(),
            })?;
            const INSIDE: &str = "threads/, memory.json or agents/";
            for entry in self.level(&user.path, INSIDE)? {
                match (entry.name.as_str(), entry.kind) {
                    ("threads", Kind::Dir) => self.threads(&entry.path, &uid)?,
                    ("memory.json", Kind::File) | ("agents", Kind::Dir) => {
                        self.left_alone.push(entry.path)
                    }
                    _ => return Err(unknown(&entry, INSIDE)),
                }
            }
        }
        Ok(())
    }

    fn threads(&mut self, dir: &str, uid: &Uid) -> Result<(), MigrateError> {
        const EXPECTED: &str = "a directory per thread id";
        for thread in self.level(dir, EXPECTED)? {
            if thread.kind != Kind::Dir || !deerflow_id(&thread.name, 64) {
                return Err(unknown(&thread, EXPECTED));
            }
            const INSIDE: &str = "user-data/";
            for entry in self.level(&thread.path, INSIDE)? {
                match (entry.name.as_str(), entry.kind) {
                    ("user-data", Kind::Dir) => {
                        self.threads
                            .push((uid.clone(), thread.name.clone(), entry.path))
                    }
                    _ => return Err(unknown(&entry, INSIDE)),
                }
            }
        }
        Ok(())
    }

    fn skills(&mut self) -> Result<(), MigrateError> {
        const EXPECTED: &str = "public/ or custom/";
        for group in self.level("skills", EXPECTED)? {
            let public = match (group.name.as_str(), group.kind) {
                ("public", Kind::Dir) => true,
                ("custom", Kind::Dir) => false,
                _ => return Err(unknown(&group, EXPECTED)),
            };
            const SKILL: &str = "a directory per skill";
            for skill in self.level(&group.path, SKILL)? {
                if skill.kind != Kind::Dir || !skill_slug(&skill.name) {
                    return Err(unknown(&skill, SKILL));
                }
                let list = if public {
                    &mut self.public_skills
                } else {
                    &mut self.custom_skills
                };
                list.push((skill.name, skill.path));
            }
        }
        Ok(())
    }

    /// Targets, counts and conflicts.
    fn finish(self, options: &PlanOptions) -> Result<Plan, MigrateError> {
        let mut items = Vec::new();
        for (uid, thread, source) in &self.threads {
            items.push(PlannedItem {
                key: format!("thread/{uid}/{thread}"),
                kind: ItemKind::Thread,
                source: source.clone(),
                uid: Some(uid.clone()),
                target: thread_workdir(thread)?.as_str().to_owned(),
                files: 0,
                bytes: 0,
            });
        }
        if !self.public_skills.is_empty() && !options.has_shared_skills {
            return Err(MigrateError::Config(format!(
                "the source holds {} public skill(s) (skills/public) but warren.toml sets no \
                 [skills] shared_dir to receive them; set one (and pass --config)",
                self.public_skills.len()
            )));
        }
        for (slug, source) in &self.public_skills {
            items.push(PlannedItem {
                key: format!("skill/public/{slug}"),
                kind: ItemKind::SharedSkill,
                source: source.clone(),
                uid: None,
                target: slug.clone(),
                files: 0,
                bytes: 0,
            });
        }
        // DeerFlow showed its custom skills to every user: each uid that had threads gets
        // them as personal skills (I9), so every user still sees what they saw.
        let mut receivers: Vec<Uid> = self.threads.iter().map(|(uid, ..)| uid.clone()).collect();
        receivers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        receivers.dedup();
        if receivers.is_empty() {
            receivers.push(options.default_uid.clone());
        }
        for (slug, source) in &self.custom_skills {
            for uid in &receivers {
                items.push(PlannedItem {
                    key: format!("skill/custom/{uid}/{slug}"),
                    kind: ItemKind::PersonalSkill,
                    source: source.clone(),
                    uid: Some(uid.clone()),
                    target: format!("agents/skills/{slug}"),
                    files: 0,
                    bytes: 0,
                });
            }
        }
        items.sort_by(|a, b| a.key.cmp(&b.key));
        // Two sources, one target: a legacy thread and a user's thread of the same id
        // under the default uid.
        let mut seen: std::collections::HashMap<(Option<&str>, &str), &str> =
            std::collections::HashMap::new();
        for item in &items {
            let target = (item.uid.as_ref().map(Uid::as_str), item.target.as_str());
            if let Some(first) = seen.insert(target, item.source.as_str()) {
                return Err(MigrateError::PlanConflict {
                    first: first.to_owned(),
                    second: item.source.clone(),
                    target: describe_target(item.uid.as_ref(), &item.target),
                });
            }
        }
        for item in &mut items {
            let (files, bytes) = count(self.source, &item.source)?;
            item.files = files;
            item.bytes = bytes;
        }
        let mut left_alone = self.left_alone;
        left_alone.sort();
        Ok(Plan {
            source: PathBuf::new(),
            items,
            left_alone,
        })
    }
}

/// The workdir the DeerFlow drop-in binds a thread to (warren-deerflow's `create`).
pub fn thread_workdir(thread: &str) -> Result<Workdir, MigrateError> {
    Workdir::new(format!("threads/{thread}/user-data")).map_err(|error| {
        MigrateError::UnknownSchema {
            path: format!("threads/{thread}"),
            found: format!("a thread id warren cannot use ({error})"),
            expected: "a directory per thread id".to_owned(),
        }
    })
}

/// A target as messages show it.
pub fn describe_target(uid: Option<&Uid>, target: &str) -> String {
    match uid {
        Some(uid) => format!("uid {uid}: {target}"),
        None => format!("shared skills: {target}"),
    }
}

/// Files and bytes beneath `dir`.
fn count(source: &WorkspaceRoot, dir: &str) -> Result<(u64, u64), MigrateError> {
    let listing = source
        .list(OsStr::new(dir), MAX_DEPTH, MAX_ENTRIES)
        .map_err(MigrateError::fs(format!("list {dir}")))?;
    if listing.truncated {
        return Err(MigrateError::Config(format!(
            "{dir} holds more than {MAX_ENTRIES} entries; split it before migrating"
        )));
    }
    let mut inodes = std::collections::HashSet::new();
    let (mut files, mut bytes) = (0, 0);
    for entry in listing.entries.iter().filter(|e| e.kind == Kind::File) {
        files += 1;
        if entry.links <= 1 || inodes.insert(entry.inode) {
            bytes += entry.size;
        }
    }
    Ok((files, bytes))
}

/// DeerFlow's own id pattern, `^[A-Za-z0-9_-]{1,max}$`.
fn deerflow_id(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A skill directory's name as warren's skills take it: letters, digits, `.`, `_`, `-`,
/// not starting with a dot.
fn skill_slug(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn shown(dir: &str) -> String {
    if dir.is_empty() {
        "the source".to_owned()
    } else {
        dir.to_owned()
    }
}

fn unknown(entry: &LevelEntry, expected: &str) -> MigrateError {
    let found = match entry.kind {
        Kind::Dir => "a directory",
        Kind::File => "a file",
        Kind::Symlink => "a symlink (never followed)",
        Kind::Other => "a special file",
    };
    MigrateError::UnknownSchema {
        path: entry.path.clone(),
        found: found.to_owned(),
        expected: expected.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;

    fn options() -> PlanOptions {
        PlanOptions {
            default_uid: Uid::new("default").unwrap(),
            has_shared_skills: true,
        }
    }

    fn plan_of(dir: &Path, options: &PlanOptions) -> Result<Plan, MigrateError> {
        let root = WorkspaceRoot::open(dir).unwrap().read_only();
        plan_deerflow(&root, options)
    }

    fn write(dir: &Path, rel: &str, bytes: &[u8]) {
        let path = dir.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    }

    #[test]
    fn every_deerflow_item_gets_the_target_the_drop_in_binds() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            d,
            "users/alice/threads/t1/user-data/workspace/a.txt",
            b"hello",
        );
        write(d, "users/alice/threads/t1/user-data/outputs/r.md", b"r");
        write(d, "users/alice/memory.json", b"{}");
        write(d, "threads/old/user-data/uploads/u.bin", b"12345678");
        write(d, "skills/public/pdf/SKILL.md", b"p");
        write(d, "skills/custom/mine/SKILL.md", b"m");
        write(d, "memory.json", b"{}");
        fs::create_dir_all(d.join("agents/researcher")).unwrap();
        let plan = plan_of(d, &options()).unwrap();
        type Shown<'a> = (&'a str, &'a str, Option<&'a str>, &'a str, u64, u64);
        let shown: Vec<Shown> = plan
            .items
            .iter()
            .map(|i| {
                (
                    i.key.as_str(),
                    i.source.as_str(),
                    i.uid.as_ref().map(Uid::as_str),
                    i.target.as_str(),
                    i.files,
                    i.bytes,
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "skill/custom/alice/mine",
                    "skills/custom/mine",
                    Some("alice"),
                    "agents/skills/mine",
                    1,
                    1
                ),
                (
                    "skill/custom/default/mine",
                    "skills/custom/mine",
                    Some("default"),
                    "agents/skills/mine",
                    1,
                    1
                ),
                ("skill/public/pdf", "skills/public/pdf", None, "pdf", 1, 1),
                (
                    "thread/alice/t1",
                    "users/alice/threads/t1/user-data",
                    Some("alice"),
                    "threads/t1/user-data",
                    2,
                    6
                ),
                (
                    "thread/default/old",
                    "threads/old/user-data",
                    Some("default"),
                    "threads/old/user-data",
                    1,
                    8
                ),
            ]
        );
        assert_eq!(
            plan.left_alone,
            ["agents", "memory.json", "users/alice/memory.json"]
        );
        assert_eq!(plan.files(), 6);
        assert_eq!(plan.digest(), plan_of(d, &options()).unwrap().digest());
        write(d, "threads/old/user-data/uploads/u.bin", b"123456789");
        assert_ne!(plan.digest(), plan_of(d, &options()).unwrap().digest());
    }

    #[test]
    fn an_unknown_entry_at_any_structural_level_is_named_before_anything_is_copied() {
        for (rel, named) in [
            ("weird.db", "weird.db"),
            ("users/alice/notes.txt", "users/alice/notes.txt"),
            (
                "users/alice/threads/t1/strange/x",
                "users/alice/threads/t1/strange",
            ),
            ("threads/t1/checkpoints/x", "threads/t1/checkpoints"),
            ("skills/private/s/SKILL.md", "skills/private"),
            ("skills/public/README.md", "skills/public/README.md"),
            ("users/bad id/threads/t/user-data/x", "users/bad id"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            write(dir.path(), "users/alice/threads/t0/user-data/a", b"a");
            write(dir.path(), rel, b"x");
            let error = plan_of(dir.path(), &options()).unwrap_err();
            let MigrateError::UnknownSchema { path, .. } = &error else {
                panic!("{rel}: {error}");
            };
            assert_eq!(path, named, "{error}");
            assert!(error.to_string().contains("nothing was copied"), "{error}");
        }
    }

    #[test]
    fn a_symlink_where_a_directory_belongs_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        write(elsewhere.path(), "threads/t/user-data/secret", b"s");
        fs::create_dir_all(dir.path().join("users")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("users/alice")).unwrap();
        let error = plan_of(dir.path(), &options()).unwrap_err();
        assert!(
            error.to_string().contains("users/alice is a symlink"),
            "{error}"
        );
    }

    #[test]
    fn a_legacy_thread_and_the_default_users_thread_of_one_id_conflict() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "threads/t1/user-data/a", b"a");
        write(dir.path(), "users/default/threads/t1/user-data/b", b"b");
        let error = plan_of(dir.path(), &options()).unwrap_err();
        assert!(
            matches!(error, MigrateError::PlanConflict { ref target, .. } if target == "uid default: threads/t1/user-data"),
            "{error}"
        );
    }

    #[test]
    fn public_skills_without_a_shared_skill_directory_are_refused_with_the_setting_named() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "skills/public/pdf/SKILL.md", b"p");
        let options = PlanOptions {
            has_shared_skills: false,
            ..options()
        };
        let error = plan_of(dir.path(), &options).unwrap_err();
        assert!(error.to_string().contains("[skills] shared_dir"), "{error}");
    }
}
