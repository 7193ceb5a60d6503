//! File operations by virtual path (I1, I2, I7, I10, I27): on a sandbox's persistent
//! mounts, and anywhere else in its runtime (issue 42).
//!
//! A virtual path is parsed against the sandbox's workdir. Under a persistent mount it is
//! mapped to the UserWorkspace, the skill projection or an extra mount and handed to
//! `warren-fs`, which resolves it by file descriptor beneath that root on the host; writes
//! under `/home/gem/skills` are refused here and again by the read-only root. These need no
//! runtime and never start one (I17). Any other absolute path (`/tmp`, the home, the
//! image's tree) is the runtime's own: the backend hands the operation to the runtime's
//! agent, which runs the same `warren-fs` operation inside, as the sandbox user, resolved
//! beneath the runtime's root (`warren_backend::FileOp`); the runtime is started for it
//! if it is not running (I12), and its permissions are the kernel's for uid 1000.

use warren_backend::{BackendError, FileAnswer, FileOp, FileReply};
use warren_core::{SandboxId, VirtualPath, VirtualRoot, Workdir};
use warren_fs::{
    ByteRange, EditResult, Entry, Etag, FsError, GrepOptions, GrepResult, Listing, ReadResult,
    WorkspaceRoot, WriteOptions, WriteResult,
};
use warren_store::{SandboxRecord, SandboxState};

use crate::exec::Route;
use crate::{Provisioner, ProvisionerError};

/// A value together with the virtual path it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located<T> {
    /// The virtual path the operation resolved.
    pub path: VirtualPath,
    /// What the file layer returned; paths inside it are relative to `path`'s root.
    pub value: T,
}

/// A read: the bytes and the virtual path.
pub type FileRead = Located<ReadResult>;
/// A write, append or edit.
pub type Written = Located<WriteResult>;

/// Whether an operation changes files (refused under the read-only skills mount).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// The two roots one sandbox's file operations can reach.
pub(crate) struct SandboxRoots {
    /// The uid whose quota a full workspace is, when it has a volume of its own (I23).
    quota_uid: Option<warren_core::Uid>,
    layout: &'static warren_core::Layout,
    extra_mounts: Vec<warren_core::ExtraMount>,
    workdir: Workdir,
    workspace: std::path::PathBuf,
    skills: std::path::PathBuf,
    /// The view of the branch the sandbox is bound to, shown where the workdir is (I27).
    branch: Option<std::path::PathBuf>,
    /// The uid's workdirs that are read-only baselines while they have branches (I27).
    frozen: Vec<Workdir>,
}

impl SandboxRoots {
    pub(crate) fn resolve(&self, input: &str) -> Result<VirtualPath, ProvisionerError> {
        let path = VirtualPath::parse(input, self.layout, &self.extra_mounts, &self.workdir)?;
        Ok(self.on_branch(path))
    }

    /// [`Self::resolve`], and an absolute path outside every mount as the runtime's own.
    pub(crate) fn resolve_anywhere(&self, input: &str) -> Result<VirtualPath, ProvisionerError> {
        let path =
            VirtualPath::parse_anywhere(input, self.layout, &self.extra_mounts, &self.workdir)?;
        Ok(self.on_branch(path))
    }

    /// `path` as a sandbox bound to a branch sees it: in the branch where the workdir is.
    fn on_branch(&self, path: VirtualPath) -> VirtualPath {
        match self.branch {
            Some(_) => path.on_branch(&self.workdir),
            None => path,
        }
    }

    /// Refuses a change of a read-only baseline (I27): anything inside a branched workdir,
    /// and, with `ancestors`, a directory holding one (removed or moved, it would take the
    /// baseline with it).
    pub(crate) fn refuse_frozen(
        &self,
        path: &VirtualPath,
        ancestors: bool,
    ) -> Result<(), ProvisionerError> {
        if path.root() != VirtualRoot::UserData {
            return Ok(());
        }
        let relative = path.relative();
        let hit = self.frozen.iter().find(|frozen| {
            frozen.holds(relative) || (ancestors && warren_core::within(relative, frozen.as_str()))
        });
        match hit {
            Some(frozen) => Err(ProvisionerError::WorkdirBranched {
                path: path.to_string(),
                workdir: frozen.to_string(),
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn open(&self, path: &VirtualPath) -> Result<WorkspaceRoot, ProvisionerError> {
        let root = match path.root() {
            // Not on the host: only the runtime's agent reaches it (`in_runtime`).
            VirtualRoot::Runtime => Err(FsError::NotFound {
                path: path.to_string(),
            }),
            VirtualRoot::UserData => WorkspaceRoot::open(&self.workspace),
            VirtualRoot::Branch => match &self.branch {
                Some(branch) => WorkspaceRoot::open(branch),
                None => Err(FsError::NotFound {
                    path: path.to_string(),
                }),
            },
            VirtualRoot::Skills => WorkspaceRoot::open(&self.skills),
            // The operator's directory by its path, the source beneath it by descriptor
            // with no link followed, exactly as the backends mount it (I2).
            VirtualRoot::Extra(index) => match self.extra_mounts.get(usize::from(index)) {
                Some(mount) => WorkspaceRoot::open(&mount.root)
                    .and_then(|root| root.subroot(mount.beneath.as_str())),
                None => Err(FsError::NotFound {
                    path: path.to_string(),
                }),
            },
        };
        // A read-only mount (the skills, DeerFlow's personal skills) is read-only twice
        // over: the provisioner refuses writes before they get here, and the root itself
        // refuses every mutating call (I7).
        match root {
            Ok(root) if !path.is_writable() => Ok(root.read_only()),
            Ok(root) => Ok(root),
            Err(source) => Err(fs_error(path, source)),
        }
    }

    /// A file error on `path`; a full workspace volume is its uid's quota (I23).
    fn error(&self, path: &VirtualPath, source: FsError) -> ProvisionerError {
        match &self.quota_uid {
            Some(uid) if path.root() == VirtualRoot::UserData && crate::is_disk_full(&source) => {
                ProvisionerError::QuotaExceeded {
                    uid: uid.to_string(),
                    path: path.to_string(),
                }
            }
            _ => fs_error(path, source),
        }
    }

    fn open_writable(&self, path: &VirtualPath) -> Result<WorkspaceRoot, ProvisionerError> {
        if !path.is_writable() {
            return Err(ProvisionerError::ReadOnlyPath {
                path: path.to_string(),
            });
        }
        self.refuse_frozen(path, false)?;
        self.open(path)
    }
}

/// A mount's root is never removed, moved or replaced: in a layout that mounts the workdir
/// (DeerFlow's `/mnt/user-data`, E2B's `/home/user`) it is the workdir itself, which the
/// file layer would otherwise let go as an ordinary directory of the workspace (I15).
fn refuse_mount_root(path: &VirtualPath, action: &'static str) -> Result<(), ProvisionerError> {
    if path.is_mount_root() {
        return Err(fs_error(path, FsError::RootRefused { action }));
    }
    Ok(())
}

/// Whether a file operation in a runtime that does not run starts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IfStopped {
    /// Start it (I12): what a client's file operation does.
    Start,
    /// Refuse with `runtime_stopped`: a watch's later listings, which must neither keep
    /// a runtime up nor bring a reaped one back.
    Refuse,
}

/// The refusal of an operation on a runtime path once the runtime no longer runs.
fn runtime_stopped(id: &SandboxId, op: &FileOp) -> ProvisionerError {
    ProvisionerError::RuntimeStopped {
        sandbox: id.clone(),
        path: op.path().to_owned(),
    }
}

fn fs_error(path: &VirtualPath, source: FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: path.to_string(),
        source,
    }
}

impl Provisioner {
    /// The roots of a file operation, which counts as sandbox activity.
    async fn roots(&self, id: &SandboxId) -> Result<SandboxRoots, ProvisionerError> {
        let record: SandboxRecord = self.sandbox(id).await?;
        // File access proves ownership and no-follow resolution, not that a runtime is
        // usable (I17), so it is allowed in every state, including after termination: the
        // files are the user's and stay (I15).
        // Activity only delays the reaper: failing to record it (a full disk, a busy store)
        // must not fail the file operation, least of all the delete that makes room.
        if let Err(error) = self.store.touch_sandbox(id).await {
            tracing::warn!(sandbox = %id, %error, "could not record file activity");
        }
        self.roots_of(&record).await
    }

    pub(crate) async fn roots_of(
        &self,
        record: &SandboxRecord,
    ) -> Result<SandboxRoots, ProvisionerError> {
        let (workspace, skills) = self.mounts(record);
        let (branch, frozen) = self.branch_view(record).await?;
        Ok(SandboxRoots {
            quota_uid: (!record.binding.ephemeral && self.quota_enforced_for(&record.uid))
                .then(|| record.uid.clone()),
            layout: record.binding.layout.layout(),
            extra_mounts: record.binding.extra_mounts.clone(),
            workdir: record.binding.workdir.clone(),
            workspace,
            skills,
            branch,
            frozen,
        })
    }

    /// The working directory a command asked for, as the runtime's path. Under one of
    /// the sandbox's mounts it must be an existing directory, resolved by descriptor like
    /// a read (no link, no `..`). Anywhere else in the runtime (`/`, `/tmp`) it is the
    /// runtime's own tree, outside what the file API serves: a process may start there,
    /// and the command's chdir, as the sandbox user, says whether it can. (The run itself
    /// records the activity.) No directory asked for is the workdir.
    pub(crate) async fn start_dir(
        &self,
        record: &SandboxRecord,
        cwd: Option<&str>,
    ) -> Result<String, ProvisionerError> {
        match cwd {
            Some(cwd) => self.exec_cwd(record, cwd).await,
            // The workdir was checked when the sandbox was created; if it vanished since,
            // the command's own chdir (as the sandbox user) reports it.
            None => Ok(VirtualPath::parse(
                ".",
                record.binding.layout.layout(),
                &[],
                &record.binding.workdir,
            )?
            .to_string()),
        }
    }

    /// [`Self::start_dir`] of a directory asked for.
    pub(crate) async fn exec_cwd(
        &self,
        record: &SandboxRecord,
        cwd: &str,
    ) -> Result<String, ProvisionerError> {
        let roots = self.roots_of(record).await?;
        let path = roots.resolve_anywhere(cwd)?;
        if path.is_runtime() {
            return Ok(path.to_string());
        }
        let found = self
            .on_path(roots, cwd, Access::Read, |root, rel| root.stat(rel))
            .await;
        let invalid = |path: String| ProvisionerError::InvalidCwd {
            path,
            roots: warren_core::mount_roots(
                record.binding.layout.layout(),
                &record.binding.extra_mounts,
            ),
        };
        match found {
            Ok(found) if found.value.kind == warren_fs::Kind::Dir => Ok(found.path.to_string()),
            Ok(found) => Err(invalid(found.path.to_string())),
            // What the caller asked for is wrong; anything else (I/O) stays what it is.
            Err(ProvisionerError::File {
                path,
                source:
                    FsError::NotFound { .. }
                    | FsError::NotADirectory { .. }
                    | FsError::SymlinkRefused { .. }
                    | FsError::MountCrossingRefused { .. }
                    | FsError::InvalidPath { .. },
            }) => Err(invalid(path)),
            Err(other) => Err(other),
        }
    }

    /// The one path every file operation takes: resolve the virtual path against the
    /// sandbox's roots, refuse writes to the read-only mount, open the root and run `op` on
    /// the root-relative path off the async threads, naming the virtual path in errors.
    async fn on_path<T: Send + 'static>(
        &self,
        roots: SandboxRoots,
        input: &str,
        access: Access,
        op: impl FnOnce(&WorkspaceRoot, &str) -> Result<T, FsError> + Send + 'static,
    ) -> Result<Located<T>, ProvisionerError> {
        let path = roots.resolve(input)?;
        self.on_resolved(roots, path, access, op).await
    }

    /// [`Self::on_path`] of a path already resolved (on a persistent mount).
    async fn on_resolved<T: Send + 'static>(
        &self,
        roots: SandboxRoots,
        path: VirtualPath,
        access: Access,
        op: impl FnOnce(&WorkspaceRoot, &str) -> Result<T, FsError> + Send + 'static,
    ) -> Result<Located<T>, ProvisionerError> {
        self.blocking(move || {
            let root = match access {
                Access::Read => roots.open(&path)?,
                Access::Write => roots.open_writable(&path)?,
            };
            let value = op(&root, path.relative()).map_err(|e| roots.error(&path, e))?;
            Ok(Located { path, value })
        })
        .await
    }

    /// Runs `op` inside the sandbox's runtime by its agent, as the sandbox user (see
    /// [`Self::runtime_file_as_owner`]); a refusal inside is the file error it stands for,
    /// on `path`.
    async fn in_runtime(
        &self,
        id: &SandboxId,
        path: &VirtualPath,
        op: FileOp,
        data: Vec<u8>,
    ) -> Result<(FileAnswer, Vec<u8>), ProvisionerError> {
        self.in_runtime_if(id, path, op, data, IfStopped::Start)
            .await
    }

    /// [`Self::in_runtime`], starting a runtime that does not run only when asked to.
    async fn in_runtime_if(
        &self,
        id: &SandboxId,
        path: &VirtualPath,
        op: FileOp,
        data: Vec<u8>,
        if_stopped: IfStopped,
    ) -> Result<(FileAnswer, Vec<u8>), ProvisionerError> {
        let reply = self
            .runtime_file_routed(id, op, data, Route::ToOwner, if_stopped)
            .await?;
        match reply.answer {
            Ok(answer) => Ok((answer, reply.data)),
            Err(failure) => Err(fs_error(path, failure.into_fs())),
        }
    }

    /// Runs one file operation in the sandbox's runtime *on this node*, for another
    /// replica that forwarded it here (never forwarded again): starting the runtime first
    /// if it is not running (I12; refused as a command would be: behind a fence, after
    /// termination, on a backend that runs nothing). A runtime found gone is marked lost
    /// and started again once.
    pub async fn runtime_file_as_owner(
        &self,
        id: &SandboxId,
        op: FileOp,
        data: Vec<u8>,
    ) -> Result<FileReply, ProvisionerError> {
        self.runtime_file_routed(id, op, data, Route::HereOnly, IfStopped::Start)
            .await
    }

    async fn runtime_file_routed(
        &self,
        id: &SandboxId,
        op: FileOp,
        data: Vec<u8>,
        route: Route,
        if_stopped: IfStopped,
    ) -> Result<FileReply, ProvisionerError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let record = self.runnable(id).await?;
            if if_stopped == IfStopped::Refuse && record.state != SandboxState::Running {
                return Err(runtime_stopped(id, &op));
            }
            // The runtime runs on one node (issue 14): its files are served there.
            let fence = match self.place_for(id, route).await? {
                Ok(fence) => fence,
                Err(owner) => {
                    self.metrics.forwarded();
                    let answered = self.peer_link()?.runtime_file(&owner, id, &op, data).await;
                    return self.after_forward(id, answered);
                }
            };
            // Read after the claim: a takeover marks the sandbox stopped.
            let record = self.runnable(id).await?;
            let record = match if_stopped {
                IfStopped::Start => self.ensure_runtime(record, &fence).await?,
                IfStopped::Refuse if record.state == SandboxState::Running => record,
                IfStopped::Refuse => return Err(runtime_stopped(id, &op)),
            };
            // Kept for the one retry: a runtime found gone got none of it.
            match self.backend.runtime_file(id, &op, data.clone()).await {
                Ok(reply) => return Ok(reply),
                Err(BackendError::RuntimeNotFound { .. }) if if_stopped == IfStopped::Refuse => {
                    return Err(runtime_stopped(id, &op));
                }
                Err(BackendError::RuntimeNotFound { .. }) if attempt == 1 => {
                    tracing::warn!(sandbox = %id, "runtime lost; starting a new one for a file operation");
                    self.mark_runtime_lost(&record).await?;
                }
                Err(error) if if_stopped == IfStopped::Refuse => {
                    return Err(self.stopped_under(&record, &op, error).await);
                }
                Err(error) => return Err(ProvisionerError::Backend(error)),
            }
        }
    }

    /// Why an operation that must not start the runtime failed: a stop (the reaper, a
    /// pause, a delete) that ended the runtime under it holds the lifecycle lock until the
    /// sandbox is no longer `running`, so once that lock is free, a sandbox that left
    /// `running` (or this generation) is the answer, `runtime_stopped`; otherwise the
    /// backend's error is.
    async fn stopped_under(
        &self,
        record: &SandboxRecord,
        op: &FileOp,
        error: BackendError,
    ) -> ProvisionerError {
        let settled = {
            let lock = self.lifecycle_lock(&record.id);
            let _settled = lock.lock().await;
            self.sandbox(&record.id).await
        };
        match settled {
            Ok(now)
                if now.state != SandboxState::Running || now.generation != record.generation =>
            {
                runtime_stopped(&record.id, op)
            }
            _ => ProvisionerError::Backend(error),
        }
    }

    /// A runtime's answer of the wrong kind for its operation: its agent broke protocol.
    fn unexpected(id: &SandboxId, answer: &FileAnswer) -> ProvisionerError {
        ProvisionerError::Backend(BackendError::Exec {
            sandbox: id.clone(),
            source: std::io::Error::other(format!("the runtime answered {answer:?}")),
        })
    }

    /// Resolves `input` for a sandbox without touching the file system (for messages and
    /// in-runtime paths).
    pub async fn resolve_path(
        &self,
        id: &SandboxId,
        input: &str,
    ) -> Result<VirtualPath, ProvisionerError> {
        self.roots(id).await?.resolve_anywhere(input)
    }

    /// Metadata of one entry. In the runtime, a link is described, not followed.
    pub async fn stat(
        &self,
        id: &SandboxId,
        input: &str,
    ) -> Result<Located<Entry>, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            return self.describe_in_runtime(id, path).await;
        }
        self.on_resolved(roots, path, Access::Read, |root, rel| root.stat(rel))
            .await
    }

    /// Describes the entry at `input` as a listing would: a link in its last component is
    /// described (kind, target), never followed; [`Provisioner::stat`] refuses it.
    pub async fn describe(
        &self,
        id: &SandboxId,
        input: &str,
    ) -> Result<Located<Entry>, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            return self.describe_in_runtime(id, path).await;
        }
        self.on_resolved(roots, path, Access::Read, |root, rel| root.describe(rel))
            .await
    }

    async fn describe_in_runtime(
        &self,
        id: &SandboxId,
        path: VirtualPath,
    ) -> Result<Located<Entry>, ProvisionerError> {
        let op = FileOp::Describe {
            path: path.to_string(),
        };
        match self.in_runtime(id, &path, op, Vec::new()).await? {
            (FileAnswer::Entry(entry), _) => Ok(Located {
                value: entry.into_entry(path.relative()),
                path,
            }),
            (other, _) => Err(Self::unexpected(id, &other)),
        }
    }

    /// Reads a byte range of a file, up to the configured read cap.
    pub async fn read(
        &self,
        id: &SandboxId,
        input: &str,
        range: ByteRange,
    ) -> Result<FileRead, ProvisionerError> {
        let roots = self.roots(id).await?;
        let cap = self.config.read_cap;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            let op = FileOp::read(path.to_string(), range, cap);
            let (answer, data) = self.in_runtime(id, &path, op, Vec::new()).await?;
            let value = answer
                .into_read(data)
                .map_err(|other| Self::unexpected(id, &other))?;
            return Ok(Located { path, value });
        }
        self.on_resolved(roots, path, Access::Read, move |root, rel| {
            root.read(rel, range, cap)
        })
        .await
    }

    /// Writes a whole file atomically (or appends), honouring `If-Match` (I27).
    pub async fn write(
        &self,
        id: &SandboxId,
        input: &str,
        bytes: Vec<u8>,
        options: WriteOptions,
        append: bool,
    ) -> Result<Written, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            let op = FileOp::Write {
                path: path.to_string(),
                append,
                if_match: options.if_match.as_ref().map(|tag| tag.as_str().to_owned()),
                if_none_match_any: options.if_none_match_any,
                create_parents: options.create_parents,
                mode: options.mode,
                cap: self.config.read_cap.max(bytes.len() as u64),
            };
            let (answer, _) = self.in_runtime(id, &path, op, bytes).await?;
            let value = answer
                .into_written()
                .map_err(|other| Self::unexpected(id, &other))?;
            return Ok(Located { path, value });
        }
        self.on_resolved(roots, path, Access::Write, move |root, rel| {
            if append {
                root.append(rel, &bytes, options)
            } else {
                root.write(rel, &bytes, options)
            }
        })
        .await
    }

    /// Replaces exact text in a file; zero or ambiguous matches are refused.
    pub async fn edit(
        &self,
        id: &SandboxId,
        input: &str,
        old: String,
        new: String,
        replace_all: bool,
        if_match: Option<Etag>,
    ) -> Result<Located<EditResult>, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            let op = FileOp::Edit {
                path: path.to_string(),
                old,
                new,
                replace_all,
                if_match: if_match.map(|tag| tag.as_str().to_owned()),
            };
            let (answer, _) = self.in_runtime(id, &path, op, Vec::new()).await?;
            let value = answer
                .into_edited()
                .map_err(|other| Self::unexpected(id, &other))?;
            return Ok(Located { path, value });
        }
        self.on_resolved(roots, path, Access::Write, move |root, rel| {
            root.edit(rel, &old, &new, replace_all, if_match.as_ref())
        })
        .await
    }

    /// Creates a directory and its missing parents.
    pub async fn mkdir(
        &self,
        id: &SandboxId,
        input: &str,
    ) -> Result<Located<bool>, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            let op = FileOp::Mkdir {
                path: path.to_string(),
            };
            return match self.in_runtime(id, &path, op, Vec::new()).await? {
                (FileAnswer::Made { created }, _) => Ok(Located {
                    path,
                    value: created,
                }),
                (other, _) => Err(Self::unexpected(id, &other)),
            };
        }
        self.on_resolved(roots, path, Access::Write, |root, rel| root.mkdir_p(rel))
            .await
    }

    /// Lists a directory to `depth` levels; entry paths are relative to the path's root.
    pub async fn list(
        &self,
        id: &SandboxId,
        input: &str,
        depth: u32,
        limit: usize,
    ) -> Result<Located<Listing>, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            let op = FileOp::List {
                path: path.to_string(),
                depth,
                limit,
            };
            return self.listed_in_runtime(id, path, op, IfStopped::Start).await;
        }
        self.on_resolved(roots, path, Access::Read, move |root, rel| {
            root.list(rel, depth, limit)
        })
        .await
    }

    /// A listing (or glob) in the runtime, its entries' paths under `path`.
    pub(crate) async fn listed_in_runtime(
        &self,
        id: &SandboxId,
        path: VirtualPath,
        op: FileOp,
        if_stopped: IfStopped,
    ) -> Result<Located<Listing>, ProvisionerError> {
        let (answer, _) = self
            .in_runtime_if(id, &path, op, Vec::new(), if_stopped)
            .await?;
        let value = answer
            .into_listing(path.relative())
            .map_err(|other| Self::unexpected(id, &other))?;
        Ok(Located { path, value })
    }

    /// Finds entries under `input` whose path relative to it matches `pattern`.
    pub async fn glob(
        &self,
        id: &SandboxId,
        input: &str,
        pattern: String,
        limit: usize,
    ) -> Result<Located<Listing>, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            let op = FileOp::Glob {
                path: path.to_string(),
                pattern,
                limit,
            };
            return self.listed_in_runtime(id, path, op, IfStopped::Start).await;
        }
        self.on_resolved(roots, path, Access::Read, move |root, rel| {
            root.glob(rel, &pattern, limit)
        })
        .await
    }

    /// Searches file contents under `input` with a regular expression.
    pub async fn grep(
        &self,
        id: &SandboxId,
        input: &str,
        pattern: String,
        options: GrepOptions,
    ) -> Result<Located<GrepResult>, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        if path.is_runtime() {
            let op = FileOp::Grep {
                path: path.to_string(),
                pattern,
                glob: options.glob,
                case_insensitive: options.case_insensitive,
                max_matches: options.max_matches,
                max_file_size: options.max_file_size,
            };
            let (answer, _) = self.in_runtime(id, &path, op, Vec::new()).await?;
            let value = answer
                .into_grep(path.relative())
                .map_err(|other| Self::unexpected(id, &other))?;
            return Ok(Located { path, value });
        }
        self.on_resolved(roots, path, Access::Read, move |root, rel| {
            root.grep(rel, &pattern, options)
        })
        .await
    }

    /// Moves an entry within one root: the workspace, an extra mount, or the runtime's own
    /// files. Moving between two of them is a mount crossing, refused.
    pub async fn rename(
        &self,
        id: &SandboxId,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<(VirtualPath, VirtualPath), ProvisionerError> {
        let roots = self.roots(id).await?;
        let from = roots.resolve_anywhere(from)?;
        let to = roots.resolve_anywhere(to)?;
        refuse_mount_root(&from, "rename")?;
        refuse_mount_root(&to, "replace")?;
        roots.refuse_frozen(&from, true)?;
        roots.refuse_frozen(&to, true)?;
        if from.root() != to.root() {
            return Err(fs_error(
                &to,
                FsError::MountCrossingRefused {
                    path: to.to_string(),
                },
            ));
        }
        if from.is_runtime() {
            let op = FileOp::Rename {
                from: from.to_string(),
                to: to.to_string(),
                overwrite,
            };
            self.in_runtime(id, &from, op, Vec::new()).await?;
            return Ok((from, to));
        }
        self.blocking(move || {
            let root = roots.open_writable(&from)?;
            roots.open_writable(&to)?;
            root.rename(from.relative(), to.relative(), overwrite)
                .map_err(|e| roots.error(&from, e))?;
            Ok((from, to))
        })
        .await
    }

    /// Deletes a file or, when `recursive`, a directory tree. Never follows a symlink, and
    /// in the runtime never descends into another mount.
    pub async fn remove(
        &self,
        id: &SandboxId,
        input: &str,
        recursive: bool,
    ) -> Result<VirtualPath, ProvisionerError> {
        let roots = self.roots(id).await?;
        let path = roots.resolve_anywhere(input)?;
        refuse_mount_root(&path, "remove")?;
        roots.refuse_frozen(&path, true)?;
        if path.is_runtime() {
            let op = FileOp::Remove {
                path: path.to_string(),
                recursive,
            };
            self.in_runtime(id, &path, op, Vec::new()).await?;
            return Ok(path);
        }
        let removed = self
            .on_resolved(roots, path, Access::Write, move |root, rel| {
                root.remove(rel, recursive)
            })
            .await?;
        Ok(removed.path)
    }
}
