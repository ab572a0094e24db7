//! Istio networking config, typed with the `networking.istio.io/v1` field names.
//!
//! Only the fields shoal implements are modelled; unknown fields are ignored on input.

use super::{Duration, ObjectMeta};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The kinds of Istio config shoal understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConfigKind {
    /// `Gateway`.
    Gateway,
    /// `VirtualService`.
    VirtualService,
    /// `DestinationRule`.
    DestinationRule,
    /// `Sidecar`.
    Sidecar,
    /// `ServiceEntry`.
    ServiceEntry,
    /// `WorkloadEntry`.
    WorkloadEntry,
}

impl ConfigKind {
    /// All kinds, in a stable order.
    pub const ALL: [ConfigKind; 6] = [
        ConfigKind::Gateway,
        ConfigKind::VirtualService,
        ConfigKind::DestinationRule,
        ConfigKind::Sidecar,
        ConfigKind::ServiceEntry,
        ConfigKind::WorkloadEntry,
    ];

    /// The Kubernetes `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::Gateway => "Gateway",
            ConfigKind::VirtualService => "VirtualService",
            ConfigKind::DestinationRule => "DestinationRule",
            ConfigKind::Sidecar => "Sidecar",
            ConfigKind::ServiceEntry => "ServiceEntry",
            ConfigKind::WorkloadEntry => "WorkloadEntry",
        }
    }

    /// Parses a Kubernetes `kind` string.
    pub fn parse(kind: &str) -> Option<ConfigKind> {
        ConfigKind::ALL.into_iter().find(|k| k.as_str() == kind)
    }
}

impl std::fmt::Display for ConfigKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Istio config object: metadata plus a typed spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConfigObject {
    /// Name, namespace, labels, annotations.
    pub meta: ObjectMeta,
    /// The typed spec; its variant is the kind.
    pub spec: ConfigSpec,
}

impl ConfigObject {
    /// The kind of this object.
    pub fn kind(&self) -> ConfigKind {
        match &self.spec {
            ConfigSpec::Gateway(_) => ConfigKind::Gateway,
            ConfigSpec::VirtualService(_) => ConfigKind::VirtualService,
            ConfigSpec::DestinationRule(_) => ConfigKind::DestinationRule,
            ConfigSpec::Sidecar(_) => ConfigKind::Sidecar,
            ConfigSpec::ServiceEntry(_) => ConfigKind::ServiceEntry,
            ConfigSpec::WorkloadEntry(_) => ConfigKind::WorkloadEntry,
        }
    }
}

/// The spec of an Istio config object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConfigSpec {
    /// A Gateway spec.
    Gateway(Gateway),
    /// A VirtualService spec.
    VirtualService(VirtualService),
    /// A DestinationRule spec.
    DestinationRule(DestinationRule),
    /// A Sidecar spec.
    Sidecar(Sidecar),
    /// A ServiceEntry spec.
    ServiceEntry(ServiceEntry),
    /// A WorkloadEntry spec.
    WorkloadEntry(WorkloadEntry),
}

// ---------------------------------------------------------------------------------------
// Gateway

/// `Gateway` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Gateway {
    /// Labels of the gateway proxies this gateway applies to.
    pub selector: BTreeMap<String, String>,
    /// The servers (listeners) of the gateway.
    pub servers: Vec<GatewayServer>,
}

/// One `Server` of a Gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayServer {
    /// The port the proxy listens on.
    pub port: Port,
    /// The bind address (defaults to `0.0.0.0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// Hosts exposed by this server (`ns/host` or `host`).
    pub hosts: Vec<String>,
    /// The server's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A port description (`Port` in Istio's API).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Port {
    /// Port number.
    pub number: u32,
    /// Protocol: HTTP, HTTPS, GRPC, HTTP2, MONGO, TCP, TLS.
    pub protocol: String,
    /// Label of the port.
    pub name: String,
    /// The port on the workload, where it differs (ServiceEntry ports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

// ---------------------------------------------------------------------------------------
// VirtualService

/// `VirtualService` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct VirtualService {
    /// Destination hosts the rules apply to.
    pub hosts: Vec<String>,
    /// Gateways (`ns/name` or `name`, `mesh` for sidecars) the rules apply to; empty = `mesh`.
    pub gateways: Vec<String>,
    /// Ordered HTTP routing rules.
    pub http: Vec<HttpRoute>,
    /// Ordered rules for opaque TCP traffic.
    pub tcp: Vec<TcpRoute>,
    /// Ordered rules for unterminated TLS traffic (by SNI).
    pub tls: Vec<TlsRoute>,
    /// Namespaces this VirtualService is exported to; empty = all.
    pub export_to: Vec<String>,
}

/// One TCP routing rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TcpRoute {
    /// Match conditions, ORed; empty matches every connection.
    #[serde(rename = "match")]
    pub matches: Vec<L4MatchAttributes>,
    /// Weighted destinations.
    pub route: Vec<RouteDestination>,
}

/// One TLS routing rule (unterminated TLS, routed by SNI).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsRoute {
    /// Match conditions, ORed; each must name `sniHosts`.
    #[serde(rename = "match")]
    pub matches: Vec<TlsMatchAttributes>,
    /// Weighted destinations.
    pub route: Vec<RouteDestination>,
}

/// Connection-level match conditions of a TCP rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct L4MatchAttributes {
    /// Destination IPs or CIDRs.
    pub destination_subnets: Vec<String>,
    /// Destination port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels the source workload must carry.
    pub source_labels: BTreeMap<String, String>,
    /// Gateways (`mesh` for sidecars) the match applies to; empty = the rule's gateways.
    pub gateways: Vec<String>,
    /// The source workload's namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
}

/// Match conditions of a TLS rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsMatchAttributes {
    /// SNI values to match (`*` wildcards allowed).
    pub sni_hosts: Vec<String>,
    /// Destination IPs or CIDRs.
    pub destination_subnets: Vec<String>,
    /// Destination port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels the source workload must carry.
    pub source_labels: BTreeMap<String, String>,
    /// Gateways (`mesh` for sidecars) the match applies to; empty = the rule's gateways.
    pub gateways: Vec<String>,
    /// The source workload's namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
}

/// A weighted destination of a TCP or TLS rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteDestination {
    /// Where to send traffic.
    pub destination: Destination,
    /// Relative weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// One HTTP routing rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRoute {
    /// Name of the route, for debugging.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Match conditions, ORed; empty matches everything.
    #[serde(rename = "match")]
    pub matches: Vec<HttpMatchRequest>,
    /// Weighted destinations.
    pub route: Vec<HttpRouteDestination>,
    /// A redirect instead of forwarding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    /// Rewrite of URI / authority before forwarding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
    /// Request timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Retry policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
}

/// Match conditions of an HTTP rule; fields are ANDed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpMatchRequest {
    /// Name of the match, for debugging.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// URI match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    /// Header matches (lowercase names).
    pub headers: BTreeMap<String, StringMatch>,
    /// HTTP method match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    /// Authority match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// Restrict to this listener port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Restrict to these gateways.
    pub gateways: Vec<String>,
    /// Case-insensitive URI matching.
    pub ignore_uri_case: bool,
}

/// A string match: exactly one of exact, prefix or regex (RE2 syntax).
///
/// On the wire it is Istio's object form (`{exact: "x"}`), read through [`StringMatchRepr`]
/// so every format (YAML, JSON, msgpack) accepts it and "exactly one" is enforced.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "StringMatchRepr", into = "StringMatchRepr")]
pub enum StringMatch {
    /// Exact string.
    Exact(String),
    /// Prefix.
    Prefix(String),
    /// RE2 regular expression, matched against the whole value.
    Regex(String),
}

/// The object form of [`StringMatch`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StringMatchRepr {
    /// Exact string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    /// Prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// RE2 regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

impl TryFrom<StringMatchRepr> for StringMatch {
    type Error = String;

    fn try_from(r: StringMatchRepr) -> Result<Self, Self::Error> {
        match (r.exact, r.prefix, r.regex) {
            (Some(s), None, None) => Ok(StringMatch::Exact(s)),
            (None, Some(s), None) => Ok(StringMatch::Prefix(s)),
            (None, None, Some(s)) => Ok(StringMatch::Regex(s)),
            _ => Err("a string match needs exactly one of exact, prefix or regex".to_string()),
        }
    }
}

impl From<StringMatch> for StringMatchRepr {
    fn from(m: StringMatch) -> Self {
        let mut r = StringMatchRepr::default();
        match m {
            StringMatch::Exact(s) => r.exact = Some(s),
            StringMatch::Prefix(s) => r.prefix = Some(s),
            StringMatch::Regex(s) => r.regex = Some(s),
        }
        r
    }
}

/// A weighted destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRouteDestination {
    /// Where to send traffic.
    pub destination: Destination,
    /// Relative weight; when weights are given they must sum to 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// A destination service (and optional subset and port).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Destination {
    /// Service hostname (short names resolve in the VirtualService's namespace).
    pub host: String,
    /// DestinationRule subset name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    /// Port on the destination host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

/// Selects a port by number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct PortSelector {
    /// Port number.
    pub number: u32,
}

/// An HTTP redirect.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRedirect {
    /// Replacement path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Replacement authority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// Replacement port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Replacement scheme.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Status code (default 301).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
}

/// An HTTP rewrite.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRewrite {
    /// Replaces the matched path prefix (or the whole path for exact/regex matches).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Replaces the Host/Authority header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
}

/// Retry policy.
#[derive(Debug, Clone, PartialEq, Hash, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRetry {
    /// Number of retries.
    pub attempts: u32,
    /// Timeout per attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<Duration>,
    /// Envoy `retry_on` conditions, comma-separated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<String>,
}

// ---------------------------------------------------------------------------------------
// DestinationRule

/// `DestinationRule` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct DestinationRule {
    /// The service the rule applies to.
    pub host: String,
    /// Policy for all subsets unless overridden.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
    /// Named subsets.
    pub subsets: Vec<Subset>,
    /// Namespaces this rule is exported to; empty = all.
    pub export_to: Vec<String>,
}

/// A named subset of a service's endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Subset {
    /// Subset name (used in cluster names).
    pub name: String,
    /// Labels the endpoints must carry.
    pub labels: BTreeMap<String, String>,
    /// Policy overriding the rule's policy for this subset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
}

/// Traffic policy of a destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TrafficPolicy {
    /// Load-balancer settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
}

/// Load-balancer settings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LoadBalancerSettings {
    /// A simple algorithm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simple: Option<SimpleLb>,
}

/// Simple load-balancing algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    /// Envoy's default (least request in Istio).
    Unspecified,
    /// Least request.
    LeastRequest,
    /// Least connections (Envoy: least request).
    LeastConn,
    /// Random.
    Random,
    /// Pass through to the original destination.
    Passthrough,
    /// Round robin.
    RoundRobin,
}

// ---------------------------------------------------------------------------------------
// Sidecar

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

// ---------------------------------------------------------------------------------------
// ServiceEntry / WorkloadEntry

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_match_object_form() {
        let m: StringMatch = serde_json::from_str(r#"{"prefix": "/api"}"#).unwrap();
        assert_eq!(m, StringMatch::Prefix("/api".into()));
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"prefix":"/api"}"#);
        assert!(serde_json::from_str::<StringMatch>(r#"{"prefix": "/a", "exact": "/b"}"#).is_err());
        assert!(serde_json::from_str::<StringMatch>(r#"{}"#).is_err());
        let bytes = rmp_serde::to_vec_named(&m).unwrap();
        assert_eq!(rmp_serde::from_slice::<StringMatch>(&bytes).unwrap(), m);
    }
}
