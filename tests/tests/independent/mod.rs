//! Independent checks of what Coffer signs and encrypts for logins, written against the formats
//! the `@turnkey/*` SDKs read (not against `coffer_crypto`): session JWTs verified with
//! `jsonwebtoken`, credential bundles opened with the `hpke` crate directly. Included by
//! `login.rs` and `enclave_authority.rs`.

use base64::Engine;
use hpke::Deserializable;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use serde_json::Value;
use sha2::Digest;

/// Verifies a session JWT with `jsonwebtoken` against `notarizer` (the uncompressed P-256 key,
/// hex, that `/public/v1/discovery/keys` publishes as `notarizerPublicKey`) and returns its claims.
///
/// Turnkey's session JWTs (`verifySessionJwtSignature` of `@turnkey/crypto`) are ES256 over
/// SHA-256(`header.payload`) rather than over `header.payload`: an ES256 check (which hashes
/// its message with SHA-256) of the 32-byte SHA-256 of the signing input. The header must be
/// `{"alg":"ES256","typ":"JWT"}`; the claims must name the session (`exp`, `public_key`,
/// `session_type`, `user_id`, `organization_id`). Any other outcome fails the test.
#[track_caller]
pub fn verify_session_jwt(jwt: &str, notarizer: &str) -> Value {
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3, "not a compact JWT: {jwt}");
    let header = jsonwebtoken::decode_header(jwt).unwrap_or_else(|e| panic!("JWT header: {e}: {jwt}"));
    assert_eq!(header.alg, jsonwebtoken::Algorithm::ES256, "{jwt}");
    assert_eq!(header.typ.as_deref(), Some("JWT"), "{jwt}");
    let point = hex::decode(notarizer).expect("the notarizer key is hex");
    assert_eq!((point.len(), point[0]), (65, 4), "the notarizer key is an uncompressed point: {notarizer}");
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let key = jsonwebtoken::DecodingKey::from_ec_components(&b64.encode(&point[1..33]), &b64.encode(&point[33..]))
        .expect("the notarizer key as a JWK");
    let digest = sha2::Sha256::digest(format!("{}.{}", parts[0], parts[1]).as_bytes());
    let ok = jsonwebtoken::crypto::verify(parts[2], &digest, &key, jsonwebtoken::Algorithm::ES256)
        .unwrap_or_else(|e| panic!("verifying the session JWT: {e}"));
    assert!(ok, "the session JWT's signature does not verify with the notarizer key {notarizer}: {jwt}");
    let claims: Value =
        serde_json::from_slice(&b64.decode(parts[1]).expect("the payload is base64url")).expect("the payload is JSON");
    for c in ["exp", "public_key", "session_type", "user_id", "organization_id"] {
        assert!(!claims[c].is_null(), "the session JWT has no {c}: {claims}");
    }
    claims
}

/// Opens a credential bundle (`decryptCredentialBundle` of `@turnkey/crypto`) with the target
/// secret `receiver`: base58check of `compressed encapsulated key (33) ‖ ciphertext ‖ tag`,
/// HPKE (RFC 9180) mode Base, DHKEM(P-256, HKDF-SHA256), HKDF-SHA256, AES-256-GCM, info
/// `turnkey_hpke`, AAD = encapsulated key ‖ receiver public key (both uncompressed). Fails the
/// test if the bundle does not open.
#[track_caller]
pub fn open_credential_bundle(bundle: &str, receiver: &[u8; 32]) -> Vec<u8> {
    type Kem = hpke::kem::DhP256HkdfSha256;
    let bytes = bs58::decode(bundle).with_check(None).into_vec().expect("the bundle is base58check");
    assert!(bytes.len() > 33 + 16, "a bundle of {} bytes", bytes.len());
    let (compressed, ciphertext) = bytes.split_at(33);
    assert!(matches!(compressed[0], 2 | 3), "the encapsulated key is not a compressed point");
    let encapped = p256::PublicKey::from_sec1_bytes(compressed)
        .expect("the encapsulated key is a P-256 point")
        .to_encoded_point(false);
    let secret = p256::SecretKey::from_slice(receiver).expect("the receiver key is a P-256 scalar");
    let receiver_public = secret.public_key().to_encoded_point(false);
    let private = <Kem as hpke::Kem>::PrivateKey::from_bytes(receiver).unwrap();
    let encapped_key = <Kem as hpke::Kem>::EncappedKey::from_bytes(encapped.as_bytes()).unwrap();
    let mut ctx = hpke::setup_receiver::<hpke::aead::AesGcm256, hpke::kdf::HkdfSha256, Kem>(
        &hpke::OpModeR::Base,
        &private,
        &encapped_key,
        b"turnkey_hpke",
    )
    .expect("HPKE receiver setup");
    let aad = [encapped.as_bytes(), receiver_public.as_bytes()].concat();
    ctx.open(ciphertext, &aad).expect("the credential bundle opens with the target key")
}

/// The compressed public key (hex) of a P-256 secret, as Coffer stores and lists session keys.
pub fn compressed_public(secret: &[u8]) -> String {
    let key = p256::SecretKey::from_slice(secret).expect("a P-256 secret of 32 bytes");
    hex::encode(key.public_key().to_encoded_point(true).as_bytes())
}
