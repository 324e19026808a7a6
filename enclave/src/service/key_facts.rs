//! The key facts the enclave records in authority state as it creates, imports and exports
//! keys (what policies name: wallets and their accounts' addresses, private keys, `exported`),
//! from the stamped body and its own results, never from the gateway's word.

use coffer_auth::envelope::{items, text};
use coffer_authority_state::model::{Account, AddressEntry, PrivateKey, Wallet};
use coffer_authority_state::{Change, Effect};
use coffer_proto::v1 as pb;

use crate::authority::{Authority, Authorized};
use crate::error::EnclaveError;

/// Applies `effects` to the stamped body's organization.
fn record(authority: &Authority, a: &Authorized, effects: Vec<Effect>) -> Result<(), EnclaveError> {
    let organization_id = &a.activity.organization_id;
    let changes: Vec<Change> =
        effects.into_iter().map(|effect| Change { organization_id: organization_id.clone(), effect }).collect();
    authority.rules().record(&changes)?;
    Ok(())
}

/// A wallet created or imported in the body's organization, with its accounts (the body's
/// `accounts`, in order, with the addresses the enclave derived).
pub(super) fn wallet_created(
    authority: &Authority,
    a: &Authorized,
    wallet_id: &str,
    imported: bool,
    made: &pb::CreateWalletResponse,
) -> Result<(), EnclaveError> {
    let p = &a.activity.parameters;
    let wallet = Wallet { id: wallet_id.into(), label: text(p, "walletName").into(), imported, exported: false };
    let accounts = accounts(wallet_id, items(p, "accounts"), &made.accounts);
    record(authority, a, vec![Effect::PutWallet { wallet }, Effect::PutAccounts { accounts }])
}

/// Accounts derived for a wallet of the body's organization.
pub(super) fn accounts_derived(
    authority: &Authority,
    a: &Authorized,
    wallet_id: &str,
    made: &[pb::Account],
) -> Result<(), EnclaveError> {
    let accounts = accounts(wallet_id, items(&a.activity.parameters, "accounts"), made);
    record(authority, a, vec![Effect::PutAccounts { accounts }])
}

fn accounts(wallet_id: &str, params: &[serde_json::Value], made: &[pb::Account]) -> Vec<Account> {
    made.iter()
        .zip(params)
        .map(|(m, p)| Account {
            id: m.account_id.clone(),
            wallet_id: wallet_id.into(),
            address: m.address.clone(),
            address_format: text(p, "addressFormat").into(),
            exported: false,
        })
        .collect()
}

/// A private key created (`params`: its entry of the body) or imported (the body itself).
pub(super) fn private_key_made(
    authority: &Authority,
    a: &Authorized,
    id: &str,
    params: &serde_json::Value,
    imported: bool,
    made: &pb::KeyMaterial,
) -> Result<(), EnclaveError> {
    let private_key = PrivateKey {
        id: id.into(),
        label: text(params, "privateKeyName").into(),
        tags: items(params, "privateKeyTags").iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
        imported,
        exported: false,
        addresses: made
            .addresses
            .iter()
            .map(|x| AddressEntry { format: x.format.clone(), address: x.address.clone() })
            .collect(),
    };
    record(authority, a, vec![Effect::PutPrivateKey { private_key }])
}

/// A wallet's mnemonic or a key left the enclave: policies see `exported` from now on.
pub(super) fn exported(
    authority: &Authority,
    a: &Authorized,
    wallet_id: Option<&str>,
    private_key_id: Option<&str>,
) -> Result<(), EnclaveError> {
    let Some(loaded) = authority.rules().load(&a.activity.organization_id)? else { return Ok(()) };
    let mut effects = Vec::new();
    if let Some(w) = wallet_id.and_then(|id| loaded.state.wallets.get(id)) {
        effects.push(Effect::PutWallet { wallet: Wallet { exported: true, ..w.clone() } });
    }
    if let Some(k) = private_key_id.and_then(|id| loaded.state.private_keys.get(id)) {
        effects.push(Effect::PutPrivateKey { private_key: PrivateKey { exported: true, ..k.clone() } });
    }
    if effects.is_empty() {
        return Ok(());
    }
    record(authority, a, effects)
}
