//! Services' defaults, clusterIP and nodePort allocation.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use serde_json::{json, Value};

use super::error::{ApiError, FieldError};
use super::store::{Kind, Store};
use super::{NODE_PORTS, SERVICE_CIDR_BASE};

/// Fills a service's defaults and allocates its clusterIP and node ports (keeping those of
/// `current` on an update); `422` for a taken or out-of-range one or a changed clusterIP.
pub(super) fn allocate_service(
    store: &mut Store,
    name: &str,
    namespace: &str,
    service: &mut Value,
    current: Option<&Value>,
) -> Result<(), ApiError> {
    let invalid = |cause| ApiError::invalid(Kind::Service, name, vec![cause]);
    let mut used_ips = HashSet::new();
    let mut used_ports = HashSet::new();
    for ((kind, ns, other), object) in &store.objects {
        if *kind != Kind::Service || (ns == namespace && other == name) {
            continue;
        }
        if let Some(ip) = object["spec"]["clusterIP"].as_str() {
            used_ips.insert(ip.to_owned());
        }
        for port in object["spec"]["ports"].as_array().into_iter().flatten() {
            if let Some(port) = port["nodePort"].as_u64() {
                used_ports.insert(port);
            }
        }
    }
    if !service["spec"].is_object() {
        service["spec"] = json!({});
    }
    let spec = &mut service["spec"];
    let service_type = spec["type"].as_str().unwrap_or("ClusterIP").to_owned();
    spec["type"] = json!(service_type);
    if spec["sessionAffinity"].is_null() {
        spec["sessionAffinity"] = json!("None");
    }
    if service_type == "ExternalName" {
        return Ok(());
    }
    let old_ip = current.and_then(|c| c["spec"]["clusterIP"].as_str());
    let given_ip = spec["clusterIP"].as_str().filter(|ip| !ip.is_empty());
    let ip = match (given_ip, old_ip) {
        (Some(given), Some(old)) if given != old => {
            return Err(invalid(FieldError::invalid(
                "spec.clusterIPs[0]",
                given,
                "may not change once set",
            )))
        }
        (_, Some(old)) => old.to_owned(),
        (Some("None"), None) => "None".to_owned(),
        (Some(given), None) => {
            let in_range = given
                .parse::<Ipv4Addr>()
                .is_ok_and(|ip| u32::from(ip) >> 16 == SERVICE_CIDR_BASE >> 16);
            if !in_range {
                return Err(invalid(FieldError::invalid(
                    "spec.clusterIPs",
                    given,
                    "failed to allocate IP: the provided IP is not in the valid range. The range of valid IPs is 10.96.0.0/16",
                )));
            }
            if used_ips.contains(given) {
                return Err(invalid(FieldError::invalid(
                    "spec.clusterIPs",
                    given,
                    "failed to allocate IP: provided IP is already allocated",
                )));
            }
            given.to_owned()
        }
        (None, None) => loop {
            let offset = store.next_ip;
            store.next_ip = if offset >= 0xfffe { 1 } else { offset + 1 };
            let ip = Ipv4Addr::from(SERVICE_CIDR_BASE + offset).to_string();
            if !used_ips.contains(&ip) {
                break ip;
            }
        },
    };
    spec["clusterIP"] = json!(ip);
    spec["clusterIPs"] = json!([ip]);
    if ip != "None" {
        spec["ipFamilies"] = json!(["IPv4"]);
        spec["ipFamilyPolicy"] = json!("SingleStack");
    }
    if spec["internalTrafficPolicy"].is_null() {
        spec["internalTrafficPolicy"] = json!("Cluster");
    }
    let node_ports = service_type == "NodePort" || service_type == "LoadBalancer";
    if node_ports && spec["externalTrafficPolicy"].is_null() {
        spec["externalTrafficPolicy"] = json!("Cluster");
    } else if !node_ports {
        if let Some(spec) = spec.as_object_mut() {
            spec.remove("externalTrafficPolicy");
        }
    }
    let old_ports: Vec<Value> = current
        .and_then(|c| c["spec"]["ports"].as_array().cloned())
        .unwrap_or_default();
    let mut taken = used_ports;
    let ports = spec["ports"].as_array_mut();
    for (index, port) in ports.into_iter().flatten().enumerate() {
        if port["protocol"].is_null() {
            port["protocol"] = json!("TCP");
        }
        if port["targetPort"].is_null() {
            port["targetPort"] = port["port"].clone();
        }
        let field = format!("spec.ports[{index}].nodePort");
        match (node_ports, port["nodePort"].as_u64()) {
            (false, Some(given))
                if old_ports
                    .iter()
                    .any(|old| old["nodePort"].as_u64() == Some(given)) =>
            {
                // Leaving NodePort: the real server drops the ports it had allocated.
                if let Some(port) = port.as_object_mut() {
                    port.remove("nodePort");
                }
            }
            (false, Some(_)) => {
                return Err(invalid(FieldError::forbidden(
                    field,
                    format!("may not be used when `type` is '{service_type}'"),
                )))
            }
            (false, None) => {}
            (true, Some(given)) => {
                let kept = old_ports
                    .iter()
                    .any(|old| old["nodePort"].as_u64() == Some(given));
                if !kept && !NODE_PORTS.contains(&u16::try_from(given).unwrap_or(0)) {
                    return Err(invalid(FieldError::invalid(
                        field,
                        &given.to_string(),
                        "provided port is not in the valid range. The range of valid ports is 30000-32767",
                    )));
                }
                if !taken.insert(given) {
                    return Err(invalid(FieldError::invalid(
                        field,
                        &given.to_string(),
                        "provided port is already allocated",
                    )));
                }
            }
            (true, None) => {
                let old = old_ports
                    .iter()
                    .find(|old| old["port"] == port["port"] && old["protocol"] == port["protocol"]);
                let chosen = match old.and_then(|old| old["nodePort"].as_u64()) {
                    Some(old) if !taken.contains(&old) => old,
                    _ => {
                        let mut tries = 0;
                        loop {
                            let candidate = u64::from(store.next_port);
                            store.next_port = if store.next_port >= *NODE_PORTS.end() {
                                *NODE_PORTS.start()
                            } else {
                                store.next_port + 1
                            };
                            if !taken.contains(&candidate) {
                                break candidate;
                            }
                            tries += 1;
                            if tries > NODE_PORTS.len() {
                                return Err(invalid(FieldError::invalid(
                                    field,
                                    "0",
                                    "failed to allocate a nodePort: range is full",
                                )));
                            }
                        }
                    }
                };
                taken.insert(chosen);
                port["nodePort"] = json!(chosen);
            }
        }
    }
    Ok(())
}
