//! Solana transactions (legacy and v0 messages with their signature slots), as `@turnkey/solana`
//! sends them: parse strictly, find the signer's slot, write its Ed25519 signature. The wire
//! format is small and fixed, and the Solana SDK crates are far heavier than this parser, so it
//! is written here (with a property test in `tests`).

use coffer_policy::eval::Val;

use crate::error::TxError;
use crate::facts::{text, uint, Facts};

pub const SYSTEM_PROGRAM: &str = "11111111111111111111111111111111";
pub const TOKEN_PROGRAM: &str = "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA";
pub const TOKEN_2022_PROGRAM: &str = "TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb";

/// One instruction: its program (an index into the static keys), account indexes (into the
/// static keys, then the lookup tables' writable and read-only entries) and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    pub program: u8,
    pub accounts: Vec<u8>,
    pub data: Vec<u8>,
}

/// An address lookup table a v0 message loads accounts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub table: [u8; 32],
    pub writable: Vec<u8>,
    pub readonly: Vec<u8>,
}

/// A parsed transaction; `message` is the exact bytes the signatures cover.
#[derive(Debug, Clone)]
pub struct SolanaTx {
    signatures: Vec<[u8; 64]>,
    message: Vec<u8>,
    pub version: Option<u8>,
    pub required_signatures: u8,
    pub readonly_signed: u8,
    pub readonly_unsigned: u8,
    pub account_keys: Vec<[u8; 32]>,
    pub recent_blockhash: [u8; 32],
    pub instructions: Vec<Instruction>,
    pub lookups: Vec<Lookup>,
}

fn invalid(reason: impl std::fmt::Display) -> TxError {
    TxError(format!("unsignedTransaction: {reason}"))
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], TxError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let end = end.ok_or_else(|| invalid(format_args!("truncated in {what}")))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, TxError> {
        Ok(self.take(1, what)?[0])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], TxError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// Solana's compact-u16 ("shortvec"): 1 to 3 bytes, 7 bits each, canonical only.
    fn compact_u16(&mut self, what: &str) -> Result<usize, TxError> {
        let mut value = 0usize;
        for i in 0..3 {
            let b = self.u8(what)?;
            value |= usize::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if i > 0 && b == 0 {
                    return Err(invalid(format_args!("{what}: non-canonical length")));
                }
                if value > usize::from(u16::MAX) {
                    return Err(invalid(format_args!("{what}: length does not fit in 16 bits")));
                }
                return Ok(value);
            }
            if i == 2 {
                break;
            }
        }
        Err(invalid(format_args!("{what}: length does not fit in 16 bits")))
    }

    fn bytes(&mut self, what: &str) -> Result<Vec<u8>, TxError> {
        let n = self.compact_u16(what)?;
        Ok(self.take(n, what)?.to_vec())
    }
}

/// Parses a serialized transaction: signature slots, then a legacy or v0 message. The slot count
/// must equal the message's required signatures, every index must point at an account, and
/// nothing may follow the message.
pub fn parse(bytes: &[u8]) -> Result<SolanaTx, TxError> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let slots = r.compact_u16("signatures")?;
    let mut signatures = Vec::with_capacity(slots.min(256));
    for _ in 0..slots {
        signatures.push(r.array::<64>("signatures")?);
    }
    let message_start = r.pos;
    let first = r.u8("message header")?;
    let (version, required_signatures) = if first & 0x80 != 0 {
        let v = first & 0x7f;
        if v != 0 {
            return Err(invalid(format_args!("message version {v} is not supported (legacy and v0 are)")));
        }
        (Some(0), r.u8("message header")?)
    } else {
        (None, first)
    };
    let readonly_signed = r.u8("message header")?;
    let readonly_unsigned = r.u8("message header")?;
    let n_keys = r.compact_u16("accountKeys")?;
    let mut account_keys = Vec::with_capacity(n_keys.min(256));
    for _ in 0..n_keys {
        account_keys.push(r.array::<32>("accountKeys")?);
    }
    let recent_blockhash = r.array::<32>("recentBlockhash")?;
    let n_ix = r.compact_u16("instructions")?;
    let mut instructions = Vec::with_capacity(n_ix.min(256));
    for _ in 0..n_ix {
        let program = r.u8("instructions")?;
        let accounts = r.bytes("instructions")?;
        let data = r.bytes("instructions")?;
        instructions.push(Instruction { program, accounts, data });
    }
    let mut lookups = Vec::new();
    if version.is_some() {
        let n = r.compact_u16("addressTableLookups")?;
        for _ in 0..n {
            let table = r.array::<32>("addressTableLookups")?;
            let writable = r.bytes("addressTableLookups")?;
            let readonly = r.bytes("addressTableLookups")?;
            lookups.push(Lookup { table, writable, readonly });
        }
    }
    if r.pos != bytes.len() {
        return Err(invalid(format_args!("{} trailing bytes after the message", bytes.len() - r.pos)));
    }
    let tx = SolanaTx {
        signatures,
        message: bytes[message_start..].to_vec(),
        version,
        required_signatures,
        readonly_signed,
        readonly_unsigned,
        account_keys,
        recent_blockhash,
        instructions,
        lookups,
    };
    tx.check()?;
    Ok(tx)
}

impl SolanaTx {
    fn check(&self) -> Result<(), TxError> {
        let required = usize::from(self.required_signatures);
        if required == 0 {
            return Err(invalid("the message requires no signer"));
        }
        if self.signatures.len() != required {
            return Err(invalid(format_args!(
                "signatures: {} slots, but the message requires {required} signatures",
                self.signatures.len()
            )));
        }
        let keys = self.account_keys.len();
        if required > keys {
            return Err(invalid(format_args!("header: {required} required signatures but only {keys} account keys")));
        }
        if usize::from(self.readonly_signed) >= required {
            return Err(invalid("header: every signer is read-only (the fee payer must be writable)"));
        }
        if usize::from(self.readonly_unsigned) > keys - required {
            return Err(invalid("header: more read-only unsigned accounts than unsigned account keys"));
        }
        let loaded: usize = self.lookups.iter().map(|l| l.writable.len() + l.readonly.len()).sum();
        for (i, ix) in self.instructions.iter().enumerate() {
            if usize::from(ix.program) >= keys {
                return Err(invalid(format_args!(
                    "instructions[{i}]: program index {} is not an account key",
                    ix.program
                )));
            }
            if let Some(a) = ix.accounts.iter().find(|a| usize::from(**a) >= keys + loaded) {
                return Err(invalid(format_args!("instructions[{i}]: account index {a} is out of range")));
            }
        }
        Ok(())
    }

    /// The exact message bytes the signatures cover.
    pub fn message(&self) -> &[u8] {
        &self.message
    }

    /// The slot of `public_key` among the required signers.
    pub fn signer_slot(&self, public_key: &[u8]) -> Result<usize, TxError> {
        self.account_keys[..usize::from(self.required_signatures)]
            .iter()
            .position(|k| k.as_slice() == public_key)
            .ok_or_else(|| TxError::new("signWith is not a required signer of this Solana transaction"))
    }

    /// The serialized transaction with `signature` in `slot`, every other slot as given.
    pub fn signed(&self, slot: usize, signature: &[u8; 64]) -> Vec<u8> {
        let mut out = Vec::with_capacity(3 + 64 * self.signatures.len() + self.message.len());
        let mut n = self.signatures.len();
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        for (i, s) in self.signatures.iter().enumerate() {
            out.extend_from_slice(if i == slot { signature } else { s });
        }
        out.extend_from_slice(&self.message);
        out
    }

    fn key(&self, index: u8) -> Option<String> {
        self.account_keys.get(usize::from(index)).map(|k| bs58::encode(k).into_string())
    }

    fn is_signer(&self, index: u8) -> bool {
        index < self.required_signatures
    }

    fn is_writable(&self, index: u8) -> bool {
        let (i, keys) = (usize::from(index), self.account_keys.len());
        let (required, ro_signed, ro_unsigned) = (
            usize::from(self.required_signatures),
            usize::from(self.readonly_signed),
            usize::from(self.readonly_unsigned),
        );
        if i < required {
            i < required - ro_signed
        } else if i < keys {
            i < keys - ro_unsigned
        } else {
            // Loaded from a lookup table: writable entries come before read-only ones.
            let mut at = i - keys;
            for l in &self.lookups {
                if at < l.writable.len() {
                    return true;
                }
                at -= l.writable.len();
            }
            false
        }
    }

    /// The base58 program key of each instruction, in order.
    pub fn program_keys(&self) -> Vec<String> {
        self.instructions.iter().map(|ix| self.key(ix.program).unwrap_or_default()).collect()
    }

    /// `solana.tx` without what an IDL adds (spec 12.4): keys are base58, amounts numbers.
    /// Accounts a v0 message loads from a lookup table cannot be named offline: their
    /// `account_key` is empty and `address_table_lookups` lists the tables.
    pub fn facts(&self) -> Facts {
        let mut f = Facts::new();
        let keys: Vec<Val> = self.account_keys.iter().map(|k| text(bs58::encode(k).into_string())).collect();
        f.insert("account_keys".into(), Val::List(keys));
        let mut programs: Vec<String> = Vec::new();
        for p in self.program_keys() {
            if !programs.contains(&p) {
                programs.push(p);
            }
        }
        f.insert("program_keys".into(), Val::List(programs.into_iter().map(text).collect()));
        f.insert("recent_blockhash".into(), text(bs58::encode(self.recent_blockhash).into_string()));
        let (mut transfers, mut spl) = (Vec::new(), Vec::new());
        let instructions = self
            .instructions
            .iter()
            .map(|ix| {
                let program = self.key(ix.program).unwrap_or_default();
                let account = |n: usize| ix.accounts.get(n).and_then(|a| self.key(*a)).unwrap_or_default();
                if let Some(t) = system_transfer(&program, &ix.data, ix.accounts.len()) {
                    let mut m = Facts::new();
                    m.insert("from".into(), text(account(0)));
                    m.insert("to".into(), text(account(1)));
                    m.insert("amount".into(), uint(t));
                    transfers.push(Val::Map(m));
                }
                if let Some((amount, checked)) = token_transfer(&program, &ix.data, ix.accounts.len()) {
                    let mut m = Facts::new();
                    m.insert("amount".into(), uint(amount));
                    m.insert("from".into(), text(account(0)));
                    if checked {
                        m.insert("mint".into(), text(account(1)));
                        m.insert("to".into(), text(account(2)));
                        m.insert("owner".into(), text(account(3)));
                    } else {
                        m.insert("to".into(), text(account(1)));
                        m.insert("owner".into(), text(account(2)));
                    }
                    spl.push(Val::Map(m));
                }
                let accounts = ix
                    .accounts
                    .iter()
                    .map(|a| {
                        let mut m = Facts::new();
                        m.insert("account_key".into(), text(self.key(*a).unwrap_or_default()));
                        m.insert("signer".into(), Val::Bool(self.is_signer(*a)));
                        m.insert("writable".into(), Val::Bool(self.is_writable(*a)));
                        Val::Map(m)
                    })
                    .collect();
                let mut m = Facts::new();
                m.insert("program_key".into(), text(program));
                m.insert("accounts".into(), Val::List(accounts));
                m.insert("instruction_data_hex".into(), text(hex::encode(&ix.data)));
                Val::Map(m)
            })
            .collect();
        f.insert("instructions".into(), Val::List(instructions));
        f.insert("transfers".into(), Val::List(transfers));
        f.insert("spl_transfers".into(), Val::List(spl));
        let lookups = self
            .lookups
            .iter()
            .map(|l| {
                let mut m = Facts::new();
                m.insert("address_table_key".into(), text(bs58::encode(l.table).into_string()));
                m.insert("writable_indexes".into(), Val::List(l.writable.iter().map(uint).collect()));
                m.insert("readonly_indexes".into(), Val::List(l.readonly.iter().map(uint).collect()));
                Val::Map(m)
            })
            .collect();
        f.insert("address_table_lookups".into(), Val::List(lookups));
        f
    }
}

/// A System Program `Transfer` (instruction 2, u64 lamports; accounts from, to).
fn system_transfer(program: &str, data: &[u8], accounts: usize) -> Option<u64> {
    if program != SYSTEM_PROGRAM || data.len() != 12 || data[..4] != [2, 0, 0, 0] || accounts < 2 {
        return None;
    }
    Some(u64::from_le_bytes(data[4..12].try_into().ok()?))
}

/// An SPL Token (or Token-2022) `Transfer` (3: u64; source, destination, owner) or
/// `TransferChecked` (12: u64, u8 decimals; source, mint, destination, owner): the amount and
/// whether it is the checked form.
fn token_transfer(program: &str, data: &[u8], accounts: usize) -> Option<(u64, bool)> {
    if program != TOKEN_PROGRAM && program != TOKEN_2022_PROGRAM {
        return None;
    }
    let amount = || Some(u64::from_le_bytes(data.get(1..9)?.try_into().ok()?));
    match (data.first(), data.len()) {
        (Some(3), 9) if accounts >= 3 => Some((amount()?, false)),
        (Some(12), 10) if accounts >= 4 => Some((amount()?, true)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
