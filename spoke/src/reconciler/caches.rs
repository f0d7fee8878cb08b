//! In-memory caches of the objects the reconciler reads, fed by watches.
//!
//! A small reflector of our own rather than kube-runtime's `Store`, because the watch
//! handlers need the *previous* version of an object (to notice that only a status or a
//! label changed) and the objects a relist removed, and because a cache can be switched
//! off and on while running (a CRD that disappears and comes back).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Namespace;
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::pool::{v1, v1alpha2};
use kube::runtime::watcher;

use super::api_availability::ApiKind;
use super::observed_output::ObservedOutput;
use super::target_record::TargetRecord;
use super::trim::CacheEntry;

/// `(namespace, name)`; namespace is empty for cluster-scoped objects.
pub type CacheKey = (String, String);

/// One change the cache applied.
#[derive(Debug, Clone)]
pub enum Change<K> {
    /// Added or modified: previous version (if any) and the new one.
    Upsert {
        /// The version before the change.
        old: Option<Arc<K>>,
        /// The version after the change.
        new: Arc<K>,
    },
    /// Removed (deleted, or missing from a relist).
    Removed(Arc<K>),
}

/// Objects by namespace, then name: a read by `(&str, &str)` allocates nothing (reads
/// run for every namespace peer on every reconcile).
#[derive(Debug)]
struct Objects<K> {
    by_namespace: HashMap<String, HashMap<String, Arc<K>>>,
    len: usize,
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Self {
            by_namespace: HashMap::new(),
            len: 0,
        }
    }
}

impl<K> Objects<K> {
    fn get(&self, namespace: &str, name: &str) -> Option<&Arc<K>> {
        self.by_namespace.get(namespace)?.get(name)
    }

    fn insert(&mut self, (namespace, name): CacheKey, obj: Arc<K>) -> Option<Arc<K>> {
        let old = self
            .by_namespace
            .entry(namespace)
            .or_default()
            .insert(name, obj);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    fn remove(&mut self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let names = self.by_namespace.get_mut(namespace)?;
        let old = names.remove(name)?;
        if names.is_empty() {
            self.by_namespace.remove(namespace);
        }
        self.len -= 1;
        Some(old)
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &str, &Arc<K>)> {
        self.by_namespace
            .iter()
            .flat_map(|(ns, names)| names.iter().map(move |(n, o)| (ns.as_str(), n.as_str(), o)))
    }

    fn into_values(self) -> impl Iterator<Item = Arc<K>> {
        self.by_namespace
            .into_values()
            .flat_map(HashMap::into_values)
    }
}

#[derive(Debug)]
struct Inner<K> {
    objects: Objects<K>,
    relist: Option<Objects<K>>,
}

/// A cache of one kind.
#[derive(Debug)]
pub struct Cache<K> {
    inner: RwLock<Inner<K>>,
    ready: AtomicBool,
    active: AtomicBool,
    /// Bumped (under the write lock) whenever the visible objects may have changed.
    version: AtomicU64,
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            inner: RwLock::new(Inner {
                objects: Objects::default(),
                relist: None,
            }),
            ready: AtomicBool::new(false),
            active: AtomicBool::new(false),
            version: AtomicU64::new(0),
        }
    }
}

fn key_of<K: CacheEntry>(obj: &K) -> CacheKey {
    let (namespace, name) = obj.entry_key();
    (namespace.to_string(), name.to_string())
}

impl<K: CacheEntry> Cache<K> {
    /// Reads one object.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.objects.get(namespace, name).cloned()
    }

    /// Runs `read` on the objects of `namespace` by name (`None`: none cached) under one
    /// read lock, for many reads in one namespace. `read` must not touch this cache.
    pub fn read_namespace<R>(
        &self,
        namespace: &str,
        read: impl FnOnce(Option<&HashMap<String, Arc<K>>>) -> R,
    ) -> R {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        read(inner.objects.by_namespace.get(namespace))
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .objects
            .iter()
            .map(|(_, _, o)| Arc::clone(o))
            .collect()
    }

    /// Number of cached objects.
    pub fn len(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.objects.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once the first full list has been applied since the watch (re)started.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// True while a watch feeds this cache (the API is served).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// A number that changes whenever the cached objects may have changed (an upsert, a
    /// delete, a completed relist, deactivation): equal numbers mean an unchanged cache.
    /// Read it *before* reading the objects, so a change racing the read is seen as new.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Marks the cache as fed by a (new) watch; it becomes ready after its first list.
    pub fn activate(&self) {
        self.active.store(true, Ordering::Release);
    }

    /// Stops using the cache (API no longer served): empties it and returns what it held.
    pub fn deactivate(&self) -> Vec<Arc<K>> {
        self.active.store(false, Ordering::Release);
        self.ready.store(false, Ordering::Release);
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.relist = None;
        self.version.fetch_add(1, Ordering::AcqRel);
        std::mem::take(&mut inner.objects).into_values().collect()
    }

    /// Applies one watcher event and returns the resulting changes. The objects come
    /// shared: a watch echo of our own write is the very object the write recorded.
    pub fn apply(&self, event: watcher::Event<Arc<K>>) -> Vec<Change<K>> {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match event {
            watcher::Event::Apply(new) => {
                self.version.fetch_add(1, Ordering::AcqRel);
                let old = inner.objects.insert(key_of(new.as_ref()), new.clone());
                vec![Change::Upsert { old, new }]
            }
            watcher::Event::Delete(obj) => {
                self.version.fetch_add(1, Ordering::AcqRel);
                let (namespace, name) = key_of(obj.as_ref());
                let old = inner.objects.remove(&namespace, &name);
                vec![Change::Removed(old.unwrap_or(obj))]
            }
            watcher::Event::Init => {
                inner.relist = Some(Objects::default());
                Vec::new()
            }
            watcher::Event::InitApply(obj) => {
                inner
                    .relist
                    .get_or_insert_with(Objects::default)
                    .insert(key_of(obj.as_ref()), obj);
                Vec::new()
            }
            watcher::Event::InitDone => {
                self.version.fetch_add(1, Ordering::AcqRel);
                let fresh = inner.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut inner.objects, fresh);
                let mut changes = Vec::new();
                for (ns, name, new) in inner.objects.iter() {
                    changes.push(Change::Upsert {
                        old: old.get(ns, name).cloned(),
                        new: new.clone(),
                    });
                }
                for (ns, name, gone) in old.iter() {
                    if inner.objects.get(ns, name).is_none() {
                        changes.push(Change::Removed(gone.clone()));
                    }
                }
                drop(inner);
                self.ready.store(true, Ordering::Release);
                changes
            }
        }
    }
}

/// All caches of one spoke.
#[derive(Debug, Default)]
pub struct Caches {
    /// `InferenceIdentityBinding`s.
    pub bindings: Cache<InferenceIdentityBinding>,
    /// `llm-d.ai` objectives, as [`TargetRecord`]s.
    pub objectives_llmd: Cache<TargetRecord>,
    /// `inference.networking.x-k8s.io` objectives, as [`TargetRecord`]s.
    pub objectives_gaie: Cache<TargetRecord>,
    /// Legacy InferenceModels, as [`TargetRecord`]s.
    pub models: Cache<TargetRecord>,
    /// v1 InferencePools.
    pub pools_v1: Cache<v1::InferencePool>,
    /// Legacy InferencePools.
    pub pools_legacy: Cache<v1alpha2::InferencePool>,
    /// Every ClusterSPIFFEID (ours are told apart by UID, not by label), as an
    /// [`ObservedOutput`].
    pub cluster_spiffe_ids: Cache<ObservedOutput>,
    /// Namespaces (labels, for overlap analysis of other ClusterSPIFFEIDs).
    pub namespaces: Cache<Namespace>,
}

impl Caches {
    /// The cache `kind`'s watch feeds, as discovery and readiness see it.
    pub fn of_kind(&self, kind: ApiKind) -> &dyn CacheControl {
        match kind {
            ApiKind::Bindings => &self.bindings,
            ApiKind::ObjectivesLlmd => &self.objectives_llmd,
            ApiKind::ObjectivesGaie => &self.objectives_gaie,
            ApiKind::Models => &self.models,
            ApiKind::PoolsV1 => &self.pools_v1,
            ApiKind::PoolsLegacy => &self.pools_legacy,
            ApiKind::ClusterSpiffeIds => &self.cluster_spiffe_ids,
        }
    }
}

/// What discovery and readiness need of a cache, whatever its object type.
pub trait CacheControl {
    /// Has a watch been started for it?
    fn is_active(&self) -> bool;
    /// Has it completed its first list?
    fn is_ready(&self) -> bool;
    /// Stops using it (the API is no longer served) and empties it.
    fn deactivate(&self);
}

impl<K: CacheEntry> CacheControl for Cache<K> {
    fn is_active(&self) -> bool {
        Cache::is_active(self)
    }

    fn is_ready(&self) -> bool {
        Cache::is_ready(self)
    }

    fn deactivate(&self) {
        Cache::deactivate(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;

    fn cm(name: &str, v: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        c.metadata.resource_version = Some(v.into());
        c
    }

    #[test]
    fn relist_reports_updates_and_removals_and_swaps_atomically() {
        let cache: Cache<ConfigMap> = Cache::default();
        cache.activate();
        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(Arc::new(cm("a", "1"))));
        cache.apply(watcher::Event::InitApply(Arc::new(cm("b", "1"))));
        assert!(cache.is_empty(), "a partial list is not visible");
        assert!(!cache.is_ready());
        cache.apply(watcher::Event::InitDone);
        assert!(cache.is_ready());
        assert_eq!(cache.len(), 2);

        cache.apply(watcher::Event::Init);
        cache.apply(watcher::Event::InitApply(Arc::new(cm("a", "2"))));
        assert!(
            cache.get("ns", "b").is_some(),
            "old state stays until the list completes"
        );
        let changes = cache.apply(watcher::Event::InitDone);
        let removed: Vec<_> = changes
            .iter()
            .filter_map(|c| match c {
                Change::Removed(o) => Some(o.name_any()),
                _ => None,
            })
            .collect();
        assert_eq!(removed, vec!["b".to_string()]);
        let upserted_old_rv: Vec<_> = changes
            .iter()
            .filter_map(|c| match c {
                Change::Upsert { old, .. } => old.as_ref().and_then(|o| o.resource_version()),
                _ => None,
            })
            .collect();
        assert_eq!(upserted_old_rv, vec!["1".to_string()]);
    }

    #[test]
    fn apply_and_delete_return_previous_versions() {
        let cache: Cache<ConfigMap> = Cache::default();
        cache.apply(watcher::Event::Apply(Arc::new(cm("a", "1"))));
        let ch = cache.apply(watcher::Event::Apply(Arc::new(cm("a", "2"))));
        assert!(
            matches!(&ch[0], Change::Upsert { old: Some(o), .. } if o.resource_version().as_deref() == Some("1"))
        );
        cache.apply(watcher::Event::Delete(Arc::new(cm("a", "3"))));
        assert!(cache.get("ns", "a").is_none());
        cache.apply(watcher::Event::Apply(Arc::new(cm("z", "1"))));
        assert_eq!(cache.deactivate().len(), 1);
        assert!(cache.is_empty() && !cache.is_active());
    }
}
