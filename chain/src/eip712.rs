//! EIP-712 typed data as it is signed and as policies see it (`eth.eip_712`): one parse, bounded
//! before anything is decoded, gives both the hashes the key signs and the typed facts, so a
//! policy reads exactly the values that were encoded (addresses lowercase, integers numbers
//! whether written `0x0`, `"0"` or `0`). Also the small integer and address parsers EIP-7702
//! authorizations share ([`crate::eip7702`]).
//!
//! Written by hand on purpose: the sound crates that implement it (`alloy-dyn-abi`, `ethers`) pull a
//! large dependency tree into the enclave for a few hundred lines of hashing. Behaviour follows the
//! EIP and the reference implementations (eth-sig-util v4, viem, ethers v6):
//! - `encodeType` = primary type, then every referenced struct type sorted by name;
//! - structs hash to `hashStruct`, arrays (fixed `T[n]` and dynamic `T[]`, nested too) to
//!   `keccak256(concat(encode(item)))`, `string`/`bytes` to `keccak256(value)`;
//! - integers may be JSON numbers, decimal strings or `0x`-hex strings, optionally negative for
//!   `intN` (two's complement, 256-bit sign extension), range-checked against `N`;
//! - fields absent from `types` are ignored (viem, eth-sig-util), and absent from the facts too
//!   (nothing signs them); a declared field missing from the value is an error (ethers, viem);
//! - without `types.EIP712Domain` the domain type is derived from the domain keys present, in the
//!   canonical order `name, version, chainId, verifyingContract, salt` (viem);
//! - `primaryType == "EIP712Domain"` hashes to `keccak256(0x1901 ‖ domainSeparator)` (viem,
//!   eth-sig-util).
//!
//! Bounds (issue 39), each refused naming it: [`MAX_TYPED_DATA_BYTES`] of JSON, checked before
//! the JSON is parsed; [`MAX_TYPES`] types of at most [`MAX_FIELDS`] fields; arrays of at most
//! [`MAX_ARRAY_ITEMS`] items; structs and arrays nested at most [`MAX_DEPTH`] deep.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use coffer_policy::eval::Val;
use serde_json::{Map, Value};
use sha3::{Digest, Keccak256};

use crate::error::TxError;

/// `payload.encoding` of an EIP-712 typed-data payload.
pub const PAYLOAD_ENCODING: &str = "PAYLOAD_ENCODING_EIP712";

/// The most bytes of JSON a typed-data document may have (64 KiB: the largest documents wallets
/// sign, Seaport orders and Permit2 batches, are a few KiB).
pub const MAX_TYPED_DATA_BYTES: usize = 64 * 1024;
/// The most entries `types` may have (`EIP712Domain` included).
pub const MAX_TYPES: usize = 64;
/// The most fields one type may declare.
pub const MAX_FIELDS: usize = 64;
/// The most items one array value may have.
pub const MAX_ARRAY_ITEMS: usize = 1024;
/// How deep structs and arrays may nest below the message (or the domain).
pub const MAX_DEPTH: usize = 16;

/// `keccak256` of `data`.
pub fn keccak256(data: &[u8]) -> [u8; 32] {
    Keccak256::digest(data).into()
}

// ---------------------------------------------------------------------------------------------
// Integers
// ---------------------------------------------------------------------------------------------

/// An integer parsed from JSON: sign and 256-bit big-endian magnitude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int {
    pub negative: bool,
    pub magnitude: [u8; 32],
}

/// `w = w * mul + add`; returns `true` on overflow past 256 bits.
fn mul_add(w: &mut [u8; 32], mul: u32, add: u32) -> bool {
    let mut carry = add;
    for b in w.iter_mut().rev() {
        let v = u32::from(*b) * mul + carry;
        *b = (v & 0xff) as u8;
        carry = v >> 8;
    }
    carry != 0
}

/// Number of significant bits of a big-endian magnitude.
fn bit_len(w: &[u8; 32]) -> usize {
    match w.iter().position(|&b| b != 0) {
        None => 0,
        Some(i) => (31 - i) * 8 + (8 - w[i].leading_zeros() as usize),
    }
}

/// Parses a JSON number, decimal string or `0x`-hex string (optionally with a leading `-`).
pub fn parse_int(value: &Value) -> Result<Int, String> {
    match value {
        Value::Number(n) => {
            let mut magnitude = [0u8; 32];
            if let Some(u) = n.as_u64() {
                magnitude[24..].copy_from_slice(&u.to_be_bytes());
                Ok(Int { negative: false, magnitude })
            } else if let Some(i) = n.as_i64() {
                magnitude[24..].copy_from_slice(&i.unsigned_abs().to_be_bytes());
                Ok(Int { negative: i < 0, magnitude })
            } else {
                Err(format!("{n} is not an integer (pass large numbers as strings)"))
            }
        }
        Value::String(s) => parse_int_str(s),
        _ => Err("expected a number or a numeric string".into()),
    }
}

fn parse_int_str(s: &str) -> Result<Int, String> {
    let (negative, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (radix, digits) = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(hex) => (16u32, hex),
        None => (10u32, body),
    };
    if digits.is_empty() {
        return Err(format!("{s:?} is not a number"));
    }
    let mut magnitude = [0u8; 32];
    for c in digits.chars() {
        let d = c.to_digit(radix).ok_or_else(|| format!("{s:?} is not a number"))?;
        if mul_add(&mut magnitude, radix, d) {
            return Err(format!("{s:?} does not fit in 256 bits"));
        }
    }
    Ok(Int { negative, magnitude })
}

/// ABI-encodes `value` as `uintN` (`signed == false`) or `intN` into a 32-byte word.
pub fn encode_int(value: &Value, bits: usize, signed: bool) -> Result<[u8; 32], String> {
    let Int { negative, magnitude } = parse_int(value)?;
    let len = bit_len(&magnitude);
    let kind = if signed { "int" } else { "uint" };
    if !signed {
        if negative && len != 0 {
            return Err(format!("negative value for uint{bits}"));
        }
        if len > bits {
            return Err(format!("value out of range for uint{bits}"));
        }
        return Ok(magnitude);
    }
    // intN holds -2^(N-1) ..= 2^(N-1) - 1.
    let is_min = negative && len == bits && magnitude.iter().map(|b| b.count_ones()).sum::<u32>() == 1;
    if len >= bits && !is_min {
        return Err(format!("value out of range for {kind}{bits}"));
    }
    if !negative {
        return Ok(magnitude);
    }
    // Two's complement over 256 bits (sign-extends automatically).
    let mut out = magnitude.map(|b| !b);
    let mut carry = 1u16;
    for b in out.iter_mut().rev() {
        let v = u16::from(*b) + carry;
        *b = (v & 0xff) as u8;
        carry = v >> 8;
    }
    Ok(out)
}

/// Decodes hex with an optional `0x` prefix.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let body = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    hex::decode(body).ok()
}

/// Parses a 20-byte address (`0x` + 40 hex digits, any case; checksum not enforced).
pub fn parse_address(value: &Value) -> Result<[u8; 20], String> {
    let s = value.as_str().ok_or("expected an address string")?;
    let bytes = decode_hex(s).filter(|b| b.len() == 20);
    bytes.and_then(|b| <[u8; 20]>::try_from(b).ok()).ok_or_else(|| format!("{s:?} is not a 20-byte hex address"))
}

// ---------------------------------------------------------------------------------------------
// Typed data
// ---------------------------------------------------------------------------------------------

const DOMAIN: &str = "EIP712Domain";

/// Canonical domain fields (name, type), used when `types.EIP712Domain` is absent.
const DOMAIN_FIELDS: [(&str, &str); 5] = [
    ("name", "string"),
    ("version", "string"),
    ("chainId", "uint256"),
    ("verifyingContract", "address"),
    ("salt", "bytes32"),
];

struct Field {
    name: String,
    ty: String,
}

enum Atomic {
    Bool,
    Address,
    String,
    Bytes,
    FixedBytes(usize),
    Int { bits: usize, signed: bool },
}

fn atomic(ty: &str) -> Option<Atomic> {
    match ty {
        "bool" => return Some(Atomic::Bool),
        "address" => return Some(Atomic::Address),
        "string" => return Some(Atomic::String),
        "bytes" => return Some(Atomic::Bytes),
        "uint" => return Some(Atomic::Int { bits: 256, signed: false }),
        "int" => return Some(Atomic::Int { bits: 256, signed: true }),
        _ => {}
    }
    let parse_width = |digits: &str| -> Option<usize> {
        if digits.starts_with('0') {
            return None;
        }
        digits.parse::<usize>().ok()
    };
    if let Some(n) = ty.strip_prefix("bytes").and_then(parse_width) {
        return (1..=32).contains(&n).then_some(Atomic::FixedBytes(n));
    }
    let (signed, digits) = match ty.strip_prefix("uint") {
        Some(d) => (false, d),
        None => (true, ty.strip_prefix("int")?),
    };
    let bits = parse_width(digits)?;
    (bits % 8 == 0 && (8..=256).contains(&bits)).then_some(Atomic::Int { bits, signed })
}

/// Splits `T[n]` / `T[]` into (`T`, `Some(n)` / `None`); `None` if `ty` is not an array.
fn split_array(ty: &str) -> Result<Option<(&str, Option<usize>)>, String> {
    let Some(body) = ty.strip_suffix(']') else {
        return Ok(None);
    };
    let open = body.rfind('[').ok_or_else(|| format!("malformed type {ty:?}"))?;
    let (inner, dim) = (&body[..open], &body[open + 1..]);
    if inner.is_empty() {
        return Err(format!("malformed type {ty:?}"));
    }
    if dim.is_empty() {
        return Ok(Some((inner, None)));
    }
    let n = dim.parse::<usize>().map_err(|_| format!("malformed type {ty:?}"))?;
    Ok(Some((inner, Some(n))))
}

/// The element type under all array dimensions (`Person[][2]` → `Person`).
fn base_type(ty: &str) -> Result<&str, String> {
    let mut ty = ty;
    while let Some((inner, _)) = split_array(ty)? {
        ty = inner;
    }
    if ty.contains(['[', ']']) {
        return Err(format!("malformed type {ty:?}"));
    }
    Ok(ty)
}

struct Types(BTreeMap<String, Vec<Field>>, RefCell<BTreeMap<String, [u8; 32]>>);

impl Types {
    fn parse(types: &Map<String, Value>) -> Result<Self, String> {
        if types.len() > MAX_TYPES {
            return Err(format!("at most {MAX_TYPES} types, this document has {}", types.len()));
        }
        let mut out = BTreeMap::new();
        for (name, fields) in types {
            let fields = fields.as_array().ok_or_else(|| format!("types.{name} must be an array"))?;
            if fields.len() > MAX_FIELDS {
                return Err(format!("types.{name}: at most {MAX_FIELDS} fields a type, this one has {}", fields.len()));
            }
            let mut parsed = Vec::with_capacity(fields.len());
            for f in fields {
                let get = |key: &str| {
                    f.get(key)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .ok_or_else(|| format!("types.{name}: every field needs a string {key:?}"))
                };
                parsed.push(Field { name: get("name")?, ty: get("type")? });
            }
            out.insert(name.clone(), parsed);
        }
        Ok(Self(out, RefCell::default()))
    }

    fn fields(&self, name: &str) -> Result<&[Field], String> {
        self.0.get(name).map(Vec::as_slice).ok_or_else(|| format!("unknown type {name:?}"))
    }

    /// `name` and every struct type reachable from it; checks that every member type resolves.
    fn collect(&self, name: &str, out: &mut BTreeSet<String>) -> Result<(), String> {
        if !out.insert(name.to_owned()) {
            return Ok(());
        }
        for field in self.fields(name)? {
            let base = base_type(&field.ty)?;
            if self.0.contains_key(base) {
                self.collect(base, out)?;
            } else if atomic(base).is_none() {
                return Err(format!("unknown type {:?} of field {name}.{}", field.ty, field.name));
            }
        }
        Ok(())
    }

    fn encode_type(&self, primary: &str) -> Result<String, String> {
        let mut deps = BTreeSet::new();
        self.collect(primary, &mut deps)?;
        deps.remove(primary);
        let mut out = String::new();
        for name in std::iter::once(primary).chain(deps.iter().map(String::as_str)) {
            out.push_str(name);
            out.push('(');
            let members: Vec<String> = self.fields(name)?.iter().map(|f| format!("{} {}", f.ty, f.name)).collect();
            out.push_str(&members.join(","));
            out.push(')');
        }
        Ok(out)
    }

    /// `keccak256(encodeType(name))`, memoized (a message may hold many instances of a type).
    fn type_hash(&self, name: &str) -> Result<[u8; 32], String> {
        if let Some(h) = self.1.borrow().get(name) {
            return Ok(*h);
        }
        let h = keccak256(self.encode_type(name)?.as_bytes());
        self.1.borrow_mut().insert(name.to_owned(), h);
        Ok(h)
    }

    /// `hashStruct(name, value)` and the value's facts (its declared fields, typed).
    fn hash_struct(&self, name: &str, value: &Value, depth: usize) -> Result<([u8; 32], Val), String> {
        if depth > MAX_DEPTH {
            return Err(format!("structs and arrays nest at most {MAX_DEPTH} levels deep"));
        }
        let obj = value.as_object().ok_or_else(|| format!("expected an object for {name}"))?;
        let mut hasher = Keccak256::new();
        hasher.update(self.type_hash(name)?);
        let mut facts = BTreeMap::new();
        for field in self.fields(name)? {
            let v = obj
                .get(&field.name)
                .filter(|v| !v.is_null())
                .ok_or_else(|| format!("missing field {name}.{}", field.name))?;
            let (word, fact) =
                self.encode_field(&field.ty, v, depth + 1).map_err(|e| format!("{name}.{}: {e}", field.name))?;
            hasher.update(word);
            facts.insert(field.name.clone(), fact);
        }
        Ok((hasher.finalize().into(), Val::Map(facts)))
    }

    /// The 32-byte encoding of `value` as `ty`, and its fact: what was encoded, typed.
    fn encode_field(&self, ty: &str, value: &Value, depth: usize) -> Result<([u8; 32], Val), String> {
        if depth > MAX_DEPTH {
            return Err(format!("structs and arrays nest at most {MAX_DEPTH} levels deep"));
        }
        if let Some((inner, len)) = split_array(ty)? {
            let items = value.as_array().ok_or_else(|| format!("expected an array for {ty}"))?;
            if items.len() > MAX_ARRAY_ITEMS {
                return Err(format!("at most {MAX_ARRAY_ITEMS} items an array, this one has {}", items.len()));
            }
            if let Some(n) = len {
                if items.len() != n {
                    return Err(format!("expected {n} items for {ty}, got {}", items.len()));
                }
            }
            let mut hasher = Keccak256::new();
            let mut facts = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let (word, fact) = self.encode_field(inner, item, depth + 1).map_err(|e| format!("[{i}]: {e}"))?;
                hasher.update(word);
                facts.push(fact);
            }
            return Ok((hasher.finalize().into(), Val::List(facts)));
        }
        if self.0.contains_key(ty) {
            return self.hash_struct(ty, value, depth);
        }
        let mut word = [0u8; 32];
        let fact = match atomic(ty).ok_or_else(|| format!("unknown type {ty:?}"))? {
            Atomic::Bool => {
                let b = value.as_bool().ok_or("expected a boolean")?;
                word[31] = u8::from(b);
                Val::Bool(b)
            }
            Atomic::Address => {
                let address = parse_address(value)?;
                word[12..].copy_from_slice(&address);
                address_val(&address)
            }
            Atomic::String => {
                let s = value.as_str().ok_or("expected a string")?;
                word = keccak256(s.as_bytes());
                Val::Str(s.to_owned())
            }
            Atomic::Bytes => {
                let bytes = value.as_str().and_then(decode_hex).ok_or("expected a hex string")?;
                word = keccak256(&bytes);
                Val::Str(format!("0x{}", hex::encode(&bytes)))
            }
            Atomic::FixedBytes(n) => {
                let bytes = value
                    .as_str()
                    .and_then(decode_hex)
                    .filter(|b| b.len() == n)
                    .ok_or_else(|| format!("expected a hex string of {n} bytes"))?;
                word[..n].copy_from_slice(&bytes);
                Val::Str(format!("0x{}", hex::encode(&bytes)))
            }
            Atomic::Int { bits, signed } => {
                word = encode_int(value, bits, signed)?;
                int_val(parse_int(value)?)
            }
        };
        Ok((word, fact))
    }
}

/// An address as policies see it: `0x` and 40 lowercase hex digits, however it was written.
pub fn address_val(address: &[u8; 20]) -> Val {
    Val::Str(format!("0x{}", hex::encode(address)))
}

/// An integer as policies see it: `Int` when it fits in an i128, else `Uint` (decimal digits); a
/// negative `intN` below i128's range (which no policy literal can name) is its decimal text.
pub fn int_val(i: Int) -> Val {
    let m = i.magnitude;
    let small = m[..16].iter().all(|b| *b == 0);
    let low = u128::from_be_bytes(m[16..].try_into().expect("16 bytes"));
    match (i.negative, small) {
        (false, true) if low <= i128::MAX as u128 => Val::Int(low as i128),
        (true, true) if low <= i128::MAX as u128 => Val::Int(-(low as i128)),
        (true, true) if low == 1u128 << 127 => Val::Int(i128::MIN),
        (false, _) => Val::Uint(alloy_primitives::U256::from_be_bytes(m).to_string()),
        (true, _) => Val::Str(format!("-{}", alloy_primitives::U256::from_be_bytes(m))),
    }
}

/// Hashes of a typed-data document: the domain separator and, unless the primary type is the
/// domain itself, `hashStruct(primaryType, message)`.
#[derive(Debug)]
pub struct TypedDataHashes {
    pub domain_separator: [u8; 32],
    pub message_hash: Option<[u8; 32]>,
}

impl TypedDataHashes {
    /// `keccak256(0x1901 ‖ domainSeparator [‖ hashStruct(message)])`.
    pub fn digest(&self) -> [u8; 32] {
        let mut hasher = Keccak256::new();
        hasher.update([0x19, 0x01]);
        hasher.update(self.domain_separator);
        if let Some(m) = self.message_hash {
            hasher.update(m);
        }
        hasher.finalize().into()
    }
}

/// A typed-data document that parsed and hashed: what the key signs, and what policies see of
/// it as `eth.eip_712` (`primary_type`, `domain` with `name`, `version`, `chain_id`,
/// `verifying_contract`, `salt` and any other declared domain field, and `message`: the primary
/// type's declared fields, typed as they were encoded).
#[derive(Debug)]
pub struct TypedData {
    pub hashes: TypedDataHashes,
    pub facts: Val,
}

/// A document over [`MAX_TYPED_DATA_BYTES`], naming the limit.
fn too_large(bytes: usize) -> String {
    format!("typed data is at most {MAX_TYPED_DATA_BYTES} bytes of JSON, this document is {bytes}")
}

/// Parses and hashes a typed-data JSON document `{types, primaryType, domain, message}`.
pub fn hash_typed_data(json: &str) -> Result<TypedDataHashes, TxError> {
    parse(json).map(|t| t.hashes)
}

/// Parses a typed-data JSON document `{types, primaryType, domain, message}`, bounded before the
/// JSON is read: its hashes and its facts, from one walk.
pub fn parse(json: &str) -> Result<TypedData, TxError> {
    parse_inner(json).map_err(TxError)
}

fn parse_inner(json: &str) -> Result<TypedData, String> {
    if json.len() > MAX_TYPED_DATA_BYTES {
        return Err(too_large(json.len()));
    }
    let doc: Value = serde_json::from_str(json).map_err(|e| format!("not valid JSON: {e}"))?;
    let doc = doc.as_object().ok_or("expected a JSON object")?;
    let types_json = doc.get("types").and_then(Value::as_object).ok_or("\"types\" must be an object")?;
    let primary = doc.get("primaryType").and_then(Value::as_str).ok_or("\"primaryType\" must be a string")?;
    let empty = Value::Object(Map::new());
    let domain = match doc.get("domain") {
        None | Some(Value::Null) => &empty,
        Some(d @ Value::Object(_)) => d,
        Some(_) => return Err("\"domain\" must be an object".into()),
    };

    let mut types = Types::parse(types_json)?;
    if !types.0.contains_key(DOMAIN) {
        let present = domain.as_object();
        let fields = DOMAIN_FIELDS
            .iter()
            .filter(|(name, _)| present.and_then(|m| m.get(*name)).is_some_and(|v| !v.is_null()))
            .map(|(name, ty)| Field { name: (*name).into(), ty: (*ty).into() })
            .collect();
        types.0.insert(DOMAIN.into(), fields);
    }

    let (domain_separator, domain_facts) = types.hash_struct(DOMAIN, domain, 0)?;
    let mut facts = BTreeMap::new();
    facts.insert("primary_type".to_string(), Val::Str(primary.to_owned()));
    let Val::Map(domain_facts) = domain_facts else { unreachable!("a struct's facts are a map") };
    let domain_facts = domain_facts
        .into_iter()
        .map(|(k, v)| {
            let k = match k.as_str() {
                "chainId" => "chain_id".to_string(),
                "verifyingContract" => "verifying_contract".to_string(),
                _ => k,
            };
            (k, v)
        })
        .collect();
    facts.insert("domain".to_string(), Val::Map(domain_facts));
    let message_hash = if primary == DOMAIN {
        None
    } else {
        if !types.0.contains_key(primary) {
            return Err(format!("primaryType {primary:?} is not in types"));
        }
        let message = doc.get("message").ok_or("\"message\" is missing")?;
        let (hash, message_facts) = types.hash_struct(primary, message, 0)?;
        facts.insert("message".to_string(), message_facts);
        Some(hash)
    };
    Ok(TypedData { hashes: TypedDataHashes { domain_separator, message_hash }, facts: Val::Map(facts) })
}

/// Reference documents, shared with coffer-crypto's signing tests.
#[doc(hidden)]
pub mod examples {
    /// The canonical example of EIP-712 (`Example.js` in the EIP's assets).
    pub const MAIL: &str = r#"{
      "types": {
        "EIP712Domain": [
          {"name":"name","type":"string"},{"name":"version","type":"string"},
          {"name":"chainId","type":"uint256"},{"name":"verifyingContract","type":"address"}
        ],
        "Person": [{"name":"name","type":"string"},{"name":"wallet","type":"address"}],
        "Mail": [{"name":"from","type":"Person"},{"name":"to","type":"Person"},{"name":"contents","type":"string"}]
      },
      "primaryType": "Mail",
      "domain": {"name":"Ether Mail","version":"1","chainId":1,"verifyingContract":"0xCcCCccccCCCCcCCCCCCcCcCccCcCCCcCcccccccC"},
      "message": {
        "from": {"name":"Cow","wallet":"0xCD2a3d9F938E13CD947Ec05AbC7FE734Df8DD826"},
        "to": {"name":"Bob","wallet":"0xbBbBBBBbbBBBbbbBbbBbbbbBBbBbbbbBbBbbBBbB"},
        "contents": "Hello, Bob!"
      }
    }"#;

    /// eth-sig-util `signedTypeData_v4` (MetaMask/eth-sig-util test/index.ts): arrays of
    /// addresses, an array of structs and an unreferenced type (`Group`).
    pub const MAIL_V4: &str = r#"{
      "types": {
        "EIP712Domain": [
          {"name":"name","type":"string"},{"name":"version","type":"string"},
          {"name":"chainId","type":"uint256"},{"name":"verifyingContract","type":"address"}
        ],
        "Person": [{"name":"name","type":"string"},{"name":"wallets","type":"address[]"}],
        "Mail": [{"name":"from","type":"Person"},{"name":"to","type":"Person[]"},{"name":"contents","type":"string"}],
        "Group": [{"name":"name","type":"string"},{"name":"members","type":"Person[]"}]
      },
      "primaryType": "Mail",
      "domain": {"name":"Ether Mail","version":"1","chainId":1,"verifyingContract":"0xCcCCccccCCCCcCCCCCCcCcCccCcCCCcCcccccccC"},
      "message": {
        "from": {"name":"Cow","wallets":["0xCD2a3d9F938E13CD947Ec05AbC7FE734Df8DD826","0xDeaDbeefdEAdbeefdEadbEEFdeadbeEFdEaDbeeF"]},
        "to": [{"name":"Bob","wallets":["0xbBbBBBBbbBBBbbbBbbBbbbbBBbBbbbbBbBbbBBbB","0xB0BdaBea57B0BDABeA57b0bdABEA57b0BDabEa57","0xB0B0b0b0b0b0B000000000000000000000000000"]}],
        "contents": "Hello, Bob!"
      }
    }"#;
}

#[cfg(test)]
mod tests {
    use super::examples::{MAIL, MAIL_V4};
    use super::*;
    use serde_json::json;

    fn h(s: &str) -> String {
        hex::encode(keccak256(s.as_bytes()))
    }

    #[test]
    fn mail_example_from_the_eip() {
        let hashes = hash_typed_data(MAIL).unwrap();
        assert_eq!(
            hex::encode(hashes.domain_separator),
            "f2cee375fa42b42143804025fc449deafd50cc031ca257e0b194a650a912090f"
        );
        assert_eq!(
            hex::encode(hashes.message_hash.unwrap()),
            "c52c0ee5d84264471806290a3f2c4cecfc5490626bf912d01f240d7a274b371e"
        );
        assert_eq!(hex::encode(hashes.digest()), "be609aee343fb3c4b28e1df9e632fca64fcfaede20f02e86244efddf30957bd2");
        let doc: Value = serde_json::from_str(MAIL).unwrap();
        let types = Types::parse(doc["types"].as_object().unwrap()).unwrap();
        assert_eq!(
            types.encode_type("Mail").unwrap(),
            "Mail(Person from,Person to,string contents)Person(string name,address wallet)"
        );
    }

    #[test]
    fn arrays_and_nested_structs_eth_sig_util_v4() {
        let doc: Value = serde_json::from_str(MAIL_V4).unwrap();
        let types = Types::parse(doc["types"].as_object().unwrap()).unwrap();
        assert_eq!(
            types.encode_type("Group").unwrap(),
            "Group(string name,Person[] members)Person(string name,address[] wallets)"
        );
        assert_eq!(
            types.encode_type("Mail").unwrap(),
            "Mail(Person from,Person[] to,string contents)Person(string name,address[] wallets)"
        );
        assert_eq!(
            h(&types.encode_type("Person").unwrap()),
            "fabfe1ed996349fc6027709802be19d047da1aa5d6894ff5f6486d92db2e6860"
        );
        assert_eq!(
            hex::encode(types.hash_struct("Person", &doc["message"]["from"], 0).unwrap().0),
            "9b4846dd48b866f0ac54d61b9b21a9e746f921cefa4ee94c4c0a1c49c774f67f"
        );
        assert_eq!(
            hex::encode(types.hash_struct("Person", &doc["message"]["to"][0], 0).unwrap().0),
            "efa62530c7ae3a290f8a13a5fc20450bdb3a6af19d9d9d2542b5a94e631a9168"
        );
        // encodeData(Mail) third word = keccak(hashStruct(to[0])).
        assert_eq!(
            hex::encode(types.encode_field("Person[]", &doc["message"]["to"], 0).unwrap().0),
            "ca322beec85be24e374d18d582a6f2997f75c54e7993ab5bc07404ce176ca7cd"
        );
        let hashes = hash_typed_data(MAIL_V4).unwrap();
        assert_eq!(
            hex::encode(hashes.message_hash.unwrap()),
            "eb4221181ff3f1a83ea7313993ca9218496e424604ba9492bb4052c03d5c3df8"
        );
        assert_eq!(
            hex::encode(hashes.domain_separator),
            "f2cee375fa42b42143804025fc449deafd50cc031ca257e0b194a650a912090f"
        );
        assert_eq!(hex::encode(hashes.digest()), "a85c2e2b118698e88db68a8105b794a8cc7cec074e89ef991cb4f5f533819cc2");
    }

    #[test]
    fn derived_domain_type_and_number_forms() {
        // Same Mail document without types.EIP712Domain, chainId as a decimal string, hex string.
        let mut doc: Value = serde_json::from_str(MAIL).unwrap();
        doc["types"].as_object_mut().unwrap().remove("EIP712Domain");
        for chain in [json!(1), json!("1"), json!("0x01")] {
            doc["domain"]["chainId"] = chain;
            let hashes = hash_typed_data(&doc.to_string()).unwrap();
            assert_eq!(
                hex::encode(hashes.digest()),
                "be609aee343fb3c4b28e1df9e632fca64fcfaede20f02e86244efddf30957bd2"
            );
        }
        // Empty domain (viem emits "domain":{}): EIP712Domain() with no members.
        let doc = json!({"types": {"M": [{"name": "a", "type": "uint8"}]}, "primaryType": "M",
                         "domain": {}, "message": {"a": 1}});
        let hashes = hash_typed_data(&doc.to_string()).unwrap();
        assert_eq!(hashes.domain_separator, keccak256(&keccak256(b"EIP712Domain()")));
        // Primary type = domain: digest over the separator only.
        let doc = json!({"types": {}, "primaryType": "EIP712Domain", "domain": {"name": "x"}});
        let hashes = hash_typed_data(&doc.to_string()).unwrap();
        assert!(hashes.message_hash.is_none());
        let mut pre = vec![0x19, 0x01];
        pre.extend_from_slice(&hashes.domain_separator);
        assert_eq!(hashes.digest(), keccak256(&pre));
    }

    #[test]
    fn atomic_encodings_by_hand() {
        let types = Types(BTreeMap::new(), RefCell::default());
        let enc = |ty: &str, v: Value| types.encode_field(ty, &v, 0).map(|(w, _)| hex::encode(w));
        let mut minus_one = "ff".repeat(32);
        assert_eq!(enc("int8", json!(-1)).unwrap(), minus_one);
        assert_eq!(enc("int256", json!("-1")).unwrap(), minus_one);
        minus_one.replace_range(62.., "80");
        assert_eq!(enc("int8", json!("-128")).unwrap(), minus_one); // -128 = 0xff..ff80
        assert_eq!(enc("int8", json!(127)).unwrap(), format!("{}7f", "00".repeat(31)));
        assert!(enc("int8", json!(128)).unwrap_err().contains("out of range"));
        assert!(enc("int8", json!(-129)).unwrap_err().contains("out of range"));
        assert!(enc("uint8", json!(256)).unwrap_err().contains("out of range"));
        assert!(enc("uint8", json!(-1)).unwrap_err().contains("negative"));
        assert_eq!(enc("uint16", json!("0x1234")).unwrap(), format!("{}1234", "00".repeat(30)));
        let max = format!("0x{}", "f".repeat(64));
        assert_eq!(enc("uint256", json!(max)).unwrap(), "ff".repeat(32));
        let over = format!("0x1{}", "0".repeat(64));
        assert!(enc("uint256", json!(over)).unwrap_err().contains("256 bits"));
        assert_eq!(
            enc("uint256", json!("115792089237316195423570985008687907853269984665640564039457584007913129639935"))
                .unwrap(),
            "ff".repeat(32)
        );
        assert!(enc("uint256", json!(1.5)).unwrap_err().contains("not an integer"));
        assert_eq!(enc("bool", json!(true)).unwrap(), format!("{}01", "00".repeat(31)));
        assert_eq!(enc("bytes2", json!("0xabcd")).unwrap(), format!("abcd{}", "00".repeat(30)));
        assert!(enc("bytes2", json!("0xab")).is_err());
        assert_eq!(enc("bytes", json!("0x")).unwrap(), hex::encode(keccak256(b"")));
        assert_eq!(enc("string", json!("")).unwrap(), hex::encode(keccak256(b"")));
        assert_eq!(
            enc("address", json!("0xcd2a3d9f938e13cd947ec05abc7fe734df8dd826")).unwrap(),
            format!("{}cd2a3d9f938e13cd947ec05abc7fe734df8dd826", "00".repeat(12))
        );
        // Fixed and nested arrays: keccak of the concatenated member encodings.
        let one = enc("uint8", json!(1)).unwrap();
        let two = enc("uint8", json!(2)).unwrap();
        let inner = hex::encode(keccak256(&hex::decode(format!("{one}{two}")).unwrap()));
        assert_eq!(enc("uint8[2]", json!([1, 2])).unwrap(), inner);
        assert_eq!(enc("uint8[]", json!([1, 2])).unwrap(), inner);
        let outer = hex::encode(keccak256(&hex::decode(format!("{inner}{inner}")).unwrap()));
        assert_eq!(enc("uint8[2][]", json!([[1, 2], [1, 2]])).unwrap(), outer);
        assert!(enc("uint8[3]", json!([1, 2])).unwrap_err().contains("expected 3 items"));
        assert!(enc("uint7", json!(1)).unwrap_err().contains("unknown type"));
        assert!(enc("bytes33", json!("0x")).unwrap_err().contains("unknown type"));
    }

    #[test]
    fn malformed_documents() {
        let err = |doc: Value| hash_typed_data(&doc.to_string()).unwrap_err().0;
        assert!(hash_typed_data("{").unwrap_err().0.contains("not valid JSON"));
        assert!(err(json!([])).contains("JSON object"));
        assert!(err(json!({"primaryType": "M"})).contains("types"));
        assert!(err(json!({"types": {}, "primaryType": "M", "message": {}})).contains("not in types"));
        let base = |message: Value| json!({"types": {"M": [{"name": "a", "type": "Unknown"}]}, "primaryType": "M", "message": message});
        assert!(err(base(json!({"a": 1}))).contains("unknown type"));
        let doc = json!({"types": {"M": [{"name": "a", "type": "uint8"}]}, "primaryType": "M", "message": {}});
        assert!(err(doc).contains("missing field M.a"));
        for bad in ["uint8[2", "uint8[x]", "[]", "uint8]"] {
            let doc = json!({"types": {"M": [{"name": "a", "type": bad}]}, "primaryType": "M", "message": {"a": []}});
            assert!(err(doc).contains("malformed type"), "{bad}");
        }
        let doc = json!({"types": {"M": [{"name": "a"}]}, "primaryType": "M", "message": {}});
        assert!(err(doc).contains("needs a string \"type\""));
    }

    /// Evaluates `condition` over `facts` as `eth.eip_712`.
    fn policy(facts: &Val, condition: &str) -> Result<bool, String> {
        let eth = BTreeMap::from([("eip_712".to_string(), facts.clone())]);
        let roots = BTreeMap::from([("eth".to_string(), Val::Map(eth))]);
        let expr = coffer_policy::parse_condition(condition).map_err(|e| format!("does not parse: {e}"))?;
        coffer_policy::eval::eval_bool(&expr, &roots).map_err(|e| e.message)
    }

    /// An ERC-2612 permit: `spender` may move `value` of the token at `verifyingContract`.
    fn permit(contract: &str, spender: &str, chain: Value, value: Value) -> String {
        json!({
            "types": {
                "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                    {"name": "chainId", "type": "uint256"}, {"name": "verifyingContract", "type": "address"}],
                "Permit": [{"name": "owner", "type": "address"}, {"name": "spender", "type": "address"},
                    {"name": "value", "type": "uint256"}, {"name": "nonce", "type": "uint256"},
                    {"name": "deadline", "type": "uint256"}]
            },
            "primaryType": "Permit",
            "domain": {"name": "USD Coin", "version": "2", "chainId": chain, "verifyingContract": contract},
            "message": {"owner": "0x1111111111111111111111111111111111111111", "spender": spender, "value": value,
                "nonce": 0, "deadline": "0xffffffff", "note": "not declared, not signed"}
        })
        .to_string()
    }

    const USDC: &str = "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48";
    const DRAINER: &str = "0xdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef";

    #[test]
    fn uppercase_addresses_do_not_pass_a_lowercase_deny_list() {
        // Issue 39: the facts were the raw JSON, so `verifyingContract` and `spender` written in
        // uppercase hex passed a deny list of lowercase addresses; the signer encodes them as
        // the same 20 bytes.
        let deny_contract = format!("eth.eip_712.domain.verifying_contract in ['{USDC}']");
        let deny_spender =
            format!("eth.eip_712.message.spender in ['0x0000000000000000000000000000000000000001', '{DRAINER}']");
        let upper = |a: &str| format!("0x{}", a[2..].to_uppercase());
        for (contract, spender) in [(USDC.to_string(), DRAINER.to_string()), (upper(USDC), upper(DRAINER))] {
            let doc = permit(&contract, &spender, json!(1), json!("1000"));
            let typed = parse(&doc).unwrap();
            assert_eq!(
                typed.hashes.digest(),
                parse(&permit(USDC, DRAINER, json!(1), json!(1000))).unwrap().hashes.digest()
            );
            assert_eq!(policy(&typed.facts, &deny_contract), Ok(true), "{contract}");
            assert_eq!(policy(&typed.facts, &deny_spender), Ok(true), "{spender}");
        }
    }

    #[test]
    fn numbers_are_numbers_however_they_are_written() {
        // Issue 39: `chainId: "0x0"` passed a rule `chain_id == 0` (it saw the string "0x0").
        for chain in [json!("0x0"), json!("0"), json!(0), json!("0x00")] {
            let typed = parse(&permit(USDC, DRAINER, chain.clone(), json!("0x3e8"))).unwrap();
            assert_eq!(policy(&typed.facts, "eth.eip_712.domain.chain_id == 0"), Ok(true), "{chain}");
            assert_eq!(policy(&typed.facts, "eth.eip_712.message.value == 1000"), Ok(true), "{chain}");
            assert_eq!(policy(&typed.facts, "eth.eip_712.message.deadline == 4294967295"), Ok(true));
        }
        // Past i128: still a number (compared as one), as eth.tx.value is.
        let max = format!("0x{}", "f".repeat(64));
        let typed = parse(&permit(USDC, DRAINER, json!(1), json!(max))).unwrap();
        assert_eq!(policy(&typed.facts, "eth.eip_712.message.value > 1000000000000000000000000"), Ok(true));
        // What is not declared is not signed, and not a fact either.
        assert!(policy(&typed.facts, "eth.eip_712.message.note == 'x'").is_err());
        assert_eq!(policy(&typed.facts, "eth.eip_712.primary_type == 'Permit'"), Ok(true));
        assert_eq!(policy(&typed.facts, "eth.eip_712.domain.name == 'USD Coin'"), Ok(true));
        // Negative intN, bytes, bool and arrays of structs are typed too.
        let doc = json!({"types": {"M": [{"name": "d", "type": "int16"}, {"name": "b", "type": "bytes"},
            {"name": "ok", "type": "bool"}, {"name": "to", "type": "P[]"}], "P": [{"name": "w", "type": "address"}]},
            "primaryType": "M", "domain": {}, "message": {"d": "-0x10", "b": "0xABCD", "ok": true,
            "to": [{"w": DRAINER.to_uppercase().replacen("0X", "0x", 1)}]}});
        let typed = parse(&doc.to_string()).unwrap();
        let expected = format!("eth.eip_712.message.d == -16 && eth.eip_712.message.b == '0xabcd' && eth.eip_712.message.ok && eth.eip_712.message.to[0].w == '{DRAINER}'");
        assert_eq!(policy(&typed.facts, &expected), Ok(true));
    }

    #[test]
    fn documents_are_bounded_before_they_are_read() {
        let err = |doc: &str| parse(doc).unwrap_err().0;
        let big = permit(USDC, DRAINER, json!(1), json!(1)).replacen(
            '{',
            &format!("{{{}", " ".repeat(MAX_TYPED_DATA_BYTES)),
            1,
        );
        assert_eq!(err(&big), format!("typed data is at most 65536 bytes of JSON, this document is {}", big.len()));
        let at_limit = permit(USDC, DRAINER, json!(1), json!(1));
        let at_limit = at_limit.replacen('{', &format!("{{{}", " ".repeat(MAX_TYPED_DATA_BYTES - at_limit.len())), 1);
        assert!(parse(&at_limit).is_ok());
        let mut types = Map::new();
        for i in 0..=MAX_TYPES {
            types.insert(format!("T{i}"), json!([]));
        }
        let doc = json!({"types": types, "primaryType": "T0", "domain": {}, "message": {}});
        assert_eq!(err(&doc.to_string()), "at most 64 types, this document has 65");
        let fields: Vec<Value> = (0..=MAX_FIELDS).map(|i| json!({"name": format!("f{i}"), "type": "bool"})).collect();
        let doc = json!({"types": {"M": fields}, "primaryType": "M", "domain": {}, "message": {}});
        assert_eq!(err(&doc.to_string()), "types.M: at most 64 fields a type, this one has 65");
        let doc = json!({"types": {"M": [{"name": "a", "type": "uint8[]"}]}, "primaryType": "M", "domain": {},
            "message": {"a": vec![1; MAX_ARRAY_ITEMS + 1]}});
        assert_eq!(err(&doc.to_string()), "M.a: at most 1024 items an array, this one has 1025");
        // A type that holds itself, nested 17 deep.
        let mut message = json!({"n": []});
        for _ in 0..MAX_DEPTH {
            message = json!({"n": [message]});
        }
        let doc = json!({"types": {"N": [{"name": "n", "type": "N[]"}]}, "primaryType": "N", "domain": {}, "message": message});
        assert!(
            err(&doc.to_string()).ends_with("structs and arrays nest at most 16 levels deep"),
            "{}",
            err(&doc.to_string())
        );
    }
}
