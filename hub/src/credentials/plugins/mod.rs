//! Bundled credential plugins (`kleym credential …`). They speak the exec protocol like any
//! third-party plugin: read `KUBERNETES_EXEC_INFO`, print one `ExecCredential` on stdout,
//! report errors on stderr with exit code 1. Errors never contain the token.
//!
//! The answer uses the `apiVersion` of the request (`v1` or `v1beta1`), so the plugins work
//! whichever version the provider is configured with.

pub mod exec_info;
pub mod hub_client;
pub mod secret_reader;
pub mod spiffe_id;
pub mod spiffe_jwt;
pub mod spiffe_x509;
pub mod token_request;
pub mod workload_api;

use thiserror::Error;

/// Why a bundled plugin produced no credential.
#[derive(Debug, Error)]
pub enum PluginError {
    /// `KUBERNETES_EXEC_INFO` is missing or malformed.
    #[error("KUBERNETES_EXEC_INFO: {0}")]
    ExecInfo(String),
    /// A flag or input value is invalid.
    #[error("{0}")]
    Input(String),
    /// Connecting to the hub's API server failed.
    #[error("hub client: {0}")]
    HubClient(String),
    /// The SPIFFE Workload API (a SPIRE agent) failed or sent an SVID that is refused.
    #[error("Workload API: {0}")]
    WorkloadApi(String),
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was attempted.
        what: String,
        /// kube's error.
        source: kube::Error,
    },
}
