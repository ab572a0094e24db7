//! Metrics of the Kubernetes source (`shoal_ingester_*`): watch events, the assigned
//! clusters' states, token issuers, status writes and the root certificate's distribution.
//! Label values that form a fixed set are the enums below, each written once.

use prometheus::core::Collector;
use prometheus::{opts, IntCounterVec, IntGaugeVec, Registry};
use shoal_common::model::ConfigKind;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The `event` label of `shoal_ingester_events_total`: what a watch delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEvent {
    /// A relist starts.
    Init,
    /// An object of a relist.
    InitApply,
    /// A relist is complete.
    InitDone,
    /// An object was added or changed.
    Apply,
    /// An object was deleted.
    Delete,
    /// The watch failed (it retries with backoff).
    Error,
}

impl WatchEvent {
    /// Every value.
    pub const ALL: [WatchEvent; 6] = [
        WatchEvent::Init,
        WatchEvent::InitApply,
        WatchEvent::InitDone,
        WatchEvent::Apply,
        WatchEvent::Delete,
        WatchEvent::Error,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchEvent::Init => "init",
            WatchEvent::InitApply => "init_apply",
            WatchEvent::InitDone => "init_done",
            WatchEvent::Apply => "apply",
            WatchEvent::Delete => "delete",
            WatchEvent::Error => "error",
        }
    }
}

/// What a watch watches: the `kind` label of `shoal_ingester_events_total`, also the name
/// of the watch in logs and in a cluster's `last_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchKind {
    /// Namespaces (their labels), in every cluster.
    Namespace,
    /// Services, in every cluster.
    Service,
    /// EndpointSlices, in every cluster.
    EndpointSlice,
    /// Pods, in every cluster.
    Pod,
    /// Nodes, in every cluster.
    Node,
    /// Namespaces, for the root certificate's distribution (`--ca-root-cert`).
    RootNamespace,
    /// The root certificate ConfigMaps (`--ca-root-cert`).
    RootConfigMap,
    /// The multicluster Secrets of the config cluster.
    MulticlusterSecret,
    /// The Istio CustomResourceDefinitions of the config cluster.
    Crd,
    /// The Secrets that may hold gateway credentials: not `Secret`, which is the
    /// multicluster Secrets watch.
    CredentialSecret,
    /// An Istio config kind of the config cluster.
    Config(ConfigKind),
}

impl WatchKind {
    /// The kinds watched in every cluster: the series a removed cluster leaves behind.
    pub const CLUSTER: [WatchKind; 7] = [
        WatchKind::Namespace,
        WatchKind::Service,
        WatchKind::EndpointSlice,
        WatchKind::Pod,
        WatchKind::Node,
        WatchKind::RootNamespace,
        WatchKind::RootConfigMap,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchKind::Namespace => "Namespace",
            WatchKind::Service => "Service",
            WatchKind::EndpointSlice => "EndpointSlice",
            WatchKind::Pod => "Pod",
            WatchKind::Node => "Node",
            WatchKind::RootNamespace => "Namespace (root certificate)",
            WatchKind::RootConfigMap => "ConfigMap (root certificate)",
            WatchKind::MulticlusterSecret => "Secret",
            WatchKind::Crd => "CustomResourceDefinition",
            WatchKind::CredentialSecret => "CredentialSecret",
            WatchKind::Config(kind) => kind.as_str(),
        }
    }
}

impl std::fmt::Display for WatchKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `state` label of `shoal_ingester_clusters`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateLabel {
    /// [`ClusterState::Synced`].
    Synced,
    /// [`ClusterState::Syncing`].
    Syncing,
    /// [`ClusterState::Refused`].
    Refused,
}

impl StateLabel {
    /// Every value.
    pub const ALL: [StateLabel; 3] = [StateLabel::Synced, StateLabel::Syncing, StateLabel::Refused];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StateLabel::Synced => "synced",
            StateLabel::Syncing => "syncing",
            StateLabel::Refused => "refused",
        }
    }
}

/// The `result` label of `shoal_ingester_object_status_writes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWrite {
    /// The status was written.
    Written,
    /// The object was deleted meanwhile.
    Gone,
    /// The write failed (retried later).
    Error,
}

impl StatusWrite {
    /// Every value.
    pub const ALL: [StatusWrite; 3] = [StatusWrite::Written, StatusWrite::Gone, StatusWrite::Error];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StatusWrite::Written => "written",
            StatusWrite::Gone => "gone",
            StatusWrite::Error => "error",
        }
    }
}

/// The `result` label of `shoal_ingester_gateway_deployment_writes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeploymentWrite {
    /// An object was created.
    Created,
    /// An object was changed to what the Gateway asks for.
    Updated,
    /// An object of a deleted (or no longer deployed) Gateway was deleted.
    Deleted,
    /// The write failed (retried later).
    Error,
}

impl DeploymentWrite {
    /// Every value.
    pub const ALL: [DeploymentWrite; 4] = [
        DeploymentWrite::Created,
        DeploymentWrite::Updated,
        DeploymentWrite::Deleted,
        DeploymentWrite::Error,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentWrite::Created => "created",
            DeploymentWrite::Updated => "updated",
            DeploymentWrite::Deleted => "deleted",
            DeploymentWrite::Error => "error",
        }
    }
}

/// The `result` label of `shoal_ingester_ca_root_writes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootWrite {
    /// The ConfigMap was created or updated.
    Written,
    /// The write failed.
    Failed,
}

impl RootWrite {
    /// Every value.
    pub const ALL: [RootWrite; 2] = [RootWrite::Written, RootWrite::Failed];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RootWrite::Written => "written",
            RootWrite::Failed => "failed",
        }
    }
}

/// The `result` label of `shoal_ingester_ca_root_reloads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootReload {
    /// The file holds a certificate.
    Ok,
    /// The file is unreadable or not a certificate.
    Error,
}

impl RootReload {
    /// Every value.
    pub const ALL: [RootReload; 2] = [RootReload::Ok, RootReload::Error];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RootReload::Ok => "ok",
            RootReload::Error => "error",
        }
    }
}

/// The Kubernetes source's metrics. Cheap to clone.
#[derive(Clone)]
pub struct KubeMetrics {
    /// Watch events by cluster, kind and event.
    events: IntCounterVec,
    /// Managed clusters by sync state.
    clusters: IntGaugeVec,
    /// 1 when a cluster has synced, 0 while it syncs, by cluster.
    cluster_synced: IntGaugeVec,
    /// 1 for a cluster this fleet is assigned but does not publish because another live
    /// fleet owns it, by cluster and owner.
    cluster_refused: IntGaugeVec,
    /// Status writes to rejected (and then fixed) Istio config objects, by result.
    object_status_writes: IntCounterVec,
    /// 1 when the cluster's token issuer keys were last read successfully, 0 when not.
    issuer_readable: IntGaugeVec,
    /// Writes of the root-certificate ConfigMap (istio-ca-root-cert), by cluster and
    /// result.
    ca_root_writes: IntCounterVec,
    /// Loads of the root certificate file (--ca-root-cert), by result.
    ca_root_reloads: IntCounterVec,
    /// Writes of the objects deployed for Gateway API Gateways (--gateway-deployment), by
    /// result.
    gateway_deployment_writes: IntCounterVec,
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
    fn label(&self) -> StateLabel {
        match self {
            ClusterState::Syncing => StateLabel::Syncing,
            ClusterState::Synced => StateLabel::Synced,
            ClusterState::Refused { .. } => StateLabel::Refused,
        }
    }
}

impl KubeMetrics {
    /// Creates the metrics and registers them in `registry`; the series of fixed label
    /// sets start at 0.
    pub fn register(registry: &Registry) -> KubeMetrics {
        let m = KubeMetrics {
            events: IntCounterVec::new(
                opts!(
                    "shoal_ingester_events_total",
                    "Kubernetes watch events, by cluster, kind and event."
                ),
                &["cluster", "kind", "event"],
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
            ca_root_writes: IntCounterVec::new(
                opts!(
                    "shoal_ingester_ca_root_writes_total",
                    "Writes of the root-certificate ConfigMap istio-ca-root-cert into \
                     namespaces, by cluster and result: written (created or updated), failed."
                ),
                &["cluster", "result"],
            )
            .expect("valid metric"),
            gateway_deployment_writes: IntCounterVec::new(
                opts!(
                    "shoal_ingester_gateway_deployment_writes_total",
                    "Writes of the Deployments, Services and ServiceAccounts deployed for \
                     Gateway API Gateways (--gateway-deployment), by result: created, updated, \
                     deleted, error."
                ),
                &["result"],
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
        shoal_common::metrics::register_all(registry, m.collectors());
        for state in StateLabel::ALL {
            m.clusters.with_label_values(&[state.as_str()]).set(0);
        }
        for result in StatusWrite::ALL {
            m.object_status_writes.with_label_values(&[result.as_str()]);
        }
        for result in DeploymentWrite::ALL {
            m.gateway_deployment_writes
                .with_label_values(&[result.as_str()]);
        }
        for result in RootReload::ALL {
            m.ca_root_reloads.with_label_values(&[result.as_str()]);
        }
        m
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.events.clone()),
            Box::new(self.clusters.clone()),
            Box::new(self.cluster_synced.clone()),
            Box::new(self.cluster_refused.clone()),
            Box::new(self.object_status_writes.clone()),
            Box::new(self.issuer_readable.clone()),
            Box::new(self.ca_root_writes.clone()),
            Box::new(self.ca_root_reloads.clone()),
            Box::new(self.gateway_deployment_writes.clone()),
        ]
    }

    /// Counts one watch event.
    pub fn event(&self, cluster: &str, kind: WatchKind, event: WatchEvent) {
        self.events
            .with_label_values(&[cluster, kind.as_str(), event.as_str()])
            .inc();
    }

    /// Counts one status write to an Istio config object.
    pub fn object_status_written(&self, result: StatusWrite) {
        self.object_status_writes
            .with_label_values(&[result.as_str()])
            .inc();
    }

    /// Counts one write of an object deployed for a Gateway.
    pub fn gateway_deployment_written(&self, result: DeploymentWrite) {
        self.gateway_deployment_writes
            .with_label_values(&[result.as_str()])
            .inc();
    }

    /// Counts one write of the root certificate ConfigMap into a namespace of `cluster`.
    pub fn ca_root_written(&self, cluster: &str, result: RootWrite) {
        self.ca_root_writes
            .with_label_values(&[cluster, result.as_str()])
            .inc();
    }

    /// Counts one load of the root certificate file.
    pub fn ca_root_reloaded(&self, result: RootReload) {
        self.ca_root_reloads
            .with_label_values(&[result.as_str()])
            .inc();
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
        for result in RootWrite::ALL {
            let _ = self
                .ca_root_writes
                .remove_label_values(&[cluster, result.as_str()]);
        }
        // Series of removed clusters would otherwise accumulate with cluster churn.
        for kind in WatchKind::CLUSTER {
            for event in WatchEvent::ALL {
                let _ = self
                    .events
                    .remove_label_values(&[cluster, kind.as_str(), event.as_str()]);
            }
        }
        self.count_states(&states);
    }

    fn count_states(&self, states: &BTreeMap<String, ClusterState>) {
        for label in StateLabel::ALL {
            let n = states.values().filter(|s| s.label() == label).count();
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            self.clusters.with_label_values(&[label.as_str()]).set(n);
        }
    }

    /// The text exposition of these metrics alone, for tests.
    #[cfg(test)]
    pub fn render(&self) -> String {
        let registry = Registry::new();
        shoal_common::metrics::register_all(&registry, self.collectors());
        shoal_common::metrics::render(&registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::metrics::PublishMetrics;
    use crate::publish::PublishReport;

    #[test]
    fn cluster_gauges_follow_states() {
        let m = KubeMetrics::register(&Registry::new());
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
        m.event("c", WatchKind::Pod, WatchEvent::Apply);
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
        let registry = Registry::new();
        let publish = PublishMetrics::register(&registry);
        let m = KubeMetrics::register(&registry);
        publish.published(&PublishReport {
            writes: 2,
            unchanged: 5,
            deletes: 1,
            errors: 0,
        });
        m.event("c1", WatchKind::Service, WatchEvent::Apply);
        let text = shoal_common::metrics::render(&registry);
        assert!(text.contains("shoal_ingester_bus_writes_total{result=\"written\"} 2"));
        assert!(text.contains("shoal_ingester_bus_writes_total{result=\"unchanged\"} 5"));
        assert!(text.contains("shoal_ingester_bus_writes_total{result=\"error\"} 0"));
        assert!(text.contains(
            "shoal_ingester_events_total{cluster=\"c1\",event=\"apply\",kind=\"Service\"} 1"
        ));
    }
}
