//! `warren serve`'s backends: the default one the settings name, Docker beside it when
//! enabled, gVisor probed once for those that run it, and the default tier checked.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use warren_api::ProvisionerToken;
use warren_backend::{Backend, BackendSet};
use warren_docker::{DockerBackend, DockerBackendConfig};
use warren_isolation::{GvisorHost, LocalBackend, LocalBackendConfig};

use super::config::ConfigFile;
use crate::settings::{BackendChoice, LocalRoot, ServeSettings};

/// The backends, and what the gVisor probe found.
pub(super) async fn build(
    settings: &ServeSettings,
    file: &ConfigFile,
    token: &ProvisionerToken,
    data_dir: &Path,
    workspace_dir: Option<&Path>,
) -> anyhow::Result<(Arc<dyn Backend>, GvisorHost)> {
    let gvisor = probe_gvisor(settings).await?;
    let docker: Option<Arc<dyn Backend>> = if settings.docker_enabled {
        Some(docker(settings, data_dir).await?)
    } else {
        None
    };
    let default: Arc<dyn Backend> = match settings.backend {
        BackendChoice::Docker => docker.clone().expect("enabled with --backend docker"),
        BackendChoice::Kubernetes => {
            let kubernetes = file.kubernetes.clone().context(
                "--backend kubernetes needs the [kubernetes] section of warren.toml (`warren k8s \
                 manifests` writes one)",
            )?;
            let image = settings
                .kubernetes_image
                .clone()
                .expect("required with backend kubernetes by the settings");
            super::kubernetes::backend(
                kubernetes,
                image,
                token,
                data_dir,
                workspace_dir.unwrap_or(data_dir),
                settings.limits.clone(),
            )
            .await?
        }
        BackendChoice::Local => {
            let backend = LocalBackend::new(LocalBackendConfig {
                data_dir: data_dir.to_path_buf(),
                init_program: std::env::current_exe().context("cannot find warren's own executable")?,
                limits: settings.limits.clone(),
                rootfs: match &settings.local_root {
                    LocalRoot::Directory(dir) => Some(dir.clone()),
                    LocalRoot::Image(name) => Some(super::image::rootfs_of(data_dir, name)?),
                    LocalRoot::Host => None,
                },
            })
            .context("cannot start the local isolation backend (`warren doctor` shows what this host supports)")?
            .with_gvisor(&gvisor);
            Arc::new(backend)
        }
        #[cfg(feature = "memory-backend")]
        BackendChoice::Memory => {
            tracing::warn!(
                "USING THE MEMORY BACKEND: it isolates nothing and refuses to run commands; \
                 it exists for tests and must never serve real agents (I20)"
            );
            Arc::new(warren_backend::MemoryBackend::new())
        }
        // Refused by the settings in any other build.
        #[cfg(not(feature = "memory-backend"))]
        BackendChoice::Memory => unreachable!("refused before anything was made"),
    };
    let backend: Arc<dyn Backend> =
        Arc::new(BackendSet::new(default, docker.into_iter().collect()));
    for warning in backend.warnings() {
        tracing::warn!(backend = backend.kind().as_str(), "{warning}");
    }
    check_default_tier(settings, backend.as_ref())?;
    Ok((backend, gvisor))
}

/// The gVisor tier's probe (issue 19): once, here, before the backends that run the tier
/// are built. It starts sandboxes (0.2 s on ptrace, up to 5 s more where kvm hangs), so off
/// the async threads, and never again: `/health` reports this result. A server whose
/// backends have no gVisor tier (memory, Kubernetes) skips it.
async fn probe_gvisor(settings: &ServeSettings) -> anyhow::Result<GvisorHost> {
    if settings.docker_enabled || settings.backend == BackendChoice::Local {
        tokio::task::spawn_blocking(|| warren_isolation::gvisor::probe(None))
            .await
            .context("the gVisor probe failed")
    } else {
        Ok(GvisorHost::not_probed(format!(
            "the {} backend has no gVisor tier: gVisor was not probed",
            settings.backend.as_str()
        )))
    }
}

/// The Docker backend, its default image checked.
async fn docker(settings: &ServeSettings, data_dir: &Path) -> anyhow::Result<Arc<dyn Backend>> {
    let backend = DockerBackend::new(DockerBackendConfig {
        data_dir: data_dir.to_path_buf(),
        agent_program: std::env::current_exe().context("cannot find warren's own executable")?,
        socket: settings.docker_socket.clone(),
        limits: settings.limits.clone(),
        gvisor_runtime: None,
    })
    .await
    .context("cannot start the Docker backend")?;
    tracing::info!(engine = backend.engine_version(), "Docker backend ready");
    // Sandboxes that name no image get this one: say now if the host lacks it, rather
    // than let every such sandbox be refused later with no hint at start-up.
    if let Some(image) = &settings.docker_image {
        match backend.has_image(image).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                image = %image,
                "the default Docker image is not on the Docker host, and warren never \
                 pulls: Docker sandboxes that name no image are refused (422 \
                 image_not_found) until it is built or pulled there"
            ),
            Err(error) => {
                tracing::warn!(image = %image, %error, "cannot check the default Docker image")
            }
        }
    }
    Ok(Arc::new(backend))
}

/// A default tier the default backend cannot run would refuse every sandbox that names
/// none: the server refuses to start instead, saying why (issue 19).
fn check_default_tier(settings: &ServeSettings, backend: &dyn Backend) -> anyhow::Result<()> {
    let tier = settings.tier;
    match warren_provisioner::check_isolation(backend, backend.kind(), tier) {
        Ok(()) => Ok(()),
        Err(warren_provisioner::ProvisionerError::IsolationUnavailable { backend, reason }) => {
            bail!(
                "the default isolation tier is {tier} (--tier, WARREN_TIER or tier in the \
                 configuration; formerly --isolation, WARREN_ISOLATION, isolation), but the \
                 {backend} backend cannot run it on this host: {reason}; set gVisor up for \
                 it, or start with --tier kernel (formerly --isolation kernel)"
            )
        }
        Err(error) => Err(error.into()),
    }
}
