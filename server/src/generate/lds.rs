//! LDS: gateway listeners (`0.0.0.0_<port>`, one per Gateway server port) and sidecar
//! egress listeners with `captureMode: NONE` (real listeners on `bind:port`). Each carries
//! an HTTP connection manager whose routes come over RDS.

use super::{ads_config_source, socket_address, Resource};
use crate::proxy::{Proxy, ProxyKind};
use crate::push_context::PushContext;
use crate::scope::ProxyScope;
use shoal_common::model::Protocol;
use shoal_proto::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use shoal_proto::pb::envoy::extensions::filters::http::router::v3::Router;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{CodecType, RouteSpecifier},
    http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use shoal_proto::pb::google::protobuf::BoolValue;
use shoal_proto::{gateway_route_name, listener_name, sidecar_route_name, XdsType};
use std::collections::BTreeMap;

/// Default bind address of a gateway server.
const GATEWAY_BIND: &str = "0.0.0.0";
/// Default bind address of a `captureMode: NONE` egress listener, as in Istio.
const SIDECAR_BIND: &str = "127.0.0.1";

/// Everything one listener is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenerKey {
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
}

/// The listeners of a proxy.
pub fn keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<ListenerKey> {
    // (bind, port) → route name; BTreeMap keeps output ordered and merges servers that
    // share a port, as Istio merges them into one listener.
    let mut listeners: BTreeMap<(String, u32), (String, bool)> = BTreeMap::new();
    match proxy.kind {
        ProxyKind::Router => {
            for gw in ctx.gateways_for(&proxy.labels) {
                for server in &gw.spec.servers {
                    if !Protocol::parse(&server.port.protocol).is_http() {
                        tracing::debug!(
                            gateway = %format!("{}/{}", gw.meta.namespace, gw.meta.name),
                            port = server.port.number,
                            protocol = %server.port.protocol,
                            "skipping non-HTTP gateway server (not supported yet)"
                        );
                        continue;
                    }
                    let bind = server.bind.clone().unwrap_or_else(|| GATEWAY_BIND.into());
                    listeners
                        .entry((bind, server.port.number))
                        .or_insert_with(|| (gateway_route_name(server.port.number), true));
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
    }
    listeners
        .into_iter()
        .map(|((bind, port), (route, gateway))| ListenerKey {
            name: listener_name(&bind, port),
            bind,
            port,
            route,
            gateway,
        })
        .collect()
}

/// Builds one listener from its key alone.
pub fn build(key: &ListenerKey) -> Resource {
    let l = http_listener(&key.name, &key.bind, key.port, &key.route, key.gateway);
    Resource::new(XdsType::Listener, key.name.clone(), &l)
}

fn http_listener(name: &str, bind: &str, port: u32, route: &str, gateway: bool) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: name.to_string(),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_config_source()),
            route_config_name: route.to_string(),
        })),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(shoal_proto::pack(
                "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                &Router::default(),
            ))),
            ..Default::default()
        }],
        // Gateways are the edge: trust the peer address, as Istio does.
        use_remote_address: gateway.then_some(BoolValue { value: true }),
        ..Default::default()
    };
    Listener {
        name: name.to_string(),
        address: Some(socket_address(bind, port)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(shoal_proto::pack(
                    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    &hcm,
                ))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}
