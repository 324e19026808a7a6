//! A SQL backend (how to reach its connections) and the `Store` every backend gets from the
//! shared SQL in [`super::sql`].

use std::sync::{mpsc, Mutex};

use super::error::StoreError;
use super::interface::{CommitCallback, Store};
use super::model::{
    ActivityFilter, ActivityRecord, ApiKey, AuthenticatorRecord, Committed, DueSkip, EmailEventRecord, ImportTarget,
    LogEntry, Named, Nanos, OauthProviderRecord, Organization, Page, PolicyEvaluationRecord, PrivateKey, Record,
    SealedBlobTable, StampContext, StoredBlob, SubOrgFilter, UncertifiedCredential, User, Wallet, WalletAccount,
    WebhookAttempt, WebhookDelivery,
};
use super::nowait;
use super::sql::{self, Dialect};
use super::write::Write;

/// One activity waiting for the committer, and where to send its outcome.
pub struct CommitJob {
    pub activity: ActivityRecord,
    pub writes: Vec<Write>,
    pub reply: CommitCallback,
}

/// Takes every job waiting (up to `max`) after the first into one batch.
pub fn gather(first: CommitJob, jobs: &mpsc::Receiver<CommitJob>, max: usize) -> Vec<CommitJob> {
    let mut batch = vec![first];
    while batch.len() < max {
        match jobs.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    batch
}

/// Commits a batch with the shared SQL, records the metrics, and answers every job.
pub fn commit_and_reply<D: Dialect>(db: Result<&mut D, StoreError>, batch: Vec<CommitJob>) {
    let results = match db {
        Ok(db) => {
            let started = std::time::Instant::now();
            let jobs: Vec<(&ActivityRecord, &[Write])> = batch.iter().map(|j| (&j.activity, &j.writes[..])).collect();
            let results = sql::commit_batch(db, &jobs);
            let m = crate::metrics::metrics();
            m.commit_seconds.observe(started.elapsed().as_secs_f64());
            m.commit_batch.observe(batch.len() as f64);
            results
        }
        Err(e) => batch.iter().map(|_| Err(StoreError::Backend(e.to_string()))).collect(),
    };
    for (job, result) in batch.into_iter().zip(results) {
        (job.reply)(result);
    }
}

/// Where activities wait for a backend's committer thread.
pub struct CommitQueue(Mutex<mpsc::Sender<CommitJob>>);

impl CommitQueue {
    pub fn new(sender: mpsc::Sender<CommitJob>) -> Self {
        Self(Mutex::new(sender))
    }

    /// Queues an activity; `done` hears the outcome (at once, if the committer is gone).
    pub fn send(&self, activity: ActivityRecord, writes: Vec<Write>, done: CommitCallback) {
        let queue = match self.0.lock() {
            Ok(q) => q,
            Err(_) => return done(Err(StoreError::Backend("commit queue lock poisoned".into()))),
        };
        if let Err(mpsc::SendError(job)) = queue.send(CommitJob { activity, writes, reply: done }) {
            (job.reply)(Err(StoreError::Backend("committer thread stopped".into())));
        }
    }
}

/// What a backend provides: connections for reads and for write transactions, a committer for
/// activities, and what has no portable SQL.
pub trait Backend: Send + Sync + 'static {
    type Db: Dialect;
    /// Runs a read (possibly more than once: reads are retried on transient errors).
    fn read<T: Send>(&self, f: impl FnMut(&mut Self::Db) -> Result<T, StoreError> + Send) -> Result<T, StoreError>;
    /// Runs `f` in a write transaction, committed if it succeeds.
    fn write<T: Send>(&self, f: impl FnOnce(&mut Self::Db) -> Result<T, StoreError> + Send) -> Result<T, StoreError>;
    /// Queues an activity for the group committer ([`sql::commit_batch`]).
    fn commit_then(&self, activity: ActivityRecord, writes: Vec<Write>, done: CommitCallback);
    /// See [`Store::purge_deleted_data`].
    fn purge_deleted_data(&self) -> Result<bool, StoreError>;
}

impl<B: Backend> Store for B {
    fn commit(&self, a: &ActivityRecord, writes: &[Write]) -> Result<Committed, StoreError> {
        if nowait::active() {
            return Err(nowait::give_up());
        }
        let (reply, outcome) = std::sync::mpsc::sync_channel(1);
        Backend::commit_then(
            self,
            a.clone(),
            writes.to_vec(),
            Box::new(move |r| {
                let _ = reply.send(r);
            }),
        );
        outcome.recv().map_err(|_| StoreError::Backend("committer thread stopped".into()))?
    }
    fn commit_then(&self, activity: ActivityRecord, writes: Vec<Write>, done: CommitCallback) {
        Backend::commit_then(self, activity, writes, done)
    }
    fn apply(&self, writes: &[Write]) -> Result<(), StoreError> {
        self.write(|db| writes.iter().try_for_each(|w| sql::apply_write(db, w)))
    }
    fn organization(&self, id: &str) -> Result<Organization, StoreError> {
        self.read(|db| sql::organization(db, id))
    }
    fn deleted_organization(&self, id: &str) -> Result<Organization, StoreError> {
        self.read(|db| sql::deleted_organization(db, id))
    }
    fn api_key_by_public_key(&self, org: &str, public_key: &str) -> Result<ApiKey, StoreError> {
        self.read(|db| sql::api_key_by_public_key(db, org, public_key))
    }
    fn stamp_context(
        &self,
        org: &str,
        public_key: &str,
        fingerprint: Option<&str>,
        record_kind: &str,
    ) -> Result<StampContext, StoreError> {
        self.read(|db| sql::stamp_context(db, org, public_key, fingerprint, record_kind))
    }
    fn user(&self, org: &str, id: &str) -> Result<User, StoreError> {
        self.read(|db| sql::user(db, org, id))
    }
    fn names_in_use(&self, org: &str, kind: Named, names: &[&str]) -> Result<Vec<String>, StoreError> {
        self.read(|db| sql::names_in_use(db, org, kind, names))
    }
    fn users_page(&self, org: &str, page: &Page) -> Result<Vec<User>, StoreError> {
        self.read(|db| sql::users_page(db, org, page))
    }
    fn api_keys_of_user(&self, org: &str, user_id: &str) -> Result<Vec<ApiKey>, StoreError> {
        self.read(|db| sql::api_keys_of_user(db, org, user_id))
    }
    fn wallet(&self, org: &str, id: &str) -> Result<Wallet, StoreError> {
        self.read(|db| sql::wallet(db, org, id))
    }
    fn wallets_page(&self, org: &str, page: &Page) -> Result<Vec<Wallet>, StoreError> {
        self.read(|db| sql::wallets_page(db, org, page))
    }
    fn accounts_page(&self, org: &str, wallet_id: Option<&str>, page: &Page) -> Result<Vec<WalletAccount>, StoreError> {
        self.read(|db| sql::accounts_page(db, org, wallet_id, page))
    }
    fn account_by_address(&self, org: &str, address: &str) -> Result<WalletAccount, StoreError> {
        self.read(|db| sql::account_by_address(db, org, address))
    }
    fn account_key_left(&self, org: &str, id: &str) -> Result<bool, StoreError> {
        self.read(|db| sql::account_key_left(db, org, id))
    }
    fn private_key(&self, org: &str, id: &str) -> Result<PrivateKey, StoreError> {
        self.read(|db| sql::private_key(db, org, id))
    }
    fn private_keys_page(&self, org: &str, page: &Page) -> Result<Vec<PrivateKey>, StoreError> {
        self.read(|db| sql::private_keys_page(db, org, page))
    }
    fn private_key_by_address(&self, org: &str, address: &str) -> Result<PrivateKey, StoreError> {
        self.read(|db| sql::private_key_by_address(db, org, address))
    }
    fn sealed_blobs_page(
        &self,
        table: SealedBlobTable,
        after: &str,
        limit: usize,
    ) -> Result<Vec<StoredBlob>, StoreError> {
        self.read(|db| sql::sealed_blobs_page(db, table, after, limit))
    }
    fn replace_sealed_blob(&self, stored: &StoredBlob, new: &[u8]) -> Result<bool, StoreError> {
        self.write(|db| sql::replace_sealed_blob(db, stored, new))
    }
    fn import_target(&self, org: &str, user_id: &str) -> Result<ImportTarget, StoreError> {
        self.read(|db| sql::import_target(db, org, user_id))
    }
    fn activity(&self, org: &str, id: &str) -> Result<ActivityRecord, StoreError> {
        self.read(|db| sql::activity(db, org, id))
    }
    fn activity_by_fingerprint(&self, fingerprint: &str) -> Result<ActivityRecord, StoreError> {
        self.read(|db| sql::activity_by_fingerprint(db, fingerprint))
    }
    fn activities(&self, org: &str, filter: &ActivityFilter) -> Result<Vec<ActivityRecord>, StoreError> {
        self.read(|db| sql::activities(db, org, filter))
    }
    fn activity_log(&self, org: &str, after: u64, limit: usize) -> Result<Vec<LogEntry>, StoreError> {
        self.read(|db| sql::log_page(db, org, after, limit))
    }
    fn unlogged_activities(&self, org: &str, limit: usize) -> Result<Vec<ActivityRecord>, StoreError> {
        self.read(|db| sql::unlogged(db, org, limit))
    }
    fn record(&self, org: &str, kind: &str, id: &str) -> Result<Record, StoreError> {
        self.read(|db| sql::record(db, org, kind, id))
    }
    fn records_of_kind(&self, kind: &str) -> Result<Vec<Record>, StoreError> {
        self.read(|db| sql::records_of_kind(db, kind))
    }
    fn record_by_id(&self, kind: &str, id: &str) -> Result<Record, StoreError> {
        self.read(|db| sql::record_by_id(db, kind, id))
    }
    fn records_page(&self, org: &str, kind: &str, page: &Page) -> Result<Vec<Record>, StoreError> {
        self.read(|db| sql::records_page(db, org, kind, page))
    }
    fn records_version(&self, org: &str, kind: &str) -> Result<(i64, i64), StoreError> {
        self.read(|db| sql::records_version(db, org, kind))
    }
    fn email_events_page(
        &self,
        org: &str,
        to: &str,
        event_type: Option<&str>,
        page: &Page,
    ) -> Result<Vec<EmailEventRecord>, StoreError> {
        self.read(|db| sql::email_events::page(db, org, to, event_type, page))
    }
    fn ping(&self) -> Result<(), StoreError> {
        self.read(sql::ping)
    }
    fn api_key(&self, org: &str, id: &str) -> Result<ApiKey, StoreError> {
        self.read(|db| sql::api_key(db, org, id))
    }
    fn api_keys_page(&self, org: &str, page: &Page) -> Result<Vec<ApiKey>, StoreError> {
        self.read(|db| sql::api_keys_page(db, org, page))
    }
    fn uncertified_credentials(&self) -> Result<Vec<UncertifiedCredential>, StoreError> {
        self.read(sql::uncertified_credentials)
    }
    fn user_tag_members(&self, org: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.read(|db| sql::user_tag_members(db, org))
    }
    fn user_tags_of(&self, org: &str, user_id: &str) -> Result<Vec<String>, StoreError> {
        self.read(|db| sql::user_tags_of(db, org, user_id))
    }
    fn authenticator(&self, org: &str, id: &str) -> Result<AuthenticatorRecord, StoreError> {
        self.read(|db| sql::authenticator(db, org, id))
    }
    fn authenticator_by_credential_id(
        &self,
        org: &str,
        credential_id: &str,
    ) -> Result<AuthenticatorRecord, StoreError> {
        self.read(|db| sql::authenticator_by_credential_id(db, org, credential_id))
    }
    fn authenticators_of_user(&self, org: &str, user_id: &str) -> Result<Vec<AuthenticatorRecord>, StoreError> {
        self.read(|db| sql::authenticators_of_user(db, org, user_id))
    }
    fn oauth_providers(&self, org: &str, user_id: Option<&str>) -> Result<Vec<OauthProviderRecord>, StoreError> {
        self.read(|db| sql::oauth_providers(db, org, user_id))
    }
    fn sub_organization_ids(
        &self,
        parent: &str,
        filter: &SubOrgFilter,
        page: &Page,
    ) -> Result<Vec<String>, StoreError> {
        self.read(|db| sql::sub_organization_ids(db, parent, filter, page))
    }
    fn organization_footprint(&self, org: &str) -> Result<Vec<(String, i64)>, StoreError> {
        self.read(|db| sql::organization_footprint(db, org))
    }
    fn purge_deleted_data(&self) -> Result<bool, StoreError> {
        Backend::purge_deleted_data(self)
    }
    fn policy_evaluations(&self, org: &str, activity_id: &str) -> Result<Vec<PolicyEvaluationRecord>, StoreError> {
        self.read(|db| sql::policy_evaluations(db, org, activity_id))
    }
    fn idempotency_key(&self, org: &str, key: &str) -> Result<(String, String), StoreError> {
        self.read(|db| sql::idempotency_key(db, org, key))
    }
    fn claim_due_webhook_deliveries(
        &self,
        now: Nanos,
        lease: (Nanos, &str),
        limit: usize,
        skip: &DueSkip,
    ) -> Result<Vec<WebhookDelivery>, StoreError> {
        if !self.read(|db| sql::any_due_webhook_delivery(db, now, skip))? {
            return Ok(Vec::new());
        }
        self.write(|db| sql::claim_due_webhook_deliveries(db, now, lease, limit, skip))
    }
    fn renew_webhook_leases(&self, ids: &[String], lease: (Nanos, &str)) -> Result<Vec<String>, StoreError> {
        self.write(|db| sql::renew_webhook_leases(db, ids, lease))
    }
    fn release_webhook_leases(&self, now: Nanos, owner: &str) -> Result<usize, StoreError> {
        self.write(|db| sql::release_webhook_leases(db, now, owner))
    }
    fn record_webhook_attempts(&self, attempts: &[(String, WebhookAttempt)]) -> Result<(), StoreError> {
        self.write(|db| sql::record_webhook_attempts(db, attempts))
    }
    fn webhook_deliveries(
        &self,
        org: &str,
        endpoint_id: &str,
        limit: usize,
    ) -> Result<Vec<WebhookDelivery>, StoreError> {
        self.read(|db| sql::webhook_deliveries(db, org, endpoint_id, limit))
    }
}
