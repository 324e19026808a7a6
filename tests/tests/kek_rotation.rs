//! End to end: the KEK rotates while keys sign, every stored blob moves to the new KEK through
//! `coffer-gateway reseal` (killed with SIGKILL half way, then run again), the old KEK is
//! destroyed, and every key still signs and exports, checked with independent libraries.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use coffer_tests::{bin_dir, recover_eth_address, Stack};
use sha2::Digest;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, Curve, HashFunction, PathFormat, PayloadEncoding,
};
use turnkey_client::generated::{
    CreatePrivateKeysIntentV2, CreateWalletIntent, ExportPrivateKeyIntent, ExportWalletIntent, PrivateKeyParams,
    SignRawPayloadIntentV2, WalletAccountParams,
};

const FIRST: &str = "coffer-kek-v1";
const SECOND: &str = "coffer-kek-v2";

fn keccak_intent(sign_with: &str, text: &str) -> SignRawPayloadIntentV2 {
    SignRawPayloadIntentV2 {
        sign_with: sign_with.into(),
        payload: text.into(),
        encoding: PayloadEncoding::TextUtf8,
        hash_function: HashFunction::Keccak256,
        external_signer_pubkey: None,
    }
}

/// The stored blobs naming `label` in `kek-status`'s report, and its line for `label`.
fn stored_under(status: &serde_json::Value, label: &str) -> u64 {
    let line = status["keks"].as_array().unwrap().iter().find(|k| k["label"] == label);
    line.map_or(0, |k| k["storedBlobs"].as_u64().unwrap())
}

/// Signs `text` with `address` (an Ethereum address) and checks the signature recovers to it.
async fn signs(stack: &Stack, address: &str, text: &str) {
    let client = stack.client();
    let sig = client
        .sign_raw_payload(stack.organization_id.clone(), client.current_timestamp(), keccak_intent(address, text))
        .await
        .unwrap_or_else(|e| panic!("{address} does not sign: {e:?}"))
        .result;
    let digest: [u8; 32] = sha3::Keccak256::digest(text.as_bytes()).into();
    assert_eq!(recover_eth_address(&digest, &sig.r, &sig.s, &sig.v), address.to_lowercase());
}

/// Makes secp256k1 private keys with Ethereum addresses named `names`, in one activity.
async fn ethereum_keys(stack: &Stack, names: &[String]) -> Vec<turnkey_client::generated::PrivateKeyResult> {
    let client = stack.client();
    let private_keys = names
        .iter()
        .map(|name| PrivateKeyParams {
            private_key_name: name.clone(),
            curve: Curve::Secp256k1,
            private_key_tags: vec![],
            address_formats: vec![AddressFormat::Ethereum],
        })
        .collect();
    let intent =
        CreatePrivateKeysIntentV2 { private_keys, external_signer_pubkey: None, external_signer_wrapping_key_id: None };
    let created = client.create_private_keys(stack.organization_id.clone(), client.current_timestamp(), intent).await;
    created.unwrap().result.private_keys
}

#[tokio::test]
async fn the_kek_rotates_under_load_and_every_key_still_signs_and_exports() {
    let stack = Arc::new(Stack::start().await);
    let client = stack.client();
    let org = stack.organization_id.clone();

    // Blobs of each kind the gateway keeps: a wallet's seed and accounts, and private keys.
    let accounts = (0..3)
        .map(|i| WalletAccountParams {
            curve: Curve::Secp256k1,
            path_format: PathFormat::Bip32,
            path: format!("m/44'/60'/0'/0/{i}"),
            address_format: AddressFormat::Ethereum,
            name: None,
        })
        .collect();
    let wallet = client
        .create_wallet(
            org.clone(),
            client.current_timestamp(),
            CreateWalletIntent { wallet_name: "w".into(), accounts, mnemonic_length: Some(12) },
        )
        .await
        .unwrap()
        .result;
    let mut addresses = wallet.addresses.clone();
    let mut key_ids = Vec::new();
    for batch in 0..2 {
        let names: Vec<String> = (0..10).map(|i| format!("k{batch}-{i}")).collect();
        for k in ethereum_keys(&stack, &names).await {
            addresses.push(k.addresses[0].address.clone());
            key_ids.push((k.private_key_id, k.addresses[0].address.clone()));
        }
    }
    // 1 seed + 3 accounts + 20 keys, all under the first KEK.
    let status = stack.gateway_cli(&["kek-status"]);
    assert_eq!(status["current"], FIRST);
    assert_eq!(stored_under(&status, FIRST), 24, "{status}");

    // Load: the wallet's first account signs without pause through everything that follows.
    let stop = Arc::new(AtomicBool::new(false));
    let signed = Arc::new(AtomicU64::new(0));
    let load = {
        let (stack, stop, signed, address) = (stack.clone(), stop.clone(), signed.clone(), addresses[0].clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                signs(&stack, &address, &format!("load {n}")).await;
                n += 1;
                signed.store(n, Ordering::Relaxed);
            }
        })
    };

    // Signing goes on through each step of the operator's (checked after each).
    let goes_on = |what: &str| {
        let before = signed.load(Ordering::Relaxed);
        let what = what.to_string();
        let signed = signed.clone();
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while signed.load(Ordering::Relaxed) < before + 3 {
                assert!(std::time::Instant::now() < deadline, "signing stopped after {what}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    };
    goes_on("start").await;
    // The operator rotates: new seals name the second KEK at once.
    assert_eq!(stack.gateway_cli(&["rotate-kek"])["current"], SECOND);
    goes_on("the rotation").await;
    let late = ethereum_keys(&stack, &["late".to_string()]).await;
    addresses.push(late[0].addresses[0].address.clone());
    let status = stack.gateway_cli(&["kek-status"]);
    assert_eq!((stored_under(&status, FIRST), stored_under(&status, SECOND)), (24, 1), "{status}");
    let second = status["keks"].as_array().unwrap().iter().find(|k| k["label"] == SECOND).unwrap().clone();
    assert_eq!((second["current"].as_bool(), second["inToken"].as_bool()), (Some(true), Some(true)));

    // A re-seal killed with SIGKILL after it moved a few blobs (one per enclave call)...
    let mut reseal = Command::new(bin_dir().join("coffer-gateway"));
    stack.configure(&mut reseal);
    let mut child =
        reseal.args(["reseal", "--batch", "1"]).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let progress = BufReader::new(child.stderr.take().unwrap());
    for line in progress.lines() {
        let line: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap_or_default();
        if line["moved"].as_u64().unwrap_or(0) >= 5 {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let status = stack.gateway_cli(&["kek-status"]);
    let left = stored_under(&status, FIRST);
    assert!((1..=19).contains(&left), "killed half way: {left} blobs left under the first KEK: {status}");
    // ...is run again, and moves exactly what was left.
    let report = stack.gateway_cli(&["reseal"]);
    assert_eq!(report["moved"].as_u64(), Some(left), "{report}");
    assert_eq!(report["failed"], serde_json::json!([]));
    let status = stack.gateway_cli(&["kek-status"]);
    assert_eq!((stored_under(&status, FIRST), stored_under(&status, SECOND)), (0, 25), "{status}");
    let first = status["keks"].as_array().unwrap().iter().find(|k| k["label"] == FIRST).unwrap().clone();
    assert_eq!(first["serviceKeys"], 0, "the enclave's own sealed keys moved at rotation: {status}");
    // A third run has nothing to do.
    assert_eq!(stack.gateway_cli(&["reseal"])["moved"], 0);
    goes_on("the re-seal").await;

    // The current KEK is not destroyed (the store's blobs name it); the old one is.
    let refused = stack.run_with_stdin("coffer-gateway", &["destroy-kek", "--label", SECOND], "");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("still name coffer-kek-v2"), "{refused:?}");
    assert_eq!(stack.gateway_cli(&["destroy-kek", "--label", FIRST])["destroyed"], FIRST);
    let status = stack.gateway_cli(&["kek-status"]);
    let first = status["keks"].as_array().unwrap().iter().find(|k| k["label"] == FIRST).unwrap().clone();
    assert_eq!(first["inToken"], false, "{status}");
    assert!(first["destroyedMs"].as_i64().unwrap() > 0);
    goes_on("the destruction").await;

    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(signed.load(Ordering::Relaxed) > 0, "the load signed throughout");

    // Every key signs, recovered to its address with k256, under the second KEK alone.
    for (i, address) in addresses.iter().enumerate() {
        signs(&stack, address, &format!("after {i}")).await;
    }
    // And exports: the wallet's mnemonic gives its addresses again (bip32), a key its address.
    let mut target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let bundle = client
        .export_wallet(
            org.clone(),
            client.current_timestamp(),
            ExportWalletIntent {
                wallet_id: wallet.wallet_id.clone(),
                target_public_key: target.target_public_key().unwrap(),
                language: None,
            },
        )
        .await
        .unwrap()
        .result
        .export_bundle;
    let phrase = target.decrypt_wallet_mnemonic_phrase(&bundle, &org).unwrap();
    let seed = bip39::Mnemonic::parse(&phrase).unwrap().to_seed("");
    for (i, address) in wallet.addresses.iter().enumerate() {
        let xprv = bip32::XPrv::derive_from_path(seed, &format!("m/44'/60'/0'/0/{i}").parse().unwrap()).unwrap();
        let vk = k256::ecdsa::SigningKey::from_slice(&xprv.to_bytes()).unwrap();
        assert_eq!(coffer_tests::eth_address(vk.verifying_key()), address.to_lowercase());
    }
    let (key_id, key_address) = &key_ids[7];
    let mut target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let bundle = client
        .export_private_key(
            org.clone(),
            client.current_timestamp(),
            ExportPrivateKeyIntent {
                private_key_id: key_id.clone(),
                target_public_key: target.target_public_key().unwrap(),
            },
        )
        .await
        .unwrap()
        .result
        .export_bundle;
    let raw = target.decrypt_private_key(&bundle, &org).unwrap();
    let sk = k256::ecdsa::SigningKey::from_slice(&raw).unwrap();
    assert_eq!(coffer_tests::eth_address(sk.verifying_key()), key_address.to_lowercase());
}
