//! `InferenceIdentityBinding` (`kleym.io/v1alpha1`, namespaced): identity intent for one
//! InferenceObjective (or legacy InferenceModel), compiled by the spoke into one SPIRE
//! `ClusterSPIFFEID`.

// `#[kube(printcolumn(type_ = "string", ...))]` repeats the same key in sibling columns,
// which clippy mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Spec of an `InferenceIdentityBinding`.
///
/// The apiserver itself rejects a `containerDiscriminator` in `PoolOnly` mode and a
/// missing one in `PerObjective` mode (the default), through the CEL rules below.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "kleym.io",
    version = "v1alpha1",
    kind = "InferenceIdentityBinding",
    plural = "inferenceidentitybindings",
    singular = "inferenceidentitybinding",
    shortname = "iib",
    category = "kleym",
    namespaced,
    status = "InferenceIdentityBindingStatus",
    derive = "PartialEq",
    doc = "InferenceIdentityBinding declares the SPIFFE identity of the pods serving one InferenceObjective (or its pool); kleym compiles it into a SPIRE ClusterSPIFFEID.",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.targetRef.name"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "SPIFFE ID",
        type_ = "string",
        json_path = ".status.computedSpiffeIDs[0].spiffeID"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("!has(self.mode) || self.mode != 'PoolOnly' || !has(self.containerDiscriminator)").message("containerDiscriminator must not be set when mode is PoolOnly"),
    validation = Rule::new("has(self.containerDiscriminator) || (has(self.mode) && self.mode == 'PoolOnly')").message("containerDiscriminator is required when mode is PerObjective (the default)")
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceIdentityBindingSpec {
    /// The InferenceObjective (or legacy InferenceModel) in this namespace whose serving
    /// pods receive the identity.
    pub target_ref: TargetRef,

    /// Overrides the default SPIFFE ID. Same template syntax as `workloadSelectorTemplates`;
    /// the result must be a SPIFFE ID in the cluster's trust domain whose path starts with
    /// `/ns/<namespace>/`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "spiffeIDTemplate"
    )]
    #[schemars(length(min = 1, max = 2048))]
    pub spiffe_id_template: Option<String>,

    /// Where pod selection comes from. Only `DerivedFromPool` exists.
    #[serde(default)]
    pub selector_source: SelectorSource,

    /// SPIRE workload selector templates (`type:value`), rendered with the binding's
    /// variables. The rendered set must contain exactly one `k8s:ns:<namespace>` and
    /// exactly one non-empty `k8s:sa:<name>`.
    #[schemars(length(min = 1, max = 32), inner(length(min = 1, max = 1024)))]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub workload_selector_templates: Vec<String>,

    /// `PerObjective` (default): one identity per objective, discriminated by container;
    /// `PoolOnly`: one identity for the whole pool.
    #[serde(default)]
    pub mode: IdentityMode,

    /// Which container of the pool's pods serves the objective. Required iff the mode is
    /// `PerObjective`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_discriminator: Option<ContainerDiscriminator>,

    /// SVID options passed through to the generated ClusterSPIFFEID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svid: Option<SvidOptions>,
}

/// Reference to the binding's target, always in the binding's namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// `InferenceObjective` (default) or the legacy `InferenceModel`.
    #[serde(default)]
    pub kind: TargetKind,
    /// Name of the target object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Kind of object a binding targets.
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
pub enum TargetKind {
    /// GAIE / llm-d `InferenceObjective`.
    #[default]
    InferenceObjective,
    /// Legacy GAIE `InferenceModel` (`inference.networking.x-k8s.io/v1alpha2`).
    InferenceModel,
}

impl TargetKind {
    /// The kind name as it appears in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::InferenceObjective => "InferenceObjective",
            TargetKind::InferenceModel => "InferenceModel",
        }
    }
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Source of pod selection.
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
pub enum SelectorSource {
    /// Pod selection is the target's InferencePool `selector`.
    #[default]
    DerivedFromPool,
}

/// Identity boundary of a binding.
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
pub enum IdentityMode {
    /// One identity for every serving pod of the pool.
    PoolOnly,
    /// One identity per objective, confined to one container of the pool's pods.
    #[default]
    PerObjective,
}

impl IdentityMode {
    /// The mode name as it appears in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityMode::PoolOnly => "PoolOnly",
            IdentityMode::PerObjective => "PerObjective",
        }
    }
}

impl fmt::Display for IdentityMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Selects one container inside the pool's pods.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDiscriminator {
    /// `ContainerName` (preferred) → `k8s:container-name:<value>`; `ContainerImage`
    /// (weaker: one image may serve several models) → `k8s:container-image:<value>`.
    #[serde(rename = "type")]
    pub type_: DiscriminatorType,
    /// Container name or image reference.
    #[schemars(length(min = 1, max = 512))]
    pub value: String,
}

/// How a container is discriminated.
#[derive(
    Serialize,
    Deserialize,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum DiscriminatorType {
    /// Match the container name.
    ContainerName,
    /// Match the container image.
    ContainerImage,
}

impl DiscriminatorType {
    /// The type name as it appears in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscriminatorType::ContainerName => "ContainerName",
            DiscriminatorType::ContainerImage => "ContainerImage",
        }
    }
}

/// SVID options copied into the generated ClusterSPIFFEID.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SvidOptions {
    /// Upper bound of the X.509-SVID TTL (Go duration, e.g. `1h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub ttl: Option<String>,
    /// Upper bound of the JWT-SVID TTL (Go duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub jwt_ttl: Option<String>,
    /// DNS SAN templates, rendered with the binding's variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253)))]
    pub dns_name_templates: Vec<String>,
    /// Trust domains the SVIDs federate with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 255)))]
    pub federates_with: Vec<String>,
}

/// Observed state of an `InferenceIdentityBinding`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceIdentityBindingStatus {
    /// `Ready`, `Conflict`, `InvalidRef`, `UnsafeSelector`, `RenderFailure`: always all
    /// present, each with `observedGeneration`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The SPIFFE IDs this binding registers (one today).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "computedSpiffeIDs"
    )]
    pub computed_spiffe_ids: Vec<ComputedSpiffeId>,
    /// The final, sorted workload selectors of the ClusterSPIFFEID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rendered_selectors: Vec<String>,
    /// The ClusterSPIFFEID this binding created: ownership is proven by this UID.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "clusterSPIFFEID"
    )]
    pub cluster_spiffe_id: Option<OwnedClusterSpiffeId>,
    /// Bindings in the same namespace this one conflicts with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflict_peers: Vec<ConflictPeer>,
    /// Non-fatal findings (double SVIDs, overlapping default identities).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<IdentityWarning>,
    /// SPIRE Controller Manager statistics read back from the ClusterSPIFFEID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spire_stats: Option<SpireStats>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One computed SPIFFE ID.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputedSpiffeId {
    /// The identity boundary that produced the ID.
    pub mode: IdentityMode,
    /// The SPIFFE ID (`spiffe://<trust-domain>/ns/<namespace>/…`).
    #[serde(rename = "spiffeID")]
    pub spiffe_id: String,
}

/// The ClusterSPIFFEID a binding owns.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnedClusterSpiffeId {
    /// Object name (cluster-scoped).
    pub name: String,
    /// Object UID recorded at creation; an object with another UID is not ours.
    pub uid: String,
}

/// A peer binding in conflict with this one.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConflictPeer {
    /// Name of the peer binding (same namespace).
    pub name: String,
    /// `IdentityCollision` or `DuplicateSPIFFEID`.
    pub reason: String,
}

/// A warning about the binding (reported, not refused).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityWarning {
    /// Stable machine-readable reason.
    pub reason: String,
    /// Human-readable explanation and suggested fix.
    pub message: String,
}

/// SPIRE Controller Manager statistics of the owned ClusterSPIFFEID.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpireStats {
    /// Pods the ClusterSPIFFEID selects.
    #[serde(default)]
    pub pods_selected: i64,
    /// Entries this object won.
    #[serde(default)]
    pub entries_to_set: i64,
    /// Entries masked by an identical entry from another object.
    #[serde(default)]
    pub entries_masked: i64,
    /// Pods whose entry failed to render.
    #[serde(default)]
    pub pod_entry_render_failures: i64,
}
