//! Property tests: re-applying a configuration changes nothing, and a sole manager's
//! successive applies converge to what a fresh apply of the last configuration gives.

mod common;

use common::*;
use kubesim_apply::TypeInfo;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "properties": {
                    "replicas": {"type": "integer"},
                    "name": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "items": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {
                            "name": {"type": "string"}, "value": {"type": "integer"},
                            "tags": {"type": "array", "items": {"type": "string"}}
                        }}
                    },
                    "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }
            }
        }
    })
}

fn small_str() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c", "d"]).prop_map(str::to_owned)
}

fn item() -> impl Strategy<Value = Value> {
    (
        small_str(),
        prop::option::of(0i64..3),
        prop::option::of(prop::collection::vec(small_str(), 0..3)),
    )
        .prop_map(|(name, value, tags)| {
            let mut m = Map::new();
            m.insert("name".into(), name.into());
            if let Some(v) = value {
                m.insert("value".into(), v.into());
            }
            if let Some(t) = tags {
                m.insert("tags".into(), t.into());
            }
            Value::Object(m)
        })
}

fn dedup_by_name(items: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for i in items {
        if !out.iter().any(|o| o["name"] == i["name"]) {
            out.push(i);
        }
    }
    out
}

/// Random configurations; `min` is the least length of associative lists (an empty one is
/// owned by nobody, as upstream, so it is never pruned).
fn config(min: usize) -> impl Strategy<Value = Value> {
    (
        prop::option::of(0i64..4),
        prop::option::of(small_str()),
        prop::option::of(prop::collection::btree_map(small_str(), small_str(), 0..3)),
        prop::option::of(prop::collection::vec(item(), min..4).prop_map(dedup_by_name)),
        prop::option::of(prop::collection::btree_set(small_str(), min..3)),
        prop::option::of(prop::collection::vec(small_str(), 0..3)),
        prop::option::of(prop::collection::btree_map(small_str(), 0i64..3, 0..3)),
        prop::option::of(prop::collection::btree_map(small_str(), small_str(), 0..2)),
    )
        .prop_map(|(replicas, name, labels, items, set, args, free, meta_labels)| {
            let mut spec = Map::new();
            let mut put = |k: &str, v: Option<Value>| {
                if let Some(v) = v {
                    spec.insert(k.into(), v);
                }
            };
            put("replicas", replicas.map(Value::from));
            put("name", name.map(Value::from));
            put("labels", labels.map(|l| json!(l)));
            put("items", items.map(Value::from));
            put("set", set.map(|s| json!(s)));
            put("args", args.map(Value::from));
            put("free", free.map(|f| json!({"m": f, "l": [1, 2]})));
            let mut metadata = json!({"name": "obj", "namespace": "ns"});
            if let Some(l) = meta_labels {
                metadata["labels"] = json!(l);
            }
            json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": metadata, "spec": spec})
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn applying_twice_is_idempotent(c1 in config(0), c2 in config(0)) {
        let ti = TypeInfo::from_schema(&schema());
        let first = apply(None, &c1, &ti, "m", T0).unwrap();
        let again = apply(Some(&first), &c1, &ti, "m", T1).unwrap();
        prop_assert_eq!(&again, &first);
        // The same holds on top of another manager's object.
        let other = apply(None, &c2, &ti, "other", T0).unwrap();
        let r = kubesim_apply::ApplyRequest { manager: "m", force: true, subresource: None, now: T1 };
        let on_top = kubesim_apply::server_side_apply(Some(&other), &c1, &ti, &r).unwrap();
        let r2 = kubesim_apply::ApplyRequest { now: T2, ..r };
        let on_top_again = kubesim_apply::server_side_apply(Some(&on_top), &c1, &ti, &r2).unwrap();
        prop_assert_eq!(&on_top_again, &on_top);
    }

    #[test]
    fn a_sole_manager_converges_to_its_last_config(c1 in config(1), c2 in config(1)) {
        let ti = TypeInfo::from_schema(&schema());
        let first = apply(None, &c1, &ti, "m", T0).unwrap();
        let second = apply(Some(&first), &c2, &ti, "m", T1).unwrap();
        let fresh = apply(None, &c2, &ti, "m", T1).unwrap();
        prop_assert_eq!(content(&second), content(&fresh));
        prop_assert_eq!(fields(&second, "m", "Apply"), fields(&fresh, "m", "Apply"));
    }
}
