//! The enclave's one error type, and its single mapping to gRPC statuses.

/// Everything that can go wrong inside the enclave. Messages never carry key material.
#[derive(Debug, thiserror::Error)]
pub enum EnclaveError {
    /// The caller asked for something malformed or unsupported (bad curve, path, encoding, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A sealed blob did not open: wrong organization/resource binding, tampering, or wrong KEK.
    #[error("sealed key material failed authentication (wrong binding or tampered blob)")]
    SealAuthentication,
    /// The request is not authorized by a fresh stamp of a certified credential for exactly this
    /// operation (see `authority`). The reason names the failed check, never a secret.
    #[error("enclave refused: {0}")]
    Refused(String),
    /// A bounded resource is full (the replay window); retrying later can succeed.
    #[error("enclave busy: {0}")]
    Busy(String),
    /// An OAuth 2.0 provider failed or could not be reached (a 502 at the gateway); the message
    /// names the provider and its answer, never a secret.
    #[error("{0}")]
    Upstream(String),
    /// The HSM failed or is unreachable; the message names the PKCS#11 call and return value.
    #[error("HSM error: {0}")]
    Hsm(String),
    /// A bug or an impossible state.
    #[error("internal enclave error: {0}")]
    Internal(String),
}

impl EnclaveError {
    /// Shorthand for [`EnclaveError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }
}

impl From<EnclaveError> for tonic::Status {
    fn from(e: EnclaveError) -> Self {
        match &e {
            EnclaveError::InvalidArgument(_) => tonic::Status::invalid_argument(e.to_string()),
            EnclaveError::SealAuthentication => tonic::Status::failed_precondition(e.to_string()),
            EnclaveError::Refused(_) => tonic::Status::permission_denied(e.to_string()),
            EnclaveError::Busy(_) => tonic::Status::resource_exhausted(e.to_string()),
            EnclaveError::Upstream(_) => tonic::Status::aborted(e.to_string()),
            EnclaveError::Hsm(_) => tonic::Status::unavailable(e.to_string()),
            EnclaveError::Internal(_) => tonic::Status::internal(e.to_string()),
        }
    }
}

impl From<coffer_auth::AuthError> for EnclaveError {
    fn from(e: coffer_auth::AuthError) -> Self {
        Self::InvalidArgument(e.message)
    }
}

impl From<coffer_crypto::CryptoError> for EnclaveError {
    fn from(e: coffer_crypto::CryptoError) -> Self {
        match e {
            coffer_crypto::CryptoError::InvalidArgument(m) => Self::InvalidArgument(m),
            coffer_crypto::CryptoError::Internal(m) => Self::Internal(m),
        }
    }
}
