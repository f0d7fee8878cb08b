//! Property tests: compile and analyze are deterministic, independent of input order, and
//! conflicts are symmetric.

mod compiler_common;

use compiler_common::*;
use kleym_api::IdentityMode;
use kleym_spoke::compiler::{
    BindingInput, CompiledIdentity, Lookup, NamespaceLabels, analyze, compile,
};
use proptest::prelude::*;

/// A small random binding: few choices per dimension so collisions and duplicates occur.
fn arb_binding(index: usize) -> impl Strategy<Value = BindingInput> {
    (
        0..2usize,     // namespace
        0..3usize,     // pool labels
        0..2usize,     // service account
        0..3usize,     // container
        any::<bool>(), // PoolOnly
        0..3usize,     // 0: default ID, else a shared override
    )
        .prop_map(move |(ns, pool_ix, sa, c, pool_only_mode, id)| {
            let ns = ["team-a", "team-b"][ns];
            let mut b = binding(
                &format!("b{index}"),
                &format!("o{index}"),
                ["c0", "c1", "c2"][c],
            );
            b.namespace = ns.into();
            b.target = Lookup::Found(objective(ns, &format!("o{index}"), "pool"));
            b.pool = Lookup::Found(pool(ns, "pool", &[("app", ["x", "y", "z"][pool_ix])]));
            b.spec.workload_selector_templates =
                vec!["k8s:ns:{{ .Namespace }}".into(), format!("k8s:sa:sa{sa}")];
            if pool_only_mode {
                b.spec.mode = IdentityMode::PoolOnly;
                b.spec.container_discriminator = None;
            }
            if id > 0 {
                b.spec.spiffe_id_template =
                    Some(format!("spiffe://example.org/ns/{ns}/shared/{id}"));
            }
            b
        })
}

fn arb_bindings() -> impl Strategy<Value = Vec<BindingInput>> {
    (1..24usize).prop_flat_map(|n| (0..n).map(arb_binding).collect::<Vec<_>>())
}

fn compile_all(inputs: &[BindingInput]) -> Vec<CompiledIdentity> {
    inputs
        .iter()
        .map(|b| compile(b, &config()).unwrap())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn analysis_is_independent_of_input_order(
        inputs in arb_bindings(),
        seed in any::<u64>(),
    ) {
        let ids = compile_all(&inputs);
        let mut shuffled = ids.clone();
        // Deterministic Fisher-Yates from the seed.
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            shuffled.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let ns = NamespaceLabels::new();
        prop_assert_eq!(analyze(&ids, &[], &ns), analyze(&shuffled, &[], &ns));
        let mut reversed = ids.clone();
        reversed.reverse();
        prop_assert_eq!(analyze(&ids, &[], &ns), analyze(&reversed, &[], &ns));
    }

    #[test]
    fn conflicts_are_symmetric(mut inputs in arb_bindings()) {
        // Two bindings that always collide (same namespace, pool, service account and
        // container, per-objective identities), so every case has at least one conflict
        // whose symmetry is checked.
        for (name, objective_name) in [("x1", "ox1"), ("x2", "ox2")] {
            let mut b = binding(name, objective_name, "c0");
            b.namespace = "team-a".into();
            b.target = Lookup::Found(objective("team-a", objective_name, "pool"));
            b.pool = Lookup::Found(pool("team-a", "pool", &[("app", "x")]));
            b.spec.workload_selector_templates =
                vec!["k8s:ns:{{ .Namespace }}".into(), "k8s:sa:sa0".into()];
            inputs.push(b);
        }
        let ids = compile_all(&inputs);
        let analysis = analyze(&ids, &[], &NamespaceLabels::new());
        let x1 = &ids[ids.len() - 2].binding;
        let x2 = &ids[ids.len() - 1].binding;
        prop_assert!(
            analysis.verdict(x1).conflicts.iter().any(|c| c.peers.contains(x2)),
            "the planted collision was not found"
        );
        let mut checked = 0usize;
        for (me, verdict) in &analysis.verdicts {
            for finding in &verdict.conflicts {
                prop_assert!(!finding.peers.contains(me));
                for peer in &finding.peers {
                    let back = analysis.verdict(peer);
                    prop_assert!(
                        back.conflicts.iter().any(|c| c.reason == finding.reason && c.peers.contains(me)),
                        "{} lists {} for {:?} but not vice versa", me, peer, finding.reason
                    );
                    checked += 1;
                }
            }
        }
        // Both directions of the planted pair at least.
        prop_assert!(checked >= 2, "only {} peer links checked", checked);
    }

    #[test]
    fn conflict_rules_match_their_definitions(inputs in arb_bindings()) {
        let ids = compile_all(&inputs);
        let analysis = analyze(&ids, &[], &NamespaceLabels::new());
        // Brute-force pairwise definition, compared with the grouped analysis.
        for a in &ids {
            for b in &ids {
                if a.binding == b.binding { continue; }
                let collide = a.mode == IdentityMode::PerObjective
                    && b.mode == IdentityMode::PerObjective
                    && a.binding.namespace == b.binding.namespace
                    && a.pool_labels() == b.pool_labels()
                    && a.service_account == b.service_account
                    && a.container_selector == b.container_selector;
                let duplicate = a.spiffe_id() == b.spiffe_id() && a.selectors() != b.selectors();
                let v = analysis.verdict(&a.binding);
                let listed = |reason| v.conflicts.iter().any(|c| c.reason == reason && c.peers.contains(&b.binding));
                prop_assert_eq!(listed(kleym_spoke::compiler::Reason::IdentityCollision), collide);
                prop_assert_eq!(listed(kleym_spoke::compiler::Reason::DuplicateSPIFFEID), duplicate);
            }
        }
    }

    #[test]
    fn compile_ignores_template_order_and_duplicates(
        extra in proptest::collection::vec(0..4usize, 0..6),
        reverse in any::<bool>(),
    ) {
        let pool_extras = ["k8s:pod-label:tier:a", "k8s:pod-label:app:model", "k8s:ns:team-a", "k8s:sa:model-server"];
        // Baseline: the same templates once each, in a fixed order.
        let mut baseline = binding("b", "chat", "vllm");
        let mut unique: Vec<usize> = extra.clone();
        unique.sort();
        unique.dedup();
        baseline.spec.workload_selector_templates.extend(unique.iter().map(|&i| pool_extras[i].to_string()));
        let expected = compile(&baseline, &config()).unwrap();
        // The input under test: repeats kept, in generated order, maybe reversed.
        let mut b = binding("b", "chat", "vllm");
        b.spec.workload_selector_templates.extend(extra.iter().map(|&i| pool_extras[i].to_string()));
        if reverse {
            b.spec.workload_selector_templates.reverse();
        }
        let c = compile(&b, &config()).unwrap();
        let mut sorted = c.selectors().to_vec();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(&c.selectors(), &sorted);
        prop_assert_eq!(&c.selectors(), &expected.selectors());
        prop_assert_eq!(
            serde_json::to_vec(&c.output.spec).unwrap(),
            serde_json::to_vec(&expected.output.spec).unwrap()
        );
        prop_assert_eq!(&c.spiffe_id(), &expected.spiffe_id());
    }
}
