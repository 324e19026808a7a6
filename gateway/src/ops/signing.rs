//! Payload and transaction signing: resolve `signWith` to sealed key material, let the enclave
//! sign what the stamped body asks for.

use coffer_proto::v1 as pb;
use serde::Deserialize;
use serde_json::Value;

use super::sealed;
use crate::activity::registry::{Ctx, Outcome};
use crate::custody::made_by_enclave;
use crate::error::ApiError;
use crate::store::SignWithKey;

/// The sealed key `signWith` names, and the address format when it names a private key by one of
/// its addresses.
async fn signing_key(ctx: &Ctx, sign_with: &str) -> Result<(pb::SealedRef, String), ApiError> {
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
    Ok((key, address_format))
}

async fn sign(ctx: &Ctx, sign_with: &str) -> Result<Value, ApiError> {
    let (key, address_format) = signing_key(ctx, sign_with).await?;
    let resp = ctx.enclave().sign(pb::SignRequest { key: Some(key), address_format, ..Default::default() }).await?;
    made_by_enclave(&resp.result)
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

/// An EIP-712 or EIP-7702 payload that does not parse (past its bounds included) is a 400
/// naming why, before policies see it: coffer-chain's parser, which the enclave signs with.
pub fn check_payloads(params: &Value) -> Result<(), ApiError> {
    let encoding = params.get("encoding").and_then(Value::as_str).unwrap_or_default();
    let payloads = params.get("payloads").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let payloads = params.get("payload").into_iter().chain(payloads).filter_map(Value::as_str);
    for payload in payloads {
        coffer_chain::check_payload(encoding, payload).map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    Ok(())
}

pub async fn sign_raw_payload(ctx: Ctx, i: SignRawPayloadIntent) -> Result<Outcome, ApiError> {
    Ok(Outcome { result: sign(&ctx, &i.sign_with).await?, writes: vec![] })
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
    Ok(Outcome { result: sign(&ctx, &i.sign_with).await?, writes: vec![] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignTransactionIntent {
    sign_with: String,
    #[allow(dead_code)]
    unsigned_transaction: String,
    #[allow(dead_code)]
    r#type: String,
}

/// A transaction that does not parse is a 400 naming the field, before policies see it. The
/// enclave parses the stamped body again and signs only what it parsed itself.
pub fn check_transaction(params: &Value) -> Result<(), ApiError> {
    let text = |k: &str| params.get(k).and_then(Value::as_str);
    let ty = text("type").ok_or_else(|| ApiError::invalid("type is required"))?;
    let unsigned = text("unsignedTransaction").ok_or_else(|| ApiError::invalid("unsignedTransaction is required"))?;
    coffer_chain::parse(ty, unsigned).map(drop).map_err(|e| ApiError::invalid(e.to_string()))
}

pub async fn sign_transaction(ctx: Ctx, i: SignTransactionIntent) -> Result<Outcome, ApiError> {
    let (key, address_format) = signing_key(&ctx, &i.sign_with).await?;
    let signed = ctx
        .enclave()
        .sign_transaction(pb::SignRequest { key: Some(key), address_format, ..Default::default() })
        .await?;
    Ok(Outcome { result: made_by_enclave(&signed.result)?, writes: vec![] })
}

#[cfg(test)]
mod tests {
    use k256::ecdsa::{RecoveryId, Signature, VerifyingKey};
    use serde_json::{json, Value};
    use sha3::Digest;

    use crate::custody::in_process::Harness;

    /// The Ethereum address that signed `digest` with (r, s, v), recovered by k256.
    fn signer_address(digest: &[u8; 32], signature: &Value) -> String {
        let text = |k: &str| signature[k].as_str().unwrap().to_string();
        let rs = hex::decode(text("r") + &text("s")).unwrap();
        let v = u8::from_str_radix(&text("v"), 16).unwrap();
        let key = VerifyingKey::recover_from_prehash(
            digest,
            &Signature::from_slice(&rs).unwrap(),
            RecoveryId::from_byte(v).unwrap(),
        )
        .unwrap();
        let point = key.to_encoded_point(false);
        format!("0x{}", hex::encode(&sha3::Keccak256::digest(&point.as_bytes()[1..])[12..]))
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_enclave_signs_what_the_stamped_body_says_with_the_named_key() {
        let h = Harness::new().await;
        let (_, addresses) = h.ethereum_wallet("signer", &[0, 1]).await;
        let intent = |sign_with: &str, payload: &str| {
            json!({
                "signWith": sign_with,
                "payload": payload,
                "encoding": "PAYLOAD_ENCODING_TEXT_UTF8",
                "hashFunction": "HASH_FUNCTION_KECCAK256",
            })
        };
        let signature = h
            .run("sign_raw_payload", "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", intent(&addresses[1], "hello"))
            .await
            .unwrap();
        let digest: [u8; 32] = sha3::Keccak256::digest(b"hello").into();
        assert_eq!(signer_address(&digest, &signature), addresses[1].to_lowercase());

        let mut many = intent(&addresses[0], "");
        many["payloads"] = json!(["one", "two"]);
        let result = h.run("sign_raw_payloads", "ACTIVITY_TYPE_SIGN_RAW_PAYLOADS", many).await.unwrap();
        let signatures = result["signatures"].as_array().unwrap();
        assert_eq!(signatures.len(), 2);
        for (payload, signature) in ["one", "two"].iter().zip(signatures) {
            let digest: [u8; 32] = sha3::Keccak256::digest(payload.as_bytes()).into();
            assert_eq!(signer_address(&digest, signature), addresses[0].to_lowercase());
        }

        // An address the organization does not hold: refused, nothing signed.
        let stranger = "0x000000000000000000000000000000000000dEaD";
        let err = h.run("sign_raw_payload", "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2", intent(stranger, "x")).await;
        assert!(err.is_err(), "{err:?}");
    }
}
