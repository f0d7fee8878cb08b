//! Spoke reconciler benchmark against kubesim: N bindings (default 1000) across K
//! namespaces (default 10) converge from a cold start; then a restarted operator resyncs
//! them. Prints the convergence time and the API writes per binding. One large namespace
//! (`-- 1000 1`) stresses the per-namespace collision analysis.
//!
//! `cargo run --release -p kleym-e2e --example spoke_bench [-- BINDINGS [NAMESPACES]]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kleym_api::InferenceIdentityBinding;
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use kubesim::{Kubesim, KubesimOptions};
use serde_json::{Value, json};

const DEFAULT_NAMESPACES: usize = 10;

fn crds() -> Vec<Value> {
    let mut out = kleym_e2e::fixtures::upstream_crds().expect("upstream CRDs");
    for crd in kleym_api::crds::all() {
        out.push(serde_json::to_value(crd).expect("CRD serialises"));
    }
    out
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn create_all(client: &Client, ar: &ApiResource, objs: Vec<Value>) {
    stream::iter(objs)
        .for_each_concurrent(16, |obj| {
            let client = client.clone();
            let ar = ar.clone();
            async move {
                let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
                let api: Api<DynamicObject> = match ns {
                    Some(ns) => Api::namespaced_with(client, &ns, &ar),
                    None => Api::all_with(client, &ar),
                };
                let o: DynamicObject = serde_json::from_value(obj).expect("object");
                api.create(&PostParams::default(), &o)
                    .await
                    .expect("create");
            }
        })
        .await;
}

fn start(client: Client, metrics: Arc<SpokeMetrics>) -> (CancellationToken, Spoke) {
    let mut config = SpokeConfig::new("bench.example.org");
    config.publish_events = false;
    config.concurrency = 8;
    let spoke = Spoke::new(client, config, metrics).expect("config");
    (CancellationToken::new(), spoke)
}

async fn ready_count(api: &Api<InferenceIdentityBinding>) -> usize {
    api.list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .filter(|b| {
            b.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
        .count()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let arg = |i: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse::<usize>().ok())
    };
    let n = arg(1).unwrap_or(1000);
    let namespace_count = arg(2).unwrap_or(DEFAULT_NAMESPACES).max(1);
    let per_ns = n.div_ceil(namespace_count);
    let sim = Kubesim::start(
        &["bench"],
        KubesimOptions {
            crds: crds(),
            ..KubesimOptions::default()
        },
    )
    .await
    .expect("kubesim");
    let cluster = sim.cluster("bench").expect("cluster");
    let client = cluster.kube_client().await.expect("client");

    let t = Instant::now();
    let mut namespaces = Vec::new();
    let mut pools = Vec::new();
    let mut objectives = Vec::new();
    let mut bindings = Vec::new();
    for ns_i in 0..namespace_count {
        let ns = format!("tenant-{ns_i}");
        namespaces.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
        pools.push(json!({
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "pool", "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": "model"}}, "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}
        }));
        for i in 0..per_ns {
            if ns_i * per_ns + i >= n {
                break;
            }
            objectives.push(json!({
                "apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
                "metadata": {"name": format!("obj-{i}"), "namespace": ns},
                "spec": {"poolRef": {"name": "pool"}}
            }));
            bindings.push(json!({
                "apiVersion": "kleym.io/v1alpha1", "kind": "InferenceIdentityBinding",
                "metadata": {"name": format!("b-{i}"), "namespace": ns},
                "spec": {
                    "targetRef": {"name": format!("obj-{i}")},
                    "containerDiscriminator": {"type": "ContainerName", "value": format!("c-{i}")},
                    "workloadSelectorTemplates": ["k8s:ns:{{ .Namespace }}", "k8s:sa:model"]
                }
            }));
        }
    }
    create_all(
        &client,
        &resource("", "v1", "Namespace", "namespaces"),
        namespaces,
    )
    .await;
    create_all(
        &client,
        &resource(
            "inference.networking.k8s.io",
            "v1",
            "InferencePool",
            "inferencepools",
        ),
        pools,
    )
    .await;
    create_all(
        &client,
        &resource(
            "llm-d.ai",
            "v1alpha2",
            "InferenceObjective",
            "inferenceobjectives",
        ),
        objectives,
    )
    .await;
    create_all(
        &client,
        &resource(
            "kleym.io",
            "v1alpha1",
            "InferenceIdentityBinding",
            "inferenceidentitybindings",
        ),
        bindings,
    )
    .await;
    println!(
        "setup: {n} bindings in {namespace_count} namespaces created in {:?}",
        t.elapsed()
    );

    let api: Api<InferenceIdentityBinding> = Api::all(client.clone());

    // Cold start: every binding converges.
    let metrics = Arc::new(SpokeMetrics::default());
    let (token, spoke) = start(client.clone(), metrics.clone());
    let ctx = spoke.context();
    let t = Instant::now();
    let run = tokio::spawn(spoke.run(token.clone()));
    while !ctx.readiness.is_ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let synced = t.elapsed();
    loop {
        if ctx.queue.is_idle()
            && ctx.readiness.is_ready()
            && metrics.bindings_with("Ready") as usize == n
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let converge = t.elapsed();
    let writes = metrics.total_writes();
    let ready = ready_count(&api).await;
    println!(
        "cold start: caches synced after {synced:?}; {ready}/{n} Ready in {converge:?}; {writes} writes = {:.2} per binding; {} reconciles",
        writes as f64 / n as f64,
        metrics.reconciles_total()
    );
    println!(
        "  mean reconcile (incl. its API writes): {:?}",
        metrics.reconcile_time_total()
            / u32::try_from(metrics.reconciles_total().max(1)).unwrap_or(u32::MAX)
    );
    token.cancel();
    let _ = run.await;

    // Restart: resync of everything, zero writes.
    let rv_before: Vec<String> = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|b| b.resource_version().unwrap_or_default())
        .collect();
    let t = Instant::now();
    let csid_api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "spire.spiffe.io",
            "v1alpha1",
            "ClusterSPIFFEID",
            "clusterspiffeids",
        ),
    );
    let listed = csid_api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .len();
    println!("list of {listed} ClusterSPIFFEIDs took {:?}", t.elapsed());
    let metrics = Arc::new(SpokeMetrics::default());
    let (token, spoke) = start(client.clone(), metrics.clone());
    let ctx = spoke.context();
    let t = Instant::now();
    let run = tokio::spawn(spoke.run(token.clone()));
    while !ctx.readiness.is_ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let synced = t.elapsed();
    loop {
        if ctx.queue.is_idle()
            && ctx.readiness.is_ready()
            && metrics.reconciles_total() as usize >= n
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resync = t.elapsed();
    let rv_after: Vec<String> = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|b| b.resource_version().unwrap_or_default())
        .collect();
    println!(
        "restart resync: caches synced after {synced:?}; {} reconciles done after {resync:?}; {} writes; binding resourceVersions unchanged: {}",
        metrics.reconciles_total(),
        metrics.total_writes(),
        rv_before == rv_after
    );
    println!(
        "  mean reconcile: {:?}",
        metrics.reconcile_time_total()
            / u32::try_from(metrics.reconciles_total().max(1)).unwrap_or(u32::MAX)
    );
    token.cancel();
    let _ = run.await;
}
