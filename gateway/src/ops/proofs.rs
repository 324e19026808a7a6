//! Proofs: an activity's app proofs, the enclave's boot proof, the organization's activity log
//! with the head the enclave signs (what `coffer-gateway verify-log` checks), and the
//! organization's state as the enclave signs it (what `coffer-gateway diff-state` checks).

use base64::Engine;
use coffer_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest;

use crate::activity::registry::QueryCtx;
use crate::activity::render;
use crate::error::ApiError;
use crate::store::StoreError;

/// Most links one page of the log export holds. A page is built whole in memory, activities
/// rendered: 5,000 a page took the gateway's peak RSS to 216 MiB in the bench's export of a
/// 100,000-link log; 1,000 keeps it within the 128 MiB at the cost of more round trips.
const MAX_LOG_PAGE: usize = 1_000;
/// Most unlogged activities the first page lists.
const MAX_UNLOGGED: usize = 1_000;
/// `v1BootProof.enclaveApp` and `owner` of Coffer's enclave.
const ENCLAVE_APP: &str = "coffer-enclave";
const OWNER: &str = "coffer";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListAppProofsRequest {
    activity_id: String,
}

/// `query/list_app_proofs`: the proofs the activity returned (none unless it asked).
pub async fn list_app_proofs(ctx: QueryCtx, req: ListAppProofsRequest) -> Result<Value, ApiError> {
    let (org, id) = (ctx.org.id.clone(), req.activity_id.clone());
    let a = ctx.state.db(move |s| s.activity(&org, &id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("activity not found: {}", req.activity_id)),
        other => other.into(),
    })?;
    Ok(json!({ "appProofs": a.app_proofs }))
}

/// `v1BootProof` of Coffer's boot proof: no hardware attestation (`awsAttestationDocB64` is
/// empty); the manifest is the signed payload, its envelope the signed proof itself.
fn boot_proof_json(b: &pb::BootProof) -> Result<Value, ApiError> {
    let proof = b.proof.as_ref().ok_or_else(ApiError::internal)?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let started = b.started_at_ms;
    Ok(json!({
        "ephemeralPublicKeyHex": proof.public_key,
        "awsAttestationDocB64": "",
        "qosManifestB64": b64.encode(proof.proof_payload.as_bytes()),
        "qosManifestEnvelopeB64": b64.encode(render::app_proof(proof).to_string().as_bytes()),
        "deploymentLabel": b.version,
        "enclaveApp": ENCLAVE_APP,
        "owner": OWNER,
        "createdAt": { "seconds": (started / 1000).to_string(), "nanos": ((started % 1000) * 1_000_000).to_string() },
    }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetBootProofRequest {
    ephemeral_key: String,
}

/// `query/get_boot_proof`: the boot proof of the enclave whose proof key `ephemeralKey` is.
pub async fn get_boot_proof(ctx: QueryCtx, req: GetBootProofRequest) -> Result<Value, ApiError> {
    let boot = ctx.state.custody.boot_proof().await?;
    let ours = boot.proof.as_ref().is_some_and(|p| p.public_key.eq_ignore_ascii_case(req.ephemeral_key.trim()));
    if !ours {
        return Err(ApiError::not_found("no boot proof for this ephemeral key"));
    }
    Ok(json!({ "bootProof": boot_proof_json(&boot)? }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetAttestationRequest {
    #[serde(default)]
    enclave_type: String,
}

/// The enclave types the hosted service attests; Coffer's one enclave answers for each.
const ENCLAVE_TYPES: [&str; 4] = ["ump", "notarizer", "signer", "evm-parser"];

/// `query/get_attestation`: what Coffer can truthfully attest, its boot proof, as a CBOR map in
/// base64 (`attestationDocument`): `module_id` (the enclave app), `enclave_type` (as asked),
/// `timestamp` (start, ms), `public_key` (the proof key, bytes), `user_data` (SHA-256 of the
/// manifest, as a Nitro document binds its manifest), `boot_proof` (the signed proof, JSON
/// bytes) and `attestation: "none"`. It is not a Nitro COSE_Sign1 document and proves no
/// hardware measurement (docs/proofs.md "Boot proofs").
pub async fn get_attestation(ctx: QueryCtx, req: GetAttestationRequest) -> Result<Value, ApiError> {
    if !ENCLAVE_TYPES.contains(&req.enclave_type.as_str()) {
        return Err(ApiError::invalid(format!("enclaveType is one of {}", ENCLAVE_TYPES.join(", "))));
    }
    let boot = ctx.state.custody.boot_proof().await?;
    let proof = boot.proof.as_ref().ok_or_else(ApiError::internal)?;
    let public_key = hex::decode(&proof.public_key).map_err(|_| ApiError::internal())?;
    let text = |s: &str| ciborium::Value::Text(s.to_string());
    let document = ciborium::Value::Map(vec![
        (text("module_id"), text(ENCLAVE_APP)),
        (text("enclave_type"), text(&req.enclave_type)),
        (text("timestamp"), ciborium::Value::Integer(boot.started_at_ms.into())),
        (text("public_key"), ciborium::Value::Bytes(public_key)),
        (text("user_data"), ciborium::Value::Bytes(sha2::Sha256::digest(proof.proof_payload.as_bytes()).to_vec())),
        (text("boot_proof"), ciborium::Value::Bytes(render::app_proof(proof).to_string().into_bytes())),
        (text("attestation"), text("none")),
    ]);
    let mut bytes = Vec::new();
    ciborium::into_writer(&document, &mut bytes).map_err(|_| ApiError::internal())?;
    Ok(json!({ "attestationDocument": base64::engine::general_purpose::STANDARD.encode(bytes) }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetLatestBootProofRequest {
    #[serde(default)]
    #[allow(dead_code)]
    app_name: String,
}

/// `query/get_latest_boot_proof`: Coffer runs one enclave app, so every name gets its proof.
pub async fn get_latest_boot_proof(ctx: QueryCtx, _req: GetLatestBootProofRequest) -> Result<Value, ApiError> {
    let boot = ctx.state.custody.boot_proof().await?;
    Ok(json!({ "bootProof": boot_proof_json(&boot)? }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListActivityLogRequest {
    /// The last position already read ("0" or absent: from the start).
    #[serde(default)]
    after_seq: Option<String>,
    #[serde(default)]
    limit: Option<String>,
    /// The verifier's nonce (16 to 128 hex digits), signed into the head so that an old head
    /// cannot answer for the log now.
    #[serde(default)]
    nonce: Option<String>,
}

/// `query/coffer_list_activity_log` (Coffer's own): the enclave's signed head now (with the
/// verifier's `nonce`, when given), then one page of links in order, each with its activity as
/// `get_activity` serves it (`null` when the row is gone); the first page also lists finished
/// activities that no link names.
pub async fn list_activity_log(ctx: QueryCtx, req: ListActivityLogRequest) -> Result<Value, ApiError> {
    let number = |v: &Option<String>, name: &str| -> Result<Option<u64>, ApiError> {
        v.as_deref()
            .map(|s| s.parse::<u64>().map_err(|_| ApiError::invalid(format!("{name} must be a number"))))
            .transpose()
    };
    let after = number(&req.after_seq, "afterSeq")?.unwrap_or(0);
    let limit = number(&req.limit, "limit")?.unwrap_or(1_000).clamp(1, MAX_LOG_PAGE as u64) as usize;
    let nonce = req.nonce.unwrap_or_default();
    if !nonce.is_empty() && !coffer_auth::proof::is_log_nonce(&nonce) {
        return Err(ApiError::invalid("nonce must be 16 to 128 hex digits"));
    }
    let head = ctx.state.custody.log_head(&ctx.org.id, &nonce).await?;
    let org = ctx.org.id.clone();
    let (entries, unlogged) = ctx
        .state
        .db(move |s| {
            let entries = s.activity_log(&org, after, limit)?;
            let unlogged = if after == 0 { s.unlogged_activities(&org, MAX_UNLOGGED)? } else { Vec::new() };
            Ok::<_, StoreError>((entries, unlogged))
        })
        .await??;
    // Built by moving values into maps: `json!` would copy every activity once more.
    let links: Vec<Value> = entries
        .into_iter()
        .map(|e| {
            let mut m = serde_json::Map::new();
            m.insert("seq".into(), Value::String(e.seq.to_string()));
            m.insert("link".into(), serde_json::from_str::<Value>(&e.link).unwrap_or(Value::Null));
            m.insert("activity".into(), e.activity.as_ref().map_or(Value::Null, |a| render::activity(a, false)));
            m.insert("activityId".into(), Value::String(e.activity_id));
            Value::Object(m)
        })
        .collect();
    let mut out = serde_json::Map::new();
    out.insert("organizationId".into(), Value::String(ctx.org.id.clone()));
    out.insert("head".into(), head.head.as_ref().map_or(Value::Null, render::app_proof));
    out.insert("headSeq".into(), Value::String(head.seq.to_string()));
    out.insert("links".into(), Value::Array(links));
    out.insert("unlogged".into(), Value::Array(unlogged.iter().map(|a| render::activity(a, false)).collect()));
    Ok(Value::Object(out))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetOrganizationStateRequest {
    /// The verifier's nonce (16 to 128 hex digits), signed into the state so that an answer to
    /// an earlier request cannot stand for the state now.
    nonce: String,
}

/// `query/coffer_get_organization_state` (Coffer's own): the organization's state as the enclave
/// decides on it (`stateJson`: `{kind: {id: item}}`) and the proof (`state`) its proof key signed
/// over the state's digest for the verifier's `nonce`. The gateway only carries them.
pub async fn get_organization_state(ctx: QueryCtx, req: GetOrganizationStateRequest) -> Result<Value, ApiError> {
    if !coffer_auth::proof::is_log_nonce(&req.nonce) {
        return Err(ApiError::invalid("nonce must be 16 to 128 hex digits"));
    }
    // Charged to the top-level organization's share, as its dry runs are: a whole state signed
    // is work in the enclave that sign-ups must not multiply.
    let top_level = ctx.org.parent_id.as_deref().unwrap_or(&ctx.org.id);
    let custody = &ctx.state.custody;
    let answer =
        crate::evaluation_share::share().run(top_level, custody.organization_state(&ctx.org.id, &req.nonce)).await??;
    let state = answer.state.as_ref().ok_or_else(ApiError::internal)?;
    // The state's exact bytes, as a string: what the proof's digest covers (parsed and written
    // again, they could differ).
    let state_json = String::from_utf8(answer.entries).map_err(|_| ApiError::internal())?;
    Ok(json!({
        "organizationId": ctx.org.id,
        "version": answer.version.to_string(),
        "state": render::app_proof(state),
        "stateJson": state_json,
    }))
}
