//! Failures of watches whose cache has not completed its first list: why an initial sync
//! is stuck. Recorded by the watch loops, read by the hub (through [`super::snapshot`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kleym_api::ErrorCategory;
use kube::runtime::watcher;

use super::error::{categorize_kube, categorize_status};

/// A watch whose cache has not completed its first list failed: the list was refused
/// (403), the resource is not served (404), the server failed (5xx) or could not be
/// reached. The watcher keeps retrying on its own; the hub uses this to give up on an
/// initial sync at once instead of waiting out its deadline.
#[derive(Debug, Clone)]
pub struct WatchFailure {
    /// `plural.group` of the watched resource (`namespaces` for the core group).
    pub resource: String,
    /// The watcher's error (shared: the same failure may be read several times).
    pub error: Arc<watcher::Error>,
}

impl WatchFailure {
    /// The client error behind the watcher's error, if any.
    pub fn kube_error(&self) -> Option<&kube::Error> {
        match self.error.as_ref() {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => Some(e),
            _ => None,
        }
    }

    /// The API server's answer (`Status`), if it answered with an error.
    pub fn api_status(&self) -> Option<&kube::core::Status> {
        match self.error.as_ref() {
            watcher::Error::WatchError(s) => Some(s),
            _ => match self.kube_error() {
                Some(kube::Error::Api(s)) => Some(s),
                _ => None,
            },
        }
    }

    /// The HTTP status code of the failure, if the API server answered.
    pub fn status_code(&self) -> Option<u16> {
        self.api_status().map(|s| s.code)
    }

    /// The fleet category: [`ErrorCategory::CrdMissing`] for a 404 on a list (the resource
    /// is not served), else [`categorize_status`]'s or [`categorize_kube`]'s.
    pub fn category(&self) -> ErrorCategory {
        match (self.status_code(), self.kube_error()) {
            (Some(404), _) => ErrorCategory::CrdMissing,
            (Some(code), _) => categorize_status(code),
            (None, Some(e)) => categorize_kube(e),
            (None, None) => ErrorCategory::Other,
        }
    }
}

impl std::fmt::Display for WatchFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.api_status() {
            // The API's own words, without kube's debug rendering of the Status.
            Some(s) => write!(
                f,
                "watch of {}: {} {}: {}",
                self.resource, s.code, s.reason, s.message
            ),
            None => write!(f, "watch of {}: {}", self.resource, self.error),
        }
    }
}

/// The failures of watches whose cache has not synced yet, by resource.
#[derive(Debug, Default)]
pub struct WatchFailures(Mutex<BTreeMap<String, WatchFailure>>);

impl WatchFailures {
    pub(crate) fn record(&self, failure: WatchFailure) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(failure.resource.clone(), failure);
    }

    pub(crate) fn clear(&self, resource: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(resource);
    }

    /// One current failure (the first by resource name), if any.
    pub fn first(&self) -> Option<WatchFailure> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .next()
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list_failure(code: u16) -> WatchFailure {
        let status = kube::core::Status::failure("nope", "Reason").with_code(code);
        WatchFailure {
            resource: "clusterspiffeids.spire.spiffe.io".into(),
            error: Arc::new(watcher::Error::InitialListFailed(kube::Error::Api(
                Box::new(status),
            ))),
        }
    }

    #[test]
    fn watch_failures_are_categorised_and_name_the_resource() {
        assert_eq!(list_failure(403).category().as_str(), "Forbidden");
        assert_eq!(list_failure(404).category().as_str(), "CRDMissing");
        assert_eq!(list_failure(500).category().as_str(), "ServerError");
        assert_eq!(list_failure(503).status_code(), Some(503));
        let text = list_failure(500).to_string();
        assert!(
            text.starts_with("watch of clusterspiffeids.spire.spiffe.io: 500 Reason: nope"),
            "{text}"
        );
        let failures = WatchFailures::default();
        failures.record(list_failure(500));
        assert_eq!(
            failures.first().map(|f| f.category().as_str()),
            Some("ServerError")
        );
        failures.clear("clusterspiffeids.spire.spiffe.io");
        assert!(failures.first().is_none());
    }
}
