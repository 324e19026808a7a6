//! Signing with a sealed key: raw payloads, and transactions parsed from the stamped body.

use coffer_auth::envelope::{items, text};
use coffer_crypto::{address, sign, Curve};
use coffer_proto::v1 as pb;
use serde_json::{json, Value};

use super::sealed_refs::{open_key, sealed};
use crate::admission::{refuse, Admission, Admitted};
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::{BlobKind, Hsm};

/// Activity types, as the stamped bodies name them.
mod types {
    pub const SIGN_RAW_PAYLOAD: &str = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
    pub const SIGN_RAW_PAYLOADS: &str = "ACTIVITY_TYPE_SIGN_RAW_PAYLOADS";
    pub const SIGN_TRANSACTION: &str = "ACTIVITY_TYPE_SIGN_TRANSACTION_V2";
}

/// Signs the stamped body's raw payloads with the key its `signWith` names.
pub(super) fn sign(hsm: &Hsm, admission: &Admission, req: pb::SignRequest) -> Result<pb::SignResponse, EnclaveError> {
    let (a, unspent, link) =
        admission.authorize_key_use("sign", req.auth.as_ref(), &[types::SIGN_RAW_PAYLOAD, types::SIGN_RAW_PAYLOADS])?;
    let (key_ref, kind) = sealed(req.key.as_ref(), &[BlobKind::WalletAccountKey, BlobKind::PrivateKey], &a)?;
    names_key(&a, key_ref, kind, &req.address_format)?;
    let p = &a.activity.parameters;
    let payloads: Vec<&str> = if a.activity.activity_type == types::SIGN_RAW_PAYLOAD {
        vec![p.get("payload").and_then(Value::as_str).ok_or_else(|| EnclaveError::invalid("payload is required"))?]
    } else {
        items(p, "payloads")
            .iter()
            .map(|v| v.as_str().ok_or_else(|| EnclaveError::invalid("payloads must be strings")))
            .collect::<Result<_, _>>()?
    };
    if payloads.is_empty() {
        return Err(EnclaveError::invalid("payloads must not be empty"));
    }
    let key = open_key(hsm, key_ref, kind)?;
    let signatures = payloads
        .into_iter()
        .map(|payload| {
            let sig = key.sign_payload(hsm, payload, text(p, "encoding"), text(p, "hashFunction"))?;
            Ok(pb::Signature { r: sig.r, s: sig.s, v: sig.v })
        })
        .collect::<Result<Vec<_>, EnclaveError>>()?;
    let rendered: Vec<Value> = signatures.iter().map(|s| json!({ "r": s.r, "s": s.s, "v": s.v })).collect();
    // The API's result: one signature's `{r, s, v}`, or `{signatures}`.
    let api_result = match &rendered[..] {
        [one] if a.activity.activity_type == types::SIGN_RAW_PAYLOAD => one.clone(),
        _ => json!({ "signatures": rendered }),
    };
    let result = json!({ "signWith": text(p, "signWith"), "signatures": rendered });
    let app_proofs = crate::proofs::of_call(hsm, &a, result)?;
    // Spent once the work is done, with the activity's link, in one transaction: a refused or
    // failed call spends nothing, and no signature leaves without its stamp spent, its allow
    // (with the result made) in the decision log and its link in the activity log.
    let spent = unspent.with_result(&api_result);
    let log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &api_result, &app_proofs)?;
    let (evaluation, result) = (a.evaluation(), api_result.to_string().into_bytes());
    Ok(pb::SignResponse { app_proofs, signatures, evaluation, result, log_link })
}

/// Signs the stamped body's transaction, parsed here, with the key its `signWith` names.
pub(super) fn sign_transaction(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::SignRequest,
) -> Result<pb::SignTransactionResponse, EnclaveError> {
    let (a, unspent, link) =
        admission.authorize_key_use("sign_transaction", req.auth.as_ref(), &[types::SIGN_TRANSACTION])?;
    let (key_ref, kind) = sealed(req.key.as_ref(), &[BlobKind::WalletAccountKey, BlobKind::PrivateKey], &a)?;
    names_key(&a, key_ref, kind, &req.address_format)?;
    // The transaction is the stamped body's, parsed here: the gateway's parse decides
    // nothing the enclave signs.
    let p = &a.activity.parameters;
    let tx = coffer_chain::parse(text(p, "type"), text(p, "unsignedTransaction"))
        .map_err(|e| EnclaveError::invalid(e.to_string()))?;
    let key = open_key(hsm, key_ref, kind)?;
    let needs = |curve: Curve, chain: &str| {
        if key.curve() == curve {
            Ok(())
        } else {
            Err(EnclaveError::invalid(format!(
                "signWith: {chain} transactions are signed by a {} key",
                curve.wire_name()
            )))
        }
    };
    let signed_transaction = match &tx {
        coffer_chain::Unsigned::Ethereum(t) => {
            needs(Curve::Secp256k1, "Ethereum")?;
            let sig = key.sign_digest(hsm, &t.signing_hash())?;
            t.signed(&sig.r, &sig.s, sig.recovery_id == 1)
        }
        coffer_chain::Unsigned::Tron(t) => {
            needs(Curve::Secp256k1, "Tron")?;
            let sig = key.sign_digest(hsm, &t.signing_hash())?;
            t.signed(&sig.r, &sig.s, sig.recovery_id)
        }
        coffer_chain::Unsigned::Solana(t) => {
            needs(Curve::Ed25519, "Solana")?;
            let slot = t.signer_slot(&key.public_key()?).map_err(|e| EnclaveError::invalid(e.to_string()))?;
            t.signed(slot, &sign::sign_ed25519(key.secret()?.secret_bytes(), t.message()))
        }
    };
    let api_result = json!({ "signedTransaction": hex::encode(&signed_transaction) });
    let result = json!({
        "signWith": text(p, "signWith"),
        "signedTransactionSha256": hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&signed_transaction)),
    });
    let app_proofs = crate::proofs::of_call(hsm, &a, result)?;
    let spent = unspent.with_result(&api_result);
    let log_link = crate::proofs::spend_and_link(hsm, admission, &a, spent, link, &api_result, &app_proofs)?;
    let (evaluation, result) = (a.evaluation(), api_result.to_string().into_bytes());
    Ok(pb::SignTransactionResponse { app_proofs, signed_transaction, evaluation, result, log_link })
}

/// `signWith` of the body names this key: an account by its address, a private key by its id or
/// by one of its addresses (recomputed here from the bound public key).
fn names_key(a: &Admitted, sealed: &pb::SealedRef, kind: BlobKind, address_format: &str) -> Result<(), EnclaveError> {
    let sign_with = text(&a.activity.parameters, "signWith");
    let named = match kind {
        BlobKind::WalletAccountKey => !sign_with.is_empty() && sign_with == sealed.address,
        _ if sign_with == sealed.resource_id => true,
        _ if !address_format.is_empty() => {
            let curve = Curve::parse(&sealed.curve)?;
            let public_key = hex::decode(&sealed.public_key).map_err(|_| EnclaveError::invalid("bad public key"))?;
            address::address(address_format, curve, &public_key).is_ok_and(|addr| addr == sign_with)
        }
        _ => false,
    };
    if named {
        Ok(())
    } else {
        Err(refuse(
            a,
            RefusalReason::BindingMismatch,
            "the sealed key is not the one signWith names in the stamped body",
        ))
    }
}
