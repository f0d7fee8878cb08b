//! The hub's HTTP routers over a started hub ([`HubHandle`]): the authenticated hub API
//! ([`api_router`], on `--api-addr`), and the plain-HTTP health routers ([`health_router`]
//! on `--metrics-addr`, [`probe_router`] on `--health-addr`) built by the shared
//! [`crate::observe::health`] with the hub's `/readyz` (inventory synced and leadership
//! known).

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use kleym_spoke::reconciler::CancellationToken;
use prometheus_client::registry::Registry;

use super::start::HubHandle;
use super::view::FleetHubView;
use crate::http::auth::{ApiAuth, KubeReviewer};
use crate::http::{ApiArgs, ApiState, HubView};
use crate::inventory::InventorySynced;
use crate::observe::health::{self, ReadyCheck};

/// The hub API router (`/healthz`, `/readyz`, `/metrics`, `/v1/*`) over `hub`, reviewing
/// callers' tokens with `client` (the hub cluster) as `api` configures.
pub fn api_router(hub: &HubHandle, api: &ApiArgs, client: kube::Client) -> Router {
    let view: Arc<dyn HubView> = hub.view.clone();
    let auth = ApiAuth::new(
        api.auth_config(),
        Arc::new(KubeReviewer::new(client)),
        hub.api_metrics.clone(),
    );
    crate::http::router(ApiState {
        view,
        registry: hub.registry.clone(),
        auth,
        metrics: hub.api_metrics.clone(),
    })
}

/// The hub's `/readyz`: the API's readiness (inventory synced and leadership known); when
/// not ready, a `503` whose JSON body says which is missing.
pub fn ready_check(view: Arc<FleetHubView>) -> Arc<dyn ReadyCheck> {
    Arc::new(move || {
        let r = view.ready();
        if r.is_ready() {
            None
        } else {
            Some(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(serde_json::json!({"reason": "NotReady", "readiness": r})),
                )
                    .into_response(),
            )
        }
    })
}

/// [`ready_check`], and with the hub as an issuer also the issuer's: a replica whose last
/// refresh of the issuer keys failed is not ready (`503`, reason `IssuerNotRefreshed` and the
/// error, which names the Secret and never holds key material), so a Service stops sending
/// verifiers to a replica that may publish keys the Secret no longer holds.
pub fn ready_check_with_issuer(
    view: Arc<FleetHubView>,
    issuer: Option<crate::issuer::serve::IssuerDocuments>,
) -> Arc<dyn ReadyCheck> {
    let hub = ready_check(view);
    Arc::new(move || {
        if let Some(not_ready) = hub.not_ready() {
            return Some(not_ready);
        }
        let error = issuer.as_ref().and_then(|d| d.refresh_error())?;
        Some(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({"reason": "IssuerNotRefreshed", "message": error})),
            )
                .into_response(),
        )
    })
}

/// `/healthz`, `/readyz` (the API's readiness: inventory synced and leadership known) and
/// `/metrics` only, for the plain-HTTP `--metrics-addr` listener.
pub fn health_router(hub: &HubHandle) -> Router {
    health::metrics_router(ready_check(hub.view.clone()), hub.registry.clone())
}

/// `/healthz` and `/readyz` as [`health_router`] serves them, without `/metrics`: the
/// `--health-addr` listener.
pub fn probe_router(hub: &HubHandle) -> Router {
    health::probe_router(ready_check(hub.view.clone()))
}

/// A standalone `/healthz`, `/readyz` (inventory listed once), `/metrics` server, for
/// embedding the hub without its API; `kleym hub` itself serves [`health_router`] and
/// [`api_router`].
pub async fn serve_health(
    listener: tokio::net::TcpListener,
    inventory: InventorySynced,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let ready = move || {
        if inventory.is_synced() {
            None
        } else {
            Some((StatusCode::SERVICE_UNAVAILABLE, "inventory not listed yet").into_response())
        }
    };
    axum::serve(listener, health::metrics_router(Arc::new(ready), registry))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::runtime::args::HubArgs;
    use crate::runtime::start::start_hub;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: HubArgs,
    }

    /// GETs `path` from `addr`, returning the whole response.
    async fn http_get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).await.unwrap();
        response
    }

    /// The `--health-addr` router answers the probes as the `--metrics-addr` one does, and
    /// serves no metrics.
    #[tokio::test]
    async fn probe_router_serves_probes_but_not_metrics() {
        // A hub whose cluster is unreachable: the inventory is never listed (not ready).
        let w = Wrapper::try_parse_from([
            "kleym",
            "--leader-elect=false",
            "--clusterprofile-access-provider",
            "tok=/bin/true",
        ])
        .unwrap();
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let stop = CancellationToken::new();
        let hub = start_hub(&w.args, client, stop.clone()).unwrap();
        let serve = |app: Router| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await });
            addr
        };
        let probes = serve(probe_router(&hub)).await;
        let health = serve(health_router(&hub)).await;
        for addr in [probes, health] {
            assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
            let readyz = http_get(addr, "/readyz").await;
            assert!(readyz.starts_with("HTTP/1.1 503"), "{readyz}");
            assert!(readyz.contains("NotReady"), "{readyz}");
        }
        assert!(
            http_get(probes, "/metrics")
                .await
                .starts_with("HTTP/1.1 404")
        );
        let metrics = http_get(health, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("kleym_hub_leader"), "{metrics}");
        stop.cancel();
    }

    /// `/readyz` fails while the issuer's last refresh of its keys failed, saying why, and
    /// recovers with the next successful refresh.
    #[tokio::test]
    async fn readyz_fails_while_the_issuer_keys_are_not_refreshed() {
        use crate::issuer::keys::SigningKey;
        use crate::issuer::serve::IssuerDocuments;
        let synced = InventorySynced::default();
        synced.mark_synced();
        let view = Arc::new(FleetHubView::new(
            crate::fleet::FleetState::new(),
            synced,
            super::super::view::LeaderInfo::always_leader(),
        ));
        let (key, _) = SigningKey::generate_es256().unwrap();
        let docs = IssuerDocuments::new("https://issuer.example.org", std::slice::from_ref(&key));
        let check = ready_check_with_issuer(view.clone(), Some(docs.clone()));
        assert!(check.not_ready().is_none(), "ready with fresh keys");
        assert!(
            ready_check_with_issuer(view.clone(), None)
                .not_ready()
                .is_none()
        );
        docs.refresh_failed(
            "reading issuer Secret kleym/issuer: NotFound",
            chrono::Utc::now().timestamp(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = health::probe_router(check.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let readyz = http_get(addr, "/readyz").await;
        assert!(readyz.starts_with("HTTP/1.1 503"), "{readyz}");
        assert!(readyz.contains("IssuerNotRefreshed"), "{readyz}");
        assert!(readyz.contains("kleym/issuer"), "{readyz}");
        docs.update(std::slice::from_ref(&key));
        assert!(check.not_ready().is_none(), "ready again after a refresh");
    }

    /// `/metrics` of the plain-HTTP server is encoded (off the async workers) from the
    /// registry it was given, on a current-thread runtime too.
    #[tokio::test]
    async fn health_server_serves_the_registry_metrics() {
        use prometheus_client::metrics::counter::Counter;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let mut registry = Registry::default();
        let counter = Counter::<u64>::default();
        registry.register("kleym_test_probe", "a test counter", counter.clone());
        counter.inc_by(7);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_health(
            listener,
            InventorySynced::default(),
            Arc::new(registry),
            stop.clone(),
        ));
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("kleym_test_probe_total 7"), "{response}");
        stop.cancel();
        server.await.unwrap().unwrap();
    }
}
