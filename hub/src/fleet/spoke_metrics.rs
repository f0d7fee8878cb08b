//! Per-spoke reconcile metrics on the hub's `/metrics`: every live spoke reconciler's
//! [`SpokeMetrics`] (the `kleym_spoke_*` families `kleym spoke` exposes) with an extra
//! `cluster="<ns>/<name>"` label.
//!
//! The registry is built once while spokes come and go, so the metrics live in a shared
//! [`SpokeMetricsMap`] (one instance per spoke task: its gauges are per cluster) and a
//! scrape-time [`SpokeMetricsCollector`] encodes whatever is in it; a disengaged spoke's
//! series disappear with its entry.

use std::sync::Arc;

use dashmap::DashMap;
use kleym_spoke::reconciler::SpokeMetrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};

/// Label `cluster` (the spoke's `<namespace>/<name>`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabel {
    cluster: String,
}

/// The live spokes' reconcile metrics by spoke name. Cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct SpokeMetricsMap {
    inner: Arc<DashMap<String, Arc<SpokeMetrics>>>,
}

impl SpokeMetricsMap {
    /// Fresh metrics for `spoke`, listed until the returned guard drops (replacing what a
    /// previous task of the same spoke may have left).
    pub fn attach(&self, spoke: &str) -> SpokeMetricsGuard {
        let metrics = Arc::new(SpokeMetrics::default());
        self.inner.insert(spoke.to_string(), metrics.clone());
        SpokeMetricsGuard {
            map: self.clone(),
            spoke: spoke.to_string(),
            metrics,
        }
    }

    /// The metrics of `spoke`, if it is live.
    pub fn get(&self, spoke: &str) -> Option<Arc<SpokeMetrics>> {
        self.inner.get(spoke).map(|e| e.value().clone())
    }

    /// Number of live spokes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// No live spoke.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Every live spoke's metrics, sorted by name.
    pub fn snapshot(&self) -> Vec<(String, Arc<SpokeMetrics>)> {
        let mut out: Vec<(String, Arc<SpokeMetrics>)> = self
            .inner
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Keeps one spoke's metrics listed; dropping it (the spoke task ended, or was aborted)
/// removes them unless a newer task of the same spoke already replaced them.
#[derive(Debug)]
pub struct SpokeMetricsGuard {
    map: SpokeMetricsMap,
    spoke: String,
    metrics: Arc<SpokeMetrics>,
}

impl SpokeMetricsGuard {
    /// The metrics to hand to the spoke's reconciler.
    pub fn metrics(&self) -> Arc<SpokeMetrics> {
        self.metrics.clone()
    }
}

impl Drop for SpokeMetricsGuard {
    fn drop(&mut self) {
        self.map
            .inner
            .remove_if(&self.spoke, |_, v| Arc::ptr_eq(v, &self.metrics));
    }
}

/// Scrape-time collector of a [`SpokeMetricsMap`]: `kleym_spoke_*{cluster, …}`, each
/// family described once.
#[derive(Debug, Clone)]
pub struct SpokeMetricsCollector {
    map: SpokeMetricsMap,
}

impl SpokeMetricsCollector {
    /// A collector of `map`.
    pub fn new(map: SpokeMetricsMap) -> Self {
        Self { map }
    }
}

impl Collector for SpokeMetricsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let live = self.map.snapshot();
        let spokes: Vec<(ClusterLabel, &SpokeMetrics)> = live
            .iter()
            .map(|(name, m)| {
                (
                    ClusterLabel {
                        cluster: name.clone(),
                    },
                    m.as_ref(),
                )
            })
            .collect();
        SpokeMetrics::encode_labelled(&mut encoder, &spokes)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kleym_spoke::reconciler::queue::ObjectKey;
    use prometheus_client::registry::Registry;

    use super::*;

    fn scrape(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn two_spokes_are_labelled_by_cluster_and_leave_with_their_task() {
        let map = SpokeMetricsMap::default();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SpokeMetricsCollector::new(map.clone())));
        let a = map.attach("fleet/a");
        let b = map.attach("fleet/b");
        a.metrics()
            .observe_reconcile(Duration::from_millis(1), None);
        b.metrics()
            .observe_reconcile(Duration::from_millis(1), Some("Forbidden"));
        b.metrics()
            .observe_outcome(&ObjectKey::new("ns", "x"), "Ready", "Reconciled");
        let out = scrape(&registry);
        for line in [
            "kleym_spoke_reconciles_total{cluster=\"fleet/a\",result=\"success\"} 1",
            "kleym_spoke_reconciles_total{cluster=\"fleet/b\",result=\"error\"} 1",
            "kleym_spoke_reconcile_failures_total{cluster=\"fleet/b\",reason=\"Forbidden\"} 1",
            "kleym_spoke_bindings{cluster=\"fleet/b\",condition=\"Ready\"} 1",
        ] {
            assert!(out.contains(line), "missing {line}: {out}");
        }
        assert_eq!(out.matches("# TYPE kleym_spoke_reconciles ").count(), 1);

        // A newer task of the same spoke replaces the entry; the old guard leaves it alone.
        let a2 = map.attach("fleet/a");
        drop(a);
        assert!(Arc::ptr_eq(&map.get("fleet/a").unwrap(), &a2.metrics()));
        let out = scrape(&registry);
        assert!(!out.contains("cluster=\"fleet/a\",result"), "{out}");
        drop(b);
        drop(a2);
        assert!(map.is_empty());
        assert!(!scrape(&registry).contains("fleet/"));
    }
}
