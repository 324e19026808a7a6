//! The HTTP front end: routes, body limits, JSON errors everywhere, health and discovery.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::json;

use crate::activity::pipeline;
use crate::custody::transport;
use crate::error::ApiError;
use crate::ip_allowlists::Origin;
use crate::limits::{ClientAddr, RequestClass};
use crate::state::AppState;

pub fn router(state: Arc<AppState>, console: bool) -> Router {
    let pages = if console { crate::console::routes() } else { Router::new() };
    Router::new()
        .merge(pages)
        .route("/public/v1/submit/:name", post(submit))
        .route("/public/v1/query/:name", post(query))
        .route("/public/v1/discovery/enclave_signer", get(enclave_signer))
        .route("/public/v1/discovery/webhooks/jwks", get(webhook_jwks))
        .route("/public/v1/discovery/keys", get(crate::login_public_keys::discovery_keys))
        .route("/.well-known/openid-configuration", get(crate::login_public_keys::openid_configuration))
        .route("/.well-known/jwks.json", get(crate::login_public_keys::jwks))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError {
                status: Some(StatusCode::METHOD_NOT_ALLOWED),
                ..ApiError::invalid("method not allowed: use POST")
            }
        })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(count_request))
        .layer(axum::middleware::map_response(crate::console::no_sniffing))
        .with_state(state)
}

/// The operation a request path names, as a metrics label: the registry's operations by name,
/// anything else under a fixed name (so a client cannot make up label values).
fn operation_label(path: &str) -> String {
    if let Some(name) = path.strip_prefix("/public/v1/submit/") {
        return match crate::ops::REGISTRY.activity(name) {
            Some(_) => format!("submit/{name}"),
            None => "submit/unknown".into(),
        };
    }
    if let Some(name) = path.strip_prefix("/public/v1/query/") {
        return match crate::ops::REGISTRY.query(name) {
            Some(_) => format!("query/{name}"),
            None => "query/unknown".into(),
        };
    }
    match path {
        "/healthz"
        | "/readyz"
        | "/metrics"
        | "/public/v1/discovery/enclave_signer"
        | "/public/v1/discovery/webhooks/jwks"
        | "/public/v1/discovery/keys"
        | "/.well-known/openid-configuration"
        | "/.well-known/jwks.json" => path.to_string(),
        p if p == "/console" || p.starts_with("/console/") => "console".into(),
        _ => "other".into(),
    }
}

/// Counts every request of the API listener by operation and status, with its latency.
async fn count_request(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let operation = operation_label(request.uri().path());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    crate::metrics::observe_request(operation, response.status().as_u16(), started.elapsed());
    response
}

/// `GET /metrics`: the Prometheus text exposition.
async fn metrics() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        crate::metrics::metrics().render(),
    )
        .into_response()
}

/// The operations listener (`ops_listen`): health and readiness only, on connections of their
/// own.
pub fn ops_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::not_found("the operations listener serves /healthz, /readyz and /metrics") })
        .with_state(state)
}

/// Reads the body within the size limit and the body read timeout.
async fn read_body(state: &AppState, body: Body) -> Result<axum::body::Bytes, ApiError> {
    let timeout = state.limits.body_read_timeout;
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, state.body_limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(ApiError::too_large(state.body_limit)),
        Err(_) => Err(ApiError::body_timeout(timeout)),
    }
}

fn respond(result: Result<serde_json::Value, ApiError>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn submit(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let class = if name.starts_with("sign_") { RequestClass::Signing } else { RequestClass::Write };
    let _slot = match state.limits.admit(class, client.map(|c| c.0)) {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let bytes = match read_body(&state, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let origin = origin(&state, client, &headers);
    respond(pipeline::submit_from(origin, state, &crate::ops::REGISTRY, &name, &headers, &bytes).await)
}

async fn query(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let _slot = match state.limits.admit(RequestClass::Read, client.map(|c| c.0)) {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let bytes = match read_body(&state, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let origin = origin(&state, client, &headers);
    respond(pipeline::query_from(origin, state, &crate::ops::REGISTRY, &name, &headers, &bytes).await)
}

/// Where an API request comes from, for the IP allowlists.
fn origin(state: &AppState, client: Option<Extension<ClientAddr>>, headers: &HeaderMap) -> Origin {
    let peer = client.map(|Extension(ClientAddr(ip))| ip);
    Origin::Network(peer.and_then(|p| crate::client_address::client_address(p, headers, &state.limits.trusted_proxies)))
}

/// The bundle signer's key, for clients to pin (`dangerouslyOverrideSignerPublicKey` in JS,
/// the second half of a `QuorumPublicKey` in Rust).
async fn enclave_signer(State(state): State<Arc<AppState>>) -> Response {
    respond(state.custody.signer_public_key().await.map(|key| {
        let pk = hex::encode(key);
        json!({ "enclaveSignerPublicKey": pk, "quorumPublicKey": format!("{pk}{pk}") })
    }))
}

/// How long an enclave answer to a health probe stands for the next checks (while no call has
/// found the enclave unreachable): under load a probe would queue behind key operations.
const ENCLAVE_ANSWER_HOLDS: std::time::Duration = std::time::Duration::from_millis(250);

/// The key that signs webhook deliveries, as a JWKS (no stamp; `verifyTurnkeyWebhookSignature`
/// of `@turnkey/crypto` reads it). The key lives in the enclave's HSM; its `kid` is stable.
async fn webhook_jwks(State(state): State<Arc<AppState>>) -> Response {
    use base64::Engine;
    match state.custody.webhook_signing_key().await {
        Ok(key) => {
            let jwks = json!({ "keys": [{
                "kid": key.key_id,
                "kty": "OKP",
                "crv": "Ed25519",
                "alg": "EdDSA",
                "use": "sig",
                "x": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&key.public_key),
                "turnkey_signature_algorithm": "ed25519",
                "turnkey_signature_version": "v1",
            }]});
            let mut response = Json(jwks).into_response();
            response.headers_mut().insert(
                axum::http::header::CACHE_CONTROL,
                axum::http::HeaderValue::from_static("public, max-age=86400, s-maxage=86400, stale-if-error=604800"),
            );
            response
        }
        Err(e) => e.into_response(),
    }
}

/// Whether the store and the enclave answer, each within 2 s.
async fn readiness(state: &Arc<AppState>) -> Result<(), ApiError> {
    if !matches!(state.db(|s| s.ping()).await, Ok(Ok(()))) {
        return Err(ApiError::unavailable("store unavailable"));
    }
    if transport::answered_within(ENCLAVE_ANSWER_HOLDS) {
        return Ok(());
    }
    let enclave = tokio::time::timeout(std::time::Duration::from_secs(2), state.custody.signer_public_key()).await;
    match enclave {
        Ok(Ok(_)) => {
            transport::note_answered();
            Ok(())
        }
        _ => {
            transport::note_unreachable();
            Err(ApiError::unavailable("enclave unavailable"))
        }
    }
}

/// 200 once the store answers and the enclave answers; 503 with the reason otherwise (the
/// launcher contract's health check).
async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    respond(readiness(&state).await.map(|()| json!({ "status": "ok" })))
}

/// Readiness for a load balancer: ready when the store and the enclave answer.
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    respond(readiness(&state).await.map(|()| json!({ "status": "ready", "store": "ok", "enclave": "ok" })))
}
