//! The `Store` trait: what the gateway asks of its storage, whatever the backend.

use super::error::StoreError;
use super::model::{
    ActivityFilter, ActivityRecord, ApiKey, AuthenticatorRecord, Committed, DueSkip, EmailEventRecord, ImportTarget,
    LogEntry, Named, Nanos, OauthProviderRecord, Organization, Page, PolicyEvaluationRecord, PrivateKey, Record,
    SealedBlobTable, StampContext, StoredBlob, SubOrgFilter, UncertifiedCredential, User, Wallet, WalletAccount,
    WebhookAttempt, WebhookDelivery,
};
use super::write::Write;

/// Receives the outcome of [`Store::commit_then`].
pub type CommitCallback = Box<dyn FnOnce(Result<Committed, StoreError>) + Send>;

/// The storage the gateway needs. Implementations must make `commit` atomic.
pub trait Store: Send + Sync + 'static {
    fn commit(&self, activity: &ActivityRecord, writes: &[Write]) -> Result<Committed, StoreError>;
    /// Like `commit`, but hands the outcome to `done`, possibly on another thread, so an async
    /// caller need not park a thread while a commit (and its fsync) is under way. The default
    /// commits synchronously; a backend with its own committer overrides it.
    fn commit_then(&self, activity: ActivityRecord, writes: Vec<Write>, done: CommitCallback) {
        done(self.commit(&activity, &writes))
    }
    /// Applies writes outside any activity (operator CLI: `init-org`).
    fn apply(&self, writes: &[Write]) -> Result<(), StoreError>;

    /// A live organization (a deleted sub-organization is not found).
    fn organization(&self, id: &str) -> Result<Organization, StoreError>;
    /// A deleted sub-organization's tombstone, whose activity history its parent can still read.
    fn deleted_organization(&self, id: &str) -> Result<Organization, StoreError>;
    fn api_key_by_public_key(&self, organization_id: &str, public_key: &str) -> Result<ApiKey, StoreError>;
    /// The live organization, the API key with `public_key` in it or in its parent, the key's
    /// user, whether `fingerprint` names an activity and whether the organization or its parent
    /// has a record of `record_kind`, in one statement. Not found when the organization or the key
    /// is not (the separate lookups tell which).
    fn stamp_context(
        &self,
        organization_id: &str,
        public_key: &str,
        fingerprint: Option<&str>,
        record_kind: &str,
    ) -> Result<StampContext, StoreError>;
    fn user(&self, organization_id: &str, id: &str) -> Result<User, StoreError>;
    /// Which of `names` a wallet or private key of the organization already has (one indexed
    /// lookup each).
    fn names_in_use(&self, organization_id: &str, kind: Named, names: &[&str]) -> Result<Vec<String>, StoreError>;
    /// Users oldest first, one page.
    fn users_page(&self, organization_id: &str, page: &Page) -> Result<Vec<User>, StoreError>;
    fn users(&self, organization_id: &str) -> Result<Vec<User>, StoreError> {
        self.users_page(organization_id, &Page::ALL)
    }
    fn api_keys_of_user(&self, organization_id: &str, user_id: &str) -> Result<Vec<ApiKey>, StoreError>;

    /// Up to `limit` blobs the enclave sealed that `table` keeps, after the key `after` (`""`:
    /// from the first), in key order.
    fn sealed_blobs_page(
        &self,
        table: SealedBlobTable,
        after: &str,
        limit: usize,
    ) -> Result<Vec<StoredBlob>, StoreError>;
    /// Replaces `stored`'s blob by `new` if its row still holds the blob it was read with.
    fn replace_sealed_blob(&self, stored: &StoredBlob, new: &[u8]) -> Result<bool, StoreError>;

    fn wallet(&self, organization_id: &str, id: &str) -> Result<Wallet, StoreError>;
    /// Wallets oldest first, one page.
    fn wallets_page(&self, organization_id: &str, page: &Page) -> Result<Vec<Wallet>, StoreError>;
    fn wallets(&self, organization_id: &str) -> Result<Vec<Wallet>, StoreError> {
        self.wallets_page(organization_id, &Page::ALL)
    }
    /// Accounts of one wallet in derivation order, or of every wallet oldest first; one page.
    fn accounts_page(
        &self,
        organization_id: &str,
        wallet_id: Option<&str>,
        page: &Page,
    ) -> Result<Vec<WalletAccount>, StoreError>;
    fn accounts(&self, organization_id: &str, wallet_id: Option<&str>) -> Result<Vec<WalletAccount>, StoreError> {
        self.accounts_page(organization_id, wallet_id, &Page::ALL)
    }
    fn account_by_address(&self, organization_id: &str, address: &str) -> Result<WalletAccount, StoreError>;
    /// Whether the key of account `id` left the enclave (it or its wallet was exported);
    /// `NotFound` if the organization has no such account.
    fn account_key_left(&self, organization_id: &str, id: &str) -> Result<bool, StoreError>;
    fn private_key(&self, organization_id: &str, id: &str) -> Result<PrivateKey, StoreError>;
    /// Private keys oldest first, one page.
    fn private_keys_page(&self, organization_id: &str, page: &Page) -> Result<Vec<PrivateKey>, StoreError>;
    fn private_keys(&self, organization_id: &str) -> Result<Vec<PrivateKey>, StoreError> {
        self.private_keys_page(organization_id, &Page::ALL)
    }
    fn private_key_by_address(&self, organization_id: &str, address: &str) -> Result<PrivateKey, StoreError>;
    fn import_target(&self, organization_id: &str, user_id: &str) -> Result<ImportTarget, StoreError>;

    fn activity(&self, organization_id: &str, id: &str) -> Result<ActivityRecord, StoreError>;
    fn activity_by_fingerprint(&self, fingerprint: &str) -> Result<ActivityRecord, StoreError>;
    fn activities(&self, organization_id: &str, filter: &ActivityFilter) -> Result<Vec<ActivityRecord>, StoreError>;
    /// The activity log from position `after` (exclusive), at most `limit` links, in order.
    fn activity_log(&self, organization_id: &str, after: u64, limit: usize) -> Result<Vec<LogEntry>, StoreError>;
    /// Finished activities no link names, oldest first, at most `limit`.
    fn unlogged_activities(&self, organization_id: &str, limit: usize) -> Result<Vec<ActivityRecord>, StoreError>;

    fn record(&self, organization_id: &str, kind: &str, id: &str) -> Result<Record, StoreError>;
    /// The record of `kind` with `id`, in whichever organization holds it.
    fn record_by_id(&self, kind: &str, id: &str) -> Result<Record, StoreError>;
    /// Every record of `kind`, in every organization (bounded; for small kinds only).
    fn records_of_kind(&self, kind: &str) -> Result<Vec<Record>, StoreError>;
    /// Records of one kind oldest first, one page.
    fn records_page(&self, organization_id: &str, kind: &str, page: &Page) -> Result<Vec<Record>, StoreError>;
    fn records(&self, organization_id: &str, kind: &str) -> Result<Vec<Record>, StoreError> {
        self.records_page(organization_id, kind, &Page::ALL)
    }
    /// How many records of `kind` there are and their latest `updated_at`: a version that
    /// changes whenever one is added, changed or removed (cheap: an index walk, no rows read).
    fn records_version(&self, organization_id: &str, kind: &str) -> Result<(i64, i64), StoreError>;

    /// `org`'s events of messages to `to` (any case), of `event_type` when given, newest first.
    fn email_events_page(
        &self,
        organization_id: &str,
        to: &str,
        event_type: Option<&str>,
        page: &Page,
    ) -> Result<Vec<EmailEventRecord>, StoreError>;

    /// Cheap liveness probe for `/healthz`.
    fn ping(&self) -> Result<(), StoreError>;

    fn api_key(&self, organization_id: &str, id: &str) -> Result<ApiKey, StoreError>;
    /// The organization's API keys, oldest first, one page.
    fn api_keys_page(&self, organization_id: &str, page: &Page) -> Result<Vec<ApiKey>, StoreError>;
    /// Every API key of the organization, oldest first.
    fn api_keys(&self, organization_id: &str) -> Result<Vec<ApiKey>, StoreError> {
        self.api_keys_page(organization_id, &Page::ALL)
    }
    /// API keys and passkeys of every organization that have no enclave certificate (created
    /// before certificates existed), for the operator's one-time migration.
    fn uncertified_credentials(&self) -> Result<Vec<UncertifiedCredential>, StoreError>;
    /// `(tag id, user id)` for every user tag membership of the organization.
    fn user_tag_members(&self, organization_id: &str) -> Result<Vec<(String, String)>, StoreError>;
    /// The ids of one user's tags, oldest tag first.
    fn user_tags_of(&self, organization_id: &str, user_id: &str) -> Result<Vec<String>, StoreError>;

    fn authenticator(&self, organization_id: &str, id: &str) -> Result<AuthenticatorRecord, StoreError>;
    /// The passkey registered in the organization under `credential_id` (base64url, no padding).
    fn authenticator_by_credential_id(
        &self,
        organization_id: &str,
        credential_id: &str,
    ) -> Result<AuthenticatorRecord, StoreError>;
    /// A user's passkeys, oldest first.
    fn authenticators_of_user(
        &self,
        organization_id: &str,
        user_id: &str,
    ) -> Result<Vec<AuthenticatorRecord>, StoreError>;
    /// OAuth providers of the organization (of one user when `user_id` is set), oldest first.
    fn oauth_providers(
        &self,
        organization_id: &str,
        user_id: Option<&str>,
    ) -> Result<Vec<OauthProviderRecord>, StoreError>;

    /// One page of the ids of `parent_id`'s sub-organizations that match `filter`, oldest first.
    fn sub_organization_ids(
        &self,
        parent_id: &str,
        filter: &SubOrgFilter,
        page: &Page,
    ) -> Result<Vec<String>, StoreError>;
    /// How many rows of each table belong to the organization: every table with an
    /// `organization_id` column (zeros included), and `organizations` (the row itself and its
    /// sub-organizations). For audits and tests of deletion.
    fn organization_footprint(&self, organization_id: &str) -> Result<Vec<(String, i64)>, StoreError>;
    /// Leaves no old copy of deleted rows in the store's files (SQLite: the pages
    /// `secure_delete` zeroed are checkpointed into the database and the WAL is truncated).
    /// `Ok(false)` when readers kept it from completing; call again later.
    fn purge_deleted_data(&self) -> Result<bool, StoreError>;

    /// The evaluations recorded for an activity, oldest first.
    fn policy_evaluations(
        &self,
        organization_id: &str,
        activity_id: &str,
    ) -> Result<Vec<PolicyEvaluationRecord>, StoreError>;
    /// `(intent hash, activity id)` claimed by an Idempotency-Key in the organization.
    fn idempotency_key(&self, organization_id: &str, key: &str) -> Result<(String, String), StoreError>;

    /// Claims pending deliveries due at `now`, oldest due first, at most `limit`, none of the
    /// endpoints or top-level organizations in `skip` (those whose share of the workers is in
    /// use: so one slow endpoint's, or one tenant's, backlog cannot hide the others'): each is
    /// leased until `lease.0` to `lease.1` by a conditional update, so of several gateways polling
    /// at once exactly one gets it.
    fn claim_due_webhook_deliveries(
        &self,
        now: Nanos,
        lease: (Nanos, &str),
        limit: usize,
        skip: &DueSkip,
    ) -> Result<Vec<WebhookDelivery>, StoreError>;
    /// Extends the leases `lease.1` holds on `ids` to `lease.0`; the ids it still held (one whose
    /// lease lapsed may be another gateway's by now, and is not to be sent).
    fn renew_webhook_leases(&self, ids: &[String], lease: (Nanos, &str)) -> Result<Vec<String>, StoreError>;
    /// Makes every pending delivery leased by `owner` due at `now` (what a previous process of
    /// that name held when it stopped, maybe dying); how many. Other gateways' leases stay.
    fn release_webhook_leases(&self, now: Nanos, owner: &str) -> Result<usize, StoreError>;
    /// Records attempts of deliveries (by id) and their new states in one transaction (nothing
    /// for a delivery that is gone, e.g. its endpoint was deleted meanwhile, or already settled).
    fn record_webhook_attempts(&self, attempts: &[(String, WebhookAttempt)]) -> Result<(), StoreError>;
    fn record_webhook_attempt(&self, id: &str, attempt: &WebhookAttempt) -> Result<(), StoreError> {
        self.record_webhook_attempts(&[(id.to_string(), attempt.clone())])
    }
    /// An endpoint's deliveries, newest first, at most `limit`.
    fn webhook_deliveries(
        &self,
        organization_id: &str,
        endpoint_id: &str,
        limit: usize,
    ) -> Result<Vec<WebhookDelivery>, StoreError>;
}
