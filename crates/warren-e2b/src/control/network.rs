//! E2B's egress rules (`allow_internet_access`, `network.allowOut`, `network.denyOut`) as
//! the warren network policy of the sandbox.
//!
//! The server's `e2b.internet` is where any E2B sandbox may connect at most: E2B's rules
//! narrow it, never widen it (an API key is a uid's, not the operator's). Within it, E2B's
//! own semantics hold: `denyOut` refuses, `allowOut` wins over `denyOut`, and
//! `allow_internet_access: false` is `denyOut: ["0.0.0.0/0"]` (`ALL_TRAFFIC`):
//! - `0.0.0.0/0` denied (and not allowed): the allowlist of `allowOut` within
//!   `e2b.internet` ([`NetworkPolicy::restricted_to`]), so `none` without `allowOut`;
//! - otherwise: `e2b.internet` also refusing `denyOut`, less what `allowOut` lists
//!   ([`NetworkPolicy::deny_except`]: a denied range is split around an allowed one).
//!
//! The rest of `network` is what the sandbox's URLs do: `allowPublicTraffic` is taken
//! (warren's sandbox routes take the access token whenever the sandbox is `secure`, so
//! `false` needs a secure sandbox), `dnsServers` is kept (warren resolves on the host, so
//! it opens nothing); `maskRequestHost`, `httpsPorts`, `egressProxy` and `rules` would
//! change what warren cannot, and are refused.

use warren_core::NetworkPolicy;

use super::wire::NetworkConfig;
use crate::error::{shorten, ApiFailure};
use crate::state::E2bNetwork;

/// E2B's `ALL_TRAFFIC`: every destination.
pub(crate) const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// The network policy of a new sandbox, and what is kept of `network` to show back.
pub(crate) fn policy_of(
    ceiling: &NetworkPolicy,
    allow_internet_access: Option<bool>,
    secure: bool,
    network: Option<&NetworkConfig>,
) -> Result<(NetworkPolicy, Option<E2bNetwork>), ApiFailure> {
    let empty = NetworkConfig::default();
    let config = network.unwrap_or(&empty);
    refuse_unsupported(config, secure)?;
    let allow_out = config.allow_out.as_deref().unwrap_or_default();
    let deny_out = config.deny_out.as_deref().unwrap_or_default();
    check_entries("allowOut", allow_out)?;
    check_entries("denyOut", deny_out)?;
    let everything = |entries: &[String]| entries.iter().any(|e| e.trim() == ALL_TRAFFIC);
    let all_denied = allow_internet_access == Some(false) || everything(deny_out);
    let policy = if all_denied && !everything(allow_out) {
        ceiling.restricted_to(allow_out)
    } else {
        ceiling
            .clone()
            .denying(NetworkPolicy::deny_except(deny_out, allow_out))
    };
    let policy = policy.validate().map_err(|error| {
        ApiFailure::bad_request(format!(
            "network: allowOut and denyOut make no usable policy: {error}"
        ))
    })?;
    let kept = network.map(|config| E2bNetwork {
        allow_out: config.allow_out.clone(),
        deny_out: config.deny_out.clone(),
        allow_public_traffic: config.allow_public_traffic,
        dns_servers: config.dns_servers.clone(),
    });
    Ok((policy, kept))
}

/// Every entry is one warren's proxy can check, and there are not too many.
fn check_entries(field: &str, entries: &[String]) -> Result<(), ApiFailure> {
    if entries.len() > NetworkPolicy::MAX_ENTRIES {
        return Err(ApiFailure::bad_request(format!(
            "network.{field} holds {} entries; at most {} are allowed",
            entries.len(),
            NetworkPolicy::MAX_ENTRIES
        )));
    }
    for entry in entries {
        if NetworkPolicy::check_entry(entry).is_err() {
            return Err(ApiFailure::bad_request(format!(
                "network.{field} entry {:?} is not a destination warren can filter: use an IP \
                 address, a CIDR range (0.0.0.0/0 is all traffic), a host name or *.suffix",
                shorten(entry)
            )));
        }
    }
    Ok(())
}

/// 400 for what `network` would change and warren cannot do.
fn refuse_unsupported(config: &NetworkConfig, secure: bool) -> Result<(), ApiFailure> {
    let refuse = |field: &str, why: &str| {
        Err(ApiFailure::bad_request(format!(
            "network.{field} is not supported by this server: {why}"
        )))
    };
    if config.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
        return refuse(
            "egressProxy",
            "a sandbox's egress leaves only through warren's own filtering proxy",
        );
    }
    if config.rules.as_ref().is_some_and(|rules| !rules.is_empty()) {
        return refuse(
            "rules",
            "warren does not transform a sandbox's egress requests",
        );
    }
    if config.mask_request_host.is_some() {
        return refuse(
            "maskRequestHost",
            "warren serves envd and the code interpreter only, not the sandbox's own ports",
        );
    }
    if config
        .https_ports
        .as_ref()
        .is_some_and(|ports| !ports.is_empty())
    {
        return refuse(
            "httpsPorts",
            "warren serves envd and the code interpreter only, not the sandbox's own ports",
        );
    }
    if config.allow_public_traffic == Some(false) && !secure {
        return refuse(
            "allowPublicTraffic",
            "false needs secure: true, as the access token is what guards the sandbox's routes",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| (*e).to_owned()).collect()
    }

    fn rules(allow_out: Option<&[&str]>, deny_out: Option<&[&str]>) -> NetworkConfig {
        NetworkConfig {
            allow_out: allow_out.map(list),
            deny_out: deny_out.map(list),
            ..NetworkConfig::default()
        }
    }

    fn open() -> NetworkPolicy {
        NetworkPolicy::Open { deny: vec![] }
    }

    fn policy(
        ceiling: &NetworkPolicy,
        internet: Option<bool>,
        network: Option<NetworkConfig>,
    ) -> Result<NetworkPolicy, ApiFailure> {
        policy_of(ceiling, internet, true, network.as_ref()).map(|(policy, _)| policy)
    }

    #[test]
    fn without_rules_a_sandbox_gets_the_servers_internet_or_none() {
        assert_eq!(policy(&open(), None, None).unwrap(), open());
        assert_eq!(policy(&open(), Some(true), None).unwrap(), open());
        assert_eq!(
            policy(&open(), Some(false), None).unwrap(),
            NetworkPolicy::None
        );
        let (_, kept) = policy_of(&open(), None, true, None).unwrap();
        assert_eq!(kept, None, "nothing to show back");
    }

    #[test]
    fn all_traffic_denied_with_allow_out_is_an_allowlist_of_allow_out() {
        for (internet, deny_out) in [
            (None, Some(&[ALL_TRAFFIC][..])),
            (Some(false), None),
            (Some(true), Some(&["1.2.3.4", " 0.0.0.0/0 "][..])),
        ] {
            let got = policy(
                &open(),
                internet,
                Some(rules(
                    Some(&["pypi.org", "*.pythonhosted.org", "8.8.8.8"]),
                    deny_out,
                )),
            )
            .unwrap();
            assert_eq!(
                got,
                NetworkPolicy::Allowlist {
                    allow: list(&["pypi.org", "*.pythonhosted.org", "8.8.8.8"]),
                    deny: vec![],
                },
                "{internet:?} {deny_out:?}"
            );
        }
        assert_eq!(
            policy(&open(), None, Some(rules(None, Some(&[ALL_TRAFFIC])))).unwrap(),
            NetworkPolicy::None,
            "everything denied, nothing allowed"
        );
    }

    #[test]
    fn deny_out_alone_refuses_its_entries_on_top_of_the_servers_internet() {
        assert_eq!(
            policy(
                &open(),
                None,
                Some(rules(None, Some(&["1.2.3.4", "10.0.0.0/8"])))
            )
            .unwrap(),
            NetworkPolicy::Open {
                deny: list(&["1.2.3.4", "10.0.0.0/8"])
            }
        );
        // allowOut wins over denyOut, as on E2B: the denied range is split around it.
        let got = policy(
            &open(),
            None,
            Some(rules(Some(&["9.9.9.128/25"]), Some(&["9.9.9.0/24"]))),
        )
        .unwrap();
        assert_eq!(got.deny(), ["9.9.9.0/25"]);
        assert!(got.permits("x", "9.9.9.200".parse().unwrap()));
        assert!(!got.permits("x", "9.9.9.100".parse().unwrap()));
    }

    #[test]
    fn e2b_rules_never_widen_the_servers_internet() {
        // The default (open) never reaches internal addresses, however they are allowed.
        assert_eq!(
            policy(
                &open(),
                None,
                Some(rules(
                    Some(&["127.0.0.1", "169.254.169.254"]),
                    Some(&[ALL_TRAFFIC])
                ))
            )
            .unwrap(),
            NetworkPolicy::None
        );
        let ceiling = NetworkPolicy::Allowlist {
            allow: list(&["127.0.0.1", "127.0.0.2"]),
            deny: vec![],
        };
        let narrowed = policy(
            &ceiling,
            None,
            Some(rules(Some(&["127.0.0.0/8"]), Some(&[ALL_TRAFFIC]))),
        )
        .unwrap();
        assert_eq!(
            narrowed, ceiling,
            "the ceiling's entries inside 127.0.0.0/8"
        );
        let one = policy(
            &ceiling,
            None,
            Some(rules(
                Some(&["127.0.0.1", "127.0.0.3"]),
                Some(&[ALL_TRAFFIC]),
            )),
        )
        .unwrap();
        assert_eq!(one.allow(), ["127.0.0.1"]);
        let denied = policy(&ceiling, None, Some(rules(None, Some(&["127.0.0.2"])))).unwrap();
        assert!(denied.permits("x", "127.0.0.1".parse().unwrap()));
        assert!(!denied.permits("x", "127.0.0.2".parse().unwrap()));
        assert_eq!(
            policy(
                &NetworkPolicy::None,
                None,
                Some(rules(Some(&["a.com"]), None))
            )
            .unwrap(),
            NetworkPolicy::None
        );
    }

    #[test]
    fn entries_warren_cannot_filter_and_unsupported_settings_are_refused() {
        for (allow_out, deny_out) in [
            (Some(&["not a host"][..]), None),
            (None, Some(&["10.0.0.0/33"][..])),
            (Some(&["*"][..]), Some(&[ALL_TRAFFIC][..])),
            (Some(&["http://example.com"][..]), None),
        ] {
            let failure = policy(&open(), None, Some(rules(allow_out, deny_out))).unwrap_err();
            assert_eq!(failure.status, 400);
            assert!(failure
                .message
                .contains("is not a destination warren can filter"));
        }
        let too_many: Vec<String> = (0..=256)
            .map(|n| format!("10.0.{}.{}", n / 256, n % 256))
            .collect();
        let failure = policy(
            &open(),
            None,
            Some(NetworkConfig {
                deny_out: Some(too_many),
                ..NetworkConfig::default()
            }),
        )
        .unwrap_err();
        assert!(
            failure.message.contains("at most 256"),
            "{}",
            failure.message
        );
        for (config, field) in [
            (
                NetworkConfig {
                    egress_proxy: Some(serde_json::json!({"address": "p:1080"})),
                    ..NetworkConfig::default()
                },
                "egressProxy",
            ),
            (
                NetworkConfig {
                    mask_request_host: Some("${PORT}-x.example".into()),
                    ..NetworkConfig::default()
                },
                "maskRequestHost",
            ),
            (
                NetworkConfig {
                    https_ports: Some(vec![serde_json::json!(3000)]),
                    ..NetworkConfig::default()
                },
                "httpsPorts",
            ),
            (
                serde_json::from_value(serde_json::json!({"rules": {"a.com": [{}]}})).unwrap(),
                "rules",
            ),
        ] {
            let failure = policy(&open(), None, Some(config)).unwrap_err();
            assert!(failure.message.contains(field), "{}", failure.message);
        }
        let private = NetworkConfig {
            allow_public_traffic: Some(false),
            ..NetworkConfig::default()
        };
        assert!(policy_of(&open(), None, false, Some(&private)).is_err());
        assert!(policy_of(&open(), None, true, Some(&private)).is_ok());
        // null is absence, as E2B reads it.
        let nulls: NetworkConfig = serde_json::from_value(serde_json::json!({
            "allowOut": null, "egressProxy": null, "allowPublicTraffic": null, "rules": {}
        }))
        .unwrap();
        assert_eq!(policy(&open(), None, Some(nulls)).unwrap(), open());
    }

    #[test]
    fn what_was_given_is_kept_to_be_shown_back() {
        let config: NetworkConfig = serde_json::from_value(serde_json::json!({
            "allowOut": ["127.0.0.1"], "denyOut": ["0.0.0.0/0"],
            "allowPublicTraffic": true, "dnsServers": ["1.1.1.1"]
        }))
        .unwrap();
        let (_, kept) = policy_of(&open(), None, true, Some(&config)).unwrap();
        assert_eq!(
            kept,
            Some(E2bNetwork {
                allow_out: Some(list(&["127.0.0.1"])),
                deny_out: Some(list(&[ALL_TRAFFIC])),
                allow_public_traffic: Some(true),
                dns_servers: Some(list(&["1.1.1.1"])),
            })
        );
    }
}
