//! The hub API against kubesim: real ServiceAccount tokens from TokenRequest, verified by a
//! real TokenReview and authorized by a real SubjectAccessReview in the hub cluster.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kleym_hub::http::auth::{ApiAuth, AuthConfig, AuthMode, KubeReviewer, ManualClock};
use kleym_hub::http::{ApiMetrics, ApiState, Registry, StaticHubView, router, serve};
use kube::api::{Api, DeleteParams, PostParams};
use kubesim::{ClusterHandle, ErrorRule, Kubesim, KubesimOptions};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const AUDIENCE: &str = "kleym-hub";

async fn create<K>(api: &Api<K>, obj: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let obj: K = serde_json::from_value(obj).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// Namespace `ops` with ServiceAccounts `reader` (may `get fleetidentityreports`), `nobody`
/// (no RBAC) and `kleym-hub` (the hub's identity: `system:auth-delegator` only).
async fn setup(hub: &ClusterHandle) -> kube::Client {
    let admin = hub.kube_client().await.unwrap();
    create(
        &Api::<Namespace>::all(admin.clone()),
        json!({"metadata": {"name": "ops"}}),
    )
    .await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "ops");
    for name in ["reader", "nobody", "kleym-hub", "temp"] {
        create(&sas, json!({"metadata": {"name": name}})).await;
    }
    create(
        &Api::<ClusterRole>::all(admin.clone()),
        json!({
            "metadata": {"name": "kleym-report-reader"},
            "rules": [{"apiGroups": ["kleym.io"], "resources": ["fleetidentityreports"], "verbs": ["get"]}],
        }),
    )
    .await;
    let crbs = Api::<ClusterRoleBinding>::all(admin.clone());
    for (name, role, sa) in [
        ("kleym-report-reader", "kleym-report-reader", "reader"),
        ("kleym-report-temp", "kleym-report-reader", "temp"),
        (
            "kleym-hub-auth-delegator",
            "system:auth-delegator",
            "kleym-hub",
        ),
    ] {
        create(
            &crbs,
            json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "ops"}],
            }),
        )
        .await;
    }
    admin
}

/// A token for `ops/<sa>` from the TokenRequest API.
async fn token(admin: &kube::Client, sa: &str, audiences: &[&str]) -> String {
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences.iter().map(|a| (*a).to_string()).collect(),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), "ops")
        .create_token_request(sa, &PostParams::default(), &req)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

struct HubApi {
    addr: SocketAddr,
    clock: Arc<ManualClock>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Serve the hub API (plain HTTP on loopback) reviewing against `hub` as the `kleym-hub`
/// ServiceAccount.
async fn start_api(hub: &ClusterHandle, admin: &kube::Client, mode: AuthMode) -> HubApi {
    let hub_token = token(admin, "kleym-hub", &[]).await;
    let hub_client = hub.client_for_token(&hub_token).await.unwrap();
    let mut registry = Registry::default();
    let metrics = ApiMetrics::register(&mut registry);
    let clock = Arc::new(ManualClock::new());
    let auth = ApiAuth::with_clock(
        AuthConfig::new(mode, AUDIENCE),
        Arc::new(KubeReviewer::new(hub_client)),
        metrics.clone(),
        clock.clone(),
    );
    let view = Arc::new(StaticHubView::leader());
    view.set_report(json!({"findings": [{"kind": "DuplicateSPIFFEID"}]}));
    let app = router(ApiState {
        view,
        registry: Arc::new(registry),
        auth,
        metrics,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, app, None, async {
        let _ = stopped.await;
    }));
    HubApi {
        addr,
        clock,
        _stop: stop,
    }
}

impl HubApi {
    async fn get(&self, path: &str, token: Option<&str>) -> (u16, http::HeaderMap, Value) {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = http::Request::get(path).header("host", "hub");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = send
            .send_request(req.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            headers,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        )
    }

    /// TokenReviews that got an answer from the apiserver.
    async fn token_reviews(&self) -> f64 {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get("/metrics").header("host", "hub");
        let resp = send
            .send_request(req.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&body)
            .lines()
            .find(|l| {
                l.starts_with("kleym_hub_api_auth_reviews_total{kind=\"token\",result=\"ok\"}")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

#[tokio::test]
async fn enforce_against_kubesim() {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .unwrap();
    let hub = sim.cluster("hub").unwrap();
    let admin = setup(&hub).await;
    let api = start_api(&hub, &admin, AuthMode::Enforce).await;

    // The right audience and RBAC: served.
    let reader = token(&admin, "reader", &[AUDIENCE]).await;
    let (code, _, body) = api.get("/v1/report", Some(&reader)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["findings"][0]["kind"], "DuplicateSPIFFEID");

    // A token for the apiserver's own audience (the default of TokenRequest): 401.
    let wrong_aud = token(&admin, "reader", &[]).await;
    let (code, headers, body) = api.get("/v1/report", Some(&wrong_aud)).await;
    assert_eq!(code, 401, "{body}");
    assert!(
        headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    assert!(
        body["message"].as_str().unwrap().contains(AUDIENCE),
        "{body}"
    );

    // Authenticated but without RBAC: 403 naming the ServiceAccount.
    let nobody = token(&admin, "nobody", &[AUDIENCE]).await;
    let (code, _, body) = api.get("/v1/clusters", Some(&nobody)).await;
    assert_eq!(code, 403, "{body}");
    let msg = body["message"].as_str().unwrap();
    assert!(msg.contains("system:serviceaccount:ops:nobody"), "{msg}");
    assert!(msg.contains("fleetidentityreports"), "{msg}");

    // Garbage: 401.
    let (code, _, _) = api.get("/v1/report", Some("not-a-token")).await;
    assert_eq!(code, 401);
    let (code, _, _) = api.get("/v1/report", None).await;
    assert_eq!(code, 401);
}

#[tokio::test]
async fn revoked_tokens_are_refused_after_the_positive_ttl() {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .unwrap();
    let hub = sim.cluster("hub").unwrap();
    let admin = setup(&hub).await;
    let api = start_api(&hub, &admin, AuthMode::Enforce).await;

    let reader = token(&admin, "reader", &[AUDIENCE]).await;
    assert_eq!(api.get("/v1/report", Some(&reader)).await.0, 200);
    assert_eq!(api.token_reviews().await, 1.0);
    hub.faults().revoke_token(&reader);
    // Documented: a positive review is trusted for up to the positive TTL (120 s default).
    assert_eq!(api.get("/v1/report", Some(&reader)).await.0, 200);
    assert_eq!(api.token_reviews().await, 1.0);
    api.clock.advance(Duration::from_secs(121));
    assert_eq!(api.get("/v1/report", Some(&reader)).await.0, 401);
    assert_eq!(api.token_reviews().await, 2.0);
    // The rejection is cached: no further TokenReview within the negative TTL.
    assert_eq!(api.get("/v1/report", Some(&reader)).await.0, 401);
    assert_eq!(api.token_reviews().await, 2.0);

    // Deleting the ServiceAccount invalidates its tokens (as in Kubernetes).
    let temp = token(&admin, "temp", &[AUDIENCE]).await;
    assert_eq!(api.get("/v1/report", Some(&temp)).await.0, 200);
    Api::<ServiceAccount>::namespaced(admin.clone(), "ops")
        .delete("temp", &DeleteParams::default())
        .await
        .unwrap();
    api.clock.advance(Duration::from_secs(121));
    assert_eq!(api.get("/v1/report", Some(&temp)).await.0, 401);
}

#[tokio::test]
async fn apiserver_errors_are_503_and_not_cached() {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .unwrap();
    let hub = sim.cluster("hub").unwrap();
    let admin = setup(&hub).await;
    let api = start_api(&hub, &admin, AuthMode::Enforce).await;
    let reader = token(&admin, "reader", &[AUDIENCE]).await;

    hub.faults()
        .add_error_rule(ErrorRule {
            verb: Some("create".into()),
            resource: Some("tokenreviews".into()),
            rate: 1.0,
            code: 500,
        })
        .unwrap();
    for _ in 0..2 {
        let (code, headers, body) = api.get("/v1/report", Some(&reader)).await;
        assert_eq!(code, 503, "{body}");
        assert_eq!(headers["retry-after"], "1");
    }
    hub.faults().clear_error_rules();
    let (code, _, body) = api.get("/v1/report", Some(&reader)).await;
    assert_eq!(code, 200, "the failure was not cached: {body}");
}

#[tokio::test]
async fn hub_without_review_rbac_fails_closed_with_503() {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .unwrap();
    let hub = sim.cluster("hub").unwrap();
    let admin = setup(&hub).await;
    // The hub runs as `nobody`, which may not create TokenReviews.
    let nobody = token(&admin, "nobody", &[]).await;
    let client = hub.client_for_token(&nobody).await.unwrap();
    let mut registry = Registry::default();
    let metrics = ApiMetrics::register(&mut registry);
    let app = router(ApiState {
        view: Arc::new(StaticHubView::leader()),
        registry: Arc::new(registry),
        auth: ApiAuth::new(
            AuthConfig::new(AuthMode::Enforce, AUDIENCE),
            Arc::new(KubeReviewer::new(client)),
            metrics.clone(),
        ),
        metrics,
    });
    let reader = token(&admin, "reader", &[AUDIENCE]).await;
    let req = http::Request::get("/v1/report")
        .header("authorization", format!("Bearer {reader}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(app, req).await.unwrap();
    assert_eq!(resp.status(), 503);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(body["message"].as_str().unwrap().contains("403"), "{body}");
}

#[tokio::test]
async fn permissive_against_kubesim() {
    let sim = Kubesim::start(&["hub"], KubesimOptions::default())
        .await
        .unwrap();
    let hub = sim.cluster("hub").unwrap();
    let admin = setup(&hub).await;
    let api = start_api(&hub, &admin, AuthMode::Permissive).await;
    let nobody = token(&admin, "nobody", &[AUDIENCE]).await;
    let (code, headers, _) = api.get("/v1/report", Some(&nobody)).await;
    assert_eq!(code, 200);
    assert!(headers["warning"].to_str().unwrap().contains("403"));
    let (code, headers, _) = api.get("/v1/report", Some("junk")).await;
    assert_eq!(code, 200);
    assert!(headers["warning"].to_str().unwrap().contains("401"));
    assert_eq!(api.token_reviews().await, 2.0, "permissive still verifies");
}
