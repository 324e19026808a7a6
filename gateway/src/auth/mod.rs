//! Request authentication: API-key stamps (`X-Stamp`), resolved to a credential and a user.

pub mod stamp;

use std::sync::Arc;

use axum::http::HeaderMap;

use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{now_nanos, ApiKey, Organization, StoreError, User};

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: User,
    pub api_key: ApiKey,
    pub stamp: stamp::ApiStamp,
    /// The credential belongs to the parent of the target organization (may read, not act).
    pub via_parent: bool,
}

/// Reads and verifies the stamp over the raw body. Missing stamp: 401 `SIGNATURE_MISSING`.
pub fn verified_stamp(headers: &HeaderMap, body: &[u8]) -> Result<stamp::ApiStamp, ApiError> {
    let Some(value) = headers.get("x-stamp") else {
        if headers.contains_key("x-stamp-webauthn") {
            return Err(ApiError::unauthenticated(
                "UNAUTHENTICATED",
                "X-Stamp-Webauthn (passkey) stamps are not supported yet by this Coffer version",
            ));
        }
        return Err(ApiError::unauthenticated(
            "SIGNATURE_MISSING",
            "cannot authenticate public API activity request without a stamp (X-Stamp/X-Stamp-Webauthn header)",
        ));
    };
    let value =
        value.to_str().map_err(|_| ApiError::unauthenticated("SIGNATURE_INVALID", "malformed activity stamp"))?;
    let stamp = stamp::parse(value)?;
    stamp::verify(&stamp, body)?;
    Ok(stamp)
}

/// Resolves the stamp's public key in `org`, then in its parent; checks curve and expiry.
pub async fn resolve(state: &Arc<AppState>, org: &Organization, stamp: stamp::ApiStamp) -> Result<Caller, ApiError> {
    let org_id = org.id.clone();
    let parent = org.parent_id.clone();
    let pk = stamp.public_key.clone();
    let found = state
        .db(move |s| -> Result<Option<(ApiKey, bool)>, StoreError> {
            match s.api_key_by_public_key(&org_id, &pk) {
                Ok(k) => return Ok(Some((k, false))),
                Err(StoreError::NotFound) => {}
                Err(e) => return Err(e),
            }
            if let Some(parent) = parent {
                match s.api_key_by_public_key(&parent, &pk) {
                    Ok(k) => return Ok(Some((k, true))),
                    Err(StoreError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(None)
        })
        .await??;
    let Some((api_key, via_parent)) = found else {
        return Err(ApiError::unauthenticated(
            "PUBLIC_KEY_NOT_FOUND",
            format!(
                "could not find public key in organization or its parent organization organizationId={} publicKey={}",
                org.id, stamp.public_key
            ),
        ));
    };
    if api_key.credential_type != stamp.scheme.credential_type() {
        return Err(ApiError::unauthenticated(
            "SIGNATURE_INVALID",
            format!(
                "stamp scheme {} does not match the api key's type {}",
                stamp.scheme.wire_name(),
                api_key.credential_type
            ),
        ));
    }
    if let Some(exp) = api_key.expiration_seconds {
        let expires_at = api_key.created_at.saturating_add((exp as i64).saturating_mul(1_000_000_000));
        if now_nanos() >= expires_at {
            return Err(ApiError::unauthenticated("API_KEY_EXPIRED", "expired api key"));
        }
    }
    let (key_org, user_id) = (api_key.organization_id.clone(), api_key.user_id.clone());
    let user = state.db(move |s| s.user(&key_org, &user_id)).await?.map_err(|e| match e {
        StoreError::NotFound => {
            ApiError::unauthenticated("PUBLIC_KEY_NOT_FOUND", "the api key's user no longer exists")
        }
        other => other.into(),
    })?;
    Ok(Caller { user, api_key, stamp, via_parent })
}
