//! The bodies of Coffer's fuzz targets, one per parser of untrusted bytes, as plain functions so
//! that they build and run on stable. `fuzz/fuzz_targets/<name>.rs` wraps each for cargo-fuzz
//! (`make fuzz`, nightly); `tests/corpus.rs` replays every file of `fuzz/corpus/<name>/` and
//! `fuzz/regressions/<name>/` through them on every `make test`.
//!
//! A target never panics on any input: it calls the parser and ignores its refusals. It panics
//! only when an invariant of the code under test breaks (a round trip, an error code, a value a
//! successful parse guarantees), which is a finding. Each returns how far the input got
//! ([`Outcome`]), so the replay can check that the seeds reach the success path; the cargo-fuzz
//! wrappers ignore it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use coffer_auth::webauthn::b64url;
use coffer_policy::eval::Val;
use serde_json::Value;

/// How far an input got.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// The parser refused it.
    Rejected,
    /// It parsed, and a later step refused it (a signature, an evaluation, a grant).
    Parsed,
    /// It took the whole success path: parsed and verified, evaluated, hashed or decoded.
    Accepted,
}

/// A target body.
pub type Target = fn(&[u8]) -> Outcome;

/// Every target, by the name of its `fuzz/fuzz_targets/<name>.rs` and corpus directory.
pub const TARGETS: &[(&str, Target)] = &[
    ("api_stamp", api_stamp),
    ("webauthn_stamp", webauthn_stamp),
    ("webauthn_attestation", webauthn_attestation),
    ("envelope", envelope),
    ("policy", policy),
    ("policy_cost", policy_cost),
    ("eip712", eip712),
    ("eip7702", eip7702),
    ("sealed_blob", sealed_blob),
    ("transaction", transaction),
    ("abi_call", abi_call),
    ("oidc_token", oidc_token),
    ("qos_envelope", qos_envelope),
    ("activity_log", activity_log),
    ("verification_token", verification_token),
    ("client_signature", client_signature),
    ("canonical_contact", canonical_contact),
    ("operator_body", operator_body),
];

/// The issuer key the OIDC token seeds are signed with (P-256 secret `[5; 32]`), kid `fuzz`.
pub fn oidc_fuzz_jwks() -> Value {
    let sk = p256::SecretKey::from_slice(&[5; 32]).expect("a scalar");
    let point = p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&sk.public_key(), false);
    serde_json::json!({ "keys": [coffer_auth::oidc::es256_jwk(point.as_bytes(), "fuzz")] })
}
/// The "now" OIDC tokens are checked at (their `exp` must be later).
pub const OIDC_FUZZ_NOW: i64 = 1_700_000_000;
/// The proof key the activity log seeds are signed with (P-256 secret `[7; 32]`), uncompressed.
pub fn proof_fuzz_key() -> [u8; 65] {
    let sk = p256::SecretKey::from_slice(&[7; 32]).expect("a scalar");
    p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&sk.public_key(), false)
        .as_bytes()
        .try_into()
        .expect("65 bytes")
}

/// An exported activity log, as `coffer-gateway verify-log` reads it from an untrusted file,
/// checked against the fuzz proof key. A log that verifies has every link it holds in its chain; a
/// refusal always says why.
pub fn activity_log(data: &[u8]) -> Outcome {
    let Ok(log) = serde_json::from_slice::<coffer_auth::proof::ExportedLog>(data) else { return Outcome::Rejected };
    match coffer_auth::proof::verify_log(&log, &proof_fuzz_key()) {
        Ok(v) => {
            assert_eq!(v.links as usize, log.links.len(), "a verified log chains every link it holds");
            Outcome::Accepted
        }
        Err(fault) => {
            assert!(!fault.reason.is_empty());
            Outcome::Parsed
        }
    }
}

/// The TLS-fetcher secret the QOS envelope seeds are sealed to.
pub const QOS_FUZZ_RECEIVER: [u8; 32] = [3; 32];

/// The body the stamp seeds are stamped over (the spec section 2.3 vector body of the auth tests).
pub const STAMPED_BODY: &[u8] = br#"{"organizationId":"00000000-0000-4000-8000-000000000000"}"#;
/// The P-256 API key of the spec vectors (auth/src/stamp.rs tests).
pub const API_P256_PUBLIC_KEY: &str = "0303b68b7daa21027d1b9ca5b7f6bd65aaa8d99573a8d1984d4168291fe9e3059c";
/// The secp256k1 API key of the spec vectors.
pub const API_SECP256K1_PUBLIC_KEY: &str = "039179be923264ca85627423a65a4491d21e6a1fb000d8f36e58b700e76934fdbb";
/// The passkey the WebAuthn stamp seeds are signed with (P-256 secret `[6; 32]`, as the auth
/// tests' `SoftKey::new(6)`), compressed SEC1 hex.
pub const PASSKEY_PUBLIC_KEY: &str = "02b0514c4c13540f2397f54719f3332e7ef38e42ad9dc08b71e660ce16b9e88d09";
/// The challenge registrations are checked against (base64url), as the auth tests'.
pub const REGISTRATION_CHALLENGE: &str = "c2lnbi11cC1jaGFsbGVuZ2U";
/// The `clientDataJSON` of every registration the attestation target checks.
pub const REGISTRATION_CLIENT_DATA: &str =
    r#"{"type":"webauthn.create","challenge":"c2lnbi11cC1jaGFsbGVuZ2U","origin":"https://a.example"}"#;

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

// ---------------------------------------------------------------------------------------------
// coffer-auth

/// An OIDC token (`coffer_auth::oidc`): the JWT's parts, header, claims and ES256/RS256 signature
/// against [`oidc_fuzz_jwks`] at [`OIDC_FUZZ_NOW`]; a verified token's identity equals the one
/// read without verification.
pub fn oidc_token(data: &[u8]) -> Outcome {
    use coffer_auth::oidc;
    let Ok(token) = std::str::from_utf8(data) else { return Outcome::Rejected };
    let unverified = oidc::unverified_identity(token);
    match oidc::verify_with_jwks(token, &oidc_fuzz_jwks(), OIDC_FUZZ_NOW) {
        Ok(c) => {
            let (iss, sub, aud) = unverified.expect("a verified token's identity reads without verifying");
            assert_eq!((c.iss.as_str(), c.sub.as_str(), c.aud.as_str()), (iss.as_str(), sub.as_str(), aud.as_str()));
            assert!(c.exp > OIDC_FUZZ_NOW);
            assert_eq!(oidc::identity_hash(&c.iss, &c.sub, &c.aud).len(), 64);
            Outcome::Accepted
        }
        Err(e) => {
            assert_eq!(e.turnkey_code, "INVALID_OIDC_TOKEN");
            if unverified.is_ok() {
                Outcome::Parsed
            } else {
                Outcome::Rejected
            }
        }
    }
}

/// The notarizer key verification token seeds are signed with (P-256 secret `[6; 32]`), and the
/// "now" they are checked at.
pub const VERIFICATION_TOKEN_FUZZ_KEY: [u8; 32] = [6; 32];
pub const VERIFICATION_TOKEN_FUZZ_NOW: i64 = 1_700_000_000_000;

/// A verification token (`coffer_auth::verification_token`), checked against
/// [`VERIFICATION_TOKEN_FUZZ_KEY`]: what verifies reads the same claims unverified, and is unexpired.
pub fn verification_token(data: &[u8]) -> Outcome {
    use coffer_auth::verification_token as vt;
    let Ok(token) = std::str::from_utf8(data) else { return Outcome::Rejected };
    let unverified = vt::unverified_claims(token);
    let key = p256::SecretKey::from_slice(&VERIFICATION_TOKEN_FUZZ_KEY).expect("a scalar");
    let point = p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&key.public_key(), false);
    match vt::verify(token, point.as_bytes(), VERIFICATION_TOKEN_FUZZ_NOW) {
        Some(t) => {
            let c = unverified.expect("a verified token's claims read without verifying");
            assert_eq!(c["contact"].as_str(), Some(t.contact.as_str()));
            assert_eq!(c["id"].as_str(), Some(t.id.as_str()));
            assert!(t.expires_ms > VERIFICATION_TOKEN_FUZZ_NOW);
            Outcome::Accepted
        }
        None if unverified.is_some() => Outcome::Parsed,
        None => Outcome::Rejected,
    }
}

/// A sign-up body (JSON) whose `clientSignature` may prove the API key it registers
/// (`coffer_auth::client_signature`): a key proven is one of the body's, and the signature checks
/// again against it.
pub fn client_signature(data: &[u8]) -> Outcome {
    use coffer_auth::client_signature as cs;
    let Ok(body) = serde_json::from_slice::<Value>(data) else { return Outcome::Rejected };
    match cs::proven_signup_key(&body) {
        Some(key) => {
            let keys = body["rootUsers"][0]["apiKeys"].as_array().expect("a proven key is listed");
            assert!(keys
                .iter()
                .any(|k| k["publicKey"].as_str().is_some_and(|p| p.eq_ignore_ascii_case(&key)
                    || p.strip_prefix("0x").is_some_and(|p| p.eq_ignore_ascii_case(&key)))));
            Outcome::Accepted
        }
        None => Outcome::Parsed,
    }
}

/// A one-time code's contact as a visitor types it (`coffer_auth::verification_token::
/// canonical_contact`, the mailbox limits count): a canonical form is its own canonical form, in
/// lower case, an email address without a `+tag` or quotes and with an ASCII domain (a Gmail one
/// `gmail.com`, its local part without dots), a phone number in E.164.
pub fn canonical_contact(data: &[u8]) -> Outcome {
    use coffer_auth::verification_token::{canonical_contact, is_e164};
    let Ok(text) = std::str::from_utf8(data) else { return Outcome::Rejected };
    let Some(c) = canonical_contact(text) else { return Outcome::Rejected };
    assert_eq!(canonical_contact(&c).as_deref(), Some(c.as_str()), "canonical twice: {text:?}");
    assert_eq!(c.to_lowercase(), c, "{text:?}");
    match c.rsplit_once('@') {
        Some((local, domain)) => {
            assert!(!local.is_empty() && !domain.is_empty() && !local.contains(['+', '"']), "{text:?} → {c:?}");
            assert!(domain.is_ascii() && domain != "googlemail.com", "{text:?} → {c:?}");
            assert!(domain != "gmail.com" || !local.contains('.'), "{text:?} → {c:?}");
        }
        None => assert!(is_e164(&c), "{text:?} → {c:?}"),
    }
    Outcome::Accepted
}

/// An operator's body (`coffer_auth::operator`: a bootstrap, a KEK rotation or destruction), as
/// the enclave reads it from the gateway before it checks the operator's stamp: a body parses as
/// at most one type, and what parses is written back the same way, with the same fingerprint.
pub fn operator_body(data: &[u8]) -> Outcome {
    use coffer_auth::operator::{bootstrap_body, kek_body, parse_bootstrap, parse_kek, DESTROY_KEK, ROTATE_KEK};
    let bootstrap = parse_bootstrap(data).ok();
    let rotate = parse_kek(ROTATE_KEK, data).ok();
    let destroy = parse_kek(DESTROY_KEK, data).ok();
    let parsed = [bootstrap.is_some(), rotate.is_some(), destroy.is_some()].iter().filter(|p| **p).count();
    assert!(parsed <= 1, "one body, one type: {:?}", String::from_utf8_lossy(data));
    if let Some(b) = bootstrap {
        assert_eq!(b.fingerprint, coffer_auth::envelope::fingerprint(data));
        let again = parse_bootstrap(&bootstrap_body(&b.parameters, b.timestamp_ms)).expect("written back");
        assert_eq!((again.parameters, again.timestamp_ms), (b.parameters, b.timestamp_ms));
        return Outcome::Accepted;
    }
    for (kind, body) in [(ROTATE_KEK, rotate), (DESTROY_KEK, destroy)] {
        if let Some(b) = body {
            assert_eq!(b.fingerprint, coffer_auth::envelope::fingerprint(data));
            let again = parse_kek(kind, &kek_body(kind, &b.parameters, b.timestamp_ms)).expect("written back");
            assert_eq!((again.parameters, again.timestamp_ms), (b.parameters, b.timestamp_ms));
            return Outcome::Accepted;
        }
    }
    Outcome::Rejected
}

/// An OAuth 2.0 client secret envelope (`coffer_crypto::qos`): the hex text the SDK sends and,
/// separately, the raw borsh envelope, opened with [`QOS_FUZZ_RECEIVER`] (software ECDH here, the
/// HSM's in the enclave). Refusals never carry plaintext.
pub fn qos_envelope(data: &[u8]) -> Outcome {
    use coffer_crypto::qos;
    let secret = p256::SecretKey::from_slice(&QOS_FUZZ_RECEIVER).expect("a scalar");
    let receiver: [u8; 65] = p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&secret.public_key(), false)
        .as_bytes()
        .try_into()
        .expect("65 bytes");
    let open = |envelope: &[u8]| {
        qos::open_quorum_envelope(envelope, &receiver, |sender| {
            let peer = p256::PublicKey::from_sec1_bytes(sender)
                .map_err(|_| coffer_crypto::CryptoError::invalid("not a point"))?;
            let shared = p256::ecdh::diffie_hellman(secret.to_nonzero_scalar(), peer.as_affine());
            let mut out = zeroize::Zeroizing::new([0u8; 32]);
            out.copy_from_slice(shared.raw_secret_bytes());
            Ok(out)
        })
    };
    let from_text = match std::str::from_utf8(data).map(qos::decode_encrypted_client_secret) {
        Ok(Ok(envelope)) => match open(&envelope) {
            Ok(_) => Outcome::Accepted,
            Err(_) => Outcome::Parsed,
        },
        _ => Outcome::Rejected,
    };
    let raw = match open(data) {
        Ok(_) => Outcome::Accepted,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            Outcome::Rejected
        }
    };
    from_text.max(raw)
}

/// `X-Stamp`: the input as a header value (`coffer_auth::stamp::parse`, then `verify` over
/// [`STAMPED_BODY`]), and as a raw DER signature over that body by the P-256 and secp256k1
/// vector keys (the lenient DER parser, reached directly instead of through base64, JSON and hex).
pub fn api_stamp(data: &[u8]) -> Outcome {
    use coffer_auth::stamp::{self, ApiStamp, Scheme};

    let verified = |s: &ApiStamp| {
        if stamp::verify(s, STAMPED_BODY).is_err() {
            return false;
        }
        // A signature over the body is not one over any other body.
        assert!(stamp::verify(s, b"{}").is_err(), "a stamp verified over two bodies: {s:?}");
        true
    };

    if let Ok(Ok(a)) = std::str::from_utf8(data).map(coffer_auth::attested::parse) {
        assert!(!a.public_key.bytes().any(|b| b.is_ascii_uppercase()), "public keys are lowercased");
        let _ = coffer_auth::attested::verify_signature(&a, STAMPED_BODY);
    }
    let as_header = match std::str::from_utf8(data).map(stamp::parse) {
        Ok(Ok(s)) => {
            assert!(!s.public_key.bytes().any(|b| b.is_ascii_uppercase()), "public keys are lowercased");
            if verified(&s) {
                Outcome::Accepted
            } else {
                Outcome::Parsed
            }
        }
        Ok(Err(e)) => {
            assert_eq!((e.code, e.turnkey_code), (coffer_auth::Code::Unauthenticated, "SIGNATURE_INVALID"));
            Outcome::Rejected
        }
        Err(_) => Outcome::Rejected,
    };
    let as_der = [(Scheme::P256, API_P256_PUBLIC_KEY), (Scheme::Secp256k1, API_SECP256K1_PUBLIC_KEY)]
        .into_iter()
        .map(|(scheme, key)| ApiStamp { public_key: key.into(), scheme, signature: hex::encode(data) })
        .map(|s| if verified(&s) { Outcome::Accepted } else { Outcome::Rejected })
        .max()
        .unwrap_or(Outcome::Rejected);
    as_header.max(as_der)
}

/// `X-Stamp-Webauthn`: `coffer_auth::webauthn::parse_stamp` over [`STAMPED_BODY`] (JSON or
/// base64url JSON, base64url fields, clientDataJSON, authenticator data), then
/// `verify_assertion` (DER signature) with [`PASSKEY_PUBLIC_KEY`].
pub fn webauthn_stamp(data: &[u8]) -> Outcome {
    use coffer_auth::webauthn;

    let Ok(header) = std::str::from_utf8(data) else { return Outcome::Rejected };
    let stamp = match webauthn::parse_stamp(header, STAMPED_BODY) {
        Ok(s) => s,
        Err(e) => {
            assert_eq!(e.code, coffer_auth::Code::Unauthenticated);
            return Outcome::Rejected;
        }
    };
    assert!(stamp.authenticator_data.len() >= 37);
    assert_eq!(webauthn::canonical_credential_id(&stamp.credential_id).as_ref(), Some(&stamp.credential_id));
    match webauthn::verify_assertion(&stamp, PASSKEY_PUBLIC_KEY) {
        Ok(()) => {
            assert!(stamp.authenticator_data[32] & 0x01 != 0, "verified without user presence");
            Outcome::Accepted
        }
        Err(_) => Outcome::Parsed,
    }
}

/// Passkey registration: `coffer_auth::webauthn::verify_registration` (the attestation object's
/// CBOR, authenticator data, COSE key, `packed` self-attestation signature). Input: one byte `n`,
/// the credential id (`n` bytes), then the raw attestation object; the clientDataJSON is
/// [`REGISTRATION_CLIENT_DATA`].
pub fn webauthn_attestation(data: &[u8]) -> Outcome {
    use coffer_auth::webauthn;

    let Some((&n, rest)) = data.split_first() else { return Outcome::Rejected };
    let (id, object) = rest.split_at(usize::from(n).min(rest.len()));
    let (id, client_data) = (b64url(id), b64url(REGISTRATION_CLIENT_DATA.as_bytes()));
    match webauthn::verify_registration(&id, &client_data, &b64url(object), REGISTRATION_CHALLENGE) {
        Ok(r) => {
            assert_eq!(r.credential_id, id);
            assert!(
                r.public_key.len() == 66 && matches!(&r.public_key[..2], "02" | "03") && is_lower_hex(&r.public_key),
                "{}",
                r.public_key
            );
            assert_eq!(r.origin, "https://a.example");
            Outcome::Accepted
        }
        Err(e) => {
            assert_eq!(e.code, coffer_auth::Code::InvalidArgument);
            Outcome::Rejected
        }
    }
}

/// JSON values equal but for the value of floats (serde_json's default float parsing does not
/// promise that printing and re-reading a float gives the same float back).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => x.is_f64() && y.is_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((ka, a), (kb, b))| ka == kb && same_json(a, b))
        }
        _ => a == b,
    }
}

/// The submission envelope: `coffer_auth::envelope::StampedActivity::parse`, the credentials the
/// body grants (`coffer_auth::grants::granted_credentials`, passkey attestations included) and the
/// policy context built from its parameters (the EIP-712 and EIP-7702 payloads in them).
pub fn envelope(data: &[u8]) -> Outcome {
    use coffer_auth::envelope::{fingerprint, strip_nulls, StampedActivity};

    let Ok(a) = StampedActivity::parse(data) else { return Outcome::Rejected };
    assert_eq!(a.fingerprint, fingerprint(data));
    assert!(!a.activity_type.is_empty() && !a.organization_id.is_empty());
    assert!(a.parameters.is_object());
    assert_eq!(strip_nulls(a.parameters.clone()), a.parameters, "parameters keep no nulls");
    // The same submission, re-encoded, is the same activity.
    let again = serde_json::json!({
        "type": a.activity_type, "timestampMs": a.timestamp_ms.to_string(),
        "organizationId": a.organization_id, "parameters": a.parameters,
    });
    let b = StampedActivity::parse(again.to_string().as_bytes()).expect("a re-encoded submission parses");
    assert_eq!(
        (&b.activity_type, b.timestamp_ms, &b.organization_id),
        (&a.activity_type, a.timestamp_ms, &a.organization_id)
    );
    assert!(same_json(&a.parameters, &b.parameters), "{} != {}", a.parameters, b.parameters);

    let facts = coffer_policy::context::ActivityFacts {
        activity_type: &a.activity_type,
        resource: "",
        action: "",
        params: &a.parameters,
        approvals: Vec::new(),
        now: 0,
    };
    let roots = coffer_policy::context::build(&facts, &coffer_policy::context::OrganizationFacts::default());
    assert!(roots.contains_key("activity") && roots.contains_key("time"));

    match coffer_auth::grants::granted_credentials(&a) {
        Ok(grants) => {
            for g in &grants {
                use coffer_auth::grants::{OAUTH_PROVIDER, PARENT_ORGANIZATION};
                if g.credential_type == PARENT_ORGANIZATION {
                    // A sub-organization's parent is the organization that stamped the body.
                    assert!(g.public_key == a.organization_id && g.user_id.is_empty(), "{g:?}");
                    continue;
                }
                assert!(!g.public_key.is_empty() && is_lower_hex(&g.public_key), "{g:?}");
                assert!(
                    g.credential_type.starts_with("CREDENTIAL_TYPE_") || g.credential_type == OAUTH_PROVIDER,
                    "{g:?}"
                );
                assert_ne!(g.expiration_seconds, Some(0));
            }
            Outcome::Accepted
        }
        Err(e) => {
            assert_eq!(e.code, coffer_auth::Code::InvalidArgument);
            Outcome::Parsed
        }
    }
}

// ---------------------------------------------------------------------------------------------
// coffer-policy

/// The fixed context policies are evaluated against: every root the tests' contexts have, with
/// `tron`, `bitcoin` and `tempo` left missing.
pub fn policy_context() -> &'static BTreeMap<String, Val> {
    static ROOTS: OnceLock<BTreeMap<String, Val>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let ctx = serde_json::json!({
            "activity": {"type": "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "kind": "SIGN_RAW_PAYLOAD",
                "resource": "PRIVATE_KEY", "action": "SIGN",
                "params": {"hash_function": "HASH_FUNCTION_NO_OP", "encoding": "PAYLOAD_ENCODING_EIP712"}},
            "approvers": [
                {"id": "u1", "tags": ["t1"], "email": "u1@example.com", "alias": "u1"},
                {"id": "u2", "tags": ["t1", "t2"], "email": "", "alias": "u2"},
            ],
            "credentials": [
                {"id": "cred-u1", "user_id": "u1", "type": "CREDENTIAL_TYPE_API_KEY_P256", "public_key": "pk-u1", "credential_id": ""},
                {"id": "cred-u2", "user_id": "u2", "type": "CREDENTIAL_TYPE_WEBAUTHN_AUTHENTICATOR", "public_key": "pk-u2", "credential_id": "AAAA"},
            ],
            "wallet": {"id": "w1", "imported": false, "exported": false, "label": "w"},
            "wallets": [{"id": "w1", "imported": false, "exported": false, "label": "w"},
                        {"id": "w2", "imported": true, "exported": true, "label": "x"}],
            "wallet_account": {"address": "0xabc"},
            "private_key": {"id": "k1", "tags": ["kt"], "imported": false, "exported": false, "label": "k"},
            "eth": {
                "tx": {"to": "0xc", "chain_id": 11155111, "value": 5, "data": "0xa9059cbb0000",
                       "contract_call_args": {"wad": 5}},
                "eip_712": {"primary_type": "Permit",
                    "domain": {"name": "USD Coin", "version": "2", "chain_id": 1, "verifying_contract": "0xA0b8"},
                    "message": {"permitted": [{"token": "0xA0b8"}, {"token": "0xA0b8"}]}},
            },
            "solana": {"tx": {"transfers": [{"to": "addr1", "amount": 10}]}},
        });
        let Val::Map(mut roots) = Val::from_json(&ctx) else { unreachable!("an object converts to a map") };
        // 2025-01-15T09:30:00Z, a Wednesday.
        let now = Val::Time((1_736_899_200 + 9 * 3_600 + 1_800) * 1_000_000_000);
        roots.insert("time".into(), Val::Map(BTreeMap::from([("now".to_string(), now)])));
        roots
    })
}

/// Policy text: `parse_condition`, `parse_consensus` and `parse_time`; what parses is evaluated
/// (`eval_bool`) against [`policy_context`].
pub fn policy(data: &[u8]) -> Outcome {
    use coffer_policy::{eval, parse_condition, parse_consensus, parse_time, Expr};

    let Ok(src) = std::str::from_utf8(data) else { return Outcome::Rejected };
    let columns = 1..=src.chars().count() + 1;
    let mut outcome = Outcome::Rejected;
    for parse in [parse_condition, parse_consensus, parse_time] {
        let e = match parse(src) {
            Ok(e) => e,
            Err(err) => {
                assert!(columns.contains(&err.column), "column {} outside {columns:?}: {err}", err.column);
                continue;
            }
        };
        assert!(!e.never_bool(), "a parsed policy is boolean: {e:?}");
        // Negating the parenthesized text gives the negation of the same tree (or, at one of
        // the caps the 4 bytes and the node it adds can cross, the cap's error).
        if !src.trim().is_empty() {
            match parse(&format!("!({src})")) {
                Ok(n) => assert!(n == Expr::Not(Box::new(e.clone())), "!({src}) parsed as {n:?}"),
                Err(err) => assert!(
                    ["nests too deeply", "expression too long", "expression too costly"]
                        .iter()
                        .any(|cap| err.message.contains(cap)),
                    "!({src}): {err}"
                ),
            }
        }
        outcome = outcome.max(match eval::eval_bool(&e, policy_context()) {
            Ok(_) => Outcome::Accepted,
            Err(_) => Outcome::Parsed,
        });
    }
    outcome
}

/// A context with long lists and long text: `wallets` and `approvers` (2,000 each),
/// `solana.tx.transfers` (2,000), `eth.tx.data` (100 KB of hex) and `eth.tx.authorization_list`
/// (1,000), over [`policy_context`], so that short policies reach expensive evaluations.
pub fn policy_big_context() -> &'static BTreeMap<String, Val> {
    static ROOTS: OnceLock<BTreeMap<String, Val>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let n = |k: usize| 0..k;
        let big = serde_json::json!({
            "wallets": n(2_000).map(|i| serde_json::json!({"id": format!("w{i}"), "imported": false, "exported": false, "label": "w"})).collect::<Vec<_>>(),
            "approvers": n(2_000).map(|i| serde_json::json!({"id": format!("u{i}"), "tags": ["t1", "t2"], "email": "", "alias": "a"})).collect::<Vec<_>>(),
            "solana": {"tx": {"transfers": n(2_000).map(|i| serde_json::json!({"from": "f", "to": format!("addr{i}"), "amount": i})).collect::<Vec<_>>()}},
            "eth": {"tx": {"to": "0xc", "chain_id": 1, "value": 5, "data": format!("0x{}", "ab".repeat(50_000)),
                "authorization_list": n(1_000).map(|i| serde_json::json!({"address": format!("0x{i:040x}"), "chain_id": 1, "nonce": i})).collect::<Vec<_>>()}},
        });
        let mut roots = policy_context().clone();
        let Val::Map(big) = Val::from_json(&big) else { unreachable!("an object converts to a map") };
        roots.extend(big);
        roots
    })
}

/// The evaluator's cost: policy text, then optionally a NUL byte and a JSON object for the
/// context's roots (`time.now` added when missing). Each clause kind that parses is evaluated
/// against that context (or [`policy_context`]) and [`policy_big_context`] under the step budget
/// ([`coffer_policy::MAX_EVAL_STEPS`]) with the wall-clock backstop out of reach, so the outcome
/// depends on the input alone (whatever the machine, debug or release): an evaluation ends in
/// its own budget's terms, Ok or failed within it, or out of steps past it; and the budget binds
/// exactly, every step counted: given just the steps it took, it ends the same way with the same
/// count, and given one fewer, a success runs out of steps (and a failure stays one). (How long a clause near the budget takes, in
/// time, is the bench's: `make bench`, section "policy cost".)
pub fn policy_cost(data: &[u8]) -> Outcome {
    use coffer_policy::eval::{eval_bool_in, Env, EvalErrorKind};
    use coffer_policy::{parse_condition, parse_consensus, parse_time, EvalLimits, MAX_EVAL_STEPS};

    // A deadline no evaluation reaches: steps alone end one. (A hang would be the fuzzer's
    // timeout.)
    const NO_DEADLINE: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
    let limits = |max_steps: u32| EvalLimits { max_steps, deadline: NO_DEADLINE };
    let (text, ctx) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let Ok(src) = std::str::from_utf8(text) else { return Outcome::Rejected };
    let given = ctx.and_then(|c| serde_json::from_slice::<Value>(c).ok()).and_then(|v| match Val::from_json(&v) {
        Val::Map(mut m) => {
            m.entry("time".into()).or_insert_with(|| policy_context()["time"].clone());
            Some(m)
        }
        _ => None,
    });
    let contexts = [given.as_ref().unwrap_or_else(|| policy_context()), policy_big_context()];
    let mut outcome = Outcome::Rejected;
    for parse in [parse_condition, parse_consensus, parse_time] {
        let Ok(e) = parse(src) else { continue };
        outcome = outcome.max(Outcome::Parsed);
        for roots in contexts {
            let mut env = Env::with_limits(roots, limits(MAX_EVAL_STEPS));
            let result = eval_bool_in(&e, &mut env);
            let steps = env.steps();
            match &result {
                Err(err) if err.is_cost() => {
                    assert_eq!(err.kind, EvalErrorKind::OutOfSteps, "only steps end it: {err:?}");
                    assert!(steps > u64::from(MAX_EVAL_STEPS), "out of steps at {steps}: {err:?}");
                    continue;
                }
                Ok(_) => outcome = Outcome::Accepted,
                Err(_) => {}
            }
            assert!(steps <= u64::from(MAX_EVAL_STEPS), "ended past the budget: {steps} steps: {result:?}");
            // The budget binds exactly: the steps it took suffice, and one fewer does not.
            let exact = u32::try_from(steps).expect("within the budget");
            let mut again = Env::with_limits(roots, limits(exact));
            assert_eq!(eval_bool_in(&e, &mut again), result, "with exactly its {steps} steps");
            assert_eq!(again.steps(), steps, "the same steps again");
            if let Some(fewer) = exact.checked_sub(1) {
                let mut short = Env::with_limits(roots, limits(fewer));
                let r = eval_bool_in(&e, &mut short);
                // A success runs out of steps. A failure stays one: the operands of a comparison,
                // an index or a slice are all evaluated and the first one's failure is reported,
                // even when a later one ran out of steps.
                match &result {
                    Ok(_) => assert!(
                        matches!(&r, Err(err) if err.kind == EvalErrorKind::OutOfSteps),
                        "with {fewer} steps of its {steps}: {r:?}"
                    ),
                    Err(_) => assert!(r.is_err(), "with {fewer} steps of its {steps}: {r:?}"),
                }
            }
        }
    }
    outcome
}

// ---------------------------------------------------------------------------------------------
// coffer-crypto

/// EIP-712 typed data: the input as JSON text into the hasher
/// (`coffer_crypto::sign::fuzzing::eip712_digest`, the digest `sign_payload` signs).
pub fn eip712(data: &[u8]) -> Outcome {
    use coffer_crypto::sign::fuzzing::eip712_digest;

    let Ok(text) = std::str::from_utf8(data) else { return Outcome::Rejected };
    let digest = eip712_digest(text);
    let Ok(doc) = serde_json::from_str::<Value>(text) else {
        assert!(digest.is_err(), "hashed text that is not JSON");
        return Outcome::Rejected;
    };
    // The digest is a function of the document, not of how its JSON is spelled.
    assert_eq!(eip712_digest(&doc.to_string()).ok(), digest.as_ref().ok().copied(), "{text}");
    if digest.is_ok() {
        Outcome::Accepted
    } else {
        Outcome::Parsed
    }
}

/// An EIP-7702 authorization payload (`coffer_chain::eip7702::Authorization::parse`, which
/// `sign_raw_payload` encodes and `eth.eip_7702_authorization` describes): bounded before it is
/// read; what parses has facts that are the values encoded (the address lowercase hex, the chain
/// id and nonce numbers), is the same authorization with the same digest however its JSON spells
/// them, and the gateway's check and facts agree with the signer's parse.
pub fn eip7702(data: &[u8]) -> Outcome {
    use coffer_chain::eip712::{int_val, Int};
    use coffer_chain::eip7702::{Authorization, MAX_AUTHORIZATION_BYTES, PAYLOAD_ENCODING};
    use coffer_crypto::sign::fuzzing::eip7702_digest;

    let Ok(text) = std::str::from_utf8(data) else { return Outcome::Rejected };
    let parsed = Authorization::parse(text);
    let digest = eip7702_digest(text);
    assert_eq!(digest.is_ok(), parsed.is_ok(), "the signer and the parser disagree: {text}");
    assert_eq!(coffer_chain::check_payload(PAYLOAD_ENCODING, text).is_ok(), parsed.is_ok(), "{text}");
    let params = serde_json::json!({"payload": text, "encoding": PAYLOAD_ENCODING});
    assert_eq!(
        coffer_chain::payload_facts(&params).map(|p| (p.name, p.facts)),
        parsed.as_ref().ok().map(|a| ("eip_7702_authorization", a.facts())),
        "{text}"
    );
    let a = match parsed {
        Ok(a) => a,
        Err(e) => {
            if text.len() > MAX_AUTHORIZATION_BYTES {
                assert!(e.0.starts_with("an authorization is at most 4096 bytes"), "{e:?}");
            }
            return Outcome::Rejected;
        }
    };
    assert!(text.len() <= MAX_AUTHORIZATION_BYTES, "{} bytes parsed", text.len());
    assert!(a.nonce[..24].iter().all(|b| *b == 0), "a nonce is a uint64: {text}");
    let nonce = u64::from_be_bytes(a.nonce[24..].try_into().expect("8 bytes"));
    let Val::Map(facts) = a.facts() else { panic!("facts are a map: {text}") };
    assert_eq!(facts.len(), 3, "{facts:?}");
    assert_eq!(facts["address"], Val::Str(format!("0x{}", hex::encode(a.address))), "{text}");
    assert_eq!(facts["chain_id"], int_val(Int { negative: false, magnitude: a.chain_id }), "{text}");
    assert_eq!(facts["nonce"], Val::Int(i128::from(nonce)), "{text}");
    // The values alone decide the authorization and what is signed: a canonical spelling of
    // them (hex chain id, decimal nonce, lowercase address) parses to the same.
    let canonical = serde_json::json!({
        "address": format!("0x{}", hex::encode(a.address)),
        "chainId": format!("0x{}", hex::encode(a.chain_id)),
        "nonce": nonce,
    })
    .to_string();
    assert_eq!(Authorization::parse(&canonical).as_ref(), Ok(&a), "{text} → {canonical}");
    assert_eq!(eip7702_digest(&canonical), digest, "{text} → {canonical}");
    Outcome::Accepted
}

// ---------------------------------------------------------------------------------------------
// coffer-enclave

/// A sealed blob, decoded as the enclave does before asking the HSM to open it
/// (`coffer_enclave::hsm::fuzzing::decode`); no HSM.
pub fn sealed_blob(data: &[u8]) -> Outcome {
    use coffer_enclave::hsm::{fuzzing, is_legacy};

    let Ok((version, kek_label, iv_source, iv, ciphertext)) = fuzzing::decode(data) else { return Outcome::Rejected };
    assert!(matches!(version, 1..=3));
    assert_eq!(is_legacy(data), version == 1);
    assert!(ciphertext.len() >= 16, "the blob holds at least the GCM tag");
    match version {
        3 => assert!((1..=5).contains(&iv_source) && (1..=64).contains(&iv.len()), "a recorded IV origin and length"),
        _ => assert_eq!((iv_source, iv.len()), (0, 12), "versions 1 and 2: a 12-byte caller IV"),
    }
    assert_eq!(fuzzing::encode(version, kek_label, iv_source, iv, ciphertext), data, "decode and encode round-trip");
    Outcome::Accepted
}

// ---------------------------------------------------------------------------------------------
// coffer-chain

/// A contract call decoded with an uploaded ABI: the first byte picks one of [`FUZZ_ABIS`], the
/// rest is the call's arguments (after the function's selector). What decodes stands for no more
/// values than the arguments' own words (offsets that alias one another decode to nothing).
pub fn abi_call(data: &[u8]) -> Outcome {
    use coffer_policy::eval::Val;

    fn leaves(v: &Val) -> usize {
        match v {
            Val::List(l) => l.iter().map(leaves).sum::<usize>() + 1,
            Val::Map(m) => m.values().map(leaves).sum::<usize>() + 1,
            _ => 1,
        }
    }
    let Some((&pick, args)) = data.split_first() else { return Outcome::Rejected };
    let abi = coffer_chain::abi::Abi::parse(FUZZ_ABIS[pick as usize % FUZZ_ABIS.len()]).expect("a fixed ABI");
    let mut call = abi.selectors().next().expect("one function").to_vec();
    call.extend_from_slice(args);
    let Some(facts) = abi.call_facts(&call) else { return Outcome::Rejected };
    let decoded = leaves(&facts["contract_call_args"]);
    assert!(decoded <= 2 * (args.len() + 1024) / 32 + 8, "{decoded} values from {} bytes", args.len());
    Outcome::Accepted
}

/// The ABIs [`abi_call`] decodes with: a token transfer, nested dynamic types an attacker would
/// alias, and types that take no words or lay out millions of values.
pub const FUZZ_ABIS: &[&str] = &[
    r#"[{"type":"function","name":"transfer","inputs":[{"name":"to","type":"address"},{"name":"value","type":"uint256"}],"outputs":[],"stateMutability":"nonpayable"}]"#,
    r#"[{"type":"function","name":"f","inputs":[{"name":"a","type":"uint256[][][]"}],"outputs":[],"stateMutability":"nonpayable"}]"#,
    r#"[{"type":"function","name":"g","inputs":[{"name":"calls","type":"bytes[]"},{"name":"t","type":"tuple[]","components":[{"name":"s","type":"string"},{"name":"k","type":"uint8[2]"}]}],"outputs":[],"stateMutability":"nonpayable"}]"#,
    r#"[{"type":"function","name":"e","inputs":[{"name":"a","type":"tuple[]","components":[]},{"name":"b","type":"uint256[33554432][]"}],"outputs":[],"stateMutability":"nonpayable"}]"#,
];

/// An unsigned transaction: the first byte picks the chain (0 Ethereum, 1 Solana, 2 Tron, modulo
/// 3), the rest is the transaction's bytes as `sign_transaction` carries them after hex. What
/// parses yields policy facts and a signed encoding that keeps what was signed.
pub fn transaction(data: &[u8]) -> Outcome {
    use coffer_chain::{ethereum, solana, tron};

    let Some((&chain, bytes)) = data.split_first() else { return Outcome::Rejected };
    match chain % 3 {
        0 => {
            let Ok(tx) = ethereum::parse(bytes) else { return Outcome::Rejected };
            let _ = tx.facts();
            let signed = tx.signed(&[1; 32], &[2; 32], true);
            assert!(signed.len() > bytes.len(), "a signature adds bytes");
            if bytes[0] < 0xc0 {
                assert_eq!(signed[0], bytes[0], "the signed envelope keeps the type");
            }
        }
        1 => {
            let Ok(tx) = solana::parse(bytes) else { return Outcome::Rejected };
            let _ = tx.facts();
            let signed = tx.signed(0, &[0xaa; 64]);
            assert_eq!(signed.len(), bytes.len(), "signing fills a slot, it adds none");
            assert!(signed.ends_with(tx.message()), "the message is left as given");
            assert_eq!(solana::parse(&signed).map(|t| t.message().to_vec()).ok().as_deref(), Some(tx.message()));
        }
        _ => {
            let Ok(tx) = tron::parse(bytes) else { return Outcome::Rejected };
            let _ = tx.facts();
            let signed = tx.signed(&[1; 32], &[2; 32], 0);
            let again = tron::parse(&signed).expect("a signed transaction parses");
            assert_eq!(again.signing_hash(), tx.signing_hash(), "the signed transaction signs the same raw_data");
        }
    }
    Outcome::Accepted
}
