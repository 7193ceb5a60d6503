//! The resolved settings as the types `warren serve` uses, and the rules between settings
//! (a rootfs or an image, not both; `image` is the default backend's; a cluster needs a
//! shared state store; ...).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use warren_core::{BackendKind, IsolationTier};
use warren_isolation::config::RuntimeLimits;
use warren_provisioner::{ProvisionerConfig, SnapshotStoreConfig};

use super::resolve::{Origin, Resolved};
use crate::cmd::config::StateChoice;

/// `log_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    Local,
    Docker,
    Kubernetes,
    Memory,
}

impl BackendChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Docker => "docker",
            Self::Kubernetes => "kubernetes",
            Self::Memory => "memory",
        }
    }
}

/// Where the local backend's runtimes get their root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalRoot {
    /// The host's own system directories, read-only.
    Host,
    /// A directory (`local.rootfs`).
    Directory(PathBuf),
    /// An image imported with `warren image import` (`local.image`).
    Image(String),
}

/// What `warren serve` runs with: every single-valued setting, typed and checked together.
#[derive(Debug)]
pub struct ServeSettings {
    pub log_format: LogFormat,
    /// The tracing filter (`WARREN_LOG`).
    pub log_filter: String,
    pub backend: BackendChoice,
    /// The isolation tier of sandboxes that name none.
    pub tier: IsolationTier,
    /// The local backend's root filesystem: a directory, or an imported image.
    pub local_root: LocalRoot,
    /// The image of Docker sandboxes that name none.
    pub docker_image: Option<String>,
    /// The image of Kubernetes sandboxes that name none.
    pub kubernetes_image: Option<String>,
    pub docker_enabled: bool,
    pub docker_socket: Option<String>,
    pub listen: SocketAddr,
    pub data_dir: Option<PathBuf>,
    pub workspace_dir: Option<PathBuf>,
    pub e2b_listen: Option<SocketAddr>,
    pub token_file: Option<PathBuf>,
    /// `WARREN_TOKEN`.
    pub token: Option<String>,
    pub state: StateChoice,
    pub max_connections: u32,
    pub cluster_key_file: Option<PathBuf>,
    pub node_id: Option<String>,
    pub advertise: Option<String>,
    pub node_ttl: Duration,
    pub reap_interval: Duration,
    pub shutdown_grace: Duration,
    pub limits: RuntimeLimits,
    /// E2B sandboxes' default and longest lifetime.
    pub e2b_timeouts: (Duration, Duration),
    /// The DeerFlow API key and where it came from.
    pub deerflow_api_key: Option<(String, String)>,
    pub snapshot_store: SnapshotStoreConfig,
    provisioner: ProvisionerSettings,
}

/// The settings `ProvisionerConfig` holds.
#[derive(Debug)]
struct ProvisionerSettings {
    idle_timeout: Duration,
    max_lifetime: Duration,
    default_exec_timeout: Duration,
    max_exec_timeout: Duration,
    output_cap: usize,
    keep_checkpoints: usize,
    gc_grace: Duration,
    snapshot_max_bytes: u64,
    before_reap: bool,
    resume: bool,
    reap_concurrency: usize,
    reap_deadline: Duration,
}

impl ServeSettings {
    /// Types the resolved settings and checks the rules between them.
    pub fn new(r: &Resolved) -> anyhow::Result<Self> {
        let text = |key: &str| r.required(key, Resolved::text);
        let int = |key: &str| r.required(key, Resolved::integer);
        let secs = |key: &str| r.required(key, Resolved::duration);
        let usize_of = |key: &str| usize::try_from(int(key)).unwrap_or(usize::MAX);
        let log_format = match text("log_format").as_str() {
            "json" => LogFormat::Json,
            _ => LogFormat::Text,
        };
        let backend = match text("backend").as_str() {
            "docker" => BackendChoice::Docker,
            "kubernetes" => BackendChoice::Kubernetes,
            "memory" => BackendChoice::Memory,
            _ => BackendChoice::Local,
        };
        // The backend that isolates nothing is never a production option (I20): only a
        // build for warren's own tests has it, and any other refuses it before touching
        // anything.
        if backend == BackendChoice::Memory && !cfg!(feature = "memory-backend") {
            bail!(
                "the memory backend isolates nothing and is only in builds for warren's own tests \
                 (the `memory-backend` feature, I20); choose --backend local, docker or kubernetes"
            );
        }
        let tier = IsolationTier::parse(&text("tier")).expect("a choice of the table");
        let images = BackendImages::new(r, backend)?;
        // As before the table: the image given as a flag or variable offers Docker; in the
        // file it does not (`enabled = true` does), so an existing file keeps its meaning.
        let image_offers_docker = images.docker.is_some()
            && matches!(r.origin("docker.image"), Origin::Flag(_) | Origin::Env(_));
        let docker_enabled = backend == BackendChoice::Docker
            || r.required("docker.enabled", Resolved::boolean)
            || image_offers_docker;
        if images.local != LocalRoot::Host && backend != BackendChoice::Local {
            bail!(
                "{} is for the local backend, and the default backend is {} (its image is {}.image, \
                 or --image)",
                images.local_origin,
                backend.as_str(),
                backend.as_str()
            );
        }
        if backend == BackendChoice::Kubernetes && images.kubernetes.is_none() {
            bail!(
                "--backend kubernetes needs the image of sandboxes that name none: kubernetes.image \
                 in the configuration, or --image"
            );
        }
        let state = match r.text("state.url") {
            Some(url) => StateChoice::parse(&url)?,
            None => StateChoice::Sqlite(None),
        };
        let cluster_key_file = r.path("cluster.key_file");
        if cluster_key_file.is_some() && matches!(state, StateChoice::Sqlite(_)) {
            bail!(
                "a cluster key makes this node one replica of several, which needs a state store \
                 they share: give --state postgres://… (a SQLite file belongs to one server)"
            );
        }
        let provisioner = ProvisionerSettings {
            idle_timeout: secs("lifecycle.idle_timeout_s"),
            max_lifetime: secs("lifecycle.max_lifetime_s"),
            default_exec_timeout: secs("exec.default_timeout_s"),
            max_exec_timeout: secs("exec.max_timeout_s"),
            output_cap: usize_of("exec.output_cap_bytes"),
            keep_checkpoints: usize_of("snapshots.keep_checkpoints"),
            gc_grace: secs("snapshots.gc_grace_s"),
            snapshot_max_bytes: int("snapshots.max_bytes"),
            before_reap: r.required("snapshots.before_reap", Resolved::boolean),
            resume: r.required("snapshots.resume", Resolved::boolean),
            reap_concurrency: usize_of("lifecycle.reap_concurrency"),
            reap_deadline: secs("lifecycle.reap_deadline_s"),
        };
        if provisioner.default_exec_timeout > provisioner.max_exec_timeout {
            bail!("exec.default_timeout_s is above exec.max_timeout_s in the configuration");
        }
        let limits = RuntimeLimits {
            memory_bytes: Some(int("limits.memory_bytes")),
            pids_max: Some(int("limits.pids_max")),
            cpu_millis: Some(int("limits.cpu_millis")),
            cow_bytes: int("limits.cow_bytes"),
            home_bytes: int("limits.home_bytes"),
            tmp_bytes: int("limits.tmp_bytes"),
            shm_bytes: int("limits.shm_bytes"),
            nofile: int("limits.nofile"),
        };
        let deerflow_api_key = r.text("deerflow.api_key").map(|key| {
            (
                key,
                match r.origin("deerflow.api_key") {
                    Origin::Env(var) => (*var).to_owned(),
                    _ => "deerflow.api_key".to_owned(),
                },
            )
        });
        Ok(Self {
            log_format,
            log_filter: text("log"),
            backend,
            tier,
            local_root: images.local,
            docker_image: images.docker,
            kubernetes_image: images.kubernetes,
            docker_enabled,
            docker_socket: r.text("docker.socket"),
            listen: r.required("listen", Resolved::address),
            data_dir: r.path("data_dir"),
            workspace_dir: r.path("workspace_dir"),
            e2b_listen: r.address("e2b.listen"),
            token_file: r.path("token_file"),
            token: r.text("token"),
            state,
            max_connections: u32::try_from(int("state.max_connections")).unwrap_or(u32::MAX),
            cluster_key_file,
            node_id: r.text("cluster.node_id"),
            advertise: r.text("cluster.advertise"),
            node_ttl: secs("cluster.node_ttl_s"),
            reap_interval: secs("lifecycle.reap_interval_s"),
            shutdown_grace: secs("lifecycle.shutdown_grace_s"),
            limits,
            e2b_timeouts: (
                secs("e2b.sandbox_timeout_s"),
                secs("e2b.max_sandbox_timeout_s"),
            ),
            deerflow_api_key,
            snapshot_store: snapshot_store(r)?,
            provisioner,
        })
    }

    /// Sets the provisioner's settings of `config`.
    pub fn apply(&self, config: &mut ProvisionerConfig) {
        let p = &self.provisioner;
        config.idle_timeout = p.idle_timeout;
        config.max_lifetime = p.max_lifetime;
        config.default_exec_timeout = p.default_exec_timeout;
        config.max_exec_timeout = p.max_exec_timeout;
        config.output_cap = p.output_cap;
        config.keep_checkpoints = p.keep_checkpoints;
        config.gc_grace = p.gc_grace;
        config.snapshot_max_bytes = p.snapshot_max_bytes;
        config.snapshot_before_reap = p.before_reap;
        config.resume_from_snapshots = p.resume;
        config.reap_concurrency = p.reap_concurrency;
        config.reap_deadline = p.reap_deadline;
        config.default_isolation = self.tier;
        config.default_images = [
            (BackendKind::Docker, &self.docker_image),
            (BackendKind::Kubernetes, &self.kubernetes_image),
        ]
        .into_iter()
        .filter_map(|(kind, image)| Some((kind, image.clone()?)))
        .collect();
        config.snapshot_store = self.snapshot_store.clone();
    }
}

/// Each backend's image, `image` read as the default backend's.
struct BackendImages {
    local: LocalRoot,
    /// How an error names where `local` came from.
    local_origin: String,
    docker: Option<String>,
    kubernetes: Option<String>,
}

impl BackendImages {
    fn new(r: &Resolved, backend: BackendChoice) -> anyhow::Result<Self> {
        let mut local_image = r.text("local.image");
        let mut docker = r.text("docker.image");
        let mut kubernetes = r.text("kubernetes.image");
        if let Some(image) = r.text("image") {
            let (slot, key) = match backend {
                BackendChoice::Local => (&mut local_image, "local.image"),
                BackendChoice::Docker => (&mut docker, "docker.image"),
                BackendChoice::Kubernetes => (&mut kubernetes, "kubernetes.image"),
                BackendChoice::Memory => bail!(
                    "{} names an image, and the memory backend runs none",
                    r.origin("image").describe()
                ),
            };
            match slot {
                Some(other) if *other != image => bail!(
                    "{} ({image:?}) is the default backend's image, and {} names another \
                     ({other:?}) for the same {} backend; keep one",
                    r.origin("image").describe(),
                    r.origin(key).describe(),
                    backend.as_str()
                ),
                _ => *slot = Some(image),
            }
        }
        let (local, local_origin) = match (r.path("local.rootfs"), local_image) {
            (Some(_), Some(_)) => bail!(
                "both a root filesystem directory ({}) and an image for the local backend are \
                 set (local.image, or image with the local backend); keep one",
                r.origin("local.rootfs").describe()
            ),
            (Some(dir), None) => (
                LocalRoot::Directory(dir),
                r.origin("local.rootfs").describe(),
            ),
            (None, Some(name)) => {
                let origin = match r.origin("local.image") {
                    Origin::Default => r.origin("image"),
                    origin => origin,
                };
                (LocalRoot::Image(name), origin.describe())
            }
            (None, None) => (LocalRoot::Host, String::new()),
        };
        Ok(Self {
            local,
            local_origin,
            docker,
            kubernetes,
        })
    }
}

/// The snapshot store `snapshots.store` names, with the settings it needs.
fn snapshot_store(r: &Resolved) -> anyhow::Result<SnapshotStoreConfig> {
    let required = |key: &str, store: &str| -> anyhow::Result<String> {
        r.text(key)
            .filter(|value| !value.is_empty())
            .ok_or_else(|| {
                let env = super::setting(key)
                    .env
                    .map(|var| format!(" (or set {var})"))
                    .unwrap_or_default();
                anyhow::anyhow!("{key} is required with store = \"{store}\"{env}")
            })
    };
    Ok(
        match r.required("snapshots.store", Resolved::text).as_str() {
            "s3" => SnapshotStoreConfig::S3(warren_provisioner::S3Config {
                endpoint: required("snapshots.s3.endpoint", "s3")?,
                bucket: required("snapshots.s3.bucket", "s3")?,
                region: r.required("snapshots.s3.region", Resolved::text),
                access_key_id: required("snapshots.s3.access_key_id", "s3")?,
                secret_access_key: required("snapshots.s3.secret_access_key", "s3")?,
            }),
            "sql" => SnapshotStoreConfig::Sql,
            "redis" => SnapshotStoreConfig::Redis {
                url: required("snapshots.redis.url", "redis")?,
            },
            _ => SnapshotStoreConfig::Local,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::resolve::tests::resolve;
    use super::*;

    fn settings(
        flags: &[(&'static str, &str)],
        env: &[(&str, &str)],
        file: &str,
    ) -> anyhow::Result<ServeSettings> {
        ServeSettings::new(&resolve(flags, env, file)?)
    }

    #[test]
    fn no_setting_at_all_gives_the_provisioners_own_defaults() {
        let settings = settings(&[], &[], "").unwrap();
        let mut config = ProvisionerConfig::new("/x");
        settings.apply(&mut config);
        let defaults = ProvisionerConfig::new("/x");
        assert_eq!(format!("{config:?}"), format!("{defaults:?}"));
        assert_eq!(settings.limits, RuntimeLimits::default());
        assert_eq!(settings.listen, SocketAddr::from(([127, 0, 0, 1], 7878)));
        assert_eq!(settings.backend, BackendChoice::Local);
        assert_eq!(settings.state, StateChoice::Sqlite(None));
    }

    #[test]
    fn image_is_the_default_backends_image_whichever_backend_that_is() {
        let local = settings(&[("image", "py")], &[], "").unwrap();
        assert_eq!(local.local_root, LocalRoot::Image("py".into()));
        assert_eq!((local.docker_image, local.kubernetes_image), (None, None));
        assert!(!local.docker_enabled);
        let docker = settings(&[("image", "py"), ("backend", "docker")], &[], "").unwrap();
        assert_eq!(docker.local_root, LocalRoot::Host);
        assert_eq!(docker.docker_image.as_deref(), Some("py"));
        assert!(docker.docker_enabled);
        let kubernetes = settings(&[], &[], "backend = \"kubernetes\"\nimage = \"py\"").unwrap();
        assert_eq!(
            (
                kubernetes.kubernetes_image.as_deref(),
                kubernetes.docker_image.as_deref()
            ),
            (Some("py"), None)
        );
        let mut config = ProvisionerConfig::new("/x");
        kubernetes.apply(&mut config);
        assert_eq!(
            config
                .default_images
                .get(&BackendKind::Kubernetes)
                .map(String::as_str),
            Some("py")
        );
        assert!(!config.default_images.contains_key(&BackendKind::Docker));
    }

    #[test]
    fn each_backend_has_its_own_image_key() {
        let file = "local.image = \"mini\"\n[docker]\nenabled = true\nimage = \"d\"\n\
                    [kubernetes]\nimage = \"k\"\n";
        let both = settings(&[], &[], file).unwrap();
        assert_eq!(both.local_root, LocalRoot::Image("mini".into()));
        assert_eq!(both.docker_image.as_deref(), Some("d"));
        assert!(both.docker_enabled);
        let flags = settings(&[("local.image", "mini"), ("docker.image", "d")], &[], "").unwrap();
        assert_eq!(flags.local_root, LocalRoot::Image("mini".into()));
        assert!(flags.docker_enabled, "--docker-image offers Docker");
        let in_file = settings(&[], &[], "[docker]\nimage = \"py\"").unwrap();
        assert!(
            !in_file.docker_enabled,
            "the file's image alone offers no Docker"
        );
        assert_eq!(in_file.docker_image.as_deref(), Some("py"));
        // The old top-level rootfs is local.rootfs; the same value twice is no conflict.
        let old = settings(&[], &[], "rootfs = \"/r\"").unwrap();
        assert_eq!(old.local_root, LocalRoot::Directory("/r".into()));
        let same = settings(
            &[("image", "d"), ("backend", "docker"), ("docker.image", "d")],
            &[],
            "",
        );
        assert_eq!(same.unwrap().docker_image.as_deref(), Some("d"));
    }

    #[test]
    fn settings_that_contradict_each_other_stop_the_start() {
        for (flags, file, expected) in [
            (
                &[("local.rootfs", "/x"), ("image", "y")][..],
                "",
                "keep one",
            ),
            (
                &[("local.rootfs", "/x"), ("local.image", "y")],
                "",
                "keep one",
            ),
            (
                &[("local.rootfs", "/x"), ("backend", "docker")],
                "",
                "--rootfs is for the local backend, and the default backend is docker",
            ),
            (
                &[("backend", "docker")],
                "local.image = \"mini\"",
                "local.image in the configuration is for the local backend",
            ),
            (&[("backend", "kubernetes")], "", "needs the image"),
            (
                &[("backend", "docker"), ("image", "a"), ("docker.image", "b")],
                "",
                "--image (\"a\") is the default backend's image, and --docker-image names another",
            ),
            (
                &[("image", "a"), ("backend", "kubernetes")],
                "[kubernetes]\nimage = \"b\"",
                "names another (\"b\") for the same kubernetes backend",
            ),
            (
                &[("cluster.key_file", "/k")],
                "",
                "needs a state store they share",
            ),
            (
                &[],
                "[exec]\ndefault_timeout_s = 100\nmax_timeout_s = 10",
                "above exec.max_timeout_s",
            ),
            (
                &[],
                "[snapshots]\nstore = \"s3\"",
                "snapshots.s3.endpoint is required",
            ),
            (
                &[],
                "[snapshots]\nstore = \"redis\"",
                "(or set WARREN_REDIS_URL)",
            ),
            (&[("state.url", "mysql://db")], "", "use postgres://"),
        ] {
            let error = settings(flags, &[], file).unwrap_err().to_string();
            assert!(error.contains(expected), "{flags:?} {file}: {error}");
        }
    }

    #[test]
    fn a_snapshot_stores_credentials_come_from_the_environment_over_the_file() {
        let file = "[snapshots]\nstore = \"s3\"\n[snapshots.s3]\nendpoint = \"http://s3\"\n\
                    bucket = \"b\"\naccess_key_id = \"file\"\nsecret_access_key = \"file\"\n";
        let env = [("WARREN_S3_ACCESS_KEY_ID", "env")];
        let SnapshotStoreConfig::S3(s3) = settings(&[], &env, file).unwrap().snapshot_store else {
            panic!("not s3")
        };
        assert_eq!(
            (s3.access_key_id.as_str(), s3.secret_access_key.as_str()),
            ("env", "file")
        );
        assert_eq!(s3.region, "us-east-1");
    }
}
