//! Wallets and wallet accounts: create, derive more accounts, delete, and read.

use coffer_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};

use super::lookup::load_wallet;
use super::params::{required, Pagination};
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::store::{Named, StoreError, Wallet, WalletAccount, Write};

/// `WalletAccountParams`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountParams {
    pub curve: String,
    pub path_format: String,
    pub path: String,
    pub address_format: String,
}

/// Validates what the gateway can check of the accounts, for a clear 400 (the enclave reads the
/// accounts themselves from the stamped body, and derives their ids).
pub fn check_accounts(accounts: &[AccountParams]) -> Result<(), ApiError> {
    for a in accounts {
        if a.path_format != "PATH_FORMAT_BIP32" {
            return Err(ApiError::invalid(format!(
                "invalid path format: {:?} (only PATH_FORMAT_BIP32)",
                a.path_format
            )));
        }
        required(&a.path, "path")?;
        required(&a.curve, "curve")?;
    }
    Ok(())
}

/// An id the enclave returned for a new record: never empty.
pub fn enclave_id(id: String) -> Result<String, ApiError> {
    if id.is_empty() {
        tracing::error!("the enclave returned a new record without its id");
        return Err(ApiError::internal());
    }
    Ok(id)
}

/// Turns the enclave's accounts into rows, in request order.
pub fn account_rows(
    ctx: &Ctx,
    wallet_id: &str,
    params: &[AccountParams],
    accounts: Vec<pb::Account>,
) -> Vec<WalletAccount> {
    params
        .iter()
        .zip(accounts)
        .map(|(p, a)| WalletAccount {
            id: a.account_id,
            organization_id: ctx.org.id.clone(),
            wallet_id: wallet_id.to_string(),
            curve: p.curve.clone(),
            path_format: p.path_format.clone(),
            path: p.path.clone(),
            address_format: p.address_format.clone(),
            address: a.address,
            public_key: hex::encode(a.public_key),
            sealed_key: a.sealed_key,
            created_at: ctx.now,
            updated_at: ctx.now,
        })
        .collect()
}

pub fn wallet_json(w: &Wallet) -> Value {
    json!({
        "walletId": w.id,
        "walletName": w.name,
        "createdAt": timestamp(w.created_at),
        "updatedAt": timestamp(w.updated_at),
        "exported": w.exported,
        "imported": w.imported,
    })
}

pub fn account_json(a: &WalletAccount, wallet: Option<&Wallet>) -> Value {
    let mut v = json!({
        "walletAccountId": a.id,
        "organizationId": a.organization_id,
        "walletId": a.wallet_id,
        "curve": a.curve,
        "pathFormat": a.path_format,
        "path": a.path,
        "addressFormat": a.address_format,
        "address": a.address,
        "publicKey": a.public_key,
        "createdAt": timestamp(a.created_at),
        "updatedAt": timestamp(a.updated_at),
    });
    if let Some(w) = wallet {
        v["walletDetails"] = wallet_json(w);
    }
    v
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateWalletIntent {
    wallet_name: String,
    #[serde(default)]
    accounts: Vec<AccountParams>,
    /// Read by the enclave from the stamped body; declared so a malformed value is a 400 here.
    #[allow(dead_code)]
    mnemonic_length: Option<u32>,
}

pub async fn create_wallet(ctx: Ctx, intent: CreateWalletIntent) -> Result<Outcome, ApiError> {
    required(&intent.wallet_name, "walletName")?;
    check_accounts(&intent.accounts)?;
    super::params::ensure_names_free(&ctx.state, &ctx.org.id, Named::Wallet, &[&intent.wallet_name]).await?;
    let (result, writes) = new_wallet(&ctx, &ctx, intent.wallet_name, &intent.accounts).await?;
    Ok(Outcome { result, writes })
}

/// Has the enclave make a wallet named `name` with `accounts` (its ids the enclave's), its seed
/// and keys sealed under `owner`'s organization: the result clients read (`walletId`,
/// `addresses`) and the writes that store it. `ctx` is the activity the enclave authorizes; `owner` is its
/// organization, or the sub-organization it creates.
pub async fn new_wallet(
    ctx: &Ctx,
    owner: &Ctx,
    name: String,
    accounts: &[AccountParams],
) -> Result<(Value, Vec<Write>), ApiError> {
    let resp = ctx.enclave().create_wallet(pb::CreateWalletRequest::default()).await?;
    let wallet_id = enclave_id(resp.wallet_id)?;
    let rows = account_rows(owner, &wallet_id, accounts, resp.accounts);
    let result = crate::custody::made_by_enclave(&resp.result)?;
    let wallet = Wallet {
        id: wallet_id.clone(),
        organization_id: owner.org.id.clone(),
        name,
        exported: false,
        imported: false,
        sealed_seed: resp.sealed_seed,
        created_at: owner.now,
        updated_at: owner.now,
    };
    Ok((result, vec![Write::InsertWallet(wallet), Write::InsertAccounts(rows)]))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateWalletAccountsIntent {
    wallet_id: String,
    accounts: Vec<AccountParams>,
    persist: Option<bool>,
}

pub async fn create_wallet_accounts(ctx: Ctx, intent: CreateWalletAccountsIntent) -> Result<Outcome, ApiError> {
    if intent.accounts.is_empty() {
        return Err(ApiError::invalid("accounts must not be empty"));
    }
    let wallet = load_wallet(&ctx.state, &ctx.org.id, &intent.wallet_id).await?;
    check_accounts(&intent.accounts)?;
    let resp = ctx
        .enclave()
        .derive_accounts(pb::DeriveAccountsRequest { seed: Some(super::sealed::seed(&wallet)), ..Default::default() })
        .await?;
    let result = crate::custody::made_by_enclave(&resp.result)?;
    let rows = account_rows(&ctx, &wallet.id, &intent.accounts, resp.accounts);
    let writes = if intent.persist.unwrap_or(true) { vec![Write::InsertAccounts(rows)] } else { vec![] };
    Ok(Outcome { result, writes })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteWalletsIntent {
    wallet_ids: Vec<String>,
    delete_without_export: Option<bool>,
}

pub async fn delete_wallets(ctx: Ctx, intent: DeleteWalletsIntent) -> Result<Outcome, ApiError> {
    if intent.wallet_ids.is_empty() {
        return Err(ApiError::invalid("walletIds must not be empty"));
    }
    let require_exported = !intent.delete_without_export.unwrap_or(false);
    for id in &intent.wallet_ids {
        // Checked before the enclave sees the activity (it refuses it too), and again in the
        // transaction (the write).
        if !load_wallet(&ctx.state, &ctx.org.id, id).await?.exported && require_exported {
            return Err(crate::store::StoreError::Conflict(crate::store::Conflict::not_exported(&format!(
                "wallet {id}"
            )))
            .into());
        }
    }
    Ok(Outcome {
        result: json!({ "walletIds": intent.wallet_ids }),
        writes: vec![Write::DeleteWallets {
            ids: intent.wallet_ids.clone(),
            require_exported: !intent.delete_without_export.unwrap_or(false),
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateWalletIntent {
    wallet_id: String,
    #[serde(default)]
    wallet_name: String,
}

/// `update_wallet`: a wallet's new name.
pub async fn update_wallet(ctx: Ctx, intent: UpdateWalletIntent) -> Result<Outcome, ApiError> {
    super::users::valid_name("walletName", &intent.wallet_name)?;
    let wallet = load_wallet(&ctx.state, &ctx.org.id, &intent.wallet_id).await?;
    if wallet.name != intent.wallet_name {
        super::params::ensure_names_free(&ctx.state, &ctx.org.id, Named::Wallet, &[&intent.wallet_name]).await?;
    }
    Ok(Outcome {
        result: json!({ "walletId": wallet.id }),
        writes: vec![Write::RenameWallet { id: wallet.id, name: intent.wallet_name, updated_at: ctx.now }],
    })
}

/// At most this many accounts in one `delete_wallet_accounts` (a wallet makes at most 100 in one
/// call too).
const MAX_ACCOUNTS_DELETED: usize = 100;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteWalletAccountsIntent {
    wallet_account_ids: Vec<String>,
    delete_without_export: Option<bool>,
}

/// `delete_wallet_accounts`: accounts and their sealed keys go; one whose key never left (nor its
/// wallet's seed) only with `deleteWithoutExport` (checked by the enclave, and again by the write).
pub async fn delete_wallet_accounts(ctx: Ctx, intent: DeleteWalletAccountsIntent) -> Result<Outcome, ApiError> {
    let ids = intent.wallet_account_ids;
    if ids.is_empty() || ids.len() > MAX_ACCOUNTS_DELETED {
        return Err(ApiError::invalid(format!("walletAccountIds must name 1 to {MAX_ACCOUNTS_DELETED} accounts")));
    }
    let require_exported = !intent.delete_without_export.unwrap_or(false);
    // Checked before the enclave sees the activity (it refuses it too), for the answer the
    // official clients know, and again in the transaction (the write).
    for (n, id) in ids.iter().enumerate() {
        if ids[..n].contains(id) {
            return Err(ApiError::invalid(format!("walletAccountIds names {id} twice")));
        }
        let (org, id2) = (ctx.org.id.clone(), id.clone());
        let left = ctx.state.db(move |s| s.account_key_left(&org, &id2)).await?.map_err(|e| match e {
            StoreError::NotFound => ApiError::not_found(format!("wallet account not found: {id}")),
            other => other.into(),
        })?;
        if !left && require_exported {
            return Err(
                StoreError::Conflict(crate::store::Conflict::not_exported(&format!("wallet account {id}"))).into()
            );
        }
    }
    Ok(Outcome {
        result: json!({ "walletAccountIds": ids }),
        writes: vec![Write::DeleteAccounts { organization_id: ctx.org.id.clone(), ids, require_exported }],
    })
}

pub async fn list_wallets(ctx: QueryCtx, req: super::params::ListRequest) -> Result<Value, ApiError> {
    let (org, page) = (ctx.org.id.clone(), req.page()?);
    let wallets = ctx.state.db(move |s| s.wallets_page(&org, &page)).await??;
    Ok(json!({ "wallets": wallets.iter().map(wallet_json).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetWalletRequest {
    wallet_id: String,
}

pub async fn get_wallet(ctx: QueryCtx, req: GetWalletRequest) -> Result<Value, ApiError> {
    let w = load_wallet(&ctx.state, &ctx.org.id, &req.wallet_id).await?;
    Ok(json!({ "wallet": wallet_json(&w) }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListWalletAccountsRequest {
    wallet_id: Option<String>,
    include_wallet_details: Option<bool>,
    #[serde(default)]
    pagination_options: Pagination,
}

pub async fn list_wallet_accounts(ctx: QueryCtx, req: ListWalletAccountsRequest) -> Result<Value, ApiError> {
    let page = req.pagination_options.page()?;
    if let Some(w) = &req.wallet_id {
        load_wallet(&ctx.state, &ctx.org.id, w).await?;
    }
    let org = ctx.org.id.clone();
    let details = req.include_wallet_details.unwrap_or(false);
    let (accounts, wallets) = ctx
        .state
        .db(move |s| -> Result<_, StoreError> {
            let accounts = s.accounts_page(&org, req.wallet_id.as_deref(), &page)?;
            // The wallets of this page only.
            let mut wallets: Vec<Wallet> = Vec::new();
            for a in accounts.iter().filter(|_| details) {
                if !wallets.iter().any(|w| w.id == a.wallet_id) {
                    wallets.push(s.wallet(&org, &a.wallet_id)?);
                }
            }
            Ok((accounts, wallets))
        })
        .await??;
    let out: Vec<Value> =
        accounts.iter().map(|a| account_json(a, wallets.iter().find(|w| w.id == a.wallet_id))).collect();
    Ok(json!({ "accounts": out }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetWalletAccountRequest {
    wallet_id: String,
    address: Option<String>,
    path: Option<String>,
}

pub async fn get_wallet_account(ctx: QueryCtx, req: GetWalletAccountRequest) -> Result<Value, ApiError> {
    if req.address.is_none() && req.path.is_none() {
        return Err(ApiError::invalid("one of address or path is required"));
    }
    load_wallet(&ctx.state, &ctx.org.id, &req.wallet_id).await?;
    let (org, wallet_id) = (ctx.org.id.clone(), req.wallet_id.clone());
    let accounts = ctx.state.db(move |s| s.accounts(&org, Some(&wallet_id))).await??;
    let found = accounts.iter().find(|a| {
        req.address.as_ref().is_none_or(|x| &a.address == x) && req.path.as_ref().is_none_or(|p| &a.path == p)
    });
    match found {
        Some(a) => Ok(json!({ "account": account_json(a, None) })),
        None => Err(ApiError::not_found("wallet account not found")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::custody::in_process::{ethereum_account, Harness};

    #[tokio::test(flavor = "multi_thread")]
    async fn wallets_and_accounts_are_made_by_the_enclave_and_stored_sealed() {
        let h = Harness::new().await;
        let (wallet_id, first) = h.ethereum_wallet("main", &[0]).await;
        assert_eq!(first.len(), 1);
        assert!(first[0].starts_with("0x") && first[0].len() == 42, "{first:?}");

        let more = json!({ "walletId": wallet_id, "accounts": [ethereum_account(1), ethereum_account(2)] });
        let derived = h.run("create_wallet_accounts", "ACTIVITY_TYPE_CREATE_WALLET_ACCOUNTS", more).await.unwrap();
        let derived: Vec<&str> = derived["addresses"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(derived.len(), 2);
        assert!(!derived.contains(&first[0].as_str()) && derived[0] != derived[1], "{derived:?}");

        // What the store keeps is sealed by the enclave: a seed blob, no plaintext mnemonic.
        let wallet = h.state.store.wallet(&h.organization_id, &wallet_id).unwrap();
        assert!(wallet.sealed_seed.len() > 32, "{}", wallet.sealed_seed.len());
        let accounts =
            h.state.store.accounts_page(&h.organization_id, Some(&wallet_id), &crate::store::Page::ALL).unwrap();
        assert_eq!(accounts.len(), 3);

        // A second wallet of the same name is refused before the enclave makes anything.
        let again = json!({ "walletName": "main", "accounts": [ethereum_account(0)] });
        let err = h.run("create_wallet", "ACTIVITY_TYPE_CREATE_WALLET", again).await.unwrap_err();
        assert_eq!(err.code, crate::error::Code::InvalidArgument, "{err}");
        assert_eq!(h.state.store.wallets_page(&h.organization_id, &crate::store::Page::ALL).unwrap().len(), 1);
    }

    /// Two identical submissions racing through the gateway: the enclave refuses the second
    /// stamp as replayed (a typed reason), and the gateway answers it with its twin's activity.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_twin_refused_as_replayed_answers_with_the_first_activity() {
        let h = Harness::new().await;
        for _ in 0..5 {
            let params = json!({ "walletName": uuid::Uuid::new_v4().to_string(), "accounts": [ethereum_account(0)] });
            let body = h.body("ACTIVITY_TYPE_CREATE_WALLET", params);
            let (a, b) = tokio::join!(h.submit_body("create_wallet", &body), h.submit_body("create_wallet", &body));
            let (a, b) = (a.unwrap(), b.unwrap());
            assert_eq!(a["activity"]["id"], b["activity"]["id"]);
            assert_eq!(a["activity"]["status"], "ACTIVITY_STATUS_COMPLETED");
        }
        assert_eq!(h.state.store.wallets_page(&h.organization_id, &crate::store::Page::ALL).unwrap().len(), 5);
    }
}
