//! The store validates every write: compile once, then run defaults → prune → validate on
//! 100k InferencePool objects (with CEL rules) and check every verdict.

mod common;

use std::time::Instant;

use common::schema;
use serde_json::json;

#[test]
fn validates_100k_objects_with_one_compiled_schema() {
    let s = schema("inference.networking.k8s.io_inferencepools.yaml", "v1");
    let start = Instant::now();
    let mut rejected = 0;
    for i in 0..100_000u32 {
        // Every 10th object repeats a port: the CEL uniqueness rule must reject exactly those.
        let second = if i % 10 == 0 { 8000 } else { 8001 + (i % 1000) };
        let mut obj = json!({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": format!("pool-{i}"), "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": format!("vllm-{}", i % 97)}},
                "targetPorts": [{"number": 8000}, {"number": second}],
                "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
                "unknownField": true
            }
        });
        s.apply_defaults(&mut obj);
        s.prune(&mut obj);
        let errs = s.validate(&obj, None);
        if i % 10 == 0 {
            assert_eq!(errs.len(), 1, "object {i}: {errs:?}");
            assert_eq!(
                errs[0].to_string(),
                r#"spec.targetPorts: Invalid value: "array": port number must be unique"#
            );
            rejected += 1;
        } else {
            assert!(errs.is_empty(), "object {i}: {errs:?}");
        }
        assert!(obj["spec"].get("unknownField").is_none());
    }
    assert_eq!(rejected, 10_000);
    // A figure for the report, not a limit.
    eprintln!("100k InferencePool admissions in {:?}", start.elapsed());
}
