//! OpenAPI v3 value validation as kube-apiserver runs it for custom resources
//! (`kube-openapi/pkg/validation/validate` errors converted by apiextensions'
//! `kubeOpenAPIErrorToFieldError`), plus `x-kubernetes-list-type` set/map uniqueness
//! (`schema/listtype`). On update, an unchanged value is not re-validated
//! (CRD validation ratcheting, on by default since Kubernetes 1.30).

use serde_json::{Map, Value};

use crate::FieldError;
use crate::errors::{go_float, go_quote};
use crate::formats;
use crate::node::{Additional, ListType, Node};

/// Where an anyOf/oneOf/not failure is reported: kube-apiserver passes a nil root path
/// to these non-field errors.
const NIL_PATH: &str = "<nil>";

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The JSON type name kube-openapi reports for a value.
fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integral(v: &Value) -> bool {
    match v {
        Value::Number(n) => !n.is_f64() || n.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(i), Some(j)) = (x.as_i64(), y.as_i64()) {
                i == j
            } else {
                x.as_f64() == y.as_f64()
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_eq(p, q)))
        }
        _ => a == b,
    }
}

/// Runs the OpenAPI checks of one node on one value.
pub(crate) fn validate(
    node: &Node,
    v: &Value,
    old: Option<&Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    if old.is_some_and(|o| json_eq(o, v)) {
        return; // ratcheting: unchanged values keep whatever they had
    }
    if v.is_null() {
        if !node.nullable
            && let Some(expected) = expected_type(node)
        {
            errs.push(type_error(path, &expected, v));
        }
        check_enum(node, v, path, errs);
        return;
    }
    // kube-openapi runs every applicable validator, whatever the type check found.
    errs.extend(check_type(node, v, path));
    check_combinators(node, v, old, path, errs);
    match v {
        Value::String(s) => check_string(node, s, v, path, errs),
        Value::Number(_) => check_number(node, v, path, errs),
        Value::Array(items) => check_array(node, items, old, path, errs),
        _ => {}
    }
    check_enum(node, v, path, errs);
    if let Value::Object(map) = v {
        check_object(node, map, old, path, errs);
    }
}

/// kube-openapi's `typeValidator`, including its handling of `format`: a non-string value
/// of the wrong type in a field with a format is reported against the format
/// (`must be of type int32: "float64"`), and a string-typed field with a format skips the
/// type check for strings and arrays.
fn check_type(node: &Node, v: &Value, path: &str) -> Option<FieldError> {
    let expected = expected_type(node)?;
    let types: Vec<&str> = expected.split(',').collect();
    let kind = kind_name(v);
    let contains = |t: &str| types.contains(&t);
    let is_float_int = kind == "number" && is_integral(v) && contains("integer");
    let is_int_float = kind == "integer" && contains("number");
    let str_or_slice = v.is_string() || v.is_array();
    if let Some(format) = node.format.as_deref().filter(|f| !f.is_empty()) {
        // The Go type kube decodes JSON numbers into gives the data's own "format".
        let data_format = match kind {
            "integer" => "int64",
            "number" => "float64",
            _ => "",
        };
        let lower_int = format == "int64" && data_format == "int32";
        let type_ok =
            contains(kind) || data_format == format || is_float_int || is_int_float || lower_int;
        if !str_or_slice && !type_ok {
            return Some(FieldError::type_invalid(
                path,
                &Value::String(data_format.to_string()),
                &format!(
                    "{path} in body must be of type {format}: {}",
                    go_quote(data_format)
                ),
            ));
        }
        if !(contains("number") || contains("integer")) && str_or_slice {
            return None;
        }
    }
    if contains(kind) || is_float_int || is_int_float {
        None
    } else {
        Some(type_error(path, &expected, v))
    }
}

fn expected_type(node: &Node) -> Option<String> {
    if node.int_or_string {
        Some("integer,string".to_string())
    } else {
        node.ty.clone()
    }
}

fn type_error(path: &str, expected: &str, v: &Value) -> FieldError {
    let actual = kind_name(v);
    FieldError::type_invalid(
        path,
        &Value::String(actual.to_string()),
        &format!(
            "{path} in body must be of type {expected}: {}",
            go_quote(actual)
        ),
    )
}

fn check_enum(node: &Node, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(values) = &node.enum_values else {
        return;
    };
    if values.iter().any(|e| json_eq(e, v)) {
        return;
    }
    let allowed: Vec<String> = values
        .iter()
        .map(|e| match e {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    errs.push(FieldError::not_supported(path, v, &allowed));
}

fn passes(node: &Node, v: &Value) -> bool {
    let mut errs = Vec::new();
    validate(node, v, None, "", &mut errs);
    errs.is_empty()
}

fn check_combinators(
    node: &Node,
    v: &Value,
    old: Option<&Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    for sub in &node.all_of {
        validate(sub, v, old, path, errs);
    }
    if !node.any_of.is_empty() && !node.any_of.iter().any(|s| passes(s, v)) {
        errs.push(FieldError::invalid(
            NIL_PATH,
            &Value::String(String::new()),
            &format!(
                "{} must validate at least one schema (anyOf)",
                go_quote(path)
            ),
        ));
        if let Some(first) = node.any_of.first() {
            validate(first, v, None, path, errs);
        }
    }
    if !node.one_of.is_empty() {
        let valid = node.one_of.iter().filter(|s| passes(s, v)).count();
        if valid != 1 {
            let mut msg = format!(
                "{} must validate one and only one schema (oneOf)",
                go_quote(path)
            );
            if valid > 1 {
                msg.push_str(&format!(". Found {valid} valid alternatives"));
            }
            errs.push(FieldError::invalid(
                NIL_PATH,
                &Value::String(String::new()),
                &msg,
            ));
        }
    }
    if let Some(not) = &node.not
        && passes(not, v)
    {
        errs.push(FieldError::invalid(
            NIL_PATH,
            &Value::String(String::new()),
            &format!("{} must not validate the schema (not)", go_quote(path)),
        ));
    }
}

fn check_string(node: &Node, s: &str, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let len = s.chars().count() as u64;
    if let Some(max) = node.max_length
        && len > max
    {
        errs.push(FieldError::too_long(path, Some(max)));
    }
    if let Some(min) = node.min_length
        && len < min
    {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body should be at least {min} chars long"),
        ));
    }
    if let Some((src, re)) = &node.pattern
        && !re.is_match(s)
    {
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body should match '{src}'"),
        ));
    }
    if let Some(format) = &node.format
        && formats::check(format, s) == Some(false)
    {
        errs.push(FieldError::type_invalid(
            path,
            v,
            &format!("{path} in body must be of type {format}: {}", go_quote(s)),
        ));
    }
}

fn check_number(node: &Node, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(x) = v.as_f64() else {
        return;
    };
    if let Some(m) = node.multiple_of {
        let q = x / m;
        if (q - q.round()).abs() > 1e-9 {
            errs.push(FieldError::invalid(
                path,
                v,
                &format!("{path} in body should be a multiple of {}", go_float(m)),
            ));
        }
    }
    if let Some(b) = &node.maximum
        && (x > b.value || (b.exclusive && x >= b.value))
    {
        let rel = if b.exclusive {
            "less than"
        } else {
            "less than or equal to"
        };
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body should be {rel} {}", go_float(b.value)),
        ));
    }
    if let Some(b) = &node.minimum
        && (x < b.value || (b.exclusive && x <= b.value))
    {
        let rel = if b.exclusive {
            "greater than"
        } else {
            "greater than or equal to"
        };
        errs.push(FieldError::invalid(
            path,
            v,
            &format!("{path} in body should be {rel} {}", go_float(b.value)),
        ));
    }
}

fn check_array(
    node: &Node,
    items: &[Value],
    old: Option<&Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    if let Some(item) = node.items.as_deref() {
        let old_items = correlate_items(node, items, old);
        for (i, x) in items.iter().enumerate() {
            let o = old_items.as_ref().and_then(|m| m.get(i).copied().flatten());
            validate(item, x, o, &format!("{path}[{i}]"), errs);
        }
    }
    let n = items.len() as u64;
    if let Some(min) = node.min_items
        && n < min
    {
        errs.push(FieldError::invalid(
            path,
            &Value::from(n),
            &format!("{path} in body should have at least {min} items"),
        ));
    }
    if let Some(max) = node.max_items
        && n > max
    {
        errs.push(FieldError::too_many(path, n, max));
    }
    if node.unique_items {
        let dup = items
            .iter()
            .enumerate()
            .any(|(i, a)| items[..i].iter().any(|b| json_eq(a, b)));
        if dup {
            errs.push(FieldError::invalid(
                path,
                &Value::String(String::new()),
                &format!("{path} in body shouldn't contain duplicates"),
            ));
        }
    }
}

/// For each new item, the old item it corresponds to: list-type map items by their keys,
/// set items by value; atomic lists do not correlate.
pub(crate) fn correlate_items<'a>(
    node: &Node,
    items: &[Value],
    old: Option<&'a Value>,
) -> Option<Vec<Option<&'a Value>>> {
    let old_items = old?.as_array()?;
    match node.list_type {
        Some(ListType::Map) => Some(
            items
                .iter()
                .map(|x| {
                    let key = map_key(node, x)?;
                    old_items
                        .iter()
                        .find(|o| map_key(node, o).is_some_and(|k| k == key))
                })
                .collect(),
        ),
        Some(ListType::Set) => Some(
            items
                .iter()
                .map(|x| old_items.iter().find(|o| json_eq(o, x)))
                .collect(),
        ),
        _ => None,
    }
}

/// The key of a list-type map item: the values of its `x-kubernetes-list-map-keys`
/// (absent keys take the key field's default).
pub(crate) fn map_key(node: &Node, item: &Value) -> Option<Vec<Value>> {
    let obj = item.as_object()?;
    Some(
        node.list_map_keys
            .iter()
            .map(|k| {
                obj.get(k)
                    .cloned()
                    .or_else(|| {
                        node.items
                            .as_deref()
                            .and_then(|i| i.properties.get(k))
                            .and_then(|p| p.default.clone())
                    })
                    .unwrap_or(Value::Null)
            })
            .collect(),
    )
}

fn check_object(
    node: &Node,
    map: &Map<String, Value>,
    old: Option<&Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    let n = map.len() as u64;
    if let Some(min) = node.min_properties
        && n < min
    {
        errs.push(FieldError::invalid(
            path,
            &Value::from(n),
            &format!("{path} in body should have at least {min} properties"),
        ));
        return;
    }
    if let Some(max) = node.max_properties
        && n > max
    {
        errs.push(FieldError::too_many(path, n, max));
        return;
    }
    let old_map = old.and_then(Value::as_object);
    match &node.additional {
        Some(Additional::Bool(false)) => {
            for k in map.keys() {
                if !node.properties.contains_key(k) {
                    errs.push(FieldError::invalid(
                        path,
                        &Value::String(k.clone()),
                        &format!("{} in body is a forbidden property", child(path, k)),
                    ));
                }
            }
        }
        Some(Additional::Schema(ap)) => {
            for (k, v) in map {
                if !node.properties.contains_key(k) {
                    let o = old_map.and_then(|m| m.get(k));
                    validate(ap, v, o, &child(path, k), errs);
                }
            }
        }
        _ => {}
    }
    for (name, prop) in &node.properties {
        if let Some(v) = map.get(name) {
            let o = old_map.and_then(|m| m.get(name));
            validate(prop, v, o, &child(path, name), errs);
        }
    }
    for r in &node.required {
        if !map.contains_key(r) {
            errs.push(FieldError::required(&child(path, r), ""));
        }
    }
    if node.embedded {
        for k in ["apiVersion", "kind"] {
            if map.get(k).and_then(Value::as_str).unwrap_or("").is_empty() {
                errs.push(FieldError::required(&child(path, k), "must not be empty"));
            }
        }
    }
}

/// `x-kubernetes-list-type: set|map` uniqueness, with kube-apiserver's `field.Path`
/// notation (map keys as `[key]`).
pub(crate) fn list_types(
    node: &Node,
    v: &Value,
    old: Option<&Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    if !node.has_list_types || old.is_some_and(|o| json_eq(o, v)) {
        return;
    }
    match v {
        Value::Array(items) => {
            match node.list_type {
                Some(ListType::Set) => {
                    for (i, x) in items.iter().enumerate() {
                        if items[..i].iter().any(|y| json_eq(x, y)) {
                            errs.push(FieldError::duplicate(&format!("{path}[{i}]"), x));
                        }
                    }
                }
                Some(ListType::Map) => list_map(node, items, path, errs),
                _ => {}
            }
            if let Some(item) = node.items.as_deref() {
                let old_items = correlate_items(node, items, old);
                for (i, x) in items.iter().enumerate() {
                    let o = old_items.as_ref().and_then(|m| m.get(i).copied().flatten());
                    list_types(item, x, o, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Value::Object(map) => {
            let old_map = old.and_then(Value::as_object);
            for (k, x) in map {
                let o = old_map.and_then(|m| m.get(k));
                if let Some(prop) = node.properties.get(k) {
                    list_types(prop, x, o, &child(path, k), errs);
                } else if let Some(ap) = node.additional_schema() {
                    list_types(ap, x, o, &format!("{path}[{k}]"), errs);
                }
            }
        }
        _ => {}
    }
}

fn list_map(node: &Node, items: &[Value], path: &str, errs: &mut Vec<FieldError>) {
    let before = errs.len();
    for (i, x) in items.iter().enumerate() {
        match x {
            Value::Object(_) => {}
            Value::Null => errs.push(FieldError::required(
                &format!("{path}[{i}]"),
                "must not be null",
            )),
            other => errs.push(FieldError::invalid(
                &format!("{path}[{i}]"),
                other,
                "must be an object for an array of list-type map",
            )),
        }
    }
    if errs.len() > before {
        return;
    }
    let keys: Vec<Vec<Value>> = items
        .iter()
        .map(|x| map_key(node, x).unwrap_or_default())
        .collect();
    for (i, k) in keys.iter().enumerate() {
        if keys[..i]
            .iter()
            .any(|prev| prev.len() == k.len() && prev.iter().zip(k).all(|(a, b)| json_eq(a, b)))
        {
            let mut shown = Map::new();
            if let Some(obj) = items[i].as_object() {
                for key in &node.list_map_keys {
                    if let Some(val) = obj.get(key) {
                        shown.insert(key.clone(), val.clone());
                    }
                }
            }
            errs.push(FieldError::duplicate(
                &format!("{path}[{i}]"),
                &Value::Object(shown),
            ));
        }
    }
}
