//! What kube-apiserver's registry strategies do for particular built-in kinds on create and
//! update (the parts kubesim reproduces).

use crate::ApiError;
use crate::meta::{Cause, NameRule};
use crate::registry::ResourceInfo;
use base64::Engine;
use serde_json::{Value, json};

/// Type key of namespaces.
pub const NAMESPACES: &str = "namespaces";
/// Type key of CustomResourceDefinitions.
pub const CRDS: &str = "customresourcedefinitions.apiextensions.k8s.io";
/// Type key of ServiceAccounts.
pub const SERVICEACCOUNTS: &str = "serviceaccounts";
/// Label kube-apiserver keeps on every namespace.
pub const NS_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// `PrepareForCreate`: server-set fields of a new object.
pub fn prepare_create(key: &str, has_status: bool, custom: bool, obj: &mut Value, name: &str) {
    match key {
        NAMESPACES => {
            obj["metadata"]["labels"] = merged_label(obj, name);
            let finalizers = obj
                .get("spec")
                .and_then(|s| s.get("finalizers"))
                .cloned()
                .unwrap_or_else(|| json!(["kubernetes"]));
            obj["spec"] = json!({"finalizers": finalizers});
            obj["status"] = json!({"phase": "Active"});
        }
        "pods" => {
            obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
        }
        CRDS => {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        _ => {
            if custom
                && has_status
                && let Some(m) = obj.as_object_mut()
            {
                m.remove("status");
            }
        }
    }
}

/// `PrepareForUpdate` of the main resource: fields the server keeps from `old`.
pub fn prepare_update(key: &str, obj: &mut Value, old: &Value, name: &str) {
    if key == NAMESPACES {
        obj["metadata"]["labels"] = merged_label(obj, name);
        // spec.finalizers changes only through /finalize
        let fin = old
            .get("spec")
            .and_then(|s| s.get("finalizers"))
            .cloned()
            .unwrap_or_else(|| json!([]));
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        obj["spec"]["finalizers"] = fin;
    }
}

fn merged_label(obj: &Value, name: &str) -> Value {
    let mut labels = obj
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .filter(|l| l.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}));
    labels[NS_NAME_LABEL] = Value::from(name);
    labels
}

/// Decode-time normalisation of Secrets: `stringData` merged into `data` (base64), `type`
/// defaulted; invalid base64 in `data` is a 400 as kube-apiserver's decoder reports it.
pub fn normalize_secret(obj: &mut Value, creating: bool) -> Result<(), ApiError> {
    if let Some(Value::Object(data)) = obj.get("data") {
        for v in data.values() {
            let s = v.as_str().unwrap_or_default();
            if let Err(e) = base64::engine::general_purpose::STANDARD.decode(s) {
                return Err(ApiError::new(
                    400,
                    "BadRequest",
                    format!("Secret in version \"v1\" cannot be handled as a Secret: {e}"),
                ));
            }
        }
    }
    let string_data = obj.as_object_mut().and_then(|m| m.remove("stringData"));
    if let Some(Value::Object(sd)) = string_data {
        if !obj.get("data").is_some_and(Value::is_object) {
            obj["data"] = json!({});
        }
        for (k, v) in sd {
            let raw = v.as_str().unwrap_or_default();
            obj["data"][k] =
                Value::from(base64::engine::general_purpose::STANDARD.encode(raw.as_bytes()));
        }
    }
    if creating
        && obj
            .get("type")
            .is_none_or(|t| t.as_str().unwrap_or_default().is_empty())
    {
        obj["type"] = Value::from("Opaque");
    }
    Ok(())
}

/// How kube-apiserver validates `metadata.name` (and `generateName`) of `res`, per its
/// registry's validation:
///
/// | resource | rule |
/// |---|---|
/// | namespaces | DNS-1123 label (`ValidateNamespaceName`) |
/// | services | DNS-1035 label (`ValidateServiceName`) |
/// | roles, clusterroles, rolebindings, clusterrolebindings | path segment (`ValidateRBACName`) |
/// | core/v1 events | none (legacy event validation only) |
/// | pods, serviceaccounts, secrets, configmaps, `events.k8s.io` events, leases, CRDs, custom resources | DNS-1123 subdomain |
///
/// CRDs must also be named `<plural>.<group>` (checked with the CRD itself).
pub fn name_rule(res: &ResourceInfo) -> NameRule {
    if res.custom {
        return NameRule::Dns1123Subdomain;
    }
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "namespaces") => NameRule::Dns1123Label,
        ("", "services") => NameRule::Dns1035Label,
        ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
        ("", "events") => NameRule::Unchecked,
        _ => NameRule::Dns1123Subdomain,
    }
}

/// Kinds whose `metadata.generation` the server maintains (custom resources, CRDs and
/// admission policies and bindings; the other built-ins kubesim serves do not track
/// generation in Kubernetes 1.33 with default gates).
pub fn tracks_generation(key: &str, custom: bool) -> bool {
    // Admission policies and bindings count spec changes too (their strategies do);
    // the policy status controller compares it with `status.observedGeneration`.
    custom || key == CRDS || key == crate::admission::POLICIES || key == crate::admission::BINDINGS
}

/// ConfigMaps and Secrets with `immutable: true` keep their data and stay immutable.
pub fn immutable_causes(new: &Value, old: &Value) -> Vec<Cause> {
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return Vec::new();
    }
    let forbidden = |field: &str| Cause {
        reason: "FieldValueForbidden".into(),
        field: field.to_string(),
        detail: "Forbidden: field is immutable when `immutable` is set".into(),
    };
    let mut out = Vec::new();
    if new.get("immutable").and_then(Value::as_bool) != Some(true) {
        out.push(forbidden("immutable"));
    }
    for field in ["data", "binaryData"] {
        if new.get(field) != old.get(field) {
            out.push(forbidden(field));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::builtins;

    fn builtin(group: &str, plural: &str) -> ResourceInfo {
        builtins()
            .into_iter()
            .find(|r| r.group == group && r.plural == plural)
            .unwrap_or_else(|| panic!("{group}/{plural} is built in"))
    }

    /// The rule of every built-in kind kubesim serves, of services (not served; the rule
    /// is kept for when they are) and of custom resources.
    #[test]
    fn name_rules_per_resource() {
        for r in builtins().iter().filter(|r| !r.virtual_only) {
            let want = match (r.group.as_str(), r.plural.as_str()) {
                ("", "namespaces") => NameRule::Dns1123Label,
                ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
                ("", "events") => NameRule::Unchecked,
                _ => NameRule::Dns1123Subdomain,
            };
            assert_eq!(name_rule(r), want, "{}/{}", r.group, r.plural);
        }
        let mut services = builtin("", "configmaps");
        services.plural = "services".into();
        assert_eq!(name_rule(&services), NameRule::Dns1035Label);
        let mut custom = builtin("", "configmaps");
        (custom.group, custom.plural, custom.custom) =
            ("example.com".into(), "namespaces".into(), true);
        assert_eq!(name_rule(&custom), NameRule::Dns1123Subdomain);
        assert_eq!(
            name_rule(&builtin("events.k8s.io", "events")),
            NameRule::Dns1123Subdomain
        );
    }
}
