//! Lexer and recursive-descent parser for the policy language (spec 12.3) into [`Expr`],
//! checking identifiers against the keyword roots as it goes, with positioned errors.
//!
//! Precedence, lowest first: `||`, `&&`, comparisons and `in` (not chainable), unary `!` and
//! `-`, then postfix `.field`, `.fn(..)`, `[i]`, `[a..b]`.

use crate::error::PolicyError;
use crate::expr::{CmpOp, Cron, CronRange, Expr, Quantifier};
use crate::limits::Limits;

/// Deepest nesting accepted (parentheses, lists, calls, unary operators, postfix chains), so that
/// neither the parser nor a tree walker can exhaust the stack.
pub const MAX_DEPTH: usize = 64;

/// 2^256 - 1, the largest `uint` literal.
const U256_MAX: &str = "115792089237316195423570985008687907853269984665640564039457584007913129639935";

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// Decimal digits.
    Int(String),
    Str(String),
    True,
    False,
    In,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Dot,
    DotDot,
    Not,
    AndAnd,
    OrOr,
    EqEq,
    NotEq,
    Lt,
    Le,
    Gt,
    Ge,
    Minus,
    Eof,
}

fn describe(t: &Tok) -> String {
    let sym = match t {
        Tok::Ident(n) => return format!("identifier '{n}'"),
        Tok::Int(n) => return format!("number {n}"),
        Tok::Str(s) => return format!("string '{s}'"),
        Tok::Eof => return "end of expression".into(),
        Tok::True => "true",
        Tok::False => "false",
        Tok::In => "in",
        Tok::LParen => "(",
        Tok::RParen => ")",
        Tok::LBracket => "[",
        Tok::RBracket => "]",
        Tok::Comma => ",",
        Tok::Dot => ".",
        Tok::DotDot => "..",
        Tok::Not => "!",
        Tok::AndAnd => "&&",
        Tok::OrOr => "||",
        Tok::EqEq => "==",
        Tok::NotEq => "!=",
        Tok::Lt => "<",
        Tok::Le => "<=",
        Tok::Gt => ">",
        Tok::Ge => ">=",
        Tok::Minus => "-",
    };
    format!("'{sym}'")
}

#[derive(Debug)]
struct Token {
    tok: Tok,
    /// Byte offset in the source.
    pos: usize,
}

fn error(src: &str, pos: usize, message: impl Into<String>) -> PolicyError {
    let pos = pos.min(src.len());
    let column = src.get(..pos).map(|s| s.chars().count()).unwrap_or(pos) + 1;
    PolicyError { column, message: message.into() }
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn lex(src: &str) -> Result<Vec<Token>, PolicyError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        let next = b.get(i + 1).copied();
        let (tok, len) = match c {
            b'(' => (Tok::LParen, 1),
            b')' => (Tok::RParen, 1),
            b'[' => (Tok::LBracket, 1),
            b']' => (Tok::RBracket, 1),
            b',' => (Tok::Comma, 1),
            b'.' if next == Some(b'.') => (Tok::DotDot, 2),
            b'.' => (Tok::Dot, 1),
            b'&' if next == Some(b'&') => (Tok::AndAnd, 2),
            b'&' => return Err(error(src, start, "unexpected '&' (use '&&')")),
            b'|' if next == Some(b'|') => (Tok::OrOr, 2),
            b'|' => return Err(error(src, start, "unexpected '|' (use '||')")),
            b'=' if next == Some(b'=') => (Tok::EqEq, 2),
            b'=' => return Err(error(src, start, "unexpected '=' (use '==' to compare)")),
            b'!' if next == Some(b'=') => (Tok::NotEq, 2),
            b'!' => (Tok::Not, 1),
            b'<' if next == Some(b'=') => (Tok::Le, 2),
            b'<' => (Tok::Lt, 1),
            b'>' if next == Some(b'=') => (Tok::Ge, 2),
            b'>' => (Tok::Gt, 1),
            b'-' => (Tok::Minus, 1),
            b'\'' => {
                let (s, len) = lex_string(src, start)?;
                (Tok::Str(s), len)
            }
            b'"' => return Err(error(src, start, "strings are written in single quotes ('...'), not double quotes")),
            b'0'..=b'9' => {
                if c == b'0' && matches!(next, Some(b'x' | b'X')) {
                    return Err(error(
                        src,
                        start,
                        "hexadecimal numbers are not supported; write addresses and data as strings ('0x...')",
                    ));
                }
                let mut j = i;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                let digits = src[i..j].to_string();
                if b.get(j) == Some(&b'.') && b.get(j + 1).is_some_and(u8::is_ascii_digit) {
                    return Err(error(src, start, "decimal numbers are not supported (integers only)"));
                }
                // CEL's unsigned suffix is accepted and has no effect.
                if matches!(b.get(j), Some(b'u' | b'U')) && !b.get(j + 1).copied().is_some_and(is_ident_char) {
                    j += 1;
                } else if b.get(j).copied().is_some_and(is_ident_char) {
                    return Err(error(src, start, format!("invalid number '{}'", ident_run(src, i))));
                }
                (Tok::Int(digits), j - i)
            }
            c if is_ident_start(c) => {
                let word = ident_run(src, i);
                let tok = match word {
                    "true" => Tok::True,
                    "false" => Tok::False,
                    "in" => Tok::In,
                    w => Tok::Ident(w.to_string()),
                };
                (tok, word.len())
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(error(src, start, format!("unexpected character '{ch}'")));
            }
        };
        out.push(Token { tok, pos: start });
        i += len;
    }
    out.push(Token { tok: Tok::Eof, pos: src.len() });
    Ok(out)
}

/// The identifier-like run (letters, digits, `_`) starting at byte `i`.
fn ident_run(src: &str, i: usize) -> &str {
    let b = src.as_bytes();
    let mut j = i;
    while j < b.len() && is_ident_char(b[j]) {
        j += 1;
    }
    &src[i..j]
}

/// Lexes a single-quoted string starting at byte `start`; returns its value and byte length.
fn lex_string(src: &str, start: usize) -> Result<(String, usize), PolicyError> {
    let mut out = String::new();
    let mut chars = src[start + 1..].char_indices();
    while let Some((k, c)) = chars.next() {
        match c {
            '\'' => return Ok((out, k + 2)),
            '\\' => {
                let Some((_, e)) = chars.next() else { break };
                out.push(match e {
                    '\\' => '\\',
                    '\'' => '\'',
                    '"' => '"',
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    other => {
                        return Err(error(src, start + 1 + k, format!("unknown escape sequence '\\{other}' in string")))
                    }
                });
            }
            c => out.push(c),
        }
    }
    Err(error(src, start, "unterminated string (missing closing ')"))
}

/// Refuses a clause longer than `limits.max_clause_bytes`.
pub fn check_length(src: &str, limits: &Limits) -> Result<(), PolicyError> {
    if src.len() > limits.max_clause_bytes {
        return Err(PolicyError {
            column: 1,
            message: format!(
                "expression too long: {} bytes, more than the {} a clause may hold",
                src.len(),
                limits.max_clause_bytes
            ),
        });
    }
    Ok(())
}

/// Parses `src` as one boolean expression whose free identifiers are all in `roots`, under the
/// default [`Limits`].
pub fn parse(src: &str, roots: &[&str]) -> Result<Expr, PolicyError> {
    parse_with(src, roots, &Limits::DEFAULT)
}

/// [`parse`] under `limits`: the clause's length, its literal lists' lengths, and its cost as far
/// as its literal lists tell it ([`min_steps`]).
pub fn parse_with(src: &str, roots: &[&str], limits: &Limits) -> Result<Expr, PolicyError> {
    check_length(src, limits)?;
    let toks = lex(src)?;
    let mut p = Parser { src, toks, i: 0, depth: 0, roots, bound: Vec::new(), max_list_len: limits.max_list_len };
    if p.peek() == &Tok::Eof {
        return Err(error(src, 0, "empty expression"));
    }
    let start = p.pos();
    let e = p.expr()?;
    match p.peek() {
        Tok::Eof => {}
        Tok::RParen => return Err(p.err("unbalanced ')': no matching '('")),
        t => {
            let what = describe(t);
            return Err(p.err(format!("unexpected {what} after a complete expression (missing '&&' or '||'?)")));
        }
    }
    p.require_bool(&e, start)?;
    let steps = min_steps(&e);
    let budget = u64::from(limits.eval.max_steps);
    if steps > budget {
        return Err(p.err_at(
            start,
            format!(
                "expression too costly: every evaluation takes at least {steps} steps, more than the budget of {budget} \
                 (a quantifier over a literal list runs its predicate once per item, and nested ones multiply)"
            ),
        ));
    }
    Ok(e)
}

/// The fewest steps an evaluation of `e` that does not fail can take (see [`crate::eval`]):
/// one per node, and a quantifier over a literal list runs its predicate once per item (the
/// evaluator does not short-circuit, and an error anywhere fails the whole clause). Lists from
/// the context count as empty, so this is a lower bound: above the step budget, no evaluation
/// can succeed.
pub fn min_steps(e: &Expr) -> u64 {
    let sum = |items: &[&Expr]| items.iter().fold(1u64, |acc, e| acc.saturating_add(min_steps(e)));
    match e {
        Expr::Bool(_) | Expr::Int(_) | Expr::BigUint(_) | Expr::Str(_) | Expr::Ident(_) | Expr::Timestamp(_) => 1,
        // The node, and at least one iteration of its walk back in time.
        Expr::CronSpan { .. } => 2,
        Expr::List(items) | Expr::And(items) | Expr::Or(items) => {
            items.iter().fold(1u64, |acc, e| acc.saturating_add(min_steps(e)))
        }
        Expr::Member(x, _) | Expr::Not(x) | Expr::Neg(x) | Expr::Count(x) => sum(&[x]),
        Expr::Index(a, b) | Expr::Compare(_, a, b) | Expr::In(a, b) | Expr::Contains(a, b) => sum(&[a, b]),
        Expr::Slice(a, b, c) => sum(&[a, b, c]),
        Expr::Quantified { list, pred, .. } => {
            let per_item = 1u64.saturating_add(min_steps(pred));
            let items = match list.as_ref() {
                Expr::List(items) => items.len() as u64,
                _ => 0,
            };
            sum(&[list]).saturating_add(items.saturating_mul(per_item))
        }
    }
}

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token>,
    i: usize,
    depth: usize,
    roots: &'a [&'a str],
    /// Variables bound by enclosing `all`/`any`/`filter`, innermost last.
    bound: Vec<String>,
    max_list_len: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        &self.toks[self.i].tok
    }

    fn pos(&self) -> usize {
        self.toks[self.i].pos
    }

    fn bump(&mut self) -> Tok {
        let t = self.toks[self.i].tok.clone();
        if t != Tok::Eof {
            self.i += 1;
        }
        t
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == t {
            self.bump();
            true
        } else {
            false
        }
    }

    fn err(&self, message: impl Into<String>) -> PolicyError {
        error(self.src, self.pos(), message)
    }

    fn err_at(&self, pos: usize, message: impl Into<String>) -> PolicyError {
        error(self.src, pos, message)
    }

    fn enter(&mut self) -> Result<(), PolicyError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("expression nests too deeply (more than {MAX_DEPTH} levels)")));
        }
        Ok(())
    }

    fn require_bool(&self, e: &Expr, pos: usize) -> Result<(), PolicyError> {
        if e.never_bool() {
            let what = match e {
                Expr::Int(_) | Expr::BigUint(_) | Expr::Neg(_) | Expr::Count(_) => "a number",
                Expr::Str(_) | Expr::Slice(..) => "a string or slice",
                Expr::Timestamp(_) => "a timestamp",
                _ => "a list",
            };
            return Err(self.err_at(pos, format!("expected a boolean expression, found {what}")));
        }
        Ok(())
    }

    /// expr := or
    fn expr(&mut self) -> Result<Expr, PolicyError> {
        self.enter()?;
        let e = self.or()?;
        self.depth -= 1;
        Ok(e)
    }

    /// or := and ('||' and)*
    fn or(&mut self) -> Result<Expr, PolicyError> {
        let pos = self.pos();
        let first = self.and()?;
        if self.peek() != &Tok::OrOr {
            return Ok(first);
        }
        self.require_bool(&first, pos)?;
        let mut items = vec![first];
        while self.eat(&Tok::OrOr) {
            let pos = self.pos();
            let e = self.and()?;
            self.require_bool(&e, pos)?;
            items.push(e);
        }
        Ok(Expr::Or(items))
    }

    /// and := relation ('&&' relation)*
    fn and(&mut self) -> Result<Expr, PolicyError> {
        let pos = self.pos();
        let first = self.relation()?;
        if self.peek() != &Tok::AndAnd {
            return Ok(first);
        }
        self.require_bool(&first, pos)?;
        let mut items = vec![first];
        while self.eat(&Tok::AndAnd) {
            let pos = self.pos();
            let e = self.relation()?;
            self.require_bool(&e, pos)?;
            items.push(e);
        }
        Ok(Expr::And(items))
    }

    fn relop(&self) -> Option<Option<CmpOp>> {
        Some(match self.peek() {
            Tok::EqEq => Some(CmpOp::Eq),
            Tok::NotEq => Some(CmpOp::Ne),
            Tok::Lt => Some(CmpOp::Lt),
            Tok::Le => Some(CmpOp::Le),
            Tok::Gt => Some(CmpOp::Gt),
            Tok::Ge => Some(CmpOp::Ge),
            Tok::In => None,
            _ => return None,
        })
    }

    /// relation := unary (relop unary)?
    fn relation(&mut self) -> Result<Expr, PolicyError> {
        let left = self.unary()?;
        let Some(op) = self.relop() else { return Ok(left) };
        self.bump();
        let right = self.unary()?;
        if self.relop().is_some() {
            return Err(self.err("comparisons cannot be chained; combine them with '&&'"));
        }
        Ok(match op {
            Some(op) => Expr::Compare(op, Box::new(left), Box::new(right)),
            None => Expr::In(Box::new(left), Box::new(right)),
        })
    }

    /// unary := '!' unary | '-' unary | postfix
    fn unary(&mut self) -> Result<Expr, PolicyError> {
        match self.peek() {
            Tok::Not => {
                self.bump();
                self.enter()?;
                let pos = self.pos();
                let e = self.unary()?;
                self.depth -= 1;
                self.require_bool(&e, pos)?;
                Ok(Expr::Not(Box::new(e)))
            }
            Tok::Minus => {
                let minus = self.pos();
                self.bump();
                self.enter()?;
                let e = self.unary()?;
                self.depth -= 1;
                match e {
                    Expr::Int(n) => Ok(Expr::Int(-n)),
                    Expr::BigUint(_) => Err(self.err_at(minus, "negative number out of range")),
                    Expr::Bool(_) | Expr::Str(_) | Expr::List(_) | Expr::Not(_) | Expr::Timestamp(_) => {
                        Err(self.err_at(minus, "'-' applies to numbers only"))
                    }
                    e => Ok(Expr::Neg(Box::new(e))),
                }
            }
            _ => self.postfix(),
        }
    }

    /// postfix := primary ('.' ident | '.' ident '(' args ')' | '[' expr ']' | '[' expr '..' expr ']')*
    fn postfix(&mut self) -> Result<Expr, PolicyError> {
        let mut e = self.primary()?;
        let mut links = 0;
        loop {
            match self.peek() {
                Tok::Dot => {
                    links += 1;
                    if self.depth + links > MAX_DEPTH {
                        return Err(self.err(format!("expression nests too deeply (more than {MAX_DEPTH} levels)")));
                    }
                    self.bump();
                    let name_pos = self.pos();
                    let Tok::Ident(name) = self.bump() else {
                        return Err(self.err_at(name_pos, "expected a field or function name after '.'"));
                    };
                    if self.eat(&Tok::LParen) {
                        e = self.method(e, &name, name_pos)?;
                    } else {
                        e = Expr::Member(Box::new(e), name);
                    }
                }
                Tok::LBracket => {
                    links += 1;
                    if self.depth + links > MAX_DEPTH {
                        return Err(self.err(format!("expression nests too deeply (more than {MAX_DEPTH} levels)")));
                    }
                    let open = self.pos();
                    self.bump();
                    let index = self.expr()?;
                    if self.eat(&Tok::DotDot) {
                        let end = self.expr()?;
                        self.close(Tok::RBracket, open)?;
                        e = Expr::Slice(Box::new(e), Box::new(index), Box::new(end));
                    } else {
                        self.close(Tok::RBracket, open)?;
                        e = Expr::Index(Box::new(e), Box::new(index));
                    }
                }
                _ => return Ok(e),
            }
        }
    }

    /// Expects the closing bracket of the one opened at `open`.
    fn close(&mut self, t: Tok, open: usize) -> Result<(), PolicyError> {
        if self.eat(&t) {
            return Ok(());
        }
        let (o, c) = if t == Tok::RParen { ("(", ")") } else { ("[", "]") };
        let col = error(self.src, open, "").column;
        let found = describe(self.peek());
        Err(self.err(format!("missing '{c}' to close '{o}' at column {col}, found {found}")))
    }

    /// After `target.name(`: the list functions.
    fn method(&mut self, target: Expr, name: &str, name_pos: usize) -> Result<Expr, PolicyError> {
        let open = self.pos();
        let quantifier = match name {
            "all" => Quantifier::All,
            "any" => Quantifier::Any,
            "filter" => Quantifier::Filter,
            "contains" => {
                self.enter()?;
                let arg = self.expr()?;
                self.depth -= 1;
                if self.peek() == &Tok::Comma {
                    return Err(self.err("contains() takes exactly one argument"));
                }
                self.close(Tok::RParen, open)?;
                return Ok(Expr::Contains(Box::new(target), Box::new(arg)));
            }
            "count" => {
                if self.peek() != &Tok::RParen {
                    return Err(self.err("count() takes no arguments"));
                }
                self.bump();
                return Ok(Expr::Count(Box::new(target)));
            }
            other => {
                return Err(self.err_at(
                    name_pos,
                    format!("unknown function '{other}' (list functions: all, any, filter, contains, count)"),
                ))
            }
        };
        let var_pos = self.pos();
        let Tok::Ident(var) = self.bump() else {
            return Err(self.err_at(var_pos, format!("{name}() expects a variable name as its first argument")));
        };
        if !self.eat(&Tok::Comma) {
            let found = describe(self.peek());
            return Err(self.err(format!("{name}(variable, predicate): expected ',' after '{var}', found {found}")));
        }
        self.enter()?;
        self.bound.push(var.clone());
        let pred_pos = self.pos();
        let pred = self.expr()?;
        self.bound.pop();
        self.depth -= 1;
        if self.peek() == &Tok::Comma {
            return Err(self.err(format!("{name}() takes exactly two arguments")));
        }
        self.close(Tok::RParen, open)?;
        self.require_bool(&pred, pred_pos)?;
        Ok(Expr::Quantified { quantifier, list: Box::new(target), var, pred: Box::new(pred) })
    }

    /// primary := literal | ident | fn '(' args ')' | '(' expr ')' | '[' (expr (',' expr)* ','?)? ']'
    fn primary(&mut self) -> Result<Expr, PolicyError> {
        let pos = self.pos();
        match self.bump() {
            Tok::True => Ok(Expr::Bool(true)),
            Tok::False => Ok(Expr::Bool(false)),
            Tok::Str(s) => Ok(Expr::Str(s)),
            Tok::Int(digits) => self.number(&digits, pos),
            Tok::LParen => {
                let e = self.expr()?;
                self.close(Tok::RParen, pos)?;
                Ok(e)
            }
            Tok::LBracket => {
                self.enter()?;
                let mut items = Vec::new();
                while self.peek() != &Tok::RBracket {
                    if items.len() == self.max_list_len {
                        let max = self.max_list_len;
                        return Err(
                            self.err_at(pos, format!("list too long: a literal list holds at most {max} items"))
                        );
                    }
                    items.push(self.expr()?);
                    if !self.eat(&Tok::Comma) {
                        break;
                    }
                }
                self.depth -= 1;
                if !self.eat(&Tok::RBracket) {
                    let found = describe(self.peek());
                    return Err(self.err(format!("expected ',' or ']' in list, found {found}")));
                }
                Ok(Expr::List(items))
            }
            Tok::Ident(name) => {
                if self.peek() == &Tok::LParen {
                    self.bump();
                    return self.function(&name, pos);
                }
                if self.bound.iter().any(|v| v == &name) || self.roots.contains(&name.as_str()) {
                    return Ok(Expr::Ident(name));
                }
                Err(self
                    .err_at(pos, format!("unknown identifier '{name}' (expected one of: {})", self.roots.join(", "))))
            }
            Tok::Eof => Err(self.err_at(pos, "unexpected end of expression")),
            t => Err(self.err_at(pos, format!("expected an expression, found {}", describe(&t)))),
        }
    }

    fn number(&self, digits: &str, pos: usize) -> Result<Expr, PolicyError> {
        if let Ok(n) = digits.parse::<i128>() {
            return Ok(Expr::Int(n));
        }
        let d = digits.trim_start_matches('0');
        if d.len() > U256_MAX.len() || (d.len() == U256_MAX.len() && d > U256_MAX) {
            return Err(self.err_at(pos, "number out of range (the largest is 2^256 - 1)"));
        }
        Ok(Expr::BigUint(d.to_string()))
    }

    /// Global functions: `Timestamp('<RFC 3339>')`, `CronSpan('<cron>', '<duration>', '<zone>')`.
    fn function(&mut self, name: &str, pos: usize) -> Result<Expr, PolicyError> {
        let open = self.toks[self.i - 1].pos;
        let arity = match name {
            "Timestamp" => 1,
            "CronSpan" => 3,
            other => {
                return Err(self.err_at(pos, format!("unknown function '{other}' (functions: Timestamp, CronSpan)")))
            }
        };
        let mut args = Vec::new();
        while self.peek() != &Tok::RParen {
            let arg_pos = self.pos();
            match self.bump() {
                Tok::Str(s) => args.push((s, arg_pos)),
                _ => return Err(self.err_at(arg_pos, format!("{name}() takes string literal arguments"))),
            }
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.close(Tok::RParen, open)?;
        if args.len() != arity {
            let plural = if arity == 1 { "" } else { "s" };
            return Err(self.err_at(pos, format!("{name}() takes {arity} argument{plural}, found {}", args.len())));
        }
        if name == "Timestamp" {
            let (s, p) = &args[0];
            let nanos = rfc3339_nanos(s).map_err(|m| self.err_at(*p, format!("invalid Timestamp: {m}")))?;
            return Ok(Expr::Timestamp(nanos));
        }
        let cron = parse_cron(&args[0].0).map_err(|m| self.err_at(args[0].1, format!("invalid CronSpan cron: {m}")))?;
        let minutes = parse_duration(&args[1].0)
            .map_err(|m| self.err_at(args[1].1, format!("invalid CronSpan duration: {m}")))?;
        let zone = &args[2].0;
        if !valid_zone(zone) {
            return Err(self.err_at(args[2].1, format!("invalid CronSpan time zone '{zone}' (an IANA name)")));
        }
        Ok(Expr::CronSpan { cron, minutes, zone: zone.clone() })
    }
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z` (zero offset only, spec 12.3) to Unix nanoseconds.
pub fn rfc3339_nanos(s: &str) -> Result<i128, String> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<u32, String> {
        let part = s.get(r).filter(|p| p.bytes().all(|c| c.is_ascii_digit())).ok_or("expected YYYY-MM-DDTHH:MM:SSZ")?;
        part.parse::<u32>().map_err(|_| "expected YYYY-MM-DDTHH:MM:SSZ".to_string())
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') || b[13] != b':' || b[16] != b':' {
        return Err("expected YYYY-MM-DDTHH:MM:SSZ".into());
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut nanos: i128 = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 9 {
            return Err("fractional seconds take 1 to 9 digits".into());
        }
        nanos = frac[..n].parse::<i128>().map_err(|e| e.to_string())? * 10i128.pow(9 - n as u32);
        rest = &frac[n..];
    }
    match rest {
        "Z" | "z" | "+00:00" | "-00:00" => {}
        _ => return Err("only the zero UTC offset ('Z') is accepted".into()),
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(format!("month {month} out of range")),
    };
    if day == 0 || day > days_in_month {
        return Err(format!("day {day} out of range"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err("time of day out of range".into());
    }
    let days = days_from_civil(year as i64, month, day) as i128;
    let secs = days * 86_400 + (hour as i128) * 3600 + (minute as i128) * 60 + second as i128;
    Ok(secs * 1_000_000_000 + nanos)
}

/// Five numeric fields with ranges, lists and `*`; no steps, names, macros or seconds.
pub fn parse_cron(s: &str) -> Result<Cron, String> {
    if s.trim_start().starts_with('@') {
        return Err("macros like @daily are not supported".into());
    }
    let fields: Vec<&str> = s.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!("expected 5 fields (minute hour day-of-month month day-of-week), found {}", fields.len()));
    }
    let minute = cron_field(fields[0], "minute", 0, 59)?;
    let hour = cron_field(fields[1], "hour", 0, 23)?;
    let day_of_month = cron_field(fields[2], "day-of-month", 1, 31)?;
    let month = cron_field(fields[3], "month", 1, 12)?;
    let day_of_week = cron_field(fields[4], "day-of-week", 0, 7)?;
    Ok(Cron {
        minute,
        hour,
        any_day_of_month: fields[2] == "*",
        day_of_month,
        month,
        any_day_of_week: fields[4] == "*",
        day_of_week,
    })
}

fn cron_field(f: &str, name: &str, lo: u32, hi: u32) -> Result<Vec<CronRange>, String> {
    if f == "*" {
        return Ok(vec![(lo, hi)]);
    }
    if f.contains('/') {
        return Err(format!("steps ('/') are not supported ({name} field '{f}')"));
    }
    let n = |p: &str| -> Result<u32, String> {
        if p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit()) {
            return Err(format!("{name} field '{f}' must be numbers, ranges (a-b), lists (a,b) or '*'"));
        }
        let v: u32 = p.parse().map_err(|_| format!("{name} value '{p}' out of range {lo}-{hi}"))?;
        if v < lo || v > hi {
            return Err(format!("{name} value {v} out of range {lo}-{hi}"));
        }
        Ok(v)
    };
    let mut ranges = f
        .split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (n(a)?, n(b)?);
                if a > b {
                    return Err(format!("{name} range {a}-{b} is reversed"));
                }
                Ok((a, b))
            }
            None => n(part).map(|v| (v, v)),
        })
        .collect::<Result<Vec<CronRange>, String>>()?;
    Ok(merge_ranges(&mut ranges))
}

/// `ranges` sorted, with overlapping and adjacent ones merged: the same values, in at most half
/// as many ranges as the field has values (30 for minutes), whatever was written (`59,59,…`
/// 19,000 times is one range), so matching a minute against a field costs a few comparisons.
fn merge_ranges(ranges: &mut [CronRange]) -> Vec<CronRange> {
    ranges.sort_unstable();
    let mut merged: Vec<CronRange> = Vec::with_capacity(ranges.len().min(32));
    for &(a, b) in ranges.iter() {
        match merged.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// Whole days, hours and minutes (`'8h'`, `'1d'`, `'1h30m'`), more than 0 and at most 7 days.
pub fn parse_duration(s: &str) -> Result<u32, String> {
    let bad = || format!("'{s}' is not a duration like '8h', '1d' or '1h30m'");
    let mut total: u64 = 0;
    let mut rest = s.trim();
    let mut last_unit = 0;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let n = rest.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 6 {
            return Err(bad());
        }
        let value: u64 = rest[..n].parse().map_err(|_| bad())?;
        let (rank, minutes) = match rest.as_bytes().get(n) {
            Some(b'd') => (1, 24 * 60),
            Some(b'h') => (2, 60),
            Some(b'm') => (3, 1),
            _ => return Err(bad()),
        };
        if rank <= last_unit {
            return Err(bad());
        }
        last_unit = rank;
        total += value * minutes;
        rest = &rest[n + 1..];
    }
    if total == 0 || total > 7 * 24 * 60 {
        return Err("must be more than 0 and at most 7 days".into());
    }
    Ok(total as u32)
}

/// An IANA zone name's shape (`UTC`, `America/New_York`, `Etc/GMT+5`); the zone database itself
/// is the evaluator's concern.
fn valid_zone(z: &str) -> bool {
    !z.is_empty()
        && z.len() <= 64
        && !z.starts_with('/')
        && !z.ends_with('/')
        && !z.contains("//")
        && z.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'+' | b'/'))
        && z.as_bytes()[0].is_ascii_alphabetic()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        parse_condition, parse_consensus, parse_time, Limits, CONDITION_ROOTS, MAX_CLAUSE_BYTES, MAX_LIST_LEN,
    };

    fn cond(s: &str) -> Expr {
        parse_condition(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn cond_err(s: &str) -> String {
        match parse_condition(s) {
            Ok(e) => panic!("{s:?} parsed: {e:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn id(s: &str) -> Expr {
        Expr::Ident(s.into())
    }

    fn member(e: Expr, f: &str) -> Expr {
        Expr::Member(Box::new(e), f.into())
    }

    fn cmp(op: CmpOp, l: Expr, r: Expr) -> Expr {
        Expr::Compare(op, Box::new(l), Box::new(r))
    }

    #[test]
    fn every_spec_example_parses() {
        for c in [
            "approvers.any(user, user.id == '<USER_ID>')",
            "approvers.filter(user, user.tags.contains('<TAG>')).count() >= 2",
            "credentials.any(credential, credential.type == 'CREDENTIAL_TYPE_WEBAUTHN_AUTHENTICATOR')",
            "credentials.any(credential, credential.public_key == '<PUBKEY>')",
        ] {
            parse_consensus(c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        }
        for c in [
            "eth.tx.to == '<ALLOWED_ADDRESS>'",
            "activity.action == 'SIGN' && wallet.id == '<WALLET_ID>'",
            "activity.action == 'SIGN' && private_key.id == '<PK_ID>'",
            "activity.action == 'EXPORT' && wallet_account.address == '<ADDR>'",
            "activity.resource in ['AUTH', 'OTP'] && activity.action in ['CREATE','VERIFY']",
            "activity.kind == 'SIGN_TRANSACTION'",
            "eth.tx.chain_id == 11155111",
            "eth.tx.to == '<C>' && eth.tx.data[0..10] == '0xa9059cbb'",
            "eth.tx.contract_call_args['wad'] < 1000000000000000000",
            "eth.eip_712.domain.name == 'USD Coin' && eth.eip_712.primary_type == 'Permit' && activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2'",
            "eth.eip_712.message['permitted'].all(p, p['token'] == '0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48')",
            "activity.type == 'ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2' && activity.params.hash_function == 'HASH_FUNCTION_NO_OP' && activity.params.encoding != 'PAYLOAD_ENCODING_EIP712'",
            "solana.tx.transfers.all(transfer, transfer.to == '<ADDR>')",
            "wallets.any(w, w.id == 'x') || !private_key.exported",
        ] {
            cond(c);
        }
        for t in [
            "time.now >= Timestamp('2025-01-01T00:00:00Z') && time.now < Timestamp('2025-02-01T00:00:00Z')",
            "CronSpan('0 9 * * 1-5', '8h', 'America/New_York')",
        ] {
            parse_time(t).unwrap_or_else(|e| panic!("{t:?}: {e}"));
        }
    }

    #[test]
    fn example_trees() {
        assert_eq!(
            cond("eth.tx.chain_id == 11155111"),
            cmp(CmpOp::Eq, member(member(id("eth"), "tx"), "chain_id"), Expr::Int(11155111))
        );
        assert_eq!(
            parse_consensus("approvers.filter(user, user.tags.contains('t')).count() >= 2").unwrap(),
            cmp(
                CmpOp::Ge,
                Expr::Count(Box::new(Expr::Quantified {
                    quantifier: Quantifier::Filter,
                    list: Box::new(id("approvers")),
                    var: "user".into(),
                    pred: Box::new(Expr::Contains(
                        Box::new(member(id("user"), "tags")),
                        Box::new(Expr::Str("t".into()))
                    )),
                })),
                Expr::Int(2)
            )
        );
        let data = member(member(id("eth"), "tx"), "data");
        assert_eq!(
            cond("eth.tx.data[0..10] == '0xa9059cbb'"),
            cmp(
                CmpOp::Eq,
                Expr::Slice(Box::new(data), Box::new(Expr::Int(0)), Box::new(Expr::Int(10))),
                Expr::Str("0xa9059cbb".into())
            )
        );
        assert_eq!(
            cond("activity.resource in ['AUTH', 'OTP',]"),
            Expr::In(
                Box::new(member(id("activity"), "resource")),
                Box::new(Expr::List(vec![Expr::Str("AUTH".into()), Expr::Str("OTP".into())]))
            )
        );
        assert_eq!(
            cond("eth.tx.contract_call_args['wad'] < 1000000000000000000"),
            cmp(
                CmpOp::Lt,
                Expr::Index(
                    Box::new(member(member(id("eth"), "tx"), "contract_call_args")),
                    Box::new(Expr::Str("wad".into()))
                ),
                Expr::Int(1_000_000_000_000_000_000)
            )
        );
    }

    #[test]
    fn precedence() {
        let (a, b, c) = (
            || cmp(CmpOp::Eq, member(id("wallet"), "id"), Expr::Str("a".into())),
            || cmp(CmpOp::Eq, member(id("wallet"), "id"), Expr::Str("b".into())),
            || cmp(CmpOp::Eq, member(id("wallet"), "id"), Expr::Str("c".into())),
        );
        // && binds tighter than ||.
        assert_eq!(
            cond("wallet.id == 'a' || wallet.id == 'b' && wallet.id == 'c'"),
            Expr::Or(vec![a(), Expr::And(vec![b(), c()])])
        );
        assert_eq!(
            cond("wallet.id == 'a' && wallet.id == 'b' || wallet.id == 'c'"),
            Expr::Or(vec![Expr::And(vec![a(), b()]), c()])
        );
        assert_eq!(
            cond("(wallet.id == 'a' || wallet.id == 'b') && wallet.id == 'c'"),
            Expr::And(vec![Expr::Or(vec![a(), b()]), c()])
        );
        // ! binds tighter than ==; n-ary chains stay flat.
        assert_eq!(
            cond("!wallet.exported == true"),
            cmp(CmpOp::Eq, Expr::Not(Box::new(member(id("wallet"), "exported"))), Expr::Bool(true))
        );
        assert_eq!(
            cond("true && false && true"),
            Expr::And(vec![Expr::Bool(true), Expr::Bool(false), Expr::Bool(true)])
        );
        assert_eq!(cond("eth.tx.value > -5"), cmp(CmpOp::Gt, member(member(id("eth"), "tx"), "value"), Expr::Int(-5)));
    }

    #[test]
    fn literals() {
        assert_eq!(
            cond(r"activity.type == 'it\'s \\ ok'"),
            cmp(CmpOp::Eq, member(id("activity"), "type"), Expr::Str("it's \\ ok".into()))
        );
        let big = "115792089237316195423570985008687907853269984665640564039457584007913129639935";
        assert_eq!(
            cond(&format!("eth.tx.value <= {big}")),
            cmp(CmpOp::Le, member(member(id("eth"), "tx"), "value"), Expr::BigUint(big.into()))
        );
        assert!(cond_err(&format!("eth.tx.value <= {big}0")).contains("number out of range"));
        assert!(cond_err(
            "eth.tx.value <= 115792089237316195423570985008687907853269984665640564039457584007913129639936"
        )
        .contains("number out of range"));
        assert_eq!(cond("eth.tx.value > 10u"), cmp(CmpOp::Gt, member(member(id("eth"), "tx"), "value"), Expr::Int(10)));
        assert_eq!(parse_condition("").unwrap(), Expr::Bool(true));
        assert_eq!(parse_consensus("  \n ").unwrap(), Expr::Bool(true));
        assert_eq!(parse_time("").unwrap(), Expr::Bool(true));
    }

    #[test]
    fn errors_carry_messages_and_columns() {
        let cases: &[(&str, &str)] = &[
            ("(activity.type == 'x'", "missing ')' to close '(' at column 1, found end of expression at column 22"),
            ("activity.type == 'x')", "unbalanced ')': no matching '(' at column 21"),
            ("activity.type == 'x' wallet.id", "unexpected identifier 'wallet' after a complete expression (missing '&&' or '||'?) at column 22"),
            ("foo.bar == 1", "unknown identifier 'foo' (expected one of: activity, wallet, wallets, private_key, wallet_account, eth, solana, tron, bitcoin, tempo, time) at column 1"),
            ("approvers.any(u, u.id == 'x')", "unknown identifier 'approvers'"),
            ("activity.type == \"x\"", "strings are written in single quotes ('...'), not double quotes at column 18"),
            ("activity.type = 'x'", "unexpected '=' (use '==' to compare) at column 15"),
            ("activity.type == 'x' & true", "unexpected '&' (use '&&') at column 22"),
            ("activity.type == 'x", "unterminated string (missing closing ') at column 18"),
            ("activity.type ==", "unexpected end of expression at column 17"),
            ("activity.", "expected a field or function name after '.' at column 10"),
            ("wallets.startsWith('x')", "unknown function 'startsWith' (list functions: all, any, filter, contains, count) at column 9"),
            ("Now() == 1", "unknown function 'Now' (functions: Timestamp, CronSpan) at column 1"),
            ("wallets.any(w.id == 'x')", "any(variable, predicate): expected ',' after 'w', found '.' at column 14"),
            ("wallets.all('x', true)", "all() expects a variable name as its first argument"),
            ("wallets.count(1) == 1", "count() takes no arguments"),
            ("1 < eth.tx.value < 5", "comparisons cannot be chained"),
            ("'abc'", "expected a boolean expression, found a string or slice at column 1"),
            ("wallets.count()", "expected a boolean expression, found a number at column 1"),
            ("true && 5", "expected a boolean expression, found a number at column 9"),
            ("activity.type in ['a' 'b']", "expected ',' or ']' in list, found string 'b' at column 23"),
            ("eth.tx.data[0..10 == 'x'", "missing ']' to close '[' at column 12"),
            ("eth.tx.value > 1.5", "decimal numbers are not supported"),
            ("eth.tx.to == 0xabc", "hexadecimal numbers are not supported"),
            ("activity.type == 'x' # y", "unexpected character '#' at column 22"),
            ("wallets.any(w, w.id == 'x') && w.id == 'y'", "unknown identifier 'w'"),
            ("time.now > Timestamp('2025-01-01T00:00:00+02:00')", "invalid Timestamp: only the zero UTC offset ('Z') is accepted at column 22"),
            ("time.now > Timestamp('2025-02-30T00:00:00Z')", "invalid Timestamp: day 30 out of range"),
            ("time.now > Timestamp(1)", "Timestamp() takes string literal arguments"),
            ("CronSpan('*/5 * * * *', '1h', 'UTC')", "steps ('/') are not supported"),
            ("CronSpan('0 9 * * MON', '1h', 'UTC')", "must be numbers"),
            ("CronSpan('0 9 * *', '1h', 'UTC')", "expected 5 fields"),
            ("CronSpan('0 9 * * 1', '8d', 'UTC')", "at most 7 days"),
            ("CronSpan('0 9 * * 1', '8x', 'UTC')", "is not a duration"),
            ("CronSpan('0 9 * * 1', '1h', '')", "invalid CronSpan time zone"),
            ("CronSpan('0 9 * * 1', '1h')", "CronSpan() takes 3 arguments, found 2"),
        ];
        for (src, want) in cases {
            let got = cond_err(src);
            assert!(got.contains(want), "{src:?}: got {got:?}, want {want:?}");
        }
        assert_eq!(super::parse("", CONDITION_ROOTS).unwrap_err().to_string(), "empty expression at column 1");
        assert_eq!(super::parse("   ", CONDITION_ROOTS).unwrap_err().to_string(), "empty expression at column 1");
        // Columns count characters, not bytes.
        assert_eq!(parse_condition("activity.type == 'é' @").unwrap_err().column, 22);
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}true{}", "(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
        assert!(cond_err(&deep).contains("nests too deeply"));
        let ok = format!("{}true{}", "(".repeat(MAX_DEPTH - 1), ")".repeat(MAX_DEPTH - 1));
        assert_eq!(cond(&ok), Expr::Bool(true));
        assert!(cond_err(&format!("{}true", "!".repeat(60_000))).contains("nests too deeply"));
        assert!(cond_err(&format!("activity{} == 1", ".a".repeat(30_000))).contains("nests too deeply"));
        // Long flat chains are fine: they do not nest.
        let flat = vec!["wallet.id == 'x'"; 3_000].join(" || ");
        assert!(matches!(cond(&flat), Expr::Or(v) if v.len() == 3_000));
        let list = format!("wallet.id in [{}]", vec!["'a'"; MAX_LIST_LEN].join(","));
        cond(&list);
    }

    #[test]
    fn clause_length_list_length_and_static_cost_are_capped() {
        // Issue 23: ten policies of 0.96 MB (`[0, … ×480000].count() > 0`) took 800 MiB.
        let huge = format!("[{}].count() > 0", vec!["0"; 480_000].join(","));
        assert!(huge.len() > 900_000);
        let e = parse_condition(&huge).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("expression too long: {} bytes, more than the 65536 a clause may hold at column 1", huge.len())
        );
        for parse in [parse_condition, parse_consensus, parse_time] {
            assert!(parse(&huge).unwrap_err().message.contains("expression too long"));
            // Blank text is measured too.
            assert!(parse(&" ".repeat(MAX_CLAUSE_BYTES + 1)).unwrap_err().message.contains("expression too long"));
        }
        assert!(parse_condition(&format!("{}true", " ".repeat(MAX_CLAUSE_BYTES - 4))).is_ok());
        // A literal list of more than MAX_LIST_LEN items, within the byte cap.
        let long = format!("wallet.id in [{}]", vec!["1"; MAX_LIST_LEN + 1].join(","));
        assert!(long.len() < MAX_CLAUSE_BYTES);
        assert_eq!(cond_err(&long), "list too long: a literal list holds at most 4096 items at column 14");
        // Within both caps, but every evaluation would exceed the step budget.
        let list = format!("[{}]", vec!["0"; 4_000].join(","));
        let e = cond_err(&format!("{list}.any(x, x == 0)"));
        assert!(
            e.starts_with(
                "expression too costly: every evaluation takes at least 20002 steps, more than the budget of 20000"
            ),
            "{e}"
        );
        let ten = format!("[{}]", ["0"; 10].join(","));
        let nested = format!("{ten}.all(a, {ten}.all(b, {ten}.all(c, {ten}.any(d, d == 0))))");
        assert!(cond_err(&nested).contains("too costly"));
        // Three levels are fine (3,000-odd steps), and so are context lists, whose length is
        // unknown here.
        cond(&format!("{ten}.all(a, {ten}.all(b, {ten}.any(d, d == 0)))"));
        cond(&format!("{list}.count() > 0 && wallets.any(w, w.id == 'x')"));
        cond("wallets.all(a, wallets.all(b, wallets.all(c, a.id == b.id)))");
        // Custom limits.
        let tight = Limits { max_clause_bytes: 10, ..Limits::DEFAULT };
        assert!(super::parse_with("wallet.id == 'abc'", CONDITION_ROOTS, &tight)
            .unwrap_err()
            .message
            .contains("too long"));
    }

    #[test]
    fn time_literals() {
        assert_eq!(rfc3339_nanos("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(rfc3339_nanos("2025-01-01T00:00:00Z").unwrap(), 1_735_689_600 * 1_000_000_000);
        assert_eq!(rfc3339_nanos("2024-02-29T12:30:15.5Z").unwrap(), 1_709_209_815_500_000_000);
        assert!(rfc3339_nanos("2023-02-29T00:00:00Z").is_err());
        assert!(rfc3339_nanos("2025-01-01 00:00:00Z").is_err());
        let cron = parse_cron("0 9 * * 1-5").unwrap();
        assert_eq!(cron.minute, vec![(0, 0)]);
        assert_eq!(cron.day_of_week, vec![(1, 5)]);
        assert!(cron.any_day_of_month && !cron.any_day_of_week);
        assert_eq!(parse_cron("0,30 8-17 1,15 1-12 0,7").unwrap().minute, vec![(0, 0), (30, 30)]);
        assert!(parse_cron("60 * * * *").unwrap_err().contains("out of range"));
        assert!(parse_cron("@daily").is_err());
        assert_eq!(parse_duration("8h").unwrap(), 480);
        assert_eq!(parse_duration("1d2h30m").unwrap(), 1590);
        assert_eq!(parse_duration("7d").unwrap(), 7 * 1440);
        assert!(parse_duration("0m").is_err());
        assert!(parse_duration("30m1h").is_err());
        assert!(parse_duration("1.5h").is_err());
    }
}
