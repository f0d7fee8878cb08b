//! Helpers for single-cluster tests of the spoke reconciler on kubesim: polling for a
//! condition, creating typed objects and arbitrary manifests, reading the repository's
//! manifests, one simulated spoke cluster, an inference namespace, and reading a binding's
//! conditions. The fleet
//! fixtures live in `kleym-e2e`.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::objective::llmd;
use kleym_api::external::pool::v1 as pool_v1;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kubesim::{ClusterHandle, Kubesim, KubesimOptions};
use serde_json::{Value, json};

/// Polls `check` every 100 ms until it returns `Some`, for at most ~30 s; then panics naming
/// `what` (a hang guard, not a timing assertion).
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..300 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Creates `obj` (JSON of a `K`) through `api`; panics on any error.
pub async fn create<K>(api: &Api<K>, obj: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let typed: K = serde_json::from_value(obj).expect("valid object");
    api.create(&PostParams::default(), &typed)
        .await
        .expect("create")
}

/// Every YAML document of the repository file `path` (relative to the repository root).
pub fn repo_yaml_docs(path: &str) -> Vec<Value> {
    // This crate is `e2e/support/`: the repository root is two levels up.
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    let text = std::fs::read_to_string(&full)
        .unwrap_or_else(|e| panic!("reading {}: {e}", full.display()));
    kleym_api::yaml::documents(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Creates an arbitrary manifest through the dynamic API (as `kubectl create` would).
pub async fn create_manifest(client: &Client, obj: &Value) {
    let api_version = obj["apiVersion"].as_str().expect("apiVersion");
    let kind = obj["kind"].as_str().expect("kind");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .expect("the kind is served");
    let api: Api<DynamicObject> = match (caps.scope, obj["metadata"]["namespace"].as_str()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => {
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        _ => Api::all_with(client.clone(), &ar),
    };
    let dynamic: DynamicObject = serde_json::from_value(obj.clone()).expect("an object");
    api.create(&PostParams::default(), &dynamic)
        .await
        .expect("create");
}

/// `(status, reason, message)` of the binding's condition `ty`, if it has one.
pub fn condition(b: &InferenceIdentityBinding, ty: &str) -> Option<(String, String, String)> {
    b.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == ty)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until kleym reconciled the binding's current generation and its condition `ty` is
/// `True`; returns the binding as read then.
pub async fn wait_observed(
    api: &Api<InferenceIdentityBinding>,
    name: &str,
    ty: &str,
) -> InferenceIdentityBinding {
    eventually(
        &format!("{name}: current generation with {ty}=True"),
        || async {
            let b = api.get(name).await.ok()?;
            let observed = b.status.as_ref()?.observed_generation;
            let (s, _, _) = condition(&b, ty)?;
            (observed == b.metadata.generation && s == "True").then_some(b)
        },
    )
    .await
}

/// Creates the namespace `ns` with what a binding there targets: the ServiceAccount
/// `model-server`, the InferencePool `qwen-pool` (pods `app=vllm-qwen`) and the llm-d
/// InferenceObjective `chat` on it.
pub async fn inference_namespace(admin: &Client, ns: &str) {
    create(
        &Api::<Namespace>::all(admin.clone()),
        json!({"metadata": {"name": ns}}),
    )
    .await;
    create(
        &Api::<ServiceAccount>::namespaced(admin.clone(), ns),
        json!({"metadata": {"name": "model-server"}}),
    )
    .await;
    create(
        &Api::<pool_v1::InferencePool>::namespaced(admin.clone(), ns),
        json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "qwen-pool"},
            "spec": {
                "selector": {"matchLabels": {"app": "vllm-qwen"}},
                "targetPorts": [{"number": 8000}],
                "endpointPickerRef": {"name": "qwen-epp", "port": {"number": 9002}}
            }
        }),
    )
    .await;
    create(
        &Api::<llmd::InferenceObjective>::namespaced(admin.clone(), ns),
        json!({
            "apiVersion": "llm-d.ai/v1alpha2",
            "kind": "InferenceObjective",
            "metadata": {"name": "chat"},
            "spec": {"priority": 1, "poolRef": {"name": "qwen-pool"}}
        }),
    )
    .await;
}

/// Starts one kubesim cluster, `spoke`, serving `crds`; returns the simulator (keep it
/// alive), the cluster's handle (store, faults, tokens) and an admin client. `RUST_LOG`
/// (e.g. `kleym_spoke=debug`) shows the reconciler's logs in the test's output.
pub async fn start_spoke(crds: Vec<Value>) -> (Kubesim, ClusterHandle, Client) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let sim = Kubesim::start(
        &["spoke"],
        KubesimOptions {
            crds,
            ..KubesimOptions::default()
        },
    )
    .await
    .expect("kubesim starts");
    let cluster = sim.cluster("spoke").expect("the spoke cluster");
    let admin = cluster.kube_client().await.expect("an admin client");
    (sim, cluster, admin)
}
