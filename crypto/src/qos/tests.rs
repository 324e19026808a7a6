use super::*;

/// The receiver (our enclave key in production): scalar 0x3c × 32.
const RECEIVER_SECRET: [u8; 32] = [0x3c; 32];
const RECEIVER_PUBLIC_HEX: &str = "04480011fd860eae308cc4291ee974eaa40ded6e99e1a51cca5d1e694fdb855afbbf66413c95d399ca88e58c6238166dcb3c07f6c17509af8ed1b8bb15ce4a49fd";

/// `await encryptOauth2ClientSecret("GOCSPX-coffer-test-client-secret", RECEIVER_PUBLIC_HEX)`,
/// `@turnkey/crypto` 2.13.2 under node.
const NODE_SECRET: &str = "GOCSPX-coffer-test-client-secret";
const NODE_ENVELOPE_HEX: &str = "4430de6e8f6de0a0e3e9ff780419141fb7509a933331da705f223740aae6d6f5c44e9bf5d701a0a644e49783fc5048ae3c82ca10c2be2f9956b2558859bbf0d8f5e8e4d97dac317a26408c355930000000baf43a0d43b13fd1adbf9212773d7a9cda57e4b3d9fdadef02e9a9d2316d565e64ee6d5cd7ecbd7e5dde127ed9ece387";

/// The same with the receiver key given compressed (`03480011…`), which the SDK accepts.
const NODE_COMPRESSED_SECRET: &str = "compressed-receiver-secret";
const NODE_COMPRESSED_ENVELOPE_HEX: &str = "7143c2b3ec5467c5ae0b3f2204c8386208f15176b1784517cb6f7b0526f4081073146d6b0719af2b97733f4308d5aaebf72a9fcc5b2404575ce6907cbbcab15b577f393fdcfd62cdb3dc11b1ba2a0000006a0ee4a802a105f124298a87001d107e372dd9d62f6b228827f9bb1d4093babc9cbf7c09e6c550900a79";

fn receiver_public() -> [u8; 65] {
    hex::decode(RECEIVER_PUBLIC_HEX).unwrap().try_into().unwrap()
}

/// What the HSM does: `CKM_ECDH1_DERIVE` + `CKD_NULL` = x-coordinate of secret · peer.
fn soft_ecdh(secret: [u8; 32]) -> impl FnOnce(&[u8; 65]) -> Result<Zeroizing<[u8; 32]>, CryptoError> {
    move |peer| {
        let secret = p256::SecretKey::from_slice(&secret).unwrap();
        let peer = p256::PublicKey::from_sec1_bytes(peer).unwrap();
        let shared = p256::ecdh::diffie_hellman(secret.to_nonzero_scalar(), peer.as_affine());
        let mut x = Zeroizing::new([0u8; 32]);
        x.copy_from_slice(shared.raw_secret_bytes());
        Ok(x)
    }
}

fn open(envelope: &[u8]) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    open_quorum_envelope(envelope, &receiver_public(), soft_ecdh(RECEIVER_SECRET))
}

fn assert_refused(result: Result<Zeroizing<Vec<u8>>, CryptoError>, secret: &str) {
    let err = result.expect_err("must be refused");
    let text = format!("{err} {err:?}");
    assert!(text.contains("invalid quorum-encrypted envelope"), "{text}");
    assert!(!text.contains(secret), "error leaks the plaintext: {text}");
}

#[test]
fn receiver_public_matches_secret() {
    let key = p256::SecretKey::from_slice(&RECEIVER_SECRET).unwrap();
    assert_eq!(key.public_key().to_encoded_point(false).as_bytes(), receiver_public());
}

#[test]
fn opens_node_encrypt_oauth2_client_secret() {
    let envelope = decode_encrypted_client_secret(NODE_ENVELOPE_HEX).unwrap();
    assert_eq!(envelope.len(), 12 + 65 + 4 + NODE_SECRET.len() + 16);
    assert_eq!(open(&envelope).unwrap().as_slice(), NODE_SECRET.as_bytes());
}

#[test]
fn opens_node_envelope_sealed_to_compressed_key() {
    let envelope = decode_encrypted_client_secret(NODE_COMPRESSED_ENVELOPE_HEX).unwrap();
    assert_eq!(open(&envelope).unwrap().as_slice(), NODE_COMPRESSED_SECRET.as_bytes());
}

#[test]
fn ecdh_gets_the_ephemeral_sender_key() {
    let envelope = decode_encrypted_client_secret(NODE_ENVELOPE_HEX).unwrap();
    let mut seen = None;
    let plaintext = open_quorum_envelope(&envelope, &receiver_public(), |peer| {
        seen = Some(*peer);
        soft_ecdh(RECEIVER_SECRET)(peer)
    })
    .unwrap();
    assert_eq!(plaintext.as_slice(), NODE_SECRET.as_bytes());
    assert_eq!(seen.unwrap().as_slice(), &envelope[12..77]);
}

#[test]
fn decode_accepts_prefix_and_upper_case_and_refuses_garbage() {
    let upper = format!("0x{}", NODE_ENVELOPE_HEX.to_uppercase());
    assert_eq!(decode_encrypted_client_secret(&upper).unwrap(), hex::decode(NODE_ENVELOPE_HEX).unwrap());
    for bad in ["", "zz", "abc", &NODE_ENVELOPE_HEX[..NODE_ENVELOPE_HEX.len() - 2], &format!("{NODE_ENVELOPE_HEX}00")] {
        let err = decode_encrypted_client_secret(bad).unwrap_err();
        assert_eq!(err.to_string(), "invalid quorum-encrypted envelope");
    }
}

#[test]
fn round_trip_is_deterministic() {
    let ephemeral = [0x55; 32];
    let a = seal_quorum_envelope(b"round trip secret", &receiver_public(), &ephemeral).unwrap();
    let b = seal_quorum_envelope(b"round trip secret", &receiver_public(), &ephemeral).unwrap();
    assert_eq!(a, b);
    assert_eq!(decode_encrypted_client_secret(&hex::encode(&a)).unwrap(), a);
    assert_eq!(open(&a).unwrap().as_slice(), b"round trip secret");
    let empty = seal_quorum_envelope(b"", &receiver_public(), &ephemeral).unwrap();
    assert_eq!(open(&empty).unwrap().as_slice(), b"");
}

#[test]
fn tampering_is_refused_without_leaking_plaintext() {
    let envelope = hex::decode(NODE_ENVELOPE_HEX).unwrap();
    // Every byte of nonce, sender key (off-curve or another point), length and ciphertext.
    for i in 0..envelope.len() {
        let mut bad = envelope.clone();
        bad[i] ^= 0x01;
        let result = open_quorum_envelope(&bad, &receiver_public(), |peer| {
            // A tampered sender key that still is a point reaches the HSM; that is fine.
            soft_ecdh(RECEIVER_SECRET)(peer)
        });
        assert_refused(result, NODE_SECRET);
    }
}

#[test]
fn wrong_receiver_is_refused() {
    let envelope = hex::decode(NODE_ENVELOPE_HEX).unwrap();
    let other_secret = [0x3d; 32];
    let other_public: [u8; 65] = p256::SecretKey::from_slice(&other_secret)
        .unwrap()
        .public_key()
        .to_encoded_point(false)
        .as_bytes()
        .try_into()
        .unwrap();
    assert_refused(open_quorum_envelope(&envelope, &other_public, soft_ecdh(other_secret)), NODE_SECRET);
    // Right public key, wrong ECDH answer (another HSM key).
    assert_refused(open_quorum_envelope(&envelope, &receiver_public(), soft_ecdh(other_secret)), NODE_SECRET);
}

#[test]
fn truncated_and_trailing_bytes_are_refused_before_ecdh() {
    let envelope = hex::decode(NODE_ENVELOPE_HEX).unwrap();
    let never = |_: &[u8; 65]| -> Result<Zeroizing<[u8; 32]>, CryptoError> { panic!("ECDH must not run") };
    for len in [0, 1, 12, 77, 80, 81, 96, envelope.len() - 1] {
        assert_refused(open_quorum_envelope(&envelope[..len], &receiver_public(), never), NODE_SECRET);
    }
    let mut longer = envelope.clone();
    longer.push(0);
    assert_refused(open_quorum_envelope(&longer, &receiver_public(), never), NODE_SECRET);
    // A length prefix that disagrees with the rest.
    let mut bad_len = envelope.clone();
    bad_len[77] += 1;
    assert_refused(open_quorum_envelope(&bad_len, &receiver_public(), never), NODE_SECRET);
    // A sender key that is not an uncompressed point never reaches the HSM.
    let mut compressed = envelope.clone();
    compressed[12] = 0x02;
    assert_refused(open_quorum_envelope(&compressed, &receiver_public(), never), NODE_SECRET);
    let mut off_curve = envelope;
    off_curve[76] ^= 0x01;
    assert_refused(open_quorum_envelope(&off_curve, &receiver_public(), never), NODE_SECRET);
}

#[test]
fn ecdh_errors_pass_through() {
    let envelope = hex::decode(NODE_ENVELOPE_HEX).unwrap();
    let err = open_quorum_envelope(&envelope, &receiver_public(), |_| Err(CryptoError::Internal("hsm down".into())))
        .unwrap_err();
    assert_eq!(err.to_string(), "internal error: hsm down");
}

#[test]
fn bad_keys_are_refused() {
    let mut not_a_point = receiver_public();
    not_a_point[64] ^= 1;
    assert!(seal_quorum_envelope(b"x", &not_a_point, &[0x55; 32]).is_err());
    assert!(open_quorum_envelope(&hex::decode(NODE_ENVELOPE_HEX).unwrap(), &not_a_point, soft_ecdh(RECEIVER_SECRET))
        .is_err());
    assert!(seal_quorum_envelope(b"x", &receiver_public(), &[0u8; 32]).is_err());
    assert!(seal_quorum_envelope(b"x", &receiver_public(), &[0xff; 32]).is_err());
}
