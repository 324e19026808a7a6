//! The gateway catching up with the enclave: when it starts, every organization with an activity
//! the enclave allowed lately that the gateway's store has no record of (its answer lost with a
//! gateway that died), and while it runs, every organization with a change whose enclave call got
//! no answer (an enclave that died), is compared with the enclave's signed state and repaired as
//! `rebuild` does.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::state::AppState;
use crate::store::StoreError;

/// How far back a starting gateway looks in the enclave's decision log.
pub const WINDOW_MS: i64 = 10 * 60 * 1000;
/// Decisions read per `ListAllowed` call, and calls at most: what one start reads.
const PAGE: u32 = 10_000;
const MAX_PAGES: usize = 20;
/// Organizations caught up at most per start (the rest are logged: `rebuild` them).
const MAX_ORGANIZATIONS: usize = 1_000;

/// What one catch-up did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CaughtUp {
    /// Allowed activities the gateway's store has no record of.
    pub unrecorded: usize,
    /// Organizations compared, and those repaired.
    pub compared: usize,
    pub repaired: usize,
    /// Repairs made, and differences left (key material, what only the enclave has).
    pub repairs: usize,
    pub left: usize,
    /// Organizations whose repair could not be made now (the enclave's state moved while it was
    /// read, an activity was running): repaired by the gateway's later passes (`uncertain_outcomes`).
    pub deferred: usize,
}

/// When a starting gateway catches up a second time: past the deadline of the enclave calls a
/// dead gateway may have left in flight (`custody::transport`, 30 s).
const SECOND_PASS_AFTER: std::time::Duration = std::time::Duration::from_secs(35);

/// One catch-up of a starting gateway, retried while the enclave cannot be reached yet (a
/// minute), logged.
async fn catch_up_at_start(state: &Arc<AppState>, since: i64) {
    for attempt in 1..=60 {
        match catch_up(state, since).await {
            Ok(done) => {
                tracing::info!(
                    unrecorded = done.unrecorded,
                    compared = done.compared,
                    repaired = done.repaired,
                    repairs = done.repairs,
                    left = done.left,
                    deferred = done.deferred,
                    "caught up with the enclave"
                );
                return;
            }
            Err(e) if attempt == 60 => tracing::warn!(
                error = %e.message,
                "not caught up with the enclave: run coffer-gateway rebuild for the organizations coffer-enclave reconcile names"
            ),
            Err(_) => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
        }
    }
}

/// Catches the store up with what the enclave allowed in the last [`WINDOW_MS`] and the store has
/// no record of, in the background, retrying while the enclave cannot be reached yet (a minute),
/// and once more after [`SECOND_PASS_AFTER`]. Then, every [`UNCERTAIN_EVERY`], repairs the organizations whose change got no answer from
/// the enclave (`uncertain_outcomes`), once the enclave answers again.
pub fn spawn(state: Arc<AppState>) {
    let since = crate::store::now_nanos() / 1_000_000 - WINDOW_MS;
    tokio::spawn(async move {
        catch_up_at_start(&state, since).await;
        // Once more when every enclave call a dead gateway could have left in flight has ended
        // (the calls' deadline): one the enclave committed after the first pass compared is
        // repaired too. Beside the repairs below, which must not wait for it.
        let second = state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(SECOND_PASS_AFTER).await;
            catch_up_at_start(&second, since).await;
        });
        loop {
            tokio::time::sleep(UNCERTAIN_EVERY).await;
            let organizations = crate::uncertain_outcomes::take();
            if organizations.is_empty() {
                continue;
            }
            let Ok(proof_key) = proof_key(&state).await else {
                organizations.iter().for_each(|(o, tries)| crate::uncertain_outcomes::retry(o, *tries));
                continue;
            };
            for (org, tries) in organizations {
                match repair(&state, &org, &proof_key).await {
                    Ok((repairs, left)) => {
                        tracing::info!(organization = %org, repairs, left, "caught up with the enclave after a change it did not answer")
                    }
                    // The enclave cannot be reached yet (or the state moved): tried again later,
                    // a limited number of times.
                    Err(e) => {
                        tracing::debug!(organization = %org, error = %e, "not caught up yet");
                        crate::uncertain_outcomes::retry(&org, tries);
                    }
                }
            }
        }
    });
}

/// How often the organizations of unanswered changes are caught up.
const UNCERTAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The enclave's proof key (the point), as its boot proof names it: asked each time (a catch-up
/// is rare), so that a failed call is not kept.
async fn proof_key(state: &Arc<AppState>) -> Result<[u8; 65], crate::error::ApiError> {
    let boot = state.custody.boot_proof().await?;
    let key = boot.proof.map(|p| p.public_key).unwrap_or_default();
    hex::decode(key.get(key.len() / 2..).unwrap_or_default())
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| crate::error::ApiError::unavailable("the enclave has no proof key: nothing is caught up"))
}

/// Catches the gateway's store up with the enclave for the activities allowed since `since_ms`.
/// Errors of one organization are logged and the others go on.
pub async fn catch_up(state: &Arc<AppState>, since_ms: i64) -> Result<CaughtUp, crate::error::ApiError> {
    let mut done = CaughtUp::default();
    let mut organizations = BTreeSet::new();
    let mut since = since_ms;
    let mut cut_short = true;
    for _ in 0..MAX_PAGES {
        let page = state.custody.list_allowed(since, PAGE).await?;
        for a in &page.allowed {
            let fingerprint = a.fingerprint.clone();
            match state.db(move |s| s.activity_by_fingerprint(&fingerprint)).await? {
                // None, or one still waiting for the votes whose approved run the enclave allowed.
                Err(StoreError::NotFound) => {}
                Ok(recorded) if recorded.status == crate::activity::STATUS_CONSENSUS_NEEDED => {}
                Ok(_) => continue,
                Err(e) => return Err(e.into()),
            }
            done.unrecorded += 1;
            organizations.insert(a.organization_id.clone());
        }
        // Paged on the decisions read, not on the allows answered; decisions of the last
        // millisecond may come again on the next page (read again, harmlessly).
        if page.scanned < PAGE || page.last_at_ms <= since {
            cut_short = false;
            break;
        }
        since = page.last_at_ms;
    }
    if cut_short {
        tracing::warn!(
            "more decisions in the window than one start reads: run coffer-gateway rebuild for the organizations coffer-enclave reconcile names"
        );
    }
    // Past the first MAX_ORGANIZATIONS, the rest are caught up while the gateway runs.
    for org in organizations.iter().skip(MAX_ORGANIZATIONS) {
        crate::uncertain_outcomes::note(org);
    }
    if organizations.is_empty() {
        return Ok(done);
    }
    let proof_key = proof_key(state).await?;
    for org in organizations.iter().take(MAX_ORGANIZATIONS) {
        done.compared += 1;
        match repair(state, org, &proof_key).await {
            Ok((repairs, left)) => {
                done.repairs += repairs;
                done.left += left;
                done.repaired += usize::from(repairs > 0);
            }
            // Tried again while the gateway runs.
            Err(e) => {
                tracing::warn!(organization = %org, error = %e, "not caught up with the enclave yet");
                crate::uncertain_outcomes::note(org);
                done.deferred += 1;
            }
        }
    }
    Ok(done)
}

/// Compares one organization's records with its signed state and applies the repairs, unless the
/// state moved meanwhile (`state_rebuild::rebuild`). Answers the repairs made and the differences
/// left.
async fn repair(state: &Arc<AppState>, org: &str, proof_key: &[u8; 65]) -> anyhow::Result<(usize, usize)> {
    let sign = || signed_state(state, org, proof_key);
    let quiet = || !crate::uncertain_outcomes::is_working(org);
    let rebuilt = crate::state_rebuild::rebuild(state.store.as_ref(), org, sign, true, &quiet).await?;
    let plan = rebuilt.plan;
    for left in &plan.left {
        tracing::warn!(organization = %org, kind = %left.kind, id = %left.id, reason = left.reason, "left as it is by the catch-up");
    }
    if rebuilt.after.is_none() {
        return Ok((0, plan.left.len()));
    }
    for r in &plan.repaired {
        tracing::info!(organization = %org, kind = %r.kind, id = %r.id, action = r.action, "repaired from the enclave's state");
    }
    Ok((plan.repaired.len(), plan.left.len()))
}

/// The organization's state as the enclave signs it for a fresh nonce, verified.
async fn signed_state(
    state: &Arc<AppState>,
    org: &str,
    proof_key: &[u8; 65],
) -> anyhow::Result<coffer_auth::state_proof::SignedState> {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let answer = state.custody.organization_state(org, &nonce).await.map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let proof = answer.state.as_ref().ok_or_else(|| anyhow::anyhow!("the enclave's answer has no proof"))?;
    let proof = coffer_auth::proof::AppProof {
        scheme: proof.scheme.clone(),
        public_key: proof.public_key.clone(),
        proof_payload: proof.proof_payload.clone(),
        signature: proof.signature.clone(),
    };
    coffer_auth::state_proof::verify(&proof, &answer.entries, proof_key, org, &nonce)
        .map_err(|e| anyhow::anyhow!("the organization's state does not verify: {e}"))
}
