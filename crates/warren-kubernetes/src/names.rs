//! Names warren gives Kubernetes objects, and the labels and annotations that carry a
//! sandbox's identity (I16): written by [`crate::manifests`], read back by
//! [`crate::identity`], in one place so the two never drift apart.
//!
//! Labels are what selectors use (Services, NetworkPolicies, `discover`'s listing): only
//! values Kubernetes accepts as label values (63 characters of `[A-Za-z0-9._-]`). A uid
//! does not fit (a safe uid may be 64 characters, or `uid-<64 hex>`; a plain uid anything),
//! so the identity proper is in annotations, which take any string.

use warren_core::{DataLayout, SafeUid, SandboxId};

use crate::Error;

/// Label every object warren makes carries: `warren`.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label saying what an object is to warren (`sandbox` for a sandbox's objects).
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Label naming the warren instance that owns an object.
pub const LABEL_INSTANCE: &str = "warren.dev/instance";
/// Label naming the sandbox an object serves.
pub const LABEL_SANDBOX: &str = "warren.dev/sandbox";

/// The value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "warren";
/// The value of [`LABEL_COMPONENT`] on a sandbox's objects.
pub const COMPONENT_SANDBOX: &str = "sandbox";

/// Annotation: the uid as given (any string).
pub const ANNOTATION_UID: &str = "warren.dev/uid";
/// Annotation: the uid's directory name (I3), which the subPaths use.
pub const ANNOTATION_SAFE_UID: &str = "warren.dev/safe-uid";
/// Annotation: the runtime scope.
pub const ANNOTATION_SCOPE: &str = "warren.dev/runtime-scope";
/// Annotation: the workdir, relative to the UserWorkspace.
pub const ANNOTATION_WORKDIR: &str = "warren.dev/workdir";
/// Annotation: which start of the sandbox the pod is.
pub const ANNOTATION_GENERATION: &str = "warren.dev/generation";
/// Annotation: the layout (`ars`, `deerflow`, `e2b`).
pub const ANNOTATION_LAYOUT: &str = "warren.dev/layout";
/// Annotation: the network policy, as JSON (`{"mode":"none"}`).
pub const ANNOTATION_NETWORK: &str = "warren.dev/network";
/// Annotation: the sandbox's image, which the main container must run.
pub const ANNOTATION_IMAGE: &str = "warren.dev/image";
/// Annotation: whether the sandbox's commands get the global and the uid's agent
/// environments (`true`, `false`); a pod without it is taken for `true`, which can only
/// refuse a pod whose record says otherwise, never adopt one wrongly.
pub const ANNOTATION_INHERIT_ENV: &str = "warren.dev/inherit-env";
/// Annotation: the persistent mounts, as JSON, which the main container's mounts must be.
pub const ANNOTATION_MOUNTS: &str = "warren.dev/mounts";

/// The root init container: the ownership migration ([`crate::prepare`](mod@crate::prepare)).
pub const CONTAINER_PREPARE: &str = "prepare";
/// The init container copying the agent bundle into its `emptyDir`.
pub const CONTAINER_BUNDLE: &str = "agent-bundle";
/// The sandbox's one container, running the agent from the bundle.
pub const CONTAINER_SANDBOX: &str = "sandbox";

/// The volume of the USER_DATA claim.
pub const VOLUME_USER_DATA: &str = "user-data";
/// The volume of the SKILLS claim.
pub const VOLUME_SKILLS: &str = "skills";
/// The size-limited `emptyDir` at the home, for a layout whose home is ephemeral (not
/// E2B's, whose home is the workdir's subPath).
pub const VOLUME_HOME: &str = "home";
/// The size-limited `emptyDir` at `/tmp`.
pub const VOLUME_TMP: &str = "tmp";
/// The `emptyDir` holding the agent bundle.
pub const VOLUME_AGENT: &str = "agent";
/// The `emptyDir` holding warren's `/etc/passwd` and `/etc/group`, for a layout whose user
/// images do not name (E2B's `user`): written by the prepare container
/// ([`crate::accounts`]), shown read-only by subPath in the sandbox container.
pub const VOLUME_ACCOUNTS: &str = "accounts";

/// Where the agent bundle appears (read-only in the sandbox container), as on Docker.
pub const AGENT_MOUNT: &str = "/opt/warren-agent";
/// The ephemeral home of the layouts that have one (ARS and DeerFlow, I7): a reserved
/// target. A pod's home `emptyDir` is mounted at its layout's own `home`.
pub const HOME: &str = "/home/gem";
/// The sandbox's `/tmp`.
pub const TMP: &str = "/tmp";
/// Where the prepare container sees the uid's subtree of USER_DATA.
pub const PREPARE_ROOT: &str = "/warren/user-data";
/// Where the prepare container sees the accounts `emptyDir` it writes into.
pub const PREPARE_ACCOUNTS: &str = "/warren/accounts";
/// The variable the agent's per-sandbox key arrives in (the agent reads and scrubs it).
pub const AGENT_KEY_ENV: &str = "WARREN_AGENT_KEY";
/// The name of the agent's port on the container and the Service.
pub const AGENT_PORT_NAME: &str = "agent";
/// The legacy mount of the workspace's projects, refused for reuse (I16).
pub const LEGACY_PROJECTS: &str = "/home/gem/projects";

/// Longest DNS-1123 label (object names that must be labels: Services).
pub const MAX_NAME: usize = 63;

/// The uid's subtree of the USER_DATA claim (`shared/<safe_uid>`): what the prepare
/// container migrates. The claim's root is `<workspace>/user-data`
/// ([`crate::deploy`] mounts it there), so this is [`DataLayout`]'s path less `user-data/`.
pub fn user_data_subtree(uid: &SafeUid) -> String {
    let workspace = user_workspace_sub_path(uid);
    workspace
        .strip_suffix(&format!("/{WORKSPACE_DIR}"))
        .expect("the UserWorkspace is <subtree>/workspace")
        .to_owned()
}

/// The UserWorkspace's subPath in the USER_DATA claim: `shared/<safe_uid>/workspace`.
pub fn user_workspace_sub_path(uid: &SafeUid) -> String {
    let relative = DataLayout::user_workspace_relative(uid);
    relative
        .strip_prefix("user-data/")
        .expect("UserWorkspaces live under user-data/")
        .to_owned()
}

/// The skill projection's subPath in the SKILLS claim: `skill-projections/<safe_uid>`
/// (the claim's root is the workspace directory itself, see [`crate::deploy`]).
pub fn skill_projection_sub_path(uid: &SafeUid) -> String {
    DataLayout::skill_projection_relative(uid)
}

/// The name of the UserWorkspace inside the uid's subtree.
pub const WORKSPACE_DIR: &str = "workspace";

/// Checks an instance name: a DNS-1123 label (lowercase letters, digits and `-`, starting
/// and ending with a letter or digit, at most 63 characters), so it is a label value and a
/// part of object names.
pub fn check_instance(instance: &str) -> Result<(), Error> {
    match dns_label_problem(instance) {
        Some(reason) => Err(Error::InvalidInstance {
            instance: instance.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Why `value` is not a DNS-1123 label, if it is not.
pub(crate) fn dns_label_problem(value: &str) -> Option<&'static str> {
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return Some("it is empty");
    }
    if bytes.len() > MAX_NAME {
        return Some("it is longer than 63 characters");
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    {
        return Some("only lowercase letters, digits and '-' may appear");
    }
    if !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return Some("it must start and end with a letter or digit");
    }
    None
}

/// The name of a sandbox's Pod, Service and NetworkPolicy: `warren-<instance>-<sandbox>`,
/// a DNS-1123 label starting with a letter (so also a valid Service name, RFC 1035).
///
/// A sandbox id is 28 characters, so an instance of up to 27 fits whole; a longer one is
/// cut and followed by 8 hex digits of its BLAKE3 hash, so two instances sharing a long
/// prefix still name their objects apart. The same inputs always give the same name.
pub fn object_name(instance: &str, sandbox: &SandboxId) -> String {
    let whole = format!("warren-{instance}-{sandbox}");
    if whole.len() <= MAX_NAME {
        return whole;
    }
    let hash = blake3::hash(instance.as_bytes()).to_hex();
    let room = MAX_NAME - "warren-".len() - "-".len() - 8 - "-".len() - sandbox.as_str().len();
    let cut = instance[..room.min(instance.len())].trim_end_matches('-');
    format!("warren-{cut}-{}-{sandbox}", &hash[..8])
}

#[cfg(test)]
mod tests {
    use warren_core::{RuntimeScope, Uid};

    use super::*;

    fn sandbox() -> SandboxId {
        SandboxId::derive(
            &Uid::new("alice").unwrap(),
            &RuntimeScope::new("t").unwrap(),
        )
    }

    #[test]
    fn object_names_are_dns_labels_whatever_the_instance_length() {
        for instance in ["a", "i1", &"x".repeat(27), &"y".repeat(28), &"z".repeat(63)] {
            let name = object_name(instance, &sandbox());
            assert!(dns_label_problem(&name).is_none(), "{name}");
            assert!(name.starts_with("warren-"));
            assert!(name.ends_with(sandbox().as_str()), "{name}");
        }
        assert_eq!(
            object_name("i1", &sandbox()),
            format!("warren-i1-{}", sandbox())
        );
    }

    #[test]
    fn long_instances_sharing_a_prefix_get_different_names() {
        let a = format!("{}-a", "p".repeat(40));
        let b = format!("{}-b", "p".repeat(40));
        assert_ne!(object_name(&a, &sandbox()), object_name(&b, &sandbox()));
        assert_eq!(object_name(&a, &sandbox()), object_name(&a, &sandbox()));
    }

    #[test]
    fn instance_names_must_be_dns_labels() {
        for bad in ["", "A", "a_b", "-a", "a-", &"a".repeat(64), "a.b"] {
            assert!(check_instance(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "i1", "warren-prod", &"a".repeat(63)] {
            check_instance(good).unwrap();
        }
    }

    #[test]
    fn sub_paths_follow_the_data_layout_under_the_claim_roots() {
        let alice = Uid::new("alice").unwrap().safe();
        assert_eq!(user_workspace_sub_path(&alice), "shared/alice/workspace");
        assert_eq!(user_data_subtree(&alice), "shared/alice");
        assert_eq!(skill_projection_sub_path(&alice), "skill-projections/alice");
    }
}
