//! Policies: create (one or many), update, delete and read. Every expression is parsed and
//! validated when written (spec 12); policies are records of kind `policy` named by label.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{json, Value};

use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::record_kinds::POLICY;
use crate::store::{Nanos, Record, StoreError, Write};
use coffer_org_rules::transition::POLICY_ID;
use coffer_policy as policy;

/// Spec 5: the message for a policy name already in use.
pub const NAME_TAKEN: &str = "policy label must be unique";

/// The swagger `Policy` object.
pub fn policy_json(r: &Record) -> Value {
    let text = |k: &str| r.data.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut v = json!({
        "policyId": r.id,
        "policyName": r.name,
        "effect": text("effect"),
        "createdAt": timestamp(r.created_at),
        "updatedAt": timestamp(r.updated_at),
        "notes": text("notes"),
        "consensus": text("consensus"),
        "condition": text("condition"),
    });
    if let Some(t) = r.data.get("time").and_then(Value::as_str) {
        v["time"] = json!(t);
    }
    v
}

fn effect(e: &str) -> Result<&'static str, ApiError> {
    match e {
        "EFFECT_ALLOW" => Ok("EFFECT_ALLOW"),
        "EFFECT_DENY" => Ok("EFFECT_DENY"),
        other => Err(ApiError::invalid(format!("invalid policy effect: {other:?} (EFFECT_ALLOW or EFFECT_DENY)"))),
    }
}

/// Parses the three expressions; the error names which one is invalid and why.
fn check_expressions(
    condition: Option<&str>,
    consensus: Option<&str>,
    time: Option<&str>,
    suffix: &str,
) -> Result<(), ApiError> {
    if let Some(c) = condition {
        policy::parse_condition(c).map_err(|e| ApiError::invalid(format!("invalid policy condition: {e}{suffix}")))?;
    }
    if let Some(c) = consensus {
        policy::parse_consensus(c).map_err(|e| ApiError::invalid(format!("invalid policy consensus: {e}{suffix}")))?;
    }
    if let Some(t) = time {
        policy::parse_time(t).map_err(|e| ApiError::invalid(format!("invalid policy time: {e}{suffix}")))?;
    }
    Ok(())
}

fn put(record: Record, must_exist: bool) -> Write {
    Write::PutRecordChecked { record, unique_message: NAME_TAKEN.into(), must_exist }
}

/// Loads a policy of the organization; 404 if it is not there.
async fn load_policy(state: &std::sync::Arc<crate::state::AppState>, org: &str, id: &str) -> Result<Record, ApiError> {
    let (org, id2) = (org.to_string(), id.to_string());
    state.db(move |s| s.record(&org, POLICY, &id2)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("policy not found: {id}")),
        other => other.into(),
    })
}

/// `CreatePolicyIntentV3`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatePolicyIntent {
    policy_name: String,
    effect: String,
    condition: Option<String>,
    consensus: Option<String>,
    notes: String,
    time: Option<String>,
}

/// Validates one policy and makes its record, named `id`; `suffix` locates it in a batch.
fn new_policy(org: &str, id: String, now: Nanos, p: CreatePolicyIntent, suffix: &str) -> Result<Record, ApiError> {
    required(&p.policy_name, "policyName")?;
    let effect = effect(&p.effect)?;
    check_expressions(p.condition.as_deref(), p.consensus.as_deref(), p.time.as_deref(), suffix)?;
    let mut data = json!({ "effect": effect, "notes": p.notes, "condition": p.condition, "consensus": p.consensus });
    if let Some(t) = p.time {
        data["time"] = json!(t);
    }
    Ok(Record {
        organization_id: org.to_string(),
        kind: POLICY.into(),
        id,
        name: p.policy_name,
        data,
        created_at: now,
        updated_at: now,
    })
}

/// A policy Coffer itself makes (the auth proxy's) for the activity `ctx`, validated like any
/// other: the first policy it makes.
pub fn system_policy(ctx: &Ctx, name: &str, consensus: &str, condition: &str, notes: &str) -> Result<Record, ApiError> {
    let p = CreatePolicyIntent {
        policy_name: name.into(),
        effect: "EFFECT_ALLOW".into(),
        condition: Some(condition.into()),
        consensus: Some(consensus.into()),
        notes: notes.into(),
        time: None,
    };
    new_policy(&ctx.org.id, ctx.derived_id(POLICY_ID, 0), ctx.now, p, "")
}

pub async fn create_policy(ctx: Ctx, intent: CreatePolicyIntent) -> Result<Outcome, ApiError> {
    let record = new_policy(&ctx.org.id, ctx.derived_id(POLICY_ID, 0), ctx.now, intent, "")?;
    ctx.state.read_store(|s| crate::evaluation_share::check_policy_count(s, &ctx.org.id, 1))?;
    Ok(Outcome { result: json!({ "policyId": record.id }), writes: vec![put(record, false)] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatePoliciesIntent {
    #[serde(default)]
    policies: Vec<CreatePolicyIntent>,
}

/// All or nothing: one invalid policy or one taken name refuses the whole batch.
pub async fn create_policies(ctx: Ctx, intent: CreatePoliciesIntent) -> Result<Outcome, ApiError> {
    if intent.policies.is_empty() {
        return Err(ApiError::invalid("policies must not be empty"));
    }
    let records = intent
        .policies
        .into_iter()
        .enumerate()
        // A nanosecond apart, so lists keep the batch's order.
        .map(|(i, p)| {
            let id = ctx.derived_id(POLICY_ID, i);
            new_policy(&ctx.org.id, id, ctx.now + i as Nanos, p, &format!(" (policies[{i}])"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    ctx.state.read_store(|s| crate::evaluation_share::check_policy_count(s, &ctx.org.id, records.len()))?;
    let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
    let result = json!({ "policyIds": ids });
    Ok(Outcome { result, writes: records.into_iter().map(|r| put(r, false)).collect() })
}

/// `UpdatePolicyIntentV2`: absent fields keep their value; an empty condition, consensus or
/// time clears it (empty means always true).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePolicyIntent {
    policy_id: String,
    policy_name: Option<String>,
    policy_effect: Option<String>,
    policy_condition: Option<String>,
    policy_consensus: Option<String>,
    policy_notes: Option<String>,
    time: Option<String>,
}

pub async fn update_policy(ctx: Ctx, intent: UpdatePolicyIntent) -> Result<Outcome, ApiError> {
    required(&intent.policy_id, "policyId")?;
    if let Some(n) = &intent.policy_name {
        required(n, "policyName")?;
    }
    let effect = intent.policy_effect.as_deref().map(effect).transpose()?;
    check_expressions(
        intent.policy_condition.as_deref(),
        intent.policy_consensus.as_deref(),
        intent.time.as_deref(),
        "",
    )?;
    let mut record = load_policy(&ctx.state, &ctx.org.id, &intent.policy_id).await?;
    if let Some(n) = intent.policy_name {
        record.name = n;
    }
    let data = &mut record.data;
    if let Some(e) = effect {
        data["effect"] = json!(e);
    }
    for (key, value) in [
        ("condition", intent.policy_condition),
        ("consensus", intent.policy_consensus),
        ("notes", intent.policy_notes),
        ("time", intent.time),
    ] {
        if let Some(v) = value {
            data[key] = json!(v);
        }
    }
    record.updated_at = ctx.now;
    Ok(Outcome { result: json!({ "policyId": record.id }), writes: vec![put(record, true)] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletePolicyIntent {
    policy_id: String,
}

pub async fn delete_policy(ctx: Ctx, intent: DeletePolicyIntent) -> Result<Outcome, ApiError> {
    load_policy(&ctx.state, &ctx.org.id, &intent.policy_id).await?;
    Ok(Outcome {
        result: json!({ "policyId": intent.policy_id }),
        writes: vec![Write::DeleteRecords {
            organization_id: ctx.org.id.clone(),
            kind: POLICY.into(),
            ids: vec![intent.policy_id.clone()],
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletePoliciesIntent {
    #[serde(default)]
    policy_ids: Vec<String>,
}

pub async fn delete_policies(ctx: Ctx, intent: DeletePoliciesIntent) -> Result<Outcome, ApiError> {
    if intent.policy_ids.is_empty() {
        return Err(ApiError::invalid("policyIds must not be empty"));
    }
    let mut seen = HashSet::new();
    for id in &intent.policy_ids {
        if !seen.insert(id.as_str()) {
            return Err(ApiError::invalid(format!("duplicate policy id: {id}")));
        }
        load_policy(&ctx.state, &ctx.org.id, id).await?;
    }
    Ok(Outcome {
        result: json!({ "policyIds": intent.policy_ids }),
        writes: vec![Write::DeleteRecords {
            organization_id: ctx.org.id.clone(),
            kind: POLICY.into(),
            ids: intent.policy_ids.clone(),
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetPolicyRequest {
    policy_id: String,
}

pub async fn get_policy(ctx: QueryCtx, req: GetPolicyRequest) -> Result<Value, ApiError> {
    let r = load_policy(&ctx.state, &ctx.org.id, &req.policy_id).await?;
    Ok(json!({ "policy": policy_json(&r) }))
}

pub async fn list_policies(ctx: QueryCtx, req: super::params::ListRequest) -> Result<Value, ApiError> {
    let (org, page) = (ctx.org.id.clone(), req.page()?);
    let records = ctx.state.db(move |s| s.records_page(&org, POLICY, &page)).await??;
    Ok(json!({ "policies": records.iter().map(policy_json).collect::<Vec<_>>() }))
}

/// `get_active_policies`: each policy of the organization, and whether its time window holds
/// now (a policy without one is active; one whose window fails to evaluate is not, with the
/// error). The window is evaluated as the enclave's decisions do (`coffer_policy`).
pub async fn get_active_policies(ctx: QueryCtx, _req: Value) -> Result<Value, ApiError> {
    let org = ctx.org.id.clone();
    let records = ctx.state.db(move |s| s.records_page(&org, POLICY, &crate::store::Page::ALL)).await??;
    let now = crate::store::now_nanos();
    // Parsing as many windows as the organization has policies is work off the async runtime.
    let organization_id = ctx.org.id.clone();
    let statuses = tokio::task::spawn_blocking(move || {
        records
            .iter()
            .map(|r| {
                let window = r.data.get("time").and_then(Value::as_str).unwrap_or_default();
                let mut status = json!({ "organizationId": organization_id, "policyId": r.id });
                match coffer_policy::time_window_holds(window, now) {
                    Ok(active) => status["active"] = json!(active),
                    Err(error) => (status["active"], status["error"]) = (json!(false), json!(error)),
                }
                if !window.trim().is_empty() {
                    status["timeExpr"] = json!(window);
                }
                status
            })
            .collect::<Vec<Value>>()
    })
    .await
    .map_err(|_| ApiError::internal())?;
    Ok(json!({ "statuses": statuses, "evaluatedAtMs": (now / 1_000_000).to_string() }))
}
