//! `virtualInbound`: the listener iptables sends a captured sidecar's inbound connections
//! to (15006), as istiod builds it.
//!
//! One filter chain per workload port (`0.0.0.0_<port>`, matched on the original destination
//! port): HTTP ports get an HTTP connection manager with an inline route table
//! `inbound|<port>||` to the cluster `inbound|<port>||`; TCP ports a `tcp_proxy` to it;
//! ports of unknown protocol both, told apart by the HTTP inspector. Ports no service
//! declares pass through to `InboundPassthroughCluster` (chains `virtualInbound-catchall-http`
//! and `virtualInbound`); connections addressed to 15006 itself are dropped
//! (`virtualInbound-blackhole`). mTLS chains come with PeerAuthentication support.
//!
//! Every chain but the blackhole carries the workload's RBAC filters
//! ([`authz`](super::authz)): before the router on HTTP chains, before `tcp_proxy` on TCP
//! ones.

use super::authz::{self, AuthzKey};
use super::cds::{inbound_cluster_name, BLACKHOLE_CLUSTER, INBOUND_PASSTHROUGH_CLUSTER};
use super::http_route::default_inbound_retry_policy;
use super::lds::{
    captured_listener, hcm_filter, http_connection_manager, http_inspector, listener_filter,
    tcp_proxy_filter, HcmRoutes, PLAINTEXT_HTTP_ALPNS,
};
use super::outbound::cidr;
use super::pb_duration;
use crate::proxy::{Interception, Proxy};
use crate::push_context::PushContext;
use crate::scope::{InboundPort, ProxyScope};
use shoal_common::model::Protocol;
use shoal_proto::pb::envoy::config::core::v3::TrafficDirection;
use shoal_proto::pb::envoy::config::listener::v3::{
    listener_filter_chain_match_predicate::{MatchSet, Rule},
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilterChainMatchPredicate,
};
use shoal_proto::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier, route_match::PathSpecifier, Decorator, Route,
    RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use shoal_proto::pb::envoy::r#type::v3::Int32Range;
use shoal_proto::pb::google::protobuf::{BoolValue, UInt32Value};

/// The port iptables redirects inbound connections to.
pub const VIRTUAL_INBOUND_PORT: u32 = 15006;
/// istiod's name of the inbound capture listener (and of its TCP passthrough chain).
pub const VIRTUAL_INBOUND: &str = "virtualInbound";

/// Everything `virtualInbound` is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InboundListenerKey {
    /// The workload's inbound ports.
    pub ports: Vec<InboundPort>,
    /// TPROXY interception.
    pub transparent: bool,
    /// The AuthorizationPolicies that apply to the workload.
    pub authz: AuthzKey,
}

/// The key of a captured sidecar's `virtualInbound`.
pub fn listener_key(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> InboundListenerKey {
    InboundListenerKey {
        ports: scope.inbound.clone(),
        transparent: proxy.interception == Interception::Tproxy,
        authz: authz::applicable(ctx, proxy),
    }
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
    l.listener_filters = vec![
        listener_filter(
            "envoy.filters.listener.original_dst",
            "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
            Vec::new(),
            None,
        ),
        // Declared HTTP and TCP ports are matched by port alone: detection there would only
        // delay them (and stall server-first protocols), so it is off for them, as in istiod.
        http_inspector(declared_ports_predicate(&key.ports)),
    ];
    let rbac = authz::RbacFilters::new(&key.authz);
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
    for p in &key.ports {
        let name = format!("0.0.0.0_{}", p.port);
        let cluster = inbound_cluster_name(p.port);
        let port_match = FilterChainMatch {
            destination_port: Some(UInt32Value {
                value: p.port.into(),
            }),
            ..Default::default()
        };
        let http = || FilterChain {
            name: name.clone(),
            filters: vec![inbound_hcm(
                &format!("inbound_{name}"),
                &cluster,
                &format!("{}:{}", p.hostname, p.port),
                p.port.into(),
                p.protocol == Protocol::Grpc,
                &rbac.http,
            )],
            ..Default::default()
        };
        let tcp = || FilterChain {
            name: name.clone(),
            filter_chain_match: Some(port_match.clone()),
            filters: tcp_filters(
                &rbac.tcp,
                tcp_proxy_filter(&cluster, &[(cluster.clone(), 1)]),
            ),
            ..Default::default()
        };
        match p.protocol {
            Protocol::Http | Protocol::Http2 | Protocol::Grpc => chains.push(FilterChain {
                filter_chain_match: Some(port_match.clone()),
                ..http()
            }),
            Protocol::Tcp | Protocol::Tls | Protocol::Https => chains.push(tcp()),
            Protocol::Unsupported => {
                chains.push(FilterChain {
                    filter_chain_match: Some(FilterChainMatch {
                        application_protocols: alpns(),
                        ..port_match.clone()
                    }),
                    ..http()
                });
                chains.push(tcp());
            }
        }
    }
    let any = FilterChainMatch {
        prefix_ranges: cidr("0.0.0.0/0").into_iter().collect(),
        ..Default::default()
    };
    chains.push(FilterChain {
        name: "virtualInbound-catchall-http".into(),
        filter_chain_match: Some(FilterChainMatch {
            application_protocols: alpns(),
            ..any.clone()
        }),
        filters: vec![inbound_hcm(
            INBOUND_PASSTHROUGH_CLUSTER,
            INBOUND_PASSTHROUGH_CLUSTER,
            ":0/*",
            0,
            false,
            &rbac.http,
        )],
        ..Default::default()
    });
    chains.push(FilterChain {
        name: VIRTUAL_INBOUND.into(),
        filter_chain_match: Some(any),
        filters: tcp_filters(
            &rbac.tcp,
            tcp_proxy_filter(
                INBOUND_PASSTHROUGH_CLUSTER,
                &[(INBOUND_PASSTHROUGH_CLUSTER.into(), 1)],
            ),
        ),
        ..Default::default()
    });
    l.filter_chains = chains;
    l
}

/// A TCP chain's filters: the RBAC filters, then `tcp_proxy`.
fn tcp_filters(rbac: &[Filter], tcp_proxy: Filter) -> Vec<Filter> {
    let mut filters = rbac.to_vec();
    filters.push(tcp_proxy);
    filters
}

fn alpns() -> Vec<String> {
    PLAINTEXT_HTTP_ALPNS.iter().map(|s| s.to_string()).collect()
}

/// `filter_disabled` for the HTTP inspector: the declared HTTP and TCP ports.
fn declared_ports_predicate(ports: &[InboundPort]) -> Option<ListenerFilterChainMatchPredicate> {
    let rules: Vec<ListenerFilterChainMatchPredicate> = ports
        .iter()
        .filter(|p| p.protocol != Protocol::Unsupported)
        .map(|p| ListenerFilterChainMatchPredicate {
            rule: Some(Rule::DestinationPortRange(Int32Range {
                start: p.port.into(),
                end: i32::from(p.port) + 1,
            })),
        })
        .collect();
    match rules.len() {
        0 => None,
        1 => rules.into_iter().next(),
        _ => Some(ListenerFilterChainMatchPredicate {
            rule: Some(Rule::OrMatch(MatchSet { rules })),
        }),
    }
}

/// The HTTP connection manager of an inbound chain: an inline route table that sends
/// everything to the inbound cluster, as istiod's `inbound|<port>||` table.
fn inbound_hcm(
    stat_prefix: &str,
    cluster: &str,
    operation: &str,
    port: u32,
    grpc: bool,
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
            retry_policy: (!grpc).then(default_inbound_retry_policy),
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
            ..Default::default()
        }],
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    };
    let mut hcm = http_connection_manager(stat_prefix, HcmRoutes::Inline(Box::new(rc)));
    // istiod puts the RBAC filters first, before fault injection, CORS and the router.
    hcm.http_filters.splice(0..0, rbac.iter().cloned());
    hcm_filter(&hcm)
}
