//! The authority store as the HSM layer's shelf for the service keys a module cannot hold.

use std::sync::Arc;

use crate::hsm::{HsmError, RecordedKek, SealedKeyShelf};
use crate::store::{EnclaveStore, NativeKeyCounted, NativeKeyRow};

/// Keeps sealed service keys in the enclave tier's authority store (`sealed_service_keys`).
pub struct ServiceKeyShelf(pub Arc<dyn EnclaveStore>);

impl SealedKeyShelf for ServiceKeyShelf {
    fn sealed_service_key(&self, label: &str) -> Result<Option<Vec<u8>>, HsmError> {
        self.0.sealed_service_key(label).map_err(shelf)
    }

    fn keep_sealed_service_key(&self, label: &str, blob: &[u8]) -> Result<Vec<u8>, HsmError> {
        self.0.keep_sealed_service_key(label, blob).map_err(shelf)
    }

    fn reserve_seals(&self, kek_label: &str, n: u64) -> Result<u64, HsmError> {
        self.0.reserve_seals(kek_label, n).map_err(shelf)
    }

    fn seals_reserved(&self) -> Result<Vec<(String, u64)>, HsmError> {
        self.0.seals_reserved().map_err(shelf)
    }

    fn sealed_service_keys(&self) -> Result<Vec<(String, Vec<u8>)>, HsmError> {
        self.0.sealed_service_keys().map_err(shelf)
    }

    fn replace_sealed_service_key(&self, label: &str, old: &[u8], new: &[u8]) -> Result<bool, HsmError> {
        self.0.replace_sealed_service_key(label, old, new).map_err(shelf)
    }

    fn keks(&self) -> Result<Vec<RecordedKek>, HsmError> {
        Ok(self
            .0
            .keks()
            .map_err(shelf)?
            .into_iter()
            .map(|k| RecordedKek {
                version: k.version,
                made_ms: k.made_ms,
                destroyed_ms: k.destroyed_ms,
                object_id: k.object_id,
            })
            .collect())
    }

    fn add_kek(&self, version: u32, made_ms: i64, object_id: &[u8]) -> Result<bool, HsmError> {
        self.0.add_kek(version, made_ms, object_id).map_err(shelf)
    }

    fn kek_destroyed(&self, version: u32, at_ms: i64) -> Result<(), HsmError> {
        self.0.kek_destroyed(version, at_ms).map_err(shelf)
    }

    fn count_native_key(
        &self,
        label: &str,
        org: &str,
        charged_to: &str,
        made_ms: i64,
        (total, per_organization): (u64, u64),
    ) -> Result<(), HsmError> {
        let row =
            NativeKeyRow { label: label.into(), organization_id: org.into(), charged_to: charged_to.into(), made_ms };
        match self.0.add_native_key(&row, total, per_organization).map_err(shelf)? {
            NativeKeyCounted::Counted => Ok(()),
            NativeKeyCounted::TokenFull => Err(HsmError::NativeKeysFull),
            NativeKeyCounted::OrganizationFull => Err(HsmError::NativeKeysFullForOrganization(per_organization)),
            NativeKeyCounted::Exists => Err(HsmError::NativeKeyPending),
        }
    }

    fn native_keys(&self, org: Option<&str>) -> Result<Vec<(String, String, i64)>, HsmError> {
        Ok(self
            .0
            .native_keys(org)
            .map_err(shelf)?
            .into_iter()
            .map(|k| (k.label, k.organization_id, k.made_ms))
            .collect())
    }

    fn remove_native_key(&self, label: &str) -> Result<(), HsmError> {
        self.0.remove_native_key(label).map_err(shelf)
    }
}

fn shelf(e: crate::store::StoreError) -> HsmError {
    HsmError::Shelf(e.to_string())
}
