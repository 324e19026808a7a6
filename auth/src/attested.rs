//! `X-Stamp-Attested` (what `@turnkey/core`'s `loginWithOauth` and, from 2.7, `loginWithOtp`
//! send): a P-256 signature over the body by a key that a token attests. With
//! `STAMP_ATTESTED_SCHEME_P256_OIDC` the token is an OIDC token whose `nonce` is the SHA-256 of the
//! key's hex, and the stamp logs in as the user whose OAuth identity it names; with
//! `STAMP_ATTESTED_SCHEME_P256_VERIFICATION_TOKEN` it is a verification token (a one-time code
//! verified) whose `public_key` is the key, and the stamp logs in as the user with its contact.
//! Either authenticates only a `stamp_login`.

use crate::oidc::Claims;
use crate::stamp::{self, ApiStamp, Scheme};
use crate::AuthError;

pub const HEADER: &str = "X-Stamp-Attested";
/// An OIDC token attesting a P-256 key.
pub const SCHEME_P256_OIDC: &str = "STAMP_ATTESTED_SCHEME_P256_OIDC";
/// A verification token attesting a P-256 key (the one the code was verified with).
pub const SCHEME_P256_VERIFICATION_TOKEN: &str = "STAMP_ATTESTED_SCHEME_P256_VERIFICATION_TOKEN";

/// What attests the stamp's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attestation {
    /// An OIDC token ([`SCHEME_P256_OIDC`]).
    Oidc,
    /// A verification token ([`SCHEME_P256_VERIFICATION_TOKEN`]).
    VerificationToken,
}

/// A decoded `X-Stamp-Attested`.
#[derive(Debug, Clone)]
pub struct AttestedStamp {
    pub attestation: Attestation,
    /// The token (`publicKeyAttestation`).
    pub token: String,
    /// The attested key, lowercase hex (compressed P-256).
    pub public_key: String,
    /// DER, hex.
    pub signature: String,
}

fn malformed(detail: &str) -> AuthError {
    AuthError::unauthenticated("SIGNATURE_INVALID", format!("malformed attested stamp: {detail}"))
}

/// Decodes the header value: base64url of `{publicKeyAttestation, scheme, publicKey, signature}`.
pub fn parse(header: &str) -> Result<AttestedStamp, AuthError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire {
        public_key_attestation: String,
        scheme: String,
        public_key: String,
        signature: String,
    }
    let w: Wire = stamp::decode_header(header, "publicKeyAttestation, scheme, publicKey and signature", malformed)?;
    let attestation = match w.scheme.as_str() {
        SCHEME_P256_OIDC => Attestation::Oidc,
        SCHEME_P256_VERIFICATION_TOKEN => Attestation::VerificationToken,
        other => {
            return Err(malformed(&format!(
                "unsupported scheme {other:?} ({SCHEME_P256_OIDC} or {SCHEME_P256_VERIFICATION_TOKEN})"
            )))
        }
    };
    Ok(AttestedStamp {
        attestation,
        token: w.public_key_attestation,
        public_key: w.public_key.to_ascii_lowercase(),
        signature: w.signature,
    })
}

/// Checks that a verification token (its `public_key`, checked by the caller to be genuine)
/// attests this stamp's key.
pub fn check_token_binding(s: &AttestedStamp, token_public_key: &str) -> Result<(), AuthError> {
    if s.attestation != Attestation::VerificationToken || !s.public_key.eq_ignore_ascii_case(token_public_key) {
        return Err(AuthError::unauthenticated(
            "SIGNATURE_INVALID",
            "attested stamp: the verification token does not name the stamp's public key",
        ));
    }
    Ok(())
}

/// Verifies the session key's signature over exactly `body`.
pub fn verify_signature(s: &AttestedStamp, body: &[u8]) -> Result<(), AuthError> {
    let api = ApiStamp { public_key: s.public_key.clone(), scheme: Scheme::P256, signature: s.signature.clone() };
    stamp::verify(&api, body)
}

/// Checks that the verified OIDC token attests this key: its nonce is the lowercase hex SHA-256
/// of the key's hex string.
pub fn check_binding(s: &AttestedStamp, claims: &Claims) -> Result<(), AuthError> {
    use sha2::Digest;
    if s.attestation != Attestation::Oidc {
        return Err(malformed("not an OIDC attestation"));
    }
    let expected = hex::encode(sha2::Sha256::digest(s.public_key.as_bytes()));
    if claims.nonce.as_deref() != Some(expected.as_str()) {
        return Err(AuthError::unauthenticated(
            "SIGNATURE_INVALID",
            "attested stamp: the OIDC token's nonce is not the SHA-256 of the stamp's public key",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer;

    fn header(scheme: &str, token: &str, key: &p256::ecdsa::SigningKey, body: &[u8]) -> String {
        let public = hex::encode(key.verifying_key().to_encoded_point(true).as_bytes());
        let sig: p256::ecdsa::Signature = key.sign(body);
        let json = serde_json::json!({"publicKeyAttestation": token, "scheme": scheme, "publicKey": public,
            "signature": hex::encode(sig.to_der().as_bytes())});
        crate::webauthn::b64url(json.to_string().as_bytes())
    }

    #[test]
    fn parses_verifies_and_binds() {
        let key = p256::ecdsa::SigningKey::from_slice(&[4; 32]).unwrap();
        let s = parse(&header(SCHEME_P256_OIDC, "t.o.k", &key, b"{}")).unwrap();
        assert_eq!(s.token, "t.o.k");
        verify_signature(&s, b"{}").unwrap();
        assert!(verify_signature(&s, b"{ }").is_err(), "another body");
        let nonce = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(s.public_key.as_bytes()));
        let claims =
            |n: &str| Claims { iss: "i".into(), sub: "s".into(), aud: "a".into(), exp: 1, nonce: Some(n.into()) };
        check_binding(&s, &claims(&nonce)).unwrap();
        assert!(check_binding(&s, &claims("00")).is_err());
        let other = parse(&header("STAMP_ATTESTED_SCHEME_P256_OTHER", "t", &key, b"{}")).unwrap_err();
        assert!(other.message.contains("unsupported scheme"));
        let t = parse(&header(SCHEME_P256_VERIFICATION_TOKEN, "v.t.k", &key, b"{}")).unwrap();
        assert_eq!(t.attestation, Attestation::VerificationToken);
        check_token_binding(&t, &t.public_key.to_ascii_uppercase()).unwrap();
        assert!(check_token_binding(&t, "02ab").is_err());
        assert!(check_token_binding(&s, &s.public_key).is_err(), "an OIDC attestation is not a token's");
        assert!(check_binding(&t, &claims(&nonce)).is_err(), "a token's attestation is not an OIDC one");
        assert!(parse("!!").is_err() && parse(&crate::webauthn::b64url(b"{}")).is_err());
    }
}
