use super::*;
use p256::ecdsa::signature::Signer as _;
use p256::ecdsa::{Signature, SigningKey};
use serde_json::Value;
use turnkey_enclave_encrypt::client::EnclaveEncryptClient;
use turnkey_enclave_encrypt::errors::EnclaveEncryptError;
use turnkey_enclave_encrypt::{ExportClient, ImportClient, QuorumPublicKey};

/// The RNG seed of a test: 32 copies of `byte`.
fn rng(byte: u8) -> RngSeed {
    RngSeed::from(Zeroizing::new([byte; 32]))
}

/// Test-only software quorum key (the enclave uses the HSM).
struct SoftSigner(SigningKey);

impl EnvelopeSigner for SoftSigner {
    fn public_key(&self) -> [u8; 65] {
        self.0.verifying_key().to_encoded_point(false).as_bytes().try_into().unwrap()
    }
    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let sig: Signature = self.0.sign(data);
        Ok(sig.to_der().as_bytes().to_vec())
    }
}

/// §9.7 quorum key: scalar 0x2a × 32.
fn signer() -> SoftSigner {
    SoftSigner(SigningKey::from_slice(&[0x2a; 32]).unwrap())
}

fn other_signer() -> SoftSigner {
    SoftSigner(SigningKey::from_slice(&[0x07; 32]).unwrap())
}

/// 130-byte client pin: any valid point (here another key) ‖ the signing key.
fn quorum(signer: &SoftSigner) -> QuorumPublicKey {
    let first = other_signer().public_key();
    QuorumPublicKey::from_bytes([first.as_slice(), &signer.public_key()].concat()).unwrap()
}

const MNEMONIC: &str = "test test test test test test test test test test test junk";
const PRIVATE_KEY: [u8; 32] = [0x11; 32];

fn field<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap()
}

/// Decoded `data` of a bundle, after checking the signature over SHA-256 of the raw data bytes.
fn verified_data(bundle: &str, signer_public: &[u8; 65]) -> Vec<u8> {
    let v: Value = serde_json::from_str(bundle).unwrap();
    assert_eq!(field(&v, "version"), "v1.0.0");
    assert_eq!(field(&v, "enclaveQuorumPublic"), hex::encode(signer_public));
    let data = hex::decode(field(&v, "data")).unwrap();
    let sig = p256::ecdsa::DerSignature::try_from(hex::decode(field(&v, "dataSignature")).unwrap().as_slice()).unwrap();
    let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(signer_public).unwrap();
    vk.verify(&data, &sig).unwrap();
    data
}

#[test]
fn export_decrypts_with_turnkey_export_client() {
    let s = signer();
    // Wallet: mnemonic.
    let mut client = ExportClient::new(&quorum(&s));
    let target = client.target_public_key().unwrap();
    assert_eq!(target.len(), 130);
    let bundle = export_bundle(&s, &rng(1), &target, "org-1", MNEMONIC.as_bytes()).unwrap();
    assert_eq!(client.decrypt_wallet_mnemonic_phrase(&bundle, "org-1").unwrap(), MNEMONIC);

    // Private key: 32 bytes; target passed compressed with 0x.
    let mut client = ExportClient::new(&quorum(&s));
    let target = hex::decode(client.target_public_key().unwrap()).unwrap();
    let compressed = p256::PublicKey::from_sec1_bytes(&target).unwrap().to_encoded_point(true);
    let target_hex = format!("0x{}", hex::encode(compressed.as_bytes()));
    let bundle = export_bundle(&s, &rng(2), &target_hex, "org-1", &PRIVATE_KEY).unwrap();
    assert_eq!(client.decrypt_private_key(&bundle, "org-1").unwrap(), PRIVATE_KEY);
}

#[test]
fn export_refused_by_client_for_wrong_org_signature_or_signer() {
    let s = signer();
    let new_bundle = |client: &ExportClient, org: &str| {
        export_bundle(&s, &rng(3), &client.target_public_key().unwrap(), org, MNEMONIC.as_bytes()).unwrap()
    };

    let mut client = ExportClient::new(&quorum(&s));
    let bundle = new_bundle(&client, "org-2");
    assert_eq!(client.decrypt_wallet_mnemonic_phrase(&bundle, "org-1"), Err(EnclaveEncryptError::InvalidOrganization));

    // Tampered signature: flip a bit of s (last byte of the DER).
    let mut client = ExportClient::new(&quorum(&s));
    let mut v: Value = serde_json::from_str(&new_bundle(&client, "org-1")).unwrap();
    let mut sig = hex::decode(field(&v, "dataSignature")).unwrap();
    *sig.last_mut().unwrap() ^= 1;
    v["dataSignature"] = Value::String(hex::encode(sig));
    assert_eq!(
        client.decrypt_wallet_mnemonic_phrase(v.to_string(), "org-1"),
        Err(EnclaveEncryptError::ServerEncappedKeySignatureVerificationFail)
    );

    // Tampered data (org swapped after signing).
    let mut client = ExportClient::new(&quorum(&s));
    let mut v: Value = serde_json::from_str(&new_bundle(&client, "org-1")).unwrap();
    let data = String::from_utf8(hex::decode(field(&v, "data")).unwrap()).unwrap();
    v["data"] = Value::String(hex::encode(data.replace("org-1", "org-9")));
    assert_eq!(
        client.decrypt_wallet_mnemonic_phrase(v.to_string(), "org-9"),
        Err(EnclaveEncryptError::ServerEncappedKeySignatureVerificationFail)
    );

    // A client pinned to another quorum key.
    let mut client = ExportClient::new(&quorum(&other_signer()));
    let bundle = new_bundle(&client, "org-1");
    assert_eq!(
        client.decrypt_wallet_mnemonic_phrase(&bundle, "org-1"),
        Err(EnclaveEncryptError::InvalidEnclaveQuorumPublicKey)
    );
}

#[test]
fn export_bundle_shape_signature_and_determinism() {
    let s = signer();
    let target = "0403b68b7daa21027d1b9ca5b7f6bd65aaa8d99573a8d1984d4168291fe9e3059cebbcaba18fbb4eee31fd7b49f1d699e086ddd61cf517170f9d05807bcb1d1483";
    let bundle = export_bundle(&s, &rng(4), target, "org-1", MNEMONIC.as_bytes()).unwrap();
    assert!(bundle.starts_with(r#"{"version":"v1.0.0","data":""#), "{bundle}");
    let keys: Vec<&str> = ["\"version\"", "\"data\"", "\"dataSignature\"", "\"enclaveQuorumPublic\""].to_vec();
    let pos: Vec<usize> = keys.iter().map(|k| bundle.find(k).unwrap()).collect();
    assert!(pos.windows(2).all(|w| w[0] < w[1]));
    // (d) dataSignature verifies over SHA-256 of the decoded data bytes.
    let data = String::from_utf8(verified_data(&bundle, &s.public_key())).unwrap();
    assert!(data.starts_with(r#"{"encappedPublic":"04"#), "{data}");
    let d: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(field(&d, "encappedPublic").len(), 130);
    assert_eq!(field(&d, "organizationId"), "org-1");
    assert!(data.find("\"ciphertext\"").unwrap() < data.find("\"organizationId\"").unwrap());
    // AES-GCM: plaintext + 16-byte tag.
    assert_eq!(hex::decode(field(&d, "ciphertext")).unwrap().len(), MNEMONIC.len() + 16);
    // Same seed → same bundle; another seed → another ephemeral key.
    assert_eq!(export_bundle(&s, &rng(4), target, "org-1", MNEMONIC.as_bytes()).unwrap(), bundle);
    assert_ne!(export_bundle(&s, &rng(5), target, "org-1", MNEMONIC.as_bytes()).unwrap(), bundle);
}

#[test]
fn export_rejects_bad_target_keys() {
    let s = signer();
    let good = "0403b68b7daa21027d1b9ca5b7f6bd65aaa8d99573a8d1984d4168291fe9e3059cebbcaba18fbb4eee31fd7b49f1d699e086ddd61cf517170f9d05807bcb1d1483";
    let not_on_curve = format!("{}00", &good[..128]);
    for bad in ["", "04", "zz", &good[..128], &not_on_curve, &format!("{good}00"), &good.replace("04", "05")] {
        match export_bundle(&s, &rng(0), bad, "org-1", b"x") {
            Err(CryptoError::InvalidArgument(m)) => assert_eq!(m, "invalid target public key"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn export_refuses_a_signer_whose_signature_does_not_verify() {
    struct Liar;
    impl EnvelopeSigner for Liar {
        fn public_key(&self) -> [u8; 65] {
            other_signer().public_key()
        }
        fn sign(&self, data: &[u8]) -> Result<Vec<u8>, CryptoError> {
            signer().sign(data)
        }
    }
    let target = ExportClient::new(&quorum(&signer())).target_public_key().unwrap();
    assert!(matches!(export_bundle(&Liar, &rng(0), &target, "o", b"x"), Err(CryptoError::Internal(_))));
}

#[test]
fn import_round_trip_with_turnkey_import_client() {
    let s = signer();
    let t = new_import_target(&rng(9)).unwrap();
    assert_eq!(import_target_public(&t.secret).unwrap(), t.public);
    assert_eq!(new_import_target(&rng(9)).unwrap().public, t.public);
    assert_ne!(new_import_target(&rng(8)).unwrap().public, t.public);

    let bundle = import_bundle(&s, &t.public, "org-1", "user-1").unwrap();
    assert!(bundle.starts_with(r#"{"version":"v1.0.0","data":""#), "{bundle}");
    let data = String::from_utf8(verified_data(&bundle, &s.public_key())).unwrap();
    assert_eq!(
        data,
        format!(r#"{{"targetPublic":"{}","organizationId":"org-1","userId":"user-1"}}"#, hex::encode(t.public))
    );

    let mut client = ImportClient::new(&quorum(&s));
    let encrypted = client.encrypt_wallet_with_bundle(MNEMONIC, &bundle, "org-1", "user-1").unwrap();
    assert_eq!(open_encrypted_bundle(&t.secret, &encrypted).unwrap().as_slice(), MNEMONIC.as_bytes());

    let mut client = ImportClient::new(&quorum(&s));
    let encrypted = client.encrypt_private_key_with_bundle(PRIVATE_KEY, &bundle, "org-1", "user-1").unwrap();
    assert_eq!(open_encrypted_bundle(&t.secret, &encrypted).unwrap().as_slice(), PRIVATE_KEY);

    // The client checks org, user and the signer pin.
    let mut client = ImportClient::new(&quorum(&s));
    assert_eq!(
        client.encrypt_wallet_with_bundle(MNEMONIC, &bundle, "org-1", "user-2"),
        Err(EnclaveEncryptError::InvalidUser)
    );
    assert_eq!(
        client.encrypt_wallet_with_bundle(MNEMONIC, &bundle, "org-2", "user-1"),
        Err(EnclaveEncryptError::InvalidOrganization)
    );
    let mut client = ImportClient::new(&quorum(&other_signer()));
    assert_eq!(
        client.encrypt_wallet_with_bundle(MNEMONIC, &bundle, "org-1", "user-1"),
        Err(EnclaveEncryptError::InvalidEnclaveQuorumPublicKey)
    );
}

#[test]
fn import_rejects_bad_target_and_open_rejects_bad_bundles() {
    let s = signer();
    let mut bad = [0u8; 65];
    bad[0] = 4;
    assert!(
        matches!(import_bundle(&s, &bad, "o", "u"), Err(CryptoError::InvalidArgument(m)) if m == "invalid target public key")
    );

    let t = new_import_target(&rng(10)).unwrap();
    let bundle = import_bundle(&s, &t.public, "org-1", "user-1").unwrap();
    let mut client = ImportClient::new(&quorum(&s));
    let encrypted = client.encrypt_wallet_with_bundle(MNEMONIC, &bundle, "org-1", "user-1").unwrap();
    let v: Value = serde_json::from_str(&encrypted).unwrap();
    let (enc, ct) = (field(&v, "encappedPublic").to_owned(), field(&v, "ciphertext").to_owned());
    let mut flipped = hex::decode(&ct).unwrap();
    flipped[0] ^= 1;
    let other = new_import_target(&rng(11)).unwrap();
    let cases = [
        ("not json".to_owned(), &t.secret),
        (r#"{"encappedPublic":"04"}"#.to_owned(), &t.secret),
        (format!(r#"{{"encappedPublic":"{enc}","ciphertext":"{}"}}"#, hex::encode(&flipped)), &t.secret),
        (format!(r#"{{"encappedPublic":"{}","ciphertext":"{ct}"}}"#, &enc[..128]), &t.secret),
        (format!(r#"{{"encappedPublic":"{enc}","ciphertext":"zz"}}"#), &t.secret),
        (encrypted.clone(), &other.secret),
    ];
    for (msg, secret) in cases {
        match open_encrypted_bundle(secret, &msg) {
            Err(CryptoError::InvalidArgument(m)) => assert_eq!(m, "invalid encrypted bundle"),
            other => panic!("{msg}: {other:?}"),
        }
    }
    // 0x-prefixed hex is tolerated.
    let prefixed = format!(r#"{{"encappedPublic":"0x{enc}","ciphertext":"0x{ct}"}}"#);
    assert_eq!(open_encrypted_bundle(&t.secret, &prefixed).unwrap().as_slice(), MNEMONIC.as_bytes());
}

/// Wire spec §9.7 (produced by Rust `EnclaveEncryptServer`, verified with JS `decryptExportBundle`).
const SPEC_97_BUNDLE: &str = r#"{"version":"v1.0.0","data":"7b22656e6361707065645075626c6963223a2230343138323261306139633139363131643433656535333766353435646662393934363639616132376638333165383131653037336136373935316438663061313530396662623766656232306436646135353531306536623666616138663266326531656663333138303965316239646665623461366439383333633464643137222c2263697068657274657874223a22313535303263326137336333363964636633646664653738376235333732303934356133653938376663663833623764336366626435663331363362366634363134396137353933343962333233303832666637613966663930356662323465303966623438633439653336393032613232393062346338616463333430623732616664663962643934643735346461356435396336222c226f7267616e697a6174696f6e4964223a226f72672d31227d","dataSignature":"304502206d201ba07bdf107f3b00e96a2ba24d4c6aded55804e65975b7a6fcbd0a99ca25022100c1a9ccef036f056ce947ac4cc7a6f809668dd1b295358026b293b8087be647f5","enclaveQuorumPublic":"040c901d423c831ca85e27c73c263ba132721bb9d7a84c4f0380b2a6756fd601331c8870234dec878504c174144fa4b14b66a651691606d8173e55bd37e381569e"}"#;
const SPEC_97_TARGET_SECRET: &str = "a5ba9d6d1a82ab2ad0f3e0bfcd6f2b3fbb4c7c6e2d5f16c9e3f3e0ab8b6b41c2";
const SPEC_97_TARGET_PUBLIC: &str = "0403b68b7daa21027d1b9ca5b7f6bd65aaa8d99573a8d1984d4168291fe9e3059cebbcaba18fbb4eee31fd7b49f1d699e086ddd61cf517170f9d05807bcb1d1483";

#[test]
fn spec_97_vector_decrypts_with_the_client_and_our_receiver() {
    let s = signer();
    assert_eq!(
        hex::encode(s.public_key()),
        "040c901d423c831ca85e27c73c263ba132721bb9d7a84c4f0380b2a6756fd601331c8870234dec878504c174144fa4b14b66a651691606d8173e55bd37e381569e"
    );
    let secret: [u8; 32] = hex::decode(SPEC_97_TARGET_SECRET).unwrap().try_into().unwrap();
    assert_eq!(hex::encode(import_target_public(&secret).unwrap()), SPEC_97_TARGET_PUBLIC);

    // The published client, holding the §9.7 target key.
    let private = <Kem as KemTrait>::PrivateKey::from_bytes(&secret).unwrap();
    let public = <Kem as KemTrait>::PublicKey::from_bytes(&hex::decode(SPEC_97_TARGET_PUBLIC).unwrap()).unwrap();
    let vk = quorum(&s).verifying_key().unwrap();
    let mut client = EnclaveEncryptClient::from_enclave_auth_key_and_target_key(vk, public, private);
    let plaintext = client.decrypt(SPEC_97_BUNDLE.as_bytes(), "org-1").unwrap();
    assert_eq!(plaintext, MNEMONIC.as_bytes());

    // (d) the (high-S) dataSignature verifies with p256 over SHA-256 of the decoded data, and our
    // test signer reproduces it (RFC 6979, same key) — so our envelopes are signed the same way.
    let data = verified_data(SPEC_97_BUNDLE, &s.public_key());
    let v: Value = serde_json::from_str(SPEC_97_BUNDLE).unwrap();
    assert_eq!(hex::encode(s.sign(&data).unwrap()), field(&v, "dataSignature"));

    // Our HPKE receiver opens the same ciphertext (`data` carries encappedPublic + ciphertext).
    let data = String::from_utf8(data).unwrap();
    assert_eq!(open_encrypted_bundle(&secret, &data).unwrap().as_slice(), MNEMONIC.as_bytes());
}
