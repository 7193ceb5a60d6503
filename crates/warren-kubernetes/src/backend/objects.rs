//! Creating a sandbox's objects in the cluster (keeping one that exists only when it is
//! exactly warren's) and deleting them.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy as K8sNetworkPolicy;
use kube::api::{DeleteParams, PostParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use warren_backend::BackendError;
use warren_core::SandboxId;

use super::{cluster, KubernetesBackend};
use crate::names;

impl KubernetesBackend {
    /// Creates `object` unless it exists; an existing one is kept when `keep` accepts it,
    /// else replaced.
    pub(super) async fn ensure<K>(
        &self,
        sandbox: &SandboxId,
        what: &str,
        object: &K,
        keep: impl Fn(&K) -> Result<(), crate::Error>,
    ) -> Result<(), BackendError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug
            + Send
            + 'static,
        <K as Resource>::DynamicType: Default,
    {
        let api = self.api::<K>();
        let name = object.meta().name.clone().unwrap_or_default();
        for _ in 0..2 {
            let created = cluster::with_retries(|| async {
                api.create(&PostParams::default(), object).await
            })
            .await;
            match created {
                Ok(_) => return Ok(()),
                Err(error) if cluster::is_already_exists(&error) => {
                    let found =
                        cluster::with_retries(|| api.get_opt(&name))
                            .await
                            .map_err(|e| {
                                cluster::failure(Some(sandbox), format!("read the {what}"), e)
                            })?;
                    match found.as_ref().map(&keep) {
                        Some(Ok(())) => return Ok(()),
                        Some(Err(reason)) => {
                            tracing::warn!(%sandbox, %reason, "replacing the sandbox's {what}");
                            let until = if what == "pod" {
                                Until::Gone
                            } else {
                                Until::Sent
                            };
                            self.delete::<K>(sandbox, what, &name, until).await?;
                        }
                        // Gone meanwhile: create it again.
                        None => {}
                    }
                }
                Err(error) => {
                    return Err(cluster::failure(
                        Some(sandbox),
                        format!("create the {what}"),
                        error,
                    ))
                }
            }
        }
        Err(BackendError::Create {
            sandbox: sandbox.clone(),
            source: std::io::Error::other(format!("the {what} keeps being replaced")),
        })
    }

    /// Deletes one object and waits through a watch for what `until` says. A pod is
    /// deleted with the shortest grace there is, one second, never zero: a zero grace is a
    /// forced deletion, which removes the object at once while the kubelet is still to stop
    /// its containers (a real cluster showed it: the processes outlived the destroy). With a
    /// grace, the kubelet stops the containers and reports them terminated; it removes the
    /// object itself only later (ten seconds on a 1.20 kubelet, whose status manager
    /// deletes on a beat, and a real one kept a stopped pod for over a minute). So a pod
    /// that must be gone is, once stopped, deleted again with no grace, on the condition
    /// that it is still the same pod: nothing of it runs by then. Services and
    /// NetworkPolicies go at once (no graceful deletion, no finalizer of warren's), and the
    /// Role grants no `watch` on them.
    async fn delete<K>(
        &self,
        sandbox: &SandboxId,
        what: &str,
        name: &str,
        until: Until,
    ) -> Result<(), BackendError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::Serialize
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
        <K as Resource>::DynamicType: Default,
    {
        let api = self.api::<K>();
        let graceful = DeleteParams {
            grace_period_seconds: Some(if until == Until::Sent { 0 } else { 1 }),
            ..DeleteParams::background()
        };
        let Some(uid) = self
            .delete_once(&api, sandbox, what, name, &graceful)
            .await?
        else {
            return Ok(());
        };
        if until == Until::Sent {
            return Ok(());
        }
        let condition_uid = uid.clone();
        let stopped_pod =
            kube::runtime::wait::await_condition(api.clone(), name, move |object: Option<&K>| {
                let value = object.map(|o| serde_json::to_value(o).unwrap_or_default());
                stopped(value.as_ref(), &condition_uid)
            });
        self.waited(sandbox, what, name, stopped_pod).await?;
        if until == Until::Stopped {
            return Ok(());
        }
        let forced = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match self.delete_once(&api, sandbox, what, name, &forced).await {
            Ok(_) => {}
            // Another pod of that name by now (the uid precondition failed): ours is gone.
            Err(_) if self.uid_of(&api, name).await.as_deref() != Some(uid.as_str()) => {
                return Ok(())
            }
            Err(error) => return Err(error),
        }
        let gone = kube::runtime::wait::await_condition(
            api.clone(),
            name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        self.waited(sandbox, what, name, gone).await
    }

    /// One delete request; the deleted object's uid, or `None` when there was none.
    async fn delete_once<K>(
        &self,
        api: &kube::Api<K>,
        sandbox: &SandboxId,
        what: &str,
        name: &str,
        params: &DeleteParams,
    ) -> Result<Option<String>, BackendError>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        match cluster::with_retries(|| api.delete(name, params)).await {
            Ok(either) => Ok(Some(
                either
                    .left()
                    .and_then(|object| object.meta().uid.clone())
                    .unwrap_or_default(),
            )),
            Err(error) if cluster::is_not_found(&error) => Ok(None),
            Err(error) => Err(cluster::failure(
                Some(sandbox),
                format!("delete the {what}"),
                error,
            )),
        }
    }

    /// The uid of the object named `name` now, if there is one.
    async fn uid_of<K>(&self, api: &kube::Api<K>, name: &str) -> Option<String>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let found = cluster::with_retries(|| api.get_opt(name)).await.ok()??;
        found.meta().uid.clone()
    }

    /// Waits for `condition` at most [`DELETE_TIMEOUT`].
    async fn waited<T>(
        &self,
        sandbox: &SandboxId,
        what: &str,
        name: &str,
        condition: impl std::future::Future<Output = Result<T, kube::runtime::wait::Error>>,
    ) -> Result<(), BackendError> {
        tokio::time::timeout(DELETE_TIMEOUT, condition)
            .await
            .map_err(|_| BackendError::Destroy {
                sandbox: sandbox.clone(),
                source: std::io::Error::other(format!("the {what} {name} is still there")),
            })?
            .map_err(|error| BackendError::Destroy {
                sandbox: sandbox.clone(),
                source: std::io::Error::other(error.to_string()),
            })?;
        Ok(())
    }

    /// Removes everything of a sandbox's runtime from the cluster (its files stay, I15).
    pub(super) async fn teardown(&self, sandbox: &SandboxId) -> Result<(), BackendError> {
        let name = names::object_name(&self.config.instance, sandbox);
        // The pod first: nothing may run without its policy. Its containers stopped is
        // enough here; a pod of the same name made next waits for the object to be gone.
        self.delete::<Pod>(sandbox, "pod", &name, Until::Stopped)
            .await?;
        self.delete::<Service>(sandbox, "service", &name, Until::Sent)
            .await?;
        self.delete::<K8sNetworkPolicy>(sandbox, "network policy", &name, Until::Sent)
            .await?;
        Ok(())
    }
}

/// What deleting an object waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Until {
    /// Nothing: the request was accepted.
    Sent,
    /// A pod: none of its containers runs (every one terminated or never started), or the
    /// object is gone.
    Stopped,
    /// A pod: stopped, then the object gone, so that one of the same name can be made.
    Gone,
}

/// Whether nothing runs of the pod whose uid is `uid`, from `pod`, that pod's name as it
/// is now (as JSON; `None`: there is none): gone, replaced by another, or deleted with no
/// container running. A kubelet reports a container terminated once its process, and with
/// it the container's pid namespace, is gone; it starts none in a pod being deleted.
fn stopped(pod: Option<&serde_json::Value>, uid: &str) -> bool {
    let Some(pod) = pod else {
        return true;
    };
    if pod["metadata"]["uid"].as_str() != Some(uid) {
        return true;
    }
    if pod["metadata"]["deletionTimestamp"].is_null() {
        return false;
    }
    let status = &pod["status"];
    ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|key| status[key].as_array().into_iter().flatten())
        .all(|container| container["state"]["running"].is_null())
}

/// How long a deleted pod may take to be gone.
const DELETE_TIMEOUT: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::stopped;
    use serde_json::json;

    fn pod(deleting: bool, states: &[serde_json::Value]) -> serde_json::Value {
        json!({
            "metadata": {"uid": "u1", "deletionTimestamp": deleting.then_some("2026-12-07T00:00:00Z")},
            "status": {
                "initContainerStatuses": [{"state": {"terminated": {"exitCode": 0}}}],
                "containerStatuses": states.iter().map(|s| json!({"state": s})).collect::<Vec<_>>(),
            },
        })
    }

    #[test]
    fn a_pod_is_stopped_once_deleted_with_no_container_running() {
        let running = json!({"running": {}});
        let ended = json!({"terminated": {"exitCode": 137}});
        let waiting = json!({"waiting": {"reason": "PodInitializing"}});
        assert!(
            !stopped(Some(&pod(false, std::slice::from_ref(&ended))), "u1"),
            "not deleted"
        );
        assert!(!stopped(
            Some(&pod(true, std::slice::from_ref(&running))),
            "u1"
        ));
        assert!(!stopped(Some(&pod(true, &[ended.clone(), running])), "u1"));
        assert!(stopped(Some(&pod(true, &[ended, waiting])), "u1"));
        assert!(stopped(None, "u1"), "gone");
        assert!(
            stopped(Some(&pod(false, &[])), "u2"),
            "another pod of that name"
        );
    }
}
