//! The enclave's one HTTP client, for every outbound request it makes (OIDC issuers' discovery
//! documents and JWKS, OAuth 2.0 code exchanges): no redirects, bounded time, and
//! `User-Agent: coffer-enclave/<version>`. Where each request may go is decided by its caller,
//! after the call's stamp and credential are verified (docs/security.md "Security": no egress before
//! authentication).

/// What every outbound request of the enclave says it is.
pub const USER_AGENT: &str = concat!("coffer-enclave/", env!("CARGO_PKG_VERSION"));

/// The enclave's HTTP client (made once).
pub fn client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| coffer_auth::oidc::http_client(USER_AGENT))
}
