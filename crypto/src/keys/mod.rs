//! Key material: curves, BIP-39 mnemonics, BIP-32 / SLIP-0010 derivation, public keys.
//!
//! Everything secret that leaves this module has a zeroizing type of its own ([`Seed`],
//! [`Entropy`], [`SecretKey`]) or is wrapped in [`Zeroizing`]; error messages never carry key
//! material.

mod curve;
mod derive;
mod mnemonic;

use zeroize::Zeroizing;

use crate::error::CryptoError;

pub use crate::secret::{Entropy, Seed};
pub use curve::{public_key, Curve, SecretKey};
pub use derive::derive;
pub use mnemonic::{entropy_from_phrase, entropy_len_for_words, mnemonic_phrase, seed_from_entropy, seed_from_phrase};

/// English phrase of `entropy`. Alias of `mnemonic_phrase(entropy, "")`, kept for the interface
/// first sketched for this module.
pub fn mnemonic_from_entropy(entropy: &Entropy) -> Result<Zeroizing<String>, CryptoError> {
    mnemonic_phrase(entropy, "")
}

/// Alias of [`mnemonic_phrase`], kept for the interface first sketched for this module.
pub fn mnemonic_in_language(entropy: &Entropy, language: &str) -> Result<Zeroizing<String>, CryptoError> {
    mnemonic_phrase(entropy, language)
}

/// Alias of [`entropy_from_phrase`], kept for the interface first sketched for this module.
pub fn entropy_from_mnemonic(phrase: &str) -> Result<Entropy, CryptoError> {
    entropy_from_phrase(phrase)
}
