//! `X-Stamp` parsing and verification over the raw body bytes, for the four API-key schemes.
//!
//! P-256 stamps (what every official client sends) are verified with `ring`, whose assembly
//! P-256 is several times faster than the pure-Rust `p256` crate: in the benchmark's profile,
//! stamp verification was the gateway's largest CPU cost.

use base64::Engine;
use sha2::Digest;

use crate::AuthError;

/// The signature schemes an API-key stamp may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    P256,
    Secp256k1,
    Secp256k1Eip191,
    Ed25519,
}

impl Scheme {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "SIGNATURE_SCHEME_TK_API_P256" => Self::P256,
            "SIGNATURE_SCHEME_TK_API_SECP256K1" => Self::Secp256k1,
            "SIGNATURE_SCHEME_TK_API_SECP256K1_EIP191" => Self::Secp256k1Eip191,
            "SIGNATURE_SCHEME_TK_API_ED25519" => Self::Ed25519,
            _ => return None,
        })
    }
    pub fn wire_name(self) -> &'static str {
        match self {
            Self::P256 => "SIGNATURE_SCHEME_TK_API_P256",
            Self::Secp256k1 => "SIGNATURE_SCHEME_TK_API_SECP256K1",
            Self::Secp256k1Eip191 => "SIGNATURE_SCHEME_TK_API_SECP256K1_EIP191",
            Self::Ed25519 => "SIGNATURE_SCHEME_TK_API_ED25519",
        }
    }
    /// The credential type a key must have been registered with to use this scheme.
    pub fn credential_type(self) -> &'static str {
        match self {
            Self::P256 => "CREDENTIAL_TYPE_API_KEY_P256",
            Self::Secp256k1 | Self::Secp256k1Eip191 => "CREDENTIAL_TYPE_API_KEY_SECP256K1",
            Self::Ed25519 => "CREDENTIAL_TYPE_API_KEY_ED25519",
        }
    }

    /// Whether a stamp of this scheme can come from a credential of `credential_type`: the API
    /// key of its curve, or for P-256 also a session key (OAuth login, stamp login, read-write
    /// session).
    pub fn signs_for(self, credential_type: &str) -> bool {
        credential_type == self.credential_type()
            || (self == Self::P256
                && (SESSION_CREDENTIAL_TYPES.contains(&credential_type)
                    || credential_type == crate::grants::INVITATION_ACCEPTANCE))
    }
}

/// The credential types of session keys and of the credentials one-time codes and email give
/// (all P-256), which stamp like P-256 API keys until they expire.
pub const SESSION_CREDENTIAL_TYPES: &[&str] = &[
    "CREDENTIAL_TYPE_OAUTH_KEY_P256",
    "CREDENTIAL_TYPE_LOGIN",
    "CREDENTIAL_TYPE_READ_WRITE_SESSION_KEY_P256",
    "CREDENTIAL_TYPE_OTP_AUTH_KEY_P256",
    "CREDENTIAL_TYPE_EMAIL_AUTH_KEY_P256",
    "CREDENTIAL_TYPE_RECOVER_USER_KEY_P256",
];

/// A decoded `X-Stamp`: who claims to have signed, and how.
#[derive(Debug, Clone)]
pub struct ApiStamp {
    /// Lowercase hex, as keys are stored.
    pub public_key: String,
    pub scheme: Scheme,
    pub signature: String,
}

fn malformed(detail: &str) -> AuthError {
    AuthError::unauthenticated("SIGNATURE_INVALID", format!("malformed activity stamp: {detail}"))
}

fn invalid_signature() -> AuthError {
    AuthError::unauthenticated("SIGNATURE_INVALID", "could not verify api key signature")
}

/// A stamp header's JSON, base64url (padding optional); `malformed` names what went wrong.
pub(crate) fn decode_header<T: serde::de::DeserializeOwned>(
    header: &str,
    fields: &str,
    malformed: impl Fn(&str) -> AuthError,
) -> Result<T, AuthError> {
    let trimmed = header.trim().trim_end_matches('=');
    let raw =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(trimmed).map_err(|_| malformed("not base64url"))?;
    serde_json::from_slice(&raw).map_err(|_| malformed(&format!("expected JSON with {fields}")))
}

/// Decodes the header value: base64url (padding optional) of `{publicKey, scheme, signature}`.
pub fn parse(header: &str) -> Result<ApiStamp, AuthError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire {
        public_key: String,
        scheme: String,
        signature: String,
    }
    let wire: Wire = decode_header(header, "publicKey, scheme and signature", malformed)?;
    let scheme = Scheme::parse(&wire.scheme).ok_or_else(|| malformed("unknown signature scheme"))?;
    Ok(ApiStamp { public_key: wire.public_key.to_ascii_lowercase(), scheme, signature: wire.signature })
}

/// Verifies the stamp over exactly `body`. High-S and non-minimal DER are accepted.
pub fn verify(stamp: &ApiStamp, body: &[u8]) -> Result<(), AuthError> {
    let pk = hex::decode(&stamp.public_key).map_err(|_| malformed("public key is not hex"))?;
    let sig = hex::decode(stamp.signature.trim_start_matches("0x")).map_err(|_| malformed("signature is not hex"))?;
    match stamp.scheme {
        Scheme::P256 => {
            let point = uncompressed_p256(&pk).ok_or_else(invalid_signature)?;
            let (r, s) = lenient_der(&sig).ok_or_else(invalid_signature)?;
            let mut fixed = [0u8; 64];
            fixed[..32].copy_from_slice(&r);
            fixed[32..].copy_from_slice(&s);
            // ring: SHA-256 of the body, then ECDSA; accepts high-S like the official stampers need.
            ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &point[..])
                .verify(body, &fixed)
                .map_err(|_| invalid_signature())
        }
        Scheme::Secp256k1 | Scheme::Secp256k1Eip191 => {
            use k256::ecdsa::signature::hazmat::PrehashVerifier;
            let vk = k256::ecdsa::VerifyingKey::from_sec1_bytes(&pk).map_err(|_| invalid_signature())?;
            let (r, s) = lenient_der(&sig).ok_or_else(invalid_signature)?;
            let sig = k256::ecdsa::Signature::from_scalars(r, s).map_err(|_| invalid_signature())?;
            let sig = sig.normalize_s().unwrap_or(sig);
            let digest: [u8; 32] = if stamp.scheme == Scheme::Secp256k1 {
                sha2::Sha256::digest(body).into()
            } else {
                let mut h = sha3::Keccak256::new();
                h.update(format!("\x19Ethereum Signed Message:\n{}", body.len()).as_bytes());
                h.update(body);
                h.finalize().into()
            };
            vk.verify_prehash(&digest, &sig).map_err(|_| invalid_signature())
        }
        Scheme::Ed25519 => {
            let pk: [u8; 32] = pk.as_slice().try_into().map_err(|_| invalid_signature())?;
            let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk).map_err(|_| invalid_signature())?;
            let sig: [u8; 64] = sig.as_slice().try_into().map_err(|_| invalid_signature())?;
            vk.verify_strict(body, &ed25519_dalek::Signature::from_bytes(&sig)).map_err(|_| invalid_signature())
        }
    }
}

/// The uncompressed form of a P-256 public key (ring verifies only uncompressed points).
/// Decompression costs a field square root, so recent keys are kept (a small bounded map).
fn uncompressed_p256(sec1: &[u8]) -> Option<[u8; 65]> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<Vec<u8>, [u8; 65]>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(hit) = cache.lock().ok()?.get(sec1) {
        return Some(*hit);
    }
    let key = p256::PublicKey::from_sec1_bytes(sec1).ok()?;
    let point: [u8; 65] = p256::EncodedPoint::from(key).as_bytes().try_into().ok()?;
    let mut map = cache.lock().ok()?;
    if map.len() >= 4096 {
        map.clear();
    }
    map.insert(sec1.to_vec(), point);
    Some(point)
}

/// Parses `SEQUENCE { INTEGER r, INTEGER s }` leniently: integers may carry extra leading zero
/// bytes (`@turnkey/crypto toDerSignature` does not minimize them), which strict DER parsers
/// refuse. Hand-written because no DER crate offers this leniency.
fn lenient_der(der: &[u8]) -> Option<([u8; 32], [u8; 32])> {
    fn len(input: &[u8]) -> Option<(usize, &[u8])> {
        let (&first, rest) = input.split_first()?;
        if first < 0x80 {
            return Some((first as usize, rest));
        }
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 2 || rest.len() < n {
            return None;
        }
        let v = rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
        Some((v, &rest[n..]))
    }
    fn integer(input: &[u8]) -> Option<([u8; 32], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        if tag != 0x02 {
            return None;
        }
        let (n, rest) = len(rest)?;
        if rest.len() < n || n == 0 {
            return None;
        }
        let (value, rest) = rest.split_at(n);
        let first_nonzero = value.iter().position(|b| *b != 0).unwrap_or(value.len());
        let value = &value[first_nonzero..];
        if value.len() > 32 {
            return None;
        }
        let mut out = [0u8; 32];
        out[32 - value.len()..].copy_from_slice(value);
        Some((out, rest))
    }
    let (&tag, rest) = der.split_first()?;
    if tag != 0x30 {
        return None;
    }
    let (n, rest) = len(rest)?;
    if rest.len() != n {
        return None;
    }
    let (r, rest) = integer(rest)?;
    let (s, rest) = integer(rest)?;
    rest.is_empty().then_some((r, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Spec section 2.3 vectors (generated with the official stampers).
    const BODY: &[u8] = br#"{"organizationId":"00000000-0000-4000-8000-000000000000"}"#;
    const P256_PK: &str = "0303b68b7daa21027d1b9ca5b7f6bd65aaa8d99573a8d1984d4168291fe9e3059c";
    const JS_HEADER: &str = "eyJwdWJsaWNLZXkiOiIwMzAzYjY4YjdkYWEyMTAyN2QxYjljYTViN2Y2YmQ2NWFhYThkOTk1NzNhOGQxOTg0ZDQxNjgyOTFmZTllMzA1OWMiLCJzY2hlbWUiOiJTSUdOQVRVUkVfU0NIRU1FX1RLX0FQSV9QMjU2Iiwic2lnbmF0dXJlIjoiMzA0NTAyMjEwMGZiMzcxYTM3YTkwZTM1NDAwMzBhYjIzMDdkNDZmZTgyMmUxMjc1YzQ0MmI1MDFiNTBlMTA3YzgzNTAxNWZmZjAwMjIwMWVlYjhmYjg2MWNmYmY1MGUyNTU1MmJlMTY4Y2ZiMmUzN2QxMzkzZDEyZWM4MDMxZTkxM2IyM2E4ODUxNzI5NSJ9";
    const RUST_HEADER: &str = "eyJwdWJsaWNLZXkiOiIwMzAzYjY4YjdkYWEyMTAyN2QxYjljYTViN2Y2YmQ2NWFhYThkOTk1NzNhOGQxOTg0ZDQxNjgyOTFmZTllMzA1OWMiLCJzaWduYXR1cmUiOiIzMDQ1MDIyMTAwZmIzNzFhMzdhOTBlMzU0MDAzMGFiMjMwN2Q0NmZlODIyZTEyNzVjNDQyYjUwMWI1MGUxMDdjODM1MDE1ZmZmMDAyMjAxZWViOGZiODYxY2ZiZjUwZTI1NTUyYmUxNjhjZmIyZTM3ZDEzOTNkMTJlYzgwMzFlOTEzYjIzYTg4NTE3Mjk1Iiwic2NoZW1lIjoiU0lHTkFUVVJFX1NDSEVNRV9US19BUElfUDI1NiJ9";
    const HIGH_S: &str = "304502206bceede0e4ec7c4f183cf451cd4ef4199d4bd211bc9b3cd1f63147193f6ddd82022100bbe0ddbf45b5933ab2e24d394c5c367ea580a8e3182394e4c77e90652c53cdc4";

    fn stamp(scheme: Scheme, pk: &str, sig: &str) -> ApiStamp {
        ApiStamp { public_key: pk.into(), scheme, signature: sig.into() }
    }

    #[test]
    fn js_and_rust_headers_verify() {
        for h in [JS_HEADER, RUST_HEADER, &format!("{JS_HEADER}==")] {
            let s = parse(h).unwrap();
            assert_eq!(s.public_key, P256_PK);
            assert_eq!(s.scheme, Scheme::P256);
            verify(&s, BODY).unwrap();
        }
    }

    #[test]
    fn changed_body_fails() {
        let s = parse(JS_HEADER).unwrap();
        let err = verify(&s, br#"{"organizationId":"00000000-0000-4000-8000-000000000001"}"#).unwrap_err();
        assert_eq!(err.message, "could not verify api key signature");
        assert_eq!(err.turnkey_code, "SIGNATURE_INVALID");
    }

    #[test]
    fn high_s_node_signature_is_accepted() {
        verify(&stamp(Scheme::P256, P256_PK, HIGH_S), BODY).unwrap();
    }

    #[test]
    fn non_minimal_der_is_accepted() {
        // Re-encode the high-S vector with an extra leading zero on r (length 0x21).
        let sig = hex::decode(HIGH_S).unwrap();
        let r = &sig[4..36];
        let s_tlv = &sig[36..]; // 02 21 00 <s>
        let mut der = vec![0x30, (2 + 33 + s_tlv.len()) as u8, 0x02, 33, 0x00];
        der.extend_from_slice(r);
        der.extend_from_slice(s_tlv);
        verify(&stamp(Scheme::P256, P256_PK, &hex::encode(der)), BODY).unwrap();
    }

    #[test]
    fn secp256k1_vector_verifies_over_sha256_only() {
        let pk = "039179be923264ca85627423a65a4491d21e6a1fb000d8f36e58b700e76934fdbb";
        let sig = "3044022008c2458abb7340375c86d506fae0846120355f8559c063aba289ca08571829460220329f320e0c01c1f15c18ad84ac4bb7f8aaff28e632703d3d261eac596855ae37";
        verify(&stamp(Scheme::Secp256k1, pk, sig), BODY).unwrap();
        assert!(verify(&stamp(Scheme::Secp256k1Eip191, pk, sig), BODY).is_err());
    }

    #[test]
    fn eip191_and_ed25519_round_trip() {
        use k256::ecdsa::signature::hazmat::PrehashSigner;
        let sk = k256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let mut h = sha3::Keccak256::new();
        h.update(format!("\x19Ethereum Signed Message:\n{}", BODY.len()).as_bytes());
        h.update(BODY);
        let sig: k256::ecdsa::Signature = sk.sign_prehash(&h.finalize()).unwrap();
        let pk = hex::encode(sk.verifying_key().to_encoded_point(true).as_bytes());
        verify(&stamp(Scheme::Secp256k1Eip191, &pk, &hex::encode(sig.to_der().as_bytes())), BODY).unwrap();

        use ed25519_dalek::Signer;
        let ek = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
        let esig = ek.sign(BODY);
        let epk = hex::encode(ek.verifying_key().as_bytes());
        verify(&stamp(Scheme::Ed25519, &epk, &hex::encode(esig.to_bytes())), BODY).unwrap();
        assert!(verify(&stamp(Scheme::Ed25519, &epk, &hex::encode(esig.to_bytes())), b"other").is_err());
    }

    #[test]
    fn malformed_headers_are_refused() {
        for h in ["", "!!!", "e30", "eyJwdWJsaWNLZXkiOiIwMyJ9"] {
            let e = parse(h).unwrap_err();
            assert_eq!(e.code, crate::Code::Unauthenticated, "{h}");
            assert!(e.message.starts_with("malformed activity stamp"), "{}", e.message);
        }
        assert!(lenient_der(&[0x30, 0x00]).is_none());
        assert!(lenient_der(&[]).is_none());
    }
}
