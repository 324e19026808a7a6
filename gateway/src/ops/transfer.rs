//! Export (mnemonic or key, HPKE-encrypted to the caller's target key) and import.

use coffer_proto::v1 as pb;
use serde::Deserialize;
use serde_json::Value;

use super::keys::address_entries;
use super::lookup::{load_private_key, load_wallet};
use super::params::required;
use super::sealed;
use super::wallets::{account_rows, check_accounts, enclave_id, AccountParams};
use crate::activity::registry::{Ctx, Outcome};
use crate::custody::made_by_enclave;
use crate::error::ApiError;
use crate::store::{ImportTarget, Named, PrivateKey, StoreError, Wallet, Write};

/// Checks the target key for a clear 400; the enclave encrypts to the stamped body's key itself.
fn target_key(hex_key: &str) -> Result<(), ApiError> {
    let k = hex_key.trim().trim_start_matches("0x");
    let ok = matches!(k.len(), 130 | 66) && k.bytes().all(|b| b.is_ascii_hexdigit());
    if !ok {
        return Err(ApiError::invalid("invalid target public key: expected a P-256 SEC1 public key in hex"));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportWalletIntent {
    wallet_id: String,
    target_public_key: String,
    /// Read by the enclave from the stamped body.
    #[allow(dead_code)]
    language: Option<String>,
}

pub async fn export_wallet(ctx: Ctx, i: ExportWalletIntent) -> Result<Outcome, ApiError> {
    target_key(&i.target_public_key)?;
    let wallet = load_wallet(&ctx.state, &ctx.org.id, &i.wallet_id).await?;
    let resp = ctx
        .enclave()
        .export_wallet(pb::ExportWalletRequest { seed: Some(sealed::seed(&wallet)), ..Default::default() })
        .await?;
    Ok(Outcome { result: made_by_enclave(&resp.result)?, writes: vec![Write::MarkWalletExported(wallet.id)] })
}

/// Has the enclave export one sealed key (standalone or wallet account) to the stamped target:
/// the activity's result.
async fn export_key(ctx: &Ctx, key: pb::SealedRef) -> Result<Value, ApiError> {
    let req = pb::ExportKeyRequest { key: Some(key), ..Default::default() };
    made_by_enclave(&ctx.enclave().export_key(req).await?.result)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportPrivateKeyIntent {
    private_key_id: String,
    target_public_key: String,
}

pub async fn export_private_key(ctx: Ctx, i: ExportPrivateKeyIntent) -> Result<Outcome, ApiError> {
    target_key(&i.target_public_key)?;
    let key = load_private_key(&ctx.state, &ctx.org.id, &i.private_key_id).await?;
    let result = export_key(&ctx, sealed::private_key(&key)).await?;
    Ok(Outcome { result, writes: vec![Write::MarkPrivateKeyExported(key.id)] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportWalletAccountIntent {
    address: String,
    target_public_key: String,
}

pub async fn export_wallet_account(ctx: Ctx, i: ExportWalletAccountIntent) -> Result<Outcome, ApiError> {
    target_key(&i.target_public_key)?;
    let (org, addr) = (ctx.org.id.clone(), i.address.clone());
    let account = ctx.state.db(move |s| s.account_by_address(&org, &addr)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("wallet account not found: {}", i.address)),
        other => other.into(),
    })?;
    let result = export_key(&ctx, sealed::account(&account)).await?;
    Ok(Outcome { result, writes: vec![Write::MarkAccountExported(account.id)] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitImportIntent {
    user_id: String,
}

async fn init_import(ctx: Ctx, i: InitImportIntent) -> Result<Outcome, ApiError> {
    required(&i.user_id, "userId")?;
    let (org, user) = (ctx.org.id.clone(), i.user_id.clone());
    ctx.state.db(move |s| s.user(&org, &user)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("user not found: {}", i.user_id)),
        other => other.into(),
    })?;
    let resp = ctx.enclave().init_import(pb::InitImportRequest::default()).await?;
    Ok(Outcome {
        result: made_by_enclave(&resp.result)?,
        writes: vec![Write::PutImportTarget(ImportTarget {
            organization_id: ctx.org.id.clone(),
            user_id: i.user_id,
            sealed_key: resp.sealed_target_key,
            created_at: ctx.now,
        })],
    })
}

pub async fn init_import_wallet(ctx: Ctx, i: InitImportIntent) -> Result<Outcome, ApiError> {
    init_import(ctx, i).await
}

pub async fn init_import_private_key(ctx: Ctx, i: InitImportIntent) -> Result<Outcome, ApiError> {
    init_import(ctx, i).await
}

async fn pending_target(ctx: &Ctx, user_id: &str) -> Result<ImportTarget, ApiError> {
    let (org, user) = (ctx.org.id.clone(), user_id.to_string());
    ctx.state.db(move |s| s.import_target(&org, &user)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::invalid("no import in progress for this user: call init_import first"),
        other => other.into(),
    })
}

fn take(t: ImportTarget) -> Write {
    Write::TakeImportTarget { organization_id: t.organization_id, user_id: t.user_id, sealed_key: t.sealed_key }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportWalletIntent {
    user_id: String,
    wallet_name: String,
    encrypted_bundle: String,
    #[serde(default)]
    accounts: Vec<AccountParams>,
}

pub async fn import_wallet(ctx: Ctx, i: ImportWalletIntent) -> Result<Outcome, ApiError> {
    required(&i.wallet_name, "walletName")?;
    required(&i.encrypted_bundle, "encryptedBundle")?;
    check_accounts(&i.accounts)?;
    super::params::ensure_names_free(&ctx.state, &ctx.org.id, Named::Wallet, &[&i.wallet_name]).await?;
    let target = pending_target(&ctx, &i.user_id).await?;
    let resp = ctx
        .enclave()
        .import_wallet(pb::ImportWalletRequest { target: Some(sealed::import_target(&target)), ..Default::default() })
        .await?;
    let wallet_id = enclave_id(resp.wallet_id)?;
    let result = made_by_enclave(&resp.result)?;
    let rows = account_rows(&ctx, &wallet_id, &i.accounts, resp.accounts);
    let wallet = Wallet {
        id: wallet_id.clone(),
        organization_id: ctx.org.id.clone(),
        name: i.wallet_name,
        exported: false,
        imported: true,
        sealed_seed: resp.sealed_seed,
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    Ok(Outcome { result, writes: vec![take(target), Write::InsertWallet(wallet), Write::InsertAccounts(rows)] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportPrivateKeyIntent {
    user_id: String,
    private_key_name: String,
    encrypted_bundle: String,
    curve: String,
    #[serde(default)]
    /// Read by the enclave from the stamped body.
    #[allow(dead_code)]
    address_formats: Vec<String>,
}

pub async fn import_private_key(ctx: Ctx, i: ImportPrivateKeyIntent) -> Result<Outcome, ApiError> {
    required(&i.private_key_name, "privateKeyName")?;
    required(&i.encrypted_bundle, "encryptedBundle")?;
    super::params::ensure_names_free(&ctx.state, &ctx.org.id, Named::PrivateKey, &[&i.private_key_name]).await?;
    let target = pending_target(&ctx, &i.user_id).await?;
    let km = ctx
        .enclave()
        .import_private_key(pb::ImportPrivateKeyRequest {
            target: Some(sealed::import_target(&target)),
            ..Default::default()
        })
        .await?;
    let id = enclave_id(km.private_key_id)?;
    let result = made_by_enclave(&km.result)?;
    let addresses = address_entries(km.addresses);
    let key = PrivateKey {
        id: id.clone(),
        organization_id: ctx.org.id.clone(),
        name: i.private_key_name,
        curve: i.curve,
        public_key: hex::encode(&km.public_key),
        addresses: addresses.clone(),
        tags: vec![],
        exported: false,
        imported: true,
        sealed_key: km.sealed_key,
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    Ok(Outcome { result, writes: vec![take(target), Write::InsertPrivateKeys(vec![key])] })
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sha3::Digest;

    use crate::custody::in_process::Harness;

    #[tokio::test(flavor = "multi_thread")]
    async fn an_exported_wallet_opens_with_the_official_client_and_derives_its_addresses() {
        let h = Harness::new().await;
        let (wallet_id, addresses) = h.ethereum_wallet("exported", &[0, 3]).await;
        let signer = hex::encode(h.state.custody.signer_public_key().await.unwrap());
        let quorum = turnkey_enclave_encrypt::QuorumPublicKey::from_string(format!("{signer}{signer}")).unwrap();
        let mut target = turnkey_enclave_encrypt::ExportClient::new(&quorum);
        let intent = json!({ "walletId": wallet_id, "targetPublicKey": target.target_public_key().unwrap() });
        let result = h.run("export_wallet", "ACTIVITY_TYPE_EXPORT_WALLET", intent).await.unwrap();
        let bundle = result["exportBundle"].as_str().unwrap();
        let phrase = target.decrypt_wallet_mnemonic_phrase(bundle, &h.organization_id).unwrap();
        let mnemonic = bip39::Mnemonic::parse(&phrase).unwrap();
        for (index, address) in [0, 3].iter().zip(&addresses) {
            let path = format!("m/44'/60'/0'/0/{index}").parse().unwrap();
            let key = bip32::XPrv::derive_from_path(mnemonic.to_seed(""), &path).unwrap();
            let point = key.public_key().public_key().to_encoded_point(false);
            let derived = format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..]));
            assert_eq!(&derived, &address.to_lowercase());
        }
        // The wallet is marked exported (deleting it no longer needs deleteWithoutExport).
        assert!(h.state.store.wallet(&h.organization_id, &wallet_id).unwrap().exported);
    }
}
