//! Metadata, create/update/patch and status semantics.

mod common;

use common::*;
use kubesim_store::{DeleteOptions, FieldValidation, PatchType, Subresource, WriteOptions};
use serde_json::json;

fn cm(name: &str, data: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

#[test]
fn initial_namespaces_labels_and_default_service_accounts() {
    let c = cluster();
    let ns = res(&c, "", "v1", "namespaces");
    let sa = res(&c, "", "v1", "serviceaccounts");
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let o = c.get(&ns, None, n).unwrap();
        assert_eq!(o["metadata"]["labels"]["kubernetes.io/metadata.name"], n);
        assert_eq!(o["status"]["phase"], "Active");
        c.get(&sa, Some(n), "default").unwrap();
    }
    // a new namespace gets its default ServiceAccount, and the label cannot be removed
    let created = c
        .create(
            &ns,
            None,
            json!({"metadata": {"name": "team-a"}}),
            &opts("t"),
        )
        .unwrap();
    assert!(created.created);
    c.get(&sa, Some("team-a"), "default").unwrap();
    let mut o = created.object;
    o["metadata"]["labels"] = json!({"x": "y"});
    let upd = c
        .update(&ns, None, "team-a", o, Subresource::Main, &opts("t"))
        .unwrap()
        .object;
    assert_eq!(
        upd["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "team-a"
    );
    assert_eq!(upd["metadata"]["labels"]["x"], "y");
}

#[test]
fn resource_version_is_cluster_wide_monotonic_and_noop_writes_keep_it() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let secrets = res(&c, "", "v1", "secrets");
    let a = c
        .create(
            &cms,
            Some("default"),
            cm("a", json!({"k": "v"})),
            &opts("t"),
        )
        .unwrap()
        .object;
    let s = c
        .create(
            &secrets,
            Some("default"),
            json!({"metadata": {"name": "s"}, "stringData": {"k": "v"}}),
            &opts("t"),
        )
        .unwrap()
        .object;
    assert!(rv(&s) > rv(&a));
    assert_eq!(s["data"]["k"], "dg==");
    assert_eq!(s["type"], "Opaque");
    assert!(s.get("stringData").is_none());
    assert_eq!(c.current_resource_version(), rv(&s));

    // identical update: nothing stored, resourceVersion kept
    let before = c.current_resource_version();
    let same = c
        .update(
            &cms,
            Some("default"),
            "a",
            a.clone(),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(rv(&same), rv(&a));
    assert_eq!(c.current_resource_version(), before);
    // identical merge patch: same
    let p = c
        .patch(
            &cms,
            Some("default"),
            "a",
            PatchType::Merge,
            &json!({"data": {"k": "v"}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(rv(&p), rv(&a));
    assert_eq!(c.current_resource_version(), before);

    // a real change moves it forward
    let changed = c
        .patch(
            &cms,
            Some("default"),
            "a",
            PatchType::Merge,
            &json!({"data": {"k": "w"}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert!(rv(&changed) > before);
    assert_eq!(changed["data"]["k"], "w");
    assert_eq!(changed["metadata"]["uid"], a["metadata"]["uid"]);
    assert_eq!(
        changed["metadata"]["creationTimestamp"],
        a["metadata"]["creationTimestamp"]
    );
}

#[test]
fn create_errors_and_generate_name() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    c.create(&cms, Some("default"), cm("a", json!({})), &opts("t"))
        .unwrap();
    let e = c
        .create(&cms, Some("default"), cm("a", json!({})), &opts("t"))
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "configmaps \"a\" already exists");

    let e = c
        .create(&cms, Some("nope"), cm("a", json!({})), &opts("t"))
        .unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );

    let e = c
        .create(&cms, Some("default"), cm("Bad_Name", json!({})), &opts("t"))
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .starts_with("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"),
        "{}",
        e.message
    );

    let e = c
        .create(&cms, Some("default"), json!({"metadata": {}}), &opts("t"))
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(e.message.contains("name or generateName is required"));

    let g = c
        .create(
            &cms,
            Some("default"),
            json!({"metadata": {"generateName": "gen-"}}),
            &opts("t"),
        )
        .unwrap()
        .object;
    let name = g["metadata"]["name"].as_str().unwrap();
    assert_eq!(name.len(), "gen-".len() + 5);
    assert!(name.starts_with("gen-"));

    let e = c
        .create(
            &cms,
            Some("default"),
            json!({"apiVersion": "v2", "metadata": {"name": "x"}}),
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 400);

    let e = c
        .create(
            &cms,
            Some("default"),
            json!({"metadata": {"name": "x", "namespace": "kube-system"}}),
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 400);
}

#[test]
fn update_conflicts_and_missing_objects() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let a = c
        .create(
            &cms,
            Some("default"),
            cm("a", json!({"k": "1"})),
            &opts("t"),
        )
        .unwrap()
        .object;
    let mut first = a.clone();
    first["data"]["k"] = json!("2");
    c.update(
        &cms,
        Some("default"),
        "a",
        first,
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    // stale resourceVersion
    let mut stale = a.clone();
    stale["data"]["k"] = json!("3");
    let e = c
        .update(
            &cms,
            Some("default"),
            "a",
            stale.clone(),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // without resourceVersion: unconditional
    stale["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let o = c
        .update(
            &cms,
            Some("default"),
            "a",
            stale,
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(o["data"]["k"], "3");
    // update of a missing configmap: 404; of a missing role: created
    let e = c
        .update(
            &cms,
            Some("default"),
            "zz",
            cm("zz", json!({})),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "configmaps \"zz\" not found")
    );
    let roles = res(&c, "rbac.authorization.k8s.io", "v1", "roles");
    let r = c
        .update(
            &roles,
            Some("default"),
            "r",
            json!({"metadata": {"name": "r"}, "rules": []}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap();
    assert!(r.created);
    // name mismatch
    let e = c
        .update(
            &cms,
            Some("default"),
            "a",
            cm("b", json!({})),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 400);
}

#[test]
fn pod_status_is_a_subresource() {
    let c = cluster();
    let pods = res(&c, "", "v1", "pods");
    let p = c
        .create(
            &pods,
            Some("default"),
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Running"}}),
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(p["status"]["phase"], "Pending");
    // main-resource write ignores status
    let mut m = p.clone();
    m["status"]["phase"] = json!("Failed");
    m["spec"]["nodeName"] = json!("n1");
    let o = c
        .update(
            &pods,
            Some("default"),
            "p",
            m,
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(o["status"]["phase"], "Pending");
    assert_eq!(o["spec"]["nodeName"], "n1");
    // status write ignores everything else
    let s = c
        .patch(
            &pods,
            Some("default"),
            "p",
            PatchType::Merge,
            &json!({"spec": {"nodeName": "other"}, "status": {"phase": "Running"}}),
            Subresource::Status,
            &opts("kubelet"),
        )
        .unwrap()
        .object;
    assert_eq!(s["status"]["phase"], "Running");
    assert_eq!(s["spec"]["nodeName"], "n1");
    // configmaps have no status subresource
    let cms = res(&c, "", "v1", "configmaps");
    c.create(&cms, Some("default"), cm("a", json!({})), &opts("t"))
        .unwrap();
    let e = c
        .patch(
            &cms,
            Some("default"),
            "a",
            PatchType::Merge,
            &json!({}),
            Subresource::Status,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 404);
}

#[test]
fn json_and_strategic_patches_on_builtins() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    c.create(
        &cms,
        Some("default"),
        cm("a", json!({"k": "1"})),
        &opts("t"),
    )
    .unwrap();
    let o = c
        .patch(
            &cms,
            Some("default"),
            "a",
            PatchType::Json,
            &json!([{"op": "add", "path": "/data/j", "value": "2"}]),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(o["data"]["j"], "2");
    let o = c
        .patch(
            &cms,
            Some("default"),
            "a",
            PatchType::Strategic,
            &json!({"data": {"s": "3"}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap()
        .object;
    assert_eq!(o["data"]["s"], "3");
    let e = c
        .patch(
            &cms,
            Some("default"),
            "missing",
            PatchType::Merge,
            &json!({}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 404);
    // a resourceVersion inside a patch is a precondition
    let e = c
        .patch(
            &cms,
            Some("default"),
            "a",
            PatchType::Merge,
            &json!({"metadata": {"resourceVersion": "1"}, "data": {"k": "x"}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 409);
}

#[test]
fn dry_run_stores_nothing() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let before = c.current_resource_version();
    let o = WriteOptions {
        dry_run: true,
        ..opts("t")
    };
    let r = c
        .create(&cms, Some("default"), cm("a", json!({})), &o)
        .unwrap();
    assert_eq!(r.object["metadata"]["name"], "a");
    assert_eq!(c.current_resource_version(), before);
    assert_eq!(c.get(&cms, Some("default"), "a").unwrap_err().code, 404);
    let _ = FieldValidation::Strict;
    let _ = DeleteOptions::default();
}

#[test]
fn virtual_resources_are_listed_but_not_stored() {
    let c = cluster();
    let all = c.resources();
    for (g, p) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ("authorization.k8s.io", "localsubjectaccessreviews"),
    ] {
        let r = all
            .iter()
            .find(|r| r.group == g && r.plural == p)
            .unwrap_or_else(|| panic!("{p} missing"));
        assert_eq!(r.verbs, vec!["create"]);
        assert!(r.virtual_only);
        assert_eq!(c.list(r, None, &Default::default()).unwrap_err().code, 405);
    }
    let short = |p: &str| {
        all.iter()
            .find(|r| r.plural == p && r.group.is_empty())
            .unwrap()
            .short_names
            .clone()
    };
    assert_eq!(short("namespaces"), vec!["ns"]);
    assert_eq!(short("pods"), vec!["po"]);
    assert_eq!(short("serviceaccounts"), vec!["sa"]);
    assert_eq!(short("configmaps"), vec!["cm"]);
    assert_eq!(short("events"), vec!["ev"]);
    let sa = all.iter().find(|r| r.plural == "serviceaccounts").unwrap();
    assert_eq!(sa.subresources[0].name, "token");
    let crd = all
        .iter()
        .find(|r| r.plural == "customresourcedefinitions")
        .unwrap();
    assert_eq!(crd.short_names, vec!["crd", "crds"]);
    assert!(crd.has_status && !crd.namespaced);
    assert!(
        all.iter()
            .any(|r| r.group == "events.k8s.io" && r.plural == "events")
    );
    assert!(
        all.iter()
            .any(|r| r.group == "coordination.k8s.io" && r.plural == "leases")
    );
    for p in [
        "roles",
        "clusterroles",
        "rolebindings",
        "clusterrolebindings",
    ] {
        assert!(
            all.iter()
                .any(|r| r.group == "rbac.authorization.k8s.io" && r.plural == p)
        );
    }
}

#[test]
fn invalid_labels_are_rejected() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let e = c
        .create(
            &cms,
            Some("default"),
            json!({"metadata": {"name": "l", "labels": {"app": "not valid"}}}),
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message.starts_with(
            "ConfigMap \"l\" is invalid: metadata.labels: Invalid value: \"not valid\""
        ),
        "{}",
        e.message
    );
}

#[test]
fn concurrent_writers_get_distinct_increasing_resource_versions() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let start = c.current_resource_version();
    let per_thread = 100;
    let rvs: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let c = &c;
                let cms = &cms;
                s.spawn(move || {
                    (0..per_thread)
                        .map(|i| {
                            rv(&c
                                .create(
                                    cms,
                                    Some("default"),
                                    cm(&format!("t{t}-{i}"), json!({})),
                                    &opts("t"),
                                )
                                .unwrap()
                                .object)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut sorted = rvs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        4 * per_thread,
        "every write got its own resourceVersion"
    );
    assert!(sorted[0] > start);
    assert_eq!(*sorted.last().unwrap(), c.current_resource_version());
    assert!(c.object_count() >= 4 * per_thread);
}

#[test]
fn immutable_configmaps_keep_their_data() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let mut o = cm("frozen", json!({"k": "v"}));
    o["immutable"] = json!(true);
    c.create(&cms, Some("default"), o, &opts("t")).unwrap();
    let e = c
        .patch(
            &cms,
            Some("default"),
            "frozen",
            PatchType::Merge,
            &json!({"data": {"k": "w"}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("data: Forbidden: field is immutable when `immutable` is set"),
        "{}",
        e.message
    );
    // metadata may still change
    c.patch(
        &cms,
        Some("default"),
        "frozen",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"a": "b"}}}),
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
}

#[test]
fn rbac_names_are_path_segments() {
    let c = cluster();
    let cr = res(&c, "rbac.authorization.k8s.io", "v1", "clusterroles");
    c.create(
        &cr,
        None,
        json!({"metadata": {"name": "system:auth-delegator"}, "rules": []}),
        &opts("t"),
    )
    .unwrap();
    let e = c
        .create(
            &cr,
            None,
            json!({"metadata": {"name": "a/b"}, "rules": []}),
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .ends_with("metadata.name: Invalid value: \"a/b\": may not contain '/'"),
        "{}",
        e.message
    );
    let cms = res(&c, "", "v1", "configmaps");
    assert_eq!(
        c.create(&cms, Some("default"), cm("system:x", json!({})), &opts("t"))
            .unwrap_err()
            .code,
        422
    );
}

#[test]
fn write_counts_ignore_no_op_writes() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let count =
        |c: &kubesim_store::Cluster| c.write_counts().get("configmaps").copied().unwrap_or(0);
    assert_eq!(count(&c), 0);
    let o = c
        .create(
            &cms,
            Some("default"),
            cm("w", json!({"k": "v"})),
            &opts("t"),
        )
        .unwrap()
        .object;
    c.update(
        &cms,
        Some("default"),
        "w",
        o.clone(),
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    assert_eq!(count(&c), 1);
    c.patch(
        &cms,
        Some("default"),
        "w",
        PatchType::Merge,
        &json!({"data": {"k": "x"}}),
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    c.delete(&cms, Some("default"), "w", &DeleteOptions::default())
        .unwrap();
    assert_eq!(count(&c), 3);
    assert_eq!(c.write_counts()["namespaces"], 4);
}
