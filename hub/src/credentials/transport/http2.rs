//! A spoke's one HTTP/2 connection, driven on `h2` directly.
//!
//! hyper's HTTP/2 client (under hyper-util's pool) puts a dispatch channel and a task hop
//! between every request and the connection: two channel blocks of about 9 KB per spoke, and
//! a wake-up of the connection task per request before h2 even sees it. h2's `SendRequest` is
//! a handle on the connection's stream table, so here a request opens its stream from the
//! caller's own task and the connection task only moves frames. At 1000 spokes that is about
//! 18 MB of the hub's heap (heaptrack, docs/benchmarks.md).
//!
//! What hyper did and this keeps:
//! - one connection for every request, opened by the first request, shared by every request
//!   that waits for it (a failed attempt fails every request queued behind it, so a dead spoke
//!   costs one connect timeout, not one per request);
//! - dead-connection detection like client-go's: a PING after [`Keepalive::interval`] without
//!   reading from the socket; no answer within [`Keepalive::timeout`] closes the connection,
//!   which fails every open stream at once;
//! - a server's `GOAWAY`: streams it did not process fail at once and are sent again on a new
//!   connection, as are requests that find the connection gone before they were sent; streams
//!   it did process run to their end on the old connection, which closes after them;
//! - the connection closes once the client and every stream on it are gone.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, Uri};
use http_body::Frame;
use http_body_util::BodyExt as _;
use hyper::rt::{Read, Write};
use hyper_util::rt::TokioIo;
use kleym_spoke::reconciler::error::chain_text;
use kube::client::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower::{BoxError, Service};

use super::keepalive::Keepalive;

/// hyper's HTTP/2 client defaults, kept so the change of client changes no behaviour on the
/// wire: flow-control windows (5 MB per connection, 2 MB per stream: a list of a large spoke
/// is not throttled by round trips), frame and header-list sizes, and the send buffer bound.
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const MAX_FRAME_SIZE: u32 = 16 * 1024;
const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
const MAX_SEND_BUFFER: usize = 1024 * 1024;

/// The connection of one spoke client: cheap to clone, every clone shares it.
pub(super) struct Http2<C> {
    shared: Arc<Shared<C>>,
}

impl<C> Clone for Http2<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<C> {
    connector: C,
    keepalive: Keepalive,
    slot: tokio::sync::Mutex<Slot>,
    /// Connection attempts ended so far; read before waiting for the slot, to tell whether
    /// an attempt ended while this request waited.
    attempts: AtomicU64,
}

#[derive(Default)]
struct Slot {
    live: Option<Live>,
    /// Why the last attempt failed (its error chain as text), for the requests that waited
    /// for it.
    failure: Option<Arc<str>>,
}

/// A connection requests can be sent on, until `closed`.
#[derive(Clone)]
struct Live {
    send: h2::client::SendRequest<Bytes>,
    /// Set when the connection is known to be unusable for new requests: its task ended, or
    /// a request found it refusing new streams (`GOAWAY`, connection error).
    closed: Arc<AtomicBool>,
}

/// A connection attempt failed; nothing was sent. The text is the connector's error chain
/// (the fleet's error categories read "certificate", "handshake", … from it).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(super) struct ConnectError(BoxError);

/// Why a request got no response.
#[derive(Debug)]
pub(super) enum SendError {
    /// No connection could be opened: the request was not sent, and is handed back (for
    /// the HTTP/1.1 pool when the server turned out not to speak HTTP/2) so that the caller
    /// need not copy every request in case.
    Unsent {
        request: Box<Request<Body>>,
        error: ConnectError,
    },
    /// The request failed on the connection.
    Failed(BoxError),
}

impl From<SendError> for BoxError {
    fn from(err: SendError) -> Self {
        match err {
            SendError::Unsent { error, .. } => Box::new(error),
            SendError::Failed(err) => err,
        }
    }
}

impl<C> Http2<C>
where
    C: Service<Uri> + Clone + Send + 'static,
    C::Response: Read + Write + Send + Unpin + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    /// A client that opens its connection with `connector` on the first request.
    pub(super) fn new(connector: C, keepalive: Keepalive) -> Self {
        Self {
            shared: Arc::new(Shared {
                connector,
                keepalive,
                slot: tokio::sync::Mutex::new(Slot::default()),
                attempts: AtomicU64::new(0),
            }),
        }
    }

    /// Sends `req` (its body is buffered: every body kube builds is) on the shared
    /// connection, once more on a new connection when the first could not take it.
    pub(super) async fn send(self, req: Request<Body>) -> Result<Response<Http2Body>, SendError> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| SendError::Failed(e.into()))?
            .to_bytes();
        let uri = parts.uri.clone();
        for attempt in 0..2 {
            let live = match self.connection(&uri).await {
                Ok(live) => live,
                // Not sent on any connection (a first attempt's stream was refused unsent).
                Err(error) => {
                    let request = Box::new(Request::from_parts(parts, Body::from(body)));
                    return Err(SendError::Unsent { request, error });
                }
            };
            let head = head(&parts);
            let retry = attempt == 0;
            let opened = match live.send.clone().ready().await {
                Ok(mut send) => send.send_request(head, body.is_empty()),
                Err(e) => Err(e),
            };
            let (response, mut stream) = match opened {
                Ok(sent) => sent,
                // Refusing new streams (GOAWAY, or the connection died): nothing was sent.
                Err(e) => {
                    live.closed.store(true, Ordering::Release);
                    if retry {
                        continue;
                    }
                    return Err(SendError::Failed(e.into()));
                }
            };
            if !body.is_empty() {
                // Buffered by h2 and sent as flow control allows; a failure here is the
                // stream's, and the response below reports it.
                let _ = stream.send_data(body.clone(), true);
            }
            match response.await {
                Ok(resp) => {
                    return Ok(resp.map(|recv| Http2Body {
                        recv,
                        data_done: false,
                    }));
                }
                Err(e) if retry && unprocessed(&e, &parts.method) => {
                    live.closed.store(true, Ordering::Release);
                    continue;
                }
                Err(e) => return Err(SendError::Failed(e.into())),
            }
        }
        Err(SendError::Failed(BoxError::from(
            "HTTP/2 connection refused the request twice",
        )))
    }

    /// The live connection, or a new one (one attempt at a time; the requests waiting for
    /// an attempt share its outcome).
    async fn connection(&self, uri: &Uri) -> Result<Live, ConnectError> {
        let seen = self.shared.attempts.load(Ordering::Acquire);
        let mut slot = self.shared.slot.lock().await;
        if let Some(live) = &slot.live
            && !live.closed.load(Ordering::Acquire)
        {
            return Ok(live.clone());
        }
        if self.shared.attempts.load(Ordering::Acquire) != seen
            && let Some(failure) = &slot.failure
        {
            return Err(ConnectError(BoxError::from(failure.to_string())));
        }
        slot.live = None;
        let connected = self.connect(uri).await;
        self.shared.attempts.fetch_add(1, Ordering::AcqRel);
        match connected {
            Ok(live) => {
                slot.failure = None;
                slot.live = Some(live.clone());
                Ok(live)
            }
            Err(e) => {
                slot.failure = Some(chain_text(&*e).into());
                Err(ConnectError(e))
            }
        }
    }

    async fn connect(&self, uri: &Uri) -> Result<Live, BoxError> {
        let mut connector = self.shared.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        let io = connector.call(uri.clone()).await.map_err(Into::into)?;
        let last_read = Arc::new(AtomicU64::new(now_millis()));
        let io = Tracked {
            io: TokioIo::new(io),
            last_read: last_read.clone(),
        };
        let (send, mut connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME_SIZE)
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .max_send_buffer_size(MAX_SEND_BUFFER)
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await?;
        let closed = Arc::new(AtomicBool::new(false));
        let pings = connection.ping_pong();
        // Boxed apart from the task: an async fn keeps its argument and the local it is moved
        // to as two slots, which for the connection (over a kilobyte with its TLS stream)
        // doubled the task (3 KB more per spoke, measured with `-Zprint-type-sizes`).
        tokio::spawn(drive(
            Box::pin(connection),
            pings,
            self.shared.keepalive,
            last_read,
            closed.clone(),
        ));
        Ok(Live { send, closed })
    }
}

/// The request head for h2 (its extensions are kube's and h2 reads none).
fn head(parts: &http::request::Parts) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = parts.method.clone();
    *head.uri_mut() = parts.uri.clone();
    *head.headers_mut() = parts.headers.clone();
    head
}

/// Whether a stream's failure before its response means the server did not act on it:
/// refused (`REFUSED_STREAM`), or cut by the server's `GOAWAY`. h2 fails the streams above
/// the GOAWAY's last stream id that way, but also streams cut when the connection ends
/// afterwards, so only reads are sent again on that evidence.
fn unprocessed(err: &h2::Error, method: &Method) -> bool {
    err.reason() == Some(h2::Reason::REFUSED_STREAM)
        || (err.is_go_away() && err.is_remote() && method == Method::GET)
}

/// Runs the connection, and closes it when a PING after `keepalive.interval` of read
/// silence goes unanswered for `keepalive.timeout`.
async fn drive<T>(
    mut connection: Pin<Box<h2::client::Connection<T, Bytes>>>,
    mut pings: Option<h2::PingPong>,
    keepalive: Keepalive,
    last_read: Arc<AtomicU64>,
    closed: Arc<AtomicBool>,
) where
    T: AsyncRead + AsyncWrite + Send + Unpin,
{
    // A zero interval would ping without pause; the hub's flags start at one second.
    let interval = keepalive.interval.max(Duration::from_millis(100));
    loop {
        let silent =
            Duration::from_millis(now_millis().saturating_sub(last_read.load(Ordering::Relaxed)));
        let wait = interval.saturating_sub(silent);
        if !wait.is_zero() {
            tokio::select! {
                _ = connection.as_mut() => break,
                () = tokio::time::sleep(wait) => continue,
            }
        }
        let Some(pings) = pings.as_mut() else {
            // h2 hands the PING handle out once; without it there is no keepalive.
            let _ = connection.as_mut().await;
            break;
        };
        let answered = tokio::select! {
            _ = connection.as_mut() => break,
            answer = tokio::time::timeout(keepalive.timeout, pings.ping(h2::Ping::opaque())) => answer,
        };
        if !matches!(answered, Ok(Ok(_))) {
            tracing::debug!(
                timeout = ?keepalive.timeout,
                "no answer to an HTTP/2 PING; closing the connection"
            );
            break;
        }
    }
    closed.store(true, Ordering::Release);
    // Dropping the connection closes the socket and fails every stream still open on it.
}

/// Milliseconds since the first call (a clock the connection tasks and their sockets share).
fn now_millis() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The socket under a connection, noting when it last read something (the PING's clock).
struct Tracked<T> {
    io: T,
    last_read: Arc<AtomicU64>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.last_read.store(now_millis(), Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response body read from its h2 stream, handing the flow-control window back as the
/// caller consumes it.
pub struct Http2Body {
    recv: h2::RecvStream,
    data_done: bool,
}

impl http_body::Body for Http2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // The stream is still open (or the release is moot): ignore.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    type Socket = TokioIo<tokio::io::DuplexStream>;

    /// A connector of the tests.
    type Connector = tower::util::BoxCloneSyncService<Uri, Socket, std::io::Error>;

    /// A connector that fails every attempt after `delay`, counting attempts.
    fn failing(delay: Duration, attempts: Arc<AtomicUsize>) -> Connector {
        Connector::new(tower::service_fn(move |_: Uri| {
            attempts.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connect timed out",
                ))
            })
        }))
    }

    fn get() -> Request<Body> {
        Request::get("https://spoke.test/version")
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn requests_waiting_for_a_failed_attempt_share_its_error() {
        let attempts = Arc::new(AtomicUsize::new(0));
        let h2 = Http2::new(
            failing(Duration::from_millis(200), attempts.clone()),
            Keepalive::default(),
        );
        let sent = (0..10).map(|_| h2.clone().send(get()));
        for result in futures::future::join_all(sent).await {
            let err = result
                .err()
                .expect("a request succeeded without a connection");
            assert!(matches!(err, SendError::Unsent { .. }), "{err:?}");
            let err = BoxError::from(err);
            assert!(err.to_string().contains("connect timed out"), "{err}");
        }
        assert_eq!(
            attempts.load(Ordering::SeqCst),
            1,
            "one attempt for the burst"
        );

        // A later request tries again.
        let err = h2.clone().send(get()).await.err().expect("no connection");
        assert!(matches!(err, SendError::Unsent { .. }), "{err:?}");
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
    }

    /// What the in-memory server does with the n-th stream it receives.
    #[derive(Clone, Copy)]
    enum Answer {
        Refuse,
        Ok,
        /// Reads the request, then drops the whole connection.
        Vanish,
    }

    /// A connector whose every connection is served in memory by `answers` (one per stream,
    /// across connections), counting the requests the server received.
    fn served(answers: Vec<Answer>, received: Arc<AtomicUsize>) -> Connector {
        let answers = Arc::new(std::sync::Mutex::new(answers.into_iter()));
        Connector::new(tower::service_fn(move |_: Uri| {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let answers = answers.clone();
            let received = received.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(server).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    received.fetch_add(1, Ordering::SeqCst);
                    let answer = answers.lock().unwrap().next().unwrap_or(Answer::Ok);
                    let mut body = req.into_body();
                    while let Some(Ok(_)) = body.data().await {}
                    match answer {
                        Answer::Refuse => respond.send_reset(h2::Reason::REFUSED_STREAM),
                        Answer::Ok => {
                            let resp = Response::new(());
                            let mut stream = respond.send_response(resp, false).unwrap();
                            stream.send_data(Bytes::from_static(b"done"), true).unwrap();
                        }
                        Answer::Vanish => return,
                    }
                }
            });
            Box::pin(async move { Ok(TokioIo::new(client)) })
        }))
    }

    fn post() -> Request<Body> {
        Request::post("https://spoke.test/api/v1/namespaces/a/configmaps")
            .body(Body::from(b"{}".to_vec()))
            .unwrap()
    }

    #[tokio::test]
    async fn a_refused_stream_is_sent_again() {
        let received = Arc::new(AtomicUsize::new(0));
        let h2 = Http2::new(
            served(vec![Answer::Refuse, Answer::Ok], received.clone()),
            Keepalive::default(),
        );
        let resp = h2.send(post()).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"done");
        assert_eq!(received.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_write_cut_by_a_vanished_connection_is_not_sent_again() {
        let received = Arc::new(AtomicUsize::new(0));
        let h2 = Http2::new(
            served(vec![Answer::Vanish, Answer::Ok], received.clone()),
            Keepalive::default(),
        );
        let err = h2
            .clone()
            .send(post())
            .await
            .err()
            .expect("the write was answered");
        assert!(matches!(err, SendError::Failed(_)), "{err:?}");
        assert_eq!(
            received.load(Ordering::SeqCst),
            1,
            "the write was sent once"
        );
        // The next request finds the connection gone and opens a new one.
        h2.send(get()).await.unwrap();
        assert_eq!(received.load(Ordering::SeqCst), 2);
    }
}
