//! IP allowlists, enforced where the client's address is known: which address a request comes
//! from (the peer, or `X-Forwarded-For` from a trusted proxy) and whether the organization's or
//! the API key's list lets it through (the enclave keeps the lists; it cannot see addresses).

use std::net::IpAddr;
use std::sync::Arc;

use coffer_org_rules::model::{IpAllowlist, ORGANIZATION_ALLOWLIST};

use crate::client_address::parse_network;
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

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
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
