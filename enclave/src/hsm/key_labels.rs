//! Which keys the token holds: the service keys' labels, and the login keys' names and public
//! halves.

/// Label of the first AES-256 key-encryption key (KEK), which seals all user key material until a
/// rotation makes `coffer-kek-v2` current, and so on ([`kek_label`]).
pub const KEK_LABEL: &str = "coffer-kek-v1";
const KEK_LABEL_PREFIX: &str = "coffer-kek-v";

/// The label of KEK `version` (1, 2, ...).
pub fn kek_label(version: u32) -> String {
    format!("{KEK_LABEL_PREFIX}{version}")
}

/// The version a KEK label names: `coffer-kek-v` and a number from 1 on, in its shortest
/// decimal form; `None` for any other label (no other key of the token is ever used as a KEK).
pub fn kek_version(label: &str) -> Option<u32> {
    let digits = label.strip_prefix(KEK_LABEL_PREFIX)?;
    let version: u32 = digits.parse().ok()?;
    (version >= 1 && digits == version.to_string()).then_some(version)
}
/// Label of the P-256 key pair that signs export and import envelopes.
pub const SIGNER_LABEL: &str = "coffer-bundle-signer-v1";
/// Label of the HMAC-SHA256 key that certifies credentials (organization, user, public key).
pub const CERT_MAC_LABEL: &str = "coffer-cert-mac-v1";
/// The Ed25519 key that signs webhook deliveries (sensitive, never extractable).
pub const WEBHOOK_SIGNER_LABEL: &str = "coffer-webhook-signer-v1";

/// The P-256 key that signs app proofs, boot proofs and the activity log's links (sensitive,
/// never extractable; its public half is published with the other service keys).
pub const PROOF_LABEL: &str = "coffer-proof-key-v1";

/// The P-256 key that signs session JWTs (`verifySessionJwtSignature` of `@turnkey/crypto`).
pub const NOTARIZER_LABEL: &str = "coffer-notarizer-v1";
/// The P-256 key that signs the OIDC tokens Coffer issues (ES256).
pub const OIDC_ISSUER_LABEL: &str = "coffer-oidc-issuer-v1";
/// The P-256 key OAuth 2.0 client secrets are encrypted to (ECDH only, never extractable).
pub const TLS_FETCHER_LABEL: &str = "coffer-tls-fetcher-v1";

/// A P-256 signing key of the login service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginKey {
    /// Signs session JWTs.
    Notarizer,
    /// Signs Coffer's OIDC tokens.
    OidcIssuer,
}

impl LoginKey {
    pub(super) fn label(self) -> &'static str {
        match self {
            LoginKey::Notarizer => NOTARIZER_LABEL,
            LoginKey::OidcIssuer => OIDC_ISSUER_LABEL,
        }
    }
}

/// The public halves of the login keys, uncompressed SEC1 points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginPublicKeys {
    pub notarizer: [u8; 65],
    pub oidc_issuer: [u8; 65],
    pub tls_fetcher: [u8; 65],
}
