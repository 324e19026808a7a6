//! How a policy evaluation's per-policy outcomes are stored: compact when every policy id is a
//! UUID (17 bytes an outcome instead of about 75 of JSON), the JSON text otherwise.
//!
//! An organization with 1,000 applicable policies records 1,000 outcomes with every activity;
//! as JSON that is 75 KB a row, and writing it was a fifth of the gateway's CPU in that bench
//! scenario. Coffer makes every policy id a UUID, so the compact form is the rule.

use base64::Engine;
use coffer_policy::decision::{self, Evaluation};
use serde_json::{json, Value};

/// The stored form's marker (the JSON form starts with `[`).
const COMPACT: &str = "o1:";
/// The outcome codes, by position.
const OUTCOMES: [&str; 6] = [
    decision::OUTCOME_ALLOW,
    decision::OUTCOME_DENY_EXPLICIT,
    decision::OUTCOME_DENY_IMPLICIT,
    decision::OUTCOME_REQUIRES_CONSENSUS,
    decision::OUTCOME_REJECTED,
    decision::OUTCOME_ERROR,
];

/// A canonical (lowercase, hyphenated) UUID's bytes.
fn uuid_bytes(id: &str) -> Option<[u8; 16]> {
    let u = uuid::Uuid::try_parse(id).ok()?;
    let mut buf = uuid::Uuid::encode_buffer();
    (u.hyphenated().encode_lower(&mut buf) == id).then(|| *u.as_bytes())
}

/// The stored text of `e`'s outcomes.
pub fn stored(e: &Evaluation) -> String {
    let mut bytes = Vec::with_capacity(e.outcomes.len() * 17);
    for o in &e.outcomes {
        let (Some(id), Some(code)) = (uuid_bytes(&o.policy_id), OUTCOMES.iter().position(|x| *x == o.outcome)) else {
            return e.outcomes_json_text();
        };
        bytes.extend_from_slice(&id);
        bytes.push(code as u8);
    }
    format!("{COMPACT}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The `[{policyId, outcome}]` list of a stored text (either form; `[]` for what is neither).
pub fn served(stored: &str) -> Value {
    let Some(compact) = stored.strip_prefix(COMPACT) else {
        return serde_json::from_str::<Value>(stored).ok().filter(Value::is_array).unwrap_or_else(|| json!([]));
    };
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(compact) else { return json!([]) };
    Value::Array(
        bytes
            .chunks_exact(17)
            .filter_map(|c| {
                let id = uuid::Uuid::from_slice(&c[..16]).ok()?;
                let outcome = OUTCOMES.get(usize::from(c[16]))?;
                Some(json!({ "policyId": id.hyphenated().to_string(), "outcome": outcome }))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use coffer_policy::decision::{Decision, PolicyOutcome};

    fn evaluation(ids: &[&str]) -> Evaluation {
        let outcomes = ids
            .iter()
            .zip(OUTCOMES.iter().cycle())
            .map(|(id, outcome)| PolicyOutcome {
                policy_id: (*id).into(),
                policy_name: "n".into(),
                effect: "EFFECT_ALLOW".into(),
                outcome,
                clause: "condition",
                detail: None,
            })
            .collect();
        Evaluation { decision: Decision::Allow, reason: "POLICY_ALLOW", outcomes }
    }

    #[test]
    fn uuids_are_stored_compactly_and_served_as_the_json_list() {
        let ids: Vec<String> = (0..1000).map(|_| uuid::Uuid::new_v4().to_string()).collect();
        let e = evaluation(&ids.iter().map(String::as_str).collect::<Vec<_>>());
        let text = stored(&e);
        assert!(text.starts_with(COMPACT));
        assert!(text.len() < 1000 * 24, "{} bytes", text.len());
        assert_eq!(served(&text), e.outcomes_json());
        assert_eq!(served(&stored(&evaluation(&[]))), json!([]));
    }

    #[test]
    fn other_ids_keep_the_json_form_and_the_json_form_still_reads() {
        for odd in ["policy-1", "6F9619FF-8B86-D011-B42D-00CF4FC964FF", "6f9619ff8b86d011b42d00cf4fc964ff"] {
            let e = evaluation(&["6f9619ff-8b86-d011-b42d-00cf4fc964ff", odd]);
            let text = stored(&e);
            assert!(text.starts_with('['), "{odd}: {text}");
            assert_eq!(served(&text), e.outcomes_json());
        }
        assert_eq!(served("not json"), json!([]));
        assert_eq!(served("o1:!!"), json!([]));
    }
}
