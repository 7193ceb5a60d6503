//! A test-side kubelet, named as such: it runs the pods an API server tells it about on
//! this machine, from each pod's own spec, and reports their status as a kubelet would.
//!
//! There is no container runtime and no image: **the host's root filesystem is every
//! container's image**, and a command naming `warren` runs [`KubeletConfig::warren_binary`].
//! Per pod, as a kubelet and its runtime do:
//!
//! ```text
//! schedule   CPU requests against KubeletConfig::cpu_capacity_millis; claims must exist
//! pull       an image in unpullable_images: ErrImagePull, then ImagePullBackOff; stop
//! sandbox    a network namespace of its own (`ip netns`), a veth pair: one /30 of
//!            10.232.0.0/16 per pod, host side .1 (hostIP), pod side .2 (podIP, eth0)
//! volumes    emptyDir: a directory under state_dir (a tmpfs of sizeLimit when set);
//!            persistentVolumeClaim: the claim's host directory; subPaths made as a kubelet
//!            makes them (root, the volume root's mode), refused when they leave the volume;
//!            a subPath that is a file when its container starts (one an init container
//!            wrote into an emptyDir) is bound as that file, over the image's file there
//!            (`/etc/passwd`) or a new empty one, as a container runtime binds it
//! init       each init container in order, to completion
//! main       the containers; Ready once each readinessProbe's port accepts a connection
//! ```
//!
//! Each container runs in namespaces of its own (mount, pid, UTS, IPC) inside the pod's
//! network namespace, as PID 1 of its pid namespace:
//!
//! ```text
//! setpriv --pdeathsig KILL            (dies with the pod's thread in this process)
//!   nsenter --net=/run/netns/<pod>
//!     unshare --mount --uts --ipc --pid --fork --kill-child --mount-proc
//!       sh -c <setup>                 (PID 1: builds the root, pivot_root, then exec)
//!         setpriv --reuid --regid --groups/--clear-groups --bounding-set
//!                 [--no-new-privs] --pdeathsig keep -- <command> <args>
//! ```
//!
//! The container's root is a fresh tmpfs: every top-level entry of the host's `/` is
//! bind-mounted read-only into it (not recursively: no mount of the host's follows), except
//! `/proc` (a new procfs of the pod's pid namespace), `/sys` (a new read-only sysfs of the
//! pod's network namespace), `/dev` (a small tmpfs with null, zero, full, random, urandom,
//! tty, a devpts of its own and a `/dev/shm`), and `/tmp` and `/run` (empty). A mountPath
//! whose directory does not exist is made: in the root tmpfs or a volume directly; inside a
//! host directory by *shadowing* it: a tmpfs over it holding read-only binds of each of its
//! entries (so `/home/gem` appears beside the host's own `/home/*`, and the host is never
//! written to). Symbolic links on the way to a mountPath resolve inside the container's
//! root. The state directory and the claims' directories are masked (an empty read-only
//! tmpfs) where the host root would show them, so a container sees a claim only through its
//! own subPath. Then `pivot_root` into the new root and a lazy unmount of the old one: the
//! container's mount namespace keeps nothing of the host's mount table.
//!
//! Deleting a pod kills its containers' PID 1s (the kernel kills the rest of each pid
//! namespace), unmounts its emptyDirs, deletes its network namespace (the veth goes with it)
//! and removes its directory; dropping the kubelet does so for every pod it still runs.
//! Should the test process be killed outright, its containers die with it (the parent-death
//! signals above); the network namespaces and emptyDir mounts it held are recorded under
//! `/run/warren-kubelet` and removed by the next kubelet made on this machine.
//!
//! What is not modelled: images (their filesystems, entrypoints, users, environments), a
//! writable image layer (the host's directories are always read-only; the root tmpfs is
//! writable unless `readOnlyRootFilesystem`), restarts (`restartPolicy` other than `Never`
//! still runs each container once), liveness and startup probes, `exec` readiness probes
//! (ready once running), `httpGet` probes (a TCP connect to their port), graceful
//! termination (deletion kills at once), seccomp and AppArmor profiles, cgroup limits
//! (memory, CPU, ephemeral storage), evictions (an emptyDir's sizeLimit is a tmpfs size:
//! writes fail with ENOSPC where a kubelet would evict the pod), `$(VAR)` expansion,
//! `valueFrom`, volumes other than emptyDir and persistentVolumeClaim, `fsGroup`,
//! `/etc/hosts` and DNS, Services and NetworkPolicies, pods reaching each other (a pod has
//! no route but its /30: it reaches only its host-side address), and scheduling beyond one
//! pod's CPU request against the node's capacity.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodSpec, PodStatus,
    Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Kubelet, StatusReporter};

/// What the simulated kubelet runs pods with.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// The executable every container command naming `warren` runs (`/usr/local/bin/warren
    /// __k8s-prepare …`, `…/warren __agent-bundle …`): it stands in for warren's image. It
    /// appears read-only at `/.warren-kubelet/warren` in every container. The agent itself
    /// runs as a pod runs it: the bundle the agent-bundle init container wrote into its
    /// emptyDir, through the bundle's own loader.
    pub warren_binary: PathBuf,
    /// The PersistentVolumeClaims by name: the host directory holding each one's contents.
    pub claims: BTreeMap<String, PathBuf>,
    /// Where pods' emptyDirs, container roots and logs live (the test's temporary dir).
    pub state_dir: PathBuf,
    /// Images reported as `ErrImagePull`, then `ImagePullBackOff`.
    pub unpullable_images: Vec<String>,
    /// The node's CPU, in thousandths: a pod requesting more is `Unschedulable`.
    pub cpu_capacity_millis: u64,
}

/// Where a pod the kubelet runs is reachable, and what of it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// The pod's network namespace (`ip netns`), once made.
    pub netns: Option<String>,
    /// The host side of the pod's veth pair, once made.
    pub host_interface: Option<String>,
    /// The pod's address (`status.podIP`), once its network is up.
    pub pod_ip: Option<Ipv4Addr>,
    /// The host side's address (`status.hostIP`), once its network is up.
    pub host_ip: Option<Ipv4Addr>,
    /// Host pids of the running containers' PID 1s (each the first process of a pid
    /// namespace of its own: killing it ends everything in that namespace).
    pub container_pids: Vec<u32>,
}

/// A kubelet running pods on this machine (see the module's documentation). Dropping it
/// stops every pod it still runs and cleans up after them.
pub struct SimulatedKubelet {
    settings: Arc<Settings>,
    pods: Mutex<BTreeMap<(String, String), Arc<PodRun>>>,
    /// The log directory of the latest pod of each name, kept after deletion.
    logs: Mutex<BTreeMap<(String, String), PathBuf>>,
}

/// How long a readiness probe is tried before the kubelet stops probing (the pod stays
/// Running and not Ready).
const PROBE_FOR: Duration = Duration::from_secs(300);
/// How often the pod's thread looks at its containers and probes.
const TICK: Duration = Duration::from_millis(25);
/// How long deleting a pod waits for its thread before cleaning up anyway.
const STOP_WAIT: Duration = Duration::from_secs(20);
/// Addresses of the pods' networks: one /30 each.
const POD_NETWORK: Ipv4Addr = Ipv4Addr::new(10, 232, 0, 0);
/// How many /30s fit in the /16.
const SLOTS: u32 = 1 << 14;
/// Where the warren binary appears in every container.
const BINARY_IN_CONTAINER: &str = "/.warren-kubelet/warren";
/// What a container's setup prints when it fails (before the command runs).
const SETUP_FAILED: &str = "warren-kubelet: setting up the container failed";
/// The exit status of a failed setup.
const SETUP_EXIT: i32 = 125;
/// A container runtime's default capabilities (containerd's, as Docker's).
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
];

impl SimulatedKubelet {
    /// A kubelet with `config`. Panics, naming what is missing, when not run as root or
    /// when a tool it runs (util-linux, iproute2) is not installed.
    pub fn new(config: KubeletConfig) -> Self {
        assert!(
            is_root(),
            "the simulated kubelet needs root: it makes network, mount and pid namespaces"
        );
        fs::create_dir_all(&config.state_dir).expect("create the kubelet's state dir");
        let state_dir = config
            .state_dir
            .canonicalize()
            .expect("resolve the kubelet's state dir");
        let warren_binary = config.warren_binary.canonicalize().unwrap_or_else(|e| {
            panic!(
                "the warren binary {} is not there: {e}",
                config.warren_binary.display()
            )
        });
        let claims: BTreeMap<String, PathBuf> = config
            .claims
            .iter()
            .map(|(name, dir)| {
                let dir = dir
                    .canonicalize()
                    .unwrap_or_else(|e| panic!("claim {name}: {}: {e}", dir.display()));
                (name.clone(), dir)
            })
            .collect();
        let tools = Tools::find();
        sweep_leftovers(&tools);
        // The pod network never leaves this machine: a live pod's /30 is routed to its
        // veth, and every other address of the range (a deleted pod's, one never given) is
        // unreachable here, refused at once, never sent to the default route. Left in
        // place after the tests: it only keeps this test range on the machine.
        let route = Command::new(&tools.ip)
            .args(["route", "replace", "unreachable"])
            .arg(format!("{POD_NETWORK}/16"))
            .output()
            .expect("run ip route");
        assert!(
            route.status.success(),
            "cannot keep the pod network on this machine: {}",
            String::from_utf8_lossy(&route.stderr)
        );
        let mut hidden = vec![state_dir.clone()];
        hidden.extend(claims.values().cloned());
        Self {
            settings: Arc::new(Settings {
                binary: warren_binary,
                claims,
                state_dir,
                unpullable: config.unpullable_images,
                cpu_capacity_millis: config.cpu_capacity_millis,
                hidden,
                tools,
            }),
            pods: Mutex::new(BTreeMap::new()),
            logs: Mutex::new(BTreeMap::new()),
        }
    }

    /// Where the pod `namespace/name` is reachable and what of it runs, while the kubelet
    /// runs it (`None` once deleted, or never told of).
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        let run = lock(&self.pods)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()?;
        let network = lock(&run.resources).network.clone();
        let container_pids = lock(&run.running)
            .iter()
            .flat_map(|pid| children(*pid))
            .collect();
        Some(PodInfo {
            netns: network.as_ref().map(|n| n.name.clone()),
            host_interface: network.as_ref().map(|n| n.host_interface.clone()),
            pod_ip: network.as_ref().map(|n| n.pod_ip),
            host_ip: network.as_ref().map(|n| n.host_ip),
            container_pids,
        })
    }

    /// What the container `container` of the latest pod `namespace/name` wrote on stdout
    /// and stderr (with the kubelet's own setup errors), also after the pod is deleted.
    pub fn logs(&self, namespace: &str, name: &str, container: &str) -> Option<String> {
        let dir = lock(&self.logs)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()?;
        let bytes = fs::read(dir.join(format!("{}.log", safe_name(container)))).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The pods the kubelet runs (namespace, name).
    pub fn pods(&self) -> Vec<(String, String)> {
        lock(&self.pods).keys().cloned().collect()
    }
}

impl Kubelet for SimulatedKubelet {
    fn pod_created(&self, pod: Pod, status: StatusReporter) {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let key = (namespace, name.clone());
        static PODS: AtomicU64 = AtomicU64::new(0);
        let n = PODS.fetch_add(1, Ordering::Relaxed);
        let dir_name = format!("{n}-{}", safe_name(&name));
        let run = Arc::new(PodRun {
            dir: self.settings.state_dir.join("pods").join(&dir_name),
            log_dir: self.settings.state_dir.join("logs").join(&dir_name),
            deleted: AtomicBool::new(false),
            running: Mutex::new(Vec::new()),
            resources: Mutex::new(Resources::default()),
            finished: (Mutex::new(false), Condvar::new()),
        });
        lock(&self.logs).insert(key.clone(), run.log_dir.clone());
        // The API server deletes a pod before one of the same name is made; should it not
        // have told us, the old one goes first, on the new one's thread.
        let previous = lock(&self.pods).insert(key, Arc::clone(&run));
        let settings = Arc::clone(&self.settings);
        std::thread::Builder::new()
            .name(format!("kubelet {name}"))
            .spawn(move || {
                if let Some(previous) = previous {
                    previous.stop();
                }
                let _finished = Finished(&run);
                run_pod(&settings, &run, &pod, &status);
            })
            .expect("start a pod's thread");
    }

    fn pod_deleted(&self, namespace: &str, name: &str) {
        let run = lock(&self.pods).remove(&(namespace.to_owned(), name.to_owned()));
        if let Some(run) = run {
            run.stop();
        }
    }
}

impl Drop for SimulatedKubelet {
    fn drop(&mut self) {
        let runs: Vec<Arc<PodRun>> = std::mem::take(&mut *lock(&self.pods))
            .into_values()
            .collect();
        // Kill everything first, then wait and clean up pod by pod.
        for run in &runs {
            run.kill();
        }
        for run in &runs {
            run.stop();
        }
    }
}

impl std::fmt::Debug for SimulatedKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedKubelet")
            .field("state_dir", &self.settings.state_dir)
            .field("pods", &self.pods())
            .finish()
    }
}

/// The kubelet's configuration, resolved.
struct Settings {
    binary: PathBuf,
    claims: BTreeMap<String, PathBuf>,
    state_dir: PathBuf,
    unpullable: Vec<String>,
    cpu_capacity_millis: u64,
    /// Host directories no container sees through the host's root.
    hidden: Vec<PathBuf>,
    tools: Tools,
}

/// Absolute paths of the host's tools (the same inside containers: `/usr` is bound).
struct Tools {
    sh: PathBuf,
    mount: PathBuf,
    umount: PathBuf,
    mkdir: PathBuf,
    touch: PathBuf,
    ln: PathBuf,
    rmdir: PathBuf,
    pivot_root: PathBuf,
    setpriv: PathBuf,
    nsenter: PathBuf,
    unshare: PathBuf,
    ip: PathBuf,
}

impl Tools {
    fn find() -> Self {
        Self {
            sh: find_tool("sh", "dash"),
            mount: find_tool("mount", "mount"),
            umount: find_tool("umount", "mount"),
            mkdir: find_tool("mkdir", "coreutils"),
            touch: find_tool("touch", "coreutils"),
            ln: find_tool("ln", "coreutils"),
            rmdir: find_tool("rmdir", "coreutils"),
            pivot_root: find_tool("pivot_root", "util-linux"),
            setpriv: find_tool("setpriv", "util-linux"),
            nsenter: find_tool("nsenter", "util-linux"),
            unshare: find_tool("unshare", "util-linux"),
            ip: find_tool("ip", "iproute2"),
        }
    }
}

fn find_tool(name: &str, package: &str) -> PathBuf {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("the simulated kubelet runs `{name}`: apt-get install {package}"))
}

/// One pod the kubelet runs.
struct PodRun {
    /// `<state>/pods/<n>-<name>`: volumes and container roots.
    dir: PathBuf,
    /// `<state>/logs/<n>-<name>`: one log per container, kept after deletion.
    log_dir: PathBuf,
    deleted: AtomicBool,
    /// Host pids of the live containers' outermost processes (`unshare`'s). A container is
    /// started and reaped with this held, so a pid here is never a recycled one.
    running: Mutex<Vec<u32>>,
    resources: Mutex<Resources>,
    /// Set when the pod's thread is done.
    finished: (Mutex<bool>, Condvar),
}

/// What a pod holds on the host until it is deleted.
#[derive(Default)]
struct Resources {
    network: Option<Network>,
    /// tmpfs mounts of emptyDirs.
    mounts: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
struct Network {
    name: String,
    host_interface: String,
    host_ip: Ipv4Addr,
    pod_ip: Ipv4Addr,
}

/// Marks the pod's thread finished however it ends (a panic included).
struct Finished<'a>(&'a PodRun);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        let (done, changed) = &self.0.finished;
        *lock(done) = true;
        changed.notify_all();
    }
}

impl PodRun {
    fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::SeqCst)
    }

    /// Marks the pod deleted and kills every process of it.
    fn kill(&self) {
        self.deleted.store(true, Ordering::SeqCst);
        for pid in lock(&self.running).iter() {
            kill_container(*pid);
        }
    }

    /// Kills the pod, waits for its thread (bounded) and releases all it holds.
    fn stop(&self) {
        self.kill();
        let (done, changed) = &self.finished;
        let deadline = Instant::now() + STOP_WAIT;
        let mut finished = lock(done);
        while !*finished && Instant::now() < deadline {
            finished = changed
                .wait_timeout(finished, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if !*finished {
                // A container started after the first kill (the thread was between its
                // check and the spawn) is killed here.
                drop(finished);
                for pid in lock(&self.running).iter() {
                    kill_container(*pid);
                }
                finished = lock(done);
            }
        }
        drop(finished);
        self.release();
    }

    /// Changes what the pod holds, and records it for [`sweep_leftovers`].
    fn hold(&self, change: impl FnOnce(&mut Resources)) {
        let mut resources = lock(&self.resources);
        change(&mut resources);
        if let Some(network) = &resources.network {
            let record = serde_json::json!({
                "pid": std::process::id(),
                "netns": network.name,
                "mounts": resources.mounts,
            });
            let _ = fs::create_dir_all(RECORDS);
            let _ = fs::write(
                Path::new(RECORDS).join(format!("{}.json", network.name)),
                record.to_string(),
            );
        }
    }

    /// Unmounts the emptyDirs, deletes the network namespace and removes the pod's
    /// directory. Idempotent.
    fn release(&self) {
        let (network, mounts) = {
            let mut resources = lock(&self.resources);
            (
                resources.network.take(),
                std::mem::take(&mut resources.mounts),
            )
        };
        for mount in mounts.iter().rev() {
            unmount(mount);
        }
        // Anything else mounted under the pod's directory on the host (nothing should be).
        for mount in mounts_under(&self.dir).iter().rev() {
            unmount(mount);
        }
        if let Some(network) = network {
            let _ = Command::new(find_tool("ip", "iproute2"))
                .args(["netns", "del", &network.name])
                .stderr(Stdio::null())
                .status();
            let _ = fs::remove_file(Path::new(RECORDS).join(format!("{}.json", network.name)));
        }
        if mounts_under(&self.dir).is_empty() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Where each pod's network namespace and emptyDir mounts are recorded with the pid of the
/// process running it, so that what a killed test process left is removed by the next
/// kubelet made on this machine.
const RECORDS: &str = "/run/warren-kubelet";

/// Removes the network namespaces and emptyDir mounts of pods whose kubelet's process is
/// gone (killed before it could clean up; its containers died with it).
fn sweep_leftovers(tools: &Tools) {
    let Ok(entries) = fs::read_dir(RECORDS) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.path().extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Some(record) = fs::read(entry.path())
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        else {
            continue;
        };
        let alive = record["pid"]
            .as_u64()
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if alive {
            continue;
        }
        // One sweeper takes the record; the others find it gone.
        let claimed = entry
            .path()
            .with_extension(format!("sweeping-{}", std::process::id()));
        if fs::rename(entry.path(), &claimed).is_err() {
            continue;
        }
        let ours = our_tmpfs_mounts();
        for mount in record["mounts"].as_array().into_iter().flatten().rev() {
            if let Some(mount) = mount.as_str().map(PathBuf::from) {
                if ours.contains(&mount) {
                    unmount(&mount);
                }
            }
        }
        if let Some(netns) = record["netns"].as_str() {
            let _ = Command::new(&tools.ip)
                .args(["netns", "del", netns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_file(&claimed);
    }
}

/// Mount points of the kubelet's emptyDir tmpfs mounts on the host.
fn our_tmpfs_mounts() -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let (mount, filesystem) = line.split_once(" - ")?;
            let target = mount.split(' ').nth(4)?;
            let source = filesystem.split(' ').nth(1)?;
            (source == "warren-kubelet-emptydir").then(|| PathBuf::from(unescape_mountinfo(target)))
        })
        .collect()
}

fn unmount(path: &Path) {
    let quiet = |lazy: bool| {
        let mut command = Command::new(find_tool("umount", "mount"));
        if lazy {
            command.arg("-l");
        }
        command
            .arg(path)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !quiet(false) {
        quiet(true);
    }
}

/// Mount points on the host at or below `dir` (from `/proc/self/mountinfo`).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|target| PathBuf::from(unescape_mountinfo(target)))
        .filter(|target| target.starts_with(dir))
        .collect()
}

fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Kills a container: the PID 1 of its pid namespace (the kernel then kills the rest of the
/// namespace), then `unshare` if it has no child yet. `unshare --kill-child` and the inner
/// `setpriv --pdeathsig keep` would also carry the kill down from `unshare`.
fn kill_container(unshare: u32) {
    let pid1s = children(unshare);
    for pid in &pid1s {
        signal_kill(*pid);
    }
    if pid1s.is_empty() {
        signal_kill(unshare);
    }
}

fn signal_kill(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// The children of `pid` (its main thread's).
fn children(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

// ---- One pod's life, on its own thread. ----

fn run_pod(settings: &Settings, run: &PodRun, pod: &Pod, reporter: &StatusReporter) {
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

struct VolumeMountPlan {
    target: String,
    source: PathBuf,
    read_only: bool,
    is_dir: bool,
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

// ---- The network. ----

/// Makes the pod's network namespace and veth pair on the first free /30.
fn make_network(settings: &Settings) -> Result<Network, String> {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // Processes start at different slots, so concurrent test binaries rarely collide
    // (and when they do, the namespace's name, made exclusively, decides).
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(2654435761)) % SLOTS,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let ip = |args: &[&str]| -> Result<(), String> {
        let output = Command::new(&settings.tools.ip)
            .args(args)
            .output()
            .map_err(|e| format!("run ip: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    };
    let mut last_error = String::new();
    for _ in 0..SLOTS {
        let slot = NEXT.fetch_add(1, Ordering::SeqCst) % SLOTS;
        let name = format!("wkl-{slot}");
        if Path::new("/run/netns").join(&name).exists() {
            continue;
        }
        if let Err(error) = ip(&["netns", "add", &name]) {
            // Taken meanwhile by another kubelet (or a leftover): the next slot.
            last_error = error;
            continue;
        }
        let base = u32::from(POD_NETWORK) + slot * 4;
        let host_ip = Ipv4Addr::from(base + 1);
        let pod_ip = Ipv4Addr::from(base + 2);
        let host_interface = format!("wkl{slot}");
        let made = (|| {
            ip(&[
                "link",
                "add",
                &host_interface,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &name,
            ])?;
            ip(&[
                "addr",
                "add",
                &format!("{host_ip}/30"),
                "dev",
                &host_interface,
            ])?;
            ip(&["link", "set", &host_interface, "up"])?;
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{pod_ip}/30"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &name, "link", "set", "eth0", "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])
        })();
        match made {
            Ok(()) => {
                return Ok(Network {
                    name,
                    host_interface,
                    host_ip,
                    pod_ip,
                })
            }
            Err(error) => {
                let _ = ip(&["netns", "del", &name]);
                last_error = error;
            }
        }
    }
    Err(format!("no free pod network: {last_error}"))
}

// ---- Volumes. ----

/// Where a pod's volume is on this machine.
enum VolumeHost {
    EmptyDir(PathBuf),
    Claim { dir: PathBuf, read_only: bool },
}

fn prepare_volumes(
    settings: &Settings,
    run: &PodRun,
    spec: &PodSpec,
) -> Result<BTreeMap<String, VolumeHost>, String> {
    let mut volumes = BTreeMap::new();
    for volume in spec.volumes.iter().flatten() {
        if let Some(empty) = &volume.empty_dir {
            let dir = run.dir.join("volumes").join(safe_name(&volume.name));
            fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            let size = match &empty.size_limit {
                Some(limit) => Some(
                    quantity_millis(&limit.0)
                        .map(|m| m.div_ceil(1000))
                        .ok_or_else(|| {
                            format!(
                                "volume {}: sizeLimit {:?} is not a quantity",
                                volume.name, limit.0
                            )
                        })?,
                ),
                None => None,
            };
            let memory = empty.medium.as_deref() == Some("Memory");
            if size.is_some() || memory {
                let mut options = "mode=0777".to_owned();
                if let Some(size) = size {
                    options.push_str(&format!(",size={}", size.max(1)));
                }
                let output = Command::new(&settings.tools.mount)
                    .args(["-t", "tmpfs", "-o", &options, "warren-kubelet-emptydir"])
                    .arg(&dir)
                    .output()
                    .map_err(|e| format!("run mount: {e}"))?;
                if !output.status.success() {
                    return Err(format!(
                        "mount the emptyDir {}: {}",
                        volume.name,
                        String::from_utf8_lossy(&output.stderr).trim()
                    ));
                }
                run.hold(|resources| resources.mounts.push(dir.clone()));
            }
            // A kubelet makes emptyDirs world-writable.
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o777))
                .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
            volumes.insert(volume.name.clone(), VolumeHost::EmptyDir(dir));
        } else if let Some(claim) = &volume.persistent_volume_claim {
            let dir = settings.claims[&claim.claim_name].clone();
            volumes.insert(
                volume.name.clone(),
                VolumeHost::Claim {
                    dir,
                    read_only: claim.read_only.unwrap_or(false),
                },
            );
        } else {
            return Err(format!(
                "volume {}: the simulated kubelet models only emptyDir and \
                 persistentVolumeClaim volumes",
                volume.name
            ));
        }
    }
    Ok(volumes)
}

/// The host path of `sub` in the volume at `root`, made (as root, with the volume root's
/// mode, as a kubelet does) when missing; refused when it leaves the volume.
fn sub_path(root: &Path, sub: &str) -> Result<PathBuf, String> {
    let root = root
        .canonicalize()
        .map_err(|e| format!("{}: {e}", root.display()))?;
    if sub.is_empty() {
        return Ok(root);
    }
    if sub.starts_with('/') || sub.split('/').any(|c| c == "..") {
        return Err(format!(
            "subPath {sub:?} must be relative, without '..' (as the kubelet requires)"
        ));
    }
    let mode = fs::metadata(&root)
        .map_err(|e| format!("{}: {e}", root.display()))?
        .mode()
        & 0o7777;
    let mut path = root.clone();
    for component in sub.split('/').filter(|c| !c.is_empty() && *c != ".") {
        let next = path.join(component);
        match fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let resolved = next
                    .canonicalize()
                    .map_err(|e| format!("subPath {sub:?}: {e}"))?;
                if !resolved.starts_with(&root) {
                    return Err(format!(
                        "subpath {sub:?} not within volume path {}",
                        root.display()
                    ));
                }
                path = resolved;
            }
            Ok(_) => path = next,
            Err(_) => {
                fs::create_dir(&next).map_err(|e| format!("make subPath {sub:?}: {e}"))?;
                fs::set_permissions(&next, fs::Permissions::from_mode(mode))
                    .map_err(|e| format!("make subPath {sub:?}: {e}"))?;
                path = next;
            }
        }
    }
    Ok(path)
}

// ---- A container's root, as a script its PID 1 runs before the command. ----

/// What backs a directory of the container's view.
#[derive(Debug, Clone)]
enum Backing {
    /// A tmpfs of the kubelet's (the root, a shadow): entries are made by the script.
    Synthetic,
    /// A host directory or file, bound read-only.
    Host(PathBuf),
    /// A volume (an emptyDir's directory, a claim's subPath), bound as declared.
    Volume(PathBuf),
    /// `/proc`, `/sys`, `/dev`, masks, the kubelet's own: nothing is mounted inside.
    Special,
}

enum Entry {
    Dir,
    File,
    Link(String),
    Missing,
    Special,
}

/// The container's view as the script builds it.
struct View<'a> {
    tools: &'a Tools,
    /// The root's directory on the host (mounted over inside the container's namespace).
    root: String,
    /// Mount points, in the order made: (container path, backing, is a directory).
    mounts: Vec<(String, Backing, bool)>,
    /// Paths the script makes (container path → is a directory).
    made: BTreeMap<String, bool>,
    /// Symbolic links the script makes (container path → target).
    links: BTreeMap<String, String>,
    /// Mounts made read-only once every mount point is made.
    read_only_at_end: Vec<String>,
    lines: Vec<String>,
}

impl<'a> View<'a> {
    fn new(tools: &'a Tools, root: String) -> Self {
        let mount = q(&tools.mount.display().to_string());
        let lines = vec![
            format!("trap 'echo \"{SETUP_FAILED}\" >&2; exit {SETUP_EXIT}' EXIT"),
            "set -e".to_owned(),
            format!("{mount} --make-rprivate /"),
            format!(
                "{mount} -t tmpfs -o mode=0755,size=16m warren-kubelet-root {}",
                q(&root)
            ),
        ];
        Self {
            tools,
            root,
            mounts: vec![("/".to_owned(), Backing::Synthetic, true)],
            made: BTreeMap::new(),
            links: BTreeMap::new(),
            read_only_at_end: Vec::new(),
            lines,
        }
    }

    /// `path` (a container path) on the host, inside the root.
    fn at(&self, path: &str) -> String {
        if path == "/" {
            q(&self.root)
        } else {
            q(&format!("{}{path}", self.root))
        }
    }

    fn run(&mut self, tool: &Path, args: &[String]) {
        let mut line = q(&tool.display().to_string());
        for arg in args {
            line.push(' ');
            line.push_str(arg);
        }
        self.lines.push(line);
    }

    fn mkdir(&mut self, path: &str, mode: Option<&str>) {
        let mut args = Vec::new();
        if let Some(mode) = mode {
            args.push(format!("-m {mode}"));
        }
        args.push(self.at(path));
        self.run(self.tools.mkdir.as_path(), &args);
        self.made.insert(path.to_owned(), true);
    }

    fn touch(&mut self, path: &str) {
        let args = [self.at(path)];
        self.run(self.tools.touch.as_path(), &args);
        self.made.insert(path.to_owned(), false);
    }

    fn symlink(&mut self, target: &str, path: &str) {
        let args = ["-s".to_owned(), q(target), self.at(path)];
        self.run(self.tools.ln.as_path(), &args);
        self.links.insert(path.to_owned(), target.to_owned());
    }

    /// Binds the host's `source` at `path` (made as a directory or a file first).
    fn bind_host(&mut self, source: &Path, path: &str, is_dir: bool) {
        if is_dir {
            self.mkdir(path, None);
        } else {
            self.touch(path);
        }
        let args = [
            "--bind".to_owned(),
            q(&source.display().to_string()),
            self.at(path),
        ];
        self.run(self.tools.mount.as_path(), &args);
        let args = ["-o remount,bind,ro".to_owned(), self.at(path)];
        self.run(self.tools.mount.as_path(), &args);
        self.made.remove(path);
        self.mounts
            .push((path.to_owned(), Backing::Host(source.to_owned()), is_dir));
    }

    /// Mounts `args` at `path`, or binds `fallback` (mount's arguments) read-only there if
    /// that fails.
    fn mount_special(&mut self, path: &str, args: &[&str], fallback: Option<&str>) {
        self.mkdir(path, None);
        let mount = q(&self.tools.mount.display().to_string());
        let mut line = format!("{mount} {} {}", args.join(" "), self.at(path));
        if let Some(fallback) = fallback {
            let at = self.at(path);
            line.push_str(&format!(
                " || {{ {mount} {fallback} {at} && {mount} -o remount,bind,ro {at}; }}"
            ));
        }
        self.lines.push(line);
        self.made.remove(path);
        self.mounts.push((path.to_owned(), Backing::Special, true));
    }

    /// The host's root, `/proc`, `/sys`, `/dev`, `/tmp`, `/run`, the masks and the binary.
    fn base(&mut self, settings: &Settings) -> Result<(), String> {
        let mut entries: Vec<_> = fs::read_dir("/")
            .map_err(|e| format!("read /: {e}"))?
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if matches!(
                name.as_str(),
                "proc" | "sys" | "dev" | "tmp" | "run" | "lost+found" | ".warren-kubelet"
            ) {
                continue;
            }
            let path = format!("/{name}");
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = fs::read_link(entry.path()) {
                    self.symlink(&target.display().to_string(), &path);
                }
            } else if meta.is_dir() {
                self.bind_host(&entry.path(), &path, true);
            } else if meta.is_file() {
                self.bind_host(&entry.path(), &path, false);
            }
        }
        self.mkdir("/tmp", Some("1777"));
        self.mkdir("/run", Some("0755"));
        self.mount_special("/proc", &["-t proc", "proc"], None);
        // A sysfs of the pod's network namespace; the host's, read-only, where the kernel
        // refuses a new one.
        self.mount_special(
            "/sys",
            &["-t sysfs", "-o ro,nosuid,nodev,noexec", "sysfs"],
            Some("--bind /sys"),
        );
        // /dev is the kubelet's tmpfs: volumes may be mounted in it (a /dev/shm emptyDir).
        self.mkdir("/dev", None);
        let args = [
            "-t tmpfs -o mode=0755,size=64k,nosuid,noexec warren-kubelet-dev".to_owned(),
            self.at("/dev"),
        ];
        self.run(self.tools.mount.as_path(), &args);
        self.made.remove("/dev");
        self.mounts
            .push(("/dev".to_owned(), Backing::Synthetic, true));
        for device in ["null", "zero", "full", "random", "urandom", "tty"] {
            let host = Path::new("/dev").join(device);
            if !host.exists() {
                continue;
            }
            let path = format!("/dev/{device}");
            self.touch(&path);
            let args = [
                "--bind".to_owned(),
                q(&host.display().to_string()),
                self.at(&path),
            ];
            self.run(self.tools.mount.as_path(), &args);
        }
        self.mkdir("/dev/pts", None);
        let mount = q(&self.tools.mount.display().to_string());
        self.lines.push(format!(
            "{mount} -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts {pts} || \
             {mount} --bind /dev/pts {pts}",
            pts = self.at("/dev/pts")
        ));
        self.symlink("pts/ptmx", "/dev/ptmx");
        self.mkdir("/dev/shm", Some("1777"));
        let args = [
            "-t tmpfs -o mode=1777,size=64m,nosuid,nodev shm".to_owned(),
            self.at("/dev/shm"),
        ];
        self.run(self.tools.mount.as_path(), &args);
        for (link, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            self.symlink(target, &format!("/dev/{link}"));
        }
        // What the host's root would show of the kubelet's state and of whole claims.
        for hidden in &settings.hidden {
            let Some(hidden) = hidden.to_str() else {
                continue;
            };
            if let Some(path) = self.existing_dir(hidden) {
                let args = [
                    "-t tmpfs -o ro,mode=0755,size=4k warren-kubelet-mask".to_owned(),
                    self.at(&path),
                ];
                self.run(self.tools.mount.as_path(), &args);
                self.mounts.push((path, Backing::Special, true));
            }
        }
        self.mkdir("/.warren-kubelet", Some("0755"));
        self.bind_host(&settings.binary, BINARY_IN_CONTAINER, false);
        self.mounts
            .push(("/.warren-kubelet".to_owned(), Backing::Special, true));
        Ok(())
    }

    /// Mounts a volume at its mountPath, making the mount point.
    fn bind_volume(&mut self, mount: &VolumeMountPlan) -> Result<(), String> {
        let path = self.ensure(&mount.target, mount.is_dir)?;
        let args = [
            "--bind".to_owned(),
            q(&mount.source.display().to_string()),
            self.at(&path),
        ];
        self.run(self.tools.mount.as_path(), &args);
        if mount.read_only {
            self.read_only_at_end.push(path.clone());
        }
        self.mounts
            .push((path, Backing::Volume(mount.source.clone()), mount.is_dir));
        Ok(())
    }

    /// The deepest mount covering `path` (the latest made, among equals), with `path`
    /// relative to it.
    fn covering(&self, path: &str) -> (&str, &Backing, String) {
        let mut best: Option<&(String, Backing, bool)> = None;
        for mount in &self.mounts {
            if within_or_at(path, &mount.0) && best.is_none_or(|b| mount.0.len() >= b.0.len()) {
                best = Some(mount);
            }
        }
        let (at, backing, _) = best.expect("the root covers every path");
        let relative = path[at.len()..].trim_start_matches('/').to_owned();
        (at, backing, relative)
    }

    fn lookup(&self, path: &str) -> Entry {
        if let Some(target) = self.links.get(path) {
            return Entry::Link(target.clone());
        }
        if let Some(is_dir) = self.made.get(path) {
            return if *is_dir { Entry::Dir } else { Entry::File };
        }
        if let Some((_, backing, is_dir)) = self.mounts.iter().rev().find(|m| m.0 == path) {
            return match backing {
                Backing::Special => Entry::Special,
                _ if *is_dir => Entry::Dir,
                _ => Entry::File,
            };
        }
        let (_, backing, relative) = self.covering(path);
        match backing {
            Backing::Synthetic => Entry::Missing,
            Backing::Special => Entry::Special,
            Backing::Host(dir) | Backing::Volume(dir) => {
                match fs::symlink_metadata(dir.join(relative)) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        match fs::read_link(dir.join(self.covering(path).2)) {
                            Ok(target) => Entry::Link(target.display().to_string()),
                            Err(_) => Entry::Missing,
                        }
                    }
                    Ok(meta) if meta.is_dir() => Entry::Dir,
                    Ok(_) => Entry::File,
                    Err(_) => Entry::Missing,
                }
            }
        }
    }

    /// `path` resolved (symbolic links inside the container's root) if it is an existing
    /// directory seen through the host's root.
    fn existing_dir(&self, path: &str) -> Option<String> {
        let mut todo: VecDeque<String> = components(path);
        let mut current = "/".to_owned();
        let mut hops = 0;
        while let Some(part) = todo.pop_front() {
            if part == ".." {
                current = parent(&current);
                continue;
            }
            let next = join(&current, &part);
            match self.lookup(&next) {
                Entry::Dir => current = next,
                Entry::Link(target) => {
                    hops += 1;
                    if hops > 40 {
                        return None;
                    }
                    if target.starts_with('/') {
                        current = "/".to_owned();
                    }
                    let mut parts = components(&target);
                    parts.extend(todo.drain(..));
                    todo = parts;
                }
                Entry::File | Entry::Missing | Entry::Special => return None,
            }
        }
        matches!(self.covering(&current).1, Backing::Host(_)).then_some(current)
    }

    /// Makes `path` exist (a directory, or a file when `!is_dir`) and answers where it
    /// resolved to; a host directory on the way that lacks an entry is shadowed.
    fn ensure(&mut self, path: &str, is_dir: bool) -> Result<String, String> {
        let mut todo: VecDeque<String> = components(path);
        let mut current = "/".to_owned();
        let mut hops = 0;
        while let Some(part) = todo.pop_front() {
            if part == ".." {
                current = parent(&current);
                continue;
            }
            let next = join(&current, &part);
            let last = todo.is_empty();
            match self.lookup(&next) {
                Entry::Dir => current = next,
                Entry::File if last && !is_dir => current = next,
                Entry::File => return Err(format!("{next} is not a directory")),
                Entry::Special => {
                    return Err(format!("{next} is the kubelet's; nothing is mounted there"))
                }
                Entry::Link(target) => {
                    hops += 1;
                    if hops > 40 {
                        return Err(format!("too many symbolic links resolving {path}"));
                    }
                    if target.starts_with('/') {
                        current = "/".to_owned();
                    }
                    let mut parts = components(&target);
                    parts.extend(todo.drain(..));
                    todo = parts;
                }
                Entry::Missing => {
                    let (_, backing, _) = self.covering(&next);
                    match backing.clone() {
                        Backing::Synthetic | Backing::Volume(_) => {}
                        Backing::Host(_) => self.shadow(&current)?,
                        Backing::Special => {
                            return Err(format!(
                                "{next} is the kubelet's; nothing is mounted there"
                            ))
                        }
                    }
                    if last && !is_dir {
                        self.touch(&next);
                    } else {
                        self.mkdir(&next, None);
                    }
                    current = next;
                }
            }
        }
        Ok(current)
    }

    /// Replaces the host directory at `dir` by a tmpfs holding read-only binds of each of
    /// its entries (and its symbolic links), so entries can be added without writing to
    /// the host.
    fn shadow(&mut self, dir: &str) -> Result<(), String> {
        let (_, backing, relative) = self.covering(dir);
        let Backing::Host(host) = backing else {
            return Err(format!("{dir} is not a host directory"));
        };
        let host = host.join(relative);
        let meta = fs::metadata(&host).map_err(|e| format!("{}: {e}", host.display()))?;
        let args = [
            format!(
                "-t tmpfs -o mode={:o},uid={},gid={},size=1m warren-kubelet-shadow",
                meta.mode() & 0o7777,
                meta.uid(),
                meta.gid()
            ),
            self.at(dir),
        ];
        self.run(self.tools.mount.as_path(), &args);
        self.mounts.push((dir.to_owned(), Backing::Synthetic, true));
        self.read_only_at_end.push(format!("shadow:{dir}"));
        let mut entries: Vec<_> = fs::read_dir(&host)
            .map_err(|e| format!("{}: {e}", host.display()))?
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let path = join(dir, &name);
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = fs::read_link(entry.path()) {
                    self.symlink(&target.display().to_string(), &path);
                }
            } else {
                self.bind_host(&entry.path(), &path, meta.is_dir());
            }
        }
        Ok(())
    }

    /// The whole script: the read-only remounts, the hostname, `pivot_root`, the working
    /// directory and the command as the container's user.
    fn finish(
        mut self,
        hostname: &str,
        read_only_root: bool,
        working_dir: &str,
        setpriv: &str,
    ) -> String {
        let mount = q(&self.tools.mount.display().to_string());
        for path in std::mem::take(&mut self.read_only_at_end) {
            match path.strip_prefix("shadow:") {
                Some(dir) => self
                    .lines
                    .push(format!("{mount} -o remount,ro {}", self.at(dir))),
                None => self
                    .lines
                    .push(format!("{mount} -o remount,bind,ro {}", self.at(&path))),
            }
        }
        self.lines.push(format!(
            "printf '%s' {} > /proc/sys/kernel/hostname",
            q(hostname)
        ));
        let old = "/.warren-kubelet-old";
        self.lines.push(format!("cd {}", q(&self.root)));
        self.mkdir(old, None);
        self.lines.push(format!(
            "{} . .{old}",
            q(&self.tools.pivot_root.display().to_string())
        ));
        self.lines.push("cd /".to_owned());
        self.lines.push(format!(
            "{} -l {old}",
            q(&self.tools.umount.display().to_string())
        ));
        self.lines.push(format!(
            "{} {old}",
            q(&self.tools.rmdir.display().to_string())
        ));
        if read_only_root {
            self.lines.push(format!("{mount} -o remount,ro /"));
        }
        self.lines.push(format!("cd {}", q(working_dir)));
        self.lines.push("trap - EXIT".to_owned());
        self.lines.push(format!("exec {setpriv} -- \"$@\""));
        let mut script = self.lines.join("\n");
        script.push('\n');
        script
    }
}

fn components(path: &str) -> VecDeque<String> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
        .collect()
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn parent(path: &str) -> String {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/".to_owned(),
        Some((parent, _)) => parent.to_owned(),
    }
}

fn within_or_at(path: &str, dir: &str) -> bool {
    dir == "/" || path == dir || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// An absolute path without `.`, `..` or empty components.
fn normalise(path: &str) -> Option<String> {
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return None;
    }
    let parts = components(path);
    Some(if parts.is_empty() {
        "/".to_owned()
    } else {
        parts.iter().fold(String::new(), |acc, c| acc + "/" + c)
    })
}

/// A word the shell reads back as `value`.
fn q(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

// ---- Status. ----

/// The pod's status as the kubelet last reported it, and how it changes.
struct StatusBook<'a> {
    run: &'a PodRun,
    reporter: &'a StatusReporter,
    status: PodStatus,
    init_names: Vec<String>,
    names: Vec<String>,
    pod_name_for_ids: String,
}

/// The order a kubelet lists conditions in.
const CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
];

impl<'a> StatusBook<'a> {
    fn new(run: &'a PodRun, reporter: &'a StatusReporter, spec: &PodSpec) -> Self {
        let init_names: Vec<String> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect();
        let names = spec.containers.iter().map(|c| c.name.clone()).collect();
        let status_of = |c: &Container| ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            image_id: String::new(),
            ready: false,
            restart_count: 0,
            started: Some(false),
            state: Some(waiting(
                if init_names.is_empty() {
                    "ContainerCreating"
                } else {
                    "PodInitializing"
                },
                None,
            )),
            ..ContainerStatus::default()
        };
        let status = PodStatus {
            phase: Some("Pending".to_owned()),
            qos_class: Some(qos_class(spec).to_owned()),
            init_container_statuses: (!init_names.is_empty()).then(|| {
                spec.init_containers
                    .iter()
                    .flatten()
                    .map(|c| ContainerStatus {
                        state: Some(waiting("PodInitializing", None)),
                        ..status_of(c)
                    })
                    .collect()
            }),
            container_statuses: Some(spec.containers.iter().map(status_of).collect()),
            ..PodStatus::default()
        };
        Self {
            run,
            reporter,
            status,
            init_names,
            names,
            pod_name_for_ids: String::new(),
        }
    }

    fn report(&self) {
        if !self.run.is_deleted() {
            self.reporter.update(self.status.clone());
        }
    }

    fn condition(&mut self, kind: &str, ok: bool, reason: Option<&str>, message: Option<String>) {
        let conditions = self.status.conditions.get_or_insert_with(Vec::new);
        let status = if ok { "True" } else { "False" };
        match conditions.iter_mut().find(|c| c.type_ == kind) {
            Some(condition) => {
                if condition.status != status {
                    condition.last_transition_time = Some(now());
                }
                condition.status = status.to_owned();
                condition.reason = reason.map(str::to_owned);
                condition.message = message;
            }
            None => conditions.push(PodCondition {
                type_: kind.to_owned(),
                status: status.to_owned(),
                reason: reason.map(str::to_owned),
                message,
                last_transition_time: Some(now()),
                ..PodCondition::default()
            }),
        }
        conditions.sort_by_key(|c| CONDITIONS.iter().position(|k| *k == c.type_));
    }

    fn init(&mut self, i: usize) -> &mut ContainerStatus {
        &mut self
            .status
            .init_container_statuses
            .as_mut()
            .expect("the pod has init containers")[i]
    }

    fn main(&mut self, i: usize) -> &mut ContainerStatus {
        &mut self
            .status
            .container_statuses
            .as_mut()
            .expect("the pod has containers")[i]
    }

    fn unschedulable(&mut self, message: String) {
        self.condition("PodScheduled", false, Some("Unschedulable"), Some(message));
        self.status.init_container_statuses = None;
        self.status.container_statuses = None;
        self.report();
    }

    fn scheduled(&mut self) {
        self.status.start_time = Some(now());
        self.condition("PodScheduled", true, None, None);
        self.condition("PodReadyToStartContainers", false, None, None);
        if !self.init_names.is_empty() {
            let message = format!(
                "containers with incomplete status: [{}]",
                self.init_names.join(" ")
            );
            self.condition(
                "Initialized",
                false,
                Some("ContainersNotInitialized"),
                Some(message),
            );
        } else {
            self.condition("Initialized", true, None, None);
        }
        self.not_ready();
        self.report();
    }

    fn not_ready(&mut self) {
        let unready: Vec<String> = self
            .status
            .container_statuses
            .iter()
            .flatten()
            .filter(|c| !c.ready)
            .map(|c| c.name.clone())
            .collect();
        let message = format!("containers with unready status: [{}]", unready.join(" "));
        for kind in ["Ready", "ContainersReady"] {
            self.condition(
                kind,
                false,
                Some("ContainersNotReady"),
                Some(message.clone()),
            );
        }
    }

    fn pull_failed(&mut self, init: bool, name: &str, image: &str) {
        let set = |book: &mut Self, reason: &str, message: String| {
            let statuses = if init {
                book.status.init_container_statuses.as_mut()
            } else {
                book.status.container_statuses.as_mut()
            };
            if let Some(status) = statuses.into_iter().flatten().find(|c| c.name == name) {
                status.state = Some(waiting(reason, Some(message)));
            }
            book.report();
        };
        set(
            self,
            "ErrImagePull",
            format!(
                "failed to pull and unpack image \"{image}\": not found (the simulated \
                 kubelet's unpullable_images)"
            ),
        );
        // A kubelet backs off after the first failure.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until && !self.run.is_deleted() {
            std::thread::sleep(TICK);
        }
        set(
            self,
            "ImagePullBackOff",
            format!("Back-off pulling image \"{image}\""),
        );
    }

    fn sandbox_failed(&mut self, error: &str) {
        for i in 0..self.init_names.len() {
            self.init(i).state = Some(waiting("PodInitializing", Some(error.to_owned())));
        }
        for i in 0..self.names.len() {
            self.main(i).state = Some(waiting("ContainerCreating", Some(error.to_owned())));
        }
        self.status.message = Some(error.to_owned());
        self.report();
    }

    fn sandbox_ready(&mut self, network: &Network) {
        self.pod_name_for_ids = network.name.clone();
        self.status.host_ip = Some(network.host_ip.to_string());
        self.status.host_ips = Some(vec![HostIP {
            ip: network.host_ip.to_string(),
        }]);
        self.status.pod_ip = Some(network.pod_ip.to_string());
        self.status.pod_ips = Some(vec![PodIP {
            ip: network.pod_ip.to_string(),
        }]);
        self.condition("PodReadyToStartContainers", true, None, None);
        self.report();
    }

    fn started(&mut self, init: bool, i: usize) {
        let id = container_id(&self.pod_name_for_ids, &self.name_of(init, i));
        let status = if init { self.init(i) } else { self.main(i) };
        status.state = Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(now()),
            }),
            ..ContainerState::default()
        });
        status.started = Some(true);
        status.container_id = Some(id);
        status.image_id = format!("simulated://{}", status.image);
    }

    fn name_of(&self, init: bool, i: usize) -> String {
        if init {
            self.init_names[i].clone()
        } else {
            self.names[i].clone()
        }
    }

    fn init_running(&mut self, i: usize) {
        self.started(true, i);
        self.report();
    }

    fn init_waiting(&mut self, i: usize, reason: &str, message: String) {
        self.init(i).state = Some(waiting(reason, Some(message)));
        self.report();
    }

    fn init_terminated(&mut self, i: usize, mut terminated: ContainerStateTerminated) {
        let status = self.init(i);
        terminated.started_at = status
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.clone());
        terminated.container_id = status.container_id.clone();
        status.ready = terminated.exit_code == 0;
        status.started = Some(false);
        status.state = Some(ContainerState {
            terminated: Some(terminated),
            ..ContainerState::default()
        });
        self.report();
    }

    fn init_failed(&mut self, i: usize, restart_never: bool) {
        let pending: Vec<String> = self.init_names[i..].to_vec();
        self.condition(
            "Initialized",
            false,
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                pending.join(" ")
            )),
        );
        if restart_never {
            self.status.phase = Some("Failed".to_owned());
            self.condition("PodReadyToStartContainers", false, None, None);
            for kind in ["Ready", "ContainersReady"] {
                self.condition(kind, false, Some("PodFailed"), None);
            }
        }
        self.report();
    }

    fn initialized(&mut self) {
        if !self.init_names.is_empty() {
            self.condition("Initialized", true, None, None);
        }
        for i in 0..self.names.len() {
            self.main(i).state = Some(waiting("ContainerCreating", None));
        }
    }

    fn running(&mut self, i: usize, ready: bool) {
        self.started(false, i);
        self.status.phase = Some("Running".to_owned());
        if ready {
            self.ready(i);
        }
    }

    fn waiting(&mut self, i: usize, reason: &str, message: String) {
        self.main(i).state = Some(waiting(reason, Some(message)));
    }

    fn ready(&mut self, i: usize) {
        self.main(i).ready = true;
        let all = self
            .status
            .container_statuses
            .iter()
            .flatten()
            .all(|c| c.ready);
        if all {
            for kind in ["Ready", "ContainersReady"] {
                self.condition(kind, true, None, None);
            }
        } else {
            self.not_ready();
        }
    }

    fn terminated(&mut self, i: usize, mut terminated: ContainerStateTerminated) {
        let status = self.main(i);
        terminated.started_at = status
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.clone());
        terminated.container_id = status.container_id.clone();
        status.ready = false;
        status.started = Some(false);
        status.state = Some(ContainerState {
            terminated: Some(terminated),
            ..ContainerState::default()
        });
        self.not_ready();
    }

    /// Every container has exited: Succeeded when all exited 0, else Failed.
    fn completed(&mut self, containers: usize) {
        let all_zero = (0..containers).all(|i| {
            self.main(i)
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        });
        self.status.phase = Some(if all_zero { "Succeeded" } else { "Failed" }.to_owned());
        for kind in ["Ready", "ContainersReady"] {
            self.condition(kind, false, Some("PodCompleted"), None);
        }
        self.condition("PodReadyToStartContainers", false, None, None);
        self.report();
    }
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message,
        }),
        ..ContainerState::default()
    }
}

fn container_id(pod: &str, container: &str) -> String {
    format!("simulated://{pod}/{container}")
}

fn now() -> Time {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Time(
        k8s_openapi::jiff::Timestamp::from_second(i64::try_from(seconds).unwrap_or(0))
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// Guaranteed when every container's CPU and memory requests equal their limits,
/// BestEffort when nothing is requested or limited, else Burstable.
fn qos_class(spec: &PodSpec) -> &'static str {
    let all: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let nothing = all.iter().all(|c| {
        c.resources.as_ref().is_none_or(|r| {
            r.requests.as_ref().is_none_or(|m| m.is_empty())
                && r.limits.as_ref().is_none_or(|m| m.is_empty())
        })
    });
    if nothing {
        return "BestEffort";
    }
    let guaranteed = all.iter().all(|c| {
        let Some(resources) = &c.resources else {
            return false;
        };
        ["cpu", "memory"].iter().all(|kind| {
            let limit = resources.limits.as_ref().and_then(|l| l.get(*kind));
            let request = resources
                .requests
                .as_ref()
                .and_then(|r| r.get(*kind))
                .or(limit);
            limit.is_some()
                && limit.and_then(|q| quantity_millis(&q.0))
                    == request.and_then(|q| quantity_millis(&q.0))
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The pod's CPU request in thousandths, as the scheduler counts it: the larger of the
/// containers' sum and the largest init container's (a request defaults to the limit).
fn requested_cpu_millis(spec: &PodSpec) -> u128 {
    let cpu = |c: &Container| -> u128 {
        let Some(resources) = &c.resources else {
            return 0;
        };
        resources
            .requests
            .as_ref()
            .and_then(|r| r.get("cpu"))
            .or_else(|| resources.limits.as_ref().and_then(|l| l.get("cpu")))
            .and_then(|q| quantity_millis(&q.0))
            .unwrap_or(0)
    };
    let containers: u128 = spec.containers.iter().map(cpu).sum();
    let init = spec.init_containers.iter().flatten().map(cpu).max();
    containers.max(init.unwrap_or(0))
}

/// A Kubernetes quantity (`1500m`, `2`, `256Mi`, `1e3`, `0.5`) in thousandths, rounded up.
fn quantity_millis(quantity: &str) -> Option<u128> {
    let quantity = quantity.trim();
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let (whole, fraction) = number
        .trim_start_matches('+')
        .split_once('.')
        .unwrap_or((number.trim_start_matches('+'), ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    // value = mantissa / 10^fraction.len() * multiplier; in thousandths.
    let mut numerator = mantissa.checked_mul(1000)?;
    let mut denominator: u128 = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let binary = |power: u32| 1024u128.pow(power);
    let decimal = |power: u32| 10u128.pow(power);
    match suffix {
        "" => {}
        "m" => denominator *= 1000,
        "u" => denominator *= decimal(6),
        "n" => denominator *= decimal(9),
        "k" => numerator = numerator.checked_mul(decimal(3))?,
        "M" => numerator = numerator.checked_mul(decimal(6))?,
        "G" => numerator = numerator.checked_mul(decimal(9))?,
        "T" => numerator = numerator.checked_mul(decimal(12))?,
        "P" => numerator = numerator.checked_mul(decimal(15))?,
        "E" => numerator = numerator.checked_mul(decimal(18))?,
        "Ki" => numerator = numerator.checked_mul(binary(1))?,
        "Mi" => numerator = numerator.checked_mul(binary(2))?,
        "Gi" => numerator = numerator.checked_mul(binary(3))?,
        "Ti" => numerator = numerator.checked_mul(binary(4))?,
        "Pi" => numerator = numerator.checked_mul(binary(5))?,
        "Ei" => numerator = numerator.checked_mul(binary(6))?,
        exponent if exponent.starts_with(['e', 'E']) => {
            let power: i32 = exponent[1..].parse().ok()?;
            if power >= 0 {
                numerator = numerator.checked_mul(10u128.checked_pow(power.unsigned_abs())?)?;
            } else {
                denominator = denominator.checked_mul(10u128.checked_pow(power.unsigned_abs())?)?;
            }
        }
        _ => return None,
    }
    Some(numerator.div_ceil(denominator))
}

// ---- Small things. ----

/// A file name made of `name`'s safe characters.
fn safe_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    if safe.is_empty() || safe.starts_with('.') {
        format!("_{safe}")
    } else {
        safe
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_kubernetes_writes_them() {
        assert_eq!(quantity_millis("1500m"), Some(1500));
        assert_eq!(quantity_millis("2"), Some(2000));
        assert_eq!(quantity_millis("0.5"), Some(500));
        assert_eq!(quantity_millis("256Mi"), Some(256 * 1024 * 1024 * 1000));
        assert_eq!(quantity_millis("268435456"), Some(268_435_456_000));
        assert_eq!(quantity_millis("1k"), Some(1_000_000));
        assert_eq!(quantity_millis("1e3"), Some(1_000_000));
        assert_eq!(quantity_millis("1.5Gi"), Some(1_610_612_736_000));
        assert_eq!(quantity_millis("1x"), None);
        assert_eq!(quantity_millis(""), None);
    }

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

    #[test]
    fn paths_normalise_and_shell_words_quote() {
        assert_eq!(normalise("/home//gem/./x/").as_deref(), Some("/home/gem/x"));
        assert_eq!(normalise("/a/../b"), None);
        assert_eq!(normalise("relative"), None);
        assert_eq!(q("it's"), r"'it'\''s'");
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
        assert!(within_or_at("/home/gem", "/home"));
        assert!(!within_or_at("/homes", "/home"));
    }
}
