//! How much kleym reads from an API server in one piece, and the error when a server sends
//! more: a compromised or broken API server (or anything a ClusterProfile points at) must
//! not make the hub, which talks to every spoke from one process, grow without bound.
//!
//! Two limits, each far above what a real API server sends:
//! - a watch event (one line of a watch response: one object as JSON) is at most
//!   [`MAX_WATCH_EVENT_BYTES`]. kube-apiserver keeps no object larger than etcd's request
//!   limit (1.5 MiB by default; its own limit on a request body is 3 MiB), so no event of a
//!   real server comes near it. Checked where watch lines are read (`list_watch`), once per
//!   received chunk, not per byte;
//! - any other response body (lists, gets, the objects writes return, error statuses) is at
//!   most [`DEFAULT_MAX_RESPONSE_BYTES`], or what the operator set (`--max-response-mib`).
//!   kleym lists in pages of 500 objects, a few MiB for the largest real pages. Checked
//!   by the transport, once per received frame.
//!
//! Exceeding either fails that request or watch with [`TooLarge`] (category
//! `ServerError`); the watch is resumed with the watcher's backoff, a request is retried as
//! any failed one is. What was received is freed at once.

/// The longest watch event line read: 8 MiB (see the module documentation).
pub const MAX_WATCH_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// The default limit of a response body other than a watch's: 256 MiB (see the module
/// documentation).
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 256 * 1024 * 1024;

/// What was larger than its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversized {
    /// One line of a watch response.
    WatchEvent,
    /// A response body (not a watch's).
    ResponseBody,
}

/// An API server sent more in one piece than kleym reads (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct TooLarge {
    /// What was too large.
    pub what: Oversized,
    /// The limit it exceeded, in bytes.
    pub limit: u64,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let limit = self.limit;
        let mib = limit as f64 / (1024.0 * 1024.0);
        match self.what {
            Oversized::WatchEvent => write!(
                f,
                "a watch event from the API server is larger than {mib:.0} MiB ({limit} bytes), \
                 kleym's limit per watch event (no real object is that large): the watch was \
                 ended and is resumed with backoff"
            ),
            Oversized::ResponseBody => write!(
                f,
                "a response body from the API server is larger than {mib:.0} MiB ({limit} \
                 bytes), kleym's limit per response (--max-response-mib): the request was \
                 refused"
            ),
        }
    }
}

/// The [`TooLarge`] in `err`'s source chain, if any.
pub fn too_large_in<'e>(err: &'e (dyn std::error::Error + 'static)) -> Option<&'e TooLarge> {
    // Bounded: a source chain that cycles must not hang the caller.
    let mut current = Some(err);
    for _ in 0..16 {
        let e = current?;
        if let Some(found) = e.downcast_ref::<TooLarge>() {
            return Some(found);
        }
        // An io::Error hides its inner error from `source`: look into it too.
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(found) = inner.downcast_ref::<TooLarge>()
        {
            return Some(found);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_found_through_kube_and_io_errors() {
        let too_large = TooLarge {
            what: Oversized::WatchEvent,
            limit: MAX_WATCH_EVENT_BYTES as u64,
        };
        let nested = kube::Error::ReadEvents(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            too_large.clone(),
        ));
        assert_eq!(too_large_in(&nested), Some(&too_large));
        let boxed = kube::Error::Service(Box::new(TooLarge {
            what: Oversized::ResponseBody,
            limit: 7,
        }));
        assert_eq!(too_large_in(&boxed).map(|t| t.limit), Some(7));
        let other = kube::Error::ReadEvents(std::io::Error::other("reset"));
        assert_eq!(too_large_in(&other), None);
        assert!(too_large.to_string().contains("8 MiB (8388608 bytes)"));
    }
}
