//! Ethereum contract calls decoded with an uploaded ABI (alloy-json-abi, alloy-dyn-abi):
//! `eth.tx.function_name`, `function_signature` and `contract_call_args` by argument name.

use alloy_dyn_abi::{DynSolType, DynSolValue, JsonAbiExt, Specifier};
use alloy_json_abi::JsonAbi;
use coffer_policy::eval::Val;

use crate::error::TxError;
use crate::facts::{hex0x, text, uint, Facts};

/// A parsed ABI, kept by the caller across evaluations.
#[derive(Debug, Clone)]
pub struct Abi(JsonAbi);

impl Abi {
    /// Parses an ABI's JSON text (an array of items). A function argument's type may nest at most
    /// [`MAX_TYPE_NESTING`] arrays and tuples.
    pub fn parse(json: &str) -> Result<Self, TxError> {
        let abi: JsonAbi = serde_json::from_str(json).map_err(|e| TxError(format!("not a valid Ethereum ABI: {e}")))?;
        if let Some(f) = abi.functions().find(|f| f.inputs.iter().any(|p| nesting(p) > MAX_TYPE_NESTING)) {
            return Err(TxError(format!(
                "not a valid Ethereum ABI: an argument of {} nests arrays and tuples deeper than {MAX_TYPE_NESTING}",
                f.name
            )));
        }
        Ok(Abi(abi))
    }

    /// The selectors of the ABI's functions.
    pub fn selectors(&self) -> impl Iterator<Item = [u8; 4]> + '_ {
        self.0.functions().map(|f| f.selector().0)
    }

    /// The facts of a call with `data`: nothing when no function of the ABI has its selector
    /// or its arguments do not decode (a policy naming them then gets an evaluation error).
    pub fn call_facts(&self, data: &[u8]) -> Option<Facts> {
        let selector = data.get(..4)?;
        let function = self.0.functions().find(|f| f.selector().as_slice() == selector)?;
        let types = function.inputs.iter().map(|p| p.resolve().ok()).collect::<Option<Vec<_>>>()?;
        within_budget(&types, &data[4..])?;
        let values = function.abi_decode_input(&data[4..]).ok()?;
        let mut args = Facts::new();
        for (i, (param, value)) in function.inputs.iter().zip(values).enumerate() {
            let name = if param.name.is_empty() { i.to_string() } else { param.name.clone() };
            // Two arguments of one name: a policy could not tell them apart, nor a reader.
            if args.insert(name, value_of(&value)).is_some() {
                return None;
            }
        }
        let mut f = Facts::new();
        f.insert("function_name".into(), text(function.name.clone()));
        f.insert("function_signature".into(), text(function.signature()));
        f.insert("contract_call_args".into(), Val::Map(args));
        Some(f)
    }
}

/// Deepest nesting of arrays and tuples in a function argument's type: the decoder, and the
/// type's own drop, recurse that deep.
pub const MAX_TYPE_NESTING: usize = 32;

/// An upper bound of how deep `p`'s type nests: every `[` and `(` of its text, and its components.
fn nesting(p: &alloy_json_abi::Param) -> usize {
    let own = p.ty.bytes().filter(|b| *b == b'[' || *b == b'(').count();
    own.saturating_add(p.components.iter().map(nesting).max().map_or(0, |d| d.saturating_add(1)))
}

/// How many values the decoder lays out for `ty` before it reads a byte (one per array element
/// of a fixed size, one per array and tuple), saturating.
fn template(ty: &DynSolType) -> usize {
    match ty {
        DynSolType::FixedArray(inner, n) => n.saturating_mul(template(inner)).saturating_add(1),
        DynSolType::Array(inner) => template(inner).saturating_add(1),
        DynSolType::Tuple(items) => items.iter().fold(1usize, |sum, t| sum.saturating_add(template(t))),
        _ => 1,
    }
}

/// Whether arguments of `types` encoded in `data` decode to no more than twice what `data` holds
/// (plus a little), walked before anything is decoded. The ABI encoding lets offsets point at the
/// same place, so that 28 KB of nested arrays aliasing one another decode to millions of values;
/// an encoder never does that, and such a call decodes to nothing here (`None`). So do types that
/// take no words (`()`, `T[0]`: counted nowhere, they could be repeated without end) and types
/// whose layout alone exceeds the budget (`uint256[33554432][]`, laid out even when empty).
fn within_budget(types: &[DynSolType], data: &[u8]) -> Option<()> {
    let mut budget = data.len().checked_mul(2)?.checked_add(1024)?;
    if types.iter().map(template).fold(0usize, usize::saturating_add) > budget / 32 {
        return None;
    }
    sequence(types.iter(), types.len(), data, 0, &mut budget)
}

/// One 32-byte word as an offset or a length (`None` past `usize` or the data).
fn word(data: &[u8], at: usize) -> Option<usize> {
    let w = data.get(at..at.checked_add(32)?)?;
    if w[..24].iter().any(|b| *b != 0) {
        return None;
    }
    usize::try_from(u64::from_be_bytes(w[24..].try_into().ok()?)).ok()
}

fn charge(budget: &mut usize, bytes: usize) -> Option<()> {
    *budget = budget.checked_sub(bytes)?;
    Some(())
}

/// `count` values of `types`, their heads from `base` (a dynamic one's head is its offset from
/// `base`), each charged what it decodes to.
fn sequence<'a>(
    types: impl Iterator<Item = &'a DynSolType>,
    count: usize,
    data: &[u8],
    base: usize,
    budget: &mut usize,
) -> Option<()> {
    let mut head = base;
    for ty in types.take(count) {
        if ty.is_dynamic() {
            value(ty, data, base.checked_add(word(data, head)?)?, budget)?;
            head = head.checked_add(32)?;
        } else {
            value(ty, data, head, budget)?;
            head = head.checked_add(ty.minimum_words().checked_mul(32)?)?;
        }
    }
    Some(())
}

/// The value of `ty` encoded at `at`, charged 32 bytes a word, its length for bytes, and 32 for
/// every array and tuple.
fn value(ty: &DynSolType, data: &[u8], at: usize, budget: &mut usize) -> Option<()> {
    if ty.minimum_words() == 0 {
        return None;
    }
    match ty {
        DynSolType::Bytes | DynSolType::String => {
            let len = word(data, at)?;
            charge(budget, len.checked_add(32)?)?;
            data.get(at.checked_add(32)?..at.checked_add(32)?.checked_add(len)?).map(|_| ())
        }
        DynSolType::Array(inner) => {
            let n = word(data, at)?;
            charge(budget, 32)?;
            sequence(std::iter::repeat(inner.as_ref()), n, data, at.checked_add(32)?, budget)
        }
        DynSolType::FixedArray(inner, n) => {
            charge(budget, 32)?;
            sequence(std::iter::repeat(inner.as_ref()), *n, data, at, budget)
        }
        DynSolType::Tuple(items) => {
            charge(budget, 32)?;
            sequence(items.iter(), items.len(), data, at, budget)
        }
        _ => {
            charge(budget, 32)?;
            data.get(at..at.checked_add(32)?).map(|_| ())
        }
    }
}

/// A decoded ABI value as a policy value: integers as numbers, addresses and bytes lowercase
/// `0x` hex, arrays and tuples as lists.
fn value_of(v: &DynSolValue) -> Val {
    match v {
        DynSolValue::Bool(b) => Val::Bool(*b),
        DynSolValue::Uint(u, _) => uint(u),
        DynSolValue::Int(i, _) => match i.to_string().parse::<i128>() {
            Ok(n) => Val::Int(n),
            Err(_) => text(i.to_string()),
        },
        DynSolValue::Address(a) => hex0x(a.as_slice()),
        DynSolValue::Function(f) => hex0x(f.as_slice()),
        DynSolValue::FixedBytes(b, size) => hex0x(&b.as_slice()[..*size]),
        DynSolValue::Bytes(b) => hex0x(b),
        DynSolValue::String(s) => text(s.clone()),
        DynSolValue::Array(items) | DynSolValue::FixedArray(items) | DynSolValue::Tuple(items) => {
            Val::List(items.iter().map(value_of).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ERC20: &str = r#"[{"type":"function","name":"transfer","stateMutability":"nonpayable",
        "inputs":[{"name":"_to","type":"address"},{"name":"_value","type":"uint256"}],
        "outputs":[{"name":"","type":"bool"}]}]"#;

    #[test]
    fn an_erc20_transfer_decodes_by_argument_name() {
        let abi = Abi::parse(ERC20).unwrap();
        let mut data = hex::decode("a9059cbb").unwrap();
        data.extend_from_slice(&[0u8; 12]);
        data.extend_from_slice(&[0xab; 20]);
        let mut amount = [0u8; 32];
        amount[24..].copy_from_slice(&1_000_000u64.to_be_bytes());
        data.extend_from_slice(&amount);
        let f = abi.call_facts(&data).unwrap();
        assert_eq!(f["function_name"], Val::Str("transfer".into()));
        assert_eq!(f["function_signature"], Val::Str("transfer(address,uint256)".into()));
        let Val::Map(args) = &f["contract_call_args"] else { panic!("args are a map") };
        assert_eq!(args["_to"], Val::Str(format!("0x{}", "ab".repeat(20))));
        assert_eq!(args["_value"], Val::Int(1_000_000));
        // Another selector, or arguments cut short: nothing decoded.
        assert!(abi.call_facts(&hex::decode("095ea7b3").unwrap()).is_none());
        assert!(abi.call_facts(&data[..40]).is_none());
        assert!(Abi::parse("{not an abi").is_err());
    }

    fn words(ws: &[usize]) -> Vec<u8> {
        ws.iter()
            .flat_map(|w| {
                let mut b = [0u8; 32];
                b[24..].copy_from_slice(&(*w as u64).to_be_bytes());
                b
            })
            .collect()
    }

    #[test]
    fn nested_arrays_that_alias_one_another_decode_to_nothing() {
        let abi = Abi::parse(
            r#"[{"type":"function","name":"f","stateMutability":"nonpayable",
            "inputs":[{"name":"a","type":"uint256[][][]"}],"outputs":[]}]"#,
        )
        .unwrap();
        let selector = abi.0.functions().next().unwrap().selector();
        // Honestly encoded: [[[7, 8]]] decodes.
        let mut honest = selector.to_vec();
        honest.extend(words(&[32, 1, 32, 1, 32, 2, 7, 8]));
        let f = abi.call_facts(&honest).expect("an honest encoding decodes");
        assert_eq!(
            f["contract_call_args"],
            Val::Map(
                [("a".to_string(), Val::List(vec![Val::List(vec![Val::List(vec![Val::Int(7), Val::Int(8)])])]))].into()
            )
        );
        // 64 offsets per level, all to the same next level: 64^3 values from 6 KB. Refused
        // before decoding; without the walk this is 262,144 values.
        let n = 64;
        let level = |next: usize| {
            let mut w = vec![n];
            w.extend(std::iter::repeat_n(next, n));
            w
        };
        // Offsets are relative to each array's element area (after its length word).
        let level_bytes = (n + 1) * 32;
        let mut w = vec![32];
        w.extend(level(level_bytes - 32)); // level 1 at 32: elements point to level 2
        w.extend(level(level_bytes - 32)); // level 2 at 32 + level_bytes: to level 3
        w.extend(level(0)); // level 3: n uint256 (0 read as values)
        let mut aliased = selector.to_vec();
        aliased.extend(words(&w));
        assert!(abi.call_facts(&aliased).is_none());
        let f = abi.0.functions().next().unwrap();
        let decoded = f.abi_decode_input(&aliased[4..]).expect("alloy alone decodes it");
        let DynSolValue::Array(l1) = &decoded[0] else { panic!() };
        let DynSolValue::Array(l2) = &l1[0] else { panic!() };
        let DynSolValue::Array(l3) = &l2[0] else { panic!() };
        assert_eq!((l1.len(), l2.len(), l3.len()), (n, n, n), "what the walk keeps from being decoded");
    }

    #[test]
    fn types_of_no_words_or_a_huge_layout_decode_to_nothing() {
        let one = |ty: &str| {
            Abi::parse(&format!(
                r#"[{{"type":"function","name":"h","stateMutability":"nonpayable","inputs":[{{"name":"a","type":"{ty}"}}],"outputs":[]}}]"#
            ))
            .unwrap()
        };
        let call = |abi: &Abi, args: &[usize]| {
            let mut data = abi.0.functions().next().unwrap().selector().to_vec();
            data.extend(words(args));
            abi.call_facts(&data)
        };
        // A length of 2^62 zero-sized tuples: refused at once, not walked 2^62 times.
        let empties = Abi::parse(
            r#"[{"type":"function","name":"h","stateMutability":"nonpayable",
            "inputs":[{"name":"a","type":"tuple[]","components":[]}],"outputs":[]}]"#,
        )
        .unwrap();
        assert!(call(&empties, &[32, 1 << 62]).is_none());
        // Laid out as 2^25 values before a byte is read, though the array is empty.
        assert!(call(&one("uint256[33554432][]"), &[32, 0]).is_none());
        // Honest small ones still decode.
        assert!(call(&one("uint256[2][]"), &[32, 1, 5, 6]).is_some());
        // Nesting deeper than the bound is refused when the ABI is read.
        let deep = format!("uint256{}", "[1]".repeat(MAX_TYPE_NESTING + 1));
        let text = format!(
            r#"[{{"type":"function","name":"d","stateMutability":"nonpayable","inputs":[{{"name":"a","type":"{deep}"}}],"outputs":[]}}]"#
        );
        assert!(Abi::parse(&text).unwrap_err().0.contains("deeper than 32"));
    }

    #[test]
    fn arguments_of_one_name_decode_to_nothing() {
        let abi = Abi::parse(
            r#"[{"type":"function","name":"g","stateMutability":"nonpayable",
            "inputs":[{"name":"to","type":"address"},{"name":"to","type":"address"}],"outputs":[]}]"#,
        )
        .unwrap();
        let mut data = abi.0.functions().next().unwrap().selector().to_vec();
        data.extend(words(&[1, 2]));
        assert!(abi.call_facts(&data).is_none());
    }

    #[test]
    fn a_uint256_above_i128_stays_exact() {
        assert_eq!(
            value_of(&DynSolValue::Uint(alloy_primitives::U256::MAX, 256)),
            Val::Uint(alloy_primitives::U256::MAX.to_string())
        );
    }
}
