//! The sandbox's Service: how warren reaches the agent port of exactly its pod.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta;
use super::plan::PodPlan;
use crate::names::*;

pub(super) fn service(plan: &PodPlan) -> Service {
    Service {
        metadata: meta(plan),
        spec: Some(ServiceSpec {
            type_: Some(plan.service_type.as_str().to_owned()),
            selector: Some(plan.selector()),
            ports: Some(vec![ServicePort {
                name: Some(AGENT_PORT_NAME.to_owned()),
                port: i32::from(plan.agent.port),
                target_port: Some(IntOrString::Int(i32::from(plan.agent.port))),
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}
