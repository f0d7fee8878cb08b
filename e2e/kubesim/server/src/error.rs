//! Errors of the kubesim library.

/// Errors starting or driving simulated clusters.
#[derive(Debug, thiserror::Error)]
pub enum KubesimError {
    /// Binding or I/O failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Certificates, keys or tokens.
    #[error("auth: {0}")]
    Auth(#[from] kubesim_auth::AuthError),
    /// The store rejected something (e.g. a preloaded CRD).
    #[error("api: {0}")]
    Api(#[from] kubesim_store::ApiError),
    /// Building a kube client failed.
    #[error("kube client: {0}")]
    Kube(String),
    /// A cluster name is taken or unknown.
    #[error("cluster {0:?}: {1}")]
    Cluster(String, &'static str),
    /// Loading CRD files failed.
    #[error("crds {path}: {message}")]
    Crds {
        /// File or directory.
        path: String,
        /// What went wrong.
        message: String,
    },
}
