//! A connection's writes gathered per poll.
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

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
}

impl<T> Clone for Gathered<T> {
    fn clone(&self) -> Self {
        Gathered {
            shared: self.shared.clone(),
        }
    }
}

impl<T: AsyncWrite + Unpin> Gathered<T> {
    /// `io`, with up to `limit` bytes of its writes gathered (0: written as they come).
    pub fn new(io: T, limit: usize) -> Gathered<T> {
        Gathered {
            shared: Arc::new(Mutex::new(Shared {
                io,
                buf: Vec::new(),
                limit,
                failed: None,
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
        match shared.write_out(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Ready(Err(error)) => {
                shared.failed = Some(error);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncWrite + Unpin> Shared<T> {
    /// Writes the buffer out and flushes the socket.
    fn write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut written = 0;
        let result = loop {
            if written == self.buf.len() {
                break Poll::Ready(Ok(()));
            }
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

impl<T: AsyncWrite + Unpin> AsyncWrite for Gathered<T> {
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

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Gathered<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.lock().io).poll_read(cx, buf)
    }
}

/// `future` (a connection's), with `io`'s gathered writes drained after every poll.
pub async fn drained<F: std::future::Future, T: AsyncWrite + Unpin>(
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
        let gathered = Gathered::new(a, GATHER_LIMIT);
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
        let gathered = Gathered::new(a, GATHER_LIMIT);
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
        let ungathered = Gathered::new(a, 0);
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
        let gathered = Gathered::new(a, GATHER_LIMIT);
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
        let gathered = Gathered::new(a, GATHER_LIMIT);
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
    async fn a_failed_write_out_is_reported_by_the_next_write() {
        let (a, b) = tokio::io::duplex(1 << 10);
        drop(b);
        let gathered = Gathered::new(a, GATHER_LIMIT);
        let mut writer = gathered.clone();
        writer.write_all(b"lost").await.unwrap();
        std::future::poll_fn(|cx| gathered.drain(cx)).await;
        assert!(writer.write_all(b"more").await.is_err());
    }
}
