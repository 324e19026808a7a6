//! ADDRESS_FORMAT_APTOS: `0x` + hex SHA3-256(Ed25519 key ‖ scheme 0x00), the account's
//! authentication key.

use sha3::{Digest, Sha3_256};

pub(super) fn address(key: &[u8; 32]) -> String {
    let mut h = Sha3_256::new();
    h.update(key);
    h.update([0x00]);
    format!("0x{}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use crate::address::tests::abandon;
    use crate::keys::Curve;

    #[test]
    fn aptos_spec_vector() {
        assert_eq!(
            abandon("ADDRESS_FORMAT_APTOS", Curve::Ed25519, "m/44'/637'/0'/0'/0'"),
            "0xeb663b681209e7087d681c5d3eed12aaa8e1915e7c87794542c3f96e94b3d3bf"
        );
    }
}
