//! HD derivation: BIP-32 for secp256k1 (bip32 crate), SLIP-0010 for NIST P-256 and Ed25519.
//!
//! SLIP-0010 is written out here (an HMAC-SHA512 chain plus, for P-256, a scalar addition):
//! no maintained crate implements SLIP-0010 for both P-256 and Ed25519 on top of the RustCrypto /
//! dalek types this crate already uses, and the algorithm is a few dozen lines. It is checked
//! against every SLIP-0010 test vector for both curves, including the P-256 retry cases.

use bip32::{ChildNumber, XPrv};
use hmac::{Hmac, Mac};
use p256::elliptic_curve::{sec1::ToEncodedPoint, Field, PrimeField};
use sha2::Sha512;
use zeroize::{Zeroize, Zeroizing};

use super::curve::{Curve, SecretKey};
use crate::error::CryptoError;
use crate::secret::Seed;

const HARDENED: u32 = 1 << 31;
/// BIP-32 serializes the depth in one byte.
const MAX_DEPTH: usize = 255;
/// SLIP-0010 retries hash until a key is valid; for P-256 each try fails with probability
/// about 2^-32, so this bound is never reached by chance.
const MAX_RETRIES: usize = 64;

fn invalid_path(reason: impl std::fmt::Display) -> CryptoError {
    CryptoError::invalid(format!("invalid path: {reason}"))
}

/// Parses `m/44'/60'/0'/0/0` into child indices (hardened ones with bit 31 set). `'`, `h` and `H`
/// mark a hardened segment; `m` alone is the master key.
fn parse_path(path: &str) -> Result<Vec<u32>, CryptoError> {
    let mut segments = path.trim().split('/');
    if segments.next() != Some("m") {
        return Err(invalid_path(format!("{path:?} must start with \"m/\"")));
    }
    let mut indices = Vec::new();
    for segment in segments {
        let (digits, hardened) = match segment.strip_suffix(['\'', 'h', 'H']) {
            Some(d) => (d, true),
            None => (segment, false),
        };
        if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid_path(format!("bad segment {segment:?} in {path:?}")));
        }
        let index: u64 = digits.parse().map_err(|_| invalid_path(format!("bad segment {segment:?} in {path:?}")))?;
        if index >= u64::from(HARDENED) {
            return Err(invalid_path(format!("index {index} in {path:?} must be below 2^31")));
        }
        // Checked just above: index < 2^31.
        let index = index as u32;
        indices.push(if hardened { index | HARDENED } else { index });
        if indices.len() > MAX_DEPTH {
            return Err(invalid_path(format!("more than {MAX_DEPTH} levels")));
        }
    }
    Ok(indices)
}

/// The private key at `path` below `seed` (16 to 64 bytes, normally a BIP-39 seed).
///
/// secp256k1: BIP-32. P-256: SLIP-0010 ("Nist256p1 seed"). Ed25519: SLIP-0010 ("ed25519 seed"),
/// hardened segments only; the secret is the RFC 8032 seed of the key.
pub fn derive(seed: &Seed, curve: Curve, path: &str) -> Result<SecretKey, CryptoError> {
    let seed = seed.as_bytes();
    let indices = parse_path(path)?;
    if curve == Curve::Ed25519 && indices.iter().any(|i| i & HARDENED == 0) {
        return Err(invalid_path("ed25519 derivation supports hardened segments only"));
    }
    if !(16..=64).contains(&seed.len()) {
        return Err(CryptoError::invalid(format!("invalid seed length: {} bytes (must be 16 to 64)", seed.len())));
    }
    let key = match curve {
        Curve::Secp256k1 => bip32_secp256k1(seed, &indices),
        Curve::P256 => slip10_p256(seed, &indices),
        Curve::Ed25519 => slip10_ed25519(seed, &indices),
    }?;
    Ok(SecretKey::from_array(curve, &key))
}

fn bip32_secp256k1(seed: &[u8], indices: &[u32]) -> Result<Zeroizing<[u8; 32]>, CryptoError> {
    // The crate's signing keys zeroize themselves on drop.
    let mut key = XPrv::new(seed).map_err(|e| match e {
        bip32::Error::SeedLength => CryptoError::invalid(format!(
            "invalid seed length: {} bytes (BIP-32 on secp256k1 takes 16, 32 or 64)",
            seed.len()
        )),
        _ => CryptoError::Internal("BIP-32 master key derivation failed".into()),
    })?;
    for &index in indices {
        // Fails only if a derived key is invalid (probability below 2^-127).
        key = key
            .derive_child(ChildNumber(index))
            .map_err(|_| CryptoError::Internal("BIP-32 child key derivation failed".into()))?;
    }
    let mut bytes = key.to_bytes();
    let out = Zeroizing::new(bytes);
    bytes.zeroize();
    Ok(out)
}

/// HMAC-SHA512 of the concatenation of `parts`, in a zeroizing buffer.
fn hmac_sha512(key: &[u8], parts: &[&[u8]]) -> Result<Zeroizing<[u8; 64]>, CryptoError> {
    let mut mac =
        <Hmac<Sha512> as Mac>::new_from_slice(key).map_err(|_| CryptoError::Internal("HMAC key rejected".into()))?;
    for part in parts {
        mac.update(part);
    }
    let mut digest = mac.finalize().into_bytes();
    let mut out = Zeroizing::new([0u8; 64]);
    out.copy_from_slice(&digest);
    digest.as_mut_slice().zeroize();
    Ok(out)
}

/// A SLIP-0010 node: private key and chain code.
struct Node {
    key: Zeroizing<[u8; 32]>,
    chain: Zeroizing<[u8; 32]>,
}

impl Node {
    /// I_L as the key, I_R as the chain code.
    fn from_digest(i: &[u8; 64]) -> Node {
        let mut key = Zeroizing::new([0u8; 32]);
        let mut chain = Zeroizing::new([0u8; 32]);
        key.copy_from_slice(&i[..32]);
        chain.copy_from_slice(&i[32..]);
        Node { key, chain }
    }
}

fn slip10_ed25519(seed: &[u8], indices: &[u32]) -> Result<Zeroizing<[u8; 32]>, CryptoError> {
    // Every 32-byte string is a valid Ed25519 key: no retries.
    let master = hmac_sha512(b"ed25519 seed", &[seed])?;
    let mut node = Node::from_digest(&master);
    for &index in indices {
        // Hardened only (checked by the caller): I = HMAC(c, 0x00 || k || ser32(i)).
        let i = hmac_sha512(node.chain.as_slice(), &[&[0u8], node.key.as_slice(), &index.to_be_bytes()])?;
        node = Node::from_digest(&i);
    }
    Ok(node.key)
}

/// parse256(bytes) as a P-256 scalar if it is below the group order n.
fn p256_scalar(bytes: &[u8]) -> Option<Zeroizing<p256::Scalar>> {
    let mut repr = p256::FieldBytes::clone_from_slice(bytes);
    let scalar = Option::<p256::Scalar>::from(p256::Scalar::from_repr(repr)).map(Zeroizing::new);
    repr.as_mut_slice().zeroize();
    scalar
}

fn slip10_p256(seed: &[u8], indices: &[u32]) -> Result<Zeroizing<[u8; 32]>, CryptoError> {
    const CURVE_KEY: &[u8] = b"Nist256p1 seed";
    let retries_exhausted = || CryptoError::Internal("SLIP-0010 retry bound reached".into());

    // Master: I = HMAC(curve, S); while I_L is 0 or >= n: S := I and again.
    let mut i = hmac_sha512(CURVE_KEY, &[seed])?;
    let mut tries = 0;
    let mut node = loop {
        let valid = p256_scalar(&i[..32]).is_some_and(|k| !bool::from(k.is_zero()));
        if valid {
            break Node::from_digest(&i);
        }
        tries += 1;
        if tries > MAX_RETRIES {
            return Err(retries_exhausted());
        }
        i = hmac_sha512(CURVE_KEY, &[i.as_slice()])?;
    };

    for &index in indices {
        let parent =
            p256_scalar(node.key.as_slice()).ok_or_else(|| CryptoError::Internal("invalid P-256 parent key".into()))?;
        let ser_i = index.to_be_bytes();
        let mut i = if index & HARDENED != 0 {
            hmac_sha512(node.chain.as_slice(), &[&[0u8], node.key.as_slice(), &ser_i])?
        } else {
            // ser_P(point(k_par)): the compressed public key. `SecretKey` zeroizes on drop.
            let sk = p256::SecretKey::from_slice(node.key.as_slice())
                .map_err(|_| CryptoError::Internal("invalid P-256 parent key".into()))?;
            let point = sk.public_key().to_encoded_point(true);
            hmac_sha512(node.chain.as_slice(), &[point.as_bytes(), &ser_i])?
        };
        let mut tries = 0;
        node = loop {
            // k_i = parse256(I_L) + k_par mod n, unless I_L >= n or k_i = 0: then
            // I = HMAC(c_par, 0x01 || I_R || ser32(i)) and again.
            if let Some(tweak) = p256_scalar(&i[..32]) {
                let child = Zeroizing::new(*tweak + *parent);
                if !bool::from(child.is_zero()) {
                    let mut key_bytes = child.to_repr();
                    let mut key = Zeroizing::new([0u8; 32]);
                    key.copy_from_slice(&key_bytes);
                    key_bytes.as_mut_slice().zeroize();
                    let mut chain = Zeroizing::new([0u8; 32]);
                    chain.copy_from_slice(&i[32..]);
                    break Node { key, chain };
                }
            }
            tries += 1;
            if tries > MAX_RETRIES {
                return Err(retries_exhausted());
            }
            i = hmac_sha512(node.chain.as_slice(), &[&[1u8], &i[32..], &ser_i])?;
        };
    }
    Ok(node.key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED_1: &str = "000102030405060708090a0b0c0d0e0f";
    const SEED_2: &str = "fffcf9f6f3f0edeae7e4e1dedbd8d5d2cfccc9c6c3c0bdbab7b4b1aeaba8a5a2\
                          9f9c999693908d8a8784817e7b7875726f6c696663605d5a5754514e4b484542";

    /// Checks (path, private key, public key) triples; the public key as SLIP-0010 prints it
    /// (Ed25519 keys with a leading 00 byte).
    fn check(curve: Curve, seed: &str, chains: &[(&str, &str, &str)]) {
        let seed = Seed::from_slice(&hex::decode(seed).unwrap());
        for (path, private, public) in chains {
            let key = derive(&seed, curve, path).unwrap();
            assert_eq!(key.curve(), curve);
            assert_eq!(hex::encode(key.secret_bytes()), *private, "{curve:?} {path}");
            let mut pk = key.public_key().unwrap();
            if curve == Curve::Ed25519 {
                pk.insert(0, 0);
            }
            assert_eq!(hex::encode(pk), *public, "{curve:?} {path} public");
        }
    }

    // BIP-32 test vector 1 (= SLIP-0010 test vector 1 for secp256k1).
    #[rustfmt::skip]
    #[test]
    fn bip32_vector_1() {
        check(
            Curve::Secp256k1,
            SEED_1,
            &[
                ("m", "e8f32e723decf4051aefac8e2c93c9c5b214313817cdb01a1494b917c8436b35", "0339a36013301597daef41fbe593a02cc513d0b55527ec2df1050e2e8ff49c85c2"),
                ("m/0'", "edb2e14f9ee77d26dd93b4ecede8d16ed408ce149b6cd80b0715a2d911a0afea", "035a784662a4a20a65bf6aab9ae98a6c068a81c52e4b032c0fb5400c706cfccc56"),
                ("m/0'/1", "3c6cb8d0f6a264c91ea8b5030fadaa8e538b020f0a387421a12de9319dc93368", "03501e454bf00751f24b1b489aa925215d66af2234e3891c3b21a52bedb3cd711c"),
                ("m/0h/1/2h", "cbce0d719ecf7431d88e6a89fa1483e02e35092af60c042b1df2ff59fa424dca", "0357bfe1e341d01c69fe5654309956cbea516822fba8a601743a012a7896ee8dc2"),
                ("m/0'/1/2'/2", "0f479245fb19a38a1954c5c7c0ebab2f9bdfd96a17563ef28a6a4b1a2a764ef4", "02e8445082a72f29b75ca48748a914df60622a609cacfce8ed0e35804560741d29"),
                ("m/0'/1/2'/2/1000000000", "471b76e389e528d6de6d816857e012c5455051cad6660850e58372a6c3e6e7c8", "022a471424da5e657499d1ff51cb43c47481a03b1e77f951fe64cec9f5a48f7011"),
            ],
        );
    }

    // BIP-32 test vector 2 (= SLIP-0010 test vector 2 for secp256k1).
    #[rustfmt::skip]
    #[test]
    fn bip32_vector_2() {
        check(
            Curve::Secp256k1,
            SEED_2,
            &[
                ("m/0", "abe74a98f6c7eabee0428f53798f0ab8aa1bd37873999041703c742f15ac7e1e", "02fc9e5af0ac8d9b3cecfe2a888e2117ba3d089d8585886c9c826b6b22a98d12ea"),
                ("m/0/2147483647'/1/2147483646'/2", "bb7d39bdb83ecf58f2fd82b6d918341cbef428661ef01ab97c28a4842125ac23", "024d902e1a2fc7a8755ab5b694c575fce742c48d9ff192e63df5193e4c7afe1f9c"),
            ],
        );
    }

    #[rustfmt::skip]
    #[test]
    fn slip10_nist256p1_vector_1() {
        check(
            Curve::P256,
            SEED_1,
            &[
                ("m", "612091aaa12e22dd2abef664f8a01a82cae99ad7441b7ef8110424915c268bc2", "0266874dc6ade47b3ecd096745ca09bcd29638dd52c2c12117b11ed3e458cfa9e8"),
                ("m/0'", "6939694369114c67917a182c59ddb8cafc3004e63ca5d3b84403ba8613debc0c", "0384610f5ecffe8fda089363a41f56a5c7ffc1d81b59a612d0d649b2d22355590c"),
                ("m/0'/1", "284e9d38d07d21e4e281b645089a94f4cf5a5a81369acf151a1c3a57f18b2129", "03526c63f8d0b4bbbf9c80df553fe66742df4676b241dabefdef67733e070f6844"),
                ("m/0'/1/2'", "694596e8a54f252c960eb771a3c41e7e32496d03b954aeb90f61635b8e092aa7", "0359cf160040778a4b14c5f4d7b76e327ccc8c4a6086dd9451b7482b5a4972dda0"),
                ("m/0'/1/2'/2", "5996c37fd3dd2679039b23ed6f70b506c6b56b3cb5e424681fb0fa64caf82aaa", "029f871f4cb9e1c97f9f4de9ccd0d4a2f2a171110c61178f84430062230833ff20"),
                ("m/0'/1/2'/2/1000000000", "21c4f269ef0a5fd1badf47eeacebeeaa3de22eb8e5b0adcd0f27dd99d34d0119", "02216cd26d31147f72427a453c443ed2cde8a1e53c9cc44e5ddf739725413fe3f4"),
            ],
        );
    }

    #[rustfmt::skip]
    #[test]
    fn slip10_nist256p1_vector_2() {
        check(
            Curve::P256,
            SEED_2,
            &[
                ("m", "eaa31c2e46ca2962227cf21d73a7ef0ce8b31c756897521eb6c7b39796633357", "02c9e16154474b3ed5b38218bb0463e008f89ee03e62d22fdcc8014beab25b48fa"),
                ("m/0", "d7d065f63a62624888500cdb4f88b6d59c2927fee9e6d0cdff9cad555884df6e", "039b6df4bece7b6c81e2adfeea4bcf5c8c8a6e40ea7ffa3cf6e8494c61a1fc82cc"),
                ("m/0/2147483647'", "96d2ec9316746a75e7793684ed01e3d51194d81a42a3276858a5b7376d4b94b9", "02f89c5deb1cae4fedc9905f98ae6cbf6cbab120d8cb85d5bd9a91a72f4c068c76"),
                ("m/0/2147483647'/1", "974f9096ea6873a915910e82b29d7c338542ccde39d2064d1cc228f371542bbc", "03abe0ad54c97c1d654c1852dfdc32d6d3e487e75fa16f0fd6304b9ceae4220c64"),
                ("m/0/2147483647'/1/2147483646'", "da29649bbfaff095cd43819eda9a7be74236539a29094cd8336b07ed8d4eff63", "03cb8cb067d248691808cd6b5a5a06b48e34ebac4d965cba33e6dc46fe13d9b933"),
                ("m/0/2147483647'/1/2147483646'/2", "bb0a77ba01cc31d77205d51d08bd313b979a71ef4de9b062f8958297e746bd67", "020ee02e18967237cf62672983b253ee62fa4dd431f8243bfeccdf39dbe181387f"),
            ],
        );
    }

    #[rustfmt::skip]
    #[test]
    fn slip10_nist256p1_retries() {
        // "Test derivation retry for nist256p1".
        check(
            Curve::P256,
            SEED_1,
            &[
                ("m/28578'", "06f0db126f023755d0b8d86d4591718a5210dd8d024e3e14b6159d63f53aa669", "02519b5554a4872e8c9c1c847115363051ec43e93400e030ba3c36b52a3e70a5b7"),
                ("m/28578'/33941", "092154eed4af83e078ff9b84322015aefe5769e31270f62c3f66c33888335f3a", "0235bfee614c0d5b2cae260000bb1d0d84b270099ad790022c1ae0b2e782efe120"),
            ],
        );
        // "Test seed retry for nist256p1".
        check(
            Curve::P256,
            "a7305bc8df8d0951f0cb224c0e95d7707cbdf2c6ce7e8d481fec69c7ff5e9446",
            &[("m", "3b8c18469a4634517d6d0b65448f8e6c62091b45540a1743c5846be55d47d88f", "0383619fadcde31063d8c5cb00dbfe1713f3e6fa169d8541a798752a1c1ca0cb20")],
        );
    }

    #[rustfmt::skip]
    #[test]
    fn slip10_ed25519_vector_1() {
        check(
            Curve::Ed25519,
            SEED_1,
            &[
                ("m", "2b4be7f19ee27bbf30c667b642d5f4aa69fd169872f8fc3059c08ebae2eb19e7", "00a4b2856bfec510abab89753fac1ac0e1112364e7d250545963f135f2a33188ed"),
                ("m/0'", "68e0fe46dfb67e368c75379acec591dad19df3cde26e63b93a8e704f1dade7a3", "008c8a13df77a28f3445213a0f432fde644acaa215fc72dcdf300d5efaa85d350c"),
                ("m/0'/1'", "b1d0bad404bf35da785a64ca1ac54b2617211d2777696fbffaf208f746ae84f2", "001932a5270f335bed617d5b935c80aedb1a35bd9fc1e31acafd5372c30f5c1187"),
                ("m/0'/1'/2'", "92a5b23c0b8a99e37d07df3fb9966917f5d06e02ddbd909c7e184371463e9fc9", "00ae98736566d30ed0e9d2f4486a64bc95740d89c7db33f52121f8ea8f76ff0fc1"),
                ("m/0'/1'/2'/2'", "30d1dc7e5fc04c31219ab25a27ae00b50f6fd66622f6e9c913253d6511d1e662", "008abae2d66361c879b900d204ad2cc4984fa2aa344dd7ddc46007329ac76c429c"),
                ("m/0'/1'/2'/2'/1000000000'", "8f94d394a8e8fd6b1bc2f3f49f5c47e385281d5c17e65324b0f62483e37e8793", "003c24da049451555d51a7014a37337aa4e12d41e485abccfa46b47dfb2af54b7a"),
            ],
        );
    }

    #[rustfmt::skip]
    #[test]
    fn slip10_ed25519_vector_2() {
        check(
            Curve::Ed25519,
            SEED_2,
            &[
                ("m", "171cb88b1b3c1db25add599712e36245d75bc65a1a5c9e18d76f9f2b1eab4012", "008fe9693f8fa62a4305a140b9764c5ee01e455963744fe18204b4fb948249308a"),
                ("m/0H/2147483647H/1H/2147483646H/2H", "551d333177df541ad876a60ea71f00447931c0a9da16f227c11ea080d7391b8d", "0047150c75db263559a70d5778bf36abbab30fb061ad69f69ece61a72b0cfa4fc0"),
            ],
        );
    }

    #[test]
    fn ed25519_refuses_non_hardened_segments() {
        let seed = Seed::from_slice(&hex::decode(SEED_1).unwrap());
        for path in ["m/44'/501'/0'/0", "m/0", "m/0'/1/2'"] {
            match derive(&seed, Curve::Ed25519, path) {
                Err(CryptoError::InvalidArgument(m)) => {
                    assert_eq!(m, "invalid path: ed25519 derivation supports hardened segments only")
                }
                other => panic!("{path}: {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn path_parsing() {
        assert_eq!(parse_path("m").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_path(" m/44'/60h/0H/0/7 ").unwrap(), vec![44 | HARDENED, 60 | HARDENED, HARDENED, 0, 7]);
        assert_eq!(parse_path("m/2147483647'").unwrap(), vec![u32::MAX]);
        for bad in [
            "",
            "M/0",
            "44'/0'",
            "/0",
            "m/",
            "m//0",
            "m/0/",
            "m/x",
            "m/-1",
            "m/+1",
            "m/1''",
            "m/0'h",
            "m/ 1",
            "m/2147483648",
            "m/2147483648'",
            "m/99999999999",
            "n/0",
        ] {
            match parse_path(bad) {
                Err(CryptoError::InvalidArgument(m)) => {
                    assert!(m.starts_with("invalid path: "), "{bad}: {m}")
                }
                other => panic!("{bad:?} accepted: {other:?}"),
            }
        }
        let deep = format!("m{}", "/0".repeat(256));
        assert!(parse_path(&deep).is_err());
        assert_eq!(parse_path(&format!("m{}", "/0".repeat(255))).unwrap().len(), 255);
    }

    #[test]
    fn seed_length_is_checked() {
        for curve in [Curve::Secp256k1, Curve::P256, Curve::Ed25519] {
            assert!(matches!(
                derive(&Seed::from_slice(&[1u8; 15]), curve, "m/0'"),
                Err(CryptoError::InvalidArgument(_))
            ));
            assert!(matches!(
                derive(&Seed::from_slice(&[1u8; 65]), curve, "m/0'"),
                Err(CryptoError::InvalidArgument(_))
            ));
            assert!(derive(&Seed::from_slice(&[1u8; 64]), curve, "m/0'").is_ok());
        }
    }
}
