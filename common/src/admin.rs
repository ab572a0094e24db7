//! The HTTP/1.1 server behind both binaries' admin ports (`/ready`, `/healthz`, `/metrics`,
//! `/debug/*`): each binary supplies only its routes.
//!
//! Whoever reaches the port is unauthenticated, so what one client can hold is bounded
//! ([`AdminLimits`]): a request's headers must arrive within the header timeout (which
//! also bounds how long a kept-alive connection waits for its next request), request
//! bodies are never waited for (no route reads one: hyper drops what has not arrived),
//! every connection is closed at the connection timeout whatever it is doing (a client
//! that stops reading its response), and connections are capped, per client address too,
//! so that one client cannot take every slot from the kubelet's probes. A connection over
//! a cap is closed as soon as it is accepted; an accept that fails (out of file
//! descriptors) is retried with a growing backoff, never in a spin.

use crate::time as shoal_time;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// A complete response body.
pub type Body = Full<Bytes>;

/// The admin port's flags of both binaries: `--debug-from-anywhere` and the bounds on its
/// connections.
#[derive(Debug, Clone, clap::Args)]
pub struct DebugArgs {
    /// Serve the /debug endpoints to every client of the admin port. By default they
    /// answer only on localhost (kubectl port-forward), as they reveal mesh state and
    /// proxies' configuration.
    #[arg(
        long,
        env = "SHOAL_DEBUG_FROM_ANYWHERE",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub debug_from_anywhere: bool,

    /// Time an admin client has to send a request's headers; also the longest a kept-alive
    /// admin connection waits for its next request. "0s" disables it.
    #[arg(
        long,
        env = "SHOAL_ADMIN_HEADER_TIMEOUT",
        default_value = "10s",
        value_name = "DURATION"
    )]
    pub admin_header_timeout: crate::model::Duration,

    /// Longest an admin connection stays open, whatever it is doing (a client that stops
    /// reading its response is cut off). "0s" disables it.
    #[arg(
        long,
        env = "SHOAL_ADMIN_CONNECTION_TIMEOUT",
        default_value = "60s",
        value_name = "DURATION"
    )]
    pub admin_connection_timeout: crate::model::Duration,

    /// Most admin connections open at once (a quarter of them per client address); one
    /// more is closed as soon as it is accepted.
    #[arg(
        long,
        env = "SHOAL_ADMIN_MAX_CONNECTIONS",
        default_value_t = 64,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub admin_max_connections: u32,
}

impl DebugArgs {
    /// The access the flag gives.
    pub fn access(&self) -> DebugAccess {
        DebugAccess::from_anywhere(self.debug_from_anywhere)
    }

    /// The access and bounds the flags set.
    pub fn policy(&self) -> AdminPolicy {
        AdminPolicy {
            debug: self.access(),
            limits: self.limits(),
        }
    }

    /// The bounds the flags set.
    pub fn limits(&self) -> AdminLimits {
        AdminLimits {
            header_timeout: nonzero(self.admin_header_timeout.get()),
            connection_timeout: nonzero(self.admin_connection_timeout.get()),
            max_connections: self.admin_max_connections as usize,
        }
    }
}

/// `None` for a zero duration (a bound turned off).
fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Bounds on the admin port's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminLimits {
    /// Time to send a request's headers, and a kept-alive connection's wait for the next
    /// (None: unbounded).
    pub header_timeout: Option<Duration>,
    /// Longest a connection stays open (None: unbounded).
    pub connection_timeout: Option<Duration>,
    /// Most connections open at once; a quarter of them (at least one) per client address.
    pub max_connections: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            header_timeout: Some(Duration::from_secs(10)),
            connection_timeout: Some(Duration::from_secs(60)),
            max_connections: 64,
        }
    }
}

/// Who may read `/debug` and what bounds the connections: everything [`serve`] needs
/// besides the routes.
#[derive(Debug, Clone, Copy)]
pub struct AdminPolicy {
    /// Who may read `/debug/*`.
    pub debug: DebugAccess,
    /// Bounds on connections.
    pub limits: AdminLimits,
}

/// Open admin connections, in total and per client address.
#[derive(Debug, Clone)]
struct Slots {
    max: usize,
    per_address: usize,
    open: Arc<Mutex<(usize, HashMap<IpAddr, usize>)>>,
}

/// One open connection's slot; given back when dropped.
struct Slot {
    slots: Slots,
    address: IpAddr,
}

impl Slots {
    fn new(max: usize) -> Slots {
        Slots {
            max,
            per_address: (max / 4).max(1),
            open: Arc::default(),
        }
    }

    fn open(&self, address: IpAddr) -> Option<Slot> {
        let address = address.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per) = &mut *open;
        let of_address = per.entry(address).or_insert(0);
        if *total >= self.max || *of_address >= self.per_address {
            if *of_address == 0 {
                per.remove(&address);
            }
            return None;
        }
        *of_address += 1;
        *total += 1;
        Some(Slot {
            slots: self.clone(),
            address,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(n) = per.get_mut(&self.address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per.remove(&self.address);
            }
        }
    }
}

/// Shortest and longest wait after a failed accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How often a refused or failed accept is logged at most.
const WARN_INTERVAL: Duration = Duration::from_secs(30);

/// Time a connection cut at the connection timeout gets to finish a response in flight.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Whether to log now: at most once per [`WARN_INTERVAL`].
fn log_now(last: &mut Option<Instant>) -> bool {
    let now = Instant::now();
    if last.is_some_and(|l| now.duration_since(l) < WARN_INTERVAL) {
        return false;
    }
    *last = Some(now);
    true
}

/// Who may read the `/debug/*` endpoints, which reveal the mesh's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugAccess {
    /// Only clients on the loopback interface (`kubectl port-forward`, `kubectl exec`): the
    /// default.
    Localhost,
    /// Any client that reaches the admin port.
    Anywhere,
}

impl DebugAccess {
    /// From a `--debug-from-anywhere` flag.
    pub fn from_anywhere(anywhere: bool) -> Self {
        if anywhere {
            DebugAccess::Anywhere
        } else {
            DebugAccess::Localhost
        }
    }

    fn allows(self, path: &str, peer: std::net::IpAddr) -> bool {
        self == DebugAccess::Anywhere
            || !path.starts_with("/debug")
            || peer.to_canonical().is_loopback()
    }
}

/// Serves `route` on a bound listener until the task is dropped. `/debug/*` requests from
/// clients `policy.debug` does not allow get 403; connections are bounded by
/// `policy.limits`.
pub async fn serve<F>(listener: TcpListener, policy: AdminPolicy, route: F)
where
    F: Fn(Request<Incoming>) -> Response<Body> + Clone + Send + Sync + 'static,
{
    let AdminPolicy { debug, limits } = policy;
    let slots = Slots::new(limits.max_connections);
    let mut backoff = Duration::ZERO;
    let (mut warned_accept, mut warned_full) = (None, None);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => {
                backoff = Duration::ZERO;
                s
            }
            Err(error) => {
                // Out of file descriptors (EMFILE) and the like: the connection stays
                // queued and the next accept fails at once, so wait, longer each time.
                backoff = (backoff * 2).clamp(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
                if log_now(&mut warned_accept) {
                    tracing::warn!(%error, ?backoff, "admin accept failed");
                }
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        let Some(slot) = slots.open(peer.ip()) else {
            if log_now(&mut warned_full) {
                tracing::warn!(%peer, max = limits.max_connections, "refusing admin connection: too many open (--admin-max-connections)");
            }
            drop(stream);
            continue;
        };
        let route = route.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = if debug.allows(req.uri().path(), peer.ip()) {
                    route(req)
                } else {
                    response(
                        StatusCode::FORBIDDEN,
                        "text/plain; charset=utf-8",
                        "/debug endpoints reveal mesh configuration and answer only on \
                         localhost (use kubectl port-forward); start with \
                         --debug-from-anywhere to serve them to every client\n",
                    )
                };
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let lifetime = shoal_time::sleep_until(
                limits
                    .connection_timeout
                    .map(|t| tokio::time::Instant::now() + t),
            );
            let outcome = tokio::select! {
                result = conn.as_mut() => Ok(result),
                () = lifetime => Err(()),
            };
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%error, %peer, "admin connection ended with an error");
                }
                Err(_) => {
                    tracing::debug!(%peer, "admin connection open too long; closing it");
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
                }
            }
        });
    }
}

/// A response with a status, a content type and a body.
pub fn response(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{DebugAccess, Slots};

    #[test]
    fn slots_are_capped_in_total_and_per_address() {
        let slots = Slots::new(8);
        let a: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: std::net::IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..2).map(|_| slots.open(a).expect("a's share")).collect();
        assert!(
            slots.open(mapped).is_none(),
            "a's share of 2 is used, however written"
        );
        let others: Vec<_> = (2..8)
            .map(|i| {
                slots
                    .open(format!("10.0.0.{i}").parse().unwrap())
                    .expect("free")
            })
            .collect();
        assert!(
            slots.open("10.0.0.99".parse().unwrap()).is_none(),
            "8 in total"
        );
        drop(held);
        assert!(slots.open(a).is_some(), "given back");
        drop(others);
    }

    #[test]
    fn debug_endpoints_answer_only_on_loopback_by_default() {
        let remote = "10.0.0.7".parse().unwrap();
        let local = "127.0.0.1".parse().unwrap();
        let mapped = "::ffff:127.0.0.1".parse().unwrap();
        let d = DebugAccess::Localhost;
        assert!(!d.allows("/debug/configz", remote));
        assert!(d.allows("/debug/configz", local));
        assert!(d.allows("/debug/configz", mapped));
        assert!(d.allows("/metrics", remote));
        assert!(d.allows("/ready", remote));
        assert!(DebugAccess::Anywhere.allows("/debug/configz", remote));
    }
}
