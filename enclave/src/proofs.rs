//! The enclave's signed statements: app proofs of what an authorized call decided and did (when
//! its stamped body asks), its boot proof, each organization's activity log, and its state.
//!
//! Formats are `coffer_auth::proof`'s (the verifiers run the same code); the proof key never
//! leaves the HSM, and nothing here signs what the gateway says alone: a call's proof states the
//! enclave's own decision and output, and a log link a submission whose stamp it verified.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use coffer_auth::proof;
use coffer_auth::state_proof::StateItem;
use coffer_proto::v1 as pb;
use serde_json::{json, Value};

use crate::activity_log::Entry;
use crate::admission::{now_ms, Admission, Admitted, DecidedSubmission, Unspent};
use crate::bounded_cache::BoundedCache;
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::Hsm;
use crate::link_request::{Ballot, LinkRequest, ACTIVITY_COMPLETED, ACTIVITY_REJECTED, VOTE_APPROVED};
use crate::store::{LoggedDecision, Spend};

/// `payload`, signed by the proof key.
fn signed(hsm: &Hsm, payload: String) -> Result<pb::AppProof, EnclaveError> {
    let signature = hsm.sign_proof(&payload)?;
    Ok(wire(proof::app_proof(&hsm.proof_public_key()?, payload, &signature)))
}

/// A proof as the gRPC contract carries it.
fn wire(p: proof::AppProof) -> pb::AppProof {
    pb::AppProof { scheme: p.scheme, public_key: p.public_key, proof_payload: p.proof_payload, signature: p.signature }
}

/// A proof as the API renders it (the inverse of [`wire`]).
fn unwired(p: &pb::AppProof) -> proof::AppProof {
    proof::AppProof {
        scheme: p.scheme.clone(),
        public_key: p.public_key.clone(),
        proof_payload: p.proof_payload.clone(),
        signature: p.signature.clone(),
    }
}

/// When the stamped body asks for proofs: one `APP_PROOF_TYPE_POLICY_OUTCOME` proof of the
/// enclave's decision on this call (what decided, over which state version, with which verified
/// approvals) and of `result`, what the call produced as the enclave computed it.
pub fn of_call(hsm: &Hsm, a: &Admitted, result: Value) -> Result<Vec<pb::AppProof>, EnclaveError> {
    if !a.activity.generate_app_proofs {
        return Ok(Vec::new());
    }
    let approvals: Vec<Value> = a
        .approvals()
        .map(|v| {
            json!({
                "userId": v.user_id,
                "publicKey": v.public_key,
                "credentialType": v.credential_type,
                "stampedAtMs": v.at_ms.to_string(),
            })
        })
        .collect();
    let d = &a.decided;
    let (decided_by, policies, version) = (d.evaluation.reason, d.evaluation.outcomes_json(), d.loaded.state.version);
    let context = json!({
        "organizationId": a.activity.organization_id,
        "operation": a.operation,
        "fingerprint": a.activity.fingerprint,
        "activityType": a.activity.activity_type,
        "approvals": approvals,
    });
    let data = json!({ "organizationId": a.credential.organization_id, "stateVersion": version.to_string() });
    let body = json!({
        "organizationId": a.activity.organization_id,
        "outcome": "OUTCOME_ALLOW",
        "decisionContextDigest": proof::json_digest(&context),
        "organizationDataDigest": proof::json_digest(&data),
        "userRequestApprovals": [],
        "cofferDecision": {
            "operation": a.operation,
            "fingerprint": a.activity.fingerprint,
            "activityType": a.activity.activity_type,
            "decidedBy": decided_by,
            "policies": policies,
            "approvals": approvals,
            "stateOrganizationId": a.credential.organization_id,
            "stateVersion": version.to_string(),
            "resultDigest": proof::json_digest(&result),
            "result": result,
        },
    });
    Ok(vec![signed(hsm, proof::payload(proof::POLICY_OUTCOME, now_ms(), "policyOutcomeProof", body))?])
}

/// When the stamped body asks for proofs: one `APP_PROOF_TYPE_ADDRESS_DERIVATION` proof per
/// derived account, `(path, address)`, of the wallet `wallet_id` of `organization_id`.
pub fn of_addresses(
    hsm: &Hsm,
    a: &Admitted,
    organization_id: &str,
    wallet_id: &str,
    accounts: &[(&str, &str)],
) -> Result<Vec<pb::AppProof>, EnclaveError> {
    if !a.activity.generate_app_proofs {
        return Ok(Vec::new());
    }
    let now = now_ms();
    accounts
        .iter()
        .map(|(path, address)| {
            let body = json!({
                "organizationId": organization_id,
                "walletId": wallet_id,
                "derivationPath": path,
                "address": address,
            });
            signed(hsm, proof::payload(proof::ADDRESS_DERIVATION, now, "addressDerivationProof", body))
        })
        .collect()
}

/// What the boot proof states besides the HSM's keys: known to `main` only.
#[derive(Debug, Clone, Default)]
pub struct BootFacts {
    /// SHA-256 of the configuration as this enclave read it (no secret is in it: PINs and
    /// passwords are in files or the environment it names).
    pub configuration_digest: String,
    pub pkcs11_module: String,
    pub token_label: String,
    /// When the process started (ms since the Unix epoch).
    pub started_at_ms: i64,
}

/// The enclave's boot proof: its manifest (binary, version, configuration, HSM, service keys,
/// start time) signed by the proof key. It attests what this process says of itself with a key
/// only the HSM holds; there is no hardware attestation of the process (docs/proofs.md "Proofs").
pub fn boot_proof(hsm: &Hsm, facts: &BootFacts) -> Result<pb::BootProof, EnclaveError> {
    use sha2::Digest;
    let started = facts.started_at_ms;
    let binary = std::env::current_exe()
        .and_then(std::fs::read)
        .map(|b| hex::encode(sha2::Sha256::digest(b)))
        .unwrap_or_default();
    let login = hsm.login_public_keys().ok();
    let body = json!({
        "enclaveApp": "coffer-enclave",
        "version": env!("CARGO_PKG_VERSION"),
        "binarySha256": binary,
        "configurationDigest": facts.configuration_digest,
        "hsm": { "pkcs11Module": facts.pkcs11_module, "tokenLabel": facts.token_label },
        "serviceKeys": {
            "proof": hex::encode(hsm.proof_public_key()?),
            "bundleSigner": hsm.signer_public_key().map(hex::encode).unwrap_or_default(),
            "webhookSigner": hsm.webhook_public_key().map(hex::encode).unwrap_or_default(),
            "notarizer": login.map(|k| hex::encode(k.notarizer)).unwrap_or_default(),
            "oidcIssuer": login.map(|k| hex::encode(k.oidc_issuer)).unwrap_or_default(),
            "tlsFetcher": login.map(|k| hex::encode(k.tls_fetcher)).unwrap_or_default(),
        },
        "startedAtMs": started.to_string(),
        "attestation": "none",
    });
    let proof = signed(hsm, proof::payload(proof::BOOT, started, "cofferManifest", body))?;
    Ok(pb::BootProof { proof: Some(proof), started_at_ms: started as u64, version: env!("CARGO_PKG_VERSION").into() })
}

/// Appends a finished activity to its organization's log (see `RecordActivity` in the proto).
pub fn record_activity(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::RecordActivityRequest,
) -> Result<pb::RecordActivityResponse, EnclaveError> {
    let request = req
        .request
        .as_ref()
        .ok_or_else(|| EnclaveError::refused(RefusalReason::NoAuthorization, "no stamped request"))?;
    // A submission this enclave authorized lately had its stamp and certificate verified then.
    let fingerprint = coffer_auth::envelope::fingerprint(&request.body);
    // A state change `ApplyActivity` applies is linked by what the decision log says of it,
    // never by an earlier call's allow this enclave remembers (a handler's call before the apply:
    // that allow says nothing of whether the change was applied).
    let applied_by_apply_activity = coffer_auth::envelope::StampedActivity::parse(&request.body).is_ok_and(|s| {
        coffer_org_rules::subjects::subject(&s.activity_type).is_some()
            && !coffer_org_rules::subjects::has_own_call(&s.activity_type)
    });
    let linked_fingerprint = fingerprint.clone();
    let lately = admission.authorized_lately(&fingerprint).filter(|_| !applied_by_apply_activity);
    let to_link = match lately {
        Some(mut submission) => {
            // Remembered at its allow; how the call ended after it (done, refused, failed:
            // recorded before it answered) is read from the decision log.
            let latest = admission.store().decided(&submission.organization_id, &fingerprint)?;
            let logged = match latest.logged {
                LoggedDecision::Refused => LoggedDecision::Refused,
                _ => LoggedDecision::Authorized,
            };
            if latest.logged != LoggedDecision::Nothing {
                submission.result_digest = latest.result_digest;
            }
            ToLink { fingerprint, logged, submission, spend: None }
        }
        None => {
            let (stamped, credential) = admission.verify_submission(request)?;
            // Its submitter is of its organization: a credential of another (a sign-up's, say)
            // does not stand as the first vote of this organization's activity. (A parent's
            // login is linked when the enclave that decided it still knows it, above.)
            if credential.organization_id != stamped.organization_id {
                return Err(EnclaveError::refused(
                    RefusalReason::OrganizationMismatch,
                    "the credential belongs to another organization than the stamped body",
                ));
            }
            let latest = admission.store().decided(&stamped.organization_id, &fingerprint)?;
            // One the enclave never decided (the gateway refused or failed it first) is linked
            // only while its stamp is fresh: not a stamp kept for a day and reported later.
            if latest.logged == LoggedDecision::Nothing && !admission.is_fresh(stamped.timestamp_ms) {
                return Err(EnclaveError::refused(
                    RefusalReason::Stale,
                    "the enclave never decided this activity and its stamp is no longer fresh",
                ));
            }
            let submission = DecidedSubmission {
                organization_id: stamped.organization_id,
                activity_type: stamped.activity_type,
                user_id: credential.user_id,
                public_key: credential.public_key,
                result_digest: latest.result_digest,
            };
            ToLink { fingerprint, logged: latest.logged, submission, spend: None }
        }
    };
    // The body is the one authorized (its fingerprint named it): what the activity must state.
    let stamped = coffer_auth::envelope::StampedActivity::parse(&request.body)
        .map_err(|e| EnclaveError::invalid(e.to_string()))?;
    let activity = crate::link_request::check_recorded(&stamped, &req.activity)?;
    // The votes it states are the ones their voters stamped, verified here: none made up. A
    // rejection only of an activity the enclave found waiting for votes and never allowed.
    let votes = admission.verify_votes(&stamped, &req.votes)?;
    let submitter = Ballot {
        user_id: to_link.submission.user_id.clone(),
        selection: VOTE_APPROVED,
        public_key: to_link.submission.public_key.clone(),
        message: String::from_utf8_lossy(&request.body).into_owned(),
    };
    // Rejected only with a rejection the enclave kept (verified when it was cast; its ballot
    // lasts while the activity can be voted on, its decision log line after), and then only
    // rejected: a gateway cannot link as failed what a voter rejected, nor reject alone. The
    // rejections it states are ones the enclave kept, while it keeps the ballots.
    let never_ran = to_link.logged != LoggedDecision::Authorized;
    let (org, fp) = (&stamped.organization_id, &stamped.fingerprint);
    let mut rejecters = admission.store().vote_rejecters(org, fp)?;
    let kept = admission.store().ballots(org, fp, now_ms())?;
    rejecters.extend(kept.into_iter().filter(|b| b.rejected).map(|b| b.user_id));
    let rejection_kept = never_ran && !rejecters.is_empty();
    if votes.iter().any(|v| v.selection != VOTE_APPROVED && !rejecters.contains(&v.user_id)) {
        return Err(EnclaveError::refused(
            RefusalReason::BindingMismatch,
            "the activity to link states a rejection the enclave did not keep",
        ));
    }
    let may_be_rejected = rejection_kept
        && admission.store().waited_for_votes(
            &stamped.organization_id,
            &stamped.fingerprint,
            &stamped.activity_type,
        )?;
    if rejection_kept && activity.get("status").and_then(Value::as_str) != Some(ACTIVITY_REJECTED) {
        return Err(EnclaveError::refused(
            RefusalReason::BindingMismatch,
            "the activity to link was rejected by a vote the enclave keeps, and is not stated rejected",
        ));
    }
    crate::link_request::check_recorded_votes(&activity, &submitter, &votes, may_be_rejected)?;
    // A state change linked as failed or rejected: if its `ApplyActivity` spent its replay entry
    // (committed with the apply's allow), what the apply left decides (an applied change is
    // linked only as completed; one that failed after its spend, as failed); if not, the link
    // spends that entry in its own transaction, so that an apply racing it is refused, or the
    // link is (the apply committed first).
    // The decision log is read again after the replay entry was looked at: an apply that
    // committed meanwhile is seen either way.
    let mut to_link = to_link;
    if applied_by_apply_activity && activity.get("status").and_then(Value::as_str) != Some(ACTIVITY_COMPLETED) {
        let spent_by_apply = admission.apply_spent(&stamped)?;
        let latest = admission.store().decided(&stamped.organization_id, &to_link.fingerprint)?;
        to_link.logged = latest.logged;
        to_link.submission.result_digest = latest.result_digest;
        if !spent_by_apply {
            to_link.spend = Some(admission.apply_spend_of(&stamped, &to_link.submission.user_id)?);
        }
    }
    // A login, session or one-time code is linked as its own call ended: completed only once
    // done (not while it runs, nor after it failed), otherwise only if not done (a login done is
    // not hidden as failed). Linked otherwise while its stamp is unspent, the link spends the
    // replay entry the call would, in its own transaction: of the two, the second is refused.
    if let Some(operation) = coffer_org_rules::subjects::login_operation(&stamped.activity_type) {
        let done = to_link.submission.result_digest.starts_with(crate::store::DONE_MARK);
        let completed = activity.get("status").and_then(Value::as_str) == Some(ACTIVITY_COMPLETED);
        if completed && !done {
            return Err(EnclaveError::refused(
                RefusalReason::NotDecided,
                "the enclave has not done this activity: it is linked completed only once its call has",
            ));
        }
        // Not while its call may still run either (its allow stands, neither done nor failed):
        // the call would finish behind the link. A call cut off there stays unlinked.
        if !completed && to_link.logged == LoggedDecision::Authorized {
            return Err(EnclaveError::refused(
                RefusalReason::BindingMismatch,
                match done {
                    true => "the enclave did this activity: it is linked only as completed",
                    false => {
                        "the enclave allowed this activity and it has not failed: it is linked failed only once it has"
                    }
                },
            ));
        }
        if !completed && !admission.spent_by(operation, &stamped)? {
            to_link.spend = Some(admission.spend_of(operation, &stamped, &to_link.submission.user_id)?);
        }
    }
    let (link, seq) = link_activity(hsm, admission, to_link, &activity)?;
    // Linked: what this enclave remembered of it is no longer needed (a link refused keeps it,
    // for the one enclave that can verify an attested stamp).
    admission.forget_authorized(&linked_fingerprint);
    Ok(pb::RecordActivityResponse { link: Some(link), seq })
}

/// A key use's result and its link, together: the stamp is spent (its replay entry and its allow,
/// with the result made) and the activity linked completed, with `result` and this call's
/// `app_proofs`, in one transaction of the authority store, or neither is (a replay, a full share,
/// a link the log refuses). Key work for another activity (a new sub-organization's wallet) asks
/// for no link: its stamp is spent alone, and that activity's own call links it.
pub fn spend_and_link(
    hsm: &Hsm,
    admission: &Admission,
    a: &Admitted,
    unspent: Unspent,
    asked: Option<LinkRequest>,
    result: &Value,
    app_proofs: &[pb::AppProof],
) -> Result<Option<pb::LogLink>, EnclaveError> {
    let Some(asked) = asked else {
        admission.spend(a, unspent)?;
        return Ok(None);
    };
    admission
        .spend_within(a, unspent, |spend| link_in_call(hsm, admission, a, asked, Some(result), app_proofs, Some(spend)))
        .map(Some)
}

/// Links the activity `asked` (checked when the call was authorized) in this call: completed,
/// with `result` when the call made it (a key use's, as its allow recorded it) and this call's
/// `app_proofs`, spending `spend` in the same transaction if given.
fn link_in_call(
    hsm: &Hsm,
    admission: &Admission,
    a: &Admitted,
    asked: LinkRequest,
    result: Option<&Value>,
    app_proofs: &[pb::AppProof],
    spend: Option<Spend>,
) -> Result<pb::LogLink, EnclaveError> {
    let proofs = app_proofs.iter().map(|p| serde_json::to_value(unwired(p))).collect::<Result<Vec<_>, _>>();
    let activity = asked.completed(result, proofs.map_err(|e| EnclaveError::Internal(e.to_string()))?);
    let submission = DecidedSubmission {
        organization_id: a.activity.organization_id.clone(),
        activity_type: a.activity.activity_type.clone(),
        user_id: a.credential.user_id.clone(),
        public_key: a.credential.public_key.clone(),
        result_digest: result.map(proof::json_digest).unwrap_or_default(),
    };
    let to_link =
        ToLink { fingerprint: a.activity.fingerprint.clone(), logged: LoggedDecision::Authorized, submission, spend };
    let (link, seq) = link_activity(hsm, admission, to_link, &activity)?;
    coffer_process::crash_point::here("enclave-after-link");
    Ok(pb::LogLink { link: Some(link), seq })
}

/// [`link_in_call`] for a state change applied already: one that is not linked stays unlogged (a
/// warning here; `verify-log` lists it), as the change stands.
pub fn link_applied(
    hsm: &Hsm,
    admission: &Admission,
    a: &Admitted,
    asked: Option<LinkRequest>,
    app_proofs: &[pb::AppProof],
) -> Option<pb::LogLink> {
    match link_in_call(hsm, admission, a, asked?, None, app_proofs, None) {
        Ok(linked) => Some(linked),
        Err(e) => {
            tracing::warn!(error = %e, fingerprint = %a.activity.fingerprint, "an activity was not linked in its call");
            None
        }
    }
}

/// Most items one signed state may hold, checked before it is encoded: a larger organization's
/// state is refused whole rather than built in memory for one answer.
const MAX_STATE_ITEMS: usize = 100_000;
/// Most bytes of one encoded state (the gateway takes answers up to 64 MiB).
const MAX_STATE_BYTES: usize = 16 * 1024 * 1024;
/// Most state requests this enclave works on at once, whoever asks: the gateway's share per
/// organization bounds each tenant, this bounds them all (and calls whose asker went away).
const STATE_REQUESTS_AT_ONCE: usize = 2;
/// What the encoded states kept between requests may weigh together.
const ENCODED_STATES_BYTES: usize = 16 * 1024 * 1024;

/// An organization's state as encoded once for its version.
struct EncodedState {
    version: u64,
    bytes: Vec<u8>,
    digest: String,
}

/// Encoded states, by organization: a state is encoded once per version, then only signed.
fn encoded_states() -> &'static BoundedCache<Arc<EncodedState>> {
    static STATES: OnceLock<BoundedCache<Arc<EncodedState>>> = OnceLock::new();
    STATES.get_or_init(|| BoundedCache::new(ENCODED_STATES_BYTES))
}

/// Holds one of the [`STATE_REQUESTS_AT_ONCE`] places while it lives.
struct StatePlace;

static STATE_REQUESTS: AtomicUsize = AtomicUsize::new(0);

impl StatePlace {
    fn take() -> Result<Self, EnclaveError> {
        let taken = STATE_REQUESTS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < STATE_REQUESTS_AT_ONCE).then_some(n + 1));
        match taken {
            Ok(_) => Ok(Self),
            Err(_) => Err(EnclaveError::Busy {
                reason: RefusalReason::Unspecified,
                message: "the enclave is busy with other state requests: retry".into(),
            }),
        }
    }
}

impl Drop for StatePlace {
    fn drop(&mut self) {
        STATE_REQUESTS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The organization's state as this enclave decides on it now (read again from the store if
/// another enclave moved it), signed for the verifier's `nonce`: version 0 and no entries when
/// the enclave has no state for it.
pub fn organization_state(
    hsm: &Hsm,
    admission: &Admission,
    organization_id: &str,
    nonce: &str,
) -> Result<pb::GetOrganizationStateResponse, EnclaveError> {
    if organization_id.is_empty() {
        return Err(EnclaveError::invalid("organization_id is required"));
    }
    if !proof::is_log_nonce(nonce) {
        return Err(EnclaveError::invalid("a state's nonce is 16 to 128 hex digits"));
    }
    let _place = StatePlace::take()?;
    let loaded = admission.rules().load(organization_id)?;
    let version = loaded.as_ref().map_or(0, |l| l.state.version);
    let encoded = match encoded_states().get(organization_id).filter(|e| e.version == version) {
        Some(kept) => kept,
        None => {
            let state = loaded.as_ref().map(|l| &l.state);
            let items = state.map_or(0, |s| s.record_count() + s.retired_key_ids.len());
            if items > MAX_STATE_ITEMS {
                return Err(EnclaveError::invalid(format!(
                    "the organization's state has {items} items: more than the {MAX_STATE_ITEMS} one answer may carry"
                )));
            }
            let entries = state.map(|s| s.entries()).unwrap_or_default();
            let bytes = coffer_auth::state_proof::encode(entries.iter().map(|e| StateItem {
                kind: e.kind,
                id: &e.id,
                data: &e.data,
            }));
            if bytes.len() > MAX_STATE_BYTES {
                return Err(EnclaveError::invalid(format!(
                    "the organization's state is {} bytes: more than the {MAX_STATE_BYTES} one answer may carry",
                    bytes.len()
                )));
            }
            let digest = coffer_auth::state_proof::digest(&bytes);
            let encoded = Arc::new(EncodedState { version, digest, bytes });
            encoded_states().insert(organization_id, encoded.clone(), encoded.bytes.len());
            encoded
        }
    };
    // The log's position now (read after the state: a link made meanwhile is of a state no older).
    let (seq, head) = log_position(admission, organization_id)?;
    let log = coffer_auth::state_proof::LogPosition { seq, head };
    let payload = coffer_auth::state_proof::payload(now_ms(), organization_id, version, nonce, &encoded.digest, &log);
    Ok(pb::GetOrganizationStateResponse { state: Some(signed(hsm, payload)?), version, entries: encoded.bytes.clone() })
}

/// What the enclave knows of an activity it is asked to link: the stamped submission's
/// fingerprint, its latest decision, and what that decided.
struct ToLink {
    fingerprint: String,
    logged: LoggedDecision,
    submission: DecidedSubmission,
    /// The stamp spent with the link (a key use's), in the log's transaction.
    spend: Option<Spend>,
}

/// Appends `activity` (as the API serves it) to its organization's log, if it is the decided
/// submission's, finished, with this enclave's app proofs only, completed only if authorized,
/// and as the enclave did it when it made the result.
fn link_activity(
    hsm: &Hsm,
    admission: &Admission,
    to_link: ToLink,
    activity: &Value,
) -> Result<(pb::AppProof, u64), EnclaveError> {
    let ToLink { fingerprint, logged, submission, spend } = to_link;
    let DecidedSubmission { organization_id, activity_type, result_digest, .. } = submission;
    let text = |k: &str| activity.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    if text("organizationId") != organization_id || text("fingerprint") != fingerprint || text("type") != activity_type
    {
        return Err(EnclaveError::refused(
            RefusalReason::BindingMismatch,
            "the activity is not the stamped submission's (organization, fingerprint or type)",
        ));
    }
    let (id, status) = (text("id"), text("status"));
    if id.is_empty() || !proof::FINAL_STATUSES.contains(&status.as_str()) {
        return Err(EnclaveError::invalid("only a finished activity with an id is recorded"));
    }
    let key = hsm.proof_public_key()?;
    for p in activity.get("appProofs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        let ours = serde_json::from_value::<proof::AppProof>(p.clone())
            .ok()
            .is_some_and(|p| proof::verify(&p, Some(&key)).is_ok());
        if !ours {
            return Err(EnclaveError::refused(
                RefusalReason::BindingMismatch,
                "an app proof of the activity is not this enclave's",
            ));
        }
    }
    // The log says an activity completed only if the enclave authorized it.
    if status == ACTIVITY_COMPLETED && logged != LoggedDecision::Authorized {
        return Err(EnclaveError::refused(
            RefusalReason::NotDecided,
            "the activity is reported completed but the enclave never authorized it",
        ));
    }
    // A state change the enclave applied is linked completed only with a result that states the
    // records it made as it made them (recorded with its allow).
    let result = activity.get("result").and_then(Value::as_object).filter(|r| r.len() == 1);
    let result_value = result.and_then(|r| r.values().next()).unwrap_or(&Value::Null);
    if let Some(states) = crate::link_request::states_recorded_made(&result_digest, result_value) {
        // ... and never as failed or rejected: the change stands (a taken-over gateway's way to
        // apply a change its log says never happened).
        if status != ACTIVITY_COMPLETED || !states {
            return Err(EnclaveError::refused(
                RefusalReason::BindingMismatch,
                "the enclave applied this change: it is linked only as completed, with the records it made, as it made them",
            ));
        }
    } else if !result_digest.is_empty() && !result_digest.starts_with(crate::store::DONE_MARK) {
        // A key use the enclave did is linked as it was done: completed, with the result the
        // enclave made (the activity's one `result` member), not one the gateway wrote.
        let made = result.and_then(|r| r.values().next()).map(proof::json_digest);
        if status != ACTIVITY_COMPLETED || made.as_deref() != Some(result_digest.as_str()) {
            return Err(EnclaveError::refused(
                RefusalReason::BindingMismatch,
                "the enclave did this activity: it is linked only as completed, with the result the enclave made",
            ));
        }
    }
    let entry = Entry {
        organization_id,
        activity_id: id,
        fingerprint,
        activity_type,
        status,
        activity_digest: proof::activity_digest(activity),
        spend,
    };
    let (log, store) = admission.activity_log();
    let sign = |link: &proof::LogLink, sign: bool| {
        let payload = link.payload(now_ms());
        if sign {
            signed(hsm, payload)
        } else {
            // Inside a group: covered by the group's signed last link.
            Ok(pb::AppProof { signature: String::new(), ..wire(proof::app_proof(&key, payload, &[0; 64])) })
        }
    };
    log.append(store, entry, &sign)
}

/// The organization's log as the store holds it now: (links appended, head; the genesis before
/// the first link).
fn log_position(admission: &Admission, organization_id: &str) -> Result<(u64, String), EnclaveError> {
    let (_, store) = admission.activity_log();
    Ok(store.log_head(organization_id)?.unwrap_or_else(|| (0, proof::genesis(organization_id))))
}

/// The organization's log head as the store holds it now, signed.
pub fn log_head(
    hsm: &Hsm,
    admission: &Admission,
    organization_id: &str,
    nonce: &str,
) -> Result<pb::GetLogHeadResponse, EnclaveError> {
    if organization_id.is_empty() {
        return Err(EnclaveError::invalid("organization_id is required"));
    }
    if !nonce.is_empty() && !proof::is_log_nonce(nonce) {
        return Err(EnclaveError::invalid("a log head's nonce is 16 to 128 hex digits"));
    }
    let (links, head) = log_position(admission, organization_id)?;
    let nonce = Some(nonce).filter(|n| !n.is_empty());
    let proof = signed(hsm, proof::log_head_payload(now_ms(), organization_id, links, &head, nonce))?;
    Ok(pb::GetLogHeadResponse { head: Some(proof), seq: links })
}
