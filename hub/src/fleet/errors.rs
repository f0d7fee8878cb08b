//! Turning client and credential failures into [`SpokeError`]s with a category.

use std::error::Error as StdError;

use chrono::Utc;

use kleym_spoke::reconciler::error::{categorize_kube as categorize_transport, chain_text};
use kleym_spoke::reconciler::watches::WatchFailure;

use super::state::{ErrorCategory, SpokeError};
use crate::credentials::CredentialError;
use crate::credentials::client::ClientError;

/// A failure of one engagement attempt.
#[derive(Debug, thiserror::Error)]
pub enum EngageError {
    /// No client could be built (first credential or client configuration).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A request to the spoke failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was attempted.
        action: &'static str,
        /// The client error.
        source: kube::Error,
    },
    /// A bounded wait expired.
    #[error("{action} timed out after {seconds}s")]
    Timeout {
        /// What was attempted.
        action: &'static str,
        /// The bound.
        seconds: u64,
        /// Category to report (e.g. unreachable for a request, sync timeout for caches).
        category: ErrorCategory,
    },
    /// A watch failed before its cache completed the first list: the initial sync cannot
    /// complete (the reconciler would keep retrying while holding a sync slot).
    #[error("initial sync: {0}")]
    Watch(WatchFailure),
    /// The reconciler refused to start or stopped on its own.
    #[error("spoke reconciler: {0}")]
    Reconciler(String),
}

fn find_credential_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a CredentialError> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(c) = e.downcast_ref::<CredentialError>() {
            return Some(c);
        }
        cur = e.source();
    }
    None
}

/// Category of an error of a hub client: a credential plugin failure (the hub's own
/// client layer, which the spoke's mapping cannot know), else the spoke's
/// [`categorize_transport`] (status code, TLS, unreachable).
pub fn categorize_kube(err: &kube::Error) -> ErrorCategory {
    if !matches!(err, kube::Error::Api(_)) && find_credential_error(err).is_some() {
        return ErrorCategory::Credentials;
    }
    categorize_transport(err)
}

impl EngageError {
    /// The category of this failure.
    pub fn category(&self) -> ErrorCategory {
        match self {
            EngageError::Client(ClientError::Credentials(_)) => ErrorCategory::Credentials,
            EngageError::Client(ClientError::Config { .. }) => ErrorCategory::Other,
            EngageError::Kube { action, source } => {
                let c = categorize_kube(source);
                // A 404 on the binding list means the CRD is not installed.
                if *action == BINDINGS_PROBE
                    && matches!(source, kube::Error::Api(s) if s.code == 404)
                {
                    ErrorCategory::CrdMissing
                } else {
                    c
                }
            }
            EngageError::Timeout { category, .. } => *category,
            // A list that failed without an answer may have failed for a credential.
            EngageError::Watch(f) => match (f.status_code(), f.kube_error()) {
                (None, Some(e)) => categorize_kube(e),
                _ => f.category(),
            },
            EngageError::Reconciler(_) => ErrorCategory::Other,
        }
    }

    /// The published form.
    pub fn to_spoke_error(&self) -> SpokeError {
        let message = match self {
            // The transport chain says more than kube's top-level message.
            EngageError::Kube {
                action,
                source: kube::Error::Api(status),
            } => format!(
                "{action}: {} {}: {}",
                status.code, status.reason, status.message
            ),
            EngageError::Kube { action, source } => {
                format!("{action}: {}", chain_text(source))
            }
            other => other.to_string(),
        };
        SpokeError {
            category: self.category(),
            message,
            at: Utc::now(),
        }
    }
}

/// Action name of the binding-list probe (its 404 means "CRD missing").
pub const BINDINGS_PROBE: &str = "list InferenceIdentityBindings";

/// Action name of the ClusterSPIFFEID-list probe (a 404 is fine: the reconciler copes with
/// the SPIRE CRD missing; a 403 or 5xx would stall the initial sync).
pub const CLUSTER_SPIFFE_IDS_PROBE: &str = "list ClusterSPIFFEIDs";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_codes_map_to_categories() {
        let api = |code| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("x", "Reason").with_code(code),
            ))
        };
        assert_eq!(categorize_kube(&api(401)), ErrorCategory::Unauthorized);
        assert_eq!(categorize_kube(&api(403)), ErrorCategory::Forbidden);
        assert_eq!(categorize_kube(&api(503)), ErrorCategory::ServerError);
        let missing = EngageError::Kube {
            action: BINDINGS_PROBE,
            source: api(404),
        };
        assert_eq!(missing.category(), ErrorCategory::CrdMissing);
        let other = EngageError::Kube {
            action: "get version",
            source: api(404),
        };
        assert_eq!(other.category(), ErrorCategory::Other);
    }

    #[test]
    fn failed_initial_lists_map_to_categories() {
        use kleym_spoke::reconciler::watches::WatchFailure;
        use kube::runtime::watcher;
        use std::sync::Arc;
        let failed = |code| {
            EngageError::Watch(WatchFailure {
                resource: "inferencepools.inference.networking.k8s.io".into(),
                error: Arc::new(watcher::Error::InitialListFailed(kube::Error::Api(
                    Box::new(kube::core::Status::failure("x", "Reason").with_code(code)),
                ))),
            })
        };
        assert_eq!(failed(403).category(), ErrorCategory::Forbidden);
        assert_eq!(failed(404).category(), ErrorCategory::CrdMissing);
        assert_eq!(failed(500).category(), ErrorCategory::ServerError);
        assert_eq!(failed(401).category(), ErrorCategory::Unauthorized);
        let e = failed(500).to_spoke_error();
        assert!(
            e.message.starts_with(
                "initial sync: watch of inferencepools.inference.networking.k8s.io: 500"
            ),
            "{}",
            e.message
        );
    }
}
