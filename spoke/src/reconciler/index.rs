//! Reverse index from the objects a binding depends on to the bindings, so that a change
//! enqueues only the bindings it affects: pool → targets (objectives, legacy models) →
//! bindings. Pure data structure; the watch handlers keep it current.
//!
//! Entries are keyed by what the *current* object says (each upsert first removes what the
//! previous version said), so the index never needs the old object of an update.
//!
//! Kept per namespace: a binding, its target and the target's pool are always in one
//! namespace, so the namespace's name is held once rather than in every key of every map
//! (five copies per binding and its objective; the index was 6.6 MB of a hub's heap at
//! 100 spokes × 100 bindings, heaptrack).

use std::collections::{BTreeMap, HashMap, HashSet};

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

/// A target within its namespace.
type LocalTarget = (TargetKind, String);

/// A target object within its namespace: group, kind, name.
type LocalSource = (String, TargetKind, String);

fn local_target(t: &TargetKey) -> LocalTarget {
    (t.kind, t.name.clone())
}

fn local_source(s: &SourceKey) -> LocalSource {
    (s.group.clone(), s.target.kind, s.target.name.clone())
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

    fn remove(&mut self, name: &str) {
        if let Ok(i) = self.position(name) {
            self.0.remove(i);
        }
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|n| n.as_str().cmp(name))
    }
}

/// One namespace's part of the index.
#[derive(Debug, Default)]
struct NamespaceIndex {
    /// Each binding's target, by binding name (sorted: the namespace's bindings in order).
    binding_target: BTreeMap<String, LocalTarget>,
    /// The bindings naming each target.
    target_bindings: HashMap<LocalTarget, SortedNames>,
    /// The pool each target object points at.
    source_pool: HashMap<LocalSource, String>,
    /// The target objects pointing at each pool.
    pool_sources: HashMap<String, HashSet<LocalSource>>,
}

impl NamespaceIndex {
    fn is_empty(&self) -> bool {
        self.binding_target.is_empty() && self.source_pool.is_empty()
    }

    fn remove_binding(&mut self, name: &str) -> bool {
        let Some(old) = self.binding_target.remove(name) else {
            return false;
        };
        if let Some(names) = self.target_bindings.get_mut(&old) {
            names.remove(name);
            if names.0.is_empty() {
                self.target_bindings.remove(&old);
            }
        }
        true
    }

    fn remove_source(&mut self, source: &LocalSource) {
        if let Some(pool) = self.source_pool.remove(source)
            && let Some(set) = self.pool_sources.get_mut(&pool)
        {
            set.remove(source);
            if set.is_empty() {
                self.pool_sources.remove(&pool);
            }
        }
    }

    fn bindings_for_target(&self, namespace: &str, target: &LocalTarget) -> Vec<ObjectKey> {
        self.target_bindings
            .get(target)
            .map(|names| {
                names
                    .0
                    .iter()
                    .map(|n| ObjectKey::new(namespace, n.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The index. Not thread-safe by itself; the context wraps it in a lock.
#[derive(Debug, Default)]
pub struct Index {
    namespaces: HashMap<String, NamespaceIndex>,
    bindings: usize,
}

impl Index {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `change` on `namespace`'s part and forgets the part if it is left empty.
    fn change_namespace<R>(
        &mut self,
        namespace: &str,
        change: impl FnOnce(&mut NamespaceIndex) -> R,
    ) -> Option<R> {
        let part = self.namespaces.get_mut(namespace)?;
        let out = change(part);
        if part.is_empty() {
            self.namespaces.remove(namespace);
        }
        Some(out)
    }

    /// Records (or updates) which target a binding names.
    pub fn upsert_binding(&mut self, key: &ObjectKey, target: TargetKey) {
        debug_assert_eq!(
            key.namespace, target.namespace,
            "a target is in its binding's namespace"
        );
        // Compared before the key is built: most binding events leave the target as it was.
        let unchanged = self
            .namespaces
            .get(&key.namespace)
            .and_then(|part| part.binding_target.get(&key.name))
            .is_some_and(|(kind, name)| *kind == target.kind && *name == target.name);
        if unchanged {
            return;
        }
        let target = (target.kind, target.name);
        self.remove_binding(key);
        let part = self.namespaces.entry(key.namespace.clone()).or_default();
        part.target_bindings
            .entry(target.clone())
            .or_default()
            .insert(key.name.clone());
        part.binding_target.insert(key.name.clone(), target);
        self.bindings += 1;
    }

    /// Forgets a binding.
    pub fn remove_binding(&mut self, key: &ObjectKey) {
        if self.change_namespace(&key.namespace, |part| part.remove_binding(&key.name))
            == Some(true)
        {
            self.bindings -= 1;
        }
    }

    /// Records (or updates) the pool a target object points at.
    pub fn upsert_source(&mut self, source: SourceKey, pool_name: String) {
        let local = local_source(&source);
        if self
            .namespaces
            .get(&source.target.namespace)
            .and_then(|part| part.source_pool.get(&local))
            == Some(&pool_name)
        {
            return;
        }
        self.remove_source(&source);
        let part = self.namespaces.entry(source.target.namespace).or_default();
        part.pool_sources
            .entry(pool_name.clone())
            .or_default()
            .insert(local.clone());
        part.source_pool.insert(local, pool_name);
    }

    /// Forgets a target object.
    pub fn remove_source(&mut self, source: &SourceKey) {
        let local = local_source(source);
        self.change_namespace(&source.target.namespace, |part| part.remove_source(&local));
    }

    /// Bindings that name `target`.
    pub fn bindings_for_target(&self, target: &TargetKey) -> Vec<ObjectKey> {
        self.namespaces
            .get(&target.namespace)
            .map(|part| part.bindings_for_target(&target.namespace, &local_target(target)))
            .unwrap_or_default()
    }

    /// Bindings whose target points at the pool `namespace/pool_name` (either pool group:
    /// a rare over-approximation that costs one no-op reconcile).
    pub fn bindings_for_pool(&self, namespace: &str, pool_name: &str) -> Vec<ObjectKey> {
        let Some(part) = self.namespaces.get(namespace) else {
            return Vec::new();
        };
        let mut out = std::collections::BTreeSet::new();
        if let Some(sources) = part.pool_sources.get(pool_name) {
            for (_, kind, name) in sources {
                out.extend(part.bindings_for_target(namespace, &(*kind, name.clone())));
            }
        }
        out.into_iter().collect()
    }

    /// Every binding of a namespace, sorted by name.
    pub fn bindings_in_namespace(&self, namespace: &str) -> Vec<ObjectKey> {
        self.namespaces
            .get(namespace)
            .map(|part| {
                part.binding_target
                    .keys()
                    .map(|n| ObjectKey::new(namespace, n.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every known binding.
    pub fn all_bindings(&self) -> Vec<ObjectKey> {
        self.namespaces
            .iter()
            .flat_map(|(ns, part)| {
                part.binding_target
                    .keys()
                    .map(move |n| ObjectKey::new(ns.clone(), n.clone()))
            })
            .collect()
    }

    /// Number of known bindings.
    pub fn binding_count(&self) -> usize {
        self.bindings
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
        assert!(ix.namespaces.is_empty(), "an emptied target is forgotten");
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
    fn a_namespace_part_lives_while_it_holds_a_binding_or_a_source() {
        let mut ix = sample();
        for b in ["b1", "b2", "b3"] {
            ix.remove_binding(&ObjectKey::new("a", b));
        }
        assert!(ix.bindings_in_namespace("a").is_empty());
        ix.upsert_binding(&ObjectKey::new("a", "b9"), objective("a", "chat"));
        assert_eq!(
            names(ix.bindings_for_pool("a", "pool1")),
            ["a/b9"],
            "the objective's pool is still known"
        );
        ix.remove_binding(&ObjectKey::new("a", "b9"));
        ix.remove_source(&source("llm-d.ai", objective("a", "chat")));
        ix.remove_source(&source("llm-d.ai", objective("a", "code")));
        assert!(
            !ix.namespaces.contains_key("a"),
            "an empty part is forgotten"
        );
        assert_eq!(ix.binding_count(), 1);
        assert_eq!(names(ix.all_bindings()), ["z/b1"]);
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
