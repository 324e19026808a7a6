//! ADDRESS_FORMAT_UNCOMPRESSED / ADDRESS_FORMAT_COMPRESSED: the public key itself, lowercase hex
//! without `0x`.

use super::encoding::Key;
use crate::keys::Curve;

/// Hex of the 65-byte SEC1 point `04 ‖ x ‖ y` (ECDSA curves only; the caller checks the curve).
pub(super) fn uncompressed(key: &Key) -> String {
    hex::encode(key.uncompressed)
}

/// Hex of the 33-byte compressed SEC1 point, or of the raw 32-byte key for Ed25519.
pub(super) fn compressed(key: &Key) -> String {
    match key.curve {
        Curve::Ed25519 => hex::encode(key.ed25519),
        Curve::Secp256k1 | Curve::P256 => hex::encode(key.compressed),
    }
}

#[cfg(test)]
mod tests {
    use crate::address::address;
    use crate::keys::{public_key, Curve};

    const ONE: [u8; 32] = {
        let mut k = [0u8; 32];
        k[31] = 1;
        k
    };

    #[test]
    fn generator_points() {
        // The public key of secret 1 is the generator G (SEC 2 for secp256k1, FIPS 186-4 for
        // P-256).
        let secp = public_key(Curve::Secp256k1, &ONE).unwrap();
        assert_eq!(
            address("ADDRESS_FORMAT_UNCOMPRESSED", Curve::Secp256k1, &secp).unwrap(),
            "0479be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798\
             483ada7726a3c4655da4fbfc0e1108a8fd17b448a68554199c47d08ffb10d4b8"
        );
        assert_eq!(
            address("ADDRESS_FORMAT_COMPRESSED", Curve::Secp256k1, &secp).unwrap(),
            "0279be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
        );
        let p256 = public_key(Curve::P256, &ONE).unwrap();
        assert_eq!(
            address("ADDRESS_FORMAT_UNCOMPRESSED", Curve::P256, &p256).unwrap(),
            "046b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296\
             4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5"
        );
        assert_eq!(
            address("ADDRESS_FORMAT_COMPRESSED", Curve::P256, &p256).unwrap(),
            "036b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296"
        );
    }

    #[test]
    fn ed25519_compressed_is_the_raw_key() {
        // RFC 8032 test 1.
        let secret: [u8; 32] = hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
            .unwrap()
            .try_into()
            .unwrap();
        let pk = public_key(Curve::Ed25519, &secret).unwrap();
        assert_eq!(
            address("ADDRESS_FORMAT_COMPRESSED", Curve::Ed25519, &pk).unwrap(),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
    }
}
