//! Coffer's enclave: HSM custody and the gRPC service the gateway calls for key material.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod activity_log;
pub mod admission;
pub mod audit;
pub mod bounded_cache;
pub mod config;
pub mod decider;
pub mod egress;
pub mod error;
pub mod group_commit;
pub mod hsm;
pub mod link_request;
pub mod mail;
pub mod oauth2_exchange;
pub mod operator;
pub mod proofs;
pub mod proxy_stamper;
pub mod service;
pub mod service_key_shelf;
pub mod sessions;
pub mod sms;
pub mod store;
pub mod verification_token;

pub use error::EnclaveError;
