//! File operations by virtual path on a sandbox's persistent mounts (I1, I2, I7, I10, I27).
//!
//! A virtual path is parsed against the sandbox's workdir, mapped to the UserWorkspace or
//! the skill projection, and handed to `warren-fs`, which resolves it by file descriptor
//! beneath that root. Writes under `/home/gem/skills` are refused here and again by the
//! read-only root. Files need no runtime: these calls never start one (I17).

use warren_core::{SandboxId, VirtualPath, VirtualRoot, Workdir};
use warren_fs::{
    ByteRange, EditResult, Entry, Etag, FsError, GrepOptions, GrepResult, Listing, ReadResult,
    WorkspaceRoot, WriteOptions, WriteResult,
};
use warren_store::SandboxRecord;

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
}

impl SandboxRoots {
    pub(crate) fn resolve(&self, input: &str) -> Result<VirtualPath, ProvisionerError> {
        Ok(VirtualPath::parse(
            input,
            self.layout,
            &self.extra_mounts,
            &self.workdir,
        )?)
    }

    pub(crate) fn open(&self, path: &VirtualPath) -> Result<WorkspaceRoot, ProvisionerError> {
        let root = match path.root() {
            VirtualRoot::UserData => WorkspaceRoot::open(&self.workspace),
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
        Ok(self.roots_of(&record))
    }

    pub(crate) fn roots_of(&self, record: &SandboxRecord) -> SandboxRoots {
        let (workspace, skills) = self.mounts(record);
        SandboxRoots {
            quota_uid: (!record.binding.ephemeral && self.quota_enforced_for(&record.uid))
                .then(|| record.uid.clone()),
            layout: record.binding.layout.layout(),
            extra_mounts: record.binding.extra_mounts.clone(),
            workdir: record.binding.workdir.clone(),
            workspace,
            skills,
        }
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
        let roots = self.roots_of(record);
        if roots.resolve(cwd).is_err() && is_runtime_path(cwd) {
            return Ok(cwd.to_owned());
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

    /// Resolves `input` for a sandbox without touching the file system (for messages and
    /// in-runtime paths).
    pub async fn resolve_path(
        &self,
        id: &SandboxId,
        input: &str,
    ) -> Result<VirtualPath, ProvisionerError> {
        self.roots(id).await?.resolve(input)
    }

    /// Metadata of one entry.
    pub async fn stat(
        &self,
        id: &SandboxId,
        input: &str,
    ) -> Result<Located<Entry>, ProvisionerError> {
        let roots = self.roots(id).await?;
        self.on_path(roots, input, Access::Read, |root, rel| root.stat(rel))
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
        self.on_path(roots, input, Access::Read, |root, rel| root.describe(rel))
            .await
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
        self.on_path(roots, input, Access::Read, move |root, rel| {
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
        self.on_path(roots, input, Access::Write, move |root, rel| {
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
        self.on_path(roots, input, Access::Write, move |root, rel| {
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
        self.on_path(roots, input, Access::Write, |root, rel| root.mkdir_p(rel))
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
        self.on_path(roots, input, Access::Read, move |root, rel| {
            root.list(rel, depth, limit)
        })
        .await
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
        self.on_path(roots, input, Access::Read, move |root, rel| {
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
        self.on_path(roots, input, Access::Read, move |root, rel| {
            root.grep(rel, &pattern, options)
        })
        .await
    }

    /// Moves an entry within one root; moving between the workspace and skills is refused.
    pub async fn rename(
        &self,
        id: &SandboxId,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<(VirtualPath, VirtualPath), ProvisionerError> {
        let roots = self.roots(id).await?;
        let from = roots.resolve(from)?;
        let to = roots.resolve(to)?;
        refuse_mount_root(&from, "rename")?;
        refuse_mount_root(&to, "replace")?;
        self.blocking(move || {
            let root = roots.open_writable(&from)?;
            roots.open_writable(&to)?;
            root.rename(from.relative(), to.relative(), overwrite)
                .map_err(|e| roots.error(&from, e))?;
            Ok((from, to))
        })
        .await
    }

    /// Deletes a file or, when `recursive`, a directory tree. Never follows a symlink.
    pub async fn remove(
        &self,
        id: &SandboxId,
        input: &str,
        recursive: bool,
    ) -> Result<VirtualPath, ProvisionerError> {
        let roots = self.roots(id).await?;
        refuse_mount_root(&roots.resolve(input)?, "remove")?;
        let removed = self
            .on_path(roots, input, Access::Write, move |root, rel| {
                root.remove(rel, recursive)
            })
            .await?;
        Ok(removed.path)
    }
}

/// Whether `path` is a plain absolute path of the runtime: `/`-rooted, no `.` or `..`
/// component, no empty one but a trailing slash, no NUL, at most 4096 bytes.
fn is_runtime_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    path.len() <= 4096
        && !path.contains('\0')
        && (rest.is_empty()
            || rest
                .trim_end_matches('/')
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != ".."))
}

#[cfg(test)]
mod cwd_tests {
    use super::is_runtime_path;

    #[test]
    fn a_runtime_path_is_absolute_and_plain() {
        for ok in ["/", "/tmp", "/usr/bin/", "/home/gem/x"] {
            assert!(is_runtime_path(ok), "{ok}");
        }
        for refused in [
            "",
            "tmp",
            "/tmp/../etc",
            "/./tmp",
            "//tmp",
            "/a//b",
            "/a\0b",
        ] {
            assert!(!is_runtime_path(refused), "{refused:?}");
        }
    }
}
