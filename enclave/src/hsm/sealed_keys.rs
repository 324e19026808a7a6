//! Service keys the module cannot hold (its profile says so): made from the HSM's randomness,
//! sealed under the KEK and kept on the shelf (the authority store), opened inside the enclave for
//! one use and zeroized, exactly as user keys are.

use super::error::HsmError;
use super::seal::{BlobBinding, BlobKind, OpenedBlob};
use super::token::Hsm;

fn binding(label: &'static str) -> BlobBinding<'static> {
    BlobBinding::plain(BlobKind::ServiceKey, "", label)
}

impl Hsm {
    /// Whether a sealed software key labelled `label` exists.
    pub(super) fn has_sealed_key(&self, label: &'static str) -> Result<bool, HsmError> {
        Ok(self.sealed_blob(label)?.is_some())
    }

    fn sealed_blob(&self, label: &'static str) -> Result<Option<Vec<u8>>, HsmError> {
        let mut cache = self.sealed_blobs.0.lock().map_err(|_| HsmError::Poisoned)?;
        if let Some(blob) = cache.get(label) {
            return Ok(Some(blob.clone()));
        }
        let Some(shelf) = &self.shelf else { return Ok(None) };
        let blob = shelf.sealed_service_key(label)?;
        if let Some(blob) = &blob {
            cache.insert(label, blob.clone());
        }
        Ok(blob)
    }

    /// Makes a sealed software key of 32 random bytes (from the HSM) that `valid` accepts.
    pub(super) fn create_sealed_key(&self, label: &'static str, valid: impl Fn(&[u8]) -> bool) -> Result<(), HsmError> {
        let shelf = self.shelf.as_ref().ok_or(HsmError::NoShelf(label))?;
        let secret = loop {
            let candidate = self.random(32)?;
            if valid(&candidate) {
                break candidate;
            }
        };
        let blob = self.seal(&binding(label), &secret)?;
        let kept = shelf.keep_sealed_service_key(label, &blob)?;
        self.sealed_blobs.0.lock().map_err(|_| HsmError::Poisoned)?.insert(label, kept);
        Ok(())
    }

    /// Opens the sealed software key labelled `label` (for one use; wiped when dropped). A blob
    /// that no longer opens (another enclave moved it to a new KEK, then the old one was
    /// destroyed) is read again from the shelf, once.
    pub(super) fn open_sealed_key(&self, label: &'static str) -> Result<OpenedBlob, HsmError> {
        let blob = self.sealed_blob(label)?.ok_or(HsmError::KeyMissing(label))?;
        let opened = match self.unseal(&binding(label), &blob) {
            Err(HsmError::UnknownKek(_) | HsmError::SealAuthentication) if self.shelf.is_some() => {
                self.sealed_blobs.0.lock().map_err(|_| HsmError::Poisoned)?.remove(label);
                let blob = self.sealed_blob(label)?.ok_or(HsmError::KeyMissing(label))?;
                self.unseal(&binding(label), &blob)?
            }
            other => other?,
        };
        if opened.len() != 32 {
            return Err(HsmError::Malformed("a sealed service key is not 32 bytes"));
        }
        Ok(opened)
    }
}
