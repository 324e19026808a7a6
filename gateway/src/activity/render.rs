//! The JSON shapes clients read: `Timestamp`, `Activity`, `Vote`.

use serde_json::{json, Value};

use crate::store::{ActivityRecord, Nanos};

/// `{"seconds": "...", "nanos": "..."}`, both strings.
pub fn timestamp(n: Nanos) -> Value {
    json!({ "seconds": (n / 1_000_000_000).to_string(), "nanos": (n % 1_000_000_000).to_string() })
}

/// Vote members kept for the enclave (the raw stamp of the vote), never rendered.
pub const VOTE_STAMP_HEADER: &str = "cofferStampHeader";
pub const VOTE_STAMP: &str = "cofferStamp";

/// Votes as clients see them: without the raw stamps kept for the enclave.
fn votes(votes: &Value) -> Value {
    match votes {
        Value::Array(list) => Value::Array(
            list.iter()
                .map(|v| {
                    let mut v = v.clone();
                    if let Some(m) = v.as_object_mut() {
                        m.remove(VOTE_STAMP_HEADER);
                        m.remove(VOTE_STAMP);
                    }
                    v
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The swagger `Activity` object. `can_vote` is whether the requesting user may still vote.
pub fn activity(a: &ActivityRecord, can_vote: bool) -> Value {
    let mut out = json!({
        "id": a.id,
        "organizationId": a.organization_id,
        "status": a.status,
        "type": a.activity_type,
        "intent": a.intent,
        "result": a.result,
        "votes": votes(&a.votes),
        "fingerprint": a.fingerprint,
        "canApprove": can_vote,
        "canReject": can_vote,
        "createdAt": timestamp(a.created_at),
        "updatedAt": timestamp(a.updated_at),
    });
    if let Some(f) = &a.failure {
        out["failure"] = f.clone();
    }
    out
}
