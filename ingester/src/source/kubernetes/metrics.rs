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
pub const CLUSTER_KINDS: [&str; 7] = [
    "Namespace",
    "Service",
    "EndpointSlice",
    "Pod",
    "Node",
    // The root certificate distribution's own watches (--ca-root-cert).
    crate::kubernetes::ca_root::NAMESPACE_KIND,
    crate::kubernetes::ca_root::CONFIG_MAP_KIND,
];

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
    /// 1 for a cluster this fleet is assigned but does not publish because another live
    /// fleet owns it, by cluster and owner.
    pub cluster_refused: IntGaugeVec,
    /// Status writes to rejected (and then fixed) Istio config objects, by result
    /// (`written`, `gone`: the object was deleted meanwhile, `error`).
    pub object_status_writes: IntCounterVec,
    /// Buckets found to have lost their data (gone, re-created, or behind what this
    /// ingester wrote) and healed: re-created and published again, by bucket.
    pub bus_heals: IntCounterVec,
    /// 1 when the cluster's token issuer keys were last read successfully, 0 when not.
    pub issuer_readable: IntGaugeVec,
    /// Writes of the root-certificate ConfigMap (istio-ca-root-cert), by cluster and
    /// result (`written`: created or updated, `failed`).
    pub ca_root_writes: IntCounterVec,
    /// Loads of the root certificate file (--ca-root-cert), by result (`ok`, `error`).
    pub ca_root_reloads: IntCounterVec,
    /// State per cluster, from which the `clusters` gauge is computed.
    cluster_states: Arc<Mutex<BTreeMap<String, ClusterState>>>,
}

/// What the ingester does with a cluster it is assigned.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum ClusterState {
    /// Watching; the initial sync is not done yet.
    Syncing,
    /// Watching, and the initial state is on the bus (or, on a standby, in the caches).
    Synced,
    /// Not published (nor watched, for a remote cluster): another fleet whose lease is
    /// current owns it.
    Refused {
        /// The owning fleet.
        owner: String,
    },
}

impl ClusterState {
    fn label(&self) -> &'static str {
        match self {
            ClusterState::Syncing => "syncing",
            ClusterState::Synced => "synced",
            ClusterState::Refused { .. } => "refused",
        }
    }
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
                    "Clusters assigned to this fleet by state (synced, syncing, refused: \
                     owned by another live fleet)."
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
            issuer_readable: IntGaugeVec::new(
                opts!(
                    "shoal_ingester_issuer_readable",
                    "1 when the cluster's service-account token issuer (its keys, which \
                     servers verify proxy tokens with) was last read successfully, 0 when not."
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
            cluster_refused: IntGaugeVec::new(
                opts!(
                    "shoal_ingester_cluster_refused",
                    "1 for a cluster this fleet is assigned but refuses to publish, because \
                     another fleet whose lease is current owns it."
                ),
                &["cluster", "owner"],
            )
            .expect("valid metric"),
            object_status_writes: IntCounterVec::new(
                opts!(
                    "shoal_ingester_object_status_writes_total",
                    "Status writes to Istio config objects (rejected, then fixed), by result: \
                     written, gone (deleted meanwhile), error."
                ),
                &["result"],
            )
            .expect("valid metric"),
            bus_heals: IntCounterVec::new(
                opts!(
                    "shoal_ingester_bus_heals_total",
                    "Buckets found to have lost their data (gone, re-created by another \
                     writer, or with a sequence below what this ingester wrote), after which \
                     the ingester re-created them and published everything again, by bucket."
                ),
                &["bucket"],
            )
            .expect("valid metric"),
            ca_root_writes: IntCounterVec::new(
                opts!(
                    "shoal_ingester_ca_root_writes_total",
                    "Writes of the root-certificate ConfigMap istio-ca-root-cert into \
                     namespaces, by cluster and result: written (created or updated), failed."
                ),
                &["cluster", "result"],
            )
            .expect("valid metric"),
            ca_root_reloads: IntCounterVec::new(
                opts!(
                    "shoal_ingester_ca_root_reloads_total",
                    "Loads of the root certificate file (--ca-root-cert), by result (ok, error)."
                ),
                &["result"],
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
            Box::new(m.cluster_refused.clone()),
            Box::new(m.object_status_writes.clone()),
            Box::new(m.bus_heals.clone()),
            Box::new(m.issuer_readable.clone()),
            Box::new(m.ca_root_writes.clone()),
            Box::new(m.ca_root_reloads.clone()),
        ];
        shoal_common::metrics::register_all(&m.registry, collectors);
        for state in ["synced", "syncing", "refused"] {
            m.clusters.with_label_values(&[state]).set(0);
        }
        for result in ["written", "unchanged", "deleted", "error"] {
            m.bus_writes.with_label_values(&[result]);
        }
        for result in ["written", "gone", "error"] {
            m.object_status_writes.with_label_values(&[result]);
        }
        for result in ["ok", "error"] {
            m.ca_root_reloads.with_label_values(&[result]);
        }
        for bucket in shoal_common::bus::Bucket::ALL {
            m.bus_heals.with_label_values(&[bucket.name()]);
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
        let state = match synced {
            true => ClusterState::Synced,
            false => ClusterState::Syncing,
        };
        self.set_state(cluster, state);
    }

    /// Records whether the cluster's token issuer was read.
    pub fn issuer_readable(&self, cluster: &str, ok: bool) {
        self.issuer_readable
            .with_label_values(&[cluster])
            .set(i64::from(ok));
    }

    /// Records that a cluster is not published because `owner` owns it.
    pub fn cluster_refused(&self, cluster: &str, owner: &str) {
        self.set_state(
            cluster,
            ClusterState::Refused {
                owner: owner.to_string(),
            },
        );
    }

    fn set_state(&self, cluster: &str, state: ClusterState) {
        let mut states = self.lock_states();
        if let Some(ClusterState::Refused { owner }) = states.get(cluster) {
            if !matches!(&state, ClusterState::Refused { owner: new } if new == owner) {
                let _ = self.cluster_refused.remove_label_values(&[cluster, owner]);
            }
        }
        match &state {
            ClusterState::Refused { owner } => {
                let _ = self.cluster_synced.remove_label_values(&[cluster]);
                self.cluster_refused
                    .with_label_values(&[cluster, owner])
                    .set(1);
            }
            other => self
                .cluster_synced
                .with_label_values(&[cluster])
                .set(i64::from(*other == ClusterState::Synced)),
        }
        states.insert(cluster.to_string(), state);
        self.count_states(&states);
    }

    fn lock_states(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ClusterState>> {
        self.cluster_states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Every assigned cluster and its state (for `/debug/clusters`).
    pub fn cluster_states(&self) -> BTreeMap<String, ClusterState> {
        self.lock_states().clone()
    }

    /// Forgets a cluster that is no longer managed.
    pub fn cluster_removed(&self, cluster: &str) {
        let mut states = self.lock_states();
        if let Some(ClusterState::Refused { owner }) = states.remove(cluster) {
            let _ = self.cluster_refused.remove_label_values(&[cluster, &owner]);
        }
        let _ = self.cluster_synced.remove_label_values(&[cluster]);
        let _ = self.issuer_readable.remove_label_values(&[cluster]);
        for result in ["written", "failed"] {
            let _ = self.ca_root_writes.remove_label_values(&[cluster, result]);
        }
        // Series of removed clusters would otherwise accumulate with cluster churn.
        for kind in CLUSTER_KINDS {
            for event in EVENTS {
                let _ = self.events.remove_label_values(&[cluster, kind, event]);
            }
        }
        self.count_states(&states);
    }

    fn count_states(&self, states: &BTreeMap<String, ClusterState>) {
        for label in ["synced", "syncing", "refused"] {
            let n = states.values().filter(|s| s.label() == label).count();
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.clusters.with_label_values(&[label]).set(n);
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
        m.cluster_refused("d", "edge");
        let text = m.render();
        assert!(
            text.contains("shoal_ingester_clusters{state=\"refused\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("shoal_ingester_cluster_refused{cluster=\"d\",owner=\"edge\"} 1"),
            "{text}"
        );
        m.cluster_state("d", false);
        assert!(!m.render().contains("owner=\"edge\""));
        m.cluster_refused("d", "edge");
        m.cluster_removed("d");
        assert!(!m.render().contains("cluster=\"d\""));
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
