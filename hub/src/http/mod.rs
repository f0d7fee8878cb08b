//! The hub HTTP API: `/healthz`, `/readyz`, `/metrics`, `/v1/report`, `/v1/clusters` and
//! `/v1/clusters/{namespace}/{name}`; `/v1/*` authenticated by ServiceAccount-token
//! `TokenReview` and authorized by `SubjectAccessReview` (see `docs/http-api.md`).
//!
//! The server is generic over what it serves ([`HubView`]) and renders whatever
//! `prometheus_client` registry it is given. Wiring, e.g. in `kleym hub`:
//!
//! ```no_run
//! # async fn demo(args: kleym_hub::http::ApiArgs, client: kube::Client,
//! #   view: std::sync::Arc<dyn kleym_hub::http::HubView>) -> Result<(), kleym_hub::http::HttpError> {
//! use kleym_hub::http::{ApiMetrics, ApiState, auth::{ApiAuth, KubeReviewer}};
//! use std::sync::Arc;
//! let mut registry = prometheus_client::registry::Registry::default();
//! let metrics = ApiMetrics::register(&mut registry); // next to the hub's other metrics
//! let auth = ApiAuth::new(args.auth_config(), Arc::new(KubeReviewer::new(client)), metrics.clone());
//! let app = kleym_hub::http::router(ApiState { view, registry: Arc::new(registry), auth, metrics });
//! let listener = tokio::net::TcpListener::bind(args.api_addr).await?;
//! kleym_hub::http::serve(listener, app, args.tls()?, async { /* SIGTERM */ }).await
//! # }
//! ```

pub mod args;
pub mod auth;
pub mod cached;
pub mod explain;
pub mod metrics;
pub mod router;
pub mod serve;
pub mod tls;
pub mod view;

pub use args::ApiArgs;
pub use metrics::ApiMetrics;
/// The registry type `/metrics` renders (re-exported so users need no direct dependency).
pub use prometheus_client::registry::Registry;
pub use router::{ApiState, router};
pub use serve::serve;
pub use tls::{load_tls_config, load_tls_config_with};
pub use view::{EncodeError, HubReadiness, HubView, LeaderState, SpokeReach, StaticHubView};

/// Errors of the hub API server.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Invalid flags.
    #[error("{0}")]
    Config(String),
    /// TLS material could not be loaded.
    #[error("TLS: {0}")]
    Tls(String),
    /// Binding or serving failed.
    #[error("hub API I/O: {0}")]
    Io(#[from] std::io::Error),
}
