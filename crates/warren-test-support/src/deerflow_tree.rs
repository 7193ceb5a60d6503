//! Generated DeerFlow deployments for the storage migrator's tests and benchmark
//! (`warren migrate deerflow`, I36): a directory laid out the way DeerFlow stores its
//! threads, skills, memory and agents, filled deterministically from a seed.
//!
//! ```text
//! {root}/memory.json, {root}/agents/…                          left alone by the migrator
//! {root}/users/{user_id}/memory.json, …/agents/…               left alone
//! {root}/users/{user_id}/threads/{thread_id}/user-data/…      a thread: workspace/, uploads/, outputs/
//! {root}/threads/{thread_id}/user-data/…                      a thread of the legacy (no-user) layout
//! {root}/skills/public/{slug}/…                                a public (shared) skill
//! {root}/skills/custom/{slug}/…                                a custom (personal) skill
//! ```
//!
//! The bulk files ([`TreeSpec::files`], [`TreeSpec::bytes`]) are spread over every thread;
//! their contents come from BLAKE3's extendable output keyed by the seed and the file's
//! number, so a gigabyte is written at disk speed and every file differs. With
//! [`TreeSpec::odd`] the first thread also gets what a migrator must not get wrong: names
//! that are not UTF-8 or hold spaces, a newline, unicode or a leading dash; hard links;
//! symlinks to `/etc`, into another user's tree, inside the thread and dangling; empty and
//! read-only directories; world-writable, setuid, setgid and sticky modes; a file of a
//! foreign owner (as root). [`TreeSpec::large_file`] adds one big file and
//! [`TreeSpec::special_files`] a FIFO (and, as root, a character device), which a migrator
//! skips.
//!
//! Everything is a function of the spec: names, contents, modes and the modification times
//! of every file, symlink and directory, so two trees generated from one spec in the same
//! place are indistinguishable to anything that does not look at inode numbers or ctimes.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// What to generate. [`TreeSpec::default`] is a small tree without the odd content; the
/// benchmark's is [`TreeSpec::bench`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSpec {
    /// The seed every name, size, content and time derives from.
    pub seed: u64,
    /// Users under `users/` (named alice, bob, carol, …, then `user-<n>`).
    pub users: usize,
    /// Threads of each user.
    pub threads_per_user: usize,
    /// Threads of the legacy layout (`{root}/threads/{thread_id}`).
    pub legacy_threads: usize,
    /// Skills under `skills/public/`.
    pub public_skills: usize,
    /// Skills under `skills/custom/`.
    pub custom_skills: usize,
    /// Bulk files spread over all threads (besides each thread's `workspace/notes.md` and
    /// the odd content).
    pub files: usize,
    /// Total size of the bulk files, in bytes.
    pub bytes: u64,
    /// One more file of this size, `uploads/large.bin` of the first thread.
    pub large_file: Option<u64>,
    /// The odd content (names, links, modes, empty dirs) in the first thread, and a user
    /// whose id is not safe as a directory name ([`ODD_USER`]) with one thread.
    pub odd: bool,
    /// A FIFO in the first thread (and, as root, a character device).
    pub special_files: bool,
    /// `memory.json` and `agents/`, at the top and in every user's directory.
    pub left_alone: bool,
}

impl Default for TreeSpec {
    fn default() -> Self {
        Self {
            seed: 1,
            users: 2,
            threads_per_user: 1,
            legacy_threads: 1,
            public_skills: 1,
            custom_skills: 1,
            files: 24,
            bytes: 96 * 1024,
            large_file: None,
            odd: false,
            special_files: false,
            left_alone: true,
        }
    }
}

impl TreeSpec {
    /// The benchmark's deployment: 20,000 files of 1 GiB in all, over 10 users of 5 threads
    /// and 5 legacy threads, with a few skills; no odd content.
    pub fn bench() -> Self {
        Self {
            seed: 7,
            users: 10,
            threads_per_user: 5,
            legacy_threads: 5,
            public_skills: 3,
            custom_skills: 2,
            files: 20_000,
            bytes: 1 << 30,
            large_file: None,
            odd: false,
            special_files: false,
            left_alone: true,
        }
    }

    /// Everything a migrator must handle, with a large file of `large_file` bytes.
    pub fn everything(large_file: u64) -> Self {
        Self {
            seed: 11,
            users: 3,
            threads_per_user: 2,
            legacy_threads: 2,
            public_skills: 2,
            custom_skills: 2,
            files: 300,
            bytes: 8 << 20,
            large_file: Some(large_file),
            odd: true,
            special_files: true,
            left_alone: true,
        }
    }
}

/// One generated thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedThread {
    /// Its user, or `None` for the legacy layout.
    pub user: Option<String>,
    /// The thread id (a UUID, as DeerFlow makes them).
    pub thread_id: String,
    /// Its `user-data` directory relative to the root:
    /// `users/<user>/threads/<thread>/user-data` or `threads/<thread>/user-data`.
    pub source: String,
    /// A text file in it, relative to `user-data`: `workspace/notes.md`.
    pub notes: String,
    /// That file's content.
    pub notes_text: String,
}

/// The odd entries of [`TreeSpec::odd`] and [`TreeSpec::special_files`], as absolute paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OddEntries {
    /// Files with odd names (non-UTF-8, spaces, newline, unicode, leading dashes).
    pub odd_names: Vec<PathBuf>,
    /// Names of one inode, all in the first thread.
    pub hard_links: Vec<PathBuf>,
    /// A symlink to `/etc`.
    pub link_to_etc: PathBuf,
    /// A symlink to `/etc/passwd`.
    pub link_to_passwd: PathBuf,
    /// A symlink (absolute) to a file in another user's thread.
    pub link_to_other_user: PathBuf,
    /// A symlink (relative, climbing out of the thread) into another user's thread.
    pub relative_link_out: PathBuf,
    /// Symlinks that stay inside the thread (one dangling).
    pub links_inside: Vec<PathBuf>,
    /// Empty directories.
    pub empty_dirs: Vec<PathBuf>,
    /// Entries with modes a migrator changes (world-writable, setuid, setgid), and the
    /// sticky, read-only and private ones it keeps.
    pub odd_modes: Vec<PathBuf>,
    /// A file owned by 4242:4242 (only as root).
    pub foreign_owner: Option<PathBuf>,
    /// A FIFO.
    pub fifo: Option<PathBuf>,
    /// A character device (only as root).
    pub device: Option<PathBuf>,
}

/// What [`DeerflowTree::generate`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedTree {
    /// The root (DeerFlow's base directory, `--source`).
    pub root: PathBuf,
    /// Every thread, users' first (in user order), then the legacy ones.
    pub threads: Vec<GeneratedThread>,
    /// Slugs under `skills/public/`.
    pub public_skills: Vec<String>,
    /// Slugs under `skills/custom/`.
    pub custom_skills: Vec<String>,
    /// What a migrator leaves alone, relative to the root (`memory.json`, `agents`,
    /// `users/<u>/memory.json`, `users/<u>/agents`).
    pub left_alone: Vec<String>,
    /// Regular files in threads and skills, each name counted (so a hard link counts once
    /// per name), each skill once.
    pub files: u64,
    /// Their sizes added up, each inode once (a hard link adds no bytes).
    pub bytes: u64,
    /// The large file, if any.
    pub large_file: Option<PathBuf>,
    /// The odd entries, if any were made.
    pub odd: Option<OddEntries>,
}

impl GeneratedTree {
    /// The absolute `user-data` directory of `thread`.
    pub fn thread_dir(&self, thread: &GeneratedThread) -> PathBuf {
        self.root.join(&thread.source)
    }

    /// The users (ids) that have threads under `users/`, in order.
    pub fn users(&self) -> Vec<String> {
        let mut users: Vec<String> = Vec::new();
        for user in self.threads.iter().filter_map(|t| t.user.clone()) {
            if !users.contains(&user) {
                users.push(user);
            }
        }
        users
    }

    /// Every source item a migrator moves, relative to the root: each thread's `user-data`,
    /// `skills/public/<slug>` and `skills/custom/<slug>`.
    pub fn item_sources(&self) -> Vec<String> {
        let mut out: Vec<String> = self.threads.iter().map(|t| t.source.clone()).collect();
        out.extend(
            self.public_skills
                .iter()
                .map(|s| format!("skills/public/{s}")),
        );
        out.extend(
            self.custom_skills
                .iter()
                .map(|s| format!("skills/custom/{s}")),
        );
        out
    }
}

/// The generator.
pub struct DeerflowTree;

impl DeerflowTree {
    /// Generates `spec` into `root` (created if missing; it should be empty).
    pub fn generate(root: &Path, spec: &TreeSpec) -> io::Result<GeneratedTree> {
        Generator::new(root, spec).run()
    }
}

/// The BLAKE3 digest of a file's content, read in 1 MiB blocks (never following a symlink
/// at `path`: one is an error).
pub fn file_digest(path: &Path) -> io::Result<[u8; 32]> {
    let meta = fs::symlink_metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    let mut file = fs::File::open(path)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(*hasher.finalize().as_bytes());
        }
        hasher.update(&buf[..n]);
    }
}

/// SplitMix64: small, fast and good enough for names, sizes and times.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn uuid(&mut self) -> String {
        let (a, b) = (self.next(), self.next());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0x0fff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }
}

const USER_NAMES: [&str; 10] = [
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
];
const PUBLIC_SLUGS: [&str; 6] = [
    "deep-research",
    "web-search",
    "chart-visualization",
    "ppt-generation",
    "podcast-generation",
    "image-generation",
];
const CUSTOM_SLUGS: [&str; 3] = ["my-notes", "report-style", "team-glossary"];
/// The user of [`TreeSpec::odd`]: a valid DeerFlow user id (`[A-Za-z0-9_-]{1,128}`) that
/// is not safe as a directory name for warren (it starts with `_`), so its UserWorkspace
/// directory is the hashed `uid-<sha256>`.
pub const ODD_USER: &str = "_eve";

/// The times are spread over a year from 2023-11-14.
const EPOCH: i64 = 1_700_000_000;

struct Generator<'a> {
    root: PathBuf,
    spec: &'a TreeSpec,
    rng: Rng,
    files: u64,
    bytes: u64,
    /// Symlinks and special files, whose times are set at the end, and every directory.
    symlinks: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    /// Directory modes applied at the very end (after their contents were made).
    dir_modes: Vec<(PathBuf, u32)>,
    buf: Vec<u8>,
    root_user: bool,
}

impl<'a> Generator<'a> {
    fn new(root: &Path, spec: &'a TreeSpec) -> Self {
        Self {
            root: root.to_owned(),
            spec,
            rng: Rng(spec.seed ^ 0x005e_ed0f_dee7_f10e),
            files: 0,
            bytes: 0,
            symlinks: Vec::new(),
            dirs: Vec::new(),
            dir_modes: Vec::new(),
            buf: vec![0u8; 1 << 20],
            root_user: rustix::process::geteuid().is_root(),
        }
    }

    fn run(mut self) -> io::Result<GeneratedTree> {
        let spec = self.spec;
        self.mkdir(&self.root.clone())?;

        // Names first, so they do not depend on how many files there are.
        let mut users: Vec<String> = (0..spec.users)
            .map(|i| match USER_NAMES.get(i) {
                Some(name) => (*name).to_owned(),
                None => format!("user-{i}"),
            })
            .collect();
        if spec.odd {
            users.push(ODD_USER.to_owned());
        }
        let mut threads = Vec::new();
        for user in &users {
            let count = if user == ODD_USER {
                1
            } else {
                spec.threads_per_user
            };
            for _ in 0..count {
                let thread_id = self.rng.uuid();
                threads.push(GeneratedThread {
                    source: format!("users/{user}/threads/{thread_id}/user-data"),
                    user: Some(user.clone()),
                    notes: "workspace/notes.md".to_owned(),
                    notes_text: format!(
                        "# Notes of {user}, thread {thread_id}\n\nDeerFlow wrote this.\n"
                    ),
                    thread_id,
                });
            }
        }
        for _ in 0..spec.legacy_threads {
            let thread_id = self.rng.uuid();
            threads.push(GeneratedThread {
                source: format!("threads/{thread_id}/user-data"),
                user: None,
                notes: "workspace/notes.md".to_owned(),
                notes_text: format!("# Notes of legacy thread {thread_id}\n"),
                thread_id,
            });
        }
        let public_skills: Vec<String> = (0..spec.public_skills)
            .map(|i| match PUBLIC_SLUGS.get(i) {
                Some(slug) => (*slug).to_owned(),
                None => format!("public-skill-{i}"),
            })
            .collect();
        let custom_skills: Vec<String> = (0..spec.custom_skills)
            .map(|i| match CUSTOM_SLUGS.get(i) {
                Some(slug) => (*slug).to_owned(),
                None => format!("custom-skill-{i}"),
            })
            .collect();

        // The structure every thread has: DeerFlow makes the three directories up front.
        for thread in &threads {
            let dir = self.root.join(&thread.source);
            for part in ["workspace", "uploads", "outputs"] {
                self.mkdirs(&dir.join(part))?;
            }
            self.text_file(&dir.join(&thread.notes), &thread.notes_text, 0o644)?;
        }

        // The bulk, spread over the threads and their three directories.
        if !threads.is_empty() {
            let sizes = self.sizes();
            for (i, size) in sizes.into_iter().enumerate() {
                let thread = &threads[i % threads.len()];
                let round = i / threads.len();
                let dir = self.root.join(&thread.source);
                let path = match round % 3 {
                    0 => dir.join(format!("workspace/d{}/file-{i:05}.bin", (round / 3) % 8)),
                    1 => dir.join(format!("uploads/upload-{i:05}.dat")),
                    _ => dir.join(format!("outputs/out-{i:05}.txt")),
                };
                if let Some(parent) = path.parent() {
                    self.mkdirs(parent)?;
                }
                let mode = if i % 7 == 0 { 0o755 } else { 0o644 };
                self.random_file(&path, i as u64, size, mode)?;
            }
        }

        if let (Some(size), Some(first)) = (spec.large_file, threads.first()) {
            let path = self.root.join(&first.source).join("uploads/large.bin");
            self.random_file(&path, u64::MAX, size, 0o644)?;
        }
        let large_file = spec
            .large_file
            .and(threads.first())
            .map(|first| self.root.join(&first.source).join("uploads/large.bin"));

        let odd = if (spec.odd || spec.special_files) && !threads.is_empty() {
            Some(self.odd(&threads)?)
        } else {
            None
        };

        for slug in &public_skills {
            let dir = self.root.join("skills/public").join(slug);
            self.skill(&dir, slug, "public")?;
        }
        for slug in &custom_skills {
            let dir = self.root.join("skills/custom").join(slug);
            self.skill(&dir, slug, "custom")?;
        }

        let mut left_alone = Vec::new();
        if spec.left_alone {
            let (files, bytes) = (self.files, self.bytes);
            self.text_file(
                &self.root.join("memory.json"),
                "{\"version\": \"1.0\", \"facts\": []}\n",
                0o644,
            )?;
            self.agent(&self.root.join("agents/researcher"))?;
            left_alone.extend(["memory.json".to_owned(), "agents".to_owned()]);
            for user in &users {
                let home = self.root.join("users").join(user);
                self.text_file(
                    &home.join("memory.json"),
                    &format!("{{\"user\": \"{user}\", \"facts\": [\"likes tea\"]}}\n"),
                    0o600,
                )?;
                self.agent(&home.join("agents/helper"))?;
                left_alone.push(format!("users/{user}/memory.json"));
                left_alone.push(format!("users/{user}/agents"));
            }
            // Not migrated, so not counted.
            (self.files, self.bytes) = (files, bytes);
        }

        self.finish()?;
        Ok(GeneratedTree {
            root: self.root.clone(),
            threads,
            public_skills,
            custom_skills,
            left_alone,
            files: self.files,
            bytes: self.bytes,
            large_file,
            odd,
        })
    }

    /// Sizes of the bulk files adding up to `spec.bytes`: mostly small, some ten times
    /// bigger, a few empty.
    fn sizes(&mut self) -> Vec<u64> {
        let n = self.spec.files;
        if n == 0 {
            return Vec::new();
        }
        let weights: Vec<u64> = (0..n)
            .map(|i| {
                if i % 50 == 49 {
                    0
                } else if i % 10 == 3 {
                    (1 + self.rng.below(1000)) * 10
                } else {
                    1 + self.rng.below(1000)
                }
            })
            .collect();
        let total: u128 = weights.iter().map(|&w| u128::from(w)).sum::<u128>().max(1);
        let mut sizes: Vec<u64> = weights
            .iter()
            .map(|&w| (u128::from(self.spec.bytes) * u128::from(w) / total) as u64)
            .collect();
        let short = self.spec.bytes - sizes.iter().sum::<u64>();
        sizes[0] += short;
        sizes
    }

    fn time(&mut self) -> (i64, i64) {
        (
            EPOCH + self.rng.below(365 * 86_400) as i64,
            self.rng.below(1_000_000_000) as i64,
        )
    }

    fn mkdir(&mut self, path: &Path) -> io::Result<()> {
        match fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => return Ok(()),
            Err(e) => return Err(annotate(e, "mkdir", path)),
        }
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
            .map_err(|e| annotate(e, "chmod", path))?;
        self.dirs.push(path.to_owned());
        Ok(())
    }

    fn mkdirs(&mut self, path: &Path) -> io::Result<()> {
        if path.is_dir() {
            return Ok(());
        }
        if let Some(parent) = path.parent() {
            self.mkdirs(parent)?;
        }
        self.mkdir(path)
    }

    fn finish_file(&mut self, file: &fs::File, path: &Path, mode: u32) -> io::Result<()> {
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| annotate(e, "chmod", path))?;
        let (secs, nanos) = self.time();
        let when = std::time::UNIX_EPOCH + std::time::Duration::new(secs as u64, nanos as u32);
        file.set_times(fs::FileTimes::new().set_modified(when).set_accessed(when))
            .map_err(|e| annotate(e, "set the times of", path))
    }

    fn text_file(&mut self, path: &Path, text: &str, mode: u32) -> io::Result<()> {
        self.bytes_file(path, text.as_bytes(), mode)
    }

    fn bytes_file(&mut self, path: &Path, content: &[u8], mode: u32) -> io::Result<()> {
        if let Some(parent) = path.parent() {
            self.mkdirs(parent)?;
        }
        let mut file = fs::File::create(path).map_err(|e| annotate(e, "create", path))?;
        file.write_all(content)
            .map_err(|e| annotate(e, "write", path))?;
        self.finish_file(&file, path, mode)?;
        self.files += 1;
        self.bytes += content.len() as u64;
        Ok(())
    }

    /// `size` bytes of BLAKE3 output keyed by the seed and `number`.
    fn random_file(&mut self, path: &Path, number: u64, size: u64, mode: u32) -> io::Result<()> {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.spec.seed.to_le_bytes());
        key[8..16].copy_from_slice(&number.to_le_bytes());
        key[16..].copy_from_slice(b"deerflow-bulk-01");
        let mut reader = blake3::Hasher::new_keyed(&key).finalize_xof();
        let mut file = fs::File::create(path).map_err(|e| annotate(e, "create", path))?;
        let mut left = size;
        while left > 0 {
            let n = left.min(self.buf.len() as u64) as usize;
            reader.fill(&mut self.buf[..n]);
            file.write_all(&self.buf[..n])
                .map_err(|e| annotate(e, "write", path))?;
            left -= n as u64;
        }
        self.finish_file(&file, path, mode)?;
        self.files += 1;
        self.bytes += size;
        Ok(())
    }

    fn link(&mut self, target: impl AsRef<OsStr>, path: &Path) -> io::Result<()> {
        symlink(target.as_ref(), path).map_err(|e| annotate(e, "symlink", path))?;
        self.symlinks.push(path.to_owned());
        Ok(())
    }

    fn skill(&mut self, dir: &Path, slug: &str, kind: &str) -> io::Result<()> {
        self.text_file(
            &dir.join("SKILL.md"),
            &format!("---\nname: {slug}\ndescription: A {kind} skill for tests.\n---\n\n# {slug}\n\nUse it wisely.\n"),
            0o644,
        )?;
        self.text_file(
            &dir.join("scripts/run.py"),
            &format!("#!/usr/bin/env python3\nprint('{slug}')\n"),
            0o755,
        )?;
        let number = 1_000_000 + self.files;
        self.mkdirs(&dir.join("assets"))?;
        self.random_file(&dir.join("assets/data.bin"), number, 3000, 0o644)?;
        Ok(())
    }

    fn agent(&mut self, dir: &Path) -> io::Result<()> {
        self.text_file(
            &dir.join("config.yaml"),
            "name: helper\nmodel: default\n",
            0o644,
        )?;
        self.text_file(&dir.join("SOUL.md"), "Be kind.\n", 0o644)
    }

    fn odd(&mut self, threads: &[GeneratedThread]) -> io::Result<OddEntries> {
        let first = self.root.join(&threads[0].source);
        let ws = first.join("workspace");
        let mut odd = OddEntries::default();
        if self.spec.odd {
            // Names.
            for name in [
                &b"name with spaces.txt"[..],
                b"new\nline.txt",
                "\u{fc}n\u{ef}c\u{f8}d\u{e9} \u{65e5}\u{672c}\u{8a9e}.md".as_bytes(),
                b"-rf",
                b"--help",
                b"latin1-\xe9t\xe9.txt",
                b"tab\tand 'quotes' \"too\"",
            ] {
                let path = ws.join(OsStr::from_bytes(name));
                let mut content = b"odd name: ".to_vec();
                content.extend_from_slice(name);
                content.push(b'\n');
                self.bytes_file(&path, &content, 0o644)?;
                odd.odd_names.push(path);
            }
            let odd_dir = ws.join(OsStr::from_bytes(b"dir-\xff\xfe"));
            self.mkdirs(&odd_dir)?;
            let inner = odd_dir.join("inside.txt");
            self.bytes_file(&inner, b"inside a non-UTF-8 directory\n", 0o644)?;
            odd.odd_names.push(inner);

            // Hard links: three names of one inode across the thread's directories.
            let report = first.join("outputs/report.pdf");
            self.random_file(&report, 2_000_000, 20_000, 0o644)?;
            odd.hard_links.push(report.clone());
            for other in ["workspace/report-link.pdf", "uploads/report copy.pdf"] {
                let path = first.join(other);
                fs::hard_link(&report, &path).map_err(|e| annotate(e, "link", &path))?;
                self.files += 1;
                odd.hard_links.push(path);
            }

            // Symlinks.
            odd.link_to_etc = ws.join("etc-link");
            self.link("/etc", &odd.link_to_etc.clone())?;
            odd.link_to_passwd = ws.join("passwd-link");
            self.link("/etc/passwd", &odd.link_to_passwd.clone())?;
            let other = threads.get(1).unwrap_or(&threads[0]);
            odd.link_to_other_user = ws.join("peer-link");
            let peer = self.root.join(&other.source).join(&other.notes);
            self.link(&peer, &odd.link_to_other_user.clone())?;
            odd.relative_link_out = ws.join("peer-relative");
            // From <root>/<first>/workspace up to the root, then down into the other thread.
            let depth = Path::new(&threads[0].source).components().count() + 1;
            let up = "../".repeat(depth);
            self.link(
                format!("{up}{}/{}", other.source, other.notes),
                &odd.relative_link_out.clone(),
            )?;
            for (name, target) in [
                ("inside-link", "notes.md"),
                ("dir-link", "d0"),
                ("dangling-link", "no-such-file"),
                ("up-and-back", "../outputs/report.pdf"),
            ] {
                let path = ws.join(name);
                self.link(target, &path)?;
                odd.links_inside.push(path);
            }

            // Empty directories.
            for dir in ["workspace/empty", "outputs/empty/nested-empty"] {
                let path = first.join(dir);
                self.mkdirs(&path)?;
                odd.empty_dirs.push(path);
            }

            // Modes.
            for (name, mode) in [
                ("world-writable.txt", 0o666),
                ("setuid-tool", 0o4755),
                ("setgid-tool", 0o2755),
                ("all-bits", 0o7777),
                ("private.key", 0o600),
                ("read-only.txt", 0o444),
                ("no-access", 0o000),
            ] {
                let path = ws.join(name);
                self.bytes_file(&path, format!("mode {mode:o}\n").as_bytes(), mode)?;
                odd.odd_modes.push(path);
            }
            for (name, mode) in [
                ("workspace/shared-tmp", 0o1777),
                ("workspace/group-dir", 0o2775),
                ("workspace/open-dir", 0o777),
                ("outputs/read-only-dir", 0o555),
            ] {
                let path = first.join(name);
                self.mkdirs(&path)?;
                self.bytes_file(&path.join("kept.txt"), b"in an odd directory\n", 0o644)?;
                self.dir_modes.push((path.clone(), mode));
                odd.odd_modes.push(path);
            }
            if self.root_user {
                let path = ws.join("foreign-owner.txt");
                self.bytes_file(&path, b"owned by 4242\n", 0o640)?;
                std::os::unix::fs::lchown(&path, Some(4242), Some(4242))
                    .map_err(|e| annotate(e, "chown", &path))?;
                odd.foreign_owner = Some(path);
            }
        }
        if self.spec.special_files {
            let fifo = ws.join("a-fifo");
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &fifo,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o644),
                0,
            )
            .map_err(|e| annotate(e.into(), "mkfifo", &fifo))?;
            self.symlinks.push(fifo.clone());
            odd.fifo = Some(fifo);
            if self.root_user {
                let device = ws.join("null-device");
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &device,
                    rustix::fs::FileType::CharacterDevice,
                    rustix::fs::Mode::from_raw_mode(0o666),
                    rustix::fs::makedev(1, 3),
                )
                .map_err(|e| annotate(e.into(), "mknod", &device))?;
                self.symlinks.push(device.clone());
                odd.device = Some(device);
            }
        }
        Ok(odd)
    }

    /// Modification times of symlinks and directories (deepest first, after everything in
    /// them was made), then the directories' own modes.
    fn finish(&mut self) -> io::Result<()> {
        for path in std::mem::take(&mut self.symlinks) {
            let (secs, nanos) = self.time();
            set_times_nofollow(&path, secs, nanos)?;
        }
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for (path, mode) in std::mem::take(&mut self.dir_modes) {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(|e| annotate(e, "chmod", &path))?;
        }
        for path in dirs {
            let (secs, nanos) = self.time();
            set_times_nofollow(&path, secs, nanos)?;
        }
        Ok(())
    }
}

fn set_times_nofollow(path: &Path, secs: i64, nanos: i64) -> io::Result<()> {
    let when = rustix::fs::Timespec {
        tv_sec: secs,
        tv_nsec: nanos as _,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &rustix::fs::Timestamps {
            last_access: when,
            last_modification: when,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| annotate(e.into(), "set the times of", path))
}

fn annotate(error: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(error.kind(), format!("{what} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Path, mode, size, mtime (seconds, nanoseconds) and content digest of an entry.
    type Listed = (Vec<u8>, u32, u64, i64, i64, Option<[u8; 32]>);

    fn listing(root: &Path) -> Vec<Listed> {
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::new();
        let mut stack = vec![root.to_owned()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = fs::symlink_metadata(&path).unwrap();
                if meta.is_dir() {
                    stack.push(path.clone());
                }
                let digest = meta
                    .file_type()
                    .is_file()
                    .then(|| file_digest(&path).unwrap());
                out.push((
                    path.strip_prefix(root)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                    meta.mode(),
                    meta.size(),
                    meta.mtime(),
                    meta.mtime_nsec(),
                    digest,
                ));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn one_spec_generates_the_same_tree_twice_and_counts_what_it_made() {
        let spec = TreeSpec {
            odd: true,
            special_files: true,
            large_file: Some(3 << 20),
            ..TreeSpec::default()
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = DeerflowTree::generate(&a.path().join("src"), &spec).unwrap();
        let second = DeerflowTree::generate(&b.path().join("src"), &spec).unwrap();
        let (la, lb) = (listing(&first.root), listing(&second.root));
        assert_eq!(la.len(), lb.len());
        for (x, y) in la.iter().zip(&lb) {
            assert_eq!(x, y, "{:?}", String::from_utf8_lossy(&x.0));
        }
        assert_eq!(first.threads, second.threads);
        assert_eq!(
            first.threads.len(),
            2 + 1 + 1,
            "two users, _eve, one legacy"
        );
        assert!(first.odd.as_ref().unwrap().fifo.is_some());

        // The counts are the regular files under the items, each inode's bytes once.
        let (mut files, mut bytes) = (0, 0);
        let mut inodes = std::collections::HashSet::new();
        for source in first.item_sources() {
            for (path, mode, size, ..) in listing(&first.root.join(&source)) {
                if mode & 0o170000 == 0o100000 {
                    files += 1;
                    let path = first.root.join(&source).join(OsStr::from_bytes(&path));
                    let inode = std::os::unix::fs::MetadataExt::ino(&fs::metadata(path).unwrap());
                    if inodes.insert(inode) {
                        bytes += size;
                    }
                }
            }
        }
        assert_eq!((first.files, first.bytes), (files, bytes));
        assert!(first.bytes > spec.bytes + (3 << 20));
        let large = fs::metadata(first.large_file.as_ref().unwrap()).unwrap();
        assert_eq!(large.len(), 3 << 20);
    }

    #[test]
    fn the_bulk_adds_up_to_the_asked_size() {
        let spec = TreeSpec {
            files: 500,
            bytes: 5_000_003,
            left_alone: false,
            public_skills: 0,
            custom_skills: 0,
            ..TreeSpec::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let tree = DeerflowTree::generate(dir.path(), &spec).unwrap();
        let notes: u64 = tree.threads.iter().map(|t| t.notes_text.len() as u64).sum();
        assert_eq!(tree.files, 500 + tree.threads.len() as u64);
        assert_eq!(tree.bytes, 5_000_003 + notes);
    }
}
