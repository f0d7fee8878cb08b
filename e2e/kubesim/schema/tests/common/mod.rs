//! Test helpers: load the vendored upstream CRDs (`upstream-crds`) and run the
//! defaults → prune → validate pipeline the store runs on every write.

#![allow(dead_code)]

use std::path::PathBuf;

use kubesim_schema::{CompiledSchema, FieldError};
use serde_json::Value;

/// The vendored upstream CRDs' directory (`e2e/crds/upstream`).
pub fn upstream_dir() -> PathBuf {
    upstream_crds::upstream_dir()
}

/// The CRD in `file` as JSON.
pub fn load_crd(file: &str) -> Value {
    serde_saphyr::from_str_with_options(upstream_crds::upstream_yaml(file), yaml_options()).unwrap()
}

/// `(version name, compiled schema)` for every served version.
pub fn served_schemas(crd: &Value) -> Vec<(String, CompiledSchema)> {
    crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["served"].as_bool().unwrap_or(false))
        .map(|v| {
            let schema = &v["schema"]["openAPIV3Schema"];
            (
                v["name"].as_str().unwrap().to_string(),
                CompiledSchema::new(schema).unwrap(),
            )
        })
        .collect()
}

/// The schema of `version` in the CRD file.
pub fn schema(file: &str, version: &str) -> CompiledSchema {
    served_schemas(&load_crd(file))
        .into_iter()
        .find(|(v, _)| v == version)
        .map(|(_, s)| s)
        .unwrap()
}

/// defaults → prune → validate, returning the stored object and the errors as strings.
pub fn admit(schema: &CompiledSchema, mut obj: Value, old: Option<&Value>) -> (Value, Vec<String>) {
    schema.apply_defaults(&mut obj);
    schema.prune(&mut obj);
    let errs: Vec<FieldError> = schema.validate(&obj, old);
    (obj, errs.iter().map(ToString::to_string).collect())
}

/// Just the error strings.
pub fn errors(schema: &CompiledSchema, obj: Value, old: Option<&Value>) -> Vec<String> {
    admit(schema, obj, old).1
}

/// YAML 1.2 reading (`y`, `on`, `0755` stay strings), as `kleym_api::yaml` reads; kubesim
/// does not depend on kleym. serde-saphyr's defaults would read `[x, y]` as `["x", true]`.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
    }
}
