//! kube-apiserver's 403 wording (`endpoints/handlers/responsewriters/errors.go` and
//! `apimachinery/pkg/api/errors.NewForbidden`).

use serde_json::{Map, Value, json};

use super::RequestAttributes;

/// The authorization half of the message: `User "bob" cannot get resource "pods" in API
/// group "" in the namespace "default"` (or `... at the cluster scope`, or `User "x" cannot
/// get path "/apis"`).
fn denial(attrs: &RequestAttributes) -> String {
    let user = &attrs.user.username;
    if !attrs.resource_request {
        return format!("User {user:?} cannot {} path {:?}", attrs.verb, attrs.path);
    }
    let mut resource = attrs.resource.clone();
    if !attrs.subresource.is_empty() {
        resource = format!("{resource}/{}", attrs.subresource);
    }
    if attrs.namespace.is_empty() {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            attrs.verb, attrs.api_group
        )
    } else {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
            attrs.verb, attrs.api_group, attrs.namespace
        )
    }
}

/// `resource.group` (or `resource` for the core group); empty for non-resource requests.
fn qualified_resource(attrs: &RequestAttributes) -> String {
    match (attrs.resource.as_str(), attrs.api_group.as_str()) {
        ("", _) => String::new(),
        (r, "") => r.to_string(),
        (r, g) => format!("{r}.{g}"),
    }
}

/// The full 403 message kube-apiserver returns, e.g.
/// `pods "web" is forbidden: User "bob" cannot get resource "pods" in API group "" in the
/// namespace "default"`.
pub fn forbidden_message(attrs: &RequestAttributes) -> String {
    forbidden_message_with_reason(attrs, "")
}

/// [`forbidden_message`] with the authorizer's reason appended (`...: <reason>`) when not
/// empty.
pub fn forbidden_message_with_reason(attrs: &RequestAttributes, reason: &str) -> String {
    // Go's apiserver escapes HTML-looking characters in its part of the message.
    let mut err = denial(attrs)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    if !reason.is_empty() {
        err = format!("{err}: {reason}");
    }
    let qualified = qualified_resource(attrs);
    if qualified.is_empty() {
        format!("forbidden: {err}")
    } else if attrs.name.is_empty() {
        format!("{qualified} is forbidden: {err}")
    } else {
        format!("{qualified} {:?} is forbidden: {err}", attrs.name)
    }
}

/// The `Status` object (HTTP 403) kube-apiserver sends for a denied request.
pub fn forbidden_status(attrs: &RequestAttributes, reason: &str) -> Value {
    let mut details = Map::new();
    if !attrs.name.is_empty() {
        details.insert("name".into(), json!(attrs.name));
    }
    if !attrs.api_group.is_empty() {
        details.insert("group".into(), json!(attrs.api_group));
    }
    if !attrs.resource.is_empty() {
        details.insert("kind".into(), json!(attrs.resource));
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": forbidden_message_with_reason(attrs, reason),
        "reason": "Forbidden",
        "details": details,
        "code": 403,
    })
}
