//! CDS: one cluster per visible service port (`outbound|<port>||<host>`), one per
//! DestinationRule subset (`outbound|<port>|<subset>|<host>`), and Istio's two fixed
//! clusters.

use super::mtls::{self, IstioMutual};
use super::traffic_policy::{self, default_circuit_breakers};
use super::{ads_config_source, pb_duration, socket_address, Resource};
use crate::index::destination_rule::effective_policy;
use crate::index::endpoints::EndpointIndex;
use crate::index::peer_authentication::{self, MtlsMode};
use crate::index::proxy::{Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use crate::index::service::{ServiceSource, ServiceView};
use crate::index::tls_mode;
use shoal_common::model::{
    ClientTlsMode, Protocol, Resolution, ServicePort, SimpleLb, TrafficPolicy, WorkloadEntry,
};
use shoal_proto::pb::envoy::config::cluster::v3::{circuit_breakers::Thresholds, CircuitBreakers};
use shoal_proto::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType, DnsLookupFamily, EdsClusterConfig, LbPolicy},
    Cluster,
};
use shoal_proto::pb::envoy::config::core::v3::Http2ProtocolOptions;
use shoal_proto::pb::envoy::config::core::v3::{
    socket_address::PortSpecifier, BindConfig, SocketAddress,
};
use shoal_proto::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use shoal_proto::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{
        explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions,
    },
    HttpProtocolOptions,
};
use shoal_proto::pb::google::protobuf::UInt32Value;
use shoal_proto::{outbound_cluster_name, sni_dnat_cluster_name, XdsType};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Istio's default upstream connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Name of the cluster that drops traffic.
pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
/// Name of the cluster that forwards to the original destination.
pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
/// Name of the cluster that forwards inbound traffic for undeclared ports to the app.
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";
/// The source address of the sidecar's connections to its own app: iptables lets traffic
/// from it reach the app instead of capturing it again (istio-iptables excludes it).
pub const INBOUND_PASSTHROUGH_BIND: &str = "127.0.0.6";

/// istiod's inbound cluster name: `inbound|<port>||`.
pub fn inbound_cluster_name(port: u16) -> String {
    format!("inbound|{port}||")
}

/// Everything one cluster is built from. Building reads nothing else, so two proxies whose
/// keys are equal share the cached bytes, and no input can be left out of the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClusterKey {
    /// Istio's `BlackHoleCluster`.
    Blackhole,
    /// Istio's `PassthroughCluster`.
    Passthrough,
    /// Istio's `InboundPassthroughCluster` (captured sidecars).
    InboundPassthrough,
    /// istiod's `connect_originate`: HBONE to ambient endpoints (see [`super::hbone`]).
    ConnectOriginate,
    /// `inbound|<port>||`: a captured sidecar's path to its app on one port.
    Inbound {
        /// The workload port.
        port: u16,
        /// The port speaks HTTP/2 (h2c, gRPC) to the app.
        http2: bool,
        /// A Sidecar ingress `defaultEndpoint` on the loopback (`127.0.0.1:8080`); else
        /// the original destination (the pod IP and port).
        endpoint: Option<(String, u16)>,
    },
    /// `outbound|<port>|<subset>|<host>`.
    Service {
        /// The cluster name.
        name: String,
        /// The service.
        svc: Arc<ServiceView>,
        /// The service port.
        port: ServicePort,
        /// The effective traffic policy for the port (subset merged over rule, port-level
        /// settings resolved); boxed to keep keys small.
        policy: Option<Box<TrafficPolicy>>,
        /// Subset labels (empty for the service-wide cluster).
        subset_labels: BTreeMap<String, String>,
        /// Forward to the original destination (a headless Service seen by a captured
        /// sidecar: the app dialed one pod's address, as istiod's `ORIGINAL_DST` clusters).
        original_dst: bool,
        /// The Istio mutual TLS the cluster originates (the rule's `ISTIO_MUTUAL`, or auto
        /// mTLS); boxed to keep keys small.
        istio_mutual: Option<Box<IstioMutual>>,
        /// The proxy sends HBONE: ambient endpoints go through `connect_originate`.
        hbone: bool,
    },
}

/// The clusters a proxy with this scope needs.
pub fn keys(
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
    endpoints: &EndpointIndex,
) -> Vec<ClusterKey> {
    let mut out = inbound_keys(proxy, scope);
    out.extend(outbound_keys(proxy, scope, ctx, endpoints));
    out
}

/// The keys of a captured sidecar's inbound clusters (its own side: none for others).
pub fn inbound_keys(proxy: &Proxy, scope: &ProxyScope) -> Vec<ClusterKey> {
    let mut out = Vec::new();
    if proxy.kind == ProxyKind::Sidecar && proxy.interception.captured() {
        out.push(ClusterKey::InboundPassthrough);
        for p in &scope.inbound {
            out.push(ClusterKey::Inbound {
                port: p.port,
                http2: matches!(p.protocol, Protocol::Http2 | Protocol::Grpc),
                endpoint: p.default_endpoint.as_deref().and_then(loopback_endpoint),
            });
        }
    }
    out
}

/// The keys of every cluster but the inbound ones: a sidecar's outbound side, the same for
/// every sidecar of its outbound part (see `push::view`).
pub fn outbound_keys(
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
    endpoints: &EndpointIndex,
) -> Vec<ClusterKey> {
    let mut out = vec![ClusterKey::Blackhole, ClusterKey::Passthrough];
    let hbone = super::hbone::sends_hbone(proxy);
    if hbone {
        out.push(ClusterKey::ConnectOriginate);
    }
    let captured = proxy.kind == ProxyKind::Sidecar && proxy.interception.captured();
    for svc in &scope.services {
        // Forward to the original destination: a headless Service seen by a captured
        // sidecar, or a ServiceEntry with `resolution: NONE` at a sidecar (gateways
        // cannot, so istiod gives them an EDS cluster of the entry's endpoints).
        let original_dst = match &svc.source {
            ServiceSource::Kubernetes => captured && svc.vips.is_empty(),
            ServiceSource::ServiceEntry { resolution, .. } => {
                *resolution == Resolution::None && proxy.kind != ProxyKind::Router
            }
        };
        let dr = ctx.destination_rule(&proxy.namespace, &proxy.labels, svc);
        let rule_policy = dr.as_ref().and_then(|d| d.spec.traffic_policy.as_deref());
        let destination = Destination::new(ctx, endpoints, svc);
        for port in &svc.ports {
            let policy = effective_policy(rule_policy, None, port.port);
            out.push(ClusterKey::Service {
                name: outbound_cluster_name(port.port.into(), "", &svc.hostname),
                svc: svc.clone(),
                port: port.clone(),
                istio_mutual: destination
                    .istio_mutual(port.port, "", policy.as_ref())
                    .map(Box::new),
                policy: policy.map(Box::new),
                subset_labels: BTreeMap::new(),
                original_dst,
                hbone,
            });
            for subset in dr
                .as_ref()
                .map(|d| d.spec.subsets.as_slice())
                .unwrap_or_default()
            {
                let policy =
                    effective_policy(rule_policy, subset.traffic_policy.as_ref(), port.port);
                out.push(ClusterKey::Service {
                    name: outbound_cluster_name(port.port.into(), &subset.name, &svc.hostname),
                    svc: svc.clone(),
                    port: port.clone(),
                    istio_mutual: destination
                        .istio_mutual(port.port, &subset.name, policy.as_ref())
                        .map(Box::new),
                    policy: policy.map(Box::new),
                    subset_labels: subset.labels.clone(),
                    original_dst,
                    hbone,
                });
            }
        }
    }
    if super::gateway::has_auto_passthrough(proxy, ctx) {
        out.extend(sni_dnat_keys(proxy, scope, ctx));
    }
    out
}

/// istiod's `buildOutboundSniDnatClusters`, for a gateway with an `AUTO_PASSTHROUGH`
/// server: per in-mesh service port (and DestinationRule subset) an EDS cluster named
/// `outbound_.<port>_.<subset>_.<host>` with the rule's traffic policy but no TLS — the
/// connection it carries is already the caller's Istio mTLS, passed through.
fn sni_dnat_keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<ClusterKey> {
    let mut out = Vec::new();
    for svc in &scope.services {
        if matches!(
            svc.source,
            ServiceSource::ServiceEntry {
                mesh_internal: false,
                ..
            }
        ) {
            continue;
        }
        let dr = ctx.destination_rule(&proxy.namespace, &proxy.labels, svc);
        let rule_policy = dr.as_ref().and_then(|d| d.spec.traffic_policy.as_deref());
        let without_tls = |mut p: TrafficPolicy| {
            p.tls = None;
            Box::new(p)
        };
        for port in &svc.ports {
            out.push(ClusterKey::Service {
                name: sni_dnat_cluster_name(port.port.into(), "", &svc.hostname),
                svc: svc.clone(),
                port: port.clone(),
                istio_mutual: None,
                policy: effective_policy(rule_policy, None, port.port).map(without_tls),
                subset_labels: BTreeMap::new(),
                original_dst: false,
                hbone: false,
            });
            for subset in dr
                .as_ref()
                .map(|d| d.spec.subsets.as_slice())
                .unwrap_or_default()
            {
                let policy =
                    effective_policy(rule_policy, subset.traffic_policy.as_ref(), port.port);
                out.push(ClusterKey::Service {
                    name: sni_dnat_cluster_name(port.port.into(), &subset.name, &svc.hostname),
                    svc: svc.clone(),
                    port: port.clone(),
                    istio_mutual: None,
                    policy: policy.map(without_tls),
                    subset_labels: subset.labels.clone(),
                    original_dst: false,
                    hbone: false,
                });
            }
        }
    }
    out
}

/// Builds one cluster from its key alone.
pub fn build(key: &ClusterKey) -> Resource {
    match key {
        ClusterKey::Blackhole => {
            Resource::new(XdsType::Cluster, BLACKHOLE_CLUSTER.into(), &blackhole())
        }
        ClusterKey::Passthrough => {
            Resource::new(XdsType::Cluster, PASSTHROUGH_CLUSTER.into(), &passthrough())
        }
        ClusterKey::InboundPassthrough => Resource::new(
            XdsType::Cluster,
            INBOUND_PASSTHROUGH_CLUSTER.into(),
            &inbound_passthrough(),
        ),
        ClusterKey::ConnectOriginate => super::hbone::cluster(),
        ClusterKey::Inbound {
            port,
            http2,
            endpoint,
        } => {
            let name = inbound_cluster_name(*port);
            let c = inbound(&name, *http2, endpoint.as_ref());
            Resource::new(XdsType::Cluster, name, &c)
        }
        ClusterKey::Service {
            name,
            svc,
            port,
            policy,
            subset_labels,
            original_dst,
            istio_mutual,
            hbone,
        } => {
            let mut c = cluster(name, svc, port, subset_labels);
            if *original_dst {
                c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                    DiscoveryType::OriginalDst as i32,
                ));
                c.eds_cluster_config = None;
            }
            traffic_policy::apply(
                &mut c,
                port.protocol,
                policy.as_deref(),
                istio_mutual.as_deref(),
            );
            // An ORIGINAL_DST cluster has no endpoints to tunnel.
            if *hbone && !*original_dst {
                super::hbone::add_transport_socket_match(&mut c);
            }
            with_service_metadata(name, &c, svc)
        }
    }
}

/// What a destination service means for Istio mutual TLS to it: whether it is in the mesh,
/// its identities, whether all of its endpoints have sidecars, its namespace's mode.
struct Destination<'a> {
    svc: &'a ServiceView,
    /// A Kubernetes service or a `MESH_INTERNAL` ServiceEntry.
    in_mesh: bool,
    /// Its SPIFFE identities, sorted (istiod's `ServiceAccounts`).
    sans: Vec<String>,
    /// There are endpoints and all have sidecars.
    all_sidecars: bool,
    /// Auto mTLS applies (mesh setting on, namespace/mesh PeerAuthentication not DISABLE).
    auto: bool,
}

impl<'a> Destination<'a> {
    fn new(ctx: &PushContext, endpoints: &EndpointIndex, svc: &'a ServiceView) -> Self {
        let td = &ctx.mesh.trust_domain;
        let (in_mesh, accounts, all_sidecars) = match &svc.source {
            ServiceSource::Kubernetes => {
                let ids = endpoints.identities(&svc.hostname);
                (
                    true,
                    ids.map(|i| {
                        i.accounts
                            .iter()
                            .map(|(ns, sa)| mtls::spiffe_id(td, ns, sa))
                            .collect()
                    })
                    .unwrap_or_default(),
                    ids.is_some_and(|i| i.all_sidecars),
                )
            }
            ServiceSource::ServiceEntry {
                endpoints,
                mesh_internal,
                ..
            } => (
                *mesh_internal,
                endpoints
                    .iter()
                    .filter_map(|e| e.service_account.as_deref().filter(|sa| !sa.is_empty()))
                    .map(|sa| mtls::spiffe_id(td, &svc.namespace, sa))
                    .collect(),
                !endpoints.is_empty() && endpoints.iter().all(tls_mode::workload_entry_has_sidecar),
            ),
        };
        let mut sans: Vec<String> = accounts;
        sans.sort();
        sans.dedup();
        Destination {
            svc,
            in_mesh,
            sans,
            all_sidecars,
            auto: ctx.mesh.enable_auto_mtls
                && peer_authentication::namespace_mode(ctx, &svc.namespace) != MtlsMode::Disable,
        }
    }

    /// istiod's `buildUpstreamTLSSettings`: a rule's `ISTIO_MUTUAL` (its `sni` and
    /// `subjectAltNames` where set, else the cluster's SNI and the destination's
    /// identities); without TLS in the rule, auto mTLS to in-mesh destinations — for
    /// passthrough destinations (headless, `resolution: NONE`, `PASSTHROUGH` load
    /// balancing) only when every endpoint has a sidecar.
    fn istio_mutual(
        &self,
        port: u16,
        subset: &str,
        policy: Option<&TrafficPolicy>,
    ) -> Option<IstioMutual> {
        let sni = mtls::outbound_sni(port.into(), subset, &self.svc.hostname);
        match policy.and_then(|p| p.tls.as_ref()) {
            Some(tls) if tls.mode == ClientTlsMode::IstioMutual => Some(IstioMutual {
                sni: tls.sni.clone().filter(|s| !s.is_empty()).unwrap_or(sni),
                sans: if tls.subject_alt_names.is_empty() {
                    self.sans.clone()
                } else {
                    tls.subject_alt_names.clone()
                },
                auto_detected: false,
            }),
            Some(_) => None,
            None => {
                if !self.in_mesh || !self.auto {
                    return None;
                }
                let passthrough = match &self.svc.source {
                    ServiceSource::Kubernetes => self.svc.vips.is_empty(),
                    ServiceSource::ServiceEntry { resolution, .. } => {
                        *resolution == Resolution::None
                    }
                } || policy
                    .and_then(|p| p.load_balancer.as_ref())
                    .and_then(|lb| lb.simple)
                    == Some(SimpleLb::Passthrough);
                if passthrough && !self.all_sidecars {
                    return None;
                }
                Some(IstioMutual {
                    sni,
                    sans: self.sans.clone(),
                    auto_detected: true,
                })
            }
        }
    }
}

/// A Sidecar ingress `defaultEndpoint` that names a loopback address (`127.0.0.1:8080`,
/// `[::1]:8080`): the app listens there, so the cluster is static. `0.0.0.0:<port>` (the
/// instance IP) and unix sockets forward to the original destination.
fn loopback_endpoint(ep: &str) -> Option<(String, u16)> {
    let addr: std::net::SocketAddr = ep.parse().ok()?;
    addr.ip()
        .is_loopback()
        .then(|| (addr.ip().to_string(), addr.port()))
}

/// Istio's inbound clusters have no circuit-breaking limits: the app is the only
/// upstream, and the caller's sidecar already limits.
fn unlimited() -> CircuitBreakers {
    let max = Some(UInt32Value { value: u32::MAX });
    CircuitBreakers {
        thresholds: vec![Thresholds {
            max_connections: max,
            max_pending_requests: max,
            max_requests: max,
            max_retries: max,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Connections to the app come from 127.0.0.6, which iptables does not capture again.
fn inbound_bind() -> BindConfig {
    BindConfig {
        source_address: Some(SocketAddress {
            address: INBOUND_PASSTHROUGH_BIND.into(),
            port_specifier: Some(PortSpecifier::PortValue(0)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn inbound(name: &str, http2: bool, endpoint: Option<&(String, u16)>) -> Cluster {
    let mut c = Cluster {
        name: name.to_string(),
        connect_timeout: Some(pb_duration(CONNECT_TIMEOUT)),
        circuit_breakers: Some(unlimited()),
        ..Default::default()
    };
    match endpoint {
        Some((ip, port)) => {
            c.cluster_discovery_type =
                Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32));
            c.load_assignment = Some(ClusterLoadAssignment {
                cluster_name: name.to_string(),
                endpoints: vec![LocalityLbEndpoints {
                    lb_endpoints: vec![LbEndpoint {
                        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                            address: Some(socket_address(ip, (*port).into())),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
        None => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            ));
            c.lb_policy = LbPolicy::ClusterProvided as i32;
            c.upstream_bind_config = Some(inbound_bind());
        }
    }
    if http2 {
        set_http2(&mut c);
    }
    c
}

fn inbound_passthrough() -> Cluster {
    let mut c = Cluster {
        name: INBOUND_PASSTHROUGH_CLUSTER.into(),
        connect_timeout: Some(pb_duration(CONNECT_TIMEOUT)),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: LbPolicy::ClusterProvided as i32,
        upstream_bind_config: Some(inbound_bind()),
        circuit_breakers: Some(unlimited()),
        ..Default::default()
    };
    // istiod builds it from the outbound passthrough cluster, options included.
    traffic_policy::store_http_options(&mut c, Some(traffic_policy::passthrough_http_options()));
    c
}

/// An outbound cluster before its traffic policy: name, discovery, endpoints.
fn cluster(
    name: &str,
    svc: &ServiceView,
    port: &ServicePort,
    subset_labels: &BTreeMap<String, String>,
) -> Cluster {
    let mut c = Cluster {
        name: name.to_string(),
        connect_timeout: Some(pb_duration(CONNECT_TIMEOUT)),
        ..Default::default()
    };
    let dns = |c: &mut Cluster, ty: DiscoveryType| {
        c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(ty as i32));
        c.dns_lookup_family = DnsLookupFamily::V4Only as i32;
        c.load_assignment = Some(dns_load_assignment(name, svc, port, ty, subset_labels));
    };
    match &svc.source {
        ServiceSource::ServiceEntry {
            resolution: Resolution::Dns,
            ..
        } => dns(&mut c, DiscoveryType::StrictDns),
        ServiceSource::ServiceEntry {
            resolution: Resolution::DnsRoundRobin,
            ..
        } => dns(&mut c, DiscoveryType::LogicalDns),
        ServiceSource::Kubernetes | ServiceSource::ServiceEntry { .. } => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
            c.eds_cluster_config = Some(EdsClusterConfig {
                eds_config: Some(ads_config_source()),
                service_name: name.to_string(),
            });
        }
    }
    c
}

/// Speak HTTP/2 upstream.
fn set_http2(c: &mut Cluster) {
    {
        let opts = HttpProtocolOptions {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default(),
                    )),
                },
            )),
            ..Default::default()
        };
        traffic_policy::set_http_protocol_options(c, &opts);
    }
}

/// The workload port of a ServiceEntry endpoint for a service port: the endpoint's port of
/// the same name, else the port's `targetPort`, else the port number.
pub(crate) fn entry_port(
    svc: &ServiceView,
    port: &ServicePort,
    ep_ports: &BTreeMap<String, u32>,
) -> u32 {
    ep_ports
        .get(&port.name)
        .copied()
        .or_else(|| svc.target_ports.get(&port.port).map(|t| u32::from(*t)))
        .unwrap_or(port.port.into())
}

fn dns_load_assignment(
    name: &str,
    svc: &ServiceView,
    port: &ServicePort,
    ty: DiscoveryType,
    subset_labels: &BTreeMap<String, String>,
) -> ClusterLoadAssignment {
    let ServiceSource::ServiceEntry { endpoints, .. } = &svc.source else {
        return ClusterLoadAssignment {
            cluster_name: name.into(),
            ..Default::default()
        };
    };
    // A subset cluster holds the subset's endpoints, except with LOGICAL_DNS: Envoy rejects
    // it without exactly one address, so an empty subset must not reach it.
    let in_subset = |e: &&WorkloadEntry| {
        ty == DiscoveryType::LogicalDns
            || subset_labels
                .iter()
                .all(|(k, v)| e.labels.get(k) == Some(v))
    };
    let mut addrs: Vec<(String, u32)> = endpoints
        .iter()
        .filter(in_subset)
        .map(|e| (e.address.clone(), entry_port(svc, port, &e.ports)))
        .collect();
    if endpoints.is_empty() {
        // No endpoints: the proxy resolves the host itself.
        addrs.push((
            svc.hostname.clone(),
            entry_port(svc, port, &Default::default()),
        ));
    }
    if ty == DiscoveryType::LogicalDns {
        addrs.truncate(1); // Envoy requires exactly one address for LOGICAL_DNS.
    }
    let lb_endpoints = addrs
        .into_iter()
        .map(|(host, port)| LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(socket_address(&host, port)),
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn blackhole() -> Cluster {
    Cluster {
        name: BLACKHOLE_CLUSTER.into(),
        connect_timeout: Some(pb_duration(CONNECT_TIMEOUT)),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        ..Default::default()
    }
}

fn passthrough() -> Cluster {
    let mut c = Cluster {
        name: PASSTHROUGH_CLUSTER.into(),
        connect_timeout: Some(pb_duration(CONNECT_TIMEOUT)),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: LbPolicy::ClusterProvided as i32,
        circuit_breakers: Some(default_circuit_breakers()),
        ..Default::default()
    };
    traffic_policy::store_http_options(&mut c, Some(traffic_policy::passthrough_http_options()));
    c
}

/// A service cluster with istiod's `istio` metadata, `services: [{host, name,
/// namespace}]` (istio-proxy's stats read the destination service from it when the peer
/// sent no metadata). Struct maps are encoded by hand in key order (prost writes maps in
/// hash order), as `Cluster.metadata` (field 25), which shoal sets nowhere else.
fn with_service_metadata(name: &str, c: &Cluster, svc: &ServiceView) -> Resource {
    use super::telemetry::{delimited, encode_struct, J};
    use prost::Message as _;
    debug_assert!(c.metadata.is_none());
    let service = J::Obj(vec![
        ("host".into(), J::Str(svc.hostname.clone())),
        ("name".into(), J::Str(svc.name.clone())),
        ("namespace".into(), J::Str(svc.namespace.clone())),
    ]);
    let istio = encode_struct(&[("services".into(), J::List(vec![service]))]);
    let mut entry = Vec::new();
    delimited(1, b"istio", &mut entry);
    delimited(2, &istio, &mut entry);
    let mut metadata = Vec::new();
    delimited(1, &entry, &mut metadata);
    let mut value = c.encode_to_vec();
    delimited(25, &metadata, &mut value);
    let any = shoal_proto::Any {
        type_url: XdsType::Cluster.type_url().to_string(),
        value,
    };
    let version = shoal_proto::content_version(&any.value);
    Resource::from_parts(name.to_string(), version, any)
}
