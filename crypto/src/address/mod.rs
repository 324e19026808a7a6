//! Address formats: one file per chain family, dispatched by the wire enum string
//! (`ADDRESS_FORMAT_*`). Input is the public key as [`crate::keys::public_key`] returns it.
//!
//! Formats that need more than a hash of the key (TON wallet contracts, Spark) are refused as
//! unsupported rather than answered with a wrong address.

mod aptos;
mod bitcoin;
mod cosmos;
mod encoding;
mod ethereum;
mod raw;
mod solana;
mod stellar;
mod sui;
mod tron;
mod xrp;

use crate::error::CryptoError;
use crate::keys::Curve;
use encoding::Key;

/// The address of `public_key` (on `curve`) in the wire format `format`.
pub fn address(format: &str, curve: Curve, public_key: &[u8]) -> Result<String, CryptoError> {
    use Curve::{Ed25519, Secp256k1, P256};

    let family = match format {
        "ADDRESS_FORMAT_UNCOMPRESSED" => Family::Uncompressed,
        "ADDRESS_FORMAT_COMPRESSED" => Family::Compressed,
        "ADDRESS_FORMAT_ETHEREUM" => Family::Ethereum,
        "ADDRESS_FORMAT_SOLANA" => Family::Solana,
        "ADDRESS_FORMAT_COSMOS" => Family::Cosmos("cosmos"),
        "ADDRESS_FORMAT_SEI" => Family::Cosmos("sei"),
        "ADDRESS_FORMAT_TRON" => Family::Tron,
        "ADDRESS_FORMAT_SUI" => Family::Sui,
        "ADDRESS_FORMAT_APTOS" => Family::Aptos,
        "ADDRESS_FORMAT_XLM" => Family::Stellar,
        "ADDRESS_FORMAT_XRP" => Family::Xrp,
        "ADDRESS_FORMAT_DOGE_MAINNET" => Family::Doge { testnet: false },
        "ADDRESS_FORMAT_DOGE_TESTNET" => Family::Doge { testnet: true },
        "ADDRESS_FORMAT_TON_V3R2"
        | "ADDRESS_FORMAT_TON_V4R2"
        | "ADDRESS_FORMAT_TON_V5R1"
        | "ADDRESS_FORMAT_SPARK_MAINNET"
        | "ADDRESS_FORMAT_SPARK_REGTEST" => {
            return Err(CryptoError::invalid(format!("unsupported address format: {format}")))
        }
        other => match bitcoin::parse_format(other) {
            Some((network, kind)) => Family::Bitcoin(network, kind),
            None => return Err(CryptoError::invalid(format!("invalid address format: {format}"))),
        },
    };

    let curves: &[Curve] = match family {
        Family::Compressed => &[Secp256k1, P256, Ed25519],
        Family::Uncompressed => &[Secp256k1, P256],
        Family::Ethereum
        | Family::Cosmos(_)
        | Family::Tron
        | Family::Xrp
        | Family::Doge { .. }
        | Family::Bitcoin(..) => &[Secp256k1],
        Family::Solana | Family::Sui | Family::Aptos | Family::Stellar => &[Ed25519],
    };
    if !curves.contains(&curve) {
        return Err(CryptoError::invalid(format!(
            "address format {format} is not valid for curve {}",
            curve.wire_name()
        )));
    }

    let key = Key::parse(curve, public_key)?;
    Ok(match family {
        Family::Uncompressed => raw::uncompressed(&key),
        Family::Compressed => raw::compressed(&key),
        Family::Ethereum => ethereum::address(&key.uncompressed),
        Family::Tron => tron::address(&key.uncompressed),
        Family::Cosmos(hrp) => cosmos::address(hrp, &key.compressed)?,
        Family::Xrp => xrp::address(&key.compressed),
        Family::Doge { testnet } => bitcoin::doge(testnet, &key.compressed),
        Family::Bitcoin(network, kind) => bitcoin::address(network, kind, &key.compressed)?,
        Family::Solana => solana::address(&key.ed25519),
        Family::Sui => sui::address(&key.ed25519),
        Family::Aptos => aptos::address(&key.ed25519),
        Family::Stellar => stellar::address(&key.ed25519),
    })
}

#[derive(Clone, Copy)]
enum Family {
    Uncompressed,
    Compressed,
    Ethereum,
    Solana,
    Cosmos(&'static str),
    Tron,
    Sui,
    Aptos,
    Stellar,
    Xrp,
    Doge { testnet: bool },
    Bitcoin(bitcoin::Network, bitcoin::Kind),
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::keys;
    use k256::elliptic_curve::sec1::ToEncodedPoint;

    pub(crate) const ABANDON: &str =
        "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about";

    /// mnemonic -> seed -> derive -> public_key.
    pub(crate) fn pubkey_of(phrase: &str, curve: Curve, path: &str) -> Vec<u8> {
        let seed = keys::seed_from_phrase(phrase).unwrap();
        let secret = keys::derive(&seed, curve, path).unwrap();
        secret.public_key().unwrap()
    }

    /// The address of the "abandon ... about" key at `path` in `format`.
    pub(crate) fn abandon(format: &str, curve: Curve, path: &str) -> String {
        address(format, curve, &pubkey_of(ABANDON, curve, path)).unwrap()
    }

    fn refusal(format: &str, curve: Curve, pk: &[u8]) -> String {
        match address(format, curve, pk) {
            Err(CryptoError::InvalidArgument(m)) => m,
            other => panic!("{format} on {curve:?}: expected a refusal, got {other:?}"),
        }
    }

    /// The spec's vectors (section 11) for "abandon ... about", end to end.
    #[test]
    fn spec_vectors() {
        use Curve::{Ed25519, Secp256k1};
        assert_eq!(
            hex::encode(pubkey_of(ABANDON, Secp256k1, "m/44'/60'/0'/0/0")),
            "0237b0bb7a8288d38ed49a524b5dc98cff3eb5ca824c9f9dc0dfdb3d9cd600f299"
        );
        for (format, curve, path, expected) in [
            ("ADDRESS_FORMAT_ETHEREUM", Secp256k1, "m/44'/60'/0'/0/0", "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"),
            (
                "ADDRESS_FORMAT_COMPRESSED",
                Secp256k1,
                "m/44'/60'/0'/0/0",
                "0237b0bb7a8288d38ed49a524b5dc98cff3eb5ca824c9f9dc0dfdb3d9cd600f299",
            ),
            ("ADDRESS_FORMAT_COSMOS", Secp256k1, "m/44'/118'/0'/0/0", "cosmos19rl4cm2hmr8afy4kldpxz3fka4jguq0auqdal4"),
            ("ADDRESS_FORMAT_TRON", Secp256k1, "m/44'/195'/0'/0/0", "TUEZSdKsoDHQMeZwihtdoBiN46zxhGWYdH"),
            (
                "ADDRESS_FORMAT_BITCOIN_MAINNET_P2PKH",
                Secp256k1,
                "m/44'/0'/0'/0/0",
                "1LqBGSKuX5yYUonjxT5qGfpUsXKYYWeabA",
            ),
            (
                "ADDRESS_FORMAT_BITCOIN_MAINNET_P2WPKH",
                Secp256k1,
                "m/84'/0'/0'/0/0",
                "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu",
            ),
            (
                "ADDRESS_FORMAT_BITCOIN_MAINNET_P2TR",
                Secp256k1,
                "m/86'/0'/0'/0/0",
                "bc1p5cyxnuxmeuwuvkwfem96lqzszd02n6xdcjrs20cac6yqjjwudpxqkedrcr",
            ),
            ("ADDRESS_FORMAT_DOGE_MAINNET", Secp256k1, "m/44'/3'/0'/0/0", "DBus3bamQjgJULBJtYXpEzDWQRwF5iwxgC"),
            ("ADDRESS_FORMAT_SOLANA", Ed25519, "m/44'/501'/0'/0'", "HAgk14JpMQLgt6rVgv7cBQFJWFto5Dqxi472uT3DKpqk"),
            (
                "ADDRESS_FORMAT_SUI",
                Ed25519,
                "m/44'/784'/0'/0'/0'",
                "0x5e93a736d04fbb25737aa40bee40171ef79f65fae833749e3c089fe7cc2161f1",
            ),
            (
                "ADDRESS_FORMAT_APTOS",
                Ed25519,
                "m/44'/637'/0'/0'/0'",
                "0xeb663b681209e7087d681c5d3eed12aaa8e1915e7c87794542c3f96e94b3d3bf",
            ),
        ] {
            assert_eq!(abandon(format, curve, path), expected, "{format} {path}");
        }
    }

    #[test]
    fn unsupported_and_unknown_formats() {
        let secp = pubkey_of(ABANDON, Curve::Secp256k1, "m/44'/0'/0'/0/0");
        let ed = pubkey_of(ABANDON, Curve::Ed25519, "m/44'/607'/0'/0'/0'");
        for f in [
            "ADDRESS_FORMAT_TON_V3R2",
            "ADDRESS_FORMAT_TON_V4R2",
            "ADDRESS_FORMAT_TON_V5R1",
            "ADDRESS_FORMAT_SPARK_MAINNET",
            "ADDRESS_FORMAT_SPARK_REGTEST",
        ] {
            let expected = format!("unsupported address format: {f}");
            assert_eq!(refusal(f, Curve::Ed25519, &ed), expected);
            assert_eq!(refusal(f, Curve::Secp256k1, &secp), expected);
        }
        for f in [
            "",
            "ETHEREUM",
            "ADDRESS_FORMAT_ethereum",
            "ADDRESS_FORMAT_UNKNOWN",
            "ADDRESS_FORMAT_BITCOIN_MAINNET",
            "ADDRESS_FORMAT_BITCOIN_MAINNET_P2PK",
            "ADDRESS_FORMAT_BITCOIN_LIQUID_P2WPKH",
            "ADDRESS_FORMAT_BITCOIN_MAINNET_P2WPKH_",
            "ADDRESS_FORMAT_DOGE_REGTEST",
        ] {
            assert_eq!(refusal(f, Curve::Secp256k1, &secp), format!("invalid address format: {f}"));
        }
    }

    #[test]
    fn wrong_curve_is_refused() {
        let secp = pubkey_of(ABANDON, Curve::Secp256k1, "m/44'/0'/0'/0/0");
        let p256 = pubkey_of(ABANDON, Curve::P256, "m/44'/0'/0'/0/0");
        let ed = pubkey_of(ABANDON, Curve::Ed25519, "m/44'/501'/0'/0'");
        let secp_only = [
            "ADDRESS_FORMAT_ETHEREUM",
            "ADDRESS_FORMAT_COSMOS",
            "ADDRESS_FORMAT_SEI",
            "ADDRESS_FORMAT_TRON",
            "ADDRESS_FORMAT_XRP",
            "ADDRESS_FORMAT_DOGE_MAINNET",
            "ADDRESS_FORMAT_DOGE_TESTNET",
            "ADDRESS_FORMAT_BITCOIN_MAINNET_P2PKH",
            "ADDRESS_FORMAT_BITCOIN_SIGNET_P2TR",
            "ADDRESS_FORMAT_BITCOIN_REGTEST_P2WSH",
        ];
        for f in secp_only {
            for (curve, pk) in [(Curve::P256, &p256), (Curve::Ed25519, &ed)] {
                assert_eq!(
                    refusal(f, curve, pk),
                    format!("address format {f} is not valid for curve {}", curve.wire_name())
                );
            }
            assert!(address(f, Curve::Secp256k1, &secp).is_ok(), "{f}");
        }
        for f in ["ADDRESS_FORMAT_SOLANA", "ADDRESS_FORMAT_SUI", "ADDRESS_FORMAT_APTOS", "ADDRESS_FORMAT_XLM"] {
            for (curve, pk) in [(Curve::Secp256k1, &secp), (Curve::P256, &p256)] {
                assert_eq!(
                    refusal(f, curve, pk),
                    format!("address format {f} is not valid for curve {}", curve.wire_name())
                );
            }
            assert!(address(f, Curve::Ed25519, &ed).is_ok(), "{f}");
        }
        assert_eq!(
            refusal("ADDRESS_FORMAT_UNCOMPRESSED", Curve::Ed25519, &ed),
            "address format ADDRESS_FORMAT_UNCOMPRESSED is not valid for curve CURVE_ED25519"
        );
    }

    #[test]
    fn malformed_public_keys_are_refused() {
        let secp = pubkey_of(ABANDON, Curve::Secp256k1, "m/44'/60'/0'/0/0");
        let mut off_curve = secp.clone();
        off_curve[0] = 0x05;
        for pk in [&secp[..32], &off_curve[..], &[][..], &[0u8; 33][..]] {
            assert!(
                matches!(
                    address("ADDRESS_FORMAT_ETHEREUM", Curve::Secp256k1, pk),
                    Err(CryptoError::InvalidArgument(_))
                ),
                "{}",
                hex::encode(pk)
            );
        }
        // A secp256k1 key is not a P-256 key in general, and never 32 bytes for Ed25519.
        assert!(address("ADDRESS_FORMAT_SOLANA", Curve::Ed25519, &secp).is_err());
        assert!(address("ADDRESS_FORMAT_SOLANA", Curve::Ed25519, &[0u8; 31]).is_err());
        // The uncompressed SEC1 form of the same key is accepted too.
        let mut uncompressed = Vec::new();
        uncompressed
            .extend_from_slice(k256::PublicKey::from_sec1_bytes(&secp).unwrap().to_encoded_point(false).as_bytes());
        assert_eq!(
            address("ADDRESS_FORMAT_ETHEREUM", Curve::Secp256k1, &uncompressed).unwrap(),
            "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"
        );
    }
}
