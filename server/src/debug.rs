//! Debug views for the admin server: `/debug/push_status` and `/debug/config_dump`.

use crate::generate::{generate, Resource, Snapshot};
use crate::index::scope::ProxyScope;
use crate::push::pipeline::Published;
use crate::xds::Registry;
use prost::Message;
use serde_json::{json, Value};
use shoal_proto::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, Cluster};
use shoal_proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use shoal_proto::pb::envoy::config::listener::v3::{filter, Listener};
use shoal_proto::pb::envoy::config::route::v3::RouteConfiguration;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use shoal_proto::XdsType;

/// The state of the push pipeline: the current snapshot, what its last change was, and the
/// proxies connected to this replica with any rejections.
pub fn push_status(published: &Published, registry: &Registry) -> Value {
    let snap = &published.snapshot;
    let ctx = &snap.ctx;
    let connections = registry.snapshot();
    let nacks: Vec<Value> = connections
        .iter()
        .flat_map(|c| {
            c.types.iter().filter_map(move |(ty, s)| {
                s.last_nack
                    .as_ref()
                    .map(|n| json!({"node_id": c.node_id, "type": ty, "nack": n}))
            })
        })
        .collect();
    let c = &published.changes;
    json!({
        "snapshot": snap.number,
        "published_at_ms": published.published_at_ms,
        "observed_at_ms": published.observed_at_ms,
        "last_change": {
            "full": c.full,
            "services": c.services,
            "config_kinds": c.config.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
            "endpoint_hosts": c.endpoints.len(),
        },
        "counts": {
            "services": ctx.services.len(),
            "virtual_services": ctx.virtual_services.len(),
            "destination_rules": ctx.destination_rules.len(),
            "gateways": ctx.gateways.len(),
            "sidecars": ctx.sidecars.values().map(Vec::len).sum::<usize>(),
            "endpoint_hosts": snap.endpoints.iter().count(),
        },
        "proxies": {
            "connected": connections.len(),
            "sidecars": connections.iter().filter(|c| c.proxy_type == crate::index::proxy::ProxyKind::Sidecar).count(),
            "routers": connections.iter().filter(|c| c.proxy_type == crate::index::proxy::ProxyKind::Router).count(),
            "proxyless": connections.iter().filter(|c| c.proxy_type == crate::index::proxy::ProxyKind::Proxyless).count(),
        },
        "rejections": nacks,
    })
}

/// What shoal would send a connected proxy now, as Envoy would ask for it: every cluster
/// and listener, the endpoints of its EDS clusters and the routes its listeners name.
/// Resources are rendered in protobuf debug form, with their versions.
pub fn config_dump(registry: &Registry, snap: &Snapshot, node_id: &str) -> Option<Value> {
    let conn = registry.find(node_id)?;
    let proxy = &conn.proxy;
    let scope = ProxyScope::compute(proxy, &snap.ctx);
    if proxy.kind == crate::index::proxy::ProxyKind::Proxyless {
        // gRPC names every resource it wants: dump what it asked for.
        let gen = |ty| generate(ty, proxy, &scope, snap, &conn.requested(ty));
        return Some(json!({
            "node_id": node_id,
            "snapshot": snap.number,
            "visible_services": scope.services.len(),
            "clusters": render::<Cluster>(&gen(XdsType::Cluster)),
            "endpoints": render::<ClusterLoadAssignment>(&gen(XdsType::Endpoint)),
            "listeners": render::<Listener>(&gen(XdsType::Listener)),
            "routes": render::<RouteConfiguration>(&gen(XdsType::Route)),
        }));
    }
    let clusters = generate(XdsType::Cluster, proxy, &scope, snap, &[]);
    let listeners = generate(XdsType::Listener, proxy, &scope, snap, &[]);
    let eds_names: Vec<String> = clusters
        .iter()
        .filter_map(|r| Cluster::decode(&*r.any.value).ok())
        .filter(|c| c.cluster_discovery_type == Some(ClusterDiscoveryType::Type(3)))
        .map(|c| c.name)
        .collect();
    let route_names: Vec<String> = listeners
        .iter()
        .filter_map(|r| Listener::decode(&*r.any.value).ok())
        .flat_map(|l| l.filter_chains)
        .flat_map(|fc| fc.filters)
        .filter_map(|f| match f.config_type {
            Some(filter::ConfigType::TypedConfig(any)) => {
                HttpConnectionManager::decode(&*any.value).ok()
            }
            _ => None,
        })
        .filter_map(|hcm| match hcm.route_specifier {
            Some(RouteSpecifier::Rds(rds)) => Some(rds.route_config_name),
            _ => None,
        })
        .collect();
    let endpoints = generate(XdsType::Endpoint, proxy, &scope, snap, &eds_names);
    let routes = generate(XdsType::Route, proxy, &scope, snap, &route_names);
    Some(json!({
        "node_id": node_id,
        "snapshot": snap.number,
        "visible_services": scope.services.len(),
        "clusters": render::<Cluster>(&clusters),
        "endpoints": render::<ClusterLoadAssignment>(&endpoints),
        "listeners": render::<Listener>(&listeners),
        "routes": render::<RouteConfiguration>(&routes),
    }))
}

fn render<M: Message + Default + std::fmt::Debug>(resources: &[Resource]) -> Vec<Value> {
    resources
        .iter()
        .map(|r| {
            let body = M::decode(&*r.any.value)
                .map(|m| format!("{m:#?}"))
                .unwrap_or_else(|e| format!("<undecodable: {e}>"));
            json!({"name": r.name, "version": r.version, "bytes": r.any.value.len(), "resource": body})
        })
        .collect()
}
