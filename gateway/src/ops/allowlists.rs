//! `set_ip_allowlist`, `remove_ip_allowlist` and `query/get_ip_allowlist`: the lists the
//! enclave's state holds and `crate::ip_allowlists` enforces.

use coffer_org_rules::model::IpAllowlist;
use coffer_org_rules::transition::{ip_allowlist, ip_allowlist_key};
use serde_json::{json, Value};

use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::error::ApiError;
use crate::ip_allowlists::record_id;
use crate::record_kinds::IP_ALLOWLIST;
use crate::store::{Record, StoreError, Write};

/// The record of list `id` of `organization_id`, if any.
async fn record(
    ctx_state: &std::sync::Arc<crate::state::AppState>,
    org: &str,
    id: &str,
) -> Result<Option<Record>, ApiError> {
    let (org, id) = (org.to_string(), id.to_string());
    match ctx_state.db(move |s| s.record(&org, IP_ALLOWLIST, &id)).await? {
        Ok(r) => Ok(Some(r)),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `set_ip_allowlist`: the organization's list or an API key's (`publicKey`), whole
/// (`coffer_org_rules::transition::ip_allowlist`; the enclave also checks that an API key's list
/// names an API key of the organization).
pub async fn set_ip_allowlist(ctx: Ctx, params: Value) -> Result<Outcome, ApiError> {
    if ctx.org.parent_id.is_some() {
        return Err(ApiError::invalid("IP allowlists belong to a top-level organization: a sub-organization has none"));
    }
    let id = record_id(&ip_allowlist_key(&params)).to_string();
    let existing = record(&ctx.state, &ctx.org.id, &id).await?;
    let current: Option<IpAllowlist> = existing.as_ref().and_then(|r| serde_json::from_value(r.data.clone()).ok());
    let (_, list) = ip_allowlist(&params, current.as_ref()).map_err(ApiError::invalid)?;
    let record = Record {
        organization_id: ctx.org.id.clone(),
        kind: IP_ALLOWLIST.into(),
        id: id.clone(),
        name: id,
        data: serde_json::to_value(&list).map_err(|_| ApiError::internal())?,
        created_at: existing.map_or(ctx.now, |r| r.created_at),
        updated_at: ctx.now,
    };
    Ok(Outcome { result: json!({}), writes: vec![Write::PutRecord(record)] })
}

/// `remove_ip_allowlist`: the organization's list or an API key's, which must exist.
pub async fn remove_ip_allowlist(ctx: Ctx, params: Value) -> Result<Outcome, ApiError> {
    let id = record_id(&ip_allowlist_key(&params)).to_string();
    if record(&ctx.state, &ctx.org.id, &id).await?.is_none() {
        return Err(ApiError::not_found("no such IP allowlist"));
    }
    Ok(Outcome {
        result: json!({}),
        writes: vec![Write::DeleteRecords {
            organization_id: ctx.org.id.clone(),
            kind: IP_ALLOWLIST.into(),
            ids: vec![id],
        }],
    })
}

/// `get_ip_allowlist`: the organization's list or an API key's (`publicKey`); `{}` when none.
pub async fn get_ip_allowlist(ctx: QueryCtx, params: Value) -> Result<Value, ApiError> {
    let key = ip_allowlist_key(&params);
    let Some(r) = record(&ctx.state, &ctx.org.id, record_id(&key)).await? else { return Ok(json!({})) };
    let list: IpAllowlist = serde_json::from_value(r.data).map_err(|_| ApiError::internal())?;
    let created_at = (r.updated_at / 1_000_000).to_string();
    let rules: Vec<Value> = list
        .rules
        .iter()
        .map(|rule| {
            let mut v = json!({ "cidr": rule.cidr, "createdAt": created_at });
            if !rule.label.is_empty() {
                v["label"] = json!(rule.label);
            }
            v
        })
        .collect();
    let mut allowlist = json!({
        "organizationId": ctx.org.id,
        "rules": rules,
        "onEvaluationError": list.on_evaluation_error,
    });
    if key.is_empty() {
        allowlist["enabled"] = json!(list.enabled);
    } else {
        allowlist["publicKey"] = json!(key);
    }
    Ok(json!({ "allowlist": allowlist }))
}
