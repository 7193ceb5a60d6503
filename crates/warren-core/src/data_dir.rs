//! Where things live in the data directory. Pure path arithmetic; opening these paths safely
//! is `warren-fs`'s job.

use std::path::{Path, PathBuf};

use crate::{SafeUid, SandboxId};

/// Where warren keeps things: the *workspace directory*, which every replica of a cluster
/// shares (issue 14), and the *data directory*, this node's own. On one machine they are
/// the same directory, as they always were.
///
/// ```text
/// shared: <workspace>/user-data/shared/<safe_uid>/workspace  a uid's UserWorkspace (I3, I7)
///         <workspace>/skill-projections/<safe_uid>           its read-only skill projection (I7)
///         <workspace>/artifacts/<safe_uid>/<sha256>          its presented artifacts (I26)
///         <workspace>/snapshots/<safe_uid>                   its local snapshot store (I30, I31)
///         <workspace>/scratch/<sandbox>/workspace            an ephemeral sandbox's stand-in workspace (I14)
///         <workspace>/scratch/<sandbox>/skills               its empty read-only skills mount
/// node:   <data>/volumes/<safe_uid>.ext4                     its filesystem, with storage quotas (I23)
///         <data>/runtimes, <data>/docker, <data>/seeds       runtimes, binds, restore seeds
///         <data>/warren.db                                   the SQLite state store
///         <data>/token                                       the generated provisioner token (0600)
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataLayout {
    data_dir: PathBuf,
    workspace_dir: PathBuf,
}

impl DataLayout {
    /// A layout with everything in `data_dir` (one machine).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Self {
            workspace_dir: data_dir.clone(),
            data_dir,
        }
    }

    /// The same layout with the shared trees in `workspace_dir` instead.
    pub fn with_workspace_dir(mut self, workspace_dir: impl Into<PathBuf>) -> Self {
        self.workspace_dir = workspace_dir.into();
        self
    }

    /// The data directory: this node's own.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The workspace directory: what every replica shares (the data directory on one
    /// machine).
    pub fn workspace_dir(&self) -> &Path {
        &self.workspace_dir
    }

    /// Whether the shared trees live apart from the data directory.
    pub fn is_split(&self) -> bool {
        self.workspace_dir != self.data_dir
    }

    /// The tree of every uid's UserWorkspace, relative to the workspace directory. It may be
    /// a mount of its own (warren on Kubernetes mounts the USER_DATA claim there), so it is
    /// opened as a root of its own: no resolution below the workspace directory crosses
    /// into it.
    pub const USER_DATA_RELATIVE: &'static str = "user-data";

    /// The directory of `uid`'s UserWorkspace, relative to [`Self::USER_DATA_RELATIVE`].
    pub fn user_dir_in_user_data(uid: &SafeUid) -> String {
        format!("shared/{uid}")
    }

    /// The UserWorkspace of `uid`, relative to the workspace directory.
    pub fn user_workspace_relative(uid: &SafeUid) -> String {
        format!(
            "{}/{}/workspace",
            Self::USER_DATA_RELATIVE,
            Self::user_dir_in_user_data(uid)
        )
    }

    /// The skill projection of `uid`, relative to the workspace directory.
    pub fn skill_projection_relative(uid: &SafeUid) -> String {
        format!("skill-projections/{uid}")
    }

    /// The UserWorkspace of `uid` on the host.
    pub fn user_workspace(&self, uid: &SafeUid) -> PathBuf {
        self.workspace_dir.join(Self::user_workspace_relative(uid))
    }

    /// The skill projection of `uid` on the host.
    pub fn skill_projection(&self, uid: &SafeUid) -> PathBuf {
        self.workspace_dir
            .join(Self::skill_projection_relative(uid))
    }

    /// A uid's artifact store, relative to the workspace directory: blobs named by SHA-256.
    pub fn artifacts_relative(uid: &SafeUid) -> String {
        format!("artifacts/{uid}")
    }

    /// A uid's local snapshot store (chunks and manifests), on the host.
    pub fn local_snapshots(&self, uid: &SafeUid) -> PathBuf {
        self.workspace_dir.join("snapshots").join(uid.as_str())
    }

    /// Where ephemeral sandboxes keep their scratch trees, relative to the workspace
    /// directory: shared, so whichever node runs the sandbox's runtime mounts the same one.
    pub const SCRATCH_RELATIVE: &'static str = "scratch";

    /// The scratch tree of an ephemeral sandbox: it stands in for the uid's persistent
    /// mounts and is removed when the sandbox ends (I14).
    pub fn scratch(&self, sandbox: &SandboxId) -> PathBuf {
        self.workspace_dir
            .join(Self::SCRATCH_RELATIVE)
            .join(sandbox.as_str())
    }

    /// The directory mounted at `/home/gem/user-data` for an ephemeral sandbox.
    pub fn scratch_workspace(&self, sandbox: &SandboxId) -> PathBuf {
        self.scratch(sandbox).join("workspace")
    }

    /// The (empty) directory mounted at `/home/gem/skills` for an ephemeral sandbox.
    pub fn scratch_skills(&self, sandbox: &SandboxId) -> PathBuf {
        self.scratch(sandbox).join("skills")
    }

    /// The SQLite state store.
    pub fn state_db(&self) -> PathBuf {
        self.data_dir.join("warren.db")
    }

    /// The file holding a generated provisioner token.
    pub fn token_file(&self) -> PathBuf {
        self.data_dir.join("token")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Uid;

    #[test]
    fn workspace_and_projection_paths_use_the_safe_uid() {
        let layout = DataLayout::new("/srv/warren");
        let uid = Uid::new("../bob").unwrap().safe();
        let ws = layout.user_workspace(&uid);
        assert!(ws
            .to_str()
            .unwrap()
            .starts_with("/srv/warren/user-data/shared/uid-"));
        assert!(ws.ends_with("workspace"));
        assert_eq!(ws.components().count(), 7);
        let alice = Uid::new("alice").unwrap().safe();
        assert_eq!(
            layout.skill_projection(&alice),
            PathBuf::from("/srv/warren/skill-projections/alice")
        );
        assert!(!layout.is_split());
    }

    #[test]
    fn a_split_layout_puts_the_shared_trees_in_the_workspace_dir_and_the_rest_in_the_data_dir() {
        let layout = DataLayout::new("/var/lib/warren").with_workspace_dir("/mnt/shared/warren");
        let alice = Uid::new("alice").unwrap().safe();
        assert!(layout.is_split());
        let sandbox = SandboxId::derive(
            &Uid::new("alice").unwrap(),
            &crate::RuntimeScope::new("s").unwrap(),
        );
        // An ephemeral sandbox's scratch tree is shared: any node may run its runtime.
        for shared in [
            layout.user_workspace(&alice),
            layout.skill_projection(&alice),
            layout.local_snapshots(&alice),
            layout.scratch(&sandbox),
        ] {
            assert!(shared.starts_with("/mnt/shared/warren"), "{shared:?}");
        }
        for local in [layout.state_db(), layout.token_file()] {
            assert!(local.starts_with("/var/lib/warren"), "{local:?}");
        }
    }
}
