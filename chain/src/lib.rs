//! Transaction formats Coffer signs: parse an unsigned transaction (or an EIP-712 / EIP-7702
//! payload) strictly and within documented bounds, say what the key signs, assemble the signed
//! encoding, and describe it to policies. No keys here: the enclave parses the stamped body with
//! this crate and signs, the gateway parses it for clear errors and for the policy context
//! (`eth.tx`, `solana.tx`, `tron.tx`, `eth.eip_712`, `eth.eip_7702_authorization`).

pub mod abi;
pub mod eip712;
pub mod eip7702;
mod error;
pub mod ethereum;
mod facts;
pub mod idl;
pub mod solana;
pub mod tron;

pub use error::TxError;
pub use facts::Facts;

pub const TRANSACTION_TYPE_ETHEREUM: &str = "TRANSACTION_TYPE_ETHEREUM";
pub const TRANSACTION_TYPE_SOLANA: &str = "TRANSACTION_TYPE_SOLANA";
pub const TRANSACTION_TYPE_TRON: &str = "TRANSACTION_TYPE_TRON";
pub const TRANSACTION_TYPE_BITCOIN: &str = "TRANSACTION_TYPE_BITCOIN";
pub const TRANSACTION_TYPE_TEMPO: &str = "TRANSACTION_TYPE_TEMPO";

/// An unsigned transaction that parsed completely.
#[derive(Debug, Clone)]
pub enum Unsigned {
    Ethereum(ethereum::EthereumTx),
    Solana(solana::SolanaTx),
    Tron(tron::TronTx),
}

/// Parses `unsignedTransaction` (hex, `0x` optional) of the given `TRANSACTION_TYPE_*`.
pub fn parse(transaction_type: &str, unsigned_hex: &str) -> Result<Unsigned, TxError> {
    let known = match transaction_type {
        TRANSACTION_TYPE_ETHEREUM | TRANSACTION_TYPE_SOLANA | TRANSACTION_TYPE_TRON => true,
        TRANSACTION_TYPE_BITCOIN | TRANSACTION_TYPE_TEMPO => {
            return Err(TxError(format!("type: {transaction_type} is not supported yet")))
        }
        _ => false,
    };
    if !known {
        return Err(TxError(format!("type: unknown transaction type {transaction_type:?}")));
    }
    let hex_text = unsigned_hex.trim();
    let hex_text = hex_text.strip_prefix("0x").or_else(|| hex_text.strip_prefix("0X")).unwrap_or(hex_text);
    if hex_text.is_empty() {
        return Err(TxError::new("unsignedTransaction is required"));
    }
    // Bounded before the hex is decoded: two hex digits a byte.
    let too_large = match transaction_type {
        TRANSACTION_TYPE_ETHEREUM => {
            Some((ethereum::MAX_TRANSACTION_BYTES, ethereum::too_large as fn(usize) -> TxError))
        }
        TRANSACTION_TYPE_SOLANA => Some((solana::MAX_TRANSACTION_BYTES, solana::too_large as fn(usize) -> TxError)),
        TRANSACTION_TYPE_TRON => Some((tron::MAX_TRANSACTION_BYTES, tron::too_large as fn(usize) -> TxError)),
        _ => None,
    };
    if let Some((max, refuse)) = too_large {
        if hex_text.len() > 2 * max {
            return Err(refuse(hex_text.len().div_ceil(2)));
        }
    }
    let bytes = hex::decode(hex_text).map_err(|_| TxError::new("unsignedTransaction: not valid hexadecimal"))?;
    Ok(match transaction_type {
        TRANSACTION_TYPE_ETHEREUM => Unsigned::Ethereum(ethereum::parse(&bytes)?),
        TRANSACTION_TYPE_SOLANA => Unsigned::Solana(solana::parse(&bytes)?),
        _ => Unsigned::Tron(tron::parse(&bytes)?),
    })
}

impl Unsigned {
    /// The policy root this transaction appears under (`eth`, `solana`, `tron`) and its `tx`
    /// facts, without what needs a smart contract interface (the caller adds those).
    pub fn policy_root(&self) -> &'static str {
        match self {
            Unsigned::Ethereum(_) => "eth",
            Unsigned::Solana(_) => "solana",
            Unsigned::Tron(_) => "tron",
        }
    }
}

/// A raw payload of `encoding` that the signer would refuse to parse (EIP-712 typed data, an
/// EIP-7702 authorization: over their bounds, or malformed), by the parser it signs with; other
/// encodings are the signer's to check.
pub fn check_payload(encoding: &str, payload: &str) -> Result<(), TxError> {
    let named = |what: &str, e: TxError| TxError(format!("invalid payload: invalid {what}: {e}"));
    match encoding {
        eip712::PAYLOAD_ENCODING => eip712::parse(payload).map(drop).map_err(|e| named("EIP-712 typed data", e)),
        eip7702::PAYLOAD_ENCODING => {
            eip7702::Authorization::parse(payload).map(drop).map_err(|e| named("EIP-7702 authorization", e))
        }
        _ => Ok(()),
    }
}

/// What policies see of the Ethereum payload a `sign_raw_payload` intent (`payload`,
/// `encoding`) signs: `eth.eip_712` or `eth.eip_7702_authorization`, typed, from the parser the
/// signer encodes it with. `None` when it carries none or it does not parse (signing refuses it).
pub fn payload_facts(params: &serde_json::Value) -> Option<coffer_policy::context::PayloadFacts> {
    let text = |k: &str| params.get(k).and_then(serde_json::Value::as_str);
    let payload = text("payload")?;
    match text("encoding")? {
        eip712::PAYLOAD_ENCODING => {
            Some(coffer_policy::context::PayloadFacts { name: "eip_712", facts: eip712::parse(payload).ok()?.facts })
        }
        eip7702::PAYLOAD_ENCODING => Some(coffer_policy::context::PayloadFacts {
            name: "eip_7702_authorization",
            facts: eip7702::Authorization::parse(payload).ok()?.facts(),
        }),
        _ => None,
    }
}

/// A deterministic xorshift generator for the property tests.
#[cfg(test)]
pub(crate) fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// Evaluates a policy `condition` over `facts` as `<root>.tx`, as the gateway's context has it:
/// `Err` is an evaluation error (a missing field, the step budget), which a DENY treats as a
/// denial and an ALLOW as allowing nothing.
#[cfg(test)]
pub(crate) fn policy_over(root: &str, facts: &Facts, condition: &str) -> Result<bool, String> {
    use coffer_policy::eval::Val;
    let tx = Facts::from([("tx".to_string(), Val::Map(facts.clone()))]);
    let roots = Facts::from([(root.to_string(), Val::Map(tx))]);
    let expr = coffer_policy::parse_condition(condition).map_err(|e| format!("does not parse: {e}"))?;
    coffer_policy::eval::eval_bool(&expr, &roots).map_err(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_hex_are_checked_before_anything_is_parsed() {
        assert_eq!(
            parse(TRANSACTION_TYPE_BITCOIN, "00").unwrap_err().0,
            "type: TRANSACTION_TYPE_BITCOIN is not supported yet"
        );
        assert_eq!(
            parse(TRANSACTION_TYPE_TEMPO, "76").unwrap_err().0,
            "type: TRANSACTION_TYPE_TEMPO is not supported yet"
        );
        assert!(parse("TRANSACTION_TYPE_DOGE", "00").unwrap_err().0.starts_with("type: unknown"));
        assert_eq!(parse(TRANSACTION_TYPE_ETHEREUM, "").unwrap_err().0, "unsignedTransaction is required");
        assert_eq!(parse(TRANSACTION_TYPE_ETHEREUM, "0x").unwrap_err().0, "unsignedTransaction is required");
        assert_eq!(
            parse(TRANSACTION_TYPE_ETHEREUM, "0xzz").unwrap_err().0,
            "unsignedTransaction: not valid hexadecimal"
        );
        assert_eq!(parse(TRANSACTION_TYPE_SOLANA, "abc").unwrap_err().0, "unsignedTransaction: not valid hexadecimal");
    }
}
