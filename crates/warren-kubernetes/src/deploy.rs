//! The manifests that run warren itself in a cluster (issue 15, "warren on Kubernetes"):
//! `warren k8s manifests` prints [`deployment_manifests`].
//!
//! ```text
//! ServiceAccount <name>              what warren's pod talks to the API server as
//! Role, RoleBinding <name>           pods, services, networkpolicies of the namespace, no more
//! PVC <name>-user-data  (RWX)        USER_DATA: mounted at <workspace>/user-data
//! PVC <name>-skills     (RWX)        SKILLS: mounted at <workspace> itself
//! PVC <name>-state      (RWO)        the SQLite state store, only without PostgreSQL
//! ConfigMap <name>-config            warren.toml (no secret in it)
//! Deployment <name>                  one replica, `warren serve --backend kubernetes`
//! Service <name>                     warren's API, ClusterIP
//! ```
//!
//! Every object is written as pretty JSON, documents separated by `---` lines: JSON is
//! YAML, so `kubectl apply -f` takes the output as it is and no YAML library is needed.
//!
//! Where the claims go, and why: a uid's UserWorkspace is
//! `<workspace>/user-data/shared/<uid>/workspace` and its projection
//! `<workspace>/skill-projections/<uid>` ([`warren_core::DataLayout`]). With USER_DATA
//! mounted at `<workspace>/user-data` and SKILLS at `<workspace>` itself, warren's own paths
//! are unchanged, and a sandbox pod's subPaths are exactly `shared/<safe_uid>/workspace`
//! (USER_DATA) and `skill-projections/<safe_uid>` (SKILLS), as the issue has them: the
//! subPath is the path beneath the claim's root. The rest of the shared trees (artifacts,
//! local snapshots, the scratch trees of ephemeral sandboxes) land on SKILLS, which every
//! replica shares as well; no sandbox pod ever mounts them. The node's own data directory
//! is apart: the SQLite store on a ReadWriteOnce claim of its own (SQLite's locking is not
//! safe on the network filesystems RWX claims use), or, with PostgreSQL, an `emptyDir`
//! (nothing in it outlives the pod that needs to: the token comes from a Secret).
//!
//! warren's container needs no privilege on Kubernetes (it runs no local runtime): it runs
//! as 1000:1000 (so what it writes is the sandbox user's, I11, without a `chown`), non-root,
//! with no capabilities, no privilege escalation, a read-only root and the runtime's default
//! seccomp profile. One init container, `claim-roots`, runs as root with `CHOWN` only, to
//! give the claims' root directories (not what is in them) to 1000:1000, since a claim is
//! usually provisioned owned by root; it is what keeps the pod at Pod Security "baseline"
//! rather than "restricted". No `fsGroup`: the kubelet would re-own every uid's files.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

use crate::manifests::{check_label, check_object_name, unprivileged, ServiceType, SANDBOX_ID};
use crate::names::{dns_label_problem, LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY};
use crate::prepare::PrepareConfig;
use crate::Error;

/// The workspace directory in warren's pod: the SKILLS claim's root.
pub const WORKSPACE_DIR: &str = "/var/lib/warren/workspace";
/// Where the USER_DATA claim's root is mounted in warren's pod.
pub const USER_DATA_DIR: &str = "/var/lib/warren/workspace/user-data";
/// The node's own data directory in warren's pod.
pub const DATA_DIR: &str = "/var/lib/warren/data";
/// Where the ConfigMap's `warren.toml` appears.
pub const CONFIG_DIR: &str = "/etc/warren";
/// The key of `warren.toml` in the ConfigMap.
pub const CONFIG_KEY: &str = "warren.toml";

/// A key of a Secret the operator creates (warren's manifests never hold a secret value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretKey {
    /// The Secret's name, in warren's namespace.
    pub secret: String,
    /// The key in it.
    pub key: String,
}

impl SecretKey {
    /// `key` of Secret `secret`.
    pub fn new(secret: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            secret: secret.into(),
            key: key.into(),
        }
    }
}

/// An S3-compatible snapshot store (`[snapshots.s3]`); the keys come from a Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Options {
    /// `https://s3.example.com`.
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// The region [default: warren's, `us-east-1`].
    pub region: Option<String>,
    /// `WARREN_S3_ACCESS_KEY_ID`.
    pub access_key_id: SecretKey,
    /// `WARREN_S3_SECRET_ACCESS_KEY`.
    pub secret_access_key: SecretKey,
}

/// What the deployment manifests are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployOptions {
    /// The namespace of warren and of its sandboxes (an existing one; it is not created).
    pub namespace: String,
    /// The prefix of every object's name [default: `warren`].
    pub name: String,
    /// warren's image (also the sandbox pods' init containers').
    pub image: String,
    /// warren's executable in its image [default: `/usr/local/bin/warren`].
    pub warren_binary: String,
    /// The port warren's API listens on [default: 7878].
    pub port: u16,
    /// The image of sandboxes that name none (`image` in warren.toml).
    pub sandbox_image: Option<String>,
    /// How warren reaches sandbox pods: ClusterIP, as it runs in the cluster.
    pub sandbox_service_type: ServiceType,
    /// The claims' storage class [default: the cluster's default].
    pub storage_class: Option<String>,
    /// Size of the USER_DATA claim, bytes [default: 100 GiB].
    pub user_data_bytes: u64,
    /// Size of the SKILLS claim, bytes [default: 20 GiB].
    pub skills_bytes: u64,
    /// Size of the SQLite state claim (without PostgreSQL), bytes [default: 5 GiB].
    pub state_bytes: u64,
    /// The provisioner token (`WARREN_TOKEN`) [default: key `token` of Secret `warren-token`].
    pub token: SecretKey,
    /// A PostgreSQL state store: its URL (with the password) as `WARREN_STATE`.
    pub postgres: Option<SecretKey>,
    /// An S3-compatible snapshot store.
    pub s3: Option<S3Options>,
}

const GIB: u64 = 1024 * 1024 * 1024;

/// The port of warren's egress proxy for sandbox pods (its Service's `egress` port).
pub const EGRESS_PORT: u16 = 3128;

impl DeployOptions {
    /// The defaults for warren's image `image` in `namespace`.
    pub fn new(namespace: impl Into<String>, image: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: "warren".to_owned(),
            image: image.into(),
            warren_binary: "/usr/local/bin/warren".to_owned(),
            port: 7878,
            sandbox_image: None,
            sandbox_service_type: ServiceType::ClusterIp,
            storage_class: None,
            user_data_bytes: 100 * GIB,
            skills_bytes: 20 * GIB,
            state_bytes: 5 * GIB,
            token: SecretKey::new("warren-token", "token"),
            postgres: None,
            s3: None,
        }
    }

    /// The names of the objects.
    fn named(&self, suffix: &str) -> String {
        if suffix.is_empty() {
            self.name.clone()
        } else {
            format!("{}-{suffix}", self.name)
        }
    }

    /// The labels of warren's pods, which its Deployment and Service select and sandbox
    /// NetworkPolicies name as the peer allowed to reach their agents.
    pub fn warren_pod_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "warren".to_owned()),
            ("app.kubernetes.io/instance".to_owned(), self.name.clone()),
        ])
    }

    /// The `[kubernetes]` section of warren.toml these manifests write.
    pub fn settings(&self) -> KubernetesSettings {
        KubernetesSettings {
            namespace: self.namespace.clone(),
            warren_image: self.image.clone(),
            image: self.sandbox_image.clone(),
            user_data_claim: self.named("user-data"),
            skills_claim: self.named("skills"),
            service_type: self.sandbox_service_type,
            warren_pod_labels: self.warren_pod_labels(),
            instance: self.name.clone(),
            api_url: None,
            kubeconfig: None,
            agent_port: default_agent_port(),
            agent_clients_cidr: None,
            ready_timeout_s: default_ready_timeout(),
            warren_binary: self.warren_binary.clone(),
            proxy_port: Some(EGRESS_PORT),
            // warren's Service, as sandbox pods resolve it in the namespace.
            proxy_host: Some(format!("{}.{}.svc", self.named(""), self.namespace)),
        }
    }

    /// Refuses options that would make objects Kubernetes rejects, naming the option.
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(reason) = dns_label_problem(&self.namespace) {
            return Err(Error::invalid("namespace", &self.namespace, reason));
        }
        // The longest name is `<name>-user-data`; a Service name starts with a letter.
        if let Some(reason) = dns_label_problem(&self.name) {
            return Err(Error::invalid("name", &self.name, reason));
        }
        if self.name.len() > 40 || !self.name.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(Error::invalid(
                "name",
                &self.name,
                "it must start with a letter and be at most 40 characters",
            ));
        }
        for (what, value) in [
            ("image", Some(&self.image)),
            ("warren binary", Some(&self.warren_binary)),
            ("sandbox image", self.sandbox_image.as_ref()),
        ] {
            if let Some(value) = value {
                if value.is_empty() || value.chars().any(|c| c.is_control() || c.is_whitespace()) {
                    return Err(Error::invalid(
                        what,
                        value,
                        "empty, or blanks or control characters",
                    ));
                }
            }
        }
        if !self.warren_binary.starts_with('/') {
            return Err(Error::invalid(
                "warren binary",
                &self.warren_binary,
                "it must be absolute",
            ));
        }
        if self.port == 0 {
            return Err(Error::invalid("port", "0", "a port is 1 to 65535"));
        }
        if let Some(class) = &self.storage_class {
            check_object_name("storage class", class)?;
        }
        for (what, bytes) in [
            ("user-data size", self.user_data_bytes),
            ("skills size", self.skills_bytes),
            ("state size", self.state_bytes),
        ] {
            if bytes == 0 {
                return Err(Error::invalid(what, "0", "it must be more than zero"));
            }
        }
        let mut secrets = vec![&self.token];
        secrets.extend(&self.postgres);
        if let Some(s3) = &self.s3 {
            secrets.extend([&s3.access_key_id, &s3.secret_access_key]);
            for (what, value) in [
                ("S3 endpoint", Some(&s3.endpoint)),
                ("S3 bucket", Some(&s3.bucket)),
                ("S3 region", s3.region.as_ref()),
            ] {
                if let Some(value) = value {
                    if value.is_empty() || value.chars().any(char::is_control) {
                        return Err(Error::invalid(what, value, "empty, or control characters"));
                    }
                }
            }
        }
        for secret in secrets {
            check_object_name("Secret name", &secret.secret)?;
            let key_ok = !secret.key.is_empty()
                && secret.key.len() <= 253
                && secret
                    .key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !key_ok {
                return Err(Error::invalid(
                    "Secret key",
                    &secret.key,
                    "only [-._a-zA-Z0-9]",
                ));
            }
        }
        for (key, value) in self.warren_pod_labels() {
            check_label(&key, &value)?;
        }
        Ok(())
    }
}

/// The `[kubernetes]` section of warren.toml: what the backend needs to know of the cluster
/// that the manifests decided. The binary's configuration embeds it as it is, so the keys
/// written here and the keys read there are one list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSettings {
    /// The namespace of sandbox pods (warren's own).
    pub namespace: String,
    /// warren's image, which the sandbox pods' init containers run.
    pub warren_image: String,
    /// The image of sandbox pods that name none (`kubernetes.image`; warren's settings
    /// read it, with `image` as its shorthand when Kubernetes is the default backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The USER_DATA claim.
    pub user_data_claim: String,
    /// The SKILLS claim.
    pub skills_claim: String,
    /// How warren reaches sandbox pods.
    pub service_type: ServiceType,
    /// The labels of warren's pods: the peer sandbox NetworkPolicies let reach their agents
    /// and whose proxy they let sandboxes with egress reach.
    pub warren_pod_labels: BTreeMap<String, String>,
    /// This warren's name on its objects: every replica of one deployment shares it, and
    /// two deployments in one namespace must differ [default: `warren`].
    #[serde(default = "default_instance")]
    pub instance: String,
    /// The API server; by default the pod's service account (in a cluster), else the
    /// kubeconfig (`KUBECONFIG`, `~/.kube/config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// A kubeconfig file to reach the cluster with (its current context), instead of the
    /// service account or `KUBECONFIG`; not with `api_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The agent's TCP port in sandbox pods [default: 7070].
    #[serde(default = "default_agent_port")]
    pub agent_port: u16,
    /// Where warren connects to agents from when it runs outside the cluster (a CIDR of
    /// its addresses); by default warren's pods (`warren_pod_labels`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_clients_cidr: Option<String>,
    /// How long a sandbox pod may take to be ready, seconds [default: 180].
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_s: u64,
    /// warren's executable in its image [default: `/usr/local/bin/warren`].
    #[serde(default = "default_warren_binary")]
    pub warren_binary: String,
    /// The port warren serves its egress proxy to pods on (every address; 0: any free
    /// one); without it, sandboxes here may only have network `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_port: Option<u16>,
    /// The host pods dial that proxy at (warren's Service name in the cluster), or `node`
    /// for the address of the pod's node (warren on the nodes' network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_host: Option<String>,
}

fn default_instance() -> String {
    "warren".to_owned()
}

fn default_agent_port() -> u16 {
    7070
}

fn default_ready_timeout() -> u64 {
    180
}

fn default_warren_binary() -> String {
    "/usr/local/bin/warren".to_owned()
}

/// Every manifest to run warren in `options.namespace`, as one multi-document stream.
pub fn deployment_manifests(options: &DeployOptions) -> Result<String, Error> {
    options.validate()?;
    let objects: Vec<serde_json::Value> = deployment_objects(options)
        .into_iter()
        .map(|object| object.expect("k8s-openapi objects serialise"))
        .collect();
    let mut out = String::from(
        "# warren on Kubernetes, generated by `warren k8s manifests`: JSON documents (JSON is\n\
         # YAML), for `kubectl apply -f`. Create the Secrets they name first.\n",
    );
    for (index, object) in objects.iter().enumerate() {
        if index > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_json::to_string_pretty(object).expect("JSON values serialise"));
        out.push('\n');
    }
    Ok(out)
}

fn deployment_objects(options: &DeployOptions) -> Vec<serde_json::Result<serde_json::Value>> {
    let mut objects = vec![
        serde_json::to_value(service_account(options)),
        serde_json::to_value(role(options)),
        serde_json::to_value(role_binding(options)),
        serde_json::to_value(claim(
            options,
            "user-data",
            "ReadWriteMany",
            options.user_data_bytes,
        )),
        serde_json::to_value(claim(
            options,
            "skills",
            "ReadWriteMany",
            options.skills_bytes,
        )),
    ];
    if options.postgres.is_none() {
        objects.push(serde_json::to_value(claim(
            options,
            "state",
            "ReadWriteOnce",
            options.state_bytes,
        )));
    }
    objects.extend([
        serde_json::to_value(config_map(options)),
        serde_json::to_value(deployment(options)),
        serde_json::to_value(service(options)),
    ]);
    objects
}

fn labels(options: &DeployOptions, component: &str) -> BTreeMap<String, String> {
    let mut labels = options.warren_pod_labels();
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    labels.insert(LABEL_COMPONENT.to_owned(), component.to_owned());
    labels
}

fn meta(options: &DeployOptions, suffix: &str, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(options.named(suffix)),
        namespace: Some(options.namespace.clone()),
        labels: Some(labels(options, component)),
        ..ObjectMeta::default()
    }
}

fn service_account(options: &DeployOptions) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(options, "", "server"),
        ..ServiceAccount::default()
    }
}

fn strings(values: &[&str]) -> Option<Vec<String>> {
    Some(values.iter().map(|v| (*v).to_owned()).collect())
}

/// Only what the Kubernetes backend does, in warren's namespace:
fn role(options: &DeployOptions) -> Role {
    Role {
        metadata: meta(options, "", "server"),
        rules: Some(vec![
            // Pods: `create` starts a sandbox's runtime, `delete` ends it (and removes what
            // `discover` refuses), `get` reads one back for adoption, `list` is `discover`'s
            // listing by label and the start of every watch, and `watch` is readiness (no
            // polling loop) and the pod's reason when it cannot start.
            PolicyRule {
                api_groups: strings(&[""]),
                resources: strings(&["pods"]),
                verbs: strings(&["get", "list", "watch", "create", "delete"]).expect("verbs"),
                ..PolicyRule::default()
            },
            // Services: made and deleted with their pod, read back for their address (a
            // NodePort's port), listed by `discover` to remove orphans. Nothing waits on a
            // Service, so no `watch`.
            PolicyRule {
                api_groups: strings(&[""]),
                resources: strings(&["services"]),
                verbs: strings(&["get", "list", "create", "delete"]).expect("verbs"),
                ..PolicyRule::default()
            },
            // NetworkPolicies: the same life as the Service. No `patch`/`update` anywhere:
            // a sandbox's objects never change; a new generation is new objects.
            PolicyRule {
                api_groups: strings(&["networking.k8s.io"]),
                resources: strings(&["networkpolicies"]),
                verbs: strings(&["get", "list", "create", "delete"]).expect("verbs"),
                ..PolicyRule::default()
            },
            // No pods/log, pods/exec or secrets: commands, output and files go through
            // warren's own agent, and the agent key travels in the pod's spec.
        ]),
    }
}

fn role_binding(options: &DeployOptions) -> RoleBinding {
    RoleBinding {
        metadata: meta(options, "", "server"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: options.named(""),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: options.named(""),
            namespace: Some(options.namespace.clone()),
            api_group: None,
        }]),
    }
}

/// A size as a Kubernetes quantity, in the largest binary unit that divides it.
fn bytes_quantity(bytes: u64) -> Quantity {
    for (unit, size) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if bytes.is_multiple_of(size) {
            return Quantity(format!("{}{unit}", bytes / size));
        }
    }
    Quantity(bytes.to_string())
}

fn claim(options: &DeployOptions, suffix: &str, mode: &str, bytes: u64) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(options, suffix, "storage"),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: strings(&[mode]),
            storage_class_name: options.storage_class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    bytes_quantity(bytes),
                )])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// A TOML basic string (JSON's escapes are TOML's, but for DEL, which TOML wants escaped).
fn toml_string(value: &str) -> String {
    serde_json::to_string(value)
        .expect("strings serialise")
        .replace('\u{7f}', "\\u007F")
}

/// warren.toml. No secret is ever in it: they come from Secrets through `WARREN_*`
/// variables, which win over the file.
pub fn warren_toml(options: &DeployOptions) -> String {
    let mut toml = String::from(
        "# warren.toml for warren on Kubernetes (`warren k8s manifests`). No secret is in this\n\
         # file: the token (WARREN_TOKEN), the PostgreSQL URL (WARREN_STATE) and the S3 keys\n\
         # (WARREN_S3_*) come from Secrets through the environment, which wins over it.\n",
    );
    let line = |toml: &mut String, key: &str, value: &str| {
        toml.push_str(&format!("{key} = {}\n", toml_string(value)));
    };
    line(&mut toml, "backend", "kubernetes");
    line(&mut toml, "listen", &format!("0.0.0.0:{}", options.port));
    line(&mut toml, "data_dir", DATA_DIR);
    line(&mut toml, "workspace_dir", WORKSPACE_DIR);
    let settings = options.settings();
    toml.push_str("\n[kubernetes]\n");
    line(&mut toml, "namespace", &settings.namespace);
    line(&mut toml, "warren_image", &settings.warren_image);
    if let Some(image) = &settings.image {
        line(&mut toml, "image", image);
    }
    line(&mut toml, "user_data_claim", &settings.user_data_claim);
    line(&mut toml, "skills_claim", &settings.skills_claim);
    line(&mut toml, "service_type", settings.service_type.as_str());
    line(&mut toml, "instance", &settings.instance);
    toml.push_str(&format!("agent_port = {}\n", settings.agent_port));
    toml.push_str(&format!("ready_timeout_s = {}\n", settings.ready_timeout_s));
    line(&mut toml, "warren_binary", &settings.warren_binary);
    if let Some(port) = settings.proxy_port {
        toml.push_str(&format!("proxy_port = {port}\n"));
    }
    if let Some(host) = &settings.proxy_host {
        line(&mut toml, "proxy_host", host);
    }
    toml.push_str("\n[kubernetes.warren_pod_labels]\n");
    for (key, value) in &settings.warren_pod_labels {
        line(&mut toml, &toml_string(key), value);
    }
    // One replica, replaced with its pod (a drain, an upgrade): the node keeps its name, so
    // the next pod adopts the sandbox pods as its own rather than as a lost node's, which
    // it would destroy at start-up and restart from their snapshots (the default is the
    // host name, the pod's).
    toml.push_str("\n[cluster]\n");
    line(&mut toml, "node_id", &options.name);
    if options.postgres.is_some() {
        toml.push_str(
            "\n# [state] url: from WARREN_STATE (a Secret), since the URL holds a password.\n",
        );
    }
    if let Some(s3) = &options.s3 {
        toml.push_str("\n[snapshots]\n");
        line(&mut toml, "store", "s3");
        toml.push_str("\n[snapshots.s3]\n");
        line(&mut toml, "endpoint", &s3.endpoint);
        line(&mut toml, "bucket", &s3.bucket);
        if let Some(region) = &s3.region {
            line(&mut toml, "region", region);
        }
    }
    toml
}

fn config_map(options: &DeployOptions) -> ConfigMap {
    ConfigMap {
        metadata: meta(options, "config", "server"),
        data: Some(BTreeMap::from([(
            CONFIG_KEY.to_owned(),
            warren_toml(options),
        )])),
        ..ConfigMap::default()
    }
}

fn secret_env(name: &str, secret: &SecretKey) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.secret.clone(),
                key: secret.key.clone(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn volume_mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn claim_volume(name: &str, claim: String) -> Volume {
    Volume {
        name: name.to_owned(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim,
            read_only: None,
        }),
        ..Volume::default()
    }
}

fn empty_dir(name: &str, bytes: u64) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(bytes_quantity(bytes)),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn health_probe(period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/health".to_owned()),
            port: IntOrString::String("http".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    }
}

fn deployment(options: &DeployOptions) -> Deployment {
    let pod_labels = options.warren_pod_labels();
    let mut template_labels = labels(options, "server");
    template_labels.extend(pod_labels.clone());

    let mut mounts = vec![
        volume_mount("config", CONFIG_DIR, true),
        volume_mount("skills", WORKSPACE_DIR, false),
        volume_mount("user-data", USER_DATA_DIR, false),
        volume_mount("data", DATA_DIR, false),
        volume_mount("tmp", "/tmp", false),
    ];
    let mut volumes = vec![
        Volume {
            name: "config".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: options.named("config"),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        claim_volume("skills", options.named("skills")),
        claim_volume("user-data", options.named("user-data")),
        empty_dir("tmp", GIB),
    ];
    // The claims' roots the init container gives to 1000:1000 (the state claim's too).
    let mut roots = vec![WORKSPACE_DIR.into(), USER_DATA_DIR.into()];
    if options.postgres.is_some() {
        volumes.push(empty_dir("data", GIB));
    } else {
        volumes.push(claim_volume("data", options.named("state")));
        roots.push(DATA_DIR.into());
    }

    let mut env = vec![secret_env("WARREN_TOKEN", &options.token)];
    if let Some(postgres) = &options.postgres {
        env.push(secret_env("WARREN_STATE", postgres));
    }
    if let Some(s3) = &options.s3 {
        env.push(secret_env("WARREN_S3_ACCESS_KEY_ID", &s3.access_key_id));
        env.push(secret_env(
            "WARREN_S3_SECRET_ACCESS_KEY",
            &s3.secret_access_key,
        ));
    }

    let claim_mounts: Vec<VolumeMount> = mounts
        .iter()
        .filter(|m| {
            matches!(m.name.as_str(), "skills" | "user-data")
                || (m.name == "data" && options.postgres.is_none())
        })
        .cloned()
        .collect();
    let prepare = serde_json::to_string(&PrepareConfig::ClaimRoots { roots })
        .expect("a prepare configuration serialises");
    let claim_roots = Container {
        name: "claim-roots".to_owned(),
        image: Some(options.image.clone()),
        command: Some(vec![
            options.warren_binary.clone(),
            "__k8s-prepare".to_owned(),
            prepare,
        ]),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_group: Some(0),
            run_as_non_root: Some(false),
            capabilities: Some(Capabilities {
                drop: strings(&["ALL"]),
                add: strings(&["CHOWN"]),
            }),
            ..unprivileged()
        }),
        volume_mounts: Some(claim_mounts),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("10m".to_owned())),
                ("memory".to_owned(), Quantity("32Mi".to_owned())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity("64Mi".to_owned()),
            )])),
            ..ResourceRequirements::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };

    mounts.sort_by(|a, b| a.mount_path.cmp(&b.mount_path));
    let warren = Container {
        name: "warren".to_owned(),
        image: Some(options.image.clone()),
        command: Some(vec![
            options.warren_binary.clone(),
            "serve".to_owned(),
            "--backend".to_owned(),
            "kubernetes".to_owned(),
            "--config".to_owned(),
            format!("{CONFIG_DIR}/{CONFIG_KEY}"),
        ]),
        env: Some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some("http".to_owned()),
                container_port: i32::from(options.port),
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            },
            // The egress proxy sandbox pods with network `open`/`allowlist` dial.
            ContainerPort {
                name: Some("egress".to_owned()),
                container_port: i32::from(EGRESS_PORT),
                protocol: Some("TCP".to_owned()),
                ..ContainerPort::default()
            },
        ]),
        // Start-up may run migrations and reconcile every sandbox: up to five minutes
        // before the liveness probe takes over.
        startup_probe: Some(health_probe(5, 60)),
        readiness_probe: Some(health_probe(5, 3)),
        liveness_probe: Some(health_probe(10, 6)),
        security_context: Some(unprivileged()),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("250m".to_owned())),
                ("memory".to_owned(), Quantity("256Mi".to_owned())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity("2Gi".to_owned()),
            )])),
            ..ResourceRequirements::default()
        }),
        volume_mounts: Some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };

    Deployment {
        metadata: meta(options, "", "server"),
        spec: DeploymentSpec {
            // One server: the SQLite store (or the PostgreSQL server lock) admits one, and
            // Recreate stops the old pod before the new one takes the claims.
            replicas: Some(1),
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".to_owned()),
                rolling_update: None,
            }),
            selector: LabelSelector {
                match_labels: Some(pod_labels),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(template_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(options.named("")),
                    // warren talks to the API server as its service account.
                    automount_service_account_token: Some(true),
                    enable_service_links: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_user: Some(SANDBOX_ID),
                        run_as_group: Some(SANDBOX_ID),
                        run_as_non_root: Some(true),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_owned(),
                            localhost_profile: None,
                        }),
                        ..PodSecurityContext::default()
                    }),
                    init_containers: Some(vec![claim_roots]),
                    containers: vec![warren],
                    volumes: Some(volumes),
                    termination_grace_period_seconds: Some(60),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    }
}

fn service(options: &DeployOptions) -> Service {
    Service {
        metadata: meta(options, "", "server"),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            selector: Some(options.warren_pod_labels()),
            ports: Some(vec![
                ServicePort {
                    name: Some("http".to_owned()),
                    port: i32::from(options.port),
                    target_port: Some(IntOrString::String("http".to_owned())),
                    protocol: Some("TCP".to_owned()),
                    ..ServicePort::default()
                },
                ServicePort {
                    name: Some("egress".to_owned()),
                    port: i32::from(EGRESS_PORT),
                    target_port: Some(IntOrString::String("egress".to_owned())),
                    protocol: Some("TCP".to_owned()),
                    ..ServicePort::default()
                },
            ]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}
