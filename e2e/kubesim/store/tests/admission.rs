//! ValidatingAdmissionPolicy enforcement in the store: failure policies, subresources,
//! excluded rules, requesting users, and what a denied write leaves behind.

mod common;

use common::{cluster, install_crd, opts, res};
use kubesim_store::{DeleteOptions, RequestUser, Subresource, WriteOptions};
use serde_json::{Value, json};

fn policy(name: &str, failure: &str, rules: Value, exclude: Value, expression: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": failure,
            "matchConstraints": {"resourceRules": rules, "excludeResourceRules": exclude},
            "validations": [{"expression": expression}],
        }
    })
}

fn binding(name: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    })
}

fn cm(name: &str, size: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"size": size}})
}

fn by(user: &str) -> WriteOptions {
    WriteOptions {
        user: Some(RequestUser {
            username: user.into(),
            ..Default::default()
        }),
        ..opts("test")
    }
}

#[test]
fn failure_policies_rules_and_users() {
    let c = cluster();
    let pol = res(
        &c,
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
    );
    let bnd = res(
        &c,
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
    );
    let cms = res(&c, "", "v1", "configmaps");
    let all_cms = json!([{"apiGroups": [""], "apiVersions": ["*"], "operations": ["*"], "resources": ["configmaps"]}]);
    // Errors (a missing key) deny under Fail ...
    c.create(
        &pol,
        None,
        policy(
            "strict",
            "Fail",
            all_cms.clone(),
            json!([]),
            "request.userInfo.username != 'alice' || object.data.colour == 'red'",
        ),
        &opts("t"),
    )
    .unwrap();
    c.create(&bnd, None, binding("strict"), &opts("t")).unwrap();
    let e = c
        .create(&cms, Some("default"), cm("a", "s"), &by("alice"))
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{e}");
    assert!(
        e.message.starts_with("configmaps \"a\" is forbidden: ValidatingAdmissionPolicy 'strict' with binding 'strict' denied request: expression 'request.userInfo.username != 'alice' || object.data.colour == 'red'' resulted in error: "),
        "{}",
        e.message
    );
    assert!(c.get(&cms, Some("default"), "a").is_err(), "nothing stored");
    // ... other users (and in-process writes, an empty user) are not bound by the rule.
    c.create(&cms, Some("default"), cm("a", "s"), &by("bob"))
        .unwrap();
    c.create(&cms, Some("default"), cm("b", "s"), &opts("t"))
        .unwrap();
    // ... and admit under Ignore; an excluded name is not matched at all.
    c.delete(&bnd, None, "strict", &DeleteOptions::default())
        .unwrap();
    c.create(
        &pol,
        None,
        policy(
            "lenient",
            "Ignore",
            all_cms.clone(),
            json!([]),
            "object.data.colour == 'red'",
        ),
        &opts("t"),
    )
    .unwrap();
    c.create(&bnd, None, binding("lenient"), &opts("t"))
        .unwrap();
    c.create(&cms, Some("default"), cm("c", "s"), &by("alice"))
        .unwrap();
    // A false result denies whatever the failure policy; deletes see oldObject; creates
    // (false here) pass only because the rule excludes them.
    c.create(
        &pol,
        None,
        policy(
            "keep",
            "Ignore",
            all_cms,
            json!([{"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["configmaps"]}]),
            "request.operation == 'UPDATE' || (request.operation == 'DELETE' && oldObject.data.size != 'keep')",
        ),
        &opts("t"),
    )
    .unwrap();
    c.create(&bnd, None, binding("keep"), &opts("t")).unwrap();
    c.create(&cms, Some("default"), cm("k", "keep"), &by("alice"))
        .unwrap();
    let e = c
        .delete(&cms, Some("default"), "k", &DeleteOptions::default())
        .unwrap_err();
    assert!(e.message.ends_with("denied request: failed expression: request.operation == 'UPDATE' || (request.operation == 'DELETE' && oldObject.data.size != 'keep')"), "{}", e.message);
    // A dry-run delete is judged the same way.
    let dry = DeleteOptions {
        dry_run: true,
        ..Default::default()
    };
    assert!(c.delete(&cms, Some("default"), "k", &dry).is_err());
    assert!(c.get(&cms, Some("default"), "k").is_ok());
    // `/status` writes match only rules naming the subresource (ConfigMaps have none;
    // the policy's own status is never matched, nor are the admission resources).
    let status_write = c.update(
        &pol,
        None,
        "keep",
        c.get(&pol, None, "keep").unwrap(),
        Subresource::Status,
        &by("alice"),
    );
    assert!(status_write.is_ok(), "{status_write:?}");
}

#[test]
fn policies_with_bad_expressions_are_refused_when_written() {
    let c = cluster();
    let pol = res(
        &c,
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
    );
    let rules = json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]);
    let mut p = policy("p", "Fail", rules, json!([]), "variables.later == 1");
    p["spec"]["variables"] = json!([{"name": "first", "expression": "variables.later"}, {"name": "later", "expression": "1"}]);
    let e = c.create(&pol, None, p, &opts("t")).unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("spec.variables[0].expression: Invalid value: \"variables.later\": compilation failed: ERROR: <input>:1:10: undefined field 'later'\n | variables.later\n | .........^")
            && !e.message.contains("spec.validations[0]"),
        "{}",
        e.message
    );
}

#[test]
fn undefined_request_and_namespace_fields_refuse_the_policy() {
    let c = cluster();
    let pol = res(
        &c,
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
    );
    let rules = json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]);
    // `request` and `namespaceObject` have fixed types: kube-apiserver's compiler refuses
    // a field they do not have, with cel-go's position and caret.
    let mut p = policy(
        "p",
        "Fail",
        rules.clone(),
        json!([]),
        "request.userInfo.user == 'a' || namespaceObject.metadata.labels.x == 'y'",
    );
    p["spec"]["variables"] = json!([{"name": "u", "expression": "request.userInfo"}]);
    p["spec"]["validations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"expression": "variables.u.nope == '' && params.x == 1"}));
    let e = c.create(&pol, None, p, &opts("t")).unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("spec.validations[0].expression: Invalid value: \"request.userInfo.user == 'a' || namespaceObject.metadata.labels.x == 'y'\": compilation failed: ERROR: <input>:1:17: undefined field 'user'\n | request.userInfo.user == 'a' || namespaceObject.metadata.labels.x == 'y'\n | ................^"),
        "{}",
        e.message
    );
    // The variable's type is `request.userInfo`'s; without paramKind, `params` is undeclared.
    assert!(
        e.message.contains("compilation failed: ERROR: <input>:1:12: undefined field 'nope'\n | variables.u.nope == '' && params.x == 1\n | ...........^\nERROR: <input>:1:27: undeclared reference to 'params' (in container '')\n | variables.u.nope == '' && params.x == 1\n | ..........................^"),
        "{}",
        e.message
    );
    // What the types do have is accepted.
    let ok = policy(
        "ok",
        "Fail",
        rules,
        json!([]),
        "request.userInfo.groups.exists(g, g == 'x') || request.kind.kind == 'ConfigMap' || namespaceObject.metadata.labels.x == 'y' || object.anything.goes",
    );
    c.create(&pol, None, ok, &opts("t")).unwrap();
}

/// A ClusterSPIFFEID policy whose validations are `validations`.
fn csid_policy(name: &str, versions: Value, validations: Value) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["spire.spiffe.io"], "apiVersions": versions,
                "operations": ["CREATE"], "resources": ["clusterspiffeids"],
            }]},
            "validations": validations,
        }
    })
}

#[test]
fn undefined_object_fields_are_status_warnings_not_refusals() {
    let c = cluster();
    install_crd(&c, "spire.spiffe.io_clusterspiffeids.yaml");
    let pol = res(
        &c,
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
    );
    let p = csid_policy(
        "typo",
        json!(["v1alpha1"]),
        json!([
            {"expression": "object.spec.nosuchfield == 'x'",
             "messageExpression": "'bad ' + object.metadata.name"},
            {"expression": "has(object.spec.spiffeIDTemplate) && object.spec.workloadSelectorTemplates.all(s, s != '')"},
            {"expression": "object.spec.?dnsNameTemplates.orValue([]).size() == 0 && object.spec.namespaceSelector.matchLabels.x == 'y'",
             "messageExpression": "'bad ' + object.metadata.nam"},
        ]),
    );
    // Created (kube-apiserver does not refuse it) ...
    let created = c.create(&pol, None, p, &opts("t")).unwrap();
    assert_eq!(created.object["metadata"]["generation"], 1);
    // ... and the policy status controller records what the schema does not have.
    let stored = c.get(&pol, None, "typo").unwrap();
    assert_eq!(stored["status"]["observedGeneration"], 1);
    assert_eq!(
        stored["status"]["typeChecking"],
        json!({"expressionWarnings": [
            {"fieldRef": "spec.validations[0].expression",
             "warning": "spire.spiffe.io/v1alpha1, Kind=ClusterSPIFFEID: ERROR: <input>:1:12: undefined field 'nosuchfield'\n | object.spec.nosuchfield == 'x'\n | ...........^\n"},
            {"fieldRef": "spec.validations[2].messageExpression",
             "warning": "spire.spiffe.io/v1alpha1, Kind=ClusterSPIFFEID: ERROR: <input>:1:25: undefined field 'nam'\n | 'bad ' + object.metadata.nam\n | ........................^\n"},
        ]}),
    );
    // A fix bumps the generation and the warnings go.
    let mut fixed = stored.clone();
    fixed["spec"]["validations"] = json!([{"expression": "object.spec.className != 'x'"}]);
    c.update(&pol, None, "typo", fixed, Subresource::Main, &opts("t"))
        .unwrap();
    let stored = c.get(&pol, None, "typo").unwrap();
    assert_eq!(stored["metadata"]["generation"], 2);
    assert_eq!(stored["status"]["observedGeneration"], 2);
    assert_eq!(stored["status"]["typeChecking"], json!({}));
    // As upstream, a wildcard version is not type-checked at all.
    let wild = csid_policy(
        "wild",
        json!(["*"]),
        json!([{"expression": "object.spec.nosuchfield == 'x'"}]),
    );
    c.create(&pol, None, wild, &opts("t")).unwrap();
    let stored = c.get(&pol, None, "wild").unwrap();
    assert_eq!(stored["status"]["typeChecking"], json!({}));
}
