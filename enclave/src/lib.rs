//! Coffer's enclave: HSM custody and the gRPC service the gateway calls for key material.

pub mod auth_proxy;
pub mod authority;
pub mod config;
pub mod error;
pub mod hsm;
pub mod login;
pub mod service;
pub mod sessions;

pub use error::EnclaveError;
