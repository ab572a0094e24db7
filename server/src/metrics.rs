//! The server's metrics: one registry holding each subsystem's ([`XdsMetrics`],
//! [`PushMetrics`], [`CacheMetrics`], [`SecurityMetrics`]), each defined beside the code
//! that writes it. Names are `shoal_*`; docs/metrics.md maps each to the Istio `pilot_*`
//! metric it corresponds to.

use crate::generate::metrics::CacheMetrics;
use crate::push::metrics::PushMetrics;
use crate::security::metrics::SecurityMetrics;
use crate::xds::metrics::XdsMetrics;
use prometheus::Registry;

/// Every metric of the server, registered in one registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// The streams' and callers'.
    pub xds: XdsMetrics,
    /// The push pipeline's.
    pub push: PushMetrics,
    /// The generator cache's.
    pub cache: CacheMetrics,
    /// The certificates', token issuers' and CA files'.
    pub security: SecurityMetrics,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        Metrics {
            xds: XdsMetrics::register(&registry),
            push: PushMetrics::register(&registry),
            cache: CacheMetrics::register(&registry),
            security: SecurityMetrics::register(&registry),
            registry,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        shoal_common::metrics::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
