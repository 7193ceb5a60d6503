//! The simulated kubelet, driven through the `Kubelet` trait directly (no API server):
//! pods built by hand run on this machine, and what it reports is what a kubelet would.
//! These tests need root (CI runs as root): the kubelet makes namespaces and mounts.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::{json, Value};
use warren_kube_fake::kubelet::{KubeletConfig, PodInfo, SimulatedKubelet};
use warren_kube_fake::{Kubelet, StatusReporter};

const NAMESPACE: &str = "sandboxes";

/// A kubelet with its state, two claims (`user-data`, `skills`) and the statuses it
/// reported, per pod.
struct Node {
    kubelet: SimulatedKubelet,
    state: tempfile::TempDir,
    claims: tempfile::TempDir,
    statuses: Arc<Mutex<BTreeMap<String, Vec<PodStatus>>>>,
}

/// What stands in for warren in these tests: a shell script doing what each of warren's
/// pod commands does, in a small way.
const FAKE_WARREN: &str = r#"#!/bin/sh
set -e
case "$1" in
__k8s-prepare)
    { id -u; grep CapEff /proc/self/status; echo "key=${WARREN_AGENT_KEY:-none}"; echo "$2"; } \
        > /warren/user-data/prepare.txt
    mkdir -p /warren/user-data/workspace
    chown 1000:1000 /warren/user-data/workspace ;;
__agent-bundle)
    { id -u; echo "key=${WARREN_AGENT_KEY:-none}"; } > "$2/bundle.txt"
    # The bundle the sandbox container runs: this script, and a "loader" running it.
    cp "$0" "$2/warren"
    printf '#!/bin/sh\nexec "$@"\n' > "$2/ld.so"
    chmod 755 "$2/warren" "$2/ld.so" ;;
__container-agent)
    {
        id -u
        echo "key=${WARREN_AGENT_KEY:-none}"
        echo "args=$*"
        cat /opt/warren-agent/bundle.txt
        touch /opt/warren-agent/x 2>/dev/null && echo agent-writable || echo agent-read-only
    } > /home/gem/agent.txt
    cd /home/gem
    exec python3 -m http.server --bind 0.0.0.0 "${PORT:-7879}" ;;
*) echo "unknown command $1" >&2; exit 2 ;;
esac
"#;

impl Node {
    fn start() -> Self {
        Self::start_with(|_| {})
    }

    fn start_with(configure: impl FnOnce(&mut KubeletConfig)) -> Self {
        assert!(
            rustix::process::geteuid().is_root(),
            "the simulated kubelet's tests need root"
        );
        let state = tempfile::tempdir().unwrap();
        // Where the host's root shows them (not under /tmp, which every container has
        // empty): the kubelet must mask the claims there.
        let claims = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        for claim in ["user-data", "skills"] {
            let dir = claims.path().join(claim);
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let warren = claims.path().join("warren");
        std::fs::write(&warren, FAKE_WARREN).unwrap();
        std::fs::set_permissions(&warren, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut config = KubeletConfig {
            warren_binary: warren,
            claims: BTreeMap::from([
                (
                    "warren-user-data".to_owned(),
                    claims.path().join("user-data"),
                ),
                ("warren-skills".to_owned(), claims.path().join("skills")),
            ]),
            state_dir: state.path().join("kubelet"),
            unpullable_images: vec!["registry.invalid/nothing:1".to_owned()],
            cpu_capacity_millis: 2000,
        };
        configure(&mut config);
        Self {
            kubelet: SimulatedKubelet::new(config),
            state,
            claims,
            statuses: Arc::default(),
        }
    }

    fn claim(&self, claim: &str) -> PathBuf {
        self.claims.path().join(claim)
    }

    /// Tells the kubelet of a pod `name` with `spec`.
    fn create(&self, name: &str, spec: Value) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"),
                         "resourceVersion": "1"},
            "spec": spec,
        }))
        .expect("a valid pod");
        let statuses = Arc::clone(&self.statuses);
        let key = name.to_owned();
        self.kubelet.pod_created(
            pod,
            StatusReporter::new(move |status| {
                statuses
                    .lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_default()
                    .push(status);
            }),
        );
    }

    fn delete(&self, name: &str) {
        self.kubelet.pod_deleted(NAMESPACE, name);
    }

    fn info(&self, name: &str) -> PodInfo {
        self.kubelet.pod(NAMESPACE, name).expect("the pod runs")
    }

    /// Every status reported for `name` so far.
    fn history(&self, name: &str) -> Vec<PodStatus> {
        self.statuses
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits (at most a minute) until the latest status of `name` satisfies `done`, as JSON.
    fn wait_for(&self, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let latest = self
                .history(name)
                .last()
                .map(|s| serde_json::to_value(s).unwrap());
            if let Some(latest) = &latest {
                if done(latest) {
                    return latest.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "{name} never {what}; last status: {latest:#?}\nlogs: {:?}",
                self.all_logs(name)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_ready(&self, name: &str) -> Value {
        self.wait_for(name, "became Ready", |s| condition(s, "Ready") == "True")
    }

    fn wait_phase(&self, name: &str, phase: &str) -> Value {
        self.wait_for(name, &format!("reached {phase}"), |s| s["phase"] == phase)
    }

    fn all_logs(&self, name: &str) -> BTreeMap<String, String> {
        ["setup", "prepare", "agent-bundle", "main", "bad", "sandbox"]
            .iter()
            .filter_map(|c| {
                self.kubelet
                    .logs(NAMESPACE, name, c)
                    .map(|l| ((*c).to_owned(), l))
            })
            .collect()
    }
}

fn condition(status: &Value, kind: &str) -> String {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .map(|c| c["status"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// `GET path` from `ip:port`: the body of a 200 answer.
fn get(ip: &str, port: u16, path: &str) -> String {
    let address = SocketAddr::new(ip.parse().unwrap(), port);
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect to {address}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: pod\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "GET {path}: {head}");
    body.to_owned()
}

/// A container serving its working directory over HTTP on `port` once `prelude` ran.
fn serving(prelude: &str, port: u16) -> Value {
    json!({
        "name": "main",
        "image": "python:3.12-slim",
        "command": ["/bin/sh", "-c"],
        "args": [format!("{prelude}\nexec python3 -m http.server --bind 0.0.0.0 {port}")],
        "ports": [{"containerPort": port, "name": "http"}],
        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 2},
    })
}

/// Host pids of every process in the pid namespace `pid` is in.
fn processes_in_namespace_of(pid: u32) -> Vec<u32> {
    let namespace = std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok() == Some(namespace.clone()))
        .collect()
}

fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|target| Path::new(target).starts_with(dir))
        .map(str::to_owned)
        .collect()
}

fn netns_list() -> String {
    String::from_utf8(
        std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

/// Nothing of a pod is left: its processes, its network namespace and veth, its mounts.
fn assert_nothing_left(node: &Node, info: &PodInfo, processes: &[u32]) {
    for pid in processes {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} of the pod is still there"
        );
    }
    let netns = info.netns.as_ref().unwrap();
    assert!(
        !netns_list()
            .lines()
            .any(|l| l.split(' ').next() == Some(netns)),
        "{netns} is still there"
    );
    // The kernel frees a namespace's devices after the namespace: the veth goes shortly.
    let interface = Path::new("/sys/class/net").join(info.host_interface.as_ref().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while interface.exists() {
        assert!(
            Instant::now() < deadline,
            "{} is still there",
            interface.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(mounts_under(node.state.path()), Vec::<String>::new());
    let pods = node.state.path().join("kubelet/pods");
    let left: Vec<_> = std::fs::read_dir(&pods)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", pods.display());
}

#[test]
fn a_pod_runs_its_init_container_then_its_container_as_declared_and_is_ready_on_its_own_address() {
    let node = Node::start();
    let mut main = serving(
        "cd /shared
         {
             id
             grep -E '^(CapEff|NoNewPrivs)' /proc/self/status
             echo \"greeting=${GREETING:-unset} secret=$SECRET\"
             hostname
             touch /rootfile 2>/dev/null && echo root-writable || echo root-read-only
             cat /proc/1/cmdline | tr '\\0' ' '; echo
         } > main.txt",
        7070,
    );
    main["env"] = json!([{"name": "SECRET", "value": "s3cret"}]);
    main["securityContext"] = json!({
        "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": true,
    });
    main["volumeMounts"] = json!([{"name": "shared", "mountPath": "/shared"}]);
    let amounts = json!({"cpu": "1500m", "memory": "64Mi"});
    main["resources"] = json!({"requests": amounts, "limits": amounts});
    node.create(
        "web",
        json!({
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "initContainers": [{
                "name": "setup",
                "image": "python:3.12-slim",
                "command": ["/bin/sh", "-c",
                            "id -u > /shared/init-uid; echo \"$GREETING\" > /shared/greeting"],
                "env": [{"name": "GREETING", "value": "hello"}],
                "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
                "resources": {"requests": amounts, "limits": amounts},
            }],
            "containers": [main],
            "volumes": [{"name": "shared", "emptyDir": {}}],
        }),
    );
    let status = node.wait_ready("web");
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["qosClass"], "Guaranteed");
    for kind in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(condition(&status, kind), "True", "{kind}: {status:#}");
    }
    assert!(status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["lastTransitionTime"].is_string()));
    let init = &status["initContainerStatuses"][0];
    assert_eq!(init["state"]["terminated"]["exitCode"], 0, "{init:#}");
    assert_eq!(init["state"]["terminated"]["reason"], "Completed");
    let container = &status["containerStatuses"][0];
    assert_eq!(container["ready"], true);
    assert!(container["state"]["running"]["startedAt"].is_string());

    // The pod's own address, on the host's side of its /30.
    let pod_ip: Ipv4Addr = status["podIP"].as_str().unwrap().parse().unwrap();
    let host_ip: Ipv4Addr = status["hostIP"].as_str().unwrap().parse().unwrap();
    assert_eq!(pod_ip.octets()[..2], [10, 232]);
    assert_eq!(u32::from(pod_ip) % 4, 2);
    assert_eq!(u32::from(host_ip), u32::from(pod_ip) - 1);
    assert_eq!(node.info("web").pod_ip, Some(pod_ip));

    // The init container ran as root with its environment; the container as 1000:1000,
    // with no capability, no new privileges, a read-only root, and only its own
    // environment; its command is PID 1 of its namespace.
    let ip = pod_ip.to_string();
    assert_eq!(get(&ip, 7070, "/init-uid"), "0\n");
    assert_eq!(get(&ip, 7070, "/greeting"), "hello\n");
    let main = get(&ip, 7070, "/main.txt");
    assert!(
        main.starts_with("uid=1000(") && main.contains(" gid=1000("),
        "{main}"
    );
    assert!(main.contains("CapEff:\t0000000000000000"), "{main}");
    assert!(main.contains("NoNewPrivs:\t1"), "{main}");
    assert!(main.contains("greeting=unset secret=s3cret"), "{main}");
    assert!(
        main.contains("\nweb\n"),
        "the pod's name is its hostname: {main}"
    );
    assert!(main.contains("root-read-only"), "{main}");
    assert!(main.contains("python3 -m http.server"), "{main}");
    node.delete("web");
}

#[test]
fn two_pods_listen_on_the_same_port_each_on_an_address_of_its_own() {
    let node = Node::start();
    for name in ["one", "two"] {
        node.create(
            name,
            json!({"containers": [serving(&format!("cd /tmp && echo {name} > name"), 8080)]}),
        );
    }
    let one = node.wait_ready("one");
    let two = node.wait_ready("two");
    let (one, two) = (
        one["podIP"].as_str().unwrap().to_owned(),
        two["podIP"].as_str().unwrap().to_owned(),
    );
    assert_ne!(one, two);
    assert_eq!(get(&one, 8080, "/name"), "one\n");
    assert_eq!(get(&two, 8080, "/name"), "two\n");
    assert_ne!(node.info("one").netns, node.info("two").netns);
}

#[test]
fn claim_sub_paths_are_mounted_read_write_or_read_only_as_declared_and_nothing_else_of_a_claim_shows(
) {
    let node = Node::start();
    let user_data = node.claim("user-data");
    let workspace = user_data.join("shared/alice/workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(user_data.join("shared/bob/workspace")).unwrap();
    std::fs::write(user_data.join("shared/bob/workspace/secret.txt"), "bob's").unwrap();
    std::fs::write(workspace.join("hello.txt"), "hello from the claim\n").unwrap();
    std::os::unix::fs::chown(&workspace, Some(1000), Some(1000)).unwrap();
    let skills = node.claim("skills");
    std::fs::create_dir_all(skills.join("skill-projections/alice")).unwrap();
    std::fs::create_dir_all(skills.join("skill-projections/bob")).unwrap();
    std::fs::write(skills.join("skill-projections/alice/s.md"), "a skill\n").unwrap();
    let claims_root = node.claims.path().display().to_string();
    let script = format!(
        "exec > /home/gem/user-data/report.txt 2>&1
         cat /home/gem/user-data/hello.txt
         echo from-pod > /home/gem/user-data/written.txt && echo user-data-writable
         cat /home/gem/skills/s.md
         touch /home/gem/skills/new 2>/dev/null && echo skills-writable || echo skills-read-only
         echo skills: $(ls /home/gem/skills)
         echo home: $(ls -A /home)
         ls -A '{claims_root}/user-data' | wc -l | sed 's/^/claim-root-entries: /'
         test -d /home/gem/made && echo made-sub-path-mounted
         echo home-gem-writable > /home/gem/probe && cat /home/gem/probe
         df -k /dev/shm | tail -n 1 | awk '{{print \"shm-size: \" $2}}'"
    );
    node.create(
        "mounts",
        json!({
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true},
            "containers": [{
                "name": "main",
                "image": "python:3.12-slim",
                "command": ["/bin/sh", "-c", script],
                "volumeMounts": [
                    {"name": "home", "mountPath": "/home/gem"},
                    {"name": "user-data", "mountPath": "/home/gem/user-data",
                     "subPath": "shared/alice/workspace"},
                    {"name": "skills", "mountPath": "/home/gem/skills",
                     "subPath": "skill-projections/alice", "readOnly": true},
                    {"name": "user-data", "mountPath": "/home/gem/made",
                     "subPath": "shared/alice/not-yet"},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ],
            }],
            "volumes": [
                {"name": "user-data", "persistentVolumeClaim": {"claimName": "warren-user-data"}},
                {"name": "skills",
                 "persistentVolumeClaim": {"claimName": "warren-skills", "readOnly": true}},
                {"name": "home", "emptyDir": {"sizeLimit": "16Mi"}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            ],
        }),
    );
    let status = node.wait_for("mounts", "finished", |s| {
        s["phase"] == "Succeeded" || s["phase"] == "Failed"
    });
    let report = std::fs::read_to_string(workspace.join("report.txt"))
        .unwrap_or_else(|e| panic!("no report ({e}): {status:#} {:?}", node.all_logs("mounts")));
    assert_eq!(status["phase"], "Succeeded", "{report}");
    assert!(report.contains("hello from the claim"), "{report}");
    assert!(report.contains("user-data-writable"), "{report}");
    assert!(report.contains("a skill"), "{report}");
    assert!(report.contains("skills-read-only"), "{report}");
    assert!(report.contains("skills: s.md\n"), "{report}");
    assert!(report.contains("home-gem-writable"), "{report}");
    assert!(report.contains("shm-size: 1024\n"), "{report}");
    // The claims' directories are masked where the host's root would show them.
    assert!(report.contains("claim-root-entries: 0"), "{report}");
    // The host's /home stays visible beside the mount point made in it.
    let mut home: Vec<String> = std::fs::read_dir("/home")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "gem")
        .chain(["gem".to_owned()])
        .collect();
    home.sort();
    assert!(
        report.contains(&format!("home: {}\n", home.join(" "))),
        "{report}"
    );
    // A missing subPath is made, as root, with the claim root's mode.
    assert!(report.contains("made-sub-path-mounted"), "{report}");
    let made = std::fs::metadata(user_data.join("shared/alice/not-yet")).unwrap();
    assert_eq!((made.uid(), made.mode() & 0o777), (0, 0o755));
    let written = std::fs::metadata(workspace.join("written.txt")).unwrap();
    assert_eq!((written.uid(), written.gid()), (1000, 1000));
    assert!(!skills.join("skill-projections/alice/new").exists());
    node.delete("mounts");
}

#[test]
fn a_sub_path_leaving_its_volume_is_refused() {
    let node = Node::start();
    let user_data = node.claim("user-data");
    std::fs::create_dir_all(user_data.join("shared")).unwrap();
    std::os::unix::fs::symlink("/etc", user_data.join("shared/escape")).unwrap();
    node.create(
        "escape",
        json!({
            "containers": [{
                "name": "main", "image": "busybox", "command": ["/bin/sleep", "100"],
                "volumeMounts": [{"name": "user-data", "mountPath": "/data",
                                  "subPath": "shared/escape"}],
            }],
            "volumes": [{"name": "user-data",
                         "persistentVolumeClaim": {"claimName": "warren-user-data"}}],
        }),
    );
    let status = node.wait_for("escape", "refused its container", |s| {
        s["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerError"
    });
    let message = status["containerStatuses"][0]["state"]["waiting"]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("not within volume path"), "{message}");
    node.delete("escape");
}

#[test]
fn an_empty_dirs_size_limit_is_enforced() {
    let node = Node::start();
    node.create(
        "scratch",
        json!({
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": [{
                "name": "main",
                "image": "python:3.12-slim",
                "command": ["/bin/sh", "-c",
                    "head -c 524288 /dev/zero > /scratch/half || exit 3
                     head -c 2097152 /dev/zero > /scratch/double && exit 4
                     exit 0"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}],
        }),
    );
    let status = node.wait_for("scratch", "finished", |s| {
        s["phase"] == "Succeeded" || s["phase"] == "Failed"
    });
    let logs = node.kubelet.logs(NAMESPACE, "scratch", "main").unwrap();
    assert_eq!(status["phase"], "Succeeded", "{status:#} {logs}");
    assert!(logs.contains("No space left on device"), "{logs}");
    node.delete("scratch");
}

#[test]
fn a_failing_init_container_fails_the_pod_with_its_exit_code_and_log_and_the_container_never_starts(
) {
    let node = Node::start();
    node.create(
        "broken",
        json!({
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "setup", "image": "warren", "command": ["/bin/true"]},
                {"name": "bad", "image": "warren",
                 "command": ["/bin/sh", "-c", "echo cannot prepare >&2; exit 7"],
                 "terminationMessagePolicy": "FallbackToLogsOnError"},
            ],
            "containers": [{"name": "main", "image": "python:3.12-slim",
                            "command": ["/bin/sleep", "100"]}],
        }),
    );
    let status = node.wait_phase("broken", "Failed");
    let first = &status["initContainerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (first["exitCode"].as_i64(), first["reason"].as_str()),
        (Some(0), Some("Completed"))
    );
    let failed = &status["initContainerStatuses"][1]["state"]["terminated"];
    assert_eq!(failed["exitCode"], 7, "{status:#}");
    assert_eq!(failed["reason"], "Error");
    assert!(failed["message"]
        .as_str()
        .unwrap()
        .contains("cannot prepare"));
    assert_eq!(condition(&status, "Initialized"), "False");
    assert_eq!(
        status["containerStatuses"][0]["state"]["waiting"]["reason"],
        "PodInitializing"
    );
    assert!(node.kubelet.logs(NAMESPACE, "broken", "main").is_none());
    node.delete("broken");
}

#[test]
fn a_container_that_exits_fails_the_pod_with_its_exit_code() {
    let node = Node::start();
    node.create(
        "exits",
        json!({
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python:3.12-slim",
                            "command": ["/bin/sh", "-c", "echo bye; exit 3"]}],
        }),
    );
    let status = node.wait_phase("exits", "Failed");
    let terminated = &status["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 3, "{status:#}");
    assert_eq!(terminated["reason"], "Error");
    assert_eq!(condition(&status, "Ready"), "False");
    assert_eq!(
        node.kubelet.logs(NAMESPACE, "exits", "main").as_deref(),
        Some("bye\n")
    );
    node.delete("exits");
}

#[test]
fn a_container_that_must_not_run_as_root_but_would_is_not_started() {
    let node = Node::start();
    node.create(
        "rootful",
        json!({
            "securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "main", "image": "python:3.12-slim",
                            "command": ["/bin/sleep", "100"]}],
        }),
    );
    let status = node.wait_for("rootful", "refused its container", |s| {
        s["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    });
    assert_eq!(status["phase"], "Pending");
    node.delete("rootful");
}

#[test]
fn an_unpullable_image_leaves_the_pod_pending_in_image_pull_back_off() {
    let node = Node::start();
    node.create(
        "unpullable",
        json!({"containers": [{"name": "main", "image": "registry.invalid/nothing:1",
                               "command": ["/bin/sleep", "100"]}]}),
    );
    let status = node.wait_for("unpullable", "backed off pulling", |s| {
        s["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
    });
    assert_eq!(status["phase"], "Pending");
    let reasons: Vec<String> = node
        .history("unpullable")
        .iter()
        .filter_map(|s| {
            let status = serde_json::to_value(s).unwrap();
            status["containerStatuses"][0]["state"]["waiting"]["reason"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(reasons.iter().any(|r| r == "ErrImagePull"), "{reasons:?}");
    assert_eq!(node.info("unpullable").netns, None, "no sandbox is made");
    node.delete("unpullable");
}

#[test]
fn a_pod_requesting_more_cpu_than_the_node_has_is_unschedulable() {
    let node = Node::start_with(|config| config.cpu_capacity_millis = 1000);
    node.create(
        "big",
        json!({"containers": [{"name": "main", "image": "python:3.12-slim",
                               "command": ["/bin/sleep", "100"],
                               "resources": {"limits": {"cpu": "1500m"}}}]}),
    );
    let status = node.wait_for("big", "was found unschedulable", |s| {
        condition(s, "PodScheduled") == "False"
    });
    assert_eq!(status["phase"], "Pending");
    let scheduled = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .unwrap();
    assert_eq!(scheduled["reason"], "Unschedulable");
    assert!(scheduled["message"]
        .as_str()
        .unwrap()
        .contains("Insufficient cpu"));
    assert_eq!(node.info("big").netns, None);
    node.delete("big");
}

#[test]
fn warrens_pod_shape_runs_the_configured_binary_and_only_the_agent_gets_its_key() {
    let node = Node::start();
    let key = "0123456789abcdef".repeat(4);
    let agent_port = 7879;
    let unprivileged = json!({
        "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true, "privileged": false,
        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    });
    let mut prepare_security = unprivileged.clone();
    prepare_security["runAsUser"] = json!(0);
    prepare_security["runAsGroup"] = json!(0);
    prepare_security["runAsNonRoot"] = json!(false);
    prepare_security["capabilities"]["add"] = json!(["CHOWN", "DAC_OVERRIDE"]);
    node.create(
        "sandbox-1",
        json!({
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [
                {"name": "prepare", "image": "ghcr.io/example/warren:1.0",
                 "command": ["/usr/local/bin/warren", "__k8s-prepare", "{\"workdir\":\"projects/a\"}"],
                 "securityContext": prepare_security,
                 "volumeMounts": [{"name": "user-data", "mountPath": "/warren/user-data",
                                   "subPath": "shared/alice"}]},
                {"name": "agent-bundle", "image": "ghcr.io/example/warren:1.0",
                 "command": ["/usr/local/bin/warren", "__agent-bundle", "/opt/warren-agent"],
                 "securityContext": unprivileged,
                 "volumeMounts": [{"name": "agent", "mountPath": "/opt/warren-agent"}]},
            ],
            "containers": [{
                "name": "sandbox", "image": "python:3.12-slim",
                "command": ["/opt/warren-agent/ld.so", "/opt/warren-agent/warren",
                            "__container-agent", "--listen", "0.0.0.0:7879"],
                "env": [{"name": "WARREN_AGENT_KEY", "value": key}],
                "ports": [{"name": "agent", "containerPort": agent_port, "protocol": "TCP"}],
                "readinessProbe": {"tcpSocket": {"port": agent_port}, "periodSeconds": 2},
                "securityContext": unprivileged,
                "volumeMounts": [
                    {"name": "home", "mountPath": "/home/gem"},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "agent", "mountPath": "/opt/warren-agent", "readOnly": true},
                    {"name": "user-data", "mountPath": "/home/gem/user-data",
                     "subPath": "shared/alice/workspace"},
                    {"name": "skills", "mountPath": "/home/gem/skills",
                     "subPath": "skill-projections/alice", "readOnly": true},
                ],
            }],
            "volumes": [
                {"name": "user-data", "persistentVolumeClaim": {"claimName": "warren-user-data"}},
                {"name": "skills",
                 "persistentVolumeClaim": {"claimName": "warren-skills", "readOnly": true}},
                {"name": "home", "emptyDir": {"sizeLimit": "268435456"}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "268435456"}},
                {"name": "agent", "emptyDir": {"sizeLimit": "268435456"}},
            ],
        }),
    );
    let status = node.wait_ready("sandbox-1");
    let ip = status["podIP"].as_str().unwrap();
    let agent = get(ip, agent_port as u16, "/agent.txt");
    assert_eq!(
        agent,
        format!(
            "1000\nkey={key}\nargs=__container-agent --listen 0.0.0.0:7879\n1000\nkey=none\n\
             agent-read-only\n"
        )
    );
    // The root init container: root with CHOWN and DAC_OVERRIDE only, no key, the uid's
    // subtree of the claim made by the kubelet.
    let prepared =
        std::fs::read_to_string(node.claim("user-data").join("shared/alice/prepare.txt")).unwrap();
    assert_eq!(
        prepared,
        "0\nCapEff:\t0000000000000003\nkey=none\n{\"workdir\":\"projects/a\"}\n"
    );
    let workspace =
        std::fs::metadata(node.claim("user-data").join("shared/alice/workspace")).unwrap();
    assert_eq!((workspace.uid(), workspace.gid()), (1000, 1000));
    // The key is in no command line of the pod's.
    let info = node.info("sandbox-1");
    for pid in processes_in_namespace_of(info.container_pids[0]) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&cmdline).contains(&key));
    }
    node.delete("sandbox-1");
}

#[test]
fn deleting_a_pod_leaves_no_process_network_namespace_or_mount_behind() {
    let node = Node::start();
    let mut main = serving("sleep 1000 & (sleep 1001 &); cd /tmp", 9090);
    main["volumeMounts"] = json!([{"name": "tmp", "mountPath": "/tmp"}]);
    node.create(
        "doomed",
        json!({
            "containers": [main],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "8Mi"}}],
        }),
    );
    node.wait_ready("doomed");
    let info = node.info("doomed");
    assert_eq!(info.container_pids.len(), 1);
    let processes = processes_in_namespace_of(info.container_pids[0]);
    assert!(processes.len() >= 3, "{processes:?}");
    assert!(netns_list().contains(info.netns.as_ref().unwrap()));
    assert!(
        !mounts_under(node.state.path()).is_empty(),
        "the emptyDir's tmpfs"
    );

    node.delete("doomed");
    assert!(node.kubelet.pod(NAMESPACE, "doomed").is_none());
    assert_nothing_left(&node, &info, &processes);
    // The log stays readable after the pod is gone.
    assert!(node.kubelet.logs(NAMESPACE, "doomed", "main").is_some());
}

#[test]
fn dropping_the_kubelet_stops_every_pod_it_still_runs() {
    let node = Node::start();
    let mut left = Vec::new();
    for name in ["first", "second"] {
        let mut main = serving("cd /tmp; sleep 1000 &", 9191);
        main["volumeMounts"] = json!([{"name": "tmp", "mountPath": "/tmp"}]);
        node.create(
            name,
            json!({
                "initContainers": [{"name": "setup", "image": "warren",
                                    "command": ["/bin/true"]}],
                "containers": [main],
                "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "8Mi"}}],
            }),
        );
    }
    for name in ["first", "second"] {
        node.wait_ready(name);
        let info = node.info(name);
        let processes = processes_in_namespace_of(info.container_pids[0]);
        left.push((info, processes));
    }
    let Node {
        kubelet,
        state,
        claims,
        statuses,
    } = node;
    drop(kubelet);
    // A kubelet that runs nothing, to check with the same helper.
    let node = Node {
        kubelet: SimulatedKubelet::new(KubeletConfig {
            warren_binary: "/bin/true".into(),
            claims: BTreeMap::new(),
            state_dir: state.path().join("other"),
            unpullable_images: Vec::new(),
            cpu_capacity_millis: 0,
        }),
        state,
        claims,
        statuses,
    };
    for (info, processes) in &left {
        assert_nothing_left(&node, info, processes);
    }
}
