//! The policy language's expression tree: expressions, operators, quantifiers, cron specs.

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
