//! Starting the hub's subsystems on a hub-cluster client: credential cache, supervisor,
//! leader election and Lease observation, inventory watch, status loop and metrics
//! registry, handed back as a [`HubHandle`] for the servers and for in-process use (tests,
//! benchmarks).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use kleym_spoke::reconciler::CancellationToken;
use prometheus_client::registry::Registry;

use super::args::HubArgs;
use super::coordination::Coordination;
use super::view::{FleetCollector, FleetHubView, LeaderInfo, observe_lease};
use crate::credentials::{CredentialCache, CredentialMetrics, spoke_user_agent};
use crate::fleet::{
    FleetMetrics, FleetOptions, FleetState, ShardLink, SpokeMetricsCollector, Supervisor,
};
use crate::http::ApiMetrics;
use crate::inventory::{InventoryEvent, InventorySynced, InventoryVersion, spoke_name, watch};
use crate::leader;
use crate::shard::ShardMetrics;
use crate::status::{
    ObservationCache, ReportInputs, StatusLoopOptions, StatusMetrics, run_status_loop,
};

/// What [`start_hub_with`] runs besides the supervisor.
#[derive(Debug, Clone, Default)]
pub struct HubStartOptions {
    /// Run the status loop (writes `ClusterIdentityStatus` and `FleetIdentityReport` while
    /// leading) with these options; `None` leaves status writing to the caller.
    pub status: Option<StatusLoopOptions>,
    /// Where the Lease work (membership, leader election, the leader Lease's watch) runs:
    /// `None` runs it on the caller's runtime with the hub client.
    pub coordination: Option<Coordination>,
}

/// The running pieces of a hub, for in-process use (tests, benchmarks).
pub struct HubHandle {
    /// Published fleet state.
    pub state: FleetState,
    /// Inventory listed once (one input of `/readyz`).
    pub inventory_synced: InventorySynced,
    /// The ClusterProfile version the inventory reads.
    pub inventory_version: InventoryVersion,
    /// Passes of the status loop (registered on [`HubHandle::registry`]).
    pub status_metrics: StatusMetrics,
    /// What the HTTP API serves (report, clusters, readiness, leadership).
    pub view: Arc<FleetHubView>,
    /// Metrics registry: credential, fleet, per-spoke/findings and API metrics.
    pub registry: Arc<Registry>,
    /// The API's metrics (registered on [`HubHandle::registry`]).
    pub api_metrics: ApiMetrics,
    /// Credential cache (exec counts are in its metrics).
    pub credentials: Arc<CredentialCache>,
    /// The issuer's metrics (registered on [`HubHandle::registry`] when `--issuer-url` is set).
    pub issuer_metrics: crate::issuer::metrics::IssuerMetrics,
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
    let leader_opts = args.leader_options();
    let shard_opts = args.shard_options(&leader_opts);
    let shard_metrics = shard_opts
        .as_ref()
        .map(|_| ShardMetrics::register(&mut registry));
    let api_metrics = ApiMetrics::register(&mut registry);
    let status_metrics = StatusMetrics::register(&mut registry);
    let issuer_metrics = if args.issuer.issuer_url.is_some() {
        crate::issuer::metrics::IssuerMetrics::register(&mut registry)
    } else {
        crate::issuer::metrics::IssuerMetrics::default()
    };
    let credentials = Arc::new(CredentialCache::new(args.cache_options(), cred_metrics));
    let state = FleetState::new();
    FleetMetrics::register_engage(&mut registry, &state);
    // One handle: the inventory watch sets the version it reads, the finalizer writes,
    // ownerReferences and `/readyz` follow it.
    let inventory_version = InventoryVersion::default();
    // One identity per process: the leader election's, the replica Lease's, and the
    // replica named in the user agent of every request to a spoke (so a spoke's audit log
    // tells replicas apart).
    let mut fleet_options = args.fleet_options();
    fleet_options.client.user_agent = Some(spoke_user_agent(&leader_opts.identity));
    let mut supervisor = Supervisor::new(
        FleetOptions {
            profile_version: inventory_version.clone(),
            svid_policy: Arc::new(
                args.svid
                    .policy()
                    .context("the SVID policy flags (--cluster-domain, --svid-*, --hub-*)")?,
            ),
            ..fleet_options
        },
        providers,
        credentials.clone(),
        state.clone(),
        client.clone(),
    );
    // Sharded mode: membership runs until the supervisor stopped every spoke (its own
    // token, cancelled after `supervisor.run` returned), then deletes this replica's
    // Lease so the others take its spokes over at once.
    let coordination = options.coordination.clone();
    let (lease_runtime, lease_client) = match &coordination {
        Some(c) => (c.handle().clone(), c.client().clone()),
        None => (tokio::runtime::Handle::current(), client.clone()),
    };
    let membership_stop = CancellationToken::new();
    let membership = match (shard_opts, shard_metrics) {
        (Some(opts), Some(metrics)) => {
            let h = crate::shard::spawn(
                &lease_runtime,
                lease_client.clone(),
                opts,
                metrics.clone(),
                membership_stop.clone(),
            );
            supervisor = supervisor.with_shards(ShardLink {
                ownership: h.ownership.clone(),
                released: h.released.clone(),
                metrics,
            });
            Some(h)
        }
        _ => None,
    };
    registry.register_collector(Box::new(FleetCollector::new(state.clone())));
    registry.register_collector(Box::new(SpokeMetricsCollector::new(
        state.spoke_metrics().clone(),
    )));
    let (leader_rx, election, leader_info) = if args.leader_elect() {
        let opts = leader_opts;
        let info = LeaderInfo::default();
        // The election only says whether *we* lead; followers also need the holder's name
        // (named in their 503) and `/readyz` needs to know leadership is settled.
        lease_runtime.spawn(observe_lease(
            lease_client.clone(),
            opts.namespace.clone(),
            opts.lease_name.clone(),
            opts.retry_period,
            info.clone(),
            shutdown.clone(),
        ));
        let (rx, h) = leader::spawn(&lease_runtime, lease_client, opts, shutdown.clone());
        (rx, Some(h), info)
    } else {
        (leader::always_leader(), None, LeaderInfo::always_leader())
    };
    let inventory_synced = InventorySynced::default();
    let mut view = FleetHubView::new(state.clone(), inventory_synced.clone(), leader_info)
        .with_inventory_version(inventory_version.clone());
    if membership.is_some() {
        view = view.sharded();
    }
    if args.leader_elect() && args.api.serves() {
        // Followers answer `/v1/*` from the published status objects, watched here (a
        // replica that leads now may follow later). Without the API nothing reads them.
        view = view.with_published(super::published::PublishedStatus::watch(
            client.clone(),
            shutdown.clone(),
        ));
    }
    // Published observations live in the hub namespace (the leader Lease's); one watch
    // serves both the status loop and the API.
    let sharded = membership.is_some();
    let status_options = options.status.map(|mut o| {
        o.observations.namespace = args.leader_options().namespace;
        if sharded {
            // Each replica runs only its share of the spokes: the report is built from
            // every replica's published observations.
            o.observations.publish = true;
            o.observations.inputs = ReportInputs::Published;
        }
        let observed = &o.observations;
        if observed.cache.is_none()
            && (observed.publish || observed.inputs == ReportInputs::Published)
        {
            o.observations.cache = Some(ObservationCache::watch(
                client.clone(),
                &observed.namespace,
                observed.limits,
                shutdown.clone(),
            ));
        }
        o
    });
    if let Some(o) = &status_options
        && o.observations.inputs == ReportInputs::Published
        && let Some(cache) = &o.observations.cache
    {
        view = view.with_report_from_observations(cache.clone());
    }
    let view = Arc::new(view);
    // The loop writes only while `state.is_leader()`, which the supervisor keeps current.
    let status = status_options.map(|o| {
        tokio::spawn(run_status_loop(
            client.clone(),
            state.clone(),
            StatusLoopOptions {
                profile_version: inventory_version.clone(),
                metrics: status_metrics.clone(),
                ..o
            },
            shutdown.clone(),
        ))
    });
    let synced = inventory_synced.clone();
    let uids = state.clone();
    let events =
        watch(client, &args.watch_options(), inventory_version.clone()).inspect(move |ev| {
            // Before the supervisor sees the event: a spoke is in the state only once its
            // profile's UID is known, so the status loop never lists profiles for it.
            match ev {
                InventoryEvent::Upsert(cp) => {
                    if let Some(uid) = cp.metadata.uid.as_deref() {
                        uids.note_profile_uid(&spoke_name(cp), uid);
                    }
                }
                InventoryEvent::Deleted(name) => uids.forget_profile_uid(name),
                InventoryEvent::Resynced(listed) => {
                    uids.retain_profile_uids(|name| listed.contains(name));
                    synced.mark_synced();
                }
            }
        });
    tokio::spawn(fleet_metrics.follow(state.clone(), Duration::from_millis(500)));
    let task = tokio::spawn(async move {
        supervisor.run(events, leader_rx, shutdown).await;
        // Every spoke task has stopped: only now may this replica's Lease go.
        membership_stop.cancel();
        if let Some(m) = membership {
            let _ = m.task.await;
        }
        if let Some(h) = status {
            let _ = h.await;
        }
        // Releases the lease after every spoke task stopped.
        if let Some(h) = election {
            let _ = h.await;
        }
        // The Lease work has ended: its runtime may stop.
        drop(coordination);
    });
    Ok(HubHandle {
        state,
        inventory_synced,
        inventory_version,
        status_metrics,
        view,
        registry: Arc::new(registry),
        api_metrics,
        credentials,
        issuer_metrics,
        task,
    })
}
