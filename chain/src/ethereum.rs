//! Ethereum transactions: legacy (EIP-155 or not), EIP-2930, EIP-1559, EIP-4844 (no sidecar)
//! and EIP-7702, as viem's `serializeTransaction` writes them unsigned. Decoding and encoding
//! are alloy-consensus'; this module adds the strictness a signer needs (the input must be the
//! canonical unsigned encoding, byte for byte) and errors that name the field.

use alloy_consensus::{EthereumTxEnvelope, EthereumTypedTransaction, SignableTransaction, Transaction as _, TxEip4844};
use alloy_eips::eip2718::Encodable2718;
use alloy_primitives::{Signature, TxKind, U256};
use alloy_rlp::Header;
use coffer_policy::eval::Val;

use crate::error::TxError;
use crate::facts::{hex0x, text, uint, Facts};

type Typed = EthereumTypedTransaction<TxEip4844>;

/// The most bytes an unsigned transaction may have: geth's `txMaxSize` (128 KiB, the largest
/// transaction its pool accepts). Refused before anything is decoded.
pub const MAX_TRANSACTION_BYTES: usize = 128 * 1024;

/// The most authorizations an EIP-7702 transaction may carry (wallets send one; 64 leaves room
/// for batching). Counted on the RLP list before it is decoded, so the facts never hold more.
pub const MAX_AUTHORIZATIONS: usize = 64;

/// A transaction over [`MAX_TRANSACTION_BYTES`], naming the limit.
pub(crate) fn too_large(bytes: usize) -> TxError {
    invalid(format_args!(
        "an Ethereum transaction is at most {MAX_TRANSACTION_BYTES} bytes (geth's txMaxSize, 128 KiB), this one is {bytes}"
    ))
}

/// An unsigned Ethereum transaction that is exactly the canonical encoding it was parsed from.
#[derive(Debug, Clone)]
pub struct EthereumTx {
    tx: Typed,
}

/// What each field of an unsigned encoding must be, for errors that name it.
#[derive(Clone, Copy)]
enum Field {
    /// An unsigned integer of at most this many bytes.
    Int(&'static str, usize),
    /// An address, or empty for contract creation when `creation` is allowed.
    To(bool),
    Bytes(&'static str),
    List(&'static str),
    /// EIP-155's trailing zero `r`/`s` of an unsigned legacy transaction.
    Zero(&'static str),
}

const LEGACY: &[Field] = &[
    Field::Int("nonce", 8),
    Field::Int("gasPrice", 16),
    Field::Int("gas", 8),
    Field::To(true),
    Field::Int("value", 32),
    Field::Bytes("data"),
    Field::Int("chainId", 8),
    Field::Zero("r"),
    Field::Zero("s"),
];
const TYPE_1: &[Field] = &[
    Field::Int("chainId", 8),
    Field::Int("nonce", 8),
    Field::Int("gasPrice", 16),
    Field::Int("gas", 8),
    Field::To(true),
    Field::Int("value", 32),
    Field::Bytes("data"),
    Field::List("accessList"),
];
const TYPE_2: &[Field] = &[
    Field::Int("chainId", 8),
    Field::Int("nonce", 8),
    Field::Int("maxPriorityFeePerGas", 16),
    Field::Int("maxFeePerGas", 16),
    Field::Int("gas", 8),
    Field::To(true),
    Field::Int("value", 32),
    Field::Bytes("data"),
    Field::List("accessList"),
];
const TYPE_3: &[Field] = &[
    Field::Int("chainId", 8),
    Field::Int("nonce", 8),
    Field::Int("maxPriorityFeePerGas", 16),
    Field::Int("maxFeePerGas", 16),
    Field::Int("gas", 8),
    Field::To(false),
    Field::Int("value", 32),
    Field::Bytes("data"),
    Field::List("accessList"),
    Field::Int("maxFeePerBlobGas", 16),
    Field::List("blobVersionedHashes"),
];
const TYPE_4: &[Field] = &[
    Field::Int("chainId", 8),
    Field::Int("nonce", 8),
    Field::Int("maxPriorityFeePerGas", 16),
    Field::Int("maxFeePerGas", 16),
    Field::Int("gas", 8),
    Field::To(false),
    Field::Int("value", 32),
    Field::Bytes("data"),
    Field::List("accessList"),
    Field::List("authorizationList"),
];

fn invalid(reason: impl std::fmt::Display) -> TxError {
    TxError(format!("unsignedTransaction: {reason}"))
}

/// Parses an unsigned transaction. Refuses anything alloy would decode but not re-encode to the
/// same bytes (non-canonical integers, EIP-155 `r`/`s` that are not zero, a type-0 prefix) and
/// any trailing byte: the signature then covers exactly what the caller sent.
pub fn parse(bytes: &[u8]) -> Result<EthereumTx, TxError> {
    if bytes.len() > MAX_TRANSACTION_BYTES {
        return Err(too_large(bytes.len()));
    }
    let (&first, _) = bytes.split_first().ok_or_else(|| invalid("empty"))?;
    let fields = match first {
        0xc0..=0xff => LEGACY,
        0x01 => TYPE_1,
        0x02 => TYPE_2,
        0x03 => TYPE_3,
        0x04 => TYPE_4,
        0x76 => return Err(TxError::new("unsignedTransaction: Tempo transactions are not supported yet")),
        other => return Err(invalid(format_args!("unknown Ethereum transaction type 0x{other:02x}"))),
    };
    // Field-by-field first, so that a malformed field is named rather than reported as an RLP
    // error deep inside the decoder.
    let legacy = first >= 0xc0;
    check_fields(if legacy { bytes } else { &bytes[1..] }, fields, legacy)?;
    let mut buf = bytes;
    let tx =
        Typed::decode_unsigned(&mut buf).map_err(|e| invalid(format_args!("not a valid unsigned transaction: {e}")))?;
    if !buf.is_empty() {
        return Err(invalid(format_args!("{} trailing bytes after the transaction", buf.len())));
    }
    let mut again = Vec::with_capacity(bytes.len());
    tx.encode_for_signing(&mut again);
    if again != bytes {
        return Err(invalid("not the canonical unsigned encoding (it does not re-encode to the same bytes)"));
    }
    Ok(EthereumTx { tx })
}

/// Walks the top-level RLP list and checks each field's shape.
fn check_fields(rlp: &[u8], fields: &[Field], legacy: bool) -> Result<(), TxError> {
    let mut buf = rlp;
    let header = Header::decode(&mut buf).map_err(|e| invalid(format_args!("malformed RLP: {e}")))?;
    if !header.list {
        return Err(invalid("not an RLP list"));
    }
    if header.payload_length > buf.len() {
        return Err(invalid("truncated: the RLP list is longer than the input"));
    }
    if buf.len() > header.payload_length {
        return Err(invalid(format_args!(
            "{} trailing bytes after the transaction",
            buf.len() - header.payload_length
        )));
    }
    let mut count = 0;
    while !buf.is_empty() {
        let mut item = buf;
        let h = Header::decode(&mut item).map_err(|e| invalid(format_args!("field {count}: {e}")))?;
        if h.payload_length > item.len() {
            return Err(invalid(format_args!("field {count} is truncated")));
        }
        let payload = &item[..h.payload_length];
        if let Some(field) = fields.get(count) {
            check_field(*field, h.list, payload)?;
        }
        buf = &item[h.payload_length..];
        count += 1;
    }
    // An unsigned legacy transaction has 6 fields (pre-EIP-155) or 9 (EIP-155).
    let expected_ok = if legacy { count == 6 || count == 9 } else { count == fields.len() };
    if !expected_ok {
        let expected = if legacy { "6 or 9".to_string() } else { fields.len().to_string() };
        return Err(invalid(format_args!("expected {expected} fields, found {count}")));
    }
    Ok(())
}

fn check_field(field: Field, list: bool, payload: &[u8]) -> Result<(), TxError> {
    let name = match field {
        Field::Int(n, _) | Field::Bytes(n) | Field::List(n) | Field::Zero(n) => n,
        Field::To(_) => "to",
    };
    match field {
        Field::List(_) if !list => Err(invalid(format_args!("{name} must be a list"))),
        Field::List("authorizationList") => {
            let n = rlp_items(payload, name)?;
            if n > MAX_AUTHORIZATIONS {
                Err(invalid(format_args!(
                    "authorizationList: at most {MAX_AUTHORIZATIONS} authorizations, this one has {n}"
                )))
            } else {
                Ok(())
            }
        }
        Field::List(_) => Ok(()),
        _ if list => Err(invalid(format_args!("{name} must not be a list"))),
        Field::Int(_, max) => {
            if payload.len() > max {
                Err(invalid(format_args!("{name} does not fit in {} bits", max * 8)))
            } else if payload.first() == Some(&0) {
                Err(invalid(format_args!("{name} has leading zero bytes")))
            } else {
                Ok(())
            }
        }
        Field::Zero(_) if !payload.is_empty() => {
            Err(invalid(format_args!("{name} must be empty in an unsigned EIP-155 transaction")))
        }
        Field::To(creation) => match payload.len() {
            20 => Ok(()),
            0 if creation => Ok(()),
            0 => Err(invalid("to is required for this transaction type")),
            n => Err(invalid(format_args!("to must be 20 bytes, found {n}"))),
        },
        Field::Zero(_) | Field::Bytes(_) => Ok(()),
    }
}

/// How many items an RLP list's payload holds (headers only, nothing decoded).
fn rlp_items(payload: &[u8], name: &str) -> Result<usize, TxError> {
    let (mut buf, mut n) = (payload, 0usize);
    while !buf.is_empty() {
        let h = Header::decode(&mut buf).map_err(|e| invalid(format_args!("{name}[{n}]: {e}")))?;
        if h.payload_length > buf.len() {
            return Err(invalid(format_args!("{name}[{n}] is truncated")));
        }
        buf = &buf[h.payload_length..];
        n += 1;
    }
    Ok(n)
}

impl EthereumTx {
    /// keccak-256 of the unsigned encoding: what the secp256k1 key signs.
    pub fn signing_hash(&self) -> [u8; 32] {
        self.tx.signature_hash().0
    }

    /// The signed transaction (EIP-2718 encoding: legacy RLP with EIP-155 `v`, or the typed
    /// envelope), for a low-S signature and its y parity.
    pub fn signed(&self, r: &[u8; 32], s: &[u8; 32], y_parity: bool) -> Vec<u8> {
        let signature = Signature::new(U256::from_be_bytes(*r), U256::from_be_bytes(*s), y_parity);
        let signed = self.tx.clone().into_signed(signature);
        EthereumTxEnvelope::<TxEip4844>::from(signed).encoded_2718()
    }

    /// The address the transaction calls, if any (lowercase, `0x`).
    pub fn to(&self) -> Option<String> {
        match self.tx.kind() {
            TxKind::Call(a) => Some(format!("0x{}", hex::encode(a.as_slice()))),
            TxKind::Create => None,
        }
    }

    /// The call data.
    pub fn data(&self) -> &[u8] {
        self.tx.input()
    }

    /// `eth.tx` without what an ABI adds (spec 12.4): numbers compare as numbers, addresses and
    /// data are lowercase `0x` hex. Fields a type does not have are absent.
    pub fn facts(&self) -> Facts {
        let t = &self.tx;
        let mut f = Facts::new();
        let type_name = match t {
            Typed::Legacy(_) => "LEGACY",
            Typed::Eip2930(_) => "TYPE_1",
            Typed::Eip1559(_) => "TYPE_2",
            Typed::Eip4844(_) => "TYPE_3",
            Typed::Eip7702(_) => "TYPE_4",
        };
        f.insert("type".into(), text(type_name));
        // Absent for a pre-EIP-155 legacy transaction: it names no chain, so its signature is
        // valid on every chain. Never a default such as 0, which a policy would compare.
        if let Some(id) = t.chain_id() {
            f.insert("chain_id".into(), uint(id));
        }
        f.insert("nonce".into(), uint(t.nonce()));
        f.insert("gas".into(), uint(t.gas_limit()));
        f.insert("to".into(), text(self.to().unwrap_or_default()));
        f.insert("value".into(), uint(t.value()));
        f.insert("data".into(), hex0x(t.input()));
        match t {
            Typed::Legacy(_) | Typed::Eip2930(_) => {
                f.insert("gas_price".into(), uint(t.max_fee_per_gas()));
            }
            _ => {
                f.insert("max_fee_per_gas".into(), uint(t.max_fee_per_gas()));
                f.insert("max_priority_fee_per_gas".into(), uint(t.max_priority_fee_per_gas().unwrap_or_default()));
            }
        }
        if let Some(blob) = t.max_fee_per_blob_gas() {
            f.insert("max_fee_per_blob_gas".into(), uint(blob));
        }
        // Every authorization (`parse` refused more than MAX_AUTHORIZATIONS; none is dropped).
        if let Some(list) = t.authorization_list() {
            let auths = list
                .iter()
                .map(|a| {
                    let i = a.inner();
                    let mut m = Facts::new();
                    m.insert("address".into(), hex0x(i.address.as_slice()));
                    m.insert("chain_id".into(), uint(i.chain_id));
                    m.insert("nonce".into(), uint(i.nonce));
                    Val::Map(m)
                })
                .collect();
            f.insert("authorization_list".into(), Val::List(auths));
        }
        f
    }
}

#[cfg(test)]
mod tests;
