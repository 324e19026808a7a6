//! Serving limits applied per request: in-flight bounds per request class (shed with a 503) and
//! token-bucket rate limits per client address and per credential (refused with a 429).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// The classes of API requests, each with its own bound on requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    Signing,
    Write,
    Read,
}

/// The client address of a request, put in its extensions by the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// Serving limits (see README "Operating limits").
pub struct Limits {
    pub body_read_timeout: Duration,
    signing: Arc<Semaphore>,
    writes: Arc<Semaphore>,
    reads: Arc<Semaphore>,
    per_ip: Option<RateLimiter<IpAddr>>,
    per_credential: Option<RateLimiter<String>>,
}

impl Limits {
    pub fn new(cfg: &crate::config::GatewayConfig) -> Self {
        let sem = |n: usize| Arc::new(Semaphore::new(n.max(1)));
        Self {
            body_read_timeout: Duration::from_millis(cfg.body_read_timeout_ms),
            signing: sem(cfg.max_in_flight_signing),
            writes: sem(cfg.max_in_flight_writes),
            reads: sem(cfg.max_in_flight_reads),
            per_ip: RateLimiter::per_second(cfg.rate_limit_per_ip),
            per_credential: RateLimiter::per_second(cfg.rate_limit_per_credential),
        }
    }

    /// A slot for one request of `class` from `client`: a 429 when the address is over its rate,
    /// or at once a 503 with `Retry-After` when the class's slots are all taken (overload is
    /// shed, not queued).
    pub fn admit(&self, class: RequestClass, client: Option<ClientAddr>) -> Result<OwnedSemaphorePermit, ApiError> {
        if let (Some(limiter), Some(ClientAddr(ip))) = (&self.per_ip, client) {
            limiter.take(ip, Instant::now()).map_err(|wait| ApiError::rate_limited("client address", wait))?;
        }
        let sem = match class {
            RequestClass::Signing => &self.signing,
            RequestClass::Write => &self.writes,
            RequestClass::Read => &self.reads,
        };
        sem.clone().try_acquire_owned().map_err(|_| ApiError::overloaded(class))
    }

    /// Charges one request to an authenticated credential: a 429 when it is over its rate.
    pub fn charge_credential(&self, credential_id: &str) -> Result<(), ApiError> {
        match &self.per_credential {
            Some(limiter) => limiter
                .take(credential_id.to_string(), Instant::now())
                .map_err(|wait| ApiError::rate_limited("credential", wait)),
            None => Ok(()),
        }
    }
}

/// Shards of a rate limiter's buckets, so concurrent requests rarely meet on one lock.
const SHARDS: usize = 16;
/// Buckets kept per shard before idle (full) ones are dropped.
const PRUNE_AT: usize = 4096;
/// Buckets a shard may hold at most: past it (keys spread over more addresses than this), the
/// shard starts afresh, which refills its buckets (memory stays bounded; the limit fails open).
const SHARD_CAP: usize = 4 * PRUNE_AT;

/// Token buckets by key: `rate` requests per second, bursts of up to one second's worth.
pub struct RateLimiter<K> {
    rate: f64,
    shards: Vec<Mutex<Shard<K>>>,
}

struct Shard<K> {
    buckets: HashMap<K, Bucket>,
    /// Size at which idle buckets are next dropped: twice what a pruning kept, so pruning costs
    /// O(1) per request amortized.
    prune_at: usize,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl<K: std::hash::Hash + Eq> RateLimiter<K> {
    /// `None` when `rate` is 0 (the limit is off).
    pub fn per_second(rate: u32) -> Option<Self> {
        let shard = || Mutex::new(Shard { buckets: HashMap::new(), prune_at: PRUNE_AT });
        (rate > 0).then(|| Self { rate: rate as f64, shards: (0..SHARDS).map(|_| shard()).collect() })
    }

    /// Takes one token for `key` at `now`, or says how long until one is there.
    pub fn take(&self, key: K, now: Instant) -> Result<(), Duration> {
        let shard = &self.shards[shard_of(&key)];
        let Ok(mut shard) = shard.lock() else { return Ok(()) };
        if shard.buckets.len() >= shard.prune_at {
            let rate = self.rate;
            shard.buckets.retain(|_, b| b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < rate);
            if shard.buckets.len() * 2 > SHARD_CAP {
                shard.buckets.clear();
            }
            shard.prune_at = (shard.buckets.len() * 2).max(PRUNE_AT);
        }
        let b = shard.buckets.entry(key).or_insert(Bucket { tokens: self.rate, at: now });
        b.tokens = (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.rate).min(self.rate);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        }
    }
}

fn shard_of<K: std::hash::Hash>(key: &K) -> usize {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() as usize) % SHARDS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_allow_a_second_of_burst_then_the_rate() {
        let limiter = RateLimiter::per_second(10).unwrap();
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(limiter.take("a", t0).is_ok());
        }
        let wait = limiter.take("a", t0).unwrap_err();
        assert!(wait > Duration::from_millis(90) && wait <= Duration::from_millis(100), "{wait:?}");
        assert!(limiter.take("b", t0).is_ok(), "keys have their own buckets");
        assert!(limiter.take("a", t0 + Duration::from_millis(99)).is_err());
        assert!(limiter.take("a", t0 + Duration::from_millis(201)).is_ok(), "refilled at the rate");
        assert!(RateLimiter::<&str>::per_second(0).is_none(), "0 turns the limit off");
    }

    #[test]
    fn idle_buckets_are_pruned_busy_ones_kept_and_memory_bounded() {
        let limiter = RateLimiter::per_second(2).unwrap();
        let t0 = Instant::now();
        let held = |l: &RateLimiter<usize>| l.shards.iter().map(|s| s.lock().unwrap().buckets.len()).sum::<usize>();
        // Past PRUNE_AT in every shard (the keys spread over shards by hash).
        let first = PRUNE_AT * SHARDS * 3 / 2;
        for i in 0..first {
            let _ = limiter.take(i, t0);
        }
        // A second later the others are full again: new keys make room by dropping them, but a
        // key that just spent its burst is kept (forgetting it would refill it).
        let t1 = t0 + Duration::from_millis(1000);
        let busy = usize::MAX;
        let _ = limiter.take(busy, t1);
        let _ = limiter.take(busy, t1);
        for i in 0..PRUNE_AT * SHARDS {
            let _ = limiter.take(first + i, t1);
        }
        assert!(held(&limiter) <= PRUNE_AT * SHARDS + 1, "{}", held(&limiter));
        assert!(limiter.take(busy, t1 + Duration::from_millis(10)).is_err(), "the busy key kept its state");
        // Keys that never go idle cannot grow a shard past its cap.
        for i in 0..SHARD_CAP * SHARDS * 2 {
            let _ = limiter.take(i, t1);
        }
        assert!(held(&limiter) <= SHARD_CAP * SHARDS, "{}", held(&limiter));
    }
}
