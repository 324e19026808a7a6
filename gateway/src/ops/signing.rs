//! Raw-payload signing: resolve `signWith` to sealed key material, let the enclave sign what the
//! stamped body asks for.

use coffer_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};

use super::sealed;
use crate::activity::registry::{Ctx, Outcome};
use crate::error::ApiError;
use crate::store::SignWithKey;

async fn sign(ctx: &Ctx, sign_with: &str) -> Result<Vec<Value>, ApiError> {
    if sign_with.trim().is_empty() {
        return Err(ApiError::invalid("signWith is required"));
    }
    let (org, sw) = (ctx.org.id.clone(), sign_with.to_string());
    let found = ctx.state.db(move |s| crate::store::sign_with_key(s, &org, &sw)).await??;
    let (key, address_format) = match found {
        Some(SignWithKey::Account(a)) => (sealed::account(&a), String::new()),
        Some(SignWithKey::PrivateKey { key, address_format }) => {
            (sealed::private_key(&key), address_format.unwrap_or_default())
        }
        None => {
            return Err(ApiError::not_found(format!(
                "no wallet account or private key found for signWith {sign_with:?} in this organization"
            )))
        }
    };
    let resp = ctx
        .state
        .enclave
        .clone()
        .sign(pb::SignRequest { auth: Some(ctx.auth.clone()), key: Some(key), address_format })
        .await?
        .into_inner();
    Ok(resp.signatures.into_iter().map(|s| json!({ "r": s.r, "s": s.s, "v": s.v })).collect())
}

/// Validated here for clear errors; the enclave reads payload, encoding and hash function from
/// the stamped body itself.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignRawPayloadIntent {
    sign_with: String,
    #[allow(dead_code)]
    payload: String,
    #[allow(dead_code)]
    encoding: String,
    #[allow(dead_code)]
    hash_function: String,
}

pub async fn sign_raw_payload(ctx: Ctx, i: SignRawPayloadIntent) -> Result<Outcome, ApiError> {
    let mut sigs = sign(&ctx, &i.sign_with).await?;
    let sig = sigs.pop().ok_or_else(ApiError::internal)?;
    Ok(Outcome { result: sig, writes: vec![] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignRawPayloadsIntent {
    sign_with: String,
    payloads: Vec<String>,
    #[allow(dead_code)]
    encoding: String,
    #[allow(dead_code)]
    hash_function: String,
}

pub async fn sign_raw_payloads(ctx: Ctx, i: SignRawPayloadsIntent) -> Result<Outcome, ApiError> {
    if i.payloads.is_empty() {
        return Err(ApiError::invalid("payloads must not be empty"));
    }
    let sigs = sign(&ctx, &i.sign_with).await?;
    Ok(Outcome { result: json!({ "signatures": sigs }), writes: vec![] })
}
