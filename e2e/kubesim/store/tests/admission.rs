//! ValidatingAdmissionPolicy enforcement in the store: failure policies, subresources,
//! excluded rules, requesting users, and what a denied write leaves behind.

mod common;

use common::{cluster, opts, res};
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
        e.message.contains("spec.variables[0].expression: Invalid value: \"variables.later\": compilation failed: ERROR: <input>: undefined field 'later'")
            && !e.message.contains("spec.validations[0]"),
        "{}",
        e.message
    );
}
