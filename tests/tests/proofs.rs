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

/// Exports the stack's log with `coffer-gateway export-log` and checks it with `verify-log`
/// against the proof key discovery publishes: the verdict as the command printed it.
async fn export_and_verify(stack: &Stack, round: &str) -> Value {
    let dir = std::env::temp_dir().join(format!("coffer-log-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
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
    let key = discovery["proofPublicKey"].as_str().unwrap().to_string();
    let output = std::process::Command::new(coffer_tests::bin_dir().join("coffer-gateway"))
        .args(["verify-log", "--log", out.to_str().unwrap(), "--proof-key", &key])
        .output()
        .unwrap();
    let verdict: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("verify-log printed no JSON: {}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(output.status.success(), verdict["verified"] == true, "{verdict}");
    let _ = std::fs::remove_dir_all(&dir);
    verdict
}

async fn the_log_verifies_until_a_row_is_changed(store: &str) {
    let stack = Stack::start_on(store, &[]).await;
    let org = stack.organization_id.clone();
    let client = stack.client();
    let wallet = client
        .create_wallet(
            org.clone(),
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
            .sign_raw_payload(org.clone(), client.current_timestamp(), sign_intent(&address, &format!("m{i}")))
            .await
            .unwrap();
        ids.push(signed.activity_id);
    }
    let tag = client
        .create_user_tag(
            org.clone(),
            client.current_timestamp(),
            CreateUserTagIntent { user_tag_name: "t".into(), user_ids: vec![] },
        )
        .await
        .unwrap();
    ids.push(tag.activity_id);
    let links = ids.len() as u64;

    let honest = export_and_verify(&stack, "honest").await;
    assert_eq!(honest, json!({ "verified": true, "links": links, "unlogged": [] }));

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
/// app proof but the enclave's own; everything else is refused with a typed reason and moves no
/// head.
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
    let body = json!({"type": "ACTIVITY_TYPE_CREATE_USER_TAG", "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org, "parameters": {"userTagName": "never-run", "userIds": []}})
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
    let activity = json!({"id": "a-1", "organizationId": org, "type": "ACTIVITY_TYPE_CREATE_USER_TAG",
        "fingerprint": fingerprint, "status": "ACTIVITY_STATUS_COMPLETED", "result": {}, "appProofs": []});
    let record = |request: pb::StampedRequest, activity: &Value| {
        let mut enclave = enclave.clone();
        let req = pb::RecordActivityRequest { request: Some(request), activity: activity.to_string().into_bytes() };
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
        async move { enclave.get_log_head(pb::GetLogHeadRequest { organization_id: org }).await.unwrap().into_inner().seq }
    };
    let before = head().await;

    // Another key's stamp over the body, under the root key's certificate.
    let stranger = turnkey_api_key_stamper::TurnkeyP256ApiKey::generate();
    assert_eq!(reason(record(stamped(&stranger), &activity).await), "REFUSAL_REASON_STAMP_INVALID");
    // The activity names another fingerprint, organization or type than the stamped body.
    for (field, value) in [
        ("fingerprint", json!("sha256:00")),
        ("organizationId", json!("another")),
        ("type", json!("ACTIVITY_TYPE_CREATE_WALLET")),
    ] {
        let mut other = activity.clone();
        other[field] = value;
        assert_eq!(reason(record(stamped(&key), &other).await), "REFUSAL_REASON_BINDING_MISMATCH", "{field}");
    }
    // Not finished.
    let mut waiting = activity.clone();
    waiting["status"] = json!("ACTIVITY_STATUS_CONSENSUS_NEEDED");
    assert_eq!(reason(record(stamped(&key), &waiting).await), "InvalidArgument");
    // An app proof the enclave did not make.
    let mut foreign = activity.clone();
    foreign["appProofs"] = json!([{"scheme": "SIGNATURE_SCHEME_EPHEMERAL_KEY_P256", "publicKey": "04".repeat(130),
        "proofPayload": "{}", "signature": "00".repeat(64)}]);
    assert_eq!(reason(record(stamped(&key), &foreign).await), "REFUSAL_REASON_BINDING_MISMATCH");
    assert_eq!(head().await, before, "no refusal moved the head");

    // The genuine stamp over the body, the activity as it names itself: one more link.
    let recorded = record(stamped(&key), &activity).await.unwrap().into_inner();
    assert_eq!(recorded.seq, before + 1);
    let link = recorded.link.unwrap();
    let link: AppProof = serde_json::from_value(json!({"scheme": link.scheme, "publicKey": link.public_key,
        "proofPayload": link.proof_payload, "signature": link.signature}))
    .unwrap();
    assert!(verifies(&link), "a link appended alone is signed");
    assert_eq!(payload(&link)["activityLogLink"]["fingerprint"], fingerprint.as_str());
    assert_eq!(head().await, before + 1);
}
