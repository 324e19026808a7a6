//! The activity a call is asked to link in its organization's log (`Authorization.log`), checked
//! before the call does any work.

use coffer_auth::envelope::StampedActivity;
use coffer_org_rules::subjects;
use coffer_proto::v1 as pb;
use serde_json::{json, Map, Value};

use crate::error::{EnclaveError, RefusalReason};

/// The status of an activity that ran, as the API and the log name it: linked so only if the
/// enclave authorized it, and its webhook events signed only then.
pub(crate) const ACTIVITY_COMPLETED: &str = "ACTIVITY_STATUS_COMPLETED";

/// The activity a call links once its work is done: the stamped submission's, completed, with
/// the stamped parameters as its intent and no app proofs of its own, each member under the
/// API's name for its type. A key use's has no result either (the enclave makes it); a state
/// change's brings its own.
#[derive(Debug)]
pub struct LinkRequest {
    activity: Map<String, Value>,
    result_key: &'static str,
}

impl LinkRequest {
    /// `log`, checked against the stamped submission it is to link. `makes_result`: the call
    /// makes the activity's result (a key use), rather than the caller bringing it.
    pub fn checked(stamped: &StampedActivity, log: &pb::LogRequest, makes_result: bool) -> Result<Self, EnclaveError> {
        let refused = |why: &str| {
            EnclaveError::refused(RefusalReason::BindingMismatch, format!("the activity to link in this call {why}"))
        };
        let Ok(Value::Object(activity)) = serde_json::from_slice::<Value>(&log.activity) else {
            return Err(EnclaveError::invalid("the activity to link is not a JSON object"));
        };
        let text = |k: &str| activity.get(k).and_then(Value::as_str).unwrap_or_default();
        if text("organizationId") != stamped.organization_id
            || text("fingerprint") != stamped.fingerprint
            || text("type") != stamped.activity_type
        {
            return Err(refused("is not the stamped submission's (organization, fingerprint or type)"));
        }
        if text("id").is_empty() || text("status") != ACTIVITY_COMPLETED {
            return Err(refused("is linked completed, with an id"));
        }
        let Some(subject) = subjects::subject(&stamped.activity_type) else {
            return Err(refused("is of a type the enclave does not know"));
        };
        let single = |member: &str, key: &str| {
            let object = activity.get(member).and_then(Value::as_object).filter(|o| o.len() == 1);
            object.and_then(|o| o.get(key)).cloned()
        };
        if single("intent", subject.intent_key).as_ref() != Some(&stamped.parameters) {
            return Err(refused("states the stamped parameters as its intent, and nothing else"));
        }
        if activity.get("appProofs").is_some_and(|p| p.as_array().is_none_or(|p| !p.is_empty())) {
            return Err(refused("brings no app proofs: the enclave adds this call's"));
        }
        if makes_result && activity.contains_key("result") {
            return Err(refused("brings no result: the enclave makes a key use's result"));
        }
        if !makes_result && single("result", subject.result_key).is_none() {
            return Err(refused("brings its result, and nothing else"));
        }
        Ok(Self { activity, result_key: subject.result_key })
    }

    /// The activity as linked: with `result` (a key use's, as the enclave made it) under the
    /// asked key, and `app_proofs` (this call's, as the API renders them).
    pub fn completed(self, result: Option<&Value>, app_proofs: Vec<Value>) -> Value {
        let Self { mut activity, result_key } = self;
        if let Some(result) = result {
            activity.insert("result".into(), json!({ result_key: result }));
        }
        activity.insert("appProofs".into(), Value::Array(app_proofs));
        Value::Object(activity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped() -> StampedActivity {
        StampedActivity {
            activity_type: "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2".into(),
            timestamp_ms: 1,
            organization_id: "o1".into(),
            parameters: json!({"signWith": "0xabc", "payload": "hi"}),
            fingerprint: "sha256:f1".into(),
            generate_app_proofs: false,
        }
    }

    fn shell() -> Value {
        json!({"id": "a1", "organizationId": "o1", "type": "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
            "fingerprint": "sha256:f1", "status": ACTIVITY_COMPLETED,
            "intent": {"signRawPayloadIntentV2": {"signWith": "0xabc", "payload": "hi"}}})
    }

    fn log(activity: &Value) -> pb::LogRequest {
        pb::LogRequest { activity: activity.to_string().into_bytes() }
    }

    #[test]
    fn a_key_use_s_shell_is_linked_with_the_enclave_s_result_and_proofs() {
        let asked = LinkRequest::checked(&stamped(), &log(&shell()), true).unwrap();
        let linked = asked.completed(Some(&json!({"r": "01"})), vec![json!({"scheme": "s"})]);
        assert_eq!(linked["result"], json!({"signRawPayloadResult": {"r": "01"}}));
        assert_eq!(linked["appProofs"], json!([{"scheme": "s"}]));
        assert_eq!(linked["id"], "a1");
    }

    #[test]
    fn every_other_shell_is_refused() {
        type Lie = (&'static str, fn(&mut Value));
        let lies: [Lie; 10] = [
            ("another organization", |a| a["organizationId"] = json!("o2")),
            ("another type", |a| a["type"] = json!("ACTIVITY_TYPE_CREATE_POLICY_V3")),
            ("another fingerprint", |a| a["fingerprint"] = json!("sha256:f2")),
            ("no id", |a| a["id"] = json!("")),
            ("failed", |a| a["status"] = json!("ACTIVITY_STATUS_FAILED")),
            ("another payload", |a| a["intent"]["signRawPayloadIntentV2"]["payload"] = json!("bye")),
            ("two intents", |a| a["intent"]["other"] = json!({})),
            ("another intent's name", |a| {
                a["intent"] = json!({"signRawPayloadsIntent": a["intent"]["signRawPayloadIntentV2"].take()})
            }),
            ("its own result", |a| a["result"] = json!({"signRawPayloadResult": {}})),
            ("its own proofs", |a| a["appProofs"] = json!([{"scheme": "s"}])),
        ];
        for (lie, change) in lies {
            let mut activity = shell();
            change(&mut activity);
            let refused = LinkRequest::checked(&stamped(), &log(&activity), true);
            assert!(
                matches!(refused, Err(EnclaveError::Refused { reason: RefusalReason::BindingMismatch, .. })),
                "{lie}: {refused:?}"
            );
        }
        let not_json = pb::LogRequest { activity: b"[1]".to_vec() };
        assert!(matches!(LinkRequest::checked(&stamped(), &not_json, true), Err(EnclaveError::InvalidArgument(_))));
    }

    #[test]
    fn a_state_change_brings_its_result_under_its_name() {
        let stamped = StampedActivity {
            activity_type: "ACTIVITY_TYPE_CREATE_POLICY_V3".into(),
            parameters: json!({"policyName": "p"}),
            ..stamped()
        };
        let mut activity = json!({"id": "a1", "organizationId": "o1", "type": "ACTIVITY_TYPE_CREATE_POLICY_V3",
            "fingerprint": "sha256:f1", "status": ACTIVITY_COMPLETED,
            "intent": {"createPolicyIntentV3": {"policyName": "p"}}});
        assert!(LinkRequest::checked(&stamped, &log(&activity), false).is_err(), "no result");
        activity["result"] = json!({"createPolicyResultV3": {"policyId": "p1"}});
        assert!(LinkRequest::checked(&stamped, &log(&activity), false).is_err(), "another result's name");
        activity["result"] = json!({"createPolicyResult": {"policyId": "p1"}});
        let linked = LinkRequest::checked(&stamped, &log(&activity), false).unwrap().completed(None, vec![]);
        assert_eq!(linked["result"], json!({"createPolicyResult": {"policyId": "p1"}}));
        assert_eq!(linked["appProofs"], json!([]));
    }
}
