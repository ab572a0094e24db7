//! `DestinationRule`: subsets and traffic policies.
//!
//! Every field added after the first release carries a serde default (and is skipped when
//! empty), so payloads written by an older ingester still decode.

use super::*;

/// `DestinationRule` spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct DestinationRule {
    /// The service the rule applies to.
    pub host: String,
    /// Policy for all subsets unless overridden (boxed: it is most of the rule's size).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<Box<TrafficPolicy>>,
    /// Named subsets.
    pub subsets: Vec<Subset>,
    /// Namespaces this rule is exported to; empty = all.
    pub export_to: Vec<String>,
    /// The workloads (in the rule's namespace) the rule applies to; none = all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<DestinationRuleSelector>,
}

/// A DestinationRule's `workloadSelector` (Istio's `WorkloadSelector`: `matchLabels`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct DestinationRuleSelector {
    /// Labels the proxy's workload must carry.
    pub match_labels: BTreeMap<String, String>,
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
    /// Connection limits and timeouts (circuit breakers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Ejection of failing endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// TLS origination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
    /// Per-port policies; a port's entry replaces the four settings above for that port.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub port_level_settings: Vec<PortTrafficPolicy>,
}

/// A traffic policy for one port (`portLevelSettings[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct PortTrafficPolicy {
    /// The port the policy applies to (VirtualService's `PortSelector`: `number`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
    /// Load-balancer settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection limits and timeouts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Ejection of failing endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// TLS origination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
}

/// Load-balancer settings: `simple` or `consistentHash` (one of them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LoadBalancerSettings {
    /// A simple algorithm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simple: Option<SimpleLb>,
    /// Session affinity by a hash of a header, cookie, source IP or query parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<ConsistentHashLb>,
    /// Locality-aware load balancing: weights per locality, or failover order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locality_lb_setting: Option<LocalityLbSetting>,
}

/// `localityLbSetting`: how traffic is spread over, or fails over between, localities
/// (`region/zone/subzone`) relative to the calling proxy's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LocalityLbSetting {
    /// `false` turns locality load balancing off for the destination (unset: on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Traffic shares per destination locality, for proxies in a source locality.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub distribute: Vec<LocalityDistribute>,
    /// The region to fail over to, for proxies in a region.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failover: Vec<LocalityFailover>,
    /// Labels (`key` or `key=value`) ordering endpoints by how many leading ones match
    /// the proxy's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failover_priority: Vec<String>,
}

/// `localityLbSetting.distribute[]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LocalityDistribute {
    /// The proxies' locality (`region/zone/subzone`, a trailing `*` matches any).
    pub from: String,
    /// Destination locality → percentage of traffic (the values sum to 100).
    pub to: BTreeMap<String, u32>,
}

/// `localityLbSetting.failover[]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct LocalityFailover {
    /// The proxies' region.
    pub from: String,
    /// The region their traffic fails over to when their own region has no healthy
    /// endpoint.
    pub to: String,
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

/// `consistentHash`: what to hash (exactly one of the four keys) and how.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsistentHashLb {
    /// Hash on this request header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_header_name: Option<String>,
    /// Hash on this cookie (generated when absent, if it has a `ttl`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_cookie: Option<HttpCookie>,
    /// Hash on the source IP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_source_ip: Option<bool>,
    /// Hash on this query parameter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_query_parameter_name: Option<String>,
    /// Envoy's ring hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_hash: Option<RingHash>,
    /// Envoy's Maglev.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maglev: Option<Maglev>,
    /// Deprecated: `ringHash.minimumRingSize`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

/// A cookie to hash on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpCookie {
    /// Cookie name.
    pub name: String,
    /// Cookie path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Lifetime of a generated cookie.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
}

/// `ringHash`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct RingHash {
    /// Minimum number of virtual nodes on the ring.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

/// `maglev`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Maglev {
    /// Lookup table size (a prime).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_size: Option<u64>,
}

/// `connectionPool`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ConnectionPoolSettings {
    /// TCP settings (HTTP and TCP upstreams).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpSettings>,
    /// HTTP settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSettings>,
}

/// `connectionPool.tcp`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TcpSettings {
    /// Maximum connections to the destination.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<i32>,
    /// TCP connect timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<Duration>,
    /// SO_KEEPALIVE settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// Maximum lifetime of a connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connection_duration: Option<Duration>,
    /// Idle timeout of a connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
}

/// `connectionPool.tcp.tcpKeepalive`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct TcpKeepalive {
    /// Unanswered probes before the connection is dead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probes: Option<u32>,
    /// Idle time before the first probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<Duration>,
    /// Time between probes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
}

/// `connectionPool.http`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpSettings {
    /// Maximum pending requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http1_max_pending_requests: Option<i32>,
    /// Maximum active requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http2_max_requests: Option<i32>,
    /// Maximum requests per connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_requests_per_connection: Option<i32>,
    /// Maximum concurrent retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<i32>,
    /// Idle timeout of an upstream connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// Whether HTTP/1.1 connections are upgraded to HTTP/2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub h2_upgrade_policy: Option<H2UpgradePolicy>,
    /// Speak upstream the protocol the client spoke.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_client_protocol: Option<bool>,
    /// Maximum concurrent streams per HTTP/2 connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<i32>,
}

/// `connectionPool.http.h2UpgradePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum H2UpgradePolicy {
    /// The mesh-wide default (do not upgrade).
    Default,
    /// Never upgrade.
    DoNotUpgrade,
    /// Upgrade to HTTP/2.
    Upgrade,
}

/// `outlierDetection`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct OutlierDetection {
    /// Count local-origin failures (connect errors, timeouts) apart from upstream 5xx.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_external_local_origin_errors: Option<bool>,
    /// Consecutive local-origin failures before ejection (with the split above).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_local_origin_failures: Option<u32>,
    /// Consecutive 502/503/504 (and connection errors) before ejection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<u32>,
    /// Consecutive 5xx (and connection errors) before ejection.
    #[serde(
        rename = "consecutive5xxErrors",
        skip_serializing_if = "Option::is_none"
    )]
    pub consecutive_5xx_errors: Option<u32>,
    /// Time between ejection sweeps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// Minimum ejection duration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_ejection_time: Option<Duration>,
    /// Maximum percentage of endpoints ejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<i32>,
    /// Below this percentage of healthy endpoints, ejection is off (panic threshold).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_health_percent: Option<i32>,
}

/// `tls`: TLS origination to the destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ClientTlsSettings {
    /// The TLS mode.
    pub mode: ClientTlsMode,
    /// A file with the CA certificates that verify the server (else the system roots).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    /// A file with the client certificate chain (`MUTUAL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<String>,
    /// A file with the client certificate's private key (`MUTUAL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// Subject alternative names the server certificate must carry (one of them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    /// SNI sent in the handshake.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Skip server certificate verification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
}

/// `tls.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClientTlsMode {
    /// Plaintext.
    #[default]
    Disable,
    /// TLS, verifying the server.
    Simple,
    /// Mutual TLS with a client certificate from files on the proxy.
    Mutual,
    /// Istio mutual TLS: the workload's certificate, the destination's identities.
    IstioMutual,
}
