//! The fleet report as text, and findings in a comparable form.

use kleym_api::hub_status::Finding;
use kleym_hub::report::FullReport;
use kleym_hub::report::render::{render_spokes, render_table};

use super::scenario::Planted;

/// Renders `report` exactly as `kleym report` prints its table (the same library
/// functions: findings, then one line per spoke).
pub fn render(report: &FullReport) -> String {
    let mut out: Vec<u8> = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = render_table(&report.summary, &mut out);
    let _ = render_spokes(&report.spokes, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A finding as comparable to a [`Planted`] one.
pub fn as_planted(f: &Finding) -> Planted {
    let kind: &'static str = match f.kind {
        kleym_api::hub_status::FindingKind::IdentityCollision => "IdentityCollision",
        kleym_api::hub_status::FindingKind::DuplicateSpiffeId => "DuplicateSPIFFEID",
        kleym_api::hub_status::FindingKind::CrossClusterDrift => "CrossClusterDrift",
        kleym_api::hub_status::FindingKind::PoolOnlyAndPerObjective => "PoolOnlyAndPerObjective",
        kleym_api::hub_status::FindingKind::OverlappingDefaultIdentity => {
            "OverlappingDefaultIdentity"
        }
        kleym_api::hub_status::FindingKind::MaskedByForeignObject => "MaskedByForeignObject",
        kleym_api::hub_status::FindingKind::MultipleSvids => "MultipleSVIDs",
    };
    let mut members: Vec<String> = f.members.iter().map(ToString::to_string).collect();
    members.sort();
    Planted {
        kind,
        spiffe_id: f.spiffe_id.clone(),
        members,
    }
}
