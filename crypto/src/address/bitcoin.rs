//! Bitcoin (`ADDRESS_FORMAT_BITCOIN_{MAINNET,TESTNET,SIGNET,REGTEST}_{P2PKH,P2SH,P2WPKH,P2WSH,P2TR}`)
//! and Dogecoin (`ADDRESS_FORMAT_DOGE_{MAINNET,TESTNET}`) addresses of one compressed key.
//!
//! - P2PKH: base58check(version ‖ HASH160(pk)).
//! - P2SH: P2SH-P2WPKH (BIP-49): base58check(version ‖ HASH160(0x00 0x14 ‖ HASH160(pk))).
//! - P2WPKH: segwit v0 (bech32) of HASH160(pk).
//! - P2WSH: segwit v0 (bech32) of SHA256 of the single-key script `<pk> OP_CHECKSIG`.
//! - P2TR: segwit v1 (bech32m) of the BIP-341 key-path output key with no script tree (BIP-86).

use bech32::{hrp, segwit, Fe32, Hrp};
use k256::elliptic_curve::sec1::ToEncodedPoint;
use k256::elliptic_curve::PrimeField;
use sha2::{Digest, Sha256};

use super::encoding::hash160;
use crate::error::CryptoError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Network {
    Mainnet,
    Testnet,
    Signet,
    Regtest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    P2pkh,
    P2sh,
    P2wpkh,
    P2wsh,
    P2tr,
}

/// `ADDRESS_FORMAT_BITCOIN_<NETWORK>_<KIND>`, or `None`.
pub(super) fn parse_format(format: &str) -> Option<(Network, Kind)> {
    let rest = format.strip_prefix("ADDRESS_FORMAT_BITCOIN_")?;
    let (network, kind) = rest.split_once('_')?;
    let network = match network {
        "MAINNET" => Network::Mainnet,
        "TESTNET" => Network::Testnet,
        "SIGNET" => Network::Signet,
        "REGTEST" => Network::Regtest,
        _ => return None,
    };
    let kind = match kind {
        "P2PKH" => Kind::P2pkh,
        "P2SH" => Kind::P2sh,
        "P2WPKH" => Kind::P2wpkh,
        "P2WSH" => Kind::P2wsh,
        "P2TR" => Kind::P2tr,
        _ => return None,
    };
    Some((network, kind))
}

impl Network {
    fn p2pkh_version(self) -> u8 {
        match self {
            Network::Mainnet => 0x00,
            Network::Testnet | Network::Signet | Network::Regtest => 0x6f,
        }
    }

    fn p2sh_version(self) -> u8 {
        match self {
            Network::Mainnet => 0x05,
            Network::Testnet | Network::Signet | Network::Regtest => 0xc4,
        }
    }

    fn hrp(self) -> Hrp {
        match self {
            Network::Mainnet => hrp::BC,
            Network::Testnet | Network::Signet => hrp::TB,
            Network::Regtest => hrp::BCRT,
        }
    }
}

fn base58check(version: u8, hash: &[u8; 20]) -> String {
    let mut payload = [0u8; 21];
    payload[0] = version;
    payload[1..].copy_from_slice(hash);
    bs58::encode(payload).with_check().into_string()
}

fn segwit_address(network: Network, version: Fe32, program: &[u8]) -> Result<String, CryptoError> {
    segwit::encode(network.hrp(), version, program).map_err(|e| CryptoError::Internal(format!("segwit encoding: {e}")))
}

/// SHA256(SHA256(tag) ‖ SHA256(tag) ‖ msg) (BIP-340).
fn tagged_hash(tag: &str, msg: &[u8]) -> [u8; 32] {
    let tag_hash = Sha256::digest(tag.as_bytes());
    Sha256::new().chain_update(tag_hash).chain_update(tag_hash).chain_update(msg).finalize().into()
}

/// BIP-341 output key for a key-path-only spend: Q = P + int(hash_TapTweak(x(P)))·G where P is
/// the even-Y point with the x coordinate of the key. Returns x(Q).
fn taproot_output_key(compressed: &[u8; 33]) -> Result<[u8; 32], CryptoError> {
    let internal_error = |what: &str| CryptoError::Internal(format!("taproot tweak: {what}"));
    let mut even = *compressed;
    even[0] = 0x02;
    let p = k256::PublicKey::from_sec1_bytes(&even).map_err(|_| internal_error("bad internal key"))?.to_projective();
    let tweak = tagged_hash("TapTweak", &compressed[1..]);
    let t = Option::<k256::Scalar>::from(k256::Scalar::from_repr(tweak.into()))
        .ok_or_else(|| internal_error("tweak out of range"))?;
    let q = (p + k256::ProjectivePoint::GENERATOR * t).to_affine();
    let encoded = q.to_encoded_point(true);
    let bytes = encoded.as_bytes();
    if bytes.len() != 33 {
        return Err(internal_error("output key at infinity"));
    }
    let mut x = [0u8; 32];
    x.copy_from_slice(&bytes[1..]);
    Ok(x)
}

/// The `<33-byte pk> OP_CHECKSIG` witness script.
fn single_key_script(compressed: &[u8; 33]) -> [u8; 35] {
    let mut script = [0u8; 35];
    script[0] = 0x21; // push 33 bytes
    script[1..34].copy_from_slice(compressed);
    script[34] = 0xac; // OP_CHECKSIG
    script
}

pub(super) fn address(network: Network, kind: Kind, compressed: &[u8; 33]) -> Result<String, CryptoError> {
    Ok(match kind {
        Kind::P2pkh => base58check(network.p2pkh_version(), &hash160(compressed)),
        Kind::P2sh => {
            // Redeem script of P2SH-P2WPKH: OP_0 <20-byte key hash>.
            let mut redeem = [0u8; 22];
            redeem[0] = 0x00;
            redeem[1] = 0x14;
            redeem[2..].copy_from_slice(&hash160(compressed));
            base58check(network.p2sh_version(), &hash160(&redeem))
        }
        Kind::P2wpkh => segwit_address(network, segwit::VERSION_0, &hash160(compressed))?,
        Kind::P2wsh => {
            let program = Sha256::digest(single_key_script(compressed));
            segwit_address(network, segwit::VERSION_0, &program)?
        }
        Kind::P2tr => segwit_address(network, segwit::VERSION_1, &taproot_output_key(compressed)?)?,
    })
}

/// Dogecoin P2PKH: version 0x1e (mainnet, "D...") or 0x71 (testnet, "n...").
pub(super) fn doge(testnet: bool, compressed: &[u8; 33]) -> String {
    base58check(if testnet { 0x71 } else { 0x1e }, &hash160(compressed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::address as format;
    use crate::address::tests::{abandon, pubkey_of, ABANDON};
    use crate::keys::Curve;

    const NETWORKS: [(&str, Network); 4] = [
        ("MAINNET", Network::Mainnet),
        ("TESTNET", Network::Testnet),
        ("SIGNET", Network::Signet),
        ("REGTEST", Network::Regtest),
    ];
    const KINDS: [(&str, Kind); 5] = [
        ("P2PKH", Kind::P2pkh),
        ("P2SH", Kind::P2sh),
        ("P2WPKH", Kind::P2wpkh),
        ("P2WSH", Kind::P2wsh),
        ("P2TR", Kind::P2tr),
    ];

    fn btc(network: &str, kind: &str, pk: &[u8]) -> String {
        format(&format!("ADDRESS_FORMAT_BITCOIN_{network}_{kind}"), Curve::Secp256k1, pk).unwrap()
    }

    fn key(path: &str) -> Vec<u8> {
        pubkey_of(ABANDON, Curve::Secp256k1, path)
    }

    /// The public key G (secret 1), used by the BIP-173 examples.
    fn generator() -> Vec<u8> {
        hex::decode("0279BE667EF9DCBBAC55A06295CE870B07029BFCDB2DCE28D959F2815B16F81798").unwrap()
    }

    #[test]
    fn all_twenty_formats_parse() {
        for (n, network) in NETWORKS {
            for (k, kind) in KINDS {
                assert_eq!(parse_format(&format!("ADDRESS_FORMAT_BITCOIN_{n}_{k}")), Some((network, kind)));
            }
        }
        assert_eq!(parse_format("ADDRESS_FORMAT_BITCOIN_MAINNET"), None);
        assert_eq!(parse_format("ADDRESS_FORMAT_BITCOIN_MAINNET_P2TR_"), None);
        assert_eq!(parse_format("ADDRESS_FORMAT_BITCOIN_TESTNET3_P2TR"), None);
    }

    /// Published vectors for the "abandon ... about" mnemonic: BIP-44 (P2PKH), BIP-49
    /// (P2SH-P2WPKH, stated on testnet), BIP-84 (P2WPKH), BIP-86 (P2TR), and the testnet /
    /// regtest encodings wallets publish for the same keys.
    #[test]
    fn published_mnemonic_vectors() {
        for (network, kind, path, expected) in [
            ("MAINNET", "P2PKH", "m/44'/0'/0'/0/0", "1LqBGSKuX5yYUonjxT5qGfpUsXKYYWeabA"),
            ("TESTNET", "P2PKH", "m/44'/1'/0'/0/0", "mkpZhYtJu2r87Js3pDiWJDmPte2NRZ8bJV"),
            ("MAINNET", "P2SH", "m/49'/0'/0'/0/0", "37VucYSaXLCAsxYyAPfbSi9eh4iEcbShgf"),
            ("TESTNET", "P2SH", "m/49'/1'/0'/0/0", "2Mww8dCYPUpKHofjgcXcBCEGmniw9CoaiD2"),
            ("MAINNET", "P2WPKH", "m/84'/0'/0'/0/0", "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"),
            ("MAINNET", "P2WPKH", "m/84'/0'/0'/0/1", "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"),
            ("MAINNET", "P2WPKH", "m/84'/0'/0'/1/0", "bc1q8c6fshw2dlwun7ekn9qwf37cu2rn755upcp6el"),
            ("TESTNET", "P2WPKH", "m/84'/1'/0'/0/0", "tb1q6rz28mcfaxtmd6v789l9rrlrusdprr9pqcpvkl"),
            ("REGTEST", "P2WPKH", "m/84'/1'/0'/0/0", "bcrt1q6rz28mcfaxtmd6v789l9rrlrusdprr9pz3cppk"),
            ("REGTEST", "P2PKH", "m/44'/1'/0'/0/0", "mkpZhYtJu2r87Js3pDiWJDmPte2NRZ8bJV"),
            ("REGTEST", "P2SH", "m/49'/1'/0'/0/0", "2Mww8dCYPUpKHofjgcXcBCEGmniw9CoaiD2"),
            ("MAINNET", "P2TR", "m/86'/0'/0'/0/0", "bc1p5cyxnuxmeuwuvkwfem96lqzszd02n6xdcjrs20cac6yqjjwudpxqkedrcr"),
            ("MAINNET", "P2TR", "m/86'/0'/0'/0/1", "bc1p4qhjn9zdvkux4e44uhx8tc55attvtyu358kutcqkudyccelu0was9fqzwh"),
            ("MAINNET", "P2TR", "m/86'/0'/0'/1/0", "bc1p3qkhfews2uk44qtvauqyr2ttdsw7svhkl9nkm9s9c3x4ax5h60wqwruhk7"),
        ] {
            assert_eq!(btc(network, kind, &key(path)), expected, "{network} {kind} {path}");
        }
    }

    /// BIP-173 examples: key G, P2WPKH and P2WSH of `<G> OP_CHECKSIG`.
    #[test]
    fn bip173_examples() {
        let g = generator();
        assert_eq!(btc("MAINNET", "P2WPKH", &g), "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4");
        assert_eq!(btc("TESTNET", "P2WPKH", &g), "tb1qw508d6qejxtdg4y5r3zarvary0c5xw7kxpjzsx");
        assert_eq!(btc("MAINNET", "P2WSH", &g), "bc1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3qccfmv3");
        assert_eq!(btc("TESTNET", "P2WSH", &g), "tb1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3q0sl5k7");
    }

    fn base58_payload(address: &str) -> (u8, Vec<u8>) {
        let data = bs58::decode(address).with_check(None).into_vec().unwrap();
        (data[0], data[1..].to_vec())
    }

    /// Every network variant carries the same hash / program as the published mainnet vector
    /// for the same key, under that network's version byte or HRP (decoded with the crates).
    #[test]
    fn every_network_matches_the_published_mainnet_payload() {
        let anchors: [(&str, Vec<u8>, &str); 5] = [
            ("P2PKH", key("m/44'/0'/0'/0/0"), "1LqBGSKuX5yYUonjxT5qGfpUsXKYYWeabA"),
            ("P2SH", key("m/49'/0'/0'/0/0"), "37VucYSaXLCAsxYyAPfbSi9eh4iEcbShgf"),
            ("P2WPKH", key("m/84'/0'/0'/0/0"), "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"),
            ("P2WSH", generator(), "bc1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3qccfmv3"),
            ("P2TR", key("m/86'/0'/0'/0/0"), "bc1p5cyxnuxmeuwuvkwfem96lqzszd02n6xdcjrs20cac6yqjjwudpxqkedrcr"),
        ];
        for (kind, pk, mainnet) in &anchors {
            for (network, hrp, p2pkh_version, p2sh_version) in [
                ("MAINNET", "bc", 0x00, 0x05),
                ("TESTNET", "tb", 0x6f, 0xc4),
                ("SIGNET", "tb", 0x6f, 0xc4),
                ("REGTEST", "bcrt", 0x6f, 0xc4),
            ] {
                let address = btc(network, kind, pk);
                match *kind {
                    "P2PKH" | "P2SH" => {
                        let version = if *kind == "P2PKH" { p2pkh_version } else { p2sh_version };
                        assert_eq!(base58_payload(&address), (version, base58_payload(mainnet).1), "{network} {kind}");
                    }
                    _ => {
                        let (h, v, program) = segwit::decode(&address).unwrap();
                        let (_, v_main, program_main) = segwit::decode(mainnet).unwrap();
                        assert_eq!(h.as_str(), hrp, "{network} {kind}");
                        assert_eq!((v, program), (v_main, program_main), "{network} {kind}");
                    }
                }
            }
            // Signet uses testnet's encodings verbatim.
            assert_eq!(btc("SIGNET", kind, pk), btc("TESTNET", kind, pk));
        }
        // Regtest spot check: bech32 HRP "bcrt".
        assert!(btc("REGTEST", "P2WPKH", &key("m/84'/1'/0'/0/0")).starts_with("bcrt1q"));
        assert!(btc("REGTEST", "P2TR", &key("m/86'/1'/0'/0/0")).starts_with("bcrt1p"));
    }

    /// Independent recomputation of the P2WSH program and the P2SH redeem-script hash.
    #[test]
    fn script_hashes_recomputed() {
        let pk = key("m/48'/0'/0'/2'/0/0");
        let (_, _, program) = segwit::decode(&btc("MAINNET", "P2WSH", &pk)).unwrap();
        let mut script = vec![0x21];
        script.extend_from_slice(&pk);
        script.push(0xac);
        assert_eq!(program, Sha256::digest(&script).to_vec());

        let mut redeem = vec![0x00, 0x14];
        redeem.extend_from_slice(&hash160(&pk));
        assert_eq!(base58_payload(&btc("REGTEST", "P2SH", &pk)), (0xc4, hash160(&redeem).to_vec()));
    }

    #[test]
    fn dogecoin() {
        let path = "m/44'/3'/0'/0/0";
        let mainnet = abandon("ADDRESS_FORMAT_DOGE_MAINNET", Curve::Secp256k1, path);
        assert_eq!(mainnet, "DBus3bamQjgJULBJtYXpEzDWQRwF5iwxgC");
        // Testnet: the same HASH160 under version 0x71.
        let testnet = abandon("ADDRESS_FORMAT_DOGE_TESTNET", Curve::Secp256k1, path);
        assert!(testnet.starts_with('n'));
        let (v_main, h_main) = base58_payload(&mainnet);
        assert_eq!(v_main, 0x1e);
        assert_eq!(base58_payload(&testnet), (0x71, h_main));
    }
}
