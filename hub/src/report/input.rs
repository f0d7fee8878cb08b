//! The pure inputs of the fleet analysis: what the hub observed of each spoke.
//!
//! The fleet supervisor produces these (one [`SpokeObservation`] per ClusterProfile);
//! tests build them by hand.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use kleym_api::ErrorCategory;
use kleym_api::hub_status::DuplicateOf;
pub use kleym_spoke::reconciler::snapshot::BindingSnapshot;

pub use crate::fleet::admission_probe::AdmissionPolicyCheck;
use serde::{Deserialize, Serialize};

/// Everything the hub knows about one spoke.
#[derive(Debug, Clone, PartialEq, Default)]
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
    pub consecutive_failures: u32,
    /// When the hub retries the failing spoke (in the past while that attempt runs).
    pub next_retry: Option<DateTime<Utc>>,
    /// Kubernetes version of the spoke.
    pub spoke_version: Option<String>,
    /// When the hub last completed a sync with the spoke.
    pub last_sync: Option<DateTime<Utc>>,
    /// The spoke's bindings as last observed (kept while the spoke is unreachable): the
    /// spoke's own snapshot, shared, not copied (a copy of every binding of the fleet was
    /// 5 MB at 100 × 100, made on every status pass and `/metrics` scrape).
    pub bindings: Arc<Vec<Arc<BindingSnapshot>>>,
    /// Set when the profile is a duplicate of another profile of the same member cluster
    /// (then it is not engaged, has no bindings and is not counted as a cluster).
    pub duplicate_of: Option<DuplicateOf>,
    /// Whether the spoke enforces kleym's admission policy, as last checked (`None`: not
    /// checked yet).
    pub admission_policy: Option<AdmissionPolicyCheck>,
}

/// `bindings` as [`SpokeObservation::bindings`] holds them (for observations built by hand).
pub fn shared(
    bindings: impl IntoIterator<Item = BindingSnapshot>,
) -> Arc<Vec<Arc<BindingSnapshot>>> {
    Arc::new(bindings.into_iter().map(Arc::new).collect())
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

impl<'a> WorkloadSignature<'a> {
    /// The workload a SPIFFE ID of `binding` stands for.
    pub fn of(binding: &'a BindingSnapshot) -> Self {
        WorkloadSignature {
            service_account: binding.service_account.as_deref(),
            container_discriminator: binding.container_discriminator.as_deref(),
            pool_selector: &binding.pool_selector,
        }
    }
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
