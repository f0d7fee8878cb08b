//! Helpers shared by the integration tests.
#![allow(dead_code)]

use kubesim_apply::{ApplyError, ApplyRequest, TypeInfo, server_side_apply};
use serde_json::Value;

pub const T0: &str = "2026-01-01T00:00:00Z";
pub const T1: &str = "2026-01-01T00:01:00Z";
pub const T2: &str = "2026-01-01T00:02:00Z";

/// `openAPIV3Schema` of the first version of a CRD stored under `tests/data`.
pub fn crd_schema(file: &str) -> Value {
    let crd: Value =
        serde_saphyr::from_str_with_options(upstream_crds::upstream_yaml(file), yaml_options())
            .unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

pub fn yaml(s: &str) -> Value {
    serde_saphyr::from_str_with_options(s, yaml_options()).unwrap()
}

pub fn req<'a>(manager: &'a str, now: &'a str) -> ApplyRequest<'a> {
    ApplyRequest {
        manager,
        force: false,
        subresource: None,
        now,
    }
}

pub fn apply(
    live: Option<&Value>,
    cfg: &Value,
    ti: &TypeInfo,
    manager: &str,
    now: &str,
) -> Result<Value, ApplyError> {
    server_side_apply(live, cfg, ti, &req(manager, now))
}

/// The managedFields entry of `manager` with `operation` (and no subresource).
pub fn entry<'v>(obj: &'v Value, manager: &str, operation: &str) -> Option<&'v Value> {
    entry_sub(obj, manager, operation, None)
}

pub fn entry_sub<'v>(
    obj: &'v Value,
    manager: &str,
    operation: &str,
    sub: Option<&str>,
) -> Option<&'v Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| {
            e["manager"] == manager
                && e["operation"] == operation
                && e.get("subresource").and_then(Value::as_str) == sub
        })
}

pub fn fields<'v>(obj: &'v Value, manager: &str, operation: &str) -> &'v Value {
    &entry(obj, manager, operation).unwrap_or_else(|| panic!("no {operation} entry for {manager}"))
        ["fieldsV1"]
}

pub fn content(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    o
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
