//! Per-spoke configuration and the shared reconcile context. Everything is owned by one
//! reconciler instance: the hub runs many side by side in one process.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kleym_api::InferenceIdentityBinding;
use kleym_api::external::spiffeid::ClusterSPIFFEID;
use kube::runtime::events::Reporter;

use super::api_availability::ServedApis;
use super::caches::Caches;
use super::compile::CompileMemo;
use super::events::EventPublisher;
use super::index::Index;
use super::metrics::SpokeMetrics;
use super::ns_cache::NamespaceCache;
use super::overlay::Overlay;
use super::queue::{ObjectKey, WorkQueue};
use super::snapshot::SnapshotMemo;
use super::watches::WatchFailures;
use crate::compiler::ForeignSpiffeId;

/// Field manager kleym uses for every write.
pub const DEFAULT_FIELD_MANAGER: &str = "kleym";
/// Finalizer kleym puts on bindings that own a ClusterSPIFFEID.
pub const FINALIZER: &str = "kleym.io/cleanup";

/// Configuration of one spoke reconciler.
#[derive(Debug, Clone)]
pub struct SpokeConfig {
    /// SPIFFE trust domain of the cluster (required).
    pub trust_domain: String,
    /// SPIRE Controller Manager `className` for generated ClusterSPIFFEIDs, if any.
    pub class_name: Option<String>,
    /// Field manager for server-side apply (`kleym`).
    pub field_manager: String,
    /// Reconciles running at once.
    pub concurrency: usize,
    /// How often discovery is polled for CRDs that appear or disappear.
    pub discovery_interval: Duration,
    /// Requeue delay after a failed reconcile (doubles per failure, capped at 5 min).
    pub error_backoff: Duration,
    /// `reportingController` of events.
    pub event_reporter: String,
    /// `reportingInstance` of events (e.g. the pod name).
    pub event_instance: Option<String>,
    /// Publish Kubernetes events (refusals, collisions and their resolution).
    pub publish_events: bool,
}

impl SpokeConfig {
    /// Defaults for everything but the trust domain.
    pub fn new(trust_domain: impl Into<String>) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            class_name: None,
            field_manager: DEFAULT_FIELD_MANAGER.to_string(),
            concurrency: 4,
            discovery_interval: Duration::from_secs(30),
            error_backoff: Duration::from_millis(500),
            event_reporter: "kleym-spoke".to_string(),
            event_instance: None,
            publish_events: true,
        }
    }

    pub(crate) fn reporter(&self) -> Reporter {
        Reporter {
            controller: self.event_reporter.clone(),
            instance: self.event_instance.clone(),
        }
    }
}

/// A reconciler's readiness flag: set once its caches have synced. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct CachesSynced(Arc<std::sync::atomic::AtomicBool>);

impl CachesSynced {
    /// Are the caches synced?
    pub fn is_ready(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets readiness.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, std::sync::atomic::Ordering::Release);
    }
}

/// Shared state of one reconciler.
pub struct Context {
    /// Client of the spoke cluster.
    pub client: kube::Client,
    /// Configuration.
    pub config: SpokeConfig,
    /// Watched objects.
    pub caches: Caches,
    /// Dependency index (pool → targets → bindings).
    pub index: RwLock<Index>,
    /// APIs the cluster serves (last discovery).
    pub served: RwLock<ServedApis>,
    /// Work queue of binding keys.
    pub queue: WorkQueue,
    /// Metrics.
    pub metrics: Arc<SpokeMetrics>,
    /// Event publisher.
    pub events: EventPublisher,
    /// Set once the caches have synced.
    pub readiness: CachesSynced,
    /// ClusterSPIFFEID name → binding that wants it (to re-enqueue a binding refused
    /// because a foreign object holds its name when that object goes away).
    pub name_claims: Mutex<HashMap<String, ObjectKey>>,
    /// Consecutive failures per binding (for the error backoff).
    pub failures: Mutex<HashMap<ObjectKey, u32>>,
    /// Bindings as our own writes returned them (read-your-writes).
    pub binding_overlay: Overlay<InferenceIdentityBinding>,
    /// ClusterSPIFFEIDs as our own writes returned them (read-your-writes).
    pub csid_overlay: Overlay<ClusterSPIFFEID>,
    /// ClusterSPIFFEIDs kleym does not manage, by name (overlap warnings).
    pub foreign_spiffe_ids: RwLock<BTreeMap<String, ForeignSpiffeId>>,
    /// Compile results of unchanged bindings.
    pub compile_memo: CompileMemo,
    /// Namespace evaluations shared by the reconciles of a namespace until an input
    /// changes (the watch handlers invalidate them).
    pub namespace_cache: NamespaceCache,
    /// The hub's last snapshot of the bindings, reused while the binding cache is unchanged.
    pub binding_snapshot: SnapshotMemo,
    /// Failures of watches whose cache has not synced yet (why an initial sync is stuck).
    pub watch_failures: WatchFailures,
}

impl Context {
    /// Builds a context.
    pub fn new(client: kube::Client, config: SpokeConfig, metrics: Arc<SpokeMetrics>) -> Self {
        let events = EventPublisher::new(client.clone(), config.reporter(), config.publish_events);
        Self {
            client,
            config,
            caches: Caches::default(),
            index: RwLock::new(Index::new()),
            served: RwLock::new(ServedApis::none()),
            queue: WorkQueue::new(),
            metrics,
            events,
            readiness: CachesSynced::default(),
            name_claims: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            binding_overlay: Overlay::default(),
            csid_overlay: Overlay::default(),
            foreign_spiffe_ids: RwLock::new(BTreeMap::new()),
            compile_memo: CompileMemo::default(),
            namespace_cache: NamespaceCache::default(),
            binding_snapshot: SnapshotMemo::default(),
            watch_failures: WatchFailures::default(),
        }
    }

    /// The served-API set.
    pub fn served(&self) -> ServedApis {
        self.served
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Backoff for the next retry of `key` after a failure.
    pub fn next_backoff(&self, key: &ObjectKey) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        let factor = 1u32 << (*n - 1).min(10);
        (self.config.error_backoff * factor).min(Duration::from_secs(300))
    }

    /// Clears the failure count of `key` after a success.
    pub fn reset_backoff(&self, key: &ObjectKey) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}
