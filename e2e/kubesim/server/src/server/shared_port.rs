//! One listening socket for many simulated clusters, each at an address of its own on it.
//!
//! Every cluster normally has a listening socket of its own, and every client connection
//! costs the process another file descriptor: a fleet of 10,000 clusters, each with a
//! client connected, needs more than 20,000, past the open-file limits of many machines
//! (and not raisable without privileges). Here one socket, bound to `0.0.0.0` on one port,
//! serves every cluster, each at its own loopback address (`127.1.0.1`, `127.1.0.2`, ...; Linux
//! routes all of `127.0.0.0/8` to the loopback interface): a connection is handed to the
//! cluster whose address it was made to. Connections made to any other address (from
//! outside the machine) are closed at once.
//!
//! What differs from a socket per cluster: a cluster refusing connections (the
//! `refuseConnections` fault) closes new ones right after accepting them, where a port of
//! its own would be closed (the client sees the connection end before the TLS handshake
//! instead of a refusal).

use super::ClusterServer;
use super::listener::{Acceptors, connection};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A cluster reachable through the shared port.
struct Route {
    server: Arc<ClusterServer>,
    acceptors: Acceptors,
    /// Cancelled (and replaced) when connection refusal starts, to drop open connections.
    generation: Arc<Mutex<CancellationToken>>,
}

/// The shared socket and the clusters behind it.
#[derive(Clone)]
pub struct SharedPort {
    port: u16,
    routes: Arc<Mutex<HashMap<Ipv4Addr, Route>>>,
    next: Arc<Mutex<u32>>,
}

impl std::fmt::Debug for SharedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPort")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// The first address handed out: `127.1.0.1` (clear of `127.0.0.1`, where clusters with a
/// port of their own listen).
const FIRST: u32 = u32::from_be_bytes([127, 1, 0, 1]);
/// One past the last: the top of `127.0.0.0/8`.
const END: u32 = u32::from_be_bytes([127, 255, 255, 255]);

impl SharedPort {
    /// Binds `0.0.0.0` on a random port and starts accepting until `shutdown`.
    pub async fn start(shutdown: CancellationToken) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], 0))).await?;
        let port = listener.local_addr()?.port();
        let shared = Self {
            port,
            routes: Arc::default(),
            next: Arc::new(Mutex::new(FIRST)),
        };
        tokio::spawn(shared.clone().accept(listener, shutdown));
        Ok(shared)
    }

    /// The next free address on the shared port.
    pub fn allocate(&self) -> std::io::Result<SocketAddr> {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        if *next >= END {
            return Err(std::io::Error::other(
                "kubesim: the shared port's addresses ran out",
            ));
        }
        let ip = Ipv4Addr::from(*next);
        *next += 1;
        Ok(SocketAddr::from((ip, self.port)))
    }

    /// Serves `server` (at its `addr`, from [`SharedPort::allocate`]) until its shutdown.
    pub fn add(&self, server: Arc<ClusterServer>, tls: Arc<rustls::ServerConfig>) {
        let SocketAddr::V4(addr) = server.addr else {
            return;
        };
        let ip = *addr.ip();
        let generation = Arc::new(Mutex::new(server.shutdown.child_token()));
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                ip,
                Route {
                    server: server.clone(),
                    acceptors: Acceptors::new(tls),
                    generation: generation.clone(),
                },
            );
        // Refusal drops the open connections; the cluster leaves the port when it stops.
        let routes = self.routes.clone();
        tokio::spawn(async move {
            let mut faults = server.faults.subscribe();
            loop {
                tokio::select! {
                    changed = faults.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        if faults.borrow_and_update().refuse_connections {
                            let mut g = generation.lock().unwrap_or_else(|p| p.into_inner());
                            g.cancel();
                            *g = server.shutdown.child_token();
                        }
                    }
                    () = server.shutdown.cancelled() => break,
                }
            }
            routes.lock().unwrap_or_else(|p| p.into_inner()).remove(&ip);
        });
    }

    async fn accept(self, listener: TcpListener, shutdown: CancellationToken) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = shutdown.cancelled() => return,
            };
            let Ok((stream, _)) = accepted else {
                continue;
            };
            let to = match stream.local_addr() {
                Ok(SocketAddr::V4(a)) => *a.ip(),
                _ => continue,
            };
            let route = self
                .routes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&to)
                .map(|r| {
                    let generation = r.generation.lock().unwrap_or_else(|p| p.into_inner());
                    (r.server.clone(), r.acceptors.clone(), generation.clone())
                });
            // Not a cluster's address (or from outside the machine): closed at once.
            let Some((server, acceptors, generation)) = route else {
                continue;
            };
            if server.faults.subscribe().borrow().refuse_connections {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let faults = server.faults.subscribe();
            tokio::spawn(connection(server, acceptors, stream, faults, generation));
        }
    }
}
