//! kleym's admission policies reference only fields that exist: every field their CEL
//! selects from the ClusterSPIFFEID (directly or through a variable), the admission request,
//! the namespace and the ConfigMap of parameters is one the type has, and kubesim (which
//! type-checks policies as kube-apiserver does) writes no type-checking warnings into their
//! status.

use kleym_spoke::admission_policy::{
    HUB_POLICY_NAME, PolicyOptions, SPOKE_POLICY_NAME, SPOKE_USERNAME, admission_policy,
    admission_policy_with, spoke_params_ref,
};
use kleym_spoke::compiler::svid::SvidPolicy;
use kubesim_schema::cel_types::{CelType, admission_request_type, display_issues, namespace_type};
use kubesim_schema::expr::CelExpression;
use kubesim_store::{Cluster, ResourceInfo, WriteOptions};
use serde_json::{Value, json};
use std::sync::Arc;

const CSIDS: &str = "clusterspiffeids.spire.spiffe.io";

/// The vendored upstream ClusterSPIFFEID CRD.
fn csid_crd() -> Value {
    kubesim::load_crds(&upstream_crds::upstream_dir())
        .unwrap()
        .into_iter()
        .find(|c| c["metadata"]["name"] == CSIDS)
        .expect("the ClusterSPIFFEID CRD is vendored")
}

/// The two policies kleym ships: the hub's (`kleym trust-config`) and the spoke's.
fn kleym_policies() -> Vec<Value> {
    let hub = admission_policy(&PolicyOptions {
        name: HUB_POLICY_NAME.into(),
        usernames: vec!["kleym-hub".into()],
        trust_domain: "example.org".into(),
        cluster_domain: "cluster.local".into(),
    });
    let spoke = admission_policy_with(
        &PolicyOptions {
            name: SPOKE_POLICY_NAME.into(),
            usernames: vec![SPOKE_USERNAME.into()],
            trust_domain: "example.org".into(),
            cluster_domain: "cluster.local".into(),
        },
        &spoke_params_ref(),
        &SvidPolicy::default(),
    );
    [hub, spoke]
        .into_iter()
        .map(|docs| {
            let policy = docs[0].clone();
            assert_eq!(policy["kind"], "ValidatingAdmissionPolicy");
            policy
        })
        .collect()
}

/// The type of the field at `path` of `t`.
fn at(t: &CelType, path: &[&str]) -> CelType {
    let mut t = t.clone();
    for p in path {
        t = match t {
            CelType::Object(fields) => fields
                .get(*p)
                .cloned()
                .unwrap_or_else(|| panic!("no field {p}")),
            CelType::Map(v) => *v,
            other => panic!("cannot select {p} from {other:?}"),
        };
    }
    t
}

/// Every expression of `policy` with where it is, checked with `object`/`oldObject` a
/// ClusterSPIFFEID, `params` a ConfigMap and the variables that stand for a part of either
/// typed as that part (kube-apiserver's checker types `c ? x : {}` as `dyn`, which would hide
/// a misspelt field behind a variable). Returns the issues, rendered as cel-go renders them.
fn field_issues(policy: &Value) -> Vec<String> {
    let csid =
        CelType::custom_resource(&csid_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
            .unwrap();
    // ConfigMap's shape (kubesim serves no schemas for built-in kinds).
    let config_map = CelType::custom_resource(&json!({"type": "object", "properties": {
        "data": {"type": "object", "additionalProperties": {"type": "string"}},
        "binaryData": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
        "immutable": {"type": "boolean"},
    }}))
    .unwrap();
    let typed: Vec<(&str, CelType)> = vec![
        ("labels", at(&csid, &["metadata", "labels"])),
        ("annotations", at(&csid, &["metadata", "annotations"])),
        ("oldAnnotations", at(&csid, &["metadata", "annotations"])),
        ("spec", at(&csid, &["spec"])),
        (
            "nsLabels",
            at(&csid, &["spec", "namespaceSelector", "matchLabels"]),
        ),
        ("p", at(&config_map, &["data"])),
    ];
    let spec = &policy["spec"];
    let declared: Vec<&str> = spec["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    for (name, _) in &typed {
        assert!(
            declared.contains(name),
            "the policy has no variable {name}: update this test"
        );
    }
    let variables = CelType::Object(Arc::new(
        declared
            .iter()
            .map(|n| {
                let t = typed.iter().find(|(t, _)| t == n).map(|(_, t)| t.clone());
                (n.to_string(), t.unwrap_or(CelType::Dyn))
            })
            .collect(),
    ));
    let request = admission_request_type();
    let namespace = namespace_type();
    let mut expressions = Vec::new();
    for list in ["matchConditions", "variables", "validations"] {
        for (i, item) in spec[list].as_array().unwrap().iter().enumerate() {
            for key in ["expression", "messageExpression"] {
                if let Some(text) = item[key].as_str() {
                    expressions.push((format!("spec.{list}[{i}].{key}"), text.to_string()));
                }
            }
        }
    }
    assert!(expressions.len() > 20, "{expressions:?}");
    let mut issues = Vec::new();
    for (field, text) in expressions {
        let e = CelExpression::compile(&text).unwrap_or_else(|e| panic!("{field}: {e}"));
        let (_, found) = e.check_types(
            &[
                ("object", &csid),
                ("oldObject", &csid),
                ("params", &config_map),
                ("request", &request),
                ("namespaceObject", &namespace),
                ("variables", &variables),
            ],
            &[],
        );
        if !found.is_empty() {
            issues.push(format!("{field}: {}", display_issues(&text, &found)));
        }
    }
    issues
}

#[test]
fn kleym_policies_select_only_fields_that_exist() {
    for policy in kleym_policies() {
        assert_eq!(
            field_issues(&policy),
            Vec::<String>::new(),
            "{}",
            policy["metadata"]["name"]
        );
    }
    // The check sees through the variables: a misspelt spec field is found.
    let mut typo = kleym_policies().remove(1);
    let validations = typo["spec"]["validations"].as_array_mut().unwrap();
    let i = validations
        .iter()
        .position(|v| {
            v["expression"]
                .as_str()
                .unwrap()
                .contains("variables.spec.admin")
        })
        .unwrap();
    let text = validations[i]["expression"]
        .as_str()
        .unwrap()
        .replace("variables.spec.admin", "variables.spec.admn");
    validations[i]["expression"] = Value::from(text);
    let issues = field_issues(&typo);
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert!(
        issues[0].starts_with(&format!(
            "spec.validations[{i}].expression: ERROR: <input>:1:"
        )) && issues[0].contains("undefined field 'admn'"),
        "{issues:?}"
    );
}

fn res(c: &Cluster, group: &str, version: &str, plural: &str) -> ResourceInfo {
    c.resolve(group, version, plural).unwrap()
}

#[test]
fn kubesim_writes_no_type_warnings_into_kleym_policies() {
    let c = Cluster::new("spoke");
    let opts = WriteOptions::default();
    let crds = res(
        &c,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    c.create(&crds, None, csid_crd(), &opts).unwrap();
    let pol = res(
        &c,
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
    );
    for policy in kleym_policies() {
        // As shipped (every version of the kind), and pinned to the served version, which
        // kube-apiserver's checker types against the CRD's schema.
        let mut pinned = policy.clone();
        let name = format!("{}-pinned", policy["metadata"]["name"].as_str().unwrap());
        pinned["metadata"]["name"] = Value::from(name);
        for rule in pinned["spec"]["matchConstraints"]["resourceRules"]
            .as_array_mut()
            .unwrap()
        {
            rule["apiVersions"] = json!(["v1alpha1"]);
        }
        for p in [policy, pinned] {
            let name = p["metadata"]["name"].as_str().unwrap().to_string();
            c.create(&pol, None, p, &opts).unwrap();
            let stored = c.get(&pol, None, &name).unwrap();
            assert_eq!(stored["status"]["observedGeneration"], 1, "{name}");
            assert_eq!(stored["status"]["typeChecking"], json!({}), "{name}");
        }
    }
    // The pinned policy is type-checked: a validation on a field ClusterSPIFFEID lacks warns.
    let mut broken = kleym_policies().remove(1);
    broken["metadata"]["name"] = Value::from("broken");
    broken["spec"]["matchConstraints"]["resourceRules"][0]["apiVersions"] = json!(["v1alpha1"]);
    broken["spec"]["validations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"expression": "object.spec.admn != true"}));
    let n = broken["spec"]["validations"].as_array().unwrap().len() - 1;
    c.create(&pol, None, broken, &opts).unwrap();
    let stored = c.get(&pol, None, "broken").unwrap();
    assert_eq!(
        stored["status"]["typeChecking"]["expressionWarnings"],
        json!([{
            "fieldRef": format!("spec.validations[{n}].expression"),
            "warning": "spire.spiffe.io/v1alpha1, Kind=ClusterSPIFFEID: ERROR: <input>:1:12: undefined field 'admn'\n | object.spec.admn != true\n | ...........^\n",
        }])
    );
}
