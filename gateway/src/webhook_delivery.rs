//! Webhook deliveries: the events an activity change enqueues (outbox rows written in the same
//! transaction as the change), and the worker that posts them, signed by the enclave's HSM key,
//! retrying with backoff until delivered or given up.
//!
//! A committed event reaches the worker in memory at once; its outbox row is leased for
//! [`LEASE`] meanwhile, so the outbox poll only sees retries that came due and events whose
//! hand-off was lost (a crash, a full queue). Leases are in the gateway's instance id: at start
//! the worker releases its own, so what a killed gateway had in hand is delivered again (at least
//! once) when it comes back, and by any gateway once its lease lapses; a due retry is claimed by
//! one gateway's poll only.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::activity::render;
use crate::record_kinds::WEBHOOK_ENDPOINT;
use crate::state::AppState;
use crate::store::{
    now_nanos, ActivityRecord, DueSkip, Nanos, Organization, Store, StoreError, WebhookAttempt, WebhookDelivery, Write,
    DELIVERY_DELIVERED, DELIVERY_FAILED, DELIVERY_PENDING,
};
use crate::webhook_endpoint::{check_target, endpoint_json, is_forbidden_address, EventFilter, ACTIVITY_UPDATES};

/// How long a fresh event handed to the worker in memory stays out of the outbox poll.
pub const LEASE: Duration = Duration::from_secs(60);

/// One delivery to attempt, with its endpoint's URL as read when the event was enqueued (good
/// while no endpoint has changed since: see [`Outbox::committed`]).
struct Job {
    delivery: WebhookDelivery,
    url: Option<(String, u64)>,
}

/// Bumped after every commit that changes a webhook endpoint: a URL read before is stale.
static ENDPOINTS_GENERATION: AtomicU64 = AtomicU64::new(0);
/// Fresh events, from the committing request to the worker.
static HANDOFF: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
/// This gateway's instance id, in which the deliveries its worker holds are leased.
static INSTANCE: OnceLock<String> = OnceLock::new();

/// [`INSTANCE`] (empty before the worker starts, when nothing is leased).
fn instance() -> &'static str {
    INSTANCE.get().map(String::as_str).unwrap_or_default()
}

/// What an activity change means for webhooks: the events it enqueues (outbox rows for its
/// transaction), and whether it changes an endpoint. [`Outbox::committed`] once it committed.
pub struct Outbox {
    jobs: Vec<Job>,
    changes_endpoints: bool,
}

impl Outbox {
    /// The events of `activity` as it is about to be committed with `writes`: one per active
    /// endpoint of its organization, or of the parent organization, with an active
    /// `ACTIVITY_UPDATES` subscription whose filter passes. Paused endpoints and subscriptions get
    /// nothing (not even later).
    /// The [`Outbox::for_activity`] of an organization known to have no webhook endpoint, nor a
    /// parent with one: no events; only whether `writes` change an endpoint.
    pub fn without_endpoints(writes: &[Write]) -> Outbox {
        Outbox { jobs: Vec::new(), changes_endpoints: changes_endpoints(writes) }
    }

    pub fn for_activity(
        store: &dyn Store,
        org: &Organization,
        activity: &ActivityRecord,
        writes: &[Write],
    ) -> Result<Outbox, StoreError> {
        let changes_endpoints = changes_endpoints(writes);
        // Read before the endpoints: a change committed after this is seen by the worker.
        let generation = ENDPOINTS_GENERATION.load(Ordering::Acquire);
        let mut endpoints = store.records(&org.id, WEBHOOK_ENDPOINT)?;
        if let Some(parent) = &org.parent_id {
            endpoints.extend(store.records(parent, WEBHOOK_ENDPOINT)?);
        }
        if endpoints.is_empty() {
            return Ok(Outbox { jobs: Vec::new(), changes_endpoints });
        }
        let body = render::activity(activity, false).to_string();
        let now = now_nanos();
        let jobs = endpoints
            .iter()
            .map(endpoint_json)
            .filter(|e| e["isActive"].as_bool() == Some(true))
            .filter(|e| {
                e["subscriptions"].as_array().is_some_and(|subs| {
                    subs.iter().any(|s| {
                        s["eventType"] == ACTIVITY_UPDATES
                            && s["isActive"].as_bool() != Some(false)
                            && EventFilter::parse(s["filtersJson"].as_str().unwrap_or_default())
                                .is_ok_and(|f| f.admits(&activity.activity_type, &activity.status))
                    })
                })
            })
            .map(|e| Job {
                delivery: WebhookDelivery {
                    // The endpoint is the activity's organization's (charged to its top level)
                    // or its parent's (a top-level organization: sub-organizations have none).
                    top_level_id: match e["organizationId"].as_str() {
                        Some(owner) if owner == org.id => org.parent_id.clone().unwrap_or_else(|| org.id.clone()),
                        owner => owner.unwrap_or_default().to_string(),
                    },
                    id: uuid::Uuid::new_v4().to_string(),
                    organization_id: e["organizationId"].as_str().unwrap_or_default().to_string(),
                    endpoint_id: e["endpointId"].as_str().unwrap_or_default().to_string(),
                    activity_organization_id: activity.organization_id.clone(),
                    activity_id: activity.id.clone(),
                    event_type: ACTIVITY_UPDATES.to_string(),
                    body: body.clone(),
                    status: DELIVERY_PENDING.to_string(),
                    attempts: 0,
                    next_attempt_at: now + LEASE.as_nanos() as Nanos,
                    last_status_code: None,
                    last_error: None,
                    created_at: now,
                    updated_at: now,
                    leased_by: INSTANCE.get().cloned(),
                },
                url: e["url"].as_str().map(|u| (u.to_string(), generation)),
            })
            .collect();
        Ok(Outbox { jobs, changes_endpoints })
    }

    /// The outbox rows to write in the activity's transaction.
    pub fn writes(&self) -> impl Iterator<Item = Write> + '_ {
        self.jobs.iter().map(|j| Write::EnqueueWebhookDelivery(j.delivery.clone()))
    }

    /// The transaction committed: endpoint URLs read before are stale if it changed an
    /// endpoint, and its events go to the worker (one it cannot take now waits out its lease).
    pub fn committed(self) {
        if self.changes_endpoints {
            ENDPOINTS_GENERATION.fetch_add(1, Ordering::AcqRel);
        }
        if let Some(tx) = HANDOFF.get() {
            for job in self.jobs {
                if tx.try_send(job).is_err() {
                    tracing::debug!("webhook hand-off queue full: the event is delivered when its lease ends");
                }
            }
        }
    }
}

/// Whether `writes` change a webhook endpoint (or drop deliveries).
fn changes_endpoints(writes: &[Write]) -> bool {
    writes.iter().any(|w| match w {
        Write::PutRecord(r) => r.kind == WEBHOOK_ENDPOINT,
        Write::DeleteRecords { kind, .. } => kind == WEBHOOK_ENDPOINT,
        Write::DeleteSubOrganization { .. } | Write::DropWebhookDeliveries { .. } => true,
        _ => false,
    })
}

/// Delivery timing (see docs/features.md "Webhooks").
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub first_retry: Duration,
    pub max_backoff: Duration,
    pub give_up_after: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            first_retry: Duration::from_secs(1),
            max_backoff: Duration::from_secs(15 * 60),
            give_up_after: Duration::from_secs(24 * 3600),
        }
    }
}

impl Schedule {
    /// When to try again after `attempts` failed attempts (doubling from `first_retry`, capped,
    /// with ±25 % jitter), or `None` once the delivery is older than `give_up_after`.
    pub fn next(&self, attempts: i64, created_at: Nanos, now: Nanos, jitter: f64) -> Option<Nanos> {
        let age = Duration::from_nanos((now - created_at).max(0) as u64);
        if age >= self.give_up_after {
            return None;
        }
        let doubled = self.first_retry.saturating_mul(1u32 << (attempts.clamp(1, 31) - 1) as u32);
        let backoff = doubled.min(self.max_backoff).mul_f64(0.75 + 0.5 * jitter.clamp(0.0, 1.0));
        Some(now + backoff.as_nanos() as Nanos)
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Delivered(u16),
    /// Worth another attempt: connection error, timeout, 5xx, the enclave unavailable.
    Retry(Option<u16>, String),
    /// 3xx, 4xx (429 included), a target that is not allowed: no more attempts.
    Terminal(Option<u16>, String),
}

fn classify(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered(status),
        500..=599 => Outcome::Retry(Some(status), format!("HTTP {status}")),
        _ => Outcome::Terminal(Some(status), format!("HTTP {status}")),
    }
}

/// Resolves webhook hosts and refuses names that point at an address a webhook may not reach.
struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            if !allow_private && addrs.iter().any(|a| is_forbidden_address(a.ip())) {
                return Err(format!(
                    "{} resolves to a loopback, private, link-local or metadata address",
                    name.as_str()
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Deliveries in flight at once, and per endpoint (one slow endpoint cannot take every worker).
const WORKERS: usize = 256;
const PER_ENDPOINT: usize = 64;
/// Deliveries in flight at once to the endpoints of one top-level organization and its
/// sub-organizations together. Within what is free, workers go to whoever has fewest in flight
/// ([`Waiting::pop_fairest`]).
const PER_TOP_LEVEL: usize = WORKERS / 2;
/// Events waiting for a worker, all endpoints together; beyond this they wait out their lease.
const MAX_WAITING: usize = 65_536;
/// Top-level organizations the outbox read leaves out for their crowded waiting queues, at most.
const CROWDED_LEFT_OUT: usize = 64;
/// Events waiting for a worker, per endpoint; beyond this they wait out their lease.
const WAITING_PER_ENDPOINT: usize = 4096;
/// Fresh events in the hand-off queue at most.
const HANDOFF_CAPACITY: usize = 16_384;
/// How often the outbox is read for retries come due and lapsed leases.
const POLL: Duration = Duration::from_millis(100);
/// How long the worker lets work gather after a wake before it hands out a batch.
const GATHER: Duration = Duration::from_millis(3);
/// Deliveries signed by the enclave in one call at most (its limit is 256).
const SIGN_BATCH: usize = 64;
/// Most response body read from a receiver.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Attempts recorded in one transaction at most, and how long the recorder lets them gather.
const RECORD_BATCH: usize = 1024;
const RECORD_GATHER: Duration = Duration::from_millis(20);

/// Wakes the worker: an attempt is over, so a worker is free.
static FREED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Whom an attempt in flight is charged to: its endpoint's top-level organization, the
/// endpoint's organization, the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Charge {
    top_level: String,
    organization: String,
    endpoint: String,
}

impl Charge {
    fn of(job: &Job) -> Self {
        let d = &job.delivery;
        // A delivery enqueued before its top level was recorded: charged to its organization.
        let top_level = if d.top_level_id.is_empty() { &d.organization_id } else { &d.top_level_id };
        Self { top_level: top_level.clone(), organization: d.organization_id.clone(), endpoint: d.endpoint_id.clone() }
    }
}

/// Deliveries the worker holds (waiting or in flight, until their attempt is recorded), and the
/// attempts in flight: each with its charge, and how many each top-level organization,
/// organization and endpoint has.
#[derive(Default)]
struct Held {
    ids: HashSet<String>,
    /// In flight: delivery id → its charge (kept per attempt, so what an attempt took is what
    /// its end gives back).
    charged: HashMap<String, Charge>,
    by_top_level: HashMap<String, usize>,
    by_organization: HashMap<String, usize>,
    by_endpoint: HashMap<String, usize>,
}

fn count(map: &HashMap<String, usize>, key: &str) -> usize {
    map.get(key).copied().unwrap_or(0)
}

fn add(map: &mut HashMap<String, usize>, key: &str) {
    *map.entry(key.to_string()).or_default() += 1;
}

fn sub(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Held {
    /// Attempts in flight.
    fn in_flight(&self) -> usize {
        self.charged.len()
    }

    /// The attempt of delivery `id` starts, charged to `c`.
    fn started(&mut self, id: &str, c: Charge) {
        add(&mut self.by_top_level, &c.top_level);
        add(&mut self.by_organization, &c.organization);
        add(&mut self.by_endpoint, &c.endpoint);
        if let Some(old) = self.charged.insert(id.to_string(), c) {
            // Cannot happen (a delivery is held once); give back what the old charge took.
            self.give_back(&old);
        }
    }

    /// The attempt of delivery `id` is over (its record may still be on the way): its worker is
    /// free, and its charge given back.
    fn finished(&mut self, id: &str) {
        if let Some(c) = self.charged.remove(id) {
            self.give_back(&c);
        }
    }

    fn give_back(&mut self, c: &Charge) {
        sub(&mut self.by_top_level, &c.top_level);
        sub(&mut self.by_organization, &c.organization);
        sub(&mut self.by_endpoint, &c.endpoint);
    }
}

/// A finished attempt on its way to the store: (delivery id, attempt).
type Done = (String, WebhookAttempt);

/// Where a finished attempt goes: its worker is free at once, its record goes to the recorder.
#[derive(Clone)]
struct Finish {
    held: Arc<Mutex<Held>>,
    done: mpsc::UnboundedSender<Done>,
}

impl Finish {
    fn over(&self, d: WebhookDelivery, attempt: WebhookAttempt) {
        let outcome = match attempt.status.as_str() {
            DELIVERY_DELIVERED => "delivered",
            DELIVERY_PENDING => "retry",
            _ => "failed",
        };
        crate::metrics::metrics().webhook_attempts.get_or_create(&crate::metrics::OutcomeLabel { outcome }).inc();
        if let Ok(mut h) = self.held.lock() {
            h.finished(&d.id);
        }
        FREED.notify_one();
        let _ = self.done.send((d.id, attempt));
    }

    /// The delivery is not this gateway's to send any more (its lease lapsed and another may
    /// have claimed it): its worker is free and nothing is recorded.
    fn released(&self, d: WebhookDelivery) {
        if let Ok(mut h) = self.held.lock() {
            h.finished(&d.id);
            h.ids.remove(&d.id);
        }
        FREED.notify_one();
    }
}

/// Starts the delivery worker on the current runtime; it runs for the life of the process.
pub fn spawn(state: Arc<AppState>, name: String) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let allow_private = state.webhooks.allow_private_targets;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .dns_resolver(Arc::new(GuardedResolver { allow_private }))
        .user_agent("coffer-webhooks/1")
        .build()?;
    if INSTANCE.set(name).is_err() {
        anyhow::bail!("the webhook delivery worker is already running");
    }
    // What a previous process of this name held in memory is due now.
    match state.store.release_webhook_leases(now_nanos(), instance()) {
        Ok(0) => {}
        Ok(n) => tracing::info!(deliveries = n, "webhook deliveries of an earlier run are due again"),
        Err(e) => tracing::warn!(error = %e, "releasing webhook leases failed; they are due when they lapse"),
    }
    let (handoff, mut fresh) = mpsc::channel::<Job>(HANDOFF_CAPACITY);
    if HANDOFF.set(handoff).is_err() {
        anyhow::bail!("the webhook delivery worker is already running");
    }
    let held: Arc<Mutex<Held>> = Arc::default();
    // Attempts are recorded in batches, one transaction each, by one task.
    let (done_tx, done_rx) = mpsc::unbounded_channel::<Done>();
    tokio::spawn(record_attempts(state.clone(), done_rx, held.clone()));
    let finish = Finish { held: held.clone(), done: done_tx };
    Ok(tokio::spawn(async move {
        let mut waiting = Waiting::default();
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut arrived = Vec::new();
            tokio::select! {
                job = fresh.recv() => match job {
                    Some(job) => arrived.push(job),
                    None => return,
                },
                _ = FREED.notified() => {}
                _ = poll.tick() => {
                    // Jobs parked behind a cap do not stop the read: they are not what the
                    // workers would take next.
                    let runnable = held.lock().map_or(WORKERS, |h| waiting.runnable(&h));
                    if runnable < WORKERS {
                        arrived.extend(due(&state, &held, &waiting).await);
                    }
                }
            }
            // A moment for more events and freed workers to gather: the enclave signs them in one
            // call, and its per-call cost is most of the cost of a signature.
            tokio::time::sleep(GATHER).await;
            while let Ok(job) = fresh.try_recv() {
                arrived.push(job);
            }
            {
                let Ok(mut h) = held.lock() else { return };
                for job in arrived {
                    let id = job.delivery.id.clone();
                    if h.ids.insert(id.clone()) && !waiting.push(job) {
                        h.ids.remove(&id);
                    }
                }
            }
            let Some(batches) = take_ready(&held, &mut waiting) else { return };
            for batch in batches {
                tokio::spawn(deliver_batch(state.clone(), client.clone(), batch, finish.clone()));
            }
        }
    }))
}

/// Jobs waiting for a worker, by the top-level organization they are charged to, then endpoint.
#[derive(Default)]
struct Waiting {
    by_top_level: HashMap<String, HashMap<String, VecDeque<Job>>>,
    len: usize,
}

impl Waiting {
    /// Queues `job`, unless its endpoint has [`WAITING_PER_ENDPOINT`] waiting or all endpoints
    /// [`MAX_WAITING`] together (then it waits out its lease in the outbox).
    fn push(&mut self, job: Job) -> bool {
        if self.len >= MAX_WAITING {
            return false;
        }
        let c = Charge::of(&job);
        let queue = self.by_top_level.entry(c.top_level).or_default().entry(c.endpoint).or_default();
        if queue.len() >= WAITING_PER_ENDPOINT {
            return false;
        }
        queue.push_back(job);
        self.len += 1;
        true
    }

    /// Waiting jobs that could start once workers are free (their top-level organization and
    /// endpoint below their caps): what gates the outbox read, so jobs parked behind a cap do not
    /// stop it.
    fn runnable(&self, h: &Held) -> usize {
        self.by_top_level
            .iter()
            .filter(|(top, _)| count(&h.by_top_level, top) < PER_TOP_LEVEL)
            .flat_map(|(_, endpoints)| endpoints.iter())
            .filter(|(endpoint, _)| count(&h.by_endpoint, endpoint) < PER_ENDPOINT)
            .map(|(_, queue)| queue.len())
            .sum()
    }

    /// Top-level organizations with a worker's worth of jobs waiting (or more), most first, at
    /// most [`CROWDED_LEFT_OUT`]: the outbox read leaves their deliveries out until they drain.
    fn crowded(&self) -> Vec<String> {
        let mut crowded: Vec<(usize, &String)> = self
            .by_top_level
            .iter()
            .map(|(top, endpoints)| (endpoints.values().map(VecDeque::len).sum::<usize>(), top))
            .filter(|(n, _)| *n >= WORKERS)
            .collect();
        crowded.sort_unstable_by(|a, b| b.cmp(a));
        crowded.into_iter().take(CROWDED_LEFT_OUT).map(|(_, top)| top.clone()).collect()
    }

    /// The next job to start: of the top-level organization with fewest attempts in flight
    /// (below its cap), then of its organization with fewest, then its endpoint with fewest
    /// (below its cap). A capped top-level organization costs nothing to pass over, however many
    /// endpoints it has waiting.
    fn pop_fairest(&mut self, h: &Held) -> Option<Job> {
        let mut tops: Vec<(usize, &String)> = self
            .by_top_level
            .keys()
            .map(|top| (count(&h.by_top_level, top), top))
            .filter(|(n, _)| *n < PER_TOP_LEVEL)
            .collect();
        tops.sort_unstable();
        let (top, endpoint) = tops.into_iter().find_map(|(_, top)| {
            let best = self.by_top_level[top]
                .iter()
                .filter(|(endpoint, _)| count(&h.by_endpoint, endpoint) < PER_ENDPOINT)
                .filter_map(|(endpoint, queue)| {
                    let organization = &queue.front()?.delivery.organization_id;
                    Some(((count(&h.by_organization, organization), count(&h.by_endpoint, endpoint)), endpoint))
                })
                .min()?;
            Some((top.clone(), best.1.clone()))
        })?;
        let endpoints = self.by_top_level.get_mut(&top)?;
        let queue = endpoints.get_mut(&endpoint)?;
        let job = queue.pop_front()?;
        if queue.is_empty() {
            endpoints.remove(&endpoint);
        }
        if endpoints.is_empty() {
            self.by_top_level.remove(&top);
        }
        self.len -= 1;
        Some(job)
    }
}

/// Due deliveries from the outbox that the worker does not hold, leaving out endpoints and
/// top-level organizations at their cap and top-level organizations with crowded waiting
/// queues (bounded lists, whatever a tenant spreads its backlog over), so one endpoint's or one
/// tenant's backlog does not fill the read; claimed for [`LEASE`]: another gateway's worker
/// polling the same outbox does not get them.
async fn due(state: &Arc<AppState>, held: &Mutex<Held>, waiting: &Waiting) -> Vec<Job> {
    let skip = match held.lock() {
        Ok(h) => {
            let full = |m: &HashMap<String, usize>, cap: usize| -> Vec<String> {
                m.iter().filter(|(_, n)| **n >= cap).map(|(k, _)| k.clone()).collect()
            };
            let mut top_levels = full(&h.by_top_level, PER_TOP_LEVEL);
            top_levels.extend(waiting.crowded().into_iter().filter(|t| count(&h.by_top_level, t) < PER_TOP_LEVEL));
            DueSkip { endpoints: full(&h.by_endpoint, PER_ENDPOINT), top_levels }
        }
        Err(_) => return Vec::new(),
    };
    let now = now_nanos();
    let lease = (now + LEASE.as_nanos() as Nanos, instance());
    match state.db(|s| s.claim_due_webhook_deliveries(now, lease, 2 * WORKERS, &skip)).await {
        Ok(Ok(due)) => {
            let Ok(h) = held.lock() else { return Vec::new() };
            due.into_iter().filter(|d| !h.ids.contains(&d.id)).map(|delivery| Job { delivery, url: None }).collect()
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reading due webhook deliveries failed");
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

/// Takes waiting jobs while workers are free, one at a time, each to whoever has fewest in
/// flight ([`Waiting::pop_fairest`]). So a tenant's stalling endpoints, however many
/// organizations it spreads them over, hold at most its top-level share, and within it only the
/// workers its siblings are not asking for; a newcomer's delivery takes the next worker that
/// frees. In batches for the enclave; `None` if the bookkeeping lock is poisoned.
fn take_ready(held: &Mutex<Held>, waiting: &mut Waiting) -> Option<Vec<Vec<Job>>> {
    let mut h = held.lock().ok()?;
    crate::metrics::metrics().webhook_held.set(h.ids.len() as i64);
    let mut batches = vec![Vec::new()];
    while h.in_flight() < WORKERS {
        let Some(job) = waiting.pop_fairest(&h) else { break };
        h.started(&job.delivery.id, Charge::of(&job));
        if batches.last().is_some_and(|b| b.len() >= SIGN_BATCH) {
            batches.push(Vec::new());
        }
        batches.last_mut()?.push(job);
    }
    batches.retain(|b| !b.is_empty());
    Some(batches)
}

/// Records finished attempts in batches; a delivery leaves the worker's hands only once its
/// attempt is recorded (until then the outbox may still show it due).
async fn record_attempts(state: Arc<AppState>, mut done: mpsc::UnboundedReceiver<Done>, held: Arc<Mutex<Held>>) {
    while let Some(first) = done.recv().await {
        // Attempts gather for a moment: fewer, larger transactions write fewer pages.
        tokio::time::sleep(RECORD_GATHER).await;
        let mut batch = vec![first];
        while batch.len() < RECORD_BATCH {
            match done.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
        let s = state.clone();
        let result = tokio::task::spawn_blocking(move || s.store.record_webhook_attempts(&batch))
            .await
            .unwrap_or_else(|_| Err(StoreError::Backend("recording task failed".into())));
        if let Err(e) = result {
            tracing::warn!(error = %e, n = ids.len(), "recording webhook attempts failed");
        }
        if let Ok(mut h) = held.lock() {
            for id in &ids {
                h.ids.remove(id);
            }
        }
    }
}

/// The jobs of `batch` this gateway may send. A job whose lease ends within half a lease (it
/// waited in a slow endpoint's backlog) has it renewed first, and is dropped if that fails: its
/// lease may have lapsed and another gateway claimed it. An attempt (at most 15 s) started with
/// half a lease left ends before the lease does, so the usual job costs no store call here.
async fn still_held(state: &Arc<AppState>, batch: Vec<Job>, finish: &Finish) -> Vec<Job> {
    let now = now_nanos();
    let (mut fresh, stale): (Vec<Job>, Vec<Job>) =
        batch.into_iter().partition(|j| j.delivery.next_attempt_at - now > LEASE.as_nanos() as Nanos / 2);
    if stale.is_empty() {
        return fresh;
    }
    let ids: Vec<String> = stale.iter().map(|j| j.delivery.id.clone()).collect();
    let lease_until = now + LEASE.as_nanos() as Nanos;
    let renew = move |s: &dyn crate::store::Store| s.renew_webhook_leases(&ids, (lease_until, instance()));
    let renewed: HashSet<String> = match state.db(renew).await {
        Ok(Ok(renewed)) => renewed.into_iter().collect(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "renewing webhook leases failed; the deliveries are sent when they lapse");
            HashSet::new()
        }
        Err(_) => HashSet::new(),
    };
    for mut job in stale {
        if renewed.contains(&job.delivery.id) {
            job.delivery.next_attempt_at = lease_until;
            fresh.push(job);
        } else {
            finish.released(job.delivery);
        }
    }
    fresh
}

/// One attempt of each delivery in `batch`: the endpoint's current URL and state, the enclave's
/// signatures over a fresh timestamp (one call for the batch), then each POST on its own task.
async fn deliver_batch(state: Arc<AppState>, client: reqwest::Client, batch: Vec<Job>, finish: Finish) {
    let schedule = Schedule::default();
    let started = Instant::now();
    let batch = still_held(&state, batch, &finish).await;
    let generation = ENDPOINTS_GENERATION.load(Ordering::Acquire);
    // Endpoints read from the store for this batch (a batch of retries often shares one).
    let mut read: HashMap<(String, String), Result<String, Outcome>> = HashMap::new();
    let mut to_sign = Vec::with_capacity(batch.len());
    for job in batch {
        let url = match job.url {
            Some((url, read_at)) if read_at == generation => Ok(url),
            _ => {
                let key = (job.delivery.organization_id.clone(), job.delivery.endpoint_id.clone());
                if !read.contains_key(&key) {
                    let url = endpoint_url(&state, &job.delivery).await;
                    read.insert(key.clone(), url);
                }
                read[&key].clone()
            }
        };
        let target = url.and_then(|u| {
            check_target(&u, state.webhooks.allow_private_targets).map_err(|e| Outcome::Terminal(None, e.0))
        });
        match target {
            Ok(url) => to_sign.push((job.delivery, url)),
            Err(outcome) => {
                let attempt = attempt_record(&job.delivery, outcome, started, now_nanos(), &schedule);
                finish.over(job.delivery, attempt);
            }
        }
    }
    if to_sign.is_empty() {
        return;
    }
    let timestamp_ms = (now_nanos() / 1_000_000) as u64;
    let request = coffer_proto::v1::SignWebhookDeliveriesRequest {
        deliveries: to_sign
            .iter()
            .map(|(d, _)| coffer_proto::v1::SignWebhookDeliveryRequest {
                timestamp_ms,
                event_id: d.id.clone(),
                body: d.body.as_bytes().to_vec(),
            })
            .collect(),
    };
    let signed = match state.custody.sign_webhook_deliveries(request).await {
        Ok(r) => r,
        Err(e) => {
            let why = format!("enclave could not sign: {}", e.message);
            for (d, _) in to_sign {
                let attempt = attempt_record(&d, Outcome::Retry(None, why.clone()), started, now_nanos(), &schedule);
                finish.over(d, attempt);
            }
            return;
        }
    };
    let mut signatures = signed.deliveries.into_iter();
    for (d, url) in to_sign {
        let signature = signatures.next().unwrap_or_default();
        let (client, finish, key_id) = (client.clone(), finish.clone(), signed.key_id.clone());
        tokio::spawn(async move {
            let at = now_nanos();
            let outcome = if signature.signature.len() == 64 {
                post(&client, &d, url, &key_id, timestamp_ms, &signature.signature).await
            } else {
                Outcome::Retry(None, format!("enclave refused to sign: {}", signature.refusal))
            };
            let attempt = attempt_record(&d, outcome, started, at, &schedule);
            finish.over(d, attempt);
        });
    }
}

/// The endpoint's URL as stored now, or how the attempt ends if it is paused or gone.
async fn endpoint_url(state: &Arc<AppState>, d: &WebhookDelivery) -> Result<String, Outcome> {
    match state.db(|s| s.record(&d.organization_id, WEBHOOK_ENDPOINT, &d.endpoint_id)).await {
        Ok(Ok(e)) if e.data["isActive"].as_bool() == Some(false) => {
            Err(Outcome::Terminal(None, "endpoint paused before delivery".into()))
        }
        Ok(Ok(e)) => Ok(e.data["url"].as_str().unwrap_or_default().to_string()),
        Ok(Err(StoreError::NotFound)) => Err(Outcome::Terminal(None, "endpoint deleted".into())),
        _ => Err(Outcome::Retry(None, "store unavailable".into())),
    }
}

/// The record of one attempt: when, how it ended, and when the next one is due (if any).
fn attempt_record(
    d: &WebhookDelivery,
    outcome: Outcome,
    started: Instant,
    at: Nanos,
    schedule: &Schedule,
) -> WebhookAttempt {
    let duration_ms = started.elapsed().as_millis() as i64;
    let (status, next_attempt_at, status_code, error) = match outcome {
        Outcome::Delivered(code) => (DELIVERY_DELIVERED, at, Some(code), None),
        Outcome::Terminal(code, e) => (DELIVERY_FAILED, at, code, Some(e)),
        Outcome::Retry(code, e) => {
            let jitter = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
            match schedule.next(d.attempts + 1, d.created_at, at, jitter) {
                Some(next) => (DELIVERY_PENDING, next, code, Some(e)),
                None => (DELIVERY_FAILED, at, code, Some(format!("{e}; gave up after {:?}", schedule.give_up_after))),
            }
        }
    };
    WebhookAttempt {
        at,
        status_code: status_code.map(i64::from),
        error,
        duration_ms,
        status: status.to_string(),
        next_attempt_at,
    }
}

/// The signed POST of one delivery and how it ended.
async fn post(
    client: &reqwest::Client,
    d: &WebhookDelivery,
    url: reqwest::Url,
    key_id: &str,
    timestamp_ms: u64,
    signature: &[u8],
) -> Outcome {
    let response = client
        .post(url)
        .header("Content-Type", "application/json")
        .header("X-Turnkey-Organization-Id", &d.activity_organization_id)
        .header("X-Turnkey-Event-Type", &d.event_type)
        .header("X-Turnkey-Webhook-Version", "1")
        .header("X-Turnkey-Event-Id", &d.id)
        .header("X-Turnkey-Timestamp", timestamp_ms.to_string())
        .header("X-Turnkey-Signature-Key-Id", key_id)
        .header("X-Turnkey-Signature-Algorithm", "ed25519")
        .header("X-Turnkey-Signature-Version", "v1")
        .header("X-Turnkey-Signature", hex::encode(signature))
        .body(d.body.clone())
        .send()
        .await;
    match response {
        Ok(mut r) => {
            let status = r.status().as_u16();
            // Read (and drop) at most 64 KiB of the answer, within the request's timeout.
            let mut read = 0;
            while let Ok(Some(chunk)) = r.chunk().await {
                read += chunk.len();
                if read >= MAX_RESPONSE_BYTES {
                    break;
                }
            }
            classify(status)
        }
        Err(e) if e.is_builder() => Outcome::Terminal(None, format!("request not sent: {e}")),
        Err(e) => Outcome::Retry(None, error_text(e)),
    }
}

/// The error chain of a failed request, without the URL's query (it may hold a token).
fn error_text(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: usize, endpoint: &str, organization: &str, top_level: &str) -> Job {
        Job {
            delivery: WebhookDelivery {
                id: format!("{endpoint}-{n}"),
                organization_id: organization.into(),
                endpoint_id: endpoint.into(),
                activity_organization_id: organization.into(),
                activity_id: "a".into(),
                event_type: ACTIVITY_UPDATES.into(),
                body: "{}".into(),
                status: DELIVERY_PENDING.into(),
                attempts: 0,
                next_attempt_at: 0,
                last_status_code: None,
                last_error: None,
                created_at: 0,
                updated_at: 0,
                leased_by: None,
                top_level_id: top_level.into(),
            },
            url: None,
        }
    }

    /// `n` jobs of `endpoint` (of `organization`, under `top_level`) waiting.
    fn wait(waiting: &mut Waiting, endpoint: &str, organization: &str, top: &str, n: usize) {
        let start = waiting.by_top_level.get(top).and_then(|e| e.get(endpoint)).map_or(0, VecDeque::len);
        for i in start..start + n {
            assert!(waiting.push(job(i, endpoint, organization, top)));
        }
    }

    fn take(held: &Mutex<Held>, waiting: &mut Waiting) -> Vec<Job> {
        take_ready(held, waiting).unwrap().into_iter().flatten().collect()
    }

    /// One tenant's endpoints, its own and its sign-ups' (ten endpoints over three
    /// organizations), hold at most its top-level share, spread evenly over its organizations;
    /// another organization's delivery runs at once; the tenant's parked jobs do not count as
    /// work the outbox read waits for, and the read leaves the tenant out.
    #[test]
    fn a_tenant_holds_at_most_its_share_spread_over_its_organizations() {
        let held = Mutex::new(Held::default());
        let mut waiting = Waiting::default();
        for e in 0..10 {
            wait(&mut waiting, &format!("tenant-{e}"), &format!("signup-{}", e % 3), "tenant", 100);
        }
        wait(&mut waiting, "other", "other-org", "other-org", 1);
        let taken = take(&held, &mut waiting);
        assert_eq!(taken.iter().filter(|j| j.delivery.top_level_id == "tenant").count(), PER_TOP_LEVEL);
        assert!(taken.iter().any(|j| j.delivery.endpoint_id == "other"), "the other organization's delivery runs");
        let h = held.lock().unwrap();
        let per_signup: Vec<usize> = (0..3).map(|i| count(&h.by_organization, &format!("signup-{i}"))).collect();
        assert!(per_signup.iter().max().unwrap() - per_signup.iter().min().unwrap() <= 1, "{per_signup:?}");
        assert_eq!((waiting.len, waiting.runnable(&h)), (1000 - PER_TOP_LEVEL, 0), "parked, not runnable");
        assert_eq!(waiting.crowded(), vec!["tenant".to_string()]);
    }

    /// With every worker busy (two tenants at their cap), a newcomer's delivery takes the next
    /// worker that frees, whoever freed it; and every charge is given back once its attempt ends.
    #[test]
    fn a_newcomer_takes_the_next_free_worker_and_charges_are_given_back() {
        let held = Mutex::new(Held::default());
        let mut waiting = Waiting::default();
        for top in ["a", "b"] {
            for e in 0..4 {
                wait(&mut waiting, &format!("{top}-{e}"), top, top, 100);
            }
        }
        let mut in_flight = take(&held, &mut waiting);
        assert_eq!(in_flight.len(), WORKERS);
        wait(&mut waiting, "c-0", "c", "c", 1);
        assert!(take(&held, &mut waiting).is_empty(), "no worker free");
        let freed = in_flight.pop().unwrap();
        held.lock().unwrap().finished(&freed.delivery.id);
        let next = take(&held, &mut waiting);
        assert_eq!(next.iter().map(|j| j.delivery.endpoint_id.as_str()).collect::<Vec<_>>(), vec!["c-0"]);
        in_flight.extend(next);
        for j in &in_flight {
            held.lock().unwrap().finished(&j.delivery.id);
        }
        let h = held.lock().unwrap();
        assert!(h.charged.is_empty() && h.by_top_level.is_empty(), "every charge given back");
        assert!(h.by_organization.is_empty() && h.by_endpoint.is_empty(), "every charge given back");
    }

    /// Within one top-level organization (the auth proxy's, say), a sign-up whose endpoints stall
    /// holds the organization's share only while no other sign-up asks: another's delivery takes
    /// the next worker the organization frees.
    #[test]
    fn one_sign_up_does_not_keep_its_parent_s_share_from_the_others() {
        let held = Mutex::new(Held::default());
        let mut waiting = Waiting::default();
        for e in 0..2 {
            wait(&mut waiting, &format!("stalls-{e}"), "signup-1", "proxy", 1000);
        }
        let mut in_flight = take(&held, &mut waiting);
        assert_eq!(in_flight.len(), PER_TOP_LEVEL, "alone, it may use its parent's share");
        wait(&mut waiting, "honest", "signup-2", "proxy", 1);
        assert!(take(&held, &mut waiting).is_empty(), "the parent's share is in use");
        let freed = in_flight.pop().unwrap();
        held.lock().unwrap().finished(&freed.delivery.id);
        let next = take(&held, &mut waiting);
        assert_eq!(next.iter().map(|j| j.delivery.endpoint_id.as_str()).collect::<Vec<_>>(), vec!["honest"]);
    }

    /// The waiting queues are bounded per endpoint and in all; a delivery enqueued before its
    /// top level was recorded is charged to its own organization.
    #[test]
    fn waiting_is_bounded_and_old_deliveries_are_charged_to_their_organization() {
        let mut waiting = Waiting::default();
        wait(&mut waiting, "e", "o", "t", WAITING_PER_ENDPOINT);
        assert!(!waiting.push(job(WAITING_PER_ENDPOINT, "e", "o", "t")), "the endpoint's queue is full");
        assert_eq!(Charge::of(&job(0, "e", "o", "")).top_level, "o");
    }

    #[test]
    fn backoff_doubles_from_a_second_caps_and_gives_up() {
        let s = Schedule::default();
        let sec = 1_000_000_000i64;
        let at = |attempts| s.next(attempts, 0, 10 * sec, 0.5).unwrap() - 10 * sec;
        assert_eq!(at(1), sec, "first retry after about a second");
        assert_eq!(at(2), 2 * sec);
        assert_eq!(at(5), 16 * sec);
        assert_eq!(at(30), 15 * 60 * sec, "capped at 15 minutes");
        let jittered = s.next(1, 0, 10 * sec, 0.0).unwrap() - 10 * sec;
        assert_eq!(jittered, 750_000_000, "jitter spreads retries by ±25 %");
        assert!(s.next(3, 0, 24 * 3600 * sec, 0.5).is_none(), "given up after 24 hours");
    }

    #[test]
    fn statuses_decide_retry_or_not() {
        assert_eq!(classify(204), Outcome::Delivered(204));
        assert!(matches!(classify(503), Outcome::Retry(Some(503), _)));
        for terminal in [301, 400, 404, 429] {
            assert!(matches!(classify(terminal), Outcome::Terminal(Some(_), _)), "{terminal}");
        }
    }
}
