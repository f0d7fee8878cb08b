//! An in-memory log of the requests a cluster answered, so a test can assert on what its
//! client sent (methods, paths, answers) without a proxy in between, and of the requests it
//! has received and not answered yet (so a test can see a request held by a fault). Bounded: the oldest
//! entries go first, so a long-running `kubesim` never grows without limit. Never holds
//! query strings, bodies or headers, which may carry credentials, except the `User-Agent`
//! (kube-apiserver's audit log records it as `userAgent`), cut at
//! [`MAX_USER_AGENT`] characters.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// How many requests a log keeps.
pub const CAPACITY: usize = 10_000;

/// The longest user agent a log entry keeps, in characters (kube-apiserver's audit log
/// keeps 1024 bytes).
pub const MAX_USER_AGENT: usize = 1024;

/// One answered request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRequest {
    /// The HTTP method (`GET`, `PATCH`, ...).
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The response status code.
    pub status: u16,
    /// When it was answered, on tokio's clock (virtual in a test with a paused clock).
    pub at: tokio::time::Instant,
    /// The `User-Agent` header, if the client sent one that is valid UTF-8 (cut at
    /// [`MAX_USER_AGENT`] characters).
    pub user_agent: Option<String>,
}

/// The user agent of a request's headers as the log keeps it.
pub fn user_agent_of(headers: &http::HeaderMap) -> Option<String> {
    let ua = headers.get(http::header::USER_AGENT)?.to_str().ok()?;
    Some(ua.chars().take(MAX_USER_AGENT).collect())
}

/// A request received and not answered yet (waiting out a fault's latency or a blackhole,
/// or being handled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingRequest {
    /// The HTTP method.
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// When it was received, on tokio's clock.
    pub since: tokio::time::Instant,
}

/// The request log of one cluster. Cheap to clone (clones share the log).
#[derive(Clone, Debug, Default)]
pub struct RequestLog {
    entries: Arc<Mutex<VecDeque<LoggedRequest>>>,
    pending: Arc<Mutex<Pending>>,
}

#[derive(Debug, Default)]
struct Pending {
    next: u64,
    requests: std::collections::BTreeMap<u64, PendingRequest>,
}

/// Holds one request in [`RequestLog::pending`] until dropped (when it was answered or
/// abandoned).
#[derive(Debug)]
pub struct PendingGuard {
    log: RequestLog,
    id: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.log
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .requests
            .remove(&self.id);
    }
}

impl RequestLog {
    /// Lists a received request as pending until the guard is dropped, so that a test can
    /// see a request waiting (e.g. out a latency fault) rather than hope it is.
    pub fn begin(&self, method: &str, path: &str) -> PendingGuard {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let id = pending.next;
        pending.next += 1;
        pending.requests.insert(
            id,
            PendingRequest {
                method: method.to_string(),
                path: path.to_string(),
                since: tokio::time::Instant::now(),
            },
        );
        PendingGuard {
            log: self.clone(),
            id,
        }
    }

    /// The requests received and not answered yet, oldest first.
    pub fn pending(&self) -> Vec<PendingRequest> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.requests.values().cloned().collect()
    }

    /// Appends `r`, dropping the oldest entry when full.
    pub fn record(&self, r: LoggedRequest) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= CAPACITY {
            entries.pop_front();
        }
        entries.push_back(r);
    }

    /// The requests answered so far, oldest first.
    pub fn entries(&self) -> Vec<LoggedRequest> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.iter().cloned().collect()
    }

    /// Takes every entry out of the log at once: a reader that keeps what it drains sees
    /// every request once, however long the run (the log itself keeps only the last
    /// [`CAPACITY`]), and none is lost between reading and clearing.
    pub fn drain(&self) -> Vec<LoggedRequest> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *entries).into()
    }

    /// The requests with this method, oldest first.
    pub fn with_method(&self, method: &str) -> Vec<LoggedRequest> {
        self.entries()
            .into_iter()
            .filter(|r| r.method == method)
            .collect()
    }

    /// Forgets every entry (e.g. after a test's setup).
    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(i: usize) -> LoggedRequest {
        LoggedRequest {
            method: if i.is_multiple_of(2) { "GET" } else { "PATCH" }.into(),
            path: format!("/p/{i}"),
            status: 200,
            at: tokio::time::Instant::now(),
            user_agent: None,
        }
    }

    #[test]
    fn keeps_the_user_agent_and_no_other_header() {
        let mut h = http::HeaderMap::new();
        assert_eq!(user_agent_of(&h), None);
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer secret".parse().unwrap(),
        );
        h.insert(
            http::header::USER_AGENT,
            "kleym-hub/0.1.0 (replica a_1)".parse().unwrap(),
        );
        assert_eq!(
            user_agent_of(&h).as_deref(),
            Some("kleym-hub/0.1.0 (replica a_1)")
        );
        h.insert(
            http::header::USER_AGENT,
            "x".repeat(MAX_USER_AGENT + 10).parse().unwrap(),
        );
        assert_eq!(user_agent_of(&h).map(|u| u.len()), Some(MAX_USER_AGENT));
    }

    #[test]
    fn keeps_the_newest_entries_up_to_its_capacity() {
        let log = RequestLog::default();
        for i in 0..CAPACITY + 2 {
            log.record(req(i));
        }
        let entries = log.entries();
        assert_eq!(entries.len(), CAPACITY);
        assert_eq!(entries[0].path, "/p/2");
        assert_eq!(log.with_method("PATCH").len(), CAPACITY / 2);
        log.clear();
        assert!(log.entries().is_empty());
    }

    #[test]
    fn drain_takes_every_entry_once() {
        let log = RequestLog::default();
        log.record(req(0));
        log.record(req(1));
        let drained: Vec<String> = log.drain().into_iter().map(|r| r.path).collect();
        assert_eq!(drained, ["/p/0", "/p/1"]);
        assert!(log.drain().is_empty());
        log.record(req(2));
        assert_eq!(log.entries().len(), 1);
    }

    #[test]
    fn a_request_is_pending_until_its_guard_is_dropped() {
        let log = RequestLog::default();
        let first = log.begin("PATCH", "/a");
        let second = log.begin("GET", "/b");
        let paths: Vec<String> = log.pending().into_iter().map(|p| p.path).collect();
        assert_eq!(paths, ["/a", "/b"]);
        drop(first);
        assert_eq!(log.pending()[0].method, "GET");
        drop(second);
        assert!(log.pending().is_empty());
    }
}
