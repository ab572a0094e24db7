//! `ServiceEntry` and `WorkloadEntry`: services and workloads outside Kubernetes.

use super::*;

/// `ServiceEntry` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceEntry {
    /// Hostnames of the service.
    pub hosts: Vec<String>,
    /// Virtual IPs.
    pub addresses: Vec<String>,
    /// Ports of the service.
    pub ports: Vec<Port>,
    /// `MESH_EXTERNAL` or `MESH_INTERNAL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// `NONE`, `STATIC`, `DNS`, `DNS_ROUND_ROBIN`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    /// Inline endpoints.
    pub endpoints: Vec<WorkloadEntry>,
    /// Selects WorkloadEntries (in the same namespace) as endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Namespaces this entry is exported to; empty = all.
    pub export_to: Vec<String>,
}

/// How a ServiceEntry's endpoints are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    /// Original destination.
    None,
    /// Endpoints are IP addresses.
    Static,
    /// Endpoints are DNS names, resolved by the proxy (strict DNS).
    Dns,
    /// DNS names, round robin (logical DNS).
    DnsRoundRobin,
}

/// `WorkloadEntry` spec (also the inline endpoint type of ServiceEntry).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkloadEntry {
    /// IP address or DNS name.
    pub address: String,
    /// Port name → workload port.
    pub ports: BTreeMap<String, u32>,
    /// Labels of the workload.
    pub labels: BTreeMap<String, String>,
    /// Network of the workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Locality `region/zone/subzone`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locality: Option<String>,
    /// Load-balancing weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Service account of the workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
}
