//! What every cluster task of the Kubernetes source shares: the bus, the fleet's
//! coordination, the metrics and the source's settings. A module of its own so that the
//! cluster task and the config side it runs both use it without using each other.

use super::ca_root::RootRx;
use super::metrics::KubeMetrics;
use super::reduce::ObjKey;
use crate::coordination::lease::Leadership;
use crate::coordination::ownership::Owners;
use crate::coordination::readiness::Readiness;
use crate::publish::metrics::PublishMetrics;
use crate::publish::{Ownership, Publisher};
use crate::source::mesh_config::SelectorsRx;
use shoal_common::bus::StateBus;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

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
    /// The Services of every cluster this ingester watches.
    pub services: ServiceDirectory,
}

/// The Services (namespace, name) of every cluster this ingester watches, by cluster: the
/// Gateway API status asks it whether a backend or parent Service not in the config
/// cluster exists in another, as the proxies would route to it there. Cheap to clone.
#[derive(Clone)]
pub struct ServiceDirectory {
    clusters: Arc<Mutex<BTreeMap<String, BTreeSet<ObjKey>>>>,
    changed: Arc<watch::Sender<u64>>,
}

impl Default for ServiceDirectory {
    fn default() -> Self {
        ServiceDirectory {
            clusters: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl ServiceDirectory {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeSet<ObjKey>>> {
        self.clusters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Sets `cluster`'s Services (after a relist or a kubeconfig switch).
    pub fn set(&self, cluster: &str, services: BTreeSet<ObjKey>) {
        let changed = {
            let mut clusters = self.lock();
            let old = clusters.insert(cluster.to_string(), services);
            old.as_ref() != clusters.get(cluster)
        };
        if changed {
            self.bump();
        }
    }

    /// Records that `cluster` has (`present`) or no longer has the Service `key`.
    pub fn update(&self, cluster: &str, key: &ObjKey, present: bool) {
        let changed = {
            let mut clusters = self.lock();
            let services = clusters.entry(cluster.to_string()).or_default();
            match present {
                true => services.insert(key.clone()),
                false => services.remove(key),
            }
        };
        if changed {
            self.bump();
        }
    }

    /// Forgets a cluster that left.
    pub fn remove(&self, cluster: &str) {
        if self.lock().remove(cluster).is_some() {
            self.bump();
        }
    }

    /// Whether a cluster other than `except` has the Service `namespace`/`name`.
    pub fn exists_elsewhere(&self, except: &str, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        self.lock()
            .iter()
            .any(|(c, s)| c.as_str() != except && s.contains(&key))
    }

    /// Changes whenever a cluster's Services do.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
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
