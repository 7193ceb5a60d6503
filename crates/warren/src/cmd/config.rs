//! `warren.toml`: the file form of `warren serve`'s settings, as structs serde checks
//! whole at start-up (syntax, unknown keys and wrong types stop warren, naming the line).
//! The single-valued settings are read by key through `crate::settings`, which holds their
//! defaults, checks and documentation; the structured ones (tables of names, network
//! policies, `[kubernetes]`) are read from these structs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use warren_provisioner::{QuotaEnforcement, QuotaSettings};

/// The whole file. Unknown keys are errors: a typo must not silently fall back to a default.
/// Fields read only through `crate::settings` (by key) are the schema serde checks.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct ConfigFile {
    /// The file as parsed, for `crate::settings` to read keys from.
    #[serde(skip)]
    raw: toml::Table,
    pub data_dir: Option<PathBuf>,
    /// The directory every replica shares (UserWorkspaces, projections, artifacts, local
    /// snapshots); default: the data directory.
    pub workspace_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub backend: Option<String>,
    /// The old name of `local.rootfs`.
    pub rootfs: Option<PathBuf>,
    /// The default backend's image (`local.image`, `docker.image` or `kubernetes.image`).
    pub image: Option<String>,
    #[serde(default)]
    pub local: LocalSection,
    /// The isolation tier of sandboxes that name none, `kernel` or `gvisor` (issue 19);
    /// an unknown name is refused with its line like any other bad value. Its old name
    /// `isolation` still works (both at once is refused as a duplicate).
    #[serde(alias = "isolation")]
    pub tier: Option<warren_core::IsolationTier>,
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub lifecycle: LifecycleSection,
    #[serde(default)]
    pub exec: ExecSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub snapshots: SnapshotsSection,
    #[serde(default)]
    pub init: InitSection,
    #[serde(default)]
    pub skills: SkillsSection,
    #[serde(default)]
    pub docker: DockerSection,
    #[serde(default)]
    pub quotas: QuotasSection,
    #[serde(default)]
    pub state: StateSection,
    #[serde(default)]
    pub network: NetworkSection,
    #[serde(default)]
    pub deerflow: DeerflowSection,
    #[serde(default)]
    pub e2b: E2bSection,
    #[serde(default)]
    pub cluster: ClusterSection,
    /// The Kubernetes backend's cluster (issue 15): `warren k8s manifests` writes it.
    #[serde(default)]
    pub kubernetes: Option<warren_kubernetes::KubernetesSettings>,
    /// `text` (default) or `json`: one JSON object per log line.
    pub log_format: Option<String>,
    /// Environment every command of a sandbox that inherits it gets (I14); the uid's agent
    /// environment and the call's own env go over it.
    #[serde(default)]
    pub sandbox_env: BTreeMap<String, String>,
    /// Like `sandbox_env`, and the values are masked in command output.
    #[serde(default)]
    pub sandbox_secrets: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct LifecycleSection {
    pub idle_timeout_s: Option<u64>,
    pub max_lifetime_s: Option<u64>,
    pub reap_interval_s: Option<u64>,
    /// Sandboxes the reaper works on at once.
    pub reap_concurrency: Option<usize>,
    /// Seconds the reaper spends on one sandbox's snapshot before reaping without it.
    pub reap_deadline_s: Option<u64>,
    /// Seconds a stopping server waits for requests in flight before it exits anyway.
    pub shutdown_grace_s: Option<u64>,
}

/// `[cluster]`: this node's identity among the replicas sharing a state store (issue 14).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct ClusterSection {
    /// Unique among the replicas [default: the host name].
    pub node_id: Option<String>,
    /// The internal URL other replicas reach this node at [default: the listen address].
    pub advertise: Option<String>,
    /// Seconds a node's lease lasts unless renewed (every third of it) [default: 15].
    pub node_ttl_s: Option<u64>,
    /// A file holding the cluster key the replicas authenticate each other with; setting
    /// it is what runs this node as one replica of several (PostgreSQL state only).
    pub key_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct ExecSection {
    pub default_timeout_s: Option<u64>,
    pub max_timeout_s: Option<u64>,
    pub output_cap_bytes: Option<usize>,
}

/// DeerFlow's provisioner and AIO sandbox APIs under `/deerflow` (issue 16): off unless
/// an API key is set here or in `WARREN_DEERFLOW_API_KEY` (which wins).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct DeerflowSection {
    /// The key DeerFlow sends as `X-API-Key` (its `provisioner_api_key`): at least 32
    /// characters, never the provisioner token.
    pub api_key: Option<String>,
    /// What sandbox URLs start with (`http(s)://host[:port][/prefix]`) [default: `http://`
    /// and the `Host` DeerFlow called].
    pub sandbox_base_url: Option<String>,
    /// Container paths DeerFlow's `extra_mounts` may target [default: none].
    #[serde(default)]
    pub extra_mount_paths: Vec<String>,
    /// Host directories the sources of `extra_mounts` must lie under [default: none].
    #[serde(default)]
    pub extra_mount_roots: Vec<PathBuf>,
    /// Where DeerFlow's sandboxes may connect: `{ mode = "open" }` or `{ mode =
    /// "allowlist", allow = [...] }` [default: `[network] default`].
    pub network: Option<warren_core::NetworkPolicy>,
}

impl DeerflowSection {
    /// The validated configuration, or `None` when no key enables DeerFlow's APIs. The key
    /// must not be the provisioner token (I13) nor appear in a value bound for sandboxes.
    /// `api_key` is the resolved `deerflow.api_key` and where it came from.
    pub fn config(
        &self,
        api_key: Option<&(String, String)>,
        token: &warren_api::ProvisionerToken,
        sandbox_values: &[&String],
    ) -> anyhow::Result<Option<warren_deerflow::DeerflowConfig>> {
        let Some((key, origin)) = api_key else {
            return Ok(None);
        };
        let key = key.trim();
        let api_key =
            warren_deerflow::ApiKey::new(key).with_context(|| format!("{origin} is not usable"))?;
        if token.matches(key) {
            return Err(warren_deerflow::DeerflowError::KeyIsProvisionerToken)
                .with_context(|| format!("{origin} is not usable"));
        }
        if sandbox_values.iter().any(|value| value.contains(key)) {
            bail!("{origin}: the DeerFlow API key appears in sandbox_env or sandbox_secrets, which every sandbox gets; it must never enter one");
        }
        let mut config = warren_deerflow::DeerflowConfig::new(api_key);
        if let Some(url) = &self.sandbox_base_url {
            config = config.with_sandbox_base_url(url)?;
        }
        if let Some(network) = &self.network {
            config = config.with_network(network.clone())?;
        }
        Ok(Some(config.with_extra_mounts(
            self.extra_mount_paths.clone(),
            self.extra_mount_roots.clone(),
        )?))
    }
}

/// The network policy sandboxes get when their request names none (I23).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// `{ mode = "none" }` (loopback only), `{ mode = "open" }` or `{ mode = "allowlist",
    /// allow = [...] }` [default: `{ mode = "none" }`].
    pub default: Option<warren_core::NetworkPolicy>,
    /// A PEM file of roots the egress proxy trusts, beside the host's own, when it checks
    /// a destination an egress secret is bound to (issue 38).
    pub upstream_ca: Option<std::path::PathBuf>,
    /// Sources of short-lived egress secrets, by name: `{ command = [...], timeout_s = 10 }`
    /// (issue 38).
    #[serde(default)]
    pub secret_sources: std::collections::BTreeMap<String, warren_provisioner::SecretSource>,
}

impl NetworkSection {
    /// The validated default policy.
    pub fn default_policy(&self) -> anyhow::Result<warren_core::NetworkPolicy> {
        self.default
            .clone()
            .unwrap_or(warren_core::NetworkPolicy::None)
            .validate()
            .map_err(|error| anyhow::anyhow!("network.default: {error}"))
    }
}

/// E2B's API on a listener of its own (issue 17): off unless `listen` (or `--e2b-listen`)
/// is set.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct E2bSection {
    /// Where the E2B control plane and every sandbox's envd listen.
    pub listen: Option<std::net::SocketAddr>,
    /// API keys (`e2b_` and at least 32 hex digits) and the uid each acts for. More keys
    /// come from `warren e2b key create`, kept in the state store as digests.
    #[serde(default)]
    pub keys: BTreeMap<String, String>,
    /// Templates beside `base` (the server's default runtime) and what each starts.
    #[serde(default)]
    pub templates: BTreeMap<String, warren_e2b::TemplateTarget>,
    /// The domain of host-name routing: envd at `49983-<sandboxID>.<domain>`.
    pub domain: Option<String>,
    /// Where sandboxes allowed internet access may connect [default: `{ mode = "open" }`,
    /// public destinations through warren's filtering proxy].
    pub internet: Option<warren_core::NetworkPolicy>,
    /// The timeout of a sandbox created without one; old name `default_timeout_s`.
    #[serde(alias = "default_timeout_s")]
    pub sandbox_timeout_s: Option<u64>,
    /// The longest timeout a sandbox may ask for; old name `max_timeout_s`.
    #[serde(alias = "max_timeout_s")]
    pub max_sandbox_timeout_s: Option<u64>,
    /// The PEM certificate chain the E2B listener serves TLS with (the server's certificate
    /// first; for `api.<domain>` and `*.<domain>`). With `tls_key`; without both, plain HTTP.
    pub tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of `tls_cert`.
    pub tls_key: Option<std::path::PathBuf>,
}

impl E2bSection {
    /// The listener's TLS, read and checked now (so a bad file stops the server before it
    /// touches anything): `tls_cert` and `tls_key` both, or neither for plain HTTP.
    pub fn tls(&self) -> anyhow::Result<Option<warren_e2b::TlsConfig>> {
        match (&self.tls_cert, &self.tls_key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(
                warren_e2b::TlsConfig::from_pem_files(cert, key)
                    .context("e2b.tls_cert, e2b.tls_key")?,
            )),
            (Some(_), None) => bail!("e2b.tls_cert is set without e2b.tls_key: TLS needs both"),
            (None, Some(_)) => bail!("e2b.tls_key is set without e2b.tls_cert: TLS needs both"),
        }
    }

    /// The validated configuration. No key may be the provisioner token (I13).
    /// `timeouts`: the resolved default and longest sandbox timeouts.
    pub fn config(
        &self,
        token: &warren_api::ProvisionerToken,
        (default, max): (Duration, Duration),
    ) -> anyhow::Result<warren_e2b::E2bConfig> {
        let mut keys = Vec::new();
        for (key, uid) in &self.keys {
            let api_key = warren_e2b::ApiKey::parse(key)
                .with_context(|| "e2b.keys: a key is not usable".to_string())?;
            if token.matches(key) {
                bail!(
                    "e2b.keys: a key is the provisioner token; give E2B clients keys of their own"
                );
            }
            let uid = warren_core::Uid::new(uid.clone())
                .with_context(|| format!("e2b.keys: {uid:?} is not a usable uid"))?;
            keys.push((api_key, uid));
        }
        let mut config = warren_e2b::E2bConfig::new(keys).with_templates(self.templates.clone())?;
        if let Some(domain) = &self.domain {
            config = config.with_domain(domain)?;
        }
        if let Some(internet) = &self.internet {
            config = config.with_internet(internet.clone())?;
        }
        Ok(config.with_timeouts(default, max)?)
    }
}

/// The local backend: its runtimes' root filesystem.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct LocalSection {
    /// A root filesystem directory.
    pub rootfs: Option<PathBuf>,
    /// An image imported with `warren image import`.
    pub image: Option<String>,
}

/// The Docker backend (I18): `backend = "docker"` makes it the default; `enabled = true`
/// offers it next to the local backend, for sandboxes that ask for `"backend":"docker"`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct DockerSection {
    pub enabled: Option<bool>,
    /// The image of sandboxes that name none.
    pub image: Option<String>,
    /// The engine's Unix socket [default: /var/run/docker.sock].
    pub socket: Option<String>,
}

/// The operator's skill directories (I32), each holding one directory per skill.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillsSection {
    /// Skills every uid gets, shipped with the deployment.
    pub builtin_dir: Option<PathBuf>,
    /// Skills every uid gets, maintained by the operator.
    pub shared_dir: Option<PathBuf>,
    /// Skills a uid gets when granted (`PUT /v1/users/{uid}/skills/{name}`).
    pub catalog_dir: Option<PathBuf>,
}

/// Sources a workdir may be initialised from (I32).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitSection {
    /// Host directories by name: `POST /v1/users/{uid}/workdirs` with
    /// `{"init":{"host_dir":"<name>"}}` copies one into a new workdir.
    #[serde(default)]
    pub host_dirs: BTreeMap<String, PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct SnapshotsSection {
    pub keep_checkpoints: Option<usize>,
    pub gc_grace_s: Option<u64>,
    /// Most bytes of file data one snapshot or checkpoint reads (holes not counted).
    pub max_bytes: Option<u64>,
    /// Snapshot a runtime before the reaper reclaims it (default true).
    pub before_reap: Option<bool>,
    /// Start a reaped sandbox's next runtime from its latest snapshot (default true).
    pub resume: Option<bool>,
    /// `local` (default), `s3`, `sql` (rows of the state store) or `redis`.
    pub store: Option<String>,
    pub s3: Option<S3Section>,
    pub redis: Option<RedisSection>,
}

/// A Redis snapshot store; `WARREN_REDIS_URL` wins over the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct RedisSection {
    pub url: Option<String>,
}

/// An S3-compatible snapshot store. The keys may also come from `WARREN_S3_ACCESS_KEY_ID`
/// and `WARREN_S3_SECRET_ACCESS_KEY`, which win over the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct S3Section {
    pub endpoint: Option<String>,
    pub bucket: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

/// Where the state store lives: SQLite in the data directory unless a URL says otherwise.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct StateSection {
    /// `postgres://user:password@host:port/database`, or `sqlite:<path>`.
    pub url: Option<String>,
    /// PostgreSQL: connections warren's pool may hold [default: 16].
    pub max_connections: Option<u32>,
}

/// Which state store `warren serve` opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChoice {
    /// A SQLite file (default: `<data-dir>/state.db`).
    Sqlite(Option<PathBuf>),
    /// A PostgreSQL database, by URL.
    Postgres(String),
}

impl StateChoice {
    /// Parses `--state`/`WARREN_STATE`/`[state] url`.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres(url.to_owned()))
        } else if let Some(path) = url.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                bail!(
                    "state url {url:?}: name the SQLite file, e.g. sqlite:/var/lib/warren/state.db"
                );
            }
            Ok(Self::Sqlite(Some(PathBuf::from(path))))
        } else {
            bail!(
                "state url {:?}: use postgres://user:password@host:port/database or \
                 sqlite:<path> (or leave it out for <data-dir>/state.db)",
                redact_password(url)
            )
        }
    }

    /// What to log: the URL with any password replaced.
    pub fn describe(&self) -> String {
        match self {
            Self::Sqlite(None) => "sqlite (data directory)".to_owned(),
            Self::Sqlite(Some(path)) => format!("sqlite:{}", path.display()),
            Self::Postgres(url) => redact_password(url),
        }
    }
}

/// `scheme://user:password@host/...` with the password replaced by `***`.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Storage quotas on UserWorkspaces (I23): bytes and inodes per uid, enforced by the kernel
/// (a filesystem per uid). No `bytes` anywhere: no quotas.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotasSection {
    /// Every uid's workspace size in bytes (metadata included).
    pub bytes: Option<u64>,
    /// Every uid's inode limit; absent: one inode per 16 KiB.
    pub inodes: Option<u64>,
    /// Serve even where this host cannot enforce the quotas (reported, not enforced);
    /// otherwise warren refuses to start.
    #[serde(default)]
    pub unenforced: bool,
    /// Per-uid overrides; an absent key falls back to the value above.
    #[serde(default)]
    pub users: BTreeMap<String, UserQuota>,
}

/// One uid's quota override.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserQuota {
    pub bytes: Option<u64>,
    pub inodes: Option<u64>,
}

impl QuotasSection {
    /// The quota settings, with the enforcement chosen from what the host supports
    /// (`unsupported`: why it cannot make per-uid volumes, if it cannot).
    pub fn settings(
        &self,
        unsupported: impl FnOnce() -> Option<String>,
    ) -> anyhow::Result<QuotaSettings> {
        use warren_provisioner::{QuotaLimits, MIN_QUOTA_BYTES, MIN_QUOTA_INODES};
        let limits =
            |key: &str, bytes: Option<u64>, inodes: Option<u64>| -> anyhow::Result<QuotaLimits> {
                let Some(bytes) = bytes else {
                    bail!("{key}.bytes is missing: a quota needs a size");
                };
                if bytes < MIN_QUOTA_BYTES {
                    bail!("{key}.bytes must be at least {MIN_QUOTA_BYTES} (16 MiB)");
                }
                if inodes.is_some_and(|n| n < MIN_QUOTA_INODES) {
                    bail!("{key}.inodes must be at least {MIN_QUOTA_INODES}");
                }
                Ok(QuotaLimits { bytes, inodes })
            };
        let default = match (self.bytes, self.inodes) {
            (None, None) => None,
            (bytes, inodes) => Some(limits("quotas", bytes, inodes)?),
        };
        let mut users = BTreeMap::new();
        for (name, quota) in &self.users {
            let uid = warren_core::Uid::new(name.as_str())
                .map_err(|error| anyhow::anyhow!("quotas.users.{name}: {error}"))?;
            let key = format!("quotas.users.{name}");
            let user = limits(
                &key,
                quota.bytes.or(self.bytes),
                quota.inodes.or(self.inodes),
            )?;
            users.insert(uid, user);
        }
        let enforcement = if default.is_none() && users.is_empty() {
            QuotaEnforcement::Off
        } else {
            match unsupported() {
                None => QuotaEnforcement::Volumes,
                Some(_) if self.unenforced => QuotaEnforcement::Unenforced,
                Some(reason) => bail!(
                    "storage quotas are configured but this host cannot enforce them: {reason}; \
                     fix that, or set [quotas] unenforced = true to serve without enforcing them"
                ),
            }
        };
        Ok(QuotaSettings {
            enforcement,
            default,
            users,
        })
    }
}

/// Per-runtime limits; absent keys keep the defaults of `RuntimeLimits`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "single-valued settings are read by key through crate::settings"
)]
pub struct LimitsSection {
    pub memory_bytes: Option<u64>,
    pub pids_max: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub cow_bytes: Option<u64>,
    pub home_bytes: Option<u64>,
    pub tmp_bytes: Option<u64>,
    pub shm_bytes: Option<u64>,
    pub nofile: Option<u64>,
}

impl ConfigFile {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
        Self::parse(&text).with_context(|| {
            format!(
                "{} is not a valid warren configuration (warren.example.toml documents every key)",
                path.display()
            )
        })
    }

    fn parse(text: &str) -> anyhow::Result<Self> {
        let raw: toml::Table = toml::from_str(text).map_err(|error| anyhow::anyhow!("{error}"))?;
        crate::settings::check_renames(&raw)?;
        let mut file: Self = toml::from_str(text).map_err(|error| anyhow::anyhow!("{error}"))?;
        file.raw = raw;
        for (section, vars, secret) in [
            ("sandbox_env", &file.sandbox_env, false),
            ("sandbox_secrets", &file.sandbox_secrets, true),
        ] {
            for (name, value) in vars {
                warren_core::AgentEnvVar::new(name.as_str(), value.as_str(), secret)
                    .map_err(|error| anyhow::anyhow!("{section}: {error}"))?;
            }
        }
        if let Some(name) = file
            .sandbox_env
            .keys()
            .find(|name| file.sandbox_secrets.contains_key(*name))
        {
            bail!("{name:?} is in both sandbox_env and sandbox_secrets; keep it in one");
        }
        Ok(file)
    }

    /// The file as parsed, every key by name.
    pub fn table(&self) -> &toml::Table {
        &self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_url_names_postgres_or_a_sqlite_file() {
        assert_eq!(
            StateChoice::parse("postgres://warren:pw@db:5432/warren").unwrap(),
            StateChoice::Postgres("postgres://warren:pw@db:5432/warren".to_owned())
        );
        assert!(matches!(
            StateChoice::parse("postgresql://db/warren").unwrap(),
            StateChoice::Postgres(_)
        ));
        assert_eq!(
            StateChoice::parse("sqlite:/srv/state.db").unwrap(),
            StateChoice::Sqlite(Some(PathBuf::from("/srv/state.db")))
        );
        assert_eq!(
            StateChoice::parse("sqlite:///srv/state.db").unwrap(),
            StateChoice::Sqlite(Some(PathBuf::from("/srv/state.db")))
        );
    }

    #[test]
    fn an_unknown_state_url_is_refused_without_echoing_its_password() {
        let err = StateChoice::parse("mysql://root:hunter2@db/warren")
            .unwrap_err()
            .to_string();
        assert!(err.contains("postgres://"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("root:***@db"), "{err}");
        assert!(StateChoice::parse("sqlite:").is_err());
    }

    #[test]
    fn a_logged_postgres_url_hides_its_password() {
        let choice = StateChoice::Postgres("postgres://warren:s3cret@db:5432/w".to_owned());
        assert_eq!(choice.describe(), "postgres://warren:***@db:5432/w");
        let choice = StateChoice::Postgres("postgres://db/w".to_owned());
        assert_eq!(choice.describe(), "postgres://db/w");
    }

    #[test]
    fn a_documented_file_parses() {
        let file = ConfigFile::parse(
            r#"
            data_dir = "/srv/warren"
            listen = "127.0.0.1:9000"
            backend = "local"
            image = "python-3.11"
            [lifecycle]
            idle_timeout_s = 60
            [exec]
            max_timeout_s = 600
            [limits]
            memory_bytes = 1073741824
            [sandbox_env]
            PIP_INDEX_URL = "https://mirror.example/simple"
            "#,
        )
        .unwrap();
        assert_eq!(file.lifecycle.idle_timeout_s, Some(60));
        assert_eq!(
            file.table()["limits"]["memory_bytes"].as_integer(),
            Some(1 << 30)
        );
        assert_eq!(
            file.sandbox_env["PIP_INDEX_URL"],
            "https://mirror.example/simple"
        );
    }

    #[test]
    fn the_example_in_the_repository_parses() {
        ConfigFile::parse(include_str!("../../../../warren.example.toml")).unwrap();
    }

    #[test]
    fn the_default_isolation_tier_is_kernel_or_gvisor_and_nothing_else() {
        assert_eq!(ConfigFile::parse("").unwrap().tier, None);
        for key in ["tier", "isolation"] {
            assert_eq!(
                ConfigFile::parse(&format!("{key} = \"gvisor\"\n"))
                    .unwrap()
                    .tier,
                Some(warren_core::IsolationTier::Gvisor)
            );
        }
        let both = ConfigFile::parse("tier = \"gvisor\"\nisolation = \"kernel\"\n").unwrap_err();
        assert!(
            format!("{both:#}")
                .contains("tier and isolation in the configuration are the same setting"),
            "{both:#}"
        );
        let error = ConfigFile::parse("tier = \"runsc\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("line 1") && error.contains("kernel") && error.contains("gvisor"),
            "{error}"
        );
    }

    #[test]
    fn quotas_are_off_without_a_size_and_refused_where_unenforceable_unless_accepted() {
        let none = ConfigFile::parse("").unwrap();
        let off = none
            .quotas
            .settings(|| panic!("no probe without quotas"))
            .unwrap();
        assert_eq!(off.enforcement, QuotaEnforcement::Off);

        let file = ConfigFile::parse(
            r#"
            [quotas]
            bytes = 1073741824
            inodes = 100000
            [quotas.users.alice]
            bytes = 67108864
            "#,
        )
        .unwrap();
        let settings = file.quotas.settings(|| None).unwrap();
        assert_eq!(settings.enforcement, QuotaEnforcement::Volumes);
        let alice = settings
            .limits_of(&warren_core::Uid::plain("alice").unwrap())
            .unwrap();
        assert_eq!((alice.bytes, alice.inodes), (64 << 20, Some(100_000)));
        let error = file
            .quotas
            .settings(|| Some("no loop devices".into()))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("no loop devices") && error.contains("unenforced = true"),
            "{error}"
        );

        let accepted = ConfigFile::parse("[quotas]\nbytes = 67108864\nunenforced = true").unwrap();
        let settings = accepted.quotas.settings(|| Some("no root".into())).unwrap();
        assert_eq!(settings.enforcement, QuotaEnforcement::Unenforced);

        for (text, expected) in [
            ("[quotas]\nbytes = 1024", "at least"),
            ("[quotas]\ninodes = 1000", "bytes is missing"),
            (
                "[quotas]\nbytes = 67108864\ninodes = 3",
                "inodes must be at least",
            ),
            ("[quotas.users.\"\"]\nbytes = 67108864", "quotas.users.: "),
        ] {
            let file = ConfigFile::parse(text).unwrap();
            let error = file.quotas.settings(|| None).unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn a_misspelt_key_is_refused_with_its_line() {
        let error = ConfigFile::parse("[lifecycle]\nidle_timeot_s = 5\n").unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("idle_timeot_s"), "{message}");
        assert!(message.contains("line 2"), "{message}");
    }

    #[test]
    fn wrong_types_and_bad_env_names_are_refused() {
        assert!(ConfigFile::parse("listen = 7878\n").is_err());
        assert!(ConfigFile::parse("[sandbox_env]\n\"A=B\" = \"x\"\n").is_err());
    }

    #[test]
    fn secrets_must_be_long_enough_to_mask_and_live_in_one_table() {
        let short = ConfigFile::parse("[sandbox_secrets]\nPIN = \"1234\"\n").unwrap_err();
        assert!(
            format!("{short:#}").contains("sandbox_secrets"),
            "{short:#}"
        );
        let both = ConfigFile::parse(
            "[sandbox_env]\nKEY = \"abcdefgh\"\n[sandbox_secrets]\nKEY = \"abcdefgh\"\n",
        )
        .unwrap_err();
        assert!(format!("{both:#}").contains("both"), "{both:#}");
        let fine = ConfigFile::parse("[sandbox_secrets]\nHF_TOKEN = \"hf_0123456789\"\n").unwrap();
        assert_eq!(fine.sandbox_secrets["HF_TOKEN"], "hf_0123456789");
    }
}
