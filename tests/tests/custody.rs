//! End to end: wallets, private keys, signing, export and import, through the official Rust
//! client against the real binaries and a fresh SoftHSM token.

use coffer_tests::{recover_eth_address, refused, Stack};
use sha2::Digest;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, Curve, HashFunction, PathFormat, PayloadEncoding, TransactionType,
};
use turnkey_client::generated::{
    CreatePrivateKeysIntentV2, CreateWalletAccountsIntent, CreateWalletIntent, DeleteWalletsIntent,
    ExportPrivateKeyIntent, ExportWalletAccountIntent, ExportWalletIntent, ImportPrivateKeyIntent, ImportWalletIntent,
    InitImportPrivateKeyIntent, InitImportWalletIntent, PrivateKeyParams, SignRawPayloadIntentV2,
    SignRawPayloadsIntent, SignTransactionIntentV2, WalletAccountParams,
};
use turnkey_client::generated::{GetWalletAccountsRequest, GetWalletsRequest};

type Client = turnkey_client::TurnkeyClient<turnkey_api_key_stamper::TurnkeyP256ApiKey>;

/// The ids of every activity of the stack's organization (the exact, paged oracle).
async fn activity_ids(stack: &Stack) -> std::collections::BTreeSet<String> {
    let activities = stack.activities(&stack.api_key(), &stack.organization_id).await;
    activities.iter().map(|a| a["id"].as_str().unwrap().to_string()).collect()
}

/// The organization's wallets as (id, name, exported, imported), in listing order.
async fn wallets(client: &Client, org: &str) -> Vec<(String, String, bool, bool)> {
    let w = client.get_wallets(GetWalletsRequest { organization_id: org.into() }).await.unwrap().wallets;
    w.into_iter().map(|w| (w.wallet_id, w.wallet_name, w.exported, w.imported)).collect()
}

/// The organization's private keys as (id, name, public key, exported), in listing order.
async fn private_keys(client: &Client, org: &str) -> Vec<(String, String, String, bool)> {
    let req = turnkey_client::generated::GetPrivateKeysRequest { organization_id: org.into() };
    let k = client.get_private_keys(req).await.unwrap().private_keys;
    k.into_iter().map(|k| (k.private_key_id, k.private_key_name, k.public_key, k.exported)).collect()
}

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
    assert_eq!(recover_eth_address(&digest, &sig.r, &sig.s, &sig.v), addrs[0].to_lowercase());

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

    let listed = client.get_wallets(GetWalletsRequest { organization_id: org.clone() }).await.unwrap();
    let w = listed.wallets.iter().find(|w| w.wallet_id == wallet_id).unwrap();
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
    let before_import = wallets(&client, &org).await;
    assert_eq!(before_import.len(), 1, "{before_import:?}");
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
    // The positive control of the replays below: the first import made a wallet (and an activity).
    let after_import = wallets(&client, &org).await;
    assert_eq!(after_import.len(), 2, "{after_import:?}");
    assert!(after_import.contains(&(imported.result.wallet_id.clone(), "imported".into(), false, true)));
    let activities = activity_ids(&stack).await;
    assert!(activities.contains(&imported.activity_id), "the oracle sees the import's activity");

    // The import target is used once: replaying the same bundle (the very import, and under
    // another name) is refused and changes nothing.
    let replay = |name: &str, accounts: Vec<WalletAccountParams>, bundle: &str| ImportWalletIntent {
        user_id: stack.user_id.clone(),
        wallet_name: name.into(),
        encrypted_bundle: bundle.into(),
        accounts,
    };
    let same_accounts = || {
        vec![
            account(Curve::Secp256k1, "m/44'/60'/0'/0/0", AddressFormat::Ethereum),
            account(Curve::Ed25519, "m/44'/501'/0'/0'", AddressFormat::Solana),
        ]
    };
    let r = client
        .import_wallet(org.clone(), client.current_timestamp(), replay("again", same_accounts(), &encrypted))
        .await;
    refused(r, 400, "REQUEST_INVALID", "no import in progress for this user");
    let r = client.import_wallet(org.clone(), client.current_timestamp(), replay("again", vec![], &encrypted)).await;
    refused(r, 400, "REQUEST_INVALID", "no import in progress for this user");
    assert_eq!(wallets(&client, &org).await, after_import);
    assert_eq!(activity_ids(&stack).await, activities);
    // A new import in progress does not revive the old bundle: it was sealed to the old
    // target, which the enclave no longer holds; still nothing changes but the new init.
    let init2 = client
        .init_import_wallet(
            org.clone(),
            client.current_timestamp(),
            InitImportWalletIntent { user_id: stack.user_id.clone() },
        )
        .await
        .unwrap();
    let activities = activity_ids(&stack).await;
    let r = client
        .import_wallet(org.clone(), client.current_timestamp(), replay("again", same_accounts(), &encrypted))
        .await;
    refused(r, 400, "REQUEST_INVALID", "invalid encrypted bundle");
    assert_eq!(wallets(&client, &org).await, after_import);
    assert_eq!(activity_ids(&stack).await, activities);
    // ...and the new target, untouched by the refused replay, still imports (once).
    let mut importer = turnkey_enclave_encrypt::ImportClient::new(&stack.quorum_public_key());
    let fresh =
        importer.encrypt_wallet_with_bundle(ABANDON, &init2.result.import_bundle, &org, &stack.user_id).unwrap();
    let again = client
        .import_wallet(org.clone(), client.current_timestamp(), replay("again", same_accounts(), &fresh))
        .await
        .unwrap();
    assert_eq!(again.result.addresses, imported.result.addresses);
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
    // Every key use is in the log, linked with the result the enclave made (issue 40, E4).
    assert_eq!(stack.unlogged_activities().await, Vec::<String>::new());
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

    // Unexported keys are not deleted without deleteWithoutExport: the secp256k1 key, and the
    // P-256 one (alone, and together with the other) are refused, and nothing changes. (The
    // oracles see what there is: both keys, unexported, and the activities so far.)
    let keys_before = private_keys(&client, &org).await;
    assert_eq!(
        keys_before.iter().map(|k| (k.0.as_str(), k.3)).collect::<Vec<_>>(),
        [(k1.private_key_id.as_str(), false), (p.private_key_id.as_str(), false)]
    );
    let activities = activity_ids(&stack).await;
    let delete = |ids: Vec<String>, flag: Option<bool>| {
        client.delete_private_keys(
            org.clone(),
            client.current_timestamp(),
            turnkey_client::generated::DeletePrivateKeysIntent { private_key_ids: ids, delete_without_export: flag },
        )
    };
    let never_exported =
        |id: &str| format!("wallet account has not been exported: private key {id} was never exported");
    let r = delete(vec![k1.private_key_id.clone()], None).await;
    refused(r, 400, "WALLET_ACCOUNT_NOT_EXPORTED", &never_exported(&k1.private_key_id));
    let r = delete(vec![p.private_key_id.clone()], None).await;
    refused(r, 400, "WALLET_ACCOUNT_NOT_EXPORTED", &never_exported(&p.private_key_id));
    let r = delete(vec![p.private_key_id.clone()], Some(false)).await;
    refused(r, 400, "WALLET_ACCOUNT_NOT_EXPORTED", &never_exported(&p.private_key_id));
    let r = delete(vec![p.private_key_id.clone(), k1.private_key_id.clone()], None).await;
    refused(r, 400, "WALLET_ACCOUNT_NOT_EXPORTED", "was never exported");
    assert_eq!(private_keys(&client, &org).await, keys_before);
    assert_eq!(activity_ids(&stack).await, activities);
    // The refused P-256 key still signs.
    let sig = client
        .sign_raw_payload(
            org.clone(),
            client.current_timestamp(),
            sign_intent(&p.private_key_id, "still here", PayloadEncoding::TextUtf8, HashFunction::Sha256),
        )
        .await
        .unwrap()
        .result;
    let s = p256::ecdsa::Signature::from_slice(&hex::decode(format!("{}{}", sig.r, sig.s)).unwrap()).unwrap();
    vk.verify(b"still here", &s).unwrap();
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
    assert_eq!(private_keys(&client, &org).await, keys_before[1..], "k1 went, once exported");
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
    assert_eq!(stack.unlogged_activities().await, Vec::<String>::new());
}

/// The key uses the two tests above do not make, each linked in the log with the result the
/// enclave made and answered with it (issue 40, E4): more accounts, several payloads, a
/// transaction, an account's export, a private key's import.
#[tokio::test]
async fn every_key_use_is_logged_with_the_result_the_enclave_made() {
    use coffer_tests::rlp::{rlp_bytes, rlp_list, rlp_uint};
    let stack = Stack::start().await;
    let client = stack.client();
    let org = stack.organization_id.clone();
    let now = || client.current_timestamp();
    let eth = || account(Curve::Secp256k1, "m/44'/60'/0'/0/0", AddressFormat::Ethereum);
    let wallet = client
        .create_wallet(
            org.clone(),
            now(),
            CreateWalletIntent { wallet_name: "w".into(), accounts: vec![eth()], mnemonic_length: None },
        )
        .await
        .unwrap()
        .result;
    let more = client
        .create_wallet_accounts(
            org.clone(),
            now(),
            CreateWalletAccountsIntent {
                wallet_id: wallet.wallet_id.clone(),
                accounts: vec![account(Curve::Secp256k1, "m/44'/60'/0'/0/1", AddressFormat::Ethereum)],
                persist: None,
            },
        )
        .await
        .unwrap()
        .result
        .addresses;
    assert_eq!(more.len(), 1);
    let address = wallet.addresses[0].clone();
    let payloads = client
        .sign_raw_payloads(
            org.clone(),
            now(),
            SignRawPayloadsIntent {
                sign_with: more[0].clone(),
                payloads: vec!["0x01".into(), "0x02".into()],
                encoding: PayloadEncoding::Hexadecimal,
                hash_function: HashFunction::Keccak256,
                external_signer_pubkey: None,
            },
        )
        .await
        .unwrap()
        .result
        .signatures;
    assert_eq!(payloads.len(), 2);
    for (payload, sig) in [[1u8], [2u8]].iter().zip(&payloads) {
        let digest: [u8; 32] = sha3::Keccak256::digest(payload).into();
        assert_eq!(recover_eth_address(&digest, &sig.r, &sig.s, &sig.v).to_lowercase(), more[0].to_lowercase());
    }
    let mut unsigned = vec![0x02];
    unsigned.extend(rlp_list(&[
        rlp_uint(1),
        rlp_uint(0),
        rlp_uint(1),
        rlp_uint(30_000_000_000),
        rlp_uint(21_000),
        rlp_bytes(&[0x3a; 20]),
        rlp_uint(10u128.pow(18)),
        rlp_bytes(&[]),
        rlp_list(&[]),
    ]));
    let signed = client
        .sign_transaction(
            org.clone(),
            now(),
            SignTransactionIntentV2 {
                sign_with: address.clone(),
                unsigned_transaction: hex::encode(&unsigned),
                r#type: TransactionType::Ethereum,
                external_signer_pubkey: None,
            },
        )
        .await
        .unwrap()
        .result
        .signed_transaction;
    assert!(signed.starts_with("02"), "{signed}");
    let mut target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let exported = client
        .export_wallet_account(
            org.clone(),
            now(),
            ExportWalletAccountIntent {
                address: address.clone(),
                target_public_key: target.target_public_key().unwrap(),
            },
        )
        .await
        .unwrap()
        .result;
    assert_eq!(exported.address, address);
    let key = target.decrypt_private_key(&exported.export_bundle, &org).unwrap();
    let eth_address =
        |secret: &[u8]| coffer_tests::eth_address(k256::ecdsa::SigningKey::from_slice(secret).unwrap().verifying_key());
    assert_eq!(eth_address(&key), address.to_lowercase(), "the exported key is the account's");

    let init = client
        .init_import_private_key(org.clone(), now(), InitImportPrivateKeyIntent { user_id: stack.user_id.clone() })
        .await
        .unwrap();
    let mut importer = turnkey_enclave_encrypt::ImportClient::new(&stack.quorum_public_key());
    let encrypted =
        importer.encrypt_private_key_with_bundle([7u8; 32], &init.result.import_bundle, &org, &stack.user_id).unwrap();
    let imported = client
        .import_private_key(
            org.clone(),
            now(),
            ImportPrivateKeyIntent {
                user_id: stack.user_id.clone(),
                private_key_name: "imported".into(),
                encrypted_bundle: encrypted,
                curve: Curve::Secp256k1,
                address_formats: vec![AddressFormat::Ethereum],
            },
        )
        .await
        .unwrap()
        .result;
    assert_eq!(imported.addresses[0].address.to_lowercase(), eth_address(&[7u8; 32]));
    assert_eq!(stack.unlogged_activities().await, Vec::<String>::new());
    // One round trip each: every key use was linked by its own enclave call, none afterwards.
    assert_eq!((stack.enclave_calls("Sign").await, stack.enclave_calls("SignTransaction").await), (1, 1));
    assert_eq!(stack.enclave_calls("RecordActivity").await, 0);
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
    // Identical bytes, a new stamp: the same activity, and no second wallet (nor activity).
    let activities = activity_ids(&stack).await;
    assert!(activities.contains(activity["id"].as_str().unwrap()), "{activities:?}");
    let again = stack.post_raw("/public/v1/submit/create_wallet", body.as_bytes(), Some(&key)).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json["activity"]["id"], activity["id"]);
    assert_eq!(activity_ids(&stack).await, activities);
    let wallet_id = activity["result"]["createWalletResult"]["walletId"].as_str().unwrap().to_string();
    let client = stack.client();
    assert_eq!(client.get_wallets(GetWalletsRequest { organization_id: org.clone() }).await.unwrap().wallets.len(), 1);

    let listed = wallets(&client, &org).await;
    assert_eq!(listed, [(wallet_id.clone(), "w".to_string(), false, false)]);
    let activities = activity_ids(&stack).await;
    let del = client
        .delete_wallets(
            org.clone(),
            client.current_timestamp(),
            DeleteWalletsIntent { wallet_ids: vec![wallet_id.clone()], delete_without_export: None },
        )
        .await;
    let never_exported = format!("wallet account has not been exported: wallet {wallet_id} was never exported");
    refused(del, 400, "WALLET_ACCOUNT_NOT_EXPORTED", &never_exported);
    assert_eq!(wallets(&client, &org).await, listed);
    assert_eq!(activity_ids(&stack).await, activities);
    client
        .delete_wallets(
            org.clone(),
            client.current_timestamp(),
            DeleteWalletsIntent { wallet_ids: vec![wallet_id], delete_without_export: Some(true) },
        )
        .await
        .unwrap();
    assert!(client.get_wallets(GetWalletsRequest { organization_id: org }).await.unwrap().wallets.is_empty());
    wallet_renamed_and_accounts_deleted(&stack).await;
}

/// A wallet's accounts as (id, address), in listing order.
async fn accounts(client: &Client, org: &str, wallet_id: &str) -> Vec<(String, String)> {
    let req = GetWalletAccountsRequest {
        organization_id: org.into(),
        wallet_id: Some(wallet_id.into()),
        include_wallet_details: None,
        pagination_options: None,
    };
    let a = client.get_wallet_accounts(req).await.unwrap().accounts;
    a.into_iter().map(|a| (a.wallet_account_id, a.address)).collect()
}

async fn delete_accounts(
    client: &Client,
    org: &str,
    ids: Vec<String>,
    without_export: Option<bool>,
) -> Result<
    turnkey_client::ActivityResult<turnkey_client::generated::DeleteWalletAccountsResult>,
    turnkey_client::TurnkeyClientError,
> {
    let intent = turnkey_client::generated::DeleteWalletAccountsIntent {
        wallet_account_ids: ids,
        delete_without_export: without_export,
    };
    client.delete_wallet_accounts(org.into(), client.current_timestamp(), intent).await
}

/// `update_wallet` and `delete_wallet_accounts`: a rename the enclave refuses to a user without a
/// policy; an account deleted only once its key left (it or its wallet exported) unless
/// `deleteWithoutExport`, its sealed key gone with it, and no signature from its address after.
async fn wallet_renamed_and_accounts_deleted(stack: &Stack) {
    use turnkey_client::generated::UpdateWalletIntent;
    let (client, org) = (stack.client(), stack.organization_id.clone());
    let made = client
        .create_wallet(
            org.clone(),
            client.current_timestamp(),
            CreateWalletIntent { wallet_name: "hot".into(), accounts: four_accounts(), mnemonic_length: None },
        )
        .await
        .unwrap()
        .result;
    let wallet_id = made.wallet_id.clone();
    client
        .update_wallet(
            org.clone(),
            client.current_timestamp(),
            UpdateWalletIntent { wallet_id: wallet_id.clone(), wallet_name: "cold".into() },
        )
        .await
        .unwrap();
    assert_eq!(wallets(&client, &org).await, [(wallet_id.clone(), "cold".to_string(), false, false)]);
    let r = client
        .update_wallet(
            org.clone(),
            client.current_timestamp(),
            UpdateWalletIntent { wallet_id: wallet_id.clone(), wallet_name: "a\u{1b}[2Jb".into() },
        )
        .await;
    refused(r, 400, "REQUEST_INVALID", "walletName must not contain control characters");

    // A user without a policy: the enclave refuses both, and nothing changes.
    let member_key = turnkey_api_key_stamper::TurnkeyP256ApiKey::generate();
    let r = coffer_tests::submit(
        stack,
        &stack.api_key(),
        &org,
        "create_users",
        "ACTIVITY_TYPE_CREATE_USERS_V4",
        serde_json::json!({"users": [{"userName": "member", "userTags": [], "authenticators": [], "oauthProviders": [],
            "apiKeys": [{"apiKeyName": "k", "publicKey": hex::encode(member_key.compressed_public_key()), "curveType": "API_KEY_CURVE_P256"}]}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let before = accounts(&client, &org, &wallet_id).await;
    assert_eq!(before.len(), 4);
    stack.refusals_accounted();
    for (path, ty, params) in [
        (
            "update_wallet",
            "ACTIVITY_TYPE_UPDATE_WALLET",
            serde_json::json!({"walletId": wallet_id, "walletName": "mine"}),
        ),
        (
            "delete_wallet_accounts",
            "ACTIVITY_TYPE_DELETE_WALLET_ACCOUNTS",
            serde_json::json!({"walletAccountIds": [before[0].0], "deleteWithoutExport": true}),
        ),
    ] {
        let r = coffer_tests::submit(stack, &member_key, &org, path, ty, params).await;
        stack.refused_for(&r, 403, "REQUEST_NOT_AUTHORIZED", coffer_proto::v1::RefusalReason::PolicyDenied);
    }
    assert_eq!(wallets(&client, &org).await[0].1, "cold");
    assert_eq!(accounts(&client, &org, &wallet_id).await, before);

    // Never exported: refused, then deleted with deleteWithoutExport.
    let r = delete_accounts(&client, &org, vec![before[0].0.clone()], None).await;
    refused(r, 400, "WALLET_ACCOUNT_NOT_EXPORTED", &format!("wallet account {} was never exported", before[0].0));
    let r = delete_accounts(&client, &org, vec![before[1].0.clone(), before[1].0.clone()], Some(true)).await;
    refused(r, 400, "REQUEST_INVALID", &format!("walletAccountIds names {} twice", before[1].0));
    let done = delete_accounts(&client, &org, vec![before[0].0.clone()], Some(true)).await.unwrap().result;
    assert_eq!(done.wallet_account_ids, [before[0].0.clone()]);
    // Exported: deleted without the flag.
    let target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let export = ExportWalletAccountIntent {
        address: before[1].1.clone(),
        target_public_key: target.target_public_key().unwrap(),
    };
    client.export_wallet_account(org.clone(), client.current_timestamp(), export).await.unwrap();
    delete_accounts(&client, &org, vec![before[1].0.clone()], None).await.unwrap();
    assert_eq!(accounts(&client, &org, &wallet_id).await, before[2..].to_vec());
    // The deleted account's address signs nothing (the enclave's state no longer holds it).
    let sign = sign_intent(&before[0].1, &"00".repeat(32), PayloadEncoding::Hexadecimal, HashFunction::Keccak256);
    let r = client.sign_raw_payload(org.clone(), client.current_timestamp(), sign).await;
    assert!(r.is_err(), "a deleted account signed");
    // The sealed keys went with their rows (a no-op update counts the rows left).
    assert_eq!(stack.tamper_store("UPDATE wallet_accounts SET address = address WHERE wallet_id = $1", &wallet_id), 2);
}
