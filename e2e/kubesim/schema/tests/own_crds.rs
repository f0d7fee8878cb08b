//! kleym's own CRDs (`charts/kleym/crds`): every served version compiles here and every
//! CEL rule is one kubesim evaluates; the binding's mode rule rejects what it should.

use std::path::PathBuf;

use kubesim_schema::{CompiledSchema, structural_errors};
use serde_json::{Value, json};

fn crd_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|a| a.join("charts/kleym/crds"))
        .find(|p| p.is_dir())
        .expect("charts/kleym/crds not found above the crate")
}

fn crds() -> Vec<Value> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(crd_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for v in serde_saphyr::from_multiple_with_options::<Value>(&text, yaml_options()).unwrap() {
            if v["kind"] == "CustomResourceDefinition" {
                out.push(v);
            }
        }
    }
    out
}

fn served(crd: &Value) -> Vec<(String, CompiledSchema)> {
    crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["served"] == true)
        .map(|v| {
            let s = CompiledSchema::new(&v["schema"]["openAPIV3Schema"]).unwrap();
            (v["name"].as_str().unwrap().to_string(), s)
        })
        .collect()
}

#[test]
fn own_crds_compile_and_every_rule_is_evaluable() {
    let crds = crds();
    assert!(!crds.is_empty(), "no CRD in {}", crd_dir().display());
    for crd in &crds {
        for v in crd["spec"]["versions"].as_array().unwrap() {
            let errs = structural_errors(&v["schema"]["openAPIV3Schema"], "openAPIV3Schema");
            assert!(errs.is_empty(), "{}: {errs:?}", crd["metadata"]["name"]);
        }
        for (version, schema) in served(crd) {
            assert!(
                schema.unevaluable_rules().is_empty(),
                "{} {version}: {:?}",
                crd["metadata"]["name"],
                schema.unevaluable_rules()
            );
        }
    }
}

#[test]
fn binding_mode_rule() {
    let Some(crd) = crds()
        .into_iter()
        .find(|c| c["spec"]["names"]["kind"] == "InferenceIdentityBinding")
    else {
        panic!(
            "InferenceIdentityBinding CRD not found in {}",
            crd_dir().display()
        );
    };
    for (version, schema) in served(&crd) {
        let mut obj = json!({
            "apiVersion": format!("kleym.io/{version}"), "kind": "InferenceIdentityBinding",
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {
                "targetRef": {"name": "base-model"},
                "workloadSelectorTemplates": ["k8s:ns:ns", "k8s:sa:vllm"],
                "mode": "PoolOnly",
                "containerDiscriminator": {"type": "ContainerName", "value": "vllm"}
            }
        });
        schema.apply_defaults(&mut obj);
        schema.prune(&mut obj);
        let errs: Vec<String> = schema
            .validate(&obj, None)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec: Invalid value: \"object\": ")
                    && e.contains("PoolOnly")),
            "{version}: {errs:?}"
        );
        obj["spec"]
            .as_object_mut()
            .unwrap()
            .remove("containerDiscriminator");
        let errs = schema.validate(&obj, None);
        assert!(errs.is_empty(), "{version}: {errs:?}");
    }
}

/// YAML 1.2 reading (`y`, `on`, `0755` stay strings), as `kleym_api::yaml` reads; kubesim
/// does not depend on kleym. serde-saphyr's defaults would read `[x, y]` as `["x", true]`.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}
