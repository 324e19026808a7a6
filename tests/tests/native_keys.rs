//! End to end: an organization with `FEATURE_NAME_COFFER_HSM_NATIVE_KEYS` gets private keys made
//! and used in the HSM: they sign (raw payloads and Ethereum transactions, verified and
//! recovered with independent crates), are never exported, are bounded per deployment, and go
//! with their private key.

use coffer_tests::rlp::{rlp_bytes, rlp_items, rlp_list, rlp_payload, rlp_uint};
use coffer_tests::{eth_address, recover_eth_address, recover_secp256k1, refused, submit, Stack};
use sha2::Digest;
use turnkey_client::generated::immutable::common::v1::{
    AddressFormat, Curve, HashFunction, PayloadEncoding, TransactionType,
};
use turnkey_client::generated::{
    CreatePrivateKeysIntentV2, DeletePrivateKeysIntent, ExportPrivateKeyIntent, PrivateKeyParams,
    SignRawPayloadIntentV2, SignTransactionIntentV2,
};

const FEATURE: &str = "FEATURE_NAME_COFFER_HSM_NATIVE_KEYS";

fn key_params(name: &str, curve: Curve, format: AddressFormat) -> PrivateKeyParams {
    PrivateKeyParams { private_key_name: name.into(), curve, private_key_tags: vec![], address_formats: vec![format] }
}

fn create(keys: Vec<PrivateKeyParams>) -> CreatePrivateKeysIntentV2 {
    CreatePrivateKeysIntentV2 {
        private_keys: keys,
        external_signer_pubkey: None,
        external_signer_wrapping_key_id: None,
    }
}

#[tokio::test]
async fn hsm_native_keys_sign_verifiably_and_never_leave_the_hsm() {
    // Three native keys at most in this deployment's token.
    let stack = Stack::start_with(&[("COFFER_HSM_NATIVE_KEYS_MAX", "3")]).await;
    let client = stack.client();
    let org = stack.organization_id.clone();
    let kryoptic = coffer_tests::kryoptic_under_test().is_some();

    // The feature is Coffer's own (the official clients' enum does not name it): set through the
    // activity path like any feature, into the enclave's authority state.
    let set = submit(
        &stack,
        &stack.api_key(),
        &org,
        "set_organization_feature",
        "ACTIVITY_TYPE_SET_ORGANIZATION_FEATURE",
        serde_json::json!({ "name": FEATURE, "value": "on" }),
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.text);

    let mut params = vec![key_params("p256", Curve::P256, AddressFormat::Compressed)];
    if !kryoptic {
        params.push(key_params("k1", Curve::Secp256k1, AddressFormat::Ethereum));
    }
    let keys = client.create_private_keys(org.clone(), client.current_timestamp(), create(params)).await.unwrap();
    let keys = keys.result.private_keys;

    // P-256: verified with the p256 crate under the key's compressed public key.
    let p = &keys[0];
    let sig = client
        .sign_raw_payload(
            org.clone(),
            client.current_timestamp(),
            SignRawPayloadIntentV2 {
                sign_with: p.private_key_id.clone(),
                payload: "hello from the HSM".into(),
                encoding: PayloadEncoding::TextUtf8,
                hash_function: HashFunction::Sha256,
                external_signer_pubkey: None,
            },
        )
        .await
        .unwrap()
        .result;
    let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(&hex::decode(&p.addresses[0].address).unwrap()).unwrap();
    let s = p256::ecdsa::Signature::from_slice(&hex::decode(format!("{}{}", sig.r, sig.s)).unwrap()).unwrap();
    assert!(s.normalize_s().is_none(), "low-S");
    use p256::ecdsa::signature::Verifier;
    vk.verify(b"hello from the HSM", &s).unwrap();

    if kryoptic {
        // kryoptic makes no secp256k1 keys: refused with what to do, nothing made.
        let r = client
            .create_private_keys(
                org.clone(),
                client.current_timestamp(),
                create(vec![key_params("k1", Curve::Secp256k1, AddressFormat::Ethereum)]),
            )
            .await;
        refused(r, 400, "REQUEST_INVALID", "does not make CURVE_SECP256K1 keys that stay in it");
    } else {
        // secp256k1: raw payloads recover to the key's Ethereum address (k256), and so does an
        // EIP-1559 transaction the enclave signs with it.
        let k = &keys[1];
        let address = k.addresses[0].address.clone();
        for text in ["one", "two", "three"] {
            let sig = client
                .sign_raw_payload(
                    org.clone(),
                    client.current_timestamp(),
                    SignRawPayloadIntentV2 {
                        sign_with: address.clone(),
                        payload: text.into(),
                        encoding: PayloadEncoding::TextUtf8,
                        hash_function: HashFunction::Keccak256,
                        external_signer_pubkey: None,
                    },
                )
                .await
                .unwrap()
                .result;
            let digest: [u8; 32] = sha3::Keccak256::digest(text.as_bytes()).into();
            assert_eq!(recover_eth_address(&digest, &sig.r, &sig.s, &sig.v), address.to_lowercase());
        }
        let fields = vec![
            rlp_uint(1),
            rlp_uint(0),
            rlp_uint(1),
            rlp_uint(30_000_000_000),
            rlp_uint(21_000),
            rlp_bytes(&[0x3a; 20]),
            rlp_uint(10u128.pow(18)),
            rlp_bytes(&[]),
            rlp_list(&[]),
        ];
        let unsigned = [vec![0x02], rlp_list(&fields)].concat();
        let signed = client
            .sign_transaction(
                org.clone(),
                client.current_timestamp(),
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
        let signed = hex::decode(signed).unwrap();
        let items = rlp_items(&signed[1..]);
        assert_eq!(items.len(), 12);
        let (v, r, s) = (rlp_payload(&items[9]), rlp_payload(&items[10]), rlp_payload(&items[11]));
        let digest: [u8; 32] = sha3::Keccak256::digest(&unsigned).into();
        let recovered = recover_secp256k1(&digest, &r, &s, v.first().copied().unwrap_or(0));
        assert_eq!(eth_address(&recovered), address.to_lowercase());
    }

    // Never exported: refused with the reason, and nothing spent or recorded as done.
    let target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let r = client
        .export_private_key(
            org.clone(),
            client.current_timestamp(),
            ExportPrivateKeyIntent {
                private_key_id: p.private_key_id.clone(),
                target_public_key: target.target_public_key().unwrap(),
            },
        )
        .await;
    refused(r, 400, "REQUEST_INVALID", "it never leaves the HSM, so it cannot be exported");

    // The deployment's bound holds: a batch past it is refused whole (the keys it made first
    // are destroyed), and a key fits again once one is deleted.
    let made = keys.len();
    let over: Vec<_> =
        (0..=(3 - made)).map(|i| key_params(&format!("more{i}"), Curve::P256, AddressFormat::Compressed)).collect();
    let r = client.create_private_keys(org.clone(), client.current_timestamp(), create(over)).await;
    refused(r, 400, "REQUEST_INVALID", "the most HSM-native keys this deployment allows");
    client
        .delete_private_keys(
            org.clone(),
            client.current_timestamp(),
            DeletePrivateKeysIntent {
                private_key_ids: vec![p.private_key_id.clone()],
                delete_without_export: Some(true),
            },
        )
        .await
        .unwrap();
    // Its place in the token is free again (the enclave destroyed the object with the key).
    let room = 3 - made + 1;
    let fits: Vec<_> =
        (0..room).map(|i| key_params(&format!("fits{i}"), Curve::P256, AddressFormat::Compressed)).collect();
    let fitted = client.create_private_keys(org.clone(), client.current_timestamp(), create(fits)).await.unwrap();
    assert_eq!(fitted.result.private_keys.len(), room);

    // Without the feature, keys are sealed as before (and export).
    let unset = submit(
        &stack,
        &stack.api_key(),
        &org,
        "remove_organization_feature",
        "ACTIVITY_TYPE_REMOVE_ORGANIZATION_FEATURE",
        serde_json::json!({ "name": FEATURE }),
    )
    .await;
    assert_eq!(unset.status, 200, "{}", unset.text);
    let sealed = client
        .create_private_keys(
            org.clone(),
            client.current_timestamp(),
            create(vec![key_params("sealed", Curve::P256, AddressFormat::Compressed)]),
        )
        .await
        .unwrap()
        .result
        .private_keys;
    let mut target = turnkey_enclave_encrypt::ExportClient::new(&stack.quorum_public_key());
    let bundle = client
        .export_private_key(
            org.clone(),
            client.current_timestamp(),
            ExportPrivateKeyIntent {
                private_key_id: sealed[0].private_key_id.clone(),
                target_public_key: target.target_public_key().unwrap(),
            },
        )
        .await
        .unwrap()
        .result
        .export_bundle;
    let raw = target.decrypt_private_key(&bundle, &org).unwrap();
    let exported = p256::SecretKey::from_slice(&raw).unwrap().public_key();
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    assert_eq!(hex::encode(exported.to_encoded_point(true).as_bytes()), sealed[0].addresses[0].address);
}
