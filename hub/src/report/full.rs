//! The full, uncapped fleet report (the body of the hub's `GET /v1/report`).

use chrono::{DateTime, Utc};
use kleym_api::hub_status::{
    ClusterCounts, ClusterIdentityStatusStatus, FindingCounts, FleetIdentityReportStatus,
};
use serde::{Deserialize, Serialize};

use super::analysis::analyze;
use super::cluster::cluster_status;
use super::input::SpokeObservation;

/// The full report: the `FleetIdentityReport` status fields with every finding and every
/// member (nothing truncated), plus each spoke's uncapped status.
///
/// Serialises as the `FleetIdentityReport` status JSON (camelCase) with an extra `spokes`
/// array, so a reader of either form (`kleym report`) can parse both.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FullReport {
    /// Generation time, counts and all findings.
    #[serde(flatten)]
    pub summary: FleetIdentityReportStatus,
    /// Every spoke, sorted by name.
    #[serde(default)]
    pub spokes: Vec<SpokeReport>,
}

/// One spoke in the full report.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpokeReport {
    /// `<profile namespace>/<profile name>`.
    pub cluster: String,
    /// Its status, with every non-ready binding.
    pub status: ClusterIdentityStatusStatus,
}

impl FullReport {
    /// Analyse the fleet. Pure: the same observations (in any order) give the same report.
    pub fn build(spokes: &[SpokeObservation], now: DateTime<Utc>) -> FullReport {
        // A duplicate profile's cluster is counted, and analysed, through the engaged one.
        let (duplicates, engaged): (Vec<&SpokeObservation>, Vec<&SpokeObservation>) =
            spokes.iter().partition(|s| s.duplicate_of.is_some());
        // Borrowed: a copy of every binding's observation was 5 MB of heap at 100 × 100
        // (heaptrack), made on every status pass.
        let counted = engaged;
        let findings = analyze(&counted);
        let mut finding_counts = FindingCounts::default();
        for f in &findings {
            finding_counts.add(f.kind);
        }
        let mut reports: Vec<SpokeReport> = spokes
            .iter()
            .map(|s| SpokeReport {
                cluster: s.cluster.clone(),
                status: cluster_status(s, now, None),
            })
            .collect();
        reports.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        let ready = reports
            .iter()
            .filter(|r| {
                r.status.conditions.iter().any(|c| {
                    c.type_ == kleym_api::hub_status::condition_types::READY && c.status == "True"
                })
            })
            .count();
        let unhealthy = counted.iter().filter(|s| !s.healthy()).count();
        FullReport {
            summary: FleetIdentityReportStatus {
                generated_at: Some(super::k8s_time(now)),
                clusters: ClusterCounts {
                    total: counted.len() as i64,
                    ready: ready as i64,
                    unhealthy: unhealthy as i64,
                    duplicates: duplicates.len() as i64,
                },
                bindings: counted.iter().map(|s| s.bindings.len() as i64).sum(),
                finding_counts,
                findings,
                findings_truncated: false,
            },
            spokes: reports,
        }
    }
}
