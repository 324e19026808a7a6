//! The PKCS#11 boundary's error type, and its one mapping into the enclave's error.

use cryptoki::error::{Error as CkError, RvError};

use crate::error::EnclaveError;

/// A failure at the PKCS#11 boundary.
#[derive(Debug, thiserror::Error)]
pub enum HsmError {
    #[error("{call} failed: {rv}")]
    Pkcs11 { call: &'static str, rv: RvError },
    #[error("{call} failed: {message}")]
    Library { call: &'static str, message: String },
    #[error("no initialized token with label {0:?} (check the token label and SOFTHSM2_CONF)")]
    TokenNotFound(String),
    #[error("service key {0:?} is missing from the token: run `coffer-enclave init` (and restart the enclave where the module does not see other processes' new objects)")]
    KeyMissing(&'static str),
    #[error("the token holds no KEK labelled {0:?} (never made here: run `coffer-enclave init`; or destroyed after a rotation)")]
    UnknownKek(String),
    #[error("sealed blob failed authentication")]
    SealAuthentication,
    #[error("malformed data: {0}")]
    Malformed(&'static str),
    #[error("HSM state lock poisoned")]
    Poisoned,
    #[error("unknown hsm_profile {name:?} (one of: {known})")]
    UnknownProfile { name: String, known: String },
    #[error("the PKCS#11 module does not offer what hsm_profile {profile:?} needs: {missing}")]
    ProfileUnsupported { profile: &'static str, missing: String },
    #[error("service key {0:?} is kept sealed on this module, and no authority store was given to keep it in")]
    NoShelf(&'static str),
    #[error("sealed service keys: {0}")]
    Shelf(String),
    #[error("the sealing self-test failed under hsm_profile {profile:?}: {detail}; {hint}")]
    SelfTest { profile: &'static str, detail: String, hint: &'static str },
    #[error("a blob just sealed under hsm_profile {0:?} does not open again: the module does not seal as the profile says (the start-up self-test names the profile to try)")]
    SealNotReopened(&'static str),
    #[error("the token holds {count} objects labelled {label:?}, and Coffer uses exactly one key per label, so it uses neither. Two `coffer-enclave init` runs at once can make two; on Cloud KMS every enabled version of a key is an object of its own (keep one enabled). Do not delete either before you know which one sealed the stored blobs: the other can go")]
    DuplicateLabel { label: String, count: usize },
    #[error("hsm_profile = \"auto\" does not recognise this PKCS#11 module ({0}): set hsm_profile to its vendor's profile, or to \"generic\" to run it under the generic profile's assumptions (caller IVs, keys in the module where it offers them)")]
    UnknownModule(String),
    #[error("the KEK {label:?} has {count} seals counted (an upper bound), the most one AES-GCM key with random 96-bit IVs may make (NIST SP 800-38D §8.3): no more seals under it")]
    KekExhausted { label: String, count: u64 },
    #[error("the rotation names KEK {named:?} as current, and {current:?} is: it rotated already (check `coffer-gateway kek-status`)")]
    KekNotCurrent { named: String, current: String },
    #[error("the KEK {label:?} is still used by {by}: it is not destroyed")]
    KekInUse { label: String, by: &'static str },
    #[error("this deployment's HSM does not make {0} keys that stay in it (FEATURE_NAME_COFFER_HSM_NATIVE_KEYS): use CURVE_P256, or a key sealed as usual")]
    NativeCurveUnsupported(&'static str),
    #[error("the HSM holds no key labelled {0:?} (an HSM-native key destroyed, or on another token)")]
    NativeKeyMissing(String),
    #[error("this deployment offers no HSM-native keys (FEATURE_NAME_COFFER_HSM_NATIVE_KEYS; the enclave's hsm_native_keys_max is 0): remove the feature to make keys sealed as usual")]
    NativeKeysOff,
    #[error("the HSM holds the most HSM-native keys this deployment allows (hsm_native_keys_max)")]
    NativeKeysFull,
    #[error("the organization (with its sub-organizations) holds the most HSM-native keys one may ({0}, hsm_native_keys_per_organization)")]
    NativeKeysFullForOrganization(u64),
    #[error("a key of this request is being made in the HSM, or was left by an attempt that failed (removed within minutes): retry shortly")]
    NativeKeyPending,
    #[error("{count} blobs were ever sealed under the KEKs before {label:?}, and as many have been re-sealed under it: no more re-seals")]
    ResealsSpent { label: String, count: u64 },
}

impl HsmError {
    pub(crate) fn call(call: &'static str, e: CkError) -> Self {
        match e {
            CkError::Pkcs11(rv, _) => Self::Pkcs11 { call, rv },
            other => Self::Library { call, message: other.to_string() },
        }
    }
}

impl From<HsmError> for EnclaveError {
    fn from(e: HsmError) -> Self {
        match e {
            HsmError::SealAuthentication | HsmError::UnknownKek(_) => EnclaveError::SealAuthentication,
            HsmError::Malformed(m) => EnclaveError::InvalidArgument(format!("malformed input: {m}")),
            HsmError::KekNotCurrent { .. }
            | HsmError::KekInUse { .. }
            | HsmError::NativeCurveUnsupported(_)
            | HsmError::NativeKeysOff
            | HsmError::NativeKeysFull
            | HsmError::NativeKeysFullForOrganization(_)
            | HsmError::NativeKeyPending => EnclaveError::InvalidArgument(e.to_string()),
            HsmError::Poisoned => EnclaveError::Internal(e.to_string()),
            other => EnclaveError::Hsm(other.to_string()),
        }
    }
}
