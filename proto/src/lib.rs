//! Generated types and gRPC stubs for the gateway <-> enclave contract.
#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("coffer.enclave.v1");
}
