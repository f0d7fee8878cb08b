//! `fleet-bench`: N spokes × M bindings on kubesim, converged by `kleym hub`.
//!
//! Phases: start the clusters (hub + N spokes, every CRD) and seed each spoke with a
//! namespace, a pool and M objectives; register one ClusterProfile per spoke (plugin: a
//! static-token script); start the hub and wait until every spoke is engaged; then create
//! M bindings per spoke and measure, per binding, the time from its creation to its
//! ClusterSPIFFEID appearing (seen through an in-process watch on each spoke's store).
//!
//! The hub is the real `kleym` binary in a child process by default (`--hub process`), so
//! its memory, CPU and file descriptors are its own and kubesim's server ends of its
//! connections do not share its fd limit; `--hub in-process` runs it inside this process as
//! before. kubesim always stays in this process: the measurement uses in-process store
//! watches and counting authenticators. See [`LONG_ABOUT`] for every figure.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use kleym_e2e::fleet::counting::{CountingAuthenticator, counting_token};
use kleym_e2e::fleet::env;
use kleym_e2e::fleet::harness::{FleetHarness, RunningHub, wait_for};
use kleym_e2e::fleet::hub_process::{HubProcess, log_tail, metric_by_label, metric_value};
use kleym_e2e::fleet::plugins::{kleym_binary, static_token_plugin};
use kleym_e2e::fleet::procstat::{FdPeakSampler, Proc, ProcReader, ProcUsage, read_all_at};
use kleym_e2e::fleet::profiles::{access_provider, apply_profile, status};
use kleym_hub::fleet::Phase;
use kubesim_store::WatchOptions;
use serde_json::json;

const LONG_ABOUT: &str = "\
fleet-bench: hub convergence over N spokes x M bindings on kubesim.

kubesim (the hub cluster and N spoke API servers) runs in this process. The hub runs:
  --hub process     (default) the real `kleym hub` binary as a child process, found next to
                    this executable (target/<profile>/kleym) or given with --kleym-bin; build
                    it with `cargo build --release -p kleym-hub --bin kleym`. Its logs go to
                    hub.log in the bench's temp dir (path and tail printed on failure). Engaged
                    = the hub's own /metrics (health port) shows kleym_hub_spokes{phase=\"Engaged\"}
                    equal to N (the gauge follows the hub's fleet state at most every 0.5 s).
  --hub in-process  the hub's library runtime inside this process (what the binary runs);
                    engaged = its in-process fleet state. RSS/CPU/fds are then kubesim + hub.

Figures:
  time to engage      hub start -> every spoke engaged (includes process start in process mode).
  time to converge    first binding created -> last ClusterSPIFFEID seen.
  latency p50/p99/max per binding: its creation -> its ClusterSPIFFEID appearing in the spoke
                      (in-process store watch, exact arrival times, no polling).
  API requests/spoke  counted by an authenticator on each spoke: to engage (preflight, initial
                      lists/watches) and in total.
  execs/spoke         credential-plugin runs (the plugin appends a line to a count file).
  hub process         from /proc/<pid>: peak RSS (VmHWM; also RSS when engaged, before any
                      binding, and at converge), CPU seconds (user+sys over its life, and up
                      to engaged), peak open fds (sampled every 0.25 s) and fds per spoke.
  bench process       the same for this process (kubesim + measurement, + the hub in
                      in-process mode); CPU total and from hub start to converged.";

/// Where the hub runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum HubMode {
    /// The real `kleym hub` binary as a child process.
    Process,
    /// The hub's runtime inside the bench process.
    InProcess,
}

/// fleet-bench: hub convergence over N spokes × M bindings on kubesim.
#[derive(Parser, Debug)]
#[command(about, long_about = LONG_ABOUT)]
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
    /// Where the hub runs: the real binary as a child process, or in this process.
    #[arg(long, value_enum, default_value_t = HubMode::Process)]
    hub: HubMode,
    /// The `kleym` binary for `--hub process` (default: `kleym` next to this executable).
    #[arg(long, value_name = "PATH")]
    kleym_bin: Option<PathBuf>,
    /// The child hub's `--log-level`.
    #[arg(long, default_value = "info")]
    hub_log_level: String,
    /// Keep the temp dir (kubeconfigs, scripts, hub.log) after a successful run.
    #[arg(long)]
    keep_dir: bool,
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
    // On SIGINT/SIGTERM the run future is dropped, which kills a child hub (kill_on_drop).
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = run(args) => r,
            _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
            _ = term.recv() => anyhow::bail!("terminated"),
        }
    })
}

/// The `kleym` binary for `--hub process`, with a hint when it is missing.
fn find_kleym(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    const BUILD: &str = "cargo build --release -p kleym-hub --bin kleym";
    match given {
        Some(p) if p.is_file() => Ok(p.to_path_buf()),
        Some(p) => anyhow::bail!(
            "--kleym-bin {} does not exist; build it: {BUILD}",
            p.display()
        ),
        None => kleym_binary()
            .map_err(|e| anyhow::anyhow!("{e}\nbuild it (release, like this bench): {BUILD}")),
    }
}

/// "N min ago" for a file's mtime (a stale hub binary is an easy mistake to make).
fn age(path: &Path) -> String {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .map_or("unknown age".into(), |d| {
            format!("built {:.0} min ago", d.as_secs_f64() / 60.0)
        })
}

/// The hub under measurement.
enum Hub {
    InProcess(RunningHub),
    Process(HubProcess),
}

impl Hub {
    /// Fails if a child hub has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        match self {
            Hub::InProcess(_) => Ok(()),
            Hub::Process(p) => Ok(p.check_running()?),
        }
    }

    /// Waits until the hub reports all `n` spokes engaged.
    async fn wait_engaged(&mut self, n: usize, limit: Duration) -> anyhow::Result<()> {
        match self {
            Hub::InProcess(h) => {
                let state = h.handle.state.clone();
                let engaged = wait_for("every spoke engaged", limit, || {
                    let state = state.clone();
                    async move {
                        let all = state.spokes();
                        (all.len() == n && all.iter().all(|s| s.phase == Phase::Engaged))
                            .then_some(())
                    }
                })
                .await;
                engaged.map_err(|e| {
                    let by_phase = state.spokes().iter().fold(BTreeMap::new(), |mut acc, s| {
                        *acc.entry(s.phase.as_str()).or_insert(0usize) += 1;
                        acc
                    });
                    anyhow::anyhow!("{e}; phases: {by_phase:?}")
                })
            }
            Hub::Process(p) => {
                const ENGAGED: &str = "kleym_hub_spokes{phase=\"Engaged\"}";
                let deadline = Instant::now() + limit;
                let mut last = None;
                loop {
                    p.check_running()?;
                    if let Some(m) = p.metrics().await {
                        if metric_value(&m, ENGAGED) == Some(n as f64) {
                            return Ok(());
                        }
                        last = Some(m);
                    }
                    if Instant::now() >= deadline {
                        let phases: Vec<_> = last
                            .as_deref()
                            .map(|m| metric_by_label(m, "kleym_hub_spokes", "phase"))
                            .unwrap_or_default()
                            .into_iter()
                            .filter(|(_, v)| *v > 0.0)
                            .collect();
                        anyhow::bail!(
                            "timed out after {limit:?} waiting for every spoke engaged; phases on the hub's /metrics: {phases:?}"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// The child hub's resource figures (`None` in-process).
    fn usage(&self) -> Option<std::io::Result<ProcUsage>> {
        match self {
            Hub::InProcess(_) => None,
            Hub::Process(p) => Some(p.usage()),
        }
    }

    /// Stops the hub (SIGTERM and a bounded wait for a child).
    async fn stop(self) -> anyhow::Result<()> {
        match self {
            Hub::InProcess(h) => h.stop().await.map_err(anyhow::Error::msg),
            Hub::Process(p) => {
                let stopped = p.stop(Duration::from_secs(60)).await?;
                println!(
                    "hub stopped {} in {:.1?} ({})",
                    if stopped.graceful {
                        "on SIGTERM"
                    } else {
                        "by SIGKILL after 60 s without exiting on SIGTERM"
                    },
                    stopped.took,
                    stopped.status
                );
                if !stopped.graceful || !stopped.status.success() {
                    anyhow::bail!(
                        "the hub did not exit cleanly on SIGTERM ({})",
                        stopped.status
                    );
                }
                Ok(())
            }
        }
    }
}

/// The simulated fleet, ready for the hub: counters and profiles in place.
struct Fleet {
    f: FleetHarness,
    names: Vec<String>,
    counters: Vec<Arc<CountingAuthenticator>>,
    provider_file: PathBuf,
    /// The plugin's count file, opened before any exec (it appends to the same inode), so
    /// it can be read even when kubesim has used up this process's fds.
    count_file: std::fs::File,
}

async fn setup(dir: &Path, n: usize, m: usize) -> anyhow::Result<Fleet> {
    let names: Vec<String> = (0..n).map(|i| format!("spoke-{i:04}")).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let f = FleetHarness::start(&name_refs, dir)
        .await
        .map_err(anyhow::Error::msg)?;
    let token = counting_token();
    let count_path = dir.join("execs.count");
    std::fs::File::create(&count_path)?;
    let count_file = std::fs::File::open(&count_path)?;
    let plugin = static_token_plugin(dir, "bench.sh", &token, Some(&count_path))?;
    let provider_file = dir.join("providers.json");
    std::fs::write(
        &provider_file,
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
    Ok(Fleet {
        f,
        names,
        counters,
        provider_file,
        count_file,
    })
}

async fn run(args: Args) -> anyhow::Result<()> {
    let limit = Duration::from_secs(args.timeout_seconds);
    let kleym = match args.hub {
        HubMode::Process => Some(find_kleym(args.kleym_bin.as_deref())?),
        HubMode::InProcess => None,
    };
    let dir = std::env::temp_dir().join(format!("fleet-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (n, m) = (args.spokes, args.bindings);
    println!(
        "fleet-bench: {n} spokes x {m} bindings (hub {:?}, concurrency {}, spoke concurrency {})",
        args.hub, args.concurrency, args.spoke_concurrency
    );
    if let Some(k) = &kleym {
        println!("hub binary: {} ({})", k.display(), age(k));
    }

    let t = Instant::now();
    let fleet = setup(&dir, n, m).await?;
    println!(
        "setup (clusters, environments, profiles): {:.1?}; bench RSS after setup {} MiB",
        t.elapsed(),
        ProcUsage::read(Proc::SelfProcess).map_or(0, |u| u.rss_kib / 1024)
    );

    let flags: Vec<String> = vec![
        "--clusterprofile-provider-file".into(),
        fleet.provider_file.display().to_string(),
        "--trust-domain".into(),
        "bench.example".into(),
        "--leader-elect=false".into(),
        "--concurrency".into(),
        args.concurrency.to_string(),
        "--spoke-concurrency".into(),
        args.spoke_concurrency.to_string(),
    ];
    // Opened now: near the fd limit kubesim may leave this process none to open later.
    let self_reader = ProcReader::open(Proc::SelfProcess)?;
    let bench_cpu_at_start = self_reader.read()?.cpu_seconds;
    let hub_started = Instant::now();
    let log_path = dir.join("hub.log");
    let mut hub = match &kleym {
        Some(k) => {
            let mut flags = flags;
            flags.extend(["--log-level".into(), args.hub_log_level.clone()]);
            let p = HubProcess::spawn(k, &fleet.f.hub_kubeconfig(), &flags, &log_path)?;
            println!("hub pid {}, log {}", p.pid(), log_path.display());
            Hub::Process(p)
        }
        None => Hub::InProcess(
            fleet
                .f
                .start_hub(&flags)
                .await
                .map_err(anyhow::Error::msg)?,
        ),
    };
    let mut procs = vec![Proc::SelfProcess];
    if let Hub::Process(p) = &hub {
        procs.push(Proc::Pid(p.pid()));
    }
    let fds = FdPeakSampler::start(&procs, Duration::from_millis(250));
    let ctx = Measure {
        fleet: &fleet,
        n,
        m,
        limit,
        hub_started,
        bench_cpu_at_start,
        self_reader: &self_reader,
        fds: &fds,
    };
    match ctx.measure(&mut hub).await {
        Ok(()) => {
            drop(fds);
            if let Err(e) = hub.stop().await {
                if kleym.is_some() {
                    eprintln!("hub log: {} (temp dir kept)", log_path.display());
                }
                return Err(e);
            }
            if args.keep_dir {
                println!("kept {}", dir.display());
            } else {
                let _ = std::fs::remove_dir_all(&dir);
            }
            Ok(())
        }
        Err(e) => {
            if let Hub::Process(p) = &hub {
                eprintln!(
                    "hub log: {} (temp dir kept); last lines:\n{}",
                    p.log_path().display(),
                    log_tail(p.log_path(), 40)
                );
            }
            // Dropping a child hub kills it (kill_on_drop).
            drop(hub);
            Err(e)
        }
    }
}

/// What the measurement phase needs.
struct Measure<'a> {
    fleet: &'a Fleet,
    n: usize,
    m: usize,
    limit: Duration,
    hub_started: Instant,
    bench_cpu_at_start: f64,
    self_reader: &'a ProcReader,
    fds: &'a FdPeakSampler,
}

impl Measure<'_> {
    async fn measure(&self, hub: &mut Hub) -> anyhow::Result<()> {
        let (n, m, limit) = (self.n, self.m, self.limit);
        let f = &self.fleet.f;
        hub.wait_engaged(n, limit).await?;
        let time_to_engage = self.hub_started.elapsed();
        let hub_at_engage = hub.usage().and_then(Result::ok);
        let requests_engage: Vec<u64> = self.fleet.counters.iter().map(|c| c.count()).collect();
        println!("time to engage {n} spokes: {time_to_engage:.1?}");

        // Watch every spoke's ClusterSPIFFEIDs (in-process store watch: exact arrival times,
        // no polling load), then create every binding, interleaved across spokes.
        let stores: Vec<_> = self
            .fleet
            .names
            .iter()
            .map(|nm| f.spoke(nm).store())
            .collect();
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
        // Wait for the watchers, failing fast if a child hub dies meanwhile.
        let all = futures::future::join_all(watchers);
        tokio::pin!(all);
        let joined = loop {
            tokio::select! {
                r = &mut all => break r,
                _ = tokio::time::sleep(Duration::from_secs(1)) => hub.check_alive()?,
            }
        };
        let mut seen = Vec::with_capacity(n);
        for w in joined {
            seen.push(w?);
        }
        let last_seen = seen.iter().flatten().flatten().max().copied();
        let converge = last_seen
            .map(|t| t.saturating_duration_since(first_create))
            .unwrap_or_default();
        let hub_usage = hub.usage();
        let bench_usage = self.self_reader.read();
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
        let requests_total: Vec<u64> = self.fleet.counters.iter().map(|c| c.count()).collect();
        let avg = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
        let execs = read_all_at(&self.fleet.count_file).map(|s| s.lines().count());
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
            "API requests per spoke: {:.1} to engage, {:.1} in total (max {}); credential execs per spoke: {}",
            avg(&requests_engage),
            avg(&requests_total),
            requests_total.iter().max().copied().unwrap_or(0),
            match execs {
                Ok(e) => format!("{:.2} ({e} total)", e as f64 / n.max(1) as f64),
                Err(e) => format!("unknown (count file unreadable: {e})"),
            }
        );
        let mib = |u: &Option<ProcUsage>, f: fn(&ProcUsage) -> u64| {
            u.as_ref().map_or("?".into(), |u| (f(u) / 1024).to_string())
        };
        match (&*hub, hub_usage) {
            (Hub::Process(p), Some(Ok(u))) => {
                let hub_fds = self
                    .fds
                    .peak(Proc::Pid(p.pid()))
                    .max(u.open_fds.unwrap_or(0));
                println!(
                    "hub process (kleym, pid {}): peak RSS {} MiB (VmHWM; {} MiB when engaged, {} MiB at converge), CPU {:.2} s user+sys ({} s of it to engage), open fds peak {hub_fds} ({:.1} per spoke; {} at converge)",
                    p.pid(),
                    u.peak_rss_mib(),
                    mib(&hub_at_engage, |u| u.rss_kib),
                    u.rss_kib / 1024,
                    u.cpu_seconds,
                    hub_at_engage.map_or("?".into(), |u| format!("{:.2}", u.cpu_seconds)),
                    hub_fds as f64 / n.max(1) as f64,
                    u.open_fds.map_or("?".into(), |n| n.to_string())
                );
            }
            (Hub::Process(p), Some(Err(e))) => {
                println!("hub process (pid {}): /proc unreadable: {e}", p.pid());
            }
            (Hub::Process(_), None) | (Hub::InProcess(_), _) => {}
        }
        let what = match &*hub {
            Hub::Process(_) => format!("kubesim's {} API servers + measurement", n + 1),
            Hub::InProcess(_) => format!("kubesim's {} API servers + the hub + measurement", n + 1),
        };
        match bench_usage {
            Ok(u) => println!(
                "bench process ({what}): peak RSS {} MiB (VmHWM), CPU {:.2} s user+sys in total, {:.2} s from hub start to converged, open fds peak {}",
                u.peak_rss_mib(),
                u.cpu_seconds,
                u.cpu_seconds - self.bench_cpu_at_start,
                self.fds
                    .peak(Proc::SelfProcess)
                    .max(u.open_fds.unwrap_or(0))
            ),
            Err(e) => println!(
                "bench process ({what}): /proc/self unreadable: {e}; open fds peak {}",
                self.fds.peak(Proc::SelfProcess)
            ),
        }
        if missing > 0 {
            anyhow::bail!("{missing} of {} bindings did not converge", n * m);
        }
        Ok(())
    }
}
