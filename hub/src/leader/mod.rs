//! Lease-based leader election (`coordination.k8s.io/v1` Lease), as client-go's
//! `leaderelection` does it: the holder renews `renewTime` every `retry_period`; another
//! candidate takes over when the lease record has not changed for `lease_duration` (measured
//! on its own clock, so clock skew between replicas does not matter); every write is an
//! optimistic update (resourceVersion), so two candidates never both win. A leader that
//! cannot renew within `renew_deadline` steps down. On shutdown the leader releases the
//! lease so a successor takes over at once.
//!
//! kube-rs 5 has no leader-election helper, hence this module.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kleym_spoke::reconciler::CancellationToken;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
// Tokio's clock (the same as std's outside tests), so the election runs on virtual time in
// tests.
use tokio::time::Instant;

/// Where the in-cluster ServiceAccount's namespace is mounted.
pub const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Election settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderOptions {
    /// Lease name.
    pub lease_name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long steps down (< `lease_duration`).
    pub renew_deadline: Duration,
    /// Interval between attempts.
    pub retry_period: Duration,
}

impl LeaderOptions {
    /// client-go's defaults (15 s / 10 s / 2 s) for `lease_name` in the default namespace
    /// with the default identity.
    pub fn new(lease_name: impl Into<String>) -> Self {
        Self {
            lease_name: lease_name.into(),
            namespace: default_namespace(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The pod's namespace in-cluster, else `default`.
pub fn default_namespace() -> String {
    std::fs::read_to_string(SA_NAMESPACE_FILE)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// `POD_NAME`, else the host name, plus a random suffix (two processes never share one).
pub fn default_identity() -> String {
    identity(None)
}

/// `prefix` (e.g. `--instance`) when non-empty, else `POD_NAME`, else the host name, plus a
/// random suffix (two processes never share one).
pub fn identity(prefix: Option<&str>) -> String {
    let base = prefix
        .map(|p| p.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("POD_NAME").ok())
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "kleym-hub".to_string());
    let suffix = uuid_like_suffix();
    format!("{base}_{suffix}")
}

fn uuid_like_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// The part of a lease record whose change proves the holder is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew: Option<String>,
    transitions: i32,
}

fn record(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        renew: spec.renew_time.map(|t| t.0.to_string()),
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

struct Candidate {
    api: Api<Lease>,
    opts: LeaderOptions,
    observed: Option<(Record, Instant)>,
    last_renew: Option<Instant>,
}

impl Candidate {
    fn spec(&self, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.opts.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.opts.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: acquire.or_else(|| Some(now())),
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One attempt; Ok(true) when we hold the lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let lease = match self.api.get_opt(&self.opts.lease_name).await? {
            Some(l) => l,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.opts.lease_name.clone()),
                        namespace: Some(self.opts.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(None, 0)),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                };
            }
        };
        let rec = record(&lease);
        let at = Instant::now();
        match &self.observed {
            Some((prev, _)) if *prev == rec => {}
            _ => self.observed = Some((rec.clone(), at)),
        }
        let mine = rec.holder.as_deref() == Some(self.opts.identity.as_str());
        let expired = rec.holder.is_none()
            || self
                .observed
                .as_ref()
                .is_some_and(|(_, seen)| seen.elapsed() >= self.opts.lease_duration);
        if !mine && !expired {
            return Ok(false);
        }
        let old = lease.spec.clone().unwrap_or_default();
        let (acquire, transitions) = if mine {
            (old.acquire_time.clone(), rec.transitions)
        } else {
            (None, rec.transitions.saturating_add(1))
        };
        let mut next = lease.clone();
        next.spec = Some(self.spec(acquire, transitions));
        // `replace` carries the resourceVersion we read: a concurrent writer makes this 409.
        match self
            .api
            .replace(&self.opts.lease_name, &PostParams::default(), &next)
            .await
        {
            Ok(written) => {
                self.observed = Some((record(&written), Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.opts.lease_name).await else {
            return;
        };
        if record(&lease).holder.as_deref() != Some(self.opts.identity.as_str()) {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = Some(now());
            spec.lease_duration_seconds = Some(1);
        }
        if let Err(e) = self
            .api
            .replace(&self.opts.lease_name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(error = %e, "releasing the lease failed");
        }
    }
}

/// Runs the election until `shutdown`; the receiver is true while this process leads.
/// On shutdown the lease is released (if held) before the task ends. The task runs on `on`.
pub fn spawn(
    on: &tokio::runtime::Handle,
    client: kube::Client,
    opts: LeaderOptions,
    shutdown: CancellationToken,
) -> (watch::Receiver<bool>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let api: Api<Lease> = Api::namespaced(client, &opts.namespace);
    let mut c = Candidate {
        api,
        opts,
        observed: None,
        last_renew: None,
    };
    let handle = on.spawn(async move {
        loop {
            let leading_before = *tx.borrow();
            // While leading, nothing may keep us leading past the renew deadline: the attempt
            // is bounded by the time left (a hung hub API server), and a leader out of time
            // steps down without waiting for another attempt. A successor takes over only
            // `lease_duration` after our last renewal, so every write we make as leader
            // (spokes stop at once on step-down) happens before then.
            let renew_by = c
                .last_renew
                .filter(|_| leading_before)
                .map(|t| t + c.opts.renew_deadline);
            let limit = renew_by.map_or(c.opts.renew_deadline, |d| {
                d.saturating_duration_since(Instant::now())
            });
            let attempt = if limit.is_zero() {
                None
            } else {
                tokio::time::timeout(limit, c.try_acquire_or_renew())
                    .await
                    .ok()
            };
            let in_time = renew_by.is_some_and(|d| Instant::now() < d);
            let leading = match attempt {
                Some(Ok(true)) => {
                    c.last_renew = Some(Instant::now());
                    true
                }
                Some(Ok(false)) => false,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, lease = %c.opts.lease_name, "leader election attempt failed");
                    in_time
                }
                None => in_time,
            };
            if leading != leading_before {
                tracing::info!(identity = %c.opts.identity, leading, "leadership changed");
                tx.send_replace(leading);
            }
            // A leader whose renewal failed retries no later than its deadline.
            let wait = match (leading, c.last_renew) {
                (true, Some(t)) => c
                    .opts
                    .retry_period
                    .min((t + c.opts.renew_deadline).saturating_duration_since(Instant::now())),
                _ => c.opts.retry_period,
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        let was_leading = tx.send_replace(false);
        if was_leading {
            let _ = tokio::time::timeout(c.opts.renew_deadline, c.release()).await;
        }
    });
    (rx, handle)
}

/// A receiver that is always true (leader election disabled).
pub fn always_leader() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(true);
    // Keep the sender alive for the life of the process so `changed()` never errors.
    std::mem::forget(tx);
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubesim::{Kubesim, KubesimOptions};

    /// A leader whose renewal hangs (the hub API server stops answering) steps down no
    /// later than its renew deadline after the last renewal: the attempt is bounded by the
    /// time left, not by a whole renew deadline from when it started (which let it lead up
    /// to a retry period longer). Virtual time: the bound is exact, not a wall-clock guess
    /// (the in-process client keeps every wait on tokio's paused clock).
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_renewal_hangs_steps_down_by_the_renew_deadline() {
        let sim = Kubesim::start(&["hub"], KubesimOptions::default())
            .await
            .unwrap();
        let hub = sim.cluster("hub").unwrap();
        let client = hub.in_process_client();
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "kleym"}})).unwrap();
        Api::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let opts = LeaderOptions {
            lease_name: "kleym-hub".into(),
            namespace: "kleym".into(),
            identity: "me_1".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        let shutdown = CancellationToken::new();
        let (mut rx, task) = spawn(
            &tokio::runtime::Handle::current(),
            client,
            opts.clone(),
            shutdown.clone(),
        );
        // Bounded: a lease that can never be written would spin the paused clock forever.
        tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|leading| *leading))
            .await
            .expect("leading within a minute")
            .unwrap();
        // A couple of renewals, then the API server hangs.
        tokio::time::sleep(Duration::from_secs(5)).await;
        hub.faults().set_blackhole(true);
        let writes: Vec<_> = hub
            .requests()
            .entries()
            .into_iter()
            .filter(|r| r.path.ends_with("/leases/kleym-hub") && r.method == "PUT")
            .collect();
        assert!(writes.len() >= 2, "renewed: {writes:?}");
        let last = writes.last().unwrap().at;
        rx.wait_for(|leading| !*leading).await.unwrap();
        let led_for = tokio::time::Instant::now().duration_since(last);
        assert!(
            led_for <= opts.renew_deadline,
            "still leading {led_for:?} after the last renewal (renew deadline {:?})",
            opts.renew_deadline
        );
        shutdown.cancel();
        task.abort();
        hub.faults().set_blackhole(false);
    }

    #[test]
    fn identity_prefers_the_given_prefix() {
        let id = identity(Some("hub-0"));
        assert!(
            id.starts_with("hub-0_") && id.len() > "hub-0_".len(),
            "{id}"
        );
        // An empty prefix falls back (POD_NAME, the host name or `kleym-hub`).
        assert!(!identity(Some("  ")).starts_with('_'));
    }
}
