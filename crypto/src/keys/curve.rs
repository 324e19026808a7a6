//! Signing curves, a curve's 32-byte secret key, and the public key of a secret.

use k256::elliptic_curve::sec1::ToEncodedPoint;

use crate::error::CryptoError;

/// A signing curve, as named by the wire enum `Curve` (`CURVE_SECP256K1`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curve {
    /// secp256k1 (Bitcoin, Ethereum, ...).
    Secp256k1,
    /// NIST P-256 (secp256r1).
    P256,
    /// Ed25519 (RFC 8032).
    Ed25519,
}

impl Curve {
    /// Parses the wire name (`CURVE_SECP256K1`, `CURVE_P256`, `CURVE_ED25519`).
    pub fn parse(wire: &str) -> Result<Curve, CryptoError> {
        match wire {
            "CURVE_SECP256K1" => Ok(Curve::Secp256k1),
            "CURVE_P256" => Ok(Curve::P256),
            "CURVE_ED25519" => Ok(Curve::Ed25519),
            other => Err(CryptoError::invalid(format!("invalid curve: {other}"))),
        }
    }

    /// The wire name of this curve.
    pub fn wire_name(self) -> &'static str {
        match self {
            Curve::Secp256k1 => "CURVE_SECP256K1",
            Curve::P256 => "CURVE_P256",
            Curve::Ed25519 => "CURVE_ED25519",
        }
    }
}

/// A signing key's 32-byte secret (scalar, or the Ed25519 seed) together with its curve, so a
/// secret never travels as bare bytes beside a curve string. Zeroized on drop; never printed.
#[derive(zeroize::Zeroize, zeroize::ZeroizeOnDrop)]
pub struct SecretKey {
    #[zeroize(skip)]
    curve: Curve,
    bytes: [u8; 32],
}

impl SecretKey {
    /// Copies a 32-byte secret (the caller keeps zeroizing its own buffer).
    pub fn from_slice(curve: Curve, bytes: &[u8]) -> Result<Self, CryptoError> {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| CryptoError::invalid("private key must be 32 bytes"))?;
        Ok(Self { curve, bytes })
    }
    /// Copies a secret this crate produced (the caller's buffer zeroizes itself).
    pub(crate) fn from_array(curve: Curve, bytes: &[u8; 32]) -> Self {
        Self { curve, bytes: *bytes }
    }
    pub fn curve(&self) -> Curve {
        self.curve
    }
    /// The raw secret, for the signing and export functions of this crate.
    pub fn secret_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }
    /// See [`public_key`].
    pub fn public_key(&self) -> Result<Vec<u8>, CryptoError> {
        public_key(self.curve, &self.bytes)
    }
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretKey").field("curve", &self.curve).finish_non_exhaustive()
    }
}

/// The public key of a 32-byte secret: compressed SEC1 (33 bytes) for secp256k1 and P-256, the
/// raw 32-byte key for Ed25519 (where `secret` is the RFC 8032 seed).
pub fn public_key(curve: Curve, secret: &[u8; 32]) -> Result<Vec<u8>, CryptoError> {
    let invalid = || CryptoError::invalid("invalid private key");
    match curve {
        Curve::Secp256k1 => {
            // `SecretKey` zeroizes itself on drop.
            let sk = k256::SecretKey::from_bytes(secret.into()).map_err(|_| invalid())?;
            Ok(sk.public_key().to_encoded_point(true).as_bytes().to_vec())
        }
        Curve::P256 => {
            let sk = p256::SecretKey::from_bytes(secret.into()).map_err(|_| invalid())?;
            Ok(sk.public_key().to_encoded_point(true).as_bytes().to_vec())
        }
        Curve::Ed25519 => {
            // `SigningKey` zeroizes itself on drop (ed25519-dalek "zeroize" feature).
            let sk = ed25519_dalek::SigningKey::from_bytes(secret);
            Ok(sk.verifying_key().to_bytes().to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex32(s: &str) -> [u8; 32] {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    #[test]
    fn curve_wire_names_round_trip() {
        for c in [Curve::Secp256k1, Curve::P256, Curve::Ed25519] {
            assert_eq!(Curve::parse(c.wire_name()).unwrap(), c);
        }
        let err = Curve::parse("CURVE_ED448").unwrap_err();
        assert!(matches!(err, CryptoError::InvalidArgument(ref m) if m == "invalid curve: CURVE_ED448"));
        assert!(Curve::parse("").is_err());
        assert!(Curve::parse("curve_secp256k1").is_err());
    }

    #[test]
    fn public_key_of_one_is_the_generator() {
        let mut one = [0u8; 32];
        one[31] = 1;
        // The secp256k1 and P-256 generators (SEC 2, FIPS 186-4), compressed.
        assert_eq!(
            hex::encode(public_key(Curve::Secp256k1, &one).unwrap()),
            "0279be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
        );
        assert_eq!(
            hex::encode(public_key(Curve::P256, &one).unwrap()),
            "036b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296"
        );
    }

    #[test]
    fn ed25519_public_key_rfc8032_test_1() {
        let sk = hex32("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60");
        assert_eq!(
            hex::encode(public_key(Curve::Ed25519, &sk).unwrap()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
    }

    #[test]
    fn public_key_refuses_invalid_scalars() {
        let zero = [0u8; 32];
        let max = [0xffu8; 32]; // >= n on both curves
        for curve in [Curve::Secp256k1, Curve::P256] {
            assert!(matches!(public_key(curve, &zero), Err(CryptoError::InvalidArgument(_))));
            assert!(matches!(public_key(curve, &max), Err(CryptoError::InvalidArgument(_))));
        }
        // Every 32-byte string is a valid Ed25519 seed.
        assert_eq!(public_key(Curve::Ed25519, &zero).unwrap().len(), 32);
    }
}
