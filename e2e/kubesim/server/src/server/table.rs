//! `Table` output (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), which `kubectl get`
//! asks for: NAME, CRD `additionalPrinterColumns` (simple JSONPath) or, without them, AGE.
//! Also `PartialObjectMetadata` conversion (`as=PartialObjectMetadata[List]`).

use chrono::{DateTime, Utc};
use kubesim_store::ResourceInfo;
use serde_json::{Value, json};

/// What representation the client asked for in `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// The object itself.
    Object,
    /// `meta.k8s.io` `Table`.
    Table,
    /// `meta.k8s.io` `PartialObjectMetadata` / `PartialObjectMetadataList`.
    PartialMetadata,
}

impl Representation {
    /// Pick from an `Accept` header: the first listed media type we can serve wins.
    pub fn from_accept(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::Object;
        };
        for media in accept.split(',') {
            let params: Vec<&str> = media.split(';').map(str::trim).collect();
            let as_ = params.iter().find_map(|p| p.strip_prefix("as="));
            let group = params.iter().find_map(|p| p.strip_prefix("g="));
            match (as_, group) {
                (Some("Table"), Some("meta.k8s.io")) => return Self::Table,
                (
                    Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                    Some("meta.k8s.io"),
                ) => return Self::PartialMetadata,
                (None, _) => return Self::Object,
                _ => continue,
            }
        }
        Self::Object
    }
}

/// kube's `duration.HumanDuration` (short form `kubectl get` prints under AGE).
pub fn human_duration(secs: i64) -> String {
    let s = secs.max(0);
    if s < 60 * 2 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        let rem = s % 60;
        return if rem == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rem}s")
        };
    }
    if m < 60 * 3 {
        return format!("{m}m");
    }
    let h = m / 60;
    if h < 8 {
        let rem = m % 60;
        return if rem == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rem}m")
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        let d = h / 24;
        let rem = h % 24;
        return if rem == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{rem}h")
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    format!("{}y", h / 24 / 365)
}

fn age(obj: &Value, now: DateTime<Utc>) -> String {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| human_duration((now - t.with_timezone(&Utc)).num_seconds()))
        .unwrap_or_else(|| "<unknown>".into())
}

/// Evaluate a simple JSONPath (`.spec.a.b`, `.status.conditions[0].type`,
/// `.status.conditions[?(@.type=="Ready")].status`).
pub fn simple_jsonpath<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut cur = obj;
    let mut rest = path.trim_start_matches('$');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            if !key.is_empty() {
                cur = cur.get(key)?;
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let sel = &r[..end];
            rest = &r[end + 1..];
            if let Ok(i) = sel.parse::<usize>() {
                cur = cur.get(i)?;
            } else if let Some(filter) = sel.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')'))
            {
                let (field, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                cur = cur
                    .as_array()?
                    .iter()
                    .find(|item| item.get(field.trim()).and_then(Value::as_str) == Some(want))?;
            } else {
                let key = sel.trim_matches(|c| c == '"' || c == '\'');
                cur = cur.get(key)?;
            }
        } else {
            return None;
        }
    }
    Some(cur)
}

fn cell(v: Option<&Value>, ty: &str, now: DateTime<Utc>) -> Value {
    match v {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) if ty == "date" => DateTime::parse_from_rfc3339(s)
            .map(|t| json!(human_duration((now - t.with_timezone(&Utc)).num_seconds())))
            .unwrap_or_else(|_| json!(s)),
        Some(Value::String(s)) => json!(s),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => v.clone(),
        Some(other) => json!(other.to_string()),
    }
}

fn columns(res: &ResourceInfo) -> Vec<Value> {
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace."
    })];
    if res.printer_columns.is_empty() {
        cols.push(json!({
            "name": "Age", "type": "date", "format": "", "priority": 0,
            "description": "CreationTimestamp is a timestamp representing the server time when this object was created."
        }));
    } else {
        for c in &res.printer_columns {
            cols.push(json!({
                "name": c.get("name").cloned().unwrap_or(json!("")),
                "type": c.get("type").cloned().unwrap_or(json!("string")),
                "format": c.get("format").cloned().unwrap_or(json!("")),
                "priority": c.get("priority").cloned().unwrap_or(json!(0)),
                "description": c.get("description").cloned().unwrap_or(json!("")),
            }));
        }
    }
    cols
}

/// `PartialObjectMetadata` of an object.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// `?includeObject=` (`None`, `Metadata` — the default — or `Object`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No object in rows.
    None,
    /// `PartialObjectMetadata` in rows.
    #[default]
    Metadata,
    /// The full object in rows.
    Object,
}

impl IncludeObject {
    /// From the query parameter.
    pub fn parse(v: Option<&str>) -> Self {
        match v {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

fn row(res: &ResourceInfo, obj: &Value, include: IncludeObject, now: DateTime<Utc>) -> Value {
    let name = obj.pointer("/metadata/name").cloned().unwrap_or(json!(""));
    let mut cells = vec![name];
    if res.printer_columns.is_empty() {
        cells.push(json!(age(obj, now)));
    } else {
        for c in &res.printer_columns {
            let path = c.get("jsonPath").and_then(Value::as_str).unwrap_or("");
            let ty = c.get("type").and_then(Value::as_str).unwrap_or("string");
            cells.push(cell(simple_jsonpath(obj, path), ty, now));
        }
    }
    let mut r = json!({"cells": cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => r["object"] = partial_metadata(obj),
        IncludeObject::Object => r["object"] = obj.clone(),
    }
    r
}

/// A `Table` for one object or a list (`items`); `headers = false` omits the column
/// definitions (watch events after the first).
pub fn to_table(res: &ResourceInfo, value: &Value, include: IncludeObject, headers: bool) -> Value {
    let now = Utc::now();
    let (rows, meta) = match value.get("items").and_then(Value::as_array) {
        Some(items) => (
            items
                .iter()
                .map(|o| row(res, o, include, now))
                .collect::<Vec<_>>(),
            json!({
                "resourceVersion": value.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!("")),
                "continue": value.pointer("/metadata/continue").cloned().unwrap_or(json!("")),
            }),
        ),
        None => (
            vec![row(res, value, include, now)],
            json!({"resourceVersion": value.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""))}),
        ),
    };
    let cols = if headers { columns(res) } else { vec![] };
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": cols,
        "rows": rows,
    })
}

/// A `PartialObjectMetadataList` for a list, or `PartialObjectMetadata` for one object.
pub fn to_partial(value: &Value) -> Value {
    match value.get("items").and_then(Value::as_array) {
        Some(items) => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": value.get("metadata").cloned().unwrap_or(json!({})),
            "items": items.iter().map(partial_metadata).collect::<Vec<_>>(),
        }),
        None => partial_metadata(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        assert_eq!(
            Representation::from_accept(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            )),
            Representation::Table
        );
        assert_eq!(
            Representation::from_accept(Some("application/json, */*")),
            Representation::Object
        );
        assert_eq!(
            Representation::from_accept(Some(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            )),
            Representation::PartialMetadata
        );
        assert_eq!(Representation::from_accept(None), Representation::Object);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400), "3d");
    }

    #[test]
    fn jsonpath_subset() {
        let o = json!({"spec": {"a": {"b": 3}}, "status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "Other", "status": "False"}
        ]}});
        assert_eq!(simple_jsonpath(&o, ".spec.a.b"), Some(&json!(3)));
        assert_eq!(
            simple_jsonpath(&o, ".status.conditions[1].type"),
            Some(&json!("Other"))
        );
        assert_eq!(
            simple_jsonpath(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(&json!("True"))
        );
        assert_eq!(simple_jsonpath(&o, ".spec.missing"), None);
    }
}
