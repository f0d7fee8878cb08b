//! Fleet status objects the hub writes in its own cluster (`kleym.io/v1alpha1`):
//!
//! - [`ClusterIdentityStatus`] (namespaced): one per ClusterProfile, same namespace and name,
//!   owned by the profile. Reachability, credentials, sync state, binding counts and a capped
//!   list of non-ready bindings of one spoke.
//! - [`FleetIdentityReport`] (cluster-scoped, one per hub, named [`FLEET_REPORT_NAME`]):
//!   every identity finding in the fleet, as counts plus a capped list.
//! - [`ClusterIdentityObservation`] (namespaced, in the hub namespace; internal): what the
//!   replica engaging a spoke observed of it, the input of a fleet report written by another
//!   replica.
//!
//! Both are bounded in size by their writer (the hub); the `…Truncated` markers say when a
//! list was capped, and the counts are always exact.

mod cluster_status;
mod error_category;
mod observation;
mod report;

pub use cluster_status::{
    BindingCounts, ClusterIdentityStatus, ClusterIdentityStatusSpec, ClusterIdentityStatusStatus,
    DuplicateOf, NonReadyBinding, condition_types, reasons,
};
pub use error_category::ErrorCategory;
pub use observation::{
    ClusterIdentityObservation, ClusterIdentityObservationSpec, ObservedAdmissionPolicy,
    ObservedBinding, ObservedHealth,
};
pub use report::{
    ClusterCounts, Finding, FindingCounts, FindingKind, FindingMember, FleetIdentityReport,
    FleetIdentityReportSpec, FleetIdentityReportStatus, Severity,
};

/// The name of the one `FleetIdentityReport` of a hub.
pub const FLEET_REPORT_NAME: &str = "fleet";

#[cfg(test)]
mod tests;
