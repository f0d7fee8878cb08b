//! Size bounds: 1000 synthetic spokes × 1000 bindings, with findings planted in every
//! spoke and drift on every shared ID, still give a `FleetIdentityReport` and
//! `ClusterIdentityStatus`es far below etcd's 1.5 MiB object limit (measured by
//! serialising them).

use std::sync::Arc;

use chrono::{TimeZone, Utc};
use kleym_api::{ConflictPeer, IdentityMode, IdentityWarning};
use kleym_hub::report::{
    BindingSnapshot, Caps, FullReport, Health, SpokeObservation, bound_report, cluster_status,
    shared,
};

const SPOKES: usize = 1000;
const BINDINGS: usize = 1000;
/// etcd's default request limit is 1.5 MiB; "far below" means under a third of it.
const BUDGET: usize = 512 * 1024;

fn spoke(i: usize, pool: &Arc<Vec<(String, String)>>) -> SpokeObservation {
    let cluster = format!("fleet-system/cluster-{i:04}");
    let bindings: Vec<BindingSnapshot> = (0..BINDINGS)
        .map(|j| {
            let ns = format!("tenant-{:02}", (j / 20) % 50);
            let mut b = BindingSnapshot {
                namespace: ns.clone(),
                name: format!("objective-{j:04}"),
                mode: IdentityMode::PerObjective,
                // Shared across clusters; spoke i's service account differs every 100th
                // spoke, so each ID drifts.
                spiffe_ids: vec![format!(
                    "spiffe://prod.example.org/ns/{ns}/objective/objective-{j:04}"
                )],
                service_account: Some(format!("sa-{}", i / 100)),
                container_discriminator: Some(format!("k8s:container-name:model-{j:04}")),
                pool_selector: (**pool).clone(),
                ready: true,
                ..Default::default()
            };
            // Two colliding pairs, one warning and a few refused bindings per spoke.
            if j < 4 {
                let peer = format!("objective-{:04}", j ^ 1);
                b.ready = false;
                b.reason = Some("Conflict".into());
                b.message = Some(
                    "binding collides with its peer; give each objective its own container"
                        .repeat(3),
                );
                b.conflict_peers = vec![ConflictPeer {
                    name: peer,
                    reason: "IdentityCollision".into(),
                }];
            } else if j < 60 {
                b.ready = false;
                b.reason = Some("InvalidRef".into());
                b.message = Some(format!("InferenceObjective {ns}/missing-{j} not found"));
            } else if j == 60 {
                b.warnings = vec![IdentityWarning {
                    reason: "OverlappingDefaultIdentity".into(),
                    message: "ClusterSPIFFEID default also selects the pods; set fallback: true"
                        .into(),
                }];
            }
            b
        })
        .collect();
    SpokeObservation {
        cluster,
        trust_domain: Some("prod.example.org".into()),
        credentials: Health::Ok,
        reachable: Health::Ok,
        synced: Health::Ok,
        spoke_version: Some("v1.33.1".into()),
        last_sync: Some(Utc.timestamp_opt(1_700_000_000, 0).unwrap()),
        bindings: shared(bindings),
        ..Default::default()
    }
}

#[test]
fn written_objects_stay_far_below_etcd_limit_at_1000_spokes_by_1000_bindings() {
    let pool = Arc::new(vec![
        ("app".to_string(), "vllm".to_string()),
        (
            "inference.networking.k8s.io/pool".to_string(),
            "llama".to_string(),
        ),
    ]);
    let fleet: Vec<SpokeObservation> = (0..SPOKES).map(|i| spoke(i, &pool)).collect();
    let now = Utc.timestamp_opt(1_700_000_100, 0).unwrap();
    let full = FullReport::build(&fleet, now);
    let counts = full.summary.finding_counts;
    assert_eq!(full.summary.bindings, (SPOKES * BINDINGS) as i64);
    assert_eq!(counts.identity_collision, (2 * SPOKES) as i64);
    assert_eq!(counts.overlapping_default_identity, SPOKES as i64);
    assert_eq!(counts.cross_cluster_drift, BINDINGS as i64);
    let drift = full
        .summary
        .findings
        .iter()
        .find(|f| f.kind == kleym_api::hub_status::FindingKind::CrossClusterDrift)
        .unwrap();
    assert_eq!(drift.member_count, SPOKES as i64);

    let caps = Caps::default();
    let bounded = bound_report(&full.summary, &caps);
    let report_bytes = serde_json::to_vec(&bounded).unwrap().len();
    assert!(bounded.findings_truncated);
    assert_eq!(bounded.finding_counts, counts, "counts stay exact");
    assert!(
        report_bytes < BUDGET,
        "FleetIdentityReport status is {report_bytes} bytes"
    );

    let status = cluster_status(&fleet[0], now, Some(&caps));
    let status_bytes = serde_json::to_vec(&status).unwrap().len();
    assert!(status.non_ready_bindings_truncated);
    assert_eq!(status.bindings.not_ready, 60);
    assert!(
        status_bytes < BUDGET,
        "ClusterIdentityStatus is {status_bytes} bytes"
    );
    eprintln!(
        "1000x1000: FleetIdentityReport {report_bytes} B, ClusterIdentityStatus {status_bytes} B, full report findings {}",
        full.summary.findings.len()
    );
}
