//! Change detection for status content. Written content is compared with the last written
//! content, ignoring timestamps that would otherwise cause a write on every sync.

use kleym_api::hub_status::{ClusterIdentityStatusStatus, FleetIdentityReportStatus};

/// Whether `new` differs from `old` in anything but condition transition times and a
/// `lastSuccessfulSync` that moved by less than `sync_refresh_secs`.
pub fn cluster_status_changed(
    old: &ClusterIdentityStatusStatus,
    new: &ClusterIdentityStatusStatus,
    sync_refresh_secs: i64,
) -> bool {
    let sync_stale = match (&old.last_successful_sync, &new.last_successful_sync) {
        (Some(o), Some(n)) => (n.0.as_second() - o.0.as_second()).abs() >= sync_refresh_secs,
        (None, None) => false,
        _ => true,
    };
    sync_stale || normalise_cluster(old) != normalise_cluster(new)
}

fn normalise_cluster(s: &ClusterIdentityStatusStatus) -> ClusterIdentityStatusStatus {
    let mut s = s.clone();
    s.last_successful_sync = None;
    for c in &mut s.conditions {
        c.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
    }
    s
}

/// Keep the previous `lastTransitionTime` of every condition whose status did not change
/// (a transition time says when the status last changed, not when it was last computed).
pub fn carry_transition_times(
    old: Option<&ClusterIdentityStatusStatus>,
    new: &mut ClusterIdentityStatusStatus,
) {
    let Some(old) = old else { return };
    for c in &mut new.conditions {
        if let Some(prev) = old
            .conditions
            .iter()
            .find(|p| p.type_ == c.type_ && p.status == c.status)
        {
            c.last_transition_time = prev.last_transition_time.clone();
        }
    }
}

/// Whether the report content differs, ignoring `generatedAt` (which is the time of the
/// last content change, so it only moves with the content).
pub fn report_changed(old: &FleetIdentityReportStatus, new: &FleetIdentityReportStatus) -> bool {
    let strip = |s: &FleetIdentityReportStatus| FleetIdentityReportStatus {
        generated_at: None,
        ..s.clone()
    };
    strip(old) != strip(new)
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use kleym_api::hub_status::FindingCounts;

    use super::*;
    use crate::report::{Health, SpokeObservation, cluster_status, k8s_time};

    fn status(at: i64, healthy: bool) -> ClusterIdentityStatusStatus {
        let now = Utc.timestamp_opt(at, 0).unwrap();
        let h = if healthy {
            Health::Ok
        } else {
            Health::Failed(crate::report::ErrorCategory::Unreachable)
        };
        let obs = SpokeObservation {
            cluster: "ns/a".into(),
            credentials: Health::Ok,
            reachable: h,
            synced: Health::Ok,
            last_sync: Some(now),
            ..Default::default()
        };
        cluster_status(&obs, now, None)
    }

    #[test]
    fn timestamps_alone_are_not_a_change() {
        let a = status(1_000, true);
        let b = status(1_030, true);
        assert!(!cluster_status_changed(&a, &b, 300));
        assert!(cluster_status_changed(&a, &status(1_400, true), 300));
        assert!(cluster_status_changed(&a, &status(1_030, false), 300));
    }

    #[test]
    fn transition_times_carry_over_only_for_unchanged_conditions() {
        let old = status(1_000, true);
        let mut new = status(2_000, false);
        carry_transition_times(Some(&old), &mut new);
        let time_of = |s: &ClusterIdentityStatusStatus, t: &str| {
            s.conditions
                .iter()
                .find(|c| c.type_ == t)
                .unwrap()
                .last_transition_time
                .clone()
        };
        let t1000 = k8s_time(Utc.timestamp_opt(1_000, 0).unwrap());
        let t2000 = k8s_time(Utc.timestamp_opt(2_000, 0).unwrap());
        assert_eq!(time_of(&new, "CredentialsAvailable"), t1000);
        assert_eq!(time_of(&new, "Reachable"), t2000);
        assert_eq!(time_of(&new, "Ready"), t2000);
    }

    #[test]
    fn report_generation_time_is_not_a_change() {
        let a = FleetIdentityReportStatus {
            generated_at: Some(k8s_time(Utc.timestamp_opt(1, 0).unwrap())),
            ..Default::default()
        };
        let mut b = FleetIdentityReportStatus {
            generated_at: Some(k8s_time(Utc.timestamp_opt(2, 0).unwrap())),
            ..Default::default()
        };
        assert!(!report_changed(&a, &b));
        let mut counts = FindingCounts::default();
        counts.add(kleym_api::hub_status::FindingKind::CrossClusterDrift);
        b.finding_counts = counts;
        assert!(report_changed(&a, &b));
    }
}
