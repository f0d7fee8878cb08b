//! Benchmarks (not timed tests): run with
//! `cargo test -p kubesim --release --test server kubesim_bench:: -- --ignored --nocapture`.
//! The spoke write-path benchmarks (kleym CRDs) are in `e2e/tests/spoke_write_bench.rs`.
//! They print figures; they assert only correctness (counts), never durations.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use kubesim::{Kubesim, KubesimOptions};
use std::time::{Duration, Instant};

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly"]
async fn bench_startup_of_100_clusters() {
    let names: Vec<String> = (0..100).map(|i| format!("spoke-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let before = rss_kib();
    let t = Instant::now();
    let sim = Kubesim::start(&refs, KubesimOptions::default())
        .await
        .unwrap();
    let startup = t.elapsed();
    assert_eq!(sim.clusters().len(), 100);
    // Every cluster answers.
    let t = Instant::now();
    for c in sim.clusters() {
        let client = c.kube_client().await.unwrap();
        Api::<ConfigMap>::namespaced(client, "default")
            .list(&ListParams::default())
            .await
            .unwrap();
    }
    println!(
        "startup of 100 clusters: {:?}; first list on each: {:?}; RSS {:?} -> {:?} KiB",
        startup,
        t.elapsed(),
        before,
        rss_kib()
    );
}

fn cm(i: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("cm-{i:05}")),
            labels: Some([("bench".to_string(), "yes".to_string())].into()),
            ..Default::default()
        },
        data: Some([("k".to_string(), "v".repeat(64))].into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly"]
async fn bench_create_list_watch_fanout() {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .unwrap();
    let c = sim.cluster("hub").unwrap();
    let api: Api<ConfigMap> = Api::namespaced(c.kube_client().await.unwrap(), "default");
    const N: usize = 10_000;

    // Create over HTTPS with 8 concurrent clients (no watchers open).
    let rss0 = rss_kib();
    let t = Instant::now();
    let mut writers = Vec::new();
    for w in 0..8 {
        let api = api.clone();
        writers.push(tokio::spawn(async move {
            for i in (w..N).step_by(8) {
                api.create(&PostParams::default(), &cm(i)).await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let create = t.elapsed();
    let rss1 = rss_kib();

    // In-process store create rate, for comparison (no HTTP, no TLS, no client).
    let store = c.store();
    let res = store.resolve("", "v1", "configmaps").unwrap();
    let t = Instant::now();
    for i in 0..N {
        let obj = serde_json::to_value(cm(N + i)).unwrap();
        let opts = kubesim_store::WriteOptions {
            field_manager: "bench".into(),
            ..Default::default()
        };
        store.create(&res, Some("default"), obj, &opts).unwrap();
    }
    let store_create = t.elapsed();

    // List over HTTPS.
    let t = Instant::now();
    let mut listed = 0;
    for _ in 0..3 {
        listed += api
            .list(&ListParams::default().labels("bench=yes"))
            .await
            .unwrap()
            .items
            .len();
    }
    let list = t.elapsed();
    assert_eq!(listed, 3 * 2 * N);

    // Watch fan-out: WATCHERS watchers, M in-process writes; count delivered events.
    const WATCHERS: usize = 10;
    const M: usize = 2_000;
    let rv = store.current_resource_version().to_string();
    let mut counters = Vec::new();
    for _ in 0..WATCHERS {
        let wapi: Api<ConfigMap> = Api::namespaced(c.kube_client().await.unwrap(), "default");
        let rv = rv.clone();
        counters.push(tokio::spawn(async move {
            let stream = wapi
                .watch(&WatchParams::default().timeout(290), &rv)
                .await
                .unwrap();
            futures::pin_mut!(stream);
            let mut n = 0usize;
            while let Some(Ok(ev)) = stream.next().await {
                if matches!(ev, WatchEvent::Modified(_)) {
                    n += 1;
                    if n == M {
                        break;
                    }
                }
            }
            n
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    for i in 0..M {
        let patch = serde_json::json!({"data": {"k": format!("changed-{i}")}});
        store
            .patch(
                &res,
                Some("default"),
                &format!("cm-{i:05}"),
                kubesim_store::PatchType::Merge,
                &patch,
                kubesim_store::Subresource::Main,
                &kubesim_store::WriteOptions {
                    field_manager: "bench".into(),
                    ..Default::default()
                },
            )
            .unwrap();
    }
    let mut events = 0;
    for h in counters {
        events += h.await.unwrap();
    }
    let fanout = t.elapsed();
    assert_eq!(events, M * WATCHERS);
    println!(
        "create over HTTPS (8 clients): {:.0}/s; store create in-process: {:.0}/s; \
         list over HTTPS: {:.0} objects/s; watch fan-out over HTTPS: {:.0} events/s \
         ({WATCHERS} watchers x {M} updates); RSS growth per 10k objects (HTTP phase): {:?} KiB",
        N as f64 / create.as_secs_f64(),
        N as f64 / store_create.as_secs_f64(),
        listed as f64 / list.as_secs_f64(),
        events as f64 / fanout.as_secs_f64(),
        rss1.zip(rss0).map(|(a, b)| a.saturating_sub(b)),
    );
}
