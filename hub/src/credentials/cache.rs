//! Per-spoke credential cache.
//!
//! - A credential is refreshed ahead of its expiry: at `expires_at - skew`, where skew is the
//!   smaller of [`CacheOptions::max_refresh_skew`] and [`CacheOptions::refresh_fraction`] of
//!   the credential's lifetime (so a 1 h token refreshes 1 min early, a 2 min token 12 s early).
//! - A credential without expiry is kept until [`SpokeCredentials::invalidate_after_401`].
//! - One exec at a time per spoke: callers hold the spoke's async mutex while it execs, so
//!   concurrent callers wait for, and share, the same result. Different spokes never wait for
//!   each other.
//! - When a proactive refresh fails but the old credential has not expired yet, the old one
//!   keeps being served (and the failure is logged); failures are remembered for
//!   [`CacheOptions::failure_backoff`] so a broken plugin is not exec'ed on every request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use thiserror::Error;
use tokio::sync::Mutex;

use super::credential::Credential;
use super::exec::{ExecError, ExecOptions, run_plugin};
use super::metrics::CredentialMetrics;
use crate::access::EffectiveAccess;

/// Cache behaviour.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheOptions {
    /// Upper bound of the early-refresh margin.
    pub max_refresh_skew: Duration,
    /// Early-refresh margin as a fraction of the credential lifetime (0.0 ..= 1.0).
    pub refresh_fraction: f64,
    /// How long a failed exec is remembered before the next attempt.
    pub failure_backoff: Duration,
    /// Limits for each plugin run.
    pub exec: ExecOptions,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            max_refresh_skew: Duration::from_secs(60),
            refresh_fraction: 0.1,
            failure_backoff: Duration::from_secs(1),
            exec: ExecOptions::default(),
        }
    }
}

/// A credential from the cache with the generation it belongs to (pass the generation back to
/// [`SpokeCredentials::invalidate_after_401`]).
#[derive(Clone, Debug)]
pub struct CachedCredential {
    /// Increases by one with every successful exec of this spoke.
    pub generation: u64,
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

/// When to refresh a credential obtained at `obtained_at` that expires at `expires_at`.
pub fn refresh_deadline(
    obtained_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    opts: &CacheOptions,
) -> DateTime<Utc> {
    let lifetime = (expires_at - obtained_at).to_std().unwrap_or_default();
    let fraction = opts.refresh_fraction.clamp(0.0, 1.0);
    let skew = lifetime.mul_f64(fraction).min(opts.max_refresh_skew);
    expires_at - chrono::Duration::from_std(skew).unwrap_or_default()
}

struct Entry {
    cached: CachedCredential,
    refresh_at: Option<DateTime<Utc>>,
}

#[derive(Default)]
struct State {
    current: Option<Entry>,
    last_generation: u64,
    last_failure: Option<(Instant, CredentialError)>,
}

/// The credentials of one spoke.
pub struct SpokeCredentials {
    access: EffectiveAccess,
    fingerprint: String,
    opts: CacheOptions,
    metrics: CredentialMetrics,
    // Highest generation a 401 was reported for; entries at or below it are stale.
    invalidated: AtomicU64,
    state: Mutex<State>,
}

impl std::fmt::Debug for SpokeCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpokeCredentials")
            .field("spoke", &self.access.spoke)
            .field("provider", &self.access.provider)
            .finish_non_exhaustive()
    }
}

impl SpokeCredentials {
    /// A cache for one spoke's effective access configuration.
    pub fn new(access: EffectiveAccess, opts: CacheOptions, metrics: CredentialMetrics) -> Self {
        let fingerprint = access.fingerprint();
        Self {
            access,
            fingerprint,
            opts,
            metrics,
            invalidated: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        }
    }

    /// The access configuration this cache execs for.
    pub fn access(&self) -> &EffectiveAccess {
        &self.access
    }

    /// A valid credential: the cached one, or a fresh one from the plugin.
    pub async fn get(&self) -> Result<CachedCredential, CredentialError> {
        let mut state = self.state.lock().await;
        let now = Utc::now();
        let invalidated = self.invalidated.load(Ordering::Acquire);
        if let Some(entry) = &state.current
            && entry.cached.generation > invalidated
            && entry.refresh_at.is_none_or(|at| now < at)
        {
            return Ok(entry.cached.clone());
        }
        if let Some((at, err)) = &state.last_failure
            && at.elapsed() < self.opts.failure_backoff
        {
            return self
                .fallback(&state, invalidated, now)
                .ok_or_else(|| err.clone());
        }
        let started = Instant::now();
        let result = run_plugin(&self.access, &self.opts.exec).await;
        let elapsed = started.elapsed();
        match result {
            Ok(credential) => {
                self.metrics
                    .observe(&self.access.provider, "success", elapsed);
                state.last_generation += 1;
                let obtained_at = Utc::now();
                let refresh_at = credential
                    .expires_at
                    .map(|exp| refresh_deadline(obtained_at, exp, &self.opts));
                tracing::debug!(
                    spoke = %self.access.spoke,
                    provider = %self.access.provider,
                    credential = %credential.short_id(),
                    generation = state.last_generation,
                    expires_at = ?credential.expires_at,
                    elapsed_ms = elapsed.as_millis() as u64,
                    "credential plugin succeeded"
                );
                let cached = CachedCredential {
                    generation: state.last_generation,
                    credential: Arc::new(credential),
                };
                state.current = Some(Entry {
                    cached: cached.clone(),
                    refresh_at,
                });
                state.last_failure = None;
                Ok(cached)
            }
            Err(err) => {
                self.metrics
                    .observe(&self.access.provider, err.result_label(), elapsed);
                tracing::warn!(
                    spoke = %self.access.spoke,
                    provider = %self.access.provider,
                    error = %err,
                    "credential plugin failed"
                );
                let err = CredentialError {
                    spoke: self.access.spoke.clone(),
                    provider: self.access.provider.clone(),
                    source: Arc::new(err),
                };
                state.last_failure = Some((Instant::now(), err.clone()));
                self.fallback(&state, invalidated, now).ok_or(err)
            }
        }
    }

    /// The current credential when it is still usable after a failed refresh: not rejected by
    /// a 401 and not expired.
    fn fallback(
        &self,
        state: &State,
        invalidated: u64,
        now: DateTime<Utc>,
    ) -> Option<CachedCredential> {
        let entry = state.current.as_ref()?;
        let usable = entry.cached.generation > invalidated
            && entry.cached.credential.expires_at.is_some_and(|e| now < e);
        usable.then(|| entry.cached.clone())
    }

    /// Marks the credential of `generation` as rejected by the server (HTTP 401). The next
    /// [`get`](Self::get) execs once; reports about an older generation (a credential that was
    /// already replaced) change nothing, so a burst of 401s causes one exec.
    pub fn invalidate_after_401(&self, generation: u64) {
        let previous = self.invalidated.fetch_max(generation, Ordering::AcqRel);
        if previous < generation {
            tracing::info!(spoke = %self.access.spoke, generation, "credential rejected with 401; will re-exec");
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
        if slot.fingerprint != fingerprint {
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
        // Already expired: refresh now.
        assert_eq!(
            refresh_deadline(
                at("2030-01-01T00:10:00Z"),
                at("2030-01-01T00:00:00Z"),
                &opts
            ),
            at("2030-01-01T00:00:00Z")
        );
    }
}
