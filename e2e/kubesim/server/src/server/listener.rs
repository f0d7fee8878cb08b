//! The accept loop of one simulated cluster: TCP on 127.0.0.1, TLS (with optional client
//! certificates), HTTP/1.1 or HTTP/2 by ALPN (at most [`MAX_CONCURRENT_STREAMS`] streams per
//! HTTP/2 connection, as kube-apiserver), and the connection-level faults (blackhole, refused
//! connections, `goaway`, `h1Only`, `silentConnection`).

use super::ClusterServer;
use super::connections::MAX_CONCURRENT_STREAMS;
use crate::faults::{FaultState, GOAWAY_GRACE};
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
    let acceptors = Acceptors::new(tls);
    let mut faults = server.faults.subscribe();
    let mut listener = Some(listener);
    // Cancelled (and replaced) when connection refusal starts, to drop open connections.
    let mut generation = server.shutdown.child_token();
    loop {
        let refuse = faults.borrow_and_update().refuse_connections;
        if refuse {
            // Close the port: new connections are refused; open ones are dropped. The port
            // stays bound without listening (a SYN to it is answered with a reset, as to a
            // closed port), so that no other socket of the machine can take it meanwhile:
            // a client's outgoing connection given it as its ephemeral port would keep the
            // cluster from ever listening there again.
            drop(listener.take());
            let hold = hold_port(server.addr);
            generation.cancel();
            generation = server.shutdown.child_token();
            tokio::select! {
                _ = faults.wait_for(|s| !s.refuse_connections) => {}
                () = server.shutdown.cancelled() => return,
            }
            listener = hold.and_then(|socket| socket.listen(1024).ok());
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
                        acceptors.clone(),
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

/// The cluster's port bound and not listening (`None` if it could not be bound: then it is
/// bound again when the refusal is lifted, see [`rebind`]).
fn hold_port(addr: SocketAddr) -> Option<tokio::net::TcpSocket> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    // The closed listener's connections linger in TIME_WAIT on this port.
    socket.set_reuseaddr(true).ok()?;
    socket.bind(addr).ok()?;
    Some(socket)
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

/// The TLS acceptors: HTTP/2 and HTTP/1.1 by ALPN, or HTTP/1.1 only (`h1Only`).
#[derive(Clone)]
pub(super) struct Acceptors {
    any: TlsAcceptor,
    h1_only: TlsAcceptor,
}

impl Acceptors {
    /// Both acceptors from the cluster's TLS configuration.
    pub(super) fn new(tls: Arc<rustls::ServerConfig>) -> Self {
        let mut h1 = (*tls).clone();
        h1.alpn_protocols = vec![b"http/1.1".to_vec()];
        Self {
            any: TlsAcceptor::from(tls),
            h1_only: TlsAcceptor::from(Arc::new(h1)),
        }
    }
}

/// Serves one accepted connection of `server` until it ends, `kill` fires, or a fault
/// ends it.
pub(super) async fn connection(
    server: Arc<ClusterServer>,
    acceptors: Acceptors,
    stream: TcpStream,
    mut faults: watch::Receiver<FaultState>,
    kill: CancellationToken,
) {
    // A blackholed connection is held open, unanswered, until the blackhole is lifted.
    if faults.borrow().blackhole {
        server.connections.blackholed();
        tokio::select! {
            _ = faults.wait_for(|s| !s.blackhole) => {}
            () = kill.cancelled() => return,
        }
    }
    let h1_only = faults.borrow().h1_only;
    let acceptor = if h1_only {
        &acceptors.h1_only
    } else {
        &acceptors.any
    };
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
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let _open = server.connections.opened(h2, resumed);
    let silence_epoch = faults.borrow_and_update().silence_epoch;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if h1_only {
        builder = builder.http1_only();
    }
    // No cap on streams the server's HTTP/2 library resets itself (h2's default closes the
    // connection with ENHANCE_YOUR_CALM after 1024, logging "locally-reset streams reached
    // limit"). Such resets answer frames that arrive for a stream the server is done with,
    // e.g. request DATA still in flight after a fault's early 5xx or 429. Go's HTTP/2
    // server (kube-apiserver's) answers those with RST_STREAM and has no such count, so it
    // keeps connections that kubesim used to close under the chaos soak's faults.
    builder
        .http2()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_local_error_reset_streams(None);
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    // When this connection must go away: a pending `goaway` taken now or on a later change.
    let mut going_away = if server.faults.take_goaway() {
        conn.as_mut().graceful_shutdown();
        server.connections.goaway_sent();
        Some(tokio::time::Instant::now() + GOAWAY_GRACE)
    } else {
        None
    };
    loop {
        let grace = async {
            match going_away {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::trace!(cluster = %server.name, error = %e, "connection ended");
                }
                return;
            }
            () = kill.cancelled() => return,
            () = grace => return,
            changed = faults.changed() => {
                if changed.is_err() {
                    return;
                }
                let epoch = faults.borrow_and_update().silence_epoch;
                if epoch != silence_epoch {
                    // Silent: the connection is not polled (nothing read or written) and
                    // stays open until the silence is lifted, then it is closed.
                    tokio::select! {
                        _ = faults.wait_for(|s| !s.silent_connections) => {}
                        () = kill.cancelled() => {}
                    }
                    return;
                }
                if going_away.is_none() && server.faults.take_goaway() {
                    conn.as_mut().graceful_shutdown();
                    server.connections.goaway_sent();
                    going_away = Some(tokio::time::Instant::now() + GOAWAY_GRACE);
                }
            }
        }
    }
}
