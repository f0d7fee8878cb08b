//! The published form: round trips, a planted fleet reported equally from both inputs,
//! splitting and the size bound, and refusal of objects not written whole by a hub.

use std::sync::Arc;

use chrono::{TimeZone, Utc};
use kleym_api::hub_status::{ClusterIdentityObservation, DuplicateOf};
use kleym_api::{ConflictPeer, ErrorCategory, IdentityMode, IdentityWarning};
use proptest::prelude::*;

use super::*;
use crate::report::input::AdmissionPolicyCheck;
use crate::report::{FullReport, Health, SpokeObservation, cluster_status, shared};

const NS: &str = "kleym-system";
const TD: &str = "fleet.example";

#[allow(clippy::too_many_arguments)]
fn binding(
    ns: &str,
    name: &str,
    id: &str,
    sa: &str,
    container: &str,
    ready: bool,
    reason: &str,
    peers: &[(&str, &str)],
    warnings: &[(&str, &str)],
) -> BindingSnapshot {
    BindingSnapshot {
        namespace: ns.into(),
        name: name.into(),
        mode: IdentityMode::PerObjective,
        spiffe_ids: vec![format!("spiffe://{TD}/ns/{ns}/{id}")],
        service_account: Some(sa.into()),
        container_discriminator: Some(format!("k8s:container-name:{container}")),
        pool_selector: vec![("app".into(), "vllm".into())],
        ready,
        reason: Some(reason.into()),
        message: Some(format!("{reason}: binding {name}")),
        conflict_peers: peers
            .iter()
            .map(|(n, r)| ConflictPeer {
                name: (*n).into(),
                reason: (*r).into(),
            })
            .collect(),
        warnings: warnings
            .iter()
            .map(|(r, m)| IdentityWarning {
                reason: (*r).into(),
                message: (*m).into(),
            })
            .collect(),
    }
}

fn spoke(name: &str, phase: &str, bindings: Vec<BindingSnapshot>) -> PublishedSpoke {
    PublishedSpoke {
        observation: SpokeObservation {
            cluster: format!("fleet/{name}"),
            trust_domain: Some(TD.into()),
            credentials: Health::Ok,
            reachable: Health::Ok,
            synced: Health::Ok,
            spoke_version: Some("v1.33.0".into()),
            last_sync: Some(Utc.timestamp_opt(1_800_000_000, 0).unwrap()),
            bindings: shared(bindings),
            ..Default::default()
        },
        phase: phase.into(),
        failures: 0,
    }
}

/// A fleet with every kind of finding and spoke: a collision, a duplicate SPIFFE ID, drift
/// across clusters, warnings, refused bindings, an unreachable spoke, a duplicate member.
pub(crate) fn planted_fleet() -> Vec<PublishedSpoke> {
    let east = spoke(
        "east",
        "Engaged",
        vec![
            binding(
                "llm",
                "b-1",
                "objective/obj-1",
                "vllm",
                "c-1",
                true,
                "Ready",
                &[],
                &[],
            ),
            binding(
                "llm",
                "collide-x",
                "objective/obj-3",
                "vllm",
                "shared",
                false,
                "IdentityCollision",
                &[("collide-y", "IdentityCollision")],
                &[],
            ),
            binding(
                "llm",
                "collide-y",
                "objective/obj-4",
                "vllm",
                "shared",
                false,
                "IdentityCollision",
                &[("collide-x", "IdentityCollision")],
                &[],
            ),
            binding(
                "llm",
                "missing",
                "objective/none",
                "vllm",
                "c-9",
                false,
                "TargetNotFound",
                &[],
                &[],
            ),
        ],
    );
    let west = spoke(
        "west",
        "Engaged",
        vec![
            binding(
                "llm",
                "b-1",
                "objective/obj-1",
                "vllm",
                "c-1",
                true,
                "Ready",
                &[],
                &[],
            ),
            binding(
                "llm",
                "dup-x",
                "shared",
                "vllm",
                "dx",
                false,
                "DuplicateSPIFFEID",
                &[("dup-y", "DuplicateSPIFFEID")],
                &[],
            ),
            binding(
                "llm",
                "dup-y",
                "shared",
                "vllm",
                "dy",
                false,
                "DuplicateSPIFFEID",
                &[("dup-x", "DuplicateSPIFFEID")],
                &[],
            ),
            binding(
                "llm",
                "unsafe",
                "objective/obj-8",
                "vllm",
                "c-8",
                false,
                "EmptyPoolSelector",
                &[],
                &[],
            ),
        ],
    );
    // Drift: b-1 on another container than in east and west; and a warning.
    let south = spoke(
        "south",
        "Engaged",
        vec![binding(
            "llm",
            "b-1",
            "objective/obj-1",
            "vllm",
            "c-other",
            true,
            "Ready",
            &[],
            &[(
                "OverlappingDefaultIdentity",
                "ClusterSPIFFEID default-id selects these pods; set fallback: true on it",
            )],
        )],
    );
    let mut down = spoke("down", "BackingOff", vec![]);
    down.observation.reachable = Health::Failed(ErrorCategory::Unreachable);
    down.observation.synced = Health::Unknown;
    down.observation.error_message = Some("dial tcp 10.0.0.1:443: connection refused".into());
    down.observation.consecutive_failures = 3;
    down.observation.next_retry = Some(Utc.timestamp_opt(1_800_000_030, 0).unwrap());
    down.failures = 3;
    let mut twin = spoke("east-twin", "Duplicate", vec![]);
    twin.observation.credentials = Health::Unknown;
    twin.observation.reachable = Health::Unknown;
    twin.observation.synced = Health::Unknown;
    twin.observation.duplicate_of = Some(DuplicateOf {
        cluster_profile: "fleet/east".into(),
        member_id: "member-east".into(),
    });
    let mut refused = spoke("refused", "Refused", vec![]);
    refused.observation.credentials = Health::Failed(ErrorCategory::ProfileRefused);
    refused.observation.error_message = Some("no access provider matches".into());
    vec![east, west, south, down, twin, refused]
}

/// The objects a publisher would write for `spokes`, as the API server would hand them back.
pub(crate) fn objects_of(
    spokes: &[PublishedSpoke],
    limits: &Limits,
) -> Vec<Arc<ClusterIdentityObservation>> {
    let mut out = Vec::new();
    for s in spokes {
        for spec in encode(s, limits) {
            let mut o =
                ClusterIdentityObservation::new(&object_name(&spec.cluster, spec.part), spec);
            o.metadata.namespace = Some(NS.into());
            out.push(Arc::new(o));
        }
    }
    out
}

fn published(spokes: &[PublishedSpoke], limits: &Limits) -> Vec<PublishedSpoke> {
    let objs = objects_of(spokes, limits);
    merge(spokes.to_vec(), &assemble(&objs, limits))
}

fn observations(spokes: &[PublishedSpoke]) -> Vec<SpokeObservation> {
    spokes.iter().map(|s| s.observation.clone()).collect()
}

/// The report and every spoke's status (as `/v1/report` and `/v1/clusters` show them) are
/// the same whether built from the replica's own state or from the published objects.
#[test]
fn a_planted_fleet_reports_the_same_from_published_observations() {
    let local = planted_fleet();
    let now = Utc.timestamp_opt(1_800_000_100, 0).unwrap();
    let limits = Limits::default();
    let from_objects = published(&local, &limits);
    let want = FullReport::build(&observations(&local), now);
    let got = FullReport::build(&observations(&from_objects), now);
    assert_eq!(got, want);
    // The fleet is what it was planted to be: the comparison is not between empty reports.
    let kinds: Vec<_> = want.summary.findings.iter().map(|f| f.kind).collect();
    assert_eq!(want.summary.finding_counts.collisions, 3, "{kinds:?}");
    assert_eq!(want.summary.clusters.duplicates, 1);
    assert_eq!(want.summary.clusters.unhealthy, 2);
    for (l, p) in local.iter().zip(&from_objects) {
        assert_eq!(
            (p.phase.as_str(), p.failures),
            (l.phase.as_str(), l.failures)
        );
        assert_eq!(
            cluster_status(&p.observation, now, None),
            cluster_status(&l.observation, now, None)
        );
    }
}

/// The same with every spoke split into many small parts.
#[test]
fn a_split_observation_reports_the_same() {
    let local = planted_fleet();
    let limits = Limits {
        part_bytes: 1200,
        max_parts: 16,
    };
    let objs = objects_of(&local, &limits);
    let east_parts = objs
        .iter()
        .filter(|o| o.spec.cluster == "fleet/east")
        .count();
    assert!(east_parts >= 2, "east in {east_parts} parts");
    let now = Utc::now();
    let from_objects = merge(local.clone(), &assemble(&objs, &limits));
    assert_eq!(
        FullReport::build(&observations(&from_objects), now),
        FullReport::build(&observations(&local), now)
    );
    // A missing part makes the spoke incomplete, never shorter.
    let without: Vec<_> = objs
        .iter()
        .filter(|o| !(o.spec.cluster == "fleet/east" && o.spec.part == 1))
        .cloned()
        .collect();
    let result = assemble(&without, &limits);
    match &result["fleet/east"] {
        Err(ObservationError::Incomplete { why, .. }) => assert!(why.contains("part 1"), "{why}"),
        other => panic!("{other:?}"),
    }
}

/// Over the size bound, a spoke is published without bindings, and the report says so on
/// the spoke's `Synced` condition.
#[test]
fn an_observation_over_the_size_bound_is_marked_in_the_report() {
    let local = planted_fleet();
    let limits = Limits {
        part_bytes: 1200,
        max_parts: 1,
    };
    let specs = encode(&local[0], &limits);
    assert_eq!(specs.len(), 1);
    assert!(specs[0].bindings.is_empty());
    let from_objects = published(&local[..1], &limits);
    let east = &from_objects[0].observation;
    assert_eq!(east.synced, Health::Failed(ErrorCategory::Other));
    let status = cluster_status(east, Utc::now(), None);
    let synced = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Synced")
        .unwrap();
    assert_eq!(synced.status, "False");
    assert!(synced.message.starts_with(INCOMPLETE_PREFIX), "{synced:?}");
    assert!(synced.message.contains("4 bindings"), "{synced:?}");
}

/// What a hub-namespace writer could do to an object: each is refused with the object and
/// field named, and the report shows the spoke's observation as refused instead of crashing
/// or using it.
#[test]
fn tampered_observations_are_refused_with_the_object_and_field_named() {
    let local = planted_fleet();
    let limits = Limits::default();
    let objs = objects_of(&local, &limits);
    let east = objs
        .iter()
        .find(|o| o.spec.cluster == "fleet/east")
        .unwrap();
    let edit = |f: &dyn Fn(&mut ClusterIdentityObservation)| {
        let mut o = (**east).clone();
        f(&mut o);
        let mut all: Vec<_> = objs
            .iter()
            .filter(|x| x.spec.cluster != "fleet/east")
            .cloned()
            .collect();
        all.push(Arc::new(o));
        all
    };
    let cases: Vec<(&str, Vec<Arc<ClusterIdentityObservation>>, &str)> = vec![
        (
            "a collision hidden",
            edit(&|o| o.spec.bindings.retain(|b| !b.name.starts_with("collide"))),
            "does not match spec.digest",
        ),
        (
            "another cluster's name",
            edit(&|o| o.metadata.name = Some("fleet.west".into())),
            "metadata.name",
        ),
        (
            "a health value the hub never writes",
            edit(&|o| {
                if let Some(h) = o.spec.health.as_mut() {
                    h.reachable = "Fine".into();
                }
            }),
            "spec.health.reachable",
        ),
        (
            "an impossible part count",
            edit(&|o| o.spec.parts = 1000),
            "spec.parts",
        ),
        (
            "a garbled cluster",
            edit(&|o| o.spec.cluster = "no-slash".into()),
            "",
        ),
    ];
    for (what, objects, field) in cases {
        let map = assemble(&objects, &limits);
        let merged = merge(local.clone(), &map);
        let east = merged
            .iter()
            .find(|s| s.observation.cluster == "fleet/east")
            .unwrap();
        if field.is_empty() {
            // Not a known spoke: left out, the spoke shows as this replica sees it.
            assert_eq!(east, &local[0], "{what}");
            assert!(map.contains_key("no-slash"), "{what}");
            assert!(map["no-slash"].is_err(), "{what}");
            continue;
        }
        let msg = east.observation.error_message.clone().unwrap_or_default();
        assert!(
            msg.contains("ClusterIdentityObservation kleym-system/") && msg.contains(field),
            "{what}: {msg}"
        );
        assert!(east.observation.bindings.is_empty(), "{what}");
        assert_eq!(
            east.observation.synced,
            Health::Failed(ErrorCategory::Other),
            "{what}"
        );
        // The report is built, with the spoke unhealthy rather than silently different.
        let report = FullReport::build(&observations(&merged), Utc::now());
        assert_eq!(report.summary.clusters.unhealthy, 3, "{what}");
    }
}

#[test]
fn object_names_are_valid_and_distinct() {
    let long = format!("fleet/{}", "a".repeat(250));
    let names = [
        object_name("fleet/east", 0),
        object_name("fleet/east", 1),
        object_name("fleet/east.1", 0),
        object_name(&long, 0),
        object_name(&long, 2),
    ];
    for n in &names {
        assert!(n.len() <= 253, "{n}");
        assert!(
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-'),
            "{n}"
        );
    }
    let distinct: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    assert_eq!(names[0], "fleet.east");
}

fn health() -> impl Strategy<Value = Health> {
    prop_oneof![
        Just(Health::Unknown),
        Just(Health::Ok),
        proptest::sample::select(CATEGORIES.to_vec()).prop_map(Health::Failed),
    ]
}

fn text() -> impl Strategy<Value = String> {
    "[a-z0-9:/._ -]{0,24}"
}

fn snapshot() -> impl Strategy<Value = BindingSnapshot> {
    (
        ("[a-z]{1,8}", "[a-z0-9-]{1,12}"),
        proptest::collection::vec(text(), 0..3),
        (
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::collection::btree_map("[a-z/.]{1,10}", text(), 0..3),
        ),
        (
            any::<bool>(),
            proptest::option::of(text()),
            proptest::option::of(text()),
        ),
        proptest::collection::vec(("[a-z-]{1,8}", text()), 0..3),
        proptest::collection::vec((text(), text()), 0..2),
        any::<bool>(),
    )
        .prop_map(
            |(
                (namespace, name),
                ids,
                (sa, cd, pool),
                (ready, reason, message),
                peers,
                warns,
                pool_only,
            )| {
                BindingSnapshot {
                    namespace,
                    name,
                    mode: if pool_only {
                        IdentityMode::PoolOnly
                    } else {
                        IdentityMode::PerObjective
                    },
                    spiffe_ids: ids,
                    service_account: sa,
                    container_discriminator: cd,
                    pool_selector: pool.into_iter().collect(),
                    ready,
                    reason,
                    message,
                    conflict_peers: peers
                        .into_iter()
                        .map(|(name, reason)| ConflictPeer { name, reason })
                        .collect(),
                    warnings: warns
                        .into_iter()
                        .map(|(reason, message)| IdentityWarning { reason, message })
                        .collect(),
                }
            },
        )
}

fn published_spoke() -> impl Strategy<Value = PublishedSpoke> {
    (
        ("[a-z]{1,8}", "[a-z0-9.-]{1,20}"),
        (health(), health(), health()),
        (
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of(text()),
        ),
        (0u32..5, 0u32..5, "[A-Za-z]{0,10}"),
        (
            proptest::option::of(0i64..4_000_000_000),
            proptest::option::of(0i64..4_000_000_000),
        ),
        proptest::collection::vec(snapshot(), 0..6),
        proptest::option::of(("[a-z/]{1,10}", text())),
        proptest::option::of((0u8..3, text())),
    )
        .prop_map(
            |(
                (ns, name),
                (c, r, s),
                (td, err, version),
                (cf, failures, phase),
                (retry, sync),
                bindings,
                dup,
                policy,
            )| {
                let at = |t: i64| Utc.timestamp_opt(t, 0).unwrap();
                PublishedSpoke {
                    observation: SpokeObservation {
                        cluster: format!("{ns}/{name}"),
                        trust_domain: td,
                        credentials: c,
                        reachable: r,
                        synced: s,
                        error_message: err,
                        consecutive_failures: cf,
                        next_retry: retry.map(at),
                        spoke_version: version,
                        last_sync: sync.map(at),
                        bindings: shared(bindings),
                        duplicate_of: dup.map(|(cluster_profile, member_id)| DuplicateOf {
                            cluster_profile,
                            member_id,
                        }),
                        admission_policy: policy.map(|(k, t)| match k {
                            0 => AdmissionPolicyCheck::Installed { policy: t },
                            1 => AdmissionPolicyCheck::Missing,
                            _ => AdmissionPolicyCheck::Unknown { why: t },
                        }),
                    },
                    phase,
                    failures,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// serialise → parse → the same spoke (times at the API's second precision), whole or
    /// split into parts.
    #[test]
    fn the_published_form_round_trips(spoke in published_spoke(), part_bytes in 2000usize..6000) {
        for limits in [Limits::default(), Limits { part_bytes, max_parts: 64 }] {
            let objs = objects_of(std::slice::from_ref(&spoke), &limits);
            // Through JSON, as the API server stores them.
            let parsed: Vec<Arc<ClusterIdentityObservation>> = objs
                .iter()
                .map(|o| Arc::new(serde_json::from_slice(&serde_json::to_vec(&**o).unwrap()).unwrap()))
                .collect();
            let map = assemble(&parsed, &limits);
            let got = map[&spoke.observation.cluster].as_ref().map_err(|e| e.to_string());
            // What is published of a ready binding leaves its reason and message out.
            let mut want = spoke.clone();
            want.observation.bindings = shared(spoke.observation.bindings.iter().map(|b| {
                let mut b = (**b).clone();
                if b.ready {
                    b.reason = None;
                    b.message = None;
                }
                b
            }));
            prop_assert_eq!(got.ok(), Some(&want));
        }
    }
}
