//! The organization's rules, enforced where the keys are: each organization's authority state
//! read from the authority store (cached by version), stamping credentials checked live, the root
//! quorum and policies decided over it, and changes written only as the stamped body asks.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{mpsc, Arc, Mutex};

use coffer_org_rules::decide::{self, PolicyIndex, Proposal, Vote};
use coffer_org_rules::limits::CapCounts;
use coffer_org_rules::model::{kinds, CredentialKind, Millis};
use coffer_org_rules::{subjects, Change, Credential, Effect, Limits, OrgState};
use coffer_policy::decision::{Decision, Evaluation};

use crate::bounded_cache::BoundedCache;
use crate::error::{EnclaveError, RefusalReason};
use crate::group_commit::{self, Reply, Turn};
use crate::store::{EnclaveStore, Entry, OrgChanges, Remembered, Spend, StoreError};

/// One organization's state as loaded, with its policies compiled.
#[derive(Debug)]
pub struct Loaded {
    pub state: OrgState,
    /// Shared with the next version when a change touched no policy.
    pub index: Arc<PolicyIndex>,
    /// What the caps count in `state`, carried from version to version by what each change
    /// touched (a write costs what it changed, not the organization's size).
    pub counts: CapCounts,
}

impl Loaded {
    /// `state` as read whole: its policies compiled and its caps' counts counted.
    pub fn of(state: OrgState) -> Self {
        Self { index: Arc::new(PolicyIndex::of(&state)), counts: CapCounts::of(&state), state }
    }
}

/// What the states kept in memory may weigh together ([`footprint`]), by default.
pub const DEFAULT_STATE_CACHE_BYTES: usize = 64 << 20;

/// What `loaded` is charged in the cache of states: its weight by the caps' measure
/// ([`CapCounts::weight`]), which [`Limits::state_bytes`] bounds to half the cache, so that every
/// state within the caps can be kept.
pub fn footprint(loaded: &Loaded) -> usize {
    loaded.counts.weight()
}

/// A voter the enclave verified: the user, the certified credential, when the vote was stamped.
#[derive(Debug, Clone)]
pub struct VerifiedVote {
    pub user_id: String,
    pub public_key: String,
    pub credential_type: String,
    /// The scope of the session profile the credential's session was issued under (its
    /// certificate's), empty for none.
    pub session_scope: String,
    pub at_ms: Millis,
}

/// Why the organization's rules refused a request: its typed reason, its words for people, and
/// for a decision the policies made (consensus needed, denied) the outcomes it read (JSON text,
/// as recorded; empty otherwise).
#[derive(Debug)]
pub struct RulesRefusal {
    pub reason: RefusalReason,
    pub message: String,
    pub evaluation: String,
}

impl RulesRefusal {
    fn new(reason: RefusalReason, message: impl Into<String>) -> Self {
        Self { reason, message: message.into(), evaluation: String::new() }
    }
}

/// What the rules decided for an authorized request.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The state the decision read (of the policy organization).
    pub loaded: Arc<Loaded>,
    pub evaluation: Evaluation,
}

impl Decided {
    /// This evaluation as a decision: itself when it allows, else the typed refusal (waiting for
    /// votes, root quorum only, denied) with the outcomes it read.
    pub fn allowed(self) -> Result<Decided, RulesRefusal> {
        let evaluation = &self.evaluation;
        match evaluation.decision {
            Decision::Allow => Ok(self),
            Decision::ConsensusNeeded => Err(RulesRefusal {
                reason: RefusalReason::ConsensusNeeded,
                message: format!("{}: the approvals presented do not meet the required consensus", evaluation.reason),
                evaluation: evaluation.outcomes_json_text(),
            }),
            Decision::Deny => Err(RulesRefusal {
                reason: match evaluation.reason {
                    decide::ROOT_QUORUM_ONLY => RefusalReason::RootQuorumOnly,
                    _ => RefusalReason::PolicyDenied,
                },
                message: format!("{}: the organization's policies do not allow this activity", evaluation.reason),
                evaluation: evaluation.outcomes_json_text(),
            }),
        }
    }
}

/// The enclave's view of every organization's authority state.
pub struct Decider {
    store: Arc<dyn EnclaveStore>,
    /// The per-organization caps every staged change is checked against ([`Decider::stage`]).
    limits: Limits,
    /// Committed states, bounded by [`footprint`] on every insert, least recently used out.
    cache: BoundedCache<Arc<Loaded>>,
    /// Serializes this enclave's group commits (the store's compare-and-set orders them across
    /// enclaves).
    writing: Mutex<()>,
    /// Held by a state change from its decision to its staging, for each organization it names
    /// (see [`Decider::lock_organizations`]): each change of an organization is decided and checked
    /// on the state the changes staged before it leave, while changes of other organizations are
    /// decided at the same time.
    organization_locks: Vec<Mutex<()>>,
    /// The hash that spreads organizations over the locks, keyed per process: which ids share a
    /// lock cannot be chosen from outside (sub-organization ids follow from stamped bodies).
    lock_keys: std::collections::hash_map::RandomState,
    /// Held by the one load of an organization's state on a cache miss (by the same hash).
    loading: Vec<Mutex<()>>,
    /// States read from the store on a miss, since start.
    loads: std::sync::atomic::AtomicU64,
    /// The staged heads and the commit queue: held only to read a head, to stage a decided
    /// change, and by a group commit's leader while it takes and settles a group; never across a
    /// decision or a store call of a commit.
    changing: Mutex<Staged>,
}

/// How many locks the organizations' changes are spread over (by a hash of the organization id):
/// two organizations share one with a chance of 1 in this.
const ORGANIZATION_LOCKS: usize = 256;

/// The locks of the organizations a change names, held from its decision to its staging
/// ([`Decider::lock_organizations`]).
pub struct OrganizationsLocked<'a> {
    _held: Vec<std::sync::MutexGuard<'a, ()>>,
}

/// State changes of this enclave that are decided and checked but not yet committed: the state
/// they leave in each organization (what the next change is decided and checked on), and the
/// queue the next group commit takes them from. Key operations never read these heads: they
/// decide on committed states only.
#[derive(Default)]
pub struct Staged {
    heads: HashMap<String, Head>,
    queue: Vec<StagedChange>,
    /// Whether a group commit is being led (its leader hands the lead on when it is done).
    leading: bool,
    /// The organizations of the group being committed: a load that misses one of them waits
    /// for the commit to put its new state in the cache ([`Decider::load`]).
    committing: HashSet<String>,
    /// The stamps the staged changes spend, and those committed lately.
    stamps: StampsInFlight,
}

/// The replay keys of the stamps this enclave's staged changes spend (queued, or in the group
/// being committed) and of the last [`SPENT_LATELY`] it committed. A twin of one (the same stamp
/// sent again, decided before the first was committed) is refused as a replay before it is
/// staged: in the group's transaction its refusal would move every change staged on its
/// organizations (one replayed sign-up, every sign-up of its parent's).
#[derive(Default)]
struct StampsInFlight {
    /// Each key and when its replay entry expires ([`IN_FLIGHT`] while its change is staged).
    keys: HashMap<[u8; 32], i64>,
    spent_lately: VecDeque<[u8; 32]>,
}

/// [`StampsInFlight::keys`]' expiry of a stamp whose change is staged.
const IN_FLIGHT: i64 = i64::MAX;

/// How many times a group's transaction that PostgreSQL broke as a deadlock is run again before
/// its changes are decided again.
const GROUP_CONFLICT_RETRIES: u32 = 4;

/// Held by a group's leader until it has answered its group and handed the lead on: should it
/// stop before (a panic, or an error such as a poisoned lock; its group's callers then find their
/// answers abandoned), the lead is given up and every staged change after it answered as moved,
/// so that later changes are led again and decided again; no head or stamp of the lost group stays.
struct GroupUnwinding<'a> {
    changing: &'a Mutex<Staged>,
    done: bool,
}

impl Drop for GroupUnwinding<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut staged = self.changing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        staged.heads.clear();
        staged.committing.clear();
        staged.stamps = StampsInFlight::default();
        for change in std::mem::take(&mut staged.queue) {
            let _ = change.reply.send(Turn::Answer(Err(moved())));
        }
        staged.leading = false;
        drop(staged);
        // Left consistent above: usable again by the changes to come.
        self.changing.clear_poison();
    }
}

/// How many committed stamps [`StampsInFlight`] keeps: a few seconds of changes, more than the
/// time from a decision's check of the store (`EnclaveStore::spent`) to its staging.
const SPENT_LATELY: usize = 4096;

impl StampsInFlight {
    /// Takes `spend`'s key for a change about to be staged, unless a staged or lately committed
    /// change spends it.
    fn take(&mut self, spend: Option<&Spend>) -> Result<(), EnclaveError> {
        let Some(s) = spend else { return Ok(()) };
        if self.keys.get(&s.key).is_some_and(|expires| s.now_ms <= *expires) {
            return Err(crate::error::not_spent(Remembered::Replayed));
        }
        self.keys.insert(s.key, IN_FLIGHT);
        Ok(())
    }

    /// A staged change was answered: its stamp spent (kept a while), or not (let go: decided
    /// again, it is staged again).
    fn settle(&mut self, spend: Option<&Spend>, spent: bool) {
        let Some(s) = spend else { return };
        if !spent {
            self.keys.remove(&s.key);
            return;
        }
        self.keys.insert(s.key, s.expires_ms);
        self.spent_lately.push_back(s.key);
        while self.spent_lately.len() > SPENT_LATELY {
            if let Some(old) = self.spent_lately.pop_front() {
                // Unless it is staged again (its entry expired, an approved run, say).
                if self.keys.get(&old).is_some_and(|expires| *expires != IN_FLIGHT) {
                    self.keys.remove(&old);
                }
            }
        }
    }
}

/// The state an organization's staged changes leave.
#[derive(Clone)]
struct Head {
    loaded: Arc<Loaded>,
    /// The committed version the staged changes build on (0: a new organization).
    base_version: u64,
    /// The entries they touched (to write or delete), since the last group took them.
    touched: BTreeSet<(String, String)>,
    /// The last staged change deleted the organization.
    deleted: bool,
}

/// What a staged change's owner receives: the new version of each organization it changed, or
/// the group's failure.
type Committed = Result<Vec<(String, u64)>, EnclaveError>;

/// One staged change waiting for its group commit.
struct StagedChange {
    organizations: Vec<String>,
    /// The stamp of the activity that asked for it, spent in the group's transaction.
    spend: Option<Spend>,
    reply: Reply<Committed>,
}

/// The state a change of an organization is decided on ([`Decider::head`]): its staged head, or
/// its committed state (`staged: None`); `loaded` is `None` when it has none (unknown, deleted).
pub struct DecidedOn {
    pub loaded: Option<Arc<Loaded>>,
    staged: Option<Head>,
}

/// A change applied to the heads of its organizations, not staged yet
/// ([`Decider::prepare_decided`]).
pub struct Prepared {
    order: Vec<String>,
    next: Vec<(String, PreparedHead)>,
}

/// The head a prepared change leaves in one organization, and the staged head it was built on
/// (`None`: the committed state).
struct PreparedHead {
    head: Head,
    built_on: Option<Arc<Loaded>>,
}

/// The receiving end of a staged change (see [`Decider::committed`]).
#[derive(Debug)]
pub struct Pending {
    answer: mpsc::Receiver<Turn<Committed>>,
    lead: bool,
}

/// A copy of a group commit's error for each of its changes: a moved state (decide again) stays
/// one; the store's errors are copied.
fn each(e: &EnclaveError) -> EnclaveError {
    match e {
        EnclaveError::EnclaveStore(se) => EnclaveError::EnclaveStore(se.clone()),
        e if is_moved(e) => moved(),
        other => EnclaveError::Internal(other.to_string()),
    }
}

/// The organization's state moved between a decision and its commit.
fn moved() -> EnclaveError {
    EnclaveError::Busy {
        reason: RefusalReason::Unspecified,
        message: "the organization's authority state changed during the decision: retry".into(),
    }
}

/// Whether `e` says the state moved under a decision (decide again on the new state).
pub fn is_moved(e: &EnclaveError) -> bool {
    matches!(e, EnclaveError::Busy { reason: RefusalReason::Unspecified, .. })
        || matches!(e, EnclaveError::EnclaveStore(StoreError::VersionMoved { .. } | StoreError::Conflict(_)))
}

fn internal(what: &str) -> EnclaveError {
    EnclaveError::Internal(format!("authority state {what}"))
}

impl Decider {
    #[cfg(test)]
    fn commit_all(&self, changes: &[Change]) -> Result<Vec<(String, u64)>, EnclaveError> {
        self.commit(changes)
    }

    pub fn new(store: Arc<dyn EnclaveStore>) -> Self {
        Self {
            store,
            limits: Limits::default(),
            cache: BoundedCache::new(DEFAULT_STATE_CACHE_BYTES),
            writing: Mutex::new(()),
            organization_locks: (0..ORGANIZATION_LOCKS).map(|_| Mutex::new(())).collect(),
            lock_keys: std::collections::hash_map::RandomState::new(),
            loading: (0..ORGANIZATION_LOCKS).map(|_| Mutex::new(())).collect(),
            loads: std::sync::atomic::AtomicU64::new(0),
            changing: Mutex::new(Staged::default()),
        }
    }

    /// The same rules with these per-organization caps (the enclave's `max_*_per_organization`,
    /// and a state's weight: half the state cache, the most the cache keeps of one state, as the
    /// enclave's configuration sets it).
    pub fn limited(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The same rules, keeping at most `bytes` of states in memory ([`footprint`]).
    pub fn cache_budget(mut self, bytes: usize) -> Self {
        self.cache = BoundedCache::new(bytes);
        self
    }

    /// What the states kept in memory may weigh together ([`Decider::cache_budget`]).
    pub fn cache_budget_bytes(&self) -> usize {
        self.cache.budget()
    }

    /// States read from the store on a cache miss since start.
    pub fn loads(&self) -> u64 {
        self.loads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// States kept in memory, and what they are charged.
    pub fn cache_usage(&self) -> (usize, usize) {
        self.cache.usage()
    }

    /// Builds an organization's first state from `changes` (`coffer-enclave
    /// import-authority-state`, trusting the gateway's records at that moment): `Ok(false)` when
    /// the enclave already has (or had) a state for it, which is never overwritten.
    pub fn import(&self, organization_id: &str, changes: &[Change]) -> Result<bool, EnclaveError> {
        if self.store.version(organization_id)?.is_some() {
            return Ok(false);
        }
        if changes.iter().any(|c| c.organization_id != organization_id)
            || !matches!(changes.first().map(|c| &c.effect), Some(Effect::CreateOrganization { .. }))
        {
            return Err(EnclaveError::invalid(format!(
                "{organization_id}: the changes must create this organization first and change nothing else"
            )));
        }
        self.commit(changes)?;
        Ok(true)
    }

    /// Adds a credential the operator certifies from the gateway's records (`certify-existing`,
    /// trusting the database at that moment) to its organization's state: `Ok(false)` when the
    /// state has no such organization or user, or already has the credential.
    pub fn adopt_credential(&self, organization_id: &str, credential: Credential) -> Result<bool, EnclaveError> {
        let Some(l) = self.load(organization_id)? else { return Ok(false) };
        if !l.state.users.contains_key(&credential.user_id) || l.state.credentials.contains_key(&credential.id) {
            return Ok(false);
        }
        let change =
            Change { organization_id: organization_id.to_string(), effect: Effect::AddCredential { credential } };
        self.commit(&[change])?;
        Ok(true)
    }

    fn changing(&self) -> Result<std::sync::MutexGuard<'_, Staged>, EnclaveError> {
        self.changing.lock().map_err(|_| internal("change lock poisoned"))
    }

    /// Serializes this enclave's changes of `organizations` from decision to staging: a change
    /// takes this, reads its [`Decider::head`], decides, [`Decider::stage`]s and lets it go before
    /// waiting for its commit. Changes of other organizations are decided meanwhile (an
    /// expensive decision of one organization holds no other's), and the compare-and-set of each
    /// group commit checks what other enclaves did. Locks are taken in one order: no deadlock.
    pub fn lock_organizations<'a>(
        &'a self,
        organizations: impl IntoIterator<Item = &'a str>,
    ) -> Result<OrganizationsLocked<'a>, EnclaveError> {
        let mut slots: Vec<usize> = organizations.into_iter().map(|o| self.lock_slot(o)).collect();
        slots.sort_unstable();
        slots.dedup();
        let held = slots
            .into_iter()
            .map(|i| self.organization_locks[i].lock().map_err(|_| internal("organization lock poisoned")))
            .collect::<Result<_, _>>()?;
        Ok(OrganizationsLocked { _held: held })
    }

    fn lock_slot(&self, organization_id: &str) -> usize {
        use std::hash::BuildHasher;
        (self.lock_keys.hash_one(organization_id) % self.organization_locks.len() as u64) as usize
    }

    /// The state the next change of `organization_id` is decided and checked on: what the changes
    /// staged before it leave, or the committed state. Read with the organization's lock held
    /// ([`Decider::lock_organizations`]), so that nothing is staged on it before the change is.
    pub fn head(&self, organization_id: &str) -> Result<DecidedOn, EnclaveError> {
        let staged = self.changing()?.heads.get(organization_id).cloned();
        match staged {
            Some(h) => Ok(DecidedOn { loaded: (!h.deleted).then(|| h.loaded.clone()), staged: Some(h) }),
            None => Ok(DecidedOn { loaded: self.load(organization_id)?, staged: None }),
        }
    }

    /// Stages `changes`, decided and checked on `decided_on` (what [`Decider::head`] gave for
    /// `organization_id`), with the organizations' locks held: applies them to that very state
    /// (and to the other organizations' heads), all or nothing, and queues them for a group
    /// commit. The caller then lets the locks go and waits with [`Decider::committed`]. Should
    /// that state no longer be the organization's head (a change staged since, or the staged
    /// head it was committed or failed), the state moved ([`is_moved`]): decide again.
    pub fn stage_decided(
        &self,
        organization_id: &str,
        decided_on: &DecidedOn,
        changes: &[Change],
    ) -> Result<Pending, EnclaveError> {
        let prepared = self.prepare(changes, Some((organization_id, decided_on)), &self.limits)?;
        self.stage_prepared(prepared)
    }

    /// [`Decider::stage_decided`] in two steps, with the organizations' locks held across both:
    /// the changes applied to the state decided on and checked (a refusal here stages and spends
    /// nothing), then, after whatever must precede staging (spending the stamp),
    /// [`Decider::stage_prepared`].
    pub fn prepare_decided(
        &self,
        organization_id: &str,
        decided_on: &DecidedOn,
        changes: &[Change],
    ) -> Result<Prepared, EnclaveError> {
        self.prepare(changes, Some((organization_id, decided_on)), &self.limits)
    }

    /// Queues what [`Decider::prepare_decided`] applied, unless one of its organizations' heads
    /// moved meanwhile: a change staged on it, the staged head it was built on committed or
    /// failed, or the committed state it was built on replaced (then decide again: this change
    /// alone, not the group its stale base would fail).
    pub fn stage_prepared(&self, prepared: Prepared) -> Result<Pending, EnclaveError> {
        self.stage_prepared_spending(prepared, None)
    }

    /// [`Decider::stage_prepared`] for a change whose activity's stamp (`spend`) is spent in the
    /// transaction that commits it: a stamp the replay window refuses fails this change alone (its
    /// answer is [`crate::error::not_spent`]'s) and moves the changes staged on it; the rest of its
    /// group commits without them.
    pub fn stage_prepared_spending(&self, prepared: Prepared, spend: Option<Spend>) -> Result<Pending, EnclaveError> {
        // The committed version of each organization built on a committed state, read before the
        // heads are locked when the cache does not have it (no store call under that lock).
        let mut committed: HashMap<&str, Option<u64>> = HashMap::new();
        for (org, p) in &prepared.next {
            if p.built_on.is_none() && p.head.base_version > 0 {
                let version = match self.cache.get(org) {
                    Some(c) => Some(c.state.version),
                    None => self.store.version(org)?,
                };
                committed.insert(org, version);
            }
        }
        let mut staged = self.changing()?;
        staged.stamps.take(spend.as_ref())?;
        for (org, p) in &prepared.next {
            let unmoved = match (staged.heads.get(org), &p.built_on) {
                (Some(now), Some(on)) => Arc::ptr_eq(on, &now.loaded),
                (None, None) => committed.get(org.as_str()).is_none_or(|v| *v == Some(p.head.base_version)),
                _ => false,
            };
            if !unmoved {
                staged.stamps.settle(spend.as_ref(), false);
                return Err(moved());
            }
        }
        Ok(self.queue(&mut staged, prepared, spend))
    }

    /// Applies `changes` to each organization's head, all or nothing, and queues them for a group
    /// commit.
    fn stage(&self, changes: &[Change], limits: &Limits) -> Result<Pending, EnclaveError> {
        let prepared = self.prepare(changes, None, limits)?;
        self.stage_prepared(prepared)
    }

    /// The heads `changes` leave, each organization's effects applied and its caps checked;
    /// nothing is staged yet, and the heads are locked only to be read. The organization a
    /// decision was made for (`decided`) is built on the state decided on, never read again.
    fn prepare(
        &self,
        changes: &[Change],
        decided: Option<(&str, &DecidedOn)>,
        limits: &Limits,
    ) -> Result<Prepared, EnclaveError> {
        let mut order: Vec<String> = Vec::new();
        let mut by_org: HashMap<String, Vec<&Effect>> = HashMap::new();
        for c in changes {
            if !by_org.contains_key(&c.organization_id) {
                order.push(c.organization_id.clone());
            }
            by_org.entry(c.organization_id.clone()).or_default().push(&c.effect);
        }
        let heads: HashMap<String, Head> = {
            let staged = self.changing()?;
            order.iter().filter_map(|o| staged.heads.get(o).map(|h| (o.clone(), h.clone()))).collect()
        };
        if let Some((org, on)) = decided {
            let same = match (&on.staged, heads.get(org)) {
                (Some(was), Some(now)) => Arc::ptr_eq(&was.loaded, &now.loaded),
                (None, None) => true,
                _ => false,
            };
            if !same {
                return Err(moved());
            }
        }
        let mut next = Vec::new();
        for org in &order {
            let effects = &by_org[org];
            let creating = matches!(effects.first(), Some(Effect::CreateOrganization { .. }));
            let committed = |l: Arc<Loaded>| Head {
                base_version: l.state.version,
                loaded: l,
                touched: BTreeSet::new(),
                deleted: false,
            };
            let current: Option<Head> = match (heads.get(org), decided) {
                (Some(h), _) if h.deleted => None,
                (Some(h), _) => Some(h.clone()),
                (None, Some((d, on))) if d == org => on.loaded.clone().map(committed),
                (None, _) => self.load(org)?.map(committed),
            };
            let head = match (current, creating) {
                (Some(_), true) => {
                    return Err(EnclaveError::refused(
                        RefusalReason::TransitionRefused,
                        format!("organization {org} already exists"),
                    ))
                }
                (Some(h), false) => h,
                (None, true) => {
                    if heads.contains_key(org) || self.store.version(org)?.is_some() {
                        // Ids are never reused: a deleted organization does not come back.
                        return Err(EnclaveError::refused(
                            RefusalReason::TransitionRefused,
                            format!("organization {org} existed before"),
                        ));
                    }
                    Head {
                        loaded: Arc::new(Loaded::of(OrgState::default())),
                        base_version: 0,
                        touched: BTreeSet::new(),
                        deleted: false,
                    }
                }
                (None, false) => {
                    return Err(EnclaveError::refused(
                        RefusalReason::OrganizationUnknown,
                        format!("the enclave has no authority state for organization {org}"),
                    ))
                }
            };
            let deleted = effects.iter().any(|e| matches!(e, Effect::DeleteOrganization));
            // A cheap copy: the state's maps are persistent.
            let mut state = head.loaded.state.clone();
            let mut touched = head.touched.clone();
            if deleted {
                touched.extend(state.entries().into_iter().map(|e| (e.kind.to_string(), e.id)));
            }
            let changed = state
                .apply_all_unchecked(effects.iter().copied())
                .map_err(|e| EnclaveError::refused(RefusalReason::TransitionRefused, e.to_string()))?;
            // The caps, on the state this change leaves: the heads serialize this enclave's
            // changes, and the group commit's compare-and-set makes a change that raced another
            // enclave's be staged again on the state it left, so concurrent changes cannot pass
            // a cap between them.
            let policies: Vec<&str> =
                changed.iter().filter(|(k, _)| *k == kinds::POLICY).map(|(_, id)| id.as_str()).collect();
            // A deleted organization's state is empty, and its deletion names no entry it removed.
            let counts = match deleted {
                true => CapCounts::of(&state),
                false => head.loaded.counts.after(
                    &head.loaded.state,
                    &state,
                    changed.iter().map(|(kind, id)| (*kind, id.as_str())),
                ),
            };
            if !deleted {
                limits
                    .of(&state.organization)
                    .check(&head.loaded.counts, &counts)
                    .map_err(|e| EnclaveError::refused(RefusalReason::LimitExceeded, e.to_string()))?;
            }
            if let Some(Effect::CreateOrganization { organization }) = effects.first() {
                if &organization.id != org {
                    return Err(EnclaveError::refused(
                        RefusalReason::TransitionRefused,
                        "a new organization's changes name another organization",
                    ));
                }
            }
            let index = if policies.is_empty() {
                head.loaded.index.clone()
            } else {
                Arc::new(head.loaded.index.updated(&state, policies))
            };
            touched.extend(changed.into_iter().map(|(k, id)| (k.to_string(), id)));
            state.version = head.base_version;
            let built_on = heads.get(org).map(|h| h.loaded.clone());
            let loaded = Arc::new(Loaded { state, index, counts });
            let head = Head { loaded, base_version: head.base_version, touched, deleted };
            next.push((org.clone(), PreparedHead { head, built_on }));
        }
        Ok(Prepared { order, next })
    }

    /// Every organization's effects applied: the heads move, and the change waits in the queue.
    fn queue(&self, staged: &mut Staged, prepared: Prepared, spend: Option<Spend>) -> Pending {
        for (org, p) in prepared.next {
            staged.heads.insert(org, p.head);
        }
        let (reply, answer) = group_commit::channel();
        staged.queue.push(StagedChange { organizations: prepared.order, spend, reply });
        let lead = !std::mem::replace(&mut staged.leading, true);
        Pending { answer, lead }
    }

    /// Waits until the staged change is committed (with the others of its group, in one
    /// transaction): the new version of each organization it changed. Leads a group commit when
    /// it is this change's turn. An error fails every change of the group and every change staged
    /// after it (they were decided on its heads); a moved state ([`is_moved`]) is decided again.
    pub fn committed(&self, pending: Pending) -> Committed {
        group_commit::wait(&pending.answer, pending.lead, || self.lead_group(), || internal("group commit abandoned"))
    }

    /// Commits every change staged so far in one store transaction, settles the heads, answers
    /// each change, and hands the lead to the owner of the first change staged meanwhile.
    fn lead_group(&self) -> Result<(), EnclaveError> {
        let mut unwinding = GroupUnwinding { changing: &self.changing, done: false };
        let (mut group, mut snapshot) = {
            let mut staged = self.changing()?;
            let group = std::mem::take(&mut staged.queue);
            let mut snapshot: Vec<(String, Head)> = Vec::new();
            for org in group.iter().flat_map(|c| c.organizations.iter()) {
                if snapshot.iter().any(|(o, _)| o == org) {
                    continue;
                }
                if let Some(h) = staged.heads.get_mut(org) {
                    let taken = Head { touched: std::mem::take(&mut h.touched), ..h.clone() };
                    snapshot.push((org.clone(), taken));
                }
            }
            staged.committing = snapshot.iter().map(|(org, _)| org.clone()).collect();
            (group, snapshot)
        };
        coffer_process::crash_point::here("enclave-before-state-commit");
        let mut conflicts = 0;
        let result = loop {
            let spends: Vec<(usize, &Spend)> =
                group.iter().enumerate().filter_map(|(i, c)| c.spend.as_ref().map(|s| (i, s))).collect();
            match self.commit_group(&snapshot, &spends) {
                Err(EnclaveError::EnclaveStore(StoreError::NotSpent(refused))) => {
                    drop(spends);
                    let before = group.len();
                    self.leave_out_unspent(&mut group, &mut snapshot, &refused)?;
                    if group.is_empty() {
                        break Ok(Vec::new());
                    }
                    if group.len() == before {
                        break Err(internal("group commit refused stamps it does not have"));
                    }
                }
                // A deadlock another transaction broke says nothing of the states: the same
                // group again, its heads kept, a few times.
                Err(EnclaveError::EnclaveStore(StoreError::Conflict(_))) if conflicts < GROUP_CONFLICT_RETRIES => {
                    conflicts += 1;
                }
                other => break other,
            }
        };
        let mut staged = self.changing()?;
        staged.committing.clear();
        let mut failed_later = Vec::new();
        match &result {
            Ok(versions) => {
                for ((org, taken), (_, version)) in snapshot.iter().zip(versions) {
                    let settled = match staged.heads.get_mut(org) {
                        Some(h) if Arc::ptr_eq(&h.loaded, &taken.loaded) => true,
                        Some(h) => {
                            // Changes staged meanwhile build on what was just committed.
                            h.base_version = *version;
                            false
                        }
                        None => false,
                    };
                    if settled {
                        staged.heads.remove(org);
                    }
                }
            }
            Err(_) => {
                // Every head built on what failed: the changes staged after it are decided again.
                staged.heads.clear();
                failed_later = std::mem::take(&mut staged.queue);
            }
        }
        for change in &group {
            let answer = match &result {
                Ok(versions) => {
                    Ok(versions.iter().filter(|(o, _)| change.organizations.contains(o)).cloned().collect())
                }
                Err(e) => Err(each(e)),
            };
            staged.stamps.settle(change.spend.as_ref(), answer.is_ok());
            let _ = change.reply.send(Turn::Answer(answer));
        }
        for change in &failed_later {
            staged.stamps.settle(change.spend.as_ref(), false);
            let _ = change.reply.send(Turn::Answer(Err(moved())));
        }
        match staged.queue.first() {
            // Its owner waits for its answer; the lead comes first.
            Some(next) => {
                let _ = next.reply.send(Turn::Lead);
            }
            None => staged.leading = false,
        }
        drop(staged);
        unwinding.done = true;
        Ok(())
    }

    /// After a group's transaction was rolled back because the stamps `refused` (by their place
    /// in `group`) could not be spent: answers each such change with its refusal, and leaves out
    /// of the group, of `snapshot` and of the heads every organization such a change named, with
    /// every change (of the group or staged since) that names one of them, transitively; those
    /// changes were decided on states that included a refused one, and are decided again
    /// (moved). The rest of the group is committed without them.
    fn leave_out_unspent(
        &self,
        group: &mut Vec<StagedChange>,
        snapshot: &mut Vec<(String, Head)>,
        refused: &[(usize, Remembered)],
    ) -> Result<(), EnclaveError> {
        let mut staged = self.changing()?;
        let mut out: HashSet<String> = HashSet::new();
        for (i, _) in refused {
            if let Some(c) = group.get(*i) {
                out.extend(c.organizations.iter().cloned());
            }
        }
        // The organizations left out, closed over every change that names one of them.
        loop {
            let before = out.len();
            for c in group.iter().chain(staged.queue.iter()) {
                if c.organizations.iter().any(|o| out.contains(o)) {
                    out.extend(c.organizations.iter().cloned());
                }
            }
            if out.len() == before {
                break;
            }
        }
        let mut kept = Vec::with_capacity(group.len());
        for (i, change) in std::mem::take(group).into_iter().enumerate() {
            let answer = match refused.iter().find(|(r, _)| *r == i) {
                Some((_, remembered)) => Err(crate::error::not_spent(*remembered)),
                None if change.organizations.iter().any(|o| out.contains(o)) => Err(moved()),
                None => {
                    kept.push(change);
                    continue;
                }
            };
            staged.stamps.settle(change.spend.as_ref(), false);
            let _ = change.reply.send(Turn::Answer(answer));
        }
        *group = kept;
        let (moved_later, later): (Vec<_>, Vec<_>) = std::mem::take(&mut staged.queue)
            .into_iter()
            .partition(|c| c.organizations.iter().any(|o| out.contains(o)));
        staged.queue = later;
        for change in moved_later {
            staged.stamps.settle(change.spend.as_ref(), false);
            let _ = change.reply.send(Turn::Answer(Err(moved())));
        }
        staged.heads.retain(|org, _| !out.contains(org));
        snapshot.retain(|(org, _)| !out.contains(org));
        staged.committing.retain(|org| !out.contains(org));
        Ok(())
    }

    /// Writes the heads of `snapshot` (the entries their changes touched) in one transaction,
    /// each only if its organization is still at the version its changes build on, and spends
    /// `spends` in it, fsync'd; the cache then takes the committed states.
    fn commit_group(
        &self,
        snapshot: &[(String, Head)],
        spends: &[(usize, &Spend)],
    ) -> Result<Vec<(String, u64)>, EnclaveError> {
        // It guards no data: one poisoned by a panic inside a commit still orders commits.
        let _writing = self.writing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut writes = Vec::new();
        for (org, head) in snapshot {
            let (mut puts, mut deletes) = (Vec::new(), Vec::new());
            for (kind, id) in &head.touched {
                match head.loaded.state.entry(kind, id).filter(|_| !head.deleted) {
                    Some(e) => puts.push(Entry { kind: e.kind.to_string(), id: e.id, data: e.data }),
                    None => deletes.push((kind.clone(), id.clone())),
                }
            }
            if head.deleted {
                deletes.push((kinds::ORGANIZATION.to_string(), kinds::ORGANIZATION.to_string()));
                deletes.sort();
                deletes.dedup();
            }
            writes.push(OrgChanges {
                organization_id: org.clone(),
                expected_version: head.base_version,
                puts,
                deletes,
            });
        }
        let versions = self.store.apply_spending(&writes, spends)?;
        for ((org, head), version) in snapshot.iter().zip(&versions) {
            if head.deleted {
                self.cache.remove(org);
            } else {
                let mut state = head.loaded.state.clone();
                state.version = *version;
                let loaded = Arc::new(Loaded { state, index: head.loaded.index.clone(), counts: head.loaded.counts });
                let bytes = footprint(&loaded);
                self.cache.insert(org, loaded, bytes);
            }
        }
        Ok(snapshot.iter().map(|(org, _)| org.clone()).zip(versions).collect())
    }

    /// Records what the enclave itself did (keys made, sessions opened): committed.
    pub fn record(&self, changes: &[Change]) -> Result<(), EnclaveError> {
        self.commit(changes).map(|_| ())
    }

    /// Records the facts of keys already made and linked: the state's weight was checked before
    /// they were made (`service::key_facts::ensure_new_ids`), and is not again, since refusing
    /// them now would leave a linked activity whose keys the state does not hold (two key uses
    /// racing at the cap may pass it by what the second made). The other caps hold.
    pub fn record_made(&self, changes: &[Change]) -> Result<(), EnclaveError> {
        let limits = Limits { state_bytes: usize::MAX, signup_state_bytes: usize::MAX, ..self.limits };
        self.commit_within(changes, &limits).map(|_| ())
    }

    pub fn store(&self) -> &Arc<dyn EnclaveStore> {
        &self.store
    }

    /// The organization's current state (`None`: the enclave has none), read again from the
    /// store whenever its version moved (another enclave, or this one, changed it).
    /// A miss of an organization this enclave is committing waits for that commit, which puts the
    /// new state in the cache; otherwise it waits for no commit, and a commit of this enclave
    /// settling meanwhile puts a newer state in the cache, which the state read here never
    /// replaces.
    pub fn load(&self, organization_id: &str) -> Result<Option<Arc<Loaded>>, EnclaveError> {
        let Some(version) = self.store.version(organization_id)? else { return Ok(None) };
        // Versions only grow and the cache holds only committed states: a cached version newer
        // than the one just read was committed after that read, and is as good.
        if let Some(hit) = self.cache.get(organization_id).filter(|l| l.state.version >= version) {
            return Ok(Some(hit));
        }
        // A group commit of this enclave of this organization, which the store may have and the
        // cache not yet (the version read above may be its): it puts its states in the cache
        // before letting the write lock go. Without this wait, each decision racing a commit of
        // its organization read the whole state again (issue 40: 12% of a write's enclave time).
        // The lock is only a barrier here: one poisoned by a failed commit still is one.
        if self.changing()?.committing.contains(organization_id) {
            drop(self.writing.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
            if let Some(hit) = self.cache.get(organization_id).filter(|l| l.state.version >= version) {
                return Ok(Some(hit));
            }
        }
        // One load per organization at a time: the others missing it meanwhile wait and find it
        // in the cache, instead of each reading it and compiling its policies again.
        let slot = self.lock_slot(organization_id);
        let _loading = self.loading[slot].lock().map_err(|_| internal("load lock poisoned"))?;
        if let Some(hit) = self.cache.get(organization_id).filter(|l| l.state.version >= version) {
            return Ok(Some(hit));
        }
        self.loads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(head) = self.store.load(organization_id)? else { return Ok(None) };
        let state = OrgState::from_entries(
            head.version,
            head.entries.iter().map(|e| (e.kind.as_str(), e.id.as_str(), e.data.as_slice())),
        )
        .map_err(|e| EnclaveError::Internal(e.to_string()))?;
        if state.organization.id != organization_id {
            // Deleted (a version with no entries left), or entries of another organization.
            return Ok(None);
        }
        let loaded = Arc::new(Loaded::of(state));
        // Checked and kept in one step: a commit of this enclave may have put a newer state in
        // the cache since.
        let bytes = footprint(&loaded);
        Ok(Some(
            self.cache.insert_unless(organization_id, loaded, bytes, |l, kept| kept.state.version >= l.state.version),
        ))
    }

    /// Decides a request stamped by `credential` for `activity_type` with `params`: the
    /// credential must be live in `policy_org`'s state, and the root quorum or the policies must
    /// allow it with the votes presented (the submitter's first).
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &self,
        policy_org: &str,
        activity_type: &str,
        params: &serde_json::Value,
        submitter: &VerifiedVote,
        voters: &[VerifiedVote],
        now_ms: Millis,
    ) -> Result<Decided, RulesRefusal> {
        let loaded = self.load(policy_org).map_err(|e| RulesRefusal::new(RefusalReason::Unspecified, e.to_string()))?;
        Self::evaluate_over(loaded, policy_org, activity_type, params, submitter, voters, now_ms)
            .and_then(Decided::allowed)
    }

    /// How the rules of `policy_org`, over `loaded` (its state, `None`: it has none; possibly a
    /// staged head, see [`Decider::stage`]), evaluate the request, whatever they decide (the
    /// policy dry run's; [`Decided::allowed`] is the decision): refused only when no policy can be
    /// evaluated (no state for the organization, a credential not live in it, an activity type
    /// the rules do not know).
    #[allow(clippy::too_many_arguments)]
    pub fn evaluate_over(
        loaded: Option<Arc<Loaded>>,
        policy_org: &str,
        activity_type: &str,
        params: &serde_json::Value,
        submitter: &VerifiedVote,
        voters: &[VerifiedVote],
        now_ms: Millis,
    ) -> Result<Decided, RulesRefusal> {
        let Some(loaded) = loaded else {
            return Err(RulesRefusal::new(
                RefusalReason::OrganizationUnknown,
                format!("the enclave has no authority state for organization {policy_org}"),
            ));
        };
        let state = &loaded.state;
        let live = |v: &VerifiedVote| -> Option<Credential> {
            let stored = state.live_credential(&v.user_id, &v.public_key, &v.credential_type, now_ms).cloned();
            // A verification token is no stored credential: it stands for the user it names (the
            // caller verified the token, unspent and unexpired) for the one login it stamps.
            let token = v.credential_type == coffer_auth::grants::VERIFICATION_TOKEN
                && state.users.get(&v.user_id).is_some_and(|u| u.contacts_verified);
            // An invitation's acceptance key is none either: it stands for the invitation (its
            // code checked) and for the user the acceptance makes, whom the state has not.
            let invitation = v.credential_type == coffer_auth::grants::INVITATION_ACCEPTANCE
                && !state.users.contains_key(&v.user_id);
            stored.or_else(|| {
                (token || invitation).then(|| Credential {
                    id: format!("verification-token:{}", v.public_key),
                    user_id: v.user_id.clone(),
                    kind: CredentialKind::Session,
                    credential_type: v.credential_type.clone(),
                    public_key: v.public_key.clone(),
                    expires_at_ms: 0,
                })
            })
        };
        let Some(own) = live(submitter) else {
            return Err(RulesRefusal::new(
                RefusalReason::CredentialRevoked,
                "the stamping credential is not live in the organization's authority state (deleted, expired or invalidated)",
            ));
        };
        let subject = subjects::subject(activity_type).ok_or_else(|| {
            RulesRefusal::new(
                RefusalReason::OperationMismatch,
                format!("{activity_type} is not an activity the enclave decides"),
            )
        })?;
        // Votes whose credential is no longer live do not count, nor a session profile's (a
        // session scoped to some activities approves none of another's).
        let counted: Vec<(Credential, Millis)> = voters
            .iter()
            .filter(|v| v.session_scope.is_empty())
            .filter_map(|v| live(v).map(|c| (c, v.at_ms)))
            .collect();
        let mut votes = vec![Vote { user_id: &own.user_id, credential: &own, at_ms: submitter.at_ms }];
        votes.extend(counted.iter().map(|(c, at)| Vote { user_id: &c.user_id, credential: c, at_ms: *at }));
        let scope = Some(submitter.session_scope.as_str()).filter(|s| !s.is_empty());
        let proposal = Proposal { subject, params, submitter: &own.user_id, votes, now_ms, scope };
        let evaluation = decide::decide(state, &loaded.index, &proposal);
        Ok(Decided { loaded: loaded.clone(), evaluation })
    }

    /// Applies `changes` (already checked, or facts the enclave itself made) through the staged
    /// path, like every state change: staged on the heads, committed with the group; when the
    /// group fails on a moved state, staged again on the committed one. Returns the new version
    /// of each organization, in first-appearance order.
    pub fn commit(&self, changes: &[Change]) -> Result<Vec<(String, u64)>, EnclaveError> {
        self.commit_within(changes, &self.limits)
    }

    /// [`Decider::commit`] within `limits`.
    fn commit_within(&self, changes: &[Change], limits: &Limits) -> Result<Vec<(String, u64)>, EnclaveError> {
        for _attempt in 0..8 {
            let pending = {
                let _locked = self.lock_organizations(changes.iter().map(|c| c.organization_id.as_str()))?;
                match self.stage(changes, limits) {
                    Err(e) if is_moved(&e) => continue,
                    other => other?,
                }
            };
            match self.committed(pending) {
                Err(e) if is_moved(&e) => continue,
                other => return other,
            }
        }
        Err(moved())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{SqliteEnclaveStore, StoreLimits};
    use coffer_org_rules::model::{CredentialKind, Organization, User};

    fn rules() -> Decider {
        Decider::new(Arc::new(SqliteEnclaveStore::open_in_memory(StoreLimits::default()).unwrap()))
    }

    fn change(org: &str, effect: Effect) -> Change {
        Change { organization_id: org.into(), effect }
    }

    fn bootstrap(r: &Decider, org: &str) {
        r.commit_all(&[
            change(
                org,
                Effect::CreateOrganization {
                    organization: Organization {
                        id: org.into(),
                        name: org.into(),
                        root_quorum_threshold: 1,
                        root_user_ids: vec!["root".into()],
                        ..Default::default()
                    },
                },
            ),
            change(
                org,
                Effect::PutUser { user: User { id: "root".into(), name: "root".into(), ..Default::default() } },
            ),
            change(
                org,
                Effect::AddCredential {
                    credential: Credential {
                        id: "k".into(),
                        user_id: "root".into(),
                        kind: CredentialKind::ApiKey,
                        credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
                        public_key: "02aa".into(),
                        expires_at_ms: 0,
                    },
                },
            ),
        ])
        .unwrap();
    }

    fn root_vote() -> VerifiedVote {
        VerifiedVote {
            user_id: "root".into(),
            public_key: "02aa".into(),
            credential_type: "CREDENTIAL_TYPE_API_KEY_P256".into(),
            session_scope: String::new(),
            at_ms: 1,
        }
    }

    #[test]
    fn state_survives_a_new_rules_over_the_same_store_and_revocation_takes_effect() {
        let r = rules();
        bootstrap(&r, "o");
        let sign = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
        assert!(r.decide("o", sign, &serde_json::json!({}), &root_vote(), &[], 2).is_ok());
        assert!(matches!(
            r.commit_all(&[change(
                "o",
                Effect::CreateOrganization { organization: Organization { id: "o".into(), ..Default::default() } }
            )]),
            Err(EnclaveError::Refused { reason: RefusalReason::TransitionRefused, .. })
        ));
        r.commit_all(&[change(
            "o",
            Effect::RemoveCredentials { user_id: "root".into(), kind: CredentialKind::ApiKey, ids: vec!["k".into()] },
        )])
        .unwrap();
        let refused = r.decide("o", sign, &serde_json::json!({}), &root_vote(), &[], 2).unwrap_err();
        assert_eq!(refused.reason, RefusalReason::CredentialRevoked);
        let other = Decider::new(r.store().clone());
        assert_eq!(
            other.decide("o", sign, &serde_json::json!({}), &root_vote(), &[], 2).unwrap_err().reason,
            RefusalReason::CredentialRevoked
        );
        assert_eq!(
            other.decide("nope", sign, &serde_json::json!({}), &root_vote(), &[], 2).unwrap_err().reason,
            RefusalReason::OrganizationUnknown
        );
    }

    #[test]
    fn states_committed_or_loaded_stay_within_the_cache_budget_and_evicted_ones_load_again() {
        let budget = 16 * 64 * 1024;
        let r = rules().cache_budget(budget);
        for i in 0..400 {
            bootstrap(&r, &format!("o{i}"));
        }
        let (kept, bytes) = r.cache_usage();
        assert!(bytes <= budget && kept > 16 && kept < 400, "{kept} states, {bytes} bytes");
        // The first ones were committed long ago and are gone from memory, not from the store.
        let sign = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
        for i in 0..400 {
            assert!(r.decide(&format!("o{i}"), sign, &serde_json::json!({}), &root_vote(), &[], 2).is_ok());
        }
        assert!(r.cache_usage().1 <= budget);
    }

    /// Issue 40: a state heavier than half the cache was never kept, so every request of its
    /// organization read and compiled it again, each holding its own copy (the bench's enclave
    /// went from 60 to 750 MiB once one organization's policies passed that weight). A change
    /// that would make a state that heavy is refused; every state within the cap stays cached.
    #[test]
    fn a_state_is_capped_at_the_weight_the_cache_keeps_and_is_never_read_again() {
        let budget = 1 << 20;
        let r = rules().cache_budget(budget).limited(Limits { state_bytes: budget / 2, ..Limits::default() });
        bootstrap(&r, "o");
        let mut made = 0;
        let refusal = loop {
            match r.commit(&[put_user("o", &format!("u{made}"))]) {
                Ok(_) => made += 1,
                Err(e) => break e,
            }
            assert!(made < 10_000, "never refused");
        };
        let loaded = r.load("o").unwrap().unwrap();
        assert_eq!(loaded.state.users.len(), made + 1, "the refused user is not there");
        assert!(matches!(&refusal, EnclaveError::Refused { reason: RefusalReason::LimitExceeded, .. }), "{refusal}");
        assert!(refusal.to_string().contains("state_cache_mib"), "{refusal}");
        assert!(footprint(&loaded) <= budget / 2 && footprint(&loaded) > budget / 2 - 1024);
        // At the cap, it is still kept: deciding reads nothing again.
        let loads = r.loads();
        let sign = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
        for _ in 0..10 {
            assert!(r.decide("o", sign, &serde_json::json!({}), &root_vote(), &[], 2).is_ok());
        }
        assert_eq!(r.loads(), loads, "states read again from the store");
        // Facts of keys already made and linked are recorded past the weight (it was checked
        // before they were made), not past the other caps.
        assert!(r.record(&[put_user("o", "made")]).is_err());
        r.record_made(&[put_user("o", "made")]).unwrap();
        // Shrinking passes, and makes room again.
        r.commit(&[change("o", Effect::DeleteUsers { ids: vec!["u0".into(), "u1".into(), "u2".into()] })]).unwrap();
        r.commit(&[put_user("o", "again")]).unwrap();

        // A sign-up the auth proxy made weighs at most its own cap (an eighth).
        let r = r.limited(Limits { state_bytes: budget / 2, signup_state_bytes: budget / 16, ..Limits::default() });
        let signup = Organization {
            id: "s".into(),
            name: "s".into(),
            parent_id: Some("o".into()),
            auth_proxy_signup: true,
            ..Default::default()
        };
        r.commit(&[change("s", Effect::CreateOrganization { organization: signup })]).unwrap();
        let mut users = 0;
        while r.commit(&[put_user("s", &format!("u{users}"))]).is_ok() {
            users += 1;
        }
        let weight = footprint(&r.load("s").unwrap().unwrap());
        assert!(users < made / 8 && weight <= budget / 16 && weight > budget / 16 - 1024, "{users}, {weight}");
    }

    /// Issue 40: each decision racing a commit of its organization read the whole state again
    /// (the store had the new version before the cache), so a write cost the organization's size.
    /// Decisions while this enclave commits are taken from the cache, and the caps' counts carried
    /// from version to version are those of the state counted whole.
    #[test]
    fn decisions_racing_this_enclave_s_commits_never_read_the_state_again() {
        use coffer_org_rules::model::Policy;
        let r = Arc::new(rules());
        bootstrap(&r, "o");
        let loads = r.loads();
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let id = format!("p{t}-{i}");
                        let policy = Policy {
                            id: id.clone(),
                            name: id,
                            effect: "EFFECT_ALLOW".into(),
                            condition: "false".into(),
                            consensus: String::new(),
                            time: String::new(),
                        };
                        r.commit(&[change("o", Effect::PutPolicy { policy })]).unwrap();
                    }
                })
            })
            .collect();
        let deciders: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..400 {
                        let sign = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
                        assert!(r.decide("o", sign, &serde_json::json!({}), &root_vote(), &[], 2).is_ok());
                    }
                })
            })
            .collect();
        writers.into_iter().chain(deciders).for_each(|t| t.join().unwrap());
        assert_eq!(r.loads(), loads, "states read again from the store");
        let cached = r.load("o").unwrap().unwrap();
        assert_eq!(cached.state.policies.len(), 200);
        assert_eq!(cached.counts, CapCounts::of(&cached.state));
        assert_eq!(Loaded::of(cached.state.clone()).counts, cached.counts);
    }

    fn put_user(org: &str, id: &str) -> Change {
        change(org, Effect::PutUser { user: User { id: id.into(), name: id.into(), ..Default::default() } })
    }

    /// Stages `changes` with their organizations' locks held, as every caller does.
    fn staged(r: &Decider, changes: &[Change]) -> Result<Pending, EnclaveError> {
        let _locked = r.lock_organizations(changes.iter().map(|c| c.organization_id.as_str()))?;
        r.stage(changes, &r.limits())
    }

    /// Stages `changes` and waits for its group commit, deciding again (here: staging again)
    /// whenever the group failed on a moved state.
    fn stage_and_commit(r: &Decider, changes: &[Change]) -> Vec<(String, u64)> {
        loop {
            let pending = { staged(r, changes).unwrap() };
            match r.committed(pending) {
                Ok(versions) => return versions,
                Err(e) if is_moved(&e) => continue,
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Two enclaves (two rules over one store) creating webhook endpoints at once from many
    /// threads: the cap holds, each creation past it is refused as `LimitExceeded`, never
    /// committed; a moved state is decided again on the state the other enclave left.
    #[test]
    fn concurrent_changes_on_two_enclaves_never_pass_a_cap() {
        use coffer_org_rules::model::Named;
        let store: Arc<dyn EnclaveStore> =
            Arc::new(SqliteEnclaveStore::open_in_memory(StoreLimits::default()).unwrap());
        let limits = Limits { webhook_endpoints: 3, ..Limits::default() };
        let enclaves = [Decider::new(store.clone()).limited(limits), Decider::new(store.clone()).limited(limits)];
        bootstrap(&enclaves[0], "o");
        let enclaves = Arc::new(enclaves);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let enclaves = enclaves.clone();
                std::thread::spawn(move || {
                    let endpoint = Named { id: format!("e{t}"), value: "https://x.test/".into() };
                    enclaves[t % 2].commit(&[change("o", Effect::PutWebhookEndpoint { endpoint })])
                })
            })
            .collect();
        let (mut created, mut refused) = (0, 0);
        for t in threads {
            match t.join().unwrap() {
                Ok(_) => created += 1,
                Err(EnclaveError::Refused { reason: RefusalReason::LimitExceeded, .. }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!((created, refused), (3, 5));
        for r in enclaves.iter() {
            assert_eq!(r.load("o").unwrap().unwrap().state.webhook_endpoints.len(), 3);
        }
    }

    #[test]
    fn staged_changes_commit_in_groups_and_a_moved_state_fails_the_group() {
        let r = Arc::new(rules());
        bootstrap(&r, "o");
        let base = r.load("o").unwrap().unwrap().state.version;
        // 8 threads, 10 rounds. In each round every thread stages its change, and only when all 8
        // are staged (the barrier) does each wait for its commit: the first to stage leads, and
        // its group takes every change staged. So each round is one group of 8, one version: no
        // timing is assumed, and a change committed alone would give a round more versions.
        let staged_all = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (r, staged_all) = (r.clone(), staged_all.clone());
                std::thread::spawn(move || {
                    (0..10)
                        .map(|n| {
                            let pending = { staged(&r, &[put_user("o", &format!("u{t}-{n}"))]).unwrap() };
                            staged_all.wait();
                            // Checked once all are joined: a thread that stopped here would
                            // leave the others at the barrier.
                            r.committed(pending).map_err(|e| e.to_string())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let rounds: Vec<_> = (base + 1..=base + 10).map(|v| Ok(vec![("o".to_string(), v)])).collect();
        for (t, thread) in threads.into_iter().enumerate() {
            assert_eq!(
                thread.join().unwrap(),
                rounds,
                "thread {t}: round n of every thread commits as version {base} + n"
            );
        }
        let cached = r.load("o").unwrap().unwrap();
        assert_eq!(cached.state.users.len(), 81, "every staged user is committed");
        // 80 changes, 10 versions: one per group of 8.
        assert_eq!(cached.state.version, base + 10, "one version per group of 8 changes");
        // What the cache holds is what the store has (another enclave reads the same).
        let other = Decider::new(r.store().clone());
        assert_eq!(other.load("o").unwrap().unwrap().state, cached.state);

        // Another enclave commits while a change is staged here: the group fails as moved, the
        // head goes, and the next decision reads the committed state (the other's change, not
        // this one's).
        let pending = { staged(&r, &[put_user("o", "here")]).unwrap() };
        other.commit_all(&[put_user("o", "there")]).unwrap();
        let failed = r.committed(pending).unwrap_err();
        assert!(is_moved(&failed), "{failed}");
        let head = r.head("o").unwrap().loaded.unwrap();
        assert!(head.state.users.contains_key("there") && !head.state.users.contains_key("here"));
        stage_and_commit(&r, &[put_user("o", "here")]);
        let after = other.load("o").unwrap().unwrap();
        assert!(after.state.users.contains_key("there") && after.state.users.contains_key("here"));
        // A change staged on a deleted organization's head is refused, and it cannot come back.
        stage_and_commit(&r, &[change("o", Effect::DeleteOrganization)]);
        assert!(r.load("o").unwrap().is_none());
        assert!(matches!(
            staged(&r, &[put_user("o", "late")]),
            Err(EnclaveError::Refused { reason: RefusalReason::OrganizationUnknown, .. })
        ));
    }

    /// A group's stamps are spent in the transaction that commits it: a stamp the replay window
    /// refuses fails its own change alone (answered as the replay it is), the change staged on it
    /// is decided again, and the rest of the group commits with its stamps spent and its allows
    /// recorded; nothing of the refused one, or of the one staged on it, is kept.
    #[test]
    fn a_refused_stamp_fails_its_change_alone_and_the_rest_of_its_group_commits() {
        use crate::store::{DecisionRecord, LoggedDecision, ReplayShare, OUTCOME_ALLOW};
        let r = rules();
        bootstrap(&r, "a");
        bootstrap(&r, "b");
        let (now, expires) = (1_000, 1_000_000);
        let spend = |org: &str, key: u8| Spend {
            share: ReplayShare::of(org),
            key: [key; 32],
            expires_ms: expires,
            now_ms: now,
            allowed: DecisionRecord {
                at_ms: now,
                organization_id: org.into(),
                operation: "apply_activity".into(),
                fingerprint: format!("f{key}"),
                outcome: OUTCOME_ALLOW.into(),
                ..Default::default()
            },
        };
        // A twin spent the stamp of key 2 already.
        assert_eq!(r.store().remember("a", [2; 32], expires, now).unwrap(), Remembered::Fresh);
        let vb = r.load("b").unwrap().unwrap().state.version;
        let stage = |changes: &[Change], spent: Spend| {
            let _locked = r.lock_organizations(changes.iter().map(|c| c.organization_id.as_str())).unwrap();
            let prepared = r.prepare(changes, None, &r.limits()).unwrap();
            r.stage_prepared_spending(prepared, Some(spent)).unwrap()
        };
        // One group: b1 (leads), a1 (its stamp replayed), a2 (staged on a1), b2.
        let b1 = stage(&[put_user("b", "b1")], spend("b", 1));
        let a1 = stage(&[put_user("a", "a1")], spend("a", 2));
        let a2 = stage(&[put_user("a", "a2")], spend("a", 3));
        let b2 = stage(&[put_user("b", "b2")], spend("b", 4));
        // A twin of a staged stamp is refused before it is staged (in the group it would move b1
        // and b2), and so is a twin of one committed lately, below.
        let twin = |key: u8| {
            let _locked = r.lock_organizations(["b"]).unwrap();
            let prepared = r.prepare(&[put_user("b", "twin")], None, &r.limits()).unwrap();
            r.stage_prepared_spending(prepared, Some(spend("b", key))).map(|_| ())
        };
        let replayed = |e: EnclaveError| matches!(e, EnclaveError::Refused { reason: RefusalReason::Replayed, .. });
        assert!(replayed(twin(1).unwrap_err()));
        assert_eq!(r.committed(b1).unwrap(), vec![("b".to_string(), vb + 1)]);
        assert!(matches!(r.committed(a1).unwrap_err(), EnclaveError::Refused { reason: RefusalReason::Replayed, .. }));
        assert!(is_moved(&r.committed(a2).unwrap_err()));
        assert_eq!(r.committed(b2).unwrap(), vec![("b".to_string(), vb + 1)], "one transaction for b1 and b2");
        // What the store has: b's two users, their stamps spent and allowed; nothing of a's.
        let other = Decider::new(r.store().clone());
        let (a, b) = (other.load("a").unwrap().unwrap(), other.load("b").unwrap().unwrap());
        assert!(b.state.users.contains_key("b1") && b.state.users.contains_key("b2"));
        assert!(!a.state.users.contains_key("a1") && !a.state.users.contains_key("a2"));
        let head = r.head("a").unwrap().loaded.unwrap();
        assert!(!head.state.users.contains_key("a1"), "the refused change's head is gone");
        for key in [1, 4] {
            assert_eq!(r.store().remember("b", [key; 32], expires, now).unwrap(), Remembered::Replayed);
            let decided = r.store().decided("b", &format!("f{key}")).unwrap();
            assert_eq!(decided.logged, LoggedDecision::Authorized);
        }
        assert_eq!(r.store().decided("a", "f3").unwrap().logged, LoggedDecision::Nothing);
        assert!(replayed(twin(4).unwrap_err()), "committed lately");
        // Decided again, a2 commits alone with its stamp, which it let go when it was moved.
        let a2 = stage(&[put_user("a", "a2")], spend("a", 3));
        assert_eq!(r.committed(a2).unwrap().len(), 1);
        assert!(other.load("a").unwrap().unwrap().state.users.contains_key("a2"));
    }

    /// A change of organization A being decided (its lock held from its head to its staging, as
    /// `apply_activity` holds it across a policy evaluation) holds no change of organization B:
    /// B's change stages and commits while A's decision is still running, and A's then commits
    /// on the head it read. With one lock for every organization (what the enclave had before),
    /// B waits for A and this fails.
    #[test]
    fn a_slow_decision_of_one_organization_holds_no_change_of_another() {
        let r = Arc::new(rules());
        bootstrap(&r, "a");
        // An organization whose lock is not A's (two ids share one with a chance of 1 in 256).
        let b = (0..).map(|i| format!("b{i}")).find(|b| r.lock_slot(b) != r.lock_slot("a")).unwrap();
        bootstrap(&r, &b);
        let (deciding, b_done) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<Vec<(String, u64)>>());
        let (deciding_tx, deciding_rx) = deciding;
        let (b_done_tx, b_done_rx) = b_done;
        let slow = {
            let r = r.clone();
            std::thread::spawn(move || {
                let _locked = r.lock_organizations(["a"]).unwrap();
                let head = r.head("a").unwrap();
                deciding_tx.send(()).unwrap();
                // The decision runs until B's change is committed (or gives up: B was held).
                let b_committed = b_done_rx.recv_timeout(std::time::Duration::from_secs(30));
                let pending = r.stage_decided("a", &head, &[put_user("a", "slow")]).unwrap();
                drop(_locked);
                (b_committed.is_ok(), r.committed(pending).unwrap())
            })
        };
        deciding_rx.recv().unwrap();
        let versions = r.commit(&[put_user(&b, "quick")]).unwrap();
        b_done_tx.send(versions.clone()).unwrap();
        let (b_committed_meanwhile, a_versions) = slow.join().unwrap();
        assert!(b_committed_meanwhile, "B's change waited for A's decision");
        assert_eq!(versions, vec![(b.clone(), 2)]);
        assert_eq!(a_versions, vec![("a".to_string(), 2)]);
        assert!(r.load("a").unwrap().unwrap().state.users.contains_key("slow"));
        assert!(r.load(&b).unwrap().unwrap().state.users.contains_key("quick"));
    }

    /// Requests that miss one organization's state at once read it from the store once: the
    /// others wait for that load and take it from the cache. Without the load lock each of the 8
    /// reads and compiles it.
    #[test]
    fn a_state_missed_by_many_at_once_is_loaded_once() {
        let r = rules();
        bootstrap(&r, "o");
        for round in 0..5 {
            // Another enclave over the same store: its cache is empty.
            let other = Arc::new(Decider::new(r.store().clone()));
            let all = Arc::new(std::sync::Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (other, all) = (other.clone(), all.clone());
                    std::thread::spawn(move || {
                        all.wait();
                        other.load("o").unwrap().unwrap().state.version
                    })
                })
                .collect();
            for t in threads {
                assert_eq!(t.join().unwrap(), 1);
            }
            assert_eq!(other.loads(), 1, "round {round}: one load for 8 requests");
        }
    }

    /// A change staged on an organization by a caller that did not hold its lock, between a
    /// decision's head and its staging, makes that decision's state moved: it is decided again.
    #[test]
    fn a_change_staged_after_the_head_was_read_moves_the_decision() {
        let r = rules();
        bootstrap(&r, "o");
        let head = r.head("o").unwrap();
        let first = r.stage_decided("o", &head, &[put_user("o", "first")]).unwrap();
        let late = r.stage_decided("o", &head, &[put_user("o", "late")]).unwrap_err();
        assert!(is_moved(&late), "{late}");
        assert_eq!(r.committed(first).unwrap(), vec![("o".to_string(), 2)]);
        let now = r.head("o").unwrap().loaded.unwrap();
        assert!(now.state.users.contains_key("first") && !now.state.users.contains_key("late"));
    }

    /// A change prepared, then staged after the head it was built on was committed (its stamp
    /// was being spent meanwhile), is moved on its own: it never reaches a group that its stale
    /// base version would fail for every member.
    #[test]
    fn a_prepared_change_whose_head_was_committed_meanwhile_is_moved_alone() {
        let r = rules();
        bootstrap(&r, "o");
        // Built on a staged head that is committed before it is staged.
        let first = r.stage_decided("o", &r.head("o").unwrap(), &[put_user("o", "first")]).unwrap();
        let head = r.head("o").unwrap();
        let on_staged = r.prepare_decided("o", &head, &[put_user("o", "second")]).unwrap();
        assert_eq!(r.committed(first).unwrap(), vec![("o".to_string(), 2)]);
        assert!(is_moved(&r.stage_prepared(on_staged).unwrap_err()));
        // Built on the committed state, which another change of this enclave moves before it is
        // staged.
        let head = r.head("o").unwrap();
        let on_committed = r.prepare_decided("o", &head, &[put_user("o", "third")]).unwrap();
        r.commit(&[put_user("o", "between")]).unwrap();
        assert!(is_moved(&r.stage_prepared(on_committed).unwrap_err()));
        // Prepared and staged with nothing in between, it commits.
        let head = r.head("o").unwrap();
        let prepared = r.prepare_decided("o", &head, &[put_user("o", "second")]).unwrap();
        let pending = r.stage_prepared(prepared).unwrap();
        assert_eq!(r.committed(pending).unwrap(), vec![("o".to_string(), 4)]);
    }

    /// A change is written only onto the state it was decided on: when the staged head it was
    /// decided on is gone (its group failed) or the committed state it was decided on was replaced
    /// by another enclave, the change is decided again; it is never applied to a state whose
    /// credentials, policies or facts its decision did not read.
    #[test]
    fn a_change_is_never_staged_on_another_state_than_its_decision_read() {
        let r = rules();
        bootstrap(&r, "o");
        let other = Decider::new(r.store().clone());
        // Decided on a staged head whose group then fails (another enclave moved the state).
        let first = staged(&r, &[put_user("o", "staged-first")]).unwrap();
        let on_staged = r.head("o").unwrap();
        assert!(on_staged.loaded.as_ref().unwrap().state.users.contains_key("staged-first"));
        other.commit_all(&[put_user("o", "elsewhere")]).unwrap();
        assert!(is_moved(&r.committed(first).unwrap_err()));
        let late = r.stage_decided("o", &on_staged, &[put_user("o", "decided-on-staged")]).unwrap_err();
        assert!(is_moved(&late), "{late}");
        // Decided on the committed state, which another enclave then replaces: the commit's
        // compare-and-set on the version decided on refuses it, instead of the change being
        // applied to the newer state.
        let on_committed = r.head("o").unwrap();
        other.commit_all(&[put_user("o", "revoked-meanwhile")]).unwrap();
        let pending = r.stage_decided("o", &on_committed, &[put_user("o", "decided-on-old")]).unwrap();
        assert!(is_moved(&r.committed(pending).unwrap_err()));
        let now = r.head("o").unwrap().loaded.unwrap();
        assert!(now.state.users.contains_key("revoked-meanwhile"));
        for never in ["staged-first", "decided-on-staged", "decided-on-old"] {
            assert!(!now.state.users.contains_key(never), "{never} was applied");
        }
    }

    #[test]
    fn a_deleted_organization_is_unknown_and_cannot_come_back() {
        let r = rules();
        bootstrap(&r, "o");
        r.commit_all(&[change("o", Effect::DeleteOrganization)]).unwrap();
        assert!(r.load("o").unwrap().is_none());
        let again = Effect::CreateOrganization { organization: Organization { id: "o".into(), ..Default::default() } };
        assert!(matches!(
            r.commit_all(&[change("o", again)]),
            Err(EnclaveError::Refused { reason: RefusalReason::TransitionRefused, .. })
        ));
    }
}
