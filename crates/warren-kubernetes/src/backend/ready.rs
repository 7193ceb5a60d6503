//! Waiting for a sandbox's pod to be ready, driven by a watch (no polling loop), bounded,
//! and failing early with the pod's own reason when the cluster says it will not start.
//!
//! The watch is `kube::runtime::watcher` on the one pod (`metadata.name` field selector):
//! it lists first, then watches from the list's resourceVersion, and on 410 Gone (the
//! history it watched from was compacted) it lists again, so no change is missed.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::Api;

/// Where a pod stands, as far as starting it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Not there yet.
    Waiting,
    /// Ready: the agent is reached at its pod address (and its node's, for a NodePort).
    Ready {
        /// The pod's IP.
        pod_ip: String,
        /// Its node's IP.
        host_ip: Option<String>,
    },
    /// It will not start without someone changing something: why, in the cluster's
    /// words.
    Stuck(String),
}

/// Container waiting reasons that do not pass by themselves.
const STUCK_WAITING: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
];

/// Judges one state of the pod.
pub(crate) fn progress(pod: &Pod) -> Progress {
    let Some(status) = &pod.status else {
        return Progress::Waiting;
    };
    if let Some(phase @ ("Failed" | "Succeeded")) = status.phase.as_deref() {
        let why = status
            .container_statuses
            .iter()
            .chain(status.init_container_statuses.iter())
            .flatten()
            .find_map(|c| {
                let ended = c.state.as_ref()?.terminated.as_ref()?;
                Some(format!(
                    "container {} ended with exit code {}{}",
                    c.name,
                    ended.exit_code,
                    ended
                        .message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ))
            })
            .or_else(|| status.message.clone())
            .unwrap_or_default();
        return Progress::Stuck(format!("the pod is {phase}: {why}"));
    }
    for condition in status.conditions.iter().flatten() {
        if condition.type_ == "PodScheduled"
            && condition.status == "False"
            && condition.reason.as_deref() == Some("Unschedulable")
        {
            return Progress::Stuck(format!(
                "Unschedulable: {}",
                condition
                    .message
                    .as_deref()
                    .unwrap_or("no node fits the pod")
            ));
        }
    }
    let containers = status
        .init_container_statuses
        .iter()
        .chain(status.container_statuses.iter())
        .flatten();
    for container in containers {
        let state = container.state.as_ref();
        if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
            if let Some(reason) = waiting.reason.as_deref() {
                if STUCK_WAITING.contains(&reason) {
                    return Progress::Stuck(format!(
                        "{reason} in container {}: {}",
                        container.name,
                        waiting.message.as_deref().unwrap_or("")
                    ));
                }
            }
        }
        if let Some(ended) = state.and_then(|s| s.terminated.as_ref()) {
            if ended.exit_code != 0 {
                return Progress::Stuck(format!(
                    "container {} ended with exit code {} ({})",
                    container.name,
                    ended.exit_code,
                    ended.reason.as_deref().unwrap_or("Error")
                ));
            }
        }
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    match (ready, status.pod_ip.as_ref()) {
        (true, Some(ip)) if !ip.is_empty() => Progress::Ready {
            pod_ip: ip.clone(),
            host_ip: status.host_ip.clone(),
        },
        _ => Progress::Waiting,
    }
}

/// Waits until the pod `name` is ready, stuck, gone, or `timeout` passed.
pub(crate) async fn wait(
    api: &Api<Pod>,
    name: &str,
    timeout: Duration,
) -> Result<Progress, String> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api.clone(), config).boxed();
    let mut last = Progress::Waiting;
    let watching = async {
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(pod) | Event::InitApply(pod)) => {
                    last = progress(&pod);
                    if last != Progress::Waiting {
                        return Ok(last.clone());
                    }
                }
                Ok(Event::Delete(_)) => return Err("the pod was deleted".to_owned()),
                Ok(Event::Init | Event::InitDone) => {}
                // The watcher relists by itself (410 Gone included); a cluster that keeps
                // failing ends the wait at its bound.
                Err(error) => {
                    tracing::debug!(%error, pod = name, "watching the pod failed; retrying")
                }
            }
        }
        Err("the watch ended".to_owned())
    };
    match tokio::time::timeout(timeout, watching).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "not ready after {} s (still {})",
            timeout.as_secs(),
            match last {
                Progress::Waiting => "waiting",
                _ => "changing",
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_ready_pod_with_an_address_is_ready() {
        let ready = pod(serde_json::json!({
            "phase": "Running",
            "podIP": "10.1.2.3",
            "hostIP": "192.0.2.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        }));
        assert_eq!(
            progress(&ready),
            Progress::Ready {
                pod_ip: "10.1.2.3".into(),
                host_ip: Some("192.0.2.1".into())
            }
        );
        let no_address = pod(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }));
        assert_eq!(progress(&no_address), Progress::Waiting);
    }

    #[test]
    fn the_clusters_reasons_for_a_pod_that_will_not_start_are_named() {
        let cases = [
            (
                serde_json::json!({"phase": "Pending", "containerStatuses": [{"name": "sandbox", "ready": false, "restartCount": 0, "image": "x", "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "back-off pulling image \"x\""}}}]}),
                "ImagePullBackOff",
            ),
            (
                serde_json::json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}]}),
                "Unschedulable: 0/3 nodes",
            ),
            (
                serde_json::json!({"phase": "Pending", "initContainerStatuses": [{"name": "prepare", "ready": false, "restartCount": 0, "image": "w", "imageID": "", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}),
                "container prepare ended with exit code 1",
            ),
            (
                serde_json::json!({"phase": "Failed", "message": "evicted"}),
                "the pod is Failed: evicted",
            ),
        ];
        for (status, expected) in cases {
            match progress(&pod(status.clone())) {
                Progress::Stuck(reason) => assert!(reason.contains(expected), "{reason}"),
                other => panic!("{status}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_pod_still_starting_is_waited_for() {
        let starting = pod(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{"name": "sandbox", "ready": false, "restartCount": 0, "image": "x", "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}],
        }));
        assert_eq!(progress(&starting), Progress::Waiting);
    }
}
