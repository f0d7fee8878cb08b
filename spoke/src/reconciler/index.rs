//! Reverse index from the objects a binding depends on to the bindings, so that a change
//! enqueues only the bindings it affects: pool → targets (objectives, legacy models) →
//! bindings. Pure data structure; the watch handlers keep it current.
//!
//! Entries are keyed by what the *current* object says (each upsert first removes what the
//! previous version said), so the index never needs the old object of an update.

use std::collections::{BTreeSet, HashMap, HashSet};

use kleym_api::TargetKind;

use super::queue::ObjectKey;

/// A binding's target as the binding names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TargetKey {
    /// Namespace (a target is always in the binding's namespace).
    pub namespace: String,
    /// Objective or legacy model.
    pub kind: TargetKind,
    /// Target name.
    pub name: String,
}

/// One concrete target object (objectives exist in two groups).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceKey {
    /// API group of the object.
    pub group: String,
    /// The target it can satisfy.
    pub target: TargetKey,
}

/// The names of the bindings that name one target, sorted. Nearly always one or two: a
/// `BTreeSet` allocates a node for 11 names (about 280 bytes) on its first insert, and the
/// index keeps one set per target of every spoke.
#[derive(Debug, Default)]
struct SortedNames(Vec<String>);

impl SortedNames {
    fn insert(&mut self, name: String) {
        if let Err(i) = self.position(&name) {
            self.0.insert(i, name);
        }
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|n| n.as_str().cmp(name))
    }
}

/// A set of binding names the index can drop a name from.
trait NameSet {
    fn remove_name(&mut self, name: &str);
    fn is_empty(&self) -> bool;
}

impl NameSet for SortedNames {
    fn remove_name(&mut self, name: &str) {
        if let Ok(i) = self.position(name) {
            self.0.remove(i);
        }
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl NameSet for BTreeSet<String> {
    fn remove_name(&mut self, name: &str) {
        self.remove(name);
    }
    fn is_empty(&self) -> bool {
        BTreeSet::is_empty(self)
    }
}

/// The index. Not thread-safe by itself; the context wraps it in a lock.
#[derive(Debug, Default)]
pub struct Index {
    binding_target: HashMap<ObjectKey, TargetKey>,
    target_bindings: HashMap<TargetKey, SortedNames>,
    namespace_bindings: HashMap<String, BTreeSet<String>>,
    source_pool: HashMap<SourceKey, String>,
    pool_sources: HashMap<(String, String), HashSet<SourceKey>>,
}

impl Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records (or updates) which target a binding names.
    pub fn upsert_binding(&mut self, key: &ObjectKey, target: TargetKey) {
        if self.binding_target.get(key) == Some(&target) {
            return;
        }
        self.remove_binding(key);
        self.target_bindings
            .entry(target.clone())
            .or_default()
            .insert(key.name.clone());
        self.namespace_bindings
            .entry(key.namespace.clone())
            .or_default()
            .insert(key.name.clone());
        self.binding_target.insert(key.clone(), target);
    }

    /// Forgets a binding.
    pub fn remove_binding(&mut self, key: &ObjectKey) {
        if let Some(old) = self.binding_target.remove(key) {
            remove_from(&mut self.target_bindings, &old, &key.name);
            remove_from(&mut self.namespace_bindings, &key.namespace, &key.name);
        }
    }

    /// Records (or updates) the pool a target object points at.
    pub fn upsert_source(&mut self, source: SourceKey, pool_name: String) {
        if self.source_pool.get(&source) == Some(&pool_name) {
            return;
        }
        self.remove_source(&source);
        self.pool_sources
            .entry((source.target.namespace.clone(), pool_name.clone()))
            .or_default()
            .insert(source.clone());
        self.source_pool.insert(source, pool_name);
    }

    /// Forgets a target object.
    pub fn remove_source(&mut self, source: &SourceKey) {
        if let Some(pool) = self.source_pool.remove(source) {
            let pk = (source.target.namespace.clone(), pool);
            if let Some(set) = self.pool_sources.get_mut(&pk) {
                set.remove(source);
                if set.is_empty() {
                    self.pool_sources.remove(&pk);
                }
            }
        }
    }

    /// Bindings that name `target`.
    pub fn bindings_for_target(&self, target: &TargetKey) -> Vec<ObjectKey> {
        self.target_bindings
            .get(target)
            .map(|names| {
                names
                    .0
                    .iter()
                    .map(|n| ObjectKey::new(target.namespace.clone(), n.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Bindings whose target points at the pool `namespace/pool_name` (either pool group:
    /// a rare over-approximation that costs one no-op reconcile).
    pub fn bindings_for_pool(&self, namespace: &str, pool_name: &str) -> Vec<ObjectKey> {
        let mut out = BTreeSet::new();
        if let Some(sources) = self
            .pool_sources
            .get(&(namespace.to_string(), pool_name.to_string()))
        {
            for s in sources {
                out.extend(self.bindings_for_target(&s.target));
            }
        }
        out.into_iter().collect()
    }

    /// Every binding of a namespace, sorted by name.
    pub fn bindings_in_namespace(&self, namespace: &str) -> Vec<ObjectKey> {
        self.namespace_bindings
            .get(namespace)
            .map(|names| {
                names
                    .iter()
                    .map(|n| ObjectKey::new(namespace, n.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every known binding.
    pub fn all_bindings(&self) -> Vec<ObjectKey> {
        self.binding_target.keys().cloned().collect()
    }

    /// Number of known bindings.
    pub fn binding_count(&self) -> usize {
        self.binding_target.len()
    }
}

fn remove_from<K: std::hash::Hash + Eq + Clone, S: NameSet>(
    map: &mut HashMap<K, S>,
    key: &K,
    name: &str,
) {
    if let Some(set) = map.get_mut(key) {
        set.remove_name(name);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objective(ns: &str, name: &str) -> TargetKey {
        TargetKey {
            namespace: ns.into(),
            kind: TargetKind::InferenceObjective,
            name: name.into(),
        }
    }

    fn source(group: &str, target: TargetKey) -> SourceKey {
        SourceKey {
            group: group.into(),
            target,
        }
    }

    fn names(keys: Vec<ObjectKey>) -> Vec<String> {
        keys.into_iter().map(|k| k.to_string()).collect()
    }

    fn sample() -> Index {
        let mut ix = Index::new();
        ix.upsert_binding(&ObjectKey::new("a", "b1"), objective("a", "chat"));
        ix.upsert_binding(&ObjectKey::new("a", "b2"), objective("a", "chat"));
        ix.upsert_binding(&ObjectKey::new("a", "b3"), objective("a", "code"));
        ix.upsert_binding(&ObjectKey::new("z", "b1"), objective("z", "chat"));
        ix.upsert_source(source("llm-d.ai", objective("a", "chat")), "pool1".into());
        ix.upsert_source(source("llm-d.ai", objective("a", "code")), "pool2".into());
        ix.upsert_source(source("llm-d.ai", objective("z", "chat")), "pool1".into());
        ix
    }

    #[test]
    fn bindings_of_a_target_are_sorted_and_unique() {
        let mut ix = Index::new();
        for name in ["c", "a", "b", "a"] {
            ix.upsert_binding(&ObjectKey::new("ns", name), objective("ns", "chat"));
        }
        let chat = objective("ns", "chat");
        assert_eq!(
            names(ix.bindings_for_target(&chat)),
            ["ns/a", "ns/b", "ns/c"]
        );
        ix.remove_binding(&ObjectKey::new("ns", "b"));
        ix.remove_binding(&ObjectKey::new("ns", "zz"));
        assert_eq!(names(ix.bindings_for_target(&chat)), ["ns/a", "ns/c"]);
        ix.remove_binding(&ObjectKey::new("ns", "a"));
        ix.remove_binding(&ObjectKey::new("ns", "c"));
        assert!(ix.bindings_for_target(&chat).is_empty());
        assert!(
            ix.target_bindings.is_empty(),
            "an emptied target is forgotten"
        );
    }

    #[test]
    fn pool_change_reaches_only_bindings_through_its_objectives() {
        let ix = sample();
        assert_eq!(names(ix.bindings_for_pool("a", "pool1")), ["a/b1", "a/b2"]);
        assert_eq!(names(ix.bindings_for_pool("a", "pool2")), ["a/b3"]);
        assert_eq!(names(ix.bindings_for_pool("z", "pool1")), ["z/b1"]);
        assert!(ix.bindings_for_pool("a", "unknown").is_empty());
    }

    #[test]
    fn objective_repointed_to_another_pool_moves_its_bindings() {
        let mut ix = sample();
        ix.upsert_source(source("llm-d.ai", objective("a", "chat")), "pool2".into());
        assert!(ix.bindings_for_pool("a", "pool1").is_empty());
        assert_eq!(
            names(ix.bindings_for_pool("a", "pool2")),
            ["a/b1", "a/b2", "a/b3"]
        );
    }

    #[test]
    fn same_objective_in_two_groups_is_tracked_per_group() {
        let mut ix = sample();
        ix.upsert_source(
            source("inference.networking.x-k8s.io", objective("a", "chat")),
            "legacy".into(),
        );
        assert_eq!(names(ix.bindings_for_pool("a", "legacy")), ["a/b1", "a/b2"]);
        ix.remove_source(&source("llm-d.ai", objective("a", "chat")));
        assert!(ix.bindings_for_pool("a", "pool1").is_empty());
        assert_eq!(names(ix.bindings_for_pool("a", "legacy")), ["a/b1", "a/b2"]);
    }

    #[test]
    fn retargeting_and_removing_bindings_updates_every_view() {
        let mut ix = sample();
        ix.upsert_binding(&ObjectKey::new("a", "b1"), objective("a", "code"));
        assert_eq!(names(ix.bindings_for_pool("a", "pool1")), ["a/b2"]);
        assert_eq!(names(ix.bindings_for_pool("a", "pool2")), ["a/b1", "a/b3"]);
        ix.remove_binding(&ObjectKey::new("a", "b3"));
        assert_eq!(names(ix.bindings_for_pool("a", "pool2")), ["a/b1"]);
        assert_eq!(names(ix.bindings_in_namespace("a")), ["a/b1", "a/b2"]);
        assert_eq!(ix.binding_count(), 3);
    }

    #[test]
    fn legacy_model_targets_are_distinct_from_objectives() {
        let mut ix = Index::new();
        let model = TargetKey {
            namespace: "a".into(),
            kind: TargetKind::InferenceModel,
            name: "chat".into(),
        };
        ix.upsert_binding(&ObjectKey::new("a", "m"), model.clone());
        ix.upsert_binding(&ObjectKey::new("a", "o"), objective("a", "chat"));
        ix.upsert_source(source("inference.networking.x-k8s.io", model), "p".into());
        assert_eq!(names(ix.bindings_for_pool("a", "p")), ["a/m"]);
    }
}
