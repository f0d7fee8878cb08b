//! Metadata the reconciler never reads, dropped before an object is cached, and the
//! spare room of its lists given back ([`ShrinkLists`]).
//!
//! `metadata.managedFields` is the largest part of most cached objects (a `FieldsV1` tree
//! per field manager) and `kubectl.kubernetes.io/last-applied-configuration` repeats the
//! whole object. Dropping them is what controller-runtime's `TransformStripManagedFields`
//! does, with one exception: the ownership proof of a ClusterSPIFFEID reads which field
//! manager applied kleym's owner annotation, so that record is kept, reduced to just that
//! (see [`crate::ownership::prune_managed_fields`]).

use k8s_openapi::api::core::v1::Namespace;
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::pool::{v1, v1alpha2};
use kube::Resource;

use crate::ownership::prune_managed_fields;

/// Annotation `kubectl apply` (client-side) keeps a full copy of the object in.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Readies a decoded object for a cache: [`strip_unread_metadata`], then
/// [`ShrinkLists::shrink_lists`].
pub fn trim_for_cache<K: Resource + ShrinkLists>(obj: &mut K) {
    strip_unread_metadata(obj);
    obj.shrink_lists();
}

/// Removes `metadata.managedFields` (but the ownership record) and the
/// last-applied-configuration annotation, and gives back the spare room of the
/// metadata's lists.
pub fn strip_unread_metadata<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = prune_managed_fields(meta.managed_fields.take());
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    shrink(&mut meta.finalizers);
    shrink(&mut meta.owner_references);
}

/// Gives back the room a decoded object's lists have beyond their entries.
///
/// serde reads a JSON array into a `Vec` by pushing, so the `Vec` has room for 4, then
/// 8, 16 … entries: a binding's five status conditions (128 bytes each) sat in room for
/// eight. A cached object lives as long as the object does, so the room is given back
/// once, when it is cached. Kinds whose lists the reconciler keeps few of do nothing.
pub trait ShrinkLists {
    /// Shrinks each list to its length.
    fn shrink_lists(&mut self) {}
}

fn shrink<T>(list: &mut Option<Vec<T>>) {
    if let Some(list) = list.as_mut() {
        list.shrink_to_fit();
    }
}

impl ShrinkLists for InferenceIdentityBinding {
    fn shrink_lists(&mut self) {
        self.spec.workload_selector_templates.shrink_to_fit();
        if let Some(svid) = self.spec.svid.as_mut() {
            svid.dns_name_templates.shrink_to_fit();
            svid.federates_with.shrink_to_fit();
        }
        if let Some(status) = self.status.as_mut() {
            status.conditions.shrink_to_fit();
            status.computed_spiffe_ids.shrink_to_fit();
            status.rendered_selectors.shrink_to_fit();
            status.conflict_peers.shrink_to_fit();
            status.warnings.shrink_to_fit();
        }
    }
}

impl ShrinkLists for v1::InferencePool {}
impl ShrinkLists for v1alpha2::InferencePool {}
impl ShrinkLists for Namespace {}

/// What a cache needs of what it keeps: where an object is and which version of it this
/// is. Every API object has both ([`kube::Resource`]); the compact records some kinds are
/// cached as ([`super::target_record::TargetRecord`]) keep just these and what the
/// reconciler reads.
pub trait CacheEntry: Clone {
    /// `(namespace, name)`; namespace is empty for cluster-scoped objects.
    fn entry_key(&self) -> (&str, &str);
    /// `metadata.resourceVersion`.
    fn entry_version(&self) -> Option<&str>;
}

impl<K: kube::Resource + Clone> CacheEntry for K {
    fn entry_key(&self) -> (&str, &str) {
        let meta = self.meta();
        (
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    fn entry_version(&self) -> Option<&str> {
        self.meta().resource_version.as_deref()
    }
}

/// The form a decoded object is kept in by a cache and the write overlay: itself, trimmed
/// ([`trim_for_cache`]), for a ClusterSPIFFEID its
/// [`ObservedOutput`](super::observed_output::ObservedOutput), for a binding's target its
/// [`TargetRecord`](super::target_record::TargetRecord).
pub trait CacheForm: Sized {
    /// What the cache holds.
    type Cached: CacheEntry;

    /// `self`, ready for the cache. `field_manager` is kleym's: the ownership proof of a
    /// ClusterSPIFFEID is read once, here.
    fn into_cached(self, field_manager: &str) -> Self::Cached;
}

/// Kinds the cache keeps as they are, trimmed.
macro_rules! cached_as_decoded {
    ($($kind:ty),* $(,)?) => {$(
        impl CacheForm for $kind {
            type Cached = $kind;

            fn into_cached(mut self, _field_manager: &str) -> $kind {
                trim_for_cache(&mut self);
                self
            }
        }
    )*};
}

cached_as_decoded!(
    InferenceIdentityBinding,
    v1::InferencePool,
    v1alpha2::InferencePool,
    Namespace,
);

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use std::collections::BTreeMap;

    /// Capacities of every list `shrink_lists` handles.
    fn binding_list_room(b: &InferenceIdentityBinding) -> Vec<(usize, usize)> {
        let svid = b.spec.svid.as_ref().unwrap();
        let status = b.status.as_ref().unwrap();
        let finalizers = b.metadata.finalizers.as_ref().unwrap();
        vec![
            (
                b.spec.workload_selector_templates.len(),
                b.spec.workload_selector_templates.capacity(),
            ),
            (
                svid.dns_name_templates.len(),
                svid.dns_name_templates.capacity(),
            ),
            (svid.federates_with.len(), svid.federates_with.capacity()),
            (status.conditions.len(), status.conditions.capacity()),
            (
                status.computed_spiffe_ids.len(),
                status.computed_spiffe_ids.capacity(),
            ),
            (
                status.rendered_selectors.len(),
                status.rendered_selectors.capacity(),
            ),
            (
                status.conflict_peers.len(),
                status.conflict_peers.capacity(),
            ),
            (status.warnings.len(), status.warnings.capacity()),
            (finalizers.len(), finalizers.capacity()),
        ]
    }

    #[test]
    fn a_decoded_binding_keeps_no_spare_room_in_its_lists() {
        let condition = |t: &str| {
            serde_json::json!({"type": t, "status": "True", "reason": "R", "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        let conditions =
            ["Ready", "Conflict", "Resolved", "OutputApplied", "Degraded"].map(condition);
        // Decoded from text, as a watch event is: `from_value` knows each list's length.
        let mut binding: InferenceIdentityBinding = serde_json::from_str(
            &serde_json::json!({
                "apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
                "metadata": {"name": "b", "namespace": "ns", "finalizers": ["kleym.io/cleanup"]},
                "spec": {
                    "targetRef": {"kind": "InferenceObjective", "name": "o"},
                    "workloadSelectorTemplates": ["k8s:ns:{{namespace}}"],
                    "svid": {"dnsNameTemplates": ["a.example"], "federatesWith": ["td.example"]}
                },
                "status": {
                    "conditions": conditions,
                    "computedSpiffeIDs": [{"mode": "PerObjective", "spiffeID": "spiffe://td/x"}],
                    "renderedSelectors": ["k8s:ns:ns"],
                    "conflictPeers": [{"name": "p", "reason": "SameSpiffeId"}],
                    "warnings": [{"reason": "W", "message": "w"}]
                }
            })
            .to_string(),
        )
        .unwrap();
        let before = binding_list_room(&binding);
        assert!(
            before.iter().all(|(len, cap)| cap > len),
            "serde leaves room in every list: {before:?}"
        );
        trim_for_cache(&mut binding);
        let after = binding_list_room(&binding);
        assert!(after.iter().all(|(len, cap)| cap == len), "{after:?}");
        assert_eq!(
            before.iter().map(|(len, _)| *len).collect::<Vec<_>>(),
            after.iter().map(|(len, _)| *len).collect::<Vec<_>>(),
            "no entry lost"
        );
    }

    #[test]
    fn strips_managed_fields_and_last_applied_but_keeps_other_annotations() {
        let mut cm = ConfigMap::default();
        cm.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            ..Default::default()
        }]);
        cm.metadata.annotations = Some(BTreeMap::from([
            (LAST_APPLIED_ANNOTATION.to_string(), "{}".to_string()),
            ("kleym.io/spec-hash".to_string(), "h".to_string()),
        ]));
        strip_unread_metadata(&mut cm);
        assert!(cm.metadata.managed_fields.is_none());
        assert_eq!(
            cm.metadata.annotations,
            Some(BTreeMap::from([(
                "kleym.io/spec-hash".to_string(),
                "h".to_string()
            )]))
        );

        let mut only_last_applied = ConfigMap::default();
        only_last_applied.metadata.annotations = Some(BTreeMap::from([(
            LAST_APPLIED_ANNOTATION.to_string(),
            "{}".to_string(),
        )]));
        strip_unread_metadata(&mut only_last_applied);
        assert!(only_last_applied.metadata.annotations.is_none());
    }
}
