//! Replays every corpus and regression file through its target (no fuzzing time), checks that
//! the cargo-fuzz wrappers and corpora match [`TARGETS`], and that the `seed-*` corpus files are
//! what [`seeds`] makes from the crates' test vectors, each taking the path it is meant to
//! (`COFFER_WRITE_SEEDS=1 cargo test -p coffer-fuzz-targets` rewrites them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use coffer_auth::webauthn::b64url;
use coffer_fuzz_targets::{
    Outcome, API_P256_PUBLIC_KEY, API_SECP256K1_PUBLIC_KEY, PASSKEY_PUBLIC_KEY, REGISTRATION_CHALLENGE,
    REGISTRATION_CLIENT_DATA, STAMPED_BODY, TARGETS,
};
use serde_json::json;
use sha2::Digest;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir` (none when it does not exist), sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> =
        entries.map(|e| e.expect("readable directory").path()).filter(|p| p.is_file()).collect();
    out.sort();
    out
}

#[test]
fn every_corpus_and_regression_file_replays() {
    let mut failures = Vec::new();
    for (name, target) in TARGETS {
        let corpus = files(&fuzz_dir().join("corpus").join(name));
        assert!(!corpus.is_empty(), "fuzz/corpus/{name}/ has no seeds");
        let regressions = files(&fuzz_dir().join("regressions").join(name));
        let mut best = Outcome::Rejected;
        for path in corpus.iter().chain(&regressions) {
            let data = std::fs::read(path).expect("readable corpus file");
            match std::panic::catch_unwind(|| target(&data)) {
                Ok(outcome) if corpus.contains(path) => best = best.max(outcome),
                Ok(_) => {}
                Err(_) => failures.push(path.display().to_string()),
            }
        }
        assert_eq!(best, Outcome::Accepted, "no seed of fuzz/corpus/{name}/ takes the success path");
    }
    assert!(failures.is_empty(), "these inputs panicked: {failures:#?}");
}

#[test]
fn wrappers_and_corpora_match_the_targets() {
    let names: BTreeSet<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    let wrappers: BTreeSet<String> = files(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .map(|p| p.file_stem().expect("a file name").to_string_lossy().into_owned())
        .collect();
    assert_eq!(wrappers, names, "fuzz/fuzz_targets/*.rs");
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for name in &names {
        let wrapper = std::fs::read_to_string(fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"))).unwrap();
        assert!(wrapper.contains(&format!("coffer_fuzz_targets::{name}(data)")), "fuzz_targets/{name}.rs");
        assert!(manifest.contains(&format!("name = \"{name}\"")), "fuzz/Cargo.toml has no [[bin]] {name}");
    }
    for dir in ["corpus", "regressions"] {
        for sub in std::fs::read_dir(fuzz_dir().join(dir)).into_iter().flatten() {
            let sub = sub.unwrap().file_name().to_string_lossy().into_owned();
            assert!(names.contains(&sub), "fuzz/{dir}/{sub} belongs to no target");
        }
    }
}

#[test]
fn seed_files_are_current() {
    let write = std::env::var_os("COFFER_WRITE_SEEDS").is_some();
    for (target, name, bytes, expect) in seeds() {
        let run = TARGETS.iter().find(|(t, _)| *t == target).expect("a target").1;
        assert_eq!(run(&bytes), expect, "{target}/seed-{name}");
        let dir = fuzz_dir().join("corpus").join(target);
        let path = dir.join(format!("seed-{name}"));
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let on_disk = std::fs::read(&path).unwrap_or_default();
            assert!(on_disk == bytes, "{} differs from its vector (COFFER_WRITE_SEEDS=1 rewrites it)", path.display());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The seeds, from the test vectors of auth/, policy/ and crypto/.

// auth/src/stamp.rs tests: spec section 2.3 vectors generated with the official stampers.
const JS_HEADER: &str = "eyJwdWJsaWNLZXkiOiIwMzAzYjY4YjdkYWEyMTAyN2QxYjljYTViN2Y2YmQ2NWFhYThkOTk1NzNhOGQxOTg0ZDQxNjgyOTFmZTllMzA1OWMiLCJzY2hlbWUiOiJTSUdOQVRVUkVfU0NIRU1FX1RLX0FQSV9QMjU2Iiwic2lnbmF0dXJlIjoiMzA0NTAyMjEwMGZiMzcxYTM3YTkwZTM1NDAwMzBhYjIzMDdkNDZmZTgyMmUxMjc1YzQ0MmI1MDFiNTBlMTA3YzgzNTAxNWZmZjAwMjIwMWVlYjhmYjg2MWNmYmY1MGUyNTU1MmJlMTY4Y2ZiMmUzN2QxMzkzZDEyZWM4MDMxZTkxM2IyM2E4ODUxNzI5NSJ9";
const RUST_HEADER: &str = "eyJwdWJsaWNLZXkiOiIwMzAzYjY4YjdkYWEyMTAyN2QxYjljYTViN2Y2YmQ2NWFhYThkOTk1NzNhOGQxOTg0ZDQxNjgyOTFmZTllMzA1OWMiLCJzaWduYXR1cmUiOiIzMDQ1MDIyMTAwZmIzNzFhMzdhOTBlMzU0MDAzMGFiMjMwN2Q0NmZlODIyZTEyNzVjNDQyYjUwMWI1MGUxMDdjODM1MDE1ZmZmMDAyMjAxZWViOGZiODYxY2ZiZjUwZTI1NTUyYmUxNjhjZmIyZTM3ZDEzOTNkMTJlYzgwMzFlOTEzYjIzYTg4NTE3Mjk1Iiwic2NoZW1lIjoiU0lHTkFUVVJFX1NDSEVNRV9US19BUElfUDI1NiJ9";
const HIGH_S: &str = "304502206bceede0e4ec7c4f183cf451cd4ef4199d4bd211bc9b3cd1f63147193f6ddd82022100bbe0ddbf45b5933ab2e24d394c5c367ea580a8e3182394e4c77e90652c53cdc4";
const SECP256K1_SIG: &str = "3044022008c2458abb7340375c86d506fae0846120355f8559c063aba289ca08571829460220329f320e0c01c1f15c18ad84ac4bb7f8aaff28e632703d3d261eac596855ae37";

fn api_header(public_key: &str, scheme: &str, signature: &str) -> Vec<u8> {
    b64url(json!({"publicKey": public_key, "scheme": scheme, "signature": signature}).to_string().as_bytes())
        .into_bytes()
}

fn api_stamp_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use ed25519_dalek::Signer as _;
    use k256::ecdsa::signature::hazmat::PrehashSigner;
    use sha3::Digest as _;

    let high_s = hex::decode(HIGH_S).unwrap();
    // The high-S vector with an extra leading zero on r (auth's non_minimal_der_is_accepted).
    let mut non_minimal = vec![0x30, (2 + 33 + high_s[36..].len()) as u8, 0x02, 33, 0x00];
    non_minimal.extend_from_slice(&high_s[4..36]);
    non_minimal.extend_from_slice(&high_s[36..]);
    // auth's eip191_and_ed25519_round_trip keys.
    let k1 = k256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
    let mut h = sha3::Keccak256::new();
    h.update(format!("\x19Ethereum Signed Message:\n{}", STAMPED_BODY.len()).as_bytes());
    h.update(STAMPED_BODY);
    let eip191: k256::ecdsa::Signature = k1.sign_prehash(&h.finalize()).unwrap();
    let ed = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
    vec![
        ("js-header", JS_HEADER.as_bytes().to_vec()),
        ("rust-header", RUST_HEADER.as_bytes().to_vec()),
        ("js-header-padded", format!("{JS_HEADER}==").into_bytes()),
        ("p256-high-s.der", high_s.clone()),
        ("p256-non-minimal.der", non_minimal),
        ("secp256k1.der", hex::decode(SECP256K1_SIG).unwrap()),
        ("secp256k1-header", api_header(API_SECP256K1_PUBLIC_KEY, "SIGNATURE_SCHEME_TK_API_SECP256K1", SECP256K1_SIG)),
        ("p256-high-s-header", api_header(&API_P256_PUBLIC_KEY.to_uppercase(), "SIGNATURE_SCHEME_TK_API_P256", HIGH_S)),
        (
            "eip191-header",
            api_header(
                &hex::encode(k1.verifying_key().to_encoded_point(true).as_bytes()),
                "SIGNATURE_SCHEME_TK_API_SECP256K1_EIP191",
                &format!("0x{}", hex::encode(eip191.to_der().as_bytes())),
            ),
        ),
        (
            "ed25519-header",
            api_header(
                &hex::encode(ed.verifying_key().as_bytes()),
                "SIGNATURE_SCHEME_TK_API_ED25519",
                &hex::encode(ed.sign(STAMPED_BODY).to_bytes()),
            ),
        ),
        ("truncated-json", b"eyJwdWJsaWNLZXkiOiIwMyJ9".to_vec()),
    ]
}

// auth/src/webauthn.rs tests: a software authenticator (`SoftKey`).

use coffer_tests::cbor::{cbor, Cbor};

fn passkey(seed: u8) -> (p256::ecdsa::SigningKey, Vec<u8>) {
    (p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap(), vec![seed; 20])
}

/// The `X-Stamp-Webauthn` header `SoftKey::stamp` makes for `body`.
fn webauthn_header(seed: u8, body: &[u8]) -> String {
    use p256::ecdsa::signature::Signer;
    let (key, id) = passkey(seed);
    let challenge = b64url(&coffer_auth::webauthn::challenge_for(body));
    let cd = format!(
        r#"{{"type":"webauthn.get","challenge":"{challenge}","origin":"https://a.example","crossOrigin":false}}"#
    );
    let mut ad = sha2::Sha256::digest(b"example.com").to_vec();
    ad.push(0x05);
    ad.extend_from_slice(&8u32.to_be_bytes());
    let mut msg = ad.clone();
    msg.extend_from_slice(&sha2::Sha256::digest(cd.as_bytes()));
    let sig: p256::ecdsa::Signature = key.sign(&msg);
    json!({
        "authenticatorData": b64url(&ad),
        "clientDataJson": b64url(cd.as_bytes()),
        "credentialId": b64url(&id),
        "signature": b64url(sig.to_der().as_bytes()),
    })
    .to_string()
}

/// The attestation object `SoftKey::attest` makes over [`REGISTRATION_CLIENT_DATA`].
fn attestation_object(seed: u8, fmt: &'static str) -> Vec<u8> {
    use p256::ecdsa::signature::Signer;
    let (key, id) = passkey(seed);
    let point = key.verifying_key().to_encoded_point(false);
    let cose = Cbor::Map(vec![
        (Cbor::Int(1), Cbor::Int(2)),
        (Cbor::Int(3), Cbor::Int(-7)),
        (Cbor::Int(-1), Cbor::Int(1)),
        (Cbor::Int(-2), Cbor::Bytes(point.x().unwrap().to_vec())),
        (Cbor::Int(-3), Cbor::Bytes(point.y().unwrap().to_vec())),
    ]);
    let mut ad = sha2::Sha256::digest(b"example.com").to_vec();
    ad.push(0x45);
    ad.extend_from_slice(&7u32.to_be_bytes());
    ad.extend_from_slice(&[0xad; 16]);
    ad.extend_from_slice(&(id.len() as u16).to_be_bytes());
    ad.extend_from_slice(&id);
    cbor(&cose, &mut ad);
    let stmt = if fmt == "packed" {
        let mut msg = ad.clone();
        msg.extend_from_slice(&sha2::Sha256::digest(REGISTRATION_CLIENT_DATA.as_bytes()));
        let sig: p256::ecdsa::Signature = key.sign(&msg);
        Cbor::Map(vec![
            (Cbor::Text("alg"), Cbor::Int(-7)),
            (Cbor::Text("sig"), Cbor::Bytes(sig.to_der().as_bytes().to_vec())),
        ])
    } else {
        Cbor::Map(vec![])
    };
    let obj = Cbor::Map(vec![
        (Cbor::Text("fmt"), Cbor::Text(fmt)),
        (Cbor::Text("attStmt"), stmt),
        (Cbor::Text("authData"), Cbor::Bytes(ad)),
    ]);
    let mut out = Vec::new();
    cbor(&obj, &mut out);
    out
}

fn webauthn_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let (key, _) = passkey(6);
    assert_eq!(coffer_auth::webauthn::public_key_hex(key.verifying_key()), PASSKEY_PUBLIC_KEY);
    let header = webauthn_header(6, STAMPED_BODY);
    let mut out = vec![
        ("webauthn_stamp", "json", header.clone().into_bytes()),
        ("webauthn_stamp", "base64url", b64url(header.as_bytes()).into_bytes()),
        ("webauthn_stamp", "other-body", webauthn_header(6, br#"{"organizationId":"o"}"#).into_bytes()),
    ];
    for fmt in ["none", "packed"] {
        let (_, id) = passkey(3);
        let mut input = vec![id.len() as u8];
        input.extend_from_slice(&id);
        input.extend_from_slice(&attestation_object(3, fmt));
        out.push(("webauthn_attestation", fmt, input));
    }
    out
}

// auth/src/envelope.rs and auth/src/grants.rs tests.
fn envelope_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let key = json!({"apiKeyName": "k", "publicKey": API_P256_PUBLIC_KEY.to_uppercase(),
        "curveType": "API_KEY_CURVE_P256", "expirationSeconds": "60"});
    let (_, id) = passkey(3);
    let authenticator = json!({"authenticatorName": "a", "challenge": REGISTRATION_CHALLENGE, "attestation": {
        "credentialId": b64url(&id), "clientDataJson": b64url(REGISTRATION_CLIENT_DATA.as_bytes()),
        "attestationObject": b64url(&attestation_object(3, "packed")), "transports": []}});
    let body = |ty: &str, params: serde_json::Value| {
        json!({"type": ty, "timestampMs": "1", "organizationId": "org", "parameters": params}).to_string().into_bytes()
    };
    let sign = |encoding: &str, payload: &str| {
        json!({"type": "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "timestampMs": 1_746_000_000_000_i64, "organizationId": "org",
            "parameters": {"signWith": "0xabc", "payload": payload, "encoding": encoding, "hashFunction": "HASH_FUNCTION_NO_OP"}})
        .to_string()
        .into_bytes()
    };
    vec![
        (
            "nulls",
            br#"{"type":"T","timestampMs":"5","organizationId":"o","parameters":{"a":null,"b":[{"c":null}]}}"#.to_vec(),
        ),
        ("create-api-keys", body("ACTIVITY_TYPE_CREATE_API_KEYS_V2", json!({"userId": "u", "apiKeys": [key]}))),
        (
            "create-authenticators",
            body("ACTIVITY_TYPE_CREATE_AUTHENTICATORS_V2", json!({"userId": "u", "authenticators": [authenticator]})),
        ),
        (
            "create-users",
            body(
                "ACTIVITY_TYPE_CREATE_USERS_V4",
                json!({"users": [{"userName": "a"}, {"userName": "b", "apiKeys": [key], "authenticators": [authenticator]}]}),
            ),
        ),
        (
            "create-sub-organization",
            body(
                "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8",
                json!({"rootUsers": [{"userName": "a", "apiKeys": [key]}], "wallet": {"accounts": []}}),
            ),
        ),
        ("sign-eip712", sign("PAYLOAD_ENCODING_EIP712", MAIL)),
        ("sign-eip712-hex", sign("PAYLOAD_ENCODING_EIP712", &hex::encode(MAIL))),
        (
            "sign-eip7702",
            sign("PAYLOAD_ENCODING_EIP7702_AUTHORIZATION", r#"{"address":"0xab","chainId":"1","nonce":"7"}"#),
        ),
    ]
}

// policy/src/parser.rs and policy/src/eval.rs tests.
/// Each with how far it gets against `policy_context()`.
const POLICIES: &[(&str, Outcome)] = &[
    ("approvers.any(user, user.id == 'u1')", Outcome::Accepted),
    ("approvers.filter(user, user.tags.contains('t1')).count() >= 2", Outcome::Accepted),
    ("credentials.any(credential, credential.type == 'CREDENTIAL_TYPE_WEBAUTHN_AUTHENTICATOR')", Outcome::Accepted),
    ("credentials.any(credential, credential.public_key == 'pk-u2')", Outcome::Accepted),
    ("eth.tx.to == '0x08d2b0a37F869FF76BACB5Bab3278E26ab7067B7' && eth.tx.data[0..10] == '0xa9059cbb'", Outcome::Accepted),
    ("activity.action == 'SIGN' && wallet.id == 'w1'", Outcome::Accepted),
    ("activity.action == 'SIGN' && private_key.id == 'k1'", Outcome::Accepted),
    ("activity.action == 'EXPORT' && wallet_account.address == '0xabc'", Outcome::Accepted),
    ("activity.resource in ['AUTH', 'OTP'] && activity.action in ['CREATE','VERIFY']", Outcome::Accepted),
    ("activity.kind == 'SIGN_TRANSACTION'", Outcome::Accepted),
    ("eth.tx.chain_id == 11155111", Outcome::Accepted),
    ("eth.tx.contract_call_args['wad'] < 1000000000000000000", Outcome::Accepted),
    ("eth.eip_712.domain.name == 'USD Coin' && eth.eip_712.primary_type == 'Permit' && activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'", Outcome::Accepted),
    ("eth.eip_712.message['permitted'].all(p, p['token'] == '0xA0b8')", Outcome::Accepted),
    ("activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2' && activity.params.hash_function == 'HASH_FUNCTION_NO_OP' && activity.params.encoding != 'PAYLOAD_ENCODING_EIP712'", Outcome::Accepted),
    ("solana.tx.transfers.all(transfer, transfer.to == 'addr1')", Outcome::Accepted),
    ("wallets.any(w, w.id == 'x') || !private_key.exported", Outcome::Accepted),
    ("wallet.id == 'w1' || private_key.id == 'k1'", Outcome::Accepted),
    ("eth.tx.chain_id < 115792089237316195423570985008687907853269984665640564039457584007913129639935", Outcome::Accepted),
    ("eth.tx.value > -5 && eth.tx.value <= 10u", Outcome::Accepted),
    (r"activity.type == 'it\'s \\ ok'", Outcome::Accepted),
    ("!wallet.exported == true", Outcome::Accepted),
    ("(wallet.id == 'a' || wallet.id == 'b') && wallet.id == 'c'", Outcome::Accepted),
    ("time.now >= Timestamp('2025-01-01T00:00:00Z') && time.now < Timestamp('2025-02-01T00:00:00.5Z')", Outcome::Accepted),
    ("CronSpan('0 9 * * 1-5', '8h', 'UTC')", Outcome::Accepted),
    ("CronSpan('0,30 8-17 1,15 1-12 0,7', '1d2h30m', 'Etc/GMT+5')", Outcome::Accepted),
    ("CronSpan('0 9 * * 1-5', '8h', 'America/New_York')", Outcome::Parsed),
    ("eth.tx.data[0..99] == 'x'", Outcome::Parsed),
    ("tron.tx.to == 'T'", Outcome::Parsed),
    ("", Outcome::Accepted),
];

// policy/src/eval.rs and decision.rs tests, and issue 23: policies whose cost grows with a
// list (over the big context), and contexts given as JSON after a NUL byte.
fn policy_cost_seeds() -> Vec<(&'static str, Vec<u8>, Outcome)> {
    let ten = format!("[{}]", ["1"; 10].join(","));
    let with_ctx = |p: &str, ctx: serde_json::Value| {
        let mut b = p.as_bytes().to_vec();
        b.push(0);
        b.extend(ctx.to_string().into_bytes());
        b
    };
    vec![
        ("cronspan-over-wallets", b"wallets.all(w, !CronSpan('0 0 30 2 *', '7d', 'UTC'))".to_vec(), Outcome::Accepted),
        ("deny-list", b"solana.tx.transfers.any(t, t.to in ['a', 'b', 'c', 'd', 'e'])".to_vec(), Outcome::Accepted),
        ("nested-context-lists", b"wallets.all(a, wallets.any(b, a.id == b.id))".to_vec(), Outcome::Accepted),
        (
            "long-text",
            b"eth.tx.data.contains('cd') || eth.tx.data[2..40] == eth.tx.data[4..42]".to_vec(),
            Outcome::Accepted,
        ),
        (
            "nested-literal-lists",
            format!("{ten}.all(a, {ten}.all(b, {ten}.any(c, c == 1)))").into_bytes(),
            Outcome::Accepted,
        ),
        (
            "authorizations",
            b"eth.tx.authorization_list.all(a, a.chain_id == 1) && eth.tx.authorization_list.count() > 0".to_vec(),
            Outcome::Accepted,
        ),
        ("missing-field", with_ctx("eth.tx.chain_id != 1", json!({"eth": {"tx": {"to": "0xc"}}})), Outcome::Accepted),
        (
            "given-context",
            with_ctx(
                "approvers.filter(u, u.tags.contains('t')).count() >= 1",
                json!({"approvers": [{"id": "u", "tags": ["t"]}]}),
            ),
            Outcome::Accepted,
        ),
        ("too-costly", format!("[{}].any(x, x == 0)", vec!["0"; 4_000].join(",")).into_bytes(), Outcome::Rejected),
    ]
}

// crypto/src/sign/eip712.rs tests.
const MAIL: &str = r#"{"types":{"EIP712Domain":[{"name":"name","type":"string"},{"name":"version","type":"string"},{"name":"chainId","type":"uint256"},{"name":"verifyingContract","type":"address"}],"Person":[{"name":"name","type":"string"},{"name":"wallet","type":"address"}],"Mail":[{"name":"from","type":"Person"},{"name":"to","type":"Person"},{"name":"contents","type":"string"}]},"primaryType":"Mail","domain":{"name":"Ether Mail","version":"1","chainId":1,"verifyingContract":"0xCcCCccccCCCCcCCCCCCcCcCccCcCCCcCcccccccC"},"message":{"from":{"name":"Cow","wallet":"0xCD2a3d9F938E13CD947Ec05AbC7FE734Df8DD826"},"to":{"name":"Bob","wallet":"0xbBbBBBBbbBBBbbbBbbBbbbbBBbBbbbbBbBbbBBbB"},"contents":"Hello, Bob!"}}"#;
const MAIL_V4: &str = r#"{"types":{"EIP712Domain":[{"name":"name","type":"string"},{"name":"version","type":"string"},{"name":"chainId","type":"uint256"},{"name":"verifyingContract","type":"address"}],"Person":[{"name":"name","type":"string"},{"name":"wallets","type":"address[]"}],"Mail":[{"name":"from","type":"Person"},{"name":"to","type":"Person[]"},{"name":"contents","type":"string"}],"Group":[{"name":"name","type":"string"},{"name":"members","type":"Person[]"}]},"primaryType":"Mail","domain":{"name":"Ether Mail","version":"1","chainId":1,"verifyingContract":"0xCcCCccccCCCCcCCCCCCcCcCccCcCCCcCcccccccC"},"message":{"from":{"name":"Cow","wallets":["0xCD2a3d9F938E13CD947Ec05AbC7FE734Df8DD826","0xDeaDbeefdEAdbeefdEadbEEFdeadbeEFdEaDbeeF"]},"to":[{"name":"Bob","wallets":["0xbBbBBBBbbBBBbbbBbbBbbbbBBbBbbbbBbBbbBBbB","0xB0BdaBea57B0BDABeA57b0bdABEA57b0BDabEa57","0xB0B0b0b0b0b0B000000000000000000000000000"]}],"contents":"Hello, Bob!"}}"#;

fn eip712_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use coffer_crypto::sign::fuzzing::eip712_digest;
    // The digests crypto's tests check, through the entry point the target uses.
    assert_eq!(
        hex::encode(eip712_digest(MAIL).unwrap()),
        "be609aee343fb3c4b28e1df9e632fca64fcfaede20f02e86244efddf30957bd2"
    );
    assert_eq!(
        hex::encode(eip712_digest(MAIL_V4).unwrap()),
        "a85c2e2b118698e88db68a8105b794a8cc7cec074e89ef991cb4f5f533819cc2"
    );
    let mut derived: serde_json::Value = serde_json::from_str(MAIL).unwrap();
    derived["types"].as_object_mut().unwrap().remove("EIP712Domain");
    derived["domain"]["chainId"] = json!("0x01");
    let atoms = json!({"types": {"M": [
        {"name": "a", "type": "int8"}, {"name": "b", "type": "uint256"}, {"name": "c", "type": "bytes2"},
        {"name": "d", "type": "bytes"}, {"name": "e", "type": "bool"}, {"name": "f", "type": "uint8[2][]"},
        {"name": "g", "type": "int256"}]},
        "primaryType": "M", "domain": {}, "message": {"a": -128, "b": format!("0x{}", "f".repeat(64)), "c": "0xabcd",
        "d": "0x", "e": true, "f": [[1, 2], [3, 4]], "g": "-1", "ignored": 1.5}});
    let domain_only = json!({"types": {}, "primaryType": "EIP712Domain", "domain": {"name": "x", "salt": format!("0x{}", "00".repeat(32))}});
    vec![
        ("mail", MAIL.as_bytes().to_vec()),
        ("mail-v4", MAIL_V4.as_bytes().to_vec()),
        ("derived-domain", derived.to_string().into_bytes()),
        ("atoms", atoms.to_string().into_bytes()),
        ("domain-only", domain_only.to_string().into_bytes()),
    ]
}

// crypto/src/sign/tests.rs (trustwallet/wallet-core's vector, "verified with viem") and
// chain/src/eip7702/tests.rs: the spellings of issue 39 (uppercase delegate, `chainId: "0x0"`).
fn eip7702_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use coffer_crypto::sign::fuzzing::eip7702_digest;
    let vector = r#"{"address":"0xB91aaa96B138A1B1D94c9df4628187132c5F2bf1","chainId":1,"nonce":1}"#;
    let strings = r#"{"address":"0xb91aaa96b138a1b1d94c9df4628187132c5f2bf1","chainId":"0x1","nonce":"1"}"#;
    let digest = "3ae543b2fa103a39a6985d964a67caed05f6b9bb2430ad6d498cda743fe911d9";
    assert_eq!(hex::encode(eip7702_digest(vector).unwrap()), digest);
    assert_eq!(hex::encode(eip7702_digest(strings).unwrap()), digest);
    let uppercase = r#"{"contractAddress":"0XB91AAA96B138A1B1D94C9DF4628187132C5F2BF1","chainId":"0x0","nonce":"0x7"}"#;
    let max = json!({"address": "0xb91aaa96b138a1b1d94c9df4628187132c5f2bf1", "chainId": format!("0x{}", "f".repeat(64)),
        "nonce": "18446744073709551615"});
    let over = format!(
        r#"{{"address":"0xb91aaa96b138a1b1d94c9df4628187132c5f2bf1","chainId":1,"nonce":0{}}}"#,
        " ".repeat(4096)
    );
    vec![
        ("trust-wallet", vector.as_bytes().to_vec()),
        ("strings", strings.as_bytes().to_vec()),
        ("uppercase-contract-address", uppercase.as_bytes().to_vec()),
        ("max", max.to_string().into_bytes()),
        ("over-the-bound", over.into_bytes()),
    ]
}

// chain/src/ethereum/viem-vectors.json, chain/src/solana/web3js-vectors.json, and Tron
// TransferContract raw_data encoded by hand (owner 0x41‖0x11…, to 0x41‖0x22…, 1000 sun; and the
// same of -1000 sun, which coffer_chain::tron refuses before signing).
fn transaction_seeds() -> Vec<(String, Vec<u8>)> {
    let prefixed = |chain: u8, hex_text: &str| {
        let mut out = vec![chain];
        out.extend(hex::decode(hex_text).unwrap());
        out
    };
    let eth: serde_json::Value =
        serde_json::from_str(include_str!("../../chain/src/ethereum/viem-vectors.json")).unwrap();
    let sol: serde_json::Value =
        serde_json::from_str(include_str!("../../chain/src/solana/web3js-vectors.json")).unwrap();
    let mut out: Vec<(String, Vec<u8>)> = eth
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, v)| (format!("eth-{name}"), prefixed(0, v["unsigned"].as_str().unwrap())))
        .collect();
    for name in ["legacy1_unsigned", "legacy2_unsigned", "v0_1_unsigned", "v0_2_unsigned"] {
        out.push((format!("sol-{name}"), prefixed(1, sol[name].as_str().unwrap())));
    }
    let tron_transfer = |amount: i64| {
        let mut transfer = vec![0x0a, 0x15, 0x41];
        transfer.extend([0x11; 20]);
        transfer.extend([0x12, 0x15, 0x41]);
        transfer.extend([0x22; 20]);
        // Field 3, int64 as a varint (a negative one takes ten bytes).
        transfer.push(0x18);
        let mut v = amount as u64;
        while v >= 0x80 {
            transfer.push((v as u8) | 0x80);
            v >>= 7;
        }
        transfer.push(v as u8);
        let mut any = vec![0x12, transfer.len() as u8];
        any.extend(transfer);
        let mut contract = vec![0x08, 0x01, 0x12, any.len() as u8];
        contract.extend(any);
        let mut raw = vec![2u8, 0x0a, 0x02, 0xab, 0xcd, 0x5a, contract.len() as u8];
        raw.extend(contract);
        raw
    };
    out.push(("tron-transfer".into(), tron_transfer(1000)));
    out.push(("tron-transfer-negative".into(), tron_transfer(-1000)));
    out
}

/// A three-link activity log of organization `o`, signed by the fuzz proof key.
fn activity_log_seed() -> Vec<u8> {
    use coffer_auth::proof;
    use p256::ecdsa::signature::Signer;
    let key = p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap();
    let point = coffer_fuzz_targets::proof_fuzz_key();
    let sign = |payload: String| {
        let signature: p256::ecdsa::Signature = key.sign(payload.as_bytes());
        proof::app_proof(&point, payload, &signature.to_bytes().into())
    };
    let (mut previous, mut links, mut activities) = (proof::genesis("o"), Vec::new(), Vec::new());
    for seq in 1..=3u64 {
        let activity = json!({"id": format!("a{seq}"), "organizationId": "o", "type": "T", "fingerprint": format!("f{seq}"),
            "status": "ACTIVITY_STATUS_COMPLETED", "result": {"n": seq}});
        let digest = proof::activity_digest(&activity);
        let head = proof::next_head(&previous, seq, &format!("a{seq}"), &digest);
        let link = proof::LogLink {
            organization_id: "o".into(),
            seq: seq.to_string(),
            activity_id: format!("a{seq}"),
            fingerprint: format!("f{seq}"),
            activity_type: "T".into(),
            status: "ACTIVITY_STATUS_COMPLETED".into(),
            activity_digest: digest,
            previous: previous.clone(),
            head: head.clone(),
        };
        links.push(sign(link.payload(1)));
        activities.push(activity);
        previous = head;
    }
    let head = sign(proof::log_head_payload(2, "o", 3, &previous, Some("00112233445566778899aabbccddeeff")));
    serde_json::to_vec(&proof::ExportedLog {
        organization_id: "o".into(),
        nonce: Some("00112233445566778899aabbccddeeff".into()),
        head,
        links,
        activities,
    })
    .unwrap()
}

/// Every seed: (target, name, bytes, how far it gets).
/// An ES256 OIDC token by the fuzz issuer key, and a client secret sealed to the fuzz receiver.
fn login_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use p256::ecdsa::signature::Signer;
    let header = b64url(br#"{"alg":"ES256","typ":"JWT","kid":"fuzz"}"#);
    let claims = serde_json::json!({"iss": "https://issuer.example", "sub": "user-1", "aud": "client-1",
        "exp": coffer_fuzz_targets::OIDC_FUZZ_NOW + 600, "nonce": "n"});
    let input = format!("{header}.{}", b64url(claims.to_string().as_bytes()));
    let key = p256::ecdsa::SigningKey::from_slice(&[5; 32]).unwrap();
    let signature: p256::ecdsa::Signature = key.sign(input.as_bytes());
    let token = format!("{input}.{}", b64url(&signature.to_bytes()));
    let receiver = p256::SecretKey::from_slice(&coffer_fuzz_targets::QOS_FUZZ_RECEIVER).unwrap();
    let point: [u8; 65] = receiver.public_key().to_sec1_bytes().as_ref().try_into().unwrap();
    let envelope = coffer_crypto::qos::seal_quorum_envelope(b"client-secret", &point, &[9; 32]).unwrap();
    let notarizer = p256::ecdsa::SigningKey::from_slice(&coffer_fuzz_targets::VERIFICATION_TOKEN_FUZZ_KEY).unwrap();
    let claims = serde_json::json!({"id": "t1", "verification_type": "OTP_TYPE_EMAIL", "contact": "a@b.test",
        "organization_id": "o", "public_key": "", "exp": (coffer_fuzz_targets::VERIFICATION_TOKEN_FUZZ_NOW + 600_000).to_string()});
    let (input, digest) = coffer_auth::verification_token::signing_input(&claims);
    let signature: p256::ecdsa::Signature =
        p256::ecdsa::signature::hazmat::PrehashSigner::sign_prehash(&notarizer, &digest).unwrap();
    let verification_token = coffer_auth::verification_token::assemble(&input, &signature.to_bytes().into());
    // A sign-up whose client signature (P-256 secret `[8; 32]`) proves the API key it registers.
    let owner = p256::ecdsa::SigningKey::from_slice(&[8; 32]).unwrap();
    let owner_hex = hex::encode(owner.verifying_key().to_encoded_point(true).as_bytes());
    let mut signup = serde_json::json!({ "subOrganizationName": "s", "rootQuorumThreshold": 1, "rootUsers": [{
        "userName": "u", "apiKeys": [{ "apiKeyName": "w", "publicKey": owner_hex, "curveType": "API_KEY_CURVE_P256" }],
        "authenticators": [], "oauthProviders": [] }] });
    let message = coffer_auth::client_signature::signup_usage(&signup, None).to_string();
    let signature: p256::ecdsa::Signature = owner.sign(message.as_bytes());
    signup["clientSignature"] = serde_json::json!({ "publicKey": owner_hex, "scheme": "CLIENT_SIGNATURE_SCHEME_API_P256",
        "message": message, "signature": hex::encode(signature.to_bytes()) });
    vec![
        ("client_signature", "signup".into(), signup.to_string().into_bytes()),
        ("operator_body", "bootstrap".into(), {
            let p = coffer_auth::operator::BootstrapParameters {
                organization_name: "o".into(),
                root_user_name: "root".into(),
                root_api_public_key: "02ab".into(),
            };
            coffer_auth::operator::bootstrap_body(&p, 1_700_000_000_000)
        }),
        ("operator_body", "rotate-kek".into(), {
            let p = coffer_auth::operator::KekParameters { kek_label: "coffer-kek-v1".into(), blobs_naming_it: 0 };
            coffer_auth::operator::kek_body(coffer_auth::operator::ROTATE_KEK, &p, 1_700_000_000_000)
        }),
        ("operator_body", "destroy-kek".into(), {
            let p = coffer_auth::operator::KekParameters { kek_label: "coffer-kek-v1".into(), blobs_naming_it: 0 };
            coffer_auth::operator::kek_body(coffer_auth::operator::DESTROY_KEK, &p, 1_700_000_000_000)
        }),
        ("canonical_contact", "quoted-tagged".into(), b"\"Victim+1\"@Example.COM".to_vec()),
        ("canonical_contact", "phone".into(), b"+1 (321) 456-7890".to_vec()),
        ("canonical_contact", "gmail-dots".into(), b"V.ic.tim+x@GoogleMail.com".to_vec()),
        ("canonical_contact", "idn".into(), "Victim@EX\u{c4}MPLE.com".as_bytes().to_vec()),
        ("verification_token", "es256".into(), verification_token.into_bytes()),
        ("oidc_token", "es256".into(), token.into_bytes()),
        ("qos_envelope", "hex".into(), hex::encode(&envelope).into_bytes()),
        ("qos_envelope", "raw".into(), envelope),
    ]
}

fn seeds() -> Vec<(&'static str, String, Vec<u8>, Outcome)> {
    use coffer_enclave::hsm::fuzzing::encode;
    let mut out: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    out.extend(api_stamp_seeds().into_iter().map(|(n, b)| ("api_stamp", n.to_string(), b)));
    out.extend(webauthn_seeds().into_iter().map(|(t, n, b)| (t, n.to_string(), b)));
    out.extend(envelope_seeds().into_iter().map(|(n, b)| ("envelope", n.to_string(), b)));
    out.extend(POLICIES.iter().enumerate().map(|(i, (p, _))| ("policy", format!("{i:02}"), p.as_bytes().to_vec())));
    out.extend(policy_cost_seeds().into_iter().map(|(n, b, _)| ("policy_cost", n.to_string(), b)));
    out.extend(eip712_seeds().into_iter().map(|(n, b)| ("eip712", n.to_string(), b)));
    out.extend(eip7702_seeds().into_iter().map(|(n, b)| ("eip7702", n.to_string(), b)));
    // No HSM here, so the sealed blobs are synthetic: well formed, with a made-up ciphertext ‖ tag.
    out.push(("sealed_blob", "v3-caller-iv".into(), encode(3, "coffer-kek-v1", 1, &[7; 12], &[1; 48])));
    out.push(("sealed_blob", "v3-appended-16-byte-iv".into(), encode(3, "coffer-kek-v1", 3, &[6; 16], &[1; 48])));
    out.push(("sealed_blob", "v2".into(), encode(2, "coffer-kek-v1", 0, &[7; 12], &[1; 48])));
    out.push(("sealed_blob", "v1-legacy".into(), encode(1, "coffer-kek-v1", 0, &[9; 12], &[2; 16])));
    out.push(("sealed_blob", "empty-label".into(), encode(2, "", 0, &[0; 12], &[3; 16])));
    out.extend(transaction_seeds().into_iter().map(|(n, b)| ("transaction", n, b)));
    out.extend(login_seeds());
    out.push(("activity_log", "three-links".into(), activity_log_seed()));
    out.into_iter()
        .map(|(target, name, bytes)| {
            let expect = match (target, name.as_str()) {
                ("api_stamp", "truncated-json")
                | ("webauthn_stamp", "other-body")
                | ("transaction", "tron-transfer-negative")
                | ("eip7702", "over-the-bound") => Outcome::Rejected,
                ("policy", i) => POLICIES[i.parse::<usize>().unwrap()].1,
                ("policy_cost", n) => policy_cost_seeds().into_iter().find(|s| s.0 == n).unwrap().2,
                _ => Outcome::Accepted,
            };
            (target, name, bytes, expect)
        })
        .collect()
}
