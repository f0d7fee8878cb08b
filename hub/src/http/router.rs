//! Routes: `/healthz`, `/readyz`, `/metrics`, and the authenticated `/v1/*`.

use crate::http::auth::{ApiAuth, AuthDecision, AuthFailure, FailureKind};
use crate::http::metrics::{ApiMetrics, metrics_response_blocking};
use crate::http::view::{EncodeError, HubView};
use axum::Router;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use std::sync::Arc;

/// `WWW-Authenticate` realm.
const REALM: &str = "kleym-hub";

/// Everything the routes share.
#[derive(Clone)]
pub struct ApiState {
    /// What is served.
    pub view: Arc<dyn HubView>,
    /// Rendered by `/metrics` (the hub's whole registry, including [`ApiMetrics`]).
    pub registry: Arc<Registry>,
    /// `/v1/*` authentication and authorization.
    pub auth: ApiAuth,
    /// Request counters.
    pub metrics: ApiMetrics,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// The hub API router.
pub fn router(state: ApiState) -> Router {
    let v1 = Router::new()
        .route("/v1/report", get(report))
        .route("/v1/clusters", get(clusters))
        .route("/v1/clusters/{namespace}/{name}", get(cluster))
        .route(
            "/v1/clusters/{namespace}/{name}/explain/pod/{ns}/{object}",
            get(crate::http::explain::explain_pod),
        )
        .route(
            "/v1/clusters/{namespace}/{name}/explain/binding/{ns}/{object}",
            get(crate::http::explain::explain_binding),
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), guard_v1));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(v1)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

/// A JSON error body: `{"code", "reason", "message", ...extra}`.
pub fn error_body(code: StatusCode, reason: &str, message: &str, extra: Value) -> Response {
    let mut body = json!({"code": code.as_u16(), "reason": reason, "message": message});
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
        b.extend(extra);
    }
    (code, axum::Json(body)).into_response()
}

/// The 401/403/503 response of an auth failure.
pub fn failure_response(f: &AuthFailure) -> Response {
    let (reason, challenge) = match f.kind {
        FailureKind::Unauthenticated => ("Unauthorized", Some(format!("Bearer realm=\"{REALM}\""))),
        FailureKind::Forbidden => (
            "Forbidden",
            Some(format!(
                "Bearer realm=\"{REALM}\", error=\"insufficient_scope\""
            )),
        ),
        FailureKind::Unavailable => ("ServiceUnavailable", None),
    };
    let mut resp = error_body(f.kind.status(), reason, &f.message, Value::Null);
    let headers = resp.headers_mut();
    if let Some(c) = challenge.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::WWW_AUTHENTICATE, c);
    }
    if f.kind == FailureKind::Unavailable {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// Authentication and authorization per the mode, the same on every replica (leader or
/// follower), then the view's availability (a follower that has not read the published
/// status yet answers 503 `NotPublished`).
async fn guard_v1(State(s): State<ApiState>, mut req: Request, next: Next) -> Response {
    match s.auth.check(req.headers()).await {
        AuthDecision::Deny(f) => failure_response(&f),
        AuthDecision::Allow { caller, warning } => {
            // Handlers may read the caller (`Extension<Caller>`), e.g. for audit logs.
            if let Some(c) = caller {
                req.extensions_mut().insert(c);
            }
            if let Some(message) = s.view.v1_unavailable() {
                let mut resp = error_body(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "NotPublished",
                    &message,
                    Value::Null,
                );
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return resp;
            }
            let mut resp = next.run(req).await;
            if let Some(w) = warning {
                // RFC 7234 warn-code 299 ("miscellaneous persistent warning"), as
                // kube-apiserver uses for deprecations; kubectl-style clients print it.
                let text = format!(
                    "299 {REALM} \"permissive auth mode: this request would be refused with {}: {}\"",
                    w.kind.status().as_u16(),
                    w.message.replace(['"', '\\'], "'")
                );
                if let Ok(v) = HeaderValue::from_str(&text) {
                    resp.headers_mut().insert(header::WARNING, v);
                }
            }
            resp
        }
    }
}

async fn count_requests(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_string(), |m| m.as_str().to_string());
    let resp = next.run(req).await;
    s.metrics.request(&route, resp.status().as_u16());
    resp
}

/// `/readyz`: `200 ok`, or a `503` whose JSON body names what is missing; `?verbose` lists
/// every check and the ClusterProfile version read, as kube-apiserver's `/readyz?verbose`.
async fn readyz(
    State(s): State<ApiState>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let r = s.view.ready();
    let verbose = query.as_deref().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    if verbose {
        return verbose_readyz(&r);
    }
    if r.is_ready() {
        (StatusCode::OK, "ok").into_response()
    } else {
        let mut missing = Vec::new();
        if !r.inventory_synced {
            missing.push("the ClusterProfile inventory has not synced".to_string());
        }
        if let Some(e) = &r.inventory_error {
            missing.push(e.clone());
        }
        if !r.leadership_known {
            missing.push("leadership is not known yet".to_string());
        }
        error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            "NotReady",
            &missing.join("; "),
            json!({"readiness": r}),
        )
    }
}

/// The `?verbose` form of `/readyz`: one `[+]`/`[-]` line per check.
fn verbose_readyz(r: &crate::http::HubReadiness) -> Response {
    let mark = |ok: bool| if ok { "[+]" } else { "[-]" };
    let inventory = match (&r.inventory_error, &r.clusterprofile_version) {
        (Some(e), _) => format!("{}inventory failed: {e}", mark(false)),
        (None, Some(v)) if r.inventory_synced => {
            format!("{}inventory ok: clusterprofile version {v}", mark(true))
        }
        (None, Some(v)) => format!(
            "{}inventory not synced yet: clusterprofile version {v}",
            mark(false)
        ),
        (None, None) if r.inventory_synced => format!("{}inventory ok", mark(true)),
        (None, None) => format!("{}inventory not synced yet", mark(false)),
    };
    let leadership = if r.leadership_known {
        format!("{}leadership ok", mark(true))
    } else {
        format!("{}leadership not known yet", mark(false))
    };
    let ready = r.is_ready();
    let body = format!(
        "{inventory}\n{leadership}\nreadyz check {}\n",
        if ready { "passed" } else { "failed" }
    );
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body).into_response()
}

async fn metrics(State(s): State<ApiState>) -> Response {
    // Encoding walks every spoke's series: off the async workers, like the /v1 bodies.
    match metrics_response_blocking(s.registry).await {
        Ok(resp) => resp,
        Err(e) => internal_error(&format!("encoding metrics: {e}")),
    }
}

/// A JSON body built by the view on a blocking thread (a fleet-wide body can take a large
/// fraction of a second to build after a change; cached ones cost nothing).
async fn json_from_view(
    view: Arc<dyn HubView>,
    body: impl FnOnce(&dyn HubView) -> Result<Bytes, EncodeError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(move || body(view.as_ref())).await {
        Ok(Ok(bytes)) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Ok(Err(e)) => internal_error(&e.to_string()),
        Err(e) => internal_error(&format!("building the response: {e}")),
    }
}

fn internal_error(message: &str) -> Response {
    error_body(
        StatusCode::INTERNAL_SERVER_ERROR,
        "InternalError",
        message,
        Value::Null,
    )
}

async fn report(State(s): State<ApiState>) -> Response {
    json_from_view(s.view, |v| v.report_json()).await
}

async fn clusters(State(s): State<ApiState>) -> Response {
    json_from_view(s.view, |v| v.clusters_json()).await
}

async fn cluster(
    State(s): State<ApiState>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    match s.view.cluster(&namespace, &name) {
        Some(c) => axum::Json(c).into_response(),
        None => error_body(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("cluster {namespace}/{name} is not in the hub's inventory"),
            json!({"cluster": {"namespace": namespace, "name": name}}),
        ),
    }
}

async fn not_found(req: Request) -> Response {
    error_body(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("no such path: {}", req.uri().path()),
        Value::Null,
    )
}
