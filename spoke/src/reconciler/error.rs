//! Reconciler errors, and the one mapping of client errors to the fleet's
//! [`ErrorCategory`].
//!
//! Two classifications live here, for two audiences: [`categorize_kube`] and
//! [`categorize_status`] give the coarse [`ErrorCategory`] the hub shows in a spoke's status
//! (what an operator must fix), and [`Error::failure_reason`] gives the finer, documented
//! `reason` label of `kleym_spoke_reconcile_failures_total` (`Conflict`, `Transport`,
//! `CacheNotReady`, …), which dashboards group by.

use std::error::Error as StdError;

use kleym_api::ErrorCategory;

use super::limits::too_large_in;

/// A failed reconcile or a failure to start the reconciler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What the reconciler was doing (e.g. `apply ClusterSPIFFEID kleym-…`).
        action: String,
        /// The client error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A cache needed by the reconcile has not synced yet.
    #[error("cache for {0} has not synced yet")]
    CacheNotReady(&'static str),
    /// An object could not be (de)serialised.
    #[error("serialising {what}: {source}")]
    Serialize {
        /// The object concerned.
        what: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// Our own CRD (`inferenceidentitybindings.kleym.io`) is not served.
    #[error("the InferenceIdentityBinding CRD (kleym.io/v1alpha1) is not served by the cluster")]
    BindingCrdMissing,
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl Error {
    /// Wraps a client error with what we were doing.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source: Box::new(source),
        }
    }

    /// The HTTP status code of an API error, if this is one.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Error::Kube { source, .. } => match source.as_ref() {
                kube::Error::Api(status) => Some(status.code),
                _ => None,
            },
            _ => None,
        }
    }

    /// Stable failure reason: the `reason` label of `kleym_spoke_reconcile_failures_total`.
    pub fn failure_reason(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => kube_failure_reason(source),
            Error::CacheNotReady(_) => "CacheNotReady",
            Error::Serialize { .. } => "Serialization",
            Error::BindingCrdMissing => "BindingCRDMissing",
            Error::Config(_) => "Config",
        }
    }
}

/// Failure reason (metric label) of a client error.
fn kube_failure_reason(err: &kube::Error) -> &'static str {
    match err {
        kube::Error::Api(status) => status_failure_reason(status.code),
        kube::Error::Auth(_) => "Auth",
        kube::Error::SerdeError(_) => "Serialization",
        _ => "Transport",
    }
}

/// Failure reason (metric label) of an API error status code.
fn status_failure_reason(code: u16) -> &'static str {
    match code {
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Gone",
        422 => "Invalid",
        429 => "TooManyRequests",
        500..=599 => "ServerError",
        _ => "ApiError",
    }
}

/// The fleet category of an API error status code.
pub fn categorize_status(code: u16) -> ErrorCategory {
    match code {
        401 => ErrorCategory::Unauthorized,
        403 => ErrorCategory::Forbidden,
        429 | 500..=599 => ErrorCategory::ServerError,
        _ => ErrorCategory::Other,
    }
}

/// The fleet category of a client error: the API's status code when it answered, else TLS
/// or unreachable from the transport's error chain (hyper and rustls say "certificate",
/// "handshake", … only in their text). Callers whose clients fail in ways of their own
/// (the hub's credential plugins) check for those first.
pub fn categorize_kube(err: &kube::Error) -> ErrorCategory {
    match err {
        kube::Error::Api(status) => categorize_status(status.code),
        // The server sent more than kleym reads in one piece: it misbehaves.
        other if too_large_in(other).is_some() => ErrorCategory::ServerError,
        other => {
            let text = chain_text(other).to_ascii_lowercase();
            if text.contains("certificate")
                || text.contains("tls")
                || text.contains("handshake")
                || text.contains("unknownissuer")
            {
                ErrorCategory::Tls
            } else {
                ErrorCategory::Unreachable
            }
        }
    }
}

/// An error and its source chain as one line, `outer: inner: …` (the transport's chain
/// says more than kube's top-level message).
pub fn chain_text(err: &(dyn StdError + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> Error {
        let status = kube::core::Status::failure("nope", "Forbidden").with_code(code);
        Error::kube(
            "apply ClusterSPIFFEID x",
            kube::Error::Api(Box::new(status)),
        )
    }

    #[test]
    fn api_errors_are_categorised_by_code() {
        assert_eq!(api_error(403).failure_reason(), "Forbidden");
        assert_eq!(api_error(409).failure_reason(), "Conflict");
        assert_eq!(api_error(503).failure_reason(), "ServerError");
        assert_eq!(api_error(403).status_code(), Some(403));
        assert_eq!(
            Error::CacheNotReady("bindings").failure_reason(),
            "CacheNotReady"
        );
    }

    /// The fleet categories of status codes and transport failures (the hub's statuses
    /// and report show these).
    #[test]
    fn client_errors_map_to_fleet_categories() {
        for (code, category) in [
            (401, ErrorCategory::Unauthorized),
            (403, ErrorCategory::Forbidden),
            (404, ErrorCategory::Other),
            (429, ErrorCategory::ServerError),
            (503, ErrorCategory::ServerError),
        ] {
            assert_eq!(categorize_status(code), category, "{code}");
            let status = kube::core::Status::failure("x", "Reason").with_code(code);
            assert_eq!(
                categorize_kube(&kube::Error::Api(Box::new(status))),
                category
            );
        }
        let tls = kube::Error::Service("invalid peer certificate: UnknownIssuer".into());
        assert_eq!(categorize_kube(&tls), ErrorCategory::Tls);
        let refused = kube::Error::Service("tcp connect error: Connection refused".into());
        assert_eq!(categorize_kube(&refused), ErrorCategory::Unreachable);
    }

    #[test]
    fn message_names_the_action() {
        assert!(
            api_error(403)
                .to_string()
                .starts_with("apply ClusterSPIFFEID x: ")
        );
    }
}
