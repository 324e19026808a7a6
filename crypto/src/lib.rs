//! Key-material functions of the enclave, free of any HSM: pure, unit-tested, fuzzable.

pub mod address;
pub mod bundle;
pub mod error;
pub mod keys;
pub mod qos;
pub mod session;
pub mod sign;

pub use error::CryptoError;
pub use keys::Curve;
