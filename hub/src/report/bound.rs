//! Bounding: the objects written to the hub cluster keep exact counts but cap their lists,
//! so they stay far below etcd's object size limit (1.5 MiB) at any fleet size.

use kleym_api::hub_status::FleetIdentityReportStatus;

/// List and string caps of the objects written to the hub cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Findings listed in the `FleetIdentityReport`.
    pub findings: usize,
    /// Members listed per finding.
    pub members_per_finding: usize,
    /// Non-ready bindings listed per `ClusterIdentityStatus`.
    pub non_ready_bindings: usize,
    /// Bytes kept of a message (cut at a character boundary, marked with `…`).
    pub message_len: usize,
}

impl Default for Caps {
    /// At most 100 findings × 10 members and 1 KiB messages: a few hundred KiB in the
    /// worst case of maximal Kubernetes names, tens of KiB in practice.
    fn default() -> Self {
        Caps {
            findings: 100,
            members_per_finding: 10,
            non_ready_bindings: 50,
            message_len: 1024,
        }
    }
}

/// `s` cut to at most `max` bytes at a character boundary, with `…` when cut.
pub fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The report as written to the `FleetIdentityReport`: counts unchanged, lists capped,
/// `findingsTruncated` set when anything was left out.
pub fn bound_report(full: &FleetIdentityReportStatus, caps: &Caps) -> FleetIdentityReportStatus {
    let mut truncated = full.findings_truncated || full.findings.len() > caps.findings;
    let findings = full
        .findings
        .iter()
        .take(caps.findings)
        .map(|f| {
            let mut f = f.clone();
            if f.members.len() > caps.members_per_finding {
                f.members.truncate(caps.members_per_finding);
                truncated = true;
            }
            f.message = shorten(&f.message, caps.message_len);
            f
        })
        .collect();
    FleetIdentityReportStatus {
        findings,
        findings_truncated: truncated,
        ..full.clone()
    }
}
