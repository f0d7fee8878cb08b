//! SPIRE Controller Manager `ClusterSPIFFEID` (`spire.spiffe.io/v1alpha1`, cluster-scoped):
//! what kleym writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::label_map::LabelMap;

/// Kind name.
pub const KIND: &str = "ClusterSPIFFEID";
/// Group.
pub const GROUP: &str = "spire.spiffe.io";

/// `metav1.LabelSelector` as a ClusterSPIFFEID's `namespaceSelector` and `podSelector`
/// carry it: the same JSON, with `matchLabels` held as a [`LabelMap`] (kleym keeps two
/// selectors per binding twice: in its compiled output and in its cache).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// `key = value` requirements, ANDed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<LabelMap>,
    /// Set-based requirements, ANDed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

/// Spec of a ClusterSPIFFEID.
///
/// `ttl`/`jwtTtl` of zero (Go clients send `"0s"`) are read as unset.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[kube(
    group = "spire.spiffe.io",
    version = "v1alpha1",
    kind = "ClusterSPIFFEID",
    plural = "clusterspiffeids",
    status = "ClusterSPIFFEIDStatus",
    derive = "PartialEq",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSPIFFEIDSpec {
    /// Go template rendering to the SPIFFE ID (kleym writes a literal ID).
    #[serde(rename = "spiffeIDTemplate")]
    pub spiffe_id_template: String,
    /// Namespaces to select (unset: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Pods to select within those namespaces (unset: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Workload selector templates (`type:value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector_templates: Option<Vec<String>>,
    /// DNS SAN templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_name_templates: Option<Vec<String>>,
    /// X.509-SVID TTL upper bound (Go duration); zero reads as unset.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::go_duration::zero_as_none"
    )]
    pub ttl: Option<String>,
    /// JWT-SVID TTL upper bound (Go duration); zero reads as unset.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::go_duration::zero_as_none"
    )]
    pub jwt_ttl: Option<String>,
    /// Trust domains to federate with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub federates_with: Option<Vec<String>>,
    /// Whether the entry gets admin API access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<bool>,
    /// Whether the entry describes a downstream SPIRE server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream: Option<bool>,
    /// Add Service DNS names automatically.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "autoPopulateDNSNames"
    )]
    pub auto_populate_dns_names: Option<bool>,
    /// Which SPIRE Controller Manager instance handles the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Apply only if no other non-fallback ClusterSPIFFEID matches the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<bool>,
    /// Copied into the entry's hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// Status of a ClusterSPIFFEID.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ClusterSPIFFEIDStatus {
    /// Reconciliation statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<ClusterSPIFFEIDStats>,
}

/// Statistics written by SPIRE Controller Manager (Go writes every field).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSPIFFEIDStats {
    /// Namespaces matched by `namespaceSelector`.
    #[serde(default)]
    pub namespaces_selected: i64,
    /// Matched namespaces ignored by configuration.
    #[serde(default)]
    pub namespaces_ignored: i64,
    /// Pods matched.
    #[serde(default)]
    pub pods_selected: i64,
    /// Pods whose entry failed to render.
    #[serde(default)]
    pub pod_entry_render_failures: i64,
    /// Entries masked by an identical entry from another object.
    #[serde(default)]
    pub entries_masked: i64,
    /// Entries this object won.
    #[serde(default)]
    pub entries_to_set: i64,
    /// SPIRE API create/update failures.
    #[serde(default)]
    pub entry_failures: i64,
}
