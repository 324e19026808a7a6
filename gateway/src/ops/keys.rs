//! Standalone private keys: create, delete, and read.

use coffer_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};

use super::lookup::load_private_key;
use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::store::{AddressEntry, Named, PrivateKey, Write};

pub fn private_key_json(k: &PrivateKey) -> Value {
    json!({
        "privateKeyId": k.id,
        "publicKey": k.public_key,
        "privateKeyName": k.name,
        "curve": k.curve,
        "addresses": k.addresses.iter().map(|a| json!({"format": a.format, "address": a.address})).collect::<Vec<_>>(),
        "privateKeyTags": k.tags,
        "createdAt": timestamp(k.created_at),
        "updatedAt": timestamp(k.updated_at),
        "exported": k.exported,
        "imported": k.imported,
    })
}

pub fn address_entries(addresses: Vec<pb::Address>) -> Vec<AddressEntry> {
    addresses.into_iter().map(|a| AddressEntry { format: a.format, address: a.address }).collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKeyParams {
    private_key_name: String,
    curve: String,
    #[serde(default)]
    private_key_tags: Vec<String>,
    /// Read by the enclave from the stamped body; declared so a malformed value is a 400 here.
    #[serde(default)]
    #[allow(dead_code)]
    address_formats: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatePrivateKeysIntent {
    private_keys: Vec<PrivateKeyParams>,
}

pub async fn create_private_keys(ctx: Ctx, intent: CreatePrivateKeysIntent) -> Result<Outcome, ApiError> {
    if intent.private_keys.is_empty() {
        return Err(ApiError::invalid("privateKeys must not be empty"));
    }
    let wanted: Vec<&str> = intent.private_keys.iter().map(|p| p.private_key_name.as_str()).collect();
    super::params::ensure_names_free(&ctx.state, &ctx.org.id, Named::PrivateKey, &wanted).await?;
    let mut names: Vec<&str> = Vec::new();
    for p in &intent.private_keys {
        required(&p.private_key_name, "privateKeyName")?;
        if names.contains(&p.private_key_name.as_str()) {
            return Err(ApiError::invalid(format!("private key name must be unique: {:?}", p.private_key_name)));
        }
        names.push(&p.private_key_name);
    }
    let answer = ctx.enclave().create_private_keys(pb::CreatePrivateKeysRequest::default()).await?;
    let (result, created) = (crate::custody::made_by_enclave(&answer.result)?, answer.keys);
    if created.len() != intent.private_keys.len() {
        return Err(ApiError::internal());
    }
    let ids = created
        .iter()
        .map(|km| super::wallets::enclave_id(km.private_key_id.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let rows: Vec<PrivateKey> = intent
        .private_keys
        .iter()
        .zip(ids)
        .zip(created)
        .enumerate()
        .map(|(i, ((p, id), km))| PrivateKey {
            id,
            organization_id: ctx.org.id.clone(),
            name: p.private_key_name.clone(),
            curve: p.curve.clone(),
            public_key: hex::encode(&km.public_key),
            addresses: address_entries(km.addresses),
            tags: p.private_key_tags.clone(),
            exported: false,
            imported: false,
            sealed_key: km.sealed_key,
            // A nanosecond apart, so lists keep the request's order.
            created_at: ctx.now + i as i64,
            updated_at: ctx.now + i as i64,
        })
        .collect();
    Ok(Outcome { result, writes: vec![Write::InsertPrivateKeys(rows)] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletePrivateKeysIntent {
    private_key_ids: Vec<String>,
    delete_without_export: Option<bool>,
}

pub async fn delete_private_keys(ctx: Ctx, intent: DeletePrivateKeysIntent) -> Result<Outcome, ApiError> {
    if intent.private_key_ids.is_empty() {
        return Err(ApiError::invalid("privateKeyIds must not be empty"));
    }
    let require_exported = !intent.delete_without_export.unwrap_or(false);
    for id in &intent.private_key_ids {
        // Checked before the enclave sees the activity (it refuses it too), and again in the
        // transaction (the write).
        if !load_private_key(&ctx.state, &ctx.org.id, id).await?.exported && require_exported {
            let conflict = crate::store::Conflict::not_exported(&format!("private key {id}"));
            return Err(crate::store::StoreError::Conflict(conflict).into());
        }
    }
    Ok(Outcome {
        result: json!({ "privateKeyIds": intent.private_key_ids }),
        writes: vec![Write::DeletePrivateKeys {
            ids: intent.private_key_ids.clone(),
            require_exported: !intent.delete_without_export.unwrap_or(false),
        }],
    })
}

pub async fn list_private_keys(ctx: QueryCtx, req: super::params::ListRequest) -> Result<Value, ApiError> {
    let (org, page) = (ctx.org.id.clone(), req.page()?);
    let keys = ctx.state.db(move |s| s.private_keys_page(&org, &page)).await??;
    Ok(json!({ "privateKeys": keys.iter().map(private_key_json).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetPrivateKeyRequest {
    private_key_id: String,
}

pub async fn get_private_key(ctx: QueryCtx, req: GetPrivateKeyRequest) -> Result<Value, ApiError> {
    let k = load_private_key(&ctx.state, &ctx.org.id, &req.private_key_id).await?;
    Ok(json!({ "privateKey": private_key_json(&k) }))
}
