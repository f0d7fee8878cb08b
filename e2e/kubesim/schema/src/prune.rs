//! Pruning as `apiextensions-apiserver/pkg/apiserver/schema/pruning` does it: fields the
//! structural schema does not declare are dropped unless `x-kubernetes-preserve-unknown-fields`;
//! the resource root and embedded resources keep `apiVersion`, `kind` and `metadata`.
//! Also drops `null` in non-nullable fields without a default
//! (`PruneNonNullableNullsWithoutDefaults`), which kube-apiserver does in the same pass.

use serde_json::Value;

use crate::node::Node;

const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// Mutating prune. `node` is `None` where the schema declares nothing (everything below
/// is unknown).
pub(crate) fn prune(node: Option<&Node>, v: &mut Value, is_root: bool) {
    let Some(node) = node else {
        prune_all(v);
        return;
    };
    if node.keeps_unknown() {
        prune_known_only(node, v);
        return;
    }
    match v {
        Value::Object(map) => {
            let keep_meta = is_root || node.embedded;
            let additional = node.additional_schema();
            map.retain(|k, val| {
                if keep_meta && META_FIELDS.contains(&k.as_str()) {
                    return true;
                }
                if let Some(prop) = node.properties.get(k) {
                    if non_nullable_null_without_default(val, prop) {
                        return false;
                    }
                    prune(Some(prop), val, false);
                    true
                } else if let Some(ap) = additional {
                    if non_nullable_null_without_default(val, ap) {
                        return false;
                    }
                    prune(Some(ap), val, false);
                    true
                } else {
                    false
                }
            });
        }
        Value::Array(items) => {
            for x in items.iter_mut() {
                prune(node.items.as_deref(), x, false);
            }
        }
        _ => {}
    }
}

fn non_nullable_null_without_default(v: &Value, node: &Node) -> bool {
    v.is_null() && !node.nullable && node.default.is_none()
}

/// Below a node without schema: objects lose every field (arrays are walked).
fn prune_all(v: &mut Value) {
    match v {
        Value::Object(map) => map.clear(),
        Value::Array(items) => items.iter_mut().for_each(prune_all),
        _ => {}
    }
}

/// `x-kubernetes-preserve-unknown-fields`: unknown fields stay, declared ones are pruned
/// by their own schema.
fn prune_known_only(node: &Node, v: &mut Value) {
    match v {
        Value::Object(map) => {
            let additional = node.additional_schema();
            for (k, val) in map.iter_mut() {
                if node.embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(prop) = node.properties.get(k) {
                    prune(Some(prop), val, false);
                } else if let Some(ap) = additional {
                    prune(Some(ap), val, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = node.items.as_deref() {
                for x in items.iter_mut() {
                    prune_known_only(item, x);
                }
            }
        }
        _ => {}
    }
}

/// The paths [`prune`] would drop as unknown fields (not the dropped `null`s). `skip` is set
/// below a preserve-unknown-fields array, whose items keep their unknown fields too.
pub(crate) fn unknown(
    node: Option<&Node>,
    v: &Value,
    is_root: bool,
    skip: bool,
    path: &str,
    out: &mut Vec<String>,
) {
    let Some(node) = node else {
        if !skip {
            unknown_all(v, path, out);
        }
        return;
    };
    let keeps = skip || node.keeps_unknown();
    match v {
        Value::Object(map) => {
            let keep_meta = is_root || node.embedded;
            let additional = node.additional_schema();
            for (k, val) in map {
                if keep_meta && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(prop) = node.properties.get(k) {
                    unknown(Some(prop), val, false, false, &child_path(path, k), out);
                } else if let Some(ap) = additional {
                    unknown(Some(ap), val, false, false, &child_path(path, k), out);
                } else if !keeps {
                    out.push(child_path(path, k));
                }
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                let p = format!("{path}[{i}]");
                unknown(node.items.as_deref(), x, false, keeps, &p, out);
            }
        }
        _ => {}
    }
}

fn unknown_all(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for k in map.keys() {
                out.push(child_path(path, k));
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                unknown_all(x, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}
