//! What a webhook endpoint is, for its handlers (`ops::webhooks`) and the delivery worker
//! (`webhook_delivery`) alike: the target rules (public `https://` hosts only, unless the
//! deployment allows private targets), the event filter, and the JSON of endpoints and deliveries.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::store::{Record, WebhookDelivery, DELIVERY_PENDING};

/// Longest endpoint URL accepted, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// The event type Coffer delivers.
pub const ACTIVITY_UPDATES: &str = "ACTIVITY_UPDATES";
/// Why a webhook target is refused (the caller-facing message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRefused(pub String);

/// Whether an address is one a webhook may not reach: loopback, private, link-local,
/// unique-local, unspecified, multicast, broadcast, shared (CGNAT), documentation, discard-only,
/// or an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, dialled as that IPv4 address) that is one of
/// those. The cloud metadata address (169.254.169.254) is link-local. IPv6 prefixes that reach an
/// IPv4 host through a translator or a relay are refused whole, whatever IPv4 address they embed:
/// where they lead is the translator's decision, not the address's (a NAT64 gateway in the
/// deployment's own network reaches its private IPv4 hosts), and no public webhook receiver needs
/// one. They are IPv4-compatible (`::/96`), SIIT / IPv4-translated (`::ffff:0:0:0/96`), NAT64
/// (`64:ff9b::/96` and the local-use `64:ff9b:1::/48`: all of `64:ff9b::/32`), 6to4
/// (`2002::/16`) and Teredo (`2001::/32`). The delivery path dials only what this allows: literal
/// hosts are checked again at each delivery, names through a resolver that applies it.
pub fn is_forbidden_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || a >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_forbidden_address(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link local
                || (s[0] & 0xffc0) == 0xfec0 // site local (deprecated)
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || s[..4] == [0x0100, 0, 0, 0] // discard-only (100::/64)
                || s[..6] == [0, 0, 0, 0, 0, 0] // IPv4-compatible
                || s[..6] == [0, 0, 0, 0, 0xffff, 0] // SIIT, IPv4-translated
                || (s[0] == 0x0064 && s[1] == 0xff9b) // NAT64, well-known and local-use
                || s[0] == 0x2002 // 6to4
                || (s[0] == 0x2001 && s[1] == 0) // Teredo
        }
    }
}

/// Checks a target URL's form and, for an address literal or a name that can only be local,
/// its address. Names are checked again, resolved, when dialled.
pub fn check_target(url: &str, allow_private: bool) -> Result<reqwest::Url, TargetRefused> {
    let refuse = |m: &str| Err(TargetRefused(m.to_string()));
    if url.len() > MAX_URL_BYTES {
        return refuse("url is longer than 2048 bytes");
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| TargetRefused(format!("url is not an absolute URL: {e}")))?;
    match parsed.scheme() {
        "https" => {}
        "http" if allow_private => {}
        _ => return refuse("url must use https://"),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return refuse("url must not carry a user name or password");
    }
    let host = match parsed.host() {
        Some(h) => h,
        None => return refuse("url has no host"),
    };
    if allow_private {
        return Ok(parsed);
    }
    let local_name = |name: &str| {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name == "localhost" || name.ends_with(".localhost") || name == "metadata.google.internal"
    };
    let forbidden = match host {
        url::Host::Ipv4(ip) => is_forbidden_address(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => is_forbidden_address(IpAddr::V6(ip)),
        url::Host::Domain(name) => local_name(name),
    };
    if forbidden {
        return refuse("url host is a loopback, private, link-local or metadata address");
    }
    Ok(parsed)
}

/// Resolves the target's host and refuses it if any address is forbidden (DNS may point a
/// public-looking name at a private address). A name that does not resolve now is accepted: it
/// is resolved again, and checked, at every delivery.
pub async fn check_resolved(url: &reqwest::Url, allow_private: bool) -> Result<(), TargetRefused> {
    let (Some(url::Host::Domain(name)), false) = (url.host(), allow_private) else { return Ok(()) };
    let port = url.port_or_known_default().unwrap_or(443);
    let Ok(Ok(addrs)) =
        tokio::time::timeout(std::time::Duration::from_secs(5), tokio::net::lookup_host((name, port))).await
    else {
        return Ok(());
    };
    for addr in addrs {
        if is_forbidden_address(addr.ip()) {
            return Err(TargetRefused(format!(
                "url host {name} resolves to a loopback, private, link-local or metadata address"
            )));
        }
    }
    Ok(())
}

/// The filter keys of a subscription's `filtersJson`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventFilter {
    #[serde(default)]
    pub activity_types: Option<Vec<String>>,
    #[serde(default)]
    pub activity_statuses: Option<Vec<String>>,
}

impl EventFilter {
    /// Parses `filtersJson` (empty: no filter).
    pub fn parse(text: &str) -> Result<EventFilter, ApiError> {
        if text.trim().is_empty() {
            return Ok(EventFilter::default());
        }
        let f: EventFilter = serde_json::from_str(text).map_err(|e| {
            ApiError::invalid(format!(
                "invalid filtersJson: {e} (a JSON object with activityTypes and/or activityStatuses, arrays of constants)"
            ))
        })?;
        let check = |values: &Option<Vec<String>>, prefix: &str, key: &str| match values {
            Some(vs) if vs.iter().any(|v| !v.starts_with(prefix) || v.len() == prefix.len()) => {
                Err(ApiError::invalid(format!("invalid filtersJson: every {key} entry must be an {prefix}* constant")))
            }
            _ => Ok(()),
        };
        check(&f.activity_types, "ACTIVITY_TYPE_", "activityTypes")?;
        check(&f.activity_statuses, "ACTIVITY_STATUS_", "activityStatuses")?;
        Ok(f)
    }

    /// Whether an activity of `activity_type` now in `status` passes every key given.
    pub fn admits(&self, activity_type: &str, status: &str) -> bool {
        let ok = |vs: &Option<Vec<String>>, v: &str| vs.as_ref().is_none_or(|vs| vs.iter().any(|x| x == v));
        ok(&self.activity_types, activity_type) && ok(&self.activity_statuses, status)
    }
}

fn text(r: &Record, key: &str) -> String {
    r.data.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// The seed's `WebhookEndpointData`.
pub fn endpoint_json(r: &Record) -> Value {
    json!({
        "endpointId": r.id,
        "organizationId": r.organization_id,
        "url": text(r, "url"),
        "name": text(r, "name"),
        "isActive": r.data.get("isActive").and_then(Value::as_bool).unwrap_or(true),
        "subscriptions": r.data.get("subscriptions").cloned().unwrap_or_else(|| json!([])),
        "createdAt": timestamp(r.created_at),
        "updatedAt": timestamp(r.updated_at),
    })
}

/// A delivery as the operators' query shows it.
pub fn delivery_json(d: &WebhookDelivery) -> Value {
    json!({
        "eventId": d.id,
        "endpointId": d.endpoint_id,
        "organizationId": d.activity_organization_id,
        "activityId": d.activity_id,
        "eventType": d.event_type,
        "status": d.status,
        "attempts": d.attempts,
        "lastStatusCode": d.last_status_code,
        "lastError": d.last_error,
        "nextAttemptAt": (d.status == DELIVERY_PENDING).then(|| timestamp(d.next_attempt_at)),
        "createdAt": timestamp(d.created_at),
        "updatedAt": timestamp(d.updated_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(ip: &str) -> bool {
        is_forbidden_address(ip.parse().unwrap())
    }

    /// IPv6 prefixes whose address names an IPv4 host through a translator or relay (6to4, SIIT,
    /// NAT64, Teredo): refused whole, whatever IPv4 address they embed, since where they lead is
    /// the translator's decision; and the IPv4-mapped form, dialled as the IPv4 address it maps,
    /// judged as that address.
    #[test]
    fn ipv6_forms_of_ipv4_addresses_are_refused() {
        for bad in [
            // 6to4 (2002::/16), embedding 127.0.0.1, 10.0.0.1, 192.168.1.1, 169.254.169.254, and a public one.
            "2002:7f00:1::",
            "2002:a00:1::1",
            "2002:c0a8:101::",
            "2002:a9fe:a9fe::1",
            "2002:808:808::",
            // SIIT / IPv4-translated (::ffff:0:0:0/96).
            "::ffff:0:7f00:1",
            "::ffff:0:a00:1",
            "::ffff:0:a9fe:a9fe",
            "::ffff:0:808:808",
            // NAT64, well-known (64:ff9b::/96) and local-use (64:ff9b:1::/48).
            "64:ff9b::7f00:1",
            "64:ff9b::808:808",
            "64:ff9b:1::a00:1",
            // Teredo (2001::/32).
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            // IPv4-mapped and IPv4-compatible private or loopback addresses.
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            // Discard-only (100::/64).
            "100::1",
        ] {
            assert!(forbidden(bad), "{bad}");
        }
        // Ordinary public addresses stay allowed, IPv4-mapped ones too (dialled as IPv4).
        for good in ["2606:4700::1111", "2a00:1450:4001:82a::200e", "::ffff:8.8.8.8", "8.8.8.8", "2003::1"] {
            assert!(!forbidden(good), "{good}");
        }
    }
}
