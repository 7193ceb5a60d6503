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

use std::collections::BTreeMap;
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::{Kubelet, StatusReporter};
use host::{children, kill_container, mounts_under, sweep_leftovers, unmount, RECORDS};
use pod::run_pod;

mod host;
mod network;
mod pod;
mod status;
mod view;
mod volumes;

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
