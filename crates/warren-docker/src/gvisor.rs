//! The gVisor tier on Docker (issue 19): a container run by a runtime dockerd has
//! registered for runsc, with every setting the kernel tier has.
//!
//! What differs from a kernel-tier container, and why:
//! - the runtime: the operator's registered runsc (default name `runsc`), whose arguments
//!   must include `--network=none` (the Sentry's netstack is not set up on every host, and
//!   a runtime gets no route of its own anyway, I23) and `--host-uds=create` (the agent's
//!   control socket is made inside and connected to from the host);
//! - the agent starts as the *Sentry's* root with exactly [`AGENT_CAPABILITIES`]: to mount
//!   the Sentry's cgroups that hold each command's tree (no subreaper exists there but PID
//!   1's) and to make each command the sandbox user, 1000:1000 with no capability;
//! - the host's cgroups hold the Sentry, so the sandbox's own bounds are the agent's
//!   (`RLIMIT_NPROC`, `RLIMIT_AS`) and the host's are sized around them
//!   ([`warren_agent::sentry_limits`]).

use std::collections::HashMap;

use bollard::models::Runtime;

/// The capabilities (inside the Sentry) the agent of a gVisor container starts with; it
/// drops `SYS_ADMIN` and `SETPCAP` once it has mounted its cgroups and emptied the
/// bounding set its commands inherit. `DAC_OVERRIDE`: the Sentry's cgroupfs root is mode
/// 0555 even to root.
pub(crate) const AGENT_CAPABILITIES: [&str; 6] = [
    "SYS_ADMIN",
    "SETPCAP",
    "DAC_OVERRIDE",
    "SETUID",
    "SETGID",
    "KILL",
];

/// The runtime arguments warren relies on.
const REQUIRED_ARGS: [&str; 2] = ["--network=none", "--host-uds=create"];

/// Why the runtime dockerd registered as `name` cannot serve the gVisor tier, in words an
/// operator can act on; `None` when it can.
pub(crate) fn runtime_problem(
    runtimes: Option<&HashMap<String, Runtime>>,
    name: &str,
) -> Option<String> {
    let registration = format!(
        "register runsc in /etc/docker/daemon.json as \"runtimes\": {{\"{name}\": {{\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--platform=ptrace\", \"--network=none\", \"--host-uds=create\"]}}}} and restart dockerd"
    );
    let Some(runtime) = runtimes.and_then(|r| r.get(name)) else {
        return Some(format!(
            "the Docker engine has no runtime named {name:?}: {registration}"
        ));
    };
    let args = runtime.runtime_args.clone().unwrap_or_default();
    let missing: Vec<&str> = REQUIRED_ARGS
        .into_iter()
        .filter(|required| !args.iter().any(|a| a == required))
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "the Docker engine's runtime {name:?} lacks {}: {registration}",
            missing.join(" and ")
        ));
    }
    let path = runtime.path.clone().unwrap_or_else(|| name.to_owned());
    if !path.contains("runsc") {
        return Some(format!(
            "the Docker engine's runtime {name:?} runs {path:?}, not runsc: {registration}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtimes(path: &str, args: &[&str]) -> HashMap<String, Runtime> {
        HashMap::from([(
            "runsc".to_owned(),
            Runtime {
                path: Some(path.to_owned()),
                runtime_args: Some(args.iter().map(|a| (*a).to_owned()).collect()),
                status: None,
            },
        )])
    }

    #[test]
    fn a_registered_runsc_with_the_required_arguments_serves_the_gvisor_tier() {
        let registered = runtimes(
            "/usr/bin/runsc",
            &["--platform=ptrace", "--network=none", "--host-uds=create"],
        );
        assert_eq!(runtime_problem(Some(&registered), "runsc"), None);
    }

    #[test]
    fn a_missing_or_misconfigured_runtime_is_named_with_what_to_do() {
        let missing = runtime_problem(None, "runsc").unwrap();
        assert!(missing.contains("no runtime named \"runsc\""), "{missing}");
        assert!(missing.contains("daemon.json"), "{missing}");
        let networked = runtimes("/usr/bin/runsc", &["--host-uds=create"]);
        let problem = runtime_problem(Some(&networked), "runsc").unwrap();
        assert!(problem.contains("lacks --network=none"), "{problem}");
        let no_uds = runtimes("/usr/bin/runsc", &["--network=none"]);
        let problem = runtime_problem(Some(&no_uds), "runsc").unwrap();
        assert!(problem.contains("lacks --host-uds=create"), "{problem}");
        let other = runtimes("/usr/bin/crun", &["--network=none", "--host-uds=create"]);
        let problem = runtime_problem(Some(&other), "runsc").unwrap();
        assert!(problem.contains("not runsc"), "{problem}");
    }
}
