//! `fleet-bench --scenario failover --shard-mode sharded --running-replicas K`: only the
//! first K of the R replicas run; the bench holds the other replicas' Leases
//! ([`crate::fixtures::stand_in`]). The running replicas own the share of the spokes they
//! would own among all R, but no other replica shares their cores: their cold start is what
//! a replica costs on a machine of its own, where the failover scenario, with every replica
//! on this machine's two cores, measures them competing for the same cores.
//!
//! 1. The fleet is set up as in the failover scenario; the stand-ins' Leases are written.
//! 2. The K replicas start. Each one's share is the `kleym_hub_shard_spokes_owned` gauge
//!    of its `/metrics`, read once it has listed every profile and counts R live replicas
//!    (the stand-ins count), and taken when two reads in a row agree.
//! 3. Converged: as many spokes have every binding converged as the replicas own. The
//!    figures are taken then; the run ends (no status wait, kill or trickle).
//! 4. Checked from the spokes' own request logs, not from what the hub says: the spokes
//!    the replicas reached are exactly the spokes that converged, so no replica touched a
//!    spoke outside its share.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use crate::chaos::replicas::{Replicas, lease_holder};
use crate::failover::{
    FailoverError, FailoverOptions, ShardMode, instance_name, replica_flags, replica_instances,
    serving, setup,
};
use crate::fixtures::convergence::{self, Names};
use crate::fixtures::harness::HUB_NS;
use crate::fixtures::hub_process::{metric_by_label, metric_value};
use crate::fixtures::stand_in::{StandIn, StandIns};

/// What the running replicas' share cost.
#[derive(Debug, Clone)]
pub struct ShareReport {
    /// Spokes in the fleet.
    pub spokes: usize,
    /// Bindings per spoke.
    pub bindings: usize,
    /// Replicas in the view (running and stood in for).
    pub replicas: usize,
    /// Replicas that ran.
    pub running: usize,
    /// Who held the leader Lease at converge, read from the hub cluster: `running` (a
    /// running replica), `stand-in` or `none`.
    pub leader: &'static str,
    /// Spokes the running replicas owned (their gauges, summed).
    pub owned: usize,
    /// Replicas start → the last owned spoke converged.
    pub converge: Duration,
    /// Per running replica at converge: `--instance`, peak RSS (MiB), CPU seconds.
    pub usage: Vec<(String, u64, f64)>,
}

impl ShareReport {
    /// CPU seconds of the running replicas at converge.
    pub fn cpu(&self) -> f64 {
        self.usage.iter().map(|u| u.2).sum()
    }

    /// The fleet's CPU if every share cost what this one did per spoke.
    pub fn fleet_cpu_estimate(&self) -> f64 {
        if self.owned == 0 {
            return 0.0;
        }
        self.cpu() * self.spokes as f64 / self.owned as f64
    }

    /// The one-line `summary:` of the run.
    pub fn summary(&self) -> String {
        format!(
            "summary: scenario=failover-share-alone spokes={} bindings_per_spoke={} replicas={} running={} leader={} owned={} share_pct={:.1} converge_s={:.3} converge_cpu_s_total={:.2} converge_peak_rss_mib_max={} fleet_cpu_s_estimate={:.2}",
            self.spokes,
            self.bindings,
            self.replicas,
            self.running,
            self.leader,
            self.owned,
            100.0 * self.owned as f64 / self.spokes.max(1) as f64,
            self.converge.as_secs_f64(),
            self.cpu(),
            self.usage.iter().map(|u| u.1).max().unwrap_or(0),
            self.fleet_cpu_estimate(),
        )
    }
}

impl fmt::Display for ShareReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} of {} replicas ran (the bench held the others' Leases; the leader Lease held by: {}); they owned {} of {} spokes ({:.1} %)",
            self.running,
            self.replicas,
            self.leader,
            self.owned,
            self.spokes,
            100.0 * self.owned as f64 / self.spokes.max(1) as f64
        )?;
        writeln!(
            f,
            "their share converged ({} spokes x {} bindings) after {:.1?}",
            self.owned, self.bindings, self.converge
        )?;
        for (name, rss, cpu) in &self.usage {
            writeln!(
                f,
                "replica {name} at converge: peak RSS {rss} MiB, CPU {cpu:.2} s user+sys"
            )?;
        }
        writeln!(
            f,
            "the whole fleet at this CPU per spoke: {:.2} s ({:.2} s x {} / {})",
            self.fleet_cpu_estimate(),
            self.cpu(),
            self.spokes,
            self.owned
        )
    }
}

/// Spokes the running replicas own, from their gauges; `None` until every running replica
/// answers, has listed the whole inventory (its `kleym_hub_spokes` phases add up to
/// `spokes`: the owned gauge grows while the profiles are being listed), shows `replicas`
/// live replicas and owns at least one spoke.
async fn owned(hubs: &Replicas, spokes: usize, replicas: usize) -> Option<usize> {
    let mut total = 0;
    for i in 0..hubs.len() {
        let text = hubs.metrics(i).await?;
        let listed: f64 = metric_by_label(&text, "kleym_hub_spokes", "phase")
            .iter()
            .map(|(_, n)| n)
            .sum();
        let live = metric_value(&text, "kleym_hub_shard_live_replicas")?;
        if listed as usize != spokes || live as usize != replicas {
            return None;
        }
        total += metric_value(&text, "kleym_hub_shard_spokes_owned")? as usize;
    }
    (total > 0).then_some(total)
}

/// The replicas' leader Lease (`kleym hub --lease-name`'s default).
const LEADER_LEASE: &str = "kleym-hub";

/// Runs the share-alone measurement (see the module). `running` must be below
/// `o.replicas`, in sharded mode. With `stand_in_leads` a stand-in holds the leader Lease:
/// no running replica writes the fleet report, as two of three do not.
pub async fn run(
    o: &FailoverOptions,
    running: usize,
    stand_in_leads: bool,
    progress: &dyn Fn(&str),
) -> Result<ShareReport, FailoverError> {
    if o.shard_mode != ShardMode::Sharded || running == 0 || running >= o.replicas {
        return Err(FailoverError::Setup(format!(
            "running {running} of {} replicas alone needs sharded mode and 1 to {} running",
            o.replicas,
            o.replicas.saturating_sub(1)
        )));
    }
    let t = Instant::now();
    let fleet = setup(o).await?;
    progress(&format!(
        "setup ({} spokes x {} bindings, profiles): {:.1?}",
        o.spokes,
        o.bindings,
        t.elapsed()
    ));
    let names = Arc::new(Names::new(o.bindings));
    let mut watchers = FuturesUnordered::new();
    for (k, s) in fleet.stores.iter().enumerate() {
        let w =
            convergence::watch_spoke(s, names.clone(), o.limit).map_err(FailoverError::Setup)?;
        watchers.push(async move { (k, w.await) });
    }
    let stand_ins: Vec<StandIn> = (running..o.replicas)
        .map(|i| StandIn {
            identity: format!("{}_stand-in", instance_name(i)),
            weight: o.weights.get(i).copied(),
        })
        .collect();
    let held = StandIns::start(
        fleet.f.hub_client.clone(),
        HUB_NS,
        stand_ins,
        Duration::from_secs(o.lease_seconds),
        stand_in_leads.then(|| LEADER_LEASE.to_string()),
    )
    .await
    .map_err(|e| FailoverError::Setup(format!("writing the stand-in replica Leases: {e}")))?;

    let started = Instant::now();
    let mut hubs = Replicas::start_named_with_flags(
        &o.kleym,
        &fleet.f.hub_kubeconfig(),
        replica_flags(o, &fleet),
        &o.dir,
        fleet.f.hub.store(),
        replica_instances(o, 0..running),
    )?;
    let deadline = tokio::time::Instant::now() + o.limit;
    let mut converged: BTreeSet<usize> = BTreeSet::new();
    let mut last = None;
    let mut own = None;
    let mut previous = None;
    let outcome = loop {
        if let Some(n) = own
            && converged.len() >= n
        {
            break Ok(n);
        }
        tokio::select! {
            Some((k, joined)) = watchers.next() => {
                let p = joined.map_err(|e| FailoverError::Setup(e.to_string()))?;
                if p.missing().is_empty() {
                    converged.insert(k);
                    last = last.max(p.converged_at().into_iter().flatten().max());
                }
            }
            () = tokio::time::sleep(Duration::from_millis(250)) => {
                hubs.check_running()?;
                hubs.sample();
                // Taken once two reads in a row agree; then no more scrapes, which would
                // add their cost (a text of every spoke's series) to the replicas' CPU.
                if own.is_none() {
                    let read = owned(&hubs, o.spokes, o.replicas).await;
                    if read.is_some() && read == previous {
                        own = read;
                    }
                    previous = read;
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                break Err(FailoverError::NotConverged(format!(
                    "{} spokes converged within {:?}; the running replicas own {}",
                    converged.len(),
                    o.limit,
                    own.map_or_else(|| "an unknown number (no gauge read)".to_string(), |n| n.to_string())
                )));
            }
        }
    };
    hubs.sample();
    let usage = hubs.per_replica();
    let leader = match lease_holder(&fleet.f.hub.store()) {
        None => "none",
        Some(h) if hubs.index_of(&h).is_some() => "running",
        Some(_) => "stand-in",
    };
    held.stop().await;
    let owned = match outcome {
        Ok(n) => n,
        Err(e) => {
            hubs.stop().await;
            return Err(e);
        }
    };
    // Reached: a spoke whose log has a request from a running replica.
    let reached: BTreeSet<usize> = serving(&fleet)
        .iter()
        .enumerate()
        .filter(|(_, id)| id.as_deref().is_some_and(|id| hubs.index_of(id).is_some()))
        .map(|(k, _)| k)
        .collect();
    hubs.stop().await;
    if reached != converged {
        let name = |k: &usize| fleet.names[*k].clone();
        return Err(FailoverError::NotConverged(format!(
            "the running replicas reached {} spokes and {} converged (owned {owned}); reached, not converged: {:?}; converged, not reached: {:?}",
            reached.len(),
            converged.len(),
            reached
                .difference(&converged)
                .take(5)
                .map(name)
                .collect::<Vec<_>>(),
            converged
                .difference(&reached)
                .take(5)
                .map(name)
                .collect::<Vec<_>>(),
        )));
    }
    Ok(ShareReport {
        spokes: o.spokes,
        bindings: o.bindings,
        replicas: o.replicas,
        running,
        leader,
        owned,
        converge: last.map_or(Duration::ZERO, |t| t.saturating_duration_since(started)),
        usage,
    })
}
