//! Virtual paths: the only paths agents and product APIs see (I1, I7).
//!
//! A virtual path is an absolute path under one of the sandbox layout's mounts, or a path
//! relative to the workdir. In the default layout `/home/gem/user-data/...` names the uid's
//! UserWorkspace (read-write) and `/home/gem/skills/...` its skill projection (read-only);
//! other layouts name other mounts ([`Layout`]). Anything else is refused with a message
//! naming the layout's mounts.

use std::borrow::Cow;
use std::fmt;

use crate::MAX_PATH_BYTES;
use crate::{
    component_problem, shorten, CoreError, ExtraMount, Layout, LayoutMount, VirtualRoot, Workdir,
};

/// The mounts paths may start with, in words: the layout's, then the extra mounts', for
/// messages that tell a client where paths may go.
pub fn roots(layout: &Layout, extra: &[ExtraMount]) -> String {
    let mut roots = layout.roots.to_owned();
    for mount in extra {
        if !layout.mounts.iter().any(|m| m.target == mount.target) {
            roots.push_str(", or ");
            roots.push_str(&mount.target);
        }
    }
    roots
}

/// Where the UserWorkspace appears inside a runtime of the default layout (I7).
pub const USER_DATA_MOUNT: &str = "/home/gem/user-data";
/// Where the skill projection appears inside a runtime of the default layout (I7).
pub const SKILLS_MOUNT: &str = "/home/gem/skills";

/// A parsed virtual path: the mount it lies in (one of the layout's or an extra mount of
/// the sandbox) plus a normalised path inside it.
///
/// The relative part has no `..`, `.` or empty component and no NUL. Textual normalisation
/// is only the first fence; `warren-fs` resolves the path by file descriptor beneath the
/// mount's host tree and refuses symlinks on its own (I2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VirtualPath {
    /// Where the mount appears inside the runtime.
    target: Cow<'static, str>,
    /// The host tree the mount's files live in.
    root: VirtualRoot,
    /// Whether files under the mount may be changed through warren.
    writable: bool,
    /// Where the mount starts inside its host tree (the workdir, `agents/skills`, or empty).
    prefix: String,
    /// The path inside the host tree: `prefix`, then the path below the mount.
    tree_relative: String,
}

impl VirtualPath {
    /// Parses `input` as an absolute path under one of `layout`'s mounts or of the
    /// sandbox's `extra` mounts, or as a path relative to `workdir`. An extra mount at a
    /// layout mount's target takes its place ([`ExtraMount::new`]).
    pub fn parse(
        input: &str,
        layout: &Layout,
        extra: &[ExtraMount],
        workdir: &Workdir,
    ) -> Result<Self, CoreError> {
        let refuse = |reason| CoreError::InvalidVirtualPath {
            path: shorten(input),
            reason,
            roots: roots(layout, extra),
        };
        if input.is_empty() {
            return Err(refuse("it is empty"));
        }
        if input.len() > MAX_PATH_BYTES {
            return Err(refuse("it is longer than 4096 bytes"));
        }
        let under = |target: &str| {
            input
                .strip_prefix(target)
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        };
        let (mut path, rest) = if input.starts_with('/') {
            let extra_hit = extra.iter().enumerate().find_map(|(index, mount)| {
                let rest = under(&mount.target)?;
                let index = u8::try_from(index).ok()?;
                Some((
                    Self {
                        target: Cow::Owned(mount.target.clone()),
                        root: VirtualRoot::Extra(index),
                        writable: mount.writable,
                        prefix: String::new(),
                        tree_relative: String::new(),
                    },
                    rest,
                ))
            });
            match extra_hit {
                Some(hit) => hit,
                None => {
                    let (mount, rest) = layout
                        .mount_of(input)
                        .ok_or_else(|| refuse("it is outside the allowed roots"))?;
                    let prefix = mount.source.prefix(workdir);
                    (Self::of_layout_mount(mount, prefix.clone(), prefix), rest)
                }
            }
        } else {
            let mount = layout.workdir_mount();
            // Relative paths start at the workdir, wherever the layout shows it.
            let path =
                Self::of_layout_mount(mount, mount.source.prefix(workdir), workdir.to_string());
            (path, input)
        };
        let mut parts: Vec<&str> = path
            .tree_relative
            .split('/')
            .filter(|c| !c.is_empty())
            .collect();
        parts.extend(plain_components(rest).map_err(refuse)?);
        path.tree_relative = parts.join("/");
        Ok(path)
    }

    /// Parses `input` as [`Self::parse`] does, and an absolute path outside every mount as
    /// the runtime's own ([`VirtualRoot::Runtime`]): normalised (no empty or `.`
    /// component), refused with `..` as any path is. A path that lies under a mount once
    /// normalised is that mount's (`/home/gem//user-data/x` is the workspace's `x`).
    pub fn parse_anywhere(
        input: &str,
        layout: &Layout,
        extra: &[ExtraMount],
        workdir: &Workdir,
    ) -> Result<Self, CoreError> {
        if !input.starts_with('/') {
            return Self::parse(input, layout, extra, workdir);
        }
        let refuse = |reason| CoreError::InvalidVirtualPath {
            path: shorten(input),
            reason,
            roots: roots(layout, extra),
        };
        if input.len() > MAX_PATH_BYTES {
            return Err(refuse("it is longer than 4096 bytes"));
        }
        let parts = plain_components(input).map_err(refuse)?;
        let normal = format!("/{}", parts.join("/"));
        let under_extra = extra.iter().any(|mount| {
            normal
                .strip_prefix(mount.target.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        });
        if under_extra || layout.mount_of(&normal).is_some() {
            return Self::parse(&normal, layout, extra, workdir);
        }
        Ok(Self {
            target: Cow::Borrowed(""),
            root: VirtualRoot::Runtime,
            writable: true,
            prefix: String::new(),
            tree_relative: parts.join("/"),
        })
    }

    /// This path as a sandbox bound to a branch of `workdir` sees it (I27): a path in the
    /// workdir lies in the branch instead, relative to the branch's root, shown where the
    /// workdir is (so the workdir itself is a mount's root there, never removed or moved).
    /// Any other path is unchanged.
    pub fn on_branch(self, workdir: &Workdir) -> Self {
        if self.root != VirtualRoot::UserData {
            return self;
        }
        let base = workdir.as_str();
        let inside = match self.tree_relative.strip_prefix(base) {
            Some("") => String::new(),
            Some(rest) if rest.starts_with('/') => rest[1..].to_owned(),
            _ => return self,
        };
        // Where the workdir is shown: the mount's target when the mount is the workdir
        // (its prefix), else the workdir's place below the mount.
        let target = match base.strip_prefix(self.prefix.as_str()) {
            Some("") => self.target.clone(),
            Some(rest) => Cow::Owned(format!("{}/{}", self.target, rest.trim_start_matches('/'))),
            None => return self,
        };
        Self {
            target,
            root: VirtualRoot::Branch,
            writable: self.writable,
            prefix: String::new(),
            tree_relative: inside,
        }
    }

    /// Whether this is a path of the runtime's own, outside every mount.
    pub fn is_runtime(&self) -> bool {
        self.root == VirtualRoot::Runtime
    }

    fn of_layout_mount(mount: &'static LayoutMount, prefix: String, base: String) -> Self {
        Self {
            target: Cow::Borrowed(mount.target),
            root: mount.source.tree(),
            writable: mount.writable,
            prefix,
            tree_relative: base,
        }
    }

    /// The host tree the file layer opens for this path.
    pub fn root(&self) -> VirtualRoot {
        self.root
    }

    /// Whether files under this path may be changed through warren.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The path relative to its host tree ([`Self::root`]), as `warren-fs` takes it; empty
    /// for the root of the tree itself.
    pub fn relative(&self) -> &str {
        &self.tree_relative
    }

    /// The path, within the same mount, that `warren-fs` reported relative to the host
    /// tree (an entry of a listing or a match of a search under this path). The caller
    /// vouches that it came from the file layer (it is not re-validated).
    pub fn rebase(&self, tree_relative: &str) -> Self {
        Self {
            target: self.target.clone(),
            root: self.root,
            writable: self.writable,
            prefix: self.prefix.clone(),
            tree_relative: tree_relative.trim_matches('/').to_owned(),
        }
    }

    /// Joins a path reported by `warren-fs` relative to this one.
    pub fn join(&self, child: &str) -> Self {
        let child = child.trim_matches('/');
        let tree_relative = match (self.tree_relative.is_empty(), child.is_empty()) {
            (_, true) => self.tree_relative.clone(),
            (true, false) => child.to_owned(),
            (false, false) => format!("{}/{child}", self.tree_relative),
        };
        self.rebase(&tree_relative)
    }

    /// Whether this is a mount's target itself (`/home/user`, `/mnt/user-data`): a mount
    /// root may be listed and written into, never removed or moved, whatever tree it shows
    /// (a workdir mount's root is a directory inside the workspace, which the file layer
    /// alone would let go).
    pub fn is_mount_root(&self) -> bool {
        self.below_mount().is_empty()
    }

    /// The path below the mount's target: empty for the mount itself.
    fn below_mount(&self) -> &str {
        if self.prefix.is_empty() {
            return &self.tree_relative;
        }
        match self.tree_relative.strip_prefix(&self.prefix) {
            Some(rest) => rest.trim_start_matches('/'),
            // Not reached for paths that came from this mount; shown as the tree has it.
            None => &self.tree_relative,
        }
    }
}

/// The components of `path` with empty and `.` ones dropped; `..` or a bad name refused
/// (the reason).
fn plain_components(path: &str) -> Result<Vec<&str>, &'static str> {
    let mut parts = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err("'..' is not allowed"),
            other => {
                if let Some(reason) = component_problem(other) {
                    return Err(reason);
                }
                parts.push(other);
            }
        }
    }
    Ok(parts)
}

impl fmt::Display for VirtualPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.target)?;
        let below = self.below_mount();
        if !below.is_empty() {
            write!(f, "/{below}")?;
        } else if self.target.is_empty() {
            // The runtime's root.
            f.write_str("/")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workdir() -> Workdir {
        Workdir::new("projects/p1").unwrap()
    }

    fn parse(input: &str) -> Result<VirtualPath, CoreError> {
        VirtualPath::parse(input, &Layout::ARS, &[], &workdir())
    }

    #[test]
    fn a_branch_shows_where_the_workdir_is_and_nothing_else_moves() {
        let workdir = workdir();
        let ars = |input: &str| parse(input).unwrap().on_branch(&workdir);
        for (input, relative, shown) in [
            (
                "notes.md",
                "notes.md",
                "/home/gem/user-data/projects/p1/notes.md",
            ),
            (".", "", "/home/gem/user-data/projects/p1"),
            (
                "/home/gem/user-data/projects/p1/a/b",
                "a/b",
                "/home/gem/user-data/projects/p1/a/b",
            ),
        ] {
            let path = ars(input);
            assert_eq!(path.root(), VirtualRoot::Branch, "{input}");
            assert_eq!(
                (path.relative(), path.to_string().as_str()),
                (relative, shown),
                "{input}"
            );
        }
        // The workdir itself is the branch mount's root: never removed or moved.
        assert!(ars(".").is_mount_root());
        // Beside the workdir, and a sibling whose name starts the same, nothing changes.
        for input in [
            "/home/gem/user-data/projects/p10/x",
            "/home/gem/user-data/other",
            "/home/gem/skills/s",
        ] {
            let path = ars(input);
            assert_ne!(path.root(), VirtualRoot::Branch, "{input}");
            assert_eq!(path, parse(input).unwrap(), "{input}");
        }
        // A layout that mounts the workdir shows the branch at the mount itself.
        let deerflow = VirtualPath::parse(
            "/mnt/user-data/outputs/r.md",
            &Layout::DEERFLOW,
            &[],
            &workdir,
        )
        .unwrap()
        .on_branch(&workdir);
        assert_eq!(
            (
                deerflow.root(),
                deerflow.relative(),
                deerflow.to_string().as_str()
            ),
            (
                VirtualRoot::Branch,
                "outputs/r.md",
                "/mnt/user-data/outputs/r.md"
            )
        );
    }

    #[test]
    fn a_path_outside_every_mount_is_the_runtime_s_own() {
        let anywhere = |input: &str| {
            VirtualPath::parse_anywhere(input, &Layout::ARS, &[], &workdir()).unwrap()
        };
        for (input, relative, shown) in [
            ("/", "", "/"),
            ("/tmp", "tmp", "/tmp"),
            ("//tmp/./a//b/", "tmp/a/b", "/tmp/a/b"),
            ("/home/gem/.bashrc", "home/gem/.bashrc", "/home/gem/.bashrc"),
        ] {
            let path = anywhere(input);
            assert!(path.is_runtime(), "{input}");
            assert_eq!(
                (path.relative(), path.to_string().as_str()),
                (relative, shown),
                "{input}"
            );
        }
        assert!(anywhere("/").is_mount_root());
        let mounted = anywhere("/home/gem//user-data/./x");
        assert_eq!(
            (mounted.root(), mounted.relative()),
            (VirtualRoot::UserData, "x")
        );
        assert_eq!(anywhere("notes.md").root(), VirtualRoot::UserData);
        for refused in ["/tmp/../etc/passwd", "/tmp/a\0b", "/.."] {
            assert!(
                VirtualPath::parse_anywhere(refused, &Layout::ARS, &[], &workdir()).is_err(),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn virtual_paths_map_to_their_roots() {
        let cases = [
            ("/home/gem/user-data", VirtualRoot::UserData, ""),
            ("/home/gem/user-data/", VirtualRoot::UserData, ""),
            (
                "/home/gem/user-data/a/b.txt",
                VirtualRoot::UserData,
                "a/b.txt",
            ),
            ("/home/gem/user-data//a/./b", VirtualRoot::UserData, "a/b"),
            (
                "/home/gem/skills/pdf/SKILL.md",
                VirtualRoot::Skills,
                "pdf/SKILL.md",
            ),
            ("notes.md", VirtualRoot::UserData, "projects/p1/notes.md"),
            ("./out/x", VirtualRoot::UserData, "projects/p1/out/x"),
            (".", VirtualRoot::UserData, "projects/p1"),
        ];
        for (input, root, relative) in cases {
            let path = parse(input).unwrap();
            assert_eq!((path.root(), path.relative()), (root, relative), "{input}");
        }
    }

    #[test]
    fn paths_outside_the_roots_are_refused_naming_the_roots() {
        for input in [
            "/etc/passwd",
            "/home/gem",
            "/home/gem/user-datax/a",
            "/home/gem/skillsx",
            "/home/gem/user-data/../skills",
            "../x",
            "a/../../b",
            "/home/gem/user-data/a\0b",
            "",
        ] {
            let err = parse(input).expect_err(input).to_string();
            assert!(err.contains("/home/gem/user-data"), "{input}: {err}");
        }
    }

    #[test]
    fn display_gives_the_virtual_form() {
        assert_eq!(
            parse("a/b").unwrap().to_string(),
            "/home/gem/user-data/projects/p1/a/b"
        );
        assert_eq!(parse("/home/gem/skills").unwrap().to_string(), SKILLS_MOUNT);
        assert_eq!(
            parse("/home/gem/user-data/x")
                .unwrap()
                .join("y/z")
                .to_string(),
            "/home/gem/user-data/x/y/z"
        );
    }

    fn deerflow(input: &str) -> Result<VirtualPath, CoreError> {
        VirtualPath::parse(
            input,
            &Layout::DEERFLOW,
            &[],
            &Workdir::new("threads/t1/user-data").unwrap(),
        )
    }

    #[test]
    fn deerflow_paths_map_into_the_workdir_and_the_skill_trees() {
        let cases = [
            (
                "/mnt/user-data",
                VirtualRoot::UserData,
                "threads/t1/user-data",
                true,
            ),
            (
                "/mnt/user-data/workspace/a.py",
                VirtualRoot::UserData,
                "threads/t1/user-data/workspace/a.py",
                true,
            ),
            (
                "outputs/r.md",
                VirtualRoot::UserData,
                "threads/t1/user-data/outputs/r.md",
                true,
            ),
            ("/mnt/skills/public/pdf", VirtualRoot::Skills, "pdf", false),
            (
                "/mnt/skills/custom/mine/SKILL.md",
                VirtualRoot::UserData,
                "agents/skills/mine/SKILL.md",
                false,
            ),
        ];
        for (input, root, relative, writable) in cases {
            let path = deerflow(input).unwrap();
            assert_eq!(
                (path.root(), path.relative(), path.is_writable()),
                (root, relative, writable),
                "{input}"
            );
        }
        assert_eq!(
            deerflow("workspace").unwrap().join("b/c").to_string(),
            "/mnt/user-data/workspace/b/c"
        );
        assert_eq!(deerflow(".").unwrap().to_string(), "/mnt/user-data");
        let custom = deerflow("/mnt/skills/custom").unwrap();
        assert_eq!(
            custom.rebase("agents/skills/x/y").to_string(),
            "/mnt/skills/custom/x/y"
        );
    }

    #[test]
    fn deerflow_paths_outside_its_mounts_are_refused_naming_them() {
        for input in [
            "/home/gem/user-data/threads",
            "/mnt",
            "/mnt/skills",
            "/mnt/user-data/../../x",
            "/mnt/skills/public/../custom",
            "../other-thread",
            "/etc/passwd",
        ] {
            let err = deerflow(input).expect_err(input).to_string();
            assert!(err.contains("/mnt/user-data"), "{input}: {err}");
            assert!(!err.contains("/home/gem/user-data or"), "{input}: {err}");
        }
    }

    fn e2b(input: &str) -> Result<VirtualPath, CoreError> {
        VirtualPath::parse(
            input,
            &Layout::E2B,
            &[],
            &Workdir::new("e2b/sbx-1").unwrap(),
        )
    }

    #[test]
    fn e2b_paths_under_the_home_and_relative_ones_map_into_the_workdir() {
        for (input, relative, shown) in [
            ("/home/user", "e2b/sbx-1", "/home/user"),
            ("/home/user/", "e2b/sbx-1", "/home/user"),
            ("/home/user/x", "e2b/sbx-1/x", "/home/user/x"),
            (
                "/home/user//a/./b.py",
                "e2b/sbx-1/a/b.py",
                "/home/user/a/b.py",
            ),
            ("x", "e2b/sbx-1/x", "/home/user/x"),
            ("./a/b", "e2b/sbx-1/a/b", "/home/user/a/b"),
            (".", "e2b/sbx-1", "/home/user"),
        ] {
            let path = e2b(input).unwrap();
            assert_eq!(
                (path.root(), path.relative(), path.is_writable()),
                (VirtualRoot::UserData, relative, true),
                "{input}"
            );
            assert_eq!(path.to_string(), shown, "{input}");
        }
        assert_eq!(
            e2b("/home/user").unwrap().join("d/f").to_string(),
            "/home/user/d/f"
        );
    }

    #[test]
    fn e2b_paths_outside_the_home_are_refused_as_in_every_layout() {
        for input in [
            "/home",
            "/home/userx",
            "/home/user/../gem",
            "/home/user/..",
            "/home/user/a/../../b",
            "/home/gem/user-data",
            "/home/gem/skills",
            "/mnt/user-data",
            "/etc/passwd",
            "/",
            "..",
            "../sbx-2/x",
            "a/../../b",
            "/home/user/a\0b",
            "",
        ] {
            let err = e2b(input).expect_err(input).to_string();
            assert!(err.ends_with("start with /home/user"), "{input}: {err}");
        }
    }

    #[test]
    fn extra_mounts_resolve_in_their_own_tree_and_may_replace_a_read_only_mount() {
        let extra = [
            ExtraMount::new(
                "/mnt/acp-workspace",
                "/srv/df".into(),
                "threads/t1/acp",
                false,
                &Layout::DEERFLOW,
            )
            .unwrap(),
            ExtraMount::new(
                "/mnt/skills/custom",
                "/srv/df".into(),
                "users/u/skills",
                false,
                &Layout::DEERFLOW,
            )
            .unwrap(),
            ExtraMount::new(
                "/mnt/scratch",
                "/srv/df".into(),
                "s",
                true,
                &Layout::DEERFLOW,
            )
            .unwrap(),
        ];
        let workdir = Workdir::new("threads/t1/user-data").unwrap();
        let parse = |input| VirtualPath::parse(input, &Layout::DEERFLOW, &extra, &workdir);
        let cases = [
            ("/mnt/acp-workspace", VirtualRoot::Extra(0), "", false),
            (
                "/mnt/acp-workspace/a/b",
                VirtualRoot::Extra(0),
                "a/b",
                false,
            ),
            ("/mnt/skills/custom/x", VirtualRoot::Extra(1), "x", false),
            ("/mnt/scratch/y", VirtualRoot::Extra(2), "y", true),
            (
                "/mnt/user-data/z",
                VirtualRoot::UserData,
                "threads/t1/user-data/z",
                true,
            ),
            ("/mnt/skills/public/p", VirtualRoot::Skills, "p", false),
        ];
        for (input, root, relative, writable) in cases {
            let path = parse(input).unwrap();
            assert_eq!(
                (path.root(), path.relative(), path.is_writable()),
                (root, relative, writable),
                "{input}"
            );
            assert_eq!(path.to_string(), input.trim_end_matches('/'));
        }
        assert_eq!(
            parse("/mnt/acp-workspace/a").unwrap().join("b").to_string(),
            "/mnt/acp-workspace/a/b"
        );
        for bad in [
            "/mnt/acp-workspace/../user-data",
            "/mnt/acp-workspacex",
            "/mnt",
        ] {
            let err = parse(bad).expect_err(bad).to_string();
            assert!(
                err.contains("or /mnt/acp-workspace, or /mnt/scratch"),
                "{err}"
            );
            assert!(!err.contains("/srv/df"), "no host path: {err}");
        }
    }
}
