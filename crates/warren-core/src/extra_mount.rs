//! Extra mounts: host directories an operator allowed, shown in one sandbox's runtimes
//! beside its layout's mounts (DeerFlow's `extra_mounts`, e.g. `/mnt/acp-workspace`).
//!
//! An extra mount is part of the sandbox's binding, as its layout is (I16): every start of
//! the sandbox shows the same directories at the same places, and a live sandbox never
//! changes them. Its source is a directory beneath a host directory the operator named,
//! never a user's tree: `root` is opened by its path (the operator's), `beneath` from that
//! descriptor with no symlink followed, no `..` and no mount crossed (I2), so a link planted
//! under the operator's directory cannot point a runtime anywhere else.

use std::path::PathBuf;

use crate::{component_problem, shorten, CoreError, Layout, MountSource};

/// Not empty, not `.` or `..`, and without a problem [`component_problem`] names.
fn normal_component(c: &str) -> bool {
    !c.is_empty() && c != "." && c != ".." && component_problem(c).is_none()
}

/// Where every extra mount's target lies: beside the layout's own mounts, never over the
/// system directories, the home or `/tmp`.
pub const EXTRA_MOUNT_PARENT: &str = "/mnt";

/// Most extra mounts one sandbox may have.
pub const MAX_EXTRA_MOUNTS: usize = 10;

/// One operator-allowed host directory, mounted into a sandbox's runtimes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ExtraMount {
    /// The absolute, normalised path inside the runtime, under [`EXTRA_MOUNT_PARENT`].
    pub target: String,
    /// The operator's host directory the source lies beneath (absolute, no `.` or `..`).
    pub root: PathBuf,
    /// The directory inside `root` the mount shows: normal components only, never empty.
    pub beneath: String,
    /// Whether the runtime (and warren's file API) may change files under it.
    pub writable: bool,
}

impl ExtraMount {
    /// Checks one extra mount against `layout`: the target lies under `/mnt`, is
    /// normalised, and neither holds nor lies inside a mount of the layout, except that it
    /// may take the place of a read-only one (DeerFlow sends `/mnt/skills/custom` when it
    /// keeps a user's skills itself). `beneath` has only normal components.
    pub fn new(
        target: &str,
        root: PathBuf,
        beneath: &str,
        writable: bool,
        layout: &Layout,
    ) -> Result<Self, CoreError> {
        Self::check_target(target, writable, layout)?;
        let refuse = |reason: String| CoreError::InvalidExtraMount {
            target: shorten(target),
            reason,
        };
        let root_text = root.to_string_lossy();
        let root_plain = root.is_absolute()
            && root_text.len() > 1
            && root_text[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !root_plain {
            return Err(refuse(
                "the operator's directory must be an absolute path without `.` or `..`".into(),
            ));
        }
        let beneath_plain = !beneath.is_empty() && beneath.split('/').all(normal_component);
        if !beneath_plain {
            return Err(refuse(
                "the source must be a directory beneath the operator's directory, \
                 named without `.`, `..` or empty components"
                    .into(),
            ));
        }
        Ok(Self {
            target: target.to_owned(),
            root,
            beneath: beneath.to_owned(),
            writable,
        })
    }

    /// Checks where an extra mount may appear in `layout`: a normalised path under
    /// [`EXTRA_MOUNT_PARENT`] that neither holds nor lies inside one of the layout's mounts,
    /// except that a read-only extra mount may take the place of a read-only layout mount.
    pub fn check_target(target: &str, writable: bool, layout: &Layout) -> Result<(), CoreError> {
        let refuse = |reason: String| CoreError::InvalidExtraMount {
            target: shorten(target),
            reason,
        };
        let normal = target
            .strip_prefix(EXTRA_MOUNT_PARENT)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|rest| !rest.is_empty() && rest.split('/').all(normal_component));
        if !normal {
            return Err(refuse(format!(
                "the target must be a normalised path under {EXTRA_MOUNT_PARENT}/"
            )));
        }
        let inside = |outer: &str, inner: &str| {
            inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
        };
        for mount in layout.mounts {
            if mount.target == target {
                if mount.writable || writable {
                    return Err(refuse(format!(
                        "only a read-only extra mount may take the place of {}, a read-only \
                         mount of the {} layout",
                        mount.target, layout.name
                    )));
                }
            } else if inside(mount.target, target) || inside(target, mount.target) {
                return Err(refuse(format!(
                    "it would overlap the layout's mount {}",
                    mount.target
                )));
            }
        }
        Ok(())
    }

    /// Checks a sandbox's whole set: at most [`MAX_EXTRA_MOUNTS`], no target twice and none
    /// inside another.
    pub fn check_set(mounts: &[ExtraMount]) -> Result<(), CoreError> {
        if mounts.len() > MAX_EXTRA_MOUNTS {
            return Err(CoreError::InvalidExtraMount {
                target: String::new(),
                reason: format!(
                    "{} extra mounts were asked for; at most {MAX_EXTRA_MOUNTS} are allowed",
                    mounts.len()
                ),
            });
        }
        for (i, a) in mounts.iter().enumerate() {
            for b in &mounts[i + 1..] {
                let nested = |outer: &str, inner: &str| {
                    inner == outer
                        || inner
                            .strip_prefix(outer)
                            .is_some_and(|rest| rest.starts_with('/'))
                };
                if nested(&a.target, &b.target) || nested(&b.target, &a.target) {
                    return Err(CoreError::InvalidExtraMount {
                        target: shorten(&b.target),
                        reason: format!("it is {} again or inside it", a.target),
                    });
                }
            }
        }
        Ok(())
    }

    /// The host path of the source, for messages to the operator (never to a sandbox).
    pub fn host_path(&self) -> PathBuf {
        self.root.join(&self.beneath)
    }
}

/// One persistent mount of a sandbox's view, whether its layout's or an extra one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewMount<'a> {
    /// Where it appears inside the runtime.
    pub target: &'a str,
    /// What it shows.
    pub source: MountSource,
    /// Whether the runtime may write under it.
    pub writable: bool,
}

/// Every persistent mount of a sandbox with `layout` and `extra` mounts: the layout's in
/// its order, less any an extra mount takes the place of, then the extra mounts in theirs
/// (index `i` is [`MountSource::Extra`]`(i)`). Backends mount exactly these.
pub fn view_mounts<'a>(layout: &'static Layout, extra: &'a [ExtraMount]) -> Vec<ViewMount<'a>> {
    let replaced = |target: &str| extra.iter().any(|m| m.target == target);
    let own = layout
        .mounts
        .iter()
        .filter(|mount| !replaced(mount.target))
        .map(|mount| ViewMount {
            target: mount.target,
            source: mount.source,
            writable: mount.writable,
        });
    let extra = extra.iter().zip(0u8..).map(|(mount, index)| ViewMount {
        target: &mount.target,
        source: MountSource::Extra(index),
        writable: mount.writable,
    });
    own.chain(extra).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra(target: &str, beneath: &str, writable: bool) -> Result<ExtraMount, CoreError> {
        ExtraMount::new(
            target,
            PathBuf::from("/srv/deer-flow"),
            beneath,
            writable,
            &Layout::DEERFLOW,
        )
    }

    #[test]
    fn an_extra_mount_lies_under_mnt_beside_the_layout_mounts() {
        let acp = extra("/mnt/acp-workspace", "threads/t1/acp-workspace", false).unwrap();
        assert_eq!(
            acp.host_path(),
            PathBuf::from("/srv/deer-flow/threads/t1/acp-workspace")
        );
        for bad in [
            "/mnt",
            "/mnt/",
            "/etc",
            "/mntx/a",
            "/mnt/a/../b",
            "/mnt/./a",
            "/mnt//a",
            "/mnt/a/",
            "mnt/a",
            "/tmp/a",
            "/home/gem/x",
        ] {
            let err = extra(bad, "x", false).expect_err(bad).to_string();
            assert!(err.contains("/mnt/"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_extra_mount_may_replace_a_read_only_layout_mount_but_never_overlap_one() {
        assert!(extra("/mnt/skills/custom", "users/u/skills", false).is_ok());
        for bad in [
            "/mnt/user-data",
            "/mnt/user-data/x",
            "/mnt/skills",
            "/mnt/skills/public/x",
        ] {
            assert!(extra(bad, "x", false).is_err(), "{bad}");
        }
        let writable = extra("/mnt/skills/custom", "x", true)
            .unwrap_err()
            .to_string();
        assert!(
            writable.contains("only a read-only extra mount"),
            "{writable}"
        );
    }

    #[test]
    fn the_source_is_beneath_the_operator_directory_in_normal_components() {
        for bad in ["", "..", "a/../b", "a//b", "/a", "a/./b", "a/"] {
            assert!(extra("/mnt/x", bad, false).is_err(), "{bad:?}");
        }
        for root in ["relative", "/", "/srv/../etc", "/srv//x"] {
            let made =
                ExtraMount::new("/mnt/x", PathBuf::from(root), "a", false, &Layout::DEERFLOW);
            assert!(made.is_err(), "{root}");
        }
    }

    #[test]
    fn the_view_is_the_layout_less_what_is_replaced_then_the_extra_mounts() {
        let extra = [
            extra("/mnt/skills/custom", "a", false).unwrap(),
            extra("/mnt/acp-workspace", "b", true).unwrap(),
        ];
        let view: Vec<_> = view_mounts(&Layout::DEERFLOW, &extra)
            .into_iter()
            .map(|m| (m.target, m.source, m.writable))
            .collect();
        assert_eq!(
            view,
            [
                ("/mnt/user-data", MountSource::Workdir, true),
                ("/mnt/skills/public", MountSource::SkillProjection, false),
                ("/mnt/skills/custom", MountSource::Extra(0), false),
                ("/mnt/acp-workspace", MountSource::Extra(1), true),
            ]
        );
    }

    #[test]
    fn a_set_has_no_target_twice_or_nested() {
        let a = extra("/mnt/a", "x", false).unwrap();
        let b = extra("/mnt/a/b", "y", false).unwrap();
        let c = extra("/mnt/c", "z", true).unwrap();
        assert!(ExtraMount::check_set(&[a.clone(), c.clone()]).is_ok());
        assert!(ExtraMount::check_set(&[a.clone(), a.clone()]).is_err());
        assert!(ExtraMount::check_set(&[b, a]).is_err());
        assert!(ExtraMount::check_set(&vec![c; MAX_EXTRA_MOUNTS + 1]).is_err());
    }
}
