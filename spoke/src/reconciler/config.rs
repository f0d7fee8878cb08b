//! Configuration of one spoke reconciler and its readiness flag: plain values every step
//! may read, depending on nothing else in the reconciler.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::Reporter;

use crate::compiler::SvidPolicy;

/// Field manager kleym uses for every write.
pub const DEFAULT_FIELD_MANAGER: &str = "kleym";

/// Configuration of one spoke reconciler.
#[derive(Debug, Clone)]
pub struct SpokeConfig {
    /// SPIFFE trust domain of the cluster (required).
    pub trust_domain: String,
    /// SPIRE Controller Manager `className` for generated ClusterSPIFFEIDs, if any.
    pub class_name: Option<String>,
    /// What bindings may ask for in their SVIDs (DNS names, TTLs, federation) and the hub
    /// identities none may be issued.
    pub svid_policy: Arc<SvidPolicy>,
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
    /// The cluster's name in log lines (the hub's spoke name, `<namespace>/<name>`);
    /// empty for `kleym spoke`, which has one cluster.
    pub cluster: String,
}

impl SpokeConfig {
    /// Defaults for everything but the trust domain.
    pub fn new(trust_domain: impl Into<String>) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            class_name: None,
            svid_policy: Arc::default(),
            field_manager: DEFAULT_FIELD_MANAGER.to_string(),
            concurrency: 4,
            discovery_interval: Duration::from_secs(30),
            error_backoff: Duration::from_millis(500),
            event_reporter: "kleym-spoke".to_string(),
            event_instance: None,
            publish_events: true,
            cluster: String::new(),
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
