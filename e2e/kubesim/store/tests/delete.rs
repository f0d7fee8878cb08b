//! Finalizers, preconditions, garbage collection and namespace termination.

mod common;

use common::*;
use kubesim_store::{DeleteOptions, ListOptions, PatchType, Subresource, WatchOptions};
use serde_json::{Value, json};

fn cm(name: &str) -> Value {
    json!({"metadata": {"name": name}, "data": {"k": "v"}})
}

fn owned_by(name: &str, owners: &[&Value]) -> Value {
    let refs: Vec<Value> = owners
        .iter()
        .map(|o| {
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "name": o["metadata"]["name"], "uid": o["metadata"]["uid"],
            })
        })
        .collect();
    json!({"metadata": {"name": name, "ownerReferences": refs}})
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let mut o = cm("f");
    o["metadata"]["finalizers"] = json!(["example.com/hold"]);
    c.create(&cms, Some("default"), o, &opts("t")).unwrap();
    let mut w = c
        .watch(
            &cms,
            Some("default"),
            &WatchOptions {
                resource_version: Some(c.current_resource_version().to_string()),
                ..Default::default()
            },
        )
        .unwrap();

    let d = c
        .delete(&cms, Some("default"), "f", &DeleteOptions::default())
        .unwrap();
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 0);
    let live = c.get(&cms, Some("default"), "f").unwrap();
    assert!(live["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(next(&mut w).await.unwrap().event_type, "MODIFIED");

    // deleting again changes nothing
    let rv_before = c.current_resource_version();
    c.delete(&cms, Some("default"), "f", &DeleteOptions::default())
        .unwrap();
    assert_eq!(c.current_resource_version(), rv_before);

    // a new finalizer cannot be added while deleting
    let e = c
        .patch(
            &cms,
            Some("default"),
            "f",
            PatchType::Merge,
            &json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}}),
            Subresource::Main,
            &opts("t"),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("no new finalizers can be added"),
        "{}",
        e.message
    );

    // removing the last finalizer removes the object
    c.patch(
        &cms,
        Some("default"),
        "f",
        PatchType::Merge,
        &json!({"metadata": {"finalizers": null}}),
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    assert_eq!(c.get(&cms, Some("default"), "f").unwrap_err().code, 404);
    assert_eq!(next(&mut w).await.unwrap().event_type, "MODIFIED");
    let del = next(&mut w).await.unwrap();
    assert_eq!(del.event_type, "DELETED");
    assert_eq!(rv(&del.object), c.current_resource_version());
}

#[test]
fn delete_preconditions_and_status_body() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let o = c
        .create(&cms, Some("default"), cm("p"), &opts("t"))
        .unwrap()
        .object;
    let e = c
        .delete(
            &cms,
            Some("default"),
            "p",
            &DeleteOptions {
                precondition_uid: Some("other".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.code, 409);
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition: other")
    );
    let e = c
        .delete(
            &cms,
            Some("default"),
            "p",
            &DeleteOptions {
                precondition_resource_version: Some("1".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.code, 409);
    let body = c
        .delete(
            &cms,
            Some("default"),
            "p",
            &DeleteOptions {
                precondition_uid: Some(o["metadata"]["uid"].as_str().unwrap().into()),
                precondition_resource_version: Some(
                    o["metadata"]["resourceVersion"].as_str().unwrap().into(),
                ),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["status"], "Success");
    assert_eq!(body["details"]["name"], "p");
    assert_eq!(
        c.delete(&cms, Some("default"), "p", &DeleteOptions::default())
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn garbage_collection_follows_owner_references() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let create = |v: Value| {
        c.create(&cms, Some("default"), v, &opts("t"))
            .unwrap()
            .object
    };
    let a = create(cm("owner-a"));
    let b = create(cm("owner-b"));
    create(owned_by("only-a", &[&a]));
    create(owned_by("a-and-b", &[&a, &b]));
    let child = create(owned_by("child", &[&a]));
    create(owned_by("grandchild", &[&child]));

    c.delete(&cms, Some("default"), "owner-a", &DeleteOptions::default())
        .unwrap();
    let exists = |n: &str| c.get(&cms, Some("default"), n).is_ok();
    assert!(!exists("only-a"));
    assert!(!exists("child"));
    assert!(!exists("grandchild"), "GC cascades");
    assert!(exists("a-and-b"), "still has a live owner");
    c.delete(&cms, Some("default"), "owner-b", &DeleteOptions::default())
        .unwrap();
    assert!(!exists("a-and-b"));
}

#[test]
fn orphan_and_foreground_propagation() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let create = |v: Value| {
        c.create(&cms, Some("default"), v, &opts("t"))
            .unwrap()
            .object
    };
    let o = create(cm("o"));
    create(owned_by("dep", &[&o]));
    c.delete(
        &cms,
        Some("default"),
        "o",
        &DeleteOptions {
            propagation_policy: Some("Orphan".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let dep = c.get(&cms, Some("default"), "dep").unwrap();
    assert!(dep["metadata"].get("ownerReferences").is_none());

    let f = create(cm("f"));
    create(owned_by("fdep", &[&f]));
    c.delete(
        &cms,
        Some("default"),
        "f",
        &DeleteOptions {
            propagation_policy: Some("Foreground".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(c.get(&cms, Some("default"), "fdep").unwrap_err().code, 404);
    assert_eq!(c.get(&cms, Some("default"), "f").unwrap_err().code, 404);

    let e = c
        .delete(
            &cms,
            Some("default"),
            "dep",
            &DeleteOptions {
                propagation_policy: Some("Sideways".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
}

#[test]
fn namespace_deletion_removes_content_and_waits_for_finalizers() {
    let c = cluster();
    let ns = res(&c, "", "v1", "namespaces");
    let cms = res(&c, "", "v1", "configmaps");
    let sas = res(&c, "", "v1", "serviceaccounts");
    c.create(&ns, None, json!({"metadata": {"name": "gone"}}), &opts("t"))
        .unwrap();
    c.create(&cms, Some("gone"), cm("a"), &opts("t")).unwrap();
    let d = c
        .delete(&ns, None, "gone", &DeleteOptions::default())
        .unwrap();
    assert_eq!(d["status"]["phase"], "Terminating");
    assert_eq!(c.get(&ns, None, "gone").unwrap_err().code, 404);
    assert_eq!(c.get(&cms, Some("gone"), "a").unwrap_err().code, 404);
    assert_eq!(c.get(&sas, Some("gone"), "default").unwrap_err().code, 404);

    // content with a finalizer keeps the namespace Terminating
    c.create(&ns, None, json!({"metadata": {"name": "slow"}}), &opts("t"))
        .unwrap();
    let mut held = cm("held");
    held["metadata"]["finalizers"] = json!(["example.com/x"]);
    c.create(&cms, Some("slow"), held, &opts("t")).unwrap();
    c.create(&cms, Some("slow"), cm("free"), &opts("t"))
        .unwrap();
    c.delete(&ns, None, "slow", &DeleteOptions::default())
        .unwrap();
    let live = c.get(&ns, None, "slow").unwrap();
    assert_eq!(live["status"]["phase"], "Terminating");
    assert_eq!(c.get(&cms, Some("slow"), "free").unwrap_err().code, 404);
    let e = c
        .create(&cms, Some("slow"), cm("new"), &opts("t"))
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert!(
        e.message.contains("because it is being terminated"),
        "{}",
        e.message
    );
    let e = c
        .delete(&ns, None, "slow", &DeleteOptions::default())
        .unwrap_err();
    assert_eq!(e.code, 409);
    c.patch(
        &cms,
        Some("slow"),
        "held",
        PatchType::Json,
        &json!([{"op": "remove", "path": "/metadata/finalizers"}]),
        Subresource::Main,
        &opts("t"),
    )
    .unwrap();
    assert_eq!(c.get(&ns, None, "slow").unwrap_err().code, 404);
}

#[test]
fn deletecollection_with_selectors() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    for (n, app) in [("a", "x"), ("b", "x"), ("c", "y")] {
        c.create(
            &cms,
            Some("default"),
            json!({"metadata": {"name": n, "labels": {"app": app}}}),
            &opts("t"),
        )
        .unwrap();
    }
    let out = c
        .delete_collection(
            &cms,
            Some("default"),
            &ListOptions {
                label_selector: Some("app=x".into()),
                ..Default::default()
            },
            &DeleteOptions::default(),
        )
        .unwrap();
    assert_eq!(out["items"].as_array().unwrap().len(), 2);
    let left = c
        .list(&cms, Some("default"), &ListOptions::default())
        .unwrap();
    let names: Vec<&str> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["c"]);
    let ns = res(&c, "", "v1", "namespaces");
    assert_eq!(
        c.delete_collection(
            &ns,
            None,
            &ListOptions::default(),
            &DeleteOptions::default()
        )
        .unwrap_err()
        .code,
        405
    );
}

#[test]
fn objects_owned_only_by_absent_owners_are_collected() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let ns = res(&c, "", "v1", "namespaces");
    let foreign = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "elsewhere", "uid": "0000-not-here"});
    let r = c
        .create(
            &cms,
            Some("default"),
            json!({"metadata": {"name": "dangling", "ownerReferences": [foreign]}}),
            &opts("t"),
        )
        .unwrap();
    assert!(r.created);
    assert_eq!(
        c.get(&cms, Some("default"), "dangling").unwrap_err().code,
        404
    );

    // an owner in another namespace does not count
    let other = c
        .create(&cms, Some("kube-system"), cm("owner"), &opts("t"))
        .unwrap()
        .object;
    c.create(
        &cms,
        Some("default"),
        owned_by("cross-ns", &[&other]),
        &opts("t"),
    )
    .unwrap();
    assert_eq!(
        c.get(&cms, Some("default"), "cross-ns").unwrap_err().code,
        404
    );

    // a cluster-scoped owner does
    let owner_ns = c.get(&ns, None, "kube-public").unwrap();
    let mut dep = cm("ns-owned");
    dep["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "v1", "kind": "Namespace", "name": "kube-public",
        "uid": owner_ns["metadata"]["uid"],
    }]);
    c.create(&cms, Some("default"), dep, &opts("t")).unwrap();
    assert!(c.get(&cms, Some("default"), "ns-owned").is_ok());
}
