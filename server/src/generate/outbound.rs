//! Outbound listeners of a captured sidecar, as istiod lays them out.
//!
//! iptables sends every outbound connection to `virtualOutbound` (15001). Its
//! `use_original_dst` hands the connection to the listener for the original destination:
//! `<vip>_<port>` when one exists, else `0.0.0.0_<port>`; a connection neither matches
//! goes through `virtualOutbound`'s own catch-all chain to `PassthroughCluster`
//! (`ALLOW_ANY`) or `BlackHoleCluster` (`REGISTRY_ONLY`).
//!
//! Per service port, by protocol (port name prefix or `appProtocol`):
//! - HTTP (`http`, `http2`, `grpc`): one shared `0.0.0.0_<port>` listener whose HTTP chain
//!   (selected by the HTTP inspector's ALPN) routes over RDS `"<port>"`; other bytes take
//!   the `PassthroughFilterChain`.
//! - TCP (`tcp`, `tls`, `https`, databases): `<vip>_<port>` with `tcp_proxy` to
//!   `outbound|<port>||<host>`, or per VirtualService `tcp`/`tls` rules.
//! - unknown (no protocol): sniffed — `<vip>_<port>` with an HTTP chain (RDS
//!   `"<host>:<port>"`) and a TCP chain, the HTTP inspector choosing between them.
//! - No VIP (headless Services, ServiceEntries with `resolution: NONE` and no addresses):
//!   `0.0.0.0_<port>`; their clusters forward to the original destination. istiod builds
//!   per-endpoint listeners for headless TCP ports; shoal keeps listeners independent of
//!   endpoints, which reaches the same pod (the original destination) with one listener.

use super::cds::{BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER};
use super::lds::{
    captured_listener, hcm_filter, http_connection_manager, http_inspector, tcp_proxy_filter,
    tls_inspector, HcmRoutes, ListenerKey, PLAINTEXT_HTTP_ALPNS,
};
use crate::index::config::Config;
use crate::index::hosts::{exported_to, labels_match, resolve_host, wildcard_covers};
use crate::index::proxy::{Interception, Proxy};
use crate::index::push_context::PushContext;
use crate::index::scope::{host_entry_matches, ProxyScope};
use crate::index::service::ServiceView;
use shoal_common::model::{
    OutboundTrafficMode, Protocol, RouteDestination, ServicePort, VirtualService,
};
use shoal_proto::pb::envoy::config::core::v3::{CidrRange, TrafficDirection};
use shoal_proto::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use shoal_proto::pb::google::protobuf::{BoolValue, UInt32Value};
use shoal_proto::{listener_name, outbound_cluster_name};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The port iptables redirects outbound connections to.
pub const VIRTUAL_OUTBOUND_PORT: u32 = 15001;
/// istiod's name of the outbound capture listener.
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
/// Any IPv4 address.
const WILDCARD: &str = "0.0.0.0";

/// Everything `virtualOutbound` is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VirtualOutboundKey {
    /// Where unmatched connections go.
    pub policy: OutboundTrafficMode,
    /// TPROXY interception.
    pub transparent: bool,
}

/// Everything one per-destination outbound listener is built from: the filter chains,
/// already resolved from services and VirtualServices.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutboundListenerKey {
    /// `<bind>_<port>`.
    pub name: String,
    /// The VIP, or `0.0.0.0`.
    pub bind: String,
    /// The destination port.
    pub port: u32,
    /// The RDS route of the HTTP chain, if the listener carries HTTP.
    pub http_route: Option<String>,
    /// TCP/TLS chains in match order.
    pub tcp: Vec<TcpChain>,
    /// Where connections no chain matches go.
    pub fallthrough: OutboundTrafficMode,
    /// TPROXY interception.
    pub transparent: bool,
    /// A gateway's TCP/TLS listener: it binds its port, and connections no chain matches
    /// are closed (no fallthrough chain).
    pub gateway: bool,
    /// The AuthorizationPolicies of a gateway, checked on its TCP/TLS chains (none on
    /// sidecars' outbound listeners).
    pub authz: super::authz::AuthzKey,
}

/// One TCP filter chain: its match and its weighted destinations.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TcpChain {
    /// Destination CIDRs to match (empty = any).
    pub destination_cidrs: Vec<String>,
    /// SNI values to match (empty = any; set only on TLS ports).
    pub sni_hosts: Vec<String>,
    /// `(cluster, weight)` destinations.
    pub clusters: Vec<(String, u32)>,
    /// A gateway server that terminates TLS on this chain (`SIMPLE`, `MUTUAL`).
    pub terminate: Option<TlsTermination>,
    /// ALPN values to match (empty = any): an `AUTO_PASSTHROUGH` chain admits only Istio
    /// mTLS ALPNs.
    pub application_protocols: Vec<String>,
}

/// TLS termination on a gateway chain: the credential (over SDS) and what follows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TlsTermination {
    /// The Secret named in `credentialName`.
    pub credential: String,
    /// `MUTUAL`: a client certificate signed by the credential's CA is required.
    pub mutual: bool,
    /// HTTPS servers: the RDS route of the HTTP connection manager after termination;
    /// `None` (TLS servers): the chain's `tcp_proxy` to `clusters`.
    pub http_route: Option<String>,
}

impl TcpChain {
    fn matches_all(&self) -> bool {
        self.destination_cidrs.is_empty() && self.sni_hosts.is_empty()
    }
}

/// What kind of traffic an outbound listener carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Http,
    Tcp,
    Sniffed,
}

fn class_of(p: Protocol) -> Class {
    match p {
        Protocol::Http | Protocol::Http2 | Protocol::Grpc => Class::Http,
        Protocol::Tcp | Protocol::Tls | Protocol::Https => Class::Tcp,
        Protocol::Unsupported => Class::Sniffed,
    }
}

/// One listener under construction: HTTP and TCP on one address make it sniffed.
struct Entry {
    http_route: Option<String>,
    tcp: Vec<TcpChain>,
}

/// The outbound listener keys of a captured sidecar: `virtualOutbound` and one listener per
/// destination address and port.
pub fn keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<ListenerKey> {
    let transparent = proxy.interception == Interception::Tproxy;
    let mut entries: BTreeMap<(String, u32), Entry> = BTreeMap::new();
    let vss = mesh_virtual_services(proxy, ctx);

    // A Sidecar egress listener with a port (and capture) owns that port: only its hosts
    // get listeners there, with its protocol. The catch-all (no port) or no Sidecar: every
    // visible service, on the ports no egress listener owns.
    let egress = scope
        .sidecar
        .as_ref()
        .map(|s| s.spec.egress.as_slice())
        .unwrap_or_default();
    let mut owned: BTreeSet<u32> = BTreeSet::new();
    for l in egress {
        let Some(port) = &l.port else { continue };
        if l.capture_mode.as_deref() == Some("NONE") {
            continue;
        }
        owned.insert(port.number);
        let protocol = Protocol::parse(&port.protocol);
        for svc in scope.services.iter().filter(|svc| {
            l.hosts
                .iter()
                .any(|h| host_entry_matches(h, &proxy.namespace, svc))
        }) {
            let sp = ServicePort {
                name: port.name.clone(),
                port: u16::try_from(port.number).unwrap_or_default(),
                protocol,
                target_port: None,
            };
            add_service_port(&mut entries, proxy, svc, &sp, &vss);
        }
    }
    let catch_all = egress.is_empty() || egress.iter().any(|l| l.port.is_none());
    if catch_all {
        for svc in &scope.services {
            for port in svc.ports.iter().filter(|p| !owned.contains(&p.port.into())) {
                add_service_port(&mut entries, proxy, svc, port, &vss);
            }
        }
    }

    let mut out = vec![ListenerKey::VirtualOutbound(VirtualOutboundKey {
        policy: scope.outbound_policy,
        transparent,
    })];
    out.extend(entries.into_iter().map(|((bind, port), e)| {
        ListenerKey::Outbound(OutboundListenerKey {
            name: listener_name(&bind, port),
            bind,
            port,
            http_route: e.http_route,
            tcp: e.tcp,
            fallthrough: scope.outbound_policy,
            transparent,
            gateway: false,
            authz: Default::default(),
        })
    }));
    out
}

/// The mesh VirtualServices a sidecar in the proxy's namespace applies.
fn mesh_virtual_services<'a>(
    proxy: &Proxy,
    ctx: &'a PushContext,
) -> Vec<&'a Arc<Config<VirtualService>>> {
    ctx.virtual_services
        .iter()
        .filter(|vs| {
            (vs.spec.gateways.is_empty() || vs.spec.gateways.iter().any(|g| g == "mesh"))
                && exported_to(&vs.spec.export_to, &vs.meta.namespace, &proxy.namespace)
                && (!vs.spec.tcp.is_empty() || !vs.spec.tls.is_empty())
        })
        .collect()
}

/// Adds one service port to the listeners, merging by address and port as istiod does:
/// HTTP shares the wildcard listener (services are told apart by the route table), TCP
/// chains of different services on one address merge, and HTTP meeting TCP on one
/// address becomes a sniffed listener.
fn add_service_port(
    entries: &mut BTreeMap<(String, u32), Entry>,
    proxy: &Proxy,
    svc: &ServiceView,
    port: &ServicePort,
    vss: &[&Arc<Config<VirtualService>>],
) {
    let number = u32::from(port.port);
    let class = class_of(port.protocol);
    // The listener address: the VIP for TCP and sniffed ports (a CIDR VIP listens on the
    // wildcard and matches the range), the wildcard for HTTP.
    let vip = svc.vip_for(&proxy.cluster_id).map(str::to_string);
    let (bind, cidrs) = match (&class, &vip) {
        (Class::Http, _) | (_, None) => (WILDCARD.to_string(), Vec::new()),
        (_, Some(v)) if v.contains('/') => (WILDCARD.to_string(), vec![v.clone()]),
        (_, Some(v)) => (v.clone(), Vec::new()),
    };
    let wildcard = bind == WILDCARD;
    let http_route = match class {
        Class::Http => Some(number.to_string()),
        // A sniffed service on its own VIP gets its own route table, as in istiod.
        Class::Sniffed if !wildcard => Some(format!("{}:{number}", svc.hostname)),
        Class::Sniffed => Some(number.to_string()),
        Class::Tcp => None,
    };
    let tcp = match class {
        Class::Http => Vec::new(),
        Class::Tcp | Class::Sniffed => tcp_chains(proxy, svc, port, &cidrs, vss),
    };
    let key = (bind, number);
    let Some(cur) = entries.get_mut(&key) else {
        entries.insert(key, Entry { http_route, tcp });
        return;
    };
    if cur.http_route.is_none() {
        cur.http_route = http_route;
    }
    for chain in tcp {
        // Envoy rejects two chains with the same match: the first service keeps it.
        if cur.tcp.iter().any(|c| {
            c.destination_cidrs == chain.destination_cidrs && c.sni_hosts == chain.sni_hosts
        }) {
            tracing::debug!(
                proxy = %proxy.id,
                service = %svc.hostname,
                port = number,
                "outbound TCP chain conflicts with another service's on the same address; \
                 the first service keeps it"
            );
            continue;
        }
        cur.tcp.push(chain);
    }
}

/// The TCP (and TLS) filter chains of one service port: the first VirtualService `tls` and
/// `tcp` rules whose matches apply to this proxy and port, else a chain to the service's
/// cluster.
fn tcp_chains(
    proxy: &Proxy,
    svc: &ServiceView,
    port: &ServicePort,
    cidrs: &[String],
    vss: &[&Arc<Config<VirtualService>>],
) -> Vec<TcpChain> {
    let number = u32::from(port.port);
    let mut out = Vec::new();
    let for_host = vss.iter().filter(|vs| {
        vs.spec
            .hosts
            .iter()
            .any(|h| wildcard_covers(&resolve_host(h, &vs.meta.namespace), &svc.hostname))
    });
    let tls_port = matches!(port.protocol, Protocol::Tls | Protocol::Https);
    let default_port = |host: &str| match svc.ports.as_slice() {
        [only] if host == svc.hostname => only.port.into(),
        _ => number,
    };
    for vs in for_host {
        let ns = &vs.meta.namespace;
        if tls_port {
            for rule in &vs.spec.tls {
                for m in &rule.matches {
                    if !l4_applies(
                        proxy,
                        number,
                        m.port,
                        &m.source_labels,
                        &m.gateways,
                        m.source_namespace.as_deref(),
                    ) {
                        continue;
                    }
                    let chain = TcpChain {
                        terminate: None,
                        application_protocols: Vec::new(),
                        destination_cidrs: if m.destination_subnets.is_empty() {
                            cidrs.to_vec()
                        } else {
                            m.destination_subnets.clone()
                        },
                        sni_hosts: m.sni_hosts.clone(),
                        clusters: weighted_clusters(&rule.route, ns, default_port),
                    };
                    if !out.iter().any(|c: &TcpChain| {
                        c.destination_cidrs == chain.destination_cidrs
                            && c.sni_hosts == chain.sni_hosts
                    }) {
                        out.push(chain);
                    }
                }
            }
        }
        for rule in &vs.spec.tcp {
            if rule.route.is_empty() {
                continue;
            }
            let clusters = weighted_clusters(&rule.route, ns, default_port);
            if rule.matches.is_empty() {
                out.push(TcpChain {
                    terminate: None,
                    application_protocols: Vec::new(),
                    destination_cidrs: cidrs.to_vec(),
                    sni_hosts: Vec::new(),
                    clusters,
                });
                return out;
            }
            let mut subnets = Vec::new();
            for m in &rule.matches {
                if !l4_applies(
                    proxy,
                    number,
                    m.port,
                    &m.source_labels,
                    &m.gateways,
                    m.source_namespace.as_deref(),
                ) {
                    continue;
                }
                if m.destination_subnets.is_empty() {
                    // A match on any destination ends the chain list: nothing after it
                    // can match.
                    out.push(TcpChain {
                        terminate: None,
                        application_protocols: Vec::new(),
                        destination_cidrs: cidrs.to_vec(),
                        sni_hosts: Vec::new(),
                        clusters,
                    });
                    return out;
                }
                subnets.extend(m.destination_subnets.iter().cloned());
            }
            if !subnets.is_empty() {
                subnets.sort();
                subnets.dedup();
                out.push(TcpChain {
                    terminate: None,
                    application_protocols: Vec::new(),
                    destination_cidrs: subnets,
                    sni_hosts: Vec::new(),
                    clusters,
                });
            }
        }
    }
    // No rule claimed every connection: the service's own cluster takes the rest.
    if !out
        .iter()
        .any(|c| c.destination_cidrs == cidrs && c.sni_hosts.is_empty())
    {
        out.push(TcpChain {
            terminate: None,
            application_protocols: Vec::new(),
            destination_cidrs: cidrs.to_vec(),
            sni_hosts: Vec::new(),
            clusters: vec![(outbound_cluster_name(number, "", &svc.hostname), 1)],
        });
    }
    out
}

/// Whether an L4 match block applies to this proxy on this port (istiod's `matchTCP`).
pub(crate) fn l4_applies(
    proxy: &Proxy,
    port: u32,
    match_port: Option<u32>,
    source_labels: &BTreeMap<String, String>,
    gateways: &[String],
    source_namespace: Option<&str>,
) -> bool {
    match_port.is_none_or(|p| p == port)
        && labels_match(source_labels, &proxy.labels)
        && (gateways.is_empty() || gateways.iter().any(|g| g == "mesh"))
        && source_namespace.is_none_or(|ns| ns == proxy.namespace)
}

/// The clusters of a TCP/TLS rule's destinations. A destination without a port takes
/// `default_port(host)` (the service's only port, else the listener port). Weights: as
/// given (a single destination takes everything); destinations of weight 0 get nothing.
pub(crate) fn weighted_clusters(
    route: &[RouteDestination],
    vs_ns: &str,
    default_port: impl Fn(&str) -> u32,
) -> Vec<(String, u32)> {
    let single = route.len() == 1;
    route
        .iter()
        .filter_map(|d| {
            let host = resolve_host(&d.destination.host, vs_ns);
            let port = d
                .destination
                .port
                .as_ref()
                .map(|p| p.number)
                .unwrap_or_else(|| default_port(&host));
            let weight = if single { 1 } else { d.weight.unwrap_or(0) };
            (weight > 0).then(|| {
                (
                    outbound_cluster_name(
                        port,
                        d.destination.subset.as_deref().unwrap_or_default(),
                        &host,
                    ),
                    weight,
                )
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Building

fn fallthrough_cluster(policy: OutboundTrafficMode) -> &'static str {
    match policy {
        OutboundTrafficMode::AllowAny => PASSTHROUGH_CLUSTER,
        OutboundTrafficMode::RegistryOnly => BLACKHOLE_CLUSTER,
    }
}

/// `virtualOutbound`: 0.0.0.0:15001 with `use_original_dst`; connections sent to 15001
/// itself are dropped (a loop), everything no other listener takes goes to the fallthrough.
pub fn virtual_listener(key: &VirtualOutboundKey) -> Listener {
    let mut l = captured_listener(
        VIRTUAL_OUTBOUND.into(),
        WILDCARD,
        VIRTUAL_OUTBOUND_PORT,
        TrafficDirection::Outbound,
        true,
        key.transparent,
    );
    l.use_original_dst = Some(BoolValue { value: true });
    let cluster = fallthrough_cluster(key.policy);
    l.filter_chains = vec![
        FilterChain {
            name: "virtualOutbound-blackhole".into(),
            filter_chain_match: Some(FilterChainMatch {
                destination_port: Some(UInt32Value {
                    value: VIRTUAL_OUTBOUND_PORT,
                }),
                ..Default::default()
            }),
            filters: vec![tcp_proxy_filter(
                BLACKHOLE_CLUSTER,
                &[(BLACKHOLE_CLUSTER.into(), 1)],
            )],
            ..Default::default()
        },
        FilterChain {
            name: "virtualOutbound-catchall-tcp".into(),
            filters: vec![tcp_proxy_filter(cluster, &[(cluster.into(), 1)])],
            ..Default::default()
        },
    ];
    without_unused_filter_timeout(&mut l);
    l
}

/// A per-destination outbound listener (`bind_to_port: false`: it only receives
/// connections `virtualOutbound` hands over).
pub fn listener(key: &OutboundListenerKey) -> Listener {
    let mut l = captured_listener(
        key.name.clone(),
        &key.bind,
        key.port,
        if key.gateway {
            TrafficDirection::Unspecified
        } else {
            TrafficDirection::Outbound
        },
        key.gateway,
        key.transparent,
    );
    let mut chains = Vec::new();
    let mut default_chain = None;
    if let Some(route) = &key.http_route {
        let hcm = http_connection_manager(&format!("outbound_{}", key.name), HcmRoutes::Rds(route));
        chains.push(FilterChain {
            filter_chain_match: Some(FilterChainMatch {
                application_protocols: PLAINTEXT_HTTP_ALPNS.iter().map(|s| s.to_string()).collect(),
                transport_protocol: "raw_buffer".into(),
                ..Default::default()
            }),
            filters: vec![hcm_filter(&hcm)],
            ..Default::default()
        });
        l.listener_filters.push(http_inspector(None));
    }
    if key
        .tcp
        .iter()
        .any(|c| !c.sni_hosts.is_empty() || c.terminate.is_some())
    {
        l.listener_filters.insert(0, tls_inspector());
    }
    for c in &key.tcp {
        let stat = c
            .clusters
            .first()
            .map(|(n, _)| n.as_str())
            .unwrap_or(BLACKHOLE_CLUSTER);
        // The gateway's RBAC first (sidecar outbound listeners have none).
        let chain = match &c.terminate {
            None => {
                let mut filters = super::authz::network_filters(&key.authz);
                filters.push(tcp_proxy_filter(stat, &c.clusters));
                FilterChain {
                    filters,
                    ..Default::default()
                }
            }
            Some(t) => {
                super::gateway::terminating_chain(&key.name, t, stat, &c.clusters, &key.authz)
            }
        };
        if c.matches_all() {
            default_chain.get_or_insert(chain);
        } else {
            chains.push(FilterChain {
                filter_chain_match: Some(FilterChainMatch {
                    prefix_ranges: c.destination_cidrs.iter().filter_map(|s| cidr(s)).collect(),
                    server_names: c.sni_hosts.clone(),
                    application_protocols: c.application_protocols.clone(),
                    ..Default::default()
                }),
                ..chain
            });
        }
    }
    match (chains.is_empty(), default_chain) {
        // A plain TCP listener: its one chain, as istiod sends it.
        (true, Some(only)) => chains.push(only),
        (_, Some(default)) => l.default_filter_chain = Some(default),
        (_, None) if key.gateway => {}
        (_, None) => {
            let cluster = fallthrough_cluster(key.fallthrough);
            l.default_filter_chain = Some(FilterChain {
                name: "PassthroughFilterChain".into(),
                filter_chain_match: Some(FilterChainMatch::default()),
                filters: vec![tcp_proxy_filter(cluster, &[(cluster.into(), 1)])],
                ..Default::default()
            });
        }
    }
    l.filter_chains = chains;
    without_unused_filter_timeout(&mut l);
    l
}

/// A listener without listener filters has no listener-filter timeout to set: istiod leaves
/// both fields unset there (TCP listeners, `virtualOutbound`).
fn without_unused_filter_timeout(l: &mut Listener) {
    if l.listener_filters.is_empty() {
        l.listener_filters_timeout = None;
        l.continue_on_listener_filters_timeout = false;
    }
}

/// A CIDR range from `a.b.c.d/n` or a bare address (a host route).
pub(crate) fn cidr(s: &str) -> Option<CidrRange> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, l.parse().ok()?),
        None => (s, if s.contains(':') { 128 } else { 32 }),
    };
    addr.parse::<std::net::IpAddr>().ok()?;
    Some(CidrRange {
        address_prefix: addr.to_string(),
        prefix_len: Some(UInt32Value { value: len }),
    })
}
