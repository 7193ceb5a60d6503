//! Egress secrets, the sandbox's egress authority and the egress audit (issue 38, I13,
//! I22, I23): what a runtime's proxy asks of the store, and what the API reads and sets.
//!
//! A secret is the uid's (every sandbox of theirs may present it) or one sandbox's (set at
//! create; it wins over a uid's of the same name, and goes with the sandbox). Inside a
//! runtime only `WARREN_SECRET_<NAME>` exists, holding a placeholder; the proxy presents
//! the value to the destinations the secret is bound to. Values are never read back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_backend::{Authority, EgressBroker, FileOp};
use warren_core::{
    placeholder, EgressEvent, EgressSecret, SandboxId, SecretName, Uid, MAX_EGRESS_SECRETS,
};
use warren_store::{EgressRecord, EgressSecretRecord, SandboxRecord, StateStore};

use crate::sandboxes::Created;
use crate::{Provisioner, ProvisionerError};

/// Events kept per sandbox; older ones are dropped.
const EGRESS_EVENTS_KEPT: usize = 10_000;
/// Events waiting to be written, across all sandboxes; past it new ones are dropped (and
/// counted in the log), so a sandbox opening connections fast cannot grow the server.
const AUDIT_QUEUE: usize = 8192;
/// Most events written in one transaction.
const AUDIT_BATCH: usize = 512;

/// Where, inside a runtime, its trust store for the proxy lives: the image's roots and the
/// sandbox's authority, and the authority alone.
const CA_BUNDLE_PATH: &str = "/tmp/.warren-egress/ca-bundle.pem";
/// The sandbox's authority alone (`NODE_EXTRA_CA_CERTS` adds to Node's own roots).
const CA_PATH: &str = "/tmp/.warren-egress/ca.pem";
/// Where images keep their roots, most common first.
const IMAGE_ROOTS: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// An operator's source of short-lived secrets: a command warren runs to mint a value for
/// one sandbox. It gets `WARREN_UID`, `WARREN_SANDBOX` and `WARREN_SECRET` and prints
/// `{"value": "...", "expires_in": <seconds>}` (or `"expires_at"`, Unix seconds); the value
/// is kept for that sandbox until then, and never stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSource {
    /// The program and its arguments (no shell).
    pub command: Vec<String>,
    /// How long it may take, seconds (default 10).
    #[serde(default = "SecretSource::default_timeout")]
    pub timeout_s: u64,
}

impl SecretSource {
    fn default_timeout() -> u64 {
        10
    }
}

/// Most bytes a source may print.
const SOURCE_OUTPUT: usize = 64 * 1024;
/// How long before its expiry a minted value is minted again.
const EXPIRY_MARGIN: Duration = Duration::from_secs(30);
/// Minted values kept across all sandboxes; past it the cache starts over.
const MINTED_KEPT: usize = 4096;

/// A value a source minted, and until when it may be presented.
struct Minted {
    value: String,
    until: Instant,
}

/// The provisioner's side of every runtime's egress proxy.
pub(crate) struct Broker {
    store: Arc<dyn StateStore>,
    audit: Option<tokio::sync::mpsc::Sender<EgressEvent>>,
    upstream_roots: Option<String>,
    sources: BTreeMap<String, SecretSource>,
    /// Each sandbox's uid (a sandbox id is derived from it, so this never changes).
    owners: Mutex<HashMap<SandboxId, Uid>>,
    /// Minted values per (sandbox, secret), each sandbox's own, each behind a lock of its
    /// own: one slow source holds up only the connections that wait for its value.
    minted: Mutex<MintedSlots>,
}

/// Per (sandbox, secret), what its source last minted.
type MintedSlots = HashMap<(SandboxId, SecretName), Arc<tokio::sync::Mutex<Option<Minted>>>>;

impl Broker {
    /// A broker over `store`; its audit writer runs on the current tokio runtime, if any.
    pub(crate) fn new(
        store: Arc<dyn StateStore>,
        upstream_roots: Option<String>,
        sources: BTreeMap<String, SecretSource>,
    ) -> Self {
        let audit = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let (sender, receiver) = tokio::sync::mpsc::channel(AUDIT_QUEUE);
            runtime.spawn(write_audit(store.clone(), receiver));
            sender
        });
        Self {
            store,
            audit,
            upstream_roots,
            sources,
            owners: Mutex::new(HashMap::new()),
            minted: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the operator configured a source of this name.
    pub(crate) fn has_source(&self, name: &str) -> bool {
        self.sources.contains_key(name)
    }

    /// Forgets what was minted for `sandbox`: it ended, and nothing it held outlives it.
    pub(crate) fn forget(&self, sandbox: &SandboxId) {
        self.minted_slots().retain(|(id, _), _| id != sandbox);
    }

    fn minted_slots(&self) -> std::sync::MutexGuard<'_, MintedSlots> {
        // A cache: poisoning loses nothing a new mint cannot give back.
        self.minted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The value `secret`'s source mints for `sandbox`, kept until its expiry. One mint at a
    /// time per sandbox and secret: concurrent connections wait for it rather than each
    /// running the source.
    async fn mint(
        &self,
        uid: &Uid,
        sandbox: &SandboxId,
        secret: &EgressSecret,
        source_name: &str,
    ) -> Result<EgressSecret, String> {
        let key = (sandbox.clone(), secret.name.clone());
        let slot = {
            let mut slots = self.minted_slots();
            if slots.len() >= MINTED_KEPT && !slots.contains_key(&key) {
                // Past the bound, start over: each sandbox mints again when it next needs to.
                slots.clear();
            }
            slots.entry(key).or_default().clone()
        };
        let mut kept = slot.lock().await;
        if let Some(minted) = kept.as_ref().filter(|m| Instant::now() < m.until) {
            return secret
                .minted(minted.value.clone())
                .map_err(|e| e.to_string());
        }
        let source = self
            .sources
            .get(source_name)
            .ok_or_else(|| format!("no secret source {source_name:?} is configured"))?;
        let (value, lifetime) = run_source(source, uid, sandbox, &secret.name).await?;
        let fresh = secret.minted(value.clone()).map_err(|e| e.to_string())?;
        *kept = Some(Minted {
            value,
            until: Instant::now() + lifetime.saturating_sub(EXPIRY_MARGIN),
        });
        tracing::info!(%sandbox, secret = %secret.name, source = source_name, "egress secret minted");
        Ok(fresh)
    }
}

/// What a source printed.
#[derive(serde::Deserialize)]
struct SourceAnswer {
    value: String,
    expires_in: Option<u64>,
    expires_at: Option<u64>,
}

/// Runs `source` for one sandbox's secret: its value and how long it may be kept.
async fn run_source(
    source: &SecretSource,
    uid: &Uid,
    sandbox: &SandboxId,
    name: &SecretName,
) -> Result<(String, Duration), String> {
    use tokio::io::AsyncReadExt as _;
    let (program, args) = source
        .command
        .split_first()
        .ok_or("the source names no command")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("WARREN_UID", uid.as_str())
        .env("WARREN_SANDBOX", sandbox.as_str())
        .env("WARREN_SECRET", name.as_str())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let run = async {
        let mut output = Vec::new();
        (&mut stdout)
            .take(SOURCE_OUTPUT as u64 + 1)
            .read_to_end(&mut output)
            .await
            .map_err(|e| e.to_string())?;
        let status = child.wait().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((output, status))
    };
    let (output, status) = tokio::time::timeout(Duration::from_secs(source.timeout_s), run)
        .await
        .map_err(|_| format!("{program} took longer than {} s", source.timeout_s))??;
    if !status.success() {
        return Err(format!("{program} failed ({status})"));
    }
    if output.len() > SOURCE_OUTPUT {
        return Err(format!("{program} printed more than 64 KiB"));
    }
    let answer: SourceAnswer = serde_json::from_slice(&output)
        .map_err(|e| format!("{program} did not print {{\"value\", \"expires_in\"}}: {e}"))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let lifetime = match (answer.expires_in, answer.expires_at) {
        (Some(seconds), _) => seconds,
        (None, Some(at)) => at.saturating_sub(now),
        (None, None) => 0,
    };
    Ok((answer.value, Duration::from_secs(lifetime)))
}

impl Broker {
    async fn owner(&self, sandbox: &SandboxId) -> Result<Uid, String> {
        if let Some(uid) = self
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sandbox)
        {
            return Ok(uid.clone());
        }
        let record = self
            .store
            .get_sandbox(sandbox)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no sandbox {sandbox}"))?;
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        if owners.len() > 65_536 {
            owners.clear();
        }
        owners.insert(sandbox.clone(), record.uid.clone());
        Ok(record.uid)
    }
}

#[async_trait::async_trait]
impl EgressBroker for Broker {
    async fn secrets(
        &self,
        sandbox: &SandboxId,
        host: &str,
        port: u16,
    ) -> Result<Vec<EgressSecret>, String> {
        let uid = self.owner(sandbox).await?;
        let records = visible_secrets(self.store.as_ref(), &uid, sandbox)
            .await
            .map_err(|e| e.to_string())?;
        let mut secrets = Vec::with_capacity(records.len());
        for record in records {
            let secret = record.secret;
            match secret.rule.source.clone() {
                None => secrets.push(secret),
                // Minted only for a connection it is bound to: no other connection waits
                // for a source. Unminted, it still names its placeholder, to refuse it.
                Some(_) if !secret.rule.covers(host, port) => secrets.push(secret),
                // A source that fails leaves its secret out: nothing is presented (its
                // placeholder, worth nothing, goes as it is).
                Some(source) => match self.mint(&uid, sandbox, &secret, &source).await {
                    Ok(minted) => secrets.push(minted),
                    Err(error) => {
                        tracing::warn!(%sandbox, secret = %secret.name, %source, %error, "an egress secret's source failed");
                    }
                },
            }
        }
        Ok(secrets)
    }

    async fn authority(&self, sandbox: &SandboxId) -> Result<Authority, String> {
        authority(self.store.as_ref(), sandbox).await
    }

    fn record(&self, event: EgressEvent) {
        let Some(audit) = &self.audit else {
            return;
        };
        if audit.try_send(event).is_err() {
            tracing::warn!("egress audit queue full: an event was dropped");
        }
    }

    fn upstream_roots(&self) -> Option<String> {
        self.upstream_roots.clone()
    }
}

/// The secrets `sandbox` may present: its uid's, and its own over them by name.
async fn visible_secrets(
    store: &dyn StateStore,
    uid: &Uid,
    sandbox: &SandboxId,
) -> Result<Vec<EgressSecretRecord>, warren_store::StoreError> {
    let mut by_name: BTreeMap<SecretName, EgressSecretRecord> = BTreeMap::new();
    for record in store.egress_secrets(uid, None).await? {
        by_name.insert(record.secret.name.clone(), record);
    }
    for record in store.egress_secrets(uid, Some(sandbox)).await? {
        by_name.insert(record.secret.name.clone(), record);
    }
    Ok(by_name.into_values().collect())
}

/// The sandbox's authority: the stored one, or a new one stored now (two servers racing
/// agree on one).
async fn authority(store: &dyn StateStore, sandbox: &SandboxId) -> Result<Authority, String> {
    let fresh = Authority::generate(sandbox)?;
    let (cert_pem, key_pem) = store
        .egress_authority(sandbox, (fresh.cert_pem, fresh.key_pem))
        .await
        .map_err(|e| e.to_string())?;
    Ok(Authority { cert_pem, key_pem })
}

/// Writes audit events in batches until every sender is gone.
async fn write_audit(
    store: Arc<dyn StateStore>,
    mut receiver: tokio::sync::mpsc::Receiver<EgressEvent>,
) {
    let mut batch = Vec::with_capacity(AUDIT_BATCH);
    while receiver.recv_many(&mut batch, AUDIT_BATCH).await > 0 {
        if let Err(error) = store.record_egress(&batch, EGRESS_EVENTS_KEPT).await {
            tracing::warn!(%error, events = batch.len(), "egress events not recorded");
        }
        batch.clear();
    }
}

impl Provisioner {
    /// The egress secrets of `uid`, by name. Callers answering over an API show names,
    /// bindings and hints, never values (I13).
    pub async fn egress_secrets(
        &self,
        uid: &Uid,
    ) -> Result<Vec<EgressSecretRecord>, ProvisionerError> {
        Ok(self.store.egress_secrets(uid, None).await?)
    }

    /// Sets one of `uid`'s egress secrets, adding it or rotating it in place: the next
    /// connection of every sandbox of theirs presents the new value.
    pub async fn set_egress_secret(
        &self,
        uid: &Uid,
        secret: EgressSecret,
    ) -> Result<Created, ProvisionerError> {
        self.set_secret(uid, None, secret).await
    }

    /// Removes one of `uid`'s egress secrets.
    pub async fn remove_egress_secret(
        &self,
        uid: &Uid,
        name: &SecretName,
    ) -> Result<(), ProvisionerError> {
        self.remove_secret(uid, None, name).await
    }

    /// The egress secrets the sandbox `id` may present, its own over its uid's.
    pub async fn sandbox_egress_secrets(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<EgressSecretRecord>, ProvisionerError> {
        let record = self.sandbox(id).await?;
        Ok(visible_secrets(self.store.as_ref(), &record.uid, id).await?)
    }

    /// Sets one of the sandbox's own egress secrets (adding or rotating it).
    pub async fn set_sandbox_egress_secret(
        &self,
        id: &SandboxId,
        secret: EgressSecret,
    ) -> Result<Created, ProvisionerError> {
        let record = self.sandbox(id).await?;
        self.set_secret(&record.uid, Some(id), secret).await
    }

    /// Removes one of the sandbox's own egress secrets.
    pub async fn remove_sandbox_egress_secret(
        &self,
        id: &SandboxId,
        name: &SecretName,
    ) -> Result<(), ProvisionerError> {
        let record = self.sandbox(id).await?;
        self.remove_secret(&record.uid, Some(id), name).await
    }

    /// Every connection the sandbox made or was refused, oldest first, those after the
    /// cursor `after`, at most `limit` (the audit outlives the runtime).
    pub async fn egress_events(
        &self,
        id: &SandboxId,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<EgressRecord>, ProvisionerError> {
        self.sandbox(id).await?;
        Ok(self
            .store
            .egress_events(id, after, limit.clamp(1, 1000))
            .await?)
    }

    /// Refuses a sandbox's secrets as a whole before anything is made: too many, or a
    /// value holding the provisioner token. A name given twice: the last one counts.
    pub(crate) fn check_secrets(&self, secrets: &[EgressSecret]) -> Result<(), ProvisionerError> {
        if secrets.len() > MAX_EGRESS_SECRETS {
            return Err(ProvisionerError::BadRequest(
                "a sandbox is created with at most 64 egress secrets",
            ));
        }
        for secret in secrets {
            self.refuse_token_in_env(&secret.name.env_name(), &secret.value)?;
        }
        Ok(())
    }

    /// Sets the sandbox's own secrets given at create.
    pub(crate) async fn set_sandbox_secrets(
        &self,
        record: &SandboxRecord,
        secrets: Vec<EgressSecret>,
    ) -> Result<(), ProvisionerError> {
        for secret in secrets {
            self.set_secret(&record.uid, Some(&record.id), secret)
                .await?;
        }
        Ok(())
    }

    async fn set_secret(
        &self,
        uid: &Uid,
        sandbox: Option<&SandboxId>,
        secret: EgressSecret,
    ) -> Result<Created, ProvisionerError> {
        self.refuse_token_in_env(&secret.name.env_name(), &secret.value)?;
        if let Some(source) = &secret.rule.source {
            if !self.egress_broker.has_source(source) {
                return Err(ProvisionerError::SecretSourceUnknown {
                    name: source.clone(),
                });
            }
        }
        let new = self
            .store
            .set_egress_secret(uid, sandbox, &secret, MAX_EGRESS_SECRETS)
            .await?;
        tracing::info!(%uid, sandbox = ?sandbox.map(SandboxId::as_str), name = %secret.name, "egress secret set");
        Ok(if new { Created::New } else { Created::Existing })
    }

    async fn remove_secret(
        &self,
        uid: &Uid,
        sandbox: Option<&SandboxId>,
        name: &SecretName,
    ) -> Result<(), ProvisionerError> {
        if self.store.remove_egress_secret(uid, sandbox, name).await? {
            tracing::info!(%uid, sandbox = ?sandbox.map(SandboxId::as_str), %name, "egress secret removed");
            Ok(())
        } else {
            Err(ProvisionerError::EgressSecretNotFound {
                name: name.to_string(),
            })
        }
    }

    /// What a command in `record`'s runtime gets for its egress: the placeholder of each
    /// secret it may present, and the trust store that holds its authority.
    pub(crate) async fn egress_env(
        &self,
        record: &SandboxRecord,
    ) -> Result<BTreeMap<String, String>, ProvisionerError> {
        let mut env = BTreeMap::new();
        if !record.binding.network.has_egress() {
            return Ok(env);
        }
        for secret in visible_secrets(self.store.as_ref(), &record.uid, &record.id).await? {
            let name = secret.secret.name;
            env.insert(name.env_name(), placeholder(&record.id, &name));
        }
        for variable in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "PIP_CERT",
        ] {
            env.insert(variable.to_owned(), CA_BUNDLE_PATH.to_owned());
        }
        env.insert("NODE_EXTRA_CA_CERTS".to_owned(), CA_PATH.to_owned());
        Ok(env)
    }

    /// Installs the sandbox's authority in its new runtime's trust store: the image's own
    /// roots with the authority after them, and the authority alone. A runtime without it
    /// still works; only its bound HTTPS destinations fail their clients' checks.
    pub(crate) async fn install_egress_authority(&self, record: &SandboxRecord) {
        if !record.binding.network.has_egress() {
            return;
        }
        let installed = async {
            let authority = authority(self.store.as_ref(), &record.id)
                .await
                .map_err(|e| format!("the sandbox's authority: {e}"))?;
            let mut bundle = match self.image_roots(&record.id).await {
                Some(roots) => roots,
                None => host_roots().await,
            };
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(authority.cert_pem.as_bytes());
            for (path, bytes) in [
                (CA_PATH, authority.cert_pem.into_bytes()),
                (CA_BUNDLE_PATH, bundle),
            ] {
                let op = FileOp::Write {
                    path: path.to_owned(),
                    append: false,
                    if_match: None,
                    if_none_match_any: false,
                    create_parents: true,
                    mode: Some(0o644),
                    cap: 16 * 1024 * 1024,
                };
                let reply = self
                    .backend
                    .runtime_file(&record.id, &op, bytes)
                    .await
                    .map_err(|e| format!("write {path}: {e}"))?;
                if let Err(failure) = reply.answer {
                    return Err(format!("write {path}: {failure:?}"));
                }
            }
            Ok::<(), String>(())
        };
        if let Err(error) = installed.await {
            tracing::warn!(sandbox = %record.id, %error, "the egress authority is not in the runtime's trust store");
        }
    }

    /// The image's own roots, read inside the runtime.
    async fn image_roots(&self, id: &SandboxId) -> Option<Vec<u8>> {
        for path in IMAGE_ROOTS {
            let op = FileOp::Read {
                path: path.to_owned(),
                start: 0,
                end: None,
                suffix: None,
                cap: 8 * 1024 * 1024,
            };
            if let Ok(reply) = self.backend.runtime_file(id, &op, Vec::new()).await {
                if reply.answer.is_ok() && !reply.data.is_empty() {
                    return Some(reply.data);
                }
            }
        }
        None
    }
}

/// This host's roots, for an image that has none of its own.
async fn host_roots() -> Vec<u8> {
    for path in IMAGE_ROOTS {
        if let Ok(bytes) = tokio::fs::read(path).await {
            return bytes;
        }
    }
    Vec::new()
}
