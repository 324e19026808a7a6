//! Key-material functions of the enclave, free of any HSM: pure, unit-tested, fuzzable.

// No panics on input in the enclave: errors are returned; tests may unwrap.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod address;
pub mod bundle;
pub mod error;
pub mod keys;
pub mod qos;
pub mod secret;
pub mod session;
pub mod sign;

pub use error::CryptoError;
pub use keys::Curve;
