//! The one pipeline every submission and query runs through: stamp, envelope, dedupe, caller,
//! decision, handler, one transaction, answer.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest;

use super::registry::{Ctx, Operation, QueryCtx, Registry};
use super::render;
use super::submission::{self, Envelope};
use super::{STATUS_COMPLETED, STATUS_CONSENSUS_NEEDED, STATUS_FAILED, STATUS_REJECTED, TYPE_APPROVE, TYPE_REJECT};
use crate::error::{ApiError, Code};
use crate::ip_allowlists::Origin;
use crate::record_kinds::PARENT_CERTIFICATE;
use crate::stamps::{self, Caller, Credential};
use crate::state::AppState;
use crate::store::{
    now_nanos, ActivityRecord, Committed, ConflictKind, Nanos, Organization, PolicyEvaluationRecord, StampContext,
    Store, StoreError, Write,
};
use crate::webhook_delivery::Outbox;
use coffer_policy::context::{VOTE_APPROVED, VOTE_REJECTED};
use coffer_policy::decision;
use coffer_proto::v1::RefusalReason;

const NO_SUCH_FINGERPRINT: &str =
    "No activity found with fingerprint. Consensus activities must target an existing activity by fingerprint";

/// The queries a deleted sub-organization still answers (to its parent): its activity history.
const HISTORY_READS: &[&str] = &["list_activities", "get_activity"];

async fn organization(state: &Arc<AppState>, id: String) -> Result<Organization, ApiError> {
    state.db(move |s| s.organization(&id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::new(
            crate::error::Code::NotFound,
            "ORGANIZATION_NOT_FOUND",
            "no organization found with the given ID",
        ),
        other => other.into(),
    })
}

/// What the one-statement lookup of [`authenticate`] also told (`None`: not known, ask the store).
#[derive(Debug, Default, Clone, Copy)]
struct Prefetched {
    /// Whether an activity with the request's fingerprint exists.
    fingerprint_taken: Option<bool>,
    /// Whether the organization or its parent has webhook endpoints.
    webhook_endpoints: Option<bool>,
}

/// The organization a request names and its authenticated caller. An API-key stamp, the common
/// case, costs one store read ([`Store::stamp_context`]) that also tells whether `fingerprint`
/// is taken and whether webhook endpoints exist; other stamps, and whatever that read does not
/// find, take the separate lookups, which name precisely what is missing. `history_read`: a
/// deleted sub-organization is still found (its parent reads its activity history).
async fn authenticate(
    state: &Arc<AppState>,
    org_id: String,
    stamp: stamps::Stamp,
    fingerprint: Option<&str>,
    history_read: bool,
) -> Result<(Organization, Caller, Prefetched), ApiError> {
    let stamp = match stamp {
        stamps::Stamp::ApiKey(api_stamp, raw) => {
            let (o, pk, fp) = (org_id.clone(), api_stamp.public_key.clone(), fingerprint.map(str::to_string));
            let endpoints = crate::record_kinds::WEBHOOK_ENDPOINT;
            match state.db(move |s| s.stamp_context(&o, &pk, fp.as_deref(), endpoints)).await? {
                Ok(StampContext {
                    organization,
                    api_key,
                    via_parent,
                    user: Some(user),
                    fingerprint_taken,
                    has_records_of_kind,
                }) => {
                    let caller = stamps::api_key_caller(api_stamp, raw, api_key, user, via_parent)?;
                    let known = Prefetched {
                        fingerprint_taken: fingerprint.map(|_| fingerprint_taken),
                        webhook_endpoints: Some(has_records_of_kind),
                    };
                    return Ok((organization, caller, known));
                }
                Ok(_) | Err(StoreError::NotFound) => stamps::Stamp::ApiKey(api_stamp, raw),
                Err(e) => return Err(e.into()),
            }
        }
        other => other,
    };
    let org = match organization(state, org_id.clone()).await {
        // A deleted sub-organization's activity history stays readable by its parent (its own
        // credentials are gone): the audit trail outlives the organization.
        Err(e) if e.code == crate::error::Code::NotFound && history_read => {
            state.db(move |s| s.deleted_organization(&org_id)).await?.map_err(|_| e)?
        }
        other => other?,
    };
    // A verification token's stamp_login stamped for the token's own (top-level) organization
    // goes to the sub-organization of its verified contact, as the hosted service routes it.
    let routed = match &stamp {
        stamps::Stamp::Attested(s, _) if s.attestation == coffer_auth::attested::Attestation::VerificationToken => {
            stamps::token_login_route(state, &org, s).await?
        }
        _ => None,
    };
    let (org, routed) = match routed {
        Some(sub) => (sub, true),
        None => (org, false),
    };
    let mut caller = stamps::resolve(state, &org, stamp).await?;
    if let Credential::VerificationToken(t) = &mut caller.credential {
        t.routed = routed;
    }
    Ok((org, caller, Prefetched::default()))
}

/// The submitter's stamp, recorded as the first approval vote. The vote's user carries the
/// credential that stamped (an API key, or a passkey with scheme `SIGNATURE_SCHEME_TK_WEBAUTHN`).
fn submitter_vote(caller: &Caller, activity_id: &str, body: &[u8], selection: &str, now: i64) -> Value {
    let api_keys = caller.credential.api_key().cloned().into_iter().collect::<Vec<_>>();
    let mut user = render::user_json(&caller.user, &api_keys);
    if let Some(a) = caller.credential.authenticator() {
        user["authenticators"] = json!([render::authenticator_json(a)]);
    }
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "userId": caller.user.id,
        "user": user,
        "activityId": activity_id,
        "selection": selection,
        "message": String::from_utf8_lossy(body),
        "publicKey": caller.public_key,
        "signature": caller.signature,
        "scheme": caller.scheme,
        "createdAt": render::timestamp(now),
        // Kept for the enclave (an activity run after consensus is re-verified from its original
        // stamp); never rendered.
        render::VOTE_STAMP_HEADER: caller.raw_stamp.header,
        render::VOTE_STAMP: caller.raw_stamp.value,
    })
}

/// Runs the operation's handler and has the enclave decide and apply its changes (after it
/// certified the credentials they add): the outcome, and the enclave's policy evaluation, which
/// is what the activity records. `recorded`: the activity as it will be recorded once completed,
/// for a state change linked in the enclave call that applies it.
async fn execute(
    op: &'static Operation,
    ctx: Ctx,
    params: Value,
    recorded: Option<&ActivityRecord>,
) -> Result<Executed, ApiError> {
    let state = ctx.state.clone();
    let mut auth = ctx.auth.clone();
    let org = ctx.org.id.clone();
    let (fingerprint, now) = (ctx.fingerprint.clone(), ctx.now);
    let returned = ctx.returned.clone();
    let signup_mark = coffer_org_rules::transition::marks_auth_proxy_signup(&params);
    let app_name = coffer_org_rules::transition::auth_proxy_app_name(&params).ok().flatten();
    // An activity whose handler calls the enclave before `ApplyActivity`, or resolves a webhook
    // target's name, is decided first, so that nothing is made or probed for one the rules
    // refuse or want approvals for: its typed refusal (waiting included) is the answer. Should a
    // later call find it waiting after all (the rules changed meanwhile), it is not recorded as
    // waiting with what its first calls made: it fails, to be submitted again.
    let decided_first = coffer_org_rules::subjects::CALLS_BEFORE_APPLY.contains(&op.activity_type);
    if decided_first {
        let ahead = coffer_proto::v1::DecideActivityRequest::default();
        state.custody.authorized(&auth).decide_activity(ahead).await?;
    }
    let moved = |e: ApiError| match e.refusal {
        Some(RefusalReason::ConsensusNeeded) if decided_first => ApiError::new(
            Code::Aborted,
            "REQUEST_INVALID",
            "the organization's rules changed while the activity ran: submit it again",
        ),
        _ => e,
    };
    let mut outcome = (op.handler)(ctx, params).await.map_err(moved)?;
    // What the records say the enclave changes, projected before certification: an API key
    // already certified is one the enclave issued (a session or the auth proxy's key), which it
    // records itself.
    let mut ours = crate::record_changes::of_writes(&org, &outcome.writes);
    crate::record_changes::mark_auth_proxy_signup(op.activity_type, signup_mark, &mut ours);
    crate::record_changes::set_auth_proxy_app_name(op.activity_type, &org, app_name, &mut ours);
    let issued: Vec<Vec<u8>> = outcome
        .writes
        .iter()
        .filter_map(|w| match w {
            Write::InsertApiKey(k) if !k.certificate.is_empty() => Some(k.certificate.clone()),
            _ => None,
        })
        .collect();
    certify_credentials(&state, auth.clone(), &mut outcome.writes).await.map_err(moved)?;
    let mut unrecorded = None;
    let evaluation = match coffer_org_rules::subjects::has_own_call(op.activity_type) {
        // Key uses, sessions, logins, one-time codes: their own call decided. Fails closed: an
        // enclave that answered without deciding (an older one in shadow mode, with the gateway
        // no longer deciding) has its work dropped.
        true => returned.take_evaluation().ok_or_else(|| {
            tracing::error!(activity = %op.activity_type, "the enclave answered an activity without deciding it");
            ApiError::internal()
        })?,
        false => {
            // Linked in the call that applies it (one round trip), with the result the gateway
            // rendered; the enclave adds its app proofs (the only ones: an activity whose earlier
            // calls returned proofs is linked after it finishes).
            if let Some(record) = recorded.filter(|_| linked_in_its_call(op) && returned.proofs_so_far().is_empty()) {
                let record = ActivityRecord { result: json!({ op.result_key: outcome.result }), ..record.clone() };
                let activity = render::activity(&record, false).to_string().into_bytes();
                auth.log = Some(coffer_proto::v1::LogRequest { activity });
            }
            // A new sub-organization's wallet: its sealed seed and account keys, which the enclave
            // derives and checks the accounts' addresses with.
            let wallet_seed = outcome
                .writes
                .iter()
                .find_map(|w| match w {
                    Write::InsertWallet(wallet) if wallet.organization_id != org => Some(wallet.sealed_seed.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            // ... in the body's order (the handler writes them so).
            let account_keys: Vec<Vec<u8>> = crate::record_changes::sub_organization_accounts(&org, &outcome.writes)
                .map(|a| a.sealed_key.clone())
                .collect();
            let issued_count = issued.len();
            // Until its outcome is recorded (the caller settles it after its commit), a change the
            // enclave may have applied notes its organization for repair: no answer, a client
            // that went away, a commit here that failed.
            let sent = crate::uncertain_outcomes::unrecorded(&org);
            let answer = apply_in_enclave(&state, auth, issued, (wallet_seed, account_keys), &returned).await;
            let (evaluation, applied) = match answer {
                Ok((evaluation, applied, email_events)) => {
                    // The invitations it mailed.
                    outcome.writes.extend(crate::ops::email_events::writes(&org, &fingerprint, now, &email_events));
                    (evaluation, applied)
                }
                Err(e) => {
                    // Refused: nothing applied.
                    if e.refusal.is_some() {
                        sent.settled();
                    }
                    return Err(moved(e));
                }
            };
            unrecorded = Some(sent);
            // The records are written as the handler made them; should they not follow what the
            // enclave applied (a gateway whose records drifted from the enclave's state), the
            // organization is repaired from the enclave's signed state by the catch-up.
            // (Once this activity is committed here: `uncertain_outcomes::working`.)
            if let Err(n) = crate::record_changes::follows(&ours, &applied, issued_count) {
                tracing::warn!(
                    activity = %op.activity_type,
                    organization = %org,
                    change = n,
                    "the gateway's records of an activity do not follow the changes the enclave applied: the \
                     organization is repaired from the enclave's state"
                );
                crate::uncertain_outcomes::note(&org);
                // The organization of the change that differs too (a new sub-organization's).
                let differing = applied.get(n).or(ours.get(n)).map(|c| c.organization_id.as_str());
                if let Some(other) = differing.filter(|o| *o != org) {
                    crate::uncertain_outcomes::note(other);
                }
            }
            evaluation
        }
    };
    Ok(Executed { outcome, evaluation, unrecorded })
}

/// What [`execute`] did: the handler's outcome, the enclave's policy evaluation (what the
/// activity records), and, for a state change the enclave applied, its guard
/// ([`crate::uncertain_outcomes::Unrecorded`]), to settle once the activity is committed here.
struct Executed {
    outcome: super::registry::Outcome,
    evaluation: String,
    unrecorded: Option<crate::uncertain_outcomes::Unrecorded>,
}

/// The refusal of an activity with a secret (otp_auth's code) that would wait for votes: it would
/// be stored, live.
fn waits_with_a_secret(op: &Operation) -> ApiError {
    ApiError::forbidden(format!(
        "request not authorized: {} needs approvals, and it carries a secret that must not wait in the activity \
         record: allow it by policy without consensus",
        op.activity_type
    ))
}

/// Whether `e` is the handler's finding about the request (not an enclave's answer, nor a failure
/// to reach one).
fn from_handler(e: &ApiError) -> bool {
    e.refusal.is_none()
        && matches!(e.code, Code::InvalidArgument | Code::NotFound | Code::AlreadyExists | Code::FailedPrecondition)
}

/// Whether `op` is a key use (the enclave call that does the work decides it and answers with
/// the outcomes it read).
fn is_key_use(op: &Operation) -> bool {
    coffer_org_rules::subjects::KEY_USES.contains(&op.activity_type)
}

/// Whether `op`, completed, is linked in the log only by the enclave call that does it
/// (`subjects::linked_in_its_call`).
fn linked_in_its_call(op: &Operation) -> bool {
    coffer_org_rules::subjects::linked_in_its_call(op.activity_type)
}

/// Whether `e` is the enclave's refusal by the organization's policies or root quorum.
fn is_policy_refusal(e: &ApiError) -> bool {
    matches!(e.refusal, Some(RefusalReason::PolicyDenied | RefusalReason::RootQuorumOnly))
}

/// What the enclave's decision of an activity, made without doing it, says ([`decide_ahead`]).
enum Ahead {
    /// The rules let it run now: the outcomes the enclave read.
    Runs(String),
    /// It waits for votes: the outcomes the enclave read.
    Waits(Option<String>),
}

/// The enclave's decision of the activity `auth` authorizes, as its own call would decide it,
/// doing nothing (`DecideActivity`): for an activity whose handler found it wrong before any
/// enclave call decided it, and before a handler reaches the network. A refusal is the
/// enclave's, typed.
async fn decide_ahead(
    state: &Arc<AppState>,
    auth: coffer_proto::v1::Authorization,
    parent_certificate: Vec<u8>,
) -> Result<Ahead, ApiError> {
    let request = coffer_proto::v1::DecideActivityRequest { auth: None, parent_certificate };
    match state.custody.authorized(&auth).decide_activity(request).await {
        Ok(decided) => Ok(Ahead::Runs(decided.evaluation)),
        Err(e) if e.refusal == Some(RefusalReason::ConsensusNeeded) => Ok(Ahead::Waits(e.evaluation)),
        Err(e) => Err(e),
    }
}

/// Has the enclave decide an activity that uses no key (key operations are decided by their own
/// enclave call) over the organization's authority state, compute its changes from the stamped
/// body and apply them: the outcomes it decided with, and the changes it applied.
/// `issued_certificates`: credentials the enclave issued for this activity before
/// (enable_auth_proxy's key). `wallet`: a new sub-organization's sealed seed and account keys.
async fn apply_in_enclave(
    state: &Arc<AppState>,
    auth: coffer_proto::v1::Authorization,
    issued_certificates: Vec<Vec<u8>>,
    (sub_organization_wallet_seed, sub_organization_account_keys): (Vec<u8>, Vec<Vec<u8>>),
    returned: &crate::custody::Returned,
) -> Result<(String, Vec<coffer_org_rules::Change>, Vec<coffer_proto::v1::EmailEvent>), ApiError> {
    let request = coffer_proto::v1::ApplyActivityRequest {
        issued_certificates,
        sub_organization_account_keys,
        sub_organization_wallet_seed,
        ..Default::default()
    };
    let applied = state.custody.authorized(&auth).collecting(returned).apply_activity(request).await?;
    // The outcomes it decided with. Fails closed on an enclave that applied without deciding (an
    // older one in shadow mode, with the gateway no longer deciding).
    if serde_json::from_str::<Vec<serde::de::IgnoredAny>>(&applied.evaluation).is_err() {
        tracing::error!("the enclave applied a state change without deciding it");
        return Err(ApiError::internal());
    }
    // Changes that cannot be read count as none: the records then do not follow them, and the
    // organization is repaired from the enclave's state.
    let changes = serde_json::from_slice(&applied.changes).unwrap_or_default();
    Ok((applied.evaluation, changes, applied.email_events))
}

/// The app proofs an activity collected, as the API renders them (`v1AppProof`).
fn taken_proofs(returned: &crate::custody::Returned) -> Vec<Value> {
    returned.take_proofs().iter().map(render::app_proof).collect()
}

/// Has the enclave append a finished activity, as the API renders it, to its organization's log:
/// the write of the signed link, to commit with the activity. An enclave that cannot record it
/// leaves the activity unlogged (a warning here; the log's verification lists it).
async fn log_link(
    state: &Arc<AppState>,
    submission: coffer_proto::v1::StampedRequest,
    record: &ActivityRecord,
) -> Option<Write> {
    let activity = serde_json::to_vec(&render::activity(record, false)).ok()?;
    // Every vote after the submitter's, stamped: the enclave links only votes it verified (one
    // whose credential is gone cannot be shown, and the activity stays unlogged).
    let later = record.votes.as_array().and_then(|v| v.get(1..)).unwrap_or_default();
    let votes = state.read_store(|s| Ok::<_, ApiError>(vote_stamps(s, &record.organization_id, later))).ok()?;
    let request = coffer_proto::v1::RecordActivityRequest { request: Some(submission), activity, votes };
    match state.custody.record_activity(request).await {
        Ok(recorded) => {
            let link = render::app_proof(&recorded.link?);
            Some(Write::InsertLogLink {
                organization_id: record.organization_id.clone(),
                seq: recorded.seq,
                activity_id: record.id.clone(),
                link: link.to_string(),
            })
        }
        Err(e) => {
            tracing::warn!(error = %e.message, activity = %record.id, "the enclave did not record the activity in its log");
            None
        }
    }
}

/// What a key use's enclave call links (`Authorization.log`): `record` as it will be recorded
/// once completed, less its result and app proofs, which the enclave makes.
fn log_request(record: &ActivityRecord) -> coffer_proto::v1::LogRequest {
    let mut activity = render::activity(record, false);
    if let Some(members) = activity.as_object_mut() {
        members.remove("result");
        members.remove("appProofs");
    }
    coffer_proto::v1::LogRequest { activity: activity.to_string().into_bytes() }
}

/// The write of the link a key use's enclave call made, if it links `record` as recorded (its
/// digest); otherwise none, and an error line: the log cannot link the activity again.
fn linked_in_call(record: &ActivityRecord, linked: coffer_proto::v1::LogLink) -> Option<Write> {
    let link = linked.link?;
    let payload = serde_json::from_str::<Value>(&link.proof_payload).ok()?;
    let stated = coffer_auth::proof::LogLink::from_payload(&payload).ok()?;
    let digest = coffer_auth::proof::activity_digest(&render::activity(record, false));
    if stated.activity_id != record.id || stated.activity_digest != digest {
        tracing::error!(activity = %record.id, "the enclave linked the activity otherwise than it is recorded");
        return None;
    }
    Some(Write::InsertLogLink {
        organization_id: record.organization_id.clone(),
        seq: linked.seq,
        activity_id: record.id.clone(),
        link: render::app_proof(&link).to_string(),
    })
}

/// Fills in the enclave-issued certificate of every API key, passkey and OAuth identity in
/// `writes`, and adds the parent certificate of a sub-organization they create.
async fn certify_credentials(
    state: &Arc<AppState>,
    auth: coffer_proto::v1::Authorization,
    writes: &mut Vec<Write>,
) -> Result<(), ApiError> {
    use coffer_proto::v1 as pb;
    let spec = |organization_id: &str, user_id: &str, credential_type: &str, public_key: String| pb::CredentialSpec {
        organization_id: organization_id.to_string(),
        user_id: user_id.to_string(),
        credential_type: credential_type.to_string(),
        public_key,
    };
    let mut credentials = Vec::new();
    let mut sub_organization = None;
    for w in writes.iter() {
        match w {
            // Session keys come certified by the enclave's CreateSession.
            Write::InsertApiKey(k) if k.certificate.is_empty() => {
                credentials.push(spec(&k.organization_id, &k.user_id, &k.credential_type, k.public_key.clone()))
            }
            Write::InsertAuthenticators(list) => credentials.extend(list.iter().map(|a| {
                spec(&a.organization_id, &a.user_id, stamps::webauthn::CREDENTIAL_TYPE, a.public_key.clone())
            })),
            Write::InsertOauthProviders(list) => credentials.extend(list.iter().map(|p| {
                let identity = crate::oidc_tokens::identity_hash(&p.issuer, &p.subject, &p.audience);
                spec(&p.organization_id, &p.user_id, coffer_auth::grants::OAUTH_PROVIDER, identity)
            })),
            Write::InsertOrganization(o) => sub_organization = o.parent_id.clone().map(|parent| (o.id.clone(), parent)),
            _ => {}
        }
    }
    if let Some((sub, parent)) = &sub_organization {
        credentials.push(spec(sub, "", coffer_auth::grants::PARENT_ORGANIZATION, parent.clone()));
    }
    if credentials.is_empty() {
        return Ok(());
    }
    let expected = credentials.len();
    let request = pb::IssueCertificatesRequest { credentials, ..Default::default() };
    let certificates = state.custody.authorized(&auth).issue_certificates(request).await?.certificates;
    if certificates.len() != expected {
        return Err(ApiError::internal());
    }
    let mut certificates = certificates.into_iter();
    for w in writes.iter_mut() {
        match w {
            Write::InsertApiKey(k) if k.certificate.is_empty() => {
                k.certificate = certificates.next().unwrap_or_default()
            }
            Write::InsertAuthenticators(list) => {
                for a in list {
                    a.certificate = certificates.next().unwrap_or_default();
                }
            }
            Write::InsertOauthProviders(list) => {
                for p in list {
                    p.certificate = certificates.next().unwrap_or_default();
                }
            }
            _ => {}
        }
    }
    if let Some((sub, _)) = sub_organization {
        let certificate = certificates.next().unwrap_or_default();
        writes.push(Write::PutRecord(crate::store::Record {
            organization_id: sub,
            kind: PARENT_CERTIFICATE.into(),
            id: PARENT_CERTIFICATE.into(),
            name: PARENT_CERTIFICATE.into(),
            data: json!({ "certificate": hex::encode(certificate) }),
            created_at: now_nanos(),
            updated_at: now_nanos(),
        }));
    }
    Ok(())
}

/// The record of the policy outcomes `evaluations` (JSON text, as stored) of `vote`.
fn evaluation_write(org: &str, activity_id: &str, vote: &Value, evaluations: String, now: Nanos) -> Write {
    Write::InsertPolicyEvaluation(PolicyEvaluationRecord {
        id: uuid::Uuid::new_v4().to_string(),
        activity_id: activity_id.to_string(),
        organization_id: org.to_string(),
        vote_id: vote["id"].as_str().unwrap_or_default().to_string(),
        evaluations,
        created_at: now,
    })
}

/// What an activity records of a decision: the enclave's outcomes when it sent them, else none.
fn recorded_outcomes(enclave: Option<String>) -> String {
    enclave.unwrap_or_else(|| "[]".into())
}

/// `{organizationId, type, parameters}` with sorted keys, hashed: what an Idempotency-Key
/// promises stays the same.
pub fn intent_hash(env: &Envelope) -> String {
    let intent =
        json!({"organizationId": env.organization_id, "type": env.activity_type, "parameters": env.parameters});
    hex::encode(sha2::Sha256::digest(coffer_auth::proof::canonical_json(&intent).as_bytes()))
}

/// The `Idempotency-Key` header, if any (1-255 visible ASCII characters).
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else { return Ok(None) };
    match v.to_str() {
        Ok(s) if !s.trim().is_empty() && s.len() <= 255 => Ok(Some(s.trim().to_string())),
        _ => Err(ApiError::invalid("invalid Idempotency-Key header: 1 to 255 visible ASCII characters")),
    }
}

/// The activity an Idempotency-Key already names: the same intent returns it, another is 409.
async fn idempotent_replay(
    state: &Arc<AppState>,
    org: &str,
    key: &str,
    hash: &str,
) -> Result<Option<ActivityRecord>, ApiError> {
    let (o, k) = (org.to_string(), key.to_string());
    match state.db(move |s| s.idempotency_key(&o, &k)).await? {
        Ok((h, id)) if h == hash => {
            let o = org.to_string();
            Ok(Some(state.db(move |s| s.activity(&o, &id)).await??))
        }
        Ok(_) => Err(ApiError::new(
            Code::AlreadyExists,
            "REQUEST_INVALID",
            "Idempotency-Key was already used for a different request",
        )),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `POST /public/v1/submit/<path>` from the gateway itself ([`Origin::Internal`]: no IP
/// allowlist applies).
pub async fn submit(
    state: Arc<AppState>,
    registry: &'static Registry,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    submit_from(Origin::Internal, state, registry, path, headers, body).await
}

/// `POST /public/v1/submit/<path>` from `origin`.
pub async fn submit_from(
    origin: Origin,
    state: Arc<AppState>,
    registry: &'static Registry,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    let current = registry
        .activity(path)
        .ok_or_else(|| ApiError::not_found(format!("unknown activity endpoint: submit/{path}")))?;
    let stamp = stamps::verified_stamp(headers, body)?;
    let now = now_nanos();
    let env = Envelope::decode(submission::parse_body(body)?, now / 1_000_000)?;
    let op = registry.activity_version(path, &env.activity_type).ok_or_else(|| {
        ApiError::invalid(format!(
            "invalid activity type {:?} for submit/{path}: expected {}",
            env.activity_type, current.activity_type
        ))
    })?;
    let fingerprint = submission::fingerprint(body);
    // An invitation's acceptance is stamped by the key it brings, which no one has yet.
    let (org, caller, known) = match op.activity_type == coffer_auth::grants::ACCEPT_INVITATION {
        true => {
            let stamped = stamps::acceptance_stamp(stamp, &env.parameters)?;
            let org = organization(&state, env.organization_id.clone()).await?;
            // An acceptance done already (its invitation gone) answers as the activity it was.
            let fp = fingerprint.clone();
            match state.db(move |s| s.activity_by_fingerprint(&fp)).await? {
                Ok(done) if done.organization_id == org.id => {
                    return Ok(json!({ "activity": render::activity(&done, false) }));
                }
                Ok(_) | Err(StoreError::NotFound) => {}
                Err(e) => return Err(e.into()),
            }
            let caller = stamps::invitation_caller(&state, &org, stamped, &env.parameters, &fingerprint).await?;
            (org, caller, Prefetched::default())
        }
        false => authenticate(&state, env.organization_id.clone(), stamp, Some(&fingerprint), false).await?,
    };
    crate::ip_allowlists::enforce(&state, &org, &caller, origin).await?;
    state.limits.charge_credential(caller.credential.id())?;
    let idem = idempotency_key(headers)?;
    // Until it is committed here, no repair of its organization runs (`uncertain_outcomes`).
    let _working = crate::uncertain_outcomes::working(&org.id);

    // Identical bytes are the same activity (the Rust client polls by re-posting them).
    let fp = fingerprint.clone();
    let existing = match known.fingerprint_taken {
        Some(false) => Err(StoreError::NotFound),
        _ => state.db(move |s| s.activity_by_fingerprint(&fp)).await?,
    };
    match existing {
        Ok(existing) if existing.organization_id == org.id => {
            return Ok(json!({ "activity": render::activity(&existing, registry.can_vote(&org, &existing, &caller)) }))
        }
        Ok(_) => return Err(ApiError::invalid("activity fingerprint belongs to another organization")),
        Err(StoreError::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    if matches!(caller.credential, Credential::Attested(_) | Credential::VerificationToken(_))
        && op.path != "stamp_login"
    {
        return Err(ApiError::forbidden(
            "request not authorized: an attested stamp (X-Stamp-Attested) may only submit stamp_login",
        ));
    }
    if !coffer_auth::grants::credential_may_submit(caller.credential.credential_type(), op.activity_type) {
        return Err(ApiError::forbidden(
            "request not authorized: a recovery credential may only submit recover_user, an invitation's key only \
             accept_invitation",
        ));
    }
    if caller.via_parent && !op.parent_may_act {
        return Err(ApiError::forbidden(
            "request not authorized: a parent organization's credentials may read a sub-organization but not act in it",
        ));
    }
    if op.activity_type == TYPE_APPROVE || op.activity_type == TYPE_REJECT {
        return vote(state, registry, org, caller, env, body, op.activity_type == TYPE_APPROVE).await;
    }
    if let Some(check) = op.precheck {
        check(&env.parameters)?;
    }
    // Hashed without its secrets (otp_auth's typed code), which a stored hash would give away.
    let hash = match op.secret_parameters().is_empty() {
        true => intent_hash(&env),
        false => intent_hash(&Envelope { parameters: op.recorded_parameters(env.parameters.clone()), ..env.clone() }),
    };
    if let Some(key) = &idem {
        if let Some(a) = idempotent_replay(&state, &org.id, key, &hash).await? {
            return Ok(json!({ "activity": render::activity(&a, registry.can_vote(&org, &a, &caller)) }));
        }
    }

    // Derived from the stamped body, as the enclave derives it: the id its log link names.
    let activity_id = coffer_auth::envelope::derived_id(&fingerprint, coffer_auth::envelope::ACTIVITY_ID, 0);
    let vote = submitter_vote(&caller, &activity_id, body, VOTE_APPROVED, now);
    let votes = json!([vote]);
    let mut writes = Vec::new();
    if let Some(key) = &idem {
        writes.push(Write::InsertIdempotencyKey {
            organization_id: org.id.clone(),
            key: key.clone(),
            intent_hash: hash.clone(),
            activity_id: activity_id.clone(),
            created_at: now,
        });
    }
    // The activity as it is recorded, its status, result and app proofs set once known.
    let mut record = ActivityRecord {
        id: activity_id.clone(),
        organization_id: org.id.clone(),
        activity_type: op.activity_type.to_string(),
        status: STATUS_COMPLETED.to_string(),
        fingerprint: fingerprint.clone(),
        // No secret is kept, in the intent or in the body its submitter's vote carries (an
        // activity with one never waits for votes: see `ConsensusNeeded` below).
        intent: json!({ op.intent_key: op.recorded_parameters(env.parameters.clone()) }),
        result: Value::Null,
        votes: op.recorded_votes(votes.clone()),
        failure: None,
        created_at: now,
        updated_at: now_nanos(),
        app_proofs: Vec::new(),
    };
    let returned: Arc<crate::custody::Returned> = Default::default();
    // The enclave call that does the work decides it: it runs, waits for votes, or is refused.
    let mut submission = Some(caller.stamped(body));
    // A key use is linked in the log by its own enclave call (one round trip).
    let log = is_key_use(op).then(|| log_request(&record));
    let auth = coffer_proto::v1::Authorization { request: submission.clone(), approval: None, log };
    // A parent's credential acting for its sub-organization (a login) is decided with the
    // sub-organization's parent certificate.
    let parent_certificate = crate::ops::lookup::parent_certificate_of(&state, &org.id, caller.via_parent).await?;
    let ctx = Ctx {
        state: state.clone(),
        registry,
        org: org.clone(),
        caller,
        activity_id: activity_id.clone(),
        now,
        auth: auth.clone(),
        fingerprint: fingerprint.clone(),
        returned: returned.clone(),
    };
    let mut outcomes = None;
    let mut waits = |evaluation: Option<String>| {
        // An activity with a secret (otp_auth's code) does not wait: it would be stored, live.
        if !op.secret_parameters().is_empty() {
            return Err(waits_with_a_secret(op));
        }
        // Recorded with the submitter's vote and the outcomes the enclave read; nothing ran. It
        // runs once enough votes approve.
        outcomes = evaluation;
        Ok((STATUS_CONSENSUS_NEEDED, json!({})))
    };
    let mut unrecorded = None;
    let (status, result) = match execute(op, ctx, env.parameters.clone(), Some(&record)).await {
        Ok(Executed { outcome, evaluation: enclave_evaluation, unrecorded: sent }) => {
            coffer_process::crash_point::here("gateway-after-enclave-answer");
            unrecorded = sent;
            writes.extend(outcome.writes);
            outcomes = Some(enclave_evaluation);
            (STATUS_COMPLETED, json!({ op.result_key: outcome.result }))
        }
        Err(e) if e.refusal == Some(RefusalReason::ConsensusNeeded) => {
            submission = None;
            waits(e.evaluation)?
        }
        // The handler found the request wrong before an enclave call decided it (a name taken, a
        // feature not set): what the submitter learns is what it would have learnt with the
        // decision first, the enclave's, which lets nothing run.
        Err(e) if from_handler(&e) => match decide_ahead(&state, auth, parent_certificate).await {
            Ok(Ahead::Waits(evaluation)) => {
                submission = None;
                waits(evaluation)?
            }
            Ok(Ahead::Runs(_)) => return twin_or(&state, &org.id, &fingerprint, e).await,
            Err(refused) if is_policy_refusal(&refused) => return Err(refused),
            // Not decided (the enclave unreachable, the stamp refused, an attested stamp the
            // call verifies itself): the handler's finding.
            Err(_) => return twin_or(&state, &org.id, &fingerprint, e).await,
        },
        Err(e) => return twin_or(&state, &org.id, &fingerprint, e).await,
    };
    writes.insert(0, evaluation_write(&org.id, &activity_id, &vote, recorded_outcomes(outcomes), now));
    let record_fingerprint = fingerprint;
    record.status = status.to_string();
    record.result = result;
    record.app_proofs = taken_proofs(&returned);
    // A finished activity's link in its organization's log is committed with it: the one its
    // enclave call made, or one asked for now. One linked in its call is linked only in
    // its own call (`RecordActivity` refuses it completed): without that link it stays unlogged.
    match (submission, returned.take_log_link()) {
        (Some(_), Some(linked)) => writes.extend(linked_in_call(&record, linked)),
        (Some(_), None) if linked_in_its_call(op) => {
            tracing::warn!(activity = %record.id, "the enclave linked no activity in its call: it stays unlogged");
        }
        (Some(submission), None) => {
            record.updated_at = now_nanos();
            writes.extend(log_link(&state, submission, &record).await);
        }
        (None, _) => record.updated_at = now_nanos(),
    }
    // The webhook events of this activity are outbox rows in its own transaction.
    let outbox = match known.webhook_endpoints {
        Some(false) => Outbox::without_endpoints(&writes),
        _ => state.read_store(|s| Outbox::for_activity(s, &org, &record, &writes))?,
    };
    writes.extend(outbox.writes());
    let committed = state.commit(record, writes).await;
    if committed.is_ok() {
        if let Some(sent) = unrecorded.take() {
            sent.settled();
        }
    }
    let activity = match committed {
        Ok(Committed::New(a)) => {
            coffer_process::crash_point::here("gateway-after-commit");
            outbox.committed();
            crate::metrics::observe_activity(&a.activity_type, &a.status);
            a
        }
        Ok(Committed::Existing(a)) => a,
        Err(e) => {
            // Two submissions raced for one Idempotency-Key: the loser answers with the winner.
            if let Some(key) = &idem {
                if let Some(a) = idempotent_replay(&state, &org.id, key, &hash).await? {
                    return Ok(json!({ "activity": render::activity(&a, false) }));
                }
            }
            return twin_or(&state, &org.id, &record_fingerprint, e).await;
        }
    };
    Ok(json!({ "activity": render::activity(&activity, false) }))
}

/// An identical submission (the same bytes) that raced its twin through this gateway or another
/// one answers with the twin's record, as a resubmission after it would: its own run may have
/// failed on what the twin did (a name just taken, the enclave refusing the replayed stamp).
/// When the enclave saw the stamp first, the twin's commit is moments away: wait for it.
async fn twin_or(state: &Arc<AppState>, org: &str, fingerprint: &str, err: ApiError) -> Result<Value, ApiError> {
    twin_where(state, org, fingerprint, err, |_| true).await
}

/// [`twin_or`] for a vote whose run the enclave refused as a replay: another approval ran the
/// activity a moment ago (through another gateway); its outcome is that run's, not a failure of
/// this one. Answers the activity once it is no longer waiting.
async fn settled_or(state: &Arc<AppState>, org: &str, fingerprint: &str, err: ApiError) -> Result<Value, ApiError> {
    twin_where(state, org, fingerprint, err, |a| a.status != STATUS_CONSENSUS_NEEDED).await
}

/// The activity with `fingerprint` once `found` holds of it (waiting up to 3 s when the enclave
/// saw the stamp first), else `err`.
async fn twin_where(
    state: &Arc<AppState>,
    org: &str,
    fingerprint: &str,
    err: ApiError,
    found: impl Fn(&ActivityRecord) -> bool,
) -> Result<Value, ApiError> {
    let replayed = err.refusal == Some(coffer_proto::v1::RefusalReason::Replayed);
    let wait = if replayed { Duration::from_secs(3) } else { Duration::ZERO };
    let deadline = std::time::Instant::now() + wait;
    loop {
        let fp = fingerprint.to_string();
        if let Ok(Ok(twin)) = state.db(move |s| s.activity_by_fingerprint(&fp)).await {
            if twin.organization_id == org && found(&twin) {
                return Ok(json!({ "activity": render::activity(&twin, false) }));
            }
        }
        if std::time::Instant::now() >= deadline {
            if replayed {
                // The enclaves have seen this stamped body and no activity came of it: the
                // enclave that had it stopped while running it (the gateway then sent it to
                // another, which shares the replay window). It was not run twice; its outcome is
                // unknown here.
                return Err(ApiError {
                    refusal: err.refusal,
                    ..ApiError::unavailable(
                        "the enclave running this request stopped before answering and it was not run again: \
                         send it again with a new stamp",
                    )
                });
            }
            return Err(err);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VoteIntent {
    fingerprint: String,
}

/// How many locks votes are spread over ([`vote_lock`]).
const VOTE_LOCKS: usize = 64;

/// Serializes the votes on one activity (`fingerprint`) in this process, so a handler runs once
/// even when approvals arrive together (the store's compare-and-set is what guarantees it across
/// processes). One of [`VOTE_LOCKS`] locks by the fingerprint's hash: a tenant's flood of votes
/// holds up the votes that share its lock, not every organization's.
fn vote_lock(fingerprint: &str) -> &'static tokio::sync::Mutex<()> {
    use std::hash::BuildHasher;
    static LOCKS: OnceLock<(std::collections::hash_map::RandomState, Vec<tokio::sync::Mutex<()>>)> = OnceLock::new();
    let (hasher, locks) = LOCKS.get_or_init(|| {
        (std::collections::hash_map::RandomState::new(), (0..VOTE_LOCKS).map(|_| tokio::sync::Mutex::new(())).collect())
    });
    &locks[hasher.hash_one(fingerprint) as usize % VOTE_LOCKS]
}

/// The submitter as the caller of a deferred handler, from the first vote's credential.
fn submitter_caller(store: &dyn Store, org: &str, first_vote: &Value) -> Result<Caller, ApiError> {
    let gone = || ApiError::invalid("the activity's submitter or their credential no longer exists");
    let user_id = first_vote["userId"].as_str().ok_or_else(gone)?;
    let user = store.user(org, user_id).map_err(|_| gone())?;
    let public_key = first_vote["publicKey"].as_str().unwrap_or_default().to_string();
    let credential = if let Some(id) = first_vote["user"]["authenticators"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(|a| a["authenticatorId"].as_str())
    {
        Credential::Authenticator(store.authenticator(org, id).map_err(|_| gone())?)
    } else {
        Credential::ApiKey(store.api_key_by_public_key(org, &public_key).map_err(|_| gone())?)
    };
    let scheme = [
        "SIGNATURE_SCHEME_TK_API_P256",
        "SIGNATURE_SCHEME_TK_API_SECP256K1",
        "SIGNATURE_SCHEME_TK_API_SECP256K1_EIP191",
        "SIGNATURE_SCHEME_TK_API_ED25519",
        crate::stamps::webauthn::SCHEME,
    ]
    .into_iter()
    .find(|s| first_vote["scheme"] == *s)
    .unwrap_or("SIGNATURE_SCHEME_TK_API_P256");
    let header = if first_vote[render::VOTE_STAMP_HEADER] == stamps::X_STAMP_WEBAUTHN {
        stamps::X_STAMP_WEBAUTHN
    } else {
        stamps::X_STAMP
    };
    let raw_stamp =
        stamps::RawStamp { header, value: first_vote[render::VOTE_STAMP].as_str().unwrap_or_default().to_string() };
    Ok(Caller {
        user,
        credential,
        public_key,
        scheme,
        signature: first_vote["signature"].as_str().unwrap_or_default().to_string(),
        via_parent: false,
        raw_stamp,
    })
}

/// The stamped votes among `votes` whose credential the store still has: what the enclave
/// verifies before it links an activity stating them.
fn vote_stamps<'a>(
    store: &dyn Store,
    org: &str,
    votes: impl IntoIterator<Item = &'a Value>,
) -> Vec<coffer_proto::v1::StampedRequest> {
    votes
        .into_iter()
        .filter_map(|v| {
            let voter = submitter_caller(store, org, v).ok()?;
            Some(voter.stamped(v["message"].as_str().unwrap_or_default().as_bytes()))
        })
        .collect()
}

/// Most votes one activity takes, its submitter's included: each later vote has the earlier ones'
/// stamps verified again, and the enclave links an activity with at most this many.
const MAX_VOTES: usize = 100;

/// `approve_activity` / `reject_activity`: adds the caller's vote to the activity the
/// fingerprint names, re-evaluates it, runs it once allowed, and answers with that activity.
/// The activity a vote is for, as the gateway's records have it now.
enum VoteTarget {
    /// Waiting for votes, and the caller may vote on it.
    Open(Box<ActivityRecord>),
    /// Decided already (e.g. by a concurrent vote): the answer is what it became.
    Decided(Value),
}

/// The activity of `org` with `fingerprint` that `caller` votes on, or why the vote is refused:
/// no such activity, a vote of this user already, [`MAX_VOTES`] votes, a user who may not vote.
async fn vote_target(
    state: &Arc<AppState>,
    registry: &Registry,
    org: &Organization,
    caller: &Caller,
    fingerprint: &str,
) -> Result<VoteTarget, ApiError> {
    let fp = fingerprint.to_string();
    let target = match state.db(move |s| s.activity_by_fingerprint(&fp)).await? {
        Ok(a) if a.organization_id == org.id => a,
        Ok(_) | Err(StoreError::NotFound) => return Err(ApiError::not_found(NO_SUCH_FINGERPRINT)),
        Err(e) => return Err(e.into()),
    };
    let votes = target.votes.as_array().map(Vec::as_slice).unwrap_or_default();
    if votes.iter().any(|v| v["userId"] == caller.user.id.as_str()) {
        return Err(ApiError::invalid("user has already voted on this activity"));
    }
    if votes.len() >= MAX_VOTES {
        return Err(ApiError::invalid(format!("an activity has at most {MAX_VOTES} votes")));
    }
    if target.status != STATUS_CONSENSUS_NEEDED {
        return Ok(VoteTarget::Decided(json!({ "activity": render::activity(&target, false) })));
    }
    if !registry.can_vote(org, &target, caller) {
        return Err(ApiError::forbidden("request not authorized: this user may not vote on this activity"));
    }
    Ok(VoteTarget::Open(Box::new(target)))
}

async fn vote(
    state: Arc<AppState>,
    registry: &'static Registry,
    org: Organization,
    caller: Caller,
    env: Envelope,
    body: &[u8],
    approve: bool,
) -> Result<Value, ApiError> {
    let intent: VoteIntent = super::registry::decode(env.parameters)?;
    // Refused or answered before the lock too: a flood of votes that count for nothing (no such
    // activity, voted already, decided) holds up no one's votes that share its lock.
    if let VoteTarget::Decided(answer) = vote_target(&state, registry, &org, &caller, &intent.fingerprint).await? {
        return Ok(answer);
    }
    let _serial = vote_lock(&intent.fingerprint).lock().await;
    let _working = crate::uncertain_outcomes::working(&org.id);
    for _attempt in 0..8 {
        let target = match vote_target(&state, registry, &org, &caller, &intent.fingerprint).await? {
            VoteTarget::Open(target) => *target,
            VoteTarget::Decided(answer) => return Ok(answer),
        };
        let old_votes = target.votes.as_array().cloned().unwrap_or_default();
        let op = registry.activity_by_type(&target.activity_type).ok_or_else(ApiError::internal)?;
        let now = now_nanos();
        let selection = if approve { VOTE_APPROVED } else { VOTE_REJECTED };
        let vote = submitter_vote(&caller, &target.id, body, selection, now);
        let mut votes = old_votes.clone();
        votes.push(vote.clone());
        let votes = Value::Array(votes);
        let params = target.intent.get(op.intent_key).cloned().unwrap_or_else(|| json!({}));
        let update = |status: &str, result: Value, failure: Option<Value>| Write::UpdateConsensusActivity {
            organization_id: org.id.clone(),
            id: target.id.clone(),
            expected_votes: old_votes.len(),
            status: status.to_string(),
            result,
            votes: votes.clone(),
            failure,
            updated_at: now,
            app_proofs: Vec::new(),
        };

        let mut writes;
        let mut fallback = None;
        let mut unrecorded = None;
        if approve {
            // Decided by the enclave alone, with this vote and the earlier ones.
            let eval_write =
                |enclave: Option<String>| evaluation_write(&org.id, &target.id, &vote, recorded_outcomes(enclave), now);
            let returned: Arc<crate::custody::Returned> = Default::default();
            // The activity as it is recorded once completed: what its enclave call links (a key
            // use's always, a change's linked in its call when nothing before it returned
            // proofs), less the result and the proofs, set once known.
            let mut completed_record = ActivityRecord {
                status: STATUS_COMPLETED.to_string(),
                result: Value::Null,
                votes: votes.clone(),
                failure: None,
                updated_at: now,
                app_proofs: Vec::new(),
                ..target.clone()
            };
            let (ran, decision) = match state.read_store(|s| submitter_caller(s, &org.id, &old_votes[0])) {
                Ok(submitter) => {
                    // The enclave runs it on the original stamp and this fresh approval, counted
                    // with the earlier votes it kept itself.
                    let original = old_votes[0]["message"].as_str().unwrap_or_default().as_bytes();
                    let auth = coffer_proto::v1::Authorization {
                        request: Some(submitter.stamped(original)),
                        approval: Some(caller.stamped(body)),
                        log: is_key_use(op).then(|| log_request(&completed_record)),
                    };
                    let decision = coffer_proto::v1::Authorization { log: None, ..auth.clone() };
                    let ctx = Ctx {
                        state: state.clone(),
                        registry,
                        org: org.clone(),
                        caller: submitter,
                        activity_id: target.id.clone(),
                        now,
                        auth,
                        fingerprint: target.fingerprint.clone(),
                        returned: returned.clone(),
                    };
                    (execute(op, ctx, params.clone(), Some(&completed_record)).await, decision)
                }
                // The submitter's credential is gone from the gateway's records: nothing can run
                // it (the vote is not recorded; a rejection still ends it).
                Err(e) => return Err(e),
            };
            let failed = |e: &ApiError| {
                update(STATUS_FAILED, json!({}), Some(json!({ "code": e.code as i32, "message": e.message })))
            };
            match ran {
                Ok(Executed { outcome, evaluation: enclave_evaluation, unrecorded: sent }) => {
                    unrecorded = sent;
                    // The evaluation first: completing may delete the organization.
                    writes = outcome.writes;
                    writes.push(eval_write(Some(enclave_evaluation.clone())));
                    completed_record.result = json!({ op.result_key: outcome.result });
                    completed_record.app_proofs = taken_proofs(&returned);
                    let mut completed = update(STATUS_COMPLETED, completed_record.result.clone(), None);
                    if let Write::UpdateConsensusActivity { app_proofs, .. } = &mut completed {
                        app_proofs.clone_from(&completed_record.app_proofs);
                    }
                    writes.push(completed);
                    // Its link, when its enclave call made it (committed with it).
                    if let Some(linked) = returned.take_log_link() {
                        writes.extend(linked_in_call(&completed_record, linked));
                    }
                    fallback = Some(eval_write(Some(enclave_evaluation)));
                }
                // The enclave's decision: still waiting for votes.
                Err(e) if e.refusal == Some(RefusalReason::ConsensusNeeded) => {
                    writes = vec![eval_write(e.evaluation), update(STATUS_CONSENSUS_NEEDED, json!({}), None)]
                }
                // ... or denied, or rejected by a vote the enclave keeps (one the gateway's
                // records lost), or the vote itself refused (not one the enclave keeps: a voter it
                // does not hold live, too many votes): the vote is not recorded.
                Err(e)
                    if is_policy_refusal(&e)
                        || matches!(e.refusal, Some(RefusalReason::VoteRejected | RefusalReason::NotApproved)) =>
                {
                    return Err(e)
                }
                // ... or not reached, or not answering: the vote is not recorded (send it again),
                // and the activity still waits.
                Err(e) if e.refusal.is_none() && matches!(e.code, Code::Unavailable | Code::Internal) => return Err(e),
                // Another approval ran it a moment ago (through another gateway).
                Err(e) if e.refusal == Some(RefusalReason::Replayed) => {
                    return settled_or(&state, &org.id, &intent.fingerprint, e).await
                }
                // The handler found the approved request wrong before an enclave call decided it:
                // it fails if the rules let it run now, still waits if they want more approvals,
                // and a denial is answered as one (the enclave's decision, which runs nothing).
                Err(e) if from_handler(&e) => {
                    writes = match decide_ahead(&state, decision, Vec::new()).await {
                        Ok(Ahead::Runs(evaluation)) => vec![eval_write(Some(evaluation)), failed(&e)],
                        Ok(Ahead::Waits(evaluation)) => {
                            vec![eval_write(evaluation), update(STATUS_CONSENSUS_NEEDED, json!({}), None)]
                        }
                        Err(refused) if is_policy_refusal(&refused) => return Err(refused),
                        // Not decided now (the enclave unreachable): the vote is not recorded.
                        Err(other) if other.refusal.is_none() => return Err(other),
                        Err(refused) => vec![eval_write(None), failed(&refused)],
                    }
                }
                Err(e) => writes = vec![eval_write(e.evaluation.clone()), failed(&e)],
            }
        } else {
            // The enclave keeps the rejection (nothing runs the activity after it) and answers
            // the policies it reads for the activity as it stands, each rejected here: not a
            // list of the gateway's own policy rows.
            let outcomes = rejected_in_enclave(&state, &org.id, &old_votes, caller.stamped(body)).await?;
            writes = vec![
                evaluation_write(&org.id, &target.id, &vote, outcomes, now),
                update(STATUS_REJECTED, json!({}), None),
            ];
        }

        let mut result = apply(&state, &org, &target, writes).await;
        let mut fallback_used = false;
        if let (Err(e), Some(eval_write)) = (&result, fallback) {
            // The handler's effects failed inside the transaction: the activity fails instead.
            if !matches!(e, StoreError::Conflict(ref c) if c.kind == ConflictKind::ConsensusMoved) {
                tracing::warn!(error = %e, activity = %target.id, "approved activity failed to apply");
                let failure = match e {
                    StoreError::Conflict(_) | StoreError::Unique(_) => {
                        json!({ "code": Code::InvalidArgument as i32, "message": e.to_string() })
                    }
                    _ => json!({ "code": Code::Internal as i32, "message": "internal server error" }),
                };
                let writes = vec![eval_write, update(STATUS_FAILED, json!({}), Some(failure))];
                result = apply(&state, &org, &target, writes).await;
                fallback_used = true;
            }
        }
        match result {
            Ok(()) => {
                // Recorded: completed, or failed here after the enclave applied it (repaired
                // then, as a dropped guard notes it).
                if fallback_used {
                    drop(unrecorded.take());
                }
                if let Some(sent) = unrecorded.take() {
                    sent.settled();
                }
                let fp = intent.fingerprint.clone();
                let a = state.db(move |s| s.activity_by_fingerprint(&fp)).await??;
                return Ok(json!({ "activity": render::activity(&a, false) }));
            }
            Err(StoreError::Conflict(c)) if c.kind == ConflictKind::ConsensusMoved => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::new(Code::Aborted, "REQUEST_INVALID", "the activity changed while voting: retry the vote"))
}

/// Has the enclave keep `rejection` of the waiting activity whose votes are `old_votes`, and
/// answers the evaluation the rejection records: the enclave's decision of the activity as it
/// stood (its submitter's stamp and the approvals the enclave kept), with every policy it read
/// rejected. Not recorded while the enclave cannot be reached, nor when it refuses the rejection
/// (a voter it does not hold live, an activity it never found waiting). With the submitter's
/// credential gone from the gateway's records nothing can run the activity: rejected here alone,
/// with no evaluation.
async fn rejected_in_enclave(
    state: &Arc<AppState>,
    org: &str,
    old_votes: &[Value],
    rejection: coffer_proto::v1::StampedRequest,
) -> Result<String, ApiError> {
    let Ok(submitter) = state.read_store(|s| submitter_caller(s, org, &old_votes[0])) else {
        return Ok("[]".into());
    };
    let original = old_votes[0]["message"].as_str().unwrap_or_default().as_bytes();
    let auth = coffer_proto::v1::Authorization {
        request: Some(submitter.stamped(original)),
        approval: Some(rejection),
        log: None,
    };
    let evaluation = match decide_ahead(state, auth, Vec::new()).await {
        Err(e) if e.refusal == Some(RefusalReason::VoteRejected) => e.evaluation,
        // Past the vote lifetime nothing can run it: rejected here alone (the enclave keeps no
        // rejection of it, and links it as rejected only with one).
        Err(e) if e.refusal == Some(RefusalReason::Stale) => None,
        Err(e) => return Err(e),
        Ok(_) => {
            tracing::error!("the enclave answered a rejection as an allow");
            return Err(ApiError::internal());
        }
    };
    let mut outcomes: Vec<serde_json::Map<String, Value>> =
        evaluation.and_then(|e| serde_json::from_str(&e).ok()).unwrap_or_default();
    for outcome in &mut outcomes {
        outcome.insert("outcome".into(), json!(decision::OUTCOME_REJECTED));
    }
    serde_json::to_string(&outcomes).map_err(|_| ApiError::internal())
}

/// Applies a vote's `writes` to `target` in one transaction, with the webhook events of the
/// status change they make (a vote that leaves the activity waiting changes no status and
/// reports nothing).
async fn apply(
    state: &Arc<AppState>,
    org: &Organization,
    target: &ActivityRecord,
    mut writes: Vec<Write>,
) -> Result<(), StoreError> {
    let updated = writes.iter().find_map(|w| match w {
        Write::UpdateConsensusActivity { status, result, votes, failure, updated_at, app_proofs, .. }
            if *status != target.status =>
        {
            Some(ActivityRecord {
                status: status.clone(),
                result: result.clone(),
                votes: votes.clone(),
                failure: failure.clone(),
                updated_at: *updated_at,
                app_proofs: app_proofs.clone(),
                ..target.clone()
            })
        }
        _ => None,
    });
    let linked = writes.iter().any(|w| matches!(w, Write::InsertLogLink { .. }));
    let outbox = match &updated {
        Some(activity) => Some(state.read_store(|s| Outbox::for_activity(s, org, activity, &writes))?),
        None => None,
    };
    writes.extend(outbox.iter().flat_map(Outbox::writes));
    let s = state.clone();
    tokio::task::spawn_blocking(move || s.store.apply(&writes))
        .await
        .unwrap_or_else(|_| Err(StoreError::Backend("vote task failed".into())))?;
    if let Some(outbox) = outbox {
        outbox.committed();
    }
    if let Some(activity) = updated {
        crate::metrics::observe_activity(&activity.activity_type, &activity.status);
        // Finished by this vote and not linked in its enclave call: its link goes in after the
        // change committed (a vote that lost the race, or whose effects failed, must not leave a
        // link of what never was). One linked in its call, completed, is linked only there.
        let in_call_only = activity.status == STATUS_COMPLETED
            && coffer_org_rules::subjects::linked_in_its_call(&activity.activity_type);
        if activity.status != STATUS_CONSENSUS_NEEDED && !linked && !in_call_only {
            let original = activity.votes[0]["message"].as_str().unwrap_or_default().as_bytes().to_vec();
            let submission = state.read_store(|s| submitter_caller(s, &org.id, &activity.votes[0]));
            if let Ok(submitter) = submission {
                if let Some(link) = log_link(state, submitter.stamped(&original), &activity).await {
                    let s = state.clone();
                    let stored = tokio::task::spawn_blocking(move || s.store.apply(&[link])).await;
                    if !matches!(stored, Ok(Ok(()))) {
                        tracing::warn!(activity = %activity.id, "the activity's log link was not stored");
                    }
                }
            }
        }
    }
    Ok(())
}

/// `POST /public/v1/query/<path>` from the gateway itself: authenticate, check read access,
/// answer ([`Origin::Internal`]: no IP allowlist applies).
pub async fn query(
    state: Arc<AppState>,
    registry: &'static Registry,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    query_from(Origin::Internal, state, registry, path, headers, body).await
}

/// `POST /public/v1/query/<path>` from `origin`.
pub async fn query_from(
    origin: Origin,
    state: Arc<AppState>,
    registry: &'static Registry,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, ApiError> {
    let q = registry.query(path).ok_or_else(|| ApiError::not_found(format!("unknown query endpoint: query/{path}")))?;
    let mut request = submission::parse_body(body)?;
    let id = submission::organization_id(&request)?;
    let (org, caller) = match headers.get("x-session").filter(|_| !stamps::has_stamp(headers)) {
        Some(session) => stamps::read_only_session(&state, session, organization(&state, id).await?).await?,
        None => {
            let stamp = stamps::verified_stamp(headers, body)?;
            let (org, caller, _) = authenticate(&state, id, stamp, None, HISTORY_READS.contains(&path)).await?;
            (org, caller)
        }
    };
    if matches!(caller.credential, Credential::Attested(_) | Credential::VerificationToken(_)) {
        return Err(ApiError::forbidden("request not authorized: an attested stamp may only submit stamp_login"));
    }
    crate::ip_allowlists::enforce(&state, &org, &caller, origin).await?;
    state.limits.charge_credential(caller.credential.id())?;
    request.remove("organizationId");
    let params = submission::strip_nulls(Value::Object(request));
    (q.handler)(QueryCtx { state, registry, org, caller }, params).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(params: Value) -> Envelope {
        Envelope {
            activity_type: "ACTIVITY_TYPE_CREATE_WALLET".into(),
            timestamp_ms: 1,
            organization_id: "o".into(),
            parameters: params,
        }
    }

    #[test]
    fn intent_hash_ignores_key_order_and_timestamp_but_not_values() {
        let a = env(serde_json::from_str(r#"{"walletName":"w","accounts":[{"a":1,"b":2}]}"#).unwrap());
        let mut b = env(serde_json::from_str(r#"{"accounts":[{"b":2,"a":1}],"walletName":"w"}"#).unwrap());
        b.timestamp_ms = 2;
        assert_eq!(intent_hash(&a), intent_hash(&b));
        let c = env(json!({"walletName": "x", "accounts": [{"a": 1, "b": 2}]}));
        assert_ne!(intent_hash(&a), intent_hash(&c));
        let mut d = env(json!({"walletName": "w", "accounts": [{"a": 1, "b": 2}]}));
        d.organization_id = "other".into();
        assert_ne!(intent_hash(&a), intent_hash(&d));
    }
}
