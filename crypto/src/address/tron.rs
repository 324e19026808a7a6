//! ADDRESS_FORMAT_TRON: base58check(0x41 ‖ the 20-byte Ethereum-style account).

pub(super) fn address(uncompressed: &[u8; 65]) -> String {
    let mut payload = [0u8; 21];
    payload[0] = 0x41;
    payload[1..].copy_from_slice(&super::ethereum::account(uncompressed));
    bs58::encode(payload).with_check().into_string()
}

#[cfg(test)]
mod tests {
    use crate::address::tests::{abandon, pubkey_of, ABANDON};
    use crate::keys::Curve;

    #[test]
    fn tron_matches_ethereum_account() {
        // Spec vector, plus: the base58check payload is 0x41 ‖ the Ethereum account of the key.
        let path = "m/44'/195'/0'/0/0";
        let tron = abandon("ADDRESS_FORMAT_TRON", Curve::Secp256k1, path);
        assert_eq!(tron, "TUEZSdKsoDHQMeZwihtdoBiN46zxhGWYdH");
        let eth = crate::address::address(
            "ADDRESS_FORMAT_ETHEREUM",
            Curve::Secp256k1,
            &pubkey_of(ABANDON, Curve::Secp256k1, path),
        )
        .unwrap();
        let decoded = bs58::decode(&tron).with_check(Some(0x41)).into_vec().unwrap();
        assert_eq!(hex::encode(&decoded[1..]), eth[2..].to_lowercase());
    }
}
