//! A binding's target (an InferenceObjective of either group, or a legacy InferenceModel)
//! as the reconciler's caches keep it ([`TargetRecord`]): the view the compiler reads and
//! the two metadata fields the watch handlers and the compile memo compare.
//!
//! Why not the API object: a spoke holds one target per binding or more, and of each the
//! reconciler reads only the name, the `poolRef`, the resourceVersion and the generation.
//! The rest is an `ObjectMeta` (360 bytes, mostly empty options) and the spec's and
//! status's other fields: a cached bench objective took 548 bytes of heap (its 464-byte
//! struct included), its record takes 312 (a counting allocator over a decoded objective;
//! docs/benchmarks.md), 2.4 MB less at 100 spokes × 100 objectives.

use kleym_api::external::model::InferenceModel;
use kleym_api::external::objective::{gaie, llmd};
use kube::api::ObjectMeta;

use super::trim::{CacheEntry, CacheForm};
use crate::compiler::TargetView;

/// What the reconciler keeps of a target object (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRecord {
    /// The compiler's view: kind, group, namespace, name and `poolRef`.
    view: TargetView,
    /// `metadata.resourceVersion`: the compile memo's fingerprint of the target.
    resource_version: Option<String>,
    /// `metadata.generation`: a change of anything but the status bumps it.
    generation: Option<i64>,
}

impl TargetRecord {
    /// The record of an object whose compiler view is `view`.
    pub fn new(view: TargetView, metadata: &ObjectMeta) -> Self {
        Self {
            view,
            resource_version: metadata.resource_version.clone(),
            generation: metadata.generation,
        }
    }

    /// The view the compiler reads.
    pub fn view(&self) -> &TargetView {
        &self.view
    }

    /// `metadata.generation`.
    pub fn generation(&self) -> Option<i64> {
        self.generation
    }
}

impl CacheEntry for TargetRecord {
    fn entry_key(&self) -> (&str, &str) {
        (&self.view.namespace, &self.view.name)
    }

    fn entry_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

impl CacheForm for llmd::InferenceObjective {
    type Cached = TargetRecord;

    fn into_cached(self, _field_manager: &str) -> TargetRecord {
        TargetRecord::new(TargetView::from_llmd_objective(&self), &self.metadata)
    }
}

impl CacheForm for gaie::InferenceObjective {
    type Cached = TargetRecord;

    fn into_cached(self, _field_manager: &str) -> TargetRecord {
        TargetRecord::new(TargetView::from_gaie_objective(&self), &self.metadata)
    }
}

impl CacheForm for InferenceModel {
    type Cached = TargetRecord;

    fn into_cached(self, _field_manager: &str) -> TargetRecord {
        TargetRecord::new(TargetView::from_model(&self), &self.metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kleym_api::TargetKind;
    use serde_json::json;

    #[test]
    fn a_record_keeps_the_view_the_version_and_the_generation() {
        let objective: llmd::InferenceObjective = serde_json::from_value(json!({
            "apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
            "metadata": {"name": "chat", "namespace": "llm", "resourceVersion": "42",
                "generation": 3, "uid": "u-1", "labels": {"team": "a"},
                "annotations": {"note": "not read"}},
            "spec": {"priority": 7, "poolRef": {"name": "qwen"}}
        }))
        .unwrap();
        let view = TargetView::from_llmd_objective(&objective);
        let record = objective.into_cached("kleym");
        assert_eq!(record.view(), &view);
        assert_eq!(record.view().kind, TargetKind::InferenceObjective);
        assert_eq!(record.view().pool_ref.name, "qwen");
        assert_eq!(record.entry_key(), ("llm", "chat"));
        assert_eq!(record.entry_version(), Some("42"));
        assert_eq!(record.generation(), Some(3));
    }

    #[test]
    fn each_kind_is_recorded_with_its_own_group() {
        let meta = json!({"name": "m", "namespace": "llm", "resourceVersion": "1"});
        let gaie: gaie::InferenceObjective = serde_json::from_value(json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
            "metadata": meta, "spec": {"poolRef": {"name": "p"}}
        }))
        .unwrap();
        let model: InferenceModel = serde_json::from_value(json!({
            "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
            "metadata": meta, "spec": {"modelName": "m", "poolRef": {"name": "p"}}
        }))
        .unwrap();
        let gaie_view = TargetView::from_gaie_objective(&gaie);
        let model_view = TargetView::from_model(&model);
        assert_eq!(gaie.into_cached("kleym").view(), &gaie_view);
        assert_eq!(model.into_cached("kleym").view(), &model_view);
        assert_eq!(model_view.kind, TargetKind::InferenceModel);
    }
}
