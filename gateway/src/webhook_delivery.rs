//! Webhook deliveries: the events an activity change enqueues (outbox rows written in the same
//! transaction as the change), and the worker that posts them, signed by the enclave's HSM key,
//! retrying with backoff until delivered or given up.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::activity::render;
use crate::ops::webhooks::{
    check_target, endpoint_json, is_forbidden_address, EventFilter, ACTIVITY_UPDATES, WEBHOOK_ENDPOINT,
};
use crate::state::AppState;
use crate::store::{
    now_nanos, ActivityRecord, Nanos, Organization, Store, StoreError, WebhookAttempt, WebhookDelivery, Write,
    DELIVERY_DELIVERED, DELIVERY_FAILED, DELIVERY_PENDING,
};

/// The outbox rows for `activity` as it is about to be committed: one per active endpoint of its
/// organization, or of the parent organization, with an active `ACTIVITY_UPDATES` subscription
/// whose filter passes. Paused endpoints and subscriptions get nothing (not even later).
pub fn events_for(store: &dyn Store, org: &Organization, activity: &ActivityRecord) -> Result<Vec<Write>, StoreError> {
    let mut endpoints = store.records(&org.id, WEBHOOK_ENDPOINT)?;
    if let Some(parent) = &org.parent_id {
        endpoints.extend(store.records(parent, WEBHOOK_ENDPOINT)?);
    }
    if endpoints.is_empty() {
        return Ok(Vec::new());
    }
    let body = render::activity(activity, false).to_string();
    let now = now_nanos();
    Ok(endpoints
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
        .map(|e| {
            Write::EnqueueWebhookDelivery(WebhookDelivery {
                id: uuid::Uuid::new_v4().to_string(),
                organization_id: e["organizationId"].as_str().unwrap_or_default().to_string(),
                endpoint_id: e["endpointId"].as_str().unwrap_or_default().to_string(),
                activity_organization_id: activity.organization_id.clone(),
                activity_id: activity.id.clone(),
                event_type: ACTIVITY_UPDATES.to_string(),
                body: body.clone(),
                status: DELIVERY_PENDING.to_string(),
                attempts: 0,
                next_attempt_at: now,
                last_status_code: None,
                last_error: None,
                created_at: now,
                updated_at: now,
            })
        })
        .collect())
}

/// Delivery timing (see README "Webhooks").
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
const WORKERS: usize = 64;
const PER_ENDPOINT: usize = 16;
/// How often the outbox is read when nothing wakes the worker (retries coming due).
const POLL: Duration = Duration::from_millis(100);
/// Shortest gap between two reads of the outbox (wakes in between are merged).
const MIN_POLL_GAP: Duration = Duration::from_millis(5);
/// Most response body read from a receiver.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Attempts recorded in one transaction at most.
const RECORD_BATCH: usize = 256;

/// Wakes the worker: new events were committed, or a worker is free.
static WAKE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Tells the worker that events were just committed, so it reads the outbox now.
pub fn wake() {
    WAKE.notify_one();
}

/// Deliveries being attempted or waiting to be recorded, and how many per endpoint.
type InFlight = (HashSet<String>, HashMap<String, usize>);

/// Starts the delivery worker on the current runtime; it runs for the life of the process.
pub fn spawn(state: Arc<AppState>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let allow_private = state.webhooks.allow_private_targets;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .dns_resolver(Arc::new(GuardedResolver { allow_private }))
        .user_agent("coffer-webhooks/1")
        .build()?;
    let schedule = Schedule::default();
    let in_flight: Arc<Mutex<InFlight>> = Arc::default();
    // Attempts are recorded in batches, one transaction each, by one task.
    let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel::<(String, String, WebhookAttempt)>();
    tokio::spawn(record_attempts(state.clone(), done_rx, in_flight.clone()));
    Ok(tokio::spawn(async move {
        let workers = Arc::new(Semaphore::new(WORKERS));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = WAKE.notified() => {}
            }
            // Wakes come with every commit: read at most every few milliseconds, and only with
            // a worker free.
            tokio::time::sleep(MIN_POLL_GAP).await;
            if workers.available_permits() == 0 {
                continue;
            }
            // Endpoints at their share of workers are left out of the read, so their backlog
            // does not fill it.
            let busy: Vec<String> = match in_flight.lock() {
                Ok(f) => f.1.iter().filter(|(_, n)| **n >= PER_ENDPOINT).map(|(e, _)| e.clone()).collect(),
                Err(_) => return,
            };
            let due = match state.db(|s| s.due_webhook_deliveries(now_nanos(), 2 * WORKERS, &busy)).await {
                Ok(Ok(d)) => d,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "reading due webhook deliveries failed");
                    continue;
                }
                Err(_) => continue,
            };
            for d in due {
                {
                    let Ok(mut f) = in_flight.lock() else { return };
                    let per = f.1.get(&d.endpoint_id).copied().unwrap_or(0);
                    if f.0.contains(&d.id) || per >= PER_ENDPOINT {
                        continue;
                    }
                    f.0.insert(d.id.clone());
                    *f.1.entry(d.endpoint_id.clone()).or_default() += 1;
                }
                let Ok(permit) = workers.clone().acquire_owned().await else { return };
                let (state, client, done) = (state.clone(), client.clone(), done_tx.clone());
                tokio::spawn(async move {
                    let attempt = deliver(&state, &client, &d, &schedule).await;
                    let _ = done.send((d.id.clone(), d.endpoint_id.clone(), attempt));
                    drop(permit);
                });
            }
        }
    }))
}

/// Records finished attempts in batches; a delivery leaves the in-flight set only once its
/// attempt is recorded (until then the outbox still shows it due).
async fn record_attempts(
    state: Arc<AppState>,
    mut done: tokio::sync::mpsc::UnboundedReceiver<(String, String, WebhookAttempt)>,
    in_flight: Arc<Mutex<InFlight>>,
) {
    while let Some(first) = done.recv().await {
        let mut batch = vec![first];
        while batch.len() < RECORD_BATCH {
            match done.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let rows: Vec<(String, WebhookAttempt)> = batch.iter().map(|(id, _, a)| (id.clone(), a.clone())).collect();
        let s = state.clone();
        match tokio::task::spawn_blocking(move || s.store.record_webhook_attempts(&rows)).await {
            Ok(Ok(())) => {}
            other => {
                tracing::warn!(outcome = ?other.map(|r| r.err()), n = batch.len(), "recording webhook attempts failed")
            }
        }
        if let Ok(mut f) = in_flight.lock() {
            for (id, endpoint, _) in &batch {
                f.0.remove(id);
                if let Some(n) = f.1.get_mut(endpoint) {
                    *n -= 1;
                    if *n == 0 {
                        f.1.remove(endpoint);
                    }
                }
            }
        }
        wake();
    }
}

/// One attempt: the endpoint's current URL and state, the enclave's signature over a fresh
/// timestamp, the POST, and the attempt's record.
async fn deliver(
    state: &Arc<AppState>,
    client: &reqwest::Client,
    d: &WebhookDelivery,
    schedule: &Schedule,
) -> WebhookAttempt {
    let started = Instant::now();
    let at = now_nanos();
    let endpoint = state.db(|s| s.record(&d.organization_id, WEBHOOK_ENDPOINT, &d.endpoint_id)).await;
    let outcome = match endpoint {
        Ok(Ok(e)) if e.data["isActive"].as_bool() == Some(false) => {
            Outcome::Terminal(None, "endpoint paused before delivery".into())
        }
        Ok(Ok(e)) => match state.db(|s| s.webhook_delivery(&d.id)).await {
            Ok(Ok(full)) => attempt(state, client, &full, e.data["url"].as_str().unwrap_or_default()).await,
            Ok(Err(StoreError::NotFound)) => Outcome::Terminal(None, "delivery dropped".into()),
            _ => Outcome::Retry(None, "store unavailable".into()),
        },
        Ok(Err(StoreError::NotFound)) => Outcome::Terminal(None, "endpoint deleted".into()),
        _ => Outcome::Retry(None, "store unavailable".into()),
    };
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

async fn attempt(state: &Arc<AppState>, client: &reqwest::Client, d: &WebhookDelivery, url: &str) -> Outcome {
    let allow_private = state.webhooks.allow_private_targets;
    // Checked again at dial time: the setting or the URL may have changed since it was stored.
    let url = match check_target(url, allow_private) {
        Ok(u) => u,
        Err(e) => return Outcome::Terminal(None, e.0),
    };
    let timestamp_ms = (now_nanos() / 1_000_000) as u64;
    let signed = state
        .enclave
        .clone()
        .sign_webhook_delivery(coffer_proto::v1::SignWebhookDeliveryRequest {
            timestamp_ms,
            event_id: d.id.clone(),
            body: d.body.as_bytes().to_vec(),
        })
        .await;
    let signed = match signed {
        Ok(r) => r.into_inner(),
        Err(e) => return Outcome::Retry(None, format!("enclave could not sign: {}", e.message())),
    };
    let response = client
        .post(url)
        .header("Content-Type", "application/json")
        .header("X-Turnkey-Organization-Id", &d.activity_organization_id)
        .header("X-Turnkey-Event-Type", &d.event_type)
        .header("X-Turnkey-Webhook-Version", "1")
        .header("X-Turnkey-Event-Id", &d.id)
        .header("X-Turnkey-Timestamp", timestamp_ms.to_string())
        .header("X-Turnkey-Signature-Key-Id", &signed.key_id)
        .header("X-Turnkey-Signature-Algorithm", "ed25519")
        .header("X-Turnkey-Signature-Version", "v1")
        .header("X-Turnkey-Signature", hex::encode(&signed.signature))
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

/// A delivery as the operators' query shows it.
pub fn delivery_json(d: &WebhookDelivery) -> Value {
    serde_json::json!({
        "eventId": d.id,
        "endpointId": d.endpoint_id,
        "organizationId": d.activity_organization_id,
        "activityId": d.activity_id,
        "eventType": d.event_type,
        "status": d.status,
        "attempts": d.attempts,
        "lastStatusCode": d.last_status_code,
        "lastError": d.last_error,
        "nextAttemptAt": (d.status == DELIVERY_PENDING).then(|| render::timestamp(d.next_attempt_at)),
        "createdAt": render::timestamp(d.created_at),
        "updatedAt": render::timestamp(d.updated_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
