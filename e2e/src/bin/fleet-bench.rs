//! `fleet-bench`: N spokes × M bindings on kubesim with an in-process `kleym hub`.
//!
//! Phases: start the clusters (hub + N spokes, every CRD) and seed each spoke with a
//! namespace, a pool and M objectives; register one ClusterProfile per spoke (plugin: a
//! static-token script); start the hub and wait until every spoke is engaged; then create
//! M bindings per spoke and measure, per binding, the time from its creation to its
//! ClusterSPIFFEID appearing (seen through an in-process watch on each spoke's store).
//!
//! Reports: time to engage, time to converge, p50/p99/max binding→ClusterSPIFFEID latency,
//! peak RSS (VmHWM of *this* process, which holds kubesim's N+1 API servers and the hub),
//! API requests per spoke (counted by an authenticator on each spoke) and credential-plugin
//! execs per spoke.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use kleym_e2e::fleet::counting::{CountingAuthenticator, counting_token};
use kleym_e2e::fleet::env;
use kleym_e2e::fleet::harness::{FleetHarness, wait_for};
use kleym_e2e::fleet::plugins::{count_runs, static_token_plugin};
use kleym_e2e::fleet::profiles::{access_provider, apply_profile, status};
use kleym_hub::fleet::Phase;
use kubesim_store::WatchOptions;
use serde_json::json;

/// fleet-bench: hub convergence over N spokes × M bindings on kubesim.
#[derive(Parser, Debug)]
struct Args {
    /// Number of spokes.
    #[arg(long, default_value_t = 100)]
    spokes: usize,
    /// Bindings per spoke.
    #[arg(long, default_value_t = 100)]
    bindings: usize,
    /// Hub `--concurrency` (spokes syncing at once).
    #[arg(long, default_value_t = 32)]
    concurrency: u16,
    /// Hub `--spoke-concurrency` (reconciles at once per spoke).
    #[arg(long, default_value_t = 4)]
    spoke_concurrency: u16,
    /// Give up after this many seconds per phase.
    #[arg(long, default_value_t = 900)]
    timeout_seconds: u64,
}

fn vm_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let limit = Duration::from_secs(args.timeout_seconds);
    let dir = std::env::temp_dir().join(format!("fleet-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (n, m) = (args.spokes, args.bindings);
    println!(
        "fleet-bench: {n} spokes x {m} bindings (hub concurrency {}, spoke concurrency {})",
        args.concurrency, args.spoke_concurrency
    );

    let t = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("spoke-{i:04}")).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let f = FleetHarness::start(&name_refs, &dir)
        .await
        .map_err(anyhow::Error::msg)?;
    let token = counting_token();
    let count_file = dir.join("execs.count");
    let plugin = static_token_plugin(&dir, "bench.sh", &token, Some(&count_file))?;
    let pf = dir.join("providers.json");
    std::fs::write(
        &pf,
        json!({"providers": [{"name": "bench", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str()}}]})
        .to_string(),
    )?;
    let mut counters: Vec<Arc<CountingAuthenticator>> = Vec::with_capacity(n);
    for name in &names {
        let s = f.spoke(name);
        counters.push(CountingAuthenticator::install(&s));
        env::seed_environment(&s.store(), m).map_err(anyhow::Error::msg)?;
    }
    let results = futures::stream::iter(names.iter().map(|name| {
        let s = f.spoke(name);
        let hub = f.hub_client.clone();
        let name = name.clone();
        async move {
            apply_profile(
                &hub,
                &name,
                status(
                    vec![access_provider("bench", &s, None)],
                    true,
                    "2026-01-01T00:00:00Z",
                    &[],
                ),
            )
            .await
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<_>>()
    .await;
    for r in results {
        r?;
    }
    println!(
        "setup (clusters, environments, profiles): {:.1?}; RSS after setup {} MiB",
        t.elapsed(),
        vm_kib("VmRSS:").unwrap_or(0) / 1024
    );

    let hub_started = Instant::now();
    let hub = f
        .start_hub(&[
            "--clusterprofile-provider-file".into(),
            pf.display().to_string(),
            "--trust-domain".into(),
            "bench.example".into(),
            "--leader-elect=false".into(),
            "--concurrency".into(),
            args.concurrency.to_string(),
            "--spoke-concurrency".into(),
            args.spoke_concurrency.to_string(),
        ])
        .await
        .map_err(anyhow::Error::msg)?;
    let state = hub.handle.state.clone();
    let engaged = wait_for("every spoke engaged", limit, || {
        let state = state.clone();
        async move {
            let all = state.spokes();
            (all.len() == n && all.iter().all(|s| s.phase == Phase::Engaged)).then_some(())
        }
    })
    .await;
    if let Err(e) = engaged {
        let by_phase =
            state
                .spokes()
                .iter()
                .fold(std::collections::BTreeMap::new(), |mut acc, s| {
                    *acc.entry(s.phase.as_str()).or_insert(0usize) += 1;
                    acc
                });
        anyhow::bail!("{e}; phases: {by_phase:?}");
    }
    let time_to_engage = hub_started.elapsed();
    let requests_engage: Vec<u64> = counters.iter().map(|c| c.count()).collect();
    println!("time to engage {n} spokes: {time_to_engage:.1?}");

    // Watch every spoke's ClusterSPIFFEIDs (in-process store watch: exact arrival times, no
    // polling load), then create every binding, interleaved across spokes.
    let stores: Vec<_> = names.iter().map(|nm| f.spoke(nm).store()).collect();
    let index: Arc<HashMap<String, usize>> =
        Arc::new((0..m).map(|i| (env::csid_name(i), i)).collect());
    let mut watchers = Vec::with_capacity(n);
    for store in &stores {
        let res = store
            .resolve("spire.spiffe.io", "v1alpha1", "clusterspiffeids")
            .ok_or_else(|| anyhow::anyhow!("ClusterSPIFFEIDs not served"))?;
        let opts = WatchOptions {
            resource_version: Some(store.current_resource_version().to_string()),
            ..WatchOptions::default()
        };
        let mut stream = store
            .watch(&res, None, &opts)
            .map_err(|e| anyhow::anyhow!("watch: {}", e.message))?;
        let index = index.clone();
        watchers.push(tokio::spawn(async move {
            let mut seen: Vec<Option<Instant>> = vec![None; m];
            let mut left = m;
            let deadline = tokio::time::Instant::now() + limit;
            while left > 0 {
                match tokio::time::timeout_at(deadline, stream.next()).await {
                    Ok(Some(ev)) if ev.event_type == "ADDED" => {
                        let name = ev.object["metadata"]["name"].as_str().unwrap_or_default();
                        if let Some(&i) = index.get(name)
                            && seen[i].is_none()
                        {
                            seen[i] = Some(Instant::now());
                            left -= 1;
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            seen
        }));
    }
    let mut created = vec![vec![None::<Instant>; m]; n];
    let first_create = Instant::now();
    for i in 0..m {
        for (store, row) in stores.iter().zip(created.iter_mut()) {
            env::create_bindings(store, i..i + 1).map_err(anyhow::Error::msg)?;
            row[i] = Some(Instant::now());
        }
    }
    let create_time = first_create.elapsed();
    let mut seen = Vec::with_capacity(n);
    for w in watchers {
        seen.push(w.await?);
    }
    let last_seen = seen.iter().flatten().flatten().max().copied();
    let converge = last_seen
        .map(|t| t.saturating_duration_since(first_create))
        .unwrap_or_default();
    let missing = seen.iter().flatten().filter(|s| s.is_none()).count();
    if missing > 0 {
        println!("{missing} bindings got no ClusterSPIFFEID within {limit:?}");
    }
    let mut lat: Vec<Duration> = Vec::with_capacity(n * m);
    for (c_row, s_row) in created.iter().zip(&seen) {
        for (c, v) in c_row.iter().zip(s_row) {
            if let (Some(c), Some(v)) = (c, v) {
                lat.push(v.saturating_duration_since(*c));
            }
        }
    }
    lat.sort();
    let requests_total: Vec<u64> = counters.iter().map(|c| c.count()).collect();
    let avg = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    let execs = count_runs(&count_file);
    println!("bindings created in {create_time:.1?} ({} total)", n * m);
    println!(
        "time to converge (first binding created -> last ClusterSPIFFEID seen): {converge:.1?}"
    );
    println!(
        "binding -> ClusterSPIFFEID latency: p50 {:.0?}, p99 {:.0?}, max {:.0?}",
        percentile(&lat, 0.50),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or_default()
    );
    println!(
        "API requests per spoke: {:.1} to engage, {:.1} in total (max {}); credential execs per spoke: {:.2} ({execs} total)",
        avg(&requests_engage),
        avg(&requests_total),
        requests_total.iter().max().copied().unwrap_or(0),
        execs as f64 / n.max(1) as f64
    );
    println!(
        "peak RSS (VmHWM of the fleet-bench process = kubesim's {} API servers + the hub): {} MiB",
        n + 1,
        vm_kib("VmHWM:").unwrap_or(0) / 1024
    );
    hub.stop().await.map_err(anyhow::Error::msg)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
