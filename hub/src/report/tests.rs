//! Analysis over planted observations.

use chrono::{TimeZone, Utc};
use kleym_api::hub_status::{FindingKind, FindingMember, Severity, condition_types, reasons};
use kleym_api::{ConflictPeer, IdentityMode, IdentityWarning};

use super::*;

fn binding(ns: &str, name: &str, id: &str, sa: &str, container: Option<&str>) -> BindingSnapshot {
    BindingSnapshot {
        namespace: ns.into(),
        name: name.into(),
        mode: if container.is_some() {
            IdentityMode::PerObjective
        } else {
            IdentityMode::PoolOnly
        },
        spiffe_ids: vec![id.into()],
        service_account: Some(sa.into()),
        container_discriminator: container.map(|c| format!("k8s:container-name:{c}")),
        pool_selector: vec![("app".to_string(), "vllm".to_string())],
        ready: true,
        reason: Some("Ready".into()),
        ..Default::default()
    }
}

fn refused(mut b: BindingSnapshot, reason: &str, peers: &[&str]) -> BindingSnapshot {
    b.ready = false;
    b.reason = Some("Conflict".into());
    b.conflict_peers = peers
        .iter()
        .map(|p| ConflictPeer {
            name: p.to_string(),
            reason: reason.into(),
        })
        .collect();
    b
}

fn warned(mut b: BindingSnapshot, reason: &str, message: &str) -> BindingSnapshot {
    b.warnings.push(IdentityWarning {
        reason: reason.into(),
        message: message.into(),
    });
    b
}

fn spoke(cluster: &str, bindings: Vec<BindingSnapshot>) -> SpokeObservation {
    SpokeObservation {
        cluster: cluster.into(),
        trust_domain: Some("example.org".into()),
        credentials: Health::Ok,
        reachable: Health::Ok,
        synced: Health::Ok,
        bindings: shared(bindings),
        ..Default::default()
    }
}

fn m(cluster: &str, ns: &str, b: &str) -> FindingMember {
    FindingMember {
        cluster: cluster.into(),
        namespace: ns.into(),
        binding: b.into(),
    }
}

const TD: &str = "spiffe://example.org";

/// A fleet with one instance of every finding, plus a consistent same-ID pair.
fn planted() -> Vec<SpokeObservation> {
    let pool_msg =
        "PoolOnly binding(s) pool-id and PerObjective binding(s) chat select the same pods";
    let overlap_msg = "ClusterSPIFFEID default-id also selects the pods of InferencePool team-b/p";
    vec![
        spoke(
            "fleet/east",
            vec![
                // Within-spoke collision: same pods, SA and container.
                refused(
                    binding(
                        "team-a",
                        "chat",
                        &format!("{TD}/ns/team-a/objective/chat"),
                        "vllm",
                        Some("vllm"),
                    ),
                    "IdentityCollision",
                    &["summarize"],
                ),
                refused(
                    binding(
                        "team-a",
                        "summarize",
                        &format!("{TD}/ns/team-a/objective/summarize"),
                        "vllm",
                        Some("vllm"),
                    ),
                    "IdentityCollision",
                    &["chat"],
                ),
                // Duplicate ID: one ID, different selectors.
                refused(
                    binding(
                        "team-b",
                        "x",
                        &format!("{TD}/ns/team-b/shared"),
                        "sa-x",
                        Some("x"),
                    ),
                    "DuplicateSPIFFEID",
                    &["y"],
                ),
                refused(
                    binding(
                        "team-b",
                        "y",
                        &format!("{TD}/ns/team-b/shared"),
                        "sa-y",
                        Some("y"),
                    ),
                    "DuplicateSPIFFEID",
                    &["x"],
                ),
                // Overlapping default identity (warning, one binding).
                warned(
                    binding(
                        "team-b",
                        "z",
                        &format!("{TD}/ns/team-b/objective/z"),
                        "sa-z",
                        Some("z"),
                    ),
                    "OverlappingDefaultIdentity",
                    overlap_msg,
                ),
                // PoolOnly + PerObjective on one pool (warning, two bindings).
                warned(
                    binding(
                        "team-c",
                        "pool-id",
                        &format!("{TD}/ns/team-c/pool/p"),
                        "vllm",
                        None,
                    ),
                    "PoolAndObjectiveIdentities",
                    pool_msg,
                ),
                warned(
                    binding(
                        "team-c",
                        "chat",
                        &format!("{TD}/ns/team-c/objective/chat"),
                        "vllm",
                        Some("vllm"),
                    ),
                    "PoolAndObjectiveIdentities",
                    pool_msg,
                ),
                // Drift: same ID as in west, different service account.
                binding(
                    "team-d",
                    "drift",
                    &format!("{TD}/ns/team-d/objective/o"),
                    "sa-east",
                    Some("c"),
                ),
                // Namespace sameness: same ID and signature as in west.
                binding(
                    "team-e",
                    "same",
                    &format!("{TD}/ns/team-e/objective/o"),
                    "sa",
                    Some("c"),
                ),
            ],
        ),
        spoke(
            "fleet/west",
            vec![
                binding(
                    "team-d",
                    "drift",
                    &format!("{TD}/ns/team-d/objective/o"),
                    "sa-west",
                    Some("c"),
                ),
                binding(
                    "team-e",
                    "same",
                    &format!("{TD}/ns/team-e/objective/o"),
                    "sa",
                    Some("c"),
                ),
            ],
        ),
    ]
}

#[test]
fn planted_fleet_gives_exactly_the_expected_findings() {
    let findings = analyze(&planted());
    let summary: Vec<(FindingKind, Option<&str>, Vec<FindingMember>)> = findings
        .iter()
        .map(|f| (f.kind, f.spiffe_id.as_deref(), f.members.clone()))
        .collect();
    let drift_id = format!("{TD}/ns/team-d/objective/o");
    let dup_id = format!("{TD}/ns/team-b/shared");
    let z_id = format!("{TD}/ns/team-b/objective/z");
    assert_eq!(
        summary,
        vec![
            (
                FindingKind::IdentityCollision,
                None,
                vec![
                    m("fleet/east", "team-a", "chat"),
                    m("fleet/east", "team-a", "summarize")
                ]
            ),
            (
                FindingKind::DuplicateSpiffeId,
                Some(dup_id.as_str()),
                vec![
                    m("fleet/east", "team-b", "x"),
                    m("fleet/east", "team-b", "y")
                ]
            ),
            (
                FindingKind::CrossClusterDrift,
                Some(drift_id.as_str()),
                vec![
                    m("fleet/east", "team-d", "drift"),
                    m("fleet/west", "team-d", "drift")
                ]
            ),
            (
                FindingKind::PoolOnlyAndPerObjective,
                None,
                vec![
                    m("fleet/east", "team-c", "chat"),
                    m("fleet/east", "team-c", "pool-id")
                ]
            ),
            (
                FindingKind::OverlappingDefaultIdentity,
                Some(z_id.as_str()),
                vec![m("fleet/east", "team-b", "z")]
            ),
        ]
    );
    for f in &findings {
        assert_eq!(f.severity, f.kind.severity());
        assert_eq!(f.member_count, f.members.len() as i64);
    }
    let drift = &findings[2];
    assert!(
        drift.message.contains("sa-east") && drift.message.contains("sa-west"),
        "{}",
        drift.message
    );
    assert!(drift.message.contains("fleet/east") && drift.message.contains("fleet/west"));
    assert!(
        findings[0].message.contains("spec.containerDiscriminator"),
        "{}",
        findings[0].message
    );
    assert!(
        findings[1].message.contains("spec.spiffeIDTemplate"),
        "{}",
        findings[1].message
    );
    assert!(findings[3].message.contains(&"fleet/east".to_string()));
}

#[test]
fn findings_clear_when_fixed() {
    let mut fleet = planted();
    // Fix every problem the way the messages say.
    for s in &mut fleet {
        for b in std::sync::Arc::make_mut(&mut s.bindings)
            .iter_mut()
            .map(std::sync::Arc::make_mut)
        {
            b.conflict_peers.clear();
            b.warnings.clear();
            b.ready = true;
            if b.namespace == "team-d" {
                b.service_account = Some("sa".into());
            }
        }
    }
    assert_eq!(analyze(&fleet), vec![]);
    let report = FullReport::build(&fleet, Utc.timestamp_opt(1_700_000_000, 0).unwrap());
    assert_eq!(report.summary.finding_counts.total, 0);
    assert_eq!(report.summary.clusters.ready, 2);
}

#[test]
fn same_id_same_signature_in_many_clusters_is_not_a_finding() {
    let fleet: Vec<SpokeObservation> = (0..5)
        .map(|i| {
            spoke(
                &format!("fleet/c{i}"),
                vec![binding(
                    "ns",
                    "b",
                    &format!("{TD}/ns/ns/objective/o"),
                    "sa",
                    Some("c"),
                )],
            )
        })
        .collect();
    assert_eq!(analyze(&fleet), vec![]);
    // Different trust domains are different IDs: not drift either.
    let other = spoke(
        "fleet/other-td",
        vec![binding(
            "ns",
            "b",
            "spiffe://other.org/ns/ns/objective/o",
            "sa-2",
            Some("c"),
        )],
    );
    assert_eq!(analyze(&[fleet[0].clone(), other]), vec![]);
}

#[test]
fn analysis_is_independent_of_input_order() {
    let fleet = planted();
    let mut reversed: Vec<SpokeObservation> = fleet.iter().rev().cloned().collect();
    for s in &mut reversed {
        std::sync::Arc::make_mut(&mut s.bindings).reverse();
    }
    assert_eq!(analyze(&fleet), analyze(&reversed));
}

#[test]
fn collision_peers_beyond_the_spoke_cap_join_one_finding() {
    // A chain of peers (as a capped peer list can produce) is still one finding.
    let bindings = (0..4)
        .map(|i| {
            let peer = format!("b{}", (i + 1) % 4);
            refused(
                binding(
                    "n",
                    &format!("b{i}"),
                    &format!("{TD}/ns/n/objective/b{i}"),
                    "sa",
                    Some("c"),
                ),
                "IdentityCollision",
                &[peer.as_str()],
            )
        })
        .collect();
    let findings = analyze(&[spoke("fleet/a", bindings)]);
    assert_eq!(findings.len(), 1);
    assert_eq!(findings[0].member_count, 4);
}

#[test]
fn cluster_status_conditions_say_what_is_wrong() {
    let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    let mut s = spoke("fleet/a", vec![]);
    s.credentials = Health::Failed(ErrorCategory::Credentials);
    s.reachable = Health::Unknown;
    s.error_message = Some("plugin exited with status 1".into());
    let st = cluster_status(&s, now, None);
    let cond = |t: &str| st.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
    assert_eq!(cond(condition_types::CREDENTIALS_AVAILABLE).status, "False");
    assert_eq!(
        cond(condition_types::CREDENTIALS_AVAILABLE).reason,
        reasons::CREDENTIAL_PLUGIN_FAILED
    );
    assert_eq!(cond(condition_types::REACHABLE).status, "Unknown");
    let ready = cond(condition_types::READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "CredentialPluginFailed")
    );
    assert!(ready.message.contains("plugin exited"));

    let mut s = spoke("fleet/a", vec![]);
    s.credentials = Health::Unknown;
    s.error_message = Some("ControlPlaneHealthy is False".into());
    let st = cluster_status(&s, now, None);
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("Unknown", reasons::PENDING)
    );
    assert!(
        ready.message.contains("ControlPlaneHealthy is False"),
        "{}",
        ready.message
    );

    let mut s = spoke("fleet/a", vec![]);
    s.synced = Health::Failed(ErrorCategory::Forbidden);
    let st = cluster_status(&s, now, None);
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, reasons::FORBIDDEN);
    let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, condition_types::ALL);
}

#[test]
fn the_admission_policy_condition_warns_without_touching_ready() {
    use crate::report::input::AdmissionPolicyCheck;
    let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    let shown = |check: Option<AdmissionPolicyCheck>| {
        let mut s = spoke("fleet/a", vec![]);
        s.trust_domain = Some("prod.example".into());
        s.admission_policy = check;
        let st = cluster_status(&s, now, None);
        let get = |t: &str| st.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        (
            get(condition_types::ADMISSION_POLICY),
            get(condition_types::READY),
        )
    };
    let (missing, ready) = shown(Some(AdmissionPolicyCheck::Missing));
    assert_eq!(
        (missing.status.as_str(), missing.reason.as_str()),
        ("False", reasons::ADMISSION_POLICY_MISSING)
    );
    assert!(
        missing
            .message
            .contains("kleym trust-config --trust-domain prod.example"),
        "{}",
        missing.message
    );
    assert!(!missing.message.contains("  "), "{}", missing.message);
    assert_eq!(ready.status, "True", "a warning, not a failure: {ready:?}");
    let (installed, _) = shown(Some(AdmissionPolicyCheck::Installed {
        policy: "kleym-hub-bounds".into(),
    }));
    assert_eq!(
        (installed.status.as_str(), installed.reason.as_str()),
        ("True", reasons::ADMISSION_POLICY_INSTALLED)
    );
    assert!(installed.message.contains("kleym-hub-bounds"));
    let (unknown, _) = shown(Some(AdmissionPolicyCheck::Unknown {
        why: "the ClusterSPIFFEID CRD is not served (404)".into(),
    }));
    assert_eq!(
        (unknown.status.as_str(), unknown.reason.as_str()),
        ("Unknown", reasons::ADMISSION_POLICY_UNKNOWN)
    );
    assert!(unknown.message.contains("404"));
    let (pending, _) = shown(None);
    assert_eq!(
        (pending.status.as_str(), pending.reason.as_str()),
        ("Unknown", reasons::PENDING)
    );
}

#[test]
fn cluster_status_counts_and_caps_non_ready_bindings() {
    let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    let mut bindings: Vec<BindingSnapshot> = (0..7)
        .map(|i| {
            let mut b = binding(
                "n",
                &format!("b{i}"),
                &format!("{TD}/ns/n/o/{i}"),
                "sa",
                Some("c"),
            );
            b.ready = false;
            b.reason = Some("InvalidRef".into());
            b.message = Some("x".repeat(5000));
            b
        })
        .collect();
    bindings.push(binding(
        "n",
        "ok",
        &format!("{TD}/ns/n/o/ok"),
        "sa",
        Some("c"),
    ));
    let s = spoke("fleet/a", bindings);
    let caps = Caps {
        non_ready_bindings: 3,
        ..Caps::default()
    };
    let st = cluster_status(&s, now, Some(&caps));
    assert_eq!(
        (
            st.bindings.total,
            st.bindings.ready,
            st.bindings.not_ready,
            st.bindings.invalid_ref
        ),
        (8, 1, 7, 7)
    );
    assert_eq!(st.non_ready_bindings.len(), 3);
    assert!(st.non_ready_bindings_truncated);
    assert_eq!(st.non_ready_bindings[0].name, "b0");
    assert!(st.non_ready_bindings[0].message.len() <= caps.message_len);
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, reasons::BINDINGS_NOT_READY);
    let uncapped = cluster_status(&s, now, None);
    assert_eq!(uncapped.non_ready_bindings.len(), 7);
    assert!(!uncapped.non_ready_bindings_truncated);
}

/// `notReady` is split by the refusal behind the `Ready` reason the spoke writes, which is
/// the refusal's own reason (`TargetNotFound`, not `InvalidRef`). Before, only the two
/// conflict reasons were recognised and every other refusal counted as `other`; and a
/// binding not ready for another reason counted as a conflict when its status still listed
/// conflict peers.
#[test]
fn non_ready_bindings_are_counted_by_the_refusal_behind_their_reason() {
    let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    let not_ready = |name: &str, reason: &str, peers: &[&str]| {
        let mut b = refused(
            binding("n", name, &format!("{TD}/ns/n/o/{name}"), "sa", Some("c")),
            "IdentityCollision",
            peers,
        );
        b.reason = Some(reason.into());
        b
    };
    let s = spoke(
        "fleet/a",
        vec![
            not_ready("a", "TargetNotFound", &[]),
            not_ready("b", "PoolNotFound", &[]),
            not_ready("c", "EmptyPoolSelector", &[]),
            not_ready("d", "SPIFFEIDOutsideNamespace", &[]),
            not_ready("e", "TemplateError", &[]),
            not_ready("f", "ForeignObjectHoldsName", &[]),
            not_ready("g", "IdentityCollision", &["h"]),
            not_ready("h", "DuplicateSPIFFEID", &["g"]),
            not_ready("i", "InvalidRef", &[]),
            // Not a refusal, though the status still names a peer.
            not_ready("j", "ApplyFailed", &["g"]),
        ],
    );
    let c = cluster_status(&s, now, None).bindings;
    assert_eq!(
        (
            c.not_ready,
            c.invalid_ref,
            c.unsafe_selector,
            c.render_failure,
            c.conflict,
            c.other
        ),
        (10, 3, 2, 2, 2, 1),
        "{c:?}"
    );
}

#[test]
fn bounding_keeps_counts_and_marks_truncation() {
    let fleet = planted();
    let full = FullReport::build(&fleet, Utc.timestamp_opt(1_700_000_000, 0).unwrap());
    let caps = Caps {
        findings: 2,
        members_per_finding: 1,
        ..Caps::default()
    };
    let bounded = bound_report(&full.summary, &caps);
    assert_eq!(bounded.finding_counts, full.summary.finding_counts);
    assert_eq!(bounded.findings.len(), 2);
    assert!(bounded.findings_truncated);
    assert_eq!(bounded.findings[0].members.len(), 1);
    assert_eq!(bounded.findings[0].member_count, 2);
    let all = bound_report(&full.summary, &Caps::default());
    assert!(!all.findings_truncated);
    assert_eq!(all.findings, full.summary.findings);
    assert_eq!(full.summary.finding_counts.collisions, 3);
    assert_eq!(full.summary.finding_counts.warnings, 2);
    assert_eq!(full.summary.findings[0].severity, Severity::Collision);
}

#[test]
fn shorten_cuts_at_char_boundaries() {
    assert_eq!(bound::shorten("abc", 10), "abc");
    let s = bound::shorten(&"é".repeat(100), 11);
    assert!(s.len() <= 11 && s.ends_with('…'), "{s}");
}

#[test]
fn full_report_parses_as_the_crd_status() {
    let full = FullReport::build(&planted(), Utc.timestamp_opt(1_700_000_000, 0).unwrap());
    let json = serde_json::to_value(&full).unwrap();
    assert!(json["spokes"].is_array());
    let as_status: kleym_api::hub_status::FleetIdentityReportStatus =
        serde_json::from_value(json.clone()).unwrap();
    assert_eq!(as_status, full.summary);
    let back: FullReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, full);
}

#[test]
fn a_duplicate_profile_is_counted_once_and_never_drifts_with_itself() {
    use kleym_api::hub_status::DuplicateOf;
    let id = format!("{TD}/ns/team-d/objective/drift");
    let engaged = spoke(
        "fleet/east",
        vec![binding("team-d", "drift", &id, "vllm", Some("vllm"))],
    );
    // The duplicate still carries (stale) bindings that differ from the engaged profile's:
    // analysed as a cluster of its own they would be cross-cluster drift.
    let duplicate = SpokeObservation {
        duplicate_of: Some(DuplicateOf {
            cluster_profile: "fleet/east".into(),
            member_id: "east.example".into(),
        }),
        ..spoke(
            "inventory-capi/east",
            vec![binding("team-d", "drift", &id, "other-sa", Some("vllm"))],
        )
    };
    let now = Utc.timestamp_opt(1_000, 0).unwrap();
    let report = FullReport::build(&[engaged.clone(), duplicate.clone()], now);
    assert_eq!(report.summary.clusters.total, 1);
    assert_eq!(report.summary.clusters.duplicates, 1);
    assert_eq!(report.summary.clusters.ready, 1);
    assert_eq!(report.summary.bindings, 1);
    assert!(
        report.summary.findings.is_empty(),
        "{:?}",
        report.summary.findings
    );
    // Without the duplicate marking the same observations are drift: the test can fail.
    let unmarked = SpokeObservation {
        duplicate_of: None,
        ..duplicate.clone()
    };
    let drift = FullReport::build(&[engaged, unmarked], now);
    assert_eq!(drift.summary.finding_counts.cross_cluster_drift, 1);
    // The duplicate's own status says why it is not engaged, naming the chosen profile.
    let status = cluster_status(&duplicate, now, None);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition_types::READY)
        .unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, reasons::DUPLICATE);
    assert!(ready.message.contains("fleet/east"), "{}", ready.message);
    assert_eq!(
        status.duplicate_of.as_ref().map(|d| d.member_id.as_str()),
        Some("east.example")
    );
}

/// The findings made on SPIRE Controller Manager's entry rules (in the spoke) become fleet
/// findings: one per message, naming the objects, with every binding carrying it.
#[test]
fn masked_outputs_and_several_svids_are_findings_naming_the_objects() {
    let masked_msg = "ClusterSPIFFEID copy-of-chat (not managed by kleym, older than kleym's kleym-team-a-chat-1234) renders the same SPIRE entry";
    let multi_msg = "the workloads that binding(s) narrow select (InferencePool team-a/gpu) match the selectors of 2 kleym identities: narrow (spiffe://example.org/ns/team-a/objective/code), wide (spiffe://example.org/ns/team-a/pool/p)";
    let chat_id = format!("{TD}/ns/team-a/objective/chat");
    let spokes = vec![spoke(
        "fleet/east",
        vec![
            warned(
                binding("team-a", "chat", &chat_id, "vllm", Some("vllm")),
                "MaskedByForeignObject",
                masked_msg,
            ),
            warned(
                binding(
                    "team-a",
                    "narrow",
                    &format!("{TD}/ns/team-a/objective/code"),
                    "vllm",
                    Some("vllm"),
                ),
                "MultipleSVIDs",
                multi_msg,
            ),
            warned(
                binding(
                    "team-a",
                    "wide",
                    &format!("{TD}/ns/team-a/pool/p"),
                    "vllm",
                    None,
                ),
                "MultipleSVIDs",
                multi_msg,
            ),
        ],
    )];
    let findings = analyze(&spokes);
    let summary: Vec<(FindingKind, Severity, Option<&str>, Vec<FindingMember>)> = findings
        .iter()
        .map(|f| {
            (
                f.kind,
                f.severity,
                f.spiffe_id.as_deref(),
                f.members.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                FindingKind::MaskedByForeignObject,
                Severity::Warning,
                Some(chat_id.as_str()),
                vec![m("fleet/east", "team-a", "chat")]
            ),
            (
                FindingKind::MultipleSvids,
                Severity::Warning,
                // Two IDs: the finding is about both.
                None,
                vec![
                    m("fleet/east", "team-a", "narrow"),
                    m("fleet/east", "team-a", "wide")
                ]
            ),
        ]
    );
    assert!(
        findings[0].message.contains("copy-of-chat") && findings[0].message.contains("fleet/east")
    );
    assert!(findings[1].message.contains("narrow") && findings[1].message.contains("wide"));
    let mut counts = kleym_api::hub_status::FindingCounts::default();
    for f in &findings {
        counts.add(f.kind);
    }
    assert_eq!(
        (
            counts.masked_by_foreign_object,
            counts.multiple_svids,
            counts.warnings
        ),
        (1, 1, 2)
    );
}
