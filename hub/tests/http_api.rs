//! Hub API behaviour with a fake reviewer: caches, single-flight, modes, bodies, followers.

use axum::Router;
use axum::body::Body;
use futures::future::BoxFuture;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use kleym_hub::http::auth::{
    AccessCheck, AccessDecision, ApiAuth, AuthConfig, AuthMode, Caller, ManualClock, ReviewError,
    Reviewer, TokenReviewStatus,
};
use kleym_hub::http::{ApiMetrics, ApiState, HubReadiness, LeaderState, StaticHubView, router};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

const AUDIENCE: &str = "kleym-hub";

/// A TokenReview/SubjectAccessReview stand-in that counts what it is asked.
#[derive(Debug, Default)]
struct FakeReviewer {
    /// token → (username, audiences) of a valid token.
    valid: Mutex<HashMap<String, (String, Vec<String>)>>,
    /// Usernames allowed by the SubjectAccessReview.
    allowed: Mutex<HashSet<String>>,
    token_calls: AtomicUsize,
    per_token: Mutex<HashMap<String, usize>>,
    access_calls: AtomicUsize,
    fail_tokens: AtomicBool,
    fail_access: AtomicBool,
    /// Panic inside the token review (a bug in a reviewer must not wedge a token).
    panic_tokens: AtomicBool,
    /// Delay of every review, so concurrent requests overlap.
    delay: Mutex<Duration>,
}

impl FakeReviewer {
    fn with_user(self: &Arc<Self>, token: &str, user: &str, allowed: bool) -> Arc<Self> {
        self.valid
            .lock()
            .unwrap()
            .insert(token.into(), (user.into(), vec![AUDIENCE.into()]));
        if allowed {
            self.allowed.lock().unwrap().insert(user.into());
        }
        self.clone()
    }
    fn revoke(&self, token: &str) {
        self.valid.lock().unwrap().remove(token);
    }
    fn calls_for(&self, token: &str) -> usize {
        self.per_token
            .lock()
            .unwrap()
            .get(token)
            .copied()
            .unwrap_or(0)
    }
    fn tokens(&self) -> usize {
        self.token_calls.load(Ordering::SeqCst)
    }
    fn accesses(&self) -> usize {
        self.access_calls.load(Ordering::SeqCst)
    }
}

impl Reviewer for FakeReviewer {
    fn review_token<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<TokenReviewStatus, ReviewError>> {
        Box::pin(async move {
            self.token_calls.fetch_add(1, Ordering::SeqCst);
            *self
                .per_token
                .lock()
                .unwrap()
                .entry(token.to_string())
                .or_default() += 1;
            let delay = *self.delay.lock().unwrap();
            tokio::time::sleep(delay).await;
            assert_eq!(audience, AUDIENCE, "the configured audience is asked for");
            assert!(
                !self.panic_tokens.load(Ordering::SeqCst),
                "reviewer panics (on purpose)"
            );
            if self.fail_tokens.load(Ordering::SeqCst) {
                return Err(ReviewError::Api {
                    kind: "TokenReview",
                    code: 500,
                    message: "etcd is on fire".into(),
                });
            }
            Ok(match self.valid.lock().unwrap().get(token) {
                Some((user, auds)) => TokenReviewStatus {
                    authenticated: true,
                    user: Caller {
                        username: user.clone(),
                        groups: vec!["system:serviceaccounts".into()],
                        ..Default::default()
                    },
                    audiences: auds.clone(),
                    error: String::new(),
                },
                None => TokenReviewStatus {
                    authenticated: false,
                    error: "invalid bearer token".into(),
                    ..Default::default()
                },
            })
        })
    }

    fn review_access<'a>(
        &'a self,
        caller: &'a Caller,
        check: &'a AccessCheck,
    ) -> BoxFuture<'a, Result<AccessDecision, ReviewError>> {
        Box::pin(async move {
            self.access_calls.fetch_add(1, Ordering::SeqCst);
            let delay = *self.delay.lock().unwrap();
            tokio::time::sleep(delay).await;
            assert_eq!(check, &AccessCheck::default());
            if self.fail_access.load(Ordering::SeqCst) {
                return Err(ReviewError::Transport {
                    kind: "SubjectAccessReview",
                    message: "connection refused".into(),
                });
            }
            Ok(if self.allowed.lock().unwrap().contains(&caller.username) {
                AccessDecision::Allowed
            } else {
                AccessDecision::Denied("no RBAC policy matched".into())
            })
        })
    }
}

struct Harness {
    app: Router,
    reviewer: Arc<FakeReviewer>,
    clock: Arc<ManualClock>,
    view: Arc<StaticHubView>,
    registry: Arc<Registry>,
}

fn harness_with(mode: AuthMode, tweak: impl FnOnce(&mut AuthConfig)) -> Harness {
    let reviewer = Arc::new(FakeReviewer::default());
    let clock = Arc::new(ManualClock::new());
    let view = Arc::new(StaticHubView::leader());
    view.set_report(json!({"findings": [{"kind": "IdentityCollision"}]}));
    view.set_cluster(
        "fleet",
        "spoke-1",
        json!({"name": "spoke-1", "ready": true}),
    );
    let mut registry = Registry::default();
    let metrics = ApiMetrics::register(&mut registry);
    let mut config = AuthConfig::new(mode, AUDIENCE);
    tweak(&mut config);
    let auth = ApiAuth::with_clock(config, reviewer.clone(), metrics.clone(), clock.clone());
    let registry = Arc::new(registry);
    let app = router(ApiState {
        view: view.clone(),
        registry: registry.clone(),
        auth,
        metrics,
    });
    Harness {
        app,
        reviewer,
        clock,
        view,
        registry,
    }
}

fn harness(mode: AuthMode) -> Harness {
    harness_with(mode, |_| {})
}

struct Resp {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

async fn get(app: &Router, path: &str, token: Option<&str>) -> Resp {
    let mut req = Request::get(path);
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Resp {
        status,
        headers,
        body,
    }
}

fn metrics_text(h: &Harness) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, &h.registry).unwrap();
    s
}

/// The value of the series whose line starts with `prefix` (0 when absent).
fn metric(h: &Harness, prefix: &str) -> f64 {
    metrics_text(h)
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn flood_of_distinct_bad_tokens_costs_at_most_one_review_each() {
    let h = harness(AuthMode::Enforce);
    let n = 200;
    let flood = |app: Router| async move {
        let reqs = (0..n).map(|i| {
            let app = app.clone();
            async move { get(&app, "/v1/report", Some(&format!("bad-{i}"))).await }
        });
        futures::future::join_all(reqs).await
    };
    for r in flood(h.app.clone()).await {
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(h.reviewer.tokens(), n);
    assert!((0..n).all(|i| h.reviewer.calls_for(&format!("bad-{i}")) == 1));
    // The same flood again within the negative TTL: answered from the negative cache.
    for r in flood(h.app.clone()).await {
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(h.reviewer.tokens(), n);
    assert_eq!(
        h.reviewer.accesses(),
        0,
        "no SubjectAccessReview for a bad token"
    );
    assert_eq!(
        metric(
            &h,
            "kleym_hub_api_auth_cache_hits_total{cache=\"token_negative\"}"
        ),
        n as f64
    );
    // Past the negative TTL a bad token is asked about again (once).
    h.clock.advance(Duration::from_secs(11));
    get(&h.app, "/v1/report", Some("bad-0")).await;
    get(&h.app, "/v1/report", Some("bad-0")).await;
    assert_eq!(h.reviewer.calls_for("bad-0"), 2);
}

#[tokio::test]
async fn a_burst_of_one_bad_token_is_one_review() {
    let h = harness(AuthMode::Enforce);
    *h.reviewer.delay.lock().unwrap() = Duration::from_millis(20);
    let reqs = (0..100).map(|_| get(&h.app, "/v1/report", Some("bad")));
    let out = futures::future::join_all(reqs).await;
    assert!(out.iter().all(|r| r.status == StatusCode::UNAUTHORIZED));
    assert_eq!(h.reviewer.tokens(), 1);
    // All 100 started before the review finished: they shared it (single-flight).
    assert!(
        metric(
            &h,
            "kleym_hub_api_auth_cache_hits_total{cache=\"token_inflight\"}"
        ) > 0.0
    );
}

#[tokio::test]
async fn a_good_token_is_reviewed_once_per_ttl() {
    let h = harness(AuthMode::Enforce);
    h.reviewer
        .with_user("good", "system:serviceaccount:ops:reader", true);
    *h.reviewer.delay.lock().unwrap() = Duration::from_millis(10);
    let burst = (0..50).map(|_| get(&h.app, "/v1/report", Some("good")));
    for r in futures::future::join_all(burst).await {
        assert_eq!(r.status, StatusCode::OK);
    }
    assert_eq!(h.reviewer.tokens(), 1);
    assert_eq!(
        h.reviewer.accesses(),
        1,
        "the burst shares one SubjectAccessReview too"
    );
    h.clock.advance(Duration::from_secs(119));
    assert_eq!(
        get(&h.app, "/v1/report", Some("good")).await.status,
        StatusCode::OK
    );
    assert_eq!(h.reviewer.tokens(), 1, "still inside the positive TTL");
    h.clock.advance(Duration::from_secs(2));
    assert_eq!(
        get(&h.app, "/v1/report", Some("good")).await.status,
        StatusCode::OK
    );
    assert_eq!(h.reviewer.tokens(), 2, "reviewed again after the TTL");
    // A revoked token is accepted until the positive TTL ends, then refused.
    h.reviewer.revoke("good");
    assert_eq!(
        get(&h.app, "/v1/report", Some("good")).await.status,
        StatusCode::OK
    );
    h.clock.advance(Duration::from_secs(121));
    assert_eq!(
        get(&h.app, "/v1/report", Some("good")).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(h.reviewer.tokens(), 3);
}

fn jwt_with_exp(exp: u64) -> String {
    use base64::Engine;
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.c2ln",
        e.encode(br#"{"alg":"RS256","kid":"k"}"#),
        e.encode(json!({"exp": exp, "sub": "system:serviceaccount:ops:reader"}).to_string())
    )
}

#[tokio::test]
async fn positive_cache_never_outlives_the_token_expiry() {
    let h = harness(AuthMode::Enforce);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = jwt_with_exp(now + 30);
    h.reviewer
        .with_user(&token, "system:serviceaccount:ops:reader", true);
    assert_eq!(
        get(&h.app, "/v1/report", Some(&token)).await.status,
        StatusCode::OK
    );
    h.clock.advance(Duration::from_secs(20));
    get(&h.app, "/v1/report", Some(&token)).await;
    assert_eq!(h.reviewer.tokens(), 1);
    h.clock.advance(Duration::from_secs(15)); // past exp, well inside the 120 s TTL
    get(&h.app, "/v1/report", Some(&token)).await;
    assert_eq!(h.reviewer.tokens(), 2);
}

#[tokio::test]
async fn transient_errors_are_not_cached_and_answer_503() {
    let h = harness(AuthMode::Enforce);
    h.reviewer
        .with_user("good", "system:serviceaccount:ops:reader", true);
    h.reviewer.fail_tokens.store(true, Ordering::SeqCst);
    for expected_calls in 1..=3 {
        let r = get(&h.app, "/v1/report", Some("good")).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers["retry-after"], "1");
        assert_eq!(r.json()["reason"], "ServiceUnavailable");
        assert!(
            r.json()["message"]
                .as_str()
                .unwrap()
                .contains("retry later")
        );
        assert_eq!(h.reviewer.tokens(), expected_calls);
    }
    h.reviewer.fail_tokens.store(false, Ordering::SeqCst);
    assert_eq!(
        get(&h.app, "/v1/report", Some("good")).await.status,
        StatusCode::OK
    );
    assert_eq!(h.reviewer.tokens(), 4);
    // Access review failures are not cached either.
    h.reviewer.fail_access.store(true, Ordering::SeqCst);
    h.clock.advance(Duration::from_secs(11)); // the access decision expires
    for _ in 0..2 {
        let r = get(&h.app, "/v1/report", Some("good")).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    let before = h.reviewer.accesses();
    h.reviewer.fail_access.store(false, Ordering::SeqCst);
    assert_eq!(
        get(&h.app, "/v1/report", Some("good")).await.status,
        StatusCode::OK
    );
    assert_eq!(h.reviewer.accesses(), before + 1);
    assert!(
        metric(
            &h,
            "kleym_hub_api_auth_reviews_total{kind=\"token\",result=\"error\"}"
        ) >= 3.0
    );
}

#[tokio::test]
async fn access_decisions_are_cached_briefly() {
    let h = harness(AuthMode::Enforce);
    h.reviewer
        .with_user("good", "system:serviceaccount:ops:reader", true);
    for _ in 0..5 {
        assert_eq!(
            get(&h.app, "/v1/clusters", Some("good")).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(h.reviewer.accesses(), 1);
    h.clock.advance(Duration::from_secs(11));
    get(&h.app, "/v1/clusters", Some("good")).await;
    assert_eq!(h.reviewer.accesses(), 2);
}

#[tokio::test]
async fn enforce_401_and_403_bodies() {
    let h = harness(AuthMode::Enforce);
    h.reviewer
        .with_user("no-rbac", "system:serviceaccount:ops:nobody", false);

    let r = get(&h.app, "/v1/report", None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(
        r.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    assert_eq!(r.headers["content-type"], "application/json");
    let b = r.json();
    assert_eq!(b["code"], 401);
    assert_eq!(b["reason"], "Unauthorized");
    assert!(
        b["message"].as_str().unwrap().contains("no bearer token"),
        "{b}"
    );

    let r = get(&h.app, "/v1/report", Some("forged")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(
        r.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    let msg = r.json()["message"].as_str().unwrap().to_string();
    assert!(msg.contains("rejected") && msg.contains(AUDIENCE), "{msg}");
    assert!(!msg.contains("forged"), "the token is never echoed");

    let r = get(&h.app, "/v1/clusters/fleet/spoke-1", Some("no-rbac")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        r.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    let b = r.json();
    assert_eq!(b["code"], 403);
    assert_eq!(b["reason"], "Forbidden");
    let msg = b["message"].as_str().unwrap();
    assert!(msg.contains("system:serviceaccount:ops:nobody"), "{msg}");
    assert!(msg.contains("get fleetidentityreports.kleym.io"), "{msg}");

    let before = h.reviewer.tokens();
    let raw = Request::get("/v1/report")
        .header("authorization", "Basic dXNlcjpwdw==")
        .body(Body::empty())
        .unwrap();
    let r = h.app.clone().oneshot(raw).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        h.reviewer.tokens(),
        before,
        "a non-bearer credential is not reviewed"
    );
}

#[tokio::test]
async fn wrong_audience_is_a_cached_401() {
    let h = harness(AuthMode::Enforce);
    h.reviewer.valid.lock().unwrap().insert(
        "other-aud".into(),
        (
            "system:serviceaccount:ops:reader".into(),
            vec!["https://kubernetes.default.svc".into()],
        ),
    );
    h.reviewer
        .allowed
        .lock()
        .unwrap()
        .insert("system:serviceaccount:ops:reader".into());
    for _ in 0..3 {
        let r = get(&h.app, "/v1/report", Some("other-aud")).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert!(
            r.json()["message"]
                .as_str()
                .unwrap()
                .contains("not valid for audience")
        );
    }
    assert_eq!(h.reviewer.tokens(), 1);
    assert_eq!(h.reviewer.accesses(), 0);
    assert_eq!(
        metric(&h, "kleym_hub_api_authn_total{outcome=\"wrong_audience\"}"),
        3.0
    );
}

#[tokio::test]
async fn permissive_serves_failures_with_a_warning() {
    let h = harness(AuthMode::Permissive);
    h.reviewer
        .with_user("good", "system:serviceaccount:ops:reader", true);
    h.reviewer
        .with_user("no-rbac", "system:serviceaccount:ops:nobody", false);

    let ok = get(&h.app, "/v1/report", Some("good")).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert!(!ok.headers.contains_key("warning"));

    for (token, code) in [
        (None, "401"),
        (Some("bad"), "401"),
        (Some("no-rbac"), "403"),
    ] {
        let r = get(&h.app, "/v1/report", token).await;
        assert_eq!(r.status, StatusCode::OK, "{token:?}");
        assert_eq!(r.json()["findings"][0]["kind"], "IdentityCollision");
        let w = r.headers["warning"].to_str().unwrap();
        assert!(w.starts_with("299 ") && w.contains(code), "{w}");
    }
    // Permissive still verifies: every token was reviewed.
    assert_eq!(h.reviewer.calls_for("bad"), 1);
    assert_eq!(h.reviewer.calls_for("no-rbac"), 1);
    assert_eq!(
        metric(&h, "kleym_hub_api_auth_permissive_allowed_total"),
        3.0
    );
    // And a transient failure is served too.
    h.reviewer.fail_tokens.store(true, Ordering::SeqCst);
    let r = get(&h.app, "/v1/report", Some("fresh")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.headers["warning"].to_str().unwrap().contains("503"));
}

#[tokio::test]
async fn off_serves_everything_without_reviews() {
    let h = harness(AuthMode::Off);
    for token in [None, Some("bad")] {
        let r = get(&h.app, "/v1/clusters", token).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["count"], 1);
        assert!(!r.headers.contains_key("warning"));
    }
    assert_eq!(h.reviewer.tokens() + h.reviewer.accesses(), 0);
    assert_eq!(
        metric(&h, "kleym_hub_api_authn_total{outcome=\"skipped\"}"),
        2.0
    );
}

/// A follower serves `/v1/*` like the leader (from the published status), with the same
/// authentication and authorization: no token is 401, an unauthorized caller 403, and a
/// follower that cannot answer yet says so with 503 `NotPublished`, after the checks.
#[tokio::test]
async fn followers_serve_v1_behind_the_same_authentication_and_authorization() {
    let h = harness(AuthMode::Enforce);
    h.reviewer
        .with_user("good", "system:serviceaccount:ops:reader", true);
    h.reviewer
        .with_user("nosy", "system:serviceaccount:ops:nosy", false);
    h.view.set_leader(LeaderState {
        is_leader: false,
        leader_identity: Some("kleym-hub-7d9f-abcde".into()),
    });
    for path in ["/v1/report", "/v1/clusters", "/v1/clusters/fleet/spoke-1"] {
        assert_eq!(
            get(&h.app, path, None).await.status,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
        assert_eq!(
            get(&h.app, path, Some("nosy")).await.status,
            StatusCode::FORBIDDEN,
            "{path}"
        );
    }
    let r = get(&h.app, "/v1/report", Some("good")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), kleym_hub::http::HubView::report(h.view.as_ref()));
    // Not able to answer yet: 503 NotPublished, but only to a caller who passed the checks.
    h.view
        .set_unavailable(Some("no FleetIdentityReport has been published yet".into()));
    let r = get(&h.app, "/v1/report", Some("good")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.json()["reason"], "NotPublished");
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(
        get(&h.app, "/v1/report", Some("nosy")).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get(&h.app, "/v1/report", None).await.status,
        StatusCode::UNAUTHORIZED
    );
    // Probes and metrics are served by followers too.
    assert_eq!(get(&h.app, "/healthz", None).await.status, StatusCode::OK);
    assert_eq!(get(&h.app, "/readyz", None).await.status, StatusCode::OK);
}

#[tokio::test]
async fn readiness_follows_inventory_and_leadership() {
    let h = harness(AuthMode::Enforce);
    assert_eq!(get(&h.app, "/readyz", None).await.status, StatusCode::OK);
    h.view.set_ready(HubReadiness {
        inventory_synced: false,
        leadership_known: true,
        ..HubReadiness::default()
    });
    let r = get(&h.app, "/readyz", None).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.json()["message"].as_str().unwrap().contains("inventory"));
    h.view.set_ready(HubReadiness {
        inventory_synced: true,
        leadership_known: false,
        ..HubReadiness::default()
    });
    let r = get(&h.app, "/readyz", None).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.json()["message"].as_str().unwrap().contains("leadership"));
    // A pinned ClusterProfile version the hub cluster does not serve is named.
    h.view.set_ready(HubReadiness {
        inventory_synced: true,
        leadership_known: true,
        inventory_error: Some("--clusterprofile-version=v1alpha2 but ...".into()),
        ..HubReadiness::default()
    });
    let r = get(&h.app, "/readyz", None).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let message = r.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("--clusterprofile-version=v1alpha2"),
        "{message}"
    );
    // `?verbose` lists every check and the version read, ready or not.
    h.view.set_ready(HubReadiness {
        inventory_synced: true,
        leadership_known: true,
        clusterprofile_version: Some("multicluster.x-k8s.io/v1alpha2 (pinned)".into()),
        ..HubReadiness::default()
    });
    let r = get(&h.app, "/readyz?verbose", None).await;
    assert_eq!(r.status, StatusCode::OK);
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert!(body.contains("[+]inventory"), "{body}");
    assert!(
        body.contains("clusterprofile version multicluster.x-k8s.io/v1alpha2 (pinned)"),
        "{body}"
    );
    assert_eq!(get(&h.app, "/healthz", None).await.status, StatusCode::OK);
}

#[tokio::test]
async fn routes_bodies_and_request_metrics() {
    let h = harness(AuthMode::Enforce);
    h.reviewer
        .with_user("good", "system:serviceaccount:ops:reader", true);
    let r = get(&h.app, "/v1/clusters/fleet/spoke-1", Some("good")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["name"], "spoke-1");
    let r = get(&h.app, "/v1/clusters/fleet/nope", Some("good")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let b = r.json();
    assert_eq!(b["reason"], "NotFound");
    assert!(b["message"].as_str().unwrap().contains("fleet/nope"));
    assert_eq!(b["cluster"], json!({"namespace": "fleet", "name": "nope"}));
    let r = get(&h.app, "/v1/clusters", Some("good")).await;
    assert_eq!(r.json()["items"][0]["name"], "spoke-1");
    assert_eq!(
        get(&h.app, "/nope", None).await.status,
        StatusCode::NOT_FOUND
    );

    let m = get(&h.app, "/metrics", None).await;
    assert_eq!(m.status, StatusCode::OK);
    let text = String::from_utf8(m.body).unwrap();
    for line in [
        "kleym_hub_api_requests_total{route=\"/v1/clusters/{namespace}/{name}\",code=\"200\"} 1",
        "kleym_hub_api_requests_total{route=\"/v1/clusters/{namespace}/{name}\",code=\"404\"} 1",
        "kleym_hub_api_requests_total{route=\"/v1/clusters\",code=\"200\"} 1",
        "kleym_hub_api_requests_total{route=\"other\",code=\"404\"} 1",
        "kleym_hub_api_authn_total{outcome=\"authenticated\"} 3",
        "kleym_hub_api_authz_total{outcome=\"allowed\"} 3",
        "kleym_hub_api_auth_cache_hits_total{cache=\"token_positive\"} 2",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[tokio::test]
async fn caches_stay_bounded_under_a_flood() {
    let h = harness_with(AuthMode::Enforce, |c| c.cache_capacity = 16);
    for i in 0..100 {
        get(&h.app, "/v1/report", Some(&format!("bad-{i}"))).await;
    }
    assert_eq!(h.reviewer.tokens(), 100);
    // The most recent rejections are still cached; the oldest were evicted.
    get(&h.app, "/v1/report", Some("bad-99")).await;
    assert_eq!(h.reviewer.tokens(), 100);
    get(&h.app, "/v1/report", Some("bad-0")).await;
    assert_eq!(h.reviewer.tokens(), 101);
}

#[tokio::test]
async fn review_timeouts_are_transient() {
    let h = harness_with(AuthMode::Enforce, |c| {
        c.review_timeout = Duration::from_millis(20)
    });
    h.reviewer
        .with_user("good", "system:serviceaccount:ops:reader", true);
    *h.reviewer.delay.lock().unwrap() = Duration::from_secs(30);
    let r = get(&h.app, "/v1/report", Some("good")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.json()["message"].as_str().unwrap().contains("timed out"));
    *h.reviewer.delay.lock().unwrap() = Duration::ZERO;
    assert_eq!(
        get(&h.app, "/v1/report", Some("good")).await.status,
        StatusCode::OK
    );
    assert_eq!(h.reviewer.tokens(), 2);
}

#[tokio::test]
async fn a_panicking_review_does_not_wedge_the_token() {
    let h = harness(AuthMode::Enforce);
    h.reviewer
        .with_user("good", "system:serviceaccount:ops:reader", true);
    h.reviewer.panic_tokens.store(true, Ordering::SeqCst);
    let r = get(&h.app, "/v1/report", Some("good")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    h.reviewer.panic_tokens.store(false, Ordering::SeqCst);
    assert_eq!(
        get(&h.app, "/v1/report", Some("good")).await.status,
        StatusCode::OK
    );
    assert_eq!(h.reviewer.tokens(), 2);
}

/// Collects log output in memory.
#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn tokens_never_reach_the_logs() {
    let logs = LogBuf::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let secret_good = "good-SECRET-token-value";
    let secret_bad = "bad-SECRET-token-value";
    let h = harness(AuthMode::Permissive);
    h.reviewer
        .with_user(secret_good, "system:serviceaccount:ops:nobody", false);
    get(&h.app, "/v1/report", Some(secret_good)).await; // 403, served
    get(&h.app, "/v1/report", Some(secret_bad)).await; // 401, served
    h.reviewer.fail_tokens.store(true, Ordering::SeqCst);
    get(&h.app, "/v1/report", Some("fresh-SECRET-token")).await; // 503, served

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("permissive"),
        "violations are logged:\n{text}"
    );
    assert!(
        !text.contains("SECRET"),
        "a token leaked into the logs:\n{text}"
    );
    let prefix = kleym_hub::http::auth::TokenHash::of(secret_bad).prefix();
    assert!(
        text.contains(&prefix),
        "the hash prefix identifies the token:\n{text}"
    );
}

/// Through a replica that runs the spoke, explain answers from that spoke reconciler's
/// caches: until they synced, 503 `SpokeNotSynced` says so, and nothing is read from the
/// spoke (its client points at a closed port: a read would answer 502 instead).
#[tokio::test]
async fn explain_waits_for_the_spoke_caches_with_a_503() {
    let h = harness(AuthMode::Off);
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let context = Arc::new(kleym_spoke::reconciler::context::Context::new(
        client.clone(),
        kleym_spoke::reconciler::SpokeConfig::new("td"),
        Arc::new(kleym_spoke::reconciler::SpokeMetrics::default()),
    ));
    h.view.set_spoke_caches(
        "fleet",
        "spoke-1",
        kleym_hub::explain_source::HubCaches {
            client,
            context,
            cluster: "fleet/spoke-1".into(),
        },
    );
    for path in [
        "/v1/clusters/fleet/spoke-1/explain/binding/serving/b?trustDomain=td",
        "/v1/clusters/fleet/spoke-1/explain/pod/serving/p?trustDomain=td",
    ] {
        let r = get(&h.app, path, None).await;
        let body = r.json();
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["reason"], "SpokeNotSynced", "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("caches of this spoke have not synced"),
            "{body}"
        );
    }
}
