//! Runtimes on an imported OCI image instead of the host profile.

use std::io::Write;
use std::os::unix::fs::MetadataExt;

use sha2::{Digest, Sha256};
use warren_test_support::{run_to_exit, TestServer, TEST_TOKEN};

use super::bin;

/// An OCI layout with one gzip layer: the host's dash and the libraries it needs, and a
/// marker file — a root filesystem that has nothing of the host profile.
fn minimal_image(dir: &std::path::Path) {
    let rootfs = warren_test_support::minimal_rootfs_tar(&[("etc/marker", b"from the image\n")]);
    write_layout(dir, &rootfs);
}

/// Writes an OCI layout with `rootfs` (a tar) as its only, gzip-compressed layer.
fn write_layout(dir: &std::path::Path, rootfs: &[u8]) {
    let layer = {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(rootfs).unwrap();
        gz.finish().unwrap()
    };
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let hex = hex::encode(Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        serde_json::json!({"digest": format!("sha256:{hex}"), "size": bytes.len()})
    };
    let mut layer_desc = put(&layer);
    layer_desc["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip".into();
    let mut config = put(b"{}");
    config["mediaType"] = "application/vnd.oci.image.config.v1+json".into();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "config": config, "layers": [layer_desc],
    }))
    .unwrap();
    let mut manifest_desc = put(&manifest);
    manifest_desc["mediaType"] = "application/vnd.oci.image.manifest.v1+json".into();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest_desc]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

/// `warren image import <layout> --name <name> --data-dir <data>`.
fn import(layout: &std::path::Path, name: &str, data_dir: &str) -> std::process::Output {
    let layout = layout.to_str().unwrap();
    run_to_exit(
        bin(),
        &[
            "image",
            "import",
            layout,
            "--name",
            name,
            "--data-dir",
            data_dir,
        ],
        &[],
    )
}

#[tokio::test]
async fn a_runtime_runs_on_an_imported_image() {
    let layout = tempfile::tempdir().unwrap();
    minimal_image(layout.path());
    let data = tempfile::tempdir().unwrap();
    let data_arg = data.path().to_str().unwrap().to_owned();
    let out = import(layout.path(), "mini", &data_arg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("imported mini: 1 layers"));
    let again = import(layout.path(), "mini", &data_arg);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already imported"));

    let server = TestServer::start_in(bin(), data, &["--image", "mini"], Some(TEST_TOKEN));
    let id = server.sandbox("alice", "t", "projects/a").await;
    let result = server
        .exec(&id, "read line < /etc/marker; echo \"$line\"; echo x > /home/gem/user-data/projects/a/out; test -e /usr/bin/python3 || echo no-host-usr; id -u 2>/dev/null || echo no-id-binary")
        .await;
    assert_eq!(
        result["stdout"], "from the image\nno-host-usr\nno-id-binary\n",
        "{result}"
    );
    assert_eq!(
        std::fs::read_to_string(server.workspace_of("alice").join("projects/a/out")).unwrap(),
        "x\n"
    );
    let whoami = server.exec(&id, "echo $HOME; cd ~ && pwd").await;
    assert_eq!(whoami["stdout"], "/home/gem\n/home/gem\n");
}

#[test]
fn serving_an_image_that_was_never_imported_says_how_to_import_it() {
    let data = tempfile::tempdir().unwrap();
    let out = run_to_exit(
        bin(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--image",
            "nope",
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[("WARREN_TOKEN", TEST_TOKEN)],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("warren image import"));
}

/// A data dir with the minimal image plus `links` (path inside, target) imported as
/// `name`; a link's parent directories are made as directories.
pub(crate) fn image_with_links(name: &str, links: &[(&str, String)]) -> tempfile::TempDir {
    let layout = tempfile::tempdir().unwrap();
    let mut rootfs = tar::Builder::new(Vec::new());
    let base = warren_test_support::minimal_rootfs_tar(&[]);
    let mut archive = tar::Archive::new(&base[..]);
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        let header = entry.header().clone();
        rootfs.append(&header, entry).unwrap();
    }
    for (link, target) in links {
        if let Some((parent, _)) = link.rsplit_once('/') {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            header.set_mode(0o755);
            rootfs
                .append_data(&mut header, format!("{parent}/"), &[][..])
                .unwrap();
        }
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        header.set_mode(0o777);
        rootfs.append_link(&mut header, link, target).unwrap();
    }
    write_layout(layout.path(), &rootfs.into_inner().unwrap());
    let data = tempfile::tempdir().unwrap();
    let out = import(layout.path(), name, data.path().to_str().unwrap());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

/// An image is untrusted: symlinks where warren mounts or chowns before pivot_root
/// (`opt -> /`, `home -> <host dir>`) must not reach the host.
#[tokio::test]
async fn an_image_with_symlinks_where_warren_mounts_cannot_touch_the_host() {
    let canary = tempfile::tempdir().unwrap();
    for (link, target) in [
        ("opt", "/".to_owned()),
        ("home", canary.path().to_string_lossy().into_owned()),
    ] {
        let data = image_with_links("evil", &[(link, target)]);
        let server = TestServer::start_in(bin(), data, &["--image", "evil"], Some(TEST_TOKEN));
        let id = server.sandbox("alice", "t", "projects/a").await;
        let (status, body) = server
            .send_json(
                server
                    .request(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                    .json(&serde_json::json!({"command": "true"})),
            )
            .await;
        assert_eq!(status, 500, "{link}: {body}");
        // A runtime that failed to start leaves no cgroup behind.
        let cgroup = format!(
            "{}-{id}",
            warren_test_support::docker_instance(&server.data_dir())
        );
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let dir = hierarchy.path().join("warren").join(&cgroup);
            assert!(!dir.exists(), "{link}: {} was left", dir.display());
        }
        for host in ["/etc", "/usr", "/root"] {
            assert_eq!(
                std::fs::metadata(host).unwrap().uid(),
                0,
                "{link}: {host} changed hands"
            );
        }
        assert_eq!(
            std::fs::read_dir(canary.path()).unwrap().count(),
            0,
            "{link}: wrote into the host dir"
        );
    }
}
