//! SIG-Multicluster `ClusterProfile` (`multicluster.x-k8s.io/v1alpha1`, namespaced): the
//! hub's cluster inventory.

use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Kind name.
pub const KIND: &str = "ClusterProfile";
/// Group.
pub const GROUP: &str = "multicluster.x-k8s.io";
/// Condition type telling whether the cluster's control plane is healthy.
pub const CONTROL_PLANE_HEALTHY: &str = "ControlPlaneHealthy";

/// Spec of a ClusterProfile.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterProfile",
    namespaced,
    status = "ClusterProfileStatus",
    derive = "PartialEq",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileSpec {
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// The cluster manager that owns this profile.
    pub cluster_manager: ClusterManager,
}

/// The cluster manager of a profile.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ClusterManager {
    /// Manager name.
    pub name: String,
}

/// Status of a ClusterProfile.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileStatus {
    /// How to reach the cluster, per access provider (KEP-5339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_providers: Option<Vec<AccessProvider>>,
    /// Deprecated predecessor of `accessProviders`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_providers: Option<Vec<AccessProvider>>,
    /// Conditions (e.g. `ControlPlaneHealthy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Named properties (e.g. `kleym.io/trust-domain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<Vec<Property>>,
    /// Version information.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<ClusterVersion>,
}

/// One access provider entry.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct AccessProvider {
    /// Provider name, matched against the controller's provider configuration.
    pub name: String,
    /// Connection details (a kubeconfig `cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<Cluster>,
}

/// A kubeconfig `cluster` stanza (note the kebab-case JSON keys).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "kebab-case")]
pub struct Cluster {
    /// API server URL.
    pub server: String,
    /// Path to a CA file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<String>,
    /// PEM CA bundle (base64 in JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<ByteString>,
    /// Disable response compression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_compression: Option<bool>,
    /// Named extensions (e.g. `client.authentication.k8s.io/exec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<NamedExtension>>,
    /// Skip TLS verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_tls_verify: Option<bool>,
    /// Proxy URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_url: Option<String>,
    /// TLS server name override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
}

/// A named kubeconfig extension; the payload is arbitrary JSON.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NamedExtension {
    /// Extension name.
    pub name: String,
    /// Extension payload.
    pub extension: serde_json::Value,
}

/// A named property of the cluster.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Property {
    /// Property name (1–253 characters).
    pub name: String,
    /// Property value (1–1024 characters).
    pub value: String,
    /// When the value was last observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_observed_time: Option<Time>,
}

/// Version information of the cluster.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterVersion {
    /// Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
}
