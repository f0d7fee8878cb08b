//! `ClusterIdentityObservation`: what the hub replica that engages a spoke observed of it,
//! published in the hub namespace so that the replica writing the fleet report sees every
//! spoke, whichever replica engages it.
//!
//! Internal to kleym: written and read by the hub only. It carries exactly what the fleet
//! analysis and a spoke's `ClusterIdentityStatus` content need (health, the last failure,
//! and per binding its SPIFFE IDs, workload signature, verdict, conflict peers and
//! warnings), no spoke credential and nothing a tenant could not read in its own bindings'
//! status. Like every kleym output it is never proof of anything: the report built from it
//! is informational.
//!
//! A spoke whose observation would exceed the writer's size bound is split into several
//! objects (`part` of `parts`), all carrying the digest of the whole; a reader assembles a
//! spoke only from a complete set of parts with one digest.

// `#[kube(printcolumn(type_ = "string", ...))]` repeats the same key in sibling columns,
// which clippy mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::cluster_status::DuplicateOf;
use crate::{ConflictPeer, IdentityMode, IdentityWarning};

/// One spoke's published observation (or one part of it).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[kube(
    group = "kleym.io",
    version = "v1alpha1",
    kind = "ClusterIdentityObservation",
    plural = "clusteridentityobservations",
    singular = "clusteridentityobservation",
    shortname = "cio",
    category = "kleym",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "ClusterIdentityObservation is internal to kleym: what the hub replica that engages a spoke observed of it (health and per-binding identities and verdicts), published in the hub namespace so the replica writing the FleetIdentityReport sees every spoke. Written and read by the hub only.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.cluster"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".spec.phase"),
    printcolumn(name = "Part", type_ = "integer", json_path = ".spec.part"),
    printcolumn(name = "Parts", type_ = "integer", json_path = ".spec.parts"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterIdentityObservationSpec {
    /// The spoke, `<ClusterProfile namespace>/<ClusterProfile name>`.
    pub cluster: String,
    /// SHA-256 (hex) of the whole observation's content, every part together, without
    /// `lastSync`: equal digests, equal content.
    pub digest: String,
    /// Which part of the observation this object holds (0 holds the header fields).
    #[serde(default)]
    pub part: u32,
    /// How many parts the observation has (1 unless it was split for size).
    #[serde(default = "one")]
    pub parts: u32,
    /// The spoke's life-cycle phase in the publishing replica (as `/v1/clusters` shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The trust domain the spoke's bindings compile into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
    /// Credentials, reachability and sync of the spoke: `Ok`, `Unknown`, or the failure's
    /// category (`Unreachable`, `TLS`, `Credentials`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<ObservedHealth>,
    /// The last failure's message (free of secrets, as the `ClusterIdentityStatus` shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// Failed attempts since the spoke was last engaged, while a failure is shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// The publishing replica's failures since its last successful sync with the spoke
    /// (what `/v1/clusters` shows as `consecutiveFailures`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures_since_sync: Option<u32>,
    /// When the publishing replica retries the failing spoke.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry: Option<Time>,
    /// Kubernetes version of the spoke.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoke_version: Option<String>,
    /// When the publishing replica last completed a sync with the spoke (refreshed at a
    /// bounded rate, not part of the digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<Time>,
    /// Set when the profile is a duplicate of another profile of the same member cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<DuplicateOf>,
    /// The last check of the spoke's admission policy bounding the hub (absent: not checked
    /// yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_policy: Option<ObservedAdmissionPolicy>,
    /// The spoke's bindings (of this part), sorted by namespace and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub bindings: Vec<ObservedBinding>,
}

/// The result of the hub's dry-run check for the spoke's admission policy.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedAdmissionPolicy {
    /// `Installed`, `Missing` or `Unknown`.
    pub state: String,
    /// The denying policy's name (`Installed`) or what the spoke answered (`Unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

fn one() -> u32 {
    1
}

fn is_per_objective(mode: &IdentityMode) -> bool {
    *mode == IdentityMode::PerObjective
}

/// The three health aspects of a spoke connection.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedHealth {
    /// Whether the access provider produced credentials.
    pub credentials: String,
    /// Whether the spoke's API server answered.
    pub reachable: String,
    /// Whether the spoke's reconciler is synced.
    pub synced: String,
}

/// What one binding compiled to, as its spoke's reconciler last saw it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedBinding {
    /// Binding namespace.
    pub namespace: String,
    /// Binding name.
    pub name: String,
    /// `spec.mode` (absent: `PerObjective`).
    #[serde(default, skip_serializing_if = "is_per_objective")]
    pub mode: IdentityMode,
    /// The SPIFFE IDs the binding computed.
    #[serde(default, rename = "spiffeIDs", skip_serializing_if = "Vec::is_empty")]
    pub spiffe_ids: Vec<String>,
    /// Service account of the rendered `k8s:sa:` selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// The container discriminator selector (`k8s:container-name:<v>`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_discriminator: Option<String>,
    /// The pool labels the binding's selectors carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pool_selector: BTreeMap<String, String>,
    /// Whether the binding's `Ready` condition is `True` for its generation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready: bool,
    /// Reason of its `Ready` condition (left out when ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Message of its `Ready` condition (left out when ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Its conflict peers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflict_peers: Vec<ConflictPeer>,
    /// Its warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<IdentityWarning>,
}
