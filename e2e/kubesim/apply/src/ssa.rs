//! Server-side apply and the bookkeeping of ordinary writes, after structured-merge-diff's
//! `merge.Updater` (`Apply`, `Update`, `prune`) and kube-apiserver's `fieldmanager`.

use crate::fieldpath::{self, FieldSet, Path};
use crate::last_applied;
use crate::managed::{self, APPLY, Entry, UPDATE};
use crate::typed;
use crate::types::Ty;
use crate::{ApplyError, ApplyRequest, TypeInfo};
use serde_json::{Map, Value, json};
use std::cmp::Ordering;

/// Fields kube-apiserver never records in managedFields (`stripMetaManager`); `metadata`
/// itself is stripped as a member only, its other children are tracked.
const IGNORED: &[&[&str]] = &[
    &["f:apiVersion"],
    &["f:kind"],
    &["f:metadata", "f:name"],
    &["f:metadata", "f:namespace"],
    &["f:metadata", "f:creationTimestamp"],
    &["f:metadata", "f:selfLink"],
    &["f:metadata", "f:uid"],
    &["f:metadata", "f:clusterName"],
    &["f:metadata", "f:generation"],
    &["f:metadata", "f:managedFields"],
    &["f:metadata", "f:resourceVersion"],
    &["f:metadata", "f:deletionTimestamp"],
    &["f:metadata", "f:deletionGracePeriodSeconds"],
];

/// The manager of fields that existed before the first apply to an unmanaged object.
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

fn is_status(p: &Path) -> bool {
    p.first().is_some_and(|e| e == "f:status")
}

/// Restrict a field set to what the write may own: no ignored metadata, and only `status`
/// on the status subresource / no `status` on the main resource of a kind with one.
/// (Removing the ignored paths and everything below them, plus the `metadata` member
/// itself, is exactly dropping the [`protected`] paths.)
fn scope(mut set: FieldSet, subresource: Option<&str>, has_status: bool) -> FieldSet {
    match subresource {
        Some("status") => set.retain(|p| !protected(p) && is_status(p)),
        _ if has_status => set.retain(|p| !protected(p) && !is_status(p)),
        _ => set.retain(|p| !protected(p)),
    }
    set
}

/// Paths pruning must never remove, whoever owned what.
fn protected(p: &Path) -> bool {
    (p.len() == 1 && p[0] == "f:metadata")
        || IGNORED
            .iter()
            .any(|i| p.len() >= i.len() && p[..i.len()] == **i)
}

/// Drop `null`s from maps: an applied `field: null` sets nothing (and owns nothing).
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn without_managed_fields(v: &Value) -> Value {
    let mut out = v.clone();
    if let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    out
}

fn api_version(v: &Value) -> &str {
    v.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

/// `group/version, Kind=kind`, as upstream prints a GroupVersionKind.
fn gvk(v: &Value) -> String {
    let av = api_version(v);
    let (g, ver) = av.rsplit_once('/').unwrap_or(("", av));
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    format!("{g}/{ver}, Kind={kind}")
}

/// The part of an applied configuration this apply may set.
fn scoped_config(
    applied: &Value,
    ty: Ty<'_>,
    subresource: Option<&str>,
    has_status: bool,
) -> Value {
    let mut config = applied.clone();
    strip_nulls(&mut config);
    typed::prune_unknown(&mut config, ty);
    if let Some(root) = config.as_object_mut() {
        if let Some(m) = root.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        match subresource {
            Some("status") => {
                root.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "status"))
            }
            _ if has_status => {
                root.remove("status");
            }
            _ => {}
        }
    }
    config
}

/// Upstream's set iteration order: at each level the members, then the children's subtrees.
fn upstream_order(a: &Path, b: &Path) -> Ordering {
    let n = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    match (a.len() == n, b.len() == n) {
        (true, true) => return Ordering::Equal,
        (true, false) => return Ordering::Less,
        (false, true) => return Ordering::Greater,
        _ => {}
    }
    let (a_member, b_member) = (a.len() == n + 1, b.len() == n + 1);
    if a_member != b_member {
        return if a_member {
            Ordering::Less
        } else {
            Ordering::Greater
        };
    }
    let rank = |e: &str| match e.get(..2) {
        Some("f:") => 0,
        Some("k:") => 1,
        Some("v:") => 2,
        _ => 3,
    };
    (rank(&a[n]), &a[n]).cmp(&(rank(&b[n]), &b[n]))
}

fn conflict_error(conflicts: &[(Entry, FieldSet)]) -> ApplyError {
    let mut by_manager: Vec<(&Entry, Vec<&Path>)> = conflicts
        .iter()
        .map(|(e, s)| {
            let mut paths: Vec<&Path> = s.iter().collect();
            paths.sort_by(|a, b| upstream_order(a, b));
            (e, paths)
        })
        .collect();
    by_manager.sort_by(|(a, _), (b, _)| {
        (&a.manager, &a.operation, &a.api_version, &a.subresource).cmp(&(
            &b.manager,
            &b.operation,
            &b.api_version,
            &b.subresource,
        ))
    });
    let pairs: Vec<(String, String)> = by_manager
        .iter()
        .flat_map(|(e, ps)| {
            ps.iter()
                .map(|p| (e.manager.clone(), fieldpath::display(p)))
        })
        .collect();
    let message = if pairs.len() == 1 {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            by_manager[0].0.describe(),
            pairs[0].1
        )
    } else {
        let mut lines = Vec::new();
        for (e, ps) in &by_manager {
            lines.push(format!("conflicts with {}:", e.describe()));
            lines.extend(ps.iter().map(|p| format!("- {}", fieldpath::display(p))));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            pairs.len(),
            lines.join("\n")
        )
    };
    ApplyError::Conflict {
        message,
        conflicts: pairs,
    }
}

/// See [`crate::server_side_apply`].
pub(crate) fn apply(
    live: Option<&Value>,
    applied: &Value,
    ti: &TypeInfo,
    req: &ApplyRequest<'_>,
) -> Result<Value, ApplyError> {
    if req.manager.is_empty() {
        return Err(ApplyError::Invalid(
            "fieldManager is required for apply requests".into(),
        ));
    }
    if !applied.is_object() {
        return Err(ApplyError::Invalid(
            "the applied configuration must be an object".into(),
        ));
    }
    if managed::raw(applied)
        .is_some_and(|m| !m.is_null() && m.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(ApplyError::Invalid(
            "metadata.managedFields must be nil".into(),
        ));
    }
    let ty = ti.root_ty();
    let has_status = ti.has_status_subresource();
    let config = scoped_config(applied, ty, req.subresource, has_status);
    typed::validate(&config, ty, &mut Vec::new()).map_err(|e| {
        ApplyError::Invalid(format!(
            "failed to create typed patch object ({}): {e}",
            gvk(applied)
        ))
    })?;

    let live_content = live.map_or_else(|| json!({}), without_managed_fields);
    let old_entries = live.map(managed::decode).unwrap_or_default();
    // An existing object nobody manages (written before field tracking) first gets all its
    // fields assigned to `before-first-apply`, as upstream's skipNonAppliedManager does.
    let old_entries = match live {
        Some(_) if old_entries.is_empty() => {
            let set = scope(typed::to_field_set(&live_content, ty), None, has_status);
            vec![Entry {
                manager: BEFORE_FIRST_APPLY.into(),
                operation: UPDATE.into(),
                api_version: api_version(applied).to_string(),
                time: Some(req.now.to_string()),
                subresource: String::new(),
                set,
            }]
            .into_iter()
            .filter(|e| !e.set.is_empty())
            .collect()
        }
        _ => old_entries,
    };
    let me = Entry {
        manager: req.manager.to_string(),
        operation: APPLY.into(),
        api_version: api_version(applied).to_string(),
        time: Some(req.now.to_string()),
        subresource: req.subresource.unwrap_or("").to_string(),
        set: scope(
            typed::to_field_set(&config, ty),
            req.subresource,
            has_status,
        ),
    };
    let previous = old_entries.iter().find(|e| e.same_manager(&me));

    let mut merged = typed::merge(&live_content, &config, ty);
    if let Some(prev) = previous {
        // Prune what this manager applied last time and omits now, unless someone owns it
        // (a field, or something below it). The union of the owners' sets with their
        // ancestors is not built: each set is asked.
        let others: Vec<&Entry> = old_entries
            .iter()
            .filter(|e| !e.same_manager(&me))
            .collect();
        let owned = |p: &Path| me.set.covers(p) || others.iter().any(|e| e.set.covers(p));
        let mut to_remove = prev.set.with_ancestors();
        to_remove.retain(|p| !protected(p) && !owned(p));
        typed::remove_items(&mut merged, &to_remove, ty);
    }

    let cmp = typed::compare(&live_content, &merged, ty);
    let changed = cmp.modified.union(&cmp.added);
    let conflicts: Vec<(Entry, FieldSet)> = old_entries
        .iter()
        .filter(|e| !e.same_manager(&me) && e.set.intersects(&changed))
        .map(|e| (e.clone(), e.set.intersection(&changed)))
        .collect();
    if !conflicts.is_empty() && !req.force {
        // kubectl upgrading from client-side apply: fields its annotation vouches for are
        // taken over as if forced; any other conflict still fails.
        let allowed = (req.manager == last_applied::KUBECTL)
            .then(|| last_applied::allowed_conflicts(&live_content, ty))
            .flatten();
        let Some(allowed) = allowed else {
            return Err(conflict_error(&conflicts));
        };
        let remaining: Vec<(Entry, FieldSet)> = conflicts
            .iter()
            .map(|(e, s)| (e.clone(), s.difference(&allowed)))
            .filter(|(_, s)| !s.is_empty())
            .collect();
        if !remaining.is_empty() {
            return Err(conflict_error(&remaining));
        }
    }

    let mut entries: Vec<Entry> = Vec::with_capacity(old_entries.len() + 1);
    let mut placed = false;
    for e in &old_entries {
        if e.same_manager(&me) {
            let unchanged =
                e.set == me.set && e.api_version == me.api_version && merged == live_content;
            entries.push(Entry {
                time: if unchanged {
                    e.time.clone()
                } else {
                    me.time.clone()
                },
                ..me.clone()
            });
            placed = true;
        } else {
            let mut e = e.clone();
            e.set.remove_all(&changed);
            e.set.remove_all(&cmp.removed);
            entries.push(e);
        }
    }
    if !placed {
        entries.push(me);
    }
    entries.retain(|e| !e.set.is_empty());
    managed::cap_update_managers(&mut entries);
    if req.manager == last_applied::KUBECTL {
        last_applied::sync(&mut merged, applied);
    }

    if let Some(live) = live
        && merged == live_content
        && entries == old_entries
    {
        return Ok(live.clone());
    }
    managed::store(&mut merged, &entries);
    Ok(merged)
}

/// See [`crate::record_update`].
pub(crate) fn update(
    old: Option<&Value>,
    new: &mut Value,
    ti: &TypeInfo,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) {
    let ty = ti.root_ty();
    let has_status = ti.has_status_subresource();
    // A writer that changed managedFields itself (e.g. reset them) is believed, as upstream.
    let new_raw = managed::raw(new).cloned();
    let old_raw = old.and_then(managed::raw).cloned();
    let base_raw = match (&new_raw, &old_raw) {
        (Some(n), o) if Some(n) != o.as_ref() => Some(n.clone()),
        _ => old_raw,
    };
    let base_entries = base_raw
        .as_ref()
        .map(|r| managed::decode(&json!({"metadata": {"managedFields": r}})))
        .unwrap_or_default();

    // Updates of an existing object nobody manages are not tracked (upstream
    // skipNonAppliedManager); only creates and applies start tracking.
    if old.is_some() && base_entries.is_empty() {
        if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        return;
    }
    let old_content = old.map_or_else(|| json!({}), without_managed_fields);
    let new_content = without_managed_fields(new);
    let cmp = typed::compare(&old_content, &new_content, ty);
    let changed = scope(cmp.modified.union(&cmp.added), subresource, has_status);
    let removed = scope(cmp.removed, subresource, has_status);

    let me = Entry {
        manager: manager.to_string(),
        operation: UPDATE.into(),
        api_version: api_version(new).to_string(),
        time: Some(now.to_string()),
        subresource: subresource.unwrap_or("").to_string(),
        set: changed.clone(),
    };
    let mut entries: Vec<Entry> = base_entries
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.set.remove_all(&changed);
            e.set.remove_all(&removed);
            e
        })
        .collect();
    if !changed.is_empty() {
        match entries.iter_mut().find(|e| e.same_manager(&me)) {
            Some(e) => {
                e.set = e.set.union(&changed);
                e.time = me.time.clone();
            }
            None => entries.push(me),
        }
    }
    entries.retain(|e| !e.set.is_empty());
    managed::cap_update_managers(&mut entries);

    if entries == base_entries {
        // Nothing moved: keep the stored encoding byte for byte.
        if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            match base_raw {
                Some(r) => m.insert("managedFields".into(), r),
                None => m.remove("managedFields"),
            };
        }
        return;
    }
    if !new.is_object() {
        return;
    }
    if new.get("metadata").is_none_or(|m| !m.is_object())
        && let Some(root) = new.as_object_mut()
    {
        root.insert("metadata".into(), Value::Object(Map::new()));
    }
    managed::store(new, &entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(els: &[&str]) -> Path {
        els.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn members_sort_before_subtrees() {
        let mut v = vec![
            p(&["f:spec", "f:a", "f:x"]),
            p(&["f:spec", "f:b"]),
            p(&["f:spec", "f:a"]),
        ];
        v.sort_by(upstream_order);
        assert_eq!(
            v,
            vec![
                p(&["f:spec", "f:a"]),
                p(&["f:spec", "f:b"]),
                p(&["f:spec", "f:a", "f:x"])
            ]
        );
    }

    #[test]
    fn scope_strips_ignored_metadata_and_status() {
        let mut s = FieldSet::new();
        s.insert(p(&["f:metadata"]));
        s.insert(p(&["f:metadata", "f:name"]));
        s.insert(p(&["f:metadata", "f:labels", "f:a"]));
        s.insert(p(&["f:status", "f:x"]));
        s.insert(p(&["f:apiVersion"]));
        let main = scope(s.clone(), None, true);
        assert_eq!(
            main.iter().collect::<Vec<_>>(),
            vec![&p(&["f:metadata", "f:labels", "f:a"])]
        );
        let status = scope(s.clone(), Some("status"), true);
        assert_eq!(
            status.iter().collect::<Vec<_>>(),
            vec![&p(&["f:status", "f:x"])]
        );
        assert_eq!(scope(s, None, false).iter().count(), 2);
    }

    /// The definition `scope` had: the ignored paths and their subtrees removed, then the
    /// `metadata` member, then the status rule.
    fn scope_by_definition(
        set: &FieldSet,
        subresource: Option<&str>,
        has_status: bool,
    ) -> Vec<Path> {
        let mut ignored = FieldSet::new();
        for i in IGNORED {
            ignored.insert(i.iter().map(|e| e.to_string()).collect());
        }
        set.recursive_difference(&ignored)
            .iter()
            .filter(|q| q.len() != 1 || q[0] != "f:metadata")
            .filter(|q| match subresource {
                Some("status") => is_status(q),
                _ if has_status => !is_status(q),
                _ => true,
            })
            .cloned()
            .collect()
    }

    #[test]
    fn scope_matches_its_definition() {
        let mut s = FieldSet::new();
        for q in [
            p(&[]),
            p(&["f:apiVersion"]),
            p(&["f:kind", "f:x"]),
            p(&["f:metadata"]),
            p(&["f:metadata", "f:name"]),
            p(&["f:metadata", "f:managedFields", "i:0"]),
            p(&["f:metadata", "f:labels"]),
            p(&["f:metadata", "f:labels", "f:a"]),
            p(&["f:metadata", "f:uidx"]),
            p(&["f:spec", "f:metadata", "f:name"]),
            p(&["f:status"]),
            p(&["f:status", "f:x"]),
            p(&["f:statusx"]),
        ] {
            s.insert(q);
        }
        for sub in [None, Some("status")] {
            for has_status in [false, true] {
                assert_eq!(
                    scope(s.clone(), sub, has_status)
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>(),
                    scope_by_definition(&s, sub, has_status),
                    "{sub:?} {has_status}"
                );
            }
        }
    }
}
