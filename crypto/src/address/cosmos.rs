//! ADDRESS_FORMAT_COSMOS / ADDRESS_FORMAT_SEI: bech32 (BIP-173 checksum) of
//! RIPEMD160(SHA256(compressed secp256k1 key)), HRP `cosmos` / `sei`.

use bech32::{Bech32, Hrp};

use crate::error::CryptoError;

pub(super) fn address(hrp: &str, compressed: &[u8; 33]) -> Result<String, CryptoError> {
    let hrp = Hrp::parse(hrp).map_err(|e| CryptoError::Internal(format!("bech32 HRP: {e}")))?;
    bech32::encode::<Bech32>(hrp, &super::encoding::hash160(compressed))
        .map_err(|e| CryptoError::Internal(format!("bech32 encoding: {e}")))
}

#[cfg(test)]
mod tests {
    use crate::address::tests::abandon;
    use crate::keys::Curve;

    #[test]
    fn cosmos_spec_vector_and_sei_shares_its_hash() {
        let path = "m/44'/118'/0'/0/0";
        let cosmos = abandon("ADDRESS_FORMAT_COSMOS", Curve::Secp256k1, path);
        assert_eq!(cosmos, "cosmos19rl4cm2hmr8afy4kldpxz3fka4jguq0auqdal4");
        // SEI: the same 20-byte hash under HRP "sei" (checked by decoding both).
        let sei = abandon("ADDRESS_FORMAT_SEI", Curve::Secp256k1, path);
        let (hrp_c, data_c) = bech32::decode(&cosmos).unwrap();
        let (hrp_s, data_s) = bech32::decode(&sei).unwrap();
        assert_eq!(hrp_c.as_str(), "cosmos");
        assert_eq!(hrp_s.as_str(), "sei");
        assert_eq!(data_s, data_c);
        assert!(sei.starts_with("sei1"));
        // SDK default SEI path.
        let sei_sdk = abandon("ADDRESS_FORMAT_SEI", Curve::Secp256k1, "m/44'/118'/0'/0'/0'");
        assert!(bech32::decode(&sei_sdk).is_ok());
    }
}
