//! `InferenceObjective`: `llm-d.ai/v1alpha2` (current) and
//! `inference.networking.x-k8s.io/v1alpha2` (GAIE v1.0–v1.5). Same schema; `priority` is
//! int32 in llm-d.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};

use super::PoolObjectReference;

/// Kind name shared by both groups.
pub const KIND: &str = "InferenceObjective";
/// Group of the current (llm-d) objective; preferred when served.
pub const GROUP_LLMD: &str = "llm-d.ai";
/// Group of the GAIE objective.
pub const GROUP_GAIE: &str = "inference.networking.x-k8s.io";
/// Group a `poolRef` without `group` refers to.
pub const DEFAULT_POOL_GROUP: &str = super::pool::GROUP_V1;

/// Status of an InferenceObjective (both groups).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct InferenceObjectiveStatus {
    /// Conditions (at most 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// `llm-d.ai/v1alpha2` InferenceObjective.
pub mod llmd {
    use super::*;
    use kube::CustomResource;

    /// Spec of an llm-d InferenceObjective.
    #[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[kube(
        group = "llm-d.ai",
        version = "v1alpha2",
        kind = "InferenceObjective",
        namespaced,
        status = "InferenceObjectiveStatus",
        derive = "PartialEq",
        schema = "disabled"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct InferenceObjectiveSpec {
        /// Flow-control priority; higher is more critical, unset means 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub priority: Option<i32>,
        /// The pool serving this objective (same namespace).
        pub pool_ref: PoolObjectReference,
    }

    impl InferenceObjectiveSpec {
        /// The effective pool group (`inference.networking.k8s.io` when unset).
        pub fn pool_group(&self) -> &str {
            self.pool_ref.group_or(DEFAULT_POOL_GROUP)
        }
    }
}

/// `inference.networking.x-k8s.io/v1alpha2` InferenceObjective.
pub mod gaie {
    use super::*;
    use kube::CustomResource;

    /// Spec of a GAIE InferenceObjective.
    #[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[kube(
        group = "inference.networking.x-k8s.io",
        version = "v1alpha2",
        kind = "InferenceObjective",
        namespaced,
        status = "InferenceObjectiveStatus",
        derive = "PartialEq",
        schema = "disabled"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct InferenceObjectiveSpec {
        /// Flow-control priority; higher is more critical, unset means 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub priority: Option<i64>,
        /// The pool serving this objective (same namespace).
        pub pool_ref: PoolObjectReference,
    }

    impl InferenceObjectiveSpec {
        /// The effective pool group (`inference.networking.k8s.io` when unset).
        pub fn pool_group(&self) -> &str {
            self.pool_ref.group_or(DEFAULT_POOL_GROUP)
        }
    }
}
