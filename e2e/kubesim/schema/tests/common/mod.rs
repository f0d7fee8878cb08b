//! Test helpers: load the upstream CRDs from `shared/crds/upstream` and run the
//! defaults → prune → validate pipeline the store runs on every write.

#![allow(dead_code)]

use std::path::PathBuf;

use kubesim_schema::{CompiledSchema, FieldError};
use serde_json::Value;

/// `shared/crds/upstream`, found from the crate dir (`/work/main/e2e/kubesim/schema`)
/// or from `KUBESIM_UPSTREAM_CRDS`.
pub fn upstream_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("KUBESIM_UPSTREAM_CRDS") {
        return PathBuf::from(dir);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for ancestor in manifest.ancestors() {
        let candidate = ancestor.join("shared/crds/upstream");
        if candidate.is_dir() {
            return candidate;
        }
    }
    panic!(
        "shared/crds/upstream not found above {}",
        manifest.display()
    );
}

/// The CRD in `file` as JSON.
pub fn load_crd(file: &str) -> Value {
    let text = std::fs::read_to_string(upstream_dir().join(file)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
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
