//! LDS. What a proxy gets depends on what it is:
//!
//! - a gateway: one `0.0.0.0_<port>` listener per Gateway server port;
//! - a sidecar whose traffic iptables captures (`INTERCEPTION_MODE` absent, `REDIRECT` or
//!   `TPROXY`, Istio's default): `virtualOutbound` (15001), the per-destination outbound
//!   listeners it hands connections to ([`outbound`](super::outbound)), and
//!   `virtualInbound` (15006, [`inbound`](super::inbound)) — istiod's names and layout;
//! - any sidecar: the Sidecar's egress listeners with `captureMode: NONE`, as real
//!   listeners on `bind:port` (the only listeners of an `INTERCEPTION_MODE: NONE` sidecar).
//!
//! This module holds the dispatch and the filter builders the listener kinds share.

use super::authz::{self, AuthzKey};
use super::http_route::{CORS_FILTER, FAULT_FILTER};
use super::inbound::{self, InboundListenerKey};
use super::outbound::{self, OutboundListenerKey, VirtualOutboundKey};
use super::{ads_config_source_waiting, pb_duration, socket_address, Resource};
use crate::index::proxy::{Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use shoal_common::model::Protocol;
use shoal_proto::pb::envoy::config::core::v3::TrafficDirection;
use shoal_proto::pb::envoy::config::listener::v3::{
    filter, listener_filter, Filter, FilterChain, Listener, ListenerFilter,
    ListenerFilterChainMatchPredicate,
};
use shoal_proto::pb::envoy::config::route::v3::RouteConfiguration;
use shoal_proto::pb::envoy::extensions::filters::http::cors::v3::Cors;
use shoal_proto::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use shoal_proto::pb::envoy::extensions::filters::http::router::v3::Router;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{CodecType, PathWithEscapedSlashesAction, RouteSpecifier},
    http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use shoal_proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::{weighted_cluster::ClusterWeight, ClusterSpecifier, WeightedCluster},
    TcpProxy,
};
use shoal_proto::pb::google::protobuf::BoolValue;
use shoal_proto::{gateway_route_name, listener_name, sidecar_route_name, Any, XdsType};
use std::collections::BTreeMap;

/// Default bind address of a gateway server.
const GATEWAY_BIND: &str = "0.0.0.0";
/// Default bind address of a `captureMode: NONE` egress listener, as in Istio.
const SIDECAR_BIND: &str = "127.0.0.1";
/// The ALPN values of Envoy's HTTP inspector that select an HTTP chain (istiod's
/// `plaintextHTTPALPNs` with `PILOT_HTTP10` unset): HTTP/1.0 is left out, as istiod leaves
/// it out, because the connection manager would answer it 426; unmatched, it falls to the
/// listener's TCP chain and reaches the destination as bytes.
pub(crate) const PLAINTEXT_HTTP_ALPNS: [&str; 2] = ["http/1.1", "h2c"];

/// istiod's `max_direct_response_body_size_bytes` on every route table: 1 MiB, the size its
/// webhook admits for a VirtualService's `directResponse` body (Envoy's default is 4 KiB).
pub(crate) const MAX_DIRECT_RESPONSE_BODY_BYTES: u32 = 1024 * 1024;

/// The `server` header inbound connection managers write (istiod's `EnvoyServerName`;
/// istiod leaves outbound and gateway ones at Envoy's default, `envoy`).
pub(crate) const INBOUND_SERVER_NAME: &str = "istio-envoy";

/// Everything one listener is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ListenerKey {
    /// A listener Envoy binds: a gateway server port or a `captureMode: NONE` egress port.
    Bound(BoundListenerKey),
    /// `virtualOutbound` on 15001.
    VirtualOutbound(VirtualOutboundKey),
    /// `virtualInbound` on 15006.
    VirtualInbound(InboundListenerKey),
    /// A per-destination outbound listener (`0.0.0.0_<port>`, `<vip>_<port>`).
    Outbound(OutboundListenerKey),
    /// istiod's `connect_originate` internal listener (see [`super::hbone`]).
    ConnectOriginate,
}

/// Everything a bound HTTP listener is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BoundListenerKey {
    /// Listener name (`<bind>_<port>`).
    pub name: String,
    /// Bind address.
    pub bind: String,
    /// Port.
    pub port: u32,
    /// RDS route name.
    pub route: String,
    /// Gateway (edge) listener.
    pub gateway: bool,
    /// The AuthorizationPolicies that apply to the gateway (none for sidecar egress
    /// listeners: authorization is enforced where traffic arrives, as in istiod).
    pub authz: AuthzKey,
}

/// The listeners of a proxy.
pub fn keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<ListenerKey> {
    let mut out = inbound_keys(proxy, scope, ctx);
    out.extend(outbound_keys(proxy, scope, ctx));
    out
}

/// The key of a captured sidecar's `virtualInbound` listener (its own side: none for
/// others).
pub fn inbound_keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<ListenerKey> {
    if proxy.kind == ProxyKind::Sidecar && proxy.interception.captured() {
        vec![ListenerKey::VirtualInbound(inbound::listener_key(
            proxy, scope, ctx,
        ))]
    } else {
        Vec::new()
    }
}

/// The keys of every listener but `virtualInbound`: a sidecar's outbound side.
pub fn outbound_keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<ListenerKey> {
    let mut out: Vec<ListenerKey> = bound_keys(proxy, scope, ctx)
        .into_iter()
        .map(ListenerKey::Bound)
        .collect();
    if proxy.kind == ProxyKind::Router {
        out.extend(super::gateway::keys(proxy, scope, ctx));
    }
    if proxy.kind == ProxyKind::Sidecar && proxy.interception.captured() {
        out.extend(outbound::keys(proxy, scope, ctx));
    }
    if super::hbone::sends_hbone(proxy) {
        out.push(ListenerKey::ConnectOriginate);
    }
    out
}

/// The port a gateway listens on for a Gateway server port: its Service's `targetPort`.
pub(crate) fn gateway_listener_port(scope: &ProxyScope, server_port: u32) -> u32 {
    scope
        .gateway_ports
        .get(&server_port)
        .copied()
        .unwrap_or(server_port)
}

fn bound_keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<BoundListenerKey> {
    // (bind, port) → route name; BTreeMap keeps output ordered and merges servers that
    // share a port, as Istio merges them into one listener.
    let mut listeners: BTreeMap<(String, u32), (String, bool)> = BTreeMap::new();
    match proxy.kind {
        ProxyKind::Router => {
            for gw in ctx.gateways_for(&proxy.namespace, &proxy.labels) {
                for server in &gw.spec.servers {
                    // TCP and TLS passthrough servers: `gateway::keys`; others are refused
                    // at ingest.
                    if super::gateway::server_kind(server) != Some(super::gateway::ServerKind::Http)
                    {
                        continue;
                    }
                    let bind = server.bind.clone().unwrap_or_else(|| GATEWAY_BIND.into());
                    let port = gateway_listener_port(scope, server.port.number);
                    listeners
                        .entry((bind, port))
                        .or_insert_with(|| (gateway_route_name(port), true));
                }
            }
        }
        ProxyKind::Sidecar => {
            let egress = scope
                .sidecar
                .as_ref()
                .map(|s| s.spec.egress.as_slice())
                .unwrap_or_default();
            for l in egress {
                let Some(port) = &l.port else { continue };
                if l.capture_mode.as_deref() != Some("NONE")
                    || !Protocol::parse(&port.protocol).is_http()
                {
                    continue;
                }
                let bind = l.bind.clone().unwrap_or_else(|| SIDECAR_BIND.into());
                listeners
                    .entry((bind, port.number))
                    .or_insert_with(|| (sidecar_route_name(port.number), false));
            }
        }
        // Served by `generate::grpc`; ztunnel has no listeners.
        ProxyKind::Proxyless | ProxyKind::Ztunnel => {}
    }
    let gateway_authz = match proxy.kind {
        ProxyKind::Router => authz::applicable(ctx, proxy),
        ProxyKind::Sidecar | ProxyKind::Proxyless | ProxyKind::Ztunnel => AuthzKey::default(),
    };
    listeners
        .into_iter()
        .map(|((bind, port), (route, gateway))| BoundListenerKey {
            name: listener_name(&bind, port),
            bind,
            port,
            route,
            gateway,
            authz: if gateway {
                gateway_authz.clone()
            } else {
                AuthzKey::default()
            },
        })
        .collect()
}

/// Builds one listener from its key alone.
pub fn build(key: &ListenerKey) -> Resource {
    let l = match key {
        ListenerKey::Bound(k) => bound_listener(k),
        ListenerKey::VirtualOutbound(k) => outbound::virtual_listener(k),
        ListenerKey::VirtualInbound(k) => inbound::listener(k),
        ListenerKey::Outbound(k) => outbound::listener(k),
        ListenerKey::ConnectOriginate => return super::hbone::listener(),
    };
    Resource::new(XdsType::Listener, l.name.clone(), &l)
}

fn bound_listener(key: &BoundListenerKey) -> Listener {
    let mut hcm = HttpConnectionManager {
        // Gateways are the edge: trust the peer address, as Istio does.
        use_remote_address: Some(BoolValue { value: key.gateway }),
        ..http_connection_manager(&key.name, HcmRoutes::Rds(&key.route))
    };
    // RBAC first, as istiod orders a gateway's HTTP filters.
    hcm.http_filters
        .splice(0..0, authz::http_filters(&key.authz));
    Listener {
        name: key.name.clone(),
        address: Some(socket_address(&key.bind, key.port)),
        filter_chains: vec![FilterChain {
            filters: vec![hcm_filter(&hcm)],
            ..Default::default()
        }],
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// Shared builders

/// Where an HTTP connection manager gets its routes.
pub(crate) enum HcmRoutes<'a> {
    /// Over RDS, by name.
    Rds(&'a str),
    /// Inline (inbound chains).
    Inline(Box<RouteConfiguration>),
}

/// An HTTP connection manager with Istio's defaults: the router filter, automatic codec,
/// normalized paths with escaped slashes kept, and WebSocket upgrades allowed.
pub(crate) fn http_connection_manager(
    stat_prefix: &str,
    routes: HcmRoutes<'_>,
) -> HttpConnectionManager {
    use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::UpgradeConfig;
    HttpConnectionManager {
        stat_prefix: stat_prefix.to_string(),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(match routes {
            HcmRoutes::Rds(name) => RouteSpecifier::Rds(Rds {
                config_source: Some(ads_config_source_waiting()),
                route_config_name: name.to_string(),
            }),
            HcmRoutes::Inline(rc) => RouteSpecifier::RouteConfig(*rc),
        }),
        // Istio's order: fault injection, CORS, then the router. Fault and CORS act only
        // where a route carries their per-route config.
        http_filters: vec![
            http_filter(
                FAULT_FILTER,
                "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
                &HttpFault::default(),
            ),
            http_filter(
                CORS_FILTER,
                "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors",
                &Cors::default(),
            ),
            http_filter(
                "envoy.filters.http.router",
                "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                &Router::default(),
            ),
        ],
        use_remote_address: Some(BoolValue { value: false }),
        // Istio turns Envoy's 5 minute stream idle timeout off (long polls, streams).
        stream_idle_timeout: Some(pb_duration(std::time::Duration::ZERO)),
        normalize_path: Some(BoolValue { value: true }),
        path_with_escaped_slashes_action: PathWithEscapedSlashesAction::KeepUnchanged as i32,
        upgrade_configs: vec![UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub(crate) fn http_filter<M: prost::Message>(name: &str, type_url: &str, config: &M) -> HttpFilter {
    HttpFilter {
        name: name.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(shoal_proto::pack(
            type_url, config,
        ))),
        ..Default::default()
    }
}

/// The network filter holding an HTTP connection manager.
pub(crate) fn hcm_filter(hcm: &HttpConnectionManager) -> Filter {
    typed_filter(
        "envoy.filters.network.http_connection_manager",
        shoal_proto::pack(
            "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            hcm,
        ),
    )
}

/// A `tcp_proxy` network filter to one cluster, or split by weight across several.
pub(crate) fn tcp_proxy_filter(stat_prefix: &str, clusters: &[(String, u32)]) -> Filter {
    let cluster_specifier = match clusters {
        [] => ClusterSpecifier::Cluster(super::cds::BLACKHOLE_CLUSTER.into()),
        [(single, _)] => ClusterSpecifier::Cluster(single.clone()),
        many => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: many
                .iter()
                .map(|(name, weight)| ClusterWeight {
                    name: name.clone(),
                    weight: *weight,
                    ..Default::default()
                })
                .collect(),
        }),
    };
    let proxy = TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(cluster_specifier),
        ..Default::default()
    };
    typed_filter(
        "envoy.filters.network.tcp_proxy",
        shoal_proto::pack(
            "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            &proxy,
        ),
    )
}

fn typed_filter(name: &str, any: Any) -> Filter {
    Filter {
        name: name.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(any)),
    }
}

/// A listener filter by name and typed config, optionally disabled for some connections.
pub(crate) fn listener_filter(
    name: &str,
    type_url: &str,
    config: Vec<u8>,
    disabled: Option<ListenerFilterChainMatchPredicate>,
) -> ListenerFilter {
    ListenerFilter {
        name: name.to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(Any {
            type_url: type_url.to_string(),
            value: config,
        })),
        filter_disabled: disabled,
    }
}

/// Envoy's HTTP inspector (sets the ALPN of plaintext HTTP connections), optionally
/// disabled for some connections.
pub(crate) fn http_inspector(
    disabled: Option<ListenerFilterChainMatchPredicate>,
) -> ListenerFilter {
    listener_filter(
        "envoy.filters.listener.http_inspector",
        "type.googleapis.com/envoy.extensions.filters.listener.http_inspector.v3.HttpInspector",
        Vec::new(),
        disabled,
    )
}

/// Envoy's TLS inspector (reads SNI and ALPN from a ClientHello).
pub(crate) fn tls_inspector() -> ListenerFilter {
    listener_filter(
        "envoy.filters.listener.tls_inspector",
        "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
        Vec::new(),
        None,
    )
}

/// The fields every listener of a captured sidecar shares: traffic direction, no bind for
/// the per-destination ones, no listener-filter timeout (Istio's default
/// `protocolDetectionTimeout: 0s`: protocol detection waits for the client's first bytes,
/// so server-first protocols must be declared), `transparent` under TPROXY.
pub(crate) fn captured_listener(
    name: String,
    bind: &str,
    port: u32,
    direction: TrafficDirection,
    bind_to_port: bool,
    transparent: bool,
) -> Listener {
    Listener {
        name,
        address: Some(socket_address(bind, port)),
        traffic_direction: direction as i32,
        bind_to_port: (!bind_to_port).then_some(BoolValue { value: false }),
        continue_on_listener_filters_timeout: true,
        listener_filters_timeout: Some(pb_duration(std::time::Duration::ZERO)),
        transparent: transparent.then_some(BoolValue { value: true }),
        ..Default::default()
    }
}
