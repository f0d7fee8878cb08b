//! Prometheus metrics of one spoke reconciler.
//!
//! No process-global registry: [`SpokeMetrics::register`] registers into the registry the
//! caller passes (the hub passes a sub-registry labelled with the spoke's name, `kleym
//! spoke` its own), and an unregistered [`SpokeMetrics::default`] works too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::queue::ObjectKey;

/// Label set `{result}`: `success` or `error`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success` or `error`.
    pub result: String,
}

/// Label set `{reason}`: the error category of a failed reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Stable error category (see `Error::category`).
    pub reason: String,
}

/// Label set `{condition, reason}` of a binding outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `Ready` or the refusal condition that is True.
    pub condition: String,
    /// The condition's reason.
    pub reason: String,
}

/// Label set `{condition}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    /// `Ready` or the refusal condition that is True.
    pub condition: String,
}

/// Label set `{write}`: which kind of API write.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `clusterspiffeid_apply`, `clusterspiffeid_delete`, `status_apply`, `finalizer`.
    pub write: String,
}

/// The metrics of one reconciler.
#[derive(Debug)]
pub struct SpokeMetrics {
    reconciles: Family<ResultLabels, Counter>,
    failures: Family<ReasonLabels, Counter>,
    outcomes: Family<OutcomeLabels, Counter>,
    duration: Histogram,
    bindings: Family<ConditionLabels, Gauge>,
    writes: Family<WriteLabels, Counter>,
    per_binding: Mutex<HashMap<ObjectKey, String>>,
    reconciles_total: AtomicU64,
    failures_total: AtomicU64,
    reconcile_nanos_total: AtomicU64,
}

impl Default for SpokeMetrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            failures: Family::default(),
            outcomes: Family::default(),
            // 100 µs … ~52 s
            duration: Histogram::new(exponential_buckets(0.0001, 2.0, 20)),
            bindings: Family::default(),
            writes: Family::default(),
            per_binding: Mutex::new(HashMap::new()),
            reconciles_total: AtomicU64::new(0),
            failures_total: AtomicU64::new(0),
            reconcile_nanos_total: AtomicU64::new(0),
        }
    }
}

impl SpokeMetrics {
    /// Creates the metrics and registers them (prefix `kleym_spoke_`) into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("kleym_spoke");
        r.register(
            "reconciles",
            "Binding reconciles by result",
            m.reconciles.clone(),
        );
        r.register(
            "reconcile_failures",
            "Failed binding reconciles by error category",
            m.failures.clone(),
        );
        r.register(
            "binding_outcomes",
            "Reconcile outcomes by the condition that holds and its reason",
            m.outcomes.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Duration of one binding reconcile",
            m.duration.clone(),
        );
        r.register(
            "bindings",
            "Bindings by the condition that holds (Ready or the refusal)",
            m.bindings.clone(),
        );
        r.register(
            "api_writes",
            "API writes by kind (a reconcile that changes nothing writes nothing)",
            m.writes.clone(),
        );
        m
    }

    /// Records one finished reconcile.
    pub fn observe_reconcile(&self, elapsed: Duration, error_category: Option<&str>) {
        self.duration.observe(elapsed.as_secs_f64());
        self.reconciles_total.fetch_add(1, Ordering::Relaxed);
        self.reconcile_nanos_total.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if error_category.is_some() {
            self.failures_total.fetch_add(1, Ordering::Relaxed);
        }
        let result = if error_category.is_some() {
            "error"
        } else {
            "success"
        };
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
        if let Some(reason) = error_category {
            self.failures
                .get_or_create(&ReasonLabels {
                    reason: reason.into(),
                })
                .inc();
        }
    }

    /// Records the outcome of a binding (the condition that holds) and updates the gauge.
    pub fn observe_outcome(&self, key: &ObjectKey, condition: &str, reason: &str) {
        self.outcomes
            .get_or_create(&OutcomeLabels {
                condition: condition.into(),
                reason: reason.into(),
            })
            .inc();
        let mut map = self.per_binding.lock().unwrap_or_else(|p| p.into_inner());
        let previous = map.insert(key.clone(), condition.to_string());
        if previous.as_deref() != Some(condition) {
            if let Some(prev) = previous {
                self.bindings
                    .get_or_create(&ConditionLabels { condition: prev })
                    .dec();
            }
            self.bindings
                .get_or_create(&ConditionLabels {
                    condition: condition.into(),
                })
                .inc();
        }
    }

    /// Forgets a deleted binding.
    pub fn forget(&self, key: &ObjectKey) {
        let mut map = self.per_binding.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(prev) = map.remove(key) {
            self.bindings
                .get_or_create(&ConditionLabels { condition: prev })
                .dec();
        }
    }

    /// Counts one API write of `kind`.
    pub fn count_write(&self, kind: &str) {
        self.writes
            .get_or_create(&WriteLabels { write: kind.into() })
            .inc();
    }

    /// Total API writes so far (all kinds).
    pub fn total_writes(&self) -> u64 {
        [
            "clusterspiffeid_apply",
            "clusterspiffeid_delete",
            "status_apply",
            "finalizer",
        ]
        .iter()
        .map(|w| {
            self.writes
                .get_or_create(&WriteLabels { write: (*w).into() })
                .get()
        })
        .sum()
    }

    /// Reconciles so far (all results).
    pub fn reconciles_total(&self) -> u64 {
        self.reconciles_total.load(Ordering::Relaxed)
    }

    /// Time spent in reconciles so far (sum over all reconciles, including API writes).
    pub fn reconcile_time_total(&self) -> Duration {
        Duration::from_nanos(self.reconcile_nanos_total.load(Ordering::Relaxed))
    }

    /// Failed reconciles so far (all categories).
    pub fn failures_total(&self) -> u64 {
        self.failures_total.load(Ordering::Relaxed)
    }

    /// Bindings whose outcome is `condition` (`Ready` or a refusal condition).
    pub fn bindings_with(&self, condition: &str) -> i64 {
        self.bindings
            .get_or_create(&ConditionLabels {
                condition: condition.into(),
            })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn binding_gauge_follows_outcome_changes() {
        let m = SpokeMetrics::default();
        let a = ObjectKey::new("ns", "a");
        let b = ObjectKey::new("ns", "b");
        m.observe_outcome(&a, "Ready", "Reconciled");
        m.observe_outcome(&a, "Ready", "Reconciled");
        m.observe_outcome(&b, "Conflict", "IdentityCollision");
        assert_eq!(m.bindings_with("Ready"), 1);
        assert_eq!(m.bindings_with("Conflict"), 1);
        m.observe_outcome(&b, "Ready", "Reconciled");
        assert_eq!(m.bindings_with("Ready"), 2);
        assert_eq!(m.bindings_with("Conflict"), 0);
        m.forget(&a);
        assert_eq!(m.bindings_with("Ready"), 1);
    }

    #[test]
    fn registered_metrics_are_exposed_with_prefix() {
        let mut reg = Registry::default();
        let m = SpokeMetrics::register(&mut reg);
        m.observe_reconcile(Duration::from_millis(3), Some("Forbidden"));
        m.count_write("status_apply");
        let mut out = String::new();
        encode(&mut out, &reg).unwrap();
        assert!(out.contains("kleym_spoke_reconcile_failures_total{reason=\"Forbidden\"} 1"));
        assert!(out.contains("kleym_spoke_api_writes_total{write=\"status_apply\"} 1"));
        assert!(out.contains("kleym_spoke_reconcile_duration_seconds_count 1"));
        assert_eq!(m.total_writes(), 1);
    }
}
