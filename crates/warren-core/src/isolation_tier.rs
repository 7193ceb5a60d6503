//! How strongly a runtime is separated from the host kernel: part of a sandbox's binding.

use std::fmt;

/// The isolation tier a sandbox's runtimes run on (issue 19). The design seed notes that
/// containers share the host kernel, and that untrusted code calls for gVisor or a microVM:
/// `Gvisor` puts a user-space kernel (runsc's Sentry) between every command and the host.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum IsolationTier {
    /// Namespaces, cgroups, seccomp and Landlock on the host kernel (the local runtime,
    /// Docker's default runtime, a pod).
    #[default]
    Kernel,
    /// gVisor: the runtime's system calls are served by runsc's Sentry, not the host.
    Gvisor,
}

impl IsolationTier {
    /// Every tier warren knows.
    pub const ALL: [Self; 2] = [Self::Kernel, Self::Gvisor];

    /// Its name in requests, configuration and records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Gvisor => "gvisor",
        }
    }

    /// The tier a name stands for.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|tier| tier.as_str() == name)
    }
}

impl fmt::Display for IsolationTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tier_parses_back_from_its_name_and_nothing_else_parses() {
        for tier in IsolationTier::ALL {
            assert_eq!(IsolationTier::parse(tier.as_str()), Some(tier));
            assert_eq!(
                serde_json::to_value(tier).unwrap(),
                serde_json::json!(tier.as_str())
            );
        }
        for other in ["", "Kernel", "GVISOR", "runsc", "kata"] {
            assert_eq!(IsolationTier::parse(other), None, "{other}");
        }
        assert_eq!(IsolationTier::default(), IsolationTier::Kernel);
    }
}
