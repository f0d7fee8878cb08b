//! Server-side apply: ownership, conflicts, force, pruning, list semantics, status
//! separation, no-op applies and the FieldsV1 encoding.

mod common;

use common::*;
use kubesim_apply::{ApplyError, ApplyRequest, TypeInfo, record_update, server_side_apply};
use serde_json::{Value, json};

fn deployment(replicas: i64) -> Value {
    yaml(&format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: nginx
  namespace: default
  labels: {{app: nginx}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: nginx}}}}
  template:
    metadata: {{labels: {{app: nginx}}}}
    spec:
      containers:
      - name: nginx
        image: nginx:1.14.2
        ports:
        - containerPort: 80
"#
    ))
}

fn deploy_ti() -> TypeInfo {
    TypeInfo::builtin("apps/v1", "Deployment")
}

/// Simulate `kubectl create` (an Update by another manager) of `obj`.
fn created_by(manager: &str, obj: &Value, ti: &TypeInfo) -> Value {
    let mut new = obj.clone();
    record_update(None, &mut new, ti, manager, None, T0);
    new
}

#[test]
fn create_by_apply_records_the_kubernetes_docs_example() {
    // From the kubernetes.io server-side apply page: a ConfigMap applied by "kubectl".
    let cfg = yaml(
        r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: test-cm
  namespace: default
  labels:
    test-label: test
data:
  key: some value
"#,
    );
    let ti = TypeInfo::builtin("v1", "ConfigMap");
    let out = apply(None, &cfg, &ti, "kubectl", T0).unwrap();
    assert_eq!(content(&out), cfg);
    let expected = yaml(
        r#"
- manager: kubectl
  operation: Apply
  apiVersion: v1
  time: "2026-01-01T00:00:00Z"
  fieldsType: FieldsV1
  fieldsV1:
    f:metadata:
      f:labels:
        f:test-label: {}
    f:data:
      f:key: {}
"#,
    );
    assert_eq!(out["metadata"]["managedFields"], expected);
}

#[test]
fn deployment_apply_fields_match_kube_apiserver() {
    let out = apply(None, &deployment(3), &deploy_ti(), "kubectl", T0).unwrap();
    let expected = yaml(
        r#"
f:metadata:
  f:labels:
    f:app: {}
f:spec:
  f:replicas: {}
  f:selector: {}
  f:template:
    f:metadata:
      f:labels:
        f:app: {}
    f:spec:
      f:containers:
        k:{"name":"nginx"}:
          .: {}
          f:image: {}
          f:name: {}
          f:ports:
            k:{"containerPort":80,"protocol":"TCP"}:
              .: {}
              f:containerPort: {}
"#,
    );
    assert_eq!(fields(&out, "kubectl", "Apply"), &expected);
}

#[test]
fn real_managed_fields_round_trip_unchanged() {
    // A status entry as kube-controller-manager writes it (from a real
    // `kubectl get deploy -o yaml --show-managed-fields`).
    let kcm_fields = yaml(
        r#"
f:metadata:
  f:annotations:
    .: {}
    f:deployment.kubernetes.io/revision: {}
f:status:
  f:conditions:
    .: {}
    k:{"type":"Available"}:
      .: {}
      f:lastTransitionTime: {}
      f:lastUpdateTime: {}
      f:message: {}
      f:reason: {}
      f:status: {}
      f:type: {}
    k:{"type":"Progressing"}:
      .: {}
      f:lastTransitionTime: {}
      f:lastUpdateTime: {}
      f:message: {}
      f:reason: {}
      f:status: {}
      f:type: {}
  f:observedGeneration: {}
"#,
    );
    let mut live = deployment(1);
    live["metadata"]["annotations"] = json!({"deployment.kubernetes.io/revision": "1"});
    live["status"] = json!({"observedGeneration": 1, "conditions": [
        {"type": "Available", "status": "True", "reason": "R", "message": "m", "lastTransitionTime": T0, "lastUpdateTime": T0},
        {"type": "Progressing", "status": "True", "reason": "R", "message": "m", "lastTransitionTime": T0, "lastUpdateTime": T0}
    ]});
    live["metadata"]["managedFields"] = json!([{
        "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
        "time": T0, "fieldsType": "FieldsV1", "fieldsV1": kcm_fields.clone()
    }]);
    // A different manager applies an unrelated field; the kcm entry must survive verbatim.
    let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nginx", "namespace": "default"}, "spec": {"paused": true}});
    let out = apply(Some(&live), &cfg, &deploy_ti(), "pauser", T1).unwrap();
    assert_eq!(
        fields(&out, "kube-controller-manager", "Update"),
        &kcm_fields
    );
    assert_eq!(
        fields(&out, "pauser", "Apply"),
        &json!({"f:spec": {"f:paused": {}}})
    );
    assert_eq!(out["spec"]["paused"], true);
}

#[test]
fn conflict_message_single_and_plural() {
    let ti = deploy_ti();
    let live = created_by("kubectl-client-side-apply", &deployment(1), &ti);
    let err = apply(Some(&live), &deployment(3), &ti, "mgr", T1).unwrap_err();
    match err {
        ApplyError::Conflict { message, conflicts } => {
            assert_eq!(
                message,
                "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas"
            );
            assert_eq!(
                conflicts,
                vec![(
                    "kubectl-client-side-apply".to_string(),
                    ".spec.replicas".to_string()
                )]
            );
        }
        other => panic!("unexpected {other:?}"),
    }

    let mut cfg = deployment(3);
    cfg["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.25");
    let err = apply(Some(&live), &cfg, &ti, "mgr", T1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 2 conflicts: conflicts with \"kubectl-client-side-apply\" using apps/v1:\n\
         - .spec.replicas\n\
         - .spec.template.spec.containers[name=\"nginx\"].image"
    );
}

#[test]
fn conflicts_with_an_applier_and_a_status_writer_are_named_like_upstream() {
    let ti = TypeInfo::deduced();
    let base = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": {"a": 1, "b": 1}});
    let live = apply(None, &base, &ti, "alice", T0).unwrap();
    let cfg = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": {"a": 2, "b": 2}});
    let err = apply(Some(&live), &cfg, &ti, "bob", T1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 2 conflicts: conflicts with \"alice\":\n- .spec.a\n- .spec.b"
    );

    let ti = TypeInfo::deduced().with_status_subresource(true);
    let mut live = apply(None, &base, &ti, "alice", T0).unwrap();
    let old = live.clone();
    live["status"] = json!({"phase": "Up"});
    record_update(Some(&old), &mut live, &ti, "ctl", Some("status"), T1);
    let status_cfg = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "status": {"phase": "Down"}});
    let r = ApplyRequest {
        manager: "other",
        force: false,
        subresource: Some("status"),
        now: T2,
    };
    let err = server_side_apply(Some(&live), &status_cfg, &ti, &r).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"ctl\" with subresource \"status\" using v1: .status.phase"
    );
}

#[test]
fn same_value_is_shared_ownership_without_conflict() {
    let ti = deploy_ti();
    let live = created_by("kubectl-client-side-apply", &deployment(3), &ti);
    let out = apply(Some(&live), &deployment(3), &ti, "mgr", T1).unwrap();
    assert_eq!(content(&out), content(&live));
    for (m, op) in [("mgr", "Apply"), ("kubectl-client-side-apply", "Update")] {
        assert_eq!(
            fields(&out, m, op)["f:spec"]["f:replicas"],
            json!({}),
            "{m}"
        );
    }
}

#[test]
fn force_takes_ownership_from_other_managers() {
    let ti = deploy_ti();
    let live = created_by("kubectl-client-side-apply", &deployment(1), &ti);
    let r = ApplyRequest {
        manager: "mgr",
        force: true,
        subresource: None,
        now: T1,
    };
    let out = server_side_apply(Some(&live), &deployment(3), &ti, &r).unwrap();
    assert_eq!(out["spec"]["replicas"], 3);
    assert!(
        fields(&out, "mgr", "Apply")["f:spec"]
            .get("f:replicas")
            .is_some()
    );
    let other = fields(&out, "kubectl-client-side-apply", "Update");
    assert!(other["f:spec"].get("f:replicas").is_none());
    // Fields that did not change stay shared.
    assert!(other["f:spec"].get("f:selector").is_some());
}

#[test]
fn omitted_fields_are_removed_unless_someone_else_owns_them() {
    let ti = TypeInfo::deduced();
    let obj = |spec: Value| json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": spec});
    let a1 = apply(
        None,
        &obj(json!({"a": 1, "b": 1, "c": {"d": 1}})),
        &ti,
        "alice",
        T0,
    )
    .unwrap();
    // Bob shares "b" (same value).
    let a2 = apply(Some(&a1), &obj(json!({"b": 1})), &ti, "bob", T1).unwrap();
    // An updater changes c.d and so owns it.
    let mut a3 = a2.clone();
    a3["spec"]["c"]["d"] = json!(2);
    record_update(Some(&a2), &mut a3, &ti, "editor", None, T1);
    // Alice now applies only "a".
    let out = apply(Some(&a3), &obj(json!({"a": 1})), &ti, "alice", T2).unwrap();
    assert_eq!(out["spec"], json!({"a": 1, "b": 1, "c": {"d": 2}}));
    // Bob stops applying "b": nobody owns it any more, so it goes; an empty apply leaves
    // bob owning nothing, so his entry goes too.
    let empty = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}});
    let out = apply(Some(&out), &empty, &ti, "bob", T2).unwrap();
    assert_eq!(out["spec"], json!({"a": 1, "c": {"d": 2}}));
    assert!(entry(&out, "bob", "Apply").is_none());
    assert!(entry(&out, "alice", "Apply").is_some());
}

#[test]
fn map_lists_merge_by_key_and_items_are_owned_separately() {
    // ClusterProfile status.accessProviders: x-kubernetes-list-type map keyed by name.
    let ti = TypeInfo::from_schema(&crd_schema("multicluster.x-k8s.io_clusterprofiles.yaml"));
    let cp = |providers: Value| {
        json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
               "metadata": {"name": "c1", "namespace": "fleet"},
               "status": {"accessProviders": providers}})
    };
    let one = apply(
        None,
        &cp(json!([{"name": "a", "cluster": {"server": "https://a"}}])),
        &ti,
        "pa",
        T0,
    )
    .unwrap();
    let two = apply(
        Some(&one),
        &cp(json!([{"name": "b", "cluster": {"server": "https://b"}}])),
        &ti,
        "pb",
        T1,
    )
    .unwrap();
    let names: Vec<&str> = two["status"]["accessProviders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        fields(&two, "pb", "Apply"),
        &json!({"f:status": {"f:accessProviders": {"k:{\"name\":\"b\"}": {".": {}, "f:name": {}, "f:cluster": {"f:server": {}}}}}})
    );
    // "pa" withdraws its item: only that item goes.
    let out = apply(Some(&two), &cp(json!([])), &ti, "pa", T2).unwrap();
    assert_eq!(
        out["status"]["accessProviders"],
        json!([{"name": "b", "cluster": {"server": "https://b"}}])
    );
    // Changing b's server conflicts with pb on that field only.
    let err = apply(
        Some(&two),
        &cp(json!([{"name": "b", "cluster": {"server": "https://x"}}])),
        &ti,
        "pa",
        T2,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"pb\": .status.accessProviders[name=\"b\"].cluster.server"
    );
}

#[test]
fn finalizers_are_a_set_and_owner_references_a_map_keyed_by_uid() {
    let ti = TypeInfo::deduced();
    let obj = |fin: Value, owners: Value| json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x", "finalizers": fin, "ownerReferences": owners}});
    let owner = |uid: &str| json!({"apiVersion": "v1", "kind": "O", "name": uid, "uid": uid});
    let a = apply(
        None,
        &obj(json!(["a/f"]), json!([owner("u1")])),
        &ti,
        "alice",
        T0,
    )
    .unwrap();
    let b = apply(
        Some(&a),
        &obj(json!(["b/f"]), json!([owner("u2")])),
        &ti,
        "bob",
        T1,
    )
    .unwrap();
    assert_eq!(b["metadata"]["finalizers"], json!(["a/f", "b/f"]));
    assert_eq!(
        b["metadata"]["ownerReferences"].as_array().unwrap().len(),
        2
    );
    let bob = fields(&b, "bob", "Apply");
    assert!(bob["f:metadata"]["f:finalizers"].get("v:\"b/f\"").is_some());
    assert!(
        bob["f:metadata"]["f:ownerReferences"]
            .get("k:{\"uid\":\"u2\"}")
            .is_some()
    );
    let c = apply(Some(&b), &obj(json!([]), json!([])), &ti, "alice", T2).unwrap();
    assert_eq!(c["metadata"]["finalizers"], json!(["b/f"]));
    assert_eq!(c["metadata"]["ownerReferences"], json!([owner("u2")]));
}

#[test]
fn untracked_metadata_never_appears_in_managed_fields() {
    let ti = TypeInfo::deduced();
    let cfg = json!({"apiVersion": "v1", "kind": "X", "metadata": {
        "name": "x", "namespace": "n", "uid": "u", "resourceVersion": "7", "generation": 3,
        "creationTimestamp": T0, "labels": {"l": "v"}, "annotations": {"a": "b"}}});
    let out = apply(None, &cfg, &ti, "m", T0).unwrap();
    assert_eq!(
        fields(&out, "m", "Apply"),
        &json!({"f:metadata": {"f:labels": {"f:l": {}}, "f:annotations": {"f:a": {}}}})
    );
}

#[test]
fn atomic_lists_and_maps_are_owned_whole() {
    // ClusterSPIFFEID: workloadSelectorTemplates has no list-type (atomic in CRDs),
    // namespaceSelector is x-kubernetes-map-type: atomic.
    let ti = TypeInfo::from_schema(&crd_schema("spire.spiffe.io_clusterspiffeids.yaml"));
    let csid = |sels: Value, ns: Value| {
        json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID", "metadata": {"name": "c"},
               "spec": {"spiffeIDTemplate": "spiffe://td/x", "workloadSelectorTemplates": sels, "namespaceSelector": ns}})
    };
    let ns = json!({"matchLabels": {"kubernetes.io/metadata.name": "n"}});
    let a = apply(
        None,
        &csid(json!(["k8s:ns:n", "k8s:sa:s"]), ns.clone()),
        &ti,
        "kleym",
        T0,
    )
    .unwrap();
    assert_eq!(
        fields(&a, "kleym", "Apply"),
        &json!({"f:spec": {"f:spiffeIDTemplate": {}, "f:workloadSelectorTemplates": {}, "f:namespaceSelector": {}}})
    );
    let err = apply(
        Some(&a),
        &csid(json!(["k8s:ns:n"]), ns.clone()),
        &ti,
        "other",
        T1,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"kleym\": .spec.workloadSelectorTemplates"
    );
    let r = ApplyRequest {
        manager: "other",
        force: true,
        subresource: None,
        now: T1,
    };
    let b = server_side_apply(Some(&a), &csid(json!(["k8s:ns:n"]), ns), &ti, &r).unwrap();
    assert_eq!(b["spec"]["workloadSelectorTemplates"], json!(["k8s:ns:n"]));
    assert!(
        fields(&b, "kleym", "Apply")["f:spec"]
            .get("f:workloadSelectorTemplates")
            .is_none()
    );
}

#[test]
fn preserve_unknown_fields_subtrees_are_granular_maps_with_atomic_lists() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
    let ti = TypeInfo::from_schema(&schema);
    let cfg =
        |v: Value| json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": v});
    let a = apply(
        None,
        &cfg(json!({"m": {"k": 1}, "l": [1, 2]})),
        &ti,
        "a",
        T0,
    )
    .unwrap();
    assert_eq!(
        fields(&a, "a", "Apply"),
        &json!({"f:spec": {"f:m": {".": {}, "f:k": {}}, "f:l": {}}})
    );
    let b = apply(Some(&a), &cfg(json!({"m": {"j": 2}})), &ti, "b", T1).unwrap();
    assert_eq!(b["spec"]["m"], json!({"k": 1, "j": 2}));
}

#[test]
fn status_is_separate_from_the_main_resource() {
    let ti = TypeInfo::from_schema(&crd_schema("multicluster.x-k8s.io_clusterprofiles.yaml"))
        .with_status_subresource(true);
    let cfg = json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
        "metadata": {"name": "c1", "namespace": "fleet"},
        "spec": {"displayName": "one", "clusterManager": {"name": "ocm"}},
        "status": {"conditions": [{"type": "ControlPlaneHealthy", "status": "True"}]}});
    // Main resource: status ignored.
    let main = apply(None, &cfg, &ti, "hub", T0).unwrap();
    assert!(main.get("status").is_none());
    assert!(fields(&main, "hub", "Apply").get("f:status").is_none());
    // Status subresource: spec and metadata ignored, entry marked subresource: status.
    let mut cfg2 = cfg.clone();
    cfg2["spec"]["displayName"] = json!("changed");
    cfg2["metadata"]["labels"] = json!({"x": "y"});
    let r = ApplyRequest {
        manager: "hub",
        force: false,
        subresource: Some("status"),
        now: T1,
    };
    let st = server_side_apply(Some(&main), &cfg2, &ti, &r).unwrap();
    assert_eq!(st["spec"]["displayName"], "one");
    assert!(st["metadata"].get("labels").is_none());
    assert_eq!(st["status"]["conditions"][0]["type"], "ControlPlaneHealthy");
    let e = entry_sub(&st, "hub", "Apply", Some("status")).unwrap();
    assert_eq!(
        e["fieldsV1"],
        json!({"f:status": {"f:conditions": {"k:{\"type\":\"ControlPlaneHealthy\"}": {".": {}, "f:type": {}, "f:status": {}}}}})
    );
    // The main-resource entry is untouched, and a later main apply keeps status.
    assert_eq!(entry(&st, "hub", "Apply"), entry(&main, "hub", "Apply"));
    let again = apply(Some(&st), &cfg, &ti, "hub", T2).unwrap();
    assert_eq!(again, st);
}

#[test]
fn a_no_op_apply_returns_live_unchanged() {
    let ti = deploy_ti();
    let first = apply(None, &deployment(3), &ti, "kleym", T0).unwrap();
    let second = apply(Some(&first), &deployment(3), &ti, "kleym", T2).unwrap();
    assert_eq!(second, first);
    assert_eq!(entry(&second, "kleym", "Apply").unwrap()["time"], T0);
    // A real change bumps the time.
    let third = apply(Some(&first), &deployment(4), &ti, "kleym", T2).unwrap();
    assert_eq!(entry(&third, "kleym", "Apply").unwrap()["time"], T2);
}

#[test]
fn record_update_transfers_ownership_and_merges_entries() {
    let ti = deploy_ti();
    let live = apply(None, &deployment(3), &ti, "kleym", T0).unwrap();
    let mut scaled = live.clone();
    scaled["spec"]["replicas"] = json!(5);
    record_update(Some(&live), &mut scaled, &ti, "hpa", None, T1);
    assert_eq!(
        fields(&scaled, "hpa", "Update"),
        &json!({"f:spec": {"f:replicas": {}}})
    );
    assert!(
        fields(&scaled, "kleym", "Apply")["f:spec"]
            .get("f:replicas")
            .is_none()
    );
    // The applier now conflicts with the updater.
    let err = apply(Some(&scaled), &deployment(3), &ti, "kleym", T2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"hpa\" using apps/v1: .spec.replicas"
    );
    // A second update by the same manager merges into one entry with the union.
    let mut again = scaled.clone();
    again["spec"]["paused"] = json!(true);
    record_update(Some(&scaled), &mut again, &ti, "hpa", None, T2);
    let hpa: Vec<&Value> = again["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["manager"] == "hpa")
        .collect();
    assert_eq!(hpa.len(), 1);
    assert_eq!(
        hpa[0]["fieldsV1"],
        json!({"f:spec": {"f:paused": {}, "f:replicas": {}}})
    );
    assert_eq!(hpa[0]["time"], T2);
    // A no-op update leaves managedFields as they were.
    let mut same = again.clone();
    record_update(Some(&again), &mut same, &ti, "someone", None, T2);
    assert_eq!(same, again);
}

#[test]
fn record_update_on_create_owns_everything_but_untracked_metadata() {
    let ti = TypeInfo::deduced();
    let mut obj = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x", "uid": "u", "labels": {"a": "b"}}, "spec": {"n": 1}});
    record_update(None, &mut obj, &ti, "kubectl-create", None, T0);
    assert_eq!(
        fields(&obj, "kubectl-create", "Update"),
        &json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}, "f:spec": {".": {}, "f:n": {}}})
    );
    assert_eq!(
        entry(&obj, "kubectl-create", "Update").unwrap()["apiVersion"],
        "v1"
    );
}

#[test]
fn removing_a_field_by_update_removes_it_from_its_owners() {
    let ti = TypeInfo::deduced();
    let cfg = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": {"a": 1, "b": 2}});
    let live = apply(None, &cfg, &ti, "alice", T0).unwrap();
    let mut new = live.clone();
    new["spec"].as_object_mut().unwrap().remove("b");
    record_update(Some(&live), &mut new, &ti, "editor", None, T1);
    // Deduced types: "spec" is a map key, hence a member of its own.
    assert_eq!(
        fields(&new, "alice", "Apply"),
        &json!({"f:spec": {".": {}, "f:a": {}}})
    );
    assert!(entry(&new, "editor", "Update").is_none());
}

#[test]
fn malformed_applies_are_rejected() {
    let ti = TypeInfo::from_schema(&crd_schema("multicluster.x-k8s.io_clusterprofiles.yaml"));
    let cfg = json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile", "metadata": {"name": "c"},
        "status": {"accessProviders": [{"cluster": {}}]}});
    let err = apply(None, &cfg, &ti, "m", T0).unwrap_err();
    assert!(matches!(err, ApplyError::Invalid(_)));
    assert_eq!(
        err.to_string(),
        "failed to create typed patch object (multicluster.x-k8s.io/v1alpha1, Kind=ClusterProfile): \
         .status.accessProviders: element 0: associative list with keys has an element that omits key field \"name\" (and doesn't have default value)"
    );
    let with_mf = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x", "managedFields": [{"manager": "m"}]}});
    assert_eq!(
        apply(None, &with_mf, &TypeInfo::deduced(), "m", T0)
            .unwrap_err()
            .to_string(),
        "metadata.managedFields must be nil"
    );
    assert!(apply(None, &json!({"kind": "X"}), &TypeInfo::deduced(), "", T0).is_err());
}

#[test]
fn unmanaged_objects_are_owned_by_before_first_apply() {
    let ti = TypeInfo::deduced();
    let live = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": {"a": 1, "b": 1}});
    let cfg = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": {"a": 2}});
    let err = apply(Some(&live), &cfg, &ti, "m", T1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"before-first-apply\" using v1: .spec.a"
    );
    let cfg = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": {"a": 1}});
    let out = apply(Some(&live), &cfg, &ti, "m", T1).unwrap();
    assert!(
        fields(&out, "before-first-apply", "Update")["f:spec"]
            .get("f:b")
            .is_some()
    );
}

#[test]
fn update_managers_are_capped_into_ancient_changes() {
    let ti = TypeInfo::deduced();
    let mut obj = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "spec": {}});
    record_update(None, &mut obj, &ti, "creator", None, "2026-01-01T00:00:00Z");
    for i in 0..11 {
        let old = obj.clone();
        obj["spec"][format!("f{i}")] = json!(i);
        record_update(
            Some(&old),
            &mut obj,
            &ti,
            &format!("w{i:02}"),
            None,
            &format!("2026-01-01T00:00:{:02}Z", i + 1),
        );
    }
    let mf = obj["metadata"]["managedFields"].as_array().unwrap();
    assert_eq!(mf.len(), 10);
    let ancient = entry(&obj, "ancient-changes", "Update").unwrap();
    // The 11th updater merged creator (oldest) and w00 into the bucket, the 12th merged w01
    // into it; the bucket carries the newest merged time.
    assert_eq!(ancient["time"], "2026-01-01T00:00:02Z");
    assert!(ancient["fieldsV1"]["f:spec"].get("f:f0").is_some());
    assert!(ancient["fieldsV1"]["f:spec"].get("f:f1").is_some());
    for gone in ["creator", "w00", "w01"] {
        assert!(entry(&obj, gone, "Update").is_none(), "{gone}");
    }
    assert!(entry(&obj, "w10", "Update").is_some());
}

#[test]
fn fields_unknown_to_a_crd_schema_are_neither_set_nor_owned() {
    let ti = TypeInfo::from_schema(&crd_schema("spire.spiffe.io_clusterspiffeids.yaml"));
    let cfg = json!({"apiVersion": "spire.spiffe.io/v1alpha1", "kind": "ClusterSPIFFEID", "metadata": {"name": "c"},
                     "spec": {"spiffeIDTemplate": "spiffe://td/x", "bogus": 1}, "alsoBogus": true});
    let out = apply(None, &cfg, &ti, "m", T0).unwrap();
    assert_eq!(out["spec"], json!({"spiffeIDTemplate": "spiffe://td/x"}));
    assert!(out.get("alsoBogus").is_none());
    assert_eq!(
        fields(&out, "m", "Apply"),
        &json!({"f:spec": {"f:spiffeIDTemplate": {}}})
    );
    // Re-applying the same (still bogus) config is a no-op.
    assert_eq!(apply(Some(&out), &cfg, &ti, "m", T1).unwrap(), out);
}

#[test]
fn kubectl_server_side_apply_takes_over_from_client_side_apply() {
    let ti = deploy_ti();
    const ANN: &str = "kubectl.kubernetes.io/last-applied-configuration";
    let mut csa = deployment(1);
    csa["metadata"]["annotations"] = json!({ANN: serde_json::to_string(&deployment(1)).unwrap()});
    let live = created_by("kubectl-client-side-apply", &csa, &ti);

    // Another manager conflicts as usual.
    assert!(matches!(
        apply(Some(&live), &deployment(3), &ti, "other", T1),
        Err(ApplyError::Conflict { .. })
    ));
    // kubectl's own server-side apply does not: the annotation vouches for replicas=1.
    let out = apply(Some(&live), &deployment(3), &ti, "kubectl", T1).unwrap();
    assert_eq!(out["spec"]["replicas"], 3);
    assert!(
        fields(&out, "kubectl", "Apply")["f:spec"]
            .get("f:replicas")
            .is_some()
    );
    assert!(
        fields(&out, "kubectl-client-side-apply", "Update")["f:spec"]
            .get("f:replicas")
            .is_none()
    );
    let ann: Value =
        serde_json::from_str(out["metadata"]["annotations"][ANN].as_str().unwrap()).unwrap();
    assert_eq!(ann, deployment(3));
    assert!(
        out["metadata"]["annotations"][ANN]
            .as_str()
            .unwrap()
            .ends_with('\n')
    );

    // A field changed behind the annotation's back (by an updater) still conflicts.
    let mut scaled = live.clone();
    scaled["spec"]["replicas"] = json!(5);
    record_update(Some(&live), &mut scaled, &ti, "hpa", None, T1);
    let err = apply(Some(&scaled), &deployment(3), &ti, "kubectl", T2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 1 conflict: conflict with \"hpa\" using apps/v1: .spec.replicas"
    );
}

#[test]
fn updates_of_unmanaged_objects_stay_untracked() {
    let ti = TypeInfo::deduced();
    let old = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x", "uid": "u"}, "spec": {"a": 1}});
    let mut new = old.clone();
    new["spec"]["a"] = json!(2);
    record_update(Some(&old), &mut new, &ti, "editor", None, T1);
    assert!(new["metadata"].get("managedFields").is_none());
    // Resetting managedFields to [] by an update also leaves the object unmanaged.
    let mut managed = old.clone();
    record_update(None, &mut managed, &ti, "creator", None, T0);
    let mut reset = managed.clone();
    reset["metadata"]["managedFields"] = json!([]);
    record_update(Some(&managed), &mut reset, &ti, "editor", None, T1);
    assert!(reset["metadata"].get("managedFields").is_none());
}

#[test]
fn embedded_resources_get_object_meta_typing() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "template": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}}}}});
    let ti = TypeInfo::from_schema(&schema);
    let cfg = |fins: Value| {
        json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"},
        "spec": {"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"finalizers": fins}}}})
    };
    let a = apply(None, &cfg(json!(["a"])), &ti, "a", T0).unwrap();
    // finalizers inside the embedded object are a set, so another manager can add to it.
    let b = apply(Some(&a), &cfg(json!(["b"])), &ti, "b", T1).unwrap();
    assert_eq!(
        b["spec"]["template"]["metadata"]["finalizers"],
        json!(["a", "b"])
    );
}
