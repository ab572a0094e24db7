//! `virtualInbound`: the listener iptables sends a captured sidecar's inbound connections
//! to (15006), as istiod builds it (`listener_inbound.go`, `filterchain_options.go`).
//!
//! Filter chains per workload port (`0.0.0.0_<port>`, matched on the original destination
//! port): HTTP ports get an HTTP connection manager with an inline route table
//! `inbound|<port>||` to the cluster `inbound|<port>||`; TCP ports a `tcp_proxy` to it;
//! ports of unknown protocol both, told apart by ALPN (the HTTP inspector's, or the client's
//! over mTLS). Which chains a port gets depends on its PeerAuthentication mode
//! ([`crate::index::peer_authentication`]):
//!
//! - PERMISSIVE: Istio mTLS chains (`transport_protocol: tls`, Istio's ALPN values, the
//!   workload certificate, a client certificate required) and plaintext chains; TCP ports
//!   also pass other TLS through untouched;
//! - STRICT: the mTLS chains only — a plaintext connection matches no chain and is closed;
//! - DISABLE: the plaintext chains only.
//!
//! Ports no service declares pass through to `InboundPassthroughCluster` (chains
//! `virtualInbound-catchall-http` and `virtualInbound`) with the workload's mode, plus one
//! set of such chains per `portLevelMtls` port no service declares; connections addressed to
//! 15006 itself are dropped (`virtualInbound-blackhole`). The TLS and HTTP inspectors run
//! only on the ports whose chains need them, as istiod enables them.
//!
//! Every chain but the blackhole carries the workload's RBAC filters
//! ([`authz`](super::authz)): before the router on HTTP chains, before `tcp_proxy` on TCP
//! ones.

use super::authz::{self, AuthzKey, RbacFilters};
use super::cds::{inbound_cluster_name, BLACKHOLE_CLUSTER, INBOUND_PASSTHROUGH_CLUSTER};
use super::http_route::default_inbound_retry_policy;
use super::lds::{
    captured_listener, hcm_filter, http_connection_manager, listener_filter, tcp_proxy_filter,
    HcmRoutes, PLAINTEXT_HTTP_ALPNS,
};
use super::mtls::{self, InboundProtocol, ALL_ISTIO_MTLS_ALPNS, MTLS_HTTP_ALPNS, MTLS_TCP_ALPNS};
use super::outbound::cidr;
use super::pb_duration;
use crate::index::peer_authentication::{self, MtlsMode, WorkloadMtls};
use crate::index::proxy::{Interception, Proxy};
use crate::index::push_context::PushContext;
use crate::index::scope::{InboundPort, ProxyScope};
use shoal_common::model::Protocol;
use shoal_proto::pb::envoy::config::core::v3::TrafficDirection;
use shoal_proto::pb::envoy::config::listener::v3::Filter;
use shoal_proto::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::{
    ForwardClientCertDetails, SetCurrentClientCertDetails,
};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use std::collections::BTreeMap;
use shoal_proto::pb::envoy::config::listener::v3::{
    listener_filter_chain_match_predicate::{MatchSet, Rule},
    FilterChain, FilterChainMatch, Listener, ListenerFilter, ListenerFilterChainMatchPredicate,
};
use shoal_proto::pb::envoy::config::route::v3::{
    route::Action, route_action::{ClusterSpecifier, MaxStreamDuration}, route_match::PathSpecifier, Decorator, Route,
    RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use shoal_proto::pb::envoy::r#type::v3::Int32Range;
use shoal_proto::pb::google::protobuf::{BoolValue, UInt32Value};

/// The port iptables redirects inbound connections to.
pub const VIRTUAL_INBOUND_PORT: u32 = 15006;
/// istiod's name of the inbound capture listener (and of its TCP passthrough chain).
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
/// istiod's name of the HTTP passthrough chain.
const CATCHALL_HTTP: &str = "virtualInbound-catchall-http";
/// `transport_protocol` of a connection the TLS inspector found to be TLS.
const TLS: &str = "tls";
/// `transport_protocol` of any other connection.
const RAW_BUFFER: &str = "raw_buffer";

/// Everything `virtualInbound` is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InboundListenerKey {
    /// The workload's inbound ports.
    pub ports: Vec<InboundPort>,
    /// TPROXY interception.
    pub transparent: bool,
    /// The workload's PeerAuthentication.
    pub mtls: WorkloadMtls,
    /// The mesh's trust domain: mTLS chains accept client identities of it.
    pub trust_domain: String,
    /// The AuthorizationPolicies that apply to the workload.
    pub authz: AuthzKey,
    /// Whether inbound HTTP routes retry `reset-before-request` (see [`inbound_retry`]).
    pub inbound_retry: bool,
}

/// Whether a proxy gets istiod's default inbound retry (`reset-before-request`): istiod
/// 1.24 to 1.26 sent it to proxies of 1.24 or newer (and to those naming no version, which
/// it counts as newest), since older istio-proxy builds predate it; later istiod sends it
/// to every proxy, which the same rule gives for every supported istio-proxy.
pub fn inbound_retry(proxy: &Proxy) -> bool {
    proxy.istio_version.is_none_or(|v| v.at_least(1, 24))
}

/// The key of a captured sidecar's `virtualInbound`.
pub fn listener_key(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> InboundListenerKey {
    InboundListenerKey {
        ports: scope.inbound.clone(),
        transparent: proxy.interception == Interception::Tproxy,
        mtls: peer_authentication::for_workload(ctx, &proxy.namespace, &proxy.labels),
        trust_domain: ctx.mesh.trust_domain.clone(),
        authz: authz::applicable(ctx, proxy),
        inbound_retry: inbound_retry(proxy),
    }
}

/// What a chain (or a port's chains) serves: istiod's listener protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListenerProtocol {
    Http,
    Tcp,
    /// Unknown: HTTP and TCP chains, told apart by ALPN.
    Auto,
}

impl ListenerProtocol {
    fn of(p: Protocol) -> ListenerProtocol {
        match p {
            Protocol::Http | Protocol::Http2 | Protocol::Grpc => ListenerProtocol::Http,
            Protocol::Tcp | Protocol::Tls | Protocol::Https => ListenerProtocol::Tcp,
            Protocol::Unsupported => ListenerProtocol::Auto,
        }
    }
}

/// One filter chain of a port: how it matches, what it serves, whether it terminates mTLS
/// (istiod's `FilterChainMatchOptions`).
struct ChainOption {
    alpn: Vec<String>,
    transport: &'static str,
    http: bool,
    mtls: bool,
}

fn option(alpn: &[&str], transport: &'static str, http: bool, mtls: bool) -> ChainOption {
    ChainOption {
        alpn: alpn.iter().map(|s| s.to_string()).collect(),
        transport,
        http,
        mtls,
    }
}

/// istiod's `getFilterChainMatchOptions`: the chains of a port in a mode.
fn chain_options(mode: MtlsMode, protocol: ListenerProtocol) -> Vec<ChainOption> {
    use ListenerProtocol::{Auto, Http, Tcp};
    let plaintext_http: &[&str] = &PLAINTEXT_HTTP_ALPNS;
    match (mode, protocol) {
        (MtlsMode::Strict, Http) => vec![option(&[], TLS, true, true)],
        (MtlsMode::Strict, Tcp) => vec![option(&[], TLS, false, true)],
        (MtlsMode::Strict, Auto) => vec![
            option(&MTLS_HTTP_ALPNS, TLS, true, true),
            option(&[], TLS, false, true),
        ],
        (MtlsMode::Permissive, Http) => vec![
            option(&ALL_ISTIO_MTLS_ALPNS, TLS, true, true),
            option(&[], RAW_BUFFER, true, false),
        ],
        (MtlsMode::Permissive, Tcp) => vec![
            option(&ALL_ISTIO_MTLS_ALPNS, TLS, false, true),
            // Other TLS (the app's own) passes through untouched.
            option(&[], TLS, false, false),
            option(&[], RAW_BUFFER, false, false),
        ],
        (MtlsMode::Permissive, Auto) => vec![
            option(&MTLS_HTTP_ALPNS, TLS, true, true),
            option(plaintext_http, RAW_BUFFER, true, false),
            option(&MTLS_TCP_ALPNS, TLS, false, true),
            option(&[], RAW_BUFFER, false, false),
            option(&[], TLS, false, false),
        ],
        (MtlsMode::Disable, Http) => vec![option(&[], RAW_BUFFER, true, false)],
        (MtlsMode::Disable, Tcp) => vec![option(&[], RAW_BUFFER, false, false)],
        (MtlsMode::Disable, Auto) => vec![
            option(plaintext_http, RAW_BUFFER, true, false),
            option(&[], RAW_BUFFER, false, false),
        ],
    }
}

/// The server TLS of a chain that terminates Istio mTLS.
fn mtls_socket(
    opt: &ChainOption,
    trust_domain: &str,
) -> Option<shoal_proto::pb::envoy::config::core::v3::TransportSocket> {
    opt.mtls.then(|| {
        mtls::downstream_socket(&mtls::inbound_mtls(
            trust_domain,
            if opt.http {
                InboundProtocol::Http
            } else {
                InboundProtocol::Tcp
            },
        ))
    })
}

/// Builds `virtualInbound`.
pub fn listener(key: &InboundListenerKey) -> Listener {
    let mut l = captured_listener(
        VIRTUAL_INBOUND.into(),
        "0.0.0.0",
        VIRTUAL_INBOUND_PORT,
        TrafficDirection::Inbound,
        true,
        key.transparent,
    );
    let mut chains = vec![FilterChain {
        name: "virtualInbound-blackhole".into(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value {
                value: VIRTUAL_INBOUND_PORT,
            }),
            ..Default::default()
        }),
        filters: vec![tcp_proxy_filter(
            BLACKHOLE_CLUSTER,
            &[(BLACKHOLE_CLUSTER.into(), 1)],
        )],
        ..Default::default()
    }];
    let rbac = RbacFilters::new(&key.authz);
    for p in &key.ports {
        chains.extend(port_chains(
            p,
            key.mtls.for_port(p.port.into()),
            &key.trust_domain,
            &rbac,
            key.inbound_retry,
        ));
    }
    chains.extend(passthrough_chains(
        0,
        key.mtls.mode,
        &key.trust_domain,
        &rbac,
        key.inbound_retry,
    ));
    // `portLevelMtls` on ports no service declares: passthrough chains of their own.
    for (port, mode) in &key.mtls.ports {
        if !key.ports.iter().any(|p| u32::from(p.port) == *port) {
            chains.extend(passthrough_chains(
                *port,
                *mode,
                &key.trust_domain,
                &rbac,
                key.inbound_retry,
            ));
        }
    }
    l.listener_filters = vec![listener_filter(
        "envoy.filters.listener.original_dst",
        "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
        Vec::new(),
        None,
    )];
    l.listener_filters.extend(inspectors(&chains));
    l.filter_chains = chains;
    l
}

/// The chains of one workload port in its mode.
fn port_chains(
    p: &InboundPort,
    mode: MtlsMode,
    trust_domain: &str,
    rbac: &RbacFilters,
    retry: bool,
) -> Vec<FilterChain> {
    let name = format!("0.0.0.0_{}", p.port);
    let cluster = inbound_cluster_name(p.port);
    chain_options(mode, ListenerProtocol::of(p.protocol))
        .into_iter()
        .map(|opt| FilterChain {
            name: name.clone(),
            filter_chain_match: Some(FilterChainMatch {
                destination_port: Some(UInt32Value {
                    value: p.port.into(),
                }),
                transport_protocol: opt.transport.into(),
                application_protocols: opt.alpn.clone(),
                ..Default::default()
            }),
            filters: if opt.http {
                http_chain_filters(
                    &format!("inbound_{name}"),
                    &cluster,
                    &format!("{}:{}", p.hostname, p.port),
                    p.port.into(),
                    // Never on gRPC ports: `reset-before-request` breaks streaming.
                    retry && p.protocol != Protocol::Grpc,
                    &rbac.http,
                )
            } else {
                tcp_chain_filters(&cluster, &rbac.tcp)
            },
            transport_socket: mtls_socket(&opt, trust_domain),
            ..Default::default()
        })
        .collect()
}

/// The passthrough chains (ports no service declares) for one mode: every such port
/// (`port` 0), or one `portLevelMtls` port.
fn passthrough_chains(
    port: u32,
    mode: MtlsMode,
    trust_domain: &str,
    rbac: &RbacFilters,
    retry: bool,
) -> Vec<FilterChain> {
    chain_options(mode, ListenerProtocol::Auto)
        .into_iter()
        .map(|opt| FilterChain {
            name: if opt.http {
                CATCHALL_HTTP
            } else {
                VIRTUAL_INBOUND
            }
            .into(),
            filter_chain_match: Some(FilterChainMatch {
                destination_port: (port != 0).then_some(UInt32Value { value: port }),
                prefix_ranges: cidr("0.0.0.0/0").into_iter().collect(),
                transport_protocol: opt.transport.into(),
                application_protocols: opt.alpn.clone(),
                ..Default::default()
            }),
            filters: if opt.http {
                http_chain_filters(
                    INBOUND_PASSTHROUGH_CLUSTER,
                    INBOUND_PASSTHROUGH_CLUSTER,
                    ":0/*",
                    0,
                    retry,
                    &rbac.http,
                )
            } else {
                tcp_chain_filters(INBOUND_PASSTHROUGH_CLUSTER, &rbac.tcp)
            },
            transport_socket: mtls_socket(&opt, trust_domain),
            ..Default::default()
        })
        .collect()
}

/// The network filters of an inbound HTTP chain (every port and mode; the passthrough
/// chains too): where per-chain filters such as RBAC join the connection manager.
fn http_chain_filters(
    stat_prefix: &str,
    cluster: &str,
    operation: &str,
    port: u32,
    retry: bool,
    rbac: &[HttpFilter],
) -> Vec<Filter> {
    vec![inbound_hcm(
        stat_prefix,
        cluster,
        operation,
        port,
        retry,
        rbac,
    )]
}

/// The network filters of an inbound TCP chain (every port and mode; the passthrough
/// chain too): where per-chain network filters such as RBAC go, before the `tcp_proxy`.
fn tcp_chain_filters(cluster: &str, rbac: &[Filter]) -> Vec<Filter> {
    let mut filters = rbac.to_vec();
    filters.push(tcp_proxy_filter(cluster, &[(cluster.to_string(), 1)]));
    filters
}

/// The TLS and HTTP inspectors, enabled on the ports whose chains need them (istiod's
/// `populateListenerFilters`): TLS where a chain matches `transport_protocol: tls`, HTTP
/// where one matches a plaintext HTTP ALPN. Port 0 stands for the chains without a port
/// (the passthrough ones), which decide the default.
fn inspectors(chains: &[FilterChain]) -> Vec<ListenerFilter> {
    let mut ports: BTreeMap<u32, (bool, bool)> = BTreeMap::new();
    for c in chains {
        let m = c.filter_chain_match.clone().unwrap_or_default();
        let port = m.destination_port.map(|p| p.value).unwrap_or(0);
        let e = ports.entry(port).or_default();
        e.0 |= m.transport_protocol == TLS;
        e.1 |= m
            .application_protocols
            .iter()
            .any(|a| a == "http/1.1" || a == "h2c");
    }
    let mut out = Vec::new();
    if ports.values().any(|(tls, _)| *tls) {
        let default = ports.get(&0).is_some_and(|(tls, _)| *tls);
        // Enabled by default: disabled on the ports that need no TLS; else enabled only on
        // the ports that need it.
        let listed: Vec<u32> = ports
            .iter()
            .filter(|(p, (tls, _))| **p != 0 && *tls != default)
            .map(|(p, _)| *p)
            .collect();
        let disabled = match (default, listed.is_empty()) {
            (_, true) => None,
            (true, false) => Some(port_predicate(&listed)),
            (false, false) => Some(ListenerFilterChainMatchPredicate {
                rule: Some(Rule::NotMatch(Box::new(port_predicate(&listed)))),
            }),
        };
        out.push(tls_inspector(disabled));
    }
    if ports.values().any(|(_, http)| *http) {
        let listed: Vec<u32> = ports
            .iter()
            .filter(|(_, (_, http))| !*http)
            .map(|(p, _)| *p)
            .collect();
        out.push(super::lds::http_inspector(
            (!listed.is_empty()).then(|| port_predicate(&listed)),
        ));
    }
    out
}

/// The TLS inspector as istiod configures it (a 512-byte initial read buffer).
fn tls_inspector(disabled: Option<ListenerFilterChainMatchPredicate>) -> ListenerFilter {
    let config = TlsInspector {
        initial_read_buffer_size: Some(UInt32Value { value: 512 }),
        ..Default::default()
    };
    listener_filter(
        "envoy.filters.listener.tls_inspector",
        "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
        prost::Message::encode_to_vec(&config),
        disabled,
    )
}

/// A predicate matching connections to any of `ports` (sorted).
fn port_predicate(ports: &[u32]) -> ListenerFilterChainMatchPredicate {
    let mut rules: Vec<ListenerFilterChainMatchPredicate> = ports
        .iter()
        .map(|p| ListenerFilterChainMatchPredicate {
            rule: Some(Rule::DestinationPortRange(Int32Range {
                start: *p as i32,
                end: *p as i32 + 1,
            })),
        })
        .collect();
    if rules.len() == 1 {
        return rules.remove(0);
    }
    ListenerFilterChainMatchPredicate {
        rule: Some(Rule::OrMatch(MatchSet { rules })),
    }
}

/// The HTTP connection manager of an inbound chain: an inline route table that sends
/// everything to the inbound cluster, as istiod's `inbound|<port>||` table.
fn inbound_hcm(
    stat_prefix: &str,
    cluster: &str,
    operation: &str,
    port: u32,
    retry: bool,
    rbac: &[HttpFilter],
) -> Filter {
    let route = Route {
        name: "default".into(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
            timeout: Some(pb_duration(std::time::Duration::ZERO)),
            // istiod's `BuildDefaultHTTPInboundRoute`: no stream limit, and a gRPC client's
            // `grpc-timeout` honoured without a cap.
            max_stream_duration: Some(MaxStreamDuration {
                max_stream_duration: Some(pb_duration(std::time::Duration::ZERO)),
                grpc_timeout_header_max: Some(pb_duration(std::time::Duration::ZERO)),
                ..Default::default()
            }),
            retry_policy: retry.then(default_inbound_retry_policy),
            ..Default::default()
        })),
        decorator: Some(Decorator {
            operation: operation.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let rc = RouteConfiguration {
        name: cluster.to_string(),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{port}"),
            domains: vec!["*".into()],
            routes: vec![route],
            include_request_attempt_count: true,
            ..Default::default()
        }],
        validate_clusters: Some(BoolValue { value: false }),
        max_direct_response_body_size_bytes: Some(UInt32Value {
            value: super::lds::MAX_DIRECT_RESPONSE_BODY_BYTES,
        }),
        ..Default::default()
    };
    let mut hcm = http_connection_manager(stat_prefix, HcmRoutes::Inline(Box::new(rc)));
    // The app sees the caller's identity (its SPIFFE URI) in `x-forwarded-client-cert` when
    // the connection is mTLS (istiod's default proxy headers).
    hcm.forward_client_cert_details = ForwardClientCertDetails::AppendForward as i32;
    hcm.server_name = super::lds::INBOUND_SERVER_NAME.into();
    hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
        subject: Some(BoolValue { value: true }),
        uri: true,
        dns: true,
        ..Default::default()
    });
    // istiod puts the RBAC filters first, before fault injection, CORS and the router.
    hcm.http_filters.splice(0..0, rbac.iter().cloned());
    hcm_filter(&hcm)
}
