//! `metadata.managedFields`: decoding, encoding and the identity of an entry.

use crate::fieldpath::FieldSet;
use serde_json::{Map, Value};

/// `operation: Apply`.
pub(crate) const APPLY: &str = "Apply";
/// `operation: Update`.
pub(crate) const UPDATE: &str = "Update";

/// One `managedFields` entry with its field set decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) manager: String,
    pub(crate) operation: String,
    pub(crate) api_version: String,
    pub(crate) time: Option<String>,
    pub(crate) subresource: String,
    pub(crate) set: FieldSet,
}

impl Entry {
    /// Whether `self` and `other` are the same manager in upstream's sense
    /// (`BuildManagerIdentifier`): appliers are one manager across API versions.
    pub(crate) fn same_manager(&self, other: &Entry) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
            && (self.operation == APPLY || self.api_version == other.api_version)
    }

    /// How kube-apiserver names this manager in a conflict message (`printManager`).
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == UPDATE {
            // The manager identifier carries no time, so upstream prints none.
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), self.manager.clone().into());
        m.insert("operation".into(), self.operation.clone().into());
        m.insert("apiVersion".into(), self.api_version.clone().into());
        if let Some(t) = &self.time {
            m.insert("time".into(), t.clone().into());
        }
        m.insert("fieldsType".into(), "FieldsV1".into());
        m.insert("fieldsV1".into(), self.set.to_fields_v1());
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), self.subresource.clone().into());
        }
        Value::Object(m)
    }

    fn from_json(v: &Value) -> Result<Entry, String> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let operation = s("operation").unwrap_or_default();
        if operation != APPLY && operation != UPDATE {
            return Err(format!("invalid managedFields operation {operation:?}"));
        }
        if let Some(t) = s("fieldsType")
            && t != "FieldsV1"
        {
            return Err(format!("invalid managedFields fieldsType {t:?}"));
        }
        let set = match v.get("fieldsV1") {
            Some(f) => FieldSet::from_fields_v1(f)?,
            None => FieldSet::new(),
        };
        Ok(Entry {
            manager: s("manager").unwrap_or_default(),
            operation,
            api_version: s("apiVersion").unwrap_or_default(),
            time: s("time"),
            subresource: s("subresource").unwrap_or_default(),
            set,
        })
    }
}

/// The `metadata.managedFields` value of an object, if any.
pub(crate) fn raw(obj: &Value) -> Option<&Value> {
    obj.get("metadata").and_then(|m| m.get("managedFields"))
}

/// Decode an object's managedFields. Malformed entries are dropped (kube-apiserver resets
/// managed fields it cannot decode rather than failing writes); entries naming the same
/// manager are merged.
pub(crate) fn decode(obj: &Value) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for e in raw(obj).and_then(Value::as_array).into_iter().flatten() {
        let Ok(e) = Entry::from_json(e) else { continue };
        match out.iter_mut().find(|o| o.same_manager(&e)) {
            Some(o) => o.set = o.set.union(&e.set),
            None => out.push(e),
        }
    }
    out
}

/// Encode entries in upstream's order (operation, time, manager, apiVersion, subresource),
/// dropping empty ones.
pub(crate) fn encode(entries: &[Entry]) -> Value {
    let mut sorted: Vec<&Entry> = entries.iter().filter(|e| !e.set.is_empty()).collect();
    sorted.sort_by(|a, b| {
        (
            &a.operation,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                &b.operation,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    Value::Array(sorted.into_iter().map(Entry::to_json).collect())
}

/// Store `entries` in `obj.metadata.managedFields` (removing the field when none is left).
pub(crate) fn store(obj: &mut Value, entries: &[Entry]) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let encoded = encode(entries);
    if encoded.as_array().is_some_and(Vec::is_empty) {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), encoded);
    }
}
