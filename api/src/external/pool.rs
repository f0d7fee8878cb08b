//! GAIE `InferencePool`: `inference.networking.k8s.io/v1` and the legacy
//! `inference.networking.x-k8s.io/v1alpha2`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};

/// Kind name shared by both versions.
pub const KIND: &str = "InferencePool";
/// Group of the stable pool.
pub const GROUP_V1: &str = "inference.networking.k8s.io";
/// Group of the legacy pool.
pub const GROUP_LEGACY: &str = "inference.networking.x-k8s.io";

/// `inference.networking.k8s.io/v1` InferencePool.
pub mod v1 {
    use super::*;
    use kube::CustomResource;

    /// Spec of a v1 InferencePool.
    #[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[kube(
        group = "inference.networking.k8s.io",
        version = "v1",
        kind = "InferencePool",
        namespaced,
        status = "InferencePoolStatus",
        derive = "PartialEq",
        schema = "disabled"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct InferencePoolSpec {
        /// Pods of the pool (same namespace); `matchLabels` only.
        pub selector: LabelSelector,
        /// Ports the model servers listen on (1–8).
        pub target_ports: Vec<Port>,
        /// `http` (default) or `kubernetes.io/h2c`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub app_protocol: Option<String>,
        /// The endpoint picker extension (optional since GAIE v1.6.0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub endpoint_picker_ref: Option<EndpointPickerRef>,
    }

    /// GAIE's own label selector: `matchLabels` only, 1–64 entries.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
    #[serde(rename_all = "camelCase")]
    pub struct LabelSelector {
        /// Labels every pod of the pool carries.
        pub match_labels: std::collections::BTreeMap<String, String>,
    }

    /// A port number.
    #[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Port {
        /// 1–65535.
        pub number: i32,
    }

    /// Reference to the endpoint picker.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct EndpointPickerRef {
        /// API group (default `""`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub group: Option<String>,
        /// Kind (default `Service`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub kind: Option<String>,
        /// Name.
        pub name: String,
        /// Port (required when kind is `Service`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub port: Option<Port>,
        /// `FailOpen` or `FailClose` (default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub failure_mode: Option<String>,
    }

    /// Status of a v1 InferencePool.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
    #[serde(rename_all = "camelCase")]
    pub struct InferencePoolStatus {
        /// Per-parent status (at most 32).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub parents: Option<Vec<ParentStatus>>,
    }

    /// Status of the pool with respect to one parent.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[serde(rename_all = "camelCase")]
    pub struct ParentStatus {
        /// Conditions (at most 8).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub conditions: Option<Vec<Condition>>,
        /// The parent.
        pub parent_ref: ParentReference,
        /// Controller that wrote this entry (`DOMAIN/PATH`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub controller_name: Option<String>,
    }

    /// Reference to a parent (a Gateway by default).
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
    pub struct ParentReference {
        /// Group (default `gateway.networking.k8s.io`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub group: Option<String>,
        /// Kind (default `Gateway`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub kind: Option<String>,
        /// Name.
        pub name: String,
        /// Namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub namespace: Option<String>,
    }
}

/// Legacy `inference.networking.x-k8s.io/v1alpha2` InferencePool (GAIE ≤ v1.4.0).
pub mod v1alpha2 {
    use super::*;
    use kube::CustomResource;

    pub use super::v1::ParentReference;

    /// Spec of a legacy InferencePool.
    #[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[kube(
        group = "inference.networking.x-k8s.io",
        version = "v1alpha2",
        kind = "InferencePool",
        namespaced,
        status = "InferencePoolStatus",
        derive = "PartialEq",
        schema = "disabled"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct InferencePoolSpec {
        /// Pods of the pool: a flat label map (v1's `selector.matchLabels`).
        pub selector: std::collections::BTreeMap<String, String>,
        /// Port the model servers listen on.
        pub target_port_number: i32,
        /// The endpoint picker extension.
        pub extension_ref: ExtensionRef,
    }

    /// Reference to the endpoint picker extension.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct ExtensionRef {
        /// API group (default `""`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub group: Option<String>,
        /// Kind (default `Service`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub kind: Option<String>,
        /// Name.
        pub name: String,
        /// Port number.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub port_number: Option<i32>,
        /// `FailOpen` or `FailClose` (default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub failure_mode: Option<String>,
    }

    /// Status of a legacy InferencePool; note the singular JSON key `parent`.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
    pub struct InferencePoolStatus {
        /// Per-parent status (at most 32).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub parent: Option<Vec<PoolStatus>>,
    }

    /// Status of the pool with respect to one parent.
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[serde(rename_all = "camelCase")]
    pub struct PoolStatus {
        /// Conditions (at most 8).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub conditions: Option<Vec<Condition>>,
        /// The parent.
        pub parent_ref: ParentReference,
    }
}
