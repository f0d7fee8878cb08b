//! Version conversion between how an object is stored and how a served version shows it:
//! custom resources (conversion strategy `None`: only `apiVersion` changes) and
//! `events.k8s.io/v1` Events, which kube-apiserver stores as core/v1 Events.

use crate::ResourceInfo;
use serde_json::Value;

/// `(events.k8s.io/v1 field, core/v1 field)` pairs that differ between the two Event APIs.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("reportingController", "reportingComponent"),
];

/// How one served resource maps onto its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Conversion {
    /// Stored as served.
    Identity,
    /// A custom resource stored under another version.
    ApiVersion {
        /// `apiVersion` as served.
        served: String,
        /// `apiVersion` as stored.
        storage: String,
    },
    /// `events.k8s.io/v1` served from core/v1 storage.
    EventsV1,
}

/// Whether `r` is `events.k8s.io/v1` events.
pub(crate) fn is_events_v1(r: &ResourceInfo) -> bool {
    r.group == "events.k8s.io" && r.plural == "events"
}

/// The storage key of a served resource: `plural` or `plural.group`, except that
/// `events.k8s.io` events share core `events` storage.
pub(crate) fn storage_key(r: &ResourceInfo) -> String {
    if is_events_v1(r) {
        "events".to_string()
    } else {
        r.resource_group()
    }
}

fn rename(v: &mut Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) {
    let Some(m) = v.as_object_mut() else {
        return;
    };
    for (from, to) in pairs {
        if let Some(x) = m.remove(from) {
            m.insert(to.to_string(), x);
        }
    }
}

impl Conversion {
    /// Stored form → served form.
    pub fn to_served(&self, v: &mut Value) {
        if !v.is_object() {
            return;
        }
        match self {
            Conversion::Identity => {}
            Conversion::ApiVersion { served, .. } => v["apiVersion"] = Value::from(served.clone()),
            Conversion::EventsV1 => {
                rename(v, EVENT_FIELDS.iter().map(|(e, c)| (*c, *e)));
                v["apiVersion"] = Value::from("events.k8s.io/v1");
            }
        }
    }

    /// Served form → stored form.
    pub fn to_storage(&self, v: &mut Value) {
        if !v.is_object() {
            return;
        }
        match self {
            Conversion::Identity => {}
            Conversion::ApiVersion { storage, .. } => {
                v["apiVersion"] = Value::from(storage.clone())
            }
            Conversion::EventsV1 => {
                rename(v, EVENT_FIELDS.iter().copied());
                v["apiVersion"] = Value::from("v1");
            }
        }
    }

    /// A field path as served (`regarding.name`) → as stored (`involvedObject.name`), for
    /// field selectors evaluated on stored objects.
    pub fn storage_field(&self, field: &str) -> String {
        if *self == Conversion::EventsV1 {
            let (head, rest) = match field.split_once('.') {
                Some((h, r)) => (h, Some(r)),
                None => (field, None),
            };
            if let Some((_, core)) = EVENT_FIELDS.iter().find(|(e, _)| *e == head) {
                return match rest {
                    Some(r) => format!("{core}.{r}"),
                    None => core.to_string(),
                };
            }
        }
        field.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_round_trip() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "p"}, "message": "m", "count": 2,
            "reportingComponent": "kleym", "reason": "R"});
        let mut served = core.clone();
        Conversion::EventsV1.to_served(&mut served);
        assert_eq!(served["apiVersion"], "events.k8s.io/v1");
        assert_eq!(served["regarding"]["name"], "p");
        assert_eq!(served["note"], "m");
        assert_eq!(served["deprecatedCount"], 2);
        assert_eq!(served["reportingController"], "kleym");
        assert_eq!(served["reason"], "R");
        assert!(served.get("message").is_none());
        let mut back = served;
        Conversion::EventsV1.to_storage(&mut back);
        assert_eq!(back, core);
        assert_eq!(
            Conversion::EventsV1.storage_field("regarding.name"),
            "involvedObject.name"
        );
        assert_eq!(Conversion::EventsV1.storage_field("type"), "type");
        assert_eq!(
            Conversion::Identity.storage_field("regarding.name"),
            "regarding.name"
        );
    }
}
