//! Running one spoke reconciler: discovery-driven watches, workers over the work queue,
//! readiness, and cancellation. No process-global state: every instance owns its client,
//! caches, queue and metrics, and stops when its [`CancellationToken`] is cancelled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::api_availability::{self, ApiKind, ServedApis};
use super::context::{Context, Readiness, SpokeConfig};
use super::error::Error;
use super::metrics::SpokeMetrics;
use super::reconcile::reconcile;
use super::watches;

/// One spoke reconciler, built and then [`run`](Spoke::run).
pub struct Spoke {
    ctx: Arc<Context>,
}

impl Spoke {
    /// Builds a reconciler for the cluster behind `client`.
    pub fn new(
        client: kube::Client,
        config: SpokeConfig,
        metrics: Arc<SpokeMetrics>,
    ) -> Result<Self, Error> {
        if config.trust_domain.trim().is_empty() {
            return Err(Error::Config("a trust domain is required".into()));
        }
        if config.concurrency == 0 {
            return Err(Error::Config("concurrency must be at least 1".into()));
        }
        Ok(Self {
            ctx: Arc::new(Context::new(client, config, metrics)),
        })
    }

    /// Readiness handle (caches synced).
    pub fn readiness(&self) -> Readiness {
        self.ctx.readiness.clone()
    }

    /// The metrics of this instance.
    pub fn metrics(&self) -> Arc<SpokeMetrics> {
        self.ctx.metrics.clone()
    }

    /// The shared context (caches, queue), for status reporting and tests.
    pub fn context(&self) -> Arc<Context> {
        self.ctx.clone()
    }

    /// Runs until `shutdown` is cancelled. Reconciles in flight finish before it returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let ctx = self.ctx;
        let watches_token = shutdown.child_token();
        watches::spawn_namespace_watch(&ctx, watches_token.child_token());

        let discovery = tokio::spawn(discovery_loop(ctx.clone(), watches_token.clone()));
        let readiness = tokio::spawn(readiness_loop(ctx.clone(), shutdown.clone()));

        let mut workers = Vec::with_capacity(ctx.config.concurrency);
        for _ in 0..ctx.config.concurrency {
            workers.push(tokio::spawn(worker(ctx.clone(), shutdown.clone())));
        }

        shutdown.cancelled().await;
        tracing::info!("shutting down spoke reconciler");
        ctx.queue.close();
        watches_token.cancel();
        for w in workers {
            let _ = w.await;
        }
        discovery.abort();
        readiness.abort();
        ctx.readiness.set(false);
        Ok(())
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

/// Polls discovery; starts the watch of every API that appears and stops (and empties the
/// cache of) every API that disappears, re-evaluating all bindings either way.
async fn discovery_loop(ctx: Arc<Context>, token: CancellationToken) {
    let mut tokens: HashMap<ApiKind, CancellationToken> = HashMap::new();
    let mut warned_binding_crd = false;
    loop {
        let previous = ctx.served();
        let next = api_availability::discover(&ctx.client, &previous).await;
        let (appeared, vanished) = next.diff(&previous);
        *ctx.served.write().unwrap_or_else(|p| p.into_inner()) = next.clone();
        for kind in &vanished {
            tracing::warn!(api = %kind, "API no longer served; stopping its watch");
            if let Some(t) = tokens.remove(kind) {
                t.cancel();
            }
            deactivate(&ctx, *kind);
        }
        for kind in &appeared {
            tracing::info!(api = %kind, "API served; starting its watch");
            let t = token.child_token();
            watches::spawn_watch(&ctx, *kind, t.clone());
            tokens.insert(*kind, t);
        }
        if !next.serves(ApiKind::Bindings) && !warned_binding_crd {
            tracing::warn!(
                "{}; waiting for it to be installed",
                Error::BindingCrdMissing
            );
            warned_binding_crd = true;
        }
        if !appeared.is_empty() || !vanished.is_empty() {
            tokio::spawn(requeue_all_when_synced(ctx.clone(), next));
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(ctx.config.discovery_interval) => {}
        }
    }
}

fn deactivate(ctx: &Context, kind: ApiKind) {
    let c = &ctx.caches;
    match kind {
        ApiKind::Bindings => {
            c.bindings.deactivate();
        }
        ApiKind::ObjectivesLlmd => {
            c.objectives_llmd.deactivate();
        }
        ApiKind::ObjectivesGaie => {
            c.objectives_gaie.deactivate();
        }
        ApiKind::Models => {
            c.models.deactivate();
        }
        ApiKind::PoolsV1 => {
            c.pools_v1.deactivate();
        }
        ApiKind::PoolsLegacy => {
            c.pools_legacy.deactivate();
        }
        ApiKind::ClusterSpiffeIds => {
            c.cluster_spiffe_ids.deactivate();
        }
    }
    // The cache was emptied without a change event per object.
    ctx.namespace_cache.invalidate_all();
}

/// After the served set changed, every binding may change verdict (a CRD appeared or
/// disappeared); enqueue them all once the caches have synced.
async fn requeue_all_when_synced(ctx: Arc<Context>, _served: ServedApis) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all_synced(&ctx) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all = ctx
        .index
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .all_bindings();
    ctx.queue.enqueue_all(all);
}

/// Every active cache has completed its first list.
pub fn all_synced(ctx: &Context) -> bool {
    let c = &ctx.caches;
    let served = ctx.served();
    served.serves(ApiKind::Bindings)
        && c.bindings.is_ready()
        && c.namespaces.is_ready()
        && (!c.objectives_llmd.is_active() || c.objectives_llmd.is_ready())
        && (!c.objectives_gaie.is_active() || c.objectives_gaie.is_ready())
        && (!c.models.is_active() || c.models.is_ready())
        && (!c.pools_v1.is_active() || c.pools_v1.is_ready())
        && (!c.pools_legacy.is_active() || c.pools_legacy.is_ready())
        && (!c.cluster_spiffe_ids.is_active() || c.cluster_spiffe_ids.is_ready())
}

async fn readiness_loop(ctx: Arc<Context>, shutdown: CancellationToken) {
    loop {
        ctx.readiness.set(all_synced(&ctx));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

async fn worker(ctx: Arc<Context>, shutdown: CancellationToken) {
    // Like controller-runtime's WaitForCacheSync: no reconcile on a partial picture.
    while !all_synced(&ctx) {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(25)) => {}
        }
    }
    while let Some(key) = ctx.queue.next().await {
        let started = Instant::now();
        let result = reconcile(&ctx, &key).await;
        let elapsed = started.elapsed();
        match result {
            Ok(()) => {
                ctx.reset_backoff(&key);
                ctx.metrics.observe_reconcile(elapsed, None);
            }
            Err(err) => {
                let category = err.category();
                ctx.metrics.observe_reconcile(elapsed, Some(category));
                let delay = ctx.next_backoff(&key);
                tracing::warn!(binding = %key, category, error = %err, retry_in = ?delay, "reconcile failed");
                ctx.queue.enqueue_after(key.clone(), delay);
            }
        }
        ctx.queue.done(&key);
    }
}
