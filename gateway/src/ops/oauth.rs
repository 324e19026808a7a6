//! OAuth providers (OIDC identities) of users: attach by verified token or by claims, delete,
//! read, and the `OauthProvider` JSON.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use coffer_org_rules::model::CredentialKind;

use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::oauth_provider_json;
use crate::error::{ApiError, Code};
use crate::oidc_tokens;
use crate::state::AppState;
use crate::store::{Nanos, OauthProviderRecord, Write};

fn already_exists() -> ApiError {
    ApiError::new(Code::InvalidArgument, "OAUTH_PROVIDER_ALREADY_EXISTS", "oauth provider already exists")
}

/// `OidcClaims`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OidcClaimsParams {
    #[serde(default)]
    iss: String,
    #[serde(default)]
    sub: String,
    #[serde(default)]
    aud: String,
}

/// `OauthProviderParamsV2`: a name and either an `oidcToken` (verified) or `oidcClaims`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OauthProviderParams {
    provider_name: String,
    oidc_token: Option<String>,
    oidc_claims: Option<OidcClaimsParams>,
}

/// Verifies each provider's token (or takes its claims) and makes the rows for `user_id`. An
/// (issuer, subject, audience) already attached in the organization is refused here and by the
/// table's unique constraint at commit.
pub async fn provider_rows(
    state: &Arc<AppState>,
    org: &str,
    user_id: &str,
    params: &[OauthProviderParams],
    fingerprint: &str,
    now: Nanos,
) -> Result<Vec<OauthProviderRecord>, ApiError> {
    let org_id = org.to_string();
    let mut taken: HashSet<(String, String, String)> = state
        .db(move |s| s.oauth_providers(&org_id, None))
        .await??
        .into_iter()
        .map(|p| (p.issuer, p.subject, p.audience))
        .collect();
    let mut rows = Vec::with_capacity(params.len());
    for p in params {
        required(&p.provider_name, "providerName")?;
        let (issuer, subject, audience) = match (&p.oidc_token, &p.oidc_claims) {
            (Some(token), None) if !token.trim().is_empty() => {
                let c = oidc_tokens::verify(oidc_tokens::own_keys(state).await, token).await?;
                (c.iss, c.sub, c.aud)
            }
            (None, Some(c)) => {
                required(&c.iss, "oidcClaims.iss")?;
                required(&c.sub, "oidcClaims.sub")?;
                required(&c.aud, "oidcClaims.aud")?;
                (c.iss.clone(), c.sub.clone(), c.aud.clone())
            }
            _ => return Err(ApiError::invalid("each oauth provider needs exactly one of oidcToken and oidcClaims")),
        };
        if !taken.insert((issuer.clone(), subject.clone(), audience.clone())) {
            return Err(already_exists());
        }
        rows.push(OauthProviderRecord {
            id: super::params::credential_id(fingerprint, CredentialKind::OauthIdentity, user_id, rows.len()),
            organization_id: org.to_string(),
            user_id: user_id.to_string(),
            name: p.provider_name.clone(),
            issuer,
            audience,
            subject,
            // A nanosecond apart, so lists keep the request's order.
            created_at: now + rows.len() as i64,
            updated_at: now + rows.len() as i64,
            // Issued by the enclave in the pipeline, before the commit.
            certificate: vec![],
        });
    }
    Ok(rows)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateOauthProvidersIntent {
    user_id: String,
    #[serde(default)]
    oauth_providers: Vec<OauthProviderParams>,
}

pub async fn create_oauth_providers(ctx: Ctx, intent: CreateOauthProvidersIntent) -> Result<Outcome, ApiError> {
    if intent.oauth_providers.is_empty() {
        return Err(ApiError::invalid("oauthProviders must not be empty"));
    }
    super::lookup::load_user(&ctx.state, &ctx.org.id, &intent.user_id).await?;
    let rows =
        provider_rows(&ctx.state, &ctx.org.id, &intent.user_id, &intent.oauth_providers, &ctx.fingerprint, ctx.now)
            .await?;
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    Ok(Outcome { result: json!({ "providerIds": ids }), writes: vec![Write::InsertOauthProviders(rows)] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOauthProvidersIntent {
    user_id: String,
    #[serde(default)]
    provider_ids: Vec<String>,
}

pub async fn delete_oauth_providers(ctx: Ctx, intent: DeleteOauthProvidersIntent) -> Result<Outcome, ApiError> {
    if intent.provider_ids.is_empty() {
        return Err(ApiError::invalid("providerIds must not be empty"));
    }
    super::lookup::load_user(&ctx.state, &ctx.org.id, &intent.user_id).await?;
    let ids = super::params::dedup(&intent.provider_ids);
    let (org, user) = (ctx.org.id.clone(), intent.user_id.clone());
    let owned: HashSet<String> =
        ctx.state.db(move |s| s.oauth_providers(&org, Some(&user))).await??.into_iter().map(|p| p.id).collect();
    if let Some(missing) = ids.iter().find(|id| !owned.contains(*id)) {
        return Err(ApiError::new(
            Code::NotFound,
            "OAUTH2_PROVIDER_NOT_FOUND",
            format!("oauth provider not found for user {}: {missing}", intent.user_id),
        ));
    }
    Ok(Outcome {
        result: json!({ "providerIds": ids }),
        writes: vec![Write::DeleteOauthProviders { organization_id: ctx.org.id.clone(), user_id: intent.user_id, ids }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetOauthProvidersRequest {
    user_id: Option<String>,
}

pub async fn get_oauth_providers(ctx: QueryCtx, req: GetOauthProvidersRequest) -> Result<Value, ApiError> {
    let user = req.user_id.filter(|u| !u.is_empty());
    if let Some(u) = &user {
        super::lookup::load_user(&ctx.state, &ctx.org.id, u).await?;
    }
    let org = ctx.org.id.clone();
    let list = ctx.state.db(move |s| s.oauth_providers(&org, user.as_deref())).await??;
    Ok(json!({ "oauthProviders": list.iter().map(oauth_provider_json).collect::<Vec<_>>() }))
}
