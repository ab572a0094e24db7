//! Metrics of the push pipeline: bus entries applied, PushContext builds, debounce,
//! readiness and the bus connection (`shoal_bus_*`, `shoal_push_context_*`, `shoal_ready`).

use prometheus::core::Collector;
use prometheus::{histogram_opts, opts, Histogram, IntCounter, IntCounterVec, IntGauge, Registry};
use shoal_common::bus::Bucket;

/// The push pipeline's metrics. Cheap to clone.
#[derive(Clone)]
pub struct PushMetrics {
    /// Bus entries applied, by bucket and result (`applied`, `unchanged`, `invalid`, `fenced`,
    /// `epoch_jump`).
    pub bus_entries: IntCounterVec,
    /// PushContext builds.
    pub push_context_builds: IntCounter,
    /// PushContext build time.
    pub push_context_build_seconds: Histogram,
    /// Time a debounce window stayed open.
    pub debounce_seconds: Histogram,
    /// 1 once the initial state is loaded.
    pub ready: IntGauge,
    /// 1 while the state bus (NATS) is connected, 0 while unreachable (degraded: serving
    /// the last state).
    pub bus_connected: IntGauge,
    /// Bucket watches re-created (after a broken watch or a NATS reconnection), by bucket.
    pub bus_watch_restarts: IntCounterVec,
    /// Expected fleets (`--expect-fleets`) not synced yet.
    pub fleets_waiting: IntGauge,
    /// 1 when the server became ready at `--sync-timeout` without every expected fleet.
    pub sync_timed_out: IntGauge,
    /// East-west gateways known (all networks), as of the last PushContext: a network whose
    /// gateway disappears has its endpoints sent as they are.
    pub network_gateways: IntGauge,
}

impl PushMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> PushMetrics {
        let m = PushMetrics {
            bus_entries: IntCounterVec::new(
                opts!(
                    "shoal_bus_entries_total",
                    "Bus entries received, by bucket and result."
                ),
                &["bucket", "result"],
            )
            .expect("valid metric"),
            push_context_builds: IntCounter::new(
                "shoal_push_context_builds_total",
                "PushContext rebuilds.",
            )
            .expect("valid metric"),
            push_context_build_seconds: Histogram::with_opts(histogram_opts!(
                "shoal_push_context_build_seconds",
                "Time to build a PushContext.",
                prometheus::exponential_buckets(0.0001, 4.0, 10).expect("valid buckets")
            ))
            .expect("valid metric"),
            debounce_seconds: Histogram::with_opts(histogram_opts!(
                "shoal_debounce_seconds",
                "How long debounce windows stayed open.",
                prometheus::exponential_buckets(0.01, 2.0, 12).expect("valid buckets")
            ))
            .expect("valid metric"),
            ready: IntGauge::new("shoal_ready", "1 once the initial state is loaded.")
                .expect("valid metric"),
            bus_connected: IntGauge::new(
                "shoal_bus_connected",
                "1 while the state bus (NATS) is connected; 0 while unreachable (degraded: \
                 serving the last state).",
            )
            .expect("valid metric"),
            bus_watch_restarts: IntCounterVec::new(
                opts!(
                    "shoal_bus_watch_restarts_total",
                    "Bucket watches re-created after a broken watch or a NATS reconnection \
                     (each replays the bucket), by bucket."
                ),
                &["bucket"],
            )
            .expect("valid metric"),
            fleets_waiting: IntGauge::new(
                "shoal_fleets_waiting",
                "Expected ingester fleets (--expect-fleets) whose sync marker is not on the \
                 bus yet; the server is not ready while this is above 0.",
            )
            .expect("valid metric"),
            sync_timed_out: IntGauge::new(
                "shoal_sync_timed_out",
                "1 when the server became ready at --sync-timeout without every expected \
                 fleet synced.",
            )
            .expect("valid metric"),
            network_gateways: IntGauge::new(
                "shoal_network_gateways",
                "East-west gateways of all networks (gateway Services' external addresses \
                 and meshNetworks gateways) in the current PushContext.",
            )
            .expect("valid metric"),
        };
        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(m.bus_entries.clone()),
            Box::new(m.push_context_builds.clone()),
            Box::new(m.push_context_build_seconds.clone()),
            Box::new(m.debounce_seconds.clone()),
            Box::new(m.ready.clone()),
            Box::new(m.bus_connected.clone()),
            Box::new(m.bus_watch_restarts.clone()),
            Box::new(m.fleets_waiting.clone()),
            Box::new(m.sync_timed_out.clone()),
            Box::new(m.network_gateways.clone()),
        ];
        shoal_common::metrics::register_all(registry, collectors);
        // Every known label value at 0 from the first scrape.
        for bucket in ["shoal-config", "shoal-services", "shoal-endpoints"] {
            for result in ["applied", "unchanged", "invalid"] {
                m.bus_entries.with_label_values(&[bucket, result]);
            }
        }
        for bucket in Bucket::ALL {
            m.bus_watch_restarts.with_label_values(&[bucket.name()]);
        }
        // Connected until the bus says otherwise (an in-process bus always is).
        m.bus_connected.set(1);
        m
    }
}
