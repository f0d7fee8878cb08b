//! Running one spoke reconciler: discovery-driven watches, workers over the work queue,
//! readiness, and cancellation. No process-global state: every instance owns its client,
//! caches, queue and metrics, and stops when its [`CancellationToken`] is cancelled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::api_availability::{self, ApiKind, ServedApis};
use super::config::{CachesSynced, SpokeConfig};
use super::context::Context;
use super::effects::ClusterClient;
use super::error::Error;
use super::metrics::SpokeMetrics;
use super::reconcile::reconcile;
use super::watches;

/// One spoke reconciler, built and then [`run`](Spoke::run).
pub struct Spoke {
    ctx: Arc<Context>,
}

impl Spoke {
    /// Builds a reconciler for the cluster behind `client` (a `kube::Client`, or a
    /// [`ClusterClient`] whose writes have their own way, see [`super::effects::SendWrite`]).
    pub fn new(
        client: impl Into<ClusterClient>,
        config: SpokeConfig,
        metrics: Arc<SpokeMetrics>,
    ) -> Result<Self, Error> {
        if config.trust_domain.trim().is_empty() {
            return Err(Error::Config("a trust domain is required".into()));
        }
        // An invalid trust domain would refuse every binding (`InvalidTrustDomain`) and so
        // withdraw every ClusterSPIFFEID this reconciler owns: refuse to start instead.
        if let Err(e) = crate::compiler::spiffe_id::TrustDomain::parse(&config.trust_domain) {
            return Err(Error::Config(format!(
                "trust domain {:?} is invalid: {e}",
                config.trust_domain
            )));
        }
        if config.concurrency == 0 {
            return Err(Error::Config("concurrency must be at least 1".into()));
        }
        Ok(Self {
            ctx: Arc::new(Context::new(client, config, metrics)),
        })
    }

    /// Readiness handle: set once the caches have synced.
    pub fn readiness(&self) -> CachesSynced {
        self.ctx.readiness.clone()
    }

    /// The metrics of this instance.
    pub fn metrics(&self) -> Arc<SpokeMetrics> {
        self.ctx.effects.metrics.clone()
    }

    /// The shared context (caches, queue), for status reporting and tests.
    pub fn context(&self) -> Arc<Context> {
        self.ctx.clone()
    }

    /// Runs until `shutdown` is cancelled. Reconciles in flight finish before it returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        self.run_with_abort(shutdown, CancellationToken::new())
            .await
    }

    /// Runs until `shutdown` is cancelled (reconciles in flight finish first) or `abort` is
    /// cancelled (everything stops at its next await, reconciles in flight included; also
    /// while a graceful stop is under way). Every task of the reconciler (watches, workers,
    /// discovery) belongs to it: when this returns, none of them runs any more, so nothing
    /// more is sent to the cluster; dropping the future aborts them all too.
    pub async fn run_with_abort(
        self,
        shutdown: CancellationToken,
        abort: CancellationToken,
    ) -> Result<(), Error> {
        let ctx = self.ctx;
        let mut tasks: JoinSet<()> = JoinSet::new();
        let watches_token = shutdown.child_token();
        watches::spawn_namespace_watch(&ctx, &mut tasks, watches_token.child_token());
        tasks.spawn(readiness_loop(ctx.clone(), shutdown.clone()));
        for _ in 0..ctx.config.concurrency {
            tasks.spawn(worker(ctx.clone(), shutdown.clone()));
        }

        // Discovery runs here rather than in a task of its own: it starts and stops watches
        // in `tasks`.
        let mut discovery = Discovery::default();
        let mut next_poll = tokio::time::Instant::now();
        loop {
            tokio::select! {
                biased;
                _ = abort.cancelled() => {
                    Box::pin(stop_now(&ctx, tasks)).await;
                    return Ok(());
                }
                _ = shutdown.cancelled() => break,
                next = discover_at(&ctx, next_poll) => {
                    discovery.apply(&ctx, &mut tasks, &watches_token, &shutdown, next);
                    next_poll = tokio::time::Instant::now() + ctx.config.discovery_interval;
                }
                Some(ended) = tasks.join_next() => log_ended(ended),
            }
        }

        tracing::info!("shutting down spoke reconciler");
        ctx.queue.close();
        watches_token.cancel();
        // Workers finish the reconcile in hand; everything else ends on its token.
        loop {
            tokio::select! {
                biased;
                _ = abort.cancelled() => {
                    Box::pin(stop_now(&ctx, tasks)).await;
                    return Ok(());
                }
                ended = tasks.join_next() => match ended {
                    Some(ended) => log_ended(ended),
                    None => break,
                },
            }
        }
        ctx.readiness.set(false);
        Ok(())
    }
}

/// Aborts every task of the reconciler and waits until each has ended.
async fn stop_now(ctx: &Context, mut tasks: JoinSet<()>) {
    tracing::info!("aborting spoke reconciler");
    ctx.queue.close();
    tasks.shutdown().await;
    ctx.readiness.set(false);
}

/// A task ended while the reconciler runs (a watch whose API vanished) or stops.
fn log_ended(ended: Result<(), tokio::task::JoinError>) {
    if let Err(e) = ended
        && e.is_panic()
    {
        tracing::error!(error = %e, "a spoke reconciler task panicked");
    }
}

/// Runs a reconciler for `client` with its own unregistered metrics until `shutdown`.
pub async fn run(
    client: kube::Client,
    config: SpokeConfig,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    Spoke::new(client, config, Arc::new(SpokeMetrics::default()))?
        .run(shutdown)
        .await
}

/// Discovery at `at` (now, if past).
async fn discover_at(ctx: &Context, at: tokio::time::Instant) -> ServedApis {
    tokio::time::sleep_until(at).await;
    // Boxed: this future waits in the run loop's `select!` for the whole run, and the
    // discovery requests would keep their room in it between polls (see `worker`).
    Box::pin(api_availability::discover(
        &ctx.effects.client,
        &ctx.state.served(),
    ))
    .await
}

/// What discovery started: the watch of every served API, by kind.
#[derive(Default)]
struct Discovery {
    tokens: HashMap<ApiKind, CancellationToken>,
    warned_binding_crd: bool,
}

impl Discovery {
    /// Starts the watch of every API that appeared and stops (and empties the cache of)
    /// every API that disappeared, re-evaluating all bindings either way.
    fn apply(
        &mut self,
        ctx: &Arc<Context>,
        tasks: &mut JoinSet<()>,
        watches: &CancellationToken,
        shutdown: &CancellationToken,
        next: ServedApis,
    ) {
        let previous = ctx.state.served();
        let (appeared, vanished) = next.diff(&previous);
        *ctx.state.served.write().unwrap_or_else(|p| p.into_inner()) = next.clone();
        ctx.state.sync_may_have_changed();
        for kind in &vanished {
            tracing::warn!(api = %kind, "API no longer served; stopping its watch");
            if let Some(t) = self.tokens.remove(kind) {
                t.cancel();
            }
            deactivate(ctx, *kind);
        }
        for kind in &appeared {
            tracing::info!(api = %kind, "API served; starting its watch");
            let t = watches.child_token();
            watches::spawn_watch(ctx, tasks, *kind, t.clone());
            self.tokens.insert(*kind, t);
        }
        if !next.serves(ApiKind::Bindings) && !self.warned_binding_crd {
            tracing::warn!(
                "{}; waiting for it to be installed",
                Error::BindingCrdMissing
            );
            self.warned_binding_crd = true;
        }
        if !appeared.is_empty() || !vanished.is_empty() {
            tasks.spawn(requeue_all_when_synced(ctx.clone(), shutdown.clone()));
        }
    }
}

fn deactivate(ctx: &Context, kind: ApiKind) {
    ctx.state.caches.of_kind(kind).deactivate();
    ctx.state.sync_may_have_changed();
    // The cache was emptied without a change event per object.
    ctx.state.namespace_cache.invalidate_all();
}

/// After the served set changed, every binding may change verdict (a CRD appeared or
/// disappeared); enqueue them all once the caches have synced.
async fn requeue_all_when_synced(ctx: Arc<Context>, shutdown: CancellationToken) {
    tokio::select! {
        _ = shutdown.cancelled() => return,
        () = ctx.state.until_synced() => {}
        () = tokio::time::sleep(Duration::from_secs(60)) => {}
    }
    let all = ctx
        .state
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .all_bindings();
    ctx.queue.enqueue_all(all);
}

async fn readiness_loop(ctx: Arc<Context>, shutdown: CancellationToken) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        () = ctx.state.mirror_synced(&ctx.readiness) => {}
    }
}

async fn worker(ctx: Arc<Context>, shutdown: CancellationToken) {
    // Like controller-runtime's WaitForCacheSync: no reconcile on a partial picture.
    tokio::select! {
        _ = shutdown.cancelled() => return,
        () = ctx.state.until_synced() => {}
    }
    while let Some(key) = ctx.queue.next().await {
        let started = Instant::now();
        ctx.effects.metrics.reconcile_started();
        // Boxed: a reconcile future is about 6 KB (every request it may await), and held
        // inline it made each worker about 12 KB for its whole life, most of it idle (four
        // workers per spoke: about 50 KB per spoke on a hub). Boxed, it exists only while a
        // reconcile runs.
        let result = Box::pin(reconcile(&ctx, &key)).await;
        let elapsed = started.elapsed();
        match result {
            Ok(()) => {
                ctx.state.reset_backoff(&key);
                ctx.effects.metrics.observe_reconcile(elapsed, None);
            }
            Err(err) => {
                let category = err.failure_reason();
                ctx.effects
                    .metrics
                    .observe_reconcile(elapsed, Some(category));
                let delay = ctx.state.next_backoff(&key, ctx.config.error_backoff);
                tracing::warn!(binding = %key, category, error = %err, retry_in = ?delay, "reconcile failed");
                ctx.queue.enqueue_after(key.clone(), delay);
            }
        }
        ctx.queue.done(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reconciler whose trust domain the compiler would refuse never starts: it would
    /// refuse every binding and withdraw every ClusterSPIFFEID it owns.
    #[tokio::test]
    async fn new_refuses_a_trust_domain_the_compiler_refuses() {
        let config = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let metrics = Arc::new(SpokeMetrics::default());
        for bad in ["", " ", "Fleet.Example", "spiffe://td.example", "td:443"] {
            let err = Spoke::new(client.clone(), SpokeConfig::new(bad), metrics.clone())
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(matches!(err, Error::Config(_)), "{bad:?}: {err}");
        }
        let err = Spoke::new(
            client.clone(),
            SpokeConfig::new("Fleet.Example"),
            metrics.clone(),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("\"Fleet.Example\" is invalid"), "{err}");
        assert!(Spoke::new(client, SpokeConfig::new("td.example"), metrics).is_ok());
    }
}
