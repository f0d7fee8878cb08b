//! `fleet-bench`: N spokes × M bindings on kubesim, converged by `kleym hub`.
//!
//! Phases: start the clusters (hub + N spokes, every CRD) and seed each spoke with a
//! namespace, a pool and M objectives; register one ClusterProfile per spoke (plugin: a
//! static-token script). Then, by `--scenario`: `cold-start` creates every binding, starts
//! the hub and measures from hub start to every binding converged; `new-bindings` starts the
//! hub, waits until every spoke is engaged, then creates the bindings and measures each
//! one's propagation. Convergence (Ready for the current generation and the ClusterSPIFFEID
//! exists) is seen through in-process watches on the spokes' stores.
//!
//! The hub is the real `kleym` binary in a child process by default (`--hub process`), so
//! its memory, CPU and file descriptors are its own and kubesim's server ends of its
//! connections do not share its fd limit; `--hub in-process` runs it inside this process as
//! before. kubesim always stays in this process: the measurement uses in-process store
//! watches and counting authenticators. See [`LONG_ABOUT`] for every figure.

/// jemalloc, as the `kleym` binary: kubesim's API servers in this process clone and drop
/// JSON values per request, and with glibc's malloc the bench's own CPU, not the hub's,
/// decided how fast a fleet converged on 2 cores (docs/benchmarks.md, "The
/// commands").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use http_body_util::BodyExt;
use kleym_e2e::fixtures::admission::install_admission_policy;
use kleym_e2e::fixtures::convergence::{self, Names, SpokeProgress};
use kleym_e2e::fixtures::counting::{COUNTING_USER, CountingAuthenticator, counting_token};
use kleym_e2e::fixtures::engagement::{LogTail, engaged_spoke};
use kleym_e2e::fixtures::env;
use kleym_e2e::fixtures::harness::{FleetHarness, RunningHub};
use kleym_e2e::fixtures::hub_process::{HubProcess, log_tail, metric_by_label, metric_series};
use kleym_e2e::fixtures::plugins::{kleym_binary, static_token_plugin};
use kleym_e2e::fixtures::procstat::{FdPeakSampler, Proc, ProcReader, ProcUsage, read_all_at};
use kleym_e2e::fixtures::profiles::{PROFILE_NS, access_provider, apply_profile, status};
use kleym_e2e::fixtures::trickle;
use kleym_hub::fleet::{FleetState, Phase};
use kubesim_store::Cluster;
use serde_json::json;

/// The trust domain the bench's hub compiles with (and the spokes' admission policy allows).
const TRUST_DOMAIN: &str = "bench.example";

const LONG_ABOUT: &str = "\
fleet-bench: hub convergence over N spokes x M bindings on kubesim.

Every spoke gets a namespace, a ServiceAccount, an InferencePool and M InferenceObjectives; the
hub cluster gets one ClusterProfile per spoke (credential plugin: a static-token script). The M
bindings per spoke (all valid and distinct) are created according to --scenario:
  cold-start    (default) every spoke's environment and all N x M bindings exist before the hub
                starts: the hub starts cold on a populated fleet, the case of the design target
                (\"100 spokes x 100 bindings from cold start in seconds on 2 cores\"). Times and
                latencies count from hub start.
  new-bindings  the hub starts on spokes without bindings; once every spoke is engaged the
                bench creates the bindings (interleaved across spokes, on a blocking thread):
                how fast an engaged fleet propagates new bindings. Latencies count from each
                binding's creation. (The only scenario before cold-start existed.)
  trickle       cold-start, then, on the converged fleet, one new binding per second on a
                random spoke for --duration-seconds: p50/p99/max from each binding's creation
                to its ClusterSPIFFEID (the latency an operator feels) and the hub's writes per
                new binding (its kleym_spoke_api_writes_total before and after).
  chaos         two hub replicas (leader election; --replicas, --shard-mode and --hub-arg
                as in failover) under seeded churn and faults for
                --duration-seconds (sharded: also the last replica joining late, a
                replica killed for longer than the lease, replicas' own Leases deleted
                under them, one replica at a time cut from the hub cluster while it
                reaches the spokes), then invariants against oracles (the pure compiler
                over the final objects; the report objects against an independent report
                oracle; at most one writer per spoke against the spokes' request logs;
                sharded: every running replica renews its Lease);
                defaults 50 spokes x 40 bindings; prints the seed
                first and a `summary: scenario=chaos seed=... violations=...` line last;
                exits non-zero on any violation, keeping its temp dir (seed, report.txt,
                the replicas' logs). See docs/benchmarks.md, section Chaos soak.
  failover      --replicas R (default 3) real `kleym hub` processes (leader election on,
                --lease-duration-seconds, --shard-mode passed on as sharded, --hub-arg for
                anything else) converge the fleet (cold start); who serves each spoke is read
                from the spoke's own request log (the replica named in the User-Agent of its
                latest request). Then it waits until the hub's status objects describe the
                fleet (the report and every ClusterIdentityStatus count every binding ready)
                and prints the replicas' CPU then too: the cold start's, status writes
                included. A baseline trickle, then SIGKILL of one replica (leader mode: the
                Lease holder; sharded: the replica serving the most spokes); at once one new
                binding on each of up to 10 of its spokes (creation -> ClusterSPIFFEID: the
                time to converge across the hand-over) and, for --duration-seconds (default
                25), two new bindings a second on spokes the survivors serve (their latency
                during the hand-over; none in leader mode). Reports each replica's share of
                the spokes before and after, when a survivor first reached each victim spoke,
                and the double writes in the spokes' logs: a replica writing to a spoke again
                within the Lease duration of its own last write after another replica wrote
                there. Prints a `summary: scenario=failover ...` line; exits non-zero unless
                the hub's status described the fleet, every binding created after the kill
                converged and no double write was seen.
                With --shard-mode sharded --running-replicas K, only the first K replicas
                run and the bench holds the other replicas' Leases: the K own the share
                they would among all R with no other replica on these cores (a replica on
                a machine of its own). It ends once their share converged and prints
                their CPU, peak RSS and the fleet's CPU at that cost per spoke (a
                `summary: scenario=failover-share-alone ...` line); it exits non-zero
                unless the spokes they reached (from the spokes' logs) are exactly the
                spokes that converged.

Converged: a binding is converged when its status has Ready=True for its current generation
(the condition's observedGeneration equals metadata.generation) AND its ClusterSPIFFEID exists
in the spoke; it converged at the later of the two moments, both seen through in-process
watches on the spoke's store (exact arrival times, no polling). The bench's bindings are all
valid and distinct, so every one is expected Ready: a refused one (Ready=False) is not
converged and is reported with its reason. After the watches every spoke is listed once to
confirm the end state. The bench exits non-zero unless all N x M bindings converged within
--timeout-seconds.

kubesim (the hub cluster and N spoke API servers) runs in this process. The hub runs:
  --hub process     (default) the real `kleym hub` binary as a child process, found next to
                    this executable (target/<profile>/kleym) or given with --kleym-bin; build
                    it with `cargo build --release -p kleym-hub --bin kleym`. Its logs go to
                    hub.log in the bench's temp dir (path and tail printed on failure). A spoke
                    is engaged when the log has its \"spoke engaged spoke=<ns>/<name>\" line
                    (the hub logs it as it publishes the Engaged phase); the log is read every
                    20 ms.
  --hub in-process  the hub's library runtime inside this process (what the binary runs);
                    engaged = its in-process fleet state, checked on every change (at most
                    every 10 ms). RSS/CPU/fds are then kubesim + hub.

Figures:
  time to engage      hub start -> the last spoke seen engaged (includes process start in
                      process mode).
  time to converge    cold-start: hub start -> the last binding converged; new-bindings: first
                      binding created -> the last binding converged.
  latency p50/p99/max per binding, to converged and to its ClusterSPIFFEID alone: from hub
                      start (cold-start) or from the binding's creation (new-bindings).
  API requests/spoke  counted by an authenticator on each spoke (every authenticated request;
                      /version and health probes are anonymous there and not counted).
                      \"to engage\": the spoke's count at the moment the bench saw it
                      engaged (within the 20 ms / 10 ms reading above). The hub declares a
                      spoke engaged once its caches' initial lists are done, so some of their
                      watch requests can arrive just after (the figure can be below the
                      engage traffic), and in cold-start the reconciler, which starts on the
                      same caches, may already have written (it can include writes). The
                      whole engage traffic is the \"reads\" of the total below as long as the
                      run ends before the reconcilers' 30 s discovery poll.
                      \"in total\": at the end, split into writes (the hub's
                      own kleym_spoke_api_writes_total for the spoke: finalizer patches,
                      ClusterSPIFFEID applies, status applies, counted per attempt) and reads
                      (the rest: preflight list, discovery, lists, watches).
  execs/spoke         credential-plugin runs (the plugin appends a line to a count file).
  hub process         from /proc/<pid>: peak RSS (VmHWM; also RSS when every spoke was seen
                      engaged and at converge), CPU seconds (user+sys over its life, and up to
                      every spoke engaged), peak open fds (sampled every 0.25 s) and fds per
                      spoke.
  bench process       the same for this process (kubesim + measurement, + the hub in
                      in-process mode); CPU total and from hub start to converged.

The last line, \"summary: key=value ...\", repeats the main figures for scripts (times in
seconds, latencies in milliseconds, requests and execs per spoke).";

/// Where the hub runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum HubMode {
    /// The real `kleym hub` binary as a child process.
    Process,
    /// The hub's runtime inside the bench process.
    InProcess,
}

/// When the bindings are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Every binding exists before the hub starts; measured from hub start.
    ColdStart,
    /// Bindings are created once every spoke is engaged; measured from each creation.
    NewBindings,
    /// Cold start, then one new binding per second on a random spoke.
    Trickle,
    /// Two hub replicas under seeded churn and faults, then invariants against an oracle
    /// (see `kleym_e2e::chaos`).
    Chaos,
    /// R hub replicas converge the fleet, one is killed: the time its spokes take to come
    /// back, the others' latency meanwhile, double writers (see `kleym_e2e::failover`).
    Failover,
}

impl Scenario {
    fn as_str(self) -> &'static str {
        match self {
            Scenario::ColdStart => "cold-start",
            Scenario::NewBindings => "new-bindings",
            Scenario::Trickle => "trickle",
            Scenario::Chaos => "chaos",
            Scenario::Failover => "failover",
        }
    }
}

/// The child hub's log level: at least `info`, because the bench reads each spoke's
/// `spoke engaged` line from the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum HubLogLevel {
    Info,
    Debug,
    Trace,
}

impl HubLogLevel {
    fn as_str(self) -> &'static str {
        match self {
            HubLogLevel::Info => "info",
            HubLogLevel::Debug => "debug",
            HubLogLevel::Trace => "trace",
        }
    }
}

/// fleet-bench: hub convergence over N spokes × M bindings on kubesim.
#[derive(Parser, Debug)]
#[command(about, long_about = LONG_ABOUT)]
struct Args {
    /// Number of spokes (default 100; chaos: 50).
    #[arg(long)]
    spokes: Option<usize>,
    /// Bindings per spoke (default 100; chaos: 40).
    #[arg(long)]
    bindings: Option<usize>,
    /// cold-start (default; the design target): every binding exists before the hub
    /// starts. new-bindings: bindings are created once every spoke is engaged.
    #[arg(long, value_enum, default_value_t = Scenario::ColdStart)]
    scenario: Scenario,
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
    /// The child hub's `--log-level` (info at least: the bench reads its `spoke engaged`
    /// lines).
    #[arg(long, value_enum, default_value_t = HubLogLevel::Info)]
    hub_log_level: HubLogLevel,
    /// trickle: how long new bindings keep coming, one per second (default 60); chaos: the
    /// window of churn and faults (default 600).
    #[arg(long, value_name = "SECONDS")]
    duration_seconds: Option<u64>,
    /// Keep the temp dir (kubeconfigs, scripts, hub.log; chaos: seed, report.txt, the
    /// replicas' logs) after a successful run (a failed one always keeps it).
    #[arg(long)]
    keep_dir: bool,
    /// chaos: the seed of the schedule (default: from the clock; printed at start).
    #[arg(long)]
    seed: Option<u64>,
    /// chaos: churn operations per second over the fleet.
    #[arg(long, default_value_t = 5.0)]
    churn_per_second: f64,
    /// chaos: mean seconds between two fault windows of one spoke.
    #[arg(long, default_value_t = 20)]
    fault_every_seconds: u64,
    /// chaos: `kill -9` process faults in the window (default: one per 2 minutes, at
    /// least 2; alternating the leader and both replicas).
    #[arg(long)]
    process_faults: Option<usize>,
    /// chaos: how long to wait for the fleet to settle after the window, in seconds.
    #[arg(long, default_value_t = 300)]
    settle_seconds: u64,
    /// chaos: the quiet window after settling, in seconds (no write may happen in it).
    /// Settled: every invariant holds and nothing was written for 12 s, longer than the hub
    /// holds back a spoke's status or observation that changed again soon after a write.
    #[arg(long, default_value_t = 30)]
    quiet_seconds: u64,
    /// chaos: the replicas' `--removal-policy` (default `orphan`, the hub's own default).
    #[arg(long, default_value = "orphan")]
    removal_policy: String,
    /// failover, chaos: hub replicas (real processes, leader election on; default 3 in
    /// failover, 2 in chaos).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=16))]
    replicas: Option<u16>,
    /// failover, chaos: how the replicas share the fleet; `sharded` passes `--shard-mode
    /// sharded` to every replica, `leader` passes nothing (the hub's default).
    #[arg(long, value_enum, default_value_t = BenchShardMode::Leader)]
    shard_mode: BenchShardMode,
    /// failover: the replicas' `--lease-duration-seconds` (also the double-write window).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=3600))]
    lease_duration_seconds: u64,
    /// failover, chaos: one more flag for every replica, as it is (repeat it; e.g.
    /// `--hub-arg=--shard-weight=20`).
    #[arg(long = "hub-arg", value_name = "FLAG", allow_hyphen_values = true)]
    hub_args: Vec<String>,
    /// failover with --shard-mode sharded: each replica's --shard-weight, in order, one per
    /// replica (e.g. `100,1,1`: hub-0 serves ~98 % of the spokes, the others a sliver, so
    /// their CPU at converge is what a replica costs by itself on this fleet).
    #[arg(long, value_name = "W,W,...", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=100))]
    replica_weights: Vec<u32>,
    /// failover with --shard-mode sharded: run only the first K of the --replicas replicas;
    /// the bench holds the others' replica Leases (renewed, showing the running replicas'
    /// view), so the K replicas own the share they would own among all of them with no
    /// other replica on these cores: what a replica costs on a machine of its own. Ends once
    /// their share converged (no status wait, kill or trickle); prints their CPU and the
    /// fleet's CPU at that cost per spoke.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u16).range(1..=15))]
    running_replicas: Option<u16>,
    /// failover with --running-replicas: the bench also holds the leader Lease, so no
    /// running replica leads (none builds and writes the fleet report, as all but one of
    /// the replicas do not).
    #[arg(long)]
    stand_in_leads: bool,
}

/// `--shard-mode` of the failover scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BenchShardMode {
    /// One Lease leader serves every spoke.
    Leader,
    /// Every replica serves its share of the spokes.
    Sharded,
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
    if !args.replica_weights.is_empty() && args.scenario != Scenario::Failover {
        anyhow::bail!("--replica-weights is a flag of --scenario failover only");
    }
    if args.running_replicas.is_some() && args.scenario != Scenario::Failover {
        anyhow::bail!("--running-replicas is a flag of --scenario failover only");
    }
    if args.stand_in_leads && args.running_replicas.is_none() {
        anyhow::bail!("--stand-in-leads needs --running-replicas");
    }
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

    /// Runs `fut` to completion, failing fast (checked every second) if a child hub dies.
    async fn while_alive<F: std::future::Future>(&mut self, fut: F) -> anyhow::Result<F::Output> {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                r = &mut fut => return Ok(r),
                _ = tokio::time::sleep(Duration::from_secs(1)) => self.check_alive()?,
            }
        }
    }

    /// The hub's `/metrics` text (`None` if it could not be read).
    async fn metrics(&self) -> Option<String> {
        match self {
            Hub::Process(p) => p.metrics().await,
            Hub::InProcess(h) => {
                let resp = kleym_hub::http::metrics::metrics_response(&h.handle.registry);
                let body = resp.into_body().collect().await.ok()?.to_bytes();
                String::from_utf8(body.to_vec()).ok()
            }
        }
    }

    /// Spokes per phase, for an error message.
    async fn phases(&self) -> BTreeMap<String, usize> {
        match self {
            Hub::InProcess(h) => {
                h.handle
                    .state
                    .spokes()
                    .iter()
                    .fold(BTreeMap::new(), |mut acc, s| {
                        *acc.entry(s.phase.as_str().to_string()).or_insert(0) += 1;
                        acc
                    })
            }
            Hub::Process(p) => p
                .metrics()
                .await
                .map(|m| metric_by_label(&m, "kleym_hub_spokes", "phase"))
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, v)| *v > 0.0)
                .map(|(k, v)| (k, v as usize))
                .collect(),
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
    stores: Vec<Arc<Cluster>>,
    counters: Vec<Arc<CountingAuthenticator>>,
    provider_file: PathBuf,
    /// The plugin's count file, opened before any exec (it appends to the same inode), so
    /// it can be read even when kubesim has used up this process's fds.
    count_file: std::fs::File,
}

impl Fleet {
    /// The spokes' names as the hub knows them (`<profile namespace>/<name>`).
    fn hub_names(&self) -> Vec<String> {
        self.names
            .iter()
            .map(|n| format!("{PROFILE_NS}/{n}"))
            .collect()
    }
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
    let mut stores = Vec::with_capacity(n);
    for name in &names {
        let s = f.spoke(name);
        counters.push(CountingAuthenticator::install(&s));
        // kleym's own admission policy bounds the hub's user, as `kleym trust-config` prints it.
        install_admission_policy(&s, &[COUNTING_USER.to_string()], TRUST_DOMAIN)
            .map_err(anyhow::Error::msg)?;
        env::seed_environment(&s.store(), m).map_err(anyhow::Error::msg)?;
        stores.push(s.store());
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
        stores,
        counters,
        provider_file,
        count_file,
    })
}

/// Creates bindings `0..m` in every store, interleaved across spokes (binding 0 everywhere,
/// then binding 1, ...), on a blocking thread: the creates are synchronous store writes and
/// must not hold up the runtime's threads (kubesim's servers and the watches run there).
/// Returns when each was created, per spoke and binding, and how long it all took.
async fn create_bindings(
    stores: &[Arc<Cluster>],
    m: usize,
) -> anyhow::Result<(Vec<Vec<Instant>>, Duration)> {
    let stores = stores.to_vec();
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let mut created = vec![Vec::with_capacity(m); stores.len()];
        for i in 0..m {
            for (store, row) in stores.iter().zip(created.iter_mut()) {
                env::create_bindings(store, i..i + 1).map_err(anyhow::Error::msg)?;
                row.push(Instant::now());
            }
        }
        Ok((created, started.elapsed()))
    })
    .await?
}

/// Starts the convergence watches of every spoke (from the stores' current state).
fn watch_all(
    stores: &[Arc<Cluster>],
    m: usize,
    limit: Duration,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<SpokeProgress>>> {
    let names = Arc::new(Names::new(m));
    stores
        .iter()
        .map(|s| convergence::watch_spoke(s, names.clone(), limit).map_err(anyhow::Error::msg))
        .collect()
}

/// Where the bench learns that a spoke engaged.
enum EngageSource {
    /// A child hub's log (`spoke engaged` lines).
    Log(LogTail),
    /// An in-process hub's fleet state.
    State(FleetState),
}

/// When the bench saw each spoke engaged, and its request count then.
struct Engagement {
    at: Vec<Option<Instant>>,
    requests: Vec<Option<u64>>,
    /// The child hub's figures when the last spoke was seen engaged.
    hub_usage: Option<ProcUsage>,
}

/// Follows `source` until every spoke (by its hub name) was seen engaged, or `limit`.
async fn track_engagement(
    mut source: EngageSource,
    hub_names: Vec<String>,
    counters: Vec<Arc<CountingAuthenticator>>,
    hub_reader: Option<ProcReader>,
    limit: Duration,
) -> anyhow::Result<Engagement> {
    let n = hub_names.len();
    let index: HashMap<&str, usize> = hub_names
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();
    let mut e = Engagement {
        at: vec![None; n],
        requests: vec![None; n],
        hub_usage: None,
    };
    let mut left = n;
    let deadline = tokio::time::Instant::now() + limit;
    let mut changes = match &source {
        EngageSource::State(s) => Some(s.subscribe()),
        EngageSource::Log(_) => None,
    };
    while left > 0 {
        let seen: Vec<usize> = match &mut source {
            EngageSource::Log(tail) => tail
                .new_lines()?
                .iter()
                .filter_map(|l| engaged_spoke(l).and_then(|s| index.get(s).copied()))
                .collect(),
            EngageSource::State(state) => (0..n)
                .filter(|&i| {
                    e.at[i].is_none()
                        && state
                            .get(&hub_names[i])
                            .is_some_and(|s| s.phase == Phase::Engaged)
                })
                .collect(),
        };
        for i in seen {
            if e.at[i].is_none() {
                // The count first: it is the figure that moves fastest.
                e.requests[i] = Some(counters[i].count());
                e.at[i] = Some(Instant::now());
                left -= 1;
            }
        }
        if left == 0 || tokio::time::Instant::now() >= deadline {
            break;
        }
        match &mut changes {
            // Scan on the next state change, but at most every 10 ms (a change during the
            // pause is kept by the receiver and ends the wait at once).
            Some(rx) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                tokio::select! {
                    r = rx.changed() => if r.is_err() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    },
                    _ = tokio::time::sleep_until(deadline) => {}
                }
            }
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    e.hub_usage = hub_reader.and_then(|r| r.read().ok());
    Ok(e)
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.scenario == Scenario::Chaos {
        return run_chaos(args).await;
    }
    if args.scenario == Scenario::Failover {
        return run_failover(args).await;
    }
    let limit = Duration::from_secs(args.timeout_seconds);
    let kleym = match args.hub {
        HubMode::Process => Some(find_kleym(args.kleym_bin.as_deref())?),
        HubMode::InProcess => None,
    };
    let dir = std::env::temp_dir().join(format!("fleet-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (n, m) = (args.spokes.unwrap_or(100), args.bindings.unwrap_or(100));
    println!(
        "fleet-bench: {n} spokes x {m} bindings, scenario {} (hub {:?}, concurrency {}, spoke concurrency {})",
        args.scenario.as_str(),
        args.hub,
        args.concurrency,
        args.spoke_concurrency
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
    // Cold start: every binding exists, and is watched, before the hub starts.
    let trickle_plan = match args.scenario {
        Scenario::Trickle => {
            let plan = trickle::plan(n, m, usize::try_from(args.duration_seconds.unwrap_or(60))?);
            trickle::seed_objectives(&fleet.stores, &plan).map_err(anyhow::Error::msg)?;
            plan
        }
        Scenario::ColdStart | Scenario::NewBindings | Scenario::Chaos | Scenario::Failover => {
            Vec::new()
        }
    };
    let cold_watchers = match args.scenario {
        Scenario::ColdStart | Scenario::Trickle => {
            let (_, took) = create_bindings(&fleet.stores, m).await?;
            println!(
                "bindings created before the hub starts: {} in {took:.1?}",
                n * m
            );
            Some(watch_all(&fleet.stores, m, limit)?)
        }
        Scenario::NewBindings | Scenario::Chaos | Scenario::Failover => None,
    };

    let flags: Vec<String> = vec![
        "--clusterprofile-provider-file".into(),
        fleet.provider_file.display().to_string(),
        "--trust-domain".into(),
        TRUST_DOMAIN.into(),
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
    let (mut hub, source, hub_reader) = match &kleym {
        Some(k) => {
            let mut flags = flags;
            flags.extend([
                "--log-level".into(),
                args.hub_log_level.as_str().to_string(),
            ]);
            let p = HubProcess::spawn(k, &fleet.f.hub_kubeconfig(), &flags, &log_path)?;
            println!("hub pid {}, log {}", p.pid(), log_path.display());
            let tail = LogTail::new(std::fs::File::open(&log_path)?);
            let reader = ProcReader::open(Proc::Pid(p.pid())).ok();
            (Hub::Process(p), EngageSource::Log(tail), reader)
        }
        None => {
            let h = fleet
                .f
                .start_hub(&flags)
                .await
                .map_err(anyhow::Error::msg)?;
            let state = h.handle.state.clone();
            (Hub::InProcess(h), EngageSource::State(state), None)
        }
    };
    let mut procs = vec![Proc::SelfProcess];
    if let Hub::Process(p) = &hub {
        procs.push(Proc::Pid(p.pid()));
    }
    let fds = FdPeakSampler::start(&procs, Duration::from_millis(250));
    let ctx = Measure {
        fleet: &fleet,
        scenario: args.scenario,
        n,
        m,
        limit,
        hub_started,
        bench_cpu_at_start,
        self_reader: &self_reader,
        fds: &fds,
    };
    let measured = match ctx
        .measure(&mut hub, source, hub_reader, cold_watchers)
        .await
    {
        Ok(()) if args.scenario == Scenario::Trickle => {
            run_trickle(&mut hub, &fleet, &trickle_plan, limit).await
        }
        other => other,
    };
    match measured {
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

/// The trickle phase on the converged fleet (see [`trickle`]).
async fn run_trickle(
    hub: &mut Hub,
    fleet: &Fleet,
    plan: &[trickle::Step],
    limit: Duration,
) -> anyhow::Result<()> {
    let hub_names = fleet.hub_names();
    let writes = |mt: Option<String>| {
        mt.map(|mt| {
            writes_by_spoke(&mt, &hub_names)
                .iter()
                .flat_map(|k| k.values())
                .sum::<u64>()
        })
    };
    let before = writes(hub.metrics().await);
    println!(
        "trickle: {} new bindings, one per second on a random spoke",
        plan.len()
    );
    let result = hub
        .while_alive(trickle::run(
            &fleet.stores,
            plan,
            Duration::from_secs(1),
            limit,
        ))
        .await?
        .map_err(anyhow::Error::msg)?;
    // Let the status applies that follow each ClusterSPIFFEID land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = writes(hub.metrics().await);
    let lat = &result.latencies;
    let writes_per_binding = match (before, after) {
        (Some(b), Some(a)) => format!(
            "{:.2}",
            a.saturating_sub(b) as f64 / result.created.max(1) as f64
        ),
        _ => "?".to_string(),
    };
    println!(
        "trickle: binding -> ClusterSPIFFEID p50 {:.0?}, p99 {:.0?}, max {:.0?} ({} of {} seen); hub writes per new binding {writes_per_binding}",
        percentile(lat, 0.50),
        percentile(lat, 0.99),
        lat.last().copied().unwrap_or_default(),
        lat.len(),
        result.created,
    );
    println!(
        "trickle summary: bindings={} seen={} p50_ms={} p99_ms={} max_ms={} writes_per_binding={writes_per_binding}",
        result.created,
        lat.len(),
        percentile(lat, 0.50).as_millis(),
        percentile(lat, 0.99).as_millis(),
        lat.last().copied().unwrap_or_default().as_millis(),
    );
    if lat.len() != plan.len() {
        anyhow::bail!(
            "trickle: {} of {} new bindings got no ClusterSPIFFEID within {limit:?}",
            plan.len() - lat.len(),
            plan.len()
        );
    }
    Ok(())
}

/// What the measurement phase needs.
struct Measure<'a> {
    fleet: &'a Fleet,
    scenario: Scenario,
    n: usize,
    m: usize,
    limit: Duration,
    hub_started: Instant,
    bench_cpu_at_start: f64,
    self_reader: &'a ProcReader,
    fds: &'a FdPeakSampler,
}

/// Writes per spoke by kind, from the hub's `kleym_spoke_api_writes_total{cluster,write}`.
fn writes_by_spoke(metrics: &str, hub_names: &[String]) -> Vec<BTreeMap<String, u64>> {
    let index: HashMap<&str, usize> = hub_names
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();
    let mut out = vec![BTreeMap::new(); hub_names.len()];
    for (labels, v) in metric_series(metrics, "kleym_spoke_api_writes_total") {
        let label = |k: &str| {
            labels
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.as_str())
        };
        if let (Some(cluster), Some(kind)) = (label("cluster"), label("write"))
            && let Some(&i) = index.get(cluster)
        {
            *out[i].entry(kind.to_string()).or_insert(0) += v as u64;
        }
    }
    out
}

impl Measure<'_> {
    async fn measure(
        &self,
        hub: &mut Hub,
        source: EngageSource,
        hub_reader: Option<ProcReader>,
        cold_watchers: Option<Vec<tokio::task::JoinHandle<SpokeProgress>>>,
    ) -> anyhow::Result<()> {
        let (n, m, limit) = (self.n, self.m, self.limit);
        let hub_names = self.fleet.hub_names();
        let engagement = track_engagement(
            source,
            hub_names.clone(),
            self.fleet.counters.clone(),
            hub_reader,
            limit,
        );
        // Cold start: engagement and convergence overlap (a spoke's reconciler starts on its
        // synced caches); new bindings: every spoke engaged first, then the bindings.
        let (engagement, joined, created, converge_from) = match cold_watchers {
            Some(watchers) => {
                let (e, j) = hub
                    .while_alive(futures::future::join(
                        engagement,
                        futures::future::join_all(watchers),
                    ))
                    .await?;
                (e?, j, None, self.hub_started)
            }
            None => {
                let e = hub.while_alive(engagement).await??;
                self.check_engaged(hub, &e).await?;
                let watchers = watch_all(&self.fleet.stores, m, limit)?;
                let first_create = Instant::now();
                let (created, took) = create_bindings(&self.fleet.stores, m).await?;
                println!(
                    "bindings created in {took:.1?} ({} total, on a blocking thread)",
                    n * m
                );
                let j = hub.while_alive(futures::future::join_all(watchers)).await?;
                (e, j, Some(created), first_create)
            }
        };
        self.check_engaged(hub, &engagement).await?;
        let time_to_engage = engagement
            .at
            .iter()
            .flatten()
            .max()
            .map(|t| t.saturating_duration_since(self.hub_started))
            .unwrap_or_default();
        let hub_usage = hub.usage();
        let bench_usage = self.self_reader.read();
        let mut progress = Vec::with_capacity(n);
        for j in joined {
            progress.push(j?);
        }
        let converged_at: Vec<Vec<Option<Instant>>> =
            progress.iter().map(SpokeProgress::converged_at).collect();
        let last = converged_at.iter().flatten().flatten().max().copied();
        let converge = last
            .map(|t| t.saturating_duration_since(converge_from))
            .unwrap_or_default();
        let converged = converged_at.iter().flatten().flatten().count();

        // Latency origin: hub start (cold start) or each binding's creation.
        let origin = |s: usize, i: usize| match &created {
            Some(c) => c[s][i],
            None => self.hub_started,
        };
        let latencies = |times: &dyn Fn(usize) -> Vec<Option<Instant>>| {
            let mut lat: Vec<Duration> = (0..n)
                .flat_map(|s| {
                    times(s)
                        .into_iter()
                        .enumerate()
                        .filter_map(move |(i, t)| Some(t?.saturating_duration_since(origin(s, i))))
                })
                .collect();
            lat.sort();
            lat
        };
        let lat = latencies(&|s| converged_at[s].clone());
        let lat_csid = latencies(&|s| progress[s].csid_at().to_vec());

        // Requests, with writes by kind from the hub's own counters.
        let metrics = hub.metrics().await;
        let writes = metrics.as_deref().map(|mt| writes_by_spoke(mt, &hub_names));
        let requests_total: Vec<u64> = self.fleet.counters.iter().map(|c| c.count()).collect();
        let requests_engage: Vec<u64> = engagement.requests.iter().flatten().copied().collect();
        let avg = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
        let per_spoke = |x: u64| x as f64 / n.max(1) as f64;
        let execs = read_all_at(&self.fleet.count_file).map(|s| s.lines().count());

        let origin_name = match self.scenario {
            Scenario::ColdStart | Scenario::Trickle => "hub start",
            Scenario::NewBindings | Scenario::Chaos | Scenario::Failover => "first binding created",
        };
        let lat_from = match self.scenario {
            Scenario::ColdStart | Scenario::Trickle => "from hub start",
            Scenario::NewBindings | Scenario::Chaos | Scenario::Failover => "from its creation",
        };
        println!("time to engage {n} spokes: {time_to_engage:.1?}");
        println!(
            "time to converge ({origin_name} -> last binding Ready with its ClusterSPIFFEID): {converge:.1?}; converged {converged} of {} bindings",
            n * m
        );
        let fmt_lat = |l: &[Duration]| {
            format!(
                "p50 {:.0?}, p99 {:.0?}, max {:.0?}",
                percentile(l, 0.50),
                percentile(l, 0.99),
                l.last().copied().unwrap_or_default()
            )
        };
        println!(
            "binding latency {lat_from}: to converged (Ready + ClusterSPIFFEID) {}; to ClusterSPIFFEID {}",
            fmt_lat(&lat),
            fmt_lat(&lat_csid)
        );
        let total_writes: Option<u64> = writes
            .as_ref()
            .map(|w| w.iter().flat_map(|k| k.values()).sum());
        let writes_kind = |kind: &str| {
            writes
                .as_ref()
                .map(|w| w.iter().filter_map(|k| k.get(kind)).sum::<u64>())
        };
        let split = match total_writes {
            Some(w) => {
                let total: u64 = requests_total.iter().sum();
                let mut kinds = String::new();
                for (kind, label) in [
                    ("finalizer", "finalizer"),
                    ("clusterspiffeid_apply", "ClusterSPIFFEID apply"),
                    ("status_apply", "status apply"),
                    ("clusterspiffeid_delete", "ClusterSPIFFEID delete"),
                ] {
                    let k = writes_kind(kind).unwrap_or(0);
                    if k > 0 || kind != "clusterspiffeid_delete" {
                        let _ = write!(kinds, ", {:.1} {label}", per_spoke(k));
                    }
                }
                format!(
                    " = {:.1} reads (preflight, discovery, lists, watches) + {:.1} writes ({})",
                    per_spoke(total.saturating_sub(w)),
                    per_spoke(w),
                    kinds.trim_start_matches(", ")
                )
            }
            None => " (writes unknown: the hub's /metrics was unreadable)".to_string(),
        };
        println!(
            "API requests per spoke: {:.1} to engage (read as each spoke was seen engaged), {:.1} in total (max {}){split}",
            avg(&requests_engage),
            avg(&requests_total),
            requests_total.iter().max().copied().unwrap_or(0),
        );
        println!(
            "credential execs per spoke: {}",
            match &execs {
                Ok(e) => format!("{:.2} ({e} total)", per_spoke(*e as u64)),
                Err(e) => format!("unknown (count file unreadable: {e})"),
            }
        );
        let mib = |u: &Option<ProcUsage>, f: fn(&ProcUsage) -> u64| {
            u.as_ref().map_or("?".into(), |u| (f(u) / 1024).to_string())
        };
        let mut hub_summary = String::new();
        match (&*hub, hub_usage) {
            (Hub::Process(p), Some(Ok(u))) => {
                let hub_fds = self
                    .fds
                    .peak(Proc::Pid(p.pid()))
                    .max(u.open_fds.unwrap_or(0));
                let at_engage = engagement.hub_usage;
                println!(
                    "hub process (kleym, pid {}): peak RSS {} MiB (VmHWM; {} MiB when every spoke was seen engaged, {} MiB at converge), CPU {:.2} s user+sys ({} s of it until every spoke was engaged), open fds peak {hub_fds} ({:.1} per spoke; {} at converge)",
                    p.pid(),
                    u.peak_rss_mib(),
                    mib(&at_engage, |u| u.rss_kib),
                    u.rss_kib / 1024,
                    u.cpu_seconds,
                    at_engage.map_or("?".into(), |u| format!("{:.2}", u.cpu_seconds)),
                    hub_fds as f64 / n.max(1) as f64,
                    u.open_fds.map_or("?".into(), |n| n.to_string())
                );
                let _ = write!(
                    hub_summary,
                    " hub_peak_rss_mib={} hub_cpu_s={:.2} hub_fds_peak={hub_fds}",
                    u.peak_rss_mib(),
                    u.cpu_seconds
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
        match &bench_usage {
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

        // The watches decide when; a listing confirms the end state.
        let mut wrong: Vec<String> = Vec::new();
        for (s, p) in progress.iter().enumerate() {
            for (i, what) in p.missing() {
                wrong.push(format!(
                    "{}: {}/{}: {what}",
                    self.fleet.names[s],
                    env::NS,
                    env::binding_name(i)
                ));
            }
        }
        if wrong.is_empty() {
            for store in &self.fleet.stores {
                wrong.extend(convergence::verify_listed(store, m));
            }
        }

        let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| format!("{:.2}", per_spoke(v)));
        println!(
            "summary: scenario={} spokes={n} bindings_per_spoke={m} converged={converged} engage_s={:.3} converge_s={:.3} p50_ms={} p99_ms={} max_ms={} requests_to_engage={:.2} requests_total={:.2} reads={} writes={} writes_finalizer={} writes_csid_apply={} writes_status_apply={} execs={}{hub_summary}",
            self.scenario.as_str(),
            time_to_engage.as_secs_f64(),
            converge.as_secs_f64(),
            percentile(&lat, 0.50).as_millis(),
            percentile(&lat, 0.99).as_millis(),
            lat.last().copied().unwrap_or_default().as_millis(),
            avg(&requests_engage),
            avg(&requests_total),
            opt(total_writes.map(|w| requests_total.iter().sum::<u64>().saturating_sub(w))),
            opt(total_writes),
            opt(writes_kind("finalizer")),
            opt(writes_kind("clusterspiffeid_apply")),
            opt(writes_kind("status_apply")),
            match &execs {
                Ok(e) => format!("{:.2}", per_spoke(*e as u64)),
                Err(_) => "?".into(),
            },
        );
        if !wrong.is_empty() {
            let shown = wrong
                .iter()
                .take(20)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n  ");
            anyhow::bail!(
                "{} problems among the {} bindings (converged = Ready for their generation with their ClusterSPIFFEID) {}; first ones:\n  {shown}",
                wrong.len(),
                n * m,
                if converged == n * m {
                    "in the final listing although the watches saw them converge"
                } else {
                    "after the watches ended (all converged or the time limit)"
                }
            );
        }
        Ok(())
    }

    /// Fails, with the hub's phases, unless every spoke was seen engaged.
    async fn check_engaged(&self, hub: &Hub, e: &Engagement) -> anyhow::Result<()> {
        let missing: Vec<&str> =
            e.at.iter()
                .zip(&self.fleet.names)
                .filter(|(at, _)| at.is_none())
                .map(|(_, name)| name.as_str())
                .collect();
        if missing.is_empty() {
            return Ok(());
        }
        anyhow::bail!(
            "{} of {} spokes were not seen engaged within {:?} (first: {:?}); phases on the hub: {:?}",
            missing.len(),
            self.n,
            self.limit,
            &missing[..missing.len().min(5)],
            hub.phases().await
        )
    }
}

/// `--scenario chaos`: see `kleym_e2e::chaos`. Exits non-zero when any invariant is
/// violated (after the report and its `summary:` line).
async fn run_chaos(args: Args) -> anyhow::Result<()> {
    let kleym = find_kleym(args.kleym_bin.as_deref())?;
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!("seed: {seed} (replay with --seed {seed})");
    println!("hub binary: {} ({})", kleym.display(), age(&kleym));
    let dir = std::env::temp_dir().join(format!("fleet-bench-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // The seed and the report are kept with the replicas' logs, so a failed run can be read
    // and replayed even when its console output was cut or lost.
    std::fs::write(dir.join("seed"), format!("{seed}\n"))?;
    let mut o = kleym_e2e::chaos::ChaosOptions::new(
        seed,
        args.spokes.unwrap_or(50),
        args.bindings.unwrap_or(40),
        Duration::from_secs(args.duration_seconds.unwrap_or(600)),
        &kleym,
        &dir,
    );
    o.churn_per_second = args.churn_per_second;
    o.fault_every = Duration::from_secs(args.fault_every_seconds);
    o.process_faults = args.process_faults;
    o.settle_limit = Duration::from_secs(args.settle_seconds);
    o.quiet = Duration::from_secs(args.quiet_seconds);
    o.concurrency = args.concurrency;
    o.spoke_concurrency = args.spoke_concurrency;
    o.log_level = args.hub_log_level.as_str().to_string();
    o.removal_policy = args.removal_policy.clone();
    if let Some(r) = args.replicas {
        o.replicas = usize::from(r);
    }
    if args.shard_mode == BenchShardMode::Sharded {
        o.hub_args
            .extend(["--shard-mode".to_string(), "sharded".to_string()]);
    }
    o.hub_args.extend(args.hub_args.iter().cloned());
    let report = kleym_e2e::chaos::run(&o, &|line| println!("{line}")).await?;
    let text = report.to_string();
    println!("{text}");
    std::fs::write(dir.join("report.txt"), &text)?;
    let violations = report.violations.total();
    if violations > 0 {
        anyhow::bail!(
            "{violations} invariant violations (seed {seed}); report and hub logs kept in {}",
            dir.display()
        );
    }
    if args.keep_dir {
        println!("kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// `--scenario failover`: see `kleym_e2e::failover`. Exits non-zero when a binding created
/// after the kill did not converge or a double write was seen (after the report and its
/// `summary:` line).
async fn run_failover(args: Args) -> anyhow::Result<()> {
    use kleym_e2e::failover::{FailoverOptions, ShardMode};
    let kleym = find_kleym(args.kleym_bin.as_deref())?;
    println!("hub binary: {} ({})", kleym.display(), age(&kleym));
    let dir = std::env::temp_dir().join(format!("fleet-bench-failover-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut o = FailoverOptions::new(
        args.spokes.unwrap_or(100),
        args.bindings.unwrap_or(4),
        usize::from(args.replicas.unwrap_or(3)),
        &kleym,
        &dir,
    );
    o.shard_mode = match args.shard_mode {
        BenchShardMode::Leader => ShardMode::Leader,
        BenchShardMode::Sharded => ShardMode::Sharded,
    };
    o.hub_args = args.hub_args.clone();
    if !args.replica_weights.is_empty() {
        if o.shard_mode != ShardMode::Sharded {
            anyhow::bail!(
                "--replica-weights needs --shard-mode sharded (leader mode has no weights)"
            );
        }
        if args.replica_weights.len() != o.replicas {
            anyhow::bail!(
                "--replica-weights: {} weights for {} replicas (give one per replica)",
                args.replica_weights.len(),
                o.replicas
            );
        }
        o.weights = args.replica_weights.clone();
    }
    if let Some(k) = args.running_replicas {
        if o.shard_mode != ShardMode::Sharded {
            anyhow::bail!(
                "--running-replicas needs --shard-mode sharded (in leader mode one replica runs every spoke)"
            );
        }
        if usize::from(k) >= o.replicas {
            anyhow::bail!(
                "--running-replicas {k}: must be below --replicas ({}), which counts the replicas the bench stands in for too",
                o.replicas
            );
        }
    }
    o.lease_seconds = args.lease_duration_seconds;
    o.concurrency = args.concurrency;
    o.spoke_concurrency = args.spoke_concurrency;
    o.log_level = args.hub_log_level.as_str().to_string();
    o.limit = Duration::from_secs(args.timeout_seconds);
    if let Some(d) = args.duration_seconds {
        o.trickle_for = Duration::from_secs(d);
    }
    if let Some(k) = args.running_replicas {
        return run_share_alone(&o, usize::from(k), args.stand_in_leads, &dir, args.keep_dir).await;
    }
    let weights = if o.weights.is_empty() {
        String::new()
    } else {
        let w: Vec<String> = o.weights.iter().map(u32::to_string).collect();
        format!(", weights {}", w.join(","))
    };
    println!(
        "fleet-bench: {} spokes x {} bindings, scenario failover ({} replicas, {} mode{weights}, lease {} s)",
        o.spokes,
        o.bindings,
        o.replicas,
        o.shard_mode.as_str(),
        o.lease_seconds
    );
    let result = kleym_e2e::failover::run(&o, &|line| println!("{line}")).await;
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("replicas' logs kept in {}", dir.display());
            return Err(e.into());
        }
    };
    print!("{report}");
    println!("{}", report.summary());
    if !report.complete() || report.double_writes > 0 {
        anyhow::bail!(
            "failover: {} of {} failover bindings and {} of {} trickle bindings converged, {} double writes; logs kept in {}",
            report.failover.len(),
            report.failover_created,
            report.survivors.len(),
            report.survivors_created,
            report.double_writes,
            dir.display()
        );
    }
    if args.keep_dir {
        println!("kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// `--scenario failover --running-replicas K`: see `kleym_e2e::share_alone`.
async fn run_share_alone(
    o: &kleym_e2e::failover::FailoverOptions,
    running: usize,
    stand_in_leads: bool,
    dir: &std::path::Path,
    keep_dir: bool,
) -> anyhow::Result<()> {
    println!(
        "fleet-bench: {} spokes x {} bindings, scenario failover, {running} of {} sharded replicas running (the bench holds the others' Leases), lease {} s",
        o.spokes, o.bindings, o.replicas, o.lease_seconds
    );
    match kleym_e2e::share_alone::run(o, running, stand_in_leads, &|line| println!("{line}")).await
    {
        Ok(report) => {
            print!("{report}");
            println!("{}", report.summary());
            if keep_dir {
                println!("kept {}", dir.display());
            } else {
                let _ = std::fs::remove_dir_all(dir);
            }
            Ok(())
        }
        Err(e) => {
            eprintln!("replicas' logs kept in {}", dir.display());
            Err(e.into())
        }
    }
}
