//! The authority store's interface: its types, the [`EnclaveStore`] trait both backends
//! implement, and [`StoreError`], the one error type of this boundary.

/// One record of an organization's authority state: what it is (`kind`, e.g. `user`, `policy`),
/// its id within that kind, and its bytes, serialized by the caller (the store never reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: String,
    pub id: String,
    pub data: Vec<u8>,
}

/// An organization's authority state as last committed: every entry, and the version the commit
/// that made it produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgHead {
    /// Per organization, starts at 1, grows by one with each applied change, never reused (an
    /// organization whose entries are all deleted keeps its version).
    pub version: u64,
    /// Sorted by (kind, id).
    pub entries: Vec<Entry>,
}

/// A change to one organization's state, applied only if the organization is still at
/// `expected_version` (compare-and-set).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrgChanges {
    pub organization_id: String,
    /// The version the change was computed from; 0 = the organization must not exist yet.
    pub expected_version: u64,
    /// Entries written (inserted, or replacing the entry of the same kind and id).
    pub puts: Vec<Entry>,
    /// (kind, id) of entries removed; one that does not exist is no error.
    pub deletes: Vec<(String, String)>,
}

/// The share of the replay window an authorized request is charged to: its top-level
/// organization's (`replay_per_organization` live entries), and lanes inside it, each with a
/// quota of its own. A request of a sign-up (a sub-organization the auth proxy made for anyone
/// who asked) is charged to its own lane and to the lane all its parent's sign-ups share, so that
/// no visitor holds its top-level organization's share, and all of them together only a part of
/// it. An entry is in every lane of its share or in none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayShare {
    pub organization: String,
    pub lanes: Vec<ReplayLane>,
}

impl ReplayShare {
    /// The share of `organization` alone, with no lanes.
    pub fn of(organization: impl Into<String>) -> Self {
        Self { organization: organization.into(), lanes: Vec::new() }
    }
}

/// A lane of a [`ReplayShare`]: a scope counted like an organization (a name no organization
/// has: the caller prefixes it) and the most live entries it may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayLane {
    pub scope: String,
    pub quota: u64,
}

impl ReplayLane {
    /// The key of the lane's entry for a request's replay `key` (the window's keys are one set
    /// across scopes).
    pub fn key(&self, key: &[u8; 32]) -> [u8; 32] {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        h.update(b"coffer-replay-lane\0");
        h.update(self.scope.as_bytes());
        h.update([0u8]);
        h.update(key);
        h.finalize().into()
    }
}

/// What [`EnclaveStore::remember`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remembered {
    /// The key was not in the window; it is now, until its expiry.
    Fresh,
    /// The key is in the window (not expired): the request is a replay (or a twin in flight).
    Replayed,
    /// The organization has `replay_per_organization` live entries: it must wait for some to
    /// expire; other organizations are not affected. Nothing was recorded.
    OrganizationQuotaFull,
    /// The whole window holds `replay_capacity` live entries. Nothing was recorded.
    WindowFull,
    /// The allow to record is of an activity a vote the enclave keeps rejected: nothing was
    /// recorded (checked in the spend's transaction, so that a rejection and a run never both
    /// commit).
    Rejected,
}

/// `DecisionRecord::outcome` values.
pub const OUTCOME_ALLOW: &str = "allow";
pub const OUTCOME_REFUSE: &str = "refuse";
pub const OUTCOME_DONE: &str = "done";
pub const OUTCOME_FAILED: &str = "failed";

/// [`DecisionRecord::result_digest`] of a login's, session's or one-time code's [`OUTCOME_DONE`]:
/// the call did its work and answered. Ranked with a key use's result over any later refusal or
/// failure ([`EnclaveStore::decided`]): a login done is linked only as completed.
pub const DONE_MARK: &str = "done:";

/// [`DecisionRecord::reason`] of a refusal for want of approvals (the activity waits for votes).
pub const REASON_CONSENSUS_NEEDED: &str = "REFUSAL_REASON_CONSENSUS_NEEDED";
/// [`DecisionRecord::reason`] of a rejection the enclave kept.
pub const REASON_VOTE_REJECTED: &str = "REFUSAL_REASON_VOTE_REJECTED";

/// A vote the enclave verified on an activity it found waiting for votes, kept in its own store
/// until the activity can no longer be voted on: what it counts when the next approval comes,
/// whatever the gateway's records say. The vote is kept as it was stamped, and verified again
/// when counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptBallot {
    pub organization_id: String,
    /// The waiting activity's fingerprint.
    pub fingerprint: String,
    /// The voter.
    pub user_id: String,
    /// A rejection (`reject_activity`); an approval otherwise.
    pub rejected: bool,
    /// The encoded `StampedRequest` of the vote.
    pub stamped: Vec<u8>,
    /// The enclave's clock when it kept the vote (ms since the Unix epoch).
    pub at_ms: i64,
    /// When the activity can no longer be voted on (ms): the ballot is pruned after.
    pub expires_ms: i64,
}

/// Most votes the store keeps for one organization (all its waiting activities together).
pub const MAX_BALLOTS_PER_ORGANIZATION: i64 = 10_000;

/// What [`EnclaveStore::keep_ballot`] did with a vote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BallotKept {
    /// Kept (a vote of the same selection by the same user replaced).
    Kept,
    /// The user voted otherwise on the activity already: nothing kept.
    VotedOtherwise,
    /// The activity has as many votes as it may, or its organization as many kept votes as the
    /// store keeps for one: nothing kept.
    Full,
    /// A rejection of an activity the enclave allowed (it ran, or began to): nothing kept.
    Ran,
}

/// One decision of the enclave (or the outcome of an execution it authorized), as the decision
/// log keeps it: no secret, no payload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecisionRecord {
    /// The enclave's clock when it decided (ms since the Unix epoch).
    pub at_ms: i64,
    pub organization_id: String,
    /// The enclave operation (`sign`, `export_wallet`, ...), as the audit lines name it.
    pub operation: String,
    /// The stamped body's fingerprint (the activity's, or the vote's for an approved execution's
    /// vote); empty when the request had no readable body.
    pub fingerprint: String,
    /// The stamped body's activity type.
    pub activity_type: String,
    /// The stamping credential's user.
    pub user_id: String,
    /// [`OUTCOME_ALLOW`], [`OUTCOME_REFUSE`], [`OUTCOME_DONE`] or [`OUTCOME_FAILED`].
    pub outcome: String,
    /// For a refusal, the typed reason's name (`REFUSAL_REASON_…`); for a failure, what failed.
    /// Never a decision input (nothing reads it but people).
    pub reason: String,
    /// For the allow of a key use: the digest (`proof::json_digest`) of the activity's result as
    /// the enclave made it; the log links that activity only as completed with that result.
    /// Empty otherwise.
    pub result_digest: String,
}

/// What the decision log says of one activity ([`EnclaveStore::decided`]): its latest decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoggedDecision {
    /// No decision: the enclave never saw the activity (or forgot it past the retention).
    Nothing,
    /// The latest is a refusal or a failure: whatever was allowed before did not happen (a state
    /// change refused after its stamp was spent, an operation that failed after its allow).
    Refused,
    /// The latest is an `allow` or `done`: the enclave authorized it.
    Authorized,
}

impl LoggedDecision {
    /// From the outcome of the activity's latest decision (`None`: it has none).
    pub fn from_latest(outcome: Option<&str>) -> Self {
        match outcome {
            None => Self::Nothing,
            Some(OUTCOME_ALLOW | OUTCOME_DONE) => Self::Authorized,
            Some(_) => Self::Refused,
        }
    }
}

/// The latest decision of one activity ([`EnclaveStore::decided`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatestDecision {
    pub logged: LoggedDecision,
    /// Its [`DecisionRecord::result_digest`] (empty when it has none).
    pub result_digest: String,
}

impl LatestDecision {
    /// From the activity's latest decision's outcome and result digest (`None`: it has none).
    pub fn of(latest: Option<(String, String)>) -> Self {
        let (outcome, result_digest) = latest.unzip();
        Self {
            logged: LoggedDecision::from_latest(outcome.as_deref()),
            result_digest: result_digest.unwrap_or_default(),
        }
    }
}

/// What one link of an activity log is of ([`EnclaveStore::advance_log`]): the activity (its
/// stamped body's fingerprint and its id), its status, the digest of the activity as linked, its
/// position.
#[derive(Debug, Clone, Copy)]
pub struct LinkedActivity<'a> {
    pub fingerprint: &'a str,
    pub status: &'a str,
    pub activity_id: &'a str,
    pub activity_digest: &'a str,
    pub seq: u64,
    /// The stamp the link spends, in the same transaction (a key use's: its replay entry and its
    /// allow are committed with its link, or nothing is).
    pub spend: Option<&'a Spend>,
}

/// A stamp to spend: its replay entry, charged to `share` until `expires_ms`, and the allow it
/// stands for ([`EnclaveStore::remember_allowed`], as part of another write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spend {
    pub share: ReplayShare,
    pub key: [u8; 32],
    pub expires_ms: i64,
    pub now_ms: i64,
    pub allowed: DecisionRecord,
}

/// The link of an activity in one status ([`EnclaveStore::link_of`]): the activity's id and the
/// digest of the activity as linked (empty for links recorded before the digest was).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityLink {
    pub activity_id: String,
    pub activity_digest: String,
}

/// An HSM-native key the store counts: the module's label, its organization, the top-level
/// organization it is charged to, and when it was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeKeyRow {
    pub label: String,
    pub organization_id: String,
    pub charged_to: String,
    pub made_ms: i64,
}

/// Whether [`EnclaveStore::add_native_key`] counted a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeKeyCounted {
    Counted,
    /// The token holds its bound.
    TokenFull,
    /// The top-level organization holds its bound.
    OrganizationFull,
    /// A key of that label is counted already (an earlier attempt of the same request).
    Exists,
}

/// A KEK the store records: one made by rotation (version 2 on), or one destroyed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KekRecord {
    pub version: u32,
    pub made_ms: i64,
    pub destroyed_ms: Option<i64>,
    /// The `CKA_ID` of the module's object (a rotated KEK's; the first has none).
    pub object_id: Option<Vec<u8>>,
}

/// The bounds of the replay window and of the decision log, given to a backend when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most live replay entries in the whole window (every enclave and organization together).
    /// On PostgreSQL a safety bound read from a total at most a second old, so enclaves that
    /// insert at once may pass it by a few entries.
    pub replay_capacity: u64,
    /// Most live replay entries one organization may hold. Exact on SQLite; on PostgreSQL,
    /// concurrent inserts of one organization may pass it by at most their number.
    pub replay_per_organization: u64,
    /// Decisions older than this are pruned (ms); 0 keeps them forever.
    pub decision_retention_ms: i64,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self { replay_capacity: 2_000_000, replay_per_organization: 100_000, decision_retention_ms: 0 }
    }
}

/// Errors of the authority store. Callers decide on the variant, never on the message (which
/// names the backend's failure for people and never carries a password).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Compare-and-set failed: `organization_id` is no longer at the version the change was
    /// computed from (`found`: its version now, `None` if it does not exist). Nothing of the call
    /// was applied; reload and recompute.
    #[error("organization {organization_id} moved: expected version {expected}, found {found:?}")]
    VersionMoved { organization_id: String, expected: u64, found: Option<u64> },
    /// The store cannot be reached or failed to answer (connection, I/O, lock timeout,
    /// serialization failure); retrying later can succeed.
    #[error("authority store unavailable: {0}")]
    Unavailable(String),
    /// The store holds something it should not (a version out of range, an unknown schema
    /// version, a row of the wrong shape).
    #[error("authority store corrupt: {0}")]
    Corrupt(String),
    /// The call itself is malformed (one organization twice in one `apply`, an empty id, ...).
    #[error("invalid authority store call: {0}")]
    Invalid(String),
    /// Some stamps of an [`EnclaveStore::advance_log`] or [`EnclaveStore::apply_spending`] could
    /// not be spent (a replay, a full share or window): nothing of the call was kept. Each is
    /// `(its number in the call, what the replay window found)`; the others would have been spent.
    #[error("{} stamps of the links could not be spent", .0.len())]
    NotSpent(Vec<(usize, Remembered)>),
    /// The transaction lost a race PostgreSQL broke (a deadlock): nothing of it was kept, and
    /// running it again can succeed.
    #[error("authority store conflict: {0}")]
    Conflict(String),
}

/// The SQL layer's errors as the store's, in one place: a constraint that fired or a corrupt file
/// is a store holding what it should not; anything else may pass on a retry.
impl From<coffer_sql::SqlError> for StoreError {
    fn from(e: coffer_sql::SqlError) -> Self {
        use coffer_sql::SqlError;
        match e {
            SqlError::NotFound => StoreError::Corrupt("a row the store must hold is missing".into()),
            SqlError::Unique(u) => StoreError::Corrupt(u.message),
            SqlError::Corrupt(m) | SqlError::Constraint(m) => StoreError::Corrupt(m),
            SqlError::Busy => StoreError::Unavailable("the database is busy".into()),
            SqlError::Deadlock(m) => StoreError::Conflict(m),
            SqlError::Backend(m) => StoreError::Unavailable(m),
        }
    }
}

/// The enclave tier's durable store. Every method is a blocking call (on the tokio runtime,
/// PostgreSQL calls step off the executor themselves); every write is committed before the call
/// returns. Shared by every enclave that opens the same file or database.
pub trait EnclaveStore: Send + Sync {
    /// Every entry of `org` and its version; `None` if no change was ever applied to it.
    fn load(&self, org: &str) -> Result<Option<OrgHead>, StoreError>;

    /// The version of `org` alone (one indexed read): enough to tell whether a cached
    /// [`OrgHead`] is still the latest when other enclaves write too.
    fn version(&self, org: &str) -> Result<Option<u64>, StoreError>;

    /// Applies every change in ONE transaction, each only if its organization is still at its
    /// `expected_version`; returns the new versions (`expected_version + 1`), in the order of
    /// `changes`. On any mismatch nothing is applied and the error is
    /// [`StoreError::VersionMoved`] naming the first organization that moved. Durable (fsync'd on
    /// SQLite, `synchronous_commit` on PostgreSQL) before it returns. An organization may appear
    /// once per call.
    fn apply(&self, changes: &[OrgChanges]) -> Result<Vec<u64>, StoreError> {
        self.apply_spending(changes, &[])
    }

    /// [`EnclaveStore::apply`], spending `spends` (the stamps of the activities that asked for the
    /// changes, each with the caller's number for it) in the same transaction: if any cannot be
    /// spent, nothing is applied and the error is [`StoreError::NotSpent`] naming each by its
    /// number.
    fn apply_spending(&self, changes: &[OrgChanges], spends: &[(usize, &Spend)]) -> Result<Vec<u64>, StoreError>;

    /// Every organization that has a version, sorted.
    fn organizations(&self) -> Result<Vec<String>, StoreError>;
    /// The head of `org`'s activity log: (links appended, head hash); `None` before its first.
    fn log_head(&self, org: &str) -> Result<Option<(u64, String)>, StoreError>;
    /// Moves `org`'s activity log from `expected` links to `links` (more) with `head`, only if it
    /// is still at `expected` (compare-and-set: [`StoreError::VersionMoved`] otherwise), and
    /// records what each new link is of (`linked`, one per link), in one transaction. An activity
    /// is linked at most once, in one status: a link of a fingerprint or an activity id the log
    /// has already fails the whole move as `VersionMoved` (the caller, checking
    /// [`EnclaveStore::linked`] again, leaves it out). A link's [`LinkedActivity::spend`] is spent
    /// in the same transaction: if any cannot be, nothing moves and the error is
    /// [`StoreError::NotSpent`] naming each. Committed before it returns.
    fn advance_log(
        &self,
        org: &str,
        expected: u64,
        links: u64,
        head: &str,
        linked: &[LinkedActivity<'_>],
    ) -> Result<(), StoreError>;
    /// For each `(fingerprint, activity_id)` of `activities`, whether `org`'s activity log has a
    /// link of that fingerprint or of that activity id, in any status (one round trip on
    /// PostgreSQL).
    fn linked(&self, org: &str, activities: &[(&str, &str)]) -> Result<Vec<bool>, StoreError>;
    /// The link of the activity `fingerprint` in `status` in `org`'s log, if it has one.
    fn link_of(&self, org: &str, fingerprint: &str, status: &str) -> Result<Option<ActivityLink>, StoreError>;
    /// The sealed service key labelled `label` (kept for modules that cannot hold it, see
    /// `hsm::SealedKeyShelf`).
    fn sealed_service_key(&self, label: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Keeps `blob` under `label` unless a key is there already; returns the one kept.
    fn keep_sealed_service_key(&self, label: &str, blob: &[u8]) -> Result<Vec<u8>, StoreError>;

    /// Reserves `n` more seals under the KEK labelled `kek_label` (durably, counted for every
    /// enclave on the store) and answers how many are reserved now, these included: the count a
    /// KEK's seals are bounded by (NIST SP 800-38D §8.3, random 96-bit IVs).
    fn reserve_seals(&self, kek_label: &str, n: u64) -> Result<u64, StoreError>;
    /// The seals reserved under each KEK label so far.
    fn seals_reserved(&self) -> Result<Vec<(String, u64)>, StoreError>;
    /// Every sealed service key, (label, blob), by label.
    fn sealed_service_keys(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// Replaces the sealed service key `label` by `new` if it is still `old` (a re-seal under a
    /// newer KEK); answers whether it did.
    fn replace_sealed_service_key(&self, label: &str, old: &[u8], new: &[u8]) -> Result<bool, StoreError>;
    /// The KEKs recorded: made by rotation, or destroyed (version 1 is current until a rotation
    /// records version 2).
    fn keks(&self) -> Result<Vec<KekRecord>, StoreError>;
    /// Records KEK `version` as made, if it is the next one; answers whether it did (another
    /// enclave may have rotated first).
    fn add_kek(&self, version: u32, made_ms: i64, object_id: &[u8]) -> Result<bool, StoreError>;
    /// Records KEK `version` as destroyed.
    fn kek_destroyed(&self, version: u32, at_ms: i64) -> Result<(), StoreError>;
    /// Counts the HSM-native key `key` if the token holds fewer than `total` and its top-level
    /// organization fewer than `per_organization`.
    fn add_native_key(
        &self,
        key: &NativeKeyRow,
        total: u64,
        per_organization: u64,
    ) -> Result<NativeKeyCounted, StoreError>;
    /// The HSM-native keys counted (of `org` only, when given), oldest first.
    fn native_keys(&self, org: Option<&str>) -> Result<Vec<NativeKeyRow>, StoreError>;
    /// Stops counting the HSM-native key `label` (destroyed, or never made).
    fn remove_native_key(&self, label: &str) -> Result<(), StoreError>;

    /// The replay window: records `key` for `organization` until `expires_ms` unless a live
    /// entry (expiry `>= now_ms`) with that key exists. Entries that expired are pruned (those of
    /// the organization whenever it reaches its quota, all of them periodically and when the
    /// window is full). Committed before it returns, but see the backends for how durably: an
    /// entry survives a crash of the enclave process; on SQLite, not necessarily of the machine.
    fn remember(
        &self,
        organization: &str,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<Remembered, StoreError>;

    /// [`EnclaveStore::remember`] under a quota of its own for `scope` instead of the window's
    /// per-organization one: how the enclave counts what it bounds per configuration (the auth
    /// proxy's sign-ups, one entry each until `expires_ms`). `scope` never names an organization
    /// (the caller prefixes it), so these entries count against no organization's quota. The
    /// count is exact: callers of one scope are serialized, so `quota` is never passed even by
    /// enclaves counting at the same moment (three attempts at a code are three).
    fn remember_within(
        &self,
        scope: &str,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        quota: u64,
    ) -> Result<Remembered, StoreError>;

    /// [`EnclaveStore::remember`] charged to `share` (its organization's quota, then each of its
    /// lanes': [`Remembered::OrganizationQuotaFull`] if any is full) and, only if the key was
    /// fresh, [`EnclaveStore::record_decision`] of `allowed` (the authorization that entry stands
    /// for), all in one transaction: the hot path of every authorized request.
    fn remember_allowed(
        &self,
        share: &ReplayShare,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        allowed: &DecisionRecord,
    ) -> Result<Remembered, StoreError>;

    /// Whether `key` is in the replay window and not expired at `now_ms`, or `org`'s log has
    /// linked the activity `fingerprint` already: one read, for an early refusal of a replay (or
    /// of an activity that is finished) before any decision is spent on it
    /// ([`EnclaveStore::remember`] stays what decides).
    fn spent(&self, key: [u8; 32], now_ms: i64, org: &str, fingerprint: &str) -> Result<bool, StoreError>;

    /// Appends one decision to the decision log (same durability as [`EnclaveStore::remember`]).
    fn record_decision(&self, d: &DecisionRecord) -> Result<(), StoreError>;

    /// What the enclave decided for an activity of `organization` with this fingerprint, as its
    /// decision log has it: authorized (an `allow` or `done`), only refused, or nothing.
    /// (An allow that recorded a key use's result decides over any later decision: the work was
    /// done, whatever a late refusal of the same stamp says.)
    fn decided(&self, organization: &str, fingerprint: &str) -> Result<LatestDecision, StoreError>;

    /// Whether the enclave ever refused the activity of `organization` with this fingerprint and
    /// type for want of approvals ([`REASON_CONSENSUS_NEEDED`]): it waited for votes.
    fn waited_for_votes(&self, organization: &str, fingerprint: &str, activity_type: &str) -> Result<bool, StoreError>;

    /// Keeps `ballot` (durably), unless its user voted otherwise on the activity, the activity
    /// has `max_per_activity` votes of other users already (its organization
    /// [`MAX_BALLOTS_PER_ORGANIZATION`]; a first rejection of the activity is kept past both),
    /// or it is a rejection of an activity the decision log has an allow of. The first rejection
    /// of the activity is recorded as `rejected_line` in the decision log, in the same
    /// transaction. A batch of ballots past their expiry is pruned first, in a transaction of its
    /// own. A rejection and a stamp's spend of the same activity are serialized: whichever
    /// commits second sees the other ([`Remembered::Rejected`], [`BallotKept::Ran`]).
    fn keep_ballot(
        &self,
        ballot: &KeptBallot,
        max_per_activity: usize,
        now_ms: i64,
        rejected_line: &DecisionRecord,
    ) -> Result<BallotKept, StoreError>;

    /// The unexpired ballots kept for the activity of `organization` with `fingerprint`, oldest
    /// first.
    fn ballots(&self, organization: &str, fingerprint: &str, now_ms: i64) -> Result<Vec<KeptBallot>, StoreError>;

    /// The users whose rejection of the activity of `organization` with this fingerprint the
    /// enclave kept, as the decision log records them ([`REASON_VOTE_REJECTED`]).
    fn vote_rejecters(&self, organization: &str, fingerprint: &str) -> Result<Vec<String>, StoreError>;

    /// Decisions made at or after `since_ms`, oldest first, at most `limit` (page on with the last
    /// one's `at_ms`: decisions of the same millisecond may then come again).
    fn decisions(&self, since_ms: i64, limit: usize) -> Result<Vec<DecisionRecord>, StoreError>;
}

/// Checks the shape of an `apply` call (both backends): ids non-empty, one organization once.
pub(super) fn check_changes(changes: &[OrgChanges]) -> Result<(), StoreError> {
    let mut seen = std::collections::HashSet::new();
    for c in changes {
        if c.organization_id.is_empty() {
            return Err(StoreError::Invalid("an organization id is empty".into()));
        }
        if !seen.insert(c.organization_id.as_str()) {
            return Err(StoreError::Invalid(format!("organization {} appears twice", c.organization_id)));
        }
        if c.expected_version >= i64::MAX as u64 {
            return Err(StoreError::Invalid(format!("version {} out of range", c.expected_version)));
        }
    }
    Ok(())
}

/// A stored version as `u64` (versions are stored as signed 64-bit integers, always > 0).
pub(super) fn version_of(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).ok().filter(|v| *v > 0).ok_or_else(|| StoreError::Corrupt(format!("stored version {v}")))
}
