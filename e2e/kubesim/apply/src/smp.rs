//! Strategic merge patch (`application/strategic-merge-patch+json`) as kube-apiserver applies
//! it (`strategicpatch.StrategicMergeMapPatch` with `MergeParallelList` and
//! `IgnoreUnmatchedNulls`), for the patch metadata in [`crate::types`]. See the README for
//! the supported subset.

use crate::PatchError;
use crate::types::Ty;
use serde_json::{Map, Value};
use std::collections::HashSet;

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
    Ok(Value::Object(merge_map(original, p, ty)?))
}

/// Merge `patch` into `original` (upstream `mergeMap`).
fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    ty: Ty<'_>,
) -> Result<Map<String, Value>, PatchError> {
    match patch.get(PATCH) {
        None => {}
        Some(Value::String(d)) if d == "replace" => {
            let mut rest = patch.clone();
            rest.remove(PATCH);
            return merge_map(Map::new(), &rest, ty);
        }
        // Upstream turns the map into an empty one rather than removing it.
        Some(Value::String(d)) if d == "delete" => return Ok(Map::new()),
        Some(other) => return Err(bad(format!("invalid value for $patch: {other}"))),
    }
    retain_keys(&mut original, patch)?;
    let handled = set_element_order(&mut original, patch, ty)?;

    for (k, v) in patch {
        if handled.contains(k.as_str()) || k == RETAIN_KEYS || k.starts_with(SET_ELEMENT_ORDER) {
            continue;
        }
        if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            let doomed = v
                .as_array()
                .ok_or_else(|| bad(format!("{k} must be a list")))?;
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|item| !doomed.contains(item));
            }
            continue;
        }
        let child_ty = ty.field(k);
        let merged = match (original.remove(k), v) {
            (_, Value::Null) => continue,
            (Some(Value::Object(o)), Value::Object(p)) if !replaces(child_ty) => {
                Value::Object(merge_map(o, p, child_ty)?)
            }
            (Some(Value::Array(o)), Value::Array(p)) => Value::Array(merge_list(o, p, child_ty)?),
            // Absent in the original or of another type: take the patch value (directives
            // resolved against nothing).
            (_, p) => strip_directives(p, child_ty)?,
        };
        original.insert(k.clone(), merged);
    }
    Ok(original)
}

fn replaces(ty: Ty<'_>) -> bool {
    ty.patch_strategy()
        .split(',')
        .any(|s| s.trim() == "replace")
}

/// `$retainKeys`: every patched field must be listed, and unlisted fields are cleared.
fn retain_keys(
    original: &mut Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<(), PatchError> {
    let Some(keys) = patch.get(RETAIN_KEYS) else {
        return Ok(());
    };
    let malformed = || bad("$retainKeys must be a list of strings");
    let keys: HashSet<&str> = keys
        .as_array()
        .ok_or_else(malformed)?
        .iter()
        .map(|k| k.as_str().ok_or_else(malformed))
        .collect::<Result<_, _>>()?;
    for (k, v) in patch {
        let directive = k == RETAIN_KEYS
            || k == PATCH
            || k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
            || k.starts_with(SET_ELEMENT_ORDER);
        if !directive && !v.is_null() && !keys.contains(k.as_str()) {
            return Err(bad(format!(
                "doesn't match the $retainKeys list: {k} is patched but not retained"
            )));
        }
    }
    original.retain(|k, _| keys.contains(k.as_str()));
    Ok(())
}

/// `$setElementOrder/<field>` (upstream `mergePatchIntoOriginal`): merge the field's list and
/// order the result. Returns the fields handled here.
fn set_element_order<'p>(
    original: &mut Map<String, Value>,
    patch: &'p Map<String, Value>,
    ty: Ty<'_>,
) -> Result<HashSet<&'p str>, PatchError> {
    let mut handled = HashSet::new();
    for (k, order) in patch {
        let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) else {
            continue;
        };
        let order = order
            .as_array()
            .ok_or_else(|| bad(format!("{k} must be a list")))?;
        let field_ty = ty.field(field);
        let orig = match original.get(field) {
            Some(Value::Array(a)) => Some(a.clone()),
            Some(_) => return Err(bad(format!("{field} is not a list"))),
            None => None,
        };
        let patched = match patch.get(field) {
            Some(Value::Array(a)) => Some(a),
            Some(_) => return Err(bad(format!("{field} is not a list"))),
            None => None,
        };
        let merged = match (&orig, patched) {
            (Some(o), None) => o.clone(),
            (None, Some(p)) => merge_list(Vec::new(), p, field_ty)?,
            (Some(o), Some(p)) => merge_list(o.clone(), p, field_ty)?,
            (None, None) => continue,
        };
        let key = field_ty.patch_merge_key();
        let normalized = normalize_order(merged, order, orig.as_deref().unwrap_or(&[]), key);
        original.insert(field.to_string(), Value::Array(normalized));
        handled.insert(field);
    }
    Ok(handled)
}

/// The identity of a list item for ordering and merging: its merge key value, or the item.
fn identity<'v>(item: &'v Value, merge_key: Option<&str>) -> Option<&'v Value> {
    match (merge_key, item) {
        (Some(k), Value::Object(m)) => m.get(k),
        (None, v) => Some(v),
        _ => None,
    }
}

fn position(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    let id = identity(item, key)?;
    list.iter().position(|o| identity(o, key) == Some(id))
}

/// Upstream `normalizeElementOrder`: items named in `order` sorted by it, the others by their
/// place in `server_order`, then interleaved following the server order where both are known
/// (`mergeSortedSlice`).
fn normalize_order(
    merged: Vec<Value>,
    order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let (mut patch_items, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|item| position(order, item, key).is_some());
    patch_items.sort_by_key(|i| position(order, i, key));
    server_only.sort_by_key(|i| position(server_order, i, key).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (position(server_order, l, key), position(server_order, r, key)),
                (Some(a), Some(b)) if a < b
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

/// Resolve directives in a value that replaces whatever was there.
fn strip_directives(v: &Value, ty: Ty<'_>) -> Result<Value, PatchError> {
    Ok(match v {
        Value::Object(m) => Value::Object(merge_map(Map::new(), m, ty)?),
        Value::Array(a) => Value::Array(merge_list(Vec::new(), a, ty)?),
        other => other.clone(),
    })
}

/// Merge a list (upstream `mergeSliceHandler`/`mergeSlice`).
fn merge_list(original: Vec<Value>, patch: &[Value], ty: Ty<'_>) -> Result<Vec<Value>, PatchError> {
    let items_ty = ty.items();
    if !ty.patch_merges() {
        // Lists without the merge strategy are replaced, as in a JSON merge patch.
        return patch
            .iter()
            .map(|v| strip_directives(v, items_ty))
            .collect();
    }
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let maps = patch.iter().chain(&original).any(Value::is_object);
    if !maps {
        // A merging list of scalars: union, keeping the first occurrence.
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(patch) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        return Ok(normalize_order(merged, patch, &original, None));
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
                let id = m.get(key).ok_or_else(|| no_merge_key(m, key))?;
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
            .map(|m| Ok(Value::Object(merge_map(Map::new(), m, items_ty)?)))
            .collect();
    }
    let server_order = original.clone();
    let mut patch_order = Vec::with_capacity(plain.len());
    for m in plain {
        let id = m.get(key).ok_or_else(|| no_merge_key(m, key))?;
        match original.iter().position(|o| o.get(key) == Some(id)) {
            Some(i) => {
                let base = original[i].as_object().cloned().unwrap_or_default();
                original[i] = Value::Object(merge_map(base, m, items_ty)?);
            }
            None => original.push(Value::Object(merge_map(Map::new(), m, items_ty)?)),
        }
        patch_order.push(Value::Object(m.clone()));
    }
    Ok(normalize_order(
        original,
        &patch_order,
        &server_order,
        Some(key),
    ))
}

fn no_merge_key(m: &Map<String, Value>, key: &str) -> PatchError {
    bad(format!(
        "map: {} does not contain declared merge key: {key}",
        Value::Object(m.clone())
    ))
}
