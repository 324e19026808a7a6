//! Raw-payload signing: resolve `signWith` to sealed key material, let the enclave sign.

use coffer_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::activity::registry::{Ctx, Outcome};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::StoreError;

/// Sealed key material found for a `signWith` value, with its curve.
pub struct SigningKey {
    pub sealed: pb::SealedRef,
    pub curve: String,
}

/// `Ok(None)` for not found, so lookups can fall through to the next kind of key.
fn hit<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `signWith` is a wallet account address, a private key address, or a private key id.
pub async fn resolve_sign_with(
    state: &std::sync::Arc<AppState>,
    org: &str,
    sign_with: &str,
) -> Result<SigningKey, ApiError> {
    if sign_with.trim().is_empty() {
        return Err(ApiError::invalid("signWith is required"));
    }
    let (o, sw) = (org.to_string(), sign_with.to_string());
    let found = state
        .db(move |s| -> Result<Option<SigningKey>, StoreError> {
            if let Some(a) = hit(s.account_by_address(&o, &sw))? {
                return Ok(Some(SigningKey {
                    sealed: pb::SealedRef {
                        kind: pb::BlobKind::WalletAccountKey as i32,
                        organization_id: a.organization_id,
                        resource_id: a.id,
                        blob: a.sealed_key,
                    },
                    curve: a.curve,
                }));
            }
            let key = match hit(s.private_key_by_address(&o, &sw))? {
                Some(k) => Some(k),
                None => hit(s.private_key(&o, &sw))?,
            };
            Ok(key.map(|k| SigningKey {
                sealed: pb::SealedRef {
                    kind: pb::BlobKind::PrivateKey as i32,
                    organization_id: k.organization_id,
                    resource_id: k.id,
                    blob: k.sealed_key,
                },
                curve: k.curve,
            }))
        })
        .await??;
    found.ok_or_else(|| {
        ApiError::not_found(format!(
            "no wallet account or private key found for signWith {sign_with:?} in this organization"
        ))
    })
}

async fn sign(
    ctx: &Ctx,
    sign_with: &str,
    payloads: Vec<String>,
    encoding: String,
    hash_function: String,
) -> Result<Vec<Value>, ApiError> {
    let key = resolve_sign_with(&ctx.state, &ctx.org.id, sign_with).await?;
    let resp = ctx
        .state
        .enclave
        .clone()
        .sign(pb::SignRequest { key: Some(key.sealed), curve: key.curve, payloads, encoding, hash_function })
        .await?
        .into_inner();
    Ok(resp.signatures.into_iter().map(|s| json!({ "r": s.r, "s": s.s, "v": s.v })).collect())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignRawPayloadIntent {
    sign_with: String,
    payload: String,
    encoding: String,
    hash_function: String,
}

pub async fn sign_raw_payload(ctx: Ctx, i: SignRawPayloadIntent) -> Result<Outcome, ApiError> {
    let mut sigs = sign(&ctx, &i.sign_with, vec![i.payload], i.encoding, i.hash_function).await?;
    let sig = sigs.pop().ok_or_else(ApiError::internal)?;
    Ok(Outcome { result: sig, writes: vec![] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignRawPayloadsIntent {
    sign_with: String,
    payloads: Vec<String>,
    encoding: String,
    hash_function: String,
}

pub async fn sign_raw_payloads(ctx: Ctx, i: SignRawPayloadsIntent) -> Result<Outcome, ApiError> {
    if i.payloads.is_empty() {
        return Err(ApiError::invalid("payloads must not be empty"));
    }
    let sigs = sign(&ctx, &i.sign_with, i.payloads, i.encoding, i.hash_function).await?;
    Ok(Outcome { result: json!({ "signatures": sigs }), writes: vec![] })
}
