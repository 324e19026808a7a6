//! OAuth 2.0 clients of an organization (X, Discord): create, update, delete and read them, and
//! `oauth2_authenticate`, whose code exchange runs in the enclave. Records of kind
//! `oauth2_credential`; the client secret is stored only as the envelope the enclave opens, with
//! the enclave's certificate binding it to this organization and credential.

use serde::Deserialize;
use serde_json::{json, Value};

use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::{ApiError, Code};
use crate::record_kinds::OAUTH2_CREDENTIAL;
use crate::store::{Record, StoreError, Write};
use coffer_proto::v1 as pb;

fn check_provider(provider: &str) -> Result<(), ApiError> {
    if coffer_auth::oidc::OAUTH2_PROVIDERS.contains(&provider) {
        return Ok(());
    }
    Err(ApiError::invalid(format!("invalid provider: {provider:?} (OAUTH2_PROVIDER_X or OAUTH2_PROVIDER_DISCORD)")))
}

fn text<'a>(r: &'a Record, k: &str) -> &'a str {
    r.data.get(k).and_then(Value::as_str).unwrap_or_default()
}

/// The swagger `v1Oauth2Credential`.
pub fn credential_json(r: &Record) -> Value {
    json!({
        "oauth2CredentialId": r.id,
        "organizationId": r.organization_id,
        "provider": text(r, "provider"),
        "clientId": text(r, "clientId"),
        "encryptedClientSecret": text(r, "encryptedClientSecret"),
        "createdAt": timestamp(r.created_at),
        "updatedAt": timestamp(r.updated_at),
    })
}

/// The credential as the enclave certified it.
pub fn certified(r: &Record) -> pb::Oauth2Credential {
    pb::Oauth2Credential {
        organization_id: r.organization_id.clone(),
        credential_id: r.id.clone(),
        provider: text(r, "provider").to_string(),
        client_id: text(r, "clientId").to_string(),
        encrypted_client_secret: text(r, "encryptedClientSecret").to_string(),
        mac: hex::decode(text(r, "certificate")).unwrap_or_default(),
    }
}

fn record_of(c: pb::Oauth2Credential, created_at: i64, updated_at: i64) -> Record {
    Record {
        organization_id: c.organization_id,
        kind: OAUTH2_CREDENTIAL.into(),
        id: c.credential_id,
        // One credential per provider and client id in an organization.
        name: format!("{}/{}", c.provider, c.client_id),
        data: json!({
            "provider": c.provider,
            "clientId": c.client_id,
            "encryptedClientSecret": c.encrypted_client_secret,
            "certificate": hex::encode(&c.mac),
        }),
        created_at,
        updated_at,
    }
}

/// The organization's credential `id`, 404 when it has none.
pub async fn load(state: &std::sync::Arc<crate::state::AppState>, org: &str, id: &str) -> Result<Record, ApiError> {
    let (org, id) = (org.to_string(), id.to_string());
    state.db(move |s| s.record(&org, OAUTH2_CREDENTIAL, &id)).await?.map_err(|e| match e {
        StoreError::NotFound => {
            ApiError::new(Code::NotFound, "OAUTH2_CREDENTIAL_NOT_FOUND", "oauth2 credential not found")
        }
        other => other.into(),
    })
}

async fn ensure_unique(ctx: &Ctx, provider: &str, client_id: &str, except: Option<&str>) -> Result<(), ApiError> {
    let org = ctx.org.id.clone();
    let all = ctx.state.db(move |s| s.records(&org, OAUTH2_CREDENTIAL)).await??;
    let taken = all
        .iter()
        .any(|r| Some(r.id.as_str()) != except && text(r, "provider") == provider && text(r, "clientId") == client_id);
    if taken {
        return Err(ApiError::invalid(format!(
            "an oauth2 credential for {provider} with client id {client_id:?} already exists"
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateOauth2CredentialIntent {
    provider: String,
    client_id: String,
    encrypted_client_secret: String,
}

pub async fn create_oauth2_credential(ctx: Ctx, intent: CreateOauth2CredentialIntent) -> Result<Outcome, ApiError> {
    check_provider(&intent.provider)?;
    required(&intent.client_id, "clientId")?;
    required(&intent.encrypted_client_secret, "encryptedClientSecret")?;
    ensure_unique(&ctx, &intent.provider, &intent.client_id, None).await?;
    let id = ctx.derived_id(coffer_org_rules::transition::OAUTH2_CREDENTIAL_ID, 0);
    let request = pb::CertifyOauth2CredentialRequest { credential_id: id.clone(), current: None, ..Default::default() };
    let credential = ctx.enclave().certify_oauth2_credential(request).await?;
    Ok(Outcome {
        result: json!({ "oauth2CredentialId": id }),
        writes: vec![Write::PutRecord(record_of(credential, ctx.now, ctx.now))],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateOauth2CredentialIntent {
    oauth2_credential_id: String,
    #[serde(default)]
    provider: String,
    #[serde(default)]
    client_id: String,
    /// Read by the enclave from the stamped body (empty keeps the stored secret).
    #[allow(dead_code)]
    #[serde(default)]
    encrypted_client_secret: String,
}

pub async fn update_oauth2_credential(ctx: Ctx, intent: UpdateOauth2CredentialIntent) -> Result<Outcome, ApiError> {
    required(&intent.oauth2_credential_id, "oauth2CredentialId")?;
    let current = load(&ctx.state, &ctx.org.id, &intent.oauth2_credential_id).await?;
    let provider = if intent.provider.is_empty() { text(&current, "provider").to_string() } else { intent.provider };
    check_provider(&provider)?;
    let client_id = if intent.client_id.is_empty() { text(&current, "clientId").to_string() } else { intent.client_id };
    ensure_unique(&ctx, &provider, &client_id, Some(&current.id)).await?;
    let request = pb::CertifyOauth2CredentialRequest {
        credential_id: current.id.clone(),
        current: Some(certified(&current)),
        ..Default::default()
    };
    let credential = ctx.enclave().certify_oauth2_credential(request).await?;
    Ok(Outcome {
        result: json!({ "oauth2CredentialId": current.id }),
        writes: vec![Write::PutRecord(record_of(credential, current.created_at, ctx.now))],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOauth2CredentialIntent {
    oauth2_credential_id: String,
}

pub async fn delete_oauth2_credential(ctx: Ctx, intent: DeleteOauth2CredentialIntent) -> Result<Outcome, ApiError> {
    required(&intent.oauth2_credential_id, "oauth2CredentialId")?;
    load(&ctx.state, &ctx.org.id, &intent.oauth2_credential_id).await?;
    Ok(Outcome {
        result: json!({ "oauth2CredentialId": intent.oauth2_credential_id }),
        writes: vec![Write::DeleteRecords {
            organization_id: ctx.org.id.clone(),
            kind: OAUTH2_CREDENTIAL.into(),
            ids: vec![intent.oauth2_credential_id],
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetOauth2CredentialRequest {
    oauth2_credential_id: String,
}

pub async fn get_oauth2_credential(ctx: QueryCtx, req: GetOauth2CredentialRequest) -> Result<Value, ApiError> {
    required(&req.oauth2_credential_id, "oauth2CredentialId")?;
    let r = load(&ctx.state, &ctx.org.id, &req.oauth2_credential_id).await?;
    Ok(json!({ "oauth2Credential": credential_json(&r) }))
}

pub async fn list_oauth2_credentials(ctx: QueryCtx, _req: Value) -> Result<Value, ApiError> {
    let org = ctx.org.id.clone();
    let all = ctx.state.db(move |s| s.records(&org, OAUTH2_CREDENTIAL)).await??;
    Ok(json!({ "oauth2Credentials": all.iter().map(credential_json).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Oauth2AuthenticateIntent {
    oauth2_credential_id: String,
    auth_code: String,
    redirect_uri: String,
    code_verifier: String,
    nonce: String,
    /// Read by the enclave from the stamped body; declared so a malformed value is a 400 here.
    #[allow(dead_code)]
    bearer_token_target_public_key: Option<String>,
}

pub async fn oauth2_authenticate(ctx: Ctx, intent: Oauth2AuthenticateIntent) -> Result<Outcome, ApiError> {
    for (v, k) in [
        (&intent.oauth2_credential_id, "oauth2CredentialId"),
        (&intent.auth_code, "authCode"),
        (&intent.redirect_uri, "redirectUri"),
        (&intent.code_verifier, "codeVerifier"),
        (&intent.nonce, "nonce"),
    ] {
        required(v, k)?;
    }
    let credential = load(&ctx.state, &ctx.org.id, &intent.oauth2_credential_id).await?;
    let request = pb::Oauth2AuthenticateRequest { credential: Some(certified(&credential)), ..Default::default() };
    let token = ctx.enclave().oauth2_authenticate(request).await?.oidc_token;
    Ok(Outcome { result: json!({ "oidcToken": token }), writes: vec![] })
}
