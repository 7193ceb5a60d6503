//! Refusing a plan Kubernetes would refuse or warren must not run: names, labels, mounts,
//! limits, peers.

use std::net::IpAddr;

use warren_core::LayoutName;

use super::plan::{own_mounts, Claim, Peer, PersistentMount, PodPlan};
use crate::names::{self, *};
use crate::Error;

pub(super) fn check(plan: &PodPlan) -> Result<(), Error> {
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
pub(super) fn cidr_of(value: &str) -> Result<String, Error> {
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
