//! The policy engine (spec 12), free of any store: the language's expression tree and parser,
//! the evaluator, the evaluation context built from facts the caller gathers, and the decision.
//!
//! The grammar is CEL-like but not CEL (single-quoted strings only, `x[a..b]` slices,
//! `Timestamp(..)`/`CronSpan(..)`, a fixed set of list functions), so no CEL crate parses it;
//! [`parser`] is a hand-written recursive-descent parser.

pub mod context;
pub mod decision;
mod error;
pub mod eval;
mod expr;
mod limits;
pub mod parser;
pub mod scope;

pub use error::PolicyError;
pub use eval::{
    DecisionBudget, EvalLimits, DEADLINE_CHECK_STEPS, DECISION_DEADLINE, EVAL_DEADLINE, MAX_DECISION_STEPS,
    MAX_EVAL_STEPS, STR_BYTES_PER_STEP,
};
pub use expr::{CmpOp, Cron, CronRange, Expr, Quantifier};
pub use limits::{Limits, MAX_CLAUSE_BYTES, MAX_LIST_LEN};
pub use parser::MAX_DEPTH;

/// Roots a `condition` may name (spec 12.4; `time` as in `time.now`).
pub const CONDITION_ROOTS: &[&str] = &[
    "activity",
    "wallet",
    "wallets",
    "private_key",
    "wallet_account",
    "eth",
    "solana",
    "tron",
    "bitcoin",
    "tempo",
    "time",
];
/// Roots a `consensus` may name.
pub const CONSENSUS_ROOTS: &[&str] = &["approvers", "credentials"];
/// Roots a `time` window may name.
pub const TIME_ROOTS: &[&str] = &["time"];

/// Parses a policy `condition` (when the policy applies). Empty or blank means always (`true`).
pub fn parse_condition(src: &str) -> Result<Expr, PolicyError> {
    parse_optional(src, CONDITION_ROOTS)
}

/// Parses a policy `consensus` (who must approve). Empty or blank means `true`.
pub fn parse_consensus(src: &str) -> Result<Expr, PolicyError> {
    parse_optional(src, CONSENSUS_ROOTS)
}

/// Parses a policy `time` window (e.g. `time.now < Timestamp('...')`). Empty or blank means `true`.
pub fn parse_time(src: &str) -> Result<Expr, PolicyError> {
    parse_optional(src, TIME_ROOTS)
}

/// Whether a policy's `time` window holds at `now` (nanoseconds since the epoch); a blank window
/// always holds. An error (the window does not parse, or fails to evaluate) is its message.
pub fn time_window_holds(src: &str, now: context::Nanos) -> Result<bool, String> {
    let window = parse_time(src).map_err(|e| e.to_string())?;
    let time = std::collections::BTreeMap::from([("now".to_string(), eval::Val::Time(i128::from(now)))]);
    let roots = std::collections::BTreeMap::from([("time".to_string(), eval::Val::Map(time))]);
    eval::eval_bool(&window, &roots).map_err(|e| e.message)
}

fn parse_optional(src: &str, roots: &[&str]) -> Result<Expr, PolicyError> {
    parser::check_length(src, &Limits::DEFAULT)?;
    if src.trim().is_empty() {
        return Ok(Expr::Bool(true));
    }
    parser::parse(src, roots)
}
