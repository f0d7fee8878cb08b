//! `kleym hub` from flags to exit: the hub cluster's client, the listeners (hub API,
//! health, probes) bound before anything starts, the subsystems ([`start_hub_with`] with the
//! status loop) and the servers, until the shutdown token fires.

use anyhow::Context as _;
use kleym_spoke::reconciler::CancellationToken;

use super::args::{HubArgs, ShardMode, hub_client};
use super::coordination::Coordination;
use super::routers::{api_router, ready_check_with_issuer};
use super::start::{HubStartOptions, start_hub_with};
use crate::observe::health::HealthListeners;
use crate::status::StatusLoopOptions;

/// Runs the hub (fleet machinery, status writers, the health/metrics server on
/// `--metrics-addr`, the probe server on `--health-addr` and the hub API on `--api-addr`)
/// until `shutdown`.
pub async fn run_hub(args: &HubArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let client = hub_client(args).await?;
    // TLS problems (unreadable files) are fatal before anything starts; a missing TLS
    // configuration disables only the API listener.
    let tls = match args.api.tls() {
        Ok(tls) => Some(tls),
        Err(crate::http::HttpError::Config(msg)) => {
            tracing::warn!("hub API (/v1) disabled: {msg}");
            None
        }
        Err(e) => return Err(e).context("hub API TLS configuration"),
    };
    let api_listener = match &tls {
        Some(_) => Some(
            tokio::net::TcpListener::bind(args.api.api_addr)
                .await
                .with_context(|| format!("binding --api-addr {}", args.api.api_addr))?,
        ),
        None => None,
    };
    if api_listener.is_some() && args.api.auth_mode() == crate::http::auth::AuthMode::Enforce {
        let reviewer = crate::http::auth::KubeReviewer::new(client.clone());
        match crate::http::auth::check_enforce_can_work(&reviewer, &args.api.api_audience).await {
            Ok(None) => {}
            Ok(Some(reason)) => tracing::warn!(
                reason = %reason,
                "hub API: the start-up TokenReview failed; /v1 requests are refused until reviews succeed"
            ),
            Err(msg) => anyhow::bail!(msg),
        }
    }
    let health = HealthListeners::bind(args.metrics_addr, args.health_addr).await?;
    // Leases are renewed on a thread of their own, not behind the spoke work.
    let coordination = if args.leader_elect() || args.shard_mode == ShardMode::Sharded {
        let (kubeconfig, context, limit) = (
            args.kubeconfig.clone(),
            args.context.clone(),
            args.limits.max_response_bytes(),
        );
        Some(
            Coordination::start(move || async move {
                crate::kubeconfig::client_with_limit(
                    kubeconfig.as_deref(),
                    context.as_deref(),
                    limit,
                )
                .await
                .context("building the hub client for the Lease work")
            })
            .await?,
        )
    } else {
        None
    };
    let hub = start_hub_with(
        args,
        client.clone(),
        HubStartOptions {
            status: Some(StatusLoopOptions::default()),
            coordination,
        },
        shutdown.clone(),
    )?;
    let state = hub.state.clone();
    let (issuer_docs, issuer, issuer_addr) = start_issuer(
        args,
        hub.issuer_metrics.clone(),
        client.clone(),
        std::sync::Arc::new(move || state.is_leader()),
        shutdown.clone(),
    )
    .await?
    .map_or((None, None, None), |(d, t, a)| (d, Some(t), Some(a)));
    let mut bound = health.bound().context("reading the listeners' addresses")?;
    if let Some(l) = &api_listener {
        bound.push((
            "api",
            l.local_addr().context("reading --api-addr's address")?,
        ));
    }
    if let Some(addr) = issuer_addr {
        bound.push(("issuer", addr));
    }
    if let Some(path) = &args.listen_addrs_file {
        crate::observe::listen_addrs::write(path, &bound)?;
    }
    tracing::info!(
        metrics_addr = %args.metrics_addr,
        health_addr = ?health.health_addr(),
        api_addr = ?api_listener.as_ref().map(|_| args.api.api_addr),
        listening = ?bound,
        api_auth_mode = ?args.api.auth_mode(),
        leader_elect = args.leader_elect(),
        shard_mode = ?args.shard_mode,
        "kleym hub starting"
    );
    let health = health.serve(
        ready_check_with_issuer(hub.view.clone(), issuer_docs),
        hub.registry.clone(),
        shutdown.clone(),
    );
    let api = match (api_listener, tls) {
        (Some(l), Some(tls)) => {
            let app = api_router(&hub, &args.api, client);
            let api_shutdown = shutdown.clone();
            Some(tokio::spawn(crate::http::serve(l, app, tls, async move {
                api_shutdown.cancelled().await
            })))
        }
        _ => None,
    };
    let _ = hub.task.await;
    shutdown.cancel();
    if let Some(issuer) = issuer {
        let _ = issuer.await;
    }
    health.join().await;
    if let Some(api) = api
        && let Ok(Err(err)) = api.await
    {
        tracing::warn!(error = %err, "hub API server failed");
    }
    tracing::info!("kleym hub stopped");
    Ok(())
}

/// The issuer's documents, task and listening address, when the hub is an issuer.
type IssuerStarted = Option<(
    Option<crate::issuer::serve::IssuerDocuments>,
    tokio::task::JoinHandle<()>,
    std::net::SocketAddr,
)>;

/// With `--issuer-url`: binds `--issuer-listen-addr` and starts the issuer
/// ([`crate::issuer::serve::start`]). Any configuration or key problem is fatal at start-up.
/// Returns the documents served (whose refresh state `/readyz` reports), the task and the
/// address it listens on.
async fn start_issuer(
    args: &HubArgs,
    metrics: crate::issuer::metrics::IssuerMetrics,
    client: kube::Client,
    is_leader: crate::issuer::serve::IsLeader,
    shutdown: CancellationToken,
) -> anyhow::Result<IssuerStarted> {
    if let Some(mirror) = args.issuer.mirror_settings()? {
        let listener = tokio::net::TcpListener::bind(mirror.listen_addr)
            .await
            .with_context(|| format!("binding --issuer-listen-addr {}", mirror.listen_addr))?;
        let addr = listener
            .local_addr()
            .context("reading --issuer-listen-addr's address")?;
        let (docs, task) =
            crate::issuer::serve::start_mirror(&mirror, listener, client, shutdown).await?;
        return Ok(Some((Some(docs), task, addr)));
    }
    let Some(mut settings) = args.issuer.settings()? else {
        return Ok(None);
    };
    settings.metrics = metrics;
    let listener = tokio::net::TcpListener::bind(settings.listen_addr)
        .await
        .with_context(|| format!("binding --issuer-listen-addr {}", settings.listen_addr))?;
    let addr = listener
        .local_addr()
        .context("reading --issuer-listen-addr's address")?;
    let (docs, task) =
        crate::issuer::serve::start(&settings, listener, client, is_leader, shutdown).await?;
    Ok(Some((Some(docs), task, addr)))
}
