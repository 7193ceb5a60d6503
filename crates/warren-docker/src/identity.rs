//! A container's identity: the labels warren writes, and the checks that a container found
//! on the engine is exactly what warren would have made for its sandbox (I16).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use bollard::models::ContainerInspectResponse;
use warren_backend::{BackendKind, RuntimeSpec};
use warren_core::{NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};

use crate::{AGENT_MOUNT, SOCKET_MOUNT};

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

const USER_DATA: &str = "/home/gem/user-data";
const SKILLS: &str = "/home/gem/skills";

/// What a live container is, as far as warren is concerned.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// The spec it was created from (its mounts as the engine reports them).
    pub spec: RuntimeSpec,
    /// The engine says it runs.
    pub running: bool,
    /// The agent's host pid and birth (see `warren_isolation::client::process_birth`),
    /// once known: how its `/home/gem` is reached for snapshots.
    pub agent: Option<(i32, String)>,
}

impl Identity {
    /// Whether a container of this identity serves `spec`: the same generation and the
    /// same binding (uid, scope, workdir, network, image and both mounts).
    pub fn matches(&self, spec: &RuntimeSpec) -> bool {
        let ours = &self.spec;
        ours.sandbox == spec.sandbox
            && ours.generation == spec.generation
            && ours.uid == spec.uid
            && ours.runtime_scope == spec.runtime_scope
            && ours.workdir == spec.workdir
            && ours.network == spec.network
            && ours.image == spec.image
            && ours.user_workspace == spec.user_workspace
            && ours.skill_projection == spec.skill_projection
    }

    /// Reads a container back, refusing anything warren would not have made: another
    /// instance's, missing or unparsable labels, and every layout other than exactly the
    /// two persistent binds with the right modes (I16).
    pub fn from_container(
        container: &ContainerInspectResponse,
        instance: &str,
        env: BTreeMap<String, String>,
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

        let host = container.host_config.clone().unwrap_or_default();
        if host.privileged == Some(true)
            || !host.cap_drop.unwrap_or_default().iter().any(|c| c == "ALL")
            || !host.cap_add.unwrap_or_default().is_empty()
            || host.readonly_rootfs != Some(true)
            || !host
                .security_opt
                .unwrap_or_default()
                .iter()
                .any(|o| o == "no-new-privileges:true")
        {
            return Err(LayoutProblem::Privileges);
        }
        let expected_network = if network.has_egress() {
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

        let mut user_workspace = None;
        let mut skill_projection = None;
        for mount in container.mounts.clone().unwrap_or_default() {
            let target = mount.destination.clone().unwrap_or_default();
            let source = mount.source.clone().map(PathBuf::from);
            let writable = mount.rw.unwrap_or(true);
            let is_bind = mount.typ.as_deref() == Some("bind");
            match target.as_str() {
                USER_DATA if is_bind && writable && user_workspace.is_none() => {
                    user_workspace = source;
                }
                SKILLS if is_bind && !writable && skill_projection.is_none() => {
                    skill_projection = source;
                }
                SKILLS if writable => return Err(LayoutProblem::WritableSkills),
                AGENT_MOUNT if is_bind && !writable => {}
                SOCKET_MOUNT if is_bind => {}
                "/home/gem/projects" => return Err(LayoutProblem::ProjectsMount),
                t if t.starts_with("/home/gem/user-data/") => {
                    return Err(LayoutProblem::NestedUserData(t.to_owned()))
                }
                t => return Err(LayoutProblem::UnexpectedMount(t.to_owned())),
            }
        }
        let (Some(user_workspace), Some(skill_projection)) = (user_workspace, skill_projection)
        else {
            return Err(LayoutProblem::MissingMounts);
        };
        let running = container
            .state
            .as_ref()
            .and_then(|s| s.running)
            .unwrap_or(false);
        Ok(Self {
            spec: RuntimeSpec {
                sandbox,
                backend: BackendKind::Docker,
                image: Some(image),
                generation,
                uid,
                runtime_scope,
                workdir,
                user_workspace,
                skill_projection,
                env,
                network,
                seed: None,
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
    /// Legacy layout: an old `/home/gem/projects` mount.
    #[error("legacy layout: it mounts /home/gem/projects")]
    ProjectsMount,
    /// Legacy layout: sub-mounts inside `/home/gem/user-data`.
    #[error("legacy layout: a nested mount at {0}")]
    NestedUserData(String),
    /// Legacy layout: a writable skills mount.
    #[error("legacy layout: /home/gem/skills is writable")]
    WritableSkills,
    /// A mount warren never makes.
    #[error("it mounts {0}, which warren never mounts")]
    UnexpectedMount(String),
    /// One of the two persistent mounts is missing.
    #[error("it lacks the user-data or skills mount")]
    MissingMounts,
}

/// The labels of a sandbox's container.
pub(crate) fn container_labels(instance: &str, spec: &RuntimeSpec) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_INSTANCE.to_owned(), instance.to_owned()),
        (LABEL_SANDBOX.to_owned(), spec.sandbox.to_string()),
        (LABEL_GENERATION.to_owned(), spec.generation.to_string()),
        (LABEL_UID.to_owned(), spec.uid.to_string()),
        (LABEL_SCOPE.to_owned(), spec.runtime_scope.to_string()),
        (LABEL_WORKDIR.to_owned(), spec.workdir.to_string()),
        (
            LABEL_NETWORK.to_owned(),
            serde_json::to_string(&spec.network).expect("a network policy serialises"),
        ),
        (
            LABEL_IMAGE.to_owned(),
            spec.image.clone().unwrap_or_default(),
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
            backend: BackendKind::Docker,
            image: Some("warren-test:1".into()),
            generation: 3,
            uid,
            runtime_scope,
            workdir: Workdir::new("projects/a").unwrap(),
            user_workspace: "/data/user-data/shared/alice/workspace".into(),
            skill_projection: "/data/skill-projections/alice".into(),
            env: BTreeMap::new(),
            network: NetworkPolicy::None,
            seed: None,
        }
    }

    /// What the engine reports for a container warren made from `spec`.
    fn container(spec: &RuntimeSpec) -> serde_json::Value {
        json!({
            "Name": format!("/warren-i1-{}", spec.sandbox),
            "State": {"Running": true},
            "Config": {
                "Image": spec.image,
                "Labels": container_labels("i1", spec),
            },
            "HostConfig": {
                "CapDrop": ["ALL"],
                "ReadonlyRootfs": true,
                "Privileged": false,
                "SecurityOpt": ["no-new-privileges:true"],
                "NetworkMode": "none",
            },
            "Mounts": [
                {"Type": "bind", "Source": spec.user_workspace, "Destination": USER_DATA, "RW": true},
                {"Type": "bind", "Source": spec.skill_projection, "Destination": SKILLS, "RW": false},
                {"Type": "bind", "Source": "/data/docker/agent-x", "Destination": AGENT_MOUNT, "RW": false},
                {"Type": "bind", "Source": "/data/docker/sockets/x", "Destination": SOCKET_MOUNT, "RW": true},
            ],
        })
    }

    fn read(value: serde_json::Value) -> Result<Identity, LayoutProblem> {
        let inspected: ContainerInspectResponse = serde_json::from_value(value).unwrap();
        Identity::from_container(&inspected, "i1", BTreeMap::new())
    }

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
        other.image = Some("warren-test:2".into());
        assert!(
            !identity.matches(&other),
            "another image is another runtime"
        );
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
                LayoutProblem::NestedUserData("/home/gem/user-data/projects/a".into()),
            ),
            (
                "writable skills",
                Box::new(|c| c["Mounts"][1]["RW"] = json!(true)),
                LayoutProblem::WritableSkills,
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
        spec.network = NetworkPolicy::Open;
        let mut value = container(&spec);
        value["HostConfig"]["NetworkMode"] = json!(format!("warren-i1-{}", spec.sandbox));
        assert!(read(value.clone()).is_ok());
        value["HostConfig"]["NetworkMode"] = json!("bridge");
        assert_eq!(
            read(value).err(),
            Some(LayoutProblem::Network("bridge".into()))
        );
    }
}
