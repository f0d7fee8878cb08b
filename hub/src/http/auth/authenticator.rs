//! [`ApiAuth`]: the per-request decision, with caches and single-flight in front of the
//! reviews so that the apiserver sees at most one `TokenReview` per distinct token per
//! cache lifetime, however many requests carry it.

use super::cache::TtlCache;
use super::clock::{Clock, SystemClock};
use super::mode::AuthMode;
use super::reviewer::{AccessCheck, AccessDecision, Caller, ReviewError, Reviewer};
use super::single_flight::{SingleFlight, Source};
use super::token::{TokenHash, bearer_token, jwt_expiry};
use crate::http::metrics::ApiMetrics;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Settings of [`ApiAuth`].
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// What to do with failures (`--api-auth-mode`).
    pub mode: AuthMode,
    /// The audience tokens must be issued for (`--api-audience`): sent as
    /// `spec.audiences`, and required in `status.audiences`.
    pub audience: String,
    /// The access callers need (default: `get fleetidentityreports.kleym.io`).
    pub access: AccessCheck,
    /// Longest time a positive TokenReview is trusted; also never past the token's `exp`.
    pub positive_ttl: Duration,
    /// How long a definite rejection (`authenticated: false`, wrong audience) is remembered.
    pub negative_ttl: Duration,
    /// How long a SubjectAccessReview decision (allowed or denied) is remembered.
    pub access_ttl: Duration,
    /// Entries per cache (positive, negative, access): memory stays bounded under a flood.
    pub cache_capacity: usize,
    /// Time limit of one review, including the wait for a review slot.
    pub review_timeout: Duration,
    /// Reviews in flight at once, across all tokens (protects the apiserver from a flood).
    pub max_concurrent_reviews: usize,
}

impl AuthConfig {
    /// Defaults for `mode` and `audience`: positive TTL 2 min (kube-apiserver's webhook token
    /// cache default), negative 10 s, access 10 s, 10 000 entries per cache, 5 s review
    /// timeout, 16 concurrent reviews.
    pub fn new(mode: AuthMode, audience: impl Into<String>) -> Self {
        Self {
            mode,
            audience: audience.into(),
            access: AccessCheck::default(),
            positive_ttl: Duration::from_secs(120),
            negative_ttl: Duration::from_secs(10),
            access_ttl: Duration::from_secs(10),
            cache_capacity: 10_000,
            review_timeout: Duration::from_secs(5),
            max_concurrent_reviews: 16,
        }
    }
}

/// Which refusal a failed check maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum FailureKind {
    /// No token, or a token the TokenReview rejected: 401.
    Unauthenticated,
    /// Authenticated, but the SubjectAccessReview denied: 403.
    Forbidden,
    /// The apiserver gave no answer (timeout, 5xx, connection error): 503. Not the caller's
    /// fault, so not a 401 (which would tell a well-behaved client to drop a good token).
    Unavailable,
}

impl FailureKind {
    /// The HTTP status code.
    pub fn status(self) -> http::StatusCode {
        match self {
            Self::Unauthenticated => http::StatusCode::UNAUTHORIZED,
            Self::Forbidden => http::StatusCode::FORBIDDEN,
            Self::Unavailable => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Why a request failed authentication or authorization. The message is safe to return to
/// the caller and to log: it never contains the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthFailure {
    /// The refusal.
    pub kind: FailureKind,
    /// A human-readable explanation.
    pub message: String,
    /// The first 12 hex digits of the token's SHA-256, when a token was sent (for logs).
    pub token_hash_prefix: Option<String>,
}

/// The result of [`ApiAuth::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthDecision {
    /// Serve the request.
    Allow {
        /// The authenticated caller (`None` in mode `off`, or when permissive let a failure
        /// through).
        caller: Option<Caller>,
        /// In `permissive` mode, the failure that would have refused the request.
        warning: Option<AuthFailure>,
    },
    /// Refuse the request (`enforce` only).
    Deny(AuthFailure),
}

/// A definite rejection, as cached.
#[derive(Debug, Clone)]
struct Rejection {
    outcome: &'static str,
    message: String,
}

/// The answer of one token review, shared with every request that waited on it.
#[derive(Debug, Clone)]
enum TokenOutcome {
    Authenticated(Arc<Caller>),
    Rejected(Rejection),
    Failed(ReviewError),
}

#[derive(Debug)]
struct Inner {
    config: AuthConfig,
    reviewer: Arc<dyn Reviewer>,
    clock: Arc<dyn Clock>,
    metrics: ApiMetrics,
    positive: TtlCache<TokenHash, Arc<Caller>>,
    negative: TtlCache<TokenHash, Rejection>,
    access: TtlCache<Caller, AccessDecision>,
    token_flight: Arc<SingleFlight<TokenHash, TokenOutcome>>,
    access_flight: Arc<SingleFlight<Caller, Result<AccessDecision, ReviewError>>>,
    slots: Semaphore,
}

/// Authenticates and authorizes `/v1` requests. Cheap to clone (shared state).
///
/// Caches, all keyed so that no token is stored (SHA-256 of the token, or the caller):
/// - positive: `TokenReview` said authenticated for our audience → trusted until
///   `min(now + positive_ttl, exp)` (`exp` read from the JWT without verification; opaque
///   tokens get `positive_ttl`). A revoked token is therefore accepted until then.
/// - negative: `authenticated: false` or a wrong audience → refused for `negative_ttl`
///   without asking again, so a flood of bad tokens costs one review per distinct token.
/// - access: `SubjectAccessReview` decisions per caller for `access_ttl`.
///
/// Review errors (timeouts, 5xx, connection failures) are never cached. Concurrent requests
/// with the same uncached token share one review (single-flight).
#[derive(Debug, Clone)]
pub struct ApiAuth {
    inner: Arc<Inner>,
}

impl ApiAuth {
    /// An authenticator using `reviewer`, the system clock and `metrics`.
    pub fn new(config: AuthConfig, reviewer: Arc<dyn Reviewer>, metrics: ApiMetrics) -> Self {
        Self::with_clock(config, reviewer, metrics, Arc::new(SystemClock))
    }

    /// [`ApiAuth::new`] with an explicit clock (tests).
    pub fn with_clock(
        config: AuthConfig,
        reviewer: Arc<dyn Reviewer>,
        metrics: ApiMetrics,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let cap = config.cache_capacity;
        let slots = Semaphore::new(config.max_concurrent_reviews.max(1));
        Self {
            inner: Arc::new(Inner {
                config,
                reviewer,
                clock,
                metrics,
                positive: TtlCache::new(cap),
                negative: TtlCache::new(cap),
                access: TtlCache::new(cap),
                token_flight: SingleFlight::new(),
                access_flight: SingleFlight::new(),
                slots,
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AuthConfig {
        &self.inner.config
    }

    /// Decide on a request with these headers, per the mode.
    pub async fn check(&self, headers: &http::HeaderMap) -> AuthDecision {
        let inner = &self.inner;
        if inner.config.mode == AuthMode::Off {
            inner.metrics.authn("skipped");
            return AuthDecision::Allow {
                caller: None,
                warning: None,
            };
        }
        match self.verify(headers).await {
            Ok(caller) => AuthDecision::Allow {
                caller: Some(caller),
                warning: None,
            },
            Err(failure) if inner.config.mode == AuthMode::Enforce => AuthDecision::Deny(failure),
            Err(failure) => {
                inner.metrics.permissive_allowed.inc();
                tracing::warn!(
                    kind = ?failure.kind,
                    token = failure.token_hash_prefix.as_deref().unwrap_or("none"),
                    reason = %failure.message,
                    "hub API: request failed auth; served because --api-auth-mode=permissive"
                );
                AuthDecision::Allow {
                    caller: None,
                    warning: Some(failure),
                }
            }
        }
    }

    async fn verify(&self, headers: &http::HeaderMap) -> Result<Caller, AuthFailure> {
        let metrics = &self.inner.metrics;
        let token = bearer_token(headers).map_err(|e| {
            metrics.authn("no_token");
            AuthFailure {
                kind: FailureKind::Unauthenticated,
                message: e.to_string(),
                token_hash_prefix: None,
            }
        })?;
        let hash = TokenHash::of(token);
        let caller = match self.authenticate(hash, token).await {
            TokenOutcome::Authenticated(c) => {
                metrics.authn("authenticated");
                c
            }
            TokenOutcome::Rejected(r) => {
                metrics.authn(r.outcome);
                tracing::debug!(token = %hash.prefix(), reason = %r.message, "hub API: token rejected");
                return Err(AuthFailure {
                    kind: FailureKind::Unauthenticated,
                    message: r.message,
                    token_hash_prefix: Some(hash.prefix()),
                });
            }
            TokenOutcome::Failed(e) => {
                metrics.authn("error");
                tracing::warn!(token = %hash.prefix(), error = %e, "hub API: token review failed");
                return Err(AuthFailure {
                    kind: FailureKind::Unavailable,
                    message: format!("cannot verify the token right now ({e}); retry later"),
                    token_hash_prefix: Some(hash.prefix()),
                });
            }
        };
        self.authorize(&caller).await.map_err(|mut f| {
            f.token_hash_prefix = Some(hash.prefix());
            f
        })?;
        Ok(Caller::clone(&caller))
    }

    /// A further access check for one request, after [`ApiAuth::check`] allowed it: may
    /// `caller` also do `check` (e.g. a namespaced one the route needs)? Per the mode: `off`
    /// allows; `permissive` allows and logs a failure (also when `caller` is `None`, a request
    /// permissive let through); `enforce` refuses with 403 or 503. Not cached: the routes that
    /// need it are rare operator calls, and each decision depends on the request's path.
    pub async fn authorize_also(
        &self,
        caller: Option<&Caller>,
        check: &AccessCheck,
    ) -> Result<(), AuthFailure> {
        let inner = &self.inner;
        let failure = match (inner.config.mode, caller) {
            (AuthMode::Off, _) => return Ok(()),
            (_, None) => AuthFailure {
                kind: FailureKind::Unauthenticated,
                message: format!("no authenticated caller to check {check} for"),
                token_hash_prefix: None,
            },
            (_, Some(caller)) => {
                let answer = async {
                    let _slot = inner.slots.acquire().await;
                    inner.reviewer.review_access(caller, check).await
                };
                let result = match tokio::time::timeout(inner.config.review_timeout, answer).await {
                    Ok(r) => r,
                    Err(_) => Err(ReviewError::Timeout("SubjectAccessReview")),
                };
                inner.metrics.review("access", result.is_ok());
                match result {
                    Ok(AccessDecision::Allowed) => {
                        inner.metrics.authz("allowed");
                        return Ok(());
                    }
                    Ok(AccessDecision::Denied(reason)) => {
                        inner.metrics.authz("denied");
                        let mut message = format!(
                            "{:?} is not allowed to {check} in the hub cluster",
                            caller.username
                        );
                        if !reason.is_empty() {
                            message.push_str(": ");
                            message.push_str(&reason);
                        }
                        AuthFailure {
                            kind: FailureKind::Forbidden,
                            message,
                            token_hash_prefix: None,
                        }
                    }
                    Err(e) => {
                        inner.metrics.authz("error");
                        AuthFailure {
                            kind: FailureKind::Unavailable,
                            message: format!("cannot check access right now ({e}); retry later"),
                            token_hash_prefix: None,
                        }
                    }
                }
            }
        };
        if inner.config.mode == AuthMode::Enforce {
            return Err(failure);
        }
        inner.metrics.permissive_allowed.inc();
        tracing::warn!(
            kind = ?failure.kind,
            reason = %failure.message,
            "hub API: request failed a further access check; served because --api-auth-mode=permissive"
        );
        Ok(())
    }

    /// The token's outcome: from the caches, from a review already under way, or from a new
    /// review (spawned, so a cancelled request does not cancel it for the others).
    async fn authenticate(&self, hash: TokenHash, token: &str) -> TokenOutcome {
        let inner = &self.inner;
        if let Some(hit) = inner.cached(hash) {
            return hit;
        }
        let task_inner = inner.clone();
        let token = token.to_string();
        let flight = inner
            .token_flight
            .run(
                hash,
                || inner.cached(hash),
                move || async move { task_inner.review_token(hash, &token).await },
            )
            .await;
        match flight {
            Some((outcome, source)) => {
                if source == Source::Joined {
                    inner.metrics.cache_hit("token_inflight");
                }
                outcome
            }
            None => TokenOutcome::Failed(internal("TokenReview", "the review task stopped")),
        }
    }

    async fn authorize(&self, caller: &Caller) -> Result<(), AuthFailure> {
        let inner = &self.inner;
        let check = &inner.config.access;
        let cached = || {
            let hit = inner.access.get(caller, inner.clock.now());
            if hit.is_some() {
                inner.metrics.cache_hit("access");
            }
            hit.map(Ok)
        };
        let result = match cached() {
            Some(hit) => hit,
            None => {
                let task_inner = inner.clone();
                let task_caller = caller.clone();
                let flight = inner
                    .access_flight
                    .run(caller.clone(), cached, move || async move {
                        task_inner.review_access(task_caller).await
                    })
                    .await;
                match flight {
                    Some((result, source)) => {
                        if source == Source::Joined {
                            inner.metrics.cache_hit("access_inflight");
                        }
                        result
                    }
                    None => Err(internal("SubjectAccessReview", "the review task stopped")),
                }
            }
        };
        let decision = match result {
            Ok(d) => d,
            Err(e) => {
                inner.metrics.authz("error");
                tracing::warn!(user = %caller.username, error = %e, "hub API: access review failed");
                return Err(AuthFailure {
                    kind: FailureKind::Unavailable,
                    message: format!("cannot check access right now ({e}); retry later"),
                    token_hash_prefix: None,
                });
            }
        };
        match decision {
            AccessDecision::Allowed => {
                inner.metrics.authz("allowed");
                Ok(())
            }
            AccessDecision::Denied(reason) => {
                inner.metrics.authz("denied");
                let mut message = format!(
                    "{:?} is not allowed to {check} (cluster scope) in the hub cluster",
                    caller.username
                );
                if !reason.is_empty() {
                    message.push_str(": ");
                    message.push_str(&reason);
                }
                Err(AuthFailure {
                    kind: FailureKind::Forbidden,
                    message,
                    token_hash_prefix: None,
                })
            }
        }
    }
}

fn internal(kind: &'static str, message: &str) -> ReviewError {
    ReviewError::Transport {
        kind,
        message: message.to_string(),
    }
}

impl Inner {
    fn cached(&self, hash: TokenHash) -> Option<TokenOutcome> {
        let now = self.clock.now();
        if let Some(c) = self.positive.get(&hash, now) {
            self.metrics.cache_hit("token_positive");
            return Some(TokenOutcome::Authenticated(c));
        }
        if let Some(r) = self.negative.get(&hash, now) {
            self.metrics.cache_hit("token_negative");
            return Some(TokenOutcome::Rejected(r));
        }
        None
    }

    /// Send one SubjectAccessReview and cache its decision (allowed or denied).
    async fn review_access(&self, caller: Caller) -> Result<AccessDecision, ReviewError> {
        let answer = async {
            let _slot = self.slots.acquire().await;
            self.reviewer
                .review_access(&caller, &self.config.access)
                .await
        };
        let result = match tokio::time::timeout(self.config.review_timeout, answer).await {
            Ok(r) => r,
            Err(_) => Err(ReviewError::Timeout("SubjectAccessReview")),
        };
        self.metrics.review("access", result.is_ok());
        if let Ok(d) = &result {
            let now = self.clock.now();
            self.access
                .insert(caller, d.clone(), now + self.config.access_ttl, now);
        }
        result
    }

    /// Send one TokenReview and cache a definite answer.
    async fn review_token(&self, hash: TokenHash, token: &str) -> TokenOutcome {
        let audience = self.config.audience.as_str();
        let answer = async {
            let _slot = self.slots.acquire().await;
            self.reviewer.review_token(token, audience).await
        };
        let result = match tokio::time::timeout(self.config.review_timeout, answer).await {
            Ok(r) => r,
            Err(_) => Err(ReviewError::Timeout("TokenReview")),
        };
        self.metrics.review("token", result.is_ok());
        let status = match result {
            Ok(s) => s,
            Err(e) => return TokenOutcome::Failed(e),
        };
        let now = self.clock.now();
        let rejection = if !status.authenticated {
            tracing::debug!(token = %hash.prefix(), error = %status.error, "TokenReview: not authenticated");
            Rejection {
                outcome: "rejected",
                // The apiserver's reason stays in the (debug) log: like kube-apiserver, the
                // API does not tell a caller why a token failed.
                message: format!(
                    "the bearer token was rejected by the hub cluster's TokenReview: it is \
                     invalid, expired or revoked, or was not issued for audience {audience:?}"
                ),
            }
        } else if !status.audiences.iter().any(|a| a == audience) {
            Rejection {
                outcome: "wrong_audience",
                message: format!(
                    "the bearer token is not valid for audience {audience:?}; request a \
                     ServiceAccount token with that audience"
                ),
            }
        } else {
            let caller = Arc::new(status.user);
            let mut expires = now + self.config.positive_ttl;
            if let Some(exp) = jwt_expiry(token) {
                expires = expires.min(exp);
            }
            self.positive.insert(hash, caller.clone(), expires, now);
            return TokenOutcome::Authenticated(caller);
        };
        self.negative
            .insert(hash, rejection.clone(), now + self.config.negative_ttl, now);
        TokenOutcome::Rejected(rejection)
    }
}
