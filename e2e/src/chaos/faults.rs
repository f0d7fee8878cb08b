//! Faults: per-spoke windows of kubesim faults (through its fault API), of the credential
//! plugin (through a fault file the chaos plugin reads, see
//! [`crate::fixtures::plugins::chaos_plugin`]) and hub process faults (`kill -9` of the
//! leader, of both replicas; in sharded mode also a replica joining late or after a long
//! pause, a replica's Lease deleted under it, a replica cut from the hub cluster).

use std::path::Path;
use std::time::Duration;

use kubesim::faults::{ErrorRule, FaultHandle, FaultRequest};
use rand::Rng;
use rand::rngs::StdRng;

/// One kind of spoke fault, with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum SpokeFault {
    /// Every request waits this long.
    Latency(Duration),
    /// This fraction of requests fail with 500/503/504.
    ServerErrors {
        /// Fraction in `[0, 1]`.
        rate: f64,
        /// The code.
        code: u16,
    },
    /// This fraction of requests get 429 (with `Retry-After`).
    Throttled(f64),
    /// Every open watch ends (once at the start of the window).
    DropWatches,
    /// The next watches get 410 Expired.
    ForceGone(u32),
    /// Connections accepted and never answered.
    Blackhole,
    /// Connections refused, open ones dropped.
    Refused,
    /// The hub's bearer token is revoked (401) for the window.
    RevokeToken,
    /// Token verification clock skew (seconds).
    ClockSkew(i64),
    /// The hub's token is revoked and the plugin fails (exit 1) for the window: a
    /// credential source that is down while the spoke rejects what the hub holds.
    PluginFails,
    /// The hub's token is revoked and the plugin never answers for the window (the hub's
    /// exec timeout kills it).
    PluginHangs,
    /// The hub's token is revoked and the plugin's clock is this many seconds behind: the
    /// expiry it prints is early by as much (in the past beyond the token's lifetime).
    PluginClockSkew(u64),
    /// The spoke's API server restarts with its state: connections refused (open ones
    /// dropped) for the window, then the first watches after it get 410 Expired, as from a
    /// fresh watch cache.
    ApiServerRestart,
}

/// Watches answered 410 after an [`SpokeFault::ApiServerRestart`]: at least every watch the
/// hub keeps on a spoke.
const WATCHES_GONE_AFTER_RESTART: u32 = 12;

impl SpokeFault {
    /// Its name in the report.
    pub fn kind(&self) -> &'static str {
        match self {
            SpokeFault::Latency(_) => "latency",
            SpokeFault::ServerErrors { .. } => "5xx",
            SpokeFault::Throttled(_) => "429",
            SpokeFault::DropWatches => "drop_watches",
            SpokeFault::ForceGone(_) => "410",
            SpokeFault::Blackhole => "blackhole",
            SpokeFault::Refused => "refused",
            SpokeFault::RevokeToken => "token_revoked",
            SpokeFault::ClockSkew(_) => "clock_skew",
            SpokeFault::PluginFails => "plugin_fails",
            SpokeFault::PluginHangs => "plugin_hangs",
            SpokeFault::PluginClockSkew(_) => "plugin_clock_skew",
            SpokeFault::ApiServerRestart => "apiserver_restart",
        }
    }

    /// A random fault.
    pub fn random(rng: &mut StdRng) -> Self {
        match rng.gen_range(0..13) {
            0 => SpokeFault::Latency(Duration::from_millis(rng.gen_range(50..600))),
            1 => SpokeFault::ServerErrors {
                rate: rng.gen_range(0.1..0.6),
                code: [500, 503, 504][rng.gen_range(0..3)],
            },
            2 => SpokeFault::Throttled(rng.gen_range(0.1..0.6)),
            3 => SpokeFault::DropWatches,
            4 => SpokeFault::ForceGone(rng.gen_range(1..6)),
            5 => SpokeFault::Blackhole,
            6 => SpokeFault::Refused,
            7 => SpokeFault::RevokeToken,
            8 => SpokeFault::ClockSkew(rng.gen_range(60..7200)),
            9 => SpokeFault::PluginFails,
            10 => SpokeFault::PluginHangs,
            11 => SpokeFault::PluginClockSkew(rng.gen_range(30..600)),
            _ => SpokeFault::ApiServerRestart,
        }
    }

    /// Switches the fault on through kubesim's fault API and the spoke's plugin fault file
    /// `plugin_fault`; `token` is the hub's bearer token on the spoke (revoked by the token
    /// and plugin faults).
    pub fn start(
        &self,
        faults: &FaultHandle,
        token: &str,
        plugin_fault: &Path,
    ) -> Result<(), String> {
        let plugin = match self {
            SpokeFault::PluginFails => Some("fail".to_string()),
            SpokeFault::PluginHangs => Some("hang".to_string()),
            SpokeFault::PluginClockSkew(s) => Some(format!("skew {s}")),
            _ => None,
        };
        if let Some(line) = plugin {
            std::fs::write(plugin_fault, format!("{line}\n"))
                .map_err(|e| format!("writing {}: {e}", plugin_fault.display()))?;
        }
        let mut req = FaultRequest::default();
        match self {
            SpokeFault::Latency(d) => req.latency_ms = Some(d.as_millis() as u64),
            SpokeFault::ServerErrors { rate, code } => {
                req.errors = Some(vec![ErrorRule {
                    verb: None,
                    resource: None,
                    rate: *rate,
                    code: *code,
                }]);
            }
            SpokeFault::Throttled(rate) => {
                req.errors = Some(vec![ErrorRule {
                    verb: None,
                    resource: None,
                    rate: *rate,
                    code: 429,
                }]);
            }
            SpokeFault::DropWatches => req.drop_watches = true,
            SpokeFault::ForceGone(n) => req.force_gone_watches = Some(*n),
            SpokeFault::Blackhole => req.blackhole = Some(true),
            SpokeFault::Refused => req.refuse_connections = Some(true),
            SpokeFault::RevokeToken => req.revoke_tokens = vec![token.to_string()],
            SpokeFault::ClockSkew(s) => req.token_clock_skew_seconds = Some(*s),
            SpokeFault::PluginFails | SpokeFault::PluginHangs | SpokeFault::PluginClockSkew(_) => {
                req.revoke_tokens = vec![token.to_string()]
            }
            SpokeFault::ApiServerRestart => req.refuse_connections = Some(true),
        }
        faults.apply(req).map_err(|e| e.to_string())
    }

    /// Ends the window of this fault: clears every kubesim fault of the spoke and its plugin
    /// fault file; after [`SpokeFault::ApiServerRestart`] the first watches get 410.
    pub fn end(faults: &FaultHandle, plugin_fault: &Path, was: Option<&SpokeFault>) {
        faults.clear();
        // Absent unless a plugin fault wrote it.
        let _ = std::fs::remove_file(plugin_fault);
        if was == Some(&SpokeFault::ApiServerRestart) {
            faults.force_gone_on_next_watches(WATCHES_GONE_AFTER_RESTART);
        }
    }
}

/// A fault on one spoke for a time window.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultWindow {
    /// The spoke (index).
    pub spoke: usize,
    /// What.
    pub fault: SpokeFault,
    /// How long (the schedule clears every fault of the spoke at the end).
    pub lasts: Duration,
}

/// A process fault on the hub replicas. The last four are drawn only in sharded mode
/// (`--shard-mode sharded`), where each replica holds a Lease of its own and serves a share
/// of the spokes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessFault {
    /// `kill -9` of the leader; it restarts after `restart_after`.
    KillLeader {
        /// Down time.
        restart_after: Duration,
    },
    /// `kill -9` of both replicas; both restart after `restart_after`.
    KillBoth {
        /// Down time.
        restart_after: Duration,
    },
    /// Replica `replica` was left out at the start and starts now: it joins a fleet the
    /// others already serve and takes its share from them.
    Join {
        /// The replica (index).
        replica: usize,
    },
    /// `kill -9` of replica `replica`, which restarts after a pause longer than the lease
    /// duration: the others take its spokes over, then it joins again.
    KillPause {
        /// The replica (index).
        replica: usize,
        /// Down time.
        restart_after: Duration,
    },
    /// Someone else deletes replica `replica`'s own Lease while it runs.
    LeaseLoss {
        /// The replica (index).
        replica: usize,
    },
    /// Replica `replica`'s credential of the hub cluster is revoked for `lasts` (every hub
    /// request it makes gets 401), then accepted again; it still reaches every spoke.
    HubPartition {
        /// The replica (index).
        replica: usize,
        /// How long.
        lasts: Duration,
    },
}

impl ProcessFault {
    /// Its name in the report.
    pub fn kind(&self) -> &'static str {
        match self {
            ProcessFault::KillLeader { .. } => "kill_leader",
            ProcessFault::KillBoth { .. } => "kill_both",
            ProcessFault::Join { .. } => "replica_join",
            ProcessFault::KillPause { .. } => "kill_pause",
            ProcessFault::LeaseLoss { .. } => "lease_loss",
            ProcessFault::HubPartition { .. } => "hub_partition",
        }
    }
}

/// The label every sharded replica's own Lease carries.
pub const REPLICA_LEASE_LABEL: &str = "kleym.io/hub-replica";

/// Deletes, as someone else would (straight in the hub cluster's store), the replica Lease
/// in `namespace` whose holder is a process of replica `instance` (identity
/// `<instance>_<suffix>`, the one renewed last); returns the holder it deleted, `None` when
/// it found none.
pub fn delete_replica_lease(
    hub: &kubesim_store::Cluster,
    namespace: &str,
    instance: &str,
) -> Option<String> {
    let res = hub.resolve("coordination.k8s.io", "v1", "leases")?;
    let prefix = format!("{instance}_");
    let list = kleym_test_support::env::list(hub, "coordination.k8s.io", "v1", "leases");
    // A killed process's Lease stays until it expires: the running process's is the one
    // renewed last (renew times are RFC 3339 in one format, so they sort as strings).
    let lease = list
        .into_iter()
        .filter(|l| {
            l["metadata"]["namespace"] == namespace
                && l["metadata"]["labels"][REPLICA_LEASE_LABEL] == "true"
                && l["spec"]["holderIdentity"]
                    .as_str()
                    .is_some_and(|h| h.starts_with(&prefix))
        })
        .max_by(|a, b| {
            let t = |l: &serde_json::Value| l["spec"]["renewTime"].as_str().map(str::to_string);
            t(a).cmp(&t(b))
        })?;
    let name = lease["metadata"]["name"].as_str()?;
    let holder = lease["spec"]["holderIdentity"].as_str()?.to_string();
    hub.delete(
        &res,
        Some(namespace),
        name,
        &kubesim_store::DeleteOptions::default(),
    )
    .ok()?;
    Some(holder)
}

/// Requests in `log` the hub cluster refused with 401 at or after `since`: with one
/// replica's credential revoked, these are that replica's (every other client's is valid).
pub fn unauthorized_since(log: &[kubesim::LoggedRequest], since: tokio::time::Instant) -> usize {
    log.iter()
        .filter(|r| r.status == 401 && r.at >= since)
        .count()
}
