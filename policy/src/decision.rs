//! The decision (spec 12.2): root quorum, then explicit deny, then an allow whose consensus is
//! met, then implicit permissions, then consensus needed, else implicit deny; with one outcome
//! per policy and the clause that decided it.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::eval::{eval_bool, Val};
use crate::{parse_condition, parse_consensus, parse_time};

pub const OUTCOME_ALLOW: &str = "OUTCOME_ALLOW";
pub const OUTCOME_DENY_EXPLICIT: &str = "OUTCOME_DENY_EXPLICIT";
pub const OUTCOME_DENY_IMPLICIT: &str = "OUTCOME_DENY_IMPLICIT";
pub const OUTCOME_REQUIRES_CONSENSUS: &str = "OUTCOME_REQUIRES_CONSENSUS";
pub const OUTCOME_REJECTED: &str = "OUTCOME_REJECTED";
pub const OUTCOME_ERROR: &str = "OUTCOME_ERROR";

/// What happens to the activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    ConsensusNeeded,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "DECISION_ALLOW",
            Decision::Deny => "DECISION_DENY",
            Decision::ConsensusNeeded => "DECISION_CONSENSUS_NEEDED",
        }
    }
}

/// A policy as the engine reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySource {
    pub id: String,
    pub name: String,
    pub effect: String,
    pub condition: String,
    pub consensus: String,
    pub time: String,
}

impl PolicySource {
    /// From a stored policy: its id, name and `{effect, condition, consensus, time}` JSON.
    pub fn from_json(id: &str, name: &str, data: &Value) -> Self {
        let text = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        Self {
            id: id.to_string(),
            name: name.to_string(),
            effect: text("effect"),
            condition: text("condition"),
            consensus: text("consensus"),
            time: text("time"),
        }
    }
}

/// One policy's outcome, with the clause that decided it (`time`, `condition`, `consensus`) and
/// the evaluation error when there was one.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyOutcome {
    pub policy_id: String,
    pub policy_name: String,
    pub effect: String,
    pub outcome: &'static str,
    pub clause: &'static str,
    pub detail: Option<String>,
}

/// The decision and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub decision: Decision,
    /// `ROOT_QUORUM`, `EXPLICIT_DENY`, `POLICY_ALLOW`, `IMPLICIT_PERMISSION`, `CONSENSUS_NEEDED`,
    /// `IMPLICIT_DENY`.
    pub reason: &'static str,
    pub outcomes: Vec<PolicyOutcome>,
}

impl Evaluation {
    /// The `[{policyId, outcome}]` list `get_policy_evaluations` serves.
    pub fn outcomes_json(&self) -> Value {
        Value::Array(self.outcomes.iter().map(|o| json!({ "policyId": o.policy_id, "outcome": o.outcome })).collect())
    }

    /// A root-quorum decision (policies are not consulted).
    pub fn root(decision: Decision, reason: &'static str) -> Self {
        Self { decision, reason, outcomes: Vec::new() }
    }
}

/// A policy with its three clauses parsed once (a clause that does not parse keeps its error,
/// which every evaluation reports), so evaluating costs no parsing.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledPolicy {
    pub source: PolicySource,
    time: Result<crate::expr::Expr, String>,
    condition: Result<crate::expr::Expr, String>,
    consensus: Result<crate::expr::Expr, String>,
    /// The activities the condition can hold for (all when it does not parse).
    pub scope: crate::scope::Scope,
}

impl CompiledPolicy {
    pub fn compile(source: PolicySource) -> Self {
        let parsed = |src: &str, parse: fn(&str) -> Result<crate::expr::Expr, crate::error::PolicyError>| {
            parse(src).map_err(|e| format!("invalid expression: {e}"))
        };
        let condition = parsed(&source.condition, parse_condition);
        Self {
            time: parsed(&source.time, parse_time),
            scope: condition.as_ref().map(crate::scope::Scope::of).unwrap_or_default(),
            condition,
            consensus: parsed(&source.consensus, parse_consensus),
            source,
        }
    }
}

/// `Ok(b)`, or the error text, for one clause.
fn clause(expr: &Result<crate::expr::Expr, String>, roots: &BTreeMap<String, Val>) -> Result<bool, String> {
    let expr = expr.as_ref().map_err(Clone::clone)?;
    eval_bool(expr, roots).map_err(|e| e.message)
}

/// Evaluates one policy: every clause is evaluated (no short-circuit); any error is an error.
pub fn evaluate_policy(c: &CompiledPolicy, roots: &BTreeMap<String, Val>) -> PolicyOutcome {
    let p = &c.source;
    let time = clause(&c.time, roots);
    let condition = clause(&c.condition, roots);
    let consensus = clause(&c.consensus, roots);
    let out = |outcome, clause, detail| PolicyOutcome {
        policy_id: p.id.clone(),
        policy_name: p.name.clone(),
        effect: p.effect.clone(),
        outcome,
        clause,
        detail,
    };
    let deny = p.effect == "EFFECT_DENY";
    match (time, condition, consensus) {
        (Err(e), _, _) => out(OUTCOME_ERROR, "time", Some(e)),
        (_, Err(e), _) => out(OUTCOME_ERROR, "condition", Some(e)),
        (_, _, Err(e)) => out(OUTCOME_ERROR, "consensus", Some(e)),
        (Ok(false), _, _) => out(OUTCOME_DENY_IMPLICIT, "time", Some("outside the policy's time window".into())),
        (_, Ok(false), _) => out(OUTCOME_DENY_IMPLICIT, "condition", None),
        (_, _, Ok(true)) if deny => out(OUTCOME_DENY_EXPLICIT, "consensus", None),
        (_, _, Ok(false)) if deny => out(OUTCOME_DENY_IMPLICIT, "consensus", None),
        (_, _, Ok(true)) => out(OUTCOME_ALLOW, "consensus", None),
        (_, _, Ok(false)) => out(OUTCOME_REQUIRES_CONSENSUS, "consensus", None),
    }
}

/// Spec 12.2 over the organization's policies. `root_quorum_met`: the approvers include a
/// quorum of root users; `implicit`: an implicit permission covers the activity.
pub fn decide(
    policies: &[&CompiledPolicy],
    roots: &BTreeMap<String, Val>,
    root_quorum_met: bool,
    implicit: bool,
) -> Evaluation {
    let outcomes: Vec<PolicyOutcome> = policies.iter().map(|p| evaluate_policy(p, roots)).collect();
    let any = |o: &str| outcomes.iter().any(|x| x.outcome == o);
    let (decision, reason) = if root_quorum_met {
        (Decision::Allow, "ROOT_QUORUM")
    } else if any(OUTCOME_DENY_EXPLICIT) {
        (Decision::Deny, "EXPLICIT_DENY")
    } else if any(OUTCOME_ALLOW) {
        (Decision::Allow, "POLICY_ALLOW")
    } else if implicit {
        (Decision::Allow, "IMPLICIT_PERMISSION")
    } else if any(OUTCOME_REQUIRES_CONSENSUS) {
        (Decision::ConsensusNeeded, "CONSENSUS_NEEDED")
    } else {
        (Decision::Deny, "IMPLICIT_DENY")
    };
    Evaluation { decision, reason, outcomes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(id: &str, effect: &str, condition: &str, consensus: &str) -> CompiledPolicy {
        CompiledPolicy::compile(PolicySource {
            id: id.into(),
            name: id.into(),
            effect: effect.into(),
            condition: condition.into(),
            consensus: consensus.into(),
            time: String::new(),
        })
    }

    fn roots(approvers: &[&str], wallet: &str) -> BTreeMap<String, Val> {
        let v = json!({
            "activity": {"type": "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "kind": "SIGN_RAW_PAYLOAD", "resource": "PRIVATE_KEY", "action": "SIGN", "params": {}},
            "approvers": approvers.iter().map(|a| json!({"id": a, "tags": [], "email": "", "alias": a})).collect::<Vec<_>>(),
            "credentials": [],
            "wallet": {"id": wallet, "imported": false, "exported": false, "label": ""},
        });
        match Val::from_json(&v) {
            Val::Map(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn decision_order() {
        let allow_w1 = policy("a", "EFFECT_ALLOW", "wallet.id == 'w1'", "");
        let deny_w1 = policy("d", "EFFECT_DENY", "wallet.id == 'w1'", "");
        let two = policy("c", "EFFECT_ALLOW", "wallet.id == 'w2'", "approvers.count() >= 2");
        let broken = policy("e", "EFFECT_ALLOW", "wallet.id == 'w1' || private_key.id == 'k'", "");

        let e = decide(&[&allow_w1], &roots(&["u"], "w1"), false, false);
        assert_eq!((e.decision, e.reason), (Decision::Allow, "POLICY_ALLOW"));
        assert_eq!(e.outcomes_json(), json!([{"policyId": "a", "outcome": OUTCOME_ALLOW}]));
        let e = decide(&[&allow_w1], &roots(&["u"], "w9"), false, false);
        assert_eq!((e.decision, e.outcomes[0].outcome), (Decision::Deny, OUTCOME_DENY_IMPLICIT));
        assert_eq!(e.outcomes[0].clause, "condition");
        let e = decide(&[&allow_w1, &deny_w1], &roots(&["u"], "w1"), false, false);
        assert_eq!((e.decision, e.reason), (Decision::Deny, "EXPLICIT_DENY"));
        // Root quorum bypasses policies, deny included.
        assert_eq!(decide(&[&deny_w1], &roots(&["u"], "w1"), true, false).decision, Decision::Allow);
        let e = decide(&[&two], &roots(&["u"], "w2"), false, false);
        assert_eq!((e.decision, e.outcomes[0].outcome), (Decision::ConsensusNeeded, OUTCOME_REQUIRES_CONSENSUS));
        assert_eq!(decide(&[&two], &roots(&["u", "v"], "w2"), false, false).decision, Decision::Allow);
        // An erroring policy never allows.
        let e = decide(&[&broken], &roots(&["u"], "w1"), false, false);
        assert_eq!((e.decision, e.outcomes[0].outcome), (Decision::Deny, OUTCOME_ERROR));
        assert!(e.outcomes[0].detail.as_deref().unwrap().contains("MissingField"));
        // Implicit permission, and nothing at all.
        assert_eq!(decide(&[], &roots(&["u"], "w1"), false, true).reason, "IMPLICIT_PERMISSION");
        assert_eq!(decide(&[], &roots(&["u"], "w1"), false, false).reason, "IMPLICIT_DENY");
    }

    #[test]
    fn time_window_and_consensus_by_user() {
        let p = policy("t", "EFFECT_ALLOW", "", "approvers.any(user, user.id == 'boss')");
        let mut r = roots(&["u"], "w");
        let mut time = BTreeMap::new();
        time.insert("now".to_string(), Val::Time(1_736_899_200_000_000_000));
        r.insert("time".into(), Val::Map(time));
        assert_eq!(evaluate_policy(&p, &r).outcome, OUTCOME_REQUIRES_CONSENSUS);
        let with_time = |time: &str| CompiledPolicy::compile(PolicySource { time: time.into(), ..p.source.clone() });
        let o = evaluate_policy(&with_time("time.now < Timestamp('2025-01-01T00:00:00Z')"), &r);
        assert_eq!((o.outcome, o.clause), (OUTCOME_DENY_IMPLICIT, "time"));
        let p = with_time("time.now >= Timestamp('2025-01-01T00:00:00Z')");
        assert_eq!(evaluate_policy(&p, &roots(&["boss"], "w")).outcome, OUTCOME_ERROR);
        // no time.now
    }
}
