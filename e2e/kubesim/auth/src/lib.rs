//! Identity for kubesim clusters, as kube-apiserver does it: a per-cluster CA and serving
//! certificate, client-certificate users (CN = user, O = groups), static bearer tokens,
//! ServiceAccount tokens as RS256 JWTs with OIDC discovery and key rotation, external JWT
//! issuers verified against a JWKS fetched over HTTPS, and RBAC authorization.
//!
//! Interface (other kubesim crates rely on it; keep it stable): [`UserInfo`], [`pki`],
//! [`jwt`], [`rbac`].

pub mod jwt;
pub mod pki;
pub mod rbac;

use std::collections::BTreeMap;

/// An authenticated user, as kube-apiserver's `user.Info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// e.g. `admin`, `system:serviceaccount:ns:name`.
    pub username: String,
    /// UID if known (ServiceAccount UID for SA tokens).
    pub uid: String,
    /// Groups, including `system:authenticated` (and `system:serviceaccounts`,
    /// `system:serviceaccounts:<ns>` for SA tokens).
    pub groups: Vec<String>,
    /// Extra attributes (e.g. `authentication.kubernetes.io/pod-name`).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Certificate generation or parsing failed.
    #[error("pki: {0}")]
    Pki(String),
    /// A token was rejected (the message is safe to show; it never contains the token).
    #[error("invalid bearer token: {0}")]
    InvalidToken(String),
    /// Fetching a remote JWKS failed (transient).
    #[error("jwks: {0}")]
    Jwks(String),
}
