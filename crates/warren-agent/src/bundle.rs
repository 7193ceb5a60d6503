//! The agent bundle: warren's executable with the dynamic loader and libraries it runs
//! with, in one directory mounted read-only into every container.
//!
//! The agent must run in any image (Debian, Alpine with musl, a distroless tree without a
//! libc). Running the host's loader explicitly with `--library-path` pointing at the
//! bundle makes the image's own libraries irrelevant. The bundle is keyed by the
//! executable's identity, so an upgraded warren gets a new one while containers started by
//! the old one keep theirs.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The loader's name in the bundle.
pub const LOADER: &str = "ld.so";
/// The executable's name in the bundle.
pub const PROGRAM: &str = "warren";

/// A prepared bundle directory.
#[derive(Debug, Clone)]
pub struct AgentBundle {
    dir: PathBuf,
}

impl AgentBundle {
    /// Makes (or reuses) `<root>/agent-<key>` for `program`.
    pub fn prepare(program: &Path, root: &Path) -> io::Result<Self> {
        let libraries = loaded_libraries()?;
        let loader = find_loader(&libraries)?;
        let meta = std::fs::metadata(program)?;
        let mut key = blake3::Hasher::new();
        key.update(program.as_os_str().as_encoded_bytes());
        for value in [
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.mtime() as u64,
            meta.mtime_nsec() as u64,
        ] {
            key.update(&value.to_le_bytes());
        }
        for library in &libraries {
            key.update(library.as_os_str().as_encoded_bytes());
            key.update(&std::fs::metadata(library)?.size().to_le_bytes());
        }
        let dir = root.join(format!("agent-{}", &key.finalize().to_hex()[..16]));
        remove_other_bundles(root, &dir);
        if dir.join(PROGRAM).exists() {
            return Ok(Self { dir });
        }
        let staging = root.join(format!("agent-staging-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        fill(program, &loader, &libraries, &staging)?;
        match std::fs::rename(&staging, &dir) {
            Ok(()) => {}
            // Another warren process on the same data directory made it first.
            Err(_) if dir.join(PROGRAM).exists() => {
                let _ = std::fs::remove_dir_all(&staging);
            }
            Err(error) => return Err(error),
        }
        Ok(Self { dir })
    }

    /// The directory to mount.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Writes the bundle of `program` (with this process's loader and libraries) into `dir`,
/// which must not exist or be empty: what a pod's agent-bundle init container does into
/// the `emptyDir` the sandbox container runs the agent from (Kubernetes, where no host
/// directory can be mounted).
pub fn write_into(program: &Path, dir: &Path) -> io::Result<()> {
    let libraries = loaded_libraries()?;
    let loader = find_loader(&libraries)?;
    fill(program, &loader, &libraries, dir)
}

fn find_loader(libraries: &[PathBuf]) -> io::Result<PathBuf> {
    libraries
        .iter()
        .find(|path| {
            path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("ld-linux") || n.starts_with("ld64") || n.starts_with("ld-musl")
            })
        })
        .cloned()
        .ok_or_else(|| io::Error::other("no dynamic loader is mapped into this process"))
}

/// The program, its loader and its libraries, world-readable, in `dir`.
fn fill(program: &Path, loader: &Path, libraries: &[PathBuf], dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir.join("lib"))?;
    // A hard link costs nothing when the target shares the executable's file system (and
    // pins this build's inode); otherwise a copy.
    if std::fs::hard_link(program, dir.join(PROGRAM)).is_err() {
        std::fs::copy(program, dir.join(PROGRAM))?;
    }
    std::fs::copy(loader, dir.join(LOADER))?;
    for library in libraries {
        let name = library
            .file_name()
            .ok_or_else(|| io::Error::other("a library without a name"))?;
        std::fs::copy(library, dir.join("lib").join(name))?;
    }
    std::fs::set_permissions(dir.join("lib"), std::fs::Permissions::from_mode(0o755))?;
    // A pod's emptyDir belongs to the kubelet (root, 0777), not to the init container
    // writing into it: its mode is the kubelet's to set.
    if std::fs::metadata(dir)?.uid() == rustix::process::geteuid().as_raw() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// Bundles of earlier warren builds. Containers started from one keep working without it:
/// their agent is loaded and never executes again (commands are forked, not exec'd from
/// the bundle), so only the disk it holds would outlive them.
fn remove_other_bundles(root: &Path, current: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let stale = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with("agent-"));
        if stale && path != current {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The shared objects mapped into this process: exactly what this executable needs
/// (it is the one the containers run).
fn loaded_libraries() -> io::Result<Vec<PathBuf>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut libraries: Vec<PathBuf> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/') && path.contains(".so"))
        .map(PathBuf::from)
        .collect();
    libraries.sort();
    libraries.dedup();
    Ok(libraries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_holds_the_program_its_loader_and_libraries_and_replaces_older_ones() {
        let root = tempfile::tempdir().unwrap();
        let old_program = root.path().join("warren-old");
        std::fs::write(&old_program, b"old build").unwrap();
        let old = AgentBundle::prepare(&old_program, root.path()).unwrap();
        assert_eq!(
            std::fs::read(old.dir().join(PROGRAM)).unwrap(),
            b"old build"
        );
        assert!(old.dir().join(LOADER).is_file());
        let libraries: Vec<_> = std::fs::read_dir(old.dir().join("lib"))
            .unwrap()
            .flatten()
            .collect();
        assert!(
            libraries
                .iter()
                .any(|l| l.file_name().to_string_lossy().starts_with("libc.so")),
            "{libraries:?}"
        );
        let again = AgentBundle::prepare(&old_program, root.path()).unwrap();
        assert_eq!(again.dir(), old.dir(), "the same build reuses its bundle");

        let new_program = root.path().join("warren-new");
        std::fs::write(&new_program, b"new build").unwrap();
        let new = AgentBundle::prepare(&new_program, root.path()).unwrap();
        assert_ne!(new.dir(), old.dir());
        assert!(!old.dir().exists(), "the older build's bundle is removed");
        assert_eq!(
            std::fs::read(new.dir().join(PROGRAM)).unwrap(),
            b"new build"
        );
    }
}
