//! Input views built from the typed API objects, and the resolution helpers the reconciler
//! uses to decide what to look up.

mod compiler_common;

use compiler_common::*;
use kleym_api::TargetKind;
use kleym_api::external::{model, objective, pool};
use kleym_spoke::compiler::resolve::{pool_key, prefer_objective};
use kleym_spoke::compiler::{Lookup, PoolView, Reason, TargetView};
use serde_json::json;

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

#[test]
fn views_apply_each_kinds_pool_group_default() {
    let llmd: objective::llmd::InferenceObjective = from_json(json!({
        "apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
        "metadata": {"name": "chat", "namespace": NS},
        "spec": {"poolRef": {"name": "pool"}}}));
    let t = TargetView::from_llmd_objective(&llmd);
    assert_eq!(
        (t.group.as_str(), t.pool_ref.group.as_str()),
        ("llm-d.ai", "inference.networking.k8s.io")
    );
    assert_eq!(t.pool_ref.kind, "InferencePool");

    let gaie: objective::gaie::InferenceObjective = from_json(json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
        "metadata": {"name": "chat", "namespace": NS},
        "spec": {"poolRef": {"group": "inference.networking.x-k8s.io", "name": "pool"}}}));
    let t = TargetView::from_gaie_objective(&gaie);
    assert_eq!(t.group, "inference.networking.x-k8s.io");
    assert_eq!(t.pool_ref.group, "inference.networking.x-k8s.io");

    let m: model::InferenceModel = from_json(json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
        "metadata": {"name": "llama", "namespace": NS},
        "spec": {"modelName": "llama", "poolRef": {"name": "pool"}}}));
    let t = TargetView::from_model(&m);
    assert_eq!(t.kind, TargetKind::InferenceModel);
    assert_eq!(t.pool_ref.group, "inference.networking.x-k8s.io");

    let v1: pool::v1::InferencePool = from_json(json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "pool", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "m"}}, "targetPorts": [{"number": 8000}]}}));
    let p = PoolView::from_v1(&v1);
    assert_eq!(
        (
            p.group.as_str(),
            p.match_labels.get("app").unwrap_or_default()
        ),
        ("inference.networking.k8s.io", "m")
    );
    let legacy: pool::v1alpha2::InferencePool = from_json(json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
        "metadata": {"name": "pool", "namespace": NS},
        "spec": {"selector": {"app": "m"}, "targetPortNumber": 8000, "extensionRef": {"name": "epp"}}}));
    let p = PoolView::from_v1alpha2(&legacy);
    assert_eq!(
        (
            p.group.as_str(),
            p.match_labels.get("app").unwrap_or_default()
        ),
        ("inference.networking.x-k8s.io", "m")
    );

    // A legacy model and a legacy pool compile end to end.
    let mut b = binding("b", "llama", "vllm");
    b.spec.target_ref.kind = TargetKind::InferenceModel;
    b.target = Lookup::Found(TargetView::from_model(&m));
    b.pool = Lookup::Found(p);
    assert_eq!(
        ok(&b).spiffe_id(),
        "spiffe://example.org/ns/team-a/model/llama"
    );
}

#[test]
fn llm_d_objective_is_preferred() {
    let mut gaie = objective(NS, "chat", "pool");
    gaie.group = "inference.networking.x-k8s.io".into();
    let llmd = objective(NS, "chat", "pool");
    let pick = |a, b| prefer_objective(a, b);
    assert_eq!(
        pick(Lookup::Found(llmd.clone()), Lookup::Found(gaie.clone())),
        Lookup::Found(llmd.clone())
    );
    assert_eq!(
        pick(Lookup::NotFound, Lookup::Found(gaie.clone())),
        Lookup::Found(gaie.clone())
    );
    assert_eq!(
        pick(Lookup::CrdNotServed, Lookup::Found(gaie.clone())),
        Lookup::Found(gaie)
    );
    assert_eq!(
        pick(Lookup::CrdNotServed, Lookup::NotFound),
        Lookup::NotFound
    );
    assert_eq!(
        pick(Lookup::NotFound, Lookup::CrdNotServed),
        Lookup::NotFound
    );
    assert_eq!(
        pick(Lookup::CrdNotServed, Lookup::CrdNotServed),
        Lookup::<TargetView>::CrdNotServed
    );
}

#[test]
fn pool_key_tells_the_reconciler_what_to_fetch() {
    let key = pool_key(NS, &objective(NS, "chat", "pool")).unwrap();
    assert_eq!(
        (
            key.group.as_str(),
            key.namespace.as_str(),
            key.name.as_str()
        ),
        ("inference.networking.k8s.io", NS, "pool")
    );
    let mut t = objective(NS, "chat", "pool");
    t.pool_ref.namespace = Some("elsewhere".into());
    assert_eq!(
        pool_key(NS, &t).unwrap_err().reason,
        Reason::CrossNamespaceRef
    );
    t.pool_ref.namespace = None;
    t.pool_ref.kind = "Deployment".into();
    assert_eq!(pool_key(NS, &t).unwrap_err().reason, Reason::UnsupportedRef);
}
