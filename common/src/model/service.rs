//! Services and endpoints, normalized from Kubernetes Services and EndpointSlices.

use super::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A Kubernetes Service as seen in one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Service {
    /// Name, namespace, labels and interpreted annotations.
    pub meta: ObjectMeta,
    /// The cluster this service was seen in.
    pub cluster: String,
    /// Fully qualified hostname, e.g. `reviews.default.svc.cluster.local`.
    pub hostname: String,
    /// Cluster IPs (empty for headless services).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_ips: Vec<String>,
    /// The service ports.
    pub ports: Vec<ServicePort>,
    /// The pod selector (empty when the service has none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Namespaces this service is exported to (`networking.istio.io/exportTo`); empty = all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
    /// Addresses clients outside the cluster reach the service on: the load balancer's
    /// ingress IPs and hostnames, then `spec.externalIPs`. An east-west gateway Service
    /// (labelled `topology.istio.io/network`) is reached by other networks on these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_addresses: Vec<String>,
}

/// Label naming the network of a workload, a cluster's system namespace, or the network a
/// gateway Service is the east-west gateway of (Istio's `topology.istio.io/network`).
pub const NETWORK_LABEL: &str = "topology.istio.io/network";

/// Application protocol of a port, as Istio derives it from the port name or `appProtocol`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub enum Protocol {
    /// HTTP/1.1.
    #[default]
    Http,
    /// HTTP/2.
    Http2,
    /// gRPC (HTTP/2).
    Grpc,
    /// HTTPS (TLS passthrough at the mesh level).
    Https,
    /// TLS.
    Tls,
    /// Opaque TCP.
    Tcp,
    /// Unknown: treated as TCP unless sniffed; shoal treats it as HTTP for outbound routes.
    Unsupported,
}

impl Protocol {
    /// Parses an Istio protocol name (`HTTP`, `http2`, `GRPC`, ...), case-insensitively.
    pub fn parse(s: &str) -> Protocol {
        match s.to_ascii_lowercase().as_str() {
            "http" => Protocol::Http,
            "http2" => Protocol::Http2,
            "grpc" | "grpc-web" => Protocol::Grpc,
            "https" => Protocol::Https,
            "tls" => Protocol::Tls,
            "tcp" | "mongo" | "mysql" | "redis" => Protocol::Tcp,
            _ => Protocol::Unsupported,
        }
    }

    /// Derives the protocol from a port name by Istio's `<protocol>[-<suffix>]` convention.
    pub fn from_port_name(name: &str) -> Protocol {
        let prefix = name.split('-').next().unwrap_or_default();
        Protocol::parse(prefix)
    }

    /// Whether traffic on this port is routed with HTTP route tables.
    pub fn is_http(self) -> bool {
        matches!(
            self,
            Protocol::Http | Protocol::Http2 | Protocol::Grpc | Protocol::Unsupported
        )
    }
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServicePort {
    /// Port name (may be empty for single-port services).
    #[serde(default)]
    pub name: String,
    /// The service port number.
    pub port: u16,
    /// The application protocol.
    pub protocol: Protocol,
    /// The port on the workload (`targetPort`), when the Service names it: a number, or the
    /// name of a container port (resolved with the pod's ports). `None` means the same
    /// number as `port`, Kubernetes' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<TargetPort>,
}

/// A Service port's `targetPort`: a number or a container port name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TargetPort {
    /// A port number.
    Number(u16),
    /// The name of a container port of the selected pods.
    Name(String),
}

/// Locality of an endpoint, from the Node's topology labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Locality {
    /// `topology.kubernetes.io/region`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// `topology.kubernetes.io/zone`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
    /// `topology.istio.io/subzone`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subzone: String,
}

/// A named port of an endpoint set (from the EndpointSlice's `ports`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EndpointPort {
    /// Port name; matches the Service port name.
    #[serde(default)]
    pub name: String,
    /// The port the workload listens on.
    pub port: u16,
}

/// One workload address behind a service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Endpoint {
    /// The workload IP.
    pub address: String,
    /// Whether the endpoint is ready to receive traffic.
    pub ready: bool,
    /// Pod labels (used for DestinationRule subsets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Service account of the pod.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account: String,
    /// Locality from the node.
    #[serde(default)]
    pub locality: Locality,
    /// The pod's name, for debugging.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    /// The node the pod runs on (ambient: a ztunnel serves the pods of its node).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// The pod is captured by a ztunnel (istio-cni's annotation
    /// `ambient.istio.io/redirection: enabled`), so it is reached over HBONE.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ambient: bool,
}

/// The pod annotation istio-cni sets on a pod whose traffic it redirected to ztunnel.
pub const AMBIENT_REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";

/// The service name of the endpoint set a pod behind no Service is published as (one set
/// per pod, named after the pod). A Kubernetes service name starts with a letter, so no
/// Service has this name: the set feeds ambient's workloads only, never a cluster.
pub const NO_SERVICE: &str = "-pod";

/// The endpoints of one EndpointSlice of one service in one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EndpointSet {
    /// The cluster the slice was seen in.
    pub cluster: String,
    /// Namespace of the service.
    pub namespace: String,
    /// Name of the service (`kubernetes.io/service-name`).
    pub service: String,
    /// Name of the EndpointSlice.
    pub slice: String,
    /// The ports every endpoint in this slice serves.
    pub ports: Vec<EndpointPort>,
    /// The endpoints, sorted by address.
    pub endpoints: Vec<Endpoint>,
    /// The network of the cluster the slice was seen in (the `topology.istio.io/network`
    /// label of its system namespace); empty when unlabelled. An endpoint's own
    /// [`NETWORK_LABEL`] label (from its pod) wins over it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
}

impl EndpointSet {
    /// The network of one of its endpoints: the pod's label, else the cluster's.
    pub fn network_of<'a>(&'a self, ep: &'a Endpoint) -> &'a str {
        ep.labels
            .get(NETWORK_LABEL)
            .map(String::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(&self.network)
    }
}
