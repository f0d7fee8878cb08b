//! Fleet supervisor settings.

use std::sync::Arc;
use std::time::Duration;

use kleym_spoke::compiler::SvidPolicy;

use super::removal::RemovalPolicy;
use crate::backoff::BackoffOptions;
use crate::credentials::ClientOptions;
use crate::inventory::{InventoryOptions, InventoryVersion};

/// Everything the supervisor needs besides the providers and the credential cache.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// Engage condition, default trust domain / SPIRE class, selection switches.
    pub inventory: InventoryOptions,
    /// What to do when a profile is deleted.
    pub removal_policy: RemovalPolicy,
    /// How long after a profile's `deletionTimestamp` failed removal passes are retried
    /// before the hub gives up and releases the profile.
    pub removal_timeout: Duration,
    /// How many spokes may do their initial cache sync at once (fleet-wide); connecting
    /// and preflight are not limited.
    pub max_concurrent_syncs: usize,
    /// Deadline for a spoke's caches to sync after its reconciler started.
    pub initial_sync_timeout: Duration,
    /// Bound of each request the supervisor itself makes (probes, removal) and of
    /// building a client (which execs the plugin once).
    pub request_timeout: Duration,
    /// Transport timeouts of spoke clients.
    pub client: ClientOptions,
    /// Retry delays of failing spokes.
    pub backoff: BackoffOptions,
    /// Reconciles running at once within one spoke.
    pub spoke_concurrency: usize,
    /// Discovery poll interval of spoke reconcilers.
    pub discovery_interval: Duration,
    /// How often a running spoke's bindings snapshot is refreshed.
    pub snapshot_interval: Duration,
    /// How often a running spoke's API server is probed (`/version`).
    pub probe_interval: Duration,
    /// How often an engaged spoke is checked for kleym's admission policy (a dry run of a
    /// ClusterSPIFFEID the policy forbids; also once on every engagement).
    pub admission_policy_interval: Duration,
    /// `reportingInstance` of the reconcilers' events.
    pub event_instance: Option<String>,
    /// Publish Kubernetes events in spokes.
    pub publish_events: bool,
    /// The ClusterProfile version the inventory reads (the finalizer is written through it).
    pub profile_version: InventoryVersion,
    /// What bindings may ask for in their SVIDs, in every spoke (the hub's flags).
    pub svid_policy: Arc<SvidPolicy>,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            inventory: InventoryOptions::default(),
            removal_policy: RemovalPolicy::Orphan,
            removal_timeout: Duration::from_secs(600),
            max_concurrent_syncs: 16,
            initial_sync_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(30),
            client: ClientOptions::default(),
            backoff: BackoffOptions::default(),
            spoke_concurrency: 4,
            discovery_interval: Duration::from_secs(30),
            snapshot_interval: Duration::from_secs(1),
            probe_interval: Duration::from_secs(30),
            admission_policy_interval: Duration::from_secs(60),
            event_instance: None,
            publish_events: true,
            profile_version: InventoryVersion::default(),
            svid_policy: Arc::default(),
        }
    }
}
