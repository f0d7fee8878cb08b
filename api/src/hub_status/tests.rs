use kube::{CustomResourceExt, Resource};
use serde_json::json;

use super::*;

#[test]
fn crds_have_expected_scope_and_status_subresource() {
    let cis = ClusterIdentityStatus::crd();
    assert_eq!(cis.spec.scope, "Namespaced");
    assert_eq!(cis.spec.names.plural, "clusteridentitystatuses");
    let fir = FleetIdentityReport::crd();
    assert_eq!(fir.spec.scope, "Cluster");
    for crd in [&cis, &fir] {
        let v = &crd.spec.versions[0];
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let cols: Vec<&str> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert!(cols.len() >= 4, "{cols:?}");
    }
    assert_eq!(ClusterIdentityStatus::kind(&()), "ClusterIdentityStatus");
}

#[test]
fn report_status_uses_api_field_names() {
    let mut counts = FindingCounts::default();
    counts.add(FindingKind::DuplicateSpiffeId);
    counts.add(FindingKind::OverlappingDefaultIdentity);
    let status = FleetIdentityReportStatus {
        finding_counts: counts,
        findings: vec![Finding {
            kind: FindingKind::DuplicateSpiffeId,
            severity: Severity::Collision,
            spiffe_id: Some("spiffe://td/ns/a/objective/x".into()),
            members: vec![FindingMember {
                cluster: "fleet/east".into(),
                namespace: "a".into(),
                binding: "b".into(),
            }],
            member_count: 1,
            message: "m".into(),
        }],
        ..Default::default()
    };
    let v = serde_json::to_value(&status).unwrap();
    assert_eq!(v["findingCounts"]["duplicateSPIFFEID"], 1);
    assert_eq!(v["findingCounts"]["collisions"], 1);
    assert_eq!(v["findingCounts"]["warnings"], 1);
    assert_eq!(v["findings"][0]["kind"], "DuplicateSPIFFEID");
    assert_eq!(v["findings"][0]["spiffeID"], "spiffe://td/ns/a/objective/x");
    assert_eq!(v["findings"][0]["memberCount"], 1);
    assert!(v.get("findingsTruncated").is_none());
    let back: FleetIdentityReportStatus = serde_json::from_value(v).unwrap();
    assert_eq!(back, status);
}

#[test]
fn severities_follow_kinds() {
    let collisions: Vec<_> = FindingKind::ALL
        .iter()
        .filter(|k| k.severity() == Severity::Collision)
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        collisions,
        [
            "IdentityCollision",
            "DuplicateSPIFFEID",
            "CrossClusterDrift"
        ]
    );
    assert!(Severity::Collision < Severity::Warning);
    let parsed: FindingKind = serde_json::from_value(json!("PoolOnlyAndPerObjective")).unwrap();
    assert_eq!(parsed, FindingKind::PoolOnlyAndPerObjective);
}
