//! Every vendored upstream CRD (`e2e/crds/upstream`): compile each served version, admit a
//! realistic object and reject an invalid one with kube-apiserver's message.

mod common;

use common::{admit, errors, load_crd, schema, served_schemas, upstream_dir};
use kubesim_schema::{causes, invalid_message, structural_errors};
use serde_json::json;

const SPIFFE: &str = "spire.spiffe.io_clusterspiffeids.yaml";
const STATIC: &str = "spire.spiffe.io_clusterstaticentries.yaml";
const POOL_V1: &str = "inference.networking.k8s.io_inferencepools.yaml";
const POOL_V1A2: &str = "inference.networking.x-k8s.io_inferencepools.yaml";
const OBJECTIVE_X: &str = "inference.networking.x-k8s.io_inferenceobjectives.yaml";
const OBJECTIVE_LLMD: &str = "llm-d.ai_inferenceobjectives.yaml";
const MODEL: &str = "inference.networking.x-k8s.io_inferencemodels.yaml";
const PROFILE: &str = "multicluster.x-k8s.io_clusterprofiles.yaml";

#[test]
fn every_upstream_crd_compiles_and_every_rule_is_evaluable() {
    let mut files: Vec<String> = std::fs::read_dir(upstream_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 8,
        "expected the 8 upstream CRDs, found {files:?}"
    );
    let mut versions = 0;
    for f in &files {
        let crd = load_crd(f);
        for (i, v) in crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let base = format!("spec.versions[{i}].schema.openAPIV3Schema");
            let errs = structural_errors(&v["schema"]["openAPIV3Schema"], &base);
            assert!(errs.is_empty(), "{f}: {errs:?}");
        }
        for (version, schema) in served_schemas(&crd) {
            versions += 1;
            assert!(
                schema.unevaluable_rules().is_empty(),
                "{f} {version}: unevaluable rules {:?}",
                schema.unevaluable_rules()
            );
        }
    }
    assert!(versions >= files.len());
}

#[test]
fn cluster_spiffe_id() {
    let s = schema(SPIFFE, "v1alpha1");
    let valid = json!({
        "apiVersion": "spire.spiffe.io/v1alpha1",
        "kind": "ClusterSPIFFEID",
        "metadata": {"name": "inference"},
        "spec": {
            "spiffeIDTemplate": "spiffe://domain.test/ns/{{ .PodMeta.Namespace }}/sa/{{ .PodSpec.ServiceAccountName }}",
            "podSelector": {"matchLabels": {"app": "vllm"}},
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
            "workloadSelectorTemplates": ["k8s:container-name:vllm"],
            "dnsNameTemplates": ["{{ .PodMeta.Name }}.svc"],
            "ttl": "1h",
            "hint": "inference",
            "fallback": false,
            "autoPopulateDNSNames": true
        }
    });
    let (stored, errs) = admit(&s, valid.clone(), None);
    assert_eq!(errs, Vec::<String>::new());
    assert_eq!(stored, valid);

    let mut missing = valid.clone();
    missing["spec"]
        .as_object_mut()
        .unwrap()
        .remove("spiffeIDTemplate");
    assert_eq!(
        errors(&s, missing.clone(), None),
        vec!["spec.spiffeIDTemplate: Required value"]
    );
    // The status the store returns for it.
    let errs = s.validate(&missing, None);
    assert_eq!(
        invalid_message("ClusterSPIFFEID.spire.spiffe.io", "inference", &errs),
        r#"ClusterSPIFFEID.spire.spiffe.io "inference" is invalid: spec.spiffeIDTemplate: Required value"#
    );
    assert_eq!(
        causes(&errs),
        json!([{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.spiffeIDTemplate"}])
    );

    let mut wrong_type = valid;
    wrong_type["spec"]["admin"] = json!("yes");
    assert_eq!(
        errors(&s, wrong_type, None),
        vec![
            r#"spec.admin: Invalid value: "string": spec.admin in body must be of type boolean: "string""#
        ]
    );
}

#[test]
fn cluster_static_entry() {
    let s = schema(STATIC, "v1alpha1");
    let valid = json!({
        "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterStaticEntry",
        "metadata": {"name": "node"},
        "spec": {"spiffeID": "spiffe://d/x", "parentID": "spiffe://d/spire/server", "selectors": ["k8s:ns:a"]}
    });
    assert_eq!(errors(&s, valid.clone(), None), Vec::<String>::new());
    let mut invalid = valid;
    invalid["spec"].as_object_mut().unwrap().remove("selectors");
    invalid["spec"]["admin"] = json!(1);
    assert_eq!(
        errors(&s, invalid, None),
        vec![
            r#"spec.admin: Invalid value: "integer": spec.admin in body must be of type boolean: "integer""#,
            "spec.selectors: Required value",
        ]
    );
}

fn pool_v1() -> serde_json::Value {
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "vllm-qwen3-32b", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm-qwen3-32b"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "vllm-qwen3-32b-epp", "port": {"number": 9002}, "failureMode": "FailOpen"}
        }
    })
}

#[test]
fn inference_pool_v1_valid_and_defaulted() {
    let s = schema(POOL_V1, "v1");
    let (stored, errs) = admit(&s, pool_v1(), None);
    assert_eq!(errs, Vec::<String>::new());
    assert_eq!(stored["spec"]["appProtocol"], "http");
    assert_eq!(stored["spec"]["endpointPickerRef"]["kind"], "Service");
    assert_eq!(stored["spec"]["endpointPickerRef"]["group"], "");
    assert_eq!(
        stored["spec"]["endpointPickerRef"]["failureMode"],
        "FailOpen"
    );
}

#[test]
fn inference_pool_v1_invalid() {
    let s = schema(POOL_V1, "v1");
    let mut no_ports = pool_v1();
    no_ports["spec"]
        .as_object_mut()
        .unwrap()
        .remove("targetPorts");
    assert_eq!(
        errors(&s, no_ports, None),
        vec![
            "spec.targetPorts: Required value",
            r#"<nil>: Invalid value: "null": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"#,
        ]
    );

    let mut bad_port = pool_v1();
    bad_port["spec"]["targetPorts"] = json!([{"number": 70000}]);
    assert_eq!(
        errors(&s, bad_port, None),
        vec![
            "spec.targetPorts[0].number: Invalid value: 70000: spec.targetPorts[0].number in body should be less than or equal to 65535"
        ]
    );

    let mut dup = pool_v1();
    dup["spec"]["targetPorts"] = json!([{"number": 8000}, {"number": 8000}]);
    assert_eq!(
        errors(&s, dup, None),
        vec![r#"spec.targetPorts: Invalid value: "array": port number must be unique"#]
    );

    let mut too_many = pool_v1();
    too_many["spec"]["targetPorts"] =
        json!((1..=9).map(|n| json!({"number": n})).collect::<Vec<_>>());
    let errs = errors(&s, too_many, None);
    assert_eq!(
        errs[0],
        "spec.targetPorts: Too many: 9: must have at most 8 items"
    );

    let mut no_epp_port = pool_v1();
    no_epp_port["spec"]["endpointPickerRef"]
        .as_object_mut()
        .unwrap()
        .remove("port");
    assert_eq!(
        errors(&s, no_epp_port, None),
        vec![
            r#"spec.endpointPickerRef: Invalid value: "object": port is required when kind is 'Service' or unspecified (defaults to 'Service')"#
        ]
    );

    let mut bad_enum = pool_v1();
    bad_enum["spec"]["appProtocol"] = json!("grpc");
    assert_eq!(
        errors(&s, bad_enum, None)[0],
        r#"spec.appProtocol: Unsupported value: "grpc": supported values: "http", "kubernetes.io/h2c""#
    );

    let mut bad_label = pool_v1();
    bad_label["spec"]["selector"]["matchLabels"] = json!({"app": "-bad-"});
    assert_eq!(
        errors(&s, bad_label, None),
        vec![
            r#"spec.selector.matchLabels.app: Invalid value: "-bad-": spec.selector.matchLabels.app in body should match '^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$'"#
        ]
    );
}

#[test]
fn inference_pool_v1alpha2() {
    let s = schema(POOL_V1A2, "v1alpha2");
    let valid = json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"selector": {"app": "foo"}, "targetPortNumber": 8000, "extensionRef": {"name": "epp"}}
    });
    let (stored, errs) = admit(&s, valid.clone(), None);
    assert_eq!(errs, Vec::<String>::new());
    assert_eq!(stored["spec"]["extensionRef"]["failureMode"], "FailClose");
    let mut invalid = valid;
    invalid["spec"]
        .as_object_mut()
        .unwrap()
        .remove("targetPortNumber");
    invalid["spec"]["selector"]["app"] = json!(3);
    assert_eq!(
        errors(&s, invalid, None),
        vec![
            r#"spec.selector.app: Invalid value: "integer": spec.selector.app in body must be of type string: "integer""#,
            "spec.targetPortNumber: Required value",
        ]
    );
}

#[test]
fn inference_objectives_both_groups() {
    for (file, group_default) in [
        (OBJECTIVE_X, "inference.networking.k8s.io"),
        (OBJECTIVE_LLMD, "inference.networking.k8s.io"),
    ] {
        let s = schema(file, "v1alpha2");
        let valid = json!({
            "apiVersion": "x/v1alpha2", "kind": "InferenceObjective",
            "metadata": {"name": "base-model"},
            "spec": {"priority": 2, "poolRef": {"name": "vllm-qwen3-32b"}}
        });
        let (stored, errs) = admit(&s, valid.clone(), None);
        assert_eq!(errs, Vec::<String>::new(), "{file}");
        assert_eq!(stored["spec"]["poolRef"]["group"], group_default, "{file}");
        assert_eq!(stored["spec"]["poolRef"]["kind"], "InferencePool", "{file}");

        let mut invalid = valid;
        invalid["spec"]["priority"] = json!("high");
        invalid["spec"]["poolRef"]["name"] = json!("");
        assert_eq!(
            errors(&s, invalid, None),
            vec![
                r#"spec.poolRef.name: Invalid value: "": spec.poolRef.name in body should be at least 1 chars long"#,
                r#"spec.priority: Invalid value: "string": spec.priority in body must be of type integer: "string""#,
            ],
            "{file}"
        );
    }
}

#[test]
fn inference_model_rules() {
    let s = schema(MODEL, "v1alpha2");
    let old = json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceModel",
        "metadata": {"name": "m"},
        "spec": {
            "modelName": "llama", "criticality": "Critical",
            "poolRef": {"name": "pool"},
            "targetModels": [{"name": "a", "weight": 50}, {"name": "b", "weight": 50}]
        }
    });
    let (stored_old, errs) = admit(&s, old, None);
    assert_eq!(errs, Vec::<String>::new());

    let mut renamed = stored_old.clone();
    renamed["spec"]["modelName"] = json!("mistral");
    assert_eq!(
        errors(&s, renamed.clone(), Some(&stored_old)),
        vec![r#"spec.modelName: Invalid value: "string": modelName is immutable"#]
    );
    // On create the transition rule does not run.
    assert_eq!(errors(&s, renamed, None), Vec::<String>::new());

    let mut mixed = stored_old.clone();
    mixed["spec"]["targetModels"] = json!([{"name": "a", "weight": 50}, {"name": "b"}]);
    assert_eq!(
        errors(&s, mixed, Some(&stored_old)),
        vec![
            r#"spec.targetModels: Invalid value: "array": Weights should be set for all models, or none of the models."#
        ]
    );
}

fn profile() -> serde_json::Value {
    json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
        "metadata": {"name": "spoke-1", "namespace": "fleet"},
        "spec": {"clusterManager": {"name": "kleym"}, "displayName": "Spoke 1"},
        "status": {
            "conditions": [{
                "type": "ControlPlaneHealthy", "status": "True", "reason": "Healthy",
                "message": "ok", "lastTransitionTime": "2026-01-02T03:04:05Z"
            }],
            "accessProviders": [{
                "name": "kleym",
                "cluster": {
                    "server": "https://127.0.0.1:6443",
                    "certificate-authority-data": "aGVsbG8=",
                    "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"clusterName": "spoke-1", "any": {"nested": true}}}]
                }
            }],
            "version": {"kubernetes": "1.33.1"}
        }
    })
}

#[test]
fn cluster_profile_valid_keeps_preserved_extension() {
    let s = schema(PROFILE, "v1alpha1");
    let (stored, errs) = admit(&s, profile(), None);
    assert_eq!(errs, Vec::<String>::new());
    assert_eq!(stored, profile());
}

#[test]
fn cluster_profile_invalid() {
    let s = schema(PROFILE, "v1alpha1");
    let (old, _) = admit(&s, profile(), None);
    let mut moved = old.clone();
    moved["spec"]["clusterManager"]["name"] = json!("other");
    assert_eq!(
        errors(&s, moved, Some(&old)),
        vec![r#"spec.clusterManager: Invalid value: "object": ClusterManager is immutable"#]
    );

    let mut dup = old.clone();
    let cond = dup["status"]["conditions"][0].clone();
    dup["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(cond);
    assert_eq!(
        errors(&s, dup, None),
        vec![
            r#"status.conditions[1]: Duplicate value: map[string]interface {}{"type":"ControlPlaneHealthy"}"#
        ]
    );

    let mut bad_time = old;
    bad_time["status"]["conditions"][0]["lastTransitionTime"] = json!("yesterday");
    bad_time["status"]["conditions"][0]["status"] = json!("Maybe");
    assert_eq!(
        errors(&s, bad_time, None),
        vec![
            r#"status.conditions[0].lastTransitionTime: Invalid value: "yesterday": status.conditions[0].lastTransitionTime in body must be of type date-time: "yesterday""#,
            r#"status.conditions[0].status: Unsupported value: "Maybe": supported values: "True", "False", "Unknown""#,
            r#"<nil>: Invalid value: "null": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"#,
        ]
    );
}
