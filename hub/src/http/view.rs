//! What the API serves, behind a trait so the server does not depend on the fleet
//! supervisor or the report types.

use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::RwLock;

use crate::explain_source::HubCaches;

/// A response body could not be encoded as JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("encoding the response body: {0}")]
pub struct EncodeError(pub String);

/// `value` as a JSON body.
pub fn json_bytes<T: serde::Serialize + ?Sized>(value: &T) -> Result<Bytes, EncodeError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| EncodeError(e.to_string()))
}

/// The `/v1/clusters` body of `items`: `{"count": N, "items": [...]}`.
pub fn clusters_body(items: &[Value]) -> Result<Bytes, EncodeError> {
    json_bytes(&json!({"count": items.len(), "items": items}))
}

/// This replica's view of leader election.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct LeaderState {
    /// Whether this replica holds the Lease (and so runs the spokes and writes status).
    pub is_leader: bool,
    /// The Lease holder's identity, when known.
    pub leader_identity: Option<String>,
}

/// The inputs of `/readyz`: ready = inventory synced AND leadership known AND a
/// ClusterProfile version can be read. Spokes are deliberately absent: an unreachable spoke
/// must not take the hub out of its Service.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HubReadiness {
    /// The ClusterProfile inventory has completed its initial list.
    pub inventory_synced: bool,
    /// This replica knows whether it leads (it won, or it sees another holder).
    pub leadership_known: bool,
    /// The ClusterProfile version read and why, e.g. `multicluster.x-k8s.io/v1alpha2 (the
    /// hub cluster serves v1alpha2 ...)`; `None` before the first discovery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clusterprofile_version: Option<String>,
    /// Why no ClusterProfile version can be read (CRD missing, pinned version not served).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inventory_error: Option<String>,
}

impl HubReadiness {
    /// Every condition holds.
    pub fn is_ready(&self) -> bool {
        self.inventory_synced && self.leadership_known && self.inventory_error.is_none()
    }
}

/// Whether this replica can read a spoke for `/v1/clusters/{namespace}/{name}/explain/...`.
#[derive(Clone)]
pub enum SpokeReach {
    /// The cluster is not in the inventory (404).
    Unknown,
    /// The cluster is known, but this replica does not reach it now (503 with the reason):
    /// it does not run the cluster's spoke (a follower, or in a sharded hub a replica that
    /// does not own the cluster), or the spoke is not engaged.
    NotHere(String),
    /// The spoke's client, with the hub's own credentials for that cluster: every input
    /// is read from the spoke, as the local command reads it.
    Client(kube::Client),
    /// The spoke reconciler this replica runs for the cluster (the caches explain reads)
    /// and its client for what the caches do not hold (the pod, its node, a pool's pods).
    Cached(HubCaches),
}

impl std::fmt::Debug for SpokeReach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unknown => f.write_str("Unknown"),
            Self::NotHere(why) => f.debug_tuple("NotHere").field(why).finish(),
            Self::Client(_) => f.write_str("Client(..)"),
            Self::Cached(c) => write!(f, "Cached({})", c.cluster),
        }
    }
}

/// The hub state the API exposes. Implemented by the fleet supervisor; [`StaticHubView`]
/// is a settable implementation for tests.
pub trait HubView: Send + Sync + 'static {
    /// The full, uncapped fleet report (`/v1/report`).
    fn report(&self) -> Value;
    /// One entry per cluster in the inventory (`/v1/clusters` serves `{"items": [...]}`).
    fn clusters(&self) -> Vec<Value>;
    /// The cluster `<namespace>/<name>` (`/v1/clusters/{namespace}/{name}`); `None` → 404.
    fn cluster(&self, namespace: &str, name: &str) -> Option<Value>;
    /// `/readyz` inputs.
    fn ready(&self) -> HubReadiness;
    /// Leader election state.
    fn leader(&self) -> LeaderState;

    /// Why this replica cannot answer `/v1/*` right now (a `503 NotPublished` after the
    /// caller was authenticated and authorized), e.g. a follower that has not read the
    /// published status yet; `None` (the default) when it can.
    fn v1_unavailable(&self) -> Option<String> {
        None
    }

    /// How to read the spoke `<namespace>/<name>` (the explain routes). The default knows
    /// the clusters of [`cluster`](Self::cluster) but reaches none of them.
    fn spoke_reach(&self, namespace: &str, name: &str) -> SpokeReach {
        match self.cluster(namespace, name) {
            None => SpokeReach::Unknown,
            Some(_) => SpokeReach::NotHere("this hub API does not read spokes".to_string()),
        }
    }

    /// The `/v1/report` body: [`report`](Self::report) as JSON. Implementations over a large
    /// fleet keep the bytes until their state changes; called on a blocking thread.
    fn report_json(&self) -> Result<Bytes, EncodeError> {
        json_bytes(&self.report())
    }

    /// The `/v1/clusters` body ([`clusters_body`] of [`clusters`](Self::clusters)); same
    /// caching and threading as [`report_json`](Self::report_json).
    fn clusters_json(&self) -> Result<Bytes, EncodeError> {
        clusters_body(&self.clusters())
    }
}

/// A [`HubView`] whose content is set by hand.
#[derive(Debug, Default)]
pub struct StaticHubView {
    state: RwLock<StaticState>,
}

#[derive(Debug, Default)]
struct StaticState {
    report: Value,
    clusters: BTreeMap<(String, String), Value>,
    ready: HubReadiness,
    leader: LeaderState,
    unavailable: Option<String>,
    spokes: BTreeMap<(String, String), SpokeReach>,
}

impl StaticHubView {
    /// A ready leader with an empty report and no clusters.
    pub fn leader() -> Self {
        let v = Self::default();
        v.set_ready(HubReadiness {
            inventory_synced: true,
            leadership_known: true,
            ..HubReadiness::default()
        });
        v.set_leader(LeaderState {
            is_leader: true,
            leader_identity: None,
        });
        v.set_report(serde_json::json!({"findings": []}));
        v
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, StaticState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, StaticState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Replace the report.
    pub fn set_report(&self, report: Value) {
        self.write().report = report;
    }

    /// Add or replace the cluster `<namespace>/<name>`.
    pub fn set_cluster(&self, namespace: &str, name: &str, value: Value) {
        self.write()
            .clusters
            .insert((namespace.to_string(), name.to_string()), value);
    }

    /// Set the readiness inputs.
    pub fn set_ready(&self, ready: HubReadiness) {
        self.write().ready = ready;
    }

    /// Set the leader state.
    pub fn set_leader(&self, leader: LeaderState) {
        self.write().leader = leader;
    }

    /// Reach the cluster `<namespace>/<name>` (which must also be [set](Self::set_cluster))
    /// through `client` on the explain routes.
    pub fn set_spoke_client(&self, namespace: &str, name: &str, client: kube::Client) {
        self.write().spokes.insert(
            (namespace.to_string(), name.to_string()),
            SpokeReach::Client(client),
        );
    }

    /// Reach the cluster `<namespace>/<name>` (which must also be [set](Self::set_cluster))
    /// through the caches of a running spoke reconciler on the explain routes, as the
    /// fleet's view does.
    pub fn set_spoke_caches(&self, namespace: &str, name: &str, caches: HubCaches) {
        self.write().spokes.insert(
            (namespace.to_string(), name.to_string()),
            SpokeReach::Cached(caches),
        );
    }

    /// Make `/v1/*` answer 503 with `message` (`None`: serve again).
    pub fn set_unavailable(&self, message: Option<String>) {
        self.write().unavailable = message;
    }
}

impl HubView for StaticHubView {
    fn report(&self) -> Value {
        self.read().report.clone()
    }

    fn clusters(&self) -> Vec<Value> {
        self.read().clusters.values().cloned().collect()
    }

    fn cluster(&self, namespace: &str, name: &str) -> Option<Value> {
        self.read()
            .clusters
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn ready(&self) -> HubReadiness {
        self.read().ready.clone()
    }

    fn leader(&self) -> LeaderState {
        self.read().leader.clone()
    }

    fn v1_unavailable(&self) -> Option<String> {
        self.read().unavailable.clone()
    }

    fn spoke_reach(&self, namespace: &str, name: &str) -> SpokeReach {
        let key = (namespace.to_string(), name.to_string());
        let state = self.read();
        match (state.clusters.contains_key(&key), state.spokes.get(&key)) {
            (false, _) => SpokeReach::Unknown,
            (true, Some(reach)) => reach.clone(),
            (true, None) => SpokeReach::NotHere(format!(
                "cluster {namespace}/{name} is not engaged by this replica"
            )),
        }
    }
}
