//! Loading what a request names in the caller's organization, with the 404 the API answers.

use std::sync::Arc;

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{PrivateKey, StoreError, User, Wallet};

/// Loads a user of the organization; 404 if it is not there.
pub async fn load_user(state: &Arc<AppState>, org: &str, id: &str) -> Result<User, ApiError> {
    let (org, id2) = (org.to_string(), id.to_string());
    state.db(move |s| s.user(&org, &id2)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("user not found: {id}")),
        other => other.into(),
    })
}

/// Loads a wallet of the caller's organization; 404 if it is not there.
pub async fn load_wallet(
    state: &std::sync::Arc<crate::state::AppState>,
    org: &str,
    id: &str,
) -> Result<Wallet, ApiError> {
    let (org, id2) = (org.to_string(), id.to_string());
    state.db(move |s| s.wallet(&org, &id2)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("wallet not found: {id}")),
        other => other.into(),
    })
}

pub async fn load_private_key(
    state: &std::sync::Arc<crate::state::AppState>,
    org: &str,
    id: &str,
) -> Result<PrivateKey, ApiError> {
    let (org, id2) = (org.to_string(), id.to_string());
    state.db(move |s| s.private_key(&org, &id2)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("private key not found: {id}")),
        other => other.into(),
    })
}

/// The sub-organization's parent certificate when a parent's credential asks; empty otherwise.
pub async fn parent_certificate(ctx: &crate::activity::registry::Ctx) -> Result<Vec<u8>, ApiError> {
    parent_certificate_of(&ctx.state, &ctx.org.id, ctx.caller.via_parent).await
}

/// [`parent_certificate`] of organization `org`, for a caller that is (`via_parent`) or is not a
/// parent's credential.
pub async fn parent_certificate_of(
    state: &std::sync::Arc<crate::state::AppState>,
    org: &str,
    via_parent: bool,
) -> Result<Vec<u8>, ApiError> {
    if !via_parent {
        return Ok(Vec::new());
    }
    let org = org.to_string();
    match state
        .db(move |s| s.record(&org, crate::record_kinds::PARENT_CERTIFICATE, crate::record_kinds::PARENT_CERTIFICATE))
        .await?
    {
        Ok(r) => Ok(hex::decode(r.data.get("certificate").and_then(serde_json::Value::as_str).unwrap_or_default())
            .unwrap_or_default()),
        // Created before parent certificates: the enclave refuses, with its reason.
        Err(StoreError::NotFound) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}
