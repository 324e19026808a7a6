//! The key facts the enclave records in authority state as it creates, imports and exports
//! keys (what policies name: wallets and their accounts' addresses, private keys, `exported`),
//! from the stamped body and its own results, never from the gateway's word.

use coffer_auth::envelope::{items, text};
use coffer_org_rules::model::{Account, AddressEntry, PrivateKey, Wallet};
use coffer_org_rules::{Change, Effect};
use coffer_proto::v1 as pb;

use crate::admission::{refuse, Admission, Admitted};
use crate::error::{EnclaveError, RefusalReason};

/// Applies `effects` to the stamped body's organization.
fn record(admission: &Admission, a: &Admitted, effects: Vec<Effect>) -> Result<(), EnclaveError> {
    let organization_id = &a.activity.organization_id;
    let changes: Vec<Change> =
        effects.into_iter().map(|effect| Change { organization_id: organization_id.clone(), effect }).collect();
    admission.rules().record_made(&changes)?;
    Ok(())
}

/// Refuses the ids the gateway chose for new wallets, accounts and private keys unless each is
/// new: named once in the call and never a wallet's, account's or private key's of
/// `organization_id` (the state the facts go to, which remembers deleted ones), and the state
/// with them within its caps (its weight). Checked before anything is sealed, proved or recorded;
/// recording checks again
/// ([`coffer_org_rules::Effect::PutWallet`] and the others never replace a key), so a call
/// that raced another with the same id is refused there.
pub(super) fn ensure_new_ids(
    admission: &Admission,
    a: &Admitted,
    organization_id: &str,
    ids: &[&str],
) -> Result<(), EnclaveError> {
    if ids.iter().any(|id| id.is_empty() || id.len() > 128) {
        return Err(EnclaveError::invalid("a new key id must be 1 to 128 characters"));
    }
    if ids.iter().enumerate().any(|(n, id)| ids[..n].contains(id)) {
        return Err(refuse(a, RefusalReason::BindingMismatch, "the call names one new key id twice"));
    }
    if let Some(loaded) = admission.rules().load(organization_id)? {
        if ids.iter().any(|id| loaded.state.key_id_kind(id).is_some()) {
            // The ids are derived from the stamped body: taken, they were made by this very body
            // (a twin that ran first), so it is a replay.
            return Err(refuse(
                a,
                RefusalReason::Replayed,
                "the new keys' ids, derived from the stamped body, are taken: the body ran already",
            ));
        }
        let after = loaded.counts.with_records(ids.len());
        if let Err(e) = admission.rules().limits().of(&loaded.state.organization).check(&loaded.counts, &after) {
            return Err(refuse(a, RefusalReason::LimitExceeded, &e.to_string()));
        }
    }
    Ok(())
}

/// A wallet created or imported in the body's organization, with its accounts (the body's
/// `accounts`, in order, with the addresses the enclave derived).
pub(super) fn wallet_created(
    admission: &Admission,
    a: &Admitted,
    wallet_id: &str,
    imported: bool,
    made: &pb::CreateWalletResponse,
) -> Result<(), EnclaveError> {
    let p = &a.activity.parameters;
    let wallet = Wallet { id: wallet_id.into(), label: text(p, "walletName").into(), imported, exported: false };
    let accounts = accounts(wallet_id, items(p, "accounts"), &made.accounts);
    record(admission, a, vec![Effect::PutWallet { wallet }, Effect::PutAccounts { accounts }])
}

/// Accounts derived for a wallet of the body's organization.
pub(super) fn accounts_derived(
    admission: &Admission,
    a: &Admitted,
    wallet_id: &str,
    made: &[pb::Account],
) -> Result<(), EnclaveError> {
    let accounts = accounts(wallet_id, items(&a.activity.parameters, "accounts"), made);
    record(admission, a, vec![Effect::PutAccounts { accounts }])
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

/// Private keys created or imported, recorded together (all or none): each its id, its entry
/// of the body (`privateKeys[n]`, or the body itself for an import) and what the enclave made.
pub(super) fn private_keys_made(
    admission: &Admission,
    a: &Admitted,
    keys: &[(&str, &serde_json::Value, &pb::KeyMaterial)],
    imported: bool,
) -> Result<(), EnclaveError> {
    let effects = keys
        .iter()
        .map(|(id, params, made)| Effect::PutPrivateKey {
            private_key: PrivateKey {
                id: id.to_string(),
                label: text(params, "privateKeyName").into(),
                tags: items(params, "privateKeyTags").iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
                imported,
                exported: false,
                addresses: made
                    .addresses
                    .iter()
                    .map(|x| AddressEntry { format: x.format.clone(), address: x.address.clone() })
                    .collect(),
            },
        })
        .collect();
    record(admission, a, effects)
}

/// A wallet's mnemonic, a private key or an account's key left the enclave: policies and the
/// deletion rules see `exported` from now on.
pub(super) fn exported(
    admission: &Admission,
    a: &Admitted,
    wallet_id: Option<&str>,
    private_key_id: Option<&str>,
    account_id: Option<&str>,
) -> Result<(), EnclaveError> {
    let Some(loaded) = admission.rules().load(&a.activity.organization_id)? else { return Ok(()) };
    let mut effects = Vec::new();
    if let Some(id) = account_id.filter(|id| loaded.state.accounts.contains_key(*id)) {
        effects.push(Effect::MarkAccountExported { id: id.to_string() });
    }
    if let Some(id) = wallet_id.filter(|id| loaded.state.wallets.contains_key(*id)) {
        effects.push(Effect::MarkWalletExported { id: id.to_string() });
    }
    if let Some(id) = private_key_id.filter(|id| loaded.state.private_keys.contains_key(*id)) {
        effects.push(Effect::MarkPrivateKeyExported { id: id.to_string() });
    }
    if effects.is_empty() {
        return Ok(());
    }
    record(admission, a, effects)
}
