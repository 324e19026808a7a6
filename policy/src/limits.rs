//! The caps a policy clause is parsed under and the budget it is evaluated within.

use crate::eval::EvalLimits;

/// Most bytes of one clause's source (a condition, consensus or time window): a deny list of
/// about a thousand addresses. Longer text is refused before it is read.
pub const MAX_CLAUSE_BYTES: usize = 64 * 1024;

/// Most items of one literal list (`[a, b, …]`).
pub const MAX_LIST_LEN: usize = 4_096;

/// The caps a policy clause is parsed under, and the budget it is evaluated within. The
/// defaults ([`Limits::DEFAULT`]) are the `pub const`s: [`MAX_CLAUSE_BYTES`] (64 KiB per clause,
/// condition, consensus or time), [`MAX_LIST_LEN`] (4,096 items per literal list),
/// [`MAX_DEPTH`](crate::parser::MAX_DEPTH) (64 levels of nesting, fixed: it keeps the parser and the evaluator off the end
/// of the stack), [`MAX_EVAL_STEPS`](crate::eval::MAX_EVAL_STEPS) (20,000 steps per clause) and [`EVAL_DEADLINE`](crate::eval::EVAL_DEADLINE) (50 ms per
/// clause, the wall-clock backstop). A clause that is too long, holds too long a list, or costs
/// more than the step budget on every evaluation (known from its literal lists alone) is refused
/// when parsed, with a message that says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of one clause's source.
    pub max_clause_bytes: usize,
    /// Items of one literal list (`[a, b, …]`).
    pub max_list_len: usize,
    /// The evaluation budget; the parser refuses a clause whose every evaluation exceeds it.
    pub eval: EvalLimits,
}

impl Limits {
    pub const DEFAULT: Limits =
        Limits { max_clause_bytes: MAX_CLAUSE_BYTES, max_list_len: MAX_LIST_LEN, eval: EvalLimits::DEFAULT };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}
