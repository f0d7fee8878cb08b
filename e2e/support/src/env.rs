//! A spoke's inference environment and its bindings, written straight into the spoke's
//! store (in-process, no HTTP: setup stays out of the measured traffic), and convergence
//! checks read the same way.
//!
//! ClusterSPIFFEID names follow the spoke compiler's rule, which this crate cannot call (it
//! depends on no kleym controller crate): the functions that need it take it as a
//! [`CsidNaming`], `kleym_spoke::compiler::output::cluster_spiffe_id_name`.

use std::collections::BTreeSet;

use kubesim_store::{Cluster, ListOptions, WriteOptions};
use serde_json::{Value, json};

/// How a binding `(namespace, name)` names its ClusterSPIFFEID:
/// `kleym_spoke::compiler::output::cluster_spiffe_id_name`.
pub type CsidNaming = fn(&str, &str) -> String;

/// Namespace of the generated environment.
pub const NS: &str = "llm";
/// Service account of the model servers.
pub const SA: &str = "model-server";
/// The InferencePool.
pub const POOL: &str = "qwen-pool";

fn create(
    store: &Cluster,
    group: &str,
    version: &str,
    plural: &str,
    ns: Option<&str>,
    obj: Value,
) -> Result<(), String> {
    let res = store
        .resolve(group, version, plural)
        .ok_or_else(|| format!("{}: {group}/{version} {plural} is not served", store.name()))?;
    match store.create(&res, ns, obj, &WriteOptions::default()) {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("{}: create {plural}: {}", store.name(), e.message)),
    }
}

/// Name of objective `i`.
pub fn objective_name(i: usize) -> String {
    format!("obj-{i}")
}

/// Name of binding `i`.
pub fn binding_name(i: usize) -> String {
    format!("b-{i}")
}

/// Namespace, service account, a v1 InferencePool and `objectives` llm-d InferenceObjectives.
pub fn seed_environment(store: &Cluster, objectives: usize) -> Result<(), String> {
    create(
        store,
        "",
        "v1",
        "namespaces",
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )?;
    create(
        store,
        "",
        "v1",
        "serviceaccounts",
        Some(NS),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": NS}}),
    )?;
    create(
        store,
        "inference.networking.k8s.io",
        "v1",
        "inferencepools",
        Some(NS),
        json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": POOL, "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm-qwen"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "qwen-epp", "port": {"number": 9002}}
            }
        }),
    )?;
    for i in 0..objectives {
        create(
            store,
            "llm-d.ai",
            "v1alpha2",
            "inferenceobjectives",
            Some(NS),
            json!({
                "apiVersion": "llm-d.ai/v1alpha2",
                "kind": "InferenceObjective",
                "metadata": {"name": objective_name(i), "namespace": NS},
                "spec": {"priority": 1, "poolRef": {"name": POOL}}
            }),
        )?;
    }
    Ok(())
}

/// Binding `i`: PerObjective on objective `i`, confined to container `c-<i>` (so bindings
/// never collide with each other).
pub fn binding(i: usize) -> Value {
    json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": binding_name(i), "namespace": NS},
        "spec": {
            "targetRef": {"name": objective_name(i)},
            "mode": "PerObjective",
            "containerDiscriminator": {"type": "ContainerName", "value": format!("c-{i}")},
            "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", format!("k8s:sa:{SA}")]
        }
    })
}

/// Creates bindings `range` (their objectives must exist).
pub fn create_bindings(store: &Cluster, range: std::ops::Range<usize>) -> Result<(), String> {
    for i in range {
        create(
            store,
            "kleym.io",
            "v1alpha1",
            "inferenceidentitybindings",
            Some(NS),
            binding(i),
        )?;
    }
    Ok(())
}

/// The ClusterSPIFFEID name binding `i` compiles to under `naming`.
pub fn csid_name_with(naming: CsidNaming, i: usize) -> String {
    naming(NS, &binding_name(i))
}

/// Every object of `group/version` `plural` in `store` (empty when not served).
pub fn list(store: &Cluster, group: &str, version: &str, plural: &str) -> Vec<Value> {
    let Some(res) = store.resolve(group, version, plural) else {
        return Vec::new();
    };
    store
        .list(&res, None, &ListOptions::default())
        .ok()
        .and_then(|l| l.get("items").and_then(Value::as_array).cloned())
        .unwrap_or_default()
}

/// Names of every ClusterSPIFFEID in the spoke.
pub fn csid_names(store: &Cluster) -> BTreeSet<String> {
    list(store, "spire.spiffe.io", "v1alpha1", "clusterspiffeids")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Every ClusterSPIFFEID object in the spoke.
pub fn csids(store: &Cluster) -> Vec<Value> {
    list(store, "spire.spiffe.io", "v1alpha1", "clusterspiffeids")
}

/// Every InferenceIdentityBinding object in the spoke.
pub fn bindings(store: &Cluster) -> Vec<Value> {
    list(store, "kleym.io", "v1alpha1", "inferenceidentitybindings")
}

/// Whether bindings `0..n` all have their ClusterSPIFFEID (named by `naming`).
pub fn converged_with(store: &Cluster, n: usize, naming: CsidNaming) -> bool {
    let names = csid_names(store);
    (0..n).all(|i| names.contains(&csid_name_with(naming, i)))
}
