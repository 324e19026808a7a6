//! Solana instructions decoded with an uploaded Anchor IDL: the instruction is found by its
//! 8-byte discriminator (given in the IDL since Anchor 0.30, else SHA-256 of
//! `global:<snake_case name>`), and its Borsh arguments are decoded by name. No maintained crate
//! decodes Anchor IDLs without pulling in the Solana SDK, so this is written here; it decodes the
//! primitive, `pubkey`, `string`, `bytes`, `option`, `vec` and `array` argument types and stops at
//! the first argument of another type (user-defined types), leaving the rest out.

use coffer_policy::eval::Val;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::TxError;
use crate::facts::{text, uint, Facts};

#[derive(Debug, Clone)]
struct IdlInstruction {
    name: String,
    discriminator: [u8; 8],
    args: Vec<(String, Value)>,
}

/// A parsed IDL, kept by the caller across evaluations.
#[derive(Debug, Clone)]
pub struct Idl {
    instructions: Vec<IdlInstruction>,
}

fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

impl Idl {
    pub fn parse(json: &str) -> Result<Self, TxError> {
        let bad = |why: &str| TxError(format!("not a valid Anchor IDL: {why}"));
        let v: Value = serde_json::from_str(json).map_err(|e| TxError(format!("not a valid Anchor IDL: {e}")))?;
        let list = v.get("instructions").and_then(Value::as_array).ok_or_else(|| bad("no instructions list"))?;
        let mut instructions = Vec::with_capacity(list.len());
        for ix in list {
            let name = ix.get("name").and_then(Value::as_str).ok_or_else(|| bad("an instruction has no name"))?;
            let discriminator = match ix.get("discriminator").and_then(Value::as_array) {
                Some(d) => {
                    let bytes: Vec<u8> =
                        d.iter().filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok())).collect();
                    bytes.try_into().map_err(|_| bad("a discriminator is not 8 bytes"))?
                }
                None => {
                    let digest = Sha256::digest(format!("global:{}", snake_case(name)));
                    let mut d = [0u8; 8];
                    d.copy_from_slice(&digest[..8]);
                    d
                }
            };
            let args = ix
                .get("args")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|arg| {
                            let n = arg.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
                            (n, arg.get("type").cloned().unwrap_or(Value::Null))
                        })
                        .collect()
                })
                .unwrap_or_default();
            instructions.push(IdlInstruction { name: name.to_string(), discriminator, args });
        }
        Ok(Idl { instructions })
    }

    /// `parsed_instruction_data` of one instruction: `instruction_name` and `program_call_args`,
    /// or nothing when no instruction of the IDL has the data's discriminator.
    pub fn instruction_facts(&self, data: &[u8]) -> Option<Facts> {
        let ix = self.instructions.iter().find(|i| data.get(..8) == Some(i.discriminator.as_slice()))?;
        let mut r = &data[8..];
        let mut args = Facts::new();
        for (name, ty) in &ix.args {
            match decode(ty, &mut r, 0) {
                Some(v) => {
                    args.insert(name.clone(), v);
                }
                None => break,
            }
        }
        let mut f = Facts::new();
        f.insert("instruction_name".into(), text(ix.name.clone()));
        f.insert("program_call_args".into(), Val::Map(args));
        Some(f)
    }
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if r.len() < n {
        return None;
    }
    let (head, tail) = r.split_at(n);
    *r = tail;
    Some(head)
}

/// Most nested `option`/`vec`/`array` levels decoded, and most items one `vec` may claim.
const MAX_DEPTH: usize = 8;
const MAX_ITEMS: usize = 4096;

fn decode(ty: &Value, r: &mut &[u8], depth: usize) -> Option<Val> {
    if depth > MAX_DEPTH {
        return None;
    }
    let le = |b: &[u8]| {
        let mut x = [0u8; 16];
        x[..b.len()].copy_from_slice(b);
        u128::from_le_bytes(x)
    };
    if let Some(name) = ty.as_str() {
        return Some(match name {
            "bool" => match take(r, 1)?[0] {
                0 => Val::Bool(false),
                1 => Val::Bool(true),
                _ => return None,
            },
            "u8" | "u16" | "u32" | "u64" | "u128" => {
                let n = name[1..].parse::<usize>().ok()? / 8;
                uint(le(take(r, n)?))
            }
            "i8" | "i16" | "i32" | "i64" | "i128" => {
                let n = name[1..].parse::<usize>().ok()? / 8;
                let raw = le(take(r, n)?);
                let shift = 128 - 8 * n as u32;
                Val::Int(((raw << shift) as i128) >> shift)
            }
            "pubkey" | "publicKey" => text(bs58::encode(take(r, 32)?).into_string()),
            "string" => {
                let n = u32::from_le_bytes(take(r, 4)?.try_into().ok()?) as usize;
                text(std::str::from_utf8(take(r, n)?).ok()?.to_string())
            }
            "bytes" => {
                let n = u32::from_le_bytes(take(r, 4)?.try_into().ok()?) as usize;
                text(hex::encode(take(r, n)?))
            }
            _ => return None,
        });
    }
    if let Some(inner) = ty.get("option") {
        return match take(r, 1)?[0] {
            0 => Some(Val::Null),
            1 => decode(inner, r, depth + 1),
            _ => None,
        };
    }
    let (inner, count) = if let Some(inner) = ty.get("vec") {
        (inner, u32::from_le_bytes(take(r, 4)?.try_into().ok()?) as usize)
    } else if let Some([inner, n]) = ty.get("array").and_then(Value::as_array).map(Vec::as_slice) {
        (inner, usize::try_from(n.as_u64()?).ok()?)
    } else {
        return None;
    };
    if count > MAX_ITEMS || count > r.len() {
        return None;
    }
    let items = (0..count).map(|_| decode(inner, r, depth + 1)).collect::<Option<Vec<_>>>()?;
    Some(Val::List(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_found_by_discriminator_and_arguments_decoded() {
        let idl = Idl::parse(
            r#"{"instructions":[
                {"name":"depositFunds","args":[{"name":"amount","type":"u64"},{"name":"memo","type":"string"},
                  {"name":"delta","type":"i32"},{"name":"to","type":"pubkey"},{"name":"flags","type":{"vec":"bool"}},
                  {"name":"extra","type":{"option":"u8"}},{"name":"custom","type":{"defined":{"name":"X"}}},
                  {"name":"after","type":"u8"}]},
                {"name":"withdraw","discriminator":[1,2,3,4,5,6,7,8],"args":[]}]}"#,
        )
        .unwrap();
        let disc = &Sha256::digest(b"global:deposit_funds")[..8];
        let mut data = disc.to_vec();
        data.extend_from_slice(&500u64.to_le_bytes());
        data.extend_from_slice(&2u32.to_le_bytes());
        data.extend_from_slice(b"hi");
        data.extend_from_slice(&(-7i32).to_le_bytes());
        data.extend_from_slice(&[9u8; 32]);
        data.extend_from_slice(&2u32.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        data.extend_from_slice(&[1, 42]);
        data.extend_from_slice(&[0xee; 4]);
        let f = idl.instruction_facts(&data).unwrap();
        assert_eq!(f["instruction_name"], Val::Str("depositFunds".into()));
        let Val::Map(args) = &f["program_call_args"] else { panic!("args are a map") };
        assert_eq!(args["amount"], Val::Int(500));
        assert_eq!(args["memo"], Val::Str("hi".into()));
        assert_eq!(args["delta"], Val::Int(-7));
        assert_eq!(args["to"], Val::Str(bs58::encode([9u8; 32]).into_string()));
        assert_eq!(args["flags"], Val::List(vec![Val::Bool(true), Val::Bool(false)]));
        assert_eq!(args["extra"], Val::Int(42));
        assert!(!args.contains_key("custom") && !args.contains_key("after"), "decoding stops at a defined type");
        let w = idl.instruction_facts(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(w["instruction_name"], Val::Str("withdraw".into()));
        assert!(idl.instruction_facts(&[0; 8]).is_none());
        assert!(idl.instruction_facts(&[1, 2, 3]).is_none());
    }

    #[test]
    fn hostile_lengths_decode_nothing() {
        let idl = Idl::parse(r#"{"instructions":[{"name":"a","discriminator":[0,0,0,0,0,0,0,0],"args":[{"name":"v","type":{"vec":{"vec":"u8"}}}]}]}"#).unwrap();
        let mut data = vec![0u8; 8];
        data.extend_from_slice(&u32::MAX.to_le_bytes());
        let f = idl.instruction_facts(&data).unwrap();
        let Val::Map(args) = &f["program_call_args"] else { panic!("args are a map") };
        assert!(args.is_empty());
        assert!(Idl::parse("[]").is_err());
    }
}
