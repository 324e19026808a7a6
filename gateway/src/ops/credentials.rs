//! Passkeys and OAuth providers given inline to `create_users`, and their JSON on a user.

use serde_json::Value;

use super::authenticators::{authenticator_rows, AuthenticatorParams};
use super::oauth::{provider_rows, OauthProviderParams};
use crate::activity::registry::{decode, Ctx};
use crate::activity::render::{authenticator_json, oauth_provider_json};
use crate::error::ApiError;
use crate::store::{Store, Write};

/// The writes registering a new user's inline `authenticators` and `oauthProviders` (raw
/// `AuthenticatorParamsV2` / `OauthProviderParamsV2` JSON), committed after the user's insert:
/// attestations are verified and OIDC tokens checked against their issuer exactly as
/// `create_authenticators` / `create_oauth_providers` do. Credential ids and (issuer, subject,
/// audience) already in the organization are refused here; duplicates between users of one
/// intent are refused by the tables' unique constraints at commit.
pub async fn inline_credentials(
    ctx: &Ctx,
    user_id: &str,
    authenticators: &[Value],
    oauth_providers: &[Value],
) -> Result<Vec<Write>, ApiError> {
    let mut writes = Vec::new();
    if !authenticators.is_empty() {
        let params: Vec<AuthenticatorParams> = decode(Value::Array(authenticators.to_vec()))?;
        let rows = authenticator_rows(&ctx.state, &ctx.org, user_id, &params, &ctx.fingerprint, ctx.now).await?;
        writes.push(Write::InsertAuthenticators(rows));
    }
    if !oauth_providers.is_empty() {
        let params: Vec<OauthProviderParams> = decode(Value::Array(oauth_providers.to_vec()))?;
        let rows = provider_rows(&ctx.state, &ctx.org.id, user_id, &params, &ctx.fingerprint, ctx.now).await?;
        writes.push(Write::InsertOauthProviders(rows));
    }
    Ok(writes)
}

/// The swagger `Authenticator` objects of a user (empty if the store cannot be read).
pub fn authenticators_json(store: &dyn Store, org: &str, user_id: &str) -> Vec<Value> {
    match store.authenticators_of_user(org, user_id) {
        Ok(list) => list.iter().map(authenticator_json).collect(),
        // A no-wait attempt that gave up: it is rerun, and this answer dropped.
        Err(crate::store::StoreError::WouldWait) => Vec::new(),
        Err(e) => {
            tracing::error!(error = %e, "reading a user's authenticators");
            Vec::new()
        }
    }
}

/// The swagger `OauthProvider` objects of a user (empty if the store cannot be read).
pub fn oauth_providers_json(store: &dyn Store, org: &str, user_id: &str) -> Vec<Value> {
    match store.oauth_providers(org, Some(user_id)) {
        Ok(list) => list.iter().map(oauth_provider_json).collect(),
        // A no-wait attempt that gave up: it is rerun, and this answer dropped.
        Err(crate::store::StoreError::WouldWait) => Vec::new(),
        Err(e) => {
            tracing::error!(error = %e, "reading a user's oauth providers");
            Vec::new()
        }
    }
}
