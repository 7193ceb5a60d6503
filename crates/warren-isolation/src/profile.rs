//! The host profile's `/etc`: a filtered copy of the host's, built by the provisioner once
//! per distinct sandbox user of the layouts (I7) and shared read-only (under each
//! runtime's copy-on-write layer) by every runtime of those layouts.
//!
//! Only world-readable entries are copied, and a reviewed deny list removes secrets that
//! happen to be world-readable on some hosts. `passwd` and `group` name the layout's
//! sandbox user at 1000:1000 (`gem`, or E2B's `user`; I11) with the layout's home, so
//! tools that look up the current user work.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use warren_core::Layout;

/// Entries of the host's /etc never copied, whatever their mode: password hashes, keys,
/// credentials, privilege configuration, and host identity.
pub const ETC_DENY: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssh/ssh_host_dsa_key",
    "ssh/ssh_host_ecdsa_key",
    "ssh/ssh_host_ed25519_key",
    "ssh/ssh_host_rsa_key",
    "ssl/private",
    "security/opasswd",
    "machine-id",
    "krb5.keytab",
    "docker",
    "subuid",
    "subgid",
    "subuid-",
    "subgid-",
    "NetworkManager/system-connections",
    "wireguard",
    "openvpn",
    "letsencrypt",
    "credstore",
    "credstore.encrypted",
    "warren",
    "passwd-",
    "group-",
];

/// Builds (or reuses) the profile of `layout`'s sandbox user under
/// `<profiles_dir>/etc-<content hash>` and returns it. A profile in use by a runtime is
/// never modified: a changed host /etc (or another user) yields a new one; layouts with
/// the same user and home share one.
pub fn build_etc_profile(
    host_etc: &Path,
    profiles_dir: &Path,
    layout: &Layout,
) -> io::Result<PathBuf> {
    let mut files = Vec::new();
    collect(host_etc, Path::new(""), &mut files)?;
    add_generated(host_etc, layout, &mut files)?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut hasher = blake3::Hasher::new();
    for file in &files {
        hasher.update(file.path.as_os_str().as_encoded_bytes());
        hasher.update(&[0, file.kind as u8]);
        hasher.update(&file.mode.to_le_bytes());
        hasher.update(&(file.content.len() as u64).to_le_bytes());
        hasher.update(&file.content);
    }
    let name = format!("etc-{}", &hasher.finalize().to_hex()[..16]);
    let target = profiles_dir.join(&name);
    if target.is_dir() {
        return Ok(target);
    }
    std::fs::create_dir_all(profiles_dir)?;
    let staging = profiles_dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir(&staging)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755))?;
    for file in &files {
        let path = staging.join(&file.path);
        match file.kind {
            Kind::Dir => {
                std::fs::create_dir_all(&path)?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(file.mode))?;
            }
            Kind::File => {
                std::fs::write(&path, &file.content)?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(file.mode))?;
            }
            Kind::Symlink => {
                let target = Path::new(std::ffi::OsStr::from_bytes(&file.content));
                std::os::unix::fs::symlink(target, &path)?;
            }
        }
    }
    match std::fs::rename(&staging, &target) {
        Ok(()) => Ok(target),
        // Another provisioner built the same profile first; theirs is identical.
        Err(_) if target.is_dir() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(target)
        }
        Err(e) => Err(e),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir = 1,
    File = 2,
    Symlink = 3,
}

#[derive(Debug)]
struct Entry {
    path: PathBuf,
    kind: Kind,
    mode: u32,
    content: Vec<u8>,
}

fn denied(relative: &Path) -> bool {
    ETC_DENY.iter().any(|deny| relative == Path::new(deny))
}

fn collect(root: &Path, relative: &Path, out: &mut Vec<Entry>) -> io::Result<()> {
    for entry in std::fs::read_dir(root.join(relative))? {
        let entry = entry?;
        let rel = relative.join(entry.file_name());
        if denied(&rel) || GENERATED.contains(&rel.to_string_lossy().as_ref()) {
            continue;
        }
        let meta = entry.metadata()?;
        let mode = meta.mode() & 0o7777;
        let file_type = meta.file_type();
        if file_type.is_symlink() {
            let target = std::fs::read_link(entry.path())?;
            out.push(Entry {
                path: rel,
                kind: Kind::Symlink,
                mode: 0o777,
                content: target.into_os_string().into_encoded_bytes(),
            });
        } else if file_type.is_dir() {
            // A directory others cannot read holds nothing meant for them.
            if mode & 0o005 != 0o005 {
                continue;
            }
            out.push(Entry {
                path: rel.clone(),
                kind: Kind::Dir,
                mode: mode & 0o755,
                content: Vec::new(),
            });
            collect(root, &rel, out)?;
        } else if file_type.is_file() && mode & 0o004 != 0 {
            let content = match std::fs::read(entry.path()) {
                Ok(content) => content,
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => continue,
                Err(e) => return Err(e),
            };
            // set-id bits never travel into a runtime.
            out.push(Entry {
                path: rel,
                kind: Kind::File,
                mode: mode & 0o755,
                content,
            });
        }
    }
    Ok(())
}

/// Files the profile writes itself instead of copying.
const GENERATED: &[&str] = &["passwd", "group", "hostname", "hosts"];

fn add_generated(host_etc: &Path, layout: &Layout, out: &mut Vec<Entry>) -> io::Result<()> {
    // The layout's sandbox user at 1000:1000 replaces whatever the host calls 1000 (I11).
    let read = |file: &str| std::fs::read_to_string(host_etc.join(file)).unwrap_or_default();
    out.push(Entry {
        path: "passwd".into(),
        kind: Kind::File,
        mode: 0o644,
        content: warren_core::passwd_with(&read("passwd"), layout).into_bytes(),
    });
    out.push(Entry {
        path: "group".into(),
        kind: Kind::File,
        mode: 0o644,
        content: warren_core::group_with(&read("group"), layout).into_bytes(),
    });
    out.push(Entry {
        path: "hostname".into(),
        kind: Kind::File,
        mode: 0o644,
        content: b"warren\n".to_vec(),
    });
    out.push(Entry {
        path: "hosts".into(),
        kind: Kind::File,
        mode: 0o644,
        content: b"127.0.0.1 localhost warren\n::1 localhost ip6-localhost ip6-loopback\n".to_vec(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_unreadable_files_stay_out_of_the_profile() {
        let host = tempfile::tempdir().unwrap();
        let etc = host.path();
        std::fs::write(etc.join("shadow"), "root:$6$hash").unwrap();
        std::fs::set_permissions(etc.join("shadow"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        std::fs::write(etc.join("private.conf"), "secret").unwrap();
        std::fs::set_permissions(
            etc.join("private.conf"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(etc.join("os-release"), "ID=debian").unwrap();
        std::fs::set_permissions(
            etc.join("os-release"),
            std::fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        std::fs::write(
            etc.join("passwd"),
            "root:$1$legacy:0:0:root:/root:/bin/bash\nold:x:1000:1000::/home/old:/bin/sh\n",
        )
        .unwrap();
        std::fs::create_dir(etc.join("alternatives")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/mawk", etc.join("alternatives/awk")).unwrap();
        let profiles = tempfile::tempdir().unwrap();
        let built = build_etc_profile(etc, profiles.path(), &Layout::ARS).unwrap();
        assert!(!built.join("shadow").exists());
        assert!(!built.join("private.conf").exists());
        let mode = std::fs::metadata(built.join("os-release")).unwrap().mode();
        assert_eq!(mode & 0o7777, 0o755, "set-id bits are dropped");
        assert_eq!(
            std::fs::read_link(built.join("alternatives/awk")).unwrap(),
            Path::new("/usr/bin/mawk")
        );
        let passwd = std::fs::read_to_string(built.join("passwd")).unwrap();
        assert!(passwd.contains("root:x:0:0"), "{passwd}");
        assert!(!passwd.contains("$1$"));
        assert!(!passwd.contains("old:"), "uid 1000 is gem's");
        assert!(passwd.contains("gem:x:1000:1000:gem:/home/gem:/bin/sh"));
        assert_eq!(
            build_etc_profile(etc, profiles.path(), &Layout::DEERFLOW).unwrap(),
            built,
            "layouts with one user share one profile"
        );
        let e2b = build_etc_profile(etc, profiles.path(), &Layout::E2B).unwrap();
        assert_ne!(e2b, built, "another user, another profile");
        let passwd = std::fs::read_to_string(e2b.join("passwd")).unwrap();
        assert!(
            passwd.contains("user:x:1000:1000:user:/home/user:/bin/sh"),
            "{passwd}"
        );
        assert!(
            !passwd.contains("gem:") && !passwd.contains("old:"),
            "{passwd}"
        );
        let group = std::fs::read_to_string(e2b.join("group")).unwrap();
        assert!(group.ends_with("user:x:1000:\n"), "{group}");
        assert_eq!(
            build_etc_profile(etc, profiles.path(), &Layout::ARS).unwrap(),
            built,
            "same host, same profile"
        );
        std::fs::write(etc.join("os-release"), "ID=debian2").unwrap();
        assert_ne!(
            build_etc_profile(etc, profiles.path(), &Layout::ARS).unwrap(),
            built,
            "a change makes a new profile"
        );
    }
}
