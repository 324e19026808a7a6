//! The decision over an organization's authority state (spec 12.2): the root quorum, then the
//! organization's policies with `coffer-policy`, over the facts the state holds.

use std::sync::Arc;

use imbl::OrdMap;

use coffer_policy::context::{self, ActivityFacts, VOTE_APPROVED};
use coffer_policy::decision::{self, CompiledPolicy, Decision, Evaluation, PolicySource};
use serde_json::{json, Value};

use crate::facts;
use crate::model::{Credential, CredentialKind, Millis, OrgState, Policy};
use crate::subjects::Subject;

/// The reason of the denial of a root-quorum-only activity whose submitter and approvers include
/// no root user (the enclave refuses it with its own typed reason).
pub const ROOT_QUORUM_ONLY: &str = "ROOT_QUORUM_ONLY";

/// An organization's policies compiled once, indexed by the activity types their conditions
/// require, so a decision costs what the applicable policies cost. Persistent maps: the next
/// version's index is this one with only the changed policies compiled again.
#[derive(Debug, Default, Clone)]
pub struct PolicyIndex {
    /// Every compiled policy by id (the state's order).
    policies: OrdMap<String, Arc<CompiledPolicy>>,
    /// The policies whose condition names one of a few activity types, by type.
    by_type: imbl::HashMap<String, OrdMap<String, Arc<CompiledPolicy>>>,
    /// The policies whose condition can hold for any activity type.
    any_type: OrdMap<String, Arc<CompiledPolicy>>,
}

fn compile(p: &Policy) -> Arc<CompiledPolicy> {
    Arc::new(CompiledPolicy::compile(PolicySource {
        id: p.id.as_str().into(),
        name: p.name.as_str().into(),
        effect: p.effect.as_str().into(),
        condition: p.condition.clone(),
        consensus: p.consensus.clone(),
        time: p.time.clone(),
    }))
}

/// Whether `c` was compiled from exactly `p`.
fn compiled_from(c: &CompiledPolicy, p: &Policy) -> bool {
    let s = &c.source;
    *s.id == *p.id
        && *s.name == *p.name
        && *s.effect == *p.effect
        && s.condition == p.condition
        && s.consensus == p.consensus
        && s.time == p.time
}

impl PolicyIndex {
    /// Compiles every policy of `state`.
    pub fn of(state: &OrgState) -> Self {
        let mut index = Self::default();
        for p in state.policies.values() {
            index.insert(compile(p));
        }
        index
    }

    /// This index after a change of `state` that wrote or deleted the policies `changed` (ids):
    /// only those are compiled again (a cheap copy otherwise shared with this version).
    pub fn updated<'a>(&self, state: &OrgState, changed: impl IntoIterator<Item = &'a str>) -> Self {
        let mut next = self.clone();
        for id in changed {
            let now = state.policies.get(id);
            if let (Some(c), Some(p)) = (next.policies.get(id), now) {
                if compiled_from(c, p) {
                    continue;
                }
            }
            next.remove(id);
            if let Some(p) = now {
                next.insert(compile(p));
            }
        }
        next
    }

    fn insert(&mut self, compiled: Arc<CompiledPolicy>) {
        let id = compiled.source.id.to_string();
        match &compiled.scope.types {
            Some(types) => types.iter().for_each(|t| {
                self.by_type.entry(t.clone()).or_default().insert(id.clone(), Arc::clone(&compiled));
            }),
            None => {
                self.any_type.insert(id.clone(), Arc::clone(&compiled));
            }
        }
        self.policies.insert(id, compiled);
    }

    fn remove(&mut self, id: &str) {
        let Some(old) = self.policies.remove(id) else { return };
        match &old.scope.types {
            Some(types) => types.iter().for_each(|t| {
                if let Some(m) = self.by_type.get_mut(t) {
                    m.remove(id);
                    if m.is_empty() {
                        self.by_type.remove(t);
                    }
                }
            }),
            None => {
                self.any_type.remove(id);
            }
        }
    }

    /// The policies that can apply to `subject` (the others could only be "condition false"),
    /// in id order.
    pub fn applicable(&self, subject: &Subject) -> Vec<&CompiledPolicy> {
        let mut typed = self.by_type.get(subject.activity_type).into_iter().flat_map(|m| m.iter()).peekable();
        let mut any = self.any_type.iter().peekable();
        let mut out = Vec::new();
        // Both in id order: merged, and a policy in both (it cannot be) taken once.
        loop {
            let next = match (typed.peek(), any.peek()) {
                (Some((a, _)), Some((b, _))) if a < b => typed.next(),
                (Some((a, _)), Some((b, _))) if a == b => {
                    any.next();
                    typed.next()
                }
                (Some(_), Some(_)) => any.next(),
                (Some(_), None) => typed.next(),
                (None, Some(_)) => any.next(),
                (None, None) => break,
            };
            if let Some((_, p)) = next {
                if p.scope.admits(subject.activity_type, subject.resource, subject.action) {
                    out.push(p.as_ref());
                }
            }
        }
        out
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }
}

/// A vote the enclave verified: who approved, with which credential, when.
#[derive(Debug, Clone)]
pub struct Vote<'a> {
    pub user_id: &'a str,
    pub credential: &'a Credential,
    pub at_ms: Millis,
}

/// The vote as the policy engine reads it (`credentials`, `approvers` and the 24 h window).
fn vote_json(v: &Vote<'_>) -> Value {
    let c = v.credential;
    let credential = json!({ "type": c.credential_type, "publicKey": c.public_key });
    let user = match c.kind {
        CredentialKind::Passkey => {
            json!({ "authenticators": [{ "authenticatorId": c.id, "credentialId": c.id, "credential": credential }] })
        }
        _ => json!({ "apiKeys": [{ "apiKeyId": c.id, "credential": credential }] }),
    };
    json!({
        "userId": v.user_id,
        "selection": VOTE_APPROVED,
        "createdAt": { "seconds": (v.at_ms / 1000).to_string() },
        "user": user,
    })
}

/// What is being decided: the activity, its submitter and the approvals presented.
pub struct Proposal<'a> {
    pub subject: &'a Subject,
    /// The stamped body's parameters.
    pub params: &'a Value,
    /// The submitter's user id.
    pub submitter: &'a str,
    /// Every approving vote, the submitter's first.
    pub votes: Vec<Vote<'a>>,
    pub now_ms: Millis,
    /// The submitting session's profile scope (policy language), which the activity must
    /// satisfy whatever else decides it, the root quorum included.
    pub scope: Option<&'a str>,
}

/// The reason of a denial by a session profile's scope.
pub const SESSION_PROFILE_SCOPE: &str = "SESSION_PROFILE_SCOPE";

/// Decides `p` over `state` (spec 12.2): the root quorum alone decides root-quorum-only
/// activities; others need an allowing policy (or an implicit permission) and no deny, and a
/// policy's consensus is met only by the votes presented. A root user's activity the root quorum
/// could still approve is `ConsensusNeeded`, not `Deny`.
/// The activity an invitation's receiver accepts it with.
pub const ACCEPT_INVITATION: &str = "ACTIVITY_TYPE_ACCEPT_INVITATION_V2";

pub fn decide(state: &OrgState, index: &PolicyIndex, p: &Proposal<'_>) -> Evaluation {
    let org = &state.organization;
    let now = p.now_ms.saturating_mul(1_000_000);
    let votes = Value::Array(p.votes.iter().map(vote_json).collect());
    let approvals = context::live_votes(&votes, VOTE_APPROVED, now);
    let voters = context::voter_ids(&approvals);
    let roots = voters.iter().filter(|v| org.root_user_ids.contains(v)).count() as i64;
    let facts = ActivityFacts {
        activity_type: p.subject.activity_type,
        resource: p.subject.resource,
        action: p.subject.action,
        params: p.params,
        approvals,
        now,
    };
    let org_facts = facts::organization_facts(state, p.params, &voters);
    let ctx = context::build(&facts, &org_facts);
    // A session profile's scope first: what it does not allow, nothing does.
    if let Some(scope) = p.scope {
        let allowed =
            coffer_policy::parse_condition(scope).ok().and_then(|e| coffer_policy::eval::eval_bool(&e, &ctx).ok());
        if allowed != Some(true) {
            return Evaluation::root(Decision::Deny, SESSION_PROFILE_SCOPE);
        }
    }
    // An invitation's acceptance is decided by the invitation (the enclave checked its code and
    // the key the receiver brings): it is stamped for the user it makes, whom no one else is.
    if p.subject.activity_type == ACCEPT_INVITATION {
        return match state.users.contains_key(p.submitter) {
            false => Evaluation::root(Decision::Allow, "INVITATION"),
            true => Evaluation::root(Decision::Deny, "INVITATION_ONLY"),
        };
    }
    if roots >= org.root_quorum_threshold.max(1) {
        return Evaluation::root(Decision::Allow, "ROOT_QUORUM");
    }
    if p.subject.root_quorum {
        return if roots > 0 {
            Evaluation::root(Decision::ConsensusNeeded, "ROOT_QUORUM_PENDING")
        } else {
            Evaluation::root(Decision::Deny, ROOT_QUORUM_ONLY)
        };
    }
    let policies = index.applicable(p.subject);
    let implicit = context::own_credentials(p.subject.activity_type, p.params, p.submitter);
    let mut e = decision::decide(&policies, &ctx, false, implicit);
    if e.decision == Decision::Deny && roots > 0 {
        e.decision = Decision::ConsensusNeeded;
        e.reason = "ROOT_QUORUM_PENDING";
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effect::Effect;
    use crate::model::{Organization, Policy, User};
    use crate::subjects::subject;

    fn org(threshold: i64, roots: &[&str]) -> OrgState {
        let mut s = OrgState::new(Organization {
            id: "o".into(),
            name: "o".into(),
            root_quorum_threshold: threshold,
            root_user_ids: roots.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        });
        for u in ["r1", "r2", "alice"] {
            s.apply(&Effect::PutUser { user: User { id: u.into(), name: u.into(), ..Default::default() } }).unwrap();
        }
        s
    }

    fn cred(user: &str) -> Credential {
        Credential {
            id: format!("k-{user}"),
            user_id: user.into(),
            kind: CredentialKind::ApiKey,
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            public_key: format!("02{user}"),
            expires_at_ms: 0,
        }
    }

    fn run(s: &OrgState, ty: &str, voters: &[&str]) -> Decision {
        run_scoped(s, ty, voters, None)
    }

    fn run_scoped(s: &OrgState, ty: &str, voters: &[&str], scope: Option<&str>) -> Decision {
        let creds: Vec<Credential> = voters.iter().map(|v| cred(v)).collect();
        let p = Proposal {
            subject: subject(ty).unwrap(),
            params: &json!({"signWith": "0xabc"}),
            submitter: voters[0],
            votes: creds.iter().map(|c| Vote { user_id: &c.user_id, credential: c, at_ms: 1_000 }).collect(),
            now_ms: 2_000,
            scope,
        };
        decide(s, &PolicyIndex::of(s), &p).decision
    }

    /// A session profile's scope bounds what its session submits, the root quorum's included: a
    /// scope that does not hold, or does not evaluate, denies.
    #[test]
    fn a_session_profiles_scope_denies_what_it_does_not_allow() {
        let s = org(1, &["r1"]);
        let signing = Some("activity.resource == 'PRIVATE_KEY' && activity.action == 'SIGN'");
        assert_eq!(run_scoped(&s, SIGN, &["r1"], signing), Decision::Allow);
        assert_eq!(run_scoped(&s, "ACTIVITY_TYPE_CREATE_USERS_V4", &["r1"], signing), Decision::Deny);
        assert_eq!(run_scoped(&s, SIGN, &["r1"], Some("activity.resource ==")), Decision::Deny, "does not parse");
        assert_eq!(run_scoped(&s, SIGN, &["r1"], Some("'a'")), Decision::Deny, "not a bool");
        assert_eq!(run(&s, "ACTIVITY_TYPE_CREATE_USERS_V4", &["r1"]), Decision::Allow);
    }

    const SIGN: &str = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";

    #[test]
    fn quorum_and_policies_decide() {
        let s = org(2, &["r1", "r2"]);
        assert_eq!(run(&s, SIGN, &["r1"]), Decision::ConsensusNeeded, "one root of two");
        assert_eq!(run(&s, SIGN, &["r1", "r2"]), Decision::Allow);
        assert_eq!(run(&s, SIGN, &["alice"]), Decision::Deny, "no policy: implicit deny");
        assert_eq!(run(&s, "ACTIVITY_TYPE_UPDATE_ROOT_QUORUM", &["alice"]), Decision::Deny);
        let mut s = s;
        s.apply(&Effect::PutPolicy {
            policy: Policy {
                id: "p1".into(),
                name: "alice signs".into(),
                effect: "EFFECT_ALLOW".into(),
                condition: format!("activity.type == '{SIGN}'"),
                consensus: "approvers.any(user, user.id == 'alice')".into(),
                time: String::new(),
            },
        })
        .unwrap();
        assert_eq!(run(&s, SIGN, &["alice"]), Decision::Allow);
        assert_eq!(run(&s, "ACTIVITY_TYPE_CREATE_USERS_V4", &["alice"]), Decision::Deny);
        s.apply(&Effect::PutPolicy {
            policy: Policy {
                id: "p0".into(),
                name: "no signing".into(),
                effect: "EFFECT_DENY".into(),
                condition: "activity.resource == 'PRIVATE_KEY'".into(),
                consensus: String::new(),
                time: String::new(),
            },
        })
        .unwrap();
        assert_eq!(run(&s, SIGN, &["alice"]), Decision::Deny, "a deny wins");
    }

    #[test]
    fn an_updated_index_is_the_index_of_the_new_state() {
        let policy = |id: &str, effect: &str, condition: &str| Policy {
            id: id.into(),
            name: id.into(),
            effect: effect.into(),
            condition: condition.into(),
            consensus: String::new(),
            time: String::new(),
        };
        let mut s = org(1, &["r1"]);
        for (id, effect, condition) in [
            ("a", "EFFECT_ALLOW", format!("activity.type == '{SIGN}'")),
            ("b", "EFFECT_DENY", "activity.resource == 'PRIVATE_KEY'".to_string()),
            ("c", "EFFECT_ALLOW", "activity.type == 'ACTIVITY_TYPE_CREATE_USERS_V4'".to_string()),
        ] {
            s.apply(&Effect::PutPolicy { policy: policy(id, effect, &condition) }).unwrap();
        }
        let before = PolicyIndex::of(&s);
        let ids = |i: &PolicyIndex, ty: &str| -> Vec<String> {
            i.applicable(subject(ty).unwrap()).iter().map(|p| p.source.id.to_string()).collect()
        };
        assert_eq!(ids(&before, SIGN), ["a", "b"]);
        // "a" now names another type, "b" is deleted, "0" is new and applies to everything.
        s.apply(&Effect::PutPolicy {
            policy: policy("a", "EFFECT_ALLOW", "activity.type == 'ACTIVITY_TYPE_CREATE_USERS_V4'"),
        })
        .unwrap();
        s.apply(&Effect::DeletePolicies { ids: vec!["b".into()] }).unwrap();
        s.apply(&Effect::PutPolicy { policy: policy("0", "EFFECT_DENY", "true") }).unwrap();
        let after = before.updated(&s, ["a", "b", "0"]);
        let fresh = PolicyIndex::of(&s);
        for ty in [SIGN, "ACTIVITY_TYPE_CREATE_USERS_V4", "ACTIVITY_TYPE_CREATE_POLICY_V3"] {
            assert_eq!(ids(&after, ty), ids(&fresh, ty), "{ty}");
        }
        assert_eq!(ids(&after, SIGN), ["0"]);
        assert_eq!(ids(&after, "ACTIVITY_TYPE_CREATE_USERS_V4"), ["0", "a", "c"]);
        assert_eq!(ids(&before, SIGN), ["a", "b"], "the old version is unchanged");
        assert_eq!((after.len(), before.len()), (3, 3));
    }

    #[test]
    fn old_votes_do_not_count() {
        let s = org(2, &["r1", "r2"]);
        let (a, b) = (cred("r1"), cred("r2"));
        let p = Proposal {
            subject: subject(SIGN).unwrap(),
            params: &json!({}),
            submitter: "r1",
            votes: vec![
                Vote { user_id: "r1", credential: &a, at_ms: 100 * 3_600_000 },
                Vote { user_id: "r2", credential: &b, at_ms: 1_000 },
            ],
            now_ms: 100 * 3_600_000,
            scope: None,
        };
        assert_eq!(decide(&s, &PolicyIndex::of(&s), &p).decision, Decision::ConsensusNeeded);
    }
}
