//! End to end: app proofs (checked as the official `verifyAppProofSignature` checks them, with an
//! independent P-256 implementation), boot proofs, and the activity log exported through the API
//! and verified offline, then again after its database rows are edited, deleted or moved (both
//! stores).

use coffer_tests::Stack;
use serde_json::{json, Value};
use turnkey_client::generated::external::data::v1::{AppProof, SignatureScheme};
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, Curve, HashFunction, PathFormat, PayloadEncoding,
};
use turnkey_client::generated::{
    CreateUserTagIntent, CreateWalletIntent, GetAppProofsRequest, GetBootProofRequest, GetLatestBootProofRequest,
    SignRawPayloadIntentV2, WalletAccountParams,
};
use turnkey_client::{TurnkeyClient, TurnkeyP256ApiKey};

/// `verifyAppProofSignature`, written against `ring` rather than the `p256` crate Coffer uses:
/// the scheme, a 130-byte key whose second half signs, r ‖ s over SHA-256 of the payload.
fn verifies(p: &AppProof) -> bool {
    let Ok(key) = hex::decode(&p.public_key) else { return false };
    let Ok(signature) = hex::decode(&p.signature) else { return false };
    p.scheme == SignatureScheme::EphemeralKeyP256
        && key.len() == 130
        && key[65] == 0x04
        && signature.len() == 64
        && ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &key[65..])
            .verify(p.proof_payload.as_bytes(), &signature)
            .is_ok()
}

fn payload(p: &AppProof) -> Value {
    serde_json::from_str(&p.proof_payload).expect("the payload is JSON")
}

fn eth_account(path: &str) -> WalletAccountParams {
    WalletAccountParams {
        curve: Curve::Secp256k1,
        path_format: PathFormat::Bip32,
        path: path.into(),
        address_format: AddressFormat::Ethereum,
        name: None,
    }
}

fn sign_intent(sign_with: &str, payload: &str) -> SignRawPayloadIntentV2 {
    SignRawPayloadIntentV2 {
        sign_with: sign_with.into(),
        payload: payload.into(),
        encoding: PayloadEncoding::TextUtf8,
        hash_function: HashFunction::Keccak256,
        external_signer_pubkey: None,
    }
}

#[tokio::test]
async fn app_proofs_verify_name_what_the_enclave_did_and_match_the_boot_proof() {
    let stack = Stack::start().await;
    let org = stack.organization_id.clone();
    let plain = stack.client();
    let client = stack.client().with_app_proofs();

    let wallet = client
        .create_wallet(
            org.clone(),
            client.current_timestamp(),
            CreateWalletIntent {
                wallet_name: "proved".into(),
                accounts: vec![eth_account("m/44'/60'/0'/0/0"), eth_account("m/44'/60'/0'/0/1")],
                mnemonic_length: None,
            },
        )
        .await
        .unwrap();
    let addresses = wallet.result.addresses.clone();
    // One address-derivation proof per account, then the decision's.
    assert_eq!(wallet.app_proofs.len(), 3, "{:?}", wallet.app_proofs);
    assert!(wallet.app_proofs.iter().all(verifies));
    let key = wallet.app_proofs[0].public_key.clone();
    assert!(wallet.app_proofs.iter().all(|p| p.public_key == key), "one proof key");
    for (i, p) in wallet.app_proofs[..2].iter().enumerate() {
        let body = payload(p);
        assert_eq!(body["type"], "APP_PROOF_TYPE_ADDRESS_DERIVATION");
        assert!(body["timestampMs"].as_str().unwrap().parse::<u64>().unwrap() > 1_700_000_000_000);
        let proof = &body["addressDerivationProof"];
        assert_eq!(proof["organizationId"], org.as_str());
        assert_eq!(proof["walletId"], wallet.result.wallet_id.as_str());
        assert_eq!(proof["derivationPath"], format!("m/44'/60'/0'/0/{i}"));
        assert_eq!(proof["address"], addresses[i].as_str());
    }
    let decision = payload(&wallet.app_proofs[2]);
    assert_eq!(decision["type"], "APP_PROOF_TYPE_POLICY_OUTCOME");
    let outcome = &decision["policyOutcomeProof"];
    assert_eq!(
        (outcome["organizationId"].as_str(), outcome["outcome"].as_str()),
        (Some(org.as_str()), Some("OUTCOME_ALLOW"))
    );
    let coffer = &outcome["cofferDecision"];
    assert_eq!(coffer["activityType"], "ACTIVITY_TYPE_CREATE_WALLET");
    assert_eq!(coffer["decidedBy"], "ROOT_QUORUM");
    assert_eq!(coffer["approvals"][0]["userId"], stack.user_id.as_str());
    assert_eq!(coffer["result"]["accounts"][1]["address"], addresses[1].as_str());
    let activity = stack
        .post_raw(
            "/public/v1/query/get_activity",
            json!({ "organizationId": org, "activityId": wallet.activity_id }).to_string().as_bytes(),
            Some(&stack.api_key()),
        )
        .await;
    assert_eq!(coffer["fingerprint"], activity.json["activity"]["fingerprint"]);

    // list_app_proofs returns the same proofs, in order.
    let listed = plain
        .get_app_proofs(GetAppProofsRequest { organization_id: org.clone(), activity_id: wallet.activity_id.clone() })
        .await
        .unwrap()
        .app_proofs;
    assert_eq!(listed, wallet.app_proofs);

    // A signature's proof states the signature the activity returned; one byte changed fails.
    let signed = client
        .sign_raw_payload(org.clone(), client.current_timestamp(), sign_intent(&addresses[0], "hi"))
        .await
        .unwrap();
    assert_eq!(signed.app_proofs.len(), 1);
    let p = &signed.app_proofs[0];
    assert!(verifies(p));
    let stated = &payload(p)["policyOutcomeProof"]["cofferDecision"]["result"]["signatures"][0];
    assert_eq!(
        (stated["r"].as_str(), stated["s"].as_str()),
        (Some(signed.result.r.as_str()), Some(signed.result.s.as_str()))
    );
    let mut changed = p.clone();
    changed.proof_payload = changed.proof_payload.replacen(&signed.result.r[..4], "ffff", 1);
    assert_ne!(changed.proof_payload, p.proof_payload);
    assert!(!verifies(&changed));
    let mut changed = p.clone();
    let last = changed.signature.pop().unwrap();
    changed.signature.push(if last == '0' { '1' } else { '0' });
    assert!(!verifies(&changed));

    // A state change (decided by the enclave over the authority state) proves its decision too.
    let tag = client
        .create_user_tag(
            org.clone(),
            client.current_timestamp(),
            CreateUserTagIntent { user_tag_name: "proved".into(), user_ids: vec![] },
        )
        .await
        .unwrap();
    assert_eq!(tag.app_proofs.len(), 1);
    assert!(verifies(&tag.app_proofs[0]));
    let result = &payload(&tag.app_proofs[0])["policyOutcomeProof"]["cofferDecision"]["result"];
    assert!(result["changes"].as_u64().unwrap() >= 1, "{result}");
    assert_eq!(result["changesSha256"].as_str().map(str::len), Some(64));
    assert!(result["stateVersionAfter"].as_str().unwrap().parse::<u64>().unwrap() > 1, "{result}");

    // Without the flag: no proofs, and none listed.
    let unproved =
        plain.sign_raw_payload(org.clone(), plain.current_timestamp(), sign_intent(&addresses[0], "no")).await.unwrap();
    assert!(unproved.app_proofs.is_empty());
    let listed = plain
        .get_app_proofs(GetAppProofsRequest { organization_id: org.clone(), activity_id: unproved.activity_id })
        .await
        .unwrap();
    assert!(listed.app_proofs.is_empty());

    // The boot proof names the same key, which discovery publishes, and states the service keys.
    let boot = plain
        .get_boot_proof(GetBootProofRequest { organization_id: org.clone(), ephemeral_key: key.clone() })
        .await
        .unwrap()
        .boot_proof
        .unwrap();
    assert_eq!(boot.ephemeral_public_key_hex, key);
    assert_eq!(boot.aws_attestation_doc_b64, "", "no hardware attestation is claimed");
    assert_eq!(boot.enclave_app, "coffer-enclave");
    let latest = plain
        .get_latest_boot_proof(GetLatestBootProofRequest { organization_id: org.clone(), app_name: "signer".into() })
        .await
        .unwrap()
        .boot_proof
        .unwrap();
    assert_eq!(latest, boot);
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let envelope: Value = serde_json::from_slice(&b64.decode(&boot.qos_manifest_envelope_b64).unwrap()).unwrap();
    let envelope: AppProof = serde_json::from_value(envelope).unwrap();
    assert!(verifies(&envelope));
    assert_eq!(envelope.proof_payload.as_bytes(), b64.decode(&boot.qos_manifest_b64).unwrap());
    let manifest = payload(&envelope);
    assert_eq!(manifest["cofferManifest"]["serviceKeys"]["proof"], &key[130..]);
    assert_eq!(manifest["cofferManifest"]["serviceKeys"]["bundleSigner"], stack.signer_public_key.as_str());
    assert_eq!(manifest["cofferManifest"]["binarySha256"].as_str().map(str::len), Some(64));
    let discovery = reqwest::get(format!("{}/public/v1/discovery/keys", stack.base_url)).await.unwrap();
    let discovery: Value = discovery.json().await.unwrap();
    assert_eq!(discovery["proofPublicKey"], &key[130..]);
    let other = plain
        .get_boot_proof(GetBootProofRequest { organization_id: org.clone(), ephemeral_key: "04".repeat(130) })
        .await;
    assert!(other.is_err(), "no boot proof for another key");

    // get_attestation (no Rust client method): the boot proof as a CBOR document, the proof key
    // and the manifest's digest, and no hardware attestation claimed.
    let stack = &stack;
    let ask = |enclave_type: &str| {
        let body = json!({ "organizationId": org, "enclaveType": enclave_type }).to_string();
        let key = stack.api_key();
        async move { stack.post_raw("/public/v1/query/get_attestation", body.as_bytes(), Some(&key)).await }
    };
    let r = ask("signer").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let document = b64.decode(r.json["attestationDocument"].as_str().unwrap()).unwrap();
    let document: ciborium::Value = ciborium::from_reader(document.as_slice()).unwrap();
    let field =
        |name: &str| document.as_map().unwrap().iter().find(|(k, _)| k.as_text() == Some(name)).map(|(_, v)| v.clone());
    assert_eq!(field("public_key").unwrap().as_bytes().map(hex::encode), Some(key.clone()));
    let digest = <sha2::Sha256 as sha2::Digest>::digest(b64.decode(&boot.qos_manifest_b64).unwrap()).to_vec();
    assert_eq!(field("user_data").unwrap().as_bytes(), Some(&digest));
    assert_eq!(field("attestation").unwrap().as_text(), Some("none"));
    assert_eq!(field("enclave_type").unwrap().as_text(), Some("signer"));
    let proof: AppProof = serde_json::from_slice(field("boot_proof").unwrap().as_bytes().unwrap()).unwrap();
    assert!(verifies(&proof));
    coffer_tests::refused_raw(&ask("tpm").await, 400, "REQUEST_INVALID", "enclaveType is one of");
}

/// Runs one SQL statement on the stack's gateway database (`$1`… placeholders, text values).
fn sql(stack: &Stack, statement: &str, params: &[&str]) -> u64 {
    let url = stack.store_url().to_string();
    let (statement, params) = (statement.to_string(), params.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    std::thread::spawn(move || {
        if let Some(path) = url.strip_prefix("sqlite://") {
            let c = rusqlite::Connection::open(path).unwrap();
            c.execute(&statement.replace('$', "?"), rusqlite::params_from_iter(params.iter())).unwrap() as u64
        } else {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
            c.execute(&statement, &refs).unwrap()
        }
    })
    .join()
    .unwrap()
}

/// Exports the stack's log with `coffer-gateway export-log` into `dir` and returns the file and
/// the proof key discovery publishes (hex).
async fn export_log(stack: &Stack, dir: &std::path::Path, round: &str) -> (std::path::PathBuf, String) {
    let key_file = dir.join("api.key");
    std::fs::write(&key_file, format!("{}\n", stack.api_private_key)).unwrap();
    let out = dir.join(format!("log-{round}.json"));
    let exported = stack.gateway_cli(&[
        "export-log",
        "--base-url",
        &stack.base_url,
        "--organization-id",
        &stack.organization_id,
        "--api-key-file",
        key_file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(exported["links"].as_u64().is_some(), "{exported}");
    let discovery: Value =
        reqwest::get(format!("{}/public/v1/discovery/keys", stack.base_url)).await.unwrap().json().await.unwrap();
    (out, discovery["proofPublicKey"].as_str().unwrap().to_string())
}

/// `coffer-gateway verify-log` on the file `log` with the proof key `key` (and `extra`
/// arguments): its exit status and the verdict it printed, whose `headAgeMs` (checked to be the
/// age of a head signed in the last ten minutes) is left out.
fn verify_log_cli_with(log: &std::path::Path, key: &str, extra: &[&str]) -> (Option<i32>, Value) {
    let output = std::process::Command::new(coffer_tests::bin_dir().join("coffer-gateway"))
        .args(["verify-log", "--log", log.to_str().unwrap(), "--proof-key", key])
        .args(extra)
        .output()
        .unwrap();
    let mut verdict: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("verify-log printed no JSON: {}", String::from_utf8_lossy(&output.stderr)));
    if verdict["verified"] == true {
        let age = verdict.as_object_mut().unwrap().remove("headAgeMs");
        assert!(age.as_ref().and_then(Value::as_i64).is_some_and(|a| (0..600_000).contains(&a)), "{age:?}");
    }
    let accepted = verdict["verified"] == true && (verdict["fresh"] == true || extra.contains(&"--allow-stale"));
    assert_eq!(output.status.success(), accepted, "{verdict}");
    (output.status.code(), verdict)
}

fn verify_log_cli(log: &std::path::Path, key: &str) -> (Option<i32>, Value) {
    verify_log_cli_with(log, key, &[])
}

/// Exports the stack's log with `coffer-gateway export-log` and checks it with `verify-log`
/// against the proof key discovery publishes: the verdict as the command printed it.
async fn export_and_verify(stack: &Stack, round: &str) -> Value {
    let dir = std::env::temp_dir().join(format!("coffer-log-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (out, key) = export_log(stack, &dir, round).await;
    let (_, verdict) = verify_log_cli(&out, &key);
    let _ = std::fs::remove_dir_all(&dir);
    verdict
}

/// A wallet, four signatures by its account and a user tag in `org`, through the official client:
/// the six activities' ids, in the order they ran.
async fn six_logged_activities(client: &TurnkeyClient<TurnkeyP256ApiKey>, org: &str) -> Vec<String> {
    let wallet = client
        .create_wallet(
            org.to_string(),
            client.current_timestamp(),
            CreateWalletIntent {
                wallet_name: "logged".into(),
                accounts: vec![eth_account("m/44'/60'/0'/0/0")],
                mnemonic_length: None,
            },
        )
        .await
        .unwrap();
    let address = wallet.result.addresses[0].clone();
    let mut ids = vec![wallet.activity_id.clone()];
    for i in 0..4 {
        let signed = client
            .sign_raw_payload(org.to_string(), client.current_timestamp(), sign_intent(&address, &format!("m{i}")))
            .await
            .unwrap();
        ids.push(signed.activity_id);
    }
    let tag = client
        .create_user_tag(
            org.to_string(),
            client.current_timestamp(),
            CreateUserTagIntent { user_tag_name: "t".into(), user_ids: vec![] },
        )
        .await
        .unwrap();
    ids.push(tag.activity_id);
    ids
}

async fn the_log_verifies_until_a_row_is_changed(store: &str) {
    let stack = Stack::start_on(store, &[]).await;
    let org = stack.organization_id.clone();
    let client = stack.client();
    let ids = six_logged_activities(&client, &org).await;
    let links = ids.len() as u64;
    // Each linked by the enclave call that did it (key uses, and the tag, a state change linked
    // in its call): no second round trip.
    assert_eq!(stack.enclave_calls("RecordActivity").await, 0);
    assert_eq!(stack.enclave_calls("ApplyActivity").await, 1);

    let honest = export_and_verify(&stack, "honest").await;
    assert_eq!(honest, json!({ "verified": true, "links": links, "unlogged": [], "fresh": true }));

    // An old head cannot stand for the log now (issue 40, E6): a gateway answering a new export
    // with an earlier export's head and links (hiding what came after) is caught by the nonce the
    // exporter chose; an export made without a nonce verifies only as `fresh: "unknown"`.
    let dir = std::env::temp_dir().join(format!("coffer-log-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (old_file, key) = export_log(&stack, &dir, "old").await;
    client
        .create_user_tag(
            org.clone(),
            client.current_timestamp(),
            CreateUserTagIntent { user_tag_name: "later".into(), user_ids: vec![] },
        )
        .await
        .unwrap();
    let (new_file, _) = export_log(&stack, &dir, "new").await;
    let read = |path: &std::path::Path| serde_json::from_slice::<Value>(&std::fs::read(path).unwrap()).unwrap();
    let (old, new) = (read(&old_file), read(&new_file));
    assert_eq!(new["links"].as_array().unwrap().len() as u64, links + 1);
    assert!(new["nonce"].as_str().is_some_and(|n| n.len() == 32 && n != old["nonce"]), "{}", new["nonce"]);
    let write = |name: &str, log: &Value| {
        let path = dir.join(name);
        std::fs::write(&path, serde_json::to_vec(log).unwrap()).unwrap();
        path
    };
    let mut stale = old.clone();
    stale["nonce"] = new["nonce"].clone();
    let (status, verdict) = verify_log_cli(&write("stale.json", &stale), &key);
    assert_eq!((status, verdict["verified"].as_bool(), verdict["seq"].as_u64()), (Some(1), Some(false), Some(0)));
    assert!(verdict["reason"].as_str().unwrap().contains("does not carry the export's nonce"), "{verdict}");
    let mut unasked = old.clone();
    unasked.as_object_mut().unwrap().remove("nonce");
    let unasked = write("unasked.json", &unasked);
    let verdict = json!({ "verified": true, "links": links, "unlogged": [], "fresh": "unknown" });
    assert_eq!(verify_log_cli(&unasked, &key), (Some(2), verdict.clone()));
    assert_eq!(verify_log_cli_with(&unasked, &key, &["--allow-stale"]), (Some(0), verdict));
    let _ = std::fs::remove_dir_all(&dir);
    for nonce in ["0011", "zz112233445566778899aabbccddeeff"] {
        let body = json!({ "organizationId": org, "nonce": nonce }).to_string();
        let r =
            stack.post_raw("/public/v1/query/coffer_list_activity_log", body.as_bytes(), Some(&stack.api_key())).await;
        assert_eq!(
            (r.status, r.json["message"].as_str()),
            (400, Some("nonce must be 16 to 128 hex digits")),
            "{}",
            r.text
        );
    }

    // Edited: a signature replaced in the third activity's result.
    let edited = &ids[2];
    let original: String = {
        let url = stack.store_url().to_string();
        let id = edited.clone();
        std::thread::spawn(move || {
            if let Some(path) = url.strip_prefix("sqlite://") {
                rusqlite::Connection::open(path)
                    .unwrap()
                    .query_row("SELECT result FROM activities WHERE id = ?1", [id], |r| r.get(0))
                    .unwrap()
            } else {
                let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                c.query_one("SELECT result FROM activities WHERE id = $1", &[&id]).unwrap().get(0)
            }
        })
        .join()
        .unwrap()
    };
    let forged = original.replacen("\"r\":\"", "\"r\":\"00", 1);
    assert_ne!(forged, original);
    assert_eq!(sql(&stack, "UPDATE activities SET result = $1 WHERE id = $2", &[&forged, edited]), 1);
    let verdict = export_and_verify(&stack, "edited").await;
    assert_eq!(
        (verdict["verified"].as_bool(), verdict["activityId"].as_str()),
        (Some(false), Some(edited.as_str())),
        "{verdict}"
    );
    assert_eq!(verdict["seq"], 3);
    assert_eq!(sql(&stack, "UPDATE activities SET result = $1 WHERE id = $2", &[&original, edited]), 1);
    assert_eq!(export_and_verify(&stack, "restored").await["verified"], true);

    // Moved: the second and fourth links trade places.
    let swap = |a: u64, b: u64| {
        sql(
            &stack,
            &format!("UPDATE activity_log SET seq = 0 - seq WHERE seq IN ({a}, {b}) AND organization_id = $1"),
            &[&org],
        );
        sql(&stack, &format!("UPDATE activity_log SET seq = {b} WHERE seq = -{a} AND organization_id = $1"), &[&org]);
        sql(&stack, &format!("UPDATE activity_log SET seq = {a} WHERE seq = -{b} AND organization_id = $1"), &[&org]);
    };
    swap(2, 4);
    let verdict = export_and_verify(&stack, "moved").await;
    assert_eq!((verdict["verified"].as_bool(), verdict["seq"].as_u64()), (Some(false), Some(2)), "{verdict}");
    assert_eq!(verdict["activityId"], ids[3].as_str(), "{verdict}");
    swap(2, 4);
    assert_eq!(export_and_verify(&stack, "moved back").await["verified"], true);

    // Deleted: the fifth activity's row.
    let deleted = &ids[4];
    assert_eq!(sql(&stack, "DELETE FROM activities WHERE id = $1", &[deleted]), 1);
    let verdict = export_and_verify(&stack, "deleted").await;
    assert_eq!(
        (verdict["verified"].as_bool(), verdict["activityId"].as_str()),
        (Some(false), Some(deleted.as_str())),
        "{verdict}"
    );
    assert!(verdict["reason"].as_str().unwrap().contains("missing"), "{verdict}");

    // A link deleted outright: the gap is named.
    assert_eq!(sql(&stack, "DELETE FROM activity_log WHERE seq = 2 AND organization_id = $1", &[&org]), 1);
    let verdict = export_and_verify(&stack, "link deleted").await;
    assert_eq!((verdict["verified"].as_bool(), verdict["seq"].as_u64()), (Some(false), Some(2)), "{verdict}");
}

#[tokio::test]
async fn the_log_verifies_until_a_row_is_changed_on_sqlite() {
    the_log_verifies_until_a_row_is_changed("sqlite").await;
}

#[tokio::test]
async fn the_log_verifies_until_a_row_is_changed_on_postgres() {
    the_log_verifies_until_a_row_is_changed("postgres").await;
}

/// A taken-over gateway on the enclave socket: `RecordActivity` takes only a finished activity of
/// a submission a certified credential stamped, named as that submission names itself, with no
/// app proof but the enclave's own, completed only if the enclave authorized it, and one the
/// enclave never decided only while its stamp is fresh; everything else is refused with a typed
/// reason and moves no head.
#[tokio::test]
async fn the_enclave_logs_only_finished_activities_of_genuinely_stamped_submissions() {
    use coffer_proto::v1 as pb;
    use sha2::Digest;
    let stack = Stack::start_on("sqlite", &[]).await;
    let org = stack.organization_id.clone();
    let enclave = coffer_proto::v1::enclave_client::EnclaveClient::new(
        coffer_gateway::custody::transport::connect_all(vec![
            coffer_gateway::custody::transport::EnclaveEndpoint::Unix(stack.enclave_socket()),
        ])
        .unwrap(),
    );
    let key = stack.api_key();
    let certificate: Vec<u8> = rusqlite::Connection::open(stack.database_path())
        .unwrap()
        .query_row("SELECT certificate FROM api_keys WHERE public_key = ?1", [&stack.api_public_key], |r| r.get(0))
        .unwrap();
    // A change whose handler calls the enclave before `ApplyActivity`, linked after it finishes
    // (one linked in its call is linked completed only there).
    let body = json!({"type": "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT", "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org, "parameters": {"url": "https://hooks.example/never-run", "name": "never-run"}})
    .to_string();
    let fingerprint = format!("sha256:{}", hex::encode(sha2::Sha256::digest(body.as_bytes())));
    let stamped = |key: &turnkey_api_key_stamper::TurnkeyP256ApiKey| {
        use turnkey_api_key_stamper::Stamp;
        let stamp = key.stamp(body.as_bytes()).unwrap();
        pb::StampedRequest {
            body: body.as_bytes().to_vec(),
            stamp_header: stamp.name,
            stamp: stamp.value,
            certificate: certificate.clone(),
        }
    };
    // As the gateway records it: the id derived from the body, the body's parameters as intent.
    let id = coffer_auth::envelope::derived_id(&fingerprint, coffer_auth::envelope::ACTIVITY_ID, 0);
    let activity = json!({"id": id, "organizationId": org, "type": "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
        "fingerprint": fingerprint, "status": "ACTIVITY_STATUS_COMPLETED",
        "intent": {"createWebhookEndpointIntent": {"url": "https://hooks.example/never-run", "name": "never-run"}},
        "result": {"createWebhookEndpointResult": {"webhookEndpointId": "w"}}, "appProofs": [],
        "votes": [{"userId": stack.user_id, "selection": "VOTE_SELECTION_APPROVED", "publicKey": stack.api_public_key,
            "message": body}]});
    let record = |request: pb::StampedRequest, activity: &Value| {
        let mut enclave = enclave.clone();
        let req = pb::RecordActivityRequest {
            request: Some(request),
            activity: activity.to_string().into_bytes(),
            votes: vec![],
        };
        async move { enclave.record_activity(req).await }
    };
    let reason = |r: Result<tonic::Response<pb::RecordActivityResponse>, tonic::Status>| match r {
        Err(s) => {
            coffer_proto::refusal_reason(&s).map_or_else(|| format!("{:?}", s.code()), |r| r.as_str_name().to_string())
        }
        Ok(r) => panic!("recorded: {:?}", r.into_inner()),
    };
    let head = || {
        let mut enclave = enclave.clone();
        let org = org.clone();
        async move {
            enclave
                .get_log_head(pb::GetLogHeadRequest { organization_id: org, nonce: String::new() })
                .await
                .unwrap()
                .into_inner()
                .seq
        }
    };
    let before = head().await;

    // Another key's stamp over the body, under the root key's certificate.
    let stranger = turnkey_api_key_stamper::TurnkeyP256ApiKey::generate();
    assert_eq!(reason(record(stamped(&stranger), &activity).await), "REFUSAL_REASON_STAMP_INVALID");
    // The activity names another fingerprint, organization, type, id or intent than the stamped
    // body, or states its result under another name.
    for (field, value) in [
        ("fingerprint", json!("sha256:00")),
        ("organizationId", json!("another")),
        ("type", json!("ACTIVITY_TYPE_CREATE_WALLET")),
        ("id", json!("a-1")),
        ("intent", json!({"createWebhookEndpointIntent": {"url": "https://hooks.example/x", "name": "never-run"}})),
        ("result", json!({"createPolicyResult": {}})),
    ] {
        let mut other = activity.clone();
        other[field] = value;
        assert_eq!(reason(record(stamped(&key), &other).await), "REFUSAL_REASON_BINDING_MISMATCH", "{field}");
    }
    // Not finished.
    let mut waiting = activity.clone();
    waiting["status"] = json!("ACTIVITY_STATUS_CONSENSUS_NEEDED");
    waiting["result"] = json!({});
    assert_eq!(reason(record(stamped(&key), &waiting).await), "InvalidArgument");
    // An app proof the enclave did not make.
    let mut foreign = activity.clone();
    foreign["appProofs"] = json!([{"scheme": "SIGNATURE_SCHEME_EPHEMERAL_KEY_P256", "publicKey": "04".repeat(130),
        "proofPayload": "{}", "signature": "00".repeat(64)}]);
    assert_eq!(reason(record(stamped(&key), &foreign).await), "REFUSAL_REASON_BINDING_MISMATCH");
    assert_eq!(head().await, before, "no refusal moved the head");

    // Reported completed, but never submitted to the enclave (issue 40, E4/E5): the log says an
    // activity completed only when the enclave's decision log authorized it.
    assert_eq!(reason(record(stamped(&key), &activity).await), "REFUSAL_REASON_NOT_DECIDED");
    assert_eq!(head().await, before, "no refusal moved the head");

    // The genuine stamp over the body, the activity as it names itself, failed before it reached
    // the enclave (as the gateway reports what it refused itself): one more link, while the stamp
    // is fresh.
    let mut activity = activity.clone();
    activity["status"] = json!("ACTIVITY_STATUS_FAILED");
    let with_result = record(stamped(&key), &activity).await;
    assert_eq!(reason(with_result), "REFUSAL_REASON_BINDING_MISMATCH", "failed, with a result");
    activity["result"] = json!({});
    let recorded = record(stamped(&key), &activity).await.unwrap().into_inner();
    assert_eq!(recorded.seq, before + 1);
    let link = recorded.link.unwrap();
    let link: AppProof = serde_json::from_value(json!({"scheme": link.scheme, "publicKey": link.public_key,
        "proofPayload": link.proof_payload, "signature": link.signature}))
    .unwrap();
    assert!(verifies(&link), "a link appended alone is signed");
    assert_eq!(payload(&link)["activityLogLink"]["fingerprint"], fingerprint.as_str());
    assert_eq!(head().await, before + 1);
    // Linked once (issue 40, E5, E7): the same activity failed again is a replay; rejected now
    // (with no rejection among its votes) it states what no voter stamped; under another id, it
    // is not the stamped body's. The head does not move.
    for (other_id, status, refusal) in [
        (id.as_str(), "FAILED", "REFUSAL_REASON_REPLAYED"),
        (id.as_str(), "REJECTED", "REFUSAL_REASON_BINDING_MISMATCH"),
        ("a-2", "FAILED", "REFUSAL_REASON_BINDING_MISMATCH"),
    ] {
        let mut again = activity.clone();
        again["id"] = json!(other_id);
        again["status"] = json!(format!("ACTIVITY_STATUS_{status}"));
        assert_eq!(reason(record(stamped(&key), &again).await), refusal, "{other_id} {status}");
    }
    assert_eq!(head().await, before + 1);

    // A stamp kept for a day and reported now, failed or completed: the enclave never decided it.
    let old_body = json!({"type": "ACTIVITY_TYPE_CREATE_WEBHOOK_ENDPOINT",
        "timestampMs": (Stack::now_ms() - 86_400_000).to_string(), "organizationId": org,
        "parameters": {"url": "https://hooks.example/kept", "name": "kept"}})
    .to_string();
    let old_stamp = {
        use turnkey_api_key_stamper::Stamp;
        let stamp = key.stamp(old_body.as_bytes()).unwrap();
        pb::StampedRequest {
            body: old_body.as_bytes().to_vec(),
            stamp_header: stamp.name,
            stamp: stamp.value,
            certificate: certificate.clone(),
        }
    };
    let old_fingerprint = format!("sha256:{}", hex::encode(sha2::Sha256::digest(old_body.as_bytes())));
    for status in ["ACTIVITY_STATUS_FAILED", "ACTIVITY_STATUS_COMPLETED"] {
        let mut kept = activity.clone();
        kept["id"] = json!("a-2");
        kept["fingerprint"] = json!(old_fingerprint);
        kept["status"] = json!(status);
        assert_eq!(reason(record(old_stamp.clone(), &kept).await), "REFUSAL_REASON_STALE", "{status}");
    }
    assert_eq!(head().await, before + 1, "no refusal moved the head");
}

/// An exported activity log checked without `coffer_auth` (whose `verify_log` is the code under
/// test): the hash chain recomputed here, signatures checked with the `p256` crate (the verifier
/// uses `ring`), and every field of every link compared with what it must say.
///
/// The format, as the enclave writes it (`coffer_auth::proof`; docs/proofs.md "The activity log"): a
/// proof is `{scheme, publicKey, proofPayload, signature}`, `publicKey` the proof key's point
/// twice, `signature` r ‖ s over SHA-256 of the payload, or empty for a link inside a group (the
/// chain carries it to the group's signed last link or to the signed head). A link's payload is
/// `{"type": "COFFER_PROOF_TYPE_ACTIVITY_LOG_LINK", "timestampMs", "activityLogLink": {
/// organizationId, seq, activityId, fingerprint, activityType, status, activityDigest, previous,
/// head}}`; the head's is `{"type": "COFFER_PROOF_TYPE_ACTIVITY_LOG_HEAD", "timestampMs",
/// "activityLogHead": {organizationId, seq, head}}`. With hashes as lowercase hex:
/// genesis = SHA-256("coffer-activity-log-v1" 0 ‖ organizationId), and link n's head =
/// SHA-256("coffer-activity-log-link-v1" 0 ‖ previous ‖ 0 ‖ n as 8 bytes big-endian ‖
/// activityId ‖ 0 ‖ activityDigest), where activityDigest = SHA-256 of the activity's canonical
/// JSON (members sorted, no whitespace) without its top-level `canApprove` and `canReject`.
mod chain {
    use serde_json::Value;
    use sha2::{Digest, Sha256};

    pub const SCHEME: &str = "SIGNATURE_SCHEME_EPHEMERAL_KEY_P256";
    pub const LINK: &str = "COFFER_PROOF_TYPE_ACTIVITY_LOG_LINK";
    pub const HEAD: &str = "COFFER_PROOF_TYPE_ACTIVITY_LOG_HEAD";
    const LINK_FIELDS: [&str; 9] = [
        "organizationId",
        "seq",
        "activityId",
        "fingerprint",
        "activityType",
        "status",
        "activityDigest",
        "previous",
        "head",
    ];

    /// A log that checks out: its links, how many of them carry their own signature, its head.
    #[derive(Debug, PartialEq)]
    pub struct Checked {
        pub links: u64,
        pub signed: u64,
        pub head: String,
    }

    /// Where a log fails: the position (0: the signed head) and what is wrong there.
    pub type Fault = (u64, &'static str);

    fn sha256_hex(parts: &[&[u8]]) -> String {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
        }
        hex::encode(h.finalize())
    }

    pub fn genesis(organization_id: &str) -> String {
        sha256_hex(&[b"coffer-activity-log-v1\0", organization_id.as_bytes()])
    }

    pub fn link_head(previous: &str, n: u64, activity_id: &str, digest: &str) -> String {
        sha256_hex(&[
            b"coffer-activity-log-link-v1\0",
            previous.as_bytes(),
            b"\0",
            &n.to_be_bytes(),
            activity_id.as_bytes(),
            b"\0",
            digest.as_bytes(),
        ])
    }

    fn canonical(v: &Value, top: bool, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> =
                    m.keys().filter(|k| !(top && (*k == "canApprove" || *k == "canReject"))).collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    canonical(&m[k], false, out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical(x, false, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }

    pub fn activity_digest(activity: &Value) -> String {
        let mut text = String::new();
        canonical(activity, true, &mut text);
        sha256_hex(&[text.as_bytes()])
    }

    /// One proof: exactly its four string members, the scheme, the proof key twice, and its
    /// signature (checked with `p256`) unless it has none. Returns the payload's statement (the
    /// member `member` of a payload of type `kind`) and whether the proof is signed.
    fn statement(proof: &Value, key: &[u8; 65], kind: &str, member: &str) -> Result<(Value, bool), &'static str> {
        use p256::ecdsa::signature::Verifier;
        let fields = proof.as_object().ok_or("proof")?;
        if fields.len() != 4 || fields.values().any(|v| !v.is_string()) {
            return Err("proof");
        }
        let text = |k: &str| proof[k].as_str().ok_or("proof");
        if text("scheme")? != SCHEME {
            return Err("scheme");
        }
        let point = hex::encode(key);
        if text("publicKey")? != format!("{point}{point}") {
            return Err("publicKey");
        }
        let payload = text("proofPayload")?;
        let signed = !text("signature")?.is_empty();
        if signed {
            let signature = hex::decode(text("signature")?).map_err(|_| "signature")?;
            let signature = p256::ecdsa::Signature::from_slice(&signature).map_err(|_| "signature")?;
            let verifying = p256::ecdsa::VerifyingKey::from_sec1_bytes(key).map_err(|_| "publicKey")?;
            verifying.verify(payload.as_bytes(), &signature).map_err(|_| "signature")?;
        }
        let payload: Value = serde_json::from_str(payload).map_err(|_| "proofPayload")?;
        let members = payload.as_object().ok_or("proofPayload")?;
        if members.len() != 3 || !members.contains_key(member) {
            return Err("proofPayload");
        }
        if payload["type"] != kind {
            return Err("type");
        }
        let ms = payload["timestampMs"].as_str().ok_or("timestampMs")?;
        if ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) {
            return Err("timestampMs");
        }
        Ok((payload[member].clone(), signed))
    }

    /// Checks an exported log (`{organizationId, head, links, activities}`) against the proof key.
    pub fn check(log: &Value, key: &[u8; 65]) -> Result<Checked, Fault> {
        let org = log["organizationId"].as_str().ok_or((0, "organizationId"))?;
        let (head, signed) = statement(&log["head"], key, HEAD, "activityLogHead").map_err(|what| (0, what))?;
        if !signed {
            return Err((0, "signature"));
        }
        if head["organizationId"] != org {
            return Err((0, "organizationId"));
        }
        let head_seq: u64 = head["seq"].as_str().and_then(|s| s.parse().ok()).ok_or((0, "seq"))?;
        let activities: std::collections::HashMap<&str, &Value> = log["activities"]
            .as_array()
            .ok_or((0, "activities"))?
            .iter()
            .filter_map(|a| Some((a["id"].as_str()?, a)))
            .collect();
        let links = log["links"].as_array().ok_or((0, "links"))?;
        let (mut previous, mut signed_links) = (genesis(org), 0);
        for (i, proof) in links.iter().enumerate() {
            let n = i as u64 + 1;
            if n > head_seq {
                return Err((n, "beyond the signed head"));
            }
            let (link, signed) = statement(proof, key, LINK, "activityLogLink").map_err(|what| (n, what))?;
            let body = link.as_object().ok_or((n, "activityLogLink"))?;
            if body.len() != LINK_FIELDS.len()
                || LINK_FIELDS.iter().any(|f| !body.get(*f).is_some_and(Value::is_string))
            {
                return Err((n, "activityLogLink"));
            }
            let field = |f: &str| body[f].as_str().unwrap_or_default();
            if field("organizationId") != org {
                return Err((n, "organizationId"));
            }
            if field("seq") != n.to_string() {
                return Err((n, "seq"));
            }
            if field("previous") != previous {
                return Err((n, "previous"));
            }
            let activity = activities.get(field("activityId")).ok_or((n, "activityId"))?;
            for (ours, theirs) in [("fingerprint", "fingerprint"), ("activityType", "type"), ("status", "status")] {
                if activity[theirs].as_str() != Some(field(ours)) {
                    return Err((n, ours));
                }
            }
            if activity_digest(activity) != field("activityDigest") {
                return Err((n, "activityDigest"));
            }
            let head = link_head(&previous, n, field("activityId"), field("activityDigest"));
            if field("head") != head {
                return Err((n, "head"));
            }
            previous = head;
            signed_links += u64::from(signed);
        }
        let count = links.len() as u64;
        if count < head_seq {
            return Err((count + 1, "the log ends before the signed head"));
        }
        if head["head"].as_str() != Some(previous.as_str()) {
            return Err((0, "head"));
        }
        Ok(Checked { links: count, signed: signed_links, head: previous })
    }

    /// `payload` with the string value of its member `key` (which it has once) replaced by
    /// `value`: every other byte stays as the enclave wrote it.
    pub fn set(payload: &str, key: &str, value: &str) -> String {
        let pattern = format!("\"{key}\":\"");
        assert_eq!(payload.matches(&pattern).count(), 1, "{key} in {payload}");
        let start = payload.find(&pattern).unwrap() + pattern.len();
        let end = start + payload[start..].find('"').unwrap();
        assert_ne!(&payload[start..end], value, "{key} already is {value}");
        format!("{}{value}{}", &payload[..start], &payload[end..])
    }
}

/// The genuine export checks out in an implementation of the chain written here (the number of
/// links, their order, the head the enclave signed); then every field of a link is changed, one at
/// a time (with the link's signature kept, and with it removed, as a link inside a group has
/// none), links are dropped, swapped and inserted, and both `verify-log` and the implementation
/// here must refuse each, naming the link and what is wrong with it. Only a link's timestamp,
/// when the link has no signature of its own, is not covered (the chain does not hash it).
#[tokio::test]
async fn every_changed_field_or_moved_link_of_an_exported_log_fails_both_verifiers() {
    use p256::ecdsa::signature::Signer;
    let stack = Stack::start_on("sqlite", &[]).await;
    let org = stack.organization_id.clone();
    let client = stack.client();
    let ids = six_logged_activities(&client, &org).await;

    let dir = std::env::temp_dir().join(format!("coffer-log-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (file, key_hex) = export_log(&stack, &dir, "genuine").await;
    let key: [u8; 65] = hex::decode(&key_hex).unwrap().try_into().unwrap();
    let genuine: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();

    // The genuine export: 6 links, in the order the activities ran, each a group of one (they ran
    // one after another), so each signed; their chain ends at the head the enclave signed.
    let checked = chain::check(&genuine, &key).unwrap_or_else(|f| panic!("the genuine export fails at {f:?}"));
    let signed_head: Value =
        serde_json::from_str(genuine["head"]["proofPayload"].as_str().unwrap()).expect("the head's payload");
    assert_eq!(signed_head["activityLogHead"]["seq"], "6");
    assert_eq!(
        checked,
        chain::Checked {
            links: 6,
            signed: 6,
            head: signed_head["activityLogHead"]["head"].as_str().unwrap().to_string()
        }
    );
    let link = |log: &Value, i: usize| -> Value {
        serde_json::from_str::<Value>(log["links"][i]["proofPayload"].as_str().unwrap()).unwrap()["activityLogLink"]
            .clone()
    };
    let named: Vec<String> = (0..6).map(|i| link(&genuine, i)["activityId"].as_str().unwrap().to_string()).collect();
    assert_eq!(named, ids);
    assert_eq!(link(&genuine, 0)["previous"], chain::genesis(&org).as_str());
    assert_eq!(
        verify_log_cli(&file, &key_hex),
        (Some(0), json!({ "verified": true, "links": 6, "unlogged": [], "fresh": true }))
    );

    let round = std::cell::Cell::new(0);
    let write = |log: &Value| {
        round.set(round.get() + 1);
        let path = dir.join(format!("changed-{}.json", round.get()));
        std::fs::write(&path, serde_json::to_vec(log).unwrap()).unwrap();
        path
    };
    // Both verifiers accept `log`, with the genuine log's links and head.
    let accepted = |what: &str, log: &Value| {
        assert_eq!(chain::check(log, &key).map(|c| (c.links, c.head)), Ok((6, checked.head.clone())), "{what}");
        let (status, verdict) = verify_log_cli(&write(log), &key_hex);
        assert_eq!(
            (status, &verdict),
            (Some(0), &json!({ "verified": true, "links": 6, "unlogged": [], "fresh": true })),
            "{what}"
        );
    };
    // Both refuse `log`: verify-log exits 1 naming link `seq` (and `activity`, when given) with a
    // reason holding `reason`; the check here names position `at` and the field `field`.
    let refused = |what: &str, log: &Value, seq: u64, activity: Option<&str>, reason: &str, at: u64, field: &str| {
        assert_eq!(chain::check(log, &key).map(|c| c.links), Err((at, field)), "{what}");
        let (status, verdict) = verify_log_cli(&write(log), &key_hex);
        assert_eq!(
            (status, verdict["verified"].as_bool(), verdict["seq"].as_u64()),
            (Some(1), Some(false), Some(seq)),
            "{what}: {verdict}"
        );
        assert!(verdict["reason"].as_str().unwrap().contains(reason), "{what}: {verdict}");
        if let Some(id) = activity {
            assert_eq!(verdict["activityId"], id, "{what}: {verdict}");
        }
    };
    let payload_of = |log: &Value, i: usize| log["links"][i]["proofPayload"].as_str().unwrap().to_string();
    let with_link = |i: usize, change: &dyn Fn(&mut Value)| {
        let mut log = genuine.clone();
        change(&mut log["links"][i]);
        log
    };

    // An attacker's key, and a link it signs.
    let attacker = p256::ecdsa::SigningKey::from_slice(&[9; 32]).unwrap();
    let attacker_point = hex::encode(attacker.verifying_key().to_encoded_point(false).as_bytes());
    let sign_as_attacker = |proof: &mut Value, payload: String| {
        let signature: p256::ecdsa::Signature = attacker.sign(payload.as_bytes());
        proof["publicKey"] = json!(format!("{attacker_point}{attacker_point}"));
        proof["signature"] = json!(hex::encode(signature.to_bytes()));
        proof["proofPayload"] = json!(payload);
    };

    // Link 3 (index 2), and what each of its payload's fields is changed to.
    let third = link(&genuine, 2);
    let fourth = link(&genuine, 3);
    let other_org = uuid::Uuid::new_v4().to_string();
    let zeros = "0".repeat(64);
    let changes: Vec<(&str, String)> = vec![
        ("type", chain::HEAD.to_string()),
        ("timestampMs", "1".to_string()),
        ("organizationId", other_org.clone()),
        ("seq", "4".to_string()),
        ("activityId", ids[3].clone()),
        ("fingerprint", format!("sha256:{zeros}")),
        ("activityType", "ACTIVITY_TYPE_CREATE_WALLET".to_string()),
        ("status", "ACTIVITY_STATUS_FAILED".to_string()),
        ("activityDigest", fourth["activityDigest"].as_str().unwrap().to_string()),
        ("previous", third["head"].as_str().unwrap().to_string()),
        ("head", zeros.clone()),
    ];
    let bad_signature = "the signature does not verify over the payload";

    // Signed link 3, its proof's own fields changed.
    refused(
        "scheme",
        &with_link(2, &|p| p["scheme"] = json!("SIGNATURE_SCHEME_TK_API_P256")),
        3,
        Some(""),
        "unsupported signature scheme",
        3,
        "scheme",
    );
    refused(
        "publicKey",
        &with_link(2, &|p| p["publicKey"] = json!(format!("{attacker_point}{attacker_point}"))),
        3,
        Some(""),
        "signed by another key",
        3,
        "publicKey",
    );
    let flipped = |p: &mut Value| {
        let mut s = p["signature"].as_str().unwrap().to_string();
        let last = s.pop().unwrap();
        s.push(if last == '0' { '1' } else { '0' });
        p["signature"] = json!(s);
    };
    refused("signature", &with_link(2, &flipped), 3, Some(""), bad_signature, 3, "signature");
    // Each field of its payload, the signature kept; and signed again by the attacker.
    for (field, value) in &changes {
        let changed = chain::set(&payload_of(&genuine, 2), field, value);
        let log = with_link(2, &|p| p["proofPayload"] = json!(changed.clone()));
        refused(&format!("signed {field}"), &log, 3, Some(""), bad_signature, 3, "signature");
        let log = with_link(2, &|p| sign_as_attacker(p, changed.clone()));
        refused(&format!("re-signed {field}"), &log, 3, Some(""), "signed by another key", 3, "publicKey");
    }

    // Link 3 without its signature is a link inside a group: accepted, the chain covers it.
    let unsigned = |p: &mut Value| p["signature"] = json!("");
    accepted("link 3 unsigned", &with_link(2, &unsigned));
    let mut all_unsigned = genuine.clone();
    for p in all_unsigned["links"].as_array_mut().unwrap() {
        p["signature"] = json!("");
    }
    accepted("every link unsigned (the signed head covers them)", &all_unsigned);
    // Unsigned, each of its fields changed: the chain, the activity or the proof key refuses it.
    let unsigned_with = |change: &dyn Fn(&mut Value)| {
        with_link(2, &|p| {
            unsigned(p);
            change(p)
        })
    };
    let id3 = Some(ids[2].as_str());
    refused(
        "unsigned scheme",
        &unsigned_with(&|p| p["scheme"] = json!("SIGNATURE_SCHEME_TK_API_P256")),
        3,
        None,
        "unsupported signature scheme",
        3,
        "scheme",
    );
    refused(
        "unsigned publicKey",
        &unsigned_with(&|p| p["publicKey"] = json!(format!("{attacker_point}{attacker_point}"))),
        3,
        None,
        "another key",
        3,
        "publicKey",
    );
    let recorded = "is not the one recorded";
    let expected: Vec<(&str, Option<&str>, &str, &str)> = vec![
        ("type", None, "not an activity log link", "type"),
        ("organizationId", id3, "another organization's", "organizationId"),
        ("seq", id3, "link 3 is missing or moved", "seq"),
        ("activityId", Some(ids[3].as_str()), recorded, "fingerprint"),
        ("fingerprint", id3, recorded, "fingerprint"),
        ("activityType", id3, recorded, "activityType"),
        ("status", id3, recorded, "status"),
        ("activityDigest", id3, "its digest differs", "activityDigest"),
        ("previous", id3, "does not follow the link before it", "previous"),
        ("head", id3, "the link's head is not the hash of its contents", "head"),
    ];
    for (field, value) in &changes {
        let changed = chain::set(&payload_of(&genuine, 2), field, value);
        let log = unsigned_with(&|p| p["proofPayload"] = json!(changed.clone()));
        if *field == "timestampMs" {
            // Not hashed into the chain: without the link's own signature, nothing covers it.
            accepted("unsigned timestampMs", &log);
            continue;
        }
        let (_, activity, reason, named) = expected.iter().find(|(f, ..)| f == field).unwrap();
        refused(&format!("unsigned {field}"), &log, 3, *activity, reason, 3, named);
    }
    assert_eq!(expected.len() + 1, changes.len(), "every field changed is checked");

    // Links dropped, swapped, copied and forged.
    let links_changed = |change: &dyn Fn(&mut Vec<Value>)| {
        let mut log = genuine.clone();
        change(log["links"].as_array_mut().unwrap());
        log
    };
    refused(
        "link 3 dropped",
        &links_changed(&|l| drop(l.remove(2))),
        3,
        Some(ids[3].as_str()),
        "link 3 is missing or moved",
        3,
        "seq",
    );
    refused(
        "links 2 and 4 swapped",
        &links_changed(&|l| l.swap(1, 3)),
        2,
        Some(ids[3].as_str()),
        "missing or moved",
        2,
        "seq",
    );
    refused(
        "link 3 copied after itself",
        &links_changed(&|l| l.insert(3, l[2].clone())),
        4,
        Some(ids[2].as_str()),
        "out of place (it says 3)",
        4,
        "seq",
    );
    refused(
        "the last link dropped",
        &links_changed(&|l| drop(l.pop())),
        6,
        Some(""),
        "the log ends at 5",
        6,
        "the log ends before the signed head",
    );
    // A forged seventh link, chained on the sixth, recording the first activity again: without a
    // signature, and signed by the attacker.
    let first = link(&genuine, 0);
    let forged = {
        let digest = first["activityDigest"].as_str().unwrap();
        let head = chain::link_head(&checked.head, 7, &ids[0], digest);
        let mut body = first.clone();
        body["seq"] = json!("7");
        body["previous"] = json!(checked.head);
        body["head"] = json!(head);
        let payload = json!({"type": chain::LINK, "timestampMs": Stack::now_ms().to_string(), "activityLogLink": body});
        let mut p = genuine["links"][0].clone();
        p["proofPayload"] = json!(payload.to_string());
        p["signature"] = json!("");
        p
    };
    refused(
        "a forged unsigned link appended",
        &links_changed(&|l| l.push(forged.clone())),
        6,
        Some(ids[0].as_str()),
        "do not end at the enclave's signed head",
        7,
        "beyond the signed head",
    );
    let mut signed_forgery = forged.clone();
    sign_as_attacker(&mut signed_forgery, forged["proofPayload"].as_str().unwrap().to_string());
    refused(
        "a forged signed link appended",
        &links_changed(&|l| l.push(signed_forgery.clone())),
        7,
        Some(""),
        "signed by another key",
        7,
        "beyond the signed head",
    );
    // The signed head itself, changed.
    let mut log = genuine.clone();
    flipped(&mut log["head"]);
    refused("the head's signature", &log, 0, Some(""), "the signed head", 0, "signature");
    let _ = std::fs::remove_dir_all(&dir);
}
