//! A read-only snapshot of what one reconciler knows about its bindings, for the hub's fleet
//! state and report. It only reads the binding cache (the bindings as last observed, with the
//! status the reconciler wrote): no I/O, no writes, no effect on reconciling.
//!
//! Status read back (audit, see `crate::ownership`): the snapshot reports each binding's
//! status as written (by kleym, or by whoever may write the status subresource) to the
//! hub's report objects; nothing in it is used to choose an object to write or delete.
//!
//! The hub reads these entries as they are: its fleet report takes them as its inputs, and
//! its status loop and `/metrics` share them (the same `Arc`s) rather than copying every
//! binding of the fleet on each pass.
//!
//! The hub asks every spoke for its snapshot periodically; it is rebuilt only when the
//! binding cache changed since the last build (its version), otherwise the last one is
//! shared. Entries are shared too: a rebuild while bindings converge (every second, on
//! every spoke) rebuilds the entries of changed bindings only, and keeps the others
//! without copying them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kleym_api::conditions;
use kleym_api::{ConflictPeer, IdentityMode, IdentityWarning, InferenceIdentityBinding};
use kube::ResourceExt;

use super::caches::Cache;
use crate::compiler::selectors::{SA_PREFIX, container_selector, parse_pool_label_selector};

/// What one binding compiled to, as last reported in its status. Typed, with the API's own
/// types where the status has one: the hub reads fields, it never parses text the spoke made.
/// The hub's fleet report reads these as its per-binding input (tests build them by hand).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BindingSnapshot {
    /// Binding namespace.
    pub namespace: String,
    /// Binding name.
    pub name: String,
    /// `spec.mode`.
    pub mode: IdentityMode,
    /// `status.computedSpiffeIDs[].spiffeID`.
    pub spiffe_ids: Vec<String>,
    /// Service account from the rendered `k8s:sa:` selector, if any.
    pub service_account: Option<String>,
    /// `spec.containerDiscriminator` as the selector the spoke renders into the
    /// ClusterSPIFFEID (`k8s:container-name:<v>` / `k8s:container-image:<v>`), if any: two
    /// bindings select the same containers exactly when these are equal.
    pub container_discriminator: Option<String>,
    /// The pool labels of the rendered `k8s:pod-label:<key>:<value>` selectors, sorted by
    /// key, one entry per key. A sorted list rather than a map: a B-tree node is about half a
    /// kilobyte, and the hub keeps one of these per binding of every spoke.
    pub pool_selector: Vec<(String, String)>,
    /// `Ready` condition is `True` for the current generation.
    pub ready: bool,
    /// Reason of the `Ready` condition (`None` when not reported yet).
    pub reason: Option<String>,
    /// Message of the `Ready` condition (`None` when not reported yet).
    pub message: Option<String>,
    /// `status.conflictPeers`.
    pub conflict_peers: Vec<ConflictPeer>,
    /// `status.warnings`.
    pub warnings: Vec<IdentityWarning>,
}

impl BindingSnapshot {
    /// Builds the snapshot of one binding object.
    pub fn of(b: &InferenceIdentityBinding) -> Self {
        let status = b.status.as_ref();
        let ready = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == conditions::READY));
        let observed_current = status.and_then(|s| s.observed_generation) == b.metadata.generation;
        let selectors: &[String] = status
            .map(|s| s.rendered_selectors.as_slice())
            .unwrap_or(&[]);
        // An empty reason or message is one not reported (the condition's fields are
        // required strings, so "absent" is written as empty).
        let non_empty = |s: &String| Some(s.clone()).filter(|s| !s.is_empty());
        Self {
            namespace: b.namespace().unwrap_or_default(),
            name: b.name_any(),
            mode: b.spec.mode,
            spiffe_ids: status
                .map(|s| {
                    s.computed_spiffe_ids
                        .iter()
                        .map(|c| c.spiffe_id.clone())
                        .collect()
                })
                .unwrap_or_default(),
            service_account: selectors
                .iter()
                .find_map(|s| s.strip_prefix(SA_PREFIX))
                .map(str::to_string),
            container_discriminator: b
                .spec
                .container_discriminator
                .as_ref()
                .map(container_selector),
            pool_selector: selectors
                .iter()
                .filter_map(|s| parse_pool_label_selector(s))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect(),
            ready: observed_current && ready.is_some_and(|c| c.status == "True"),
            reason: ready.and_then(|c| non_empty(&c.reason)),
            message: ready.and_then(|c| non_empty(&c.message)),
            conflict_peers: status.map(|s| s.conflict_peers.clone()).unwrap_or_default(),
            warnings: status.map(|s| s.warnings.clone()).unwrap_or_default(),
        }
    }
}

/// The last built snapshot, the binding cache version it was built from and, per entry,
/// the resourceVersion of the object it was built of (in the same order).
#[derive(Debug, Default)]
pub struct SnapshotMemo {
    last: Mutex<Option<Built>>,
}

#[derive(Debug)]
struct Built {
    version: u64,
    /// The resourceVersion each entry was built of. Not the objects themselves: holding
    /// them kept every binding that changed since the last build in memory twice (the
    /// cache's new version and the memo's old one), and while a fleet converges that is
    /// most of them, every second.
    built_of: Vec<Option<String>>,
    snapshot: Arc<Vec<Arc<BindingSnapshot>>>,
}

impl SnapshotMemo {
    /// Every binding of `cache`'s snapshot, sorted by namespace and name: the last one when
    /// the cache has not changed since it was built (same `Arc`). A rebuild reuses the entry
    /// of every binding whose cached object has the resourceVersion it was built of.
    pub fn latest(
        &self,
        cache: &Cache<InferenceIdentityBinding>,
    ) -> Arc<Vec<Arc<BindingSnapshot>>> {
        // Read before the objects: a change racing the build makes the next call rebuild.
        let version = cache.version();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(built) = last.as_ref()
            && built.version == version
        {
            return Arc::clone(&built.snapshot);
        }
        let built = build(cache, version, last.take());
        let snapshot = Arc::clone(&built.snapshot);
        *last = Some(built);
        snapshot
    }
}

/// Builds the snapshot from the cache, reusing `previous` entries of unchanged objects. A
/// resourceVersion names one state of one object, so an entry built of the same namespace,
/// name and resourceVersion is the entry of the same object; one without a resourceVersion
/// (never from an API server) is always rebuilt.
fn build(cache: &Cache<InferenceIdentityBinding>, version: u64, previous: Option<Built>) -> Built {
    let mut sources = cache.list();
    sources.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
    let reusable: HashMap<(&str, &str, &str), &Arc<BindingSnapshot>> = previous
        .as_ref()
        .map(|p| {
            p.built_of
                .iter()
                .zip(p.snapshot.iter())
                .filter_map(|(rv, entry)| {
                    let rv = rv.as_deref()?;
                    Some(((entry.namespace.as_str(), entry.name.as_str(), rv), entry))
                })
                .collect()
        })
        .unwrap_or_default();
    let snapshot = sources
        .iter()
        .map(|b| {
            let (namespace, name) = sort_key(b);
            let kept = b
                .metadata
                .resource_version
                .as_deref()
                .and_then(|rv| reusable.get(&(namespace, name, rv)));
            match kept {
                Some(kept) => Arc::clone(kept),
                None => Arc::new(BindingSnapshot::of(b)),
            }
        })
        .collect();
    Built {
        version,
        built_of: sources
            .iter()
            .map(|b| b.metadata.resource_version.clone())
            .collect(),
        snapshot: Arc::new(snapshot),
    }
}

/// `(namespace, name)` as the snapshot reports them.
fn sort_key(b: &InferenceIdentityBinding) -> (&str, &str) {
    (
        b.metadata.namespace.as_deref().unwrap_or_default(),
        b.metadata.name.as_deref().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn snapshot_reads_status_and_spec() {
        let b: InferenceIdentityBinding = serde_json::from_value(json!({
            "apiVersion": "kleym.io/v1alpha1",
            "kind": "InferenceIdentityBinding",
            "metadata": {"name": "chat-id", "namespace": "llm", "generation": 2},
            "spec": {
                "targetRef": {"name": "chat"},
                "mode": "PerObjective",
                "containerDiscriminator": {"type": "ContainerName", "value": "chat"},
                "workloadSelectorTemplates": ["k8s:sa:model-server"]
            },
            "status": {
                "observedGeneration": 2,
                "conditions": [{"type": "Ready", "status": "True", "reason": "Compiled",
                    "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "computedSpiffeIDs": [{"mode": "PerObjective",
                    "spiffeID": "spiffe://td/ns/llm/objective/chat"}],
                "renderedSelectors": ["k8s:sa:model-server", "k8s:pod-label:b:2",
                    "k8s:pod-label:a:1", "k8s:ns:llm"],
                "warnings": [{"reason": "Overlap", "message": "m"}]
            }
        }))
        .unwrap();
        let s = BindingSnapshot::of(&b);
        assert_eq!(s.spiffe_ids, ["spiffe://td/ns/llm/objective/chat"]);
        assert_eq!(s.service_account.as_deref(), Some("model-server"));
        assert_eq!(
            s.container_discriminator.as_deref(),
            Some("k8s:container-name:chat")
        );
        assert_eq!(
            s.pool_selector,
            [("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert!(s.ready);
        assert_eq!(
            s.warnings,
            [IdentityWarning {
                reason: "Overlap".into(),
                message: "m".into()
            }]
        );

        // A stale status (older generation) is not ready.
        let mut stale = b.clone();
        stale.metadata.generation = Some(3);
        assert!(!BindingSnapshot::of(&stale).ready);
    }

    fn cached(name: &str, rv: &str, ready: bool) -> Arc<InferenceIdentityBinding> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "kleym.io/v1alpha1",
                "kind": "InferenceIdentityBinding",
                "metadata": {"name": name, "namespace": "llm", "generation": 1,
                    "resourceVersion": rv},
                "spec": {"targetRef": {"name": "chat"},
                    "workloadSelectorTemplates": ["k8s:sa:s"]},
                "status": {"observedGeneration": 1, "conditions": [{"type": "Ready",
                    "status": if ready { "True" } else { "False" }, "reason": "R",
                    "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_rebuild_reuses_unchanged_entries_and_keeps_no_replaced_object() {
        use kube::runtime::watcher::Event;
        let cache: Cache<InferenceIdentityBinding> = Cache::default();
        let old_b = cached("b", "2", false);
        for obj in [cached("a", "1", true), Arc::clone(&old_b)] {
            cache.apply(Event::Apply(obj));
        }
        let memo = SnapshotMemo::default();
        let first = memo.latest(&cache);
        assert_eq!(first.len(), 2);
        assert!(Arc::ptr_eq(&first, &memo.latest(&cache)), "unchanged cache");

        // `b` changes: its entry is rebuilt, `a`'s is the same one.
        cache.apply(Event::Apply(cached("b", "3", true)));
        let watch_b = Arc::downgrade(&old_b);
        drop(old_b);
        let second = memo.latest(&cache);
        assert!(Arc::ptr_eq(&first[0], &second[0]), "a is unchanged");
        assert!(!first[1].ready && second[1].ready, "b is rebuilt");
        // Only the memo could still hold b's old version: it must not.
        assert!(
            watch_b.upgrade().is_none(),
            "the memo keeps the replaced version of b alive"
        );

        // The same name and resourceVersion in a new object is the same state.
        cache.apply(Event::Apply(cached("a", "1", true)));
        let third = memo.latest(&cache);
        assert!(Arc::ptr_eq(&second[0], &third[0]));
        assert!(Arc::ptr_eq(&second[1], &third[1]));
    }
}
