//! The open invitations the gateway's records hold, read by id (the acceptance's caller and the
//! invitation activities check them before the enclave decides).

use std::sync::Arc;

use coffer_org_rules::model::Invitation;

use crate::error::ApiError;
use crate::record_kinds::INVITATION;
use crate::state::AppState;
use crate::store::StoreError;

/// The open invitation `id` of `org` (an accepted or revoked one is gone).
pub async fn open_invitation(state: &Arc<AppState>, org: &str, id: &str) -> Result<Invitation, ApiError> {
    let (o, i) = (org.to_string(), id.to_string());
    let r = state.db(move |s| s.record(&o, INVITATION, &i)).await?.map_err(|e| match e {
        StoreError::NotFound => {
            ApiError::not_found(format!("no open invitation {id:?} (accepted, revoked or never made)"))
        }
        other => other.into(),
    })?;
    serde_json::from_value(r.data).map_err(|_| ApiError::internal())
}
