//! Read-your-writes over the watch caches.
//!
//! A reconcile that wrote the status or the ClusterSPIFFEID can be followed by another
//! reconcile of the same binding before the watch delivered those writes; reading the
//! stale cache then would send the same write again. The overlay remembers the objects our
//! writes returned, and a read takes whichever of cache and overlay is newer (numeric
//! resourceVersions, as kube-apiserver and kubesim issue them; with opaque versions the
//! cache wins).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;

/// Objects written by us, until the cache catches up.
#[derive(Debug)]
pub struct Overlay<K> {
    written: Mutex<Written<K>>,
    deleted_uids: Mutex<HashSet<String>>,
}

impl<K> Default for Overlay<K> {
    fn default() -> Self {
        Self {
            written: Mutex::new(Written::default()),
            deleted_uids: Mutex::new(HashSet::new()),
        }
    }
}

/// Written objects by namespace, then name: reads by `(&str, &str)` allocate nothing
/// (every reconcile reads every namespace peer through the overlay).
#[derive(Debug)]
struct Written<K> {
    by_namespace: HashMap<String, HashMap<String, Versions<K>>>,
}

/// How many of our writes of one object are remembered until their echoes arrive. A
/// binding's reconcile writes it twice in a row (finalizer, then status), and the first
/// echo can arrive after the second write returned: keeping only the last write would
/// leave that echo unrecognised, decoded whole and reconciled again. (Rare in fleet-bench;
/// docs/benchmarks.md, "What moved the numbers".)
const VERSIONS_KEPT: usize = 4;

/// Our writes of one object whose echoes have not all arrived, oldest first.
#[derive(Debug)]
struct Versions<K>(Vec<Arc<K>>);

impl<K> Versions<K> {
    fn latest(&self) -> Option<&Arc<K>> {
        self.0.last()
    }
}

impl<K> Default for Written<K> {
    fn default() -> Self {
        Self {
            by_namespace: HashMap::new(),
        }
    }
}

impl<K> Written<K> {
    fn is_empty(&self) -> bool {
        self.by_namespace.is_empty()
    }

    fn versions(&self, namespace: &str, name: &str) -> Option<&Versions<K>> {
        self.by_namespace.get(namespace)?.get(name)
    }

    /// Our last write of `namespace/name`.
    fn get(&self, namespace: &str, name: &str) -> Option<&Arc<K>> {
        self.versions(namespace, name)?.latest()
    }

    fn insert(&mut self, namespace: String, name: String, obj: Arc<K>)
    where
        K: kube::Resource,
    {
        let versions = self
            .by_namespace
            .entry(namespace)
            .or_default()
            .entry(name)
            .or_insert_with(|| Versions(Vec::with_capacity(2)));
        // A write that changed nothing returns the version we already hold.
        if let Some(last) = versions.0.last_mut()
            && last.meta().resource_version == obj.meta().resource_version
        {
            *last = obj;
            return;
        }
        if versions.0.len() >= VERSIONS_KEPT {
            // An echo this far behind is decoded like anyone else's change.
            versions.0.remove(0);
        }
        versions.0.push(obj);
    }

    /// Keeps only the writes of `namespace/name` for which `keep` holds.
    fn retain(&mut self, namespace: &str, name: &str, keep: impl Fn(&Arc<K>) -> bool) {
        if let Some(names) = self.by_namespace.get_mut(namespace) {
            if let Some(versions) = names.get_mut(name) {
                versions.0.retain(|w| keep(w));
                if versions.0.is_empty() {
                    names.remove(name);
                }
            }
            if names.is_empty() {
                self.by_namespace.remove(namespace);
            }
        }
    }

    fn remove(&mut self, namespace: &str, name: &str) {
        self.retain(namespace, name, |_| false);
    }
}

fn rv_number<K: kube::Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

impl<K: kube::Resource + Clone> Overlay<K> {
    /// Remembers an object a write returned, in the form the cache keeps it
    /// ([`CacheForm`](super::trim::CacheForm)), and returns it as recorded.
    pub fn record(&self, obj: K) -> Arc<K> {
        let (namespace, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
        let obj = Arc::new(obj);
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(namespace, name, Arc::clone(&obj));
        obj
    }

    /// Remembers that we deleted the incarnation `uid`.
    pub fn record_deleted(&self, uid: &str) {
        self.deleted_uids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_string());
    }

    /// The cache saw `uid` removed: forget it.
    pub fn forget_deleted(&self, uid: &str) {
        self.deleted_uids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Forgets everything about `namespace/name`.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(namespace, name);
    }

    /// Is `rv` a resourceVersion one of our recent writes of `namespace/name` returned? (Its
    /// watch echo then needs no reconcile: the writer already acted on it.)
    pub fn is_own_write(&self, namespace: &str, name: &str, rv: Option<&str>) -> bool {
        rv.is_some_and(|rv| self.own_write(namespace, name, rv).is_some())
    }

    /// Our own recent write of `namespace/name` that returned resourceVersion `rv`: the
    /// object its watch echo carries, already decoded.
    pub fn own_write(&self, namespace: &str, name: &str, rv: &str) -> Option<Arc<K>> {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .versions(namespace, name)?
            .0
            .iter()
            .rev()
            .find(|mine| mine.meta().resource_version.as_deref() == Some(rv))
            .cloned()
    }

    /// The cache now holds `namespace/name` at resourceVersion `cached_rv`: forgets our
    /// writes of it that are as new or older. [`Self::resolve`] would drop them at its next
    /// read anyway, but the last write of a binding or ClusterSPIFFEID is often never read
    /// again, and its entry kept a second copy of the object for as long as the object
    /// lived (the cache holds the watch's copy of the same version).
    pub fn caught_up(&self, namespace: &str, name: &str, cached_rv: Option<&str>) {
        let Some(cached) = cached_rv.and_then(|rv| rv.parse::<u64>().ok()) else {
            return;
        };
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(namespace, name, |mine| {
                rv_number(mine.as_ref()).is_none_or(|mine| mine > cached)
            });
    }

    /// Our last write of `namespace/name` not yet superseded by the cache, if any.
    pub fn peek(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(namespace, name)
            .cloned()
    }

    /// The newest known version of `namespace/name`, given the cached one.
    pub fn resolve(&self, namespace: &str, name: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        // Called for every namespace peer on every reconcile: allocates nothing.
        let cached = cached.filter(|c| {
            c.meta().uid.as_deref().is_none_or(|u| {
                !self
                    .deleted_uids
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(u)
            })
        });
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        if written.is_empty() {
            return cached;
        }
        let Some(mine) = written.get(namespace, name) else {
            return cached;
        };
        let mine_rv = rv_number(mine.as_ref());
        let cached_rv = cached.as_deref().and_then(rv_number);
        match (mine_rv, cached_rv) {
            (Some(m), Some(c)) if c < m => Some(Arc::clone(mine)),
            (Some(_), None) if cached.is_none() => Some(Arc::clone(mine)),
            _ => {
                // The cache caught up (or versions are not comparable): drop the overlay.
                written.remove(namespace, name);
                cached
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(rv: &str, uid: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some("a".into());
        c.metadata.namespace = Some("ns".into());
        c.metadata.resource_version = Some(rv.into());
        c.metadata.uid = Some(uid.into());
        c
    }

    #[test]
    fn newer_write_wins_until_the_cache_catches_up() {
        let o: Overlay<ConfigMap> = Overlay::default();
        o.record(cm("7", "u"));
        let got = o.resolve("ns", "a", Some(Arc::new(cm("5", "u")))).unwrap();
        assert_eq!(got.resource_version().as_deref(), Some("7"));
        let got = o.resolve("ns", "a", None).unwrap();
        assert_eq!(got.resource_version().as_deref(), Some("7"));
        let got = o.resolve("ns", "a", Some(Arc::new(cm("9", "u")))).unwrap();
        assert_eq!(got.resource_version().as_deref(), Some("9"));
        // Dropped once caught up.
        let got = o.resolve("ns", "a", Some(Arc::new(cm("8", "u")))).unwrap();
        assert_eq!(got.resource_version().as_deref(), Some("8"));
    }

    #[test]
    fn a_cache_that_caught_up_drops_the_write() {
        let o: Overlay<ConfigMap> = Overlay::default();
        o.record(cm("7", "u"));
        o.caught_up("ns", "a", Some("6"));
        assert!(
            o.peek("ns", "a").is_some(),
            "an older cache keeps the write"
        );
        o.caught_up("ns", "a", None);
        o.caught_up("ns", "a", Some("opaque"));
        assert!(o.peek("ns", "a").is_some(), "incomparable versions keep it");
        o.caught_up("ns", "b", Some("9"));
        assert!(
            o.peek("ns", "a").is_some(),
            "another object's version keeps it"
        );
        o.caught_up("ns", "a", Some("7"));
        assert!(
            o.peek("ns", "a").is_none(),
            "the echo of the write drops it"
        );
        o.record(cm("8", "u"));
        o.caught_up("ns", "a", Some("9"));
        assert!(o.peek("ns", "a").is_none(), "a newer cache drops it");
    }

    #[test]
    fn own_write_is_recognised_by_resource_version() {
        let o: Overlay<ConfigMap> = Overlay::default();
        o.record(cm("7", "u"));
        assert!(o.is_own_write("ns", "a", Some("7")));
        assert!(!o.is_own_write("ns", "a", Some("8")));
        assert!(!o.is_own_write("ns", "b", Some("7")));
    }

    #[test]
    fn earlier_writes_are_known_until_the_cache_passes_them() {
        let o: Overlay<ConfigMap> = Overlay::default();
        o.record(cm("7", "u"));
        o.record(cm("8", "u"));
        assert!(o.is_own_write("ns", "a", Some("7")));
        assert!(o.is_own_write("ns", "a", Some("8")));
        assert_eq!(
            o.peek("ns", "a").unwrap().resource_version().as_deref(),
            Some("8"),
            "reads take the last write"
        );
        o.caught_up("ns", "a", Some("7"));
        assert!(!o.is_own_write("ns", "a", Some("7")), "the cache holds it");
        assert!(o.is_own_write("ns", "a", Some("8")));
        // A read that finds the cache caught up forgets every write.
        o.record(cm("9", "u"));
        o.record(cm("10", "u"));
        assert!(
            o.resolve("ns", "a", Some(Arc::new(cm("10", "u"))))
                .is_some()
        );
        assert!(!o.is_own_write("ns", "a", Some("9")));
        assert!(o.peek("ns", "a").is_none());
    }

    #[test]
    fn only_the_last_few_writes_are_kept() {
        let o: Overlay<ConfigMap> = Overlay::default();
        for rv in 1..=(VERSIONS_KEPT as u64 + 1) {
            o.record(cm(&rv.to_string(), "u"));
        }
        assert!(
            !o.is_own_write("ns", "a", Some("1")),
            "the oldest is dropped"
        );
        // A write returning the version held replaces it rather than taking a place.
        o.record(cm(&(VERSIONS_KEPT as u64 + 1).to_string(), "u"));
        for rv in 2..=(VERSIONS_KEPT as u64 + 1) {
            assert!(o.is_own_write("ns", "a", Some(&rv.to_string())), "{rv}");
        }
        o.forget("ns", "a");
        assert!(!o.is_own_write("ns", "a", Some("2")));
    }

    #[test]
    fn deleted_incarnation_reads_as_absent() {
        let o: Overlay<ConfigMap> = Overlay::default();
        o.record_deleted("u");
        assert!(o.resolve("ns", "a", Some(Arc::new(cm("5", "u")))).is_none());
        assert!(o.resolve("ns", "a", Some(Arc::new(cm("6", "v")))).is_some());
        o.forget_deleted("u");
        assert!(o.resolve("ns", "a", Some(Arc::new(cm("5", "u")))).is_some());
    }
}
