//! What the backend asks of the cluster for a runtime spec (a [`PodPlan`]), and the spec
//! of a pod it reads back.

use std::net::SocketAddr;
use std::path::PathBuf;

use warren_agent::AgentConfig;
use warren_backend::{BackendError, BackendKind, RuntimeSpec};
use warren_core::DataLayout;

use super::{KubernetesBackend, AGENT_BUNDLE_ARG, PREPARE_ARG};
use crate::identity;
use crate::manifests::{AgentPlan, Endpoint, Limits, PersistentMount, PodPlan};
use crate::names::AGENT_MOUNT;

impl KubernetesBackend {
    /// The objects warren makes for `spec`, as a plan.
    pub(super) fn plan(&self, spec: &RuntimeSpec) -> Result<PodPlan, BackendError> {
        let refuse = |reason: String| BackendError::Create {
            sandbox: spec.sandbox.clone(),
            source: std::io::Error::other(reason),
        };
        if !spec.binding.extra_mounts.is_empty() {
            return Err(refuse(
                "extra mounts are directories of warren's host, which no pod can mount; the \
                 kubernetes backend takes none"
                    .into(),
            ));
        }
        if spec.binding.ephemeral {
            // An ephemeral sandbox's trees are scratch directories beneath warren's own
            // data; a pod mounts the uid's claims by subPath, which would put the uid's
            // persistent workspace in front of a sandbox promised none of it (I14).
            return Err(refuse(
                "an ephemeral sandbox's scratch tree is on warren's host, which no pod can                  mount, and a pod would see the uid's persistent workspace instead; the                  kubernetes backend takes no ephemeral sandbox"
                    .into(),
            ));
        }
        if spec.binding.network.has_egress() && self.proxy_port.is_none() {
            return Err(refuse(
                "network \"open\" and \"allowlist\" need warren's egress proxy for pods, which \
                 this server does not serve (set [kubernetes] proxy_port and proxy_host); use \
                 network \"none\""
                    .into(),
            ));
        }
        let key = self.key(&spec.sandbox, spec.generation);
        let layout = spec.binding.layout.layout();
        let agent = AgentConfig {
            sandbox: spec.sandbox.to_string(),
            generation: spec.generation,
            nofile: self.config.limits.nofile,
            // A pod's egress goes to warren's proxy over the network, as its policy allows.
            egress: false,
            socket_dir: None,
            listen: Some(SocketAddr::from(([0, 0, 0, 0], self.config.agent_port))),
            // Only an ephemeral home is kept open for snapshots (I30): E2B's home is the
            // workdir, persistent already, and the agent gets `HOME`, `USER` and `LOGNAME`
            // from the layout warren sends with each command, not from this.
            home: layout
                .home_is_ephemeral()
                .then(|| PathBuf::from(layout.home)),
            gvisor: false,
            max_processes: None,
            max_address_space: None,
        };
        let agent = serde_json::to_string(&agent).expect("the agent config serialises");
        let limits = &self.config.limits;
        const MIB: u64 = 1024 * 1024;
        Ok(PodPlan {
            instance: self.config.instance.clone(),
            namespace: self.config.namespace.clone(),
            sandbox: spec.sandbox.clone(),
            uid: spec.uid.clone(),
            runtime_scope: spec.runtime_scope.clone(),
            workdir: spec.binding.workdir.clone(),
            generation: spec.generation,
            layout: spec.binding.layout,
            network: spec.binding.network.clone(),
            image: spec
                .binding
                .image
                .clone()
                .unwrap_or_else(|| self.config.image.clone()),
            inherit_env: spec.binding.inherit_env,
            mounts: PersistentMount::for_layout(
                spec.binding.layout,
                &spec.uid.safe(),
                &spec.binding.workdir,
            ),
            user_data_claim: self.config.user_data_claim.clone(),
            skills_claim: self.config.skills_claim.clone(),
            limits: Limits {
                cpu_millis: limits.cpu_millis.unwrap_or(1000),
                memory_bytes: limits.memory_bytes.unwrap_or(2048 * MIB),
                // The writable layer, logs and the disk-backed emptyDirs (the agent's
                // bundle, the accounts): the home's and /tmp's sizes are in memory now but
                // still counted, which keeps the bound what it was on every cluster. The
                // home's counts only where there is one (not E2B's, I30).
                ephemeral_storage_bytes: limits.cow_bytes
                    + if layout.home_is_ephemeral() {
                        limits.home_bytes
                    } else {
                        0
                    }
                    + limits.tmp_bytes,
                home_bytes: limits.home_bytes,
                tmp_bytes: limits.tmp_bytes,
            },
            agent: AgentPlan {
                image: self.config.warren_image.clone(),
                bundle_command: vec![
                    self.config.warren_binary.clone(),
                    AGENT_BUNDLE_ARG.to_owned(),
                    AGENT_MOUNT.to_owned(),
                ],
                prepare_command: vec![self.config.warren_binary.clone(), PREPARE_ARG.to_owned()],
                command: vec![
                    format!("{AGENT_MOUNT}/{}", warren_agent::bundle::LOADER),
                    "--argv0".into(),
                    "warren-agent".into(),
                    "--library-path".into(),
                    format!("{AGENT_MOUNT}/lib"),
                    format!("{AGENT_MOUNT}/{}", warren_agent::bundle::PROGRAM),
                    warren_agent::CONTAINER_AGENT_ARG.into(),
                    agent,
                ],
                port: self.config.agent_port,
                key: key.to_hex(),
                bundle_bytes: 256 * MIB,
            },
            service_type: self.config.service_type,
            // Pods with egress may reach warren's proxy (where warren's pods, or its
            // address, are), and nothing else.
            proxy: self.proxy_port.map(|port| Endpoint {
                peer: self.config.agent_clients.clone(),
                port,
            }),
            agent_clients: self.config.agent_clients.clone(),
        })
    }

    /// The spec of a pod warren reads back, with the runtime environment kept for it.
    pub(super) fn spec_of(&self, identity: &identity::PodIdentity) -> Option<RuntimeSpec> {
        let env = self.load_env(&identity.sandbox)?;
        let safe = identity.uid.safe();
        Some(RuntimeSpec {
            sandbox: identity.sandbox.clone(),
            generation: identity.generation,
            uid: identity.uid.clone(),
            runtime_scope: identity.runtime_scope.clone(),
            user_workspace: self
                .config
                .workspace_dir
                .join(DataLayout::user_workspace_relative(&safe)),
            skill_projection: self
                .config
                .workspace_dir
                .join(DataLayout::skill_projection_relative(&safe)),
            env,
            seed: None,
            branch: None,
            frozen: Vec::new(),
            binding: warren_core::Binding {
                workdir: identity.workdir.clone(),
                network: identity.network.clone(),
                backend: BackendKind::Kubernetes,
                image: Some(identity.image.clone()),
                inherit_env: identity.inherit_env,
                ephemeral: false,
                layout: identity.layout,
                extra_mounts: Vec::new(),
                isolation: warren_core::IsolationTier::Kernel,
                branch: None,
            },
        })
    }
}
