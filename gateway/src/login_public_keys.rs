//! The enclave's login keys (notarizer, OIDC issuer, TLS fetcher), fetched once and cached: the
//! discovery documents that publish them, and the issuer key Coffer's own OIDC tokens verify with.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::OnceCell;

use crate::error::ApiError;
use crate::state::AppState;

/// The login keys as the enclave published them. They never change for a token, so the first
/// answer stands for the life of the process.
#[derive(Debug, Clone)]
pub struct LoginKeys {
    /// The bundle signer's key, published beside the login keys.
    pub enclave_signer: Vec<u8>,
    pub notarizer: Vec<u8>,
    pub oidc_issuer_key: Vec<u8>,
    pub oidc_key_id: String,
    pub tls_fetcher: Vec<u8>,
    /// `None` when the enclave has no `oidc_issuer` setting.
    pub oidc_issuer: Option<String>,
    /// The proof key as app proofs name it (130 bytes of hex: the key twice); `None` on a token
    /// initialised before proofs existed.
    pub proof_key: Option<String>,
}

impl LoginKeys {
    /// The issuer's JWKS URL.
    pub fn jwks_uri(&self) -> Option<String> {
        self.oidc_issuer.as_ref().map(|iss| format!("{iss}/.well-known/jwks.json"))
    }

    /// The issuer key as a JWK.
    pub fn jwk(&self) -> Value {
        coffer_auth::oidc::es256_jwk(&self.oidc_issuer_key, &self.oidc_key_id)
    }
}

static KEYS: OnceCell<LoginKeys> = OnceCell::const_new();

/// The login keys, asked of the enclave on first use.
pub async fn login_keys(state: &AppState) -> Result<&'static LoginKeys, ApiError> {
    KEYS.get_or_try_init(|| async {
        let signer = state.custody.signer_public_key().await?;
        let r = state.custody.login_keys().await?;
        let boot = state.custody.boot_proof().await.ok();
        Ok::<_, ApiError>(LoginKeys {
            enclave_signer: signer,
            notarizer: r.notarizer_public_key,
            oidc_issuer_key: r.oidc_issuer_public_key,
            oidc_key_id: r.oidc_key_id,
            tls_fetcher: r.tls_fetcher_public_key,
            oidc_issuer: Some(r.oidc_issuer).filter(|s| !s.is_empty()),
            proof_key: boot.and_then(|b| b.proof).map(|p| p.public_key),
        })
    })
    .await
}

fn cached(value: Value) -> Response {
    let mut response = Json(value).into_response();
    response
        .headers_mut()
        .insert(axum::http::header::CACHE_CONTROL, axum::http::HeaderValue::from_static("public, max-age=3600"));
    response
}

/// `GET /public/v1/discovery/keys`: every public key a client of the login flow needs.
pub async fn discovery_keys(State(state): State<Arc<AppState>>) -> Response {
    match login_keys(&state).await {
        Ok(k) => cached(json!({
            "enclaveSignerPublicKey": hex::encode(&k.enclave_signer),
            "notarizerPublicKey": hex::encode(&k.notarizer),
            "tlsFetcherEncryptPublicKey": hex::encode(&k.tls_fetcher),
            "oidcIssuer": k.oidc_issuer,
            "oidcJwksUri": k.jwks_uri(),
            // App proofs, boot proofs and activity log links verify with its second half.
            "proofPublicKey": k.proof_key.as_deref().map(|k| &k[k.len() / 2..]),
            "appProofPublicKey": k.proof_key,
        })),
        Err(e) => e.into_response(),
    }
}

/// `GET /.well-known/openid-configuration` of Coffer's issuer.
pub async fn openid_configuration(State(state): State<Arc<AppState>>) -> Response {
    match login_keys(&state).await {
        Ok(LoginKeys { oidc_issuer: Some(iss), .. }) => cached(json!({
            "issuer": iss,
            "jwks_uri": format!("{iss}/.well-known/jwks.json"),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
            "claims_supported": ["iss", "sub", "aud", "exp", "iat", "nonce", "email", "name",
                "preferred_username", "encrypted_bearer_token"],
        })),
        Ok(_) => ApiError::not_found("this deployment issues no OIDC tokens (the enclave has no oidc_issuer)")
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /.well-known/jwks.json`: the issuer key.
pub async fn jwks(State(state): State<Arc<AppState>>) -> Response {
    match login_keys(&state).await {
        Ok(k) => cached(json!({ "keys": [k.jwk()] })),
        Err(e) => e.into_response(),
    }
}
