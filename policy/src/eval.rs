//! The policy evaluator: walks a parsed [`Expr`] over a JSON-like context, without
//! short-circuiting (spec 12.2): every operand is evaluated and any error fails the expression.
//!
//! **Cost.** Every unit of work is charged to a step budget ([`MAX_EVAL_STEPS`] per clause):
//! one step per expression node visited, per list item a quantifier, `in` or `contains()` goes
//! through, per `CronSpan` iteration, per value copied out of the context or built, and one per
//! [`STR_BYTES_PER_STEP`] bytes of text copied, sliced, counted or compared. A wall-clock deadline
//! ([`EVAL_DEADLINE`], checked every [`DEADLINE_CHECK_STEPS`] steps) backs the budget up. Running
//! out of either is an [`EvalError`] of kind [`EvalErrorKind::OutOfSteps`] /
//! [`EvalErrorKind::OutOfTime`], which fails the clause like any other evaluation error.
//!
//! **A budget per decision.** The clause budget bounds one clause; a decision evaluates every
//! clause of every applicable policy, so it also has a [`DecisionBudget`] ([`MAX_DECISION_STEPS`]
//! and [`DECISION_DEADLINE`]) that the facts it reads and all of its clauses draw on
//! ([`Env::within`]): each clause gets the smaller of its own budget and what the decision has
//! left, so no set of policies and no input makes one decision cost more than the decision's
//! budget, however many policies there are.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::expr::{CmpOp, Cron, Expr, Quantifier};

/// A value the evaluator works on.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Bool(bool),
    Int(i128),
    /// An unsigned integer larger than `i128::MAX`, as canonical decimal digits.
    Uint(String),
    Str(String),
    List(Vec<Val>),
    Map(BTreeMap<String, Val>),
    /// Unix nanoseconds (`Timestamp(..)`, `time.now`).
    Time(i128),
}

/// What kind of evaluation error: the expression's own (a missing field, a type error, ...) or
/// the evaluation's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalErrorKind {
    /// A missing field, a type error, an index out of bounds, an unsupported time zone, ...
    Failed,
    /// The step budget ([`MAX_EVAL_STEPS`]) ran out.
    OutOfSteps,
    /// The wall-clock deadline ([`EVAL_DEADLINE`]) passed.
    OutOfTime,
}

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalError {
    pub kind: EvalErrorKind,
    pub message: String,
}

impl EvalError {
    fn failed(m: impl Into<String>) -> Self {
        Self { kind: EvalErrorKind::Failed, message: m.into() }
    }

    /// The evaluation ran out of steps or time (rather than failing on the expression itself).
    pub fn is_cost(&self) -> bool {
        self.kind != EvalErrorKind::Failed
    }
}

impl std::fmt::Display for EvalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EvalError {}

type R<T> = Result<T, EvalError>;

/// Whether any operand of `items` is `decisive` (`false` for `&&`, `true` for `||`). Every
/// operand is evaluated (no short-circuit); a cost error always stands; another error stands
/// unless the environment absorbs errors and an operand decided.
fn logical(items: &[Expr], env: &mut Env<'_>, decisive: bool, op: &str) -> R<bool> {
    let mut first_error = None;
    let mut decided = false;
    for item in items {
        match eval(item, env).and_then(|v| as_bool(&v, op)) {
            Ok(b) => decided |= b == decisive,
            Err(e) if e.is_cost() => return Err(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if !(decided && env.absorb_errors) => Err(e),
        _ => Ok(decided),
    }
}

fn err<T>(m: impl Into<String>) -> R<T> {
    Err(EvalError::failed(m))
}

impl Val {
    /// Converts JSON: integers become `Int` (or `Uint` above `i128::MAX`), other numbers strings.
    pub fn from_json(v: &Json) -> Val {
        match v {
            Json::Null => Val::Null,
            Json::Bool(b) => Val::Bool(*b),
            Json::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Val::Int(i as i128)
                } else if let Some(u) = n.as_u64() {
                    Val::Int(u as i128)
                } else {
                    Val::Str(n.to_string())
                }
            }
            Json::String(s) => Val::Str(s.clone()),
            Json::Array(a) => Val::List(a.iter().map(Val::from_json).collect()),
            Json::Object(m) => Val::Map(m.iter().map(|(k, v)| (k.clone(), Val::from_json(v))).collect()),
        }
    }

    /// Back to JSON, for showing facts as policies see them: integers beyond JSON's safe range
    /// (2^53) and `Uint`s as decimal strings, times as Unix nanoseconds in a string.
    pub fn to_json(&self) -> Json {
        const SAFE: i128 = 1 << 53;
        match self {
            Val::Null => Json::Null,
            Val::Bool(b) => Json::Bool(*b),
            Val::Int(i) if (-SAFE..=SAFE).contains(i) => Json::from(*i as i64),
            Val::Int(i) => Json::String(i.to_string()),
            Val::Uint(u) => Json::String(u.clone()),
            Val::Str(s) => Json::String(s.clone()),
            Val::List(l) => Json::Array(l.iter().map(Val::to_json).collect()),
            Val::Map(m) => Json::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
            Val::Time(t) => Json::String(t.to_string()),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Val::Null => "null",
            Val::Bool(_) => "bool",
            Val::Int(_) => "int",
            Val::Uint(_) => "uint",
            Val::Str(_) => "string",
            Val::List(_) => "list",
            Val::Map(_) => "struct",
            Val::Time(_) => "timestamp",
        }
    }
}

/// The step budget of one clause's evaluation (see the module documentation for what a step
/// is). Nested list macros multiply (`l.all(a, l.all(b, …))` over 10-item lists is 10^depth
/// visits): past this budget the clause is an error instead of holding the submission. Real
/// policies take tens to a few thousand steps; a step is tens of nanoseconds, so the budget is
/// about a millisecond of work.
pub const MAX_EVAL_STEPS: u32 = 20_000;

/// The wall-clock backstop of one clause's evaluation: past it the clause is an error of kind
/// [`EvalErrorKind::OutOfTime`]. The step budget should always end an evaluation first (20,000
/// steps take about a millisecond); the deadline covers a cost the steps would misjudge (a slow
/// or contended machine, a unit of work undercharged).
pub const EVAL_DEADLINE: Duration = Duration::from_millis(50);

/// The deadline is checked each time the step count passes a multiple of this.
pub const DEADLINE_CHECK_STEPS: u64 = 1024;

/// Text costs one step per this many bytes copied, sliced, counted or compared (shorter text
/// rides on the step of the node that handles it).
pub const STR_BYTES_PER_STEP: usize = 64;

/// The step budget of one decision: the facts it evaluates over ([`weight`] of the context) and
/// every clause of every applicable policy together. Ten clauses at their own budget; real
/// policy sets take a few thousand steps a decision. A step took 30-100 ns on the 2-core test
/// machine (release build, loaded), so a decision at its budget is about 10 ms of CPU.
pub const MAX_DECISION_STEPS: u64 = 200_000;

/// The wall-clock backstop of one decision (see [`EVAL_DEADLINE`] for a clause's).
pub const DECISION_DEADLINE: Duration = Duration::from_millis(100);

/// What one decision may still spend: steps and a deadline shared by all of its clauses. Once it
/// has run out, every clause evaluated within it errs at its first step (an
/// [`EvalErrorKind::OutOfSteps`] or [`EvalErrorKind::OutOfTime`] error), so an ALLOW allows
/// nothing and a DENY that could apply denies (`crate::decision`).
#[derive(Debug, Clone)]
pub struct DecisionBudget {
    spent: u64,
    max_steps: u64,
    deadline: Instant,
    ran_out: bool,
}

impl DecisionBudget {
    /// [`MAX_DECISION_STEPS`] and [`DECISION_DEADLINE`], from now.
    pub fn start() -> Self {
        Self::with(MAX_DECISION_STEPS, DECISION_DEADLINE)
    }

    /// `max_steps` and `deadline` from now.
    pub fn with(max_steps: u64, deadline: Duration) -> Self {
        let now = Instant::now();
        Self { spent: 0, max_steps, deadline: now.checked_add(deadline).unwrap_or(now), ran_out: false }
    }

    /// Steps spent so far (past the budget once it ran out).
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// Steps left.
    pub fn remaining(&self) -> u64 {
        self.max_steps.saturating_sub(self.spent)
    }

    /// Whether some clause could not be evaluated because the decision's budget had run out
    /// (not its own): the decision did not read all of its policies.
    pub fn ran_out(&self) -> bool {
        self.ran_out
    }

    /// Charges the cost of the facts the decision reads: what copying `roots` would cost
    /// ([`weight`]), counted up to what is left.
    pub fn charge_facts(&mut self, roots: &BTreeMap<String, Val>) {
        let cap = self.remaining();
        let mut total = 0u64;
        for (k, v) in roots {
            total = total.saturating_add(1 + bytes_cost(k.len())).saturating_add(weight(v, cap.saturating_sub(total)));
            if total > cap {
                break;
            }
        }
        self.spent = self.spent.saturating_add(total);
    }

    /// Charges `steps` for work outside any clause (a policy's own bookkeeping in a decision):
    /// an error once that passes the budget, which is then [`DecisionBudget::ran_out`].
    pub fn admit(&mut self, steps: u64) -> R<()> {
        self.spent = self.spent.saturating_add(steps);
        let kind = if self.spent > self.max_steps {
            EvalErrorKind::OutOfSteps
        } else if Instant::now() >= self.deadline {
            EvalErrorKind::OutOfTime
        } else {
            return Ok(());
        };
        self.ran_out = true;
        Err(EvalError { kind, message: decision_cost_message(kind) })
    }

    /// Charges what a clause's evaluation in `env` ([`Env::within`]) spent; `result` is what it
    /// answered (a cost error there, with the decision's budget spent, is the decision running
    /// out: [`DecisionBudget::ran_out`]).
    pub fn settle<T>(&mut self, env: &Env<'_>, result: &R<T>) {
        self.spent = self.spent.saturating_add(env.steps);
        let decisions = |e: &EvalError| match e.kind {
            EvalErrorKind::OutOfSteps => env.decision_bound,
            EvalErrorKind::OutOfTime => Instant::now() >= self.deadline,
            EvalErrorKind::Failed => false,
        };
        if matches!(result, Err(e) if decisions(e)) {
            self.ran_out = true;
        }
    }
}

/// The error text of a clause (or a policy) a decision could not read because its budget ran
/// out of steps or of time.
fn decision_cost_message(kind: EvalErrorKind) -> String {
    match kind {
        EvalErrorKind::OutOfTime => format!(
            "evaluation too costly: past the decision's time limit ({} ms for every applicable policy)",
            DECISION_DEADLINE.as_millis()
        ),
        _ => format!(
            "evaluation too costly: the decision's budget ({MAX_DECISION_STEPS} steps for the facts and every applicable policy) ran out"
        ),
    }
}

/// What one clause's evaluation may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalLimits {
    pub max_steps: u32,
    pub deadline: Duration,
}

impl EvalLimits {
    /// [`MAX_EVAL_STEPS`] and [`EVAL_DEADLINE`].
    pub const DEFAULT: EvalLimits = EvalLimits { max_steps: MAX_EVAL_STEPS, deadline: EVAL_DEADLINE };
}

impl Default for EvalLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The evaluation environment: the context's roots, the variables bound by list macros, the
/// steps taken and the limits.
pub struct Env<'a> {
    roots: &'a BTreeMap<String, Val>,
    vars: Vec<(String, Val)>,
    steps: u64,
    max_steps: u64,
    deadline: Instant,
    /// The step limit is what the decision had left, not the clause's own.
    decision_bound: bool,
    /// The decision's deadline, when the environment is one of a decision's ([`Env::within`]).
    decision_deadline: Option<Instant>,
    /// `&&` and `||` decided by a deciding operand whatever the others did, errors included
    /// ([`Env::deciding_operands`]); otherwise an operand's error is the result.
    absorb_errors: bool,
}

impl<'a> Env<'a> {
    pub fn new(roots: &'a BTreeMap<String, Val>) -> Self {
        Self::with_limits(roots, EvalLimits::DEFAULT)
    }

    /// An environment whose deadline starts now.
    pub fn with_limits(roots: &'a BTreeMap<String, Val>, limits: EvalLimits) -> Self {
        let now = Instant::now();
        let deadline = now.checked_add(limits.deadline).unwrap_or(now);
        Self {
            roots,
            vars: Vec::new(),
            steps: 0,
            max_steps: u64::from(limits.max_steps),
            deadline,
            decision_bound: false,
            decision_deadline: None,
            absorb_errors: false,
        }
    }

    /// An environment for one clause of a decision: the clause's own limits
    /// ([`EvalLimits::DEFAULT`]) or what `budget` has left, whichever is smaller. Charge what it
    /// spent back with [`DecisionBudget::settle`].
    pub fn within(roots: &'a BTreeMap<String, Val>, budget: &DecisionBudget) -> Self {
        let mut env = Self::with_limits(roots, EvalLimits::DEFAULT);
        if budget.remaining() < env.max_steps {
            env.max_steps = budget.remaining();
            env.decision_bound = true;
        }
        env.deadline = env.deadline.min(budget.deadline);
        env.decision_deadline = Some(budget.deadline);
        env
    }

    /// Logical operators as a DENY policy is read: an operand that decides (`false` for `&&`,
    /// `true` for `||`) decides whatever the others did, errors included, as in CEL. A DENY
    /// scoped with `… == 'X' && …` then does not err (and deny) on the activities it excludes,
    /// while `true || error` still matches. ALLOW policies keep the hosted service's reading, in
    /// which any operand's error is the result (and allows nothing).
    pub fn deciding_operands(mut self) -> Self {
        self.absorb_errors = true;
        self
    }

    /// The steps charged so far (past the budget when the evaluation ran out of it).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    fn remaining(&self) -> u64 {
        self.max_steps.saturating_sub(self.steps)
    }

    /// Charges `n` steps: an error once past the budget or, checked every
    /// [`DEADLINE_CHECK_STEPS`] steps, the deadline.
    fn charge(&mut self, n: u64) -> R<()> {
        let before = self.steps;
        self.steps = self.steps.saturating_add(n);
        if self.steps > self.max_steps {
            return Err(EvalError {
                kind: EvalErrorKind::OutOfSteps,
                message: match self.decision_bound {
                    true => decision_cost_message(EvalErrorKind::OutOfSteps),
                    false => format!("evaluation too costly: more than {} steps", self.max_steps),
                },
            });
        }
        // The first step checks the time too, so a clause of a decision past its deadline
        // stops at once.
        let check = before == 0 || before / DEADLINE_CHECK_STEPS != self.steps / DEADLINE_CHECK_STEPS;
        let now = if check { Some(Instant::now()) } else { None };
        if let Some(now) = now.filter(|now| *now >= self.deadline) {
            return Err(EvalError {
                kind: EvalErrorKind::OutOfTime,
                message: match self.decision_deadline.is_some_and(|d| now >= d) {
                    true => decision_cost_message(EvalErrorKind::OutOfTime),
                    false => "evaluation too costly: past its time limit".into(),
                },
            });
        }
        Ok(())
    }
}

/// Evaluates a boolean expression (a condition, consensus or time window) within the default
/// limits ([`EvalLimits::DEFAULT`]).
pub fn eval_bool(e: &Expr, roots: &BTreeMap<String, Val>) -> R<bool> {
    eval_bool_in(e, &mut Env::new(roots))
}

/// Evaluates a boolean expression in `env` (whose steps tell the cost afterwards).
pub fn eval_bool_in(e: &Expr, env: &mut Env<'_>) -> R<bool> {
    match eval(e, env)? {
        Val::Bool(b) => Ok(b),
        other => err(format!("TypeError: expression is a {}, not a bool", other.type_name())),
    }
}

/// Evaluates every expression of a list, then fails with the first error (at once when the
/// evaluation runs out of steps or time).
fn eval_all(items: &[Expr], env: &mut Env<'_>) -> R<Vec<Val>> {
    let mut out = Vec::with_capacity(items.len());
    let mut first_err = None;
    for e in items {
        match eval(e, env) {
            Ok(v) => out.push(v),
            Err(e) if e.is_cost() => return Err(e),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn as_bool(v: &Val, what: &str) -> R<bool> {
    match v {
        Val::Bool(b) => Ok(*b),
        other => err(format!("TypeError: {what} expects bool, got {}", other.type_name())),
    }
}

fn as_int(v: &Val, what: &str) -> R<i128> {
    match v {
        Val::Int(i) => Ok(*i),
        other => err(format!("TypeError: {what} expects int, got {}", other.type_name())),
    }
}

/// Steps for `n` bytes of text.
fn bytes_cost(n: usize) -> u64 {
    (n / STR_BYTES_PER_STEP) as u64
}

/// What copying (or fully comparing) `v` costs: a step per value and per
/// [`STR_BYTES_PER_STEP`] bytes of its text. Stops counting once past `cap`.
fn weight(v: &Val, cap: u64) -> u64 {
    match v {
        Val::Str(s) | Val::Uint(s) => return 1 + bytes_cost(s.len()),
        Val::List(_) | Val::Map(_) => {}
        _ => return 1,
    }
    let mut total = 0u64;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total += 1;
        match v {
            Val::Str(s) | Val::Uint(s) => total += bytes_cost(s.len()),
            Val::List(l) => {
                total += l.len() as u64;
                if total > cap {
                    return total;
                }
                stack.extend(l);
            }
            Val::Map(m) => {
                total += m.len() as u64;
                if total > cap {
                    return total;
                }
                for (k, v) in m {
                    total += bytes_cost(k.len());
                    stack.push(v);
                }
            }
            _ => {}
        }
        if total > cap {
            return total;
        }
    }
    total
}

/// What comparing `a` and `b` for equality costs beyond the comparison's own step. For lists
/// and maps it is what measuring them costs: both weights, each counted up to `cap`. (Charging
/// only the smaller of the two let a comparison of a large value with a small one walk up to
/// `cap` values for a step or two: a clause of 20,000 such steps took seconds.)
fn eq_cost(a: &Val, b: &Val, cap: u64) -> u64 {
    match (a, b) {
        (Val::Str(x), Val::Str(y)) | (Val::Uint(x), Val::Uint(y)) => bytes_cost(x.len().min(y.len())),
        (Val::List(_), Val::List(_)) | (Val::Map(_), Val::Map(_)) => {
            let first = weight(a, cap);
            first.saturating_add(weight(b, cap.saturating_sub(first)))
        }
        _ => 0,
    }
}

/// A path into the context or a bound variable (`root.a['b'][0]`, literal indices only),
/// resolved by reference, so that `eth.tx.to` copies the address and not `eth`. `None`: `e` is
/// not such a path. `nodes` counts the path's nodes (and the bytes of its names).
fn resolve<'v>(
    e: &Expr,
    roots: &'v BTreeMap<String, Val>,
    vars: &'v [(String, Val)],
    nodes: &mut u64,
) -> Option<R<&'v Val>> {
    *nodes += 1;
    match e {
        Expr::Ident(name) => {
            *nodes += bytes_cost(name.len());
            Some(match vars.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v).or_else(|| roots.get(name)) {
                Some(v) => Ok(v),
                None => err(format!("MissingField: {name}")),
            })
        }
        Expr::Member(x, field) => {
            let base = resolve(x, roots, vars, nodes)?;
            *nodes += bytes_cost(field.len());
            Some(base.and_then(|b| match b {
                Val::Map(m) => m.get(field).ok_or_else(|| EvalError::failed(format!("MissingField: {field}"))),
                other => err(format!("TypeError: .{field} on a {}", other.type_name())),
            }))
        }
        Expr::Index(x, i) if matches!(i.as_ref(), Expr::Int(_) | Expr::Str(_)) => {
            let base = resolve(x, roots, vars, nodes)?;
            *nodes += 1;
            Some(base.and_then(|b| {
                match (b, i.as_ref()) {
                    (Val::List(l), Expr::Int(i)) => usize::try_from(*i)
                        .ok()
                        .and_then(|i| l.get(i))
                        .ok_or_else(|| EvalError::failed(format!("IndexOutOfBounds: {i} of {}", l.len()))),
                    (Val::Map(m), Expr::Str(k)) => {
                        m.get(k).ok_or_else(|| EvalError::failed(format!("MissingField: {k}")))
                    }
                    (x, i) => {
                        let i = if matches!(i, Expr::Int(_)) { "int" } else { "string" };
                        err(format!("TypeError: cannot index a {} with a {i}", x.type_name()))
                    }
                }
            }))
        }
        _ => None,
    }
}

/// A path's value, copied and charged (see [`resolve`]); `None` when `e` is not a path.
fn lookup(e: &Expr, env: &mut Env<'_>) -> Option<R<Val>> {
    let remaining = env.remaining();
    let mut nodes = 0;
    let (found, cost) = match resolve(e, env.roots, &env.vars, &mut nodes)? {
        Ok(v) => {
            let w = weight(v, remaining);
            (Ok((w <= remaining).then(|| v.clone())), w)
        }
        Err(e) => (Err(e), 0),
    };
    // The node itself was charged on entry to `eval`.
    Some(
        env.charge(nodes.saturating_sub(1).saturating_add(cost))
            .and_then(|()| found.map(|v| v.expect("a copy within the budget was made"))),
    )
}

pub fn eval(e: &Expr, env: &mut Env<'_>) -> R<Val> {
    env.charge(1)?;
    if matches!(e, Expr::Ident(_) | Expr::Member(..) | Expr::Index(..)) {
        if let Some(v) = lookup(e, env) {
            return v;
        }
    }
    Ok(match e {
        Expr::Bool(b) => Val::Bool(*b),
        Expr::Int(i) => Val::Int(*i),
        Expr::BigUint(s) => Val::Uint(s.clone()),
        Expr::Str(s) => {
            env.charge(bytes_cost(s.len()))?;
            Val::Str(s.clone())
        }
        Expr::List(items) => Val::List(eval_all(items, env)?),
        Expr::Timestamp(n) => Val::Time(*n),
        Expr::Ident(name) => return err(format!("MissingField: {name}")),
        Expr::Member(x, field) => match eval(x, env)? {
            Val::Map(mut m) => match m.remove(field) {
                Some(v) => v,
                None => return err(format!("MissingField: {field}")),
            },
            other => return err(format!("TypeError: .{field} on a {}", other.type_name())),
        },
        Expr::Index(x, i) => {
            let (x, i) = (eval(x, env), eval(i, env));
            match (x?, i?) {
                (Val::List(mut l), Val::Int(i)) => match usize::try_from(i).ok().filter(|i| *i < l.len()) {
                    Some(i) => l.swap_remove(i),
                    None => return err(format!("IndexOutOfBounds: {i} of {}", l.len())),
                },
                (Val::Map(mut m), Val::Str(k)) => match m.remove(&k) {
                    Some(v) => v,
                    None => return err(format!("MissingField: {k}")),
                },
                (x, i) => return err(format!("TypeError: cannot index a {} with a {}", x.type_name(), i.type_name())),
            }
        }
        Expr::Slice(x, a, b) => {
            let (x, a, b) = (eval(x, env), eval(a, env), eval(b, env));
            let (x, a, b) = (x?, as_int(&a?, "slice")?, as_int(&b?, "slice")?);
            let bounds = |len: usize| -> R<(usize, usize)> {
                match (usize::try_from(a), usize::try_from(b)) {
                    (Ok(a), Ok(b)) if a <= b && b <= len => Ok((a, b)),
                    _ => err(format!("IndexOutOfBounds: [{a}..{b}] of {len}")),
                }
            };
            match x {
                Val::List(mut l) => {
                    let (a, b) = bounds(l.len())?;
                    env.charge((b - a) as u64)?;
                    l.truncate(b);
                    l.drain(..a);
                    Val::List(l)
                }
                Val::Str(s) => {
                    env.charge(bytes_cost(s.len()))?;
                    let chars: Vec<char> = s.chars().collect();
                    let (a, b) = bounds(chars.len())?;
                    Val::Str(chars[a..b].iter().collect())
                }
                other => return err(format!("TypeError: cannot slice a {}", other.type_name())),
            }
        }
        Expr::Not(x) => Val::Bool(!as_bool(&eval(x, env)?, "!")?),
        Expr::Neg(x) => {
            let i = as_int(&eval(x, env)?, "-")?;
            Val::Int(i.checked_neg().ok_or_else(|| EvalError::failed("Overflow: negation"))?)
        }
        Expr::And(items) => Val::Bool(!logical(items, env, false, "&&")?),
        Expr::Or(items) => Val::Bool(logical(items, env, true, "||")?),
        Expr::Compare(op, a, b) => {
            let (a, b) = (eval(a, env), eval(b, env));
            let (a, b) = (a?, b?);
            env.charge(eq_cost(&a, &b, env.remaining()))?;
            Val::Bool(compare(*op, &a, &b)?)
        }
        Expr::In(x, list) => {
            let (x, list) = (eval(x, env), eval(list, env));
            let (x, list) = (x?, list?);
            match list {
                Val::List(l) => Val::Bool(any_equal(&l, &x, env)?),
                Val::Map(m) => match x {
                    Val::Str(k) => {
                        env.charge(bytes_cost(k.len()))?;
                        Val::Bool(m.contains_key(&k))
                    }
                    other => return err(format!("TypeError: 'in' a struct with a {}", other.type_name())),
                },
                other => return err(format!("TypeError: 'in' expects a list, got {}", other.type_name())),
            }
        }
        Expr::Contains(list, x) => {
            let (list, x) = (eval(list, env), eval(x, env));
            match (list?, x?) {
                (Val::List(l), x) => Val::Bool(any_equal(&l, &x, env)?),
                (Val::Str(s), Val::Str(sub)) => {
                    env.charge(bytes_cost(s.len() + sub.len()))?;
                    Val::Bool(s.contains(&sub))
                }
                (l, _) => return err(format!("TypeError: contains() on a {}", l.type_name())),
            }
        }
        Expr::Count(list) => match count_in_place(list, env) {
            Some(n) => Val::Int(n?),
            None => match eval(list, env)? {
                Val::List(l) => Val::Int(l.len() as i128),
                Val::Map(m) => Val::Int(m.len() as i128),
                Val::Str(s) => {
                    env.charge(bytes_cost(s.len()))?;
                    Val::Int(s.chars().count() as i128)
                }
                other => return err(format!("TypeError: count() on a {}", other.type_name())),
            },
        },
        Expr::Quantified { quantifier, list, var, pred } => {
            let items = match eval(list, env)? {
                Val::List(l) => l,
                other => return err(format!("TypeError: {quantifier:?} on a {}", other.type_name())),
            };
            let (mut all, mut any, mut kept, mut first_err) = (true, false, Vec::new(), None);
            for item in items {
                // The iteration, and binding the variable's name.
                env.charge(1 + bytes_cost(var.len()))?;
                env.vars.push((var.clone(), item));
                let r = eval(pred, env).and_then(|v| as_bool(&v, "a list predicate"));
                let (_, item) = env.vars.pop().expect("the variable pushed above");
                match r {
                    Ok(b) => {
                        all &= b;
                        any |= b;
                        if b && *quantifier == Quantifier::Filter {
                            kept.push(item);
                        }
                    }
                    Err(e) if e.is_cost() => return Err(e),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_err {
                return Err(e);
            }
            match quantifier {
                Quantifier::All => Val::Bool(all),
                Quantifier::Any => Val::Bool(any),
                Quantifier::Filter => Val::List(kept),
            }
        }
        Expr::CronSpan { cron, minutes, zone } => {
            let now = match env.roots.get("time").and_then(|t| match t {
                Val::Map(m) => m.get("now"),
                _ => None,
            }) {
                Some(Val::Time(n)) => *n,
                _ => return err("MissingField: time.now"),
            };
            Val::Bool(cron_span_active(cron, *minutes, zone, now, env)?)
        }
    })
}

/// `count()` of a path (see [`resolve`]) without copying what it names; `None`: not a path.
fn count_in_place(e: &Expr, env: &mut Env<'_>) -> Option<R<i128>> {
    let mut nodes = 0;
    let (n, cost) = match resolve(e, env.roots, &env.vars, &mut nodes)? {
        Ok(Val::List(l)) => (Ok(l.len() as i128), 0),
        Ok(Val::Map(m)) => (Ok(m.len() as i128), 0),
        Ok(Val::Str(s)) => (Ok(s.chars().count() as i128), bytes_cost(s.len())),
        Ok(other) => (err(format!("TypeError: count() on a {}", other.type_name())), 0),
        Err(e) => (Err(e), 0),
    };
    Some(env.charge(nodes.saturating_add(cost)).and(n))
}

/// `in` / `contains()` on a list: a step per item and for what each comparison reads.
fn any_equal(l: &[Val], x: &Val, env: &mut Env<'_>) -> R<bool> {
    for v in l {
        env.charge(1 + eq_cost(v, x, env.remaining()))?;
        if loose_eq(v, x) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Equality for `in` / `contains()`: values of different types are simply not equal.
fn loose_eq(a: &Val, b: &Val) -> bool {
    compare(CmpOp::Eq, a, b).unwrap_or(false)
}

fn num_cmp(a: &Val, b: &Val) -> Option<Ordering> {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Some(x.cmp(y)),
        (Val::Int(_), Val::Uint(_)) => Some(Ordering::Less),
        (Val::Uint(_), Val::Int(_)) => Some(Ordering::Greater),
        (Val::Uint(x), Val::Uint(y)) => Some(x.len().cmp(&y.len()).then_with(|| x.cmp(y))),
        (Val::Time(x), Val::Time(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

fn compare(op: CmpOp, a: &Val, b: &Val) -> R<bool> {
    match op {
        CmpOp::Eq | CmpOp::Ne => {
            let eq = if let Some(o) = num_cmp(a, b) {
                o == Ordering::Equal
            } else if std::mem::discriminant(a) == std::mem::discriminant(b) {
                a == b
            } else {
                return err(format!("TypeError: cannot compare a {} with a {}", a.type_name(), b.type_name()));
            };
            Ok(if op == CmpOp::Eq { eq } else { !eq })
        }
        _ => {
            let o = num_cmp(a, b).ok_or_else(|| {
                EvalError::failed(format!("TypeError: cannot order a {} and a {}", a.type_name(), b.type_name()))
            })?;
            Ok(match op {
                CmpOp::Lt => o == Ordering::Less,
                CmpOp::Le => o != Ordering::Greater,
                CmpOp::Gt => o == Ordering::Greater,
                _ => o != Ordering::Less,
            })
        }
    }
}

/// The fixed UTC offset (minutes) of the zones the evaluator can resolve without a zone
/// database: `UTC`, `GMT`, `Etc/UTC`, `Etc/GMT`, `Etc/GMT±N` (POSIX sign: `Etc/GMT+5` is UTC-5).
fn fixed_offset_minutes(zone: &str) -> Option<i64> {
    match zone {
        "UTC" | "GMT" | "Etc/UTC" | "Etc/GMT" | "Etc/Universal" | "Etc/Zulu" | "Zulu" | "Universal" => Some(0),
        _ => {
            let rest = zone.strip_prefix("Etc/GMT")?;
            let (sign, digits) = rest.split_at(1);
            let hours: i64 = digits.parse().ok().filter(|h| *h <= 14)?;
            match sign {
                "+" => Some(-hours * 60),
                "-" => Some(hours * 60),
                _ => None,
            }
        }
    }
}

/// Civil date (year, month 1-12, day 1-31) of a day count since 1970-01-01.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn in_ranges(ranges: &[(u32, u32)], v: u32) -> bool {
    ranges.iter().any(|(a, b)| *a <= v && v <= *b)
}

/// Whether the cron spec's day fields (day of month, month, day of week) match a local day
/// (days since 1970-01-01).
fn day_matches(c: &Cron, days: i64) -> bool {
    let (_, month, dom) = civil(days);
    let dow = (days + 4).rem_euclid(7) as u32; // 1970-01-01 was a Thursday; 0 = Sunday
    let dow_ok = in_ranges(&c.day_of_week, dow) || (dow == 0 && in_ranges(&c.day_of_week, 7));
    let dom_ok = in_ranges(&c.day_of_month, dom);
    let day_ok = match (c.any_day_of_month, c.any_day_of_week) {
        (true, true) => true,
        (true, false) => dow_ok,
        (false, true) => dom_ok,
        (false, false) => dom_ok || dow_ok,
    };
    day_ok && in_ranges(&c.month, month)
}

/// True while `now` is within `minutes` after a minute the cron spec matches in `zone`: some
/// minute of `(now - minutes, now]` matches. Walks back from `now` a minute at a time, but skips
/// a whole day whose date does not match and a whole hour that does not match, so it takes at
/// most a few hundred iterations (8 days, 192 hours, and minutes only within matching hours);
/// each iteration is a step of `env`'s budget.
fn cron_span_active(c: &Cron, minutes: u32, zone: &str, now_nanos: i128, env: &mut Env<'_>) -> R<bool> {
    let offset = fixed_offset_minutes(zone).ok_or_else(|| {
        EvalError::failed(format!("UnsupportedTimeZone: {zone} (only UTC and Etc/GMT±N zones are resolvable here)"))
    })?;
    let now_minute = now_nanos.div_euclid(60_000_000_000) as i64 + offset;
    let oldest = now_minute - i64::from(minutes) + 1;
    // An iteration matches a minute against the fields' ranges (merged by the parser: at most
    // 68 in all): a step, and one more per 16 ranges.
    let ranges = [&c.minute, &c.hour, &c.day_of_month, &c.month, &c.day_of_week].iter().map(|r| r.len()).sum::<usize>();
    let per_iteration = 1 + (ranges / 16) as u64;
    let mut m = now_minute;
    while m >= oldest {
        env.charge(per_iteration)?;
        let day = m.div_euclid(1440);
        if !day_matches(c, day) {
            m = day * 1440 - 1; // the previous day's last minute
            continue;
        }
        let in_day = m.rem_euclid(1440) as u32;
        let hour = in_day / 60;
        if !in_ranges(&c.hour, hour) {
            m = day * 1440 + i64::from(hour) * 60 - 1; // the previous hour's last minute
            continue;
        }
        if in_ranges(&c.minute, in_day % 60) {
            return Ok(true);
        }
        m -= 1;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_condition, parse_consensus};
    use serde_json::json;

    #[test]
    fn to_json_keeps_small_numbers_and_writes_large_ones_as_text() {
        let v = Val::Map(BTreeMap::from([
            ("small".to_string(), Val::Int(42)),
            ("wei".to_string(), Val::Int(10i128.pow(18))),
            ("huge".to_string(), Val::Uint("340282366920938463463374607431768211456".into())),
            ("list".to_string(), Val::List(vec![Val::Bool(true), Val::Null, Val::Str("a".into())])),
        ]));
        assert_eq!(
            v.to_json(),
            serde_json::json!({"small": 42, "wei": "1000000000000000000",
                "huge": "340282366920938463463374607431768211456", "list": [true, null, "a"]})
        );
    }

    fn roots(v: Json) -> BTreeMap<String, Val> {
        match Val::from_json(&v) {
            Val::Map(m) => m,
            _ => unreachable!(),
        }
    }

    fn cond(src: &str, ctx: Json) -> R<bool> {
        eval_bool(&parse_condition(src).unwrap(), &roots(ctx))
    }

    fn cons(src: &str, ctx: Json) -> R<bool> {
        eval_bool(&parse_consensus(src).unwrap(), &roots(ctx))
    }

    fn approvers(ids: &[(&str, &[&str])]) -> Json {
        json!({
            "approvers": ids.iter().map(|(id, tags)| json!({"id": id, "tags": tags, "email": "", "alias": id})).collect::<Vec<_>>(),
            "credentials": ids.iter().map(|(id, _)| json!({
                "id": format!("cred-{id}"), "user_id": id, "type": "CREDENTIAL_TYPE_API_KEY_P256",
                "public_key": format!("pk-{id}"), "credential_id": ""
            })).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn consensus_examples() {
        let one = approvers(&[("u1", &["t1"])]);
        let two = approvers(&[("u1", &["t1"]), ("u2", &["t1", "t2"])]);
        assert!(cons("approvers.any(user, user.id == 'u1')", one.clone()).unwrap());
        assert!(!cons("approvers.any(user, user.id == 'u9')", one.clone()).unwrap());
        let tag2 = "approvers.filter(user, user.tags.contains('t1')).count() >= 2";
        assert!(!cons(tag2, one.clone()).unwrap());
        assert!(cons(tag2, two.clone()).unwrap());
        assert!(cons("approvers.count() >= 2", two.clone()).unwrap());
        assert!(cons(
            "credentials.any(credential, credential.type == 'CREDENTIAL_TYPE_WEBAUTHN_AUTHENTICATOR')",
            two.clone()
        )
        .is_ok_and(|b| !b));
        assert!(cons("credentials.any(credential, credential.public_key == 'pk-u2')", two).unwrap());
        assert!(!cons("credentials.any(credential, credential.public_key == 'pk-u2')", one).unwrap());
    }

    fn sign_ctx(wallet: Option<&str>, key: Option<&str>) -> Json {
        let mut ctx = json!({
            "activity": {"type": "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", "kind": "SIGN_RAW_PAYLOAD",
                "resource": "PRIVATE_KEY", "action": "SIGN",
                "params": {"hash_function": "HASH_FUNCTION_NO_OP", "encoding": "PAYLOAD_ENCODING_HEXADECIMAL"}},
            "time": {"now": 0},
        });
        if let Some(w) = wallet {
            ctx["wallet"] = json!({"id": w, "imported": false, "exported": false, "label": "w"});
            ctx["wallet_account"] = json!({"address": "0xabc"});
        }
        if let Some(k) = key {
            ctx["private_key"] = json!({"id": k, "tags": ["kt"], "imported": false, "exported": false, "label": "k"});
        }
        ctx
    }

    #[test]
    fn scoping_examples() {
        assert!(cond("activity.action == 'SIGN' && wallet.id == 'w1'", sign_ctx(Some("w1"), None)).unwrap());
        assert!(!cond("activity.action == 'SIGN' && wallet.id == 'w1'", sign_ctx(Some("w2"), None)).unwrap());
        assert!(cond("activity.action == 'SIGN' && private_key.id == 'k1'", sign_ctx(None, Some("k1"))).unwrap());
        assert!(cond("activity.kind == 'SIGN_RAW_PAYLOAD'", sign_ctx(None, Some("k1"))).unwrap());
        assert!(cond("private_key.tags.contains('kt')", sign_ctx(None, Some("k1"))).unwrap());
        // Signing with a wallet: `private_key` is missing, so the clause errors, even inside `||`.
        let e = cond("wallet.id == 'w1' || private_key.id == 'k1'", sign_ctx(Some("w1"), None)).unwrap_err();
        assert!(e.message.contains("MissingField"), "{e}");
        let mut export = json!({"activity": {"type": "ACTIVITY_TYPE_EXPORT_WALLET_ACCOUNT", "kind": "EXPORT_WALLET_ACCOUNT",
            "resource": "WALLET", "action": "EXPORT", "params": {"target_public_key": "04aa"}},
            "wallet_account": {"address": "0xabc"}});
        assert!(cond("activity.action == 'EXPORT' && wallet_account.address == '0xabc'", export.clone()).unwrap());
        export["wallet_account"]["address"] = json!("0xdef");
        assert!(!cond("activity.action == 'EXPORT' && wallet_account.address == '0xabc'", export).unwrap());
        let auth = json!({"activity": {"type": "ACTIVITY_TYPE_INIT_OTP_AUTH_V3", "kind": "INIT_OTP_AUTH",
            "resource": "AUTH", "action": "CREATE", "params": {"otp_length": 6}}});
        assert!(cond("activity.resource in ['AUTH', 'OTP'] && activity.action in ['CREATE','VERIFY']", auth.clone())
            .unwrap());
        assert!(cond("activity.params.otp_length == 6", auth.clone()).unwrap());
        assert!(cond("activity.params.missing == 6", auth).unwrap_err().message.contains("MissingField"));
    }

    #[test]
    fn deny_no_op_example_and_eip712() {
        let src = "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2' && activity.params.hash_function == 'HASH_FUNCTION_NO_OP' && activity.params.encoding != 'PAYLOAD_ENCODING_EIP712'";
        assert!(cond(src, sign_ctx(None, Some("k"))).unwrap());
        let mut ctx = sign_ctx(None, Some("k"));
        ctx["activity"]["params"]["encoding"] = json!("PAYLOAD_ENCODING_EIP712");
        ctx["eth"] = json!({"eip_712": {"primary_type": "Permit",
            "domain": {"name": "USD Coin", "version": "2", "chain_id": 1, "verifying_contract": "0xA0b8"},
            "message": {"permitted": [{"token": "0xA0b8"}, {"token": "0xA0b8"}]}}});
        assert!(!cond(src, ctx.clone()).unwrap());
        assert!(cond("eth.eip_712.domain.name == 'USD Coin' && eth.eip_712.primary_type == 'Permit' && activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'", ctx.clone()).unwrap());
        assert!(cond("eth.eip_712.message['permitted'].all(p, p['token'] == '0xA0b8')", ctx.clone()).unwrap());
        ctx["eth"]["eip_712"]["message"]["permitted"][1]["token"] = json!("0xdead");
        assert!(!cond("eth.eip_712.message['permitted'].all(p, p['token'] == '0xA0b8')", ctx.clone()).unwrap());
        // eth.tx is absent for a raw payload: an error, not false.
        assert!(cond("eth.tx.chain_id == 11155111", ctx).is_err());
    }

    #[test]
    fn ethereum_tx_examples() {
        let ctx = json!({"eth": {"tx": {"to": "0xc", "chain_id": 11155111, "data": "0xa9059cbb0000",
            "contract_call_args": {"wad": 5}}}});
        assert!(cond("eth.tx.chain_id == 11155111", ctx.clone()).unwrap());
        assert!(cond("eth.tx.to == '0xc' && eth.tx.data[0..10] == '0xa9059cbb'", ctx.clone()).unwrap());
        assert!(cond("eth.tx.contract_call_args['wad'] < 1000000000000000000", ctx.clone()).unwrap());
        assert!(cond("eth.tx.data[0..99] == 'x'", ctx.clone()).unwrap_err().message.contains("IndexOutOfBounds"));
        assert!(cond("eth.tx.to < 5", ctx.clone()).unwrap_err().message.contains("TypeError"));
        assert!(cond("eth.tx.to == 5", ctx.clone()).unwrap_err().message.contains("TypeError"));
        assert!(cond(
            "eth.tx.chain_id < 115792089237316195423570985008687907853269984665640564039457584007913129639935",
            ctx
        )
        .unwrap());
    }

    fn at(nanos: i128) -> BTreeMap<String, Val> {
        let mut m = BTreeMap::new();
        m.insert("now".to_string(), Val::Time(nanos));
        let mut r = BTreeMap::new();
        r.insert("time".to_string(), Val::Map(m));
        r
    }

    #[test]
    fn time_examples() {
        let window = crate::parse_time(
            "time.now >= Timestamp('2025-01-01T00:00:00Z') && time.now < Timestamp('2025-02-01T00:00:00Z')",
        )
        .unwrap();
        let jan15: i128 = 1_736_899_200 * 1_000_000_000; // 2025-01-15T00:00:00Z, a Wednesday
        assert!(eval_bool(&window, &at(jan15)).unwrap());
        assert!(!eval_bool(&window, &at(jan15 + 40 * 86_400 * 1_000_000_000)).unwrap());
        let hour = 3_600 * 1_000_000_000i128;
        let weekdays = parse_condition("CronSpan('0 9 * * 1-5', '8h', 'UTC')").unwrap();
        assert!(!eval_bool(&weekdays, &at(jan15 + 8 * hour)).unwrap());
        assert!(eval_bool(&weekdays, &at(jan15 + 9 * hour)).unwrap());
        assert!(eval_bool(&weekdays, &at(jan15 + 16 * hour + 59 * 60_000_000_000)).unwrap());
        assert!(!eval_bool(&weekdays, &at(jan15 + 17 * hour)).unwrap());
        // Saturday 2025-01-18 at 10:00: outside.
        assert!(!eval_bool(&weekdays, &at(jan15 + 3 * 24 * hour + 10 * hour)).unwrap());
        let ny = parse_condition("CronSpan('0 9 * * 1-5', '8h', 'America/New_York')").unwrap();
        assert!(eval_bool(&ny, &at(jan15)).unwrap_err().message.contains("UnsupportedTimeZone"));
        let gmt5 = parse_condition("CronSpan('0 9 * * *', '1h', 'Etc/GMT+5')").unwrap();
        assert!(eval_bool(&gmt5, &at(jan15 + 14 * hour)).unwrap());
        assert!(!eval_bool(&gmt5, &at(jan15 + 9 * hour)).unwrap());
    }

    #[test]
    fn no_short_circuit_and_types() {
        let ctx = json!({"wallet": {"id": "w"}});
        assert!(cond("false && private_key.id == 'x'", ctx.clone()).is_err());
        assert!(cond("true || private_key.id == 'x'", ctx.clone()).is_err());
        assert!(cond("wallet.id == 'w'", ctx.clone()).unwrap());
        assert!(cond("wallet.id", ctx).unwrap_err().message.contains("TypeError"));
    }

    #[test]
    fn nested_list_macros_stop_at_the_step_budget() {
        // Found while fuzzing the policy language: 10^7 visits without a budget (0.8 s).
        let ten = format!("[{}]", ["1"; 10].join(", "));
        let mut src = "true".to_string();
        for depth in (0..7).rev() {
            src = format!("{ten}.all(v{depth}, {src})");
        }
        let roots = BTreeMap::new();
        // Refused when written now (10^7 steps on every evaluation); as stored before the caps,
        // the evaluation stops at the budget.
        let refused = crate::parse_condition(&src).unwrap_err();
        assert!(refused.message.contains("too costly: every evaluation takes at least"), "{refused}");
        let expr = crate::parser::parse_with(&src, crate::CONDITION_ROOTS, &unbounded()).unwrap();
        let e = eval_bool(&expr, &roots).unwrap_err();
        assert!(e.message.contains("evaluation too costly"), "{}", e.message);
        assert_eq!(e.kind, EvalErrorKind::OutOfSteps);
        // Two levels (121 visits) are well inside it.
        let small = crate::parse_condition(&format!("{ten}.all(a, {ten}.any(b, b == 1))")).unwrap();
        assert!(eval_bool(&small, &roots).unwrap());
    }

    fn unbounded() -> crate::Limits {
        let eval = EvalLimits { max_steps: u32::MAX, ..EvalLimits::DEFAULT };
        crate::Limits { max_clause_bytes: usize::MAX, max_list_len: usize::MAX, eval }
    }

    /// The per-minute walk `cron_span_active` replaced, as an oracle.
    fn cron_matches_minute(c: &Cron, local_minute: i64) -> bool {
        let days = local_minute.div_euclid(1440);
        let in_day = local_minute.rem_euclid(1440) as u32;
        day_matches(c, days) && in_ranges(&c.hour, in_day / 60) && in_ranges(&c.minute, in_day % 60)
    }

    #[test]
    fn cron_span_skips_days_and_hours_like_the_minute_walk() {
        let roots = BTreeMap::new();
        let specs = [
            "0 9 * * 1-5",
            "0 0 30 2 *",
            "59 23 31 12 *",
            "0,30 8-17 1,15 1-12 0,7",
            "5 * * * *",
            "* * * * *",
            "0 0 29 2 *",
            "10-12 3 * * 6",
        ];
        let durations = [1, 2, 59, 60, 61, 480, 1439, 1440, 1441, 2 * 1440 + 7, 7 * 1440];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for spec in specs {
            let cron = crate::parser::parse_cron(spec).unwrap();
            for minutes in durations {
                for _ in 0..40 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    // Minutes from 1970 to about 2100, some of them right on a boundary.
                    let mut now_minute = (seed % (130 * 525_600)) as i64;
                    if seed.is_multiple_of(3) {
                        now_minute -= now_minute % 60;
                    }
                    let want = (0..i64::from(minutes)).any(|back| cron_matches_minute(&cron, now_minute - back));
                    let mut env = Env::new(&roots);
                    let got =
                        cron_span_active(&cron, minutes, "UTC", i128::from(now_minute) * 60_000_000_000, &mut env);
                    assert_eq!(got, Ok(want), "{spec} {minutes} at minute {now_minute}");
                    assert!(env.steps() <= 400, "{spec} {minutes}: {} steps", env.steps());
                }
            }
        }
    }

    /// Issue 23: three policies of a 9,990-item list quantified over a CronSpan that never
    /// matches (February 30th) over 7 days took 13.4 s: the CronSpan loop was not charged.
    #[test]
    fn cron_span_over_a_long_list_runs_out_of_steps() {
        let list = format!("[{}]", vec!["0"; 9_990].join(","));
        let src = format!("{list}.all(x, !CronSpan('0 0 30 2 *', '7d', 'UTC'))");
        // The literal list is longer than a clause may hold now: evaluate the tree the parser
        // made before the caps (what a policy stored before them holds).
        let expr = crate::parser::parse_with(&src, crate::CONDITION_ROOTS, &unbounded()).unwrap();
        let roots = at(1_736_899_200 * 1_000_000_000);
        let started = Instant::now();
        let mut env = Env::new(&roots);
        let e = eval_bool_in(&expr, &mut env).unwrap_err();
        assert_eq!(e.kind, EvalErrorKind::OutOfSteps, "{e}");
        assert!(e.is_cost());
        assert!(
            env.steps() > u64::from(MAX_EVAL_STEPS) && env.steps() < u64::from(MAX_EVAL_STEPS) + 1_000,
            "{}",
            env.steps()
        );
        // A sanity bound only (the steps above are the test): it took 1.47 s per clause before.
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
        // One CronSpan over 7 days is a handful of steps, not 10,080.
        let one = crate::parse_condition("CronSpan('0 0 30 2 *', '7d', 'UTC')").unwrap();
        let mut env = Env::new(&roots);
        assert!(!eval_bool_in(&one, &mut env).unwrap());
        assert!(env.steps() <= 10, "{}", env.steps());
    }

    #[test]
    fn every_unit_of_work_is_charged() {
        let roots = roots(
            json!({"solana": {"tx": {"transfers": (0..6_000).map(|i| json!({"to": "a", "amount": i})).collect::<Vec<_>>()}},
            "eth": {"tx": {"to": "0xc", "data": format!("0x{}", "ab".repeat(200_000))}}}),
        );
        let steps = |src: &str| {
            let mut env = Env::new(&roots);
            let r = eval_bool_in(&parse_condition(src).unwrap(), &mut env);
            (r, env.steps())
        };
        // A path copies what it names, not the root it goes through.
        let (r, n) = steps("eth.tx.to == '0xc'");
        assert_eq!((r, n), (Ok(true), 6));
        // Copying 400 KB of text, comparing it, slicing it: a step per 64 bytes.
        let (r, n) = steps("eth.tx.data == 'x'");
        assert!(r.is_ok() && n > 400_000 / 64 && n < 2 * 400_000 / 64, "{n}");
        let (r, _) = steps("eth.tx.data[0..10] == '0xabababab' && eth.tx.data[0..10] == '0xabababab' && eth.tx.data.contains('x') && eth.tx.data.count() > 0");
        assert_eq!(r.unwrap_err().kind, EvalErrorKind::OutOfSteps);
        // A context list: each item a quantifier visits, and `in` goes through, is charged.
        let (r, n) = steps("solana.tx.transfers.any(t, t.amount == -1)");
        assert_eq!(r.unwrap_err().kind, EvalErrorKind::OutOfSteps, "{n}");
        // count() reads the list in place.
        let (r, n) = steps("solana.tx.transfers.count() > 0");
        assert_eq!((r, n), (Ok(true), 6));
        let (r, _) = steps("-1 in solana.tx.transfers.filter(t, true) || true");
        assert_eq!(r.unwrap_err().kind, EvalErrorKind::OutOfSteps);
    }

    #[test]
    fn a_comparison_is_charged_for_both_values_it_measures() {
        // A 5,000-value list compared with each of 1,000 one-value lists: measuring it costs
        // 5,000 steps a comparison, and was charged 2 (the smaller side). A clause of such
        // comparisons took seconds within its 20,000 steps (issue 39).
        let big: Vec<i64> = vec![0; 5_000];
        let roots = roots(json!({ "activity": { "params": { "big": big } } }));
        let small = format!("[{}[0]]", "[0],".repeat(999));
        let expr = parse_condition(&format!("activity.params.big in {small}")).unwrap();
        let mut env = Env::new(&roots);
        let e = eval_bool_in(&expr, &mut env).map(|b| format!("{b} in {} steps", env.steps())).unwrap_err();
        assert_eq!(e.kind, EvalErrorKind::OutOfSteps, "{e}");
        // Two small lists: two steps and their values.
        let mut env = Env::new(&roots);
        assert!(eval_bool_in(&parse_condition("[1] in [[0], [1]]").unwrap(), &mut env).unwrap());
        assert!(env.steps() < 40, "{}", env.steps());
    }

    #[test]
    fn a_cron_field_written_long_is_matched_short() {
        // Issue 39 attack: a minute field of 19,000 entries was matched entry by entry at each of
        // up to 10,080 iterations, a step each: 2,070 steps took 60-85 ms.
        let long = vec!["59"; 19_000].join(",");
        let src = format!("CronSpan('{long} * * * *', '7d', 'UTC')");
        let Expr::CronSpan { cron, .. } = parse_condition(&src).unwrap() else { panic!("a CronSpan") };
        assert_eq!(cron.minute, vec![(59, 59)]);
        // Overlapping and adjacent ranges merge; the values matched are the same.
        let Expr::CronSpan { cron, .. } =
            parse_condition("CronSpan('5,1-3,4,10-20,15-25,40 9,8 * 1-2,3 0,7', '1h', 'UTC')").unwrap()
        else {
            panic!("a CronSpan")
        };
        assert_eq!(cron.minute, vec![(1, 5), (10, 25), (40, 40)]);
        assert_eq!((cron.hour, cron.month, cron.day_of_week), (vec![(8, 9)], vec![(1, 3)], vec![(0, 0), (7, 7)]));
        // At minute :58 it walks 7 days (skipping hours that cannot match: at most a few
        // hundred iterations), charged per iteration.
        let roots = at(58 * 60 * 1_000_000_000);
        let mut env = Env::new(&roots);
        assert!(eval_bool_in(&parse_condition(&src).unwrap(), &mut env).unwrap());
        assert!(env.steps() < 400, "{}", env.steps());
    }

    #[test]
    fn the_deadline_is_a_typed_error() {
        let roots = at(0);
        let ten = format!("[{}]", ["1"; 10].join(", "));
        let expr = parse_condition(&format!("{ten}.all(a, {ten}.all(b, {ten}.all(c, true)))")).unwrap();
        let mut env = Env::with_limits(&roots, EvalLimits { max_steps: u32::MAX, deadline: Duration::ZERO });
        let e = eval_bool_in(&expr, &mut env).unwrap_err();
        assert_eq!(e.kind, EvalErrorKind::OutOfTime, "{e}");
        // Past its deadline already: the first step stops it.
        assert_eq!(env.steps(), 1);
        // Otherwise the deadline is read every DEADLINE_CHECK_STEPS steps.
        let mut env = Env::with_limits(&roots, EvalLimits { max_steps: u32::MAX, deadline: Duration::from_secs(60) });
        env.charge(1).unwrap();
        env.deadline = Instant::now();
        let e = eval_bool_in(&expr, &mut env).unwrap_err();
        assert_eq!(e.kind, EvalErrorKind::OutOfTime, "{e}");
        assert!(env.steps() >= DEADLINE_CHECK_STEPS && env.steps() < 2 * DEADLINE_CHECK_STEPS, "{}", env.steps());
        assert!(eval_bool(&expr, &roots).unwrap());
    }
}
