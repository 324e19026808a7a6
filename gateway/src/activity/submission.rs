//! The submission envelope (`type`, `timestampMs`, `organizationId`, `parameters`), its
//! liveness window and its fingerprint.

use serde_json::Value;

use crate::error::ApiError;

/// Activities older than this are refused (DOCS: one hour).
pub const MAX_AGE_MS: i64 = 60 * 60 * 1000;
/// Activities dated further ahead than this are refused (DOCS: five minutes).
pub const MAX_SKEW_MS: i64 = 5 * 60 * 1000;

/// A decoded submission.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub activity_type: String,
    pub timestamp_ms: i64,
    pub organization_id: String,
    /// The intent parameters with every `null` member removed (null means absent).
    pub parameters: Value,
}

pub use coffer_auth::envelope::{fingerprint, strip_nulls};

/// Parses a request body as a JSON object; anything else is "bad request body".
pub fn parse_body(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid("bad request body: expected a JSON object")),
        Err(e) => Err(ApiError::invalid(format!("bad request body: {e}"))),
    }
}

/// The `organizationId` member every request carries.
pub fn organization_id(body: &serde_json::Map<String, Value>) -> Result<String, ApiError> {
    match body.get("organizationId") {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => Err(ApiError::invalid("missing organizationId")),
        Some(_) => Err(ApiError::invalid("malformed organization ID provided")),
    }
}

impl Envelope {
    /// Decodes and checks the envelope; `now_ms` is the server clock.
    pub fn decode(body: serde_json::Map<String, Value>, now_ms: i64) -> Result<Self, ApiError> {
        let organization_id = organization_id(&body)?;
        let activity_type = match body.get("type") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(ApiError::invalid("bad request body: missing activity type")),
        };
        let timestamp_ms = match body.get("timestampMs") {
            Some(Value::String(s)) => s.parse::<i64>().ok(),
            Some(Value::Number(n)) => n.as_i64(),
            _ => None,
        }
        .ok_or_else(|| {
            ApiError::invalid("bad request body: timestampMs must be a decimal string of Unix milliseconds")
        })?;
        if now_ms - timestamp_ms > MAX_AGE_MS {
            return Err(ApiError::invalid("activity timestampMs is more than 1 hour in the past"));
        }
        if timestamp_ms - now_ms > MAX_SKEW_MS {
            return Err(ApiError::invalid("activity timestampMs is more than 5 minutes in the future"));
        }
        let parameters = match body.get("parameters") {
            Some(v @ Value::Object(_)) => strip_nulls(v.clone()),
            _ => return Err(ApiError::invalid("bad request body: missing parameters object")),
        };
        Ok(Self { activity_type, timestamp_ms, organization_id, parameters })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn fingerprint_matches_spec_vector() {
        let b = br#"{"organizationId":"00000000-0000-4000-8000-000000000000"}"#;
        assert_eq!(fingerprint(b), "sha256:f61774c4e8eabf6377930808ee4bb02fd0c1d65adc1ca692c84b6c8c134e043d");
    }

    #[test]
    fn liveness_window() {
        let now = 1_700_000_000_000i64;
        let mk = |ts: i64| body(json!({"type":"T","timestampMs": ts.to_string(),"organizationId":"o","parameters":{}}));
        assert!(Envelope::decode(mk(now), now).is_ok());
        assert!(Envelope::decode(mk(now - MAX_AGE_MS + 1000), now).is_ok());
        assert!(Envelope::decode(mk(now - MAX_AGE_MS - 1), now).unwrap_err().message.contains("1 hour"));
        assert!(Envelope::decode(mk(now + MAX_SKEW_MS - 1000), now).is_ok());
        assert!(Envelope::decode(mk(now + MAX_SKEW_MS + 1), now).unwrap_err().message.contains("future"));
    }

    #[test]
    fn nulls_are_absent_and_shape_is_checked() {
        let now = 1_700_000_000_000i64;
        let e = Envelope::decode(
            body(json!({"type":"T","timestampMs": now.to_string(),"organizationId":"o","parameters":{"a":null,"b":[{"c":null,"d":1}]},"generateAppProofs":null})),
            now,
        )
        .unwrap();
        assert_eq!(e.parameters, json!({"b":[{"d":1}]}));
        assert!(Envelope::decode(
            body(json!({"type":"T","timestampMs":"x","organizationId":"o","parameters":{}})),
            now
        )
        .is_err());
        assert!(Envelope::decode(body(json!({"type":"T","timestampMs":"1","organizationId":5,"parameters":{}})), now)
            .unwrap_err()
            .message
            .contains("malformed organization ID"));
        assert!(parse_body(b"[1]").is_err());
        assert!(parse_body(b"{").unwrap_err().message.starts_with("bad request body"));
    }
}
