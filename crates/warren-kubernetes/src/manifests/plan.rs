//! What a sandbox's objects are made of: the [`PodPlan`], its mounts, peers, limits and
//! agent, and what follows from its layout (own mounts, `emptyDir`s, labels).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use warren_core::{
    LayoutName, MountSource, NetworkPolicy, RuntimeScope, SafeUid, SandboxId, Uid, Workdir,
    PERSONAL_SKILLS,
};

use crate::names::*;
use crate::prepare::{AccountsTask, PrepareConfig};

/// Which of warren's two claims a persistent mount comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Claim {
    /// USER_DATA: `<workspace>/user-data`, holding `shared/<safe_uid>/workspace`.
    UserData,
    /// SKILLS: the workspace directory, holding `skill-projections/<safe_uid>`.
    Skills,
}

impl Claim {
    /// The pod volume the claim is mounted through.
    pub fn volume(self) -> &'static str {
        match self {
            Self::UserData => VOLUME_USER_DATA,
            Self::Skills => VOLUME_SKILLS,
        }
    }
}

/// One persistent mount of the sandbox container: a directory of a claim, by subPath.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersistentMount {
    /// Where it appears in the container (absolute, normalised).
    pub target: String,
    /// Which claim it shows a directory of.
    pub claim: Claim,
    /// The directory inside the claim (relative, no `.`/`..`/empty component).
    pub sub_path: String,
    /// Whether the container may not write under it.
    pub read_only: bool,
}

impl PersistentMount {
    /// The persistent mounts of `layout` for `uid` and `workdir`, in the layout's order:
    /// ARS shows the UserWorkspace (`shared/<safe_uid>/workspace`) and the skill projection
    /// (`skill-projections/<safe_uid>`, read-only); DeerFlow the workdir inside the
    /// UserWorkspace, the projection and `agents/skills` (both read-only); E2B the workdir
    /// inside the UserWorkspace at the home, writable.
    pub fn for_layout(layout: LayoutName, uid: &SafeUid, workdir: &Workdir) -> Vec<Self> {
        let workspace = user_workspace_sub_path(uid);
        layout
            .layout()
            .mounts
            .iter()
            .map(|mount| {
                let (claim, sub_path) = match mount.source {
                    MountSource::UserWorkspace => (Claim::UserData, workspace.clone()),
                    MountSource::Workdir => (Claim::UserData, format!("{workspace}/{workdir}")),
                    MountSource::PersonalSkills => {
                        (Claim::UserData, format!("{workspace}/{PERSONAL_SKILLS}"))
                    }
                    MountSource::SkillProjection => (Claim::Skills, skill_projection_sub_path(uid)),
                    // Extra mounts are an operator's host directories: no claim holds them.
                    MountSource::Extra(_) => unreachable!("a layout holds no extra mounts"),
                };
                Self {
                    target: mount.target.to_owned(),
                    claim,
                    sub_path,
                    read_only: !mount.writable,
                }
            })
            .collect()
    }
}

/// How warren reaches the sandbox's Service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ServiceType {
    /// Inside the cluster (warren runs in it): the default.
    #[default]
    #[serde(rename = "ClusterIP")]
    ClusterIp,
    /// From outside the cluster, through a port on the nodes.
    NodePort,
}

impl ServiceType {
    /// The name Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIp => "ClusterIP",
            Self::NodePort => "NodePort",
        }
    }
}

/// Who a NetworkPolicy rule lets through: warren's pods by label, or addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Peer {
    /// Pods with these labels (warren's own, when it runs in the cluster), in the sandbox's
    /// namespace unless `namespace_labels` names namespaces by their labels.
    Pods {
        /// The pods' labels.
        pod_labels: BTreeMap<String, String>,
        /// Labels of the namespaces the pods are in; `None`: the sandbox's namespace.
        namespace_labels: Option<BTreeMap<String, String>>,
    },
    /// Addresses: a CIDR range, or one IP address (made a /32 or /128).
    IpBlock {
        /// `10.0.0.0/8`, `192.0.2.7`, `2001:db8::/64`.
        cidr: String,
    },
}

/// A peer and the TCP port on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// Who.
    pub peer: Peer,
    /// Which TCP port.
    pub port: u16,
}

/// The sandbox's resources (I23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU, in thousandths of a CPU.
    pub cpu_millis: u64,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Ephemeral storage (the writable layer, logs and the disk-backed emptyDirs), bytes.
    pub ephemeral_storage_bytes: u64,
    /// The home's `emptyDir`, bytes (unused by a layout whose home is the workdir).
    pub home_bytes: u64,
    /// `/tmp`'s `emptyDir`, bytes.
    pub tmp_bytes: u64,
}

/// warren's agent in the pod.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentPlan {
    /// warren's image: the init containers run it.
    pub image: String,
    /// What the bundle init container runs to copy the agent into `/opt/warren-agent`.
    pub bundle_command: Vec<String>,
    /// What the root init container runs; the [`PrepareConfig`] (JSON) is appended as the
    /// last argument: `[<warren>, "__k8s-prepare"]`.
    pub prepare_command: Vec<String>,
    /// The agent's command line in the sandbox container (from `/opt/warren-agent`).
    pub command: Vec<String>,
    /// The TCP port the agent listens on.
    pub port: u16,
    /// The per-sandbox key the agent authenticates warren with.
    pub key: String,
    /// The size limit of the bundle's `emptyDir`, bytes.
    pub bundle_bytes: u64,
}

impl std::fmt::Debug for AgentPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentPlan")
            .field("image", &self.image)
            .field("bundle_command", &self.bundle_command)
            .field("prepare_command", &self.prepare_command)
            .field("command", &self.command)
            .field("port", &self.port)
            .field("key", &"[redacted]")
            .field("bundle_bytes", &self.bundle_bytes)
            .finish()
    }
}

/// Everything a sandbox's objects are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    /// The warren instance (a DNS-1123 label): owner of the objects.
    pub instance: String,
    /// The namespace of the objects (and of the claims).
    pub namespace: String,
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The workspace owner; its safe form names the subPaths.
    pub uid: Uid,
    /// The runtime scope.
    pub runtime_scope: RuntimeScope,
    /// The default cwd, relative to the UserWorkspace: verified to exist by the prepare
    /// container, never created.
    pub workdir: Workdir,
    /// Which start of the sandbox this is.
    pub generation: i64,
    /// The sandbox's layout.
    pub layout: LayoutName,
    /// Where the sandbox's processes may connect.
    pub network: NetworkPolicy,
    /// The user's image.
    pub image: String,
    /// Whether its commands get the global and agent environments (part of the binding,
    /// recorded so a restarted warren adopts the pod only for an equal one).
    pub inherit_env: bool,
    /// The persistent mounts (normally [`PersistentMount::for_layout`]).
    pub mounts: Vec<PersistentMount>,
    /// The USER_DATA claim's name.
    pub user_data_claim: String,
    /// The SKILLS claim's name.
    pub skills_claim: String,
    /// Resources.
    pub limits: Limits,
    /// The agent.
    pub agent: AgentPlan,
    /// How warren reaches the pod.
    pub service_type: ServiceType,
    /// warren's egress proxy: the one place a sandbox with egress may connect to.
    pub proxy: Option<Endpoint>,
    /// Who may connect to the agent port: warren.
    pub agent_clients: Peer,
}

impl PodPlan {
    /// The name of the sandbox's Pod, Service and NetworkPolicy.
    pub fn name(&self) -> String {
        object_name(&self.instance, &self.sandbox)
    }

    /// The labels of every object of the sandbox (selectors use the last two).
    pub fn labels(&self) -> BTreeMap<String, String> {
        sandbox_labels(&self.instance, &self.sandbox)
    }

    /// What the Service and NetworkPolicy select: exactly this sandbox's pod.
    pub fn selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_INSTANCE.to_owned(), self.instance.clone()),
            (LABEL_SANDBOX.to_owned(), self.sandbox.to_string()),
        ])
    }

    /// The annotations carrying the pod's identity.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (ANNOTATION_UID.to_owned(), self.uid.to_string()),
            (ANNOTATION_SAFE_UID.to_owned(), self.uid.safe().to_string()),
            (ANNOTATION_SCOPE.to_owned(), self.runtime_scope.to_string()),
            (ANNOTATION_WORKDIR.to_owned(), self.workdir.to_string()),
            (
                ANNOTATION_GENERATION.to_owned(),
                self.generation.to_string(),
            ),
            (ANNOTATION_LAYOUT.to_owned(), self.layout.to_string()),
            (
                ANNOTATION_NETWORK.to_owned(),
                serde_json::to_string(&self.network).expect("a network policy serialises"),
            ),
            (ANNOTATION_IMAGE.to_owned(), self.image.clone()),
            (
                ANNOTATION_INHERIT_ENV.to_owned(),
                self.inherit_env.to_string(),
            ),
            (
                ANNOTATION_MOUNTS.to_owned(),
                serde_json::to_string(&self.mounts).expect("mounts serialise"),
            ),
        ])
    }

    /// What the prepare container is told: the workdir to verify, and the other
    /// directories of the UserWorkspace a mount shows (DeerFlow's `agents/skills`), which
    /// must exist too rather than be made by the kubelet as root.
    pub fn prepare_config(&self) -> PrepareConfig {
        let workspace = user_workspace_sub_path(&self.uid.safe());
        let prefix = format!("{workspace}/");
        let mut also_require: Vec<String> = Vec::new();
        for mount in &self.mounts {
            if mount.claim != Claim::UserData {
                continue;
            }
            if let Some(inside) = mount.sub_path.strip_prefix(&prefix) {
                if inside != self.workdir.as_str() && !also_require.iter().any(|d| d == inside) {
                    also_require.push(inside.to_owned());
                }
            }
        }
        PrepareConfig::Sandbox {
            root: PREPARE_ROOT.into(),
            workdir: self.workdir.to_string(),
            also_require,
            accounts: crate::accounts::needed(self.layout.layout()).then(|| AccountsTask {
                dir: PREPARE_ACCOUNTS.into(),
                layout: self.layout,
            }),
        }
    }

    /// The sandbox container's own mounts (not the persistent ones), as
    /// `(volume, target, subPath, read-only)`: `/tmp`, the read-only agent bundle, the
    /// home's `emptyDir` where the layout's home is ephemeral (I30), and warren's accounts
    /// files where the layout's user is not the image's (I7, I11). [`crate::identity`]
    /// holds a pod read back to exactly these.
    pub fn own_mounts(&self) -> Vec<(&'static str, &'static str, Option<&'static str>, bool)> {
        own_mounts(self.layout)
    }
}

/// See [`PodPlan::own_mounts`].
pub(crate) fn own_mounts(
    layout: LayoutName,
) -> Vec<(&'static str, &'static str, Option<&'static str>, bool)> {
    let layout = layout.layout();
    let mut mounts = Vec::new();
    if layout.home_is_ephemeral() {
        mounts.push((VOLUME_HOME, layout.home, None, false));
    }
    mounts.push((VOLUME_TMP, TMP, None, false));
    mounts.push((VOLUME_AGENT, AGENT_MOUNT, None, true));
    if crate::accounts::needed(layout) {
        for (file, target) in crate::accounts::FILES {
            mounts.push((VOLUME_ACCOUNTS, target, Some(file), true));
        }
    }
    mounts
}

/// The `emptyDir` volumes a pod of `layout` has: the home's only where the home is
/// ephemeral, the accounts' only where warren names the user.
pub(crate) fn empty_dirs(layout: LayoutName) -> Vec<&'static str> {
    let layout = layout.layout();
    let mut volumes = Vec::new();
    if layout.home_is_ephemeral() {
        volumes.push(VOLUME_HOME);
    }
    volumes.extend([VOLUME_TMP, VOLUME_AGENT]);
    if crate::accounts::needed(layout) {
        volumes.push(VOLUME_ACCOUNTS);
    }
    volumes
}

/// The labels of a sandbox's objects.
pub fn sandbox_labels(instance: &str, sandbox: &SandboxId) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        (LABEL_COMPONENT.to_owned(), COMPONENT_SANDBOX.to_owned()),
        (LABEL_INSTANCE.to_owned(), instance.to_owned()),
        (LABEL_SANDBOX.to_owned(), sandbox.to_string()),
    ])
}

/// A plan as the backend would make it, for tests.
#[cfg(test)]
pub(crate) fn example_plan(layout: LayoutName, network: NetworkPolicy) -> PodPlan {
    const MIB: u64 = 1024 * 1024;
    let uid = Uid::new("alice").unwrap();
    let runtime_scope = RuntimeScope::new("t").unwrap();
    let workdir = Workdir::new(match layout {
        LayoutName::Ars => "projects/a",
        LayoutName::Deerflow => "threads/t1/user-data",
        LayoutName::E2b => "e2b/s1",
    })
    .unwrap();
    let warren = Peer::Pods {
        pod_labels: BTreeMap::from([("app.kubernetes.io/name".into(), "warren".into())]),
        namespace_labels: None,
    };
    PodPlan {
        instance: "i1".into(),
        namespace: "sandboxes".into(),
        sandbox: SandboxId::derive(&uid, &runtime_scope),
        mounts: PersistentMount::for_layout(layout, &uid.safe(), &workdir),
        uid,
        runtime_scope,
        workdir,
        generation: 3,
        layout,
        network,
        image: "python:3.12-slim".into(),
        inherit_env: true,
        user_data_claim: "warren-user-data".into(),
        skills_claim: "warren-skills".into(),
        limits: Limits {
            cpu_millis: 1000,
            memory_bytes: 2048 * MIB,
            ephemeral_storage_bytes: 4096 * MIB,
            home_bytes: 256 * MIB,
            tmp_bytes: 256 * MIB,
        },
        agent: AgentPlan {
            image: "ghcr.io/example/warren:1".into(),
            bundle_command: vec!["/usr/local/bin/warren".into(), "__agent-bundle".into()],
            prepare_command: vec!["/usr/local/bin/warren".into(), "__k8s-prepare".into()],
            command: vec![
                "/opt/warren-agent/warren".into(),
                "__container-agent".into(),
            ],
            port: 7879,
            key: "k".repeat(64),
            bundle_bytes: 256 * MIB,
        },
        service_type: ServiceType::ClusterIp,
        proxy: Some(Endpoint {
            peer: warren.clone(),
            port: 3128,
        }),
        agent_clients: warren,
    }
}
