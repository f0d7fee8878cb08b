//! Identity for kubesim clusters, as kube-apiserver does it: a per-cluster CA and serving
//! certificate, client-certificate users (CN = user, O = groups), ServiceAccount tokens as
//! RS256 JWTs with OIDC discovery and key rotation, external JWT issuers verified against a
//! JWKS fetched over HTTPS, and RBAC authorization. (Static bearer tokens are a plain table
//! kept by the HTTP layer; [`token_hash`] is what it may log.)
//!
//! Interface (other kubesim crates rely on it; keep it stable): [`UserInfo`], [`pki`],
//! [`jwt`], [`rbac`], [`external`].
//!
//! # How the HTTP layer uses this crate
//!
//! 1. **TLS**: [`pki::ClusterPki::generate`] once per simulated cluster; serve with
//!    [`pki::ClusterPki::server_config`] (`request_client_certs = true` to accept client
//!    certificates). After the handshake, take the peer's first certificate and call
//!    [`pki::user_from_client_cert`] (rustls has already verified it against the cluster CA).
//!    Hand out kubeconfig credentials with [`pki::ClusterPki::issue_client_cert`].
//! 2. **Bearer tokens**, in kube-apiserver's order: static tokens (the HTTP layer's own table,
//!    compare by value, log only [`token_hash`]), then ServiceAccount JWTs
//!    ([`jwt::SaIssuer::verify`], then [`jwt::user_from_claims`]; the HTTP layer must still check
//!    that the ServiceAccount with [`jwt::SaClaims::sa_uid`] and the bound pod exist and that
//!    [`jwt::SaClaims::jti`] is not revoked), then external issuers
//!    ([`external::ExternalIssuer::verify`]). Use [`jwt::peek_issuer`] to route a JWT to the
//!    right verifier without trying each one.
//! 3. **TokenRequest**: [`jwt::SaIssuer::issue`] (validates `expirationSeconds` like
//!    kube-apiserver). **OIDC discovery**: serve [`jwt::SaIssuer::openid_configuration`] at
//!    `/.well-known/openid-configuration` and [`jwt::SaIssuer::jwks`] at `/openid/v1/jwks`.
//! 4. **RBAC**: build an [`rbac::RbacSnapshot`] from the stored Role/ClusterRole/RoleBinding/
//!    ClusterRoleBinding objects (preload [`rbac::default_cluster_roles_and_bindings`] into
//!    the store), call [`rbac::authorize`], and on denial answer 403 with
//!    [`rbac::forbidden_status`] (or [`rbac::forbidden_message`] for the text).
#![warn(missing_docs)]

pub mod external;
pub mod jwt;
pub mod pki;
pub mod rbac;
pub mod structured;

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The group every authenticated user is in.
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";
/// The group of unauthenticated (anonymous) requests.
pub const GROUP_UNAUTHENTICATED: &str = "system:unauthenticated";
/// The group that bypasses authorization (kube-apiserver's privileged group).
pub const GROUP_MASTERS: &str = "system:masters";
/// The group of every ServiceAccount.
pub const GROUP_SERVICEACCOUNTS: &str = "system:serviceaccounts";
/// The username of anonymous requests.
pub const USER_ANONYMOUS: &str = "system:anonymous";

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

impl UserInfo {
    /// The anonymous user (`system:anonymous`, group `system:unauthenticated`).
    pub fn anonymous() -> Self {
        UserInfo {
            username: USER_ANONYMOUS.to_string(),
            groups: vec![GROUP_UNAUTHENTICATED.to_string()],
            ..Default::default()
        }
    }

    /// Whether the user is in `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// Adds `system:authenticated` unless present (kube-apiserver adds it to every
    /// authenticated user).
    pub fn with_authenticated_group(mut self) -> Self {
        if !self.in_group(GROUP_AUTHENTICATED) {
            self.groups.push(GROUP_AUTHENTICATED.to_string());
        }
        self
    }
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
    /// A request to this crate was invalid (e.g. a TokenRequest `expirationSeconds` out of
    /// range, an external issuer configuration that is not HTTPS). The message has the shape
    /// of a Kubernetes field error where one applies.
    #[error("{0}")]
    InvalidRequest(String),
}

/// Convenience alias.
pub type Result<T, E = AuthError> = std::result::Result<T, E>;

/// A short, stable, non-reversible identifier of a token for logs and cache keys: the first
/// 12 hex digits of its SHA-256. Never log the token itself.
pub fn token_hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    hex::encode(&digest[..6])
}

/// The full hex SHA-256 of a token, for cache keys where collisions must not happen.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_hash_is_short_stable_and_does_not_contain_token() {
        let h = token_hash("secret-token-value");
        assert_eq!(h.len(), 12);
        assert_eq!(h, token_hash("secret-token-value"));
        assert_ne!(h, token_hash("secret-token-valuf"));
        assert!(!h.contains("secret"));
        assert!(token_sha256("x").starts_with(&token_hash("x")));
    }

    #[test]
    fn authenticated_group_added_once() {
        let u = UserInfo {
            username: "bob".into(),
            groups: vec!["dev".into()],
            ..Default::default()
        }
        .with_authenticated_group()
        .with_authenticated_group();
        assert_eq!(
            u.groups,
            vec!["dev".to_string(), GROUP_AUTHENTICATED.to_string()]
        );
        assert!(UserInfo::anonymous().in_group(GROUP_UNAUTHENTICATED));
    }
}
