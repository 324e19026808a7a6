//! The parse and validation error of the policy language.

use std::fmt;

/// A parse or validation error, with the 1-based column (in characters) where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub column: usize,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at column {}", self.message, self.column)
    }
}

impl std::error::Error for PolicyError {}
