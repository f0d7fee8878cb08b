//! Why a spoke connection fails: the one error taxonomy of the spoke, the hub's fleet state
//! and the report, and its one mapping to the condition [`reasons`] the hub writes.
//!
//! The mapping from client errors (`kube::Error`, HTTP status codes) to a category lives
//! with the client code (`kleym_spoke::reconciler::error`); this crate only names the
//! categories and their reasons, so every status and report says the same thing for the
//! same failure.

use serde::{Deserialize, Serialize};

use super::reasons;

/// What kind of failure a spoke had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCategory {
    /// Connection refused, timed out, DNS, proxy: the API server could not be reached.
    Unreachable,
    /// TLS handshake or certificate verification failed.
    Tls,
    /// The credential plugin failed (the message says how: not found, timeout, exit, output).
    Credentials,
    /// The API server rejected the credential (401).
    Unauthorized,
    /// RBAC forbids what kleym needs (403).
    Forbidden,
    /// A CRD kleym needs (the InferenceIdentityBinding CRD, or one a watch lists) is not
    /// served by the spoke.
    CrdMissing,
    /// The API server answered with a 5xx or 429.
    ServerError,
    /// The caches did not sync before the initial-sync deadline.
    SyncTimeout,
    /// The ClusterProfile cannot be engaged (no matching access provider, invalid config).
    ProfileRefused,
    /// Anything else (invalid client configuration, unexpected API errors).
    Other,
}

impl ErrorCategory {
    /// The category name, as logs show it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::Unreachable => "Unreachable",
            ErrorCategory::Tls => "TLS",
            ErrorCategory::Credentials => "Credentials",
            ErrorCategory::Unauthorized => "Unauthorized",
            ErrorCategory::Forbidden => "Forbidden",
            ErrorCategory::CrdMissing => "CRDMissing",
            ErrorCategory::ServerError => "ServerError",
            ErrorCategory::SyncTimeout => "SyncTimeout",
            ErrorCategory::ProfileRefused => "ProfileRefused",
            ErrorCategory::Other => "Other",
        }
    }

    /// The condition reason a failing condition of a `ClusterIdentityStatus` carries for
    /// this category. Server errors, sync timeouts and the rest share [`reasons::ERROR`]:
    /// the message tells them apart, the reason only says what an operator must fix.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorCategory::Unreachable => reasons::UNREACHABLE,
            ErrorCategory::Tls => reasons::TLS_FAILURE,
            ErrorCategory::Credentials => reasons::CREDENTIAL_PLUGIN_FAILED,
            ErrorCategory::Unauthorized => reasons::UNAUTHORIZED,
            ErrorCategory::Forbidden => reasons::FORBIDDEN,
            ErrorCategory::CrdMissing => reasons::CRD_MISSING,
            ErrorCategory::ProfileRefused => reasons::PROFILE_REFUSED,
            ErrorCategory::ServerError | ErrorCategory::SyncTimeout | ErrorCategory::Other => {
                reasons::ERROR
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reasons written to `ClusterIdentityStatus` conditions, byte for byte.
    #[test]
    fn categories_map_to_condition_reasons() {
        for (category, reason) in [
            (ErrorCategory::Unreachable, "Unreachable"),
            (ErrorCategory::Tls, "TLSFailure"),
            (ErrorCategory::Credentials, "CredentialPluginFailed"),
            (ErrorCategory::Unauthorized, "Unauthorized"),
            (ErrorCategory::Forbidden, "Forbidden"),
            (ErrorCategory::CrdMissing, "CRDMissing"),
            (ErrorCategory::ProfileRefused, "ProfileRefused"),
            (ErrorCategory::ServerError, "Error"),
            (ErrorCategory::SyncTimeout, "Error"),
            (ErrorCategory::Other, "Error"),
        ] {
            assert_eq!(category.reason(), reason, "{category:?}");
        }
    }
}
