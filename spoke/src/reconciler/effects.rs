//! The reconciler's handles on the outside world: the spoke cluster's client, the event
//! publisher and the metrics. Steps that write (apply, finalizer, cleanup) take these; the
//! pure steps never see them. The work queue is the fourth effect; it sits on
//! [`super::context::Context`] itself because callers outside the reconciler read it.

use std::sync::Arc;

use futures::future::BoxFuture;
use http_body_util::BodyExt as _;

use super::config::SpokeConfig;
use super::events::EventPublisher;
use super::metrics::SpokeMetrics;

/// Sends a write and reads its whole response, without kube's buffer task.
///
/// `kube::Client` puts a `tower::Buffer` in front of every client: each request is a
/// channel send to the buffer's task and a wake-up of it, and the response future comes back
/// through a oneshot, 2–2.5 % of the hub's CPU in its profiles, nearly all of it for the
/// three writes per binding. The hub's spoke clients can send directly on the layer under
/// that buffer (the credential layer, then the transport), so they give the reconciler one
/// of these for its writes; reads, lists and watches still go through `kube::Client`.
pub trait SendWrite: Send + Sync {
    /// Sends `request`; the response's status and body. Errors as `kube::Client::send`
    /// and kube's body make them.
    fn send_write(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> BoxFuture<'static, Result<(http::StatusCode, bytes::Bytes), kube::Error>>;
}

/// The spoke cluster's client as the reconciler uses it.
#[derive(Clone)]
pub struct ClusterClient {
    /// kube's client: reads, lists, watches, events, and the writes when `writes` is `None`.
    pub kube: kube::Client,
    /// The writes' own way to the cluster, when the client has one (see [`SendWrite`]).
    pub writes: Option<Arc<dyn SendWrite>>,
}

impl From<kube::Client> for ClusterClient {
    fn from(kube: kube::Client) -> Self {
        Self { kube, writes: None }
    }
}

/// Client, events and metrics of one reconciler.
pub struct Effects {
    /// Client of the spoke cluster.
    pub client: kube::Client,
    /// The writes' own way to the cluster (see [`SendWrite`]); `None`: through `client`.
    pub writes: Option<Arc<dyn SendWrite>>,
    /// Event publisher.
    pub events: EventPublisher,
    /// Metrics.
    pub metrics: Arc<SpokeMetrics>,
}

impl Effects {
    /// The effects of a reconciler configured by `config`.
    pub fn new(client: ClusterClient, config: &SpokeConfig, metrics: Arc<SpokeMetrics>) -> Self {
        let ClusterClient {
            kube: client,
            writes,
        } = client;
        let events = EventPublisher::new(client.clone(), config.reporter(), config.publish_events);
        Self {
            client,
            writes,
            events,
            metrics,
        }
    }

    /// Sends a write (see [`super::apply`]) and reads its whole response: on the writes' own
    /// way when there is one, else through kube's client.
    pub async fn send_write(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<(http::StatusCode, bytes::Bytes), kube::Error> {
        if let Some(writes) = &self.writes {
            return writes.send_write(request).await;
        }
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}
