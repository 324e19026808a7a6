//! Address formats: one file per chain family, dispatched by the wire enum string.
// OWNER: helper A. Interface:
// pub fn address(format: &str, curve: Curve, public_key: &[u8]) -> Result<String, CryptoError>
//   /* format = "ADDRESS_FORMAT_ETHEREUM" ...; public_key as keys::public_key returns it */
