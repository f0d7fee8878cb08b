//! The plain-HTTP health servers of `kleym hub` and `kleym spoke`: `/healthz`, `/readyz`
//! and `/metrics` on `--metrics-addr` ([`metrics_router`]), and `/healthz` and `/readyz`
//! alone on `--health-addr` ([`probe_router`]) when that is another address, so kubelet
//! probes can use a port of their own. Each command says what "ready" means through a
//! [`ReadyCheck`]; the routes, the `/metrics` encoding and the listeners are the same.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kleym_spoke::reconciler::CancellationToken;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What `/readyz` answers: `None` (ready) is `200 ok`, `Some(response)` is served as is (a
/// `503` saying what is missing). Any `Fn() -> Option<Response>` is one.
pub trait ReadyCheck: Send + Sync + 'static {
    /// `None` when the process is ready, else the response explaining why not.
    fn not_ready(&self) -> Option<Response>;
}

impl<F> ReadyCheck for F
where
    F: Fn() -> Option<Response> + Send + Sync + 'static,
{
    fn not_ready(&self) -> Option<Response> {
        self()
    }
}

/// State of [`metrics_router`] and [`probe_router`].
#[derive(Clone)]
struct HealthState {
    ready: Arc<dyn ReadyCheck>,
    registry: Arc<Registry>,
}

/// `/healthz` (always `ok`: the process serves) and `/readyz` (`ready`).
fn probe_routes() -> Router<HealthState> {
    async fn readyz(State(s): State<HealthState>) -> Response {
        s.ready
            .not_ready()
            .unwrap_or_else(|| (StatusCode::OK, "ok").into_response())
    }
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
}

/// `/healthz`, `/readyz` and `/metrics` (`registry`): the `--metrics-addr` listener.
pub fn metrics_router(ready: Arc<dyn ReadyCheck>, registry: Arc<Registry>) -> Router {
    async fn metrics(State(s): State<HealthState>) -> Response {
        encode_metrics(s.registry).await
    }
    probe_routes()
        .route("/metrics", get(metrics))
        .with_state(HealthState { ready, registry })
}

/// `/healthz` and `/readyz` as [`metrics_router`] serves them, without `/metrics`: the
/// `--health-addr` listener.
pub fn probe_router(ready: Arc<dyn ReadyCheck>) -> Router {
    probe_routes().with_state(HealthState {
        ready,
        registry: Arc::new(Registry::default()),
    })
}

/// `/metrics` of the plain-HTTP servers, built off the async workers as the hub API's is
/// (encoding a large fleet walks every spoke's series).
async fn encode_metrics(registry: Arc<Registry>) -> Response {
    match crate::http::metrics::metrics_response_blocking(registry).await {
        Ok(resp) => resp,
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        )
            .into_response(),
    }
}

/// The `--health-addr` to bind besides `--metrics-addr`: `health`, unless it is unset or the
/// same address (the probes are served there already).
pub fn separate_health_addr(health: Option<SocketAddr>, metrics: SocketAddr) -> Option<SocketAddr> {
    // Port 0 asks for a port of its own, so `127.0.0.1:0` twice is two listeners.
    health.filter(|h| *h != metrics || h.port() == 0)
}

/// A health listener that could not be bound, naming its flag.
#[derive(Debug, thiserror::Error)]
#[error("binding {flag} {addr}")]
pub struct BindError {
    flag: &'static str,
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

async fn bind(flag: &'static str, addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { flag, addr, source })
}

/// The bound `--metrics-addr` and (when separate) `--health-addr` listeners. Bound before
/// the command starts its work, so that a taken port fails start-up at once.
#[derive(Debug)]
pub struct HealthListeners {
    metrics: TcpListener,
    probes: Option<(SocketAddr, TcpListener)>,
}

impl HealthListeners {
    /// Binds `metrics_addr`, and `health_addr` when [`separate_health_addr`] says so.
    pub async fn bind(
        metrics_addr: SocketAddr,
        health_addr: Option<SocketAddr>,
    ) -> Result<Self, BindError> {
        let metrics = bind("--metrics-addr", metrics_addr).await?;
        let probes = match separate_health_addr(health_addr, metrics_addr) {
            Some(addr) => Some((addr, bind("--health-addr", addr).await?)),
            None => None,
        };
        Ok(Self { metrics, probes })
    }

    /// The `--health-addr` listened on besides `--metrics-addr`, if any (for the start-up
    /// log line).
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.probes.as_ref().map(|(addr, _)| *addr)
    }

    /// The addresses the listeners got (port 0 resolved), named `metrics` and `health` as in
    /// `--listen-addrs-file`.
    pub fn bound(&self) -> std::io::Result<Vec<(&'static str, SocketAddr)>> {
        let mut out = vec![("metrics", self.metrics.local_addr()?)];
        if let Some((_, probes)) = &self.probes {
            out.push(("health", probes.local_addr()?));
        }
        Ok(out)
    }

    /// Serves [`metrics_router`] and, when bound, [`probe_router`] until `shutdown`.
    pub fn serve(
        self,
        ready: Arc<dyn ReadyCheck>,
        registry: Arc<Registry>,
        shutdown: CancellationToken,
    ) -> HealthServers {
        let probes = self.probes.map(|(_, listener)| {
            spawn_server(listener, probe_router(ready.clone()), shutdown.clone())
        });
        let metrics = spawn_server(self.metrics, metrics_router(ready, registry), shutdown);
        HealthServers { metrics, probes }
    }
}

fn spawn_server(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> JoinHandle<std::io::Result<()>> {
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
    })
}

/// The running health servers of [`HealthListeners::serve`].
#[derive(Debug)]
pub struct HealthServers {
    metrics: JoinHandle<std::io::Result<()>>,
    probes: Option<JoinHandle<std::io::Result<()>>>,
}

impl HealthServers {
    /// Waits for the servers to stop (after the shutdown token fired), logging a failure:
    /// the process is stopping anyway, so a server error is not its exit status.
    pub async fn join(self) {
        if let Ok(Err(err)) = self.metrics.await {
            tracing::warn!(error = %err, "metrics server failed");
        }
        if let Some(probes) = self.probes
            && let Ok(Err(err)) = probes.await
        {
            tracing::warn!(error = %err, "probe server failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::sync::atomic::{AtomicBool, Ordering};

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

    #[test]
    fn health_addr_is_separate_only_when_it_differs() {
        let metrics: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let other: SocketAddr = "0.0.0.0:8081".parse().unwrap();
        assert_eq!(separate_health_addr(None, metrics), None);
        assert_eq!(separate_health_addr(Some(other), metrics), Some(other));
        assert_eq!(separate_health_addr(Some(metrics), metrics), None);
        // Port 0 twice asks for two ports of the system's choosing.
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert_eq!(separate_health_addr(Some(any), any), Some(any));
    }

    /// Both listeners follow the check; only the `--metrics-addr` one serves `/metrics`,
    /// and both stop on shutdown.
    #[tokio::test]
    async fn listeners_serve_probes_and_metrics_until_shutdown() {
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let check: Arc<dyn ReadyCheck> = Arc::new(move || {
            if flag.load(Ordering::Acquire) {
                None
            } else {
                Some((StatusCode::SERVICE_UNAVAILABLE, "not yet").into_response())
            }
        });
        let mut registry = Registry::default();
        let counter = Counter::<u64>::default();
        registry.register("kleym_test_probe", "a test counter", counter.clone());
        counter.inc_by(7);
        // A free port for `--health-addr`: `127.0.0.1:0` twice would be the same address,
        // served by the metrics listener alone.
        let health_addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let listeners = HealthListeners::bind("127.0.0.1:0".parse().unwrap(), Some(health_addr))
            .await
            .unwrap();
        assert_eq!(listeners.health_addr(), Some(health_addr));
        let metrics_addr = listeners.metrics.local_addr().unwrap();
        let probes_addr = listeners.probes.as_ref().unwrap().1.local_addr().unwrap();
        let stop = CancellationToken::new();
        let servers = listeners.serve(check, Arc::new(registry), stop.clone());
        for addr in [metrics_addr, probes_addr] {
            assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
            let readyz = http_get(addr, "/readyz").await;
            assert!(readyz.starts_with("HTTP/1.1 503"), "{readyz}");
            assert!(readyz.contains("not yet"), "{readyz}");
        }
        ready.store(true, Ordering::Release);
        for addr in [metrics_addr, probes_addr] {
            assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        }
        let metrics = http_get(metrics_addr, "/metrics").await;
        assert!(metrics.contains("kleym_test_probe_total 7"), "{metrics}");
        assert!(
            http_get(probes_addr, "/metrics")
                .await
                .starts_with("HTTP/1.1 404")
        );
        stop.cancel();
        servers.join().await;
    }

    #[tokio::test]
    async fn a_taken_port_names_its_flag() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let e = HealthListeners::bind(addr, None).await.unwrap_err();
        assert!(e.to_string().contains("--metrics-addr"), "{e}");
        let free: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let e = HealthListeners::bind(free, Some(addr)).await.unwrap_err();
        assert!(e.to_string().contains("--health-addr"), "{e}");
    }
}
