//! `FleetIdentityReport`: every identity finding of the fleet.

// `#[kube(printcolumn(type_ = "string", ...))]` repeats the same key in sibling columns,
// which clippy mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Spec of a `FleetIdentityReport`: empty; the hub writes only the status.
#[derive(
    CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default,
)]
#[kube(
    group = "kleym.io",
    version = "v1alpha1",
    kind = "FleetIdentityReport",
    plural = "fleetidentityreports",
    singular = "fleetidentityreport",
    shortname = "fir",
    category = "kleym",
    status = "FleetIdentityReportStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "FleetIdentityReport lists the identity findings of a kleym fleet (collisions, duplicate SPIFFE IDs, cross-cluster drift, warnings) as exact counts plus a capped list; the hub's /v1/report serves the full list.",
    printcolumn(
        name = "Clusters",
        type_ = "integer",
        json_path = ".status.clusters.total"
    ),
    printcolumn(
        name = "Collisions",
        type_ = "integer",
        json_path = ".status.findingCounts.collisions"
    ),
    printcolumn(
        name = "Warnings",
        type_ = "integer",
        json_path = ".status.findingCounts.warnings"
    ),
    printcolumn(name = "Generated", type_ = "date", json_path = ".status.generatedAt")
)]
#[serde(rename_all = "camelCase")]
pub struct FleetIdentityReportSpec {}

/// The fleet report. Also the body of the hub's `GET /v1/report` (there uncapped).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetIdentityReportStatus {
    /// When the findings last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_at: Option<Time>,
    /// Spokes by readiness.
    #[serde(default)]
    pub clusters: ClusterCounts,
    /// Bindings observed in all spokes.
    #[serde(default)]
    pub bindings: i64,
    /// Exact finding counts (also when `findings` is truncated).
    #[serde(default)]
    pub finding_counts: FindingCounts,
    /// Findings, collisions first, in a deterministic order; capped (see `findingsTruncated`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// True when `findings` lists fewer findings than `findingCounts.total`, or a finding
    /// lists fewer members than its `memberCount`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub findings_truncated: bool,
}

/// Spokes by readiness.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCounts {
    /// Spokes known to the hub.
    #[serde(default)]
    pub total: i64,
    /// Spokes whose `Ready` condition is True.
    #[serde(default)]
    pub ready: i64,
    /// Spokes that are not reachable, lack credentials or are not synced.
    #[serde(default)]
    pub unhealthy: i64,
    /// ClusterProfiles not engaged because another profile of the same member cluster
    /// (same `inventory-member-id`) is; not counted in `total`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duplicates: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Exact counts of findings.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FindingCounts {
    /// All findings.
    #[serde(default)]
    pub total: i64,
    /// Findings of severity `Collision`.
    #[serde(default)]
    pub collisions: i64,
    /// Findings of severity `Warning`.
    #[serde(default)]
    pub warnings: i64,
    /// `IdentityCollision` findings.
    #[serde(default)]
    pub identity_collision: i64,
    /// `DuplicateSPIFFEID` findings.
    #[serde(default, rename = "duplicateSPIFFEID")]
    pub duplicate_spiffe_id: i64,
    /// `CrossClusterDrift` findings.
    #[serde(default)]
    pub cross_cluster_drift: i64,
    /// `PoolOnlyAndPerObjective` findings.
    #[serde(default)]
    pub pool_only_and_per_objective: i64,
    /// `OverlappingDefaultIdentity` findings.
    #[serde(default)]
    pub overlapping_default_identity: i64,
    /// `MaskedByForeignObject` findings.
    #[serde(default)]
    pub masked_by_foreign_object: i64,
    /// `MultipleSVIDs` findings.
    #[serde(default, rename = "multipleSVIDs")]
    pub multiple_svids: i64,
}

impl FindingCounts {
    /// Count one finding.
    pub fn add(&mut self, kind: FindingKind) {
        self.total += 1;
        match kind.severity() {
            Severity::Collision => self.collisions += 1,
            Severity::Warning => self.warnings += 1,
        }
        match kind {
            FindingKind::IdentityCollision => self.identity_collision += 1,
            FindingKind::DuplicateSpiffeId => self.duplicate_spiffe_id += 1,
            FindingKind::CrossClusterDrift => self.cross_cluster_drift += 1,
            FindingKind::PoolOnlyAndPerObjective => self.pool_only_and_per_objective += 1,
            FindingKind::OverlappingDefaultIdentity => self.overlapping_default_identity += 1,
            FindingKind::MaskedByForeignObject => self.masked_by_foreign_object += 1,
            FindingKind::MultipleSvids => self.multiple_svids += 1,
        }
    }
}

/// One finding: bindings that together are a problem.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// What kind of problem.
    pub kind: FindingKind,
    /// `Collision` (identities are refused or ambiguous) or `Warning`.
    pub severity: Severity,
    /// The SPIFFE ID concerned (absent for an `IdentityCollision`, whose members have
    /// different IDs but select the same workload).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "spiffeID")]
    pub spiffe_id: Option<String>,
    /// The bindings involved, sorted; capped in the `FleetIdentityReport`.
    pub members: Vec<FindingMember>,
    /// How many bindings are involved (exact).
    pub member_count: i64,
    /// What is wrong and what to change.
    pub message: String,
}

/// A binding in a finding.
#[derive(
    Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, KubeSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct FindingMember {
    /// The spoke, as `<profile namespace>/<profile name>`.
    pub cluster: String,
    /// Namespace of the binding in the spoke.
    pub namespace: String,
    /// Name of the binding.
    pub binding: String,
}

impl fmt::Display for FindingMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}/{}", self.cluster, self.namespace, self.binding)
    }
}

/// Kinds of findings.
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
pub enum FindingKind {
    /// Within one spoke: PerObjective bindings selecting the same pods, service account and
    /// container (lifted from the spoke's verdict; the members are refused).
    IdentityCollision,
    /// Within one spoke: one SPIFFE ID computed with different selector sets (lifted; the
    /// members are refused).
    #[serde(rename = "DuplicateSPIFFEID")]
    DuplicateSpiffeId,
    /// Across spokes: one SPIFFE ID (so one trust domain) from different workload
    /// signatures (service account, container discriminator, pool selector).
    CrossClusterDrift,
    /// Warning: a PoolOnly and a PerObjective identity on the same pods.
    PoolOnlyAndPerObjective,
    /// Warning: a non-fallback ClusterSPIFFEID not managed by kleym also selects the pods.
    OverlappingDefaultIdentity,
    /// Warning: an older ClusterSPIFFEID not managed by kleym renders the same SPIRE entry
    /// as kleym's output for the pool's pods, so SPIRE Controller Manager masks kleym's.
    MaskedByForeignObject,
    /// Warning: kleym identities with different SPIFFE IDs all select one binding's
    /// workloads (a wider pool, no container), which receive one SVID per ID.
    #[serde(rename = "MultipleSVIDs")]
    MultipleSvids,
}

impl FindingKind {
    /// Every kind, in report order.
    pub const ALL: [FindingKind; 7] = [
        FindingKind::IdentityCollision,
        FindingKind::DuplicateSpiffeId,
        FindingKind::CrossClusterDrift,
        FindingKind::PoolOnlyAndPerObjective,
        FindingKind::OverlappingDefaultIdentity,
        FindingKind::MaskedByForeignObject,
        FindingKind::MultipleSvids,
    ];

    /// The kind as it appears in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::IdentityCollision => "IdentityCollision",
            FindingKind::DuplicateSpiffeId => "DuplicateSPIFFEID",
            FindingKind::CrossClusterDrift => "CrossClusterDrift",
            FindingKind::PoolOnlyAndPerObjective => "PoolOnlyAndPerObjective",
            FindingKind::OverlappingDefaultIdentity => "OverlappingDefaultIdentity",
            FindingKind::MaskedByForeignObject => "MaskedByForeignObject",
            FindingKind::MultipleSvids => "MultipleSVIDs",
        }
    }

    /// The severity of this kind.
    pub fn severity(self) -> Severity {
        match self {
            FindingKind::IdentityCollision
            | FindingKind::DuplicateSpiffeId
            | FindingKind::CrossClusterDrift => Severity::Collision,
            FindingKind::PoolOnlyAndPerObjective
            | FindingKind::OverlappingDefaultIdentity
            | FindingKind::MaskedByForeignObject
            | FindingKind::MultipleSvids => Severity::Warning,
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Severity of a finding. Ordered: `Collision` sorts before `Warning`.
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
pub enum Severity {
    /// Identities are refused, or one identity means different workloads.
    Collision,
    /// Reported, not refused (double SVIDs).
    Warning,
}

impl Severity {
    /// The severity as it appears in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Collision => "Collision",
            Severity::Warning => "Warning",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
