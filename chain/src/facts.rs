//! Transactions described to policies: the facts map and the value constructors it is built from.

use std::collections::BTreeMap;

use coffer_policy::eval::Val;

/// A map of facts, as the policy engine reads them.
pub type Facts = BTreeMap<String, Val>;

/// An unsigned integer (any width, in decimal) as a policy value: `Int` when it fits in an
/// i128, else `Uint`, so `eth.tx.value < 1000000000000000000` compares numbers.
pub(crate) fn uint(decimal: impl std::fmt::Display) -> Val {
    let decimal = decimal.to_string();
    match decimal.parse::<i128>() {
        Ok(i) => Val::Int(i),
        Err(_) => Val::Uint(decimal),
    }
}

pub(crate) fn text(s: impl Into<String>) -> Val {
    Val::Str(s.into())
}

pub(crate) fn hex0x(bytes: &[u8]) -> Val {
    Val::Str(format!("0x{}", hex::encode(bytes)))
}
