//! What only the Docker backend does (I18, I16): the container warren makes, labels and
//! adoption, refusal of legacy layouts, a network of its own per sandbox, the agent's
//! socket directory under attack, and the backend and image as part of the binding. The
//! rules every backend keeps are in `conformance`.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use warren_test_support::{
    docker, docker_containers, docker_instance, require_docker, TestServer, DOCKER_TEST_IMAGE,
};

use super::{bin, output as out};

fn docker_server() -> TestServer {
    TestServer::start_docker(bin())
}

/// `docker inspect` of one container, as JSON.
fn inspect(container: &str) -> serde_json::Value {
    let text = docker(&["inspect", container]);
    let mut all: Vec<serde_json::Value> = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("docker inspect {container}: {text}"));
    all.remove(0)
}

/// The one container serving `id` on `server`.
fn container_of(server: &TestServer, id: &str) -> String {
    let filter = format!("label=dev.warren.sandbox={id}");
    let instance = format!(
        "label=dev.warren.instance={}",
        docker_instance(&server.data_dir())
    );
    let found = docker(&[
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        &filter,
        "--filter",
        &instance,
    ]);
    let ids: Vec<&str> = found.lines().collect();
    assert_eq!(ids.len(), 1, "expected one container for {id}: {found:?}");
    ids[0].to_owned()
}

#[tokio::test]
async fn a_docker_sandbox_runs_in_the_container_i18_describes() {
    let server = docker_server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    assert_eq!(server.exec(&id, "true").await["exit_code"], 0);
    let container = inspect(&container_of(&server, &id));
    let config = &container["Config"];
    let host = &container["HostConfig"];
    assert_eq!(config["User"], "1000:1000");
    assert_eq!(config["Image"], DOCKER_TEST_IMAGE);
    assert_eq!(config["Labels"]["dev.warren.uid"], "alice");
    assert_eq!(config["Labels"]["dev.warren.runtime-scope"], "t");
    assert_eq!(config["Labels"]["dev.warren.workdir"], "projects/a");
    assert_eq!(config["Labels"]["dev.warren.generation"], "1");
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert!(
        host["CapAdd"].is_null() || host["CapAdd"] == json!([]),
        "{host}"
    );
    assert_eq!(host["Privileged"], false);
    assert_eq!(host["ReadonlyRootfs"], true);
    let security = host["SecurityOpt"].to_string();
    assert!(security.contains("no-new-privileges:true"), "{security}");
    assert!(
        !security.contains("seccomp"),
        "Docker's default seccomp profile stays: {security}"
    );
    assert_eq!(host["NetworkMode"], "none", "no network without a policy");
    assert!(
        host["PortBindings"]
            .as_object()
            .is_none_or(|p| p.is_empty()),
        "{host}"
    );
    assert_eq!(host["PublishAllPorts"], false);
    for limit in ["Memory", "PidsLimit", "NanoCpus"] {
        assert!(
            host[limit].as_i64().unwrap_or(0) > 0,
            "{limit} is not limited: {host}"
        );
    }
    assert!(host["Tmpfs"]["/home/gem"]
        .as_str()
        .unwrap()
        .contains("size="));
    let mounts = container["Mounts"].as_array().unwrap();
    let describe = |m: &serde_json::Value| {
        format!(
            "{} {} rw={}",
            m["Source"].as_str().unwrap_or(""),
            m["Destination"],
            m["RW"]
        )
    };
    let all: Vec<String> = mounts.iter().map(describe).collect();
    assert_eq!(
        mounts.len(),
        4,
        "two persistent binds, the agent and its socket: {all:?}"
    );
    let workspace = server.workspace_of("alice");
    for mount in mounts {
        let source = mount["Source"].as_str().unwrap();
        assert!(!source.contains("docker.sock"), "{all:?}");
        match mount["Destination"].as_str().unwrap() {
            "/home/gem/user-data" => {
                assert_eq!(std::path::Path::new(source), workspace);
                assert_eq!(mount["RW"], true);
            }
            "/home/gem/skills" => assert_eq!(mount["RW"], false),
            "/opt/warren-agent" => assert_eq!(mount["RW"], false),
            "/run/warren" => assert!(source.ends_with(&format!("docker/sockets/{id}"))),
            other => panic!("unexpected mount {other}: {all:?}"),
        }
    }
    let inside = server
        .exec(&id, "cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /var/run/docker.sock /run/docker.sock 2>&1; touch /x 2>&1; head -c 1000000 /dev/zero > /run/warren/fill; for i in $(seq 40); do touch /run/warren/f$i || break; done; rm -f /run/warren/f* /run/warren/fill")
        .await;
    let text = out(&inside);
    assert!(
        text.starts_with("/opt/warren-agent/ld.so --argv0 warren-agent"),
        "PID 1 is the agent: {text}"
    );
    assert!(text.contains("No such file"), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");
    // The agent's socket directory is on the host: capped, so no sandbox fills its disk.
    assert_eq!(
        text.matches("No space left on device").count(),
        2,
        "bytes and inodes of /run/warren are capped: {text}"
    );
    assert_eq!(server.exec(&id, "echo still").await["stdout"], "still\n");
}

#[tokio::test]
async fn a_restarted_server_adopts_its_containers_by_label_and_removes_strays() {
    let mut server = docker_server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "nohup sleep 407 >/dev/null 2>&1 &").await;
    let container = container_of(&server, &id);
    // A container of this instance that no sandbox owns (its record was never written).
    let stray = docker(&[
        "run",
        "-d",
        "--label",
        &format!(
            "dev.warren.instance={}",
            docker_instance(&server.data_dir())
        ),
        "--label",
        "dev.warren.sandbox=sbx-0123456789abcdef01234567",
        "--network",
        "none",
        DOCKER_TEST_IMAGE,
        "sleep",
        "600",
    ]);
    assert!(!stray.is_empty(), "could not plant a stray container");
    server.restart_after_kill();
    let after = server.exec(&id, "ps -eo args").await;
    assert!(
        out(&after).contains("sleep 407"),
        "the same container serves: {after}"
    );
    assert_eq!(
        container_of(&server, &id),
        container,
        "adopted, not replaced"
    );
    assert_eq!(
        docker(&[
            "ps",
            "-aq",
            "--no-trunc",
            "--filter",
            &format!("id={stray}")
        ]),
        "",
        "a container no sandbox owns was removed"
    );
}

/// Plants, in place of the sandbox's container, one warren would not make, running the
/// real agent so it answers like a live runtime; `extra` are the layout's differences.
fn plant(id: &str, original: &serde_json::Value, extra: &[String], skills_ro: bool) -> String {
    let name = original["Name"]
        .as_str()
        .unwrap()
        .trim_start_matches('/')
        .to_owned();
    docker(&["rm", "-f", &name]);
    let mut args: Vec<String> = [
        "run",
        "-d",
        "--name",
        &name,
        "--user",
        "1000:1000",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges:true",
        "--network",
        "none",
        "--tmpfs",
        "/home/gem:exec,uid=1000,gid=1000",
        "--tmpfs",
        "/tmp",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for (key, value) in original["Config"]["Labels"].as_object().unwrap() {
        args.push("--label".into());
        args.push(format!("{key}={}", value.as_str().unwrap()));
    }
    for mount in original["Mounts"].as_array().unwrap() {
        let destination = mount["Destination"].as_str().unwrap();
        let read_only = match destination {
            "/home/gem/skills" => skills_ro,
            _ => mount["RW"] == false,
        };
        args.push("--mount".into());
        args.push(format!(
            "type=bind,src={},dst={destination}{}",
            mount["Source"].as_str().unwrap(),
            if read_only { ",readonly" } else { "" }
        ));
    }
    args.extend(extra.iter().cloned());
    let entrypoint: Vec<String> = original["Config"]["Entrypoint"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    args.push("--entrypoint".into());
    args.push(entrypoint[0].clone());
    args.push(original["Config"]["Image"].as_str().unwrap().to_owned());
    args.extend(entrypoint[1..].iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let planted = docker(&args);
    assert!(
        !planted.is_empty(),
        "could not plant a container for {id}: {args:?}"
    );
    planted
}

#[tokio::test]
async fn a_container_with_a_legacy_layout_is_refused_for_reuse_and_replaced() {
    require_docker();
    let mut server = TestServer::start_logging(
        bin(),
        &["--backend", "docker", "--image", DOCKER_TEST_IMAGE],
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    server.exec(&id, "echo kept > kept.txt").await;
    let workspace = server.workspace_of("alice");
    let layouts: [(&str, Vec<String>, bool); 3] = [
        (
            "legacy layout: it mounts /home/gem/projects",
            vec![
                "--mount".into(),
                format!(
                    "type=bind,src={},dst=/home/gem/projects",
                    workspace.join("projects").display()
                ),
            ],
            true,
        ),
        (
            "legacy layout: a nested mount at /home/gem/user-data/projects/a",
            vec![
                "--mount".into(),
                format!(
                    "type=bind,src={},dst=/home/gem/user-data/projects/a",
                    workspace.join("projects/a").display()
                ),
            ],
            true,
        ),
        (
            "legacy layout: /home/gem/skills is writable",
            Vec::new(),
            false,
        ),
    ];
    for (legacy, extra, skills_ro) in layouts {
        let original = inspect(&container_of(&server, &id));
        server.kill();
        let planted = plant(&id, &original, &extra, skills_ro);
        // The planted container's agent answers like a live runtime would.
        let socket = server
            .data_dir()
            .join("docker/sockets")
            .join(&id)
            .join("control.sock");
        for _ in 0..500 {
            if socket.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        server.restart_after_kill();
        assert_eq!(
            docker(&[
                "ps",
                "-aq",
                "--no-trunc",
                "--filter",
                &format!("id={planted}")
            ]),
            "",
            "the container with a legacy layout ({legacy}) was refused and removed"
        );
        let logged = server.log_lines().join("\n");
        assert!(logged.contains(legacy), "{legacy}: {logged}");
        let fresh = server
            .exec(
                &id,
                "cat kept.txt; ls /home/gem; grep -c ' /home/gem/' /proc/self/mounts",
            )
            .await;
        assert_eq!(
            out(&fresh),
            "kept\nskills\nuser-data\n2\n",
            "{legacy}: a fresh container with exactly the two mounts: {fresh}"
        );
        assert_ne!(container_of(&server, &id), planted);
    }
}

#[tokio::test]
async fn a_sandbox_with_egress_gets_an_internal_network_of_its_own_that_goes_with_it() {
    let server = docker_server();
    let mut ids = Vec::new();
    for scope in ["t1", "t2"] {
        let (status, body) = server
            .send_json(server.request(Method::POST, "/v1/sandboxes").json(&json!({
                "uid": "alice", "runtime_scope_id": scope, "network": {"mode": "open"},
            })))
            .await;
        assert_eq!(status, 201, "{body}");
        let id = body["sandbox_id"].as_str().unwrap().to_owned();
        server.exec(&id, "true").await;
        ids.push(id);
    }
    let networks: Vec<String> = ids
        .iter()
        .map(|id| {
            let container = inspect(&container_of(&server, id));
            let attached: Vec<String> = container["NetworkSettings"]["Networks"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            assert_eq!(attached.len(), 1, "{attached:?}");
            attached[0].clone()
        })
        .collect();
    assert_ne!(networks[0], networks[1], "sandboxes never share a network");
    for network in &networks {
        let details: Vec<serde_json::Value> =
            serde_json::from_str(&docker(&["network", "inspect", network])).unwrap();
        assert_eq!(
            details[0]["Internal"], true,
            "no route off the bridge: {}",
            details[0]
        );
        assert!(details[0]["Containers"].as_object().unwrap().len() == 1);
    }
    // No address of the host answers on the bridge: the host's bridge has no address.
    let gateway = server
        .exec(&ids[0], "ip -4 route; python3 -c \"import socket; socket.create_connection(('172.17.0.1', 22), timeout=2)\" 2>&1 | tail -1")
        .await;
    assert!(
        !out(&gateway).contains("default via 172.17.0.1"),
        "{gateway}"
    );
    server.terminate(&ids[0]).await;
    assert_eq!(
        docker(&[
            "network",
            "ls",
            "-q",
            "--filter",
            &format!("name={}", networks[0])
        ]),
        "",
        "the network went with its sandbox"
    );
}

#[tokio::test]
async fn a_symlink_planted_as_the_agent_socket_is_never_followed() {
    let server = docker_server();
    let id = server.sandbox("alice", "t", "projects/a").await;
    // A host socket the planted link points at: warren must never connect to it.
    let trap_dir = tempfile::tempdir().unwrap();
    let trap_path = trap_dir.path().join("trap.sock");
    let trap = std::os::unix::net::UnixListener::bind(&trap_path).unwrap();
    trap.set_nonblocking(true).unwrap();
    let swap = format!(
        "rm -f /run/warren/control.sock; ln -s {} /run/warren/control.sock; ls -l /run/warren",
        trap_path.display()
    );
    server.exec(&id, &swap).await;
    for _ in 0..3 {
        // Refused as not-a-socket; warren forgets the runtime and starts a fresh one.
        let (status, _) = server
            .send_json(
                server
                    .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(&json!({"command": "echo hi"})),
            )
            .await;
        assert!(matches!(status, 200 | 503), "{status}");
    }
    assert!(
        trap.accept().is_err(),
        "warren connected through a symlink planted by the sandbox"
    );
    assert_eq!(server.exec(&id, "echo back").await["stdout"], "back\n");
}

#[tokio::test]
async fn backend_and_image_are_part_of_the_binding_and_checked() {
    require_docker();
    // Local by default, Docker on request.
    let server = TestServer::start_with(
        bin(),
        &["--backend", "local", "--docker-image", DOCKER_TEST_IMAGE],
    );
    let create = |body: serde_json::Value| {
        let server = &server;
        async move {
            server
                .send_json(server.request(Method::POST, "/v1/sandboxes").json(&body))
                .await
        }
    };
    let (_, health) = server
        .send_json(server.anonymous(Method::GET, "/health"))
        .await;
    assert_eq!(health["backends"], json!(["local", "docker"]), "{health}");
    let (status, local) = create(json!({"uid": "alice", "runtime_scope_id": "l"})).await;
    assert_eq!(
        (status, local["backend"].as_str()),
        (201, Some("local")),
        "{local}"
    );
    let (status, body) =
        create(json!({"uid": "alice", "runtime_scope_id": "d", "backend": "docker"})).await;
    assert_eq!(
        (status, body["backend"].as_str(), body["image"].as_str()),
        (201, Some("docker"), Some(DOCKER_TEST_IMAGE)),
        "{body}"
    );
    let docker_id = body["sandbox_id"].as_str().unwrap().to_owned();
    let inside = server
        .exec(&docker_id, "cat /proc/1/cmdline | head -c 17")
        .await;
    assert_eq!(inside["stdout"], "/opt/warren-agent", "{inside}");
    assert_eq!(docker_containers(&server.data_dir()).len(), 1);
    for (body, code) in [
        (
            json!({"uid": "alice", "runtime_scope_id": "d", "backend": "local"}),
            "backend_conflict",
        ),
        (
            json!({"uid": "alice", "runtime_scope_id": "d", "backend": "docker", "image": "debian:other"}),
            "backend_conflict",
        ),
        (
            json!({"uid": "alice", "runtime_scope_id": "x", "backend": "kubernetes"}),
            "backend_unavailable",
        ),
        (
            json!({"uid": "alice", "runtime_scope_id": "x", "image": DOCKER_TEST_IMAGE}),
            "invalid_image",
        ),
        (
            json!({"uid": "alice", "runtime_scope_id": "x", "backend": "docker", "image": "--privileged"}),
            "invalid_image",
        ),
        (
            json!({"uid": "alice", "runtime_scope_id": "x", "backend": "docker", "image": "a b"}),
            "invalid_image",
        ),
    ] {
        let (status, answer) = create(body.clone()).await;
        assert_eq!(
            answer["error"]["code"].as_str(),
            Some(code),
            "{body}: {status} {answer}"
        );
    }
    // Joining the live sandbox without naming a backend keeps its own.
    let (status, joined) = create(json!({"uid": "alice", "runtime_scope_id": "d"})).await;
    assert_eq!(
        (status, joined["backend"].as_str()),
        (200, Some("docker")),
        "{joined}"
    );
    // An image the Docker host does not have: refused when the sandbox is created, with a
    // clear error; nothing pulled, nothing left.
    let (status, failed) = create(json!({"uid": "alice", "runtime_scope_id": "m", "backend": "docker", "image": "warren-test:no-such-tag"})).await;
    assert_eq!(
        (status, failed["error"]["code"].as_str()),
        (422, Some("image_not_found")),
        "{failed}"
    );
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("never pulls"),
        "{failed}"
    );
    assert_eq!(docker_containers(&server.data_dir()).len(), 1);
}

#[tokio::test]
async fn an_image_whose_home_is_a_symlink_never_makes_warren_touch_the_host() {
    require_docker();
    // An image where /home is an absolute symlink. Inside the container it means the
    // image's /srv/evil-home; resolved on the host it would mean the host's. warren must
    // only ever resolve it inside the container (through its agent's descriptor).
    let tag = format!("warren-test:evil-home-{}", std::process::id());
    let builder = format!("warren-evil-home-{}", std::process::id());
    let made = docker(&[
        "run",
        "--name",
        &builder,
        "--user",
        "0",
        "--network",
        "none",
        DOCKER_TEST_IMAGE,
        "sh",
        "-c",
        "rm -rf /home && mkdir -p /srv/evil-home && ln -s /srv/evil-home /home && echo done",
    ]);
    assert_eq!(made, "done", "could not prepare the image");
    docker(&["commit", &builder, &tag]);
    docker(&["rm", "-f", &builder]);
    // The image and the host canary go whatever the outcome.
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all("/srv/evil-home");
            docker(&["rmi", "-f", &self.0]);
        }
    }
    let _cleanup = Cleanup(tag.clone());
    // The host's side of the same path, with a canary a host-side resolution would read.
    let host_home = std::path::Path::new("/srv/evil-home/gem");
    std::fs::create_dir_all(host_home).unwrap();
    std::fs::write(host_home.join("host-secret.txt"), "HOST-SECRET").unwrap();

    let server = TestServer::start_with(
        bin(),
        &[
            "--backend",
            "docker",
            "--image",
            &tag,
            "--idle-timeout",
            "1",
            "--reap-interval",
            "1",
        ],
    );
    let id = server.sandbox("alice", "t", "projects/a").await;
    let first = server
        .exec(&id, "echo mine > ~/note; readlink /home; ls ~")
        .await;
    assert_eq!(
        first["stdout"], "/srv/evil-home\nnote\nskills\nuser-data\n",
        "{first}"
    );
    // Reaped with a snapshot, then resumed from it.
    assert!(
        server
            .reaches_state(&id, "stopped", Duration::from_secs(15))
            .await,
        "not reaped"
    );
    let resumed = server.exec(&id, "cat ~/note; ls ~").await;
    assert_eq!(
        resumed["stdout"], "mine\nnote\nskills\nuser-data\n",
        "the container's own /home/gem came back, nothing of the host's: {resumed}"
    );
    let host_entries: Vec<String> = std::fs::read_dir(host_home)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        host_entries,
        ["host-secret.txt"],
        "warren wrote into the host's path"
    );
    // The server (and its containers) go before the image.
    drop(server);
}

#[tokio::test]
async fn a_default_docker_image_the_host_lacks_is_warned_about_and_refused_at_creation() {
    require_docker();
    let missing = "warren-test:no-such-default";
    let server =
        TestServer::start_logging(bin(), &["--backend", "local", "--docker-image", missing]);
    let warned = server.log_lines().join("\n");
    assert!(
        warned.contains("not on the Docker host") && warned.contains(missing),
        "no start-up warning: {warned}"
    );
    let (status, answer) = server
        .send_json(
            server
                .request(Method::POST, "/v1/sandboxes")
                .json(&json!({"uid": "alice", "runtime_scope_id": "d", "backend": "docker"})),
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (422, Some("image_not_found")),
        "{answer}"
    );
    let (_, list) = server
        .send_json(server.request(Method::GET, "/v1/sandboxes"))
        .await;
    assert_eq!(
        list["sandboxes"],
        json!([]),
        "a refused sandbox was recorded"
    );
    assert!(docker_containers(&server.data_dir()).is_empty());
    // The local default is untouched.
    let (status, local) = server
        .send_json(
            server
                .request(Method::POST, "/v1/sandboxes")
                .json(&json!({"uid": "alice", "runtime_scope_id": "l"})),
        )
        .await;
    assert_eq!(status, 201, "{local}");
}
