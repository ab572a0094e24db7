//! `Sidecar`: egress/ingress listeners and outbound traffic policy of workloads.

use super::*;

/// `Sidecar` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Sidecar {
    /// Which workloads this Sidecar applies to; none = every workload in the namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Egress listeners.
    pub egress: Vec<IstioEgressListener>,
    /// Ingress listeners: when set, they replace the inbound ports taken from Services.
    pub ingress: Vec<IstioIngressListener>,
    /// What happens to traffic for destinations outside the mesh registry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
}

/// An ingress listener of a Sidecar: a workload port the sidecar accepts traffic on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct IstioIngressListener {
    /// The port traffic arrives on, with its protocol.
    pub port: Port,
    /// Bind address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// `NONE` for a real listener without iptables capture.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_mode: Option<String>,
    /// Where to forward: `127.0.0.1:PORT`, `0.0.0.0:PORT` (the instance IP) or a unix socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_endpoint: Option<String>,
}

/// Istio's `OutboundTrafficPolicy` (Sidecar and MeshConfig).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct OutboundTrafficPolicy {
    /// `ALLOW_ANY` (the default) or `REGISTRY_ONLY`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<OutboundTrafficMode>,
}

/// Where traffic to unknown destinations goes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub enum OutboundTrafficMode {
    /// Pass it through to its original destination (`PassthroughCluster`).
    #[default]
    #[serde(rename = "ALLOW_ANY")]
    AllowAny,
    /// Drop it (`BlackHoleCluster`; HTTP gets a 502).
    #[serde(rename = "REGISTRY_ONLY")]
    RegistryOnly,
}

/// Selects workloads by labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct WorkloadSelector {
    /// Labels the workload must carry.
    pub labels: BTreeMap<String, String>,
}

/// An egress listener of a Sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct IstioEgressListener {
    /// The port of the listener; none = the catch-all (hosts only narrow visibility).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    /// Bind address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// `NONE` for a real listener without iptables capture; `DEFAULT` / `IPTABLES` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_mode: Option<String>,
    /// Visible hosts: `ns/host`, `./host`, `*/host`, `ns/*`, `./*`, `*/*`.
    pub hosts: Vec<String>,
}
