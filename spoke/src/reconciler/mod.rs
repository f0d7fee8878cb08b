//! The per-cluster reconciler: watches bindings and their inputs through caches, compiles
//! each binding with the pure [`crate::compiler`], applies the ClusterSPIFFEID and writes
//! the binding status, writing nothing when nothing changed.
//!
//! Pipeline of one reconcile (see [`reconcile`]): dereference (read the binding, its
//! target, pool and namespace peers from the caches) and compile (pure) → plan (compare the
//! desired output with the cache, pure) → apply (only what differs) → status → finalizer.
//!
//! One instance per cluster, no process-global state: see [`run::Spoke`]. Its
//! [`context::Context`] splits into pure [`state::SpokeState`] and [`effects::Effects`];
//! the steps take only the pieces they use. The watched kinds are listed once, in
//! [`api_availability::ApiKind::ALL`].

pub mod api_availability;
pub mod apply;
pub mod binding_snapshot;
pub mod caches;
pub mod claims;
pub mod compile;
pub mod config;
pub mod context;
pub mod effects;
pub mod error;
pub mod evaluation;
pub mod events;
pub mod explain_view;
pub mod finalizer;
pub mod index;
pub mod lean;
pub mod limits;
pub mod list_watch;
pub mod metrics;
pub mod ns_cache;
pub mod observed_output;
pub mod overlay;
pub mod plan;
pub mod queue;
pub mod reconcile;
pub mod run;
pub mod snapshot;
pub mod state;
pub mod status;
pub mod target_record;
pub mod trim;
pub mod watch_failures;
pub mod watches;

#[cfg(test)]
mod evaluation_tests;
#[cfg(test)]
mod feed_tests;

pub use config::{CachesSynced, SpokeConfig};
pub use effects::{ClusterClient, SendWrite};
pub use error::Error;
pub use metrics::SpokeMetrics;
pub use run::{Spoke, run};
/// Cancellation of a running reconciler (re-exported so callers need no tokio-util).
pub use tokio_util::sync::CancellationToken;
