//! Network policy of a sandbox (I23): loopback only by default; `open` egress or an
//! `allowlist` of destinations through warren's filtering proxy.

use std::net::IpAddr;

use crate::{shorten, CoreError};

mod special;

pub use special::embedded_ipv4;

/// Where a sandbox's processes may connect.
///
/// `open` and `allowlist` may carry `deny` entries (the same grammar as `allow`): a
/// destination a deny entry names is refused whatever else the policy permits, by name
/// before it is even resolved and by the address it resolves to. Both lists are left out
/// of the JSON when empty, so `{"mode": "open"}` reads and writes as it always did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// Loopback only: the runtime has its own network namespace with nothing but `lo`.
    #[default]
    None,
    /// HTTP and HTTPS egress to any public destination through warren's proxy. Every
    /// address the IANA special-purpose registries mark not globally reachable (loopback,
    /// private, link-local cloud metadata, documentation, benchmarking, ...) and the host's
    /// own addresses stay refused, and so does every destination `deny` names.
    Open {
        /// Destinations refused even so: host names (`tracker.example`), wildcard suffixes
        /// (`*.ads.example`), IP addresses or CIDR ranges.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        deny: Vec<String>,
    },
    /// Egress through warren's proxy only to the listed destinations: host names
    /// (`pypi.org`), wildcard suffixes (`*.pythonhosted.org`), IP addresses or CIDR ranges.
    /// An internal address is reachable only when listed as an address or range itself.
    /// A destination `deny` names is refused even when `allow` lists it.
    Allowlist {
        /// The allowed destinations.
        allow: Vec<String>,
        /// Destinations refused even when `allow` lists them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        deny: Vec<String>,
    },
}

impl NetworkPolicy {
    /// Most entries an allowlist (or a deny list) may hold.
    pub const MAX_ENTRIES: usize = 256;

    /// Checks the policy's entries.
    pub fn validate(self) -> Result<Self, CoreError> {
        match &self {
            Self::None => {}
            Self::Open { deny } => check_deny(deny)?,
            Self::Allowlist { allow, deny } => {
                if allow.is_empty() {
                    return Err(invalid("", "an allowlist needs at least one destination"));
                }
                if allow.len() > Self::MAX_ENTRIES {
                    return Err(invalid("", "an allowlist holds at most 256 destinations"));
                }
                for entry in allow {
                    Self::check_entry(entry)?;
                }
                check_deny(deny)?;
            }
        }
        Ok(self)
    }

    /// Checks one allow or deny entry: a host name, `*.suffix`, an IP address or a CIDR
    /// range.
    pub fn check_entry(entry: &str) -> Result<(), CoreError> {
        match Destination::parse(entry) {
            Some(_) => Ok(()),
            None => Err(invalid(
                entry,
                "expected a host name, *.suffix, an IP address or a CIDR range",
            )),
        }
    }

    /// Whether the runtime gets a proxy at all.
    pub fn has_egress(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// The allowlist's destinations (none for the other modes).
    pub fn allow(&self) -> &[String] {
        match self {
            Self::Allowlist { allow, .. } => allow,
            _ => &[],
        }
    }

    /// The refused destinations (none for `none`, which refuses everything anyway).
    pub fn deny(&self) -> &[String] {
        match self {
            Self::None => &[],
            Self::Open { deny } | Self::Allowlist { deny, .. } => deny,
        }
    }

    /// This policy also refusing `entries` (`none` stays `none`); an entry it already
    /// refuses is not repeated.
    pub fn denying(mut self, entries: impl IntoIterator<Item = String>) -> Self {
        if let Self::Open { deny } | Self::Allowlist { deny, .. } = &mut self {
            for entry in entries {
                if !deny.contains(&entry) {
                    deny.push(entry);
                }
            }
        }
        self
    }

    /// The allowlist of `allow` within this policy: what both permit, and what this policy
    /// refuses stays refused. It never permits a destination either refuses; where their
    /// meeting cannot be written as entries (a listed name against a listed range, a range
    /// partly internal under `open`), the entry is left out, which refuses more. `none`
    /// when nothing is left. Malformed entries are left out: check them first.
    pub fn restricted_to(&self, allow: &[String]) -> Self {
        let mut kept: Vec<String> = Vec::new();
        let mut keep = |entry: &String| {
            if !kept.contains(entry) {
                kept.push(entry.clone());
            }
        };
        match self {
            Self::None => return Self::None,
            // `open` permits a listed name's public addresses, as an allowlist does, and
            // no internal address: a range keeps only when all of it is public.
            Self::Open { .. } => {
                for entry in allow {
                    let within_open = match Destination::parse(entry) {
                        Some(Destination::Range(network, prefix)) => {
                            special::range_is_global(network, prefix)
                        }
                        Some(_) => true,
                        None => false,
                    };
                    if within_open {
                        keep(entry);
                    }
                }
            }
            Self::Allowlist { allow: mine, .. } => {
                let mine: Vec<(&String, Destination)> = mine
                    .iter()
                    .filter_map(|e| Destination::parse(e).map(|d| (e, d)))
                    .collect();
                for entry in allow {
                    let Some(theirs) = Destination::parse(entry) else {
                        continue;
                    };
                    // Theirs when one of mine holds it, else each of mine theirs holds.
                    if mine.iter().any(|(_, d)| d.holds(&theirs)) {
                        keep(entry);
                    } else {
                        for (text, d) in &mine {
                            if theirs.holds(d) {
                                keep(text);
                            }
                        }
                    }
                }
            }
        }
        if kept.is_empty() {
            return Self::None;
        }
        Self::Allowlist {
            allow: kept,
            deny: self.deny().to_vec(),
        }
    }

    /// `deny` with what `exempt` lists taken out of it, for lists where an allowed entry
    /// wins over a denied one: a denied range holding an exempt range is split around it
    /// (into at most one range per bit of difference), one an exempt range holds is
    /// dropped, and so is a denied name or suffix an exempt name or suffix holds. A denied
    /// range is never split around a name (the name's addresses stay refused there), nor a
    /// denied suffix around a name under it. Malformed entries are kept as they are.
    pub fn deny_except(deny: &[String], exempt: &[String]) -> Vec<String> {
        let exempt: Vec<Destination> = exempt
            .iter()
            .filter_map(|e| Destination::parse(e))
            .collect();
        let mut out = Vec::new();
        for entry in deny {
            let Some(denied) = Destination::parse(entry) else {
                out.push(entry.clone());
                continue;
            };
            if exempt.iter().any(|e| e.holds(&denied)) {
                continue;
            }
            let Destination::Range(network, prefix) = denied else {
                out.push(entry.clone());
                continue;
            };
            let mut pieces = vec![Range::new(network, prefix)];
            let mut split = false;
            for hole in &exempt {
                let Destination::Range(hole_network, hole_prefix) = hole else {
                    continue;
                };
                let hole = Range::new(*hole_network, *hole_prefix);
                pieces = pieces
                    .into_iter()
                    .flat_map(|piece| {
                        if hole.holds(&piece) {
                            split = true;
                            Vec::new()
                        } else if piece.holds(&hole) {
                            split = true;
                            piece.around(&hole)
                        } else {
                            vec![piece]
                        }
                    })
                    .collect();
            }
            if split {
                out.extend(pieces.iter().map(Range::to_string));
            } else {
                out.push(entry.clone());
            }
        }
        out
    }

    /// Whether a destination named `host` may even be looked up. An allowlist resolves only
    /// names it lists (or IP literals): resolving any name would let a sandbox leak data
    /// through the host's DNS (`<secret>.attacker.example`). A denied name is never looked
    /// up, whatever the mode.
    pub fn may_resolve(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.denies_name(&host)
            || host
                .parse::<IpAddr>()
                .is_ok_and(|address| self.denies_address(address))
        {
            return false;
        }
        match self {
            Self::None => false,
            Self::Open { .. } => true,
            Self::Allowlist { allow, .. } => {
                host.parse::<IpAddr>().is_ok()
                    || allow
                        .iter()
                        .filter_map(|e| Destination::parse(e))
                        .any(|d| d.covers_name(&host))
            }
        }
    }

    /// Whether an allowlist names this address (or a range holding it) explicitly, and no
    /// deny entry refuses it.
    pub fn lists_address(&self, address: IpAddr) -> bool {
        match self {
            Self::Allowlist { allow, .. } => {
                !self.denies_address(address)
                    && allow
                        .iter()
                        .filter_map(|e| Destination::parse(e))
                        .any(|d| d.covers_address(address))
            }
            _ => false,
        }
    }

    /// The mode's name.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Open { .. } => "open",
            Self::Allowlist { .. } => "allowlist",
        }
    }

    /// Whether a connection to `host` (as the client named it) resolved to `address` may
    /// be made. Internal addresses need an explicit address or range entry (so a name that
    /// resolves to 127.0.0.1 or 169.254.169.254 gets nowhere). A deny entry naming the host
    /// or holding the address (or an IPv4 address it carries) refuses it in every mode.
    pub fn permits(&self, host: &str, address: IpAddr) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.denies_name(&host) || self.denies_address(address) {
            return false;
        }
        match self {
            Self::None => false,
            Self::Open { .. } => !is_internal(address),
            Self::Allowlist { allow, .. } => {
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

    /// Whether a deny entry names `host` (lower-case, without a trailing dot).
    fn denies_name(&self, host: &str) -> bool {
        self.deny()
            .iter()
            .filter_map(|e| Destination::parse(e))
            .any(|d| d.covers_name(host))
    }

    /// Whether a deny entry holds `address`, or an IPv4 address it carries (IPv4-mapped,
    /// NAT64, 6to4, Teredo), where its packets would end up.
    fn denies_address(&self, address: IpAddr) -> bool {
        let deny: Vec<Destination> = self
            .deny()
            .iter()
            .filter_map(|e| Destination::parse(e))
            .collect();
        if deny.is_empty() {
            return false;
        }
        std::iter::once(address)
            .chain(embedded_ipv4(address).into_iter().map(IpAddr::V4))
            .any(|a| deny.iter().any(|d| d.covers_address(a)))
    }
}

fn check_deny(deny: &[String]) -> Result<(), CoreError> {
    if deny.len() > NetworkPolicy::MAX_ENTRIES {
        return Err(invalid("", "a deny list holds at most 256 destinations"));
    }
    for entry in deny {
        NetworkPolicy::check_entry(entry)?;
    }
    Ok(())
}

fn invalid(entry: &str, reason: &'static str) -> CoreError {
    CoreError::InvalidNetworkPolicy {
        entry: shorten(entry),
        reason,
    }
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Destination {
    Name(String),
    Suffix(String),
    Range(IpAddr, u8),
}

impl Destination {
    pub(crate) fn parse(entry: &str) -> Option<Self> {
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

    pub(crate) fn covers_name(&self, host: &str) -> bool {
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

    /// Whether every destination `other` covers, this covers too (a name by itself or a
    /// suffix above it, a range by a range holding it).
    fn holds(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Name(name), Self::Name(other)) => name == other,
            (Self::Suffix(_), Self::Name(name)) => self.covers_name(name),
            (Self::Suffix(suffix), Self::Suffix(other)) => {
                other == suffix || self.covers_name(other)
            }
            (Self::Range(network, prefix), Self::Range(other, other_prefix)) => {
                Range::new(*network, *prefix).holds(&Range::new(*other, *other_prefix))
            }
            _ => false,
        }
    }
}

/// An address range as bits: the network (masked), its prefix and its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    bits: u128,
    prefix: u8,
    v4: bool,
}

impl Range {
    fn new(network: IpAddr, prefix: u8) -> Self {
        let (bits, v4) = match network {
            IpAddr::V4(a) => (u128::from(u32::from(a)), true),
            IpAddr::V6(a) => (u128::from(a), false),
        };
        let range = Self { bits, prefix, v4 };
        Self {
            bits: bits & range.mask(prefix),
            ..range
        }
    }

    fn width(&self) -> u8 {
        if self.v4 {
            32
        } else {
            128
        }
    }

    /// The mask of the first `prefix` bits, in the family's width.
    fn mask(&self, prefix: u8) -> u128 {
        let all = if self.v4 {
            u128::from(u32::MAX)
        } else {
            u128::MAX
        };
        all.checked_shl(u32::from(self.width() - prefix))
            .unwrap_or(0)
            & all
    }

    fn holds(&self, other: &Self) -> bool {
        self.v4 == other.v4
            && other.prefix >= self.prefix
            && other.bits & self.mask(self.prefix) == self.bits
    }

    /// This range without `hole` (which it holds): the sibling of `hole`'s path at each
    /// bit below this range's prefix.
    fn around(&self, hole: &Self) -> Vec<Self> {
        (self.prefix + 1..=hole.prefix)
            .map(|prefix| Self {
                bits: (hole.bits & self.mask(prefix)) ^ (1u128 << (self.width() - prefix)),
                prefix,
                v4: self.v4,
            })
            .collect()
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.v4 {
            // The bits of an IPv4 range are its 32 low bits.
            let address = std::net::Ipv4Addr::from(self.bits as u32);
            write!(f, "{address}/{}", self.prefix)
        } else {
            write!(f, "{}/{}", std::net::Ipv6Addr::from(self.bits), self.prefix)
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
        let open = NetworkPolicy::Open { deny: vec![] };
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

            deny: vec![],
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

            deny: vec![],
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

            deny: vec![],
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
        assert!(NetworkPolicy::Open { deny: vec![] }.may_resolve("anything.example"));
        assert!(!NetworkPolicy::None.may_resolve("pypi.org"));
        assert!(policy.lists_address(ip("10.9.9.9")));
        assert!(!NetworkPolicy::Open { deny: vec![] }.lists_address(ip("10.9.9.9")));
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
                    allow: allow.clone(),
                    deny: vec![],
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

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| (*e).to_owned()).collect()
    }

    #[test]
    fn a_deny_entry_wins_over_open_egress_by_name_before_resolution_and_by_address() {
        let policy = NetworkPolicy::Open {
            deny: list(&[
                "tracker.example",
                "*.ads.example",
                "151.101.0.0/16",
                "2a04:4e42::/32",
            ]),
        }
        .validate()
        .unwrap();
        let public = ip("93.184.216.34");
        assert!(policy.may_resolve("pypi.org"));
        assert!(policy.permits("pypi.org", public));
        // By name: never even looked up, and refused whatever it resolves to.
        assert!(!policy.may_resolve("tracker.example"));
        assert!(!policy.may_resolve("Tracker.Example."));
        assert!(!policy.may_resolve("x.ads.example"));
        assert!(policy.may_resolve("ads.example"), "a suffix needs a label");
        assert!(!policy.permits("tracker.example", public));
        assert!(!policy.permits("cdn.ads.example", public));
        // By address: a name resolving into a denied range, an IP literal, an IPv6 form
        // carrying a denied IPv4 address.
        assert!(!policy.permits("pypi.org", ip("151.101.0.223")));
        assert!(!policy.may_resolve("151.101.64.223"));
        assert!(!policy.permits("x", ip("::ffff:151.101.0.223")));
        assert!(!policy.permits("x", ip("2a04:4e42::1")));
        assert!(policy.permits("x", ip("2a04:4e43::1")));
        // Deny adds refusals, never permissions: internal addresses stay refused.
        assert!(!policy.permits("x", ip("10.0.0.1")));
        assert_eq!(policy.mode(), "open");
    }

    #[test]
    fn a_deny_entry_wins_over_an_allowlist_entry() {
        let policy = NetworkPolicy::Allowlist {
            allow: list(&["*.example.com", "127.0.0.0/8", "10.1.0.0/16"]),
            deny: list(&["secret.example.com", "127.0.0.2", "10.1.2.0/24"]),
        }
        .validate()
        .unwrap();
        let public = ip("93.184.216.34");
        assert!(policy.may_resolve("www.example.com"));
        assert!(policy.permits("www.example.com", public));
        assert!(!policy.may_resolve("secret.example.com"));
        assert!(!policy.permits("secret.example.com", public));
        assert!(policy.permits("x", ip("127.0.0.1")));
        assert!(policy.lists_address(ip("127.0.0.1")));
        assert!(!policy.permits("x", ip("127.0.0.2")));
        assert!(
            !policy.lists_address(ip("127.0.0.2")),
            "a denied address is not listed: it must not pass as one of the host's own"
        );
        assert!(!policy.may_resolve("127.0.0.2"));
        assert!(policy.permits("x", ip("10.1.3.4")));
        assert!(!policy.permits("x", ip("10.1.2.4")));
    }

    #[test]
    fn policies_without_deny_entries_read_and_write_the_json_they_always_did() {
        for (json, policy) in [
            (
                serde_json::json!({"mode": "open"}),
                NetworkPolicy::Open { deny: vec![] },
            ),
            (
                serde_json::json!({"mode": "allowlist", "allow": ["a.com"]}),
                NetworkPolicy::Allowlist {
                    allow: list(&["a.com"]),
                    deny: vec![],
                },
            ),
            (serde_json::json!({"mode": "none"}), NetworkPolicy::None),
        ] {
            assert_eq!(
                serde_json::from_value::<NetworkPolicy>(json.clone()).unwrap(),
                policy
            );
            assert_eq!(serde_json::to_value(&policy).unwrap(), json);
        }
        let with_deny = NetworkPolicy::Open {
            deny: list(&["1.2.3.4"]),
        };
        let json = serde_json::json!({"mode": "open", "deny": ["1.2.3.4"]});
        assert_eq!(serde_json::to_value(&with_deny).unwrap(), json);
        assert_eq!(
            serde_json::from_value::<NetworkPolicy>(json).unwrap(),
            with_deny
        );
    }

    #[test]
    fn malformed_or_too_many_deny_entries_are_refused() {
        for deny in [
            list(&["bad host"]),
            list(&["*."]),
            list(&["10.0.0.0/33"]),
            (0..=NetworkPolicy::MAX_ENTRIES)
                .map(|n| format!("10.0.{}.{}", n / 256, n % 256))
                .collect(),
        ] {
            assert!(
                NetworkPolicy::Open { deny: deny.clone() }
                    .validate()
                    .is_err(),
                "{deny:?}"
            );
            assert!(NetworkPolicy::Allowlist {
                allow: list(&["a.com"]),
                deny
            }
            .validate()
            .is_err());
        }
        assert!(NetworkPolicy::check_entry("*.pythonhosted.org").is_ok());
        assert!(NetworkPolicy::check_entry("not a host").is_err());
    }

    #[test]
    fn denying_adds_entries_once_and_leaves_none_alone() {
        let policy = NetworkPolicy::Open {
            deny: list(&["a.com"]),
        }
        .denying(list(&["a.com", "b.com"]));
        assert_eq!(policy.deny(), ["a.com", "b.com"]);
        assert_eq!(
            NetworkPolicy::None.denying(list(&["a.com"])),
            NetworkPolicy::None
        );
    }

    #[test]
    fn an_allowlist_within_open_egress_keeps_names_and_public_ranges_only() {
        let open = NetworkPolicy::Open {
            deny: list(&["1.1.1.1"]),
        };
        let within = open.restricted_to(&list(&[
            "pypi.org",
            "*.pythonhosted.org",
            "8.8.8.0/24",
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0/0",
            "192.0.0.0/24",
            "192.0.0.9",
            "2001:4860::/32",
            "::ffff:127.0.0.1",
        ]));
        assert_eq!(
            within,
            NetworkPolicy::Allowlist {
                allow: list(&[
                    "pypi.org",
                    "*.pythonhosted.org",
                    "8.8.8.0/24",
                    // Global, inside the refused 192.0.0.0/24.
                    "192.0.0.9",
                    "2001:4860::/32",
                ]),
                deny: list(&["1.1.1.1"]),
            }
        );
        assert!(
            !within.permits("x", ip("127.0.0.1")),
            "open never opens the host"
        );
        assert_eq!(
            open.restricted_to(&list(&["127.0.0.1"])),
            NetworkPolicy::None,
            "nothing left"
        );
        assert_eq!(
            NetworkPolicy::None.restricted_to(&list(&["pypi.org"])),
            NetworkPolicy::None
        );
    }

    #[test]
    fn an_allowlist_within_an_allowlist_keeps_what_both_hold() {
        let ceiling = NetworkPolicy::Allowlist {
            allow: list(&["*.pythonhosted.org", "pypi.org", "127.0.0.1", "10.0.0.0/8"]),
            deny: list(&["10.9.9.9"]),
        };
        let within = ceiling.restricted_to(&list(&[
            "files.pythonhosted.org", // held by a suffix of the ceiling: kept
            "*.org",                  // holds two of the ceiling's: those
            "127.0.0.0/8",            // holds 127.0.0.1: that
            "10.1.0.0/16",            // held by 10.0.0.0/8: kept
            "example.com",            // in neither: gone
            "192.168.0.1",            // in neither: gone
        ]));
        assert_eq!(
            within,
            NetworkPolicy::Allowlist {
                allow: list(&[
                    "files.pythonhosted.org",
                    "*.pythonhosted.org",
                    "pypi.org",
                    "127.0.0.1",
                    "10.1.0.0/16",
                ]),
                deny: list(&["10.9.9.9"]),
            }
        );
        assert!(within.permits("x", ip("127.0.0.1")));
        assert!(!within.permits("x", ip("127.0.0.2")));
        assert!(!within.may_resolve("example.com"));
        assert_eq!(
            ceiling.restricted_to(&list(&["example.com"])),
            NetworkPolicy::None
        );
    }

    #[test]
    fn deny_except_splits_denied_ranges_around_exempt_ones() {
        assert_eq!(
            NetworkPolicy::deny_except(&list(&["10.0.0.0/8"]), &list(&["10.128.0.0/9"])),
            list(&["10.0.0.0/9"])
        );
        let pieces = NetworkPolicy::deny_except(&list(&["10.0.0.0/8"]), &list(&["10.1.2.3"]));
        assert_eq!(pieces.len(), 24);
        let left = NetworkPolicy::Open { deny: pieces };
        let left = NetworkPolicy::Allowlist {
            allow: list(&["10.0.0.0/8"]),
            deny: left.deny().to_vec(),
        };
        assert!(left.permits("x", ip("10.1.2.3")), "the exempt address");
        for refused in [
            "10.0.0.0",
            "10.1.2.2",
            "10.1.2.4",
            "10.255.255.255",
            "10.1.3.3",
        ] {
            assert!(!left.permits("x", ip(refused)), "{refused}");
        }
        assert_eq!(
            NetworkPolicy::deny_except(
                &list(&[
                    "1.2.3.4",
                    "a.example",
                    "*.b.example",
                    "2001:db8::/32",
                    "5.6.7.8"
                ]),
                &list(&["1.0.0.0/8", "a.example", "2001:db8::1", "c.b.example"]),
            ),
            // The held address and names go; the IPv6 range splits; a suffix is not split
            // around a name; an untouched entry stays as written.
            [
                vec!["*.b.example".to_owned()],
                (0..96)
                    .map(|n| {
                        let hole = 0x2001_0db8u128 << 96 | 1;
                        let prefix = 33 + n;
                        let mask = u128::MAX << (128 - prefix);
                        let bits = (hole & mask) ^ (1u128 << (128 - prefix));
                        format!("{}/{prefix}", std::net::Ipv6Addr::from(bits))
                    })
                    .collect(),
                vec!["5.6.7.8".to_owned()],
            ]
            .concat()
        );
    }
}
