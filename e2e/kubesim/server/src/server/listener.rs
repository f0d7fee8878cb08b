//! The accept loop of one simulated cluster: TCP on 127.0.0.1, TLS (with optional client
//! certificates), HTTP/1.1 or HTTP/2 by ALPN, and the connection-level faults (blackhole,
//! refused connections).

use super::ClusterServer;
use crate::faults::FaultState;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use kubesim_auth::UserInfo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bind a listener on a random port of 127.0.0.1.
pub async fn bind_random() -> std::io::Result<TcpListener> {
    TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await
}

/// Run the accept loop until `server.shutdown` is cancelled.
pub async fn run(
    server: Arc<ClusterServer>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut faults = server.faults.subscribe();
    let mut listener = Some(listener);
    // Cancelled (and replaced) when connection refusal starts, to drop open connections.
    let mut generation = server.shutdown.child_token();
    loop {
        let refuse = faults.borrow_and_update().refuse_connections;
        if refuse {
            // Close the port: new connections are refused; open ones are dropped.
            listener = None;
            generation.cancel();
            generation = server.shutdown.child_token();
            tokio::select! {
                _ = faults.wait_for(|s| !s.refuse_connections) => {}
                () = server.shutdown.cancelled() => return,
            }
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match rebind(&server).await {
                Some(l) => l,
                None => return,
            },
        };
        tokio::select! {
            accepted = l.accept() => {
                if let Ok((stream, _)) = accepted {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(
                        server.clone(),
                        acceptor.clone(),
                        stream,
                        server.faults.subscribe(),
                        generation.clone(),
                    ));
                }
            }
            _ = faults.changed() => {}
            () = server.shutdown.cancelled() => return,
        }
        listener = Some(l);
    }
}

/// Bind the cluster's port again after connection refusal was lifted.
async fn rebind(server: &ClusterServer) -> Option<TcpListener> {
    for _ in 0..200 {
        match TcpListener::bind(server.addr).await {
            Ok(l) => return Some(l),
            Err(e) => {
                tracing::debug!(cluster = %server.name, error = %e, "rebinding the listener");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                    () = server.shutdown.cancelled() => return None,
                }
            }
        }
    }
    tracing::error!(cluster = %server.name, addr = %server.addr, "could not bind the port again");
    None
}

async fn connection(
    server: Arc<ClusterServer>,
    acceptor: TlsAcceptor,
    stream: TcpStream,
    mut faults: watch::Receiver<FaultState>,
    kill: CancellationToken,
) {
    // A blackholed connection is held open, unanswered, until the blackhole is lifted.
    if faults.borrow().blackhole {
        tokio::select! {
            _ = faults.wait_for(|s| !s.blackhole) => {}
            () = kill.cancelled() => return,
        }
    }
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(cluster = %server.name, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let peer_user: Option<UserInfo> = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|c| kubesim_auth::pki::user_from_client_cert(c.as_ref()).ok());
    let svc_server = server.clone();
    let service = service_fn(move |req| {
        let s = svc_server.clone();
        let u = peer_user.clone();
        async move { Ok::<_, Infallible>(s.handle(u, req).await) }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::select! {
        r = conn => {
            if let Err(e) = r {
                tracing::trace!(cluster = %server.name, error = %e, "connection ended");
            }
        }
        () = kill.cancelled() => {}
    }
}
