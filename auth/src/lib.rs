//! Request authentication shared by the gateway and the enclave: one implementation of stamp
//! verification, envelope parsing and credential grants, the enclave's use being the one that counts.

pub mod attested;
pub mod client_signature;
pub mod envelope;
pub mod grants;
pub mod oidc;
pub mod operator;
pub mod proof;
pub mod session_jwt;
pub mod stamp;
pub mod state_proof;
pub mod verification_token;
pub mod webauthn;

/// How a refused authentication maps onto the HTTP and gRPC boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The request is malformed (HTTP 400).
    InvalidArgument,
    /// The stamp or credential does not authenticate the request (HTTP 401).
    Unauthenticated,
}

/// A refusal with the `TurnkeyErrorCode` the HTTP boundary reports. Messages never carry secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthError {
    pub code: Code,
    /// `TurnkeyErrorCode` enum name, e.g. `SIGNATURE_INVALID`.
    pub turnkey_code: &'static str,
    pub message: String,
}

impl AuthError {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self { code: Code::InvalidArgument, turnkey_code: "REQUEST_INVALID", message: message.into() }
    }
    pub fn unauthenticated(turnkey_code: &'static str, message: impl Into<String>) -> Self {
        Self { code: Code::Unauthenticated, turnkey_code, message: message.into() }
    }
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for AuthError {}

/// Test support: deterministic mutations of untrusted inputs.
#[cfg(test)]
pub(crate) mod testing {
    /// Calls `check` with every truncation of `bytes` and `rounds` single-byte flips of it
    /// (xorshift from `seed`: deterministic, no dependency).
    pub fn for_each_mutation(bytes: &[u8], mut seed: u64, rounds: usize, mut check: impl FnMut(&[u8])) {
        for n in 0..=bytes.len() {
            check(&bytes[..n]);
        }
        for _ in 0..rounds {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut m = bytes.to_vec();
            let at = (seed as usize) % m.len();
            m[at] = (seed >> 32) as u8;
            check(&m);
        }
    }
}
