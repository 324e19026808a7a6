//! The HTTP boundary's one error type: a gRPC code, a message and a `TurnkeyErrorCode`, rendered
//! as the gRPC-gateway `Status` JSON the official clients parse.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::store::StoreError;

/// gRPC status codes used on the wire (`code` in the error body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument = 3,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A refused request. Nothing was changed when one of these is returned.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    /// `TurnkeyErrorCode` enum name, e.g. `REQUEST_INVALID`.
    pub turnkey_code: &'static str,
    /// HTTP status override (413 for an oversized body, 405, 408).
    pub status: Option<StatusCode>,
    /// `Retry-After` seconds, for a shed request.
    pub retry_after: Option<u32>,
    /// Why the enclave refused, when it did: the typed reason decisions are made on (never the
    /// message's wording). Not rendered.
    pub refusal: Option<coffer_proto::v1::RefusalReason>,
    /// For a refusal of the organization's rules by the enclave (consensus needed, denied): the
    /// policy outcomes its decision read (JSON text, as recorded). Not rendered.
    pub evaluation: Option<String>,
}

impl ApiError {
    pub fn new(code: Code, turnkey_code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            turnkey_code,
            status: None,
            retry_after: None,
            refusal: None,
            evaluation: None,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, "REQUEST_INVALID", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, "REQUEST_INVALID", message)
    }
    pub fn unauthenticated(turnkey_code: &'static str, message: impl Into<String>) -> Self {
        Self::new(Code::Unauthenticated, turnkey_code, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(Code::PermissionDenied, "REQUEST_NOT_AUTHORIZED", message)
    }
    pub fn internal() -> Self {
        Self::new(Code::Internal, "INTERNAL", "internal server error")
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, "RPC_CALL_ERROR", message)
    }
    /// A request shed because its class is at its in-flight limit: 503 with `Retry-After: 1`.
    /// `class` names the request class (`limits::RequestClass`).
    pub fn overloaded(class: impl std::fmt::Debug) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::unavailable(format!("overloaded: too many {class:?} requests in flight, retry shortly",))
        }
    }
    /// A request over a rate limit: 429 with `Retry-After` (whole seconds, at least 1).
    pub fn rate_limited(what: &str, wait: std::time::Duration) -> Self {
        Self {
            retry_after: Some(wait.as_secs_f64().ceil().max(1.0) as u32),
            ..Self::new(
                Code::ResourceExhausted,
                "RATE_LIMIT_EXCEEDED",
                format!("rate limit exceeded for this {what}, retry shortly"),
            )
        }
    }
    /// A connection past the global or per-address connection cap.
    pub fn overloaded_connections() -> Self {
        Self { retry_after: Some(1), ..Self::unavailable("overloaded: too many open connections, retry shortly") }
    }
    /// The body did not arrive within the body read timeout.
    pub fn body_timeout(after: std::time::Duration) -> Self {
        Self {
            status: Some(StatusCode::REQUEST_TIMEOUT),
            ..Self::invalid(format!("request body not received within {} ms", after.as_millis()))
        }
    }
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: Some(StatusCode::PAYLOAD_TOO_LARGE),
            ..Self::invalid(format!("request body too large: the limit is {limit} bytes"))
        }
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "code": self.code as i32,
            "message": self.message,
            "details": [{
                "@type": "type.googleapis.com/errors.v1.TurnkeyErrorDetail",
                "turnkeyErrorCode": self.turnkey_code,
            }],
            "turnkeyErrorCode": self.turnkey_code,
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status.unwrap_or_else(|| self.code.http_status());
        let mut response = (status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::not_found("not found"),
            StoreError::Conflict(c) if c.kind == crate::store::ConflictKind::NotExported => {
                ApiError::new(Code::InvalidArgument, "WALLET_ACCOUNT_NOT_EXPORTED", c.message)
            }
            StoreError::Conflict(c) => ApiError::invalid(c.message),
            StoreError::Unique(u) => ApiError::invalid(u.message),
            StoreError::Backend(m) => {
                tracing::error!(error = %m, "store failure");
                ApiError::internal()
            }
            StoreError::Busy => {
                tracing::error!("store busy past its retries");
                ApiError::internal()
            }
            // Inside a no-wait attempt whose result is dropped and rerun: not an error.
            StoreError::WouldWait => ApiError::internal(),
        }
    }
}

impl From<coffer_auth::AuthError> for ApiError {
    fn from(e: coffer_auth::AuthError) -> Self {
        let code = match e.code {
            coffer_auth::Code::InvalidArgument => Code::InvalidArgument,
            coffer_auth::Code::Unauthenticated => Code::Unauthenticated,
        };
        ApiError::new(code, e.turnkey_code, e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_shape_and_status() {
        let e = ApiError::unauthenticated("SIGNATURE_INVALID", "could not verify api key signature");
        assert_eq!(e.code.http_status(), StatusCode::UNAUTHORIZED);
        let b = e.body();
        assert_eq!(b["code"], 16);
        assert_eq!(b["details"][0]["turnkeyErrorCode"], "SIGNATURE_INVALID");
        assert_eq!(b["details"][0]["@type"], "type.googleapis.com/errors.v1.TurnkeyErrorDetail");
        assert_eq!(ApiError::too_large(10).into_response().status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(ApiError::unavailable("x").into_response().status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
