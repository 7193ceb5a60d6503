//! Reading and deciding about whole pods, and the helpers the submodules' tests share.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};
use warren_core::{LayoutName, NetworkPolicy, Workdir};

use super::*;
use crate::manifests::{build, example_plan, PersistentMount, PodPlan};

pub(super) fn plan() -> PodPlan {
    example_plan(LayoutName::Ars, NetworkPolicy::None)
}

pub(super) fn pod_value(plan: &PodPlan) -> Value {
    serde_json::to_value(build(plan).unwrap().pod).unwrap()
}

pub(super) fn read(value: Value) -> Result<PodIdentity, Error> {
    let pod: Pod = serde_json::from_value(value).unwrap();
    read_pod(&pod, "i1")
}

pub(super) fn decide_on(value: Value, plan: &PodPlan) -> Decision {
    decide(&serde_json::from_value(value).unwrap(), plan)
}

#[test]
fn a_pod_warren_built_reads_back_as_its_plan_and_is_adopted() {
    for layout in LayoutName::ALL {
        let plan = example_plan(layout, NetworkPolicy::Open { deny: vec![] });
        let identity = read(pod_value(&plan)).unwrap();
        assert_eq!(identity, PodIdentity::of_plan(&plan), "{layout}");
        match decide_on(pod_value(&plan), &plan) {
            Decision::Adopt {
                identity,
                agent_key,
            } => {
                assert_eq!(identity.layout, layout);
                assert_eq!(agent_key.expose(), plan.agent.key);
                assert!(!format!("{agent_key:?}").contains(&plan.agent.key));
            }
            other => panic!("{layout}: {other:?}"),
        }
    }
}

#[test]
fn a_pod_of_another_binding_is_removed_naming_the_difference() {
    let built = plan();
    type Change = Box<dyn Fn(&mut PodPlan)>;
    let cases: Vec<(&str, Change)> = vec![
        ("generation", Box::new(|p| p.generation = 4)),
        (
            "network",
            Box::new(|p| p.network = NetworkPolicy::Open { deny: vec![] }),
        ),
        ("image", Box::new(|p| p.image = "python:3.13".into())),
        (
            "USER_DATA claim",
            Box::new(|p| p.user_data_claim = "other".into()),
        ),
        (
            "workdir",
            Box::new(|p| {
                p.workdir = Workdir::new("projects/b").unwrap();
            }),
        ),
    ];
    for (what, change) in cases {
        let mut expected = built.clone();
        change(&mut expected);
        match decide_on(pod_value(&built), &expected) {
            Decision::Remove { reason } => {
                assert!(reason.contains(what), "{what}: {reason}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn legacy_privileged_and_foreign_pods_are_refused_with_their_reason() {
    let plan = plan();
    let user_data = "/home/gem/user-data";
    type Change = Box<dyn Fn(&mut Value)>;
    let push_mount = |mount: Value| -> Change {
        Box::new(move |p| {
            p["spec"]["containers"][0]["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(mount.clone())
        })
    };
    let cases: Vec<(&str, Change, Error)> = vec![
        (
            "a /home/gem/projects mount",
            push_mount(
                json!({"name": "user-data", "mountPath": "/home/gem/projects", "subPath": "shared/alice/workspace/projects"}),
            ),
            Error::ProjectsMount,
        ),
        (
            "a nested user-data sub-mount",
            push_mount(
                json!({"name": "user-data", "mountPath": "/home/gem/user-data/projects/a", "subPath": "shared/alice/workspace/projects/a"}),
            ),
            Error::NestedMount("/home/gem/user-data/projects/a".into()),
        ),
        (
            "a writable skills mount",
            Box::new(|p| {
                p["spec"]["containers"][0]["volumeMounts"][4]
                    .as_object_mut()
                    .unwrap()
                    .remove("readOnly");
            }),
            Error::Writable("/home/gem/skills".into()),
        ),
        (
            "a read-only workspace",
            Box::new(|p| p["spec"]["containers"][0]["volumeMounts"][3]["readOnly"] = json!(true)),
            Error::ReadOnly(user_data.into()),
        ),
        (
            "another uid's workspace",
            Box::new(|p| {
                p["spec"]["containers"][0]["volumeMounts"][3]["subPath"] =
                    json!("shared/bob/workspace")
            }),
            Error::ForeignSubPath {
                target: user_data.into(),
                sub_path: "shared/bob/workspace".into(),
            },
        ),
        (
            "the whole claim at user-data",
            Box::new(|p| {
                p["spec"]["containers"][0]["volumeMounts"][3]
                    .as_object_mut()
                    .unwrap()
                    .remove("subPath");
            }),
            Error::ForeignSubPath {
                target: user_data.into(),
                sub_path: String::new(),
            },
        ),
        (
            "no skills mount",
            Box::new(|p| {
                p["spec"]["containers"][0]["volumeMounts"]
                    .as_array_mut()
                    .unwrap()
                    .remove(4);
            }),
            Error::MissingMounts,
        ),
        (
            "an extra hostPath volume",
            Box::new(|p| {
                p["spec"]["volumes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}))
            }),
            Error::HostPath("docker".into()),
        ),
        (
            "an emptyDir in place of the USER_DATA claim",
            Box::new(|p| p["spec"]["volumes"][0] = json!({"name": "user-data", "emptyDir": {}})),
            Error::UnexpectedVolume("user-data".into()),
        ),
        (
            "a mount of a volume warren never makes",
            Box::new(|p| {
                p["spec"]["volumes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "extra", "emptyDir": {}}))
            }),
            Error::UnexpectedVolume("extra".into()),
        ),
        (
            "a privileged sandbox container",
            Box::new(|p| p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true)),
            Error::Privileges("container sandbox: privileged".into()),
        ),
        (
            "a capability added",
            Box::new(|p| {
                p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                    json!(["SYS_ADMIN"])
            }),
            Error::Privileges("container sandbox: capability SYS_ADMIN added".into()),
        ),
        (
            "the prepare container with more than CHOWN, DAC_OVERRIDE and FOWNER",
            Box::new(|p| {
                p["spec"]["initContainers"][0]["securityContext"]["capabilities"]["add"] =
                    json!(["CHOWN", "DAC_OVERRIDE", "FOWNER", "SYS_ADMIN"])
            }),
            Error::Privileges("container prepare: capability SYS_ADMIN added".into()),
        ),
        (
            "the prepare container with a subset and something else",
            Box::new(|p| {
                p["spec"]["initContainers"][0]["securityContext"]["capabilities"]["add"] =
                    json!(["CHOWN", "SYS_ADMIN"])
            }),
            Error::Privileges("container prepare: capability SYS_ADMIN added".into()),
        ),
        (
            "the prepare container keeping set-id bits a chmod would lose",
            Box::new(|p| {
                p["spec"]["initContainers"][0]["securityContext"]["capabilities"]["add"] =
                    json!(["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"])
            }),
            Error::Privileges("container prepare: capability FSETID added".into()),
        ),
        (
            "the prepare container's capabilities on the agent-bundle container",
            Box::new(|p| {
                p["spec"]["initContainers"][1]["securityContext"]["capabilities"]["add"] =
                    json!(["FOWNER"])
            }),
            Error::Privileges("container agent-bundle: capability FOWNER added".into()),
        ),
        (
            "privilege escalation",
            Box::new(|p| {
                p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
                    json!(true)
            }),
            Error::Privileges("container sandbox: privilege escalation allowed".into()),
        ),
        (
            "a writable root filesystem",
            Box::new(|p| {
                p["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] =
                    json!(false)
            }),
            Error::Privileges("container sandbox: a writable root filesystem".into()),
        ),
        (
            "a root sandbox container",
            Box::new(|p| p["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(0)),
            Error::Privileges("container sandbox: a user other than 1000:1000".into()),
        ),
        (
            "a service account token",
            Box::new(|p| p["spec"]["automountServiceAccountToken"] = json!(true)),
            Error::Privileges("a service account token".into()),
        ),
        (
            "the node's network",
            Box::new(|p| p["spec"]["hostNetwork"] = json!(true)),
            Error::Privileges("a namespace of the node".into()),
        ),
        (
            "an fsGroup",
            Box::new(|p| p["spec"]["securityContext"]["fsGroup"] = json!(1000)),
            Error::Privileges("extra groups (fsGroup re-owns the claims)".into()),
        ),
        (
            "environment from a Secret",
            Box::new(|p| {
                p["spec"]["containers"][0]["envFrom"] =
                    json!([{"secretRef": {"name": "warren-token"}}])
            }),
            Error::Privileges("container sandbox: environment from other objects".into()),
        ),
        (
            "a writable agent bundle",
            Box::new(|p| {
                p["spec"]["containers"][0]["volumeMounts"][2]
                    .as_object_mut()
                    .unwrap()
                    .remove("readOnly");
            }),
            Error::Writable("/opt/warren-agent".into()),
        ),
        (
            "a prepare container that sees the whole claim",
            Box::new(|p| {
                p["spec"]["initContainers"][0]["volumeMounts"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("subPath");
            }),
            Error::ForeignSubPath {
                target: PREPARE_ROOT.into(),
                sub_path: String::new(),
            },
        ),
        (
            "a sidecar",
            Box::new(|p| {
                let sidecar = p["spec"]["containers"][0].clone();
                let containers = p["spec"]["containers"].as_array_mut().unwrap();
                containers.push(sidecar);
                containers[1]["name"] = json!("sidecar");
            }),
            Error::UnexpectedContainer("sidecar".into()),
        ),
        (
            "another instance's",
            Box::new(|p| p["metadata"]["labels"][LABEL_INSTANCE] = json!("i2")),
            Error::ForeignInstance { found: "i2".into() },
        ),
        (
            "a sandbox id that is not its uid and scope's",
            Box::new(|p| p["metadata"]["annotations"][ANNOTATION_UID] = json!("mallory")),
            Error::BadMetadata(LABEL_SANDBOX),
        ),
        (
            "an image other than its annotation's",
            Box::new(|p| p["spec"]["containers"][0]["image"] = json!("other:1")),
            Error::BadMetadata(ANNOTATION_IMAGE),
        ),
        (
            "a layout warren does not know",
            Box::new(|p| p["metadata"]["annotations"][ANNOTATION_LAYOUT] = json!("e2b-desktop")),
            Error::BadMetadata(ANNOTATION_LAYOUT),
        ),
        (
            "mounts other than its annotation's",
            Box::new(|p| p["metadata"]["annotations"][ANNOTATION_MOUNTS] = json!("[]")),
            Error::BadMetadata(ANNOTATION_MOUNTS),
        ),
        (
            "no generation",
            Box::new(|p| {
                p["metadata"]["annotations"]
                    .as_object_mut()
                    .unwrap()
                    .remove(ANNOTATION_GENERATION);
            }),
            Error::MissingMetadata(ANNOTATION_GENERATION),
        ),
    ];
    for (what, change, expected) in cases {
        let mut value = pod_value(&plan);
        change(&mut value);
        assert_eq!(read(value.clone()).err(), Some(expected.clone()), "{what}");
        let decision = decide_on(value, &plan);
        let reason = expected.to_string();
        match expected {
            Error::ForeignInstance { .. } => {
                assert_eq!(decision, Decision::Ignore { reason }, "{what}")
            }
            _ => assert_eq!(decision, Decision::Remove { reason }, "{what}"),
        }
    }
}

#[test]
fn a_pod_is_adopted_only_for_its_own_environment_policy() {
    let plan = example_plan(LayoutName::Ars, NetworkPolicy::None);
    let isolated = PodPlan {
        inherit_env: false,
        ..plan.clone()
    };
    for (pod, record) in [(&plan, &isolated), (&isolated, &plan)] {
        match decide_on(pod_value(pod), record) {
            Decision::Remove { reason } => {
                assert!(reason.contains("inherit_env"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    // A pod made before the policy was recorded reads as inheriting, the default.
    let mut value = pod_value(&plan);
    let annotations = value["metadata"]["annotations"].as_object_mut().unwrap();
    assert!(annotations.remove(ANNOTATION_INHERIT_ENV).is_some());
    assert!(read(value.clone()).unwrap().inherit_env);
    value["metadata"]["annotations"][ANNOTATION_INHERIT_ENV] = json!("sometimes");
    assert!(matches!(
        read(value),
        Err(Error::BadMetadata(ANNOTATION_INHERIT_ENV))
    ));
}

#[test]
fn a_pod_of_another_layout_is_not_an_e2b_pod_nor_the_reverse() {
    let e2b = example_plan(LayoutName::E2b, NetworkPolicy::None);
    let ars = example_plan(LayoutName::Ars, NetworkPolicy::None);
    // Each pod as built, judged against the other layout's record of the same sandbox.
    for (pod, record) in [(&e2b, &ars), (&ars, &e2b)] {
        let expected = PodPlan {
            workdir: pod.workdir.clone(),
            mounts: PersistentMount::for_layout(record.layout, &pod.uid.safe(), &pod.workdir),
            ..record.clone()
        };
        match decide_on(pod_value(pod), &expected) {
            Decision::Remove { reason } => assert!(reason.contains("layout"), "{reason}"),
            other => panic!("{} judged as {}: {other:?}", pod.layout, record.layout),
        }
    }
    // An ARS pod given warren's accounts files (a user the layout does not have).
    let mut value = pod_value(&ars);
    value["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "accounts", "emptyDir": {"sizeLimit": "65536"}}));
    value["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "accounts", "mountPath": "/etc/passwd", "subPath": "passwd", "readOnly": true}));
    assert_eq!(
        read(value).err(),
        Some(Error::UnexpectedVolume("accounts".into()))
    );
    // The E2B annotation on an ARS pod.
    let mut value = pod_value(&ars);
    value["metadata"]["annotations"][ANNOTATION_LAYOUT] = json!("e2b");
    assert!(read(value).is_err());
}

#[test]
fn an_ended_or_keyless_pod_is_removed() {
    let plan = plan();
    for (what, change) in [
        ("failed", json!({"status": {"phase": "Failed"}})),
        ("succeeded", json!({"status": {"phase": "Succeeded"}})),
        (
            "being deleted",
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        ),
    ] {
        let mut value = pod_value(&plan);
        if let Some(status) = change.get("status") {
            value["status"] = status.clone();
        } else {
            value["metadata"]["deletionTimestamp"] =
                change["metadata"]["deletionTimestamp"].clone();
        }
        assert!(
            matches!(decide_on(value, &plan), Decision::Remove { reason } if reason.contains("ended")),
            "{what}"
        );
    }
    let mut value = pod_value(&plan);
    value["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("env");
    assert_eq!(
        decide_on(value, &plan),
        Decision::Remove {
            reason: Error::MissingAgentKey.to_string()
        }
    );
}

#[test]
fn services_and_network_policies_name_their_sandbox_for_this_instance_only() {
    let plan = plan();
    let objects = build(&plan).unwrap();
    for meta in [&objects.service.metadata, &objects.network_policy.metadata] {
        assert_eq!(sandbox_of(meta, "i1"), Some(plan.sandbox.clone()));
        assert_eq!(sandbox_of(meta, "i2"), None);
    }
    assert_eq!(sandbox_of(&ObjectMeta::default(), "i1"), None);
}
