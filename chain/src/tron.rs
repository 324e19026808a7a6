//! Tron transactions: a `Transaction` protobuf or its `raw_data` alone (what TronWeb's
//! `raw_data_hex` holds). The key signs SHA-256 of the exact `raw_data` bytes; the signed result
//! is the `Transaction` with the 65-byte signature (r ‖ s ‖ v, v = 27 + recovery id, as TronWeb
//! writes it) appended to its `signature` list. Decoding is prost's, over the few messages of
//! Tron's `Tron.proto` that signing and policies read.

use coffer_policy::eval::Val;
use prost::Message;
use sha2::{Digest, Sha256};

use crate::error::TxError;
use crate::facts::{text, uint, Facts};

#[derive(Clone, PartialEq, Message)]
struct Transaction {
    #[prost(bytes = "vec", tag = "1")]
    raw_data: Vec<u8>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    signature: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct Raw {
    #[prost(bytes = "vec", tag = "1")]
    ref_block_bytes: Vec<u8>,
    #[prost(int64, tag = "8")]
    expiration: i64,
    #[prost(message, repeated, tag = "11")]
    contract: Vec<Contract>,
    #[prost(int64, tag = "14")]
    timestamp: i64,
    #[prost(int64, tag = "18")]
    fee_limit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Contract {
    #[prost(int32, tag = "1")]
    r#type: i32,
    #[prost(message, optional, tag = "2")]
    parameter: Option<Any>,
}

#[derive(Clone, PartialEq, Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct TransferContract {
    #[prost(bytes = "vec", tag = "1")]
    owner_address: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    to_address: Vec<u8>,
    #[prost(int64, tag = "3")]
    amount: i64,
}

#[derive(Clone, PartialEq, Message)]
struct TriggerSmartContract {
    #[prost(bytes = "vec", tag = "1")]
    owner_address: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    contract_address: Vec<u8>,
    #[prost(int64, tag = "3")]
    call_value: i64,
    #[prost(bytes = "vec", tag = "4")]
    data: Vec<u8>,
}

const TRANSFER_CONTRACT: i32 = 1;
const TRIGGER_SMART_CONTRACT: i32 = 31;

/// `Transaction.Contract.ContractType` names of the common contracts.
fn contract_name(t: i32) -> String {
    match t {
        0 => "AccountCreateContract".into(),
        1 => "TransferContract".into(),
        2 => "TransferAssetContract".into(),
        4 => "VoteWitnessContract".into(),
        30 => "CreateSmartContract".into(),
        31 => "TriggerSmartContract".into(),
        54 => "FreezeBalanceV2Contract".into(),
        55 => "UnfreezeBalanceV2Contract".into(),
        57 => "DelegateResourceContract".into(),
        58 => "UnDelegateResourceContract".into(),
        other => other.to_string(),
    }
}

/// A parsed Tron transaction: the exact `raw_data` bytes and the encoding to extend.
#[derive(Debug, Clone)]
pub struct TronTx {
    raw_data: Vec<u8>,
    /// The input re-framed as a `Transaction` (the input itself when it was one).
    transaction: Vec<u8>,
    contract_type: i32,
    parameter: Vec<u8>,
}

/// The most bytes a Tron transaction (a `Transaction` or a bare `raw_data`, as given) may have:
/// java-tron's `Constant.TRANSACTION_MAX_BYTE_SIZE` (500 KiB), over which a node refuses a
/// transaction as "too big" (`Manager.validateCommon`, `BigTransactionValidator`). Refused
/// before anything is decoded: protobuf repeats a field as often as the bytes allow (an empty
/// `contract` is 2 bytes of input, about 64 in memory), and before this only the 1 MiB body
/// limit bounded it.
pub const MAX_TRANSACTION_BYTES: usize = 500 * 1024;

fn invalid(reason: impl std::fmt::Display) -> TxError {
    TxError(format!("unsignedTransaction: {reason}"))
}

/// A transaction over [`MAX_TRANSACTION_BYTES`], naming the limit.
pub(crate) fn too_large(bytes: usize) -> TxError {
    invalid(format_args!(
        "a Tron transaction is at most {MAX_TRANSACTION_BYTES} bytes (java-tron's TRANSACTION_MAX_BYTE_SIZE, 500 KiB), this one is {bytes}"
    ))
}

/// How often length-delimited field `number` occurs at the top level of a protobuf message,
/// read from the keys and lengths alone (nothing is decoded or allocated). `None` when the bytes
/// are not a run of fields this walk reads (a group, a truncated field, `number` with another
/// wire type): prost then says what is wrong.
fn occurrences(mut bytes: &[u8], number: u64) -> Option<usize> {
    use prost::encoding::decode_varint;
    let mut n = 0usize;
    while !bytes.is_empty() {
        let key = decode_varint(&mut bytes).ok()?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => drop(decode_varint(&mut bytes).ok()?),
            1 => bytes = bytes.get(8..)?,
            2 => {
                let len = usize::try_from(decode_varint(&mut bytes).ok()?).ok()?;
                bytes = bytes.get(len..)?;
            }
            5 => bytes = bytes.get(4..)?,
            _ => return None,
        }
        if field == number {
            if wire != 2 {
                return None;
            }
            n += 1;
        }
    }
    Some(n)
}

/// A `raw_data` that decodes and carries exactly one contract (Tron executes one per
/// transaction). More than one is refused on the field count, before prost decodes any.
fn raw(bytes: &[u8]) -> Result<Raw, TxError> {
    let many = |n: usize| invalid(format_args!("raw_data has {n} contracts; Tron executes exactly one"));
    if let Some(n) = occurrences(bytes, 11).filter(|n| *n > 1) {
        return Err(many(n));
    }
    let raw = Raw::decode(bytes).map_err(|e| invalid(format_args!("raw_data is not a Tron protobuf: {e}")))?;
    match raw.contract.len() {
        1 => Ok(raw),
        0 => Err(invalid("raw_data has no contract")),
        n => Err(many(n)),
    }
}

/// Parses a `Transaction` or a bare `raw_data`, at most [`MAX_TRANSACTION_BYTES`]. A
/// `Transaction` is recognized by a `raw_data` field that is itself a raw with a contract;
/// anything else is read as `raw_data`.
pub fn parse(bytes: &[u8]) -> Result<TronTx, TxError> {
    if bytes.len() > MAX_TRANSACTION_BYTES {
        return Err(too_large(bytes.len()));
    }
    let as_transaction = Transaction::decode(bytes).ok().filter(|t| !t.raw_data.is_empty());
    let (raw_bytes, decoded, transaction) = match as_transaction.and_then(|t| raw(&t.raw_data).ok().map(|r| (t, r))) {
        Some((t, r)) => {
            if t.signature.iter().any(|s| s.len() != 65) {
                return Err(invalid("signature: every existing signature must be 65 bytes"));
            }
            (t.raw_data, r, bytes.to_vec())
        }
        None => {
            let r = raw(bytes)?;
            let framed = Transaction { raw_data: bytes.to_vec(), signature: vec![] }.encode_to_vec();
            (bytes.to_vec(), r, framed)
        }
    };
    let contract = &decoded.contract[0];
    let parameter = contract.parameter.as_ref().map(|p| p.value.clone()).unwrap_or_default();
    let tx = TronTx { raw_data: raw_bytes, transaction, contract_type: contract.r#type, parameter };
    amounts(&decoded, tx.contract_type, &tx.parameter)?;
    Ok(tx)
}

/// Refuses amounts Tron does not accept, before anything is signed: protobuf `int64` carries
/// negative values, which the policies would read as such (`tron.tx.amount < 1000000` holds for
/// `-5`). A transfer moves a positive amount of sun (Tron's `TransferActuator` refuses 0 too); a
/// contract call's `call_value` and the transaction's `fee_limit` are never negative. The
/// parameters the policy facts read must decode: a transfer or a contract call whose parameter
/// does not is refused rather than signed without facts.
fn amounts(raw: &Raw, contract_type: i32, parameter: &[u8]) -> Result<(), TxError> {
    if raw.fee_limit < 0 {
        return Err(invalid(format_args!("fee_limit must not be negative (it is {})", raw.fee_limit)));
    }
    match contract_type {
        TRANSFER_CONTRACT => {
            let t = TransferContract::decode(parameter)
                .map_err(|e| invalid(format_args!("TransferContract parameter: {e}")))?;
            if t.amount <= 0 {
                return Err(invalid(format_args!(
                    "TransferContract amount must be a positive number of sun (it is {})",
                    t.amount
                )));
            }
        }
        TRIGGER_SMART_CONTRACT => {
            let t = TriggerSmartContract::decode(parameter)
                .map_err(|e| invalid(format_args!("TriggerSmartContract parameter: {e}")))?;
            if t.call_value < 0 {
                return Err(invalid(format_args!(
                    "TriggerSmartContract call_value must not be negative (it is {})",
                    t.call_value
                )));
            }
        }
        _ => {}
    }
    Ok(())
}

/// A Tron address (0x41 ‖ 20 bytes) in base58check, as wallets show it.
fn address(bytes: &[u8]) -> String {
    bs58::encode(bytes).with_check().into_string()
}

impl TronTx {
    /// SHA-256 of `raw_data`: what the secp256k1 key signs.
    pub fn signing_hash(&self) -> [u8; 32] {
        Sha256::digest(&self.raw_data).into()
    }

    /// The `Transaction` with the signature appended (field 2, 65 bytes, v = 27 + recovery id).
    pub fn signed(&self, r: &[u8; 32], s: &[u8; 32], recovery_id: u8) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.transaction.len() + 67);
        out.extend_from_slice(&self.transaction);
        out.extend_from_slice(&[0x12, 65]);
        out.extend_from_slice(r);
        out.extend_from_slice(s);
        out.push(27 + recovery_id);
        out
    }

    /// `tron.tx` (spec 12.4): the contract type, and for transfers and contract calls the
    /// addresses (base58check) and amounts.
    pub fn facts(&self) -> Facts {
        let mut f = Facts::new();
        f.insert("contract".into(), text(contract_name(self.contract_type)));
        match self.contract_type {
            TRANSFER_CONTRACT => {
                if let Ok(t) = TransferContract::decode(self.parameter.as_slice()) {
                    f.insert("owner_address".into(), text(address(&t.owner_address)));
                    f.insert("to_address".into(), text(address(&t.to_address)));
                    f.insert("amount".into(), uint(t.amount));
                }
            }
            TRIGGER_SMART_CONTRACT => {
                if let Ok(t) = TriggerSmartContract::decode(self.parameter.as_slice()) {
                    f.insert("owner_address".into(), text(address(&t.owner_address)));
                    f.insert("contract_address".into(), text(address(&t.contract_address)));
                    f.insert("call_value".into(), uint(t.call_value));
                    f.insert("data".into(), Val::Str(hex::encode(&t.data)));
                }
            }
            _ => {}
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer_raw(amount: i64) -> Vec<u8> {
        let mut owner = vec![0x41];
        owner.extend_from_slice(&[0x11; 20]);
        let mut to = vec![0x41];
        to.extend_from_slice(&[0x22; 20]);
        let param = TransferContract { owner_address: owner, to_address: to, amount }.encode_to_vec();
        Raw {
            ref_block_bytes: vec![0xab, 0xcd],
            expiration: 1_700_000_060_000,
            contract: vec![Contract {
                r#type: TRANSFER_CONTRACT,
                parameter: Some(Any { type_url: "type.googleapis.com/protocol.TransferContract".into(), value: param }),
            }],
            timestamp: 1_700_000_000_000,
            fee_limit: 0,
        }
        .encode_to_vec()
    }

    #[test]
    fn raw_data_and_transaction_forms_sign_the_same_bytes() {
        let raw_bytes = transfer_raw(1_000_000);
        let from_raw = parse(&raw_bytes).unwrap();
        let framed = Transaction { raw_data: raw_bytes.clone(), signature: vec![] }.encode_to_vec();
        let from_tx = parse(&framed).unwrap();
        assert_eq!(from_raw.signing_hash(), <[u8; 32]>::from(Sha256::digest(&raw_bytes)));
        assert_eq!(from_tx.signing_hash(), from_raw.signing_hash());
        let signed = from_raw.signed(&[1; 32], &[2; 32], 1);
        assert_eq!(signed, from_tx.signed(&[1; 32], &[2; 32], 1));
        let back = Transaction::decode(signed.as_slice()).unwrap();
        assert_eq!(back.raw_data, raw_bytes);
        assert_eq!(back.signature.len(), 1);
        assert_eq!(back.signature[0][64], 28);
        assert_eq!(&back.signature[0][..32], &[1; 32]);
        let f = from_raw.facts();
        assert_eq!(f["contract"], Val::Str("TransferContract".into()));
        assert_eq!(f["amount"], Val::Int(1_000_000));
        let owner = match &f["owner_address"] {
            Val::Str(s) => s.clone(),
            _ => unreachable!(),
        };
        assert!(owner.starts_with('T'), "{owner}");
    }

    #[test]
    fn malformed_tron_input_is_refused() {
        assert!(parse(&[0xff, 0xff, 0xff]).unwrap_err().0.starts_with("unsignedTransaction: raw_data"));
        let no_contract = Raw { ref_block_bytes: vec![1, 2], ..Default::default() }.encode_to_vec();
        assert_eq!(parse(&no_contract).unwrap_err().0, "unsignedTransaction: raw_data has no contract");
        let mut bad_param = transfer_raw(5);
        // Rewrite the parameter's value into a truncated message: the length prefix lies.
        let bad = Raw {
            contract: vec![Contract {
                r#type: TRANSFER_CONTRACT,
                parameter: Some(Any { type_url: String::new(), value: vec![0x0a, 0x20, 0x41] }),
            }],
            ..Default::default()
        }
        .encode_to_vec();
        assert!(parse(&bad).unwrap_err().0.contains("TransferContract parameter"));
        bad_param.push(0xff);
        assert!(parse(&bad_param).is_err(), "a trailing byte is not a valid protobuf field");
    }

    /// `raw` with a `data` memo (field 10, which the parser skips) making it exactly `total` bytes.
    fn padded(raw: &[u8], total: usize) -> Vec<u8> {
        let memo = |len: usize| {
            let mut field = vec![0x52];
            prost::encoding::encode_varint(len as u64, &mut field);
            field.extend(std::iter::repeat_n(0x6d, len));
            field
        };
        let len = (0..total).rev().find(|len| raw.len() + memo(*len).len() == total).expect("a memo length fits");
        [raw, &memo(len)[..]].concat()
    }

    #[test]
    fn a_transaction_over_javatrons_size_limit_is_refused_before_it_is_decoded() {
        // Issue 39 follow-up: no bound but the 1 MiB body; 500 KiB is what a Tron node accepts.
        let at = padded(&transfer_raw(1_000), MAX_TRANSACTION_BYTES);
        assert_eq!(at.len(), 512_000);
        assert_eq!(parse(&at).unwrap().facts()["amount"], Val::Int(1_000));
        let over = padded(&transfer_raw(1_000), MAX_TRANSACTION_BYTES + 1);
        let e = parse(&over).unwrap_err().0;
        assert_eq!(
            e,
            "unsignedTransaction: a Tron transaction is at most 512000 bytes (java-tron's \
             TRANSACTION_MAX_BYTE_SIZE, 500 KiB), this one is 512001"
        );
        // The Transaction form counts its framing and signatures too.
        let framed = Transaction { raw_data: at.clone(), signature: vec![] }.encode_to_vec();
        assert!(parse(&framed).unwrap_err().0.contains("this one is 512004"), "{framed:?}");
        let fits = padded(&transfer_raw(1_000), MAX_TRANSACTION_BYTES - 4 - 65 - 2);
        let framed = Transaction { raw_data: fits, signature: vec![vec![1; 65]] }.encode_to_vec();
        assert_eq!(framed.len(), MAX_TRANSACTION_BYTES);
        assert!(parse(&framed).is_ok());
        // Through coffer_chain::parse the hex length is checked before the hex is decoded.
        let e = crate::parse(crate::TRANSACTION_TYPE_TRON, &"zz".repeat(MAX_TRANSACTION_BYTES + 1)).unwrap_err().0;
        assert!(e.ends_with("500 KiB), this one is 512001"), "{e}");
        let e = crate::parse(crate::TRANSACTION_TYPE_TRON, &format!("0x{}", hex::encode(&over))).unwrap_err().0;
        assert!(e.ends_with("this one is 512001"), "{e}");
        assert!(crate::parse(crate::TRANSACTION_TYPE_TRON, &hex::encode(&at)).is_ok());
    }

    #[test]
    fn contracts_past_the_first_are_counted_not_decoded() {
        // 250,000 empty contracts (2 bytes each, within the size limit): refused on the field
        // count, before prost would build 250,000 of them.
        let mut many = transfer_raw(1_000);
        for _ in 0..250_000 {
            many.extend([0x5a, 0x00]);
        }
        assert!(many.len() <= MAX_TRANSACTION_BYTES);
        assert_eq!(
            parse(&many).unwrap_err().0,
            "unsignedTransaction: raw_data has 250001 contracts; Tron executes exactly one"
        );
        assert_eq!(occurrences(&transfer_raw(1_000), 11), Some(1));
        assert_eq!(occurrences(&[0x5a, 0x05, 0x00], 11), None, "truncated: prost says why");
        assert_eq!(occurrences(&[0x58, 0x01], 11), None, "field 11 as a varint: prost says why");
        // Two contracts, one of them inside a memo's bytes: one at the top level.
        let mut memo = vec![0x52, 0x02, 0x5a, 0x00];
        memo.extend(transfer_raw(1_000));
        assert_eq!(occurrences(&memo, 11), Some(1));
        assert!(parse(&memo).is_ok());
    }

    fn trigger_raw(call_value: i64, fee_limit: i64) -> Vec<u8> {
        let param = TriggerSmartContract {
            owner_address: [&[0x41][..], &[0x11; 20]].concat(),
            contract_address: [&[0x41][..], &[0x33; 20]].concat(),
            call_value,
            data: vec![0xa9, 0x05, 0x9c, 0xbb],
        }
        .encode_to_vec();
        Raw {
            ref_block_bytes: vec![0xab, 0xcd],
            contract: vec![Contract {
                r#type: TRIGGER_SMART_CONTRACT,
                parameter: Some(Any { type_url: String::new(), value: param }),
            }],
            fee_limit,
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn negative_and_zero_amounts_are_refused_before_signing() {
        for amount in [-1, -1_000_000, i64::MIN, 0] {
            let raw = transfer_raw(amount);
            let e = parse(&raw).unwrap_err().0;
            assert_eq!(
                e,
                format!(
                    "unsignedTransaction: TransferContract amount must be a positive number of sun (it is {amount})"
                )
            );
            // The Transaction form too.
            let framed = Transaction { raw_data: raw, signature: vec![] }.encode_to_vec();
            assert!(parse(&framed).is_err(), "{amount}");
        }
        for amount in [1, i64::MAX] {
            assert!(parse(&transfer_raw(amount)).is_ok(), "{amount}");
        }
        assert!(parse(&trigger_raw(0, 100_000_000)).is_ok(), "a call without value");
        assert!(parse(&trigger_raw(5, 0)).is_ok());
        let e = parse(&trigger_raw(-5, 100_000_000)).unwrap_err().0;
        assert!(e.contains("call_value must not be negative (it is -5)"), "{e}");
        let e = parse(&trigger_raw(0, -1)).unwrap_err().0;
        assert!(e.contains("fee_limit must not be negative (it is -1)"), "{e}");
        // A contract call whose parameter does not decode is refused, not signed without facts.
        let bad = Raw {
            contract: vec![Contract {
                r#type: TRIGGER_SMART_CONTRACT,
                parameter: Some(Any { type_url: String::new(), value: vec![0x0a, 0x20, 0x41] }),
            }],
            ..Default::default()
        }
        .encode_to_vec();
        assert!(parse(&bad).unwrap_err().0.contains("TriggerSmartContract parameter"));
    }
}
