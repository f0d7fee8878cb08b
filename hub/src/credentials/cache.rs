//! Per-spoke credential cache.
//!
//! - A credential is refreshed ahead of its expiry, at [`refresh_deadline`]: `expires_at - skew`,
//!   where skew is the smaller of [`CacheOptions::max_refresh_skew`] and
//!   [`CacheOptions::refresh_fraction`] of the credential's lifetime (so a 1 h token refreshes
//!   1 min early, a 2 min token 12 s early), but never sooner than
//!   [`CacheOptions::min_refresh_interval`] after it was obtained. That floor does not bound the
//!   execs for credentials living shorter than it: those are used until they expire and then
//!   replaced by an exec that callers wait for.
//! - The refresh of a credential that is still valid runs in the background: callers keep
//!   getting the current credential at once, so a hung plugin never blocks requests while the
//!   old credential lasts. The refresh is a spawned task, so it completes (and is cached) even
//!   when the request that started it is dropped.
//! - One exec at a time per spoke: callers that have no valid credential (none yet, expired, or
//!   rejected with a 401) wait for the exec in flight, or start one; concurrent callers share
//!   its result. Different spokes never wait for each other.
//! - When a refresh fails but the old credential has not expired yet, the old one keeps being
//!   served (and the failure is logged); failures are remembered for
//!   [`CacheOptions::failure_backoff`] so a broken plugin is not exec'ed on every request.
//! - A credential without expiry is kept until [`SpokeCredentials::invalidate_after_401`].
//!   A 401 costs one re-exec. When the credential that re-exec produced is rejected too, the
//!   server will not accept what the plugin returns: further 401-driven re-execs back off
//!   exponentially with jitter ([`CacheOptions::unauthorized_backoff`]); meanwhile the
//!   rejected credential keeps being sent (so callers see the server's 401). A request that
//!   succeeds ([`SpokeCredentials::report_success`]) ends the backoff. Any credential that
//!   replaces a rejected one is on such probation, including one from a background refresh
//!   that was already running when the 401 arrived (a plugin that caches its token often
//!   returns the same revoked one).
//! - A run that ends without a result (its task panicked, or the runtime shut down) is
//!   recorded as a failure, so the next caller or refresh starts a new one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::credential::Credential;
use super::exec::{ExecError, ExecOptions, run_plugin};
use super::metrics::{CredentialMetrics, bundled_spiffe_plugin};
use crate::access::EffectiveAccess;
use crate::backoff::BackoffOptions;

/// Cache behaviour.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheOptions {
    /// Upper bound of the early-refresh margin.
    pub max_refresh_skew: Duration,
    /// Early-refresh margin as a fraction of the credential lifetime (0.0 ..= 1.0).
    pub refresh_fraction: f64,
    /// The earliest a credential is refreshed after it was obtained (a floor on the refresh
    /// interval). Bounds the execs a plugin returning nearly expired credentials can cause,
    /// but only for credentials living at least this long: one expiring sooner is used until
    /// it expires and then replaced by an exec that callers wait for, so such a plugin is
    /// still exec'ed once per credential lifetime.
    pub min_refresh_interval: Duration,
    /// How long a failed exec is remembered before the next attempt.
    pub failure_backoff: Duration,
    /// Delays between 401-driven re-execs once a credential obtained by such a re-exec was
    /// rejected too (jittered, doubling from `initial` up to `max`).
    pub unauthorized_backoff: BackoffOptions,
    /// Limits for each plugin run.
    pub exec: ExecOptions,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            max_refresh_skew: Duration::from_secs(60),
            refresh_fraction: 0.1,
            min_refresh_interval: Duration::from_secs(5),
            failure_backoff: Duration::from_secs(1),
            unauthorized_backoff: BackoffOptions {
                initial: Duration::from_secs(5),
                max: Duration::from_secs(300),
            },
            exec: ExecOptions::default(),
        }
    }
}

/// A credential from the cache with the generation it belongs to (pass the generation back to
/// [`SpokeCredentials::invalidate_after_401`] and [`SpokeCredentials::report_success`]).
#[derive(Clone, Debug)]
pub struct CachedCredential {
    /// Increases by one with every successful exec of this spoke.
    pub generation: u64,
    /// When the plugin run that produced it finished.
    pub obtained_at: DateTime<Utc>,
    /// The credential.
    pub credential: Arc<Credential>,
}

/// No credential could be obtained.
#[derive(Clone, Debug, Error)]
#[error("getting credentials for spoke {spoke} (provider {provider}): {source}")]
pub struct CredentialError {
    /// Spoke name.
    pub spoke: String,
    /// Provider name.
    pub provider: String,
    /// The exec failure (shared: concurrent callers receive the same one).
    pub source: Arc<ExecError>,
}

/// When to refresh a credential obtained at `obtained_at` that expires at `expires_at`:
/// `expires_at - min(max_refresh_skew, refresh_fraction × lifetime)`, but not before
/// `obtained_at + min_refresh_interval` unless the credential expires before that (then at
/// `expires_at`).
pub fn refresh_deadline(
    obtained_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    opts: &CacheOptions,
) -> DateTime<Utc> {
    let lifetime = (expires_at - obtained_at).to_std().unwrap_or_default();
    let fraction = opts.refresh_fraction.clamp(0.0, 1.0);
    let skew = lifetime.mul_f64(fraction).min(opts.max_refresh_skew);
    let early = expires_at - chrono::Duration::from_std(skew).unwrap_or_default();
    let floor = chrono::Duration::from_std(opts.min_refresh_interval)
        .ok()
        .and_then(|d| obtained_at.checked_add_signed(d))
        .unwrap_or(expires_at);
    early.max(floor.min(expires_at))
}

/// The result of one exec of the credential plugin, shared with every waiter.
type ExecResult = Result<CachedCredential, CredentialError>;

struct Entry {
    cached: CachedCredential,
    refresh_at: Option<DateTime<Utc>>,
}

/// The exec in flight: its result channel and a handle to cancel it when the cache goes away.
struct Inflight {
    result: watch::Receiver<Option<ExecResult>>,
    abort: AbortHandle,
}

#[derive(Default)]
struct State {
    current: Option<Entry>,
    last_generation: u64,
    last_failure: Option<(Instant, CredentialError)>,
    inflight: Option<Inflight>,
    // Consecutive rejections of credentials that were on probation (see `Inner::probation`).
    unauthorized_streak: u32,
    // No 401-driven re-exec before this instant; the rejected credential is served meanwhile.
    reexec_not_before: Option<Instant>,
}

struct Inner {
    access: EffectiveAccess,
    fingerprint: String,
    opts: CacheOptions,
    metrics: CredentialMetrics,
    // Highest generation a 401 was reported for; entries at or below it are stale.
    invalidated: AtomicU64,
    // Generation of a credential that has yet to prove itself with a successful request: one
    // obtained by a 401-driven re-exec (or any new one while a 401 streak lasts). 0 = none. An
    // atomic so that `report_success`, called on every request, is one load when idle.
    probation: AtomicU64,
    state: Mutex<State>,
    // How many 401 reports reached the point of taking the lock (a unit test waits for it to
    // know the report is blocked on the lock it holds, instead of sleeping and hoping).
    #[cfg(test)]
    reports_at_lock: AtomicU64,
}

/// The credentials of one spoke.
pub struct SpokeCredentials {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SpokeCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpokeCredentials")
            .field("spoke", &self.inner.access.spoke)
            .field("provider", &self.inner.access.provider)
            .finish_non_exhaustive()
    }
}

impl Drop for SpokeCredentials {
    fn drop(&mut self) {
        // Nobody can ask for this spoke's credentials any more: stop its plugin run (the exec
        // runtime kills the plugin's process group when its future is dropped).
        let inflight = self.inner.lock().inflight.take();
        if let Some(inflight) = inflight {
            inflight.abort.abort();
        }
    }
}

/// What [`Inner::next`] decided under the lock.
enum Next {
    Ready(ExecResult),
    Wait(watch::Receiver<Option<ExecResult>>),
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock; recover the state rather than propagate.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn error(&self, source: ExecError) -> CredentialError {
        CredentialError {
            spoke: self.access.spoke.clone(),
            provider: self.access.provider.clone(),
            source: Arc::new(source),
        }
    }

    /// Whether `entry` may be handed to callers: not expired, and not rejected by a 401 unless
    /// 401-driven re-execs are backing off.
    fn usable(&self, st: &State, entry: &Entry, now: DateTime<Utc>) -> bool {
        let unexpired = entry.cached.credential.expires_at.is_none_or(|e| now < e);
        let accepted = entry.cached.generation > self.invalidated.load(Ordering::Acquire)
            || st.reexec_not_before.is_some_and(|t| Instant::now() < t);
        unexpired && accepted
    }

    fn failing(&self, st: &State) -> Option<CredentialError> {
        st.last_failure
            .as_ref()
            .filter(|(at, _)| at.elapsed() < self.opts.failure_backoff)
            .map(|(_, err)| err.clone())
    }

    /// Decides under the lock (never held across an await) what a caller gets.
    fn next(self: &Arc<Self>) -> Next {
        let mut st = self.lock();
        let now = Utc::now();
        if let Some(entry) = st.current.as_ref().filter(|e| self.usable(&st, e, now)) {
            let cached = entry.cached.clone();
            let due = entry.refresh_at.is_some_and(|at| now >= at);
            if due && st.inflight.is_none() && self.failing(&st).is_none() {
                self.start_exec(&mut st, false);
            }
            return Next::Ready(Ok(cached));
        }
        if let Some(inflight) = &st.inflight {
            return Next::Wait(inflight.result.clone());
        }
        if let Some(err) = self.failing(&st) {
            return Next::Ready(Err(err));
        }
        // Re-exec'ing because the server rejected a credential that has not expired.
        let after_401 = st.current.as_ref().is_some_and(|e| {
            e.cached.credential.expires_at.is_none_or(|x| now < x)
                && e.cached.generation <= self.invalidated.load(Ordering::Acquire)
        });
        Next::Wait(self.start_exec(&mut st, after_401))
    }

    /// Spawns the spoke's one plugin run; its result reaches every waiter through the channel.
    fn start_exec(
        self: &Arc<Self>,
        st: &mut State,
        after_401: bool,
    ) -> watch::Receiver<Option<ExecResult>> {
        let (tx, rx) = watch::channel(None);
        let mut guard = RunGuard {
            inner: Arc::clone(self),
            tx,
            finished: false,
        };
        let task = tokio::spawn(async move {
            let outcome = guard.inner.exec_and_store(after_401).await;
            guard.finished = true;
            // No receiver left is fine: the result is in the cache already.
            let _ = guard.tx.send(Some(outcome));
        });
        st.inflight = Some(Inflight {
            result: rx.clone(),
            abort: task.abort_handle(),
        });
        rx
    }

    async fn exec_and_store(&self, after_401: bool) -> ExecResult {
        let started = Instant::now();
        let result = run_plugin(&self.access, &self.opts.exec).await;
        let elapsed = started.elapsed();
        let mut st = self.lock();
        st.inflight = None;
        match result {
            Ok(credential) => {
                // Checked now rather than when the run started: a 401 for the current
                // credential may have arrived while a background refresh was running.
                let replaces_rejected = st.current.as_ref().is_some_and(|e| {
                    e.cached.generation <= self.invalidated.load(Ordering::Acquire)
                });
                self.metrics
                    .observe(&self.access.provider, "success", elapsed);
                if let Some(signed) = bundled_spiffe_plugin(&self.access.exec) {
                    self.metrics.tokens_signed.get_or_create(&signed).inc();
                }
                st.last_generation += 1;
                let generation = st.last_generation;
                let obtained_at = Utc::now();
                let refresh_at = credential
                    .expires_at
                    .map(|exp| refresh_deadline(obtained_at, exp, &self.opts));
                tracing::debug!(
                    spoke = %self.access.spoke,
                    provider = %self.access.provider,
                    credential = %credential.short_id(),
                    generation,
                    expires_at = ?credential.expires_at,
                    refresh_at = ?refresh_at,
                    after_401,
                    replaces_rejected,
                    elapsed_ms = elapsed.as_millis() as u64,
                    "credential plugin succeeded"
                );
                if after_401 || replaces_rejected || st.unauthorized_streak > 0 {
                    self.probation.store(generation, Ordering::Release);
                }
                let cached = CachedCredential {
                    generation,
                    obtained_at,
                    credential: Arc::new(credential),
                };
                st.current = Some(Entry {
                    cached: cached.clone(),
                    refresh_at,
                });
                st.last_failure = None;
                Ok(cached)
            }
            Err(err) => {
                self.metrics
                    .observe(&self.access.provider, err.result_label(), elapsed);
                // The error shows stderr's size and hash only. Only when the operator asked for
                // it (`--log-plugin-stderr`) does the log also get the bounded, redacted
                // excerpt (quoted by `?`, so a plugin cannot forge log lines).
                match err
                    .stderr()
                    .filter(|e| self.opts.exec.log_stderr_excerpt && !e.log_excerpt().is_empty())
                {
                    Some(stderr) => tracing::warn!(
                        spoke = %self.access.spoke,
                        provider = %self.access.provider,
                        error = %err,
                        stderr_excerpt = ?stderr.log_excerpt(),
                        "credential plugin failed"
                    ),
                    None => tracing::warn!(
                        spoke = %self.access.spoke,
                        provider = %self.access.provider,
                        error = %err,
                        "credential plugin failed"
                    ),
                }
                let err = self.error(err);
                st.last_failure = Some((Instant::now(), err.clone()));
                let now = Utc::now();
                match st.current.as_ref().filter(|e| self.usable(&st, e, now)) {
                    Some(entry) => Ok(entry.cached.clone()),
                    None => Err(err),
                }
            }
        }
    }

    fn ended_without_result(&self) -> CredentialError {
        self.error(ExecError::Io {
            command: self.access.exec.command.clone(),
            source: std::io::Error::other("the plugin run ended without a result"),
        })
    }
}

/// Owned by a plugin run's task. Should the task end without storing a result (a panic, or the
/// runtime shutting down drops it), it clears `inflight` and records the failure; otherwise no
/// further background refresh would ever start, as only waiters would notice the dead run.
struct RunGuard {
    inner: Arc<Inner>,
    tx: watch::Sender<Option<ExecResult>>,
    finished: bool,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let inner = &self.inner;
        let mut st = inner.lock();
        // Not ours any more when `SpokeCredentials::drop` cancelled the run (it took it).
        let ours = st
            .inflight
            .as_ref()
            .is_some_and(|f| f.result.same_channel(&self.tx.subscribe()));
        if !ours {
            return;
        }
        st.inflight = None;
        let err = inner.ended_without_result();
        st.last_failure = Some((Instant::now(), err.clone()));
        drop(st);
        tracing::warn!(
            spoke = %inner.access.spoke,
            provider = %inner.access.provider,
            "credential plugin run ended without a result"
        );
        let _ = self.tx.send(Some(Err(err)));
    }
}

impl SpokeCredentials {
    /// A cache for one spoke's effective access configuration.
    pub fn new(access: EffectiveAccess, opts: CacheOptions, metrics: CredentialMetrics) -> Self {
        let fingerprint = access.fingerprint();
        Self {
            inner: Arc::new(Inner {
                access,
                fingerprint,
                opts,
                metrics,
                invalidated: AtomicU64::new(0),
                probation: AtomicU64::new(0),
                #[cfg(test)]
                reports_at_lock: AtomicU64::new(0),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The access configuration this cache execs for.
    pub fn access(&self) -> &EffectiveAccess {
        &self.inner.access
    }

    /// What [`get`](Self::get) returns, when that is known without waiting: the usable cached
    /// credential (a refresh that is due starts in the background), or the error of a
    /// failing plugin. `None` when the caller would wait for a plugin run (which this starts
    /// if none is running; [`get`](Self::get) then waits for that run). Must be called
    /// within a Tokio runtime.
    pub fn try_get(&self) -> Option<Result<CachedCredential, CredentialError>> {
        match self.inner.next() {
            Next::Ready(outcome) => Some(outcome),
            Next::Wait(_) => None,
        }
    }

    /// A usable credential: the cached one (starting a background refresh when it is due), or
    /// a fresh one from the plugin when none is usable. Must be called within a Tokio runtime.
    pub async fn get(&self) -> Result<CachedCredential, CredentialError> {
        let mut rx = match self.inner.next() {
            Next::Ready(outcome) => return outcome,
            Next::Wait(rx) => rx,
        };
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(value) => value.clone(),
            Err(_) => None,
        };
        if let Some(outcome) = outcome {
            return outcome;
        }
        // The run's task was dropped without even its guard reporting (it normally sends the
        // failure): forget it so the next caller starts a new run, not wait on a dead channel.
        let mut st = self.inner.lock();
        if st
            .inflight
            .as_ref()
            .is_some_and(|f| f.result.same_channel(&rx))
        {
            st.inflight = None;
        }
        Err(self.inner.ended_without_result())
    }

    /// Marks the credential of `generation` as rejected by the server (HTTP 401). The next
    /// [`get`](Self::get) execs once; reports about an older generation (a credential that was
    /// already replaced) change nothing, so a burst of 401s causes one exec. When the rejected
    /// credential was itself obtained after a 401 and never accepted, further re-execs back
    /// off (see the module docs).
    pub fn invalidate_after_401(&self, generation: u64) {
        let inner = &self.inner;
        // A burst of 401s for one credential: only the first takes the lock.
        if inner.invalidated.load(Ordering::Acquire) >= generation {
            return;
        }
        // Rejecting and setting the backoff under one lock: a caller deciding under the lock
        // must never see the credential rejected before the backoff that keeps it is set.
        #[cfg(test)]
        inner.reports_at_lock.fetch_add(1, Ordering::AcqRel);
        let mut st = inner.lock();
        let previous = inner.invalidated.fetch_max(generation, Ordering::AcqRel);
        if previous >= generation {
            return;
        }
        if inner.probation.load(Ordering::Acquire) != generation {
            if st
                .current
                .as_ref()
                .is_some_and(|e| e.cached.generation > generation)
            {
                tracing::debug!(spoke = %inner.access.spoke, generation, "credential rejected with 401 was already replaced");
            } else {
                tracing::info!(spoke = %inner.access.spoke, generation, "credential rejected with 401; will re-exec");
            }
            return;
        }
        st.unauthorized_streak = st.unauthorized_streak.saturating_add(1);
        let delay = inner
            .opts
            .unauthorized_backoff
            .delay(st.unauthorized_streak);
        st.reexec_not_before = Some(Instant::now() + delay);
        tracing::warn!(
            spoke = %inner.access.spoke,
            provider = %inner.access.provider,
            generation,
            consecutive = st.unauthorized_streak,
            retry_in_ms = delay.as_millis() as u64,
            "the credential obtained after a 401 was rejected too; backing off 401-driven re-execs"
        );
    }

    /// Records that a request with the credential of `generation` was not rejected (any status
    /// but 401): it ends a 401 backoff. Cheap when there is nothing to record.
    pub fn report_success(&self, generation: u64) {
        let inner = &self.inner;
        if generation == 0 || inner.probation.load(Ordering::Acquire) != generation {
            return;
        }
        let mut st = inner.lock();
        if inner
            .probation
            .compare_exchange(generation, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            if st.unauthorized_streak > 0 {
                tracing::info!(spoke = %inner.access.spoke, generation, "credential accepted; 401 backoff ends");
            }
            st.unauthorized_streak = 0;
            st.reexec_not_before = None;
        }
    }
}

/// All spokes' credential caches, keyed by spoke name.
#[derive(Debug, Default)]
pub struct CredentialCache {
    opts: CacheOptions,
    metrics: CredentialMetrics,
    spokes: DashMap<String, Arc<SpokeCredentials>>,
}

impl CredentialCache {
    /// An empty cache.
    pub fn new(opts: CacheOptions, metrics: CredentialMetrics) -> Self {
        Self {
            opts,
            metrics,
            spokes: DashMap::new(),
        }
    }

    /// The credentials of `access.spoke`. Reuses the existing cache when the effective access
    /// configuration is unchanged, and starts a fresh one when it changed.
    pub fn for_access(&self, access: &EffectiveAccess) -> Arc<SpokeCredentials> {
        let fingerprint = access.fingerprint();
        let mut slot = self.spokes.entry(access.spoke.clone()).or_insert_with(|| {
            Arc::new(SpokeCredentials::new(
                access.clone(),
                self.opts,
                self.metrics.clone(),
            ))
        });
        if slot.inner.fingerprint != fingerprint {
            *slot = Arc::new(SpokeCredentials::new(
                access.clone(),
                self.opts,
                self.metrics.clone(),
            ));
        }
        slot.clone()
    }

    /// Forgets a spoke (profile deleted).
    pub fn remove(&self, spoke: &str) {
        self.spokes.remove(spoke);
    }

    /// The shared metrics.
    pub fn metrics(&self) -> &CredentialMetrics {
        &self.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{ClusterAccess, ExecApiVersion, ExecConfig};
    use crate::credentials::secret::Secret;

    fn access() -> EffectiveAccess {
        EffectiveAccess {
            spoke: "fleet/spoke-1".into(),
            provider: "test".into(),
            cluster: ClusterAccess {
                server: "https://spoke:6443".into(),
                certificate_authority_pem: None,
                tls_server_name: None,
                insecure_skip_tls_verify: false,
                proxy_url: None,
                disable_compression: false,
                exec_extension: None,
            },
            exec: ExecConfig {
                api_version: ExecApiVersion::V1,
                command: "/bin/false".into(),
                args: vec![],
                env: vec![],
                provide_cluster_info: false,
                install_hint: None,
            },
            audience: "kleym.io/clusterprofile/fleet/a".into(),
        }
    }

    #[test]
    fn a_401_for_a_credential_on_probation_is_never_seen_without_its_backoff() {
        let opts = CacheOptions {
            unauthorized_backoff: BackoffOptions {
                initial: Duration::from_secs(600),
                max: Duration::from_secs(600),
            },
            ..CacheOptions::default()
        };
        let creds = Arc::new(SpokeCredentials::new(
            access(),
            opts,
            CredentialMetrics::default(),
        ));
        // Generation 1 came from a 401-driven re-exec and has not been accepted yet.
        {
            let mut st = creds.inner.lock();
            st.last_generation = 1;
            st.current = Some(Entry {
                cached: CachedCredential {
                    generation: 1,
                    obtained_at: Utc::now(),
                    credential: Arc::new(Credential {
                        token: Some(Secret::new("t")),
                        client_certificate: None,
                        expires_at: None,
                    }),
                },
                refresh_at: None,
            });
        }
        creds.inner.probation.store(1, Ordering::Release);

        // Hold the lock as a caller deciding what to serve would, while the 401 is reported;
        // wait until the report has done all it does before taking the lock (it is then
        // blocked on it), so whatever it does without the lock is visible here.
        let st = creds.inner.lock();
        let reporter = {
            let creds = Arc::clone(&creds);
            std::thread::spawn(move || creds.invalidate_after_401(1))
        };
        while creds.inner.reports_at_lock.load(Ordering::Acquire) == 0 {
            assert!(!reporter.is_finished(), "the report ended without the lock");
            std::thread::yield_now();
        }
        let entry = st.current.as_ref().unwrap();
        // Rejected without the backoff that keeps it served, the caller would re-exec at once.
        assert!(
            creds.inner.usable(&st, entry, Utc::now()),
            "the credential was seen rejected before its backoff was set"
        );
        drop(st);
        reporter.join().unwrap();
        let st = creds.inner.lock();
        assert_eq!(creds.inner.invalidated.load(Ordering::Acquire), 1);
        assert_eq!(st.unauthorized_streak, 1);
        assert!(st.reexec_not_before.is_some());
        // Rejected, and served during the backoff.
        assert!(
            creds
                .inner
                .usable(&st, st.current.as_ref().unwrap(), Utc::now())
        );
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn refresh_margin_is_min_of_cap_and_fraction() {
        let opts = CacheOptions::default();
        // 1 h lifetime: 10% = 6 min, capped at 1 min.
        assert_eq!(
            refresh_deadline(
                at("2030-01-01T00:00:00Z"),
                at("2030-01-01T01:00:00Z"),
                &opts
            ),
            at("2030-01-01T00:59:00Z")
        );
        // 2 min lifetime: 10% = 12 s.
        assert_eq!(
            refresh_deadline(
                at("2030-01-01T00:00:00Z"),
                at("2030-01-01T00:02:00Z"),
                &opts
            ),
            at("2030-01-01T00:01:48Z")
        );
        // Already expired: refresh now (at expiry).
        assert_eq!(
            refresh_deadline(
                at("2030-01-01T00:10:00Z"),
                at("2030-01-01T00:00:00Z"),
                &opts
            ),
            at("2030-01-01T00:00:00Z")
        );
    }

    #[test]
    fn refresh_is_never_sooner_than_the_floor_after_obtaining() {
        let opts = CacheOptions {
            refresh_fraction: 1.0,
            max_refresh_skew: Duration::from_secs(3600),
            min_refresh_interval: Duration::from_secs(5),
            ..CacheOptions::default()
        };
        // Without the floor a 100 % margin would mean "refresh at once", on every request.
        assert_eq!(
            refresh_deadline(
                at("2030-01-01T00:00:00Z"),
                at("2030-01-01T00:10:00Z"),
                &opts
            ),
            at("2030-01-01T00:00:05Z")
        );
        // A credential that expires before the floor is used until it expires.
        assert_eq!(
            refresh_deadline(
                at("2030-01-01T00:00:00Z"),
                at("2030-01-01T00:00:02Z"),
                &opts
            ),
            at("2030-01-01T00:00:02Z")
        );
        // A plugin returning its own cached token with 1 s left (10 % margin): without the
        // floor the next refresh would come 0.9 s later, and 0.09 s after that, …
        let defaults = CacheOptions::default();
        assert_eq!(
            refresh_deadline(
                at("2030-01-01T00:00:00Z"),
                at("2030-01-01T00:00:01Z"),
                &defaults
            ),
            at("2030-01-01T00:00:01Z")
        );
    }
}
