//! Session JWTs and credential bundles, as the `@turnkey/*` SDKs read them.
//!
//! Session JWT (`verifySessionJwtSignature` of `@turnkey/crypto` 2.13, `dist/turnkey.js`;
//! `parseSession` of `@turnkey/core` 2.8, `dist/utils.js`): compact JWT, header
//! `{"alg":"ES256","typ":"JWT"}`, signature = base64url (no padding) of the 64-byte `r ‖ s` of an
//! ECDSA P-256 signature whose *digest* is SHA-256(SHA-256(`header.payload`)) — not standard
//! ES256. The SDK checks it against the notarizer key, hex uncompressed: a production constant
//! unless the caller passes `dangerouslyOverrideNotarizerPublicKey`. Claims (as the hosted
//! service orders them): `exp` (seconds, a number), `public_key` (the session key, compressed
//! hex), `session_type` (`SESSION_TYPE_READ_WRITE` / `SESSION_TYPE_READ_ONLY`), `user_id`,
//! `organization_id`; `parseSession` also reads optional `session_profile_id` and `scope`.
//!
//! Credential bundle (`decryptCredentialBundle` of `@turnkey/crypto`, `dist/turnkey.js`):
//! base58check (4-byte double-SHA-256 checksum, no version byte) of `compressed encapped key
//! (33) ‖ ciphertext ‖ tag`, the HPKE of [`crate::bundle`] (same suite, info `turnkey_hpke`, AAD
//! `encapped ‖ receiver`, both uncompressed); the plaintext is the 32-byte session private key,
//! which the SDK returns as hex.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use serde_json::Value;
use zeroize::Zeroizing;

use crate::bundle::{hpke_open, hpke_seal, parse_target_public_key};
use crate::error::CryptoError;
use crate::secret::RngSeed;

/// The JOSE header of every session JWT, byte for byte as the hosted service sends it.
pub const SESSION_JWT_HEADER: &str = r#"{"alg":"ES256","typ":"JWT"}"#;

/// The claims every session JWT carries (`parseSession` refuses a token without one), in the
/// order the hosted service writes them.
const REQUIRED_CLAIMS: [&str; 5] = ["exp", "public_key", "session_type", "user_id", "organization_id"];

// The signature's digest and its check are `coffer_auth::session_jwt`'s: the gateway checks
// read-only sessions with them, without this crate.
pub use coffer_auth::session_jwt::{
    signing_digest as session_jwt_signing_digest, verify_signature as verify_session_jwt_signature,
};

/// JSON text of `value` in pure ASCII without `>`, `?`, `~` or DEL: those are written as
/// `\uXXXX`. `@turnkey/core` decodes the payload with a plain-base64 `atob` that drops `-` and
/// `_` and yields Latin-1, and these are exactly the characters whose base64url has `-`/`_` or
/// that are not single bytes; outside strings serde_json writes none of them, so escaping all
/// occurrences is exact.
fn ascii_json(value: &Value) -> Result<String, CryptoError> {
    let text = serde_json::to_string(value).map_err(|_| CryptoError::Internal("cannot serialize claims".into()))?;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() && !matches!(c, '>' | '?' | '~' | '\u{7f}') {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    Ok(out)
}

/// The payload JSON: the required claims first in the hosted order, then the others.
fn payload_json(claims: &Value) -> Result<String, CryptoError> {
    let map = claims.as_object().ok_or_else(|| CryptoError::invalid("session claims must be a JSON object"))?;
    let exp_ok = map.get("exp").and_then(Value::as_u64).is_some_and(|exp| exp > 0);
    let strings_ok =
        REQUIRED_CLAIMS[1..].iter().all(|name| map.get(*name).and_then(Value::as_str).is_some_and(|s| !s.is_empty()));
    if !exp_ok || !strings_ok {
        return Err(CryptoError::invalid(
            "session claims need exp (positive integer) and non-empty public_key, session_type, user_id, organization_id",
        ));
    }
    let ordered =
        REQUIRED_CLAIMS.iter().copied().chain(map.keys().map(String::as_str).filter(|k| !REQUIRED_CLAIMS.contains(k)));
    let mut out = String::from("{");
    for (i, name) in ordered.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&ascii_json(&Value::String(name.to_owned()))?);
        out.push(':');
        out.push_str(&ascii_json(&map[name])?);
    }
    out.push('}');
    Ok(out)
}

/// Assembles and signs a session JWT. `claims` is a JSON object with at least the five required
/// claims (see the module documentation); extra claims follow them. `sign_digest` signs the
/// [`session_jwt_signing_digest`] with the notarizer key and returns `r ‖ s` (either `s`; the
/// SDK's verifier accepts high-S).
pub fn assemble_session_jwt(
    claims: &Value,
    sign_digest: impl FnOnce(&[u8; 32]) -> Result<[u8; 64], CryptoError>,
) -> Result<String, CryptoError> {
    let payload = payload_json(claims)?;
    let signing_input = format!("{}.{}", URL_SAFE_NO_PAD.encode(SESSION_JWT_HEADER), URL_SAFE_NO_PAD.encode(payload));
    if signing_input.contains(['-', '_']) {
        return Err(CryptoError::Internal("session JWT payload not decodable by the SDK".into()));
    }
    let signature = low_s(sign_digest(&session_jwt_signing_digest(&signing_input))?)?;
    Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// A P-256 `r ‖ s` signature with `s` in the lower half of the group order: an HSM's ECDSA gives
/// either of the two valid signatures, and a session token is one string, so it is always this
/// one (`coffer_auth::session_jwt::verify_issued` refuses the other).
fn low_s(signature: [u8; 64]) -> Result<[u8; 64], CryptoError> {
    let sig = p256::ecdsa::Signature::from_slice(&signature)
        .map_err(|_| CryptoError::Internal("the HSM's signature is not a P-256 r ‖ s".into()))?;
    Ok(sig.normalize_s().unwrap_or(sig).to_bytes().into())
}

/// The `credentialBundle` of a session result: `private_key` (the new session's P-256 secret)
/// HPKE-sealed to the client's `targetPublicKey` (hex, uncompressed or compressed, as the SDK
/// sends it), with the ephemeral key drawn from a ChaCha20 RNG seeded with `rng_seed` (HSM
/// randomness; never reuse a seed).
pub fn credential_bundle(
    rng_seed: &RngSeed,
    target_public: &str,
    private_key: &[u8; 32],
) -> Result<String, CryptoError> {
    if p256::SecretKey::from_slice(private_key).is_err() {
        return Err(CryptoError::Internal("session key is not a P-256 scalar".into()));
    }
    sealed_to_target(rng_seed, target_public, private_key)
}

/// Any secret in the credential-bundle format (`bs58check(compressed encapped key ‖ HPKE
/// ciphertext)` to `target_public`), so `decryptCredentialBundle` of `@turnkey/crypto` opens it
/// (it returns the plaintext as hex): the `encrypted_bearer_token` of Coffer's OIDC tokens.
pub fn sealed_to_target(rng_seed: &RngSeed, target_public: &str, plaintext: &[u8]) -> Result<String, CryptoError> {
    let target = parse_target_public_key(target_public)?;
    let (encapped, ciphertext) = hpke_seal(rng_seed, &target, plaintext)?;
    let compressed = p256::PublicKey::from_sec1_bytes(&encapped)
        .map_err(|_| CryptoError::Internal("encapsulated key is not a P-256 point".into()))?
        .to_encoded_point(true);
    let bytes = [compressed.as_bytes(), &ciphertext].concat();
    Ok(bs58::encode(bytes).with_check().into_string())
}

/// Opens a credential bundle with the client's embedded key, as `decryptCredentialBundle` does
/// (for our own test clients). Every malformed or unauthentic bundle gives the same
/// `invalid credential bundle`.
pub fn open_credential_bundle(bundle: &str, embedded_key: &[u8; 32]) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    let invalid = || CryptoError::invalid("invalid credential bundle");
    let bytes = bs58::decode(bundle.trim()).with_check(None).into_vec().map_err(|_| invalid())?;
    if bytes.len() <= 33 {
        return Err(invalid());
    }
    let (compressed, ciphertext) = bytes.split_at(33);
    if compressed[0] != 0x02 && compressed[0] != 0x03 {
        return Err(invalid());
    }
    let encapped = p256::PublicKey::from_sec1_bytes(compressed).map_err(|_| invalid())?.to_encoded_point(false);
    hpke_open(embedded_key, encapped.as_bytes(), ciphertext).ok_or_else(invalid)
}

#[cfg(test)]
mod tests;
