//! Istio's ambient xDS types, what ztunnel reads: `istio.workload.Address`
//! (`workload.proto`) and `istio.security.Authorization` (`authorization.proto`), as
//! istio/ztunnel's `proto/` defines them. Written by hand, only the fields shoal sets; an
//! unknown field is skipped by any protobuf reader, so the tags are what must match.

/// An address ztunnel can resolve: a workload or a service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Address {
    /// Which one.
    #[prost(oneof = "address::Type", tags = "1, 2")]
    pub r#type: Option<address::Type>,
}

/// `Address`'s oneof.
pub mod address {
    /// A workload or a service.
    // As prost generates it: the variants are built once per resource, boxing gains nothing.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Type {
        /// A workload (a pod).
        #[prost(message, tag = "1")]
        Workload(super::Workload),
        /// A service.
        #[prost(message, tag = "2")]
        Service(super::Service),
    }
}

/// A service: its addresses and ports.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Service {
    /// Service name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Service namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// The FQDN.
    #[prost(string, tag = "3")]
    pub hostname: String,
    /// Virtual IPs.
    #[prost(message, repeated, tag = "4")]
    pub addresses: Vec<NetworkAddress>,
    /// Ports.
    #[prost(message, repeated, tag = "5")]
    pub ports: Vec<Port>,
    /// SPIFFE identities the service may present (beyond its workloads').
    #[prost(string, repeated, tag = "6")]
    pub subject_alt_names: Vec<String>,
}

/// A workload.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Workload {
    /// Unique id: `<cluster>//Pod/<namespace>/<name>` for a pod,
    /// `<cluster>/networking.istio.io/WorkloadEntry/<namespace>/<name>` for a WorkloadEntry.
    #[prost(string, tag = "20")]
    pub uid: String,
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// IP addresses (4 or 16 bytes each).
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub addresses: Vec<Vec<u8>>,
    /// Network (empty: the default network).
    #[prost(string, tag = "4")]
    pub network: String,
    /// A DNS name ztunnel resolves, for a workload without addresses (a WorkloadEntry
    /// whose address is a name).
    #[prost(string, tag = "21")]
    pub hostname: String,
    /// How to reach the workload: [`TunnelProtocol`].
    #[prost(enumeration = "TunnelProtocol", tag = "5")]
    pub tunnel_protocol: i32,
    /// Trust domain of its identity.
    #[prost(string, tag = "6")]
    pub trust_domain: String,
    /// Service account of its identity.
    #[prost(string, tag = "7")]
    pub service_account: String,
    /// Node the workload runs on.
    #[prost(string, tag = "9")]
    pub node: String,
    /// `app` / `service.istio.io/canonical-name`.
    #[prost(string, tag = "10")]
    pub canonical_name: String,
    /// `version` / `service.istio.io/canonical-revision`.
    #[prost(string, tag = "11")]
    pub canonical_revision: String,
    /// [`WorkloadType`].
    #[prost(enumeration = "WorkloadType", tag = "12")]
    pub workload_type: i32,
    /// The controller's name (here: the pod's).
    #[prost(string, tag = "13")]
    pub workload_name: String,
    /// The workload terminates `tunnel_protocol` itself (a pod labelled
    /// `networking.istio.io/tunnel: http`), so ztunnel neither tunnels nor de-tunnels it.
    #[prost(bool, tag = "14")]
    pub native_tunnel: bool,
    /// Authorization policies (`<ns>/<name>`) that select this workload.
    #[prost(string, repeated, tag = "16")]
    pub authorization_policies: Vec<String>,
    /// [`WorkloadStatus`].
    #[prost(enumeration = "WorkloadStatus", tag = "17")]
    pub status: i32,
    /// Cluster id.
    #[prost(string, tag = "18")]
    pub cluster_id: String,
    /// Services (`<ns>/<hostname>`) the workload is behind, with their ports. A protobuf
    /// map: shoal puts it in key order (see `generate::ordered_map`).
    #[prost(map = "string, message", tag = "22")]
    pub services: std::collections::HashMap<String, PortList>,
}

/// A list of ports (a map value).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PortList {
    /// Ports.
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<Port>,
}

/// A service port and the workload port behind it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Port {
    /// Service port.
    #[prost(uint32, tag = "1")]
    pub service_port: u32,
    /// Workload port (0: the same as the service port).
    #[prost(uint32, tag = "2")]
    pub target_port: u32,
}

/// An IP in a network.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NetworkAddress {
    /// Network (empty: the default network).
    #[prost(string, tag = "1")]
    pub network: String,
    /// 4 or 16 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub address: Vec<u8>,
}

/// `Workload.tunnel_protocol`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum TunnelProtocol {
    /// Plain traffic (not in the mesh, or behind a sidecar).
    None = 0,
    /// HTTP CONNECT over mTLS to port 15008 (ambient).
    Hbone = 1,
}

/// `Workload.workload_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum WorkloadType {
    /// A Deployment.
    Deployment = 0,
    /// A CronJob.
    Cronjob = 1,
    /// A pod.
    Pod = 2,
    /// A Job.
    Job = 3,
}

/// `Workload.status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum WorkloadStatus {
    /// Ready.
    Healthy = 0,
    /// Not ready.
    Unhealthy = 1,
}

/// An L4 authorization policy (`istio.security.Authorization`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Authorization {
    /// Policy name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Policy namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// [`Scope`].
    #[prost(enumeration = "Scope", tag = "3")]
    pub scope: i32,
    /// [`Action`].
    #[prost(enumeration = "Action", tag = "4")]
    pub action: i32,
    /// Any rule matching matches the policy.
    #[prost(message, repeated, tag = "5")]
    pub rules: Vec<Rule>,
}

/// A rule: every clause must match.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Rule {
    /// Clauses.
    #[prost(message, repeated, tag = "1")]
    pub clauses: Vec<Clause>,
}

/// A clause: any match matching matches the clause.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Clause {
    /// Matches.
    #[prost(message, repeated, tag = "2")]
    pub matches: Vec<Match>,
}

/// A match: every non-empty field must match (any of its values; none of the `not_`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Match {
    /// Source namespaces.
    #[prost(message, repeated, tag = "1")]
    pub namespaces: Vec<StringMatch>,
    /// Source namespaces excluded.
    #[prost(message, repeated, tag = "2")]
    pub not_namespaces: Vec<StringMatch>,
    /// Source identities (`<td>/ns/<ns>/sa/<sa>`).
    #[prost(message, repeated, tag = "3")]
    pub principals: Vec<StringMatch>,
    /// Source identities excluded.
    #[prost(message, repeated, tag = "4")]
    pub not_principals: Vec<StringMatch>,
    /// Source IP blocks.
    #[prost(message, repeated, tag = "5")]
    pub source_ips: Vec<IpBlock>,
    /// Source IP blocks excluded.
    #[prost(message, repeated, tag = "6")]
    pub not_source_ips: Vec<IpBlock>,
    /// Destination ports.
    #[prost(uint32, repeated, tag = "9")]
    pub destination_ports: Vec<u32>,
    /// Destination ports excluded.
    #[prost(uint32, repeated, tag = "10")]
    pub not_destination_ports: Vec<u32>,
    /// Source service accounts.
    #[prost(message, repeated, tag = "11")]
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// Source service accounts excluded.
    #[prost(message, repeated, tag = "12")]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

/// An IP block (`istio.security.Address`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct IpBlock {
    /// 4 or 16 bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub address: Vec<u8>,
    /// Prefix length.
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

/// A service account in a namespace.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServiceAccountMatch {
    /// Namespace.
    #[prost(string, tag = "1")]
    pub namespace: String,
    /// Service account.
    #[prost(string, tag = "2")]
    pub service_account: String,
}

/// A string match.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringMatch {
    /// How.
    #[prost(oneof = "string_match::MatchType", tags = "1, 2, 3, 4")]
    pub match_type: Option<string_match::MatchType>,
}

/// `StringMatch`'s oneof.
pub mod string_match {
    /// Exact, prefix, suffix or presence.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum MatchType {
        /// Equal.
        #[prost(string, tag = "1")]
        Exact(String),
        /// Starts with.
        #[prost(string, tag = "2")]
        Prefix(String),
        /// Ends with.
        #[prost(string, tag = "3")]
        Suffix(String),
        /// Any value (`*`).
        #[prost(message, tag = "4")]
        Presence(()),
    }
}

/// `Authorization.scope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Scope {
    /// Every workload of the mesh (a policy in the root namespace).
    Global = 0,
    /// Every workload of the policy's namespace.
    Namespace = 1,
    /// The workloads that list the policy in `authorization_policies`.
    WorkloadSelector = 2,
}

/// `Authorization.action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Action {
    /// Allow matches (deny the rest once any ALLOW applies).
    Allow = 0,
    /// Deny matches.
    Deny = 1,
}
