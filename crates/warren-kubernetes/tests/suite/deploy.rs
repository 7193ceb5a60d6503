//! The manifests that run warren itself: what they hold, and that they agree with warren's
//! own paths and configuration keys.

use serde_json::{json, Value};
use warren_core::{DataLayout, Uid};
use warren_kubernetes::deploy::{warren_toml, DATA_DIR, USER_DATA_DIR, WORKSPACE_DIR};
use warren_kubernetes::names::{skill_projection_sub_path, user_workspace_sub_path};
use warren_kubernetes::{
    deployment_manifests, DeployOptions, Error, KubernetesSettings, S3Options, SecretKey,
};

fn options() -> DeployOptions {
    DeployOptions::new("warren", "ghcr.io/example/warren:1.0")
}

fn with_everything() -> DeployOptions {
    DeployOptions {
        postgres: Some(SecretKey::new("warren-postgres", "url")),
        s3: Some(S3Options {
            endpoint: "https://s3.example.com".into(),
            bucket: "snapshots".into(),
            region: Some("eu-west-1".into()),
            access_key_id: SecretKey::new("warren-s3", "id"),
            secret_access_key: SecretKey::new("warren-s3", "secret"),
        }),
        sandbox_image: Some("python:3.12-slim".into()),
        ..options()
    }
}

/// The documents of the stream, parsed (each is JSON).
fn documents(options: &DeployOptions) -> Vec<Value> {
    let stream = deployment_manifests(options).unwrap();
    stream
        .split("\n---\n")
        .map(|document| {
            let json: String = document
                .lines()
                .filter(|line| !line.starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n");
            serde_json::from_str(&json).unwrap()
        })
        .collect()
}

fn kinds(documents: &[Value]) -> Vec<String> {
    documents
        .iter()
        .map(|d| {
            format!(
                "{} {}",
                d["kind"].as_str().unwrap(),
                d["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn find<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    documents.iter().find(|d| d["kind"] == kind).unwrap()
}

#[test]
fn the_stream_holds_every_object_and_a_state_claim_only_without_postgresql() {
    assert_eq!(
        kinds(&documents(&options())),
        [
            "ServiceAccount warren",
            "Role warren",
            "RoleBinding warren",
            "PersistentVolumeClaim warren-user-data",
            "PersistentVolumeClaim warren-skills",
            "PersistentVolumeClaim warren-state",
            "ConfigMap warren-config",
            "Deployment warren",
            "Service warren",
        ]
    );
    let with_postgres = kinds(&documents(&with_everything()));
    assert!(!with_postgres.iter().any(|k| k.ends_with("warren-state")));
    for document in documents(&with_everything()) {
        assert_eq!(document["metadata"]["namespace"], "warren");
    }
}

#[test]
fn the_role_grants_only_what_the_backend_uses() {
    let documents = documents(&options());
    let role = find(&documents, "Role");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "create", "delete"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "create", "delete"]},
        ])
    );
    let binding = find(&documents, "RoleBinding");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "warren", "namespace": "warren"}])
    );
}

#[test]
fn the_claims_are_shared_read_write_and_take_the_storage_class_when_given() {
    let documents = documents(&DeployOptions {
        storage_class: Some("efs-sc".into()),
        ..options()
    });
    let claims: Vec<&Value> = documents
        .iter()
        .filter(|d| d["kind"] == "PersistentVolumeClaim")
        .collect();
    assert_eq!(claims[0]["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(
        claims[0]["spec"]["resources"]["requests"]["storage"],
        "100Gi"
    );
    assert_eq!(claims[1]["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(claims[2]["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    for claim in claims {
        assert_eq!(claim["spec"]["storageClassName"], "efs-sc");
    }
    let without = self::documents(&options());
    assert!(find(&without, "PersistentVolumeClaim")["spec"]
        .get("storageClassName")
        .is_none());
}

#[test]
fn the_claims_roots_put_a_sandboxs_sub_paths_where_warrens_data_layout_has_them() {
    // warren in its pod: `<workspace>/user-data/shared/<uid>/workspace` must be the USER_DATA
    // claim's `shared/<uid>/workspace`, and `<workspace>/skill-projections/<uid>` the SKILLS
    // claim's `skill-projections/<uid>`: the same directories seen from both pods.
    let documents = documents(&options());
    let deployment = find(&documents, "Deployment");
    let warren = &deployment["spec"]["template"]["spec"]["containers"][0];
    let at = |volume: &str| {
        warren["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume)
            .unwrap()["mountPath"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(at("user-data"), USER_DATA_DIR);
    assert_eq!(at("skills"), WORKSPACE_DIR);
    assert_eq!(at("data"), DATA_DIR);
    let layout = DataLayout::new(DATA_DIR).with_workspace_dir(WORKSPACE_DIR);
    for uid in ["alice", "Alice Smith <alice@example.com>"] {
        let safe = Uid::new(uid).unwrap().safe();
        assert_eq!(
            layout.user_workspace(&safe),
            std::path::Path::new(&at("user-data")).join(user_workspace_sub_path(&safe))
        );
        assert_eq!(
            layout.skill_projection(&safe),
            std::path::Path::new(&at("skills")).join(skill_projection_sub_path(&safe))
        );
    }
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    let volume = |name: &str| {
        volumes
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        volume("user-data")["persistentVolumeClaim"]["claimName"],
        "warren-user-data"
    );
    assert_eq!(
        volume("skills")["persistentVolumeClaim"]["claimName"],
        "warren-skills"
    );
    assert_eq!(
        volume("data")["persistentVolumeClaim"]["claimName"],
        "warren-state"
    );
    // With PostgreSQL the node's own directory keeps nothing that must outlive the pod.
    let documents = self::documents(&with_everything());
    let deployment = find(&documents, "Deployment");
    let data = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "data")
        .unwrap()
        .clone();
    assert!(data.get("emptyDir").is_some(), "{data}");
}

#[test]
fn warren_runs_unprivileged_with_probes_on_health_and_secrets_only_by_reference() {
    let documents = documents(&with_everything());
    let deployment = find(&documents, "Deployment");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], json!(1));
    assert_eq!(spec["strategy"]["type"], "Recreate");
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "warren");
    assert_eq!(pod["automountServiceAccountToken"], json!(true));
    assert_eq!(pod["securityContext"]["runAsNonRoot"], json!(true));
    assert!(pod["securityContext"].get("fsGroup").is_none());
    let warren = &pod["containers"][0];
    assert_eq!(
        warren["command"],
        json!([
            "/usr/local/bin/warren",
            "serve",
            "--backend",
            "kubernetes",
            "--config",
            "/etc/warren/warren.toml"
        ])
    );
    assert_eq!(
        warren["securityContext"],
        json!({"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true,
               "privileged": false, "allowPrivilegeEscalation": false,
               "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]},
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(warren[probe]["httpGet"]["path"], "/health", "{probe}");
        assert_eq!(warren[probe]["httpGet"]["port"], "http", "{probe}");
    }
    assert_eq!(warren["ports"][0]["containerPort"], json!(7878));
    let env = warren["env"].as_array().unwrap();
    let names: Vec<&str> = env.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "WARREN_TOKEN",
            "WARREN_STATE",
            "WARREN_S3_ACCESS_KEY_ID",
            "WARREN_S3_SECRET_ACCESS_KEY"
        ]
    );
    for var in env {
        assert!(var.get("value").is_none(), "{var}");
        assert!(
            var["valueFrom"]["secretKeyRef"]["name"].is_string(),
            "{var}"
        );
    }
    assert_eq!(
        env[1]["valueFrom"]["secretKeyRef"],
        json!({"name": "warren-postgres", "key": "url", "optional": false})
    );

    // The one root step: only the claims' roots, only CHOWN.
    let init = &pod["initContainers"][0];
    assert_eq!(
        init["securityContext"]["capabilities"],
        json!({"drop": ["ALL"], "add": ["CHOWN"]})
    );
    let command: Vec<String> = serde_json::from_value(init["command"].clone()).unwrap();
    assert_eq!(command[1], "__k8s-prepare");
    assert_eq!(
        serde_json::from_str::<warren_kubernetes::PrepareConfig>(&command[2]).unwrap(),
        warren_kubernetes::PrepareConfig::ClaimRoots {
            roots: vec![WORKSPACE_DIR.into(), USER_DATA_DIR.into()],
        }
    );

    let service = find(&documents, "Service");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert_eq!(service["spec"]["selector"], spec["selector"]["matchLabels"]);
}

#[test]
fn warren_toml_uses_warrens_keys_and_holds_no_secret() {
    let options = with_everything();
    let text = warren_toml(&options);
    let parsed: toml::Table = toml::from_str(&text).unwrap();
    assert_eq!(parsed["backend"].as_str(), Some("kubernetes"));
    assert_eq!(parsed["listen"].as_str(), Some("0.0.0.0:7878"));
    assert_eq!(parsed["data_dir"].as_str(), Some(DATA_DIR));
    assert_eq!(parsed["workspace_dir"].as_str(), Some(WORKSPACE_DIR));
    assert_eq!(
        parsed["kubernetes"]["image"].as_str(),
        Some("python:3.12-slim"),
        "the sandbox image is the Kubernetes backend's key"
    );
    assert!(!parsed.contains_key("image"));
    assert_eq!(parsed["snapshots"]["store"].as_str(), Some("s3"));
    let s3 = parsed["snapshots"]["s3"].as_table().unwrap();
    assert_eq!(s3["endpoint"].as_str(), Some("https://s3.example.com"));
    assert_eq!(s3["bucket"].as_str(), Some("snapshots"));
    assert_eq!(s3["region"].as_str(), Some("eu-west-1"));
    assert!(!s3.contains_key("access_key_id") && !s3.contains_key("secret_access_key"));
    assert!(
        !parsed.contains_key("state"),
        "the URL comes from WARREN_STATE"
    );
    assert!(!parsed.contains_key("token_file"));
    assert_eq!(
        parsed["cluster"]["node_id"].as_str(),
        Some(options.name.as_str()),
        "the one replica keeps its node's name from pod to pod, to adopt its sandbox pods"
    );
    // The [kubernetes] section is exactly the settings struct the binary embeds.
    let settings: KubernetesSettings = parsed["kubernetes"].clone().try_into().unwrap();
    assert_eq!(settings, options.settings());
    assert_eq!(settings.user_data_claim, "warren-user-data");
    assert_eq!(settings.skills_claim, "warren-skills");

    let plain: toml::Table =
        toml::from_str(&warren_toml(&DeployOptions::new("warren", "w:1"))).unwrap();
    assert!(
        !plain.contains_key("snapshots")
            && !plain["kubernetes"]
                .as_table()
                .unwrap()
                .contains_key("image")
    );

    // The same text is what the ConfigMap holds.
    let documents = documents(&options);
    assert_eq!(
        find(&documents, "ConfigMap")["data"]["warren.toml"],
        json!(text)
    );
}

#[test]
fn option_values_that_need_quoting_stay_one_toml_string() {
    let options = DeployOptions {
        s3: Some(S3Options {
            endpoint: "https://s3.example.com/\"quoted\"\\path\u{7f}".into(),
            bucket: "b".into(),
            region: None,
            access_key_id: SecretKey::new("s", "a"),
            secret_access_key: SecretKey::new("s", "b"),
        }),
        ..options()
    };
    let parsed: toml::Table = toml::from_str(&warren_toml(&options)).unwrap();
    assert_eq!(
        parsed["snapshots"]["s3"]["endpoint"].as_str(),
        Some("https://s3.example.com/\"quoted\"\\path\u{7f}")
    );
}

#[test]
fn options_kubernetes_would_refuse_are_refused_naming_the_option() {
    type Change = Box<dyn Fn(&mut DeployOptions)>;
    let cases: Vec<(&str, Change)> = vec![
        ("namespace", Box::new(|o| o.namespace = "Warren".into())),
        ("name", Box::new(|o| o.name = "9warren".into())),
        ("name", Box::new(|o| o.name = "w".repeat(41))),
        ("image", Box::new(|o| o.image = "has space".into())),
        (
            "warren binary",
            Box::new(|o| o.warren_binary = "warren".into()),
        ),
        ("port", Box::new(|o| o.port = 0)),
        (
            "storage class",
            Box::new(|o| o.storage_class = Some("Fast_SSD".into())),
        ),
        ("user-data size", Box::new(|o| o.user_data_bytes = 0)),
        (
            "Secret name",
            Box::new(|o| o.token.secret = "My Secret".into()),
        ),
        ("Secret key", Box::new(|o| o.token.key = "a/b".into())),
    ];
    for (what, change) in cases {
        let mut options = options();
        change(&mut options);
        match deployment_manifests(&options) {
            Err(Error::Invalid { what: found, .. }) => assert_eq!(found, what),
            other => panic!("{what}: {other:?}"),
        }
    }
}
