//! The fleet report: pure analysis of what the hub observed of its spokes.
//!
//! - [`input`]: [`SpokeObservation`] and the spokes' [`BindingSnapshot`]s, the inputs (built
//!   by the fleet supervisor, or by hand in tests).
//! - [`analysis`]: the findings: within-spoke conflicts and warnings lifted from the spokes'
//!   verdicts, cross-cluster drift found here.
//! - [`cluster`]: one spoke's `ClusterIdentityStatus` content.
//! - [`published`]: a spoke's observation as the `ClusterIdentityObservation` objects that
//!   carry it to the replica writing the report, and back.
//! - [`full`]: [`FullReport`], the uncapped report served by the HTTP API.
//! - [`bound`]: caps that keep the objects written to the hub cluster small.
//! - [`source`] and [`render`]: reading and printing a report (`kleym report`).
//!
//! No I/O and no clock: callers pass `now`.

pub mod analysis;
pub mod bound;
pub mod cluster;
pub mod from_fleet;
pub mod full;
pub mod input;
pub mod published;
pub mod render;
pub mod source;

pub use analysis::analyze;
pub use bound::{Caps, bound_report};
pub use cluster::cluster_status;
pub use full::{FullReport, SpokeReport};
pub use input::{BindingSnapshot, Health, SpokeObservation, WorkloadSignature, shared};
pub use kleym_api::ErrorCategory;

#[cfg(test)]
mod tests;

/// A chrono instant as a Kubernetes `Time` (second precision, as the API serialises it).
pub fn k8s_time(
    t: chrono::DateTime<chrono::Utc>,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let ts = k8s_openapi::jiff::Timestamp::from_second(t.timestamp())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts)
}
