//! App proofs, boot proofs and the activity log's hash chain: the formats the enclave signs and
//! every verifier (the enclave itself, `coffer-gateway verify-log`, tests) checks, written once.
//!
//! A proof is the hosted service's `v1AppProof`: `{scheme, publicKey, proofPayload, signature}`,
//! where `publicKey` is 130 bytes of hex (encryption key ‖ signing key, both uncompressed P-256)
//! and `signature` is r ‖ s over SHA-256 of the payload's UTF-8 bytes, so `@turnkey/crypto`'s
//! `verifyAppProofSignature` accepts Coffer's proofs unchanged. Coffer's proof key only signs: it
//! stands in both halves of `publicKey` (there is no ephemeral encryption key).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The only scheme the official verifiers accept.
pub const SCHEME: &str = "SIGNATURE_SCHEME_EPHEMERAL_KEY_P256";
/// `AppProofPayload.type` of one derived address.
pub const ADDRESS_DERIVATION: &str = "APP_PROOF_TYPE_ADDRESS_DERIVATION";
/// `AppProofPayload.type` of the enclave's decision on an activity.
pub const POLICY_OUTCOME: &str = "APP_PROOF_TYPE_POLICY_OUTCOME";
/// Coffer's payload type of one link of an organization's activity log.
pub const LOG_LINK: &str = "COFFER_PROOF_TYPE_ACTIVITY_LOG_LINK";
/// Coffer's payload type of the log's head as the enclave read it when asked.
pub const LOG_HEAD: &str = "COFFER_PROOF_TYPE_ACTIVITY_LOG_HEAD";
/// Coffer's payload type of a boot proof (its manifest).
pub const BOOT: &str = "COFFER_PROOF_TYPE_BOOT";
/// Activity members a digest leaves out: they depend on who reads the activity.
const VIEWER_MEMBERS: [&str; 2] = ["canApprove", "canReject"];

/// One signed statement of the enclave, as the wire carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppProof {
    pub scheme: String,
    pub public_key: String,
    pub proof_payload: String,
    pub signature: String,
}

/// `publicKey` of Coffer's proofs: the proof key's uncompressed point twice, lowercase hex.
pub fn proof_public_key_hex(point: &[u8; 65]) -> String {
    let one = hex::encode(point);
    format!("{one}{one}")
}

/// The proof of `payload` signed `signature` (r ‖ s) by the key `point`.
pub fn app_proof(point: &[u8; 65], payload: String, signature: &[u8; 64]) -> AppProof {
    AppProof {
        scheme: SCHEME.to_string(),
        public_key: proof_public_key_hex(point),
        proof_payload: payload,
        signature: hex::encode(signature),
    }
}

/// What a proof key signs for `payload`: SHA-256 of its UTF-8 bytes.
pub fn payload_digest(payload: &str) -> [u8; 32] {
    Sha256::digest(payload.as_bytes()).into()
}

/// Why a proof or a log does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("unsupported signature scheme")]
    Scheme,
    #[error("the public key is not 130 bytes of hex holding an uncompressed P-256 signing key")]
    PublicKey,
    #[error("the proof is signed by another key than the expected proof key")]
    OtherKey,
    #[error("the signature is not 64 bytes of hex")]
    SignatureEncoding,
    #[error("the signature does not verify over the payload")]
    Signature,
    #[error("the payload is not the JSON statement it should be: {0}")]
    Payload(&'static str),
}

/// Checks `proof` as `verifyAppProofSignature` does (scheme, key, r ‖ s over SHA-256 of the
/// payload; high-S accepted), and, when `expected` is given, that the signing key is that proof
/// key. Returns the parsed payload.
pub fn verify(proof: &AppProof, expected: Option<&[u8; 65]>) -> Result<Value, ProofError> {
    if proof.scheme != SCHEME {
        return Err(ProofError::Scheme);
    }
    let key = hex::decode(&proof.public_key).map_err(|_| ProofError::PublicKey)?;
    if key.len() != 130 || key[65] != 0x04 {
        return Err(ProofError::PublicKey);
    }
    if expected.is_some_and(|e| e[..] != key[65..]) {
        return Err(ProofError::OtherKey);
    }
    p256::PublicKey::from_sec1_bytes(&key[65..]).map_err(|_| ProofError::PublicKey)?;
    let signature = hex::decode(&proof.signature).map_err(|_| ProofError::SignatureEncoding)?;
    if signature.len() != 64 {
        return Err(ProofError::SignatureEncoding);
    }
    // ring's assembly P-256 (as for stamps): a log holds thousands of signed links.
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &key[65..])
        .verify(proof.proof_payload.as_bytes(), &signature)
        .map_err(|_| ProofError::Signature)?;
    serde_json::from_str(&proof.proof_payload).map_err(|_| ProofError::Payload("not JSON"))
}

/// The payload of one proof: `{"type", "timestampMs", <member>: body}`, compact, in that order
/// (the order the hosted service writes; the signature covers these exact bytes).
pub fn payload(kind: &str, timestamp_ms: i64, member: &str, body: Value) -> String {
    let mut out = String::from("{\"type\":");
    out.push_str(&Value::from(kind).to_string());
    out.push_str(",\"timestampMs\":");
    out.push_str(&Value::from(timestamp_ms.to_string()).to_string());
    out.push(',');
    out.push_str(&Value::from(member).to_string());
    out.push(':');
    out.push_str(&body.to_string());
    out.push('}');
    out
}

/// JSON with object members sorted by key and no whitespace: what digests are taken over.
pub fn canonical_json(v: &Value) -> String {
    let mut out = Vec::with_capacity(256);
    write_canonical(v, &[], &mut out);
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

/// Writes the canonical JSON of `v` into `out`, leaving out the top-level members named in
/// `skip`; keys and scalars are serialized straight into `out` (no string per member: this runs
/// for every recorded activity).
fn write_canonical(v: &Value, skip: &[&str], out: &mut impl std::io::Write) {
    // Writes into a Vec or a hash cannot fail.
    match v {
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().filter(|(k, _)| !skip.contains(&k.as_str())).collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let _ = out.write_all(b"{");
            for (i, (k, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                let _ = serde_json::to_writer(&mut *out, k);
                let _ = out.write_all(b":");
                write_canonical(value, &[], out);
            }
            let _ = out.write_all(b"}");
        }
        Value::Array(a) => {
            let _ = out.write_all(b"[");
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                write_canonical(x, &[], out);
            }
            let _ = out.write_all(b"]");
        }
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// SHA-256 fed as bytes are written (the canonical JSON is hashed without being kept).
struct Hashing(Sha256);

impl std::io::Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn digest_skipping(v: &Value, skip: &[&str]) -> String {
    let mut hashing = Hashing(Sha256::new());
    write_canonical(v, skip, &mut hashing);
    hex::encode(hashing.0.finalize())
}

/// SHA-256 of the canonical JSON of `v`, lowercase hex.
pub fn json_digest(v: &Value) -> String {
    digest_skipping(v, &[])
}

/// The digest the log chains for a recorded activity (the API's `Activity` object): every member
/// but those that depend on the reader.
pub fn activity_digest(activity: &Value) -> String {
    digest_skipping(activity, &VIEWER_MEMBERS)
}

/// The head of an organization's log before its first link.
pub fn genesis(organization_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"coffer-activity-log-v1\0");
    h.update(organization_id.as_bytes());
    hex::encode(h.finalize())
}

/// The head after link `seq` (from 1) chains `activity_digest` of `activity_id` onto `previous`.
pub fn next_head(previous: &str, seq: u64, activity_id: &str, activity_digest: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"coffer-activity-log-link-v1\0");
    h.update(previous.as_bytes());
    h.update(b"\0");
    h.update(seq.to_be_bytes());
    h.update(activity_id.as_bytes());
    h.update(b"\0");
    h.update(activity_digest.as_bytes());
    hex::encode(h.finalize())
}

/// One link of an organization's activity log, as the enclave signs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogLink {
    pub organization_id: String,
    /// Position in the log, from 1, as a decimal string (JSON numbers lose precision in JS).
    pub seq: String,
    pub activity_id: String,
    /// The activity's fingerprint and type, as the stamped request the enclave verified names them.
    pub fingerprint: String,
    pub activity_type: String,
    pub status: String,
    pub activity_digest: String,
    pub previous: String,
    pub head: String,
}

impl LogLink {
    /// The signed payload of this link, recorded at `timestamp_ms`.
    pub fn payload(&self, timestamp_ms: i64) -> String {
        // A struct of strings always serializes.
        let body = serde_json::to_value(self).unwrap_or_default();
        payload(LOG_LINK, timestamp_ms, "activityLogLink", body)
    }

    /// The link a verified `proof` states.
    pub fn from_payload(payload: &Value) -> Result<Self, ProofError> {
        if payload.get("type").and_then(Value::as_str) != Some(LOG_LINK) {
            return Err(ProofError::Payload("not an activity log link"));
        }
        let body = payload.get("activityLogLink").cloned().ok_or(ProofError::Payload("no activityLogLink"))?;
        serde_json::from_value(body).map_err(|_| ProofError::Payload("malformed activityLogLink"))
    }

    pub fn seq(&self) -> Option<u64> {
        self.seq.parse().ok()
    }
}

/// The log's head as the enclave read it from its own store: `{organizationId, seq, head}`, and
/// the `nonce` its verifier chose, when one did (so that this head answers that request only).
pub fn log_head_payload(timestamp_ms: i64, organization_id: &str, seq: u64, head: &str, nonce: Option<&str>) -> String {
    let mut body = json!({ "organizationId": organization_id, "seq": seq.to_string(), "head": head });
    if let Some(nonce) = nonce {
        body["nonce"] = Value::from(nonce);
    }
    payload(LOG_HEAD, timestamp_ms, "activityLogHead", body)
}

/// Whether `nonce` is one a verifier may ask a head for: 16 to 128 hex digits (64 bits or more).
pub fn is_log_nonce(nonce: &str) -> bool {
    (16..=128).contains(&nonce.len()) && nonce.bytes().all(|b| b.is_ascii_hexdigit())
}

/// An exported log: the signed head, the links in order, and the activities as the API serves them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportedLog {
    pub organization_id: String,
    /// The nonce the exporter asked the head for (absent in exports made without one): the head
    /// must carry it, or it answered an earlier request and may hide newer links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    pub head: AppProof,
    pub links: Vec<AppProof>,
    pub activities: Vec<Value>,
}

/// What a log that verifies holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogVerified {
    pub links: u64,
    /// Completed, failed or rejected activities the log has no link for (recorded before the log
    /// existed, or while the enclave could not be reached): listed, not a break of the chain.
    pub unlogged: Vec<String>,
    /// When the enclave signed the head (its clock, ms since the epoch).
    pub head_timestamp_ms: i64,
    /// The head carries the export's nonce: it was signed for this export, so no link the
    /// enclave had made by then is missing. `false`: an export without a nonce, whose head may be
    /// any earlier one (never `false` for an export with one: a head without it does not verify).
    pub fresh: bool,
}

/// Where an exported log stops verifying: the first link (by position) that does not, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("link {seq} (activity {activity_id}) does not verify: {reason}")]
pub struct LogFault {
    pub seq: u64,
    pub activity_id: String,
    pub reason: String,
}

/// Statuses after which an activity no longer changes: what the log records.
pub const FINAL_STATUSES: [&str; 3] =
    ["ACTIVITY_STATUS_COMPLETED", "ACTIVITY_STATUS_FAILED", "ACTIVITY_STATUS_REJECTED"];

/// Checks an exported log against the proof key `key`: the head and every signed link are signed
/// by it (a link appended inside a group carries no signature of its own: the group's last link
/// covers it), the links follow each other from the genesis to the signed head, and each link's
/// digest is that of the activity it names as exported. Names the first link (or the missing one)
/// that does not.
pub fn verify_log(log: &ExportedLog, key: &[u8; 65]) -> Result<LogVerified, LogFault> {
    let fault =
        |seq: u64, activity_id: &str, reason: String| LogFault { seq, activity_id: activity_id.to_string(), reason };
    let head = verify(&log.head, Some(key)).map_err(|e| fault(0, "", format!("the signed head: {e}")))?;
    let head_body = head.get("activityLogHead").filter(|_| head.get("type").and_then(Value::as_str) == Some(LOG_HEAD));
    let head_body = head_body.ok_or_else(|| fault(0, "", "the head is not an activity log head".into()))?;
    let head_seq: u64 = head_body.get("seq").and_then(Value::as_str).and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
    let head_hash = head_body.get("head").and_then(Value::as_str).unwrap_or_default();
    if head_body.get("organizationId").and_then(Value::as_str) != Some(log.organization_id.as_str()) {
        return Err(fault(0, "", "the signed head is another organization's".into()));
    }
    if let Some(nonce) = &log.nonce {
        if head_body.get("nonce").and_then(Value::as_str) != Some(nonce.as_str()) {
            return Err(fault(
                0,
                "",
                "the signed head does not carry the export's nonce: it answered another request and may hide newer links"
                    .into(),
            ));
        }
    }
    let head_timestamp_ms =
        head.get("timestampMs").and_then(Value::as_str).and_then(|t| t.parse().ok()).unwrap_or_default();
    let activities: std::collections::HashMap<&str, &Value> =
        log.activities.iter().filter_map(|a| Some((a.get("id")?.as_str()?, a))).collect();
    let mut previous = genesis(&log.organization_id);
    let mut seen = std::collections::HashSet::new();
    let mut expected_seq = 1u64;
    let mut last_id = String::new();
    for proof in &log.links {
        // A link without a signature was appended in a group whose last link (or a later head)
        // is signed: the chain recomputed through it must reach that signature.
        let payload = if proof.signature.is_empty() {
            // Nor is it exempt from naming the scheme and the proof key that cover it.
            if proof.scheme != SCHEME {
                return Err(fault(expected_seq, "", ProofError::Scheme.to_string()));
            }
            if proof.public_key != proof_public_key_hex(key) {
                return Err(fault(expected_seq, "", ProofError::OtherKey.to_string()));
            }
            serde_json::from_str(&proof.proof_payload)
                .map_err(|_| fault(expected_seq, "", "an unsigned link is not JSON".into()))?
        } else {
            verify(proof, Some(key)).map_err(|e| fault(expected_seq, "", e.to_string()))?
        };
        let link = LogLink::from_payload(&payload).map_err(|e| fault(expected_seq, "", e.to_string()))?;
        let id = link.activity_id.clone();
        if link.organization_id != log.organization_id {
            return Err(fault(expected_seq, &id, "the link is another organization's".into()));
        }
        match link.seq() {
            Some(s) if s == expected_seq => {}
            Some(s) if s > expected_seq => {
                return Err(fault(
                    expected_seq,
                    &id,
                    format!(
                        "link {expected_seq} is missing or moved: after activity {last_id:?} comes link {s}, of this activity"
                    ),
                ))
            }
            _ => return Err(fault(expected_seq, &id, format!("the link is out of place (it says {})", link.seq))),
        }
        if link.previous != previous {
            return Err(fault(expected_seq, &id, "it does not follow the link before it".into()));
        }
        let Some(activity) = activities.get(id.as_str()) else {
            return Err(fault(expected_seq, &id, "the activity is missing from the export".into()));
        };
        let field = |k: &str| activity.get(k).and_then(Value::as_str).unwrap_or_default();
        // The status too: an unsigned link's is covered by nothing else.
        if field("fingerprint") != link.fingerprint
            || field("type") != link.activity_type
            || field("status") != link.status
        {
            return Err(fault(
                expected_seq,
                &id,
                "the activity's fingerprint, type or status is not the one recorded".into(),
            ));
        }
        if activity_digest(activity) != link.activity_digest {
            return Err(fault(expected_seq, &id, "the activity is not what was recorded (its digest differs)".into()));
        }
        let head = next_head(&previous, expected_seq, &id, &link.activity_digest);
        if head != link.head {
            return Err(fault(expected_seq, &id, "the link's head is not the hash of its contents".into()));
        }
        previous = head;
        seen.insert(id.clone());
        last_id = id;
        expected_seq += 1;
    }
    let count = expected_seq - 1;
    if count < head_seq {
        return Err(fault(
            expected_seq,
            "",
            format!("the log ends at {count} (activity {last_id:?}) but the enclave's head is at {head_seq}"),
        ));
    }
    if count > head_seq || previous != head_hash {
        return Err(fault(head_seq, &last_id, "the links do not end at the enclave's signed head".into()));
    }
    let unlogged = log
        .activities
        .iter()
        .filter(|a| FINAL_STATUSES.contains(&a.get("status").and_then(Value::as_str).unwrap_or_default()))
        .filter_map(|a| a.get("id").and_then(Value::as_str))
        .filter(|id| !seen.contains(*id))
        .map(str::to_string)
        .collect();
    Ok(LogVerified { links: count, unlogged, head_timestamp_ms, fresh: log.nonce.is_some() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer;

    /// The canonical JSON as first written (a string per key and scalar), to hold the streaming
    /// writer to the same bytes: digests already in activity logs must not change.
    fn canonical_reference(v: &Value) -> String {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let members: Vec<String> = keys
                    .iter()
                    .map(|k| format!("{}:{}", Value::from(k.as_str()), canonical_reference(&m[*k])))
                    .collect();
                format!("{{{}}}", members.join(","))
            }
            Value::Array(a) => format!("[{}]", a.iter().map(canonical_reference).collect::<Vec<_>>().join(",")),
            other => other.to_string(),
        }
    }

    #[test]
    fn canonical_json_is_byte_for_byte_what_it_was() {
        let v = json!({
            "z": [1, -2.5, 1e300, null, true, "a\"b\\c\u{1}\n", {"b": 1, "a": [{}], "é": "ü😀"}],
            "a": {"y": {"x": []}, "canApprove": true},
            "canApprove": false, "canReject": true, "": "", "m": u64::MAX, "n": i64::MIN
        });
        assert_eq!(canonical_json(&v), canonical_reference(&v));
        assert!(canonical_json(&v).starts_with(r#"{"":"","a":{"canApprove":true,"y""#));
        assert_eq!(json_digest(&v), hex::encode(Sha256::digest(canonical_reference(&v).as_bytes())));
        // The activity digest leaves out the reader's members at the top level only.
        let mut kept = v.as_object().unwrap().clone();
        kept.remove("canApprove");
        kept.remove("canReject");
        assert_eq!(
            activity_digest(&v),
            hex::encode(Sha256::digest(canonical_reference(&Value::Object(kept)).as_bytes()))
        );
        assert_ne!(activity_digest(&v), json_digest(&v));
    }

    fn key() -> (p256::ecdsa::SigningKey, [u8; 65]) {
        let sk = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let point: [u8; 65] = sk.verifying_key().to_encoded_point(false).as_bytes().try_into().unwrap();
        (sk, point)
    }

    fn sign(sk: &p256::ecdsa::SigningKey, point: &[u8; 65], payload: String) -> AppProof {
        let sig: p256::ecdsa::Signature = sk.sign(payload.as_bytes());
        app_proof(point, payload, &sig.to_bytes().into())
    }

    /// The hosted service's own vector (its SDKs' `testAppProof1`): our verifier accepts what
    /// theirs does, a high-S signature included, and refuses it with a byte changed.
    #[test]
    fn the_hosted_services_vector_verifies() {
        let proof = AppProof {
            scheme: SCHEME.into(),
            public_key: concat!(
                "043144c138d522996833f9a5352b98da2ba669f1ab3f712b243a1993c89c7d682f2163c4c63c6625c483cd5e8714e9a2039e1ec05cebadf469a4adb7e721d16e19",
                "047b2846a313c6f3c543c23ae9779118c2411b28bd5d76b25572903c360240c841f4c4a3af4a297d770e9d8bceb5e7e5be31a8fe16e571b452e3de99ffcebcb2e1"
            )
            .into(),
            proof_payload: concat!(
                r#"{"type":"APP_PROOF_TYPE_ADDRESS_DERIVATION","timestampMs":"1758058763571","addressDerivationProof":"#,
                r#"{"organizationId":"3a2de333-972b-45bf-8a7a-83c4167b81e2","walletId":"ad8a06ec-c2f4-55f2-ac43-65991efbfdd1","#,
                r#""derivationPath":"m/44'/60'/0'/0/0","address":"0xb84b4730Cd81Bc82Ee6B1dE6c343Ebd7928138DC"}}"#
            )
            .into(),
            signature: concat!(
                "712bd9b77bd19430c90dbd8fde1d5b1d1d6f18ec7e9534b7a68a42544c76ba75",
                "a7cf1fc39583df3bed3ca394b721c6ab1fef8db7794e5ef6a97b1ca45d7a5247"
            )
            .into(),
        };
        let body = verify(&proof, None).unwrap();
        assert_eq!(body["addressDerivationProof"]["derivationPath"], "m/44'/60'/0'/0/0");
        let mut changed = proof.clone();
        changed.proof_payload = changed.proof_payload.replace("1758058763571", "1758058763572");
        assert_eq!(verify(&changed, None), Err(ProofError::Signature));
    }

    #[test]
    fn a_signed_payload_verifies_and_one_changed_byte_does_not() {
        let (sk, point) = key();
        let p = sign(&sk, &point, payload(POLICY_OUTCOME, 1, "policyOutcomeProof", json!({"organizationId": "o"})));
        assert_eq!(p.public_key.len(), 260);
        assert_eq!(p.signature.len(), 128);
        let body = verify(&p, Some(&point)).unwrap();
        assert_eq!(body["timestampMs"], "1");
        let mut bad = p.clone();
        bad.proof_payload = bad.proof_payload.replace("\"o\"", "\"p\"");
        assert_eq!(verify(&bad, Some(&point)), Err(ProofError::Signature));
        let (other, other_point) = {
            let sk = p256::ecdsa::SigningKey::from_slice(&[9u8; 32]).unwrap();
            let pt: [u8; 65] = sk.verifying_key().to_encoded_point(false).as_bytes().try_into().unwrap();
            (sk, pt)
        };
        let foreign = sign(&other, &other_point, p.proof_payload.clone());
        assert_eq!(verify(&foreign, Some(&point)), Err(ProofError::OtherKey));
    }

    #[test]
    fn canonical_json_sorts_members_at_every_depth() {
        let v: Value = serde_json::from_str(r#"{"b":1,"a":{"d":[{"z":1,"y":2}],"c":"x"}}"#).unwrap();
        assert_eq!(canonical_json(&v), r#"{"a":{"c":"x","d":[{"y":2,"z":1}]},"b":1}"#);
        let mut viewer = v.clone();
        viewer["canApprove"] = json!(true);
        assert_eq!(activity_digest(&viewer), activity_digest(&v));
        assert_ne!(json_digest(&viewer), json_digest(&v));
    }

    const NONCE: &str = "00112233445566778899aabbccddeeff";

    #[test]
    fn a_head_answers_only_the_nonce_it_was_signed_for() {
        let (log, point, sk) = log_of(3);
        let head_of = |nonce: Option<&str>| {
            let body: Value = serde_json::from_str(&log.head.proof_payload).unwrap();
            let head = body["activityLogHead"]["head"].as_str().unwrap().to_string();
            sign(&sk, &point, log_head_payload(6, &log.organization_id, 3, &head, nonce))
        };
        // An old head (signed for another request, or for none) refused for an export that asked
        // for its own nonce.
        for old in [None, Some("ffeeddccbbaa99887766554433221100")] {
            let replayed = ExportedLog { head: head_of(old), ..log.clone() };
            let fault = verify_log(&replayed, &point).unwrap_err();
            assert_eq!(fault.seq, 0, "{fault}");
            assert!(fault.reason.contains("does not carry the export's nonce"), "{fault}");
        }
        // An export made without one verifies, but says it cannot tell how fresh its head is.
        let unasked = ExportedLog { nonce: None, head: head_of(None), ..log.clone() };
        assert_eq!(
            verify_log(&unasked, &point).unwrap(),
            LogVerified { links: 3, unlogged: vec![], head_timestamp_ms: 6, fresh: false }
        );
        assert!(is_log_nonce(NONCE) && !is_log_nonce("0011") && !is_log_nonce(&"0".repeat(129)));
        assert!(!is_log_nonce("00112233445566778899aabbccddeefg"));
    }

    fn log_of(n: usize) -> (ExportedLog, [u8; 65], p256::ecdsa::SigningKey) {
        let (sk, point) = key();
        let org = "org-1";
        let mut previous = genesis(org);
        let mut links = Vec::new();
        let mut activities = Vec::new();
        for i in 0..n {
            let activity = json!({"id": format!("a{i}"), "organizationId": org, "type": "T", "fingerprint": format!("f{i}"),
                "status": "ACTIVITY_STATUS_COMPLETED", "result": {"n": i}, "canApprove": false});
            let digest = activity_digest(&activity);
            let seq = i as u64 + 1;
            let head = next_head(&previous, seq, &format!("a{i}"), &digest);
            let link = LogLink {
                organization_id: org.into(),
                seq: seq.to_string(),
                activity_id: format!("a{i}"),
                fingerprint: format!("f{i}"),
                activity_type: "T".into(),
                status: "ACTIVITY_STATUS_COMPLETED".into(),
                activity_digest: digest,
                previous: previous.clone(),
                head: head.clone(),
            };
            links.push(sign(&sk, &point, link.payload(5)));
            activities.push(activity);
            previous = head;
        }
        let head = sign(&sk, &point, log_head_payload(6, org, n as u64, &previous, Some(NONCE)));
        (ExportedLog { organization_id: org.into(), nonce: Some(NONCE.into()), head, links, activities }, point, sk)
    }

    #[test]
    fn links_inside_a_group_need_no_signature_but_a_rewrite_of_them_breaks_the_next_signed_one() {
        let (mut log, point, sk) = log_of(5);
        for i in [0, 1, 3] {
            log.links[i].signature.clear();
        }
        assert_eq!(verify_log(&log, &point).unwrap().links, 5);
        // The second activity and its unsigned link rewritten to agree: the chain no longer
        // reaches the third link's signature.
        let mut rewritten = log.clone();
        rewritten.activities[1]["result"]["n"] = json!(42);
        let mut link: LogLink =
            LogLink::from_payload(&serde_json::from_str(&rewritten.links[1].proof_payload).unwrap()).unwrap();
        link.activity_digest = activity_digest(&rewritten.activities[1]);
        link.head = next_head(&link.previous, 2, "a1", &link.activity_digest);
        rewritten.links[1].proof_payload = link.payload(5);
        let f = verify_log(&rewritten, &point).unwrap_err();
        assert_eq!((f.seq, f.activity_id.as_str()), (3, "a2"), "{f}");
        // A trailing unsigned link rewritten: the signed head no longer matches.
        let mut tail = log.clone();
        tail.links[4].signature.clear();
        tail.activities[4]["result"]["n"] = json!(7);
        let mut link: LogLink =
            LogLink::from_payload(&serde_json::from_str(&tail.links[4].proof_payload).unwrap()).unwrap();
        link.activity_digest = activity_digest(&tail.activities[4]);
        link.head = next_head(&link.previous, 5, "a4", &link.activity_digest);
        tail.links[4].proof_payload = link.payload(5);
        assert_eq!(verify_log(&tail, &point).unwrap_err().seq, 5);
        drop(sk);
    }

    #[test]
    fn an_honest_log_verifies_and_each_kind_of_tampering_names_the_activity() {
        let (log, point, sk) = log_of(5);
        assert_eq!(
            verify_log(&log, &point).unwrap(),
            LogVerified { links: 5, unlogged: vec![], head_timestamp_ms: 6, fresh: true }
        );

        let mut edited = log.clone();
        edited.activities[2]["result"]["n"] = json!(99);
        let f = verify_log(&edited, &point).unwrap_err();
        assert_eq!((f.seq, f.activity_id.as_str()), (3, "a2"));

        let mut deleted = log.clone();
        deleted.activities.remove(1);
        let f = verify_log(&deleted, &point).unwrap_err();
        assert_eq!((f.seq, f.activity_id.as_str()), (2, "a1"));

        let mut link_gone = log.clone();
        link_gone.links.remove(3);
        let f = verify_log(&link_gone, &point).unwrap_err();
        assert_eq!(f.seq, 4);
        assert!(f.reason.contains("\"a2\""), "{f}");

        let mut moved = log.clone();
        moved.links.swap(1, 2);
        let f = verify_log(&moved, &point).unwrap_err();
        assert_eq!((f.seq, f.activity_id.as_str()), (2, "a2"));

        let mut truncated = log.clone();
        truncated.links.pop();
        let f = verify_log(&truncated, &point).unwrap_err();
        assert_eq!(f.seq, 5);

        let mut unlogged = log.clone();
        unlogged.activities.push(json!({"id": "late", "status": "ACTIVITY_STATUS_COMPLETED"}));
        assert_eq!(verify_log(&unlogged, &point).unwrap().unlogged, vec!["late".to_string()]);

        let mut forged = log.clone();
        let (other, other_point) = {
            let sk = p256::ecdsa::SigningKey::from_slice(&[3u8; 32]).unwrap();
            let pt: [u8; 65] = sk.verifying_key().to_encoded_point(false).as_bytes().try_into().unwrap();
            (sk, pt)
        };
        forged.links[0] = sign(&other, &other_point, forged.links[0].proof_payload.clone());
        assert_eq!(verify_log(&forged, &point).unwrap_err().seq, 1);
        drop(sk);
    }
}
