//! The auth proxy's configuration (Coffer extensions, README "Coffer extensions"):
//! `enable_auth_proxy` (its own user and key, the key made and sealed in the enclave, and a
//! policy that lets that user submit login activities only), `disable_auth_proxy`,
//! `update_auth_proxy_config` and `query/coffer_get_auth_proxy_config`. One record of kind
//! `auth_proxy` per organization; its id is the config id browsers send.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::record_kinds::{AUTH_PROXY, FEATURE};
use crate::store::{ApiKey, Record, User, Write};
use coffer_proto::v1 as pb;

pub const FEATURE_AUTH_PROXY: &str = "FEATURE_NAME_AUTH_PROXY";
/// Values of `allowedAuthMethods`.
pub const AUTH_METHODS: &[&str] = &["passkey", "wallet", "email", "sms"];
/// Name of the policy that lets the proxy user submit login activities.
pub const PROXY_POLICY_NAME: &str = coffer_org_rules::transition::AUTH_PROXY_POLICY_NAME;

/// The organization's auth proxy record, if it ever enabled one.
pub async fn config_of(state: &std::sync::Arc<crate::state::AppState>, org: &str) -> Result<Option<Record>, ApiError> {
    let org = org.to_string();
    Ok(state.db(move |s| s.records(&org, AUTH_PROXY)).await??.into_iter().next())
}

fn feature_record(org: &str, now: i64) -> Record {
    Record {
        organization_id: org.to_string(),
        kind: FEATURE.into(),
        id: FEATURE_AUTH_PROXY.into(),
        name: FEATURE_AUTH_PROXY.into(),
        data: json!({ "value": "" }),
        created_at: now,
        updated_at: now,
    }
}

pub async fn enable_auth_proxy(ctx: Ctx, _intent: Value) -> Result<Outcome, ApiError> {
    if let Some(mut r) = config_of(&ctx.state, &ctx.org.id).await? {
        if r.data["enabled"].as_bool() == Some(true) {
            return Err(ApiError::invalid("the auth proxy is already enabled"));
        }
        r.data["enabled"] = json!(true);
        r.updated_at = ctx.now;
        let user_id = r.data["userId"].clone();
        return Ok(Outcome {
            result: json!({ "userId": user_id }),
            writes: vec![Write::PutRecord(r), Write::PutRecord(feature_record(&ctx.org.id, ctx.now))],
        });
    }
    let request = pb::EnableAuthProxyRequest::default();
    let key = ctx.enclave().enable_auth_proxy(request).await?;
    let org = ctx.org.id.clone();
    let policy = super::policies::system_policy(
        &ctx,
        PROXY_POLICY_NAME,
        &coffer_org_rules::transition::auth_proxy_policy_consensus(&key.user_id),
        coffer_org_rules::transition::AUTH_PROXY_POLICY_CONDITION,
        "Lets the auth proxy's user exchange OAuth 2.0 codes, send and verify one-time codes, log users in and \
         sign them up (a sub-organization each); made by enable_auth_proxy.",
    )?;
    let config = Record {
        organization_id: org.clone(),
        kind: AUTH_PROXY.into(),
        id: uuid::Uuid::new_v4().to_string(),
        // One per organization.
        name: AUTH_PROXY.into(),
        data: json!({
            "enabled": true,
            "userId": key.user_id,
            "publicKey": key.public_key,
            "sealedKey": hex::encode(&key.sealed_key),
            "config": {},
        }),
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    let writes = vec![
        Write::InsertUser(User {
            id: key.user_id.clone(),
            organization_id: org.clone(),
            name: "Auth Proxy".into(),
            email: None,
            phone_number: None,
            contacts_verified: false,
            created_at: ctx.now,
            updated_at: ctx.now,
        }),
        Write::InsertApiKey(ApiKey {
            // The id the enclave gives the key it issued, in its state.
            id: ctx.derived_id(coffer_org_rules::transition::ISSUED_CREDENTIAL_ID, 0),
            organization_id: org.clone(),
            user_id: key.user_id.clone(),
            name: "Auth proxy key".into(),
            public_key: key.public_key.clone(),
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            expiration_seconds: None,
            created_at: ctx.now,
            updated_at: ctx.now,
            certificate: key.certificate,
        }),
        Write::PutRecord(policy),
        Write::PutRecord(config),
        Write::PutRecord(feature_record(&org, ctx.now)),
    ];
    Ok(Outcome { result: json!({ "userId": key.user_id }), writes })
}

pub async fn disable_auth_proxy(ctx: Ctx, _intent: Value) -> Result<Outcome, ApiError> {
    let mut r = match config_of(&ctx.state, &ctx.org.id).await? {
        Some(r) if r.data["enabled"].as_bool() == Some(true) => r,
        _ => return Err(ApiError::invalid("the auth proxy is not enabled")),
    };
    r.data["enabled"] = json!(false);
    r.updated_at = ctx.now;
    let org = ctx.org.id.clone();
    let feature_set = ctx.state.db(move |s| s.record(&org, FEATURE, FEATURE_AUTH_PROXY)).await?.is_ok();
    let mut writes = vec![Write::PutRecord(r)];
    if feature_set {
        writes.push(Write::DeleteRecords {
            organization_id: ctx.org.id.clone(),
            kind: FEATURE.into(),
            ids: vec![FEATURE_AUTH_PROXY.into()],
        });
    }
    Ok(Outcome { result: json!({}), writes })
}

/// `WalletKitSettingsParams`.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct WalletKitSettings {
    #[serde(default)]
    enabled_social_providers: Vec<String>,
    #[serde(default)]
    oauth_client_ids: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    oauth_redirect_url: String,
}

/// The SDK's `updateAuthProxyConfigIntent`; absent fields keep their value. Email and SMS
/// settings are kept and returned, not used (OTP login needs message delivery: not yet).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateAuthProxyConfigIntent {
    allowed_origins: Option<Vec<String>>,
    allowed_auth_methods: Option<Vec<String>>,
    wallet_kit_settings: Option<WalletKitSettings>,
    session_expiration_seconds: Option<i64>,
    otp_alphanumeric: Option<bool>,
    otp_length: Option<i64>,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

/// An origin as browsers send it: `scheme://host[:port]`, nothing more.
fn check_origin(o: &str) -> Result<(), ApiError> {
    let bad =
        || ApiError::invalid(format!("invalid allowedOrigins entry {o:?}: an origin such as https://app.example"));
    let u = url::Url::parse(o).map_err(|_| bad())?;
    let origin = u.origin().ascii_serialization();
    if !matches!(u.scheme(), "https" | "http") || origin != o.trim_end_matches('/') || o == "*" {
        return Err(bad());
    }
    Ok(())
}

pub async fn update_auth_proxy_config(ctx: Ctx, intent: UpdateAuthProxyConfigIntent) -> Result<Outcome, ApiError> {
    let mut r = config_of(&ctx.state, &ctx.org.id)
        .await?
        .ok_or_else(|| ApiError::invalid("the auth proxy is not enabled: submit enable_auth_proxy first"))?;
    let mut config = r.data["config"].as_object().cloned().unwrap_or_default();
    if let Some(origins) = intent.allowed_origins {
        for o in &origins {
            check_origin(o)?;
        }
        let origins: Vec<String> = origins.iter().map(|o| o.trim_end_matches('/').to_string()).collect();
        config.insert("allowedOrigins".into(), json!(origins));
    }
    if let Some(methods) = intent.allowed_auth_methods {
        if let Some(m) = methods.iter().find(|m| !AUTH_METHODS.contains(&m.as_str())) {
            return Err(ApiError::invalid(format!(
                "invalid allowedAuthMethods entry {m:?} (passkey, wallet, email or sms)"
            )));
        }
        config.insert("allowedAuthMethods".into(), json!(methods));
    }
    if let Some(w) = intent.wallet_kit_settings {
        config.insert(
            "walletKitSettings".into(),
            json!({
                "enabledSocialProviders": w.enabled_social_providers,
                "oauthClientIds": w.oauth_client_ids,
                "oauthRedirectUrl": w.oauth_redirect_url,
            }),
        );
    }
    if let Some(s) = intent.session_expiration_seconds {
        if !(1..=7 * 24 * 3600).contains(&s) {
            return Err(ApiError::invalid("invalid sessionExpirationSeconds: 1 to 604800"));
        }
        config.insert("sessionExpirationSeconds".into(), json!(s));
    }
    if let Some(b) = intent.otp_alphanumeric {
        config.insert("otpAlphanumeric".into(), json!(b));
    }
    if let Some(n) = intent.otp_length {
        if !(6..=9).contains(&n) {
            return Err(ApiError::invalid("invalid otpLength: 6 to 9"));
        }
        config.insert("otpLength".into(), json!(n));
    }
    // The app name the proxy's codes carry: checked as the enclave checks it, kept as the enclave
    // records it (trimmed), since the enclave stamps a proxy send only with that name.
    let app_name = coffer_org_rules::transition::auth_proxy_app_name(&Value::Object(intent.rest.clone()))
        .map_err(ApiError::invalid)?;
    for (k, v) in intent.rest {
        if !v.is_null() {
            config.insert(k, v);
        }
    }
    if let Some(name) = app_name {
        config.insert("appName".into(), json!(name));
    }
    r.data["config"] = Value::Object(config);
    r.updated_at = ctx.now;
    let id = r.id.clone();
    Ok(Outcome { result: json!({ "configId": id }), writes: vec![Write::PutRecord(r)] })
}

/// The configuration as `coffer_get_auth_proxy_config` answers it (never the sealed key).
pub fn config_json(r: &Record) -> Value {
    let mut out = r.data["config"].as_object().cloned().unwrap_or_default();
    out.insert("configId".into(), json!(r.id));
    out.insert("organizationId".into(), json!(r.organization_id));
    out.insert("enabled".into(), r.data["enabled"].clone());
    out.insert("userId".into(), r.data["userId"].clone());
    out.insert("createdAt".into(), json!(timestamp(r.created_at)));
    out.insert("updatedAt".into(), json!(timestamp(r.updated_at)));
    Value::Object(out)
}

pub async fn get_auth_proxy_config(ctx: QueryCtx, _req: Value) -> Result<Value, ApiError> {
    match config_of(&ctx.state, &ctx.org.id).await? {
        Some(r) => Ok(json!({ "authProxyConfig": config_json(&r) })),
        None => Err(ApiError::not_found("the auth proxy was never enabled in this organization")),
    }
}
