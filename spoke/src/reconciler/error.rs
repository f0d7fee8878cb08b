//! Reconciler errors. Each carries a stable category used in logs and as the `reason`
//! label of `kleym_spoke_reconcile_failures_total`.

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

    /// Stable category for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => kube_category(source),
            Error::CacheNotReady(_) => "CacheNotReady",
            Error::Serialize { .. } => "Serialization",
            Error::BindingCrdMissing => "BindingCRDMissing",
            Error::Config(_) => "Config",
        }
    }
}

/// Category of a client error.
pub fn kube_category(err: &kube::Error) -> &'static str {
    match err {
        kube::Error::Api(status) => status_category(status.code),
        kube::Error::Auth(_) => "Auth",
        kube::Error::SerdeError(_) => "Serialization",
        _ => "Transport",
    }
}

/// Category of an API error status code.
pub fn status_category(code: u16) -> &'static str {
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
        assert_eq!(api_error(403).category(), "Forbidden");
        assert_eq!(api_error(409).category(), "Conflict");
        assert_eq!(api_error(503).category(), "ServerError");
        assert_eq!(api_error(403).status_code(), Some(403));
        assert_eq!(Error::CacheNotReady("bindings").category(), "CacheNotReady");
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
