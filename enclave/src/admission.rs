//! Enclave admission: key material is used only for what a certified credential of the
//! organization stamped, just now, for exactly that operation — verified here, never taken
//! from the gateway's word.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use coffer_auth::envelope::{derived_id, StampedActivity, ACTIVITY_ID};
use coffer_auth::oidc::Claims;
use coffer_auth::{attested, stamp, webauthn};
use coffer_proto::v1 as pb;
use prost::Message;
use serde_json::Value;
use sha2::Digest;

use crate::decider::{Decided, Decider, Loaded, RulesRefusal, VerifiedVote};
use crate::error::{EnclaveError, RefusalReason, BUSY, REPLAYED, VOTE_REJECTED};
use crate::hsm::Hsm;
use crate::link_request::{Ballot, LinkRequest};
use crate::store::{
    BallotKept, DecisionRecord, EnclaveStore, KeptBallot, Remembered, ReplayLane, ReplayShare, Spend, StoreError,
    MAX_BALLOTS_PER_ORGANIZATION,
};

/// The activity type of a vote that lets a waiting activity run.
pub const APPROVE_ACTIVITY: &str = "ACTIVITY_TYPE_APPROVE_ACTIVITY";
pub const REJECT_ACTIVITY: &str = "ACTIVITY_TYPE_REJECT_ACTIVITY";
/// Most bytes of a vote's stamped body (an `approve_activity` or `reject_activity` is a few
/// hundred) and of its stamp (a passkey's is the largest): what the enclave keeps of a vote.
const MAX_VOTE_BODY_BYTES: usize = 4 * 1024;
const MAX_VOTE_STAMP_BYTES: usize = 16 * 1024;
/// A count with no allow answered as a rejected allow (never: only allows are checked for votes).
pub const NO_ALLOW_COUNTED: &str = "the replay window answered a count without an allow as rejected";
/// The operation of `DecideActivity`, the one call a rejection is sent to.
const DECIDE_ACTIVITY: &str = "decide_activity";

/// How long a waiting activity's original stamp stays usable (the vote lifetime).
pub const VOTE_LIFETIME_MS: i64 = 24 * 60 * 60 * 1000;
/// `issuing_fingerprint` prefix of certificates made by operator bootstrap.
pub const BOOTSTRAP: &str = "bootstrap:";

const CERT_DOMAIN: &[u8] = b"coffer-credential-certificate-v1";

/// Length-prefixed fields: what an HSM MAC covers (the first field is the domain).
pub fn mac_input(fields: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    for field in fields {
        out.extend_from_slice(&(field.len() as u32).to_be_bytes());
        out.extend_from_slice(field);
    }
    out
}

/// The bytes a certificate's MAC covers: every field but the MAC, length-prefixed.
pub fn certificate_mac_input(c: &pb::CredentialCertificate) -> Vec<u8> {
    let expires = c.expires_at_ms.to_be_bytes();
    let mut fields: Vec<&[u8]> = vec![
        CERT_DOMAIN,
        c.organization_id.as_bytes(),
        c.user_id.as_bytes(),
        c.credential_type.as_bytes(),
        c.public_key.as_bytes(),
        &expires,
        c.issuing_fingerprint.as_bytes(),
    ];
    // A session profile's scope, when there is one (certificates without one keep their input).
    if !c.session_scope.is_empty() {
        fields.push(c.session_scope.as_bytes());
    }
    mac_input(&fields)
}

const OAUTH2_DOMAIN: &[u8] = b"coffer-oauth2-credential-v1";

/// The bytes an OAuth 2.0 credential's MAC covers: every field but the MAC, length-prefixed.
pub fn oauth2_mac_input(c: &pb::Oauth2Credential) -> Vec<u8> {
    mac_input(&[
        OAUTH2_DOMAIN,
        c.organization_id.as_bytes(),
        c.credential_id.as_bytes(),
        c.provider.as_bytes(),
        c.client_id.as_bytes(),
        c.encrypted_client_secret.as_bytes(),
    ])
}

/// What the enclave established about a request before touching key material.
#[derive(Debug)]
pub struct Admitted {
    /// The enclave operation it was authorized for (audit lines name it).
    pub operation: &'static str,
    /// The stamped body of the activity: the only source of the operation's parameters.
    pub activity: StampedActivity,
    /// The certified credential that stamped it.
    pub credential: pb::CredentialCertificate,
    /// The credential is the parent organization's, acting for its sub-organization (login
    /// activities only, with the sub-organization's parent certificate).
    pub via_parent: bool,
    /// What the organization's rules decided (the state read and the policy evaluation).
    pub decided: Decided,
    /// The organization whose rules decide (the parent's for a parent's login), the submitter and
    /// the verified voters: what [`Admission::decide_over`] reads.
    policy_org: String,
    submitter: VerifiedVote,
    voters: Vec<VerifiedVote>,
    /// The same votes as an activity states them (the submitter's first): what its in-call link
    /// must state, key and stamped body included.
    ballots: Vec<Ballot>,
    /// Where [`refuse`] records a refusal after this authorization.
    decisions: DecisionLog,
}

/// An authorization's stamp, not spent yet ([`Admission::authorize_unspent`]): its replay entry
/// (the window's share it is charged to, its key and expiry) and the allow it stands for.
#[derive(Debug)]
pub struct Unspent {
    share: ReplayShare,
    key: [u8; 32],
    expires: i64,
    allowed: DecisionRecord,
    /// Admitted by a vote (an approval) rather than by its own stamp.
    approved: bool,
    /// Its outcome is audited already ([`Admission::authorize_key_use`]).
    audited: bool,
}

impl Unspent {
    /// The stamp to spend as part of another write of the authority store, as of now.
    pub fn to_spend(&self) -> Spend {
        Spend {
            share: self.share.clone(),
            key: self.key,
            expires_ms: self.expires,
            now_ms: now_ms(),
            allowed: self.allowed.clone(),
        }
    }

    /// The same, with `result` (the activity's result as the enclave made it, in the API's shape)
    /// recorded with its allow: the log links the activity only as completed, with that result.
    pub fn with_result(mut self, result: &serde_json::Value) -> Self {
        self.allowed.result_digest = coffer_auth::proof::json_digest(result);
        self
    }

    /// The same, with what a state change's result must state of the records it made
    /// (`made`: `coffer_org_rules::transition::made_ids` of its changes) recorded with its allow:
    /// a later link (`RecordActivity`) states them so, or is refused.
    pub fn with_made(mut self, made: &[(&str, serde_json::Value)]) -> Self {
        self.allowed.result_digest = crate::link_request::made_record(made);
        self
    }
}

/// The authority store's decision log, as an [`Admitted`] carries it.
#[derive(Clone)]
struct DecisionLog(Arc<dyn EnclaveStore>);

/// Records how a login, session or one-time code (`coffer_org_rules::subjects::is_login_operation`)
/// ended, after its [`Admitted`] was handed on (an async call's later steps): the log links it as
/// the decision log then says, completed only once done, failed only if not done.
#[derive(Debug, Clone)]
pub struct OutcomeRecorder {
    log: DecisionLog,
    record: DecisionRecord,
}

impl OutcomeRecorder {
    /// The request failed (`e`) after its allow: nothing links it completed.
    pub fn failed(&self, e: &EnclaveError) {
        self.log.keep(&DecisionRecord { at_ms: now_ms(), reason: e.kind().to_string(), ..self.record.clone() });
    }

    /// The request did its work: recorded before it answers (or it fails), so nothing links it
    /// failed and it never runs again.
    pub fn done(&self) -> Result<(), EnclaveError> {
        let record = DecisionRecord {
            at_ms: now_ms(),
            outcome: crate::store::OUTCOME_DONE.into(),
            result_digest: crate::store::DONE_MARK.into(),
            ..self.record.clone()
        };
        self.log.0.record_decision(&record).map_err(EnclaveError::from)
    }

    /// `result` as the call answers it: done recorded when it did its work, the failure when not
    /// (a failure to record done fails it).
    pub fn close<T>(&self, result: Result<T, EnclaveError>) -> Result<T, EnclaveError> {
        let result = result.and_then(|v| self.done().map(|()| v));
        if let Err(e) = &result {
            self.failed(e);
        }
        result
    }
}
impl Admitted {
    /// The policy outcomes the decision read, as recorded (JSON text).
    pub fn evaluation(&self) -> String {
        self.decided.evaluation.outcomes_json_text()
    }

    /// The verified approvals the decision counted: the submitter's, then every vote's.
    pub fn approvals(&self) -> impl Iterator<Item = &VerifiedVote> {
        std::iter::once(&self.submitter).chain(&self.voters)
    }

    /// The activity this call is asked to link ([`LinkRequest::checked`]); a refusal of it is
    /// recorded as this authorization's.
    /// Its votes are the ones the rules could count: the submitter's, then each approval by a
    /// credential the decision's state holds live, of a root user on what only the root quorum
    /// decides (a vote stamped by a revoked key, or by a user who may not vote, is not stated).
    pub fn link_request(&self, log: &pb::LogRequest, makes_result: bool) -> Result<LinkRequest, EnclaveError> {
        let state = &self.decided.loaded.state;
        let now = now_ms();
        let root_only =
            coffer_org_rules::subjects::subject(&self.activity.activity_type).is_some_and(|s| s.root_quorum);
        let counted: Vec<Ballot> = self
            .ballots
            .iter()
            .zip(self.approvals())
            .enumerate()
            .filter(|(n, (_, v))| {
                *n == 0
                    || (v.session_scope.is_empty()
                        && state.live_credential(&v.user_id, &v.public_key, &v.credential_type, now).is_some()
                        && (!root_only || state.organization.root_user_ids.contains(&v.user_id)))
            })
            .map(|(_, (b, _))| b.clone())
            .collect();
        LinkRequest::checked(&self.activity, log, &counted, makes_result).map_err(|e| match e {
            EnclaveError::Refused { reason, message, .. } => refuse(self, reason, &message),
            other => other,
        })
    }

    /// Records that what this authorization allowed failed after its stamp was spent (a state
    /// change not applied): its latest decision is no longer an allow, so nothing links it
    /// completed.
    pub fn failed_after_spend(&self, e: &EnclaveError) {
        self.decisions.failed(self, e.kind());
    }

    /// What records how this authorization's request ended once it has been handed on.
    pub fn outcome_recorder(&self) -> OutcomeRecorder {
        OutcomeRecorder { log: self.decisions.clone(), record: decision(self, crate::store::OUTCOME_FAILED, "") }
    }

    /// What this authorization's allow line named, for its outcome line (`crate::audit`).
    pub fn decision(&self) -> crate::audit::Decision {
        crate::audit::Decision {
            operation: self.operation,
            organization: self.activity.organization_id.clone(),
            credential: self.credential.public_key.clone(),
            fingerprint: self.activity.fingerprint.clone(),
        }
    }
}

impl std::fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DecisionLog")
    }
}

impl DecisionLog {
    /// Records a refusal of an authorized request; a failure to record is logged, the refusal stands.
    fn refused(&self, a: &Admitted, reason: RefusalReason) {
        self.keep(&decision(a, crate::store::OUTCOME_REFUSE, reason.as_str_name()));
    }

    /// Records the failure (`what`: its kind) of an authorized request after its allow.
    fn failed(&self, a: &Admitted, what: &str) {
        self.keep(&decision(a, crate::store::OUTCOME_FAILED, what));
    }

    /// Records `record`; a failure to record is logged, the outcome it records stands.
    fn keep(&self, record: &DecisionRecord) {
        if let Err(e) = self.0.record_decision(record) {
            tracing::error!(
                error = %e,
                operation = %record.operation,
                outcome = %record.outcome,
                "the decision log did not take an outcome"
            );
        }
    }
}

/// The decision log's record of `outcome` for an authorized request.
fn decision(a: &Admitted, outcome: &str, reason: &str) -> DecisionRecord {
    decision_of(a.operation, &a.activity, &a.credential, outcome, reason)
}

/// The operation name `ApplyActivity` is authorized under (its replay entries' and decisions').
pub const APPLY_ACTIVITY: &str = "apply_activity";

/// The replay window's key for a stamped body's `fingerprint` used by `operation`.
fn replay_key_of(operation: &str, fingerprint: &str) -> [u8; 32] {
    let mut key = sha2::Sha256::new();
    key.update(operation.as_bytes());
    key.update([0u8]);
    key.update(fingerprint.as_bytes());
    key.finalize().into()
}

fn decision_of(
    operation: &str,
    activity: &StampedActivity,
    credential: &pb::CredentialCertificate,
    outcome: &str,
    reason: &str,
) -> DecisionRecord {
    DecisionRecord {
        at_ms: now_ms(),
        organization_id: activity.organization_id.clone(),
        operation: operation.to_string(),
        fingerprint: activity.fingerprint.clone(),
        activity_type: activity.activity_type.clone(),
        user_id: credential.user_id.clone(),
        outcome: outcome.to_string(),
        reason: reason.to_string(),
        result_digest: String::new(),
    }
}

/// Verifies stamps, certificates, freshness and replay for every key-using call.
pub struct Admission {
    hsm: Arc<Hsm>,
    rules: Arc<Decider>,
    freshness_ms: i64,
    /// The replay window (shared by every enclave on the same store) and the decision log.
    store: Arc<dyn EnclaveStore>,
    /// `auth_proxy_signups_per_hour` and `auth_proxy_signups_per_day`.
    signups_per_hour: u64,
    signups_per_day: u64,
    /// The replay lanes of sign-ups ([`ReplayShare`]): live entries of one sign-up's requests
    /// (`replay_quota_per_signup`), and of all sign-ups of one top-level organization together.
    replay_per_signup: u64,
    replay_all_signups: u64,
    /// Each organization's activity log head, as this enclave last appended it.
    log: crate::activity_log::ActivityLog,
    /// Submissions this enclave authorized lately, by fingerprint. Recording one in the log need
    /// not verify its stamp again.
    authorized_lately: Mutex<AuthorizedLately>,
}

/// Submissions authorized lately ([`Admission::authorized_lately`]), in two generations: when the
/// newer holds half of [`AUTHORIZED_LATELY`], it becomes the older and the older is dropped. So
/// the latest half are always kept: a flood of one tenant's authorizations forgets the oldest
/// others', never all of them at once.
#[derive(Default)]
struct AuthorizedLately {
    newer: HashMap<String, DecidedSubmission>,
    older: HashMap<String, DecidedSubmission>,
}

impl AuthorizedLately {
    fn insert(&mut self, fingerprint: String, submission: DecidedSubmission) {
        if self.newer.len() >= AUTHORIZED_LATELY / 2 {
            self.older = std::mem::take(&mut self.newer);
        }
        self.older.remove(&fingerprint);
        self.newer.insert(fingerprint, submission);
    }

    fn remove(&mut self, fingerprint: &str) -> Option<DecidedSubmission> {
        self.newer.remove(fingerprint).or_else(|| self.older.remove(fingerprint))
    }

    fn get(&self, fingerprint: &str) -> Option<DecidedSubmission> {
        self.newer.get(fingerprint).or_else(|| self.older.get(fingerprint)).cloned()
    }
}

/// What the enclave decided of a stamped submission, as the log links it: its organization and
/// type, and the result it made (kept by [`Admission::authorized_lately`]).
#[derive(Clone)]
pub struct DecidedSubmission {
    pub organization_id: String,
    pub activity_type: String,
    /// The user and key whose certified credential stamped it (the activity's first vote is
    /// theirs).
    pub user_id: String,
    pub public_key: String,
    /// The digest of its result as the enclave made it (a key use's), or empty.
    pub result_digest: String,
}

/// Most votes one activity is linked with ([`Admission::verify_votes`]): each costs a signature
/// check.
pub const MAX_VOTES_LINKED: usize = 100;

/// Most fingerprints [`Admission::authorized_lately`] keeps (the latest half always; a
/// submission it forgot is verified again when recorded).
const AUTHORIZED_LATELY: usize = 65_536;

/// The enclave's clock, in ms since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A refusal, with what is known of the request for the audit line.
struct Refusal {
    reason: RefusalReason,
    message: String,
    organization: String,
    credential: String,
    fingerprint: String,
    /// What it carries beyond its words, when anything (rare: boxed).
    attached: Option<Box<Attached>>,
}

/// What a [`Refusal`] can carry beyond its words.
#[derive(Debug)]
enum Attached {
    /// The authority store failed: the caller gets that error, not a refusal.
    StoreFailed(StoreError),
    /// A refusal of the organization's policies: the outcomes the decision read.
    Evaluation(String),
}

impl Refusal {
    /// Writes the refusal's audit line.
    fn audit(&self, operation: &str) {
        tracing::warn!(
            target: "coffer_audit",
            decision = "refuse",
            operation,
            reason = %self.message,
            reason_code = self.reason.as_str_name(),
            organization = %self.organization,
            credential = %self.credential,
            fingerprint = %self.fingerprint,
            "enclave decision"
        );
    }

    fn new(reason: RefusalReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            organization: String::new(),
            credential: String::new(),
            fingerprint: String::new(),
            attached: None,
        }
    }

    /// The refusal of the organization's rules, with the outcomes their decision read.
    fn of_rules(refused: RulesRefusal) -> Self {
        let attached = Some(Box::new(Attached::Evaluation(refused.evaluation)));
        Self { attached, ..Self::new(refused.reason, refused.message) }
    }

    /// The authority store failed while deciding: no decision could be made.
    fn store_failed(e: StoreError) -> Self {
        let mut r = Self::new(RefusalReason::Unspecified, format!("no decision: {e}"));
        r.attached = Some(Box::new(Attached::StoreFailed(e)));
        r
    }

    /// The error the caller sees: the store's failure if there was one, busy when the replay
    /// window (or the organization's share of it) is full, else a refusal.
    fn into_error(self) -> EnclaveError {
        let evaluation = match self.attached.map(|a| *a) {
            Some(Attached::StoreFailed(e)) => return e.into(),
            Some(Attached::Evaluation(e)) => e,
            None => String::new(),
        };
        match self.reason {
            RefusalReason::ReplayWindowFull | RefusalReason::OrganizationReplayQuota => {
                EnclaveError::Busy { reason: self.reason, message: self.message }
            }
            reason => EnclaveError::Refused { reason, message: self.message, evaluation },
        }
    }

    fn about(mut self, activity: &StampedActivity, credential: &pb::CredentialCertificate) -> Self {
        self.organization = activity.organization_id.clone();
        self.credential = credential.public_key.clone();
        self.fingerprint = activity.fingerprint.clone();
        self
    }
}

impl Admission {
    /// An authority whose replay window and decision log are `store`'s (shared by every enclave
    /// that opens the same store).
    pub fn new(hsm: Arc<Hsm>, freshness_ms: i64, store: Arc<dyn EnclaveStore>) -> Self {
        Self {
            hsm,
            freshness_ms,
            rules: Arc::new(Decider::new(store.clone())),
            store,
            signups_per_hour: 10_000,
            signups_per_day: 100_000,
            replay_per_signup: 1_000,
            replay_all_signups: 50_000,
            log: crate::activity_log::ActivityLog::default(),
            authorized_lately: Mutex::default(),
        }
    }

    /// A finished activity's stamped submission, verified as it stood when it was stamped (the
    /// stamp over the body, a genuine certificate valid at the body's timestamp), for its record
    /// in the activity log: freshness, replay and the rules were decided when it ran.
    pub fn verify_submission(
        &self,
        request: &pb::StampedRequest,
    ) -> Result<(StampedActivity, pb::CredentialCertificate), EnclaveError> {
        let stamped_at = StampedActivity::parse(&request.body).map(|a| a.timestamp_ms).unwrap_or(0);
        self.verify_stamped(request, stamped_at, None).map_err(|r| {
            r.audit("record_activity");
            r.into_error()
        })
    }

    /// The votes `votes` cast on `activity` (stamped approvals and rejections): each verified as
    /// genuine by a certified credential of the activity's organization, naming this activity,
    /// cast within the vote lifetime after it, and by a credential the organization's state
    /// holds live now (a revoked or expired key's vote is not linked, whatever time it states),
    /// of a root user for an activity only the root quorum decides. The cheap checks come first,
    /// and a user votes once.
    pub fn verify_votes(
        &self,
        activity: &StampedActivity,
        votes: &[pb::StampedRequest],
    ) -> Result<Vec<Ballot>, EnclaveError> {
        if votes.len() > MAX_VOTES_LINKED {
            return Err(EnclaveError::invalid(format!("an activity is linked with at most {MAX_VOTES_LINKED} votes")));
        }
        let not_a_vote = |why: &str| EnclaveError::refused(RefusalReason::NotApproved, why.to_string());
        let now = now_ms();
        let mut verified: Vec<Ballot> = Vec::with_capacity(votes.len());
        for stamped in votes {
            let vote = StampedActivity::parse(&stamped.body).map_err(|_| not_a_vote("a vote presented is no vote"))?;
            let selection = match vote.activity_type.as_str() {
                APPROVE_ACTIVITY => "VOTE_SELECTION_APPROVED",
                REJECT_ACTIVITY => "VOTE_SELECTION_REJECTED",
                _ => return Err(not_a_vote("a vote presented is no vote")),
            };
            if vote.organization_id != activity.organization_id
                || vote.parameters.get("fingerprint").and_then(Value::as_str) != Some(activity.fingerprint.as_str())
                || vote.timestamp_ms.saturating_sub(activity.timestamp_ms) > VOTE_LIFETIME_MS
                || activity.timestamp_ms.saturating_sub(vote.timestamp_ms) > self.freshness_ms
            {
                return Err(not_a_vote(
                    "a vote presented is not a vote on this activity, cast while it could be voted on",
                ));
            }
            let (_, voter) = self.verify_stamped(stamped, vote.timestamp_ms, None).map_err(|r| {
                r.audit("record_activity");
                r.into_error()
            })?;
            // A voter the rules count: live now, a root user on what only the root quorum decides.
            self.may_vote(activity, &voter, now).map_err(Refusal::into_error)?;
            if verified.iter().any(|b| b.user_id == voter.user_id) {
                return Err(not_a_vote("two votes presented are one user's"));
            }
            verified.push(Ballot {
                user_id: voter.user_id,
                selection,
                public_key: voter.public_key,
                message: String::from_utf8_lossy(&stamped.body).into_owned(),
            });
        }
        Ok(verified)
    }

    /// What this enclave authorized lately of the submission with `fingerprint` (its stamp and
    /// certificate verified then), kept until it is linked ([`Admission::forget_authorized`]).
    pub fn authorized_lately(&self, fingerprint: &str) -> Option<DecidedSubmission> {
        self.authorized_lately.lock().ok()?.get(fingerprint)
    }

    /// Forgets what [`Admission::authorized_lately`] kept of `fingerprint` (it is linked).
    pub fn forget_authorized(&self, fingerprint: &str) {
        if let Ok(mut lately) = self.authorized_lately.lock() {
            lately.remove(fingerprint);
        }
    }

    /// The activity log: each organization's head, appended through the authority store.
    pub fn activity_log(&self) -> (&crate::activity_log::ActivityLog, &dyn EnclaveStore) {
        (&self.log, self.store.as_ref())
    }

    /// The authority store every enclave on it shares (one-time codes count their sends,
    /// attempts and spent tokens there).
    pub fn store(&self) -> &dyn EnclaveStore {
        self.store.as_ref()
    }

    /// The same authority with `auth_proxy_signups_per_hour` = `per_hour` and
    /// `auth_proxy_signups_per_day` = `per_day`.
    pub fn signup_quota(mut self, per_hour: u64, per_day: u64) -> Self {
        self.signups_per_hour = per_hour;
        self.signups_per_day = per_day;
        self
    }

    /// The same authority with `replay_quota_per_signup` = `per_signup`, and all sign-ups of
    /// one top-level organization together held to `all_signups` live replay entries.
    pub fn signup_replay_quota(mut self, per_signup: u64, all_signups: u64) -> Self {
        self.replay_per_signup = per_signup;
        self.replay_all_signups = all_signups;
        self
    }

    /// Records `what` (a body's fingerprint, an otp id, a token id) in `scope` of the store every
    /// enclave shares until `expires_ms`, with at most `quota` live entries in the scope. The
    /// store's replay keys are one set across scopes, so the key is derived from the scope and
    /// `what` together: the same thing counted in two scopes counts in each. Every counter of the
    /// enclave other than the replay window goes through here.
    pub fn count_within(
        &self,
        scope: &str,
        what: &str,
        expires_ms: i64,
        now_ms: i64,
        quota: u64,
    ) -> Result<Remembered, EnclaveError> {
        let mut key = sha2::Sha256::new();
        key.update(scope.as_bytes());
        key.update([0u8]);
        key.update(what.as_bytes());
        Ok(self.store.remember_within(scope, key.finalize().into(), expires_ms, now_ms, quota)?)
    }

    /// Counts one sign-up (the stamped body's `fingerprint`) of `organization`'s auth proxy in
    /// the store, for an hour and for a day: busy (`SIGNUP_QUOTA`) past
    /// `auth_proxy_signups_per_hour` or `auth_proxy_signups_per_day`. The same body stamped again
    /// is not counted twice.
    pub fn charge_signup(&self, organization: &str, fingerprint: &str) -> Result<(), EnclaveError> {
        const HOUR_MS: i64 = 3_600_000;
        let now = now_ms();
        let windows = [
            ("auth-proxy-signups", HOUR_MS, self.signups_per_hour, "hour", "auth_proxy_signups_per_hour"),
            ("auth-proxy-signups-day", 24 * HOUR_MS, self.signups_per_day, "day", "auth_proxy_signups_per_day"),
        ];
        for (prefix, length, quota, period, setting) in windows {
            let scope = format!("{prefix}/{organization}");
            match self.count_within(&scope, fingerprint, now.saturating_add(length), now, quota)? {
                Remembered::Fresh | Remembered::Replayed => {}
                Remembered::OrganizationQuotaFull => {
                    return Err(EnclaveError::Busy {
                        reason: RefusalReason::SignupQuota,
                        message: format!(
                            "the auth proxy made {quota} sign-ups in the last {period} ({setting}): retry later"
                        ),
                    })
                }
                Remembered::WindowFull => {
                    return Err(EnclaveError::Busy { reason: RefusalReason::ReplayWindowFull, message: BUSY.into() })
                }
                Remembered::Rejected => return Err(EnclaveError::Internal(NO_ALLOW_COUNTED.into())),
            }
        }
        Ok(())
    }

    /// An authority on a store in this process's memory alone (tests, operator commands that
    /// only certify): a replay window of `replay_capacity` entries, as much for one organization.
    pub fn in_memory(hsm: Arc<Hsm>, freshness_ms: i64, replay_capacity: u64) -> Result<Self, EnclaveError> {
        let limits = crate::store::StoreLimits {
            replay_capacity,
            replay_per_organization: replay_capacity,
            decision_retention_ms: 0,
        };
        let store = crate::store::SqliteEnclaveStore::open_in_memory(limits)?;
        Ok(Self::new(hsm, freshness_ms, Arc::new(store)))
    }

    /// The same admission, its rules with these per-organization caps ([`Decider::limited`]).
    pub fn limited(self, limits: coffer_org_rules::Limits) -> Self {
        let cache_bytes = self.rules.cache_budget_bytes();
        self.with_rules(limits, cache_bytes)
    }

    /// The same admission, keeping at most `bytes` of organizations' states in memory
    /// ([`Decider::cache_budget`]).
    pub fn state_cache(self, bytes: usize) -> Self {
        let limits = self.rules.limits();
        self.with_rules(limits, bytes)
    }

    fn with_rules(self, limits: coffer_org_rules::Limits, cache_bytes: usize) -> Self {
        let rules = Decider::new(self.store.clone()).limited(limits).cache_budget(cache_bytes);
        Self { rules: Arc::new(rules), ..self }
    }

    /// Decides `a` again, with the same stamps, over `loaded`: the state a state change is decided
    /// on (the head its organization's staged changes leave, see [`Decider::stage`]). The decision
    /// its authorization made is kept when it read that very state. A refusal is returned as the
    /// caller's error (and audited).
    pub fn decide_over(&self, a: &Admitted, loaded: Option<Arc<Loaded>>) -> Result<Decided, EnclaveError> {
        if let Some(l) = &loaded {
            if Arc::ptr_eq(&a.decided.loaded, l) {
                return Ok(a.decided.clone());
            }
        }
        let p = &a.activity;
        let now = now_ms();
        Decider::evaluate_over(loaded, &a.policy_org, &p.activity_type, &p.parameters, &a.submitter, &a.voters, now)
            .and_then(Decided::allowed)
            .map_err(|refused| refused_by(a, Refusal::of_rules(refused)))
    }

    /// The organizations' rules this authority decides with.
    pub fn rules(&self) -> &Arc<Decider> {
        &self.rules
    }

    /// Issues a certificate (the MAC computed in the HSM) and returns it encoded.
    pub fn certify(&self, mut cert: pb::CredentialCertificate) -> Result<Vec<u8>, EnclaveError> {
        cert.mac = self.hsm.certificate_mac(&certificate_mac_input(&cert))?;
        Ok(cert.encode_to_vec())
    }

    /// The certificate `bytes` encode, if this enclave issued it (its MAC verifies).
    pub fn genuine_certificate(&self, bytes: &[u8]) -> Option<pb::CredentialCertificate> {
        let cert = pb::CredentialCertificate::decode(bytes).ok().filter(|c| !c.mac.is_empty())?;
        self.hsm.certificate_mac_valid(&certificate_mac_input(&cert), &cert.mac).ok().filter(|v| *v).map(|_| cert)
    }

    /// Certifies an OAuth 2.0 credential (the MAC computed in the HSM).
    pub fn certify_oauth2(&self, mut c: pb::Oauth2Credential) -> Result<pb::Oauth2Credential, EnclaveError> {
        c.mac = self.hsm.certificate_mac(&oauth2_mac_input(&c))?;
        Ok(c)
    }

    /// Checks that `c` is a credential this enclave certified, of the stamped body's organization
    /// and the one the body names.
    pub fn check_oauth2(&self, a: &Admitted, c: &pb::Oauth2Credential, named_id: &str) -> Result<(), EnclaveError> {
        if !self.hsm.certificate_mac_valid(&oauth2_mac_input(c), &c.mac)? {
            return Err(refuse(
                a,
                RefusalReason::CertificateInvalid,
                "the OAuth 2.0 credential's certificate does not verify",
            ));
        }
        if c.organization_id != a.activity.organization_id {
            return Err(refuse(
                a,
                RefusalReason::BindingMismatch,
                "the OAuth 2.0 credential belongs to another organization than the stamped body",
            ));
        }
        if c.credential_id != named_id {
            return Err(refuse(
                a,
                RefusalReason::BindingMismatch,
                "the OAuth 2.0 credential is not the one the stamped body names",
            ));
        }
        Ok(())
    }

    /// Checks one webhook delivery attempt before the webhook key signs it: the timestamp is the
    /// enclave's now (within the freshness window, so no delivery can be signed ahead of time),
    /// the event id is short and plain, the body is an activity in its one canonical spelling, and
    /// the enclave's state witnesses it ([`Admission::unwitnessed_event`]). Returns the message to
    /// sign (`v1.ed25519.<key_id>.<timestamp>.<event_id>.` + body) and writes one audit line.
    pub fn webhook_message(
        &self,
        key_id: &str,
        timestamp_ms: u64,
        event_id: &str,
        body: &[u8],
    ) -> Result<Vec<u8>, EnclaveError> {
        const OPERATION: &str = "sign_webhook_delivery";
        // An object only, in the spelling the gateway renders (serde_json's compact form, keys
        // sorted): a repeated member, another spelling of a number or string, or whitespace would
        // let a consumer's parser read other than what the enclave checked.
        let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let activity = is_object
            .then(|| serde_json::from_slice::<serde_json::Value>(body).ok())
            .flatten()
            .filter(|v| serde_json::to_vec(v).is_ok_and(|canonical| canonical == body));
        let text = |k: &str| activity.as_ref().and_then(|v| v.get(k)).and_then(serde_json::Value::as_str);
        let ids = text("id").zip(text("organizationId"));
        let fresh = (timestamp_ms as i64 - now_ms()).abs() <= self.freshness_ms;
        let plain_event = !event_id.is_empty()
            && event_id.len() <= 128
            && event_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_:.".contains(&b));
        let organization = ids.map(|(_, o)| o.to_string()).unwrap_or_default();
        let refused = |reason: RefusalReason, message: &str| {
            let refusal = Refusal { organization: organization.clone(), ..Refusal::new(reason, message) };
            refusal.audit(OPERATION);
            refusal.into_error()
        };
        let refusal = if !fresh {
            Some((RefusalReason::Stale, "delivery timestamp is not the enclave's now"))
        } else if !plain_event {
            Some((RefusalReason::DeliveryInvalid, "event id must be 1-128 characters of [A-Za-z0-9-_:.]"))
        } else if body.len() > 4 * 1024 * 1024 || ids.is_none() {
            Some((
                RefusalReason::DeliveryInvalid,
                "delivery body is not an activity (an object with id and organizationId as the gateway renders it, at \
                 most 4 MiB)",
            ))
        } else {
            let (status, fingerprint) = (text("status").unwrap_or_default(), text("fingerprint").unwrap_or_default());
            let viewer_members_plain = ["canApprove", "canReject"]
                .iter()
                .all(|k| activity.as_ref().and_then(|v| v.get(k)).is_none_or(serde_json::Value::is_boolean));
            match (viewer_members_plain, ids) {
                (false, _) => Some((RefusalReason::DeliveryInvalid, "canApprove and canReject are true or false")),
                (true, Some((id, org))) => {
                    match self.unwitnessed_event(org, id, status, fingerprint, activity.as_ref()) {
                        Ok(refusal) => refusal,
                        // Audited as every refusal (a store that does not answer included).
                        Err(e) => {
                            return Err(refused(
                                e.refusal_reason().unwrap_or(RefusalReason::Unspecified),
                                &e.to_string(),
                            ))
                        }
                    }
                }
                (true, None) => None,
            }
        };
        if let Some((reason, message)) = refusal {
            return Err(refused(reason, message));
        }
        tracing::info!(
            target: "coffer_audit",
            decision = "allow",
            operation = OPERATION,
            organization = %organization,
            activity = %ids.map(|(id, _)| id).unwrap_or_default(),
            event = %event_id,
            "enclave decision"
        );
        crate::audit::record(crate::audit::Decision {
            operation: OPERATION,
            organization,
            credential: String::new(),
            fingerprint: event_id.to_string(),
        });
        let mut message = format!("v1.ed25519.{key_id}.{timestamp_ms}.{event_id}.").into_bytes();
        message.extend_from_slice(body);
        Ok(message)
    }

    /// Why the enclave would not sign a webhook event of activity `activity_id` (`activity`) in
    /// `status`, or `None` when its own state witnesses it: the organization is one it has, and a
    /// finished activity (completed, failed, rejected) is exactly the one its organization's log
    /// linked, once, in that status: the same id and the same activity digest (so a delivery
    /// cannot relabel a status, alter a result, or borrow another activity's fingerprint). An
    /// activity waiting for votes is not in the log: its id must be the one derived from its
    /// fingerprint, and the enclave must have found it waiting, as that type (it refused it for
    /// want of approvals, at some point: the event may be delivered after it completed).
    fn unwitnessed_event(
        &self,
        organization_id: &str,
        activity_id: &str,
        status: &str,
        fingerprint: &str,
        activity: Option<&serde_json::Value>,
    ) -> Result<Option<(RefusalReason, &'static str)>, EnclaveError> {
        const INVALID: RefusalReason = RefusalReason::DeliveryInvalid;
        if self.rules.load(organization_id)?.is_none() {
            return Ok(Some((INVALID, "an activity of an organization the enclave does not have")));
        }
        if status == ACTIVITY_CONSENSUS_NEEDED {
            if activity_id != derived_id(fingerprint, ACTIVITY_ID, 0) {
                return Ok(Some((INVALID, "a waiting activity's id is not the one its fingerprint derives")));
            }
            let activity_type =
                activity.and_then(|a| a.get("type")).and_then(serde_json::Value::as_str).unwrap_or_default();
            // Every activity is decided by the enclave, which records the one it finds waiting
            // (an event of no type, or of a type the policies do not decide, was never found
            // waiting).
            if !self.store.waited_for_votes(organization_id, fingerprint, activity_type)? {
                return Ok(Some((INVALID, "an activity the enclave did not find waiting for votes")));
            }
            return Ok(None);
        }
        if !coffer_auth::proof::FINAL_STATUSES.contains(&status) {
            return Ok(Some((
                INVALID,
                "an activity event has a status: completed, failed, rejected or waiting for votes",
            )));
        }
        let Some(link) = self.store.link_of(organization_id, fingerprint, status)? else {
            return Ok(Some((INVALID, "a finished activity the enclave's log does not have in that status")));
        };
        let digest = activity.map(coffer_auth::proof::activity_digest).unwrap_or_default();
        if link.activity_id != activity_id || link.activity_digest != digest {
            return Ok(Some((INVALID, "the activity is not the one the enclave's log linked in that status")));
        }
        Ok(None)
    }

    /// Expiry of a new credential valid for `seconds` from now (0 = none).
    pub fn expiry(&self, seconds: Option<u64>) -> u64 {
        seconds.map_or(0, |s| (now_ms().max(0) as u64).saturating_add(s.saturating_mul(1000)))
    }

    /// Checks `auth` for `operation`: the body must be one of `types`, stamped by a live certified
    /// credential of its organization, fresh and not seen before (or, after consensus, approved
    /// just now by such a credential naming its fingerprint). Writes one audit line either way.
    pub fn authorize(
        &self,
        operation: &'static str,
        auth: Option<&pb::Authorization>,
        types: &[&str],
    ) -> Result<Admitted, EnclaveError> {
        self.authorize_for(operation, auth, types, None, None)
    }

    /// [`Admission::authorize`] for a login activity, which a credential of the sub-organization's
    /// parent may also stamp when `parent_certificate` (a `COFFER_PARENT_ORGANIZATION` certificate
    /// of the body's organization) names the credential's organization as its parent, and which
    /// an attested key may stamp (`X-Stamp-Attested`, `stamp_login` only) when `attested` is
    /// what the caller verified of its token.
    pub fn authorize_for(
        &self,
        operation: &'static str,
        auth: Option<&pb::Authorization>,
        types: &[&str],
        parent_certificate: Option<&[u8]>,
        attested: Option<&AttestedIdentity>,
    ) -> Result<Admitted, EnclaveError> {
        let checked = self.check(operation, auth, types, parent_certificate, attested);
        // Nor one the activity log has already (linked failed before it ran, say): it is
        // finished, and what it did now would be hidden behind that link.
        let checked = checked.and_then(|(a, unspent)| {
            let (org, fingerprint) = (&a.activity.organization_id, &a.activity.fingerprint);
            // Nor a login done already (run again by a second approval once its replay entry
            // expired, say): what it made stands.
            let login = coffer_org_rules::subjects::login_operation(&a.activity.activity_type).is_some();
            let done = || -> Result<bool, StoreError> {
                Ok(login && self.store.decided(org, fingerprint)?.result_digest.starts_with(crate::store::DONE_MARK))
            };
            match self.store.spent(unspent.key, now_ms(), org, fingerprint).and_then(|spent| Ok(spent || done()?)) {
                Ok(false) => Ok((a, unspent)),
                Ok(true) => Err(Refusal::new(RefusalReason::Replayed, REPLAYED).about(&a.activity, &a.credential)),
                Err(e) => Err(Refusal::store_failed(e).about(&a.activity, &a.credential)),
            }
        });
        match checked.and_then(|(a, unspent)| self.remember(&a, &unspent).map(|()| (a, unspent.approved))) {
            Ok((a, approved)) => {
                self.allowed(&a, approved, false, "", true);
                Ok(a)
            }
            Err(r) => {
                r.audit(operation);
                Err(r.into_error())
            }
        }
    }

    /// [`Admission::authorize`] for a state change, whose stamp is spent only once the change is
    /// decided, checked and ready to stage ([`Admission::spend`]): a refused change spends
    /// nothing and leaves no allow in the decision log. Refusals are audited here as there.
    pub fn authorize_unspent(
        &self,
        operation: &'static str,
        auth: Option<&pb::Authorization>,
        types: &[&str],
        attested: Option<&AttestedIdentity>,
    ) -> Result<(Admitted, Unspent), EnclaveError> {
        let (a, unspent) = self.check(operation, auth, types, None, attested).map_err(|r| {
            r.audit(operation);
            r.into_error()
        })?;
        // A body whose stamp is spent already is refused before any work is done for it again
        // (and before a refusal of it enters the decision log); `spend` stays the gate.
        // Nor one the activity log has already (linked failed before it ran, say): it is
        // finished, and what it does now could never be linked.
        let (org, fingerprint) = (&a.activity.organization_id, &a.activity.fingerprint);
        if self.store.spent(unspent.key, now_ms(), org, fingerprint).map_err(EnclaveError::from)? {
            let r = Refusal::new(RefusalReason::Replayed, REPLAYED).about(&a.activity, &a.credential);
            r.audit(operation);
            return Err(r.into_error());
        }
        Ok((a, unspent))
    }

    /// Decides `auth` as the enclave call that does its activity's work would, and does nothing
    /// else: no stamp spent, no allow logged, nothing applied. The outcomes the policies read
    /// when they allow it; the call's own typed refusal otherwise (audited), an activity waiting
    /// for votes recorded in the decision log as that call records it. The gateway asks before a
    /// handler reaches the network for an activity (a webhook target's name), and to choose how to
    /// answer an activity its handler found wrong before the enclave decided it
    /// (`DecideActivity`). The call that does the work decides again.
    /// `types`: what the calls it stands in for take.
    pub fn decide_ahead(
        &self,
        auth: Option<&pb::Authorization>,
        types: &[&str],
        parent_certificate: Option<&[u8]>,
    ) -> Result<String, EnclaveError> {
        const OPERATION: &str = DECIDE_ACTIVITY;
        match self.check(OPERATION, auth, types, parent_certificate, None) {
            Ok((a, _unspent)) => Ok(a.evaluation()),
            Err(r) => {
                r.audit(OPERATION);
                Err(r.into_error())
            }
        }
    }

    /// The policy dry run: how the rules of `organization_id` (its authority state) would decide
    /// `activity_type` with `params` submitted now by the live credential named, whatever they
    /// decide. Refused only when nothing can be evaluated (no such organization or live
    /// credential, an activity type the rules do not know). Decides nothing, records nothing.
    pub fn dry_run(
        &self,
        organization_id: &str,
        credential: VerifiedVote,
        activity_type: &str,
        params: &Value,
    ) -> Result<(coffer_policy::decision::Evaluation, Option<coffer_policy::context::TransactionFacts>), EnclaveError>
    {
        let now = now_ms();
        let loaded = self.rules.load(organization_id)?;
        // The transaction as the policies see it, from the same state: what a console shows.
        let transaction =
            (loaded.as_ref()).and_then(|l| coffer_org_rules::facts::signed_transaction_facts(&l.state, params));
        let credential = VerifiedVote { at_ms: now, ..credential };
        Decider::evaluate_over(loaded, organization_id, activity_type, params, &credential, &[], now)
            .map(|d| (d.evaluation, transaction))
            .map_err(|r| EnclaveError::Refused { reason: r.reason, message: r.message, evaluation: String::new() })
    }

    /// [`Admission::authorize_unspent`] for a key operation, whose stamp is spent once its work
    /// is done: the call's outcome is audited from here on, so a failure before the spend (a
    /// sealed key that does not open, evidence of tampering) has its outcome line as well.
    ///
    /// A key use's own activity is linked in its call, and its result leaves only with that link:
    /// the activity to link (`Authorization.log`) is required and checked here, before any work.
    /// Key work for another activity (a new sub-organization's wallet) is linked with that
    /// activity, and asks for no link.
    pub fn authorize_key_use(
        &self,
        operation: &'static str,
        auth: Option<&pb::Authorization>,
        types: &[&str],
    ) -> Result<(Admitted, Unspent, Option<LinkRequest>), EnclaveError> {
        let (a, mut unspent) = self.authorize_unspent(operation, auth, types, None)?;
        let log = auth.and_then(|auth| auth.log.as_ref());
        let link = match (coffer_org_rules::subjects::KEY_USES.contains(&a.activity.activity_type.as_str()), log) {
            (true, Some(log)) => Some(a.link_request(log, true)?),
            (true, None) => {
                return Err(refuse(
                    &a,
                    RefusalReason::BindingMismatch,
                    "a key use is linked in its own call: the authorization names no activity to link",
                ))
            }
            (false, Some(_)) => {
                return Err(refuse(
                    &a,
                    RefusalReason::BindingMismatch,
                    "only a key use's own activity is linked in its call",
                ))
            }
            (false, None) => None,
        };
        crate::audit::record(a.decision());
        unspent.audited = true;
        Ok((a, unspent, link))
    }

    /// Spends the stamp of an authorization [`Admission::authorize_unspent`] made: its replay
    /// entry and its allow, committed together (refused if the stamp was spent meanwhile).
    pub fn spend(&self, a: &Admitted, unspent: Unspent) -> Result<(), EnclaveError> {
        match self.remember(a, &unspent) {
            Ok(()) => {
                coffer_process::crash_point::here("enclave-after-spend");
                // Not a state change's: it may still be refused on a retry after its stamp was
                // spent (a key use's work is done by now, as is an own call's at authorization).
                let digest = &unspent.allowed.result_digest;
                let key_use = !digest.is_empty() && !digest.starts_with(crate::link_request::MADE_MARK);
                self.allowed(a, unspent.approved, unspent.audited, digest, key_use);
                Ok(())
            }
            Err(r) => {
                r.audit(a.operation);
                Err(r.into_error())
            }
        }
    }

    /// Spends the stamp of `unspent` as part of `write`, which commits it with other work (a key
    /// use's link) in one transaction of the authority store, or commits nothing: the allow is
    /// audited once `write` succeeded; a stamp the window would not take is audited as refused.
    pub fn spend_within<T>(
        &self,
        a: &Admitted,
        unspent: Unspent,
        write: impl FnOnce(Spend) -> Result<T, EnclaveError>,
    ) -> Result<T, EnclaveError> {
        match write(unspent.to_spend()) {
            Ok(done) => {
                self.spent_within(a, unspent);
                Ok(done)
            }
            Err(e) => {
                self.unspent_within(a, &e);
                Err(e)
            }
        }
    }

    /// The stamp of `unspent` was spent by another write ([`Unspent::to_spend`]), committed: its
    /// allow is audited.
    pub fn spent_within(&self, a: &Admitted, unspent: Unspent) {
        let digest = &unspent.allowed.result_digest;
        let key_use = !digest.is_empty() && !digest.starts_with(crate::link_request::MADE_MARK);
        self.allowed(a, unspent.approved, unspent.audited, digest, key_use);
    }

    /// The write that was to spend a stamp failed with `e`, nothing kept: audited as the refusal
    /// it is when it is one (a replay, a full share or window).
    pub fn unspent_within(&self, a: &Admitted, e: &EnclaveError) {
        if let EnclaveError::Refused { reason, message, .. } | EnclaveError::Busy { reason, message } = e {
            Refusal::new(*reason, message.clone()).about(&a.activity, &a.credential).audit(a.operation);
        }
    }

    /// The replay entry and the allow of `unspent`, in one store call: refused as a replay when
    /// the window has the entry, busy when the organization's share or the window is full.
    fn remember(&self, a: &Admitted, unspent: &Unspent) -> Result<(), Refusal> {
        let about = |r: Refusal| r.about(&a.activity, &a.credential);
        let remembered = self
            .store
            .remember_allowed(&unspent.share, unspent.key, unspent.expires, now_ms(), &unspent.allowed)
            .map_err(|e| about(Refusal::store_failed(e)))?;
        match crate::error::spend_refusal(remembered) {
            None => Ok(()),
            Some((reason, message)) => Err(about(Refusal::new(reason, message))),
        }
    }

    /// The allow line of an authorization whose stamp was spent.
    /// `result_digest`: a key use's result. `lately`: whether `RecordActivity` may link it
    /// without reading the decision log ([`Admission::authorized_lately`]).
    fn allowed(&self, a: &Admitted, approved: bool, audited: bool, result_digest: &str, lately: bool) {
        tracing::info!(
            target: "coffer_audit",
            decision = "allow",
            operation = a.operation,
            organization = %a.activity.organization_id,
            credential = %a.credential.public_key,
            user = %a.credential.user_id,
            fingerprint = %a.activity.fingerprint,
            approved,
            "enclave decision"
        );
        if !audited {
            crate::audit::record(a.decision());
        }
        if !lately {
            return;
        }
        if let Ok(mut lately) = self.authorized_lately.lock() {
            let known = DecidedSubmission {
                organization_id: a.activity.organization_id.clone(),
                activity_type: a.activity.activity_type.clone(),
                user_id: a.credential.user_id.clone(),
                public_key: a.credential.public_key.clone(),
                result_digest: result_digest.to_string(),
            };
            lately.insert(a.activity.fingerprint.clone(), known);
        }
    }

    fn check(
        &self,
        operation: &'static str,
        auth: Option<&pb::Authorization>,
        types: &[&str],
        parent_certificate: Option<&[u8]>,
        attested: Option<&AttestedIdentity>,
    ) -> Result<(Admitted, Unspent), Refusal> {
        let now = now_ms();
        let request = auth
            .and_then(|a| a.request.as_ref())
            .ok_or_else(|| Refusal::new(RefusalReason::NoAuthorization, "no stamped request"))?;
        // A rejection is cast on the submission as it was stamped: a submitting credential that
        // expired since leaves nothing to run, and must not leave the activity unrejectable.
        let rejecting = operation == DECIDE_ACTIVITY
            && auth
                .and_then(|a| a.approval.as_ref())
                .and_then(|v| StampedActivity::parse(&v.body).ok())
                .is_some_and(|v| v.activity_type == REJECT_ACTIVITY);
        let verified_at = match rejecting {
            true => StampedActivity::parse(&request.body).map_or(now, |a| a.timestamp_ms),
            false => now,
        };
        let (activity, credential) = self.verify_stamped(request, verified_at, attested)?;
        let via_parent = activity.organization_id != credential.organization_id;
        if via_parent {
            let parent = parent_certificate.and_then(|c| pb::CredentialCertificate::decode(c).ok()).filter(|p| {
                p.credential_type == coffer_auth::grants::PARENT_ORGANIZATION
                    && p.organization_id == activity.organization_id
                    && p.public_key == credential.organization_id
                    && self.hsm.certificate_mac_valid(&certificate_mac_input(p), &p.mac).unwrap_or(false)
            });
            if parent.is_none() {
                return Err(Refusal::new(
                    RefusalReason::OrganizationMismatch,
                    "the credential belongs to another organization than the stamped body",
                )
                .about(&activity, &credential));
            }
        }
        // An older version a current client still sends asks for its current version's operation.
        if !types.contains(&coffer_org_rules::subjects::current_version(&activity.activity_type)) {
            return Err(Refusal::new(
                RefusalReason::OperationMismatch,
                format!("the stamped body is {}, which does not ask for this operation", activity.activity_type),
            )
            .about(&activity, &credential));
        }
        let mut voters: Vec<VerifiedVote> = Vec::new();
        let ballot = |voter: &pb::CredentialCertificate, body: &[u8]| Ballot {
            user_id: voter.user_id.clone(),
            selection: crate::link_request::VOTE_APPROVED,
            public_key: voter.public_key.clone(),
            message: String::from_utf8_lossy(body).into_owned(),
        };
        let mut ballots = vec![ballot(&credential, &request.body)];
        // What the replay window keeps, and from when it counts: the body's own fingerprint (per
        // operation), from its timestamp; for a run after consensus, from the approval's. Two
        // approvals that each meet the consensus run it once while the first one's entry lives
        // (the freshness window): not a vote lifetime, which would let a tenant hold its share
        // of the shared window for a day with approved runs.
        // A rejection cast just now (only `DecideActivity` is sent one): kept, never run.
        let mut rejection: Option<(StampedActivity, pb::CredentialCertificate, &pb::StampedRequest)> = None;
        // An approval cast just now: kept if it leaves the activity waiting.
        let mut approver: Option<(pb::CredentialCertificate, &pb::StampedRequest)> = None;
        let replay_key = match auth.and_then(|a| a.approval.as_ref()) {
            None => {
                self.fresh(&activity, now).map_err(|r| r.about(&activity, &credential))?;
                (activity.fingerprint.clone(), activity.timestamp_ms)
            }
            Some(approval) => {
                if now - activity.timestamp_ms > VOTE_LIFETIME_MS || activity.timestamp_ms - now > self.freshness_ms {
                    return Err(Refusal::new(
                        RefusalReason::Stale,
                        "the waiting activity's stamp is older than the vote lifetime",
                    )
                    .about(&activity, &credential));
                }
                let (vote, voter) = self.verify_stamped(approval, now, None)?;
                let named = vote.parameters.get("fingerprint").and_then(Value::as_str);
                if vote.organization_id != voter.organization_id {
                    return Err(Refusal::new(
                        RefusalReason::OrganizationMismatch,
                        "the credential belongs to another organization than the stamped body",
                    )
                    .about(&vote, &voter));
                }
                let rejects = vote.activity_type == REJECT_ACTIVITY && operation == DECIDE_ACTIVITY;
                if (vote.activity_type != APPROVE_ACTIVITY && !rejects)
                    || vote.organization_id != activity.organization_id
                    || named != Some(activity.fingerprint.as_str())
                {
                    return Err(Refusal::new(
                        RefusalReason::NotApproved,
                        "the approval does not approve this activity",
                    )
                    .about(&vote, &voter));
                }
                self.fresh(&vote, now).map_err(|r| r.about(&vote, &voter))?;
                // The submitter's approval is its submission's stamp: a vote of its own would
                // count nothing and be linked twice.
                if voter.user_id == credential.user_id && voter.organization_id == credential.organization_id {
                    return Err(Refusal::new(RefusalReason::NotApproved, "the submitter votes by submitting")
                        .about(&vote, &voter));
                }
                if approval.body.len() > MAX_VOTE_BODY_BYTES || approval.stamp.len() > MAX_VOTE_STAMP_BYTES {
                    return Err(Refusal::new(
                        RefusalReason::NotApproved,
                        format!(
                            "a vote's body is at most {MAX_VOTE_BODY_BYTES} bytes, its stamp {MAX_VOTE_STAMP_BYTES}"
                        ),
                    )
                    .about(&vote, &voter));
                }
                let at = vote.timestamp_ms;
                if rejects {
                    rejection = Some((vote, voter, approval));
                } else {
                    voters.push(verified_vote(&voter, at));
                    ballots.push(ballot(&voter, &approval.body));
                    approver = Some((voter, approval));
                }
                (activity.fingerprint.clone(), at)
            }
        };
        // Earlier votes of an activity that waited: the ones the enclave verified and kept itself
        // (never the gateway's list), each verified again as a genuine approval of this activity
        // within the vote lifetime; whether its credential is still live the rules decide. A
        // rejection kept ends it: nothing runs it.
        let fresh_voter =
            voters.first().map(|v| v.user_id.clone()).or_else(|| rejection.as_ref().map(|r| r.1.user_id.clone()));
        let kept = match fresh_voter {
            Some(_) => self
                .store
                .ballots(&activity.organization_id, &activity.fingerprint, now)
                .map_err(|e| Refusal::store_failed(e).about(&activity, &credential))?,
            None => Vec::new(),
        };
        if rejection.is_none() && kept.iter().any(|b| b.rejected) {
            return Err(Refusal::new(RefusalReason::VoteRejected, VOTE_REJECTED).about(&activity, &credential));
        }
        // Each verified as of its own time (a credential that expired since still cast it; whether
        // it is live now the rules decide); one that no longer verifies is not counted, and
        // never refuses the vote cast now.
        for b in kept.iter().filter(|b| !b.rejected && Some(&b.user_id) != fresh_voter.as_ref()) {
            let Some((vote, voter, stamped)) = self.kept_approval(&activity, b) else {
                tracing::warn!(organization = %b.organization_id, user = %b.user_id, "a kept vote is not counted");
                continue;
            };
            voters.push(verified_vote(&voter, vote.timestamp_ms));
            ballots.push(ballot(&voter, &stamped.body));
        }
        let policy_org = if via_parent { &credential.organization_id } else { &activity.organization_id };
        let submitter = verified_vote(&credential, activity.timestamp_ms);
        let decision =
            self.rules.decide(policy_org, &activity.activity_type, &activity.parameters, &submitter, &voters, now);
        if let Some((vote, voter, stamped)) = rejection {
            let evaluation = match &decision {
                Ok(d) => d.evaluation.outcomes_json_text(),
                Err(refused) => refused.evaluation.clone(),
            };
            return Err(self.reject(&activity, &vote, &voter, stamped, evaluation, now));
        }
        let decided = match decision {
            Ok(d) => d,
            Err(refused) => {
                // One that waits for votes is in the decision log, once: the enclave found it
                // waiting (what its webhook event needs). Votes that leave it waiting add nothing.
                let waited = || {
                    self.store.waited_for_votes(
                        &activity.organization_id,
                        &activity.fingerprint,
                        &activity.activity_type,
                    )
                };
                if refused.reason == RefusalReason::ConsensusNeeded && !waited().unwrap_or(false) {
                    let waits = decision_of(
                        operation,
                        &activity,
                        &credential,
                        crate::store::OUTCOME_REFUSE,
                        refused.reason.as_str_name(),
                    );
                    if let Err(e) = self.store.record_decision(&waits) {
                        tracing::error!(error = %e, operation, "the decision log did not take a refusal");
                    }
                }
                // An approval that leaves it waiting is kept, and counted with the next one: only
                // one the rules count (a credential live now, a root user's on what only the
                // root quorum decides), so that it never stands for, nor replaces, a vote that
                // counts.
                if let (RefusalReason::ConsensusNeeded, Some((voter, approval))) = (refused.reason, approver) {
                    self.may_vote(&activity, &voter, now)
                        .and_then(|()| self.keep_vote(&activity, &voter, approval, false, now))
                        .map_err(|r| r.about(&activity, &credential))?;
                }
                return Err(Refusal::of_rules(refused).about(&activity, &credential));
            }
        };
        let key = replay_key_of(operation, &replay_key.0);
        // Charged to the body's top-level organization, as the enclave's state says: each
        // top-level organization has its share of the window, and its sub-organizations spend
        // that share, not a share each. A sign-up's own request (anyone can get one) is charged to
        // its lane and to the lane of all its top-level organization's sign-ups as well, so that
        // neither one visitor nor all of them together hold the whole share. A fresh entry and
        // the allow it stands for are committed together: every allow is in the decision log
        // before anything is done, and if the store takes neither, nothing is done.
        let share = self
            .share_of(policy_org, via_parent, decided.loaded.clone())
            .map_err(|e| Refusal::store_failed(e).about(&activity, &credential))?;
        let approved = auth.is_some_and(|a| a.approval.is_some());
        let allowed = decision_of(
            operation,
            &activity,
            &credential,
            crate::store::OUTCOME_ALLOW,
            if approved { "approved" } else { "" },
        );
        // Kept at least a freshness window past now, whatever the stamp's time: an entry spent in
        // its stamp's last moments would otherwise expire right after its commit, and a
        // `RecordActivity` that looked for it then (to link the same body failed) would find it
        // gone, spend it again and link a change that stands as failed.
        let expires = replay_key.1.max(now).saturating_add(self.freshness_ms);
        let unspent = Unspent { share, key, expires, allowed, approved, audited: false };
        let decisions = DecisionLog(self.store.clone());
        let policy_org = policy_org.clone();
        let a = Admitted {
            operation,
            activity,
            credential,
            via_parent,
            decided,
            decisions,
            policy_org,
            submitter,
            voters,
            ballots,
        };
        Ok((a, unspent))
    }

    /// The approval kept in `b`, verified as of its own time as a vote on `activity`: none if it
    /// does not decode or verify (nothing kept is trusted further than it verifies).
    fn kept_approval(
        &self,
        activity: &StampedActivity,
        b: &KeptBallot,
    ) -> Option<(StampedActivity, pb::CredentialCertificate, pb::StampedRequest)> {
        let stamped = pb::StampedRequest::decode(b.stamped.as_slice()).ok()?;
        let at = StampedActivity::parse(&stamped.body).ok()?.timestamp_ms;
        let (vote, voter) = self.verify_stamped(&stamped, at, None).ok()?;
        let genuine = vote.activity_type == APPROVE_ACTIVITY
            && vote.organization_id == activity.organization_id
            && voter.organization_id == activity.organization_id
            && voter.user_id == b.user_id
            && vote.parameters.get("fingerprint").and_then(Value::as_str) == Some(activity.fingerprint.as_str());
        genuine.then_some((vote, voter, stamped))
    }

    /// Whether `voter` may vote on `activity` now: a credential its organization's state holds
    /// live, of a root user on what only the root quorum decides (the votes the rules count).
    fn may_vote(&self, activity: &StampedActivity, voter: &pb::CredentialCertificate, now: i64) -> Result<(), Refusal> {
        let loaded = match self.rules.load(&activity.organization_id) {
            Ok(loaded) => loaded,
            Err(EnclaveError::EnclaveStore(e)) => return Err(Refusal::store_failed(e)),
            Err(e) => return Err(Refusal::new(RefusalReason::Unspecified, e.to_string())),
        };
        let live = loaded
            .as_ref()
            .and_then(|l| l.state.live_credential(&voter.user_id, &voter.public_key, &voter.credential_type, now));
        if voter.organization_id != activity.organization_id || live.is_none() {
            return Err(Refusal::new(
                RefusalReason::NotApproved,
                "the vote is not by a credential the organization holds live",
            ));
        }
        // A session of a session profile submits what its scope allows and votes on nothing (its
        // vote would reject, or stand in for its user's counting one).
        if !voter.session_scope.is_empty() {
            return Err(Refusal::new(RefusalReason::NotApproved, "a session of a session profile does not vote"));
        }
        let root_only = coffer_org_rules::subjects::subject(&activity.activity_type).is_some_and(|s| s.root_quorum);
        let root = loaded.as_ref().is_some_and(|l| l.state.organization.root_user_ids.contains(&voter.user_id));
        if root_only && !root {
            return Err(Refusal::new(
                RefusalReason::NotApproved,
                "only a root user votes on what only the root quorum decides",
            ));
        }
        Ok(())
    }

    /// Keeps `stamped`, `voter`'s vote on the waiting `activity` (a rejection if `rejected`), in
    /// the enclave's store until the activity can no longer be voted on: its body and stamp as
    /// they came (bounded by the caller), its certificate as decoded and encoded again (nothing
    /// its MAC does not cover).
    fn keep_vote(
        &self,
        activity: &StampedActivity,
        voter: &pb::CredentialCertificate,
        stamped: &pb::StampedRequest,
        rejected: bool,
        now: i64,
    ) -> Result<(), Refusal> {
        let canonical = pb::StampedRequest {
            body: stamped.body.clone(),
            stamp_header: stamped.stamp_header.clone(),
            stamp: stamped.stamp.clone(),
            certificate: voter.encode_to_vec(),
        };
        let ballot = KeptBallot {
            organization_id: activity.organization_id.clone(),
            fingerprint: activity.fingerprint.clone(),
            user_id: voter.user_id.clone(),
            rejected,
            stamped: canonical.encode_to_vec(),
            at_ms: now,
            expires_ms: activity.timestamp_ms.saturating_add(VOTE_LIFETIME_MS).saturating_add(self.freshness_ms),
        };
        // Each user's first rejection of it stays in the decision log too, as long as the log
        // keeps its lines (what a link of it reads once the ballot expired).
        let rejected_line = DecisionRecord {
            at_ms: now,
            organization_id: activity.organization_id.clone(),
            operation: DECIDE_ACTIVITY.into(),
            fingerprint: activity.fingerprint.clone(),
            activity_type: activity.activity_type.clone(),
            user_id: voter.user_id.clone(),
            outcome: crate::store::OUTCOME_REFUSE.into(),
            reason: crate::store::REASON_VOTE_REJECTED.into(),
            result_digest: String::new(),
        };
        // The submitter's approval is the activity's own stamp, never kept.
        let kept = self.store.keep_ballot(&ballot, MAX_VOTES_LINKED - 1, now, &rejected_line);
        match kept.map_err(Refusal::store_failed)? {
            BallotKept::Kept => Ok(()),
            BallotKept::VotedOtherwise => {
                Err(Refusal::new(RefusalReason::NotApproved, "this user has voted otherwise on the activity"))
            }
            BallotKept::Full => Err(Refusal::new(
                RefusalReason::NotApproved,
                format!(
                    "an activity takes at most {MAX_VOTES_LINKED} votes, and an organization's waiting activities \
                     {MAX_BALLOTS_PER_ORGANIZATION}"
                ),
            )),
            BallotKept::Ran => {
                Err(Refusal::new(RefusalReason::Replayed, "the activity ran: it can no longer be rejected"))
            }
        }
    }

    /// `voter`'s rejection (`vote`, stamped as `stamped`) of the waiting `activity`: kept when
    /// the voter may vote on it ([`Admission::may_vote`]) and the enclave found it waiting and
    /// never allowed it (checked again in the keep's transaction, which a run's spend cannot
    /// pass), and recorded in the decision log. Answered, kept or not, as a refusal:
    /// [`RefusalReason::VoteRejected`] with `evaluation` (the activity's decision as it stood)
    /// once kept.
    fn reject(
        &self,
        activity: &StampedActivity,
        vote: &StampedActivity,
        voter: &pb::CredentialCertificate,
        stamped: &pb::StampedRequest,
        evaluation: String,
        now: i64,
    ) -> Refusal {
        let about = |r: Refusal| r.about(vote, voter);
        if let Err(r) = self.may_vote(activity, voter, now) {
            return about(r);
        }
        let (org, fingerprint) = (&activity.organization_id, &activity.fingerprint);
        match self.store.waited_for_votes(org, fingerprint, &activity.activity_type) {
            Ok(true) => {}
            Ok(false) => {
                return about(Refusal::new(
                    RefusalReason::NotApproved,
                    "the enclave never found this activity waiting for votes",
                ))
            }
            Err(e) => return about(Refusal::store_failed(e)),
        }
        if let Err(r) = self.keep_vote(activity, voter, stamped, true, now) {
            return about(r);
        }
        let mut refused = Refusal::new(RefusalReason::VoteRejected, VOTE_REJECTED);
        refused.attached = Some(Box::new(Attached::Evaluation(evaluation)));
        about(refused)
    }

    /// The top-level organization of `organization` in the enclave's authority state: itself when
    /// it has no parent (or no state), else its parent's, walked up `parent_id`. `loaded` is
    /// `organization`'s state when the caller has it (the decision's). Never the gateway's word:
    /// the parent ids are those the enclave recorded when each sub-organization was created.
    pub fn top_level_id(&self, organization: &str, loaded: Option<Arc<Loaded>>) -> Result<String, StoreError> {
        let load = |id: &str| {
            self.rules.load(id).map_err(|e| match e {
                EnclaveError::EnclaveStore(e) => e,
                other => StoreError::Corrupt(other.to_string()),
            })
        };
        let mut id = organization.to_string();
        let mut state = match loaded {
            Some(l) => Some(l),
            None => load(&id)?,
        };
        for _ in 0..MAX_ORGANIZATION_DEPTH {
            let parent = match state.as_ref().and_then(|l| l.state.organization.parent_id.clone()) {
                Some(p) if !p.is_empty() && p != id => p,
                _ => break,
            };
            state = load(&parent)?;
            id = parent;
        }
        Ok(id)
    }

    /// Records that the body with `fingerprint`, timestamped `timestamp_ms`, was used for
    /// `operation` (remembered until it is stale anyway): `Ok(false)` if it already was, a replay;
    /// busy when the replay window is full of live entries.
    pub fn first_use(&self, operation: &str, fingerprint: &str, timestamp_ms: i64) -> Result<bool, EnclaveError> {
        self.first_use_at(operation, fingerprint, timestamp_ms, now_ms())
    }

    fn first_use_at(
        &self,
        operation: &str,
        fingerprint: &str,
        timestamp_ms: i64,
        now: i64,
    ) -> Result<bool, EnclaveError> {
        let mut key = sha2::Sha256::new();
        key.update(operation.as_bytes());
        key.update([0u8]);
        key.update(fingerprint.as_bytes());
        let key: [u8; 32] = key.finalize().into();
        // Operator calls have a share of the window of their own.
        let expires = timestamp_ms.saturating_add(self.freshness_ms);
        match self.store.remember(OPERATOR_REPLAY_SHARE, key, expires, now)? {
            Remembered::Fresh => Ok(true),
            Remembered::Replayed => Ok(false),
            Remembered::OrganizationQuotaFull | Remembered::WindowFull => {
                Err(EnclaveError::Busy { reason: RefusalReason::ReplayWindowFull, message: BUSY.into() })
            }
            Remembered::Rejected => Err(EnclaveError::Internal(NO_ALLOW_COUNTED.into())),
        }
    }

    /// The share of the replay window a request of `organization` (`loaded`, its state) is
    /// charged to: its top-level organization's, as the enclave's state says (each top-level
    /// organization has its share, and its sub-organizations spend that share, not a share
    /// each). A sign-up's own request (anyone can get one; not its parent's, `via_parent`) is
    /// charged to its lane and to the lane of all its top-level organization's sign-ups as well,
    /// so that neither one visitor nor all of them together hold the whole share.
    fn share_of(&self, organization: &str, via_parent: bool, loaded: Arc<Loaded>) -> Result<ReplayShare, StoreError> {
        let top_level = self.top_level_id(organization, Some(loaded.clone()))?;
        let signup = &loaded.state.organization;
        let lanes = if !via_parent && signup.auth_proxy_signup && signup.parent_id.is_some() {
            vec![
                ReplayLane { scope: format!("replay/signup/{organization}"), quota: self.replay_per_signup },
                ReplayLane { scope: format!("replay/signups-of/{top_level}"), quota: self.replay_all_signups },
            ]
        } else {
            Vec::new()
        };
        Ok(ReplayShare { organization: top_level, lanes })
    }

    /// Whether `ApplyActivity` spent `stamped`'s replay entry, and it is still live (its
    /// change applied, or failed after the spend: either way the apply cannot run again).
    pub fn apply_spent(&self, stamped: &StampedActivity) -> Result<bool, EnclaveError> {
        // No fingerprint is linked under this name: only the replay entry is looked at.
        self.spent_by(APPLY_ACTIVITY, stamped)
    }

    /// The replay entry `ApplyActivity` would spend for `stamped` (a state change), for a link
    /// that states the activity finished otherwise (failed, rejected) to spend in the log's
    /// transaction: of the two, whichever commits second is refused, so a change is never
    /// applied while its log says it was not (the two calls made at once). Charged to the share
    /// the apply would be (a sign-up's lanes included); recorded in the decision log as failed
    /// by `user_id`.
    pub fn apply_spend_of(&self, stamped: &StampedActivity, user_id: &str) -> Result<Spend, EnclaveError> {
        self.spend_of(APPLY_ACTIVITY, stamped, user_id)
    }

    /// Whether `operation`'s replay entry for `stamped` is spent ([`Admission::apply_spent`] for
    /// another operation: a login's, say).
    pub fn spent_by(&self, operation: &str, stamped: &StampedActivity) -> Result<bool, EnclaveError> {
        let key = replay_key_of(operation, &stamped.fingerprint);
        Ok(self.store.spent(key, now_ms(), &stamped.organization_id, "")?)
    }

    /// [`Admission::apply_spend_of`] for `operation` (a login's: linked failed, it collides with
    /// the login's own spend).
    pub fn spend_of(&self, operation: &str, stamped: &StampedActivity, user_id: &str) -> Result<Spend, EnclaveError> {
        let now = now_ms();
        let loaded = self.rules.load(&stamped.organization_id)?.ok_or_else(|| {
            EnclaveError::refused(
                RefusalReason::OrganizationUnknown,
                "the enclave has no authority state for this organization",
            )
        })?;
        Ok(Spend {
            share: self.share_of(&stamped.organization_id, false, loaded)?,
            key: replay_key_of(operation, &stamped.fingerprint),
            expires_ms: now.saturating_add(self.freshness_ms.max(1)),
            now_ms: now,
            allowed: DecisionRecord {
                at_ms: now,
                organization_id: stamped.organization_id.clone(),
                operation: "record_activity".into(),
                fingerprint: stamped.fingerprint.clone(),
                activity_type: stamped.activity_type.clone(),
                user_id: user_id.to_string(),
                outcome: crate::store::OUTCOME_FAILED.into(),
                reason: String::new(),
                result_digest: String::new(),
            },
        })
    }

    /// Whether `timestamp_ms` is within the freshness window of the enclave's clock.
    pub fn is_fresh(&self, timestamp_ms: i64) -> bool {
        (now_ms() - timestamp_ms).abs() <= self.freshness_ms
    }

    fn fresh(&self, activity: &StampedActivity, now: i64) -> Result<(), Refusal> {
        if (now - activity.timestamp_ms).abs() > self.freshness_ms {
            return Err(Refusal::new(
                RefusalReason::Stale,
                format!(
                    "stale or future timestampMs: more than {} s from the enclave's clock",
                    self.freshness_ms / 1000
                ),
            ));
        }
        Ok(())
    }

    /// Verifies one stamped request: a genuine, unexpired certificate, and a stamp over the exact
    /// body by that certificate's key. Whose organization the body may name is the caller's check.
    fn verify_stamped(
        &self,
        req: &pb::StampedRequest,
        now: i64,
        attested: Option<&AttestedIdentity>,
    ) -> Result<(StampedActivity, pb::CredentialCertificate), Refusal> {
        let mut activity =
            StampedActivity::parse(&req.body).map_err(|e| Refusal::new(RefusalReason::StampInvalid, e.message))?;
        use RefusalReason::{CertificateExpired, CertificateInvalid, IdentityInvalid, OperationMismatch, StampInvalid};
        // A verification token's attested stamp has no certificate: the credential stands for
        // the token, which the caller verified with the notarizer key, and names the user the
        // caller found by the token's verified contact in the body's organization.
        let token_login = match attested {
            Some(AttestedIdentity::VerificationToken { credential, .. })
                if req.stamp_header.eq_ignore_ascii_case(attested::HEADER) =>
            {
                Some(credential.clone())
            }
            Some(AttestedIdentity::Invitation { credential }) if req.stamp_header.eq_ignore_ascii_case("x-stamp") => {
                Some(credential.clone())
            }
            _ => None,
        };
        let cert = match token_login {
            Some(c) => c,
            None => {
                let cert = pb::CredentialCertificate::decode(req.certificate.as_slice())
                    .ok()
                    .filter(|c| !c.mac.is_empty())
                    .ok_or_else(|| {
                        Refusal::new(RefusalReason::CertificateInvalid, "the credential has no enclave certificate")
                    })?;
                match self.hsm.certificate_mac_valid(&certificate_mac_input(&cert), &cert.mac) {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(Refusal::new(CertificateInvalid, "the credential's certificate is not genuine")
                            .about(&activity, &cert))
                    }
                    Err(e) => {
                        return Err(Refusal::new(CertificateInvalid, format!("certificate check failed: {e}"))
                            .about(&activity, &cert))
                    }
                }
                cert
            }
        };
        let refuse = |reason: RefusalReason, message: &str| Refusal::new(reason, message).about(&activity, &cert);
        let mut routed_to = None;
        if cert.expires_at_ms != 0 && now >= cert.expires_at_ms as i64 {
            return Err(refuse(CertificateExpired, "the credential has expired"));
        }
        match req.stamp_header.to_ascii_lowercase().as_str() {
            "x-stamp" => {
                let s = stamp::parse(&req.stamp).map_err(|e| refuse(StampInvalid, &e.message))?;
                if s.public_key != cert.public_key || !s.scheme.signs_for(&cert.credential_type) {
                    return Err(refuse(
                        StampInvalid,
                        "the stamp was made by another key than the certified credential",
                    ));
                }
                stamp::verify(&s, &req.body).map_err(|e| refuse(StampInvalid, &e.message))?;
                if !coffer_auth::grants::credential_may_submit(&cert.credential_type, &activity.activity_type) {
                    return Err(refuse(OperationMismatch, "a recovery credential may only submit recover_user"));
                }
            }
            "x-stamp-webauthn" => {
                let s = webauthn::parse_stamp(&req.stamp, &req.body).map_err(|e| refuse(StampInvalid, &e.message))?;
                if cert.credential_type != webauthn::CREDENTIAL_TYPE {
                    return Err(refuse(StampInvalid, "a passkey stamp names a credential that is not a passkey"));
                }
                webauthn::verify_assertion(&s, &cert.public_key).map_err(|e| refuse(StampInvalid, &e.message))?;
            }
            "x-stamp-attested" => {
                // A key attested by a token: only to log in, as the user whose certified OAuth
                // identity the OIDC token names, or whose verified contact the verification token
                // does (both tokens verified by the caller).
                let s = attested::parse(&req.stamp).map_err(|e| refuse(StampInvalid, &e.message))?;
                if activity.activity_type != ATTESTED_LOGIN {
                    return Err(refuse(OperationMismatch, "an attested stamp authorizes only stamp_login"));
                }
                match (s.attestation, attested) {
                    (attested::Attestation::Oidc, Some(AttestedIdentity::Oidc(claims))) => {
                        if cert.credential_type != coffer_auth::grants::OAUTH_PROVIDER
                            || cert.public_key
                                != coffer_auth::oidc::identity_hash(&claims.iss, &claims.sub, &claims.aud)
                        {
                            return Err(refuse(
                                IdentityInvalid,
                                "the attested token is not the certified OAuth identity",
                            ));
                        }
                        attested::check_binding(&s, claims).map_err(|e| refuse(StampInvalid, &e.message))?;
                    }
                    (
                        attested::Attestation::VerificationToken,
                        Some(AttestedIdentity::VerificationToken { token, .. }),
                    ) => {
                        if cert.credential_type != coffer_auth::grants::VERIFICATION_TOKEN
                            || cert.public_key != token.public_key
                        {
                            return Err(refuse(IdentityInvalid, "the attested token is not the verified one"));
                        }
                        attested::check_token_binding(&s, &token.public_key)
                            .map_err(|e| refuse(StampInvalid, &e.message))?;
                        // Stamped for the token's organization, routed to the sub-organization of
                        // the user (`otp::token_login_identity` checked it): the login is that
                        // organization's from here on.
                        routed_to = Some(cert.organization_id.clone());
                    }
                    _ => return Err(refuse(OperationMismatch, "an attested stamp authorizes only a login")),
                }
                attested::verify_signature(&s, &req.body).map_err(|e| refuse(StampInvalid, &e.message))?;
            }
            _ => return Err(refuse(StampInvalid, "no stamp")),
        }
        let attested_type = [coffer_auth::grants::OAUTH_PROVIDER, coffer_auth::grants::VERIFICATION_TOKEN]
            .contains(&cert.credential_type.as_str());
        if attested_type && !req.stamp_header.eq_ignore_ascii_case(attested::HEADER) {
            return Err(refuse(
                StampInvalid,
                "an OAuth identity or a verification token authorizes only an attested stamp",
            ));
        }
        if let Some(organization_id) = routed_to {
            activity.organization_id = organization_id;
        }
        Ok((activity, cert))
    }
}

/// What the caller verified of an attested stamp's token, for [`Admission::authorize_for`].
pub enum AttestedIdentity {
    /// An OIDC token's claims (its signature is verified after authorization: `sessions`).
    Oidc(Claims),
    /// A verification token, verified with the notarizer key, and the credential that stands for
    /// it: the user of the body's organization with the token's verified contact, of type
    /// `coffer_auth::grants::VERIFICATION_TOKEN`, never certified.
    VerificationToken { token: coffer_auth::verification_token::VerifiedToken, credential: pb::CredentialCertificate },
    /// The key an invitation's acceptance brings, its code checked
    /// (`service::invitations::acceptance_identity`): the credential stands for the invitation,
    /// of type `coffer_auth::grants::INVITATION_ACCEPTANCE`, never certified, for the user the
    /// acceptance makes; it authorizes an `X-Stamp` of that key.
    Invitation { credential: pb::CredentialCertificate },
}

/// Most parents [`Admission::top_level_id`] walks up (a sub-organization's own sub-organizations,
/// and a bound should a state ever name a cycle).
const MAX_ORGANIZATION_DEPTH: usize = 16;
/// An activity waiting for votes.
const ACTIVITY_CONSENSUS_NEEDED: &str = "ACTIVITY_STATUS_CONSENSUS_NEEDED";
/// The replay window's share of operator calls (bootstrap), apart from every organization's.
const OPERATOR_REPLAY_SHARE: &str = "coffer:operator";
/// The one activity an attested stamp may submit.
const ATTESTED_LOGIN: &str = "ACTIVITY_TYPE_STAMP_LOGIN";

/// A verified stamp's credential as a vote the rules count.
fn verified_vote(c: &pb::CredentialCertificate, at_ms: i64) -> VerifiedVote {
    VerifiedVote {
        user_id: c.user_id.clone(),
        public_key: c.public_key.clone(),
        credential_type: c.credential_type.clone(),
        session_scope: c.session_scope.clone(),
        at_ms,
    }
}

/// Refuses an authorized request whose sealed material does not match its stamped body (the
/// wrong wallet, key or account), with the same audit line as every other refusal.
/// Writes the `refuse` audit line of a refusal made before any decision (the identity an
/// attested stamp claims does not hold), as [`refuse`] does for one made after: every refusal of
/// the enclave is audited with its typed reason. Other errors pass through unlogged.
pub fn audit_early_refusal(operation: &str, e: EnclaveError) -> EnclaveError {
    if let EnclaveError::Refused { reason, message, .. } = &e {
        Refusal::new(*reason, message.clone()).audit(operation);
    }
    e
}

pub fn refuse(a: &Admitted, reason: RefusalReason, message: &str) -> EnclaveError {
    refused_by(a, Refusal::new(reason, message))
}

/// [`refuse`] with the refusal made already (one of the rules, carrying its outcomes).
fn refused_by(a: &Admitted, refusal: Refusal) -> EnclaveError {
    let refusal = refusal.about(&a.activity, &a.credential);
    refusal.audit(a.operation);
    a.decisions.refused(a, refusal.reason);
    refusal.into_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link_request::ACTIVITY_COMPLETED;

    /// A tenant's flood of authorizations once made the map start over, forgetting another
    /// tenant's submission authorized a moment before (its attested login then unlinkable on any
    /// other enclave); the latest half are always kept.
    #[test]
    fn a_flood_of_authorizations_never_forgets_the_latest() {
        let submission = |n: usize| DecidedSubmission {
            organization_id: format!("o{n}"),
            activity_type: String::new(),
            user_id: String::new(),
            public_key: String::new(),
            result_digest: String::new(),
        };
        let mut lately = AuthorizedLately::default();
        for n in 0..AUTHORIZED_LATELY - 1 {
            lately.insert(format!("flood-{n}"), submission(n));
        }
        lately.insert("legit".into(), submission(0));
        for n in 0..AUTHORIZED_LATELY / 4 {
            lately.insert(format!("more-{n}"), submission(n));
        }
        assert!(lately.remove("legit").is_some());
        assert!(lately.remove("legit").is_none(), "forgotten once asked");
        assert!(lately.newer.len() + lately.older.len() <= AUTHORIZED_LATELY);
    }

    #[test]
    fn busy_or_refused_is_decided_on_the_reason_type() {
        let busy = Refusal::new(RefusalReason::ReplayWindowFull, "any words").into_error();
        assert!(matches!(busy, EnclaveError::Busy { reason: RefusalReason::ReplayWindowFull, .. }), "{busy:?}");
        let quota = Refusal::new(RefusalReason::OrganizationReplayQuota, "any words").into_error();
        assert!(
            matches!(quota, EnclaveError::Busy { reason: RefusalReason::OrganizationReplayQuota, .. }),
            "{quota:?}"
        );
        let failed = Refusal::store_failed(StoreError::Unavailable("down".into())).into_error();
        assert!(matches!(failed, EnclaveError::EnclaveStore(StoreError::Unavailable(_))), "{failed:?}");
        // The busy wording alone no longer decides anything.
        let refused = Refusal::new(RefusalReason::Replayed, BUSY).into_error();
        assert!(matches!(refused, EnclaveError::Refused { reason: RefusalReason::Replayed, .. }), "{refused:?}");
        assert_eq!(refused.to_string(), format!("enclave refused: {BUSY}"));
    }

    #[test]
    fn sub_organizations_are_charged_to_their_top_level_organization() {
        use coffer_org_rules::model::Organization;
        use coffer_org_rules::{Change, Effect};
        let admission = Admission::in_memory(crate::hsm::tests::hsm(), 300_000, 16).unwrap();
        for (id, parent) in [("top", None), ("sub", Some("top")), ("subsub", Some("sub")), ("orphan", Some("gone"))] {
            let organization = Organization {
                id: id.into(),
                name: id.into(),
                parent_id: parent.map(Into::into),
                ..Default::default()
            };
            let create = Change { organization_id: id.into(), effect: Effect::CreateOrganization { organization } };
            assert!(admission.rules().import(id, &[create]).unwrap(), "{id}");
        }
        let top = |id: &str| admission.top_level_id(id, None).unwrap();
        assert_eq!(top("top"), "top");
        assert_eq!(top("sub"), "top");
        assert_eq!(top("subsub"), "top", "walked up every parent");
        // A parent the enclave has no state of is the top it knows; an organization it has no
        // state of is its own.
        assert_eq!(top("orphan"), "gone");
        assert_eq!(top("unknown"), "unknown");
        // The state the caller already read is where the walk starts.
        let sub = admission.rules().load("sub").unwrap();
        assert_eq!(admission.top_level_id("sub", sub).unwrap(), "top");
    }

    #[test]
    fn certificate_mac_input_binds_every_field() {
        let base = pb::CredentialCertificate {
            organization_id: "o".into(),
            user_id: "u".into(),
            credential_type: "t".into(),
            public_key: "02".into(),
            expires_at_ms: 5,
            issuing_fingerprint: "f".into(),
            mac: vec![1],
            session_scope: String::new(),
        };
        let input = certificate_mac_input(&base);
        let variants = [
            pb::CredentialCertificate { organization_id: "o2".into(), ..base.clone() },
            pb::CredentialCertificate { user_id: "u2".into(), ..base.clone() },
            pb::CredentialCertificate { credential_type: "t2".into(), ..base.clone() },
            pb::CredentialCertificate { public_key: "03".into(), ..base.clone() },
            pb::CredentialCertificate { expires_at_ms: 6, ..base.clone() },
            pb::CredentialCertificate { issuing_fingerprint: "g".into(), ..base.clone() },
            pb::CredentialCertificate { session_scope: "true".into(), ..base.clone() },
        ];
        for v in variants {
            assert_ne!(certificate_mac_input(&v), input, "{v:?}");
        }
        assert_eq!(certificate_mac_input(&pb::CredentialCertificate { mac: vec![2], ..base }), input);
    }

    #[test]
    fn webhook_messages_need_the_enclaves_now_a_plain_event_id_and_an_activity_it_witnessed() {
        use coffer_org_rules::model::Organization;
        use coffer_org_rules::{Change, Effect};
        let admission = Admission::in_memory(crate::hsm::tests::hsm(), 300_000, 16).unwrap();
        let organization = Organization { id: "o1".into(), name: "o1".into(), ..Default::default() };
        let create = Change { organization_id: "o1".into(), effect: Effect::CreateOrganization { organization } };
        assert!(admission.rules().import("o1", &[create]).unwrap());
        let completed = |result: &str| {
            let a = serde_json::json!({
                "id": "a1", "organizationId": "o1", "status": ACTIVITY_COMPLETED, "fingerprint": "sha256:f1",
                "result": result,
            });
            serde_json::to_vec(&a).unwrap()
        };
        let body = completed("0xreal");
        let now = now_ms() as u64;
        let refusal = |ts: u64, event: &str, body: &[u8]| match admission.webhook_message("kid", ts, event, body) {
            Err(EnclaveError::Refused { reason, message, .. }) => (reason, message),
            other => panic!("{other:?}"),
        };
        // A completed activity the log never linked (a forged event) is not signed...
        let (reason, message) = refusal(now, "evt-1:a1", &body);
        assert!(reason == RefusalReason::DeliveryInvalid && message.contains("log does not have"), "{message}");
        // ...one it linked is, as linked.
        let activity: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let entry = crate::activity_log::Entry {
            organization_id: "o1".into(),
            activity_id: "a1".into(),
            fingerprint: "sha256:f1".into(),
            activity_type: "ACTIVITY_TYPE_SIGN_TRANSACTION_V2".into(),
            status: ACTIVITY_COMPLETED.into(),
            activity_digest: coffer_auth::proof::activity_digest(&activity),
            spend: None,
        };
        let (log, store) = admission.activity_log();
        let unsigned = |_: &coffer_auth::proof::LogLink, _: bool| Ok(pb::AppProof::default());
        log.append(store, entry, &unsigned).unwrap();
        let message = admission.webhook_message("kid", now, "evt-1:a1", &body).unwrap();
        assert_eq!(message, [format!("v1.ed25519.kid.{now}.evt-1:a1.").as_bytes(), body.as_slice()].concat());
        // Issue 40, E7: the linked activity with another result, relabelled failed, or under
        // another id; a status-less one; one of an organization the enclave does not have.
        // And the linked activity spelled otherwise (what a consumer's parser reads may then not be
        // what was checked): a repeated member first, whitespace, keys out of order; viewer
        // members that are no booleans.
        let text = String::from_utf8(body.clone()).unwrap();
        let forgeries: [(Vec<u8>, &str); 9] = [
            (completed("0xmadeup"), "is not the one"),
            (text.replace("COMPLETED", "FAILED").into_bytes(), "does not have"),
            (text.replace(r#""id":"a1""#, r#""id":"a2""#).into_bytes(), "is not the one"),
            (br#"{"fingerprint":"sha256:f1","id":"a1","organizationId":"o1"}"#.to_vec(), "has a status"),
            (
                br#"{"id":"a1","organizationId":"o9","status":"ACTIVITY_STATUS_CONSENSUS_NEEDED"}"#.to_vec(),
                "does not have",
            ),
            (text.replacen('{', r#"{"result":"0xmadeup","#, 1).into_bytes(), "not an activity"),
            (text.replace(',', ", ").into_bytes(), "not an activity"),
            (
                br#"{"organizationId":"o1","id":"a3","status":"ACTIVITY_STATUS_CONSENSUS_NEEDED"}"#.to_vec(),
                "not an activity",
            ),
            (text.replacen('{', r#"{"canApprove":{"say":"approved"},"#, 1).into_bytes(), "true or false"),
        ];
        for (forged, why) in forgeries {
            let (reason, message) = refusal(now, "evt-2:a1", &forged);
            assert!(reason == RefusalReason::DeliveryInvalid && message.contains(why), "{why}: {message}");
        }
        // Waiting for votes: not in the log. Its organization is checked, and its id is the one its
        // fingerprint derives; and it is signed only once the enclave found it waiting (every
        // activity the policies decide, a sub-organization's creation as a signature).
        let waiting_activity = |fingerprint: &str, id: &str, ty: &str| {
            serde_json::to_vec(&serde_json::json!({"id": id, "organizationId": "o1", "fingerprint": fingerprint,
                "type": ty, "status": ACTIVITY_CONSENSUS_NEEDED}))
            .unwrap()
        };
        let derived = |fingerprint: &str| derived_id(fingerprint, ACTIVITY_ID, 0);
        let waiting = waiting_activity("sha256:w", &derived("sha256:w"), "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8");
        let (reason, message) = refusal(now, "evt-3:a3", &waiting);
        assert!(reason == RefusalReason::DeliveryInvalid && message.contains("waiting"), "{message}");
        let (reason, message) =
            refusal(now, "evt-3:a4", &waiting_activity("sha256:w", "a4", "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8"));
        assert!(reason == RefusalReason::DeliveryInvalid && message.contains("derives"), "{message}");
        let signing = waiting_activity("sha256:w2", &derived("sha256:w2"), "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2");
        let (reason, message) = refusal(now, "evt-3:a5", &signing);
        assert!(reason == RefusalReason::DeliveryInvalid && message.contains("waiting"), "{message}");
        use crate::store::REASON_CONSENSUS_NEEDED;
        assert_eq!(REASON_CONSENSUS_NEEDED, RefusalReason::ConsensusNeeded.as_str_name());
        let waited = DecisionRecord {
            organization_id: "o1".into(),
            fingerprint: "sha256:w2".into(),
            outcome: crate::store::OUTCOME_REFUSE.into(),
            reason: REASON_CONSENSUS_NEEDED.into(),
            activity_type: "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2".into(),
            ..Default::default()
        };
        store.record_decision(&waited).unwrap();
        assert!(admission.webhook_message("kid", now, "evt-3:a5", &signing).is_ok(), "found waiting");
        let as_another_type = waiting_activity("sha256:w2", &derived("sha256:w2"), "ACTIVITY_TYPE_CREATE_POLICY_V3");
        let (reason, message) = refusal(now, "evt-3:a6", &as_another_type);
        assert!(reason == RefusalReason::DeliveryInvalid && message.contains("waiting"), "{message}");
        let sub_organization = "ACTIVITY_TYPE_CREATE_SUB_ORGANIZATION_V8".to_string();
        let waited_too = DecisionRecord { fingerprint: "sha256:w".into(), activity_type: sub_organization, ..waited };
        store.record_decision(&waited_too).unwrap();
        assert!(admission.webhook_message("kid", now, "evt-3:a3", &waiting).is_ok(), "found waiting");
        let body = waiting.as_slice();
        let refused = |ts: u64, event: &str, body: &[u8]| match admission.webhook_message("kid", ts, event, body) {
            Err(EnclaveError::Refused { reason, message, .. }) => (reason, message),
            other => panic!("{other:?}"),
        };
        use RefusalReason::{DeliveryInvalid, Stale};
        assert_eq!(refused(now + 301_000, "e", body).0, Stale, "a delivery signed ahead of time");
        assert_eq!(refused(now - 301_000, "e", body).0, Stale);
        for event in ["", "e.v\nX-Injected: 1", &"e".repeat(129)] {
            let (reason, message) = refused(now, event, body);
            assert!(reason == DeliveryInvalid && message.contains("event id"), "{event:?}: {message}");
        }
        for (body, why) in [
            (b"not json".as_slice(), "not json"),
            (br#"{"id":"a1"}"#, "no organizationId"),
            (br#"["a1","o1"]"#, "an array is not an activity"),
            (br#"{"id":1,"organizationId":"o1"}"#, "a numeric id"),
            (br#"{"id":"a1","organizationId":"o1"} trailing"#, "trailing bytes"),
        ] {
            let (reason, message) = refused(now, "e", body);
            assert!(reason == DeliveryInvalid && message.contains("not an activity"), "{why}: {message}");
        }
    }
}
