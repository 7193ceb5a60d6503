//! Network policy of a sandbox (I23): loopback only by default; `open` egress or an
//! `allowlist` of destinations through warren's filtering proxy.

use std::net::IpAddr;

use crate::{shorten, CoreError};

mod special;

pub use special::embedded_ipv4;

/// Where a sandbox's processes may connect.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// Loopback only: the runtime has its own network namespace with nothing but `lo`.
    #[default]
    None,
    /// HTTP and HTTPS egress to any public destination through warren's proxy. Every
    /// address the IANA special-purpose registries mark not globally reachable (loopback,
    /// private, link-local cloud metadata, documentation, benchmarking, ...) and the host's
    /// own addresses stay refused.
    Open,
    /// Egress through warren's proxy only to the listed destinations: host names
    /// (`pypi.org`), wildcard suffixes (`*.pythonhosted.org`), IP addresses or CIDR ranges.
    /// An internal address is reachable only when listed as an address or range itself.
    Allowlist {
        /// The allowed destinations.
        allow: Vec<String>,
    },
}

impl NetworkPolicy {
    /// Most entries an allowlist may hold.
    pub const MAX_ENTRIES: usize = 256;

    /// Checks the policy's entries.
    pub fn validate(self) -> Result<Self, CoreError> {
        if let Self::Allowlist { allow } = &self {
            if allow.is_empty() {
                return Err(invalid("", "an allowlist needs at least one destination"));
            }
            if allow.len() > Self::MAX_ENTRIES {
                return Err(invalid("", "an allowlist holds at most 256 destinations"));
            }
            for entry in allow {
                if Destination::parse(entry).is_none() {
                    return Err(invalid(
                        entry,
                        "expected a host name, *.suffix, an IP address or a CIDR range",
                    ));
                }
            }
        }
        Ok(self)
    }

    /// Whether the runtime gets a proxy at all.
    pub fn has_egress(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// Whether a destination named `host` may even be looked up. An allowlist resolves only
    /// names it lists (or IP literals): resolving any name would let a sandbox leak data
    /// through the host's DNS (`<secret>.attacker.example`).
    pub fn may_resolve(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match self {
            Self::None => false,
            Self::Open => true,
            Self::Allowlist { allow } => {
                host.parse::<IpAddr>().is_ok()
                    || allow
                        .iter()
                        .filter_map(|e| Destination::parse(e))
                        .any(|d| d.covers_name(&host))
            }
        }
    }

    /// Whether an allowlist names this address (or a range holding it) explicitly.
    pub fn lists_address(&self, address: IpAddr) -> bool {
        match self {
            Self::Allowlist { allow } => allow
                .iter()
                .filter_map(|e| Destination::parse(e))
                .any(|d| d.covers_address(address)),
            _ => false,
        }
    }

    /// The mode's name.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Open => "open",
            Self::Allowlist { .. } => "allowlist",
        }
    }

    /// Whether a connection to `host` (as the client named it) resolved to `address` may
    /// be made. Internal addresses need an explicit address or range entry (so a name that
    /// resolves to 127.0.0.1 or 169.254.169.254 gets nowhere).
    pub fn permits(&self, host: &str, address: IpAddr) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match self {
            Self::None => false,
            Self::Open => !is_internal(address),
            Self::Allowlist { allow } => {
                let entries: Vec<Destination> =
                    allow.iter().filter_map(|e| Destination::parse(e)).collect();
                let by_address = entries.iter().any(|d| d.covers_address(address));
                if is_internal(address) {
                    return by_address;
                }
                by_address || entries.iter().any(|d| d.covers_name(&host))
            }
        }
    }
}

fn invalid(entry: &str, reason: &'static str) -> CoreError {
    CoreError::InvalidNetworkPolicy {
        entry: shorten(entry),
        reason,
    }
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Destination {
    Name(String),
    Suffix(String),
    Range(IpAddr, u8),
}

impl Destination {
    fn parse(entry: &str) -> Option<Self> {
        let entry = entry.trim().to_ascii_lowercase();
        if let Some((address, prefix)) = entry.split_once('/') {
            let address: IpAddr = address.parse().ok()?;
            let prefix: u8 = prefix.parse().ok()?;
            let max = if address.is_ipv4() { 32 } else { 128 };
            return (prefix <= max).then_some(Self::Range(address, prefix));
        }
        if let Ok(address) = entry.parse::<IpAddr>() {
            let max = if address.is_ipv4() { 32 } else { 128 };
            return Some(Self::Range(address, max));
        }
        let (wildcard, name) = match entry.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, entry.clone()),
        };
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            return None;
        }
        Some(if wildcard {
            Self::Suffix(name)
        } else {
            Self::Name(name)
        })
    }

    fn covers_name(&self, host: &str) -> bool {
        match self {
            Self::Name(name) => host == name,
            Self::Suffix(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1),
            Self::Range(..) => false,
        }
    }

    fn covers_address(&self, address: IpAddr) -> bool {
        let Self::Range(network, prefix) = self else {
            return false;
        };
        match (network, address) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(*prefix)).unwrap_or(0);
                u32::from(*n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(*prefix)).unwrap_or(0);
                u128::from(*n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Addresses a sandbox must not reach by default: every address IANA's special-purpose
/// registries mark not globally reachable (the host, private networks, cloud metadata,
/// documentation and benchmarking ranges, ...), and IPv6 forms carrying such an IPv4
/// address. The table and its sources are in `network/special.rs`.
pub fn is_internal(address: IpAddr) -> bool {
    !special::is_global(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn open_egress_never_reaches_internal_addresses() {
        let open = NetworkPolicy::Open;
        for internal in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            // Special-purpose ranges that are not globally reachable: a host whose own
            // network is one of them must not open its gateway and neighbours.
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "198.19.255.254",
            "2001:db8::1",
            "fec0::1",
            "2002:c000:201::1",
            "2001:0:c000:201::fefd:fcfb",
            "::ffff:198.51.100.7",
        ] {
            assert!(!open.permits("x", ip(internal)), "{internal}");
        }
        assert!(open.permits("pypi.org", ip("151.101.0.223")));
        assert!(!NetworkPolicy::None.permits("pypi.org", ip("151.101.0.223")));
    }

    #[test]
    fn allowlists_match_names_suffixes_and_ranges() {
        let policy = NetworkPolicy::Allowlist {
            allow: vec![
                "pypi.org".into(),
                "*.pythonhosted.org".into(),
                "10.9.0.0/16".into(),
            ],
        }
        .validate()
        .unwrap();
        let public = ip("151.101.0.223");
        assert!(policy.permits("pypi.org", public));
        assert!(policy.permits("PyPI.org.", public));
        assert!(policy.permits("files.pythonhosted.org", public));
        assert!(
            !policy.permits("pythonhosted.org", public),
            "a wildcard needs a label"
        );
        assert!(!policy.permits("evilpypi.org", public));
        assert!(!policy.permits("pypi.org.evil.com", public));
        assert!(policy.permits("mirror", ip("10.9.3.4")), "listed range");
        assert!(!policy.permits("mirror", ip("10.8.3.4")));
        // A listed name that resolves inside is refused: DNS cannot open the host.
        assert!(!policy.permits("pypi.org", ip("127.0.0.1")));
        assert!(
            !policy.permits("pypi.org", ip("192.0.2.10")),
            "documentation range"
        );
    }

    #[test]
    fn an_internal_range_is_reachable_only_when_listed_as_an_address_or_range() {
        let policy = NetworkPolicy::Allowlist {
            allow: vec![
                "198.18.0.0/15".into(),
                "2001:db8::5".into(),
                "bench.example".into(),
            ],
        }
        .validate()
        .unwrap();
        assert!(
            policy.permits("bench.example", ip("198.18.4.5")),
            "listed range"
        );
        assert!(policy.permits("x", ip("2001:db8::5")), "listed address");
        assert!(!policy.permits("x", ip("2001:db8::6")));
        assert!(
            !policy.permits("bench.example", ip("203.0.113.5")),
            "a listed name does not open an internal address"
        );
    }

    #[test]
    fn an_allowlist_never_resolves_names_it_does_not_list() {
        let policy = NetworkPolicy::Allowlist {
            allow: vec![
                "pypi.org".into(),
                "*.pythonhosted.org".into(),
                "10.0.0.0/8".into(),
            ],
        };
        assert!(policy.may_resolve("pypi.org"));
        assert!(policy.may_resolve("files.pythonhosted.org"));
        assert!(
            policy.may_resolve("10.1.2.3"),
            "IP literals need no resolver"
        );
        assert!(
            !policy.may_resolve("c2VjcmV0.attacker.example"),
            "no DNS exfiltration"
        );
        assert!(NetworkPolicy::Open.may_resolve("anything.example"));
        assert!(!NetworkPolicy::None.may_resolve("pypi.org"));
        assert!(policy.lists_address(ip("10.9.9.9")));
        assert!(!NetworkPolicy::Open.lists_address(ip("10.9.9.9")));
    }

    #[test]
    fn malformed_policies_are_refused() {
        for allow in [
            vec![],
            vec!["".to_owned()],
            vec!["bad host".into()],
            vec!["*.".into()],
            vec!["1.2.3.4/40".into()],
            vec!["-x.com".into()],
        ] {
            assert!(
                NetworkPolicy::Allowlist {
                    allow: allow.clone()
                }
                .validate()
                .is_err(),
                "{allow:?}"
            );
        }
        let json = serde_json::json!({"mode": "allowlist", "allow": ["a.com"]});
        let policy: NetworkPolicy = serde_json::from_value(json).unwrap();
        assert_eq!(policy.mode(), "allowlist");
    }
}
