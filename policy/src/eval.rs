//! The policy evaluator: walks a parsed [`Expr`] over a JSON-like context, without
//! short-circuiting (spec 12.2): every operand is evaluated and any error fails the expression.

use std::cmp::Ordering;
use std::collections::BTreeMap;

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

/// Why an expression could not be evaluated (a missing field, a type error, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalError(pub String);

impl std::fmt::Display for EvalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

type R<T> = Result<T, EvalError>;

fn err<T>(m: impl Into<String>) -> R<T> {
    Err(EvalError(m.into()))
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

/// Most expression nodes one evaluation may visit. Nested list macros multiply (`l.all(a,
/// l.all(b, …))` over 10-item lists is 10^depth visits): past this budget the clause is an
/// error, which decides nothing, instead of holding the submission for seconds. Real policies
/// visit tens to a few thousand nodes.
pub const MAX_EVAL_STEPS: u32 = 20_000;

/// The evaluation environment: the context's roots, the variables bound by list macros and the
/// steps taken.
pub struct Env<'a> {
    roots: &'a BTreeMap<String, Val>,
    vars: Vec<(String, Val)>,
    steps: u32,
}

impl<'a> Env<'a> {
    pub fn new(roots: &'a BTreeMap<String, Val>) -> Self {
        Self { roots, vars: Vec::new(), steps: 0 }
    }
}

/// Evaluates a boolean expression (a condition, consensus or time window).
pub fn eval_bool(e: &Expr, roots: &BTreeMap<String, Val>) -> R<bool> {
    let mut env = Env::new(roots);
    match eval(e, &mut env)? {
        Val::Bool(b) => Ok(b),
        other => err(format!("TypeError: expression is a {}, not a bool", other.type_name())),
    }
}

/// Evaluates every expression of a list, then fails with the first error.
fn eval_all(items: &[Expr], env: &mut Env<'_>) -> R<Vec<Val>> {
    let results: Vec<R<Val>> = items.iter().map(|e| eval(e, env)).collect();
    results.into_iter().collect()
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

pub fn eval(e: &Expr, env: &mut Env<'_>) -> R<Val> {
    env.steps += 1;
    if env.steps > MAX_EVAL_STEPS {
        return err(format!("evaluation too costly: more than {MAX_EVAL_STEPS} steps"));
    }
    Ok(match e {
        Expr::Bool(b) => Val::Bool(*b),
        Expr::Int(i) => Val::Int(*i),
        Expr::BigUint(s) => Val::Uint(s.clone()),
        Expr::Str(s) => Val::Str(s.clone()),
        Expr::List(items) => Val::List(eval_all(items, env)?),
        Expr::Timestamp(n) => Val::Time(*n),
        Expr::Ident(name) => {
            if let Some((_, v)) = env.vars.iter().rev().find(|(n, _)| n == name) {
                v.clone()
            } else if let Some(v) = env.roots.get(name) {
                v.clone()
            } else {
                return err(format!("MissingField: {name}"));
            }
        }
        Expr::Member(x, field) => match eval(x, env)? {
            Val::Map(m) => match m.get(field) {
                Some(v) => v.clone(),
                None => return err(format!("MissingField: {field}")),
            },
            other => return err(format!("TypeError: .{field} on a {}", other.type_name())),
        },
        Expr::Index(x, i) => {
            let (x, i) = (eval(x, env), eval(i, env));
            match (x?, i?) {
                (Val::List(l), Val::Int(i)) => match usize::try_from(i).ok().and_then(|i| l.get(i)) {
                    Some(v) => v.clone(),
                    None => return err(format!("IndexOutOfBounds: {i} of {}", l.len())),
                },
                (Val::Map(m), Val::Str(k)) => match m.get(&k) {
                    Some(v) => v.clone(),
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
                Val::List(l) => {
                    let (a, b) = bounds(l.len())?;
                    Val::List(l[a..b].to_vec())
                }
                Val::Str(s) => {
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
            Val::Int(i.checked_neg().ok_or_else(|| EvalError("Overflow: negation".into()))?)
        }
        Expr::And(items) => {
            let vals = eval_all(items, env)?;
            let bools = vals.iter().map(|v| as_bool(v, "&&")).collect::<R<Vec<_>>>()?;
            Val::Bool(bools.iter().all(|b| *b))
        }
        Expr::Or(items) => {
            let vals = eval_all(items, env)?;
            let bools = vals.iter().map(|v| as_bool(v, "||")).collect::<R<Vec<_>>>()?;
            Val::Bool(bools.iter().any(|b| *b))
        }
        Expr::Compare(op, a, b) => {
            let (a, b) = (eval(a, env), eval(b, env));
            Val::Bool(compare(*op, &a?, &b?)?)
        }
        Expr::In(x, list) => {
            let (x, list) = (eval(x, env), eval(list, env));
            let (x, list) = (x?, list?);
            match list {
                Val::List(l) => Val::Bool(l.iter().any(|v| loose_eq(v, &x))),
                Val::Map(m) => match x {
                    Val::Str(k) => Val::Bool(m.contains_key(&k)),
                    other => return err(format!("TypeError: 'in' a struct with a {}", other.type_name())),
                },
                other => return err(format!("TypeError: 'in' expects a list, got {}", other.type_name())),
            }
        }
        Expr::Contains(list, x) => {
            let (list, x) = (eval(list, env), eval(x, env));
            match (list?, x?) {
                (Val::List(l), x) => Val::Bool(l.iter().any(|v| loose_eq(v, &x))),
                (Val::Str(s), Val::Str(sub)) => Val::Bool(s.contains(&sub)),
                (l, _) => return err(format!("TypeError: contains() on a {}", l.type_name())),
            }
        }
        Expr::Count(list) => match eval(list, env)? {
            Val::List(l) => Val::Int(l.len() as i128),
            Val::Map(m) => Val::Int(m.len() as i128),
            Val::Str(s) => Val::Int(s.chars().count() as i128),
            other => return err(format!("TypeError: count() on a {}", other.type_name())),
        },
        Expr::Quantified { quantifier, list, var, pred } => {
            let items = match eval(list, env)? {
                Val::List(l) => l,
                other => return err(format!("TypeError: {quantifier:?} on a {}", other.type_name())),
            };
            let mut results = Vec::with_capacity(items.len());
            for item in &items {
                env.vars.push((var.clone(), item.clone()));
                results.push(eval(pred, env).and_then(|v| as_bool(&v, "a list predicate")));
                env.vars.pop();
            }
            let bools = results.into_iter().collect::<R<Vec<bool>>>()?;
            match quantifier {
                Quantifier::All => Val::Bool(bools.iter().all(|b| *b)),
                Quantifier::Any => Val::Bool(bools.iter().any(|b| *b)),
                Quantifier::Filter => {
                    Val::List(items.into_iter().zip(bools).filter(|(_, keep)| *keep).map(|(v, _)| v).collect())
                }
            }
        }
        Expr::CronSpan { cron, minutes, zone } => {
            let now = match env.roots.get("time").and_then(|t| match t {
                Val::Map(m) => m.get("now").cloned(),
                _ => None,
            }) {
                Some(Val::Time(n)) => n,
                _ => return err("MissingField: time.now"),
            };
            Val::Bool(cron_span_active(cron, *minutes, zone, now)?)
        }
    })
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
                EvalError(format!("TypeError: cannot order a {} and a {}", a.type_name(), b.type_name()))
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

fn cron_matches(c: &Cron, local_minute: i64) -> bool {
    let days = local_minute.div_euclid(1440);
    let in_day = local_minute.rem_euclid(1440) as u32;
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
    day_ok && in_ranges(&c.month, month) && in_ranges(&c.hour, in_day / 60) && in_ranges(&c.minute, in_day % 60)
}

/// True while `now` is within `minutes` after a minute the cron spec matches in `zone`.
fn cron_span_active(c: &Cron, minutes: u32, zone: &str, now_nanos: i128) -> R<bool> {
    let offset = fixed_offset_minutes(zone).ok_or_else(|| {
        EvalError(format!("UnsupportedTimeZone: {zone} (only UTC and Etc/GMT±N zones are resolvable here)"))
    })?;
    let now_minute = now_nanos.div_euclid(60_000_000_000) as i64 + offset;
    Ok((0..i64::from(minutes)).any(|back| cron_matches(c, now_minute - back)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_condition, parse_consensus};
    use serde_json::json;

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
        assert!(e.0.contains("MissingField"), "{e}");
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
        assert!(cond("activity.params.missing == 6", auth).unwrap_err().0.contains("MissingField"));
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
        assert!(cond("eth.tx.data[0..99] == 'x'", ctx.clone()).unwrap_err().0.contains("IndexOutOfBounds"));
        assert!(cond("eth.tx.to < 5", ctx.clone()).unwrap_err().0.contains("TypeError"));
        assert!(cond("eth.tx.to == 5", ctx.clone()).unwrap_err().0.contains("TypeError"));
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
        assert!(eval_bool(&ny, &at(jan15)).unwrap_err().0.contains("UnsupportedTimeZone"));
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
        assert!(cond("wallet.id", ctx).unwrap_err().0.contains("TypeError"));
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
        let expr = crate::parse_condition(&src).unwrap();
        let e = eval_bool(&expr, &roots).unwrap_err();
        assert!(e.0.contains("evaluation too costly"), "{}", e.0);
        // Two levels (121 visits) are well inside it.
        let small = crate::parse_condition(&format!("{ten}.all(a, {ten}.any(b, b == 1))")).unwrap();
        assert!(eval_bool(&small, &roots).unwrap());
    }
}
