//! Passkeys (WebAuthn authenticators): register, delete, read, and the `Authenticator` JSON.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{json, Value};

use coffer_org_rules::model::CredentialKind;

use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::authenticator_json;
use crate::error::ApiError;
use crate::stamps::{self, webauthn};
use crate::store::{AuthenticatorRecord, Organization, StoreError};

const TRANSPORTS: &[&str] = &[
    "AUTHENTICATOR_TRANSPORT_BLE",
    "AUTHENTICATOR_TRANSPORT_INTERNAL",
    "AUTHENTICATOR_TRANSPORT_NFC",
    "AUTHENTICATOR_TRANSPORT_USB",
    "AUTHENTICATOR_TRANSPORT_HYBRID",
];

/// `Attestation`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttestationParams {
    credential_id: String,
    client_data_json: String,
    attestation_object: String,
    #[serde(default)]
    transports: Vec<String>,
}

/// `AuthenticatorParamsV2`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticatorParams {
    authenticator_name: String,
    challenge: String,
    attestation: AttestationParams,
}

/// Verifies each attestation and makes the rows for `user_id`. Credential ids must be new in
/// the organization (checked here for a clear error, and by the table's unique constraint at
/// commit). Origins are checked against `FEATURE_NAME_WEBAUTHN_ORIGINS` when it is set.
pub async fn authenticator_rows(
    state: &std::sync::Arc<crate::state::AppState>,
    org: &Organization,
    user_id: &str,
    params: &[AuthenticatorParams],
    fingerprint: &str,
    now: crate::store::Nanos,
) -> Result<Vec<AuthenticatorRecord>, ApiError> {
    let origins = stamps::webauthn_origins(state, org).await?;
    let mut seen = HashSet::new();
    let mut rows = Vec::with_capacity(params.len());
    for p in params {
        required(&p.authenticator_name, "authenticatorName")?;
        required(&p.challenge, "challenge")?;
        let a = &p.attestation;
        required(&a.credential_id, "attestation.credentialId")?;
        for t in &a.transports {
            if !TRANSPORTS.contains(&t.as_str()) {
                return Err(ApiError::invalid(format!("invalid authenticator transport: {t:?}")));
            }
        }
        let reg =
            webauthn::verify_registration(&a.credential_id, &a.client_data_json, &a.attestation_object, &p.challenge)?;
        if !webauthn::origin_allowed(origins.as_deref(), &reg.origin) {
            return Err(ApiError::invalid(format!(
                "invalid authenticator attestation: origin {:?} is not allowed for this organization ({})",
                reg.origin,
                webauthn::ORIGINS_FEATURE
            )));
        }
        let exists = |id: &str| {
            ApiError::invalid(format!("an authenticator with credential ID {id} already exists in the organization"))
        };
        if !seen.insert(reg.credential_id.clone()) {
            return Err(exists(&reg.credential_id));
        }
        let (org_id, cred) = (org.id.clone(), reg.credential_id.clone());
        match state.db(move |s| s.authenticator_by_credential_id(&org_id, &cred)).await? {
            Ok(_) => return Err(exists(&reg.credential_id)),
            Err(StoreError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        let mut transports: Vec<String> = Vec::new();
        for t in &a.transports {
            if !transports.contains(t) {
                transports.push(t.clone());
            }
        }
        rows.push(AuthenticatorRecord {
            id: super::params::credential_id(fingerprint, CredentialKind::Passkey, user_id, rows.len()),
            organization_id: org.id.clone(),
            user_id: user_id.to_string(),
            name: p.authenticator_name.clone(),
            credential_id: reg.credential_id,
            public_key: reg.public_key,
            attestation_type: reg.attestation_type,
            aaguid: reg.aaguid,
            transports,
            sign_count: reg.sign_count as i64,
            certificate: Vec::new(),
            // A nanosecond apart, so lists keep the request's order.
            created_at: now + rows.len() as i64,
            updated_at: now + rows.len() as i64,
        });
    }
    Ok(rows)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateAuthenticatorsIntent {
    #[serde(default)]
    authenticators: Vec<AuthenticatorParams>,
    user_id: String,
}

/// `recoverUserIntent`: one passkey for the user, stamped by the recovery credential.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoverUserIntent {
    authenticator: AuthenticatorParams,
    user_id: String,
}

pub async fn recover_user(ctx: Ctx, intent: RecoverUserIntent) -> Result<Outcome, ApiError> {
    super::lookup::load_user(&ctx.state, &ctx.org.id, &intent.user_id).await?;
    let rows = authenticator_rows(
        &ctx.state,
        &ctx.org,
        &intent.user_id,
        std::slice::from_ref(&intent.authenticator),
        &ctx.fingerprint,
        ctx.now,
    )
    .await?;
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    Ok(Outcome {
        result: json!({ "authenticatorId": ids }),
        writes: vec![crate::store::Write::InsertAuthenticators(rows)],
    })
}

pub async fn create_authenticators(ctx: Ctx, intent: CreateAuthenticatorsIntent) -> Result<Outcome, ApiError> {
    if intent.authenticators.is_empty() {
        return Err(ApiError::invalid("authenticators must not be empty"));
    }
    super::lookup::load_user(&ctx.state, &ctx.org.id, &intent.user_id).await?;
    let rows =
        authenticator_rows(&ctx.state, &ctx.org, &intent.user_id, &intent.authenticators, &ctx.fingerprint, ctx.now)
            .await?;
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    Ok(Outcome {
        result: json!({ "authenticatorIds": ids }),
        writes: vec![crate::store::Write::InsertAuthenticators(rows)],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteAuthenticatorsIntent {
    user_id: String,
    #[serde(default)]
    authenticator_ids: Vec<String>,
}

pub async fn delete_authenticators(ctx: Ctx, intent: DeleteAuthenticatorsIntent) -> Result<Outcome, ApiError> {
    if intent.authenticator_ids.is_empty() {
        return Err(ApiError::invalid("authenticatorIds must not be empty"));
    }
    super::lookup::load_user(&ctx.state, &ctx.org.id, &intent.user_id).await?;
    let ids = super::params::dedup(&intent.authenticator_ids);
    let (org, user) = (ctx.org.id.clone(), intent.user_id.clone());
    let owned: HashSet<String> =
        ctx.state.db(move |s| s.authenticators_of_user(&org, &user)).await??.into_iter().map(|a| a.id).collect();
    if let Some(missing) = ids.iter().find(|id| !owned.contains(*id)) {
        return Err(ApiError::not_found(format!("authenticator not found for user {}: {missing}", intent.user_id)));
    }
    Ok(Outcome {
        result: json!({ "authenticatorIds": ids }),
        writes: vec![crate::store::Write::DeleteAuthenticators {
            organization_id: ctx.org.id.clone(),
            user_id: intent.user_id,
            ids,
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetAuthenticatorRequest {
    authenticator_id: String,
}

pub async fn get_authenticator(ctx: QueryCtx, req: GetAuthenticatorRequest) -> Result<Value, ApiError> {
    let (org, id) = (ctx.org.id.clone(), req.authenticator_id.clone());
    let a = ctx.state.db(move |s| s.authenticator(&org, &id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("authenticator not found: {}", req.authenticator_id)),
        other => other.into(),
    })?;
    Ok(json!({ "authenticator": authenticator_json(&a) }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetAuthenticatorsRequest {
    user_id: String,
}

pub async fn get_authenticators(ctx: QueryCtx, req: GetAuthenticatorsRequest) -> Result<Value, ApiError> {
    super::lookup::load_user(&ctx.state, &ctx.org.id, &req.user_id).await?;
    let (org, user) = (ctx.org.id.clone(), req.user_id.clone());
    let list = ctx.state.db(move |s| s.authenticators_of_user(&org, &user)).await??;
    Ok(json!({ "authenticators": list.iter().map(authenticator_json).collect::<Vec<_>>() }))
}
