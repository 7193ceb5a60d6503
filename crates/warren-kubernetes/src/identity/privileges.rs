//! The privileges a pod may hold: warren's pod user, no namespace of the node, no token,
//! capabilities dropped (the prepare container's own set at most), no environment from
//! other objects.

use k8s_openapi::api::core::v1::{Container, PodSpec, SecurityContext};

use crate::manifests::{PREPARE_CAPABILITIES, SANDBOX_ID};
use crate::names::*;
use crate::Error;

pub(super) fn check_pod_privileges(spec: &PodSpec) -> Result<(), Error> {
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

pub(super) fn check_container_privileges(
    spec: &PodSpec,
    container: &Container,
) -> Result<(), Error> {
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

pub(super) fn check_sandbox_env(container: &Container) -> Result<(), Error> {
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::identity::tests::{decide_on, plan, pod_value, read};
    use crate::identity::{Decision, PodIdentity};
    use crate::names::CONTAINER_PREPARE;
    use crate::Error;

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
}
