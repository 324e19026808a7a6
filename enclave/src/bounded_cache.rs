//! A map bounded by bytes on every insert, least recently used out: how the enclave keeps
//! organizations' states and log heads without growing with the number of organizations.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;

use hashlink::LinkedHashMap;

/// Shards, so that organizations' requests rarely wait on each other's lookups.
const SHARDS: usize = 16;

/// Values by key, at most `budget` bytes in all (as the caller weighs each value), the least
/// recently used dropped first. A value heavier than a shard's share of the budget is not kept.
pub struct BoundedCache<V> {
    shards: Vec<Mutex<Shard<V>>>,
    shard_budget: usize,
    hasher: RandomState,
}

struct Shard<V> {
    /// Least recently used first.
    entries: LinkedHashMap<String, (V, usize)>,
    bytes: usize,
}

impl<V: Clone> BoundedCache<V> {
    pub fn new(budget: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard { entries: LinkedHashMap::new(), bytes: 0 })).collect(),
            shard_budget: budget / SHARDS,
            hasher: RandomState::new(),
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) % SHARDS as u64) as usize
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard<V>> {
        // A panic while a shard was held leaves it consistent (no method panics mid-update).
        self.shards[self.shard_of(key)].lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The value of `key`, now the most recently used.
    pub fn get(&self, key: &str) -> Option<V> {
        self.shard(key).entries.to_back(key).map(|(v, _)| v.clone())
    }

    /// Keeps `value` (weighing `bytes`) for `key`, replacing what it had, and drops the least
    /// recently used values until the shard is within its budget again.
    pub fn insert(&self, key: &str, value: V, bytes: usize) {
        let mut shard = self.shard(key);
        if let Some((_, old)) = shard.entries.remove(key) {
            shard.bytes -= old;
        }
        if bytes > self.shard_budget {
            return;
        }
        shard.bytes += bytes;
        shard.entries.insert(key.to_string(), (value, bytes));
        while shard.bytes > self.shard_budget {
            let Some((_, (_, dropped))) = shard.entries.pop_front() else { break };
            shard.bytes -= dropped;
        }
    }

    pub fn remove(&self, key: &str) {
        let mut shard = self.shard(key);
        if let Some((_, bytes)) = shard.entries.remove(key) {
            shard.bytes -= bytes;
        }
    }

    /// What the values may weigh together.
    pub fn budget(&self) -> usize {
        self.shard_budget * SHARDS
    }

    /// Values kept, and their weight.
    pub fn usage(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(n, b), s| {
            let s = s.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            (n + s.entries.len(), b + s.bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_and_the_budget_holds_on_every_insert() {
        // One shard's share is 100 bytes.
        let cache = BoundedCache::new(100 * SHARDS);
        // Keys of one shard.
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
        // A replacement is weighed anew; heavier than a share, it is not kept (nor the old one).
        cache.insert(&keys[0], 10, 70);
        assert_eq!(cache.usage(), (2, 100));
        cache.insert(&keys[3], 30, 101);
        assert_eq!((cache.get(&keys[3]), cache.usage()), (None, (1, 70)));
        cache.remove(&keys[0]);
        assert_eq!(cache.usage(), (0, 0));
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
}
