//! Workspace initialisation (I32): a new workdir filled from inline files, a host
//! directory the operator allowed by name, or a git repository at a revision.
//!
//! Only an empty workdir is initialised, so no user file is ever overwritten; if any
//! source fails, what was put in is taken out again and the workdir is left empty.
//! Everything lands through `warren-fs` (by descriptor, owned by 1000:1000, I11): a git
//! checkout is made in a private directory of the provisioner first and copied in without
//! following any link it contains.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use warren_core::{Uid, Workdir};
use warren_fs::{WorkspaceRoot, WriteOptions};
use warren_store::WorkdirRecord;

use crate::{Created, Provisioner, ProvisionerError};

/// How long a clone and checkout may take.
const GIT_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a workdir's first files come from; any combination, applied in this order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkdirInit {
    /// A directory the operator allowed by name (`[init] host_dirs` in warren.toml).
    pub host_dir: Option<String>,
    /// A git repository, cloned whole (with its history) and checked out at `rev`.
    pub git: Option<GitSource>,
    /// Files by workdir-relative path, with their text.
    pub files: BTreeMap<String, String>,
}

/// A git repository and revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitSource {
    /// `https://`, `http://`, `ssh://` or `git://`; `file://` only inside an allowed host
    /// directory.
    pub url: String,
    /// A branch, tag or commit; default: the remote's default branch.
    pub rev: Option<String>,
}

/// What an initialisation put in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct InitReport {
    /// Regular files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// A workdir [`Provisioner::create_workdir_from`] made or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedWorkdir {
    /// The stored record: the workdir and when it was first created (the same time every
    /// later call and the listing report).
    pub record: WorkdirRecord,
    /// Whether this call created it.
    pub created: Created,
    /// What the initialisation put in, when one was asked for.
    pub initialized: Option<InitReport>,
}

impl Provisioner {
    /// Creates (or confirms) a workdir of `uid` and fills it from `init` when given.
    ///
    /// A refused or failing source leaves nothing behind: the sources are checked before
    /// anything is created, and a workdir this call created is removed again (its record
    /// and its then empty directory) when filling it fails. A workdir that existed before
    /// keeps every file: initialisation only ever fills an empty one, and empties only what
    /// it put in.
    pub async fn create_workdir_from(
        &self,
        uid: &Uid,
        path: Option<&str>,
        init: Option<WorkdirInit>,
    ) -> Result<CreatedWorkdir, ProvisionerError> {
        if let Some(init) = &init {
            self.check_init_sources(init)?;
        }
        let (workdir, created) = self.create_workdir(uid, path).await?;
        let initialized = match init {
            None => None,
            Some(init) => match self.init_workdir(uid, &workdir, init).await {
                Ok(report) => Some(report),
                Err(error) => {
                    if created == Created::New {
                        self.undo_workdir(uid, &workdir).await;
                    }
                    return Err(error);
                }
            },
        };
        let record = self.store.workdir(uid, &workdir).await?.ok_or_else(|| {
            ProvisionerError::WorkdirNotFound {
                uid: uid.to_string(),
                workdir: workdir.to_string(),
            }
        })?;
        Ok(CreatedWorkdir {
            record,
            created,
            initialized,
        })
    }

    /// Takes back a workdir this request created: the directory only if it is empty (a
    /// command or a concurrent request may have put something in it since; that stays),
    /// then its record. Best effort: the request's own error is what the caller needs.
    async fn undo_workdir(&self, uid: &Uid, workdir: &Workdir) {
        let workspace = self.layout().user_workspace(&uid.safe());
        let relative = workdir.as_str().to_owned();
        let removed = self
            .blocking(move || {
                WorkspaceRoot::open(&workspace)
                    .and_then(|root| root.remove(&relative, false))
                    .map_err(|source| init_error(&relative, source))
            })
            .await;
        match removed {
            Ok(()) => {
                if let Err(error) = self.store.forget_workdir(uid, workdir).await {
                    tracing::warn!(%uid, %workdir, %error, "could not forget a workdir whose initialisation failed");
                }
            }
            Err(error) => {
                tracing::warn!(%uid, %workdir, %error, "kept a workdir whose initialisation failed: it is not empty");
            }
        }
    }

    /// Refuses sources that cannot be used, before anything is created.
    fn check_init_sources(&self, init: &WorkdirInit) -> Result<(), ProvisionerError> {
        if let Some(name) = &init.host_dir {
            self.allowed_host_dir(name)?;
        }
        if let Some(git) = &init.git {
            self.check_git_source(git)?;
        }
        Ok(())
    }

    /// Initialises the (empty) workdir of `uid` from `init`.
    pub async fn init_workdir(
        &self,
        uid: &Uid,
        workdir: &Workdir,
        init: WorkdirInit,
    ) -> Result<InitReport, ProvisionerError> {
        let host_dir = match &init.host_dir {
            Some(name) => Some(self.allowed_host_dir(name)?),
            None => None,
        };
        if let Some(git) = &init.git {
            self.check_git_source(git)?;
        }
        let root = self.workspaces().workdir_root(uid, workdir).await?;
        let relative = workdir.as_str().to_owned();
        let empty = self
            .blocking({
                let root = root
                    .subroot("")
                    .map_err(|source| init_error(&relative, source))?;
                move || {
                    Ok(root
                        .list("", 1, 1)
                        .map_err(|source| init_error("", source))?
                        .entries
                        .is_empty())
                }
            })
            .await?;
        if !empty {
            return Err(ProvisionerError::WorkdirNotEmpty {
                workdir: workdir.to_string(),
            });
        }
        let checkout = match &init.git {
            Some(git) => Some(self.clone_repository(git).await?),
            None => None,
        };
        let files = init.files;
        self.blocking(move || {
            let mut report = InitReport::default();
            let mut fill = || -> Result<(), ProvisionerError> {
                if let Some(dir) = &host_dir {
                    let source = WorkspaceRoot::open(dir)
                        .map_err(|source| init_error("the host directory", source))?
                        .read_only();
                    let copied = root
                        .copy_tree_from(&source, "", "")
                        .map_err(|source| init_error("the host directory", source))?;
                    report.files += copied.files;
                    report.bytes += copied.bytes;
                }
                if let Some(checkout) = &checkout {
                    let source = WorkspaceRoot::open(&checkout.path)
                        .map_err(|source| init_error("the git checkout", source))?
                        .read_only();
                    let copied = root
                        .copy_tree_from(&source, "", "")
                        .map_err(|source| init_error("the git checkout", source))?;
                    report.files += copied.files;
                    report.bytes += copied.bytes;
                }
                for (path, text) in &files {
                    root.write(
                        path,
                        text.as_bytes(),
                        WriteOptions {
                            create_parents: true,
                            if_none_match_any: true,
                            ..WriteOptions::default()
                        },
                    )
                    .map_err(|source| init_error(path, source))?;
                    report.files += 1;
                    report.bytes += text.len() as u64;
                }
                Ok(())
            };
            let result = fill();
            if result.is_err() {
                // Back to empty: nothing half-initialised stays behind.
                if let Ok(listing) = root.list("", 1, 100_000) {
                    for entry in listing.entries {
                        let _ = root.remove(&entry.path, true);
                    }
                }
            }
            result.map(|()| report)
        })
        .await
        // A fill that does not fit is the uid's quota (I23), not the server's failure.
        .map_err(|error| self.quota_error(uid, error))
    }

    fn allowed_host_dir(&self, name: &str) -> Result<PathBuf, ProvisionerError> {
        self.config
            .init_host_dirs
            .get(name)
            .cloned()
            .ok_or_else(|| ProvisionerError::UnknownHostDir {
                name: name.chars().take(100).collect(),
            })
    }

    /// Refuses URLs and revisions that could be taken for options, transports that run
    /// commands (`ext::`), and local paths outside the allowed host directories.
    fn check_git_source(&self, git: &GitSource) -> Result<(), ProvisionerError> {
        let refuse = |reason: &'static str| ProvisionerError::GitSourceRefused { reason };
        let url = git.url.as_str();
        if url.starts_with('-') || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(refuse("the URL is not a plain URL"));
        }
        if let Some(path) = url.strip_prefix("file://") {
            let inside = self.config.init_host_dirs.values().any(|dir| {
                std::path::Path::new(path).starts_with(dir) && !path.split('/').any(|c| c == "..")
            });
            if !inside {
                return Err(refuse(
                    "file:// URLs are allowed only inside the host directories of [init] host_dirs",
                ));
            }
        } else if !["https://", "http://", "ssh://", "git://"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            return Err(refuse("use an https://, http://, ssh:// or git:// URL"));
        }
        if let Some(rev) = &git.rev {
            let plain = !rev.is_empty()
                && !rev.starts_with('-')
                && rev.len() <= 256
                && rev
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b));
            if !plain {
                return Err(refuse(
                    "rev is a branch, tag or commit name: letters, digits, . _ / -",
                ));
            }
        }
        Ok(())
    }

    /// Clones into a private directory of the provisioner, then checks out `rev`.
    async fn clone_repository(&self, git: &GitSource) -> Result<Checkout, ProvisionerError> {
        let scratch = self
            .layout()
            .data_dir()
            .join("tmp")
            .join(format!("git-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&scratch).map_err(|e| ProvisionerError::GitFailed {
            detail: format!("cannot prepare a checkout directory: {e}"),
        })?;
        let checkout = Checkout {
            path: scratch.join("repo"),
        };
        let protocol = if git.url.starts_with("file://") {
            "always"
        } else {
            "never"
        };
        let clone = vec![
            "-c".to_owned(),
            "protocol.ext.allow=never".to_owned(),
            "-c".to_owned(),
            format!("protocol.file.allow={protocol}"),
            "clone".to_owned(),
            "--quiet".to_owned(),
            "--".to_owned(),
            git.url.clone(),
            checkout.path.to_string_lossy().into_owned(),
        ];
        run_git(&scratch, &clone).await?;
        if let Some(rev) = &git.rev {
            let switch = vec![
                "-C".to_owned(),
                checkout.path.to_string_lossy().into_owned(),
                "-c".to_owned(),
                "advice.detachedHead=false".to_owned(),
                "checkout".to_owned(),
                "--quiet".to_owned(),
                rev.clone(),
                "--".to_owned(),
            ];
            run_git(&scratch, &switch).await?;
        }
        Ok(checkout)
    }
}

/// A checkout in the provisioner's private scratch space, removed when dropped.
struct Checkout {
    path: PathBuf,
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(scratch) = self.path.parent() {
            let _ = std::fs::remove_dir_all(scratch);
        }
    }
}

/// Runs git with no user or system configuration and no prompt, killed after the timeout.
async fn run_git(home: &std::path::Path, args: &[String]) -> Result<(), ProvisionerError> {
    let child = tokio::process::Command::new("git")
        .args(args.iter())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_ASKPASS", "/bin/false")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ProvisionerError::GitFailed {
            detail: format!("cannot run git ({e}); install git on the server"),
        })?;
    let output = tokio::time::timeout(GIT_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| ProvisionerError::GitFailed {
            detail: format!("git took longer than {} s", GIT_TIMEOUT.as_secs()),
        })?
        .map_err(|e| ProvisionerError::GitFailed {
            detail: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    // git names the scratch directory in some messages; the caller never sees host paths.
    let scratch = home.to_string_lossy();
    let detail: String = stderr
        .replace(scratch.as_ref(), "<checkout>")
        .trim()
        .chars()
        .take(500)
        .collect();
    Err(ProvisionerError::GitFailed { detail })
}

fn init_error(path: &str, source: warren_fs::FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: path.to_owned(),
        source,
    }
}
