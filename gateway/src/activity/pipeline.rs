//! The one pipeline every submission and query runs through: stamp, envelope, dedupe, caller,
//! decision, handler, one transaction, answer.

use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::{json, Value};

use super::envelope::{self, Envelope};
use super::registry::{Ctx, QueryCtx};
use super::render;
use crate::auth::{self, Caller};
use crate::error::ApiError;
use crate::ops;
use crate::state::AppState;
use crate::store::{now_nanos, ActivityRecord, Committed, Organization, StoreError};

pub const STATUS_COMPLETED: &str = "ACTIVITY_STATUS_COMPLETED";
pub const STATUS_CONSENSUS_NEEDED: &str = "ACTIVITY_STATUS_CONSENSUS_NEEDED";

/// What the root-quorum rule decides for a root-quorum-only activity (until the policy engine
/// decides them): the submitter's own vote runs it when the threshold is 1; above 1 it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootQuorum {
    Run,
    ConsensusNeeded,
}

/// Only root users may submit root-quorum-only activities (others: 403).
pub fn root_quorum(org: &Organization, user_id: &str) -> Result<RootQuorum, ApiError> {
    if !org.root_user_ids.iter().any(|u| u == user_id) {
        return Err(ApiError::forbidden("request not authorized: only root quorum users may submit this activity"));
    }
    Ok(if org.root_quorum_threshold > 1 { RootQuorum::ConsensusNeeded } else { RootQuorum::Run })
}

async fn organization(state: &Arc<AppState>, id: String) -> Result<Organization, ApiError> {
    state.db(move |s| s.organization(&id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::new(
            crate::error::Code::NotFound,
            "ORGANIZATION_NOT_FOUND",
            "no organization found with the given ID",
        ),
        other => other.into(),
    })
}

/// The submitter's stamp, recorded as the first approval vote. The vote's user carries the
/// credential that stamped (an API key, or a passkey with scheme `SIGNATURE_SCHEME_TK_WEBAUTHN`).
fn submitter_vote(caller: &Caller, activity_id: &str, body: &[u8], now: i64) -> Value {
    let api_keys = caller.credential.api_key().cloned().into_iter().collect::<Vec<_>>();
    let mut user = ops::users::user_json(&caller.user, &api_keys);
    if let Some(a) = caller.credential.authenticator() {
        user["authenticators"] = json!([ops::authenticators::authenticator_json(a)]);
    }
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "userId": caller.user.id,
        "user": user,
        "activityId": activity_id,
        "selection": "VOTE_SELECTION_APPROVED",
        "message": String::from_utf8_lossy(body),
        "publicKey": caller.public_key,
        "signature": caller.signature,
        "scheme": caller.scheme,
        "createdAt": render::timestamp(now),
    })
}

/// `POST /public/v1/submit/<path>`.
pub async fn submit(state: Arc<AppState>, path: &str, headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let op =
        ops::activity(path).ok_or_else(|| ApiError::not_found(format!("unknown activity endpoint: submit/{path}")))?;
    let stamp = auth::verified_stamp(headers, body)?;
    let now = now_nanos();
    let env = Envelope::decode(envelope::parse_body(body)?, now / 1_000_000)?;
    if env.activity_type != op.activity_type {
        return Err(ApiError::invalid(format!(
            "invalid activity type {:?} for submit/{path}: expected {}",
            env.activity_type, op.activity_type
        )));
    }
    let org = organization(&state, env.organization_id.clone()).await?;
    let caller = auth::resolve(&state, &org, stamp).await?;

    // Identical bytes are the same activity (the Rust client polls by re-posting them).
    let fingerprint = envelope::fingerprint(body);
    let fp = fingerprint.clone();
    match state.db(move |s| s.activity_by_fingerprint(&fp)).await? {
        Ok(existing) if existing.organization_id == org.id => {
            return Ok(json!({ "activity": render::activity(&existing, false) }))
        }
        Ok(_) => return Err(ApiError::invalid("activity fingerprint belongs to another organization")),
        Err(StoreError::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    if caller.via_parent {
        return Err(ApiError::forbidden(
            "request not authorized: a parent organization's credentials may read a sub-organization but not act in it",
        ));
    }

    let activity_id = uuid::Uuid::new_v4().to_string();
    let vote = submitter_vote(&caller, &activity_id, body, now);
    if op.root_quorum && root_quorum(&org, &caller.user.id)? == RootQuorum::ConsensusNeeded {
        // Recorded with the submitter's vote and no effects; it runs once the quorum approves.
        let record = ActivityRecord {
            id: activity_id,
            organization_id: org.id.clone(),
            activity_type: op.activity_type.to_string(),
            status: STATUS_CONSENSUS_NEEDED.to_string(),
            fingerprint,
            intent: json!({ op.intent_key: env.parameters }),
            result: json!({}),
            votes: json!([vote]),
            failure: None,
            created_at: now,
            updated_at: now,
        };
        let (Committed::New(activity) | Committed::Existing(activity)) = state.commit(record, vec![]).await?;
        return Ok(json!({ "activity": render::activity(&activity, false) }));
    }
    let ctx = Ctx { state: state.clone(), org: org.clone(), caller, activity_id: activity_id.clone(), now };
    let outcome = (op.handler)(ctx, env.parameters.clone()).await?;

    let record = ActivityRecord {
        id: activity_id,
        organization_id: org.id.clone(),
        activity_type: op.activity_type.to_string(),
        status: STATUS_COMPLETED.to_string(),
        fingerprint,
        intent: json!({ op.intent_key: env.parameters }),
        result: json!({ op.result_key: outcome.result }),
        votes: json!([vote]),
        failure: None,
        created_at: now,
        updated_at: now_nanos(),
    };
    let committed = state.commit(record, outcome.writes).await?;
    let activity = match committed {
        Committed::New(a) | Committed::Existing(a) => a,
    };
    Ok(json!({ "activity": render::activity(&activity, false) }))
}

/// `POST /public/v1/query/<path>`: authenticate, check read access, answer.
pub async fn query(state: Arc<AppState>, path: &str, headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let q = ops::query(path).ok_or_else(|| ApiError::not_found(format!("unknown query endpoint: query/{path}")))?;
    let stamp = auth::verified_stamp(headers, body)?;
    let mut request = envelope::parse_body(body)?;
    let org = organization(&state, envelope::organization_id(&request)?).await?;
    let caller = auth::resolve(&state, &org, stamp).await?;
    request.remove("organizationId");
    let params = envelope::strip_nulls(Value::Object(request));
    (q.handler)(QueryCtx { state, org, caller }, params).await
}
