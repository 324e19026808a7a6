//! PKCS#11 custody: one module load, one login held by an anchor session, a session pool, and
//! the service keys (the AES-256 KEK, the P-256 bundle signer and the credential-certificate
//! HMAC key, the login keys), found by label.

mod error;
mod key_labels;
mod login_keys;
mod proof_key;
mod seal;
mod token;

pub use error::HsmError;
pub use key_labels::{
    LoginKey, LoginPublicKeys, CERT_MAC_LABEL, KEK_LABEL, NOTARIZER_LABEL, OIDC_ISSUER_LABEL, PROOF_LABEL,
    SIGNER_LABEL, TLS_FETCHER_LABEL, WEBHOOK_SIGNER_LABEL,
};
pub use seal::{is_legacy, BlobBinding, BlobKind, OpenedBlob};
pub use token::{init_token, Hsm, HsmSettings};

/// The sealed-blob format alone, without an HSM, for the fuzz targets (`fuzz-targets/`): the
/// decoder every blob an HSM opens goes through first, and its inverse. Not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use super::error::HsmError;

    /// A decoded blob: (version, KEK label, IV, ciphertext ‖ tag).
    pub type Decoded<'a> = (u8, &'a str, [u8; 12], &'a [u8]);

    /// Decodes `"CS" ‖ version ‖ len(kek) ‖ kek label ‖ iv(12) ‖ ciphertext ‖ tag(16)`.
    pub fn decode(blob: &[u8]) -> Result<Decoded<'_>, HsmError> {
        super::seal::decode(blob).map(|p| (p.version, p.kek_label, p.iv, p.ciphertext))
    }

    /// Encodes a blob as sealing does (`ciphertext` includes the tag).
    pub fn encode(version: u8, kek_label: &str, iv: &[u8], ciphertext: &[u8]) -> Vec<u8> {
        super::seal::encode(version, kek_label, iv, ciphertext)
    }
}

#[cfg(test)]
pub(crate) mod tests;
