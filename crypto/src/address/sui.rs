//! ADDRESS_FORMAT_SUI: `0x` + hex BLAKE2b-256(flag 0x00 ‖ Ed25519 key).

use blake2::digest::consts::U32;
use blake2::{Blake2b, Digest};

pub(super) fn address(key: &[u8; 32]) -> String {
    let mut h = Blake2b::<U32>::new();
    h.update([0x00]);
    h.update(key);
    format!("0x{}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use crate::address::tests::abandon;
    use crate::keys::Curve;

    #[test]
    fn sui_spec_vector() {
        assert_eq!(
            abandon("ADDRESS_FORMAT_SUI", Curve::Ed25519, "m/44'/784'/0'/0'/0'"),
            "0x5e93a736d04fbb25737aa40bee40171ef79f65fae833749e3c089fe7cc2161f1"
        );
    }
}
