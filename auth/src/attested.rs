//! `X-Stamp-Attested` (what `@turnkey/core`'s `loginWithOauth` sends): a P-256 signature over the
//! body by a new session key, with the OIDC token that attests the key (its `nonce` is the
//! SHA-256 of the key's hex). It authenticates only a login, as the user whose OAuth identity the
//! token names.

use crate::oidc::Claims;
use crate::stamp::{self, ApiStamp, Scheme};
use crate::AuthError;

pub const HEADER: &str = "X-Stamp-Attested";
/// The one attested scheme Coffer accepts: an OIDC token attesting a P-256 key.
pub const SCHEME_P256_OIDC: &str = "STAMP_ATTESTED_SCHEME_P256_OIDC";

/// A decoded `X-Stamp-Attested`.
#[derive(Debug, Clone)]
pub struct AttestedStamp {
    /// The OIDC token (`publicKeyAttestation`).
    pub token: String,
    /// The session key, lowercase hex (compressed P-256).
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
    if w.scheme != SCHEME_P256_OIDC {
        return Err(malformed(&format!("unsupported scheme {:?} (only {SCHEME_P256_OIDC})", w.scheme)));
    }
    Ok(AttestedStamp {
        token: w.public_key_attestation,
        public_key: w.public_key.to_ascii_lowercase(),
        signature: w.signature,
    })
}

/// Verifies the session key's signature over exactly `body`.
pub fn verify_signature(s: &AttestedStamp, body: &[u8]) -> Result<(), AuthError> {
    let api = ApiStamp { public_key: s.public_key.clone(), scheme: Scheme::P256, signature: s.signature.clone() };
    stamp::verify(&api, body)
}

/// Checks that the verified token attests this key: its nonce is the lowercase hex SHA-256 of
/// the key's hex string.
pub fn check_binding(s: &AttestedStamp, claims: &Claims) -> Result<(), AuthError> {
    use sha2::Digest;
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
        let other = parse(&header("STAMP_ATTESTED_SCHEME_P256_VERIFICATION_TOKEN", "t", &key, b"{}")).unwrap_err();
        assert!(other.message.contains("unsupported scheme"));
        assert!(parse("!!").is_err() && parse(&crate::webauthn::b64url(b"{}")).is_err());
    }
}
