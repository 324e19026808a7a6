//! The session JWT's signature as `verifySessionJwtSignature` of `@turnkey/crypto` checks it: ECDSA
//! P-256 by the notarizer, `r ‖ s` base64url, over the digest SHA-256(SHA-256(`header.payload`))
//! (not standard ES256). `coffer_crypto::session` assembles the JWTs; the gateway checks
//! read-only sessions (`X-Session`) with [`verify_signature`].

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use p256::ecdsa::signature::hazmat::PrehashVerifier as _;
use sha2::{Digest, Sha256};

/// The digest the session-JWT signature is over: SHA-256(SHA-256(`signing_input`)), where
/// `signing_input` is `base64url(header) "." base64url(payload)`. Sign it as a prehashed digest
/// (PKCS#11 `CKM_ECDSA`), or equivalently sign SHA-256(`signing_input`) with `CKM_ECDSA_SHA256`.
pub fn signing_digest(signing_input: &str) -> [u8; 32] {
    Sha256::digest(Sha256::digest(signing_input.as_bytes())).into()
}

/// The check of `verifySessionJwtSignature`: `notarizer_public` is a SEC1 P-256 key (the SDK
/// takes it as uncompressed hex). `false` for any malformed token or bad signature.
pub fn verify_signature(jwt: &str, notarizer_public: &[u8]) -> bool {
    let mut parts = jwt.split('.');
    let (Some(header), Some(payload), Some(signature), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Ok(key) = p256::ecdsa::VerifyingKey::from_sec1_bytes(notarizer_public) else {
        return false;
    };
    let Some(signature) =
        URL_SAFE_NO_PAD.decode(signature).ok().and_then(|bytes| p256::ecdsa::Signature::from_slice(&bytes).ok())
    else {
        return false;
    };
    key.verify_prehash(&signing_digest(&format!("{header}.{payload}")), &signature).is_ok()
}
