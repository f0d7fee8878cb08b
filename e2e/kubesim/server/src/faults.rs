//! Fault injection, switchable at run time per simulated cluster.
//!
//! Two ways in: the Rust API ([`FaultHandle`], from `ClusterHandle::faults()`) and the admin-only
//! HTTP endpoint `/kubesim/faults` (`GET` reads the state, `POST` a [`FaultRequest`] JSON body
//! changes it, `DELETE` clears everything; only `system:masters` may call it).
//!
//! Fault kinds:
//! - **latency**: every API request waits `latencyMs` before it is handled;
//! - **errors**: [`ErrorRule`]s answer a fraction (`rate`) of matching requests (by verb and
//!   resource) with a `Status` of code 429 (with `Retry-After: 1`), 500, 503 or 504;
//! - **failNext**: [`CountedFault`]s answer exactly the next `remaining` matching requests with
//!   a `Status` of code 409 (a lost optimistic-concurrency race), 429, 500, 503 or 504 — the
//!   deterministic way to prove a client retries one failed write;
//! - **dropWatches** (action): ends every open watch stream at once;
//! - **forceGoneWatches**: the next N watch requests get a `410 Expired` ERROR event;
//! - **blackhole**: new connections are accepted but never answered (not even the TLS
//!   handshake) and requests on open connections hang, until the blackhole is lifted;
//! - **refuseConnections**: the listener is closed (connections are refused) and open
//!   connections are dropped, until lifted (the same port is bound again);
//! - **token revocation**: one bearer token, or every ServiceAccount token issued so far;
//! - **clearAfterSeconds**: clear everything after a delay (lifts a blackhole or refusal,
//!   during which the endpoint itself is unreachable);
//! - **token clock skew**: token verification sees `now + tokenClockSkewSeconds`, which makes
//!   tokens expire early (a positive skew) without waiting;
//! - **goaway** (action): the next N connections get an HTTP/2 `GOAWAY` (on HTTP/1.1,
//!   `Connection: close` after the current request): open connections take one each at once,
//!   then newly accepted ones; in-flight requests get [`GOAWAY_GRACE`] to finish, then the
//!   connection is closed (cutting long watches, as an API server shutting down does);
//! - **h1Only**: TLS offers only `http/1.1` in ALPN and the server refuses HTTP/2, until
//!   lifted (for clients that must fall back to HTTP/1.1);
//! - **silentConnection**: every connection open when it is switched on stops answering
//!   (nothing read, nothing written, the socket kept open) until it is switched off, when
//!   those connections are closed; connections opened meanwhile are served normally (add
//!   `blackhole` for those);
//! - **endlessBodies**: [`EndlessBody`] rules answer matching requests (by verb and
//!   resource) with `200` and a body of `bytes` bytes that opens one JSON string and never
//!   ends it, without a newline: a hostile or broken API server's endless watch line or
//!   giant response. Not something kube-apiserver does; it is how a client's limits are
//!   tested. [`FaultHandle::endless_stats`] counts the bodies started and ended (sent in full
//!   or dropped by the client) and the bytes handed to the connection.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a connection that got a `goaway` still serves its open requests.
pub const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// One error-rate rule: matching requests fail with `code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorRule {
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`); `None` or `"*"` matches every verb.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verb: Option<String>,
    /// Resource plural (`pods`) or `plural.group` (`clusterspiffeids.spire.spiffe.io`);
    /// `None` or `"*"` matches every resource (non-resource paths never match a rule with a
    /// resource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Probability in `[0, 1]` that a matching request fails.
    pub rate: f64,
    /// HTTP status: 429, 500, 503 or 504.
    pub code: u16,
}

impl ErrorRule {
    /// Whether this rule applies to a request for `verb` on `resource` (`plural`) in `group`.
    pub fn matches(&self, verb: &str, resource: Option<(&str, &str)>) -> bool {
        let verb_ok = match self.verb.as_deref() {
            None | Some("*") => true,
            Some(v) => v.eq_ignore_ascii_case(verb),
        };
        let res_ok = match (self.resource.as_deref(), resource) {
            (None | Some("*"), _) => true,
            (Some(_), None) => false,
            (Some(want), Some((plural, group))) => {
                want == plural || (!group.is_empty() && want == format!("{plural}.{group}"))
            }
        };
        verb_ok && res_ok
    }
}

/// A fault for the next `remaining` requests matching `verb` and `resource` (as
/// [`ErrorRule::matches`] matches them), then gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CountedFault {
    /// Kubernetes verb; `"*"` matches every verb.
    pub verb: String,
    /// Resource plural or `plural.group`; `"*"` matches every resource.
    pub resource: String,
    /// HTTP status: 409, 429, 500, 503 or 504.
    pub code: u16,
    /// How many more matching requests fail.
    pub remaining: u32,
}

impl CountedFault {
    fn as_rule(&self) -> ErrorRule {
        ErrorRule {
            verb: Some(self.verb.clone()),
            resource: Some(self.resource.clone()),
            rate: 1.0,
            code: self.code,
        }
    }
}

/// Matching requests get an endless body (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndlessBody {
    /// Kubernetes verb (`watch`, `list`, `get`, …); `"*"` matches every verb.
    pub verb: String,
    /// Resource plural or `plural.group`; `"*"` matches every resource.
    pub resource: String,
    /// Bytes the body holds before it ends (without ever closing its string or its line).
    pub bytes: u64,
}

/// What the endless bodies did so far (see [`FaultHandle::endless_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndlessStats {
    /// Bodies started.
    pub started: u64,
    /// Bodies ended: sent in full, or dropped because the client went away (reset the
    /// stream, closed the connection).
    pub ended: u64,
    /// Bytes handed to the connections so far.
    pub bytes_sent: u64,
}

/// The counters behind [`EndlessStats`], shared by the bodies.
#[derive(Debug, Default)]
pub struct EndlessCounters {
    started: std::sync::atomic::AtomicU64,
    ended: std::sync::atomic::AtomicU64,
    bytes_sent: std::sync::atomic::AtomicU64,
}

impl EndlessCounters {
    /// One more body started.
    pub fn start(&self) {
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// One more body ended.
    pub fn end(&self) {
        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// `n` more bytes handed to a connection.
    pub fn sent(&self, n: u64) {
        self.bytes_sent
            .fetch_add(n, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The fault state of one cluster (what `GET /kubesim/faults` returns).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultState {
    /// Added latency per API request, in milliseconds.
    pub latency_ms: u64,
    /// Error-rate rules; the first matching rule that fires decides the code.
    pub errors: Vec<ErrorRule>,
    /// Counted faults, consulted before `errors`; exhausted ones are removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fail_next: Vec<CountedFault>,
    /// Accept connections and never answer.
    pub blackhole: bool,
    /// Close the listener and drop open connections.
    pub refuse_connections: bool,
    /// How many upcoming watch requests get a forced `410 Expired`.
    pub force_gone_watches: u32,
    /// Token verification clock skew in seconds (positive: tokens expire early).
    pub token_clock_skew_seconds: i64,
    /// Hashes (see `kubesim_auth::token_sha256`) of revoked bearer tokens; tokens themselves
    /// are never kept or shown.
    pub revoked_token_hashes: BTreeSet<String>,
    /// ServiceAccount tokens issued before this instant (Unix milliseconds) are revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sa_tokens_revoked_before_ms: Option<i64>,
    /// Incremented by every `dropWatches`; open watch streams end when it changes.
    pub watch_drop_epoch: u64,
    /// How many more connections get a `GOAWAY`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub goaway_connections: u32,
    /// Offer only HTTP/1.1 (ALPN) and refuse HTTP/2.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub h1_only: bool,
    /// Connections open when silence started stop answering.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub silent_connections: bool,
    /// Incremented each time `silentConnection` is switched on; a connection accepted under
    /// an older epoch goes silent when it changes.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub silence_epoch: u64,
    /// Endless-body rules; the first matching one answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endless_bodies: Vec<EndlessBody>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// The body of `POST /kubesim/faults`: every field is optional; present fields are set,
/// actions are performed once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultRequest {
    /// Set the added latency (ms).
    #[serde(default)]
    pub latency_ms: Option<u64>,
    /// Replace the error rules.
    #[serde(default)]
    pub errors: Option<Vec<ErrorRule>>,
    /// Append counted faults.
    #[serde(default)]
    pub fail_next: Vec<CountedFault>,
    /// Switch the blackhole on or off.
    #[serde(default)]
    pub blackhole: Option<bool>,
    /// Switch connection refusal on or off.
    #[serde(default)]
    pub refuse_connections: Option<bool>,
    /// Force `410` on the next N watch requests.
    #[serde(default)]
    pub force_gone_watches: Option<u32>,
    /// Action: end every open watch stream now.
    #[serde(default)]
    pub drop_watches: bool,
    /// Set the token clock skew (seconds).
    #[serde(default)]
    pub token_clock_skew_seconds: Option<i64>,
    /// Action: revoke these bearer tokens (any kind, including static ones).
    #[serde(default)]
    pub revoke_tokens: Vec<String>,
    /// Action: revoke every ServiceAccount token issued so far.
    #[serde(default)]
    pub revoke_all_service_account_tokens: bool,
    /// Clear every fault (as `DELETE` does) this many seconds from now: the way to lift a
    /// blackhole or connection refusal over HTTP, since the endpoint is unreachable then.
    #[serde(default)]
    pub clear_after_seconds: Option<u64>,
    /// Action: send `GOAWAY` on the next N connections (open ones first).
    #[serde(default)]
    pub goaway: Option<u32>,
    /// Switch HTTP/1.1-only serving on or off.
    #[serde(default)]
    pub h1_only: Option<bool>,
    /// Switch silence of the open connections on (they stop answering) or off (they close).
    #[serde(default)]
    pub silent_connection: Option<bool>,
    /// Replace the endless-body rules.
    #[serde(default)]
    pub endless_bodies: Option<Vec<EndlessBody>>,
}

/// Errors of a fault request.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// An error rule is out of range.
    #[error("invalid error rule: {0}")]
    InvalidRule(String),
}

/// Run-time switch for one cluster's faults. Cheap to clone; every clone controls the same
/// cluster.
#[derive(Clone)]
pub struct FaultHandle {
    state: Arc<watch::Sender<FaultState>>,
    on_drop_watches: Arc<dyn Fn() + Send + Sync>,
    endless: Arc<EndlessCounters>,
}

impl std::fmt::Debug for FaultHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultHandle")
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl FaultHandle {
    /// A handle with no faults; `on_drop_watches` is called by [`FaultHandle::drop_watches`]
    /// (the server passes the store's `close_watches`).
    pub fn new(on_drop_watches: Arc<dyn Fn() + Send + Sync>) -> Self {
        Self {
            state: Arc::new(watch::Sender::new(FaultState::default())),
            on_drop_watches,
            endless: Arc::default(),
        }
    }

    /// A copy of the current state.
    pub fn snapshot(&self) -> FaultState {
        self.state.borrow().clone()
    }

    /// The added latency (cheap: no copy of the state).
    pub fn latency(&self) -> Duration {
        Duration::from_millis(self.state.borrow().latency_ms)
    }

    /// The token verification clock skew in seconds.
    pub fn token_clock_skew_seconds(&self) -> i64 {
        self.state.borrow().token_clock_skew_seconds
    }

    /// ServiceAccount tokens issued before this instant (Unix ms) are revoked.
    pub fn sa_tokens_revoked_before_ms(&self) -> Option<i64> {
        self.state.borrow().sa_tokens_revoked_before_ms
    }

    /// Subscribe to state changes (used by the listener and open watches).
    pub fn subscribe(&self) -> watch::Receiver<FaultState> {
        self.state.subscribe()
    }

    /// Remove every fault and every revocation.
    pub fn clear(&self) {
        self.state.send_modify(|s| {
            let epoch = s.watch_drop_epoch;
            let silence_epoch = s.silence_epoch;
            *s = FaultState {
                watch_drop_epoch: epoch,
                silence_epoch,
                ..FaultState::default()
            };
        });
    }

    /// Add `latency` to every API request.
    pub fn set_latency(&self, latency: Duration) {
        let ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        self.state.send_modify(|s| s.latency_ms = ms);
    }

    /// Add an error-rate rule.
    pub fn add_error_rule(&self, rule: ErrorRule) -> Result<(), FaultError> {
        validate_rule(&rule)?;
        self.state.send_modify(|s| s.errors.push(rule));
        Ok(())
    }

    /// Fail the next `times` requests matching `verb` and `resource` with `code` (409, 429,
    /// 500, 503 or 504).
    pub fn fail_next(
        &self,
        verb: &str,
        resource: &str,
        code: u16,
        times: u32,
    ) -> Result<(), FaultError> {
        let fault = CountedFault {
            verb: verb.to_string(),
            resource: resource.to_string(),
            code,
            remaining: times,
        };
        validate_counted(&fault)?;
        self.state.send_modify(|s| s.fail_next.push(fault));
        Ok(())
    }

    /// Remove all error-rate rules.
    pub fn clear_error_rules(&self) {
        self.state.send_modify(|s| s.errors.clear());
    }

    /// Switch the blackhole on or off.
    pub fn set_blackhole(&self, on: bool) {
        self.state.send_modify(|s| s.blackhole = on);
    }

    /// Switch connection refusal on or off.
    pub fn set_refuse_connections(&self, on: bool) {
        self.state.send_modify(|s| s.refuse_connections = on);
    }

    /// End every open watch stream now (clients see the stream close and re-watch).
    pub fn drop_watches(&self) {
        self.state.send_modify(|s| s.watch_drop_epoch += 1);
        (self.on_drop_watches)();
    }

    /// Answer the next `n` watch requests with `410 Expired`.
    pub fn force_gone_on_next_watches(&self, n: u32) {
        self.state.send_modify(|s| s.force_gone_watches = n);
    }

    /// Consume one forced 410, if any is pending; `true` if this watch must get 410.
    pub fn take_forced_gone(&self) -> bool {
        let mut taken = false;
        self.state.send_if_modified(|s| {
            if s.force_gone_watches > 0 {
                s.force_gone_watches -= 1;
                taken = true;
                true
            } else {
                false
            }
        });
        taken
    }

    /// Revoke one bearer token (by value; only its hash is kept).
    pub fn revoke_token(&self, token: &str) {
        let h = kubesim_auth::token_sha256(token);
        self.state.send_modify(|s| {
            s.revoked_token_hashes.insert(h);
        });
    }

    /// Accept a token revoked by [`FaultHandle::revoke_token`] again (and nothing else of
    /// the fault state changes): the end of a partition of one client.
    pub fn restore_token(&self, token: &str) {
        let h = kubesim_auth::token_sha256(token);
        self.state
            .send_if_modified(|s| s.revoked_token_hashes.remove(&h));
    }

    /// Revoke every ServiceAccount token issued up to now.
    pub fn revoke_all_service_account_tokens(&self) {
        let now = chrono::Utc::now().timestamp_millis();
        self.state
            .send_modify(|s| s.sa_tokens_revoked_before_ms = Some(now));
    }

    /// Token verification sees `now + skew` (positive: tokens expire early).
    pub fn set_token_clock_skew(&self, skew_seconds: i64) {
        self.state
            .send_modify(|s| s.token_clock_skew_seconds = skew_seconds);
    }

    /// Send `GOAWAY` on the next `n` connections: each open connection takes one at once,
    /// then newly accepted ones do.
    pub fn goaway_next_connections(&self, n: u32) {
        self.state.send_modify(|s| s.goaway_connections = n);
    }

    /// Consume one pending `goaway`; `true` if this connection must go away.
    pub fn take_goaway(&self) -> bool {
        let mut taken = false;
        self.state.send_if_modified(|s| {
            if s.goaway_connections > 0 {
                s.goaway_connections -= 1;
                taken = true;
                true
            } else {
                false
            }
        });
        taken
    }

    /// Offer only HTTP/1.1 to new connections (ALPN), or both again.
    pub fn set_h1_only(&self, on: bool) {
        self.state.send_modify(|s| s.h1_only = on);
    }

    /// Silence every open connection (on), or close the silenced ones (off).
    pub fn set_silent_connections(&self, on: bool) {
        self.state.send_modify(|s| {
            if on && !s.silent_connections {
                s.silence_epoch += 1;
            }
            s.silent_connections = on;
        });
    }

    /// Answer requests matching `rule` with an endless body (added to the rules).
    pub fn add_endless_body(&self, rule: EndlessBody) {
        self.state.send_modify(|s| s.endless_bodies.push(rule));
    }

    /// The size of the endless body to answer this request with, if a rule matches, and
    /// the counters the body updates.
    pub fn endless_body(
        &self,
        verb: &str,
        resource: Option<(&str, &str)>,
    ) -> Option<(u64, Arc<EndlessCounters>)> {
        let s = self.state.borrow();
        if s.endless_bodies.is_empty() {
            return None;
        }
        let bytes = s
            .endless_bodies
            .iter()
            .find(|r| {
                ErrorRule {
                    verb: Some(r.verb.clone()),
                    resource: Some(r.resource.clone()),
                    rate: 1.0,
                    code: 500,
                }
                .matches(verb, resource)
            })?
            .bytes;
        Some((bytes, self.endless.clone()))
    }

    /// What the endless bodies did so far.
    pub fn endless_stats(&self) -> EndlessStats {
        use std::sync::atomic::Ordering::SeqCst;
        EndlessStats {
            started: self.endless.started.load(SeqCst),
            ended: self.endless.ended.load(SeqCst),
            bytes_sent: self.endless.bytes_sent.load(SeqCst),
        }
    }

    /// Whether `token` was revoked by [`FaultHandle::revoke_token`].
    pub fn is_token_revoked(&self, token: &str) -> bool {
        let s = self.state.borrow();
        !s.revoked_token_hashes.is_empty()
            && s.revoked_token_hashes
                .contains(&kubesim_auth::token_sha256(token))
    }

    /// Apply an HTTP [`FaultRequest`].
    pub fn apply(&self, req: FaultRequest) -> Result<(), FaultError> {
        if let Some(rules) = &req.errors {
            for r in rules {
                validate_rule(r)?;
            }
        }
        for f in &req.fail_next {
            validate_counted(f)?;
        }
        for t in &req.revoke_tokens {
            self.revoke_token(t);
        }
        if req.revoke_all_service_account_tokens {
            self.revoke_all_service_account_tokens();
        }
        self.state.send_modify(|s| {
            if let Some(v) = req.latency_ms {
                s.latency_ms = v;
            }
            if let Some(v) = req.errors.clone() {
                s.errors = v;
            }
            s.fail_next.extend(req.fail_next.iter().cloned());
            if let Some(v) = req.blackhole {
                s.blackhole = v;
            }
            if let Some(v) = req.refuse_connections {
                s.refuse_connections = v;
            }
            if let Some(v) = req.force_gone_watches {
                s.force_gone_watches = v;
            }
            if let Some(v) = req.token_clock_skew_seconds {
                s.token_clock_skew_seconds = v;
            }
            if let Some(v) = req.goaway {
                s.goaway_connections = v;
            }
            if let Some(v) = req.h1_only {
                s.h1_only = v;
            }
            if let Some(v) = req.endless_bodies.clone() {
                s.endless_bodies = v;
            }
        });
        if let Some(v) = req.silent_connection {
            self.set_silent_connections(v);
        }
        if req.drop_watches {
            self.drop_watches();
        }
        Ok(())
    }

    /// The error code to inject for this request, if a rule fires.
    pub fn injected_error(&self, verb: &str, resource: Option<(&str, &str)>) -> Option<u16> {
        if !self.state.borrow().fail_next.is_empty() {
            let mut code = None;
            self.state.send_if_modified(|s| {
                let Some(i) = s
                    .fail_next
                    .iter()
                    .position(|f| f.as_rule().matches(verb, resource))
                else {
                    return false;
                };
                code = Some(s.fail_next[i].code);
                s.fail_next[i].remaining = s.fail_next[i].remaining.saturating_sub(1);
                if s.fail_next[i].remaining == 0 {
                    s.fail_next.remove(i);
                }
                true
            });
            if code.is_some() {
                return code;
            }
        }
        let s = self.state.borrow();
        if s.errors.is_empty() {
            return None;
        }
        s.errors
            .iter()
            .filter(|r| r.matches(verb, resource))
            .find(|r| r.rate >= 1.0 || rand::random::<f64>() < r.rate)
            .map(|r| r.code)
    }
}

fn validate_rule(rule: &ErrorRule) -> Result<(), FaultError> {
    if !(0.0..=1.0).contains(&rule.rate) || rule.rate.is_nan() {
        return Err(FaultError::InvalidRule(format!(
            "rate must be within [0, 1], got {}",
            rule.rate
        )));
    }
    if !matches!(rule.code, 429 | 500 | 503 | 504) {
        return Err(FaultError::InvalidRule(format!(
            "code must be one of 429, 500, 503, 504, got {}",
            rule.code
        )));
    }
    Ok(())
}

fn validate_counted(f: &CountedFault) -> Result<(), FaultError> {
    if !matches!(f.code, 409 | 429 | 500 | 503 | 504) {
        return Err(FaultError::InvalidRule(format!(
            "code must be one of 409, 429, 500, 503, 504, got {}",
            f.code
        )));
    }
    if f.remaining == 0 {
        return Err(FaultError::InvalidRule(
            "a counted fault must fail at least one request".into(),
        ));
    }
    Ok(())
}

/// The `Status` reason kube-apiserver uses for an injected error code.
pub fn reason_for_code(code: u16) -> (&'static str, &'static str) {
    match code {
        409 => (
            "Conflict",
            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again",
        ),
        429 => (
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        ),
        503 => (
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        504 => (
            "Timeout",
            "the server was unable to return a response in the time allotted, but may still be processing the request",
        ),
        _ => (
            "InternalError",
            "an error on the server (\"injected fault\") has prevented the request from succeeding",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn handle() -> (FaultHandle, Arc<AtomicUsize>) {
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        (
            FaultHandle::new(Arc::new(move || {
                n2.fetch_add(1, Ordering::SeqCst);
            })),
            n,
        )
    }

    #[test]
    fn endless_bodies_match_by_verb_and_resource_and_are_set_over_http() {
        let (h, _) = handle();
        assert!(h.endless_body("watch", Some(("namespaces", ""))).is_none());
        let req: FaultRequest = serde_json::from_value(serde_json::json!({
            "endlessBodies": [{"verb": "watch", "resource": "namespaces", "bytes": 1024}]
        }))
        .unwrap();
        h.apply(req).unwrap();
        let (bytes, counters) = h.endless_body("watch", Some(("namespaces", ""))).unwrap();
        assert_eq!(bytes, 1024);
        assert!(h.endless_body("list", Some(("namespaces", ""))).is_none());
        assert!(h.endless_body("watch", Some(("pods", ""))).is_none());
        counters.start();
        counters.sent(10);
        counters.end();
        assert_eq!(
            h.endless_stats(),
            EndlessStats {
                started: 1,
                ended: 1,
                bytes_sent: 10
            }
        );
        h.clear();
        assert!(h.endless_body("watch", Some(("namespaces", ""))).is_none());
    }

    #[test]
    fn rules_match_by_verb_and_resource() {
        let r = ErrorRule {
            verb: Some("list".into()),
            resource: Some("clusterspiffeids.spire.spiffe.io".into()),
            rate: 1.0,
            code: 503,
        };
        assert!(r.matches("list", Some(("clusterspiffeids", "spire.spiffe.io"))));
        assert!(!r.matches("get", Some(("clusterspiffeids", "spire.spiffe.io"))));
        assert!(!r.matches("list", Some(("pods", ""))));
        assert!(!r.matches("list", None));
        let any = ErrorRule {
            verb: None,
            resource: Some("pods".into()),
            rate: 1.0,
            code: 500,
        };
        assert!(any.matches("watch", Some(("pods", ""))));
    }

    #[test]
    fn invalid_rules_are_rejected() {
        let (h, _) = handle();
        let bad_code = ErrorRule {
            verb: None,
            resource: None,
            rate: 1.0,
            code: 404,
        };
        assert!(h.add_error_rule(bad_code).is_err());
        let bad_rate = ErrorRule {
            verb: None,
            resource: None,
            rate: 1.5,
            code: 500,
        };
        assert!(h.add_error_rule(bad_rate).is_err());
        assert!(h.snapshot().errors.is_empty());
    }

    #[test]
    fn injected_error_respects_rate() {
        let (h, _) = handle();
        h.add_error_rule(ErrorRule {
            verb: Some("get".into()),
            resource: None,
            rate: 0.0,
            code: 500,
        })
        .unwrap();
        assert_eq!(h.injected_error("get", Some(("pods", ""))), None);
        h.add_error_rule(ErrorRule {
            verb: Some("get".into()),
            resource: None,
            rate: 1.0,
            code: 429,
        })
        .unwrap();
        assert_eq!(h.injected_error("get", Some(("pods", ""))), Some(429));
        assert_eq!(h.injected_error("list", Some(("pods", ""))), None);
    }

    #[test]
    fn counted_faults_fail_exactly_n_matching_requests_in_order() {
        let (h, _) = handle();
        assert!(h.fail_next("patch", "pods", 404, 1).is_err());
        assert!(h.fail_next("patch", "pods", 409, 0).is_err());
        h.fail_next("patch", "pods", 409, 1).unwrap();
        h.fail_next("patch", "pods", 500, 2).unwrap();
        assert_eq!(h.injected_error("get", Some(("pods", ""))), None);
        assert_eq!(h.injected_error("patch", Some(("secrets", ""))), None);
        assert_eq!(h.injected_error("patch", Some(("pods", ""))), Some(409));
        assert_eq!(h.injected_error("patch", Some(("pods", ""))), Some(500));
        assert_eq!(h.snapshot().fail_next[0].remaining, 1);
        assert_eq!(h.injected_error("patch", Some(("pods", ""))), Some(500));
        assert_eq!(h.injected_error("patch", Some(("pods", ""))), None);
        assert!(h.snapshot().fail_next.is_empty());
        let req: FaultRequest = serde_json::from_str(
            r#"{"failNext": [{"verb": "*", "resource": "pods", "code": 503, "remaining": 1}]}"#,
        )
        .unwrap();
        h.apply(req).unwrap();
        assert_eq!(h.injected_error("list", Some(("pods", ""))), Some(503));
        assert_eq!(h.injected_error("list", Some(("pods", ""))), None);
    }

    #[test]
    fn forced_gone_is_consumed() {
        let (h, _) = handle();
        h.force_gone_on_next_watches(2);
        assert!(h.take_forced_gone());
        assert!(h.take_forced_gone());
        assert!(!h.take_forced_gone());
    }

    #[test]
    fn drop_watches_bumps_epoch_and_calls_hook() {
        let (h, n) = handle();
        let mut rx = h.subscribe();
        rx.mark_unchanged();
        h.drop_watches();
        assert!(rx.has_changed().unwrap());
        assert_eq!(h.snapshot().watch_drop_epoch, 1);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        h.clear();
        assert_eq!(h.snapshot().watch_drop_epoch, 1, "clear keeps the epoch");
    }

    #[test]
    fn revocation_keeps_only_hashes() {
        let (h, _) = handle();
        h.apply(FaultRequest {
            revoke_tokens: vec!["tok-1".into()],
            ..Default::default()
        })
        .unwrap();
        assert!(h.is_token_revoked("tok-1"));
        assert!(!h.is_token_revoked("tok-2"));
        let json = serde_json::to_string(&h.snapshot()).unwrap();
        assert!(!json.contains("tok-1"));
        h.clear();
        assert!(!h.is_token_revoked("tok-1"));
    }

    #[test]
    fn restoring_one_token_keeps_the_other_revocations_and_faults() {
        let (h, _) = handle();
        h.revoke_token("tok-1");
        h.revoke_token("tok-2");
        h.set_latency(Duration::from_millis(7));
        h.restore_token("tok-1");
        assert!(!h.is_token_revoked("tok-1"));
        assert!(h.is_token_revoked("tok-2"));
        assert_eq!(h.snapshot().latency_ms, 7);
    }

    #[test]
    fn request_json_is_camel_case_and_strict() {
        let req: FaultRequest = serde_json::from_str(
            r#"{"latencyMs": 5, "blackhole": true, "errors": [{"verb":"list","rate":1,"code":503}]}"#,
        )
        .unwrap();
        assert_eq!(req.latency_ms, Some(5));
        assert!(serde_json::from_str::<FaultRequest>(r#"{"latency": 5}"#).is_err());
        let (h, _) = handle();
        h.apply(req).unwrap();
        let s = h.snapshot();
        assert!(s.blackhole);
        assert_eq!(s.latency_ms, 5);
        assert_eq!(s.errors.len(), 1);
    }
}
