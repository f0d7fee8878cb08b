//! Defaulting as `apiextensions-apiserver/pkg/apiserver/schema/defaulting` does it:
//! a `default` fills an absent field (or a `null` in a non-nullable field), at every level,
//! including array items and `additionalProperties` values; inserted defaults are themselves
//! defaulted further down.

use serde_json::Value;

use crate::node::Node;

/// `null` that the schema does not allow, which defaulting treats as absent.
fn non_nullable_null(v: &Value, node: &Node) -> bool {
    v.is_null() && !node.nullable
}

pub(crate) fn apply(node: &Node, v: &mut Value) {
    if !node.has_defaults {
        return;
    }
    match v {
        Value::Object(map) => {
            for (k, prop) in &node.properties {
                let Some(default) = &prop.default else {
                    continue;
                };
                let missing = match map.get(k) {
                    None => true,
                    Some(existing) => non_nullable_null(existing, prop),
                };
                if missing {
                    map.insert(k.clone(), default.clone());
                }
            }
            let additional = node.additional_schema();
            for (k, val) in map.iter_mut() {
                if let Some(prop) = node.properties.get(k) {
                    apply(prop, val);
                } else if let Some(ap) = additional {
                    fill_or_descend(ap, val);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = node.items.as_deref() {
                for x in items.iter_mut() {
                    fill_or_descend(item, x);
                }
            }
        }
        _ => {}
    }
}

/// For values that are not object properties (map values, list items): replace a
/// non-nullable `null` with the default, else default inside.
fn fill_or_descend(node: &Node, v: &mut Value) {
    match &node.default {
        Some(default) if non_nullable_null(v, node) => *v = default.clone(),
        _ => apply(node, v),
    }
}
