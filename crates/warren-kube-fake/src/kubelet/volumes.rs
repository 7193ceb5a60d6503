//! A pod's volumes on this machine: emptyDirs, claims, and subPaths inside them.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::PodSpec;

use super::status::quantity_millis;
use super::{safe_name, PodRun, Settings};

/// Where a pod's volume is on this machine.
pub(super) enum VolumeHost {
    EmptyDir(PathBuf),
    Claim { dir: PathBuf, read_only: bool },
}

pub(super) fn prepare_volumes(
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
pub(super) fn sub_path(root: &Path, sub: &str) -> Result<PathBuf, String> {
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
