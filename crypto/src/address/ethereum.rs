//! ADDRESS_FORMAT_ETHEREUM: `0x` + EIP-55 mixed-case hex of the last 20 bytes of
//! keccak256(x ‖ y).

use sha3::{Digest, Keccak256};

/// The 20-byte account of an uncompressed SEC1 secp256k1 key (`04 ‖ x ‖ y`).
pub(super) fn account(uncompressed: &[u8; 65]) -> [u8; 20] {
    let hash = Keccak256::digest(&uncompressed[1..]);
    let mut out = [0u8; 20];
    out.copy_from_slice(&hash[12..]);
    out
}

/// EIP-55: a hex letter is uppercase when the matching nibble of keccak256(lowercase hex) is >= 8.
fn eip55(account: &[u8; 20]) -> String {
    let lower = hex::encode(account);
    let hash = Keccak256::digest(lower.as_bytes());
    let mut out = String::with_capacity(42);
    out.push_str("0x");
    for (i, c) in lower.chars().enumerate() {
        let nibble = (hash[i / 2] >> (if i % 2 == 0 { 4 } else { 0 })) & 0x0f;
        out.push(if nibble >= 8 { c.to_ascii_uppercase() } else { c });
    }
    out
}

pub(super) fn address(uncompressed: &[u8; 65]) -> String {
    eip55(&account(uncompressed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::address as format;
    use crate::keys::{public_key, Curve};

    #[test]
    fn eip55_spec_examples() {
        // Examples from EIP-55.
        for expected in [
            "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
            "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
            "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB",
            "0xD1220A0cf47c7B9Be7A2E6BA89F429762e7b9aDb",
        ] {
            let raw: [u8; 20] = hex::decode(expected[2..].to_lowercase()).unwrap().try_into().unwrap();
            assert_eq!(eip55(&raw), expected);
        }
    }

    #[test]
    fn private_key_one() {
        // The well-known account of secret key 1.
        let mut one = [0u8; 32];
        one[31] = 1;
        let pk = public_key(Curve::Secp256k1, &one).unwrap();
        assert_eq!(
            format("ADDRESS_FORMAT_ETHEREUM", Curve::Secp256k1, &pk).unwrap(),
            "0x7E5F4552091A69125d5DfCb7b8C2659029395Bdf"
        );
    }
}
