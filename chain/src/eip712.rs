//! EIP-712 typed-data hashing and the small integer parser it shares with EIP-7702.
//!
//! Written by hand on purpose: the sound crates that implement it (`alloy-dyn-abi`, `ethers`) pull a
//! large dependency tree into the enclave for a few hundred lines of hashing. Behaviour follows the
//! EIP and the reference implementations (eth-sig-util v4, viem, ethers v6):
//! - `encodeType` = primary type, then every referenced struct type sorted by name;
//! - structs hash to `hashStruct`, arrays (fixed `T[n]` and dynamic `T[]`, nested too) to
//!   `keccak256(concat(encode(item)))`, `string`/`bytes` to `keccak256(value)`;
//! - integers may be JSON numbers, decimal strings or `0x`-hex strings, optionally negative for
//!   `intN` (two's complement, 256-bit sign extension), range-checked against `N`;
//! - fields absent from `types` are ignored (viem, eth-sig-util); a declared field missing from the
//!   value is an error (ethers, viem);
//! - without `types.EIP712Domain` the domain type is derived from the domain keys present, in the
//!   canonical order `name, version, chainId, verifyingContract, salt` (viem);
//! - `primaryType == "EIP712Domain"` hashes to `keccak256(0x1901 ‖ domainSeparator)` (viem,
//!   eth-sig-util).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};
use sha3::{Digest, Keccak256};

/// `keccak256` of `data`.
pub(crate) fn keccak256(data: &[u8]) -> [u8; 32] {
    Keccak256::digest(data).into()
}

// ---------------------------------------------------------------------------------------------
// Integers
// ---------------------------------------------------------------------------------------------

/// An integer parsed from JSON: sign and 256-bit big-endian magnitude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Int {
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
pub(crate) fn bit_len(w: &[u8; 32]) -> usize {
    match w.iter().position(|&b| b != 0) {
        None => 0,
        Some(i) => (31 - i) * 8 + (8 - w[i].leading_zeros() as usize),
    }
}

/// Parses a JSON number, decimal string or `0x`-hex string (optionally with a leading `-`).
pub(crate) fn parse_int(value: &Value) -> Result<Int, String> {
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
pub(crate) fn encode_int(value: &Value, bits: usize, signed: bool) -> Result<[u8; 32], String> {
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
pub(crate) fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let body = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    hex::decode(body).ok()
}

/// Parses a 20-byte address (`0x` + 40 hex digits, any case; checksum not enforced).
pub(crate) fn parse_address(value: &Value) -> Result<[u8; 20], String> {
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
        let mut out = BTreeMap::new();
        for (name, fields) in types {
            let fields = fields.as_array().ok_or_else(|| format!("types.{name} must be an array"))?;
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

    fn hash_struct(&self, name: &str, value: &Value) -> Result<[u8; 32], String> {
        let obj = value.as_object().ok_or_else(|| format!("expected an object for {name}"))?;
        let mut hasher = Keccak256::new();
        hasher.update(self.type_hash(name)?);
        for field in self.fields(name)? {
            let v = obj
                .get(&field.name)
                .filter(|v| !v.is_null())
                .ok_or_else(|| format!("missing field {name}.{}", field.name))?;
            let word = self.encode_field(&field.ty, v).map_err(|e| format!("{name}.{}: {e}", field.name))?;
            hasher.update(word);
        }
        Ok(hasher.finalize().into())
    }

    fn encode_field(&self, ty: &str, value: &Value) -> Result<[u8; 32], String> {
        if let Some((inner, len)) = split_array(ty)? {
            let items = value.as_array().ok_or_else(|| format!("expected an array for {ty}"))?;
            if let Some(n) = len {
                if items.len() != n {
                    return Err(format!("expected {n} items for {ty}, got {}", items.len()));
                }
            }
            let mut hasher = Keccak256::new();
            for (i, item) in items.iter().enumerate() {
                hasher.update(self.encode_field(inner, item).map_err(|e| format!("[{i}]: {e}"))?);
            }
            return Ok(hasher.finalize().into());
        }
        if self.0.contains_key(ty) {
            return self.hash_struct(ty, value);
        }
        let mut word = [0u8; 32];
        match atomic(ty).ok_or_else(|| format!("unknown type {ty:?}"))? {
            Atomic::Bool => {
                let b = value.as_bool().ok_or("expected a boolean")?;
                word[31] = u8::from(b);
            }
            Atomic::Address => word[12..].copy_from_slice(&parse_address(value)?),
            Atomic::String => {
                let s = value.as_str().ok_or("expected a string")?;
                word = keccak256(s.as_bytes());
            }
            Atomic::Bytes => {
                let bytes = value.as_str().and_then(decode_hex).ok_or("expected a hex string")?;
                word = keccak256(&bytes);
            }
            Atomic::FixedBytes(n) => {
                let bytes = value
                    .as_str()
                    .and_then(decode_hex)
                    .filter(|b| b.len() == n)
                    .ok_or_else(|| format!("expected a hex string of {n} bytes"))?;
                word[..n].copy_from_slice(&bytes);
            }
            Atomic::Int { bits, signed } => word = encode_int(value, bits, signed)?,
        }
        Ok(word)
    }
}

/// Hashes of a typed-data document: the domain separator and, unless the primary type is the
/// domain itself, `hashStruct(primaryType, message)`.
#[derive(Debug)]
pub(crate) struct TypedDataHashes {
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

/// Parses and hashes a typed-data JSON document `{types, primaryType, domain, message}`.
pub(crate) fn hash_typed_data(json: &str) -> Result<TypedDataHashes, String> {
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

    let domain_separator = types.hash_struct(DOMAIN, domain)?;
    let message_hash = if primary == DOMAIN {
        None
    } else {
        if !types.0.contains_key(primary) {
            return Err(format!("primaryType {primary:?} is not in types"));
        }
        let message = doc.get("message").ok_or("\"message\" is missing")?;
        Some(types.hash_struct(primary, message)?)
    };
    Ok(TypedDataHashes { domain_separator, message_hash })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    fn h(s: &str) -> String {
        hex::encode(keccak256(s.as_bytes()))
    }

    /// The canonical example of EIP-712 (`Example.js` in the EIP's assets).
    pub(crate) const MAIL: &str = r#"{
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

    /// eth-sig-util `signedTypeData_v4` (MetaMask/eth-sig-util test/index.ts): arrays of
    /// addresses, an array of structs and an unreferenced type (`Group`).
    pub(crate) const MAIL_V4: &str = r#"{
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
            hex::encode(types.hash_struct("Person", &doc["message"]["from"]).unwrap()),
            "9b4846dd48b866f0ac54d61b9b21a9e746f921cefa4ee94c4c0a1c49c774f67f"
        );
        assert_eq!(
            hex::encode(types.hash_struct("Person", &doc["message"]["to"][0]).unwrap()),
            "efa62530c7ae3a290f8a13a5fc20450bdb3a6af19d9d9d2542b5a94e631a9168"
        );
        // encodeData(Mail) third word = keccak(hashStruct(to[0])).
        assert_eq!(
            hex::encode(types.encode_field("Person[]", &doc["message"]["to"]).unwrap()),
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
        let enc = |ty: &str, v: Value| types.encode_field(ty, &v).map(hex::encode);
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
        let err = |doc: Value| hash_typed_data(&doc.to_string()).unwrap_err();
        assert!(hash_typed_data("{").unwrap_err().contains("not valid JSON"));
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
}
