//! The reconciler's pure state: what it knows and remembers, with no handle to the outside
//! world (no client, queue, events or metrics: those are [`super::effects`]). Steps that
//! only read or remember (compile, plan, the snapshot) take this alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use kleym_api::InferenceIdentityBinding;

use super::api_availability::{ApiKind, ServedApis};
use super::binding_snapshot::SnapshotMemo;
use super::caches::Caches;
use super::claims::NameClaims;
use super::config::CachesSynced;
use super::evaluation::CompileMemo;
use super::index::Index;
use super::ns_cache::{NamespaceCache, binding_compile_inputs_differ};
use super::observed_output::ObservedOutput;
use super::overlay::Overlay;
use super::queue::ObjectKey;
use super::trim::trim_for_cache;
use super::watch_failures::WatchFailures;
use crate::compiler::ForeignSpiffeId;

/// Longest retry delay after repeated failures of one binding.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What one reconciler knows: caches, dependency index, overlays of its own writes, memos
/// and bookkeeping. Interior mutability throughout: shared by the workers and watches.
#[derive(Default)]
pub struct SpokeState {
    /// Watched objects.
    pub caches: Caches,
    /// Dependency index (pool → targets → bindings).
    pub index: RwLock<Index>,
    /// APIs the cluster serves (last discovery).
    pub served: RwLock<ServedApis>,
    /// ClusterSPIFFEID name → binding that wants it (to re-enqueue a binding refused
    /// because a foreign object holds its name when that object goes away).
    pub name_claims: Mutex<NameClaims>,
    /// Consecutive failures per binding and when its retry is due (the error backoff).
    pub failures: Mutex<HashMap<ObjectKey, Failures>>,
    /// Bindings as our own writes returned them (read-your-writes).
    pub binding_overlay: Overlay<InferenceIdentityBinding>,
    /// ClusterSPIFFEIDs as our own writes returned them (read-your-writes).
    pub csid_overlay: Overlay<ObservedOutput>,
    /// ClusterSPIFFEIDs kleym does not manage, by name (overlap warnings).
    pub foreign_spiffe_ids: RwLock<BTreeMap<String, ForeignSpiffeId>>,
    /// Compile results of unchanged bindings.
    pub compile_memo: CompileMemo,
    /// Namespace evaluations shared by the reconciles of a namespace until an input
    /// changes (the watch handlers invalidate them).
    pub namespace_cache: NamespaceCache,
    /// The hub's last snapshot of the bindings, reused while the binding cache is unchanged.
    pub binding_snapshot: SnapshotMemo,
    /// Failures of watches whose cache has not synced yet (why an initial sync is stuck).
    pub watch_failures: WatchFailures,
    /// Woken whenever [`Self::all_synced`] may have changed (a cache completed a list or
    /// was switched on or off, or discovery changed the served set), so that nothing has
    /// to poll it: a hub runs one reconciler per spoke, and four workers and a readiness
    /// flag each polling every spoke added 10 000s of timer wake-ups a second at 1000
    /// spokes.
    sync_changed: Notify,
}

/// A binding's consecutive failures and when its retry is due.
#[derive(Debug, Clone, Copy)]
pub struct Failures {
    /// Consecutive failures.
    pub count: u32,
    /// When the retry [`SpokeState::next_backoff`] scheduled is due.
    pub retry_at: Instant,
}

impl SpokeState {
    /// The served-API set.
    pub fn served(&self) -> ServedApis {
        self.served
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every cache of a served API, and every active one, has completed its first list.
    pub fn all_synced(&self) -> bool {
        let c = &self.caches;
        let served = self.served();
        // The binding cache must be ready even before its watch is active: without it
        // there is nothing to reconcile.
        served.serves(ApiKind::Bindings)
            && c.bindings.is_ready()
            && c.namespaces.is_ready()
            && ApiKind::ALL.into_iter().all(|kind| {
                let cache = c.of_kind(kind);
                // Served counts, not only active: discovery publishes the served set and
                // then starts one watch after another, and a binding list completing in
                // between must not let reconciles run before the other caches exist.
                !(served.serves(kind) || cache.is_active()) || cache.is_ready()
            })
    }

    /// Wakes [`Self::until_synced`] and [`Self::mirror_synced`]: [`Self::all_synced`] may have
    /// changed.
    pub fn sync_may_have_changed(&self) {
        self.sync_changed.notify_waiters();
    }

    /// Returns once [`Self::all_synced`] holds.
    pub async fn until_synced(&self) {
        loop {
            let changed = self.sync_changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a change between the check and the wait
            // wakes it.
            changed.as_mut().enable();
            if self.all_synced() {
                return;
            }
            changed.await;
        }
    }

    /// Keeps `flag` equal to [`Self::all_synced`], for as long as it is awaited.
    pub async fn mirror_synced(&self, flag: &CachesSynced) {
        loop {
            let changed = self.sync_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            flag.set(self.all_synced());
            changed.await;
        }
    }

    /// Backoff for the next retry of `key` after a failure: `base` doubled per consecutive
    /// failure, capped at five minutes.
    pub fn next_backoff(&self, key: &ObjectKey, base: Duration) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let entry = f.entry(key.clone()).or_insert(Failures {
            count: 0,
            retry_at: Instant::now(),
        });
        entry.count = entry.count.saturating_add(1);
        let factor = 1u32 << (entry.count - 1).min(10);
        let delay = (base * factor).min(MAX_BACKOFF);
        entry.retry_at = Instant::now() + delay;
        delay
    }

    /// Whether `key` failed and its retry is not due yet. A peer's reconcile does not
    /// enqueue such a binding ([`super::reconcile::enqueue_changed_peers`]): its retry
    /// derives everything again anyway, and bindings whose writes keep failing would
    /// otherwise enqueue each other at once, around their backoff, as fast as the failures
    /// come back (a collision group on a spoke with a broken connection spun at thousands of
    /// reconciles a second in the chaos soak).
    pub fn backing_off(&self, key: &ObjectKey) -> bool {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_some_and(|f| f.retry_at > Instant::now())
    }

    /// Clears the failure count of `key` after a success.
    pub fn reset_backoff(&self, key: &ObjectKey) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// The binding as we last know it (cache, or our own newer write).
    pub fn current_binding(&self, key: &ObjectKey) -> Option<Arc<InferenceIdentityBinding>> {
        self.current_binding_named(&key.namespace, &key.name)
    }

    /// [`Self::current_binding`] by namespace and name.
    pub fn current_binding_named(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<InferenceIdentityBinding>> {
        let cached = self.caches.bindings.get(namespace, name);
        self.binding_overlay.resolve(namespace, name, cached)
    }

    /// The ClusterSPIFFEID `name` as we last know it.
    pub fn current_cluster_spiffe_id(&self, name: &str) -> Option<Arc<ObservedOutput>> {
        let cached = self.caches.cluster_spiffe_ids.get("", name);
        self.csid_overlay.resolve("", name, cached)
    }

    /// Remembers a binding our write returned (read-your-writes). When that changes what
    /// the namespace evaluation reads of the binding (a spec changed concurrently), the
    /// cached evaluation of its namespace is stale. Returns the recorded binding (shared
    /// with the overlay, without the metadata the caches drop).
    pub fn record_binding_write(
        &self,
        key: &ObjectKey,
        mut updated: InferenceIdentityBinding,
    ) -> Arc<InferenceIdentityBinding> {
        let before = self.current_binding(key);
        trim_for_cache(&mut updated);
        let recorded = self.binding_overlay.record(updated);
        let after = self.current_binding(key);
        if binding_compile_inputs_differ(before.as_deref(), after.as_deref()) {
            self.namespace_cache.invalidate(&key.namespace);
        } else {
            self.namespace_cache
                .binding_changed(&key.namespace, &key.name);
        }
        recorded
    }

    /// Remembers that our own delete removed the ClusterSPIFFEID `name` with `uid`.
    pub fn record_cluster_spiffe_id_deleted(&self, name: &str, uid: &str) {
        self.csid_overlay.record_deleted(uid);
        self.csid_overlay.forget("", name);
    }

    /// Records that `key` wants the ClusterSPIFFEID `name` (and no other).
    pub fn claim_name(&self, name: &str, key: &ObjectKey) {
        self.name_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .claim(name, key);
    }

    /// Forgets every name `key` claimed.
    pub fn release_claims(&self, key: &ObjectKey) {
        self.name_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(key);
    }
}
