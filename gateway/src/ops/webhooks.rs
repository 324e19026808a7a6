//! Webhook endpoints: create, update, delete and list, with the target rules (public `https://`
//! hosts only, unless the deployment allows private targets) and the subscription rules.
//! Records of kind `webhook_endpoint`; names need not be unique.

use serde::Deserialize;
use serde_json::{json, Value};

use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::error::ApiError;
use crate::record_kinds::WEBHOOK_ENDPOINT;
use crate::store::{Page, Record, StoreError, Write};
use crate::webhook_endpoint::{check_resolved, check_target, endpoint_json, EventFilter, ACTIVITY_UPDATES};

/// Event types of the hosted service that need a chain indexer or a transaction sender.
const NOT_PRODUCED: &[&str] =
    &["BALANCE_CONFIRMED_UPDATES", "BALANCE_FINALIZED_UPDATES", "SEND_TRANSACTION_STATUS_UPDATES"];

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
    // An early answer from the gateway's records; concurrent creations can all pass it. The
    // enclave decides the cap (its `max_webhook_endpoints_per_organization`) as the change commits.
    let org = ctx.org.id.clone();
    let (count, _) = ctx.state.db(|s| s.records_version(&org, WEBHOOK_ENDPOINT)).await??;
    let max = ctx.state.webhooks.max_endpoints_per_organization;
    if count as usize >= max {
        return Err(ApiError::invalid(format!("an organization may have at most {max} webhook endpoints")));
    }
    let id = ctx.derived_id(coffer_org_rules::transition::WEBHOOK_ENDPOINT_ID, 0);
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

pub async fn list_webhook_endpoints(ctx: QueryCtx, req: super::params::ListRequest) -> Result<Value, ApiError> {
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
    Ok(json!({ "deliveries": list.iter().map(crate::webhook_endpoint::delivery_json).collect::<Vec<_>>() }))
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
            "https://[2002:c0a8:101::1]/",
            "https://[::ffff:0:a00:1]/",
            "https://[64:ff9b::a9fe:a9fe]/",
            "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
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
