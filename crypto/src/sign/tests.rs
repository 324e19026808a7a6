use super::*;
use hmac::{Hmac, Mac};
use k256::ecdsa::signature::hazmat::PrehashVerifier;
use k256::ecdsa::RecoveryId;
use serde_json::Value;
use sha2::Sha512;

/// Spec §10.1 key: `abandon ×11 about`, m/44'/60'/0'/0/0.
const PRIV: &str = "1ab42cc412b618bdea3a599e3c9bae199ebf030895b039e9db1e30dafb12b727";

fn key(h: &str) -> [u8; 32] {
    hex::decode(h).unwrap().try_into().unwrap()
}

fn sign(curve: Curve, secret: &[u8; 32], payload: &str, enc: &str, hf: &str) -> SignatureParts {
    sign_payload(curve, secret, payload, enc, hf).unwrap()
}

fn refusal(curve: Curve, payload: &str, enc: &str, hf: &str) -> String {
    match sign_payload(curve, &key(PRIV), payload, enc, hf) {
        Err(CryptoError::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

fn parts_bytes(p: &SignatureParts) -> (Vec<u8>, u8) {
    assert_eq!((p.r.len(), p.s.len(), p.v.len()), (64, 64, 2));
    assert!(format!("{}{}{}", p.r, p.s, p.v).chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')));
    let rs = hex::decode(format!("{}{}", p.r, p.s)).unwrap();
    (rs, u8::from_str_radix(&p.v, 16).unwrap())
}

/// Verifies a secp256k1 result over `digest`, checks low-S and that (r, s, v) recovers the key.
fn check_k256(secret: &[u8; 32], digest: &[u8], p: &SignatureParts) {
    let (rs, v) = parts_bytes(p);
    let sig = k256::ecdsa::Signature::from_slice(&rs).unwrap();
    assert!(sig.normalize_s().is_none(), "high-S");
    let vk = *k256::ecdsa::SigningKey::from_slice(secret).unwrap().verifying_key();
    vk.verify_prehash(digest, &sig).unwrap();
    let rec = k256::ecdsa::VerifyingKey::recover_from_prehash(digest, &sig, RecoveryId::from_byte(v).unwrap());
    assert_eq!(rec.unwrap(), vk);
    let compressed = crate::keys::public_key(Curve::Secp256k1, secret).unwrap();
    assert_eq!(vk.to_encoded_point(true).as_bytes(), compressed.as_slice());
}

fn check_p256(secret: &[u8; 32], digest: &[u8], p: &SignatureParts) {
    let (rs, v) = parts_bytes(p);
    let sig = p256::ecdsa::Signature::from_slice(&rs).unwrap();
    assert!(sig.normalize_s().is_none(), "high-S");
    let vk = *p256::ecdsa::SigningKey::from_slice(secret).unwrap().verifying_key();
    vk.verify_prehash(digest, &sig).unwrap();
    let rec = p256::ecdsa::VerifyingKey::recover_from_prehash(digest, &sig, RecoveryId::from_byte(v).unwrap());
    assert_eq!(rec.unwrap(), vk);
    let compressed = crate::keys::public_key(Curve::P256, secret).unwrap();
    assert_eq!(vk.to_encoded_point(true).as_bytes(), compressed.as_slice());
}

fn keccak(b: &[u8]) -> [u8; 32] {
    eip712::keccak256(b)
}

fn sha256(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

#[test]
fn spec_vector_secp256k1_keccak256() {
    let sk = key(PRIV);
    let p = sign(Curve::Secp256k1, &sk, "hello", PAYLOAD_ENCODING_TEXT_UTF8, HASH_FUNCTION_KECCAK256);
    assert_eq!(p.r, "a617747480c00ab06e74ef84bc0681b8e3408d9c2ec344b50673fa38dbe68f57");
    assert_eq!(p.s, "373ca52817f06a8cebda66f5a31d09bf24c07027f4da2c50a89eacc54ee48083");
    assert_eq!(p.v, "01");
    let digest = keccak(b"hello");
    assert_eq!(hex::encode(digest), "1c8aff950685c2ed4bc3174f3472287b56d9517b9c948127319a09a7a36deac8");
    check_k256(&sk, &digest, &p);
    // The recovered key is the spec's Ethereum address.
    let vk = *k256::ecdsa::SigningKey::from_slice(&sk).unwrap().verifying_key();
    let addr = keccak(&vk.to_encoded_point(false).as_bytes()[1..]);
    assert_eq!(hex::encode(&addr[12..]), "9858effd232b4033e47d90003d41ec34ecaeda94");
    // Same bytes as HEX, with and without 0x.
    for payload in ["68656c6c6f", "0x68656c6c6f", "0X68656C6C6F"] {
        assert_eq!(sign(Curve::Secp256k1, &sk, payload, PAYLOAD_ENCODING_HEXADECIMAL, HASH_FUNCTION_KECCAK256), p);
    }
    // NO_OP over the digest itself gives the same signature.
    let hexdigest = format!("0x{}", hex::encode(digest));
    assert_eq!(sign(Curve::Secp256k1, &sk, &hexdigest, PAYLOAD_ENCODING_HEXADECIMAL, HASH_FUNCTION_NO_OP), p);
}

#[test]
fn spec_vector_secp256k1_sha256() {
    let sk = key(PRIV);
    let p = sign(Curve::Secp256k1, &sk, "hello", PAYLOAD_ENCODING_TEXT_UTF8, HASH_FUNCTION_SHA256);
    assert_eq!(p.r, "abd4a27db12e29705a60151e77873706c43840aa5ef47cafd01f9ab5cdade8f1");
    assert_eq!(p.s, "34f996a6c0ea426a740efa7c14a69b8069dd4bfc832a16838b77a1e4e209638f");
    assert_eq!(p.v, "01");
    check_k256(&sk, &sha256(b"hello"), &p);
}

#[test]
fn secp256k1_no_op_viem_hash_message() {
    // What viem sends for signMessage("hello"): EIP-191 hash, HEX + NO_OP.
    let sk = key(PRIV);
    let payload = "0x50b2c43fd39106bafbba0da34fc430e1f91e3c96ea2acee2bc34119f92b37750";
    let mut eip191 = b"\x19Ethereum Signed Message:\n5".to_vec();
    eip191.extend_from_slice(b"hello");
    assert_eq!(format!("0x{}", hex::encode(keccak(&eip191))), payload);
    let p = sign(Curve::Secp256k1, &sk, payload, PAYLOAD_ENCODING_HEXADECIMAL, HASH_FUNCTION_NO_OP);
    check_k256(&sk, &keccak(&eip191), &p);
}

/// SLIP-0010 ed25519 (hardened only), inline so the test does not depend on `keys`.
fn slip10_ed25519(seed: &[u8], path: &[u32]) -> [u8; 32] {
    let hmac = |key: &[u8], data: &[u8]| {
        let mut m = Hmac::<Sha512>::new_from_slice(key).unwrap();
        m.update(data);
        m.finalize().into_bytes()
    };
    let mut i = hmac(b"ed25519 seed", seed);
    for index in path {
        let mut data = vec![0u8];
        data.extend_from_slice(&i[..32]);
        data.extend_from_slice(&(index | 0x8000_0000).to_be_bytes());
        i = hmac(&i[32..], &data);
    }
    i[..32].try_into().unwrap()
}

#[test]
fn spec_vector_ed25519_solana() {
    let mnemonic = bip39::Mnemonic::parse(
        "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about",
    )
    .unwrap();
    let sk = slip10_ed25519(&mnemonic.to_seed(""), &[44, 501, 0, 0]);
    let p = sign(Curve::Ed25519, &sk, "hello", PAYLOAD_ENCODING_TEXT_UTF8, HASH_FUNCTION_NOT_APPLICABLE);
    assert_eq!(p.r, "86854909891a2cafb6289a1781b205c0903b3d1d117fe85775533ffe4864146a");
    assert_eq!(p.s, "e67b6381ce931cd68f64df043f3a7c6f4eab326f93088b698449ca703e008606");
    assert_eq!(p.v, "00");
    let (rs, _) = parts_bytes(&p);
    let vk = ed25519_dalek::SigningKey::from_bytes(&sk).verifying_key();
    vk.verify_strict(b"hello", &ed25519_dalek::Signature::from_slice(&rs).unwrap()).unwrap();
    assert_eq!(crate::keys::public_key(Curve::Ed25519, &sk).unwrap(), vk.to_bytes());
    // HEX of the same bytes signs the same message; raw bytes, no hashing.
    assert_eq!(
        sign(Curve::Ed25519, &sk, "0x68656c6c6f", PAYLOAD_ENCODING_HEXADECIMAL, HASH_FUNCTION_NOT_APPLICABLE),
        p
    );
}

#[test]
fn p256_hash_functions_verify_and_recover() {
    let sk = key("a5ba9d6d1a82ab2ad0f3e0bfcd6f2b3fbb4c7c6e2d5f16c9e3f3e0ab8b6b41c2");
    let p = sign(Curve::P256, &sk, "hello", PAYLOAD_ENCODING_TEXT_UTF8, HASH_FUNCTION_SHA256);
    check_p256(&sk, &sha256(b"hello"), &p);
    assert_eq!(sign(Curve::P256, &sk, "hello", PAYLOAD_ENCODING_TEXT_UTF8, HASH_FUNCTION_SHA256), p);
    let digest = sha256(b"hello");
    let no_op = sign(Curve::P256, &sk, &hex::encode(digest), PAYLOAD_ENCODING_HEXADECIMAL, HASH_FUNCTION_NO_OP);
    assert_eq!(no_op, p);
    let k = sign(Curve::P256, &sk, "hello", PAYLOAD_ENCODING_TEXT_UTF8, HASH_FUNCTION_KECCAK256);
    check_p256(&sk, &keccak(b"hello"), &k);
}

#[test]
fn low_s_and_recovery_id_over_many_payloads() {
    // About half of raw ECDSA signatures are high-S: P-256 needs our normalization + v flip.
    let sk = key(PRIV);
    let mut flipped = 0;
    for i in 0u32..40 {
        let payload = format!("payload {i}");
        let d = sha256(payload.as_bytes());
        let p = sign(Curve::P256, &sk, &payload, PAYLOAD_ENCODING_TEXT_UTF8, HASH_FUNCTION_SHA256);
        check_p256(&sk, &d, &p);
        let raw: p256::ecdsa::Signature =
            p256::ecdsa::SigningKey::from_slice(&sk).unwrap().sign_prehash_recoverable(&d).unwrap().0;
        flipped += usize::from(raw.normalize_s().is_some());
        let p = sign(Curve::Secp256k1, &sk, &payload, PAYLOAD_ENCODING_TEXT_UTF8, HASH_FUNCTION_SHA256);
        check_k256(&sk, &d, &p);
    }
    assert!(flipped > 0, "no high-S case exercised");
}

#[test]
fn eip712_mail_signed_by_cow() {
    // EIP-712 Example.sol: cow = keccak256("cow"), v = 28 → recovery id 1.
    let cow = keccak(b"cow");
    let p = sign(Curve::Secp256k1, &cow, eip712::examples::MAIL, PAYLOAD_ENCODING_EIP712, HASH_FUNCTION_NO_OP);
    assert_eq!(p.r, "4355c47d63924e8a72e509b65029052eb6c299d53a04e167c5775fd466751c9d");
    assert_eq!(p.s, "07299936d304c153f6443dfa05f40ff007d72911b6f72307f996231605b91562");
    assert_eq!(p.v, "01");
    let digest = key("be609aee343fb3c4b28e1df9e632fca64fcfaede20f02e86244efddf30957bd2");
    check_k256(&cow, &digest, &p);
    // KECCAK256 is tolerated and yields the same digest.
    let k = sign(Curve::Secp256k1, &cow, eip712::examples::MAIL, PAYLOAD_ENCODING_EIP712, HASH_FUNCTION_KECCAK256);
    assert_eq!(k, p);
}

#[test]
fn eip712_v4_arrays_signed_by_cow() {
    // eth-sig-util signedTypeData_v4: 0x65cbd9…4906 ‖ 1b (v = 27 → recovery id 0).
    let cow = keccak(b"cow");
    let p = sign(Curve::Secp256k1, &cow, eip712::examples::MAIL_V4, PAYLOAD_ENCODING_EIP712, HASH_FUNCTION_NO_OP);
    assert_eq!(p.r, "65cbd956f2fae28a601bebc9b906cea0191744bd4c4247bcd27cd08f8eb6b71c");
    assert_eq!(p.s, "78efdf7a31dc9abee78f492292721f362d296cf86b4538e07b51303b67f74906");
    assert_eq!(p.v, "00");
    check_k256(&cow, &key("a85c2e2b118698e88db68a8105b794a8cc7cec074e89ef991cb4f5f533819cc2"), &p);
}

#[test]
fn eip7702_trust_wallet_vector() {
    // trustwallet/wallet-core tw_evm eip7702 tests ("Verified with viem").
    let payload = r#"{"address":"0xB91aaa96B138A1B1D94c9df4628187132c5F2bf1","chainId":1,"nonce":1}"#;
    let digest = eip7702_digest(payload).unwrap();
    assert_eq!(hex::encode(digest), "3ae543b2fa103a39a6985d964a67caed05f6b9bb2430ad6d498cda743fe911d9");
    let sk = key("947dd69af402e7f48da1b845dfc1df6be593d01a0d8274bd03ec56712e7164e8");
    let p = sign(Curve::Secp256k1, &sk, payload, PAYLOAD_ENCODING_EIP7702_AUTHORIZATION, HASH_FUNCTION_NO_OP);
    assert_eq!(p.r, "2c39f2f64441dd38c364ee175dc6b9a87f34ca330bce968f6c8e22811e3bb710");
    assert_eq!(p.s, "5f1bcde93dee4b214e60bc0e63babcc13e4fecb8a23c4098fd89844762aa012c");
    assert_eq!(p.v, "01");
    check_k256(&sk, &digest, &p);
    // Numbers as strings give the same digest.
    let strings = r#"{"address":"0xb91aaa96b138a1b1d94c9df4628187132c5f2bf1","chainId":"0x1","nonce":"1"}"#;
    assert_eq!(eip7702_digest(strings).unwrap(), digest);
}

#[test]
fn eip7702_rlp_by_hand() {
    let addr = "b91aaa96b138a1b1d94c9df4628187132c5f2bf1";
    let pre = |chain: &str, nonce: &str| {
        hex::encode(
            eip7702_preimage(&format!(r#"{{"address":"0x{addr}","chainId":{chain},"nonce":{nonce}}}"#)).unwrap(),
        )
    };
    // [1, addr, 1]: list of 1 + 21 + 1 = 23 bytes → 0xd7.
    assert_eq!(pre("1", "1"), format!("05d70194{addr}01"));
    // Zero is the empty string 0x80; 0x7f is a single byte; 0x80 needs 0x81 0x80.
    assert_eq!(pre("0", "0"), format!("05d78094{addr}80"));
    assert_eq!(pre("127", "128"), format!("05d87f94{addr}8180"));
    // Full 32-byte chainId and u64::MAX nonce: payload 33 + 21 + 9 = 63 > 55 → long list 0xf8 0x3f.
    let max = format!("\"0x{}\"", "f".repeat(64));
    assert_eq!(
        pre(&max, "\"18446744073709551615\""),
        format!("05f83fa0{}94{addr}88{}", "ff".repeat(32), "ff".repeat(8))
    );
    // Exactly 55 bytes of payload stays short-form (0xc0 + 55 = 0xf7).
    assert_eq!(pre(&max, "0"), format!("05f7a0{}94{addr}80", "ff".repeat(32)));
}

#[test]
fn refusals_by_message() {
    let k1 = Curve::Secp256k1;
    let (hex_, utf8, e712, e7702) = (
        PAYLOAD_ENCODING_HEXADECIMAL,
        PAYLOAD_ENCODING_TEXT_UTF8,
        PAYLOAD_ENCODING_EIP712,
        PAYLOAD_ENCODING_EIP7702_AUTHORIZATION,
    );
    let (noop, sha, kec, na) =
        (HASH_FUNCTION_NO_OP, HASH_FUNCTION_SHA256, HASH_FUNCTION_KECCAK256, HASH_FUNCTION_NOT_APPLICABLE);

    assert_eq!(refusal(k1, "x", "PAYLOAD_ENCODING_BASE64", kec), "invalid payload encoding: PAYLOAD_ENCODING_BASE64");
    assert_eq!(refusal(k1, "x", utf8, "HASH_FUNCTION_MD5"), "invalid hash function: HASH_FUNCTION_MD5");
    assert_eq!(refusal(k1, "0xzz", hex_, kec), "invalid payload: not valid hexadecimal");
    assert_eq!(refusal(k1, "abc", hex_, kec), "invalid payload: not valid hexadecimal");
    let short = "00".repeat(31);
    assert_eq!(refusal(k1, &short, hex_, noop), "invalid payload: NO_OP requires a 32-byte digest");
    assert_eq!(refusal(Curve::P256, &short, hex_, noop), "invalid payload: NO_OP requires a 32-byte digest");
    assert_eq!(refusal(k1, &"00".repeat(33), hex_, noop), "invalid payload: NO_OP requires a 32-byte digest");

    for curve in [k1, Curve::P256] {
        let m = refusal(curve, "hello", utf8, na);
        assert!(m.starts_with("invalid hash function: HASH_FUNCTION_NOT_APPLICABLE is not supported for"), "{m}");
    }
    for hf in [noop, sha, kec] {
        let m = refusal(Curve::Ed25519, "hello", utf8, hf);
        assert!(m.starts_with(&format!("invalid hash function: {hf} is not supported for ed25519")), "{m}");
    }
    for enc in [e712, e7702] {
        for curve in [Curve::Ed25519, Curve::P256] {
            let m = refusal(curve, "{}", enc, noop);
            assert_eq!(m, format!("invalid payload encoding: {enc} requires a secp256k1 key"));
        }
        for hf in [sha, na] {
            let m = refusal(k1, "{}", enc, hf);
            assert_eq!(m, format!("invalid hash function: {hf} cannot be used with {enc}"));
        }
    }

    let m = refusal(k1, "not json", e712, noop);
    assert!(m.starts_with("invalid payload: invalid EIP-712 typed data: not valid JSON"), "{m}");
    let m = refusal(k1, r#"{"types":{},"primaryType":"Mail","message":{}}"#, e712, noop);
    assert_eq!(m, "invalid payload: invalid EIP-712 typed data: primaryType \"Mail\" is not in types");
    let mut mail: Value = serde_json::from_str(eip712::examples::MAIL).unwrap();
    mail["message"]["from"]["wallet"] = Value::String("0x1234".into());
    let m = refusal(k1, &mail.to_string(), e712, noop);
    assert_eq!(
        m,
        "invalid payload: invalid EIP-712 typed data: Mail.from: Person.wallet: \"0x1234\" is not a 20-byte hex address"
    );

    let m = refusal(k1, r#"{"chainId":1,"nonce":0}"#, e7702, noop);
    assert_eq!(m, "invalid payload: invalid EIP-7702 authorization: missing \"address\"");
    let m = refusal(
        k1,
        r#"{"address":"0xB91aaa96B138A1B1D94c9df4628187132c5F2bf1","chainId":1,"nonce":"18446744073709551616"}"#,
        e7702,
        noop,
    );
    assert_eq!(m, "invalid payload: invalid EIP-7702 authorization: nonce: value out of range for uint64");
    let m =
        refusal(k1, r#"{"address":"0xB91aaa96B138A1B1D94c9df4628187132c5F2bf1","chainId":-1,"nonce":0}"#, e7702, noop);
    assert_eq!(m, "invalid payload: invalid EIP-7702 authorization: chainId: negative value for uint256");
}

#[test]
fn a_signature_made_elsewhere_is_normalized_to_low_s_with_the_recovery_id_found_by_trial() {
    let secret = [0x42u8; 32];
    let digest = [0x17u8; 32];
    for curve in [Curve::Secp256k1, Curve::P256] {
        let public = crate::keys::public_key(curve, &secret).unwrap();
        let ours = sign_digest(curve, &secret, &digest).unwrap();
        // The same signature with S negated (high-S), as an HSM may return it.
        let high_s = match curve {
            Curve::Secp256k1 => {
                let s = k256::ecdsa::Signature::from_scalars(ours.r, ours.s).unwrap();
                let (r, s) = (s.r(), -*s.s());
                [r.to_bytes().to_vec(), s.to_bytes().to_vec()].concat()
            }
            _ => {
                let s = p256::ecdsa::Signature::from_scalars(ours.r, ours.s).unwrap();
                let (r, s) = (s.r(), -*s.s());
                [r.to_bytes().to_vec(), s.to_bytes().to_vec()].concat()
            }
        };
        assert_ne!(&high_s[32..], &ours.s[..]);
        for raw in [[ours.r, ours.s].concat(), high_s] {
            assert_eq!(ecdsa_from_raw(curve, &public, &digest, &raw).unwrap(), ours, "{curve:?}");
        }
        let other = crate::keys::public_key(curve, &[0x43u8; 32]).unwrap();
        assert!(ecdsa_from_raw(curve, &other, &digest, &[ours.r, ours.s].concat()).is_err(), "another key's");
        assert!(ecdsa_from_raw(curve, &public, &[0x18u8; 32], &[ours.r, ours.s].concat()).is_err(), "another digest");
        assert!(ecdsa_from_raw(curve, &public, &digest, &ours.r).is_err(), "32 bytes");
    }
}
