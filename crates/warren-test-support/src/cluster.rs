//! The files the replicas of one warren cluster share.

use std::path::PathBuf;

/// The files replicas of one cluster share: a cluster key and a `warren.toml` naming it
/// with a node lease of `ttl_s` (flags cannot set the TTL).
pub struct ClusterFiles {
    _dir: tempfile::TempDir,
    /// The `warren.toml` to give each replica with `--config`.
    pub config: PathBuf,
}

impl ClusterFiles {
    /// Writes `key` and the configuration into a temporary directory.
    pub fn new(key: &str, ttl_s: u64) -> Self {
        let dir = tempfile::tempdir().expect("a temporary dir for the cluster's files");
        let key_file = dir.path().join("cluster.key");
        std::fs::write(&key_file, key).expect("write the cluster key");
        let config = dir.path().join("warren.toml");
        std::fs::write(
            &config,
            format!("[cluster]\nnode_ttl_s = {ttl_s}\nkey_file = {key_file:?}\n"),
        )
        .expect("write the cluster's warren.toml");
        Self { _dir: dir, config }
    }

    /// Adds `toml` (whole tables) to the configuration.
    pub fn add_config(&self, toml: &str) {
        let mut config = std::fs::read_to_string(&self.config).expect("read warren.toml");
        config.push_str(toml);
        std::fs::write(&self.config, config).expect("write warren.toml");
    }

    /// The configuration's path, as a flag value.
    pub fn config_arg(&self) -> &str {
        self.config.to_str().expect("a UTF-8 temporary path")
    }
}
