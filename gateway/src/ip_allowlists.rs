//! IP allowlists, enforced where the client's address is known: which address a request comes
//! from (the peer, or `X-Forwarded-For` from a trusted proxy) and whether the organization's or
//! the API key's list lets it through (the enclave keeps the lists; it cannot see addresses).

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::HeaderMap;
use coffer_org_rules::model::{IpAllowlist, ORGANIZATION_ALLOWLIST};
use ipnet::IpNet;

use crate::error::ApiError;
use crate::record_kinds::IP_ALLOWLIST;
use crate::stamps::Caller;
use crate::state::AppState;
use crate::store::{Organization, StoreError};

/// The record id of the organization's list (an API key's is its public key).
pub const ORGANIZATION_RECORD_ID: &str = "organization";

/// The record id of the list `key` names (`coffer_org_rules::transition::ip_allowlist_key`).
pub fn record_id(key: &str) -> &str {
    if key == ORGANIZATION_ALLOWLIST {
        ORGANIZATION_RECORD_ID
    } else {
        key
    }
}

/// The list key of record `id` ([`record_id`] reversed).
pub fn key_of(id: &str) -> &str {
    if id == ORGANIZATION_RECORD_ID {
        ORGANIZATION_ALLOWLIST
    } else {
        id
    }
}

/// Where a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Over the API's listener: the client's address, if it could be told.
    Network(Option<IpAddr>),
    /// From the gateway itself (the auth proxy's calls, which serve any visitor by design, and
    /// in-process tests): no list applies.
    Internal,
}

/// An address (`10.0.0.1`, a host route) or a CIDR (`10.0.0.0/8`).
pub fn parse_network(s: &str) -> Option<IpNet> {
    let s = s.trim();
    s.parse::<IpNet>().ok().or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}

/// `::ffff:a.b.c.d` as `a.b.c.d`: one client, one address, whichever socket family carried it.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client of a request from `peer` with `headers`: the peer, unless it is one of
/// `trusted` proxies, in which case the right-most `X-Forwarded-For` address that is not itself
/// trusted (each proxy appends the address it saw; only the trusted ones' additions are
/// believed). Hops are read one by one from the right, as bytes: what lies left of the hop that
/// names the client (a client's own forged prefix, even one that is not text) is never read.
/// `None`: the hop that should name the client names no address.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> Option<IpAddr> {
    let peer = canonical(peer);
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(&ip));
    if !is_trusted(peer) {
        return Some(peer);
    }
    let hops: Vec<&[u8]> =
        headers.get_all("x-forwarded-for").iter().flat_map(|v| v.as_bytes().split(|b| *b == b',')).collect();
    let mut last = peer;
    for hop in hops.iter().rev() {
        let ip = std::str::from_utf8(hop).ok().and_then(|h| h.trim().parse::<IpAddr>().ok()).map(canonical)?;
        if !is_trusted(ip) {
            return Some(ip);
        }
        last = ip;
    }
    // No header, or every hop a trusted proxy: the left-most is the client as far as anyone can
    // tell.
    Some(last)
}

/// Whether `list` lets `client` through: an address in one of its rules. A rule that no longer
/// parses, or an unknown client, is an evaluation error, answered by `onEvaluationError`.
fn admits(list: &IpAllowlist, client: Option<IpAddr>) -> Result<bool, ()> {
    let client = client.ok_or(())?;
    let mut error = false;
    for rule in &list.rules {
        match parse_network(&rule.cidr) {
            Some(net) if net.contains(&client) => return Ok(true),
            Some(_) => {}
            None => error = true,
        }
    }
    if error {
        Err(())
    } else {
        Ok(false)
    }
}

/// The list stored as record `id` of `organization_id`, if any.
async fn stored(state: &Arc<AppState>, organization_id: &str, id: &str) -> Result<Option<IpAllowlist>, ApiError> {
    let (org, id) = (organization_id.to_string(), id.to_string());
    match state.db(move |s| s.record(&org, IP_ALLOWLIST, &id)).await? {
        Ok(r) => Ok(serde_json::from_value(r.data).ok()),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Refuses (JSON 403 naming the list, not its rules) a request of `caller` to `org` from
/// `origin` that its organization's lists do not let through. The lists are a top-level
/// organization's: a parent's credential acting for a sub-organization is held to the parent's,
/// and a sub-organization's own requests to none. The organization's list applies while
/// enabled; an API key with a list of its own is held to that one instead.
pub async fn enforce(
    state: &Arc<AppState>,
    org: &Organization,
    caller: &Caller,
    origin: Origin,
) -> Result<(), ApiError> {
    let Origin::Network(client) = origin else { return Ok(()) };
    let owner = match (&org.parent_id, caller.via_parent) {
        (Some(parent), true) => parent.clone(),
        (Some(_), false) => return Ok(()),
        (None, _) => org.id.clone(),
    };
    let Some(organization_list) = stored(state, &owner, ORGANIZATION_RECORD_ID).await? else { return Ok(()) };
    if !organization_list.enabled {
        return Ok(());
    }
    let (list, name) = match stored(state, &owner, &caller.public_key).await? {
        Some(own) => (own, "the API key's IP allowlist"),
        None => (organization_list, "the organization's IP allowlist"),
    };
    let allowed = match admits(&list, client) {
        Ok(allowed) => allowed,
        Err(()) => list.on_evaluation_error == "ALLOW",
    };
    if allowed {
        return Ok(());
    }
    tracing::info!(organization = %owner, list = name, "request refused by an IP allowlist");
    Err(ApiError::forbidden(format!("request not authorized: the client address is not allowed by {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarded_for_is_read_only_from_trusted_proxies_and_from_the_right() {
        let trusted = vec![parse_network("10.0.0.0/8").unwrap(), parse_network("2001:db8::1").unwrap()];
        // An untrusted peer's header is ignored, whatever it claims.
        assert_eq!(client_address(ip("198.51.100.7"), &headers(&["203.0.113.1"]), &trusted), Some(ip("198.51.100.7")));
        // A trusted peer: the right-most untrusted hop (a client's own prefix is not believed).
        let h = headers(&["203.0.113.66, 198.51.100.9", "10.1.1.1"]);
        assert_eq!(client_address(ip("10.0.0.2"), &h, &trusted), Some(ip("198.51.100.9")));
        assert_eq!(client_address(ip("2001:db8::1"), &headers(&["192.0.2.5"]), &trusted), Some(ip("192.0.2.5")));
        // No header: the proxy itself; a garbled hop: no address.
        assert_eq!(client_address(ip("10.0.0.2"), &headers(&[]), &trusted), Some(ip("10.0.0.2")));
        assert_eq!(client_address(ip("10.0.0.2"), &headers(&["nonsense"]), &trusted), None);
        // A client's own prefix, even bytes that are not text, is never read: the proxy's hop is.
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", axum::http::HeaderValue::from_bytes(b"\xff, 198.51.100.9").unwrap());
        assert_eq!(client_address(ip("10.0.0.2"), &h, &trusted), Some(ip("198.51.100.9")));
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", axum::http::HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(client_address(ip("10.0.0.2"), &h, &trusted), None);
        assert_eq!(client_address(ip("10.0.0.2"), &headers(&["10.0.0.3"]), &trusted), Some(ip("10.0.0.3")));
        // IPv4-mapped IPv6 is the IPv4 address.
        assert_eq!(client_address(ip("::ffff:198.51.100.7"), &headers(&[]), &[]), Some(ip("198.51.100.7")));
    }

    #[test]
    fn a_list_admits_its_networks_and_errs_on_an_unknown_client() {
        let rule = |cidr: &str| coffer_org_rules::model::IpRule { cidr: cidr.into(), label: String::new() };
        let list = IpAllowlist {
            enabled: true,
            on_evaluation_error: "DENY".into(),
            rules: vec![rule("203.0.113.0/24"), rule("2001:db8::/32")],
        };
        assert_eq!(admits(&list, Some(ip("203.0.113.9"))), Ok(true));
        assert_eq!(admits(&list, Some(ip("2001:db8::5"))), Ok(true));
        assert_eq!(admits(&list, Some(ip("198.51.100.1"))), Ok(false));
        assert_eq!(admits(&list, None), Err(()));
        let empty = IpAllowlist { rules: vec![], ..list };
        assert_eq!(admits(&empty, Some(ip("203.0.113.9"))), Ok(false), "an enabled list without rules lets nobody in");
        assert_eq!(record_id(key_of(ORGANIZATION_RECORD_ID)), ORGANIZATION_RECORD_ID);
        assert_eq!(key_of("02ab"), "02ab");
    }
}
