//! Timing of `kleym explain pod` in a busy namespace (reported, not asserted): 1000
//! bindings compiled by the real spoke reconciler into 1000 ClusterSPIFFEIDs, and 5000
//! pods, on kubesim; then the real `kleym` binary explains one pod, under
//! `/usr/bin/time -v` when it exists (wall time and peak memory), else timed here.
//!
//! Run (`KLEYM_BIN` names the binary to time, default the `kleym` beside the test's build):
//! `cargo build --release -p kleym-hub --bin kleym && KLEYM_BIN=$PWD/target/release/kleym cargo test -p kleym-e2e --test e2e explain_bench:: -- --ignored --nocapture`
//! Set `KLEYM_BENCH_BINDINGS` / `KLEYM_BENCH_PODS` to change the sizes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kleym_e2e::fixtures::env::{self, NS, SA};
use kleym_e2e::fixtures::plugins::kleym_binary;
use kleym_e2e::single::start_spoke;
use kleym_spoke::compiler::output::cluster_spiffe_id_name;
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kubesim_store::WriteOptions;
use serde_json::{Value, json};

const TD: &str = "bench.example";

fn size(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn create(store: &kubesim_store::Cluster, plural: &str, ns: Option<&str>, obj: Value) {
    let res = store.resolve("", "v1", plural).expect("served");
    store
        .create(&res, ns, obj, &WriteOptions::default())
        .expect("created");
}

/// The figure `label:` reports in `/usr/bin/time -v` output.
fn time_field<'a>(report: &'a str, label: &str) -> Option<&'a str> {
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .map(str::trim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture, in release"]
async fn explain_pod_in_a_namespace_with_1000_bindings_and_5000_pods() {
    let bindings = size("KLEYM_BENCH_BINDINGS", 1000);
    let pods = size("KLEYM_BENCH_PODS", 5000);
    let (_sim, cluster, admin) = start_spoke(kleym_e2e::fixtures::all_crds().expect("CRDs")).await;
    let store = cluster.store();
    env::seed_environment(&store, bindings).unwrap();
    env::create_bindings(&store, 0..bindings).unwrap();
    create(
        &store,
        "nodes",
        None,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
    );
    // Every pod is one of the pool's, with the first binding's container and one other.
    for i in 0..pods {
        create(
            &store,
            "pods",
            Some(NS),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("vllm-{i}"), "namespace": NS,
                             "labels": {"app": "vllm-qwen"}},
                "spec": {"serviceAccountName": SA, "nodeName": "node-a",
                         "containers": [{"name": "c-0", "image": "vllm:1"},
                                        {"name": "sidecar", "image": "envoy:1"}]}}),
        );
    }

    let spoke = Spoke::new(
        admin.clone(),
        SpokeConfig::new(TD),
        Arc::new(SpokeMetrics::default()),
    )
    .unwrap();
    let token = CancellationToken::new();
    let task = tokio::spawn(spoke.run(token.clone()));
    let start = Instant::now();
    while !env::converged_with(&store, bindings, cluster_spiffe_id_name) {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "the reconciler did not write {bindings} ClusterSPIFFEIDs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    token.cancel();
    let _ = task.await;

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig_yaml()).unwrap();
    let kleym = match std::env::var_os("KLEYM_BIN") {
        Some(bin) => std::path::PathBuf::from(bin)
            .canonicalize()
            .expect("KLEYM_BIN exists"),
        None => kleym_binary().expect("kleym binary"),
    };
    let time = std::path::Path::new("/usr/bin/time");
    let mut cmd = if time.exists() {
        let mut c = tokio::process::Command::new(time);
        c.arg("-v").arg(&kleym);
        c
    } else {
        tokio::process::Command::new(&kleym)
    };
    cmd.args(["explain", "pod", &format!("{NS}/vllm-0"), "-o", "json"])
        .args(["--trust-domain", TD, "--cluster-name", "bench"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .kill_on_drop(true);
    let started = Instant::now();
    let out = cmd.output().await.unwrap();
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Correctness only: every binding declares an entry for the pod, and of them only
    // binding b-0's holds for its c-0 container.
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["entries"].as_array().map(Vec::len), Some(bindings));
    let c0 = doc["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["container"] == "c-0"))
        .expect("container c-0 explained");
    assert_eq!(
        c0["svids"],
        json!([format!("spiffe://{TD}/ns/{NS}/objective/obj-0")]),
        "{c0:#}"
    );
    assert_eq!(
        doc["bindings"].as_array().map(Vec::len),
        Some(bindings),
        "every binding of the namespace is listed"
    );

    println!("kleym binary: {}", kleym.display());
    println!("namespace {NS}: {bindings} bindings, {pods} pods");
    match time_field(&stderr, "Elapsed (wall clock) time (h:mm:ss or m:ss):") {
        Some(wall) => println!(
            "kleym explain pod: wall {wall}, user {} s, system {} s, max RSS {} KB",
            time_field(&stderr, "User time (seconds):").unwrap_or("?"),
            time_field(&stderr, "System time (seconds):").unwrap_or("?"),
            time_field(&stderr, "Maximum resident set size (kbytes):").unwrap_or("?"),
        ),
        None => println!("kleym explain pod: {:.0} ms", elapsed.as_secs_f64() * 1e3),
    }
}
