//! A container's identity: the labels warren writes, and the checks that a container found
//! on the engine is exactly what warren would have made for its sandbox (I16).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use bollard::models::ContainerInspectResponse;
use warren_backend::{BackendKind, RuntimeSpec};
use warren_core::{
    ExtraMount, IsolationTier, LayoutName, MountSource, NetworkPolicy, RuntimeScope, SandboxId,
    Uid, VirtualRoot, Workdir,
};

use crate::{AGENT_MOUNT, SOCKET_MOUNT};
use warren_backend::staging::staging_path;

/// Label naming the warren instance (a hash of its data directory) that owns a container.
pub const LABEL_INSTANCE: &str = "dev.warren.instance";
/// Label naming the sandbox a container serves.
pub const LABEL_SANDBOX: &str = "dev.warren.sandbox";
const LABEL_GENERATION: &str = "dev.warren.generation";
const LABEL_UID: &str = "dev.warren.uid";
const LABEL_SCOPE: &str = "dev.warren.runtime-scope";
const LABEL_WORKDIR: &str = "dev.warren.workdir";
const LABEL_NETWORK: &str = "dev.warren.network";
const LABEL_IMAGE: &str = "dev.warren.image";
/// The layout; a container without it predates layouts and is the default's.
const LABEL_LAYOUT: &str = "dev.warren.layout";
/// The sandbox's extra mounts as JSON (absent: none), so adoption requires exactly them.
const LABEL_EXTRA_MOUNTS: &str = "dev.warren.extra-mounts";
/// The host trees the mounts come from. A staged bind's source is a staging directory
/// that is gone once the container started, so the tree it lies in is recorded here; a
/// direct bind's source must agree. Containers made before layouts lack them.
const LABEL_USER_WORKSPACE: &str = "dev.warren.user-workspace";
const LABEL_SKILL_PROJECTION: &str = "dev.warren.skill-projection";
/// The isolation tier (issue 19); a container without it is the kernel tier's.
const LABEL_ISOLATION: &str = "dev.warren.isolation";
/// The binding's environment policy, `inherit_env` and `ephemeral` as JSON. A container
/// without it is taken for the default's (inherited, persistent): that can only refuse a
/// container whose record says otherwise, never adopt one wrongly, since a container's
/// policy is its record's.
const LABEL_ENV_POLICY: &str = "dev.warren.env-policy";

/// The legacy mount of the workspace's projects, refused for reuse (I16).
const LEGACY_PROJECTS: &str = "/home/gem/projects";

/// What a live container is, as far as warren is concerned.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// The spec it was created from (its mounts as the engine reports them).
    pub spec: RuntimeSpec,
    /// The engine says it runs.
    pub running: bool,
    /// The agent's host pid and birth (see `warren_agent::client::process_birth`),
    /// once known: how its `/home/gem` is reached for snapshots.
    pub agent: Option<(i32, String)>,
}

impl Identity {
    /// Whether a container of this identity serves `spec` ([`RuntimeSpec::serves`]): the
    /// same generation, an equal binding, and the same host trees its mounts come from.
    ///
    /// The trees, not each bind's source path: a staged bind's source is a staging
    /// directory named after the sandbox and the mount's index, the same for every
    /// container of the sandbox, and gone once its container started. What it showed is
    /// fixed by the rest of the identity: the layout says which directory of which tree
    /// each mount is (the workdir, `agents/skills`), the workdir label says which workdir,
    /// and the tree labels say which UserWorkspace and projection; [`Self::from_container`]
    /// has checked that every staged source is this sandbox's staging path for that
    /// mount, and every direct source the tree itself. Equal on all of these, two
    /// containers show the same directories, so comparing them is comparing the mounts.
    pub fn matches(&self, spec: &RuntimeSpec) -> bool {
        self.spec.serves(spec)
    }

    /// Reads a container back, refusing anything warren would not have made: another
    /// instance's, missing or unparsable labels, and every mount view other than exactly
    /// its layout's persistent binds with the right modes and sources (I16). `binds` is
    /// the backend's staging directory (`staging`); `accounts` the directory of its
    /// accounts files, which a layout whose user images do not name binds read-only at
    /// `/etc/passwd` and `/etc/group` (`accounts`), and no other layout does. A gVisor
    /// container must run on `gvisor_runtime` with exactly the agent's capabilities inside
    /// the Sentry; a kernel-tier one on the engine's default runtime with none.
    pub fn from_container(
        container: &ContainerInspectResponse,
        instance: &str,
        env: BTreeMap<String, String>,
        binds: &Path,
        accounts: &Path,
        gvisor_runtime: &str,
    ) -> Result<Self, LayoutProblem> {
        let labels = container
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        let label = |name: &'static str| {
            labels
                .get(name)
                .cloned()
                .ok_or(LayoutProblem::MissingLabel(name))
        };
        if label(LABEL_INSTANCE)? != instance {
            return Err(LayoutProblem::ForeignInstance);
        }
        fn bad<E>(name: &'static str) -> impl Fn(E) -> LayoutProblem {
            move |_| LayoutProblem::BadLabel(name)
        }
        let sandbox = SandboxId::parse(&label(LABEL_SANDBOX)?).map_err(bad(LABEL_SANDBOX))?;
        let generation: i64 = label(LABEL_GENERATION)?
            .parse()
            .map_err(bad(LABEL_GENERATION))?;
        let uid = Uid::new(label(LABEL_UID)?).map_err(bad(LABEL_UID))?;
        let runtime_scope = RuntimeScope::new(label(LABEL_SCOPE)?).map_err(bad(LABEL_SCOPE))?;
        if SandboxId::derive(&uid, &runtime_scope) != sandbox {
            return Err(LayoutProblem::BadLabel(LABEL_SANDBOX));
        }
        let workdir = Workdir::new(label(LABEL_WORKDIR)?).map_err(bad(LABEL_WORKDIR))?;
        let network: NetworkPolicy =
            serde_json::from_str(&label(LABEL_NETWORK)?).map_err(bad(LABEL_NETWORK))?;
        let image = label(LABEL_IMAGE)?;
        let actual_image = container.config.as_ref().and_then(|c| c.image.clone());
        if actual_image.as_deref() != Some(image.as_str()) {
            return Err(LayoutProblem::BadLabel(LABEL_IMAGE));
        }

        let isolation = match labels.get(LABEL_ISOLATION) {
            Some(name) => {
                IsolationTier::parse(name).ok_or(LayoutProblem::BadLabel(LABEL_ISOLATION))?
            }
            None => IsolationTier::Kernel,
        };
        let host = container.host_config.clone().unwrap_or_default();
        let mut added = host.cap_add.clone().unwrap_or_default();
        added.sort();
        let (expected_added, expected_runtime) = match isolation {
            IsolationTier::Kernel => (Vec::new(), None),
            IsolationTier::Gvisor => {
                let mut agent: Vec<String> = crate::gvisor::AGENT_CAPABILITIES
                    .iter()
                    .map(|c| (*c).to_owned())
                    .collect();
                agent.sort();
                (agent, Some(gvisor_runtime))
            }
        };
        // The engine reports the default runtime by name (`runc`) or not at all.
        let runtime = host
            .runtime
            .as_deref()
            .filter(|r| *r != "runc" && !r.is_empty());
        if runtime != expected_runtime {
            return Err(LayoutProblem::Runtime(runtime.unwrap_or("runc").to_owned()));
        }
        if host.privileged == Some(true)
            || !host.cap_drop.unwrap_or_default().iter().any(|c| c == "ALL")
            || added != expected_added
            || host.readonly_rootfs != Some(true)
            || !host
                .security_opt
                .unwrap_or_default()
                .iter()
                .any(|o| o == "no-new-privileges:true")
        {
            return Err(LayoutProblem::Privileges);
        }
        let expected_network = if network.has_egress() && isolation == IsolationTier::Kernel {
            container
                .name
                .as_deref()
                .map(|n| n.trim_start_matches('/').to_owned())
        } else {
            Some("none".to_owned())
        };
        if host.network_mode != expected_network {
            return Err(LayoutProblem::Network(
                host.network_mode.unwrap_or_default(),
            ));
        }
        if host
            .port_bindings
            .is_some_and(|ports| ports.values().any(Option::is_some))
        {
            return Err(LayoutProblem::PublishedPorts);
        }

        let env_policy = match labels.get(LABEL_ENV_POLICY) {
            Some(json) => serde_json::from_str(json).map_err(bad(LABEL_ENV_POLICY))?,
            None => EnvPolicy::default(),
        };
        let layout = match labels.get(LABEL_LAYOUT) {
            Some(name) => LayoutName::parse(name).map_err(bad(LABEL_LAYOUT))?,
            None => LayoutName::Ars,
        };
        let extra_mounts: Vec<ExtraMount> = match labels.get(LABEL_EXTRA_MOUNTS) {
            Some(json) => serde_json::from_str(json).map_err(bad(LABEL_EXTRA_MOUNTS))?,
            None => Vec::new(),
        };
        let tree_label = |root: VirtualRoot| match root {
            VirtualRoot::UserData => LABEL_USER_WORKSPACE,
            VirtualRoot::Skills => LABEL_SKILL_PROJECTION,
            // A mount's tree is never the runtime's own.
            VirtualRoot::Extra(_) | VirtualRoot::Branch | VirtualRoot::Runtime => {
                LABEL_EXTRA_MOUNTS
            }
        };
        let mut trees: HashMap<VirtualRoot, PathBuf> = HashMap::new();
        for root in [VirtualRoot::UserData, VirtualRoot::Skills] {
            if let Some(path) = labels.get(tree_label(root)) {
                trees.insert(root, PathBuf::from(path));
            }
        }
        let expected = warren_core::view_mounts(layout.layout(), &extra_mounts);
        let mut seen = vec![false; expected.len()];
        let accounts = crate::accounts::binds(accounts, layout);
        let mut accounts_seen = vec![false; accounts.len()];
        for mount in container.mounts.clone().unwrap_or_default() {
            let target = mount.destination.clone().unwrap_or_default();
            let source = PathBuf::from(mount.source.clone().unwrap_or_default());
            let writable = mount.rw.unwrap_or(true);
            let is_bind = mount.typ.as_deref() == Some("bind");
            if let Some(index) = expected.iter().position(|m| m.target == target) {
                let want = &expected[index];
                if !is_bind || seen[index] {
                    return Err(LayoutProblem::UnexpectedMount(target));
                }
                if writable != want.writable {
                    return Err(if writable {
                        LayoutProblem::Writable(target)
                    } else {
                        LayoutProblem::ReadOnly(target)
                    });
                }
                let staged = matches!(want.source, MountSource::Extra(_))
                    || !want.source.prefix(&workdir).is_empty();
                if !staged {
                    // A whole tree of warren's, bound by its path: the label must agree.
                    let root = want.source.tree();
                    match trees.get(&root) {
                        Some(path) if *path != source => {
                            return Err(LayoutProblem::BadLabel(tree_label(root)))
                        }
                        Some(_) => {}
                        None => {
                            trees.insert(root, source);
                        }
                    }
                } else if source != staging_path(binds, &sandbox, index) {
                    // A directory beneath a user's tree is only ever bound from warren's
                    // staging of it, never from a path dockerd walked.
                    return Err(LayoutProblem::Unstaged(target));
                }
                seen[index] = true;
                continue;
            }
            if let Some(index) = accounts.iter().position(|(_, t)| *t == target) {
                // Warren's accounts file for this layout, read-only, from warren's path.
                if !is_bind || writable || accounts_seen[index] || source != accounts[index].0 {
                    return Err(LayoutProblem::UnexpectedMount(target));
                }
                accounts_seen[index] = true;
                continue;
            }
            match target.as_str() {
                AGENT_MOUNT if is_bind && !writable => {}
                SOCKET_MOUNT if is_bind => {}
                LEGACY_PROJECTS => return Err(LayoutProblem::ProjectsMount),
                t if expected
                    .iter()
                    .any(|m| t.starts_with(m.target) && t[m.target.len()..].starts_with('/')) =>
                {
                    return Err(LayoutProblem::NestedMount(t.to_owned()))
                }
                t => return Err(LayoutProblem::UnexpectedMount(t.to_owned())),
            }
        }
        if seen.contains(&false) || accounts_seen.contains(&false) {
            return Err(LayoutProblem::MissingMounts);
        }
        let mut tree = |root: VirtualRoot| {
            trees
                .remove(&root)
                .ok_or(LayoutProblem::MissingLabel(tree_label(root)))
        };
        let user_workspace = tree(VirtualRoot::UserData)?;
        let skill_projection = tree(VirtualRoot::Skills)?;
        let running = container
            .state
            .as_ref()
            .and_then(|s| s.running)
            .unwrap_or(false);
        Ok(Self {
            spec: RuntimeSpec {
                sandbox,
                generation,
                uid,
                runtime_scope,
                user_workspace,
                skill_projection,
                env,
                seed: None,
                branch: None,
                frozen: Vec::new(),
                binding: warren_core::Binding {
                    workdir,
                    network,
                    backend: BackendKind::Docker,
                    image: Some(image),
                    inherit_env: env_policy.inherit_env,
                    ephemeral: env_policy.ephemeral,
                    layout,
                    extra_mounts,
                    isolation,
                    // A container bound to a branch is never adopted after a restart: its
                    // binding (with the branch) differs, so it is made again.
                    branch: None,
                },
            },
            running,
            agent: None,
        })
    }
}

/// Why a container found on the engine is not reused (it is removed instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutProblem {
    /// A label warren writes is missing.
    #[error("label {0} is missing")]
    MissingLabel(&'static str),
    /// A label does not parse, or disagrees with the others.
    #[error("label {0} is not valid")]
    BadLabel(&'static str),
    /// Another warren's container.
    #[error("it belongs to another warren instance")]
    ForeignInstance,
    /// It runs with privileges warren never grants.
    #[error("it runs with privileges warren never grants")]
    Privileges,
    /// It is on a network that is not its own (or none).
    #[error("it is on network {0:?}, not its own")]
    Network(String),
    /// It publishes ports.
    #[error("it publishes ports")]
    PublishedPorts,
    /// It runs on another runtime than its isolation tier's.
    #[error("it runs on runtime {0:?}, not its isolation tier's")]
    Runtime(String),
    /// Legacy layout: an old `/home/gem/projects` mount.
    #[error("legacy layout: it mounts /home/gem/projects")]
    ProjectsMount,
    /// Legacy layout: sub-mounts inside a persistent mount (`/home/gem/user-data`).
    #[error("legacy layout: a nested mount at {0}")]
    NestedMount(String),
    /// Legacy layout: a mount the layout makes read-only (the skills) is writable.
    #[error("legacy layout: {0} is writable")]
    Writable(String),
    /// A mount the layout makes writable is read-only.
    #[error("{0} is read-only, which its layout makes writable")]
    ReadOnly(String),
    /// A directory beneath a user's tree bound from a path, not from warren's staging.
    #[error("{0} is bound from a host path, not from warren's staging of it")]
    Unstaged(String),
    /// A mount warren never makes.
    #[error("it mounts {0}, which warren never mounts")]
    UnexpectedMount(String),
    /// One of its layout's persistent mounts is missing.
    #[error("it lacks one of its layout's persistent mounts")]
    MissingMounts,
}

/// The environment part of a binding, as [`LABEL_ENV_POLICY`] holds it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvPolicy {
    inherit_env: bool,
    ephemeral: bool,
}

impl EnvPolicy {
    fn of(binding: &warren_core::Binding) -> Self {
        Self {
            inherit_env: binding.inherit_env,
            ephemeral: binding.ephemeral,
        }
    }
}

impl Default for EnvPolicy {
    fn default() -> Self {
        Self {
            inherit_env: true,
            ephemeral: false,
        }
    }
}

/// The labels of a sandbox's container.
pub(crate) fn container_labels(instance: &str, spec: &RuntimeSpec) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_INSTANCE.to_owned(), instance.to_owned()),
        (LABEL_SANDBOX.to_owned(), spec.sandbox.to_string()),
        (LABEL_GENERATION.to_owned(), spec.generation.to_string()),
        (LABEL_UID.to_owned(), spec.uid.to_string()),
        (LABEL_SCOPE.to_owned(), spec.runtime_scope.to_string()),
        (LABEL_WORKDIR.to_owned(), spec.binding.workdir.to_string()),
        (LABEL_LAYOUT.to_owned(), spec.binding.layout.to_string()),
        (
            LABEL_ISOLATION.to_owned(),
            spec.binding.isolation.to_string(),
        ),
        (
            LABEL_ENV_POLICY.to_owned(),
            serde_json::to_string(&EnvPolicy::of(&spec.binding)).expect("a policy serialises"),
        ),
        (
            LABEL_EXTRA_MOUNTS.to_owned(),
            serde_json::to_string(&spec.binding.extra_mounts).expect("extra mounts serialise"),
        ),
        (
            LABEL_USER_WORKSPACE.to_owned(),
            spec.user_workspace.to_string_lossy().into_owned(),
        ),
        (
            LABEL_SKILL_PROJECTION.to_owned(),
            spec.skill_projection.to_string_lossy().into_owned(),
        ),
        (
            LABEL_NETWORK.to_owned(),
            serde_json::to_string(&spec.binding.network).expect("a network policy serialises"),
        ),
        (
            LABEL_IMAGE.to_owned(),
            spec.binding.image.clone().unwrap_or_default(),
        ),
    ])
}

/// The labels of a sandbox's network.
pub(crate) fn network_labels(instance: &str, sandbox: &SandboxId) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_INSTANCE.to_owned(), instance.to_owned()),
        (LABEL_SANDBOX.to_owned(), sandbox.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;

    fn spec() -> RuntimeSpec {
        let uid = Uid::new("alice").unwrap();
        let runtime_scope = RuntimeScope::new("t").unwrap();
        RuntimeSpec {
            sandbox: SandboxId::derive(&uid, &runtime_scope),
            generation: 3,
            uid,
            runtime_scope,
            user_workspace: "/data/user-data/shared/alice/workspace".into(),
            skill_projection: "/data/skill-projections/alice".into(),
            env: BTreeMap::new(),
            seed: None,
            branch: None,
            frozen: Vec::new(),
            binding: warren_core::Binding {
                workdir: Workdir::new("projects/a").unwrap(),
                network: NetworkPolicy::None,
                backend: BackendKind::Docker,
                image: Some("warren-test:1".into()),
                inherit_env: true,
                ephemeral: false,
                layout: warren_core::LayoutName::Ars,
                extra_mounts: Vec::new(),
                isolation: warren_core::IsolationTier::Kernel,
                branch: None,
            },
        }
    }

    const BINDS: &str = "/data/docker/binds";
    const ACCOUNTS: &str = "/data/docker/accounts";

    fn deerflow_spec() -> RuntimeSpec {
        RuntimeSpec {
            binding: warren_core::Binding {
                workdir: Workdir::new("threads/t1/user-data").unwrap(),
                layout: LayoutName::Deerflow,
                ..spec().binding
            },
            ..spec()
        }
    }

    /// What the engine reports for a container warren made from `spec`: its layout's
    /// binds (staged ones from their staging directory), the agent and its socket.
    fn container(spec: &RuntimeSpec) -> serde_json::Value {
        let mut mounts: Vec<serde_json::Value> = spec
            .mounts()
            .iter()
            .enumerate()
            .map(|(index, mount)| {
                let source = if warren_backend::staging::is_staged(mount) {
                    staging_path(Path::new(BINDS), &spec.sandbox, index)
                } else {
                    mount.tree.clone()
                };
                json!({"Type": "bind", "Source": source, "Destination": mount.target, "RW": mount.writable})
            })
            .collect();
        mounts.extend([
            json!({"Type": "bind", "Source": "/data/docker/agent-x", "Destination": AGENT_MOUNT, "RW": false}),
            json!({"Type": "bind", "Source": "/data/docker/sockets/x", "Destination": SOCKET_MOUNT, "RW": true}),
        ]);
        json!({
            "Name": format!("/warren-i1-{}", spec.sandbox),
            "State": {"Running": true},
            "Config": {
                "Image": spec.binding.image,
                "Labels": container_labels("i1", spec),
            },
            "HostConfig": {
                "CapDrop": ["ALL"],
                "ReadonlyRootfs": true,
                "Privileged": false,
                "SecurityOpt": ["no-new-privileges:true"],
                "NetworkMode": "none",
            },
            "Mounts": mounts,
        })
    }

    fn read(value: serde_json::Value) -> Result<Identity, LayoutProblem> {
        let inspected: ContainerInspectResponse = serde_json::from_value(value).unwrap();
        Identity::from_container(
            &inspected,
            "i1",
            BTreeMap::new(),
            Path::new(BINDS),
            Path::new(ACCOUNTS),
            "runsc",
        )
    }

    const USER_DATA: &str = "/home/gem/user-data";

    #[test]
    fn a_container_warren_made_reads_back_as_its_spec() {
        let spec = spec();
        let identity = read(container(&spec)).unwrap();
        assert!(identity.running);
        assert!(identity.matches(&spec));
        assert_eq!(
            identity.spec.user_workspace,
            Path::new("/data/user-data/shared/alice/workspace")
        );
        let mut other = spec.clone();
        other.generation = 4;
        assert!(
            !identity.matches(&other),
            "another generation is another runtime"
        );
        other = spec.clone();
        other.binding.image = Some("warren-test:2".into());
        assert!(
            !identity.matches(&other),
            "another image is another runtime"
        );
    }

    #[test]
    fn a_container_serves_only_its_own_environment_policy() {
        let spec = spec();
        let mut isolated = spec.clone();
        isolated.binding.inherit_env = false;
        let mut ephemeral = spec.clone();
        ephemeral.binding.ephemeral = true;
        for made in [&spec, &isolated, &ephemeral] {
            let identity = read(container(made)).unwrap();
            for wanted in [&spec, &isolated, &ephemeral] {
                assert_eq!(identity.matches(wanted), made == wanted);
            }
        }
        // A container made before the policy was labelled reads as the default's.
        let mut value = container(&spec);
        let labels = value["Config"]["Labels"].as_object_mut().unwrap();
        assert!(labels.remove(LABEL_ENV_POLICY).is_some());
        assert!(read(value.clone()).unwrap().matches(&spec));
        value["Config"]["Labels"][LABEL_ENV_POLICY] = json!("{\"inherit_env\":1}");
        assert!(matches!(
            read(value),
            Err(LayoutProblem::BadLabel(LABEL_ENV_POLICY))
        ));
    }

    #[test]
    fn legacy_and_foreign_layouts_are_refused_with_their_reason() {
        let spec = spec();
        type Change = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Change, LayoutProblem)> = vec![
            (
                "projects mount",
                Box::new(|c| {
                    c["Mounts"].as_array_mut().unwrap().push(json!({"Type": "bind", "Source": "/x", "Destination": "/home/gem/projects", "RW": true}))
                }),
                LayoutProblem::ProjectsMount,
            ),
            (
                "nested user-data mount",
                Box::new(|c| {
                    c["Mounts"].as_array_mut().unwrap().push(json!({"Type": "bind", "Source": "/x", "Destination": "/home/gem/user-data/projects/a", "RW": true}))
                }),
                LayoutProblem::NestedMount("/home/gem/user-data/projects/a".into()),
            ),
            (
                "writable skills",
                Box::new(|c| c["Mounts"][1]["RW"] = json!(true)),
                LayoutProblem::Writable("/home/gem/skills".into()),
            ),
            (
                "a read-only workspace",
                Box::new(|c| c["Mounts"][0]["RW"] = json!(false)),
                LayoutProblem::ReadOnly(USER_DATA.into()),
            ),
            (
                "a workspace other than its label's",
                Box::new(|c| {
                    c["Mounts"][0]["Source"] = json!("/data/user-data/shared/bob/workspace")
                }),
                LayoutProblem::BadLabel(LABEL_USER_WORKSPACE),
            ),
            (
                "a layout warren does not know",
                Box::new(|c| c["Config"]["Labels"][LABEL_LAYOUT] = json!("e2b-desktop")),
                LayoutProblem::BadLabel(LABEL_LAYOUT),
            ),
            (
                "the DeerFlow layout's mount in an ARS container",
                Box::new(|c| {
                    c["Mounts"].as_array_mut().unwrap().push(json!({"Type": "bind", "Source": "/x", "Destination": "/mnt/user-data", "RW": true}))
                }),
                LayoutProblem::UnexpectedMount("/mnt/user-data".into()),
            ),
            (
                "the Docker socket",
                Box::new(|c| {
                    c["Mounts"].as_array_mut().unwrap().push(json!({"Type": "bind", "Source": "/var/run/docker.sock", "Destination": "/var/run/docker.sock", "RW": true}))
                }),
                LayoutProblem::UnexpectedMount("/var/run/docker.sock".into()),
            ),
            (
                "a volume at user-data",
                Box::new(|c| c["Mounts"][0]["Type"] = json!("volume")),
                LayoutProblem::UnexpectedMount(USER_DATA.into()),
            ),
            (
                "no user-data",
                Box::new(|c| {
                    c["Mounts"].as_array_mut().unwrap().remove(0);
                }),
                LayoutProblem::MissingMounts,
            ),
            (
                "privileged",
                Box::new(|c| c["HostConfig"]["Privileged"] = json!(true)),
                LayoutProblem::Privileges,
            ),
            (
                "a capability added",
                Box::new(|c| c["HostConfig"]["CapAdd"] = json!(["SYS_ADMIN"])),
                LayoutProblem::Privileges,
            ),
            (
                "a writable root",
                Box::new(|c| c["HostConfig"]["ReadonlyRootfs"] = json!(false)),
                LayoutProblem::Privileges,
            ),
            (
                "an application network",
                Box::new(|c| c["HostConfig"]["NetworkMode"] = json!("app_default")),
                LayoutProblem::Network("app_default".into()),
            ),
            (
                "published ports",
                Box::new(|c| {
                    c["HostConfig"]["PortBindings"] = json!({"80/tcp": [{"HostPort": "8080"}]})
                }),
                LayoutProblem::PublishedPorts,
            ),
            (
                "another instance",
                Box::new(|c| c["Config"]["Labels"][LABEL_INSTANCE] = json!("i2")),
                LayoutProblem::ForeignInstance,
            ),
            (
                "a sandbox id that is not its uid and scope's",
                Box::new(|c| c["Config"]["Labels"][LABEL_UID] = json!("mallory")),
                LayoutProblem::BadLabel(LABEL_SANDBOX),
            ),
            (
                "an image other than its label",
                Box::new(|c| c["Config"]["Image"] = json!("other:1")),
                LayoutProblem::BadLabel(LABEL_IMAGE),
            ),
            (
                "no generation",
                Box::new(|c| {
                    c["Config"]["Labels"]
                        .as_object_mut()
                        .unwrap()
                        .remove(LABEL_GENERATION);
                }),
                LayoutProblem::MissingLabel(LABEL_GENERATION),
            ),
        ];
        for (what, change, expected) in cases {
            let mut value = container(&spec);
            change(&mut value);
            assert_eq!(read(value).err(), Some(expected), "{what}");
        }
    }

    #[test]
    fn a_sandbox_with_egress_must_be_on_its_own_network() {
        let mut spec = spec();
        spec.binding.network = NetworkPolicy::Open { deny: vec![] };
        let mut value = container(&spec);
        value["HostConfig"]["NetworkMode"] = json!(format!("warren-i1-{}", spec.sandbox));
        assert!(read(value.clone()).is_ok());
        value["HostConfig"]["NetworkMode"] = json!("bridge");
        assert_eq!(
            read(value).err(),
            Some(LayoutProblem::Network("bridge".into()))
        );
    }

    #[test]
    fn an_ars_container_made_before_layouts_reads_back_as_the_default_layout() {
        let spec = spec();
        let mut value = container(&spec);
        let labels = value["Config"]["Labels"].as_object_mut().unwrap();
        for label in [LABEL_LAYOUT, LABEL_USER_WORKSPACE, LABEL_SKILL_PROJECTION] {
            labels.remove(label);
        }
        let identity = read(value).unwrap();
        assert_eq!(identity.spec.binding.layout, LayoutName::Ars);
        assert!(identity.matches(&spec), "its trees come from its binds");
    }

    #[test]
    fn a_deerflow_container_reads_back_with_its_staged_binds_and_its_trees_from_the_labels() {
        let spec = deerflow_spec();
        let identity = read(container(&spec)).unwrap();
        assert_eq!(identity.spec.binding.layout, LayoutName::Deerflow);
        assert!(identity.matches(&spec));
        assert_eq!(identity.spec.user_workspace, spec.user_workspace);
        assert_eq!(identity.spec.skill_projection, spec.skill_projection);
        let ars = RuntimeSpec {
            binding: warren_core::Binding {
                layout: LayoutName::Ars,
                ..spec.clone().binding
            },
            ..spec.clone()
        };
        assert!(!identity.matches(&ars), "another layout is another runtime");
        let other_thread = RuntimeSpec {
            binding: warren_core::Binding {
                workdir: Workdir::new("threads/t2/user-data").unwrap(),
                ..spec.clone().binding
            },
            ..spec.clone()
        };
        assert!(!identity.matches(&other_thread), "another workdir too");
        let other_workspace = RuntimeSpec {
            user_workspace: "/data/user-data/shared/bob/workspace".into(),
            ..spec
        };
        assert!(!identity.matches(&other_workspace), "another tree too");
    }

    #[test]
    fn a_deerflow_container_with_anything_but_exactly_its_three_mounts_is_refused() {
        let spec = deerflow_spec();
        let workdir_bind = json!({"Type": "bind", "Source": "/data/user-data/shared/alice/workspace/threads/t1/user-data", "Destination": "/mnt/user-data", "RW": true});
        type Change = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(&str, Change, LayoutProblem)> = vec![
            (
                "the workdir bound from its host path, which dockerd would walk",
                Box::new(move |c| c["Mounts"][0] = workdir_bind.clone()),
                LayoutProblem::Unstaged("/mnt/user-data".into()),
            ),
            (
                "another sandbox's staging directory",
                Box::new(|c| {
                    c["Mounts"][2]["Source"] =
                        json!(format!("{BINDS}/sbx-0123456789abcdef01234567/2"))
                }),
                LayoutProblem::Unstaged("/mnt/skills/custom".into()),
            ),
            (
                "writable public skills",
                Box::new(|c| c["Mounts"][1]["RW"] = json!(true)),
                LayoutProblem::Writable("/mnt/skills/public".into()),
            ),
            (
                "writable custom skills",
                Box::new(|c| c["Mounts"][2]["RW"] = json!(true)),
                LayoutProblem::Writable("/mnt/skills/custom".into()),
            ),
            (
                "no custom skills",
                Box::new(|c| {
                    c["Mounts"].as_array_mut().unwrap().remove(2);
                }),
                LayoutProblem::MissingMounts,
            ),
            (
                "the whole workspace beside it",
                Box::new(|c| {
                    c["Mounts"].as_array_mut().unwrap().push(json!({"Type": "bind", "Source": "/data/user-data/shared/alice/workspace", "Destination": USER_DATA, "RW": true}))
                }),
                LayoutProblem::UnexpectedMount(USER_DATA.into()),
            ),
            (
                "a mount inside the workdir",
                Box::new(|c| {
                    c["Mounts"].as_array_mut().unwrap().push(json!({"Type": "bind", "Source": "/x", "Destination": "/mnt/user-data/outputs", "RW": true}))
                }),
                LayoutProblem::NestedMount("/mnt/user-data/outputs".into()),
            ),
            (
                "no user-workspace label",
                Box::new(|c| {
                    c["Config"]["Labels"]
                        .as_object_mut()
                        .unwrap()
                        .remove(LABEL_USER_WORKSPACE);
                }),
                LayoutProblem::MissingLabel(LABEL_USER_WORKSPACE),
            ),
            (
                "its mounts read as the ARS layout's",
                Box::new(|c| c["Config"]["Labels"][LABEL_LAYOUT] = json!("ars")),
                LayoutProblem::UnexpectedMount("/mnt/user-data".into()),
            ),
        ];
        for (what, change, expected) in cases {
            let mut value = container(&spec);
            change(&mut value);
            assert_eq!(read(value).err(), Some(expected), "{what}");
        }
    }
}
