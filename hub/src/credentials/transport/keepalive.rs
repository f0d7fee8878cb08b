//! The HTTP/2 keepalive setting, apart from the transport so that its connection module
//! (`http2.rs`) reads it without importing back into the transport.

use std::time::Duration;

/// HTTP/2 keepalive: client-go's `ReadIdleTimeout` (30 s) and `PingTimeout` (15 s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    /// Send a PING after this long without reading a frame from the connection.
    pub interval: Duration,
    /// Close the connection when nothing answers a PING within this long.
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(15),
        }
    }
}
