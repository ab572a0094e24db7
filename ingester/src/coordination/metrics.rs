//! Metrics of the fleet's coordination: leadership (`shoal_ingester_leader`,
//! `shoal_ingester_lease_epoch`, `shoal_ingester_lease_transitions_total`), readiness
//! (`shoal_ingester_ready`) and bus healing (`shoal_ingester_bus_heals_total`).

use prometheus::core::Collector;
use prometheus::{opts, IntCounter, IntCounterVec, IntGauge, Registry};
use shoal_common::bus::Bucket;

/// The coordination metrics. Cheap to clone.
#[derive(Clone)]
pub struct CoordinationMetrics {
    /// 1 while this replica holds its fleet's lease (and writes), 0 otherwise.
    pub leader: IntGauge,
    /// The fleet's lease epoch, as last read or written by this replica.
    pub lease_epoch: IntGauge,
    /// Times this replica started or stopped leading.
    pub lease_transitions: IntCounter,
    /// 1 once the ingester is ready.
    pub ready: IntGauge,
    /// Buckets found to have lost their data (gone, re-created, behind what this ingester
    /// wrote, or purged) and healed: re-created and published again, by bucket.
    pub bus_heals: IntCounterVec,
    /// Leases refused because their epoch jumped implausibly
    /// ([`shoal_common::lease::epoch_jump`]).
    pub lease_epoch_refused: IntCounter,
}

impl CoordinationMetrics {
    /// Creates the metrics and registers them in `registry`, every bucket's heals at 0.
    pub fn register(registry: &Registry) -> CoordinationMetrics {
        let m = CoordinationMetrics {
            leader: IntGauge::new(
                "shoal_ingester_leader",
                "1 while this replica holds its fleet's lease and writes, 0 on standby. \
                 Always 1 for the file source, which runs without a lease.",
            )
            .expect("valid metric"),
            lease_epoch: IntGauge::new(
                "shoal_ingester_lease_epoch",
                "The fleet's lease epoch as last read or written by this replica.",
            )
            .expect("valid metric"),
            lease_transitions: IntCounter::new(
                "shoal_ingester_lease_transitions_total",
                "Times this replica started or stopped leading its fleet.",
            )
            .expect("valid metric"),
            ready: IntGauge::new("shoal_ingester_ready", "1 once the ingester is ready.")
                .expect("valid metric"),
            bus_heals: IntCounterVec::new(
                opts!(
                    "shoal_ingester_bus_heals_total",
                    "Buckets found to have lost their data (gone, re-created by another \
                     writer, with a sequence below what this ingester wrote, or purged), \
                     after which the ingester re-created them and published everything again, \
                     by bucket."
                ),
                &["bucket"],
            )
            .expect("valid metric"),
            lease_epoch_refused: IntCounter::new(
                "shoal_ingester_lease_epoch_refused_total",
                "Leases of this fleet refused because their epoch jumped implausibly above \
                 the last one seen (forged or corrupt); the holder writes its own lease back.",
            )
            .expect("valid metric"),
        };
        shoal_common::metrics::register_all(registry, m.collectors());
        for bucket in Bucket::ALL {
            m.bus_heals.with_label_values(&[bucket.name()]);
        }
        m
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.leader.clone()),
            Box::new(self.lease_epoch.clone()),
            Box::new(self.lease_transitions.clone()),
            Box::new(self.ready.clone()),
            Box::new(self.bus_heals.clone()),
            Box::new(self.lease_epoch_refused.clone()),
        ]
    }

    /// The text exposition of these metrics alone, for tests.
    #[cfg(test)]
    pub fn render(&self) -> String {
        let registry = Registry::new();
        shoal_common::metrics::register_all(&registry, self.collectors());
        shoal_common::metrics::render(&registry)
    }
}
