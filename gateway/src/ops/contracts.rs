//! Smart contract interfaces (Ethereum ABIs, Solana IDLs) that policies can decode calls with:
//! create, delete and read. Records of kind `smart_contract_interface`; labels need not be unique.

use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest;

use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::store::{Record, StoreError, Write};

use crate::record_kinds::SMART_CONTRACT_INTERFACE;
/// Largest interface accepted, in bytes of its JSON text (400 KiB).
pub const MAX_INTERFACE_BYTES: usize = 409_600;

const TYPES: &[&str] = &["SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM", "SMART_CONTRACT_INTERFACE_TYPE_SOLANA"];

fn text(r: &Record, key: &str) -> String {
    r.data.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// The swagger `SmartContractInterface` object.
pub fn interface_json(r: &Record) -> Value {
    json!({
        "organizationId": r.organization_id,
        "smartContractInterfaceId": r.id,
        "smartContractAddress": text(r, "smartContractAddress"),
        "smartContractInterface": text(r, "smartContractInterface"),
        "type": text(r, "type"),
        "label": text(r, "label"),
        "notes": text(r, "notes"),
        "createdAt": timestamp(r.created_at),
        "updatedAt": timestamp(r.updated_at),
    })
}

/// The `SmartContractInterfaceReference` `get_organization` lists (the interface itself is not
/// repeated there).
pub fn reference_json(r: &Record) -> Value {
    json!({
        "smartContractInterfaceId": r.id,
        "smartContractAddress": text(r, "smartContractAddress"),
        "digest": text(r, "digest"),
    })
}

async fn load_interface(
    state: &std::sync::Arc<crate::state::AppState>,
    org: &str,
    id: &str,
) -> Result<Record, ApiError> {
    let (org, id2) = (org.to_string(), id.to_string());
    state.db(move |s| s.record(&org, SMART_CONTRACT_INTERFACE, &id2)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("smart contract interface not found: {id}")),
        other => other.into(),
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSmartContractInterfaceIntent {
    smart_contract_address: String,
    smart_contract_interface: String,
    r#type: String,
    label: String,
    notes: Option<String>,
}

pub async fn create_smart_contract_interface(
    ctx: Ctx,
    intent: CreateSmartContractInterfaceIntent,
) -> Result<Outcome, ApiError> {
    required(&intent.smart_contract_address, "smartContractAddress")?;
    required(&intent.label, "label")?;
    required(&intent.smart_contract_interface, "smartContractInterface")?;
    if intent.smart_contract_interface.len() > MAX_INTERFACE_BYTES {
        return Err(ApiError::invalid(format!("smart contract interface exceeds {MAX_INTERFACE_BYTES} bytes")));
    }
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&intent.smart_contract_interface) {
        return Err(ApiError::invalid(format!("smart contract interface is not valid JSON: {e}")));
    }
    if !TYPES.contains(&intent.r#type.as_str()) {
        return Err(ApiError::invalid(format!(
            "invalid smart contract interface type: {:?} ({})",
            intent.r#type,
            TYPES.join(" or ")
        )));
    }
    let id = ctx.derived_id(coffer_org_rules::transition::CONTRACT_INTERFACE_ID, 0);
    let digest = hex::encode(sha2::Sha256::digest(intent.smart_contract_interface.as_bytes()));
    let record = Record {
        organization_id: ctx.org.id.clone(),
        kind: SMART_CONTRACT_INTERFACE.into(),
        id: id.clone(),
        name: id.clone(),
        data: json!({
            "smartContractAddress": intent.smart_contract_address,
            "smartContractInterface": intent.smart_contract_interface,
            "type": intent.r#type,
            "label": intent.label,
            "notes": intent.notes.unwrap_or_default(),
            "digest": digest,
        }),
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    Ok(Outcome { result: json!({ "smartContractInterfaceId": id }), writes: vec![Write::PutRecord(record)] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteSmartContractInterfaceIntent {
    smart_contract_interface_id: String,
}

pub async fn delete_smart_contract_interface(
    ctx: Ctx,
    intent: DeleteSmartContractInterfaceIntent,
) -> Result<Outcome, ApiError> {
    load_interface(&ctx.state, &ctx.org.id, &intent.smart_contract_interface_id).await?;
    Ok(Outcome {
        result: json!({ "smartContractInterfaceId": intent.smart_contract_interface_id }),
        writes: vec![Write::DeleteRecords {
            organization_id: ctx.org.id.clone(),
            kind: SMART_CONTRACT_INTERFACE.into(),
            ids: vec![intent.smart_contract_interface_id.clone()],
        }],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetSmartContractInterfaceRequest {
    smart_contract_interface_id: String,
}

pub async fn get_smart_contract_interface(
    ctx: QueryCtx,
    req: GetSmartContractInterfaceRequest,
) -> Result<Value, ApiError> {
    let r = load_interface(&ctx.state, &ctx.org.id, &req.smart_contract_interface_id).await?;
    Ok(json!({ "smartContractInterface": interface_json(&r) }))
}

pub async fn list_smart_contract_interfaces(ctx: QueryCtx, req: super::params::ListRequest) -> Result<Value, ApiError> {
    let (org, page) = (ctx.org.id.clone(), req.page()?);
    let records = ctx.state.db(move |s| s.records_page(&org, SMART_CONTRACT_INTERFACE, &page)).await??;
    Ok(json!({ "smartContractInterfaces": records.iter().map(interface_json).collect::<Vec<_>>() }))
}
