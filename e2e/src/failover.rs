//! `fleet-bench --scenario failover`: R real `kleym hub` replicas on one fleet; converge,
//! `kill -9` one replica that serves spokes, and measure how fast its spokes come back.
//!
//! 1. N spokes × M bindings exist before the replicas start (as in cold-start); the R
//!    replicas (`--instance hub-0..hub-R-1`, leader election on, the same flags, plus
//!    `--shard-mode sharded` when asked, plus any `--hub-arg`) converge them.
//! 2. Who serves which spoke is read from each spoke's own request log: the replica named in
//!    the `User-Agent` of its latest request ([`crate::fixtures::writers`]), not from what
//!    the hub says. That gives each replica's share of the spokes. Then the wait for the
//!    hub's status objects to describe the whole fleet ([`crate::fixtures::hub_status`]):
//!    the replicas' CPU at that moment is the cold start's, status writes included.
//! 3. A baseline trickle (new bindings on random spokes, one every `trickle_interval`)
//!    measures the usual latency.
//! 4. The victim is killed with SIGKILL: in leader mode the Lease holder, in sharded mode
//!    the replica serving the most spokes. At once, one new binding on each of up to 10 of
//!    its spokes (the failover bindings: creation to ClusterSPIFFEID is the time to
//!    converge across the hand-over), and a trickle on the spokes the survivors serve (their
//!    latency during the hand-over; none in leader mode, where the leader serves every spoke).
//! 5. From the spokes' logs: when a survivor first reached each of the victim's spokes, each
//!    replica's share afterwards, and the double writes over the whole run (see
//!    [`crate::fixtures::writers::double_writes`], window = the Lease duration).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kubesim_store::Cluster;
use serde_json::json;

use crate::chaos::replicas::Replicas;
use crate::fixtures::convergence::{self, Names};
use crate::fixtures::counting::{CountingAuthenticator, counting_token};
use crate::fixtures::env;
use crate::fixtures::harness::FleetHarness;
use crate::fixtures::hub_status;
use crate::fixtures::plugins::static_token_plugin;
use crate::fixtures::profiles::{access_provider, apply_profile, status};
use crate::fixtures::trickle::{self, Step};
use crate::fixtures::writers::{self, ReplicaWrite};

/// How the replicas share the fleet (`--shard-mode` of `kleym hub`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardMode {
    /// One Lease leader serves every spoke (the hub's default; no flag is passed).
    Leader,
    /// Every replica serves its share (`--shard-mode sharded` is passed).
    Sharded,
}

impl ShardMode {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            ShardMode::Leader => "leader",
            ShardMode::Sharded => "sharded",
        }
    }
}

/// How a failover run is shaped.
#[derive(Clone, Debug)]
pub struct FailoverOptions {
    /// Spokes.
    pub spokes: usize,
    /// Bindings per spoke before the kill.
    pub bindings: usize,
    /// Hub replicas.
    pub replicas: usize,
    /// Leader or sharded.
    pub shard_mode: ShardMode,
    /// More flags for every replica.
    pub hub_args: Vec<String>,
    /// Sharded mode: replica `i`'s `--shard-weight` (empty: every replica's default). Uneven
    /// weights load one replica while the others hold a sliver, which separates what a
    /// replica costs by itself from the cost of its share of the spokes.
    pub weights: Vec<u32>,
    /// The replicas' `--lease-duration-seconds` (also the double-write window).
    pub lease_seconds: u64,
    /// Hub `--concurrency`.
    pub concurrency: u16,
    /// Hub `--spoke-concurrency`.
    pub spoke_concurrency: u16,
    /// Hub `--log-level`.
    pub log_level: String,
    /// Time between two trickle bindings.
    pub trickle_interval: Duration,
    /// Trickle bindings before the kill (the baseline).
    pub baseline_bindings: usize,
    /// How long the trickle on the survivors' spokes runs after the kill.
    pub trickle_for: Duration,
    /// Limit of each wait (converge, bindings after the kill).
    pub limit: Duration,
    /// The `kleym` binary.
    pub kleym: PathBuf,
    /// Work directory (kubeconfigs, plugin, the replicas' logs).
    pub dir: PathBuf,
}

impl FailoverOptions {
    /// Defaults for `n` spokes × `m` bindings on `replicas` replicas.
    pub fn new(n: usize, m: usize, replicas: usize, kleym: &Path, dir: &Path) -> Self {
        Self {
            spokes: n,
            bindings: m,
            replicas,
            shard_mode: ShardMode::Leader,
            hub_args: Vec::new(),
            weights: Vec::new(),
            lease_seconds: 15,
            concurrency: 32,
            spoke_concurrency: 4,
            log_level: "info".into(),
            trickle_interval: Duration::from_millis(500),
            baseline_bindings: 10,
            trickle_for: Duration::from_secs(25),
            limit: Duration::from_secs(900),
            kleym: kleym.to_path_buf(),
            dir: dir.to_path_buf(),
        }
    }
}

/// Why a failover run could not be carried out or did not converge.
#[derive(Debug, thiserror::Error)]
pub enum FailoverError {
    /// Setting up the fleet or a replica failed.
    #[error("failover setup: {0}")]
    Setup(String),
    /// A replica could not be started or killed, or died by itself.
    #[error("failover hub replica: {0}")]
    Hub(#[from] crate::fixtures::hub_process::HubProcessError),
    /// Bindings did not converge in time.
    #[error("failover: {0}")]
    NotConverged(String),
}

/// What a failover run measured.
#[derive(Debug, Clone)]
pub struct FailoverReport {
    /// The options' shape.
    pub spokes: usize,
    /// Bindings per spoke before the kill.
    pub bindings: usize,
    /// Replicas started.
    pub replicas: usize,
    /// Leader or sharded.
    pub shard_mode: ShardMode,
    /// The Lease duration.
    pub lease_seconds: u64,
    /// Replicas start → every binding Ready with its ClusterSPIFFEID.
    pub converge: Duration,
    /// Spokes per replica (`--instance`) at converge, from the spokes' logs.
    pub share_before: BTreeMap<String, usize>,
    /// Spokes per replica at the end.
    pub share_after: BTreeMap<String, usize>,
    /// The Lease holder's `--instance` at the kill.
    pub leader: Option<String>,
    /// The killed replica's `--instance`.
    pub victim: String,
    /// Spokes it served.
    pub victim_spokes: usize,
    /// Baseline trickle latencies (creation → ClusterSPIFFEID), sorted.
    pub baseline: Vec<Duration>,
    /// Failover bindings' latencies (creation, at the kill → ClusterSPIFFEID), sorted.
    pub failover: Vec<Duration>,
    /// Failover bindings created.
    pub failover_created: usize,
    /// Trickle latencies on the survivors' spokes during the hand-over, sorted.
    pub survivors: Vec<Duration>,
    /// Trickle bindings created on the survivors' spokes.
    pub survivors_created: usize,
    /// Kill → a survivor's first request to each of the victim's spokes, sorted.
    pub takeover: Vec<Duration>,
    /// Double writes over the whole run, and the spokes with any.
    pub double_writes: usize,
    /// Spokes with a double write.
    pub double_write_spokes: usize,
    /// The first few double writes, described.
    pub double_write_examples: Vec<String>,
    /// Per replica: `--instance`, peak RSS (MiB), CPU seconds.
    pub usage: Vec<(String, u64, f64)>,
    /// The same, read when the fleet had converged (before the kill: what a replica needs
    /// for its share, and the CPU of the cold start).
    pub usage_at_converge: Vec<(String, u64, f64)>,
    /// Replicas start → the hub's status objects describe the converged fleet (see
    /// [`crate::fixtures::hub_status`]).
    pub status_complete: Duration,
    /// Per replica, read at that moment: the cold start's CPU including its status
    /// writes, which a replica may still owe when the last binding converges.
    pub usage_at_status: Vec<(String, u64, f64)>,
}

/// The value at quantile `p` of sorted `v` (zero when empty).
pub fn percentile(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx.min(v.len() - 1)]
}

fn fmt_lat(v: &[Duration]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    format!(
        "p50 {:.0?}, p99 {:.0?}, max {:.0?} (n={})",
        percentile(v, 0.5),
        percentile(v, 0.99),
        v.last().copied().unwrap_or_default(),
        v.len()
    )
}

fn fmt_share(share: &BTreeMap<String, usize>, n: usize) -> String {
    share
        .iter()
        .map(|(r, k)| format!("{r}:{:.1}", 100.0 * *k as f64 / n.max(1) as f64))
        .collect::<Vec<_>>()
        .join(",")
}

impl FailoverReport {
    /// Whether every binding created after the kill converged.
    pub fn complete(&self) -> bool {
        self.failover.len() == self.failover_created
            && self.survivors.len() == self.survivors_created
    }

    /// The `summary: key=value ...` line (times in seconds, latencies in milliseconds,
    /// shares in percent of the spokes).
    pub fn summary(&self) -> String {
        let ms = |d: Duration| d.as_millis();
        let mut s = format!(
            "summary: scenario=failover shard_mode={} replicas={} spokes={} bindings_per_spoke={} lease_s={} converge_s={:.3} victim={} victim_spokes={} failover_bindings={} failover_converged={} failover_p50_ms={} failover_max_ms={} takeover_max_ms={} baseline_p99_ms={} survivors_bindings={} survivors_converged={} survivors_p99_ms={} survivors_max_ms={} double_writes={} double_write_spokes={} share_before={} share_after={}",
            self.shard_mode.as_str(),
            self.replicas,
            self.spokes,
            self.bindings,
            self.lease_seconds,
            self.converge.as_secs_f64(),
            self.victim,
            self.victim_spokes,
            self.failover_created,
            self.failover.len(),
            ms(percentile(&self.failover, 0.5)),
            ms(self.failover.last().copied().unwrap_or_default()),
            ms(self.takeover.last().copied().unwrap_or_default()),
            ms(percentile(&self.baseline, 0.99)),
            self.survivors_created,
            self.survivors.len(),
            ms(percentile(&self.survivors, 0.99)),
            ms(self.survivors.last().copied().unwrap_or_default()),
            self.double_writes,
            self.double_write_spokes,
            fmt_share(&self.share_before, self.spokes),
            fmt_share(&self.share_after, self.spokes),
        );
        let peak = self.usage.iter().map(|u| u.1).max().unwrap_or(0);
        let cpu: f64 = self.usage.iter().map(|u| u.2).sum();
        let _ = write!(s, " hub_peak_rss_mib_max={peak} hub_cpu_s_total={cpu:.2}");
        let peak = self
            .usage_at_converge
            .iter()
            .map(|u| u.1)
            .max()
            .unwrap_or(0);
        let cpu: f64 = self.usage_at_converge.iter().map(|u| u.2).sum();
        let _ = write!(
            s,
            " converge_peak_rss_mib_max={peak} converge_cpu_s_total={cpu:.2}"
        );
        let cpu: f64 = self.usage_at_status.iter().map(|u| u.2).sum();
        let _ = write!(
            s,
            " status_complete_s={:.3} status_cpu_s_total={cpu:.2}",
            self.status_complete.as_secs_f64()
        );
        s
    }
}

impl fmt::Display for FailoverReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.spokes;
        writeln!(
            f,
            "converged {} spokes x {} bindings on {} replicas ({} mode) in {:.1?}",
            n,
            self.bindings,
            self.replicas,
            self.shard_mode.as_str(),
            self.converge
        )?;
        writeln!(
            f,
            "spokes per replica at converge (the replica of the latest request in each spoke's log): {}",
            fmt_share(&self.share_before, n).replace(',', "%, ") + "%"
        )?;
        writeln!(
            f,
            "killed {} (Lease holder: {}), which served {} spokes",
            self.victim,
            self.leader.as_deref().unwrap_or("unknown"),
            self.victim_spokes
        )?;
        writeln!(
            f,
            "baseline trickle before the kill: {}",
            fmt_lat(&self.baseline)
        )?;
        writeln!(
            f,
            "failover bindings (created at the kill on the victim's spokes) -> ClusterSPIFFEID: {} of {} converged; {}",
            self.failover.len(),
            self.failover_created,
            fmt_lat(&self.failover)
        )?;
        writeln!(
            f,
            "kill -> a survivor's first request to each victim spoke: {}",
            fmt_lat(&self.takeover)
        )?;
        writeln!(
            f,
            "trickle on the survivors' spokes during the hand-over: {} of {} converged; {}",
            self.survivors.len(),
            self.survivors_created,
            fmt_lat(&self.survivors)
        )?;
        writeln!(
            f,
            "spokes per replica at the end: {}",
            fmt_share(&self.share_after, n).replace(',', "%, ") + "%"
        )?;
        writeln!(
            f,
            "double writes (a replica writing again within {} s of its own last write after another replica wrote): {} on {} spokes",
            self.lease_seconds, self.double_writes, self.double_write_spokes
        )?;
        for e in &self.double_write_examples {
            writeln!(f, "    {e}")?;
        }
        for (name, rss, cpu) in &self.usage_at_converge {
            writeln!(
                f,
                "replica {name} at converge: peak RSS {rss} MiB, CPU {cpu:.2} s user+sys"
            )?;
        }
        writeln!(
            f,
            "hub status objects complete (report and every ClusterIdentityStatus) after {:.1?}",
            self.status_complete
        )?;
        for (name, rss, cpu) in &self.usage_at_status {
            writeln!(
                f,
                "replica {name} at status complete: peak RSS {rss} MiB, CPU {cpu:.2} s user+sys"
            )?;
        }
        for (name, rss, cpu) in &self.usage {
            writeln!(
                f,
                "replica {name}: peak RSS {rss} MiB, CPU {cpu:.2} s user+sys"
            )?;
        }
        Ok(())
    }
}

/// The fleet: spokes with their environment, profiles, the plugin's provider file.
pub(crate) struct Fleet {
    pub(crate) f: FleetHarness,
    pub(crate) names: Vec<String>,
    pub(crate) stores: Vec<Arc<Cluster>>,
    pub(crate) provider_file: PathBuf,
}

pub(crate) async fn setup(o: &FailoverOptions) -> Result<Fleet, FailoverError> {
    let err = |e: String| FailoverError::Setup(e);
    let names: Vec<String> = (0..o.spokes).map(|i| format!("spoke-{i:04}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let f = FleetHarness::start_with(&refs, &o.dir, needs_shared_port(o.spokes))
        .await
        .map_err(err)?;
    let plugin = static_token_plugin(&o.dir, "bench.sh", &counting_token(), None)
        .map_err(|e| err(e.to_string()))?;
    let provider_file = o.dir.join("providers.json");
    std::fs::write(
        &provider_file,
        json!({"providers": [{"name": "bench", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": plugin.to_str()}}]})
        .to_string(),
    )
    .map_err(|e| err(e.to_string()))?;
    let mut stores = Vec::with_capacity(o.spokes);
    for name in &names {
        let s = f.spoke(name);
        CountingAuthenticator::install(&s);
        let store = s.store();
        env::seed_environment(&store, o.bindings).map_err(err)?;
        env::create_bindings(&store, 0..o.bindings).map_err(err)?;
        stores.push(store);
    }
    let results = futures::stream::iter(names.iter().map(|name| {
        let s = f.spoke(name);
        let hub = f.hub_client.clone();
        async move {
            apply_profile(
                &hub,
                name,
                status(
                    vec![access_provider("bench", &s, None)],
                    true,
                    "2026-01-01T00:00:00Z",
                    &[],
                ),
            )
            .await
            .map_err(|e| format!("ClusterProfile {name}: {e}"))
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<_>>()
    .await;
    for r in results {
        r.map_err(err)?;
    }
    Ok(Fleet {
        f,
        names,
        stores,
        provider_file,
    })
}

/// The flags every replica gets (each adds its `--instance`, `--namespace` and own flags).
pub(crate) fn replica_flags(o: &FailoverOptions, fleet: &Fleet) -> Vec<String> {
    let mut flags: Vec<String> = vec![
        "--clusterprofile-provider-file".into(),
        fleet.provider_file.display().to_string(),
        "--trust-domain".into(),
        "bench.example".into(),
        "--lease-duration-seconds".into(),
        o.lease_seconds.to_string(),
        "--concurrency".into(),
        o.concurrency.to_string(),
        "--spoke-concurrency".into(),
        o.spoke_concurrency.to_string(),
        "--log-level".into(),
        o.log_level.clone(),
    ];
    if o.shard_mode == ShardMode::Sharded {
        flags.extend(["--shard-mode".into(), "sharded".into()]);
    }
    flags.extend(o.hub_args.iter().cloned());
    flags
}

/// Replica `i`'s `--instance` (`hub-<i>`).
pub(crate) fn instance_name(i: usize) -> String {
    format!("hub-{i}")
}

/// The replicas `range` of `o`: each `--instance` with its own flags (its `--shard-weight`).
pub(crate) fn replica_instances(
    o: &FailoverOptions,
    range: std::ops::Range<usize>,
) -> Vec<(String, Vec<String>)> {
    range
        .map(|i| {
            let own = o
                .weights
                .get(i)
                .map(|w| vec!["--shard-weight".to_string(), w.to_string()])
                .unwrap_or_default();
            (instance_name(i), own)
        })
        .collect()
}

/// Whether the simulated spokes must share one port: a socket each, plus a connection each
/// from the replica engaging it, would pass this process's open-file limit.
pub fn needs_shared_port(spokes: usize) -> bool {
    open_file_limit().is_some_and(|limit| 2 * spokes as u64 + 1024 > limit)
}

/// The soft open-file limit of this process (Linux: `/proc/self/limits`).
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Runs `fut`, checking every second that the replicas that should run still do.
async fn while_running<F: std::future::Future>(
    hubs: &mut Replicas,
    fut: F,
) -> Result<F::Output, FailoverError> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            r = &mut fut => return Ok(r),
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                hubs.check_running()?;
                hubs.observe_leader();
                hubs.sample();
            }
        }
    }
}

/// Polls the hub's store until its status objects describe `spokes` with `bindings` ready
/// bindings each; `None` then, or what was still missing at `limit`.
async fn wait_for_status(
    hub: &Cluster,
    spokes: &[String],
    bindings: usize,
    limit: Duration,
) -> Option<String> {
    let deadline = Instant::now() + limit;
    loop {
        let gap = hub_status::status_gap(hub, spokes, bindings)?;
        if Instant::now() >= deadline {
            return Some(gap);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The next free binding index of each spoke (the bench's own bindings are `0..m`).
struct Counters(Vec<usize>);

impl Counters {
    fn step(&mut self, spoke: usize) -> Step {
        let binding = self.0[spoke];
        self.0[spoke] += 1;
        Step { spoke, binding }
    }
}

/// `count` steps over `spokes`, round-robin from a random start.
fn spread(counters: &mut Counters, spokes: &[usize], count: usize) -> Vec<Step> {
    if spokes.is_empty() {
        return Vec::new();
    }
    let start = (rand::random::<u64>() % spokes.len() as u64) as usize;
    (0..count)
        .map(|k| counters.step(spokes[(start + k) % spokes.len()]))
        .collect()
}

/// The replica serving each spoke: the one named in its latest request.
pub(crate) fn serving(fleet: &Fleet) -> Vec<Option<String>> {
    fleet
        .names
        .iter()
        .map(|n| writers::last_replica(&fleet.f.spoke(n).requests().entries()).map(str::to_string))
        .collect()
}

/// Spokes per replica `--instance` (identities mapped through `hubs`).
fn share_of(hubs: &Replicas, owners: &[Option<String>]) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = (0..hubs.len())
        .map(|i| (hubs.instance(i).to_string(), 0))
        .collect();
    for o in owners {
        let key = match o {
            Some(id) => hubs
                .index_of(id)
                .map_or_else(|| id.clone(), |i| hubs.instance(i).to_string()),
            None => "none".to_string(),
        };
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// Runs the failover scenario. `progress` receives a line per phase.
pub async fn run(
    o: &FailoverOptions,
    progress: &dyn Fn(&str),
) -> Result<FailoverReport, FailoverError> {
    let t = Instant::now();
    let fleet = setup(o).await?;
    progress(&format!(
        "setup ({} spokes x {} bindings, profiles{}): {:.1?}",
        o.spokes,
        o.bindings,
        if needs_shared_port(o.spokes) {
            "; the spokes share one port: a socket each would pass the open-file limit"
        } else {
            ""
        },
        t.elapsed()
    ));
    let names = Arc::new(Names::new(o.bindings));
    let mut watchers = Vec::with_capacity(o.spokes);
    for s in &fleet.stores {
        watchers.push(
            convergence::watch_spoke(s, names.clone(), o.limit).map_err(FailoverError::Setup)?,
        );
    }
    let flags = replica_flags(o, &fleet);
    let instances = replica_instances(o, 0..o.replicas);
    let started = Instant::now();
    let mut hubs = Replicas::start_named_with_flags(
        &o.kleym,
        &fleet.f.hub_kubeconfig(),
        flags,
        &o.dir,
        fleet.f.hub.store(),
        instances,
    )?;
    let joined = while_running(&mut hubs, futures::future::join_all(watchers)).await?;
    let mut converged_at = None;
    let mut missing = Vec::new();
    for (name, j) in fleet.names.iter().zip(joined) {
        let p = j.map_err(|e| FailoverError::Setup(e.to_string()))?;
        for (i, what) in p.missing() {
            missing.push(format!("{name}: {}: {what}", env::binding_name(i)));
        }
        converged_at = converged_at.max(p.converged_at().into_iter().flatten().max());
    }
    if !missing.is_empty() {
        hubs.stop().await;
        return Err(FailoverError::NotConverged(format!(
            "{} bindings did not converge within {:?}; first: {:?}",
            missing.len(),
            o.limit,
            &missing[..missing.len().min(5)]
        )));
    }
    let converge = converged_at.map_or(Duration::ZERO, |t| t.saturating_duration_since(started));
    progress(&format!("converged after {converge:.1?}"));
    hubs.sample();
    let usage_at_converge = hubs.per_replica();
    // Printed now too: a run stopped before the kill still has them.
    progress(&format!(
        "replicas at converge: CPU {:.2} s user+sys in all, peak RSS {} MiB at most",
        usage_at_converge.iter().map(|u| u.2).sum::<f64>(),
        usage_at_converge.iter().map(|u| u.1).max().unwrap_or(0)
    ));

    // Who serves which spoke, from the spokes' own logs.
    let owners = serving(&fleet);
    let share_before = share_of(&hubs, &owners);
    progress(&format!(
        "spokes per replica: {}",
        fmt_share(&share_before, o.spokes)
    ));

    // The cold start's remaining work: the status objects of the whole fleet.
    let hub_store = fleet.f.hub.store();
    let gap = while_running(
        &mut hubs,
        wait_for_status(&hub_store, &fleet.names, o.bindings, o.limit),
    )
    .await?;
    if let Some(gap) = gap {
        hubs.stop().await;
        return Err(FailoverError::NotConverged(format!(
            "the hub's status objects did not describe the converged fleet within {:?}: {gap}",
            o.limit
        )));
    }
    let status_complete = started.elapsed();
    hubs.sample();
    let usage_at_status = hubs.per_replica();
    progress(&format!(
        "hub status complete after {status_complete:.1?}; replicas then: CPU {:.2} s user+sys in all, peak RSS {} MiB at most",
        usage_at_status.iter().map(|u| u.2).sum::<f64>(),
        usage_at_status.iter().map(|u| u.1).max().unwrap_or(0)
    ));

    // The new bindings' objectives, before any of them is created.
    let mut counters = Counters(vec![o.bindings; o.spokes]);
    let all: Vec<usize> = (0..o.spokes).collect();
    let baseline_plan = spread(&mut counters, &all, o.baseline_bindings);
    hubs.observe_leader();
    let leader = hubs.leader();
    let victim = match (o.shard_mode, leader) {
        (ShardMode::Leader, Some(l)) => l,
        _ => {
            // The replica serving the most spokes.
            let mut per: BTreeMap<usize, usize> = BTreeMap::new();
            for id in owners.iter().flatten() {
                if let Some(i) = hubs.index_of(id) {
                    *per.entry(i).or_insert(0) += 1;
                }
            }
            per.into_iter()
                .max_by_key(|(i, k)| (*k, std::cmp::Reverse(*i)))
                .map(|(i, _)| i)
                .ok_or_else(|| FailoverError::Setup("no replica wrote to any spoke".to_string()))?
        }
    };
    let victim_name = hubs.instance(victim).to_string();
    let serves = |id: &Option<String>| id.as_deref().and_then(|id| hubs.index_of(id));
    let victim_spokes: Vec<usize> = (0..o.spokes)
        .filter(|&s| serves(&owners[s]) == Some(victim))
        .collect();
    let victim_ids: Vec<String> = owners
        .iter()
        .flatten()
        .filter(|id| hubs.index_of(id) == Some(victim))
        .cloned()
        .collect();
    let survivor_spokes: Vec<usize> = (0..o.spokes)
        .filter(|&s| serves(&owners[s]).is_some_and(|r| r != victim))
        .collect();
    let failover_plan = spread(&mut counters, &victim_spokes, victim_spokes.len().min(10));
    let per_second = 1.0 / o.trickle_interval.as_secs_f64().max(0.001);
    let survivor_plan = spread(
        &mut counters,
        &survivor_spokes,
        (o.trickle_for.as_secs_f64() * per_second).round() as usize,
    );
    let mut objectives = baseline_plan.clone();
    objectives.extend(&failover_plan);
    objectives.extend(&survivor_plan);
    trickle::seed_objectives(&fleet.stores, &objectives).map_err(FailoverError::Setup)?;

    let baseline = while_running(
        &mut hubs,
        trickle::run(&fleet.stores, &baseline_plan, o.trickle_interval, o.limit),
    )
    .await?
    .map_err(FailoverError::Setup)?;
    progress(&format!(
        "baseline trickle: {}",
        fmt_lat(&baseline.latencies)
    ));

    progress(&format!(
        "killing {victim_name} (serves {} spokes) at {}; {} failover bindings, {} trickle bindings on the survivors' spokes",
        victim_spokes.len(),
        // Wall clock, to line the kill up with the replicas' logs.
        chrono::Utc::now().format("%H:%M:%S%.3f"),
        failover_plan.len(),
        survivor_plan.len()
    ));
    let killed_at = tokio::time::Instant::now();
    hubs.kill(victim).await?;
    let (failover, survivors) = while_running(
        &mut hubs,
        futures::future::join(
            trickle::run(&fleet.stores, &failover_plan, Duration::ZERO, o.limit),
            trickle::run(&fleet.stores, &survivor_plan, o.trickle_interval, o.limit),
        ),
    )
    .await?;
    let failover = failover.map_err(FailoverError::Setup)?;
    let survivors = survivors.map_err(FailoverError::Setup)?;

    // Let the status writes that follow each ClusterSPIFFEID land before reading the logs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    hubs.sample();
    let logs: Vec<Vec<kubesim::LoggedRequest>> = fleet
        .names
        .iter()
        .map(|n| fleet.f.spoke(n).requests().entries())
        .collect();
    let mut takeover: Vec<Duration> = victim_spokes
        .iter()
        .filter_map(|&s| {
            logs[s]
                .iter()
                .filter(|r| r.at >= killed_at)
                .find(|r| {
                    r.user_agent
                        .as_deref()
                        .and_then(writers::replica_of)
                        .is_some_and(|id| !victim_ids.iter().any(|v| v == id))
                })
                .map(|r| r.at.saturating_duration_since(killed_at))
        })
        .collect();
    takeover.sort();
    let writes: Vec<Vec<ReplicaWrite>> = logs.iter().map(|l| writers::replica_writes(l)).collect();
    let owners_after: Vec<Option<String>> = logs
        .iter()
        .map(|l| writers::last_replica(l).map(str::to_string))
        .collect();
    let window = Duration::from_secs(o.lease_seconds);
    let mut double_writes = 0;
    let mut double_write_spokes = 0;
    let mut examples = Vec::new();
    for (name, w) in fleet.names.iter().zip(&writes) {
        let d = writers::double_writes(w, window);
        if !d.is_empty() {
            double_write_spokes += 1;
            double_writes += d.len();
            for x in d.iter().take(5usize.saturating_sub(examples.len())) {
                examples.push(format!(
                    "{name}: {} wrote, {} wrote {:.1?} later, {} again {:.1?} after its first",
                    x.replica,
                    x.other,
                    x.other_at.saturating_duration_since(x.first),
                    x.replica,
                    x.again.saturating_duration_since(x.first)
                ));
            }
        }
    }
    let report = FailoverReport {
        spokes: o.spokes,
        bindings: o.bindings,
        replicas: o.replicas,
        shard_mode: o.shard_mode,
        lease_seconds: o.lease_seconds,
        converge,
        share_before,
        share_after: share_of(&hubs, &owners_after),
        leader: leader.map(|l| hubs.instance(l).to_string()),
        victim: victim_name,
        victim_spokes: victim_spokes.len(),
        baseline: baseline.latencies,
        failover: failover.latencies,
        failover_created: failover.created,
        survivors: survivors.latencies,
        survivors_created: survivors.created,
        takeover,
        double_writes,
        double_write_spokes,
        double_write_examples: examples,
        usage: hubs.per_replica(),
        usage_at_converge,
        status_complete,
        usage_at_status,
    };
    hubs.stop().await;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_gives_each_spoke_its_next_binding_in_turn() {
        let mut c = Counters(vec![5; 4]);
        let steps = spread(&mut c, &[1, 3], 5);
        assert_eq!(steps.len(), 5);
        for s in [1, 3] {
            let mine: Vec<usize> = steps
                .iter()
                .filter(|st| st.spoke == s)
                .map(|st| st.binding)
                .collect();
            assert_eq!(mine, (5..5 + mine.len()).collect::<Vec<_>>());
        }
        assert!(steps.iter().all(|st| st.spoke == 1 || st.spoke == 3));
        assert!(spread(&mut c, &[], 3).is_empty());
        // The counters moved on: a later plan never reuses a binding.
        let later = spread(&mut c, &[1], 1);
        assert_eq!(
            later[0].binding,
            5 + steps.iter().filter(|s| s.spoke == 1).count()
        );
    }

    #[test]
    fn the_summary_carries_every_figure() {
        let r = FailoverReport {
            spokes: 4,
            bindings: 2,
            replicas: 2,
            shard_mode: ShardMode::Leader,
            lease_seconds: 15,
            converge: Duration::from_millis(1500),
            share_before: BTreeMap::from([("hub-0".into(), 4), ("hub-1".into(), 0)]),
            share_after: BTreeMap::from([("hub-0".into(), 0), ("hub-1".into(), 4)]),
            leader: Some("hub-0".into()),
            victim: "hub-0".into(),
            victim_spokes: 4,
            baseline: vec![Duration::from_millis(10)],
            failover: vec![Duration::from_millis(9000), Duration::from_millis(12000)],
            failover_created: 2,
            survivors: vec![],
            survivors_created: 0,
            takeover: vec![Duration::from_millis(8000)],
            double_writes: 0,
            double_write_spokes: 0,
            double_write_examples: vec![],
            usage: vec![("hub-0".into(), 50, 1.0), ("hub-1".into(), 40, 0.5)],
            usage_at_converge: vec![("hub-0".into(), 30, 0.25), ("hub-1".into(), 20, 0.5)],
            status_complete: Duration::from_millis(4250),
            usage_at_status: vec![("hub-0".into(), 35, 0.5), ("hub-1".into(), 25, 0.75)],
        };
        assert!(r.complete());
        let s = r.summary();
        for kv in [
            "scenario=failover",
            "shard_mode=leader",
            "converge_s=1.500",
            "victim=hub-0",
            "failover_max_ms=12000",
            "takeover_max_ms=8000",
            "share_before=hub-0:100.0,hub-1:0.0",
            "share_after=hub-0:0.0,hub-1:100.0",
            "double_writes=0",
            "hub_peak_rss_mib_max=50",
            "hub_cpu_s_total=1.50",
            "converge_peak_rss_mib_max=30",
            "converge_cpu_s_total=0.75",
            "status_complete_s=4.250",
            "status_cpu_s_total=1.25",
        ] {
            assert!(s.contains(kv), "{kv} missing in {s}");
        }
        assert!(r.to_string().contains("killed hub-0 (Lease holder: hub-0)"));
    }
}
