//! Bounds on what one ADS stream keeps and logs, whatever its proxy sends.
//!
//! A proxy is outside input: a broken or hostile one may send NACKs with megabytes of error
//! text, subscribe to millions of names, or repeat a bad request in a tight loop. What a
//! stream stores is capped here, and its per-request warnings are rate-limited
//! ([`WarnLimiter`]) so that one bad proxy cannot flood the log.

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
}
