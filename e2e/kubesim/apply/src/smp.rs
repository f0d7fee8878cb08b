//! Strategic merge patch (`application/strategic-merge-patch+json`) as kube-apiserver applies
//! it (`strategicpatch.StrategicMergeMapPatch` with `MergeParallelList` and
//! `IgnoreUnmatchedNulls`), for the patch metadata in [`crate::types`]. See the README for
//! the supported subset.

use crate::PatchError;
use crate::types::Ty;
use serde_json::{Map, Value};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

fn bad(msg: impl Into<String>) -> PatchError {
    PatchError::BadRequest(msg.into())
}

/// Patch a whole object.
pub(crate) fn patch_object(live: &Value, patch: &Value, ty: Ty<'_>) -> Result<Value, PatchError> {
    let p = patch
        .as_object()
        .ok_or_else(|| bad("strategic merge patch must be a JSON object"))?;
    let original = live.as_object().cloned().unwrap_or_default();
    Ok(Value::Object(
        merge_map(original, p, ty)?.unwrap_or_default(),
    ))
}

/// Merge `patch` into `original`; `None` means the map is deleted (`$patch: delete`).
fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    ty: Ty<'_>,
) -> Result<Option<Map<String, Value>>, PatchError> {
    match patch.get(PATCH) {
        None => {}
        Some(Value::String(d)) if d == "replace" => {
            let mut rest = patch.clone();
            rest.remove(PATCH);
            return merge_map(Map::new(), &rest, ty);
        }
        Some(Value::String(d)) if d == "delete" => return Ok(None),
        Some(Value::String(d)) if d == "merge" => {}
        Some(other) => return Err(bad(format!("invalid value for $patch: {other}"))),
    }
    if let Some(keys) = patch.get(RETAIN_KEYS) {
        let keys: Vec<&str> = keys
            .as_array()
            .ok_or_else(|| bad("$retainKeys must be a list of strings"))?
            .iter()
            .map(|k| {
                k.as_str()
                    .ok_or_else(|| bad("$retainKeys must be a list of strings"))
            })
            .collect::<Result<_, _>>()?;
        original.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (k, v) in patch {
        let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) else {
            continue;
        };
        let doomed = v
            .as_array()
            .ok_or_else(|| bad(format!("{k} must be a list")))?;
        if let Some(Value::Array(list)) = original.get_mut(field) {
            list.retain(|item| !doomed.contains(item));
        }
    }
    for (k, v) in patch {
        if k.starts_with('$') {
            continue;
        }
        let child_ty = ty.field(k);
        match v {
            Value::Null => {
                original.remove(k);
            }
            Value::Object(p) => {
                let base = match original.remove(k) {
                    Some(Value::Object(m)) => m,
                    _ => Map::new(),
                };
                if let Some(m) = merge_map(base, p, child_ty)? {
                    original.insert(k.clone(), Value::Object(m));
                }
            }
            Value::Array(p) => {
                let base = match original.remove(k) {
                    Some(Value::Array(a)) => a,
                    _ => Vec::new(),
                };
                let merged = merge_list(base, p, child_ty)?;
                original.insert(k.clone(), Value::Array(merged));
            }
            scalar => {
                original.insert(k.clone(), scalar.clone());
            }
        }
    }
    for (k, order) in patch {
        let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) else {
            continue;
        };
        let order = order
            .as_array()
            .ok_or_else(|| bad(format!("{k} must be a list")))?;
        let merge_key = ty.field(field).patch_merge_key();
        if let Some(Value::Array(list)) = original.get_mut(field) {
            apply_order(list, order, merge_key);
        }
    }
    Ok(Some(original))
}

/// The identity of a list item for merging: its merge key value, or the item itself.
fn identity<'v>(item: &'v Value, merge_key: Option<&str>) -> Option<&'v Value> {
    match (merge_key, item) {
        (Some(k), Value::Object(m)) => m.get(k),
        (_, Value::Object(_)) => None,
        (_, v) => Some(v),
    }
}

/// `$setElementOrder`: the items named in `order` take, in that order, the slots those items
/// occupy; other (server-only) items stay where they are.
fn apply_order(list: &mut [Value], order: &[Value], merge_key: Option<&str>) {
    let wanted: Vec<&Value> = order
        .iter()
        .filter_map(|o| identity(o, merge_key))
        .collect();
    let rank = |item: &Value| {
        identity(item, merge_key).and_then(|id| wanted.iter().position(|w| *w == id))
    };
    let slots: Vec<usize> = (0..list.len())
        .filter(|&i| rank(&list[i]).is_some())
        .collect();
    let mut ordered: Vec<Value> = slots.iter().map(|&i| list[i].clone()).collect();
    ordered.sort_by_key(|item| rank(item));
    for (slot, item) in slots.into_iter().zip(ordered) {
        list[slot] = item;
    }
}

/// Remove directive keys from a value taken over as a whole.
fn strip_directives(v: &Value) -> Result<Value, PatchError> {
    Ok(match v {
        Value::Object(m) => {
            Value::Object(merge_map(Map::new(), m, Ty::root(None, true))?.unwrap_or_default())
        }
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect::<Result<_, _>>()?),
        other => other.clone(),
    })
}

fn merge_list(original: Vec<Value>, patch: &[Value], ty: Ty<'_>) -> Result<Vec<Value>, PatchError> {
    if !ty.patch_merges() {
        // Lists without the merge strategy are replaced, as in a JSON merge patch.
        return patch.iter().map(strip_directives).collect();
    }
    let items_ty = ty.items();
    let maps = patch.iter().chain(&original).any(Value::is_object);
    if !maps {
        // A merging list of scalars: union, keeping the first occurrence.
        let mut out: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.into_iter().chain(patch.iter().cloned()) {
            if !out.contains(&v) {
                out.push(v);
            }
        }
        return Ok(out);
    }
    let key = ty
        .patch_merge_key()
        .ok_or_else(|| bad("cannot merge lists without merge key"))?;
    let mut original = original;
    let mut plain: Vec<&Map<String, Value>> = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let m = item.as_object().ok_or_else(|| {
            bad(format!(
                "expected a map in a list merged by {key:?}, got {item}"
            ))
        })?;
        match m.get(PATCH).and_then(Value::as_str) {
            None => plain.push(m),
            Some("delete") => {
                let id = m.get(key).ok_or_else(|| {
                    bad(format!(
                        "map: {item} does not contain declared merge key: {key}"
                    ))
                })?;
                original.retain(|o| o.get(key) != Some(id));
            }
            Some("replace") => replace = true,
            Some("merge") => return Err(bad("merging lists cannot yet be specified in the patch")),
            Some(other) => return Err(bad(format!("invalid value for $patch: {other}"))),
        }
    }
    if replace {
        return plain
            .into_iter()
            .map(|m| strip_directives(&Value::Object(m.clone())))
            .collect();
    }
    for m in plain {
        let id = m.get(key).ok_or_else(|| {
            bad(format!(
                "map: {} does not contain declared merge key: {key}",
                Value::Object(m.clone())
            ))
        })?;
        match original.iter().position(|o| o.get(key) == Some(id)) {
            Some(i) => {
                let base = original[i].as_object().cloned().unwrap_or_default();
                match merge_map(base, m, items_ty)? {
                    Some(merged) => original[i] = Value::Object(merged),
                    None => {
                        original.remove(i);
                    }
                }
            }
            None => {
                if let Some(new) = merge_map(Map::new(), m, items_ty)? {
                    original.push(Value::Object(new));
                }
            }
        }
    }
    Ok(original)
}
