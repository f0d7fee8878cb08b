//! What a follower serves on `/v1/*`: the leader's published status, the
//! `FleetIdentityReport` and every `ClusterIdentityStatus` in the hub cluster, kept in
//! watch caches (one list and watch per kind, never an API call per request).
//!
//! Only the leader runs spoke reconcilers, so only it holds the fleet state; the Service in
//! front of the replicas selects all of them. Serving the published objects lets every
//! replica answer the same question with the same data (the leader's last write, at most a
//! status pass behind the leader's own view, with the lists capped as the objects cap them),
//! and it stays right when spokes are split between replicas, since the published objects
//! cover the whole fleet whoever wrote them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::StreamExt;
use kleym_api::hub_status::{ClusterIdentityStatus, FLEET_REPORT_NAME, FleetIdentityReport};
use kleym_spoke::reconciler::CancellationToken;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::report::{FullReport, SpokeReport};

/// Why a follower cannot answer from the published status yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotPublished {
    /// The watch caches have not completed their first list.
    #[error("this hub replica has not read the published fleet status yet; retry shortly")]
    NotSynced,
    /// No `FleetIdentityReport` exists: no leader has written one yet.
    #[error("no FleetIdentityReport {FLEET_REPORT_NAME:?} has been published yet; retry shortly")]
    NoReport,
}

/// The published status objects of the hub cluster, as watch caches.
#[derive(Clone)]
pub struct PublishedStatus {
    reports: Store<FleetIdentityReport>,
    statuses: Store<ClusterIdentityStatus>,
    reports_synced: Arc<AtomicBool>,
    statuses_synced: Arc<AtomicBool>,
    /// Moves on every watch event of either kind: the key of the cached bodies.
    version: Arc<AtomicU64>,
}

impl std::fmt::Debug for PublishedStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishedStatus")
            .field("version", &self.version())
            .field("synced", &self.synced())
            .finish_non_exhaustive()
    }
}

impl PublishedStatus {
    /// Starts watching both kinds (cluster-wide) with `client` until `shutdown`.
    pub fn watch(client: kube::Client, shutdown: CancellationToken) -> Self {
        let version = Arc::new(AtomicU64::new(0));
        let (reports, reports_synced) = spawn_reflector(
            kube::Api::<FleetIdentityReport>::all(client.clone()),
            version.clone(),
            shutdown.clone(),
        );
        let (statuses, statuses_synced) = spawn_reflector(
            kube::Api::<ClusterIdentityStatus>::all(client),
            version.clone(),
            shutdown,
        );
        Self {
            reports,
            statuses,
            reports_synced,
            statuses_synced,
            version,
        }
    }

    /// Changes whenever either cache changed.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Both caches completed their first list.
    pub fn synced(&self) -> bool {
        self.reports_synced.load(Ordering::Acquire) && self.statuses_synced.load(Ordering::Acquire)
    }

    fn spokes(&self) -> Vec<SpokeReport> {
        let mut spokes: Vec<SpokeReport> = self
            .statuses
            .state()
            .iter()
            .filter_map(|s| {
                let ns = s.metadata.namespace.as_deref()?;
                let name = s.metadata.name.as_deref()?;
                Some(SpokeReport {
                    cluster: format!("{ns}/{name}"),
                    status: s.status.clone().unwrap_or_default(),
                })
            })
            .collect();
        spokes.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        spokes
    }

    /// `/v1/report` from the published objects: the `FleetIdentityReport`'s status with every
    /// `ClusterIdentityStatus` as `spokes`, in the leader's body's shape.
    pub fn report(&self) -> Result<FullReport, NotPublished> {
        if !self.synced() {
            return Err(NotPublished::NotSynced);
        }
        let report = self
            .reports
            .get(&ObjectRef::new(FLEET_REPORT_NAME))
            .ok_or(NotPublished::NoReport)?;
        Ok(FullReport {
            summary: report.status.clone().unwrap_or_default(),
            spokes: self.spokes(),
        })
    }

    /// `/v1/clusters` items from the published objects. A published status carries no
    /// `phase` (the leader's in-memory engagement state): the items hold the rest.
    pub fn clusters(&self) -> Result<Vec<Value>, NotPublished> {
        if !self.statuses_synced.load(Ordering::Acquire) {
            return Err(NotPublished::NotSynced);
        }
        Ok(self.spokes().into_iter().map(cluster_item).collect())
    }

    /// One `/v1/clusters/{namespace}/{name}` item; `Ok(None)` when no status is published
    /// for it.
    pub fn cluster(&self, namespace: &str, name: &str) -> Result<Option<Value>, NotPublished> {
        if !self.statuses_synced.load(Ordering::Acquire) {
            return Err(NotPublished::NotSynced);
        }
        Ok(self
            .statuses
            .get(&ObjectRef::new(name).within(namespace))
            .map(|s| {
                cluster_item(SpokeReport {
                    cluster: format!("{namespace}/{name}"),
                    status: s.status.clone().unwrap_or_default(),
                })
            }))
    }
}

fn cluster_item(s: SpokeReport) -> Value {
    let (namespace, name) = s
        .cluster
        .split_once('/')
        .map(|(n, m)| (n.to_string(), m.to_string()))
        .unwrap_or_default();
    json!({
        "cluster": s.cluster,
        "namespace": namespace,
        "name": name,
        "consecutiveFailures": s.status.consecutive_failures.unwrap_or(0),
        "status": s.status,
    })
}

/// A reflector of `api` into a store; every event moves `version`; the flag turns true
/// when the first list completed.
fn spawn_reflector<K>(
    api: kube::Api<K>,
    version: Arc<AtomicU64>,
    shutdown: CancellationToken,
) -> (Store<K>, Arc<AtomicBool>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let synced = Arc::new(AtomicBool::new(false));
    let flag = synced.clone();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .boxed();
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = events.next() => ev,
            };
            match event {
                None => return,
                Some(Ok(ev)) => {
                    if matches!(ev, watcher::Event::InitDone) {
                        flag.store(true, Ordering::Release);
                    }
                    version.fetch_add(1, Ordering::AcqRel);
                }
                // The backoff retries; the store keeps the last state meanwhile.
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "watching the published fleet status failed")
                }
            }
        }
    });
    (reader, synced)
}
