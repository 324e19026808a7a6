//! What a backend of the authority store provides (connections, how durable a write is, the
//! replay window's counting) and the [`EnclaveStore`] every backend gets from the shared SQL in
//! [`super::sql`].

use coffer_sql::Db;

use super::interface::{
    ActivityLink, BallotKept, DecisionRecord, EnclaveStore, KekRecord, KeptBallot, LatestDecision, LinkedActivity,
    NativeKeyCounted, NativeKeyRow, OrgChanges, OrgHead, Remembered, ReplayShare, Spend, StoreError,
};
use super::sql;

/// A backend: its connections and what has no portable SQL.
pub trait Backend: Send + Sync {
    type Db: Db;
    /// Runs a read on a connection of the store.
    fn read<T: Send>(&self, f: impl FnOnce(&mut Self::Db) -> Result<T, StoreError> + Send) -> Result<T, StoreError>;
    /// Runs `f` in a write transaction, committed before it returns if `f` succeeds, rolled back
    /// if it fails. `durable`: on disk even through a power loss (SQLite fsyncs; PostgreSQL's
    /// commits always are).
    fn write<T: Send>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut Self::Db) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError>;
    /// The replay window's insert ([`EnclaveStore::remember`] and its variants): charged to
    /// `share`, under `quota` instead of the per-organization one if given (counted exactly),
    /// with `allowed` recorded in the same transaction if the key was fresh.
    fn remember_in_window(
        &self,
        share: &ReplayShare,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        quota: Option<u64>,
        allowed: Option<&DecisionRecord>,
    ) -> Result<Remembered, StoreError>;
    /// Spends each stamp (its replay entry and its allow) inside the caller's write transaction;
    /// answers those that could not be spent, by their place, with what the window found (the
    /// caller then rolls back).
    fn spend_in(&self, db: &mut Self::Db, spends: &[(usize, &Spend)]) -> Result<Vec<(usize, Remembered)>, StoreError>;

    /// Serializes, until the caller's transaction ends, the writes that keep a rejection of or
    /// spend a stamp for any of `activities` (organization, fingerprint), so that whichever
    /// commits second sees the other. Nothing by default: a backend whose writes are serialized
    /// already needs no lock.
    fn lock_votes(&self, _db: &mut Self::Db, _activities: &[(&str, &str)]) -> Result<(), StoreError> {
        Ok(())
    }

    /// The replay window's housekeeping that is due (expired entries, old decisions, the total),
    /// done before a write that spends stamps rather than inside it, where the backend's
    /// transactions would hold what it touches for the whole write. Nothing by default.
    fn before_spending(&self, _now_ms: i64) -> Result<(), StoreError> {
        Ok(())
    }

    /// [`Backend::spend_in`], every stamp or none: [`StoreError::NotSpent`] names those that could
    /// not be spent (the caller's transaction then rolls back).
    fn spent_all(&self, db: &mut Self::Db, spends: &[(usize, &Spend)]) -> Result<(), StoreError> {
        if spends.is_empty() {
            return Ok(());
        }
        let expired: Vec<(usize, Remembered)> =
            spends.iter().filter(|(_, s)| !outlives(s.expires_ms, s.now_ms)).map(|(i, _)| (*i, EXPIRED)).collect();
        if !expired.is_empty() {
            return Err(StoreError::NotSpent(expired));
        }
        let refused = self.spend_in(db, spends)?;
        if refused.is_empty() {
            Ok(())
        } else {
            Err(StoreError::NotSpent(refused))
        }
    }
}

/// Whether an entry expiring at `expires_ms` is live at `now_ms`. One that is not is never
/// remembered: an expired entry of the same key is replaced as if absent, so a stamp spent past
/// its expiry (decided in its last moments, spent after) could be spent twice, once by each of
/// two enclaves.
fn outlives(expires_ms: i64, now_ms: i64) -> bool {
    expires_ms > now_ms
}

/// What the window answers for an entry that would be expired when remembered: as a replay (it
/// cannot be told from one; its stamp must be made again either way).
const EXPIRED: Remembered = Remembered::Replayed;

impl<B: Backend> EnclaveStore for B {
    fn load(&self, org: &str) -> Result<Option<OrgHead>, StoreError> {
        self.read(|db| sql::load(db, org))
    }
    fn version(&self, org: &str) -> Result<Option<u64>, StoreError> {
        self.read(|db| sql::version(db, org))
    }
    fn apply_spending(&self, changes: &[OrgChanges], spends: &[(usize, &Spend)]) -> Result<Vec<u64>, StoreError> {
        if let Some((_, s)) = spends.first() {
            self.before_spending(s.now_ms)?;
        }
        // The stamps first: one the window refuses rolls back before any change is written.
        self.write(true, |db| {
            self.spent_all(db, spends)?;
            sql::apply(db, changes)
        })
    }
    fn organizations(&self) -> Result<Vec<String>, StoreError> {
        self.read(sql::organizations)
    }
    fn log_head(&self, org: &str) -> Result<Option<(u64, String)>, StoreError> {
        self.read(|db| sql::log_head(db, org))
    }
    fn advance_log(
        &self,
        org: &str,
        expected: u64,
        links: u64,
        head: &str,
        linked: &[LinkedActivity<'_>],
    ) -> Result<(), StoreError> {
        if links <= expected {
            return Err(StoreError::Invalid(format!("the log moves forward only (from {expected} to {links})")));
        }
        let spends: Vec<(usize, &Spend)> =
            linked.iter().enumerate().filter_map(|(i, l)| l.spend.map(|s| (i, s))).collect();
        if let Some((_, s)) = spends.first() {
            self.before_spending(s.now_ms)?;
        }
        let spend_stamps = |db: &mut B::Db| self.spent_all(db, &spends);
        match self.write(false, |db| sql::advance_log(db, org, expected, links, head, linked, spend_stamps)) {
            // Rolled back; the head as it is now, read after.
            Err(StoreError::VersionMoved { .. }) => Err(StoreError::VersionMoved {
                organization_id: org.to_string(),
                expected,
                found: self.log_head(org)?.map(|(n, _)| n),
            }),
            other => other,
        }
    }
    fn linked(&self, org: &str, activities: &[(&str, &str)]) -> Result<Vec<bool>, StoreError> {
        self.read(|db| sql::linked(db, org, activities))
    }
    fn link_of(&self, org: &str, fingerprint: &str, status: &str) -> Result<Option<ActivityLink>, StoreError> {
        self.read(|db| sql::link_of(db, org, fingerprint, status))
    }
    fn sealed_service_key(&self, label: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(|db| sql::sealed_service_key(db, label))
    }
    fn reserve_seals(&self, kek_label: &str, n: u64) -> Result<u64, StoreError> {
        self.write(true, |db| sql::reserve_seals(db, kek_label, n))
    }
    fn keep_sealed_service_key(&self, label: &str, blob: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.write(true, |db| sql::keep_sealed_service_key(db, label, blob))
    }
    fn seals_reserved(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.read(sql::seals_reserved)
    }
    fn sealed_service_keys(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.read(sql::sealed_service_keys)
    }
    fn replace_sealed_service_key(&self, label: &str, old: &[u8], new: &[u8]) -> Result<bool, StoreError> {
        self.write(true, |db| sql::replace_sealed_service_key(db, label, old, new))
    }
    fn keks(&self) -> Result<Vec<KekRecord>, StoreError> {
        self.read(sql::keks)
    }
    fn add_kek(&self, version: u32, made_ms: i64, object_id: &[u8]) -> Result<bool, StoreError> {
        self.write(true, |db| sql::add_kek(db, version, made_ms, object_id))
    }
    fn kek_destroyed(&self, version: u32, at_ms: i64) -> Result<(), StoreError> {
        self.write(true, |db| sql::kek_destroyed(db, version, at_ms))
    }
    fn add_native_key(
        &self,
        key: &NativeKeyRow,
        total: u64,
        per_organization: u64,
    ) -> Result<NativeKeyCounted, StoreError> {
        self.write(true, |db| sql::add_native_key(db, key, total, per_organization))
    }
    fn native_keys(&self, org: Option<&str>) -> Result<Vec<NativeKeyRow>, StoreError> {
        self.read(|db| sql::native_keys(db, org))
    }
    fn remove_native_key(&self, label: &str) -> Result<(), StoreError> {
        self.write(true, |db| sql::remove_native_key(db, label))
    }
    fn remember(
        &self,
        organization: &str,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<Remembered, StoreError> {
        if !outlives(expires_ms, now_ms) {
            return Ok(EXPIRED);
        }
        self.remember_in_window(&ReplayShare::of(organization), key, expires_ms, now_ms, None, None)
    }
    fn remember_within(
        &self,
        scope: &str,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        quota: u64,
    ) -> Result<Remembered, StoreError> {
        if !outlives(expires_ms, now_ms) {
            return Ok(EXPIRED);
        }
        self.remember_in_window(&ReplayShare::of(scope), key, expires_ms, now_ms, Some(quota), None)
    }
    fn remember_allowed(
        &self,
        share: &ReplayShare,
        key: [u8; 32],
        expires_ms: i64,
        now_ms: i64,
        allowed: &DecisionRecord,
    ) -> Result<Remembered, StoreError> {
        if !outlives(expires_ms, now_ms) {
            return Ok(EXPIRED);
        }
        self.remember_in_window(share, key, expires_ms, now_ms, None, Some(allowed))
    }
    fn spent(&self, key: [u8; 32], now_ms: i64, org: &str, fingerprint: &str) -> Result<bool, StoreError> {
        self.read(|db| sql::spent(db, &key, now_ms, org, fingerprint))
    }
    fn record_decision(&self, d: &DecisionRecord) -> Result<(), StoreError> {
        self.write(false, |db| sql::insert_decision(db, d))
    }
    fn decided(&self, organization: &str, fingerprint: &str) -> Result<LatestDecision, StoreError> {
        self.read(|db| sql::decided(db, organization, fingerprint))
    }
    fn waited_for_votes(&self, organization: &str, fingerprint: &str, activity_type: &str) -> Result<bool, StoreError> {
        self.read(|db| sql::waited_for_votes(db, organization, fingerprint, activity_type))
    }
    fn decisions(&self, since_ms: i64, limit: usize) -> Result<Vec<DecisionRecord>, StoreError> {
        self.read(|db| sql::decisions(db, since_ms, limit))
    }
    fn keep_ballot(
        &self,
        ballot: &KeptBallot,
        max_per_activity: usize,
        now_ms: i64,
        rejected_line: &DecisionRecord,
    ) -> Result<BallotKept, StoreError> {
        // Best effort, and apart: the prune touches other activities' rows, which the keep's
        // transaction (holding this activity's vote lock) must not wait on.
        if let Err(e) = self.write(false, |db| sql::prune_ballots(db, now_ms)) {
            tracing::warn!(error = %e, "expired votes were not pruned");
        }
        self.write(true, |db| {
            self.lock_votes(db, &[(&ballot.organization_id, &ballot.fingerprint)])?;
            sql::keep_ballot(db, ballot, max_per_activity, now_ms, rejected_line)
        })
    }
    fn vote_rejecters(&self, organization: &str, fingerprint: &str) -> Result<Vec<String>, StoreError> {
        self.read(|db| sql::vote_rejecters(db, organization, fingerprint))
    }
    fn ballots(&self, organization: &str, fingerprint: &str, now_ms: i64) -> Result<Vec<KeptBallot>, StoreError> {
        self.read(|db| sql::ballots(db, organization, fingerprint, now_ms))
    }
}
