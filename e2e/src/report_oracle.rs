//! An independent oracle for the hub's report objects (`ClusterIdentityStatus` per spoke,
//! the `FleetIdentityReport`, the uncapped full report), written from the specification
//! (`docs/report.md`, the API types in `kleym_api::hub_status`) and nothing else.
//!
//! It shares no code with what it checks: it imports neither the hub's report or status
//! code nor the spoke's binding snapshot or compiler (a unit test below reads this file and
//! fails if it does). It reads the spokes' binding objects as the API serves them (spec and
//! status), its own way, and computes the report with deliberately naive loops: every pair
//! of holders of a SPIFFE ID for drift, a fixed point for connected conflict peers, plain
//! counting and plain truncation for the caps. Slow and obvious on purpose.
//!
//! Where the specification leaves a detail open, the oracle follows the product's intent
//! (read, not copied) and says so at the spot, marked "Reading:".

use std::collections::{BTreeMap, BTreeSet};

use kleym_api::hub_status::{
    BindingCounts, ClusterIdentityStatusStatus, DuplicateOf, ErrorCategory, FindingKind,
    FindingMember, FleetIdentityReportStatus, NonReadyBinding, Severity,
};
use kleym_api::{
    DiscriminatorType, IdentityMode, InferenceIdentityBinding, InferenceIdentityBindingStatus,
};
use serde_json::Value;

/// One aspect of the hub's view of a spoke (credentials, reachability, sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aspect {
    /// Not observed yet.
    Unknown,
    /// Works.
    Up,
    /// Fails for this reason.
    Down(ErrorCategory),
}

/// What the hub's last admission policy check of a spoke found (`docs/report.md`, the
/// `AdmissionPolicy` condition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyAspect {
    /// Not checked yet.
    #[default]
    NotChecked,
    /// A ValidatingAdmissionPolicy denied the forbidden dry run.
    Installed,
    /// The forbidden dry run would have succeeded.
    Missing,
    /// The check could not tell.
    Unknown,
}

/// One spoke as the oracle sees it: the hub's view of its health and the spoke's binding
/// objects (as last read from the spoke: kept when the spoke became unreachable).
#[derive(Debug, Clone)]
pub struct SpokeInput {
    /// `<profile namespace>/<profile name>`.
    pub cluster: String,
    /// Whether the hub has credentials for it.
    pub credentials: Aspect,
    /// Whether its API server answers.
    pub reachable: Aspect,
    /// Whether its reconciler is synced.
    pub synced: Aspect,
    /// The supervisor's error message, shown in the failing conditions.
    pub error_message: Option<String>,
    /// Set when the profile duplicates another profile of the same member cluster.
    pub duplicate_of: Option<DuplicateOf>,
    /// The spoke's bindings, as objects (spec and status).
    pub bindings: Vec<InferenceIdentityBinding>,
    /// The hub's last admission policy check.
    pub admission_policy: PolicyAspect,
}

/// List caps of the objects written to the hub cluster (`docs/report.md`, "Size bounds").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Findings listed.
    pub findings: usize,
    /// Members listed per finding.
    pub members: usize,
    /// Non-ready bindings listed per spoke.
    pub non_ready: usize,
    /// Bytes kept of a message.
    pub message_bytes: usize,
}

impl Limits {
    /// The documented caps: 100 findings × 10 members, 50 non-ready bindings, 1 KiB messages.
    pub const DOCUMENTED: Limits = Limits {
        findings: 100,
        members: 10,
        non_ready: 50,
        message_bytes: 1024,
    };

    /// No caps (the full report of the HTTP API).
    pub const NONE: Limits = Limits {
        findings: usize::MAX,
        members: usize::MAX,
        non_ready: usize::MAX,
        message_bytes: usize::MAX,
    };
}

/// What the oracle expects of one finding. The message text is not specified, so only
/// what it must mention is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedFinding {
    /// Kind.
    pub kind: FindingKind,
    /// Severity.
    pub severity: Severity,
    /// SPIFFE ID.
    pub spiffe_id: Option<String>,
    /// Members listed (after the cap).
    pub members: Vec<FindingMember>,
    /// Exact member count.
    pub member_count: i64,
    /// Strings the (uncut) message must contain.
    pub mentions: Vec<String>,
}

/// What the oracle expects of the fleet report (everything but `generatedAt` and the
/// message texts).
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedReport {
    /// `clusters`, `bindings`, `findingCounts` as the status holds them; `findings` empty.
    pub counts: FleetIdentityReportStatus,
    /// The findings listed (after the caps).
    pub findings: Vec<ExpectedFinding>,
    /// `findingsTruncated`.
    pub truncated: bool,
}

/// What the oracle expects of one spoke's `ClusterIdentityStatus`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedCluster {
    /// `(type, status, reason)` of the four conditions, sorted by type.
    pub conditions: Vec<(String, String, String)>,
    /// The error message every False health condition must show, if the hub has one.
    pub error_message: Option<String>,
    /// Binding counts.
    pub bindings: BindingCounts,
    /// The non-ready bindings listed (after the cap).
    pub non_ready: Vec<NonReadyBinding>,
    /// `nonReadyBindingsTruncated`.
    pub truncated: bool,
    /// `duplicateOf`.
    pub duplicate_of: Option<DuplicateOf>,
}

// ---- reading one binding ------------------------------------------------------------------

/// A binding as the oracle reads it from the object.
#[derive(Debug, Clone)]
struct Read {
    namespace: String,
    name: String,
    ids: Vec<String>,
    /// Service account, container selector, pool labels.
    signature: (Option<String>, Option<String>, BTreeSet<(String, String)>),
    ready: bool,
    /// Reason of `Ready`, `None` when absent or empty.
    reason: Option<String>,
    message: Option<String>,
    /// Which refusal condition is True: `Conflict`, `InvalidRef`, `UnsafeSelector`,
    /// `RenderFailure`, or none.
    refused_by: Option<String>,
    peers: Vec<(String, String)>,
    warnings: Vec<(String, String)>,
}

fn read(b: &InferenceIdentityBinding) -> Read {
    let none = InferenceIdentityBindingStatus::default();
    let status = b.status.as_ref().unwrap_or(&none);
    let cond = |t: &str| status.conditions.iter().find(|c| c.type_ == t);
    // Reading: "ready" is Ready=True for the binding's current generation (a status of an
    // older spec says nothing about the current one).
    let current = status.observed_generation == b.metadata.generation;
    let ready = current && cond("Ready").is_some_and(|c| c.status == "True");
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let reason = cond("Ready").and_then(|c| non_empty(&c.reason));
    let message = cond("Ready").and_then(|c| non_empty(&c.message));
    let mut refused_by = None;
    for t in ["Conflict", "InvalidRef", "UnsafeSelector", "RenderFailure"] {
        if refused_by.is_none() && cond(t).is_some_and(|c| c.status == "True") {
            refused_by = Some(t.to_string());
        }
    }
    let mut sa = None;
    let mut pool = BTreeSet::new();
    for s in &status.rendered_selectors {
        if let Some(rest) = s.strip_prefix("k8s:sa:") {
            if sa.is_none() {
                sa = Some(rest.to_string());
            }
        } else if let Some(rest) = s.strip_prefix("k8s:pod-label:") {
            // A label key has no ':' (Kubernetes' syntax), so the value follows the first.
            if let Some(i) = rest.find(':') {
                pool.insert((rest[..i].to_string(), rest[i + 1..].to_string()));
            }
        }
    }
    // The container discriminator as the selector it renders to (DESIGN: ContainerName →
    // k8s:container-name:<v>, ContainerImage → k8s:container-image:<v>).
    let container = b.spec.container_discriminator.as_ref().map(|d| {
        let ty = match d.type_ {
            DiscriminatorType::ContainerName => "container-name",
            DiscriminatorType::ContainerImage => "container-image",
        };
        format!("k8s:{ty}:{}", d.value)
    });
    Read {
        namespace: b.metadata.namespace.clone().unwrap_or_default(),
        name: b.metadata.name.clone().unwrap_or_default(),
        ids: status
            .computed_spiffe_ids
            .iter()
            .map(|c| c.spiffe_id.clone())
            .collect(),
        signature: (sa, container, pool),
        ready,
        reason,
        message,
        refused_by,
        peers: status
            .conflict_peers
            .iter()
            .map(|p| (p.name.clone(), p.reason.clone()))
            .collect(),
        warnings: status
            .warnings
            .iter()
            .map(|w| (w.reason.clone(), w.message.clone()))
            .collect(),
    }
}

// ---- caps ---------------------------------------------------------------------------------

/// `s` cut to at most `max` bytes at a character boundary, ending in `…` when cut: the
/// longest prefix that fits with the marker.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut best = String::new();
    for (i, _) in s.char_indices() {
        if i + "…".len() <= max {
            best = s[..i].to_string();
        }
    }
    best + "…"
}

// ---- one spoke ----------------------------------------------------------------------------

fn reason_of(category: ErrorCategory) -> &'static str {
    // The table of docs/report.md.
    match category {
        ErrorCategory::Credentials => "CredentialPluginFailed",
        ErrorCategory::Unauthorized => "Unauthorized",
        ErrorCategory::ProfileRefused => "ProfileRefused",
        ErrorCategory::Unreachable => "Unreachable",
        ErrorCategory::Tls => "TLSFailure",
        ErrorCategory::Forbidden => "Forbidden",
        ErrorCategory::CrdMissing => "CRDMissing",
        ErrorCategory::ServerError | ErrorCategory::SyncTimeout | ErrorCategory::Other => "Error",
    }
}

fn aspect_condition(a: Aspect) -> (String, String) {
    match a {
        Aspect::Up => ("True".into(), "Ok".into()),
        Aspect::Unknown => ("Unknown".into(), "Pending".into()),
        Aspect::Down(c) => ("False".into(), reason_of(c).into()),
    }
}

fn healthy(s: &SpokeInput) -> bool {
    s.credentials == Aspect::Up && s.reachable == Aspect::Up && s.synced == Aspect::Up
}

/// The expected `ClusterIdentityStatus` of `spoke`.
pub fn expected_cluster(spoke: &SpokeInput, limits: &Limits) -> ExpectedCluster {
    let bindings: Vec<Read> = spoke.bindings.iter().map(read).collect();
    let mut c = BindingCounts::default();
    let mut non_ready = Vec::new();
    for b in &bindings {
        c.total += 1;
        if !b.warnings.is_empty() {
            c.with_warnings += 1;
        }
        if b.ready {
            c.ready += 1;
            continue;
        }
        c.not_ready += 1;
        // Reading: "notReady split by the reason of the Ready condition" names the
        // refusal's condition (the Ready reason is the refusal's own reason, such as
        // TargetNotFound, whose condition is InvalidRef): the condition that is True.
        match b.refused_by.as_deref() {
            Some("Conflict") => c.conflict += 1,
            Some("InvalidRef") => c.invalid_ref += 1,
            Some("UnsafeSelector") => c.unsafe_selector += 1,
            Some("RenderFailure") => c.render_failure += 1,
            _ => c.other += 1,
        }
        non_ready.push(NonReadyBinding {
            namespace: b.namespace.clone(),
            name: b.name.clone(),
            // Reading: a binding with no Ready reason yet is listed as "Unknown".
            reason: b.reason.clone().unwrap_or_else(|| "Unknown".into()),
            message: b
                .message
                .as_deref()
                .map(|m| cut(m, limits.message_bytes))
                .unwrap_or_default(),
        });
    }
    non_ready.sort();
    let truncated = non_ready.len() > limits.non_ready;
    non_ready.truncate(limits.non_ready);

    let creds = aspect_condition(spoke.credentials);
    let reach = aspect_condition(spoke.reachable);
    let synced = aspect_condition(spoke.synced);
    // Ready: the first failing of CredentialsAvailable, Reachable, Synced (the table's
    // order); Pending while one is not observed; BindingsNotReady; else Ok.
    let ordered = [&creds, &reach, &synced];
    let ready = if spoke.duplicate_of.is_some() {
        ("False".to_string(), "Duplicate".to_string())
    } else if let Some(f) = ordered.iter().find(|(s, _)| s == "False") {
        ("False".to_string(), f.1.clone())
    } else if ordered.iter().any(|(s, _)| s == "Unknown") {
        ("Unknown".to_string(), "Pending".to_string())
    } else if c.not_ready > 0 {
        ("False".to_string(), "BindingsNotReady".to_string())
    } else {
        ("True".to_string(), "Ok".to_string())
    };
    let mut conditions = vec![
        ("CredentialsAvailable".to_string(), creds.0, creds.1),
        ("Reachable".to_string(), reach.0, reach.1),
        ("Synced".to_string(), synced.0, synced.1),
        ("Ready".to_string(), ready.0, ready.1),
    ];
    // A warning of its own: it never changes Ready.
    let (status, reason) = match spoke.admission_policy {
        PolicyAspect::NotChecked => ("Unknown", "Pending"),
        PolicyAspect::Installed => ("True", "AdmissionPolicyInstalled"),
        PolicyAspect::Missing => ("False", "AdmissionPolicyMissing"),
        PolicyAspect::Unknown => ("Unknown", "AdmissionPolicyUnknown"),
    };
    conditions.push(("AdmissionPolicy".into(), status.into(), reason.into()));
    conditions.sort();
    ExpectedCluster {
        conditions,
        error_message: spoke.error_message.clone(),
        bindings: c,
        non_ready,
        truncated,
        duplicate_of: spoke.duplicate_of.clone(),
    }
}

// ---- the fleet ----------------------------------------------------------------------------

fn member(cluster: &str, namespace: &str, name: &str) -> FindingMember {
    FindingMember {
        cluster: cluster.into(),
        namespace: namespace.into(),
        binding: name.into(),
    }
}

/// Reading: a finding's SPIFFE ID is the one ID its members' computed IDs share, when
/// together they hold exactly one (none otherwise).
fn the_one_id<'a>(members: impl IntoIterator<Item = &'a Read>) -> Option<String> {
    let ids: BTreeSet<&String> = members.into_iter().flat_map(|b| &b.ids).collect();
    if ids.len() == 1 {
        ids.into_iter().next().cloned()
    } else {
        None
    }
}

fn kind_rank(k: FindingKind) -> usize {
    // docs/report.md's table order: collisions first.
    match k {
        FindingKind::IdentityCollision => 0,
        FindingKind::DuplicateSpiffeId => 1,
        FindingKind::CrossClusterDrift => 2,
        FindingKind::PoolOnlyAndPerObjective => 3,
        FindingKind::OverlappingDefaultIdentity => 4,
        FindingKind::MaskedByForeignObject => 5,
        FindingKind::MultipleSvids => 6,
    }
}

/// The finding kind of a spoke warning reason (docs/reading-the-report.md's table; the
/// spoke's reason strings are in docs/spoke.md). Reasons the report does not know are
/// counted in the cluster status only.
fn warning_kind(reason: &str) -> Option<FindingKind> {
    match reason {
        "PoolAndObjectiveIdentities" => Some(FindingKind::PoolOnlyAndPerObjective),
        "OverlappingDefaultIdentity" => Some(FindingKind::OverlappingDefaultIdentity),
        "MaskedByForeignObject" => Some(FindingKind::MaskedByForeignObject),
        "MultipleSVIDs" => Some(FindingKind::MultipleSvids),
        _ => None,
    }
}

fn severity_of(k: FindingKind) -> Severity {
    if kind_rank(k) <= 2 {
        Severity::Collision
    } else {
        Severity::Warning
    }
}

/// Every finding of the fleet, uncapped, members sorted, in report order.
fn all_findings(spokes: &[(&SpokeInput, Vec<Read>)]) -> Vec<ExpectedFinding> {
    let mut out: Vec<ExpectedFinding> = Vec::new();
    for (spoke, bindings) in spokes {
        let cluster = spoke.cluster.as_str();
        // Lifted conflicts: bindings linked by conflict peers of one reason (peers are in
        // the binding's namespace) form one finding. Reading: a peer named in a status is a
        // member even when no such binding was observed (the spoke named it).
        for (reason, kind) in [
            ("IdentityCollision", FindingKind::IdentityCollision),
            ("DuplicateSPIFFEID", FindingKind::DuplicateSpiffeId),
        ] {
            let mut edges: Vec<((String, String), (String, String))> = Vec::new();
            for b in bindings {
                for (peer, r) in &b.peers {
                    if r == reason {
                        edges.push((
                            (b.namespace.clone(), b.name.clone()),
                            (b.namespace.clone(), peer.clone()),
                        ));
                    }
                }
            }
            // Label every node with the smallest node it is connected to: repeat until
            // nothing changes.
            let mut label: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
            for (a, b) in &edges {
                label.insert(a.clone(), a.clone());
                label.insert(b.clone(), b.clone());
            }
            loop {
                let mut changed = false;
                for (a, b) in &edges {
                    let la = label[a].clone();
                    let lb = label[b].clone();
                    let min = la.clone().min(lb.clone());
                    if la != min {
                        label.insert(a.clone(), min.clone());
                        changed = true;
                    }
                    if lb != min {
                        label.insert(b.clone(), min);
                        changed = true;
                    }
                }
                if !changed {
                    break;
                }
            }
            let groups: BTreeSet<(String, String)> = label.values().cloned().collect();
            for g in groups {
                let keys: Vec<&(String, String)> = label
                    .iter()
                    .filter(|(_, l)| **l == g)
                    .map(|(k, _)| k)
                    .collect();
                let observed: Vec<&Read> = bindings
                    .iter()
                    .filter(|b| {
                        keys.iter()
                            .any(|(ns, n)| *ns == b.namespace && *n == b.name)
                    })
                    .collect();
                out.push(ExpectedFinding {
                    kind,
                    severity: severity_of(kind),
                    spiffe_id: if kind == FindingKind::IdentityCollision {
                        None
                    } else {
                        the_one_id(observed)
                    },
                    members: keys.iter().map(|(ns, n)| member(cluster, ns, n)).collect(),
                    member_count: 0,
                    mentions: vec![cluster.to_string(), g.0.clone()],
                });
            }
        }
        // Lifted warnings: one finding per (kind, namespace, message).
        let mut seen: Vec<(FindingKind, String, String)> = Vec::new();
        for b in bindings {
            for (reason, message) in &b.warnings {
                let Some(kind) = warning_kind(reason) else {
                    continue;
                };
                let key = (kind, b.namespace.clone(), message.clone());
                if !seen.contains(&key) {
                    seen.push(key);
                }
            }
        }
        for (kind, ns, message) in seen {
            let carriers: Vec<&Read> = bindings
                .iter()
                .filter(|b| {
                    b.namespace == ns
                        && b.warnings
                            .iter()
                            .any(|(r, m)| *m == message && warning_kind(r) == Some(kind))
                })
                .collect();
            out.push(ExpectedFinding {
                kind,
                severity: severity_of(kind),
                spiffe_id: the_one_id(carriers.iter().copied()),
                members: carriers
                    .iter()
                    .map(|b| member(cluster, &b.namespace, &b.name))
                    .collect(),
                member_count: 0,
                mentions: vec![cluster.to_string(), ns.clone(), message.clone()],
            });
        }
    }
    // Cross-cluster drift: an ID held in two clusters by two different signatures. Every
    // pair of holders is compared.
    let mut holders: BTreeMap<&String, Vec<(&str, &Read)>> = BTreeMap::new();
    for (spoke, bindings) in spokes {
        for b in bindings {
            for id in &b.ids {
                holders
                    .entry(id)
                    .or_default()
                    .push((spoke.cluster.as_str(), b));
            }
        }
    }
    for (id, hs) in holders {
        let mut drift = false;
        for (ci, bi) in &hs {
            for (cj, bj) in &hs {
                if ci != cj && bi.signature != bj.signature {
                    drift = true;
                }
            }
        }
        if drift {
            // Reading: every holder of the ID is a member (also one whose signature
            // agrees with another cluster's).
            out.push(ExpectedFinding {
                kind: FindingKind::CrossClusterDrift,
                severity: Severity::Collision,
                spiffe_id: Some(id.clone()),
                members: hs
                    .iter()
                    .map(|(c, b)| member(c, &b.namespace, &b.name))
                    .collect(),
                member_count: 0,
                mentions: vec![id.clone()],
            });
        }
    }
    for f in &mut out {
        f.members.sort();
        f.members.dedup();
        f.member_count = f.members.len() as i64;
    }
    // Reading: the order among findings of one kind (the spec says "collisions first, in a
    // deterministic order") is by SPIFFE ID, then members, then what the message says.
    out.sort_by(|a, b| {
        (kind_rank(a.kind), &a.spiffe_id, &a.members, &a.mentions).cmp(&(
            kind_rank(b.kind),
            &b.spiffe_id,
            &b.members,
            &b.mentions,
        ))
    });
    out
}

/// The expected fleet report of `spokes` under `limits` (use [`Limits::NONE`] for the full
/// report).
pub fn expected_report(spokes: &[SpokeInput], limits: &Limits) -> ExpectedReport {
    let counted: Vec<(&SpokeInput, Vec<Read>)> = spokes
        .iter()
        .filter(|s| s.duplicate_of.is_none())
        .map(|s| (s, s.bindings.iter().map(read).collect()))
        .collect();
    let all = all_findings(&counted);
    let mut counts = FleetIdentityReportStatus::default();
    for f in &all {
        let fc = &mut counts.finding_counts;
        fc.total += 1;
        match f.severity {
            Severity::Collision => fc.collisions += 1,
            Severity::Warning => fc.warnings += 1,
        }
        match f.kind {
            FindingKind::IdentityCollision => fc.identity_collision += 1,
            FindingKind::DuplicateSpiffeId => fc.duplicate_spiffe_id += 1,
            FindingKind::CrossClusterDrift => fc.cross_cluster_drift += 1,
            FindingKind::PoolOnlyAndPerObjective => fc.pool_only_and_per_objective += 1,
            FindingKind::OverlappingDefaultIdentity => fc.overlapping_default_identity += 1,
            FindingKind::MaskedByForeignObject => fc.masked_by_foreign_object += 1,
            FindingKind::MultipleSvids => fc.multiple_svids += 1,
        }
    }
    counts.clusters.total = counted.len() as i64;
    counts.clusters.duplicates = spokes.iter().filter(|s| s.duplicate_of.is_some()).count() as i64;
    // Reading: "unhealthy" is any of the three aspects not True (also not observed yet).
    counts.clusters.unhealthy = counted.iter().filter(|(s, _)| !healthy(s)).count() as i64;
    // Ready: healthy, not a duplicate, every binding ready.
    counts.clusters.ready = spokes
        .iter()
        .filter(|s| {
            s.duplicate_of.is_none() && healthy(s) && s.bindings.iter().all(|b| read(b).ready)
        })
        .count() as i64;
    counts.bindings = counted.iter().map(|(_, b)| b.len() as i64).sum();
    let mut truncated = false;
    let mut findings = Vec::new();
    for (i, f) in all.into_iter().enumerate() {
        if i >= limits.findings {
            truncated = true;
            break;
        }
        let mut f = f;
        if f.members.len() > limits.members {
            f.members.truncate(limits.members);
            truncated = true;
        }
        findings.push(f);
    }
    ExpectedReport {
        counts,
        findings,
        truncated,
    }
}

// ---- comparing ----------------------------------------------------------------------------

/// Where the report `got` differs from the oracle's `want` (empty: they agree). Messages
/// are checked for what they must say and for the cap.
pub fn compare_report(
    got: &FleetIdentityReportStatus,
    want: &ExpectedReport,
    limits: &Limits,
) -> Vec<String> {
    let mut d = Vec::new();
    let w = &want.counts;
    if got.clusters != w.clusters {
        d.push(format!(
            "clusters {:?}, want {:?}",
            got.clusters, w.clusters
        ));
    }
    if got.bindings != w.bindings {
        d.push(format!("bindings {}, want {}", got.bindings, w.bindings));
    }
    if got.finding_counts != w.finding_counts {
        d.push(format!(
            "findingCounts {:?}, want {:?}",
            got.finding_counts, w.finding_counts
        ));
    }
    if got.findings_truncated != want.truncated {
        d.push(format!(
            "findingsTruncated {}, want {}",
            got.findings_truncated, want.truncated
        ));
    }
    if got.findings.len() != want.findings.len() {
        d.push(format!(
            "{} findings listed, want {}: got {:?}, want {:?}",
            got.findings.len(),
            want.findings.len(),
            got.findings
                .iter()
                .map(|f| (f.kind, &f.spiffe_id, &f.members))
                .collect::<Vec<_>>(),
            want.findings
                .iter()
                .map(|f| (f.kind, &f.spiffe_id, &f.members))
                .collect::<Vec<_>>()
        ));
    }
    for (i, (g, w)) in got.findings.iter().zip(&want.findings).enumerate() {
        let g_key = (g.kind, g.severity, &g.spiffe_id, &g.members, g.member_count);
        let w_key = (w.kind, w.severity, &w.spiffe_id, &w.members, w.member_count);
        if g_key != w_key {
            d.push(format!("finding {i}: {g_key:?}, want {w_key:?}"));
        }
        d.extend(
            check_message(&g.message, &w.mentions, limits)
                .map(|why| format!("finding {i} ({}): message {why}", g.kind)),
        );
    }
    d
}

fn check_message(m: &str, mentions: &[String], limits: &Limits) -> Option<String> {
    if m.is_empty() {
        return Some("is empty".into());
    }
    if m.len() > limits.message_bytes {
        return Some(format!(
            "is {} bytes, over the cap of {}",
            m.len(),
            limits.message_bytes
        ));
    }
    // A cut message may have lost what it mentions; an uncut one must say it all.
    let was_cut = m.ends_with('…') && m.len() + 4 > limits.message_bytes;
    if !was_cut && let Some(missing) = mentions.iter().find(|s| !m.contains(s.as_str())) {
        return Some(format!("{m:?} does not mention {missing:?}"));
    }
    None
}

/// Where the status `got` of a spoke differs from the oracle's `want` (empty: they agree).
/// Times and the pass-through fields (trust domain, version, retries) are not compared.
pub fn compare_cluster(got: &ClusterIdentityStatusStatus, want: &ExpectedCluster) -> Vec<String> {
    let mut d = Vec::new();
    let mut conds: Vec<(String, String, String)> = got
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect();
    conds.sort();
    if conds != want.conditions {
        d.push(format!("conditions {conds:?}, want {:?}", want.conditions));
    }
    if let Some(msg) = &want.error_message {
        for c in &got.conditions {
            // The admission policy warning is about the policy, not the connection.
            if c.type_ != "Ready"
                && c.type_ != "AdmissionPolicy"
                && c.status == "False"
                && c.message != *msg
            {
                d.push(format!(
                    "{} message {:?}, want the hub's error {msg:?}",
                    c.type_, c.message
                ));
            }
        }
    }
    // docs/report.md: the missing policy's message says what to install.
    if let Some(c) = got
        .conditions
        .iter()
        .find(|c| c.type_ == "AdmissionPolicy" && c.status == "False")
        && !c.message.contains("kleym trust-config")
    {
        d.push(format!(
            "AdmissionPolicy message {:?} does not say what to install (kleym trust-config)",
            c.message
        ));
    }
    if got.bindings != want.bindings {
        d.push(format!(
            "bindings {:?}, want {:?}",
            got.bindings, want.bindings
        ));
    }
    if got.non_ready_bindings != want.non_ready {
        d.push(format!(
            "nonReadyBindings {:?}, want {:?}",
            got.non_ready_bindings, want.non_ready
        ));
    }
    if got.non_ready_bindings_truncated != want.truncated {
        d.push(format!(
            "nonReadyBindingsTruncated {}, want {}",
            got.non_ready_bindings_truncated, want.truncated
        ));
    }
    if got.duplicate_of != want.duplicate_of {
        d.push(format!(
            "duplicateOf {:?}, want {:?}",
            got.duplicate_of, want.duplicate_of
        ));
    }
    d
}

// ---- within-spoke verdicts, from the objects ----------------------------------------------

/// A binding's workload as its objects say: PerObjective, its container selector, its
/// service account (the literal `k8s:sa:` template; `None` when templated or absent), its
/// pool's labels (through its objective's `poolRef`; `None` when unresolved) and its
/// selector templates (sorted).
type Workload = (
    bool,
    Option<String>,
    Option<String>,
    Option<BTreeMap<String, String>>,
    Vec<String>,
);

fn workload(b: &InferenceIdentityBinding, objectives: &[Value], pools: &[Value]) -> Workload {
    let ns = b.metadata.namespace.clone().unwrap_or_default();
    let in_ns = |o: &&Value, name: &str| {
        o["metadata"]["namespace"].as_str() == Some(ns.as_str())
            && o["metadata"]["name"].as_str() == Some(name)
    };
    let pool_name = objectives
        .iter()
        .find(|o| in_ns(o, &b.spec.target_ref.name))
        .and_then(|o| o["spec"]["poolRef"]["name"].as_str());
    let labels = pool_name
        .and_then(|p| pools.iter().find(|o| in_ns(o, p)))
        .and_then(|p| p["spec"]["selector"]["matchLabels"].as_object())
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        });
    let mut templates = b.spec.workload_selector_templates.clone();
    templates.sort();
    let sa = templates
        .iter()
        .find_map(|t| t.strip_prefix("k8s:sa:"))
        .filter(|s| !s.contains("{{"))
        .map(str::to_string);
    let container = b
        .spec
        .container_discriminator
        .as_ref()
        .map(|d| format!("{:?}:{}", d.type_, d.value));
    (
        b.spec.mode == IdentityMode::PerObjective,
        container,
        sa,
        labels,
        templates,
    )
}

fn is_ready(b: &InferenceIdentityBinding) -> bool {
    read(b).ready
}

/// The spoke's collision verdicts (in the bindings' status) against the rule of the
/// specification, applied pair by pair to the spoke's objects: two bindings named as each
/// other's `IdentityCollision` peers are PerObjective and select the same pods (the same
/// pool labels), service account and container; two Ready PerObjective bindings never do;
/// two Ready bindings computing one SPIFFE ID render the same selectors. `objectives` and
/// `pools` are the spoke's objects as JSON (llm-d `InferenceObjective`, v1
/// `InferencePool`). Returns what is wrong, one line per pair.
pub fn collision_verdicts(
    bindings: &[InferenceIdentityBinding],
    objectives: &[Value],
    pools: &[Value],
) -> Vec<String> {
    let mut out = Vec::new();
    for a in bindings {
        for b in bindings {
            let (Some(an), Some(bn)) = (&a.metadata.name, &b.metadata.name) else {
                continue;
            };
            if an >= bn || a.metadata.namespace != b.metadata.namespace {
                continue;
            }
            let ns = a.metadata.namespace.clone().unwrap_or_default();
            let names = |x: &InferenceIdentityBinding, peer: &str| {
                x.status.as_ref().is_some_and(|s| {
                    s.conflict_peers
                        .iter()
                        .any(|p| p.name == peer && p.reason == "IdentityCollision")
                })
            };
            let (wa, wb) = (
                workload(a, objectives, pools),
                workload(b, objectives, pools),
            );
            // Comparable when both service accounts are literal and both pools resolve.
            let comparable = wa.2.is_some() && wb.2.is_some() && wa.3.is_some() && wb.3.is_some();
            let same_workload =
                comparable && wa.0 && wb.0 && wa.1 == wb.1 && wa.2 == wb.2 && wa.3 == wb.3;
            if (names(a, bn) || names(b, an)) && comparable && !same_workload {
                out.push(format!(
                    "{ns}/{an} and {ns}/{bn} are IdentityCollision peers but their objects differ: {wa:?} vs {wb:?}"
                ));
            }
            if is_ready(a) && is_ready(b) && same_workload && wa.4 == wb.4 {
                out.push(format!(
                    "{ns}/{an} and {ns}/{bn} are both Ready but select the same pods, service account and container: {wa:?}"
                ));
            }
            if is_ready(a) && is_ready(b) {
                let (ra, rb) = (read(a), read(b));
                let shared = ra.ids.iter().any(|id| rb.ids.contains(id));
                let sel = |x: &InferenceIdentityBinding| {
                    let mut s = x
                        .status
                        .as_ref()
                        .map(|s| s.rendered_selectors.clone())
                        .unwrap_or_default();
                    s.sort();
                    s
                };
                if shared && sel(a) != sel(b) {
                    out.push(format!(
                        "{ns}/{an} and {ns}/{bn} are both Ready with one SPIFFE ID {:?} and different selectors",
                        ra.ids
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The oracle stays independent: it names none of the code it checks.
    #[test]
    fn the_oracle_imports_nothing_it_checks() {
        let src = include_str!("report_oracle.rs");
        let code = src.split("#[cfg(test)]").next().unwrap_or(src);
        for forbidden in [
            "kleym_hub",
            "kleym_spoke",
            "crate::chaos",
            "crate::fixtures",
        ] {
            assert!(!code.contains(forbidden), "the oracle uses {forbidden}");
        }
    }

    fn binding(name: &str, status: serde_json::Value) -> InferenceIdentityBinding {
        serde_json::from_value(json!({
            "apiVersion": "kleym.io/v1alpha1",
            "kind": "InferenceIdentityBinding",
            "metadata": {"name": name, "namespace": "ns", "generation": 1},
            "spec": {"targetRef": {"name": "o"}, "mode": "PerObjective",
                "containerDiscriminator": {"type": "ContainerName", "value": "c"},
                "workloadSelectorTemplates": ["k8s:sa:s"]},
            "status": status,
        }))
        .unwrap()
    }

    fn spoke(cluster: &str, bindings: Vec<InferenceIdentityBinding>) -> SpokeInput {
        SpokeInput {
            cluster: cluster.into(),
            credentials: Aspect::Up,
            reachable: Aspect::Up,
            synced: Aspect::Up,
            error_message: None,
            duplicate_of: None,
            bindings,
            admission_policy: PolicyAspect::NotChecked,
        }
    }

    fn ready(id: &str, sa: &str) -> serde_json::Value {
        json!({"observedGeneration": 1,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled",
                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "computedSpiffeIDs": [{"mode": "PerObjective", "spiffeID": id}],
            "renderedSelectors": [format!("k8s:sa:{sa}"), "k8s:pod-label:app:v"]})
    }

    /// Planted: drift between two clusters, sameness elsewhere, a chain of conflict peers
    /// that is one finding, a refused binding counted by its condition, and the caps.
    #[test]
    fn planted_fleet() {
        let refused = json!({"observedGeneration": 1, "conditions": [
            {"type": "Ready", "status": "False", "reason": "TargetNotFound", "message": "m",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "InvalidRef", "status": "True", "reason": "TargetNotFound", "message": "m",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        let peer = |p: &str| {
            json!({"observedGeneration": 1, "conflictPeers": [
                {"name": p, "reason": "IdentityCollision"}]})
        };
        let fleet = vec![
            spoke(
                "f/a",
                vec![
                    binding("x", ready("spiffe://td/x", "one")),
                    binding("same", ready("spiffe://td/same", "s")),
                    binding("bad", refused),
                    binding("p1", peer("p2")),
                    binding("p3", peer("p2")),
                ],
            ),
            spoke(
                "f/b",
                vec![
                    binding("x", ready("spiffe://td/x", "two")),
                    binding("same", ready("spiffe://td/same", "s")),
                ],
            ),
        ];
        let r = expected_report(&fleet, &Limits::NONE);
        let kinds: Vec<_> = r
            .findings
            .iter()
            .map(|f| (f.kind, f.member_count))
            .collect();
        assert_eq!(
            kinds,
            [
                (FindingKind::IdentityCollision, 3),
                (FindingKind::CrossClusterDrift, 2)
            ]
        );
        assert_eq!(r.counts.clusters.total, 2);
        assert_eq!(r.counts.clusters.ready, 1);
        assert_eq!(r.counts.bindings, 7);
        let c = expected_cluster(&fleet[0], &Limits::NONE);
        assert_eq!((c.bindings.invalid_ref, c.bindings.other), (1, 2));
        let capped = expected_report(
            &fleet,
            &Limits {
                findings: 1,
                members: 2,
                ..Limits::DOCUMENTED
            },
        );
        assert!(capped.truncated);
        assert_eq!(capped.findings.len(), 1);
        assert_eq!(capped.findings[0].members.len(), 2);
        assert_eq!(capped.findings[0].member_count, 3);
    }

    /// Two Ready bindings on one pool, service account and container are a missed
    /// collision; peers whose service accounts differ are a wrong one; another container
    /// is neither.
    #[test]
    fn collision_verdicts_are_checked_against_the_objects() {
        let obj = |name: &str, sa: &str, container: &str, status: serde_json::Value| {
            let mut b: InferenceIdentityBinding = serde_json::from_value(json!({
                "apiVersion": "kleym.io/v1alpha1",
                "kind": "InferenceIdentityBinding",
                "metadata": {"name": name, "namespace": "ns", "generation": 1},
                "spec": {"targetRef": {"name": format!("o-{name}")}, "mode": "PerObjective",
                    "containerDiscriminator": {"type": "ContainerName", "value": container},
                    "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", format!("k8s:sa:{sa}")]},
            }))
            .unwrap();
            b.status = serde_json::from_value(status).unwrap();
            b
        };
        let objectives: Vec<Value> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| {
                json!({"metadata": {"namespace": "ns", "name": format!("o-{n}")},
                "spec": {"poolRef": {"name": "pool"}}})
            })
            .collect();
        let pools = vec![json!({"metadata": {"namespace": "ns", "name": "pool"},
            "spec": {"selector": {"matchLabels": {"app": "x"}}}})];
        let peer = |p: &str| {
            json!({"observedGeneration": 1, "conflictPeers": [
                {"name": p, "reason": "IdentityCollision"}]})
        };
        let fleet = vec![
            obj("a", "s", "c1", ready("spiffe://td/a", "s")),
            obj("b", "s", "c1", ready("spiffe://td/b", "s")),
            obj("c", "s", "c2", ready("spiffe://td/c", "s")),
            obj("d", "s", "c3", peer("e")),
            obj("e", "other", "c3", peer("d")),
        ];
        let wrong = collision_verdicts(&fleet, &objectives, &pools);
        assert_eq!(wrong.len(), 2, "{wrong:#?}");
        assert!(
            wrong[0].contains("ns/a and ns/b are both Ready"),
            "{wrong:#?}"
        );
        assert!(
            wrong[1].contains("ns/d and ns/e are IdentityCollision peers"),
            "{wrong:#?}"
        );
    }

    #[test]
    fn cut_keeps_the_longest_prefix_that_fits() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcdef", 5), "ab…");
        assert_eq!(cut("ééé", 5), "é…");
        assert!(cut(&"x".repeat(2000), 1024).len() <= 1024);
    }
}
