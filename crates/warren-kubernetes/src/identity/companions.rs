//! A pod's companions, its Service and NetworkPolicy: `discover` adopts a pod only beside
//! its own, exactly as warren makes them.

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::api::networking::v1::NetworkPolicy as K8sNetworkPolicy;

use super::sandbox_of;
use crate::manifests::PodPlan;
use crate::Error;

/// Checks a pod's NetworkPolicy: `discover` adopts a pod only with its policy exactly as
/// warren makes it for `expected` (a pod whose policy was deleted or widened would reach
/// what its network forbids); otherwise it removes the pod and its objects.
pub fn check_network_policy(
    found: Option<&K8sNetworkPolicy>,
    expected: &PodPlan,
) -> Result<(), Error> {
    let problem = |problem: &str| Error::Companion {
        kind: "NetworkPolicy",
        problem: problem.to_owned(),
    };
    let found = found.ok_or_else(|| problem("is missing"))?;
    let want = crate::manifests::build(expected)?.network_policy;
    if found.metadata.name != want.metadata.name
        || sandbox_of(&found.metadata, &expected.instance).as_ref() != Some(&expected.sandbox)
    {
        return Err(problem("is another sandbox's"));
    }
    if found.spec != want.spec {
        return Err(problem("is not the one warren makes for it"));
    }
    Ok(())
}

/// Checks a pod's Service: warren's type, selecting exactly the pod, on the agent port.
/// What the API server fills in (cluster IP, node port, session affinity) is not compared.
pub fn check_service(found: Option<&Service>, expected: &PodPlan) -> Result<(), Error> {
    let problem = |problem: &str| Error::Companion {
        kind: "Service",
        problem: problem.to_owned(),
    };
    let found = found.ok_or_else(|| problem("is missing"))?;
    let want = crate::manifests::build(expected)?.service;
    if found.metadata.name != want.metadata.name
        || sandbox_of(&found.metadata, &expected.instance).as_ref() != Some(&expected.sandbox)
    {
        return Err(problem("is another sandbox's"));
    }
    let (found, want) = (
        found.spec.clone().unwrap_or_default(),
        want.spec.unwrap_or_default(),
    );
    if found.type_ != want.type_ {
        return Err(problem("is of another type"));
    }
    if found.selector != want.selector {
        return Err(problem("selects other pods"));
    }
    let ports = |spec: &ServiceSpec| -> Vec<_> {
        spec.ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.clone(),
                    p.port,
                    p.target_port.clone(),
                    p.protocol.clone(),
                )
            })
            .collect()
    };
    if ports(&found) != ports(&want) {
        return Err(problem("serves other ports"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use warren_core::NetworkPolicy;

    use super::*;
    use crate::identity::tests::plan;
    use crate::manifests::build;
    use crate::names::{LABEL_INSTANCE, LABEL_SANDBOX};

    #[test]
    fn a_pod_is_adopted_only_beside_its_own_network_policy_and_service() {
        let plan = plan();
        let objects = build(&plan).unwrap();
        check_network_policy(Some(&objects.network_policy), &plan).unwrap();
        check_service(Some(&objects.service), &plan).unwrap();

        let companion = |kind, problem: &str| {
            Err(Error::Companion {
                kind,
                problem: problem.to_owned(),
            })
        };
        assert_eq!(
            check_network_policy(None, &plan),
            companion("NetworkPolicy", "is missing")
        );
        assert_eq!(
            check_service(None, &plan),
            companion("Service", "is missing")
        );

        // Widened: the same policy with egress anywhere.
        let mut widened = objects.network_policy.clone();
        widened.spec.as_mut().unwrap().egress = Some(vec![Default::default()]);
        assert_eq!(
            check_network_policy(Some(&widened), &plan),
            companion("NetworkPolicy", "is not the one warren makes for it")
        );
        // The policy of the sandbox's former network: another generation's binding.
        let open = PodPlan {
            network: NetworkPolicy::Open { deny: vec![] },
            ..plan.clone()
        };
        assert!(check_network_policy(Some(&objects.network_policy), &open).is_err());
        let mut foreign = objects.network_policy.clone();
        foreign
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_INSTANCE.into(), "i2".into());
        assert_eq!(
            check_network_policy(Some(&foreign), &plan),
            companion("NetworkPolicy", "is another sandbox's")
        );

        // What the API server fills in a Service is not a difference; its selector is.
        let mut service = objects.service.clone();
        let spec = service.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.96.0.12".into());
        spec.session_affinity = Some("None".into());
        check_service(Some(&service), &plan).unwrap();
        service
            .spec
            .as_mut()
            .unwrap()
            .selector
            .as_mut()
            .unwrap()
            .remove(LABEL_SANDBOX);
        assert_eq!(
            check_service(Some(&service), &plan),
            companion("Service", "selects other pods")
        );
        let node_port = PodPlan {
            service_type: crate::manifests::ServiceType::NodePort,
            ..plan.clone()
        };
        assert_eq!(
            check_service(Some(&objects.service), &node_port),
            companion("Service", "is of another type")
        );
    }
}
