//! Object-metadata helpers: names, timestamps, generateName, and the error shapes
//! kube-apiserver uses for them.

use crate::ApiError;
use serde_json::{Value, json};

/// The message kube-apiserver appends for an invalid DNS-1123 subdomain.
pub const DNS_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// The message kube-apiserver appends for an invalid DNS-1123 label.
pub const DNS_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// The message kube-apiserver appends for an invalid DNS-1035 label (Service names).
pub const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// Longest DNS-1123 subdomain (`validation.DNS1123SubdomainMaxLength`).
pub const DNS1123_SUBDOMAIN_MAX_LEN: usize = 253;
/// Longest DNS-1123 or DNS-1035 label (`validation.DNS1123LabelMaxLength`).
pub const DNS_LABEL_MAX_LEN: usize = 63;
/// Longest `generateName` prefix kept before the random suffix (kube-apiserver's
/// `names.MaxGeneratedNameLength`: 63 minus the 5 random characters).
pub const MAX_GENERATED_PREFIX_LEN: usize = 58;

/// `must be no more than N characters` (`validation.MaxLenError`).
fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// One dot-free part of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length: the regex alone,
/// as kube-apiserver's `dns1123LabelRegexp` matches it (the length is checked apart).
fn matches_label_regex(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`: dot-separated parts of
/// any length each. Kubernetes limits only the whole name (253), not each part, unlike DNS.
fn matches_subdomain_regex(s: &str) -> bool {
    s.split('.').all(matches_label_regex)
}

/// `validation.IsDNS1123Subdomain`: the messages for `s`, empty when valid.
pub fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX_LEN {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LEN));
    }
    if !matches_subdomain_regex(s) {
        errs.push(DNS_SUBDOMAIN_MSG.to_string());
    }
    errs
}

/// `validation.IsDNS1123Label`: the messages for `s`, empty when valid.
pub fn dns1123_label_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS_LABEL_MAX_LEN {
        errs.push(max_len_error(DNS_LABEL_MAX_LEN));
    }
    if !matches_label_regex(s) {
        if matches_subdomain_regex(s) {
            // A valid subdomain but not a label: the length is checked above, so it has dots.
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(DNS_LABEL_MSG.to_string());
        }
    }
    errs
}

/// `validation.IsDNS1035Label`: the messages for `s`, empty when valid.
pub fn dns1035_label_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS_LABEL_MAX_LEN {
        errs.push(max_len_error(DNS_LABEL_MAX_LEN));
    }
    if !(matches_label_regex(s) && s.as_bytes()[0].is_ascii_lowercase()) {
        errs.push(DNS1035_LABEL_MSG.to_string());
    }
    errs
}

/// `path.IsValidPathSegmentName` (`prefix`: `IsValidPathSegmentPrefix`, which allows `.`
/// and `..` since a suffix follows): the messages for `s`, empty when valid.
pub fn path_segment_errors(s: &str, prefix: bool) -> Vec<String> {
    if !prefix && (s == "." || s == "..") {
        return vec![format!("may not be '{s}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|c| s.contains(*c))
        .map(|c| format!("may not contain '{c}'"))
        .collect()
}

/// RFC 1123 subdomain (`metadata.name` of most kinds): at most 253 characters in all.
pub fn is_dns_subdomain(s: &str) -> bool {
    dns1123_subdomain_errors(s).is_empty()
}

/// RFC 1123 label (namespace names): at most 63 characters, no dots.
pub fn is_dns_label(s: &str) -> bool {
    dns1123_label_errors(s).is_empty()
}

/// How kube-apiserver validates a resource's `metadata.name` (its `ValidateNameFunc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// `NameIsDNSSubdomain`: most kinds, every custom resource.
    Dns1123Subdomain,
    /// `NameIsDNSLabel`: namespaces.
    Dns1123Label,
    /// `NameIsDNS1035Label`: services.
    Dns1035Label,
    /// `path.ValidatePathSegmentName` as RBAC's `ValidateRBACName` applies it: roles,
    /// cluster roles and their bindings (`system:auth-delegator`).
    PathSegment,
    /// No name rule: core/v1 Events, which kube-apiserver validates only with its legacy
    /// event checks for backwards compatibility.
    Unchecked,
}

impl NameRule {
    /// The messages for `name`; `prefix` when it is a `generateName` (a trailing `-` is
    /// masked, as kube-apiserver's `maskTrailingDash` does, since a suffix follows).
    pub fn errors(self, name: &str, prefix: bool) -> Vec<String> {
        let masked;
        let name = match name.len().checked_sub(2).and_then(|n| name.get(..n)) {
            // `name[:len(name)-2] + "a"`, as kube-apiserver writes it: the dash and the
            // character before it become one `a`.
            Some(head) if prefix && name.ends_with('-') => {
                masked = format!("{head}a");
                masked.as_str()
            }
            _ => name,
        };
        match self {
            NameRule::Dns1123Subdomain => dns1123_subdomain_errors(name),
            NameRule::Dns1123Label => dns1123_label_errors(name),
            NameRule::Dns1035Label => dns1035_label_errors(name),
            // `ValidateRBACName` ignores `prefix`.
            NameRule::PathSegment => path_segment_errors(name, false),
            NameRule::Unchecked => Vec::new(),
        }
    }
}

/// The name kube-apiserver's `SimpleNameGenerator` makes of a `generateName`: the prefix cut
/// to [`MAX_GENERATED_PREFIX_LEN`] bytes, plus five random characters.
pub fn generate_name(prefix: &str) -> String {
    let mut cut = prefix.len().min(MAX_GENERATED_PREFIX_LEN);
    // Go cuts bytes; a name with non-ASCII characters is invalid anyway, so cutting at the
    // character boundary below changes no verdict and cannot panic.
    while !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{}", &prefix[..cut], random_suffix())
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

    /// Kubernetes limits a subdomain name to 253 characters in all, not each dot-separated
    /// part to 63 as DNS does.
    #[test]
    fn subdomain_parts_have_no_length_limit_of_their_own() {
        let long_part = "a".repeat(200);
        assert!(is_dns_subdomain(&long_part));
        assert!(is_dns_subdomain(&format!(
            "{long_part}.b.{}",
            "c".repeat(50)
        )));
        assert!(is_dns_subdomain(&"x".repeat(253)));
        assert_eq!(
            dns1123_subdomain_errors(&"x".repeat(254)),
            ["must be no more than 253 characters"]
        );
        // Too long and malformed: both messages, length first, as kube-apiserver lists them.
        assert_eq!(
            dns1123_subdomain_errors(&format!("{}_", "x".repeat(253))),
            ["must be no more than 253 characters", DNS_SUBDOMAIN_MSG]
        );
    }

    #[test]
    fn label_messages_match_kube_apiserver() {
        assert!(dns1123_label_errors(&"a".repeat(63)).is_empty());
        assert!(dns1123_label_errors("0abc").is_empty());
        assert_eq!(
            dns1123_label_errors(&"a".repeat(64)),
            ["must be no more than 63 characters"]
        );
        assert_eq!(dns1123_label_errors("a.b"), ["must not contain dots"]);
        assert_eq!(dns1123_label_errors("A"), [DNS_LABEL_MSG]);
        assert_eq!(dns1123_label_errors(""), [DNS_LABEL_MSG]);
        assert!(dns1035_label_errors("my-name").is_empty());
        assert_eq!(dns1035_label_errors("0abc"), [DNS1035_LABEL_MSG]);
        assert_eq!(dns1035_label_errors("a.b"), [DNS1035_LABEL_MSG]);
        assert_eq!(
            dns1035_label_errors(&"a".repeat(64)),
            ["must be no more than 63 characters"]
        );
    }

    #[test]
    fn path_segments() {
        assert!(path_segment_errors("system:auth-delegator", false).is_empty());
        assert!(path_segment_errors("Upper_Case", false).is_empty());
        assert_eq!(path_segment_errors(".", false), ["may not be '.'"]);
        assert_eq!(path_segment_errors("..", false), ["may not be '..'"]);
        assert!(path_segment_errors("..", true).is_empty());
        assert_eq!(
            path_segment_errors("a/b%c", false),
            ["may not contain '/'", "may not contain '%'"]
        );
    }

    #[test]
    fn rules_mask_a_trailing_dash_of_prefixes_only() {
        let sub = NameRule::Dns1123Subdomain;
        assert!(sub.errors("gen-", true).is_empty());
        assert_eq!(sub.errors("gen-", false), [DNS_SUBDOMAIN_MSG]);
        assert_eq!(sub.errors("-", true), [DNS_SUBDOMAIN_MSG]);
        // `name[:len-2] + "a"`: 254 characters with the dash are 253 once masked.
        assert!(
            sub.errors(&format!("{}-", "x".repeat(253)), true)
                .is_empty()
        );
        assert!(NameRule::Dns1123Label.errors("ns-", true).is_empty());
        assert_eq!(
            NameRule::Dns1035Label.errors("1a-", true),
            [DNS1035_LABEL_MSG]
        );
        assert_eq!(
            NameRule::PathSegment.errors("..", true),
            ["may not be '..'"]
        );
        assert!(NameRule::Unchecked.errors("Any_Thing", false).is_empty());
    }

    #[test]
    fn generated_names_cut_the_prefix_to_58_characters() {
        let n = generate_name("gen-");
        assert!(n.starts_with("gen-") && n.len() == 9, "{n}");
        let long = "p".repeat(100);
        let n = generate_name(&long);
        assert_eq!(n.len(), 63, "{n}");
        assert!(n.starts_with(&"p".repeat(58)));
        // A multi-byte character across the cut does not panic.
        let n = generate_name(&format!("{}é", "p".repeat(57)));
        assert!(n.starts_with(&"p".repeat(57)));
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
