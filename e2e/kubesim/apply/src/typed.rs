//! Typed operations on JSON objects, after structured-merge-diff's `typed` package:
//! field sets of an object, merge of an applied configuration into a live object, comparison
//! of two objects, and removal of a set of fields.

use crate::fieldpath::{self, FieldSet, Path};
use crate::types::{ListKind, Ty};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet, VecDeque};

/// The path element of list item `i` in a list of kind `kind`.
fn item_element(item: &Value, i: usize, kind: &ListKind, ty: Ty<'_>) -> Result<String, String> {
    match kind {
        ListKind::Set => Ok(fieldpath::value(item)),
        ListKind::Atomic => Ok(format!("i:{i}")),
        ListKind::Map(keys) => {
            let obj = item
                .as_object()
                .ok_or_else(|| format!("element {i}: associative list item must be an object"))?;
            let mut k = Map::new();
            for name in keys {
                let v = obj
                    .get(name)
                    .or_else(|| ty.field_default(name))
                    .ok_or_else(|| {
                        format!(
                            "element {i}: associative list with keys has an element that omits key \
                         field {name:?} (and doesn't have default value)"
                        )
                    })?;
                k.insert(name.clone(), v.clone());
            }
            Ok(fieldpath::key(&k))
        }
    }
}

/// Path elements of all items, leniently (a malformed item is addressed by its index).
fn elements(list: &[Value], kind: &ListKind, ty: Ty<'_>) -> Vec<String> {
    list.iter()
        .enumerate()
        .map(|(i, item)| item_element(item, i, kind, ty).unwrap_or_else(|_| format!("i:{i}")))
        .collect()
}

/// Check an applied configuration the way upstream builds its typed object: associative list
/// items must carry their keys and must be unique.
pub(crate) fn validate(v: &Value, ty: Ty<'_>, path: &mut Path) -> Result<(), String> {
    match v {
        Value::Object(m) if !ty.map_atomic() => {
            for (k, child) in m {
                path.push(fieldpath::field(k));
                validate(child, ty.field(k), path)?;
                path.pop();
            }
        }
        Value::Array(items) => {
            let kind = ty.list_kind();
            if kind == ListKind::Atomic {
                return Ok(());
            }
            let mut seen = HashSet::new();
            for (i, item) in items.iter().enumerate() {
                let el = item_element(item, i, &kind, ty.items())
                    .map_err(|e| format!("{}: {e}", fieldpath::display(path)))?;
                if !seen.insert(el.clone()) {
                    return Err(format!(
                        "{}: duplicate entries for key {}",
                        fieldpath::display(path),
                        fieldpath::display(&[el])
                    ));
                }
                if let ListKind::Map(_) = kind {
                    path.push(el);
                    validate(item, ty.items(), path)?;
                    path.pop();
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Drop fields a structural schema does not declare (what kube-apiserver's pruning does to
/// them), so that nobody owns a field the stored object can never hold.
pub(crate) fn prune_unknown(v: &mut Value, ty: Ty<'_>) {
    match v {
        Value::Object(m) => {
            if ty.prunes_unknown() {
                let root = ty.is_root();
                m.retain(|k, _| {
                    ty.is_declared(k)
                        || (root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                });
            }
            for (k, child) in m.iter_mut() {
                prune_unknown(child, ty.field(k));
            }
        }
        Value::Array(items) => {
            let items_ty = ty.items();
            items.iter_mut().for_each(|i| prune_unknown(i, items_ty));
        }
        _ => {}
    }
}

/// The set of fields `v` sets (upstream `ToFieldSet`): leaves, atomic lists/maps, list items,
/// map keys that are not declared struct fields, and empty or null fields.
pub(crate) fn to_field_set(v: &Value, ty: Ty<'_>) -> FieldSet {
    let mut set = FieldSet::new();
    walk_set(v, ty, &mut Vec::new(), &mut set);
    set
}

fn walk_set(v: &Value, ty: Ty<'_>, path: &mut Path, set: &mut FieldSet) {
    match v {
        Value::Object(m) => {
            if ty.map_atomic() {
                set.insert(path.clone());
                return;
            }
            for (k, child) in m {
                path.push(fieldpath::field(k));
                walk_set(child, ty.field(k), path, set);
                let empty = child.is_null() || child.as_object().is_some_and(Map::is_empty);
                if empty || !ty.is_declared(k) {
                    set.insert(path.clone());
                }
                path.pop();
            }
        }
        Value::Array(items) => {
            let kind = ty.list_kind();
            if kind == ListKind::Atomic {
                set.insert(path.clone());
                return;
            }
            let items_ty = ty.items();
            for (item, el) in items.iter().zip(elements(items, &kind, items_ty)) {
                path.push(el);
                if let ListKind::Map(_) = kind {
                    walk_set(item, items_ty, path, set);
                }
                set.insert(path.clone());
                path.pop();
            }
        }
        _ => set.insert(path.clone()),
    }
}

/// Merge `rhs` (the applied configuration) into `lhs` (the live object).
pub(crate) fn merge(lhs: &Value, rhs: &Value, ty: Ty<'_>) -> Value {
    match (lhs, rhs) {
        (Value::Object(l), Value::Object(r)) if !ty.map_atomic() => {
            // Live fields in their order, merged where applied, then applied-only fields:
            // the order `l.clone()` + inserting `r` gives, without copying live subtrees
            // that the merge replaces.
            let mut out = Map::new();
            for (k, lv) in l {
                let v = match r.get(k) {
                    Some(rv) => merge(lv, rv, ty.field(k)),
                    None => lv.clone(),
                };
                out.insert(k.clone(), v);
            }
            for (k, rv) in r {
                if !l.contains_key(k) {
                    out.insert(k.clone(), rv.clone());
                }
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(r)) => match ty.list_kind() {
            ListKind::Atomic => rhs.clone(),
            kind => Value::Array(merge_list(l, r, &kind, ty.items())),
        },
        _ => rhs.clone(),
    }
}

/// Merge associative lists the way upstream's `mergingWalker.visitListItems` does: shared
/// items follow the applied order, live-only items keep their place relative to them.
fn merge_list(lhs: &[Value], rhs: &[Value], kind: &ListKind, items_ty: Ty<'_>) -> Vec<Value> {
    let lpe = elements(lhs, kind, items_ty);
    let rpe = elements(rhs, kind, items_ty);
    let index = |pes: &[String]| {
        let mut m: HashMap<String, usize> = HashMap::new();
        for (i, pe) in pes.iter().enumerate() {
            m.entry(pe.clone()).or_insert(i);
        }
        m
    };
    let lobs = index(&lpe);
    let robs = index(&rpe);
    let mut shared: VecDeque<&String> = rpe.iter().filter(|pe| lobs.contains_key(*pe)).collect();
    let mut next_shared = shared.pop_front();
    let mut merged_rhs: HashSet<&String> = HashSet::new();
    let item = |pe: &String, r: &Value| match lobs.get(pe) {
        Some(&li) => merge(&lhs[li], r, items_ty),
        None => r.clone(),
    };
    let mut out = Vec::with_capacity(lhs.len().max(rhs.len()));
    let (mut li, mut ri) = (0, 0);
    while li < lhs.len() || ri < rhs.len() {
        if li < lhs.len() && ri < rhs.len() {
            let pe = &lpe[li];
            if *pe == rpe[ri] {
                merged_rhs.insert(pe);
                out.push(item(pe, &rhs[robs[pe]]));
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if robs.contains_key(pe) && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < lhs.len() {
            let pe = &lpe[li];
            if !robs.contains_key(pe) {
                out.push(lhs[li].clone());
                li += 1;
                continue;
            } else if merged_rhs.contains(pe) {
                li += 1;
                continue;
            }
        }
        if ri < rhs.len() {
            let pe = &rpe[ri];
            merged_rhs.insert(pe);
            out.push(item(pe, &rhs[robs[pe]]));
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.pop_front();
            }
        } else {
            // Defensive: cannot happen (every rhs item is merged once rhs is exhausted).
            li += 1;
        }
    }
    out
}

/// What changed between two objects (upstream `Comparison`).
#[derive(Debug, Default)]
pub(crate) struct Comparison {
    /// Fields only in the new object (including new containers and list items).
    pub(crate) added: FieldSet,
    /// Leaves present in both with different values.
    pub(crate) modified: FieldSet,
    /// Fields only in the old object.
    pub(crate) removed: FieldSet,
}

/// Compare `old` with `new`.
pub(crate) fn compare(old: &Value, new: &Value, ty: Ty<'_>) -> Comparison {
    let mut c = Comparison::default();
    walk_compare(Some(old), Some(new), ty, &mut Vec::new(), &mut c);
    c
}

fn walk_compare(
    l: Option<&Value>,
    r: Option<&Value>,
    ty: Ty<'_>,
    path: &mut Path,
    c: &mut Comparison,
) {
    let is_obj = |v: Option<&Value>| v.is_none_or(Value::is_object);
    let is_arr = |v: Option<&Value>| v.is_none_or(Value::is_array);
    let empty = |v: Option<&Value>| match v {
        None => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    };
    let granular = if is_obj(l) && is_obj(r) {
        !ty.map_atomic()
    } else if is_arr(l) && is_arr(r) {
        ty.list_kind() != ListKind::Atomic
    } else {
        false
    };
    if !granular || (empty(l) && empty(r)) {
        match (l, r) {
            (None, Some(_)) => c.added.insert(path.clone()),
            (Some(_), None) => c.removed.insert(path.clone()),
            (Some(a), Some(b)) if a != b => c.modified.insert(path.clone()),
            _ => {}
        }
        return;
    }
    if is_obj(l) && is_obj(r) {
        let lm = l.and_then(Value::as_object);
        let rm = r.and_then(Value::as_object);
        let mut keys: Vec<&String> = lm.into_iter().flat_map(|m| m.keys()).collect();
        keys.extend(rm.into_iter().flat_map(|m| m.keys()));
        keys.sort();
        keys.dedup();
        for k in keys {
            path.push(fieldpath::field(k));
            walk_compare(
                lm.and_then(|m| m.get(k)),
                rm.and_then(|m| m.get(k)),
                ty.field(k),
                path,
                c,
            );
            path.pop();
        }
    } else {
        let kind = ty.list_kind();
        let items_ty = ty.items();
        let la: &[Value] = l.and_then(Value::as_array).map_or(&[], Vec::as_slice);
        let ra: &[Value] = r.and_then(Value::as_array).map_or(&[], Vec::as_slice);
        let lpe = elements(la, &kind, items_ty);
        let rpe = elements(ra, &kind, items_ty);
        let mut order: Vec<&String> = Vec::new();
        let mut lmap: HashMap<&String, &Value> = HashMap::new();
        let mut rmap: HashMap<&String, &Value> = HashMap::new();
        for (pe, v) in lpe.iter().zip(la) {
            if lmap.insert(pe, v).is_none() {
                order.push(pe);
            }
        }
        for (pe, v) in rpe.iter().zip(ra) {
            if rmap.insert(pe, v).is_none() && !lmap.contains_key(pe) {
                order.push(pe);
            }
        }
        for pe in order {
            path.push(pe.clone());
            walk_compare(
                lmap.get(pe).copied(),
                rmap.get(pe).copied(),
                items_ty,
                path,
                c,
            );
            path.pop();
        }
    }
    // Containers and list items appear or disappear as a whole too (upstream's post-item hook).
    if !path.is_empty() {
        match (l, r) {
            (None, Some(_)) => c.added.insert(path.clone()),
            (Some(_), None) => c.removed.insert(path.clone()),
            _ => {}
        }
    }
}

/// Remove from `v` every field in `set` (with its subtree).
pub(crate) fn remove_items(v: &mut Value, set: &FieldSet, ty: Ty<'_>) {
    walk_remove(v, set, ty, &mut Vec::new());
}

fn walk_remove(v: &mut Value, set: &FieldSet, ty: Ty<'_>, path: &mut Path) {
    match v {
        Value::Object(m) if !ty.map_atomic() => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                path.push(fieldpath::field(&k));
                if set.contains(path) {
                    m.remove(&k);
                } else if set.has_prefix(path)
                    && let Some(child) = m.get_mut(&k)
                {
                    walk_remove(child, set, ty.field(&k), path);
                }
                path.pop();
            }
        }
        Value::Array(items) => {
            let kind = ty.list_kind();
            if kind == ListKind::Atomic {
                return;
            }
            let items_ty = ty.items();
            let pes = elements(items, &kind, items_ty);
            let old = std::mem::take(items);
            for (mut item, pe) in old.into_iter().zip(pes) {
                path.push(pe);
                if set.contains(path) {
                    path.pop();
                    continue;
                }
                if set.has_prefix(path) {
                    walk_remove(&mut item, set, items_ty, path);
                }
                path.pop();
                items.push(item);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "items": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "properties": {"name": {"type": "string"}, "v": {"type": "integer"}}}
                        },
                        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                        "args": {"type": "array", "items": {"type": "string"}},
                        "m": {"type": "object", "additionalProperties": {"type": "string"}}
                    }
                }
            }
        })
    }

    fn names(v: &Value) -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn merge_list_interleaves_like_upstream() {
        let s = schema();
        let ty = Ty::root(Some(&s), false).field("spec").field("items");
        let live = json!([{"name": "a"}, {"name": "x"}, {"name": "b"}, {"name": "c"}]);
        let cfg = json!([{"name": "c"}, {"name": "b"}, {"name": "d"}]);
        let out = merge(&live, &cfg, ty);
        // Shared items follow the applied order; live-only "a" and "x" keep their position.
        assert_eq!(names(&out), ["a", "x", "c", "b", "d"]);
    }

    #[test]
    fn field_set_members() {
        let s = schema();
        let ty = Ty::root(Some(&s), false);
        let v = json!({"spec": {"items": [{"name": "a", "v": 1}], "tags": ["t"], "args": ["x"], "m": {"k": "v"}, "e": {}}});
        let enc = to_field_set(&v, ty).to_fields_v1();
        assert_eq!(
            enc,
            json!({"f:spec": {
                "f:items": {"k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:v": {}}},
                "f:tags": {"v:\"t\"": {}},
                "f:args": {},
                "f:m": {"f:k": {}},
                "f:e": {}
            }})
        );
    }

    #[test]
    fn validate_reports_missing_keys_and_duplicates() {
        let s = schema();
        let ty = Ty::root(Some(&s), false);
        let err =
            validate(&json!({"spec": {"items": [{"v": 1}]}}), ty, &mut Vec::new()).unwrap_err();
        assert!(
            err.starts_with(".spec.items: element 0: associative list with keys"),
            "{err}"
        );
        let err = validate(
            &json!({"spec": {"items": [{"name": "a"}, {"name": "a"}]}}),
            ty,
            &mut Vec::new(),
        )
        .unwrap_err();
        assert_eq!(err, ".spec.items: duplicate entries for key [name=\"a\"]");
        let err =
            validate(&json!({"spec": {"tags": ["x", "x"]}}), ty, &mut Vec::new()).unwrap_err();
        assert_eq!(err, ".spec.tags: duplicate entries for key [=\"x\"]");
    }

    #[test]
    fn compare_reports_items_and_containers() {
        let s = schema();
        let ty = Ty::root(Some(&s), false);
        let old = json!({"spec": {"items": [{"name": "a", "v": 1}], "m": {"k": "1"}}});
        let new = json!({"spec": {"items": [{"name": "a", "v": 2}, {"name": "b"}]}});
        let c = compare(&old, &new, ty);
        let p = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(
            c.modified
                .contains(&p(&["f:spec", "f:items", "k:{\"name\":\"a\"}", "f:v"]))
        );
        assert!(
            c.added
                .contains(&p(&["f:spec", "f:items", "k:{\"name\":\"b\"}"]))
        );
        assert!(
            c.added
                .contains(&p(&["f:spec", "f:items", "k:{\"name\":\"b\"}", "f:name"]))
        );
        assert!(c.removed.contains(&p(&["f:spec", "f:m"])));
        assert!(c.removed.contains(&p(&["f:spec", "f:m", "f:k"])));
        assert!(!c.modified.contains(&p(&["f:spec"])));
    }

    #[test]
    fn remove_items_drops_fields_and_list_items() {
        let s = schema();
        let ty = Ty::root(Some(&s), false);
        let mut v =
            json!({"spec": {"items": [{"name": "a", "v": 1}, {"name": "b"}], "tags": ["t", "u"]}});
        let mut set = FieldSet::new();
        set.insert(vec![
            "f:spec".into(),
            "f:items".into(),
            "k:{\"name\":\"a\"}".into(),
        ]);
        set.insert(vec!["f:spec".into(), "f:tags".into(), "v:\"u\"".into()]);
        remove_items(&mut v, &set, ty);
        assert_eq!(
            v,
            json!({"spec": {"items": [{"name": "b"}], "tags": ["t"]}})
        );
    }
}
