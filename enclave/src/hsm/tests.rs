//! Sealing and service keys against a real SoftHSM token (one per test process: the PKCS#11
//! module is a process-wide singleton).

use std::sync::{Arc, OnceLock};

use cryptoki::object::{Attribute, AttributeType, ObjectClass};
use cryptoki::types::AuthPin;

use super::error::HsmError;
use super::key_labels::*;
use super::seal::{is_legacy, BlobBinding, BlobKind};
use super::token::*;

const MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

pub(crate) fn hsm() -> Arc<Hsm> {
    static HSM: OnceLock<Arc<Hsm>> = OnceLock::new();
    HSM.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("coffer-hsm-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tokens")).unwrap();
        let conf = dir.join("softhsm2.conf");
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                dir.join("tokens").display()
            ),
        )
        .unwrap();
        // Set before the module is loaded (C_Initialize reads it); no other thread touches it.
        std::env::set_var("SOFTHSM2_CONF", &conf);
        let pin = || AuthPin::new("unit-test-pin".to_string().into());
        assert!(init_token(MODULE.as_ref(), "unit", &AuthPin::new("unit-so-pin".to_string().into()), &pin()).unwrap());
        // Idempotent: the token exists now.
        assert!(!init_token(MODULE.as_ref(), "unit", &AuthPin::new("unit-so-pin".to_string().into()), &pin()).unwrap());
        let hsm =
            Hsm::open(HsmSettings { module: MODULE.into(), token_label: "unit".into(), pin: pin(), pool_size: 4 })
                .unwrap();
        assert_eq!(
            hsm.init_service_keys().unwrap(),
            vec![
                KEK_LABEL,
                SIGNER_LABEL,
                CERT_MAC_LABEL,
                WEBHOOK_SIGNER_LABEL,
                NOTARIZER_LABEL,
                OIDC_ISSUER_LABEL,
                PROOF_LABEL,
                TLS_FETCHER_LABEL
            ]
        );
        assert!(hsm.init_service_keys().unwrap().is_empty(), "second init must create nothing");
        Arc::new(hsm)
    })
    .clone()
}

fn binding<'a>(kind: BlobKind, org: &'a str, resource: &'a str) -> BlobBinding<'a> {
    BlobBinding::plain(kind, org, resource)
}

#[test]
fn account_blob_under_another_curve_or_address_fails_to_open() {
    let hsm = hsm();
    let right =
        BlobBinding { curve: "CURVE_SECP256K1", address: "0xabc", ..binding(BlobKind::WalletAccountKey, "o", "a") };
    let blob = hsm.seal(&right, &[5u8; 32]).unwrap();
    assert_eq!(hsm.unseal(&right, &blob).unwrap().as_slice(), &[5u8; 32]);
    for wrong in [
        BlobBinding { curve: "CURVE_ED25519", ..right },
        BlobBinding { address: "0xabd", ..right },
        BlobBinding { address: "", public_key: "0xabc", ..right },
    ] {
        assert!(matches!(hsm.unseal(&wrong, &blob), Err(HsmError::SealAuthentication)), "{wrong:?}");
    }
}

#[test]
fn legacy_blobs_open_under_their_version_1_binding() {
    let hsm = hsm();
    let legacy = binding(BlobKind::PrivateKey, "o", "k");
    let blob = hsm.seal_legacy(&legacy, &[6u8; 32]).unwrap();
    assert!(is_legacy(&blob));
    // Version 1 binds kind, organization and resource only: curve and public key are not in it.
    let claimed = BlobBinding { curve: "CURVE_P256", public_key: "02ab", ..legacy };
    assert_eq!(hsm.unseal(&claimed, &blob).unwrap().as_slice(), &[6u8; 32]);
    assert!(matches!(hsm.unseal(&binding(BlobKind::PrivateKey, "o", "k2"), &blob), Err(HsmError::SealAuthentication)));
}

#[test]
fn certificate_mac_is_computed_and_checked_in_the_hsm() {
    let hsm = hsm();
    let mac = hsm.certificate_mac(b"fields").unwrap();
    assert_eq!(mac.len(), 32);
    assert_eq!(hsm.certificate_mac(b"fields").unwrap(), mac, "deterministic");
    assert!(hsm.certificate_mac_valid(b"fields", &mac).unwrap());
    assert!(!hsm.certificate_mac_valid(b"fieldz", &mac).unwrap());
    let mut forged = mac.clone();
    forged[0] ^= 1;
    assert!(!hsm.certificate_mac_valid(b"fields", &forged).unwrap());
    assert!(!hsm.certificate_mac_valid(b"fields", &mac[..31]).unwrap());
    // A refused MAC did not wedge the pool.
    assert!(hsm.certificate_mac_valid(b"fields", &mac).unwrap());
}

#[test]
fn seal_round_trip_with_fresh_ivs() {
    let hsm = hsm();
    let b = binding(BlobKind::PrivateKey, "org-a", "key-1");
    let secret = [42u8; 32];
    let blob1 = hsm.seal(&b, &secret).unwrap();
    let blob2 = hsm.seal(&b, &secret).unwrap();
    assert_ne!(blob1, blob2, "every seal uses a fresh IV");
    assert!(!blob1.windows(32).any(|w| w == secret), "plaintext must not appear in the blob");
    assert_eq!(hsm.unseal(&b, &blob1).unwrap().as_slice(), &secret);
    assert_eq!(hsm.unseal(&b, &blob2).unwrap().as_slice(), &secret);
}

#[test]
fn blob_moved_to_another_org_resource_or_kind_fails_to_open() {
    let hsm = hsm();
    let blob = hsm.seal(&binding(BlobKind::WalletSeed, "org-a", "wallet-1"), b"seed words").unwrap();
    for wrong in [
        binding(BlobKind::WalletSeed, "org-b", "wallet-1"),
        binding(BlobKind::WalletSeed, "org-a", "wallet-2"),
        binding(BlobKind::PrivateKey, "org-a", "wallet-1"),
    ] {
        assert!(matches!(hsm.unseal(&wrong, &blob), Err(HsmError::SealAuthentication)), "{wrong:?}");
    }
    let mut tampered = blob.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let right = binding(BlobKind::WalletSeed, "org-a", "wallet-1");
    assert!(matches!(hsm.unseal(&right, &tampered), Err(HsmError::SealAuthentication)));
    assert!(matches!(hsm.unseal(&right, b"garbage"), Err(HsmError::Malformed(_))));
    // The failures did not wedge the pool: the right binding still opens.
    assert_eq!(hsm.unseal(&right, &blob).unwrap().as_slice(), b"seed words");
}

#[test]
fn bundle_signer_signs_verifiably_and_randomness_differs() {
    use p256::ecdsa::signature::Verifier;
    let hsm = hsm();
    let pk = hsm.signer_public_key().unwrap();
    assert_eq!(pk[0], 0x04);
    let der = hsm.sign_with_bundle_signer(b"envelope data").unwrap();
    let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(&pk).unwrap();
    let sig = p256::ecdsa::Signature::from_der(&der).unwrap();
    vk.verify(b"envelope data", &sig).unwrap();
    assert!(vk.verify(b"other data", &sig).is_err());
    let (a, b) = (hsm.random(32).unwrap(), hsm.random(32).unwrap());
    assert_ne!(a.as_slice(), b.as_slice());
}

#[test]
fn concurrent_seal_and_unseal_share_the_pool() {
    let hsm = hsm();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let hsm = hsm.clone();
            std::thread::spawn(move || {
                for j in 0..25 {
                    let res = format!("r-{i}-{j}");
                    let b = binding(BlobKind::WalletAccountKey, "org", &res);
                    let blob = hsm.seal(&b, res.as_bytes()).unwrap();
                    assert_eq!(hsm.unseal(&b, &blob).unwrap().as_slice(), res.as_bytes());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn webhook_signatures_come_from_the_hsm_key_and_verify_independently() {
    let hsm = hsm();
    let public = hsm.webhook_public_key().unwrap();
    let messages: Vec<Vec<u8>> =
        (0..3).map(|n| format!("v1.ed25519.kid.1700000000000.evt-{n}.{{\"id\":\"a\"}}").into_bytes()).collect();
    let signatures = hsm.sign_webhooks(&messages).unwrap();
    assert_eq!(signatures.len(), 3, "one signature per message, in order");
    // ed25519-dalek, not the HSM, decides whether they verify.
    let key = ed25519_dalek::VerifyingKey::from_bytes(&public).unwrap();
    for (message, signature) in messages.iter().zip(&signatures) {
        key.verify_strict(message, &ed25519_dalek::Signature::from_bytes(signature)).unwrap();
    }
    assert!(key.verify_strict(&messages[1], &ed25519_dalek::Signature::from_bytes(&signatures[0])).is_err());
    assert!(hsm.sign_webhooks(&[]).unwrap().is_empty());
    // The private half stays in the token: sensitive and not extractable.
    let session = hsm.new_session().unwrap();
    let handle = find_key(&session, ObjectClass::PRIVATE_KEY, WEBHOOK_SIGNER_LABEL).unwrap().unwrap();
    let attrs = session.get_attributes(handle, &[AttributeType::Sensitive, AttributeType::Extractable]).unwrap();
    assert!(attrs.contains(&Attribute::Sensitive(true)) && attrs.contains(&Attribute::Extractable(false)), "{attrs:?}");
}

#[test]
fn proofs_are_signed_by_the_hsm_proof_key_and_verify_as_app_proofs() {
    let hsm = hsm();
    let point = hsm.proof_public_key().unwrap();
    assert_eq!(point[0], 0x04);
    let payload = coffer_auth::proof::payload("T", 1, "body", serde_json::json!({ "a": 1 }));
    let signature = hsm.sign_proof(&payload).unwrap();
    let proof = coffer_auth::proof::app_proof(&point, payload.clone(), &signature);
    assert_eq!(coffer_auth::proof::verify(&proof, Some(&point)).unwrap()["body"]["a"], 1);
    // p256 (not the HSM) decides: r || s over SHA-256 of the payload, by the published key.
    use p256::ecdsa::signature::Verifier;
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).unwrap();
    let sig = p256::ecdsa::Signature::from_slice(&signature).unwrap();
    key.verify(payload.as_bytes(), &sig).unwrap();
    assert!(key.verify(b"another payload", &sig).is_err());
    let session = hsm.new_session().unwrap();
    let handle = find_key(&session, ObjectClass::PRIVATE_KEY, PROOF_LABEL).unwrap().unwrap();
    let attrs = session.get_attributes(handle, &[AttributeType::Sensitive, AttributeType::Extractable]).unwrap();
    assert!(attrs.contains(&Attribute::Sensitive(true)) && attrs.contains(&Attribute::Extractable(false)), "{attrs:?}");
}
