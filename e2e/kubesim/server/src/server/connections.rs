//! Connection counters of one cluster, for tests that assert how many connections a client
//! opened (e.g. that every watch of a spoke shares one HTTP/2 connection).

use std::sync::atomic::{AtomicU64, Ordering};

/// kube-apiserver's `--http2-max-streams-per-connection` default.
pub const MAX_CONCURRENT_STREAMS: u32 = 1000;

/// Live counters; [`ConnectionStats::snapshot`] reads them.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    accepted: AtomicU64,
    accepted_h2: AtomicU64,
    resumed: AtomicU64,
    open: AtomicU64,
    goaway_sent: AtomicU64,
    blackholed: AtomicU64,
}

/// The counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Connections that completed the TLS handshake since the cluster started.
    pub accepted: u64,
    /// Of those, how many negotiated HTTP/2 by ALPN.
    pub accepted_h2: u64,
    /// Of those, how many resumed an earlier TLS session (a client's session tickets).
    pub resumed: u64,
    /// Connections open now (handshake done, not yet closed).
    pub open: u64,
    /// Connections that were sent a `GOAWAY` (the `goaway` fault).
    pub goaway_sent: u64,
    /// Connections accepted (TCP) and held unanswered by the `blackhole` fault since the
    /// cluster started, counted when the hold begins.
    pub blackholed: u64,
}

impl ConnectionStats {
    /// Counts a connection whose TLS handshake finished (negotiating HTTP/2, resuming a
    /// session); the guard counts its close.
    pub fn opened(&self, h2: bool, resumed: bool) -> OpenConnection<'_> {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        if h2 {
            self.accepted_h2.fetch_add(1, Ordering::Relaxed);
        }
        if resumed {
            self.resumed.fetch_add(1, Ordering::Relaxed);
        }
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection { stats: self }
    }

    /// Counts a `GOAWAY` sent.
    pub fn goaway_sent(&self) {
        self.goaway_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection held by the blackhole.
    pub fn blackholed(&self) {
        self.blackholed.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> ConnectionCounts {
        ConnectionCounts {
            accepted: self.accepted.load(Ordering::Relaxed),
            accepted_h2: self.accepted_h2.load(Ordering::Relaxed),
            resumed: self.resumed.load(Ordering::Relaxed),
            open: self.open.load(Ordering::Relaxed),
            goaway_sent: self.goaway_sent.load(Ordering::Relaxed),
            blackholed: self.blackholed.load(Ordering::Relaxed),
        }
    }
}

/// Decrements the open count when the connection ends.
#[derive(Debug)]
pub struct OpenConnection<'a> {
    stats: &'a ConnectionStats,
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}
