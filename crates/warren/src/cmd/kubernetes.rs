//! The Kubernetes backend's start-up (`warren serve --backend kubernetes`) and `warren k8s
//! manifests`, which prints what runs warren itself in a cluster (issue 15).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use warren_api::ProvisionerToken;
use warren_backend::{Backend, RuntimeLimits};
use warren_kubernetes::{
    DeployOptions, KubernetesBackend, KubernetesConfig, KubernetesSettings, Peer, S3Options,
    SecretKey, ServiceType,
};

/// The Kubernetes backend from the `[kubernetes]` section: its client from `api_url`, or
/// the pod's service account, or the kubeconfig.
pub(super) async fn backend(
    settings: KubernetesSettings,
    image: String,
    token: &ProvisionerToken,
    data_dir: &Path,
    workspace_dir: &Path,
    limits: RuntimeLimits,
) -> anyhow::Result<Arc<dyn Backend>> {
    let config = match (&settings.api_url, &settings.kubeconfig) {
        (Some(_), Some(_)) => {
            anyhow::bail!("[kubernetes] names both api_url and kubeconfig: name one")
        }
        (Some(url), None) => kube::Config::new(
            url.parse()
                .with_context(|| format!("[kubernetes] api_url {url:?} is not a URL"))?,
        ),
        (None, Some(path)) => {
            let file = kube::config::Kubeconfig::read_from(path).with_context(|| {
                format!("cannot read [kubernetes] kubeconfig {}", path.display())
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| {
                    format!(
                        "[kubernetes] kubeconfig {} names no usable cluster",
                        path.display()
                    )
                })?
        }
        (None, None) => kube::Config::infer().await.context(
            "cannot find the cluster: warren is not in a pod with a service account, and no \
             kubeconfig was found (KUBECONFIG, ~/.kube/config); or set [kubernetes] api_url",
        )?,
    };
    let mut config = warren_kubernetes::client_config(config);
    config.default_namespace = settings.namespace.clone();
    let client = kube::Client::try_from(config).context("cannot build the Kubernetes client")?;
    let agent_clients = match &settings.agent_clients_cidr {
        Some(cidr) => Peer::IpBlock { cidr: cidr.clone() },
        None => Peer::Pods {
            pod_labels: settings.warren_pod_labels.clone(),
            namespace_labels: None,
        },
    };
    // Every replica holds the token, so every replica derives every agent's key; a new
    // token makes the running pods' agents unreachable, and the next start replaces them.
    let agent_secret = blake3::derive_key(
        "warren 2026 kubernetes agent secret",
        &token.secret_digest(),
    );
    let backend = KubernetesBackend::new(
        client,
        KubernetesConfig {
            namespace: settings.namespace,
            instance: settings.instance,
            image,
            warren_image: settings.warren_image,
            warren_binary: settings.warren_binary,
            agent_port: settings.agent_port,
            service_type: settings.service_type,
            user_data_claim: settings.user_data_claim,
            skills_claim: settings.skills_claim,
            agent_clients,
            proxy_listen: settings
                .proxy_port
                .map(|port| std::net::SocketAddr::from(([0, 0, 0, 0], port))),
            proxy_host: settings.proxy_host,
            limits,
            agent_secret: agent_secret.to_vec(),
            ready_timeout: Duration::from_secs(settings.ready_timeout_s),
            state_dir: data_dir.join("kubernetes").join("state"),
            workspace_dir: workspace_dir.to_path_buf(),
        },
    )
    .context("cannot start the Kubernetes backend")?;
    Ok(Arc::new(backend))
}

#[derive(Debug, Args)]
pub struct K8sArgs {
    #[command(subcommand)]
    command: K8sCommand,
}

#[derive(Debug, Subcommand)]
enum K8sCommand {
    /// Print the manifests that run warren in a cluster (a ServiceAccount and its Role,
    /// the claims, warren.toml as a ConfigMap, the Deployment and its Service), for
    /// `kubectl apply -f -`.
    Manifests(ManifestsArgs),
}

#[derive(Debug, Args)]
struct ManifestsArgs {
    /// The namespace of warren and its sandboxes (it must exist).
    #[arg(long)]
    namespace: String,
    /// warren's image (it holds warren at --warren-binary).
    #[arg(long)]
    image: String,
    /// The image of sandboxes that name none.
    #[arg(long)]
    sandbox_image: Option<String>,
    /// The prefix of every object's name, and warren's instance name on its sandboxes.
    #[arg(long, default_value = "warren")]
    name: String,
    /// warren's executable in its image.
    #[arg(long, default_value = "/usr/local/bin/warren")]
    warren_binary: String,
    /// The port of warren's API.
    #[arg(long, default_value_t = 7878)]
    port: u16,
    /// The claims' storage class [default: the cluster's default].
    #[arg(long)]
    storage_class: Option<String>,
    /// How warren reaches sandbox pods.
    #[arg(long, value_enum, default_value_t = ServiceChoice::ClusterIp)]
    service_type: ServiceChoice,
    /// The provisioner token, as `<secret>/<key>` of a Secret you create.
    #[arg(long, default_value = "warren-token/token")]
    token_secret: String,
    /// A PostgreSQL state store: its URL (with the password) as `<secret>/<key>`.
    #[arg(long)]
    postgres_secret: Option<String>,
    /// An S3-compatible snapshot store's endpoint (`https://s3.example.com`).
    #[arg(long, requires_all = ["s3_bucket", "s3_access_key_secret", "s3_secret_key_secret"])]
    s3_endpoint: Option<String>,
    /// The bucket.
    #[arg(long)]
    s3_bucket: Option<String>,
    /// The region.
    #[arg(long)]
    s3_region: Option<String>,
    /// The access key id, as `<secret>/<key>`.
    #[arg(long)]
    s3_access_key_secret: Option<String>,
    /// The secret access key, as `<secret>/<key>`.
    #[arg(long)]
    s3_secret_key_secret: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ServiceChoice {
    /// warren runs in the cluster.
    #[value(name = "ClusterIP")]
    ClusterIp,
    /// warren runs outside it.
    #[value(name = "NodePort")]
    NodePort,
}

fn secret_key(option: &str, value: &str) -> anyhow::Result<SecretKey> {
    match value.split_once('/') {
        Some((secret, key)) if !secret.is_empty() && !key.is_empty() => {
            Ok(SecretKey::new(secret, key))
        }
        _ => bail!("--{option} {value:?}: give it as <secret>/<key>, e.g. warren-token/token"),
    }
}

pub fn run(args: K8sArgs) -> anyhow::Result<ExitCode> {
    let K8sCommand::Manifests(args) = args.command;
    let mut options = DeployOptions::new(&args.namespace, &args.image);
    options.name = args.name;
    options.warren_binary = args.warren_binary;
    options.port = args.port;
    options.sandbox_image = args.sandbox_image;
    options.storage_class = args.storage_class;
    options.sandbox_service_type = match args.service_type {
        ServiceChoice::ClusterIp => ServiceType::ClusterIp,
        ServiceChoice::NodePort => ServiceType::NodePort,
    };
    options.token = secret_key("token-secret", &args.token_secret)?;
    options.postgres = args
        .postgres_secret
        .as_deref()
        .map(|value| secret_key("postgres-secret", value))
        .transpose()?;
    if let Some(endpoint) = args.s3_endpoint {
        options.s3 = Some(S3Options {
            endpoint,
            bucket: args.s3_bucket.unwrap_or_default(),
            region: args.s3_region,
            access_key_id: secret_key(
                "s3-access-key-secret",
                &args.s3_access_key_secret.unwrap_or_default(),
            )?,
            secret_access_key: secret_key(
                "s3-secret-key-secret",
                &args.s3_secret_key_secret.unwrap_or_default(),
            )?,
        });
    }
    let manifests = warren_kubernetes::deployment_manifests(&options)
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    use std::io::Write;
    std::io::stdout().write_all(manifests.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
