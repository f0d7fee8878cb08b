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

/// Upstream keeps at most this many `Update` entries (`DefaultMaxUpdateManagers`).
const MAX_UPDATE_MANAGERS: usize = 10;
/// The bucket the oldest updaters are merged into (`ancient-changes`), one per apiVersion.
pub(crate) const ANCIENT_CHANGES: &str = "ancient-changes";

/// Merge the oldest `Update` entries into per-apiVersion `ancient-changes` buckets until at
/// most ten updaters remain (upstream `capManagersManager`).
pub(crate) fn cap_update_managers(entries: &mut Vec<Entry>) {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].operation == UPDATE)
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort_by(|&a, &b| {
        (&entries[a].time, &entries[a].manager).cmp(&(&entries[b].time, &entries[b].manager))
    });
    let mut remaining = updaters.len();
    let mut first_of_version: Vec<(String, usize)> = Vec::new();
    let mut doomed: Vec<usize> = Vec::new();
    for &i in &updaters {
        if remaining <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = entries[i].api_version.clone();
        match first_of_version.iter().find(|(v, _)| *v == version) {
            Some(&(_, first)) => {
                // The first entry of this version becomes the bucket.
                let set = entries[i].set.clone();
                let time = entries[i].time.clone();
                let bucket = &mut entries[first];
                bucket.manager = ANCIENT_CHANGES.to_string();
                bucket.subresource.clear();
                bucket.set = bucket.set.union(&set);
                bucket.time = time;
                doomed.push(i);
                remaining -= 1;
            }
            None => first_of_version.push((version, i)),
        }
    }
    doomed.sort_unstable();
    for i in doomed.into_iter().rev() {
        entries.remove(i);
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
