//! Metadata the reconciler never reads, dropped before an object is cached.
//!
//! `metadata.managedFields` is the largest part of most cached objects (a `FieldsV1` tree
//! per field manager) and `kubectl.kubernetes.io/last-applied-configuration` repeats the
//! whole object. Dropping them is what controller-runtime's `TransformStripManagedFields`
//! does, with one exception: the ownership proof of a ClusterSPIFFEID reads which field
//! manager applied kleym's owner annotation, so that record is kept, reduced to just that
//! (see [`crate::ownership::prune_managed_fields`]).

use kube::Resource;

use crate::ownership::prune_managed_fields;

/// Annotation `kubectl apply` (client-side) keeps a full copy of the object in.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Removes `metadata.managedFields` (but the ownership record) and the
/// last-applied-configuration annotation.
pub fn strip_unread_metadata<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = prune_managed_fields(meta.managed_fields.take());
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use std::collections::BTreeMap;

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
