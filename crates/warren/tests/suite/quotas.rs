//! Storage quotas (I23) on a small real filesystem the test makes: the data directory lives
//! on a loop-mounted ext4 image, and `[quotas]` gives every uid a volume of its own. One uid
//! filling its quota (bytes through exec and the file API, inodes through exec) is 507
//! `quota_exceeded` for it alone; the other uids, warren's own state and deletes keep
//! working, also when the data filesystem itself is full.

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::Method;
use serde_json::json;
use warren_test_support::{TestServer, TEST_TOKEN};

use super::{bin, output};

const MIB: u64 = 1024 * 1024;

/// An ext4 filesystem in an image under a temporary directory, loop-mounted; unmounted (and
/// its loop device released) on drop, also when the test fails.
struct LoopFilesystem {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFilesystem {
    fn new(bytes: u64) -> Self {
        // The test needs these tools; it fails, never skips, without them.
        let mkfs = Command::new("mkfs.ext4").arg("-V").output();
        assert!(
            mkfs.is_ok_and(|o| o.status.success()),
            "mkfs.ext4 is missing: install e2fsprogs (scripts/test does)"
        );
        assert!(
            Path::new("/dev/loop-control").exists(),
            "this host has no loop devices (/dev/loop-control)"
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let image = dir.path().join("data.ext4");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(bytes))
            .expect("create the image");
        run("mkfs.ext4", &["-q", "-F", "-m", "0"], &image, None);
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).expect("the mount point");
        run("mount", &["-o", "loop"], &image, Some(&mount));
        Self { mount, _dir: dir }
    }
}

impl Drop for LoopFilesystem {
    fn drop(&mut self) {
        // Lazy: whatever a failed test left open must not keep the image mounted.
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn run(program: &str, args: &[&str], path: &Path, target: Option<&Path>) {
    let mut command = Command::new(program);
    command.args(args).arg(path);
    if let Some(target) = target {
        command.arg(target);
    }
    let out = command.output().expect("run the tool");
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn put_file(
    server: &TestServer,
    id: &str,
    path: &str,
    bytes: Vec<u8>,
) -> (u16, serde_json::Value) {
    server
        .send_json(
            server
                .request(
                    Method::PUT,
                    &format!("/v1/sandboxes/{id}/files?path={path}"),
                )
                .body(bytes),
        )
        .await
}

async fn delete_file(server: &TestServer, id: &str, path: &str) -> (u16, serde_json::Value) {
    server
        .send_json(server.request(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/files?path={path}"),
        ))
        .await
}

async fn usage(server: &TestServer, uid: &str) -> serde_json::Value {
    let (status, body) = server
        .send_json(server.request(Method::GET, &format!("/v1/users/{uid}/usage")))
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

fn start(filesystem: &LoopFilesystem, config: &str) -> TestServer {
    let config_file = filesystem.mount.join("warren.toml");
    std::fs::write(&config_file, config).expect("write the configuration");
    let data_dir = tempfile::tempdir_in(&filesystem.mount).expect("a data directory on the image");
    TestServer::start_in(
        bin(),
        data_dir,
        &[
            "--backend",
            "local",
            "--config",
            config_file.to_str().unwrap(),
        ],
        Some(TEST_TOKEN),
    )
}

#[tokio::test]
async fn a_full_quota_is_507_for_its_uid_only_and_deletes_and_other_uids_keep_working() {
    let filesystem = LoopFilesystem::new(192 * MIB);
    let server = start(
        &filesystem,
        &format!(
            "[quotas]\nbytes = {}\n[quotas.users.carol]\ninodes = 128\n",
            32 * MIB
        ),
    );
    let (status, health) = server
        .send_json(server.anonymous(Method::GET, "/health"))
        .await;
    assert_eq!(
        (status, health["quotas"].as_str()),
        (200, Some("volumes")),
        "{health}"
    );

    let alice = server.sandbox("alice", "t", "projects/a").await;
    let bob = server.sandbox("bob", "t", "projects/b").await;
    let carol = server.sandbox("carol", "t", "projects/c").await;

    // Nothing written yet: the volume's own numbers, from the kernel.
    let before = usage(&server, "alice").await;
    assert_eq!(before["enforcement"], "volumes", "{before}");
    let limit = before["bytes"]["limit"].as_u64().unwrap();
    assert!(limit > 24 * MIB && limit <= 32 * MIB, "{before}");
    assert!(
        before["bytes"]["used"].as_u64().unwrap() < 4 * MIB,
        "{before}"
    );

    // Bytes, from inside the runtime: the write fails there, nowhere else.
    let filled = server
        .exec(
            &alice,
            "dd if=/dev/zero of=/home/gem/user-data/fill bs=1M count=64 2>&1; echo rc=$?",
        )
        .await;
    let text = output(&filled);
    assert!(
        text.contains("No space left on device") && !text.contains("rc=0"),
        "{text}"
    );
    // And through the file API: 507 quota_exceeded for alice.
    let (status, body) = put_file(&server, &alice, "more.bin", vec![7; 2 * MIB as usize]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (507, Some("quota_exceeded")),
        "{body}"
    );
    let full = usage(&server, "alice").await;
    let used = full["bytes"]["used"].as_u64().unwrap();
    assert!(used > limit * 9 / 10 && used <= limit, "{full}");

    // Nobody else notices: bob's exec, file write and workdir creation work.
    let written = server
        .exec(
            &bob,
            "echo fine > /home/gem/user-data/ok && cat /home/gem/user-data/ok",
        )
        .await;
    assert_eq!(output(&written), "fine\n");
    let (status, body) = put_file(&server, &bob, "notes.md", b"hello".to_vec()).await;
    assert_eq!(status, 201, "{body}");
    server.workdir("bob", "projects/second").await;
    // Warren's own state keeps working for the full uid: a checkpoint of its workdir.
    let (status, body) = server
        .send_json(server.request(Method::POST, &format!("/v1/sandboxes/{alice}/checkpoints")))
        .await;
    assert_eq!(status, 201, "{body}");

    // Inodes: carol's 128 run out long before her bytes do.
    let created = server
        .exec(
            &carol,
            "i=0; while touch /home/gem/user-data/f$i 2>/dev/null; do i=$((i+1)); done; echo $i",
        )
        .await;
    let count: u64 = created["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{created}"));
    assert!(count > 64 && count < 128, "{created}");
    let (status, body) = put_file(&server, &carol, "one-more", Vec::new()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (507, Some("quota_exceeded")),
        "{body}"
    );
    // Workdir creation too: a directory needs an inode.
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/users/carol/workdirs")
                .json(&json!({"path": "projects/new"})),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (507, Some("quota_exceeded")),
        "{body}"
    );
    let carol_usage = usage(&server, "carol").await;
    assert_eq!(carol_usage["inodes"]["limit"], 128, "{carol_usage}");
    assert_eq!(carol_usage["inodes"]["used"], 128, "{carol_usage}");
    assert!(
        carol_usage["bytes"]["used"].as_u64().unwrap() < 4 * MIB,
        "{carol_usage}"
    );

    // The full uid can always delete, even with the data filesystem itself full.
    // Every last block: big writes first, then ever smaller ones.
    let filler = filesystem.mount.join("filler");
    std::fs::create_dir(&filler).expect("the filler directory");
    for size in ["1M", "64k", "4k", "1k"] {
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "status=none", &format!("bs={size}")])
            .arg(format!("of={}/{size}", filler.display()))
            .stderr(std::process::Stdio::null())
            .status();
    }
    let (status, body) = delete_file(&server, &alice, "/home/gem/user-data/fill").await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = delete_file(&server, &carol, "/home/gem/user-data/f0").await;
    assert_eq!(status, 204, "{body}");
    std::fs::remove_dir_all(&filler).expect("remove the filler");
    let freed = usage(&server, "alice").await;
    assert!(
        freed["bytes"]["used"].as_u64().unwrap() < 4 * MIB,
        "{freed}"
    );
    let (status, body) = put_file(&server, &alice, "more.bin", vec![7; 2 * MIB as usize]).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn a_runtime_sees_its_own_volume_and_no_host_path_of_the_data_directory() {
    let filesystem = LoopFilesystem::new(96 * MIB);
    let server = start(&filesystem, &format!("[quotas]\nbytes = {}\n", 32 * MIB));
    let id = server.sandbox("alice", "t", "projects/a").await;
    let mounts = server
        .exec(&id, "cat /proc/self/mountinfo; ls -a /home/gem/user-data")
        .await;
    let text = output(&mounts);
    let data_dir = server.data_dir();
    assert!(text.contains(" /home/gem/user-data "), "{text}");
    for host in [data_dir.to_str().unwrap(), "user-data/shared", "volumes"] {
        assert!(!text.contains(host), "{host} shows in the runtime:\n{text}");
    }
    assert!(!text.contains("lost+found"), "{text}");
}

#[tokio::test]
async fn usage_without_quotas_reports_no_enforcement_and_no_figures() {
    let server = super::server();
    server.workdir("alice", "projects/a").await;
    let body = usage(&server, "alice").await;
    assert_eq!(
        body,
        json!({"uid": "alice", "enforcement": "off",
               "bytes": {"used": null, "limit": null}, "inodes": {"used": null, "limit": null}})
    );
}

#[tokio::test]
async fn a_restarted_server_mounts_the_volumes_again_and_keeps_the_files() {
    let filesystem = LoopFilesystem::new(96 * MIB);
    let mut server = start(&filesystem, &format!("[quotas]\nbytes = {}\n", 32 * MIB));
    let id = server.sandbox("alice", "t", "projects/a").await;
    let (status, body) = put_file(&server, &id, "kept.txt", b"kept".to_vec()).await;
    assert_eq!(status, 201, "{body}");
    // As after a reboot: the server is gone and nothing is mounted any more.
    server.kill();
    warren_test_support::unmount_workspace_volumes(&server.data_dir());
    assert!(!server.workspace_of("alice").join("projects").exists());
    server.restart_after_kill();
    let (status, body) = server
        .send_json(server.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=kept.txt"),
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(usage(&server, "alice").await["enforcement"], "volumes");
}

#[test]
fn quotas_refuse_to_start_over_workspaces_made_without_them() {
    let data_dir = tempfile::tempdir().unwrap();
    let workspace = data_dir
        .path()
        .join("user-data/shared/alice/workspace/projects/a");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("old.txt"), "made before quotas").unwrap();
    let config = data_dir.path().join("warren.toml");
    std::fs::write(&config, format!("[quotas]\nbytes = {}\n", 32 * MIB)).unwrap();
    let out = warren_test_support::run_to_exit(
        bin(),
        &[
            "serve",
            "--backend",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir.path().to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[("WARREN_TOKEN", TEST_TOKEN)],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("alice") && stderr.contains("not on volumes"),
        "{stderr}"
    );
    // Nothing was touched: the old files are where they were.
    assert!(workspace.join("old.txt").exists());
    assert!(!data_dir.path().join("volumes").exists());
}

#[tokio::test]
async fn a_volume_the_data_disk_has_no_room_for_is_507_insufficient_storage_and_leaves_nothing() {
    let filesystem = LoopFilesystem::new(96 * MIB);
    let server = start(&filesystem, &format!("[quotas]\nbytes = {}\n", 48 * MIB));
    // The first uid's volume takes half the disk; a second one of the same size cannot fit.
    let alice = server.sandbox("alice", "t", "projects/a").await;
    let (status, body) = server
        .send_json(
            server
                .request(Method::POST, "/v1/users/bob/workdirs")
                .json(&json!({"path": "projects/b"})),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (507, Some("insufficient_storage")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("data disk") && !message.contains(&*server.data_dir().to_string_lossy()),
        "{message}"
    );
    // No half-made image is left to take the space, and the first uid is untouched.
    let volumes: Vec<String> = std::fs::read_dir(server.data_dir().join("volumes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        volumes
            .iter()
            .all(|name| !name.starts_with("bob") && !name.ends_with(".new")),
        "{volumes:?}"
    );
    let (status, body) = put_file(&server, &alice, "still.txt", b"fine".to_vec()).await;
    assert_eq!(status, 201, "{body}");
}
