//! A connection's writes gathered per poll: by the kernel (a corked socket), or here.
//!
//! h2 writes every DATA frame with a write of its own, and a frame is at most what the
//! proxy allows (16 KiB for Envoy): a VirtualService change that sends 2 000 proxies a
//! 425 KB route table each was 52 000 `writev` calls, each a pass through the TCP stack.
//! [`Gathered`] takes what h2 writes during one poll of the connection into a buffer,
//! and [`Gathered::drain`], called by the connection's task after every poll, writes it
//! out with as few calls as the socket takes — what Go's gRPC does with its buffered
//! writer, flushed when the writer has nothing more to send. Nothing waits on a timer: a
//! poll's writes leave when the poll ends.
//!
//! At most `--xds-write-gather` bytes are gathered; a write beyond it first writes the
//! buffer out, and a write the empty buffer cannot hold goes to the socket as it is. The
//! buffer is released once written, so an idle connection holds none. The default, 0,
//! gathers nothing: each write goes to the socket as h2 makes it.
//!
//! The trade: a large response is copied once more (into the buffer) for a fifth of the
//! system calls. At 2 000 proxies a VirtualService change copies 850 MB this way, a third
//! of the server's CPU for it; without gathering it makes 52 000 `writev` calls instead of
//! 18 000. On the machines measured (docs/benchmarks.md) the copy cost more than the
//! calls it saved, so gathering is off unless configured (it was measured with 64 KiB,
//! four of Envoy's largest frames), for machines where system calls cost more (sandboxed
//! runtimes).
//!
//! What the calls cost was mostly not the calls: each 16 KiB write was a TCP segment of
//! its own, sent through the stack at once (and, to a proxy on the same host, received
//! there too). So by default (`--xds-write-cork`) the second write of a poll corks the
//! socket (`TCP_CORK`) and the drain uncorks it: the kernel appends each write to the
//! segment it is filling and sends full segments, with no copy in user space. A poll that
//! writes once, such as an endpoint push's, is not corked (no extra system calls). At
//! 2 000 proxies this took a VirtualService change's server CPU down by 8 – 24 %
//! (docs/benchmarks.md).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection whose TCP socket [`Gathered`] can cork (`TCP_CORK`): while corked, the
/// kernel adds what each write brings to the segment being filled and sends only full
/// segments, until the poll ends and the socket is uncorked.
pub trait Corkable {
    /// The TCP socket under the connection, if any.
    fn tcp(&self) -> Option<&tokio::net::TcpStream>;
}

impl Corkable for tokio::net::TcpStream {
    fn tcp(&self) -> Option<&tokio::net::TcpStream> {
        Some(self)
    }
}

impl Corkable for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {
    fn tcp(&self) -> Option<&tokio::net::TcpStream> {
        Some(self.get_ref().0)
    }
}

#[cfg(test)]
impl Corkable for tokio::io::DuplexStream {
    fn tcp(&self) -> Option<&tokio::net::TcpStream> {
        None
    }
}

/// Sets or clears `TCP_CORK` (Linux's; elsewhere an error, and the connection is not
/// corked).
fn set_cork(tcp: &tokio::net::TcpStream, on: bool) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    return Ok(rustix::net::sockopt::set_tcp_cork(tcp, on)?);
    #[cfg(not(target_os = "linux"))]
    return Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "TCP_CORK is Linux's",
    ));
}

/// How a connection's writes leave: `--xds-write-gather` and `--xds-write-cork`.
#[derive(Clone, Copy, Debug)]
pub struct WriteShape {
    /// Most bytes gathered per poll (0: none).
    pub gather: usize,
    /// Whether a poll that writes more than once corks the socket (see [`Corkable`]).
    pub cork: bool,
}

/// Bytes gathered unless configured otherwise: none (see the module).
pub const DEFAULT_WRITE_GATHER: usize = 0;

/// A buffer that is to hold more than this is given the whole limit at once, so that a
/// poll's large writes are copied into it once, not again at every doubling.
const SMALL: usize = 4 << 10;

/// A socket whose writes are gathered until [`Gathered::drain`] (see the module). Clones
/// share the socket: one is given to HTTP/2, the connection's task keeps one to drain.
pub struct Gathered<T> {
    shared: Arc<Mutex<Shared<T>>>,
}

struct Shared<T> {
    io: T,
    buf: Vec<u8>,
    /// Most bytes gathered (0: none).
    limit: usize,
    /// The error writing the buffer out met, returned by the next write.
    failed: Option<io::Error>,
    /// Whether a poll that writes more than once corks the socket (see [`Corkable`]).
    cork: bool,
    /// Writes to the socket in this poll.
    writes: u32,
    /// Whether the socket is corked (until the poll ends).
    corked: bool,
}

impl<T> Clone for Gathered<T> {
    fn clone(&self) -> Self {
        Gathered {
            shared: self.shared.clone(),
        }
    }
}

impl<T: AsyncWrite + Corkable + Unpin> Gathered<T> {
    /// `io`, with its writes gathered and its socket corked as `shape` says.
    pub fn new(io: T, shape: WriteShape) -> Gathered<T> {
        Gathered {
            shared: Arc::new(Mutex::new(Shared {
                io,
                buf: Vec::new(),
                limit: shape.gather,
                failed: None,
                cork: shape.cork,
                writes: 0,
                corked: false,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared<T>> {
        // Nothing panics while holding it; a poisoned lock still holds a usable socket.
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes out what was gathered: `Ready` once all of it is written and flushed (or
    /// writing failed: the error is kept for the next write), `Pending` while the socket
    /// takes no more (the task is woken when it does).
    pub fn drain(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut shared = self.lock();
        let out = match shared.write_out(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Ready(Err(error)) => {
                shared.failed = Some(error);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        };
        shared.uncork();
        out
    }
}

impl<T: AsyncWrite + Corkable + Unpin> Shared<T> {
    /// Before a write to the socket: the second write of a poll corks it, so that what
    /// the poll writes after its first leaves in full segments when the poll ends.
    fn before_write(&mut self) {
        self.writes = self.writes.saturating_add(1);
        if self.cork && !self.corked && self.writes > 1 {
            let Some(tcp) = self.io.tcp() else {
                self.cork = false;
                return;
            };
            match set_cork(tcp, true) {
                Ok(()) => self.corked = true,
                Err(error) => {
                    tracing::debug!(%error, "cannot cork an xDS connection's socket; writing as it comes");
                    self.cork = false;
                }
            }
        }
    }

    /// When a poll ends: what the corked socket holds leaves now.
    fn uncork(&mut self) {
        self.writes = 0;
        if !std::mem::take(&mut self.corked) {
            return;
        }
        if let Some(tcp) = self.io.tcp() {
            if let Err(error) = set_cork(tcp, false) {
                // The kernel sends a corked segment within 200 ms anyway.
                tracing::debug!(%error, "cannot uncork an xDS connection's socket");
                self.cork = false;
            }
        }
    }

    /// Writes the buffer out and flushes the socket.
    fn write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut written = 0;
        let result = loop {
            if written == self.buf.len() {
                break Poll::Ready(Ok(()));
            }
            self.before_write();
            match Pin::new(&mut self.io).poll_write(cx, &self.buf[written..]) {
                Poll::Ready(Ok(0)) => break Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => written += n,
                Poll::Ready(Err(e)) => break Poll::Ready(Err(e)),
                Poll::Pending => break Poll::Pending,
            }
        };
        match result {
            Poll::Ready(Ok(())) => {
                // Released, not kept: an idle connection holds no buffer.
                self.buf = Vec::new();
                Pin::new(&mut self.io).poll_flush(cx)
            }
            Poll::Ready(Err(e)) => {
                self.buf = Vec::new();
                Poll::Ready(Err(e))
            }
            Poll::Pending => {
                self.buf.drain(..written);
                Poll::Pending
            }
        }
    }

    /// Room for `len` more bytes: the buffer written out first if it would pass the limit.
    fn room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<()>> {
        if let Some(error) = self.failed.take() {
            return Poll::Ready(Err(error));
        }
        if !self.buf.is_empty() && self.buf.len() + len > self.limit {
            return self.write_out(cx);
        }
        Poll::Ready(Ok(()))
    }

    /// Whether a write of `len` bytes goes to the socket as it comes: after [`Self::room`],
    /// one an empty buffer cannot hold (with no limit, every write).
    fn direct(&self, len: usize) -> bool {
        self.buf.is_empty() && len > self.limit
    }

    /// Room for `len` more bytes in the buffer itself (see [`SMALL`]).
    fn reserve(&mut self, len: usize) {
        let needed = self.buf.len() + len;
        if needed > self.buf.capacity() && needed > SMALL {
            let have = self.buf.len();
            self.buf.reserve_exact(self.limit.max(needed) - have);
        }
    }
}

impl<T: AsyncWrite + Corkable + Unpin> AsyncWrite for Gathered<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut shared = self.lock();
        match shared.room(cx, data.len()) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if shared.direct(data.len()) {
            shared.before_write();
            return Pin::new(&mut shared.io).poll_write(cx, data);
        }
        shared.reserve(data.len());
        shared.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let mut shared = self.lock();
        match shared.room(cx, len) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if shared.direct(len) {
            shared.before_write();
            return Pin::new(&mut shared.io).poll_write_vectored(cx, bufs);
        }
        shared.reserve(len);
        for b in bufs {
            shared.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Gathered bytes are written by [`Gathered::drain`] when the poll ends; a flush only
    /// reports an earlier failure.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.lock().failed.take() {
            Some(error) => Poll::Ready(Err(error)),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut shared = self.lock();
        if let Some(error) = shared.failed.take() {
            return Poll::Ready(Err(error));
        }
        match shared.write_out(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut shared.io).poll_shutdown(cx),
            other => other,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Corkable + Unpin> AsyncRead for Gathered<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.lock().io).poll_read(cx, buf)
    }
}

/// `future` (a connection's), with `io`'s gathered writes drained after every poll.
pub async fn drained<F: std::future::Future, T: AsyncWrite + Corkable + Unpin>(
    future: Pin<&mut F>,
    io: &Gathered<T>,
) -> F::Output {
    let mut future = future;
    std::future::poll_fn(|cx| {
        let out = future.as_mut().poll(cx);
        // Pending: the socket's readiness wakes this task to write the rest.
        let _ = io.drain(cx);
        out
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The limit measured in docs/benchmarks.md.
    const GATHER_LIMIT: usize = 64 << 10;

    #[tokio::test]
    async fn writes_leave_when_drained_and_in_order() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let gathered = Gathered::new(
            a,
            WriteShape {
                gather: GATHER_LIMIT,
                cork: true,
            },
        );
        let mut writer = gathered.clone();
        writer.write_all(b"frame one ").await.unwrap();
        writer.write_all(b"frame two").await.unwrap();
        writer.flush().await.unwrap();
        // Nothing on the wire until drained.
        let mut got = [0u8; 64];
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), b.read(&mut got));
        assert!(early.await.is_err(), "gathered bytes left before the drain");
        std::future::poll_fn(|cx| gathered.drain(cx)).await;
        let n = b.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"frame one frame two");
        assert!(
            gathered.lock().buf.capacity() == 0,
            "the buffer is released"
        );
    }

    #[tokio::test]
    async fn large_writes_get_the_whole_limit_at_once_and_no_limit_gathers_nothing() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let gathered = Gathered::new(
            a,
            WriteShape {
                gather: GATHER_LIMIT,
                cork: true,
            },
        );
        let mut writer = gathered.clone();
        writer.write_all(&[1u8; 100]).await.unwrap();
        assert!(
            gathered.lock().buf.capacity() < SMALL,
            "a small push stays small"
        );
        writer.write_all(&[2u8; 16 << 10]).await.unwrap();
        assert_eq!(gathered.lock().buf.capacity(), GATHER_LIMIT);
        writer.write_all(&[3u8; 16 << 10]).await.unwrap();
        assert_eq!(
            gathered.lock().buf.capacity(),
            GATHER_LIMIT,
            "not grown again"
        );

        let (a, mut direct) = tokio::io::duplex(1 << 20);
        let ungathered = Gathered::new(
            a,
            WriteShape {
                gather: 0,
                cork: true,
            },
        );
        let mut writer = ungathered.clone();
        writer.write_all(b"as it comes").await.unwrap();
        let mut got = [0u8; 16];
        let n = direct.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"as it comes", "on the wire without a drain");
        assert_eq!(ungathered.lock().buf.capacity(), 0);
        std::future::poll_fn(|cx| gathered.drain(cx)).await;
        let mut all = vec![0u8; 100 + (32 << 10)];
        b.read_exact(&mut all).await.unwrap();
        assert!(all[..100].iter().all(|x| *x == 1) && all[100..].iter().all(|x| *x > 1));
    }

    #[tokio::test]
    async fn a_full_buffer_is_written_before_more_is_taken() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let gathered = Gathered::new(
            a,
            WriteShape {
                gather: GATHER_LIMIT,
                cork: true,
            },
        );
        let mut writer = gathered.clone();
        let big = vec![7u8; GATHER_LIMIT - 10];
        writer.write_all(&big).await.unwrap();
        writer.write_all(&[8u8; 100]).await.unwrap();
        assert_eq!(gathered.lock().buf.len(), 100, "the first write went out");
        let mut first = vec![0u8; big.len()];
        b.read_exact(&mut first).await.unwrap();
        assert_eq!(first, big);
    }

    #[tokio::test]
    async fn a_socket_that_takes_no_more_holds_the_writer_back() {
        // The peer reads nothing: 4 KiB of room.
        let (a, mut b) = tokio::io::duplex(4 << 10);
        let gathered = Gathered::new(
            a,
            WriteShape {
                gather: GATHER_LIMIT,
                cork: true,
            },
        );
        let mut writer = gathered.clone();
        writer.write_all(&vec![1u8; GATHER_LIMIT]).await.unwrap();
        let pending = std::future::poll_fn(|cx| gathered.drain(cx));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), pending)
                .await
                .is_err(),
            "the drain waits for room"
        );
        // Past the limit (the drain wrote 4 KiB: room for that much only).
        let more = writer.write_all(&[2u8; 8 << 10]);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), more)
                .await
                .is_err(),
            "no more is taken past the limit while the socket is full"
        );
        // The peer reads: everything arrives, in order.
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            b.read_to_end(&mut all).await.unwrap();
            all
        });
        writer.write_all(&[2u8; 8 << 10]).await.unwrap();
        std::future::poll_fn(|cx| gathered.drain(cx)).await;
        writer.shutdown().await.unwrap();
        drop(writer);
        drop(gathered);
        let all = reader.await.unwrap();
        assert_eq!(all.len(), GATHER_LIMIT + (8 << 10));
        assert!(all[..GATHER_LIMIT].iter().all(|b| *b == 1));
        assert!(all[GATHER_LIMIT..].iter().all(|b| *b == 2));
    }

    #[tokio::test]
    async fn a_poll_that_writes_twice_corks_the_socket_until_it_ends() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let gathered = Gathered::new(
            server,
            WriteShape {
                gather: 0,
                cork: true,
            },
        );
        let corked = || {
            let shared = gathered.lock();
            rustix::net::sockopt::tcp_cork(shared.io.tcp().unwrap()).unwrap()
        };
        let mut writer = gathered.clone();
        writer.write_all(b"one ").await.unwrap();
        assert!(!corked(), "a poll's first write goes as it comes");
        writer.write_all(b"two").await.unwrap();
        assert!(corked(), "its second corks the socket");
        std::future::poll_fn(|cx| gathered.drain(cx)).await;
        assert!(!corked(), "uncorked when the poll ends");
        let mut got = [0u8; 7];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"one two");

        // Not asked to: never corked.
        let connect = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
        let (accepted, _client) = tokio::join!(listener.accept(), connect);
        let server = accepted.unwrap().0;
        let plain = Gathered::new(
            server,
            WriteShape {
                gather: 0,
                cork: false,
            },
        );
        let mut writer = plain.clone();
        writer.write_all(b"one ").await.unwrap();
        writer.write_all(b"two").await.unwrap();
        let shared = plain.lock();
        assert!(!rustix::net::sockopt::tcp_cork(shared.io.tcp().unwrap()).unwrap());
    }

    #[tokio::test]
    async fn a_failed_write_out_is_reported_by_the_next_write() {
        let (a, b) = tokio::io::duplex(1 << 10);
        drop(b);
        let gathered = Gathered::new(
            a,
            WriteShape {
                gather: GATHER_LIMIT,
                cork: true,
            },
        );
        let mut writer = gathered.clone();
        writer.write_all(b"lost").await.unwrap();
        std::future::poll_fn(|cx| gathered.drain(cx)).await;
        assert!(writer.write_all(b"more").await.is_err());
    }
}
