//! The hub process's machinery as a library, so `kleym hub`, the end-to-end tests and
//! `fleet-bench` run the same code: flags ([`HubArgs`]), [`start_hub_with`] (leader
//! election, inventory watch, supervisor, status writers, metrics), the hub API
//! ([`api_router`], served on `--api-addr`), the plain-HTTP health server
//! ([`health_router`], on `--metrics-addr`) and the probe-only server ([`probe_router`], on
//! `--health-addr`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use futures::StreamExt;
use kleym_spoke::reconciler::CancellationToken;
use prometheus_client::registry::Registry;

use super::{FleetMetrics, FleetOptions, FleetState, RemovalPolicy, Supervisor};
use crate::access::{AccessFlags, SelectOptions};
use crate::backoff::BackoffOptions;
use crate::credentials::{
    CacheOptions, ClientOptions, CredentialCache, CredentialMetrics, ExecOptions,
};
use crate::flags::{
    non_blank, parse_engage_condition, parse_instance, parse_label_selector, parse_lease_name,
    parse_log_filter, parse_namespace, parse_spire_class_name, parse_trust_domain,
};
use crate::http::auth::{ApiAuth, KubeReviewer};
use crate::http::{ApiArgs, ApiMetrics, ApiState, HubView};
use crate::hub_view::{FleetCollector, FleetHubView, LeaderInfo, observe_lease};
use crate::inventory::{InventoryEvent, InventoryOptions, WatchOptions, watch};
use crate::leader::{self, LeaderOptions};
use crate::status::{StatusLoopOptions, run_status_loop};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Arguments of `kleym hub`.
#[derive(Debug, Clone, clap::Args)]
pub struct HubArgs {
    /// Kubeconfig of the hub cluster. Default: `KUBECONFIG`, then `~/.kube/config`, then the
    /// in-cluster ServiceAccount.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context of the hub cluster (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,

    /// Access providers (KEP-5339).
    #[command(flatten)]
    pub access: AccessFlags,

    /// Watch ClusterProfiles in this namespace only (default: all namespaces); checked at
    /// start-up.
    #[arg(long, value_name = "NAMESPACE", value_parser = parse_namespace)]
    pub clusterprofile_namespace: Option<String>,

    /// Label selector of the ClusterProfiles to engage (e.g. `env=prod`), in
    /// kube-apiserver's syntax; checked at start-up.
    #[arg(long, value_name = "SELECTOR", value_parser = parse_label_selector)]
    pub clusterprofile_selector: Option<String>,

    /// ClusterProfile condition type that must be `True` to engage a spoke; `none` engages
    /// every usable profile regardless of its conditions. Checked at start-up (a condition
    /// type, `[prefix/]Name`).
    #[arg(long, default_value = "ControlPlaneHealthy", value_name = "TYPE", value_parser = parse_engage_condition)]
    pub engage_condition: String,

    /// Default SPIFFE trust domain (a profile's `kleym.io/trust-domain` property wins):
    /// lowercase letters, digits, `.`, `-`, `_`, without `spiffe://`; checked at start-up.
    /// Empty means none.
    #[arg(long, env = "KLEYM_TRUST_DOMAIN", value_parser = parse_trust_domain)]
    pub trust_domain: Option<String>,

    /// Default SPIRE class name (a profile's `kleym.io/spire-class-name` property wins);
    /// surrounding whitespace is dropped, blank means none, control characters are refused.
    #[arg(long, env = "KLEYM_SPIRE_CLASS_NAME", value_parser = parse_spire_class_name)]
    pub spire_class_name: Option<String>,

    /// What to do with a spoke's objects when its ClusterProfile is deleted.
    #[arg(long, value_enum, default_value = "orphan")]
    pub removal_policy: RemovalPolicy,

    /// Seconds after a ClusterProfile's deletion during which failed removal attempts are
    /// retried (jittered backoff); then the hub gives up, logs what was left and releases
    /// the profile.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub removal_timeout_seconds: u64,

    /// Run Lease-based leader election (only the leader engages spokes).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub leader_elect: bool,

    /// Name of the leader Lease (a DNS-1123 subdomain; checked at start-up).
    #[arg(long, default_value = "kleym-hub", value_parser = parse_lease_name)]
    pub lease_name: String,

    /// Namespace of the leader Lease (default: the pod's namespace in-cluster, else
    /// `default`); checked at start-up.
    #[arg(long, value_name = "NAMESPACE", value_parser = parse_namespace)]
    pub namespace: Option<String>,

    /// Lease duration in seconds (renew deadline is 2/3 of it, retry period 2/15).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub lease_duration_seconds: u64,

    /// Address serving `/healthz`, `/readyz` and `/metrics` over plain HTTP (for probes and
    /// scrapers; no `/v1`). The same three paths and the authenticated `/v1/*` are also
    /// served on `--api-addr`.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    pub metrics_addr: SocketAddr,

    /// Address serving only `/healthz` and `/readyz` over plain HTTP, so that kubelet probes
    /// use a port of their own, apart from `/metrics`. Unset, or equal to `--metrics-addr`:
    /// no extra listener. The probes stay on `--metrics-addr` either way.
    #[arg(long, value_name = "ADDR")]
    pub health_addr: Option<SocketAddr>,

    /// The hub API (`--api-addr`, TLS, auth). Without `--tls-cert-file`/`--tls-key-file`
    /// or `--api-insecure-http` the API listener is not started (a warning is logged).
    #[command(flatten)]
    pub api: ApiArgs,

    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter (`info`, `debug`, or a tracing directive such as `kleym_hub=debug`).
    #[arg(long, default_value = "info", env = "KLEYM_LOG", value_parser = parse_log_filter)]
    pub log_level: String,

    /// Spokes doing their initial cache sync at once, fleet-wide. Connecting (credential
    /// plugin, client) and the preflight requests are not limited by it, so a blackholed or
    /// failing spoke never holds a slot; a spoke whose initial lists fail gives its slot
    /// back at the first failure.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,

    /// Bindings reconciled concurrently within one spoke.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub spoke_concurrency: u16,

    /// Credential plugin timeout in seconds (the plugin is killed on expiry).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub exec_timeout_seconds: u64,

    /// Also log a bounded (4 KiB), pattern-redacted excerpt of a failing credential
    /// plugin's stderr. Off by default: plugin output can hold secrets that no pattern
    /// recognises, so by default logs, like status, carry only stderr's size and sha256.
    /// Turn it on briefly to debug a plugin, and treat the log as sensitive while it is on.
    #[arg(long)]
    pub log_plugin_stderr: bool,

    /// TCP+TLS connect timeout of spoke clients, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub connect_timeout_seconds: u64,

    /// Bound of the hub's own requests to a spoke (probes, removal) and of building a spoke
    /// client, in seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub request_timeout_seconds: u64,

    /// Deadline for a spoke's caches to sync, in seconds (a failing list ends the sync at
    /// once; this bounds lists that hang or crawl).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub initial_sync_timeout_seconds: u64,

    /// Maximum retry delay of a failing spoke, in seconds (jittered exponential from 1 s).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub max_backoff_seconds: u64,

    /// Seconds between discovery polls in each spoke.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub discovery_interval_seconds: u64,

    /// `reportingInstance` of events and the leader identity prefix (default `POD_NAME`);
    /// at most 128 characters, blank means unset.
    #[arg(long, env = "POD_NAME", value_parser = parse_instance)]
    pub instance: Option<String>,
}

impl HubArgs {
    /// The supervisor settings these flags describe.
    pub fn fleet_options(&self) -> FleetOptions {
        let engage = self.engage_condition.trim();
        FleetOptions {
            inventory: InventoryOptions {
                engage_condition: (!engage.is_empty() && !engage.eq_ignore_ascii_case("none"))
                    .then(|| engage.to_string()),
                trust_domain: non_blank(self.trust_domain.as_ref()),
                spire_class_name: non_blank(self.spire_class_name.as_ref()),
                select: SelectOptions {
                    allow_plain_http: false,
                    ..self.access.select_options()
                },
            },
            removal_policy: self.removal_policy,
            removal_timeout: Duration::from_secs(self.removal_timeout_seconds),
            max_concurrent_syncs: usize::from(self.concurrency),
            initial_sync_timeout: Duration::from_secs(self.initial_sync_timeout_seconds),
            request_timeout: Duration::from_secs(self.request_timeout_seconds),
            client: ClientOptions {
                connect_timeout: Some(Duration::from_secs(self.connect_timeout_seconds)),
                ..ClientOptions::default()
            },
            backoff: BackoffOptions {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(self.max_backoff_seconds),
            },
            spoke_concurrency: usize::from(self.spoke_concurrency),
            discovery_interval: Duration::from_secs(self.discovery_interval_seconds),
            event_instance: non_blank(self.instance.as_ref()),
            ..FleetOptions::default()
        }
    }

    /// The credential cache settings these flags describe.
    pub fn cache_options(&self) -> CacheOptions {
        CacheOptions {
            exec: ExecOptions {
                timeout: Duration::from_secs(self.exec_timeout_seconds),
                log_stderr_excerpt: self.log_plugin_stderr,
                ..ExecOptions::default()
            },
            ..CacheOptions::default()
        }
    }

    /// Which ClusterProfiles to watch.
    pub fn watch_options(&self) -> WatchOptions {
        WatchOptions {
            namespace: self.clusterprofile_namespace.clone(),
            label_selector: self.clusterprofile_selector.clone(),
        }
    }

    /// The leader-election settings these flags describe.
    pub fn leader_options(&self) -> LeaderOptions {
        let mut o = LeaderOptions::new(self.lease_name.clone());
        if let Some(ns) = &self.namespace {
            o.namespace = ns.clone();
        }
        // `--instance` (`POD_NAME` when unset) prefixes the identity.
        o.identity = leader::identity(self.instance.as_deref());
        o.lease_duration = Duration::from_secs(self.lease_duration_seconds);
        o.renew_deadline = o.lease_duration * 2 / 3;
        o.retry_period = (o.lease_duration * 2 / 15).max(Duration::from_millis(200));
        o
    }
}

/// The hub cluster's client from `--kubeconfig`/`--context`, else the usual inference.
pub async fn hub_client(args: &HubArgs) -> anyhow::Result<kube::Client> {
    client_from_flags(args.kubeconfig.as_deref(), args.context.as_deref())
        .await
        .context("building the hub client")
}

/// A client from the `--kubeconfig`/`--context` flags every kleym command takes: the given
/// file (and context), else the default kubeconfig with that context, else the usual
/// inference (`KUBECONFIG`, `~/.kube/config`, in-cluster).
pub async fn client_from_flags(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .context("loading kubeconfig")?,
        (None, None) => kube::Config::infer()
            .await
            .context("no kubeconfig (KUBECONFIG, ~/.kube/config) and not running in a cluster")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Whether the ClusterProfile inventory has been listed once (one input of `/readyz`).
#[derive(Clone, Debug, Default)]
pub struct HubReadiness(Arc<AtomicBool>);

impl HubReadiness {
    /// Whether the hub is ready.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What [`start_hub_with`] runs besides the supervisor.
#[derive(Debug, Clone, Default)]
pub struct HubStartOptions {
    /// Run the status loop (writes `ClusterIdentityStatus` and `FleetIdentityReport` while
    /// leading) with these options; `None` leaves status writing to the caller.
    pub status: Option<StatusLoopOptions>,
}

/// The running pieces of a hub, for in-process use (tests, benchmarks).
pub struct HubHandle {
    /// Published fleet state.
    pub state: FleetState,
    /// Inventory listed once.
    pub readiness: HubReadiness,
    /// What the HTTP API serves (report, clusters, readiness, leadership).
    pub view: Arc<FleetHubView>,
    /// Metrics registry: credential, fleet, per-spoke/findings and API metrics.
    pub registry: Arc<Registry>,
    /// The API's metrics (registered on [`HubHandle::registry`]).
    pub api_metrics: ApiMetrics,
    /// Credential cache (exec counts are in its metrics).
    pub credentials: Arc<CredentialCache>,
    /// Ends when the hub stopped.
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the hub's fleet machinery (leader election, inventory watch, supervisor) on
/// `client` without the HTTP server and without the status loop; it stops when `shutdown`
/// fires. See [`start_hub_with`].
pub fn start_hub(
    args: &HubArgs,
    client: kube::Client,
    shutdown: CancellationToken,
) -> anyhow::Result<HubHandle> {
    start_hub_with(args, client, HubStartOptions::default(), shutdown)
}

/// [`start_hub`] plus what `options` asks for (the status loop); `kleym hub` runs this with
/// the status loop on.
pub fn start_hub_with(
    args: &HubArgs,
    client: kube::Client,
    options: HubStartOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<HubHandle> {
    let providers = Arc::new(
        args.access
            .provider_set()
            .context("loading the access provider configuration")?,
    );
    let mut registry = Registry::default();
    let cred_metrics = CredentialMetrics::register(&mut registry);
    let fleet_metrics = FleetMetrics::register(&mut registry);
    let api_metrics = ApiMetrics::register(&mut registry);
    let credentials = Arc::new(CredentialCache::new(args.cache_options(), cred_metrics));
    let state = FleetState::new();
    let supervisor = Supervisor::new(
        args.fleet_options(),
        providers,
        credentials.clone(),
        state.clone(),
        client.clone(),
    );
    registry.register_collector(Box::new(FleetCollector::new(state.clone())));
    registry.register_collector(Box::new(super::SpokeMetricsCollector::new(
        state.spoke_metrics().clone(),
    )));
    let (leader_rx, election, leader_info) = if args.leader_elect {
        let opts = args.leader_options();
        let info = LeaderInfo::default();
        // The election only says whether *we* lead; followers also need the holder's name
        // (named in their 503) and `/readyz` needs to know leadership is settled.
        tokio::spawn(observe_lease(
            client.clone(),
            opts.namespace.clone(),
            opts.lease_name.clone(),
            opts.retry_period,
            info.clone(),
            shutdown.clone(),
        ));
        let (rx, h) = leader::spawn(client.clone(), opts, shutdown.clone());
        (rx, Some(h), info)
    } else {
        (leader::always_leader(), None, LeaderInfo::always_leader())
    };
    let readiness = HubReadiness::default();
    let view = Arc::new(FleetHubView::new(
        state.clone(),
        readiness.clone(),
        leader_info,
    ));
    // The loop writes only while `state.is_leader()`, which the supervisor keeps current.
    let status = options.status.map(|o| {
        tokio::spawn(run_status_loop(
            client.clone(),
            state.clone(),
            o,
            shutdown.clone(),
        ))
    });
    let ready = readiness.clone();
    let events = watch(client, &args.watch_options()).inspect(move |ev| {
        if matches!(ev, InventoryEvent::Resynced(_)) {
            ready.set();
        }
    });
    tokio::spawn(fleet_metrics.follow(state.clone(), Duration::from_millis(500)));
    let task = tokio::spawn(async move {
        supervisor.run(events, leader_rx, shutdown).await;
        if let Some(h) = status {
            let _ = h.await;
        }
        // Releases the lease after every spoke task stopped.
        if let Some(h) = election {
            let _ = h.await;
        }
    });
    Ok(HubHandle {
        state,
        readiness,
        view,
        registry: Arc::new(registry),
        api_metrics,
        credentials,
        task,
    })
}

/// The hub API router (`/healthz`, `/readyz`, `/metrics`, `/v1/*`) over `hub`, reviewing
/// callers' tokens with `client` (the hub cluster) as `api` configures.
pub fn api_router(hub: &HubHandle, api: &ApiArgs, client: kube::Client) -> Router {
    let view: Arc<dyn HubView> = hub.view.clone();
    let auth = ApiAuth::new(
        api.auth_config(),
        Arc::new(KubeReviewer::new(client)),
        hub.api_metrics.clone(),
    );
    crate::http::router(ApiState {
        view,
        registry: hub.registry.clone(),
        auth,
        metrics: hub.api_metrics.clone(),
    })
}

/// State of [`health_router`] and [`probe_router`].
#[derive(Clone)]
struct HealthState {
    view: Arc<FleetHubView>,
    registry: Arc<Registry>,
}

/// `/healthz` and `/readyz` (the API's readiness: inventory synced and leadership known).
fn probe_routes() -> Router<HealthState> {
    async fn readyz(State(s): State<HealthState>) -> axum::response::Response {
        let r = s.view.ready();
        if r.is_ready() {
            (StatusCode::OK, "ok").into_response()
        } else {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({"reason": "NotReady", "readiness": r})),
            )
                .into_response()
        }
    }
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
}

fn health_state(hub: &HubHandle) -> HealthState {
    HealthState {
        view: hub.view.clone(),
        registry: hub.registry.clone(),
    }
}

/// `/healthz`, `/readyz` (the API's readiness: inventory synced and leadership known) and
/// `/metrics` only, for the plain-HTTP `--metrics-addr` listener.
pub fn health_router(hub: &HubHandle) -> Router {
    async fn metrics(State(s): State<HealthState>) -> axum::response::Response {
        encode_metrics(s.registry).await
    }
    probe_routes()
        .route("/metrics", get(metrics))
        .with_state(health_state(hub))
}

/// `/healthz` and `/readyz` as [`health_router`] serves them, without `/metrics`: the
/// `--health-addr` listener.
pub fn probe_router(hub: &HubHandle) -> Router {
    probe_routes().with_state(health_state(hub))
}

/// The `--health-addr` to bind besides `--metrics-addr`: `health`, unless it is unset or the
/// same address (the probes are served there already).
pub fn separate_health_addr(health: Option<SocketAddr>, metrics: SocketAddr) -> Option<SocketAddr> {
    health.filter(|h| *h != metrics)
}

/// `/metrics` of the plain-HTTP servers, built off the async workers as the API router's
/// is (encoding walks every spoke's series).
async fn encode_metrics(registry: Arc<Registry>) -> axum::response::Response {
    match crate::http::metrics::metrics_response_blocking(registry).await {
        Ok(resp) => resp,
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        )
            .into_response(),
    }
}

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
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("binding --metrics-addr {}", args.metrics_addr))?;
    let probe_listener = match separate_health_addr(args.health_addr, args.metrics_addr) {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --health-addr {addr}"))?,
        ),
        None => None,
    };
    let hub = start_hub_with(
        args,
        client.clone(),
        HubStartOptions {
            status: Some(StatusLoopOptions::default()),
        },
        shutdown.clone(),
    )?;
    tracing::info!(
        metrics_addr = %args.metrics_addr,
        health_addr = ?probe_listener.as_ref().and(args.health_addr),
        api_addr = ?api_listener.as_ref().map(|_| args.api.api_addr),
        api_auth_mode = ?args.api.auth_mode(),
        leader_elect = args.leader_elect,
        "kleym hub starting"
    );
    let health_app = health_router(&hub);
    let health_shutdown = shutdown.clone();
    let health = tokio::spawn(async move {
        axum::serve(listener, health_app)
            .with_graceful_shutdown(async move { health_shutdown.cancelled().await })
            .await
    });
    let probes = probe_listener.map(|l| {
        let app = probe_router(&hub);
        let probe_shutdown = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(l, app)
                .with_graceful_shutdown(async move { probe_shutdown.cancelled().await })
                .await
        })
    });
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
    if let Ok(Err(err)) = health.await {
        tracing::warn!(error = %err, "health server failed");
    }
    if let Some(probes) = probes
        && let Ok(Err(err)) = probes.await
    {
        tracing::warn!(error = %err, "probe server failed");
    }
    if let Some(api) = api
        && let Ok(Err(err)) = api.await
    {
        tracing::warn!(error = %err, "hub API server failed");
    }
    tracing::info!("kleym hub stopped");
    Ok(())
}

#[derive(Clone)]
struct HttpState {
    readiness: HubReadiness,
    registry: Arc<Registry>,
}

/// A standalone `/healthz`, `/readyz` (inventory listed once), `/metrics` server (used by the
/// demo; `kleym hub` itself serves [`health_router`] and [`api_router`]).
pub async fn serve_health(
    listener: tokio::net::TcpListener,
    readiness: HubReadiness,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
        if s.readiness.is_ready() {
            (StatusCode::OK, "ok")
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, "inventory not listed yet")
        }
    }
    async fn metrics(State(s): State<HttpState>) -> axum::response::Response {
        encode_metrics(s.registry).await
    }
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(HttpState {
            readiness,
            registry,
        });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: HubArgs,
    }
    #[test]
    fn parses_flags_into_options() {
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            "td.example",
            "--clusterprofile-namespace",
            "fleet",
            "--clusterprofile-selector",
            "env=prod",
            "--engage-condition",
            "none",
            "--removal-policy",
            "cleanup",
            "--removal-timeout-seconds",
            "90",
            "--leader-elect=false",
            "--namespace",
            "kleym-system",
            "--concurrency",
            "3",
            "--clusterprofile-access-provider",
            "tok=/bin/true",
        ])
        .unwrap();
        let o = w.args.fleet_options();
        assert_eq!(o.inventory.engage_condition, None);
        assert_eq!(o.inventory.trust_domain.as_deref(), Some("td.example"));
        assert_eq!(o.removal_policy, RemovalPolicy::Cleanup);
        assert_eq!(o.removal_timeout, Duration::from_secs(90));
        assert_eq!(o.max_concurrent_syncs, 3);
        assert!(!w.args.leader_elect);
        assert_eq!(w.args.leader_options().namespace, "kleym-system");
        assert_eq!(
            w.args.watch_options(),
            WatchOptions {
                namespace: Some("fleet".into()),
                label_selector: Some("env=prod".into())
            }
        );
        assert_eq!(w.args.access.provider_set().unwrap().providers().len(), 1);
    }

    #[test]
    fn bad_trust_domain_and_selector_fail_parsing_naming_the_flag() {
        for (flag, value, needle) in [
            ("--trust-domain", "Example.ORG", "not a SPIFFE trust domain"),
            (
                "--trust-domain",
                "spiffe://example.org",
                "without spiffe://",
            ),
            ("--trust-domain", "a b", "not a SPIFFE trust domain"),
            (
                "--clusterprofile-selector",
                "env=prod,",
                "not a label selector: found ''",
            ),
            ("--clusterprofile-selector", "env in prod", "expected: '('"),
            ("--clusterprofile-selector", "Bad_Prefix/x=y", "prefix part"),
        ] {
            let e = Wrapper::try_parse_from(["kleym", flag, value])
                .expect_err(value)
                .to_string();
            assert!(
                e.contains(flag) && e.contains(needle),
                "{flag} {value}: {e}"
            );
        }
        // Valid values and an empty trust domain (none) still parse.
        let w = Wrapper::try_parse_from([
            "kleym",
            "--trust-domain",
            "",
            "--clusterprofile-selector",
            "env in (prod,staging),!legacy",
        ])
        .unwrap();
        assert_eq!(w.args.fleet_options().inventory.trust_domain, None);
        let w = Wrapper::try_parse_from(["kleym", "--trust-domain", "td_1.example-x"]).unwrap();
        assert_eq!(
            w.args.fleet_options().inventory.trust_domain.as_deref(),
            Some("td_1.example-x")
        );
    }

    /// Every flag whose value could parse as a string but break every reconcile, watch or
    /// request is checked when parsed, naming the flag.
    #[test]
    fn values_that_would_break_every_reconcile_fail_parsing() {
        for (flag, value, needle) in [
            (
                "--clusterprofile-namespace",
                "Fleet",
                "not a namespace name",
            ),
            ("--namespace", "", "not a namespace name"),
            ("--lease-name", "Kleym-Hub", "not a Lease name"),
            ("--engage-condition", "Ready=True", "not a condition type"),
            ("--spire-class-name", "a\tb", "control characters"),
            ("--instance", &"i".repeat(129), "at most 128"),
            ("--log-level", "kleym_hub=loud", "not a log filter"),
            ("--api-audience", "", "an audience is required"),
            (
                "--api-negative-cache-ttl-seconds",
                "86401",
                "not in 0..=86400",
            ),
        ] {
            let e = Wrapper::try_parse_from(["kleym", flag, value])
                .expect_err(flag)
                .to_string();
            assert!(
                e.contains(flag) && e.contains(needle),
                "{flag} {value}: {e}"
            );
        }
        // Blank optional values mean unset; surrounding whitespace is dropped.
        let w = Wrapper::try_parse_from([
            "kleym",
            "--spire-class-name",
            " ",
            "--instance",
            " ",
            "--trust-domain",
            " td.example ",
            "--engage-condition",
            " example.com/Ready ",
        ])
        .unwrap();
        let o = w.args.fleet_options();
        assert_eq!(o.inventory.spire_class_name, None);
        assert_eq!(o.event_instance, None);
        assert_eq!(o.inventory.trust_domain.as_deref(), Some("td.example"));
        assert_eq!(
            o.inventory.engage_condition.as_deref(),
            Some("example.com/Ready")
        );
        let w = Wrapper::try_parse_from(["kleym", "--spire-class-name", " spire-a "]).unwrap();
        assert_eq!(
            w.args.fleet_options().inventory.spire_class_name.as_deref(),
            Some("spire-a")
        );
    }

    #[test]
    fn defaults_engage_on_control_plane_healthy_with_election() {
        let w = Wrapper::try_parse_from(["kleym"]).unwrap();
        assert_eq!(
            w.args.fleet_options().inventory.engage_condition.as_deref(),
            Some("ControlPlaneHealthy")
        );
        assert!(w.args.leader_elect);
        assert_eq!(w.args.removal_policy, RemovalPolicy::Orphan);
        assert_eq!(
            w.args.fleet_options().removal_timeout,
            Duration::from_secs(600)
        );
        let l = w.args.leader_options();
        assert!(l.renew_deadline < l.lease_duration && l.retry_period < l.renew_deadline);
    }

    #[test]
    fn instance_prefixes_the_leader_identity() {
        let w = Wrapper::try_parse_from(["kleym", "--instance", "hub-7"]).unwrap();
        let id = w.args.leader_options().identity;
        let suffix = id.strip_prefix("hub-7_").unwrap_or_else(|| panic!("{id}"));
        assert!(!suffix.is_empty(), "{id}");
        assert_eq!(
            w.args.fleet_options().event_instance.as_deref(),
            Some("hub-7")
        );
    }

    #[test]
    fn health_addr_is_optional_and_separate_only_when_it_differs() {
        let w = Wrapper::try_parse_from(["kleym"]).unwrap();
        assert_eq!(w.args.health_addr, None);
        assert_eq!(
            separate_health_addr(w.args.health_addr, w.args.metrics_addr),
            None
        );
        let w = Wrapper::try_parse_from(["kleym", "--health-addr", "0.0.0.0:8081"]).unwrap();
        assert_eq!(
            separate_health_addr(w.args.health_addr, w.args.metrics_addr),
            Some("0.0.0.0:8081".parse().unwrap())
        );
        // The same address as --metrics-addr: served there already, nothing more to bind.
        let w = Wrapper::try_parse_from(["kleym", "--health-addr", "0.0.0.0:8080"]).unwrap();
        assert_eq!(
            separate_health_addr(w.args.health_addr, w.args.metrics_addr),
            None
        );
        assert!(Wrapper::try_parse_from(["kleym", "--health-addr", "8081"]).is_err());
    }

    /// GETs `path` from `addr`, returning the whole response.
    async fn http_get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).await.unwrap();
        response
    }

    /// The `--health-addr` router answers the probes as the `--metrics-addr` one does, and
    /// serves no metrics.
    #[tokio::test]
    async fn probe_router_serves_probes_but_not_metrics() {
        // A hub whose cluster is unreachable: the inventory is never listed (not ready).
        let w = Wrapper::try_parse_from([
            "kleym",
            "--leader-elect=false",
            "--clusterprofile-access-provider",
            "tok=/bin/true",
        ])
        .unwrap();
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let stop = CancellationToken::new();
        let hub = start_hub(&w.args, client, stop.clone()).unwrap();
        let serve = |app: Router| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await });
            addr
        };
        let probes = serve(probe_router(&hub)).await;
        let health = serve(health_router(&hub)).await;
        for addr in [probes, health] {
            assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
            let readyz = http_get(addr, "/readyz").await;
            assert!(readyz.starts_with("HTTP/1.1 503"), "{readyz}");
            assert!(readyz.contains("NotReady"), "{readyz}");
        }
        assert!(
            http_get(probes, "/metrics")
                .await
                .starts_with("HTTP/1.1 404")
        );
        let metrics = http_get(health, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("kleym_hub_leader"), "{metrics}");
        stop.cancel();
    }

    /// `/metrics` of the plain-HTTP server is encoded (off the async workers) from the
    /// registry it was given, on a current-thread runtime too.
    #[tokio::test]
    async fn health_server_serves_the_registry_metrics() {
        use prometheus_client::metrics::counter::Counter;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let mut registry = Registry::default();
        let counter = Counter::<u64>::default();
        registry.register("kleym_test_probe", "a test counter", counter.clone());
        counter.inc_by(7);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_health(
            listener,
            HubReadiness::default(),
            Arc::new(registry),
            stop.clone(),
        ));
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("kleym_test_probe_total 7"), "{response}");
        stop.cancel();
        server.await.unwrap().unwrap();
    }
}
