//! One focused test per OpenAPI keyword, defaulting, pruning and list types, checked
//! against kube-apiserver's exact messages.

mod common;

use common::{admit, errors};
use kubesim_schema::{CompiledSchema, FieldErrorKind, SchemaError};
use serde_json::{Value, json};

/// A root schema whose `spec` is `spec_schema`.
fn with_spec(spec_schema: Value) -> CompiledSchema {
    CompiledSchema::new(&json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema
        }
    }))
    .unwrap()
}

fn obj(spec: Value) -> Value {
    json!({"apiVersion": "x.io/v1", "kind": "X", "metadata": {"name": "a"}, "spec": spec})
}

fn field(name: &str, schema: Value) -> CompiledSchema {
    with_spec(json!({"type": "object", "properties": {name: schema}}))
}

#[test]
fn type_checks_every_json_type() {
    let s = with_spec(json!({"type": "object", "properties": {
        "o": {"type": "object"}, "a": {"type": "array"}, "s": {"type": "string"},
        "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"}
    }}));
    let good = obj(json!({"o": {}, "a": [], "s": "x", "i": 3, "n": 1.5, "b": true}));
    assert_eq!(errors(&s, good, None), Vec::<String>::new());
    // integer is a number; an integral float is an integer.
    assert_eq!(
        errors(&s, obj(json!({"n": 2, "i": 2.0})), None),
        Vec::<String>::new()
    );
    let bad = obj(json!({"o": [], "a": {}, "s": 1, "i": 1.5, "n": "1", "b": "true"}));
    assert_eq!(
        errors(&s, bad, None),
        vec![
            r#"spec.a: Invalid value: "object": spec.a in body must be of type array: "object""#,
            r#"spec.b: Invalid value: "string": spec.b in body must be of type boolean: "string""#,
            r#"spec.i: Invalid value: "number": spec.i in body must be of type integer: "number""#,
            r#"spec.n: Invalid value: "string": spec.n in body must be of type number: "string""#,
            r#"spec.o: Invalid value: "array": spec.o in body must be of type object: "array""#,
            r#"spec.s: Invalid value: "integer": spec.s in body must be of type string: "integer""#,
        ]
    );
}

#[test]
fn required_and_error_kinds() {
    let s = with_spec(
        json!({"type": "object", "required": ["a", "b"], "properties": {
            "a": {"type": "string"}, "b": {"type": "string"}
        }}),
    );
    let mut o = obj(json!({"a": "x"}));
    s.apply_defaults(&mut o);
    s.prune(&mut o);
    let errs = s.validate(&o, None);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].path, "spec.b");
    assert_eq!(errs[0].kind, FieldErrorKind::Required);
    assert_eq!(errs[0].detail, "Required value");
}

#[test]
fn enum_strings_and_numbers() {
    let s = field(
        "mode",
        json!({"type": "string", "enum": ["PoolOnly", "PerObjective"]}),
    );
    assert_eq!(
        errors(&s, obj(json!({"mode": "Foo"})), None),
        vec![
            r#"spec.mode: Unsupported value: "Foo": supported values: "PoolOnly", "PerObjective""#
        ]
    );
    assert_eq!(
        errors(&s, obj(json!({"mode": "PoolOnly"})), None),
        Vec::<String>::new()
    );
    let n = field("level", json!({"type": "integer", "enum": [1, 2]}));
    assert_eq!(
        errors(&n, obj(json!({"level": 3})), None),
        vec![r#"spec.level: Unsupported value: 3: supported values: "1", "2""#]
    );
}

#[test]
fn pattern_min_and_max_length() {
    let s = field(
        "name",
        json!({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 5}),
    );
    assert_eq!(
        errors(&s, obj(json!({"name": "ABC"})), None),
        vec![r#"spec.name: Invalid value: "ABC": spec.name in body should match '^[a-z]+$'"#]
    );
    assert_eq!(
        errors(&s, obj(json!({"name": "abcdef"})), None),
        vec!["spec.name: Too long: may not be more than 5 bytes"]
    );
    assert_eq!(
        errors(&s, obj(json!({"name": "a"})), None),
        vec![r#"spec.name: Invalid value: "a": spec.name in body should be at least 2 chars long"#]
    );
    // Lengths count characters, not bytes.
    assert_eq!(errors(&s, obj(json!({"name": "ééééé"})), None).len(), 1); // pattern only
}

#[test]
fn minimum_maximum_exclusive_and_multiple_of() {
    let s = field(
        "n",
        json!({"type": "integer", "minimum": 1, "maximum": 10, "exclusiveMaximum": true, "multipleOf": 2}),
    );
    assert_eq!(errors(&s, obj(json!({"n": 4})), None), Vec::<String>::new());
    assert_eq!(
        errors(&s, obj(json!({"n": 10})), None),
        vec!["spec.n: Invalid value: 10: spec.n in body should be less than 10"]
    );
    assert_eq!(
        errors(&s, obj(json!({"n": 0})), None),
        vec!["spec.n: Invalid value: 0: spec.n in body should be greater than or equal to 1"]
    );
    assert_eq!(
        errors(&s, obj(json!({"n": 3})), None),
        vec!["spec.n: Invalid value: 3: spec.n in body should be a multiple of 2"]
    );
    let f = field(
        "x",
        json!({"type": "number", "minimum": 0.5, "exclusiveMinimum": true}),
    );
    assert_eq!(
        errors(&f, obj(json!({"x": 0.5})), None),
        vec!["spec.x: Invalid value: 0.5: spec.x in body should be greater than 0.5"]
    );
}

#[test]
fn items_min_max_and_unique() {
    let s = field(
        "l",
        json!({"type": "array", "minItems": 1, "maxItems": 2, "uniqueItems": true, "items": {"type": "string"}}),
    );
    assert_eq!(
        errors(&s, obj(json!({"l": []})), None),
        vec!["spec.l: Invalid value: 0: spec.l in body should have at least 1 items"]
    );
    assert_eq!(
        errors(&s, obj(json!({"l": ["a", "b", "c"]})), None),
        vec!["spec.l: Too many: 3: must have at most 2 items"]
    );
    assert_eq!(
        errors(&s, obj(json!({"l": ["a", "a"]})), None),
        vec![r#"spec.l: Invalid value: "": spec.l in body shouldn't contain duplicates"#]
    );
    assert_eq!(
        errors(&s, obj(json!({"l": ["a", 1]})), None),
        vec![
            r#"spec.l[1]: Invalid value: "integer": spec.l[1] in body must be of type string: "integer""#
        ]
    );
}

#[test]
fn min_and_max_properties_and_additional_properties() {
    let s = field(
        "m",
        json!({"type": "object", "minProperties": 1, "maxProperties": 2,
        "additionalProperties": {"type": "string", "maxLength": 3}}),
    );
    assert_eq!(
        errors(&s, obj(json!({"m": {}})), None),
        vec!["spec.m: Invalid value: 0: spec.m in body should have at least 1 properties"]
    );
    assert_eq!(
        errors(&s, obj(json!({"m": {"a": "1", "b": "2", "c": "3"}})), None),
        vec!["spec.m: Too many: 3: must have at most 2 items"]
    );
    assert_eq!(
        errors(&s, obj(json!({"m": {"a": "long"}})), None),
        vec!["spec.m.a: Too long: may not be more than 3 bytes"]
    );
    let closed = field(
        "c",
        json!({"type": "object", "additionalProperties": false, "properties": {"a": {"type": "string"}}}),
    );
    // Pruning drops the unknown key first; validating the raw object reports it.
    let raw = obj(json!({"c": {"a": "x", "z": "y"}}));
    assert_eq!(errors(&closed, raw.clone(), None), Vec::<String>::new());
    let errs: Vec<String> = closed
        .validate(&raw, None)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        errs,
        vec![r#"spec.c: Invalid value: "z": spec.c.z in body is a forbidden property"#]
    );
}

#[test]
fn nullable_and_null_pruning() {
    let s = with_spec(json!({"type": "object", "properties": {
        "n": {"type": "string", "nullable": true},
        "s": {"type": "string"},
        "d": {"type": "string", "default": "dflt"},
        "l": {"type": "array", "items": {"type": "string"}}
    }}));
    let (stored, errs) = admit(
        &s,
        obj(json!({"n": null, "s": null, "d": null, "l": ["a", null]})),
        None,
    );
    // nullable keeps null; non-nullable null without default is pruned; with default, defaulted.
    assert_eq!(
        stored["spec"],
        json!({"n": null, "d": "dflt", "l": ["a", null]})
    );
    assert_eq!(
        errs,
        vec![
            r#"spec.l[1]: Invalid value: "null": spec.l[1] in body must be of type string: "null""#
        ]
    );
}

#[test]
fn date_time_and_other_formats() {
    let s = with_spec(json!({"type": "object", "properties": {
        "t": {"type": "string", "format": "date-time"},
        "b": {"type": "string", "format": "byte"},
        "i": {"type": "integer", "format": "int32"},
        "u": {"type": "string", "format": "no-such-format"}
    }}));
    let good = obj(json!({"t": "2026-01-02T03:04:05.5Z", "b": "aGk=", "i": 1, "u": "anything"}));
    assert_eq!(errors(&s, good, None), Vec::<String>::new());
    assert_eq!(
        errors(&s, obj(json!({"t": "2026-13-02", "b": "!!"})), None),
        vec![
            r#"spec.b: Invalid value: "!!": spec.b in body must be of type byte: "!!""#,
            r#"spec.t: Invalid value: "2026-13-02": spec.t in body must be of type date-time: "2026-13-02""#,
        ]
    );
    // kube-openapi reports a wrong non-string type in a field with a format against the format.
    assert_eq!(
        errors(&s, obj(json!({"i": 1.5})), None),
        vec![
            r#"spec.i: Invalid value: "float64": spec.i in body must be of type int32: "float64""#
        ]
    );
    assert_eq!(
        errors(&s, obj(json!({"i": true})), None),
        vec![r#"spec.i: Invalid value: "": spec.i in body must be of type int32: """#]
    );
    assert_eq!(
        errors(&s, obj(json!({"i": "1"})), None),
        vec![
            r#"spec.i: Invalid value: "string": spec.i in body must be of type integer: "string""#
        ]
    );
}

#[test]
fn int_or_string() {
    let s = field(
        "port",
        json!({"x-kubernetes-int-or-string": true,
        "anyOf": [{"type": "integer"}, {"type": "string"}]}),
    );
    assert_eq!(
        errors(&s, obj(json!({"port": 80})), None),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, obj(json!({"port": "http"})), None),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, obj(json!({"port": true})), None),
        vec![
            r#"spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean""#,
            r#"<nil>: Invalid value: "": "spec.port" must validate at least one schema (anyOf)"#,
            r#"spec.port: Invalid value: "boolean": spec.port in body must be of type integer: "boolean""#,
        ]
    );
}

#[test]
fn all_of_any_of_one_of_not() {
    let s = field(
        "v",
        json!({"type": "string",
        "allOf": [{"maxLength": 4}],
        "anyOf": [{"pattern": "^a"}, {"pattern": "^b"}],
        "not": {"enum": ["bad"]}}),
    );
    assert_eq!(
        errors(&s, obj(json!({"v": "abc"})), None),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&s, obj(json!({"v": "abcdef"})), None),
        vec!["spec.v: Too long: may not be more than 4 bytes"]
    );
    let errs = errors(&s, obj(json!({"v": "cde"})), None);
    assert_eq!(
        errs[0],
        r#"<nil>: Invalid value: "": "spec.v" must validate at least one schema (anyOf)"#
    );
    let one = field(
        "w",
        json!({"type": "integer", "oneOf": [{"minimum": 0}, {"maximum": 10}]}),
    );
    assert_eq!(
        errors(&one, obj(json!({"w": 20})), None),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&one, obj(json!({"w": 5})), None),
        vec![
            r#"<nil>: Invalid value: "": "spec.w" must validate one and only one schema (oneOf). Found 2 valid alternatives"#
        ]
    );
}

#[test]
fn defaults_at_every_level() {
    let s = with_spec(json!({"type": "object", "properties": {
        "a": {"type": "string", "default": "A"},
        "obj": {"type": "object", "default": {}, "properties": {"x": {"type": "integer", "default": 7}}},
        "list": {"type": "array", "items": {"type": "object", "properties": {"p": {"type": "string", "default": "P"}}}},
        "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"q": {"type": "boolean", "default": true}}}},
        "keep": {"type": "string", "default": "K"},
        "nul": {"type": "string", "nullable": true, "default": "N"}
    }}));
    let (stored, errs) = admit(
        &s,
        obj(json!({"list": [{}, {"p": "mine"}], "map": {"k": {}}, "keep": "mine", "nul": null})),
        None,
    );
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(
        stored["spec"],
        json!({
            "a": "A",
            "obj": {"x": 7},
            "list": [{"p": "P"}, {"p": "mine"}],
            "map": {"k": {"q": true}},
            "keep": "mine",
            "nul": null
        })
    );
}

#[test]
fn pruning_and_unknown_fields() {
    let s = CompiledSchema::new(&json!({
        "type": "object",
        "properties": {
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": {
                "known": {"type": "string"},
                "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                         "properties": {"typed": {"type": "object", "properties": {"t": {"type": "string"}}}}},
                "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                             "properties": {"spec": {"type": "object", "properties": {"r": {"type": "integer"}}}}}
            }}
        }
    }))
    .unwrap();
    let input = json!({
        "apiVersion": "x.io/v1", "kind": "X", "metadata": {"name": "a", "labels": {"l": "v"}},
        "extra": 1,
        "spec": {
            "known": "k", "unknown": "u",
            "items": [{"n": "1", "drop": true}],
            "free": {"anything": {"deep": [1]}, "typed": {"t": "x", "gone": 1}},
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"r": 1, "z": 2}, "status": {}}
        }
    });
    assert_eq!(
        s.unknown_fields(&input),
        vec![
            "extra",
            "spec.free.typed.gone",
            "spec.items[0].drop",
            "spec.template.spec.z",
            "spec.template.status",
            "spec.unknown",
        ]
    );
    let mut pruned = input.clone();
    s.prune(&mut pruned);
    assert_eq!(
        pruned,
        json!({
            "apiVersion": "x.io/v1", "kind": "X", "metadata": {"name": "a", "labels": {"l": "v"}},
            "spec": {
                "known": "k",
                "items": [{"n": "1"}],
                "free": {"anything": {"deep": [1]}, "typed": {"t": "x"}},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"r": 1}}
            }
        })
    );
    assert!(s.unknown_fields(&pruned).is_empty());
    // An embedded resource must say what it is.
    let mut no_kind = pruned;
    no_kind["spec"]["template"]
        .as_object_mut()
        .unwrap()
        .remove("kind");
    assert_eq!(
        errors(&s, no_kind, None),
        vec!["spec.template.kind: Required value: must not be empty"]
    );
}

#[test]
fn list_type_set_and_map_duplicates() {
    let s = with_spec(json!({"type": "object", "properties": {
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name", "proto"],
                  "items": {"type": "object", "required": ["name"], "properties": {
                      "name": {"type": "string"}, "proto": {"type": "string", "default": "TCP"}, "n": {"type": "integer"}}}},
        "byKey": {"type": "object", "additionalProperties": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}}}
    }}));
    let spec = json!({
        "tags": ["a", "b", "a"],
        "ports": [{"name": "http", "n": 1}, {"name": "http", "proto": "UDP"}, {"name": "http", "proto": "TCP", "n": 2}],
        "byKey": {"k": [1, 1]}
    });
    assert_eq!(
        errors(&s, obj(spec), None),
        vec![
            "spec.byKey[k][1]: Duplicate value: 1",
            r#"spec.ports[2]: Duplicate value: map[string]interface {}{"name":"http", "proto":"TCP"}"#,
            "spec.tags[2]: Duplicate value: \"a\"",
        ]
    );
}

#[test]
fn ratcheting_keeps_unchanged_invalid_values() {
    let s = field("name", json!({"type": "string", "maxLength": 3}));
    let old = obj(json!({"name": "toolong"}));
    // Unchanged on update: accepted, as kube-apiserver ratchets it.
    assert_eq!(errors(&s, old.clone(), Some(&old)), Vec::<String>::new());
    let changed = obj(json!({"name": "toolong2"}));
    assert_eq!(
        errors(&s, changed, Some(&old)),
        vec!["spec.name: Too long: may not be more than 3 bytes"]
    );
}

#[test]
fn invalid_schemas_are_rejected() {
    let bad_type = CompiledSchema::new(&json!({"type": "strin"}));
    assert!(matches!(bad_type, Err(SchemaError::Invalid { .. })));
    let bad_pattern = CompiledSchema::new(&json!({"type": "string", "pattern": "("}));
    assert!(matches!(bad_pattern, Err(SchemaError::Invalid { .. })));
    let bad_list = CompiledSchema::new(
        &json!({"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object"}}),
    );
    assert!(matches!(bad_list, Err(SchemaError::Invalid { .. })));
    let bad_rule = CompiledSchema::new(
        &json!({"type": "object", "x-kubernetes-validations": [{"message": "no rule"}]}),
    );
    assert!(matches!(bad_rule, Err(SchemaError::Invalid { .. })));
}
