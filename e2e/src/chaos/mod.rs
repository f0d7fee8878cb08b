//! The chaos soak: a fleet on kubesim, two real `kleym hub` replicas with leader election,
//! seeded churn and faults for a window, then a settled fleet checked against an oracle.
//!
//! - [`schedule`]: one RNG seeded with the seed draws every event before the run.
//! - [`churn`]: what users do (bindings, objectives, pools, foreign ClusterSPIFFEIDs,
//!   ClusterProfiles, invalid and hostile objects), applied straight to the stores.
//! - [`faults`]: kubesim and credential-plugin fault windows per spoke, process faults on
//!   the replicas.
//! - [`replicas`]: the two hub processes, `kill -9` and restart, the Lease holder.
//! - [`oracle`]: what the final objects imply, with the pure compiler.
//! - [`invariants`]: the checks, in violations; the hub's report objects are graded with
//!   [`crate::report_oracle`], which shares no code with the hub's report.
//! - [`report`]: the figures and the `summary:` line.
//!
//! `fleet-bench --scenario chaos` and `e2e/tests/chaos_short.rs` run it.

pub mod churn;
pub mod faults;
pub mod invariants;
pub mod oracle;
pub mod replicas;
pub mod report;
pub mod schedule;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kleym_api::external::clusterprofile::ClusterProfile;
use kube::api::{Api, Patch, PatchParams};
use kubesim::LoggedRequest;
use kubesim_store::Cluster;
use serde_json::json;

use crate::fixtures::admission::install_admission_policy;
use crate::fixtures::counting::{COUNTING_USER, CountingAuthenticator, counting_token};
use crate::fixtures::env;
use crate::fixtures::harness::{FleetHarness, HUB_NS, grant_admin};
use crate::fixtures::hub_process::HubProcessError;
use crate::fixtures::plugins::{chaos_plugin, plugin_fault_key, plugin_faults_fired};
use crate::fixtures::profiles::{
    PROFILE_NS, access_provider, apply_profile, delete_profile, status,
};
use churn::{Applied, Change, ChurnOp};
use faults::{ProcessFault, SpokeFault};
use invariants::{SpokeView, Violations};
use replicas::Replicas;
use report::ChaosReport;
use schedule::{Action, Schedule, ScheduleOptions, ShardedOptions};

/// The trust domain the replicas compile with.
pub const TRUST_DOMAIN: &str = "chaos.example";

/// How a chaos run is shaped.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    /// The seed of the schedule.
    pub seed: u64,
    /// Spokes.
    pub spokes: usize,
    /// Bindings per spoke at the start.
    pub bindings: usize,
    /// The window of churn and faults.
    pub duration: Duration,
    /// Churn operations per second over the fleet.
    pub churn_per_second: f64,
    /// Mean time between two fault windows of one spoke.
    pub fault_every: Duration,
    /// Process faults in the window (`None`: one per 2 minutes, at least 2).
    pub process_faults: Option<usize>,
    /// How long to wait for the fleet to settle after the window.
    pub settle_limit: Duration,
    /// The quiet window after settling (no write may happen in it).
    pub quiet: Duration,
    /// The `kleym` binary.
    pub kleym: PathBuf,
    /// Hub `--concurrency`.
    pub concurrency: u16,
    /// Hub `--spoke-concurrency`.
    pub spoke_concurrency: u16,
    /// Hub `--lease-duration-seconds`.
    pub lease_seconds: u64,
    /// Hub `--log-level`.
    pub log_level: String,
    /// Hub `--removal-policy` (default `orphan`, the hub's own default). Under `orphan`, a
    /// binding deleted while its profile was deleted (its spoke released) leaves its
    /// ClusterSPIFFEID until the spoke is engaged again, which sweeps it.
    pub removal_policy: String,
    /// Work directory (kubeconfigs, plugin, the replicas' logs).
    pub dir: PathBuf,
    /// Hub replicas (default 2).
    pub replicas: usize,
    /// More flags for every replica (e.g. `--shard-mode sharded`).
    pub hub_args: Vec<String>,
}

impl ChaosOptions {
    /// Defaults for `n` spokes × `m` bindings over `duration`, with `kleym` and `dir`.
    pub fn new(
        seed: u64,
        n: usize,
        m: usize,
        duration: Duration,
        kleym: &Path,
        dir: &Path,
    ) -> Self {
        Self {
            seed,
            spokes: n,
            bindings: m,
            duration,
            churn_per_second: 5.0,
            fault_every: Duration::from_secs(20),
            process_faults: None,
            settle_limit: Duration::from_secs(300),
            quiet: Duration::from_secs(30),
            kleym: kleym.to_path_buf(),
            concurrency: 32,
            spoke_concurrency: 4,
            lease_seconds: 4,
            log_level: "info".into(),
            removal_policy: "orphan".into(),
            dir: dir.to_path_buf(),
            replicas: replicas::INSTANCES.len(),
            hub_args: Vec::new(),
        }
    }

    /// Whether the replicas run in sharded mode (`--shard-mode sharded` among
    /// [`ChaosOptions::hub_args`]).
    pub fn sharded(&self) -> bool {
        self.hub_args
            .windows(2)
            .any(|w| w[0] == "--shard-mode" && w[1] == "sharded")
            || self.hub_args.iter().any(|a| a == "--shard-mode=sharded")
    }

    fn schedule_options(&self) -> ScheduleOptions {
        ScheduleOptions {
            seed: self.seed,
            spokes: self.spokes,
            bindings: self.bindings,
            duration: self.duration,
            churn_per_second: self.churn_per_second,
            fault_every: self.fault_every,
            process_faults: self
                .process_faults
                .unwrap_or_else(|| ((self.duration.as_secs() / 120) as usize).max(2)),
            sharded: (self.sharded() && self.replicas >= 2).then(|| ShardedOptions {
                replicas: self.replicas,
                lease: Duration::from_secs(self.lease_seconds),
            }),
        }
    }
}

/// Why a chaos run could not be carried out (violations are not errors: they are the
/// report).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// Setting the fleet up failed.
    #[error("chaos setup: {0}")]
    Setup(String),
    /// A hub replica could not be started or killed, or died by itself.
    #[error("chaos hub replica: {0}")]
    Hub(#[from] HubProcessError),
    /// A profile change on the hub cluster failed.
    #[error("chaos: ClusterProfile {name}: {source}")]
    Profile {
        /// The profile.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// No replica took the Lease.
    #[error("no hub replica took the Lease {lease} within {limit:?}; logs: {logs:?}")]
    NoLeader {
        /// The Lease.
        lease: &'static str,
        /// The wait.
        limit: Duration,
        /// The replicas' logs.
        logs: Vec<PathBuf>,
    },
}

/// The fleet under test.
struct World {
    f: FleetHarness,
    names: Vec<String>,
    stores: Vec<Arc<Cluster>>,
    provider_file: PathBuf,
    /// Where the plugin fault files are (see [`chaos_plugin`]).
    plugin_faults: PathBuf,
    /// Foreign ClusterSPIFFEIDs the churn created, per spoke: name → resourceVersion.
    foreign: Vec<BTreeMap<String, String>>,
    /// Profiles to add back once their deleted predecessor is gone (the hub's removal
    /// finalizer holds a deleted profile until the spoke is released).
    pending_add: BTreeSet<usize>,
}

/// Lifetime of the chaos plugin's tokens: short enough that every spoke's credential is
/// refreshed (the plugin exec'ed) several times in a 10-minute window.
const PLUGIN_TOKEN_LIFETIME_S: u64 = 300;
/// The replicas' `--exec-timeout-seconds`: a hung plugin is killed after this long.
const PLUGIN_EXEC_TIMEOUT_S: u64 = 10;

impl World {
    /// The plugin fault file of spoke `i`.
    fn plugin_fault(&self, i: usize) -> PathBuf {
        self.plugin_faults
            .join(plugin_fault_key(&self.f.spoke(&self.names[i]).url()))
    }

    async fn setup(o: &ChaosOptions) -> Result<Self, ChaosError> {
        let setup = |e: String| ChaosError::Setup(e);
        let names: Vec<String> = (0..o.spokes).map(|i| format!("spoke-{i:03}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let f = FleetHarness::start(&refs, &o.dir).await.map_err(setup)?;
        let plugin_faults = o.dir.join("plugin-faults");
        std::fs::create_dir_all(&plugin_faults).map_err(|e| setup(e.to_string()))?;
        let plugin = chaos_plugin(
            &o.dir,
            "chaos.sh",
            &counting_token(),
            &plugin_faults,
            PLUGIN_TOKEN_LIFETIME_S,
        )
        .map_err(|e| setup(e.to_string()))?;
        let provider_file = o.dir.join("providers.json");
        std::fs::write(
            &provider_file,
            json!({"providers": [{"name": "chaos", "execConfig": {
                "apiVersion": "client.authentication.k8s.io/v1", "command": plugin,
                "provideClusterInfo": true}}]})
            .to_string(),
        )
        .map_err(|e| setup(e.to_string()))?;
        let mut stores = Vec::with_capacity(o.spokes);
        for name in &names {
            let s = f.spoke(name);
            CountingAuthenticator::install(&s);
            // kleym's own admission policy bounds the replicas' user: every write of the run
            // must pass it.
            install_admission_policy(&s, &[COUNTING_USER.to_string()], TRUST_DOMAIN)
                .map_err(setup)?;
            let store = s.store();
            env::seed_environment(&store, o.bindings).map_err(setup)?;
            env::create_bindings(&store, 0..o.bindings).map_err(setup)?;
            stores.push(store);
        }
        let w = Self {
            f,
            names,
            stores,
            provider_file,
            plugin_faults,
            foreign: vec![BTreeMap::new(); o.spokes],
            pending_add: BTreeSet::new(),
        };
        let results = futures::stream::iter((0..o.spokes).map(|i| w.add_profile(i)))
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
        for r in results {
            r?;
        }
        Ok(w)
    }

    /// Adds profile `i` unless its deleted predecessor is still there (then `false`).
    async fn add_profile_if_gone(&self, i: usize) -> Result<bool, ChaosError> {
        let name = &self.names[i];
        let api: Api<ClusterProfile> = Api::namespaced(self.f.hub_client.clone(), PROFILE_NS);
        match api.get_opt(name).await {
            Ok(Some(p)) if p.metadata.deletion_timestamp.is_some() => Ok(false),
            Ok(_) => self.add_profile(i).await.map(|()| true),
            Err(source) => Err(ChaosError::Profile {
                name: name.clone(),
                source,
            }),
        }
    }

    /// Adds the pending profiles whose predecessor is gone.
    async fn add_pending_profiles(&mut self) -> Result<(), ChaosError> {
        for i in std::mem::take(&mut self.pending_add) {
            if !self.add_profile_if_gone(i).await? {
                self.pending_add.insert(i);
            }
        }
        Ok(())
    }

    async fn add_profile(&self, i: usize) -> Result<(), ChaosError> {
        let name = &self.names[i];
        let s = self.f.spoke(name);
        apply_profile(
            &self.f.hub_client,
            name,
            status(
                vec![access_provider("chaos", &s, None)],
                true,
                "2026-01-01T00:00:00Z",
                &[],
            ),
        )
        .await
        .map_err(|source| ChaosError::Profile {
            name: name.clone(),
            source,
        })
    }

    /// Applies one churn op; returns whether the API took it.
    async fn apply(&mut self, op: &ChurnOp) -> Result<bool, ChaosError> {
        let name = self.names[op.spoke].clone();
        let profile_err = |source| ChaosError::Profile {
            name: name.clone(),
            source,
        };
        match &op.change {
            Change::ProfileLabels(labels) => {
                let api: Api<ClusterProfile> =
                    Api::namespaced(self.f.hub_client.clone(), PROFILE_NS);
                // Replace the labels (null removes the keys not in the new set).
                let mut patch = serde_json::Map::new();
                for k in ["region", "tier"] {
                    patch.insert(k.into(), labels.get(k).map_or(json!(null), |v| json!(v)));
                }
                match api
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"metadata": {"labels": patch}})),
                    )
                    .await
                {
                    Ok(_) => Ok(true),
                    // Deleted meanwhile by the churn: nothing to relabel.
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
                    Err(e) => Err(profile_err(e)),
                }
            }
            Change::ProfileDelete => match delete_profile(&self.f.hub_client, &name).await {
                Ok(()) => {
                    self.pending_add.remove(&op.spoke);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
                Err(e) => Err(profile_err(e)),
            },
            Change::ProfileAdd => {
                if !self.add_profile_if_gone(op.spoke).await? {
                    self.pending_add.insert(op.spoke);
                }
                Ok(true)
            }
            change => {
                let r = churn::apply_store(&self.stores[op.spoke], change)
                    .map_err(ChaosError::Setup)?;
                Ok(match r {
                    Applied::Done(Some((fname, rv))) => {
                        self.foreign[op.spoke].insert(fname, rv);
                        true
                    }
                    Applied::Done(None) => {
                        if let Change::Delete { gvp, name, .. } = change
                            && *gvp == churn::CSIDS
                        {
                            self.foreign[op.spoke].remove(name);
                        }
                        true
                    }
                    Applied::Rejected(_) => false,
                })
            }
        }
    }

    /// Checks every invariant but the quiet window.
    fn check(&self) -> (Violations, report::Coverage) {
        let mut v = Violations::default();
        let mut oracles = Vec::with_capacity(self.names.len());
        for (i, name) in self.names.iter().enumerate() {
            let view = SpokeView {
                name,
                store: &self.stores[i],
                foreign: &self.foreign[i],
            };
            oracles.push(invariants::check_spoke(&mut v, &view, TRUST_DOMAIN));
        }
        let pairs: Vec<(&str, &oracle::SpokeOracle)> = self
            .names
            .iter()
            .map(String::as_str)
            .zip(oracles.iter())
            .collect();
        invariants::check_hub(&mut v, &self.f.hub.store(), &pairs);
        let mut c = report::Coverage {
            foreign: self.foreign.iter().map(BTreeMap::len).sum(),
            ..report::Coverage::default()
        };
        for o in &oracles {
            c.bindings += o.expected.len();
            c.csids += o.csids.len();
            for e in o.expected.values() {
                if e.ready {
                    c.ready += 1;
                } else if let Some((_, _, reason)) = e
                    .conditions
                    .iter()
                    .find(|(t, _, _)| t == kleym_api::conditions::READY)
                {
                    *c.refused.entry(reason.clone()).or_insert(0) += 1;
                }
            }
        }
        (v, c)
    }

    /// Stored writes of every cluster (the hub's Lease renewals and Events left out).
    fn writes(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        out.insert(
            "hub".to_string(),
            invariants::writes(
                &self.f.hub.store(),
                &[
                    "leases.coordination.k8s.io",
                    "events",
                    "events.events.k8s.io",
                ],
            ),
        );
        for (name, store) in self.names.iter().zip(&self.stores) {
            out.insert(name.clone(), invariants::writes(store, &[]));
        }
        out
    }
}

/// Runs the chaos scenario and returns its report (violations included). `progress`
/// receives a line per phase.
pub async fn run(o: &ChaosOptions, progress: &dyn Fn(&str)) -> Result<ChaosReport, ChaosError> {
    let schedule = Schedule::draw(&o.schedule_options());
    progress(&format!(
        "chaos: seed {} ({} spokes x {} bindings, {:?} window, {} scheduled events)",
        o.seed,
        o.spokes,
        o.bindings,
        o.duration,
        schedule.events.len()
    ));
    let t = Instant::now();
    let mut w = World::setup(o).await?;
    progress(&format!("setup: {:.1?}", t.elapsed()));
    let flags: Vec<String> = vec![
        "--clusterprofile-provider-file".into(),
        w.provider_file.display().to_string(),
        "--trust-domain".into(),
        TRUST_DOMAIN.into(),
        "--lease-duration-seconds".into(),
        o.lease_seconds.to_string(),
        "--concurrency".into(),
        o.concurrency.to_string(),
        "--spoke-concurrency".into(),
        o.spoke_concurrency.to_string(),
        "--log-level".into(),
        o.log_level.clone(),
        "--removal-policy".into(),
        o.removal_policy.clone(),
        "--exec-timeout-seconds".into(),
        PLUGIN_EXEC_TIMEOUT_S.to_string(),
    ];
    let flags = [flags, o.hub_args.clone()].concat();
    let sharded = o.schedule_options().sharded.is_some();
    // Sharded: every replica has a credential of the hub cluster of its own (the same
    // rights), so that one can be cut from the hub cluster while the others are not.
    let hub_tokens: Vec<Option<String>> = replicas::instances(o.replicas)
        .iter()
        .map(|instance| {
            sharded
                .then(|| replica_hub_token(&w, o.seed, instance))
                .transpose()
        })
        .collect::<Result<_, _>>()
        .map_err(ChaosError::Setup)?;
    let each = replicas::instances(o.replicas)
        .into_iter()
        .zip(&hub_tokens)
        .map(|(instance, token)| match token {
            None => Ok((instance, w.f.hub_kubeconfig())),
            Some(token) => {
                let path = o.dir.join(format!("hub-{instance}.kubeconfig"));
                std::fs::write(
                    &path,
                    w.f.hub
                        .kubeconfig_yaml_with(kubesim::kubeconfig::Credentials::Token(
                            token.clone(),
                        )),
                )
                .map_err(|e| ChaosError::Setup(format!("{}: {e}", path.display())))?;
                Ok((instance, path))
            }
        })
        .collect::<Result<Vec<_>, ChaosError>>()?;
    // The replica that joins late starts with its fault.
    let deferred: Vec<usize> = schedule
        .events
        .iter()
        .filter_map(|e| match e.action {
            Action::Process(ProcessFault::Join { replica }) => Some(replica),
            _ => None,
        })
        .collect();
    let mut hubs = Replicas::start_each(&o.kleym, flags, &o.dir, w.f.hub.store(), each, &deferred)?;
    let limit = Duration::from_secs(60);
    let waited = Instant::now();
    while hubs.leader().is_none() {
        hubs.check_running()?;
        if waited.elapsed() > limit {
            return Err(ChaosError::NoLeader {
                lease: replicas::LEASE,
                limit,
                logs: hubs.logs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    hubs.observe_leader();
    progress(&format!("leader elected after {:.1?}", waited.elapsed()));

    let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut churn: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    let mut restarts: Vec<(Instant, usize)> = Vec::new();
    let mut logs = SpokeLogs::new(w.names.len());
    let mut evidence = ShardEvidence::default();
    // The partition open now: (replica, since).
    let mut partition: Option<(usize, tokio::time::Instant)> = None;
    let token = counting_token();
    // The fault window open on each spoke (the schedule never overlaps two on one spoke).
    let mut open: BTreeMap<usize, SpokeFault> = BTreeMap::new();
    let start = Instant::now();
    let mut next = 0;
    let mut ticks = 0u64;
    let tick = Duration::from_millis(100);
    loop {
        let elapsed = start.elapsed();
        while next < schedule.events.len() && schedule.events[next].at <= elapsed {
            match &schedule.events[next].action {
                Action::Churn(op) => {
                    let took = w.apply(op).await?;
                    let e = churn.entry(op.kind.as_str()).or_insert((0, 0));
                    if took { e.0 += 1 } else { e.1 += 1 }
                }
                Action::FaultStart(win) => {
                    let fh = w.f.spoke(&w.names[win.spoke]).faults();
                    win.fault
                        .start(&fh, &token, &w.plugin_fault(win.spoke))
                        .map_err(ChaosError::Setup)?;
                    *faults.entry(win.fault.kind()).or_insert(0) += 1;
                    open.insert(win.spoke, win.fault.clone());
                }
                Action::FaultEnd(spoke) => SpokeFault::end(
                    &w.f.spoke(&w.names[*spoke]).faults(),
                    &w.plugin_fault(*spoke),
                    open.remove(spoke).as_ref(),
                ),
                Action::Process(pf) => {
                    let (victims, after) = match pf {
                        ProcessFault::KillLeader { restart_after } => {
                            (vec![hubs.leader().unwrap_or(0)], *restart_after)
                        }
                        ProcessFault::KillBoth { restart_after } => {
                            ((0..hubs.len()).collect(), *restart_after)
                        }
                        ProcessFault::KillPause {
                            replica,
                            restart_after,
                        } => {
                            if hubs.is_running(*replica) {
                                evidence.pauses.push(Pause {
                                    instance: hubs.instance(*replica).to_string(),
                                    from: tokio::time::Instant::now(),
                                    until: tokio::time::Instant::now() + *restart_after,
                                });
                            }
                            (vec![*replica], *restart_after)
                        }
                        other => {
                            if shard_fault(other, &mut hubs, &w, &hub_tokens, &mut evidence)? {
                                *faults.entry(other.kind()).or_insert(0) += 1;
                            }
                            if let ProcessFault::HubPartition { replica, .. } = other {
                                partition = Some((*replica, tokio::time::Instant::now()));
                            }
                            (Vec::new(), Duration::ZERO)
                        }
                    };
                    let kill = matches!(
                        pf,
                        ProcessFault::KillLeader { .. }
                            | ProcessFault::KillBoth { .. }
                            | ProcessFault::KillPause { .. }
                    );
                    let mut killed = false;
                    for i in victims {
                        if hubs.kill(i).await? {
                            restarts.push((Instant::now() + after, i));
                            killed = true;
                        }
                    }
                    // Kills of the leader and of both count as scheduled (as they always
                    // did); a pause counts when it killed a running replica.
                    if kill && (killed || !matches!(pf, ProcessFault::KillPause { .. })) {
                        *faults.entry(pf.kind()).or_insert(0) += 1;
                    }
                    if sharded {
                        // When each replica fault struck, to read the replicas' logs by.
                        progress(&format!("{:.1?}: {pf:?}", start.elapsed()));
                    }
                }
                Action::PartitionEnd(replica) if sharded => {
                    progress(&format!(
                        "{:.1?}: partition of replica {replica} ends",
                        start.elapsed()
                    ));
                    end_partition(&w, &hub_tokens, *replica, &mut partition, &mut evidence);
                }
                Action::PartitionEnd(replica) => {
                    end_partition(&w, &hub_tokens, *replica, &mut partition, &mut evidence);
                }
            }
            next += 1;
        }
        w.add_pending_profiles().await?;
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = restarts.into_iter().partition(|(at, _)| *at <= now);
        restarts = later;
        for (_, i) in due {
            hubs.restart(i)?;
        }
        hubs.observe_leader();
        hubs.check_running()?;
        ticks += 1;
        if ticks.is_multiple_of(10) {
            hubs.sample();
            logs.drain(&w);
        }
        if next >= schedule.events.len() && elapsed >= o.duration {
            break;
        }
        tokio::time::sleep(tick).await;
    }

    // Window over: faults clear, churn stops, deleted profiles come back, replicas run.
    hubs.stop_recording();
    for (i, name) in w.names.iter().enumerate() {
        SpokeFault::end(
            &w.f.spoke(name).faults(),
            &w.plugin_fault(i),
            open.remove(&i).as_ref(),
        );
    }
    if let Some((replica, _)) = partition {
        end_partition(&w, &hub_tokens, replica, &mut partition, &mut evidence);
    }
    // A replica that was to join and did not (a window too short) joins now.
    for &i in &deferred {
        hubs.restart(i)?;
    }
    for op in &schedule.restore {
        let took = w.apply(op).await?;
        let e = churn.entry(op.kind.as_str()).or_insert((0, 0));
        if took { e.0 += 1 } else { e.1 += 1 }
    }
    for (_, i) in restarts {
        hubs.restart(i)?;
    }
    let waited = Instant::now();
    while !w.pending_add.is_empty() {
        w.add_pending_profiles().await?;
        if waited.elapsed() > o.settle_limit {
            return Err(ChaosError::Setup(format!(
                "deleted ClusterProfiles of spokes {:?} were not released within {:?}",
                w.pending_add, o.settle_limit
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cleared = Instant::now();
    progress(&format!(
        "window over after {:.1?}: faults cleared, churn stopped; waiting for the fleet to settle",
        start.elapsed()
    ));

    // Settled: every invariant holds and nothing was written for STILL (then the time to
    // settle is that of the last write; fields no invariant compares, such as messages and
    // warnings, may still be converging while the invariants already hold). STILL outlasts
    // the hub's longest designed hold on a write (10 s: a spoke's status or published
    // observation that changes again soon after a write waits that long), so that a held
    // write counts as settling, not as a write in the quiet window. The published
    // observations are invisible to the invariants in leader mode, where the report is
    // built from the leader's own state.
    const STILL: Duration = Duration::from_secs(12);
    let mut settle = None;
    let mut last = Violations::default();
    let mut writes_then = w.writes();
    let mut still_since = Instant::now();
    while cleared.elapsed() < o.settle_limit {
        hubs.observe_leader();
        hubs.check_running()?;
        let writes_now = w.writes();
        if writes_now != writes_then {
            writes_then = writes_now;
            still_since = Instant::now();
        }
        last = w.check().0;
        if last.total() == 0 && still_since.elapsed() >= STILL {
            settle = Some(still_since.saturating_duration_since(cleared));
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        hubs.sample();
        logs.drain(&w);
    }
    match settle {
        Some(d) => progress(&format!("settled {d:.1?} after the last fault")),
        None => progress(&format!(
            "not settled within {:?}: {} violations at the last check",
            o.settle_limit,
            last.total()
        )),
    }

    // Settled means quiet: no write anywhere for the quiet window.
    let before = w.writes();
    let bindings_before: Vec<_> = w
        .stores
        .iter()
        .map(|s| invariants::binding_snapshot(s))
        .collect();
    let leases_before = invariants::replica_leases(&w.f.hub.store(), HUB_NS);
    let quiet_from = Instant::now();
    while quiet_from.elapsed() < o.quiet {
        hubs.observe_leader();
        hubs.check_running()?;
        hubs.sample();
        logs.drain(&w);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    logs.drain(&w);
    let leases_after = invariants::replica_leases(&w.f.hub.store(), HUB_NS);
    let after = w.writes();
    let mut quiet_writes = BTreeMap::new();
    for (cluster, a) in &after {
        let empty = BTreeMap::new();
        for (kind, n) in invariants::writes_between(before.get(cluster).unwrap_or(&empty), a) {
            quiet_writes.insert(format!("{cluster}/{kind}"), n);
        }
    }
    let (mut violations, coverage) = w.check();
    // At most one writer per spoke over the whole run, from the spokes' own logs (every
    // request of a replica, drained as the run went: a spoke's log keeps only its last
    // requests).
    for (name, log) in w.names.iter().zip(&logs.kept) {
        invariants::check_double_writers(
            &mut violations,
            name,
            log,
            Duration::from_secs(o.lease_seconds),
        );
    }
    if sharded {
        let running: Vec<&str> = (0..hubs.len())
            .filter(|i| hubs.is_running(*i))
            .map(|i| hubs.instance(i))
            .collect();
        invariants::check_replica_membership(
            &mut violations,
            &running,
            &leases_before,
            &leases_after,
        );
    }
    let shard_faults_fired = if sharded {
        evidence.fired(&logs.kept)
    } else {
        BTreeMap::new()
    };
    for (what, n) in &quiet_writes {
        violations.add_n("quiet_writes", *n as usize, format!("{n} writes of {what}"));
    }
    // What changed on the bindings (the first few), to tell a flap from a late field.
    for ((name, store), before) in w.names.iter().zip(&w.stores).zip(&bindings_before) {
        for what in invariants::binding_changes(before, &invariants::binding_snapshot(store))
            .into_iter()
            .take(3)
        {
            violations.add_n("quiet_writes", 0, format!("{name}: {what}"));
        }
    }
    hubs.sample();
    let report = ChaosReport {
        seed: o.seed,
        spokes: o.spokes,
        bindings: o.bindings,
        duration: o.duration,
        faults,
        plugin_faults_fired: plugin_faults_fired(&w.plugin_faults),
        shard_faults_fired,
        churn,
        leader_changes: hubs.leaders().changes(),
        settle,
        quiet_writes,
        violations,
        coverage,
        hub: hubs.usage(),
    };
    hubs.stop().await;
    Ok(report)
}

/// Replica `instance`'s credential of the hub cluster in sharded chaos: a static token of a
/// user of its own (`kleym-chaos-<instance>`), bound to `cluster-admin` like the hub's
/// other users in these tests.
fn replica_hub_token(w: &World, seed: u64, instance: &str) -> Result<String, String> {
    let user = format!("kleym-chaos-{instance}");
    let token = format!("tok-{user}-{seed:016x}");
    w.f.hub.add_static_token(
        &token,
        kubesim_auth::UserInfo {
            username: user.clone(),
            ..Default::default()
        },
    );
    grant_admin(&w.f.hub, &user)?;
    Ok(token)
}

/// Every request of a hub replica each spoke answered over the run, drained from the
/// spokes' request logs as the run goes (a log keeps only its last requests).
struct SpokeLogs {
    kept: Vec<Vec<LoggedRequest>>,
}

impl SpokeLogs {
    fn new(spokes: usize) -> Self {
        Self {
            kept: vec![Vec::new(); spokes],
        }
    }

    fn drain(&mut self, w: &World) {
        for (kept, name) in self.kept.iter_mut().zip(&w.names) {
            kept.extend(w.f.spoke(name).requests().drain().into_iter().filter(|r| {
                r.user_agent
                    .as_deref()
                    .and_then(crate::fixtures::writers::replica_of)
                    .is_some()
            }));
        }
    }
}

/// A replica killed for a long pause.
struct Pause {
    instance: String,
    from: tokio::time::Instant,
    until: tokio::time::Instant,
}

/// What shows that each fault of sharded replicas had its effect (counted from what the
/// clusters saw, not assumed from the schedule).
#[derive(Default)]
struct ShardEvidence {
    /// Replicas that joined late, and when.
    joins: Vec<(String, tokio::time::Instant)>,
    /// Replicas killed for a long pause.
    pauses: Vec<Pause>,
    /// Leases of running replicas found and deleted.
    lease_losses: usize,
    /// Partitions in which the hub cluster refused the replica (401).
    partitions_refused: usize,
}

fn is_of(r: &LoggedRequest, instance: &str) -> bool {
    r.user_agent
        .as_deref()
        .and_then(crate::fixtures::writers::replica_of)
        .and_then(|id| id.strip_prefix(instance))
        .is_some_and(|rest| rest.starts_with('_'))
}

impl ShardEvidence {
    /// Per fault kind, how many had their effect: a joined replica reached a spoke; in a
    /// pause another replica reached a spoke the paused one had reached; a running
    /// replica's Lease was deleted; the hub cluster refused the cut replica.
    fn fired(&self, logs: &[Vec<LoggedRequest>]) -> BTreeMap<&'static str, usize> {
        let joined = self
            .joins
            .iter()
            .filter(|(instance, at)| {
                logs.iter()
                    .flatten()
                    .any(|r| r.at >= *at && is_of(r, instance))
            })
            .count();
        let taken_over = self
            .pauses
            .iter()
            .filter(|p| {
                logs.iter().any(|log| {
                    log.iter().any(|r| r.at < p.from && is_of(r, &p.instance))
                        && log
                            .iter()
                            .any(|r| r.at >= p.from && r.at < p.until && !is_of(r, &p.instance))
                })
            })
            .count();
        [
            ProcessFault::Join { replica: 0 }.kind(),
            ProcessFault::KillPause {
                replica: 0,
                restart_after: Duration::ZERO,
            }
            .kind(),
            ProcessFault::LeaseLoss { replica: 0 }.kind(),
            ProcessFault::HubPartition {
                replica: 0,
                lasts: Duration::ZERO,
            }
            .kind(),
        ]
        .into_iter()
        .zip([
            joined,
            taken_over,
            self.lease_losses,
            self.partitions_refused,
        ])
        .collect()
    }
}

/// Applies a fault of sharded replicas (a join, a Lease loss, the start of a partition);
/// returns whether it was applied (the replica to join, a Lease found, a credential to cut).
fn shard_fault(
    pf: &ProcessFault,
    hubs: &mut Replicas,
    w: &World,
    tokens: &[Option<String>],
    ev: &mut ShardEvidence,
) -> Result<bool, ChaosError> {
    match *pf {
        ProcessFault::Join { replica } => {
            hubs.restart(replica)?;
            ev.joins.push((
                hubs.instance(replica).to_string(),
                tokio::time::Instant::now(),
            ));
            Ok(true)
        }
        ProcessFault::LeaseLoss { replica } => {
            let deleted = hubs.is_running(replica)
                && faults::delete_replica_lease(&w.f.hub.store(), HUB_NS, hubs.instance(replica))
                    .is_some();
            if deleted {
                ev.lease_losses += 1;
            }
            Ok(deleted)
        }
        ProcessFault::HubPartition { replica, .. } => {
            match tokens.get(replica).and_then(Option::as_ref) {
                Some(t) => {
                    w.f.hub.faults().revoke_token(t);
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        ProcessFault::KillLeader { .. }
        | ProcessFault::KillBoth { .. }
        | ProcessFault::KillPause { .. } => Ok(false),
    }
}

/// Ends the partition of `replica`: its credential is accepted again; counts it as fired
/// when the hub cluster refused a request meanwhile.
fn end_partition(
    w: &World,
    tokens: &[Option<String>],
    replica: usize,
    partition: &mut Option<(usize, tokio::time::Instant)>,
    ev: &mut ShardEvidence,
) {
    if let Some(t) = tokens.get(replica).and_then(Option::as_ref) {
        w.f.hub.faults().restore_token(t);
    }
    if let Some((r, since)) = partition.take()
        && r == replica
        && faults::unauthorized_since(&w.f.hub.requests().entries(), since) > 0
    {
        ev.partitions_refused += 1;
    }
}
