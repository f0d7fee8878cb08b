//! The reconciler's handles on the outside world: the spoke cluster's client, the event
//! publisher and the metrics. Steps that write (apply, finalizer, cleanup) take these; the
//! pure steps never see them. The work queue is the fourth effect; it sits on
//! [`super::context::Context`] itself because callers outside the reconciler read it.

use std::sync::Arc;

use super::config::SpokeConfig;
use super::events::EventPublisher;
use super::metrics::SpokeMetrics;

/// Client, events and metrics of one reconciler.
pub struct Effects {
    /// Client of the spoke cluster.
    pub client: kube::Client,
    /// Event publisher.
    pub events: EventPublisher,
    /// Metrics.
    pub metrics: Arc<SpokeMetrics>,
}

impl Effects {
    /// The effects of a reconciler configured by `config`.
    pub fn new(client: kube::Client, config: &SpokeConfig, metrics: Arc<SpokeMetrics>) -> Self {
        let events = EventPublisher::new(client.clone(), config.reporter(), config.publish_events);
        Self {
            client,
            events,
            metrics,
        }
    }
}
