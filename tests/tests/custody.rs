//! End to end: wallets, private keys, signing, export and import, through the official Rust
//! client against the real binaries and a fresh SoftHSM token.

use coffer_tests::Stack;
use sha2::Digest;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, Curve, HashFunction, PathFormat, PayloadEncoding,
};
use turnkey_client::generated::{
    CreatePrivateKeysIntentV2, CreateWalletIntent, DeleteWalletsIntent, ExportPrivateKeyIntent, ExportWalletIntent,
    ImportWalletIntent, InitImportWalletIntent, PrivateKeyParams, SignRawPayloadIntentV2, WalletAccountParams,
};
use turnkey_client::generated::{GetWalletAccountsRequest, GetWalletsRequest};
use turnkey_client::TurnkeyClientError;

const ABANDON: &str = "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about";

fn account(curve: Curve, path: &str, format: AddressFormat) -> WalletAccountParams {
    WalletAccountParams { curve, path_format: PathFormat::Bip32, path: path.into(), address_format: format, name: None }
}

fn four_accounts() -> Vec<WalletAccountParams> {
    vec![
        account(Curve::Secp256k1, "m/44'/60'/0'/0/0", AddressFormat::Ethereum),
        account(Curve::Ed25519, "m/44'/501'/0'/0'", AddressFormat::Solana),
        account(Curve::Secp256k1, "m/84'/0'/0'/0/0", AddressFormat::BitcoinMainnetP2wpkh),
        account(Curve::Secp256k1, "m/44'/118'/0'/0/0", AddressFormat::Cosmos),
    ]
}

fn sign_intent(
    sign_with: &str,
    payload: &str,
    encoding: PayloadEncoding,
    hash: HashFunction,
) -> SignRawPayloadIntentV2 {
    SignRawPayloadIntentV2 {
        sign_with: sign_with.into(),
        payload: payload.into(),
        encoding,
        hash_function: hash,
        external_signer_pubkey: None,
    }
}

/// Recovers the Ethereum address from a secp256k1 r/s/v over `digest` (independent of Coffer).
fn recover_eth_address(digest: &[u8; 32], r: &str, s: &str, v: &str) -> String {
    let sig = k256::ecdsa::Signature::from_slice(&hex::decode(format!("{r}{s}")).unwrap()).unwrap();
    assert!(sig.normalize_s().is_none(), "signature must be low-S");
    let recid = k256::ecdsa::RecoveryId::from_byte(u8::from_str_radix(v, 16).unwrap()).unwrap();
    let vk = k256::ecdsa::VerifyingKey::recover_from_prehash(digest, &sig, recid).unwrap();
    let point = vk.to_encoded_point(false);
    let hash = sha3::Keccak256::digest(&point.as_bytes()[1..]);
    format!("0x{}", hex::encode(&hash[12..]))
}

#[tokio::test]
async fn wallet_sign_export_import_end_to_end() {
    let stack = Stack::start().await;
    let client = stack.client();
    let org = stack.organization_id.clone();

    let who =
        client.get_whoami(turnkey_client::generated::GetWhoamiRequest { organization_id: org.clone() }).await.unwrap();
    assert_eq!(who.organization_id, org);
    assert_eq!(who.user_id, stack.user_id);

    let created = client
        .create_wallet(
            org.clone(),
            client.current_timestamp(),
            CreateWalletIntent { wallet_name: "main".into(), accounts: four_accounts(), mnemonic_length: Some(24) },
        )
        .await
        .unwrap();
    let wallet_id = created.result.wallet_id.clone();
    let addrs = created.result.addresses.clone();
    assert_eq!(addrs.len(), 4);
    assert!(addrs[0].starts_with("0x") && addrs[0].len() == 42, "{}", addrs[0]);
    assert!(addrs[2].starts_with("bc1q"), "{}", addrs[2]);
    assert!(addrs[3].starts_with("cosmos1"), "{}", addrs[3]);

    // secp256k1: sign "hello" with KECCAK256 and recover the address independently.
    let sig = client
        .sign_raw_payload(
            org.clone(),
            client.current_timestamp(),
            sign_intent(&addrs[0], "hello", PayloadEncoding::TextUtf8, HashFunction::Keccak256),
        )
        .await
        .unwrap()
        .result;
    let digest: [u8; 32] = sha3::Keccak256::digest(b"hello").into();
    assert_eq!(recover_eth_address(&digest, &sig.r, &sig.s, &sig.v).to_lowercase(), addrs[0].to_lowercase());

    // Ed25519: verify against the Solana address (base58 of the public key).
    let sig = client
        .sign_raw_payload(
            org.clone(),
            client.current_timestamp(),
            sign_intent(&addrs[1], "68656c6c6f", PayloadEncoding::Hexadecimal, HashFunction::NotApplicable),
        )
        .await
        .unwrap()
        .result;
    assert_eq!(sig.v, "00");
    let pk: [u8; 32] = bs58::decode(&addrs[1]).into_vec().unwrap().try_into().unwrap();
    let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk).unwrap();
    let sig_bytes: [u8; 64] = hex::decode(format!("{}{}", sig.r, sig.s)).unwrap().try_into().unwrap();
    vk.verify_strict(b"hello", &ed25519_dalek::Signature::from_bytes(&sig_bytes)).unwrap();

    // Export the wallet and decrypt it with the official client, pinned to Coffer's signer key.
    let target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let mut target = target;
    let exported = client
        .export_wallet(
            org.clone(),
            client.current_timestamp(),
            ExportWalletIntent {
                wallet_id: wallet_id.clone(),
                target_public_key: target.target_public_key().unwrap(),
                language: None,
            },
        )
        .await
        .unwrap();
    let phrase = target.decrypt_wallet_mnemonic_phrase(&exported.result.export_bundle, &org).unwrap();
    assert_eq!(phrase.split(' ').count(), 24);
    // Re-derive the Ethereum address from the mnemonic with independent crates.
    let mnemonic = bip39::Mnemonic::parse(&phrase).unwrap();
    let xprv = bip32::XPrv::derive_from_path(mnemonic.to_seed(""), &"m/44'/60'/0'/0/0".parse().unwrap()).unwrap();
    let point = xprv.public_key().public_key().to_encoded_point(false);
    let derived = format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..]));
    assert_eq!(derived, addrs[0].to_lowercase());

    let wallets = client.get_wallets(GetWalletsRequest { organization_id: org.clone() }).await.unwrap();
    let w = wallets.wallets.iter().find(|w| w.wallet_id == wallet_id).unwrap();
    assert!(w.exported && !w.imported);

    // Import the "abandon ... about" mnemonic and get the spec's vectors.
    let init = client
        .init_import_wallet(
            org.clone(),
            client.current_timestamp(),
            InitImportWalletIntent { user_id: stack.user_id.clone() },
        )
        .await
        .unwrap();
    let mut importer = turnkey_enclave_encrypt::ImportClient::new(&stack.quorum_public_key());
    let encrypted =
        importer.encrypt_wallet_with_bundle(ABANDON, &init.result.import_bundle, &org, &stack.user_id).unwrap();
    let imported = client
        .import_wallet(
            org.clone(),
            client.current_timestamp(),
            ImportWalletIntent {
                user_id: stack.user_id.clone(),
                wallet_name: "imported".into(),
                encrypted_bundle: encrypted.clone(),
                accounts: vec![
                    account(Curve::Secp256k1, "m/44'/60'/0'/0/0", AddressFormat::Ethereum),
                    account(Curve::Ed25519, "m/44'/501'/0'/0'", AddressFormat::Solana),
                ],
            },
        )
        .await
        .unwrap();
    assert_eq!(
        imported.result.addresses,
        vec![
            "0x9858EfFD232B4033E47d90003D41EC34EcaEda94".to_string(),
            "HAgk14JpMQLgt6rVgv7cBQFJWFto5Dqxi472uT3DKpqk".to_string()
        ]
    );
    // The import target is used once: replaying the same bundle fails and changes nothing.
    let replay = client
        .import_wallet(
            org.clone(),
            client.current_timestamp(),
            ImportWalletIntent {
                user_id: stack.user_id.clone(),
                wallet_name: "again".into(),
                encrypted_bundle: encrypted,
                accounts: vec![],
            },
        )
        .await;
    assert!(matches!(replay, Err(TurnkeyClientError::UnexpectedHttpStatus(400, _))), "{replay:?}");
    let accounts = client
        .get_wallet_accounts(GetWalletAccountsRequest {
            organization_id: org.clone(),
            wallet_id: Some(imported.result.wallet_id.clone()),
            include_wallet_details: Some(true),
            pagination_options: None,
        })
        .await
        .unwrap();
    assert_eq!(accounts.accounts.len(), 2);
    assert!(accounts.accounts[0].wallet_details.as_ref().unwrap().imported);
}

#[tokio::test]
async fn private_keys_sign_export_and_deletion_rules() {
    let stack = Stack::start().await;
    let client = stack.client();
    let org = stack.organization_id.clone();
    let keys = client
        .create_private_keys(
            org.clone(),
            client.current_timestamp(),
            CreatePrivateKeysIntentV2 {
                private_keys: vec![
                    PrivateKeyParams {
                        private_key_name: "k1".into(),
                        curve: Curve::Secp256k1,
                        private_key_tags: vec![],
                        address_formats: vec![AddressFormat::Ethereum],
                    },
                    PrivateKeyParams {
                        private_key_name: "p256".into(),
                        curve: Curve::P256,
                        private_key_tags: vec![],
                        address_formats: vec![AddressFormat::Compressed],
                    },
                ],
                external_signer_pubkey: None,
                external_signer_wrapping_key_id: None,
            },
        )
        .await
        .unwrap()
        .result
        .private_keys;
    assert_eq!(keys.len(), 2);
    let k1 = &keys[0];
    let eth = k1.addresses[0].address.clone();

    // signWith by private key id, then by address: both recover to the key's address.
    for sign_with in [k1.private_key_id.clone(), eth.clone()] {
        let sig = client
            .sign_raw_payload(
                org.clone(),
                client.current_timestamp(),
                sign_intent(&sign_with, "0x68656c6c6f", PayloadEncoding::Hexadecimal, HashFunction::Keccak256),
            )
            .await
            .unwrap()
            .result;
        let digest: [u8; 32] = sha3::Keccak256::digest(b"hello").into();
        assert_eq!(recover_eth_address(&digest, &sig.r, &sig.s, &sig.v), eth.to_lowercase());
    }

    // P-256: verify with the compressed public key (its COMPRESSED "address").
    let p = &keys[1];
    let sig = client
        .sign_raw_payload(
            org.clone(),
            client.current_timestamp(),
            sign_intent(&p.private_key_id, "hello", PayloadEncoding::TextUtf8, HashFunction::Sha256),
        )
        .await
        .unwrap()
        .result;
    let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(&hex::decode(&p.addresses[0].address).unwrap()).unwrap();
    let s = p256::ecdsa::Signature::from_slice(&hex::decode(format!("{}{}", sig.r, sig.s)).unwrap()).unwrap();
    use p256::ecdsa::signature::Verifier;
    vk.verify(b"hello", &s).unwrap();

    // Unexported keys are not deleted without deleteWithoutExport.
    let del = client
        .delete_private_keys(
            org.clone(),
            client.current_timestamp(),
            turnkey_client::generated::DeletePrivateKeysIntent {
                private_key_ids: vec![k1.private_key_id.clone()],
                delete_without_export: None,
            },
        )
        .await;
    match del {
        Err(TurnkeyClientError::UnexpectedHttpStatus(400, body)) => {
            assert!(body.contains("WALLET_ACCOUNT_NOT_EXPORTED"), "{body}")
        }
        other => panic!("expected 400, got {other:?}"),
    }
    // Export, decrypt with the official client, check the key, then deletion works.
    let mut target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let bundle = client
        .export_private_key(
            org.clone(),
            client.current_timestamp(),
            ExportPrivateKeyIntent {
                private_key_id: k1.private_key_id.clone(),
                target_public_key: target.target_public_key().unwrap(),
            },
        )
        .await
        .unwrap()
        .result
        .export_bundle;
    let raw = target.decrypt_private_key(&bundle, &org).unwrap();
    let sk = k256::ecdsa::SigningKey::from_slice(&raw).unwrap();
    let point = sk.verifying_key().to_encoded_point(false);
    assert_eq!(
        format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..])),
        eth.to_lowercase()
    );
    client
        .delete_private_keys(
            org.clone(),
            client.current_timestamp(),
            turnkey_client::generated::DeletePrivateKeysIntent {
                private_key_ids: vec![k1.private_key_id.clone()],
                delete_without_export: None,
            },
        )
        .await
        .unwrap();
    // The P-256 key goes only with the flag.
    client
        .delete_private_keys(
            org.clone(),
            client.current_timestamp(),
            turnkey_client::generated::DeletePrivateKeysIntent {
                private_key_ids: vec![p.private_key_id.clone()],
                delete_without_export: Some(true),
            },
        )
        .await
        .unwrap();
    let left = client
        .get_private_keys(turnkey_client::generated::GetPrivateKeysRequest { organization_id: org.clone() })
        .await
        .unwrap();
    assert!(left.private_keys.is_empty());
}

#[tokio::test]
async fn wallet_deletion_rule_and_identical_resubmission() {
    let stack = Stack::start().await;
    let key = stack.api_key();
    let org = stack.organization_id.clone();
    let body = serde_json::json!({
        "type": "ACTIVITY_TYPE_CREATE_WALLET",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": {"walletName": "w", "accounts": [{"curve":"CURVE_SECP256K1","pathFormat":"PATH_FORMAT_BIP32","path":"m/44'/60'/0'/0/0","addressFormat":"ADDRESS_FORMAT_ETHEREUM","name":null}], "mnemonicLength": null},
        "generateAppProofs": null
    })
    .to_string();
    let first = stack.post_raw("/public/v1/submit/create_wallet", body.as_bytes(), Some(&key)).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.content_type.as_deref(), Some("application/json"));
    let activity = &first.json["activity"];
    assert_eq!(activity["status"], "ACTIVITY_STATUS_COMPLETED");
    assert_eq!(activity["fingerprint"], format!("sha256:{}", hex::encode(sha2::Sha256::digest(body.as_bytes()))));
    assert_eq!(activity["votes"][0]["selection"], "VOTE_SELECTION_APPROVED");
    // Identical bytes, a new stamp: the same activity, and no second wallet.
    let again = stack.post_raw("/public/v1/submit/create_wallet", body.as_bytes(), Some(&key)).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json["activity"]["id"], activity["id"]);
    let wallet_id = activity["result"]["createWalletResult"]["walletId"].as_str().unwrap().to_string();
    let client = stack.client();
    assert_eq!(client.get_wallets(GetWalletsRequest { organization_id: org.clone() }).await.unwrap().wallets.len(), 1);

    let del = client
        .delete_wallets(
            org.clone(),
            client.current_timestamp(),
            DeleteWalletsIntent { wallet_ids: vec![wallet_id.clone()], delete_without_export: None },
        )
        .await;
    assert!(
        matches!(del, Err(TurnkeyClientError::UnexpectedHttpStatus(400, ref b)) if b.contains("has not been exported")),
        "{del:?}"
    );
    assert_eq!(client.get_wallets(GetWalletsRequest { organization_id: org.clone() }).await.unwrap().wallets.len(), 1);
    client
        .delete_wallets(
            org.clone(),
            client.current_timestamp(),
            DeleteWalletsIntent { wallet_ids: vec![wallet_id], delete_without_export: Some(true) },
        )
        .await
        .unwrap();
    assert!(client.get_wallets(GetWalletsRequest { organization_id: org }).await.unwrap().wallets.is_empty());
}
