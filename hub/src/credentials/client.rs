//! Building a `kube::Client` for a spoke from its [`EffectiveAccess`] and credential cache.
//!
//! kube-rs's own exec auth is not used (it blocks, has no timeout and ignores 401). Instead:
//! - the transport (server URL, CA roots, `tls-server-name`, `insecure-skip-tls-verify` when
//!   the hub allowed it, `proxy-url` — else `HTTPS_PROXY`/`NO_PROXY` from the environment,
//!   matched against the server (see [`proxy`](super::proxy)) —,
//!   `disable-compression`, connect/read/write timeouts) is configured from an in-memory
//!   kubeconfig, and served by [`transport`](super::transport): HTTP/2 when the spoke offers
//!   it (one connection carries every watch and request, with PING keepalive), else HTTP/1.1;
//! - an outer service asks the cache for a credential on *every* request, sets
//!   `Authorization: Bearer`, and on a 401 reports the credential's generation to the cache,
//!   gets a new credential (one re-exec, shared by concurrent requests) and retries the request
//!   once. Request bodies built by kube are buffered bytes, so they can be replayed; a
//!   streaming body is not retried (the 401 is returned). The outcome of every request (401 or
//!   not) is reported to the cache, which backs off 401-driven re-execs while the server keeps
//!   rejecting what the plugin returns (see [`cache`](super::cache)).
//!
//! Client certificates: with rustls the TLS identity is fixed when the connector is built.
//! A spoke whose plugin returns a certificate gets a client built with that identity; when the
//! cache later holds a different certificate (refresh before expiry, or re-exec after a 401),
//! [`SpokeClient::needs_rebuild`] turns true and the owner (the fleet supervisor) must build a
//! new client, which opens new connections with the new identity — the equivalent of
//! client-go closing all connections on rotation. Until then the client keeps sending the
//! certificate it was built with, so the outcome of its requests is reported for the
//! generation that certificate came from, never for a newer one it has not sent (a 401 for
//! the old certificate must not reject, and start a backoff for, its unsent replacement).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use kleym_spoke::reconciler::{ClusterClient, SendWrite};
use kube::client::Body;
use thiserror::Error;
use tower::{BoxError, Service, ServiceExt as _};

use super::cache::{CachedCredential, CredentialError, SpokeCredentials};
use super::credential::Credential;
use super::proxy::proxy_for;
use super::secret::short_hash;
use super::transport::{self, Keepalive, ResponseBody, TransportService};

/// Transport timeouts and the user agent of spoke clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// TCP+TLS connect timeout.
    pub connect_timeout: Option<Duration>,
    /// Per-read timeout (keep above the watch timeout used by reflectors).
    pub read_timeout: Option<Duration>,
    /// Per-write timeout.
    pub write_timeout: Option<Duration>,
    /// HTTP/2 PING keepalive (dead-connection detection).
    pub keepalive: Keepalive,
    /// The largest response body read, watches aside (see
    /// [`kleym_spoke::reconciler::limits`]).
    pub max_response_bytes: u64,
    /// The `User-Agent` of every request to the spoke (see [`spoke_user_agent`]); `None`
    /// sends none.
    pub user_agent: Option<HeaderValue>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(295)),
            write_timeout: Some(Duration::from_secs(30)),
            keepalive: Keepalive::default(),
            max_response_bytes: kleym_spoke::reconciler::limits::DEFAULT_MAX_RESPONSE_BYTES,
            user_agent: None,
        }
    }
}

/// The longest replica identity a user agent carries (the hub's `--instance` is at most 128
/// characters, plus the identity's suffix).
const MAX_IDENTITY_IN_USER_AGENT: usize = 160;

/// `kleym-hub/<version> (replica <identity>)`: the `User-Agent` a hub replica sends to every
/// spoke, so that a spoke's audit log (kube-apiserver records it as `userAgent`) tells which
/// replica made a request. `identity` is the replica's leader-election identity; characters a
/// header value or a user-agent comment cannot carry (controls, non-ASCII, parentheses,
/// backslashes) become `_`, and it is cut at 160 characters.
///
/// kube-apiserver derives a write's default field manager from the user agent (up to the
/// first `/`: `kleym-hub`), but kleym names its field manager on every write it makes to a
/// spoke, so the ownership proof never depends on this header.
pub fn spoke_user_agent(identity: &str) -> HeaderValue {
    let identity: String = identity
        .chars()
        .take(MAX_IDENTITY_IN_USER_AGENT)
        .map(|c| match c {
            '(' | ')' | '\\' => '_',
            c if c.is_ascii_graphic() || c == ' ' => c,
            _ => '_',
        })
        .collect();
    let value = format!(
        "kleym-hub/{} (replica {identity})",
        env!("CARGO_PKG_VERSION")
    );
    // Only visible ASCII and spaces are left, which a header value always accepts.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("kleym-hub"))
}

/// Why no client could be built.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The first credential could not be obtained.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// kube refused the configuration.
    #[error("spoke {spoke}: invalid client configuration: {detail}")]
    Config {
        /// Spoke name.
        spoke: String,
        /// kube's message.
        detail: String,
    },
}

/// A spoke's client plus what is needed to know when to rebuild it.
#[derive(Clone)]
pub struct SpokeClient {
    /// The client; every request carries the cache's current bearer token.
    pub client: kube::Client,
    /// The layer under `client`'s buffer, for the reconciler's writes (see
    /// [`SpokeClient::cluster_client`]).
    auth: SharedAuthRetry,
    credentials: Arc<SpokeCredentials>,
    built: Arc<BuiltWith>,
}

/// The credential a client's TLS connector was built with.
#[derive(Debug)]
struct BuiltWith {
    generation: u64,
    // The client certificate baked into the connector, if any.
    certificate_pem: Option<String>,
    // Hash of `certificate_pem`, for logs.
    certificate_hash: Option<String>,
    // Set when a request was sent with this certificate while the cache held another one.
    stale: AtomicBool,
}

impl BuiltWith {
    /// Whether a client built with `self` sends `credential` as it is: always for a client
    /// without a certificate (bearer tokens are set per request), else only when the credential
    /// carries the very certificate the connector holds.
    fn sends(&self, credential: &Credential) -> bool {
        let Some(built) = &self.certificate_pem else {
            return true;
        };
        credential
            .client_certificate
            .as_ref()
            .is_some_and(|cc| cc.certificate_pem == *built)
    }

    /// The generation a request made with `cred` is to be reported for: `cred`'s own, unless
    /// the connector still holds an older certificate; then the generation that certificate
    /// came from (already replaced, so a 401 for it is a no-op), and the client is marked for
    /// a rebuild.
    fn reported_generation(&self, cred: &CachedCredential) -> u64 {
        if cred.generation == self.generation || self.sends(&cred.credential) {
            return cred.generation;
        }
        self.stale.store(true, Ordering::Relaxed);
        self.generation
    }
}

impl std::fmt::Debug for SpokeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpokeClient")
            .field("spoke", &self.credentials.access().spoke)
            .field("certificate", &self.built.certificate_hash)
            .finish_non_exhaustive()
    }
}

impl SpokeClient {
    /// Whether the TLS client certificate in the cache differs from the one this client was
    /// built with, or a request of this client already went out with a certificate the cache
    /// had replaced (always false for clients built from a token-only credential). Checking
    /// starts the background refresh when the cached credential is due for one; the next check
    /// sees its result.
    pub async fn needs_rebuild(&self) -> bool {
        if self.built.certificate_pem.is_none() {
            return false;
        }
        if self.built.stale.load(Ordering::Relaxed) {
            return true;
        }
        match self.credentials.get().await {
            Ok(c) => !self.built.sends(&c.credential),
            Err(_) => false,
        }
    }

    /// The credential cache behind this client.
    pub fn credentials(&self) -> &Arc<SpokeCredentials> {
        &self.credentials
    }

    /// The client as the spoke reconciler takes it: [`SpokeClient::client`], and for the
    /// writes the same credential layer and transport without kube's buffer task in front
    /// (see [`SendWrite`]).
    pub fn cluster_client(&self) -> ClusterClient {
        ClusterClient {
            kube: self.client.clone(),
            writes: Some(Arc::new(self.auth.clone())),
        }
    }
}

/// Builds a client for the spoke of `credentials.access()`. Execs the plugin once (through the
/// cache) to learn whether the credential is a token or a client certificate.
pub async fn build_spoke_client(
    credentials: Arc<SpokeCredentials>,
    opts: &ClientOptions,
) -> Result<SpokeClient, ClientError> {
    let access = credentials.access().clone();
    let first = credentials.get().await?;
    let config_err = |detail: String| ClientError::Config {
        spoke: access.spoke.clone(),
        detail,
    };

    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut cluster = serde_json::json!({ "server": access.cluster.server });
    if let Some(ca) = &access.cluster.certificate_authority_pem {
        cluster["certificate-authority-data"] = b64(ca).into();
    }
    if let Some(name) = &access.cluster.tls_server_name {
        cluster["tls-server-name"] = name.clone().into();
    }
    if access.cluster.insecure_skip_tls_verify {
        cluster["insecure-skip-tls-verify"] = true.into();
    }
    if access.cluster.disable_compression {
        cluster["disable-compression"] = true.into();
    }
    let mut user = serde_json::json!({});
    let certificate_pem = first.credential.client_certificate.as_ref().map(|cc| {
        user["client-certificate-data"] = b64(cc.certificate_pem.as_bytes()).into();
        user["client-key-data"] = b64(cc.key_pem.expose().as_bytes()).into();
        cc.certificate_pem.clone()
    });
    let built = Arc::new(BuiltWith {
        generation: first.generation,
        certificate_hash: certificate_pem
            .as_ref()
            .map(|pem| short_hash(pem.as_bytes())),
        certificate_pem,
        stale: AtomicBool::new(false),
    });
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "spoke", "cluster": cluster}],
        "users": [{"name": "hub", "user": user}],
        "contexts": [{"name": "spoke", "context": {"cluster": "spoke", "user": "hub"}}],
        "current-context": "spoke",
    });
    let kubeconfig: kube::config::Kubeconfig =
        serde_json::from_value(kubeconfig).map_err(|e| config_err(e.to_string()))?;
    let mut config = kube::Config::try_from(kubeconfig).map_err(|e| config_err(e.to_string()))?;
    // Set explicitly, overriding kube's own environment fallback (see `proxy`).
    config.proxy_url = match proxy_for(
        &access.cluster.server,
        access.cluster.proxy_url.as_deref(),
        |k| std::env::var(k).ok(),
    ) {
        Some(p) => Some(
            p.parse()
                .map_err(|e: http::uri::InvalidUri| config_err(format!("proxy URL: {e}")))?,
        ),
        None => None,
    };
    config.connect_timeout = opts.connect_timeout;
    config.read_timeout = opts.read_timeout;
    config.write_timeout = opts.write_timeout;
    if let Some(ua) = &opts.user_agent {
        config.headers.push((http::header::USER_AGENT, ua.clone()));
    }
    let default_ns = config.default_namespace.clone();
    let inner = transport::service(&config, opts.keepalive, opts.max_response_bytes)
        .map_err(|e| config_err(e.to_string()))?;
    let auth = SharedAuthRetry(Arc::new(Mutex::new(AuthRetry::new(
        inner,
        credentials.clone(),
        built.clone(),
    ))));
    Ok(SpokeClient {
        client: kube::Client::new(auth.clone(), default_ns),
        auth,
        credentials,
        built,
    })
}

/// The spoke's one [`AuthRetry`], shared: kube's client calls it from its buffer task, the
/// reconciler's writes from their own task ([`SendWrite`]). The lock is held only to hand a
/// request to the transport (never across an `.await`), and the transport is always ready
/// (it queues internally), so neither path waits for the other.
#[derive(Clone)]
struct SharedAuthRetry(Arc<Mutex<AuthRetry>>);

impl SharedAuthRetry {
    fn lock(&self) -> std::sync::MutexGuard<'_, AuthRetry> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Service<Request<Body>> for SharedAuthRetry {
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = <AuthRetry as Service<Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.lock().poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        self.lock().call(req)
    }
}

impl SendWrite for SharedAuthRetry {
    fn send_write(
        &self,
        request: Request<Vec<u8>>,
    ) -> BoxFuture<'static, Result<(StatusCode, Bytes), kube::Error>> {
        let shared = self.clone();
        let mut request = Some(request.map(Body::from));
        Box::pin(async move {
            // Ready and call under one lock: readiness is not shared between callers.
            let sent = std::future::poll_fn(|cx| {
                let mut auth = shared.lock();
                match auth.poll_ready(cx) {
                    Poll::Ready(Ok(())) => Poll::Ready(
                        request
                            .take()
                            .map(|req| auth.call(req))
                            .ok_or_else(|| BoxError::from("request already sent")),
                    ),
                    Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await
            .map_err(kube::Error::Service)?;
            let response = sent.await.map_err(kube_error)?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(kube::Error::Service)?
                .to_bytes();
            Ok((status, body))
        })
    }
}

/// A transport's error as `kube::Client::send` reports it: kube's own, hyper's, or any
/// other layer's as `Service`.
fn kube_error(err: BoxError) -> kube::Error {
    err.downcast::<kube::Error>()
        .map(|e| *e)
        .or_else(|err| {
            err.downcast::<hyper::Error>()
                .map(|e| kube::Error::HyperError(*e))
        })
        .unwrap_or_else(kube::Error::Service)
}

/// Injects the cached bearer token and retries once after a 401 with a re-exec'ed credential.
/// It wraps the bare transport; the spoke's one `kube::Client` (its only buffer) and the
/// reconciler's writes share it ([`SharedAuthRetry`]).
///
/// A request whose credential is cached (nearly all) is handed to the transport from
/// [`Service::call`] itself, without a copy of the transport: cloning the boxed, layered
/// transport (and freeing the clone) for every request cost about 1 % of the hub's CPU. The
/// copy in [`Retry::transport`] is shared, and cloned only by a request that waits for its
/// credential or is sent again after a 401.
struct AuthRetry {
    inner: TransportService,
    retry: Arc<Retry>,
}

impl AuthRetry {
    fn new(
        inner: TransportService,
        credentials: Arc<SpokeCredentials>,
        built: Arc<BuiltWith>,
    ) -> Self {
        let retry = Arc::new(Retry {
            transport: inner.clone(),
            credentials,
            built,
            bearer: Mutex::new(None),
        });
        Self { inner, retry }
    }
}

/// What a request's future needs after it was sent.
struct Retry {
    /// The transport, for requests that need their own (see [`AuthRetry`]).
    transport: TransportService,
    credentials: Arc<SpokeCredentials>,
    built: Arc<BuiltWith>,
    /// The `Authorization` value of the last credential generation, so the header is not
    /// formatted and checked again for every request.
    bearer: Mutex<Option<(u64, HeaderValue)>>,
}

impl Retry {
    /// `req` with the `Authorization` header of `cred`.
    fn authorize(
        &self,
        req: Request<Body>,
        cred: &CachedCredential,
    ) -> Result<Request<Body>, BoxError> {
        let Some(token) = cred.credential.token.as_ref() else {
            return Ok(req);
        };
        let mut bearer = self.bearer.lock().unwrap_or_else(PoisonError::into_inner);
        let value = match bearer.as_ref() {
            Some((generation, value)) if *generation == cred.generation => value.clone(),
            _ => {
                let value = bearer_value(token.expose())?;
                *bearer = Some((cred.generation, value.clone()));
                value
            }
        };
        drop(bearer);
        let mut req = req;
        req.headers_mut().insert(http::header::AUTHORIZATION, value);
        Ok(req)
    }

    /// Reports the response to a request sent with `cred` and, after a 401, sends `replay`
    /// once more with a new credential.
    async fn settle(
        &self,
        resp: Response<ResponseBody>,
        cred: CachedCredential,
        replay: Option<Request<Body>>,
    ) -> Result<Response<ResponseBody>, BoxError> {
        let credentials = &self.credentials;
        let sent = self.built.reported_generation(&cred);
        if resp.status() != StatusCode::UNAUTHORIZED {
            credentials.report_success(sent);
            return Ok(resp);
        }
        credentials.invalidate_after_401(sent);
        let Some(replay) = replay else {
            return Ok(resp);
        };
        let fresh = match credentials.get().await {
            // Only a new bearer token can change the outcome on this client; a new client
            // certificate needs a rebuilt client (see `SpokeClient::needs_rebuild`).
            Ok(fresh)
                if fresh.generation != cred.generation && fresh.credential.token.is_some() =>
            {
                fresh
            }
            // No usable new credential: hand the caller the original 401.
            _ => return Ok(resp),
        };
        drop(resp);
        tracing::debug!(
            spoke = %credentials.access().spoke,
            generation = fresh.generation,
            "retrying request once after 401 with a fresh credential"
        );
        let replay = self.authorize(replay, &fresh)?;
        let resp = self.transport.clone().oneshot(replay).await?;
        // The re-exec'ed credential's verdict drives the cache's 401 backoff: rejected too
        // means the next 401-driven re-exec waits; accepted ends any backoff.
        let sent = self.built.reported_generation(&fresh);
        if resp.status() == StatusCode::UNAUTHORIZED {
            credentials.invalidate_after_401(sent);
        } else {
            credentials.report_success(sent);
        }
        Ok(resp)
    }
}

/// `Bearer <token>`, marked sensitive (kept out of debug output and HTTP/2 header tables).
fn bearer_value(token: &str) -> Result<HeaderValue, BoxError> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        BoxError::from("credential plugin returned a token that is not a valid header value")
    })?;
    value.set_sensitive(true);
    Ok(value)
}

fn try_clone(req: &Request<Body>) -> Option<Request<Body>> {
    let body = req.body().try_clone()?;
    let mut clone = Request::new(body);
    *clone.method_mut() = req.method().clone();
    *clone.uri_mut() = req.uri().clone();
    *clone.version_mut() = req.version();
    *clone.headers_mut() = req.headers().clone();
    clone.extensions_mut().clone_from(req.extensions());
    Some(clone)
}

impl Service<Request<Body>> for AuthRetry {
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let retry = self.retry.clone();
        match retry.credentials.try_get() {
            Some(Ok(cred)) => {
                let replay = try_clone(&req);
                let sent = retry.authorize(req, &cred).map(|req| self.inner.call(req));
                Box::pin(async move {
                    let resp = sent?.await?;
                    retry.settle(resp, cred, replay).await
                })
            }
            Some(Err(err)) => Box::pin(std::future::ready(Err(BoxError::from(err)))),
            // A plugin run is under way: wait for it on a transport of this request's own.
            None => Box::pin(async move {
                let cred = retry.credentials.get().await.map_err(BoxError::from)?;
                let replay = try_clone(&req);
                let req = retry.authorize(req, &cred)?;
                let resp = retry.transport.clone().oneshot(req).await?;
                retry.settle(resp, cred, replay).await
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::spoke_user_agent;

    #[test]
    fn the_user_agent_names_the_version_and_the_replica() {
        let ua = spoke_user_agent("hub-a_0123456789ab");
        assert_eq!(
            ua.to_str().unwrap(),
            format!(
                "kleym-hub/{} (replica hub-a_0123456789ab)",
                env!("CARGO_PKG_VERSION")
            )
        );
    }

    #[test]
    fn an_identity_a_header_cannot_carry_is_made_safe() {
        let ua = spoke_user_agent("pod (x)\\\ny\u{e9}");
        assert_eq!(
            ua.to_str().unwrap(),
            format!(
                "kleym-hub/{} (replica pod _x___y_)",
                env!("CARGO_PKG_VERSION")
            )
        );
        let long = "a".repeat(500);
        let ua = spoke_user_agent(&long);
        assert_eq!(ua.len(), spoke_user_agent("").len() + 160);
    }
}
