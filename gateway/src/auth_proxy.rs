//! The auth proxy listener: unstamped browser calls identified by `X-Auth-Proxy-Config-Id`, with
//! CORS limited to the configuration's origins and rate limits per config id and per address.
//! `wallet_kit_config` answers the login settings; `oauth2_authenticate` and `oauth_login` become
//! activities of the proxy's user (stamped in the enclave with its sealed key, recorded, subject
//! to policies); `account` looks a user's sub-organization up.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde_json::{json, Map, Value};

use crate::activity::pipeline;
use crate::error::{ApiError, Code};
use crate::limits::{ClientAddr, GroupLimiter, Over, RateLimiter};
use crate::oidc_tokens;
use crate::record_kinds::{AUTH_PROXY, OAUTH2_CREDENTIAL};
use crate::state::AppState;
use crate::store::{Page, Record, StoreError, SubOrgFilter};

/// The header that names the configuration (any case).
pub const CONFIG_HEADER: &str = "x-auth-proxy-config-id";
/// What a browser preflight may ask to send: the headers the official clients send.
const ALLOWED_HEADERS: &str = "Content-Type, X-Auth-Proxy-Config-Id, X-Captcha-Token";
/// The largest auth proxy request body (its calls carry a token and a few fields).
const MAX_BODY: usize = 64 * 1024;
/// How long the set of allowed origins (for preflights, which carry no config id) is reused.
const ORIGINS_TTL: Duration = Duration::from_secs(5);

/// `otp_verify` (the first form) sends the code in plaintext, which the gateway must never see:
/// clients use `otp_verify_v2`, whose code is encrypted to the enclave.
const PLAINTEXT_CODE: &str = "otp_verify";

/// The listener's state: the gateway's, its limits, and the cached preflight origins.
pub struct AuthProxy {
    state: Arc<AppState>,
    /// Requests a second per configuration, charged only for a request otherwise accepted that
    /// is more than a public read ([`charged_per_config`]).
    per_config: Option<RateLimiter<String>>,
    /// Requests a second per client address group (and its range).
    per_ip: Option<GroupLimiter>,
    /// `otp_init` sends per client address group (and its range) and hour.
    otp_sends_per_ip: Option<GroupLimiter>,
    /// Sign-ups per client address group (and its range) and hour.
    signups_per_ip: Option<GroupLimiter>,
    origins: Mutex<Option<(Instant, Arc<HashSet<String>>)>>,
}

/// The auth proxy's limits (gateway settings `auth_proxy_*`; see docs/operations.md "Operating limits").
#[derive(Debug, Clone, Copy)]
pub struct ProxyLimits {
    pub per_config: u32,
    pub per_ip: u32,
    pub otp_sends_per_ip_per_hour: u32,
    pub signups_per_ip_per_hour: u32,
    /// How many times a group's limit its range (IPv4 /16, IPv6 /48) has; 0: no range limit.
    pub range_factor: u32,
}

pub fn router(state: Arc<AppState>, limits: ProxyLimits) -> Router {
    let f = limits.range_factor;
    let proxy = Arc::new(AuthProxy {
        state,
        per_config: RateLimiter::per_second(limits.per_config),
        per_ip: GroupLimiter::per_second(limits.per_ip, f),
        otp_sends_per_ip: GroupLimiter::per_hour(limits.otp_sends_per_ip_per_hour, f),
        signups_per_ip: GroupLimiter::per_hour(limits.signups_per_ip_per_hour, f),
        origins: Mutex::new(None),
    });
    Router::new()
        .route("/healthz", get(|| async { Json(json!({ "status": "ok" })) }))
        .route("/v1/:name", axum::routing::post(call).options(preflight))
        .fallback(|method: Method, State(p): State<Arc<AuthProxy>>, headers: HeaderMap| async move {
            if method == Method::OPTIONS {
                return preflight(State(p), headers).await;
            }
            ApiError::not_found("no such auth proxy endpoint").into_response()
        })
        .with_state(proxy)
}

impl AuthProxy {
    /// Origins that some enabled configuration allows.
    async fn allowed_origins(&self) -> Result<Arc<HashSet<String>>, ApiError> {
        if let Ok(guard) = self.origins.lock() {
            if let Some((at, set)) = guard.as_ref() {
                if at.elapsed() < ORIGINS_TTL {
                    return Ok(set.clone());
                }
            }
        }
        let configs = self.state.db(|s| s.records_of_kind(AUTH_PROXY)).await??;
        let set: HashSet<String> =
            configs.iter().filter(|r| enabled(r)).flat_map(|r| origins_of(r).into_iter()).collect();
        let set = Arc::new(set);
        if let Ok(mut guard) = self.origins.lock() {
            *guard = Some((Instant::now(), set.clone()));
        }
        Ok(set)
    }
}

fn enabled(r: &Record) -> bool {
    r.data["enabled"].as_bool() == Some(true)
}

fn origins_of(r: &Record) -> Vec<String> {
    let list = r.data["config"]["allowedOrigins"].as_array().cloned().unwrap_or_default();
    list.iter().filter_map(Value::as_str).map(str::to_string).collect()
}

fn origin(headers: &HeaderMap) -> Option<String> {
    headers.get("origin").and_then(|v| v.to_str().ok()).map(str::to_string)
}

fn with_cors(mut response: Response, origin: Option<&str>) -> Response {
    if let Some(value) = origin.and_then(|o| HeaderValue::from_str(o).ok()) {
        let h = response.headers_mut();
        h.insert("access-control-allow-origin", value);
        h.insert("vary", HeaderValue::from_static("Origin"));
    }
    response
}

/// A browser preflight: allowed for an origin some enabled configuration lists, never `*`.
async fn preflight(State(p): State<Arc<AuthProxy>>, headers: HeaderMap) -> Response {
    let Some(o) = origin(&headers) else {
        return ApiError::invalid("a preflight needs an Origin header").into_response();
    };
    match p.allowed_origins().await {
        Ok(set) if set.contains(&o) => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert("access-control-allow-methods", HeaderValue::from_static("POST, OPTIONS"));
            h.insert("access-control-allow-headers", HeaderValue::from_static(ALLOWED_HEADERS));
            h.insert("access-control-max-age", HeaderValue::from_static("600"));
            with_cors(r, Some(&o))
        }
        Ok(_) => {
            ApiError::forbidden(format!("origin {o} is not allowed by any auth proxy configuration")).into_response()
        }
        Err(e) => e.into_response(),
    }
}

fn unauthorized() -> ApiError {
    ApiError::new(Code::Unauthenticated, "UNAUTHENTICATED", "unknown or disabled auth proxy config id")
}

async fn call(
    State(p): State<Arc<AuthProxy>>,
    Path(name): Path<String>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // Per address group (IPv4 /24, IPv6 /64) and range (/16, /48), not per address: one client
    // holds a whole group, and a free tunnel a whole /48.
    if let (Some(limiter), Some(Extension(ClientAddr(ip)))) = (&p.per_ip, &client) {
        if let Err((wait, over)) = limiter.take(*ip, Instant::now()) {
            let what = match over {
                Over::Group => "address",
                Over::Range => "address range",
            };
            return ApiError::rate_limited(what, wait).into_response();
        }
    }
    let Some(config_id) = headers.get(CONFIG_HEADER).and_then(|v| v.to_str().ok()).map(|s| s.trim().to_string()) else {
        return unauthorized().into_response();
    };
    let id = config_id.clone();
    let config = match p.state.db(move |s| s.record_by_id(AUTH_PROXY, &id)).await {
        Ok(Ok(r)) if enabled(&r) => r,
        Ok(Ok(_)) | Ok(Err(StoreError::NotFound)) => return unauthorized().into_response(),
        Ok(Err(e)) => return ApiError::from(e).into_response(),
        Err(e) => return e.into_response(),
    };
    // CORS: a browser's origin must be one the configuration allows (echoed, never `*`).
    let origin = origin(&headers);
    if let Some(o) = &origin {
        if !origins_of(&config).contains(o) {
            return ApiError::forbidden(format!("origin {o} is not allowed by this auth proxy configuration"))
                .into_response();
        }
    }
    let body = match tokio::time::timeout(Duration::from_secs(10), axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => return with_cors(ApiError::too_large(MAX_BODY).into_response(), origin.as_deref()),
        Err(_) => return with_cors(ApiError::body_timeout(Duration::from_secs(10)).into_response(), origin.as_deref()),
    };
    // Each code is a message someone receives: one address sends a few an hour, not the
    // organization's whole hourly allowance. Charged by otp_init once the request is otherwise
    // accepted, so that refused calls (an unknown config id, a method not enabled) spend none.
    // Likewise each sign-up is a new sub-organization: one address group creates a few an hour,
    // not the organization's whole allowance. Both are keyed by the address's group (an IPv4 /24,
    // an IPv6 /64), which one client routinely holds whole.
    let client = client.map(|Extension(ClientAddr(ip))| ip);
    let allowances = Allowances {
        sends: Allowance::of(
            &p.otp_sends_per_ip,
            client,
            ["address's one-time codes", "address range's one-time codes"],
        ),
        signups: Allowance::of(&p.signups_per_ip, client, ["address's sign-ups", "address range's sign-ups"]),
    };
    let result = match parse_body(&body) {
        Ok(params) => match charge_config(&p.per_config, &config_id, &name) {
            Ok(()) => dispatch(&p.state, &config, &name, params, allowances).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    let response = match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    };
    with_cors(response, origin.as_deref())
}

/// The routes charged to the configuration's per-second limit: every route that does work for a
/// visitor (a store lookup by what it sent, an activity). Not the public reads every page load
/// makes (`wallet_kit_config`, `wallet_kit_client_params`: the configuration's own settings),
/// nor what is refused before any work (an unknown route, `otp_verify`), so that requests nobody
/// serves cannot use up the configuration's rate for its visitors.
fn charged_per_config(name: &str) -> bool {
    matches!(
        name,
        "oauth2_authenticate"
            | "oauth_login"
            | "account"
            | "signup"
            | "signup_v2"
            | "otp_init"
            | "otp_init_v2"
            | "otp_verify_v2"
            | "otp_login"
            | "otp_login_v2"
    )
}

/// Charges one request of route `name` to the configuration (a known, enabled config id, an
/// allowed origin, a body read whole and a JSON object): a 429 past its rate.
fn charge_config(limiter: &Option<RateLimiter<String>>, config_id: &str, name: &str) -> Result<(), ApiError> {
    match limiter {
        Some(l) if charged_per_config(name) => l
            .take(config_id.to_string(), Instant::now())
            .map_err(|wait| ApiError::rate_limited("auth proxy configuration", wait)),
        _ => Ok(()),
    }
}

/// The request body: a JSON object; an empty body counts as `{}` (`@turnkey/core` sends none).
fn parse_body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(ApiError::invalid("the request body must be a JSON object")),
    }
}

fn text<'a>(m: &'a Map<String, Value>, k: &str) -> &'a str {
    m.get(k).and_then(Value::as_str).unwrap_or_default()
}

/// What one client address group may still do this hour, charged by the route once the request
/// is otherwise accepted: `otp_init` when it is about to send a code, `signup` when it is about to
/// create a sub-organization.
struct Allowances<'a> {
    sends: Option<Allowance<'a>>,
    signups: Option<Allowance<'a>>,
}

/// One hourly allowance of one client address group and its range (`None` when the limit is off
/// or the client's address is not known).
struct Allowance<'a> {
    limiter: &'a GroupLimiter,
    client: std::net::IpAddr,
    /// What a refusal names: the group's allowance, the range's.
    what: [&'static str; 2],
}

impl<'a> Allowance<'a> {
    fn of(
        limiter: &'a Option<GroupLimiter>,
        client: Option<std::net::IpAddr>,
        what: [&'static str; 2],
    ) -> Option<Self> {
        Some(Self { limiter: limiter.as_ref()?, client: client?, what })
    }

    /// Spends one, or a 429 with `Retry-After` (the time until one is back).
    fn charge(allowance: Option<&Self>) -> Result<(), ApiError> {
        match allowance {
            Some(a) => a.limiter.take(a.client, Instant::now()).map_err(|(wait, over)| {
                ApiError::rate_limited(if over == Over::Group { a.what[0] } else { a.what[1] }, wait)
            }),
            None => Ok(()),
        }
    }
}

async fn dispatch(
    state: &Arc<AppState>,
    config: &Record,
    name: &str,
    params: Map<String, Value>,
    allowances: Allowances<'_>,
) -> Result<Value, ApiError> {
    let settings = &config.data["config"];
    match name {
        "wallet_kit_config" => Ok(wallet_kit_config(config)),
        "wallet_kit_client_params" => Ok(json!({})),
        "oauth2_authenticate" => oauth2_authenticate(state, config, &params).await,
        "oauth_login" => oauth_login(state, config, &params, settings).await,
        "account" => account(state, config, &params).await,
        "signup" | "signup_v2" => signup(state, config, &params, allowances.signups.as_ref()).await,
        "otp_init" | "otp_init_v2" => otp_init(state, config, &params, allowances.sends.as_ref()).await,
        "otp_verify_v2" => otp_verify(state, config, &params).await,
        "otp_login" | "otp_login_v2" => otp_login(state, config, &params, settings).await,
        PLAINTEXT_CODE => Err(ApiError {
            status: Some(StatusCode::NOT_IMPLEMENTED),
            ..ApiError::invalid(
                "otp_verify sends the code in plaintext, which Coffer's gateway never sees: use otp_verify_v2 \
                 (the code encrypted to the otpEncryptionTargetBundle)",
            )
        }),
        _ => Err(ApiError::not_found("no such auth proxy endpoint")),
    }
}

/// `POST /v1/wallet_kit_config`: the seed's fields.
pub fn wallet_kit_config(config: &Record) -> Value {
    let c = &config.data["config"];
    let mut providers: Vec<Value> = c["allowedAuthMethods"].as_array().cloned().unwrap_or_default();
    providers.extend(c["walletKitSettings"]["enabledSocialProviders"].as_array().cloned().unwrap_or_default());
    json!({
        "enabledProviders": providers,
        "sessionExpirationSeconds": c["sessionExpirationSeconds"].as_i64().unwrap_or(900).to_string(),
        "organizationId": config.organization_id,
        "oauthClientIds": c["walletKitSettings"]["oauthClientIds"].as_object().cloned().unwrap_or_default(),
        "oauthRedirectUrl": c["walletKitSettings"]["oauthRedirectUrl"].as_str().unwrap_or_default(),
        "otpAlphanumeric": c["otpAlphanumeric"].as_bool().unwrap_or(DEFAULT_OTP_ALPHANUMERIC),
        "otpLength": c["otpLength"].as_i64().unwrap_or(DEFAULT_OTP_LENGTH).to_string(),
    })
}

/// Submits `parameters` as activity `path` of `organization_id`, stamped by the proxy user's key
/// in the enclave, through the one pipeline; answers its result object.
async fn submit_as_proxy(
    state: &Arc<AppState>,
    config: &Record,
    path: &str,
    organization_id: &str,
    parameters: Value,
) -> Result<Value, ApiError> {
    let op = crate::ops::REGISTRY.activity(path).ok_or_else(ApiError::internal)?;
    let now_ms = crate::store::now_nanos() / 1_000_000;
    let body = json!({
        "type": op.activity_type,
        "timestampMs": now_ms.to_string(),
        "organizationId": organization_id,
        "parameters": parameters,
    })
    .to_string();
    let request = coffer_proto::v1::StampAuthProxyRequestRequest {
        organization_id: config.organization_id.clone(),
        user_id: config.data["userId"].as_str().unwrap_or_default().to_string(),
        public_key: config.data["publicKey"].as_str().unwrap_or_default().to_string(),
        sealed_key: hex::decode(config.data["sealedKey"].as_str().unwrap_or_default()).unwrap_or_default(),
        body: body.clone().into_bytes(),
    };
    let stamp = state.custody.stamp_auth_proxy_request(request).await?;
    let mut headers = HeaderMap::new();
    headers.insert("x-stamp", HeaderValue::from_str(&stamp).map_err(|_| ApiError::internal())?);
    let answer = pipeline::submit(state.clone(), &crate::ops::REGISTRY, path, &headers, body.as_bytes()).await?;
    let activity = &answer["activity"];
    if activity["status"] != "ACTIVITY_STATUS_COMPLETED" {
        return Err(ApiError::forbidden(format!(
            "the auth proxy's {path} did not complete ({}): the organization's policies must let the proxy user \
             submit it without approvals",
            activity["status"].as_str().unwrap_or("unknown status")
        )));
    }
    Ok(activity["result"][op.result_key].clone())
}

async fn oauth2_authenticate(
    state: &Arc<AppState>,
    config: &Record,
    p: &Map<String, Value>,
) -> Result<Value, ApiError> {
    let (provider, client_id) = (text(p, "provider"), text(p, "clientId"));
    for (v, k) in [(provider, "provider"), (client_id, "clientId")] {
        crate::ops::params::required(v, k)?;
    }
    let org = config.organization_id.clone();
    let credentials = state.db(move |s| s.records(&org, OAUTH2_CREDENTIAL)).await??;
    let credential = credentials
        .iter()
        .find(|r| r.data["provider"] == provider && r.data["clientId"] == client_id)
        .ok_or_else(|| {
            ApiError::new(
                Code::NotFound,
                "OAUTH2_CREDENTIAL_NOT_FOUND",
                format!("no oauth2 credential for {provider} with client id {client_id:?} in this organization"),
            )
        })?;
    let parameters = json!({
        "oauth2CredentialId": credential.id,
        "authCode": text(p, "authCode"),
        "redirectUri": text(p, "redirectUri"),
        "codeVerifier": text(p, "codeVerifier"),
        "nonce": text(p, "nonce"),
    });
    submit_as_proxy(state, config, "oauth2_authenticate", &config.organization_id, parameters).await
}

/// The organization (the configuration's, or one of its sub-organizations) whose user has the
/// token's identity.
async fn organization_of_identity(state: &Arc<AppState>, config: &Record, token: &str) -> Result<String, ApiError> {
    let claims = oidc_tokens::verify(oidc_tokens::own_keys(state).await, token).await?;
    let org = config.organization_id.clone();
    let (iss, sub, aud) = (claims.iss.clone(), claims.sub.clone(), claims.aud.clone());
    let own = state.db(move |s| s.oauth_providers(&org, None)).await??;
    if own.iter().any(|p| p.issuer == iss && p.subject == sub && p.audience == aud) {
        return Ok(config.organization_id.clone());
    }
    let org = config.organization_id.clone();
    let filter = SubOrgFilter::OauthIdentity { issuer: claims.iss, subject: claims.sub, audience: claims.aud };
    let page = Page { limit: 1, before: None, after: None };
    let ids = state.db(move |s| s.sub_organization_ids(&org, &filter, &page)).await??;
    ids.into_iter().next().ok_or_else(|| {
        ApiError::new(
            Code::NotFound,
            "OAUTH_PROVIDER_NOT_FOUND",
            "no user has an oauth provider matching the OIDC token",
        )
    })
}

async fn oauth_login(
    state: &Arc<AppState>,
    config: &Record,
    p: &Map<String, Value>,
    settings: &Value,
) -> Result<Value, ApiError> {
    let token = text(p, "oidcToken");
    crate::ops::params::required(token, "oidcToken")?;
    crate::ops::params::required(text(p, "publicKey"), "publicKey")?;
    let organization_id = match text(p, "organizationId") {
        "" => organization_of_identity(state, config, token).await?,
        id => sub_organization_of(state, config, id).await?,
    };
    let mut parameters = json!({
        "oidcToken": token,
        "publicKey": text(p, "publicKey"),
        "expirationSeconds": settings["sessionExpirationSeconds"].as_i64().unwrap_or(900).to_string(),
    });
    if let Some(b) = p.get("invalidateExisting").and_then(Value::as_bool) {
        parameters["invalidateExisting"] = json!(b);
    }
    submit_as_proxy(state, config, "oauth_login", &organization_id, parameters).await
}

/// Whether the configuration allows a login method (`allowedAuthMethods`, as `wallet_kit_config`
/// lists them): `email` for email codes.
fn method_enabled(config: &Record, method: &str) -> bool {
    config.data["config"]["allowedAuthMethods"]
        .as_array()
        .is_some_and(|m| m.iter().any(|v| v.as_str().is_some_and(|v| v.eq_ignore_ascii_case(method))))
}

/// The code a configuration that does not set `otpLength` / `otpAlphanumeric` sends: the
/// interface's own default (9 Crockford base32 characters, 45 bits), not the dashboard's 6 digits
/// (20 bits), since anonymous visitors can spread guesses over many contacts.
const DEFAULT_OTP_LENGTH: i64 = 9;
const DEFAULT_OTP_ALPHANUMERIC: bool = true;

/// `POST /v1/otp_init_v2 {otpType, contact}` (and `otp_init`) → `{otpId, otpEncryptionTargetBundle}`:
/// `init_otp` in the configuration's organization, with its `otpLength` and `otpAlphanumeric`.
async fn otp_init(
    state: &Arc<AppState>,
    config: &Record,
    p: &Map<String, Value>,
    sends: Option<&Allowance<'_>>,
) -> Result<Value, ApiError> {
    let otp_type = text(p, "otpType");
    crate::ops::params::required(otp_type, "otpType")?;
    crate::ops::params::required(text(p, "contact"), "contact")?;
    let method = if otp_type == "OTP_TYPE_SMS" { "sms" } else { "email" };
    if !method_enabled(config, method) {
        return Err(ApiError::forbidden(format!("{method} login is not enabled in this auth proxy configuration")));
    }
    let c = &config.data["config"];
    // The configuration's, never the visitor's; the enclave stamps the send only with the name
    // it recorded from update_auth_proxy_config.
    let app_name = c["appName"].as_str().map(str::trim).filter(|n| !n.is_empty());
    let mut parameters = json!({
        "otpType": otp_type,
        "contact": text(p, "contact"),
        "appName": app_name.unwrap_or(coffer_org_rules::transition::DEFAULT_AUTH_PROXY_APP_NAME),
        "otpLength": c["otpLength"].as_i64().unwrap_or(DEFAULT_OTP_LENGTH),
        "alphanumeric": c["otpAlphanumeric"].as_bool().unwrap_or(DEFAULT_OTP_ALPHANUMERIC),
    });
    if !text(p, "userIdentifier").is_empty() {
        parameters["userIdentifier"] = json!(text(p, "userIdentifier"));
    }
    Allowance::charge(sends)?;
    let result = submit_as_proxy(state, config, "init_otp", &config.organization_id, parameters).await?;
    Ok(json!({ "otpId": result["otpId"], "otpEncryptionTargetBundle": result["otpEncryptionTargetBundle"] }))
}

/// `POST /v1/otp_verify_v2 {otpId, encryptedOtpBundle}` → `{verificationToken}`.
async fn otp_verify(state: &Arc<AppState>, config: &Record, p: &Map<String, Value>) -> Result<Value, ApiError> {
    crate::ops::params::required(text(p, "otpId"), "otpId")?;
    crate::ops::params::required(text(p, "encryptedOtpBundle"), "encryptedOtpBundle")?;
    let parameters = json!({ "otpId": text(p, "otpId"), "encryptedOtpBundle": text(p, "encryptedOtpBundle") });
    let result = submit_as_proxy(state, config, "verify_otp", &config.organization_id, parameters).await?;
    Ok(json!({ "verificationToken": result["verificationToken"] }))
}

/// `POST /v1/otp_login_v2 {verificationToken, publicKey, clientSignature, organizationId?}` (and
/// `otp_login`) → `{session}`: `otp_login` in the organization given, or the one (the
/// configuration's or a sub-organization) whose user has the token's contact. The token is
/// checked first (the notarizer's signature, unexpired, verified in this configuration's
/// organization), before anything is looked up by it: a forged token is refused alike whatever
/// its contact, so the answer never tells a registered contact from an unknown one. The enclave
/// checks it again and spends it.
async fn otp_login(
    state: &Arc<AppState>,
    config: &Record,
    p: &Map<String, Value>,
    settings: &Value,
) -> Result<Value, ApiError> {
    let token = text(p, "verificationToken");
    crate::ops::params::required(token, "verificationToken")?;
    crate::ops::params::required(text(p, "publicKey"), "publicKey")?;
    let verified = verified_token(state, config, token).await?;
    let organization_id = match text(p, "organizationId") {
        "" => {
            let sms = verified.verification_type == "OTP_TYPE_SMS";
            crate::stamps::sub_organization_with_verified_contact(state, &config.organization_id, sms, verified.contact)
                .await?
                .ok_or_else(|| {
                    ApiError::not_found("no sub-organization of this auth proxy has a user with the verified contact")
                })?
        }
        id => sub_organization_of(state, config, id).await?,
    };
    let mut parameters = json!({
        "verificationToken": token,
        "publicKey": text(p, "publicKey"),
        "expirationSeconds": settings["sessionExpirationSeconds"].as_i64().unwrap_or(900).to_string(),
    });
    for k in ["invalidateExisting", "clientSignature"] {
        if let Some(v) = p.get(k).filter(|v| !v.is_null()) {
            parameters[k] = v.clone();
        }
    }
    submit_as_proxy(state, config, "otp_login", &organization_id, parameters).await
}

/// `token` when it is a verification token signed by this deployment's notarizer, unexpired, and
/// verified in the configuration's organization; one refusal for anything else, whatever the
/// reason and whatever contact it names (nothing is looked up by an unchecked token).
async fn verified_token(
    state: &Arc<AppState>,
    config: &Record,
    token: &str,
) -> Result<coffer_auth::verification_token::VerifiedToken, ApiError> {
    let keys = oidc_tokens::own_keys(state).await.ok_or_else(|| {
        ApiError::unavailable("enclave unavailable: key operations are temporarily not possible, retry shortly")
    })?;
    let now_ms = crate::store::now_nanos() / 1_000_000;
    coffer_auth::verification_token::verify(token, &keys.notarizer, now_ms)
        .filter(|t| t.organization_id == config.organization_id && !t.contact.is_empty())
        .ok_or_else(|| {
            ApiError::forbidden(
                "verificationToken is not a valid verification token of this auth proxy (signed by this \
                 deployment, unexpired, from its one-time codes)",
            )
        })
}

/// What a visitor's lookup may find. A contact is found only through a user whose contacts the
/// sign-up gave (a sub-organization's users may set any address on themselves); a key only where
/// it proved possession (registering someone else's key, with one's own passkey beside it, must
/// not route its owner's later login there).
fn for_visitors(filter: SubOrgFilter) -> SubOrgFilter {
    match filter {
        SubOrgFilter::Email(v) => SubOrgFilter::VerifiedEmail(v),
        SubOrgFilter::PhoneNumber(v) => SubOrgFilter::VerifiedPhoneNumber(v),
        SubOrgFilter::PublicKey(k) => SubOrgFilter::ProvenPublicKey(k),
        other => other,
    }
}

/// `id` when it is the configuration's organization or one of its sub-organizations.
async fn sub_organization_of(state: &Arc<AppState>, config: &Record, id: &str) -> Result<String, ApiError> {
    if id == config.organization_id {
        return Ok(id.to_string());
    }
    let sub = id.to_string();
    let parent = state.db(move |s| s.organization(&sub)).await?.ok().and_then(|o| o.parent_id);
    if parent.as_deref() != Some(config.organization_id.as_str()) {
        return Err(ApiError::invalid(
            "organizationId must be the auth proxy's organization or one of its sub-organizations",
        ));
    }
    Ok(id.to_string())
}

/// `POST /v1/signup_v2` (and `signup`): a sub-organization of the configuration's organization
/// with one root user holding the given API keys, passkeys and OAuth providers (and a wallet if
/// asked), as `create_sub_organization` by the proxy user. What `@turnkey/core`'s
/// `signUpWithOauth`, `signUpWithPasskey` and `signUpWithOtp` send (an email or phone number only
/// with its `verificationToken`, which the enclave checks).
async fn signup(
    state: &Arc<AppState>,
    config: &Record,
    p: &Map<String, Value>,
    signups: Option<&Allowance<'_>>,
) -> Result<Value, ApiError> {
    let list = |k: &str| p.get(k).cloned().filter(Value::is_array).unwrap_or_else(|| json!([]));
    let now_ms = crate::store::now_nanos() / 1_000_000;
    let mut user = json!({
        "userName": match text(p, "userName") { "" => format!("user-{now_ms}"), n => n.to_string() },
        "apiKeys": list("apiKeys"),
        "authenticators": list("authenticators"),
        "oauthProviders": list("oauthProviders"),
    });
    for (from, to) in [("userEmail", "userEmail"), ("userPhoneNumber", "userPhoneNumber")] {
        if !text(p, from).is_empty() {
            user[to] = json!(text(p, from));
        }
    }
    // Marked as the proxy's sign-up (the enclave's stamper refuses one without): what Coffer
    // sends for the sub-organization carries this organization's name and counts against its
    // allowance.
    let mut parameters = json!({
        "subOrganizationName": match text(p, "organizationName") { "" => format!("sub-org-{now_ms}"), n => n.to_string() },
        "rootQuorumThreshold": 1,
        "rootUsers": [user],
    });
    parameters[coffer_org_rules::transition::AUTH_PROXY_SIGNUP] = json!(true);
    if let Some(w) = p.get("wallet").filter(|w| w.is_object()) {
        parameters["wallet"] = w.clone();
    }
    // An email or phone number comes with the verification token of it (one-time code) and the
    // token key's signature of the sign-up: the enclave checks both and spends the token.
    if !text(p, "verificationToken").is_empty() {
        parameters["verificationToken"] = json!(text(p, "verificationToken"));
    }
    if let Some(sig) = p.get("clientSignature").filter(|s| s.is_object()) {
        parameters["clientSignature"] = sig.clone();
    }
    // Charged once the request is otherwise accepted (a known, enabled configuration, an allowed
    // origin, a JSON body): a sub-organization is about to be created.
    Allowance::charge(signups)?;
    let result = submit_as_proxy(state, config, "create_sub_organization", &config.organization_id, parameters).await?;
    let mut answer = json!({
        "organizationId": result["subOrganizationId"],
        "userId": result["rootUserIds"][0],
    });
    if let Some(w) = result.get("wallet").filter(|w| !w.is_null()) {
        answer["wallet"] = w.clone();
    }
    Ok(answer)
}

/// `POST /v1/account {filterType, filterValue, verificationToken?, oidcToken?}` → `{organizationId?}`:
/// the sub-organization of the configuration's organization that the filter finds. An anonymous
/// caller learns which address has an account only by proving it holds the address: `EMAIL` and
/// `PHONE_NUMBER` need a verification token of that contact (checked against the enclave's
/// notarizer key; not spent, the login or sign-up after it spends it). `NAME` and `USERNAME` are
/// refused (403): a user name is often the email. The other filters the hosted proxy documents
/// are served; `WALLET_ACCOUNT_ADDRESS` is not one of them.
async fn account(state: &Arc<AppState>, config: &Record, p: &Map<String, Value>) -> Result<Value, ApiError> {
    let (filter_type, mut value) = (text(p, "filterType"), text(p, "filterValue"));
    if filter_type == "OIDC_TOKEN" && value.is_empty() {
        value = text(p, "oidcToken");
    }
    crate::ops::params::required(filter_type, "filterType")?;
    let keys = oidc_tokens::own_keys(state).await;
    match filter_type {
        "EMAIL" | "PHONE_NUMBER" => {
            let notarizer = keys.map(|k| k.notarizer.as_slice()).ok_or_else(|| {
                ApiError::unavailable("enclave unavailable: key operations are temporarily not possible, retry shortly")
            })?;
            let now_ms = crate::store::now_nanos() / 1_000_000;
            let want = if filter_type == "EMAIL" { "OTP_TYPE_EMAIL" } else { "OTP_TYPE_SMS" };
            let proven = coffer_auth::verification_token::verify(text(p, "verificationToken"), notarizer, now_ms)
                .is_some_and(|t| t.verification_type == want && t.contact.eq_ignore_ascii_case(value.trim()));
            if !proven {
                return Err(ApiError::forbidden(format!(
                    "an {filter_type} lookup needs the verificationToken of that contact (a one-time code verified)"
                )));
            }
        }
        // `@turnkey/core` sets the user name to the email: a lookup by name would tell anyone
        // which addresses have accounts, without the token the EMAIL lookup asks for.
        "NAME" | "USERNAME" => {
            return Err(ApiError::forbidden(format!(
                "an anonymous lookup by {filter_type} is not served: a name may be an email address, which is \
                 found only with its verificationToken (use EMAIL or PHONE_NUMBER with it, or PUBLIC_KEY, \
                 CREDENTIAL_ID or OIDC_TOKEN)"
            )))
        }
        "CREDENTIAL_ID" | "PUBLIC_KEY" | "OIDC_TOKEN" => {}
        other => {
            return Err(ApiError::invalid(format!(
                "invalid filter type: {other:?} (EMAIL, PHONE_NUMBER, CREDENTIAL_ID, PUBLIC_KEY or OIDC_TOKEN)"
            )))
        }
    }
    let filter = for_visitors(crate::ops::suborgs::filter(keys, filter_type, value).await?);
    let org = config.organization_id.clone();
    let page = Page { limit: 1, before: None, after: None };
    let ids = state.db(move |s| s.sub_organization_ids(&org, &filter, &page)).await??;
    Ok(match ids.into_iter().next() {
        Some(id) => json!({ "organizationId": id }),
        None => json!({}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_pays_only_for_work_done_for_a_visitor() {
        let limiter = RateLimiter::per_second(2);
        // Public reads, unknown routes and the plaintext-code route are never charged.
        for _ in 0..100 {
            for name in ["wallet_kit_config", "wallet_kit_client_params", "nope", PLAINTEXT_CODE] {
                assert!(charge_config(&limiter, "cfg", name).is_ok(), "{name}");
            }
        }
        assert!(charge_config(&limiter, "cfg", "account").is_ok());
        assert!(charge_config(&limiter, "cfg", "otp_init_v2").is_ok());
        let e = charge_config(&limiter, "cfg", "signup_v2").unwrap_err();
        assert_eq!(e.message, "rate limit exceeded for this auth proxy configuration, retry shortly");
        assert!(charge_config(&limiter, "other", "signup_v2").is_ok(), "per configuration");
        assert!(charge_config(&None, "cfg", "signup_v2").is_ok(), "off");
    }
}
