//! Legacy GAIE `InferenceModel` (`inference.networking.x-k8s.io/v1alpha2`, GAIE ≤ v0.5.1).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::PoolObjectReference;

/// Kind name.
pub const KIND: &str = "InferenceModel";
/// Group.
pub const GROUP: &str = "inference.networking.x-k8s.io";
/// Group a `poolRef` without `group` refers to (the legacy pool group).
pub const DEFAULT_POOL_GROUP: &str = super::pool::GROUP_LEGACY;

/// Spec of an InferenceModel.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "inference.networking.x-k8s.io",
    version = "v1alpha2",
    kind = "InferenceModel",
    namespaced,
    status = "InferenceModelStatus",
    derive = "PartialEq",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceModelSpec {
    /// Model name clients request (immutable, unique per pool).
    pub model_name: String,
    /// `Critical`, `Standard` or `Sheddable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criticality: Option<String>,
    /// Weighted rewrite targets (at most 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_models: Option<Vec<TargetModel>>,
    /// The pool serving this model (same namespace).
    pub pool_ref: PoolObjectReference,
}

impl InferenceModelSpec {
    /// The effective pool group (`inference.networking.x-k8s.io` when unset).
    pub fn pool_group(&self) -> &str {
        self.pool_ref.group_or(DEFAULT_POOL_GROUP)
    }
}

/// A weighted target model.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TargetModel {
    /// Model name.
    pub name: String,
    /// Weight 1–1,000,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// Status of an InferenceModel.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct InferenceModelStatus {
    /// Conditions (at most 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}
