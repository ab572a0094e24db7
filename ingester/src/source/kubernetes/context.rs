//! What every cluster task of the Kubernetes source shares: the bus, the fleet's
//! coordination, the metrics and the source's settings. A module of its own so that the
//! cluster task and the config side it runs both use it without using each other.

use super::ca_root::RootRx;
use super::metrics::KubeMetrics;
use crate::coordination::lease::Leadership;
use crate::coordination::ownership::Owners;
use crate::coordination::readiness::Readiness;
use crate::publish::metrics::PublishMetrics;
use crate::publish::{Ownership, Publisher};
use crate::source::mesh_config::SelectorsRx;
use shoal_common::bus::StateBus;
use std::sync::Arc;

/// What every cluster task shares.
#[derive(Clone)]
pub struct ClusterContext {
    /// The state bus.
    pub bus: Arc<dyn StateBus>,
    /// The fleet written into every envelope.
    pub fleet: String,
    /// The Kubernetes source's metrics.
    pub metrics: KubeMetrics,
    /// The publishers' metrics.
    pub publish_metrics: PublishMetrics,
    /// Readiness.
    pub readiness: Readiness,
    /// The discovery selectors.
    pub selectors: SelectorsRx,
    /// Whether this ingester may write.
    pub leadership: Leadership,
    /// Which fleet owns which cluster.
    pub owners: Owners,
    /// The root certificate written into every selected namespace (`--ca-root-cert`).
    pub ca_root: Option<RootRx>,
    /// Seals gateway credentials (`--credential-key-file`); `None`: Secrets are not read.
    pub credential_keys: Option<Arc<shoal_common::credential::CredentialKeys>>,
    /// The system namespace: in each cluster, its `topology.istio.io/network` label names
    /// the cluster's network.
    pub system_namespace: String,
    /// The proxy image of the gateways deployed for Gateway API Gateways
    /// (`--gateway-deployment`); `None`: nothing is deployed.
    pub gateway_proxy_image: Option<String>,
}

impl ClusterContext {
    /// A publisher of `ownership` under this ingester's leadership. It reads the bus when
    /// it first leads (and at the start of every term); a failed read is retried by the
    /// next round.
    pub fn publisher(&self, ownership: Ownership) -> Publisher {
        Publisher::new(
            self.bus.clone(),
            &self.fleet,
            ownership,
            self.leadership.clone(),
        )
    }
}
