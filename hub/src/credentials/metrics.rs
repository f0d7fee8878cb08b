//! Prometheus metrics of the credential runtime (registered on a caller-supplied registry).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `kleym_credential_exec_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecResultLabels {
    /// Access provider name.
    pub provider: String,
    /// `success` or an error label (`timeout`, `exit_error`, `invalid_output`, …).
    pub result: String,
}

/// Labels of `kleym_credential_exec_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    /// Access provider name.
    pub provider: String,
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~41 s
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Exec counters and latency histogram. Cloning shares the underlying series.
#[derive(Clone, Debug)]
pub struct CredentialMetrics {
    /// `kleym_credential_exec_total{provider,result}`.
    pub exec_total: Family<ExecResultLabels, Counter>,
    /// `kleym_credential_exec_duration_seconds{provider}`.
    pub exec_duration: Family<ProviderLabels, Histogram, fn() -> Histogram>,
}

impl Default for CredentialMetrics {
    fn default() -> Self {
        Self {
            exec_total: Family::default(),
            exec_duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
        }
    }
}

impl CredentialMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kleym_credential_exec",
            "Credential plugin executions by provider and result",
            m.exec_total.clone(),
        );
        registry.register(
            "kleym_credential_exec_duration_seconds",
            "Credential plugin execution latency by provider",
            m.exec_duration.clone(),
        );
        m
    }

    /// Records one plugin run.
    pub fn observe(&self, provider: &str, result: &str, elapsed: Duration) {
        self.exec_total
            .get_or_create(&ExecResultLabels {
                provider: provider.to_string(),
                result: result.to_string(),
            })
            .inc();
        self.exec_duration
            .get_or_create(&ProviderLabels {
                provider: provider.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// The current value of `kleym_credential_exec_total{provider,result}`.
    pub fn exec_count(&self, provider: &str, result: &str) -> u64 {
        self.exec_total
            .get_or_create(&ExecResultLabels {
                provider: provider.to_string(),
                result: result.to_string(),
            })
            .get()
    }
}
