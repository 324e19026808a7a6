//! The gateway's side of the policy engine: it reads from the store the facts `coffer-policy`
//! evaluates (policies, approvers, the wallet or key an activity touches) and applies the
//! root-quorum rules around the engine's decision.

use coffer_policy::context::{
    self, ActivityFacts, ApproverFacts, OrganizationFacts, PrivateKeyFacts, WalletFacts, VOTE_APPROVED,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use coffer_policy::decision::{self, CompiledPolicy, Decision, Evaluation, PolicySource};
use serde_json::Value;

use crate::error::ApiError;
use crate::record_kinds::POLICY;
use crate::store::{found, Nanos, Organization, PrivateKey, SignWithKey, Store, StoreError, Wallet, WalletAccount};

/// The words of every refusal by the organization's policies (the reason is in the audit logs).
pub const NOT_AUTHORIZED: &str = "request not authorized";
pub const ROOT_ONLY: &str = "request not authorized: only root quorum users may submit this activity";

/// What the root-quorum rule decides for a root-quorum-only activity with only its submitter's
/// vote: it runs when the threshold is 1 and waits above 1 ([`evaluate`] is the general rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootQuorum {
    Run,
    ConsensusNeeded,
}

/// Only root users may submit root-quorum-only activities (others: 403).
pub fn root_quorum(org: &Organization, user_id: &str) -> Result<RootQuorum, ApiError> {
    if !org.root_user_ids.iter().any(|u| u == user_id) {
        return Err(ApiError::forbidden(ROOT_ONLY));
    }
    Ok(if org.root_quorum_threshold > 1 { RootQuorum::ConsensusNeeded } else { RootQuorum::Run })
}

/// What an activity type is to the policy engine: the type, its policy resource and action
/// (spec 12.4), and whether only the root quorum decides it.
#[derive(Debug, Clone, Copy)]
pub struct Subject {
    pub activity_type: &'static str,
    pub resource: &'static str,
    pub action: &'static str,
    pub root_quorum: bool,
}

/// What the policy engine needs to know about an activity and its votes.
pub struct Proposal<'a> {
    pub subject: Subject,
    /// Intent parameters (nulls stripped).
    pub params: &'a Value,
    /// Every vote so far, the new one included.
    pub votes: &'a Value,
    /// The user who submitted it.
    pub submitter: &'a str,
    pub now: Nanos,
}

/// What the root-quorum rules alone decide, before any policy: `None` when the organization's
/// policies must be evaluated ([`evaluate`]). Cheap and read-free, so it runs on the request's
/// thread.
fn root_decision(org: &Organization, p: &Proposal<'_>) -> Option<Evaluation> {
    let approvals = context::live_votes(p.votes, VOTE_APPROVED, p.now);
    let voters = context::voter_ids(&approvals);
    let roots = voters.iter().filter(|v| org.root_user_ids.contains(v)).count() as i64;
    if roots >= org.root_quorum_threshold.max(1) {
        return Some(Evaluation::root(Decision::Allow, "ROOT_QUORUM"));
    }
    if p.subject.root_quorum {
        return Some(if roots > 0 {
            Evaluation::root(Decision::ConsensusNeeded, "ROOT_QUORUM_PENDING")
        } else {
            Evaluation::root(Decision::Deny, "ROOT_QUORUM_ONLY")
        });
    }
    None
}

/// Decides an activity (spec 12.2): root-quorum-only activities need the root quorum and
/// nothing else; others go through the organization's policies. A root user's activity that
/// the root quorum could still approve waits for it rather than being denied.
///
/// Synchronous and unbounded in time (it reads the store and runs the policies): the gateway
/// calls it through [`decide`], on the evaluation pool.
pub fn evaluate(store: &dyn Store, org: &Organization, p: &Proposal<'_>) -> Result<Evaluation, StoreError> {
    if let Some(e) = root_decision(org, p) {
        return Ok(e);
    }
    let approvals = context::live_votes(p.votes, VOTE_APPROVED, p.now);
    let voters = context::voter_ids(&approvals);
    let roots = voters.iter().filter(|v| org.root_user_ids.contains(v)).count() as i64;
    let set = policy_set(store, &org.id)?;
    let policies = set.applicable(p.subject.activity_type, p.subject.resource, p.subject.action);
    let facts = ActivityFacts {
        activity_type: p.subject.activity_type,
        resource: p.subject.resource,
        action: p.subject.action,
        params: p.params,
        approvals,
        now: p.now,
    };
    let org_facts = organization_facts(store, &org.id, p.params, &voters)?;
    let ctx = context::build(&facts, &org_facts);
    let implicit = context::own_credentials(p.subject.activity_type, p.params, p.submitter);
    let compiled: Vec<&CompiledPolicy> = policies.iter().map(|e| e.compiled.as_ref()).collect();
    let mut e = decision::decide(&compiled, &ctx, false, implicit);
    name_outcomes(&mut e, &policies)?;
    if e.decision == Decision::Deny && roots > 0 {
        // The root quorum bypasses every policy: more root votes can still run it.
        e.decision = Decision::ConsensusNeeded;
        e.reason = "ROOT_QUORUM_PENDING";
    }
    Ok(e)
}

/// The compiled policies are shared between policies with the same source (their id and name
/// left empty): each outcome gets the id and name of the policy at its position back.
fn name_outcomes(e: &mut Evaluation, policies: &[&PolicyEntry]) -> Result<(), StoreError> {
    if e.outcomes.len() != policies.len() {
        // Fail closed rather than attribute an outcome to the wrong policy.
        return Err(StoreError::Backend(format!(
            "policy engine answered {} outcomes for {} policies",
            e.outcomes.len(),
            policies.len()
        )));
    }
    for (o, p) in e.outcomes.iter_mut().zip(policies) {
        o.policy_id = p.id.clone();
        o.policy_name = p.name.clone();
    }
    Ok(())
}

/// [`evaluate`] off the request's thread: root-quorum decisions at once, policies on the
/// evaluation pool ([`EvalPool`]) within the organization's share of it. Past the pool's wait
/// (`policy_queue_timeout_ms`) the request is shed with the 503 of an overloaded gateway.
pub async fn decide(store: &Arc<dyn Store>, org: &Organization, p: &Proposal<'_>) -> Result<Evaluation, ApiError> {
    if let Some(e) = root_decision(org, p) {
        return Ok(e);
    }
    let (store, org) = (store.clone(), org.clone());
    let (params, votes, submitter) = (p.params.clone(), p.votes.clone(), p.submitter.to_string());
    let (subject, now) = (p.subject, p.now);
    let org_id = org.id.clone();
    pool()
        .run(&org_id, move || {
            let p = Proposal { subject, params: &params, votes: &votes, submitter: &submitter, now };
            evaluate(store.as_ref(), &org, &p)
        })
        .await?
        .map_err(Into::into)
}

/// The settings of policy evaluation (see README "Operating limits").
#[derive(Debug, Clone)]
pub struct PolicySettings {
    /// Threads of the evaluation pool: evaluations run at once.
    pub threads: usize,
    /// Evaluations of one organization at once (at least 1, at most `threads`).
    pub per_organization: usize,
    /// Longest wait for an evaluation slot before the request is shed with a 503.
    pub queue_timeout: Duration,
    /// Bound of the compiled-policy cache, in estimated bytes ([`estimated_bytes`]).
    pub cache_bytes: usize,
    /// Policies one organization may have; `create_policy(ies)` past it is refused with a 400.
    pub max_policies_per_organization: usize,
}

impl PolicySettings {
    /// From the configuration: 0 threads is the machine's cores, 0 per organization is half
    /// the pool (at least 1).
    pub fn new(
        threads: usize,
        per_organization: usize,
        queue_timeout_ms: u64,
        cache_bytes: usize,
        max_policies: usize,
    ) -> Self {
        let threads = match threads {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            n => n,
        };
        let per_organization = match per_organization {
            0 => (threads / 2).max(1),
            n => n.min(threads),
        };
        Self {
            threads,
            per_organization,
            queue_timeout: Duration::from_millis(queue_timeout_ms),
            cache_bytes,
            max_policies_per_organization: max_policies,
        }
    }
}

impl Default for PolicySettings {
    fn default() -> Self {
        Self::new(0, 0, DEFAULT_QUEUE_TIMEOUT_MS, DEFAULT_CACHE_BYTES, DEFAULT_MAX_POLICIES)
    }
}

pub const DEFAULT_QUEUE_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_CACHE_BYTES: usize = 256 * 1024 * 1024;
pub const DEFAULT_MAX_POLICIES: usize = 100_000;

static SETTINGS: OnceLock<PolicySettings> = OnceLock::new();

/// Sets the process's policy settings; the first call wins (the gateway calls it at start,
/// before serving). Without it the defaults apply.
pub fn configure(settings: PolicySettings) {
    let _ = SETTINGS.set(settings);
}

fn settings() -> &'static PolicySettings {
    SETTINGS.get_or_init(PolicySettings::default)
}

fn pool() -> &'static EvalPool {
    static POOL: OnceLock<EvalPool> = OnceLock::new();
    POOL.get_or_init(|| EvalPool::new(settings()))
}

type Job = Box<dyn FnOnce() + Send>;

/// The evaluation pool: `threads` OS threads of their own (not the request executor's workers,
/// so a long evaluation never delays `/healthz` or another request), a slot per thread, and a
/// per-organization share of the slots. A request waits for its organization's share first and
/// a slot second, both in arrival order, holding no thread while it waits; so an organization
/// with many expensive evaluations queues behind itself and leaves the other slots to others.
pub struct EvalPool {
    jobs: Mutex<std::sync::mpsc::Sender<Job>>,
    slots: Arc<tokio::sync::Semaphore>,
    per_org: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    per_org_limit: usize,
    wait: Duration,
}

/// The request class named by the 503 of a shed evaluation.
struct PolicyEvaluation;

impl std::fmt::Debug for PolicyEvaluation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("policy evaluation")
    }
}

impl EvalPool {
    fn new(s: &PolicySettings) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..s.threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("coffer-policy-{i}"))
                // The evaluator recurses over the expression (nesting is bounded by the parser).
                .stack_size(8 * 1024 * 1024)
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    match job {
                        // A panic drops the job's reply: that request fails, the thread stays.
                        Ok(job) => {
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                        }
                        Err(_) => return,
                    }
                })
                .expect("spawn a policy evaluation thread");
        }
        Self {
            jobs: Mutex::new(tx),
            slots: Arc::new(tokio::sync::Semaphore::new(s.threads.max(1))),
            per_org: Mutex::new(HashMap::new()),
            per_org_limit: s.per_organization.max(1),
            wait: s.queue_timeout,
        }
    }

    /// Runs `f` on the pool within `org`'s share; a 503 if no slot came within the wait.
    pub async fn run<T: Send + 'static>(
        &'static self,
        org: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let share = {
            let mut map = self.per_org.lock().map_err(|_| ApiError::internal())?;
            map.entry(org.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.per_org_limit)))
                .clone()
        };
        let started = std::time::Instant::now();
        let acquired = tokio::time::timeout(self.wait, async {
            let mine = share.clone().acquire_owned().await.ok()?;
            let slot = self.slots.clone().acquire_owned().await.ok()?;
            Some((mine, slot))
        })
        .await;
        drop(share);
        let Ok(Some((mine, slot))) = acquired else {
            self.forget_idle(org);
            crate::metrics::observe_policy_evaluation_shed();
            return Err(ApiError::overloaded(PolicyEvaluation));
        };
        crate::metrics::observe_policy_evaluation_wait(started.elapsed());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let org_id = org.to_string();
        let job: Job = Box::new(move || {
            let t = std::time::Instant::now();
            let out = f();
            crate::metrics::observe_policy_evaluation(t.elapsed());
            // The slots are the thread's: they are given back when the work ends, even when the
            // request stopped waiting for it.
            drop((mine, slot));
            self.forget_idle(&org_id);
            let _ = tx.send(out);
        });
        self.jobs.lock().map_err(|_| ApiError::internal())?.send(job).map_err(|_| ApiError::internal())?;
        rx.await.map_err(|_| ApiError::internal())
    }

    /// Drops an organization's share once nobody holds or waits for it (every holder and waiter
    /// keeps a clone), so the map holds only the organizations being evaluated.
    fn forget_idle(&self, org: &str) {
        if let Ok(mut map) = self.per_org.lock() {
            if map.get(org).is_some_and(|s| Arc::strong_count(s) == 1) {
                map.remove(org);
            }
        }
    }
}

/// The 403 of a denied activity.
pub fn denied(e: &Evaluation) -> ApiError {
    if e.reason == "ROOT_QUORUM_ONLY" {
        ApiError::forbidden(ROOT_ONLY)
    } else {
        ApiError::forbidden(NOT_AUTHORIZED)
    }
}

/// One policy of a set: its id and name, and the compiled form of its source, shared with every
/// policy whose effect and expressions are the same (its `source.id` and `source.name` are empty).
pub struct PolicyEntry {
    /// Shared with the outcomes that name the policy.
    pub id: Arc<str>,
    pub name: Arc<str>,
    pub compiled: Arc<CompiledPolicy>,
}

/// An organization's policies, compiled, with an index by the activity type their condition
/// requires (`coffer_policy::scope`).
pub struct PolicySet {
    /// `records_version` of the policies this set was built from.
    version: (i64, i64),
    policies: Vec<PolicyEntry>,
    /// Activity type → positions of the policies that require it.
    by_type: HashMap<String, Vec<usize>>,
    /// Positions of the policies that require no particular type.
    any_type: Vec<usize>,
    /// What the set is charged in the cache ([`estimated_bytes`]).
    bytes: usize,
}

impl PolicySet {
    fn new(version: (i64, i64), policies: Vec<PolicyEntry>) -> Self {
        let (mut by_type, mut any_type) = (HashMap::<String, Vec<usize>>::new(), Vec::new());
        for (i, p) in policies.iter().enumerate() {
            match &p.compiled.scope.types {
                Some(types) => types.iter().for_each(|t| by_type.entry(t.clone()).or_default().push(i)),
                None => any_type.push(i),
            }
        }
        // A compiled policy shared inside the set is charged once.
        let mut seen = std::collections::HashSet::new();
        let bytes = policies
            .iter()
            .map(|p| {
                let compiled =
                    if seen.insert(Arc::as_ptr(&p.compiled)) { compiled_bytes(&p.compiled.source) } else { 0 };
                ENTRY_BYTES + p.id.len() + p.name.len() + compiled
            })
            .sum();
        Self { version, policies, by_type, any_type, bytes }
    }

    /// The policies that can apply to an activity, in the organization's order: the ones left out
    /// could only come out "condition false" (or an error), which no decision counts, so the
    /// decision is the same and the cost follows the policies that can apply.
    pub fn applicable(&self, activity_type: &str, resource: &str, action: &str) -> Vec<&PolicyEntry> {
        let typed = self.by_type.get(activity_type).map(Vec::as_slice).unwrap_or_default();
        let mut positions: Vec<usize> = typed.iter().chain(&self.any_type).copied().collect();
        positions.sort_unstable();
        positions.dedup();
        positions
            .into_iter()
            .map(|i| &self.policies[i])
            .filter(|p| p.compiled.scope.admits(activity_type, resource, action))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// What the set is charged in the cache, in estimated bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Estimated bytes of a compiled policy per byte of its expressions' source: the parsed tree of
/// the densest source, a literal list of one-digit numbers (`[0,0,…]`, one node per two bytes),
/// measured 86 (a 0.96 MB list took 83 MB); other shapes measured 27 to 61.
pub const COMPILED_BYTES_PER_SOURCE_BYTE: usize = 96;
/// Estimated fixed bytes of a compiled policy (the struct, its strings' headers, its scope).
const COMPILED_BYTES: usize = 1024;
/// Estimated fixed bytes of a policy's place in a set (its id, name and index positions).
const ENTRY_BYTES: usize = 160;

/// The estimate a compiled policy is charged in the cache.
pub fn compiled_bytes(s: &PolicySource) -> usize {
    let source = s.effect.len() + s.condition.len() + s.consensus.len() + s.time.len();
    COMPILED_BYTES + COMPILED_BYTES_PER_SOURCE_BYTE * source
}

/// The key compiled policies are shared by: a SHA-256 of the effect and the three expressions.
fn source_key(s: &PolicySource) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for part in [&*s.effect, &s.condition, &s.consensus, &s.time] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// Organization → its policy set, least recently used first out, bounded by the sets' estimated
/// bytes; and the compiled policies by source, held weakly (a compiled policy lives as long as a
/// set, cached or being evaluated, uses it).
#[derive(Default)]
struct PolicyCache {
    sets: HashMap<String, (Arc<PolicySet>, u64)>,
    bytes: usize,
    clock: u64,
    compiled: HashMap<[u8; 32], Weak<CompiledPolicy>>,
    /// Size of `compiled` after its last sweep of dead entries.
    swept: usize,
}

impl PolicyCache {
    /// Caches `set` for `org` and evicts the least recently used sets past `budget`. A set larger
    /// than the whole budget is not cached (it is compiled again for each evaluation).
    fn insert(&mut self, org: &str, set: Arc<PolicySet>, budget: usize) {
        if let Some((old, _)) = self.sets.remove(org) {
            self.bytes -= old.bytes;
        }
        if set.bytes <= budget {
            self.clock += 1;
            self.bytes += set.bytes;
            self.sets.insert(org.to_string(), (set, self.clock));
        }
        while self.bytes > budget {
            let Some(oldest) = self.sets.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) else {
                break;
            };
            if let Some((s, _)) = self.sets.remove(&oldest) {
                self.bytes -= s.bytes;
            }
        }
        crate::metrics::observe_policy_cache_bytes(self.bytes);
        if self.compiled.len() > 2 * self.swept + 1024 {
            self.compiled.retain(|_, c| c.strong_count() > 0);
            self.swept = self.compiled.len();
        }
    }
}

fn cache() -> &'static Mutex<PolicyCache> {
    static CACHE: OnceLock<Mutex<PolicyCache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(PolicyCache::default()))
}

/// Estimated bytes of the compiled-policy cache, now.
pub fn cached_bytes() -> usize {
    cache().lock().map(|c| c.bytes).unwrap_or(0)
}

/// The organization's policy set. Each submission asks the store only for the set's version (an
/// index walk); the policies are read and indexed again only when one was added, changed or
/// removed (or the set was evicted), and a source already compiled is not parsed again.
pub fn policy_set(store: &dyn Store, org: &str) -> Result<Arc<PolicySet>, StoreError> {
    policy_set_within(store, org, settings().cache_bytes)
}

fn policy_set_within(store: &dyn Store, org: &str, budget: usize) -> Result<Arc<PolicySet>, StoreError> {
    let poisoned = || StoreError::Backend("policy cache lock poisoned".into());
    let version = store.records_version(org, POLICY)?;
    {
        let mut cache = cache().lock().map_err(|_| poisoned())?;
        cache.clock += 1;
        let clock = cache.clock;
        if let Some((set, used)) = cache.sets.get_mut(org) {
            if set.version == version {
                *used = clock;
                return Ok(set.clone());
            }
        }
    }
    // Read and compiled outside the lock (a policy takes long to parse); a concurrent change
    // only means a rebuild on the next call.
    let records = store.records(org, POLICY)?;
    let mut policies = Vec::with_capacity(records.len());
    for r in &records {
        let source = PolicySource::from_json(&r.id, &r.name, &r.data);
        let key = source_key(&source);
        let shared = {
            let cache = cache().lock().map_err(|_| poisoned())?;
            cache.compiled.get(&key).and_then(Weak::upgrade).filter(|c| {
                let s = &c.source;
                (&s.effect, &s.condition, &s.consensus, &s.time)
                    == (&source.effect, &source.condition, &source.consensus, &source.time)
            })
        };
        let compiled = match shared {
            Some(c) => c,
            None => {
                let c = Arc::new(CompiledPolicy::compile(PolicySource {
                    id: "".into(),
                    name: "".into(),
                    ..source.clone()
                }));
                let mut cache = cache().lock().map_err(|_| poisoned())?;
                // Another thread may have compiled the same source meanwhile: keep one.
                cache
                    .compiled
                    .entry(key)
                    .and_modify(|w| {
                        if w.strong_count() == 0 {
                            *w = Arc::downgrade(&c)
                        }
                    })
                    .or_insert_with(|| Arc::downgrade(&c));
                c
            }
        };
        policies.push(PolicyEntry { id: source.id, name: source.name, compiled });
    }
    let set = Arc::new(PolicySet::new(version, policies));
    cache().lock().map_err(|_| poisoned())?.insert(org, set.clone(), budget);
    Ok(set)
}

/// Refuses (400) `adding` more policies when the organization would then have more than
/// `max_policies_per_organization`: an early answer from the gateway's records, before any work.
/// It is not the cap: concurrent creations can all pass it. The enclave decides the cap (its own
/// `max_policies_per_organization`) on the state each change commits on.
pub fn check_policy_count(store: &dyn Store, org: &str, adding: usize) -> Result<(), ApiError> {
    let max = settings().max_policies_per_organization;
    let (count, _) = store.records_version(org, POLICY)?;
    let count = usize::try_from(count).unwrap_or(0);
    if count.saturating_add(adding) > max {
        return Err(ApiError::invalid(format!(
            "too many policies: an organization may have at most {max} (it has {count}, this adds {adding}; \
             see max_policies_per_organization)"
        )));
    }
    Ok(())
}

fn wallet_facts(w: &Wallet) -> WalletFacts {
    WalletFacts { id: w.id.clone(), label: w.name.clone(), imported: w.imported, exported: w.exported }
}

fn private_key_facts(k: &PrivateKey) -> PrivateKeyFacts {
    PrivateKeyFacts {
        id: k.id.clone(),
        label: k.name.clone(),
        tags: k.tags.clone(),
        imported: k.imported,
        exported: k.exported,
    }
}

/// Reads what the policies of one activity may name: its approvers, and the wallet, account or
/// private key its parameters touch (`signWith` resolved by [`crate::store::sign_with_key`]).
pub fn organization_facts(
    store: &dyn Store,
    org: &str,
    params: &Value,
    voters: &[String],
) -> Result<OrganizationFacts, StoreError> {
    let mut facts = OrganizationFacts::default();
    for id in voters {
        let Some(u) = found(store.user(org, id))? else { continue };
        facts.approvers.push(ApproverFacts {
            tags: store.user_tags_of(org, id)?,
            email: u.email.unwrap_or_default(),
            alias: u.name,
            id: u.id,
        });
    }
    let text = |k: &str| params.get(k).and_then(Value::as_str);
    let put_account = |facts: &mut OrganizationFacts, a: WalletAccount| -> Result<(), StoreError> {
        facts.wallet = found(store.wallet(org, &a.wallet_id))?.as_ref().map(wallet_facts).or(facts.wallet.take());
        facts.wallet_account = Some(a.address);
        Ok(())
    };
    // The signer's Ethereum address, for `eth.tx.from`.
    let mut signer = None;
    if let Some(sw) = text("signWith") {
        match crate::store::sign_with_key(store, org, sw)? {
            Some(SignWithKey::Account(a)) => {
                signer = (a.address_format == "ADDRESS_FORMAT_ETHEREUM").then(|| a.address.clone());
                put_account(&mut facts, a)?
            }
            Some(SignWithKey::PrivateKey { key, .. }) => {
                signer =
                    key.addresses.iter().find(|e| e.format == "ADDRESS_FORMAT_ETHEREUM").map(|e| e.address.clone());
                facts.private_key = Some(private_key_facts(&key))
            }
            None => {}
        }
    }
    if let Some(address) = text("address") {
        if let Some(a) = found(store.account_by_address(org, address))? {
            put_account(&mut facts, a)?;
        }
    }
    if let Some(id) = text("walletId") {
        if let Some(w) = found(store.wallet(org, id))? {
            facts.wallet = Some(wallet_facts(&w));
        }
    }
    if let Some(id) = text("privateKeyId") {
        if let Some(k) = found(store.private_key(org, id))? {
            facts.private_key = Some(private_key_facts(&k));
        }
    }
    facts.transaction = crate::tx_facts::transaction_facts(store, org, params, signer.as_deref())?;
    facts.payload = coffer_chain::payload_facts(params);
    if let Some(ids) = params.get("walletIds").and_then(Value::as_array) {
        let mut ws = Vec::new();
        for id in ids.iter().filter_map(Value::as_str) {
            if let Some(w) = found(store.wallet(org, id))? {
                ws.push(wallet_facts(&w));
            }
        }
        facts.wallets = Some(ws);
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::{Record, SqliteStore, Write};

    #[test]
    fn policies_are_compiled_once_per_version() {
        let dir = std::env::temp_dir().join(format!("coffer-policy-cache-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("coffer.db")).unwrap();
        let org = Organization {
            id: "org".into(),
            name: "org".into(),
            parent_id: None,
            root_quorum_threshold: 1,
            root_user_ids: vec![],
            created_at: 0,
            updated_at: 0,
        };
        let policy = |condition: &str, at: i64| {
            Write::PutRecord(Record {
                organization_id: "org".into(),
                kind: "policy".into(),
                id: "p1".into(),
                name: "p".into(),
                data: json!({"effect": "EFFECT_ALLOW", "condition": condition, "consensus": "", "time": ""}),
                created_at: 1,
                updated_at: at,
            })
        };
        store.apply(&[Write::InsertOrganization(org), policy("true", 7)]).unwrap();
        let first = policy_set(&store, "org").unwrap();
        let again = policy_set(&store, "org").unwrap();
        assert_eq!(first.len(), 1);
        assert!(Arc::ptr_eq(&first, &again), "an unchanged policy set is not read or parsed again");
        store.apply(&[policy("false", 9)]).unwrap();
        let changed = policy_set(&store, "org").unwrap();
        assert!(!Arc::ptr_eq(&first.policies[0].compiled, &changed.policies[0].compiled));
        assert_eq!(changed.policies[0].compiled.source.condition, "false");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn open_store(name: &str) -> (std::path::PathBuf, SqliteStore) {
        let dir = std::env::temp_dir().join(format!("coffer-{name}-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("coffer.db")).unwrap();
        (dir, store)
    }

    fn put_org(store: &SqliteStore, org: &str, conditions: &[&str]) {
        let o = Organization {
            id: org.into(),
            name: org.into(),
            parent_id: None,
            root_quorum_threshold: 1,
            root_user_ids: vec![],
            created_at: 0,
            updated_at: 0,
        };
        let mut writes = vec![Write::InsertOrganization(o)];
        for (i, c) in conditions.iter().enumerate() {
            writes.push(Write::PutRecord(Record {
                organization_id: org.into(),
                kind: "policy".into(),
                id: format!("{org}-p{i}"),
                name: format!("policy {i}"),
                data: json!({"effect": "EFFECT_ALLOW", "condition": c, "consensus": "", "time": ""}),
                created_at: 1,
                updated_at: 1 + i as i64,
            }));
        }
        store.apply(&writes).unwrap();
    }

    #[test]
    fn the_cache_is_charged_by_bytes_shares_sources_and_evicts_the_least_recently_used() {
        let (dir, store) = open_store("policy-bytes");
        let big = format!("[{}0].count() > 0", "0,".repeat(999));
        // Org a: the same big source twice (one compilation, charged once) and a small one.
        put_org(&store, "bytes-a", &[&big, &big, "true"]);
        put_org(&store, "bytes-b", &[&big]);
        put_org(&store, "bytes-c", &["false"]);
        let a = policy_set_within(&store, "bytes-a", usize::MAX).unwrap();
        assert!(Arc::ptr_eq(&a.policies[0].compiled, &a.policies[1].compiled), "one source, one compilation");
        let source = |c: &str| PolicySource {
            id: "".into(),
            name: "".into(),
            effect: "EFFECT_ALLOW".into(),
            condition: c.into(),
            consensus: String::new(),
            time: String::new(),
        };
        let entries: usize = a.policies.iter().map(|p| ENTRY_BYTES + p.id.len() + p.name.len()).sum();
        assert_eq!(a.bytes(), entries + compiled_bytes(&source(&big)) + compiled_bytes(&source("true")));
        assert_eq!(compiled_bytes(&source(&big)), COMPILED_BYTES + COMPILED_BYTES_PER_SOURCE_BYTE * (12 + big.len()));
        // Another organization with the same source shares its compilation too.
        let b = policy_set_within(&store, "bytes-b", usize::MAX).unwrap();
        assert!(Arc::ptr_eq(&a.policies[0].compiled, &b.policies[0].compiled));
        // Outcomes carry each policy's own id and name, not the shared compilation's (empty).
        assert!(b.policies[0].compiled.source.id.is_empty());
        let entries: Vec<&PolicyEntry> = a.policies.iter().collect();
        let compiled: Vec<&CompiledPolicy> = entries.iter().map(|e| e.compiled.as_ref()).collect();
        let mut e = decision::decide(&compiled, &Default::default(), false, false);
        name_outcomes(&mut e, &entries).unwrap();
        let named: Vec<(&str, &str)> = e.outcomes.iter().map(|o| (&*o.policy_id, &*o.policy_name)).collect();
        assert_eq!(named, [("bytes-a-p0", "policy 0"), ("bytes-a-p1", "policy 1"), ("bytes-a-p2", "policy 2")]);
        assert!(name_outcomes(&mut e, &entries[..2]).is_err(), "outcomes that do not match the policies fail closed");

        // Least recently used first out, on a cache of its own: a budget that holds a and b but
        // not c too. a, c, then a again: c is the least recently used when b comes.
        let c = policy_set_within(&store, "bytes-c", usize::MAX).unwrap();
        let mut cache = PolicyCache::default();
        let budget = a.bytes() + b.bytes();
        cache.insert("a", a.clone(), budget);
        cache.insert("c", c.clone(), budget);
        cache.clock += 1;
        let clock = cache.clock;
        cache.sets.get_mut("a").unwrap().1 = clock;
        cache.insert("b", b.clone(), budget);
        let mut cached: Vec<&str> = cache.sets.keys().map(String::as_str).collect();
        cached.sort_unstable();
        assert_eq!(cached, ["a", "b"]);
        assert_eq!(cache.bytes, a.bytes() + b.bytes());
        // A set larger than the whole budget is not cached, and pushes nothing out.
        cache.insert("huge", a.clone(), b.bytes().min(a.bytes()) - 1);
        assert!(!cache.sets.contains_key("huge"));
        assert_eq!(cache.bytes, 0, "a budget below every set empties the cache");
        // Replacing an organization's set charges the new one only.
        cache.insert("a", a.clone(), usize::MAX);
        cache.insert("a", c.clone(), usize::MAX);
        assert_eq!(cache.bytes, c.bytes());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn an_organization_gets_its_share_of_the_pool_and_no_more() {
        let pool: &'static EvalPool = Box::leak(Box::new(EvalPool::new(&PolicySettings::new(2, 1, 300, 0, 0))));
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel();
        let first = tokio::spawn(pool.run("x", move || {
            let _ = started.send(std::thread::current().name().map(String::from));
            held.recv().ok();
            1
        }));
        let thread = running.await.unwrap();
        assert!(thread.is_some_and(|t| t.starts_with("coffer-policy-")), "runs on the pool's own threads");
        // x holds its one slot: its next evaluation waits, then is shed with the 503.
        let e = pool.run("x", || 2).await.unwrap_err();
        assert_eq!(e.retry_after, Some(1));
        assert!(e.message.contains("too many policy evaluation requests"), "{}", e.message);
        // y gets the other thread meanwhile.
        assert_eq!(pool.run("y", || 3).await.unwrap(), 3);
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        // Once x's evaluation ended, its share is free again, and nothing is kept for idle ones.
        assert_eq!(pool.run("x", || 4).await.unwrap(), 4);
        assert!(pool.per_org.lock().unwrap().is_empty());
        // A panicking evaluation fails its request only; the pool goes on.
        assert!(pool.run("x", || panic!("evaluation bug")).await.is_err());
        assert_eq!(pool.run("x", || 5).await.unwrap(), 5);
    }

    #[test]
    fn the_index_leaves_out_only_policies_that_cannot_apply() {
        let compile = |id: &str, effect: &str, condition: &str| PolicyEntry {
            id: id.into(),
            name: id.into(),
            compiled: Arc::new(CompiledPolicy::compile(PolicySource {
                id: "".into(),
                name: "".into(),
                effect: effect.into(),
                condition: condition.into(),
                consensus: String::new(),
                time: String::new(),
            })),
        };
        let sign = "ACTIVITY_TYPE_SIGN_RAW_PAYLOAD_V2";
        let set = PolicySet::new(
            (4, 1),
            vec![
                compile("deny-sign", "EFFECT_DENY", &format!("activity.type == '{sign}'")),
                compile("allow-wallets", "EFFECT_ALLOW", "activity.resource == 'WALLET'"),
                compile("allow-all", "EFFECT_ALLOW", "true"),
                compile("broken", "EFFECT_ALLOW", "activity.type == "),
            ],
        );
        let ids = |ps: Vec<&PolicyEntry>| ps.iter().map(|p| p.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(set.applicable(sign, "PRIVATE_KEY", "SIGN")), ["deny-sign", "allow-all", "broken"]);
        assert_eq!(
            ids(set.applicable("ACTIVITY_TYPE_CREATE_WALLET", "WALLET", "CREATE")),
            ["allow-wallets", "allow-all", "broken"]
        );
        assert_eq!(ids(set.applicable("ACTIVITY_TYPE_CREATE_USERS", "USER", "CREATE")), ["allow-all", "broken"]);
    }
}
