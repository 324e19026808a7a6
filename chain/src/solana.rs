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

/// The most bytes a serialized transaction (signature slots and message) may have: the network's
/// packet size (`PACKET_DATA_SIZE`, 1,280-byte IPv6 MTU less 48 bytes of headers), which no
/// validator accepts a transaction over. Refused before anything is decoded, so the facts of a
/// transaction never describe more than 1,232 bytes (at most ~1,200 account references).
pub const MAX_TRANSACTION_BYTES: usize = 1232;

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

/// A transaction over [`MAX_TRANSACTION_BYTES`], naming the limit.
pub(crate) fn too_large(bytes: usize) -> TxError {
    invalid(format_args!(
        "a Solana transaction is at most {MAX_TRANSACTION_BYTES} bytes (the network's packet size), this one is {bytes}"
    ))
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
    if bytes.len() > MAX_TRANSACTION_BYTES {
        return Err(too_large(bytes.len()));
    }
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
        self.value_moves()?;
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

    /// The base58 key of account `index`, or `None` when the account is loaded from an address
    /// lookup table (a v0 message): the table's contents are on chain, not in the message.
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

    /// Every System, SPL Token and Token-2022 instruction that moves value, decoded as the
    /// programs do; an instruction of one of those kinds that the program would refuse (data
    /// shorter than its layout, too few accounts) is an error naming it.
    fn value_moves(&self) -> Result<Vec<(usize, Move)>, TxError> {
        let mut out = Vec::new();
        for (i, ix) in self.instructions.iter().enumerate() {
            let program = self.key(ix.program).unwrap_or_default();
            let decoded = match program.as_str() {
                SYSTEM_PROGRAM => system_move(&ix.data, ix.accounts.len()).map(|m| m.into_iter().collect()),
                TOKEN_PROGRAM if ix.data.first() == Some(&TOKEN_BATCH) => token_batch(&ix.data[1..], ix.accounts.len()),
                TOKEN_PROGRAM => token_move(&ix.data, ix.accounts.len(), false).map(|m| m.into_iter().collect()),
                TOKEN_2022_PROGRAM => token_move(&ix.data, ix.accounts.len(), true).map(|m| m.into_iter().collect()),
                _ => Ok(Vec::new()),
            };
            match decoded {
                Ok(moves) => out.extend(moves.into_iter().map(|m| (i, m))),
                Err(reason) => return Err(invalid(format_args!("instructions[{i}]: {reason}"))),
            }
        }
        Ok(out)
    }

    /// `solana.tx` without what an IDL adds (spec 12.4): keys are base58, amounts numbers.
    /// Accounts a v0 message loads from a lookup table cannot be named offline: their
    /// `account_key` is absent (and `address_table_key` / `address_table_index` say where they
    /// come from), and so is a transfer's `from` / `to` / `owner` / `mint` naming one, with
    /// `<field>_known: false`; a policy that reads the missing field gets an evaluation error.
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
        // `parse` refused every transaction whose value moves do not decode.
        for (i, m) in self.value_moves().unwrap_or_default() {
            let ix = &self.instructions[i];
            let mut e = Facts::new();
            e.insert("kind".into(), text(m.kind));
            e.insert("instruction_index".into(), uint(i));
            e.insert("amount".into(), uint(m.amount));
            if let Some(fee) = m.fee {
                e.insert("fee".into(), uint(fee));
            }
            for (name, position) in m.accounts {
                let known = self.key(ix.accounts[m.first_account + position]);
                e.insert(format!("{name}_known"), Val::Bool(known.is_some()));
                if let Some(k) = known {
                    e.insert((*name).into(), text(k));
                }
            }
            if m.token {
                spl.push(Val::Map(e));
            } else {
                transfers.push(Val::Map(e));
            }
        }
        let instructions = self
            .instructions
            .iter()
            .map(|ix| {
                let program = self.key(ix.program).unwrap_or_default();
                let accounts = ix
                    .accounts
                    .iter()
                    .map(|a| {
                        let mut m = Facts::new();
                        match self.key(*a) {
                            Some(k) => {
                                m.insert("account_key".into(), text(k));
                            }
                            None => {
                                if let Some((table, index)) = self.loaded_from(*a) {
                                    m.insert("address_table_key".into(), text(table));
                                    m.insert("address_table_index".into(), uint(index));
                                }
                            }
                        }
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

    /// The lookup table (base58) and the index in it of an account a v0 message loads: the
    /// runtime appends every table's writable entries, then every table's read-only entries.
    fn loaded_from(&self, index: u8) -> Option<(String, u8)> {
        let mut at = usize::from(index).checked_sub(self.account_keys.len())?;
        for pass in [true, false] {
            for l in &self.lookups {
                let entries = if pass { &l.writable } else { &l.readonly };
                if at < entries.len() {
                    return Some((bs58::encode(l.table).into_string(), entries[at]));
                }
                at -= entries.len();
            }
        }
        None
    }
}

/// One instruction that moves value: lamports (System) or token base units (SPL Token,
/// Token-2022), and where each named account is among the instruction's accounts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Move {
    kind: &'static str,
    token: bool,
    amount: u64,
    fee: Option<u64>,
    /// The accounts' positions count from this instruction account (not 0 inside a batch).
    first_account: usize,
    accounts: &'static [(&'static str, usize)],
}

/// The Pinocchio rewrite of SPL Token (p-token) runs a `Batch` (tag 255): instructions of its
/// own, each `[account count: u8][data length: u8][data]`, taking the instruction's accounts in
/// turn. SPL Token refuses the tag, p-token executes it, so its transfers are reported.
const TOKEN_BATCH: u8 = 255;

/// The transfers of a p-token `Batch` (its data after the tag), decoded as p-token does; a batch
/// it would refuse is an error.
fn token_batch(mut data: &[u8], accounts: usize) -> Result<Vec<Move>, String> {
    let (mut out, mut first_account) = (Vec::new(), 0usize);
    loop {
        let [count, len, rest @ ..] = data else {
            return Err("token Batch: an instruction header is cut short, the program would refuse it".into());
        };
        let (count, len) = (usize::from(*count), usize::from(*len));
        if rest.len() < len || accounts - first_account < count {
            return Err(
                "token Batch: an instruction runs past the data or the accounts, the program would refuse it".into()
            );
        }
        if let Some(mut m) = token_move(&rest[..len], count, false).map_err(|e| format!("token Batch: {e}"))? {
            m.first_account = first_account;
            out.push(m);
        }
        first_account += count;
        data = &rest[len..];
        if data.is_empty() {
            return Ok(out);
        }
    }
}

fn le_u64(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

/// The end of a bincode `String` (u64 length, then UTF-8 bytes) starting at `at`, if it is
/// there and valid (bincode refuses invalid UTF-8).
fn bincode_string_end(data: &[u8], at: usize) -> Option<usize> {
    let len = usize::try_from(le_u64(data, at)?).ok()?;
    let end = at.checked_add(8)?.checked_add(len)?;
    std::str::from_utf8(data.get(at + 8..end)?).ok()?;
    Some(end)
}

/// A System program instruction that moves lamports, decoded as the runtime does: bincode with
/// a u32 little-endian variant index, fixed-width little-endian integers, trailing bytes
/// accepted (`limited_deserialize`); the account positions are the processor's. `Ok(None)` for
/// every other instruction (none moves lamports); an error for one of these the runtime would
/// refuse before moving anything (it fails the whole transaction).
fn system_move(data: &[u8], accounts: usize) -> Result<Option<Move>, String> {
    const FROM_TO: &[(&str, usize)] = &[("from", 0), ("to", 1)];
    let Some(tag) = data.get(..4) else { return Ok(None) };
    let tag = u32::from_le_bytes(tag.try_into().expect("4 bytes"));
    // (name, accounts the processor requires, lamports' offset, the layout's end, accounts)
    let (kind, min_accounts, lamports, end, named): (_, _, _, Option<usize>, &'static [(&str, usize)]) = match tag {
        // CreateAccount { lamports: u64, space: u64, owner: Pubkey }; [funding, new account]
        0 => ("CreateAccount", 2, 4, Some(4 + 8 + 8 + 32), FROM_TO),
        // Transfer { lamports: u64 }; [from, to]
        2 => ("Transfer", 2, 4, Some(4 + 8), FROM_TO),
        // CreateAccountWithSeed { base: Pubkey, seed: String, lamports, space, owner };
        // [funding, new account, (base)]
        3 => {
            let end = bincode_string_end(data, 4 + 32).map(|s| s + 8 + 8 + 32);
            ("CreateAccountWithSeed", 2, end.map_or(usize::MAX, |e| e - 48), end, FROM_TO)
        }
        // WithdrawNonceAccount(u64); [nonce account, recipient, RecentBlockhashes, Rent,
        // nonce authority]: the processor reads the sysvars at 2 and 3.
        5 => ("WithdrawNonceAccount", 4, 4, Some(4 + 8), FROM_TO),
        // TransferWithSeed { lamports: u64, from_seed: String, from_owner: Pubkey };
        // [funding (derived), base, to]
        11 => {
            let end = bincode_string_end(data, 4 + 8).map(|s| s + 32);
            ("TransferWithSeed", 3, 4, end, &[("from", 0), ("to", 2)])
        }
        // CreateAccountAllowPrefund { lamports, space, owner }; [new account, (funding)]: the
        // funding account moves `lamports` to the new one when they are not 0.
        13 => ("CreateAccountAllowPrefund", 2, 4, Some(4 + 8 + 8 + 32), &[("from", 1), ("to", 0)]),
        _ => return Ok(None),
    };
    let Some(end) = end.filter(|e| *e <= data.len()) else {
        return Err(format!(
            "System {kind}: the instruction data ({} bytes) is shorter than its layout, the runtime would refuse it",
            data.len()
        ));
    };
    let amount = le_u64(&data[..end], lamports).expect("within the layout");
    if kind == "CreateAccountAllowPrefund" && amount == 0 {
        return Ok(None);
    }
    if accounts < min_accounts {
        return Err(format!("System {kind}: {accounts} accounts, the runtime requires {min_accounts}"));
    }
    Ok(Some(Move { kind, token: false, amount, fee: None, first_account: 0, accounts: named }))
}

/// An SPL Token or Token-2022 instruction that moves tokens, decoded as the token program's
/// `unpack` does: a one-byte tag, little-endian integers, trailing bytes accepted (SPL Token and
/// Token-2022 ignore them; the Pinocchio rewrite of SPL Token refuses them, so reporting the
/// transfer is the superset). `Transfer` (3: u64; [source, destination, owner]),
/// `TransferChecked` (12: u64, u8 decimals; [source, mint, destination, owner]) and, in
/// Token-2022, `TransferFeeExtension` (26) / `TransferCheckedWithFee` (1: u64, u8, u64 fee; as
/// `TransferChecked`).
fn token_move(data: &[u8], accounts: usize, token_2022: bool) -> Result<Option<Move>, String> {
    const PLAIN: &[(&str, usize)] = &[("from", 0), ("to", 1), ("owner", 2)];
    const CHECKED: &[(&str, usize)] = &[("from", 0), ("mint", 1), ("to", 2), ("owner", 3)];
    let (kind, amount_at, end, fee_at, named) = match (data.first(), data.get(1)) {
        (Some(3), _) => ("Transfer", 1, 1 + 8, None, PLAIN),
        (Some(12), _) => ("TransferChecked", 1, 1 + 8 + 1, None, CHECKED),
        (Some(26), Some(1)) if token_2022 => ("TransferCheckedWithFee", 2, 2 + 8 + 1 + 8, Some(2 + 8 + 1), CHECKED),
        _ => return Ok(None),
    };
    if data.len() < end {
        return Err(format!(
            "token {kind}: the instruction data ({} bytes) is shorter than its layout ({end}), the program would refuse it",
            data.len()
        ));
    }
    let min_accounts = named.len();
    if accounts < min_accounts {
        return Err(format!("token {kind}: {accounts} accounts, the program requires {min_accounts}"));
    }
    let amount = le_u64(data, amount_at).expect("within the layout");
    let fee = fee_at.map(|at| le_u64(data, at).expect("within the layout"));
    Ok(Some(Move { kind, token: true, amount, fee, first_account: 0, accounts: named }))
}

#[cfg(test)]
mod tests;
