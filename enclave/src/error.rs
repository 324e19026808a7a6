//! The enclave's one error type, and its single mapping to gRPC statuses.

pub use coffer_proto::v1::RefusalReason;

use crate::store::{Remembered, StoreError};

/// The replay window is full.
pub const BUSY: &str = "replay window is full: retry shortly";
/// The stamp was spent already.
pub const REPLAYED: &str = "replayed request: this stamped body was already used for this operation";
/// The organization's share of the replay window is full.
pub const ORGANIZATION_BUSY: &str =
    "this organization's share of the replay window is full: retry once its recent requests have aged out";

/// A rejected activity's refusal.
pub const VOTE_REJECTED: &str = "the activity was rejected by a vote: nothing runs it";

/// Why a stamp could not be spent, as the caller is told: `None` for a fresh one.
pub fn spend_refusal(remembered: Remembered) -> Option<(RefusalReason, &'static str)> {
    match remembered {
        Remembered::Fresh => None,
        Remembered::Replayed => Some((RefusalReason::Replayed, REPLAYED)),
        Remembered::OrganizationQuotaFull => Some((RefusalReason::OrganizationReplayQuota, ORGANIZATION_BUSY)),
        Remembered::WindowFull => Some((RefusalReason::ReplayWindowFull, BUSY)),
        Remembered::Rejected => Some((RefusalReason::VoteRejected, VOTE_REJECTED)),
    }
}

/// A stamp the replay window would not take, as an error: a replay is refused; a full share or
/// window is busy (retrying later can succeed).
pub fn not_spent(remembered: Remembered) -> EnclaveError {
    match spend_refusal(remembered) {
        Some((reason @ (RefusalReason::ReplayWindowFull | RefusalReason::OrganizationReplayQuota), message)) => {
            EnclaveError::Busy { reason, message: message.into() }
        }
        Some((reason, message)) => EnclaveError::refused(reason, message),
        None => EnclaveError::Internal("a fresh stamp reported as not spent".into()),
    }
}

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
    /// operation (see `authority`). The reason is the failed check's type (what callers decide
    /// on); the message names it for humans, never a secret.
    /// `evaluation`: for a refusal of the organization's rules (consensus needed, denied), the
    /// policy outcomes the decision read; empty otherwise.
    #[error("enclave refused: {message}")]
    Refused { reason: RefusalReason, message: String, evaluation: String },
    /// A bounded resource is full (the replay window); retrying later can succeed.
    #[error("enclave busy: {message}")]
    Busy { reason: RefusalReason, message: String },
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
    /// The enclave tier's authority store failed: unreachable (retry), corrupt, or a state change
    /// that lost a race with another enclave (`VersionMoved`, when its caller did not retry).
    #[error("{0}")]
    EnclaveStore(#[from] crate::store::StoreError),
}

impl EnclaveError {
    /// Shorthand for [`EnclaveError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }

    /// Shorthand for [`EnclaveError::Refused`].
    pub fn refused(reason: RefusalReason, message: impl Into<String>) -> Self {
        Self::Refused { reason, message: message.into(), evaluation: String::new() }
    }

    /// The error's type as audit lines name it (`coffer_audit` outcome lines): never its message.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) => "invalid_argument",
            Self::SealAuthentication => "seal_authentication",
            Self::Refused { .. } => "refused",
            Self::Busy { .. } => "busy",
            Self::Upstream(_) => "upstream",
            Self::Hsm(_) => "hsm",
            Self::Internal(_) => "internal",
            Self::EnclaveStore(_) => "authority_store",
        }
    }

    /// Whether the error is evidence of tampering: sealed key material that does not open under
    /// the binding (organization, resource, curve, address) the request presents it with, or
    /// names a KEK this enclave does not hold.
    pub fn is_tampering(&self) -> bool {
        matches!(self, Self::SealAuthentication)
    }

    /// The typed reason of a refusal or busy answer; `None` for every other error.
    pub fn refusal_reason(&self) -> Option<RefusalReason> {
        match self {
            Self::Refused { reason, .. } | Self::Busy { reason, .. } => Some(*reason),
            _ => None,
        }
    }
}

impl From<EnclaveError> for tonic::Status {
    fn from(e: EnclaveError) -> Self {
        match &e {
            EnclaveError::InvalidArgument(_) => tonic::Status::invalid_argument(e.to_string()),
            EnclaveError::SealAuthentication => tonic::Status::failed_precondition(e.to_string()),
            // A refusal carries its typed reason as the status details (`coffer_proto::refusal_reason`).
            EnclaveError::Refused { reason, evaluation, .. } => tonic::Status::with_details(
                tonic::Code::PermissionDenied,
                e.to_string(),
                coffer_proto::refusal_details(*reason, evaluation).into(),
            ),
            EnclaveError::Busy { reason, .. } => tonic::Status::with_details(
                tonic::Code::ResourceExhausted,
                e.to_string(),
                coffer_proto::refusal_details(*reason, "").into(),
            ),
            EnclaveError::Upstream(_) => tonic::Status::aborted(e.to_string()),
            EnclaveError::Hsm(_) => tonic::Status::unavailable(e.to_string()),
            EnclaveError::Internal(_) => tonic::Status::internal(e.to_string()),
            // The one mapping of the authority store's errors: what can pass by retrying is
            // UNAVAILABLE (the gateway's "retry shortly"), the rest INTERNAL.
            EnclaveError::EnclaveStore(s) => match s {
                StoreError::Unavailable(_)
                | StoreError::VersionMoved { .. }
                | StoreError::Conflict(_)
                | StoreError::NotSpent(_) => tonic::Status::unavailable(e.to_string()),
                StoreError::Corrupt(_) | StoreError::Invalid(_) => tonic::Status::internal(e.to_string()),
            },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_carry_their_decodable_reason_and_the_same_message() {
        let status = tonic::Status::from(EnclaveError::refused(RefusalReason::Stale, "stale or future timestampMs"));
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(status.message(), "enclave refused: stale or future timestampMs");
        assert_eq!(coffer_proto::refusal_reason(&status), Some(RefusalReason::Stale));

        let busy = EnclaveError::Busy {
            reason: RefusalReason::ReplayWindowFull,
            message: "replay window is full: retry shortly".into(),
        };
        let status = tonic::Status::from(busy);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status.message(), "enclave busy: replay window is full: retry shortly");
        assert_eq!(coffer_proto::refusal_reason(&status), Some(RefusalReason::ReplayWindowFull));

        let quota = EnclaveError::Busy { reason: RefusalReason::OrganizationReplayQuota, message: "full".into() };
        let status = tonic::Status::from(quota);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(coffer_proto::refusal_reason(&status), Some(RefusalReason::OrganizationReplayQuota));

        let moved = StoreError::VersionMoved { organization_id: "o".into(), expected: 1, found: Some(2) };
        assert_eq!(tonic::Status::from(EnclaveError::from(moved)).code(), tonic::Code::Unavailable);
        let corrupt = EnclaveError::from(StoreError::Corrupt("x".into()));
        assert_eq!(tonic::Status::from(corrupt).code(), tonic::Code::Internal);

        let other = tonic::Status::from(EnclaveError::invalid("bad"));
        assert_eq!(coffer_proto::refusal_reason(&other), None);
    }
}
