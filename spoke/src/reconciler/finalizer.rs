//! The `kleym.io/cleanup` finalizer. A binding carries it exactly while it may own a
//! ClusterSPIFFEID, so that deleting the binding cannot orphan the cluster-scoped output
//! (which cannot have a namespaced owner reference). Bindings that never produced output
//! (refused from the start) never get it and cost no extra write.

use kleym_api::InferenceIdentityBinding;

use super::context::FINALIZER;

/// Does the binding carry our finalizer?
pub fn has_finalizer(b: &InferenceIdentityBinding) -> bool {
    b.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// The binding's finalizers plus ours.
pub fn with_finalizer(b: &InferenceIdentityBinding) -> Vec<String> {
    let mut f = b.metadata.finalizers.clone().unwrap_or_default();
    if !f.iter().any(|x| x == FINALIZER) {
        f.push(FINALIZER.to_string());
    }
    f
}

/// The binding's finalizers without ours.
pub fn without_finalizer(b: &InferenceIdentityBinding) -> Vec<String> {
    b.metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|x| x != FINALIZER)
        .collect()
}

/// Is the binding being deleted?
pub fn is_deleting(b: &InferenceIdentityBinding) -> bool {
    b.metadata.deletion_timestamp.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kleym_api::{InferenceIdentityBindingSpec, TargetRef};

    fn binding(finalizers: &[&str]) -> InferenceIdentityBinding {
        let spec: InferenceIdentityBindingSpec = serde_json::from_value(serde_json::json!({
            "targetRef": {"name": "o"},
            "workloadSelectorTemplates": ["k8s:ns:a"],
            "mode": "PoolOnly"
        }))
        .unwrap();
        let _ = TargetRef {
            kind: Default::default(),
            name: "o".into(),
        };
        let mut b = InferenceIdentityBinding::new("b", spec);
        b.metadata.finalizers = Some(finalizers.iter().map(|s| s.to_string()).collect());
        b
    }

    #[test]
    fn adding_is_idempotent_and_keeps_others() {
        let b = binding(&["other"]);
        assert!(!has_finalizer(&b));
        assert_eq!(with_finalizer(&b), vec!["other", FINALIZER]);
        let b2 = binding(&["other", FINALIZER]);
        assert!(has_finalizer(&b2));
        assert_eq!(with_finalizer(&b2), vec!["other", FINALIZER]);
        assert_eq!(without_finalizer(&b2), vec!["other"]);
    }
}
