//! The writes: every effect an activity (or the operator) applies inside one transaction.

use super::model::{
    ApiKey, AuthenticatorRecord, CredentialKind, EmailEventRecord, ImportTarget, Nanos, OauthProviderRecord,
    Organization, PolicyEvaluationRecord, PrivateKey, Record, User, Wallet, WalletAccount, WebhookDelivery,
};

/// One effect of an activity, applied inside the activity's transaction.
#[derive(Debug, Clone)]
pub enum Write {
    InsertOrganization(Organization),
    /// `update_organization_name`.
    RenameOrganization {
        id: String,
        name: String,
        updated_at: Nanos,
    },
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
    /// Every contact of user `id` is verified (`Effect::MarkContactsVerified`).
    MarkContactsVerified {
        organization_id: String,
        id: String,
    },
    /// `update_wallet`.
    RenameWallet {
        id: String,
        name: String,
        updated_at: Nanos,
    },
    /// Accounts of `organization_id` and their sealed keys; fails the whole transaction if one is
    /// not there, or if `require_exported` is set and neither it nor its wallet was exported.
    DeleteAccounts {
        organization_id: String,
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
    /// Deletes the records of a kind made before `created_before` (nanoseconds), however many
    /// there are, none included: for records that expire (one-time codes).
    /// Messages the enclave reports it sent (`email_events`).
    InsertEmailEvents(Vec<EmailEventRecord>),
    /// An organization's email events made before `created_before` go.
    PruneEmailEvents {
        organization_id: String,
        created_before: Nanos,
    },
    PruneRecords {
        organization_id: String,
        kind: String,
        created_before: Nanos,
    },
    PutImportTarget(ImportTarget),
    /// Consumes the target: it must still be the same blob (used once).
    TakeImportTarget {
        organization_id: String,
        user_id: String,
        sealed_key: Vec<u8>,
    },
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
    /// Fails the transaction unless this organization's records of `kind` whose `data[key]` is the
    /// string `value` are exactly `ids`: the set a handler read is still the whole set.
    RequireRecordSet {
        organization_id: String,
        kind: String,
        key: String,
        value: String,
        ids: Vec<String>,
    },
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
        app_proofs: Vec<serde_json::Value>,
    },
    /// One link of the organization's activity log, as the enclave signed it (JSON `v1AppProof`).
    InsertLogLink {
        organization_id: String,
        seq: u64,
        activity_id: String,
        link: String,
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
    /// An event for one endpoint, in the transaction of the activity change it reports.
    EnqueueWebhookDelivery(WebhookDelivery),
    /// Drops the undelivered events of a deleted endpoint.
    DropWebhookDeliveries {
        organization_id: String,
        endpoint_id: String,
    },
}

/// The conflict message of a lost [`Write::UpdateConsensusActivity`] race.
pub const CONSENSUS_MOVED: &str = "activity is no longer awaiting this vote";
