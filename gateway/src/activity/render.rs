//! The JSON shapes clients read: `Timestamp`, `Activity`, `Vote`.

use serde_json::{json, Value};

use crate::store::{ActivityRecord, Nanos};

/// `{"seconds": "...", "nanos": "..."}`, both strings.
pub fn timestamp(n: Nanos) -> Value {
    json!({ "seconds": (n / 1_000_000_000).to_string(), "nanos": (n % 1_000_000_000).to_string() })
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
        "votes": a.votes,
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
