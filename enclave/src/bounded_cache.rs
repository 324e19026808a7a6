//! A map bounded by bytes on every insert, least recently used out: how the enclave keeps
//! organizations' states and log heads without growing with the number of organizations.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use hashlink::LinkedHashMap;

/// Shards, so that organizations' requests rarely wait on each other's lookups.
const SHARDS: usize = 16;

/// Values by key, at most `budget` bytes in all (as the caller weighs each value). The budget is
/// the whole map's, not a shard's: a large organization's state is kept as long as it weighs at
/// most half the budget (one tenant cannot take it all). Over budget, the least recently used
/// values of the inserting shard go first, then those of the other shards, a shard at a time
/// from a rotating start: least recently used within a shard, not across shards.
pub struct BoundedCache<V> {
    shards: Vec<Mutex<Shard<V>>>,
    budget: usize,
    /// What the values of all shards weigh together.
    bytes: AtomicUsize,
    /// The shard the next eviction from other shards starts at.
    cursor: AtomicUsize,
    hasher: RandomState,
}

struct Shard<V> {
    /// Least recently used first.
    entries: LinkedHashMap<String, (V, usize)>,
}

impl<V: Clone> BoundedCache<V> {
    pub fn new(budget: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard { entries: LinkedHashMap::new() })).collect(),
            budget,
            bytes: AtomicUsize::new(0),
            cursor: AtomicUsize::new(0),
            hasher: RandomState::new(),
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) % SHARDS as u64) as usize
    }

    fn lock(&self, shard: usize) -> std::sync::MutexGuard<'_, Shard<V>> {
        // A panic while a shard was held leaves it consistent (no method panics mid-update).
        self.shards[shard].lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn over(&self) -> bool {
        self.bytes.load(Ordering::Acquire) > self.budget
    }

    /// The value of `key`, now the most recently used.
    pub fn get(&self, key: &str) -> Option<V> {
        self.lock(self.shard_of(key)).entries.to_back(key).map(|(v, _)| v.clone())
    }

    /// Keeps `value` (weighing `bytes`) for `key`, replacing what it had, and drops the least
    /// recently used values until the map is within its budget again. A value heavier than half
    /// the budget is not kept (nor what `key` had).
    pub fn insert(&self, key: &str, value: V, bytes: usize) {
        self.insert_unless(key, value, bytes, |_, _| false);
    }

    /// [`BoundedCache::insert`] unless what `key` has is to be kept (`keep(&value, &kept)`),
    /// decided and done under the shard's lock; returns what `key` then has (or `value`, when it
    /// is too heavy to keep).
    pub fn insert_unless(&self, key: &str, value: V, bytes: usize, keep: impl Fn(&V, &V) -> bool) -> V {
        let home = self.shard_of(key);
        {
            let mut shard = self.lock(home);
            if let Some((kept, _)) = shard.entries.to_back(key) {
                if keep(&value, kept) {
                    return kept.clone();
                }
            }
            if let Some((_, old)) = shard.entries.remove(key) {
                self.bytes.fetch_sub(old, Ordering::AcqRel);
            }
            if bytes > self.budget / 2 {
                return value;
            }
            self.bytes.fetch_add(bytes, Ordering::AcqRel);
            shard.entries.insert(key.to_string(), (value.clone(), bytes));
            // The inserting shard's least recently used first, never the value just kept.
            while self.over() && shard.entries.len() > 1 {
                let Some((_, (_, dropped))) = shard.entries.pop_front() else { break };
                self.bytes.fetch_sub(dropped, Ordering::AcqRel);
            }
        }
        // Then the other shards', one shard lock at a time (never two held: no lock order).
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        for step in 0..SHARDS {
            if !self.over() {
                break;
            }
            let i = (start + step) % SHARDS;
            if i == home {
                continue;
            }
            let mut shard = self.lock(i);
            while self.over() {
                let Some((_, (_, dropped))) = shard.entries.pop_front() else { break };
                self.bytes.fetch_sub(dropped, Ordering::AcqRel);
            }
        }
        value
    }

    pub fn remove(&self, key: &str) {
        let mut shard = self.lock(self.shard_of(key));
        if let Some((_, bytes)) = shard.entries.remove(key) {
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// What the values may weigh together.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Values kept, and their weight.
    pub fn usage(&self) -> (usize, usize) {
        let n = (0..SHARDS).map(|i| self.lock(i).entries.len()).sum();
        (n, self.bytes.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_and_the_budget_holds_on_every_insert() {
        let cache = BoundedCache::new(100);
        // Keys of one shard, so that least recently used is exact among them.
        let mut keys = Vec::new();
        let mut n = 0;
        while keys.len() < 4 {
            let k = format!("org-{n}");
            if cache.shard_of(&k) == 0 {
                keys.push(k);
            }
            n += 1;
        }
        for (i, k) in keys.iter().take(3).enumerate() {
            cache.insert(k, i, 30);
        }
        assert_eq!(cache.usage(), (3, 90));
        // Used: the first is now the most recent, so the second goes when the fourth comes.
        assert_eq!(cache.get(&keys[0]), Some(0));
        cache.insert(&keys[3], 3, 30);
        assert_eq!(cache.usage(), (3, 90));
        assert_eq!((cache.get(&keys[1]), cache.get(&keys[0]), cache.get(&keys[3])), (None, Some(0), Some(3)));
        // A replacement is weighed anew; heavier than half the budget, it is not kept (nor the
        // old one).
        cache.insert(&keys[0], 10, 50);
        assert_eq!(cache.usage(), (2, 80));
        cache.insert(&keys[3], 30, 51);
        assert_eq!((cache.get(&keys[3]), cache.usage()), (None, (1, 50)));
        cache.remove(&keys[0]);
        assert_eq!(cache.usage(), (0, 0));
    }

    #[test]
    fn a_value_heavier_than_a_shards_share_is_kept_and_others_shards_make_room() {
        // Issue 40: with the budget split evenly over the shards, an organization of about 750
        // policies (a 16th of 64 MiB) was never kept, and each of its writes read it all again.
        let cache = BoundedCache::new(SHARDS * 100);
        for i in 0..SHARDS * 4 {
            cache.insert(&format!("small-{i}"), i, 25);
        }
        assert_eq!(cache.usage().1, SHARDS * 100);
        cache.insert("large", 999, SHARDS * 50);
        assert_eq!(cache.get("large"), Some(999), "kept although 8 shards' shares");
        let (n, bytes) = cache.usage();
        assert!(bytes <= SHARDS * 100, "{bytes} bytes");
        assert_eq!(n, 1 + SHARDS * 2, "small ones dropped from any shard to make room");
    }

    #[test]
    fn a_value_is_not_replaced_by_one_it_is_to_be_kept_against() {
        let cache = BoundedCache::new(1000);
        let newer = |new: &u64, kept: &u64| kept >= new;
        assert_eq!(cache.insert_unless("o", 5, 10, newer), 5);
        assert_eq!(cache.insert_unless("o", 4, 10, newer), 5, "an older version does not replace a newer one");
        assert_eq!(cache.insert_unless("o", 6, 20, newer), 6);
        assert_eq!((cache.get("o"), cache.usage()), (Some(6), (1, 20)));
    }

    #[test]
    fn many_keys_stay_within_the_budget() {
        let cache = BoundedCache::new(64 * 1024);
        for i in 0..100_000 {
            cache.insert(&format!("org-{i}"), i, 100 + i % 300);
        }
        let (n, bytes) = cache.usage();
        assert!(bytes <= 64 * 1024 && n > 100, "{n} values, {bytes} bytes");
        assert_eq!(cache.get("org-99999"), Some(99_999), "the newest is kept");
    }

    #[test]
    fn concurrent_inserts_keep_the_count_of_bytes_true() {
        let cache = std::sync::Arc::new(BoundedCache::new(10_000));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let cache = cache.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        cache.insert(&format!("k-{}", (i * 7 + t) % 500), i, 10 + i % 90);
                        if i % 3 == 0 {
                            cache.remove(&format!("k-{}", (i * 11 + t) % 500));
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let counted: usize = (0..SHARDS).map(|i| cache.lock(i).entries.values().map(|(_, b)| *b).sum::<usize>()).sum();
        let (_, bytes) = cache.usage();
        assert_eq!(bytes, counted);
        assert!(bytes <= 10_000);
    }
}
