//! The sandbox's NetworkPolicy: ingress only to the agent port from warren, egress only to
//! warren's proxy or nowhere.

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy as K8sNetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule,
    NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::check::cidr_of;
use super::meta;
use super::plan::{Peer, PodPlan};
use crate::Error;

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
pub(super) fn network_policy(plan: &PodPlan) -> Result<K8sNetworkPolicy, Error> {
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
