//! PKCS#11 custody: one module load, a profile of what the module can do, one login held by an
//! anchor session, a bounded session pool, and the service keys found by label (the AES-256 KEK,
//! the bundle signer, the credential-certificate HMAC key, the webhook signer, the proof key, the
//! notarizer, and the login keys: the OIDC issuer's and the TLS fetcher's).

mod error;
mod kek;
mod kek_rotation;
mod key_labels;
mod login_keys;
mod native_keys;
mod pool;
mod profile;
mod proof_key;
mod seal;
mod sealed_keys;
mod self_test;
mod software_keys;
mod token;

pub use error::HsmError;
pub use kek_rotation::KekState;
pub use key_labels::{
    kek_label, kek_version, LoginKey, LoginPublicKeys, CERT_MAC_LABEL, KEK_LABEL, NOTARIZER_LABEL, OIDC_ISSUER_LABEL,
    PROOF_LABEL, SIGNER_LABEL, TLS_FETCHER_LABEL, WEBHOOK_SIGNER_LABEL,
};
/// The KEK label a sealed blob names, if it is a blob.
pub fn kek_of_blob(blob: &[u8]) -> Option<String> {
    seal::decode(blob).ok().map(|p| p.kek_label.to_string())
}

pub use native_keys::{native_label, native_label_of, native_reference};
pub use profile::{IvSource, KeyHome, ModuleProfile, PROFILE_NAMES};
pub use seal::{is_legacy, BlobBinding, BlobKind, OpenedBlob};
pub use software_keys::{RecordedKek, SealedKeyShelf};
pub use token::{init_token, Hsm, HsmSettings, NativeKeyBounds};

/// The sealed-blob format alone, without an HSM, for the fuzz targets (`fuzz-targets/`): the
/// decoder every blob an HSM opens goes through first, and its inverse. Not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use super::error::HsmError;

    /// A decoded blob: (version, KEK label, IV source code (0 before version 3), IV,
    /// ciphertext ‖ tag).
    pub type Decoded<'a> = (u8, &'a str, u8, &'a [u8], &'a [u8]);

    /// Decodes a blob of any version (`seal::encode` gives the layouts).
    pub fn decode(blob: &[u8]) -> Result<Decoded<'_>, HsmError> {
        super::seal::decode(blob)
            .map(|p| (p.version, p.kek_label, p.iv_source.map_or(0, |s| s.code()), p.iv, p.ciphertext))
    }

    /// Encodes a blob as sealing does (`ciphertext` includes the tag; `iv_source` is recorded
    /// from version 3 on).
    pub fn encode(version: u8, kek_label: &str, iv_source: u8, iv: &[u8], ciphertext: &[u8]) -> Vec<u8> {
        super::seal::encode(version, kek_label, iv_source, iv, ciphertext)
    }
}

#[cfg(test)]
pub(crate) mod tests;
