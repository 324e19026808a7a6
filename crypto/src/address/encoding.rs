//! What the address formats share: the checked public key in its encodings, and HASH160.

use k256::elliptic_curve::sec1::ToEncodedPoint;
use ripemd::Ripemd160;
use sha2::{Digest, Sha256};

use crate::error::CryptoError;
use crate::keys::Curve;

/// A checked public key in the encodings the formats need. For Ed25519 only `ed25519` is set;
/// for the ECDSA curves only the SEC1 encodings are.
pub(super) struct Key {
    pub(super) curve: Curve,
    pub(super) compressed: [u8; 33],
    pub(super) uncompressed: [u8; 65],
    pub(super) ed25519: [u8; 32],
}

impl Key {
    pub(super) fn parse(curve: Curve, public_key: &[u8]) -> Result<Key, CryptoError> {
        let invalid = || CryptoError::invalid(format!("invalid public key for curve {}", curve.wire_name()));
        let mut key = Key { curve, compressed: [0; 33], uncompressed: [0; 65], ed25519: [0; 32] };
        // Plain SEC1 only: compressed (02/03, 33 bytes) or uncompressed (04, 65 bytes); the
        // parsers would also take the identity and "compact" (05) encodings.
        let sec1 = matches!((public_key.len(), public_key.first()), (33, Some(0x02 | 0x03)) | (65, Some(0x04)));
        match curve {
            Curve::Secp256k1 | Curve::P256 if !sec1 => return Err(invalid()),
            Curve::Secp256k1 => {
                let pk = k256::PublicKey::from_sec1_bytes(public_key).map_err(|_| invalid())?;
                key.compressed.copy_from_slice(pk.to_encoded_point(true).as_bytes());
                key.uncompressed.copy_from_slice(pk.to_encoded_point(false).as_bytes());
            }
            Curve::P256 => {
                let pk = p256::PublicKey::from_sec1_bytes(public_key).map_err(|_| invalid())?;
                key.compressed.copy_from_slice(pk.to_encoded_point(true).as_bytes());
                key.uncompressed.copy_from_slice(pk.to_encoded_point(false).as_bytes());
            }
            Curve::Ed25519 => {
                let bytes: [u8; 32] = public_key.try_into().map_err(|_| invalid())?;
                ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| invalid())?;
                key.ed25519 = bytes;
            }
        }
        Ok(key)
    }
}

/// RIPEMD160(SHA256(data)).
pub(super) fn hash160(data: &[u8]) -> [u8; 20] {
    Ripemd160::digest(Sha256::digest(data)).into()
}
