//! The submission envelope (`type`, `timestampMs`, `organizationId`, `parameters`) as both sides
//! read it, its fingerprint, and the ids an activity derives from its fingerprint.

use serde_json::Value;
use sha2::Digest;

use crate::AuthError;

/// `"sha256:" + hex(sha256(raw body))`, as `@turnkey/crypto computeActivityFingerprint`.
pub fn fingerprint(body: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(body)))
}

/// Removes `null` members from objects, recursively (the Rust client sends unset options as null).
pub fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            Value::Object(map.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, strip_nulls(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

/// The string member `key` of a body's parameters (empty when absent or not a string).
pub fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The array member `key` of a body's parameters (empty when absent or not an array).
pub fn items<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[])
}

/// A submission as stamped: what the enclave derives every operation from.
#[derive(Debug, Clone, PartialEq)]
pub struct StampedActivity {
    pub activity_type: String,
    pub timestamp_ms: i64,
    pub organization_id: String,
    /// The intent parameters with every `null` member removed (null means absent).
    pub parameters: Value,
    /// [`fingerprint`] of the exact body.
    pub fingerprint: String,
    /// The body asks for app proofs: `generateAppProofs: true` at the top level (where the
    /// interface puts it) or among the parameters (where some SDKs copy it).
    pub generate_app_proofs: bool,
}

impl StampedActivity {
    /// Parses a submission body. Time windows are the caller's: the gateway and the enclave
    /// apply their own.
    pub fn parse(body: &[u8]) -> Result<Self, AuthError> {
        let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(body) else {
            return Err(AuthError::invalid("stamped body is not a JSON object"));
        };
        let text = |map: &serde_json::Map<String, Value>, key: &str| match map.get(key) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            _ => Err(AuthError::invalid(format!("stamped body has no {key}"))),
        };
        let activity_type = text(&map, "type")?;
        let organization_id = text(&map, "organizationId")?;
        let timestamp_ms = match map.get("timestampMs") {
            Some(Value::String(s)) => s.parse::<i64>().ok(),
            Some(Value::Number(n)) => n.as_i64(),
            _ => None,
        }
        .ok_or_else(|| AuthError::invalid("stamped body has no valid timestampMs"))?;
        let asks =
            |v: Option<&Value>| v.and_then(|v| v.get("generateAppProofs")).and_then(Value::as_bool) == Some(true);
        let generate_app_proofs =
            map.get("generateAppProofs").and_then(Value::as_bool) == Some(true) || asks(map.get("parameters"));
        let parameters = match map.remove("parameters") {
            Some(p @ Value::Object(_)) => strip_nulls(p),
            _ => return Err(AuthError::invalid("stamped body has no parameters object")),
        };
        Ok(Self {
            activity_type,
            timestamp_ms,
            organization_id,
            parameters,
            fingerprint: fingerprint(body),
            generate_app_proofs,
        })
    }
}

/// An id an activity derives from its own fingerprint (users it creates, the sub-organization
/// it creates), so the enclave can recompute which ids a stamped body names without trusting
/// the gateway's choice. Formatted as a version-4 UUID.
pub fn derived_id(fingerprint: &str, label: &str, index: usize) -> String {
    let mut h = sha2::Sha256::new();
    for field in [b"coffer-derived-id-v1".as_slice(), label.as_bytes(), fingerprint.as_bytes()] {
        h.update((field.len() as u32).to_be_bytes());
        h.update(field);
    }
    h.update((index as u64).to_be_bytes());
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid().to_string()
}

/// Labels of [`derived_id`].
pub const USER_ID: &str = "user";
pub const SUB_ORGANIZATION_ID: &str = "sub-organization";
pub const WALLET_ID: &str = "wallet";
pub const WALLET_ACCOUNT_ID: &str = "wallet-account";
pub const PRIVATE_KEY_ID: &str = "private-key";
/// An activity's own id: one per stamped body, so the log cannot be made to refuse its link as
/// another activity's.
pub const ACTIVITY_ID: &str = "activity";

/// The first `n` ids of `label` [`derived_id`] gives for `fingerprint`, in order.
pub fn derived_ids(fingerprint: &str, label: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| derived_id(fingerprint, label, i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_fingerprints_the_exact_bytes() {
        let body = br#"{"type":"T","timestampMs":"5","organizationId":"o","parameters":{"a":null,"b":[{"c":null}]}}"#;
        let a = StampedActivity::parse(body).unwrap();
        assert_eq!((a.activity_type.as_str(), a.timestamp_ms, a.organization_id.as_str()), ("T", 5, "o"));
        assert_eq!(a.parameters, serde_json::json!({"b": [{}]}));
        assert_eq!(a.fingerprint, fingerprint(body));
        assert!(a.fingerprint.starts_with("sha256:") && a.fingerprint.len() == 71);
        for bad in [&b"[]"[..], b"{}", br#"{"type":"T","organizationId":"o","parameters":{}}"#, b"\xff"] {
            assert!(StampedActivity::parse(bad).is_err());
        }
    }

    #[test]
    fn derived_ids_are_uuids_that_differ_by_every_input() {
        let a = derived_id("sha256:1", USER_ID, 0);
        assert_eq!(uuid::Uuid::parse_str(&a).unwrap().get_version_num(), 4);
        assert_eq!(a, derived_id("sha256:1", USER_ID, 0));
        assert_ne!(a, derived_id("sha256:2", USER_ID, 0));
        assert_ne!(a, derived_id("sha256:1", USER_ID, 1));
        assert_ne!(a, derived_id("sha256:1", SUB_ORGANIZATION_ID, 0));
    }
}
