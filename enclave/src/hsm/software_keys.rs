//! The software side of service keys a module cannot hold: the shelf their sealed blobs are kept
//! on, and the keys made from an opened blob (Ed25519, P-256, HMAC-SHA256).

use std::collections::HashMap;
use std::sync::Mutex;

use hmac::Mac;
use zeroize::Zeroizing;

use super::error::HsmError;
use super::seal::OpenedBlob;

/// Where sealed service keys are kept: the enclave tier's authority store, shared by every
/// enclave on the token (sealed, so its keeper learns nothing from them).
pub trait SealedKeyShelf: Send + Sync {
    /// The sealed key labelled `label`, if any.
    fn sealed_service_key(&self, label: &str) -> Result<Option<Vec<u8>>, HsmError>;
    /// Keeps `blob` under `label` unless a key is there already; returns the one kept (so that
    /// enclaves initialising at once agree on one key).
    fn keep_sealed_service_key(&self, label: &str, blob: &[u8]) -> Result<Vec<u8>, HsmError>;
    /// Reserves `n` more seals under the KEK `kek_label`; answers how many are reserved now.
    fn reserve_seals(&self, kek_label: &str, n: u64) -> Result<u64, HsmError>;
    /// The seals reserved under each KEK label so far.
    fn seals_reserved(&self) -> Result<Vec<(String, u64)>, HsmError>;
    /// Every sealed service key: (label, blob).
    fn sealed_service_keys(&self) -> Result<Vec<(String, Vec<u8>)>, HsmError>;
    /// Replaces the sealed service key `label` by `new` if it is still `old`.
    fn replace_sealed_service_key(&self, label: &str, old: &[u8], new: &[u8]) -> Result<bool, HsmError>;
    /// The KEKs recorded by rotation or destruction, oldest first. The current KEK is the newest
    /// (version 1 while none is recorded).
    fn keks(&self) -> Result<Vec<RecordedKek>, HsmError>;
    /// Records KEK `version` (the module's object `object_id`) as made, if it is the next one;
    /// answers whether it did.
    fn add_kek(&self, version: u32, made_ms: i64, object_id: &[u8]) -> Result<bool, HsmError>;
    /// Records KEK `version` as destroyed.
    fn kek_destroyed(&self, version: u32, at_ms: i64) -> Result<(), HsmError>;
    /// Counts the HSM-native key `label` of `org`, charged to its top-level organization
    /// `charged_to`, within `bounds` (the token's, one organization's); refused with why otherwise.
    fn count_native_key(
        &self,
        label: &str,
        org: &str,
        charged_to: &str,
        made_ms: i64,
        bounds: (u64, u64),
    ) -> Result<(), HsmError>;
    /// The HSM-native keys counted (of `org` only, when given): (label, organization, made at).
    fn native_keys(&self, org: Option<&str>) -> Result<Vec<(String, String, i64)>, HsmError>;
    /// Stops counting the HSM-native key `label`.
    fn remove_native_key(&self, label: &str) -> Result<(), HsmError>;
}

/// A KEK the shelf records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedKek {
    pub version: u32,
    pub made_ms: i64,
    pub destroyed_ms: Option<i64>,
    /// The `CKA_ID` of the module's object: which of several objects under the label it is.
    pub object_id: Option<Vec<u8>>,
}

/// The sealed blobs read so far, by label (not secret: opening needs the HSM).
#[derive(Default)]
pub(super) struct SealedBlobCache(pub(super) Mutex<HashMap<&'static str, Vec<u8>>>);

/// An Ed25519 signing key from a sealed 32-byte seed (wiped on drop).
pub(super) fn ed25519_key(seed: &OpenedBlob) -> ed25519_dalek::SigningKey {
    let mut bytes = Zeroizing::new([0u8; 32]);
    bytes.copy_from_slice(seed);
    ed25519_dalek::SigningKey::from_bytes(&bytes)
}

/// A P-256 secret key from a sealed 32-byte scalar.
pub(super) fn p256_key(scalar: &OpenedBlob) -> Result<p256::SecretKey, HsmError> {
    p256::SecretKey::from_slice(scalar).map_err(|_| HsmError::Malformed("a sealed P-256 key is not a scalar"))
}

/// Whether 32 bytes are a valid P-256 scalar (non-zero, below the order).
pub(super) fn is_p256_scalar(bytes: &[u8]) -> bool {
    p256::SecretKey::from_slice(bytes).is_ok()
}

/// HMAC-SHA256 under a sealed key, ready for data. (The `hmac` crate keeps the key's padded
/// hash state without wiping it; the opened key itself is wiped.)
pub(super) fn hmac_sha256(key: &OpenedBlob) -> Result<hmac::Hmac<sha2::Sha256>, HsmError> {
    <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(key).map_err(|_| HsmError::Malformed("an HMAC key"))
}
