//! ADDRESS_FORMAT_XRP: the classic address, base58 (XRP alphabet) of
//! 0x00 ‖ RIPEMD160(SHA256(compressed key)) ‖ first 4 bytes of double SHA-256.

pub(super) fn address(compressed: &[u8; 33]) -> String {
    let mut payload = [0u8; 21];
    payload[1..].copy_from_slice(&super::encoding::hash160(compressed));
    // bs58's check mode appends the double-SHA-256 checksum, as XRP does.
    bs58::encode(payload).with_alphabet(bs58::Alphabet::RIPPLE).with_check().into_string()
}

#[cfg(test)]
mod tests {
    use crate::address::address;
    use crate::address::tests::abandon;
    use crate::keys::Curve;

    #[test]
    fn genesis_account() {
        // The XRP Ledger genesis account (secret "masterpassphrase").
        let pk = hex::decode("0330E7FC9D56BB25D6893BA3F317AE5BCF33B3291BD63DB32654A313222F7FD020").unwrap();
        assert_eq!(address("ADDRESS_FORMAT_XRP", Curve::Secp256k1, &pk).unwrap(), "rHb9CJAWyB4rj91VRWn96DkukG4bwdtyTh");
    }

    #[test]
    fn abandon_mnemonic() {
        // xrpl.js Wallet.fromMnemonic("abandon ... about"), m/44'/144'/0'/0/0.
        assert_eq!(
            abandon("ADDRESS_FORMAT_XRP", Curve::Secp256k1, "m/44'/144'/0'/0/0"),
            "rHsMGQEkVNJmpGWs8XUBoTBiAAbwxZN5v3"
        );
    }
}
