//! External types against the real upstream CRDs vendored in `e2e/crds/upstream/`: every field we
//! model exists in the upstream schema, and sample objects round-trip through serde.

use kleym_api::external::{clusterprofile, model, objective, pool, spiffeid};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn upstream_schema(file: &str, version: &str) -> Value {
    let crd: Value = kleym_api::yaml::from_str(upstream_crds::upstream_yaml(file)).unwrap();
    crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == version)
        .unwrap_or_else(|| panic!("{file} has no version {version}"))["schema"]["openAPIV3Schema"]
        .clone()
}

/// Every key path in `value` must exist in `schema`; returns the paths that do not.
fn unknown_paths(value: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(map) => {
            if path == ".metadata" {
                return;
            }
            for (k, v) in map {
                let sub = schema
                    .get("properties")
                    .and_then(|p| p.get(k))
                    .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()));
                match sub {
                    Some(sub) => unknown_paths(v, sub, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                match schema.get("items") {
                    Some(sub) => unknown_paths(v, sub, &format!("{path}[{i}]"), out),
                    None => out.push(format!("{path}[{i}]")),
                }
            }
        }
        _ => {
            let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
            let ok = match value {
                Value::String(_) => ty == "string",
                Value::Number(_) => ty == "integer" || ty == "number",
                Value::Bool(_) => ty == "boolean",
                _ => true,
            };
            if !ok {
                out.push(format!("{path} (type {ty})"));
            }
        }
    }
}

/// Deserialize `sample` as `T`, check it serializes back to the same JSON, and that every
/// field of the sample exists upstream.
fn check<T: DeserializeOwned + Serialize>(sample: Value, file: &str, version: &str) -> T {
    let typed: T = serde_json::from_value(sample.clone()).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(back, sample, "round trip of {file}");
    let mut unknown = Vec::new();
    unknown_paths(&back, &upstream_schema(file, version), "", &mut unknown);
    assert!(
        unknown.is_empty(),
        "{file}: fields not in upstream schema: {unknown:?}"
    );
    typed
}

fn conditions() -> Value {
    json!([{
        "type": "Accepted", "status": "True", "reason": "Accepted", "message": "ok",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2
    }])
}

#[test]
fn inference_pool_v1() {
    let sample = json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "vllm-qwen3-32b", "namespace": "team-a"},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm-qwen3-32b"}},
            "targetPorts": [{"number": 8000}],
            "appProtocol": "http",
            "endpointPickerRef": {"group": "", "kind": "Service", "name": "epp",
                "port": {"number": 9002}, "failureMode": "FailOpen"}
        },
        "status": {"parents": [{"parentRef": {"group": "gateway.networking.k8s.io",
            "kind": "Gateway", "name": "gw", "namespace": "team-a"},
            "controllerName": "example.com/gw", "conditions": conditions()}]}
    });
    let p: pool::v1::InferencePool = check(
        sample,
        "inference.networking.k8s.io_inferencepools.yaml",
        "v1",
    );
    assert_eq!(p.spec.selector.match_labels["app"], "vllm-qwen3-32b");
    // endpointPickerRef is optional since GAIE v1.6.0.
    let minimal = json!({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "p"}, "spec": {"selector": {"matchLabels": {"a": "b"}},
        "targetPorts": [{"number": 8000}]}});
    check::<pool::v1::InferencePool>(
        minimal,
        "inference.networking.k8s.io_inferencepools.yaml",
        "v1",
    );
}

#[test]
fn inference_pool_legacy() {
    let sample = json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"selector": {"app": "m"}, "targetPortNumber": 8000,
            "extensionRef": {"group": "", "kind": "Service", "name": "epp",
                "portNumber": 9002, "failureMode": "FailClose"}},
        "status": {"parent": [{"parentRef": {"kind": "Status", "name": "default"},
            "conditions": conditions()}]}
    });
    let p: pool::v1alpha2::InferencePool = check(
        sample,
        "inference.networking.x-k8s.io_inferencepools.yaml",
        "v1alpha2",
    );
    assert_eq!(p.spec.selector["app"], "m");
}

#[test]
fn inference_objectives_both_groups() {
    let spec = json!({"priority": 2, "poolRef": {"group": "inference.networking.k8s.io",
        "kind": "InferencePool", "name": "p"}});
    let status = json!({"conditions": conditions()});
    let llmd = json!({"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
        "metadata": {"name": "o", "namespace": "team-a"}, "spec": spec, "status": status});
    let o: objective::llmd::InferenceObjective =
        check(llmd, "llm-d.ai_inferenceobjectives.yaml", "v1alpha2");
    assert_eq!(o.spec.pool_group(), "inference.networking.k8s.io");
    let gaie = json!({"apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceObjective", "metadata": {"name": "o"},
        "spec": {"poolRef": {"name": "p"}}, "status": status});
    let o: objective::gaie::InferenceObjective = check(
        gaie,
        "inference.networking.x-k8s.io_inferenceobjectives.yaml",
        "v1alpha2",
    );
    // The upstream default group of an objective's poolRef is the v1 pool group.
    assert_eq!(o.spec.pool_group(), "inference.networking.k8s.io");
}

#[test]
fn inference_model_legacy() {
    let sample = json!({"apiVersion": "inference.networking.x-k8s.io/v1alpha2",
        "kind": "InferenceModel", "metadata": {"name": "m", "namespace": "team-a"},
        "spec": {"modelName": "qwen", "criticality": "Critical",
            "targetModels": [{"name": "qwen-lora", "weight": 10}],
            "poolRef": {"name": "p"}},
        "status": {"conditions": conditions()}});
    let m: model::InferenceModel = check(
        sample,
        "inference.networking.x-k8s.io_inferencemodels.yaml",
        "v1alpha2",
    );
    // InferenceModel's poolRef defaults to the legacy pool group.
    assert_eq!(m.spec.pool_group(), "inference.networking.x-k8s.io");
}

#[test]
fn cluster_spiffe_id() {
    let sample = json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": {"name": "x"},
        "spec": {
            "spiffeIDTemplate": "spiffe://td/ns/a/objective/o",
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "a"}},
            "podSelector": {"matchLabels": {"app": "m"},
                "matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]},
            "workloadSelectorTemplates": ["k8s:ns:a"],
            "dnsNameTemplates": ["m.a.svc"], "ttl": "1h", "jwtTtl": "5m",
            "federatesWith": ["other.td"], "admin": false, "downstream": false,
            "autoPopulateDNSNames": false, "className": "c", "fallback": false, "hint": "o"
        },
        "status": {"stats": {"namespacesSelected": 1, "namespacesIgnored": 0,
            "podsSelected": 3, "podEntryRenderFailures": 0, "entriesMasked": 0,
            "entriesToSet": 3, "entryFailures": 0}}});
    let c: spiffeid::ClusterSPIFFEID =
        check(sample, "spire.spiffe.io_clusterspiffeids.yaml", "v1alpha1");
    assert_eq!(c.status.unwrap().stats.unwrap().pods_selected, 3);
}

#[test]
fn cluster_spiffe_id_zero_durations_are_unset() {
    // What a Go client writing the typed object sends.
    let go = json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": {"name": "x"},
        "spec": {"spiffeIDTemplate": "spiffe://td/x", "ttl": "0s", "jwtTtl": "0s"}});
    let c: spiffeid::ClusterSPIFFEID = serde_json::from_value(go).unwrap();
    assert_eq!(c.spec.ttl, None);
    assert_eq!(c.spec.jwt_ttl, None);
    let back = serde_json::to_value(&c).unwrap();
    assert!(back["spec"].get("ttl").is_none());
}

#[test]
fn cluster_profile() {
    let cluster = json!({"server": "https://spoke:6443", "certificate-authority": "/ca.pem",
        "certificate-authority-data": "Q0E=", "disable-compression": true,
        "insecure-skip-tls-verify": false, "proxy-url": "http://proxy", "tls-server-name": "spoke",
        "extensions": [{"name": "client.authentication.k8s.io/exec",
            "extension": {"clusterName": "spoke-1"}}]});
    let sample = json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
    "metadata": {"name": "spoke-1", "namespace": "fleet"},
    "spec": {"displayName": "Spoke 1", "clusterManager": {"name": "ocm"}},
    "status": {
        "accessProviders": [{"name": "secretreader", "cluster": cluster}],
        "credentialProviders": [{"name": "old", "cluster": cluster}],
        "conditions": conditions(),
        "properties": [{"name": "kleym.io/trust-domain", "value": "spoke1.example",
            "lastObservedTime": "2026-01-01T00:00:00Z"}],
        "version": {"kubernetes": "1.33.0"}
    }});
    let p: clusterprofile::ClusterProfile = check(
        sample,
        "multicluster.x-k8s.io_clusterprofiles.yaml",
        "v1alpha1",
    );
    let status = p.status.unwrap();
    let provider = &status.access_providers.unwrap()[0];
    let data = provider
        .cluster
        .as_ref()
        .unwrap()
        .certificate_authority_data
        .as_ref()
        .unwrap();
    assert_eq!(data.0, b"CA");
}

#[test]
fn unknown_field_walk_detects_invented_fields() {
    // The schema walk must be able to fail: an invented field is reported.
    let schema = upstream_schema("spire.spiffe.io_clusterspiffeids.yaml", "v1alpha1");
    let mut unknown = Vec::new();
    unknown_paths(
        &json!({"spec": {"spiffeIdTemplate": "x"}}),
        &schema,
        "",
        &mut unknown,
    );
    assert_eq!(unknown, [".spec.spiffeIdTemplate"]);
}
