//! A read-ahead buffer between a spoke's socket and TLS.
//!
//! rustls reads the socket at most 4 KiB at a time, and tokio-rustls reads until a TLS record
//! is complete: a burst of watch events and responses on a spoke's one HTTP/2 connection
//! (tens of kilobytes when many streams answer at once) cost one `recv` system call per
//! 4 KiB, then one more that finds the socket drained. [`ReadAhead`] takes what the socket
//! has in one call of up to [`READ_AHEAD`] bytes and serves TLS's reads from it.
//!
//! Its buffer exists only while it holds unread bytes: it is freed as soon as TLS has taken
//! them all, so an idle connection (a hub holds one per spoke) keeps nothing, and a reader
//! that asks for as much as the buffer would hold reads the socket directly.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, BytesMut};
use futures::TryFutureExt as _;
use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tower::Service;

/// Bytes taken from the socket at most per read: 32 KiB, the largest allocation jemalloc
/// serves from its per-thread cache (the buffer is allocated for each burst and freed after).
pub(super) const READ_AHEAD: usize = 32 * 1024;

/// A socket whose reads go through a read-ahead buffer (see the module documentation).
#[derive(Debug)]
pub(super) struct ReadAhead<T> {
    io: T,
    /// Read from the socket, not yet taken by the reader; no allocation when empty.
    pending: BytesMut,
}

impl<T> ReadAhead<T> {
    pub(super) fn new(io: T) -> Self {
        Self {
            io,
            pending: BytesMut::new(),
        }
    }
}

impl<T: Read + Unpin> Read for ReadAhead<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut dst: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_empty() {
            if dst.remaining() >= READ_AHEAD {
                return Pin::new(&mut this.io).poll_read(cx, dst);
            }
            this.pending.reserve(READ_AHEAD);
            // tokio's reader fills the spare capacity without zeroing it first.
            let mut socket = TokioIo::new(&mut this.io);
            match tokio_util::io::poll_read_buf(Pin::new(&mut socket), cx, &mut this.pending) {
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.pending = BytesMut::new();
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => {
                    this.pending = BytesMut::new();
                    return Poll::Pending;
                }
            }
            if this.pending.is_empty() {
                // End of stream: read nothing, as the socket did.
                this.pending = BytesMut::new();
                return Poll::Ready(Ok(()));
            }
        }
        let n = this.pending.len().min(dst.remaining());
        dst.put_slice(&this.pending[..n]);
        this.pending.advance(n);
        if this.pending.is_empty() {
            // Freed rather than kept: see the module documentation.
            this.pending = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: Write + Unpin> Write for ReadAhead<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T: Connection> Connection for ReadAhead<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

/// A connector whose sockets read ahead ([`ReadAhead`]).
#[derive(Clone, Debug)]
pub(super) struct ReadAheadConnector<C>(pub(super) C);

impl<C> Service<Uri> for ReadAheadConnector<C>
where
    C: Service<Uri>,
{
    type Response = ReadAhead<C::Response>;
    type Error = C::Error;
    type Future = futures::future::MapOk<C::Future, fn(C::Response) -> ReadAhead<C::Response>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        self.0
            .call(uri)
            .map_ok(ReadAhead::new as fn(C::Response) -> ReadAhead<C::Response>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A socket counting the reads it is asked for.
    struct Counting<T> {
        io: T,
        reads: Arc<AtomicUsize>,
    }

    impl<T: Read + Unpin> Read for Counting<T> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            dst: ReadBufCursor<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            this.reads.fetch_add(1, Ordering::SeqCst);
            Pin::new(&mut this.io).poll_read(cx, dst)
        }
    }

    /// Reads `total` bytes from `reader` 4 KiB at a time (as rustls does).
    async fn read_in_4k<R: tokio::io::AsyncRead + Unpin>(reader: &mut R, total: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        while got.len() < total {
            let n = reader.read(&mut chunk).await.unwrap();
            assert!(n > 0, "ended after {} of {total} bytes", got.len());
            got.extend_from_slice(&chunk[..n]);
        }
        got
    }

    /// `total` bytes written at once by the peer, read 4 KiB at a time: returns what was
    /// read and how many reads reached the socket.
    async fn burst(total: usize, read_ahead: bool) -> (Vec<u8>, usize) {
        let (client, mut server) = tokio::io::duplex(256 * 1024);
        let sent: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        server.write_all(&sent).await.unwrap();
        let reads = Arc::new(AtomicUsize::new(0));
        let socket = Counting {
            io: TokioIo::new(client),
            reads: reads.clone(),
        };
        let got = if read_ahead {
            read_in_4k(&mut TokioIo::new(ReadAhead::new(socket)), total).await
        } else {
            read_in_4k(&mut TokioIo::new(socket), total).await
        };
        assert_eq!(got, sent, "the bytes arrive unchanged and in order");
        (got, reads.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_burst_takes_one_socket_read_per_32_kib() {
        let total = 80 * 1024;
        let (_, direct) = burst(total, false).await;
        let (_, ahead) = burst(total, true).await;
        assert_eq!(direct, 20, "4 KiB reads straight from the socket");
        assert_eq!(ahead, 3, "32 + 32 + 16 KiB");
    }

    #[tokio::test]
    async fn the_buffer_is_freed_once_taken_and_the_end_passes_through() {
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        let mut ahead = TokioIo::new(ReadAhead::new(TokioIo::new(client)));
        server.write_all(&[7u8; 6000]).await.unwrap();
        let mut chunk = [0u8; 4096];
        assert_eq!(ahead.read(&mut chunk).await.unwrap(), 4096);
        assert!(
            ahead.inner().pending.capacity() >= 6000 - 4096,
            "the rest is held"
        );
        assert_eq!(ahead.read(&mut chunk).await.unwrap(), 6000 - 4096);
        assert_eq!(ahead.inner().pending.capacity(), 0, "drained: nothing kept");
        drop(server);
        assert_eq!(ahead.read(&mut chunk).await.unwrap(), 0, "end of stream");
        assert_eq!(ahead.inner().pending.capacity(), 0);
    }

    #[tokio::test]
    async fn a_large_read_goes_straight_to_the_socket() {
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        let mut ahead = TokioIo::new(ReadAhead::new(TokioIo::new(client)));
        server.write_all(&[1u8; 40 * 1024]).await.unwrap();
        let mut large = vec![0u8; READ_AHEAD];
        let n = ahead.read(&mut large).await.unwrap();
        assert_eq!(n, READ_AHEAD);
        assert_eq!(
            ahead.inner().pending.capacity(),
            0,
            "not copied through the buffer"
        );
    }
}
