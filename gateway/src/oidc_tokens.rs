//! OIDC tokens at the gateway: `coffer_auth::oidc` with Coffer's own issuer key (held from the
//! enclave, so Coffer's tokens verify without a network fetch).

use std::sync::Arc;

pub use coffer_auth::oidc::{identity_hash, Claims};

use crate::error::ApiError;
use crate::login_public_keys::LoginKeys;
use crate::state::AppState;

/// Coffer's own login keys, when the enclave answers (else tokens of every issuer are fetched).
pub async fn own_keys(state: &Arc<AppState>) -> Option<&'static LoginKeys> {
    crate::login_public_keys::login_keys(state).await.ok()
}

/// Verifies `token`: Coffer's own tokens against the issuer key in `own`, others against their
/// issuer's JWKS.
pub async fn verify(own: Option<&LoginKeys>, token: &str) -> Result<Claims, ApiError> {
    let jwks = own.map(|k| serde_json::json!({ "keys": [k.jwk()] }));
    let own_issuer = match (own.and_then(|k| k.oidc_issuer.as_deref()), &jwks) {
        (Some(issuer), Some(jwks)) => Some(coffer_auth::oidc::OwnIssuer { issuer, jwks }),
        _ => None,
    };
    let fetch = coffer_auth::oidc::Fetch { client: http(), allowed: None };
    Ok(coffer_auth::oidc::verify(token, own_issuer, fetch).await?)
}

/// The gateway's client for issuers' documents (`User-Agent: coffer-gateway/<version>`).
fn http() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| coffer_auth::oidc::http_client(concat!("coffer-gateway/", env!("CARGO_PKG_VERSION"))))
}
