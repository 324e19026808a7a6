//! `create_session_profile`, `query/get_session_profile` and `query/get_session_profiles`: the
//! profiles the enclave's state holds and its logins issue sessions by.

use coffer_org_rules::model::SessionProfile;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::record_kinds::SESSION_PROFILE;
use crate::store::{Page, Record, StoreError, Write};

/// `create_session_profile` (`coffer_org_rules::transition::session_profile`).
pub async fn create_session_profile(ctx: Ctx, params: Value) -> Result<Outcome, ApiError> {
    let profile = coffer_org_rules::transition::session_profile(&params).map_err(ApiError::invalid)?;
    let (org, max) = (ctx.org.id.clone(), coffer_org_rules::transition::MAX_SESSION_PROFILES);
    // The count the store keeps with every write of them (one row read, not every profile).
    let (count, _) = ctx.state.db(move |s| s.records_version(&org, SESSION_PROFILE)).await??;
    if count >= max as i64 {
        return Err(ApiError::invalid(format!("an organization has at most {max} session profiles")));
    }
    let id = ctx.derived_id(coffer_org_rules::transition::SESSION_PROFILE_ID, 0);
    let record = Record {
        organization_id: ctx.org.id.clone(),
        kind: SESSION_PROFILE.into(),
        id: id.clone(),
        name: id.clone(),
        data: serde_json::to_value(&profile).map_err(|_| ApiError::internal())?,
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    Ok(Outcome { result: json!({ "sessionProfileId": id }), writes: vec![Write::PutRecord(record)] })
}

/// A profile as clients read it (`v1SessionProfile`).
fn profile_json(r: &Record) -> Result<Value, ApiError> {
    let p: SessionProfile = serde_json::from_value(r.data.clone()).map_err(|_| ApiError::internal())?;
    let mut v = json!({
        "sessionProfileId": r.id,
        "sessionProfileName": p.name,
        "scope": p.scope,
        "createdAt": timestamp(r.created_at),
        "updatedAt": timestamp(r.updated_at),
    });
    if let Some(s) = p.expiration_seconds {
        v["expirationSeconds"] = json!(s.to_string());
    }
    if !p.notes.is_empty() {
        v["notes"] = json!(p.notes);
    }
    Ok(v)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetSessionProfileRequest {
    session_profile_id: String,
}

pub async fn get_session_profile(ctx: QueryCtx, req: GetSessionProfileRequest) -> Result<Value, ApiError> {
    let (org, id) = (ctx.org.id.clone(), req.session_profile_id.clone());
    let r = ctx.state.db(move |s| s.record(&org, SESSION_PROFILE, &id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("session profile not found: {}", req.session_profile_id)),
        other => other.into(),
    })?;
    Ok(json!({ "sessionProfile": profile_json(&r)? }))
}

pub async fn get_session_profiles(ctx: QueryCtx, _req: Value) -> Result<Value, ApiError> {
    let org = ctx.org.id.clone();
    let records = ctx.state.db(move |s| s.records_page(&org, SESSION_PROFILE, &Page::ALL)).await??;
    let profiles = records.iter().map(profile_json).collect::<Result<Vec<_>, _>>()?;
    Ok(json!({ "sessionProfiles": profiles }))
}
