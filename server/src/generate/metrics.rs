//! Metrics of the generator cache (`shoal_cache_*`).

use prometheus::core::Collector;
use prometheus::{IntCounter, IntGauge, Registry};

/// The generator cache's metrics. Cheap to clone.
#[derive(Clone)]
pub struct CacheMetrics {
    /// Generator cache hits.
    pub cache_hits: IntCounter,
    /// Generator cache misses (resources built).
    pub cache_misses: IntCounter,
    /// Generator cache entries (set on scrape).
    pub cache_entries: IntGauge,
    /// Generator cache weighted size in bytes (set on scrape).
    pub cache_bytes: IntGauge,
}

impl CacheMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> CacheMetrics {
        let m = CacheMetrics {
            cache_hits: IntCounter::new("shoal_cache_hits_total", "Generator cache hits.")
                .expect("valid metric"),
            cache_misses: IntCounter::new(
                "shoal_cache_misses_total",
                "Generator cache misses (resources built).",
            )
            .expect("valid metric"),
            cache_entries: IntGauge::new("shoal_cache_entries", "Generator cache entries.")
                .expect("valid metric"),
            cache_bytes: IntGauge::new(
                "shoal_cache_bytes",
                "Generator cache size in bytes (resources plus per-entry overhead).",
            )
            .expect("valid metric"),
        };
        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(m.cache_hits.clone()),
            Box::new(m.cache_misses.clone()),
            Box::new(m.cache_entries.clone()),
            Box::new(m.cache_bytes.clone()),
        ];
        shoal_common::metrics::register_all(registry, collectors);
        m
    }
}
