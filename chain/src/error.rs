//! The one error of transaction parsing: what was refused, safe to show the API caller.

/// Why a transaction was not accepted. The message names the field and is safe to show the
/// API caller (it never contains more than the caller sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TxError(pub String);

impl TxError {
    pub fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}
