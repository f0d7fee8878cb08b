//! The HTTP transport under every spoke client (and `kleym spoke`'s client): HTTP/2 when the
//! server offers it, HTTP/1.1 otherwise.
//!
//! kube-rs 5's own stack (`ClientBuilder::try_from(Config)`) offers only HTTP/1.1, so every
//! watch and every concurrent request holds its own TCP+TLS connection. This stack is the
//! same as kube's (rustls with the config's CA roots, client identity, `tls-server-name` and
//! `insecure-skip-tls-verify`; the HTTP or HTTPS CONNECT proxy of `Config::proxy_url`; the
//! connect/read/write timeouts; the base URI, the config's auth and extra headers) except:
//! - TLS offers ALPN `h2` and `http/1.1`; when the server picks `h2`, one connection per
//!   spoke carries every request and watch as a stream (kube-apiserver allows up to 1000
//!   concurrent streams per connection, far above a spoke's dozen). That connection is driven
//!   on `h2` directly ([`http2`]: why, and how it opens, pings and replaces the connection);
//!   when a server does not pick `h2`, the request is sent again, and every later one goes, to
//!   hyper's pool speaking whatever ALPN chose (HTTP/1.1: a connection per concurrent request,
//!   as before), until the client is rebuilt. The connection that revealed HTTP/1.1 is handed
//!   to that pool, not thrown away;
//! - TLS reads the socket through a read-ahead buffer ([`read_ahead`]): one system call per
//!   burst rather than per 4 KiB;
//! - dead-connection detection like client-go's: after [`Keepalive::interval`] without
//!   reading anything from the connection an HTTP/2 PING is sent, and the connection is
//!   closed when no frame answers within [`Keepalive::timeout`]. Every stream on it then
//!   fails at once, so a blackholed spoke is noticed on all its watches together;
//! - a server's `GOAWAY` (kube-apiserver's `--goaway-chance`, or shutdown) makes new
//!   requests open a new connection; watches whose stream is cut resume from their last
//!   resourceVersion (the spoke's `list_watch` does that, as kube-runtime's watcher does), so
//!   nothing is listed or written twice.
//!
//! Unlike kube's builder, no `valid_until` is set on the client (kleym never reads it: the
//! credential cache tracks expiry) and no tracing layer is added.
//!
//! A client built with a client certificate keeps that certificate on every connection it
//! opens; rotation builds a new client, hence a new connection, and the old connection
//! closes once the old client and its open streams are gone.

pub mod crypto;
mod http2;
mod keepalive;
mod read_ahead;
mod session;

pub use http2::Http2Body;
use http2::{Http2, SendError};
pub use keepalive::Keepalive;
use session::SpokeSessions;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::rt::{Read, Write};
use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kleym_spoke::reconciler::limits::{Oversized, TooLarge};
use kube::client::{Body, ConfigExt as _};
use thiserror::Error;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceBuilder};

/// Why a transport could not be built.
#[derive(Debug, Error)]
pub enum TransportError {
    /// kube refused the configuration (TLS identity, CA roots, auth, headers).
    #[error("invalid client configuration: {0}")]
    Config(#[from] kube::Error),
    /// `tls-server-name` is not a valid DNS name or IP address.
    #[error("invalid tls-server-name {name:?}")]
    ServerName {
        /// The configured name.
        name: String,
    },
    /// The proxy URL's scheme is neither `http` nor `https`.
    #[error("unsupported proxy URL scheme {scheme:?} (only http and https proxies)")]
    ProxyScheme {
        /// The proxy URL's scheme.
        scheme: String,
    },
}

/// A `kube::Client` for `config` over the HTTP/2-capable transport described above.
pub fn client(
    config: &kube::Config,
    keepalive: Keepalive,
    max_response_bytes: u64,
) -> Result<kube::Client, TransportError> {
    Ok(kube::Client::new(
        service(config, keepalive, max_response_bytes)?,
        config.default_namespace.clone(),
    ))
}

/// The transport described above as a bare service, for a layer of the caller's own to
/// wrap before the one `kube::Client` (whose buffer task and channel are per client: a
/// second client around this one would double them for every spoke).
pub type TransportService = BoxCloneSyncService<Request<Body>, Response<ResponseBody>, BoxError>;

/// A response body from either protocol, failing with [`TooLarge`] once it delivered more
/// than its limit (see [`limit_for`]).
pub struct ResponseBody {
    inner: Received,
    /// Bytes it may still deliver.
    left: u64,
    /// Its limit, for the error.
    limit: u64,
}

/// The body as the protocol delivers it.
enum Received {
    /// From hyper's pool (the server did not offer HTTP/2).
    Http1(Incoming),
    /// From the spoke's HTTP/2 connection.
    Http2(Http2Body),
}

impl ResponseBody {
    fn new(inner: Received, limit: u64) -> Self {
        Self {
            inner,
            left: limit,
            limit,
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, BoxError>>> {
        let this = self.get_mut();
        let frame = match &mut this.inner {
            Received::Http1(body) => {
                ready!(Pin::new(body).poll_frame(cx)).map(|f| f.map_err(BoxError::from))
            }
            Received::Http2(body) => {
                ready!(Pin::new(body).poll_frame(cx)).map(|f| f.map_err(BoxError::from))
            }
        };
        if let Some(Ok(f)) = &frame
            && let Some(data) = f.data_ref()
        {
            // One subtraction per frame; a watch's limit is never reached (`limit_for`).
            match this.left.checked_sub(data.len() as u64) {
                Some(left) => this.left = left,
                None => {
                    this.left = 0;
                    let err = TooLarge {
                        what: Oversized::ResponseBody,
                        limit: this.limit,
                    };
                    return Poll::Ready(Some(Err(BoxError::from(err))));
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Received::Http1(body) => body.is_end_stream(),
            Received::Http2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.inner {
            Received::Http1(body) => body.size_hint(),
            Received::Http2(body) => body.size_hint(),
        }
    }
}

/// The limit of the body of the response to `req`: `max_response_bytes`, but none for a
/// watch (`watch=true` or `watch=1` in the query, as kube-apiserver reads it): a watch
/// streams for minutes, and each of its lines is limited where it is read (the spoke's
/// `list_watch`).
fn limit_for(req: &Request<Body>, max_response_bytes: u64) -> u64 {
    let watch = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    });
    if watch { u64::MAX } else { max_response_bytes }
}

/// The transport for `config` as a [`TransportService`].
pub fn service(
    config: &kube::Config,
    keepalive: Keepalive,
    max_response_bytes: u64,
) -> Result<TransportService, TransportError> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let limits = (keepalive, max_response_bytes);
    match config.proxy_url.as_ref() {
        None => build(tcp, config, limits),
        Some(proxy) => match proxy.scheme_str() {
            Some("http") => build(tunnel(proxy, tcp), config, limits),
            Some("https") => {
                // The proxy itself is reached over TLS (HTTP/1.1: CONNECT is not h2 here).
                let tls = config.rustls_client_config()?;
                let to_proxy = HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(tcp);
                build(tunnel(proxy, to_proxy), config, limits)
            }
            other => Err(TransportError::ProxyScheme {
                scheme: other.unwrap_or_default().to_string(),
            }),
        },
    }
}

/// A CONNECT tunnel through `proxy`, with `Proxy-Authorization: Basic` from its userinfo.
fn tunnel<C>(proxy: &Uri, inner: C) -> hyper_util::client::legacy::connect::proxy::Tunnel<C> {
    let tunnel = hyper_util::client::legacy::connect::proxy::Tunnel::new(proxy.clone(), inner);
    let userinfo = proxy
        .authority()
        .and_then(|a| a.as_str().rsplit_once('@'))
        .map(|(userinfo, _)| userinfo);
    match userinfo.and_then(|u| basic_auth(u).ok()) {
        Some(header) => tunnel.with_auth(header),
        None => tunnel,
    }
}

/// `Basic base64(userinfo)`, percent-escapes decoded first (as kube does).
fn basic_auth(userinfo: &str) -> Result<http::HeaderValue, http::header::InvalidHeaderValue> {
    use base64::Engine as _;
    let decoded = percent_decode(userinfo);
    let mut value = http::HeaderValue::from_str(&format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(decoded)
    ))?;
    value.set_sensitive(true);
    Ok(value)
}

fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            // Two hex digits: at most 0xff.
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'%'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

fn build<H>(
    connector: H,
    config: &kube::Config,
    (keepalive, max_response_bytes): (Keepalive, u64),
) -> Result<TransportService, TransportError>
where
    H: Service<Uri> + Clone + Send + Sync + 'static,
    H::Response: Read + Write + Connection + Send + Unpin + 'static,
    H::Future: Send + 'static,
    H::Error: Into<BoxError>,
{
    // ALPN is set by `enable_all_versions` below: `h2`, `http/1.1`.
    let mut tls = config.rustls_client_config()?;
    // rustls' default session cache holds 256 tickets, allocated up front: about 15 KB per
    // spoke (15 MB of the hub's heap at 1000 spokes) for one long-lived connection to one
    // server, and its smallest still 3 KB. This client's own store keeps the last tickets
    // of its one server, so a reconnect (GOAWAY, dead connection) still resumes.
    tls.resumption = rustls::client::Resumption::store(Arc::new(SpokeSessions::default()));
    let mut https = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let server_name = name
            .clone()
            .try_into()
            .map_err(|_| TransportError::ServerName { name: name.clone() })?;
        https = https.with_server_name_resolver(FixedServerNameResolver::new(server_name));
    }
    // Both versions: ALPN decides per connection. TLS reads the socket through a read-ahead
    // buffer (see `read_ahead`).
    let https = https
        .enable_all_versions()
        .wrap_connector(read_ahead::ReadAheadConnector(connector));
    let mut timed = TimeoutConnector::new(https);
    timed.set_connect_timeout(config.connect_timeout);
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);

    let fallback = Arc::new(AtomicBool::new(false));
    let spare = Arc::new(Mutex::new(Vec::new()));
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new());
    let auto: HyperClient<_> = builder.build(UseSpare {
        inner: timed.clone(),
        spare: spare.clone(),
    });
    let h2 = Http2::new(
        RequireH2 {
            inner: timed,
            fallback: fallback.clone(),
            spare,
        },
        keepalive,
    );
    let hyper_client = Versions {
        h2,
        auto: Arc::new(auto),
        fallback,
        max_response_bytes,
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper_client);
    Ok(BoxCloneSyncService::new(service))
}

type HyperClient<C> = hyper_util::client::legacy::Client<C, Body>;

/// Connections on which the server did not pick HTTP/2, kept for the other pool's next
/// connect to the same server, so that learning the version costs no second handshake.
type Spare<R> = Arc<Mutex<Vec<(Uri, R)>>>;

/// At most this many spare connections are kept (a burst before the fallback was known).
const MAX_SPARE: usize = 4;

/// A connector that only hands out connections on which the server picked HTTP/2, and
/// records (in `fallback`) a server that did not, keeping its connection in `spare`.
struct RequireH2<C, R> {
    inner: C,
    fallback: Arc<AtomicBool>,
    spare: Spare<R>,
}

impl<C: Clone, R> Clone for RequireH2<C, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            fallback: self.fallback.clone(),
            spare: self.spare.clone(),
        }
    }
}

/// The fallback pool's connector: a spare connection to the same server first.
struct UseSpare<C, R> {
    inner: C,
    spare: Spare<R>,
}

impl<C: Clone, R> Clone for UseSpare<C, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            spare: self.spare.clone(),
        }
    }
}

fn same_server(a: &Uri, b: &Uri) -> bool {
    a.scheme() == b.scheme() && a.authority() == b.authority()
}

impl<C> Service<Uri> for UseSpare<C, C::Response>
where
    C: Service<Uri>,
    C::Response: Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = BoxFuture<C::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let spare = self.spare.lock().ok().and_then(|mut conns| {
            let i = conns.iter().position(|(u, _)| same_server(u, &uri))?;
            Some(conns.swap_remove(i).1)
        });
        if let Some(io) = spare {
            return Box::pin(async move { Ok(io) });
        }
        let connecting = self.inner.call(uri);
        Box::pin(async move { connecting.await.map_err(Into::into) })
    }
}

const NOT_H2: &str = "the server did not pick HTTP/2 (ALPN); falling back to HTTP/1.1";

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<C> Service<Uri> for RequireH2<C, C::Response>
where
    C: Service<Uri>,
    C::Response: Connection + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = BoxFuture<C::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let fallback = self.fallback.clone();
        if fallback.load(Ordering::Relaxed) {
            // Requests queued on this pool before the fallback: no handshake to learn it again.
            return Box::pin(async { Err(BoxError::from(NOT_H2)) });
        }
        let spare = self.spare.clone();
        let connecting = self.inner.call(uri.clone());
        Box::pin(async move {
            let io = connecting.await.map_err(Into::into)?;
            if io.connected().is_negotiated_h2() {
                return Ok(io);
            }
            fallback.store(true, Ordering::Relaxed);
            if let Ok(mut conns) = spare.lock()
                && conns.len() < MAX_SPARE
            {
                conns.push((uri, io));
            }
            Err(BoxError::from(NOT_H2))
        })
    }
}

/// The HTTP/2 connection, and hyper's pool used once the server turned out not to speak
/// HTTP/2 (behind an `Arc`: every HTTP/2 request's future holds it in case, and cloning
/// hyper's client for each one cost about 0.5 % of the hub's CPU).
#[derive(Clone)]
struct Versions<A, B> {
    h2: Http2<A>,
    auto: Arc<HyperClient<B>>,
    fallback: Arc<AtomicBool>,
    /// The limit of a response body that is not a watch's (see [`limit_for`]).
    max_response_bytes: u64,
}

impl<A, B> Service<Request<Body>> for Versions<A, B>
where
    A: Service<Uri> + Clone + Send + Sync + 'static,
    A::Response: Read + Write + Send + Unpin + 'static,
    A::Future: Send + 'static,
    A::Error: Into<BoxError>,
    B: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = BoxFuture<Response<ResponseBody>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Always ready: the HTTP/2 connection is opened by the request that needs it, and
        // hyper's legacy client queues internally.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let limit = limit_for(&req, self.max_response_bytes);
        if self.fallback.load(Ordering::Relaxed) {
            return http1(&self.auto, req, limit);
        }
        let h2 = self.h2.clone();
        let auto = self.auto.clone();
        let fallback = self.fallback.clone();
        Box::pin(async move {
            match h2.send(req).await {
                Ok(resp) => Ok(resp.map(|body| ResponseBody::new(Received::Http2(body), limit))),
                // Nothing was sent: the connection was refused for its protocol.
                Err(SendError::Unsent { request, .. }) if fallback.load(Ordering::Relaxed) => {
                    http1(&auto, *request, limit).await
                }
                Err(e) => Err(e.into()),
            }
        })
    }
}

fn http1<B>(
    auto: &HyperClient<B>,
    req: Request<Body>,
    limit: u64,
) -> BoxFuture<Response<ResponseBody>>
where
    B: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let sent = auto.request(req);
    Box::pin(async move {
        sent.await
            .map(|resp| resp.map(|body| ResponseBody::new(Received::Http1(body), limit)))
            .map_err(BoxError::from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_userinfo_is_percent_decoded() {
        assert_eq!(percent_decode("user:pa%40ss%3Aword"), b"user:pa@ss:word");
        assert_eq!(percent_decode("user:pass%+A%4"), b"user:pass%+A%4");
        let v = basic_auth("u:p%40").unwrap();
        assert_eq!(v.to_str().unwrap(), "Basic dTpwQA==");
        assert!(v.is_sensitive());
    }

    #[test]
    fn unsupported_proxy_scheme_is_refused() {
        let mut config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        config.proxy_url = Some("socks5://127.0.0.1:2".parse().unwrap());
        let Err(err) = client(&config, Keepalive::default(), u64::MAX) else {
            panic!("a socks5 proxy was accepted");
        };
        assert!(err.to_string().contains("socks5"), "{err}");
    }
}
