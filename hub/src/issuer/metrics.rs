//! Prometheus metrics of the issuer (registered only when the hub is an issuer).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Issuer gauges and counters. Cloning shares the underlying series.
#[derive(Clone, Debug, Default)]
pub struct IssuerMetrics {
    /// `kleym_issuer_keys_published`: keys in the served JWKS.
    pub keys_published: Gauge,
    /// `kleym_issuer_signing_key_age_seconds`: how long the current signing key has signed.
    pub signing_key_age_seconds: Gauge,
    /// `kleym_issuer_key_rotations_total`: rotation steps this replica wrote to the Secret.
    pub rotations: Counter,
}

impl IssuerMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kleym_issuer_keys_published",
            "Keys in the JWKS the issuer serves",
            m.keys_published.clone(),
        );
        registry.register(
            "kleym_issuer_signing_key_age_seconds",
            "Seconds since the current issuer signing key started signing",
            m.signing_key_age_seconds.clone(),
        );
        registry.register(
            "kleym_issuer_key_rotations",
            "Issuer key rotation steps written to the Secret by this replica",
            m.rotations.clone(),
        );
        m
    }
}
