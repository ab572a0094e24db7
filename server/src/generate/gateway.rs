//! Gateway TCP and TLS-passthrough servers: listeners `0.0.0.0_<port>` (the gateway
//! Service's targetPort, as for HTTP servers) whose filter chains come from the
//! VirtualServices bound to the Gateway — `tcp` rules for TCP servers, `tls` rules matched
//! by SNI for `tls.mode: PASSTHROUGH` servers, as istiod builds them. Servers no rule routes
//! get no listener (istiod sends none either). The gateway's AuthorizationPolicies (selected
//! by its labels) guard every chain with network RBAC filters before `tcp_proxy`.

use super::lds::{gateway_listener_port, ListenerKey};
use super::outbound::{l4_applies, weighted_clusters, OutboundListenerKey, TcpChain};
use crate::proxy::Proxy;
use crate::push_context::{exported_to, wildcard_covers, Config, PushContext};
use crate::scope::ProxyScope;
use shoal_common::model::{Gateway, GatewayServer, OutboundTrafficMode, RouteDestination};
use shoal_proto::listener_name;
use std::collections::BTreeMap;
use std::sync::Arc;

/// How a gateway server carries traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// HTTP, HTTP2, gRPC: HTTP connection manager and RDS.
    Http,
    /// Opaque TCP: `tcp` routes.
    Tcp,
    /// TLS passed through to the backend, routed by SNI: `tls` routes.
    TlsPassthrough,
}

/// The kind of a server, or `None` for what shoal does not implement (ingest refuses it).
pub fn server_kind(server: &GatewayServer) -> Option<ServerKind> {
    let passthrough = server
        .tls
        .as_ref()
        .and_then(|t| t.mode.as_deref())
        .is_some_and(|m| m == "PASSTHROUGH");
    match server.port.protocol.to_ascii_uppercase().as_str() {
        "HTTP" | "HTTP2" | "GRPC" => Some(ServerKind::Http),
        "TCP" | "MONGO" | "MYSQL" | "REDIS" => Some(ServerKind::Tcp),
        "TLS" | "HTTPS" if passthrough => Some(ServerKind::TlsPassthrough),
        _ => None,
    }
}

fn gateway_name_matches(reference: &str, vs_ns: &str, gw: &Config<Gateway>) -> bool {
    let (ns, name) = reference.split_once('/').unwrap_or((vs_ns, reference));
    ns == gw.meta.namespace && name == gw.meta.name
}

/// The TCP/TLS listeners of a gateway proxy.
pub fn keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<ListenerKey> {
    // Listener port → chains, in Gateway and server order.
    let mut listeners: BTreeMap<u32, Vec<TcpChain>> = BTreeMap::new();
    for gw in ctx.gateways_for(&proxy.labels) {
        let gw_ref = format!("{}/{}", gw.meta.namespace, gw.meta.name);
        let bound: Vec<&Arc<Config<shoal_common::model::VirtualService>>> = ctx
            .virtual_services
            .iter()
            .filter(|vs| exported_to(&vs.spec.export_to, &vs.meta.namespace, &proxy.namespace))
            .filter(|vs| {
                vs.spec
                    .gateways
                    .iter()
                    .any(|r| gateway_name_matches(r, &vs.meta.namespace, gw))
            })
            .collect();
        for server in &gw.spec.servers {
            let kind = server_kind(server);
            if !matches!(kind, Some(ServerKind::Tcp | ServerKind::TlsPassthrough)) {
                continue;
            }
            let port = server.port.number;
            let chains = listeners
                .entry(gateway_listener_port(scope, port))
                .or_default();
            for vs in &bound {
                let ns = &vs.meta.namespace;
                let match_gateways_ok = |gws: &[String]| {
                    gws.is_empty()
                        || gws.iter().any(|g| {
                            let (gns, gname) = g.split_once('/').unwrap_or((ns, g));
                            format!("{gns}/{gname}") == gw_ref
                        })
                };
                match kind {
                    Some(ServerKind::Tcp) => {
                        for rule in &vs.spec.tcp {
                            let applies = rule.matches.is_empty()
                                || rule.matches.iter().any(|m| {
                                    match_gateways_ok(&m.gateways)
                                        && l4_applies(
                                            proxy,
                                            port,
                                            m.port,
                                            &m.source_labels,
                                            &[],
                                            m.source_namespace.as_deref(),
                                        )
                                });
                            if applies && !chains.iter().any(|c| c.sni_hosts.is_empty()) {
                                chains.push(TcpChain {
                                    destination_cidrs: Vec::new(),
                                    sni_hosts: Vec::new(),
                                    clusters: clusters(&rule.route, ns, port, ctx),
                                });
                            }
                        }
                    }
                    Some(ServerKind::TlsPassthrough) => {
                        for rule in &vs.spec.tls {
                            for m in &rule.matches {
                                if !match_gateways_ok(&m.gateways)
                                    || m.port.is_some_and(|p| p != port)
                                {
                                    continue;
                                }
                                // SNI values the server admits (`ns/host` server hosts match
                                // the VirtualService's namespace).
                                let sni: Vec<String> = m
                                    .sni_hosts
                                    .iter()
                                    .filter(|h| {
                                        server.hosts.iter().any(|sh| {
                                            let (sns, shost) =
                                                sh.split_once('/').unwrap_or(("*", sh));
                                            (sns == "*"
                                                || sns == ns
                                                || (sns == "." && ns == &gw.meta.namespace))
                                                && (wildcard_covers(shost, h)
                                                    || wildcard_covers(h, shost))
                                        })
                                    })
                                    .cloned()
                                    .collect();
                                if sni.is_empty() || chains.iter().any(|c| c.sni_hosts == sni) {
                                    continue;
                                }
                                chains.push(TcpChain {
                                    destination_cidrs: Vec::new(),
                                    sni_hosts: sni,
                                    clusters: clusters(&rule.route, ns, port, ctx),
                                });
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let authz = super::authz::applicable(ctx, proxy);
    listeners
        .into_iter()
        .filter(|(_, chains)| !chains.is_empty())
        .map(|(port, tcp)| {
            ListenerKey::Outbound(OutboundListenerKey {
                name: listener_name("0.0.0.0", port),
                bind: "0.0.0.0".into(),
                port,
                http_route: None,
                tcp,
                fallthrough: OutboundTrafficMode::RegistryOnly,
                transparent: false,
                gateway: true,
                authz: authz.clone(),
            })
        })
        .collect()
}

/// A rule's destinations as weighted clusters: a destination without a port takes its
/// service's only port, else the server port.
fn clusters(
    route: &[RouteDestination],
    ns: &str,
    port: u32,
    ctx: &PushContext,
) -> Vec<(String, u32)> {
    weighted_clusters(route, ns, |host| {
        match ctx.services.get(host).map(|s| s.ports.as_slice()) {
            Some([only]) => only.port.into(),
            _ => port,
        }
    })
}
