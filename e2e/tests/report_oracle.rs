//! The hub's fleet report against an independent oracle (`kleym_e2e::report_oracle`),
//! over random fleets.
//!
//! One generated description of a fleet (spokes with any health, duplicates, bindings with
//! any status a spoke or a tenant could write: ready, refused, pending, stale, conflict
//! peers, warnings, long messages) becomes binding objects. The product reads them the way
//! the hub does (`BindingSnapshot::of` into `SpokeObservation`s, then `FullReport::build`,
//! `bound_report` and `cluster_status`); the oracle reads the same objects its own way.
//! Both must agree on every count, finding, member, cap and condition. Names, IDs and
//! labels come from small pools so that collisions, shared IDs and drift are common; the
//! caps are small so that truncation happens. proptest shrinks a failing fleet to a small
//! one.

use std::collections::BTreeMap;

use chrono::Utc;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kleym_api::hub_status::{DuplicateOf, ErrorCategory, FindingKind};
use kleym_api::{
    ComputedSpiffeId, ConflictPeer, ContainerDiscriminator, DiscriminatorType, IdentityMode,
    IdentityWarning, InferenceIdentityBinding, InferenceIdentityBindingSpec,
    InferenceIdentityBindingStatus, TargetKind, TargetRef,
};
use kleym_e2e::report_oracle::{
    Aspect, Limits, PolicyAspect, SpokeInput, compare_cluster, compare_report, expected_cluster,
    expected_report,
};
use kleym_hub::fleet::AdmissionPolicyCheck;
use kleym_hub::report::{
    BindingSnapshot, Caps, FullReport, Health, SpokeObservation, bound_report, cluster_status,
    shared,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum StatusDesc {
    /// Never reconciled.
    Absent,
    Ready,
    /// Refused: condition index (Conflict, InvalidRef, UnsafeSelector, RenderFailure) and
    /// a reason of that condition.
    Refused(u8, u8),
    /// Not refused, not ready (an API error, or no reason at all).
    Pending(bool),
}

#[derive(Debug, Clone)]
struct BindingDesc {
    ns: u8,
    name: u8,
    per_objective: bool,
    image: bool,
    container: u8,
    ids: Vec<u8>,
    sa: Option<u8>,
    pool: BTreeMap<u8, u8>,
    status: StatusDesc,
    stale: bool,
    long_message: bool,
    peers: Vec<(u8, u8)>,
    warnings: Vec<(u8, u8)>,
}

#[derive(Debug, Clone)]
struct SpokeDesc {
    health: [u8; 3],
    category: u8,
    duplicate: bool,
    bindings: Vec<BindingDesc>,
}

fn status_desc() -> impl Strategy<Value = StatusDesc> {
    prop_oneof![
        1 => Just(StatusDesc::Absent),
        4 => Just(StatusDesc::Ready),
        4 => (0u8..4, 0u8..2).prop_map(|(c, r)| StatusDesc::Refused(c, r)),
        1 => any::<bool>().prop_map(StatusDesc::Pending),
    ]
}

fn binding_desc() -> impl Strategy<Value = BindingDesc> {
    (
        (0u8..2, 0u8..5, any::<bool>(), any::<bool>(), 0u8..2),
        (
            prop::collection::vec(0u8..3, 0..=2),
            prop::option::weighted(0.9, 0u8..2),
            prop::collection::btree_map(0u8..3, 0u8..2, 0..=2),
        ),
        (
            status_desc(),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
        ),
        (
            prop::collection::vec((0u8..6, 0u8..3), 0..=2),
            prop::collection::vec((0u8..5, 0u8..2), 0..=2),
        ),
    )
        .prop_map(
            |(
                (ns, name, per_objective, image, container),
                (ids, sa, pool),
                (status, stale, long_message),
                (peers, warnings),
            )| BindingDesc {
                ns,
                name,
                per_objective,
                image,
                container,
                ids,
                sa,
                pool,
                status,
                stale,
                long_message,
                peers,
                warnings,
            },
        )
}

fn spoke_desc() -> impl Strategy<Value = SpokeDesc> {
    (
        [0u8..5, 0u8..5, 0u8..5],
        0u8..10,
        prop::bool::weighted(0.1),
        prop::collection::vec(binding_desc(), 0..7),
    )
        .prop_map(|(health, category, duplicate, bindings)| SpokeDesc {
            health,
            category,
            duplicate,
            bindings,
        })
}

const CATEGORIES: [ErrorCategory; 10] = [
    ErrorCategory::Unreachable,
    ErrorCategory::Tls,
    ErrorCategory::Credentials,
    ErrorCategory::Unauthorized,
    ErrorCategory::Forbidden,
    ErrorCategory::CrdMissing,
    ErrorCategory::ServerError,
    ErrorCategory::SyncTimeout,
    ErrorCategory::ProfileRefused,
    ErrorCategory::Other,
];

/// Mostly up; sometimes not observed; sometimes failed.
fn aspect(h: u8, category: u8) -> Aspect {
    match h {
        0..=2 => Aspect::Up,
        3 => Aspect::Unknown,
        _ => Aspect::Down(CATEGORIES[category as usize % CATEGORIES.len()]),
    }
}

fn health(a: Aspect) -> Health {
    match a {
        Aspect::Up => Health::Ok,
        Aspect::Unknown => Health::Unknown,
        Aspect::Down(c) => Health::Failed(c),
    }
}

const CONDITIONS: [(&str, [&str; 2]); 4] = [
    ("Conflict", ["IdentityCollision", "DuplicateSPIFFEID"]),
    ("InvalidRef", ["TargetNotFound", "PoolNotFound"]),
    (
        "UnsafeSelector",
        ["EmptyPoolSelector", "SPIFFEIDOutsideNamespace"],
    ),
    ("RenderFailure", ["TemplateError", "ForeignObjectHoldsName"]),
];
const PEER_REASONS: [&str; 3] = ["IdentityCollision", "DuplicateSPIFFEID", "SomethingNewer"];
const WARNING_REASONS: [&str; 5] = [
    "PoolAndObjectiveIdentities",
    "OverlappingDefaultIdentity",
    "MaskedByForeignObject",
    "MultipleSVIDs",
    "SomethingNewer",
];

fn condition(type_: &str, status: &str, reason: &str, message: &str, generation: i64) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: Some(generation),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

/// The binding object a description stands for (typed: building and parsing JSON for
/// every binding of every case was most of the test's time).
fn object(d: &BindingDesc) -> InferenceIdentityBinding {
    let ns = format!("team-{}", d.ns);
    let generation = 3i64;
    let observed = if d.stale { 2 } else { 3 };
    let message = if d.long_message {
        // Multi-byte characters across the cut.
        "é".repeat(700)
    } else {
        format!("why {}", d.name)
    };
    // Ready's (status, reason, message), and the refusal's (condition, reason).
    type Ready<'a> = (&'a str, &'a str, String);
    let (ready, refused): (Ready, Option<(&str, &str)>) = match &d.status {
        StatusDesc::Absent | StatusDesc::Ready => (("True", "Reconciled", message.clone()), None),
        StatusDesc::Refused(c, r) => {
            let (ty, reasons) = CONDITIONS[*c as usize];
            let reason = reasons[*r as usize];
            (("False", reason, message.clone()), Some((ty, reason)))
        }
        StatusDesc::Pending(with_reason) => (
            (
                "False",
                if *with_reason { "ApplyFailed" } else { "" },
                if *with_reason {
                    message.clone()
                } else {
                    String::new()
                },
            ),
            None,
        ),
    };
    let mut conditions = vec![condition("Ready", ready.0, ready.1, &ready.2, observed)];
    for (ty, _) in CONDITIONS {
        conditions.push(match refused {
            Some((t, reason)) if t == ty => condition(ty, "True", reason, &message, observed),
            _ => condition(ty, "False", "Resolved", "", observed),
        });
    }
    let mut selectors = vec![format!("k8s:ns:{ns}")];
    if let Some(sa) = d.sa {
        selectors.push(format!("k8s:sa:sa-{sa}"));
    }
    for (k, v) in &d.pool {
        selectors.push(format!("k8s:pod-label:example.com/k{k}:v{v}"));
    }
    selectors.sort();
    let mode = if d.per_objective {
        IdentityMode::PerObjective
    } else {
        IdentityMode::PoolOnly
    };
    let spec = InferenceIdentityBindingSpec {
        target_ref: TargetRef {
            kind: TargetKind::default(),
            name: "o".into(),
        },
        spiffe_id_template: None,
        selector_source: Default::default(),
        workload_selector_templates: vec!["k8s:ns:{{ .Namespace }}".into()],
        mode,
        container_discriminator: d.per_objective.then(|| ContainerDiscriminator {
            type_: if d.image {
                DiscriminatorType::ContainerImage
            } else {
                DiscriminatorType::ContainerName
            },
            value: format!("c{}", d.container),
        }),
        svid: None,
    };
    let mut b = InferenceIdentityBinding::new(&format!("b{}", d.name), spec);
    b.metadata.namespace = Some(ns.clone());
    b.metadata.generation = Some(generation);
    if !matches!(d.status, StatusDesc::Absent) {
        b.status = Some(InferenceIdentityBindingStatus {
            observed_generation: Some(observed),
            conditions,
            computed_spiffe_ids: d
                .ids
                .iter()
                .map(|i| ComputedSpiffeId {
                    mode,
                    spiffe_id: format!("spiffe://td.example/ns/{ns}/id-{i}"),
                })
                .collect(),
            rendered_selectors: selectors,
            conflict_peers: d
                .peers
                .iter()
                .map(|(n, r)| ConflictPeer {
                    name: format!("b{n}"),
                    reason: PEER_REASONS[*r as usize].into(),
                })
                .collect(),
            warnings: d
                .warnings
                .iter()
                .map(|(r, m)| IdentityWarning {
                    reason: WARNING_REASONS[*r as usize].into(),
                    message: format!("warning {m}"),
                })
                .collect(),
            ..Default::default()
        });
    }
    b
}

/// The same fleet in both forms: the oracle's input and the hub's observations.
fn fleet(spokes: &[SpokeDesc]) -> (Vec<SpokeInput>, Vec<SpokeObservation>) {
    let mut inputs = Vec::new();
    let mut observations = Vec::new();
    for (i, s) in spokes.iter().enumerate() {
        let cluster = format!("fleet/spoke-{i}");
        // One binding per namespace and name, as in a cluster.
        let mut seen = BTreeMap::new();
        for b in &s.bindings {
            seen.entry((b.ns, b.name)).or_insert_with(|| object(b));
        }
        let objects: Vec<InferenceIdentityBinding> = seen.into_values().collect();
        let [c, r, y] = s.health.map(|h| aspect(h, s.category));
        let error_message = [c, r, y]
            .iter()
            .any(|a| matches!(a, Aspect::Down(_)))
            .then(|| format!("spoke {i} failed"));
        let duplicate_of = s.duplicate.then(|| DuplicateOf {
            cluster_profile: "fleet/spoke-0".into(),
            member_id: "member".into(),
        });
        // Every result of the admission policy check, spread over the spokes.
        let (check, policy) = match i % 5 {
            0 => (None, PolicyAspect::NotChecked),
            1 => (
                Some(AdmissionPolicyCheck::Installed {
                    policy: "kleym-hub-bounds".into(),
                }),
                PolicyAspect::Installed,
            ),
            2 => (Some(AdmissionPolicyCheck::Missing), PolicyAspect::Missing),
            3 => (
                Some(AdmissionPolicyCheck::Unknown { why: "404".into() }),
                PolicyAspect::Unknown,
            ),
            _ => (
                Some(AdmissionPolicyCheck::Installed {
                    policy: String::new(),
                }),
                PolicyAspect::Installed,
            ),
        };
        observations.push(SpokeObservation {
            cluster: cluster.clone(),
            admission_policy: check,
            credentials: health(c),
            reachable: health(r),
            synced: health(y),
            error_message: error_message.clone(),
            bindings: shared(objects.iter().map(BindingSnapshot::of)),
            duplicate_of: duplicate_of.clone(),
            ..SpokeObservation::default()
        });
        inputs.push(SpokeInput {
            cluster,
            credentials: c,
            reachable: r,
            synced: y,
            error_message,
            duplicate_of,
            bindings: objects,
            admission_policy: policy,
        });
    }
    (inputs, observations)
}

/// Small caps, so that random fleets hit them; long messages hit the documented 1 KiB.
const SMALL: Limits = Limits {
    findings: 3,
    members: 2,
    non_ready: 2,
    message_bytes: 1024,
};

fn caps(l: &Limits) -> Caps {
    Caps {
        findings: l.findings,
        members_per_finding: l.members,
        non_ready_bindings: l.non_ready,
        message_len: l.message_bytes,
    }
}

/// Every difference between the product and the oracle for one fleet.
fn differences(spokes: &[SpokeDesc]) -> Vec<String> {
    let (inputs, observations) = fleet(spokes);
    let now = Utc::now();
    let full = FullReport::build(&observations, now);
    let mut d: Vec<String> = compare_report(
        &full.summary,
        &expected_report(&inputs, &Limits::NONE),
        &Limits::NONE,
    )
    .into_iter()
    .map(|x| format!("full report: {x}"))
    .collect();
    let bounded = bound_report(&full.summary, &caps(&SMALL));
    d.extend(
        compare_report(&bounded, &expected_report(&inputs, &SMALL), &SMALL)
            .into_iter()
            .map(|x| format!("capped report: {x}")),
    );
    for (input, obs) in inputs.iter().zip(&observations) {
        let uncapped = full
            .spokes
            .iter()
            .find(|s| s.cluster == input.cluster)
            .map(|s| &s.status);
        match uncapped {
            None => d.push(format!("{}: missing from the full report", input.cluster)),
            Some(st) => d.extend(
                compare_cluster(st, &expected_cluster(input, &Limits::NONE))
                    .into_iter()
                    .map(|x| format!("{} (full): {x}", input.cluster)),
            ),
        }
        let capped = cluster_status(obs, now, Some(&caps(&SMALL)));
        d.extend(
            compare_cluster(&capped, &expected_cluster(input, &SMALL))
                .into_iter()
                .map(|x| format!("{} (capped): {x}", input.cluster)),
        );
    }
    d
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 3000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The hub's report equals the oracle's for any fleet.
    #[test]
    fn the_report_agrees_with_the_oracle(spokes in prop::collection::vec(spoke_desc(), 1..5)) {
        let d = differences(&spokes);
        prop_assert!(d.is_empty(), "{}", d.join("\n"));
    }
}

/// The random fleets reach what the property is about: without this, a generator that
/// never produced drift or a cap would pass the property trivially.
#[test]
fn the_generator_reaches_every_finding_and_cap() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config::default());
    let strategy = prop::collection::vec(spoke_desc(), 1..5);
    let mut kinds = std::collections::BTreeSet::new();
    let (mut truncated, mut non_ready_cut, mut unhealthy) = (false, false, false);
    for _ in 0..500 {
        let spokes = strategy.new_tree(&mut runner).unwrap().current();
        let (inputs, _) = fleet(&spokes);
        let all = expected_report(&inputs, &Limits::NONE);
        kinds.extend(all.findings.iter().map(|f| f.kind));
        let r = expected_report(&inputs, &SMALL);
        truncated |= r.truncated;
        unhealthy |= r.counts.clusters.unhealthy > 0;
        non_ready_cut |= inputs.iter().any(|s| expected_cluster(s, &SMALL).truncated);
    }
    assert_eq!(kinds.len(), FindingKind::ALL.len(), "{kinds:?}");
    assert!(truncated && non_ready_cut && unhealthy);
}
