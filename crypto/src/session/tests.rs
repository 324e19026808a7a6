use super::*;
use p256::ecdsa::signature::hazmat::PrehashSigner as _;
use p256::ecdsa::{Signature, SigningKey};
use serde_json::json;
use sha2::{Digest, Sha256};

/// The RNG seed of a test: 32 copies of `byte`.
fn rng(byte: u8) -> RngSeed {
    RngSeed::from(Zeroizing::new([byte; 32]))
}

/// A session JWT issued by the hosted service, from the tests of `tkhq/sdk`; node's
/// `verifySessionJwtSignature(jwt)` (`@turnkey/crypto` 2.13.2, production notarizer key) accepts it.
const HOSTED_JWT: &str = concat!(
    "eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.",
    "eyJleHAiOjE3NDg4NzY4MzcsInB1YmxpY19rZXkiOiIwMzk5ZmUyYWNlNjIwOGFmMGFkZjg0OGY0NGJjNDgyMTBiNTk0YjdlNjllY2Q5MWVjOTY4ZmQ3NWIzYmI0NDgzMzYiLCJzZXNzaW9uX3R5cGUiOiJTRVNTSU9OX1RZUEVfUkVBRF9XUklURSIsInVzZXJfaWQiOiI2OTEyYjgxOS1mNGRmLTQwZjQtYTE5Mi0yMGVlNDMwOTA5NzQiLCJvcmdhbml6YXRpb25faWQiOiJjNzVlY2IwNy1jODRhLTRkZDUtOTMyYy01MzlkZmFmYzY4NjQifQ.",
    "y6LPW1jlTwc9jFcvCwKJoKfleL_vHnGUr5tRVdMFUCnHvDspSPZ3DWK85tf1znCCBFQ6MYaFOl-1FLb0KcFxqQ",
);
/// `PRODUCTION_NOTARIZER_SIGN_PUBLIC_KEY` of `@turnkey/crypto` (`dist/constants.js`).
const PRODUCTION_NOTARIZER: &str = "04d498aa87ac3bf982ac2b5dd9604d0074905cfbda5d62727c5a237b895e6749205e9f7cd566909c4387f6ca25c308445c60884b788560b785f4a96ac33702a469";

/// Our test notarizer: scalar 0x4e × 32.
const NOTARIZER_SECRET: [u8; 32] = [0x4e; 32];
const NOTARIZER_PUBLIC_HEX: &str = "0443ed99d5b8362791e06d88c768a7103fea80230c0502aa2d8504cd13bfcb62251264554565d8f5989ec6eef3b8e4a967694598ee243342e5d7e757f9f33162f3";
/// `assemble_session_jwt(&claims(), sign)`; node's `verifySessionJwtSignature(NODE_ACCEPTED_JWT,
/// NOTARIZER_PUBLIC_HEX)` returned true, and `@turnkey/core`'s `parseSession` read every claim
/// back, `scope` included.
const NODE_ACCEPTED_JWT: &str = concat!(
    "eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.",
    "eyJleHAiOjE4OTM0NTYwMDAsInB1YmxpY19rZXkiOiIwMmY1ZDFhM2M4YmJiYTFjZmEyYTliZjllN2M0YWMxYzFhOGUyYjVhZTNhM2RmNGU3ZTNiMWUwZjljNmEyZDhiMTAiLCJzZXNzaW9uX3R5cGUiOiJTRVNTSU9OX1RZUEVfUkVBRF9XUklURSIsInVzZXJfaWQiOiIzYjFlOWYzYy04ZjRlLTRkMzktOWYzYS0yYTZmMWI5YzdkMjEiLCJvcmdhbml6YXRpb25faWQiOiJhN2M0ZTJkMS01YjZmLTRlOGEtOWMzZC0xZjJlM2Q0YzViNmEiLCJzY29wZSI6IndhbGxldFx1MDAzZlx1MDAzZVx1MDA3ZVx1MDBlOSJ9.",
    "7J3NDfouSFRxdHCQCgC9vUliUq6vgiizp8jgNB9UqYRwHxZPoOg5kHDSt6T_Ce20X3aYoRXUoacotjxogP5xXw",
);

fn claims() -> Value {
    json!({
        "scope": "wallet?>~é",
        "organization_id": "a7c4e2d1-5b6f-4e8a-9c3d-1f2e3d4c5b6a",
        "user_id": "3b1e9f3c-8f4e-4d39-9f3a-2a6f1b9c7d21",
        "session_type": "SESSION_TYPE_READ_WRITE",
        "public_key": "02f5d1a3c8bbba1cfa2a9bf9e7c4ac1c1a8e2b5ae3a3df4e7e3b1e0f9c6a2d8b10",
        "exp": 1893456000u64,
    })
}

fn soft_sign(digest: &[u8; 32]) -> Result<[u8; 64], CryptoError> {
    let sig: Signature = SigningKey::from_slice(&NOTARIZER_SECRET).unwrap().sign_prehash(digest).unwrap();
    Ok(sig.to_bytes().into())
}

fn part(jwt: &str, i: usize) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(jwt.split('.').nth(i).unwrap()).unwrap()
}

#[test]
fn digest_is_double_sha256() {
    let once = Sha256::digest(b"a.b");
    assert_eq!(session_jwt_signing_digest("a.b").as_slice(), Sha256::digest(once).as_slice());
}

#[test]
fn hosted_jwt_verifies_against_production_notarizer() {
    let key = hex::decode(PRODUCTION_NOTARIZER).unwrap();
    assert!(verify_session_jwt_signature(HOSTED_JWT, &key));
    assert_eq!(part(HOSTED_JWT, 0), SESSION_JWT_HEADER.as_bytes());
    let payload: Value = serde_json::from_slice(&part(HOSTED_JWT, 1)).unwrap();
    let names: Vec<&str> = payload.as_object().unwrap().keys().map(String::as_str).collect();
    let mut required = REQUIRED_CLAIMS.to_vec();
    required.sort_unstable();
    let mut names_sorted = names.clone();
    names_sorted.sort_unstable();
    assert_eq!(names_sorted, required);
    // Our payload writer keeps the hosted byte layout for the same claims.
    assert_eq!(payload_json(&payload).unwrap().as_bytes(), part(HOSTED_JWT, 1));
}

#[test]
fn assembles_the_jwt_node_accepted() {
    let jwt = assemble_session_jwt(&claims(), soft_sign).unwrap();
    assert_eq!(jwt, NODE_ACCEPTED_JWT);
    let public = hex::decode(NOTARIZER_PUBLIC_HEX).unwrap();
    assert_eq!(
        SigningKey::from_slice(&NOTARIZER_SECRET).unwrap().verifying_key().to_encoded_point(false).as_bytes(),
        public
    );
    assert!(verify_session_jwt_signature(&jwt, &public));
    assert!(!verify_session_jwt_signature(&jwt, &hex::decode(PRODUCTION_NOTARIZER).unwrap()));
    let payload: Value = serde_json::from_slice(&part(&jwt, 1)).unwrap();
    assert_eq!(payload, claims());
}

#[test]
fn verifier_refuses_tampering() {
    let public = hex::decode(NOTARIZER_PUBLIC_HEX).unwrap();
    let (input, signature) = NODE_ACCEPTED_JWT.rsplit_once('.').unwrap();
    let other = assemble_session_jwt(
        &json!({"exp": 1u64, "public_key": "02", "session_type": "s", "user_id": "u", "organization_id": "o"}),
        soft_sign,
    )
    .unwrap();
    let other_payload = other.split('.').nth(1).unwrap();
    let swapped = format!("{}.{other_payload}.{signature}", input.split('.').next().unwrap());
    let mut sig = URL_SAFE_NO_PAD.decode(signature).unwrap();
    sig[10] ^= 1;
    let flipped = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&sig));
    for bad in [swapped.as_str(), &flipped, input, "", "a.b.c", &format!("{NODE_ACCEPTED_JWT}.x")] {
        assert!(!verify_session_jwt_signature(bad, &public), "{bad}");
    }
    assert!(!verify_session_jwt_signature(NODE_ACCEPTED_JWT, &public[..33]));
}

#[test]
fn payload_is_always_readable_by_core_parse_session() {
    // Every ASCII character and a few beyond, in a claim value and a claim name.
    let mut tricky: String = (0u8..=0x7f).map(char::from).collect();
    tricky.push_str("é€😀");
    for shift in 0..3 {
        let value = format!("{}{tricky}", "x".repeat(shift));
        let mut c = claims();
        c["scope"] = Value::String(value.clone());
        c[value.as_str()] = json!([value.clone(), {"k?": 1}]);
        let jwt = assemble_session_jwt(&c, soft_sign).unwrap();
        let (input, _) = jwt.rsplit_once('.').unwrap();
        assert!(!input.contains(['-', '_']), "{input}");
        let payload = part(&jwt, 1);
        assert!(payload.is_ascii());
        assert_eq!(serde_json::from_slice::<Value>(&payload).unwrap(), c);
    }
}

#[test]
fn claims_are_checked() {
    let never = |_: &[u8; 32]| -> Result<[u8; 64], CryptoError> { panic!("must not sign") };
    let mut bad = vec![json!([]), json!("x"), json!({})];
    for (name, value) in [
        ("exp", json!("1893456000")),
        ("exp", json!(0)),
        ("exp", json!(-5)),
        ("exp", json!(1.5)),
        ("public_key", json!("")),
        ("session_type", json!(null)),
        ("user_id", json!(7)),
    ] {
        let mut c = claims();
        c[name] = value;
        bad.push(c);
    }
    let mut missing = claims();
    missing.as_object_mut().unwrap().remove("organization_id");
    bad.push(missing);
    for c in bad {
        assert!(matches!(assemble_session_jwt(&c, never), Err(CryptoError::InvalidArgument(_))), "{c}");
    }
}

#[test]
fn signer_errors_pass_through() {
    let err = assemble_session_jwt(&claims(), |_| Err(CryptoError::Internal("hsm down".into()))).unwrap_err();
    assert_eq!(err.to_string(), "internal error: hsm down");
}

/// The client's embedded key: scalar 0x61 × 32.
const EMBEDDED_KEY: [u8; 32] = [0x61; 32];
const EMBEDDED_PUBLIC_HEX: &str = "049a2f9f7997a7fab2453c002b8bdc08fe4c8b6221ce689f771c0ee9067e0e039326f5aa18be3e7365b8d5cc00314c68d89892ea5eca81e56fefe0c59aa2f1326e";
const SESSION_KEY: [u8; 32] = [0x17; 32];
/// `credential_bundle(&rng(0x09), EMBEDDED_PUBLIC_HEX, &SESSION_KEY)`; node's
/// `decryptCredentialBundle(NODE_DECRYPTED_BUNDLE, "61" × 32)` returned `"17" × 32`.
const NODE_DECRYPTED_BUNDLE: &str = "v523gXDvytEo4qGeFJNMb6ihTeBDQ8s2XWe1wQ7F2emtmEEVmV3r2mPrAPD8cP4GCkD9x15jgXscjYPRbYy5zYWP8wkdhJXB5mRofrEaU5S2RxKfXAo";
/// Made by node: `encryptOnRampSecret("node-made credential", compressed EMBEDDED public)`, the
/// same bs58check(compressed encapped ‖ HPKE ciphertext) layout; `decryptCredentialBundle` opens it.
const NODE_MADE_BUNDLE: &str =
    "Aapbhdy4wBUzNLmV8dGEKH5JtbA6aEJWEjqkwUeFaf3P3vty4Gp9MbQJmU49cZYxEpaezEtdYZpYnhNdvQaixvTcMVxSghMZwLF";

#[test]
fn credential_bundle_matches_the_one_node_decrypted() {
    let public = p256::SecretKey::from_slice(&EMBEDDED_KEY).unwrap().public_key();
    assert_eq!(hex::encode(public.to_encoded_point(false).as_bytes()), EMBEDDED_PUBLIC_HEX);
    let bundle = credential_bundle(&rng(0x09), EMBEDDED_PUBLIC_HEX, &SESSION_KEY).unwrap();
    assert_eq!(bundle, NODE_DECRYPTED_BUNDLE);
    assert_eq!(open_credential_bundle(&bundle, &EMBEDDED_KEY).unwrap().as_slice(), SESSION_KEY);
    let raw = bs58::decode(&bundle).with_check(None).into_vec().unwrap();
    assert_eq!(raw.len(), 33 + 32 + 16);
    assert!(raw[0] == 0x02 || raw[0] == 0x03);
    // A compressed target key (and a 0x prefix) gives the same bundle.
    let compressed = format!("0x{}", hex::encode(public.to_encoded_point(true).as_bytes()));
    assert_eq!(credential_bundle(&rng(0x09), &compressed, &SESSION_KEY).unwrap(), bundle);
    assert_ne!(credential_bundle(&rng(0x0a), EMBEDDED_PUBLIC_HEX, &SESSION_KEY).unwrap(), bundle);
}

#[test]
fn opens_a_node_made_bundle() {
    assert_eq!(open_credential_bundle(NODE_MADE_BUNDLE, &EMBEDDED_KEY).unwrap().as_slice(), b"node-made credential");
}

#[test]
fn bad_credential_bundles_and_keys_are_refused() {
    let raw = bs58::decode(NODE_DECRYPTED_BUNDLE).with_check(None).into_vec().unwrap();
    let mut bad = vec![String::new(), "abc".into(), NODE_DECRYPTED_BUNDLE[1..].into()];
    for i in [0, 1, 32, 33, 50, raw.len() - 1] {
        let mut tampered = raw.clone();
        tampered[i] ^= 1;
        bad.push(bs58::encode(tampered).with_check().into_string());
    }
    bad.push(bs58::encode(&raw[..33]).with_check().into_string());
    bad.push(bs58::encode(&raw).into_string());
    for b in &bad {
        let err = open_credential_bundle(b, &EMBEDDED_KEY).unwrap_err();
        assert_eq!(err.to_string(), "invalid credential bundle");
    }
    assert!(open_credential_bundle(NODE_DECRYPTED_BUNDLE, &[0x62; 32]).is_err());
    for target in ["", "04", &EMBEDDED_PUBLIC_HEX[..128], &format!("{EMBEDDED_PUBLIC_HEX}00")] {
        assert!(matches!(credential_bundle(&rng(9), target, &SESSION_KEY), Err(CryptoError::InvalidArgument(_))));
    }
    assert!(credential_bundle(&rng(9), EMBEDDED_PUBLIC_HEX, &[0; 32]).is_err());
}

/// Whatever of the two valid signatures the HSM returns, the token carries the low-S one.
#[test]
fn a_session_token_always_carries_the_low_s_signature() {
    let key = SigningKey::from_slice(&[9u8; 32]).unwrap();
    for high in [false, true] {
        let jwt = assemble_session_jwt(&claims(), |digest| {
            let sig: Signature = key.sign_prehash(digest).unwrap();
            let low = sig.normalize_s().unwrap_or(sig);
            let out = if high { Signature::from_scalars(low.r(), -*low.s()).unwrap() } else { low };
            Ok(out.to_bytes().into())
        })
        .unwrap();
        let sig = URL_SAFE_NO_PAD.decode(jwt.rsplit('.').next().unwrap()).unwrap();
        let sig = Signature::from_slice(&sig).unwrap();
        assert!(sig.normalize_s().is_none(), "high = {high}: the token's signature is high-S");
        let public = key.verifying_key().to_encoded_point(false);
        assert!(coffer_auth_verify(&jwt, public.as_bytes()), "high = {high}");
    }
}

/// A plain ECDSA check of the token's signature over its double-SHA-256 digest, independent of
/// the code under test.
fn coffer_auth_verify(jwt: &str, public: &[u8]) -> bool {
    use p256::ecdsa::signature::hazmat::PrehashVerifier as _;
    let (input, sig) = jwt.rsplit_once('.').unwrap();
    let sig = Signature::from_slice(&URL_SAFE_NO_PAD.decode(sig).unwrap()).unwrap();
    let digest: [u8; 32] = Sha256::digest(Sha256::digest(input.as_bytes())).into();
    p256::ecdsa::VerifyingKey::from_sec1_bytes(public).unwrap().verify_prehash(&digest, &sig).is_ok()
}
