//! Cache of namespace evaluations, so the reconciles of a burst in one namespace share one
//! collision analysis instead of each re-analysing every peer (quadratic in the namespace).
//!
//! Validity is by invalidation, not by comparing inputs: the watch handlers (and our own
//! writes of bindings) call [`NamespaceCache::invalidate`] after *every* change of
//! something an evaluation reads (a binding's compile inputs, an objective's or pool's
//! view, a namespace's labels), and [`NamespaceCache::invalidate_all`] for cluster-wide
//! inputs (ClusterSPIFFEIDs kleym does not manage, a cache emptied because its CRD went
//! away). The served-API set is compared on every lookup.
//!
//! Races: an evaluation is stored under the [`Stamp`] taken *before* its inputs were read,
//! and [`NamespaceCache::store`] refuses it when the namespace was invalidated since that
//! stamp, so an evaluation computed from inputs that changed meanwhile is never kept.
//! Invalidations come *after* the data they announce is visible (cache updated, then
//! handler), so a stamp newer than an invalidation always reads the new data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::api_availability::ServedApis;
use kleym_api::InferenceIdentityBinding;

use super::evaluation::NamespaceEvaluation;

/// The logical time a lookup happened; see [`NamespaceCache::store`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u64);

#[derive(Debug)]
struct Cached {
    served: ServedApis,
    evaluation: Arc<NamespaceEvaluation>,
}

#[derive(Debug)]
struct Slot {
    /// Logical time of the namespace's last invalidation.
    invalidated_at: u64,
    /// The current evaluation; dropped on invalidation.
    cached: Option<Cached>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Advances on every invalidation.
    clock: u64,
    /// Last invalidation of any namespace that has no slot (evicted or never stored): a
    /// conservative bound shared by all of them, so slots need not outlive their use.
    absent_invalidated_at: u64,
    slots: HashMap<String, Slot>,
}

/// Namespace evaluations, one per namespace, valid until invalidated. Memory: one
/// evaluation per namespace that has bindings; [`NamespaceCache::evict`] drops a namespace.
#[derive(Debug, Default)]
pub struct NamespaceCache(Mutex<Inner>);

impl NamespaceCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Poisoning only means a panic elsewhere; every update leaves the state consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The valid evaluation of `namespace` under `served`, if any, and the stamp to
    /// [`store`](Self::store) a fresh one under (take it *before* reading the inputs).
    pub fn lookup(
        &self,
        namespace: &str,
        served: &ServedApis,
    ) -> (Stamp, Option<Arc<NamespaceEvaluation>>) {
        let inner = self.lock();
        let hit = inner
            .slots
            .get(namespace)
            .and_then(|s| s.cached.as_ref())
            .filter(|c| c.served == *served)
            .map(|c| Arc::clone(&c.evaluation));
        (Stamp(inner.clock), hit)
    }

    /// Keeps `evaluation` of `namespace`, computed from inputs read after `stamp` was
    /// taken, unless the namespace was invalidated since (then it may be stale). Returns
    /// whether it was kept.
    pub fn store(
        &self,
        namespace: &str,
        stamp: Stamp,
        served: &ServedApis,
        evaluation: Arc<NamespaceEvaluation>,
    ) -> bool {
        let mut inner = self.lock();
        let absent = inner.absent_invalidated_at;
        let invalidated_at = inner
            .slots
            .get(namespace)
            .map_or(absent, |s| s.invalidated_at);
        if invalidated_at > stamp.0 {
            return false;
        }
        let slot = inner
            .slots
            .entry(namespace.to_string())
            .or_insert_with(|| Slot {
                invalidated_at: absent,
                cached: None,
            });
        slot.cached = Some(Cached {
            served: served.clone(),
            evaluation,
        });
        true
    }

    /// Something an evaluation of `namespace` reads changed.
    pub fn invalidate(&self, namespace: &str) {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        match inner.slots.get_mut(namespace) {
            Some(slot) => {
                slot.invalidated_at = now;
                slot.cached = None;
            }
            None => inner.absent_invalidated_at = now,
        }
    }

    /// The binding `namespace/name` changed in a way its evaluation does not read (its
    /// status, say): the current evaluation compares it with its findings again (see
    /// [`NamespaceEvaluation::take_peers_to_check`]). Call it after the change is visible.
    pub fn binding_changed(&self, namespace: &str, name: &str) {
        let inner = self.lock();
        if let Some(cached) = inner.slots.get(namespace).and_then(|s| s.cached.as_ref()) {
            cached.evaluation.check_again(name);
        }
    }

    /// Something every namespace's evaluation reads changed.
    pub fn invalidate_all(&self) {
        let mut inner = self.lock();
        inner.clock += 1;
        inner.absent_invalidated_at = inner.clock;
        inner.slots.clear();
    }

    /// Forgets `namespace` (no bindings left, or the namespace is gone); also an
    /// invalidation.
    pub fn evict(&self, namespace: &str) {
        let mut inner = self.lock();
        inner.clock += 1;
        inner.absent_invalidated_at = inner.clock;
        inner.slots.remove(namespace);
    }

    /// Number of namespaces with a slot (tests, memory checks).
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// True when no namespace has a slot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Do two versions of a binding (`None`: absent) differ in what its namespace evaluation
/// reads: spec, UID, generation (the compile memo's key), being deleted?
pub fn binding_compile_inputs_differ(
    a: Option<&InferenceIdentityBinding>,
    b: Option<&InferenceIdentityBinding>,
) -> bool {
    match (a, b) {
        (None, None) => false,
        (Some(a), Some(b)) => {
            a.metadata.uid != b.metadata.uid
                || a.metadata.generation != b.metadata.generation
                || a.metadata.deletion_timestamp.is_some()
                    != b.metadata.deletion_timestamp.is_some()
                || a.spec != b.spec
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconciler::api_availability::ApiKind;

    fn eval() -> Arc<NamespaceEvaluation> {
        Arc::new(NamespaceEvaluation::default())
    }

    #[test]
    fn stored_evaluation_is_served_until_invalidated() {
        let c = NamespaceCache::default();
        let served = ServedApis::all();
        let (stamp, hit) = c.lookup("a", &served);
        assert!(hit.is_none());
        let e = eval();
        assert!(c.store("a", stamp, &served, e.clone()));
        let (_, hit) = c.lookup("a", &served);
        assert!(hit.is_some_and(|h| Arc::ptr_eq(&h, &e)));
        assert!(c.lookup("b", &served).1.is_none(), "per namespace");

        c.invalidate("b");
        assert!(c.lookup("a", &served).1.is_some(), "other namespace");
        c.invalidate("a");
        assert!(c.lookup("a", &served).1.is_none());
    }

    #[test]
    fn other_served_set_misses() {
        let c = NamespaceCache::default();
        let served = ServedApis::all();
        let (stamp, _) = c.lookup("a", &served);
        c.store("a", stamp, &served, eval());
        let mut fewer = served.clone();
        fewer.set(ApiKind::PoolsLegacy, false);
        assert!(c.lookup("a", &fewer).1.is_none());
    }

    #[test]
    fn evaluation_racing_an_invalidation_is_not_kept() {
        let served = ServedApis::all();
        // Slot exists.
        let c = NamespaceCache::default();
        let (s0, _) = c.lookup("a", &served);
        c.store("a", s0, &served, eval());
        let (stamp, _) = c.lookup("a", &served);
        c.invalidate("a");
        assert!(!c.store("a", stamp, &served, eval()));
        assert!(c.lookup("a", &served).1.is_none());

        // No slot yet.
        let c = NamespaceCache::default();
        let (stamp, _) = c.lookup("a", &served);
        c.invalidate("a");
        assert!(!c.store("a", stamp, &served, eval()));

        // Evicted meanwhile.
        let c = NamespaceCache::default();
        let (s0, _) = c.lookup("a", &served);
        c.store("a", s0, &served, eval());
        let (stamp, _) = c.lookup("a", &served);
        c.evict("a");
        assert!(!c.store("a", stamp, &served, eval()));

        // Everything invalidated meanwhile.
        let c = NamespaceCache::default();
        let (stamp, _) = c.lookup("a", &served);
        c.invalidate_all();
        assert!(!c.store("a", stamp, &served, eval()));

        // A stamp taken after the invalidation is fine.
        let (stamp, _) = c.lookup("a", &served);
        assert!(c.store("a", stamp, &served, eval()));
    }

    #[test]
    fn eviction_and_invalidate_all_release_memory() {
        let c = NamespaceCache::default();
        let served = ServedApis::all();
        for ns in ["a", "b", "c"] {
            let (s, _) = c.lookup(ns, &served);
            c.store(ns, s, &served, eval());
        }
        assert_eq!(c.len(), 3);
        c.evict("a");
        assert_eq!(c.len(), 2);
        c.invalidate("zzz");
        assert_eq!(
            c.len(),
            2,
            "invalidating an unknown namespace allocates nothing"
        );
        c.invalidate_all();
        assert!(c.is_empty());
    }
}
