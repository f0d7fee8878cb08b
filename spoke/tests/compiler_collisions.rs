//! analyze(): IdentityCollision, DuplicateSPIFFEID, warnings, and the condition set.

mod compiler_common;

use std::collections::BTreeMap;

use compiler_common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, LabelSelectorRequirement, ManagedFieldsEntry, Time,
};
use kleym_api::conditions as types;
use kleym_api::external::spiffeid::LabelSelector;
use kleym_api::label_map::LabelMap;
use kleym_spoke::compiler::collisions::{WarningReason, selector_provably_matches};
use kleym_spoke::compiler::conditions::{ConditionOutcome, build_conditions};
use kleym_spoke::compiler::{
    Analysis, BindingRef, CompiledIdentity, ForeignSpiffeId, Lookup, NamespaceLabels,
    OutputPrecedence, Reason, analyze, analyze_observed,
};
use kleym_spoke::explain::Precedence;
use kleym_spoke::ownership::{OWNER_ANNOTATION, Owner};

fn bref(name: &str) -> BindingRef {
    BindingRef {
        namespace: NS.into(),
        name: name.into(),
    }
}

fn run(ids: &[CompiledIdentity]) -> Analysis {
    analyze(ids, &[], &NamespaceLabels::new())
}

fn reasons(a: &Analysis, name: &str) -> Vec<Reason> {
    a.verdict(&bref(name))
        .conflicts
        .iter()
        .map(|c| c.reason)
        .collect()
}

fn peers(a: &Analysis, name: &str) -> Vec<String> {
    a.verdict(&bref(name))
        .conflicts
        .iter()
        .flat_map(|c| c.peers.iter().map(|p| p.name.clone()))
        .collect()
}

#[test]
fn identity_collision_is_refused_on_all_members() {
    let ids = [
        ok(&binding("a", "chat", "vllm")),
        ok(&binding("b", "code", "vllm")),
        ok(&binding("c", "sum", "vllm")),
        ok(&binding("d", "other", "tgi")),
    ];
    let a = run(&ids);
    for (me, others) in [("a", ["b", "c"]), ("b", ["a", "c"]), ("c", ["a", "b"])] {
        assert_eq!(reasons(&a, me), [Reason::IdentityCollision], "{me}");
        assert_eq!(peers(&a, me), others, "{me}");
        let r = a.refusal(&bref(me)).unwrap();
        assert_eq!(r.reason, Reason::IdentityCollision);
        assert!(
            r.message.contains(&format!("team-a/{}", others[0])),
            "{}",
            r.message
        );
        assert!(
            r.message.contains("k8s:container-name:vllm"),
            "{}",
            r.message
        );
    }
    assert!(
        a.refusal(&bref("d")).is_none(),
        "another container does not collide"
    );
    assert_eq!(a.verdict(&bref("a")).conflict_peers().len(), 2);
}

#[test]
fn collision_needs_same_pods_service_account_and_container() {
    // Different service account.
    let mut b = binding("b", "code", "vllm");
    b.spec.workload_selector_templates[1] = "k8s:sa:other".into();
    assert!(
        run(&[ok(&binding("a", "chat", "vllm")), ok(&b)])
            .verdicts
            .is_empty()
    );
    // Different pool labels.
    let mut b = binding("b", "code", "vllm");
    b.pool = Lookup::Found(pool(NS, "pool", &[("app", "other")]));
    assert!(
        run(&[ok(&binding("a", "chat", "vllm")), ok(&b)])
            .verdicts
            .is_empty()
    );
    // Different namespace (everything else equal but the namespace).
    let mut b = binding("b", "code", "vllm");
    b.namespace = "team-b".into();
    b.target = Lookup::Found(objective("team-b", "code", "pool"));
    b.pool = Lookup::Found(pool("team-b", "pool", &[("app", "model")]));
    assert!(
        run(&[ok(&binding("a", "chat", "vllm")), ok(&b)])
            .verdicts
            .is_empty()
    );
    // Two pools with equal selectors are the same pod set: collision.
    let mut b = binding("b", "code", "vllm");
    b.target = Lookup::Found(objective(NS, "code", "pool-2"));
    b.pool = Lookup::Found(pool(NS, "pool-2", &[("app", "model")]));
    let a = run(&[ok(&binding("a", "chat", "vllm")), ok(&b)]);
    assert_eq!(reasons(&a, "a"), [Reason::IdentityCollision]);
    assert_eq!(reasons(&a, "b"), [Reason::IdentityCollision]);
}

#[test]
fn pool_only_twins_do_not_conflict() {
    // Same pool, same ID, same selectors: SPIRE de-duplicates identical entries.
    let a = run(&[ok(&pool_only("p1", "chat")), ok(&pool_only("p2", "code"))]);
    assert!(a.verdicts.is_empty(), "{a:?}");
}

#[test]
fn duplicate_spiffe_id_with_different_selectors() {
    let id = "spiffe://example.org/ns/team-a/shared";
    let mut x = binding("x", "chat", "vllm");
    x.spec.spiffe_id_template = Some(id.into());
    let mut y = binding("y", "code", "tgi");
    y.spec.spiffe_id_template = Some(id.into());
    let mut z = binding("z", "sum", "tgi");
    z.spec.workload_selector_templates[1] = "k8s:sa:other".into();
    z.spec.spiffe_id_template = Some(id.into());
    let a = run(&[ok(&x), ok(&y), ok(&z)]);
    for me in ["x", "y", "z"] {
        assert_eq!(reasons(&a, me), [Reason::DuplicateSPIFFEID], "{me}");
    }
    assert_eq!(peers(&a, "x"), ["y", "z"]);
    assert_eq!(peers(&a, "y"), ["x", "z"]);
    let r = a.refusal(&bref("y")).unwrap();
    assert!(
        r.message.contains(id) && r.message.contains("team-a/x"),
        "{}",
        r.message
    );

    // Same ID, same selectors (two PerObjective bindings on one objective and container):
    // an IdentityCollision, not a duplicate.
    let mut p = binding("p", "chat", "vllm");
    p.spec.spiffe_id_template = Some(id.into());
    let mut q = binding("q", "chat", "vllm");
    q.spec.spiffe_id_template = Some(id.into());
    let a = run(&[ok(&p), ok(&q)]);
    assert_eq!(reasons(&a, "p"), [Reason::IdentityCollision]);
}

#[test]
fn collision_outranks_duplicate() {
    let id = "spiffe://example.org/ns/team-a/shared";
    let mut a1 = binding("a1", "chat", "vllm");
    a1.spec.spiffe_id_template = Some(id.into());
    let a2 = binding("a2", "code", "vllm");
    let mut d = pool_only("d", "chat");
    d.spec.spiffe_id_template = Some(id.into());
    let a = run(&[ok(&a1), ok(&a2), ok(&d)]);
    assert_eq!(
        reasons(&a, "a1"),
        [Reason::IdentityCollision, Reason::DuplicateSPIFFEID]
    );
    assert_eq!(
        a.refusal(&bref("a1")).unwrap().reason,
        Reason::IdentityCollision
    );
    assert_eq!(
        a.refusal(&bref("d")).unwrap().reason,
        Reason::DuplicateSPIFFEID
    );
}

#[test]
fn pool_only_and_per_objective_on_one_pool_warn_both() {
    let a = run(&[
        ok(&pool_only("pool-id", "chat")),
        ok(&binding("chat-id", "chat", "vllm")),
    ]);
    for me in ["pool-id", "chat-id"] {
        let v = a.verdict(&bref(me));
        assert!(v.conflicts.is_empty());
        assert_eq!(v.warnings.len(), 1, "{me}");
        assert_eq!(
            v.warnings[0].reason,
            WarningReason::PoolAndObjectiveIdentities
        );
        assert!(
            v.warnings[0].message.contains("pool-id") && v.warnings[0].message.contains("chat-id")
        );
        assert_eq!(v.status_warnings()[0].reason, "PoolAndObjectiveIdentities");
        assert!(a.refusal(&bref(me)).is_none(), "warnings do not refuse");
    }
    // Another service account: the pods differ, no warning.
    let mut other = pool_only("pool-id", "chat");
    other.spec.workload_selector_templates[1] = "k8s:sa:other".into();
    assert!(
        run(&[ok(&other), ok(&binding("chat-id", "chat", "vllm"))])
            .verdicts
            .is_empty()
    );
}

fn default_identity() -> ForeignSpiffeId {
    // The shape of SPIRE's usual "default" ClusterSPIFFEID.
    ForeignSpiffeId {
        name: "spire-default".into(),
        class_name: None,
        fallback: false,
        namespace_selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "kubernetes.io/metadata.name".into(),
                operator: "NotIn".into(),
                values: Some(vec!["kube-system".into(), "spire-system".into()]),
            }]),
            match_labels: None,
        }),
        pod_selector: None,
        workload_selector_templates: vec![],
        spiffe_id_template: "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}".into(),
        ..ForeignSpiffeId::default()
    }
}

fn overlap(foreign: ForeignSpiffeId, ns_labels: &[(&str, &str)]) -> bool {
    let ids = [ok(&binding("chat-id", "chat", "vllm"))];
    let mut namespaces = NamespaceLabels::new();
    if !ns_labels.is_empty() {
        namespaces.insert(NS.into(), labels(ns_labels));
    }
    let a = analyze(&ids, &[foreign], &namespaces);
    let v = a.verdict(&bref("chat-id"));
    assert!(v.conflicts.is_empty());
    match v.warnings.as_slice() {
        [] => false,
        [w] => {
            assert_eq!(w.reason, WarningReason::OverlappingDefaultIdentity);
            assert!(w.message.contains("fallback: true") && w.message.contains("spire-default"));
            true
        }
        more => panic!("{more:?}"),
    }
}

#[test]
fn overlapping_default_identity_warning() {
    assert!(overlap(default_identity(), &[]));
    // fallback: true is the fix.
    assert!(!overlap(
        ForeignSpiffeId {
            fallback: true,
            ..default_identity()
        },
        &[]
    ));
    // Another SPIRE Controller Manager class does not handle our pods' entries alongside.
    assert!(!overlap(
        ForeignSpiffeId {
            class_name: Some("other".into()),
            ..default_identity()
        },
        &[]
    ));
    // Excluding our namespace.
    let mut f = default_identity();
    f.namespace_selector
        .as_mut()
        .unwrap()
        .match_expressions
        .as_mut()
        .unwrap()[0]
        .values = Some(vec![NS.into()]);
    assert!(!overlap(f, &[]));
    // Pod selectors: provable only from the pool's labels.
    let sel = |pairs: &[(&str, &str)]| LabelSelector {
        match_labels: Some(labels(pairs).into()),
        match_expressions: None,
    };
    assert!(overlap(
        ForeignSpiffeId {
            pod_selector: Some(sel(&[("app", "model")])),
            ..default_identity()
        },
        &[]
    ));
    assert!(!overlap(
        ForeignSpiffeId {
            pod_selector: Some(sel(&[("app", "x")])),
            ..default_identity()
        },
        &[]
    ));
    assert!(!overlap(
        ForeignSpiffeId {
            pod_selector: Some(sel(&[("tier", "x")])),
            ..default_identity()
        },
        &[]
    ));
    // Namespace label selectors need the namespace's labels.
    let by_env = ForeignSpiffeId {
        namespace_selector: Some(sel(&[("env", "prod")])),
        ..default_identity()
    };
    assert!(overlap(by_env.clone(), &[("env", "prod")]));
    assert!(!overlap(by_env.clone(), &[("env", "dev")]));
    assert!(!overlap(by_env, &[]));
    // Workload selectors: ours literally, or pod-intrinsic templates.
    let with = |t: &[&str]| ForeignSpiffeId {
        workload_selector_templates: t.iter().map(|s| s.to_string()).collect(),
        ..default_identity()
    };
    assert!(overlap(
        with(&[
            "k8s:sa:{{ .PodSpec.ServiceAccountName }}",
            "k8s:ns:{{.PodMeta.Namespace}}"
        ]),
        &[]
    ));
    assert!(overlap(
        with(&["k8s:sa:model-server", "k8s:pod-label:app:model"]),
        &[]
    ));
    assert!(!overlap(with(&["k8s:sa:other"]), &[]));
    assert!(!overlap(
        with(&["k8s:pod-label:x:{{ index .PodMeta.Labels \"x\" }}"]),
        &[]
    ));
}

#[test]
fn foreign_view_skips_kleym_objects() {
    let ours = ok(&binding("a", "chat", "vllm"));
    let mut obj = kleym_api::external::spiffeid::ClusterSPIFFEID::new(
        &ours.output_name(),
        ours.output.spec.clone(),
    );
    obj.metadata.labels = Some(ours.output_labels().to_btree_map());
    // kleym's labels alone (anyone who writes ClusterSPIFFEIDs can copy them) do not hide
    // an object from the overlap analysis.
    let f = ForeignSpiffeId::from_object(&obj, "kleym").expect("labels are not proof");
    assert!(!f.fallback);
    assert_eq!(f.workload_selector_templates, ours.selectors());
    // kleym's output: the owner annotation, applied by kleym's field manager.
    let owner = Owner {
        namespace: NS.into(),
        name: "a".into(),
        uid: "binding-uid".into(),
    };
    assert_eq!(
        obj.metadata.name.as_deref(),
        Some(owner.object_name().as_str())
    );
    obj.metadata.uid = Some("csid-uid".into());
    obj.metadata.annotations = Some(BTreeMap::from([(
        OWNER_ANNOTATION.to_string(),
        owner.annotation_value(),
    )]));
    let applied_by = |manager: &str| {
        Some(vec![ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({
                "f:metadata": {"f:annotations": {"f:kleym.io/owner": {}}}
            }))),
            ..Default::default()
        }])
    };
    obj.metadata.managed_fields = applied_by("someone-else");
    assert!(ForeignSpiffeId::from_object(&obj, "kleym").is_some());
    obj.metadata.managed_fields = applied_by("kleym");
    assert!(ForeignSpiffeId::from_object(&obj, "kleym").is_none());
}

#[test]
fn selector_evaluation_is_three_valued() {
    let req = |op: &str, values: &[&str]| LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "k".into(),
            operator: op.into(),
            values: Some(values.iter().map(|s| s.to_string()).collect()),
        }]),
    };
    let with_k = LabelMap::from(labels(&[("k", "v")]));
    let empty = LabelMap::new();
    assert!(selector_provably_matches(
        &req("In", &["v"]),
        &with_k,
        false
    ));
    assert!(!selector_provably_matches(
        &req("In", &["w"]),
        &with_k,
        false
    ));
    assert!(selector_provably_matches(
        &req("NotIn", &["w"]),
        &with_k,
        false
    ));
    assert!(!selector_provably_matches(
        &req("NotIn", &["w"]),
        &empty,
        false
    ));
    assert!(selector_provably_matches(
        &req("NotIn", &["w"]),
        &empty,
        true
    ));
    assert!(selector_provably_matches(
        &req("Exists", &[]),
        &with_k,
        false
    ));
    assert!(!selector_provably_matches(
        &req("DoesNotExist", &[]),
        &empty,
        false
    ));
    assert!(selector_provably_matches(
        &req("DoesNotExist", &[]),
        &empty,
        true
    ));
    assert!(!selector_provably_matches(
        &req("Bogus", &[]),
        &with_k,
        true
    ));
}

#[test]
fn conditions_from_verdicts() {
    let ids = [
        ok(&binding("a", "chat", "vllm")),
        ok(&binding("b", "code", "vllm")),
    ];
    let refusal = run(&ids).refusal(&bref("a")).unwrap();
    let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
    let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
    let refused = build_conditions(
        &ConditionOutcome::Refused(refusal.clone()),
        Some(3),
        &[],
        &t0,
    );
    let by_type: BTreeMap<&str, _> = refused.iter().map(|c| (c.type_.as_str(), c)).collect();
    assert_eq!(by_type.len(), 5);
    assert!(refused.iter().all(|c| c.observed_generation == Some(3)));
    assert_eq!(by_type[types::READY].status, "False");
    assert_eq!(by_type[types::READY].reason, "IdentityCollision");
    assert_eq!(by_type[types::CONFLICT].status, "True");
    assert_eq!(by_type[types::CONFLICT].message, refusal.message);
    for t in [
        types::INVALID_REF,
        types::UNSAFE_SELECTOR,
        types::RENDER_FAILURE,
    ] {
        assert_eq!(by_type[t].status, "False", "{t}");
    }
    // Same verdict later: identical conditions (no status write).
    let again = build_conditions(
        &ConditionOutcome::Refused(refusal.clone()),
        Some(3),
        &refused,
        &t1,
    );
    assert_eq!(again, refused);
    // Resolution: only changed conditions get the new transition time.
    let ready = build_conditions(
        &ConditionOutcome::Ready {
            message: "applied".into(),
        },
        Some(4),
        &refused,
        &t1,
    );
    let by_type: BTreeMap<&str, _> = ready.iter().map(|c| (c.type_.as_str(), c)).collect();
    assert_eq!(by_type[types::READY].status, "True");
    assert_eq!(by_type[types::READY].last_transition_time, t1);
    assert_eq!(by_type[types::CONFLICT].last_transition_time, t1);
    assert_eq!(by_type[types::INVALID_REF].last_transition_time, t0);
    let pending = build_conditions(
        &ConditionOutcome::Pending {
            reason: "Applying".into(),
            message: "m".into(),
        },
        None,
        &[],
        &t0,
    );
    assert_eq!(pending[0].reason, "Applying");
    assert!(pending.iter().skip(1).all(|c| c.status == "False"));
}

/// A foreign object that renders, for every pod of the pool, exactly the entry kleym's
/// output for `chat-id` renders: its templates read only what the pool's pods share.
fn imitation(ours: &CompiledIdentity, created_ns: i128, uid: &str) -> ForeignSpiffeId {
    // The imitation is only meaningful if these are kleym's ID and selectors.
    assert_eq!(
        ours.selectors(),
        [
            "k8s:container-name:vllm",
            "k8s:ns:team-a",
            "k8s:pod-label:app:model",
            "k8s:sa:model-server"
        ]
    );
    assert_eq!(
        ours.spiffe_id(),
        "spiffe://example.org/ns/team-a/objective/chat"
    );
    ForeignSpiffeId {
        name: "copy-of-chat".into(),
        spiffe_id_template:
            "spiffe://{{ .TrustDomain }}/ns/{{ .PodMeta.Namespace }}/objective/chat".into(),
        workload_selector_templates: vec![
            "k8s:ns:{{ .PodMeta.Namespace }}".into(),
            "k8s:sa:{{ .PodSpec.ServiceAccountName }}".into(),
            "k8s:pod-label:app:{{ .PodMeta.Labels.app }}".into(),
            "k8s:container-name:vllm".into(),
        ],
        precedence: created(created_ns, uid),
        ..ForeignSpiffeId::default()
    }
}

fn warnings_of(
    ids: &[CompiledIdentity],
    foreign: &[ForeignSpiffeId],
    outputs: &OutputPrecedence,
    name: &str,
) -> Vec<(WarningReason, String)> {
    let refs: Vec<&CompiledIdentity> = ids.iter().collect();
    analyze_observed(&refs, foreign, &NamespaceLabels::new(), outputs)
        .verdict(&bref(name))
        .warnings
        .into_iter()
        .map(|w| (w.reason, w.message))
        .collect()
}

fn created(ns: i128, uid: &str) -> Precedence {
    Precedence {
        created_ns: ns,
        deleted_ns: None,
        uid: uid.into(),
    }
}

#[test]
fn an_older_foreign_object_rendering_kleyms_entry_masks_it() {
    let ours = ok(&binding("chat-id", "chat", "vllm"));
    let ids = [ours.clone()];
    let older = imitation(&ours, 10, "u-f");
    let output = |p: Precedence| OutputPrecedence::from([(bref("chat-id"), p)]);

    // kleym's output exists and is newer: SPIRE keeps the foreign declaration.
    let w = warnings_of(
        &ids,
        std::slice::from_ref(&older),
        &output(created(20, "u-k")),
        "chat-id",
    );
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].0, WarningReason::MaskedByForeignObject);
    for named in [
        "copy-of-chat",
        ours.output_name().as_str(),
        "team-a/pool",
        ours.spiffe_id(),
    ] {
        assert!(w[0].1.contains(named), "{} does not name {named}", w[0].1);
    }
    // Not created yet: it will be newer than every existing object.
    let w = warnings_of(
        &ids,
        std::slice::from_ref(&older),
        &OutputPrecedence::new(),
        "chat-id",
    );
    assert_eq!(
        w.iter().map(|w| w.0).collect::<Vec<_>>(),
        [WarningReason::MaskedByForeignObject]
    );
    // kleym's is older: the foreign entry is the masked one and the pods get one SVID, so
    // no finding (the old analysis called this two SVIDs).
    let w = warnings_of(
        &ids,
        std::slice::from_ref(&older),
        &output(created(5, "u-k")),
        "chat-id",
    );
    assert!(w.is_empty(), "{w:?}");
    // Same creation time: the object not being deleted wins, then the smaller UID.
    let tie = warnings_of(
        &ids,
        std::slice::from_ref(&older),
        &output(created(10, "u-a")),
        "chat-id",
    );
    assert!(tie.is_empty(), "{tie:?}");
    let tie = warnings_of(
        &ids,
        std::slice::from_ref(&older),
        &output(created(10, "u-z")),
        "chat-id",
    );
    assert_eq!(tie.len(), 1);
    let deleting = Precedence {
        deleted_ns: Some(30),
        ..created(10, "u-a")
    };
    let tie = warnings_of(
        &ids,
        std::slice::from_ref(&older),
        &output(deleting),
        "chat-id",
    );
    assert_eq!(tie.len(), 1, "a deleting output loses the tie");

    // A fallback never applies where kleym's entry does.
    let fallback = ForeignSpiffeId {
        fallback: true,
        ..older.clone()
    };
    assert!(warnings_of(&ids, &[fallback], &OutputPrecedence::new(), "chat-id").is_empty());
    // One more selector (the pod's name): another entry with the same ID, which the
    // container also matches: a second SVID, not a masked one.
    let mut wider = older.clone();
    wider
        .workload_selector_templates
        .push("k8s:pod-name:{{ .PodMeta.Name }}".into());
    let w = warnings_of(&ids, &[wider], &OutputPrecedence::new(), "chat-id");
    assert_eq!(
        w.iter().map(|w| w.0).collect::<Vec<_>>(),
        [WarningReason::OverlappingDefaultIdentity]
    );
    // Another container: neither the same entry nor an entry for kleym's workloads.
    let mut other_container = older.clone();
    other_container.workload_selector_templates[3] = "k8s:container-name:tgi".into();
    assert!(
        warnings_of(
            &ids,
            &[other_container],
            &OutputPrecedence::new(),
            "chat-id"
        )
        .is_empty()
    );
    // A label the pool does not fix has no value for the pool's pods: nothing is claimed.
    let mut unknown = older.clone();
    unknown.workload_selector_templates[2] =
        "k8s:pod-label:app:{{ .PodMeta.Labels.version }}".into();
    assert!(warnings_of(&ids, &[unknown], &OutputPrecedence::new(), "chat-id").is_empty());
    // A refused binding has no output to mask.
    let twin = ok(&binding("twin", "code", "vllm"));
    let w = warnings_of(
        &[ours.clone(), twin],
        std::slice::from_ref(&older),
        &OutputPrecedence::new(),
        "chat-id",
    );
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn workloads_of_a_narrower_pool_get_an_svid_per_wider_identity() {
    // PoolOnly on app=model; PerObjective on app=model,tier=gpu with the same service
    // account: the tier=gpu pods are the PoolOnly pool's pods too, and their vllm
    // container matches both entries.
    let wide = ok(&pool_only("wide", "chat"));
    let mut narrow_input = binding("narrow", "code", "vllm");
    narrow_input.target = Lookup::Found(objective(NS, "code", "gpu-pool"));
    narrow_input.pool = Lookup::Found(pool(NS, "gpu-pool", &[("app", "model"), ("tier", "gpu")]));
    let narrow = ok(&narrow_input);
    let a = run(&[wide.clone(), narrow.clone()]);
    for me in ["wide", "narrow"] {
        let v = a.verdict(&bref(me));
        assert!(v.conflicts.is_empty(), "{me}");
        assert_eq!(v.warnings.len(), 1, "{me}: {:?}", v.warnings);
        assert_eq!(v.warnings[0].reason, WarningReason::MultipleSvids);
        let m = &v.warnings[0].message;
        for named in [
            "narrow",
            "wide",
            "team-a/gpu-pool",
            wide.spiffe_id(),
            narrow.spiffe_id(),
        ] {
            assert!(m.contains(named), "{m} does not name {named}");
        }
        assert_eq!(v.status_warnings()[0].reason, "MultipleSVIDs");
    }
    // Both members carry the same message: the report makes one finding of it.
    assert_eq!(
        a.verdict(&bref("wide")).warnings,
        a.verdict(&bref("narrow")).warnings
    );

    // Another service account, or pools that only overlap: not provable for the pods.
    let mut other_sa = narrow_input.clone();
    other_sa.spec.workload_selector_templates[1] = "k8s:sa:other".into();
    assert!(run(&[wide.clone(), ok(&other_sa)]).verdicts.is_empty());
    let mut sideways = narrow_input.clone();
    sideways.pool = Lookup::Found(pool(NS, "gpu-pool", &[("tier", "gpu")]));
    assert!(run(&[wide.clone(), ok(&sideways)]).verdicts.is_empty());
    // Two PoolOnly identities with different IDs on one pool: every pod gets two SVIDs.
    let mut second = pool_only("second", "code");
    second.spec.spiffe_id_template = Some("spiffe://example.org/ns/team-a/other".into());
    let a = run(&[wide.clone(), ok(&second)]);
    assert_eq!(
        a.verdict(&bref("second"))
            .warnings
            .iter()
            .map(|w| w.reason)
            .collect::<Vec<_>>(),
        [WarningReason::MultipleSvids]
    );
    // Already reported otherwise: PoolOnly + PerObjective on one pool, and a collision.
    let a = run(&[wide.clone(), ok(&binding("chat-id", "chat", "vllm"))]);
    assert_eq!(
        a.verdict(&bref("wide"))
            .warnings
            .iter()
            .map(|w| w.reason)
            .collect::<Vec<_>>(),
        [WarningReason::PoolAndObjectiveIdentities]
    );
    let a = run(&[
        ok(&binding("a", "chat", "vllm")),
        ok(&binding("b", "code", "vllm")),
    ]);
    assert!(a.verdict(&bref("a")).warnings.is_empty());
    // The same ID and selectors twice is one entry: one SVID.
    let mut same = pool_only("same", "chat");
    same.spec.spiffe_id_template = Some(wide.spiffe_id().into());
    assert!(run(&[wide, ok(&same)]).verdicts.is_empty());
}
