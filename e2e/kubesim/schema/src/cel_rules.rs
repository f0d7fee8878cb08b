//! `x-kubernetes-validations`: rules compiled once with cel-rust, evaluated per schema node
//! with `self` (and `oldSelf` for transition rules), reported like apiextensions' CEL
//! validator (`<path>: Invalid value: "object": <message>`).

use std::collections::HashMap;
use std::sync::Arc;

use std::borrow::Cow;

use cel::common::types::{
    CelBool, CelDouble, CelDuration, CelInt, CelList, CelMap, CelMapKey, CelNull, CelOptional,
    CelString, CelTimestamp, CelUInt,
};
use cel::common::value::Val;
use cel::{Context, ExecutionError, Program, Value as CelValue};
use serde_json::Value;

use crate::cel_lib::{ENV, unsupported_functions};
use crate::node::{ListType, Node};
use crate::validate::{correlate_items, json_eq};
use crate::{FieldError, SchemaError, formats};

/// One compiled `x-kubernetes-validations` entry.
#[derive(Debug, Clone)]
pub(crate) struct CelRule {
    pub rule: String,
    message: Option<String>,
    message_expression: Option<Arc<Program>>,
    /// `fieldPath` split into field names (`.a['b.c']` → `a`, `b.c`).
    pub field_segments: Vec<String>,
    /// `fieldPath` in `field.Path` notation (`.a.b`, `[key]`), resolved against the schema
    /// by [`CelRule::resolve_field_path`].
    pub field_path: String,
    reason: Option<String>,
    optional_old_self: bool,
    pub uses_old_self: bool,
    program: Option<Arc<Program>>,
    /// The rule is exactly `self == oldSelf` (the immutability idiom), evaluated natively
    /// with Kubernetes' equality (unordered for `set` and `map` lists).
    immutable: bool,
    /// Why this rule cannot be evaluated here (parse error, unknown function).
    pub unsupported: Option<String>,
}

fn invalid(path: &str, message: String) -> SchemaError {
    SchemaError::Invalid {
        path: format!("openAPIV3Schema{path}"),
        message,
    }
}

impl CelRule {
    pub(crate) fn compile(raw: &Value, path: &str) -> Result<CelRule, SchemaError> {
        let obj = raw
            .as_object()
            .ok_or_else(|| invalid(path, "a validation rule must be an object".into()))?;
        let text = |k: &str| -> Result<Option<String>, SchemaError> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(invalid(path, format!("{k} must be a string"))),
            }
        };
        let rule = text("rule")?
            .filter(|r| !r.trim().is_empty())
            .ok_or_else(|| invalid(path, "rule: Required value".into()))?;
        let message = text("message")?;
        if message.as_deref().is_some_and(|m| m.contains('\n')) {
            return Err(invalid(
                path,
                "message: Invalid value: message must not contain line breaks".into(),
            ));
        }
        let reason = text("reason")?;
        if let Some(r) = &reason {
            let ok = [
                "FieldValueInvalid",
                "FieldValueForbidden",
                "FieldValueRequired",
                "FieldValueDuplicate",
            ];
            if !ok.contains(&r.as_str()) {
                return Err(invalid(
                    path,
                    format!(
                        "reason: Unsupported value: {r:?}: supported values: \"FieldValueDuplicate\", \"FieldValueForbidden\", \"FieldValueInvalid\", \"FieldValueRequired\""
                    ),
                ));
            }
        }
        let field_segments = match text("fieldPath")? {
            None => Vec::new(),
            Some(fp) => parse_field_path(&fp).ok_or_else(|| {
                invalid(
                    path,
                    format!("fieldPath: Invalid value: {fp:?}: fieldPath must be a valid path"),
                )
            })?,
        };
        let optional_old_self = matches!(obj.get("optionalOldSelf"), Some(Value::Bool(true)));

        let mut unsupported = None;
        let mut uses_old_self = false;
        let program = match ENV.compile(&rule) {
            Ok(p) => {
                let refs = p.references();
                uses_old_self = refs.has_variable("oldSelf");
                let missing = unsupported_functions(p.expression());
                if !missing.is_empty() {
                    unsupported = Some(format!(
                        "kubesim cannot evaluate this rule: unsupported function(s): {}",
                        missing.join(", ")
                    ));
                }
                Some(Arc::new(p))
            }
            Err(e) => {
                unsupported = Some(format!("kubesim cannot compile this rule: {e}"));
                None
            }
        };
        let message_expression = match text("messageExpression")? {
            None => None,
            // A messageExpression we cannot compile falls back to the message, as a failing
            // one does in kube-apiserver.
            Some(src) => ENV.compile(&src).ok().map(Arc::new),
        };
        let immutable = matches!(rule.trim(), "self == oldSelf" | "oldSelf == self");
        Ok(CelRule {
            immutable,
            rule,
            message,
            message_expression,
            field_segments,
            field_path: String::new(),
            reason,
            optional_old_self,
            uses_old_self,
            program,
            unsupported,
        })
    }

    /// `ruleMessageOrDefault`.
    fn default_message(&self) -> String {
        match &self.message {
            Some(m) if !m.is_empty() => m.trim().to_string(),
            _ => format!("failed rule: {}", self.rule.trim()),
        }
    }
}

/// `.a.b['c.d']` → `a`, `b`, `c.d`.
fn parse_field_path(fp: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = fp;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return None;
            }
            out.push(r[..end].to_string());
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']")?;
            out.push(r[..end].replace("\\'", "'").replace("\\\\", "\\"));
            rest = &r[end + 2..];
        } else {
            return None;
        }
    }
    Some(out)
}

impl CelRule {
    /// Resolve `fieldPath` against the node the rule sits on, as kube-apiserver's
    /// `ValidFieldPath`: a declared property is a child (`.name`), a map entry a key
    /// (`[name]`); anything else makes the CRD invalid.
    pub(crate) fn resolve_field_path(
        &mut self,
        node: &Node,
        path: &str,
    ) -> Result<(), SchemaError> {
        let mut out = String::new();
        let mut at = node;
        for seg in &self.field_segments {
            if !at.properties.is_empty() {
                let Some(next) = at.properties.get(seg) else {
                    return Err(invalid(
                        path,
                        format!(
                            "fieldPath: Invalid value: {seg:?}: fieldPath must be a valid path: does not refer to a valid field"
                        ),
                    ));
                };
                out.push('.');
                out.push_str(seg);
                at = next;
            } else if let Some(next) = at.additional_schema() {
                out.push('[');
                out.push_str(seg);
                out.push(']');
                at = next;
            } else {
                return Err(invalid(
                    path,
                    format!(
                        "fieldPath: Invalid value: {seg:?}: fieldPath must be a valid path: does not refer to a valid field"
                    ),
                ));
            }
        }
        self.field_path = out;
        Ok(())
    }
}

/// CEL keywords that kube-apiserver escapes as `__{kw}__` when used as property names.
const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// Property name as CEL sees it (`x-y` → `x__dash__y`, `if` → `__if__`, ...).
fn escape(name: &str) -> Cow<'_, str> {
    if RESERVED.contains(&name) {
        return Cow::Owned(format!("__{name}__"));
    }
    if !name.contains("__") && !name.contains(['.', '-', '/']) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(
        name.replace("__", "__underscores__")
            .replace('.', "__dot__")
            .replace('-', "__dash__")
            .replace('/', "__slash__"),
    )
}

/// A JSON value as CEL sees it under the schema node (`number` is double, `integer` int,
/// `date-time` a timestamp, `duration` a duration, properties escaped, root and embedded
/// `metadata` reduced to `name` and `generateName`). Strings and keys borrow from `v`.
pub(crate) fn to_cel<'a>(node: Option<&Node>, v: &'a Value, is_root: bool) -> Box<dyn Val + 'a> {
    match v {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => {
            let is_number = node.is_some_and(|n| n.ty.as_deref() == Some("number"));
            if is_number {
                Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)))
            } else if let Some(i) = n.as_i64() {
                Box::new(CelInt::from(i))
            } else if let Some(u) = n.as_u64() {
                Box::new(CelUInt::from(u))
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                let is_int = node.is_some_and(|n| n.ty.as_deref() == Some("integer"));
                if is_int && f.fract() == 0.0 && f.abs() < 9.2e18 {
                    Box::new(CelInt::from(f as i64))
                } else {
                    Box::new(CelDouble::from(f))
                }
            }
        }
        Value::String(s) => string_to_cel(node, s),
        Value::Array(items) => {
            let item = node.and_then(|n| n.items.as_deref());
            let list: Vec<Box<dyn Val + 'a>> =
                items.iter().map(|x| to_cel(item, x, false)).collect();
            Box::new(CelList::from(list))
        }
        Value::Object(map) => {
            let mut out: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> =
                HashMap::with_capacity(map.len());
            let embedded = node.is_some_and(|n| n.embedded);
            for (k, x) in map {
                if (is_root || embedded) && k == "metadata" {
                    out.insert(CelMapKey::from(k.as_str()), reduced_metadata(x));
                    continue;
                }
                let (cel_key, sub) = match node {
                    Some(n) => match n.properties.get(k) {
                        Some(p) => (escape(k), Some(p)),
                        None => (Cow::Borrowed(k.as_str()), n.additional_schema()),
                    },
                    None => (Cow::Borrowed(k.as_str()), None),
                };
                let key = match cel_key {
                    Cow::Borrowed(b) => CelMapKey::from(b),
                    Cow::Owned(o) => CelMapKey::from(o),
                };
                out.insert(key, to_cel(sub, x, false));
            }
            Box::new(CelMap::from(out))
        }
    }
}

fn string_to_cel<'a>(node: Option<&Node>, s: &'a str) -> Box<dyn Val + 'a> {
    let format = node.and_then(|n| n.format.as_deref());
    match format {
        Some("date-time") | Some("datetime") => {
            if let Some(t) = formats::parse_date_time(s) {
                return Box::new(CelTimestamp::from(t));
            }
        }
        Some("date") => {
            if let Some(t) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
            {
                return Box::new(CelTimestamp::from(t.and_utc().fixed_offset()));
            }
        }
        Some("duration") => {
            if let Some(ns) = formats::parse_duration(s).and_then(|ns| i64::try_from(ns).ok()) {
                return Box::new(CelDuration::from(chrono::Duration::nanoseconds(ns)));
            }
        }
        _ => {}
    }
    Box::new(CelString::from(s))
}

fn reduced_metadata<'a>(v: &'a Value) -> Box<dyn Val + 'a> {
    let mut out: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = HashMap::new();
    if let Some(m) = v.as_object() {
        for k in ["name", "generateName"] {
            if let Some(Value::String(s)) = m.get(k) {
                out.insert(CelMapKey::from(k), Box::new(CelString::from(s.as_str())));
            }
        }
    }
    Box::new(CelMap::from(out))
}

/// Evaluates every rule in the tree; `path` uses kube-apiserver's `field.Path` notation.
/// `parent_unchanged` is set when the nearest correlatable ancestor equals its old value:
/// errors of non-transition rules are then ratcheted away, as kube-apiserver does.
pub(crate) fn validate(
    node: &Node,
    v: &Value,
    old: Option<&Value>,
    path: &str,
    is_root: bool,
    parent_unchanged: bool,
    errs: &mut Vec<FieldError>,
) {
    if !node.has_rules || v.is_null() {
        return;
    }
    let unchanged = old.map_or(parent_unchanged, |o| json_eq(o, v));
    if unchanged && !node.has_transition_rules {
        return;
    }
    if !node.rules.is_empty() {
        eval_rules(node, v, old, path, is_root, unchanged, errs);
    }
    match v {
        Value::Object(map) => {
            let old_map = old.and_then(Value::as_object);
            for (k, x) in map {
                let o = old_map.and_then(|m| m.get(k));
                if let Some(prop) = node.properties.get(k) {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    validate(prop, x, o, &p, false, unchanged, errs);
                } else if let Some(ap) = node.additional_schema() {
                    validate(ap, x, o, &format!("{path}[{k}]"), false, unchanged, errs);
                }
            }
        }
        Value::Array(items) => {
            let Some(item) = node.items.as_deref() else {
                return;
            };
            // Only list-type map items have an `oldSelf`; other items are not correlated.
            let old_items = match node.list_type {
                Some(ListType::Map) => correlate_items(node, items, old),
                _ => None,
            };
            for (i, x) in items.iter().enumerate() {
                let o = old_items.as_ref().and_then(|m| m.get(i).copied().flatten());
                validate(item, x, o, &format!("{path}[{i}]"), false, unchanged, errs);
            }
        }
        _ => {}
    }
}

fn eval_rules(
    node: &Node,
    v: &Value,
    old: Option<&Value>,
    path: &str,
    is_root: bool,
    unchanged: bool,
    errs: &mut Vec<FieldError>,
) {
    let type_name = node.ty.clone().unwrap_or_default();
    // Contexts are built lazily, once per node: `self` (and `oldSelf`) are converted once
    // for all its rules; `optionalOldSelf` rules bind `oldSelf` as an optional.
    let mut plain_ctx: Option<Context> = None;
    let mut optional_ctx: Option<Context> = None;
    for rule in &node.rules {
        if rule.uses_old_self && old.is_none() && !rule.optional_old_self {
            continue; // transition rule without an old value
        }
        if unchanged && !rule.uses_old_self {
            continue; // ratcheted: the value did not change
        }
        let at = error_path(path, &rule.field_path);
        if let Some(why) = &rule.unsupported {
            errs.push(FieldError::internal(
                &at,
                &format!("{why}: {}", rule.rule.trim()),
            ));
            continue;
        }
        let Some(program) = &rule.program else {
            continue; // unreachable: a rule without a program is `unsupported`
        };
        let slot = if rule.optional_old_self {
            &mut optional_ctx
        } else {
            &mut plain_ctx
        };
        let outcome = match (rule.immutable && !rule.optional_old_self, old) {
            (true, Some(o)) => Ok(CelValue::Bool(kube_equal(Some(node), v, o))),
            _ => program.execute(context(slot, node, v, old, is_root, rule.optional_old_self)),
        };
        match outcome {
            Ok(CelValue::Bool(true)) => {}
            Ok(CelValue::Bool(false)) => {
                let detail = rule
                    .message_expression
                    .as_ref()
                    .and_then(|m| {
                        let ctx = context(slot, node, v, old, is_root, rule.optional_old_self);
                        match m.execute(ctx) {
                            Ok(CelValue::String(s))
                                if !s.trim().is_empty() && !s.contains('\n') =>
                            {
                                Some(s.trim().to_string())
                            }
                            _ => None,
                        }
                    })
                    .unwrap_or_else(|| rule.default_message());
                errs.push(failure(&at, &type_name, &detail, rule.reason.as_deref()));
            }
            Ok(other) => errs.push(FieldError::internal(
                &at,
                &format!(
                    "rule did not evaluate to a bool ({}): {}",
                    other.type_of(),
                    rule.rule.trim()
                ),
            )),
            Err(e) => errs.push(eval_error(&at, &type_name, &e, rule)),
        }
    }
}

/// The evaluation context in `slot`, built on first use.
fn context<'s, 'p, 'a>(
    slot: &'s mut Option<Context<'p, 'a>>,
    node: &Node,
    v: &'a Value,
    old: Option<&'a Value>,
    is_root: bool,
    optional_old_self: bool,
) -> &'s Context<'p, 'a> {
    slot.get_or_insert_with(|| {
        let mut c = Context::with_env(ENV.clone());
        c.add_variable_as_val("self", to_cel(Some(node), v, is_root));
        if optional_old_self {
            let opt = match old {
                Some(o) => CelOptional::of(to_cel(Some(node), o, is_root)),
                None => CelOptional::none(),
            };
            c.add_variable_as_val("oldSelf", Box::new(opt));
        } else if let Some(o) = old {
            c.add_variable_as_val("oldSelf", to_cel(Some(node), o, is_root));
        }
        c
    })
}

/// CEL equality of two values under a schema node, as Kubernetes defines it: numbers by
/// value, `date-time` strings as instants, `set` lists as sets and `map` lists by their
/// entries, whatever their order.
pub(crate) fn kube_equal(node: Option<&Node>, a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, p)| {
                    let sub = node.and_then(|n| n.properties.get(k).or(n.additional_schema()));
                    y.get(k).is_some_and(|q| kube_equal(sub, p, q))
                })
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return false;
            }
            let item = node.and_then(|n| n.items.as_deref());
            match node.and_then(|n| n.list_type) {
                Some(ListType::Set | ListType::Map) => {
                    // Each element matched to a distinct equal element on the other side.
                    let mut used = vec![false; y.len()];
                    x.iter().all(|p| {
                        let found = y
                            .iter()
                            .enumerate()
                            .find(|(j, q)| !used[*j] && kube_equal(item, p, q))
                            .map(|(j, _)| j);
                        if let Some(j) = found {
                            used[j] = true;
                        }
                        found.is_some()
                    })
                }
                _ => x.iter().zip(y).all(|(p, q)| kube_equal(item, p, q)),
            }
        }
        (Value::String(x), Value::String(y)) => {
            let format = node.and_then(|n| n.format.as_deref());
            if matches!(format, Some("date-time" | "datetime"))
                && let (Some(t), Some(u)) =
                    (formats::parse_date_time(x), formats::parse_date_time(y))
            {
                return t == u;
            }
            x == y
        }
        _ => json_eq(a, b),
    }
}

fn error_path(path: &str, suffix: &str) -> String {
    let joined = format!("{path}{suffix}");
    let joined = joined.strip_prefix('.').unwrap_or(&joined).to_string();
    if joined.is_empty() {
        "<nil>".to_string()
    } else {
        joined
    }
}

/// `fieldErrorForReason`.
fn failure(path: &str, type_name: &str, detail: &str, reason: Option<&str>) -> FieldError {
    let value = Value::String(type_name.to_string());
    match reason {
        Some("FieldValueForbidden") => FieldError::forbidden(path, detail),
        Some("FieldValueRequired") => FieldError::required(path, detail),
        Some("FieldValueDuplicate") => FieldError::duplicate(path, &value),
        _ => FieldError::invalid(path, &value, detail),
    }
}

/// Runtime errors caused by the data (a missing key, an index out of range, ...) are
/// reported as kube-apiserver does; errors that come from this library's gaps are
/// internal errors, never a pass.
fn eval_error(path: &str, type_name: &str, e: &ExecutionError, rule: &CelRule) -> FieldError {
    // kube-apiserver's `ruleErrorString`: the message if there is one, else the rule.
    let rule_text = match &rule.message {
        Some(m) if !m.is_empty() => m.trim(),
        _ => rule.rule.trim(),
    };
    let data_error = match e {
        ExecutionError::NoSuchKey(k) => Some(format!("no such key: {k}")),
        ExecutionError::IndexOutOfBounds(i) => Some(match i {
            CelValue::Int(n) => format!("index out of bounds: {n}"),
            CelValue::UInt(n) => format!("index out of bounds: {n}"),
            other => format!("index out of bounds: {other:?}"),
        }),
        ExecutionError::DivisionByZero(_) => Some("division by zero".to_string()),
        ExecutionError::RemainderByZero(_) => Some("modulus by zero".to_string()),
        ExecutionError::Overflow(..) => Some("integer overflow".to_string()),
        ExecutionError::FunctionError { message, .. } => Some(message.clone()),
        _ => None,
    };
    match data_error {
        Some(msg) => FieldError::invalid(
            path,
            &Value::String(type_name.to_string()),
            &format!("{msg} evaluating rule: {rule_text}"),
        ),
        None => FieldError::internal(
            path,
            &format!("kubesim could not evaluate rule ({e}): {rule_text}"),
        ),
    }
}
