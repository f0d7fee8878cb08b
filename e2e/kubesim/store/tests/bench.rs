//! Throughput figures (not a timed test: it asserts only correctness and prints numbers).
//! Run: `cargo test -p kubesim-store --release --test bench -- --ignored --nocapture`
//! (`KUBESIM_BENCH_N` sets the object count, default 20000).

mod common;

use common::*;
use futures::StreamExt;
use kubesim_store::{Cluster, ListOptions, WatchOptions};
use serde_json::json;
use std::time::Instant;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly with --ignored --nocapture"]
async fn store_throughput() {
    let n: usize = std::env::var("KUBESIM_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);

    let t = Instant::now();
    let clusters: Vec<_> = (0..100).map(|i| Cluster::new(&format!("c{i}"))).collect();
    println!("startup: 100 clusters in {:?}", t.elapsed());

    let c = &clusters[0];
    let cms = res(c, "", "v1", "configmaps");
    let rss0 = rss_kib();
    let t = Instant::now();
    for i in 0..n {
        c.create(
            &cms,
            Some("default"),
            json!({"metadata": {"name": format!("cm-{i:06}"), "labels": {"app": format!("a{}", i % 10)}}, "data": {"k": "v"}}),
            &opts("bench"),
        )
        .unwrap();
    }
    let dt = t.elapsed();
    println!(
        "create: {n} configmaps in {dt:?} = {:.0} objects/s",
        n as f64 / dt.as_secs_f64()
    );
    let rss1 = rss_kib();
    println!(
        "memory: ~{} KiB RSS per 10k objects (incl. watch history)",
        (rss1.saturating_sub(rss0)) * 10_000 / n as u64
    );

    let t = Instant::now();
    let l = c.list(&cms, None, &ListOptions::default()).unwrap();
    let dt = t.elapsed();
    assert_eq!(l["items"].as_array().unwrap().len(), n);
    println!(
        "list: {n} objects in one page in {dt:?} = {:.0} objects/s",
        n as f64 / dt.as_secs_f64()
    );

    let t = Instant::now();
    let mut token = None;
    let mut seen = 0;
    loop {
        let l = c
            .list(
                &cms,
                None,
                &ListOptions {
                    limit: Some(500),
                    continue_token: token.clone(),
                    ..Default::default()
                },
            )
            .unwrap();
        seen += l["items"].as_array().unwrap().len();
        match l["metadata"]["continue"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    let dt = t.elapsed();
    assert_eq!(seen, n);
    println!(
        "list: {n} objects in pages of 500 in {dt:?} = {:.0} objects/s",
        n as f64 / dt.as_secs_f64()
    );

    let t = Instant::now();
    let l = c
        .list(
            &cms,
            None,
            &ListOptions {
                label_selector: Some("app=a3".into()),
                ..Default::default()
            },
        )
        .unwrap();
    println!(
        "list with label selector (1/10 match) over {n}: {:?} ({} items)",
        t.elapsed(),
        l["items"].as_array().unwrap().len()
    );

    // watch fan-out: 10 watchers of configmaps, 2000 updates
    let watchers = 10;
    let updates = 2000;
    let from = c.current_resource_version().to_string();
    let mut streams: Vec<_> = (0..watchers)
        .map(|_| {
            c.watch(
                &cms,
                None,
                &WatchOptions {
                    resource_version: Some(from.clone()),
                    ..Default::default()
                },
            )
            .unwrap()
        })
        .collect();
    // an unrelated cluster full of watchers must not slow this one down
    let other = &clusters[1];
    let _idle: Vec<_> = (0..100)
        .map(|_| {
            other
                .watch(
                    &res(other, "", "v1", "configmaps"),
                    None,
                    &WatchOptions::default(),
                )
                .unwrap()
        })
        .collect();
    let t = Instant::now();
    for i in 0..updates {
        c.patch(
            &cms,
            Some("default"),
            &format!("cm-{:06}", i % n),
            kubesim_store::PatchType::Merge,
            &json!({"data": {"k": format!("u{i}")}}),
            kubesim_store::Subresource::Main,
            &opts("bench"),
        )
        .unwrap();
    }
    let mut delivered = 0;
    for s in streams.iter_mut() {
        for _ in 0..updates {
            s.next().await.unwrap();
            delivered += 1;
        }
    }
    let dt = t.elapsed();
    println!(
        "watch: {updates} updates x {watchers} watchers = {delivered} events delivered in {dt:?} = {:.0} events/s",
        delivered as f64 / dt.as_secs_f64()
    );
}
