//! The part of CEL type checking kube-apiserver's admission policies rely on: field
//! selections (`a.b`, `a.?b`, `has(a.b)`) checked against the declared type of what they
//! select from, reported as cel-go reports them (`undefined field 'b'` with its position).
//!
//! cel-rust has no type checker, so this is a small one: types come from OpenAPI schemas
//! the way kube-apiserver's `SchemaDeclType` builds them, or are built by hand for the
//! admission request and namespace. Anything it cannot type is `Dyn`, and `Dyn` accepts
//! every selection: it may miss an error cel-go would report, never the other way round.

use std::collections::BTreeMap;
use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use serde_json::{Value, json};

/// A CEL type, as far as field selection cares.
#[derive(Debug, Clone, PartialEq)]
pub enum CelType {
    /// Unknown or dynamic: any selection is accepted.
    Dyn,
    /// A string, number, bool, timestamp … (nothing to select from).
    Scalar,
    /// A list of the element type.
    List(Box<CelType>),
    /// A map with string keys to the value type (selections yield the value type).
    Map(Box<CelType>),
    /// An object with exactly these fields (CEL names, escaped as kube-apiserver escapes
    /// property names).
    Object(Arc<BTreeMap<String, CelType>>),
    /// `optional(T)`.
    Optional(Box<CelType>),
}

/// CEL's reserved words: properties so named are reachable as `__word__` (and, in newer
/// kube-apiserver versions, by the bare word).
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

/// kube-apiserver's `Escape` of a property name into a CEL field name; `None` when the
/// property is not reachable from CEL.
fn escape(name: &str) -> Option<String> {
    let first = name.chars().next()?;
    if first.is_ascii_digit() {
        return None;
    }
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut out = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '_' if chars.peek() == Some(&'_') => {
                chars.next();
                out.push_str("__underscores__");
            }
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c if c.is_ascii_alphanumeric() || c == '_' => out.push(c),
            _ => return None,
        }
    }
    Some(out)
}

fn flag(s: &Value, key: &str) -> bool {
    s.get(key).and_then(Value::as_bool) == Some(true)
}

fn prop_type(s: &Value, key: &str) -> Option<String> {
    s.pointer(&format!("/properties/{key}/type"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// `WithTypeAndObjectMeta`: a resource root always has `apiVersion`, `kind` and at least
/// `metadata.name`/`metadata.generateName`.
fn with_type_and_object_meta(s: &Value) -> Value {
    let complete = prop_type(s, "kind").as_deref() == Some("string")
        && prop_type(s, "apiVersion").as_deref() == Some("string")
        && prop_type(s, "metadata").as_deref() == Some("object")
        && s.pointer("/properties/metadata/properties/name/type") == Some(&json!("string"))
        && s.pointer("/properties/metadata/properties/generateName/type") == Some(&json!("string"));
    if complete {
        return s.clone();
    }
    let mut out = s.clone();
    if !out.is_object() {
        out = json!({});
    }
    if !out.get("properties").is_some_and(Value::is_object) {
        out["properties"] = json!({});
    }
    out["properties"]["kind"] = json!({"type": "string"});
    out["properties"]["apiVersion"] = json!({"type": "string"});
    out["properties"]["metadata"] = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "generateName": {"type": "string"}}});
    out
}

impl CelType {
    /// The type kube-apiserver's `SchemaDeclType` gives an OpenAPI v3 schema; `None` when
    /// the schema is not exposed to CEL (no type, an array without items …), in which case
    /// a property with that schema is not a field of its object.
    pub fn from_schema(s: &Value, resource_root: bool) -> Option<CelType> {
        if flag(s, "x-kubernetes-int-or-string") {
            return Some(CelType::Dyn);
        }
        let owned;
        let s = if resource_root {
            owned = with_type_and_object_meta(s);
            &owned
        } else {
            s
        };
        let embedded = |x: &Value| flag(x, "x-kubernetes-embedded-resource");
        match s.get("type").and_then(Value::as_str)? {
            "array" => {
                let items = s.get("items")?;
                Some(CelType::List(Box::new(CelType::from_schema(
                    items,
                    embedded(items),
                )?)))
            }
            "object" => {
                if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object()) {
                    return Some(CelType::Map(Box::new(CelType::from_schema(
                        ap,
                        embedded(ap),
                    )?)));
                }
                let mut fields = BTreeMap::new();
                if let Some(props) = s.get("properties").and_then(Value::as_object) {
                    for (name, prop) in props {
                        if let (Some(t), Some(n)) =
                            (CelType::from_schema(prop, embedded(prop)), escape(name))
                        {
                            fields.insert(n, t);
                        }
                    }
                }
                Some(CelType::Object(Arc::new(fields)))
            }
            "string" | "boolean" | "number" | "integer" => Some(CelType::Scalar),
            _ => None,
        }
    }

    /// The type of a custom resource of a CRD version's `openAPIV3Schema`, as
    /// kube-apiserver publishes it (and its type checker resolves it): the schema with
    /// `apiVersion`, `kind` and the full `ObjectMeta` as `metadata`.
    pub fn custom_resource(open_api_v3_schema: &Value) -> Option<CelType> {
        let mut s = open_api_v3_schema.clone();
        if !s.is_object() {
            return None;
        }
        if !s.get("properties").is_some_and(Value::is_object) {
            s["properties"] = json!({});
        }
        s["properties"]["apiVersion"] = json!({"type": "string"});
        s["properties"]["kind"] = json!({"type": "string"});
        s["properties"]["metadata"] = object_meta_schema();
        CelType::from_schema(&s, true)
    }

    /// An object with these fields.
    pub fn object(fields: Vec<(&str, CelType)>) -> CelType {
        CelType::Object(Arc::new(
            fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        ))
    }

    /// A field of an object (by its CEL name, or by the property name it escapes).
    fn field(fields: &BTreeMap<String, CelType>, name: &str) -> Option<CelType> {
        fields
            .get(name)
            .or_else(|| fields.get(&format!("__{name}__")))
            .or_else(|| escape(name).and_then(|n| fields.get(&n)))
            .cloned()
    }
}

/// `io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta` as OpenAPI v3 publishes it.
fn object_meta_schema() -> Value {
    let s = json!({"type": "string"});
    let map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    json!({"type": "object", "properties": {
        "annotations": map,
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "finalizers": {"type": "array", "items": s},
        "generateName": s,
        "generation": {"type": "integer"},
        "labels": map,
        "managedFields": {"type": "array", "items": {"type": "object", "properties": {
            "apiVersion": s, "fieldsType": s, "fieldsV1": {"type": "object"},
            "manager": s, "operation": s, "subresource": s,
            "time": {"type": "string", "format": "date-time"}}}},
        "name": s,
        "namespace": s,
        "ownerReferences": {"type": "array", "items": {"type": "object", "properties": {
            "apiVersion": s, "blockOwnerDeletion": {"type": "boolean"},
            "controller": {"type": "boolean"}, "kind": s, "name": s, "uid": s}}},
        "resourceVersion": s,
        "selfLink": s,
        "uid": s,
    }})
}

/// The type of `request` in admission policies (`BuildRequestType`).
pub fn admission_request_type() -> CelType {
    let gvk = CelType::object(vec![
        ("group", CelType::Scalar),
        ("version", CelType::Scalar),
        ("kind", CelType::Scalar),
    ]);
    let gvr = CelType::object(vec![
        ("group", CelType::Scalar),
        ("version", CelType::Scalar),
        ("resource", CelType::Scalar),
    ]);
    let strings = CelType::List(Box::new(CelType::Scalar));
    let user = CelType::object(vec![
        ("username", CelType::Scalar),
        ("uid", CelType::Scalar),
        ("groups", strings.clone()),
        ("extra", CelType::Map(Box::new(strings))),
    ]);
    CelType::object(vec![
        ("kind", gvk.clone()),
        ("resource", gvr.clone()),
        ("subResource", CelType::Scalar),
        ("requestKind", gvk),
        ("requestResource", gvr),
        ("requestSubResource", CelType::Scalar),
        ("name", CelType::Scalar),
        ("namespace", CelType::Scalar),
        ("operation", CelType::Scalar),
        ("userInfo", user),
        ("dryRun", CelType::Scalar),
        ("options", CelType::Dyn),
    ])
}

/// The type of `namespaceObject` in admission policies (`BuildNamespaceType`).
pub fn namespace_type() -> CelType {
    let strings = CelType::List(Box::new(CelType::Scalar));
    let string_map = CelType::Map(Box::new(CelType::Scalar));
    let condition = CelType::object(vec![
        ("status", CelType::Scalar),
        ("type", CelType::Scalar),
        ("lastTransitionTime", CelType::Scalar),
        ("message", CelType::Scalar),
        ("reason", CelType::Scalar),
    ]);
    CelType::object(vec![
        (
            "metadata",
            CelType::object(vec![
                ("name", CelType::Scalar),
                ("generateName", CelType::Scalar),
                ("namespace", CelType::Scalar),
                ("labels", string_map.clone()),
                ("annotations", string_map),
                ("UID", CelType::Scalar),
                ("creationTimestamp", CelType::Scalar),
                ("deletionGracePeriodSeconds", CelType::Scalar),
                ("deletionTimestamp", CelType::Scalar),
                ("generation", CelType::Scalar),
                ("resourceVersion", CelType::Scalar),
                ("finalizers", strings.clone()),
            ]),
        ),
        ("spec", CelType::object(vec![("finalizers", strings)])),
        (
            "status",
            CelType::object(vec![
                ("conditions", CelType::List(Box::new(condition))),
                ("phase", CelType::Scalar),
            ]),
        ),
    ])
}

/// One problem found in an expression, where cel-go would report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckIssue {
    /// Offset of the node in the expression, in bytes.
    pub offset: usize,
    /// The message, e.g. `undefined field 'x'`.
    pub message: String,
}

/// Checks the selections in `expr` against `roots` (variable name → type). Names neither
/// in `roots` nor bound by a comprehension are `Dyn`, except those in `undeclared`, which
/// are reported as cel-go reports an undeclared reference.
pub(crate) fn check(
    expr: &IdedExpr,
    offsets: &dyn Fn(u64) -> Option<usize>,
    roots: &[(&str, &CelType)],
    undeclared: &[String],
) -> (CelType, Vec<CheckIssue>) {
    let mut c = Checker {
        offsets,
        roots,
        undeclared,
        scope: Vec::new(),
        issues: Vec::new(),
    };
    let t = c.ty(expr);
    let mut issues = c.issues;
    // cel-go sorts its errors by position, keeping the order of those at the same place.
    issues.sort_by_key(|i| i.offset);
    (t, issues)
}

struct Checker<'a> {
    offsets: &'a dyn Fn(u64) -> Option<usize>,
    roots: &'a [(&'a str, &'a CelType)],
    undeclared: &'a [String],
    scope: Vec<(String, CelType)>,
    issues: Vec<CheckIssue>,
}

impl Checker<'_> {
    fn report(&mut self, id: u64, message: String) {
        if let Some(offset) = (self.offsets)(id) {
            self.issues.push(CheckIssue { offset, message });
        }
    }

    fn lookup(&self, name: &str) -> Option<CelType> {
        if let Some((_, t)) = self.scope.iter().rev().find(|(n, _)| n == name) {
            return Some(t.clone());
        }
        self.roots
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| (*t).clone())
    }

    /// cel-go's `checkSelectField`.
    fn select(&mut self, id: u64, operand: CelType, field: &str, optional: bool) -> CelType {
        let (target, was_optional) = match operand {
            CelType::Optional(t) => (*t, true),
            t => (t, false),
        };
        let result = match target {
            CelType::Map(v) => *v,
            CelType::Object(fields) => match CelType::field(&fields, field) {
                Some(t) => t,
                None => {
                    self.report(id, format!("undefined field '{field}'"));
                    CelType::Dyn
                }
            },
            _ => CelType::Dyn,
        };
        if was_optional || optional {
            CelType::Optional(Box::new(result))
        } else {
            result
        }
    }

    fn ty(&mut self, e: &IdedExpr) -> CelType {
        match &e.expr {
            Expr::Ident(name) => match self.lookup(name) {
                Some(t) => t,
                None => {
                    if self.undeclared.contains(name) {
                        self.report(
                            e.id,
                            format!("undeclared reference to '{name}' (in container '')"),
                        );
                    }
                    CelType::Dyn
                }
            },
            Expr::Select(sel) => {
                let operand = self.ty(&sel.operand);
                let t = self.select(e.id, operand, &sel.field, false);
                if sel.test { CelType::Scalar } else { t }
            }
            Expr::Call(call) => {
                let args = &call.args;
                match (call.func_name.as_str(), call.target.as_deref(), args.len()) {
                    ("_?._", None, 2) => {
                        let operand = self.ty(&args[0]);
                        match &args[1].expr {
                            Expr::Literal(LiteralValue::String(f)) => {
                                let f = f.to_string();
                                self.select(e.id, operand, &f, true)
                            }
                            _ => CelType::Dyn,
                        }
                    }
                    ("_[_]", None, 2) => {
                        let container = self.ty(&args[0]);
                        self.ty(&args[1]);
                        match container {
                            CelType::List(v) | CelType::Map(v) => *v,
                            _ => CelType::Dyn,
                        }
                    }
                    ("value", Some(target), 0) => match self.ty(target) {
                        CelType::Optional(t) => *t,
                        _ => CelType::Dyn,
                    },
                    ("orValue", Some(target), 1) => {
                        let t = self.ty(target);
                        self.ty(&args[0]);
                        match t {
                            CelType::Optional(t) => *t,
                            _ => CelType::Dyn,
                        }
                    }
                    _ => {
                        // Calls not expanded into comprehensions bind their leading
                        // identifier arguments (`sortBy(x, …)`); those are `Dyn`.
                        let target_is_namespace = matches!(
                            call.target.as_deref(),
                            Some(IdedExpr { expr: Expr::Ident(n), .. })
                                if self.lookup(n).is_none() && !self.undeclared.contains(n)
                        );
                        if let Some(t) = call.target.as_deref()
                            && !target_is_namespace
                        {
                            self.ty(t);
                        }
                        let before = self.scope.len();
                        let binds = crate::cel_lib::binds_variables(&call.func_name);
                        for (i, a) in args.iter().enumerate() {
                            match &a.expr {
                                Expr::Ident(v) if binds && i + 1 < args.len() => {
                                    self.scope.push((v.clone(), CelType::Dyn))
                                }
                                _ => {
                                    self.ty(a);
                                }
                            }
                        }
                        self.scope.truncate(before);
                        CelType::Dyn
                    }
                }
            }
            Expr::Comprehension(c) => {
                let range = self.ty(&c.iter_range);
                self.ty(&c.accu_init);
                let before = self.scope.len();
                // One variable: a list's element, a map's key. Two: index (or key), value.
                let (key, value, single) = match range {
                    CelType::List(v) => (CelType::Scalar, *v.clone(), *v),
                    CelType::Map(v) => (CelType::Scalar, *v, CelType::Scalar),
                    _ => (CelType::Dyn, CelType::Dyn, CelType::Dyn),
                };
                match &c.iter_var2 {
                    Some(v2) => {
                        self.scope.push((c.iter_var.clone(), key));
                        self.scope.push((v2.clone(), value));
                    }
                    None => self.scope.push((c.iter_var.clone(), single)),
                }
                self.scope.push((c.accu_var.clone(), CelType::Dyn));
                self.ty(&c.loop_cond);
                self.ty(&c.loop_step);
                self.ty(&c.result);
                self.scope.truncate(before);
                CelType::Dyn
            }
            Expr::List(l) => {
                for x in &l.elements {
                    self.ty(x);
                }
                CelType::Dyn
            }
            Expr::Map(m) => {
                for entry in &m.entries {
                    self.entry(&entry.expr);
                }
                CelType::Dyn
            }
            Expr::Struct(st) => {
                for entry in &st.entries {
                    self.entry(&entry.expr);
                }
                CelType::Dyn
            }
            Expr::Literal(_) => CelType::Scalar,
            Expr::Unspecified => CelType::Dyn,
        }
    }

    fn entry(&mut self, e: &EntryExpr) {
        match e {
            EntryExpr::StructField(f) => {
                self.ty(&f.value);
            }
            EntryExpr::MapEntry(m) => {
                self.ty(&m.key);
                self.ty(&m.value);
            }
        }
    }
}

/// cel-go's `Issues.String()` for `issues` found in `source`: one
/// `ERROR: <input>:<line>:<column>: <message>` per issue, each followed by the line and a
/// caret under the column.
pub fn display_issues(source: &str, issues: &[CheckIssue]) -> String {
    let lines: Vec<&str> = source.split('\n').collect();
    let mut out = Vec::new();
    for issue in issues {
        let mut offset = issue.offset.min(source.len());
        while !source.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &source[..offset];
        let line = before.matches('\n').count();
        // cel-go counts columns in code points.
        let column = before
            .rsplit('\n')
            .next()
            .unwrap_or_default()
            .chars()
            .count();
        let mut text = format!(
            "ERROR: <input>:{}:{}: {}",
            line + 1,
            column + 1,
            issue.message
        );
        if let Some(snippet) = lines.get(line).filter(|s| s.len() <= 16384) {
            let snippet = snippet.replace('\t', " ");
            let mut caret = String::new();
            let mut rest = snippet.chars();
            for _ in 0..column {
                match rest.next() {
                    Some(c) if c.len_utf8() > 1 => caret.push('\u{ff0e}'),
                    Some(_) => caret.push('.'),
                    None => break,
                }
            }
            caret.push(match rest.next() {
                Some(c) if c.len_utf8() > 1 => '\u{ff3e}',
                _ => '^',
            });
            text.push_str(&format!("\n | {snippet}\n | {caret}"));
        }
        out.push(text);
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::CelExpression;

    fn warnings(text: &str, object: &CelType) -> String {
        let e = CelExpression::compile(text).unwrap();
        let (_, issues) = e.check_types(&[("object", object)], &[]);
        display_issues(text, &issues)
    }

    #[test]
    fn reports_undefined_fields_where_cel_go_does() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {
            "items": {"type": "array", "items": {"type": "object",
                "properties": {"name": {"type": "string"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "free": {"x-kubernetes-int-or-string": true},
            "my-field": {"type": "string"},
        }}}});
        let t = CelType::custom_resource(&schema).unwrap();
        assert_eq!(
            warnings("object.spec.nosuchfield == 'x'", &t),
            "ERROR: <input>:1:12: undefined field 'nosuchfield'\n | object.spec.nosuchfield == 'x'\n | ...........^"
        );
        // has() reports at its parenthesis, as the macro's node is placed there.
        assert_eq!(
            warnings("has(object.spec.x)", &t),
            "ERROR: <input>:1:4: undefined field 'x'\n | has(object.spec.x)\n | ...^"
        );
        assert_eq!(
            warnings("object.?spec.?nope.orValue('')", &t),
            "ERROR: <input>:1:13: undefined field 'nope'\n | object.?spec.?nope.orValue('')\n | ............^"
        );
        let ok = [
            "object.spec.items.all(i, i.name != '')",
            "object.spec.labels.anything == 'x' && object.spec.labels['y'] == 'z'",
            "object.spec.free.whatever == 1",
            "object.spec.my__dash__field == '' && object.metadata.labels.a == ''",
            "object.metadata.namespace == '' && object.metadata.ownerReferences[0].uid == ''",
            "object.apiVersion == '' && object.kind == ''",
            "object.spec.labels.exists(k, k == 'a')",
            "[1].exists(x, x.whatever == 1)",
        ];
        for text in ok {
            assert_eq!(warnings(text, &t), "", "{text}");
        }
        assert_eq!(
            warnings(
                "object.spec.items.all(i, i.nam != '')\n&& object.metadata.x == 1",
                &t
            ),
            "ERROR: <input>:1:27: undefined field 'nam'\n | object.spec.items.all(i, i.nam != '')\n | ..........................^\nERROR: <input>:2:19: undefined field 'x'\n | && object.metadata.x == 1\n | ..................^"
        );
        // Columns count characters; wide characters get wide dots, as cel-go draws them.
        assert_eq!(
            warnings("'é' == object.nope", &t),
            "ERROR: <input>:1:14: undefined field 'nope'\n | 'é' == object.nope\n | .\u{ff0e}...........^"
        );
    }
}
