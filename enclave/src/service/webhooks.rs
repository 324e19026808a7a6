//! Webhook deliveries: the webhook key's id and public half, and batches of deliveries signed by
//! the HSM key, each checked on its own.

use coffer_proto::v1 as pb;

use crate::admission::Admission;
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::Hsm;

/// Most webhook deliveries signed in one call.
const MAX_WEBHOOK_BATCH: usize = 256;

/// The webhook key's id: stable for a key, `coffer-webhook-` + 16 hex digits of its SHA-256.
fn webhook_key_id(public_key: &[u8; 32]) -> String {
    use sha2::Digest;
    format!("coffer-webhook-{}", hex::encode(&sha2::Sha256::digest(public_key)[..8]))
}

/// The webhook key's id and public half.
pub(super) fn signing_key(hsm: &Hsm) -> Result<pb::GetWebhookSigningKeyResponse, EnclaveError> {
    let public_key = hsm.webhook_public_key()?;
    Ok(pb::GetWebhookSigningKeyResponse { key_id: webhook_key_id(&public_key), public_key: public_key.to_vec() })
}

/// Signs a batch of webhook deliveries; each is checked on its own and a refused one gets its
/// refusal instead of a signature.
pub(super) fn sign_deliveries(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::SignWebhookDeliveriesRequest,
) -> Result<pb::SignWebhookDeliveriesResponse, EnclaveError> {
    if req.deliveries.len() > MAX_WEBHOOK_BATCH {
        return Err(crate::admission::audit_early_refusal(
            "sign_webhook_delivery",
            EnclaveError::refused(
                RefusalReason::BatchTooLarge,
                format!("at most {MAX_WEBHOOK_BATCH} webhook deliveries per call"),
            ),
        ));
    }
    let key_id = webhook_key_id(&hsm.webhook_public_key()?);
    // Each delivery is checked on its own; a refused one does not stop the others.
    let mut messages = Vec::with_capacity(req.deliveries.len());
    let refusals: Vec<Option<(String, RefusalReason)>> = req
        .deliveries
        .iter()
        .map(|d| match admission.webhook_message(&key_id, d.timestamp_ms, &d.event_id, &d.body) {
            Ok(message) => {
                messages.push(message);
                None
            }
            Err(e) => Some((e.to_string(), e.refusal_reason().unwrap_or(RefusalReason::Unspecified))),
        })
        .collect();
    let mut signatures = hsm.sign_webhooks(&messages)?.into_iter();
    let deliveries = refusals
        .into_iter()
        .map(|refusal| match refusal {
            None => pb::SignedWebhookDelivery {
                signature: signatures.next().map(|s| s.to_vec()).unwrap_or_default(),
                refusal: String::new(),
                refusal_reason: RefusalReason::Unspecified as i32,
            },
            Some((refusal, reason)) => {
                pb::SignedWebhookDelivery { signature: Vec::new(), refusal, refusal_reason: reason as i32 }
            }
        })
        .collect();
    Ok(pb::SignWebhookDeliveriesResponse { key_id, deliveries })
}
