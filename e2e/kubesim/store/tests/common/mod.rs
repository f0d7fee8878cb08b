//! Shared test helpers.
#![allow(dead_code)]

use futures::StreamExt;
use kubesim_store::{Cluster, ResourceInfo, WatchEvent, WatchStream, WriteOptions};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

pub fn cluster() -> Arc<Cluster> {
    Cluster::new("test")
}

pub fn res(c: &Cluster, group: &str, version: &str, plural: &str) -> ResourceInfo {
    c.resolve(group, version, plural)
        .unwrap_or_else(|| panic!("{group}/{version}/{plural} not served"))
}

pub fn opts(manager: &str) -> WriteOptions {
    WriteOptions {
        field_manager: manager.to_string(),
        ..WriteOptions::default()
    }
}

pub fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Load every document of a YAML file as JSON.
pub fn yaml_docs(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple_with_options(&text, yaml_options()).unwrap()
}

/// The vendored upstream CRDs' directory (`e2e/crds/upstream`).
pub fn upstream_crds_dir() -> std::path::PathBuf {
    upstream_crds::upstream_dir()
}

pub fn install_crd(c: &Cluster, file: &str) -> Value {
    let crd_res = res(c, "apiextensions.k8s.io", "v1", "customresourcedefinitions");
    let doc = yaml_docs(&upstream_crds_dir().join(file).to_string_lossy()).remove(0);
    c.create(&crd_res, None, doc, &opts("test"))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .object
}

/// The next event, or `None` if the stream ended; panics if nothing arrives in 5 s (a
/// hang guard, not a timing assertion).
pub async fn next(s: &mut WatchStream) -> Option<WatchEvent> {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("watch stream stalled")
}

/// Whether the stream has nothing ready right now (after letting queued work run).
pub async fn idle(s: &mut WatchStream) -> bool {
    tokio::time::timeout(Duration::from_millis(50), s.next())
        .await
        .is_err()
}

pub fn name_of(ev: &WatchEvent) -> String {
    ev.object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
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
