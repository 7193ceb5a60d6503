//! Layouts: what a runtime's namespace looks like from inside, as data (I7, I11).
//!
//! A [`Layout`] names the sandbox user and its home, and lists the persistent mounts: where
//! each appears, which of the uid's trees it shows, and whether it is writable. Everything
//! else a runtime sees is ephemeral (the home and `/tmp` are tmpfs, the system directories
//! a copy-on-write layer) or read-only. Every backend mounts from this one description,
//! virtual paths resolve against it ([`crate::VirtualPath`]), and a sandbox is bound to
//! its layout for as long as it lives (I5, I16): a live runtime never changes its view.
//!
//! Three layouts exist:
//!
//! ```text
//! ars (the default, I7)                   deerflow (DeerFlow's AIO sandbox)
//! /home/gem            tmpfs               /home/gem             tmpfs
//! /home/gem/user-data  UserWorkspace  rw   /mnt/user-data        the workdir            rw
//! /home/gem/skills     skill projection ro /mnt/skills/public    skill projection       ro
//!                                          /mnt/skills/custom    personal skills (I9)   ro
//!
//! e2b (E2B's `base` template)
//! /home/user           the workdir    rw   (the home itself: no tmpfs, no skills)
//! ```
//!
//! The sandbox user is `gem` in the first two and `user` in E2B's; its name and home come
//! from the layout everywhere (the environment, `/etc/passwd` and `/etc/group` inside the
//! runtime, [`crate::sandbox_user`]). All keep the same uid boundary (1000:1000, I11) and
//! the same no-follow resolution of every mount source (I2): a mount that shows a
//! subdirectory of the UserWorkspace is opened beneath the workspace by descriptor, never
//! by a host path a user could bend.
//!
//! A layout whose workdir mount *is* the home ([`Layout::home_mount`]) has no ephemeral
//! home: what the user writes there is persistent already, so runtime snapshots skip it
//! and a resumed runtime's seed puts nothing into it (I30).

use crate::{CoreError, Workdir};

/// The layouts warren knows, by the name clients and records use.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LayoutName {
    /// The agent-runtime-sandbox layout of the design seed (I7); the default.
    #[default]
    Ars,
    /// DeerFlow's AIO sandbox view: `/mnt/user-data` and `/mnt/skills/{public,custom}`.
    Deerflow,
    /// E2B's `base` template view: user `user`, the workdir mounted as `/home/user`.
    E2b,
}

impl LayoutName {
    /// Every layout warren knows.
    pub const ALL: [Self; 3] = [Self::Ars, Self::Deerflow, Self::E2b];

    /// The name in requests, records and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ars => "ars",
            Self::Deerflow => "deerflow",
            Self::E2b => "e2b",
        }
    }

    /// The layout a client or a record names.
    pub fn parse(name: &str) -> Result<Self, CoreError> {
        Self::ALL
            .into_iter()
            .find(|layout| layout.as_str() == name)
            .ok_or_else(|| CoreError::UnknownLayout {
                name: crate::shorten(name),
            })
    }

    /// The description this name stands for.
    pub fn layout(self) -> &'static Layout {
        match self {
            Self::Ars => &Layout::ARS,
            Self::Deerflow => &Layout::DEERFLOW,
            Self::E2b => &Layout::E2B,
        }
    }
}

impl std::fmt::Display for LayoutName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of the uid's persistent trees a mount shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MountSource {
    /// The whole UserWorkspace (I7).
    UserWorkspace,
    /// The sandbox's workdir, a directory inside the UserWorkspace (I4).
    Workdir,
    /// The uid's skill projection (I7, I32).
    SkillProjection,
    /// The uid's personal skills, `agents/skills` inside the UserWorkspace (I9).
    PersonalSkills,
    /// The sandbox's extra mount of this index ([`crate::ExtraMount`]): never part of a
    /// layout, only of one sandbox's binding.
    Extra(u8),
}

/// Which host tree a mount's files live in, as the file layer opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VirtualRoot {
    /// The uid's UserWorkspace (or an ephemeral sandbox's stand-in).
    UserData,
    /// The uid's skill projection.
    Skills,
    /// The source directory of the sandbox's extra mount of this index.
    Extra(u8),
    /// The branch of the workdir the sandbox is bound to (I27): it shows where the workdir
    /// would be.
    Branch,
    /// No host tree: the runtime's own files outside every mount (`/tmp`, the image's
    /// tree), which only its agent reaches, as the sandbox user (issue 42).
    Runtime,
}

impl MountSource {
    /// The host tree this source lies in.
    pub fn tree(self) -> VirtualRoot {
        match self {
            Self::UserWorkspace | Self::Workdir | Self::PersonalSkills => VirtualRoot::UserData,
            Self::SkillProjection => VirtualRoot::Skills,
            Self::Extra(index) => VirtualRoot::Extra(index),
        }
    }

    /// Where inside its tree this source starts: empty for a whole tree.
    pub fn prefix(self, workdir: &Workdir) -> String {
        match self {
            Self::UserWorkspace | Self::SkillProjection | Self::Extra(_) => String::new(),
            Self::Workdir => workdir.as_str().to_owned(),
            Self::PersonalSkills => PERSONAL_SKILLS.to_owned(),
        }
    }
}

/// Where personal skills live inside the UserWorkspace (I9).
pub const PERSONAL_SKILLS: &str = "agents/skills";

/// One persistent mount of a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayoutMount {
    /// The absolute, normalised path inside the runtime.
    pub target: &'static str,
    /// The tree it shows.
    pub source: MountSource,
    /// Whether the runtime (and warren's file API) may change files under it.
    pub writable: bool,
}

/// What a runtime looks like from inside: the sandbox user, its home and the persistent
/// mounts. Everything not listed is ephemeral or read-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    /// The layout's name.
    pub name: LayoutName,
    /// The sandbox user's name; its numeric identity is always 1000:1000 (I11).
    pub user: &'static str,
    /// The sandbox user's home: a size-capped tmpfs, kept only by runtime snapshots (I30),
    /// unless a persistent mount has it as its target ([`Layout::home_mount`]).
    pub home: &'static str,
    /// The persistent mounts, none inside another.
    pub mounts: &'static [LayoutMount],
    /// The mounts' targets in words, for messages that tell a client where paths may go.
    pub roots: &'static str,
    /// Directories every workdir of this layout holds, made (no-follow, as the sandbox
    /// user) when a sandbox is bound to it. Empty for the default layout, whose `uploads/`
    /// and `outputs/` appear on first use (I8).
    pub workdir_skeleton: &'static [&'static str],
}

impl Layout {
    /// The design seed's layout (I7): the whole UserWorkspace and the skill projection
    /// under an ephemeral `/home/gem`.
    pub const ARS: Self = Self {
        name: LayoutName::Ars,
        user: "gem",
        home: "/home/gem",
        mounts: &[
            LayoutMount {
                target: "/home/gem/user-data",
                source: MountSource::UserWorkspace,
                writable: true,
            },
            LayoutMount {
                target: "/home/gem/skills",
                source: MountSource::SkillProjection,
                writable: false,
            },
        ],
        roots: "/home/gem/user-data or /home/gem/skills",
        workdir_skeleton: &[],
    };

    /// DeerFlow's AIO sandbox view: only the thread's workdir is writable and persistent
    /// (DeerFlow's `threads/{thread_id}/user-data`, holding `workspace/`, `uploads/` and
    /// `outputs/`); the operator's skills and the uid's own are read-only beside it.
    pub const DEERFLOW: Self = Self {
        name: LayoutName::Deerflow,
        user: "gem",
        home: "/home/gem",
        mounts: &[
            LayoutMount {
                target: "/mnt/user-data",
                source: MountSource::Workdir,
                writable: true,
            },
            LayoutMount {
                target: "/mnt/skills/public",
                source: MountSource::SkillProjection,
                writable: false,
            },
            LayoutMount {
                target: "/mnt/skills/custom",
                source: MountSource::PersonalSkills,
                writable: false,
            },
        ],
        roots: "/mnt/user-data, /mnt/skills/public or /mnt/skills/custom",
        workdir_skeleton: &["workspace", "uploads", "outputs"],
    };

    /// E2B's `base` template view: the sandbox user is `user` and its home `/home/user`
    /// is the sandbox's workdir itself, writable and persistent, so everything an E2B
    /// client writes under the home lands in the workdir (and the Viewer). There is no
    /// ephemeral home tmpfs and no skill mount.
    pub const E2B: Self = Self {
        name: LayoutName::E2b,
        user: "user",
        home: "/home/user",
        mounts: &[LayoutMount {
            target: "/home/user",
            source: MountSource::Workdir,
            writable: true,
        }],
        roots: "/home/user",
        workdir_skeleton: &[],
    };

    /// The mount an absolute in-runtime path lies in, and the rest of the path after the
    /// mount's target (empty, or starting with `/`).
    pub fn mount_of<'a>(&self, path: &'a str) -> Option<(&'static LayoutMount, &'a str)> {
        self.mounts.iter().find_map(|mount| {
            let rest = path.strip_prefix(mount.target)?;
            (rest.is_empty() || rest.starts_with('/')).then_some((mount, rest))
        })
    }

    /// The mount relative paths resolve in: the one showing the workdir, else the one
    /// showing the whole UserWorkspace (every layout has exactly one of the two).
    pub fn workdir_mount(&self) -> &'static LayoutMount {
        self.mounts
            .iter()
            .find(|mount| mount.source == MountSource::Workdir)
            .or_else(|| {
                self.mounts
                    .iter()
                    .find(|mount| mount.source == MountSource::UserWorkspace)
            })
            .expect("every layout shows the workdir or the whole UserWorkspace")
    }

    /// The workdir as a path inside the runtime: the default cwd of commands.
    pub fn workdir_path(&self, workdir: &Workdir) -> String {
        let mount = self.workdir_mount();
        match mount.source {
            MountSource::Workdir => mount.target.to_owned(),
            _ => format!("{}/{workdir}", mount.target),
        }
    }

    /// The mounts that lie inside the home, as names relative to it: a snapshot of the
    /// home and a seed copied into a new one skip them (they are persistent, not state).
    pub fn mounts_in_home(&self) -> Vec<&'static str> {
        self.mounts
            .iter()
            .filter_map(|mount| mount.target.strip_prefix(self.home)?.strip_prefix('/'))
            .collect()
    }

    /// The persistent mount that is the home itself (E2B's workdir), if any: such a home is
    /// no tmpfs, runtime snapshots skip it and seeds restore nothing into it (I30).
    pub fn home_mount(&self) -> Option<&'static LayoutMount> {
        self.mounts.iter().find(|mount| mount.target == self.home)
    }

    /// Whether the home is ephemeral state: a tmpfs of the runtime's, recorded by runtime
    /// snapshots and seeded on resume (I30). False when the home is a persistent mount.
    pub fn home_is_ephemeral(&self) -> bool {
        self.home_mount().is_none()
    }

    /// Whether this layout needs the uid's personal-skills directory to exist.
    pub fn shows_personal_skills(&self) -> bool {
        self.mounts
            .iter()
            .any(|mount| mount.source == MountSource::PersonalSkills)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalised(path: &str) -> bool {
        path.starts_with('/')
            && path[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..")
    }

    #[test]
    fn every_layout_is_well_formed() {
        for name in LayoutName::ALL {
            let layout = name.layout();
            assert_eq!(layout.name, name);
            assert!(normalised(layout.home), "{name}: home");
            assert_eq!(LayoutName::parse(name.as_str()), Ok(name));
            let writable: Vec<_> = layout.mounts.iter().filter(|m| m.writable).collect();
            assert_eq!(writable.len(), 1, "{name}: exactly one writable mount");
            assert!(
                matches!(
                    writable[0].source,
                    MountSource::UserWorkspace | MountSource::Workdir
                ),
                "{name}: only the workspace or the workdir is writable"
            );
            for mount in layout.mounts {
                assert!(normalised(mount.target), "{name}: {}", mount.target);
                assert!(layout.roots.contains(mount.target), "{name}: roots text");
                if mount.target == layout.home {
                    assert_eq!(
                        (mount.source, mount.writable),
                        (MountSource::Workdir, true),
                        "{name}: only the writable workdir may be the home"
                    );
                }
                assert!(
                    !layout.home.starts_with(&format!("{}/", mount.target)),
                    "{name}: the home is not inside a mount"
                );
                for other in layout.mounts.iter().filter(|o| *o != mount) {
                    assert!(
                        !other.target.starts_with(&format!("{}/", mount.target))
                            && other.target != mount.target,
                        "{name}: {} is inside {}",
                        other.target,
                        mount.target
                    );
                }
                if matches!(
                    mount.source,
                    MountSource::SkillProjection | MountSource::PersonalSkills
                ) {
                    assert!(!mount.writable, "{name}: skills are read-only");
                }
            }
        }
    }

    #[test]
    fn the_ars_layout_is_the_default_and_unchanged() {
        let layout = LayoutName::default().layout();
        assert_eq!(layout.name, LayoutName::Ars);
        assert_eq!((layout.user, layout.home), ("gem", "/home/gem"));
        let workdir = Workdir::new("projects/p1").unwrap();
        assert_eq!(
            layout.workdir_path(&workdir),
            "/home/gem/user-data/projects/p1"
        );
        assert_eq!(layout.mounts_in_home(), ["user-data", "skills"]);
        assert!(!layout.shows_personal_skills());
        assert!(layout.workdir_skeleton.is_empty(), "I8: made on first use");
    }

    #[test]
    fn the_deerflow_layout_shows_the_workdir_and_two_read_only_skill_trees() {
        let layout = LayoutName::Deerflow.layout();
        let workdir = Workdir::new("threads/t1/user-data").unwrap();
        assert_eq!(layout.workdir_path(&workdir), "/mnt/user-data");
        assert!(layout.mounts_in_home().is_empty());
        assert!(layout.shows_personal_skills());
        assert_eq!(layout.workdir_skeleton, ["workspace", "uploads", "outputs"]);
        let (mount, rest) = layout.mount_of("/mnt/user-data/outputs/a").unwrap();
        assert_eq!((mount.source, rest), (MountSource::Workdir, "/outputs/a"));
        assert_eq!(mount.source.prefix(&workdir), "threads/t1/user-data");
        let (mount, _) = layout.mount_of("/mnt/skills/custom/x").unwrap();
        assert_eq!(mount.source.prefix(&workdir), PERSONAL_SKILLS);
        assert!(!mount.writable);
        for outside in [
            "/mnt",
            "/mnt/skills",
            "/mnt/user-datax",
            "/home/gem/user-data",
        ] {
            assert!(layout.mount_of(outside).is_none(), "{outside}");
        }
    }

    #[test]
    fn the_e2b_layout_makes_the_workdir_the_users_home() {
        let layout = LayoutName::parse("e2b").unwrap().layout();
        assert_eq!(layout.name, LayoutName::E2b);
        assert_eq!((layout.user, layout.home), ("user", "/home/user"));
        let workdir = Workdir::new("e2b/sbx-1").unwrap();
        assert_eq!(layout.workdir_path(&workdir), "/home/user");
        let home = layout.home_mount().expect("the home is the workdir mount");
        assert_eq!((home.source, home.writable), (MountSource::Workdir, true));
        assert!(
            !layout.home_is_ephemeral(),
            "I30: nothing of the home to snapshot"
        );
        assert!(layout.mounts_in_home().is_empty());
        assert!(!layout.shows_personal_skills());
        assert!(layout.workdir_skeleton.is_empty());
        let (mount, rest) = layout.mount_of("/home/user/a/b").unwrap();
        assert_eq!((mount.source, rest), (MountSource::Workdir, "/a/b"));
        assert_eq!(layout.mount_of("/home/user").unwrap().1, "");
        for outside in ["/home", "/home/userx", "/home/gem", "/mnt/user-data", "/"] {
            assert!(layout.mount_of(outside).is_none(), "{outside}");
        }
    }

    #[test]
    fn the_other_layouts_keep_an_ephemeral_home() {
        for name in [LayoutName::Ars, LayoutName::Deerflow] {
            let layout = name.layout();
            assert!(layout.home_is_ephemeral(), "{name}");
            assert_eq!(layout.user, "gem", "{name}");
        }
    }

    #[test]
    fn unknown_layout_names_are_refused_naming_the_known_ones() {
        let err = LayoutName::parse("e2b-desktop").unwrap_err().to_string();
        assert!(
            err.contains("ars") && err.contains("deerflow") && err.contains("e2b"),
            "{err}"
        );
    }
}
