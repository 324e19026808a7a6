//! Approvals and the policy engine's queries: `get_policy_evaluations` and Coffer's
//! `coffer_policy_dry_run` (the decision a submission would get, recording nothing).

use serde::Deserialize;
use serde_json::{json, Value};

use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render;
use crate::activity::submission::{self, Envelope};
use crate::activity::{TYPE_APPROVE, TYPE_REJECT};
use crate::error::ApiError;
use crate::store::now_nanos;

/// `approve_activity` / `reject_activity` never reach a handler: the pipeline records the vote.
pub async fn handled_by_pipeline(_ctx: Ctx, _intent: Value) -> Result<Outcome, ApiError> {
    Err(ApiError::internal())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetPolicyEvaluationsRequest {
    activity_id: String,
}

pub async fn get_policy_evaluations(ctx: QueryCtx, req: GetPolicyEvaluationsRequest) -> Result<Value, ApiError> {
    super::params::required(&req.activity_id, "activityId")?;
    let (org, id) = (ctx.org.id.clone(), req.activity_id.clone());
    let records = ctx.state.db(move |s| s.policy_evaluations(&org, &id)).await??;
    let items: Vec<Value> = records
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "activityId": r.activity_id,
                "organizationId": r.organization_id,
                "voteId": r.vote_id,
                "policyEvaluations": crate::store::outcomes::served(&r.evaluations),
                "createdAt": render::timestamp(r.created_at),
            })
        })
        .collect();
    Ok(json!({ "policyEvaluations": items }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DryRunRequest {
    /// A submission body as JSON: `{type, timestampMs?, organizationId?, parameters}`.
    activity: Value,
}

/// The decision the caller's submission of `activity` would get now, with every policy's
/// outcome and the clause that decided it, and the transaction it carries as the transaction
/// policies see it (`{root, tx}`, or null). Records nothing and runs nothing.
pub async fn policy_dry_run(ctx: QueryCtx, req: DryRunRequest) -> Result<Value, ApiError> {
    let Value::Object(mut body) = req.activity else {
        return Err(ApiError::invalid("activity must be a submission body object"));
    };
    let now = now_nanos();
    body.entry("organizationId").or_insert_with(|| json!(ctx.org.id));
    body.entry("timestampMs").or_insert_with(|| json!((now / 1_000_000).to_string()));
    let env = Envelope::decode(body, now / 1_000_000)?;
    if env.organization_id != ctx.org.id {
        return Err(ApiError::invalid("activity.organizationId must be the request's organizationId"));
    }
    let op = (ctx.registry.activity_by_type(&env.activity_type))
        .ok_or_else(|| ApiError::invalid(format!("unknown activity type {:?}", env.activity_type)))?;
    if env.activity_type == TYPE_APPROVE || env.activity_type == TYPE_REJECT {
        return Err(ApiError::invalid(
            "a vote is not decided by policies: dry-run the activity it targets (canApprove / canReject tell who may vote)",
        ));
    }
    let caller = &ctx.caller;
    let (decision, reason, policies, transaction) = if caller.via_parent {
        ("DECISION_DENY".to_string(), "PARENT_ORGANIZATION_CREDENTIAL".to_string(), json!([]), Value::Null)
    } else {
        // The enclave's decision over its authority state, within the organization's share of
        // the evaluations the gateway asks for.
        let request = coffer_proto::v1::DryRunActivityRequest {
            organization_id: ctx.org.id.clone(),
            certificate: caller.credential.certificate().to_vec(),
            activity_type: op.activity_type.to_string(),
            parameters: serde_json::to_vec(&submission::strip_nulls(env.parameters.clone()))
                .map_err(|_| ApiError::internal())?,
        };
        // Charged to the top-level organization: its sub-organizations (sign-ups anyone can make)
        // share its slots, not a share each.
        let top_level = ctx.org.parent_id.as_deref().unwrap_or(&ctx.org.id);
        let custody = &ctx.state.custody;
        let answer = crate::evaluation_share::share().run(top_level, custody.dry_run_activity(request)).await??;
        let policies: Value = serde_json::from_slice(&answer.policies).map_err(|_| ApiError::internal())?;
        // The enclave keeps it within its bound; an answer past that is no enclave's.
        let transaction = match answer.transaction.len() {
            0 => Value::Null,
            n if n > coffer_org_rules::facts::MAX_SHOWN_TRANSACTION_BYTES => return Err(ApiError::internal()),
            _ => serde_json::from_slice(&answer.transaction).map_err(|_| ApiError::internal())?,
        };
        (answer.decision, answer.reason, policies, transaction)
    };
    Ok(json!({
        "decision": decision,
        "reason": reason,
        "activityType": op.activity_type,
        "resource": op.resource,
        "action": op.action,
        "policies": policies,
        "transaction": transaction,
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use crate::store::{ActivityRecord, Organization, SqliteStore, Store, StoreError, Write, CONSENSUS_MOVED};

    fn update(expected_votes: usize, status: &str) -> Write {
        Write::UpdateConsensusActivity {
            organization_id: "org".into(),
            id: "a1".into(),
            expected_votes,
            status: status.into(),
            result: json!({"r": 1}),
            votes: json!([{"userId": "u1"}, {"userId": "u2"}]),
            failure: None,
            updated_at: 2,
            app_proofs: Vec::new(),
        }
    }

    #[test]
    fn consensus_transition_is_a_compare_and_set() {
        let dir = std::env::temp_dir().join(format!("coffer-cas-{}", uuid::Uuid::new_v4()));
        let store = Arc::new(SqliteStore::open(&dir.join("coffer.db")).unwrap());
        let org = Organization {
            id: "org".into(),
            name: "org".into(),
            parent_id: None,
            root_quorum_threshold: 1,
            root_user_ids: vec![],
            created_at: 0,
            updated_at: 0,
        };
        store.apply(&[Write::InsertOrganization(org)]).unwrap();
        let a = ActivityRecord {
            id: "a1".into(),
            organization_id: "org".into(),
            activity_type: "ACTIVITY_TYPE_CREATE_WALLET".into(),
            status: "ACTIVITY_STATUS_CONSENSUS_NEEDED".into(),
            fingerprint: "sha256:1".into(),
            intent: json!({}),
            result: json!({}),
            votes: json!([{"userId": "u1"}]),
            failure: None,
            created_at: 1,
            updated_at: 1,
            app_proofs: Vec::new(),
        };
        store.commit(&a, &[]).unwrap();
        // A stale vote count loses.
        assert!(
            matches!(store.apply(&[update(2, "ACTIVITY_STATUS_COMPLETED")]), Err(StoreError::Conflict(m)) if m == CONSENSUS_MOVED)
        );
        // Two completions at once: exactly one wins, and a failed one changes nothing.
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let s = store.clone();
                std::thread::spawn(move || s.apply(&[update(1, "ACTIVITY_STATUS_COMPLETED")]))
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
        let stored = store.activity("org", "a1").unwrap();
        assert_eq!((stored.status.as_str(), stored.result.clone()), ("ACTIVITY_STATUS_COMPLETED", json!({"r": 1})));
        assert_eq!(stored.votes.as_array().unwrap().len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
