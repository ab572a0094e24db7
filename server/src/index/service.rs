//! A service as the generators see it: Kubernetes Services merged across clusters and
//! ServiceEntry hosts, keyed by hostname.

use crate::index::hosts::exported_to;
use shoal_common::model::{Resolution, ServicePort, WorkloadEntry};
use std::collections::BTreeMap;

/// Where a service comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServiceSource {
    /// A Kubernetes Service; endpoints come from the EDS shards.
    Kubernetes,
    /// A ServiceEntry host; endpoints come from the entry (and selected WorkloadEntries).
    ServiceEntry {
        /// How endpoints resolve.
        resolution: Resolution,
        /// The endpoints, sorted.
        endpoints: Vec<WorkloadEntry>,
        /// `location: MESH_INTERNAL`: the endpoints are mesh workloads (auto mTLS applies);
        /// `MESH_EXTERNAL`, the default, means they are not.
        mesh_internal: bool,
    },
}

/// A service as the generators see it: merged across clusters, keyed by hostname.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceView {
    /// The hostname (FQDN for Kubernetes services, the host for ServiceEntries).
    pub hostname: String,
    /// Short name (Kubernetes) or the host (ServiceEntry).
    pub name: String,
    /// Namespace of the Service / ServiceEntry.
    pub namespace: String,
    /// Ports, sorted by number.
    pub ports: Vec<ServicePort>,
    /// Workload port per service port, where it differs (ServiceEntry `targetPort`).
    pub target_ports: BTreeMap<u16, u16>,
    /// Virtual IPs across clusters.
    pub vips: Vec<String>,
    /// Virtual IPs by cluster ID (Kubernetes services): a proxy listens on its own
    /// cluster's ClusterIP, as istiod's `GetAddressForProxy`.
    pub cluster_vips: BTreeMap<String, Vec<String>>,
    /// Namespaces the service is exported to (empty = all).
    pub export_to: Vec<String>,
    /// Kubernetes or ServiceEntry.
    pub source: ServiceSource,
    /// The labels of the workloads behind the service (a Kubernetes Service's `selector`,
    /// a ServiceEntry's `workloadSelector`); empty = selects nothing.
    pub selector: BTreeMap<String, String>,
}

impl ServiceView {
    /// The port with this number.
    pub fn port(&self, number: u32) -> Option<&ServicePort> {
        self.ports.iter().find(|p| u32::from(p.port) == number)
    }

    /// The address a proxy in `cluster` reaches this service at: its cluster's ClusterIP,
    /// else the first VIP (other clusters', a ServiceEntry's), else none.
    pub fn vip_for(&self, cluster: &str) -> Option<&str> {
        self.cluster_vips
            .get(cluster)
            .and_then(|v| v.first())
            .or_else(|| self.vips.first())
            .map(String::as_str)
    }

    /// Whether a proxy in `namespace` may see this service.
    pub fn visible_to(&self, namespace: &str) -> bool {
        exported_to(&self.export_to, &self.namespace, namespace)
    }
}
