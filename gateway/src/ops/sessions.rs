//! Sessions: `oauth_login`, `stamp_login`, `otp_login`, `create_read_write_session`, `otp_auth`,
//! and the credentials `email_auth` and `init_user_email_recovery` send by email. The enclave decides
//! whose session it is and certifies its key; the gateway finds what the enclave needs (the OAuth
//! identity's certificate, a sub-organization's parent certificate) and stores the session key
//! as an expiring credential of the user.

use serde::Deserialize;
use serde_json::{json, Value};

use super::params::required;
use crate::activity::registry::{Ctx, Outcome};
use crate::error::{ApiError, Code};
use crate::oidc_tokens;
use crate::stamps::stamp::SESSION_CREDENTIAL_TYPES;
use crate::stamps::Credential;
use crate::store::{ApiKey, StoreError, User, Write};
use coffer_proto::v1 as pb;

/// Asks the enclave for the session, then stores its key as a credential of the user (removing
/// the user's earlier session keys when `invalidate_existing`).
async fn open_session(
    ctx: &Ctx,
    request: pb::CreateSessionRequest,
    invalidate_existing: bool,
    key_name: Option<String>,
    public_key: Option<&str>,
) -> Result<(pb::CreateSessionResponse, User, String, Vec<Write>), ApiError> {
    // A key already in the organization cannot become a session key too (unless it is one of the
    // session keys this login removes): refused before the enclave certifies anything.
    if let Some(pk) = public_key {
        let pk = pk.trim();
        let pk = pk.strip_prefix("0x").unwrap_or(pk).to_ascii_lowercase();
        let org = ctx.org.id.clone();
        match ctx.state.db(move |s| s.api_key_by_public_key(&org, &pk)).await? {
            Err(StoreError::NotFound) => {}
            Err(e) => return Err(e.into()),
            Ok(existing) => {
                let replaced =
                    invalidate_existing && SESSION_CREDENTIAL_TYPES.contains(&existing.credential_type.as_str());
                if !replaced {
                    return Err(ApiError::invalid(
                        "publicKey is already a credential in this organization: use a new key",
                    ));
                }
            }
        }
    }
    // A verification token's login the gateway routed from the token's organization: the enclave
    // checks the route itself.
    let routed_organization_id = match &ctx.caller.credential {
        Credential::VerificationToken(t) if t.routed => ctx.org.id.clone(),
        _ => String::new(),
    };
    let request = pb::CreateSessionRequest {
        parent_certificate: super::lookup::parent_certificate(ctx).await?,
        routed_organization_id,
        ..request
    };
    let session = ctx.enclave().create_session(request).await?;
    // The enclave chose the user; it must be one of this organization.
    let user = super::lookup::load_user(&ctx.state, &ctx.org.id, &session.user_id).await?;
    let mut writes = Vec::new();
    // The user's earlier sessions go when the body says so, its expired ones anyway: as the
    // enclave's state has them.
    let (org, uid, now) = (ctx.org.id.clone(), user.id.clone(), ctx.now);
    let expired = move |k: &ApiKey| {
        k.expiration_seconds
            .is_some_and(|exp| now >= k.created_at.saturating_add((exp as i64).saturating_mul(1_000_000_000)))
    };
    let earlier: Vec<String> = ctx
        .state
        .db(move |s| s.api_keys_of_user(&org, &uid))
        .await??
        .into_iter()
        .filter(|k| {
            SESSION_CREDENTIAL_TYPES.contains(&k.credential_type.as_str()) && (invalidate_existing || expired(k))
        })
        .map(|k| k.id)
        .collect();
    if !earlier.is_empty() {
        writes.push(Write::DeleteApiKeys {
            organization_id: ctx.org.id.clone(),
            user_id: user.id.clone(),
            ids: earlier,
        });
    }
    let seconds = (session.expires_at_ms / 1000).saturating_sub((ctx.now / 1_000_000_000).max(0) as u64);
    // The session key's id in the enclave's authority state.
    let id = session.credential_id.clone();
    writes.push(Write::InsertApiKey(ApiKey {
        id: id.clone(),
        organization_id: ctx.org.id.clone(),
        user_id: user.id.clone(),
        name: key_name.unwrap_or_else(|| format!("Session key {}", session.expires_at_ms)),
        public_key: session.public_key.clone(),
        credential_type: session.credential_type.clone(),
        expiration_seconds: Some(seconds.max(1)),
        created_at: ctx.now,
        updated_at: ctx.now,
        certificate: session.certificate.clone(),
    }));
    Ok((session, user, id, writes))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OauthLoginIntent {
    oidc_token: String,
    public_key: String,
    /// Read by the enclave from the stamped body; declared so a malformed value is a 400 here.
    #[allow(dead_code)]
    expiration_seconds: Option<Value>,
    invalidate_existing: Option<bool>,
}

/// Which user of the organization has the OIDC token's identity: found here, proven to the
/// enclave by its certificate (which the enclave checks against the token it verifies itself).
async fn token_identity(ctx: &Ctx, token: &str) -> Result<crate::store::OauthProviderRecord, ApiError> {
    let claims = oidc_tokens::verify(oidc_tokens::own_keys(&ctx.state).await, token).await?;
    crate::stamps::oauth_identity(&ctx.state, &ctx.org.id, &claims).await?.ok_or_else(|| {
        ApiError::new(
            Code::NotFound,
            "OAUTH_PROVIDER_NOT_FOUND",
            "no user of this organization has an oauth provider matching the OIDC token (issuer, subject, audience)",
        )
    })
}

pub async fn oauth_login(ctx: Ctx, intent: OauthLoginIntent) -> Result<Outcome, ApiError> {
    required(&intent.oidc_token, "oidcToken")?;
    required(&intent.public_key, "publicKey")?;
    let provider = token_identity(&ctx, &intent.oidc_token).await?;
    let (session, _, _, writes) = open_session(
        &ctx,
        pb::CreateSessionRequest { provider_certificate: provider.certificate, ..Default::default() },
        intent.invalidate_existing.unwrap_or(false),
        None,
        Some(&intent.public_key),
    )
    .await?;
    Ok(Outcome { result: json!({ "session": session.session }), writes })
}

/// `oauthIntent`: the first OAuth login.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OauthIntent {
    oidc_token: String,
    target_public_key: String,
    api_key_name: Option<String>,
    /// Read by the enclave from the stamped body; declared so a malformed value is a 400 here.
    #[allow(dead_code)]
    expiration_seconds: Option<Value>,
    invalidate_existing: Option<bool>,
}

/// `oauth`: the user with the OIDC token's identity gets a new key, made by the enclave and
/// encrypted to `targetPublicKey` (which the token's nonce binds); its public half is stored.
pub async fn oauth(ctx: Ctx, intent: OauthIntent) -> Result<Outcome, ApiError> {
    required(&intent.oidc_token, "oidcToken")?;
    required(&intent.target_public_key, "targetPublicKey")?;
    let provider = token_identity(&ctx, &intent.oidc_token).await?;
    let name = intent.api_key_name.filter(|n| !n.trim().is_empty());
    if let Some(n) = &name {
        super::users::valid_name("apiKeyName", n)?;
    }
    let (session, user, api_key_id, writes) = open_session(
        &ctx,
        pb::CreateSessionRequest { provider_certificate: provider.certificate, ..Default::default() },
        intent.invalidate_existing.unwrap_or(false),
        name,
        None,
    )
    .await?;
    Ok(Outcome {
        result: json!({ "userId": user.id, "apiKeyId": api_key_id, "credentialBundle": session.credential_bundle }),
        writes,
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StampLoginIntent {
    public_key: String,
    #[allow(dead_code)]
    expiration_seconds: Option<Value>,
    invalidate_existing: Option<bool>,
}

pub async fn stamp_login(ctx: Ctx, intent: StampLoginIntent) -> Result<Outcome, ApiError> {
    let mut outcome = login_with_key(&ctx, &intent.public_key, intent.invalidate_existing).await?;
    // The stamping key has shown it signs for its holder here: anonymous PUBLIC_KEY lookups may
    // find this organization by it from now on.
    let stored_key = matches!(ctx.caller.credential, Credential::ApiKey(_) | Credential::Authenticator(_));
    if stored_key && !ctx.caller.via_parent {
        outcome.writes.push(proven_key(&ctx, &ctx.org.id, &ctx.caller.public_key));
    }
    Ok(outcome)
}

/// The record that `public_key` proved possession in `organization_id`
/// (`record_kinds::PROVEN_KEY`).
pub fn proven_key(ctx: &Ctx, organization_id: &str, public_key: &str) -> Write {
    let key = public_key.trim();
    let key = key.strip_prefix("0x").unwrap_or(key).to_ascii_lowercase();
    Write::PutRecord(crate::store::Record {
        organization_id: organization_id.to_string(),
        kind: crate::record_kinds::PROVEN_KEY.to_string(),
        id: key.clone(),
        name: key,
        data: json!({}),
        created_at: ctx.now,
        updated_at: ctx.now,
    })
}

/// A login whose body names the session key (`publicKey`): the enclave decides the user (from
/// the stamp, or the verification token); the answer is `{session}`.
async fn login_with_key(ctx: &Ctx, public_key: &str, invalidate_existing: Option<bool>) -> Result<Outcome, ApiError> {
    required(public_key, "publicKey")?;
    let (session, _, _, writes) = open_session(
        ctx,
        pb::CreateSessionRequest::default(),
        invalidate_existing.unwrap_or(false),
        None,
        Some(public_key),
    )
    .await?;
    Ok(Outcome { result: json!({ "session": session.session }), writes })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OtpLoginIntent {
    verification_token: String,
    public_key: String,
    /// Read by the enclave from the stamped body; declared so a malformed value is a 400 here.
    #[allow(dead_code)]
    client_signature: Option<Value>,
    #[allow(dead_code)]
    expiration_seconds: Option<Value>,
    invalidate_existing: Option<bool>,
}

/// `otp_login`: the enclave verifies the token, spends it, and picks the user with its email.
pub async fn otp_login(ctx: Ctx, intent: OtpLoginIntent) -> Result<Outcome, ApiError> {
    required(&intent.verification_token, "verificationToken")?;
    login_with_key(&ctx, &intent.public_key, intent.invalidate_existing).await
}

/// `emailAuthIntentV3` and `initUserEmailRecoveryIntentV2`: read by the enclave from the stamped
/// body, which finds the user by `email` and sends the credential itself.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmailCredentialIntent {
    email: String,
    target_public_key: String,
    api_key_name: Option<String>,
    #[allow(dead_code)]
    expiration_seconds: Option<Value>,
    invalidate_existing: Option<bool>,
}

/// A credential for the user with the body's email, which the enclave sends to that address only
/// (encrypted to `targetPublicKey`); the gateway stores its public half.
async fn email_credential(ctx: &Ctx, intent: EmailCredentialIntent) -> Result<(User, String, Vec<Write>), ApiError> {
    required(&intent.email, "email")?;
    required(&intent.target_public_key, "targetPublicKey")?;
    let name = intent.api_key_name.filter(|n| !n.trim().is_empty());
    if let Some(n) = &name {
        super::users::valid_name("apiKeyName", n)?;
    }
    let (session, user, api_key_id, mut writes) =
        open_session(ctx, pb::CreateSessionRequest::default(), intent.invalidate_existing.unwrap_or(false), name, None)
            .await?;
    writes.extend(super::email_events::writes(&ctx.org.id, &ctx.fingerprint, ctx.now, &session.email_events));
    Ok((user, api_key_id, writes))
}

pub async fn email_auth(ctx: Ctx, intent: EmailCredentialIntent) -> Result<Outcome, ApiError> {
    let (user, api_key_id, writes) = email_credential(&ctx, intent).await?;
    Ok(Outcome { result: json!({ "userId": user.id, "apiKeyId": api_key_id }), writes })
}

pub async fn init_user_email_recovery(ctx: Ctx, intent: EmailCredentialIntent) -> Result<Outcome, ApiError> {
    let (user, _, writes) = email_credential(&ctx, intent).await?;
    Ok(Outcome { result: json!({ "userId": user.id }), writes })
}

/// `otpAuthIntent`: read and checked by the enclave from the stamped body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OtpAuthIntent {
    otp_id: String,
    otp_code: String,
    target_public_key: String,
    api_key_name: Option<String>,
    #[allow(dead_code)]
    expiration_seconds: Option<Value>,
    invalidate_existing: Option<bool>,
}

/// `otp_auth`: the enclave checks the code of an `init_otp_auth` against the record kept here and
/// answers a credential of the user with the code's contact, encrypted to `targetPublicKey`.
pub async fn otp_auth(ctx: Ctx, intent: OtpAuthIntent) -> Result<Outcome, ApiError> {
    required(&intent.otp_id, "otpId")?;
    required(&intent.otp_code, "otpCode")?;
    required(&intent.target_public_key, "targetPublicKey")?;
    let sealed_otp = super::otp::sealed_record(&ctx, &intent.otp_id).await?;
    let name = intent
        .api_key_name
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| format!("OTP Auth - {}", ctx.now / 1_000_000));
    let request = pb::CreateSessionRequest { sealed_otp, ..Default::default() };
    let (session, user, api_key_id, mut writes) =
        open_session(&ctx, request, intent.invalidate_existing.unwrap_or(false), Some(name), None).await?;
    writes.push(super::otp::spent(&ctx, intent.otp_id));
    Ok(Outcome {
        result: json!({ "userId": user.id, "apiKeyId": api_key_id, "credentialBundle": session.credential_bundle }),
        writes,
    })
}

/// `create_read_only_session` (`{}`): a session JWT the enclave signs for the stamping user,
/// which queries accept as `X-Session` (and nothing else does); nothing is stored.
pub async fn create_read_only_session(ctx: Ctx, _intent: Value) -> Result<Outcome, ApiError> {
    let session = ctx.enclave().create_session(pb::CreateSessionRequest::default()).await?;
    if session.user_id != ctx.caller.user.id {
        return Err(ApiError::internal());
    }
    Ok(Outcome {
        result: json!({
            "organizationId": ctx.org.id,
            "organizationName": ctx.org.name,
            "userId": ctx.caller.user.id,
            "username": ctx.caller.user.name,
            "session": session.session,
            "sessionExpiry": (session.expires_at_ms / 1000).to_string(),
        }),
        writes: vec![],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateReadWriteSessionIntent {
    target_public_key: String,
    user_id: Option<String>,
    api_key_name: Option<String>,
    #[allow(dead_code)]
    expiration_seconds: Option<Value>,
    invalidate_existing: Option<bool>,
}

pub async fn create_read_write_session(ctx: Ctx, intent: CreateReadWriteSessionIntent) -> Result<Outcome, ApiError> {
    required(&intent.target_public_key, "targetPublicKey")?;
    if let Some(u) = intent.user_id.as_deref().filter(|u| !u.is_empty()) {
        super::lookup::load_user(&ctx.state, &ctx.org.id, u).await?;
    }
    let name = intent.api_key_name.filter(|n| !n.trim().is_empty());
    if let Some(n) = &name {
        super::users::valid_name("apiKeyName", n)?;
    }
    let (session, user, api_key_id, writes) = open_session(
        &ctx,
        pb::CreateSessionRequest::default(),
        intent.invalidate_existing.unwrap_or(false),
        name,
        None,
    )
    .await?;
    Ok(Outcome {
        result: json!({
            "organizationId": ctx.org.id,
            "organizationName": ctx.org.name,
            "userId": user.id,
            "username": user.name,
            "apiKeyId": api_key_id,
            "credentialBundle": session.credential_bundle,
        }),
        writes,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use p256::elliptic_curve::sec1::ToEncodedPoint;

    use crate::custody::in_process::{stamp_headers, Harness};

    #[tokio::test(flavor = "multi_thread")]
    async fn a_read_write_session_key_reaches_only_the_target_and_stamps_as_the_user() {
        let h = Harness::new().await;
        let target = p256::SecretKey::from_slice(&[0x22; 32]).unwrap();
        let target_hex = hex::encode(target.public_key().to_encoded_point(false).as_bytes());
        let intent = json!({ "targetPublicKey": target_hex, "apiKeyName": "session", "expirationSeconds": "900" });
        let result =
            h.run("create_read_write_session", "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2", intent).await.unwrap();
        assert_eq!(result["userId"], h.user_id);
        let bundle = result["credentialBundle"].as_str().unwrap();
        // Only the target key opens the bundle.
        assert!(coffer_crypto::session::open_credential_bundle(bundle, &[0x23; 32]).is_err());
        let secret = coffer_crypto::session::open_credential_bundle(bundle, &[0x22; 32]).unwrap();
        let session = p256::ecdsa::SigningKey::from_slice(&secret).unwrap();

        // The stored credential is the session key, certified by the enclave.
        let key_id = result["apiKeyId"].as_str().unwrap();
        let stored = h.state.store.api_key(&h.organization_id, key_id).unwrap();
        assert_eq!(stored.public_key, hex::encode(session.verifying_key().to_encoded_point(true).as_bytes()));
        assert_eq!(stored.credential_type, "CREDENTIAL_TYPE_READ_WRITE_SESSION_KEY_P256");
        assert!(!stored.certificate.is_empty());

        // It stamps as the user.
        let body = json!({ "organizationId": h.organization_id }).to_string();
        let headers = stamp_headers(&session, body.as_bytes());
        let whoami = crate::activity::pipeline::query(
            h.state.clone(),
            &crate::ops::REGISTRY,
            "whoami",
            &headers,
            body.as_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(whoami["userId"], h.user_id);
    }
}
