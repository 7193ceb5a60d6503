//! Which addresses are globally reachable: the IANA special-purpose address registries as
//! data, so that network `open` (and an allowlist's host names) never reach an address the
//! registries mark as not globally reachable (I23).
//!
//! Sources, as published by IANA (checked 2026-12):
//! - IPv4 Special-Purpose Address Registry
//!   <https://www.iana.org/assignments/iana-ipv4-special-registry/>, RFC 6890;
//! - IPv6 Special-Purpose Address Registry
//!   <https://www.iana.org/assignments/iana-ipv6-special-registry/>, RFC 6890;
//! - IPv6 Address Space <https://www.iana.org/assignments/ipv6-address-space/>: only
//!   2000::/3 is Global Unicast; the rest is reserved by the IETF, unique local,
//!   link-local, the deprecated site-local fec0::/10 (RFC 3879) or multicast;
//! - IPv4 Multicast Address Space <https://www.iana.org/assignments/multicast-addresses/>
//!   (224.0.0.0/4, RFC 5771): not unicast, so no destination for a proxied connection.
//!
//! The most specific block holding an address decides, as in the registries, where
//! 192.0.0.9/32 (PCP anycast) is globally reachable inside the refused 192.0.0.0/24.
//! Blocks the registries mark "N/A" are decided here, each with its reason on the row:
//! the deprecated ones are refused; the transition forms (6to4, Teredo) and the IPv4
//! forms (IPv4-mapped, NAT64) carry an IPv4 address the packets end up at, and that
//! address decides.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How a block is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// Globally reachable.
    Global,
    /// Not globally reachable: refused unless an allowlist lists it as an address or range.
    Internal,
    /// Carries IPv4 addresses (see [`embedded_ipv4`]); reachable only if all of them are.
    Embeds(Embedding),
}

/// Where an IPv6 form carries its IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Embedding {
    /// The low 32 bits: IPv4-mapped (`::ffff:a.b.c.d`) and NAT64 (`64:ff9b::a.b.c.d`).
    Low32,
    /// 6to4, `2002:AABB:CCDD::/48`: the relay's IPv4 address in bits 16..48 (RFC 3056).
    SixToFour,
    /// Teredo, `2001:0:SSSS:SSSS:flags:port:CCCC:CCCC`: the server's IPv4 address in bits
    /// 32..64 and the client's, inverted, in the low 32 bits (RFC 4380 §4).
    Teredo,
}

/// One row of the table: a block and how it is judged.
#[derive(Debug, Clone, Copy)]
pub(super) struct SpecialBlock {
    pub(super) network: IpAddr,
    pub(super) prefix: u8,
    pub(super) reach: Reach,
    /// The registry's name for the block, and where it is defined (read by the tests'
    /// messages; here it documents the row).
    #[cfg_attr(not(test), expect(dead_code, reason = "documents the row"))]
    pub(super) name: &'static str,
}

const fn v4(octets: [u8; 4], prefix: u8, reach: Reach, name: &'static str) -> SpecialBlock {
    SpecialBlock {
        network: IpAddr::V4(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3])),
        prefix,
        reach,
        name,
    }
}

const fn v6(s: [u16; 8], prefix: u8, reach: Reach, name: &'static str) -> SpecialBlock {
    SpecialBlock {
        network: IpAddr::V6(Ipv6Addr::new(
            s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
        )),
        prefix,
        reach,
        name,
    }
}

use Reach::{Embeds, Global, Internal};

/// The table. Every row of both special-purpose registries appears, in the registries'
/// order, with their "Globally Reachable" column; rows from the other registries follow.
#[rustfmt::skip]
pub(super) static SPECIAL_BLOCKS: &[SpecialBlock] = &[
    // IPv4 Special-Purpose Address Registry.
    v4([0, 0, 0, 0], 8, Internal, "\"this network\", RFC 791 §3.2"),
    v4([0, 0, 0, 0], 32, Internal, "\"this host on this network\", RFC 1122 §3.2.1.3"),
    v4([10, 0, 0, 0], 8, Internal, "private use, RFC 1918"),
    v4([100, 64, 0, 0], 10, Internal, "shared address space (carrier-grade NAT), RFC 6598"),
    v4([127, 0, 0, 0], 8, Internal, "loopback, RFC 1122 §3.2.1.3"),
    v4([169, 254, 0, 0], 16, Internal, "link local (cloud metadata), RFC 3927"),
    v4([172, 16, 0, 0], 12, Internal, "private use, RFC 1918"),
    v4([192, 0, 0, 0], 24, Internal, "IETF protocol assignments, RFC 6890 §2.1"),
    v4([192, 0, 0, 0], 29, Internal, "IPv4 service continuity prefix, RFC 7335"),
    v4([192, 0, 0, 8], 32, Internal, "IPv4 dummy address, RFC 7600"),
    v4([192, 0, 0, 9], 32, Global, "port control protocol anycast, RFC 7723"),
    v4([192, 0, 0, 10], 32, Global, "traversal using relays around NAT anycast, RFC 8155"),
    v4([192, 0, 0, 170], 32, Internal, "NAT64/DNS64 discovery, RFC 8880, RFC 7050 §2.2"),
    v4([192, 0, 0, 171], 32, Internal, "NAT64/DNS64 discovery, RFC 8880, RFC 7050 §2.2"),
    v4([192, 0, 2, 0], 24, Internal, "documentation (TEST-NET-1), RFC 5737"),
    v4([192, 31, 196, 0], 24, Global, "AS112-v4, RFC 7535"),
    v4([192, 52, 193, 0], 24, Global, "AMT, RFC 7450"),
    // Registry: "N/A"; deprecated, and its only use was the 6to4 relays refused below.
    v4([192, 88, 99, 0], 24, Internal, "deprecated (6to4 relay anycast), RFC 7526"),
    v4([192, 168, 0, 0], 16, Internal, "private use, RFC 1918"),
    v4([192, 175, 48, 0], 24, Global, "direct delegation AS112 service, RFC 7534"),
    v4([198, 18, 0, 0], 15, Internal, "benchmarking, RFC 2544"),
    v4([198, 51, 100, 0], 24, Internal, "documentation (TEST-NET-2), RFC 5737"),
    v4([203, 0, 113, 0], 24, Internal, "documentation (TEST-NET-3), RFC 5737"),
    v4([240, 0, 0, 0], 4, Internal, "reserved, RFC 1112 §4"),
    v4([255, 255, 255, 255], 32, Internal, "limited broadcast, RFC 8190, RFC 919 §7"),
    // IPv4 Multicast Address Space Registry.
    v4([224, 0, 0, 0], 4, Internal, "multicast, RFC 5771"),

    // IPv6 Address Space: everything outside Global Unicast is refused.
    v6([0, 0, 0, 0, 0, 0, 0, 0], 0, Internal, "not global unicast (IPv6 address space registry)"),
    v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3, Global, "global unicast, RFC 4291"),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, Internal, "site-local (deprecated), RFC 3879"),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, Internal, "multicast, RFC 4291 §2.7"),
    // Deprecated and never translated by the kernel: refused whatever it carries.
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96, Internal, "IPv4-compatible (deprecated), RFC 4291 §2.5.5.1"),
    // IPv6 Special-Purpose Address Registry.
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, Internal, "loopback, RFC 4291"),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, Internal, "unspecified, RFC 4291"),
    // Registry: not globally reachable, as the block itself is never routed; a socket
    // connecting to one reaches the IPv4 address it carries, so that address decides.
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, Embeds(Embedding::Low32), "IPv4-mapped, RFC 4291"),
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, Embeds(Embedding::Low32), "IPv4-IPv6 translation (NAT64), RFC 6052"),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, Internal, "IPv4-IPv6 translation (local use), RFC 8215"),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, Internal, "discard-only, RFC 6666"),
    v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64, Internal, "dummy IPv6 prefix, RFC 9780"),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, Internal, "IETF protocol assignments, RFC 2928"),
    // Registry: "N/A"; the relay and the client are both IPv4 hosts and decide.
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, Embeds(Embedding::Teredo), "TEREDO, RFC 4380, RFC 8190"),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128, Global, "port control protocol anycast, RFC 7723"),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128, Global, "traversal using relays around NAT anycast, RFC 8155"),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128, Global, "DNS-SD service registration protocol anycast, RFC 9665"),
    v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48, Internal, "benchmarking, RFC 5180"),
    v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32, Global, "AMT, RFC 7450"),
    v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48, Global, "AS112-v6, RFC 7535"),
    // Registry: "N/A"; deprecated.
    v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28, Internal, "deprecated (previously ORCHID), RFC 4843"),
    v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28, Global, "ORCHIDv2, RFC 7343"),
    v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28, Global, "drone remote ID protocol entity tags, RFC 9374"),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, Internal, "documentation, RFC 3849"),
    // Registry: "N/A"; packets go to the IPv4 relay it carries, which decides.
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, Embeds(Embedding::SixToFour), "6to4, RFC 3056"),
    v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48, Global, "direct delegation AS112 service, RFC 7534"),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, Internal, "documentation, RFC 9637"),
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, Internal, "segment routing (SRv6) SIDs, RFC 9602"),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, Internal, "unique-local, RFC 4193, RFC 8190"),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, Internal, "link-local unicast, RFC 4291"),
];

impl SpecialBlock {
    /// Whether the block holds `address` (always false across address families).
    pub(super) fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(network) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(network) & mask == u128::from(address) & mask
            }
            _ => false,
        }
    }
}

/// The most specific row holding `address`: none for an IPv4 address outside every row
/// (ordinary unicast), always one for IPv6 (`::/0` holds everything).
pub(super) fn most_specific(address: IpAddr) -> Option<&'static SpecialBlock> {
    SPECIAL_BLOCKS
        .iter()
        .filter(|block| block.contains(address))
        .max_by_key(|block| block.prefix)
}

/// The IPv4 addresses an IPv6 address carries for delivery (IPv4-mapped, NAT64, 6to4,
/// Teredo), empty for every other address.
pub fn embedded_ipv4(address: IpAddr) -> Vec<Ipv4Addr> {
    let IpAddr::V6(v6) = address else {
        return Vec::new();
    };
    let Some(SpecialBlock {
        reach: Reach::Embeds(embedding),
        ..
    }) = most_specific(address)
    else {
        return Vec::new();
    };
    let bits = u128::from(v6);
    // Each shift leaves the wanted 32 bits at the bottom; `as u32` keeps exactly those.
    let at = |shift: u32| Ipv4Addr::from((bits >> shift) as u32);
    match embedding {
        Embedding::Low32 => vec![at(0)],
        Embedding::SixToFour => vec![at(80)],
        Embedding::Teredo => vec![at(64), Ipv4Addr::from(!(bits as u32))],
    }
}

/// Whether the registries mark `address` globally reachable (with the embedded IPv4
/// addresses of transition forms judged in turn).
pub fn is_global(address: IpAddr) -> bool {
    match most_specific(address).map(|block| block.reach) {
        None | Some(Reach::Global) => true,
        Some(Reach::Internal) => false,
        Some(Reach::Embeds(_)) => embedded_ipv4(address)
            .into_iter()
            // An embedded address is IPv4, which never embeds again: no recursion loop.
            .all(|v4| is_global(IpAddr::V4(v4))),
    }
}

/// Whether every address of the range `network/prefix` is globally reachable, judged
/// conservatively: the most specific row holding the whole range must be global (or there
/// is none, for IPv4), and no row that is not global may lie inside it, even where a global
/// row inside that one would give some of it back.
pub(super) fn range_is_global(network: IpAddr, prefix: u8) -> bool {
    let range = SpecialBlock {
        network,
        prefix,
        reach: Reach::Global,
        name: "the range asked about",
    };
    let holding = SPECIAL_BLOCKS
        .iter()
        .filter(|block| block.prefix <= prefix && block.contains(network))
        .max_by_key(|block| block.prefix);
    let outer_global = matches!(holding.map(|block| block.reach), None | Some(Reach::Global));
    outer_global
        && !SPECIAL_BLOCKS.iter().any(|block| {
            block.prefix > prefix && block.reach != Reach::Global && range.contains(block.network)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-written expectations: for every row an address inside it and one just outside
    /// (the address before its first or after its last), with what must be decided.
    /// `true` is globally reachable.
    #[rustfmt::skip]
    const CASES: &[(&str, bool)] = &[
        // 0.0.0.0/8 and 0.0.0.0/32
        ("0.0.0.0", false), ("0.0.0.1", false), ("0.255.255.255", false), ("1.0.0.0", true),
        // 10.0.0.0/8
        ("10.0.0.0", false), ("10.255.255.255", false), ("9.255.255.255", true), ("11.0.0.0", true),
        // 100.64.0.0/10
        ("100.64.0.0", false), ("100.127.255.255", false), ("100.63.255.255", true), ("100.128.0.0", true),
        // 127.0.0.0/8
        ("127.0.0.1", false), ("127.255.255.255", false), ("126.255.255.255", true), ("128.0.0.0", true),
        // 169.254.0.0/16
        ("169.254.169.254", false), ("169.253.255.255", true), ("169.255.0.0", true),
        // 172.16.0.0/12
        ("172.16.0.0", false), ("172.31.255.255", false), ("172.15.255.255", true), ("172.32.0.0", true),
        // 192.0.0.0/24, /29, 192.0.0.8, .9, .10, .170, .171
        ("192.0.0.0", false), ("192.0.0.7", false), ("192.0.0.8", false),
        ("192.0.0.9", true), ("192.0.0.10", true), ("192.0.0.11", false),
        ("192.0.0.169", false), ("192.0.0.170", false), ("192.0.0.171", false), ("192.0.0.172", false),
        ("192.0.0.255", false), ("191.255.255.255", true), ("192.0.1.0", true),
        // 192.0.2.0/24
        ("192.0.2.1", false), ("192.0.2.255", false), ("192.0.3.0", true),
        // 192.31.196.0/24, 192.52.193.0/24 (global, in no refused block)
        ("192.31.196.1", true), ("192.31.195.255", true), ("192.52.193.1", true), ("192.52.194.0", true),
        // 192.88.99.0/24
        ("192.88.99.1", false), ("192.88.98.255", true), ("192.88.100.0", true),
        // 192.168.0.0/16
        ("192.168.1.1", false), ("192.167.255.255", true), ("192.169.0.0", true),
        // 192.175.48.0/24
        ("192.175.48.1", true), ("192.175.49.0", true),
        // 198.18.0.0/15
        ("198.18.0.0", false), ("198.19.255.255", false), ("198.17.255.255", true), ("198.20.0.0", true),
        // 198.51.100.0/24
        ("198.51.100.0", false), ("198.51.100.255", false), ("198.51.99.255", true), ("198.51.101.0", true),
        // 203.0.113.0/24
        ("203.0.113.0", false), ("203.0.113.255", false), ("203.0.112.255", true), ("203.0.114.0", true),
        // 224.0.0.0/4 and 240.0.0.0/4, 255.255.255.255
        ("224.0.0.1", false), ("223.255.255.255", true), ("239.255.255.255", false),
        ("240.0.0.0", false), ("255.255.255.254", false), ("255.255.255.255", false),
        // Ordinary public addresses.
        ("151.101.0.223", true), ("8.8.8.8", true),

        // ::/0 and 2000::/3
        ("2000::", true), ("3fff:efff:ffff:ffff:ffff:ffff:ffff:ffff", true), ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
        ("4000::", false), ("1::", false), ("e000::", false),
        // fec0::/10, ff00::/8
        ("fec0::1", false), ("feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false), ("ff02::1", false),
        // ::/96, ::1, ::
        ("::", false), ("::1", false), ("::2", false), ("::8.8.8.8", false),
        ("::1:0:0", false),
        // ::ffff:0:0/96 carries the address it reaches.
        ("::ffff:127.0.0.1", false), ("::ffff:10.1.2.3", false), ("::ffff:8.8.8.8", true),
        ("::fffe:ffff:ffff", false), ("::1:0:0:0", false),
        // 64:ff9b::/96 likewise; 64:ff9b:1::/48 refused.
        ("64:ff9b::a9fe:a9fe", false), ("64:ff9b::808:808", true), ("64:ff9b::1:0:0", false),
        ("64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", false),
        ("64:ff9b:1::808:808", false), ("64:ff9b:1:ffff:ffff:ffff:ffff:ffff", false), ("64:ff9b:2::", false),
        // 100::/64, 100:0:0:1::/64
        ("100::1", false), ("100:0:0:1::1", false), ("100:0:0:2::", false), ("ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
        // 2001::/23 and its rows
        ("2001:1ff:ffff::", false), ("2001:200::", true), ("2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
        ("2001:1::1", true), ("2001:1::2", true), ("2001:1::3", true), ("2001:1::4", false), ("2001:1::", false),
        ("2001:2::1", false), ("2001:2:0:ffff:ffff:ffff:ffff:ffff", false), ("2001:2:1::", false),
        ("2001:3::1", true), ("2001:3:ffff:ffff:ffff:ffff:ffff:ffff", true), ("2001:4::", false),
        ("2001:4:112::1", true), ("2001:4:111:ffff:ffff:ffff:ffff:ffff", false), ("2001:4:113::", false),
        ("2001:10::1", false), ("2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", false),
        ("2001:20::1", true), ("2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", true),
        ("2001:30::1", true), ("2001:3f:ffff:ffff:ffff:ffff:ffff:ffff", true), ("2001:40::", false),
        ("2001:f:ffff:ffff:ffff:ffff:ffff:ffff", false),
        // Teredo 2001::/32: server 8.8.8.8 and client 1.2.3.4 (inverted: fefd:fcfb) are public.
        ("2001:0:808:808::fefd:fcfb", true),
        ("2001:0:a00:1::fefd:fcfb", false), // server 10.0.0.1
        ("2001:0:808:808::80ff:fffe", false), // client 127.0.0.1
        ("2001:1:0:0:0:0:0:0", false),
        // 2001:db8::/32
        ("2001:db8::1", false), ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", false),
        ("2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", true), ("2001:db9::", true),
        // 2002::/16 (6to4): the relay it carries decides.
        ("2002:808:808::1", true), ("2002:a00:1::1", false), ("2002:c000:201::1", false),
        ("2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true), ("2003::", true),
        // 2620:4f:8000::/48
        ("2620:4f:8000::1", true), ("2620:4f:8001::", true),
        // 3fff::/20
        ("3fff::1", false), ("3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", false), ("3fff:1000::", true),
        ("3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
        // 5f00::/16
        ("5f00::1", false), ("5eff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false), ("5f01::", false),
        // fc00::/7, fe80::/10
        ("fc00::1", false), ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false), ("fe00::", false),
        ("fe80::1", false), ("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false), ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
        ("fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", false),
        // Ordinary public IPv6.
        ("2a04:4e42::223", true), ("2606:4700::1111", true),
    ];

    fn parse(address: &str) -> IpAddr {
        address
            .parse()
            .unwrap_or_else(|_| panic!("{address} parses"))
    }

    fn first_and_last(block: &SpecialBlock) -> (u128, u128, u128) {
        let (bits, width) = match block.network {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        };
        let host_bits = width - u32::from(block.prefix);
        let size_minus_one = if host_bits == 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let max = if width == 32 {
            u128::from(u32::MAX)
        } else {
            u128::MAX
        };
        (bits, bits + size_minus_one, max)
    }

    fn address_like(block: &SpecialBlock, bits: u128) -> IpAddr {
        match block.network {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(bits as u32)),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(bits)),
        }
    }

    #[test]
    fn every_case_is_decided_as_written() {
        let wrong: Vec<String> = CASES
            .iter()
            .filter(|(address, global)| is_global(parse(address)) != *global)
            .map(|(address, global)| format!("{address} should be global={global}"))
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn every_row_has_a_case_inside_it_and_just_outside_it() {
        let cases: Vec<IpAddr> = CASES.iter().map(|(a, _)| parse(a)).collect();
        for block in SPECIAL_BLOCKS {
            let inside = cases
                .iter()
                .any(|a| most_specific(*a).is_some_and(|b| std::ptr::eq(b, block)));
            assert!(
                inside,
                "no case decided by {} ({:?}/{})",
                block.name, block.network, block.prefix
            );
            let (first, last, max) = first_and_last(block);
            let mut outside = Vec::new();
            if first > 0 {
                outside.push(address_like(block, first - 1));
            }
            if last < max {
                outside.push(address_like(block, last + 1));
            }
            if outside.is_empty() {
                continue; // ::/0 has no outside.
            }
            assert!(
                outside.iter().any(|o| cases.contains(o)),
                "no case just outside {} ({:?}/{}): one of {outside:?}",
                block.name,
                block.network,
                block.prefix
            );
        }
    }

    #[test]
    fn every_row_is_a_network_address_and_no_row_repeats() {
        for (i, block) in SPECIAL_BLOCKS.iter().enumerate() {
            let (first, _, _) = first_and_last(block);
            let canonical = SpecialBlock {
                prefix: block.prefix,
                ..*block
            };
            assert!(canonical.contains(block.network));
            let masked = match block.network {
                IpAddr::V4(a) => {
                    let mask = u32::MAX
                        .checked_shl(32 - u32::from(block.prefix))
                        .unwrap_or(0);
                    u128::from(u32::from(a) & mask)
                }
                IpAddr::V6(a) => {
                    let mask = u128::MAX
                        .checked_shl(128 - u32::from(block.prefix))
                        .unwrap_or(0);
                    u128::from(a) & mask
                }
            };
            assert_eq!(first, masked, "{} has host bits set", block.name);
            for other in &SPECIAL_BLOCKS[i + 1..] {
                assert!(
                    !(other.network == block.network && other.prefix == block.prefix),
                    "{} repeats",
                    block.name
                );
            }
        }
    }

    #[test]
    fn transition_forms_yield_the_ipv4_addresses_they_carry() {
        let four = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            embedded_ipv4(parse("::ffff:1.2.3.4")),
            vec![four("1.2.3.4")]
        );
        assert_eq!(
            embedded_ipv4(parse("64:ff9b::102:304")),
            vec![four("1.2.3.4")]
        );
        assert_eq!(
            embedded_ipv4(parse("2002:102:304::1")),
            vec![four("1.2.3.4")]
        );
        assert_eq!(
            embedded_ipv4(parse("2001:0:808:808:8000:ffff:fefd:fcfb")),
            vec![four("8.8.8.8"), four("1.2.3.4")]
        );
        assert!(embedded_ipv4(parse("2a04:4e42::223")).is_empty());
        assert!(
            embedded_ipv4(parse("::1.2.3.4")).is_empty(),
            "IPv4-compatible is refused, not judged"
        );
        assert!(embedded_ipv4(parse("1.2.3.4")).is_empty());
    }
}
