//! The table: every setting of `warren serve`, once, with its flag, variable, type, unit,
//! default, check and documentation.

use std::time::Duration;

use super::{Check, Default, Kind, Old, Setting, Value};

const fn setting(key: &'static str, kind: Kind, default: Default, doc: &'static str) -> Setting {
    Setting {
        key,
        file: true,
        flag: None,
        env: None,
        old: Old::NONE,
        kind,
        unit: "",
        default,
        check: Check::Any,
        doc,
    }
}

impl Setting {
    const fn flag(mut self, flag: &'static str) -> Self {
        self.flag = Some(flag);
        self
    }
    const fn env(mut self, env: &'static str) -> Self {
        self.env = Some(env);
        self
    }
    /// Not a key of `warren.toml`: a flag or variable only.
    const fn not_in_file(mut self) -> Self {
        self.file = false;
        self
    }
    const fn old(mut self, old: Old) -> Self {
        self.old = old;
        self
    }
    const fn seconds(mut self) -> Self {
        self.unit = "seconds";
        self.check = Check::Seconds;
        self
    }
    const fn at_least(mut self, unit: &'static str, min: u64) -> Self {
        self.unit = unit;
        self.check = Check::AtLeast(min);
        self
    }
}

fn provisioner() -> warren_provisioner::ProvisionerConfig {
    warren_provisioner::ProvisionerConfig::new("/")
}

fn secs(duration: Duration) -> Value {
    Value::Integer(duration.as_secs())
}

fn limits() -> warren_isolation::config::RuntimeLimits {
    warren_isolation::config::RuntimeLimits::default()
}

fn int(n: Option<u64>) -> Value {
    Value::Integer(n.expect("the default limits set it"))
}

const NETWORK_POLICY: Kind =
    Kind::Structured("network policy: `{ mode = \"none\" }`, `{ mode = \"open\" }` or `{ mode = \"allowlist\", allow = [...] }`, `open` and `allowlist` with `deny = [...]` refused whatever else allows");

/// Every setting, in the order of the reference (the sections of `warren.toml`).
pub static SETTINGS: &[Setting] = &[
    // The server.
    setting("config", Kind::Path, Default::Unset("none: flags, variables and defaults only"),
        "A warren.toml holding any of the settings below; warren.example.toml shows every key.")
        .flag("config").env("WARREN_CONFIG").not_in_file(),
    setting("data_dir", Kind::Path, Default::Unset("/var/lib/warren as root, else ~/.local/share/warren"),
        "Data directory: workspaces, skill projections, state store, generated token.")
        .flag("data-dir").env("WARREN_DATA_DIR"),
    setting("workspace_dir", Kind::Path, Default::Unset("the data directory, which then keeps only this node's own state"),
        "Where the UserWorkspaces, skill projections, artifacts and local snapshots live: a directory every replica shares (NFSv4, CephFS, EFS).")
        .flag("workspace-dir").env("WARREN_WORKSPACE_DIR"),
    setting("listen", Kind::Address, Default::Value(|| Value::Address(([127, 0, 0, 1], 7878).into())),
        "Address the HTTP API listens on. Never all interfaces unless you say so.")
        .flag("listen").env("WARREN_LISTEN"),
    setting("token_file", Kind::Path, Default::Unset("<data_dir>/token, generated (0600) when missing"),
        "File holding the provisioner token (at least 32 characters). WARREN_TOKEN wins over it.")
        .flag("token-file"),
    setting("token", Kind::Secret, Default::Unset("read from token_file"),
        "The provisioner token itself (at least 32 characters). Never logged.")
        .env("WARREN_TOKEN").not_in_file(),
    setting("log_format", Kind::Choice(&["text", "json"]), Default::Value(|| Value::Text("text".into())),
        "Log lines as human-readable text, or one JSON object per line (with the request id and sandbox id of the request each line belongs to).")
        .flag("log-format").env("WARREN_LOG_FORMAT"),
    setting("log", Kind::Text, Default::Value(|| Value::Text("info".into())),
        "Which log lines are written: a tracing filter such as `info` or `warren=debug,info`.")
        .env("WARREN_LOG").not_in_file(),
    // The backends.
    setting("backend", Kind::Choice(&["local", "docker", "kubernetes", "memory"]), Default::Value(|| Value::Text("local".into())),
        "Which backend hosts runtimes: local (namespaces, cgroups, seccomp, Landlock), docker (one container per sandbox), kubernetes (one pod per sandbox, [kubernetes]) or memory (isolates nothing; builds for warren's own tests only).")
        .flag("backend").env("WARREN_BACKEND"),
    setting("tier", Kind::Choice(&["kernel", "gvisor"]), Default::Value(|| Value::Text(provisioner().default_isolation.as_str().into())),
        "The isolation tier of sandboxes that name none: kernel (the host kernel), or gvisor (runsc's user-space kernel; the default backend must be able to run it on this host, or warren does not start).")
        .flag("tier").env("WARREN_TIER")
        // `isolation` is also the CLI's word for who shares a sandbox (`sandbox create`).
        .old(Old { flags: &["isolation"], envs: &["WARREN_ISOLATION"], keys: &["isolation"] }),
    setting("image", Kind::Text, Default::Unset("none"),
        "The default backend's image, the one sandboxes that name none start from: a shorthand for local.image, docker.image or kubernetes.image, whichever backend `backend` names (setting both to different values is refused).")
        .flag("image").env("WARREN_IMAGE"),
    setting("local.rootfs", Kind::Path, Default::Unset("the host profile"),
        "A root filesystem directory for the local backend's runtimes (not with local.image).")
        .flag("rootfs").env("WARREN_ROOTFS")
        .old(Old { flags: &[], envs: &[], keys: &["rootfs"] }),
    setting("local.image", Kind::Text, Default::Unset("none: the host profile"),
        "An image imported with `warren image import`: the root filesystem of the local backend's runtimes (not with local.rootfs).")
        .flag("local-image").env("WARREN_LOCAL_IMAGE"),
    setting("docker.enabled", Kind::Bool, Default::Value(|| Value::Bool(false)),
        "Also offer the Docker backend next to the default one, for sandboxes created with \"backend\":\"docker\".")
        .flag("docker").env("WARREN_DOCKER"),
    setting("docker.image", Kind::Text, Default::Unset("none"),
        "The Docker image of Docker sandboxes that name none (never pulled). Given as the flag or variable it also offers Docker; in the file, set enabled too.")
        .flag("docker-image").env("WARREN_DOCKER_IMAGE"),
    setting("docker.socket", Kind::Text, Default::Unset("/var/run/docker.sock"),
        "The Docker engine's Unix socket.")
        .flag("docker-socket").env("WARREN_DOCKER_SOCKET"),
    setting("kubernetes", Kind::Structured("table (`warren k8s manifests` writes it; docs/backends.md)"), Default::Unset("none"),
        "The Kubernetes backend's cluster: namespace, claims, images and ports of sandbox pods."),
    setting("kubernetes.image", Kind::Text, Default::Unset("none"),
        "The image of Kubernetes sandboxes that name none (the cluster pulls it by its own policy); required with backend kubernetes."),
    // The state store.
    setting("state.url", Kind::Text, Default::Unset("SQLite at <data_dir>/state.db"),
        "The state store: postgres://user:password@host:port/database, or sqlite:<path>.")
        .flag("state").env("WARREN_STATE"),
    setting("state.max_connections", Kind::Integer, Default::Value(|| Value::Integer(warren_store::PostgresOptions::default().max_connections.into())),
        "PostgreSQL: connections warren's pool may hold.")
        .at_least("connections", 1),
    // The lifecycle.
    setting("lifecycle.idle_timeout_s", Kind::Integer, Default::Value(|| secs(provisioner().idle_timeout)),
        "How long a runtime may sit unused (no lease, no command, no running process) before it is reclaimed. Its workspace files stay.")
        .flag("idle-timeout").env("WARREN_IDLE_TIMEOUT").seconds(),
    setting("lifecycle.max_lifetime_s", Kind::Integer, Default::Value(|| secs(provisioner().max_lifetime)),
        "How long after its start a runtime is reclaimed whatever holds it.")
        .flag("max-lifetime").env("WARREN_MAX_LIFETIME").seconds(),
    setting("lifecycle.reap_interval_s", Kind::Integer, Default::Value(|| Value::Integer(10)),
        "Time between two passes of the reaper.")
        .flag("reap-interval").env("WARREN_REAP_INTERVAL").seconds(),
    setting("lifecycle.reap_concurrency", Kind::Integer, Default::Value(|| Value::Integer(provisioner().reap_concurrency as u64)),
        "Sandboxes the reaper works on at once; a slow one never holds up the others.")
        .at_least("sandboxes", 1),
    setting("lifecycle.reap_deadline_s", Kind::Integer, Default::Value(|| secs(provisioner().reap_deadline)),
        "Time for one sandbox's snapshot before a reap; past it the runtime is reaped without it.")
        .seconds(),
    setting("lifecycle.shutdown_grace_s", Kind::Integer, Default::Value(|| Value::Integer(10)),
        "On SIGTERM/SIGINT, how long requests in flight may finish (snapshots are cancelled at once).")
        .seconds(),
    // Commands.
    setting("exec.default_timeout_s", Kind::Integer, Default::Value(|| secs(provisioner().default_exec_timeout)),
        "A command's timeout when the call names none.")
        .seconds(),
    setting("exec.max_timeout_s", Kind::Integer, Default::Value(|| secs(provisioner().max_exec_timeout)),
        "The longest timeout a command may ask for.")
        .seconds(),
    setting("exec.output_cap_bytes", Kind::Integer, Default::Value(|| Value::Integer(provisioner().output_cap as u64)),
        "Stdout and stderr kept per command, each.")
        .at_least("bytes", 1),
    // Limits per runtime.
    setting("limits.memory_bytes", Kind::Integer, Default::Value(|| int(limits().memory_bytes)),
        "Memory of one runtime.").at_least("bytes", 1),
    setting("limits.pids_max", Kind::Integer, Default::Value(|| int(limits().pids_max)),
        "Processes and threads of one runtime.").at_least("processes", 1),
    setting("limits.cpu_millis", Kind::Integer, Default::Value(|| int(limits().cpu_millis)),
        "CPU of one runtime, in thousandths of a CPU.").at_least("millicpus", 1),
    setting("limits.cow_bytes", Kind::Integer, Default::Value(|| Value::Integer(limits().cow_bytes)),
        "The copy-on-write layer over the root filesystem.").at_least("bytes", 1),
    setting("limits.home_bytes", Kind::Integer, Default::Value(|| Value::Integer(limits().home_bytes)),
        "The ephemeral /home/gem.").at_least("bytes", 1),
    setting("limits.tmp_bytes", Kind::Integer, Default::Value(|| Value::Integer(limits().tmp_bytes)),
        "/tmp.").at_least("bytes", 1),
    setting("limits.shm_bytes", Kind::Integer, Default::Value(|| Value::Integer(limits().shm_bytes)),
        "/dev/shm.").at_least("bytes", 1),
    setting("limits.nofile", Kind::Integer, Default::Value(|| Value::Integer(limits().nofile)),
        "Open files per process.").at_least("files", 1),
    // Snapshots.
    setting("snapshots.keep_checkpoints", Kind::Integer, Default::Value(|| Value::Integer(provisioner().keep_checkpoints as u64)),
        "Checkpoints kept per sandbox; older ones go, and their unshared chunks.")
        .at_least("checkpoints", 1),
    setting("snapshots.gc_grace_s", Kind::Integer, Default::Value(|| secs(provisioner().gc_grace)),
        "Store objects younger than this are never collected.")
        .seconds(),
    setting("snapshots.max_bytes", Kind::Integer, Default::Value(|| Value::Integer(provisioner().snapshot_max_bytes)),
        "File data one snapshot or checkpoint reads (holes not counted); over it: 422 snapshot_too_large.")
        .at_least("bytes", 1),
    setting("snapshots.before_reap", Kind::Bool, Default::Value(|| Value::Bool(provisioner().snapshot_before_reap)),
        "Snapshot a runtime (installed packages, /home/gem) before reaping it."),
    setting("snapshots.resume", Kind::Bool, Default::Value(|| Value::Bool(provisioner().resume_from_snapshots)),
        "Start a reaped sandbox's next runtime from its latest snapshot."),
    setting("snapshots.store", Kind::Choice(&["local", "s3", "sql", "redis"]), Default::Value(|| Value::Text("local".into())),
        "Where snapshots are kept: local (<data>/snapshots/<uid>), s3, sql (rows of the state store) or redis."),
    setting("snapshots.s3.endpoint", Kind::Text, Default::Unset("none; required with store = \"s3\""),
        "An S3-compatible server's URL."),
    setting("snapshots.s3.bucket", Kind::Text, Default::Unset("none; required with store = \"s3\""),
        "The bucket; keys under snapshots/<uid>/."),
    setting("snapshots.s3.region", Kind::Text, Default::Value(|| Value::Text("us-east-1".into())),
        "The bucket's region."),
    setting("snapshots.s3.access_key_id", Kind::Secret, Default::Unset("none; required with store = \"s3\""),
        "The access key's id.")
        .env("WARREN_S3_ACCESS_KEY_ID"),
    setting("snapshots.s3.secret_access_key", Kind::Secret, Default::Unset("none; required with store = \"s3\""),
        "The access key's secret.")
        .env("WARREN_S3_SECRET_ACCESS_KEY"),
    setting("snapshots.redis.url", Kind::Secret, Default::Unset("none; required with store = \"redis\""),
        "A Redis server (small workspaces only: one value per chunk).")
        .env("WARREN_REDIS_URL"),
    // Storage quotas.
    setting("quotas.bytes", Kind::Integer, Default::Unset("no quotas"),
        "Every uid's workspace filesystem size, metadata included (at least 16 MiB); set, each uid gets a loop-mounted ext4 filesystem of its own.")
        .at_least("bytes", warren_provisioner::MIN_QUOTA_BYTES),
    setting("quotas.inodes", Kind::Integer, Default::Unset("one per 16 KiB"),
        "Every uid's files, directories and links.")
        .at_least("inodes", warren_provisioner::MIN_QUOTA_INODES),
    setting("quotas.unenforced", Kind::Bool, Default::Value(|| Value::Bool(false)),
        "Serve where this host cannot enforce the quotas (limits reported only); otherwise warren refuses to start there."),
    setting("quotas.users", Kind::Structured("table of uids, each `{ bytes, inodes }`"), Default::Unset("none"),
        "Per-uid overrides; absent keys fall back to [quotas]."),
    // Skills and workdir sources.
    setting("skills.builtin_dir", Kind::Path, Default::Unset("none"),
        "Skills every uid gets, shipped with the deployment (one directory per skill)."),
    setting("skills.shared_dir", Kind::Path, Default::Unset("none"),
        "Skills every uid gets, maintained by the operator; wins over built-in on a name clash."),
    setting("skills.catalog_dir", Kind::Path, Default::Unset("none"),
        "Skills a uid gets when granted (PUT /v1/users/{uid}/skills/{name})."),
    setting("init.host_dirs", Kind::Structured("table of names to paths"), Default::Unset("none"),
        "Named host directories a new workdir may be filled from ({\"init\":{\"host_dir\":\"<name>\"}})."),
    // The network.
    setting("network.default", NETWORK_POLICY, Default::Unset("{ mode = \"none\" }, loopback only"),
        "The network policy of a sandbox whose request names none (I23), on /v1 (so the CLI and every client) and DeerFlow (unless deerflow.network); E2B names its own (allowInternetAccess, e2b.internet)."),
    setting("network.upstream_ca", Kind::Path, Default::Unset("none: the host's roots only"),
        "A PEM file of roots the egress proxy trusts, beside the host's own, when it checks a destination an egress secret is bound to."),
    setting("network.secret_sources", Kind::Structured("table of names to { command = [...], timeout_s = 10 }"), Default::Unset("none"),
        "Sources of short-lived egress secrets: a command warren runs (no shell; absolute path) to mint a value for one sandbox, given WARREN_UID, WARREN_SANDBOX and WARREN_SECRET, printing {\"value\", \"expires_in\"}; kept for that sandbox until it expires, never stored."),
    // The sandbox environment.
    setting("sandbox_env", Kind::Structured("table of variable names to values"), Default::Unset("none"),
        "Environment every command of a sandbox that inherits it gets; the uid's agent environment and the call's own env go over it."),
    setting("sandbox_secrets", Kind::Structured("table of variable names to values"), Default::Unset("none"),
        "Like sandbox_env, and the values are masked as [masked:NAME] in command output."),
    // DeerFlow.
    setting("deerflow.api_key", Kind::Secret, Default::Unset("none: DeerFlow's APIs are off"),
        "The key DeerFlow sends as X-API-Key (its provisioner_api_key): at least 32 characters, never the provisioner token. Set, /deerflow serves DeerFlow's provisioner and AIO sandbox APIs.")
        .env("WARREN_DEERFLOW_API_KEY"),
    setting("deerflow.sandbox_base_url", Kind::Text, Default::Unset("http:// and the Host DeerFlow called"),
        "What sandbox URLs start with (http(s)://host[:port][/prefix]); a sandbox URL is a bearer capability."),
    setting("deerflow.extra_mount_paths", Kind::Structured("list of container paths"), Default::Unset("none"),
        "Container paths DeerFlow's extra_mounts may target, under /mnt."),
    setting("deerflow.extra_mount_roots", Kind::Structured("list of host paths"), Default::Unset("none"),
        "Host directories the sources of extra_mounts must lie under."),
    setting("deerflow.network", NETWORK_POLICY, Default::Unset("network.default"),
        "Where DeerFlow's sandboxes may connect."),
    // E2B.
    setting("e2b.listen", Kind::Address, Default::Unset("none: E2B's API is off"),
        "Serve E2B's API (control plane and every sandbox's envd) on this address too, so the official E2B SDKs work with E2B_API_URL and E2B_SANDBOX_URL set to it.")
        .flag("e2b-listen").env("WARREN_E2B_LISTEN"),
    setting("e2b.domain", Kind::Text, Default::Unset("none"),
        "Host-name routing: the SDK reaches the API at https://api.<domain> and envd at https://49983-<sandboxID>.<domain>."),
    setting("e2b.tls_cert", Kind::Path, Default::Unset("none: plain HTTP"),
        "The PEM certificate chain the E2B listener serves TLS with (server certificate first); with tls_key."),
    setting("e2b.tls_key", Kind::Path, Default::Unset("none: plain HTTP"),
        "The PEM private key of tls_cert."),
    setting("e2b.internet", NETWORK_POLICY, Default::Unset("{ mode = \"open\" }, public destinations through warren's proxy"),
        "Where sandboxes allowed internet access may connect."),
    setting("e2b.sandbox_timeout_s", Kind::Integer, Default::Value(|| secs(warren_e2b::E2bConfig::DEFAULT_TIMEOUT)),
        "How long a sandbox created without a timeout lives.")
        .seconds()
        // `default_timeout_s` is a command's timeout in [exec].
        .old(Old { flags: &[], envs: &[], keys: &["e2b.default_timeout_s"] }),
    setting("e2b.max_sandbox_timeout_s", Kind::Integer, Default::Value(|| secs(warren_e2b::E2bConfig::MAX_TIMEOUT)),
        "The longest timeout a sandbox may ask for (create, set_timeout).")
        .seconds()
        .old(Old { flags: &[], envs: &[], keys: &["e2b.max_timeout_s"] }),
    setting("e2b.keys", Kind::Structured("table of API keys to uids"), Default::Unset("none"),
        "API keys (e2b_ and at least 32 hex digits) and the uid each acts for; more come from `warren e2b key create`."),
    setting("e2b.templates", Kind::Structured("table of names to `{ backend, image, home }`"), Default::Unset("base only"),
        "Templates beside base (the server's default runtime) and what each starts."),
    // The cluster.
    setting("cluster.node_id", Kind::Text, Default::Unset("the host name"),
        "This node's name among the replicas sharing a state store.")
        .flag("node-id").env("WARREN_NODE_ID"),
    setting("cluster.advertise", Kind::Text, Default::Unset("http:// and the listen address"),
        "The internal URL other replicas reach this node at.")
        .flag("advertise").env("WARREN_ADVERTISE"),
    setting("cluster.node_ttl_s", Kind::Integer, Default::Value(|| secs(provisioner().node.ttl)),
        "The node's lease, renewed every third of it.")
        .seconds(),
    setting("cluster.key_file", Kind::Path, Default::Unset("none: a lone server"),
        "A file holding the cluster key (32+ characters) the replicas authenticate each other with; set, this node runs as one replica of several on a PostgreSQL state store.")
        .flag("cluster-key-file").env("WARREN_CLUSTER_KEY_FILE"),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_key_flag_and_variable_old_or_new_names_one_setting() {
        let mut keys = BTreeSet::new();
        let mut flags = BTreeSet::new();
        let mut envs = BTreeSet::new();
        for setting in SETTINGS {
            for key in std::iter::once(&setting.key).chain(setting.old.keys) {
                assert!(keys.insert(*key), "the key {key} twice");
            }
            for flag in setting.flag.iter().chain(setting.old.flags) {
                assert!(flags.insert(*flag), "--{flag} twice");
            }
            for var in setting.env.iter().chain(setting.old.envs) {
                assert!(envs.insert(*var), "{var} twice");
            }
        }
    }

    #[test]
    fn every_default_value_is_of_its_kind_and_passes_its_check() {
        for setting in SETTINGS {
            if let Default::Value(default) = setting.default {
                let value = default();
                let fits = matches!(
                    (setting.kind, &value),
                    (Kind::Text | Kind::Secret | Kind::Choice(_), Value::Text(_))
                        | (Kind::Path, Value::Path(_))
                        | (Kind::Address, Value::Address(_))
                        | (Kind::Integer, Value::Integer(_))
                        | (Kind::Bool, Value::Bool(_))
                );
                assert!(fits, "{}: {value:?}", setting.key);
                if let (Kind::Choice(words), Value::Text(text)) = (setting.kind, &value) {
                    assert!(words.contains(&text.as_str()), "{}", setting.key);
                }
            }
        }
    }
}
