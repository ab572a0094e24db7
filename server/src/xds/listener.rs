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
//! tonic's built-in `max_connection_age` has no per-connection jitter and cannot end a
//! long-lived ADS stream before its grace period, hence this module.

use crate::security::auth::TlsPeer;
use crate::security::tls::TlsServer;
use shoal_common::time::sleep_until;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
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
    shutdown: watch::Receiver<bool>,
    tls: Option<TlsServer>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut seq = 0u64;
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(error) => {
                        tracing::warn!(%error, "xDS accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
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
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Conn {
            peer,
            local,
            routes,
            policy,
            mut shutdown,
            seq,
        } = self;
        use tower_service::Service;
        let (close_tx, close_rx) = watch::channel(false);
        let svc =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(tonic::transport::server::TcpConnectInfo {
                        local_addr: local,
                        remote_addr: Some(peer),
                    });
                req.extensions_mut()
                    .insert(ConnectionClose(close_rx.clone()));
                if let Some(tls) = &tls {
                    req.extensions_mut().insert(tls.clone());
                }
                let mut routes = routes.clone();
                async move { routes.call(req.map(tonic::body::Body::new)).await }
            });
        let builder = {
            let mut b =
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
            b.timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(Some(Duration::from_secs(30)))
                .keep_alive_timeout(Duration::from_secs(10));
            b
        };
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
        tokio::pin!(conn);

        let age_deadline = policy.max_age.map(|a| Instant::now() + jittered(a, seq));
        let mut drain_at: Option<Instant> = None;
        let reason = loop {
            let next = match (age_deadline, drain_at) {
                (Some(a), Some(d)) => Some(a.min(d)),
                (a, d) => a.or(d),
            };
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%peer, %error, "xDS connection ended with an error");
                    }
                    return;
                }
                _ = sleep_until(next) => {
                    break if drain_at.is_some_and(|d| d <= Instant::now()) { "drain" } else { "max connection age" };
                }
                _ = became_true(&mut shutdown), if drain_at.is_none() => {
                    drain_at = Some(Instant::now() + policy.drain.mul_f64(random_unit(seq)));
                }
            }
        };
        tracing::debug!(%peer, reason, "closing xDS connection gracefully");
        let _ = close_tx.send(true);
        conn.as_mut().graceful_shutdown();
        if tokio::time::timeout(policy.grace, conn.as_mut())
            .await
            .is_err()
        {
            tracing::debug!(%peer, "xDS connection did not close within the grace period; dropping it");
        }
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
