//! kubectl's client-side-apply annotation during server-side applies by the `kubectl` field
//! manager (upstream `lastAppliedManager` and `lastAppliedUpdater`): conflicts on fields the
//! annotation says kubectl applied (with unchanged values) are forgiven, and the annotation is
//! kept in sync with the server-side applied configuration.

use crate::fieldpath::FieldSet;
use crate::typed;
use crate::types::Ty;
use serde_json::Value;

/// The client-side apply annotation.
pub(crate) const ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// The only field manager this applies to.
pub(crate) const KUBECTL: &str = "kubectl";

fn annotation(obj: &Value) -> Option<&str> {
    obj.get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(ANNOTATION))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Fields set in `live`'s last-applied annotation whose live values still match it.
pub(crate) fn allowed_conflicts(live: &Value, ty: Ty<'_>) -> Option<FieldSet> {
    let last: Value = serde_json::from_str(annotation(live)?).ok()?;
    if !last.is_object() {
        return None;
    }
    let cmp = typed::compare(&last, live, ty);
    Some(
        typed::to_field_set(&last, ty)
            .difference(&cmp.modified)
            .difference(&cmp.added)
            .difference(&cmp.removed),
    )
}

/// If `merged` carries the annotation, replace it with `applied` (minus the annotation),
/// encoded as upstream does (compact JSON with a trailing newline).
pub(crate) fn sync(merged: &mut Value, applied: &Value) {
    if annotation(merged).is_none() {
        return;
    }
    let mut doc = applied.clone();
    if let Some(a) = doc
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        a.remove(ANNOTATION);
    }
    let Ok(mut text) = serde_json::to_string(&doc) else {
        return;
    };
    text.push('\n');
    if let Some(a) = merged
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
    {
        a.insert(ANNOTATION.to_string(), Value::String(text));
    }
}
