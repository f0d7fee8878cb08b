//! What the compiler reads: the binding plus resolved views of its target and pool that
//! the reconciler fills from its caches, and the per-cluster configuration.

use kleym_api::external::{model, objective, pool};
use kleym_api::label_map::LabelMap;
use kleym_api::{InferenceIdentityBindingSpec, TargetKind};
use kube::ResourceExt;

use super::svid::SvidPolicy;
use std::sync::Arc;

/// Per-cluster compiler configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ClusterConfig {
    /// The cluster's SPIFFE trust domain (required).
    pub trust_domain: String,
    /// SPIRE Controller Manager `className` to put on generated objects.
    pub class_name: Option<String>,
    /// What bindings may ask for in their SVIDs (shared: the reconciler builds a config
    /// per reconcile).
    pub svid: Arc<SvidPolicy>,
}

impl ClusterConfig {
    /// The configuration of trust domain `trust_domain`, no class, the default SVID policy.
    pub fn new(trust_domain: impl Into<String>) -> Self {
        ClusterConfig {
            trust_domain: trust_domain.into(),
            ..ClusterConfig::default()
        }
    }
}

/// The outcome of looking an object up in a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T> {
    /// The object exists.
    Found(T),
    /// The CRD is served but the object does not exist.
    NotFound,
    /// No version of the CRD is served by the cluster.
    CrdNotServed,
}

impl<T> Lookup<T> {
    /// The found object, if any.
    pub fn found(&self) -> Option<&T> {
        match self {
            Lookup::Found(t) => Some(t),
            _ => None,
        }
    }
}

/// A binding and everything it resolves to.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingInput {
    /// The binding's namespace.
    pub namespace: String,
    /// The binding's name.
    pub name: String,
    /// The binding's spec.
    pub spec: InferenceIdentityBindingSpec,
    /// The target named by `spec.targetRef` (see [`crate::compiler::resolve::prefer_objective`]
    /// for choosing between objective groups).
    pub target: Lookup<TargetView>,
    /// The pool named by the target's `poolRef` (see
    /// [`crate::compiler::resolve::pool_key`]); ignored unless `target` is found.
    pub pool: Lookup<PoolView>,
}

/// The target object (InferenceObjective of either group, or legacy InferenceModel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetView {
    /// Kind of the object.
    pub kind: TargetKind,
    /// API group the object was read from.
    pub group: String,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// Its `spec.poolRef`, with the kind's group default applied.
    pub pool_ref: PoolRefView,
}

/// A target's `poolRef`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRefView {
    /// Group (defaults applied by [`TargetView`] constructors).
    pub group: String,
    /// Kind (`InferencePool` unless set otherwise).
    pub kind: String,
    /// Pool name.
    pub name: String,
    /// Namespace, if the reference carries one (upstream schemas have none; a reference
    /// read from an unstructured object might).
    pub namespace: Option<String>,
}

impl TargetView {
    /// View of an `llm-d.ai/v1alpha2` InferenceObjective.
    pub fn from_llmd_objective(o: &objective::llmd::InferenceObjective) -> Self {
        Self::build(
            TargetKind::InferenceObjective,
            objective::GROUP_LLMD,
            o.namespace().unwrap_or_default(),
            o.name_any(),
            &o.spec.pool_ref,
            o.spec.pool_group(),
        )
    }

    /// View of an `inference.networking.x-k8s.io/v1alpha2` InferenceObjective.
    pub fn from_gaie_objective(o: &objective::gaie::InferenceObjective) -> Self {
        Self::build(
            TargetKind::InferenceObjective,
            objective::GROUP_GAIE,
            o.namespace().unwrap_or_default(),
            o.name_any(),
            &o.spec.pool_ref,
            o.spec.pool_group(),
        )
    }

    /// View of a legacy InferenceModel.
    pub fn from_model(m: &model::InferenceModel) -> Self {
        Self::build(
            TargetKind::InferenceModel,
            model::GROUP,
            m.namespace().unwrap_or_default(),
            m.name_any(),
            &m.spec.pool_ref,
            m.spec.pool_group(),
        )
    }

    fn build(
        kind: TargetKind,
        group: &str,
        namespace: String,
        name: String,
        pool_ref: &kleym_api::external::PoolObjectReference,
        pool_group: &str,
    ) -> Self {
        TargetView {
            kind,
            group: group.to_string(),
            namespace,
            name,
            pool_ref: PoolRefView {
                group: pool_group.to_string(),
                kind: pool_ref.kind_or_default().to_string(),
                name: pool_ref.name.clone(),
                namespace: None,
            },
        }
    }
}

/// The pool object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    /// API group the pool was read from.
    pub group: String,
    /// Namespace of the pool.
    pub namespace: String,
    /// Name of the pool.
    pub name: String,
    /// The pool's pod selector (v1 `selector.matchLabels`, legacy flat `selector`).
    pub match_labels: LabelMap,
}

impl PoolView {
    /// View of an `inference.networking.k8s.io/v1` InferencePool.
    pub fn from_v1(p: &pool::v1::InferencePool) -> Self {
        PoolView {
            group: pool::GROUP_V1.to_string(),
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
            match_labels: LabelMap::from(&p.spec.selector.match_labels),
        }
    }

    /// View of a legacy `inference.networking.x-k8s.io/v1alpha2` InferencePool.
    pub fn from_v1alpha2(p: &pool::v1alpha2::InferencePool) -> Self {
        PoolView {
            group: pool::GROUP_LEGACY.to_string(),
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
            match_labels: LabelMap::from(&p.spec.selector),
        }
    }
}
