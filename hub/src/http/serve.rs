//! Serving the router over TLS (rustls) or, when explicitly asked, plain HTTP.

use crate::http::HttpError;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long open connections may finish after shutdown is requested.
const DRAIN: Duration = Duration::from_secs(5);
/// Time allowed to send HTTP/1 request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A TLS handshake that takes longer than this is abandoned (slowloris protection).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve `app` on `listener` until `shutdown` completes: over TLS with `tls`, else plain
/// HTTP (only ever on explicit request: `--api-insecure-http`).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    match tls {
        None => axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(HttpError::Io),
        Some(config) => serve_tls(listener, app, config, shutdown).await,
    }
}

async fn serve_tls(
    listener: TcpListener,
    app: Router,
    config: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Transient (e.g. EMFILE): back off briefly rather than spin or die.
                    tracing::warn!(error = %e, "hub API: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "hub API: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "hub API: TLS handshake timed out");
                    return;
                }
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // A client that opens a connection and trickles its request headers must not
            // hold a task forever.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "hub API: connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("hub API: connections still open after the drain period; closing");
    }
    Ok(())
}
