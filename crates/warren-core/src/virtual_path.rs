//! Virtual paths: the only paths agents and product APIs see (I1, I7).
//!
//! `/home/gem/user-data/...` names the uid's UserWorkspace (read-write) and
//! `/home/gem/skills/...` its skill projection (read-only). A relative path resolves against
//! the sandbox's workdir. Anything else is refused with a message naming the allowed roots.

use std::fmt;

use crate::{component_problem, shorten, CoreError, Workdir, MAX_PATH_BYTES};

/// Where the UserWorkspace appears inside a runtime (I7).
pub const USER_DATA_MOUNT: &str = "/home/gem/user-data";
/// Where the skill projection appears inside a runtime, read-only (I7).
pub const SKILLS_MOUNT: &str = "/home/gem/skills";

/// Which persistent mount a virtual path lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VirtualRoot {
    /// The uid's UserWorkspace, read-write.
    UserData,
    /// The uid's skill projection, read-only.
    Skills,
}

impl VirtualRoot {
    /// The mount point inside a runtime.
    pub fn mount_point(self) -> &'static str {
        match self {
            Self::UserData => USER_DATA_MOUNT,
            Self::Skills => SKILLS_MOUNT,
        }
    }

    /// Whether files under this root may be changed through warren.
    pub fn is_writable(self) -> bool {
        matches!(self, Self::UserData)
    }
}

/// A parsed virtual path: a root plus a normalised relative path inside it.
///
/// The relative part has no `..`, `.` or empty component, no NUL, and is empty for the root
/// itself. Textual normalisation is only the first fence; `warren-fs` resolves the relative
/// part by file descriptor and refuses symlinks on its own (I2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VirtualPath {
    root: VirtualRoot,
    relative: String,
}

impl VirtualPath {
    /// Parses `input` as an absolute virtual path or a path relative to `workdir`.
    pub fn parse(input: &str, workdir: &Workdir) -> Result<Self, CoreError> {
        let refuse = |reason| CoreError::InvalidVirtualPath {
            path: shorten(input),
            reason,
        };
        if input.is_empty() {
            return Err(refuse("it is empty"));
        }
        if input.len() > MAX_PATH_BYTES {
            return Err(refuse("it is longer than 4096 bytes"));
        }
        let (root, rest, base) = if input.starts_with('/') {
            [VirtualRoot::UserData, VirtualRoot::Skills]
                .into_iter()
                .find_map(|root| {
                    let rest = input.strip_prefix(root.mount_point())?;
                    (rest.is_empty() || rest.starts_with('/')).then_some((root, rest, ""))
                })
                .ok_or_else(|| refuse("it is outside the allowed roots"))?
        } else {
            (VirtualRoot::UserData, input, workdir.as_str())
        };
        let mut parts: Vec<&str> = base.split('/').filter(|c| !c.is_empty()).collect();
        for component in rest.split('/') {
            match component {
                "" | "." => {}
                ".." => return Err(refuse("'..' is not allowed")),
                other => {
                    if let Some(reason) = component_problem(other) {
                        return Err(refuse(reason));
                    }
                    parts.push(other);
                }
            }
        }
        Ok(Self {
            root,
            relative: parts.join("/"),
        })
    }

    /// A path relative to `root`, as `warren-fs` reports paths. The caller vouches that
    /// `relative` came from the file layer (it is not re-validated).
    pub fn within(root: VirtualRoot, relative: &str) -> Self {
        Self {
            root,
            relative: relative.trim_matches('/').to_owned(),
        }
    }

    /// The mount this path lies in.
    pub fn root(&self) -> VirtualRoot {
        self.root
    }

    /// The path relative to its root; empty for the root itself.
    pub fn relative(&self) -> &str {
        &self.relative
    }

    /// Joins a relative path reported by `warren-fs` (relative to this path) to this one.
    pub fn join(&self, child: &str) -> Self {
        let child = child.trim_matches('/');
        let relative = match (self.relative.is_empty(), child.is_empty()) {
            (_, true) => self.relative.clone(),
            (true, false) => child.to_owned(),
            (false, false) => format!("{}/{child}", self.relative),
        };
        Self {
            root: self.root,
            relative,
        }
    }
}

impl fmt::Display for VirtualPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.root.mount_point())?;
        if !self.relative.is_empty() {
            write!(f, "/{}", self.relative)?;
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
        VirtualPath::parse(input, &workdir())
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
            VirtualPath::within(VirtualRoot::UserData, "x")
                .join("y/z")
                .to_string(),
            "/home/gem/user-data/x/y/z"
        );
    }
}
