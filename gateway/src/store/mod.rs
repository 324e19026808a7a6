//! Storage: the `Store` abstraction the gateway runs on, its records, and its two backends
//! (embedded SQLite, PostgreSQL for several gateways), which share one set of SQL (`sql`).
//!
//! Every activity is committed together with its effects (`Write`s) in one transaction; the
//! fingerprint is a unique constraint, so identical submissions can never record twice, even
//! when two gateways commit them at the same moment.

mod backend;
mod postgres;
pub(crate) mod sql;
mod sqlite;

pub use postgres::PostgresStore;
pub use sql::{KEPT_ON_DELETION, PURGED_ON_DELETION};
pub use sqlite::SqliteStore;

/// Opens the store a `store_url` names: `sqlite://PATH` or `postgres://…` (`postgresql://…`).
pub fn open(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        return Ok(std::sync::Arc::new(SqliteStore::open(std::path::Path::new(path))?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(std::sync::Arc::new(PostgresStore::open(url)?));
    }
    Err(StoreError::Backend(format!(
        "unsupported store URL (expected sqlite://PATH or postgres://…): {}",
        postgres::redact(url)
    )))
}

use serde::{Deserialize, Serialize};

/// Unix time in nanoseconds.
pub type Nanos = i64;

pub fn now_nanos() -> Nanos {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

/// Reads on the async executor without waiting: inside [`nowait::run`], a store call that would
/// have to wait (every reader connection in use, SQLITE_BUSY while the WAL is reset, the writer's
/// lock) gives up at once, and the caller reruns the work where waiting is allowed. An indexed
/// read that does not wait costs microseconds, far less than a hand-off to another thread.
pub mod nowait {
    use std::cell::Cell;

    thread_local! {
        static ACTIVE: Cell<bool> = const { Cell::new(false) };
        static GAVE_UP: Cell<bool> = const { Cell::new(false) };
    }

    /// Runs `f` in no-wait mode: `None` when a store call in it would have waited (its result,
    /// built from a refused read, is dropped).
    pub fn run<T>(f: impl FnOnce() -> T) -> Option<T> {
        ACTIVE.set(true);
        GAVE_UP.set(false);
        let out = f();
        ACTIVE.set(false);
        (!GAVE_UP.replace(false)).then_some(out)
    }

    /// Whether the current store call must not wait.
    pub(crate) fn active() -> bool {
        ACTIVE.get()
    }

    /// Records that a store call would have waited; the error only unwinds the attempt.
    pub(crate) fn give_up() -> super::StoreError {
        GAVE_UP.set(true);
        super::StoreError::Backend("the store call would wait (retried off the executor)".into())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    /// A precondition checked inside the transaction failed; the message is caller-facing.
    #[error("{0}")]
    Conflict(String),
    /// A uniqueness constraint fired; the message names what must be unique.
    #[error("{0}")]
    Unique(String),
    #[error("database error: {0}")]
    Backend(String),
    /// A transient lock conflict (SQLite's SQLITE_BUSY); reads are retried.
    #[error("database busy")]
    Busy,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Organization {
    pub id: String,
    pub name: String,
    pub parent_id: Option<String>,
    pub root_quorum_threshold: i64,
    pub root_user_ids: Vec<String>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

#[derive(Debug, Clone, PartialEq)]
pub struct User {
    pub id: String,
    pub organization_id: String,
    pub name: String,
    pub email: Option<String>,
    pub phone_number: Option<String>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    pub id: String,
    pub organization_id: String,
    pub user_id: String,
    pub name: String,
    /// Lowercase hex: compressed SEC1 for ECDSA curves, raw 32 bytes for Ed25519.
    pub public_key: String,
    /// `CREDENTIAL_TYPE_API_KEY_P256` / `_SECP256K1` / `_ED25519`.
    pub credential_type: String,
    pub expiration_seconds: Option<u64>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
    /// The enclave-issued certificate (encoded `CredentialCertificate`); empty if none.
    pub certificate: Vec<u8>,
}

#[derive(Clone, PartialEq)]
pub struct Wallet {
    pub id: String,
    pub organization_id: String,
    pub name: String,
    pub exported: bool,
    pub imported: bool,
    /// Opaque to the gateway: only the enclave's HSM can open it.
    pub sealed_seed: Vec<u8>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

impl std::fmt::Debug for Wallet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wallet").field("id", &self.id).field("name", &self.name).finish_non_exhaustive()
    }
}

#[derive(Clone, PartialEq)]
pub struct WalletAccount {
    pub id: String,
    pub organization_id: String,
    pub wallet_id: String,
    pub curve: String,
    pub path_format: String,
    pub path: String,
    pub address_format: String,
    pub address: String,
    pub public_key: String,
    pub sealed_key: Vec<u8>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

impl std::fmt::Debug for WalletAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalletAccount").field("id", &self.id).field("address", &self.address).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AddressEntry {
    pub format: String,
    pub address: String,
}

#[derive(Clone, PartialEq)]
pub struct PrivateKey {
    pub id: String,
    pub organization_id: String,
    pub name: String,
    pub curve: String,
    pub public_key: String,
    pub addresses: Vec<AddressEntry>,
    pub tags: Vec<String>,
    pub exported: bool,
    pub imported: bool,
    pub sealed_key: Vec<u8>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateKey").field("id", &self.id).field("name", &self.name).finish_non_exhaustive()
    }
}

/// A recorded activity. `intent`, `result`, `votes` and `failure` are stored as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivityRecord {
    pub id: String,
    pub organization_id: String,
    pub activity_type: String,
    pub status: String,
    pub fingerprint: String,
    pub intent: serde_json::Value,
    pub result: serde_json::Value,
    pub votes: serde_json::Value,
    pub failure: Option<serde_json::Value>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

/// A one-time import target key, sealed by the enclave, bound to organization + user.
#[derive(Clone, PartialEq)]
pub struct ImportTarget {
    pub organization_id: String,
    pub user_id: String,
    pub sealed_key: Vec<u8>,
    pub created_at: Nanos,
}

/// A record without a table of its own (policy, tag, contract interface, feature, TVC app, ...).
/// `name` is unique per organization and kind (use the id where names need not be unique).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub organization_id: String,
    pub kind: String,
    pub id: String,
    pub name: String,
    pub data: serde_json::Value,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

/// A passkey (WebAuthn credential) of a user.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthenticatorRecord {
    pub id: String,
    pub organization_id: String,
    pub user_id: String,
    pub name: String,
    /// base64url without padding of the raw credential id; unique per organization.
    pub credential_id: String,
    /// Compressed SEC1 hex of the credential's P-256 key.
    pub public_key: String,
    /// The attestation statement format: `none`, `packed`, ...
    pub attestation_type: String,
    pub aaguid: String,
    /// `AUTHENTICATOR_TRANSPORT_*` names.
    pub transports: Vec<String>,
    pub sign_count: i64,
    pub created_at: Nanos,
    pub updated_at: Nanos,
    /// The enclave-issued certificate (encoded `CredentialCertificate`); empty if none.
    pub certificate: Vec<u8>,
}

/// An OIDC identity attached to a user; (issuer, subject, audience) is unique per organization.
#[derive(Debug, Clone, PartialEq)]
pub struct OauthProviderRecord {
    pub id: String,
    pub organization_id: String,
    pub user_id: String,
    pub name: String,
    pub issuer: String,
    pub audience: String,
    pub subject: String,
    pub created_at: Nanos,
    pub updated_at: Nanos,
    /// The enclave-issued certificate of the identity (`CredentialCertificate` of type
    /// `COFFER_OAUTH_PROVIDER`); empty if none.
    pub certificate: Vec<u8>,
}

/// Which sub-organizations `list_suborgs` keeps (`filterType` / `filterValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum SubOrgFilter {
    All,
    Name(String),
    Username(String),
    /// Compared case-insensitively.
    Email(String),
    PhoneNumber(String),
    /// A passkey's credential id (base64url without padding).
    CredentialId(String),
    /// An API key's or a passkey's public key (lowercase hex).
    PublicKey(String),
    /// Compared case-insensitively for `0x` hex addresses, exactly otherwise.
    WalletAccountAddress(String),
    /// The (issuer, subject, audience) of an OAuth provider.
    OauthIdentity {
        issuer: String,
        subject: String,
        audience: String,
    },
}

/// A page of a list: at most `limit` items, strictly after / before the cursor ids (in the
/// list's order; an id that is not in the list is ignored).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub limit: usize,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl Page {
    /// Everything, for the gateway's own full reads (not for answering a list request).
    pub const ALL: Page = Page { limit: usize::MAX, before: None, after: None };
}

/// One effect of an activity, applied inside the activity's transaction.
#[derive(Debug, Clone)]
pub enum Write {
    InsertOrganization(Organization),
    InsertUser(User),
    InsertApiKey(ApiKey),
    /// Stores the enclave certificate of a credential created before certificates existed.
    SetCertificate {
        kind: CredentialKind,
        id: String,
        certificate: Vec<u8>,
    },
    InsertWallet(Wallet),
    InsertAccounts(Vec<WalletAccount>),
    InsertPrivateKeys(Vec<PrivateKey>),
    MarkWalletExported(String),
    MarkPrivateKeyExported(String),
    MarkAccountExported(String),
    /// Fails the whole transaction if a wallet is unexported and `require_exported` is set.
    DeleteWallets {
        ids: Vec<String>,
        require_exported: bool,
    },
    DeletePrivateKeys {
        ids: Vec<String>,
        require_exported: bool,
    },
    /// Inserts a record, or replaces the one with the same kind and id.
    PutRecord(Record),
    /// Deletes records; fails the transaction if any does not exist.
    DeleteRecords {
        organization_id: String,
        kind: String,
        ids: Vec<String>,
    },
    PutImportTarget(ImportTarget),
    /// Consumes the target: it must still be the same blob (used once).
    TakeImportTarget {
        organization_id: String,
        user_id: String,
        sealed_key: Vec<u8>,
    },
    // <users, api keys and tags>
    /// Updates a user: `None` leaves a field unchanged, `Some("")` clears the email or phone
    /// number; `tag_ids` replaces the user's tags. Fails if the user or a tag is missing.
    UpdateUser {
        organization_id: String,
        id: String,
        name: Option<String>,
        email: Option<String>,
        phone_number: Option<String>,
        tag_ids: Option<Vec<String>>,
        updated_at: Nanos,
    },
    /// Deletes users with their API keys and tag memberships. Fails if a user is missing or is
    /// in the organization's root quorum.
    DeleteUsers {
        organization_id: String,
        ids: Vec<String>,
    },
    /// Deletes API keys of one user; fails if a key is missing or belongs to another user.
    DeleteApiKeys {
        organization_id: String,
        user_id: String,
        ids: Vec<String>,
    },
    /// Adds and removes members (users or private keys) of a tag (a record of kind `user_tag` or
    /// `private_key_tag`), then renames it: all or nothing. Fails if the tag or a member is
    /// missing or the new name is taken. User memberships live in `user_tags`, private-key
    /// memberships in the keys' `tags` lists.
    UpdateTag {
        organization_id: String,
        kind: String,
        id: String,
        new_name: Option<String>,
        add: Vec<String>,
        remove: Vec<String>,
        updated_at: Nanos,
    },
    /// Deletes tags and every membership of them; fails if a tag is missing.
    DeleteTags {
        organization_id: String,
        kind: String,
        ids: Vec<String>,
    },
    // <passkeys and oauth providers>
    /// Inserts passkeys; a credential id already registered in the organization fails the
    /// transaction (unique constraint).
    InsertAuthenticators(Vec<AuthenticatorRecord>),
    /// Deletes passkeys of one user; fails if one is missing or belongs to another user.
    DeleteAuthenticators {
        organization_id: String,
        user_id: String,
        ids: Vec<String>,
    },
    /// Inserts OAuth providers; an (issuer, subject, audience) already attached in the
    /// organization fails the transaction (unique constraint).
    InsertOauthProviders(Vec<OauthProviderRecord>),
    /// Deletes OAuth providers of one user; fails if one is missing or belongs to another user.
    DeleteOauthProviders {
        organization_id: String,
        user_id: String,
        ids: Vec<String>,
    },
    // <policies, contract interfaces, organization features and root quorum>
    /// Inserts a record or replaces this organization's record of the same kind and id. A taken
    /// name fails the transaction with `unique_message`; with `must_exist`, so does a record that
    /// is gone (an update racing a delete). Never changes another organization's record.
    PutRecordChecked {
        record: Record,
        unique_message: String,
        must_exist: bool,
    },
    /// Sets the organization's root quorum; fails if a user is not in the organization.
    SetRootQuorum {
        organization_id: String,
        threshold: i64,
        user_ids: Vec<String>,
        updated_at: Nanos,
    },
    // <tvc apps and deployments>
    /// Fails the transaction unless this organization's records of `kind` whose `data[key]` is the
    /// string `value` are exactly `ids`: the set a handler read is still the whole set.
    RequireRecordSet {
        organization_id: String,
        kind: String,
        key: String,
        value: String,
        ids: Vec<String>,
    },
    // <sub-organizations>
    /// Deletes a sub-organization: removes its credentials, keys, records and pending deliveries,
    /// keeps its activities and policy evaluations, and leaves its row as a tombstone
    /// (`deleted_at`, `activity_id`) so that its parent can still read that history. The
    /// `delete_sub_organization` activity `activity_id` itself is recorded in the parent's log.
    /// Fails if the organization is not a live sub-organization of `parent_id`, or, with
    /// `require_exported`, if it holds a wallet or private key that was never exported.
    DeleteSubOrganization {
        organization_id: String,
        parent_id: String,
        activity_id: String,
        require_exported: bool,
        deleted_at: Nanos,
    },
    // <policy engine and approvals>
    /// Moves an activity out of `ACTIVITY_STATUS_CONSENSUS_NEEDED` (or records a new vote on it):
    /// a compare-and-set that fails the transaction with [`CONSENSUS_MOVED`] unless the activity is
    /// still awaiting consensus with exactly `expected_votes` votes, so concurrent votes can
    /// never both complete it. A completed `delete_sub_organization` deletes the organization
    /// here, as migration 0005's trigger does for activities recorded at once.
    UpdateConsensusActivity {
        organization_id: String,
        id: String,
        expected_votes: usize,
        status: String,
        result: serde_json::Value,
        votes: serde_json::Value,
        failure: Option<serde_json::Value>,
        updated_at: Nanos,
    },
    InsertPolicyEvaluation(PolicyEvaluationRecord),
    /// Claims an Idempotency-Key for an activity; a key already claimed in the organization fails
    /// the transaction (unique constraint).
    InsertIdempotencyKey {
        organization_id: String,
        key: String,
        intent_hash: String,
        activity_id: String,
        created_at: Nanos,
    },
    // <webhooks>
    /// An event for one endpoint, in the transaction of the activity change it reports.
    EnqueueWebhookDelivery(WebhookDelivery),
    /// Drops the undelivered events of a deleted endpoint.
    DropWebhookDeliveries {
        organization_id: String,
        endpoint_id: String,
    },
}

/// Where a webhook delivery stands.
/// Record kind of smart contract interfaces (`ops::contracts` writes them, policies read them).
pub const SMART_CONTRACT_INTERFACE: &str = "smart_contract_interface";

pub const DELIVERY_PENDING: &str = "PENDING";
pub const DELIVERY_DELIVERED: &str = "DELIVERED";
pub const DELIVERY_FAILED: &str = "FAILED";

/// One event for one endpoint (the outbox row).
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookDelivery {
    /// The event id (`X-Turnkey-Event-Id`), stable across retries, distinct per endpoint.
    pub id: String,
    pub organization_id: String,
    pub endpoint_id: String,
    pub activity_organization_id: String,
    pub activity_id: String,
    pub event_type: String,
    pub body: String,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: Nanos,
    pub last_status_code: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
    /// The gateway (its instance id) holding the delivery until `next_attempt_at`; `None` while
    /// it only waits to be due.
    pub leased_by: Option<String>,
}

/// One delivery attempt and what follows it.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookAttempt {
    pub at: Nanos,
    pub status_code: Option<i64>,
    pub error: Option<String>,
    pub duration_ms: i64,
    /// `DELIVERY_DELIVERED`, `DELIVERY_FAILED`, or `DELIVERY_PENDING` with `next_attempt_at`.
    pub status: String,
    pub next_attempt_at: Nanos,
}

/// The conflict message of a lost [`Write::UpdateConsensusActivity`] race.
pub const CONSENSUS_MOVED: &str = "activity is no longer awaiting this vote";

/// One policy evaluation: the per-policy outcomes (`[{policyId, outcome}]`) of one vote.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyEvaluationRecord {
    pub id: String,
    pub activity_id: String,
    pub organization_id: String,
    pub vote_id: String,
    pub evaluations: serde_json::Value,
    pub created_at: Nanos,
}

impl std::fmt::Debug for ImportTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportTarget").field("user_id", &self.user_id).finish_non_exhaustive()
    }
}

/// What `commit` did: recorded this activity, or found one with the same fingerprint.
#[derive(Debug)]
pub enum Committed {
    New(ActivityRecord),
    Existing(ActivityRecord),
}

/// Resources whose names are unique in an organization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    Wallet,
    PrivateKey,
}

/// Filters for `list_activities`.
#[derive(Debug, Default, Clone)]
pub struct ActivityFilter {
    pub statuses: Vec<String>,
    pub types: Vec<String>,
    pub limit: usize,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// What a request stamped with an API key needs from the store before its operation runs, read
/// in one statement ([`Store::stamp_context`]): one round trip where the separate lookups took
/// four or five.
#[derive(Debug, Clone, PartialEq)]
pub struct StampContext {
    /// The live organization the request names.
    pub organization: Organization,
    /// The API key with the stamp's public key: the organization's own, else its parent's.
    pub api_key: ApiKey,
    pub via_parent: bool,
    /// The key's user (`None` if the user is gone and the key left behind).
    pub user: Option<User>,
    /// Whether an activity with the asked fingerprint exists (in any organization).
    pub fingerprint_taken: bool,
    /// Whether the organization or its parent has a record of the asked kind.
    pub has_records_of_kind: bool,
}

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

    /// Cheap liveness probe for `/healthz`.
    fn ping(&self) -> Result<(), StoreError>;

    // <users, api keys and tags>
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

    // <passkeys and oauth providers>
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

    // <sub-organizations>
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

    // <policy engine and approvals>
    /// The evaluations recorded for an activity, oldest first.
    fn policy_evaluations(
        &self,
        organization_id: &str,
        activity_id: &str,
    ) -> Result<Vec<PolicyEvaluationRecord>, StoreError>;
    /// `(intent hash, activity id)` claimed by an Idempotency-Key in the organization.
    fn idempotency_key(&self, organization_id: &str, key: &str) -> Result<(String, String), StoreError>;

    // <webhooks>
    /// Claims pending deliveries due at `now`, oldest due first, at most `limit`, none of the
    /// endpoints in `skip` (those already busy: so one slow endpoint's backlog cannot hide the
    /// others'): each is leased until `lease.0` to `lease.1` by a conditional update, so of several
    /// gateways polling at once exactly one gets it.
    fn claim_due_webhook_deliveries(
        &self,
        now: Nanos,
        lease: (Nanos, &str),
        limit: usize,
        skip: &[String],
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

/// Which table (or record) a credential's certificate lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CredentialKind {
    ApiKey,
    Authenticator,
    /// An OAuth provider (the certificate binds its identity hash).
    OauthProvider,
    /// A sub-organization's parent certificate (`id` is the sub-organization).
    ParentOrganization,
}

/// A credential without an enclave certificate, as the operator's migration exports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UncertifiedCredential {
    pub kind: CredentialKind,
    pub id: String,
    pub organization_id: String,
    pub user_id: String,
    pub credential_type: String,
    pub public_key: String,
    /// Unix milliseconds; 0 = no expiry.
    pub expires_at_ms: u64,
}

/// The key a `signWith` value names in an organization.
#[derive(Debug, Clone)]
pub enum SignWithKey {
    Account(WalletAccount),
    /// A private key named by its id (`address_format` `None`) or by one of its addresses.
    PrivateKey {
        key: PrivateKey,
        address_format: Option<String>,
    },
}

/// `Ok(None)` for a record that is not there, so lookups can fall through to the next kind.
pub fn found<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The one rule for what `signWith` names, used by the policy context and the signing handlers
/// (the enclave checks the same against the sealed key's binding): a wallet account address,
/// else a private key address, else a private key id.
pub fn sign_with_key(store: &dyn Store, org: &str, sign_with: &str) -> Result<Option<SignWithKey>, StoreError> {
    if sign_with.is_empty() {
        return Ok(None);
    }
    if let Some(a) = found(store.account_by_address(org, sign_with))? {
        return Ok(Some(SignWithKey::Account(a)));
    }
    if let Some(key) = found(store.private_key_by_address(org, sign_with))? {
        let address_format = key.addresses.iter().find(|a| a.address == sign_with).map(|a| a.format.clone());
        return Ok(Some(SignWithKey::PrivateKey { key, address_format }));
    }
    Ok(found(store.private_key(org, sign_with))?.map(|key| SignWithKey::PrivateKey { key, address_format: None }))
}
