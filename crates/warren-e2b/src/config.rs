//! What the operator configures for the E2B API: the API keys and the uid each maps to,
//! the templates and what each starts, the sandbox domain, the network, and the bounds of
//! a sandbox's timeout.

use std::collections::BTreeMap;
use std::time::Duration;

use warren_core::{NetworkPolicy, Uid};

use crate::{ApiKey, E2bError};

/// The template E2B's code interpreter SDK creates sandboxes from unless told otherwise.
pub const CODE_INTERPRETER_TEMPLATE: &str = "code-interpreter-v1";

/// What a template starts: a backend and an image, each `None` for the server's default,
/// and what a new sandbox's home holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateTarget {
    /// The backend by name (`local`, `docker`, `kubernetes`).
    pub backend: Option<String>,
    /// The image, for backends that run images.
    pub image: Option<String>,
    /// A directory the operator allowed by name (`[init.host_dirs]`) copied into a new
    /// sandbox's home (its fresh workdir) when it is created, so a toolchain installed in
    /// `~` ships with the template (I32: by descriptor, owned by the sandbox user, no link
    /// followed). A sandbox made from a snapshot gets the snapshot's home instead.
    pub home: Option<String>,
}

impl TemplateTarget {
    /// The `[init.host_dirs]` names the templates' homes use.
    pub fn homes(
        templates: &BTreeMap<String, TemplateTarget>,
    ) -> impl Iterator<Item = (&str, &str)> {
        templates
            .iter()
            .filter_map(|(name, target)| Some((name.as_str(), target.home.as_deref()?)))
    }
}

/// The `[e2b]` section of `warren.toml`, validated.
#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// Keys from the configuration file, each with its uid (more come from the store:
    /// `warren e2b key create`).
    pub(crate) keys: Vec<(ApiKey, Uid)>,
    /// Template names beside `base` and what they start; `base` is the server's default
    /// runtime unless listed.
    pub(crate) templates: BTreeMap<String, TemplateTarget>,
    /// The domain of host-name routing (`49983-<id>.<domain>`), returned as `domain`.
    pub(crate) domain: Option<String>,
    /// Where sandboxes that allow internet access may connect: at most, as a create's
    /// `allowOut`/`denyOut` narrow it and never widen it.
    pub(crate) internet: NetworkPolicy,
    /// The timeout of a sandbox created without one.
    pub(crate) default_timeout: Duration,
    /// The longest timeout a sandbox may ask for.
    pub(crate) max_timeout: Duration,
    /// The CPU count reported for sandboxes (`cpuCount`): the runtime's CPU limit.
    pub(crate) cpu_count: u32,
    /// The memory reported for sandboxes (`memoryMB`): the runtime's memory limit.
    pub(crate) memory_mb: u64,
}

impl E2bConfig {
    /// E2B's default timeout: 300 seconds.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
    /// The longest timeout by default: 24 hours, E2B's own ceiling.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

    /// A configuration with these keys and the defaults: template `base` only, no domain,
    /// internet access through warren's filtering proxy (`open`).
    pub fn new(keys: Vec<(ApiKey, Uid)>) -> Self {
        Self {
            keys,
            templates: BTreeMap::new(),
            domain: None,
            internet: NetworkPolicy::Open { deny: vec![] },
            default_timeout: Self::DEFAULT_TIMEOUT,
            max_timeout: Self::MAX_TIMEOUT,
            cpu_count: 2,
            memory_mb: 1024,
        }
    }

    /// Sets the figures reported for sandboxes: the runtimes' CPU and memory limits.
    pub fn with_reported_limits(mut self, cpu_count: u32, memory_mb: u64) -> Self {
        self.cpu_count = cpu_count.max(1);
        self.memory_mb = memory_mb.max(1);
        self
    }

    /// Adds templates.
    pub fn with_templates(
        mut self,
        templates: BTreeMap<String, TemplateTarget>,
    ) -> Result<Self, E2bError> {
        for name in templates.keys() {
            if name.is_empty()
                || name.len() > 128
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
            {
                return Err(E2bError::InvalidTemplateName { name: name.clone() });
            }
        }
        self.templates = templates;
        Ok(self)
    }

    /// Sets the domain of host-name routing.
    pub fn with_domain(mut self, domain: &str) -> Result<Self, E2bError> {
        let domain = domain.trim().trim_end_matches('.').to_ascii_lowercase();
        let valid = !domain.is_empty()
            && domain.len() <= 200
            && domain.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            return Err(E2bError::InvalidDomain { domain });
        }
        self.domain = Some(domain);
        Ok(self)
    }

    /// Sets where sandboxes allowed internet access may connect.
    pub fn with_internet(mut self, policy: NetworkPolicy) -> Result<Self, E2bError> {
        self.internet = policy.validate().map_err(E2bError::InvalidNetwork)?;
        Ok(self)
    }

    /// Sets the default and longest timeouts.
    pub fn with_timeouts(mut self, default: Duration, max: Duration) -> Result<Self, E2bError> {
        if default.is_zero() || max < default {
            return Err(E2bError::InvalidTimeouts);
        }
        self.default_timeout = default;
        self.max_timeout = max;
        Ok(self)
    }

    /// What a template starts, or `None` for an unknown one.
    pub(crate) fn template(&self, name: &str) -> Option<TemplateTarget> {
        match self.templates.get(name) {
            Some(target) => Some(target.clone()),
            // E2B's code interpreter SDK asks for its own template by default: the
            // server's default runtime, which has the kernel (docs/code.md).
            None if name == "base" || name == CODE_INTERPRETER_TEMPLATE => {
                Some(TemplateTarget::default())
            }
            None => None,
        }
    }
}
