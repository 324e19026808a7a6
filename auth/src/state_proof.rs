//! The enclave's signed statement of one organization's state, what its decisions read now (for
//! a verifier's nonce), and its check: what `coffer-gateway diff-state` compares the gateway's
//! answers with.
//!
//! The state travels as JSON bytes beside the proof (`{kind: {id: item}}`, each item as the
//! enclave stores it: `user`, `credential`, `policy`, ...); the proof, a [`proof::payload`] of
//! type [`ORG_STATE`], signs `{organizationId, version, nonce, stateDigest}`, the digest being
//! SHA-256 of those bytes. So the enclave encodes a state once per version and signs a few
//! hundred bytes per request.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::proof::{self, AppProof, ProofError};

/// Coffer's payload type of an organization's state as the enclave holds it when asked.
pub const ORG_STATE: &str = "COFFER_PROOF_TYPE_ORGANIZATION_STATE";
const MEMBER: &str = "organizationState";

/// One item of the state: its kind, its id and its JSON as the enclave stores it.
#[derive(Debug, Clone, Copy)]
pub struct StateItem<'a> {
    pub kind: &'a str,
    pub id: &'a str,
    pub data: &'a [u8],
}

/// The state's bytes for `items` (whose data must be JSON: an item that is not is stated as a
/// string, never dropped).
pub fn encode<'a>(items: impl IntoIterator<Item = StateItem<'a>>) -> Vec<u8> {
    let mut entries: Map<String, Value> = Map::new();
    for item in items {
        let value = serde_json::from_slice(item.data)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(item.data).into_owned()));
        let by_id = entries.entry(item.kind.to_string()).or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(by_id) = by_id {
            by_id.insert(item.id.to_string(), value);
        }
    }
    // A map of strings and parsed JSON always serializes.
    serde_json::to_vec(&entries).unwrap_or_default()
}

/// SHA-256 of the state's bytes, lowercase hex.
pub fn digest(state: &[u8]) -> String {
    hex::encode(Sha256::digest(state))
}

/// Where the organization's activity log stood when its state was read: links appended, head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPosition {
    pub seq: u64,
    pub head: String,
}

/// The payload the enclave signs for `organization_id` at `version`, whose state's bytes have
/// `state_digest`, for the verifier's `nonce`, with its activity log's position then (so an
/// auditor can tie the state to an exported log).
pub fn payload(
    timestamp_ms: i64,
    organization_id: &str,
    version: u64,
    nonce: &str,
    state_digest: &str,
    log: &LogPosition,
) -> String {
    let body = json!({
        "organizationId": organization_id,
        "version": version.to_string(),
        "nonce": nonce,
        "stateDigest": state_digest,
        "logSeq": log.seq.to_string(),
        "logHead": log.head,
    });
    proof::payload(ORG_STATE, timestamp_ms, MEMBER, body)
}

/// What a state proof that verifies states.
#[derive(Debug, Clone, PartialEq)]
pub struct SignedState {
    pub organization_id: String,
    /// The state's version in the enclave's store (0: the enclave has no state for it).
    pub version: u64,
    /// When the enclave signed it (its clock, ms since the epoch).
    pub timestamp_ms: i64,
    /// The organization's activity log then.
    pub log: LogPosition,
    /// Kind → id → item, as the enclave stores it.
    pub entries: Map<String, Value>,
}

impl SignedState {
    /// The items of one kind, by id (none: an empty map).
    pub fn kind(&self, kind: &str) -> Map<String, Value> {
        self.entries.get(kind).and_then(Value::as_object).cloned().unwrap_or_default()
    }
}

/// Checks `proof` as signed by the proof key `key` for `organization_id` and the verifier's
/// `nonce` (so an answer given to an earlier request, which may predate changes since, does not
/// pass), and `state` as the bytes it signed, and returns what they state.
pub fn verify(
    proof: &AppProof,
    state: &[u8],
    key: &[u8; 65],
    organization_id: &str,
    nonce: &str,
) -> Result<SignedState, ProofError> {
    let payload = proof::verify(proof, Some(key))?;
    if payload.get("type").and_then(Value::as_str) != Some(ORG_STATE) {
        return Err(ProofError::Payload("not an organization state"));
    }
    let timestamp_ms = decimal(payload.get("timestampMs")).ok_or(ProofError::Payload("no timestampMs"))?;
    let body = payload.get(MEMBER).and_then(Value::as_object).ok_or(ProofError::Payload("no organizationState"))?;
    if body.get("organizationId").and_then(Value::as_str) != Some(organization_id) {
        return Err(ProofError::Payload("the state is another organization's"));
    }
    if body.get("nonce").and_then(Value::as_str) != Some(nonce) {
        return Err(ProofError::Payload("the state does not carry this request's nonce: it answered another request"));
    }
    if body.get("stateDigest").and_then(Value::as_str) != Some(digest(state).as_str()) {
        return Err(ProofError::Payload("the state is not the one signed (its digest differs)"));
    }
    let version = decimal(body.get("version")).ok_or(ProofError::Payload("no version"))?;
    let log = LogPosition {
        seq: decimal(body.get("logSeq")).ok_or(ProofError::Payload("no logSeq"))?,
        head: body.get("logHead").and_then(Value::as_str).ok_or(ProofError::Payload("no logHead"))?.to_string(),
    };
    let entries = match serde_json::from_slice(state) {
        Ok(Value::Object(entries)) => entries,
        _ => return Err(ProofError::Payload("the state is not a JSON object")),
    };
    Ok(SignedState { organization_id: organization_id.to_string(), version, timestamp_ms, log, entries })
}

/// The number `member` states as a decimal string (JSON numbers lose precision in JavaScript).
fn decimal<T: std::str::FromStr>(member: Option<&Value>) -> Option<T> {
    member?.as_str()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer;

    fn signed(key: &p256::ecdsa::SigningKey, payload: String) -> AppProof {
        let point: [u8; 65] = key.verifying_key().to_encoded_point(false).as_bytes().try_into().unwrap();
        let signature: p256::ecdsa::Signature = key.sign(payload.as_bytes());
        proof::app_proof(&point, payload, &signature.to_bytes().into())
    }

    fn point(key: &p256::ecdsa::SigningKey) -> [u8; 65] {
        key.verifying_key().to_encoded_point(false).as_bytes().try_into().unwrap()
    }

    #[test]
    fn a_state_verifies_for_its_organization_nonce_and_bytes_only() {
        let key = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let items = [
            StateItem { kind: "policy", id: "p1", data: br#"{"id":"p1","effect":"EFFECT_ALLOW"}"# },
            StateItem { kind: "policy", id: "p2", data: br#"{"id":"p2","effect":"EFFECT_DENY"}"# },
            StateItem { kind: "user", id: "u1", data: b"not json" },
        ];
        let state = encode(items);
        let nonce = "00112233445566778899";
        let log = LogPosition { seq: 42, head: "ab".repeat(32) };
        let proof = signed(&key, payload(1_700_000_000_000, "org", 7, nonce, &digest(&state), &log));
        let verified = verify(&proof, &state, &point(&key), "org", nonce).unwrap();
        assert_eq!((verified.version, verified.timestamp_ms, &verified.log), (7, 1_700_000_000_000, &log));
        assert_eq!(verified.kind("policy")["p2"]["effect"], "EFFECT_DENY");
        assert_eq!(verified.kind("user")["u1"], "not json");
        assert!(verified.kind("wallet").is_empty());

        let refused = |r: Result<SignedState, ProofError>| r.unwrap_err();
        assert!(matches!(refused(verify(&proof, &state, &point(&key), "other", nonce)), ProofError::Payload(_)));
        assert!(matches!(
            refused(verify(&proof, &state, &point(&key), "org", "ffffffffffffffff")),
            ProofError::Payload(_)
        ));
        let other = p256::ecdsa::SigningKey::from_slice(&[8u8; 32]).unwrap();
        assert_eq!(refused(verify(&proof, &state, &point(&other), "org", nonce)), ProofError::OtherKey);
        // The state's bytes changed (a policy's effect): not the one signed.
        let forged = String::from_utf8(state.clone()).unwrap().replace("EFFECT_DENY", "EFFECT_ALLW");
        assert!(matches!(
            refused(verify(&proof, forged.as_bytes(), &point(&key), "org", nonce)),
            ProofError::Payload(_)
        ));
        // The statement changed: the signature breaks.
        let mut edited = proof.clone();
        edited.proof_payload = edited.proof_payload.replace("\"7\"", "\"8\"");
        assert_eq!(refused(verify(&edited, &state, &point(&key), "org", nonce)), ProofError::Signature);
        // A log head is no state.
        let head = signed(&key, proof::log_head_payload(1, "org", 0, "h", Some(nonce)));
        assert!(matches!(refused(verify(&head, &state, &point(&key), "org", nonce)), ProofError::Payload(_)));
    }
}
