//! ADDRESS_FORMAT_SOLANA: base58 of the 32-byte Ed25519 key.

pub(super) fn address(key: &[u8; 32]) -> String {
    bs58::encode(key).into_string()
}

#[cfg(test)]
mod tests {
    use crate::address::tests::abandon;
    use crate::keys::Curve;

    #[test]
    fn solana_accounts() {
        // m/44'/501'/0'/0' is the spec vector (and the widely published Phantom/Solflare
        // first account); decoding gives back the key.
        let a = abandon("ADDRESS_FORMAT_SOLANA", Curve::Ed25519, "m/44'/501'/0'/0'");
        assert_eq!(a, "HAgk14JpMQLgt6rVgv7cBQFJWFto5Dqxi472uT3DKpqk");
        assert_eq!(bs58::decode(&a).into_vec().unwrap().len(), 32);
    }
}
