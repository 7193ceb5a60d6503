//! A pod's volumes and the sandbox container's mounts: exactly the two claims, the layout's
//! own `emptyDir`s and mounts, and the persistent mounts of its uid and workdir.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use warren_core::LayoutName;

use crate::manifests::{empty_dirs, own_mounts, within, Claim, PersistentMount};
use crate::names::*;
use crate::Error;

/// The volumes: exactly the two claims and the layout's `emptyDir`s (the home's only where
/// the home is ephemeral, I30; the accounts' only where warren names the user, I7).
/// Answers the claims' names.
pub(super) fn read_volumes(spec: &PodSpec, layout: LayoutName) -> Result<(String, String), Error> {
    let wanted = empty_dirs(layout);
    let mut user_data = None;
    let mut skills = None;
    let mut seen = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        let name = volume.name.clone();
        if volume.host_path.is_some() {
            return Err(Error::HostPath(name));
        }
        // Exactly one source, of the kind warren uses for that name.
        let value = serde_json::to_value(volume).expect("a volume serialises");
        let sources: Vec<&String> = value
            .as_object()
            .map(|o| o.keys().filter(|k| *k != "name").collect())
            .unwrap_or_default();
        let kind = match sources.as_slice() {
            [one] => one.as_str(),
            _ => return Err(Error::UnexpectedVolume(name)),
        };
        match (name.as_str(), kind) {
            (VOLUME_USER_DATA | VOLUME_SKILLS, "persistentVolumeClaim") => {
                let claim = volume
                    .persistent_volume_claim
                    .as_ref()
                    .map(|c| c.claim_name.clone())
                    .unwrap_or_default();
                if name == VOLUME_USER_DATA {
                    user_data = Some(claim);
                } else {
                    skills = Some(claim);
                }
            }
            (name, "emptyDir") if wanted.contains(&name) && !seen.iter().any(|s| s == name) => {}
            _ => return Err(Error::UnexpectedVolume(name)),
        }
        seen.push(name);
    }
    for name in wanted {
        if !seen.iter().any(|s| s == name) {
            return Err(Error::UnexpectedVolume(format!("{name} (missing)")));
        }
    }
    match (user_data, skills) {
        (Some(user_data), Some(skills)) => Ok((user_data, skills)),
        _ => Err(Error::MissingMounts),
    }
}

/// The sandbox container's mounts: its layout's own mounts (the home's `emptyDir` where the
/// home is ephemeral, `/tmp`, the bundle, the accounts files where warren names the user)
/// exactly where warren puts them, and the persistent mounts, answered as such.
pub(super) fn read_sandbox_mounts(
    container: &Container,
    layout: LayoutName,
) -> Result<Vec<PersistentMount>, Error> {
    let wanted = own_mounts(layout);
    let mounts = container.volume_mounts.as_deref().unwrap_or_default();
    if mounts
        .iter()
        .any(|m| m.mount_path.trim_end_matches('/') == LEGACY_PROJECTS)
    {
        return Err(Error::ProjectsMount);
    }
    let mut own = Vec::new();
    let mut persistent = Vec::new();
    for mount in mounts {
        let target = mount.mount_path.clone();
        if mount.sub_path_expr.is_some()
            || mount
                .mount_propagation
                .as_deref()
                .is_some_and(|p| p != "None")
        {
            return Err(Error::UnexpectedMount(target));
        }
        let read_only = mount.read_only == Some(true);
        match mount.name.as_str() {
            name @ (VOLUME_HOME | VOLUME_TMP | VOLUME_AGENT | VOLUME_ACCOUNTS) => {
                let Some(&want) = wanted.iter().find(|(volume, at, sub_path, _)| {
                    *volume == name
                        && *at == target.as_str()
                        && *sub_path == mount.sub_path.as_deref()
                }) else {
                    return Err(Error::UnexpectedMount(target));
                };
                if own.contains(&want) {
                    return Err(Error::UnexpectedMount(target));
                }
                if read_only != want.3 {
                    return Err(if read_only {
                        Error::ReadOnly(target)
                    } else {
                        Error::Writable(target)
                    });
                }
                own.push(want);
            }
            VOLUME_USER_DATA | VOLUME_SKILLS => persistent.push(PersistentMount {
                claim: if mount.name == VOLUME_USER_DATA {
                    Claim::UserData
                } else {
                    Claim::Skills
                },
                sub_path: mount.sub_path.clone().unwrap_or_default(),
                read_only,
                target,
            }),
            _ => return Err(Error::UnexpectedMount(target)),
        }
    }
    if own.len() != wanted.len() {
        return Err(Error::MissingMounts);
    }
    for mount in &persistent {
        if within(&mount.target, AGENT_MOUNT) || mount.target == AGENT_MOUNT {
            return Err(Error::UnexpectedMount(mount.target.clone()));
        }
        if persistent
            .iter()
            .any(|outer| within(&mount.target, &outer.target))
        {
            return Err(Error::NestedMount(mount.target.clone()));
        }
        if mount.claim == Claim::Skills && !mount.read_only {
            return Err(Error::Writable(mount.target.clone()));
        }
    }
    Ok(persistent)
}

/// The persistent mounts must be exactly the layout's for this uid and workdir.
pub(super) fn check_layout_mounts(
    found: &[PersistentMount],
    expected: &[PersistentMount],
) -> Result<(), Error> {
    for mount in found {
        let Some(want) = expected.iter().find(|w| w.target == mount.target) else {
            return Err(Error::UnexpectedMount(mount.target.clone()));
        };
        if found.iter().filter(|m| m.target == mount.target).count() > 1
            || mount.claim != want.claim
        {
            return Err(Error::UnexpectedMount(mount.target.clone()));
        }
        if mount.read_only != want.read_only {
            return Err(if want.read_only {
                Error::Writable(mount.target.clone())
            } else {
                Error::ReadOnly(mount.target.clone())
            });
        }
        if mount.sub_path != want.sub_path {
            return Err(Error::ForeignSubPath {
                target: mount.target.clone(),
                sub_path: mount.sub_path.clone(),
            });
        }
    }
    if found.len() != expected.len() {
        return Err(Error::MissingMounts);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};
    use warren_core::{LayoutName, NetworkPolicy};

    use crate::identity::tests::{decide_on, pod_value, read};
    use crate::identity::{Decision, PodIdentity};
    use crate::manifests::example_plan;
    use crate::Error;

    #[test]
    fn a_deerflow_pod_with_a_writable_personal_skills_mount_is_refused() {
        let plan = example_plan(LayoutName::Deerflow, NetworkPolicy::None);
        let mut value = pod_value(&plan);
        let mounts = value["spec"]["containers"][0]["volumeMounts"]
            .as_array_mut()
            .unwrap();
        let custom = mounts
            .iter_mut()
            .find(|m| m["mountPath"] == "/mnt/skills/custom")
            .unwrap();
        custom.as_object_mut().unwrap().remove("readOnly");
        assert_eq!(
            read(value).err(),
            Some(Error::Writable("/mnt/skills/custom".into()))
        );
    }

    /// The index of the sandbox container's mount at `target` in a pod's JSON.
    fn mount_index(pod: &Value, target: &str) -> usize {
        pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .position(|m| m["mountPath"] == target)
            .unwrap_or_else(|| panic!("no mount at {target}"))
    }

    #[test]
    fn an_e2b_pod_is_adopted_only_in_exactly_its_own_shape() {
        let plan = example_plan(LayoutName::E2b, NetworkPolicy::None);
        let built = pod_value(&plan);
        assert_eq!(read(built.clone()).unwrap(), PodIdentity::of_plan(&plan));
        assert!(matches!(
            decide_on(built.clone(), &plan),
            Decision::Adopt { .. }
        ));
        let home = "/home/user";
        type Change = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(&str, Change, Error)> = vec![
            (
                "a home emptyDir beside the workdir (I30: the home is persistent)",
                Box::new(|p| {
                    p["spec"]["volumes"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "home", "emptyDir": {}}))
                }),
                Error::UnexpectedVolume("home".into()),
            ),
            (
                "an emptyDir at the home over the workdir",
                Box::new(|p| {
                    let i = mount_index(p, "/home/user");
                    p["spec"]["containers"][0]["volumeMounts"][i] =
                        json!({"name": "tmp", "mountPath": "/home/user"})
                }),
                Error::UnexpectedMount(home.into()),
            ),
            (
                "a read-only home",
                Box::new(|p| {
                    let i = mount_index(p, "/home/user");
                    p["spec"]["containers"][0]["volumeMounts"][i]["readOnly"] = json!(true)
                }),
                Error::ReadOnly(home.into()),
            ),
            (
                "another workdir at the home",
                Box::new(|p| {
                    let i = mount_index(p, "/home/user");
                    p["spec"]["containers"][0]["volumeMounts"][i]["subPath"] =
                        json!("shared/alice/workspace/e2b/s2")
                }),
                Error::ForeignSubPath {
                    target: home.into(),
                    sub_path: "shared/alice/workspace/e2b/s2".into(),
                },
            ),
            (
                "the whole UserWorkspace at the home",
                Box::new(|p| {
                    let i = mount_index(p, "/home/user");
                    p["spec"]["containers"][0]["volumeMounts"][i]["subPath"] =
                        json!("shared/alice/workspace")
                }),
                Error::ForeignSubPath {
                    target: home.into(),
                    sub_path: "shared/alice/workspace".into(),
                },
            ),
            (
                "a writable /etc/passwd",
                Box::new(|p| {
                    let i = mount_index(p, "/etc/passwd");
                    p["spec"]["containers"][0]["volumeMounts"][i]
                        .as_object_mut()
                        .unwrap()
                        .remove("readOnly");
                }),
                Error::Writable("/etc/passwd".into()),
            ),
            (
                "the image's /etc/passwd (no accounts mount)",
                Box::new(|p| {
                    let i = mount_index(p, "/etc/passwd");
                    p["spec"]["containers"][0]["volumeMounts"]
                        .as_array_mut()
                        .unwrap()
                        .remove(i);
                }),
                Error::MissingMounts,
            ),
            (
                "the accounts emptyDir whole at /etc",
                Box::new(|p| {
                    p["spec"]["containers"][0]["volumeMounts"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "accounts", "mountPath": "/etc", "readOnly": true}))
                }),
                Error::UnexpectedMount("/etc".into()),
            ),
            (
                "the group file at /etc/passwd",
                Box::new(|p| {
                    let i = mount_index(p, "/etc/passwd");
                    p["spec"]["containers"][0]["volumeMounts"][i]["subPath"] = json!("group")
                }),
                Error::UnexpectedMount("/etc/passwd".into()),
            ),
            (
                "no accounts volume",
                Box::new(|p| {
                    p["spec"]["volumes"]
                        .as_array_mut()
                        .unwrap()
                        .retain(|v| v["name"] != "accounts")
                }),
                Error::UnexpectedVolume("accounts (missing)".into()),
            ),
            (
                "a prepare container that does not see the accounts emptyDir",
                Box::new(|p| {
                    p["spec"]["initContainers"][0]["volumeMounts"]
                        .as_array_mut()
                        .unwrap()
                        .truncate(1)
                }),
                Error::UnexpectedMount("/warren/accounts in container prepare".into()),
            ),
            (
                "the accounts emptyDir in the bundle container",
                Box::new(|p| {
                    p["spec"]["initContainers"][1]["volumeMounts"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "accounts", "mountPath": "/warren/accounts"}))
                }),
                Error::UnexpectedMount("/warren/accounts in container agent-bundle".into()),
            ),
            (
                "the ARS layout's mounts under the E2B annotation",
                Box::new(|p| {
                    let ars = pod_value(&example_plan(LayoutName::Ars, NetworkPolicy::None));
                    p["spec"]["containers"][0]["volumeMounts"] =
                        ars["spec"]["containers"][0]["volumeMounts"].clone();
                    p["spec"]["volumes"] = ars["spec"]["volumes"].clone();
                }),
                Error::UnexpectedVolume("home".into()),
            ),
        ];
        for (what, change, expected) in cases {
            let mut value = built.clone();
            change(&mut value);
            assert_eq!(read(value.clone()).err(), Some(expected.clone()), "{what}");
            assert_eq!(
                decide_on(value, &plan),
                Decision::Remove {
                    reason: expected.to_string()
                },
                "{what}"
            );
        }
    }
}
