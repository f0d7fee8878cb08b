//! A compiled schema node: the `openAPIV3Schema` JSON parsed once into typed fields so that
//! defaulting, pruning and validation never re-read the raw JSON.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use crate::SchemaError;
use crate::cel_rules::CelRule;

/// `additionalProperties` of an object node.
#[derive(Debug, Clone)]
pub(crate) enum Additional {
    /// `additionalProperties: true|false`.
    Bool(bool),
    /// `additionalProperties: {schema}`.
    Schema(Box<Node>),
}

/// `x-kubernetes-list-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListType {
    Atomic,
    Set,
    Map,
}

/// A numeric bound as written in the schema (kept for messages) and as `f64` (for checks).
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    pub value: f64,
    pub exclusive: bool,
}

/// One compiled schema node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    pub ty: Option<String>,
    pub nullable: bool,
    pub format: Option<String>,
    pub properties: BTreeMap<String, Node>,
    pub additional: Option<Additional>,
    pub items: Option<Box<Node>>,
    pub required: Vec<String>,
    pub enum_values: Option<Vec<Value>>,
    pub pattern: Option<(String, Regex)>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub minimum: Option<Bound>,
    pub maximum: Option<Bound>,
    pub multiple_of: Option<f64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub unique_items: bool,
    pub min_properties: Option<u64>,
    pub max_properties: Option<u64>,
    pub all_of: Vec<Node>,
    pub any_of: Vec<Node>,
    pub one_of: Vec<Node>,
    pub not: Option<Box<Node>>,
    pub default: Option<Value>,
    pub preserve_unknown: bool,
    pub embedded: bool,
    pub int_or_string: bool,
    pub list_type: Option<ListType>,
    pub list_map_keys: Vec<String>,
    pub rules: Vec<CelRule>,
    /// Some node in this subtree (this one included) carries CEL rules.
    pub has_rules: bool,
    /// Some node in this subtree carries a transition rule (one using `oldSelf`).
    pub has_transition_rules: bool,
    /// Some node in this subtree carries a default.
    pub has_defaults: bool,
    /// Some node in this subtree is a `set` or `map` list.
    pub has_list_types: bool,
}

fn invalid(path: &str, message: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        path: if path.is_empty() {
            "openAPIV3Schema".to_string()
        } else {
            format!("openAPIV3Schema{path}")
        },
        message: message.into(),
    }
}

fn get_u64(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, SchemaError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                    .map(|f| f as u64)
            })
            .map(Some)
            .ok_or_else(|| invalid(path, format!("{key} must be a non-negative integer"))),
    }
}

fn get_bool(obj: &Map<String, Value>, key: &str, path: &str) -> Result<bool, SchemaError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(path, format!("{key} must be a boolean"))),
    }
}

fn get_f64(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<f64>, SchemaError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| invalid(path, format!("{key} must be a number"))),
    }
}

fn get_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a str>, SchemaError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(invalid(path, format!("{key} must be a string"))),
    }
}

fn sub_list(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Vec<Node>, SchemaError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, s)| Node::compile(s, &format!("{path}.{key}[{i}]")))
            .collect(),
        Some(_) => Err(invalid(path, format!("{key} must be a list of schemas"))),
    }
}

const KNOWN_TYPES: [&str; 6] = ["object", "array", "string", "integer", "number", "boolean"];

impl Node {
    /// Compile one schema node (recursively). `path` is the JSON path inside the schema,
    /// used only in [`SchemaError`] messages.
    pub(crate) fn compile(raw: &Value, path: &str) -> Result<Node, SchemaError> {
        let obj = raw
            .as_object()
            .ok_or_else(|| invalid(path, "a schema must be an object"))?;
        let mut node = Node::default();

        if let Some(ty) = get_str(obj, "type", path)? {
            if !KNOWN_TYPES.contains(&ty) {
                return Err(invalid(
                    path,
                    format!(
                        "type: Unsupported value: {ty:?}: supported values: \"array\", \"boolean\", \"integer\", \"number\", \"object\", \"string\""
                    ),
                ));
            }
            node.ty = Some(ty.to_string());
        }
        node.nullable = get_bool(obj, "nullable", path)?;
        node.format = get_str(obj, "format", path)?.map(str::to_string);
        node.preserve_unknown = get_bool(obj, "x-kubernetes-preserve-unknown-fields", path)?;
        node.embedded = get_bool(obj, "x-kubernetes-embedded-resource", path)?;
        node.int_or_string = get_bool(obj, "x-kubernetes-int-or-string", path)?;

        if let Some(props) = obj.get("properties") {
            let props = props
                .as_object()
                .ok_or_else(|| invalid(path, "properties must be an object"))?;
            for (name, sub) in props {
                node.properties.insert(
                    name.clone(),
                    Node::compile(sub, &format!("{path}.properties[{name}]"))?,
                );
            }
        }
        node.additional = match obj.get("additionalProperties") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(Additional::Bool(*b)),
            Some(sub @ Value::Object(_)) => Some(Additional::Schema(Box::new(Node::compile(
                sub,
                &format!("{path}.additionalProperties"),
            )?))),
            Some(_) => {
                return Err(invalid(
                    path,
                    "additionalProperties must be a schema or a boolean",
                ));
            }
        };
        node.items = match obj.get("items") {
            None | Some(Value::Null) => None,
            Some(sub @ Value::Object(_)) => {
                Some(Box::new(Node::compile(sub, &format!("{path}.items"))?))
            }
            Some(_) => return Err(invalid(path, "items must be a schema")),
        };
        if let Some(req) = obj.get("required") {
            let req = req
                .as_array()
                .ok_or_else(|| invalid(path, "required must be a list of strings"))?;
            for r in req {
                let r = r
                    .as_str()
                    .ok_or_else(|| invalid(path, "required must be a list of strings"))?;
                node.required.push(r.to_string());
            }
        }
        node.enum_values = match obj.get("enum") {
            None | Some(Value::Null) => None,
            Some(Value::Array(values)) => Some(values.clone()),
            Some(_) => return Err(invalid(path, "enum must be a list")),
        };
        if let Some(p) = get_str(obj, "pattern", path)? {
            let re = Regex::new(&crate::go_regex::translate(p))
                .map_err(|e| invalid(path, format!("pattern: Invalid value: {p:?}: {e}")))?;
            node.pattern = Some((p.to_string(), re));
        }
        node.min_length = get_u64(obj, "minLength", path)?;
        node.max_length = get_u64(obj, "maxLength", path)?;
        node.minimum = get_f64(obj, "minimum", path)?.map(|value| Bound {
            value,
            exclusive: false,
        });
        node.maximum = get_f64(obj, "maximum", path)?.map(|value| Bound {
            value,
            exclusive: false,
        });
        if get_bool(obj, "exclusiveMinimum", path)?
            && let Some(b) = node.minimum.as_mut()
        {
            b.exclusive = true;
        }
        if get_bool(obj, "exclusiveMaximum", path)?
            && let Some(b) = node.maximum.as_mut()
        {
            b.exclusive = true;
        }
        node.multiple_of = get_f64(obj, "multipleOf", path)?;
        if node.multiple_of.is_some_and(|m| m <= 0.0) {
            return Err(invalid(path, "multipleOf must be greater than zero"));
        }
        node.min_items = get_u64(obj, "minItems", path)?;
        node.max_items = get_u64(obj, "maxItems", path)?;
        node.unique_items = get_bool(obj, "uniqueItems", path)?;
        node.min_properties = get_u64(obj, "minProperties", path)?;
        node.max_properties = get_u64(obj, "maxProperties", path)?;
        node.all_of = sub_list(obj, "allOf", path)?;
        node.any_of = sub_list(obj, "anyOf", path)?;
        node.one_of = sub_list(obj, "oneOf", path)?;
        node.not = match obj.get("not") {
            None | Some(Value::Null) => None,
            Some(sub) => Some(Box::new(Node::compile(sub, &format!("{path}.not"))?)),
        };
        node.default = obj.get("default").cloned();
        node.list_type = match get_str(obj, "x-kubernetes-list-type", path)? {
            None => None,
            Some("atomic") => Some(ListType::Atomic),
            Some("set") => Some(ListType::Set),
            Some("map") => Some(ListType::Map),
            Some(other) => {
                return Err(invalid(
                    path,
                    format!(
                        "x-kubernetes-list-type: Unsupported value: {other:?}: supported values: \"atomic\", \"set\", \"map\""
                    ),
                ));
            }
        };
        if let Some(keys) = obj.get("x-kubernetes-list-map-keys") {
            let keys = keys
                .as_array()
                .ok_or_else(|| invalid(path, "x-kubernetes-list-map-keys must be a list"))?;
            for k in keys {
                node.list_map_keys.push(
                    k.as_str()
                        .ok_or_else(|| invalid(path, "x-kubernetes-list-map-keys must be strings"))?
                        .to_string(),
                );
            }
        }
        if node.list_type == Some(ListType::Map) && node.list_map_keys.is_empty() {
            return Err(invalid(
                path,
                "x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map",
            ));
        }
        if node.int_or_string && node.ty.is_some() {
            return Err(invalid(
                path,
                "type: Invalid value: must be empty if x-kubernetes-int-or-string is true",
            ));
        }
        if let Some(rules) = obj.get("x-kubernetes-validations") {
            let rules = rules
                .as_array()
                .ok_or_else(|| invalid(path, "x-kubernetes-validations must be a list"))?;
            for (i, r) in rules.iter().enumerate() {
                node.rules.push(CelRule::compile(
                    r,
                    &format!("{path}.x-kubernetes-validations[{i}]"),
                )?);
            }
        }

        let mut rules = std::mem::take(&mut node.rules);
        for (i, rule) in rules.iter_mut().enumerate() {
            rule.resolve_field_path(&node, &format!("{path}.x-kubernetes-validations[{i}]"))?;
        }
        node.rules = rules;

        node.has_rules = !node.rules.is_empty() || node.children().any(|c| c.has_rules);
        node.has_transition_rules = node.rules.iter().any(|r| r.uses_old_self)
            || node.children().any(|c| c.has_transition_rules);
        node.has_defaults = node.default.is_some() || node.children().any(|c| c.has_defaults);
        node.has_list_types = matches!(node.list_type, Some(ListType::Set | ListType::Map))
            || node.children().any(|c| c.has_list_types);
        Ok(node)
    }

    /// Direct structural children (properties, additionalProperties, items).
    fn children(&self) -> impl Iterator<Item = &Node> {
        let additional = match &self.additional {
            Some(Additional::Schema(s)) => Some(s.as_ref()),
            _ => None,
        };
        self.properties
            .values()
            .chain(additional)
            .chain(self.items.as_deref())
    }

    /// The schema for map values (`additionalProperties: {schema}`), if any.
    pub(crate) fn additional_schema(&self) -> Option<&Node> {
        match &self.additional {
            Some(Additional::Schema(s)) => Some(s),
            _ => None,
        }
    }

    /// Whether unknown fields of an object at this node are kept by pruning.
    pub(crate) fn keeps_unknown(&self) -> bool {
        self.preserve_unknown || matches!(self.additional, Some(Additional::Bool(true)))
    }

    /// Every CEL rule in this subtree, as its source text.
    pub(crate) fn collect_rules<'a>(&'a self, out: &mut Vec<&'a CelRule>) {
        out.extend(self.rules.iter());
        for c in self.children() {
            c.collect_rules(out);
        }
        for c in self.all_of.iter().chain(&self.any_of).chain(&self.one_of) {
            c.collect_rules(out);
        }
    }
}
