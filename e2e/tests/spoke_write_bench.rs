//! Benchmarks (not timed tests) of the spoke reconciler's write path against kubesim, with
//! kleym's CRDs and fleet fixtures: run with
//! `cargo test -p kleym-e2e --release --test e2e spoke_write_bench:: -- --ignored --nocapture`.
//! They print figures; they assert only correctness (counts), never durations. kubesim's own
//! benchmarks are in `e2e/kubesim/server/tests/kubesim_bench.rs`.

use futures::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use kubesim::{Kubesim, KubesimOptions};
use std::time::{Duration, Instant};

/// The ClusterSPIFFEID the spoke reconciler applies for `kleym_e2e::fixtures::env` binding `i`
/// (the shape captured from a real reconcile).
fn bench_csid(i: usize, binding_uid: &str) -> serde_json::Value {
    use kleym_e2e::fixtures::env;
    serde_json::json!({
        "apiVersion": "spire.spiffe.io/v1alpha1",
        "kind": "ClusterSPIFFEID",
        "metadata": {
            "name": env::csid_name(i),
            "labels": {
                "kleym.io/binding-name": env::binding_name(i),
                "kleym.io/binding-namespace": env::NS,
                "kleym.io/managed-by": "kleym"
            },
            "annotations": {
                "kleym.io/owner": format!("{}/{}/{binding_uid}", env::NS, env::binding_name(i))
            }
        },
        "spec": {
            "fallback": false,
            "hint": env::objective_name(i),
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env::NS}},
            "podSelector": {"matchLabels": {"app": "vllm-qwen"}},
            "spiffeIDTemplate": format!("spiffe://bench.example/ns/llm/objective/{}", env::objective_name(i)),
            "workloadSelectorTemplates": [
                format!("k8s:container-name:c-{i}"),
                "k8s:ns:llm",
                "k8s:pod-label:app:vllm-qwen",
                "k8s:sa:model-server"
            ]
        }
    })
}

/// The status the spoke reconciler applies to binding `i` once its ClusterSPIFFEID exists.
fn bench_status(i: usize, csid_uid: &str) -> serde_json::Value {
    use kleym_e2e::fixtures::env;
    let cond = |t: &str, status: &str, reason: &str, message: String| {
        serde_json::json!({
            "type": t, "status": status, "reason": reason, "message": message,
            "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"
        })
    };
    let id = format!(
        "spiffe://bench.example/ns/llm/objective/{}",
        env::objective_name(i)
    );
    serde_json::json!({
        "apiVersion": "kleym.io/v1alpha1",
        "kind": "InferenceIdentityBinding",
        "metadata": {"name": env::binding_name(i), "namespace": env::NS},
        "status": {
            "clusterSPIFFEID": {"name": env::csid_name(i), "uid": csid_uid},
            "computedSpiffeIDs": [{"mode": "PerObjective", "spiffeID": id}],
            "conditions": [
                cond("Ready", "True", "Reconciled", format!("ClusterSPIFFEID {} registers {id}", env::csid_name(i))),
                cond("Conflict", "False", "NoConflict", String::new()),
                cond("InvalidRef", "False", "Resolved", String::new()),
                cond("UnsafeSelector", "False", "Confined", String::new()),
                cond("RenderFailure", "False", "Rendered", String::new()),
            ],
            "observedGeneration": 1,
            "renderedSelectors": [
                format!("k8s:container-name:c-{i}"),
                "k8s:ns:llm",
                "k8s:pod-label:app:vllm-qwen",
                "k8s:sa:model-server"
            ]
        }
    })
}

/// The writes a spoke reconciler makes per binding (finalizer merge patch, ClusterSPIFFEID
/// apply, status apply), then a resync (both applies again, no-ops), over HTTPS with 4
/// concurrent clients while the hub-like watches of bindings and ClusterSPIFFEIDs are open.
/// `KUBESIM_BENCH_BINDINGS` sets the binding count (default 2000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly"]
async fn bench_spoke_write_path() {
    use kleym_e2e::fixtures::{all_crds, env};
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    let n: usize = std::env::var("KUBESIM_BENCH_BINDINGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let sim = Kubesim::start(
        &["spoke"],
        KubesimOptions {
            crds: all_crds().unwrap(),
            ..KubesimOptions::default()
        },
    )
    .await
    .unwrap();
    let c = sim.cluster("spoke").unwrap();
    let store = c.store();
    env::seed_environment(&store, n).unwrap();
    env::create_bindings(&store, 0..n).unwrap();
    let client = c.kube_client().await.unwrap();
    let binding_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kleym.io", "v1alpha1", "InferenceIdentityBinding"),
        "inferenceidentitybindings",
    );
    let csid_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("spire.spiffe.io", "v1alpha1", "ClusterSPIFFEID"),
        "clusterspiffeids",
    );
    let bindings: Api<DynamicObject> = Api::namespaced_with(client.clone(), env::NS, &binding_ar);
    let csids: Api<DynamicObject> = Api::all_with(client.clone(), &csid_ar);

    // Watches like the hub's (events are counted, so fan-out and serialisation happen).
    let mut watchers = Vec::new();
    for api in [bindings.clone(), Api::all_with(client.clone(), &csid_ar)] {
        let rv = store.current_resource_version().to_string();
        watchers.push(tokio::spawn(async move {
            let stream = api
                .watch(&WatchParams::default().timeout(290), &rv)
                .await
                .unwrap();
            futures::pin_mut!(stream);
            let mut n = 0usize;
            while let Some(Ok(ev)) = stream.next().await {
                if !matches!(ev, WatchEvent::Bookmark(_)) {
                    n += 1;
                }
            }
            n
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let uids: Vec<String> = env::bindings(&store)
        .iter()
        .map(|b| b["metadata"]["uid"].as_str().unwrap().to_string())
        .collect();
    let names: Vec<String> = env::bindings(&store)
        .iter()
        .map(|b| b["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let uid_of: std::collections::HashMap<String, String> = names.into_iter().zip(uids).collect();
    let uid_of = std::sync::Arc::new(uid_of);
    let pp = PatchParams::apply("kleym");
    let pp_force = PatchParams::apply("kleym").force();

    let run = |resync: bool| {
        let mut tasks = Vec::new();
        for w in 0..4 {
            let (bindings, csids, uid_of) = (bindings.clone(), csids.clone(), uid_of.clone());
            let (pp, pp_force) = (pp.clone(), pp_force.clone());
            tasks.push(tokio::spawn(async move {
                for i in (w..n).step_by(4) {
                    let name = env::binding_name(i);
                    if !resync {
                        let fin =
                            serde_json::json!({"metadata": {"finalizers": ["kleym.io/cleanup"]}});
                        bindings
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&fin))
                            .await
                            .unwrap();
                    }
                    let csid = csids
                        .patch(
                            &env::csid_name(i),
                            &pp,
                            &Patch::Apply(bench_csid(i, &uid_of[&name])),
                        )
                        .await
                        .unwrap();
                    let csid_uid = csid.metadata.uid.unwrap_or_default();
                    bindings
                        .patch_status(&name, &pp_force, &Patch::Apply(bench_status(i, &csid_uid)))
                        .await
                        .unwrap();
                }
            }));
        }
        tasks
    };
    let cpu0 = procstat_cpu();
    let t = Instant::now();
    for h in run(false) {
        h.await.unwrap();
    }
    let first = (t.elapsed(), procstat_cpu() - cpu0);
    let rv_after_first = store.current_resource_version();
    let cpu0 = procstat_cpu();
    let t = Instant::now();
    for h in run(true) {
        h.await.unwrap();
    }
    let resync = (t.elapsed(), procstat_cpu() - cpu0);
    assert_eq!(
        store.current_resource_version(),
        rv_after_first,
        "a resync of unchanged applies must write nothing"
    );
    assert_eq!(env::csids(&store).len(), n);
    assert!(
        env::bindings(&store)
            .iter()
            .all(|b| b["status"]["conditions"][0]["status"] == "True")
    );
    sim.shutdown();
    let mut events = 0;
    for w in watchers {
        events += w.await.unwrap_or(0);
    }
    println!(
        "spoke write path over HTTPS, {n} bindings, 4 clients, 2 watches ({events} events): \
         first pass (finalizer patch + CSID apply + status apply) {:?} wall, {:.0} µs CPU per binding; \
         resync (2 no-op applies) {:?} wall, {:.0} µs CPU per binding (process CPU: kubesim + client)",
        first.0,
        first.1 * 1e6 / n as f64,
        resync.0,
        resync.1 * 1e6 / n as f64,
    );
}

/// The same writes as [`bench_spoke_write_path`] straight on the store (no HTTP, TLS or
/// client), sequentially on one thread: the cost of kubesim's store and apply alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly"]
async fn bench_spoke_write_path_in_process() {
    use kleym_e2e::fixtures::{all_crds, env};
    use kubesim_store::{PatchType, Subresource, WriteOptions};
    let n: usize = std::env::var("KUBESIM_BENCH_BINDINGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let sim = Kubesim::start(
        &["spoke"],
        KubesimOptions {
            crds: all_crds().unwrap(),
            ..KubesimOptions::default()
        },
    )
    .await
    .unwrap();
    let store = sim.cluster("spoke").unwrap().store();
    env::seed_environment(&store, n).unwrap();
    env::create_bindings(&store, 0..n).unwrap();
    let bindings = store
        .resolve("kleym.io", "v1alpha1", "inferenceidentitybindings")
        .unwrap();
    let csids = store
        .resolve("spire.spiffe.io", "v1alpha1", "clusterspiffeids")
        .unwrap();
    let uid_of: std::collections::HashMap<String, String> = env::bindings(&store)
        .iter()
        .map(|b| {
            (
                b["metadata"]["name"].as_str().unwrap().to_string(),
                b["metadata"]["uid"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let update = WriteOptions {
        field_manager: "kleym".into(),
        ..Default::default()
    };
    let apply = WriteOptions {
        field_manager: "kleym".into(),
        ..Default::default()
    };
    let force = WriteOptions {
        force: true,
        ..apply.clone()
    };
    let ns = Some(env::NS);
    let phase = |resync: bool| {
        let cpu0 = thread_cpu();
        let t = Instant::now();
        for i in 0..n {
            let name = env::binding_name(i);
            if !resync {
                let fin = serde_json::json!({"metadata": {"finalizers": ["kleym.io/cleanup"]}});
                store
                    .patch(
                        &bindings,
                        ns,
                        &name,
                        PatchType::Merge,
                        &fin,
                        Subresource::Main,
                        &update,
                    )
                    .unwrap();
            }
            let csid = store
                .patch(
                    &csids,
                    None,
                    &env::csid_name(i),
                    PatchType::Apply,
                    &bench_csid(i, &uid_of[&name]),
                    Subresource::Main,
                    &apply,
                )
                .unwrap();
            let csid_uid = csid.object["metadata"]["uid"].as_str().unwrap().to_string();
            store
                .patch(
                    &bindings,
                    ns,
                    &name,
                    PatchType::Apply,
                    &bench_status(i, &csid_uid),
                    Subresource::Status,
                    &force,
                )
                .unwrap();
        }
        (t.elapsed(), thread_cpu() - cpu0)
    };
    let first = phase(false);
    let rv = store.current_resource_version();
    let resync = phase(true);
    assert_eq!(
        store.current_resource_version(),
        rv,
        "a resync writes nothing"
    );
    assert_eq!(env::csids(&store).len(), n);
    println!(
        "spoke write path in-process, {n} bindings: first pass (finalizer patch + CSID apply + \
         status apply) {:.0} µs per binding ({:.0} µs CPU); resync (2 no-op applies) {:.0} µs \
         per binding ({:.0} µs CPU)",
        first.0.as_secs_f64() * 1e6 / n as f64,
        first.1 * 1e6 / n as f64,
        resync.0.as_secs_f64() * 1e6 / n as f64,
        resync.1 * 1e6 / n as f64,
    );
}

/// CPU seconds (user + system) the calling thread has used.
fn thread_cpu() -> f64 {
    cpu_of("/proc/thread-self/stat")
}

/// CPU seconds (user + system) this process has used.
fn procstat_cpu() -> f64 {
    cpu_of("/proc/self/stat")
}

fn cpu_of(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // fields 14 and 15 (utime, stime) are at 11 and 12 after the command
    (ticks(11) + ticks(12)) / 100.0
}
