//! Object-metadata helpers: names, timestamps, generateName, and the error shapes
//! kube-apiserver uses for them.

use crate::ApiError;
use serde_json::{Value, json};

/// The message kube-apiserver appends for an invalid DNS-1123 subdomain.
pub const DNS_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// The message kube-apiserver appends for an invalid DNS-1123 label.
pub const DNS_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_dns_label_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// RFC 1123 subdomain (`metadata.name` of most kinds).
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label_part)
}

/// RFC 1123 label (namespace names).
pub fn is_dns_label(s: &str) -> bool {
    is_dns_label_part(s)
}

/// Current time as kube-apiserver renders `metav1.Time` (RFC 3339, seconds, `Z`).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Five random characters from kube-apiserver's `generateName` alphabet.
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

/// A new object UID.
pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `metadata.<field>` as a string.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// Make `obj` an object with an object `metadata`, so that `obj["metadata"][k] = v` cannot
/// panic. Returns `false` (and leaves `obj` alone) when `obj` or its `metadata` has the wrong
/// JSON type.
pub fn ensure_metadata(obj: &mut Value) -> bool {
    let Some(root) = obj.as_object_mut() else {
        return false;
    };
    let m = root.entry("metadata").or_insert_with(|| json!({}));
    if m.is_null() {
        *m = json!({});
    }
    m.is_object()
}

/// `metadata.finalizers` (empty when absent).
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `<Kind>` or `<Kind>.<group>`, as `schema.GroupKind.String()` renders it in messages.
pub fn qualified_kind(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    }
}

/// One field error of a 422 (`reason` is a `metav1.CauseType`).
#[derive(Debug, Clone)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired` …
    pub reason: String,
    /// Field path (`metadata.name`).
    pub field: String,
    /// `Invalid value: "x": ...` (the error body without the field).
    pub detail: String,
}

/// `422 Invalid`: `<Kind>.<group> "<name>" is invalid: <errors>` with `details.causes`.
pub fn invalid(group: &str, kind: &str, name: &str, causes: &[Cause]) -> ApiError {
    let rendered: Vec<String> = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.detail))
        .collect();
    let agg = if rendered.len() == 1 {
        rendered[0].clone()
    } else {
        format!("[{}]", rendered.join(", "))
    };
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!(
            "{} \"{name}\" is invalid: {agg}",
            qualified_kind(group, kind)
        ),
    );
    e.details = Some(json!({
        "name": name,
        "group": group,
        "kind": kind,
        "causes": causes.iter().map(|c| json!({
            "reason": c.reason,
            "message": c.detail,
            "field": c.field,
        })).collect::<Vec<_>>(),
    }));
    e
}

/// Details `{name, group, kind}` as kube-apiserver attaches them to 404/409 errors.
pub fn with_details(mut e: ApiError, group: &str, plural: &str, name: &str) -> ApiError {
    e.details = Some(json!({"name": name, "group": group, "kind": plural}));
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain("A"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain(""));
        assert!(is_dns_label("kube-system"));
        assert!(!is_dns_label("a.b"));
    }

    #[test]
    fn suffix_alphabet() {
        let s = random_suffix();
        assert_eq!(s.len(), 5);
        assert!(s.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
    }

    #[test]
    fn invalid_message_shape() {
        let one = invalid(
            "spire.spiffe.io",
            "ClusterSPIFFEID",
            "x",
            &[Cause {
                reason: "FieldValueRequired".into(),
                field: "spec.spiffeIDTemplate".into(),
                detail: "Required value".into(),
            }],
        );
        assert_eq!(
            one.message,
            "ClusterSPIFFEID.spire.spiffe.io \"x\" is invalid: spec.spiffeIDTemplate: Required value"
        );
        assert_eq!(one.code, 422);
    }
}
