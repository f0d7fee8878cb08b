//! Rendering a report for people (`kleym report`'s table) and the `--fail-on` verdict.

use std::io::{self, Write};

use kleym_api::hub_status::{FleetIdentityReportStatus, Severity};

/// Which findings make `kleym report` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailOn {
    /// Findings of severity Collision (IdentityCollision, DuplicateSPIFFEID, CrossClusterDrift).
    Collision,
    /// Any finding, warnings included.
    Warning,
    /// Never (exit 0 whatever the findings).
    None,
}

/// Exit code for the findings: 1 when findings at or above `fail_on` exist, else 0.
/// Counts are exact even when the list is truncated.
pub fn findings_exit_code(report: &FleetIdentityReportStatus, fail_on: FailOn) -> u8 {
    let c = &report.finding_counts;
    let failing = match fail_on {
        FailOn::Collision => c.collisions,
        FailOn::Warning => c.collisions + c.warnings,
        FailOn::None => 0,
    };
    u8::from(failing > 0)
}

/// Print `rows` as left-aligned columns, indented.
fn columns(out: &mut impl Write, indent: &str, rows: &[[&str; 3]]) -> io::Result<()> {
    let mut widths = [0usize; 3];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        writeln!(
            out,
            "{indent}{:<w0$}  {:<w1$}  {}",
            row[0],
            row[1],
            row[2],
            w0 = widths[0],
            w1 = widths[1]
        )?;
    }
    Ok(())
}

/// The spokes of a full report as a table (CLUSTER, READY, REASON, BINDINGS, NOT READY),
/// not-ready spokes first.
pub fn render_spokes(spokes: &[super::full::SpokeReport], out: &mut impl Write) -> io::Result<()> {
    if spokes.is_empty() {
        return Ok(());
    }
    let ready_of = |s: &super::full::SpokeReport| {
        s.status
            .conditions
            .iter()
            .find(|c| c.type_ == kleym_api::hub_status::condition_types::READY)
            .map(|c| (c.status.clone(), c.reason.clone()))
            .unwrap_or_else(|| ("Unknown".into(), "Pending".into()))
    };
    let mut rows: Vec<[String; 5]> = spokes
        .iter()
        .map(|s| {
            let (status, reason) = ready_of(s);
            [
                s.cluster.clone(),
                status,
                reason,
                s.status.bindings.total.to_string(),
                s.status.bindings.not_ready.to_string(),
            ]
        })
        .collect();
    rows.sort_by(|a, b| (a[1] == "True", &a[0]).cmp(&(b[1] == "True", &b[0])));
    let header = ["CLUSTER", "READY", "REASON", "BINDINGS", "NOT READY"].map(String::from);
    let mut widths = [0usize; 5];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    writeln!(out)?;
    for row in std::iter::once(&header).chain(&rows) {
        let line = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// The readable form: a header with the counts, then one block per finding (kind, severity,
/// SPIFFE ID, members as a table, what to change).
pub fn render_table(report: &FleetIdentityReportStatus, out: &mut impl Write) -> io::Result<()> {
    let generated = report
        .generated_at
        .as_ref()
        .map_or_else(|| "unknown".to_string(), |t| t.0.to_string());
    let c = &report.finding_counts;
    writeln!(out, "Fleet identity report (generated {generated})")?;
    writeln!(
        out,
        "Clusters: {} ({} ready, {} unhealthy)   Bindings: {}",
        report.clusters.total, report.clusters.ready, report.clusters.unhealthy, report.bindings
    )?;
    writeln!(
        out,
        "Findings: {} ({} collisions, {} warnings)",
        c.total, c.collisions, c.warnings
    )?;
    if c.total > 0 {
        let by_kind = [
            ("IdentityCollision", c.identity_collision),
            ("DuplicateSPIFFEID", c.duplicate_spiffe_id),
            ("CrossClusterDrift", c.cross_cluster_drift),
            ("PoolOnlyAndPerObjective", c.pool_only_and_per_objective),
            ("OverlappingDefaultIdentity", c.overlapping_default_identity),
            ("MaskedByForeignObject", c.masked_by_foreign_object),
            ("MultipleSVIDs", c.multiple_svids),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
        writeln!(out, "  by kind: {by_kind}")?;
    }
    if report.findings.is_empty() {
        writeln!(out, "\nNo findings.")?;
        return Ok(());
    }
    for (i, f) in report.findings.iter().enumerate() {
        let marker = match f.severity {
            Severity::Collision => "COLLISION",
            Severity::Warning => "WARNING",
        };
        writeln!(out, "\n[{}] {} {}", i + 1, marker, f.kind)?;
        writeln!(
            out,
            "    SPIFFE ID: {}",
            f.spiffe_id.as_deref().unwrap_or("-")
        )?;
        let mut rows: Vec<[&str; 3]> = vec![["CLUSTER", "NAMESPACE", "BINDING"]];
        rows.extend(
            f.members
                .iter()
                .map(|m| [m.cluster.as_str(), m.namespace.as_str(), m.binding.as_str()]),
        );
        columns(out, "    ", &rows)?;
        let listed = f.members.len() as i64;
        if f.member_count > listed {
            writeln!(out, "    … and {} more members", f.member_count - listed)?;
        }
        writeln!(out, "    Fix: {}", f.message)?;
    }
    if report.findings_truncated {
        writeln!(
            out,
            "\nNote: this FleetIdentityReport is capped ({} of {} findings listed); \
             `kleym report --server <hub API URL>` shows the full report.",
            report.findings.len(),
            c.total
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use kleym_api::hub_status::{Finding, FindingCounts, FindingKind, FindingMember};

    use super::*;

    fn report(kinds: &[FindingKind]) -> FleetIdentityReportStatus {
        let mut counts = FindingCounts::default();
        let findings = kinds
            .iter()
            .map(|k| {
                counts.add(*k);
                Finding {
                    kind: *k,
                    severity: k.severity(),
                    spiffe_id: Some("spiffe://td/ns/n/objective/o".into()),
                    members: vec![FindingMember {
                        cluster: "fleet/east".into(),
                        namespace: "n".into(),
                        binding: "b".into(),
                    }],
                    member_count: 3,
                    message: "do this".into(),
                }
            })
            .collect();
        FleetIdentityReportStatus {
            generated_at: Some(crate::report::k8s_time(Utc.timestamp_opt(0, 0).unwrap())),
            finding_counts: counts,
            findings,
            ..Default::default()
        }
    }

    #[test]
    fn spokes_table_puts_not_ready_first() {
        use crate::report::{ErrorCategory, FullReport, Health, SpokeObservation};
        let ok = SpokeObservation {
            cluster: "fleet/a".into(),
            credentials: Health::Ok,
            reachable: Health::Ok,
            synced: Health::Ok,
            ..Default::default()
        };
        let bad = SpokeObservation {
            cluster: "fleet/b".into(),
            credentials: Health::Ok,
            reachable: Health::Failed(ErrorCategory::Tls),
            ..ok.clone()
        };
        let full = FullReport::build(&[ok, bad], Utc.timestamp_opt(0, 0).unwrap());
        let mut out = Vec::new();
        render_spokes(&full.spokes, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(
            lines[0], "CLUSTER  READY  REASON      BINDINGS  NOT READY",
            "{text}"
        );
        assert_eq!(
            lines[1], "fleet/b  False  TLSFailure  0         0",
            "{text}"
        );
        assert_eq!(
            lines[2], "fleet/a  True   Ok          0         0",
            "{text}"
        );
    }

    #[test]
    fn exit_codes_follow_fail_on() {
        let clean = report(&[]);
        let warn = report(&[FindingKind::OverlappingDefaultIdentity]);
        let coll = report(&[FindingKind::CrossClusterDrift]);
        for (r, collision, warning) in [(&clean, 0, 0), (&warn, 0, 1), (&coll, 1, 1)] {
            assert_eq!(findings_exit_code(r, FailOn::Collision), collision);
            assert_eq!(findings_exit_code(r, FailOn::Warning), warning);
            assert_eq!(findings_exit_code(r, FailOn::None), 0);
        }
    }

    #[test]
    fn table_lists_each_finding_with_members_and_fix() {
        let mut out = Vec::new();
        render_table(&report(&[FindingKind::DuplicateSpiffeId]), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("[1] COLLISION DuplicateSPIFFEID"), "{text}");
        assert!(text.contains("SPIFFE ID: spiffe://td/ns/n/objective/o"));
        assert!(text.contains("CLUSTER     NAMESPACE  BINDING"), "{text}");
        assert!(text.contains("fleet/east  n          b"), "{text}");
        assert!(text.contains("… and 2 more members"));
        assert!(text.contains("Fix: do this"));
        let mut out = Vec::new();
        render_table(&report(&[]), &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("No findings."));
    }
}
