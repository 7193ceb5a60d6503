//! A Pod's identity: read back from its labels, annotations and spec, and the decision
//! `discover` takes about it after a restart (I16).
//!
//! [`read_pod`] refuses anything warren would not have made: another instance's, missing or
//! unparsable metadata, privileges (host namespaces, a service account token, a privileged
//! or root sandbox container, capabilities added: by the prepare container, any outside
//! [`PREPARE_CAPABILITIES`], a subset being accepted; a writable root, an `fsGroup`),
//! volumes other than the two claims and exactly its layout's `emptyDir`s (a `hostPath`
//! above all), and every mount view other than exactly its layout's own and persistent
//! mounts for its uid and workdir (legacy layouts: `/home/gem/projects`, nested user-data
//! mounts, writable skills). The E2B layout's pod (I7) is its own shape: no home
//! `emptyDir`, the workdir's subPath at `/home/user`, and warren's `/etc/passwd` and
//! `/etc/group` as read-only subPaths of the `accounts` `emptyDir`, which the prepare
//! container alone writes; a pod of another layout with any of that, or an E2B pod without
//! it, is refused.
//! [`decide`] then adopts only a pod equal to what the sandbox's record asks for
//! (uid, runtime scope, workdir, network, the mounts with their subPaths and modes, the
//! generation, the layout, the image, the claims) and removes the rest with the reason;
//! another instance's pods are left alone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Pod, PodSpec, SecurityContext, Service, ServiceSpec, VolumeMount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy as K8sNetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use warren_core::{LayoutName, NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};

use crate::manifests::{
    empty_dirs, own_mounts, within, Claim, PersistentMount, PodPlan, PREPARE_CAPABILITIES,
    SANDBOX_ID,
};
use crate::names::*;
use crate::Error;

/// What a pod is, as far as warren is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// The warren instance that made it.
    pub instance: String,
    /// The sandbox it serves.
    pub sandbox: SandboxId,
    /// The workspace owner.
    pub uid: Uid,
    /// The runtime scope.
    pub runtime_scope: RuntimeScope,
    /// The workdir.
    pub workdir: Workdir,
    /// Which start of the sandbox it is.
    pub generation: i64,
    /// Its layout.
    pub layout: LayoutName,
    /// Its network policy.
    pub network: NetworkPolicy,
    /// The image its sandbox container runs.
    pub image: String,
    /// Whether its commands get the global and agent environments (part of the binding).
    pub inherit_env: bool,
    /// Its persistent mounts, in the layout's order.
    pub mounts: Vec<PersistentMount>,
    /// The USER_DATA claim it mounts.
    pub user_data_claim: String,
    /// The SKILLS claim it mounts.
    pub skills_claim: String,
}

impl PodIdentity {
    /// The identity a pod built from `plan` carries.
    pub fn of_plan(plan: &PodPlan) -> Self {
        Self {
            instance: plan.instance.clone(),
            sandbox: plan.sandbox.clone(),
            uid: plan.uid.clone(),
            runtime_scope: plan.runtime_scope.clone(),
            workdir: plan.workdir.clone(),
            generation: plan.generation,
            layout: plan.layout,
            network: plan.network.clone(),
            image: plan.image.clone(),
            inherit_env: plan.inherit_env,
            mounts: plan.mounts.clone(),
            user_data_claim: plan.user_data_claim.clone(),
            skills_claim: plan.skills_claim.clone(),
        }
    }

    /// How this identity differs from `expected`, in words; `None` when they are equal.
    pub fn difference(&self, expected: &Self) -> Option<String> {
        fn differs<T: PartialEq + std::fmt::Debug>(
            out: &mut Vec<String>,
            what: &str,
            found: &T,
            expected: &T,
        ) {
            if found != expected {
                out.push(format!("{what} {found:?}, not {expected:?}"));
            }
        }
        let mut out = Vec::new();
        differs(&mut out, "instance", &self.instance, &expected.instance);
        differs(&mut out, "sandbox", &self.sandbox, &expected.sandbox);
        differs(&mut out, "uid", &self.uid, &expected.uid);
        differs(
            &mut out,
            "runtime scope",
            &self.runtime_scope,
            &expected.runtime_scope,
        );
        differs(&mut out, "workdir", &self.workdir, &expected.workdir);
        differs(
            &mut out,
            "generation",
            &self.generation,
            &expected.generation,
        );
        differs(&mut out, "layout", &self.layout, &expected.layout);
        differs(&mut out, "network", &self.network, &expected.network);
        differs(&mut out, "image", &self.image, &expected.image);
        differs(
            &mut out,
            "inherit_env",
            &self.inherit_env,
            &expected.inherit_env,
        );
        differs(&mut out, "mounts", &self.mounts, &expected.mounts);
        differs(
            &mut out,
            "USER_DATA claim",
            &self.user_data_claim,
            &expected.user_data_claim,
        );
        differs(
            &mut out,
            "SKILLS claim",
            &self.skills_claim,
            &expected.skills_claim,
        );
        (!out.is_empty()).then(|| out.join("; "))
    }
}

/// The per-sandbox agent key read back from a pod, for reaching an adopted pod's agent.
/// Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentKey(String);

impl AgentKey {
    /// The key itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey([redacted])")
    }
}

/// What `discover` does with a pod it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Exactly the runtime the sandbox's record asks for: keep it.
    Adopt {
        /// What it is.
        identity: Box<PodIdentity>,
        /// Its agent's key.
        agent_key: AgentKey,
    },
    /// Anything else of this instance's: delete it (its files stay, I15) and log why.
    Remove {
        /// Why, for the log.
        reason: String,
    },
    /// Another warren instance's pod: neither adopted nor touched.
    Ignore {
        /// Why, for the log.
        reason: String,
    },
}

/// Decides about a pod against the sandbox's record, as `expected` describes it.
pub fn decide(pod: &Pod, expected: &PodPlan) -> Decision {
    let remove = |error: Error| Decision::Remove {
        reason: error.to_string(),
    };
    let identity = match read_pod(pod, &expected.instance) {
        Ok(identity) => identity,
        Err(error @ Error::ForeignInstance { .. }) => {
            return Decision::Ignore {
                reason: error.to_string(),
            }
        }
        Err(error) => return remove(error),
    };
    if let Some(ended) = ended(pod) {
        return remove(Error::Ended(ended));
    }
    if let Some(difference) = identity.difference(&PodIdentity::of_plan(expected)) {
        return remove(Error::Mismatch(difference));
    }
    match agent_key(pod) {
        Ok(agent_key) => Decision::Adopt {
            identity: Box::new(identity),
            agent_key,
        },
        Err(error) => remove(error),
    }
}

/// Checks a pod's NetworkPolicy: `discover` adopts a pod only with its policy exactly as
/// warren makes it for `expected` (a pod whose policy was deleted or widened would reach
/// what its network forbids); otherwise it removes the pod and its objects.
pub fn check_network_policy(
    found: Option<&K8sNetworkPolicy>,
    expected: &PodPlan,
) -> Result<(), Error> {
    let problem = |problem: &str| Error::Companion {
        kind: "NetworkPolicy",
        problem: problem.to_owned(),
    };
    let found = found.ok_or_else(|| problem("is missing"))?;
    let want = crate::manifests::build(expected)?.network_policy;
    if found.metadata.name != want.metadata.name
        || sandbox_of(&found.metadata, &expected.instance).as_ref() != Some(&expected.sandbox)
    {
        return Err(problem("is another sandbox's"));
    }
    if found.spec != want.spec {
        return Err(problem("is not the one warren makes for it"));
    }
    Ok(())
}

/// Checks a pod's Service: warren's type, selecting exactly the pod, on the agent port.
/// What the API server fills in (cluster IP, node port, session affinity) is not compared.
pub fn check_service(found: Option<&Service>, expected: &PodPlan) -> Result<(), Error> {
    let problem = |problem: &str| Error::Companion {
        kind: "Service",
        problem: problem.to_owned(),
    };
    let found = found.ok_or_else(|| problem("is missing"))?;
    let want = crate::manifests::build(expected)?.service;
    if found.metadata.name != want.metadata.name
        || sandbox_of(&found.metadata, &expected.instance).as_ref() != Some(&expected.sandbox)
    {
        return Err(problem("is another sandbox's"));
    }
    let (found, want) = (
        found.spec.clone().unwrap_or_default(),
        want.spec.unwrap_or_default(),
    );
    if found.type_ != want.type_ {
        return Err(problem("is of another type"));
    }
    if found.selector != want.selector {
        return Err(problem("selects other pods"));
    }
    let ports = |spec: &ServiceSpec| -> Vec<_> {
        spec.ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.clone(),
                    p.port,
                    p.target_port.clone(),
                    p.protocol.clone(),
                )
            })
            .collect()
    };
    if ports(&found) != ports(&want) {
        return Err(problem("serves other ports"));
    }
    Ok(())
}

/// Why a pod will never serve again, if it will not: its containers ended (restartPolicy
/// Never) or it is being deleted.
fn ended(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Some("it is being deleted".to_owned());
    }
    let phase = pod.status.as_ref()?.phase.as_deref()?;
    matches!(phase, "Succeeded" | "Failed").then(|| format!("phase {phase}"))
}

/// The sandbox an object (a Service, a NetworkPolicy, a Pod) of this instance serves, by its
/// labels; `None` for another instance's or an unlabelled object.
pub fn sandbox_of(meta: &ObjectMeta, instance: &str) -> Option<SandboxId> {
    let labels = meta.labels.as_ref()?;
    if labels.get(LABEL_INSTANCE).map(String::as_str) != Some(instance)
        || labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(MANAGED_BY)
    {
        return None;
    }
    SandboxId::parse(labels.get(LABEL_SANDBOX)?).ok()
}

/// The agent key the pod's sandbox container was given.
pub fn agent_key(pod: &Pod) -> Result<AgentKey, Error> {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.iter().find(|c| c.name == CONTAINER_SANDBOX))
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|var| var.name == AGENT_KEY_ENV))
        .and_then(|var| var.value.clone())
        .filter(|key| !key.is_empty())
        .map(AgentKey)
        .ok_or(Error::MissingAgentKey)
}

/// Reads a pod back, refusing anything warren would not have made (see the module).
pub fn read_pod(pod: &Pod, instance: &str) -> Result<PodIdentity, Error> {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let label = |key: &'static str| {
        labels
            .get(key)
            .map(String::as_str)
            .ok_or(Error::MissingMetadata(key))
    };
    let annotation = |key: &'static str| {
        annotations
            .get(key)
            .map(String::as_str)
            .ok_or(Error::MissingMetadata(key))
    };
    fn bad<E>(key: &'static str) -> impl Fn(E) -> Error {
        move |_| Error::BadMetadata(key)
    }

    let found = label(LABEL_INSTANCE)?;
    if found != instance {
        return Err(Error::ForeignInstance {
            found: found.to_owned(),
        });
    }
    if label(LABEL_MANAGED_BY)? != MANAGED_BY {
        return Err(Error::BadMetadata(LABEL_MANAGED_BY));
    }
    if label(LABEL_COMPONENT)? != COMPONENT_SANDBOX {
        return Err(Error::BadMetadata(LABEL_COMPONENT));
    }
    let sandbox = SandboxId::parse(label(LABEL_SANDBOX)?).map_err(bad(LABEL_SANDBOX))?;
    if meta.name.as_deref() != Some(object_name(instance, &sandbox).as_str()) {
        return Err(Error::BadMetadata("metadata.name"));
    }
    let uid = Uid::new(annotation(ANNOTATION_UID)?).map_err(bad(ANNOTATION_UID))?;
    let runtime_scope =
        RuntimeScope::new(annotation(ANNOTATION_SCOPE)?).map_err(bad(ANNOTATION_SCOPE))?;
    if SandboxId::derive(&uid, &runtime_scope) != sandbox {
        return Err(Error::BadMetadata(LABEL_SANDBOX));
    }
    let safe_uid = uid.safe();
    if annotation(ANNOTATION_SAFE_UID)? != safe_uid.as_str() {
        return Err(Error::BadMetadata(ANNOTATION_SAFE_UID));
    }
    let workdir = Workdir::new(annotation(ANNOTATION_WORKDIR)?).map_err(bad(ANNOTATION_WORKDIR))?;
    let generation: i64 = annotation(ANNOTATION_GENERATION)?
        .parse()
        .map_err(bad(ANNOTATION_GENERATION))?;
    let layout =
        LayoutName::parse(annotation(ANNOTATION_LAYOUT)?).map_err(bad(ANNOTATION_LAYOUT))?;
    let network: NetworkPolicy =
        serde_json::from_str::<NetworkPolicy>(annotation(ANNOTATION_NETWORK)?)
            .ok()
            .and_then(|network| network.validate().ok())
            .ok_or(Error::BadMetadata(ANNOTATION_NETWORK))?;
    let image = annotation(ANNOTATION_IMAGE)?.to_owned();
    let inherit_env = match annotations.get(ANNOTATION_INHERIT_ENV) {
        Some(value) => value.parse::<bool>().map_err(bad(ANNOTATION_INHERIT_ENV))?,
        None => true,
    };
    let mut recorded: Vec<PersistentMount> =
        serde_json::from_str(annotation(ANNOTATION_MOUNTS)?).map_err(bad(ANNOTATION_MOUNTS))?;

    let spec = pod.spec.as_ref().ok_or(Error::BadMetadata("spec"))?;
    check_pod_privileges(spec)?;
    let (user_data_claim, skills_claim) = read_volumes(spec, layout)?;

    let names = |containers: &[Container]| -> Vec<String> {
        containers.iter().map(|c| c.name.clone()).collect()
    };
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    check_names(&names(inits), &[CONTAINER_PREPARE, CONTAINER_BUNDLE])?;
    check_names(&names(&spec.containers), &[CONTAINER_SANDBOX])?;
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(Error::UnexpectedContainer(
            "an ephemeral container".to_owned(),
        ));
    }
    let (prepare, bundle, sandbox_container) = (&inits[0], &inits[1], &spec.containers[0]);
    for container in [prepare, bundle, sandbox_container] {
        check_container_privileges(spec, container)?;
    }

    // The prepare container sees exactly this uid's subtree (and, where the layout needs
    // warren's accounts, the emptyDir it writes them into), the bundle container exactly
    // the bundle's emptyDir.
    let only = |container: &Container, want: &[VolumeMount]| -> Result<(), Error> {
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        if mounts == want {
            return Ok(());
        }
        if let Some(one) = mounts.iter().find(|one| {
            want.iter()
                .any(|w| one.name == w.name && one.mount_path == w.mount_path && one != &w)
        }) {
            return Err(Error::ForeignSubPath {
                target: one.mount_path.clone(),
                sub_path: one.sub_path.clone().unwrap_or_default(),
            });
        }
        Err(Error::UnexpectedMount(format!(
            "{} in container {}",
            mounts
                .iter()
                .find(|m| !want.contains(m))
                .or_else(|| want.iter().find(|w| !mounts.contains(w)))
                .map_or("(order)", |m| m.mount_path.as_str()),
            container.name
        )))
    };
    let mut prepare_mounts = vec![VolumeMount {
        name: VOLUME_USER_DATA.to_owned(),
        mount_path: PREPARE_ROOT.to_owned(),
        sub_path: Some(user_data_subtree(&safe_uid)),
        ..VolumeMount::default()
    }];
    if crate::accounts::needed(layout.layout()) {
        prepare_mounts.push(VolumeMount {
            name: VOLUME_ACCOUNTS.to_owned(),
            mount_path: PREPARE_ACCOUNTS.to_owned(),
            ..VolumeMount::default()
        });
    }
    only(prepare, &prepare_mounts)?;
    only(
        bundle,
        &[VolumeMount {
            name: VOLUME_AGENT.to_owned(),
            mount_path: AGENT_MOUNT.to_owned(),
            ..VolumeMount::default()
        }],
    )?;

    if sandbox_container.image.as_deref() != Some(image.as_str()) {
        return Err(Error::BadMetadata(ANNOTATION_IMAGE));
    }
    check_sandbox_env(sandbox_container)?;
    let mut mounts = read_sandbox_mounts(sandbox_container, layout)?;
    let expected = PersistentMount::for_layout(layout, &safe_uid, &workdir);
    check_layout_mounts(&mounts, &expected)?;
    let by_target = |a: &PersistentMount, b: &PersistentMount| a.target.cmp(&b.target);
    mounts.sort_by(by_target);
    recorded.sort_by(by_target);
    if recorded != mounts {
        return Err(Error::BadMetadata(ANNOTATION_MOUNTS));
    }

    Ok(PodIdentity {
        instance: instance.to_owned(),
        sandbox,
        uid,
        runtime_scope,
        workdir,
        generation,
        layout,
        network,
        image,
        inherit_env,
        mounts: expected,
        user_data_claim,
        skills_claim,
    })
}

fn check_names(found: &[String], expected: &[&str]) -> Result<(), Error> {
    if let Some(extra) = found.iter().find(|name| !expected.contains(&name.as_str())) {
        return Err(Error::UnexpectedContainer(extra.clone()));
    }
    if found != expected {
        let missing = expected
            .iter()
            .find(|name| !found.iter().any(|f| f == *name))
            .copied()
            .unwrap_or("(order)");
        return Err(Error::UnexpectedContainer(missing.to_owned()));
    }
    Ok(())
}

fn check_pod_privileges(spec: &PodSpec) -> Result<(), Error> {
    let refuse = |what: &str| Err(Error::Privileges(what.to_owned()));
    if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true)
    {
        return refuse("a namespace of the node");
    }
    if spec.share_process_namespace == Some(true) {
        return refuse("a process namespace shared between its containers");
    }
    if spec.automount_service_account_token != Some(false) {
        return refuse("a service account token");
    }
    let context = spec.security_context.clone().unwrap_or_default();
    if context.run_as_user != Some(SANDBOX_ID)
        || context.run_as_group != Some(SANDBOX_ID)
        || context.run_as_non_root != Some(true)
    {
        return refuse("a pod user other than 1000:1000");
    }
    if context.fs_group.is_some()
        || context
            .supplemental_groups
            .as_ref()
            .is_some_and(|g| !g.is_empty())
    {
        return refuse("extra groups (fsGroup re-owns the claims)");
    }
    if context.seccomp_profile.as_ref().map(|p| p.type_.as_str()) != Some("RuntimeDefault") {
        return refuse("a seccomp profile other than RuntimeDefault");
    }
    if context.sysctls.as_ref().is_some_and(|s| !s.is_empty()) {
        return refuse("sysctls");
    }
    Ok(())
}

fn check_container_privileges(spec: &PodSpec, container: &Container) -> Result<(), Error> {
    let name = &container.name;
    let refuse = |what: &str| Err(Error::Privileges(format!("container {name}: {what}")));
    let context: SecurityContext = container.security_context.clone().unwrap_or_default();
    let pod = spec.security_context.clone().unwrap_or_default();
    if context.privileged == Some(true) {
        return refuse("privileged");
    }
    if context.allow_privilege_escalation != Some(false) {
        return refuse("privilege escalation allowed");
    }
    if context.read_only_root_filesystem != Some(true) {
        return refuse("a writable root filesystem");
    }
    let capabilities = context.capabilities.clone().unwrap_or_default();
    if !capabilities
        .drop
        .unwrap_or_default()
        .iter()
        .any(|c| c == "ALL")
    {
        return refuse("capabilities not dropped");
    }
    let added = capabilities.add.unwrap_or_default();
    // The prepare container may add [`PREPARE_CAPABILITIES`] or any subset of them (a pod of
    // an earlier warren added `CHOWN` and `DAC_OVERRIDE` only: less than today's, so kept
    // rather than re-created on upgrade); anything outside that set is refused. Every other
    // container adds none.
    let allowed: &[&str] = if name == CONTAINER_PREPARE {
        &PREPARE_CAPABILITIES
    } else {
        &[]
    };
    if let Some(extra) = added.iter().find(|c| !allowed.contains(&c.as_str())) {
        return refuse(&format!("capability {extra} added"));
    }
    if context
        .seccomp_profile
        .as_ref()
        .is_some_and(|p| p.type_ != "RuntimeDefault")
    {
        return refuse("a seccomp profile other than RuntimeDefault");
    }
    if context
        .proc_mount
        .as_deref()
        .is_some_and(|m| m != "Default")
    {
        return refuse("an unmasked /proc");
    }
    if context
        .app_armor_profile
        .as_ref()
        .is_some_and(|p| p.type_ == "Unconfined")
    {
        return refuse("AppArmor unconfined");
    }
    if name != CONTAINER_PREPARE {
        let user = context.run_as_user.or(pod.run_as_user);
        let group = context.run_as_group.or(pod.run_as_group);
        let non_root = context.run_as_non_root.or(pod.run_as_non_root);
        if user != Some(SANDBOX_ID) || group != Some(SANDBOX_ID) || non_root != Some(true) {
            return refuse("a user other than 1000:1000");
        }
    }
    if container
        .ports
        .iter()
        .flatten()
        .any(|port| port.host_port.is_some() || port.host_ip.is_some())
    {
        return refuse("a port of the node");
    }
    if container
        .volume_devices
        .as_ref()
        .is_some_and(|d| !d.is_empty())
    {
        return refuse("a block device");
    }
    Ok(())
}

/// The volumes: exactly the two claims and the layout's `emptyDir`s (the home's only where
/// the home is ephemeral, I30; the accounts' only where warren names the user, I7).
/// Answers the claims' names.
fn read_volumes(spec: &PodSpec, layout: LayoutName) -> Result<(String, String), Error> {
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

fn check_sandbox_env(container: &Container) -> Result<(), Error> {
    let refuse = |what: &str| Err(Error::Privileges(format!("container sandbox: {what}")));
    if container.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
        return refuse("environment from other objects");
    }
    for var in container.env.iter().flatten() {
        if var.name != AGENT_KEY_ENV || var.value_from.is_some() {
            return refuse(&format!(
                "environment variable {} warren never sets",
                var.name
            ));
        }
    }
    Ok(())
}

/// The sandbox container's mounts: its layout's own mounts (the home's `emptyDir` where the
/// home is ephemeral, `/tmp`, the bundle, the accounts files where warren names the user)
/// exactly where warren puts them, and the persistent mounts, answered as such.
fn read_sandbox_mounts(
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
fn check_layout_mounts(
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

    use super::*;
    use crate::manifests::{build, example_plan};

    fn plan() -> PodPlan {
        example_plan(LayoutName::Ars, NetworkPolicy::None)
    }

    fn pod_value(plan: &PodPlan) -> Value {
        serde_json::to_value(build(plan).unwrap().pod).unwrap()
    }

    fn read(value: Value) -> Result<PodIdentity, Error> {
        let pod: Pod = serde_json::from_value(value).unwrap();
        read_pod(&pod, "i1")
    }

    fn decide_on(value: Value, plan: &PodPlan) -> Decision {
        decide(&serde_json::from_value(value).unwrap(), plan)
    }

    #[test]
    fn a_pod_warren_built_reads_back_as_its_plan_and_is_adopted() {
        for layout in LayoutName::ALL {
            let plan = example_plan(layout, NetworkPolicy::Open);
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
    fn the_prepare_container_is_adopted_with_its_capabilities_or_fewer_and_never_more() {
        let plan = plan();
        let with_prepare_capabilities = |add: Value| {
            let mut value = pod_value(&plan);
            assert_eq!(
                value["spec"]["initContainers"][0]["name"],
                CONTAINER_PREPARE
            );
            value["spec"]["initContainers"][0]["securityContext"]["capabilities"]["add"] = add;
            value
        };
        // What this version builds.
        assert_eq!(
            pod_value(&plan)["spec"]["initContainers"][0]["securityContext"]["capabilities"],
            json!({"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]})
        );
        // Adopted: today's set in any order, and a subset of it, as the previous version
        // built (CHOWN and DAC_OVERRIDE only): re-creating every pod on upgrade for having
        // less would gain nothing.
        for add in [
            json!(["CHOWN", "DAC_OVERRIDE", "FOWNER"]),
            json!(["FOWNER", "CHOWN", "DAC_OVERRIDE"]),
            json!(["CHOWN", "DAC_OVERRIDE"]),
            json!(["CHOWN"]),
            json!([]),
        ] {
            let value = with_prepare_capabilities(add.clone());
            assert_eq!(
                read(value.clone()),
                Ok(PodIdentity::of_plan(&plan)),
                "{add}"
            );
            assert!(
                matches!(decide_on(value, &plan), Decision::Adopt { .. }),
                "{add}"
            );
        }
        // Refused and removed: anything outside the set, alone or beside it.
        for (add, extra) in [
            (
                json!(["CHOWN", "DAC_OVERRIDE", "FOWNER", "SYS_ADMIN"]),
                "SYS_ADMIN",
            ),
            (json!(["CHOWN", "DAC_OVERRIDE", "SYS_ADMIN"]), "SYS_ADMIN"),
            (json!(["SETUID"]), "SETUID"),
            (
                json!(["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"]),
                "FSETID",
            ),
            (json!(["CAP_FOWNER"]), "CAP_FOWNER"),
        ] {
            let expected =
                Error::Privileges(format!("container prepare: capability {extra} added"));
            let value = with_prepare_capabilities(add.clone());
            assert_eq!(read(value.clone()).err(), Some(expected.clone()), "{add}");
            assert_eq!(
                decide_on(value, &plan),
                Decision::Remove {
                    reason: expected.to_string()
                },
                "{add}"
            );
        }
    }

    #[test]
    fn a_pod_of_another_binding_is_removed_naming_the_difference() {
        let built = plan();
        type Change = Box<dyn Fn(&mut PodPlan)>;
        let cases: Vec<(&str, Change)> = vec![
            ("generation", Box::new(|p| p.generation = 4)),
            ("network", Box::new(|p| p.network = NetworkPolicy::Open)),
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
                Box::new(|p| {
                    p["spec"]["containers"][0]["volumeMounts"][3]["readOnly"] = json!(true)
                }),
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
                    p["spec"]["volumes"].as_array_mut().unwrap().push(
                        json!({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}),
                    )
                }),
                Error::HostPath("docker".into()),
            ),
            (
                "an emptyDir in place of the USER_DATA claim",
                Box::new(|p| {
                    p["spec"]["volumes"][0] = json!({"name": "user-data", "emptyDir": {}})
                }),
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
                Box::new(|p| {
                    p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true)
                }),
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
                Box::new(|p| {
                    p["metadata"]["annotations"][ANNOTATION_LAYOUT] = json!("e2b-desktop")
                }),
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
    fn a_pod_is_adopted_only_beside_its_own_network_policy_and_service() {
        let plan = plan();
        let objects = build(&plan).unwrap();
        check_network_policy(Some(&objects.network_policy), &plan).unwrap();
        check_service(Some(&objects.service), &plan).unwrap();

        let companion = |kind, problem: &str| {
            Err(Error::Companion {
                kind,
                problem: problem.to_owned(),
            })
        };
        assert_eq!(
            check_network_policy(None, &plan),
            companion("NetworkPolicy", "is missing")
        );
        assert_eq!(
            check_service(None, &plan),
            companion("Service", "is missing")
        );

        // Widened: the same policy with egress anywhere.
        let mut widened = objects.network_policy.clone();
        widened.spec.as_mut().unwrap().egress = Some(vec![Default::default()]);
        assert_eq!(
            check_network_policy(Some(&widened), &plan),
            companion("NetworkPolicy", "is not the one warren makes for it")
        );
        // The policy of the sandbox's former network: another generation's binding.
        let open = PodPlan {
            network: NetworkPolicy::Open,
            ..plan.clone()
        };
        assert!(check_network_policy(Some(&objects.network_policy), &open).is_err());
        let mut foreign = objects.network_policy.clone();
        foreign
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_INSTANCE.into(), "i2".into());
        assert_eq!(
            check_network_policy(Some(&foreign), &plan),
            companion("NetworkPolicy", "is another sandbox's")
        );

        // What the API server fills in a Service is not a difference; its selector is.
        let mut service = objects.service.clone();
        let spec = service.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.96.0.12".into());
        spec.session_affinity = Some("None".into());
        check_service(Some(&service), &plan).unwrap();
        service
            .spec
            .as_mut()
            .unwrap()
            .selector
            .as_mut()
            .unwrap()
            .remove(LABEL_SANDBOX);
        assert_eq!(
            check_service(Some(&service), &plan),
            companion("Service", "selects other pods")
        );
        let node_port = PodPlan {
            service_type: crate::manifests::ServiceType::NodePort,
            ..plan.clone()
        };
        assert_eq!(
            check_service(Some(&objects.service), &node_port),
            companion("Service", "is of another type")
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
}
