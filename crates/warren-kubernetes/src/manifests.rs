//! A sandbox's objects: one Pod, one Service and one NetworkPolicy, built from a plain
//! [`PodPlan`] (issue 15, "The Kubernetes backend").
//!
//! The Pod is what a Docker container is on the Docker backend (I16, I18):
//!
//! ```text
//! init  prepare       warren's image, root with CHOWN + DAC_OVERRIDE + FOWNER only: the uid's
//!                     subtree of USER_DATA (shared/<safe_uid>) at /warren/user-data; the
//!                     one-time 1000:1000 migration (which also strips world-write and
//!                     setuid/setgid bits), workspace/ made, the workdir verified
//!                     (crate::prepare);
//!                     E2B: also the `accounts` emptyDir at /warren/accounts, written into
//! init  agent-bundle  warren's image, 1000:1000: copies the agent into the `agent` emptyDir
//! main  sandbox       the user's image, 1000:1000, read-only root, no capabilities, the agent
//!                     from /opt/warren-agent (read-only) listening on the agent port;
//!                     the home (/home/gem) and /tmp size-limited emptyDirs; exactly the
//!                     layout's persistent mounts, by subPath of the two claims
//! ```
//!
//! The E2B layout (I7) has no home emptyDir: its home `/home/user` *is* the workdir's subPath
//! mount, writable; and its user `user` is named by warren's `/etc/passwd` and `/etc/group`,
//! each a read-only subPath of the `accounts` emptyDir ([`crate::accounts`]).
//!
//! No `fsGroup`: the kubelet would re-own the claims' files recursively for it, every uid's
//! at once. Ownership is the prepare container's job, for one uid's subtree only. The
//! per-sandbox agent key is the main container's environment (`WARREN_AGENT_KEY`), which
//! the agent reads and scrubs before anything of the sandbox runs; no service account
//! token is mounted, so nothing in the pod can read the pod's spec back.
//!
//! Labels (instance, sandbox) are what the Service and the NetworkPolicy select and what
//! `discover` lists; the identity proper is in annotations ([`crate::names`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
    TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy as K8sNetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule,
    NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use warren_core::{
    LayoutName, MountSource, NetworkPolicy, RuntimeScope, SafeUid, SandboxId, Uid, Workdir,
    PERSONAL_SKILLS,
};

use crate::names::{self, *};
use crate::prepare::{AccountsTask, PrepareConfig};
use crate::Error;

/// The sandbox user and group (I11).
pub const SANDBOX_ID: i64 = 1000;

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

/// A sandbox's three objects.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxObjects {
    /// The pod.
    pub pod: Pod,
    /// The Service warren reaches the agent through.
    pub service: Service,
    /// The NetworkPolicy selecting exactly the pod.
    pub network_policy: K8sNetworkPolicy,
}

/// Builds a sandbox's Pod, Service and NetworkPolicy, refusing a plan Kubernetes would
/// refuse or warren must not run (names, mounts, limits, egress without a proxy).
pub fn build(plan: &PodPlan) -> Result<SandboxObjects, Error> {
    check(plan)?;
    Ok(SandboxObjects {
        pod: pod(plan),
        service: service(plan),
        network_policy: network_policy(plan)?,
    })
}

fn check(plan: &PodPlan) -> Result<(), Error> {
    check_instance(&plan.instance)?;
    if let Some(reason) = names::dns_label_problem(&plan.namespace) {
        return Err(Error::invalid("namespace", &plan.namespace, reason));
    }
    for claim in [&plan.user_data_claim, &plan.skills_claim] {
        check_object_name("claim name", claim)?;
    }
    for (what, value) in [("image", &plan.image), ("agent image", &plan.agent.image)] {
        if value.trim().is_empty() || value.trim() != value {
            return Err(Error::invalid(
                what,
                value,
                "it is empty or has surrounding blanks",
            ));
        }
    }
    for (what, command) in [
        ("agent command", &plan.agent.command),
        ("bundle command", &plan.agent.bundle_command),
        ("prepare command", &plan.agent.prepare_command),
    ] {
        if command.is_empty() {
            return Err(Error::invalid(what, "", "it is empty"));
        }
    }
    if plan.agent.port == 0 {
        return Err(Error::invalid("agent port", "0", "a port is 1 to 65535"));
    }
    if plan.agent.key.is_empty() {
        return Err(Error::invalid("agent key", "", "it is empty"));
    }
    let limits = &plan.limits;
    for (what, value) in [
        ("cpu limit", limits.cpu_millis),
        ("memory limit", limits.memory_bytes),
        ("ephemeral storage limit", limits.ephemeral_storage_bytes),
        ("home size", limits.home_bytes),
        ("/tmp size", limits.tmp_bytes),
        ("agent bundle size", plan.agent.bundle_bytes),
    ] {
        if value == 0 {
            return Err(Error::invalid(what, "0", "it must be more than zero"));
        }
    }
    check_mounts(plan.layout, &plan.mounts)?;
    if let Some(proxy) = &plan.proxy {
        check_peer(&proxy.peer)?;
        if proxy.port == 0 {
            return Err(Error::invalid("proxy port", "0", "a port is 1 to 65535"));
        }
    }
    check_peer(&plan.agent_clients)
}

/// A DNS-1123 subdomain of at most 63 characters (claims, Secrets, ConfigMaps).
pub(crate) fn check_object_name(what: &'static str, name: &str) -> Result<(), Error> {
    let problem = if name.len() > 253 {
        Some("it is longer than 253 characters")
    } else {
        name.split('.').find_map(names::dns_label_problem)
    };
    match problem {
        Some(reason) => Err(Error::invalid(what, name, reason)),
        None => Ok(()),
    }
}

fn check_mounts(layout: LayoutName, mounts: &[PersistentMount]) -> Result<(), Error> {
    // Targets warren's own mounts take: the ephemeral home's (always `/home/gem`, even in
    // a layout whose home is elsewhere, so no pod ever shows a stale legacy home), `/tmp`,
    // the bundle and, where warren names the user, `/etc/passwd` and `/etc/group`.
    let mut reserved: Vec<&str> = own_mounts(layout).iter().map(|m| m.1).collect();
    reserved.push(HOME);
    let home = layout.layout();
    if !home.home_is_ephemeral()
        && !mounts
            .iter()
            .any(|m| m.target == home.home && m.claim == Claim::UserData && !m.read_only)
    {
        // E2B's home is the workdir's writable mount (I7): without it there is no home.
        return Err(Error::invalid(
            "mount target",
            home.home,
            "the layout's home is the workdir, which no writable mount shows there",
        ));
    }
    for mount in mounts {
        let target = &mount.target;
        let relative = target
            .strip_prefix('/')
            .ok_or_else(|| Error::invalid("mount target", target, "it must be absolute"))?;
        if let Some(reason) = path_problem(relative) {
            return Err(Error::invalid("mount target", target, reason));
        }
        if reserved.contains(&target.as_str()) || within(target, AGENT_MOUNT) {
            return Err(Error::invalid(
                "mount target",
                target,
                "warren's own mounts are there",
            ));
        }
        if let Some(reason) = path_problem(&mount.sub_path) {
            return Err(Error::invalid("subPath", &mount.sub_path, reason));
        }
        if let Some(other) = mounts
            .iter()
            .find(|other| other.target != *target && within(target, &other.target))
        {
            return Err(Error::invalid(
                "mount target",
                target,
                format!("it lies inside the mount at {}", other.target),
            ));
        }
        if mounts
            .iter()
            .filter(|other| other.target == *target)
            .count()
            > 1
        {
            return Err(Error::invalid(
                "mount target",
                target,
                "it is mounted twice",
            ));
        }
    }
    Ok(())
}

/// Whether `path` lies strictly inside `dir`.
pub(crate) fn within(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Why a relative path is unusable as a subPath or (less its `/`) a mount target.
pub(crate) fn path_problem(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("it is empty");
    }
    if path.starts_with('/') {
        return Some("it must be relative");
    }
    path.split('/').find_map(|component| match component {
        "" => Some("it has an empty component"),
        "." | ".." => Some("it has a '.' or '..' component"),
        c if c.contains('\0') => Some("it contains a NUL byte"),
        _ => None,
    })
}

fn check_peer(peer: &Peer) -> Result<(), Error> {
    match peer {
        Peer::Pods {
            pod_labels,
            namespace_labels,
        } => {
            for labels in std::iter::once(pod_labels).chain(namespace_labels) {
                for (key, value) in labels {
                    check_label(key, value)?;
                }
            }
            Ok(())
        }
        Peer::IpBlock { cidr } => cidr_of(cidr).map(|_| ()),
    }
}

/// A label key and value Kubernetes accepts.
pub(crate) fn check_label(key: &str, value: &str) -> Result<(), Error> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_object_name("label key prefix", prefix)?;
    }
    let name_ok = |s: &str, empty_ok: bool| {
        (empty_ok && s.is_empty())
            || (s.len() <= 63
                && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')))
    };
    if !name_ok(name, false) {
        return Err(Error::invalid("label key", key, "not a qualified name"));
    }
    if !name_ok(value, true) {
        return Err(Error::invalid(
            "label value",
            value,
            "at most 63 of [A-Za-z0-9._-], starting and ending with a letter or digit",
        ));
    }
    Ok(())
}

/// A CIDR range as Kubernetes wants it: an address is made a /32 or /128.
fn cidr_of(value: &str) -> Result<String, Error> {
    let bad = |reason: &str| Error::invalid("CIDR", value, reason);
    match value.split_once('/') {
        None => {
            let address: IpAddr = value.parse().map_err(|_| bad("not an IP address"))?;
            Ok(format!(
                "{address}/{}",
                if address.is_ipv4() { 32 } else { 128 }
            ))
        }
        Some((address, prefix)) => {
            let address: IpAddr = address.parse().map_err(|_| bad("not an IP address"))?;
            let prefix: u8 = prefix.parse().map_err(|_| bad("not a prefix length"))?;
            if prefix > if address.is_ipv4() { 32 } else { 128 } {
                return Err(bad("the prefix is longer than the address"));
            }
            Ok(format!("{address}/{prefix}"))
        }
    }
}

fn quantity(value: u64) -> Quantity {
    Quantity(value.to_string())
}

fn meta(plan: &PodPlan) -> ObjectMeta {
    ObjectMeta {
        name: Some(plan.name()),
        namespace: Some(plan.namespace.clone()),
        labels: Some(plan.labels()),
        ..ObjectMeta::default()
    }
}

fn resources(limits: &Limits) -> ResourceRequirements {
    // Requests equal limits: a sandbox gets what it is promised (the Guaranteed class),
    // and the scheduler never places more sandboxes on a node than it holds.
    let amounts = BTreeMap::from([
        (
            "cpu".to_owned(),
            Quantity(format!("{}m", limits.cpu_millis)),
        ),
        ("memory".to_owned(), quantity(limits.memory_bytes)),
        (
            "ephemeral-storage".to_owned(),
            quantity(limits.ephemeral_storage_bytes),
        ),
    ]);
    ResourceRequirements {
        limits: Some(amounts.clone()),
        requests: Some(amounts),
        ..ResourceRequirements::default()
    }
}

/// The security context of a container running as the sandbox user.
pub(crate) fn unprivileged() -> SecurityContext {
    SecurityContext {
        run_as_user: Some(SANDBOX_ID),
        run_as_group: Some(SANDBOX_ID),
        run_as_non_root: Some(true),
        privileged: Some(false),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        seccomp_profile: Some(runtime_default()),
        ..SecurityContext::default()
    }
}

/// The capabilities the sandbox pod's prepare container keeps: `CHOWN` to give the uid's
/// subtree to the sandbox user, `DAC_OVERRIDE` to read and write directories the sandbox
/// user owns with mode 0700, and `FOWNER` to take world-write and setuid/setgid bits off
/// entries the migration has just given to the sandbox user (`chmod` of a file root does
/// not own; warren-fs's `ownership` walk, [`mod@crate::prepare`]). Nothing else: no
/// `FSETID`, no `SETUID`/`SETGID`, no `SYS_ADMIN`. [`crate::identity`] refuses a prepare
/// container adding anything outside this set, and accepts a subset of it (a pod built by
/// an earlier warren, with `CHOWN` and `DAC_OVERRIDE` only). warren's own pod's
/// `claim-roots` step ([`crate::deploy`]) only chowns the claims' roots and keeps `CHOWN`
/// alone.
pub const PREPARE_CAPABILITIES: [&str; 3] = ["CHOWN", "DAC_OVERRIDE", "FOWNER"];

fn prepare_security() -> SecurityContext {
    SecurityContext {
        run_as_user: Some(0),
        run_as_group: Some(0),
        run_as_non_root: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: Some(PREPARE_CAPABILITIES.map(str::to_owned).to_vec()),
        }),
        ..unprivileged()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        localhost_profile: None,
    }
}

fn mount(volume: &str, target: &str, sub_path: Option<&str>, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.to_owned(),
        mount_path: target.to_owned(),
        sub_path: sub_path.map(str::to_owned),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn empty_dir(name: &str, bytes: u64) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(quantity(bytes)),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn claim_volume(name: &str, claim: &str, read_only: bool) -> Volume {
    Volume {
        name: name.to_owned(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_owned(),
            read_only: read_only.then_some(true),
        }),
        ..Volume::default()
    }
}

fn pod(plan: &PodPlan) -> Pod {
    let resources = resources(&plan.limits);
    // The prepare container sees the uid's subtree, and the accounts emptyDir it writes
    // where the layout needs warren's accounts (never the sandbox container's other mounts).
    let mut prepare_mounts = vec![mount(
        VOLUME_USER_DATA,
        PREPARE_ROOT,
        Some(&user_data_subtree(&plan.uid.safe())),
        false,
    )];
    if crate::accounts::needed(plan.layout.layout()) {
        prepare_mounts.push(mount(VOLUME_ACCOUNTS, PREPARE_ACCOUNTS, None, false));
    }
    let prepare_arg =
        serde_json::to_string(&plan.prepare_config()).expect("a prepare configuration serialises");
    let prepare = Container {
        name: CONTAINER_PREPARE.to_owned(),
        image: Some(plan.agent.image.clone()),
        command: Some(
            plan.agent
                .prepare_command
                .iter()
                .cloned()
                .chain([prepare_arg])
                .collect(),
        ),
        security_context: Some(prepare_security()),
        resources: Some(resources.clone()),
        volume_mounts: Some(prepare_mounts),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };
    let bundle = Container {
        name: CONTAINER_BUNDLE.to_owned(),
        image: Some(plan.agent.image.clone()),
        command: Some(plan.agent.bundle_command.clone()),
        security_context: Some(unprivileged()),
        resources: Some(resources.clone()),
        volume_mounts: Some(vec![mount(VOLUME_AGENT, AGENT_MOUNT, None, false)]),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };
    let mut mounts: Vec<VolumeMount> = plan
        .own_mounts()
        .into_iter()
        .map(|(volume, target, sub_path, read_only)| mount(volume, target, sub_path, read_only))
        .collect();
    mounts.extend(
        plan.mounts
            .iter()
            .map(|m| mount(m.claim.volume(), &m.target, Some(&m.sub_path), m.read_only)),
    );
    let agent_port = IntOrString::Int(i32::from(plan.agent.port));
    let sandbox = Container {
        name: CONTAINER_SANDBOX.to_owned(),
        image: Some(plan.image.clone()),
        command: Some(plan.agent.command.clone()),
        env: Some(vec![EnvVar {
            name: AGENT_KEY_ENV.to_owned(),
            value: Some(plan.agent.key.clone()),
            value_from: None,
        }]),
        ports: Some(vec![ContainerPort {
            name: Some(AGENT_PORT_NAME.to_owned()),
            container_port: i32::from(plan.agent.port),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        }]),
        // Ready once the agent listens: what the backend's watch waits for.
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: agent_port,
                host: None,
            }),
            period_seconds: Some(2),
            ..Probe::default()
        }),
        security_context: Some(unprivileged()),
        resources: Some(resources),
        volume_mounts: Some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };
    // A claim volume is read-only when every mount of it in the sandbox container is, and
    // nothing else (the prepare container) writes through it.
    let skills_read_only = plan
        .mounts
        .iter()
        .filter(|m| m.claim == Claim::Skills)
        .all(|m| m.read_only);
    let mut volumes = vec![
        claim_volume(VOLUME_USER_DATA, &plan.user_data_claim, false),
        claim_volume(VOLUME_SKILLS, &plan.skills_claim, skills_read_only),
    ];
    volumes.extend(empty_dirs(plan.layout).into_iter().map(|name| {
        let bytes = match name {
            VOLUME_HOME => plan.limits.home_bytes,
            VOLUME_TMP => plan.limits.tmp_bytes,
            VOLUME_ACCOUNTS => crate::accounts::VOLUME_BYTES,
            _ => plan.agent.bundle_bytes,
        };
        empty_dir(name, bytes)
    }));
    Pod {
        metadata: ObjectMeta {
            annotations: Some(plan.annotations()),
            ..meta(plan)
        },
        spec: Some(PodSpec {
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some("Never".to_owned()),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(SANDBOX_ID),
                run_as_group: Some(SANDBOX_ID),
                run_as_non_root: Some(true),
                seccomp_profile: Some(runtime_default()),
                ..PodSecurityContext::default()
            }),
            init_containers: Some(vec![prepare, bundle]),
            containers: vec![sandbox],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn service(plan: &PodPlan) -> Service {
    Service {
        metadata: meta(plan),
        spec: Some(ServiceSpec {
            type_: Some(plan.service_type.as_str().to_owned()),
            selector: Some(plan.selector()),
            ports: Some(vec![ServicePort {
                name: Some(AGENT_PORT_NAME.to_owned()),
                port: i32::from(plan.agent.port),
                target_port: Some(IntOrString::Int(i32::from(plan.agent.port))),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn peer(peer: &Peer) -> Result<NetworkPolicyPeer, Error> {
    Ok(match peer {
        Peer::Pods {
            pod_labels,
            namespace_labels,
        } => NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some(pod_labels.clone()),
                match_expressions: None,
            }),
            namespace_selector: namespace_labels.as_ref().map(|labels| LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            }),
            ip_block: None,
        },
        Peer::IpBlock { cidr } => NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: cidr_of(cidr)?,
                except: None,
            }),
            ..NetworkPolicyPeer::default()
        },
    })
}

fn tcp(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_owned()),
        end_port: None,
    }
}

/// The sandbox's NetworkPolicy: ingress only to the agent port, from warren; egress
/// nowhere (`none`) or only to warren's proxy (`open`, `allowlist`: which destinations the
/// proxy serves is warren's decision, as on the other backends). Both directions are in
/// `policyTypes`, so what no rule allows is denied.
fn network_policy(plan: &PodPlan) -> Result<K8sNetworkPolicy, Error> {
    let egress = if plan.network.has_egress() {
        let proxy = plan.proxy.as_ref().ok_or(Error::NoProxy {
            mode: plan.network.mode(),
        })?;
        Some(vec![NetworkPolicyEgressRule {
            to: Some(vec![peer(&proxy.peer)?]),
            ports: Some(vec![tcp(proxy.port)]),
        }])
    } else {
        None
    };
    Ok(K8sNetworkPolicy {
        metadata: meta(plan),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(plan.selector()),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![peer(&plan.agent_clients)?]),
                ports: Some(vec![tcp(plan.agent.port)]),
            }]),
            egress,
        }),
    })
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
