//! The DeerFlow layout on every backend that executes commands (issue 16): the mount view
//! it promises (I7 as data), persistence, read-only skills, uid 1000, and the escapes a
//! layout that mounts a directory *inside* a user's tree invites (I2, I11). Each rule runs
//! on the local and the Docker backend, as `layouts::local::<rule>` and
//! `layouts::docker::<rule>`, through the same [`Host`] machinery as the conformance suite.
//!
//! Two levels: through the API, as a client sees it; and against each backend directly,
//! because the provisioner already refuses a workdir with a link in it before a runtime
//! starts, so only a backend-level test proves the backend would refuse it too (and, for
//! Docker, that the bind is staged by descriptor rather than handed to dockerd as a path).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use warren_backend::{Backend, BackendKind, ExecRequest, RuntimeSpec};
use warren_core::{ExtraMount, LayoutName, NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};
use warren_test_support::TestServer;

use super::bin;
use super::conformance::Host;
use super::output as out;

conformance_suite!(
    a_deerflow_runtime_shows_its_workdir_and_two_read_only_skill_trees_and_nothing_else,
    files_at_mnt_user_data_are_the_thread_workdir_and_outlive_the_runtime,
    a_workdir_swapped_for_a_link_before_the_runtime_starts_is_refused_and_nothing_is_mounted,
    a_link_inside_mnt_user_data_exposes_nothing_of_the_host_through_the_file_api,
    the_backend_itself_refuses_a_workdir_a_link_leads_out_of_the_workspace,
    a_reaped_deerflow_runtime_resumes_its_home_from_a_snapshot_beside_its_workdir,
    a_deerflow_runtime_is_adopted_after_a_restart_and_never_taken_for_another_layout,
    extra_mounts_show_the_operator_directories_as_asked_and_a_link_beneath_the_operator_root_is_refused,
);

const THREAD: &str = "threads/t1/user-data";

fn stdout(result: &serde_json::Value) -> &str {
    result["stdout"].as_str().unwrap_or_default()
}

/// Creates `workdir` and a DeerFlow-layout sandbox of (uid, scope) bound to it.
async fn deerflow_sandbox(server: &TestServer, uid: &str, scope: &str, workdir: &str) -> String {
    server.workdir(uid, workdir).await;
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": uid, "runtime_scope_id": scope, "workdir": workdir, "layout": "deerflow",
        })))
        .await;
    assert!(
        status == 201 || status == 200,
        "create sandbox: {status} {body}"
    );
    assert_eq!(body["layout"], "deerflow", "{body}");
    body["sandbox_id"].as_str().expect("sandbox_id").to_owned()
}

/// One line of `/proc/self/mountinfo`: (root within its filesystem, mount point,
/// per-mount options, filesystem type).
fn mountinfo(text: &str) -> Vec<(String, String, String, String)> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some((
                fields.get(3)?.to_string(),
                fields.get(4)?.to_string(),
                fields.get(5)?.to_string(),
                fields.get(dash + 1)?.to_string(),
            ))
        })
        .collect()
}

async fn a_deerflow_runtime_shows_its_workdir_and_two_read_only_skill_trees_and_nothing_else(
    host: Host,
) {
    let server = host.start();
    // Another thread of the same uid and a personal skill, made through an ARS sandbox.
    let ars = server.sandbox("alice", "ars", "projects/p").await;
    let plant = server
        .exec(
            &ars,
            "cd /home/gem/user-data && mkdir -p threads/t2/user-data agents/skills/mine && echo other > threads/t2/user-data/secret && echo mine > agents/skills/mine/SKILL.md",
        )
        .await;
    assert_eq!(plant["exit_code"], 0, "{plant}");
    let id = deerflow_sandbox(&server, "alice", "df", THREAD).await;
    let view = server
        .exec(
            &id,
            "id -u; id -g; pwd; echo $HOME; ls /mnt/user-data; ls /mnt/skills; cat /mnt/skills/custom/mine/SKILL.md",
        )
        .await;
    assert_eq!(
        stdout(&view),
        "1000\n1000\n/mnt/user-data\n/home/gem\noutputs\nuploads\nworkspace\ncustom\npublic\nmine\n",
        "{host:?}: uid 1000 in the workdir, its skeleton, both skill trees: {view}"
    );
    let writes = server
        .exec(
            &id,
            "for d in /mnt/skills/public /mnt/skills/custom /mnt/skills; do touch $d/x 2>&1 || true; done; ls -d /home/gem/user-data /home/gem/skills 2>&1; ls -A /mnt /mnt/user-data/..; echo w > /mnt/user-data/outputs/w && echo wrote",
        )
        .await;
    let text = out(&writes);
    assert_eq!(
        text.matches("Read-only file system").count(),
        3,
        "{host:?}: both skill trees and /mnt itself are read-only (EROFS): {text}"
    );
    assert_eq!(
        text.matches("No such file").count(),
        2,
        "{host:?}: the ARS mount points are not there: {text}"
    );
    assert!(
        text.ends_with(
            "/mnt:\nskills\nuser-data\n\n/mnt/user-data/..:\nskills\nuser-data\nwrote\n"
        ),
        "{host:?}: nothing but the layout's mounts under /mnt, and the workdir writable: {text}"
    );

    let info = server.exec(&id, "cat /proc/self/mountinfo").await;
    let mounts = mountinfo(stdout(&info));
    let data_name = server
        .data_dir()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    // Every mount of a directory of warren's data dir: the persistent ones, and on Docker
    // the agent bundle.
    let mut persistent: Vec<_> = mounts
        .iter()
        .filter(|(root, point, _, _)| root.contains(&data_name) && point != "/opt/warren-agent")
        .collect();
    persistent.sort_by(|a, b| a.1.cmp(&b.1));
    let described: Vec<String> = persistent
        .iter()
        .map(|(root, point, options, _)| format!("{point} {options} {root}"))
        .collect();
    assert_eq!(
        persistent
            .iter()
            .map(|(_, point, options, _)| (point.as_str(), &options[..2]))
            .collect::<Vec<_>>(),
        [
            ("/mnt/skills/custom", "ro"),
            ("/mnt/skills/public", "ro"),
            ("/mnt/user-data", "rw")
        ],
        "{host:?}: exactly the three persistent mounts: {described:?}"
    );
    let root_of = |point: &str| &persistent.iter().find(|m| m.1 == point).unwrap().0;
    assert!(root_of("/mnt/user-data").ends_with("/workspace/threads/t1/user-data"));
    assert!(root_of("/mnt/skills/custom").ends_with("/workspace/agents/skills"));
    assert!(!root_of("/mnt/skills/public").contains("/workspace"));
    for (_, point, options, _) in &persistent {
        // Everything the local runtime binds is nosuid and nodev. Docker's own remount of
        // a read-only bind resets those flags (its API cannot ask for them); what stays
        // writable keeps them from warren's staging mount.
        if host == Host::Local || options.starts_with("rw") {
            assert!(
                options.contains("nosuid") && options.contains("nodev"),
                "{host:?}: {point} {options}"
            );
        }
    }
    assert!(
        mounts
            .iter()
            .any(|(_, point, _, fs)| point == "/home/gem" && fs == "tmpfs"),
        "{host:?}: the home is a tmpfs"
    );
}

async fn files_at_mnt_user_data_are_the_thread_workdir_and_outlive_the_runtime(host: Host) {
    let server = host.start();
    let id = deerflow_sandbox(&server, "alice", "df", THREAD).await;
    let wrote = server
        .exec(
            &id,
            "echo kept > /mnt/user-data/workspace/x && echo gone > /tmp/y && echo ok",
        )
        .await;
    assert_eq!(stdout(&wrote), "ok\n", "{host:?}: {wrote}");
    let on_host = server
        .workspace_of("alice")
        .join(THREAD)
        .join("workspace/x");
    assert_eq!(std::fs::read_to_string(&on_host).unwrap(), "kept\n");
    if super::running_as_root() {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&on_host).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{host:?}: I11");
    }
    // The native file API of an ARS sandbox of the same uid sees it in the UserWorkspace.
    let ars = server.sandbox("alice", "ars", "projects/p").await;
    let response = server
        .request(Method::GET, &format!("/v1/sandboxes/{ars}/files"))
        .query(&[(
            "path",
            "/home/gem/user-data/threads/t1/user-data/workspace/x",
        )])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "kept\n");
    server.terminate(&id).await;
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": "df", "workdir": THREAD, "layout": "deerflow",
        })))
        .await;
    assert_eq!(
        (status, body["generation"].as_i64()),
        (201, Some(2)),
        "{body}"
    );
    let next = server
        .exec(
            &id,
            "cat /mnt/user-data/workspace/x; cat /tmp/y 2>/dev/null || echo fresh",
        )
        .await;
    assert_eq!(
        stdout(&next),
        "kept\nfresh\n",
        "{host:?}: the workdir outlives the runtime (I15), /tmp does not: {next}"
    );
}

async fn a_reaped_deerflow_runtime_resumes_its_home_from_a_snapshot_beside_its_workdir(host: Host) {
    let server = host.start_with(&["--idle-timeout", "1", "--reap-interval", "1"]);
    let id = deerflow_sandbox(&server, "alice", "df", THREAD).await;
    let setup = "echo kept > workspace/kept; echo note > ~/note; mkdir ~/user-data; echo gone > /tmp/scratch";
    assert_eq!(server.exec(&id, setup).await["exit_code"], 0);
    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(15))
            .await,
        "{host:?}: an idle runtime was not reaped"
    );
    let next = server
        .exec(
            &id,
            "cat workspace/kept ~/note; ls -A ~; cat /tmp/scratch 2>/dev/null || echo no-tmp",
        )
        .await;
    assert_eq!(
        stdout(&next),
        "kept\nnote\nnote\nuser-data\nno-tmp\n",
        "{host:?}: the workdir stays (I15), the whole home comes back (I30), a directory named like an ARS mount point included, /tmp does not: {next}"
    );
}

async fn a_deerflow_runtime_is_adopted_after_a_restart_and_never_taken_for_another_layout(
    host: Host,
) {
    let mut server = host.start();
    let id = deerflow_sandbox(&server, "alice", "df", THREAD).await;
    server.exec(&id, "echo kept > /tmp/state").await;
    let handle = host.runtime_handle(&server, &id);
    assert!(!handle.is_empty(), "{host:?}: no runtime found");
    server.restart_after_kill();
    let after = server.exec(&id, "cat /tmp/state; pwd").await;
    assert_eq!(
        stdout(&after),
        "kept\n/mnt/user-data\n",
        "{host:?}: the runtime was adopted (I16): {after}"
    );
    assert_eq!(host.runtime_handle(&server, &id), handle, "{host:?}");
    // The same uid, scope and workdir, bound to the ARS layout while the DeerFlow
    // generation lives: refused, the live runtime keeps its view.
    let (status, body) = server
        .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
            "uid": "alice", "runtime_scope_id": "df", "workdir": THREAD, "layout": "ars",
        })))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("layout_conflict")),
        "{body}"
    );
    assert_eq!(host.runtime_handle(&server, &id), handle, "{host:?}");
}

/// Whether anything of this server's sandbox `id` is left on the host: a runtime
/// directory or container, a staging directory, a host mount of its.
fn started_anything(host: Host, server: &TestServer, id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let data = server.data_dir();
    match host {
        Host::Kubernetes | Host::KubernetesReal | Host::LocalGvisor | Host::DockerGvisor => {
            unreachable!("the layout rules run on the local and Docker backends' kernel tier")
        }
        Host::Local => {
            if data.join("runtimes").join(id).join("runtime.json").exists() {
                found.push("a runtime record".to_owned());
            }
        }
        Host::Docker => {
            let containers = warren_test_support::docker(&[
                "ps",
                "-aq",
                "--filter",
                &format!("label=dev.warren.sandbox={id}"),
                "--filter",
                &format!(
                    "label=dev.warren.instance={}",
                    warren_test_support::docker_instance(&data)
                ),
            ]);
            if !containers.is_empty() {
                found.push(format!("container {containers}"));
            }
        }
    }
    if data.join("docker/binds").join(id).exists() {
        found.push("a staging directory".to_owned());
    }
    // Only this server's: tests running beside it stage binds of their own, and derive
    // the same sandbox ids from the same uids and scopes.
    let ours = data.to_string_lossy().into_owned();
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in host_mounts.lines() {
        let of_sandbox = line.contains(&format!("{ours}/docker/sockets/{id}"))
            || line.contains(&format!("{ours}/runtimes/{id}"));
        if of_sandbox || line.contains(&format!("{ours}/docker/binds")) {
            found.push(format!("host mount {line}"));
        }
    }
    found
}

async fn a_workdir_swapped_for_a_link_before_the_runtime_starts_is_refused_and_nothing_is_mounted(
    host: Host,
) {
    let server = host.start();
    // Bob's thread, which alice must never see.
    server.workdir("bob", THREAD).await;
    let bob = server.workspace_of("bob");
    std::fs::write(bob.join(THREAD).join("bob-secret"), "bob's\n").unwrap();
    let ars = server.sandbox("alice", "ars", "projects/p").await;
    let id = deerflow_sandbox(&server, "alice", "df", THREAD).await;
    // From alice's own ARS runtime, before her DeerFlow runtime ever starts: the first
    // component, then the last, swapped for a link to bob's tree on the host.
    let swaps = [
        format!(
            "mv threads threads.real && ln -s {} threads",
            bob.join("threads").display()
        ),
        format!(
            "mv threads/t1/user-data threads/t1/real && ln -s {} threads/t1/user-data",
            bob.join(THREAD).display()
        ),
    ];
    let restores = [
        "rm threads && mv threads.real threads",
        "rm threads/t1/user-data && mv threads/t1/real threads/t1/user-data",
    ];
    for (swap, restore) in swaps.iter().zip(restores) {
        let swapped = server
            .exec(&ars, &format!("cd /home/gem/user-data && {swap}"))
            .await;
        assert_eq!(swapped["exit_code"], 0, "{swapped}");
        let (status, body) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(&json!({"command": "cat /mnt/user-data/bob-secret; ls /mnt/user-data"})),
            )
            .await;
        assert_ne!(
            status, 200,
            "{host:?} ({swap}): the runtime started: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("symlink") && message.contains(THREAD),
            "{host:?} ({swap}): a clear refusal naming the workdir: {status} {body}"
        );
        assert!(
            !message.contains(&server.data_dir().to_string_lossy().into_owned()),
            "{host:?}: a host path in the message (I1): {message}"
        );
        let left = started_anything(host, &server, &id);
        assert!(left.is_empty(), "{host:?} ({swap}): {left:?}");
        let restored = server
            .exec(&ars, &format!("cd /home/gem/user-data && {restore}"))
            .await;
        assert_eq!(restored["exit_code"], 0, "{restored}");
    }
    let fine = server.exec(&id, "ls /mnt/user-data").await;
    assert_eq!(
        stdout(&fine),
        "outputs\nuploads\nworkspace\n",
        "{host:?}: once the workdir is a directory again, the runtime starts on it: {fine}"
    );
}

async fn a_link_inside_mnt_user_data_exposes_nothing_of_the_host_through_the_file_api(host: Host) {
    let server = host.start();
    let id = deerflow_sandbox(&server, "alice", "df", THREAD).await;
    let links = server
        .exec(
            &id,
            "cd /mnt/user-data && ln -s / root && ln -s /etc/passwd passwd && ln -s ../../../../.. up && ln -s root/etc workspace/etc && echo ok",
        )
        .await;
    assert_eq!(stdout(&links), "ok\n", "{links}");
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    for (route, path) in [
        ("files", "/mnt/user-data/root/etc/passwd"),
        ("files", "/mnt/user-data/passwd"),
        ("files", "/mnt/user-data/up/etc/passwd"),
        ("files", "workspace/etc/passwd"),
        ("files", "/mnt/user-data/../../etc/passwd"),
        ("files/list", "/mnt/user-data/root"),
        ("files/list", "/mnt/user-data/up"),
        ("files/stat", "/mnt/user-data/root/etc"),
    ] {
        let response = server
            .request(Method::GET, &format!("/v1/sandboxes/{id}/{route}"))
            .query(&[("path", path)])
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert!(
            (400..500).contains(&status),
            "{host:?}: {route} {path} answered {status}: {body}"
        );
        assert!(
            !body.contains("root:x:0:0") && !body.contains(&data_dir),
            "{host:?}: {route} {path} exposed the host: {body}"
        );
    }
    // The links themselves are listed as links, never followed.
    let (status, listing) = server
        .send_json(
            server
                .request(Method::GET, &format!("/v1/sandboxes/{id}/files/list"))
                .query(&[("path", "/mnt/user-data"), ("depth", "1")]),
        )
        .await;
    assert_eq!(status, 200, "{listing}");
    let text = listing.to_string();
    assert!(text.contains("symlink"), "{host:?}: {text}");
    assert!(
        !text.contains("passwd\",\"kind\":\"file"),
        "{host:?}: {text}"
    );
}

/// Removes whatever a backend made directly by a test left under `data_dir`.
struct BackendLeftovers(PathBuf);

impl Drop for BackendLeftovers {
    fn drop(&mut self) {
        warren_test_support::reap_runtimes(&self.0);
        warren_test_support::remove_docker_runtimes(&self.0);
    }
}

async fn backend(host: Host, data_dir: &Path) -> Box<dyn Backend> {
    let limits = warren_isolation::config::RuntimeLimits::default();
    match host {
        Host::Kubernetes | Host::KubernetesReal | Host::LocalGvisor | Host::DockerGvisor => {
            unreachable!("the layout rules run on the local and Docker backends' kernel tier")
        }
        Host::Local => Box::new(
            warren_isolation::LocalBackend::new(warren_isolation::LocalBackendConfig {
                data_dir: data_dir.to_owned(),
                init_program: bin().to_owned(),
                limits,
                rootfs: None,
            })
            .expect("the local backend starts"),
        ),
        Host::Docker => {
            warren_test_support::require_docker();
            Box::new(
                warren_docker::DockerBackend::new(warren_docker::DockerBackendConfig {
                    data_dir: data_dir.to_owned(),
                    agent_program: bin().to_owned(),
                    socket: None,
                    limits,
                    gvisor_runtime: None,
                })
                .await
                .expect("the Docker backend starts"),
            )
        }
    }
}

async fn run(backend: &dyn Backend, sandbox: &SandboxId, command: &str) -> String {
    let request = ExecRequest {
        argv: vec!["/bin/sh".into(), "-c".into(), command.into()],
        cwd: "/mnt/user-data".into(),
        env: BTreeMap::new(),
        stdin: Vec::new(),
        timeout: Duration::from_secs(30),
        output_cap: 1 << 20,
    };
    let outcome = backend.exec(sandbox, &request, None).await.expect("exec");
    format!(
        "{}{}",
        String::from_utf8_lossy(&outcome.stdout),
        String::from_utf8_lossy(&outcome.stderr)
    )
}

/// The sandbox of (alice, t) and its DeerFlow-layout runtime spec on `host` over these
/// trees, by generation.
fn deerflow_spec(
    host: Host,
    workspace: &Path,
    projection: &Path,
    extra_mounts: Vec<ExtraMount>,
) -> (SandboxId, impl Fn(i64) -> RuntimeSpec) {
    let uid = Uid::new("alice").unwrap();
    let runtime_scope = RuntimeScope::new("t").unwrap();
    let sandbox = SandboxId::derive(&uid, &runtime_scope);
    let (workspace, projection) = (workspace.to_owned(), projection.to_owned());
    let id = sandbox.clone();
    let spec = move |generation| RuntimeSpec {
        sandbox: id.clone(),
        generation,
        uid: uid.clone(),
        runtime_scope: runtime_scope.clone(),
        user_workspace: workspace.clone(),
        skill_projection: projection.clone(),
        env: BTreeMap::new(),
        seed: None,
        branch: None,
        frozen: Vec::new(),
        binding: warren_core::Binding {
            workdir: Workdir::new(THREAD).unwrap(),
            network: NetworkPolicy::None,
            backend: match host {
                Host::Local => BackendKind::Local,
                Host::Docker => BackendKind::Docker,
                Host::Kubernetes | Host::KubernetesReal => BackendKind::Kubernetes,
                Host::LocalGvisor | Host::DockerGvisor => {
                    unreachable!("the layout rules run on the kernel tier")
                }
            },
            image: (host == Host::Docker)
                .then(|| warren_test_support::DOCKER_TEST_IMAGE.to_owned()),
            inherit_env: true,
            ephemeral: false,
            layout: LayoutName::Deerflow,
            extra_mounts: extra_mounts.clone(),
            isolation: warren_core::IsolationTier::Kernel,
            branch: None,
        },
    };
    (sandbox, spec)
}

/// Seconds since the epoch, as Docker's `--since` takes them.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Every error in a chain, as one line.
fn chain(error: warren_backend::BackendError) -> String {
    format!("{:#}", anyhow::Error::new(error))
}

async fn the_backend_itself_refuses_a_workdir_a_link_leads_out_of_the_workspace(host: Host) {
    let data = tempfile::tempdir().unwrap();
    let _cleanup = BackendLeftovers(data.path().to_owned());
    let backend = backend(host, data.path()).await;
    // A UserWorkspace, a projection, and a directory outside both that a link would lead
    // to: shaped like the workdir, so a backend that followed the link would succeed.
    let workspace = data.path().join("workspace");
    let projection = data.path().join("projection");
    let outside = data.path().join("outside");
    for dir in [
        workspace.join(THREAD).join("workspace"),
        workspace.join("agents/skills"),
        projection.join("pdf"),
        outside.join("t1/user-data"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(workspace.join(THREAD).join("mine"), "mine\n").unwrap();
    std::fs::write(outside.join("t1/user-data/host-secret"), "host\n").unwrap();
    let (sandbox, spec) = deerflow_spec(host, &workspace, &projection, Vec::new());
    let nothing_left = |what: &str| {
        let mut found = Vec::new();
        if data
            .path()
            .join("docker/binds")
            .join(sandbox.as_str())
            .exists()
        {
            found.push("a staging directory".to_owned());
        }
        // Only this test's data dir: tests beside it stage binds of their own.
        let ours = data.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        found.extend(
            mounts
                .lines()
                .filter(|l| {
                    l.contains(&format!("{ours}/docker/binds"))
                        || l.contains(&format!("{ours}/outside"))
                })
                .map(str::to_owned),
        );
        if host == Host::Docker {
            found.extend(warren_test_support::docker_containers(data.path()));
        }
        assert!(found.is_empty(), "{host:?} ({what}): left {found:?}");
    };
    // Docker: refused before any container was made, not after one ran with the wrong
    // directory (the check after the start would catch that too, but only after).
    let no_container_since = |since: f64, what: &str| {
        if host != Host::Docker {
            return;
        }
        let until = now() + 1.0;
        let created = warren_test_support::docker(&[
            "events",
            "--since",
            &format!("{since:.3}"),
            "--until",
            &format!("{until:.3}"),
            "--filter",
            &format!(
                "label=dev.warren.instance={}",
                warren_test_support::docker_instance(data.path())
            ),
            "--filter",
            "event=create",
        ]);
        assert!(
            created.is_empty(),
            "{what}: a container was made: {created}"
        );
    };

    // The real workdir: started, and (Docker) its staging gone once the container runs.
    backend
        .create(&spec(1))
        .await
        .expect("a DeerFlow runtime starts");
    if host == Host::Docker {
        assert!(
            !data
                .path()
                .join("docker/binds")
                .join(sandbox.as_str())
                .exists(),
            "the staging directory outlived the start"
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let staging = format!("{}/docker/binds", data.path().display());
        assert!(!mounts.contains(&staging), "a staging mount is left");
    }
    let seen = run(&*backend, &sandbox, "cat mine; ls /mnt/skills/public").await;
    assert_eq!(seen, "mine\npdf\n", "{host:?}");
    // A running runtime holds its mount, not the path: swapping the workdir for a link
    // now changes nothing inside.
    std::fs::rename(workspace.join("threads"), workspace.join("threads.real")).unwrap();
    std::os::unix::fs::symlink(&outside, workspace.join("threads")).unwrap();
    let still = run(&*backend, &sandbox, "cat mine; ls").await;
    assert_eq!(still, "mine\nmine\nworkspace\n", "{host:?}");
    backend.destroy(&sandbox).await.expect("destroy");
    nothing_left("after destroy");

    // Started anew with the link in place: refused before anything is mounted.
    let since = now();
    let error = backend
        .create(&spec(2))
        .await
        .expect_err("a workdir behind a link must be refused");
    let text = chain(error);
    assert!(
        text.contains("/mnt/user-data") && text.contains("symlinks are not followed"),
        "{host:?}: a clear refusal: {text}"
    );
    assert!(
        !text.contains(&data.path().to_string_lossy().into_owned()),
        "{host:?}: a host path in the refusal (I1): {text}"
    );
    nothing_left("after the refusal");
    no_container_since(since, "the first component a link");
    // The last component swapped instead, with the first one a directory again.
    std::fs::remove_file(workspace.join("threads")).unwrap();
    std::fs::rename(workspace.join("threads.real"), workspace.join("threads")).unwrap();
    std::fs::rename(workspace.join(THREAD), workspace.join("threads/t1/real")).unwrap();
    std::os::unix::fs::symlink(outside.join("t1/user-data"), workspace.join(THREAD)).unwrap();
    let since = now();
    let error = backend
        .create(&spec(3))
        .await
        .expect_err("a workdir that is a link must be refused");
    let text = chain(error);
    assert!(
        text.contains("symlinks are not followed"),
        "{host:?}: {text}"
    );
    nothing_left("after the second refusal");
    no_container_since(since, "the last component a link");
    // And so is a personal-skills directory behind a link (the other staged mount).
    std::fs::remove_file(workspace.join(THREAD)).unwrap();
    std::fs::rename(workspace.join("threads/t1/real"), workspace.join(THREAD)).unwrap();
    std::fs::remove_dir(workspace.join("agents/skills")).unwrap();
    std::os::unix::fs::symlink(&outside, workspace.join("agents/skills")).unwrap();
    let since = now();
    let error = backend
        .create(&spec(4))
        .await
        .expect_err("personal skills behind a link must be refused");
    let text = chain(error);
    assert!(
        text.contains("/mnt/skills/custom") && text.contains("symlinks are not followed"),
        "{host:?}: {text}"
    );
    nothing_left("after the third refusal");
    no_container_since(since, "personal skills a link");
}

/// Extra mounts (DeerFlow's `extra_mounts`, issue 16) on each backend: read-only and
/// writable ones where they were asked for, one taking the place of the layout's
/// `/mnt/skills/custom`, reported by discovery so adoption requires exactly them; and a
/// source someone swapped for a link beneath the operator's directory refused before
/// anything is mounted (I2).
async fn extra_mounts_show_the_operator_directories_as_asked_and_a_link_beneath_the_operator_root_is_refused(
    host: Host,
) {
    let data = tempfile::tempdir().unwrap();
    let _cleanup = BackendLeftovers(data.path().to_owned());
    let backend = backend(host, data.path()).await;
    let workspace = data.path().join("workspace");
    let projection = data.path().join("projection");
    let operator = data.path().join("operator");
    let outside = data.path().join("outside");
    for dir in [
        workspace.join(THREAD),
        workspace.join("agents/skills/own"),
        projection.join("pdf"),
        operator.join("threads/t1/acp-workspace"),
        operator.join("scratch/t1"),
        operator.join("skills/alice/mine"),
        outside.join("acp-workspace"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(
        operator.join("threads/t1/acp-workspace/result.md"),
        "from acp\n",
    )
    .unwrap();
    std::fs::write(outside.join("acp-workspace/result.md"), "host secret\n").unwrap();
    // A writable mount is writable for the sandbox user where the directory lets it (the
    // provisioner makes missing sources owned by 1000:1000; this one the operator made).
    std::os::unix::fs::chown(operator.join("scratch/t1"), Some(1000), Some(1000)).unwrap();
    let layout = LayoutName::Deerflow.layout();
    let extra = |target, beneath, writable| {
        ExtraMount::new(target, operator.clone(), beneath, writable, layout).unwrap()
    };
    let extra_mounts = vec![
        extra("/mnt/acp-workspace", "threads/t1/acp-workspace", false),
        extra("/mnt/scratch", "scratch/t1", true),
        extra("/mnt/skills/custom", "skills/alice", false),
    ];
    let (sandbox, spec) = deerflow_spec(host, &workspace, &projection, extra_mounts.clone());
    backend
        .create(&spec(1))
        .await
        .expect("a runtime with extra mounts starts");
    let seen = run(
        &*backend,
        &sandbox,
        "cat /mnt/acp-workspace/result.md; ls /mnt/skills/custom; ls /mnt/skills/public; \
         echo w > /mnt/scratch/new.txt && echo wrote; \
         touch /mnt/acp-workspace/x 2>/dev/null || echo acp read-only; \
         touch /mnt/skills/custom/x 2>/dev/null || echo custom read-only; \
         stat -c %u:%g /mnt/scratch/new.txt",
    )
    .await;
    assert_eq!(
        seen, "from acp\nmine\npdf\nwrote\nacp read-only\ncustom read-only\n1000:1000\n",
        "{host:?}"
    );
    assert_eq!(
        std::fs::read_to_string(operator.join("scratch/t1/new.txt")).unwrap(),
        "w\n",
        "{host:?}: the writable extra mount is the operator's directory"
    );
    // Discovery reports the extra mounts: the provisioner adopts a runtime only when they
    // are exactly the sandbox's.
    let found = backend.discover().await.expect("discover");
    let runtime = found
        .iter()
        .find(|runtime| runtime.spec.sandbox == sandbox)
        .expect("the runtime is discovered");
    assert_eq!(runtime.spec.binding.extra_mounts, extra_mounts, "{host:?}");
    backend.destroy(&sandbox).await.expect("destroy");

    // The acp-workspace swapped for a link to a look-alike outside the operator's tree:
    // the next start is refused, naming the target, with no host path in the message.
    let acp = operator.join("threads/t1/acp-workspace");
    std::fs::rename(&acp, operator.join("threads/t1/acp-real")).unwrap();
    std::os::unix::fs::symlink(outside.join("acp-workspace"), &acp).unwrap();
    let error = backend
        .create(&spec(2))
        .await
        .expect_err("an extra mount behind a link must be refused");
    let text = chain(error);
    assert!(
        text.contains("/mnt/acp-workspace") && text.contains("symlinks are not followed"),
        "{host:?}: a clear refusal: {text}"
    );
    assert!(
        !text.contains(&data.path().to_string_lossy().into_owned()),
        "{host:?}: a host path in the refusal (I1): {text}"
    );
    // A link higher up (the thread directory itself) is refused the same way.
    std::fs::remove_file(&acp).unwrap();
    std::fs::rename(operator.join("threads/t1/acp-real"), &acp).unwrap();
    std::fs::rename(
        operator.join("threads/t1"),
        operator.join("threads/t1-real"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&outside, operator.join("threads/t1")).unwrap();
    let error = backend
        .create(&spec(3))
        .await
        .expect_err("a link in any component must be refused");
    assert!(
        chain(error).contains("symlinks are not followed"),
        "{host:?}"
    );
}

/// On an image root (an overlay, not the host profile's tmpfs) the mount points outside
/// the home are made in the root's copy-on-write layer, and an image whose path to them
/// is a symlink is refused rather than followed onto the host before `pivot_root`.
#[tokio::test]
async fn on_an_image_root_the_deerflow_mounts_get_mount_points_and_links_to_them_are_refused() {
    let data = super::image::image_with_links("plain", &[]);
    let server = TestServer::start_in(
        bin(),
        data,
        &["--backend", "local", "--image", "plain"],
        Some(warren_test_support::TEST_TOKEN),
    );
    let id = deerflow_sandbox(&server, "alice", "df", THREAD).await;
    let result = server
        .exec(
            &id,
            "echo x > /mnt/user-data/outputs/o && echo wrote; (echo y > /mnt/skills/custom/y) 2>&1; (echo y > /mnt/y) 2>&1; cd /mnt/skills/public && echo entered",
        )
        .await;
    let text = out(&result);
    assert!(text.starts_with("wrote\n"), "{text}");
    assert_eq!(text.matches("Read-only file system").count(), 1, "{text}");
    assert!(text.ends_with("entered\n"), "{text}");
    assert_eq!(
        std::fs::read_to_string(server.workspace_of("alice").join(THREAD).join("outputs/o"))
            .unwrap(),
        "x\n"
    );
    drop(server);

    let canary = tempfile::tempdir().unwrap();
    let into_canary = canary.path().to_string_lossy().into_owned();
    for link in ["mnt", "mnt/user-data", "mnt/skills"] {
        let data = super::image::image_with_links("evil", &[(link, into_canary.clone())]);
        let server = TestServer::start_in(
            bin(),
            data,
            &["--backend", "local", "--image", "evil"],
            Some(warren_test_support::TEST_TOKEN),
        );
        let id = deerflow_sandbox(&server, "alice", "df", THREAD).await;
        let (status, body) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(&json!({"command": "true"})),
            )
            .await;
        assert_eq!(status, 500, "{link}: the runtime started: {body}");
        assert_eq!(
            std::fs::read_dir(canary.path()).unwrap().count(),
            0,
            "{link}: warren made a mount point in the host dir the image's link names"
        );
        // The same image serves the ARS layout, whose mounts lie in the home.
        let ars = server.sandbox("alice", "ars", "projects/p").await;
        assert_eq!(server.exec(&ars, "echo ok").await["stdout"], "ok\n");
    }
}

/// The E2B layout (issue 17): sandbox user `user`, the workdir mounted writable as its
/// home `/home/user`, on the local, the Docker and the Kubernetes backend
/// (`layouts::e2b::local::<rule>`, `layouts::e2b::docker::<rule>`,
/// `layouts::e2b::kubernetes::<rule>`, the last on the test cluster and as root).
mod e2b {
    use std::time::Duration;

    use reqwest::Method;
    use serde_json::json;
    use warren_test_support::TestServer;

    use super::super::conformance::Host;
    use super::super::output as out;
    use super::stdout;

    conformance_suite!(
        an_e2b_runtime_runs_as_user_in_its_home_which_is_the_workdir,
        files_in_the_e2b_home_outlive_a_reap_and_the_runtime,
        paths_and_links_in_the_e2b_home_expose_nothing_else,
    );
    // The same rules on the Kubernetes backend's test cluster: the pod's home is the
    // workdir's subPath and its accounts warren's (I7, I11), its snapshots skip it (I30).
    conformance_on!(
        kubernetes, Kubernetes:
        an_e2b_runtime_runs_as_user_in_its_home_which_is_the_workdir,
        files_in_the_e2b_home_outlive_a_reap_and_the_runtime,
        paths_and_links_in_the_e2b_home_expose_nothing_else,
    );
    // And on the real cluster (issue 39).
    conformance_on!(
        kubernetes_real, KubernetesReal:
        an_e2b_runtime_runs_as_user_in_its_home_which_is_the_workdir,
        files_in_the_e2b_home_outlive_a_reap_and_the_runtime,
        paths_and_links_in_the_e2b_home_expose_nothing_else,
    );

    const WORKDIR: &str = "e2b/sbx-1";

    /// Creates `workdir` and an E2B-layout sandbox of (uid, scope) bound to it.
    async fn e2b_sandbox(server: &TestServer, uid: &str, scope: &str, workdir: &str) -> String {
        server.workdir(uid, workdir).await;
        let (status, body) = server
            .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
                "uid": uid, "runtime_scope_id": scope, "workdir": workdir, "layout": "e2b",
            })))
            .await;
        assert!(
            status == 201 || status == 200,
            "create sandbox: {status} {body}"
        );
        assert_eq!(
            (body["layout"].as_str(), body["workdir_path"].as_str()),
            (Some("e2b"), Some("/home/user")),
            "{body}"
        );
        body["sandbox_id"].as_str().expect("sandbox_id").to_owned()
    }

    async fn read_file(server: &TestServer, id: &str, path: &str) -> (u16, String) {
        let response = server
            .request(Method::GET, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", path)])
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    async fn an_e2b_runtime_runs_as_user_in_its_home_which_is_the_workdir(host: Host) {
        let server = host.start();
        let id = e2b_sandbox(&server, "alice", "e2b", WORKDIR).await;
        let view = server
            .exec(
                &id,
                "whoami; id -u; id -g; id -gn; echo $HOME $USER $LOGNAME; pwd; \
                 grep '^user:' /etc/passwd; grep ':1000:' /etc/passwd | wc -l; \
                 grep '^user:' /etc/group; stat -c '%u:%g %a' /home/user; cd && pwd",
            )
            .await;
        assert_eq!(
            stdout(&view),
            "user\n1000\n1000\nuser\n/home/user user user\n/home/user\n\
             user:x:1000:1000:user:/home/user:/bin/sh\n1\nuser:x:1000:\n1000:1000 755\n/home/user\n",
            "{host:?}: I7/I11: user 1000 at home in the workdir: {view}"
        );
        let writes = server
            .exec(
                &id,
                "echo abs > /home/user/x && echo rel > y && mkdir -p d && echo deep > ~/d/z && \
                 ls -A /home/user; ls /home/gem 2>&1 | grep -c 'No such file'",
            )
            .await;
        assert_eq!(
            stdout(&writes),
            "d\nx\ny\n1\n",
            "{host:?}: the home holds only what was written (no skills, no user-data): {writes}"
        );
        // The same files through the file API, under /home/user and relative to it.
        for (path, content) in [
            ("/home/user/x", "abs\n"),
            ("y", "rel\n"),
            ("/home/user/d/z", "deep\n"),
        ] {
            assert_eq!(
                read_file(&server, &id, path).await,
                (200, content.to_owned()),
                "{host:?}: {path}"
            );
        }
        // And on the host, in the workdir, as the sandbox user (I11).
        let on_host = server.workspace_of("alice").join(WORKDIR).join("x");
        assert_eq!(std::fs::read_to_string(&on_host).unwrap(), "abs\n");
        if super::super::running_as_root() {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&on_host).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{host:?}: I11");
        }
        // A file written through the API shows inside.
        let response = server
            .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", "/home/user/from-api")])
            .body("api\n")
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        let seen = server.exec(&id, "cat ~/from-api").await;
        assert_eq!(stdout(&seen), "api\n", "{host:?}: {seen}");
    }

    async fn files_in_the_e2b_home_outlive_a_reap_and_the_runtime(host: Host) {
        let server = host.start_with(&["--idle-timeout", "1", "--reap-interval", "1"]);
        let id = e2b_sandbox(&server, "alice", "e2b", WORKDIR).await;
        let setup = "echo kept > ~/kept && echo gone > /tmp/scratch && \
                     (mkdir -p /usr/local/share/e2b && echo cow > /usr/local/share/e2b/c || true)";
        assert_eq!(server.exec(&id, setup).await["exit_code"], 0);
        assert!(
            server
                .reaches_state(&id, "stopped", Duration::from_secs(15))
                .await,
            "{host:?}: an idle runtime was not reaped"
        );
        let next = server
            .exec(
                &id,
                "cat ~/kept; ls -A ~; cat /tmp/scratch 2>/dev/null || echo no-tmp; \
                 cat /usr/local/share/e2b/c 2>/dev/null || echo no-cow",
            )
            .await;
        // The local backend's copy-on-write layer is recorded and comes back (I30); a
        // Docker container's root is the read-only image (nothing to record).
        let cow = match host {
            Host::Local => "cow",
            _ => "no-cow",
        };
        assert_eq!(
            stdout(&next),
            format!("kept\nkept\nno-tmp\n{cow}\n"),
            "{host:?}: the home is the workdir (I15): nothing of it restored twice, /tmp gone: {next}"
        );
        server.terminate(&id).await;
        assert_eq!(
            std::fs::read_to_string(server.workspace_of("alice").join(WORKDIR).join("kept"))
                .unwrap(),
            "kept\n",
            "{host:?}: the workdir outlives the sandbox's runtime (I15)"
        );
        let again = e2b_sandbox(&server, "alice", "e2b", WORKDIR).await;
        let fresh = server.exec(&again, "cat /home/user/kept; whoami").await;
        assert_eq!(stdout(&fresh), "kept\nuser\n", "{host:?}: {fresh}");
    }

    async fn paths_and_links_in_the_e2b_home_expose_nothing_else(host: Host) {
        let server = host.start();
        // Another workdir of the same uid, which the E2B home must not reach.
        let other = e2b_sandbox(&server, "alice", "other", "e2b/sbx-2").await;
        assert_eq!(
            server.exec(&other, "echo secret > ~/secret").await["exit_code"],
            0
        );
        let id = e2b_sandbox(&server, "alice", "e2b", WORKDIR).await;
        let links = server
            .exec(
                &id,
                "ln -s / root && ln -s /etc/passwd passwd && ln -s ../sbx-2 sibling && \
                 ln -s ../../../../.. up && echo ok",
            )
            .await;
        assert_eq!(stdout(&links), "ok\n", "{links}");
        let data_dir = server.data_dir().to_string_lossy().into_owned();
        for (route, path) in [
            ("files", "/home/user/root/etc/passwd"),
            ("files", "/home/user/passwd"),
            ("files", "/home/user/sibling/secret"),
            ("files", "sibling/secret"),
            ("files", "/home/user/up/etc/passwd"),
            ("files", "/home/user/../../etc/passwd"),
            ("files", "../sbx-2/secret"),
            // Outside the home a path is the runtime's own (issue 42): these are not in it.
            ("files", "/home/gem/user-data/e2b/sbx-2/secret"),
            ("files", "/home/userx"),
            ("files/list", "/home/user/root"),
            ("files/stat", "/home/user/up/etc"),
        ] {
            let response = server
                .request(Method::GET, &format!("/v1/sandboxes/{id}/{route}"))
                .query(&[("path", path)])
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            assert!(
                (400..500).contains(&status),
                "{host:?}: {route} {path} answered {status}: {body}"
            );
            assert!(
                !body.contains("root:x:0:0")
                    && !body.contains("secret\n")
                    && !body.contains(&data_dir),
                "{host:?}: {route} {path} exposed something: {body}"
            );
        }
        // Writes through a link or `..` are refused the same way.
        for path in ["/home/user/../x", "/home/user/root/tmp/x"] {
            let response = server
                .request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", path)])
                .body("x")
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            assert!(
                (400..500).contains(&status),
                "{host:?}: PUT {path}: {status}"
            );
        }
        // The home is the workdir's mount root: it may be written into, never removed or
        // moved away (that would delete or move the whole workdir).
        for path in ["/home/user", "/home/user/", ".", "/home/user/."] {
            let response = server
                .request(Method::DELETE, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", path), ("recursive", "true")])
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            assert!(
                (400..500).contains(&status),
                "{host:?}: DELETE {path}: {status}"
            );
        }
        for (from, to) in [("/home/user", "/home/user/moved"), ("passwd", "/home/user")] {
            let response = server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/files/move"))
                .json(&serde_json::json!({"from": from, "to": to, "overwrite": true}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            assert!(
                (400..500).contains(&status),
                "{host:?}: move {from} to {to}: {status}"
            );
        }
        // Inside the runtime the home is still only the workdir.
        let inside = server.exec(&id, "cat sibling/secret 2>&1; ls -A").await;
        let text = out(&inside);
        assert!(
            text.contains("No such file") && text.ends_with("passwd\nroot\nsibling\nup\n"),
            "{host:?}: the sibling workdir is not under the home: {text}"
        );
    }
}
