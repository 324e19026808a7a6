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

/// Serving limits (see docs/operations.md "Operating limits").
pub struct Limits {
    pub body_read_timeout: Duration,
    signing: Arc<Semaphore>,
    writes: Arc<Semaphore>,
    reads: Arc<Semaphore>,
    per_ip: Option<RateLimiter<IpAddr>>,
    per_credential: Option<RateLimiter<String>>,
    /// `trusted_proxies`: the peers whose `X-Forwarded-For` names the client
    /// (`client_address::client_address`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
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
            // Checked when the configuration was read.
            trusted_proxies: cfg
                .trusted_proxies
                .iter()
                .filter_map(|p| crate::client_address::parse_network(p))
                .collect(),
        }
    }

    /// A slot for one request of `class` from `client`: a 429 when the address is over its rate,
    /// or at once a 503 with `Retry-After` when the class's slots are all taken (overload is
    /// shed, not queued).
    pub fn admit(&self, class: RequestClass, client: Option<ClientAddr>) -> Result<OwnedSemaphorePermit, ApiError> {
        self.admit_at(class, client, Instant::now())
    }

    /// [`Limits::admit`] with the clock read by the caller (`now` is `Instant::now()` in
    /// production; the unit tests inject it).
    fn admit_at(
        &self,
        class: RequestClass,
        client: Option<ClientAddr>,
        now: Instant,
    ) -> Result<OwnedSemaphorePermit, ApiError> {
        if let (Some(limiter), Some(ClientAddr(ip))) = (&self.per_ip, client) {
            limiter.take(ip, now).map_err(|wait| ApiError::rate_limited("client address", wait))?;
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
        self.charge_credential_at(credential_id, Instant::now())
    }

    /// [`Limits::charge_credential`] with the clock read by the caller.
    fn charge_credential_at(&self, credential_id: &str, now: Instant) -> Result<(), ApiError> {
        match &self.per_credential {
            Some(limiter) => {
                limiter.take(credential_id.to_string(), now).map_err(|wait| ApiError::rate_limited("credential", wait))
            }
            None => Ok(()),
        }
    }
}

/// Shards of a rate limiter's buckets, so concurrent requests rarely meet on one lock.
const SHARDS: usize = 16;
/// Buckets kept per shard before idle (full) ones are dropped.
const PRUNE_AT: usize = 4096;
/// Buckets a shard may hold at most: past it (keys spread over more addresses than this, none of
/// them idle), the least recently used half is forgotten, so memory stays bounded and the buckets
/// just spent are kept (the limit holds for whoever is spending now; a forgotten bucket is one
/// that had the longest to refill).
const SHARD_CAP: usize = 4 * PRUNE_AT;

/// The group of client addresses that share a per-address allowance: an IPv4 address's /24, an
/// IPv6 address's /64 (what one customer is routinely given), an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) as the IPv4 address it is. The one rule for every limit keyed by group.
pub fn address_group(ip: IpAddr) -> IpAddr {
    let v4 = |a: std::net::Ipv4Addr| {
        let [a, b, c, _] = a.octets();
        IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, 0))
    };
    match ip {
        IpAddr::V4(a) => v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(mapped) => v4(mapped),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(a) & !((1u128 << 64) - 1))),
        },
    }
}

/// The coarser range an address group belongs to, limited as a whole at a multiple of a group's
/// allowance: an IPv4 address's /16, an IPv6 address's /48 (what a site, or a free tunnel
/// broker's account, is given: 65,536 /64 groups), an IPv4-mapped IPv6 address as its IPv4
/// address. Without it, one /48 would be 65,536 groups' allowances.
pub fn address_range(ip: IpAddr) -> IpAddr {
    let v4 = |a: std::net::Ipv4Addr| {
        let [a, b, _, _] = a.octets();
        IpAddr::V4(std::net::Ipv4Addr::new(a, b, 0, 0))
    };
    match ip {
        IpAddr::V4(a) => v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(mapped) => v4(mapped),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(a) & !((1u128 << 80) - 1))),
        },
    }
}

/// Which of a [`GroupLimiter`]'s limits refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The address's group ([`address_group`]).
    Group,
    /// The group's range ([`address_range`]).
    Range,
}

/// A limit per client address group ([`address_group`]) and, at `factor` times it, per range
/// ([`address_range`]). A request is charged to its group first: one refused there spends none
/// of its range's, so a group over its own limit cannot use up its neighbours'.
pub struct GroupLimiter {
    group: RateLimiter<IpAddr>,
    range: Option<RateLimiter<IpAddr>>,
}

impl GroupLimiter {
    /// `rate` a second per group, `rate × factor` per range (`factor` 0: no range limit); `None`
    /// when `rate` is 0.
    pub fn per_second(rate: u32, factor: u32) -> Option<Self> {
        Some(Self {
            group: RateLimiter::per_second(rate)?,
            range: RateLimiter::per_second(rate.saturating_mul(factor)),
        })
    }

    /// `count` an hour per group, `count × factor` per range; `None` when `count` is 0.
    pub fn per_hour(count: u32, factor: u32) -> Option<Self> {
        Some(Self { group: RateLimiter::per_hour(count)?, range: RateLimiter::per_hour(count.saturating_mul(factor)) })
    }

    /// Takes one for `ip`'s group, then its range; or how long until one is back, and which
    /// limit refused.
    pub fn take(&self, ip: IpAddr, now: Instant) -> Result<(), (Duration, Over)> {
        self.group.take(address_group(ip), now).map_err(|wait| (wait, Over::Group))?;
        match &self.range {
            Some(range) => range.take(address_range(ip), now).map_err(|wait| (wait, Over::Range)),
            None => Ok(()),
        }
    }
}

/// Token buckets by key: `rate` requests per second, bursts of up to one second's worth.
pub struct RateLimiter<K> {
    /// Tokens a second, and how many a bucket holds at most.
    rate: f64,
    capacity: f64,
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

impl<K: std::hash::Hash + Eq + Clone> RateLimiter<K> {
    /// `None` when `rate` is 0 (the limit is off).
    pub fn per_second(rate: u32) -> Option<Self> {
        Self::with(rate as f64, rate as f64)
    }

    /// `count` an hour, all of which may be spent at once; `None` when `count` is 0.
    pub fn per_hour(count: u32) -> Option<Self> {
        Self::with(count as f64 / 3600.0, count as f64)
    }

    fn with(rate: f64, capacity: f64) -> Option<Self> {
        let shard = || Mutex::new(Shard { buckets: HashMap::new(), prune_at: PRUNE_AT });
        (rate > 0.0).then(|| Self { rate, capacity, shards: (0..SHARDS).map(|_| shard()).collect() })
    }

    /// Takes one token for `key` at `now`, or says how long until one is there. The clock is the
    /// caller's (`Instant::now()` in production), so the arithmetic is unit-tested on an injected
    /// one.
    pub fn take(&self, key: K, now: Instant) -> Result<(), Duration> {
        let shard = &self.shards[shard_of(&key)];
        let Ok(mut shard) = shard.lock() else { return Ok(()) };
        if shard.buckets.len() >= shard.prune_at {
            let (rate, capacity) = (self.rate, self.capacity);
            shard.buckets.retain(|_, b| b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < capacity);
            if shard.buckets.len() * 2 > SHARD_CAP {
                evict_oldest(&mut shard.buckets, SHARD_CAP / 2);
            }
            shard.prune_at = (shard.buckets.len() * 2).max(PRUNE_AT);
        }
        let b = shard.buckets.entry(key).or_insert(Bucket { tokens: self.capacity, at: now });
        b.tokens = (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.rate).min(self.capacity);
        // A caller that read the clock before another but took the lock after it must not move the
        // bucket's time back (the gap would be refilled twice).
        b.at = b.at.max(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        }
    }
}

/// Forgets the least recently used buckets until `keep` are left (exactly: ties are broken by
/// the selection, never by dropping more).
fn evict_oldest<K: std::hash::Hash + Eq + Clone>(buckets: &mut HashMap<K, Bucket>, keep: usize) {
    let Some(drop) = buckets.len().checked_sub(keep).filter(|&n| n > 0) else { return };
    let mut by_age: Vec<(Instant, K)> = buckets.iter().map(|(k, b)| (b.at, k.clone())).collect();
    by_age.select_nth_unstable_by_key(drop - 1, |(at, _)| *at);
    for (_, k) in &by_age[..drop] {
        buckets.remove(k);
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
    //! The time-dependent arithmetic on an injected clock: every `now` is `t0` plus an exact
    //! offset, so nothing here depends on how fast the machine runs. Where a test asserts an exact
    //! boundary, the offsets are binary fractions of a second (the floating-point refill is then
    //! exact); elsewhere they are a millisecond either side of it.

    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    use super::*;
    use crate::config::GatewayConfig;
    use crate::error::Code;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Takes from `key` at `now` until refused: the number of tokens taken.
    fn drain<K: std::hash::Hash + Eq + Clone>(limiter: &RateLimiter<K>, key: K, now: Instant) -> usize {
        let mut taken = 0;
        while limiter.take(key.clone(), now).is_ok() {
            taken += 1;
            assert!(taken <= 1_000_000, "never refused");
        }
        taken
    }

    #[test]
    fn addresses_are_grouped_by_ipv4_slash_24_and_ipv6_slash_64() {
        let group = |s: &str| address_group(s.parse().unwrap()).to_string();
        assert_eq!(group("192.0.2.77"), "192.0.2.0");
        assert_eq!(group("192.0.2.0"), "192.0.2.0");
        assert_eq!(group("192.0.2.255"), group("192.0.2.1"), "one /24");
        assert_ne!(group("192.0.3.1"), group("192.0.2.1"), "the next /24 is another group");
        assert_eq!(group("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(group("2001:db8:1:2::1"), group("2001:db8:1:2:ffff:ffff:ffff:ffff"), "one /64");
        assert_ne!(group("2001:db8:1:3::1"), group("2001:db8:1:2::1"), "the next /64 is another group");
        // An IPv4-mapped IPv6 address is the IPv4 address (a dual-stack socket's view of it).
        assert_eq!(group("::ffff:192.0.2.77"), "192.0.2.0");
        assert_eq!(address_group("::ffff:192.0.2.9".parse().unwrap()), address_group("192.0.2.200".parse().unwrap()));
        assert_eq!(group("::1"), "::", "loopback is its /64");
        assert_eq!(group("127.0.0.1"), "127.0.0.0");
    }

    #[test]
    fn the_burst_is_exactly_one_seconds_worth_however_long_the_key_was_idle() {
        for rate in [1u32, 2, 3, 4, 7, 10, 100, 1000] {
            let limiter = RateLimiter::per_second(rate).unwrap();
            let t0 = Instant::now();
            assert_eq!(drain(&limiter, "a", t0), rate as usize, "rate {rate}: a new key's burst");
            assert_eq!(
                drain(&limiter, "a", t0 + Duration::from_secs(3600)),
                rate as usize,
                "rate {rate}: after an hour"
            );
        }
        assert!(RateLimiter::<&str>::per_second(0).is_none(), "0 turns the limit off");
    }

    #[test]
    fn an_hourly_budget_is_spent_at_once_and_comes_back_over_the_hour() {
        let limiter = RateLimiter::per_hour(30).unwrap();
        let t0 = Instant::now();
        assert_eq!(drain(&limiter, "a", t0), 30);
        // One comes back every 120 s; the wait says so.
        let wait = limiter.take("a", t0 + Duration::from_secs(60)).unwrap_err();
        assert_eq!(wait.as_secs(), 60);
        assert_eq!(drain(&limiter, "a", t0 + Duration::from_secs(240)), 2);
        assert_eq!(drain(&limiter, "a", t0 + Duration::from_secs(240 + 7200)), 30, "never more than the budget");
        assert!(RateLimiter::<&str>::per_hour(0).is_none());
    }

    #[test]
    fn a_late_reading_of_the_clock_refills_nothing_twice() {
        let limiter = RateLimiter::per_second(4).unwrap();
        let t0 = Instant::now();
        for _ in 0..4 {
            assert!(limiter.take("k", t0).is_ok());
        }
        // One token's period later, then a caller whose clock reading was 250 ms older.
        assert!(limiter.take("k", t0 + Duration::from_millis(250)).is_ok());
        assert!(limiter.take("k", t0).is_err());
        // The gap the late caller went back over is not refilled again.
        assert!(limiter.take("k", t0 + Duration::from_millis(250)).is_err());
    }

    #[test]
    fn tokens_come_back_at_exactly_the_rate() {
        // 4 a second: one token every 250 ms.
        let limiter = RateLimiter::per_second(4).unwrap();
        let t0 = Instant::now();
        assert_eq!(drain(&limiter, "a", t0), 4);
        assert!(limiter.take("a", t0 + ms(125)).is_err(), "half a token at 125 ms");
        // A refused take keeps the half token earned so far.
        assert!(limiter.take("a", t0 + ms(250)).is_ok(), "one token at 250 ms");
        assert!(limiter.take("a", t0 + ms(250)).is_err(), "and only one");
        assert_eq!(drain(&limiter, "a", t0 + ms(750)), 2, "two more 500 ms later");
        assert_eq!(drain(&limiter, "a", t0 + ms(1500)), 3, "three more 750 ms later");
        // Polled every 62.5 ms for ten seconds: exactly rate × seconds granted.
        let granted = (1..=160u64)
            .filter(|i| limiter.take("a", t0 + ms(1500) + Duration::from_micros(62_500 * i)).is_ok())
            .count();
        assert_eq!(granted, 40);

        // The boundary for every rate dividing a second into whole milliseconds: one token is
        // back a token's period after the burst was spent, and not a millisecond before.
        for rate in [1u32, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 125, 200, 250, 500] {
            let period = ms(1000 / u64::from(rate));
            let early = RateLimiter::per_second(rate).unwrap();
            drain(&early, "a", t0);
            assert!(early.take("a", t0 + period - ms(1)).is_err(), "rate {rate}: 1 ms early");
            let on_time = RateLimiter::per_second(rate).unwrap();
            drain(&on_time, "a", t0);
            assert_eq!(drain(&on_time, "a", t0 + period + ms(1)), 1, "rate {rate}: one period later, one token");
        }
    }

    #[test]
    fn the_wait_is_the_time_until_the_next_token() {
        let limiter = RateLimiter::per_second(4).unwrap();
        let t0 = Instant::now();
        drain(&limiter, "a", t0);
        assert_eq!(limiter.take("a", t0).unwrap_err(), ms(250));
        assert_eq!(limiter.take("a", t0 + ms(125)).unwrap_err(), ms(125));
        assert_eq!(limiter.take("a", t0 + Duration::from_micros(187_500)).unwrap_err(), Duration::from_micros(62_500));
        assert!(limiter.take("a", t0 + ms(250)).is_ok(), "the token is there when the wait says");
    }

    #[test]
    fn retry_after_is_the_wait_in_whole_seconds_rounded_up_and_at_least_one() {
        let secs = |wait: Duration| ApiError::rate_limited("credential", wait).retry_after;
        assert_eq!(secs(Duration::ZERO), Some(1));
        assert_eq!(secs(Duration::from_nanos(1)), Some(1));
        assert_eq!(secs(ms(250)), Some(1));
        assert_eq!(secs(ms(1000)), Some(1));
        assert_eq!(secs(ms(1001)), Some(2));
        assert_eq!(secs(ms(2500)), Some(3));
        assert_eq!(secs(Duration::from_secs(60)), Some(60));

        // What the limiter produces: with a whole number of tokens a second the wait is never
        // more than a second, so `Retry-After` is 1, and a client that honours it is admitted.
        let t0 = Instant::now();
        for rate in 1..=100u32 {
            for offset in [0, 1, 7, 333, 999].map(ms) {
                let limiter = RateLimiter::per_second(rate).unwrap();
                drain(&limiter, "a", t0);
                let Err(wait) = limiter.take("a", t0 + offset) else { continue };
                // At most one token's period (to the nanosecond `Duration` rounds to).
                let period = Duration::from_secs(1) / rate;
                assert!(wait > Duration::ZERO && wait <= period + Duration::from_nanos(1), "rate {rate}: {wait:?}");
                assert_eq!(secs(wait), Some(1), "rate {rate}, {offset:?}");
                assert!(limiter.take("a", t0 + offset + Duration::from_secs(1)).is_ok(), "rate {rate}, {offset:?}");
            }
        }
    }

    #[test]
    fn every_key_has_its_own_bucket() {
        let limiter = RateLimiter::per_second(3).unwrap();
        let t0 = Instant::now();
        assert_eq!(drain(&limiter, "a", t0), 3);
        assert_eq!(drain(&limiter, "b", t0), 3, "b's whole burst, whatever a spent");
        assert_eq!(drain(&limiter, "b", t0 + ms(500)), 1, "b refills on its own");
        assert_eq!(drain(&limiter, "a", t0 + ms(1000)), 3, "a refills from when it was spent");
        assert_eq!(drain(&limiter, "c", t0 + ms(1000)), 3);
    }

    fn limits(per_ip: u32, per_credential: u32) -> Limits {
        Limits::new(&GatewayConfig {
            rate_limit_per_ip: per_ip,
            rate_limit_per_credential: per_credential,
            ..GatewayConfig::default()
        })
    }

    fn assert_rate_limited(e: ApiError, what: &str) {
        assert_eq!(e.code, Code::ResourceExhausted, "{e}");
        assert_eq!(e.turnkey_code, "RATE_LIMIT_EXCEEDED");
        assert_eq!(e.message, format!("rate limit exceeded for this {what}, retry shortly"));
        assert_eq!(e.retry_after, Some(1));
        let response = e.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], "1");
    }

    #[test]
    fn addresses_and_credentials_are_limited_each_on_its_own() {
        let limits = limits(2, 3);
        let a = Some(ClientAddr("192.0.2.1".parse().unwrap()));
        let b = Some(ClientAddr("2001:db8::1".parse().unwrap()));
        let t0 = Instant::now();
        // One bucket per address, shared by every request class.
        assert!(limits.admit_at(RequestClass::Read, a, t0).is_ok());
        assert!(limits.admit_at(RequestClass::Signing, a, t0).is_ok());
        assert_rate_limited(limits.admit_at(RequestClass::Write, a, t0).unwrap_err(), "client address");
        assert!(limits.admit_at(RequestClass::Read, b, t0).is_ok(), "another address");
        assert!(limits.admit_at(RequestClass::Read, b, t0).is_ok());
        assert!(limits.admit_at(RequestClass::Read, b, t0).is_err());
        for _ in 0..100 {
            assert!(limits.admit_at(RequestClass::Read, None, t0).is_ok(), "no address, no per-address limit");
        }
        // One bucket per credential, apart from the addresses'.
        for _ in 0..3 {
            assert!(limits.charge_credential_at("c1", t0).is_ok());
        }
        assert_rate_limited(limits.charge_credential_at("c1", t0).unwrap_err(), "credential");
        for _ in 0..3 {
            assert!(limits.charge_credential_at("c2", t0).is_ok(), "another credential");
        }
        // Each refills at its own rate: half a second gives an address one token (2/s) and a
        // credential one (3/s, 1.5 tokens).
        let t1 = t0 + ms(500);
        assert!(limits.admit_at(RequestClass::Read, a, t1).is_ok());
        assert!(limits.admit_at(RequestClass::Read, a, t1).is_err());
        assert!(limits.charge_credential_at("c1", t1).is_ok());
        assert!(limits.charge_credential_at("c1", t1).is_err());
    }

    #[test]
    fn a_rate_of_zero_turns_a_limit_off() {
        let limits = limits(0, 0);
        let a = Some(ClientAddr("192.0.2.1".parse().unwrap()));
        let t0 = Instant::now();
        for _ in 0..10_000 {
            assert!(limits.admit_at(RequestClass::Read, a, t0).is_ok());
            assert!(limits.charge_credential_at("c1", t0).is_ok());
        }
    }

    #[test]
    fn a_class_at_its_in_flight_bound_is_shed_with_a_503_the_others_admitted() {
        let limits = Limits::new(&GatewayConfig { max_in_flight_signing: 2, ..GatewayConfig::default() });
        let held: Vec<_> = (0..2).map(|_| limits.admit(RequestClass::Signing, None).unwrap()).collect();
        let e = limits.admit(RequestClass::Signing, None).unwrap_err();
        assert_eq!((e.code, e.retry_after), (Code::Unavailable, Some(1)));
        assert!(limits.admit(RequestClass::Write, None).is_ok());
        drop(held);
        assert!(limits.admit(RequestClass::Signing, None).is_ok(), "a finished request frees its slot");
    }

    /// `n` keys that fall in shard 0.
    fn keys_in_shard_0(n: usize) -> Vec<usize> {
        (0..).filter(|k| shard_of(k) == 0).take(n).collect()
    }

    fn shard_0(limiter: &RateLimiter<usize>) -> std::sync::MutexGuard<'_, Shard<usize>> {
        limiter.shards[0].lock().unwrap()
    }

    #[test]
    fn a_shard_at_its_mark_drops_exactly_its_full_buckets() {
        let limiter = RateLimiter::per_second(2).unwrap();
        let t0 = Instant::now();
        let t1 = t0 + ms(500);
        let keys = keys_in_shard_0(2 * PRUNE_AT + 1);
        // PRUNE_AT keys with a token spent at t0: at the mark none is full, so none is dropped.
        for &k in &keys[..=PRUNE_AT] {
            limiter.take(k, t0).unwrap();
        }
        assert_eq!(shard_0(&limiter).buckets.len(), PRUNE_AT + 1);
        assert_eq!(shard_0(&limiter).prune_at, 2 * PRUNE_AT);
        // At t1 those are full again (forgetting one changes nothing); the keys spending a token
        // at t1 are not.
        for &k in &keys[PRUNE_AT + 1..2 * PRUNE_AT] {
            limiter.take(k, t1).unwrap();
        }
        assert_eq!(shard_0(&limiter).buckets.len(), 2 * PRUNE_AT);
        limiter.take(keys[2 * PRUNE_AT], t1).unwrap();
        {
            let shard = shard_0(&limiter);
            assert!(keys[..=PRUNE_AT].iter().all(|k| !shard.buckets.contains_key(k)), "the full ones dropped");
            assert!(keys[PRUNE_AT + 1..].iter().all(|k| shard.buckets.contains_key(k)), "the others kept");
            assert_eq!(shard.buckets.len(), PRUNE_AT);
            assert_eq!(shard.prune_at, 2 * (PRUNE_AT - 1), "twice what the pruning kept");
        }
        assert_eq!(drain(&limiter, keys[PRUNE_AT + 1], t1), 1, "a kept bucket keeps its state");
        assert_eq!(drain(&limiter, keys[0], t1), 2, "a dropped one comes back full, as it was");
    }

    #[test]
    fn a_full_shard_forgets_its_oldest_buckets_and_the_limit_holds() {
        // An hourly budget: nothing of note refills during the test, so no bucket is ever idle.
        let limiter = RateLimiter::per_hour(2).unwrap();
        let t0 = Instant::now();
        let at = |i: usize| t0 + Duration::from_micros(i as u64);
        let keys = keys_in_shard_0(SHARD_CAP + 1);
        // SHARD_CAP - 2 keys with a token spent, oldest first; then the attacker's key, spent
        // whole, and one more key.
        for (i, &k) in keys[..SHARD_CAP - 2].iter().enumerate() {
            limiter.take(k, at(i)).unwrap();
        }
        let spent = keys[SHARD_CAP - 2];
        assert_eq!(drain(&limiter, spent, at(SHARD_CAP)), 2);
        limiter.take(keys[SHARD_CAP - 1], at(SHARD_CAP)).unwrap();
        assert_eq!(shard_0(&limiter).buckets.len(), SHARD_CAP);
        // One more key: the shard is at its cap with no idle bucket, so its least recently used
        // half is forgotten (it used to be emptied, which gave every key its budget back).
        limiter.take(keys[SHARD_CAP], at(SHARD_CAP + 1)).unwrap();
        {
            let shard = shard_0(&limiter);
            assert_eq!(shard.buckets.len(), SHARD_CAP / 2 + 1, "half kept, and the new key");
            assert!(keys[..SHARD_CAP / 2].iter().all(|k| !shard.buckets.contains_key(k)), "the oldest forgotten");
            assert!(keys[SHARD_CAP / 2..].iter().all(|k| shard.buckets.contains_key(k)), "the newest kept");
        }
        assert!(limiter.take(spent, at(SHARD_CAP + 2)).is_err(), "the spent key is still limited: it fails closed");
        assert_eq!(drain(&limiter, keys[SHARD_CAP - 3], at(SHARD_CAP + 2)), 1, "a kept key keeps its state");
        // Keys that never go idle cannot grow it past its cap, and the spent key stays spent
        // while it keeps being used.
        for (i, &k) in keys_in_shard_0(3 * SHARD_CAP)[SHARD_CAP + 1..].iter().enumerate() {
            limiter.take(k, at(SHARD_CAP + 3 + 2 * i)).unwrap();
            assert!(shard_0(&limiter).buckets.len() <= SHARD_CAP);
            if i % 1000 == 0 {
                assert!(limiter.take(spent, at(SHARD_CAP + 4 + 2 * i)).is_err(), "after {i} new keys");
            }
        }
    }

    #[test]
    fn eviction_drops_exactly_the_oldest_even_when_times_tie() {
        let t0 = Instant::now();
        let mut buckets: HashMap<usize, Bucket> =
            (0..10).map(|k| (k, Bucket { tokens: 0.0, at: t0 + ms(if k < 6 { 0 } else { k as u64 }) })).collect();
        evict_oldest(&mut buckets, 7);
        assert_eq!(buckets.len(), 7);
        assert!((6..10).all(|k| buckets.contains_key(&k)), "the newer ones kept");
        evict_oldest(&mut buckets, 9);
        assert_eq!(buckets.len(), 7, "nothing to drop below the mark");
    }

    #[test]
    fn ranges_are_ipv4_slash_16_and_ipv6_slash_48() {
        let range = |s: &str| address_range(s.parse().unwrap()).to_string();
        assert_eq!(range("192.0.2.77"), "192.0.0.0");
        assert_eq!(range("192.0.255.1"), range("192.0.2.1"), "one /16");
        assert_ne!(range("192.1.2.1"), range("192.0.2.1"));
        assert_eq!(range("2001:db8:1:2:aaaa::1"), "2001:db8:1::");
        assert_eq!(range("2001:db8:1:ffff::1"), range("2001:db8:1:2::1"), "one /48: 65,536 /64 groups");
        assert_ne!(range("2001:db8:2::1"), range("2001:db8:1::1"));
        assert_eq!(range("::ffff:192.0.2.77"), "192.0.0.0");
    }

    #[test]
    fn a_range_of_many_groups_is_limited_as_a_whole_and_a_group_first() {
        // 20 sign-ups an hour per /64, 10 times that per /48: a tunnel's 65,536 /64s give 200.
        let limiter = GroupLimiter::per_hour(20, 10).unwrap();
        let t0 = Instant::now();
        let group = |n: u32| -> IpAddr { format!("2001:db8:7:{n:x}::1").parse().unwrap() };
        let mut granted = 0;
        for n in 0..1000 {
            for _ in 0..20 {
                if limiter.take(group(n), t0).is_ok() {
                    granted += 1;
                }
            }
        }
        assert_eq!(granted, 200, "the /48's allowance, not 1,000 /64s' worth");
        assert_eq!(limiter.take(group(5000), t0).unwrap_err().1, Over::Range);
        // Another /48, and an IPv4 /24 of its own, are not affected.
        assert!(limiter.take("2001:db8:8::1".parse().unwrap(), t0).is_ok());
        // A group over its own limit spends none of its range's.
        let limiter = GroupLimiter::per_hour(2, 2).unwrap();
        let (a, b, c) = ("10.1.1.1".parse().unwrap(), "10.1.2.1".parse().unwrap(), "10.1.3.1".parse().unwrap());
        assert!(limiter.take(a, t0).is_ok() && limiter.take(a, t0).is_ok());
        for _ in 0..10 {
            assert_eq!(limiter.take(a, t0).unwrap_err().1, Over::Group);
        }
        assert!(limiter.take(b, t0).is_ok() && limiter.take(b, t0).is_ok(), "the /16's other 2");
        assert_eq!(limiter.take(c, t0).unwrap_err().1, Over::Range);
        // Factor 0: groups only.
        let limiter = GroupLimiter::per_second(1, 0).unwrap();
        assert!((0..100u32).all(|n| limiter.take(IpAddr::from([10, 9, n as u8, 1]), t0).is_ok()));
        assert!(GroupLimiter::per_hour(0, 10).is_none());
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
