//! Secret byte strings with types of their own, so a seed is never confused with entropy or with
//! any other buffer, and none of them can be printed.
//!
//! Each type zeroizes its bytes on drop, is not `Clone` (a copy is a second buffer to wipe: take
//! a reference instead), and prints as `Name([REDACTED; n bytes])`. The bytes are read with
//! [`as_bytes`](Seed::as_bytes), `AsRef<[u8]>` or `Deref<Target = [u8]>`.

use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::error::CryptoError;

macro_rules! secret_bytes {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Zeroize, ZeroizeOnDrop)]
        pub struct $name(Vec<u8>);

        impl $name {
            /// Copies `bytes` into a buffer of exactly their length (the caller keeps zeroizing
            /// its own buffer).
            pub fn from_slice(bytes: &[u8]) -> Self {
                Self(bytes.to_vec())
            }

            /// The secret bytes.
            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }

            /// The length in bytes (not secret).
            pub fn len(&self) -> usize {
                self.0.len()
            }

            /// Whether the buffer is empty.
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }

        /// Takes over the buffer without copying it; the emptied `Zeroizing` is left behind.
        impl From<Zeroizing<Vec<u8>>> for $name {
            fn from(mut bytes: Zeroizing<Vec<u8>>) -> Self {
                Self(std::mem::take(&mut *bytes))
            }
        }

        impl AsRef<[u8]> for $name {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = [u8];
            fn deref(&self) -> &[u8] {
                &self.0
            }
        }

        /// The type name and length only, never a byte of the secret.
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!(stringify!($name), "([REDACTED; {} bytes])"), self.0.len())
            }
        }
    };
}

secret_bytes! {
    /// HD root material: a BIP-39 seed (64 bytes), or any 16 to 64 bytes [`crate::keys::derive`]
    /// derives keys from.
    Seed
}

secret_bytes! {
    /// The entropy of a BIP-39 mnemonic (16, 20, 24, 28 or 32 bytes for 12 to 24 words). Any
    /// length can be held; the mnemonic functions refuse the others.
    Entropy
}

/// 32 bytes of randomness (the HSM's) that seed a ChaCha20 RNG for one ephemeral key: whoever
/// knows them knows that key, so they are as secret as what it protects. Never reuse one.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct RngSeed([u8; 32]);

impl RngSeed {
    /// Copies 32 bytes (the caller keeps zeroizing its own buffer).
    pub fn from_slice(bytes: &[u8]) -> Result<Self, CryptoError> {
        let bytes: &[u8; 32] = bytes.try_into().map_err(|_| CryptoError::invalid("RNG seed must be 32 bytes"))?;
        Ok(Self(*bytes))
    }

    /// The secret bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A ChaCha20 RNG seeded with these bytes. (rand_chacha 0.3 does not zeroize its state on
    /// drop: keep the RNG for one call only.)
    pub(crate) fn rng(&self) -> rand_chacha::ChaCha20Rng {
        rand_core::SeedableRng::from_seed(self.0)
    }
}

/// Copies the bytes; the `Zeroizing` wipes its own copy when it is dropped here.
impl From<Zeroizing<[u8; 32]>> for RngSeed {
    fn from(bytes: Zeroizing<[u8; 32]>) -> Self {
        Self(*bytes)
    }
}

impl AsRef<[u8]> for RngSeed {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::Deref for RngSeed {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// The type name and length only, never a byte of the secret.
impl std::fmt::Debug for RngSeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RngSeed([REDACTED; 32 bytes])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_zod<T: ZeroizeOnDrop>() {}

    #[test]
    fn secret_types_zeroize_on_drop() {
        assert_zod::<Seed>();
        assert_zod::<Entropy>();
        assert_zod::<RngSeed>();
        assert_zod::<crate::keys::SecretKey>();
    }

    /// Every rendering of `secret`, and of each of its bytes, a careless `Debug` might print.
    fn renderings(secret: &[u8]) -> Vec<String> {
        let mut out = vec![hex::encode(secret), hex::encode_upper(secret), format!("{secret:?}")];
        for b in secret {
            out.extend([format!("{b:02x}"), format!("{b:02X}"), format!("{b}")]);
        }
        out
    }

    const SEED_DEBUG: &str = "Seed([REDACTED; 64 bytes])";
    const ENTROPY_DEBUG: &str = "Entropy([REDACTED; 16 bytes])";
    const RNG_SEED_DEBUG: &str = "RngSeed([REDACTED; 32 bytes])";
    const SECRET_KEY_DEBUG: &str = "SecretKey { curve: Secp256k1, .. }";
    const FIXED: [&str; 4] = [SEED_DEBUG, ENTROPY_DEBUG, RNG_SEED_DEBUG, SECRET_KEY_DEBUG];

    /// `n` distinct bytes none of whose renderings occurs in the fixed text of the redacted
    /// forms (`ED`, `ee`, `64`, `6`, ...), so any occurrence in an output is a leak.
    fn secret(n: usize) -> Vec<u8> {
        let out: Vec<u8> = (0..=255u8)
            .rev()
            .filter(|b| renderings(&[*b]).iter().all(|r| FIXED.iter().all(|fixed| !fixed.contains(r))))
            .take(n)
            .collect();
        assert_eq!(out.len(), n);
        out
    }

    fn check_debug(value: &impl std::fmt::Debug, expected: &str, secret: &[u8]) {
        assert_eq!(format!("{value:?}"), expected);
        for debug in [format!("{value:?}"), format!("{value:#?}")] {
            for r in renderings(secret) {
                assert!(!debug.contains(&r), "{debug:?} contains {r:?}");
            }
        }
    }

    #[test]
    fn debug_prints_the_type_and_length_only() {
        let bytes = secret(64);
        let seed = Seed::from_slice(&bytes);
        check_debug(&seed, SEED_DEBUG, &bytes);
        let entropy = Entropy::from(Zeroizing::new(bytes[..16].to_vec()));
        check_debug(&entropy, ENTROPY_DEBUG, &bytes[..16]);
        let rng_seed = RngSeed::from_slice(&bytes[..32]).unwrap();
        check_debug(&rng_seed, RNG_SEED_DEBUG, &bytes[..32]);
        let key = crate::keys::SecretKey::from_slice(crate::Curve::Secp256k1, &bytes[..32]).unwrap();
        check_debug(&key, SECRET_KEY_DEBUG, &bytes[..32]);
        // A structure that holds one prints it redacted too.
        assert_eq!(format!("{:?}", Some(&seed)), format!("Some({SEED_DEBUG})"));
    }

    #[test]
    fn accessors_and_conversions() {
        let seed = Seed::from_slice(&[1, 2, 3]);
        assert_eq!(seed.as_bytes(), &[1, 2, 3]);
        assert_eq!(seed.as_ref(), &[1, 2, 3]);
        assert_eq!(&*seed, &[1, 2, 3]);
        assert_eq!((seed.len(), seed.is_empty()), (3, false));

        let buffer = Zeroizing::new(vec![7u8; 20]);
        let pointer = buffer.as_ptr();
        let mut entropy = Entropy::from(buffer);
        // Moved, not copied.
        assert_eq!(entropy.as_ptr(), pointer);
        assert_eq!(entropy.as_bytes(), &[7u8; 20]);
        entropy.zeroize();
        assert!(entropy.is_empty());

        let rng_seed = RngSeed::from(Zeroizing::new([9u8; 32]));
        assert_eq!(rng_seed.as_bytes(), &[9u8; 32]);
        assert_eq!(rng_seed.as_ref(), &[9u8; 32]);
        assert_eq!(&*rng_seed, &[9u8; 32]);
        assert_eq!(RngSeed::from_slice(&[9u8; 32]).unwrap().as_bytes(), rng_seed.as_bytes());
        for bad in [&[9u8; 31][..], &[9u8; 33]] {
            let err = RngSeed::from_slice(bad).unwrap_err();
            assert!(matches!(err, CryptoError::InvalidArgument(ref m) if m == "RNG seed must be 32 bytes"));
        }
    }
}
