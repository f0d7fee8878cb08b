//! Serving the router over TLS (rustls) or, when explicitly asked, plain HTTP.

use crate::http::HttpError;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long open connections may finish after shutdown is requested.
const DRAIN: Duration = Duration::from_secs(5);
/// A TLS handshake that takes longer than this is abandoned (slowloris protection).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A rustls server configuration from PEM files (certificate chain, private key), offering
/// HTTP/2 and HTTP/1.1.
pub fn load_tls_config(
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<rustls::ServerConfig>, HttpError> {
    let tls = |m: String| HttpError::Tls(m);
    let cert_pem = std::fs::read(cert_file).map_err(|e| {
        tls(format!(
            "reading --tls-cert-file {}: {e}",
            cert_file.display()
        ))
    })?;
    let key_pem = std::fs::read(key_file).map_err(|e| {
        tls(format!(
            "reading --tls-key-file {}: {e}",
            key_file.display()
        ))
    })?;
    let certs = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(format!("parsing {}: {e}", cert_file.display())))?;
    if certs.is_empty() {
        return Err(tls(format!("{} holds no certificate", cert_file.display())));
    }
    let key = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| tls(format!("parsing {}: {e}", key_file.display())))?
        .ok_or_else(|| tls(format!("{} holds no private key", key_file.display())))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| {
        tls(format!(
            "certificate and key do not form a usable pair: {e}"
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

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
            let builder = auto::Builder::new(TokioExecutor::new());
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
