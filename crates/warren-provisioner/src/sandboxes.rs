//! Workdirs and sandbox identity: create, find, reclaim (I4, I5, I8, I12, I15).

use std::path::PathBuf;
use std::time::Duration;

use warren_backend::{Backend, BackendKind};
use warren_core::{
    Binding, BindingPart, DataLayout, ExtraMount, IsolationTier, LayoutName, NetworkPolicy,
    RuntimeScope, SandboxId, Uid, Workdir, PERSONAL_SKILLS,
};
use warren_fs::{FsError, WorkspaceRoot};
use warren_store::{NewSandbox, SandboxClaim, SandboxRecord, SandboxState, WorkdirRecord};

use crate::metrics::FailureCause;
use crate::transitions::LifeEvent;
use crate::{Provisioner, ProvisionerError};

/// The longest grace a termination gives running commands.
pub const MAX_TERMINATE_GRACE: Duration = Duration::from_secs(300);
/// The grace `POST /v1/sandboxes/{id}/terminate` gives when the caller names none.
pub const DEFAULT_TERMINATE_GRACE: Duration = Duration::from_secs(10);
/// How often a termination in its grace period looks for commands still running.
const GRACE_POLL: Duration = Duration::from_millis(20);

/// What `POST /v1/sandboxes` asks for, after the transport resolved the identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRequest {
    /// The workspace owner.
    pub uid: Uid,
    /// The runtime scope.
    pub scope: RuntimeScope,
    /// The workdir; `None` keeps a live sandbox's or makes a new `projects/<uuid>`.
    pub workdir: Option<String>,
    /// A branch of the workdir to write instead of the workdir itself (I27); part of the
    /// binding. `None` keeps a live sandbox's when no workdir is named, else none.
    pub branch: Option<String>,
    /// Where the runtime's processes may connect (I23); `None` takes the server's default
    /// ([`crate::ProvisionerConfig::default_network`]), which a live sandbox is then
    /// compared with like any policy named.
    pub network: Option<NetworkPolicy>,
    /// Whether commands get the global and the uid's agent environment (I14).
    pub inherit_env: bool,
    /// A temporary scope with no persistent uid mount (I14).
    pub ephemeral: bool,
    /// A runtime snapshot of one of the uid's sandboxes for the first runtime to start
    /// from (I30); only for a new sandbox or generation.
    pub from_snapshot: Option<String>,
    /// The backend by name (`local`, `docker`); `None` keeps a live sandbox's or takes
    /// the server's default.
    pub backend: Option<String>,
    /// The image, for backends that run images; `None` keeps a live sandbox's or takes
    /// the server's default image.
    pub image: Option<String>,
    /// What the runtime looks like from inside (I7); part of the binding. `None` keeps a
    /// live sandbox's or takes the default layout.
    pub layout: Option<LayoutName>,
    /// Operator-allowed host directories to show beside the layout's mounts; part of the
    /// binding. `None` keeps a live sandbox's or shows none. Only operator-facing
    /// transports set it (DeerFlow's `extra_mounts`, checked against warren.toml there).
    pub extra_mounts: Option<Vec<ExtraMount>>,
    /// The isolation tier its runtimes run on (issue 19); part of the binding. `None`
    /// keeps a live sandbox's or takes the server's default
    /// ([`crate::ProvisionerConfig::default_isolation`]).
    pub isolation: Option<IsolationTier>,
    /// Labels, a deadline and what it does: not part of the binding. A live sandbox's
    /// are changed by those given, as [`Provisioner::update_settings`] would.
    pub settings: crate::SettingsChange,
    /// Egress secrets of this sandbox's own (issue 38), over its uid's of the same name;
    /// set (or rotated) with the sandbox, gone when it ends.
    pub secrets: Vec<warren_core::EgressSecret>,
}

impl SandboxRequest {
    /// A request with the defaults: no workdir, the server's network policy, inheriting,
    /// persistent.
    pub fn new(uid: Uid, scope: RuntimeScope) -> Self {
        Self {
            uid,
            scope,
            workdir: None,
            branch: None,
            network: None,
            inherit_env: true,
            ephemeral: false,
            from_snapshot: None,
            backend: None,
            image: None,
            layout: None,
            extra_mounts: None,
            isolation: None,
            settings: crate::SettingsChange::default(),
            secrets: Vec::new(),
        }
    }
}

/// Refuses a tier the backend of `kind` cannot run on this host now (issue 19): a sandbox
/// is never bound to a tier only to fail at its first exec, and a server never starts with
/// a default tier its default backend cannot run. The kernel tier is every backend's.
pub fn check_isolation(
    backend: &dyn Backend,
    kind: BackendKind,
    isolation: IsolationTier,
) -> Result<(), ProvisionerError> {
    match isolation {
        IsolationTier::Kernel => Ok(()),
        IsolationTier::Gvisor => match backend.gvisor_unavailable(kind) {
            None => Ok(()),
            Some(reason) => Err(ProvisionerError::IsolationUnavailable {
                backend: kind.as_str(),
                reason,
            }),
        },
    }
}

/// Refuses what the backend of `kind` cannot mount (an ephemeral sandbox's scratch tree,
/// extra mounts: directories of warren's host) before anything is recorded: a pod would
/// otherwise be refused at its first command, or worse, see the uid's persistent
/// workspace where a scratch tree was promised (I14).
fn check_host_mounts(
    backend: &dyn Backend,
    kind: BackendKind,
    ephemeral: bool,
    extra_mounts: &[ExtraMount],
) -> Result<(), ProvisionerError> {
    if backend
        .capabilities_of(kind)
        .is_none_or(|capabilities| capabilities.host_mounts)
    {
        return Ok(());
    }
    let what = if ephemeral {
        "an ephemeral sandbox's scratch tree"
    } else if !extra_mounts.is_empty() {
        "extra mounts"
    } else {
        return Ok(());
    };
    Err(ProvisionerError::HostMountsUnsupported {
        backend: kind.as_str(),
        what,
    })
}

/// Whether a create call made something new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// It was created by this call.
    New,
    /// It existed already with this identity.
    Existing,
}

impl Provisioner {
    /// Creates (or confirms) a workdir of `uid`, making the UserWorkspace and the skill
    /// projection directories on first use. Only the workdir itself is created: `uploads/`
    /// and `outputs/` appear on first use (I8).
    pub async fn create_workdir(
        &self,
        uid: &Uid,
        path: Option<&str>,
    ) -> Result<(Workdir, Created), ProvisionerError> {
        let workdir = match path {
            Some(path) => Workdir::new(path)?,
            None => Workdir::new_project(),
        };
        let workspace = self.prepare_user_workspace(uid).await?;
        let relative = workdir.as_str().to_owned();
        let created = self
            .blocking(move || -> Result<bool, ProvisionerError> {
                let workspace = WorkspaceRoot::open(&workspace)
                    .map_err(|source| file_error("the user workspace", source))?;
                workspace
                    .mkdir_p(&relative)
                    .map_err(|source| workdir_error(&relative, source))
            })
            .await
            .map_err(|error| self.quota_error(uid, error))?;
        self.store.record_workdir(uid, &workdir).await?;
        // A new workdir brings the skills every uid gets (I32). A broken skill directory
        // is the operator's to fix; it must not keep users from creating workdirs.
        let sources = &self.config.skill_sources;
        if created && (sources.builtin.is_some() || sources.shared.is_some()) {
            if let Err(error) = self.sync_skills(uid).await {
                tracing::warn!(%uid, %error, "could not build the skill projection");
            }
        }
        let created = if created {
            Created::New
        } else {
            Created::Existing
        };
        Ok((workdir, created))
    }

    /// The workdirs recorded for `uid`.
    pub async fn list_workdirs(&self, uid: &Uid) -> Result<Vec<WorkdirRecord>, ProvisionerError> {
        Ok(self.store.list_workdirs(uid).await?)
    }

    /// Finds or creates the sandbox of (uid, scope) bound to `workdir`, without starting a
    /// runtime (I12). With no workdir, a live sandbox keeps its own and a new one gets a
    /// fresh `projects/<uuid>` (I8).
    ///
    /// An ephemeral sandbox never touches the uid's persistent workspace: its workdir is
    /// made in a scratch tree of its own, which its runtime mounts instead and which goes
    /// with the sandbox (I14).
    pub async fn create_sandbox(
        &self,
        request: SandboxRequest,
    ) -> Result<(SandboxRecord, Created), ProvisionerError> {
        let SandboxRequest {
            uid,
            scope,
            workdir,
            branch,
            network,
            inherit_env,
            ephemeral,
            from_snapshot,
            backend,
            image,
            layout,
            extra_mounts,
            isolation,
            settings,
            secrets,
        } = request;
        self.check_secrets(&secrets)?;
        let network = network
            .unwrap_or_else(|| self.config.default_network.clone())
            .validate()?;
        // Checked before anything is made; a new generation starts with them.
        let new_settings = settings.apply_to(warren_store::SandboxSettings::default())?;
        if let Some(snapshot) = &from_snapshot {
            // Only the uid's own snapshots: another user's state never seeds a runtime. An
            // id no snapshot can have (a control character, overlong) is not looked up:
            // it is not found, like any other.
            let plausible = snapshot.len() <= 256 && !snapshot.chars().any(char::is_control);
            let found = if plausible {
                self.store.get_runtime_snapshot(snapshot).await?
            } else {
                None
            };
            let owned = match found {
                Some(found) => self
                    .store
                    .get_sandbox(&found.sandbox_id)
                    .await?
                    .is_some_and(|owner| owner.uid == uid),
                None => false,
            };
            if !owned {
                return Err(ProvisionerError::SnapshotNotFound {
                    snapshot: snapshot.chars().take(100).collect(),
                });
            }
        }
        let id = SandboxId::derive(&uid, &scope);
        let live = self
            .store
            .get_sandbox(&id)
            .await?
            .filter(|record| record.state != SandboxState::Terminated);
        let (backend, image) = self.choose_backend(backend, image, live.as_ref())?;
        let isolation = isolation
            .or(live.as_ref().map(|record| record.binding.isolation))
            .unwrap_or(self.config.default_isolation);
        // A new sandbox (or generation) on a tier its backend cannot run is refused now,
        // before any workdir, scratch tree or record is made (issue 19). A live sandbox
        // keeps its binding; another tier for it is the claim's conflict to report.
        if live.is_none() {
            check_isolation(self.backend.as_ref(), backend, isolation)?;
        }
        let layout: LayoutName = layout
            .or(live.as_ref().map(|record| record.binding.layout))
            .unwrap_or_default();
        let extra_mounts = extra_mounts
            .or(live
                .as_ref()
                .map(|record| record.binding.extra_mounts.clone()))
            .unwrap_or_default();
        // Checked again here, where the rules live, whatever the transport checked: each
        // against the layout it is shown in, and the set as a whole.
        ExtraMount::check_set(&extra_mounts)?;
        check_host_mounts(self.backend.as_ref(), backend, ephemeral, &extra_mounts)?;
        for mount in &extra_mounts {
            ExtraMount::new(
                &mount.target,
                mount.root.clone(),
                &mount.beneath,
                mount.writable,
                layout.layout(),
            )?;
        }
        // Before anything is recorded: a source that cannot be used is refused now, not
        // left behind in a sandbox nobody can start.
        self.prepare_extra_mounts(extra_mounts.clone()).await?;
        // A new sandbox (or generation) whose image the backend cannot start is refused
        // now, before anything is made, not at its first exec (I18: warren never pulls).
        // A live sandbox keeps its binding; a different image for it is the claim's
        // conflict to report.
        if let (Some(image), None) = (&image, &live) {
            self.backend
                .check_image(&id, backend, image)
                .await
                .map_err(ProvisionerError::Backend)?;
        }
        let named_workdir = workdir.is_some();
        let workdir = match (workdir, &live) {
            (Some(path), _) => {
                let workdir = Workdir::new(path)?;
                if !ephemeral {
                    self.check_workdir_exists(&uid, &workdir).await?;
                }
                workdir
            }
            (None, Some(record)) => record.binding.workdir.clone(),
            (None, None) if ephemeral => Workdir::new_project(),
            (None, None) => self.create_workdir(&uid, None).await?.0,
        };
        let branch = match (branch, &live) {
            (Some(name), _) => Some(warren_core::BranchName::new(name)?),
            (None, Some(record)) if !named_workdir => record.binding.branch.clone(),
            (None, _) => None,
        };
        if !ephemeral {
            let frozen = self.frozen_workdirs(&uid).await?;
            self.refuse_writable_baseline(&uid, backend, layout, &workdir, &frozen)?;
        }
        if let Some(name) = &branch {
            // An ephemeral sandbox's scratch workdir has no branches.
            if ephemeral {
                return Err(ProvisionerError::BranchNotFound {
                    workdir: workdir.to_string(),
                    name: name.to_string(),
                });
            }
            if backend == BackendKind::Kubernetes {
                return Err(ProvisionerError::BranchesUnsupported {
                    reason: "the kubernetes backend mounts claims, not warren's host".to_owned(),
                });
            }
            // It must exist now, and be mountable: refused before anything is recorded.
            let found = self.branch(&uid, &workdir, name).await?;
            self.branch_tree(&found).await?;
        }
        let binding = Binding {
            workdir,
            branch,
            network,
            backend,
            image,
            inherit_env,
            ephemeral,
            layout,
            extra_mounts,
            isolation,
        };
        let claim = self
            .store
            .claim_sandbox(&NewSandbox {
                id,
                uid,
                runtime_scope: scope,
                binding: binding.clone(),
                seed_snapshot: from_snapshot.clone(),
                settings: new_settings,
            })
            .await?;
        if from_snapshot.is_some() && matches!(claim, SandboxClaim::Existing(_)) {
            return Err(ProvisionerError::SandboxAlreadyLive {
                sandbox: claim.into_record().id,
            });
        }
        match claim {
            SandboxClaim::Created(record) => {
                if record.binding.ephemeral {
                    self.prepare_scratch(&record, true).await?;
                }
                self.prepare_layout(&record).await?;
                // A generation starts with the secrets it was created with, no others.
                self.store.remove_sandbox_egress(&record.id).await?;
                self.set_sandbox_secrets(&record, secrets).await?;
                tracing::info!(sandbox = %record.id, generation = record.generation, ephemeral = record.binding.ephemeral, inherit_env = record.binding.inherit_env, "sandbox created");
                Ok((record, Created::New))
            }
            SandboxClaim::Existing(record) => {
                if record.binding.ephemeral {
                    self.prepare_scratch(&record, false).await?;
                }
                self.prepare_layout(&record).await?;
                self.set_sandbox_secrets(&record, secrets).await?;
                let record = if settings.is_empty() {
                    record
                } else {
                    self.update_settings(&record.id, settings).await?
                };
                Ok((record, Created::Existing))
            }
            SandboxClaim::Conflict { part, sandbox } => {
                Err(binding_conflict(part, sandbox, binding))
            }
        }
    }

    /// Makes what the sandbox's layout needs in its persistent trees before a runtime
    /// mounts them: the workdir's skeleton directories and, where the layout shows them,
    /// the uid's personal-skills directory (I9). Everything is made by descriptor, no
    /// symlink followed, owned by the sandbox user (I2, I11); what exists is kept.
    pub(crate) async fn prepare_layout(
        &self,
        record: &SandboxRecord,
    ) -> Result<(), ProvisionerError> {
        let layout = record.binding.layout.layout();
        self.prepare_extra_mounts(record.binding.extra_mounts.clone())
            .await?;
        if layout.workdir_skeleton.is_empty() && !layout.shows_personal_skills() {
            return Ok(());
        }
        let (workspace, _) = self.mounts(record);
        let workdir = record.binding.workdir.as_str().to_owned();
        let personal = layout.shows_personal_skills();
        let skeleton = layout.workdir_skeleton;
        self.blocking(move || {
            let workspace = WorkspaceRoot::open(&workspace)
                .map_err(|source| file_error("the user workspace", source))?;
            for dir in skeleton {
                workspace
                    .mkdir_p(&format!("{workdir}/{dir}"))
                    .map_err(|source| workdir_error(&workdir, source))?;
            }
            if personal {
                workspace
                    .mkdir_p(PERSONAL_SKILLS)
                    .map_err(|source| file_error("the personal skills", source))?;
            }
            Ok(())
        })
        .await
        .map_err(|error| self.quota_error(&record.uid, error))
    }

    /// Makes each extra mount's source beneath its operator directory when it is missing
    /// (as a hostPath of type DirectoryOrCreate would; the source owned by the sandbox
    /// user, the directories above it by the server), by descriptor with no link followed: a link planted anywhere beneath the operator's directory is refused, never
    /// followed out of it (I2). The operator's directory itself must exist.
    async fn prepare_extra_mounts(&self, mounts: Vec<ExtraMount>) -> Result<(), ProvisionerError> {
        if mounts.is_empty() {
            return Ok(());
        }
        self.blocking(move || {
            for mount in &mounts {
                // The directories above the source stay the server's; only the source
                // itself is handed to the sandbox user (I11), as a workdir is.
                let made = (|| {
                    let root = WorkspaceRoot::open(&mount.root)?;
                    let owner = root.owner();
                    let root = root.with_owner(None);
                    if let Some((parent, _)) = mount.beneath.rsplit_once('/') {
                        root.mkdir_p(parent)?;
                    }
                    let root = root.with_owner(owner);
                    root.mkdir_p(&mount.beneath)?;
                    root.subroot(mount.beneath.as_str())
                })();
                if let Err(source) = made {
                    return Err(ProvisionerError::ExtraMountSource {
                        target: mount.target.clone(),
                        source,
                    });
                }
            }
            Ok(())
        })
        .await
    }

    /// The backend and image a claim binds: what the request names, else what the live
    /// sandbox runs on, else the server's defaults. Only backends this server runs are
    /// accepted; a backend that runs images gets one, checked for shape.
    fn choose_backend(
        &self,
        backend: Option<String>,
        image: Option<String>,
        live: Option<&SandboxRecord>,
    ) -> Result<(BackendKind, Option<String>), ProvisionerError> {
        let enabled = || {
            self.backends()
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let kind = match (&backend, live) {
            (Some(name), _) => BackendKind::parse(name)
                .filter(|kind| self.backends().contains(kind))
                .ok_or_else(|| ProvisionerError::BackendUnavailable {
                    requested: name.chars().take(64).collect(),
                    enabled: enabled(),
                })?,
            (None, Some(record)) => record.binding.backend,
            (None, None) => self.backend.kind(),
        };
        if !kind.takes_image() {
            return match image {
                Some(_) => Err(ProvisionerError::InvalidImage {
                    reason: format!(
                        "the {} backend takes no image; `image` is for \"backend\": \"docker\" or \"kubernetes\"",
                        kind.as_str()
                    ),
                }),
                None => Ok((kind, None)),
            };
        }
        let image = match (image, live) {
            (Some(image), _) => image,
            (None, Some(record)) if backend.is_none() || record.binding.backend == kind => {
                match &record.binding.image {
                    Some(image) => image.clone(),
                    None => self.default_image_for(kind)?,
                }
            }
            _ => self.default_image_for(kind)?,
        };
        check_image_reference(&image)?;
        Ok((kind, Some(image)))
    }

    fn default_image_for(&self, kind: BackendKind) -> Result<String, ProvisionerError> {
        self.config
            .default_images
            .get(&kind)
            .cloned()
            .ok_or_else(|| ProvisionerError::InvalidImage {
                reason: format!(
                    "the {kind} backend has no default image: pass \"image\", or start warren \
                     with {kind}.image set (--image when it is the default backend)",
                    kind = kind.as_str()
                ),
            })
    }

    /// Makes the scratch tree of an ephemeral sandbox: `workspace/` (owned by the sandbox
    /// user) with the workdir inside, and an empty `skills/`. A new generation starts from
    /// an empty tree, whatever an interrupted cleanup left (`fresh`). Runs under the
    /// lifecycle lock, so it never races a runtime start or a termination.
    async fn prepare_scratch(
        &self,
        record: &SandboxRecord,
        fresh: bool,
    ) -> Result<(), ProvisionerError> {
        let lock = self.lifecycle_lock(&record.id);
        let _guard = lock.lock().await;
        let data_dir = self.layout().workspace_dir().to_owned();
        let sandbox = record.id.as_str().to_owned();
        let workdir = record.binding.workdir.as_str().to_owned();
        self.blocking(move || {
            let data = WorkspaceRoot::open(&data_dir)
                .map_err(|source| file_error("the workspace directory", source))?
                .with_owner(None);
            data.mkdir_p(DataLayout::SCRATCH_RELATIVE)
                .map_err(|source| file_error("the scratch directory", source))?;
            let scratch = WorkspaceRoot::open(&data_dir.join(DataLayout::SCRATCH_RELATIVE))
                .map_err(|source| file_error("the scratch directory", source))?
                .with_owner(None);
            if fresh {
                match scratch.remove(&sandbox, true) {
                    Ok(()) | Err(FsError::NotFound { .. }) => {}
                    Err(source) => return Err(file_error("the scratch directory", source)),
                }
            }
            scratch
                .mkdir_p(&format!("{sandbox}/skills"))
                .map_err(|source| file_error("the scratch directory", source))?;
            // The stand-in workspace and everything inside belong to the sandbox user
            // (I11), as a UserWorkspace does; the tree around it stays the provisioner's.
            let tree = data_dir.join(DataLayout::SCRATCH_RELATIVE).join(&sandbox);
            WorkspaceRoot::open(&tree)
                .and_then(|tree| tree.mkdir_p("workspace"))
                .map_err(|source| file_error("the scratch workspace", source))?;
            let workspace = WorkspaceRoot::open(&tree.join("workspace"))
                .map_err(|source| file_error("the scratch workspace", source))?;
            workspace
                .mkdir_p(&workdir)
                .map_err(|source| workdir_error(&workdir, source))?;
            Ok(())
        })
        .await
    }

    /// Removes the scratch tree of an ephemeral sandbox (I14). Safe to repeat.
    pub(crate) async fn remove_scratch(&self, id: &SandboxId) -> Result<(), ProvisionerError> {
        self.remove_scratch_entry(id.as_str().to_owned()).await
    }

    /// Removes one entry of the scratch directory by name, without following anything in it
    /// (a sandbox user made its contents).
    pub(crate) async fn remove_scratch_entry(
        &self,
        sandbox: String,
    ) -> Result<(), ProvisionerError> {
        let scratch_dir = self
            .layout()
            .workspace_dir()
            .join(DataLayout::SCRATCH_RELATIVE);
        self.blocking(move || {
            let scratch = match WorkspaceRoot::open(&scratch_dir) {
                Ok(root) => root.with_owner(None),
                Err(FsError::RootUnavailable { .. }) => return Ok(()),
                Err(source) => return Err(file_error("the scratch directory", source)),
            };
            match scratch.remove(&sandbox, true) {
                Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
                Err(source) => Err(file_error("the scratch directory", source)),
            }
        })
        .await
    }

    /// The host directories a runtime of `record` mounts at `/home/gem/user-data` and
    /// `/home/gem/skills` (I7): the uid's, or the scratch tree's for an ephemeral sandbox.
    pub(crate) fn mounts(&self, record: &SandboxRecord) -> (PathBuf, PathBuf) {
        if record.binding.ephemeral {
            (
                self.layout().scratch_workspace(&record.id),
                self.layout().scratch_skills(&record.id),
            )
        } else {
            let safe = record.uid.safe();
            (
                self.layout().user_workspace(&safe),
                self.layout().skill_projection(&safe),
            )
        }
    }

    /// The sandbox with this id.
    pub async fn sandbox(&self, id: &SandboxId) -> Result<SandboxRecord, ProvisionerError> {
        self.store
            .get_sandbox(id)
            .await?
            .ok_or_else(|| ProvisionerError::SandboxNotFound(id.clone()))
    }

    /// All sandboxes, or those of one uid.
    pub async fn list_sandboxes(
        &self,
        uid: Option<&Uid>,
    ) -> Result<Vec<SandboxRecord>, ProvisionerError> {
        Ok(self.store.list_sandboxes(uid).await?)
    }

    /// Reclaims the sandbox's runtime and marks it terminated. Workspace files stay (I15).
    /// Terminating an already terminated sandbox returns it unchanged.
    ///
    /// The cleanup fence (I24) goes up at once; commands already running get up to `grace`
    /// to finish before the runtime, and with it their process trees, is destroyed.
    pub async fn terminate_sandbox(
        &self,
        id: &SandboxId,
        grace: Duration,
    ) -> Result<SandboxRecord, ProvisionerError> {
        if grace > MAX_TERMINATE_GRACE {
            return Err(ProvisionerError::BadRequest(
                "grace_s must be between 0 and 300 seconds",
            ));
        }
        self.terminate(id, grace, None).await
    }

    /// The one path every end of a sandbox takes (I24). With `only_running`, it ends the
    /// sandbox only if it still runs that generation and returns `None` otherwise, so a
    /// reaper acting on an older view never ends a newer generation.
    pub(crate) async fn terminate(
        &self,
        id: &SandboxId,
        grace: Duration,
        only_running: Option<i64>,
    ) -> Result<SandboxRecord, ProvisionerError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        // The fence goes up first: from here on, execs of this generation are refused.
        let fenced = loop {
            let record = self.sandbox(id).await?;
            if let Some(generation) = only_running {
                if record.generation != generation || record.state != SandboxState::Running {
                    return Ok(record);
                }
            }
            if record.state == SandboxState::Terminated {
                return Ok(record);
            }
            if let Some(fenced) = self.advance(&record, LifeEvent::Terminate, None).await? {
                break fenced;
            }
        };
        self.finish_termination(fenced, grace).await
    }

    /// The rest of a termination once the fence is up (`fenced` is terminating): the
    /// runtime ends where it runs, an ephemeral scratch tree goes, the sandbox is
    /// terminated. The caller holds the sandbox's lifecycle lock.
    pub(crate) async fn finish_termination(
        &self,
        fenced: SandboxRecord,
        grace: Duration,
    ) -> Result<SandboxRecord, ProvisionerError> {
        let id = &fenced.id;
        self.end_runtime(id, grace).await?;
        if fenced.binding.ephemeral {
            // The scratch tree is the ephemeral sandbox's only state. If it cannot go now,
            // the sandbox still ends; start-up reconciliation removes leftovers.
            if let Err(error) = self.remove_scratch(id).await {
                self.metrics.failed(FailureCause::Destroy);
                tracing::error!(sandbox = %id, %error, "could not remove an ephemeral sandbox's scratch tree");
            }
        }
        // Its own secrets and its authority end with it; its egress audit stays (I22).
        if let Err(error) = self.store.remove_sandbox_egress(id).await {
            tracing::warn!(sandbox = %id, %error, "could not remove a sandbox's egress secrets; its next generation removes them");
        }
        self.egress_broker.forget(id);
        let terminated = match self.advance(&fenced, LifeEvent::Terminated, None).await? {
            Some(terminated) => terminated,
            // Another replica's termination of the same generation finished first.
            None => self.sandbox(id).await?,
        };
        tracing::info!(sandbox = %id, generation = terminated.generation, "sandbox terminated; workspace kept");
        Ok(terminated)
    }

    /// Ends the sandbox's runtime where it runs (issue 14): here, or at its owner. The
    /// sandbox is behind a fence (terminating or pausing) already: nothing new starts.
    pub(crate) async fn end_runtime(
        &self,
        id: &SandboxId,
        grace: Duration,
    ) -> Result<(), ProvisionerError> {
        match self.place_runtime(id).await? {
            crate::ownership::Placement::Here(_) => self.end_runtime_here(id, grace).await,
            crate::ownership::Placement::Elsewhere(owner) => {
                self.metrics.forwarded();
                let ended = self.peer_link()?.end_runtime(&owner, id, grace).await;
                self.after_forward(id, ended)
            }
        }
    }

    /// Ends this node's runtime of `id` once its commands finished or `grace` passed, and
    /// gives its ownership up. The sandbox's fence is up already: nothing new starts.
    async fn end_runtime_here(
        &self,
        id: &SandboxId,
        grace: Duration,
    ) -> Result<(), ProvisionerError> {
        // Commands in flight hold no lifecycle lock, so they finish (or not) while this
        // waits; nothing new can start behind the fence.
        let waiting = tokio::time::Instant::now();
        let deadline = waiting + grace;
        while self.inflight(id) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(GRACE_POLL.min(deadline - tokio::time::Instant::now())).await;
        }
        self.metrics.fence_waited(waiting.elapsed());
        if let Err(error) = self.backend.destroy(id).await {
            self.metrics.failed(FailureCause::Destroy);
            return Err(ProvisionerError::Backend(error));
        }
        self.release_runtime(id).await;
        Ok(())
    }

    /// Ends the runtime of `id` for the node that terminates the sandbox: forwarded here
    /// because this node owns it. Nothing to do when it does not (any more).
    pub async fn end_runtime_as_owner(
        &self,
        id: &SandboxId,
        grace: Duration,
    ) -> Result<(), ProvisionerError> {
        if grace > MAX_TERMINATE_GRACE {
            return Err(ProvisionerError::BadRequest(
                "grace_s must be between 0 and 300 seconds",
            ));
        }
        if self.owner_fence(id).is_none() {
            return Ok(());
        }
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        self.end_runtime_here(id, grace).await
    }

    pub(crate) async fn check_workdir_exists(
        &self,
        uid: &Uid,
        workdir: &Workdir,
    ) -> Result<(), ProvisionerError> {
        self.workspaces().check_workdir_exists(uid, workdir).await
    }

    /// Runs blocking file work off the async threads.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, ProvisionerError> + Send + 'static,
    ) -> Result<T, ProvisionerError> {
        self.workspaces().blocking(work).await
    }
}

/// The error of a claim refused because the live generation of `bound` differs from
/// `requested` first in `part`: each part has its own stable code.
fn binding_conflict(
    part: BindingPart,
    bound: SandboxRecord,
    requested: Binding,
) -> ProvisionerError {
    let sandbox = bound.id;
    let bound = bound.binding;
    match part {
        BindingPart::Workdir => ProvisionerError::WorkdirConflict {
            sandbox,
            bound: bound.workdir.to_string(),
            requested: requested.workdir.to_string(),
        },
        BindingPart::Network => ProvisionerError::NetworkConflict {
            sandbox,
            bound: bound.network.mode(),
            requested: requested.network.mode(),
        },
        BindingPart::EnvPolicy => ProvisionerError::EnvPolicyConflict {
            sandbox,
            inherit_env: bound.inherit_env,
            ephemeral: bound.ephemeral,
        },
        BindingPart::Backend => ProvisionerError::BackendConflict {
            sandbox,
            backend: bound.backend.as_str().to_owned(),
            image: bound.image,
        },
        BindingPart::Layout => ProvisionerError::LayoutConflict {
            sandbox,
            bound: bound.layout,
            requested: requested.layout,
        },
        BindingPart::ExtraMounts => ProvisionerError::ExtraMountsConflict { sandbox },
        BindingPart::Isolation => ProvisionerError::IsolationConflict {
            sandbox,
            bound: bound.isolation,
            requested: requested.isolation,
        },
    }
}

pub(crate) fn file_error(what: &str, source: FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: what.to_owned(),
        source,
    }
}

pub(crate) fn workdir_error(workdir: &str, source: FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: format!("workdir {workdir}"),
        source,
    }
}

/// An image reference as Docker writes one: `[registry/]name[:tag][@digest]`, lowercase
/// names, at most 255 bytes. Anything else (an option-looking string, spaces, control
/// characters) is refused before it reaches the engine.
fn check_image_reference(image: &str) -> Result<(), ProvisionerError> {
    let bad = |why: &str| ProvisionerError::InvalidImage {
        reason: format!(
            "image {:?} is not a valid image reference: {why}",
            image.chars().take(80).collect::<String>()
        ),
    };
    if image.is_empty() || image.len() > 255 {
        return Err(bad("it must have 1 to 255 characters"));
    }
    if image.starts_with(['-', '.', '/', ':', '@']) {
        return Err(bad("it must start with a letter or digit"));
    }
    if !image
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b))
    {
        return Err(bad("only letters, digits and . _ - / : @ are allowed"));
    }
    Ok(())
}

#[cfg(test)]
mod isolation_tests;

#[cfg(test)]
mod network_tests;

#[cfg(test)]
mod image_tests {
    use super::check_image_reference;

    #[test]
    fn image_references_are_checked_for_shape() {
        for good in [
            "warren-test:bookworm-1",
            "debian",
            "registry.example.com:5000/team/app:1.2",
            "alpine@sha256:0123456789abcdef",
        ] {
            assert!(check_image_reference(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-v",
            "--privileged",
            "a b",
            "x\ny",
            "../etc",
            "/abs",
            "ünicode",
        ] {
            assert!(check_image_reference(bad).is_err(), "{bad:?}");
        }
        assert!(check_image_reference(&"a".repeat(256)).is_err());
    }
}
