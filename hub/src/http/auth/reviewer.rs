//! What the API asks the hub's kube-apiserver: a `TokenReview` (who is this?) and a
//! `SubjectAccessReview` (may they read the report?). A trait so tests use a fake.

use futures::future::BoxFuture;
use std::collections::BTreeMap;

/// An authenticated caller, as the `TokenReview` returned it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub struct Caller {
    /// `status.user.username` (e.g. `system:serviceaccount:<ns>:<name>`).
    pub username: String,
    /// `status.user.uid`.
    pub uid: String,
    /// `status.user.groups`.
    pub groups: Vec<String>,
    /// `status.user.extra` (bound pod name/uid, credential id…).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The `status` of a `TokenReview`, reduced to what the API decides on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenReviewStatus {
    /// `status.authenticated`.
    pub authenticated: bool,
    /// `status.user` (meaningful when authenticated).
    pub user: Caller,
    /// `status.audiences`: the audiences the token is valid for, among those asked.
    pub audiences: Vec<String>,
    /// `status.error` (why it was not authenticated; may be empty).
    pub error: String,
}

/// The access the caller needs (`resourceAttributes` of the `SubjectAccessReview`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessCheck {
    /// Verb (`get`).
    pub verb: String,
    /// API group (`kleym.io`).
    pub group: String,
    /// Resource plural (`fleetidentityreports`).
    pub resource: String,
    /// Namespace (`None`: cluster scope, as for `fleetidentityreports`).
    pub namespace: Option<String>,
    /// Object name (`None`: any).
    pub name: Option<String>,
}

impl Default for AccessCheck {
    fn default() -> Self {
        Self {
            verb: "get".into(),
            group: "kleym.io".into(),
            resource: "fleetidentityreports".into(),
            namespace: None,
            name: None,
        }
    }
}

impl std::fmt::Display for AccessCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}.{}", self.verb, self.resource, self.group)?;
        if let Some(n) = &self.name {
            write!(f, " {n:?}")?;
        }
        if let Some(ns) = &self.namespace {
            write!(f, " in namespace {ns:?}")?;
        }
        Ok(())
    }
}

/// The `status` of a `SubjectAccessReview`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessDecision {
    /// `status.allowed = true`.
    Allowed,
    /// Not allowed; the reason the authorizer gave (may be empty).
    Denied(String),
}

/// A review that did not produce an answer. Never cached: the next request asks again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// The review did not answer within the configured timeout.
    #[error("the {0} timed out")]
    Timeout(&'static str),
    /// The apiserver answered with an error status (5xx, 429, or a 4xx such as the hub
    /// lacking RBAC to create reviews — a configuration problem, not the caller's).
    #[error("the {kind} failed with HTTP {code}: {message}")]
    Api {
        /// `TokenReview` or `SubjectAccessReview`.
        kind: &'static str,
        /// HTTP status code.
        code: u16,
        /// The apiserver's message.
        message: String,
    },
    /// Connection, TLS or decoding failure.
    #[error("the {kind} failed: {message}")]
    Transport {
        /// `TokenReview` or `SubjectAccessReview`.
        kind: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// Asks the apiserver about tokens and access.
pub trait Reviewer: Send + Sync + std::fmt::Debug {
    /// `TokenReview` of `token` with `spec.audiences = [audience]`.
    fn review_token<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<TokenReviewStatus, ReviewError>>;

    /// `SubjectAccessReview`: may `caller` do `check`?
    fn review_access<'a>(
        &'a self,
        caller: &'a Caller,
        check: &'a AccessCheck,
    ) -> BoxFuture<'a, Result<AccessDecision, ReviewError>>;
}
