//! The decision (spec 12.2): root quorum, then explicit deny, then an allow whose consensus is
//! met, then implicit permissions, then consensus needed, else implicit deny; with one outcome
//! per policy and the clause that decided it.
//!
//! # Denies fail closed
//!
//! A policy whose evaluation errs — a missing field (`eth.tx.chain_id` on a legacy transaction),
//! a type error, the step budget or the time limit running out
//! ([`crate::eval::EvalErrorKind`]), a clause that no longer parses under the caps — has the
//! outcome `OUTCOME_ERROR`, with the clause and the error as its detail. What that outcome does
//! depends on the effect:
//!
//! - **`EFFECT_ALLOW` that errs allows nothing**: it is not an `OUTCOME_ALLOW`, so the decision
//!   goes on as if the policy had not matched (an implicit permission, consensus, or the
//!   implicit deny).
//! - **`EFFECT_DENY` that errs denies**: the decision is `DECISION_DENY` with the reason
//!   `EXPLICIT_DENY` (the hosted service's reasons have no "denied by an error"; an explicit
//!   deny is the closest, and the policy's own outcome, `OUTCOME_ERROR` with its detail, says
//!   why), ahead of any allow. Only a root quorum still bypasses it, as it bypasses every policy.
//!
//! A DENY errs "to deny" only when it could have matched: when one of its clauses is definitely
//! false — the time window is over, the condition or the consensus is `false`, or the
//! condition's top-level `activity.type` / `resource` / `action` conjuncts exclude the activity
//! ([`crate::scope::Scope`], which the gateway also uses to skip the policies that cannot
//! apply) — it is `OUTCOME_DENY_IMPLICIT` like a deny that does not match, whatever the other
//! clauses did (`false && error` is false). Inside a DENY's expressions `&&` and `||` read the
//! same way, as CEL does ([`crate::eval::Env::deciding_operands`]): a `false` conjunct makes the
//! conjunction false and a `true` disjunct makes the disjunction true, whatever the other
//! operands did, errors included. So scope a DENY that names fields some activities lack:
//! `activity.params.type == 'TRANSACTION_TYPE_ETHEREUM' && eth.tx.value > 1000` leaves Solana
//! signing alone, while an unscoped `eth.tx.value > 1000` errs, and denies, on every activity
//! without an Ethereum transaction. ALLOW policies keep the hosted service's reading (an
//! operand's error is the expression's error), which allows nothing.
//!
//! **Where this differs from the hosted service.** The hosted service documents that a policy
//! whose evaluation errors is skipped, for either effect. Skipping is harmless for an ALLOW (it
//! fails closed by itself) but makes a DENY fail *open*: whoever can make the DENY err — a
//! transaction without the field it reads (a pre-EIP-155 transaction and `eth.tx.chain_id`), a
//! list long enough to run it out of budget (an EIP-7702 transaction with 1,000 authorizations
//! against a deny list) — gets the request past it, and signed. A custody deployment's denies
//! are its hard limits (recipients, chains, amounts, key exports); a request the engine could
//! not check against one must be refused, and the refusal is visible (the policy's outcome and
//! its detail in `get_policy_evaluations` and the dry run) and fixable by the policy's author,
//! whereas a signed transaction cannot be taken back.

//!
//! # One budget per decision
//!
//! A decision evaluates every clause of every applicable policy within one [`DecisionBudget`]
//! (steps and a deadline for the whole set, the facts it reads charged first): DENY policies
//! first, then the others. A clause evaluated once the budget has run out errs at its first
//! step. A decision that ran out did not read every policy, so it allows through no ALLOW and
//! waits for no consensus: it denies ([`BUDGET_EXHAUSTED`]) unless a DENY denied first, a root
//! quorum or an implicit permission allows. An organization cannot make one of its decisions
//! cost more than the budget, whatever its policies and the activity's input.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use serde_json::{json, Value};

use crate::eval::{eval_bool_in, DecisionBudget, Env, EvalError, EvalErrorKind, Val};
use crate::{parse_condition, parse_consensus, parse_time};

pub const OUTCOME_ALLOW: &str = "OUTCOME_ALLOW";
pub const OUTCOME_DENY_EXPLICIT: &str = "OUTCOME_DENY_EXPLICIT";
pub const OUTCOME_DENY_IMPLICIT: &str = "OUTCOME_DENY_IMPLICIT";
pub const OUTCOME_REQUIRES_CONSENSUS: &str = "OUTCOME_REQUIRES_CONSENSUS";
pub const OUTCOME_REJECTED: &str = "OUTCOME_REJECTED";
pub const OUTCOME_ERROR: &str = "OUTCOME_ERROR";

/// What reading one policy costs a decision beyond its clauses (looking its clauses up, its
/// outcome), in evaluator steps: 100,000 policies whose clauses all share one evaluation are
/// still 800,000 steps, past the decision's budget.
pub const POLICY_STEPS: u64 = 8;

/// The reason of a decision that ran out of its budget ([`DecisionBudget`]) before reading every
/// applicable policy: it denies (unless a root quorum or an implicit permission allows).
pub const BUDGET_EXHAUSTED: &str = "BUDGET_EXHAUSTED";

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
    /// Shared with every outcome of the policy (an outcome per policy per decision).
    pub id: Arc<str>,
    pub name: Arc<str>,
    pub effect: Arc<str>,
    pub condition: String,
    pub consensus: String,
    pub time: String,
}

impl PolicySource {
    /// From a stored policy: its id, name and `{effect, condition, consensus, time}` JSON.
    pub fn from_json(id: &str, name: &str, data: &Value) -> Self {
        let text = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        Self {
            id: id.into(),
            name: name.into(),
            effect: text("effect").into(),
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
    pub policy_id: Arc<str>,
    pub policy_name: Arc<str>,
    pub effect: Arc<str>,
    pub outcome: &'static str,
    pub clause: &'static str,
    pub detail: Option<String>,
}

/// The decision and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub decision: Decision,
    /// `ROOT_QUORUM`, `EXPLICIT_DENY` (also a DENY whose evaluation erred), [`BUDGET_EXHAUSTED`],
    /// `POLICY_ALLOW`, `IMPLICIT_PERMISSION`, `CONSENSUS_NEEDED`, `IMPLICIT_DENY`.
    pub reason: &'static str,
    pub outcomes: Vec<PolicyOutcome>,
}

impl Evaluation {
    /// The `[{policyId, outcome}]` list `get_policy_evaluations` serves.
    pub fn outcomes_json(&self) -> Value {
        Value::Array(self.outcomes.iter().map(|o| json!({ "policyId": &*o.policy_id, "outcome": o.outcome })).collect())
    }

    /// [`Evaluation::outcomes_json`] as JSON text, written straight from the outcomes (an
    /// organization with 1,000 applicable policies records 1,000 of them with every activity).
    pub fn outcomes_json_text(&self) -> String {
        let mut out = Vec::with_capacity(2 + self.outcomes.len() * 72);
        out.push(b'[');
        for (i, o) in self.outcomes.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"policyId\":");
            // Writing a string into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut out, &*o.policy_id);
            out.extend_from_slice(b",\"outcome\":\"");
            out.extend_from_slice(o.outcome.as_bytes());
            out.extend_from_slice(b"\"}");
        }
        out.push(b']');
        String::from_utf8(out).unwrap_or_else(|_| "[]".into())
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
    time: Parsed,
    condition: Parsed,
    consensus: Parsed,
    /// The activities the condition can hold for (all when it does not parse).
    pub scope: crate::scope::Scope,
}

/// A parsed clause (or why it does not parse), shared by the compiled policies that have the same
/// text in the same place ([`parsed`]).
type Parsed = Arc<Result<crate::expr::Expr, String>>;

/// A clause's place in a policy (its text is parsed by the matching grammar).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClauseKind {
    Time,
    Condition,
    Consensus,
}

/// The clauses parsed in this process, by text and place, while some compiled policy holds them:
/// 50,000 policies made from one template hold one parsed condition, not 50,000.
static PARSED: Mutex<Option<ParsedClauses>> = Mutex::new(None);

#[derive(Default)]
struct ParsedClauses {
    by_text: HashMap<Box<str>, [Weak<Result<crate::expr::Expr, String>>; 3]>,
    /// Entries past which the dead ones are dropped (twice the live ones at the last sweep).
    sweep_at: usize,
}

/// `text` parsed as the clause `kind`, shared with the compiled policies that already hold it.
/// Sharing is best effort (two threads parsing one text at once may each keep their own); what
/// relies on it, [`ClauseMemo`], is only faster for it, never wrong without it.
fn parsed(kind: ClauseKind, text: &str) -> Parsed {
    let place = kind as usize;
    let held = PARSED.lock().ok().and_then(|g| g.as_ref()?.by_text.get(text)?[place].upgrade());
    if let Some(p) = held {
        return p;
    }
    let parse = match kind {
        ClauseKind::Time => parse_time,
        ClauseKind::Condition => parse_condition,
        ClauseKind::Consensus => parse_consensus,
    };
    let fresh: Parsed = Arc::new(parse(text).map_err(|e| format!("invalid expression: {e}")));
    if let Ok(mut guard) = PARSED.lock() {
        let clauses = guard.get_or_insert_with(ParsedClauses::default);
        if clauses.by_text.len() >= clauses.sweep_at {
            clauses.by_text.retain(|_, slots| slots.iter().any(|w| w.strong_count() > 0));
            clauses.sweep_at = (clauses.by_text.len() * 2).max(1024);
        }
        let slots = clauses.by_text.entry(text.into()).or_default();
        match slots[place].upgrade() {
            Some(p) => return p,
            None => slots[place] = Arc::downgrade(&fresh),
        }
    }
    fresh
}

impl CompiledPolicy {
    pub fn compile(source: PolicySource) -> Self {
        let condition = parsed(ClauseKind::Condition, &source.condition);
        Self {
            time: parsed(ClauseKind::Time, &source.time),
            scope: condition.as_ref().as_ref().map(crate::scope::Scope::of).unwrap_or_default(),
            condition,
            consensus: parsed(ClauseKind::Consensus, &source.consensus),
            source,
        }
    }
}

/// The values of the clauses one decision has evaluated, by parsed clause: policies that test
/// the same things (the same condition, the same consensus, no time window) hold the same parsed
/// clause ([`parsed`]) and share one evaluation, so 1,000 policies made from one template cost a
/// few evaluations, not 3,000. Sound because a clause's value depends only on the clause, how it
/// is read (a DENY's reading differs from an ALLOW's) and the context, which is the same for
/// every policy of one decision; the key is the parsed clause's address, which no other clause
/// has while the policies are borrowed. An evaluation that ran out of steps or time is shared
/// too: each policy would have run out the same way.
///
/// The memo also holds the decision's budget ([`DecisionBudget`]): every clause it evaluates
/// draws on it.
struct ClauseMemo<'b> {
    values: HashMap<(usize, bool), Result<bool, EvalError>>,
    budget: &'b mut DecisionBudget,
}

impl<'b> ClauseMemo<'b> {
    fn new(budget: &'b mut DecisionBudget) -> Self {
        Self { values: HashMap::new(), budget }
    }

    fn value(&mut self, clause_of: &Parsed, roots: &BTreeMap<String, Val>, deny: bool) -> Result<bool, EvalError> {
        let key = (Arc::as_ptr(clause_of) as usize, deny);
        if let Some(value) = self.values.get(&key) {
            return value.clone();
        }
        let value = match clause_of.as_ref() {
            Ok(expr) => {
                let mut env = Env::within(roots, self.budget);
                if deny {
                    env = env.deciding_operands();
                }
                let value = eval_bool_in(expr, &mut env);
                self.budget.settle(&env, &value);
                value
            }
            Err(message) => Err(EvalError { kind: EvalErrorKind::Failed, message: message.clone() }),
        };
        self.values.insert(key, value.clone());
        value
    }
}

impl PolicyOutcome {
    /// Whether this outcome makes the decision a deny: an explicit deny, or a DENY policy whose
    /// evaluation erred (denies fail closed, see the module documentation).
    pub fn denies(&self) -> bool {
        self.outcome == OUTCOME_DENY_EXPLICIT || (self.outcome == OUTCOME_ERROR && &*self.effect == "EFFECT_DENY")
    }
}

/// `activity.type`, `.resource` and `.action` of the context, when all three are there.
fn activity_fields(roots: &BTreeMap<String, Val>) -> Option<(&str, &str, &str)> {
    let Some(Val::Map(a)) = roots.get("activity") else { return None };
    let text = |k: &str| match a.get(k) {
        Some(Val::Str(s)) => Some(s.as_str()),
        _ => None,
    };
    Some((text("type")?, text("resource")?, text("action")?))
}

/// Evaluates one policy: every clause is evaluated (no short-circuit). For an ALLOW any error is
/// the outcome; for a DENY a definitely false clause comes first, then an error (which denies:
/// see the module documentation).
pub fn evaluate_policy(c: &CompiledPolicy, roots: &BTreeMap<String, Val>) -> PolicyOutcome {
    evaluate_policy_in(c, roots, &mut ClauseMemo::new(&mut DecisionBudget::start()))
}

/// [`evaluate_policy`], with the clause values `memo` holds from the decision's other policies.
fn evaluate_policy_in(c: &CompiledPolicy, roots: &BTreeMap<String, Val>, memo: &mut ClauseMemo<'_>) -> PolicyOutcome {
    let p = &c.source;
    let deny = &*p.effect == "EFFECT_DENY";
    let (time, condition, consensus) = match memo.budget.admit(POLICY_STEPS) {
        Ok(()) => (
            memo.value(&c.time, roots, deny),
            memo.value(&c.condition, roots, deny),
            memo.value(&c.consensus, roots, deny),
        ),
        // Past the budget, a policy is not read, even where the memo holds its clauses: the
        // error is reported on its condition (its time window is not read either).
        Err(e) => (Ok(true), Err(e.clone()), Err(e)),
    };
    let out = |outcome, clause, detail| PolicyOutcome {
        policy_id: p.id.clone(),
        policy_name: p.name.clone(),
        effect: p.effect.clone(),
        outcome,
        clause,
        detail,
    };
    if deny {
        let out_of_scope =
            activity_fields(roots).is_some_and(|(t, resource, action)| !c.scope.admits(t, resource, action));
        return match (time, condition, consensus) {
            (Ok(false), _, _) => out(OUTCOME_DENY_IMPLICIT, "time", Some("outside the policy's time window".into())),
            (_, Ok(false), _) => out(OUTCOME_DENY_IMPLICIT, "condition", None),
            (_, Err(_), _) if out_of_scope => out(
                OUTCOME_DENY_IMPLICIT,
                "condition",
                Some("the activity's type, resource or action is outside the condition's scope".into()),
            ),
            (_, _, Ok(false)) => out(OUTCOME_DENY_IMPLICIT, "consensus", None),
            (Err(e), _, _) => out(OUTCOME_ERROR, "time", Some(e.message)),
            (_, Err(e), _) => out(OUTCOME_ERROR, "condition", Some(e.message)),
            (_, _, Err(e)) => out(OUTCOME_ERROR, "consensus", Some(e.message)),
            (Ok(true), Ok(true), Ok(true)) => out(OUTCOME_DENY_EXPLICIT, "consensus", None),
        };
    }
    match (time, condition, consensus) {
        (Err(e), _, _) => out(OUTCOME_ERROR, "time", Some(e.message)),
        (_, Err(e), _) => out(OUTCOME_ERROR, "condition", Some(e.message)),
        (_, _, Err(e)) => out(OUTCOME_ERROR, "consensus", Some(e.message)),
        (Ok(false), _, _) => out(OUTCOME_DENY_IMPLICIT, "time", Some("outside the policy's time window".into())),
        (_, Ok(false), _) => out(OUTCOME_DENY_IMPLICIT, "condition", None),
        (_, _, Ok(true)) => out(OUTCOME_ALLOW, "consensus", None),
        (_, _, Ok(false)) => out(OUTCOME_REQUIRES_CONSENSUS, "consensus", None),
    }
}

/// Spec 12.2 over the organization's policies. `root_quorum_met`: the approvers include a
/// quorum of root users; `implicit`: an implicit permission covers the activity.
///
/// Within one [`DecisionBudget`] ([`DecisionBudget::start`]): see [`decide_within`].
pub fn decide(
    policies: &[&CompiledPolicy],
    roots: &BTreeMap<String, Val>,
    root_quorum_met: bool,
    implicit: bool,
) -> Evaluation {
    decide_within(&mut DecisionBudget::start(), policies, roots, root_quorum_met, implicit)
}

/// [`decide`] within `budget`: the facts (`roots`) are charged to it first, then every clause
/// evaluated draws on what is left. DENY policies are evaluated before the others, so that a
/// policy set whose ALLOWs spend the budget still reads its DENYs; once the budget has run out a
/// clause errs at once, so an ALLOW allows nothing and a DENY that could apply denies (the module
/// documentation). The outcomes stay in the order of `policies`; `budget` tells afterwards what
/// the decision spent.
pub fn decide_within(
    budget: &mut DecisionBudget,
    policies: &[&CompiledPolicy],
    roots: &BTreeMap<String, Val>,
    root_quorum_met: bool,
    implicit: bool,
) -> Evaluation {
    budget.charge_facts(roots);
    let mut memo = ClauseMemo::new(budget);
    let mut outcomes: Vec<Option<PolicyOutcome>> = vec![None; policies.len()];
    let denies_first = (0..policies.len())
        .filter(|&i| &*policies[i].source.effect == "EFFECT_DENY")
        .chain((0..policies.len()).filter(|&i| &*policies[i].source.effect != "EFFECT_DENY"));
    for i in denies_first {
        outcomes[i] = Some(evaluate_policy_in(policies[i], roots, &mut memo));
    }
    let outcomes: Vec<PolicyOutcome> = outcomes.into_iter().flatten().collect();
    let any = |o: &str| outcomes.iter().any(|x| x.outcome == o);
    let (decision, reason) = if root_quorum_met {
        (Decision::Allow, "ROOT_QUORUM")
    } else if outcomes.iter().any(PolicyOutcome::denies) {
        // An explicit deny, or a DENY that erred (fails closed; `EXPLICIT_DENY` is the closest
        // of the hosted service's reasons).
        (Decision::Deny, "EXPLICIT_DENY")
    } else if budget.ran_out() {
        // Not every policy was read: no ALLOW allows, and none asks for consensus (the
        // outcomes that erred say why, in their detail). An implicit permission is no policy's.
        match implicit {
            true => (Decision::Allow, "IMPLICIT_PERMISSION"),
            false => (Decision::Deny, BUDGET_EXHAUSTED),
        }
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
        let odd =
            decide(&[&policy("a\"\\\u{1}b", "EFFECT_ALLOW", "true", ""), &two], &roots(&["u"], "w2"), false, false);
        assert_eq!(serde_json::from_str::<Value>(&odd.outcomes_json_text()).unwrap(), odd.outcomes_json());
        assert_eq!(decide(&[], &roots(&["u"], "w1"), false, false).outcomes_json_text(), "[]");
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
    fn a_time_window_holds_or_not_at_a_given_instant() {
        let at = |rfc: &str| {
            crate::time_window_holds(&format!("time.now < Timestamp('{rfc}')"), 1_700_000_000 * 1_000_000_000)
        };
        assert_eq!(at("2025-01-01T00:00:00Z"), Ok(true));
        assert_eq!(at("2020-01-01T00:00:00Z"), Ok(false));
        assert_eq!(crate::time_window_holds("", 0), Ok(true));
        assert!(crate::time_window_holds("time.now < Timestamp('2030-01-01')", 0).is_err());
        assert!(crate::time_window_holds("activity.type == 'x'", 0).is_err(), "a window names time alone");
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

    fn with(mut r: BTreeMap<String, Val>, key: &str, v: Value) -> BTreeMap<String, Val> {
        r.insert(key.into(), Val::from_json(&v));
        r
    }

    /// The tree a stored condition parses to without the caps (a policy written before them).
    fn stored(id: &str, effect: &str, condition: &str) -> CompiledPolicy {
        let unbounded = crate::Limits {
            max_clause_bytes: usize::MAX,
            max_list_len: usize::MAX,
            eval: crate::EvalLimits { max_steps: u32::MAX, ..crate::EvalLimits::DEFAULT },
        };
        let mut p = policy(id, effect, "", "");
        p.source.condition = condition.into();
        p.condition = Arc::new(Ok(crate::parser::parse_with(condition, crate::CONDITION_ROOTS, &unbounded).unwrap()));
        p
    }

    #[test]
    fn a_deny_that_runs_out_of_budget_denies() {
        let allow = policy("a", "EFFECT_ALLOW", "wallet.id == 'w1'", "");
        let r = roots(&["u"], "w1");
        // Issue 23: with 10 items the DENY matched; with 5,000 it ran out of budget and the
        // ALLOW signed.
        let list = |n: usize| format!("[{}]", vec!["0"; n].join(","));
        let ten = policy("d", "EFFECT_DENY", &format!("{}.any(x, x == 0)", list(10)), "");
        let e = decide(&[&allow, &ten], &r, false, false);
        assert_eq!(
            (e.decision, e.reason, e.outcomes[1].outcome),
            (Decision::Deny, "EXPLICIT_DENY", OUTCOME_DENY_EXPLICIT)
        );
        // As written now: the parser refuses it (too costly); as stored before, the clause
        // does not parse, which errs, which denies.
        let src = format!("{}.any(x, x == 0)", list(5_000));
        assert!(crate::parse_condition(&src).is_err());
        let refused = policy("d", "EFFECT_DENY", &src, "");
        let e = decide(&[&allow, &refused], &r, false, false);
        assert_eq!((e.decision, e.reason), (Decision::Deny, "EXPLICIT_DENY"));
        assert_eq!((e.outcomes[1].outcome, e.outcomes[1].clause), (OUTCOME_ERROR, "condition"));
        assert!(e.outcomes[1].detail.as_deref().unwrap().contains("list too long"), "{:?}", e.outcomes[1].detail);
        // Its tree evaluated: out of steps, which denies.
        let deny = stored("d", "EFFECT_DENY", &src);
        let e = decide(&[&allow, &deny], &r, false, false);
        assert_eq!((e.decision, e.reason, e.outcomes[1].outcome), (Decision::Deny, "EXPLICIT_DENY", OUTCOME_ERROR));
        assert!(e.outcomes[1].detail.as_deref().unwrap().contains("evaluation too costly"));
        // A list from the context, too long for the budget (the parser cannot know its length).
        let many: Vec<Value> = (0..6_000).map(|i| json!({"id": format!("w{i}"), "label": ""})).collect();
        let r = with(r, "wallets", json!(many));
        let deny = policy("d", "EFFECT_DENY", "wallets.any(w, w.id == 'blocked')", "");
        let e = decide(&[&allow, &deny], &r, false, false);
        assert_eq!((e.decision, e.reason, e.outcomes[1].outcome), (Decision::Deny, "EXPLICIT_DENY", OUTCOME_ERROR));
        // The JSON the API renders is unchanged in shape.
        assert_eq!(
            e.outcomes_json(),
            json!([{"policyId": "a", "outcome": OUTCOME_ALLOW}, {"policyId": "d", "outcome": OUTCOME_ERROR}])
        );
        // Root quorum still bypasses it.
        assert_eq!(decide(&[&allow, &deny], &r, true, false).decision, Decision::Allow);
    }

    /// An ALLOW of `i`, its own text, that costs about 15,000 steps (within a clause's 20,000).
    fn costly_allow(i: usize) -> CompiledPolicy {
        policy(&format!("a{i}"), "EFFECT_ALLOW", &format!("[{}0].all(x, x == 0) && {i} == {i}", "0,".repeat(2_999)), "")
    }

    #[test]
    fn one_budget_bounds_the_whole_decision() {
        // Issue 39: 70 such policies cost 11 s a dry run, every clause with a budget of its own.
        let costly: Vec<CompiledPolicy> = (0..100).map(costly_allow).collect();
        let mut refs: Vec<&CompiledPolicy> = costly.iter().collect();
        let r = roots(&["u"], "w1");
        let alone = evaluate_policy(&costly[99], &r);
        assert_eq!(alone.outcome, OUTCOME_ALLOW, "each policy alone is within a clause's budget: {alone:?}");

        let mut budget = steps_only();
        let e = decide_within(&mut budget, &refs, &r, false, false);
        // 100 × 15,000 steps were asked for; the decision spent its budget, a clause's overshoot
        // and a policy's own steps for each policy tried after it ran out.
        assert!(budget.ran_out());
        let spent = budget.spent();
        assert!(
            (crate::MAX_DECISION_STEPS..=crate::MAX_DECISION_STEPS + 400 + 100 * POLICY_STEPS).contains(&spent),
            "the decision spent {spent} steps"
        );
        // Those read before it ran out allowed; it still denies, since it did not read them all.
        assert_eq!((e.decision, e.reason), (Decision::Deny, BUDGET_EXHAUSTED));
        assert_eq!(e.outcomes[0].outcome, OUTCOME_ALLOW);
        let last = &e.outcomes[99];
        assert_eq!((last.outcome, last.clause), (OUTCOME_ERROR, "condition"));
        assert!(last.detail.as_deref().unwrap().contains("the decision's budget"), "{last:?}");
        // An implicit permission (one's own credentials) is not a policy: it still allows.
        assert_eq!(decide_within(&mut steps_only(), &refs, &r, false, true).reason, "IMPLICIT_PERMISSION");

        // A DENY listed last is read first: it matches, an explicit deny, with the budget
        // intact for it.
        let deny = policy("d", "EFFECT_DENY", "wallet.id == 'w1'", "");
        refs.push(&deny);
        let e = decide_within(&mut steps_only(), &refs, &r, false, false);
        assert_eq!(
            (e.decision, e.reason, e.outcomes[100].outcome),
            (Decision::Deny, "EXPLICIT_DENY", OUTCOME_DENY_EXPLICIT)
        );
        assert_eq!(e.outcomes.len(), 101);
        assert_eq!(&*e.outcomes[100].policy_id, "d");

        // DENYs that spend the budget themselves: those left err, and deny.
        let costly_denies: Vec<CompiledPolicy> = (0..40)
            .map(|i| {
                policy(
                    &format!("d{i}"),
                    "EFFECT_DENY",
                    &format!("[{}0].all(x, x == 0) && wallet.id == 'w9' && {i} == {i}", "0,".repeat(2_999)),
                    "",
                )
            })
            .collect();
        let allow = policy("a", "EFFECT_ALLOW", "true", "");
        let mut refs: Vec<&CompiledPolicy> = vec![&allow];
        refs.extend(costly_denies.iter());
        let e = decide_within(&mut steps_only(), &refs, &r, false, false);
        assert_eq!(e.outcomes[1].outcome, OUTCOME_DENY_IMPLICIT, "read in full, it does not match");
        assert_eq!((e.outcomes[40].outcome, e.decision, e.reason), (OUTCOME_ERROR, Decision::Deny, "EXPLICIT_DENY"));

        // Within the budget nothing changes: 10 of them allow.
        let e = decide_within(&mut steps_only(), &refs_of(&costly[..10]), &r, false, false);
        assert_eq!((e.decision, e.reason), (Decision::Allow, "POLICY_ALLOW"));
        assert!(e.outcomes.iter().all(|o| o.outcome == OUTCOME_ALLOW));
    }

    /// The decision's step budget, with a deadline no test machine reaches: what these tests
    /// check is the steps, which are the same on every machine.
    fn steps_only() -> DecisionBudget {
        DecisionBudget::with(crate::MAX_DECISION_STEPS, std::time::Duration::from_secs(3_600))
    }

    fn refs_of(p: &[CompiledPolicy]) -> Vec<&CompiledPolicy> {
        p.iter().collect()
    }

    #[test]
    fn every_policy_read_is_charged_even_when_its_clauses_are_shared() {
        // Issue 39 attack: 100,000 policies with empty clauses cost 65-76 ms a decision for 26
        // steps (one shared evaluation of each empty clause).
        let many: Vec<CompiledPolicy> =
            (0..100_000).map(|i| policy(&format!("p{i}"), "EFFECT_ALLOW", "", "")).collect();
        let r = roots(&["u"], "w1");
        let mut budget = steps_only();
        let e = decide_within(&mut budget, &refs_of(&many), &r, false, false);
        assert!(budget.ran_out());
        assert_eq!((e.decision, e.reason), (Decision::Deny, BUDGET_EXHAUSTED));
        assert_eq!(e.outcomes.len(), 100_000);
        assert_eq!(e.outcomes[0].outcome, OUTCOME_ALLOW);
        assert_eq!(e.outcomes[99_999].outcome, OUTCOME_ERROR);
        assert!(budget.spent() <= crate::MAX_DECISION_STEPS + 100_000 * POLICY_STEPS);
        // A thousand of them fit.
        let e = decide_within(&mut steps_only(), &refs_of(&many[..1_000]), &r, false, false);
        assert_eq!((e.decision, e.reason), (Decision::Allow, "POLICY_ALLOW"));
    }

    #[test]
    fn the_facts_are_charged_to_the_decision() {
        // A context of 500,000 values costs the decision its whole budget before any clause.
        let many: Vec<Value> = (0..100_000).map(|i| json!({"id": format!("w{i}"), "label": ""})).collect();
        let r = with(roots(&["u"], "w1"), "wallets", json!(many));
        let allow = policy("a", "EFFECT_ALLOW", "wallet.id == 'w1'", "");
        let mut budget = steps_only();
        let e = decide_within(&mut budget, &[&allow], &r, false, false);
        assert!(budget.ran_out());
        assert_eq!((e.decision, e.reason, e.outcomes[0].outcome), (Decision::Deny, BUDGET_EXHAUSTED, OUTCOME_ERROR));
        // A few wallets cost a few steps.
        let mut budget = DecisionBudget::start();
        assert_eq!(decide_within(&mut budget, &[&allow], &roots(&["u"], "w1"), false, false).decision, Decision::Allow);
        assert!(budget.spent() < 100, "{}", budget.spent());
    }

    #[test]
    fn the_decision_deadline_stops_every_clause() {
        let allow = policy("a", "EFFECT_ALLOW", "wallet.id == 'w1'", "");
        let deny = policy("d", "EFFECT_DENY", "wallet.id == 'w9'", "");
        let r = roots(&["u"], "w1");
        let mut spent = DecisionBudget::with(crate::MAX_DECISION_STEPS, std::time::Duration::ZERO);
        let e = decide_within(&mut spent, &[&allow, &deny], &r, false, false);
        assert!(spent.ran_out());
        // The DENY could not be read: it denies.
        assert_eq!((e.decision, e.outcomes[1].outcome), (Decision::Deny, OUTCOME_ERROR));
        assert!(e.outcomes[1].detail.as_deref().unwrap().contains("time limit"), "{:?}", e.outcomes[1]);
    }

    #[test]
    fn an_allow_that_errs_allows_nothing() {
        let many: Vec<Value> = (0..6_000).map(|i| json!({"id": format!("w{i}"), "label": ""})).collect();
        let r = with(roots(&["u"], "w1"), "wallets", json!(many));
        let allow = policy("a", "EFFECT_ALLOW", "wallets.any(w, w.id == 'w1')", "");
        let e = decide(&[&allow], &r, false, false);
        assert_eq!((e.decision, e.reason, e.outcomes[0].outcome), (Decision::Deny, "IMPLICIT_DENY", OUTCOME_ERROR));
        assert!(!e.outcomes[0].denies());
        let missing = policy("a", "EFFECT_ALLOW", "eth.tx.chain_id == 1", "");
        let e = decide(&[&missing], &r, false, false);
        assert_eq!((e.decision, e.reason, e.outcomes[0].outcome), (Decision::Deny, "IMPLICIT_DENY", OUTCOME_ERROR));
        // With an implicit permission, an erring ALLOW changes nothing either.
        assert_eq!(decide(&[&allow], &r, false, true).reason, "IMPLICIT_PERMISSION");
    }

    #[test]
    fn a_deny_reads_a_deciding_operand_whatever_the_others_did() {
        // A Solana signing: no `eth` root at all.
        let solana = {
            let v = json!({
                "activity": {"type": "ACTIVITY_TYPE_SIGN_TRANSACTION_V2", "kind": "SIGN_TRANSACTION", "resource": "PRIVATE_KEY", "action": "SIGN",
                    "params": {"type": "TRANSACTION_TYPE_SOLANA"}},
                "approvers": [{"id": "u", "tags": [], "email": "", "alias": "u"}], "credentials": [],
                "wallet": {"id": "w1", "imported": false, "exported": false, "label": ""},
                "solana": {"tx": {"transfers": []}},
            });
            match Val::from_json(&v) {
                Val::Map(m) => m,
                _ => unreachable!(),
            }
        };
        let allow = policy("a", "EFFECT_ALLOW", "wallet.id == 'w1'", "");
        // Scoped to Ethereum transactions: the scope's `false` decides, the missing `eth` does not.
        let scoped = policy(
            "d",
            "EFFECT_DENY",
            "activity.params.type == 'TRANSACTION_TYPE_ETHEREUM' && eth.tx.value > 1000",
            "",
        );
        let e = decide(&[&allow, &scoped], &solana, false, false);
        assert_eq!((e.decision, e.outcomes[1].outcome), (Decision::Allow, OUTCOME_DENY_IMPLICIT));
        // Unscoped, the DENY cannot be read for this activity: it denies (fail closed).
        let unscoped = policy("d", "EFFECT_DENY", "eth.tx.value > 1000", "");
        let e = decide(&[&allow, &unscoped], &solana, false, false);
        assert_eq!((e.decision, e.outcomes[1].outcome), (Decision::Deny, OUTCOME_ERROR));
        // `true || error` matches.
        let either = policy("d", "EFFECT_DENY", "wallet.id == 'w1' || eth.tx.value > 1000", "");
        let e = decide(&[&allow, &either], &solana, false, false);
        assert_eq!((e.decision, e.outcomes[1].outcome), (Decision::Deny, OUTCOME_DENY_EXPLICIT));
        // An ALLOW keeps the hosted service's reading: the operand's error is the result.
        let allow_either = policy("a", "EFFECT_ALLOW", "wallet.id == 'w1' || eth.tx.value > 1000", "");
        let e = decide(&[&allow_either], &solana, false, false);
        assert_eq!((e.decision, e.outcomes[0].outcome), (Decision::Deny, OUTCOME_ERROR));
    }

    #[test]
    fn a_deny_naming_a_missing_field_denies() {
        let sign_tx = |tx: Value| {
            let v = json!({
                "activity": {"type": "ACTIVITY_TYPE_SIGN_TRANSACTION_V2", "kind": "SIGN_TRANSACTION", "resource": "PRIVATE_KEY", "action": "SIGN", "params": {}},
                "approvers": [{"id": "u", "tags": [], "email": "", "alias": "u"}], "credentials": [],
                "wallet": {"id": "w1", "imported": false, "exported": false, "label": ""},
                "eth": {"tx": tx},
            });
            match Val::from_json(&v) {
                Val::Map(m) => m,
                _ => unreachable!(),
            }
        };
        let allow = policy("a", "EFFECT_ALLOW", "wallet.id == 'w1'", "");
        // Issue 23: a legacy pre-EIP-155 transaction has no chain_id and passed this DENY.
        let deny = policy("d", "EFFECT_DENY", "eth.tx.chain_id != 1", "");
        let e = decide(&[&allow, &deny], &sign_tx(json!({"to": "0xc", "chain_id": 5})), false, false);
        assert_eq!((e.decision, e.outcomes[1].outcome), (Decision::Deny, OUTCOME_DENY_EXPLICIT));
        assert_eq!(
            decide(&[&allow, &deny], &sign_tx(json!({"to": "0xc", "chain_id": 1})), false, false).decision,
            Decision::Allow
        );
        let legacy = sign_tx(json!({"to": "0xc"}));
        let e = decide(&[&allow, &deny], &legacy, false, false);
        assert_eq!((e.decision, e.reason), (Decision::Deny, "EXPLICIT_DENY"));
        assert_eq!((e.outcomes[1].outcome, e.outcomes[1].clause), (OUTCOME_ERROR, "condition"));
        assert!(e.outcomes[1].detail.as_deref().unwrap().contains("MissingField: chain_id"));
        // A type error denies too.
        let typed = policy("d", "EFFECT_DENY", "eth.tx.to > 5", "");
        assert_eq!(decide(&[&allow, &typed], &legacy, false, false).decision, Decision::Deny);

        // A DENY that cannot match is not applicable, whatever else errs: its condition's
        // activity type excludes the activity, its time window is over, or a conjunct is false
        // (false && error is false).
        let scoped = policy(
            "d",
            "EFFECT_DENY",
            "activity.type == 'ACTIVITY_TYPE_SIGN_TRANSACTION_V2' && eth.tx.chain_id != 1",
            "",
        );
        let raw = roots(&["u"], "w1");
        let e = decide(&[&allow, &scoped], &raw, false, false);
        assert_eq!((e.decision, e.outcomes[1].outcome), (Decision::Allow, OUTCOME_DENY_IMPLICIT));
        assert_eq!(decide(&[&allow, &scoped], &legacy, false, false).decision, Decision::Deny);
        let mut over = policy("d", "EFFECT_DENY", "eth.tx.chain_id != 1", "");
        over.time =
            Arc::new(crate::parse_time("time.now < Timestamp('2025-01-01T00:00:00Z')").map_err(|e| e.to_string()));
        let mut late = legacy.clone();
        late.insert(
            "time".into(),
            Val::Map(BTreeMap::from([("now".to_string(), Val::Time(1_736_899_200_000_000_000))])),
        );
        let e = decide(&[&allow, &over], &late, false, false);
        assert_eq!(
            (e.decision, e.outcomes[1].outcome, e.outcomes[1].clause),
            (Decision::Allow, OUTCOME_DENY_IMPLICIT, "time")
        );
        // Inside the window (and with no time at all, an error) it denies.
        late.insert("time".into(), Val::Map(BTreeMap::from([("now".to_string(), Val::Time(0))])));
        assert_eq!(decide(&[&allow, &over], &late, false, false).decision, Decision::Deny);
        assert_eq!(decide(&[&allow, &over], &legacy, false, false).decision, Decision::Deny);
        let consensus_false = policy("d", "EFFECT_DENY", "eth.tx.chain_id != 1", "approvers.count() > 5");
        assert_eq!(decide(&[&allow, &consensus_false], &legacy, false, false).decision, Decision::Allow);
    }

    #[test]
    fn policies_with_the_same_clauses_share_their_evaluation_and_decide_as_alone() {
        // 1,000 policies from one template: a tenth name the approver.
        let template: Vec<CompiledPolicy> = (0..1000)
            .map(|i| {
                let approver = if i % 10 == 0 { "u" } else { "someone-else" };
                policy(
                    &format!("p{i:04}"),
                    "EFFECT_ALLOW",
                    "wallet.id == 'w1'",
                    &format!("approvers.any(a, a.id == '{approver}')"),
                )
            })
            .collect();
        let refs: Vec<&CompiledPolicy> = template.iter().collect();
        let ctx = roots(&["u"], "w1");
        let e = decide(&refs, &ctx, false, false);
        let alone: Vec<PolicyOutcome> = template.iter().map(|p| evaluate_policy(p, &ctx)).collect();
        assert_eq!(e.outcomes, alone);
        assert_eq!(e.outcomes.iter().filter(|o| o.outcome == OUTCOME_ALLOW).count(), 100);
        assert_eq!(e.outcomes.iter().filter(|o| o.outcome == OUTCOME_REQUIRES_CONSENSUS).count(), 900);
        let mut budget = DecisionBudget::start();
        let mut memo = ClauseMemo::new(&mut budget);
        for p in &refs {
            evaluate_policy_in(p, &ctx, &mut memo);
        }
        // Time (empty), the condition, and two consensus texts: four evaluations in all.
        assert_eq!(memo.values.len(), 4);
        // One parsed condition for the thousand, and two parsed consensus clauses.
        assert!(template.iter().all(|p| Arc::ptr_eq(&p.condition, &template[0].condition)));
        assert!(Arc::ptr_eq(&template[0].consensus, &template[10].consensus));
        assert!(!Arc::ptr_eq(&template[0].consensus, &template[1].consensus));

        // A DENY reads the same text otherwise (a true disjunct decides, the error aside): the
        // memo keeps the two readings apart.
        let text = "wallet.id == 'w1' || private_key.id == 'k'";
        let allow = policy("a", "EFFECT_ALLOW", text, "");
        let deny = policy("d", "EFFECT_DENY", text, "");
        let e = decide(&[&allow, &deny], &ctx, false, false);
        assert_eq!(e.outcomes[0].outcome, OUTCOME_ERROR);
        assert_eq!(e.outcomes[1].outcome, OUTCOME_DENY_EXPLICIT);
        // The same text in another place is parsed by another grammar: another clause.
        let empty = policy("t", "EFFECT_ALLOW", "", "");
        assert!(!Arc::ptr_eq(&empty.time, &empty.condition) && !Arc::ptr_eq(&empty.condition, &empty.consensus));
        let mut budget = DecisionBudget::start();
        let mut memo = ClauseMemo::new(&mut budget);
        evaluate_policy_in(&empty, &ctx, &mut memo);
        assert_eq!(memo.values.len(), 3, "the empty time, condition and consensus are three keys");
    }
}
