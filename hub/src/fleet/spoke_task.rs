//! One spoke's task: connect, probe, run the spoke reconciler, watch its health, back off on
//! failure. (Removal runs in its own task after this one stopped: see `removal_job`.)
//!
//! Every wait is bounded: building the client (which execs the plugin, itself bounded by the
//! exec timeout) and each probe by `request_timeout`, the first cache sync by
//! `initial_sync_timeout` (and cut short by the first failure of a watch's initial list),
//! stopping by `request_timeout` (then every task of the reconciler is aborted).
//!
//! Stopping is graceful (reconciles in flight finish) on shutdown, removal and
//! re-engagement, and immediate when this replica lost leadership: another replica may be
//! about to take over, and nothing must reach the spoke from this one after that. A
//! graceful stop still in progress when leadership is lost turns into an immediate one.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use kleym_api::InferenceIdentityBinding;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kleym_spoke::reconciler::context::Context;
use kleym_spoke::reconciler::snapshot;
use kleym_spoke::reconciler::{CancellationToken, Spoke, SpokeConfig, SpokeMetrics};
use kube::api::{Api, ListParams};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::admission_probe::{self, AdmissionPolicyCheck};
use super::errors::{BINDINGS_PROBE, CLUSTER_SPIFFE_IDS_PROBE, EngageError};
use super::options::FleetOptions;
use super::state::{ErrorCategory, FleetState, Phase};
use crate::credentials::{CredentialCache, SpokeClient, build_spoke_client};
use crate::inventory::SpokeSpec;

/// What every spoke task shares (all cheap to clone, none locked across I/O).
#[derive(Clone)]
pub(crate) struct TaskShared {
    pub opts: Arc<FleetOptions>,
    pub state: FleetState,
    pub cache: Arc<CredentialCache>,
    pub sync_slots: Arc<Semaphore>,
}

/// How the supervisor stops a task.
pub(crate) struct StopSignal {
    /// Cancelled to stop (gracefully unless `halt` is cancelled too).
    pub token: CancellationToken,
    /// Cancelled to stop at once (this replica lost leadership), also a graceful stop
    /// already under way; cancelling it cancels `token`.
    pub halt: CancellationToken,
}

impl Default for StopSignal {
    fn default() -> Self {
        let halt = CancellationToken::new();
        Self {
            token: halt.child_token(),
            halt,
        }
    }
}

impl StopSignal {
    /// A graceful stop.
    pub fn stop(&self) {
        self.token.cancel();
    }
}

/// Publishes into the fleet state unless the task was told to stop: once stopped, the
/// supervisor owns the spoke's published phase (refused, waiting, standby, removing).
pub(crate) fn publish(
    shared: &TaskShared,
    stop: &CancellationToken,
    name: &str,
    f: impl FnOnce(&mut super::state::SpokeState),
) {
    if !stop.is_cancelled() {
        shared.state.update(name, f);
    }
}

/// How one attempt to engage a spoke ended.
enum AttemptEnd {
    /// The stop signal fired.
    Stopped,
    /// Rebuild the client and start again without backoff (client certificate rotated).
    Restart,
    /// The attempt failed.
    Failed(EngageError),
}

async fn bounded<T, E>(
    limit: Duration,
    action: &'static str,
    category: ErrorCategory,
    fut: impl Future<Output = Result<T, E>>,
    map: impl FnOnce(E) -> EngageError,
) -> Result<T, EngageError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(map),
        Err(_) => Err(EngageError::Timeout {
            action,
            seconds: limit.as_secs(),
            category,
        }),
    }
}

/// A running spoke reconciler. Dropped without [`Reconciler::stop`] (the spoke task was
/// aborted), it aborts the reconciler and with it every task the reconciler runs.
struct Reconciler {
    handle: JoinHandle<Result<(), kleym_spoke::reconciler::Error>>,
    shutdown: CancellationToken,
    abort: CancellationToken,
}

impl Reconciler {
    /// Starts `spoke`; it also begins a graceful stop when `stop` fires.
    fn start(spoke: Spoke, stop: &CancellationToken) -> Self {
        let shutdown = stop.child_token();
        let abort = CancellationToken::new();
        let handle = tokio::spawn(spoke.run_with_abort(shutdown.clone(), abort.clone()));
        Self {
            handle,
            shutdown,
            abort,
        }
    }

    fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Stops the reconciler and waits until it and all of its tasks have ended. `graceful`
    /// lets reconciles in flight finish within `limit`; past that, when `halt` fires
    /// meanwhile (leadership lost), or when not graceful, everything is aborted at once.
    async fn stop(mut self, graceful: bool, halt: &CancellationToken, limit: Duration) {
        self.shutdown.cancel();
        if graceful && !halt.is_cancelled() {
            tokio::select! {
                biased;
                _ = halt.cancelled() => {}
                r = tokio::time::timeout(limit, &mut self.handle) => if r.is_ok() {
                    return;
                },
            }
        }
        self.abort.cancel();
        if tokio::time::timeout(limit, &mut self.handle).await.is_ok() {
            return;
        }
        // Its tasks ignore the abort only if one blocks a thread; drop them all anyway.
        self.handle.abort();
        let _ = tokio::time::timeout(limit, &mut self.handle).await;
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        self.abort.cancel();
        self.handle.abort();
    }
}

async fn connect(shared: &TaskShared, spec: &SpokeSpec) -> Result<SpokeClient, EngageError> {
    let opts = &shared.opts;
    let creds = shared.cache.for_access(&spec.access);
    // The plugin's own exec timeout also applies; this bounds the whole build.
    bounded(
        opts.request_timeout,
        "getting a credential and building the client",
        ErrorCategory::Credentials,
        build_spoke_client(creds, &opts.client),
        EngageError::Client,
    )
    .await
}

fn spoke_config(opts: &FleetOptions, spec: &SpokeSpec) -> SpokeConfig {
    let mut c = SpokeConfig::new(spec.settings.trust_domain.clone());
    c.class_name = spec.settings.spire_class_name.clone();
    c.svid_policy = Arc::clone(&opts.svid_policy);
    c.concurrency = opts.spoke_concurrency.max(1);
    c.discovery_interval = opts.discovery_interval;
    c.event_instance = opts.event_instance.clone();
    c.publish_events = opts.publish_events;
    c.cluster = spec.name.clone();
    c
}

/// One attempt: connect → preflight → start the reconciler and wait for its first sync →
/// health loop. Each step returns how the attempt ended when it ends it.
async fn engage_once(
    shared: &TaskShared,
    spec: &SpokeSpec,
    signal: &StopSignal,
    client: &mut Option<SpokeClient>,
    failures: &mut u32,
    metrics: &Arc<SpokeMetrics>,
) -> AttemptEnd {
    let stop = &signal.token;
    let name = spec.name.as_str();
    let attempt_started = Instant::now();
    publish(shared, stop, name, |s| s.phase = Phase::Connecting);
    // The one-time steps (connect, preflight, start) are boxed: an engagement task lives as
    // long as its spoke is engaged, and an async fn keeps room for its largest await
    // inline, so those few kilobytes stayed allocated per spoke for nothing.
    let sc = match client.take() {
        Some(c) => c,
        None => match Box::pin(connect(shared, spec)).await {
            Ok(c) => c,
            Err(e) => return AttemptEnd::Failed(e),
        },
    };
    *client = Some(sc.clone());

    let version = match Box::pin(preflight(&shared.opts, &sc.client)).await {
        Ok(v) => v,
        Err(e) => return AttemptEnd::Failed(e),
    };
    publish(shared, stop, name, |s| s.version = Some(version.clone()));

    let (reconciler, ctx) = match Box::pin(start_and_sync(shared, spec, signal, &sc, metrics)).await
    {
        Ok(started) => started,
        Err(end) => return end,
    };
    *failures = 0;
    // Engaged and the first snapshot of the synced binding cache in one update: published
    // apart, readers would briefly see an engaged spoke with the previous (for a new spoke:
    // no) bindings, and the status would claim "Ready, all 0 bindings ready".
    let first = snapshot::bindings(&ctx);
    publish(shared, stop, name, |s| {
        s.phase = Phase::Engaged;
        s.consecutive_failures = 0;
        s.last_error = None;
        s.next_retry = None;
        s.bindings = first;
    });
    shared
        .state
        .engage_duration()
        .observe(attempt_started.elapsed().as_secs_f64());
    tracing::info!(spoke = %name, version = %version, "spoke engaged");
    // Once per engagement, then every `admission_policy_interval` from the health loop.
    Box::pin(check_admission_policy(shared, spec, stop, &sc)).await;

    // The hub API's explain routes read this spoke's caches, and the spoke with this client
    // for what the caches do not hold, while it is engaged here, and no longer once this
    // attempt ends or the task is aborted (leadership lost).
    let reach = (!stop.is_cancelled()).then(|| {
        shared
            .state
            .reach_spoke(name, sc.client.clone(), Arc::clone(&ctx))
    });
    let end = health_loop(shared, spec, signal, &sc, &reconciler, &ctx).await;
    drop(reach);
    match end {
        HealthEnd::Stopped => {
            Box::pin(reconciler.stop(true, &signal.halt, shared.opts.request_timeout)).await;
            AttemptEnd::Stopped
        }
        HealthEnd::Rotated => {
            tracing::info!(spoke = %name, "client certificate rotated; rebuilding the client");
            Box::pin(reconciler.stop(true, &signal.halt, shared.opts.request_timeout)).await;
            *client = None;
            AttemptEnd::Restart
        }
        HealthEnd::ReconcilerEnded => {
            AttemptEnd::Failed(EngageError::Reconciler("stopped unexpectedly".into()))
        }
    }
}

/// The bounded `GET /version`: the spoke's version, or why it is unreachable.
async fn probe_version(opts: &FleetOptions, client: &kube::Client) -> Result<String, EngageError> {
    bounded(
        opts.request_timeout,
        "GET /version",
        ErrorCategory::Unreachable,
        client.apiserver_version(),
        |source| EngageError::Kube {
            action: "GET /version",
            source,
        },
    )
    .await
    .map(|v| v.git_version)
}

/// Reachability, TLS, credentials, RBAC and the CRDs, each with a clear category, before a
/// sync slot is taken; the spoke's version.
async fn preflight(opts: &FleetOptions, client: &kube::Client) -> Result<String, EngageError> {
    let version = probe_version(opts, client).await?;
    let bindings: Api<InferenceIdentityBinding> = Api::all(client.clone());
    bounded(
        opts.request_timeout,
        BINDINGS_PROBE,
        ErrorCategory::Unreachable,
        bindings.list_metadata(&ListParams::default().limit(1)),
        |source| EngageError::Kube {
            action: BINDINGS_PROBE,
            source,
        },
    )
    .await?;
    // The reconciler watches ClusterSPIFFEIDs; a spoke refusing or failing that list would
    // otherwise only show up during the initial sync, with a sync slot held. 404: the SPIRE
    // CRD is not installed, which the reconciler reports per binding.
    let csids: Api<ClusterSPIFFEID> = Api::all(client.clone());
    match bounded(
        opts.request_timeout,
        CLUSTER_SPIFFE_IDS_PROBE,
        ErrorCategory::Unreachable,
        csids.list_metadata(&ListParams::default().limit(1)),
        |source| EngageError::Kube {
            action: CLUSTER_SPIFFE_IDS_PROBE,
            source,
        },
    )
    .await
    {
        Ok(_) => Ok(version),
        Err(EngageError::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => Ok(version),
        Err(e) => Err(e),
    }
}

/// Takes a sync slot, starts the reconciler and waits (bounded) until its caches synced;
/// the slot is given back either way. On failure or stop the reconciler is stopped already.
async fn start_and_sync(
    shared: &TaskShared,
    spec: &SpokeSpec,
    signal: &StopSignal,
    sc: &SpokeClient,
    metrics: &Arc<SpokeMetrics>,
) -> Result<(Reconciler, Arc<Context>), AttemptEnd> {
    let (stop, halt) = (&signal.token, &signal.halt);
    let opts = &shared.opts;
    let name = spec.name.as_str();
    // Only a bounded number of spokes do their initial sync at once (connecting and the
    // preflight are not limited: a blackholed spoke never holds a slot).
    publish(shared, stop, name, |s| s.phase = Phase::Queued);
    let permit = tokio::select! {
        _ = stop.cancelled() => return Err(AttemptEnd::Stopped),
        p = shared.sync_slots.clone().acquire_owned() => match p {
            Ok(p) => p,
            Err(_) => return Err(AttemptEnd::Stopped),
        },
    };
    let spoke = Spoke::new(
        sc.cluster_client(),
        spoke_config(opts, spec),
        metrics.clone(),
    )
    .map_err(|e| AttemptEnd::Failed(EngageError::Reconciler(e.to_string())))?;
    let ctx = spoke.context();
    let reconciler = Reconciler::start(spoke, stop);
    publish(shared, stop, name, |s| s.phase = Phase::Syncing);
    let deadline = Instant::now() + opts.initial_sync_timeout;
    while !snapshot::synced(&ctx) {
        // A watch whose first list fails keeps retrying with backoff: give the slot back
        // now rather than hold it until the deadline (other spokes are waiting for it).
        if let Some(failure) = snapshot::sync_failure(&ctx) {
            drop(permit);
            reconciler.stop(false, halt, opts.request_timeout).await;
            return Err(AttemptEnd::Failed(EngageError::Watch(failure)));
        }
        if Instant::now() >= deadline {
            drop(permit);
            reconciler.stop(false, halt, opts.request_timeout).await;
            return Err(AttemptEnd::Failed(EngageError::Timeout {
                action: "initial cache sync",
                seconds: opts.initial_sync_timeout.as_secs(),
                category: ErrorCategory::SyncTimeout,
            }));
        }
        tokio::select! {
            _ = stop.cancelled() => {
                drop(permit);
                reconciler.stop(true, halt, opts.request_timeout).await;
                return Err(AttemptEnd::Stopped);
            }
            _ = tokio::time::sleep(Duration::from_millis(25)) => {}
        }
    }
    drop(permit);
    Ok((reconciler, ctx))
}

/// Why the health loop of an engaged spoke ended.
enum HealthEnd {
    /// The stop signal fired.
    Stopped,
    /// The client certificate rotated: rebuild the client.
    Rotated,
    /// The reconciler ended by itself.
    ReconcilerEnded,
}

/// Checks whether the spoke enforces kleym's admission policy ([`admission_probe`]) and
/// publishes the result. An answer that is no answer (the request failed on the way) keeps
/// the previous result: reachability is the health probe's to report, and a warning must
/// not flap with the network.
async fn check_admission_policy(
    shared: &TaskShared,
    spec: &SpokeSpec,
    stop: &CancellationToken,
    sc: &SpokeClient,
) {
    let name = spec.name.as_str();
    let (found, answered) = admission_probe::check(
        &sc.client,
        &spec.settings.trust_domain,
        shared.opts.request_timeout,
    )
    .await;
    let before = shared.state.get(name).and_then(|s| s.admission_policy);
    let transient = !answered
        && matches!(
            before,
            Some(AdmissionPolicyCheck::Installed { .. } | AdmissionPolicyCheck::Missing)
        );
    if transient {
        if let AdmissionPolicyCheck::Unknown { why } = &found {
            tracing::debug!(spoke = %name, why = %why, "admission policy check inconclusive; keeping the last result");
        }
        return;
    }
    if before.as_ref() != Some(&found) {
        match &found {
            AdmissionPolicyCheck::Missing => tracing::warn!(
                spoke = %name,
                "the spoke does not enforce kleym's admission policy: a stolen hub credential could write any ClusterSPIFFEID there (install the policy `kleym trust-config` prints)"
            ),
            AdmissionPolicyCheck::Installed { policy } => {
                tracing::info!(spoke = %name, policy = %policy, "the spoke enforces an admission policy on the hub's ClusterSPIFFEID writes")
            }
            AdmissionPolicyCheck::Unknown { why } => {
                tracing::info!(spoke = %name, why = %why, "cannot tell whether the spoke enforces kleym's admission policy")
            }
        }
    }
    publish(shared, stop, name, |s| s.admission_policy = Some(found));
}

/// While engaged: publishes the binding snapshots every `snapshot_interval`, probes the
/// spoke every `probe_interval` (a failed probe marks it `Degraded`, the next good one
/// `Engaged` again) and checks its admission policy every `admission_policy_interval`.
async fn health_loop(
    shared: &TaskShared,
    spec: &SpokeSpec,
    signal: &StopSignal,
    sc: &SpokeClient,
    reconciler: &Reconciler,
    ctx: &Arc<Context>,
) -> HealthEnd {
    let stop = &signal.token;
    let opts = &shared.opts;
    let name = spec.name.as_str();
    let mut was_idle = false;
    let mut next_probe = Instant::now() + opts.probe_interval;
    let mut next_policy_check = Instant::now() + opts.admission_policy_interval;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return HealthEnd::Stopped,
            _ = tokio::time::sleep(opts.snapshot_interval) => {}
        }
        if reconciler.is_finished() {
            // Stopping cancels the reconciler (a child token) too: when both fired during
            // the sleep, this is a stop, not a failure to log and back off from.
            if stop.is_cancelled() {
                return HealthEnd::Stopped;
            }
            return HealthEnd::ReconcilerEnded;
        }
        let idle = snapshot::synced(ctx) && snapshot::idle(ctx);
        let current = snapshot::bindings(ctx);
        publish(shared, stop, name, |s| {
            // An unchanged cache hands back the very snapshot published last time; a
            // rebuilt one with equal content is kept too, so the next call compares by pointer.
            let changed = !Arc::ptr_eq(&s.bindings, &current) && *s.bindings != *current;
            s.bindings = current;
            if idle && (!was_idle || changed) {
                s.last_sync = Some(Utc::now());
            }
        });
        was_idle = idle;
        if Instant::now() >= next_policy_check {
            next_policy_check = Instant::now() + opts.admission_policy_interval;
            Box::pin(check_admission_policy(shared, spec, stop, sc)).await;
        }
        if Instant::now() < next_probe {
            continue;
        }
        next_probe = Instant::now() + opts.probe_interval;
        // Boxed, as the engagement's one-time steps: this loop runs for the spoke's whole
        // engagement, and the probe's request would keep its room in it between probes.
        if Box::pin(sc.needs_rebuild()).await {
            return HealthEnd::Rotated;
        }
        match Box::pin(probe_version(opts, &sc.client)).await {
            Ok(version) => publish(shared, stop, name, |s| {
                s.version = Some(version);
                if s.phase == Phase::Degraded {
                    s.phase = Phase::Engaged;
                    s.consecutive_failures = 0;
                }
            }),
            Err(e) => {
                tracing::warn!(spoke = %name, category = e.category().as_str(), error = %e, "spoke health probe failed");
                publish(shared, stop, name, |s| {
                    s.phase = Phase::Degraded;
                    s.consecutive_failures = s.consecutive_failures.saturating_add(1);
                    s.last_error = Some(e.to_spoke_error());
                });
            }
        }
    }
}

/// The wall-clock time `delay` from now (`None` only if that is out of chrono's range).
pub(crate) fn retry_time(delay: Duration) -> Option<chrono::DateTime<Utc>> {
    let delay = chrono::Duration::from_std(delay).ok()?;
    Utc::now().checked_add_signed(delay)
}

/// Runs one spoke until `stop` fires. The caller (`chain::engagement`) has waited for the
/// spoke's previous task, so two reconcilers never run for one spoke.
pub(crate) async fn run_spoke(shared: TaskShared, spec: &SpokeSpec, stop: Arc<StopSignal>) {
    let opts = shared.opts.clone();
    let name = spec.name.clone();
    let mut client: Option<SpokeClient> = None;
    let mut failures: u32 = 0;
    // One instance for the task's life (reconnects keep counting); listed on the hub's
    // `/metrics` until the task ends or is aborted.
    let metrics = shared.state.spoke_metrics().attach(&name);
    let reconciler_metrics = metrics.metrics();
    while !stop.token.is_cancelled() {
        match engage_once(
            &shared,
            spec,
            &stop,
            &mut client,
            &mut failures,
            &reconciler_metrics,
        )
        .await
        {
            AttemptEnd::Stopped => break,
            AttemptEnd::Restart => continue,
            AttemptEnd::Failed(err) => {
                failures = failures.saturating_add(1);
                // A fresh client next time: the failure may be the transport or the credential.
                client = None;
                let delay = opts.backoff.delay(failures);
                tracing::warn!(
                    spoke = %name,
                    category = err.category().as_str(),
                    error = %err,
                    failures,
                    retry_in = ?delay,
                    "spoke engagement failed"
                );
                publish(&shared, &stop.token, &name, |s| {
                    s.phase = Phase::BackingOff;
                    s.consecutive_failures = failures;
                    s.last_error = Some(err.to_spoke_error());
                    s.next_retry = retry_time(delay);
                });
                tokio::select! {
                    _ = stop.token.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    drop(metrics);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reconciler whose reconciles in flight never finish on their own: it ends only
    /// when aborted.
    fn stubborn() -> (Reconciler, CancellationToken) {
        let shutdown = CancellationToken::new();
        let abort = CancellationToken::new();
        let aborted = abort.clone();
        let handle = tokio::spawn(async move {
            aborted.cancelled().await;
            Ok(())
        });
        let r = Reconciler {
            handle,
            shutdown,
            abort: abort.clone(),
        };
        (r, abort)
    }

    // Paused (virtual) time: a graceful stop that is not escalated waits out its whole limit.
    #[tokio::test(start_paused = true)]
    async fn a_graceful_stop_turns_into_an_abort_when_leadership_is_lost_meanwhile() {
        const LIMIT: Duration = Duration::from_secs(3600);
        let (r, abort) = stubborn();
        let signal = StopSignal::default();
        let halt = signal.halt.clone();
        let t0 = tokio::time::Instant::now();
        let stopping = tokio::spawn(async move { r.stop(true, &halt, LIMIT).await });
        tokio::task::yield_now().await;
        assert!(
            !abort.is_cancelled(),
            "graceful: reconciles in flight may finish"
        );
        signal.halt.cancel();
        assert!(signal.token.is_cancelled(), "halting also stops");
        stopping.await.unwrap();
        assert!(abort.is_cancelled());
        assert!(
            t0.elapsed() < LIMIT,
            "the graceful stop waited out its limit instead of aborting on halt"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_graceful_stop_waits_for_reconciles_in_flight_up_to_its_limit() {
        const LIMIT: Duration = Duration::from_secs(30);
        let (r, abort) = stubborn();
        let halt = CancellationToken::new();
        let t0 = tokio::time::Instant::now();
        r.stop(true, &halt, LIMIT).await;
        assert!(abort.is_cancelled());
        assert!(t0.elapsed() >= LIMIT, "aborted before its limit");
    }
}
