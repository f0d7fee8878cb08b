//! The InferenceIdentityBinding CRD: structural schema, CEL rules, printer columns, and the
//! Helm chart copy.

use kleym_api::crds;
use kleym_api::{IdentityMode, InferenceIdentityBinding};
use serde_json::{Value, json};

fn binding_crd_json() -> Value {
    let binding = crds::inference_identity_binding();
    assert!(
        crds::all().contains(&binding),
        "all() installs the binding CRD"
    );
    serde_json::to_value(&binding).unwrap()
}

fn spec_schema() -> Value {
    binding_crd_json()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        .clone()
}

/// Collect every violation of the structural-schema rules kube-apiserver enforces that a
/// derive could plausibly produce.
fn structural_violations(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    for banned in [
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "definitions",
        "$defs",
    ] {
        if obj.contains_key(banned) {
            out.push(format!("{path}: contains {banned}"));
        }
    }
    let typed = obj.contains_key("type")
        || obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if !typed {
        out.push(format!("{path}: no type"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        if obj.get("type") != Some(&json!("object")) {
            out.push(format!("{path}: properties on a non-object"));
        }
        for (k, v) in props {
            structural_violations(v, &format!("{path}.{k}"), out);
        }
    }
    if let Some(items) = obj.get("items") {
        structural_violations(items, &format!("{path}[]"), out);
    }
    if let Some(ap) = obj.get("additionalProperties")
        && ap.is_object()
    {
        structural_violations(ap, &format!("{path}{{}}"), out);
    }
}

#[test]
fn schema_is_structural() {
    let crd = binding_crd_json();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut violations = Vec::new();
    structural_violations(root, "", &mut violations);
    assert!(
        violations.is_empty(),
        "non-structural schema: {violations:#?}"
    );
    // The spec must not be nullable anywhere: null must be pruned before CEL runs.
    assert!(!spec_schema().to_string().contains("\"nullable\""));
}

#[test]
fn crd_names_scope_and_subresources() {
    let crd = binding_crd_json();
    assert_eq!(
        crd["metadata"]["name"],
        "inferenceidentitybindings.kleym.io"
    );
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["iib"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["subresources"]["status"], json!({}));
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Mode", "Target", "Ready", "Reason", "SPIFFE ID", "Age"]
    );
    assert_eq!(
        spec_schema()["properties"]["mode"]["default"],
        "PerObjective"
    );
}

/// Evaluate the spec's CEL rules the way the apiserver does after defaulting: returns the
/// messages of failing rules.
fn cel_failures(spec: &Value) -> Vec<String> {
    let schema = spec_schema();
    let rules = schema["x-kubernetes-validations"].as_array().unwrap();
    assert_eq!(rules.len(), 2);
    rules
        .iter()
        .filter_map(|r| {
            let program = cel::Program::compile(r["rule"].as_str().unwrap()).unwrap();
            let mut ctx = cel::Context::default();
            ctx.add_variable("self", spec.clone()).unwrap();
            match program.execute(&ctx).unwrap() {
                cel::Value::Bool(true) => None,
                cel::Value::Bool(false) => Some(r["message"].as_str().unwrap().to_string()),
                other => panic!("rule returned {other:?}"),
            }
        })
        .collect()
}

fn base_spec() -> Value {
    json!({
        "targetRef": {"name": "chat"},
        "selectorSource": "DerivedFromPool",
        "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model-server"],
    })
}

#[test]
fn cel_rejects_discriminator_in_pool_only() {
    let mut spec = base_spec();
    spec["mode"] = json!("PoolOnly");
    assert!(cel_failures(&spec).is_empty());
    spec["containerDiscriminator"] = json!({"type": "ContainerName", "value": "vllm"});
    assert_eq!(
        cel_failures(&spec),
        ["containerDiscriminator must not be set when mode is PoolOnly"]
    );
}

#[test]
fn cel_requires_discriminator_in_per_objective_explicit_or_omitted() {
    let omitted = base_spec();
    let mut explicit = base_spec();
    explicit["mode"] = json!("PerObjective");
    for spec in [&omitted, &explicit] {
        assert_eq!(
            cel_failures(spec),
            ["containerDiscriminator is required when mode is PerObjective (the default)"],
            "{spec}"
        );
        let mut ok = spec.clone();
        ok["containerDiscriminator"] = json!({"type": "ContainerImage", "value": "vllm:1"});
        assert!(cel_failures(&ok).is_empty(), "{ok}");
    }
}

#[test]
fn spec_defaults_and_round_trip() {
    let mut spec = base_spec();
    spec["containerDiscriminator"] = json!({"type": "ContainerName", "value": "vllm"});
    let obj = json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": "b", "namespace": "team-a"},
        "spec": spec,
    });
    let b: InferenceIdentityBinding = serde_json::from_value(obj).unwrap();
    assert_eq!(b.spec.mode, IdentityMode::PerObjective);
    assert_eq!(b.spec.target_ref.kind.as_str(), "InferenceObjective");
    let back = serde_json::to_value(&b).unwrap();
    let again: InferenceIdentityBinding = serde_json::from_value(back).unwrap();
    assert_eq!(again, b);
}

/// A pure comparison: the test never writes the files it compares against (regenerating is
/// `kleym crds --write`, a separate command).
#[test]
fn chart_copy_matches_generated_crds() {
    let chart_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kleym/crds");
    for crd in crds::all() {
        let path = chart_dir.join(crds::file_name(&crd));
        let want = crds::crd_to_yaml(&crd).unwrap();
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is out of date with the Rust types; regenerate the chart's CRDs with \
             `cargo run -p kleym-hub --bin kleym -- crds --write charts/kleym/crds`",
            path.display()
        );
    }
}
