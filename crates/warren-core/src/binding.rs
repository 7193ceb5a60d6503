//! A sandbox generation's binding: what its runtime is made of, fixed while it lives (I5,
//! I16). One type, compared by `Eq` wherever a live runtime or record is reused: the store's
//! claim, recovery, and every backend's adoption of a runtime found after a restart.

use std::fmt;

use crate::{BranchName, ExtraMount, IsolationTier, LayoutName, NetworkPolicy, Workdir};

/// The backends warren knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Records calls, isolates nothing, runs nothing; tests only (I20).
    Memory,
    /// The native Linux runtime: namespaces, cgroups, seccomp, Landlock.
    Local,
    /// One container per sandbox on a Docker Engine (I18).
    Docker,
    /// One pod per sandbox on a Kubernetes cluster (issue 15).
    Kubernetes,
}

impl BackendKind {
    /// The backend's name in configuration, records and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Local => "local",
            Self::Docker => "docker",
            Self::Kubernetes => "kubernetes",
        }
    }

    /// Every backend warren knows.
    pub const ALL: [Self; 4] = [Self::Memory, Self::Local, Self::Docker, Self::Kubernetes];

    /// Whether its runtimes come from an image the sandbox names (the others run the
    /// host's own system directories, or an image fixed at start-up).
    pub fn takes_image(self) -> bool {
        matches!(self, Self::Docker | Self::Kubernetes)
    }

    /// The backend a name in configuration or a request stands for.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a live generation is bound to. A claim joins a live generation only when
/// its binding is equal; a runtime is adopted only when the binding it records is equal
/// to its sandbox's. A new field here is compared everywhere at once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Binding {
    /// The default cwd and file view, relative to the UserWorkspace (I4, I8).
    pub workdir: Workdir,
    /// Where its processes may connect (I23).
    pub network: NetworkPolicy,
    /// The backend that runs it.
    pub backend: BackendKind,
    /// The image its runtime is made from (Docker, Kubernetes).
    pub image: Option<String>,
    /// Whether its commands get the global and the uid's agent environments (I14).
    pub inherit_env: bool,
    /// Whether it mounts a scratch directory instead of the uid's workspace (I14).
    pub ephemeral: bool,
    /// What its runtime looks like from inside (I7).
    pub layout: LayoutName,
    /// Operator-allowed host directories shown beside the layout's mounts, in order.
    pub extra_mounts: Vec<ExtraMount>,
    /// The isolation tier its runtimes run on (issue 19).
    pub isolation: IsolationTier,
    /// The branch of the workdir it writes instead of the workdir itself (I27): its
    /// runtimes and file operations see the branch where the workdir would be.
    #[serde(default)]
    pub branch: Option<BranchName>,
}

/// Which part of two bindings differs first: what a refused claim names (each has its
/// own stable error code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingPart {
    /// The workdir or the branch of it (I5, I27).
    Workdir,
    /// The network policy.
    Network,
    /// `inherit_env` or `ephemeral` (I14).
    EnvPolicy,
    /// The backend or the image.
    Backend,
    /// The layout.
    Layout,
    /// The extra mounts.
    ExtraMounts,
    /// The isolation tier.
    Isolation,
}

impl Binding {
    /// A binding to `workdir` on `backend` with every other part at its default: no
    /// network, no image, the environments inherited, the persistent workspace, the
    /// default layout, no extra mounts, the kernel tier.
    pub fn new(workdir: Workdir, backend: BackendKind) -> Self {
        Self {
            workdir,
            network: NetworkPolicy::None,
            backend,
            image: None,
            inherit_env: true,
            ephemeral: false,
            layout: LayoutName::default(),
            extra_mounts: Vec::new(),
            isolation: IsolationTier::default(),
            branch: None,
        }
    }

    /// The first part in which `other` differs from this binding, or `None` when they are
    /// equal. Every field is named, so a new one cannot be left out.
    pub fn difference(&self, other: &Self) -> Option<BindingPart> {
        let Self {
            workdir,
            network,
            backend,
            image,
            inherit_env,
            ephemeral,
            layout,
            extra_mounts,
            isolation,
            branch,
        } = self;
        if (workdir, branch) != (&other.workdir, &other.branch) {
            Some(BindingPart::Workdir)
        } else if *network != other.network {
            Some(BindingPart::Network)
        } else if (*inherit_env, *ephemeral) != (other.inherit_env, other.ephemeral) {
            Some(BindingPart::EnvPolicy)
        } else if (*backend, image) != (other.backend, &other.image) {
            Some(BindingPart::Backend)
        } else if *layout != other.layout {
            Some(BindingPart::Layout)
        } else if *extra_mounts != other.extra_mounts {
            Some(BindingPart::ExtraMounts)
        } else if *isolation != other.isolation {
            Some(BindingPart::Isolation)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> Binding {
        Binding::new(Workdir::new("projects/a").unwrap(), BackendKind::Local)
    }

    #[test]
    fn equal_bindings_have_no_difference_and_each_part_is_named() {
        let base = binding();
        assert_eq!(base.difference(&base.clone()), None);
        type Change = fn(&mut Binding);
        let changes: [(Change, BindingPart); 10] = [
            (
                |b| b.workdir = Workdir::new("projects/b").unwrap(),
                BindingPart::Workdir,
            ),
            (
                |b| b.branch = Some(BranchName::new("agent-1").unwrap()),
                BindingPart::Workdir,
            ),
            (
                |b| b.network = NetworkPolicy::Open { deny: vec![] },
                BindingPart::Network,
            ),
            (|b| b.backend = BackendKind::Docker, BindingPart::Backend),
            (|b| b.image = Some("python:3".into()), BindingPart::Backend),
            (|b| b.inherit_env = false, BindingPart::EnvPolicy),
            (|b| b.ephemeral = true, BindingPart::EnvPolicy),
            (|b| b.layout = LayoutName::E2b, BindingPart::Layout),
            (
                |b| {
                    b.extra_mounts.push(
                        ExtraMount::new(
                            "/mnt/data",
                            "/srv/data".into(),
                            "set",
                            false,
                            LayoutName::default().layout(),
                        )
                        .unwrap(),
                    )
                },
                BindingPart::ExtraMounts,
            ),
            (
                |b| b.isolation = IsolationTier::Gvisor,
                BindingPart::Isolation,
            ),
        ];
        for (change, part) in changes {
            let mut other = base.clone();
            change(&mut other);
            assert_ne!(base, other);
            assert_eq!(base.difference(&other), Some(part));
            assert_eq!(other.difference(&base), Some(part));
        }
    }

    #[test]
    fn a_binding_reads_back_from_its_json() {
        let mut base = binding();
        base.network = NetworkPolicy::Open { deny: vec![] };
        base.isolation = IsolationTier::Gvisor;
        let json = serde_json::to_string(&base).unwrap();
        assert_eq!(serde_json::from_str::<Binding>(&json).unwrap(), base);
        let bad = json.replace("projects/a", "../a");
        assert!(serde_json::from_str::<Binding>(&bad).is_err());
    }
}
