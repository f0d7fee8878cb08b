//! Server-side apply and managedFields through the store.

mod common;

use common::*;
use kubesim_store::{PatchType, Subresource, WriteOptions};
use serde_json::{Value, json};

fn apply(
    c: &kubesim_store::Cluster,
    r: &kubesim_store::ResourceInfo,
    body: Value,
    manager: &str,
    force: bool,
) -> Result<kubesim_store::WriteResult, kubesim_store::ApiError> {
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    c.patch(
        r,
        Some("default"),
        &name,
        PatchType::Apply,
        &body,
        Subresource::Main,
        &WriteOptions {
            force,
            ..opts(manager)
        },
    )
}

fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or_default().to_string(),
                        e["operation"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn apply_creates_conflicts_forces_and_removes_fields() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let body = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": data});
    let created = apply(&c, &cms, body(json!({"x": "1", "y": "1"})), "alice", false).unwrap();
    assert!(created.created);
    assert_eq!(
        managers(&created.object),
        vec![("alice".into(), "Apply".into())]
    );

    // identical re-apply: no write
    let again = apply(&c, &cms, body(json!({"x": "1", "y": "1"})), "alice", false).unwrap();
    assert!(!again.created);
    assert_eq!(rv(&again.object), rv(&created.object));

    // bob conflicts on x
    let e = apply(&c, &cms, body(json!({"x": "2"})), "bob", false).unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("conflict with \"alice\""),
        "{}",
        e.message
    );
    assert!(e.message.contains(".data.x"), "{}", e.message);
    // same value is shared ownership, not a conflict
    apply(&c, &cms, body(json!({"y": "1"})), "bob", false).unwrap();
    // force takes x over
    let forced = apply(&c, &cms, body(json!({"x": "2", "y": "1"})), "bob", true).unwrap();
    assert_eq!(forced.object["data"]["x"], "2");

    // alice stops applying y: still owned by bob, kept; bob stops too: removed
    let a = apply(&c, &cms, body(json!({})), "alice", false).unwrap();
    assert_eq!(a.object["data"]["y"], "1");
    let b = apply(&c, &cms, body(json!({"x": "2"})), "bob", false).unwrap();
    assert!(b.object["data"].get("y").is_none(), "{}", b.object);

    let e = c
        .patch(
            &cms,
            Some("default"),
            "a",
            PatchType::Apply,
            &body(json!({})),
            Subresource::Main,
            &WriteOptions::default(),
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
}

#[test]
fn updates_record_managed_fields() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let o = c
        .create(
            &cms,
            Some("default"),
            json!({"metadata": {"name": "u"}, "data": {"k": "v"}}),
            &opts("kubectl-create"),
        )
        .unwrap()
        .object;
    assert_eq!(
        managers(&o),
        vec![("kubectl-create".into(), "Update".into())]
    );
    let p = c
        .patch(
            &cms,
            Some("default"),
            "u",
            PatchType::Merge,
            &json!({"data": {"j": "w"}}),
            Subresource::Main,
            &opts("editor"),
        )
        .unwrap()
        .object;
    let m = managers(&p);
    assert!(m.contains(&("editor".into(), "Update".into())), "{m:?}");
    assert!(
        m.contains(&("kubectl-create".into(), "Update".into())),
        "{m:?}"
    );
}

#[test]
fn apply_to_custom_resource_status() {
    let c = cluster();
    install_crd(&c, "spire.spiffe.io_clusterspiffeids.yaml");
    let r = res(&c, "spire.spiffe.io", "v1alpha1", "clusterspiffeids");
    let body = json!({
        "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": {"name": "s"}, "spec": {"spiffeIDTemplate": "spiffe://td/x"},
    });
    let o = c
        .patch(
            &r,
            None,
            "s",
            PatchType::Apply,
            &body,
            Subresource::Main,
            &opts("kleym"),
        )
        .unwrap();
    assert!(o.created);
    let status = json!({
        "apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID",
        "metadata": {"name": "s"}, "status": {"stats": {"podsSelected": 4}},
    });
    let s = c
        .patch(
            &r,
            None,
            "s",
            PatchType::Apply,
            &status,
            Subresource::Status,
            &opts("kleym-status"),
        )
        .unwrap()
        .object;
    assert_eq!(s["status"]["stats"]["podsSelected"], 4);
    assert_eq!(s["metadata"]["generation"], 1);
    assert!(
        s["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["manager"] == "kleym-status" && e["subresource"] == "status"),
        "{}",
        s["metadata"]["managedFields"]
    );
    // status apply to a missing object is a 404
    let e = c
        .patch(
            &r,
            None,
            "missing",
            PatchType::Apply,
            &status,
            Subresource::Status,
            &opts("x"),
        )
        .unwrap_err();
    assert_eq!(e.code, 404);
}

#[test]
fn managers_share_finalizers_and_pod_status_is_not_applied_on_main() {
    let c = cluster();
    let cms = res(&c, "", "v1", "configmaps");
    let with_fin = |f: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "fin", "finalizers": [f]}})
    };
    apply(&c, &cms, with_fin("a.example.com/x"), "alice", false).unwrap();
    let o = apply(&c, &cms, with_fin("b.example.com/y"), "bob", false)
        .unwrap()
        .object;
    let mut fins: Vec<&str> = o["metadata"]["finalizers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    fins.sort_unstable();
    assert_eq!(fins, ["a.example.com/x", "b.example.com/y"]);

    let pods = res(&c, "", "v1", "pods");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Running"}});
    let p = apply(&c, &pods, pod, "alice", false).unwrap().object;
    assert_eq!(p["status"]["phase"], "Pending");
    let owns_status = p["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["manager"] == "alice" && e["fieldsV1"].get("f:status").is_some());
    assert!(!owns_status, "{}", p["metadata"]["managedFields"]);
}
