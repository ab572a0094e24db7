//! Prometheus metrics of the ingester (`shoal_ingester_*`), served on `/metrics`.

use crate::publish::PublishReport;
use prometheus::{opts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The `event` label values of `shoal_ingester_events_total`.
pub const EVENTS: [&str; 6] = [
    "init",
    "init_apply",
    "init_done",
    "apply",
    "delete",
    "error",
];

/// The kinds watched in every cluster (the `kind` label of a remote cluster's events).
pub const CLUSTER_KINDS: [&str; 5] = ["Namespace", "Service", "EndpointSlice", "Pod", "Node"];

/// The ingester's metrics, registered in their own registry. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Watch events by cluster, kind and event (`init`, `init_apply`, `init_done`, `apply`,
    /// `delete`, `error`).
    pub events: IntCounterVec,
    /// Bus operations of the publishers by result (`written`, `unchanged`, `deleted`,
    /// `error`).
    pub bus_writes: IntCounterVec,
    /// Managed clusters by sync state (`synced`, `syncing`).
    pub clusters: IntGaugeVec,
    /// 1 when a cluster has synced, 0 while it syncs, by cluster.
    pub cluster_synced: IntGaugeVec,
    /// 1 once the ingester is ready.
    pub ready: IntGauge,
    /// 1 while this replica holds its fleet's lease (and writes), 0 otherwise.
    pub leader: IntGauge,
    /// The fleet's lease epoch, as last read or written by this replica.
    pub lease_epoch: IntGauge,
    /// Times this replica started or stopped leading.
    pub lease_transitions: IntCounter,
    /// Sync state per cluster, from which the `clusters` gauge is computed.
    cluster_states: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let m = Metrics {
            registry: Registry::new(),
            events: IntCounterVec::new(
                opts!(
                    "shoal_ingester_events_total",
                    "Kubernetes watch events, by cluster, kind and event."
                ),
                &["cluster", "kind", "event"],
            )
            .expect("valid metric"),
            bus_writes: IntCounterVec::new(
                opts!(
                    "shoal_ingester_bus_writes_total",
                    "Keys the ingester published, by result: written, unchanged (skipped), \
                     deleted, error."
                ),
                &["result"],
            )
            .expect("valid metric"),
            clusters: IntGaugeVec::new(
                opts!(
                    "shoal_ingester_clusters",
                    "Managed clusters by sync state (synced, syncing)."
                ),
                &["state"],
            )
            .expect("valid metric"),
            cluster_synced: IntGaugeVec::new(
                opts!(
                    "shoal_ingester_cluster_synced",
                    "1 when the cluster's initial sync is done, 0 while it syncs."
                ),
                &["cluster"],
            )
            .expect("valid metric"),
            ready: IntGauge::new("shoal_ingester_ready", "1 once the ingester is ready.")
                .expect("valid metric"),
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
            cluster_states: Arc::default(),
        };
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.events.clone()),
            Box::new(m.bus_writes.clone()),
            Box::new(m.clusters.clone()),
            Box::new(m.cluster_synced.clone()),
            Box::new(m.ready.clone()),
            Box::new(m.leader.clone()),
            Box::new(m.lease_epoch.clone()),
            Box::new(m.lease_transitions.clone()),
        ];
        shoal_common::metrics::register_all(&m.registry, collectors);
        for state in ["synced", "syncing"] {
            m.clusters.with_label_values(&[state]).set(0);
        }
        for result in ["written", "unchanged", "deleted", "error"] {
            m.bus_writes.with_label_values(&[result]);
        }
        m
    }

    /// Counts one watch event.
    pub fn event(&self, cluster: &str, kind: &str, event: &str) {
        self.events.with_label_values(&[cluster, kind, event]).inc();
    }

    /// Counts what a publish round did.
    pub fn published(&self, report: &PublishReport) {
        let w = &self.bus_writes;
        w.with_label_values(&["written"]).inc_by(report.writes);
        w.with_label_values(&["unchanged"]).inc_by(report.unchanged);
        w.with_label_values(&["deleted"]).inc_by(report.deletes);
        w.with_label_values(&["error"]).inc_by(report.errors);
    }

    /// Records a managed cluster's sync state.
    pub fn cluster_state(&self, cluster: &str, synced: bool) {
        let mut states = self
            .cluster_states
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        states.insert(cluster.to_string(), synced);
        self.cluster_synced
            .with_label_values(&[cluster])
            .set(i64::from(synced));
        self.count_states(&states);
    }

    /// Forgets a cluster that is no longer managed.
    pub fn cluster_removed(&self, cluster: &str) {
        let mut states = self
            .cluster_states
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        states.remove(cluster);
        let _ = self.cluster_synced.remove_label_values(&[cluster]);
        // Series of removed clusters would otherwise accumulate with cluster churn.
        for kind in CLUSTER_KINDS {
            for event in EVENTS {
                let _ = self.events.remove_label_values(&[cluster, kind, event]);
            }
        }
        self.count_states(&states);
    }

    fn count_states(&self, states: &BTreeMap<String, bool>) {
        let synced = states.values().filter(|s| **s).count();
        let syncing = states.len() - synced;
        let gauge = |state: &str, n: usize| {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.clusters.with_label_values(&[state]).set(n);
        };
        gauge("synced", synced);
        gauge("syncing", syncing);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_gauges_follow_states() {
        let m = Metrics::new();
        m.cluster_state("a", false);
        m.cluster_state("b", true);
        m.cluster_state("a", true);
        m.cluster_state("c", false);
        let text = m.render();
        assert!(
            text.contains("shoal_ingester_clusters{state=\"synced\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("shoal_ingester_clusters{state=\"syncing\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("shoal_ingester_cluster_synced{cluster=\"a\"} 1"),
            "{text}"
        );
        m.event("c", "Pod", "apply");
        m.cluster_removed("c");
        let text = m.render();
        assert!(
            text.contains("shoal_ingester_clusters{state=\"syncing\"} 0"),
            "{text}"
        );
        assert!(!text.contains("cluster=\"c\""), "{text}");
    }

    #[test]
    fn publish_reports_are_counted_by_result() {
        let m = Metrics::new();
        m.published(&PublishReport {
            writes: 2,
            unchanged: 5,
            deletes: 1,
            errors: 0,
        });
        m.event("c1", "Service", "apply");
        let text = m.render();
        assert!(text.contains("shoal_ingester_bus_writes_total{result=\"written\"} 2"));
        assert!(text.contains("shoal_ingester_bus_writes_total{result=\"unchanged\"} 5"));
        assert!(text.contains("shoal_ingester_bus_writes_total{result=\"error\"} 0"));
        assert!(text.contains(
            "shoal_ingester_events_total{cluster=\"c1\",event=\"apply\",kind=\"Service\"} 1"
        ));
    }
}
