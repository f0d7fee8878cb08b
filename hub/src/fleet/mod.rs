//! The fleet supervisor: one spoke reconciler per engaged ClusterProfile, isolated from
//! each other, with the published per-spoke [`FleetState`].
//!
//! - [`Supervisor::run`] consumes [`InventoryEvent`](crate::inventory::InventoryEvent)s and a
//!   leadership signal; it engages a spoke when its profile evaluates to
//!   [`Decision::Engage`](crate::inventory::Decision) and re-engages it only when the
//!   [`SpokeSpec`](crate::inventory::SpokeSpec) (effective access + trust domain + SPIRE
//!   class) changes — status heartbeats do nothing.
//! - Each spoke task bounds every wait (client build and probes by
//!   [`FleetOptions::request_timeout`], cache sync by [`FleetOptions::initial_sync_timeout`]),
//!   backs off with jitter on failure, and holds one of
//!   [`FleetOptions::max_concurrent_syncs`] slots only while its caches sync.
//! - Profile deletion applies [`RemovalPolicy`]: the leader keeps its finalizer
//!   [`PROFILE_FINALIZER`] on every engaged ClusterProfile, so a deleted profile stays until
//!   the policy ran (retried until `FleetOptions::removal_timeout`), whether or not a task
//!   was running, and across restarts and failovers.
//! - State readers: [`FleetState::spokes`], [`FleetState::get`], [`FleetState::subscribe`].

pub mod admission_probe;
mod chain;
pub mod errors;
pub mod metrics;
pub mod options;
pub mod profile_finalizer;
pub mod removal;
mod removal_job;
pub mod spoke_metrics;
mod spoke_task;
pub mod state;
pub mod supervisor;

pub use admission_probe::AdmissionPolicyCheck;
pub use errors::{EngageError, categorize_kube};
pub use metrics::FleetMetrics;
pub use options::FleetOptions;
pub use profile_finalizer::{PROFILE_FINALIZER, has_profile_finalizer};
pub use removal::{LeftBinding, RemovalError, RemovalPolicy, RemovalReport, apply_removal};
pub use spoke_metrics::{SpokeMetricsCollector, SpokeMetricsMap};
pub use state::{ErrorCategory, FleetState, Phase, RemovalLabels, SpokeError, SpokeState};
pub use supervisor::{ShardLink, Supervisor};
