//! The `kleym hub` replicas (real processes, leader election on one Lease; two in the chaos
//! soak, as many as asked in `fleet-bench --scenario failover`), their process faults
//! (`kill -9`, restart) and who led when.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kubesim_store::Cluster;

use crate::fixtures::harness::HUB_NS;
use crate::fixtures::hub_process::{HubProcess, HubProcessError};

/// The replicas' `--instance` (the prefix of their leader identity).
pub const INSTANCES: [&str; 2] = ["hub-a", "hub-b"];
/// `count` replica names: [`INSTANCES`] first, then `hub-c`, `hub-d`, ...
pub fn instances(count: usize) -> Vec<String> {
    (0..count)
        .map(|i| match INSTANCES.get(i) {
            Some(name) => name.to_string(),
            None => format!("hub-{}", char::from(b'a' + (i % 26) as u8)),
        })
        .collect()
}

/// The leader Lease (the hub's default name).
pub const LEASE: &str = "kleym-hub";

/// One replica: its current process (none while down) and its resource figures.
struct Replica {
    instance: String,
    /// Its kubeconfig of the hub cluster (its own credential in sharded chaos).
    kubeconfig: PathBuf,
    /// Flags of this replica alone, after the common ones (e.g. its `--shard-weight`).
    own_flags: Vec<String>,
    process: Option<HubProcess>,
    starts: usize,
    /// CPU seconds of the processes that already ended (their last reading).
    cpu_done: f64,
    /// CPU seconds of the current process, last read.
    cpu_now: f64,
    /// Highest RSS read from any of its processes (KiB).
    peak_rss_kib: u64,
    /// RSS of the current process, last read (KiB).
    rss_kib: u64,
    /// RSS readings of the current process: (seconds since it started, KiB).
    samples: Vec<(f64, u64)>,
    /// When the current process started.
    started: Instant,
}

/// The hub replicas.
pub struct Replicas {
    kleym: PathBuf,
    flags: Vec<String>,
    dir: PathBuf,
    replicas: Vec<Replica>,
    hub_store: Arc<Cluster>,
    leaders: Arc<Mutex<LeaderLog>>,
    /// The RSS readings of the longest-lived process that ended.
    longest_ended: Vec<(f64, u64)>,
    /// Whether readings still go into the RSS slope and timeline (only within the window:
    /// settling re-engages the profiles churn deleted, which is not growth of a long run).
    recording: bool,
}

/// The Lease holders seen, in order.
#[derive(Debug, Default, Clone)]
pub struct LeaderLog {
    /// Each new holder identity and when it was first seen.
    pub holders: Vec<(Instant, String)>,
}

impl LeaderLog {
    /// Holder changes after the first holder.
    pub fn changes(&self) -> usize {
        self.holders.len().saturating_sub(1)
    }
}

/// The resource figures of the replicas.
#[derive(Debug, Clone, Default)]
pub struct HubUsage {
    /// Highest RSS of any hub process (MiB).
    pub peak_rss_mib: u64,
    /// RSS of the running processes, summed (MiB).
    pub rss_mib: u64,
    /// CPU seconds (user + sys) of every hub process, summed.
    pub cpu_seconds: f64,
    /// Processes started.
    pub starts: usize,
    /// RSS slope after warm-up of the longest-lived process, MiB per 10 minutes (a leak
    /// shows as growth).
    pub rss_slope_mib_per_10min: Option<f64>,
    /// RSS of that process about once a minute, `(seconds since its start, MiB)`: the shape
    /// behind the slope (steady growth, or a spike that went away).
    pub rss_per_minute: Vec<(u64, u64)>,
}

/// The least-squares slope of `(x, y)` points (y per x); `None` under 10 points.
pub fn slope(points: &[(f64, u64)]) -> Option<f64> {
    if points.len() < 10 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 as f64 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// The first reading of each minute of `samples` (`(seconds, KiB)`), as `(seconds, MiB)`.
pub fn per_minute(samples: &[(f64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut next = 0.0;
    for &(t, kib) in samples {
        if t >= next {
            out.push((t as u64, kib / 1024));
            next = (t / 60.0).floor() * 60.0 + 60.0;
        }
    }
    out
}

/// The Lease holder identity in the hub cluster, if any.
pub fn lease_holder(hub: &Cluster) -> Option<String> {
    let res = hub.resolve("coordination.k8s.io", "v1", "leases")?;
    let lease = hub.get(&res, Some(HUB_NS), LEASE).ok()?;
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl Replicas {
    /// Starts both replicas with `flags` (plus `--instance`, `--namespace`).
    pub fn start(
        kleym: &Path,
        kubeconfig: &Path,
        flags: Vec<String>,
        dir: &Path,
        hub_store: Arc<Cluster>,
    ) -> Result<Self, HubProcessError> {
        let instances = INSTANCES.iter().map(|i| i.to_string()).collect();
        Self::start_named(kleym, kubeconfig, flags, dir, hub_store, instances)
    }

    /// Starts one replica per name in `instances` (its `--instance`) with `flags` (plus
    /// `--instance`, `--namespace`).
    pub fn start_named(
        kleym: &Path,
        kubeconfig: &Path,
        flags: Vec<String>,
        dir: &Path,
        hub_store: Arc<Cluster>,
        instances: Vec<String>,
    ) -> Result<Self, HubProcessError> {
        let each = instances.into_iter().map(|i| (i, Vec::new())).collect();
        Self::start_named_with_flags(kleym, kubeconfig, flags, dir, hub_store, each)
    }

    /// As [`Replicas::start_named`], each instance with flags of its own after `flags`
    /// (e.g. a `--shard-weight` per replica).
    pub fn start_named_with_flags(
        kleym: &Path,
        kubeconfig: &Path,
        flags: Vec<String>,
        dir: &Path,
        hub_store: Arc<Cluster>,
        instances: Vec<(String, Vec<String>)>,
    ) -> Result<Self, HubProcessError> {
        let each = instances
            .into_iter()
            .map(|(i, own)| (i, kubeconfig.to_path_buf(), own))
            .collect();
        Self::start_with(kleym, flags, dir, hub_store, each, &[])
    }

    /// One replica per `(instance, hub kubeconfig)` of `each` with `flags` (plus
    /// `--instance`, `--namespace`); those whose index is in `deferred` start only on
    /// [`Replicas::restart`].
    pub fn start_each(
        kleym: &Path,
        flags: Vec<String>,
        dir: &Path,
        hub_store: Arc<Cluster>,
        each: Vec<(String, PathBuf)>,
        deferred: &[usize],
    ) -> Result<Self, HubProcessError> {
        let each = each.into_iter().map(|(i, k)| (i, k, Vec::new())).collect();
        Self::start_with(kleym, flags, dir, hub_store, each, deferred)
    }

    fn start_with(
        kleym: &Path,
        flags: Vec<String>,
        dir: &Path,
        hub_store: Arc<Cluster>,
        each: Vec<(String, PathBuf, Vec<String>)>,
        deferred: &[usize],
    ) -> Result<Self, HubProcessError> {
        let mut r = Self {
            kleym: kleym.to_path_buf(),
            flags,
            dir: dir.to_path_buf(),
            replicas: each
                .into_iter()
                .map(|(instance, kubeconfig, own_flags)| Replica {
                    instance,
                    kubeconfig,
                    own_flags,
                    process: None,
                    starts: 0,
                    cpu_done: 0.0,
                    cpu_now: 0.0,
                    peak_rss_kib: 0,
                    rss_kib: 0,
                    samples: Vec::new(),
                    started: Instant::now(),
                })
                .collect(),
            hub_store,
            leaders: Arc::default(),
            longest_ended: Vec::new(),
            recording: true,
        };
        for i in 0..r.replicas.len() {
            if !deferred.contains(&i) {
                r.spawn(i)?;
            }
        }
        Ok(r)
    }

    /// Whether replica `i` runs now.
    pub fn is_running(&self, i: usize) -> bool {
        self.replicas.get(i).is_some_and(|r| r.process.is_some())
    }

    fn spawn(&mut self, i: usize) -> Result<(), HubProcessError> {
        let rep = &mut self.replicas[i];
        rep.starts += 1;
        let log = self
            .dir
            .join(format!("{}.{}.log", rep.instance, rep.starts));
        let mut flags = self.flags.clone();
        flags.extend([
            "--instance".to_string(),
            rep.instance.clone(),
            "--namespace".to_string(),
            HUB_NS.to_string(),
        ]);
        flags.extend(rep.own_flags.iter().cloned());
        rep.process = Some(HubProcess::spawn(
            &self.kleym,
            &rep.kubeconfig,
            &flags,
            &log,
        )?);
        rep.cpu_now = 0.0;
        rep.rss_kib = 0;
        rep.samples.clear();
        rep.started = Instant::now();
        Ok(())
    }

    /// Reads the Lease holder and records a change (call it often: every 100-200 ms).
    pub fn observe_leader(&self) {
        let holder = lease_holder(&self.hub_store);
        let mut log = self.leaders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = holder
            && log.holders.last().map(|(_, l)| l) != Some(&h)
        {
            log.holders.push((Instant::now(), h));
        }
    }

    /// The holders seen so far.
    pub fn leaders(&self) -> LeaderLog {
        self.leaders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The replica index of the current Lease holder, if a running one holds it.
    pub fn leader(&self) -> Option<usize> {
        let h = lease_holder(&self.hub_store)?;
        self.replicas
            .iter()
            .position(|r| r.process.is_some() && h.starts_with(&format!("{}_", r.instance)))
    }

    /// The replica index whose identity is `identity` (`<instance>_<suffix>`), running or
    /// not.
    pub fn index_of(&self, identity: &str) -> Option<usize> {
        self.replicas.iter().position(|r| {
            identity
                .strip_prefix(r.instance.as_str())
                .is_some_and(|rest| rest.starts_with('_'))
        })
    }

    /// The text of replica `i`'s `/metrics` (`None` while it is down or does not answer).
    pub async fn metrics(&self, i: usize) -> Option<String> {
        self.replicas.get(i)?.process.as_ref()?.metrics().await
    }

    /// Replica `i`'s `--instance`.
    pub fn instance(&self, i: usize) -> &str {
        &self.replicas[i].instance
    }

    /// Per replica: its `--instance`, highest RSS of its processes (MiB) and CPU seconds
    /// of all its processes.
    pub fn per_replica(&self) -> Vec<(String, u64, f64)> {
        self.replicas
            .iter()
            .map(|r| {
                (
                    r.instance.clone(),
                    r.peak_rss_kib / 1024,
                    r.cpu_done + r.cpu_now,
                )
            })
            .collect()
    }

    /// Reads every running process's RSS and CPU.
    pub fn sample(&mut self) {
        for r in &mut self.replicas {
            if let Some(p) = &r.process
                && let Ok(u) = p.usage()
            {
                r.cpu_now = u.cpu_seconds;
                r.rss_kib = u.rss_kib;
                if self.recording {
                    r.samples
                        .push((r.started.elapsed().as_secs_f64(), u.rss_kib));
                }
                r.peak_rss_kib = r.peak_rss_kib.max(u.peak_rss_kib).max(u.rss_kib);
            }
        }
    }

    /// Ends the readings of the RSS slope and timeline (at the end of the window); peak
    /// RSS and CPU keep being read.
    pub fn stop_recording(&mut self) {
        self.sample();
        self.recording = false;
    }

    /// `kill -9` of replica `i` (nothing when it is down).
    pub async fn kill(&mut self, i: usize) -> Result<bool, HubProcessError> {
        self.sample();
        let r = &mut self.replicas[i];
        let Some(p) = r.process.take() else {
            return Ok(false);
        };
        p.kill().await?;
        if r.samples.len() > self.longest_ended.len() {
            self.longest_ended = std::mem::take(&mut r.samples);
        }
        r.cpu_done += r.cpu_now;
        r.cpu_now = 0.0;
        r.rss_kib = 0;
        Ok(true)
    }

    /// Starts replica `i` again if it is down.
    pub fn restart(&mut self, i: usize) -> Result<(), HubProcessError> {
        if self.replicas[i].process.is_none() {
            self.spawn(i)?;
        }
        Ok(())
    }

    /// Number of replicas.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Whether there is no replica.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// Fails if a replica that should run has exited by itself.
    pub fn check_running(&mut self) -> Result<(), HubProcessError> {
        for r in &mut self.replicas {
            if let Some(p) = &mut r.process {
                p.check_running()?;
            }
        }
        Ok(())
    }

    /// The replicas' log files (every start).
    pub fn logs(&self) -> Vec<PathBuf> {
        self.replicas
            .iter()
            .flat_map(|r| {
                (1..=r.starts).map(move |n| self.dir.join(format!("{}.{n}.log", r.instance)))
            })
            .collect()
    }

    /// The resource figures so far.
    pub fn usage(&self) -> HubUsage {
        HubUsage {
            peak_rss_mib: self
                .replicas
                .iter()
                .map(|r| r.peak_rss_kib)
                .max()
                .unwrap_or(0)
                / 1024,
            rss_mib: self.replicas.iter().map(|r| r.rss_kib).sum::<u64>() / 1024,
            cpu_seconds: self.replicas.iter().map(|r| r.cpu_done + r.cpu_now).sum(),
            starts: self.replicas.iter().map(|r| r.starts).sum(),
            rss_slope_mib_per_10min: self.rss_slope(),
            rss_per_minute: per_minute(self.longest_samples()),
        }
    }

    /// The readings of the longest-lived hub process (of equally long-lived ones, the
    /// larger: the leader, which does the work).
    fn longest_samples(&self) -> &[(f64, u64)] {
        self.replicas
            .iter()
            .map(|r| &r.samples)
            .chain(std::iter::once(&self.longest_ended))
            .max_by_key(|s| (s.len(), s.last().map_or(0, |x| x.1)))
            .map_or(&[], Vec::as_slice)
    }

    /// The RSS slope (MiB per 10 minutes, least squares) of the longest-lived hub process
    /// (of two, the larger),
    /// over the last two thirds of its readings (the first third is warm-up); `None` with
    /// fewer than 10 readings after warm-up.
    fn rss_slope(&self) -> Option<f64> {
        let longest = self.longest_samples();
        slope(&longest[longest.len() / 3..]).map(|kib_per_s| kib_per_s * 600.0 / 1024.0)
    }

    /// Stops every running replica (SIGTERM, bounded wait, then SIGKILL).
    pub async fn stop(mut self) {
        self.sample();
        for r in &mut self.replicas {
            if let Some(p) = r.process.take() {
                let _ = p.stop(Duration::from_secs(30)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::slope;

    #[test]
    fn per_minute_keeps_the_first_reading_of_each_minute() {
        let samples: Vec<(f64, u64)> = (0..250).map(|i| (i as f64, 1024 * (i as u64))).collect();
        assert_eq!(
            super::per_minute(&samples),
            [(0, 0), (60, 60), (120, 120), (180, 180), (240, 240)]
        );
        assert!(super::per_minute(&[]).is_empty());
    }

    #[test]
    fn slope_is_the_least_squares_growth() {
        let flat: Vec<(f64, u64)> = (0..20).map(|i| (i as f64, 1000)).collect();
        assert_eq!(slope(&flat), Some(0.0));
        let growing: Vec<(f64, u64)> = (0..20).map(|i| (i as f64, 1000 + 3 * i)).collect();
        assert!((slope(&growing).unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(slope(&growing[..9]), None);
    }
}
