//! Where things live in the data directory. Pure path arithmetic; opening these paths safely
//! is `warren-fs`'s job.

use std::path::{Path, PathBuf};

use crate::{SafeUid, SandboxId};

/// The layout of warren's data directory.
///
/// ```text
/// <data>/user-data/shared/<safe_uid>/workspace   a uid's UserWorkspace (I3, I7)
/// <data>/volumes/<safe_uid>.ext4                 its filesystem, with storage quotas (I23)
/// <data>/skill-projections/<safe_uid>            a uid's read-only skill projection (I7)
/// <data>/artifacts/<safe_uid>/<sha256>           a uid's presented artifacts (I26)
/// <data>/scratch/<sandbox>/workspace             an ephemeral sandbox's stand-in workspace (I14)
/// <data>/scratch/<sandbox>/skills                its empty read-only skills mount
/// <data>/warren.db                               the SQLite state store
/// <data>/token                                   the generated provisioner token (0600)
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataLayout {
    data_dir: PathBuf,
}

impl DataLayout {
    /// A layout rooted at `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
        }
    }

    /// The data directory itself.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The UserWorkspace of `uid`, relative to the data directory.
    pub fn user_workspace_relative(uid: &SafeUid) -> String {
        format!("user-data/shared/{uid}/workspace")
    }

    /// The skill projection of `uid`, relative to the data directory.
    pub fn skill_projection_relative(uid: &SafeUid) -> String {
        format!("skill-projections/{uid}")
    }

    /// The UserWorkspace of `uid` on the host.
    pub fn user_workspace(&self, uid: &SafeUid) -> PathBuf {
        self.data_dir.join(Self::user_workspace_relative(uid))
    }

    /// The skill projection of `uid` on the host.
    pub fn skill_projection(&self, uid: &SafeUid) -> PathBuf {
        self.data_dir.join(Self::skill_projection_relative(uid))
    }

    /// A uid's artifact store, relative to the data directory: blobs named by SHA-256.
    pub fn artifacts_relative(uid: &SafeUid) -> String {
        format!("artifacts/{uid}")
    }

    /// Where ephemeral sandboxes keep their scratch trees, relative to the data directory.
    pub const SCRATCH_RELATIVE: &'static str = "scratch";

    /// The scratch tree of an ephemeral sandbox: it stands in for the uid's persistent
    /// mounts and is removed when the sandbox ends (I14).
    pub fn scratch(&self, sandbox: &SandboxId) -> PathBuf {
        self.data_dir
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
    }
}
