//! The pure inputs of the fleet analysis: what the hub observed of each spoke.
//!
//! The fleet supervisor produces these (one [`SpokeObservation`] per ClusterProfile);
//! tests build them by hand.

use chrono::{DateTime, Utc};
use kleym_api::hub_status::DuplicateOf;
use kleym_api::{ConflictPeer, ErrorCategory, IdentityMode, IdentityWarning};
use serde::{Deserialize, Serialize};

/// Everything the hub knows about one spoke.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpokeObservation {
    /// The spoke's name, `<profile namespace>/<profile name>`.
    pub cluster: String,
    /// The trust domain the spoke's bindings compile into.
    pub trust_domain: Option<String>,
    /// Whether the hub obtained credentials for the spoke.
    pub credentials: Health,
    /// Whether the spoke's API server answered (TCP + TLS + authenticated request).
    pub reachable: Health,
    /// Whether the spoke's reconciler is synced (CRDs present, RBAC sufficient, caches filled).
    pub synced: Health,
    /// The last error's message (already free of secrets), shown in the failing condition.
    pub error_message: Option<String>,
    /// Failed attempts (or health probes) since the spoke was last engaged, while the failure
    /// is shown; 0 otherwise.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub consecutive_failures: u32,
    /// When the hub retries the failing spoke (in the past while that attempt runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_retry: Option<DateTime<Utc>>,
    /// Kubernetes version of the spoke.
    pub spoke_version: Option<String>,
    /// When the hub last completed a sync with the spoke.
    pub last_sync: Option<DateTime<Utc>>,
    /// The spoke's bindings as last observed (kept while the spoke is unreachable).
    pub bindings: Vec<BindingObservation>,
    /// Set when the profile is a duplicate of another profile of the same member cluster
    /// (then it is not engaged, has no bindings and is not counted as a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<DuplicateOf>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl SpokeObservation {
    /// Credentials, reachability and sync all [`Health::Ok`].
    pub fn healthy(&self) -> bool {
        [self.credentials, self.reachable, self.synced]
            .iter()
            .all(|h| *h == Health::Ok)
    }
}

/// State of one aspect of a spoke connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Health {
    /// Not observed yet.
    #[default]
    Unknown,
    /// Works.
    Ok,
    /// Fails, for this reason (its condition reason is [`ErrorCategory::reason`]).
    Failed(ErrorCategory),
}

/// One binding of a spoke, as its status reports it (the spoke's verdict).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingObservation {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Identity boundary.
    pub mode: IdentityMode,
    /// The SPIFFE IDs the binding computes (`status.computedSpiffeIDs`).
    pub spiffe_ids: Vec<String>,
    /// The one service account its identity is confined to (`k8s:sa:<name>`).
    pub service_account: Option<String>,
    /// `k8s:container-name:<v>` / `k8s:container-image:<v>` (PerObjective only).
    pub container_discriminator: Option<String>,
    /// The pool's `matchLabels`, sorted by key, one entry per key.
    pub pool_selector: Vec<(String, String)>,
    /// `Ready` is True.
    pub ready: bool,
    /// Reason of the `Ready` condition (`Conflict`, `InvalidRef`, … when not ready).
    pub reason: Option<String>,
    /// Message of the `Ready` condition.
    pub message: Option<String>,
    /// Conflict peers (`status.conflictPeers`, same namespace).
    pub conflict_peers: Vec<ConflictPeer>,
    /// Warnings (`status.warnings`).
    pub warnings: Vec<IdentityWarning>,
}

impl BindingObservation {
    /// The workload a SPIFFE ID of this binding stands for.
    pub fn signature(&self) -> WorkloadSignature<'_> {
        WorkloadSignature {
            service_account: self.service_account.as_deref(),
            container_discriminator: self.container_discriminator.as_deref(),
            pool_selector: &self.pool_selector,
        }
    }
}

/// What a SPIFFE ID selects: two bindings with equal signatures describe the same workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadSignature<'a> {
    /// Service account.
    pub service_account: Option<&'a str>,
    /// Container discriminator selector.
    pub container_discriminator: Option<&'a str>,
    /// Pool selector.
    pub pool_selector: &'a [(String, String)],
}

impl std::fmt::Display for WorkloadSignature<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pool = self
            .pool_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        write!(
            f,
            "service account {}, {}, pool selector {{{pool}}}",
            self.service_account.unwrap_or("?"),
            self.container_discriminator
                .unwrap_or("no container discriminator"),
        )
    }
}
