//! The sandbox's Pod: the prepare and agent-bundle init containers, the sandbox container,
//! their security contexts, resources and volumes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::plan::{empty_dirs, Claim, Limits, PodPlan};
use super::{meta, SANDBOX_ID};
use crate::names::*;

fn quantity(value: u64) -> Quantity {
    Quantity(value.to_string())
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

/// A size-limited `emptyDir`; in memory (a tmpfs) when `memory`.
///
/// The sandbox's writable trees (the home, `/tmp`) are tmpfs, as on the other backends: a
/// kubelet enforces a disk-backed `emptyDir`'s `sizeLimit` only by evicting the pod once it
/// notices (every ten seconds or so), after the writes have succeeded, where a tmpfs ends the
/// write that goes past it with ENOSPC (its size is the `sizeLimit` since Kubernetes 1.22,
/// `SizeMemoryBackedVolumes`) and counts against the pod's memory limit.
fn empty_dir(name: &str, bytes: u64, memory: bool) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(quantity(bytes)),
            medium: memory.then(|| "Memory".to_owned()),
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

pub(super) fn pod(plan: &PodPlan) -> Pod {
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
    volumes.extend(empty_dirs(plan.layout).into_iter().map(|name| match name {
        VOLUME_HOME => empty_dir(name, plan.limits.home_bytes, true),
        VOLUME_TMP => empty_dir(name, plan.limits.tmp_bytes, true),
        VOLUME_ACCOUNTS => empty_dir(name, crate::accounts::VOLUME_BYTES, false),
        _ => empty_dir(name, plan.agent.bundle_bytes, false),
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
