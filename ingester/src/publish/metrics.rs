//! Metrics of publishing: `shoal_ingester_bus_writes_total{result}`, counted from each
//! round's [`PublishReport`] by whichever source runs the publisher.

use super::PublishReport;
use prometheus::{opts, IntCounterVec, Registry};

/// The `result` label of `shoal_ingester_bus_writes_total`: what a publish round did with
/// a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteResult {
    /// A new or changed value was written.
    Written,
    /// The value was already on the bus: skipped.
    Unchanged,
    /// An owned key no longer desired was deleted.
    Deleted,
    /// The key could not be written or deleted.
    Error,
}

impl WriteResult {
    /// Every value, for pre-registering the series.
    pub const ALL: [WriteResult; 4] = [
        WriteResult::Written,
        WriteResult::Unchanged,
        WriteResult::Deleted,
        WriteResult::Error,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteResult::Written => "written",
            WriteResult::Unchanged => "unchanged",
            WriteResult::Deleted => "deleted",
            WriteResult::Error => "error",
        }
    }
}

/// The publishers' metrics. Cheap to clone.
#[derive(Clone)]
pub struct PublishMetrics {
    /// Bus operations of the publishers by result.
    bus_writes: IntCounterVec,
}

impl PublishMetrics {
    /// Creates the metrics and registers them in `registry`, every result at 0.
    pub fn register(registry: &Registry) -> PublishMetrics {
        let bus_writes = IntCounterVec::new(
            opts!(
                "shoal_ingester_bus_writes_total",
                "Keys the ingester published, by result: written, unchanged (skipped), \
                 deleted, error."
            ),
            &["result"],
        )
        .expect("valid metric");
        shoal_common::metrics::register_all(registry, vec![Box::new(bus_writes.clone())]);
        for result in WriteResult::ALL {
            bus_writes.with_label_values(&[result.as_str()]);
        }
        PublishMetrics { bus_writes }
    }

    /// Counts what a publish round did.
    pub fn published(&self, report: &PublishReport) {
        for (result, n) in [
            (WriteResult::Written, report.writes),
            (WriteResult::Unchanged, report.unchanged),
            (WriteResult::Deleted, report.deletes),
            (WriteResult::Error, report.errors),
        ] {
            self.bus_writes
                .with_label_values(&[result.as_str()])
                .inc_by(n);
        }
    }
}
