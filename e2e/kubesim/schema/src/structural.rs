//! The checks kube-apiserver makes on a CRD version's schema before accepting it:
//! structural-schema invariants (`apiextensions-apiserver/pkg/apiserver/schema`
//! `ValidateStructural`, without the completeness check) and the CRD API rules on
//! schemas (`uniqueItems`, `additionalProperties: false`, `$ref`, …).
//! [`crate::CompiledSchema::new`] stays lenient; the store calls [`structural_errors`]
//! when a CRD is created or updated.

use serde_json::{Map, Value};

use crate::node::Node;
use crate::{FieldError, prune, validate};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Item,
    Field,
}

fn child(path: &str, name: &str) -> String {
    format!("{path}.{name}")
}

fn key(path: &str, name: &str, k: &str) -> String {
    format!("{path}.{name}[{k}]")
}

fn index(path: &str, name: &str, i: usize) -> String {
    format!("{path}.{name}[{i}]")
}

fn str_of<'a>(s: &'a Map<String, Value>, k: &str) -> &'a str {
    s.get(k).and_then(Value::as_str).unwrap_or("")
}

fn flag(s: &Map<String, Value>, k: &str) -> bool {
    matches!(s.get(k), Some(Value::Bool(true)))
}

fn subs<'a>(s: &'a Map<String, Value>, k: &str) -> Vec<&'a Map<String, Value>> {
    s.get(k)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_object).collect())
        .unwrap_or_default()
}

fn props(s: &Map<String, Value>) -> Vec<(&String, &Map<String, Value>)> {
    s.get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .filter_map(|(k, v)| v.as_object().map(|o| (k, o)))
                .collect()
        })
        .unwrap_or_default()
}

/// Why kube-apiserver would refuse this `openAPIV3Schema`, as field errors under
/// `base_path` (e.g. `spec.versions[0].schema.openAPIV3Schema`), sorted like
/// kube-apiserver sorts them. Empty for an acceptable schema.
pub fn structural_errors(schema: &Value, base_path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match schema.as_object() {
        Some(s) => {
            invariants(s, Level::Root, base_path, &mut errs);
            api_rules(s, base_path, &mut errs);
            match Node::compile(schema, "") {
                Ok(root) => defaults(&root, base_path, &mut errs),
                Err(e) => errs.push(FieldError::invalid(
                    base_path,
                    &Value::String(String::new()),
                    &e.to_string(),
                )),
            }
        }
        None => errs.push(FieldError::required(
            &child(base_path, "type"),
            "must not be empty at the root",
        )),
    }
    errs.sort_by_key(ToString::to_string);
    errs.dedup();
    errs
}

/// `ValidateDefaults`: every `default` must be valid against its own node's schema and
/// carry no field that pruning would drop.
fn defaults(node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    if !node.has_defaults {
        return;
    }
    if let Some(default) = &node.default {
        let at = child(path, "default");
        let mut found = Vec::new();
        validate::validate(node, default, None, "", &mut found);
        validate::list_types(node, default, None, "", &mut found);
        for mut e in found {
            e.path = if e.path.is_empty() {
                at.clone()
            } else if e.path.starts_with('[') {
                format!("{at}{}", e.path)
            } else {
                format!("{at}.{}", e.path)
            };
            errs.push(e);
        }
        let mut pruned = default.clone();
        prune::prune(Some(node), &mut pruned, false);
        if &pruned != default {
            errs.push(FieldError::invalid(
                &at,
                default,
                "must not have unknown fields",
            ));
        }
    }
    for (k, p) in &node.properties {
        defaults(p, &key(path, "properties", k), errs);
    }
    if let Some(items) = node.items.as_deref() {
        defaults(items, &child(path, "items"), errs);
    }
    if let Some(ap) = node.additional_schema() {
        defaults(ap, &child(path, "additionalProperties"), errs);
    }
}

/// `validateStructuralInvariants`.
fn invariants(s: &Map<String, Value>, lvl: Level, path: &str, errs: &mut Vec<FieldError>) {
    let ty = str_of(s, "type");
    if ty == "array" && !s.contains_key("items") {
        errs.push(FieldError::required(
            &child(path, "items"),
            "must be specified",
        ));
    }
    if let Some(items) = s.get("items").and_then(Value::as_object) {
        invariants(items, Level::Item, &child(path, "items"), errs);
    }
    for (k, p) in props(s) {
        invariants(p, Level::Field, &key(path, "properties", k), errs);
    }
    if let Some(ap) = s.get("additionalProperties") {
        if lvl == Level::Root {
            errs.push(FieldError::forbidden(
                &child(path, "additionalProperties"),
                "must not be used at the root",
            ));
        }
        if let Some(ap) = ap.as_object() {
            invariants(ap, Level::Field, &child(path, "additionalProperties"), errs);
        }
    }
    let int_or_string = flag(s, "x-kubernetes-int-or-string");
    let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
    let embedded = flag(s, "x-kubernetes-embedded-resource");
    if int_or_string && preserve {
        errs.push(FieldError::invalid(
            &child(path, "x-kubernetes-preserve-unknown-fields"),
            &Value::Bool(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if int_or_string && embedded {
        errs.push(FieldError::invalid(
            &child(path, "x-kubernetes-embedded-resource"),
            &Value::Bool(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    let skip_any_of = is_int_or_string_any_of(s);
    let skip_first_all_of_any_of = subs(s, "allOf")
        .first()
        .is_some_and(|first| is_int_or_string_any_of(first));
    value_validation(s, skip_any_of, skip_first_all_of_any_of, path, errs);

    if embedded && ty != "object" {
        let detail = "must be object if x-kubernetes-embedded-resource is true";
        if ty.is_empty() {
            errs.push(FieldError::required(&child(path, "type"), detail));
        } else {
            errs.push(FieldError::invalid(
                &child(path, "type"),
                &Value::from(ty),
                detail,
            ));
        }
    } else if ty.is_empty() && !int_or_string && !preserve {
        let detail = match lvl {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.push(FieldError::required(&child(path, "type"), detail));
    }
    if embedded && s.contains_key("additionalProperties") {
        errs.push(FieldError::forbidden(
            &child(path, "additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if lvl == Level::Root && !ty.is_empty() && ty != "object" {
        errs.push(FieldError::invalid(
            &child(path, "type"),
            &Value::from(ty),
            "must be object at the root",
        ));
    }
    let check_metadata = lvl == Level::Root || embedded;
    let properties = props(s);
    let find = |name: &str| {
        properties
            .iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, p)| *p)
    };
    if check_metadata {
        for (name, want) in [
            ("kind", "string"),
            ("apiVersion", "string"),
            ("metadata", "object"),
        ] {
            if let Some(p) = find(name) {
                let t = str_of(p, "type");
                if t != want {
                    errs.push(FieldError::invalid(
                        &format!("{path}.properties[{name}].type"),
                        &Value::from(t),
                        &format!("must be {want}"),
                    ));
                }
            }
        }
    }
    if lvl == Level::Root
        && let Some(meta) = find("metadata")
        && !metadata_only_names(meta)
    {
        errs.push(FieldError::forbidden(
                    &key(path, "properties", "metadata"),
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                ));
    }
    if embedded && !preserve && properties.is_empty() {
        errs.push(FieldError::required(
            &child(path, "properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
}

/// Root `metadata` may only say it is an object (with a default) and restrict `name` and
/// `generateName`.
fn metadata_only_names(meta: &Map<String, Value>) -> bool {
    meta.iter().all(|(k, v)| match k.as_str() {
        "type" | "default" => true,
        "properties" => v
            .as_object()
            .is_some_and(|p| !p.is_empty() && p.keys().all(|n| n == "name" || n == "generateName")),
        _ => false,
    })
}

fn is_int_or_string_any_of(s: &Map<String, Value>) -> bool {
    let any_of = subs(s, "anyOf");
    any_of.len() == 2
        && s.get("anyOf").and_then(Value::as_array).map(Vec::len) == Some(2)
        && any_of[0].len() == 1
        && str_of(any_of[0], "type") == "integer"
        && any_of[1].len() == 1
        && str_of(any_of[1], "type") == "string"
}

/// `validateValueValidation`.
fn value_validation(
    s: &Map<String, Value>,
    skip_any_of: bool,
    skip_first_all_of_any_of: bool,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    if !skip_any_of {
        for (i, sub) in subs(s, "anyOf").into_iter().enumerate() {
            nested(sub, false, &index(path, "anyOf", i), errs);
        }
    }
    for (i, sub) in subs(s, "allOf").into_iter().enumerate() {
        nested(
            sub,
            skip_first_all_of_any_of && i == 0,
            &index(path, "allOf", i),
            errs,
        );
    }
    for (i, sub) in subs(s, "oneOf").into_iter().enumerate() {
        nested(sub, false, &index(path, "oneOf", i), errs);
    }
    if let Some(not) = s.get("not").and_then(Value::as_object) {
        nested(not, false, &child(path, "not"), errs);
    }
    let pattern = str_of(s, "pattern");
    if !pattern.is_empty()
        && let Err(e) = regex::Regex::new(&crate::go_regex::translate(pattern))
    {
        errs.push(FieldError::invalid(
            &child(path, "pattern"),
            &Value::from(pattern),
            &format!("must be a valid regular expression, but isn't: {e}"),
        ));
    }
}

/// `validateNestedValueValidation`: inside `allOf`/`anyOf`/`oneOf`/`not` only value
/// validations are allowed.
fn nested(v: &Map<String, Value>, skip_any_of: bool, path: &str, errs: &mut Vec<FieldError>) {
    value_validation(v, skip_any_of, false, path, errs);
    if let Some(items) = v.get("items").and_then(Value::as_object) {
        nested(items, false, &child(path, "items"), errs);
    }
    for (k, p) in props(v) {
        nested(p, false, &key(path, "properties", k), errs);
    }
    let forbid = |errs: &mut Vec<FieldError>, name: &str, detail: &str| {
        errs.push(FieldError::forbidden(&child(path, name), detail));
    };
    if !str_of(v, "type").is_empty() {
        forbid(errs, "type", "must be empty to be structural");
    }
    if v.contains_key("additionalProperties") {
        forbid(
            errs,
            "additionalProperties",
            "must be undefined to be structural",
        );
    }
    if v.contains_key("default") {
        forbid(errs, "default", "must be undefined to be structural");
    }
    if !str_of(v, "title").is_empty() {
        forbid(errs, "title", "must be empty to be structural");
    }
    if !str_of(v, "description").is_empty() {
        forbid(errs, "description", "must be empty to be structural");
    }
    if flag(v, "nullable") {
        forbid(errs, "nullable", "must be false to be structural");
    }
    for ext in [
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string",
    ] {
        if flag(v, ext) {
            forbid(errs, ext, "must be false to be structural");
        }
    }
    if v.get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .is_some_and(|k| !k.is_empty())
    {
        forbid(
            errs,
            "x-kubernetes-list-map-keys",
            "must be empty to be structural",
        );
    }
    if v.contains_key("x-kubernetes-list-type") {
        forbid(
            errs,
            "x-kubernetes-list-type",
            "must be undefined to be structural",
        );
    }
    if props(v).iter().any(|(k, _)| k.as_str() == "metadata") {
        errs.push(FieldError::forbidden(
            &key(path, "properties", "metadata"),
            "must not be specified in a nested context",
        ));
    }
}

/// The CRD API's own rules on every schema node (`ValidateCustomResourceDefinitionOpenAPISchema`).
fn api_rules(s: &Map<String, Value>, path: &str, errs: &mut Vec<FieldError>) {
    if flag(s, "uniqueItems") {
        errs.push(FieldError::forbidden(
            &child(path, "uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    match s.get("additionalProperties") {
        Some(Value::Bool(false)) => errs.push(FieldError::forbidden(
            &child(path, "additionalProperties"),
            "additionalProperties cannot be set to false",
        )),
        Some(_) if s.contains_key("properties") => errs.push(FieldError::forbidden(
            &child(path, "additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        )),
        _ => {}
    }
    if s.contains_key("$ref") {
        errs.push(FieldError::forbidden(
            &child(path, "$ref"),
            "$ref is not supported",
        ));
    }
    if matches!(
        s.get("x-kubernetes-preserve-unknown-fields"),
        Some(Value::Bool(false))
    ) {
        errs.push(FieldError::invalid(
            &child(path, "x-kubernetes-preserve-unknown-fields"),
            &Value::Bool(false),
            "must be true or undefined",
        ));
    }
    if let Some(items) = s.get("items").and_then(Value::as_object) {
        api_rules(items, &child(path, "items"), errs);
    }
    for (k, p) in props(s) {
        api_rules(p, &key(path, "properties", k), errs);
    }
    if let Some(ap) = s.get("additionalProperties").and_then(Value::as_object) {
        api_rules(ap, &child(path, "additionalProperties"), errs);
    }
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for (i, sub) in subs(s, junctor).into_iter().enumerate() {
            api_rules(sub, &index(path, junctor, i), errs);
        }
    }
    if let Some(not) = s.get("not").and_then(Value::as_object) {
        api_rules(not, &child(path, "not"), errs);
    }
}
