//! JSON merge patch, JSON patch and strategic merge patch.

mod common;

use common::yaml;
use kubesim_apply::{PatchError, json_patch, merge_patch, strategic_merge_patch};
use serde_json::{Value, json};

#[test]
fn merge_patch_rfc7386_examples() {
    // Table from RFC 7386 appendix A: (original, patch, result).
    let cases = [
        (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
        (
            json!({"a": "b"}),
            json!({"b": "c"}),
            json!({"a": "b", "b": "c"}),
        ),
        (json!({"a": "b"}), json!({"a": null}), json!({})),
        (
            json!({"a": "b", "b": "c"}),
            json!({"a": null}),
            json!({"b": "c"}),
        ),
        (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
        (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
        (
            json!({"a": {"b": "c"}}),
            json!({"a": {"b": "d", "c": null}}),
            json!({"a": {"b": "d"}}),
        ),
        (
            json!({"a": [{"b": "c"}]}),
            json!({"a": [1]}),
            json!({"a": [1]}),
        ),
        (
            json!({"e": null}),
            json!({"a": 1}),
            json!({"e": null, "a": 1}),
        ),
        (
            json!({}),
            json!({"a": {"bb": {"ccc": null}}}),
            json!({"a": {"bb": {}}}),
        ),
    ];
    for (orig, patch, want) in cases {
        assert_eq!(merge_patch(&orig, &patch), want, "{orig} + {patch}");
    }
}

#[test]
fn json_patch_applies_and_names_the_failing_operation() {
    let doc = json!({"spec": {"replicas": 1, "list": [1, 2]}});
    let ok = json_patch(
        &doc,
        &json!([
            {"op": "test", "path": "/spec/replicas", "value": 1},
            {"op": "replace", "path": "/spec/replicas", "value": 2},
            {"op": "add", "path": "/spec/list/-", "value": 3},
            {"op": "remove", "path": "/spec/list/0"}
        ]),
    )
    .unwrap();
    assert_eq!(ok, json!({"spec": {"replicas": 2, "list": [2, 3]}}));

    let err = json_patch(
        &doc,
        &json!([
            {"op": "replace", "path": "/spec/replicas", "value": 2},
            {"op": "test", "path": "/spec/replicas", "value": 1}
        ]),
    )
    .unwrap_err();
    assert!(matches!(err, PatchError::Invalid(_)));
    assert_eq!(
        err.to_string(),
        "JSON patch operation 1 (test /spec/replicas) failed: value did not match"
    );

    let err = json_patch(&doc, &json!([{"op": "remove", "path": "/nope"}])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "JSON patch operation 0 (remove /nope) failed: path is invalid"
    );

    let err = json_patch(&doc, &json!([{"op": "frobnicate", "path": "/x"}])).unwrap_err();
    assert!(matches!(err, PatchError::BadRequest(_)), "{err:?}");
}

fn pod() -> Value {
    yaml(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: p
  finalizers: [a, b]
  ownerReferences:
  - {apiVersion: v1, kind: O, name: o1, uid: u1}
spec:
  containers:
  - name: app
    image: app:1
    args: [x, y]
    env:
    - {name: A, value: "1"}
    - {name: B, value: "2"}
    ports:
    - {containerPort: 80, protocol: TCP}
    volumeMounts:
    - {name: data, mountPath: /data}
  - name: side
    image: side:1
  volumes:
  - name: data
    emptyDir: {}
  imagePullSecrets:
  - name: reg
status:
  conditions:
  - {type: Ready, status: "False"}
  - {type: Initialized, status: "True"}
"#,
    )
}

fn smp(live: &Value, patch: Value) -> Value {
    strategic_merge_patch(live, &patch, "v1", "Pod").unwrap()
}

#[test]
fn lists_with_merge_keys_merge_by_key() {
    let out = smp(
        &pod(),
        json!({"spec": {"containers": [{"name": "app", "image": "app:2", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]},
                                        {"name": "new", "image": "new:1"}]}}),
    );
    let cs = out["spec"]["containers"].as_array().unwrap();
    // Without $setElementOrder upstream orders patch items first (in patch order) and slots
    // server-only items in where the live order allows (`mergeSortedSlice`).
    let names: Vec<&str> = cs.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["app", "new", "side"]);
    assert_eq!(cs[0]["image"], "app:2");
    assert_eq!(cs[0]["args"], json!(["x", "y"]));
    assert_eq!(
        cs[0]["env"],
        json!([{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}])
    );
}

#[test]
fn merge_key_table() {
    // (patch, JSON pointer, expected value): one row per merge key of the supported subset.
    let rows = [
        (
            json!({"spec": {"containers": [{"name": "app", "ports": [{"containerPort": 8080}]}]}}),
            "/spec/containers/0/ports",
            json!([{"containerPort": 8080}, {"containerPort": 80, "protocol": "TCP"}]),
        ),
        (
            json!({"spec": {"containers": [{"name": "app", "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}]}]}}),
            "/spec/containers/0/volumeMounts",
            json!([{"name": "data", "mountPath": "/data", "readOnly": true}]),
        ),
        (
            json!({"spec": {"volumes": [{"name": "cfg", "configMap": {"name": "c"}}]}}),
            "/spec/volumes",
            json!([{"name": "cfg", "configMap": {"name": "c"}}, {"name": "data", "emptyDir": {}}]),
        ),
        (
            json!({"spec": {"imagePullSecrets": [{"name": "other"}]}}),
            "/spec/imagePullSecrets",
            json!([{"name": "other"}, {"name": "reg"}]),
        ),
        (
            json!({"spec": {"initContainers": [{"name": "init", "image": "i"}]}}),
            "/spec/initContainers",
            json!([{"name": "init", "image": "i"}]),
        ),
        (
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "O", "name": "o2", "uid": "u2"}]}}),
            "/metadata/ownerReferences/0/uid",
            json!("u2"),
        ),
        // Patch items first in patch order, server-only "b" slotted in by live order.
        (
            json!({"metadata": {"finalizers": ["c", "a"]}}),
            "/metadata/finalizers",
            json!(["c", "a", "b"]),
        ),
        (
            json!({"metadata": {"$setElementOrder/finalizers": ["a", "b", "c"], "finalizers": ["c"]}}),
            "/metadata/finalizers",
            json!(["a", "b", "c"]),
        ),
        (
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            "/status/conditions",
            json!([{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}]),
        ),
        // No merge strategy: replaced like a JSON merge patch.
        (
            json!({"spec": {"containers": [{"name": "app", "args": ["z"]}]}}),
            "/spec/containers/0/args",
            json!(["z"]),
        ),
        (
            json!({"spec": {"containers": [{"name": "app", "image": null}]}}),
            "/spec/containers/0/image",
            Value::Null,
        ),
    ];
    for (patch, ptr, want) in rows {
        let out = smp(&pod(), patch.clone());
        assert_eq!(
            out.pointer(ptr).cloned().unwrap_or(Value::Null),
            want,
            "patch {patch}"
        );
    }
}

#[test]
fn patch_directives() {
    // $patch: delete on a list item.
    let out = smp(
        &pod(),
        json!({"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}),
    );
    assert_eq!(out["spec"]["containers"].as_array().unwrap().len(), 1);
    // $patch: replace on a list.
    let out = smp(
        &pod(),
        json!({"spec": {"containers": [{"name": "only", "image": "o"}, {"$patch": "replace"}]}}),
    );
    assert_eq!(
        out["spec"]["containers"],
        json!([{"name": "only", "image": "o"}])
    );
    // $patch: replace on a map.
    let out = smp(
        &pod(),
        json!({"metadata": {"$patch": "replace", "name": "p"}}),
    );
    assert_eq!(out["metadata"], json!({"name": "p"}));
    // $patch: delete on a map empties it (upstream returns an empty map, not a removal).
    let out = smp(&pod(), json!({"status": {"$patch": "delete"}}));
    assert_eq!(out["status"], json!({}));
    // $deleteFromPrimitiveList.
    let out = smp(
        &pod(),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
    );
    assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    // $retainKeys (volumes carry retainKeys): switching a volume source drops the old one.
    let out = smp(
        &pod(),
        json!({"spec": {"volumes": [{"name": "data", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}]}}),
    );
    assert_eq!(
        out["spec"]["volumes"],
        json!([{"name": "data", "hostPath": {"path": "/x"}}])
    );
    // $setElementOrder reorders the items it names.
    let out = smp(
        &pod(),
        json!({"spec": {"$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
                        "containers": [{"name": "side", "image": "side:2"}]}}),
    );
    let names: Vec<&str> = out["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["side", "app"]);
    assert_eq!(out["spec"]["containers"][0]["image"], "side:2");
    // Directives never leak into the stored object.
    assert!(!out.to_string().contains('$'));
}

#[test]
fn bad_strategic_patches_are_bad_requests() {
    let cases = [
        json!({"spec": {"containers": [{"image": "no-name"}]}}),
        json!({"spec": {"containers": [{"$patch": "delete"}]}}),
        json!({"metadata": {"$patch": "explode"}}),
        json!({"metadata": {"$retainKeys": "name"}}),
        json!({"metadata": {"$retainKeys": ["name"], "labels": {"a": "b"}}}),
        json!({"metadata": {"$patch": "merge"}}),
        json!(["not", "an", "object"]),
    ];
    for patch in cases {
        let err = strategic_merge_patch(&pod(), &patch, "v1", "Pod").unwrap_err();
        assert!(matches!(err, PatchError::BadRequest(_)), "{patch}: {err:?}");
    }
}

#[test]
fn kubectl_client_side_apply_patch_works() {
    // What `kubectl apply` (client side) sends when a Deployment's image changes and an env
    // var is dropped: last-applied annotation, $setElementOrder and a null.
    let live = yaml(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: '{"old":true}'
spec:
  replicas: 2
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 1}
  template:
    spec:
      containers:
      - name: web
        image: web:1
        env:
        - {name: A, value: "1"}
        - {name: B, value: "2"}
"#,
    );
    let patch = json!({
        "metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"new\":true}"}},
        "spec": {
            "strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": null},
            "template": {"spec": {
                "$setElementOrder/containers": [{"name": "web"}],
                "containers": [{"name": "web", "image": "web:2",
                                "$setElementOrder/env": [{"name": "A"}],
                                "env": [{"name": "B", "$patch": "delete"}]}]
            }}
        }
    });
    let out = strategic_merge_patch(&live, &patch, "apps/v1", "Deployment").unwrap();
    assert_eq!(
        out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
        "{\"new\":true}"
    );
    assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
    assert_eq!(
        out["spec"]["template"]["spec"]["containers"],
        json!([{"name": "web", "image": "web:2", "env": [{"name": "A", "value": "1"}]}])
    );
    assert_eq!(out["spec"]["replicas"], 2);
}

#[test]
fn custom_kinds_get_merge_patch_semantics_plus_object_meta() {
    let live = json!({"metadata": {"name": "x", "finalizers": ["a"]}, "spec": {"list": [1, 2], "m": {"a": 1}}});
    let out = strategic_merge_patch(
        &live,
        &json!({"metadata": {"finalizers": ["b"]}, "spec": {"list": [3], "m": {"b": 2}}}),
        "example.com/v1",
        "Widget",
    )
    .unwrap();
    assert_eq!(
        out,
        json!({"metadata": {"name": "x", "finalizers": ["b", "a"]}, "spec": {"list": [3], "m": {"a": 1, "b": 2}}})
    );
}
