//! The authority store as the HSM layer's shelf for the service keys a module cannot hold.

use std::sync::Arc;

use crate::hsm::{HsmError, SealedKeyShelf};
use crate::store::EnclaveStore;

/// Keeps sealed service keys in the enclave tier's authority store (`sealed_service_keys`).
pub struct ServiceKeyShelf(pub Arc<dyn EnclaveStore>);

impl SealedKeyShelf for ServiceKeyShelf {
    fn sealed_service_key(&self, label: &str) -> Result<Option<Vec<u8>>, HsmError> {
        self.0.sealed_service_key(label).map_err(|e| HsmError::Shelf(e.to_string()))
    }

    fn keep_sealed_service_key(&self, label: &str, blob: &[u8]) -> Result<Vec<u8>, HsmError> {
        self.0.keep_sealed_service_key(label, blob).map_err(|e| HsmError::Shelf(e.to_string()))
    }

    fn reserve_seals(&self, kek_label: &str, n: u64) -> Result<u64, HsmError> {
        self.0.reserve_seals(kek_label, n).map_err(|e| HsmError::Shelf(e.to_string()))
    }
}
