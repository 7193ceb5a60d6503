//! `LocalBackend`: the provisioner side of the native runtime (the embedded default).
//!
//! It starts a runtime by running `warren __runtime-init` (this same executable), talks to
//! each runtime's init over its control socket, and destroys a runtime by killing init —
//! the kernel then kills every process of the pid namespace — and removing its cgroups and
//! host directory. UserWorkspace files are never touched (I15).

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_backend::{
    Backend, BackendError, BackendKind, Capabilities, DiscoveredRuntime, EphemeralRoots,
    ProcessPressure, RuntimeSpec, RuntimeUsage,
};
use warren_core::{IsolationTier, NetworkPolicy, SandboxId};

use crate::cgroup::{CgroupSupport, SandboxCgroup};
use crate::config::{IdMap, MountConfig, RootSource, RuntimeConfig, RuntimeLimits};
use crate::host::HostReport;
use crate::launcher::{spawn_launcher, Launcher, LauncherPool};
use crate::IsolationError;
use warren_agent::client::{activity, ping, process_birth};

/// Configuration of the local backend.
#[derive(Debug, Clone)]
pub struct LocalBackendConfig {
    /// warren's data directory.
    pub data_dir: PathBuf,
    /// The program to run as `<program> __runtime-init`: warren's own executable.
    pub init_program: PathBuf,
    /// Limits of every runtime.
    pub limits: RuntimeLimits,
    /// A root filesystem directory instead of the host profile.
    pub rootfs: Option<PathBuf>,
}

/// What a runtime's host directory records about it, for discovery after a restart (I16).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RuntimeIdentity {
    sandbox: String,
    generation: i64,
    uid: String,
    runtime_scope: String,
    workdir: String,
    /// Runtimes recorded before layouts existed are the default layout's.
    #[serde(default)]
    layout: warren_core::LayoutName,
    /// Runtimes recorded before extra mounts existed have none.
    #[serde(default)]
    extra_mounts: Vec<warren_core::ExtraMount>,
    user_workspace: PathBuf,
    skill_projection: PathBuf,
    env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    network: NetworkPolicy,
    cgroup: String,
    pid: i32,
    /// Boot id and start time of init, so a pid reused after a reboot or after init was
    /// reaped elsewhere is never mistaken for it.
    #[serde(default)]
    init_birth: String,
    /// The tier (issue 19); runtimes recorded before tiers existed are the kernel's. On
    /// gVisor `pid` is runsc's sandbox process (the Sentry), and the control socket is in
    /// the runtime directory's `run/` (the one directory the sandbox sees of it).
    #[serde(default)]
    isolation: IsolationTier,
    /// The binding's environment policy; runtimes recorded before it was are taken for
    /// the default's (inherited, persistent): that can only refuse a runtime whose record
    /// says otherwise, never adopt one wrongly, since a runtime's policy is its record's.
    #[serde(default = "inherited")]
    inherit_env: bool,
    #[serde(default)]
    ephemeral: bool,
    /// The branch of the workdir it was bound to (I27); none for runtimes recorded before
    /// branches existed, which were bound to none.
    #[serde(default)]
    branch: Option<warren_core::BranchName>,
}

fn inherited() -> bool {
    true
}

/// A gVisor runtime's home as a runtime snapshot's (I30): the agent sends it as a tar
/// stream into `staging` (warren's, 0700, made fresh), unpacked by descriptor; `cow` is an
/// empty directory (the root is read-only). `None` when the runtime is gone.
async fn gvisor_home(
    sandbox: &SandboxId,
    socket_dir: &Path,
    staging: &Path,
    ephemeral_home: bool,
    home_bytes: u64,
) -> Result<Option<EphemeralRoots>, BackendError> {
    let failed = |source: std::io::Error| BackendError::Exec {
        sandbox: sandbox.clone(),
        source,
    };
    let _ = std::fs::remove_dir_all(staging);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(staging)
        .map_err(failed)?;
    std::fs::create_dir(staging.join("cow")).map_err(failed)?;
    let cow = staging.join("cow");
    if !ephemeral_home {
        // The home is the persistent workdir (E2B's): nothing of it is ephemeral state.
        return Ok(Some(EphemeralRoots { cow, home: None }));
    }
    let home = staging.join("home");
    std::fs::create_dir(&home).map_err(failed)?;
    // The home is a tmpfs of `home_bytes`: more than that cannot be there.
    let limit = home_bytes.saturating_mul(2);
    let (dir, into) = (socket_dir.to_owned(), home.clone());
    let archived =
        tokio::task::spawn_blocking(move || warren_agent::client::archive_home(&dir, &into, limit))
            .await
            .map_err(|e| failed(std::io::Error::other(e)))?;
    match archived {
        Ok(_) => Ok(Some(EphemeralRoots {
            cow,
            home: Some(home),
        })),
        Err(warren_agent::client::RunError::Gone(_)) => Ok(None),
        Err(warren_agent::client::RunError::Io(source)) => Err(failed(source)),
    }
}

impl RuntimeIdentity {
    /// The spec this runtime was made from, as far as its record tells (no seed), or
    /// `None` when the record cannot be read back (never adopted, then).
    fn spec(&self) -> Option<RuntimeSpec> {
        Some(RuntimeSpec {
            sandbox: SandboxId::parse(&self.sandbox).ok()?,
            generation: self.generation,
            uid: warren_core::Uid::new(self.uid.clone()).ok()?,
            runtime_scope: warren_core::RuntimeScope::new(self.runtime_scope.clone()).ok()?,
            user_workspace: self.user_workspace.clone(),
            skill_projection: self.skill_projection.clone(),
            env: self.env.clone(),
            seed: None,
            branch: None,
            frozen: Vec::new(),
            binding: warren_core::Binding {
                workdir: warren_core::Workdir::new(self.workdir.clone()).ok()?,
                network: self.network.clone(),
                backend: BackendKind::Local,
                image: None,
                inherit_env: self.inherit_env,
                ephemeral: self.ephemeral,
                layout: self.layout,
                extra_mounts: self.extra_mounts.clone(),
                isolation: self.isolation,
                branch: self.branch.clone(),
            },
        })
    }

    /// Whether this runtime serves `spec` ([`RuntimeSpec::serves`]): a runtime of another
    /// binding never serves, even of the same generation: a live runtime never changes
    /// its view (I16).
    fn serves(&self, spec: &RuntimeSpec) -> bool {
        self.spec().is_some_and(|mine| mine.serves(spec))
    }
}

impl RuntimeIdentity {
    /// Where the runtime's control socket is: init binds it in the runtime directory; a
    /// gVisor runtime's agent in the `run/` directory it sees as `/run/warren`.
    fn socket_dir(&self, runtime_dir: &Path) -> PathBuf {
        match self.isolation {
            IsolationTier::Kernel => runtime_dir.to_owned(),
            IsolationTier::Gvisor => runtime_dir.join("run"),
        }
    }
}

/// The native Linux isolation backend.
pub struct LocalBackend {
    config: LocalBackendConfig,
    runtimes_dir: PathBuf,
    /// Distinguishes this instance's cgroups from another warren's on the same host.
    instance: String,
    /// The root of every runtime, per layout: the host profile's `/etc` names the
    /// layout's sandbox user (I7, I11), so each distinct user has a profile of its own.
    roots: HashMap<warren_core::LayoutName, RootSource>,
    cgroups: CgroupSupport,
    report: HostReport,
    /// Unprivileged mode: runtimes get a user namespace mapping 1000:1000 to warren's ids.
    user_namespace: Option<IdMap>,
    /// Whether runtimes get cgroups (not in unprivileged mode).
    cgroups_enabled: bool,
    /// Launchers started ahead of need (see [`LauncherPool`]).
    launchers: LauncherPool,
    live: Mutex<HashMap<SandboxId, RuntimeIdentity>>,
    /// What runtimes' egress proxies ask for secrets, authority and the audit (issue 38).
    egress_broker: std::sync::OnceLock<warren_backend::SharedBroker>,
    /// The gVisor tier, or why this backend cannot run it (issue 19).
    gvisor: Result<crate::runsc::GvisorTier, String>,
}

impl LocalBackend {
    /// Checks the host, builds the host profile and prepares the runtimes directory.
    pub fn new(config: LocalBackendConfig) -> Result<Self, IsolationError> {
        let report = HostReport::probe();
        if !report.root && !report.unprivileged_userns {
            return Err(IsolationError::NotRoot);
        }
        let user_namespace = (!report.root).then(|| IdMap {
            outside_uid: rustix::process::geteuid().as_raw(),
            outside_gid: rustix::process::getegid().as_raw(),
        });
        if !report.overlayfs {
            return Err(IsolationError::MissingFeature("overlayfs"));
        }
        if !report.seccomp {
            return Err(IsolationError::MissingFeature("seccomp filters"));
        }
        let data = config.data_dir.to_string_lossy();
        if data.contains([',', ':', '\\']) {
            return Err(IsolationError::UnusableDataDir);
        }
        let runtimes_dir = config.data_dir.join("runtimes");
        std::fs::create_dir_all(&runtimes_dir).map_err(IsolationError::RuntimesDir)?;
        let mut roots = HashMap::new();
        for layout in warren_core::LayoutName::ALL {
            let root = match &config.rootfs {
                Some(path) => RootSource::Directory { path: path.clone() },
                // Layouts with the same user share one profile (same content, same hash).
                None => RootSource::HostProfile {
                    etc: crate::profile::build_etc_profile(
                        Path::new("/etc"),
                        &config.data_dir.join("runtime-profiles"),
                        layout.layout(),
                    )
                    .map_err(IsolationError::HostProfile)?,
                },
            };
            roots.insert(layout, root);
        }
        // Runtimes outlive their launcher; as subreaper, warren reaps the inits it kills.
        let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
        let cgroups = CgroupSupport::detect().map_err(IsolationError::Cgroup)?;
        let instance =
            blake3::hash(config.data_dir.as_os_str().as_encoded_bytes()).to_hex()[..8].to_owned();
        Ok(Self {
            launchers: LauncherPool::new(config.init_program.clone()),
            config,
            runtimes_dir,
            instance,
            roots,
            cgroups,
            report,
            cgroups_enabled: user_namespace.is_none(),
            user_namespace,
            live: Mutex::new(HashMap::new()),
            egress_broker: std::sync::OnceLock::new(),
            gvisor: Err("gVisor was not probed".to_owned()),
        })
    }

    /// Enables the gVisor tier as `host` (the probe's result, `crate::gvisor::probe`)
    /// allows (issue 19): prepares runsc's state root, the staging directories and the
    /// agent bundle under the data directory. When it cannot, the tier stays unavailable,
    /// and [`Backend::gvisor_unavailable`] says why.
    pub fn with_gvisor(mut self, host: &crate::gvisor::GvisorHost) -> Self {
        self.gvisor = if self.config.rootfs.is_some() {
            Err(
                "the gVisor tier shows the host profile; it is not available with --rootfs"
                    .to_owned(),
            )
        } else if !self.cgroups_enabled {
            Err(crate::gvisor::NOT_ROOT_REASON.to_owned())
        } else {
            crate::runsc::GvisorTier::prepare(
                host,
                &self.config.data_dir,
                &self.config.init_program,
                &self.instance,
            )
        };
        if let Err(reason) = &self.gvisor {
            tracing::info!(%reason, "the local backend runs no gVisor runtimes");
        }
        self
    }

    /// What this host supports, for `warren doctor`.
    pub fn report(&self) -> &HostReport {
        &self.report
    }

    /// What this backend enforces: the host's cgroups, unless it runs unprivileged.
    fn enforceable(&self) -> crate::cgroup::Enforceable {
        if self.cgroups_enabled {
            self.cgroups.enforceable()
        } else {
            crate::cgroup::Enforceable::default()
        }
    }

    fn cgroup_name(&self, sandbox: &SandboxId) -> String {
        format!("{}-{}", self.instance, sandbox)
    }

    fn runtime_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.runtimes_dir.join(sandbox.as_str())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, RuntimeIdentity>> {
        // The map only caches identities that are also on disk; poisoning loses nothing.
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The runtime of `sandbox`, from memory or from its host directory (a runtime started
    /// by an earlier provisioner process), if its init still answers.
    async fn find(&self, sandbox: &SandboxId) -> Option<RuntimeIdentity> {
        if let Some(identity) = self.lock().get(sandbox).cloned() {
            return Some(identity);
        }
        let dir = self.runtime_dir(sandbox);
        // Reading the record and pinging init block (up to the ping's timeout).
        let identity = tokio::task::spawn_blocking(move || {
            let identity = read_identity(&dir)?;
            ping(&identity.socket_dir(&dir))
                .is_some_and(|(s, g)| s == identity.sandbox && g == identity.generation)
                .then_some(identity)
        })
        .await
        .ok()
        .flatten()?;
        self.adopt(sandbox, identity.clone());
        Some(identity)
    }

    /// Takes a runtime into this provisioner's care: remembers it and, if its network
    /// policy lets anything out, serves its egress.
    fn adopt(&self, sandbox: &SandboxId, identity: RuntimeIdentity) {
        // A gVisor runtime has loopback only (`--network=none`): its agent relays the
        // proxy port's connections to this egress (issue 19).
        if identity.network.has_egress() {
            let dir = self.runtime_dir(sandbox);
            let egress = warren_agent::egress::RuntimeEgress::new(
                sandbox.clone(),
                identity.network.clone(),
                self.egress_broker.get().cloned(),
            );
            if let Err(error) = warren_agent::egress::spawn_egress(
                identity.socket_dir(&dir),
                egress,
                tokio::runtime::Handle::current(),
            ) {
                tracing::error!(%sandbox, %error, "cannot serve the runtime's egress");
            }
        }
        self.lock().insert(sandbox.clone(), identity);
    }

    async fn launch(&self, spec: &RuntimeSpec) -> Result<RuntimeIdentity, BackendError> {
        let create_error = |source| BackendError::Create {
            sandbox: spec.sandbox.clone(),
            source,
        };
        let dir = self.runtime_dir(&spec.sandbox);
        // Leftovers of a runtime that died with the machine or an old provisioner.
        self.teardown(&spec.sandbox)
            .await
            .map_err(|e| create_error(std::io::Error::other(e.to_string())))?;
        std::fs::create_dir_all(&dir).map_err(create_error)?;
        let pid = match spec.binding.isolation {
            IsolationTier::Kernel => self.launch_init(spec, &dir).await?,
            IsolationTier::Gvisor => {
                let (Ok(tier), RootSource::HostProfile { etc }) =
                    (&self.gvisor, &self.roots[&spec.binding.layout])
                else {
                    let reason = self.gvisor.as_ref().err().cloned().unwrap_or_default();
                    return Err(create_error(std::io::Error::other(
                        IsolationError::GvisorUnavailable(reason).to_string(),
                    )));
                };
                let cgroup = self.cgroup_name(&spec.sandbox);
                tier.launch(spec, &dir, etc, &self.config.limits, &cgroup)
                    .await
                    .map_err(|e| create_error(std::io::Error::other(e.to_string())))?
                    .pid
            }
        };
        let identity = RuntimeIdentity {
            sandbox: spec.sandbox.to_string(),
            generation: spec.generation,
            uid: spec.uid.to_string(),
            runtime_scope: spec.runtime_scope.to_string(),
            workdir: spec.binding.workdir.to_string(),
            layout: spec.binding.layout,
            extra_mounts: spec.binding.extra_mounts.clone(),
            user_workspace: spec.user_workspace.clone(),
            skill_projection: spec.skill_projection.clone(),
            env: spec.env.clone(),
            network: spec.binding.network.clone(),
            cgroup: self.cgroup_name(&spec.sandbox),
            pid,
            init_birth: process_birth(pid).unwrap_or_default(),
            isolation: spec.binding.isolation,
            inherit_env: spec.binding.inherit_env,
            ephemeral: spec.binding.ephemeral,
            branch: spec.binding.branch.clone(),
        };
        let json = serde_json::to_vec_pretty(&identity)
            .map_err(|e| create_error(std::io::Error::other(e)))?;
        if let Err(error) = std::fs::write(dir.join("runtime.json"), json) {
            // Without its record nothing could ever find this runtime again: end it now.
            if let (IsolationTier::Gvisor, Ok(tier)) = (spec.binding.isolation, &self.gvisor) {
                let _ = tier.destroy(&spec.sandbox).await;
            }
            kill_and_wait(&identity).await;
            return Err(create_error(error));
        }
        Ok(identity)
    }

    /// Starts a kernel-tier runtime: a launcher (`warren __runtime-init`) builds it and
    /// answers init's pid.
    async fn launch_init(&self, spec: &RuntimeSpec, dir: &Path) -> Result<i32, BackendError> {
        let create_error = |source| BackendError::Create {
            sandbox: spec.sandbox.clone(),
            source,
        };
        let config = RuntimeConfig {
            sandbox: spec.sandbox.to_string(),
            generation: spec.generation,
            cgroup_name: self.cgroup_name(&spec.sandbox),
            runtime_dir: dir.to_owned(),
            layout: spec.binding.layout,
            extra_mounts: spec.binding.extra_mounts.clone(),
            mounts: spec.mounts().iter().map(MountConfig::from).collect(),
            root: self.roots[&spec.binding.layout].clone(),
            limits: self.config.limits.clone(),
            egress: spec.binding.network.has_egress(),
            user_namespace: self.user_namespace,
            cgroups: self.cgroups_enabled,
            seed: spec.seed.clone(),
        };
        let input =
            serde_json::to_vec(&config).map_err(|e| create_error(std::io::Error::other(e)))?;
        let mut launcher = self.launchers.take().map_err(create_error)?;
        if launcher.stdin.write_all(&input).await.is_err() {
            // A waiting launcher that died meanwhile (its task reaped it): start a fresh one.
            launcher = spawn_launcher(&self.config.init_program).map_err(create_error)?;
            launcher
                .stdin
                .write_all(&input)
                .await
                .map_err(create_error)?;
        }
        let Launcher {
            stdin,
            mut stdout,
            exited,
        } = launcher;
        drop(stdin);
        let mut answer = String::new();
        stdout
            .read_to_string(&mut answer)
            .await
            .map_err(create_error)?;
        // The launcher exits right after its answer; its task has reaped it (or does now).
        let _ = exited.await;
        #[derive(Deserialize)]
        struct Answer {
            pid: Option<i32>,
            error: Option<String>,
        }
        let answer: Answer = serde_json::from_str(answer.trim()).map_err(|_| {
            create_error(std::io::Error::other(format!(
                "the runtime launcher answered {:?}",
                answer.trim()
            )))
        })?;
        match (answer.pid, answer.error) {
            (Some(pid), None) => Ok(pid),
            (_, error) => Err(create_error(std::io::Error::other(
                error.unwrap_or_else(|| "no answer".into()),
            ))),
        }
    }

    /// Kills the runtime's init (and with it its whole pid namespace), its cgroups, and
    /// removes its host directory. Safe to repeat.
    async fn teardown(&self, sandbox: &SandboxId) -> Result<(), IsolationError> {
        let dir = self.runtime_dir(sandbox);
        let identity = self.lock().remove(sandbox).or_else(|| read_identity(&dir));
        if let Ok(tier) = &self.gvisor {
            // A gVisor runtime, or a container a crash left before its record was written.
            let gvisor = identity
                .as_ref()
                .is_some_and(|i| i.isolation == IsolationTier::Gvisor);
            if gvisor || tier.has_container(sandbox) {
                tier.destroy(sandbox).await?;
            }
        }
        if let Some(identity) = identity {
            // A gVisor runtime's sandbox process is gone now: this finds nothing to kill.
            kill_and_wait(&identity).await;
        }
        let cgroups = self.cgroups.clone();
        let name = self.cgroup_name(sandbox);
        let cgroups_enabled = self.cgroups_enabled;
        tokio::task::spawn_blocking(move || -> Result<(), IsolationError> {
            if !cgroups_enabled {
                return Ok(());
            }
            if let Some(cgroup) =
                SandboxCgroup::open(&cgroups, &name).map_err(IsolationError::Cgroup)?
            {
                cgroup.kill_all().map_err(IsolationError::Cgroup)?;
                cgroup.remove().map_err(IsolationError::Cgroup)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| IsolationError::Teardown(std::io::Error::other(e)))??;
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(IsolationError::Teardown(e)),
            _ => Ok(()),
        }
    }
}

fn read_identity(dir: &Path) -> Option<RuntimeIdentity> {
    let text = std::fs::read(dir.join("runtime.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

/// SIGKILL to init ends the whole pid namespace; then wait until it is gone (and reap it
/// when it became our child through subreaping).
async fn kill_and_wait(identity: &RuntimeIdentity) {
    let Some(pid) = rustix::process::Pid::from_raw(identity.pid) else {
        return;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    // The pidfd pins the process; only if it still is this runtime's init (same boot,
    // same start time) may it be killed. After a reboot or a reaped init the pid may
    // belong to anything on the host.
    if process_birth(identity.pid).as_deref() != Some(identity.init_birth.as_str()) {
        tracing::warn!(
            pid = identity.pid,
            "the recorded init pid now names another process; not killing it"
        );
        return;
    }
    let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
    let _ = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG) {
                Ok(Some(_)) => return,
                // Not our child: it belongs to an earlier provisioner's reaper; watch /proc.
                Err(rustix::io::Errno::CHILD)
                    if !Path::new(&format!("/proc/{}", pid.as_raw_nonzero())).exists() =>
                {
                    return
                }
                _ => {}
            }
            if Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    })
    .await;
}

#[async_trait]
impl Backend for LocalBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Local
    }

    fn attach_egress(&self, broker: warren_backend::SharedBroker) {
        let _ = self.egress_broker.set(broker);
    }

    fn capabilities(&self) -> Capabilities {
        let enforceable = self.enforceable();
        Capabilities {
            exec: true,
            isolation: true,
            survives_restart: true,
            resource_limits: enforceable.memory && enforceable.pids,
            gvisor: self.gvisor.is_ok(),
            host_mounts: true,
        }
    }

    fn gvisor_unavailable(&self, kind: BackendKind) -> Option<String> {
        if kind != BackendKind::Local {
            return Some(format!("the {} backend has no gVisor tier", kind.as_str()));
        }
        self.gvisor.as_ref().err().cloned()
    }

    fn warnings(&self) -> Vec<String> {
        let mut warnings = self.report.warnings();
        if self.user_namespace.is_some() {
            warnings.push(
                "unprivileged mode: runtimes run in a user namespace without cgroups; installs into /usr/local are not possible".to_owned(),
            );
        }
        let enforceable = self.enforceable();
        for (ok, what) in [
            (
                enforceable.memory,
                "memory limits are not enforced: no memory cgroup controller",
            ),
            (
                enforceable.pids,
                "process limits are not enforced: no pids cgroup controller",
            ),
            (
                enforceable.cpu,
                "CPU quotas are not enforced: no cpu cgroup controller",
            ),
            (
                enforceable.tree_kill,
                "timeouts kill by process group only: no cgroup to kill a whole tree",
            ),
        ] {
            if !ok {
                warnings.push(what.to_owned());
            }
        }
        warnings
    }

    async fn create(&self, spec: &RuntimeSpec) -> Result<DiscoveredRuntime, BackendError> {
        if let Some(identity) = self.find(&spec.sandbox).await {
            if identity.serves(spec) {
                return Ok(DiscoveredRuntime { spec: spec.clone() });
            }
        }
        let identity = match self.launch(spec).await {
            Ok(identity) => identity,
            Err(error) => {
                // The launcher made the sandbox's cgroups and directory before init failed
                // to build the root: nothing else would ever remove them.
                if let Err(cleanup) = self.teardown(&spec.sandbox).await {
                    tracing::error!(sandbox = %spec.sandbox, error = %cleanup, "could not clean up a runtime that failed to start");
                }
                return Err(error);
            }
        };
        self.adopt(&spec.sandbox, identity);
        Ok(DiscoveredRuntime { spec: spec.clone() })
    }

    /// Lists the runtimes that answer on their control socket with the identity their
    /// directory records. Runtime directories that do not answer (init died, the host
    /// rebooted) are cleaned up on the way: processes, cgroups and directory.
    async fn discover(&self) -> Result<Vec<DiscoveredRuntime>, BackendError> {
        let Ok(entries) = std::fs::read_dir(&self.runtimes_dir) else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        let mut claimed = Vec::new();
        for entry in entries.flatten() {
            let identity = read_identity(&entry.path()).filter(|identity| {
                let answer = ping(&identity.socket_dir(&entry.path()));
                answer.as_ref().is_some_and(|(sandbox, generation)| {
                    *sandbox == identity.sandbox && *generation == identity.generation
                })
            });
            let identity = match (identity, &self.gvisor) {
                // A gVisor runtime is adopted only while runsc runs it with the sandbox
                // process its record names (issue 19).
                (Some(identity), Ok(tier)) if identity.isolation == IsolationTier::Gvisor => {
                    let sandbox = SandboxId::parse(&identity.sandbox).ok();
                    match sandbox {
                        Some(sandbox) if tier.runs(&sandbox, identity.pid).await => {
                            claimed.push(tier.container_id(&sandbox));
                            Some(identity)
                        }
                        _ => None,
                    }
                }
                (Some(identity), Err(_)) if identity.isolation == IsolationTier::Gvisor => None,
                (identity, _) => identity,
            };
            let Some(identity) = identity else {
                let name = entry.file_name();
                if let Some(sandbox) = name.to_str().and_then(|n| SandboxId::parse(n).ok()) {
                    tracing::warn!(%sandbox, "cleaning up a runtime that no longer answers");
                    // A leftover that cannot be removed now (a zombie init nobody reaps)
                    // must not keep the provisioner from starting; the next start retries.
                    if let Err(error) = self.teardown(&sandbox).await {
                        tracing::error!(%sandbox, %error, "could not clean up a dead runtime");
                    }
                }
                continue;
            };
            let spec = identity.spec();
            if let Some(spec) = spec {
                if !self.lock().contains_key(&spec.sandbox) {
                    self.adopt(&spec.sandbox, identity.clone());
                }
                found.push(DiscoveredRuntime { spec });
            }
        }
        if self.cgroups_enabled {
            // Cgroups of this instance whose runtime directory is gone (a crash between
            // removing the directory and the cgroups) are reclaimed; other instances'
            // are not ours to touch.
            let prefix = format!("{}-", self.instance);
            let runtimes = self.runtimes_dir.clone();
            let keep = move |name: &str| match name.strip_prefix(&prefix) {
                Some(sandbox) => runtimes.join(sandbox).exists(),
                None => true,
            };
            if let Err(error) = crate::cgroup::remove_stale(&self.cgroups, &keep) {
                tracing::warn!(%error, "could not reclaim stale cgroups");
            }
        }
        if let Ok(tier) = &self.gvisor {
            // Containers no answering runtime claims: a crash between starting one and
            // recording it, or a record removed under it.
            if let Err(error) = tier.sweep(&claimed).await {
                tracing::warn!(%error, "could not sweep leftover gVisor containers");
            }
        }
        Ok(found)
    }

    async fn start_process(
        &self,
        sandbox: &SandboxId,
        request: &warren_backend::ProcessRequest,
    ) -> Result<warren_backend::ProcessStart, BackendError> {
        let identity = self
            .find(sandbox)
            .await
            .ok_or_else(|| BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            })?;
        let spec = warren_agent::client::process_spec(
            request,
            identity.layout.layout(),
            &identity.network,
            &identity.env,
        );
        let started = warren_agent::client::start_process(
            &identity.socket_dir(&self.runtime_dir(sandbox)),
            spec,
            sandbox,
        )
        .await;
        started.map_err(|error| {
            if error.is_gone() {
                self.lock().remove(sandbox);
            }
            error.into_backend(sandbox)
        })
    }

    async fn processes(
        &self,
        sandbox: &SandboxId,
        quiet: &[i32],
    ) -> Result<Option<u64>, BackendError> {
        let Some(identity) = self.lock().get(sandbox).cloned() else {
            return Ok(None);
        };
        let dir = identity.socket_dir(&self.runtime_dir(sandbox));
        let quiet = quiet.to_vec();
        let answer = tokio::task::spawn_blocking(move || activity(&dir, &quiet))
            .await
            .ok()
            .flatten();
        Ok(answer.map(|(_, _, processes)| processes))
    }

    async fn runtime_file(
        &self,
        sandbox: &SandboxId,
        op: &warren_backend::FileOp,
        data: Vec<u8>,
    ) -> Result<warren_backend::FileReply, BackendError> {
        let Some(identity) = self.find(sandbox).await else {
            return Err(BackendError::RuntimeNotFound {
                sandbox: sandbox.clone(),
            });
        };
        let socket_dir = identity.socket_dir(&self.runtime_dir(sandbox));
        let reply = warren_agent::client::runtime_file(socket_dir, sandbox, op, data).await;
        if let Err(BackendError::RuntimeNotFound { .. }) = reply {
            // Init died meanwhile: nothing of the runtime runs any more.
            self.lock().remove(sandbox);
        }
        reply
    }

    async fn kill_processes(&self, sandbox: &SandboxId) -> Result<Option<u64>, BackendError> {
        let Some(identity) = self.find(sandbox).await else {
            return Ok(None);
        };
        let socket_dir = identity.socket_dir(&self.runtime_dir(sandbox));
        let killed = warren_agent::client::kill_all_processes(socket_dir, sandbox).await?;
        if killed.is_none() {
            // Init died meanwhile: nothing of the runtime runs any more.
            self.lock().remove(sandbox);
        }
        Ok(killed)
    }

    /// `pids.current` against `pids.max` of the sandbox's cgroup (init and every command),
    /// and the forks refused at that limit so far (`pids.events`).
    async fn process_pressure(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<ProcessPressure>, BackendError> {
        // On gVisor the host cgroup counts the Sentry's tasks, not the runtime's processes
        // (the agent holds those to the limit inside): no figure to compare (issue 19).
        let kernel = |i: &RuntimeIdentity| i.isolation == IsolationTier::Kernel;
        if !self.cgroups_enabled || !self.lock().get(sandbox).is_some_and(kernel) {
            return Ok(None);
        }
        let cgroups = self.cgroups.clone();
        let name = self.cgroup_name(sandbox);
        let stats = tokio::task::spawn_blocking(move || {
            SandboxCgroup::open(&cgroups, &name)
                .ok()
                .flatten()
                .map(|cgroup| cgroup.stats())
        })
        .await
        .ok()
        .flatten();
        Ok(stats.and_then(|stats| {
            Some(ProcessPressure {
                current: stats.pids_current?,
                max: stats.pids_max,
                refused: stats.pids_refused,
            })
        }))
    }

    /// The sandbox cgroup's own accounting (init and every command, I22) and the limits
    /// written there (I23): v2 `cpu.stat`, `memory.current`, `memory.max`, `memory.stat`
    /// and `cpu.max`; on v1 hierarchies `cpuacct.usage`, `memory.usage_in_bytes`,
    /// `memory.limit_in_bytes`, `memory.stat`'s `total_cache` and the CFS quota, each
    /// figure from whichever hierarchy has it (v2 first), as `CgroupStats` reads them.
    ///
    /// `None` in unprivileged mode: runtimes get no cgroup there, and nothing else
    /// accounts for a runtime as a whole (`/proc` of its processes would miss whatever
    /// exited and count shared pages twice). Also `None` without a CPU or memory
    /// controller to read: half a figure would be reported as a whole one.
    async fn usage(&self, sandbox: &SandboxId) -> Result<Option<RuntimeUsage>, BackendError> {
        let Some(identity) = self.find(sandbox).await.filter(|_| self.cgroups_enabled) else {
            return Ok(None);
        };
        let cgroups = self.cgroups.clone();
        let name = self.cgroup_name(sandbox);
        let stats = tokio::task::spawn_blocking(move || {
            let mut stats = SandboxCgroup::open(&cgroups, &name).ok().flatten()?.stats();
            if identity.isolation == IsolationTier::Gvisor && stats.cpu_usage_usec.is_none() {
                stats.cpu_usage_usec = crate::runsc::cpuacct_usage_usec(&cgroups, &name);
            }
            Some(stats)
        })
        .await
        .ok()
        .flatten();
        Ok(stats.and_then(|stats| {
            Some(RuntimeUsage {
                cpu_usage_usec: stats.cpu_usage_usec?,
                memory_current: stats.memory_current_bytes?,
                memory_max: stats.memory_max_bytes,
                memory_file: stats.memory_file_bytes,
                cpu_limit_millis: stats.cpu_max_millis,
            })
        }))
    }

    async fn ephemeral_roots(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<EphemeralRoots>, BackendError> {
        let Some(identity) = self.find(sandbox).await else {
            return Ok(None);
        };
        if identity.isolation == IsolationTier::Gvisor {
            // The Sentry holds a gVisor runtime's home: host /proc does not reach it, so
            // the agent sends it (I30, issue 19). The root is read-only: no layer to keep.
            let dir = self.runtime_dir(sandbox);
            return gvisor_home(
                sandbox,
                &identity.socket_dir(&dir),
                &dir.join("snapshot"),
                identity.layout.layout().home_is_ephemeral(),
                self.config.limits.home_bytes,
            )
            .await;
        }
        // Both paths go through init's own view: its descriptor of the copy-on-write layer,
        // and its root for the layout's home (`/home/gem`: "home" lives on the runtime's
        // read-only root, "gem" is the tmpfs itself; nothing the sandbox user can replace).
        // A trailing "." makes the descriptor link itself resolve while the last component
        // stays no-follow. A home that is the persistent workdir (E2B's) is not ephemeral
        // state: only the copy-on-write layer is recorded (I30).
        let pid = identity.pid;
        let layout = identity.layout.layout();
        Ok(Some(EphemeralRoots {
            cow: PathBuf::from(format!("/proc/{pid}/fd/{}/.", crate::config::COW_FD)),
            home: layout
                .home_is_ephemeral()
                .then(|| PathBuf::from(format!("/proc/{pid}/root{}", layout.home))),
        }))
    }

    async fn destroy(&self, sandbox: &SandboxId) -> Result<(), BackendError> {
        let result = self
            .teardown(sandbox)
            .await
            .map_err(|e| BackendError::Destroy {
                sandbox: sandbox.clone(),
                source: std::io::Error::other(e.to_string()),
            });
        if self.lock().is_empty() {
            // No runtime left: launchers waiting for the next one would idle for nobody.
            self.launchers.retire_all();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> serde_json::Value {
        serde_json::json!({
            "sandbox": SandboxId::derive(
                &warren_core::Uid::new("alice").unwrap(),
                &warren_core::RuntimeScope::new("t").unwrap(),
            ).to_string(),
            "generation": 2,
            "uid": "alice",
            "runtime_scope": "t",
            "workdir": "projects/a",
            "user_workspace": "/data/user-data/shared/alice/workspace",
            "skill_projection": "/data/skill-projections/alice",
            "env": {},
            "cgroup": "warren-x",
            "pid": 1,
        })
    }

    #[test]
    fn a_runtime_serves_only_the_binding_it_recorded_and_old_records_read_as_the_defaults() {
        // Recorded before the environment policy was: the defaults.
        let legacy: RuntimeIdentity = serde_json::from_value(identity()).unwrap();
        let spec = legacy.spec().unwrap();
        assert!(spec.binding.inherit_env && !spec.binding.ephemeral);
        assert!(legacy.serves(&spec));
        let mut isolated = spec.clone();
        isolated.binding.inherit_env = false;
        assert!(!legacy.serves(&isolated), "another environment policy");
        let mut value = identity();
        value["inherit_env"] = false.into();
        let recorded: RuntimeIdentity = serde_json::from_value(value).unwrap();
        assert!(recorded.serves(&isolated) && !recorded.serves(&spec));
        let mut other = spec.clone();
        other.binding.layout = warren_core::LayoutName::E2b;
        assert!(!legacy.serves(&other), "another layout");
    }
}
