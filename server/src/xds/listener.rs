//! The xDS listener: serves the gRPC routes over HTTP/2 connections it manages itself, so
//! that each connection can be aged out and drained gracefully.
//!
//! - **Rebalancing**: each connection lives for a jittered maximum age (`max_age` ± 10 %),
//!   then its ADS streams end cleanly and the connection sends GOAWAY. The proxy reconnects
//!   on a new connection, which its load balancer may place on any replica, so proxies
//!   spread over replicas after a scale-out. The jitter keeps connections opened together
//!   (e.g. after a rollout) from all reconnecting together.
//! - **Drain**: on shutdown, each connection closes at a random moment within the drain
//!   period rather than all at once, so the surviving replicas take over gradually.
//!
//! - **Bounds** ([`ConnectionLimits`]): connections are capped for the whole process (both
//!   ports): one over the cap is closed as soon as it is accepted, so file descriptors never
//!   run out under a connection flood; an accept that fails anyway (`EMFILE`) is retried
//!   with a growing backoff instead of in a spin. Each connection has a budget of request
//!   bytes being received ([`ConnectionBudget`], see [`super::wire::RequestStream`]), at
//!   most `max_streams` concurrent streams (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`), and
//!   is closed once it has had no stream for the idle timeout (a client that completed a
//!   TLS handshake and went silent holds nothing for long).
//!
//! tonic's built-in `max_connection_age` has no per-connection jitter and cannot end a
//! long-lived ADS stream before its grace period, hence this module.

use super::gather::{drained, Corkable, Gathered, WriteShape};
use super::limits::{Breach, BufferBudget, WarnLimiter};
use crate::security::auth::TlsPeer;
use crate::security::tls::TlsServer;
use crate::xds::metrics::XdsMetrics;
use bytes::Bytes;
use shoal_common::time::sleep_until;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How connections are aged and drained.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionPolicy {
    /// Maximum connection age before jitter (None: unlimited).
    pub max_age: Option<Duration>,
    /// Time a closing connection gets to finish before it is dropped.
    pub grace: Duration,
    /// Period over which connections are closed on shutdown.
    pub drain: Duration,
}

/// A per-connection signal, handed to request handlers as a request extension: when it turns
/// true the handler ends its stream cleanly.
#[derive(Clone, Debug)]
pub struct ConnectionClose(pub watch::Receiver<bool>);

/// The connection's budget of request bytes being received, handed to request handlers as
/// a request extension.
#[derive(Clone, Debug)]
pub struct ConnectionBudget(pub Arc<BufferBudget>);

/// What bounds the connections of a port.
#[derive(Clone)]
pub struct ConnectionLimits {
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` of each connection.
    pub max_streams: u32,
    /// Bytes of request messages being received that one connection may hold.
    pub connection_buffer: usize,
    /// The budget every connection's is part of: the process's, or for callers that are
    /// not authenticated (the plaintext port) their pool within it.
    pub shared_buffer: Arc<BufferBudget>,
    /// A connection without a stream for this long is closed (None: never).
    pub idle_timeout: Option<Duration>,
    /// Connection slots of the whole process (every port takes from the same ones).
    pub slots: Arc<Semaphore>,
    /// `shoal_xds_limits_exceeded_total` and `shoal_xds_open_connections`.
    pub metrics: XdsMetrics,
    /// How a connection's writes leave: gathered, corked (see [`Gathered`]).
    pub writes: WriteShape,
}

/// Shortest and longest wait after a failed accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Time an idle connection gets to close after its GOAWAY (it has no stream to finish).
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// A connection's slot among the process's; given back (and the gauge lowered) when the
/// connection ends.
struct Slot {
    _permit: OwnedSemaphorePermit,
    open: prometheus::IntGauge,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, open: prometheus::IntGauge) -> Slot {
        open.inc();
        Slot {
            _permit: permit,
            open,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// A random fraction in [0, 1), without a dependency on a RNG crate.
fn random_unit(seed: u64) -> f64 {
    let h = std::collections::hash_map::RandomState::new().hash_one(seed);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// `d` ± 10 %.
pub fn jittered(d: Duration, seed: u64) -> Duration {
    d.mul_f64(0.9 + 0.2 * random_unit(seed))
}

/// Time a client gets to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `routes` on `listener` until `shutdown` turns true, then drains every connection
/// within `policy.drain` (+ grace) and returns. With `tls`, every connection is TLS and its
/// requests carry the client's certificates ([`TlsPeer`]).
pub async fn serve(
    listener: TcpListener,
    routes: tonic::service::Routes,
    policy: ConnectionPolicy,
    limits: ConnectionLimits,
    shutdown: watch::Receiver<bool>,
    tls: Option<TlsServer>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut seq = 0u64;
    let mut stop = shutdown.clone();
    let mut backoff = Duration::ZERO;
    let mut warn_accept = WarnLimiter::default();
    let mut warn_full = WarnLimiter::default();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => {
                        backoff = Duration::ZERO;
                        a
                    }
                    Err(error) => {
                        // Out of file descriptors (EMFILE, ENFILE) and the like: the
                        // connection stays queued and the next accept fails at once, so
                        // wait, longer each time, rather than spin.
                        backoff = (backoff * 2).clamp(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
                        if let Some(suppressed) = warn_accept.check() {
                            tracing::warn!(%error, ?backoff, suppressed, "xDS accept failed");
                        }
                        tokio::time::sleep(backoff).await;
                        continue;
                    }
                };
                let Ok(permit) = limits.slots.clone().try_acquire_owned() else {
                    // Over the cap: closed at once, so it costs its descriptor only now.
                    limits
                        .metrics
                        .limits_exceeded
                        .with_label_values(&[Breach::Connections.label()])
                        .inc();
                    if let Some(suppressed) = warn_full.check() {
                        tracing::warn!(%peer, suppressed, "refusing xDS connection: the server has its maximum of connections (--xds-max-connections)");
                    }
                    drop(stream);
                    continue;
                };
                seq += 1;
                let _ = stream.set_nodelay(true);
                let conn = Conn {
                    peer,
                    local: stream.local_addr().ok(),
                    routes: routes.clone(),
                    policy,
                    shutdown: shutdown.clone(),
                    seq,
                    budget: BufferBudget::within(
                        &limits.shared_buffer,
                        limits.connection_buffer,
                        Breach::ConnectionBuffer,
                    ),
                    max_streams: limits.max_streams,
                    idle_timeout: limits.idle_timeout,
                    writes: limits.writes,
                    metrics: limits.metrics.clone(),
                    _slot: Slot::new(permit, limits.metrics.open_connections.clone()),
                };
                match &tls {
                    None => tasks.spawn(conn.serve(stream, None)),
                    Some(tls) => tasks.spawn(conn.handshake(stream, tls.acceptor())),
                };
            }
            _ = became_true(&mut stop) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    tracing::info!(connections = tasks.len(), drain = ?policy.drain, "draining xDS connections");
    let deadline = policy.drain + policy.grace + Duration::from_secs(1);
    if tokio::time::timeout(deadline, async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(
            left = tasks.len(),
            "xDS connections still open after the drain period; closing them"
        );
        tasks.abort_all();
    }
}

/// One accepted connection.
struct Conn {
    peer: SocketAddr,
    local: Option<SocketAddr>,
    routes: tonic::service::Routes,
    policy: ConnectionPolicy,
    shutdown: watch::Receiver<bool>,
    seq: u64,
    /// Its budget of request bytes being received.
    budget: Arc<BufferBudget>,
    max_streams: u32,
    idle_timeout: Option<Duration>,
    writes: WriteShape,
    metrics: XdsMetrics,
    /// Held for the connection's life.
    _slot: Slot,
}

impl Conn {
    /// Completes the TLS handshake, then serves the connection.
    async fn handshake(self, stream: tokio::net::TcpStream, acceptor: tokio_rustls::TlsAcceptor) {
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                tracing::info!(peer = %self.peer, %error, "xDS TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::info!(peer = %self.peer, "xDS TLS handshake timed out");
                return;
            }
        };
        let certs = tls
            .get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default();
        self.serve(tls, Some(TlsPeer(Arc::new(certs)))).await
    }

    /// Serves HTTP/2 on `io` until the connection ends, ages out or is drained.
    async fn serve<IO>(self, io: IO, tls: Option<TlsPeer>)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Corkable + Unpin + Send + 'static,
    {
        let Conn {
            peer,
            local,
            routes,
            policy,
            mut shutdown,
            seq,
            budget,
            max_streams,
            idle_timeout,
            writes,
            metrics,
            _slot,
        } = self;
        use tower_service::Service;
        let (close_tx, close_rx) = watch::channel(false);
        let (streams_tx, mut streams_rx) = watch::channel(0usize);
        let streams_tx = Arc::new(streams_tx);
        let svc = {
            let streams_tx = streams_tx.clone();
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                let open = OpenStream::new(streams_tx.clone());
                req.extensions_mut()
                    .insert(tonic::transport::server::TcpConnectInfo {
                        local_addr: local,
                        remote_addr: Some(peer),
                    });
                req.extensions_mut()
                    .insert(ConnectionClose(close_rx.clone()));
                req.extensions_mut()
                    .insert(ConnectionBudget(budget.clone()));
                if let Some(tls) = &tls {
                    req.extensions_mut().insert(tls.clone());
                }
                let mut routes = routes.clone();
                async move {
                    let response = routes.call(req.map(tonic::body::Body::new)).await;
                    // The stream counts as open until its response body is done or dropped.
                    response.map(|r| {
                        r.map(|body| tonic::body::Body::new(Counted { body, _open: open }))
                    })
                }
            })
        };
        let builder = {
            let mut b =
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
            b.timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(Some(Duration::from_secs(30)))
                .keep_alive_timeout(Duration::from_secs(10))
                .max_concurrent_streams(max_streams);
            b
        };
        // h2 writes each frame by itself; a poll's writes are gathered or corked until it
        // ends, as `writes` says.
        let io = Gathered::new(io, writes);
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io.clone()), svc);
        tokio::pin!(conn);

        let age_deadline = policy.max_age.map(|a| Instant::now() + jittered(a, seq));
        let mut drain_at: Option<Instant> = None;
        let mut idle_at = idle_timeout.map(|t| Instant::now() + t);
        let reason = loop {
            let next = [age_deadline, drain_at, idle_at]
                .into_iter()
                .flatten()
                .min();
            tokio::select! {
                result = drained(conn.as_mut(), &io) => {
                    if let Err(error) = result {
                        tracing::debug!(%peer, %error, "xDS connection ended with an error");
                    }
                    return;
                }
                _ = sleep_until(next) => {
                    let now = Instant::now();
                    if drain_at.is_some_and(|d| d <= now) {
                        break "drain";
                    }
                    if age_deadline.is_some_and(|a| a <= now) {
                        break "max connection age";
                    }
                    if idle_at.is_some_and(|i| i <= now) {
                        metrics
                            .limits_exceeded
                            .with_label_values(&[Breach::IdleConnection.label()])
                            .inc();
                        break "idle";
                    }
                }
                _ = became_true(&mut shutdown), if drain_at.is_none() => {
                    drain_at = Some(Instant::now() + policy.drain.mul_f64(random_unit(seq)));
                }
                Ok(()) = streams_rx.changed() => {
                    let open = *streams_rx.borrow_and_update();
                    idle_at = idle_timeout.filter(|_| open == 0).map(|t| Instant::now() + t);
                }
            }
        };
        tracing::debug!(%peer, reason, "closing xDS connection gracefully");
        let _ = close_tx.send(true);
        conn.as_mut().graceful_shutdown();
        // An idle connection has no stream to finish; one that never completed its HTTP/2
        // handshake would wait for it.
        let grace = if reason == "idle" {
            IDLE_CLOSE_GRACE
        } else {
            policy.grace
        };
        if tokio::time::timeout(grace, drained(conn.as_mut(), &io))
            .await
            .is_err()
        {
            tracing::debug!(%peer, "xDS connection did not close within the grace period; dropping it");
        }
    }
}

/// One open stream of a connection, counted in the connection's watch while it lives.
struct OpenStream(Arc<watch::Sender<usize>>);

impl OpenStream {
    fn new(streams: Arc<watch::Sender<usize>>) -> OpenStream {
        streams.send_modify(|n| *n += 1);
        OpenStream(streams)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A response body that keeps its stream counted as open.
struct Counted {
    body: tonic::body::Body,
    _open: OpenStream,
}

impl hyper::body::Body for Counted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, tonic::Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Resolves once the flag is true (never, if its sender is gone while false).
async fn became_true(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let d = Duration::from_secs(1800);
        let samples: Vec<Duration> = (0..200).map(|i| jittered(d, i)).collect();
        assert!(samples
            .iter()
            .all(|s| *s >= d.mul_f64(0.9) && *s <= d.mul_f64(1.1)));
        // Not all the same: the point of jitter.
        assert!(samples.iter().any(|s| *s != samples[0]));
    }
}
