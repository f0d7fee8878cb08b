//! `structural_errors`: the schema checks kube-apiserver makes when a CRD is created.

use kubesim_schema::structural_errors;
use serde_json::json;

fn errors(schema: serde_json::Value) -> Vec<String> {
    structural_errors(&schema, "spec.versions[0].schema.openAPIV3Schema")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_structural_schema_passes() {
    let ok = json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 63}}},
            "spec": {"type": "object", "properties": {
                "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "free": {"x-kubernetes-preserve-unknown-fields": true},
                "list": {"type": "array", "items": {"type": "string"}},
                "either": {"type": "string", "oneOf": [{"pattern": "^a"}, {"pattern": "^b"}]}
            }}
        }
    });
    assert_eq!(errors(ok), Vec::<String>::new());
}

#[test]
fn missing_types_and_items() {
    let bad = json!({
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {
            "untyped": {"description": "no type"},
            "list": {"type": "array"},
            "items": {"type": "array", "items": {"properties": {}}}
        }}}
    });
    assert_eq!(
        errors(bad),
        vec![
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[items].items.type: Required value: must not be empty for specified array items",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[list].items: Required value: must be specified",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[untyped].type: Required value: must not be empty for specified object fields",
        ]
    );
}

#[test]
fn generics_inside_junctors_and_api_rules() {
    let bad = json!({
        "type": "object",
        "properties": {
            "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
            "spec": {"type": "object", "properties": {
                "mode": {"type": "string", "anyOf": [{"type": "string", "nullable": true}]},
                "tags": {"type": "array", "uniqueItems": true, "items": {"type": "string"}},
                "closed": {"type": "object", "additionalProperties": false},
                "both": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}}
            }}
        }
    });
    assert_eq!(
        errors(bad),
        vec![
            "spec.versions[0].schema.openAPIV3Schema.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[both].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[closed].additionalProperties: Forbidden: additionalProperties cannot be set to false",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[mode].anyOf[0].nullable: Forbidden: must be false to be structural",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[mode].anyOf[0].type: Forbidden: must be empty to be structural",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[tags].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ]
    );
}

#[test]
fn root_rules() {
    assert_eq!(
        errors(json!({"type": "string"})),
        vec![
            r#"spec.versions[0].schema.openAPIV3Schema.type: Invalid value: "string": must be object at the root"#
        ]
    );
    assert_eq!(
        errors(json!({"type": "object", "additionalProperties": {"type": "string"}})),
        vec![
            "spec.versions[0].schema.openAPIV3Schema.additionalProperties: Forbidden: must not be used at the root"
        ]
    );
}

#[test]
fn defaults_must_validate_and_be_pruned() {
    let bad = json!({
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {
            "mode": {"type": "string", "enum": ["A", "B"], "default": "C"},
            "ok": {"type": "string", "enum": ["A", "B"], "default": "A"},
            "obj": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}, "default": {"n": 5, "extra": true}}
        }}}
    });
    assert_eq!(
        errors(bad),
        vec![
            r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[mode].default: Unsupported value: "C": supported values: "A", "B""#,
            r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[obj].default.n: Invalid value: 5: n in body should be less than or equal to 3"#,
            r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[obj].default: Invalid value: map[string]interface {}{"extra":true, "n":5}: must not have unknown fields"#,
        ]
    );
}
