//! What the backend keeps of each runtime in its state directory: the runtime's
//! environment (0600, never in the pod's spec) and a snapshot's received home.

use std::collections::BTreeMap;
use std::path::PathBuf;

use warren_backend::RuntimeSpec;
use warren_core::SandboxId;

use super::KubernetesBackend;

impl KubernetesBackend {
    /// Where a snapshot of the runtime's home is received.
    pub(super) fn snapshot_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.state_dir.join(format!("{sandbox}.home"))
    }

    pub(super) fn env_path(&self, sandbox: &SandboxId) -> PathBuf {
        self.config.state_dir.join(format!("{sandbox}.json"))
    }

    pub(super) fn save_env(&self, spec: &RuntimeSpec) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.env_path(&spec.sandbox);
        let staging = path.with_extension("json.new");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&staging)?;
        file.write_all(&serde_json::to_vec(&spec.env).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(staging, path)
    }

    pub(super) fn load_env(&self, sandbox: &SandboxId) -> Option<BTreeMap<String, String>> {
        let bytes = std::fs::read(self.env_path(sandbox)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}
