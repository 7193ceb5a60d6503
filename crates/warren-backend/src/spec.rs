//! What the provisioner hands a backend, and what it gets back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use warren_core::BackendKind;
use warren_core::{Binding, MountSource, RuntimeScope, SandboxId, Uid};

/// What a backend can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    /// Runs commands.
    pub exec: bool,
    /// Separates runtimes from each other and from the host; false only for `memory`.
    pub isolation: bool,
    /// Runtimes outlive a provisioner restart and can be adopted.
    pub survives_restart: bool,
    /// Enforces memory, process and CPU limits.
    pub resource_limits: bool,
    /// Can run runtimes on the gVisor tier on this host now (issue 19); why not is
    /// [`crate::Backend::gvisor_unavailable`].
    pub gvisor: bool,
    /// Mounts directories of warren's own host into a runtime: an ephemeral sandbox's
    /// scratch tree and operator-allowed extra mounts. A pod cannot (it mounts claims).
    pub host_mounts: bool,
}

/// Everything a backend needs to start one runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeSpec {
    /// The sandbox this runtime serves.
    pub sandbox: SandboxId,
    /// Which start of this sandbox it is; part of the identity a backend records.
    pub generation: i64,
    /// The workspace owner.
    pub uid: Uid,
    /// The runtime scope.
    pub runtime_scope: RuntimeScope,
    /// The sandbox generation's binding (workdir, network, backend, image, layout, extra
    /// mounts, tier, environment policy): recorded whole by the backend, and a runtime
    /// found after a restart is adopted only with an equal one (I16).
    pub binding: Binding,
    /// Host path of the UserWorkspace (I7); the layout mounts it, or directories inside it.
    pub user_workspace: PathBuf,
    /// Host path of the skill projection, mounted read-only (I7).
    pub skill_projection: PathBuf,
    /// Environment given to every process of the runtime (I14); never the token (I13).
    pub env: BTreeMap<String, String>,
    /// A restored runtime snapshot to start from (I30): `<seed>/cow/<layer>/upper` and
    /// `<seed>/home`. Not part of the identity; the backend may delete it once started.
    pub seed: Option<PathBuf>,
    /// Host path of the branch the binding names (I27), an overlay warren mounted: shown
    /// where the workdir would be. Derived from the binding, so not part of the identity.
    pub branch: Option<PathBuf>,
    /// Directories of the UserWorkspace that have branches, so are read-only baselines
    /// (I27): shown read-only wherever the runtime would see them. Not part of the
    /// identity: a runtime keeps the view it started with.
    pub frozen: Vec<warren_core::Workdir>,
}

impl RuntimeSpec {
    /// Whether a runtime made from `self` (as a backend recorded it) serves `wanted`: the
    /// same sandbox, generation, uid and scope, an equal binding, and the same host trees
    /// mounted (I16). The environment and the seed are not the runtime's identity. Every
    /// backend adopts a runtime found after a restart only when this holds.
    pub fn serves(&self, wanted: &RuntimeSpec) -> bool {
        self.sandbox == wanted.sandbox
            && self.generation == wanted.generation
            && self.uid == wanted.uid
            && self.runtime_scope == wanted.runtime_scope
            && self.binding == wanted.binding
            && self.user_workspace == wanted.user_workspace
            && self.skill_projection == wanted.skill_projection
    }

    /// The runtime's persistent mounts on the host: the layout's in its order (less any an
    /// extra mount takes the place of), then the extra mounts in theirs, then over them the
    /// read-only baselines and the branch (I27), each inside a mount listed before it.
    pub fn mounts(&self) -> Vec<HostMount> {
        let mounts =
            warren_core::view_mounts(self.binding.layout.layout(), &self.binding.extra_mounts)
                .into_iter()
                .map(|mount| {
                    let (tree, beneath) = match mount.source {
                        MountSource::Extra(index) => {
                            let extra = &self.binding.extra_mounts[usize::from(index)];
                            (extra.root.clone(), extra.beneath.clone())
                        }
                        source => {
                            let tree = match source.tree() {
                                warren_core::VirtualRoot::Skills => self.skill_projection.clone(),
                                _ => self.user_workspace.clone(),
                            };
                            (tree, source.prefix(&self.binding.workdir))
                        }
                    };
                    HostMount {
                        target: mount.target.to_owned(),
                        source: mount.source,
                        tree,
                        beneath,
                        writable: mount.writable,
                    }
                })
                .collect::<Vec<_>>();
        // The read-only baselines and the branch (I27): each takes the place of a mount
        // that shows exactly it, or goes over the mount it lies in.
        let mut mounts = mounts;
        let mut over = Vec::new();
        for frozen in &self.frozen {
            // The branch takes the baseline's place in a sandbox bound to one.
            if self.branch.is_some() && *frozen == self.binding.workdir {
                continue;
            }
            let Some(target) = shown_at(&mounts, frozen.as_str()) else {
                continue;
            };
            match mounts.iter_mut().find(|mount| mount.target == target) {
                Some(mount) => mount.writable = false,
                None => over.push(HostMount {
                    target,
                    source: MountSource::UserWorkspace,
                    tree: self.user_workspace.clone(),
                    beneath: frozen.as_str().to_owned(),
                    writable: false,
                }),
            }
        }
        if let Some(branch) = &self.branch {
            if let Some(target) = shown_at(&mounts, self.binding.workdir.as_str()) {
                match mounts.iter_mut().find(|mount| mount.target == target) {
                    Some(mount) => {
                        mount.tree = branch.clone();
                        mount.beneath = String::new();
                        mount.writable = true;
                    }
                    None => over.push(HostMount {
                        target,
                        source: MountSource::Workdir,
                        tree: branch.clone(),
                        beneath: String::new(),
                        writable: true,
                    }),
                }
            }
        }
        mounts.extend(over);
        mounts
    }
}

/// Where the UserWorkspace directory `dir` appears among `mounts`: below the mount that
/// shows it (the whole workspace, or a workdir holding it), or at a workdir mount that lies
/// inside it (then the whole mount shows part of `dir`). `None` when the runtime does not
/// see it.
fn shown_at(mounts: &[HostMount], dir: &str) -> Option<String> {
    mounts
        .iter()
        .filter(|mount| {
            matches!(
                mount.source,
                MountSource::UserWorkspace | MountSource::Workdir
            )
        })
        .find_map(|mount| {
            let beneath = mount.beneath.as_str();
            if beneath.is_empty() {
                return Some(format!("{}/{dir}", mount.target));
            }
            // `dir` is what the mount shows, or holds it: the whole mount.
            if warren_core::within(dir, beneath) {
                return Some(mount.target.clone());
            }
            warren_core::within(beneath, dir)
                .then(|| format!("{}/{}", mount.target, &dir[beneath.len() + 1..]))
        })
}

/// One persistent mount of a runtime, resolved to the host.
///
/// `tree` is a directory warren made and owns (the UserWorkspace or the skill projection
/// of the uid, or an ephemeral sandbox's stand-ins) or one the operator named for extra
/// mounts, reached by a path no user controls.
/// `beneath`, when not empty, lies inside a tree the sandbox user writes to (the workdir,
/// `agents/skills`): a backend opens it from a descriptor of `tree` with no symlink
/// followed and no mount crossed ([`HostMount::open`]), never by joining the strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMount {
    /// Where the mount appears inside the runtime.
    pub target: String,
    /// Which of the uid's trees it shows.
    pub source: MountSource,
    /// The host directory the source lies in.
    pub tree: PathBuf,
    /// The directory inside `tree` the mount shows; empty for `tree` itself.
    pub beneath: String,
    /// Whether the runtime may write under it.
    pub writable: bool,
}

impl HostMount {
    /// Opens the directory this mount shows: `tree` by its path (warren's own), then
    /// `beneath` from that descriptor with no symlink followed, no `..` and no mount
    /// crossed, so a workdir whose components a user swapped for links is refused rather
    /// than followed out of the workspace (I2). Bind it from `/proc/self/fd/<n>`.
    pub fn open(&self) -> Result<std::os::fd::OwnedFd, warren_fs::FsError> {
        let tree = warren_fs::WorkspaceRoot::open(&self.tree)?;
        let dir = if self.beneath.is_empty() {
            tree
        } else {
            tree.subroot(self.beneath.as_str())?
        };
        Ok(dir.into_fd())
    }
}

/// Tasks a runtime holds against its process limit ([`crate::Backend::process_pressure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessPressure {
    /// Tasks (processes and threads) charged now, the runtime's own machinery included.
    pub current: u64,
    /// The limit, or `None` when the runtime has none.
    pub max: Option<u64>,
    /// Forks the limit has refused so far in the runtime's life (the pids controller's
    /// `max` events), or `None` when the backend cannot tell. Two looks tell whether the
    /// limit was hit between them, even when `current` is below it at both.
    pub refused: Option<u64>,
}

impl ProcessPressure {
    /// Whether the runtime has no room for one more task.
    pub fn at_limit(&self) -> bool {
        self.max.is_some_and(|max| self.current >= max)
    }
}

/// The host directories holding a running runtime's ephemeral state (I30), for a
/// snapshot: both are read by descriptor, never through a path the runtime controls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EphemeralRoots {
    /// The copy-on-write layers: `<layer>/upper` for each overlaid directory.
    pub cow: PathBuf,
    /// The sandbox user's home (`/home/gem`); the layout's mount points inside it, if any,
    /// are not entered. `None` where the home is a persistent mount (E2B's workdir, I30):
    /// there is no ephemeral home to record.
    pub home: Option<PathBuf>,
}

/// A runtime a backend reports, with the identity it was created with (I16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredRuntime {
    /// The spec the runtime was created from.
    pub spec: RuntimeSpec,
}

/// One command to run in a runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// The program and its arguments; `["/bin/sh", "-c", "<command>"]` for a shell line.
    pub argv: Vec<String>,
    /// Working directory inside the runtime, an absolute in-runtime path.
    pub cwd: String,
    /// Per-call environment, added over the runtime's.
    pub env: BTreeMap<String, String>,
    /// Bytes written to the command's stdin, then closed.
    pub stdin: Vec<u8>,
    /// Wall-clock limit; the whole process tree is killed when it passes (I24).
    pub timeout: Duration,
    /// Most bytes kept of each of stdout and stderr.
    pub output_cap: usize,
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Bytes a command wrote, as they came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// Which stream.
    pub stream: OutputStream,
    /// The bytes (binary-safe).
    pub bytes: Vec<u8>,
}

/// Where a streaming exec sends output as it arrives. When the receiver is dropped (the
/// client went away), the backend kills the command's process tree.
pub type OutputSink = tokio::sync::mpsc::Sender<OutputChunk>;

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecOutcome {
    /// Exit status, when the command exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the command, when one did.
    pub signal: Option<i32>,
    /// Standard output, at most `output_cap` bytes.
    pub stdout: Vec<u8>,
    /// Standard error, at most `output_cap` bytes.
    pub stderr: Vec<u8>,
    /// Output was cut at `output_cap`.
    pub truncated: bool,
    /// The timeout ended the command.
    pub timed_out: bool,
    /// Wall-clock time.
    pub duration: Duration,
    /// Resources used, where the backend can measure them (I22).
    pub usage: ResourceUsage,
}

/// Resources one command used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResourceUsage {
    /// CPU time in user mode, in milliseconds.
    pub cpu_user_ms: Option<i64>,
    /// CPU time in kernel mode, in milliseconds.
    pub cpu_system_ms: Option<i64>,
    /// Peak resident memory, in bytes.
    pub peak_memory_bytes: Option<i64>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use warren_core::{BackendKind, Binding, BranchName, LayoutName, RuntimeScope, Uid, Workdir};

    use super::*;

    fn spec(layout: LayoutName, branch: bool, frozen: &[&str]) -> RuntimeSpec {
        let uid = Uid::new("alice").unwrap();
        let scope = RuntimeScope::new("t").unwrap();
        let mut binding = Binding::new(Workdir::new("projects/a").unwrap(), BackendKind::Local);
        binding.layout = layout;
        binding.branch = branch.then(|| BranchName::new("b").unwrap());
        RuntimeSpec {
            sandbox: SandboxId::derive(&uid, &scope),
            generation: 1,
            uid,
            runtime_scope: scope,
            user_workspace: "/data/ws".into(),
            skill_projection: "/data/skills".into(),
            env: BTreeMap::new(),
            seed: None,
            branch: branch.then(|| PathBuf::from("/data/branches/alice/br-1/merged")),
            frozen: frozen.iter().map(|w| Workdir::new(*w).unwrap()).collect(),
            binding,
        }
    }

    /// (target, tree, beneath, writable) of each mount.
    fn view(spec: &RuntimeSpec) -> Vec<(String, String, String, bool)> {
        spec.mounts()
            .into_iter()
            .map(|m| {
                (
                    m.target,
                    m.tree.display().to_string(),
                    m.beneath,
                    m.writable,
                )
            })
            .collect()
    }

    fn row(
        target: &str,
        tree: &str,
        beneath: &str,
        writable: bool,
    ) -> (String, String, String, bool) {
        (target.into(), tree.into(), beneath.into(), writable)
    }

    #[test]
    fn a_branch_goes_over_the_workdir_and_baselines_are_read_only_where_they_show() {
        // The whole workspace: the branch and each baseline go over it, at their place.
        let ars = spec(LayoutName::Ars, true, &["projects/a", "projects/b"]);
        assert_eq!(
            view(&ars),
            [
                row("/home/gem/user-data", "/data/ws", "", true),
                row("/home/gem/skills", "/data/skills", "", false),
                row(
                    "/home/gem/user-data/projects/b",
                    "/data/ws",
                    "projects/b",
                    false
                ),
                row(
                    "/home/gem/user-data/projects/a",
                    "/data/branches/alice/br-1/merged",
                    "",
                    true
                ),
            ]
        );
        // A layout mounting the workdir: the branch takes the mount's place; a baseline
        // holding the workdir makes the whole mount read-only, one inside it goes over it.
        let deerflow = spec(LayoutName::Deerflow, true, &[]);
        assert_eq!(
            view(&deerflow)[0],
            row(
                "/mnt/user-data",
                "/data/branches/alice/br-1/merged",
                "",
                true
            )
        );
        let held = spec(LayoutName::Deerflow, false, &["projects"]);
        assert_eq!(
            view(&held)[0],
            row("/mnt/user-data", "/data/ws", "projects/a", false)
        );
        let inside = spec(
            LayoutName::Deerflow,
            false,
            &["projects/a/sub", "projects/ab"],
        );
        let mounts = view(&inside);
        assert_eq!(
            mounts[0],
            row("/mnt/user-data", "/data/ws", "projects/a", true)
        );
        assert_eq!(
            mounts.last().unwrap(),
            &row("/mnt/user-data/sub", "/data/ws", "projects/a/sub", false)
        );
        assert!(!mounts.iter().any(|m| m.2 == "projects/ab"), "{mounts:?}");
    }
}
