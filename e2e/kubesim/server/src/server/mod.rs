//! The HTTPS API server of one simulated cluster: TLS (HTTP/1.1 and HTTP/2 via ALPN), the
//! authentication → authorization → handler chain, and connection-level faults.
//!
//! [`ClusterServer`] holds everything one cluster serves; [`ClusterServer::handle`] answers
//! one request; [`listener`] runs the accept loop.

pub mod connections;
pub mod listener;
pub mod protobuf;
pub mod request;
pub mod request_log;
pub mod resources;
pub mod response;
pub mod shared_port;
pub mod table;
pub mod watch;

use crate::authn::{self, Authenticated};
use crate::authz;
use crate::faults::{FaultHandle, FaultRequest, reason_for_code};
use crate::{discovery, openapi};
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use kubesim_auth::UserInfo;
use kubesim_auth::jwt::SaIssuer;
use kubesim_auth::pki::ClusterPki;
use kubesim_store::{ApiError, Cluster};
use request::{Query, RequestInfo};
use request_log::{LoggedRequest, RequestLog};
use response::Body;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

/// Largest request body accepted (kube-apiserver's limit is 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// How long after answering a `silentConnection` request the open connections go silent
/// (the requester's own connection included, once it has its answer).
const SILENCE_AFTER_RESPONSE: std::time::Duration = std::time::Duration::from_millis(200);

/// The Kubernetes version kubesim reports at `/version`.
pub const KUBE_GIT_VERSION: &str = "v1.33.0-kubesim";

/// Everything one simulated cluster serves over HTTPS.
pub struct ClusterServer {
    /// Cluster name.
    pub name: String,
    /// The API machinery.
    pub store: Arc<Cluster>,
    /// CA and serving certificate.
    pub pki: ClusterPki,
    /// The address the listener is bound to.
    pub addr: SocketAddr,
    /// `https://127.0.0.1:<port>`; also the ServiceAccount issuer URL and API audience.
    pub url: String,
    /// The static admin bearer token (user `kubesim-admin`, group `system:masters`).
    pub admin_token: String,
    /// Static bearer tokens → users (includes the admin token).
    pub static_tokens: RwLock<HashMap<String, UserInfo>>,
    /// The ServiceAccount token issuer (its RSA key is generated on first use).
    sa_issuer: OnceCell<Arc<SaIssuer>>,
    /// External JWT issuers this cluster trusts.
    pub external_issuers: RwLock<Vec<Arc<dyn authn::ExternalAuthenticator>>>,
    /// Run-time fault switches.
    pub faults: FaultHandle,
    /// Every request answered, for tests asserting on what a client sent.
    pub requests: RequestLog,
    /// Connections accepted and open (HTTP/1.1 and HTTP/2), for tests.
    pub connections: connections::ConnectionStats,
    /// When each ServiceAccount token issued here was issued (jti → Unix ms), for
    /// "revoke every token issued so far".
    pub(crate) issued_tokens: RwLock<HashMap<String, i64>>,
    /// Cached RBAC snapshot keyed by the store's resourceVersion.
    pub(crate) rbac_cache: authz::RbacCache,
    /// Cancelled when the cluster stops.
    pub shutdown: CancellationToken,
}

impl std::fmt::Debug for ClusterServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterServer")
            .field("name", &self.name)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The admin user of every cluster.
pub const ADMIN_USER: &str = "kubesim-admin";

impl ClusterServer {
    /// Assemble a server (the listener is bound by the caller, which knows `addr`).
    pub fn new(
        name: &str,
        store: Arc<Cluster>,
        pki: ClusterPki,
        addr: SocketAddr,
        admin_token: String,
        shutdown: CancellationToken,
    ) -> Self {
        let url = format!("https://{addr}");
        let store_for_hook = store.clone();
        let faults = FaultHandle::new(Arc::new(move || store_for_hook.close_watches()));
        let admin = UserInfo {
            username: ADMIN_USER.to_string(),
            uid: String::new(),
            groups: vec![
                kubesim_auth::GROUP_MASTERS.to_string(),
                kubesim_auth::GROUP_AUTHENTICATED.to_string(),
            ],
            extra: Default::default(),
        };
        let mut tokens = HashMap::new();
        tokens.insert(admin_token.clone(), admin);
        Self {
            name: name.to_string(),
            store,
            pki,
            addr,
            url,
            admin_token,
            static_tokens: RwLock::new(tokens),
            sa_issuer: OnceCell::new(),
            external_issuers: RwLock::new(Vec::new()),
            faults,
            requests: RequestLog::default(),
            connections: connections::ConnectionStats::default(),
            issued_tokens: RwLock::new(HashMap::new()),
            rbac_cache: authz::RbacCache::default(),
            shutdown,
        }
    }

    /// The API audiences (kube-apiserver defaults `--api-audiences` to the issuer URL).
    pub fn api_audiences(&self) -> Vec<String> {
        vec![self.url.clone()]
    }

    /// The ServiceAccount issuer, generating its RSA key on first use (off the async
    /// threads).
    pub async fn sa_issuer(&self) -> Result<Arc<SaIssuer>, ApiError> {
        let url = self.url.clone();
        self.sa_issuer
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || SaIssuer::new(&url))
                    .await
                    .map_err(|e| internal(format!("key generation task: {e}")))?
                    .map(Arc::new)
                    .map_err(|e| internal(format!("key generation: {e}")))
            })
            .await
            .cloned()
    }

    /// Install an externally created issuer (e.g. with a pre-generated key); no effect if one
    /// exists already. Returns whether it was installed.
    pub fn set_sa_issuer(&self, issuer: SaIssuer) -> bool {
        self.sa_issuer.set(Arc::new(issuer)).is_ok()
    }

    /// Answer one HTTP request. `peer_user` is the identity of a verified client
    /// certificate presented on this connection, if any. Any body type: the listener passes
    /// hyper's, an in-process client (e.g. a `kube::Client` over a `tower` service, to run
    /// on a paused tokio clock) its own.
    pub async fn handle<B>(
        self: Arc<Self>,
        peer_user: Option<UserInfo>,
        req: Request<B>,
    ) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let user_agent = request_log::user_agent_of(req.headers());
        let pending = self.requests.begin(method.as_str(), &path);
        let resp = self.clone().handle_inner(peer_user, req).await;
        // Logged as answered before it stops being pending: a test never sees it in neither.
        self.requests.record(LoggedRequest {
            method: method.to_string(),
            path: path.clone(),
            status: resp.status().as_u16(),
            at: tokio::time::Instant::now(),
            user_agent,
        });
        drop(pending);
        // Access log (debug level); never the query string or headers, which may carry
        // credentials.
        tracing::debug!(
            cluster = %self.name,
            %method,
            %path,
            status = resp.status().as_u16(),
            "request"
        );
        resp
    }

    async fn handle_inner<B>(
        self: Arc<Self>,
        peer_user: Option<UserInfo>,
        req: Request<B>,
    ) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let query = Query::parse(parts.uri.query());
        let is_fault_endpoint = path == "/kubesim/faults";

        // A stopped cluster (removed at run time) answers nothing, even on a keep-alive
        // connection a client opened before: as a gone API server would.
        if self.shutdown.is_cancelled() {
            return response::text(503, "shutting down");
        }
        if !is_fault_endpoint {
            // Requests on connections opened before a blackhole hang until it is lifted.
            let mut rx = self.faults.subscribe();
            if rx.borrow().blackhole {
                tokio::select! {
                    _ = rx.wait_for(|s| !s.blackhole) => {}
                    () = self.shutdown.cancelled() => return response::text(503, "shutting down"),
                }
            }
            let latency = self.faults.latency();
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
        }

        // Public endpoints, as kube-apiserver's defaults allow anonymous access to them.
        match path.as_str() {
            "/healthz" | "/livez" | "/readyz" => return response::text(200, "ok"),
            p if p.starts_with("/healthz/")
                || p.starts_with("/livez/")
                || p.starts_with("/readyz/") =>
            {
                return response::text(200, "ok");
            }
            "/version" => return response::json(200, &version()),
            kubesim_auth::jwt::OPENID_CONFIGURATION_PATH => {
                return match self.sa_issuer().await {
                    Ok(i) => response::json(200, &i.openid_configuration()),
                    Err(e) => response::error(&e),
                };
            }
            kubesim_auth::jwt::JWKS_PATH => {
                return match self.sa_issuer().await {
                    Ok(i) => {
                        let mut r = response::json(200, &i.jwks());
                        r.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/jwk-set+json"),
                        );
                        r
                    }
                    Err(e) => response::error(&e),
                };
            }
            _ => {}
        }

        let user = match authn::authenticate(&self, &parts.headers, peer_user).await {
            Authenticated::User(u) => u,
            Authenticated::Rejected => return response::unauthorized(),
        };

        if is_fault_endpoint {
            return self.fault_endpoint(&user, &parts.method, body).await;
        }

        let user = match authn::impersonation(&parts.headers) {
            Ok(None) => user,
            Ok(Some(imp)) => match authz::check_impersonation(&self, &user, &imp) {
                Ok(()) => authn::impersonated_user(&imp),
                Err(resp) => return *resp,
            },
            Err(msg) => return response::error(&response::bad_request(msg)),
        };

        let info = RequestInfo::parse(&parts.method, &path, &query);

        let resource_for_faults = info
            .is_resource_request
            .then_some((info.resource.as_str(), info.api_group.as_str()));
        if let Some(code) = self.faults.injected_error(&info.verb, resource_for_faults) {
            let (reason, message) = reason_for_code(code);
            return response::error(&ApiError::new(code, reason, message));
        }
        if let Some((bytes, counters)) = self.faults.endless_body(&info.verb, resource_for_faults) {
            return watch::endless_response(bytes, counters);
        }

        if let Err(resp) = authz::check(&self, &user, &info) {
            return *resp;
        }

        if info.is_resource_request {
            let body = if matches!(parts.method, Method::GET | Method::HEAD) {
                Bytes::new()
            } else {
                match read_body(body).await {
                    Ok(b) => b,
                    Err(e) => return response::error(&e),
                }
            };
            return resources::handle(&self, &user, &info, &query, &parts.headers, body).await;
        }
        self.non_resource(&info, &parts.headers).await
    }

    async fn non_resource(&self, info: &RequestInfo, headers: &http::HeaderMap) -> Response<Body> {
        if info.verb != "get" && info.verb != "head" {
            return response::error(&ApiError::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ));
        }
        let path = info.path.trim_end_matches('/');
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let resources = self.store.resources();
        let accept = headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok());
        if matches!(parts.as_slice(), ["api"] | ["apis"]) && discovery::wants_aggregated(accept) {
            let doc = discovery::aggregated(&resources, parts == ["api"]);
            let mut resp = response::json(200, &doc);
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(discovery::AGGREGATED_CONTENT_TYPE),
            );
            return resp;
        }
        let found = match parts.as_slice() {
            ["api"] => Some(discovery::api_versions(&self.addr.to_string())),
            ["api", "v1"] => discovery::api_resource_list(&resources, "", "v1"),
            ["apis"] => Some(discovery::api_group_list(&resources)),
            ["apis", g] => discovery::api_group(&resources, g),
            ["apis", g, v] => discovery::api_resource_list(&resources, g, v),
            ["openapi", "v3"] => Some(openapi::index(&self.store)),
            ["openapi", "v3", rest @ ..] => openapi::document(&self.store, &rest.join("/")),
            _ => None,
        };
        match found {
            Some(v) => response::json(200, &v),
            None => response::not_found_path(),
        }
    }

    async fn fault_endpoint<B>(&self, user: &UserInfo, method: &Method, body: B) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if !user.in_group(kubesim_auth::GROUP_MASTERS) {
            return response::error(&ApiError::new(
                403,
                "Forbidden",
                format!(
                    "forbidden: User \"{}\" cannot {} path \"/kubesim/faults\"",
                    user.username,
                    method.as_str().to_ascii_lowercase()
                ),
            ));
        }
        match *method {
            Method::GET => {}
            Method::DELETE => self.faults.clear(),
            Method::POST | Method::PUT | Method::PATCH => {
                let bytes = match read_body(body).await {
                    Ok(b) => b,
                    Err(e) => return response::error(&e),
                };
                let mut req: FaultRequest = match serde_json::from_slice(&bytes) {
                    Ok(r) => r,
                    Err(e) => {
                        return response::error(&response::bad_request(format!(
                            "invalid fault request: {e}"
                        )));
                    }
                };
                let clear_after = req.clear_after_seconds;
                // Silencing the open connections would silence this one before it answers:
                // done just after the response went out.
                let silence = req.silent_connection.take_if(|on| *on);
                if let Err(e) = self.faults.apply(req) {
                    return response::error(&response::bad_request(e.to_string()));
                }
                if silence.is_some() {
                    let faults = self.faults.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(SILENCE_AFTER_RESPONSE).await;
                        faults.set_silent_connections(true);
                    });
                }
                if let Some(secs) = clear_after {
                    let faults = self.faults.clone();
                    let shutdown = self.shutdown.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            () = tokio::time::sleep(std::time::Duration::from_secs(secs)) => faults.clear(),
                            () = shutdown.cancelled() => {}
                        }
                    });
                }
            }
            _ => {
                return response::error(&ApiError::new(
                    405,
                    "MethodNotAllowed",
                    "use GET, POST or DELETE on /kubesim/faults",
                ));
            }
        }
        response::json(200, &json!(self.faults.snapshot()))
    }

    /// Record a ServiceAccount token's issue time (for "revoke all tokens issued so far").
    pub(crate) fn record_issued(&self, jti: &str) {
        if let Ok(mut m) = self.issued_tokens.write() {
            m.insert(jti.to_string(), chrono::Utc::now().timestamp_millis());
        }
    }
}

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": KUBE_GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// An internal error `Status`.
pub fn internal(msg: impl Into<String>) -> ApiError {
    ApiError::new(500, "InternalError", msg)
}

async fn read_body<B>(body: B) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body could not be read: {e}"),
        )),
    }
}
