//! What policies may name about an activity, read from the authority state: its approvers, the
//! wallet, account or private key its parameters touch, and the transaction it signs (decoded
//! with the organization's smart contract interfaces).

use coffer_chain::{abi::Abi, idl::Idl, Unsigned};
use coffer_policy::context::{ApproverFacts, OrganizationFacts, PrivateKeyFacts, TransactionFacts, WalletFacts};
use coffer_policy::eval::Val;
use serde_json::Value;

use crate::model::{Account, OrgState, PrivateKey, Wallet};

fn wallet_facts(w: &Wallet) -> WalletFacts {
    WalletFacts { id: w.id.clone(), label: w.label.clone(), imported: w.imported, exported: w.exported }
}

fn private_key_facts(k: &PrivateKey) -> PrivateKeyFacts {
    PrivateKeyFacts {
        id: k.id.clone(),
        label: k.label.clone(),
        tags: k.tags.clone(),
        imported: k.imported,
        exported: k.exported,
    }
}

/// What `signWith` names: a wallet account (by address), a private key (by address or id).
pub enum SignWith<'a> {
    Account(&'a Account),
    PrivateKey(&'a PrivateKey),
}

/// Resolves `signWith` as the gateway does: an account address, a private key's address, or a
/// private key id.
pub fn sign_with<'a>(state: &'a OrgState, sign_with: &str) -> Option<SignWith<'a>> {
    if sign_with.is_empty() {
        return None;
    }
    if let Some(a) = state.account_by_address(sign_with) {
        return Some(SignWith::Account(a));
    }
    state.private_key_by_address(sign_with).or_else(|| state.private_keys.get(sign_with)).map(SignWith::PrivateKey)
}

/// The facts of one activity's policies over `state`.
pub fn organization_facts(state: &OrgState, params: &Value, voters: &[String]) -> OrganizationFacts {
    let mut facts = OrganizationFacts::default();
    for id in voters {
        let Some(u) = state.users.get(id) else { continue };
        facts.approvers.push(ApproverFacts {
            id: u.id.clone(),
            tags: u.tag_ids.clone(),
            email: u.email.clone(),
            alias: u.name.clone(),
        });
    }
    let text = |k: &str| params.get(k).and_then(Value::as_str);
    let put_account = |facts: &mut OrganizationFacts, a: &Account| {
        facts.wallet = state.wallets.get(&a.wallet_id).map(wallet_facts).or(facts.wallet.take());
        facts.wallet_account = Some(a.address.clone());
    };
    let signing = text("signWith").and_then(|sw| sign_with(state, sw));
    let signer = signing.as_ref().and_then(ethereum_signer);
    match signing {
        Some(SignWith::Account(a)) => put_account(&mut facts, a),
        Some(SignWith::PrivateKey(k)) => facts.private_key = Some(private_key_facts(k)),
        None => {}
    }
    if let Some(a) = text("address").and_then(|address| state.account_by_address(address)) {
        put_account(&mut facts, a);
    }
    if let Some(w) = text("walletId").and_then(|id| state.wallets.get(id)) {
        facts.wallet = Some(wallet_facts(w));
    }
    if let Some(k) = text("privateKeyId").and_then(|id| state.private_keys.get(id)) {
        facts.private_key = Some(private_key_facts(k));
    }
    facts.transaction = transaction_facts(state, params, signer.as_deref());
    facts.payload = coffer_chain::payload_facts(params);
    if let Some(ids) = params.get("walletIds").and_then(Value::as_array) {
        let ws = ids.iter().filter_map(Value::as_str).filter_map(|id| state.wallets.get(id)).map(wallet_facts);
        facts.wallets = Some(ws.collect());
    }
    facts
}

/// The Ethereum address a `signWith` signs as, if it has one.
fn ethereum_signer(signing: &SignWith) -> Option<String> {
    match signing {
        SignWith::Account(a) => (a.address_format == "ADDRESS_FORMAT_ETHEREUM").then(|| a.address.clone()),
        SignWith::PrivateKey(k) => {
            k.addresses.iter().find(|e| e.format == "ADDRESS_FORMAT_ETHEREUM").map(|e| e.address.clone())
        }
    }
}

/// The facts of the transaction `params` carry, as [`organization_facts`] gives them, without the
/// organization's other facts (what a dry run shows).
pub fn signed_transaction_facts(state: &OrgState, params: &Value) -> Option<TransactionFacts> {
    let signing = params.get("signWith").and_then(Value::as_str).and_then(|sw| sign_with(state, sw));
    transaction_facts(state, params, signing.as_ref().and_then(ethereum_signer).as_deref())
}

const ETHEREUM_INTERFACE: &str = "SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM";
const SOLANA_INTERFACE: &str = "SMART_CONTRACT_INTERFACE_TYPE_SOLANA";

/// The interface of `interface_type` at `address` (Ethereum addresses compare lowercase).
fn interface<'a>(state: &'a OrgState, interface_type: &str, address: &str) -> Option<&'a str> {
    state
        .contract_interfaces
        .values()
        .find(|i| {
            i.interface_type == interface_type
                && if interface_type == ETHEREUM_INTERFACE {
                    i.address.eq_ignore_ascii_case(address)
                } else {
                    i.address == address
                }
        })
        .map(|i| i.body.as_str())
}

/// Most bytes of a transaction's facts shown as JSON (the dry run's `transaction`): the enclave
/// writes them within it, the gateway takes no more.
pub const MAX_SHOWN_TRANSACTION_BYTES: usize = 64 * 1024;

/// The facts of the transaction a `sign_transaction` intent carries (`None`: none, or it does
/// not parse). `signer`: the Ethereum address `signWith` resolved to.
pub fn transaction_facts(state: &OrgState, params: &Value, signer: Option<&str>) -> Option<TransactionFacts> {
    let text = |k: &str| params.get(k).and_then(Value::as_str);
    let (ty, unsigned) = (text("type")?, text("unsignedTransaction")?);
    let tx = coffer_chain::parse(ty, unsigned).ok()?;
    let root = tx.policy_root();
    let tx = match &tx {
        Unsigned::Ethereum(t) => {
            let mut f = t.facts();
            if let Some(from) = signer {
                f.insert("from".into(), Val::Str(from.to_ascii_lowercase()));
            }
            if let (Some(to), true) = (t.to(), t.data().len() >= 4) {
                if let Some(abi) = interface(state, ETHEREUM_INTERFACE, &to).and_then(|b| Abi::parse(b).ok()) {
                    f.extend(abi.call_facts(t.data()).unwrap_or_default());
                }
            }
            f
        }
        Unsigned::Solana(t) => {
            let mut f = t.facts();
            if state.contract_interfaces.values().any(|i| i.interface_type == SOLANA_INTERFACE) {
                if let Some(Val::List(list)) = f.get_mut("instructions") {
                    for ((ix, program), raw) in list.iter_mut().zip(t.program_keys()).zip(&t.instructions) {
                        let idl = interface(state, SOLANA_INTERFACE, &program).and_then(|b| Idl::parse(b).ok());
                        let parsed = idl.and_then(|idl| idl.instruction_facts(&raw.data));
                        if let (Val::Map(m), Some(p)) = (ix, parsed) {
                            m.insert("parsed_instruction_data".into(), Val::Map(p));
                        }
                    }
                }
            }
            f
        }
        Unsigned::Tron(t) => t.facts(),
    };
    Some(TransactionFacts { root, tx })
}
