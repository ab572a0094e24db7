//! Bounds on what one ADS stream keeps and logs, whatever its proxy sends, and on what
//! every caller may hold before it is authorized.
//!
//! A proxy is outside input: a broken or hostile one may send NACKs with megabytes of error
//! text, subscribe to millions of names, or repeat a bad request in a tight loop. What a
//! stream stores is capped here, and its per-request warnings are rate-limited
//! ([`WarnLimiter`]) so that one bad proxy cannot flood the log.
//!
//! Any client that reaches a port is outside input too, before it has proved anything:
//! request bytes being received are counted against nested budgets ([`BufferBudget`]:
//! the connection's, the unauthenticated connections' pool, the process's), streams are
//! capped per connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`) and per authenticated
//! identity ([`IdentityStreams`]), a started message has a deadline, and connections are
//! capped and closed when idle ([`super::listener`]). Each refusal is counted by its
//! [`Breach`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest NACK error message kept for `/debug/syncz` and logged (bytes; istiod likewise
/// keeps only the head of an error detail). Envoy's messages name the resource and the
/// field first, so the head is the useful part.
pub const MAX_NACK_DETAIL_BYTES: usize = 1024;

/// Longest proxy-sent version string kept (`acked_version`, a NACK's version). Versions
/// shoal sends are short hashes; anything longer is the proxy's own invention.
pub const MAX_VERSION_BYTES: usize = 256;

/// Most resource names one subscription (one type on one stream) may hold, and most names
/// (or `initial_resource_versions`) one request may carry. A request above it is refused
/// with `InvalidArgument`. A real proxy asks for one EDS name per cluster and one RDS name
/// per route table: even a gateway of a very large mesh (tens of thousands of services)
/// stays well below 100 000, while without a cap a 16 MiB request could make a stream hold
/// millions of names.
pub const MAX_NAMES_PER_SUBSCRIPTION: usize = 100_000;

/// How often a stream logs one kind of per-request warning at most (after the first).
pub const WARN_INTERVAL: Duration = Duration::from_secs(30);

/// `s` cut to at most `max` bytes on a character boundary, with a note of how much was cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes truncated)", &s[..end], s.len() - end)
}

/// Rate limit of one kind of warning: the first occurrence is logged, then at most one per
/// interval, reporting how many were suppressed in between.
#[derive(Debug)]
pub struct WarnLimiter {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Default for WarnLimiter {
    fn default() -> Self {
        WarnLimiter::new(WARN_INTERVAL)
    }
}

impl WarnLimiter {
    /// A limiter logging at most once per `interval`.
    pub fn new(interval: Duration) -> Self {
        WarnLimiter {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// Whether to log an occurrence now: `Some(n)` with the number of occurrences
    /// suppressed since the last one logged, or `None` to stay quiet.
    pub fn check(&mut self) -> Option<u64> {
        self.check_at(Instant::now())
    }

    /// [`WarnLimiter::check`] at a given time.
    pub fn check_at(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// A limiter shared by every stream of a service, for warnings logged once per stream
/// (a refused stream): a proxy reconnecting in a loop with the same bad request would
/// otherwise log a line per attempt.
pub type SharedWarnLimiter = std::sync::Arc<std::sync::Mutex<WarnLimiter>>;

/// [`WarnLimiter::check`] of a shared limiter.
pub fn check_shared(limiter: &SharedWarnLimiter) -> Option<u64> {
    limiter.lock().unwrap_or_else(|p| p.into_inner()).check()
}

/// Default budget of request bytes being received, for the whole process (`--xds-request-buffer`).
pub const DEFAULT_REQUEST_BUFFER_BYTES: usize = 256 << 20;

/// Default budget of request bytes being received on one TLS connection
/// (`--xds-connection-buffer`): one request of the largest size accepted.
pub const DEFAULT_CONNECTION_BUFFER_BYTES: usize = 16 << 20;

/// Default budget of request bytes being received on one plaintext (unauthenticated)
/// connection (`--xds-unauthenticated-buffer`). A sidecar's EDS request of ten thousand
/// clusters is about 600 KB.
pub const DEFAULT_UNAUTHENTICATED_BUFFER_BYTES: usize = 4 << 20;

/// All unauthenticated connections together may use this fraction (1/N) of the process
/// budget, so that callers who proved nothing can never starve those who did.
pub const UNAUTHENTICATED_SHARE: usize = 4;

/// Default `SETTINGS_MAX_CONCURRENT_STREAMS` of xDS connections. Envoy opens one ADS
/// stream per connection, istio-agent one plus short certificate calls.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 100;

/// Default cap on the streams one authenticated identity may have open on a replica. Many
/// pods may share one service account (a namespace's `default`), so it is generous; it
/// bounds what one stolen credential can open.
pub const DEFAULT_MAX_STREAMS_PER_IDENTITY: usize = 2048;

/// Default time a started request message has to arrive completely.
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Default time an xDS connection may stay open with no stream.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Most xDS connections the default cap allows, whatever the open-file limit.
pub const MAX_CONNECTIONS_CEILING: usize = 20_000;

/// A bound a caller hit: the `reason` label of `shoal_xds_limits_exceeded_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breach {
    /// A request message declared over the size limit; the stream ends with `OutOfRange`.
    MessageSize,
    /// The connection's budget of request bytes being received; `ResourceExhausted`.
    ConnectionBuffer,
    /// The budget shared by every unauthenticated connection; `ResourceExhausted`.
    UnauthenticatedBuffer,
    /// The process's budget; `ResourceExhausted`.
    ProcessBuffer,
    /// A started message did not arrive completely in time; `DeadlineExceeded`.
    MessageTimeout,
    /// The identity has its maximum of streams open; `ResourceExhausted` when opening.
    IdentityStreams,
    /// The server has its maximum of connections; the new one is closed when accepted.
    Connections,
    /// A connection had no stream for the idle timeout; it is closed.
    IdleConnection,
}

impl Breach {
    /// Every breach, for creating the metric's series.
    pub const ALL: [Breach; 8] = [
        Breach::MessageSize,
        Breach::ConnectionBuffer,
        Breach::UnauthenticatedBuffer,
        Breach::ProcessBuffer,
        Breach::MessageTimeout,
        Breach::IdentityStreams,
        Breach::Connections,
        Breach::IdleConnection,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Breach::MessageSize => "message_size",
            Breach::ConnectionBuffer => "connection_buffer",
            Breach::UnauthenticatedBuffer => "unauthenticated_buffer",
            Breach::ProcessBuffer => "process_buffer",
            Breach::MessageTimeout => "message_timeout",
            Breach::IdentityStreams => "identity_streams",
            Breach::Connections => "connections",
            Breach::IdleConnection => "idle_connection",
        }
    }
}

/// A refused [`BufferBudget::take`]: which budget refused, and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exhausted {
    /// Which budget.
    pub breach: Breach,
    /// Its limit in bytes.
    pub limit: usize,
}

impl Exhausted {
    /// The status ending the stream that asked.
    pub fn status(self) -> tonic::Status {
        let whose = match self.breach {
            Breach::ConnectionBuffer => "this connection's",
            Breach::UnauthenticatedBuffer => "the unauthenticated connections'",
            _ => "this server's",
        };
        tonic::Status::resource_exhausted(format!(
            "{whose} budget of {} bytes for requests being received is used up",
            self.limit
        ))
    }
}

/// A budget of request bytes received and not yet decoded (messages still arriving).
/// Budgets nest: taking from a connection's budget also takes from its parent (the
/// unauthenticated pool, the process), so every byte counts at every level above it.
#[derive(Debug)]
pub struct BufferBudget {
    limit: usize,
    used: AtomicUsize,
    breach: Breach,
    parent: Option<Arc<BufferBudget>>,
    /// Follows `used` (the process budget's `shoal_xds_request_buffer_bytes`).
    gauge: Option<prometheus::IntGauge>,
}

impl BufferBudget {
    /// The process's budget of `limit` bytes, shown on `gauge`.
    pub fn process(limit: usize, gauge: Option<prometheus::IntGauge>) -> Arc<BufferBudget> {
        Arc::new(BufferBudget {
            limit,
            used: AtomicUsize::new(0),
            breach: Breach::ProcessBuffer,
            parent: None,
            gauge,
        })
    }

    /// A budget of `limit` bytes inside `parent`; a refusal of its own is `breach`.
    pub fn within(parent: &Arc<BufferBudget>, limit: usize, breach: Breach) -> Arc<BufferBudget> {
        Arc::new(BufferBudget {
            limit,
            used: AtomicUsize::new(0),
            breach,
            parent: Some(parent.clone()),
            gauge: None,
        })
    }

    /// Takes `n` bytes from this budget and every one above it, or nothing at all.
    pub fn take(&self, n: usize) -> Result<(), Exhausted> {
        let refused = Exhausted {
            breach: self.breach,
            limit: self.limit,
        };
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|total| *total <= self.limit)
            })
            .map_err(|_| refused)?;
        if let Some(parent) = &self.parent {
            if let Err(refused) = parent.take(n) {
                self.used.fetch_sub(n, Ordering::AcqRel);
                return Err(refused);
            }
        }
        if let Some(gauge) = &self.gauge {
            gauge.add(i64::try_from(n).unwrap_or(i64::MAX));
        }
        Ok(())
    }

    /// Gives back `n` bytes taken before.
    pub fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
        if let Some(parent) = &self.parent {
            parent.give(n);
        }
        if let Some(gauge) = &self.gauge {
            gauge.sub(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Open streams per authenticated identity, each at most `max`.
#[derive(Debug, Clone)]
pub struct IdentityStreams {
    max: usize,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

impl Default for IdentityStreams {
    fn default() -> Self {
        IdentityStreams::new(DEFAULT_MAX_STREAMS_PER_IDENTITY)
    }
}

impl IdentityStreams {
    /// At most `max` streams per identity.
    pub fn new(max: usize) -> IdentityStreams {
        IdentityStreams {
            max,
            open: Arc::default(),
        }
    }

    /// The most streams per identity.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for one more stream of `identity`, held until dropped; `None` when it has
    /// its maximum open.
    pub fn open(&self, identity: &str) -> Option<IdentityStream> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(identity.to_string()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(IdentityStream {
            streams: self.clone(),
            identity: identity.to_string(),
        })
    }

    /// Streams open for `identity` (tests).
    #[cfg(test)]
    pub fn count(&self, identity: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(identity).copied().unwrap_or(0)
    }
}

/// One open stream of an identity; gives its slot back when dropped.
#[derive(Debug)]
pub struct IdentityStream {
    streams: IdentityStreams,
    identity: String,
}

impl Drop for IdentityStream {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.identity) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.identity);
            }
        }
    }
}

/// Raises this process's soft open-file limit (`RLIMIT_NOFILE`) to its hard limit, as Go
/// programs (istiod included) do when they start: containerd 2 gives containers a soft
/// limit of 1024 under a hard one of 524288, which would cap a replica at 768 connections.
/// Returns the soft limit in force afterwards; `None` when unlimited or unknown.
#[cfg(unix)]
pub fn raise_open_file_limit() -> Option<usize> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    // `None` is unlimited.
    let below_hard = match (limit.current, limit.maximum) {
        (Some(soft), Some(hard)) => soft < hard,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if below_hard {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(%error, soft = ?limit.current, hard = ?limit.maximum, "cannot raise the open-file limit");
        }
    }
    getrlimit(Resource::Nofile)
        .current
        .and_then(|n| usize::try_from(n).ok())
}

/// Without `setrlimit`: the limit is unknown.
#[cfg(not(unix))]
pub fn raise_open_file_limit() -> Option<usize> {
    None
}

/// The default cap on xDS connections for an open-file limit: three quarters of it (the
/// rest is for the admin port, NATS, files and the accept queue's next connections), at
/// most [`MAX_CONNECTIONS_CEILING`], at least 16.
pub fn default_max_connections(open_files: Option<usize>) -> usize {
    open_files
        .map(|n| n / 4 * 3)
        .unwrap_or(MAX_CONNECTIONS_CEILING)
        .clamp(16, MAX_CONNECTIONS_CEILING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_then_one_per_interval_with_the_suppressed_count() {
        let mut l = WarnLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.check_at(t0), Some(0), "the first is logged");
        for i in 1..=1000 {
            assert_eq!(l.check_at(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(
            l.check_at(t0 + Duration::from_secs(10)),
            Some(1000),
            "one per interval, with what was suppressed"
        );
        assert_eq!(l.check_at(t0 + Duration::from_secs(11)), None);
        assert_eq!(l.check_at(t0 + Duration::from_secs(60)), Some(1));
        // A clock that goes backwards never panics and never logs more.
        assert_eq!(l.check_at(t0), None);
    }

    #[test]
    fn truncation_keeps_the_head_on_a_char_boundary() {
        assert_eq!(truncate("short", 10), "short");
        let long = "é".repeat(1000); // 2000 bytes
        let t = truncate(&long, 1023);
        assert!(t.starts_with(&"é".repeat(511)));
        assert!(t.ends_with("... (978 bytes truncated)"), "{t}");
        assert!(t.len() <= 1023 + 40);
    }

    #[test]
    fn nested_budgets_take_all_or_nothing() {
        let process = BufferBudget::process(100, None);
        let pool = BufferBudget::within(&process, 60, Breach::UnauthenticatedBuffer);
        let a = BufferBudget::within(&pool, 50, Breach::ConnectionBuffer);
        let b = BufferBudget::within(&pool, 50, Breach::ConnectionBuffer);
        let tls = BufferBudget::within(&process, 80, Breach::ConnectionBuffer);
        assert_eq!(a.take(40), Ok(()));
        let refused = a.take(11).expect_err("over the connection's 50");
        assert_eq!(refused.breach, Breach::ConnectionBuffer);
        assert_eq!(refused.limit, 50);
        let refused = b.take(30).expect_err("over the pool's 60");
        assert_eq!(refused.breach, Breach::UnauthenticatedBuffer);
        assert_eq!(
            (b.used(), pool.used(), process.used()),
            (0, 40, 40),
            "nothing taken"
        );
        assert_eq!(
            tls.take(60),
            Ok(()),
            "authenticated bytes are not in the pool"
        );
        let refused = tls.take(1).expect_err("over the process's 100");
        assert_eq!(refused.breach, Breach::ProcessBuffer);
        assert!(refused.status().message().contains("100 bytes"));
        assert_eq!(refused.status().code(), tonic::Code::ResourceExhausted);
        a.give(40);
        tls.give(60);
        assert_eq!((a.used(), pool.used(), process.used()), (0, 0, 0));
        assert!(a.take(usize::MAX).is_err(), "no overflow");
    }

    #[test]
    fn identity_slots_are_capped_and_given_back() {
        let streams = IdentityStreams::new(2);
        let one = streams.open("spiffe://a").expect("first");
        let two = streams.open("spiffe://a").expect("second");
        assert!(streams.open("spiffe://a").is_none(), "third refused");
        let other = streams.open("spiffe://b").expect("another identity");
        drop(one);
        assert_eq!(streams.count("spiffe://a"), 1);
        let _three = streams.open("spiffe://a").expect("a slot was given back");
        drop((two, other));
        assert_eq!(streams.count("spiffe://b"), 0);
    }

    #[test]
    fn the_default_connection_cap_follows_the_open_file_limit() {
        assert_eq!(default_max_connections(Some(4096)), 3072);
        assert_eq!(default_max_connections(Some(1024)), 768);
        assert_eq!(
            default_max_connections(Some(1 << 20)),
            MAX_CONNECTIONS_CEILING
        );
        assert_eq!(default_max_connections(Some(10)), 16);
        assert_eq!(default_max_connections(None), MAX_CONNECTIONS_CEILING);
    }
}
