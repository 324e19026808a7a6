//! The policy engine (spec 12), free of any store: the language's expression tree and parser,
//! the evaluator, the evaluation context built from facts the caller gathers, and the decision.
//!
//! The grammar is CEL-like but not CEL (single-quoted strings only, `x[a..b]` slices,
//! `Timestamp(..)`/`CronSpan(..)`, a fixed set of list functions), so no CEL crate parses it;
//! [`parser`] is a hand-written recursive-descent parser.

pub mod context;
pub mod decision;
pub mod eval;
pub mod parser;
pub mod scope;

use std::fmt;

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

/// A parse or validation error, with the 1-based column (in characters) where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub column: usize,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at column {}", self.message, self.column)
    }
}

impl std::error::Error for PolicyError {}

/// Comparison operators (`==`, `!=`: any type; the orderings: ints, uints and timestamps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// The list macros that bind a variable: `list.all(x, pred)`, `.any(x, pred)`, `.filter(x, pred)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantifier {
    All,
    Any,
    Filter,
}

/// One comma-separated part of a cron field: `n` is `(n, n)`, `a-b` is `(a, b)`, `*` is the
/// field's whole range.
pub type CronRange = (u32, u32);

/// A parsed 5-field cron spec. Day of week is 0-7 (0 and 7 are Sunday); day of month and day
/// of week are OR'ed when both are restricted (spec 12.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    pub minute: Vec<CronRange>,
    pub hour: Vec<CronRange>,
    pub day_of_month: Vec<CronRange>,
    pub month: Vec<CronRange>,
    pub day_of_week: Vec<CronRange>,
    /// Whether day of month / day of week were `*` (unrestricted).
    pub any_day_of_month: bool,
    pub any_day_of_week: bool,
}

/// A policy expression. And/Or are n-ary (the engine does not short-circuit: every operand is
/// evaluated, spec 12.2); nesting is bounded by the parser, so walking the tree recursively is safe.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Bool(bool),
    /// Integer literal that fits an i128.
    Int(i128),
    /// Unsigned literal too large for i128 (up to 2^256 - 1), as canonical decimal digits.
    BigUint(String),
    Str(String),
    List(Vec<Expr>),
    /// A keyword root (`activity`, `approvers`, ...) or a variable bound by a list macro.
    Ident(String),
    /// `x.field`.
    Member(Box<Expr>, String),
    /// `x[i]` (lists) or `x['key']` (maps, structs).
    Index(Box<Expr>, Box<Expr>),
    /// `x[a..b]` on lists and strings (end exclusive).
    Slice(Box<Expr>, Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    /// Unary minus.
    Neg(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Compare(CmpOp, Box<Expr>, Box<Expr>),
    /// `x in list`.
    In(Box<Expr>, Box<Expr>),
    /// `list.contains(x)`.
    Contains(Box<Expr>, Box<Expr>),
    /// `list.count()`.
    Count(Box<Expr>),
    /// `list.all(var, pred)`, `.any(..)`, `.filter(..)`.
    Quantified {
        quantifier: Quantifier,
        list: Box<Expr>,
        var: String,
        pred: Box<Expr>,
    },
    /// `Timestamp('2025-01-01T00:00:00Z')`, as Unix nanoseconds.
    Timestamp(i128),
    /// `CronSpan('<cron>', '<duration>', '<IANA zone>')`: true while within `minutes` after a
    /// cron match in `zone`.
    CronSpan {
        cron: Cron,
        minutes: u32,
        zone: String,
    },
}

impl Expr {
    /// True for expressions that can never produce a boolean (a literal number, a string, a
    /// list, ...); used to refuse `1 && x` or a bare `'abc'` at parse time.
    pub fn never_bool(&self) -> bool {
        matches!(
            self,
            Expr::Int(_)
                | Expr::BigUint(_)
                | Expr::Str(_)
                | Expr::List(_)
                | Expr::Neg(_)
                | Expr::Count(_)
                | Expr::Slice(..)
                | Expr::Timestamp(_)
                | Expr::Quantified { quantifier: Quantifier::Filter, .. }
        )
    }
}

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

fn parse_optional(src: &str, roots: &[&str]) -> Result<Expr, PolicyError> {
    if src.trim().is_empty() {
        return Ok(Expr::Bool(true));
    }
    parser::parse(src, roots)
}
