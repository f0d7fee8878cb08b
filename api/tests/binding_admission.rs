//! The InferenceIdentityBinding CRD as kube-apiserver would treat it, through kubesim's
//! schema engine: the schema compiles (structural), defaults apply, and the CEL rules
//! reject bad discriminator/mode combinations.

use kleym_api::crds;
use kubesim_schema::CompiledSchema;
use serde_json::{Value, json};

fn schema() -> CompiledSchema {
    let crd = serde_json::to_value(&crds::all()[0]).unwrap();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    CompiledSchema::new(root).expect("kube-apiserver would accept this schema")
}

/// Default, prune and validate like a create request; returns error strings.
fn admit(spec: Value) -> (Value, Vec<String>) {
    let s = schema();
    assert!(
        s.unevaluable_rules().is_empty(),
        "{:?}",
        s.unevaluable_rules()
    );
    let mut obj = json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": "b", "namespace": "team-a"},
        "spec": spec,
    });
    s.prune(&mut obj);
    s.apply_defaults(&mut obj);
    let errs = s
        .validate(&obj, None)
        .iter()
        .map(ToString::to_string)
        .collect();
    (obj, errs)
}

fn spec() -> Value {
    json!({
        "targetRef": {"name": "chat"},
        "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"],
        "containerDiscriminator": {"type": "ContainerName", "value": "vllm"},
    })
}

#[test]
fn valid_binding_is_defaulted() {
    let (obj, errs) = admit(spec());
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(obj["spec"]["mode"], "PerObjective");
    assert_eq!(obj["spec"]["selectorSource"], "DerivedFromPool");
    assert_eq!(obj["spec"]["targetRef"]["kind"], "InferenceObjective");
}

#[test]
fn discriminator_rules_are_enforced_by_the_apiserver() {
    let mut pool_only = spec();
    pool_only["mode"] = json!("PoolOnly");
    let (_, errs) = admit(pool_only.clone());
    assert!(
        errs.iter()
            .any(|e| e.contains("must not be set when mode is PoolOnly")),
        "{errs:?}"
    );
    pool_only
        .as_object_mut()
        .unwrap()
        .remove("containerDiscriminator");
    assert!(admit(pool_only).1.is_empty());

    let mut missing = spec();
    missing
        .as_object_mut()
        .unwrap()
        .remove("containerDiscriminator");
    for m in [None, Some("PerObjective")] {
        let mut s = missing.clone();
        if let Some(m) = m {
            s["mode"] = json!(m);
        }
        let (_, errs) = admit(s);
        assert!(
            errs.iter()
                .any(|e| e.contains("is required when mode is PerObjective")),
            "{errs:?}"
        );
    }
    // An explicit null is pruned before CEL: still "missing".
    let mut null = missing.clone();
    null["containerDiscriminator"] = Value::Null;
    let (_, errs) = admit(null);
    assert!(
        errs.iter()
            .any(|e| e.contains("is required when mode is PerObjective")),
        "{errs:?}"
    );
}

#[test]
fn schema_constraints_reject_bad_values() {
    for (field, value) in [
        ("mode", json!("Sometimes")),
        ("selectorSource", json!("Manual")),
        ("workloadSelectorTemplates", json!([])),
        ("targetRef", json!({"name": ""})),
        (
            "containerDiscriminator",
            json!({"type": "PodName", "value": "x"}),
        ),
        ("svid", json!({"ttl": "soon"})),
    ] {
        let mut s = spec();
        s[field] = value;
        let (_, errs) = admit(s);
        assert!(!errs.is_empty(), "{field} should be rejected");
    }
}
