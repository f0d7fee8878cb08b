//! A size-bounded map whose entries expire.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::SystemTime;

/// A bounded TTL cache. When full, expired entries are purged first, then the entry closest
/// to expiry (the oldest among equals) is evicted: a flood of new keys cannot grow memory, only churn the cache.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    inner: Mutex<Entries<K, V>>,
    capacity: usize,
}

/// Entries with their expiry and insertion number (ties on expiry evict the oldest).
#[derive(Debug)]
struct Entries<K, V> {
    map: HashMap<K, (V, SystemTime, u64)>,
    next_seq: u64,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    /// A cache holding at most `capacity` entries (0 disables caching).
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Entries {
                map: HashMap::new(),
                next_seq: 0,
            }),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<K, V>> {
        // A panic while holding the lock leaves a consistent map (single-step mutations).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live value for `key` at `now` (an expired entry is removed).
    pub fn get(&self, key: &K, now: SystemTime) -> Option<V> {
        let map = &mut self.lock().map;
        match map.get(key) {
            Some((v, exp, _)) if *exp > now => Some(v.clone()),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Store `value` for `key` until `expires` (ignored if `expires <= now`).
    pub fn insert(&self, key: K, value: V, expires: SystemTime, now: SystemTime) {
        if self.capacity == 0 || expires <= now {
            return;
        }
        let mut entries = self.lock();
        let seq = entries.next_seq;
        entries.next_seq += 1;
        let map = &mut entries.map;
        if map.len() >= self.capacity && !map.contains_key(&key) {
            map.retain(|_, (_, exp, _)| *exp > now);
            if map.len() >= self.capacity
                && let Some(victim) = map
                    .iter()
                    .min_by_key(|(_, (_, exp, seq))| (*exp, *seq))
                    .map(|(k, _)| k.clone())
            {
                map.remove(&victim);
            }
        }
        map.insert(key, (value, expires, seq));
    }

    /// Drop `key`.
    pub fn remove(&self, key: &K) {
        self.lock().map.remove(key);
    }

    /// Number of entries (including not yet purged expired ones).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether the cache holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn expires_and_stays_bounded() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let s = Duration::from_secs;
        let c = TtlCache::new(3);
        c.insert("a", 1, t0 + s(10), t0);
        assert_eq!(c.get(&"a", t0 + s(9)), Some(1));
        assert_eq!(c.get(&"a", t0 + s(10)), None);
        assert!(c.is_empty());
        c.insert("x", 0, t0, t0); // already expired: not stored
        assert!(c.is_empty());
        c.insert("a", 1, t0 + s(5), t0);
        c.insert("b", 2, t0 + s(50), t0);
        c.insert("c", 3, t0 + s(30), t0);
        c.insert("d", 4, t0 + s(40), t0); // full: evicts "a" (closest to expiry)
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&"a", t0), None);
        assert_eq!(c.get(&"d", t0), Some(4));
        // Expired entries are purged before anything live is evicted.
        c.insert("e", 5, t0 + s(100), t0 + s(35));
        assert_eq!(c.get(&"b", t0 + s(35)), Some(2));
        assert_eq!(c.get(&"d", t0 + s(35)), Some(4));
        assert_eq!(c.get(&"e", t0 + s(35)), Some(5));
        assert_eq!(c.len(), 3);
        // Equal expiries: the oldest insertion goes first.
        let eq = TtlCache::new(2);
        for k in ["p", "q", "r"] {
            eq.insert(k, 0, t0 + s(10), t0);
        }
        assert_eq!(eq.get(&"p", t0), None);
        assert_eq!(eq.get(&"q", t0), Some(0));
        assert_eq!(eq.get(&"r", t0), Some(0));
        let off = TtlCache::new(0);
        off.insert("a", 1, t0 + s(10), t0);
        assert!(off.is_empty());
    }
}
