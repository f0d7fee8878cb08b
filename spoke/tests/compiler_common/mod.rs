//! Builders shared by the compiler tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

use kleym_api::{
    ContainerDiscriminator, DiscriminatorType, IdentityMode, InferenceIdentityBindingSpec,
    SelectorSource, TargetKind, TargetRef,
};
use kleym_spoke::compiler::{
    BindingInput, ClusterConfig, CompiledIdentity, Lookup, PoolRefView, PoolView, Reason,
    TargetView, compile,
};

pub const NS: &str = "team-a";
pub const TD: &str = "example.org";

pub fn config() -> ClusterConfig {
    ClusterConfig {
        trust_domain: TD.into(),
        class_name: None,
        ..ClusterConfig::default()
    }
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn objective(ns: &str, name: &str, pool: &str) -> TargetView {
    TargetView {
        kind: TargetKind::InferenceObjective,
        group: "llm-d.ai".into(),
        namespace: ns.into(),
        name: name.into(),
        pool_ref: PoolRefView {
            group: "inference.networking.k8s.io".into(),
            kind: "InferencePool".into(),
            name: pool.into(),
            namespace: None,
        },
    }
}

pub fn pool(ns: &str, name: &str, l: &[(&str, &str)]) -> PoolView {
    PoolView {
        group: "inference.networking.k8s.io".into(),
        namespace: ns.into(),
        name: name.into(),
        match_labels: labels(l).into(),
    }
}

pub fn container(name: &str) -> Option<ContainerDiscriminator> {
    Some(ContainerDiscriminator {
        type_: DiscriminatorType::ContainerName,
        value: name.into(),
    })
}

/// A valid PerObjective binding `name` → objective `obj` → pool `pool` (app=model).
pub fn binding(name: &str, obj: &str, container_name: &str) -> BindingInput {
    BindingInput {
        namespace: NS.into(),
        name: name.into(),
        spec: InferenceIdentityBindingSpec {
            target_ref: TargetRef {
                kind: TargetKind::InferenceObjective,
                name: obj.into(),
            },
            spiffe_id_template: None,
            selector_source: SelectorSource::DerivedFromPool,
            workload_selector_templates: vec![
                "k8s:ns:{{ .Namespace }}".into(),
                "k8s:sa:model-server".into(),
            ],
            mode: IdentityMode::PerObjective,
            container_discriminator: container(container_name),
            svid: None,
        },
        target: Lookup::Found(objective(NS, obj, "pool")),
        pool: Lookup::Found(pool(NS, "pool", &[("app", "model")])),
    }
}

pub fn pool_only(name: &str, obj: &str) -> BindingInput {
    let mut b = binding(name, obj, "unused");
    b.spec.mode = IdentityMode::PoolOnly;
    b.spec.container_discriminator = None;
    b
}

pub fn ok(input: &BindingInput) -> CompiledIdentity {
    compile(input, &config()).unwrap_or_else(|r| panic!("expected success, got {r}"))
}

/// Compile and return the refusal reason, checking the message names the binding or the
/// object at fault.
pub fn refused(input: &BindingInput) -> (Reason, String) {
    let r = compile(input, &config()).expect_err("expected a refusal");
    assert!(
        r.message.contains(&input.name) || r.message.contains(NS),
        "message does not name the object: {}",
        r.message
    );
    (r.reason, r.message)
}
