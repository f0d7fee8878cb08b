//! What a chaos run reports: faults by kind, churn applied, leader changes, time to settle,
//! every invariant with its violations, the hub's RSS and CPU, and the `summary:` line.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::invariants::{NAMES, Violations};
use super::replicas::HubUsage;

/// What the final check covered (so that 0 violations is seen to mean something).
#[derive(Debug, Clone, Default)]
pub struct Coverage {
    /// Live bindings checked.
    pub bindings: usize,
    /// Of them, Ready by the oracle.
    pub ready: usize,
    /// Of them, refused by the oracle, by reason.
    pub refused: BTreeMap<String, usize>,
    /// ClusterSPIFFEIDs in the spokes (kleym's and foreign).
    pub csids: usize,
    /// Foreign ClusterSPIFFEIDs the churn created and checked untouched.
    pub foreign: usize,
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "checked: {} bindings ({} Ready, {} refused: {:?}), {} ClusterSPIFFEIDs, {} foreign objects",
            self.bindings,
            self.ready,
            self.refused.values().sum::<usize>(),
            self.refused,
            self.csids,
            self.foreign
        )
    }
}

/// The outcome of one chaos run.
#[derive(Debug, Clone)]
pub struct ChaosReport {
    /// The seed.
    pub seed: u64,
    /// Spokes.
    pub spokes: usize,
    /// Bindings per spoke at the start.
    pub bindings: usize,
    /// The window.
    pub duration: Duration,
    /// Faults injected, by kind (spoke faults and process faults).
    pub faults: BTreeMap<&'static str, usize>,
    /// Plugin runs a plugin fault changed, by kind (`fail`, `hang`, `skew`): proof that
    /// the plugin faults reached the hub's credential path (a 401 made it re-exec).
    pub plugin_faults_fired: BTreeMap<String, usize>,
    /// Sharded mode: faults of sharded replicas that had their effect, by kind (a joined
    /// replica reached a spoke, another replica took a paused one's spoke, a running
    /// replica's Lease was deleted, the hub cluster refused a cut replica); empty in leader
    /// mode.
    pub shard_faults_fired: BTreeMap<&'static str, usize>,
    /// Churn operations by kind: (applied, rejected by the API).
    pub churn: BTreeMap<&'static str, (usize, usize)>,
    /// Lease holder changes seen.
    pub leader_changes: usize,
    /// From the last fault cleared (and churn stopped) to the first check with no
    /// violation; `None` when the fleet never got there within the settle limit.
    pub settle: Option<Duration>,
    /// Writes in the quiet window, by cluster and type (should be empty).
    pub quiet_writes: BTreeMap<String, u64>,
    /// The final check.
    pub violations: Violations,
    /// What it covered.
    pub coverage: Coverage,
    /// The hub replicas' figures.
    pub hub: HubUsage,
}

impl ChaosReport {
    /// Churn applied in total.
    pub fn churn_applied(&self) -> usize {
        self.churn.values().map(|(a, _)| a).sum()
    }

    /// Churn the API rejected in total.
    pub fn churn_rejected(&self) -> usize {
        self.churn.values().map(|(_, r)| r).sum()
    }

    /// Faults injected in total.
    pub fn faults_total(&self) -> usize {
        self.faults.values().sum()
    }

    /// The last line, `summary: scenario=chaos seed=… violations=…`.
    pub fn summary(&self) -> String {
        let per: Vec<String> = NAMES
            .iter()
            .map(|n| format!("v_{n}={}", self.violations.count(n)))
            .collect();
        format!(
            "summary: scenario=chaos seed={} spokes={} bindings_per_spoke={} duration_s={} violations={} checked_bindings={} checked_ready={} faults={} plugin_faults_fired={} shard_faults_fired={} churn_ops={} churn_rejected={} leader_changes={} settle_s={} hub_peak_rss_mib={} hub_cpu_s={:.2} hub_starts={} hub_rss_slope_mib_per_10min={} {}",
            self.seed,
            self.spokes,
            self.bindings,
            self.duration.as_secs(),
            self.violations.total(),
            self.coverage.bindings,
            self.coverage.ready,
            self.faults_total(),
            self.plugin_faults_fired.values().sum::<usize>(),
            self.shard_faults_fired.values().sum::<usize>(),
            self.churn_applied(),
            self.churn_rejected(),
            self.leader_changes,
            self.settle
                .map_or("never".to_string(), |d| format!("{:.3}", d.as_secs_f64())),
            self.hub.peak_rss_mib,
            self.hub.cpu_seconds,
            self.hub.starts,
            self.hub
                .rss_slope_mib_per_10min
                .map_or("?".to_string(), |s| format!("{s:.2}")),
            per.join(" ")
        )
    }
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "faults injected by kind ({} in total):",
            self.faults_total()
        )?;
        for (k, n) in &self.faults {
            writeln!(f, "  {k:<28} {n}")?;
        }
        writeln!(
            f,
            "plugin runs a plugin fault changed: {}",
            if self.plugin_faults_fired.is_empty() {
                "none".to_string()
            } else {
                self.plugin_faults_fired
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )?;
        if !self.shard_faults_fired.is_empty() {
            writeln!(
                f,
                "sharded faults seen to take effect: {}",
                self.shard_faults_fired
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        writeln!(
            f,
            "churn operations ({} applied, {} rejected by the API):",
            self.churn_applied(),
            self.churn_rejected()
        )?;
        for (k, (a, r)) in &self.churn {
            writeln!(f, "  {k:<28} {a} applied, {r} rejected")?;
        }
        writeln!(f, "leader changes: {}", self.leader_changes)?;
        match self.settle {
            Some(d) => writeln!(f, "time to settle after the last fault: {d:.1?}")?,
            None => writeln!(
                f,
                "time to settle after the last fault: never (limit reached)"
            )?,
        }
        if !self.quiet_writes.is_empty() {
            writeln!(f, "writes in the quiet window: {:?}", self.quiet_writes)?;
        }
        writeln!(
            f,
            "hub replicas: peak RSS {} MiB, RSS now {} MiB (both), CPU {:.2} s user+sys over {} processes; RSS slope after warm-up of the longest-lived process: {}",
            self.hub.peak_rss_mib,
            self.hub.rss_mib,
            self.hub.cpu_seconds,
            self.hub.starts,
            self.hub
                .rss_slope_mib_per_10min
                .map_or("? (too few readings)".to_string(), |s| format!(
                    "{s:.2} MiB per 10 min"
                ))
        )?;
        if !self.hub.rss_per_minute.is_empty() {
            writeln!(
                f,
                "RSS of that process at each minute (minute: MiB): {}",
                self.hub
                    .rss_per_minute
                    .iter()
                    .map(|(t, mib)| format!("{}:{mib}", t / 60))
                    .collect::<Vec<_>>()
                    .join(" ")
            )?;
        }
        writeln!(f, "{}", self.coverage)?;
        writeln!(f, "{}", self.violations)?;
        write!(f, "{}", self.summary())
    }
}
