//! One pod's life on its own thread: scheduling, its sandbox and volumes, and starting,
//! waiting for and probing its containers from a plan of each.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, ContainerStateTerminated, Pod, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::StatusReporter;

use super::host::kill_container;
use super::network::make_network;
use super::status::{container_id, now, requested_cpu_millis, StatusBook};
use super::view::{normalise, q, View};
use super::volumes::{prepare_volumes, sub_path, VolumeHost};
use super::{
    lock, safe_name, Network, PodRun, Settings, BINARY_IN_CONTAINER, DEFAULT_CAPABILITIES,
    PROBE_FOR, SETUP_EXIT, SETUP_FAILED, TICK,
};

pub(super) fn run_pod(settings: &Settings, run: &PodRun, pod: &Pod, reporter: &StatusReporter) {
    let spec = pod.spec.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut status = StatusBook::new(run, reporter, &spec);

    // Scheduling.
    let requested = requested_cpu_millis(&spec);
    if requested > u128::from(settings.cpu_capacity_millis) {
        status.unschedulable(format!(
            "0/1 nodes are available: 1 Insufficient cpu (the pod requests {requested}m, \
             the simulated node has {}m).",
            settings.cpu_capacity_millis
        ));
        return;
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(claim) = &volume.persistent_volume_claim {
            if !settings.claims.contains_key(&claim.claim_name) {
                status.unschedulable(format!(
                    "0/1 nodes are available: persistentvolumeclaim \"{}\" not found.",
                    claim.claim_name
                ));
                return;
            }
        }
    }
    status.scheduled();

    // Images: "pulled" before the sandbox is made.
    let images = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| (true, c))
        .chain(spec.containers.iter().map(|c| (false, c)));
    for (init, container) in images {
        let image = container.image.clone().unwrap_or_default();
        if settings.unpullable.contains(&image) {
            status.pull_failed(init, &container.name, &image);
            return;
        }
    }

    // The pod's sandbox: its network.
    if run.is_deleted() {
        return;
    }
    let network = match make_network(settings) {
        Ok(network) => network,
        Err(error) => {
            status.sandbox_failed(&error);
            return;
        }
    };
    run.hold(|resources| resources.network = Some(network.clone()));
    if run.is_deleted() {
        return;
    }
    status.sandbox_ready(&network);

    // Volumes.
    let volumes = match prepare_volumes(settings, run, &spec) {
        Ok(volumes) => volumes,
        Err(error) => {
            status.sandbox_failed(&error);
            return;
        }
    };

    let restart_never = spec.restart_policy.as_deref() == Some("Never");
    let context = PodContext {
        settings,
        run,
        name: &name,
        spec: &spec,
        volumes: &volumes,
        network: &network,
    };

    // Init containers, in order, each to completion.
    for (i, container) in spec.init_containers.iter().flatten().enumerate() {
        if run.is_deleted() {
            return;
        }
        let mut child = match context.start(container, &format!("init-{i}")) {
            Ok(child) => child,
            Err(Refused::Gone) => return,
            Err(Refused::Config { reason, message }) => {
                status.init_waiting(i, reason, message);
                return;
            }
        };
        status.init_running(i);
        let Some(exit) = context.wait(&mut child) else {
            return;
        };
        let terminated = context.terminated(container, exit);
        let failed = terminated.exit_code != 0;
        status.init_terminated(i, terminated);
        if failed {
            status.init_failed(i, restart_never);
            return;
        }
    }
    status.initialized();

    // The containers.
    let mut live: Vec<(usize, Child, Option<u16>)> = Vec::new();
    for (i, container) in spec.containers.iter().enumerate() {
        if run.is_deleted() {
            break;
        }
        match context.start(container, &format!("main-{i}")) {
            Ok(child) => {
                status.running(i, readiness_port(container).is_none());
                live.push((i, child, readiness_port(container)));
            }
            Err(Refused::Gone) => break,
            Err(Refused::Config { reason, message }) => status.waiting(i, reason, message),
        }
    }
    if run.is_deleted() {
        for (_, child, _) in &mut live {
            context.reap(child);
        }
        return;
    }
    status.report();

    let all_started = live.len() == spec.containers.len();
    let probing_until = Instant::now() + PROBE_FOR;
    while !live.is_empty() {
        std::thread::sleep(TICK);
        if run.is_deleted() {
            for (_, child, _) in &mut live {
                context.reap(child);
            }
            return;
        }
        let mut changed = false;
        let mut still = Vec::new();
        for (i, mut child, port) in live {
            match context.try_wait(&mut child) {
                Some(exit) => {
                    let terminated = context.terminated(&spec.containers[i], exit);
                    status.terminated(i, terminated);
                    changed = true;
                }
                None => {
                    if let Some(p) = port {
                        if Instant::now() < probing_until
                            && probe(SocketAddr::from((network.pod_ip, p)))
                        {
                            status.ready(i);
                            changed = true;
                            still.push((i, child, None));
                            continue;
                        }
                    }
                    still.push((i, child, port));
                }
            }
        }
        live = still;
        if changed {
            status.report();
        }
    }
    // A container that never started keeps the pod from completing, as on a kubelet
    // (which would retry it).
    if all_started {
        status.completed(spec.containers.len());
    }
}

/// What a container's start needs of its pod.
struct PodContext<'a> {
    settings: &'a Settings,
    run: &'a PodRun,
    name: &'a str,
    spec: &'a PodSpec,
    volumes: &'a BTreeMap<String, VolumeHost>,
    network: &'a Network,
}

/// Why a container did not start.
enum Refused {
    /// The pod was deleted meanwhile.
    Gone,
    /// What a kubelet reports as the container's waiting reason.
    Config {
        reason: &'static str,
        message: String,
    },
}

impl Refused {
    fn config(message: impl Into<String>) -> Self {
        Self::Config {
            reason: "CreateContainerConfigError",
            message: message.into(),
        }
    }

    fn create(message: impl Into<String>) -> Self {
        Self::Config {
            reason: "CreateContainerError",
            message: message.into(),
        }
    }
}

impl PodContext<'_> {
    /// Starts `container` (its root, mounts, user, capabilities, environment), logging to
    /// `<logs>/<name>.log`; `slot` names its root directory.
    fn start(&self, container: &Container, slot: &str) -> Result<Child, Refused> {
        let plan = self.plan(container, slot)?;
        fs::create_dir_all(&self.run.log_dir)
            .map_err(|e| Refused::create(format!("create the log dir: {e}")))?;
        let log_path = self
            .run
            .log_dir
            .join(format!("{}.log", safe_name(&container.name)));
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| Refused::create(format!("open the container's log: {e}")))?;
        // What the container's PID 1 runs before the command, for whoever debugs a test.
        let _ = fs::write(
            self.run
                .log_dir
                .join(format!("{}.setup.sh", safe_name(&container.name))),
            &plan.script,
        );
        let log_err = log
            .try_clone()
            .map_err(|e| Refused::create(format!("open the container's log: {e}")))?;
        let tools = &self.settings.tools;
        let mut command = Command::new(&tools.setpriv);
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(&tools.nsenter)
            .arg(format!("--net=/run/netns/{}", self.network.name))
            .arg("--")
            .arg(&tools.unshare)
            .args([
                "--mount",
                "--uts",
                "--ipc",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--propagation",
                "private",
                "--",
            ])
            .arg(&tools.sh)
            .arg("-c")
            .arg(&plan.script)
            .arg("sh")
            .args(&plan.argv)
            .env_clear()
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        let mut running = lock(&self.run.running);
        if self.run.is_deleted() {
            return Err(Refused::Gone);
        }
        let child = command
            .spawn()
            .map_err(|e| Refused::create(format!("start {}: {e}", tools.setpriv.display())))?;
        running.push(child.id());
        Ok(child)
    }

    /// Waits for a container to exit; `None` when the pod was deleted meanwhile.
    fn wait(&self, child: &mut Child) -> Option<ExitStatus> {
        loop {
            if let Some(exit) = self.try_wait(child) {
                return (!self.run.is_deleted()).then_some(exit);
            }
            if self.run.is_deleted() {
                self.reap(child);
                return None;
            }
            std::thread::sleep(TICK);
        }
    }

    /// Reaps the container if it exited (and forgets its pid, under the same lock).
    fn try_wait(&self, child: &mut Child) -> Option<ExitStatus> {
        let mut running = lock(&self.run.running);
        let exit = child.try_wait().ok().flatten()?;
        running.retain(|pid| *pid != child.id());
        Some(exit)
    }

    /// Kills the container and reaps it.
    fn reap(&self, child: &mut Child) {
        loop {
            if self.try_wait(child).is_some() {
                return;
            }
            {
                let running = lock(&self.run.running);
                if running.contains(&child.id()) {
                    kill_container(child.id());
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The terminated state of a container that exited with `exit`.
    fn terminated(&self, container: &Container, exit: ExitStatus) -> ContainerStateTerminated {
        let log = self
            .run
            .log_dir
            .join(format!("{}.log", safe_name(&container.name)));
        let tail = log_tail(&log);
        let (mut exit_code, signal) = match (exit.code(), exit.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(signal)) => (128 + signal, Some(signal)),
            (None, None) => (128, None),
        };
        let mut reason = if exit_code == 0 { "Completed" } else { "Error" };
        let mut message = None;
        if exit_code == SETUP_EXIT && tail.contains(SETUP_FAILED) {
            // As runc's failures before the command runs: exit 128, StartError.
            exit_code = 128;
            reason = "StartError";
            message = Some(tail.clone());
        } else if exit_code != 0
            && container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError")
        {
            message = Some(tail);
        }
        ContainerStateTerminated {
            container_id: Some(container_id(self.name, &container.name)),
            exit_code,
            signal,
            reason: Some(reason.to_owned()),
            message: message.filter(|m| !m.is_empty()),
            started_at: None,
            finished_at: Some(now()),
        }
    }

    /// The container's setup script, command and environment.
    fn plan(&self, container: &Container, slot: &str) -> Result<Launch, Refused> {
        let settings = self.settings;
        let pod_context = self.spec.security_context.clone().unwrap_or_default();
        let context = container.security_context.clone().unwrap_or_default();
        let uid = context.run_as_user.or(pod_context.run_as_user).unwrap_or(0);
        let gid = context
            .run_as_group
            .or(pod_context.run_as_group)
            .unwrap_or(0);
        let non_root = context
            .run_as_non_root
            .or(pod_context.run_as_non_root)
            .unwrap_or(false);
        if non_root && uid == 0 {
            return Err(Refused::config(
                "container has runAsNonRoot and image will run as root",
            ));
        }
        let privileged = context.privileged.unwrap_or(false);
        let mut capabilities: Vec<String> = if privileged {
            Vec::new()
        } else {
            DEFAULT_CAPABILITIES.map(str::to_owned).to_vec()
        };
        if let Some(changes) = &context.capabilities {
            for dropped in changes.drop.iter().flatten() {
                let dropped = capability_name(dropped);
                if dropped == "all" {
                    capabilities.clear();
                } else {
                    capabilities.retain(|c| *c != dropped);
                }
            }
            for added in changes.add.iter().flatten() {
                let added = capability_name(added);
                if !capabilities.contains(&added) {
                    capabilities.push(added);
                }
            }
        }
        let no_new_privs = context.allow_privilege_escalation == Some(false);
        let read_only_root = context.read_only_root_filesystem.unwrap_or(false);

        // The command.
        let mut argv: Vec<String> = container
            .command
            .iter()
            .flatten()
            .chain(container.args.iter().flatten())
            .cloned()
            .collect();
        if argv.is_empty() {
            return Err(Refused::create(
                "no command specified (the simulated kubelet has no image entrypoint)",
            ));
        }
        substitute_warren(&mut argv);

        // The environment.
        let mut env: Vec<(String, String)> = Vec::new();
        for var in container.env.iter().flatten() {
            if var.value_from.is_some() {
                return Err(Refused::config(format!(
                    "env {}: valueFrom is not modelled by the simulated kubelet",
                    var.name
                )));
            }
            env.retain(|(k, _)| *k != var.name);
            env.push((var.name.clone(), var.value.clone().unwrap_or_default()));
        }
        let hostname = self
            .spec
            .hostname
            .clone()
            .unwrap_or_else(|| self.name.to_owned());
        let hostname: String = hostname.chars().take(63).collect();
        for (key, value) in [
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            ),
            ("HOSTNAME", hostname.clone()),
            ("HOME", home_of(uid)),
        ] {
            if !env.iter().any(|(k, _)| k == key) {
                env.push((key.to_owned(), value));
            }
        }

        // The mounts, shallowest first (as the container's mount points nest).
        let mut mounts = Vec::new();
        for mount in container.volume_mounts.iter().flatten() {
            if mount.sub_path_expr.is_some() {
                return Err(Refused::config(format!(
                    "volume mount {}: subPathExpr is not modelled",
                    mount.mount_path
                )));
            }
            let target = normalise(&mount.mount_path).ok_or_else(|| {
                Refused::create(format!(
                    "mount path {:?} is not an absolute path without '..'",
                    mount.mount_path
                ))
            })?;
            let volume = self.volumes.get(&mount.name).ok_or_else(|| {
                Refused::config(format!(
                    "volume mount {target}: no volume named {:?}",
                    mount.name
                ))
            })?;
            let (root, volume_read_only) = match volume {
                VolumeHost::EmptyDir(dir) => (dir, false),
                VolumeHost::Claim { dir, read_only } => (dir, *read_only),
            };
            let source = sub_path(root, mount.sub_path.as_deref().unwrap_or(""))
                .map_err(|e| Refused::create(format!("volume mount {target}: {e}")))?;
            mounts.push(VolumeMountPlan {
                is_dir: source.is_dir(),
                target,
                source,
                read_only: mount.read_only.unwrap_or(false) || volume_read_only,
            });
        }
        mounts.sort_by_key(|m| m.target.matches('/').count());

        // The root.
        let root = self.run.dir.join("rootfs").join(safe_name(slot));
        fs::create_dir_all(&root)
            .map_err(|e| Refused::create(format!("create {}: {e}", root.display())))?;
        let root = root
            .to_str()
            .ok_or_else(|| Refused::create("the state dir is not UTF-8"))?
            .to_owned();
        let mut view = View::new(&settings.tools, root);
        view.base(settings)
            .map_err(|e| Refused::create(format!("build the container's root: {e}")))?;
        for mount in &mounts {
            view.bind_volume(mount)
                .map_err(|e| Refused::create(format!("mount {}: {e}", mount.target)))?;
        }
        let working_dir = container.working_dir.clone().unwrap_or_else(|| "/".into());

        // setpriv, as the container's user.
        let mut setpriv = vec![
            q(&settings.tools.setpriv.display().to_string()),
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
        ];
        let groups = pod_context.supplemental_groups.unwrap_or_default();
        if groups.is_empty() {
            setpriv.push("--clear-groups".into());
        } else {
            let groups: Vec<String> = groups.iter().map(i64::to_string).collect();
            setpriv.push(format!("--groups={}", groups.join(",")));
        }
        if !privileged {
            let mut bounding = vec!["-all".to_owned()];
            bounding.extend(capabilities.iter().map(|c| format!("+{c}")));
            setpriv.push(format!("--bounding-set={}", bounding.join(",")));
            setpriv.push("--inh-caps=-all".into());
        }
        if no_new_privs {
            setpriv.push("--no-new-privs".into());
        }
        setpriv.push("--pdeathsig=keep".into());
        let script = view.finish(&hostname, read_only_root, &working_dir, &setpriv.join(" "));
        Ok(Launch { script, argv, env })
    }
}

struct Launch {
    script: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

pub(super) struct VolumeMountPlan {
    pub(super) target: String,
    pub(super) source: PathBuf,
    pub(super) read_only: bool,
    pub(super) is_dir: bool,
}

/// A command naming `warren` (warren's image) runs the configured binary. Anything else
/// (the agent bundle's loader among them) runs as it is.
fn substitute_warren(argv: &mut [String]) {
    let named_warren = |arg: &str| Path::new(arg).file_name().is_some_and(|n| n == "warren");
    if named_warren(&argv[0]) {
        argv[0] = BINARY_IN_CONTAINER.to_owned();
    }
}

fn capability_name(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    lower.strip_prefix("cap_").unwrap_or(&lower).to_owned()
}

/// The home of `uid` in the host's `/etc/passwd` (the "image's"), or `/`.
fn home_of(uid: i64) -> String {
    fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.len() >= 6 && fields[2] == uid.to_string())
        .map(|fields| fields[5].to_owned())
        .unwrap_or_else(|| "/".to_owned())
}

/// The port a container's readiness probe connects to: `tcpSocket`'s (or `httpGet`'s),
/// by number or by the name of one of its ports. `None`: ready once running.
fn readiness_port(container: &Container) -> Option<u16> {
    let probe: &Probe = container.readiness_probe.as_ref()?;
    let port = match (&probe.tcp_socket, &probe.http_get) {
        (Some(tcp), _) => &tcp.port,
        (None, Some(http)) => &http.port,
        (None, None) => return None,
    };
    match port {
        IntOrString::Int(port) => u16::try_from(*port).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

fn probe(address: SocketAddr) -> bool {
    TcpStream::connect_timeout(&address, Duration::from_millis(250)).is_ok()
}

/// The last lines of a container's log (at most 80 lines or 4 KiB, as the kubelet's
/// `FallbackToLogsOnError`).
fn log_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(length.saturating_sub(4096)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_command_naming_warren_runs_the_configured_binary() {
        let mut argv = vec!["/usr/local/bin/warren".to_owned(), "__k8s-prepare".into()];
        substitute_warren(&mut argv);
        assert_eq!(argv, [BINARY_IN_CONTAINER, "__k8s-prepare"]);
        // The agent runs from the bundle its init container wrote, through its loader.
        let bundle = [
            "/opt/warren-agent/ld.so".to_owned(),
            "/opt/warren-agent/warren".into(),
            "__container-agent".into(),
        ];
        let mut argv = bundle.to_vec();
        substitute_warren(&mut argv);
        assert_eq!(argv, bundle);
        let mut argv = vec!["/bin/sh".to_owned(), "-c".into(), "warren".into()];
        substitute_warren(&mut argv);
        assert_eq!(argv, ["/bin/sh", "-c", "warren"]);
    }
}
