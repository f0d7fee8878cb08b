//! `ClusterIdentityStatus`: the hub's view of one spoke.

// `#[kube(printcolumn(type_ = "string", ...))]` repeats the same key in sibling columns,
// which clippy mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Spec of a `ClusterIdentityStatus`: which ClusterProfile it describes. The object is
/// written by the hub only; the spec exists because every custom resource has one.
#[derive(
    CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default,
)]
#[kube(
    group = "kleym.io",
    version = "v1alpha1",
    kind = "ClusterIdentityStatus",
    plural = "clusteridentitystatuses",
    singular = "clusteridentitystatus",
    shortname = "cis",
    category = "kleym",
    namespaced,
    status = "ClusterIdentityStatusStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "ClusterIdentityStatus is the kleym hub's view of one spoke cluster (same namespace and name as its ClusterProfile, owned by it): reachability, credentials, sync state and binding counts.",
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
        name = "Trust Domain",
        type_ = "string",
        json_path = ".status.trustDomain"
    ),
    printcolumn(
        name = "Bindings",
        type_ = "integer",
        json_path = ".status.bindings.total"
    ),
    printcolumn(
        name = "Not Ready",
        type_ = "integer",
        json_path = ".status.bindings.notReady"
    ),
    printcolumn(
        name = "Last Sync",
        type_ = "date",
        json_path = ".status.lastSuccessfulSync"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterIdentityStatusSpec {
    /// Name of the ClusterProfile (same namespace) this object describes.
    #[serde(default)]
    pub cluster_profile: String,
}

/// Observed state of one spoke.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterIdentityStatusStatus {
    /// `Reachable`, `CredentialsAvailable`, `Synced`, `Ready` and `AdmissionPolicy` (see
    /// [`condition_types`]), with reasons from [`reasons`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The SPIFFE trust domain the spoke's bindings compile into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
    /// Kubernetes version of the spoke's API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoke_version: Option<String>,
    /// When the hub last completed a sync with the spoke (refreshed at a bounded rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_sync: Option<Time>,
    /// Bindings of the spoke by state.
    #[serde(default)]
    pub bindings: BindingCounts,
    /// Bindings that are not ready, sorted by namespace and name; capped (see
    /// `nonReadyBindingsTruncated`; `bindings.notReady` is the exact count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub non_ready_bindings: Vec<NonReadyBinding>,
    /// True when `nonReadyBindings` lists fewer bindings than `bindings.notReady`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub non_ready_bindings_truncated: bool,
    /// Failed attempts to engage the spoke (or failed health probes of an engaged spoke) since
    /// it was last engaged; absent when there are none. While the hub retries, the conditions
    /// keep showing the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<i64>,
    /// When the hub makes its next attempt to engage the failing spoke. A time in the past
    /// means that attempt is under way. Absent when the hub is not backing off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry_time: Option<Time>,
    /// Set when this ClusterProfile describes the same member cluster as another one (same
    /// `multicluster.x-k8s.io/inventory-member-id`) and the hub engages the cluster through
    /// that other profile: this one is not engaged and its cluster is not counted twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<DuplicateOf>,
}

/// The profile a duplicate's member cluster is engaged through.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DuplicateOf {
    /// The engaged ClusterProfile, `<namespace>/<name>`.
    pub cluster_profile: String,
    /// The shared `multicluster.x-k8s.io/inventory-member-id`.
    pub member_id: String,
}

/// Binding counts of one spoke. `notReady` is split by the reason of the binding's `Ready`
/// condition.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingCounts {
    /// All bindings.
    #[serde(default)]
    pub total: i64,
    /// Bindings whose `Ready` is True.
    #[serde(default)]
    pub ready: i64,
    /// Bindings whose `Ready` is not True.
    #[serde(default)]
    pub not_ready: i64,
    /// Not ready because of a `Conflict` (IdentityCollision, DuplicateSPIFFEID).
    #[serde(default)]
    pub conflict: i64,
    /// Not ready because of `InvalidRef`.
    #[serde(default)]
    pub invalid_ref: i64,
    /// Not ready because of `UnsafeSelector`.
    #[serde(default)]
    pub unsafe_selector: i64,
    /// Not ready because of `RenderFailure`.
    #[serde(default)]
    pub render_failure: i64,
    /// Not ready for another reason (not yet reconciled, for instance).
    #[serde(default)]
    pub other: i64,
    /// Bindings carrying at least one warning (ready or not).
    #[serde(default)]
    pub with_warnings: i64,
}

/// A binding that is not ready, with its reason.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NonReadyBinding {
    /// Namespace of the binding in the spoke.
    pub namespace: String,
    /// Name of the binding.
    pub name: String,
    /// Reason of its `Ready` condition.
    pub reason: String,
    /// Message of its `Ready` condition (shortened when long).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Condition types of a `ClusterIdentityStatus`.
pub mod condition_types {
    /// The hub can reach the spoke's API server (TCP and TLS).
    pub const REACHABLE: &str = "Reachable";
    /// The access provider produced credentials for the spoke.
    pub const CREDENTIALS_AVAILABLE: &str = "CredentialsAvailable";
    /// The hub's reconciler for the spoke is synced (caches filled, CRDs present, RBAC suffices).
    pub const SYNCED: &str = "Synced";
    /// All of the above, and every binding of the spoke is ready.
    pub const READY: &str = "Ready";
    /// The spoke enforces kleym's admission policy on the hub's ClusterSPIFFEID writes (a
    /// warning when `False`; it does not make the spoke not `Ready`).
    pub const ADMISSION_POLICY: &str = "AdmissionPolicy";
    /// Every condition type, in the order the hub writes them.
    pub const ALL: [&str; 5] = [
        REACHABLE,
        CREDENTIALS_AVAILABLE,
        SYNCED,
        READY,
        ADMISSION_POLICY,
    ];
}

/// Reasons used in `ClusterIdentityStatus` conditions. Failure reasons say what is wrong.
pub mod reasons {
    /// The condition holds.
    pub const OK: &str = "Ok";
    /// Not observed yet.
    pub const PENDING: &str = "Pending";
    /// The API server cannot be reached (connection refused, timeout, DNS).
    pub const UNREACHABLE: &str = "Unreachable";
    /// The TLS handshake failed (unknown CA, wrong server name, expired certificate).
    pub const TLS_FAILURE: &str = "TLSFailure";
    /// The credential plugin failed (non-zero exit, timeout, malformed output).
    pub const CREDENTIAL_PLUGIN_FAILED: &str = "CredentialPluginFailed";
    /// The spoke rejected the credentials (401).
    pub const UNAUTHORIZED: &str = "Unauthorized";
    /// The spoke's RBAC denies a verb kleym needs (403).
    pub const FORBIDDEN: &str = "Forbidden";
    /// A CRD kleym needs is not served by the spoke.
    pub const CRD_MISSING: &str = "CRDMissing";
    /// The ClusterProfile cannot be engaged (no matching access provider, invalid config).
    pub const PROFILE_REFUSED: &str = "ProfileRefused";
    /// Some bindings of the spoke are not ready.
    pub const BINDINGS_NOT_READY: &str = "BindingsNotReady";
    /// Another ClusterProfile of the same member cluster is engaged; this one is not.
    pub const DUPLICATE: &str = "Duplicate";
    /// Another error.
    pub const ERROR: &str = "Error";
    /// `AdmissionPolicy` True: a ValidatingAdmissionPolicy denied the hub's dry run of a
    /// ClusterSPIFFEID kleym never writes.
    pub const ADMISSION_POLICY_INSTALLED: &str = "AdmissionPolicyInstalled";
    /// `AdmissionPolicy` False: the spoke would accept, from the hub's user, a ClusterSPIFFEID
    /// kleym never writes (install the policy `kleym trust-config` prints).
    pub const ADMISSION_POLICY_MISSING: &str = "AdmissionPolicyMissing";
    /// `AdmissionPolicy` Unknown: the dry run could not tell (RBAC without `create`, the
    /// CRD missing, an error); the message says which.
    pub const ADMISSION_POLICY_UNKNOWN: &str = "AdmissionPolicyUnknown";
}
