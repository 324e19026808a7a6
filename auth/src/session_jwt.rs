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

/// [`verify_signature`] for a token Coffer's enclave issued, which the gateway accepts as a
/// credential (`X-Session`): one token, one string. Of the two valid signatures (`s` and
/// `n - s`) only the low-S one the enclave makes is accepted, so a holder cannot mint a second
/// token with the same claims. (The SDK's own check, and the hosted service's tokens, allow both.)
pub fn verify_issued(jwt: &str, notarizer_public: &[u8]) -> bool {
    let low_s = jwt
        .rsplit('.')
        .next()
        .and_then(|s| URL_SAFE_NO_PAD.decode(s).ok())
        .and_then(|bytes| p256::ecdsa::Signature::from_slice(&bytes).ok())
        .is_some_and(|s| s.normalize_s().is_none());
    low_s && verify_signature(jwt, notarizer_public)
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::hazmat::PrehashSigner as _;

    /// A token signed by `key` with the signature `(r, s)` or its high-S twin `(r, n - s)`.
    fn token(key: &p256::ecdsa::SigningKey, high: bool) -> String {
        let input = format!("{}.{}", URL_SAFE_NO_PAD.encode("{}"), URL_SAFE_NO_PAD.encode(r#"{"a":1}"#));
        let sig: p256::ecdsa::Signature = key.sign_prehash(&signing_digest(&input)).unwrap();
        let low = sig.normalize_s().unwrap_or(sig);
        let sig = if high { p256::ecdsa::Signature::from_scalars(low.r(), -*low.s()).unwrap() } else { low };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.to_bytes()))
    }

    #[test]
    fn the_low_s_signature_verifies_and_its_high_s_twin_does_not() {
        let key = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let public = key.verifying_key().to_encoded_point(false);
        assert!(verify_issued(&token(&key, false), public.as_bytes()));
        assert!(!verify_issued(&token(&key, true), public.as_bytes()), "the malleated twin");
        assert!(verify_signature(&token(&key, true), public.as_bytes()), "which the SDK's check allows");
        let other = p256::ecdsa::SigningKey::from_slice(&[8u8; 32]).unwrap();
        assert!(!verify_issued(&token(&other, false), public.as_bytes()), "another key");
    }
}
