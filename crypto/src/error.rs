//! The one error type of the key-material functions.

/// A refusal or failure of a key-material function. Messages never carry key material.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// Malformed or unsupported input: the message is safe to show to the API caller.
    #[error("{0}")]
    InvalidArgument(String),
    /// Something that cannot happen with valid input (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

impl CryptoError {
    /// Shorthand for [`CryptoError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }
}
