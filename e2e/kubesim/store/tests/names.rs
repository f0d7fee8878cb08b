//! `metadata.name` and `metadata.generateName` validation per resource, as kube-apiserver
//! does it: DNS-1123 subdomains (at most 253 characters in all, no limit per dot-separated
//! part) for most kinds and every custom resource, DNS-1123 labels for namespaces, path
//! segments for RBAC, nothing for core/v1 Events; `generateName` checked as a prefix and
//! cut to 58 characters before the random suffix. Messages are kube-apiserver's.

mod common;

use common::*;
use kubesim_store::{ApiError, PatchType, ResourceInfo, Subresource};
use serde_json::{Value, json};

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// A name of exactly `len` characters whose dot-separated parts are all longer than 63
/// (the old per-part limit kubesim wrongly applied), e.g. `aaaa….bbbb…`.
fn long_parts_name(len: usize) -> String {
    let first = len / 2;
    let second = len - first - 1;
    format!("{}.{}", "a".repeat(first), "b".repeat(second))
}

fn create(
    c: &kubesim_store::Cluster,
    r: &ResourceInfo,
    ns: Option<&str>,
    metadata: Value,
) -> Result<Value, ApiError> {
    let mut obj = json!({"metadata": metadata});
    if r.plural == "clusterspiffeids" {
        obj["apiVersion"] = json!("spire.spiffe.io/v1alpha1");
        obj["kind"] = json!("ClusterSPIFFEID");
        obj["spec"] = json!({"spiffeIDTemplate": "spiffe://td/x", "podSelector": {"matchLabels": {"app": "x"}}});
    }
    c.create(r, ns, obj, &opts("t")).map(|w| w.object)
}

/// The `(field, message)` of each cause of a 422.
fn causes(e: &ApiError) -> Vec<(String, String)> {
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{e:?}");
    e.details.as_ref().unwrap()["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["field"].as_str().unwrap().to_string(),
                c["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every built-in kind named by DNS-1123 subdomain, and a custom resource.
fn subdomain_resources(c: &kubesim_store::Cluster) -> Vec<(ResourceInfo, Option<&'static str>)> {
    install_crd(c, "spire.spiffe.io_clusterspiffeids.yaml");
    vec![
        (res(c, "", "v1", "configmaps"), Some("default")),
        (res(c, "", "v1", "secrets"), Some("default")),
        (res(c, "", "v1", "serviceaccounts"), Some("default")),
        (res(c, "", "v1", "pods"), Some("default")),
        (
            res(c, "coordination.k8s.io", "v1", "leases"),
            Some("default"),
        ),
        (res(c, "events.k8s.io", "v1", "events"), Some("default")),
        (
            res(c, "spire.spiffe.io", "v1alpha1", "clusterspiffeids"),
            None,
        ),
    ]
}

#[test]
fn subdomain_kinds_limit_only_the_whole_name() {
    let c = cluster();
    for (r, ns) in subdomain_resources(&c) {
        let kind = &r.kind;
        // One part of 200 characters, and 253 characters in two long parts: valid.
        for name in ["x".repeat(200), long_parts_name(253)] {
            let got = create(&c, &r, ns, json!({"name": name}))
                .unwrap_or_else(|e| panic!("{kind} {name}: {e:?}"));
            assert_eq!(got["metadata"]["name"], name.as_str(), "{kind}");
        }
        // 254 characters: the length message alone.
        let name = long_parts_name(254);
        let e = create(&c, &r, ns, json!({"name": name})).unwrap_err();
        assert_eq!(
            causes(&e),
            [(
                "metadata.name".to_string(),
                format!("Invalid value: \"{name}\": must be no more than 253 characters")
            )],
            "{kind}"
        );
        // Malformed: the pattern message, in kube-apiserver's full wording.
        let e = create(&c, &r, ns, json!({"name": "Bad_Name"})).unwrap_err();
        assert_eq!(
            e.message,
            format!(
                "{} \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": {SUBDOMAIN_MSG}",
                if r.group.is_empty() {
                    kind.clone()
                } else {
                    format!("{kind}.{}", r.group)
                }
            ),
        );
        for bad in ["a..b", "-a", "a-", "a.", ".a"] {
            assert!(
                create(&c, &r, ns, json!({"name": bad})).is_err(),
                "{kind} {bad}"
            );
        }
    }
}

#[test]
fn server_side_apply_creates_custom_resources_with_long_parts() {
    let c = cluster();
    install_crd(&c, "spire.spiffe.io_clusterspiffeids.yaml");
    let r = res(&c, "spire.spiffe.io", "v1alpha1", "clusterspiffeids");
    // What kleym generates for team-recommendation-serving/llama-3-70b-instruct-perobjective-binding:
    // one 86-character part.
    let name =
        "kleym-team-recommendation-serving-llama-3-70b-instruct-perobjective-binding-0123456789";
    let body = json!({
        "apiVersion": "spire.spiffe.io/v1alpha1",
        "kind": "ClusterSPIFFEID",
        "metadata": {"name": name},
        "spec": {"spiffeIDTemplate": "spiffe://td/x", "podSelector": {"matchLabels": {"app": "x"}}},
    });
    let w = c
        .patch(
            &r,
            None,
            name,
            PatchType::Apply,
            &body,
            Subresource::Main,
            &opts("kleym"),
        )
        .unwrap();
    assert!(w.created);
}

#[test]
fn namespaces_are_dns_labels() {
    let c = cluster();
    let r = res(&c, "", "v1", "namespaces");
    create(&c, &r, None, json!({"name": "n".repeat(63)})).unwrap();
    let long = "n".repeat(64);
    let e = create(&c, &r, None, json!({"name": long})).unwrap_err();
    // The `kubernetes.io/metadata.name` label the server adds is too long as well, and
    // kube-apiserver reports both.
    assert_eq!(
        causes(&e)[0],
        (
            "metadata.name".to_string(),
            format!("Invalid value: \"{long}\": must be no more than 63 characters")
        )
    );
    let e = create(&c, &r, None, json!({"name": "team.a"})).unwrap_err();
    assert_eq!(
        e.message,
        "Namespace \"team.a\" is invalid: metadata.name: Invalid value: \"team.a\": must not contain dots"
    );
    let e = create(&c, &r, None, json!({"name": "Team"})).unwrap_err();
    assert_eq!(
        causes(&e),
        [(
            "metadata.name".to_string(),
            format!("Invalid value: \"Team\": {LABEL_MSG}")
        )]
    );
}

#[test]
fn rbac_names_are_path_segments_of_any_case_and_length() {
    let c = cluster();
    for (plural, ns) in [
        ("roles", Some("default")),
        ("rolebindings", Some("default")),
        ("clusterroles", None),
        ("clusterrolebindings", None),
    ] {
        let r = res(&c, "rbac.authorization.k8s.io", "v1", plural);
        for name in ["system:kube-scheduler", "Upper_Case", &"r".repeat(300)] {
            create(&c, &r, ns, json!({"name": name}))
                .unwrap_or_else(|e| panic!("{plural} {name}: {e:?}"));
        }
        let e = create(&c, &r, ns, json!({"name": ".."})).unwrap_err();
        assert_eq!(
            causes(&e),
            [(
                "metadata.name".to_string(),
                "Invalid value: \"..\": may not be '..'".to_string()
            )],
            "{plural}"
        );
        let e = create(&c, &r, ns, json!({"name": "a/b%c"})).unwrap_err();
        assert_eq!(
            causes(&e),
            [
                (
                    "metadata.name".to_string(),
                    "Invalid value: \"a/b%c\": may not contain '/'".to_string()
                ),
                (
                    "metadata.name".to_string(),
                    "Invalid value: \"a/b%c\": may not contain '%'".to_string()
                ),
            ],
            "{plural}"
        );
    }
}

#[test]
fn core_events_names_are_not_checked_but_events_k8s_io_names_are() {
    let c = cluster();
    let core = res(&c, "", "v1", "events");
    create(
        &c,
        &core,
        Some("default"),
        json!({"name": "Legacy_Event.1"}),
    )
    .unwrap();
    let v1 = res(&c, "events.k8s.io", "v1", "events");
    let e = create(&c, &v1, Some("default"), json!({"name": "New_Event.1"})).unwrap_err();
    assert_eq!(causes(&e)[0].0, "metadata.name");
}

#[test]
fn crd_names_are_plural_dot_group_with_long_group_parts() {
    let c = cluster();
    let r = res(
        &c,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
    );
    // A group with a 70-character part is a valid subdomain in Kubernetes.
    let group = format!("{}.example.com", "g".repeat(70));
    let crd = |name: &str, plural: &str| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {
                "group": group,
                "names": {"plural": plural, "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}}}]
            }
        })
    };
    c.create(
        &r,
        None,
        crd(&format!("widgets.{group}"), "widgets"),
        &opts("t"),
    )
    .unwrap();
    let e = c
        .create(&r, None, crd("widgets.example.com", "widgets"), &opts("t"))
        .unwrap_err();
    assert!(
        causes(&e).contains(&(
            "metadata.name".to_string(),
            "Invalid value: \"widgets.example.com\": must be spec.names.plural+\".\"+spec.group"
                .to_string()
        )),
        "{e:?}"
    );
    // The plural is a DNS-1035 label: it starts with a letter.
    let e = c
        .create(
            &r,
            None,
            crd(&format!("1widgets.{group}"), "1widgets"),
            &opts("t"),
        )
        .unwrap_err();
    assert!(
        causes(&e)
            .iter()
            .any(|(f, m)| f == "spec.names.plural" && m.contains("a DNS-1035 label")),
        "{e:?}"
    );
}

#[test]
fn generate_name_is_cut_to_58_characters_and_checked_as_a_prefix() {
    let c = cluster();
    // A 60-character prefix makes a 63-character namespace name (58 kept + 5 random):
    // valid, as in Kubernetes, where appending to the whole prefix would not be.
    let nss = res(&c, "", "v1", "namespaces");
    let prefix = format!("{}-", "p".repeat(59));
    let got = create(&c, &nss, None, json!({"generateName": prefix})).unwrap();
    let name = got["metadata"]["name"].as_str().unwrap();
    assert_eq!(name.len(), 63, "{name}");
    assert!(name.starts_with(&"p".repeat(58)), "{name}");
    // The prefix itself is still checked against the rule (a 70-character label prefix
    // is too long).
    let long_prefix = format!("{}-", "p".repeat(69));
    let e = create(&c, &nss, None, json!({"generateName": long_prefix})).unwrap_err();
    assert_eq!(
        causes(&e),
        [(
            "metadata.generateName".to_string(),
            format!("Invalid value: \"{long_prefix}\": must be no more than 63 characters")
        )]
    );
    // Subdomain kinds: a 100-character prefix makes a 63-character name.
    let cms = res(&c, "", "v1", "configmaps");
    let got = create(
        &c,
        &cms,
        Some("default"),
        json!({"generateName": "c".repeat(100)}),
    )
    .unwrap();
    assert_eq!(got["metadata"]["name"].as_str().unwrap().len(), 63);

    // An invalid prefix: the generateName and the generated name are both reported.
    let e = create(&c, &cms, Some("default"), json!({"generateName": "Bad-"})).unwrap_err();
    let got = causes(&e);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[0],
        (
            "metadata.generateName".to_string(),
            format!("Invalid value: \"Bad-\": {SUBDOMAIN_MSG}")
        )
    );
    assert_eq!(got[1].0, "metadata.name");
    assert!(got[1].1.starts_with("Invalid value: \"Bad-"), "{got:?}");

    // A generateName given with a name is checked too.
    let e = create(
        &c,
        &cms,
        Some("default"),
        json!({"name": "ok", "generateName": "Bad-"}),
    )
    .unwrap_err();
    assert_eq!(causes(&e)[0].0, "metadata.generateName");

    // RBAC prefixes follow the path-segment rule.
    let roles = res(&c, "rbac.authorization.k8s.io", "v1", "roles");
    let got = create(
        &c,
        &roles,
        Some("default"),
        json!({"generateName": "System:"}),
    )
    .unwrap();
    assert!(
        got["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("System:")
    );
}
