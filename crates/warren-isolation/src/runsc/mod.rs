//! The local backend's gVisor tier (issue 19): a runtime whose every system call is served
//! by runsc's Sentry, not by the host kernel.
//!
//! ```text
//! warren serve ──spawn──▶ warren __runtime-init gvisor-shim   (subreaper; see `shim`)
//!                               ├─▶ runsc create / start   (--root <data>/runsc)
//!                               └── reaps: runsc-gofer, runsc-sandbox (the Sentry)
//!                                            └─▶ PID 1 inside: warren-agent (Sentry root)
//!                                                  └─fork─▶ command (1000:1000)
//! ```
//!
//! The bundle (`oci`) shows the local runtime's view read-only; the agent is warren's
//! container agent in its gVisor mode, run from the agent bundle, serving the control
//! protocol on `/run/warren/control.sock`, a host socket (`--host-uds=create`) in
//! `<data>/runtimes/<sandbox>/run` (0700, root's), so the provisioner talks to it exactly
//! as to a local runtime's init. Limits are the host cgroup's `warren/<instance>-<sandbox>`
//! (runsc makes it from `cgroupsPath`), so destroy and the start-up sweep find it where
//! they find every local runtime's. Destroy is `runsc kill` + `runsc delete --force` plus
//! the staging and the runtime directory, never the workspace (I15); the start-up sweep
//! deletes every container under warren's runsc root that no answering runtime claims.

mod cli;
mod oci;
pub(crate) mod shim;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use warren_agent::bundle::AgentBundle;
use warren_agent::{sentry_limits, AgentConfig};
use warren_backend::{RuntimeLimits, RuntimeSpec};
use warren_core::SandboxId;

use crate::gvisor::GvisorHost;
use crate::IsolationError;

pub(crate) use oci::SOCKET_MOUNT;

/// How long `runsc create` and `start` may take together.
const START_LIMIT: Duration = Duration::from_secs(30);
/// How long a started sandbox's agent may take to answer.
const AGENT_LIMIT: Duration = Duration::from_secs(20);

/// The gVisor tier of one local backend, once the probe found it usable.
#[derive(Debug)]
pub(crate) struct GvisorTier {
    runsc: cli::Runsc,
    /// warren's own executable, run as the shim.
    program: PathBuf,
    /// The agent bundle (`<data>/runsc-agent`), made on the first gVisor start: a copy of
    /// warren's executable where it cannot be hard-linked, which a server that never
    /// starts a gVisor runtime should not pay for (nor a small data filesystem hold).
    agent: std::sync::Mutex<Option<AgentBundle>>,
    agent_root: PathBuf,
    /// Per-sandbox staging directories of binds beneath a user's tree (`staging`).
    binds: PathBuf,
    instance: String,
}

/// A started gVisor runtime: the host pid of its sandbox process (the Sentry).
pub(crate) struct Started {
    pub(crate) pid: i32,
}

impl GvisorTier {
    /// Prepares the tier's host directories under `data`: runsc's state root
    /// (`<data>/runsc`), the staging directories (`<data>/runsc-binds`, what a crash left
    /// there detached and removed: a started sandbox holds its own mounts). The agent
    /// bundle (`<data>/runsc-agent`) waits for the first launch. Fails with the reason the
    /// tier is unavailable.
    pub(crate) fn prepare(
        host: &GvisorHost,
        data: &Path,
        program: &Path,
        instance: &str,
    ) -> Result<Self, String> {
        let (Some(runsc), Some(platform)) = (host.runsc.clone(), host.platform) else {
            return Err(host.reason.clone());
        };
        let root = data.join("runsc");
        let binds = data.join("runsc-binds");
        for dir in [&root, &binds] {
            make_private_dir(dir)
                .map_err(|e| format!("cannot prepare {} for gVisor: {e}", dir.display()))?;
        }
        warren_backend::staging::remove_all(&binds)
            .map_err(|e| format!("cannot remove leftover gVisor staging mounts: {e}"))?;
        Ok(Self {
            runsc: cli::Runsc {
                program: runsc,
                root,
                platform: platform.as_str(),
            },
            program: program.to_owned(),
            agent: std::sync::Mutex::new(None),
            agent_root: data.join("runsc-agent"),
            binds,
            instance: instance.to_owned(),
        })
    }

    /// The agent bundle's directory, made on first use.
    fn agent_dir(&self) -> Result<PathBuf, IsolationError> {
        let mut agent = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        if agent.is_none() {
            let prepared =
                AgentBundle::prepare(&self.program, &self.agent_root).map_err(|source| {
                    IsolationError::HostDir {
                        what: "the agent bundle for gVisor",
                        source,
                    }
                })?;
            *agent = Some(prepared);
        }
        Ok(agent.as_ref().expect("prepared above").dir().to_owned())
    }

    /// The container id of a sandbox's runtime: unique per warren instance and sandbox.
    pub(crate) fn container_id(&self, sandbox: &SandboxId) -> String {
        format!("warren-{}-{}", self.instance, sandbox)
    }

    /// Whether runsc's state root holds a container of `sandbox` (a cheap look, with no
    /// runsc call: its state files are named after the container).
    pub(crate) fn has_container(&self, sandbox: &SandboxId) -> bool {
        let id = self.container_id(sandbox);
        std::fs::read_dir(&self.runsc.root).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|entry| entry.file_name().to_string_lossy().contains(&id))
        })
    }

    /// Starts the runtime of `spec` in `dir` (its fresh runtime directory) and waits for
    /// its agent to answer as this sandbox and generation.
    pub(crate) async fn launch(
        &self,
        spec: &RuntimeSpec,
        dir: &Path,
        etc: &Path,
        limits: &RuntimeLimits,
        cgroup_name: &str,
    ) -> Result<Started, IsolationError> {
        let socket_dir = dir.join("run");
        make_private_dir(&socket_dir).map_err(|source| IsolationError::HostDir {
            what: "the runtime's socket directory",
            source,
        })?;
        let mounts = spec.mounts();
        // Dropped (staging mounts detached, directories removed) once the sandbox runs,
        // and on every way out before that.
        let staged =
            warren_backend::staging::StagedBinds::stage(&self.binds, &spec.sandbox, &mounts)
                .map_err(IsolationError::from_staging)?;
        let layout = spec.binding.layout.layout();
        let agent = AgentConfig {
            sandbox: spec.sandbox.to_string(),
            generation: spec.generation,
            nofile: limits.nofile,
            // --network=none: loopback only; the agent relays its proxy port's
            // connections to the provisioner's egress, which applies the policy.
            egress: spec.binding.network.has_egress(),
            socket_dir: Some(PathBuf::from(SOCKET_MOUNT)),
            listen: None,
            home: layout
                .home_is_ephemeral()
                .then(|| PathBuf::from(layout.home)),
            gvisor: true,
            // The host's pids cgroup counts the Sentry's tasks: the agent bounds the
            // sandbox user's processes inside.
            max_processes: limits.pids_max.map(sentry_limits::sandbox_processes),
            max_address_space: limits.memory_bytes.map(sentry_limits::address_space),
        };
        let agent_dir = self.agent_dir()?;
        let bundle = oci::BundleSpec {
            layout,
            mounts: &mounts,
            sources: (0..mounts.len()).map(|i| staged.source(i)).collect(),
            etc,
            agent: &agent_dir,
            socket_dir: &socket_dir,
            agent_config: serde_json::to_string(&agent)
                .map_err(std::io::Error::other)
                .map_err(|source| IsolationError::HostDir {
                    what: "the agent config",
                    source,
                })?,
            limits,
            cgroups_path: format!("/{}/{cgroup_name}", crate::cgroup::ROOT_DIR),
        };
        oci::write_bundle(dir, &bundle).map_err(|source| IsolationError::HostDir {
            what: "the runtime's OCI bundle",
            source,
        })?;
        let id = self.container_id(&spec.sandbox);
        let log = dir.join("runsc.log");
        self.start(dir, &id, &log).await?;
        self.wait_for_agent(spec, &socket_dir, &id, &log).await?;
        // The gofer holds its own copies of the staged mounts now.
        drop(staged);
        if let (Some(seed), true) = (&spec.seed, spec.binding.layout.layout().home_is_ephemeral()) {
            // Resuming a reaped runtime (I30): the home comes back through the agent, as a
            // tar stream (the Sentry holds its tmpfs; host /proc does not reach it). A seed
            // that cannot be copied leaves a fresh home, never a failed start.
            let (home, dir) = (seed.join("home"), socket_dir.clone());
            let limit = limits.home_bytes;
            let seeded = tokio::task::spawn_blocking(move || {
                warren_agent::client::restore_home(&dir, &home, limit)
            })
            .await;
            match seeded {
                Ok(Ok(_)) => {}
                Ok(Err(
                    warren_agent::client::RunError::Gone(error)
                    | warren_agent::client::RunError::Io(error),
                )) => {
                    tracing::warn!(sandbox = %spec.sandbox, %error, "could not restore the home from the snapshot; it starts empty");
                }
                Err(error) => {
                    tracing::warn!(sandbox = %spec.sandbox, %error, "could not restore the home from the snapshot; it starts empty");
                }
            }
        }
        let state = self.runsc.state(&id).await.filter(|s| s.pid > 0);
        let Some(state) = state else {
            return Err(IsolationError::Gvisor(format!(
                "the sandbox stopped right after it started: {}",
                cli::log_tail(&log)
            )));
        };
        Ok(Started { pid: state.pid })
    }

    /// `runsc create` + `start`, through the shim.
    async fn start(&self, dir: &Path, id: &str, log: &Path) -> Result<(), IsolationError> {
        let request = shim::ShimRequest {
            runsc: self.runsc.program.clone(),
            global: self.runsc.global_args(),
            bundle: dir.to_owned(),
            id: id.to_owned(),
            log: log.to_owned(),
        };
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            IsolationError::Gvisor(format!("cannot {what} the gVisor shim: {e}"))
        };
        let mut child = tokio::process::Command::new(&self.program)
            // What /proc shows; never the host path of warren's executable (I1).
            .arg0("warren-gvisor-shim")
            .arg(crate::RUNTIME_INIT_ARG)
            .arg(shim::SHIM_ARG)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Its own process group: a terminal's ^C to warren never reaches the sandbox.
            .process_group(0)
            .spawn()
            .map_err(|e| failed("start", &e))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(failed("talk to", &"its stdio is not piped"));
        };
        let input = serde_json::to_vec(&request).map_err(|e| failed("instruct", &e))?;
        stdin
            .write_all(&input)
            .await
            .map_err(|e| failed("instruct", &e))?;
        drop(stdin);
        // The shim lives as long as the sandbox; this task reaps it when it ends.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        let mut line = String::new();
        let mut reader = tokio::io::BufReader::new(stdout);
        match tokio::time::timeout(START_LIMIT, reader.read_line(&mut line)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(failed("hear from", &e)),
            Err(_) => {
                return Err(IsolationError::Gvisor(format!(
                    "runsc did not create and start the sandbox within {} s",
                    START_LIMIT.as_secs()
                )))
            }
        }
        #[derive(serde::Deserialize)]
        struct Answer {
            ok: Option<bool>,
            error: Option<String>,
        }
        match serde_json::from_str::<Answer>(line.trim()) {
            Ok(Answer { ok: Some(true), .. }) => Ok(()),
            Ok(Answer {
                error: Some(error), ..
            }) => Err(IsolationError::Gvisor(error)),
            _ => Err(IsolationError::Gvisor(format!(
                "the gVisor shim answered {:?}",
                line.trim()
            ))),
        }
    }

    async fn wait_for_agent(
        &self,
        spec: &RuntimeSpec,
        socket_dir: &Path,
        id: &str,
        log: &Path,
    ) -> Result<(), IsolationError> {
        let deadline = Instant::now() + AGENT_LIMIT;
        let mut checked = Instant::now();
        loop {
            let dir = socket_dir.to_owned();
            let answer = tokio::task::spawn_blocking(move || warren_agent::client::ping(&dir))
                .await
                .ok()
                .flatten();
            if answer.is_some_and(|(s, g)| s == spec.sandbox.as_str() && g == spec.generation) {
                return Ok(());
            }
            if checked.elapsed() > Duration::from_millis(200) {
                checked = Instant::now();
                let running = self
                    .runsc
                    .state(id)
                    .await
                    .is_some_and(|s| s.status == "running");
                if !running {
                    return Err(IsolationError::Gvisor(format!(
                        "the sandbox stopped before its agent answered: {}",
                        cli::log_tail(log)
                    )));
                }
            }
            if Instant::now() > deadline {
                return Err(IsolationError::Gvisor(format!(
                    "the agent did not answer within {} s",
                    AGENT_LIMIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether the sandbox's container runs with the sandbox process `pid`, as recorded.
    pub(crate) async fn runs(&self, sandbox: &SandboxId, pid: i32) -> bool {
        self.runsc
            .state(&self.container_id(sandbox))
            .await
            .is_some_and(|state| state.status == "running" && state.pid == pid)
    }

    /// Kills and deletes the sandbox's container and removes its staging. Safe to repeat;
    /// never touches the workspace (I15).
    pub(crate) async fn destroy(&self, sandbox: &SandboxId) -> Result<(), IsolationError> {
        self.runsc
            .destroy(&self.container_id(sandbox))
            .await
            .map_err(IsolationError::Teardown)?;
        warren_backend::staging::remove(&self.binds.join(sandbox.as_str()))
            .map_err(IsolationError::Teardown)
    }

    /// Deletes every container under warren's runsc root but those `keep` names: what a
    /// crash between starting a sandbox and recording it left, or a runtime whose record
    /// is gone. The root is this data directory's alone: nothing there is another's.
    pub(crate) async fn sweep(&self, keep: &[String]) -> Result<(), IsolationError> {
        let ids = self.runsc.list().await.map_err(IsolationError::Teardown)?;
        for id in ids.iter().filter(|id| !keep.contains(id)) {
            tracing::warn!(container = %id, "deleting a gVisor container no runtime claims");
            self.runsc
                .destroy(id)
                .await
                .map_err(IsolationError::Teardown)?;
        }
        Ok(())
    }
}

/// The CPU time of a gVisor runtime's cgroup from v1's `cpuacct`, where the host also has
/// a v2 hierarchy (hybrid): runsc makes no directory there, so the figure the local
/// runtime reads from v2's `cpu.stat` is missing for it.
pub(crate) fn cpuacct_usage_usec(
    support: &crate::cgroup::CgroupSupport,
    name: &str,
) -> Option<u64> {
    let mount = support.v1_mount("cpuacct")?;
    let path = mount
        .join(crate::cgroup::ROOT_DIR)
        .join(name)
        .join("cpuacct.usage");
    let ns: u64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    Some(ns / 1000)
}

/// Makes `dir` (and its parents) with the last component root's and 0700.
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        other => other?,
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}
