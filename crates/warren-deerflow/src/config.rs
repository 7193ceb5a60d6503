//! What the operator configures: the API key DeerFlow authenticates with, where sandbox
//! URLs point, and which extra mounts DeerFlow may ask for.

use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::DeerflowError;

/// The key DeerFlow sends as `X-API-Key` (its `provisioner_api_key`): at least 32
/// characters, never the provisioner token (checked where both are known). Its `Debug`
/// form is redacted; only its digest is kept.
pub struct ApiKey {
    digest: [u8; 32],
}

impl ApiKey {
    /// Shortest key accepted.
    pub const MIN_LEN: usize = 32;

    /// Validates a key.
    pub fn new(key: &str) -> Result<Self, DeerflowError> {
        let len = key.chars().count();
        if len < Self::MIN_LEN {
            return Err(DeerflowError::KeyTooShort { len });
        }
        if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(DeerflowError::KeyBadCharacters);
        }
        Ok(Self {
            digest: Sha256::digest(key.as_bytes()).into(),
        })
    }

    /// Whether `presented` is this key. Both sides are hashed first, so the comparison
    /// takes the same time whatever the presented length or content.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented).into();
        self.digest.ct_eq(&presented).into()
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// The `[deerflow]` section of `warren.toml`, validated.
#[derive(Debug)]
pub struct DeerflowConfig {
    pub(crate) api_key: ApiKey,
    /// Scheme, host and port (and optionally a path) sandbox URLs start with; `None`
    /// takes `http://` and the `Host` of the create request.
    pub(crate) sandbox_base_url: Option<String>,
    /// Container paths an extra mount may be asked for at.
    pub(crate) extra_mount_paths: Vec<String>,
    /// Host directories an extra mount's source must lie under.
    pub(crate) extra_mount_roots: Vec<PathBuf>,
    /// Where the runtimes of DeerFlow's sandboxes may connect (I23); DeerFlow's requests
    /// carry no policy, so the operator sets one for all of them.
    pub(crate) network: Option<warren_core::NetworkPolicy>,
}

impl DeerflowConfig {
    /// The DeerFlow APIs guarded by `api_key`, with no base URL and no extra mounts.
    pub fn new(api_key: ApiKey) -> Self {
        Self {
            api_key,
            sandbox_base_url: None,
            extra_mount_paths: Vec::new(),
            extra_mount_roots: Vec::new(),
            network: None,
        }
    }

    /// The network policy of every sandbox DeerFlow creates (default: the server's). It
    /// is part of each sandbox's binding: a live sandbox keeps the policy it was made with
    /// until it is deleted.
    pub fn with_network(
        mut self,
        network: warren_core::NetworkPolicy,
    ) -> Result<Self, DeerflowError> {
        self.network = Some(network.validate().map_err(DeerflowError::InvalidNetwork)?);
        Ok(self)
    }

    /// Sandbox URLs start with `url` (`http(s)://host[:port][/prefix]`) instead of the
    /// create request's `Host`: for servers behind a proxy or TLS terminator.
    pub fn with_sandbox_base_url(mut self, url: &str) -> Result<Self, DeerflowError> {
        let trimmed = url.trim_end_matches('/');
        let rest = trimmed
            .strip_prefix("http://")
            .or_else(|| trimmed.strip_prefix("https://"));
        let valid = rest.is_some_and(|rest| {
            !rest.is_empty()
                && !rest.starts_with('/')
                && !rest.contains(['?', '#', ' '])
                && !rest.chars().any(char::is_control)
        });
        if !valid {
            return Err(DeerflowError::InvalidBaseUrl {
                url: url.chars().take(100).collect(),
            });
        }
        self.sandbox_base_url = Some(trimmed.to_owned());
        Ok(self)
    }

    /// The container paths extra mounts may target and the host directories their sources
    /// must lie under; both must be absolute paths without `.` or `..`.
    pub fn with_extra_mounts(
        mut self,
        paths: Vec<String>,
        roots: Vec<PathBuf>,
    ) -> Result<Self, DeerflowError> {
        for path in &paths {
            if !is_plain_absolute(Path::new(path)) || path.ends_with('/') && path != "/" {
                return Err(DeerflowError::InvalidMountSetting {
                    setting: "extra_mount_paths",
                    path: path.chars().take(100).collect(),
                });
            }
        }
        for root in &roots {
            if !is_plain_absolute(root) {
                return Err(DeerflowError::InvalidMountSetting {
                    setting: "extra_mount_roots",
                    path: root.display().to_string().chars().take(100).collect(),
                });
            }
        }
        // Where DeerFlow's sandboxes may show them: under /mnt, beside the layout's own
        // mounts (a read-only one may take the place of /mnt/skills/custom).
        for path in &paths {
            warren_core::ExtraMount::check_target(path, false, &warren_core::Layout::DEERFLOW)
                .map_err(DeerflowError::InvalidMountPath)?;
        }
        self.extra_mount_paths = paths;
        self.extra_mount_roots = roots;
        Ok(self)
    }
}

#[cfg(test)]
mod network_tests {
    use super::*;

    #[test]
    fn an_empty_allowlist_is_refused_naming_the_setting() {
        let key = ApiKey::new(&"k".repeat(32)).unwrap();
        let err = DeerflowConfig::new(key)
            .with_network(warren_core::NetworkPolicy::Allowlist {
                allow: vec![],
                deny: vec![],
            })
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("[deerflow] network"), "{err}");
    }
}

/// Absolute, and only normal components after the root (no `.`, no `..`, no `//`).
pub(crate) fn is_plain_absolute(path: &Path) -> bool {
    let text = path.to_string_lossy();
    let mut components = path.components();
    components.next() == Some(Component::RootDir)
        && components.all(|c| matches!(c, Component::Normal(_)))
        && !text.contains("//")
        && !text.split('/').any(|part| part == "." || part == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_or_spaced_key_is_refused_and_a_good_one_matches_only_itself() {
        assert_eq!(
            ApiKey::new("short").unwrap_err(),
            DeerflowError::KeyTooShort { len: 5 }
        );
        assert_eq!(
            ApiKey::new(&format!("{} ", "k".repeat(32))).unwrap_err(),
            DeerflowError::KeyBadCharacters
        );
        let key = ApiKey::new(&"k".repeat(32)).unwrap();
        assert!(key.matches("k".repeat(32).as_bytes()));
        assert!(!key.matches("k".repeat(33).as_bytes()));
        assert!(!key.matches(b""));
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
    }

    #[test]
    fn a_base_url_must_be_http_without_query_and_loses_its_trailing_slash() {
        let config = || DeerflowConfig::new(ApiKey::new(&"k".repeat(32)).unwrap());
        let good = config()
            .with_sandbox_base_url("https://warren.internal:8443/")
            .unwrap();
        assert_eq!(
            good.sandbox_base_url.as_deref(),
            Some("https://warren.internal:8443")
        );
        for bad in [
            "warren:8080",
            "ftp://x",
            "http://",
            "http://x/?a=b",
            "http:///x",
        ] {
            assert!(config().with_sandbox_base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mount_settings_must_be_plain_absolute_paths() {
        let config = || DeerflowConfig::new(ApiKey::new(&"k".repeat(32)).unwrap());
        assert!(config()
            .with_extra_mounts(
                vec!["/mnt/acp-workspace".into()],
                vec!["/srv/deer-flow".into()]
            )
            .is_ok());
        for bad in [
            "relative",
            "/mnt/../etc",
            "/mnt/./x",
            "/mnt//x",
            "/mnt/x/",
            "/etc/x",
            "/mnt/user-data/x",
            "/mnt/skills",
        ] {
            assert!(
                config()
                    .with_extra_mounts(vec![bad.into()], vec![])
                    .is_err(),
                "{bad}"
            );
        }
        assert!(config()
            .with_extra_mounts(vec![], vec!["/srv/../etc".into()])
            .is_err());
    }
}
