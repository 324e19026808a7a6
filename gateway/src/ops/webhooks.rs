//! Webhook endpoints: create, update, delete and list, with the target rules (public `https://`
//! hosts only, unless the deployment allows private targets) and the subscription rules.
//! Records of kind `webhook_endpoint`; names need not be unique.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::{json, Value};

use super::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::store::{Page, Record, StoreError, Write};

pub const WEBHOOK_ENDPOINT: &str = "webhook_endpoint";
/// Longest endpoint URL accepted, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// The event type Coffer delivers.
pub const ACTIVITY_UPDATES: &str = "ACTIVITY_UPDATES";
/// Event types of the hosted service that need a chain indexer or a transaction sender.
const NOT_PRODUCED: &[&str] =
    &["BALANCE_CONFIRMED_UPDATES", "BALANCE_FINALIZED_UPDATES", "SEND_TRANSACTION_STATUS_UPDATES"];

/// Why a webhook target is refused (the caller-facing message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRefused(pub String);

/// Whether an address is one a webhook may not reach: loopback, private, link-local,
/// unique-local, unspecified, multicast, broadcast, shared (CGNAT), documentation, or an IPv4
/// address mapped or embedded in IPv6 that is one of those. The cloud metadata address
/// (169.254.169.254) is link-local.
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
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80 // link local
                || (first & 0xffc0) == 0xfec0 // site local (deprecated)
                || first == 0x2001 && v6.segments()[1] == 0x0db8 // documentation
                || (first == 0x0064 && v6.segments()[1] == 0xff9b) // NAT64 of an IPv4 address
                || v6.segments()[..6] == [0, 0, 0, 0, 0, 0] // IPv4-compatible
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

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionParams {
    event_type: String,
    filters_json: Option<String>,
    is_active: Option<bool>,
}

/// A checked subscription, as stored.
fn subscription(p: &SubscriptionParams) -> Result<Value, ApiError> {
    match p.event_type.as_str() {
        ACTIVITY_UPDATES => {}
        t if NOT_PRODUCED.contains(&t) => {
            return Err(ApiError::invalid(format!(
                "event type {t} is not supported: it needs a chain indexer Coffer does not have, so it could never fire"
            )))
        }
        t => {
            return Err(ApiError::invalid(format!("unknown webhook event type: {t:?} (supported: {ACTIVITY_UPDATES})")))
        }
    }
    let filters = p.filters_json.clone().unwrap_or_default();
    EventFilter::parse(&filters)?;
    Ok(json!({ "eventType": p.event_type, "filtersJson": filters, "isActive": p.is_active.unwrap_or(true) }))
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

async fn checked_target(ctx: &Ctx, url: &str) -> Result<String, ApiError> {
    let allow = ctx.state.webhooks.allow_private_targets;
    let parsed = check_target(url, allow).map_err(|e| ApiError::invalid(e.0))?;
    check_resolved(&parsed, allow).await.map_err(|e| ApiError::invalid(e.0))?;
    Ok(url.to_string())
}

async fn load_endpoint(ctx: &Ctx, id: &str) -> Result<Record, ApiError> {
    let org = ctx.org.id.clone();
    ctx.state.db(|s| s.record(&org, WEBHOOK_ENDPOINT, id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("webhook endpoint not found: {id}")),
        other => other.into(),
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateWebhookEndpointIntent {
    url: String,
    name: String,
    #[serde(default)]
    subscriptions: Vec<SubscriptionParams>,
}

pub async fn create_webhook_endpoint(ctx: Ctx, intent: CreateWebhookEndpointIntent) -> Result<Outcome, ApiError> {
    required(&intent.name, "name")?;
    required(&intent.url, "url")?;
    let subscriptions = intent.subscriptions.iter().map(subscription).collect::<Result<Vec<_>, _>>()?;
    let url = checked_target(&ctx, &intent.url).await?;
    let org = ctx.org.id.clone();
    let (count, _) = ctx.state.db(|s| s.records_version(&org, WEBHOOK_ENDPOINT)).await??;
    let max = ctx.state.webhooks.max_endpoints_per_organization;
    if count as usize >= max {
        return Err(ApiError::invalid(format!("an organization may have at most {max} webhook endpoints")));
    }
    let id = uuid::Uuid::new_v4().to_string();
    let record = Record {
        organization_id: ctx.org.id.clone(),
        kind: WEBHOOK_ENDPOINT.into(),
        id: id.clone(),
        // Names need not be unique; the record's unique name is its id.
        name: id.clone(),
        data: json!({ "url": url, "name": intent.name, "isActive": true, "subscriptions": subscriptions }),
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    Ok(Outcome {
        result: json!({ "endpointId": id, "webhookEndpoint": endpoint_json(&record) }),
        writes: vec![Write::PutRecord(record)],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateWebhookEndpointIntent {
    endpoint_id: String,
    url: Option<String>,
    name: Option<String>,
    is_active: Option<bool>,
}

pub async fn update_webhook_endpoint(ctx: Ctx, intent: UpdateWebhookEndpointIntent) -> Result<Outcome, ApiError> {
    required(&intent.endpoint_id, "endpointId")?;
    let mut record = load_endpoint(&ctx, &intent.endpoint_id).await?;
    if let Some(name) = &intent.name {
        required(name, "name")?;
        record.data["name"] = json!(name);
    }
    if let Some(url) = &intent.url {
        record.data["url"] = json!(checked_target(&ctx, url).await?);
    }
    if let Some(active) = intent.is_active {
        record.data["isActive"] = json!(active);
    }
    record.updated_at = ctx.now;
    Ok(Outcome {
        result: json!({ "endpointId": record.id, "webhookEndpoint": endpoint_json(&record) }),
        writes: vec![Write::PutRecord(record)],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteWebhookEndpointIntent {
    endpoint_id: String,
}

pub async fn delete_webhook_endpoint(ctx: Ctx, intent: DeleteWebhookEndpointIntent) -> Result<Outcome, ApiError> {
    required(&intent.endpoint_id, "endpointId")?;
    load_endpoint(&ctx, &intent.endpoint_id).await?;
    Ok(Outcome {
        result: json!({ "endpointId": intent.endpoint_id }),
        writes: vec![
            Write::DeleteRecords {
                organization_id: ctx.org.id.clone(),
                kind: WEBHOOK_ENDPOINT.into(),
                ids: vec![intent.endpoint_id.clone()],
            },
            // Its pending deliveries are dropped with it.
            Write::DropWebhookDeliveries {
                organization_id: ctx.org.id.clone(),
                endpoint_id: intent.endpoint_id.clone(),
            },
        ],
    })
}

pub async fn list_webhook_endpoints(ctx: QueryCtx, req: super::ListRequest) -> Result<Value, ApiError> {
    let (org, page): (String, Page) = (ctx.org.id.clone(), req.page()?);
    let records = ctx.state.db(|s| s.records_page(&org, WEBHOOK_ENDPOINT, &page)).await??;
    Ok(json!({ "webhookEndpoints": records.iter().map(endpoint_json).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListDeliveriesRequest {
    endpoint_id: String,
    limit: Option<String>,
}

/// `coffer_list_webhook_deliveries` (a Coffer extension): an endpoint's deliveries, newest first
/// (`limit` "1".."1000", default 100), with attempt counts, the last answer and the next attempt.
pub async fn list_webhook_deliveries(ctx: QueryCtx, req: ListDeliveriesRequest) -> Result<Value, ApiError> {
    required(&req.endpoint_id, "endpointId")?;
    let limit = match req.limit.as_deref().map(str::trim) {
        None | Some("") => 100,
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => return Err(ApiError::invalid("invalid limit: must be a string from \"1\" to \"1000\"")),
        },
    };
    let org = ctx.org.id.clone();
    ctx.state.db(|s| s.record(&org, WEBHOOK_ENDPOINT, &req.endpoint_id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("webhook endpoint not found: {}", req.endpoint_id)),
        other => other.into(),
    })?;
    let list = ctx.state.db(|s| s.webhook_deliveries(&org, &req.endpoint_id, limit)).await??;
    Ok(json!({ "deliveries": list.iter().map(crate::webhook_delivery::delivery_json).collect::<Vec<_>>() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_must_be_public_https_without_userinfo() {
        assert!(check_target("https://hooks.example.com/coffer?x=1", false).is_ok());
        for bad in [
            "http://hooks.example.com/",
            "https://user:pw@hooks.example.com/",
            "https://127.0.0.1/",
            "https://10.1.2.3/",
            "https://169.254.169.254/latest/meta-data",
            "https://[::1]/",
            "https://[fd00::1]/",
            "https://[::ffff:192.168.1.1]/",
            "https://100.64.0.1/",
            "https://localhost:8443/",
            "https://api.localhost/",
            "https://metadata.google.internal/",
            "ftp://example.com/",
            "not a url",
            &format!("https://example.com/{}", "a".repeat(2048)),
        ] {
            assert!(check_target(bad, false).is_err(), "{bad}");
        }
        // The development setting allows http and private targets, never userinfo.
        assert!(check_target("http://127.0.0.1:9999/hook", true).is_ok());
        assert!(check_target("http://u:p@127.0.0.1:9999/hook", true).is_err());
    }

    #[test]
    fn filters_have_two_keys_and_match_every_key_given() {
        let f = EventFilter::parse(r#"{"activityTypes":["ACTIVITY_TYPE_CREATE_WALLET"]}"#).unwrap();
        assert!(f.admits("ACTIVITY_TYPE_CREATE_WALLET", "ACTIVITY_STATUS_COMPLETED"));
        assert!(!f.admits("ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "ACTIVITY_STATUS_COMPLETED"));
        let both = EventFilter::parse(
            r#"{"activityTypes":["ACTIVITY_TYPE_CREATE_WALLET"],"activityStatuses":["ACTIVITY_STATUS_FAILED"]}"#,
        )
        .unwrap();
        assert!(!both.admits("ACTIVITY_TYPE_CREATE_WALLET", "ACTIVITY_STATUS_COMPLETED"));
        assert!(both.admits("ACTIVITY_TYPE_CREATE_WALLET", "ACTIVITY_STATUS_FAILED"));
        assert!(EventFilter::parse("").unwrap().admits("anything", "at all"));
        for bad in
            [r#"{"orgs":[]}"#, "[1]", "{", r#"{"activityTypes":["CREATE_WALLET"]}"#, r#"{"activityStatuses":"x"}"#]
        {
            assert!(EventFilter::parse(bad).is_err(), "{bad}");
        }
    }
}
