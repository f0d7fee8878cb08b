//! The fleet report as text: a summary line, then one block per finding (kind, severity,
//! SPIFFE ID, members, what to change), then one line per spoke.

use std::fmt::Write as _;

use kleym_api::fleet::Finding;
use kleym_hub::report::FullReport;

use super::scenario::Planted;

/// Renders `report` for a terminal.
pub fn render(report: &FullReport) -> String {
    let s = &report.summary;
    let c = &s.finding_counts;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "FLEET REPORT: {} clusters ({} ready, {} unhealthy), {} bindings, {} findings ({} collisions, {} warnings)",
        s.clusters.total,
        s.clusters.ready,
        s.clusters.unhealthy,
        s.bindings,
        c.total,
        c.collisions,
        c.warnings
    );
    if s.findings.is_empty() {
        let _ = writeln!(out, "\nno findings");
    }
    for f in &s.findings {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<22} {:<10} {}",
            f.kind.to_string(),
            f.severity.to_string(),
            f.spiffe_id.as_deref().unwrap_or("-")
        );
        for m in &f.members {
            let _ = writeln!(out, "    {m}");
        }
        let _ = writeln!(out, "    -> {}", f.message);
    }
    let _ = writeln!(
        out,
        "\n{:<20} {:<8} {:>8} {:>6}  REASON",
        "CLUSTER", "READY", "BINDINGS", "OK"
    );
    for spoke in &report.spokes {
        let st = &spoke.status;
        let ready = st
            .conditions
            .iter()
            .find(|c| c.type_ == kleym_api::fleet::condition_types::READY);
        let _ = writeln!(
            out,
            "{:<20} {:<8} {:>8} {:>6}  {}",
            spoke.cluster,
            ready.map(|c| c.status.as_str()).unwrap_or("Unknown"),
            st.bindings.total,
            st.bindings.ready,
            ready.map(|c| c.reason.as_str()).unwrap_or("")
        );
    }
    out
}

/// A finding as comparable to a [`Planted`] one.
pub fn as_planted(f: &Finding) -> Planted {
    let kind: &'static str = match f.kind {
        kleym_api::fleet::FindingKind::IdentityCollision => "IdentityCollision",
        kleym_api::fleet::FindingKind::DuplicateSpiffeId => "DuplicateSPIFFEID",
        kleym_api::fleet::FindingKind::CrossClusterDrift => "CrossClusterDrift",
        kleym_api::fleet::FindingKind::PoolOnlyAndPerObjective => "PoolOnlyAndPerObjective",
        kleym_api::fleet::FindingKind::OverlappingDefaultIdentity => "OverlappingDefaultIdentity",
    };
    let mut members: Vec<String> = f.members.iter().map(ToString::to_string).collect();
    members.sort();
    Planted {
        kind,
        spiffe_id: f.spiffe_id.clone(),
        members,
    }
}
