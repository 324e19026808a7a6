//! Ethereum contract calls decoded with an uploaded ABI (alloy-json-abi, alloy-dyn-abi):
//! `eth.tx.function_name`, `function_signature` and `contract_call_args` by argument name.

use alloy_dyn_abi::{DynSolValue, JsonAbiExt};
use alloy_json_abi::JsonAbi;
use coffer_policy::eval::Val;

use crate::error::TxError;
use crate::facts::{hex0x, text, uint, Facts};

/// A parsed ABI, kept by the caller across evaluations.
#[derive(Debug, Clone)]
pub struct Abi(JsonAbi);

impl Abi {
    /// Parses an ABI's JSON text (an array of items).
    pub fn parse(json: &str) -> Result<Self, TxError> {
        serde_json::from_str(json).map(Abi).map_err(|e| TxError(format!("not a valid Ethereum ABI: {e}")))
    }

    /// The facts of a call with `data`: nothing when no function of the ABI has its selector
    /// or its arguments do not decode (a policy naming them then gets an evaluation error).
    pub fn call_facts(&self, data: &[u8]) -> Option<Facts> {
        let selector = data.get(..4)?;
        let function = self.0.functions().find(|f| f.selector().as_slice() == selector)?;
        let values = function.abi_decode_input(&data[4..]).ok()?;
        let mut args = Facts::new();
        for (i, (param, value)) in function.inputs.iter().zip(values).enumerate() {
            let name = if param.name.is_empty() { i.to_string() } else { param.name.clone() };
            args.insert(name, value_of(&value));
        }
        let mut f = Facts::new();
        f.insert("function_name".into(), text(function.name.clone()));
        f.insert("function_signature".into(), text(function.signature()));
        f.insert("contract_call_args".into(), Val::Map(args));
        Some(f)
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

    #[test]
    fn a_uint256_above_i128_stays_exact() {
        assert_eq!(
            value_of(&DynSolValue::Uint(alloy_primitives::U256::MAX, 256)),
            Val::Uint(alloy_primitives::U256::MAX.to_string())
        );
    }
}
