//! The store's records (one per table or kind of row) and the small types its reads take and
//! return.

use serde::{Deserialize, Serialize};

/// Unix time in nanoseconds.
pub type Nanos = i64;

pub fn now_nanos() -> Nanos {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
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
    /// The contacts are the sub-organization sign-up's, unchanged since
    /// (`coffer_org_rules::model::User::contacts_verified`).
    pub contacts_verified: bool,
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
    /// The enclave's app proofs of the activity (`v1AppProof` objects), when it asked for them.
    pub app_proofs: Vec<serde_json::Value>,
}

/// One link of an organization's activity log, with the activity it names as stored now.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub seq: u64,
    /// The signed link (JSON `v1AppProof`).
    pub link: String,
    pub activity_id: String,
    /// `None` when the activity row is gone.
    pub activity: Option<ActivityRecord>,
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

/// Where the gateway keeps blobs the enclave sealed (re-sealed under a new KEK by
/// `coffer-gateway reseal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SealedBlobTable {
    #[default]
    Wallets,
    WalletAccounts,
    PrivateKeys,
    ImportTargets,
    AuthProxyKeys,
    OtpRecords,
}

impl SealedBlobTable {
    pub const ALL: [SealedBlobTable; 6] = [
        Self::Wallets,
        Self::WalletAccounts,
        Self::PrivateKeys,
        Self::ImportTargets,
        Self::AuthProxyKeys,
        Self::OtpRecords,
    ];

    /// How the operator's tools name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Wallets => "wallet seeds",
            Self::WalletAccounts => "wallet account keys",
            Self::PrivateKeys => "private keys",
            Self::ImportTargets => "import targets",
            Self::AuthProxyKeys => "auth proxy keys",
            Self::OtpRecords => "one-time code records",
        }
    }
}

/// One blob the gateway keeps, with the place it is bound to (what the enclave opens it under).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredBlob {
    pub table: SealedBlobTable,
    /// Its row's key, in page order.
    pub key: String,
    pub organization_id: String,
    pub resource_id: String,
    pub curve: String,
    pub address: String,
    pub address_format: String,
    pub public_key: String,
    pub blob: Vec<u8>,
    /// A record's data as read (records keep their blob in it).
    pub record_data: String,
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
    /// [`SubOrgFilter::Email`] and [`SubOrgFilter::PhoneNumber`] through a user whose contacts
    /// are verified (`User::contacts_verified`).
    VerifiedEmail(String),
    VerifiedPhoneNumber(String),
    /// [`SubOrgFilter::PublicKey`], of a key that proved possession there
    /// (`record_kinds::PROVEN_KEY`).
    ProvenPublicKey(String),
    /// Compared case-insensitively for `0x` hex addresses, exactly otherwise.
    WalletAccountAddress(String),
    /// The (issuer, subject, audience) of an OAuth provider.
    OauthIdentity {
        issuer: String,
        subject: String,
        audience: String,
    },
}

/// A message the enclave sent for an organization (`query/list_email_events`): never its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmailEventRecord {
    pub organization_id: String,
    pub id: String,
    pub to_address: String,
    /// `Send` or `SendFailure` (`coffer_proto::v1::EmailEvent`).
    pub event_type: String,
    pub message_id: String,
    pub from_address: String,
    /// When the enclave sent it.
    pub timestamp_ms: i64,
    pub created_at: Nanos,
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

/// Where a webhook delivery stands.
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
    /// The top-level organization whose share of the delivery workers its attempts take (the
    /// endpoint's organization, or its parent for a sub-organization's endpoint); empty for a
    /// delivery enqueued before it was recorded.
    pub top_level_id: String,
}

/// What a read of due webhook deliveries leaves out: endpoints, and top-level organizations
/// (their endpoints' deliveries), whose share of the delivery workers is in use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueSkip {
    pub endpoints: Vec<String>,
    pub top_levels: Vec<String>,
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

/// One policy evaluation: the per-policy outcomes of one vote, as stored
/// ([`crate::store::outcomes`]: compact, or the `[{policyId, outcome}]` JSON text).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyEvaluationRecord {
    pub id: String,
    pub activity_id: String,
    pub organization_id: String,
    pub vote_id: String,
    pub evaluations: String,
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
/// in one statement (`Store::stamp_context`): one round trip where the separate lookups took
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
