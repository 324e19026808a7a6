//! End to end: the enclave decides. These tests play an attacker who owns the gateway: they read
//! and rewrite the database under the running gateway and call the enclave's socket directly.
//! Every attempt to sign, export or certify what no user stamped, just now, for exactly that
//! operation is refused with a clear error and an audit line, and nothing is signed.

use std::time::Duration;

use coffer_proto::v1 as pb;
use coffer_tests::Stack;
use prost::Message;
use serde_json::{json, Value};
use sha2::Digest;
use turnkey_api_key_stamper::{Stamp, TurnkeyP256ApiKey};
use turnkey_client::generated::immutable::common::v1::{AddressFormat, ApiKeyCurve, Curve, Effect, PathFormat};
use turnkey_client::generated::{
    ApiKeyParamsV2, CreateApiKeysIntentV2, CreatePolicyIntentV3, CreateUsersIntentV4, CreateWalletIntent, UserParamsV4,
    WalletAccountParams,
};
use turnkey_client::TurnkeyClient;

/// A raw gRPC client to the enclave, as a taken-over gateway would hold one (no `Custody` seam:
/// these tests send what the seam never would).
type Enclave = coffer_proto::v1::enclave_client::EnclaveClient<coffer_gateway::custody::transport::Transport>;

fn connect(socket: std::path::PathBuf) -> Enclave {
    use coffer_gateway::custody::transport::{connect_all, EnclaveEndpoint};
    Enclave::new(connect_all(vec![EnclaveEndpoint::Unix(socket)]).unwrap())
}

fn db(stack: &Stack) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(stack.database_path()).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c
}

/// The sealed key of the account with `address`, exactly as the gateway would pass it.
fn account_ref(c: &rusqlite::Connection, address: &str) -> pb::SealedRef {
    c.query_row(
        "SELECT id, organization_id, curve, sealed_key, address_format FROM wallet_accounts WHERE address = ?1",
        [address],
        |r| {
            Ok(pb::SealedRef {
                kind: pb::BlobKind::WalletAccountKey as i32,
                resource_id: r.get(0)?,
                organization_id: r.get(1)?,
                curve: r.get(2)?,
                blob: r.get(3)?,
                address: address.to_string(),
                public_key: String::new(),
                address_format: r.get(4)?,
            })
        },
    )
    .unwrap()
}

fn seed_ref(c: &rusqlite::Connection, wallet_id: &str) -> pb::SealedRef {
    c.query_row("SELECT organization_id, sealed_seed FROM wallets WHERE id = ?1", [wallet_id], |r| {
        Ok(pb::SealedRef {
            kind: pb::BlobKind::WalletSeed as i32,
            organization_id: r.get(0)?,
            resource_id: wallet_id.to_string(),
            blob: r.get(1)?,
            ..Default::default()
        })
    })
    .unwrap()
}

fn certificate(c: &rusqlite::Connection, public_key: &str) -> Vec<u8> {
    c.query_row("SELECT certificate FROM api_keys WHERE public_key = ?1", [public_key], |r| r.get(0)).unwrap()
}

fn public_key(key: &TurnkeyP256ApiKey) -> String {
    hex::encode(key.compressed_public_key())
}

fn body(ty: &str, org: &str, timestamp_ms: u128, parameters: Value) -> String {
    json!({"type": ty, "timestampMs": timestamp_ms.to_string(), "organizationId": org, "parameters": parameters})
        .to_string()
}

fn sign_body(org: &str, sign_with: &str, payload: &str, timestamp_ms: u128) -> String {
    body(
        "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
        org,
        timestamp_ms,
        json!({"signWith": sign_with, "payload": payload, "encoding": "PAYLOAD_ENCODING_TEXT_UTF8",
            "hashFunction": "HASH_FUNCTION_KECCAK256"}),
    )
}

/// `body` stamped by `key`, carrying `certificate`.
fn stamped(key: &TurnkeyP256ApiKey, body: &str, certificate: &[u8]) -> pb::StampedRequest {
    let stamp = key.stamp(body.as_bytes()).unwrap();
    pb::StampedRequest {
        body: body.as_bytes().to_vec(),
        stamp_header: stamp.name,
        stamp: stamp.value,
        certificate: certificate.to_vec(),
    }
}

fn auth(request: pb::StampedRequest) -> Option<pb::Authorization> {
    Some(pb::Authorization { request: Some(request), approval: None })
}

async fn sign(
    enclave: &Enclave,
    auth: Option<pb::Authorization>,
    key: &pb::SealedRef,
) -> Result<pb::SignResponse, tonic::Status> {
    let req = pb::SignRequest { auth, key: Some(key.clone()), address_format: String::new() };
    enclave.clone().sign(req).await.map(|r| r.into_inner())
}

/// The enclave refused: the gRPC code and a message naming the failed check.
#[track_caller]
fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: tonic::Code, needle: &str) {
    match r {
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert!(s.message().contains(needle), "expected {needle:?} in {:?}", s.message());
        }
        Ok(v) => panic!("expected a refusal ({needle}), got {v:?}"),
    }
}

/// The Ethereum address that signed keccak256(`message`) with r/s/v (independent of Coffer).
fn recover(message: &[u8], r: &str, s: &str, v: &str) -> String {
    let digest: [u8; 32] = sha3::Keccak256::digest(message).into();
    let sig = k256::ecdsa::Signature::from_slice(&hex::decode(format!("{r}{s}")).unwrap()).unwrap();
    let recid = k256::ecdsa::RecoveryId::from_byte(u8::from_str_radix(v, 16).unwrap()).unwrap();
    let vk = k256::ecdsa::VerifyingKey::recover_from_prehash(&digest, &sig, recid).unwrap();
    let point = vk.to_encoded_point(false);
    let hash = sha3::Keccak256::digest(&point.as_bytes()[1..]);
    format!("0x{}", hex::encode(&hash[12..])).to_lowercase()
}

fn eth_account(index: u32) -> WalletAccountParams {
    WalletAccountParams {
        curve: Curve::Secp256k1,
        path_format: PathFormat::Bip32,
        path: format!("m/44'/60'/0'/0/{index}"),
        address_format: AddressFormat::Ethereum,
        name: None,
    }
}

/// A wallet with two Ethereum accounts: (wallet id, addresses).
async fn wallet(client: &TurnkeyClient<TurnkeyP256ApiKey>, org: &str, name: &str) -> (String, Vec<String>) {
    let intent = CreateWalletIntent {
        wallet_name: name.into(),
        accounts: vec![eth_account(0), eth_account(1)],
        mnemonic_length: None,
    };
    let r = client.create_wallet(org.into(), client.current_timestamp(), intent).await.unwrap().result;
    (r.wallet_id, r.addresses)
}

/// Counts the refusal audit lines the enclave wrote with `reason` in them.
fn audit_refusals(stack: &Stack, reason: &str) -> usize {
    stack
        .enclave_log()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["target"] == "coffer_audit"
                && v["fields"]["decision"] == "refuse"
                && v["fields"]["reason"].as_str().is_some_and(|r| r.contains(reason))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attacker_on_the_enclave_socket_gets_nothing_unstamped() {
    let stack = Stack::start().await;
    let client = stack.client();
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    let (w1, a1) = wallet(&client, &org, "w1").await;
    let (w2, a2) = wallet(&client, &org, "w2").await;
    let c = db(&stack);
    let cert = certificate(&c, &public_key(&root));
    assert!(!cert.is_empty(), "the bootstrap key carries an enclave certificate");
    let (ref1, ref1b) = (account_ref(&c, &a1[0]), account_ref(&c, &a1[1]));
    let enclave = connect(stack.enclave_socket());

    // (1) No stamp at all, or a stamp header that is not one.
    refused(sign(&enclave, None, &ref1).await, tonic::Code::PermissionDenied, "no stamped request");
    let mut no_stamp = stamped(&root, &sign_body(&org, &a1[0], "x", Stack::now_ms()), &cert);
    no_stamp.stamp_header = String::new();
    refused(sign(&enclave, auth(no_stamp), &ref1).await, tonic::Code::PermissionDenied, "no stamp");

    // (2) A genuine stamp whose body names another payload, or another signWith than the key given.
    let genuine = stamped(&root, &sign_body(&org, &a1[0], "pay alice 1", Stack::now_ms()), &cert);
    let mut forged = genuine.clone();
    forged.body = sign_body(&org, &a1[0], "pay mallory 1000", Stack::now_ms()).into_bytes();
    refused(
        sign(&enclave, auth(forged), &ref1).await,
        tonic::Code::PermissionDenied,
        "could not verify api key signature",
    );
    refused(sign(&enclave, auth(genuine), &ref1b).await, tonic::Code::PermissionDenied, "not the one signWith names");
    let other_op = stamped(&root, &body("ACTIVITY_TYPE_CREATE_POLICY_V3", &org, Stack::now_ms(), json!({})), &cert);
    refused(
        sign(&enclave, auth(other_op), &ref1).await,
        tonic::Code::PermissionDenied,
        "does not ask for this operation",
    );

    // (3) A stamped body signs once; the same body again is a replay.
    let once = stamped(&root, &sign_body(&org, &a1[0], "once", Stack::now_ms()), &cert);
    let sig = sign(&enclave, auth(once.clone()), &ref1).await.unwrap().signatures.remove(0);
    assert_eq!(recover(b"once", &sig.r, &sig.s, &sig.v), a1[0].to_lowercase(), "signed by the named account");
    refused(sign(&enclave, auth(once), &ref1).await, tonic::Code::PermissionDenied, "replayed request");

    // (4) Stale and future timestamps (the window is five minutes).
    for ts in [Stack::now_ms() - 6 * 60 * 1000, Stack::now_ms() + 6 * 60 * 1000] {
        let stale = stamped(&root, &sign_body(&org, &a1[0], "stale", ts), &cert);
        refused(sign(&enclave, auth(stale), &ref1).await, tonic::Code::PermissionDenied, "stale or future timestampMs");
    }

    // (5) Credentials the enclave never certified: none, another key's certificate, a forged one,
    // and a bootstrap certificate (new organization only) used on this organization's keys.
    let mallory = TurnkeyP256ApiKey::generate();
    let by_mallory =
        |certificate: &[u8]| stamped(&mallory, &sign_body(&org, &a1[0], "m", Stack::now_ms()), certificate);
    refused(
        sign(&enclave, auth(by_mallory(&[])), &ref1).await,
        tonic::Code::PermissionDenied,
        "no enclave certificate",
    );
    refused(
        sign(&enclave, auth(by_mallory(&cert)), &ref1).await,
        tonic::Code::PermissionDenied,
        "another key than the certified credential",
    );
    let mut fake = pb::CredentialCertificate::decode(cert.as_slice()).unwrap();
    fake.public_key = public_key(&mallory);
    refused(
        sign(&enclave, auth(by_mallory(&fake.encode_to_vec())), &ref1).await,
        tonic::Code::PermissionDenied,
        "certificate is not genuine",
    );
    let boot = enclave
        .clone()
        .bootstrap_organization(pb::BootstrapOrganizationRequest {
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            public_key: public_key(&mallory),
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(boot.organization_id, org, "a bootstrap only ever makes a new organization");
    refused(
        sign(&enclave, auth(by_mallory(&boot.certificate)), &ref1).await,
        tonic::Code::PermissionDenied,
        "belongs to another organization",
    );
    // A genuine create_api_keys body certifies the key it names, not the attacker's.
    let new_key = TurnkeyP256ApiKey::generate();
    let add_key = body(
        "ACTIVITY_TYPE_CREATE_API_KEYS_V2",
        &org,
        Stack::now_ms(),
        json!({"userId": stack.user_id, "apiKeys": [{"apiKeyName": "k", "publicKey": public_key(&new_key),
            "curveType": "API_KEY_CURVE_P256"}]}),
    );
    let spec = |pk: String| pb::CredentialSpec {
        organization_id: org.clone(),
        user_id: stack.user_id.clone(),
        credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
        public_key: pk,
    };
    let issue = pb::IssueCertificatesRequest {
        auth: auth(stamped(&root, &add_key, &cert)),
        credentials: vec![spec(public_key(&mallory))],
    };
    refused(
        enclave.clone().issue_certificates(issue).await,
        tonic::Code::PermissionDenied,
        "not one the stamped body adds",
    );

    // (6) Export: the target key is the stamped body's; the wallet must be the one it names.
    let target = hex::encode(p256::SecretKey::from_slice(&[7u8; 32]).unwrap().public_key().to_sec1_bytes());
    let attacker_target = hex::encode(p256::SecretKey::from_slice(&[8u8; 32]).unwrap().public_key().to_sec1_bytes());
    let export =
        body("ACTIVITY_TYPE_EXPORT_WALLET", &org, Stack::now_ms(), json!({"walletId": w1, "targetPublicKey": target}));
    let mut retargeted = stamped(&root, &export, &cert);
    retargeted.body = export.replace(&target, &attacker_target).into_bytes();
    let req = |a, seed| pb::ExportWalletRequest { auth: a, seed: Some(seed) };
    refused(
        enclave.clone().export_wallet(req(auth(retargeted), seed_ref(&c, &w1))).await,
        tonic::Code::PermissionDenied,
        "could not verify api key signature",
    );
    refused(
        enclave.clone().export_wallet(req(auth(stamped(&root, &export, &cert)), seed_ref(&c, &w2))).await,
        tonic::Code::PermissionDenied,
        "not the wallet the stamped body names",
    );
    refused(
        enclave.clone().export_wallet(req(None, seed_ref(&c, &w1))).await,
        tonic::Code::PermissionDenied,
        "no stamped request",
    );
    let export_account = body(
        "ACTIVITY_TYPE_EXPORT_WALLET_ACCOUNT",
        &org,
        Stack::now_ms(),
        json!({"address": a1[0], "targetPublicKey": target}),
    );
    refused(
        enclave
            .clone()
            .export_key(pb::ExportKeyRequest {
                auth: auth(stamped(&root, &export_account, &cert)),
                key: Some(ref1b.clone()),
            })
            .await,
        tonic::Code::PermissionDenied,
        "not the account the stamped body names",
    );

    // (7) A blob presented under another account's address, or under another curve, does not open.
    let mut swapped = account_ref(&c, &a2[0]);
    (swapped.resource_id, swapped.address) = (ref1.resource_id.clone(), ref1.address.clone());
    let fresh = || stamped(&root, &sign_body(&org, &a1[0], "swap", Stack::now_ms()), &cert);
    refused(sign(&enclave, auth(fresh()), &swapped).await, tonic::Code::FailedPrecondition, "failed authentication");
    let mut recurved = ref1.clone();
    recurved.curve = "CURVE_P256".into();
    refused(sign(&enclave, auth(fresh()), &recurved).await, tonic::Code::FailedPrecondition, "failed authentication");

    // Every refusal above left an audit line naming its reason (and no payload or secret).
    for reason in [
        "no stamped request",
        "could not verify api key signature",
        "not the one signWith names",
        "replayed request",
        "stale or future timestampMs",
        "no enclave certificate",
        "another key than the certified credential",
        "certificate is not genuine",
        "belongs to another organization",
        "not one the stamped body adds",
        "not the wallet the stamped body names",
        "not the account the stamped body names",
    ] {
        assert!(audit_refusals(&stack, reason) >= 1, "no audit line for {reason:?}:\n{}", stack.enclave_log());
    }
    let log = stack.enclave_log();
    assert!(!log.contains("pay mallory") && !log.contains("pay alice"), "payloads never reach the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewriting_the_database_under_the_gateway_signs_nothing() {
    let stack = Stack::start().await;
    let client = stack.client();
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    let (_, a1) = wallet(&client, &org, "w1").await;
    let (_, a2) = wallet(&client, &org, "w2").await;
    let c = db(&stack);
    let sign_path = "/public/v1/submit/sign_raw_payload";
    let activities = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT COUNT(*) FROM activities WHERE organization_id = ?1", [&org], |r| r.get(0)).unwrap()
    };
    let before = activities(&c);

    // (5) An API key row inserted into the database: the gateway accepts its stamp, the enclave
    // does not — without a certificate, and with another credential's certificate copied in.
    let mallory = TurnkeyP256ApiKey::generate();
    c.execute(
        "INSERT INTO api_keys (id, organization_id, user_id, name, public_key, credential_type, expiration_seconds,
            created_at, updated_at, certificate) VALUES ('mallory', ?1, ?2, 'm', ?3, 'CREDENTIAL_TYPE_API_KEY_P256',
            NULL, 0, 0, x'')",
        rusqlite::params![org, stack.user_id, public_key(&mallory)],
    )
    .unwrap();
    let r = stack.post_raw(sign_path, sign_body(&org, &a1[0], "m1", Stack::now_ms()).as_bytes(), Some(&mallory)).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.json["message"].as_str().unwrap().contains("no enclave certificate"), "{}", r.text);
    c.execute(
        "UPDATE api_keys SET certificate = (SELECT certificate FROM api_keys WHERE public_key = ?1) WHERE id = 'mallory'",
        [public_key(&root)],
    )
    .unwrap();
    let r = stack.post_raw(sign_path, sign_body(&org, &a1[0], "m2", Stack::now_ms()).as_bytes(), Some(&mallory)).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.json["message"].as_str().unwrap().contains("another key than the certified credential"), "{}", r.text);

    // (8) An expired key whose expiry was erased from the database: the enclave's certificate
    // still carries it.
    let short = TurnkeyP256ApiKey::generate();
    let intent = CreateApiKeysIntentV2 {
        api_keys: vec![ApiKeyParamsV2 {
            api_key_name: "short".into(),
            public_key: public_key(&short),
            curve_type: ApiKeyCurve::P256,
            expiration_seconds: Some("1".into()),
        }],
        user_id: stack.user_id.clone(),
    };
    client.create_api_keys(org.clone(), client.current_timestamp(), intent).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = stack.post_raw(sign_path, sign_body(&org, &a1[0], "e1", Stack::now_ms()).as_bytes(), Some(&short)).await;
    assert_eq!((r.status, r.json["message"].as_str()), (401, Some("expired api key")), "{}", r.text);
    c.execute("UPDATE api_keys SET expiration_seconds = NULL WHERE public_key = ?1", [public_key(&short)]).unwrap();
    let r = stack.post_raw(sign_path, sign_body(&org, &a1[0], "e2", Stack::now_ms()).as_bytes(), Some(&short)).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.json["message"].as_str().unwrap().contains("the credential has expired"), "{}", r.text);

    // (7) An account row pointed at another account's sealed key: it does not open.
    c.execute(
        "UPDATE wallet_accounts SET sealed_key = (SELECT sealed_key FROM wallet_accounts WHERE address = ?1) WHERE address = ?2",
        [&a2[0], &a1[0]],
    )
    .unwrap();
    let r = stack.post_raw(sign_path, sign_body(&org, &a1[0], "s1", Stack::now_ms()).as_bytes(), Some(&root)).await;
    assert_eq!(r.status, 500, "{}", r.text);
    assert_eq!(r.json["message"], "stored key material failed to open", "{}", r.text);

    // Nothing above was signed or recorded (one create_api_keys activity is the only addition).
    assert_eq!(activities(&c), before + 1);
    assert!(audit_refusals(&stack, "no enclave certificate") >= 1);
    assert!(audit_refusals(&stack, "the credential has expired") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_activity_runs_only_what_its_submitter_stamped() {
    let stack = Stack::start().await;
    let client = stack.client();
    let org = stack.organization_id.clone();
    let (alice, bob) = (TurnkeyP256ApiKey::generate(), TurnkeyP256ApiKey::generate());
    let user = |name: &str, key: &TurnkeyP256ApiKey| UserParamsV4 {
        user_name: name.into(),
        user_email: None,
        user_phone_number: None,
        api_keys: vec![ApiKeyParamsV2 {
            api_key_name: name.into(),
            public_key: public_key(key),
            curve_type: ApiKeyCurve::P256,
            expiration_seconds: None,
        }],
        authenticators: vec![],
        oauth_providers: vec![],
        user_tags: vec![],
    };
    let users = CreateUsersIntentV4 { users: vec![user("alice", &alice), user("bob", &bob)] };
    client.create_users(org.clone(), client.current_timestamp(), users).await.unwrap();
    let (w1, a1) = wallet(&client, &org, "w1").await;
    let policy = CreatePolicyIntentV3 {
        policy_name: "2 of 2".into(),
        effect: Effect::Allow,
        condition: Some(format!("wallet.id == '{w1}'")),
        consensus: Some("approvers.count() >= 2".into()),
        notes: String::new(),
        time: None,
    };
    client.create_policy(org.clone(), client.current_timestamp(), policy).await.unwrap();
    let c = db(&stack);
    let approve = |fingerprint: &str| {
        body("ACTIVITY_TYPE_APPROVE_ACTIVITY", &org, Stack::now_ms(), json!({"fingerprint": fingerprint}))
    };
    // alice asks; the activity waits for a second approver.
    let submit = |payload: &'static str| {
        let body = sign_body(&org, &a1[0], payload, Stack::now_ms());
        let stack = &stack;
        let alice = &alice;
        async move {
            let r = stack.post_raw("/public/v1/submit/sign_raw_payload", body.as_bytes(), Some(alice)).await;
            assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_CONSENSUS_NEEDED", "{}", r.text);
            (
                r.json["activity"]["id"].as_str().unwrap().to_string(),
                r.json["activity"]["fingerprint"].as_str().unwrap().to_string(),
            )
        }
    };

    // The attacker rewrites the waiting activity's payload and the stored body: when bob approves,
    // the forged body's stamp does not verify, and the activity fails without a signature.
    let (id, fingerprint) = submit("pay alice 1").await;
    let (intent, votes): (String, String) = c
        .query_row("SELECT intent, votes FROM activities WHERE id = ?1", [&id], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    c.execute(
        "UPDATE activities SET intent = ?1, votes = ?2 WHERE id = ?3",
        rusqlite::params![
            intent.replace("pay alice 1", "pay mallory 1000"),
            votes.replace("pay alice 1", "pay mallory 1000"),
            id
        ],
    )
    .unwrap();
    let r = stack.post_raw("/public/v1/submit/approve_activity", approve(&fingerprint).as_bytes(), Some(&bob)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_FAILED", "{}", r.text);
    assert!(r.json["activity"]["failure"]["message"].as_str().unwrap().contains("enclave refused"), "{}", r.text);
    assert_eq!(r.json["activity"]["result"], json!({}));

    // Rewriting only the stored intent changes nothing: the enclave signs what alice stamped.
    let (id, fingerprint) = submit("pay alice 2").await;
    c.execute("UPDATE activities SET intent = replace(intent, 'pay alice 2', 'pay mallory 2') WHERE id = ?1", [&id])
        .unwrap();
    let approval = approve(&fingerprint);
    let r = stack.post_raw("/public/v1/submit/approve_activity", approval.as_bytes(), Some(&bob)).await;
    assert_eq!(r.json["activity"]["status"], "ACTIVITY_STATUS_COMPLETED", "{}", r.text);
    let sig = &r.json["activity"]["result"]["signRawPayloadResult"];
    let signer =
        recover(b"pay alice 2", sig["r"].as_str().unwrap(), sig["s"].as_str().unwrap(), sig["v"].as_str().unwrap());
    assert_eq!(signer, a1[0].to_lowercase(), "the signature is over the stamped payload");

    // The same approval presented to the enclave again is a replay; a stale one is refused.
    let votes: String = c.query_row("SELECT votes FROM activities WHERE id = ?1", [&id], |r| r.get(0)).unwrap();
    let first: Value = serde_json::from_str::<Value>(&votes).unwrap()[0].clone();
    let original = pb::StampedRequest {
        body: first["message"].as_str().unwrap().as_bytes().to_vec(),
        stamp_header: first["cofferStampHeader"].as_str().unwrap().into(),
        stamp: first["cofferStamp"].as_str().unwrap().into(),
        certificate: certificate(&c, &public_key(&alice)),
    };
    let bob_cert = certificate(&c, &public_key(&bob));
    let enclave = connect(stack.enclave_socket());
    let key = account_ref(&c, &a1[0]);
    let with_approval = |approval: pb::StampedRequest| {
        Some(pb::Authorization { request: Some(original.clone()), approval: Some(approval) })
    };
    refused(
        sign(&enclave, with_approval(stamped(&bob, &approval, &bob_cert)), &key).await,
        tonic::Code::PermissionDenied,
        "replayed request",
    );
    let stale = body(
        "ACTIVITY_TYPE_APPROVE_ACTIVITY",
        &org,
        Stack::now_ms() - 6 * 60 * 1000,
        json!({"fingerprint": fingerprint}),
    );
    refused(
        sign(&enclave, with_approval(stamped(&bob, &stale, &bob_cert)), &key).await,
        tonic::Code::PermissionDenied,
        "stale or future timestampMs",
    );
    // An approval of another activity does not run this one.
    let elsewhere = approve("sha256:0000");
    refused(
        sign(&enclave, with_approval(stamped(&bob, &elsewhere, &bob_cert)), &key).await,
        tonic::Code::PermissionDenied,
        "does not approve this activity",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_from_before_certificates_are_certified_by_the_operator() {
    let stack = Stack::start().await;
    let client = stack.client();
    let org = stack.organization_id.clone();
    let (_, a1) = wallet(&client, &org, "w1").await;
    let c = db(&stack);
    // A key as an older Coffer stored it: no certificate.
    let legacy = TurnkeyP256ApiKey::generate();
    c.execute(
        "INSERT INTO api_keys (id, organization_id, user_id, name, public_key, credential_type, expiration_seconds,
            created_at, updated_at) VALUES ('legacy', ?1, ?2, 'legacy', ?3, 'CREDENTIAL_TYPE_API_KEY_P256', NULL, 0, 0)",
        rusqlite::params![org, stack.user_id, public_key(&legacy)],
    )
    .unwrap();
    let sign_path = "/public/v1/submit/sign_raw_payload";
    let r = stack.post_raw(sign_path, sign_body(&org, &a1[0], "l1", Stack::now_ms()).as_bytes(), Some(&legacy)).await;
    assert_eq!(r.status, 403, "{}", r.text);

    // The operator's pipeline: export the uncertified rows, certify them on the enclave host (the
    // HSM login is needed), import the certificates.
    let out = |o: std::process::Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let rows = out(stack.run_with_stdin("coffer-gateway", &["uncertified-credentials"], ""));
    let lines: Vec<Value> = rows.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{rows}");
    assert_eq!(
        (lines[0]["id"].as_str(), lines[0]["publicKey"].as_str()),
        (Some("legacy"), Some(public_key(&legacy).as_str()))
    );
    let certified = out(stack.run_with_stdin("coffer-enclave", &["certify-existing"], &rows));
    // A certificate moved to another row is refused, and nothing is stored.
    let moved =
        certified.replace("\"legacy\"", "\"other\"").replace(&public_key(&legacy), &public_key(&stack.api_key()));
    assert!(!stack.run_with_stdin("coffer-gateway", &["import-certificates"], &moved).status.success());
    let stored: Value =
        serde_json::from_str(&out(stack.run_with_stdin("coffer-gateway", &["import-certificates"], &certified)))
            .unwrap();
    assert_eq!(stored["certificatesStored"], 1);
    assert_eq!(out(stack.run_with_stdin("coffer-gateway", &["uncertified-credentials"], "")), "");

    let r = stack.post_raw(sign_path, sign_body(&org, &a1[0], "l2", Stack::now_ms()).as_bytes(), Some(&legacy)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let sig = &r.json["activity"]["result"]["signRawPayloadResult"];
    let signer = recover(b"l2", sig["r"].as_str().unwrap(), sig["s"].as_str().unwrap(), sig["v"].as_str().unwrap());
    assert_eq!(signer, a1[0].to_lowercase());

    // OAuth identities and sub-organizations from before their certificates: a provider row
    // without one, a sub-organization without its parent certificate. The same pipeline
    // certifies both; then the parent's credential can open a session in the sub-organization.
    let params = json!({"subOrganizationName": "old", "rootQuorumThreshold": 1, "rootUsers": [{"userName": "p",
        "apiKeys": [], "authenticators": [], "oauthProviders": [{"providerName": "x",
        "oidcClaims": {"iss": "https://i.example", "sub": "s", "aud": "a"}}]}]});
    let r = stack
        .post_raw(
            "/public/v1/submit/create_sub_organization",
            body("ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", &org, Stack::now_ms(), params).as_bytes(),
            Some(&stack.api_key()),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let sub_org = r.json["activity"]["result"]["createSubOrganizationResultV8"]["subOrganizationId"]
        .as_str()
        .unwrap()
        .to_string();
    c.execute("UPDATE oauth_providers SET certificate = x''", []).unwrap();
    c.execute("DELETE FROM records WHERE kind = 'parent_certificate'", []).unwrap();
    let session = |ts: u128| {
        let target = hex::encode(p256::SecretKey::from_slice(&[8; 32]).unwrap().public_key().to_sec1_bytes());
        body("ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2", &sub_org, ts, json!({"targetPublicKey": target}))
    };
    let r = stack
        .post_raw(
            "/public/v1/submit/create_read_write_session",
            session(Stack::now_ms()).as_bytes(),
            Some(&stack.api_key()),
        )
        .await;
    assert_eq!(r.status, 403, "no parent certificate yet: {}", r.text);
    let rows = out(stack.run_with_stdin("coffer-gateway", &["uncertified-credentials"], ""));
    let kinds: Vec<String> =
        rows.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["kind"].to_string()).collect();
    assert_eq!(kinds, vec!["\"oauthProvider\"", "\"parentOrganization\""], "{rows}");
    let certified = out(stack.run_with_stdin("coffer-enclave", &["certify-existing"], &rows));
    let stored: Value =
        serde_json::from_str(&out(stack.run_with_stdin("coffer-gateway", &["import-certificates"], &certified)))
            .unwrap();
    assert_eq!(stored["certificatesStored"], 2);
    assert_eq!(out(stack.run_with_stdin("coffer-gateway", &["uncertified-credentials"], "")), "");
    let empty: i64 =
        c.query_row("SELECT COUNT(*) FROM oauth_providers WHERE length(certificate) = 0", [], |r| r.get(0)).unwrap();
    assert_eq!(empty, 0);
    // A session for a user the parent names (userId required when a parent asks).
    let user: String = c.query_row("SELECT user_id FROM oauth_providers", [], |r| r.get(0)).unwrap();
    let target = hex::encode(p256::SecretKey::from_slice(&[8; 32]).unwrap().public_key().to_sec1_bytes());
    let with_user = body(
        "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2",
        &sub_org,
        Stack::now_ms(),
        json!({"targetPublicKey": target, "userId": user}),
    );
    let r = stack
        .post_raw("/public/v1/submit/create_read_write_session", with_user.as_bytes(), Some(&stack.api_key()))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// Webhook signing is the one enclave call that carries no stamp: it uses no organization's key
/// material, only the deployment's webhook key, and a signature attests which deployment sent a
/// delivery (README, threat model). What the enclave still decides, called directly on its socket
/// as an attacker who owns the gateway would: a timestamp that is its own now (no delivery signed
/// ahead of time or backdated), a plain event id (no header injection), a body that is an
/// activity object, and a bounded batch — each refusal for its own delivery, with an audit line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_signing_on_the_enclave_socket_signs_only_fresh_activities() {
    let stack = Stack::start().await;
    let enclave = connect(stack.enclave_socket());
    let key = enclave.clone().get_webhook_signing_key(pb::GetWebhookSigningKeyRequest {}).await.unwrap().into_inner();
    let now = Stack::now_ms() as u64;
    let activity = br#"{"id":"a1","organizationId":"o1","status":"ACTIVITY_STATUS_COMPLETED"}"#.to_vec();
    let delivery = |timestamp_ms: u64, event_id: &str, body: &[u8]| pb::SignWebhookDeliveryRequest {
        timestamp_ms,
        event_id: event_id.into(),
        body: body.to_vec(),
    };
    let deliveries = vec![
        delivery(now, "evt-1", &activity),
        delivery(now - 10 * 60 * 1000, "evt-2", &activity),
        delivery(now + 10 * 60 * 1000, "evt-3", &activity),
        delivery(now, "evt-4\r\nX-Injected: 1", &activity),
        delivery(now, "evt-5", br#"["a1","o1"]"#),
        delivery(now, "evt-6", b"sign this for me"),
    ];
    let signed = enclave
        .clone()
        .sign_webhook_deliveries(pb::SignWebhookDeliveriesRequest { deliveries })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(signed.key_id, key.key_id);
    assert_eq!(signed.deliveries.len(), 6, "one answer per delivery, in order");

    // The fresh one is signed over the message the enclave built, checked with ed25519-dalek.
    let verifying = ed25519_dalek::VerifyingKey::from_bytes(&key.public_key.try_into().unwrap()).unwrap();
    let first = &signed.deliveries[0];
    assert!(first.refusal.is_empty(), "{first:?}");
    let message = [format!("v1.ed25519.{}.{now}.evt-1.", key.key_id).as_bytes(), &activity].concat();
    let signature = ed25519_dalek::Signature::from_bytes(&first.signature.clone().try_into().unwrap());
    verifying.verify_strict(&message, &signature).expect("a genuine webhook signature");

    let refusals: Vec<&str> = signed.deliveries[1..].iter().map(|d| d.refusal.as_str()).collect();
    for (d, needle) in
        signed.deliveries[1..].iter().zip(["timestamp", "timestamp", "event id", "not an activity", "not an activity"])
    {
        assert!(d.signature.is_empty(), "nothing signed for a refused delivery: {refusals:?}");
        assert!(d.refusal.contains(needle), "expected {needle:?} in {:?}", d.refusal);
    }
    assert!(audit_refusals(&stack, "delivery timestamp is not the enclave's now") >= 2, "{}", stack.enclave_log());
    assert!(audit_refusals(&stack, "event id must be") >= 1);
    assert!(audit_refusals(&stack, "delivery body is not an activity") >= 2);

    // More than a batch's worth is refused whole.
    let too_many = (0..257).map(|n| delivery(now, &format!("evt-{n}"), &activity)).collect();
    refused(
        enclave.clone().sign_webhook_deliveries(pb::SignWebhookDeliveriesRequest { deliveries: too_many }).await,
        tonic::Code::PermissionDenied,
        "at most 256",
    );
}

/// An unsigned EIP-1559 transfer on chain 1 (the tests' own RLP encoder).
fn eip1559_transfer(to: &[u8; 20], value: u128) -> Vec<u8> {
    use coffer_tests::rlp::{rlp_bytes, rlp_list, rlp_uint};
    let mut tx = vec![0x02];
    tx.extend(rlp_list(&[
        rlp_uint(1),
        rlp_uint(0),
        rlp_uint(1),
        rlp_uint(2),
        rlp_uint(21_000),
        rlp_bytes(to),
        rlp_uint(value),
        rlp_bytes(&[]),
        rlp_list(&[]),
    ]));
    tx
}

fn sign_transaction_body(org: &str, sign_with: &str, unsigned: &[u8], timestamp_ms: u128) -> String {
    body(
        "ACTIVITY_TYPE_SIGN_TRANSACTION_V2",
        org,
        timestamp_ms,
        json!({"signWith": sign_with, "unsignedTransaction": hex::encode(unsigned), "type": "TRANSACTION_TYPE_ETHEREUM"}),
    )
}

async fn sign_transaction(
    enclave: &Enclave,
    auth: Option<pb::Authorization>,
    key: &pb::SealedRef,
) -> Result<Vec<u8>, tonic::Status> {
    let req = pb::SignRequest { auth, key: Some(key.clone()), address_format: String::new() };
    enclave.clone().sign_transaction(req).await.map(|r| r.into_inner().signed_transaction)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_signing_on_the_enclave_socket_signs_only_the_stamped_transaction() {
    use coffer_tests::rlp::{rlp_items, rlp_payload};
    let stack = Stack::start().await;
    let client = stack.client();
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    let (_, a) = wallet(&client, &org, "tx").await;
    let c = db(&stack);
    let cert = certificate(&c, &public_key(&root));
    let (ref0, ref1) = (account_ref(&c, &a[0]), account_ref(&c, &a[1]));
    let enclave = connect(stack.enclave_socket());
    let alice_tx = eip1559_transfer(&[0xa1; 20], 1);
    let mallory_tx = eip1559_transfer(&[0x3a; 20], 1_000_000);

    // The transaction comes from the stamped body: rewriting it breaks the stamp.
    let genuine = stamped(&root, &sign_transaction_body(&org, &a[0], &alice_tx, Stack::now_ms()), &cert);
    let mut forged = genuine.clone();
    forged.body = sign_transaction_body(&org, &a[0], &mallory_tx, Stack::now_ms()).into_bytes();
    refused(
        sign_transaction(&enclave, auth(forged), &ref0).await,
        tonic::Code::PermissionDenied,
        "could not verify api key signature",
    );
    // Another account's key under the genuine body, and a raw-payload stamp on this call.
    refused(
        sign_transaction(&enclave, auth(genuine.clone()), &ref1).await,
        tonic::Code::PermissionDenied,
        "not the one signWith names",
    );
    let raw = stamped(&root, &sign_body(&org, &a[0], "x", Stack::now_ms()), &cert);
    refused(
        sign_transaction(&enclave, auth(raw), &ref0).await,
        tonic::Code::PermissionDenied,
        "does not ask for this operation",
    );

    // A genuine request (a body the enclave saw refused is spent) signs exactly the stamped
    // transaction, once.
    let alice_tx = eip1559_transfer(&[0xa1; 20], 2);
    let genuine = stamped(&root, &sign_transaction_body(&org, &a[0], &alice_tx, Stack::now_ms()), &cert);
    let signed = sign_transaction(&enclave, auth(genuine.clone()), &ref0).await.unwrap();
    let items = rlp_items(&signed[1..]);
    assert_eq!(&items[..9], &rlp_items(&alice_tx[1..])[..], "the stamped fields, unchanged");
    let digest: [u8; 32] = sha3::Keccak256::digest(&alice_tx).into();
    let (v, r, s) = (rlp_payload(&items[9]), rlp_payload(&items[10]), rlp_payload(&items[11]));
    let pad = |x: Vec<u8>| {
        let mut out = [0u8; 32];
        out[32 - x.len()..].copy_from_slice(&x);
        out
    };
    let sig = k256::ecdsa::Signature::from_scalars(pad(r), pad(s)).unwrap();
    let recid = k256::ecdsa::RecoveryId::from_byte(v.first().copied().unwrap_or(0)).unwrap();
    let vk = k256::ecdsa::VerifyingKey::recover_from_prehash(&digest, &sig, recid).unwrap();
    let point = vk.to_encoded_point(false);
    let signer = format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..]));
    assert_eq!(signer, a[0].to_lowercase());
    refused(sign_transaction(&enclave, auth(genuine), &ref0).await, tonic::Code::PermissionDenied, "replayed request");

    // A stamped transaction the enclave cannot parse completely is not signed, whatever the
    // gateway checked: a trailing byte.
    let mut trailing = alice_tx.clone();
    trailing.push(0);
    let bad = stamped(&root, &sign_transaction_body(&org, &a[0], &trailing, Stack::now_ms()), &cert);
    refused(sign_transaction(&enclave, auth(bad), &ref0).await, tonic::Code::InvalidArgument, "trailing bytes");
    assert!(audit_refusals(&stack, "signWith names") >= 1);
}

/// Login calls on the enclave socket, as an attacker who owns the gateway would make them: a
/// session opens only for the user the stamp names (once), never across organizations without a
/// genuine parent certificate, never for a self-made OIDC token; an OAuth 2.0 credential opens
/// only with its own certificate; and the auth proxy's key stamps only login activities, now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_calls_on_the_enclave_socket_open_sessions_only_for_whom_the_stamp_says() {
    let stack = Stack::start().await;
    let enclave = connect(stack.enclave_socket());
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    let root_cert = certificate(&db(&stack), &stack.api_public_key);
    let session_key = public_key(&TurnkeyP256ApiKey::generate());
    let session = |auth: Option<pb::Authorization>, provider: Vec<u8>, parent: Vec<u8>| {
        let e = enclave.clone();
        async move {
            e.clone()
                .create_session(pb::CreateSessionRequest {
                    auth,
                    provider_certificate: provider,
                    parent_certificate: parent,
                })
                .await
                .map(|r| r.into_inner())
        }
    };

    // The stamping user gets the session, once.
    let login = body("ACTIVITY_TYPE_STAMP_LOGIN", &org, Stack::now_ms(), json!({"publicKey": session_key}));
    let opened = session(auth(stamped(&root, &login, &root_cert)), vec![], vec![]).await.unwrap();
    assert_eq!((opened.user_id.as_str(), opened.public_key.as_str()), (stack.user_id.as_str(), session_key.as_str()));
    assert_eq!(opened.credential_type, "CREDENTIAL_TYPE_LOGIN");
    refused(
        session(auth(stamped(&root, &login, &root_cert)), vec![], vec![]).await,
        tonic::Code::PermissionDenied,
        "replayed",
    );

    // Another organization's body (a sub-organization of ours): refused without its parent
    // certificate, and with our own API key's certificate passed off as one.
    let params = json!({"subOrganizationName": "target", "rootQuorumThreshold": 1,
        "rootUsers": [{"userName": "victim", "apiKeys": [], "authenticators": [],
        "oauthProviders": [{"providerName": "x", "oidcClaims": {"iss": "https://i.example", "sub": "v", "aud": "a"}}]}]});
    let r = stack
        .post_raw(
            "/public/v1/submit/create_sub_organization",
            body("ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8", &org, Stack::now_ms(), params).as_bytes(),
            Some(&root),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let sub = &r.json["activity"]["result"]["createSubOrganizationResultV8"];
    let sub_org = sub["subOrganizationId"].as_str().unwrap().to_string();
    let victim = sub["rootUserIds"][0].as_str().unwrap().to_string();
    let rw = |ts| {
        body(
            "ACTIVITY_TYPE_CREATE_READ_WRITE_SESSION_V2",
            &sub_org,
            ts,
            json!({"targetPublicKey": hex::encode(p256::SecretKey::from_slice(&[8; 32]).unwrap().public_key().to_sec1_bytes()), "userId": victim}),
        )
    };
    refused(
        session(auth(stamped(&root, &rw(Stack::now_ms()), &root_cert)), vec![], vec![]).await,
        tonic::Code::PermissionDenied,
        "another organization",
    );
    refused(
        session(auth(stamped(&root, &rw(Stack::now_ms() + 1), &root_cert)), vec![], root_cert.clone()).await,
        tonic::Code::PermissionDenied,
        "another organization",
    );
    // With the genuine parent certificate (as the gateway stores it) the parent's login works.
    let parent_cert: String = db(&stack)
        .query_row(
            "SELECT data FROM records WHERE organization_id = ?1 AND kind = 'parent_certificate'",
            [&sub_org],
            |r| r.get(0),
        )
        .unwrap();
    let parent_cert =
        hex::decode(serde_json::from_str::<Value>(&parent_cert).unwrap()["certificate"].as_str().unwrap()).unwrap();
    let opened =
        session(auth(stamped(&root, &rw(Stack::now_ms() + 2), &root_cert)), vec![], parent_cert).await.unwrap();
    assert_eq!(opened.user_id, victim);
    assert!(!opened.credential_bundle.is_empty());

    // oauth_login with a token Coffer never issued (right issuer, attacker's key): refused before
    // any certificate is looked at.
    use p256::ecdsa::signature::Signer;
    let b64 = |b: &[u8]| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    };
    let nonce = hex::encode(sha2::Sha256::digest(session_key.as_bytes()));
    let claims =
        json!({"iss": stack.base_url, "sub": "x", "aud": "c", "exp": Stack::now_ms() / 1000 + 600, "nonce": nonce});
    let input = format!("{}.{}", b64(br#"{"alg":"ES256","kid":"k"}"#), b64(claims.to_string().as_bytes()));
    let forged: p256::ecdsa::Signature = p256::ecdsa::SigningKey::from_slice(&[7; 32]).unwrap().sign(input.as_bytes());
    let token = format!("{input}.{}", b64(&forged.to_bytes()));
    let oauth =
        body("ACTIVITY_TYPE_OAUTH_LOGIN", &org, Stack::now_ms(), json!({"oidcToken": token, "publicKey": session_key}));
    refused(
        session(auth(stamped(&root, &oauth, &root_cert)), root_cert.clone(), vec![]).await,
        tonic::Code::InvalidArgument,
        "invalid OIDC token",
    );

    // An OAuth 2.0 credential whose certificate is made up does not reach the provider.
    let exchange = body(
        "ACTIVITY_TYPE_OAUTH2_AUTHENTICATE",
        &org,
        Stack::now_ms(),
        json!({"oauth2CredentialId": "c1", "authCode": "a", "redirectUri": "https://r", "codeVerifier": "v", "nonce": "n"}),
    );
    let credential = pb::Oauth2Credential {
        organization_id: org.clone(),
        credential_id: "c1".into(),
        provider: "OAUTH2_PROVIDER_X".into(),
        client_id: "id".into(),
        encrypted_client_secret: "00".into(),
        mac: vec![1; 32],
    };
    let r = enclave
        .clone()
        .oauth2_authenticate(pb::Oauth2AuthenticateRequest {
            auth: auth(stamped(&root, &exchange, &root_cert)),
            credential: Some(credential),
        })
        .await;
    refused(r, tonic::Code::PermissionDenied, "certificate does not verify");

    // The auth proxy key: enabled through the gateway, then asked to stamp what it must not.
    let r = stack
        .post_raw(
            "/public/v1/submit/enable_auth_proxy",
            body("ACTIVITY_TYPE_ENABLE_AUTH_PROXY", &org, Stack::now_ms(), json!({})).as_bytes(),
            Some(&root),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let config: String = db(&stack)
        .query_row("SELECT data FROM records WHERE organization_id = ?1 AND kind = 'auth_proxy'", [&org], |r| r.get(0))
        .unwrap();
    let config: Value = serde_json::from_str(&config).unwrap();
    let proxy_stamp = |b: String| {
        let e = enclave.clone();
        let req = pb::StampAuthProxyRequestRequest {
            organization_id: org.clone(),
            user_id: config["userId"].as_str().unwrap().into(),
            public_key: config["publicKey"].as_str().unwrap().into(),
            sealed_key: hex::decode(config["sealedKey"].as_str().unwrap()).unwrap(),
            body: b.into_bytes(),
        };
        async move { e.clone().stamp_auth_proxy_request(req).await.map(|r| r.into_inner()) }
    };
    let exchange = |o: &str, ts| body("ACTIVITY_TYPE_OAUTH2_AUTHENTICATE", o, ts, json!({"oauth2CredentialId": "c1"}));
    let signing = sign_body(&org, "0x0000000000000000000000000000000000000000", "hello", Stack::now_ms());
    refused(proxy_stamp(signing).await, tonic::Code::PermissionDenied, "stamps only");
    refused(proxy_stamp(exchange(&sub_org, Stack::now_ms())).await, tonic::Code::PermissionDenied, "own organization");
    refused(
        proxy_stamp(exchange(&org, Stack::now_ms() - 10 * 60 * 1000)).await,
        tonic::Code::PermissionDenied,
        "timestampMs",
    );
    let ok = proxy_stamp(exchange(&org, Stack::now_ms())).await.unwrap();
    assert!(!ok.stamp.is_empty());
    assert!(stack.enclave_log().contains("stamp_auth_proxy_request"), "audit lines name the operation");
}

/// `X-Stamp-Attested` on the enclave socket: a session key attested by a (third-party) OIDC token
/// opens a session only as the user whose certified OAuth identity the token names, only for
/// `stamp_login`, only with the key the token's nonce binds; an OAuth identity's certificate never
/// authorizes an API-key stamp, and an API key's certificate never an attested one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attested_stamps_on_the_enclave_socket_log_in_only_the_certified_identity() {
    use p256::ecdsa::signature::Signer;
    let stack = Stack::start().await;
    let enclave = connect(stack.enclave_socket());
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    let issuer_key = p256::ecdsa::SigningKey::from_slice(&[21; 32]).unwrap();
    let iss = coffer_tests::oidc::issuer(coffer_tests::oidc::jwk(&issuer_key)).await;

    // The root user gets the identity (iss, "u1", "app"): its certificate is the provider's.
    let attach = json!({"userId": stack.user_id, "oauthProviders": [{"providerName": "local",
        "oidcClaims": {"iss": iss, "sub": "u1", "aud": "app"}}]});
    let r = stack
        .post_raw(
            "/public/v1/submit/create_oauth_providers",
            body("ACTIVITY_TYPE_CREATE_OAUTH_PROVIDERS_V2", &org, Stack::now_ms(), attach).as_bytes(),
            Some(&root),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let provider_cert: Vec<u8> =
        db(&stack).query_row("SELECT certificate FROM oauth_providers", [], |r| r.get(0)).unwrap();
    let root_cert = certificate(&db(&stack), &stack.api_public_key);

    let session = TurnkeyP256ApiKey::generate();
    let session_public = public_key(&session);
    let token_for = |key_hex: &str| {
        let nonce = hex::encode(sha2::Sha256::digest(key_hex.as_bytes()));
        coffer_tests::oidc::es256_token(
            &issuer_key,
            &json!({"iss": iss, "sub": "u1", "aud": "app", "exp": Stack::now_ms() / 1000 + 600, "nonce": nonce}),
        )
    };
    let attested = |body: &str, token: &str, certificate: &[u8]| {
        let signing = p256::ecdsa::SigningKey::from_slice(&session.private_key()).unwrap();
        let signature: p256::ecdsa::Signature = signing.sign(body.as_bytes());
        let stamp = json!({"publicKeyAttestation": token, "scheme": "STAMP_ATTESTED_SCHEME_P256_OIDC",
            "publicKey": session_public, "signature": hex::encode(signature.to_der().as_bytes())});
        use base64::Engine;
        pb::StampedRequest {
            body: body.as_bytes().to_vec(),
            stamp_header: "X-Stamp-Attested".into(),
            stamp: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(stamp.to_string()),
            certificate: certificate.to_vec(),
        }
    };
    let create = |request: pb::StampedRequest| {
        let e = enclave.clone();
        async move {
            e.clone()
                .create_session(pb::CreateSessionRequest {
                    auth: auth(request),
                    provider_certificate: vec![],
                    parent_certificate: vec![],
                })
                .await
                .map(|r| r.into_inner())
        }
    };
    let login = |ts: u128| body("ACTIVITY_TYPE_STAMP_LOGIN", &org, ts, json!({"publicKey": session_public}));
    let token = token_for(&session_public);

    // An API key's certificate does not make an attested stamp count, nor does a token bound to
    // another key, nor another activity than stamp_login.
    refused(
        create(attested(&login(Stack::now_ms()), &token, &root_cert)).await,
        tonic::Code::PermissionDenied,
        "certified OAuth identity",
    );
    let other = token_for(&public_key(&TurnkeyP256ApiKey::generate()));
    refused(
        create(attested(&login(Stack::now_ms() + 1), &other, &provider_cert)).await,
        tonic::Code::PermissionDenied,
        "nonce",
    );
    let oauth = body(
        "ACTIVITY_TYPE_OAUTH_LOGIN",
        &org,
        Stack::now_ms(),
        json!({"oidcToken": token, "publicKey": session_public}),
    );
    refused(create(attested(&oauth, &token, &provider_cert)).await, tonic::Code::PermissionDenied, "only stamp_login");
    // The provider's certificate behind an ordinary X-Stamp of the session key: refused.
    refused(
        create(stamped(&session, &login(Stack::now_ms() + 2), &provider_cert)).await,
        tonic::Code::PermissionDenied,
        "another key",
    );

    // The genuine combination: a session for the root user, once.
    let request = attested(&login(Stack::now_ms() + 3), &token, &provider_cert);
    let opened = create(request.clone()).await.unwrap();
    assert_eq!(
        (opened.user_id.as_str(), opened.public_key.as_str()),
        (stack.user_id.as_str(), session_public.as_str())
    );
    refused(create(request).await, tonic::Code::PermissionDenied, "replayed");
}

/// Every login-related call that uses key material (OAuth 2.0 credential certification, the code
/// exchange, sessions, the auth proxy's key) refuses what the key-using calls refuse: no stamped
/// request, a stale stamp, a credential without a certificate, a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_calls_refuse_unstamped_stale_uncertified_and_replayed_requests() {
    let stack = Stack::start().await;
    let enclave = connect(stack.enclave_socket());
    let root = stack.api_key();
    let org = stack.organization_id.clone();
    let root_cert = certificate(&db(&stack), &stack.api_public_key);
    let bodies = |ts: u128| {
        vec![
            body(
                "ACTIVITY_TYPE_CREATE_OAUTH2_CREDENTIAL",
                &org,
                ts,
                json!({"provider": "OAUTH2_PROVIDER_X", "clientId": "c", "encryptedClientSecret": "00"}),
            ),
            body("ACTIVITY_TYPE_OAUTH2_AUTHENTICATE", &org, ts, json!({"oauth2CredentialId": "c1"})),
            body(
                "ACTIVITY_TYPE_STAMP_LOGIN",
                &org,
                ts,
                json!({"publicKey": public_key(&TurnkeyP256ApiKey::generate())}),
            ),
            body("ACTIVITY_TYPE_ENABLE_AUTH_PROXY", &org, ts, json!({})),
        ]
    };
    // Calls the RPC that serves `body`'s type with `auth`.
    let call = |i: usize, auth: Option<pb::Authorization>| {
        let e = enclave.clone();
        async move {
            match i {
                0 => e
                    .clone()
                    .certify_oauth2_credential(pb::CertifyOauth2CredentialRequest {
                        auth,
                        credential_id: "c".into(),
                        current: None,
                    })
                    .await
                    .map(|_| ()),
                1 => e
                    .clone()
                    .oauth2_authenticate(pb::Oauth2AuthenticateRequest { auth, credential: None })
                    .await
                    .map(|_| ()),
                2 => e
                    .clone()
                    .create_session(pb::CreateSessionRequest {
                        auth,
                        provider_certificate: vec![],
                        parent_certificate: vec![],
                    })
                    .await
                    .map(|_| ()),
                _ => e.clone().enable_auth_proxy(pb::EnableAuthProxyRequest { auth }).await.map(|_| ()),
            }
        }
    };
    let now = Stack::now_ms();
    for (i, fresh) in bodies(now).into_iter().enumerate() {
        refused(call(i, None).await, tonic::Code::PermissionDenied, "no stamped request");
        let unstamped = pb::StampedRequest {
            body: fresh.as_bytes().to_vec(),
            certificate: root_cert.clone(),
            ..Default::default()
        };
        refused(call(i, auth(unstamped)).await, tonic::Code::PermissionDenied, "no stamp");
        refused(
            call(i, auth(stamped(&root, &fresh, &[]))).await,
            tonic::Code::PermissionDenied,
            "no enclave certificate",
        );
        let stale = &bodies(now - 10 * 60 * 1000)[i];
        refused(call(i, auth(stamped(&root, stale, &root_cert))).await, tonic::Code::PermissionDenied, "stale");
    }
    // A fresh, certified stamp gets past the authority once; its replay does not (the first call
    // may still fail later, on what the body asks for).
    for (i, fresh) in bodies(now + 1).into_iter().enumerate() {
        let _ = call(i, auth(stamped(&root, &fresh, &root_cert))).await;
        refused(call(i, auth(stamped(&root, &fresh, &root_cert))).await, tonic::Code::PermissionDenied, "replayed");
    }
}
