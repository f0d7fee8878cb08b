//! Status writers: `ClusterIdentityStatus` per spoke and the `FleetIdentityReport`, written
//! to the hub cluster with server-side apply (field manager [`FIELD_MANAGER`]).
//!
//! - [`compare`]: what counts as a change (timestamps that move on every sync do not).
//! - [`writer`]: [`StatusWriter`], which writes only changed content, at most once per
//!   object per interval (later submissions coalesce into one write).
//! - [`run`]: the loop that turns the supervisor's `FleetState` into submissions.
//! - [`first_write`]: each object's first write held back until what it describes settled.
//! - [`observations`]: each spoke's observation published in the hub namespace, and the
//!   watch that reads every replica's back as the report's input ([`ReportInputs`]).
//! - [`metrics`]: passes of that loop, as leader or follower.

pub mod compare;
pub mod first_write;
pub mod metrics;
pub mod observations;
pub mod run;
pub mod writer;

pub use first_write::FirstWriteOptions;
pub use metrics::StatusMetrics;
pub use observations::{ObservationCache, ObservationOptions, ReportInputs};
pub use run::{StatusLoopOptions, run_status_loop};
pub use writer::{
    StatusError, StatusOwnerRef, StatusWriter, WriteFence, WriteStats, WriterOptions,
};

/// Field manager of every hub status write.
pub const FIELD_MANAGER: &str = "kleym-hub";
