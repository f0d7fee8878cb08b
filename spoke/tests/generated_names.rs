//! The generated ClusterSPIFFEID names for the longest legal namespace (a 63-character
//! DNS-1123 label) and binding names (253-character DNS-1123 subdomains) are valid object
//! names on a real cluster and stable: the same binding always gets the same name (pinned
//! here, since a changed name would orphan every existing object), distinct bindings get
//! distinct names.
//!
//! Validity is checked against kube-apiserver's rule written out here (not the crate's own
//! helper): `validation.IsDNS1123Subdomain`, at most 253 characters matching
//! `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`, with no limit per
//! dot-separated part.

mod compiler_common;

use std::collections::BTreeMap;

use compiler_common::*;
use kleym_spoke::compiler::compile;
use kleym_spoke::compiler::output::cluster_spiffe_id_name;
use proptest::prelude::*;

/// kube-apiserver's `IsDNS1123Subdomain`.
fn kube_subdomain(s: &str) -> bool {
    let part = |p: &str| {
        let b = p.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    };
    s.len() <= 253 && s.split('.').all(part)
}

/// A 63-character namespace (the longest DNS-1123 label).
fn longest_namespace() -> String {
    let ns = format!("team-recommendation-serving-{}", "x".repeat(35));
    assert_eq!(ns.len(), 63);
    ns
}

/// 253-character binding names (the longest DNS-1123 subdomains): four DNS-sized parts, and
/// one single part (legal in Kubernetes).
fn longest_bindings() -> [String; 2] {
    let parts = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    let single = "b".repeat(253);
    assert_eq!((parts.len(), single.len()), (253, 253));
    [parts, single]
}

#[test]
fn longest_names_are_valid_and_pinned() {
    let ns = longest_namespace();
    let [parts, single] = longest_bindings();
    // `kleym-<namespace>-` is 70 characters; the binding keeps 172 so that the name,
    // with `-` and the 10-digit hash, is exactly 253.
    let pinned_parts = format!(
        "kleym-{ns}-{}.{}.{}-2b275e8aad",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(44)
    );
    let pinned_single = format!("kleym-{ns}-{}-b48d2cbff1", "b".repeat(172));
    assert_eq!((pinned_parts.len(), pinned_single.len()), (253, 253));
    let cases = [
        (ns.as_str(), parts.as_str(), pinned_parts.as_str()),
        (ns.as_str(), single.as_str(), pinned_single.as_str()),
        // The binding of the issue: one 86-character part, valid on a real cluster.
        (
            "team-recommendation-serving",
            "llama-3-70b-instruct-perobjective-binding",
            "kleym-team-recommendation-serving-llama-3-70b-instruct-perobjective-binding-bed38907eb",
        ),
    ];
    for (ns, binding, pinned) in cases {
        let name = cluster_spiffe_id_name(ns, binding);
        assert!(kube_subdomain(&name), "{ns}/{binding}: {name}");
        assert!(name.len() <= 253, "{}", name.len());
        assert_eq!(name, pinned, "{ns}/{binding}: the name must never change");
        assert_eq!(cluster_spiffe_id_name(ns, binding), name, "deterministic");
    }
}

#[test]
fn longest_names_are_distinct() {
    let ns = longest_namespace();
    let [parts, single] = longest_bindings();
    // Bindings that differ only beyond the truncation point, or only in their last
    // character, and the same binding in another 63-character namespace.
    let mut inputs = vec![
        (ns.clone(), parts.clone()),
        (ns.clone(), single.clone()),
        (ns.clone(), format!("{}c", &single[..252])),
        (ns.clone(), format!("{}e", &parts[..252])),
        (format!("{}y", &ns[..62]), single.clone()),
    ];
    for i in 0..50 {
        inputs.push((ns.clone(), format!("{}{i:03}", &single[..250])));
    }
    let mut seen = BTreeMap::new();
    for (ns, binding) in &inputs {
        let name = cluster_spiffe_id_name(ns, binding);
        assert!(kube_subdomain(&name), "{name}");
        if let Some(prev) = seen.insert(name.clone(), (ns, binding)) {
            panic!("{prev:?} and {ns}/{binding} share {name}");
        }
    }
}

#[test]
fn compile_uses_the_generated_name_for_the_longest_names() {
    let ns = longest_namespace();
    for name in longest_bindings() {
        let mut b = binding(&name, "chat", "vllm");
        b.namespace = ns.clone();
        b.target = kleym_spoke::compiler::Lookup::Found(objective(&ns, "chat", "pool"));
        b.pool = kleym_spoke::compiler::Lookup::Found(pool(&ns, "pool", &[("app", "x")]));
        let out = compile(&b, &config()).unwrap_or_else(|r| panic!("{r:?}"));
        assert_eq!(out.output_name(), cluster_spiffe_id_name(&ns, &name));
        assert!(kube_subdomain(&out.output_name()));
    }
}

/// A DNS-1123 label of 1..=63 characters.
fn arb_label() -> impl Strategy<Value = String> {
    "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
}

/// A DNS-1123 subdomain of up to 253 characters with parts of any length.
fn arb_subdomain() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-z0-9]([-a-z0-9]{0,120}[a-z0-9])?", 1..5).prop_map(|parts| {
        let mut s = parts.join(".");
        s.truncate(253);
        s.trim_end_matches(['-', '.']).to_string()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn every_legal_binding_gets_a_valid_distinct_name(
        ns in arb_label(),
        a in arb_subdomain(),
        b in arb_subdomain(),
    ) {
        prop_assume!(!a.is_empty() && !b.is_empty());
        let na = cluster_spiffe_id_name(&ns, &a);
        prop_assert!(kube_subdomain(&na), "{}", na);
        prop_assert_eq!(&na, &cluster_spiffe_id_name(&ns, &a));
        if a != b {
            prop_assert_ne!(na, cluster_spiffe_id_name(&ns, &b));
        }
    }
}
