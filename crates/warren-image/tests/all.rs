//! Importing OCI image layouts, and the attacks a hostile image can try.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use warren_image::{import, ImageError};

/// One tar entry of a test layer.
enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a str, u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    /// A regular file header whose name bytes are written raw (bypassing the tar crate's
    /// own path checks), for attacks.
    RawFile(&'a [u8], &'a str),
}

fn tar_bytes(entries: &[E]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            E::Dir(path) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, path, std::io::empty())
                    .unwrap();
            }
            E::File(path, content, mode) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(content.len() as u64);
                builder
                    .append_data(&mut header, path, content.as_bytes())
                    .unwrap();
            }
            E::Symlink(path, target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder.append_link(&mut header, path, target).unwrap();
            }
            E::Hardlink(path, target) => {
                header.set_entry_type(tar::EntryType::Link);
                header.set_mode(0o644);
                header.set_size(0);
                builder.append_link(&mut header, path, target).unwrap();
            }
            E::RawFile(name, content) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                header.set_size(content.len() as u64);
                let raw = &mut header.as_old_mut().name;
                raw.fill(0);
                raw[..name.len()].copy_from_slice(name);
                header.set_cksum();
                builder.append(&header, content.as_bytes()).unwrap();
            }
        }
    }
    builder.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Writes an OCI layout with the given layer blobs (already compressed as `media`).
fn layout(dir: &Path, layers: &[(Vec<u8>, &str)]) -> Vec<String> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let hex = hex::encode(Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        (format!("sha256:{hex}"), bytes.len())
    };
    let mut digests = Vec::new();
    let mut descriptors = Vec::new();
    for (bytes, media) in layers {
        let (digest, size) = put(bytes);
        descriptors.push(serde_json::json!({"mediaType": media, "digest": digest, "size": size}));
        digests.push(digest);
    }
    let (config, config_size) = put(b"{}");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": config_size},
        "layers": descriptors,
    });
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let (manifest_digest, manifest_size) = put(&manifest);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest, "size": manifest_size}],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    digests
}

const GZ: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

struct World {
    _dir: tempfile::TempDir,
    source: PathBuf,
    target: PathBuf,
    outside: PathBuf,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("image");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "host secret").unwrap();
    World {
        source,
        target: dir.path().join("images/test/rootfs"),
        outside,
        _dir: dir,
    }
}

#[test]
fn layers_apply_in_order_with_whiteouts_links_and_modes() {
    let w = world();
    let lower = tar_bytes(&[
        E::Dir("a"),
        E::File("a/keep", "keep", 0o644),
        E::File("a/gone", "gone", 0o644),
        E::Dir("d"),
        E::File("d/old", "old", 0o644),
        E::File("bin/tool", "#!/bin/sh\n", 0o755),
        E::Symlink("link", "bin/tool"),
        E::Hardlink("hard", "bin/tool"),
    ]);
    let upper = tar_bytes(&[
        E::File("a/.wh.gone", "", 0o644),
        E::File("d/.wh..wh..opq", "", 0o644),
        E::File("d/new", "new", 0o600),
    ]);
    layout(
        &w.source,
        &[
            (gzip(&lower), GZ),
            (
                zstd::encode_all(&upper[..], 1).unwrap(),
                "application/vnd.oci.image.layer.v1.tar+zstd",
            ),
        ],
    );
    let report = import(&w.source, &w.target).unwrap();
    assert_eq!(report.layers, 2);
    let t = &w.target;
    assert_eq!(std::fs::read_to_string(t.join("a/keep")).unwrap(), "keep");
    assert!(!t.join("a/gone").exists(), "whiteout");
    assert!(!t.join("d/old").exists(), "opaque whiteout");
    assert_eq!(std::fs::read_to_string(t.join("d/new")).unwrap(), "new");
    assert_eq!(
        std::fs::metadata(t.join("d/new"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(t.join("bin/tool"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(t.join("link")).unwrap(),
        Path::new("bin/tool")
    );
    assert_eq!(
        std::fs::metadata(t.join("hard")).unwrap().ino(),
        std::fs::metadata(t.join("bin/tool")).unwrap().ino()
    );
    assert!(matches!(
        import(&w.source, &w.target),
        Err(ImageError::Exists(_))
    ));
}

#[test]
fn hostile_entries_are_refused_and_nothing_lands_outside() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dot-dot", tar_bytes(&[E::RawFile(b"../escape", "x")])),
        (
            "nested dot-dot",
            tar_bytes(&[E::Dir("a"), E::RawFile(b"a/../../escape", "x")]),
        ),
        (
            "absolute",
            tar_bytes(&[E::RawFile(b"/tmp/warren-image-abs-escape", "x")]),
        ),
        (
            "file through an absolute symlink",
            tar_bytes(&[E::Symlink("s", "OUTSIDE"), E::File("s/pwned", "x", 0o644)]),
        ),
        (
            "file through a relative symlink",
            tar_bytes(&[
                E::Symlink("s", "../outside"),
                E::File("s/pwned", "x", 0o644),
            ]),
        ),
        (
            "hard link out",
            tar_bytes(&[E::Hardlink("h", "../outside/secret")]),
        ),
        (
            "hard link through a symlink",
            tar_bytes(&[E::Symlink("s", "OUTSIDE"), E::Hardlink("h", "s/secret")]),
        ),
        // A whiteout of ".." would empty the staging root's parent.
        (
            "whiteout of the parent",
            tar_bytes(&[E::File(".wh...", "", 0o644)]),
        ),
        (
            "whiteout of dot",
            tar_bytes(&[E::Dir("a"), E::File("a/.wh..", "", 0o644)]),
        ),
    ];
    for (name, layer) in cases {
        let w = world();
        let outside = w.outside.to_string_lossy().into_owned();
        // Point the planted symlinks at this case's real outside directory.
        let layer = {
            let mut archive = tar::Archive::new(&layer[..]);
            let mut rebuilt = tar::Builder::new(Vec::new());
            for entry in archive.entries().unwrap() {
                let entry = entry.unwrap();
                let mut header = entry.header().clone();
                if let Ok(Some(target)) = header.link_name() {
                    if target.to_string_lossy() == "OUTSIDE" {
                        header.set_link_name(&outside).unwrap();
                        header.set_cksum();
                    }
                }
                rebuilt.append(&header, entry).unwrap();
            }
            rebuilt.into_inner().unwrap()
        };
        layout(&w.source, &[(gzip(&layer), GZ)]);
        // A neighbour of the target that must survive whatever the layer says.
        let parent = w.target.parent().unwrap().to_owned();
        std::fs::create_dir_all(&parent).unwrap();
        std::fs::write(parent.join("neighbour"), "keep").unwrap();
        let result = import(&w.source, &w.target);
        assert!(
            matches!(result, Err(ImageError::UnsafeEntry { .. })),
            "{name}: {result:?}"
        );
        assert!(!w.target.exists(), "{name}: a target appeared");
        let left: Vec<_> = std::fs::read_dir(&parent)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            ["neighbour"],
            "{name}: staging left behind or neighbour gone"
        );
        let names: Vec<_> = std::fs::read_dir(&w.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret"], "{name}: something was written outside");
        assert_eq!(
            std::fs::read_to_string(w.outside.join("secret")).unwrap(),
            "host secret"
        );
        assert!(!Path::new("/tmp/warren-image-abs-escape").exists());
        assert!(
            !w.source.parent().unwrap().join("escape").exists(),
            "{name}"
        );
    }
}

#[test]
fn a_tampered_layer_is_refused_by_its_digest() {
    let w = world();
    let digests = layout(
        &w.source,
        &[(gzip(&tar_bytes(&[E::File("f", "original", 0o644)])), GZ)],
    );
    let blob = w
        .source
        .join("blobs/sha256")
        .join(digests[0].strip_prefix("sha256:").unwrap());
    let tampered = gzip(&tar_bytes(&[E::File("f", "tampered", 0o644)]));
    std::fs::write(&blob, tampered).unwrap();
    assert!(matches!(
        import(&w.source, &w.target),
        Err(ImageError::DigestMismatch { .. })
    ));
    assert!(!w.target.exists());
}

#[test]
fn a_blob_planted_as_a_symlink_is_not_followed() {
    let w = world();
    let digests = layout(
        &w.source,
        &[(gzip(&tar_bytes(&[E::File("f", "x", 0o644)])), GZ)],
    );
    let blob = w
        .source
        .join("blobs/sha256")
        .join(digests[0].strip_prefix("sha256:").unwrap());
    std::fs::remove_file(&blob).unwrap();
    std::os::unix::fs::symlink(w.outside.join("secret"), &blob).unwrap();
    let error = import(&w.source, &w.target).unwrap_err();
    assert!(matches!(error, ImageError::Read { .. }), "{error}");
}

#[test]
fn an_archived_layout_imports_like_a_directory() {
    let w = world();
    layout(
        &w.source,
        &[(
            gzip(&tar_bytes(&[E::File("etc/marker", "from archive", 0o644)])),
            GZ,
        )],
    );
    let archive = w.source.with_extension("tar");
    let mut builder = tar::Builder::new(std::fs::File::create(&archive).unwrap());
    builder.append_dir_all(".", &w.source).unwrap();
    builder.finish().unwrap();
    import(&archive, &w.target).unwrap();
    assert_eq!(
        std::fs::read_to_string(w.target.join("etc/marker")).unwrap(),
        "from archive"
    );
}
