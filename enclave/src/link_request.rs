//! The activity a call is asked to link in its organization's log (`Authorization.log`), checked
//! before the call does any work.

use coffer_auth::envelope::{derived_id, StampedActivity, ACTIVITY_ID};
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

/// Most bytes of an activity the enclave is asked to link (a webhook delivery's bound too): its
/// intent is bounded by the stamped body, its votes by the approvals.
pub const MAX_ACTIVITY_BYTES: usize = 4 << 20;

/// The members of an activity as the API renders it (`v1Activity`), the only ones it may have.
const MEMBERS: [&str; 14] = [
    "id",
    "organizationId",
    "status",
    "type",
    "intent",
    "result",
    "votes",
    "fingerprint",
    "canApprove",
    "canReject",
    "createdAt",
    "updatedAt",
    "appProofs",
    "failure",
];

/// A vote's selection when it approves.
pub(crate) const VOTE_APPROVED: &str = "VOTE_SELECTION_APPROVED";
const APPROVED: &str = VOTE_APPROVED;

/// A refusal of an activity that does not state what was stamped.
fn misstated(why: &str) -> EnclaveError {
    EnclaveError::refused(RefusalReason::BindingMismatch, format!("the activity to link {why}"))
}

/// `bytes` as an activity to link: a JSON object of at most [`MAX_ACTIVITY_BYTES`].
fn parsed(bytes: &[u8]) -> Result<Map<String, Value>, EnclaveError> {
    if bytes.len() > MAX_ACTIVITY_BYTES {
        return Err(EnclaveError::invalid(format!("an activity to link has at most {MAX_ACTIVITY_BYTES} bytes")));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(activity)) => Ok(activity),
        _ => Err(EnclaveError::invalid("the activity to link is not a JSON object")),
    }
}

/// Checks that `activity` states the stamped submission: its organization, fingerprint and type,
/// the id derived from it (so no other activity's link can stand in its way), and its intent:
/// the stamped parameters as the record keeps them, under the API's name for the type. Answers
/// the type's subject.
fn states_the_submission(
    stamped: &StampedActivity,
    activity: &Map<String, Value>,
) -> Result<&'static subjects::Subject, EnclaveError> {
    if let Some(other) = activity.keys().find(|k| !MEMBERS.contains(&k.as_str())) {
        return Err(misstated(&format!("has a member an activity does not have: {other:?}")));
    }
    let text = |k: &str| activity.get(k).and_then(Value::as_str).unwrap_or_default();
    if text("organizationId") != stamped.organization_id
        || text("fingerprint") != stamped.fingerprint
        || text("type") != stamped.activity_type
    {
        return Err(misstated("is not the stamped submission's (organization, fingerprint or type)"));
    }
    if text("id") != derived_id(&stamped.fingerprint, ACTIVITY_ID, 0) {
        return Err(misstated("has another id than the one derived from its stamped body"));
    }
    let Some(subject) = subjects::subject(&stamped.activity_type) else {
        return Err(misstated("is of a type the enclave does not know"));
    };
    let recorded = subjects::recorded_parameters(&stamped.activity_type, stamped.parameters.clone());
    if single(activity, "intent", subject.intent_key) != Some(&recorded) {
        return Err(misstated("does not state the stamped parameters as its intent, and nothing else"));
    }
    Ok(subject)
}

/// The one member `key` of the object `member` of `activity`, if that is all it has.
fn single<'a>(activity: &'a Map<String, Value>, member: &str, key: &str) -> Option<&'a Value> {
    activity.get(member).and_then(Value::as_object).filter(|o| o.len() == 1).and_then(|o| o.get(key))
}

/// Checks an activity `RecordActivity` is asked to link (a finished one, its result and proofs as
/// the gateway records them): it states the stamped submission; a completed one has its result
/// under the API's name, and is not one linked in its own call (a key use, or a state change
/// `ApplyActivity` decides: such an activity is linked completed only in the call that does it,
/// with the votes the enclave verified and, for a key use, the result it made); another has no
/// result.
pub fn check_recorded(stamped: &StampedActivity, activity: &[u8]) -> Result<Value, EnclaveError> {
    let activity = parsed(activity)?;
    let subject = states_the_submission(stamped, &activity)?;
    if activity.get("status").and_then(Value::as_str) == Some(ACTIVITY_COMPLETED) {
        if subjects::linked_in_its_call(subject.activity_type) {
            return Err(misstated("is linked completed only in the enclave call that does it"));
        }
        if single(&activity, "result", subject.result_key).is_none() {
            return Err(misstated("does not state its result under its type's name, and nothing else"));
        }
    } else if activity.get("result").is_some_and(|r| r.as_object().is_none_or(|r| !r.is_empty())) {
        return Err(misstated("did not complete, and states a result"));
    }
    Ok(Value::Object(activity))
}

/// A vote's selection when it rejects.
const REJECTED: &str = "VOTE_SELECTION_REJECTED";
/// The status of an activity a vote rejected.
pub const ACTIVITY_REJECTED: &str = "ACTIVITY_STATUS_REJECTED";

/// A vote the enclave verified, as an activity states it: the voter's user, the selection, the
/// key that stamped it and the stamped body (`message`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ballot {
    pub user_id: String,
    pub selection: &'static str,
    pub public_key: String,
    pub message: String,
}

/// The members of a vote as the API renders it (`v1Vote`), the only ones it may have.
const VOTE_MEMBERS: [&str; 10] =
    ["id", "userId", "user", "activityId", "selection", "message", "publicKey", "signature", "scheme", "createdAt"];

/// The votes `activity` states, as ballots: each an object with only a vote's members, an
/// approval or a rejection by a user, naming this activity and (in its `user`) that user.
fn stated_votes(activity: &Value) -> Result<Vec<Ballot>, EnclaveError> {
    let votes = activity.get("votes").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let activity_id = activity.get("id").and_then(Value::as_str).unwrap_or_default();
    let mut stated: Vec<Ballot> = Vec::with_capacity(votes.len());
    for vote in votes {
        let Some(members) = vote.as_object() else { return Err(misstated("has a vote that is not an object")) };
        if let Some(other) = members.keys().find(|k| !VOTE_MEMBERS.contains(&k.as_str())) {
            return Err(misstated(&format!("has a vote with a member a vote does not have: {other:?}")));
        }
        let text = |k: &str| vote.get(k).and_then(Value::as_str);
        let (Some(user), Some(selection @ (APPROVED | REJECTED))) = (text("userId"), text("selection")) else {
            return Err(misstated("has a vote that is not an approval or a rejection by a user"));
        };
        let named_user = vote.get("user").and_then(|u| u.get("userId")).and_then(Value::as_str);
        if text("activityId").is_some_and(|a| a != activity_id) || named_user.is_some_and(|u| u != user) {
            return Err(misstated("has a vote of another activity or user than it names"));
        }
        stated.push(Ballot {
            user_id: user.to_string(),
            selection: if selection == APPROVED { APPROVED } else { REJECTED },
            public_key: text("publicKey").unwrap_or_default().to_string(),
            message: text("message").unwrap_or_default().to_string(),
        });
    }
    Ok(stated)
}

/// Checks that `stated` is `submitter`'s vote, as stamped, then exactly `verified` (in any
/// order), each user once.
fn same_votes(stated: &[Ballot], submitter: &Ballot, verified: &[Ballot]) -> Result<(), EnclaveError> {
    let Some((first, later)) = stated.split_first() else {
        return Err(misstated("states no vote: its submitter's approval is its first"));
    };
    if first != submitter {
        return Err(misstated("does not state its submitter's approval, as stamped, as its first vote"));
    }
    let mut later = later.to_vec();
    let mut verified = verified.to_vec();
    later.sort_unstable();
    verified.sort_unstable();
    if later != verified {
        return Err(misstated("states other votes than the ones the enclave verified"));
    }
    let mut users: Vec<&str> = stated.iter().map(|b| b.user_id.as_str()).collect();
    users.sort_unstable();
    users.dedup();
    if users.len() != stated.len() {
        return Err(misstated("states two votes of one user"));
    }
    Ok(())
}

/// Checks the votes an activity `RecordActivity` links states: its submitter's approval first,
/// then exactly the votes the enclave verified (`verified`), each user once, each stating the
/// user, selection, key and stamped body (`message`) that was verified, and this activity's id.
/// It is rejected if and only if one of them rejected it, and only when `may_be_rejected` (the
/// enclave found it waiting for votes, never allowed it, and keeps a rejection of it).
pub fn check_recorded_votes(
    activity: &Value,
    submitter: &Ballot,
    verified: &[Ballot],
    may_be_rejected: bool,
) -> Result<(), EnclaveError> {
    let stated = stated_votes(activity)?;
    same_votes(&stated, submitter, verified)?;
    let rejected = activity.get("status").and_then(Value::as_str) == Some(ACTIVITY_REJECTED);
    if rejected != stated.iter().any(|b| b.selection == REJECTED) {
        return Err(misstated("is rejected without a rejection, or has a rejection and was not rejected"));
    }
    if rejected && !may_be_rejected {
        return Err(misstated("is rejected, but the enclave never found it waiting for votes, or allowed it"));
    }
    Ok(())
}

/// What a state change's allow records of the records it made
/// (`coffer_org_rules::transition::made_ids`), for a link made later by `RecordActivity`: the
/// members' pointers in clear and a digest of their values, marked apart from a key use's result
/// digest ([`MADE_MARK`]).
pub fn made_record(made: &[(&str, Value)]) -> String {
    let pointers: Vec<&str> = made.iter().map(|(at, _)| *at).collect();
    let values = Value::Array(made.iter().map(|(_, v)| v.clone()).collect());
    format!("{MADE_MARK}{};{}", pointers.join(","), coffer_auth::proof::json_digest(&values))
}

/// The mark of a [`made_record`].
pub const MADE_MARK: &str = "made:";

/// Whether `result` (an activity's result value, under its result key) states the members a
/// [`made_record`] recorded as they were made; `None` when `recorded` is not one.
pub fn states_recorded_made(recorded: &str, result: &Value) -> Option<bool> {
    let (pointers, digest) = recorded.strip_prefix(MADE_MARK)?.split_once(';')?;
    let values: Vec<Value> = pointers
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| result.pointer(p).cloned().unwrap_or(Value::Null))
        .collect();
    Some(coffer_auth::proof::json_digest(&Value::Array(values)) == digest)
}

impl LinkRequest {
    /// `log`, checked against the stamped submission it is to link, which `approvals` (the votes
    /// whose stamps the enclave verified: the submitter's, then every approval's) approved.
    /// `makes_result`: the call makes the activity's result (a key use), rather than the caller
    /// bringing it.
    pub fn checked(
        stamped: &StampedActivity,
        log: &pb::LogRequest,
        approvals: &[Ballot],
        makes_result: bool,
    ) -> Result<Self, EnclaveError> {
        let activity = parsed(&log.activity)?;
        let subject = states_the_submission(stamped, &activity)?;
        if activity.get("status").and_then(Value::as_str) != Some(ACTIVITY_COMPLETED)
            || activity.get("failure").is_some_and(|f| !f.is_null())
        {
            return Err(misstated("is linked in its call as completed, without a failure"));
        }
        // Its votes are the approvals the enclave verified, as stamped: none made up, none left
        // out (`approvals`: the submitter's first).
        let Some((submitter, verified)) = approvals.split_first() else {
            return Err(EnclaveError::Internal("an authorization without its submitter".into()));
        };
        same_votes(&stated_votes(&Value::Object(activity.clone()))?, submitter, verified)?;
        if activity.get("appProofs").is_some_and(|p| p.as_array().is_none_or(|p| !p.is_empty())) {
            return Err(misstated("brings no app proofs: the enclave adds this call's"));
        }
        if makes_result && activity.contains_key("result") {
            return Err(misstated("brings no result: the enclave makes a key use's result"));
        }
        if !makes_result && single(&activity, "result", subject.result_key).is_none() {
            return Err(misstated("brings its result under its type's name, and nothing else"));
        }
        Ok(Self { activity, result_key: subject.result_key })
    }

    /// Whether the result it brings names the records a state change made as the enclave made
    /// them (`made`: `coffer_org_rules::transition::made_ids` of the changes it computed).
    pub fn states_made(&self, made: &[(&str, Value)]) -> Result<(), EnclaveError> {
        let result = self.activity.get("result").and_then(|r| r.get(self.result_key)).unwrap_or(&Value::Null);
        match made.iter().find(|(at, value)| result.pointer(at) != Some(value)) {
            Some((at, _)) => Err(misstated(&format!("states {at} of its result as the enclave made it"))),
            None => Ok(()),
        }
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

    fn id() -> String {
        derived_id("sha256:f1", ACTIVITY_ID, 0)
    }

    fn shell() -> Value {
        json!({"id": id(), "organizationId": "o1", "type": "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2",
            "fingerprint": "sha256:f1", "status": ACTIVITY_COMPLETED,
            "intent": {"signRawPayloadIntentV2": {"signWith": "0xabc", "payload": "hi"}},
            "votes": [{"userId": "u1", "selection": APPROVED, "message": "{}", "publicKey": "02u1"}]})
    }

    /// The submitter's vote as the enclave verified it (what `shell` states).
    fn submitted() -> Vec<Ballot> {
        vec![Ballot { user_id: "u1".into(), selection: APPROVED, public_key: "02u1".into(), message: "{}".into() }]
    }

    fn log(activity: &Value) -> pb::LogRequest {
        pb::LogRequest { activity: activity.to_string().into_bytes() }
    }

    #[test]
    fn a_key_use_s_shell_is_linked_with_the_enclave_s_result_and_proofs() {
        let asked = LinkRequest::checked(&stamped(), &log(&shell()), &submitted(), true).unwrap();
        let linked = asked.completed(Some(&json!({"r": "01"})), vec![json!({"scheme": "s"})]);
        assert_eq!(linked["result"], json!({"signRawPayloadResult": {"r": "01"}}));
        assert_eq!(linked["appProofs"], json!([{"scheme": "s"}]));
        assert_eq!(linked["id"], id());
    }

    #[test]
    fn every_other_shell_is_refused() {
        type Lie = (&'static str, fn(&mut Value));
        let lies: [Lie; 18] = [
            ("another organization", |a| a["organizationId"] = json!("o2")),
            ("another type", |a| a["type"] = json!("ACTIVITY_TYPE_CREATE_POLICY_V3")),
            ("another fingerprint", |a| a["fingerprint"] = json!("sha256:f2")),
            ("no id", |a| a["id"] = json!("")),
            ("an id of its choosing", |a| a["id"] = json!("a1")),
            ("failed", |a| a["status"] = json!("ACTIVITY_STATUS_FAILED")),
            ("another payload", |a| a["intent"]["signRawPayloadIntentV2"]["payload"] = json!("bye")),
            ("two intents", |a| a["intent"]["other"] = json!({})),
            ("another intent's name", |a| {
                a["intent"] = json!({"signRawPayloadsIntent": a["intent"]["signRawPayloadIntentV2"].take()})
            }),
            ("its own result", |a| a["result"] = json!({"signRawPayloadResult": {}})),
            ("its own proofs", |a| a["appProofs"] = json!([{"scheme": "s"}])),
            ("a failure", |a| a["failure"] = json!({"code": 13, "message": "no"})),
            ("a member of its own", |a| a["note"] = json!("trust me")),
            ("an approval made up", |a| {
                a["votes"].as_array_mut().unwrap().push(json!({"userId": "u2", "selection": APPROVED}))
            }),
            ("its approval left out", |a| a["votes"] = json!([])),
            ("a rejection", |a| a["votes"][0]["selection"] = json!("VOTE_SELECTION_REJECTED")),
            ("its approval under another key", |a| a["votes"][0]["publicKey"] = json!("02u2")),
            ("its approval of another body", |a| a["votes"][0]["message"] = json!("{\"x\":1}")),
        ];
        for (lie, change) in lies {
            let mut activity = shell();
            change(&mut activity);
            let refused = LinkRequest::checked(&stamped(), &log(&activity), &submitted(), true);
            assert!(
                matches!(refused, Err(EnclaveError::Refused { reason: RefusalReason::BindingMismatch, .. })),
                "{lie}: {refused:?}"
            );
        }
        let not_json = pb::LogRequest { activity: b"[1]".to_vec() };
        let refused = LinkRequest::checked(&stamped(), &not_json, &submitted(), true);
        assert!(matches!(refused, Err(EnclaveError::InvalidArgument(_))), "{refused:?}");
    }

    #[test]
    fn a_state_change_brings_its_result_under_its_name() {
        let stamped = StampedActivity {
            activity_type: "ACTIVITY_TYPE_CREATE_POLICY_V3".into(),
            parameters: json!({"policyName": "p"}),
            ..stamped()
        };
        let mut activity = json!({"id": id(), "organizationId": "o1", "type": "ACTIVITY_TYPE_CREATE_POLICY_V3",
            "fingerprint": "sha256:f1", "status": ACTIVITY_COMPLETED, "votes": shell()["votes"],
            "intent": {"createPolicyIntentV3": {"policyName": "p"}}});
        let checked = |a: &Value| LinkRequest::checked(&stamped, &log(a), &submitted(), false);
        assert!(checked(&activity).is_err(), "no result");
        activity["result"] = json!({"createPolicyResultV3": {"policyId": "p1"}});
        assert!(checked(&activity).is_err(), "another result's name");
        activity["result"] = json!({"createPolicyResult": {"policyId": "p1"}});
        let linked = checked(&activity).unwrap().completed(None, vec![]);
        assert_eq!(linked["result"], json!({"createPolicyResult": {"policyId": "p1"}}));
        assert_eq!(linked["appProofs"], json!([]));
    }

    #[test]
    fn a_recorded_activity_states_its_submission_and_a_key_use_is_not_recorded_completed() {
        let recorded = |stamped: &StampedActivity, a: &Value| check_recorded(stamped, a.to_string().as_bytes());
        let mut signing = shell();
        signing["result"] = json!({"signRawPayloadResult": {"r": "01"}});
        let refused = recorded(&stamped(), &signing);
        assert!(matches!(refused, Err(EnclaveError::Refused { .. })), "a completed key use: {refused:?}");
        signing["status"] = json!("ACTIVITY_STATUS_FAILED");
        assert!(recorded(&stamped(), &signing).is_err(), "failed, with a result");
        signing["result"] = json!({});
        assert!(recorded(&stamped(), &signing).is_ok(), "failed, without one");

        // A state change linked in its call, like a key use, is linked completed only in
        // its call.
        let policy = StampedActivity {
            activity_type: "ACTIVITY_TYPE_CREATE_POLICY_V3".into(),
            parameters: json!({"policyName": "p"}),
            ..stamped()
        };
        let created = json!({"id": id(), "organizationId": "o1", "type": "ACTIVITY_TYPE_CREATE_POLICY_V3",
            "fingerprint": "sha256:f1", "status": ACTIVITY_COMPLETED, "result": {"createPolicyResult": {}},
            "intent": {"createPolicyIntentV3": {"policyName": "p"}}});
        assert!(recorded(&policy, &created).is_err(), "a change linked in its call, completed");

        // otp_auth's code is recorded redacted, and only so.
        let otp = StampedActivity {
            activity_type: "ACTIVITY_TYPE_OTP_AUTH".into(),
            parameters: json!({"otpId": "o", "otpCode": "123456"}),
            ..stamped()
        };
        let mut activity = json!({"id": id(), "organizationId": "o1", "type": "ACTIVITY_TYPE_OTP_AUTH",
            "fingerprint": "sha256:f1", "status": ACTIVITY_COMPLETED, "result": {"otpAuthResult": {}},
            "intent": {"otpAuthIntent": {"otpId": "o", "otpCode": "<redacted>"}}});
        assert!(recorded(&otp, &activity).is_ok());
        activity["intent"]["otpAuthIntent"]["otpCode"] = json!("123456");
        assert!(recorded(&otp, &activity).is_err(), "the code itself, in the log");
        activity["intent"]["otpAuthIntent"]["otpCode"] = json!("<redacted>");
        activity["result"] = json!({"otpAuthResult": {}, "more": 1});
        assert!(recorded(&otp, &activity).is_err(), "a result beside the type's");

        let big = vec![b' '; MAX_ACTIVITY_BYTES + 1];
        assert!(matches!(check_recorded(&stamped(), &big), Err(EnclaveError::InvalidArgument(_))));
    }

    #[test]
    fn recorded_votes_are_the_submitter_s_then_the_verified_ones() {
        let ballot = |user: &str, selection: &'static str| Ballot {
            user_id: user.into(),
            selection,
            public_key: format!("{user}-key"),
            message: format!("{user}-body"),
        };
        let vote = |b: &Ballot| {
            json!({"id": "v", "userId": b.user_id, "selection": b.selection, "publicKey": b.public_key,
                "message": b.message, "activityId": "a1", "user": {"userId": b.user_id}})
        };
        let activity = |status: &str, votes: Vec<Value>| json!({"id": "a1", "status": status, "votes": votes});
        let alice = ballot("alice", APPROVED);
        let check = |a: &Value, v: &[Ballot]| check_recorded_votes(a, &alice, v, true);
        let done = "ACTIVITY_STATUS_COMPLETED";
        let rejected = ACTIVITY_REJECTED;
        let (bob, carol, carol_no) = (ballot("bob", APPROVED), ballot("carol", APPROVED), ballot("carol", REJECTED));

        // Honest: the submitter alone, or with the votes verified (in any order).
        assert!(check(&activity(done, vec![vote(&alice)]), &[]).is_ok());
        let two = activity(done, vec![vote(&alice), vote(&bob), vote(&carol)]);
        assert!(check(&two, &[carol.clone(), bob.clone()]).is_ok());
        let no = activity(rejected, vec![vote(&alice), vote(&bob), vote(&carol_no)]);
        assert!(check(&no, &[bob.clone(), carol_no.clone()]).is_ok());
        let refused = check_recorded_votes(&no, &alice, &[bob.clone(), carol_no.clone()], false);
        assert!(refused.is_err(), "rejected, though the enclave never found it waiting (or allowed it)");

        let mut other_key = vote(&bob);
        other_key["publicKey"] = json!("mallory-key");
        let mut other_body = vote(&bob);
        other_body["message"] = json!("bob's vote on something else");
        let mut other_user = vote(&bob);
        other_user["user"] = json!({"userId": "carol"});
        let mut other_activity = vote(&bob);
        other_activity["activityId"] = json!("a2");
        let mut extra = vote(&bob);
        extra["weight"] = json!(10);
        let with_bob = |v: Value| activity(done, vec![vote(&alice), v]);
        let lies: Vec<(&str, Value, Vec<Ballot>)> = vec![
            ("a rejection never stamped", no.clone(), vec![bob.clone()]),
            ("an approval never stamped", two.clone(), vec![bob.clone()]),
            ("a rejection stated as an approval", two.clone(), vec![bob.clone(), carol_no.clone()]),
            ("a vote verified, left out", activity(done, vec![vote(&alice)]), vec![ballot("bob", REJECTED)]),
            ("no vote at all", activity(done, vec![]), vec![]),
            ("no vote at all, rejected", activity(rejected, vec![]), vec![]),
            ("another submitter", activity(done, vec![vote(&ballot("mallory", APPROVED))]), vec![]),
            ("the submitter rejecting", activity(rejected, vec![vote(&ballot("alice", REJECTED))]), vec![]),
            ("rejected without a rejection", activity(rejected, vec![vote(&alice), vote(&bob)]), vec![bob.clone()]),
            ("a rejection, and it completed", with_bob(vote(&ballot("bob", REJECTED))), vec![ballot("bob", REJECTED)]),
            ("one user twice", activity(done, vec![vote(&alice), vote(&alice)]), vec![alice.clone()]),
            ("another key", with_bob(other_key), vec![bob.clone()]),
            ("another stamped body", with_bob(other_body), vec![bob.clone()]),
            ("another user object", with_bob(other_user), vec![bob.clone()]),
            ("another activity's vote", with_bob(other_activity), vec![bob.clone()]),
            ("a member a vote does not have", with_bob(extra), vec![bob.clone()]),
            ("a vote without a user", activity(done, vec![json!({"selection": APPROVED})]), vec![]),
            ("another selection", activity(done, vec![json!({"userId": "alice", "selection": "MAYBE"})]), vec![]),
        ];
        for (lie, a, v) in lies {
            let refused = check(&a, &v);
            assert!(
                matches!(refused, Err(EnclaveError::Refused { reason: RefusalReason::BindingMismatch, .. })),
                "{lie}: {refused:?}"
            );
        }
    }
}
