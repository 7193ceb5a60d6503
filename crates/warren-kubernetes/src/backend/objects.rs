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
                            let is_pod = what == "pod";
                            self.delete::<K>(sandbox, what, &name, is_pod).await?;
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

    /// Deletes one object now (no grace: the runtime is being destroyed) and, for a pod,
    /// waits through a watch until it is gone (`until_gone`), so a new generation's pod of
    /// the same name can be created. Services and NetworkPolicies go at once (no graceful
    /// deletion, no finalizer of warren's), and the Role grants no `watch` on them.
    async fn delete<K>(
        &self,
        sandbox: &SandboxId,
        what: &str,
        name: &str,
        until_gone: bool,
    ) -> Result<(), BackendError>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
        <K as Resource>::DynamicType: Default,
    {
        let api = self.api::<K>();
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::background()
        };
        let deleted = cluster::with_retries(|| api.delete(name, &params)).await;
        let uid = match deleted {
            Ok(either) => either.left().and_then(|object| object.meta().uid.clone()),
            Err(error) if cluster::is_not_found(&error) => return Ok(()),
            Err(error) => {
                return Err(cluster::failure(
                    Some(sandbox),
                    format!("delete the {what}"),
                    error,
                ))
            }
        };
        if !until_gone {
            return Ok(());
        }
        let uid = uid.unwrap_or_default();
        let gone = kube::runtime::wait::await_condition(
            api.clone(),
            name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        tokio::time::timeout(DELETE_TIMEOUT, gone)
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
        // The pod first: nothing may run without its policy.
        self.delete::<Pod>(sandbox, "pod", &name, true).await?;
        self.delete::<Service>(sandbox, "service", &name, false)
            .await?;
        self.delete::<K8sNetworkPolicy>(sandbox, "network policy", &name, false)
            .await?;
        Ok(())
    }
}

/// How long a deleted pod may take to be gone.
const DELETE_TIMEOUT: Duration = Duration::from_secs(60);
