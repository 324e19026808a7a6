//! One-time codes: `init_otp`, `verify_otp` and `init_otp_auth`. The enclave makes, sends and
//! checks the code; the gateway keeps only the record the enclave sealed, and sees no code (but
//! the one `otp_auth` carries typed in a stamped body only it redeems).

use serde::Deserialize;
use serde_json::{json, Value};

use super::params::required;
use crate::activity::registry::{Ctx, Outcome};
use crate::error::ApiError;
use crate::record_kinds::OTP;
use crate::store::{Record, StoreError, Write};
use coffer_proto::v1 as pb;

/// How long a code's record is kept: past the longest code (600 s), with a margin for clocks.
const RECORD_LIFETIME_NANOS: i64 = 15 * 60 * 1_000_000_000;

/// `initOtpIntentV3`: read and checked by the enclave from the stamped body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitOtpIntent {
    otp_type: String,
    contact: String,
}

pub async fn init_otp(ctx: Ctx, intent: InitOtpIntent) -> Result<Outcome, ApiError> {
    let (resp, writes) = new_code(&ctx, intent).await?;
    Ok(Outcome {
        result: json!({ "otpId": resp.otp_id, "otpEncryptionTargetBundle": resp.otp_encryption_target_bundle }),
        writes,
    })
}

/// `initOtpAuthIntentV3` (the fields of `init_otp`): a code `otp_auth` takes as typed.
pub async fn init_otp_auth(ctx: Ctx, intent: InitOtpIntent) -> Result<Outcome, ApiError> {
    let (resp, writes) = new_code(&ctx, intent).await?;
    Ok(Outcome { result: json!({ "otpId": resp.otp_id }), writes })
}

/// Has the enclave make and send a code for the stamped body; the writes keep its sealed record
/// (and drop the records of codes that expired).
async fn new_code(ctx: &Ctx, intent: InitOtpIntent) -> Result<(pb::InitOtpResponse, Vec<Write>), ApiError> {
    required(&intent.otp_type, "otpType")?;
    required(&intent.contact, "contact")?;
    let request =
        pb::InitOtpRequest { parent_certificate: super::lookup::parent_certificate(ctx).await?, ..Default::default() };
    let resp = ctx.enclave().init_otp(request).await?;
    // Records of codes that expired (10 minutes at most) go with each new one.
    let expired = Write::PruneRecords {
        organization_id: ctx.org.id.clone(),
        kind: OTP.to_string(),
        created_before: ctx.now - RECORD_LIFETIME_NANOS,
    };
    // Record names are unique per kind: the id is the name.
    let record = Write::PutRecord(Record {
        organization_id: ctx.org.id.clone(),
        kind: OTP.to_string(),
        name: resp.otp_id.clone(),
        id: resp.otp_id.clone(),
        data: json!({ "sealed": hex::encode(&resp.sealed_otp) }),
        created_at: ctx.now,
        updated_at: ctx.now,
    });
    let mut writes = vec![record, expired];
    writes.extend(super::email_events::writes(&ctx.org.id, &ctx.fingerprint, ctx.now, &resp.email_events));
    Ok((resp, writes))
}

/// The sealed record of code `otp_id` of `ctx`'s organization; empty when there is none (the
/// enclave answers an unknown id as it answers a wrong code, and counts nothing for it).
pub async fn sealed_record(ctx: &Ctx, otp_id: &str) -> Result<Vec<u8>, ApiError> {
    let (org, id) = (ctx.org.id.clone(), otp_id.to_string());
    Ok(match ctx.state.db(move |s| s.record(&org, OTP, &id)).await? {
        Ok(r) => hex::decode(r.data.get("sealed").and_then(Value::as_str).unwrap_or_default()).unwrap_or_default(),
        Err(StoreError::NotFound) => Vec::new(),
        Err(e) => return Err(e.into()),
    })
}

/// The write that drops code `otp_id`'s record once it has done its work.
pub fn spent(ctx: &Ctx, otp_id: String) -> Write {
    Write::DeleteRecords { organization_id: ctx.org.id.clone(), kind: OTP.to_string(), ids: vec![otp_id] }
}

/// `verifyOtpIntentV2`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyOtpIntent {
    otp_id: String,
    encrypted_otp_bundle: String,
    /// Read by the enclave from the stamped body; declared so a malformed value is a 400 here.
    #[allow(dead_code)]
    expiration_seconds: Option<Value>,
}

pub async fn verify_otp(ctx: Ctx, intent: VerifyOtpIntent) -> Result<Outcome, ApiError> {
    required(&intent.otp_id, "otpId")?;
    required(&intent.encrypted_otp_bundle, "encryptedOtpBundle")?;
    let sealed = sealed_record(&ctx, &intent.otp_id).await?;
    let resp = ctx.enclave().verify_otp(pb::VerifyOtpRequest { sealed_otp: sealed, ..Default::default() }).await?;
    // Verified once: the record has done its work (the enclave also remembers it was verified).
    Ok(Outcome {
        result: json!({ "verificationToken": resp.verification_token }),
        writes: vec![spent(&ctx, intent.otp_id)],
    })
}
