//! A sandbox's Pod, Service and NetworkPolicy say exactly what issue 15 lists.

use serde_json::{json, Value};
use warren_core::{LayoutName, NetworkPolicy};
use warren_kubernetes::names::{object_name, AGENT_KEY_ENV};
use warren_kubernetes::{build, AccountsTask, Error, Peer, PrepareConfig, ServiceType};

use super::support::{ars, plan};

fn objects(plan: &warren_kubernetes::PodPlan) -> (Value, Value, Value) {
    let objects = build(plan).unwrap();
    (
        serde_json::to_value(objects.pod).unwrap(),
        serde_json::to_value(objects.service).unwrap(),
        serde_json::to_value(objects.network_policy).unwrap(),
    )
}

fn mount<'a>(container: &'a Value, path: &str) -> &'a Value {
    container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == path)
        .unwrap_or_else(|| panic!("no mount at {path}"))
}

#[test]
fn the_pod_runs_the_sandbox_unprivileged_with_no_token_and_no_service_links() {
    let (pod, _, _) = objects(&ars());
    let spec = &pod["spec"];
    assert_eq!(spec["automountServiceAccountToken"], json!(false));
    assert_eq!(spec["enableServiceLinks"], json!(false));
    assert_eq!(spec["restartPolicy"], json!("Never"));
    assert_eq!(
        spec["securityContext"],
        json!({"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert!(spec.get("hostNetwork").is_none() && spec.get("hostPID").is_none());
    let sandbox = &spec["containers"][0];
    assert_eq!(sandbox["name"], "sandbox");
    assert_eq!(sandbox["image"], "python:3.12-slim");
    assert_eq!(
        sandbox["securityContext"],
        json!({"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
               "privileged": false, "allowPrivilegeEscalation": false,
               "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]},
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    let amounts =
        json!({"cpu": "1500m", "memory": "2147483648", "ephemeral-storage": "4294967296"});
    assert_eq!(
        sandbox["resources"],
        json!({"limits": amounts, "requests": amounts})
    );
}

#[test]
fn the_pod_mounts_exactly_the_two_sub_paths_the_size_limited_home_and_tmp_in_memory_and_the_read_only_agent(
) {
    let (pod, _, _) = objects(&ars());
    let sandbox = &pod["spec"]["containers"][0];
    assert_eq!(sandbox["volumeMounts"].as_array().unwrap().len(), 5);
    assert_eq!(
        mount(sandbox, "/home/gem/user-data"),
        &json!({"name": "user-data", "mountPath": "/home/gem/user-data", "subPath": "shared/alice/workspace"})
    );
    assert_eq!(
        mount(sandbox, "/home/gem/skills"),
        &json!({"name": "skills", "mountPath": "/home/gem/skills", "subPath": "skill-projections/alice", "readOnly": true})
    );
    assert_eq!(mount(sandbox, "/home/gem")["name"], "home");
    assert_eq!(mount(sandbox, "/tmp")["name"], "tmp");
    assert_eq!(
        mount(sandbox, "/opt/warren-agent"),
        &json!({"name": "agent", "mountPath": "/opt/warren-agent", "readOnly": true})
    );
    let volumes = &pod["spec"]["volumes"];
    assert_eq!(
        volumes,
        &json!([
            {"name": "user-data", "persistentVolumeClaim": {"claimName": "warren-user-data"}},
            {"name": "skills", "persistentVolumeClaim": {"claimName": "warren-skills", "readOnly": true}},
            {"name": "home", "emptyDir": {"medium": "Memory", "sizeLimit": "268435456"}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "268435456"}},
            {"name": "agent", "emptyDir": {"sizeLimit": "268435456"}},
        ])
    );
}

#[test]
fn a_deerflow_pod_mounts_its_workdir_and_both_skill_trees_by_sub_path() {
    let plan = plan(
        LayoutName::Deerflow,
        NetworkPolicy::None,
        ServiceType::ClusterIp,
    );
    let (pod, _, _) = objects(&plan);
    let sandbox = &pod["spec"]["containers"][0];
    assert_eq!(
        mount(sandbox, "/mnt/user-data")["subPath"],
        "shared/alice/workspace/threads/t1/user-data"
    );
    assert_eq!(
        mount(sandbox, "/mnt/skills/public")["subPath"],
        "skill-projections/alice"
    );
    assert_eq!(
        mount(sandbox, "/mnt/skills/public")["readOnly"],
        json!(true)
    );
    assert_eq!(
        mount(sandbox, "/mnt/skills/custom")["subPath"],
        "shared/alice/workspace/agents/skills"
    );
    assert_eq!(
        mount(sandbox, "/mnt/skills/custom")["readOnly"],
        json!(true)
    );
    // The prepare container checks both directories of the UserWorkspace exist.
    assert_eq!(
        plan.prepare_config(),
        PrepareConfig::Sandbox {
            root: "/warren/user-data".into(),
            workdir: "threads/t1/user-data".into(),
            also_require: vec!["agents/skills".into()],
            accounts: None,
        }
    );
}

#[test]
fn an_e2b_pod_mounts_its_workdir_at_the_home_and_warrens_accounts_read_only() {
    let plan = plan(LayoutName::E2b, NetworkPolicy::None, ServiceType::ClusterIp);
    let (pod, _, _) = objects(&plan);
    let sandbox = &pod["spec"]["containers"][0];
    // I7: the workdir itself, writable, is the home; no home emptyDir anywhere (I30).
    assert_eq!(
        mount(sandbox, "/home/user"),
        &json!({"name": "user-data", "mountPath": "/home/user", "subPath": "shared/alice/workspace/e2b/s1"})
    );
    // I11: user at 1000 named by warren's files, each a read-only subPath of the emptyDir.
    assert_eq!(
        mount(sandbox, "/etc/passwd"),
        &json!({"name": "accounts", "mountPath": "/etc/passwd", "subPath": "passwd", "readOnly": true})
    );
    assert_eq!(
        mount(sandbox, "/etc/group"),
        &json!({"name": "accounts", "mountPath": "/etc/group", "subPath": "group", "readOnly": true})
    );
    let targets: Vec<&str> = sandbox["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        [
            "/tmp",
            "/opt/warren-agent",
            "/etc/passwd",
            "/etc/group",
            "/home/user"
        ]
    );
    assert_eq!(
        pod["spec"]["volumes"],
        json!([
            {"name": "user-data", "persistentVolumeClaim": {"claimName": "warren-user-data"}},
            {"name": "skills", "persistentVolumeClaim": {"claimName": "warren-skills", "readOnly": true}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "268435456"}},
            {"name": "agent", "emptyDir": {"sizeLimit": "268435456"}},
            {"name": "accounts", "emptyDir": {"sizeLimit": "65536"}},
        ])
    );
    // The prepare container writes them: it alone sees the accounts emptyDir, writable.
    let inits = pod["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(
        inits[0]["volumeMounts"],
        json!([
            {"name": "user-data", "mountPath": "/warren/user-data", "subPath": "shared/alice"},
            {"name": "accounts", "mountPath": "/warren/accounts"},
        ])
    );
    assert_eq!(
        inits[1]["volumeMounts"],
        json!([{"name": "agent", "mountPath": "/opt/warren-agent"}])
    );
    let command: Vec<String> = serde_json::from_value(inits[0]["command"].clone()).unwrap();
    let config: PrepareConfig = serde_json::from_str(&command[2]).unwrap();
    assert_eq!(
        config,
        PrepareConfig::Sandbox {
            root: "/warren/user-data".into(),
            workdir: "e2b/s1".into(),
            also_require: vec![],
            accounts: Some(AccountsTask {
                dir: "/warren/accounts".into(),
                layout: LayoutName::E2b,
            }),
        }
    );
    // And for the layouts whose user the image names, none of it.
    for layout in [LayoutName::Ars, LayoutName::Deerflow] {
        let (pod, _, _) = objects(&super::support::plan(
            layout,
            NetworkPolicy::None,
            ServiceType::ClusterIp,
        ));
        let text = pod.to_string();
        assert!(!text.contains("accounts"), "{layout}: {text}");
        assert!(!text.contains("/etc/passwd"), "{layout}");
        assert_eq!(
            mount(&pod["spec"]["containers"][0], "/home/gem")["name"],
            "home"
        );
    }
    super::support::assert_valid("e2b", &super::support::sandbox_stream(&plan));
}

#[test]
fn an_e2b_plan_without_its_home_mount_is_refused() {
    let mut plan = plan(LayoutName::E2b, NetworkPolicy::None, ServiceType::ClusterIp);
    plan.mounts.clear();
    match build(&plan) {
        Err(Error::Invalid { what, value, .. }) => {
            assert_eq!((what, value.as_str()), ("mount target", "/home/user"))
        }
        other => panic!("{other:?}"),
    }
    let mut plan =
        super::support::plan(LayoutName::E2b, NetworkPolicy::None, ServiceType::ClusterIp);
    plan.mounts[0].target = "/etc/passwd".into();
    assert!(
        build(&plan).is_err(),
        "warren's accounts files are reserved"
    );
}

#[test]
fn the_root_init_container_sees_only_the_uids_subtree_and_keeps_only_chown_dac_override_and_fowner()
{
    let plan = ars();
    let (pod, _, _) = objects(&plan);
    let inits = pod["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(inits.len(), 2);
    let prepare = &inits[0];
    assert_eq!(prepare["name"], "prepare");
    assert_eq!(prepare["image"], "ghcr.io/example/warren:1.0");
    assert_eq!(
        prepare["volumeMounts"],
        json!([{"name": "user-data", "mountPath": "/warren/user-data", "subPath": "shared/alice"}])
    );
    let context = &prepare["securityContext"];
    assert_eq!(context["runAsUser"], json!(0));
    assert_eq!(context["runAsNonRoot"], json!(false));
    assert_eq!(context["allowPrivilegeEscalation"], json!(false));
    assert_eq!(context["readOnlyRootFilesystem"], json!(true));
    assert_eq!(
        context["capabilities"],
        json!({"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]})
    );
    let command: Vec<String> = serde_json::from_value(prepare["command"].clone()).unwrap();
    assert_eq!(command[..2], ["/usr/local/bin/warren", "__k8s-prepare"]);
    let config: PrepareConfig = serde_json::from_str(&command[2]).unwrap();
    assert_eq!(config, plan.prepare_config());
    assert_eq!(
        config,
        PrepareConfig::Sandbox {
            root: "/warren/user-data".into(),
            workdir: "projects/a".into(),
            also_require: vec![],
            accounts: None,
        }
    );

    let bundle = &inits[1];
    assert_eq!(bundle["name"], "agent-bundle");
    assert_eq!(bundle["securityContext"]["runAsUser"], json!(1000));
    assert_eq!(
        bundle["volumeMounts"],
        json!([{"name": "agent", "mountPath": "/opt/warren-agent"}])
    );
}

#[test]
fn the_agent_key_is_only_in_the_sandbox_containers_environment() {
    let plan = ars();
    let (pod, service, policy) = objects(&plan);
    let sandbox = &pod["spec"]["containers"][0];
    assert_eq!(
        sandbox["env"],
        json!([{"name": AGENT_KEY_ENV, "value": plan.agent.key}])
    );
    for init in pod["spec"]["initContainers"].as_array().unwrap() {
        assert!(init.get("env").is_none());
    }
    // Nowhere else: not in a label, annotation, command line, the Service or the policy.
    let mut without_env = pod.clone();
    without_env["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("env");
    for object in [without_env, service, policy] {
        assert!(!object.to_string().contains(&plan.agent.key), "{object}");
    }
}

#[test]
fn the_identity_is_in_labels_and_annotations() {
    let plan = ars();
    let (pod, service, policy) = objects(&plan);
    let name = object_name("i1", &plan.sandbox);
    for object in [&pod, &service, &policy] {
        assert_eq!(object["metadata"]["name"], json!(name));
        assert_eq!(object["metadata"]["namespace"], json!("warren"));
        assert_eq!(object["metadata"]["labels"]["warren.dev/instance"], "i1");
        assert_eq!(
            object["metadata"]["labels"]["warren.dev/sandbox"],
            json!(plan.sandbox.as_str())
        );
    }
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["warren.dev/uid"], "alice");
    assert_eq!(annotations["warren.dev/safe-uid"], "alice");
    assert_eq!(annotations["warren.dev/runtime-scope"], "thread-1");
    assert_eq!(annotations["warren.dev/workdir"], "projects/a");
    assert_eq!(annotations["warren.dev/generation"], "1");
    assert_eq!(annotations["warren.dev/layout"], "ars");
    assert_eq!(annotations["warren.dev/network"], r#"{"mode":"none"}"#);
    assert_eq!(annotations["warren.dev/image"], "python:3.12-slim");
    let mounts: Value =
        serde_json::from_str(annotations["warren.dev/mounts"].as_str().unwrap()).unwrap();
    assert_eq!(mounts[0]["sub_path"], "shared/alice/workspace");
    assert_eq!(mounts[1]["read_only"], json!(true));
}

#[test]
fn a_uid_that_is_no_label_value_still_names_its_objects_and_sub_paths() {
    let mut plan = ars();
    plan.uid = warren_core::Uid::new("Alice Smith <alice@example.com>").unwrap();
    plan.sandbox = warren_core::SandboxId::derive(&plan.uid, &plan.runtime_scope);
    plan.mounts = warren_kubernetes::PersistentMount::for_layout(
        plan.layout,
        &plan.uid.safe(),
        &plan.workdir,
    );
    let (pod, _, _) = objects(&plan);
    let safe = plan.uid.safe().to_string();
    assert!(safe.starts_with("uid-"));
    assert_eq!(
        mount(&pod["spec"]["containers"][0], "/home/gem/user-data")["subPath"],
        json!(format!("shared/{safe}/workspace"))
    );
    assert_eq!(
        pod["metadata"]["annotations"]["warren.dev/uid"],
        json!(plan.uid.as_str())
    );
    super::support::assert_valid("an odd uid", &super::support::sandbox_stream(&plan));
}

#[test]
fn the_service_selects_exactly_the_pod_on_the_agent_port() {
    for service_type in [ServiceType::ClusterIp, ServiceType::NodePort] {
        let plan = plan(LayoutName::Ars, NetworkPolicy::None, service_type);
        let (pod, service, _) = objects(&plan);
        assert_eq!(service["spec"]["type"], json!(service_type.as_str()));
        let selector = service["spec"]["selector"].as_object().unwrap();
        assert_eq!(selector.len(), 2);
        for (key, value) in selector {
            assert_eq!(&pod["metadata"]["labels"][key], value);
        }
        assert_eq!(
            service["spec"]["ports"],
            json!([{"name": "agent", "port": 7879, "targetPort": 7879, "protocol": "TCP"}])
        );
    }
}

#[test]
fn without_network_the_policy_denies_all_egress_and_admits_warren_to_the_agent_port_only() {
    let plan = ars();
    let (pod, _, policy) = objects(&plan);
    let spec = &policy["spec"];
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    assert!(
        spec.get("egress").is_none(),
        "no egress rule: all egress denied"
    );
    for (key, value) in spec["podSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][key], value);
    }
    assert_eq!(
        spec["ingress"],
        json!([{
            "from": [{"podSelector": {"matchLabels": {
                "app.kubernetes.io/instance": "warren", "app.kubernetes.io/name": "warren"}}}],
            "ports": [{"port": 7879, "protocol": "TCP"}],
        }])
    );
}

#[test]
fn with_egress_the_policy_allows_only_warrens_proxy() {
    for network in [
        NetworkPolicy::Open { deny: vec![] },
        NetworkPolicy::Allowlist {
            allow: vec!["pypi.org".into()],
            deny: vec![],
        },
    ] {
        let mut plan = plan(LayoutName::Ars, network, ServiceType::NodePort);
        plan.proxy.as_mut().unwrap().peer = Peer::IpBlock {
            cidr: "192.0.2.10".into(),
        };
        let (_, _, policy) = objects(&plan);
        assert_eq!(
            policy["spec"]["egress"],
            json!([{"to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
                    "ports": [{"port": 3128, "protocol": "TCP"}]}])
        );
    }
}

#[test]
fn plans_kubernetes_or_warren_would_refuse_are_refused_naming_the_value() {
    type Change = Box<dyn Fn(&mut warren_kubernetes::PodPlan)>;
    let cases: Vec<(&str, Change)> = vec![
        ("instance", Box::new(|p| p.instance = "I1".into())),
        ("namespace", Box::new(|p| p.namespace = "a_b".into())),
        (
            "claim name",
            Box::new(|p| p.user_data_claim = "Claim".into()),
        ),
        (
            "mount target",
            Box::new(|p| p.mounts[0].target = "home/gem/user-data".into()),
        ),
        (
            "mount target",
            Box::new(|p| p.mounts[1].target = "/home/gem/user-data/skills".into()),
        ),
        (
            "mount target",
            Box::new(|p| p.mounts[0].target = "/tmp".into()),
        ),
        (
            "mount target",
            Box::new(|p| p.mounts[0].target = "/opt/warren-agent/x".into()),
        ),
        (
            "subPath",
            Box::new(|p| p.mounts[0].sub_path = "shared/alice/../bob".into()),
        ),
        (
            "subPath",
            Box::new(|p| p.mounts[0].sub_path = "/shared".into()),
        ),
        (
            "CIDR",
            Box::new(|p| {
                p.agent_clients = Peer::IpBlock {
                    cidr: "10.0.0.0/33".into(),
                }
            }),
        ),
        ("memory limit", Box::new(|p| p.limits.memory_bytes = 0)),
        ("agent key", Box::new(|p| p.agent.key.clear())),
        ("agent command", Box::new(|p| p.agent.command.clear())),
        ("image", Box::new(|p| p.image = " python".into())),
    ];
    for (what, change) in cases {
        let mut plan = ars();
        change(&mut plan);
        match build(&plan) {
            Err(Error::Invalid { what: found, .. }) => assert_eq!(found, what),
            Err(Error::InvalidInstance { .. }) => assert_eq!(what, "instance"),
            other => panic!("{what}: {other:?}"),
        }
    }
    let mut plan = plan(
        LayoutName::Ars,
        NetworkPolicy::Open { deny: vec![] },
        ServiceType::ClusterIp,
    );
    plan.proxy = None;
    assert_eq!(
        build(&plan).unwrap_err(),
        Error::NoProxy { mode: "open" },
        "egress needs somewhere to go"
    );
}
