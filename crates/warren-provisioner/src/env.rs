//! The environment policy (I13, I14): the global sandbox environment, each uid's agent
//! environment, what a command gets of them, and the masking of injected secret values in
//! what it prints.
//!
//! Layers, lowest first: the backend's clean base (PATH, HOME, ...), the global sandbox
//! environment and secrets (configuration), the uid's agent environment, the call's own
//! `env`. A sandbox created with `inherit_env: false` gets neither the global nor the agent
//! layer, and nothing is masked for it because nothing was injected.

use std::collections::BTreeMap;

use warren_backend::{OutputChunk, OutputSink, OutputStream};
use warren_core::{AgentEnvVar, SandboxId, SecretMasker, Uid, MAX_AGENT_ENV_VARS};
use warren_store::{AgentEnvRecord, SandboxRecord};

use crate::sandboxes::Created;
use crate::{Provisioner, ProvisionerError};

/// What one command gets beyond the runtime's own environment, and what its output hides.
pub(crate) struct CommandEnv {
    /// The agent environment, under the call's `env`.
    pub env: BTreeMap<String, String>,
    /// Every injected secret: the global ones and the uid's.
    pub masker: SecretMasker,
}

impl Provisioner {
    /// The agent environment of `uid`, sorted by name. Callers that answer over an API must
    /// not return the values (I13): see [`AgentEnvVar::hint`].
    pub async fn agent_env(&self, uid: &Uid) -> Result<Vec<AgentEnvRecord>, ProvisionerError> {
        Ok(self.store.agent_env(uid).await?)
    }

    /// Replaces the whole agent environment of `uid`; an empty list clears it. Commands
    /// started from now on see the new one; running processes keep what they started with.
    pub async fn replace_agent_env(
        &self,
        uid: &Uid,
        vars: Vec<AgentEnvVar>,
    ) -> Result<Vec<AgentEnvRecord>, ProvisionerError> {
        if vars.len() > MAX_AGENT_ENV_VARS {
            return Err(ProvisionerError::BadRequest(
                "an agent environment holds at most 256 variables",
            ));
        }
        let mut names = std::collections::HashSet::new();
        if !vars.iter().all(|var| names.insert(var.name.as_str())) {
            return Err(ProvisionerError::BadRequest(
                "an agent environment names each variable once",
            ));
        }
        for var in &vars {
            self.refuse_token_in_env(&var.name, &var.value)?;
        }
        self.store.replace_agent_env(uid, &vars).await?;
        tracing::info!(%uid, variables = vars.len(), "agent environment replaced");
        self.agent_env(uid).await
    }

    /// Sets one variable of `uid`'s agent environment.
    pub async fn set_agent_env_var(
        &self,
        uid: &Uid,
        var: AgentEnvVar,
    ) -> Result<Created, ProvisionerError> {
        self.refuse_token_in_env(&var.name, &var.value)?;
        let new = self
            .store
            .set_agent_env_var(uid, &var, MAX_AGENT_ENV_VARS)
            .await?;
        tracing::info!(%uid, name = %var.name, secret = var.secret, "agent environment variable set");
        Ok(if new { Created::New } else { Created::Existing })
    }

    /// Removes one variable of `uid`'s agent environment.
    pub async fn remove_agent_env_var(
        &self,
        uid: &Uid,
        name: &str,
    ) -> Result<(), ProvisionerError> {
        if self.store.remove_agent_env_var(uid, name).await? {
            tracing::info!(%uid, %name, "agent environment variable removed");
            Ok(())
        } else {
            Err(ProvisionerError::EnvVarNotFound {
                uid: uid.to_string(),
                name: name.chars().take(256).collect(),
            })
        }
    }

    /// Refuses an environment value that contains the provisioner token, in any spelling
    /// [`TokenFinder`](warren_core::TokenFinder) knows (I13).
    pub(crate) fn refuse_token_in_env(
        &self,
        name: &str,
        value: &str,
    ) -> Result<(), ProvisionerError> {
        match &self.config.token_finder {
            Some(finder) if finder.is_in(value.as_bytes()) => Err(ProvisionerError::TokenInEnv {
                name: name.chars().take(256).collect(),
            }),
            _ => Ok(()),
        }
    }

    /// Refuses a command whose `part` (its line, working directory or stdin) contains the
    /// provisioner token (I13): the command would hand it to the sandbox as surely as an
    /// environment variable would.
    pub(crate) fn refuse_token_in_command(
        &self,
        part: &'static str,
        bytes: &[u8],
    ) -> Result<(), ProvisionerError> {
        match &self.config.token_finder {
            Some(finder) if finder.is_in(bytes) => Err(ProvisionerError::TokenInCommand { part }),
            _ => Ok(()),
        }
    }

    /// The masker for everything a client reads back from the sandbox `id` (tool results,
    /// file contents shown to a model): every secret its commands get injected (I13).
    pub async fn secret_masker(&self, id: &SandboxId) -> Result<SecretMasker, ProvisionerError> {
        let record = self.sandbox(id).await?;
        Ok(self.command_env(&record).await?.masker)
    }

    /// The global sandbox environment a runtime of `record` starts with: the configured
    /// variables and secrets, or nothing without `inherit_env`.
    pub(crate) fn runtime_env(&self, record: &SandboxRecord) -> BTreeMap<String, String> {
        if !record.binding.inherit_env {
            return BTreeMap::new();
        }
        let mut env = self.config.sandbox_env.clone();
        env.extend(self.config.sandbox_secrets.clone());
        env
    }

    /// What a command in `record`'s runtime gets from its uid's agent environment, and the
    /// masker for every secret injected into it.
    pub(crate) async fn command_env(
        &self,
        record: &SandboxRecord,
    ) -> Result<CommandEnv, ProvisionerError> {
        // The egress layer (placeholders, the proxy's trust store) whatever is inherited:
        // it carries no value (issue 38).
        let egress = self.egress_env(record).await?;
        if !record.binding.inherit_env {
            return Ok(CommandEnv {
                env: egress,
                masker: SecretMasker::default(),
            });
        }
        let agent = self.store.agent_env(&record.uid).await?;
        let masker = SecretMasker::new(
            agent
                .iter()
                .filter(|record| record.var.secret)
                .map(|record| (record.var.name.as_str(), record.var.value.as_str()))
                .chain(
                    self.config
                        .sandbox_secrets
                        .iter()
                        .map(|(name, value)| (name.as_str(), value.as_str())),
                ),
        );
        let mut env = egress;
        env.extend(
            agent
                .into_iter()
                .map(|record| (record.var.name, record.var.value)),
        );
        Ok(CommandEnv { env, masker })
    }
}

/// Puts a masking relay in front of `sink`: chunks sent to the returned sender reach `sink`
/// with secrets replaced, even when a secret is split across chunks. The relay ends, after
/// flushing what it held, once every sender is dropped; when `sink` closes (the client went
/// away) it drops its receiver at once, so the backend sees a closed sink and kills the
/// command as it would without the relay (I24).
pub(crate) fn masking_relay(
    sink: OutputSink,
    masker: SecretMasker,
) -> (OutputSink, tokio::task::JoinHandle<()>) {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<OutputChunk>(64);
    let relay = tokio::spawn(async move {
        let mut stdout = masker.stream();
        let mut stderr = masker.stream();
        loop {
            let chunk = tokio::select! {
                chunk = receiver.recv() => chunk,
                () = sink.closed() => return,
            };
            let Some(chunk) = chunk else { break };
            let bytes = match chunk.stream {
                OutputStream::Stdout => stdout.push(&chunk.bytes),
                OutputStream::Stderr => stderr.push(&chunk.bytes),
            };
            if !bytes.is_empty()
                && sink
                    .send(OutputChunk {
                        stream: chunk.stream,
                        bytes,
                    })
                    .await
                    .is_err()
            {
                return;
            }
        }
        for (stream, held) in [
            (OutputStream::Stdout, stdout.finish()),
            (OutputStream::Stderr, stderr.finish()),
        ] {
            if !held.is_empty()
                && sink
                    .send(OutputChunk {
                        stream,
                        bytes: held,
                    })
                    .await
                    .is_err()
            {
                return;
            }
        }
    });
    (sender, relay)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_relay_masks_a_secret_split_between_chunks_and_flushes_at_the_end() {
        let (sink, mut out) = tokio::sync::mpsc::channel(16);
        let masker = SecretMasker::new([("TOKEN", "s3cr3t-value")]);
        let (sender, relay) = masking_relay(sink, masker);
        for part in ["a s3cr", "3t-val", "ue b s3cr"] {
            sender
                .send(OutputChunk {
                    stream: OutputStream::Stdout,
                    bytes: part.as_bytes().to_vec(),
                })
                .await
                .unwrap();
        }
        drop(sender);
        relay.await.unwrap();
        let mut text = Vec::new();
        while let Some(chunk) = out.recv().await {
            text.extend(chunk.bytes);
        }
        assert_eq!(String::from_utf8(text).unwrap(), "a [masked:TOKEN] b s3cr");
    }

    #[tokio::test]
    async fn a_closed_sink_ends_the_relay_and_closes_its_sender() {
        let (sink, out) = tokio::sync::mpsc::channel(16);
        let (sender, relay) = masking_relay(sink, SecretMasker::new([("T", "abcdefgh")]));
        drop(out);
        relay.await.unwrap();
        assert!(
            sender.is_closed(),
            "the backend must see the client went away"
        );
    }
}
