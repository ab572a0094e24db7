//! Gateway TCP and TLS servers: listeners `0.0.0.0_<port>` (the gateway Service's
//! targetPort, as for HTTP servers) whose filter chains come from the VirtualServices bound
//! to the Gateway — `tcp` rules for TCP servers, `tls` rules matched by SNI for
//! `tls.mode: PASSTHROUGH` servers, as istiod builds them. Servers no rule routes get no
//! listener (istiod sends none either).
//!
//! Servers with `tls.mode: SIMPLE` or `MUTUAL` terminate TLS with the certificate of their
//! `credentialName`, fetched over SDS (`kubernetes://<name>`; under `MUTUAL` the client CA
//! `kubernetes://<name>-cacert`), on a chain matched by SNI = the server's hosts (none for
//! `*`), as istiod's `buildGatewayListeners` does: an `HTTPS` server then runs the HTTP
//! connection manager on its own route table `https.<port>.<port name>.<gateway>.<ns>`
//! (the bound VirtualServices' `http` rules, [`super::rds`]); a `TLS` server proxies the
//! decrypted stream by the bound `tcp` rules.
//!
//! The gateway's AuthorizationPolicies (selected by its labels) guard every chain with
//! network RBAC filters before `tcp_proxy`.

use super::lds::{
    gateway_listener_port, hcm_filter, http_connection_manager, tcp_proxy_filter, HcmRoutes,
    ListenerKey,
};
use super::outbound::{
    l4_applies, weighted_clusters, OutboundListenerKey, TcpChain, TlsTermination,
};
use super::{ads_config_source, sds};
use crate::index::config::Config;
use crate::index::hosts::{
    exported_to, namespace_admits, split_namespaced_host, split_reference, wildcard_covers,
};
use crate::index::proxy::Proxy;
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use shoal_common::model::{
    Gateway, GatewayServer, OutboundTrafficMode, RouteDestination, VirtualService,
};
use shoal_proto::pb::envoy::config::core::v3::{transport_socket, TransportSocket};
use shoal_proto::pb::envoy::config::listener::v3::FilterChain;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::ValidationContextType, CommonTlsContext, DownstreamTlsContext,
    SdsSecretConfig,
};
use shoal_proto::pb::google::protobuf::BoolValue;
use shoal_proto::{
    credential_resource_name, gateway_https_route_name, listener_name, sni_dnat_cluster_name,
};
use std::collections::{BTreeMap, BTreeSet};
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
    /// `HTTPS` with `SIMPLE`/`MUTUAL`: TLS terminated, then HTTP routes.
    TerminatedHttp,
    /// `TLS` with `SIMPLE`/`MUTUAL`: TLS terminated, then `tcp` routes.
    TerminatedTcp,
    /// `TLS` with `AUTO_PASSTHROUGH` (an east-west gateway): Istio mTLS passed through
    /// to the service its SNI names (istiod's sni-dnat chains).
    AutoPassthrough,
}

/// The kind of a server, or `None` for what shoal does not implement (ingest refuses it).
pub fn server_kind(server: &GatewayServer) -> Option<ServerKind> {
    let mode = server.tls.as_ref().and_then(|t| t.mode.as_deref());
    let terminated = matches!(mode, Some("SIMPLE" | "MUTUAL"))
        && server
            .tls
            .as_ref()
            .is_some_and(|t| t.credential_name.as_deref().is_some_and(|c| !c.is_empty()));
    match server.port.protocol.to_ascii_uppercase().as_str() {
        "HTTP" | "HTTP2" | "GRPC" => Some(ServerKind::Http),
        "TCP" | "MONGO" | "MYSQL" | "REDIS" => Some(ServerKind::Tcp),
        "TLS" | "HTTPS" if mode == Some("PASSTHROUGH") => Some(ServerKind::TlsPassthrough),
        "TLS" if mode == Some("AUTO_PASSTHROUGH") => Some(ServerKind::AutoPassthrough),
        "HTTPS" if terminated => Some(ServerKind::TerminatedHttp),
        "TLS" if terminated => Some(ServerKind::TerminatedTcp),
        _ => None,
    }
}

/// The SNI values a terminating server's chain matches: its hosts without their namespace
/// part; none when a host is `*` (every SNI, and clients that send none).
pub fn server_sni(server: &GatewayServer) -> Vec<String> {
    let hosts: Vec<String> = server
        .hosts
        .iter()
        .map(|h| h.split_once('/').map_or(h.as_str(), |(_, h)| h).to_string())
        .collect();
    if hosts.iter().any(|h| h == "*") {
        return Vec::new();
    }
    let mut hosts = hosts;
    hosts.sort();
    hosts.dedup();
    hosts
}

/// The termination of a `SIMPLE`/`MUTUAL` server, with the route of an HTTPS server.
fn termination(server: &GatewayServer, gw: &Config<Gateway>) -> Option<TlsTermination> {
    let tls = server.tls.as_ref()?;
    let http = server_kind(server) == Some(ServerKind::TerminatedHttp);
    Some(TlsTermination {
        credential: tls.credential_name.clone()?,
        mutual: tls.mode.as_deref() == Some("MUTUAL"),
        http_route: http.then(|| {
            gateway_https_route_name(
                server.port.number,
                &server.port.name,
                &gw.meta.name,
                &gw.meta.namespace,
            )
        }),
    })
}

/// A chain that terminates TLS with a gateway credential over SDS, then runs the HTTP
/// connection manager (HTTPS servers) or proxies to `clusters` (TLS servers), behind the
/// gateway's RBAC filters (HTTP ones in the connection manager, network ones before
/// `tcp_proxy`).
pub(crate) fn terminating_chain(
    listener: &str,
    t: &TlsTermination,
    stat: &str,
    clusters: &[(String, u32)],
    authz: &super::authz::AuthzKey,
) -> FilterChain {
    let sds = |name: String| SdsSecretConfig {
        name,
        sds_config: Some(ads_config_source()),
    };
    let context = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            // HTTP/2 and HTTP/1.1 after termination; a TLS server's stream is opaque.
            alpn_protocols: if t.http_route.is_some() {
                vec!["h2".into(), "http/1.1".into()]
            } else {
                Vec::new()
            },
            tls_certificate_sds_secret_configs: vec![sds(credential_resource_name(&t.credential))],
            validation_context_type: t.mutual.then(|| {
                ValidationContextType::ValidationContextSdsSecretConfig(sds(
                    credential_resource_name(&format!("{}{}", t.credential, sds::CA_SUFFIX)),
                ))
            }),
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue { value: t.mutual }),
        ..Default::default()
    };
    let filters = match &t.http_route {
        Some(route) => {
            let mut hcm = HttpConnectionManager {
                // Gateways are the edge: trust the peer address, as Istio does.
                use_remote_address: Some(BoolValue { value: true }),
                ..http_connection_manager(listener, HcmRoutes::Rds(route))
            };
            hcm.http_filters
                .splice(0..0, super::authz::http_filters(authz));
            vec![hcm_filter(&hcm)]
        }
        None => {
            let mut filters = super::authz::network_filters(authz);
            filters.push(tcp_proxy_filter(stat, clusters));
            filters
        }
    };
    FilterChain {
        filters,
        transport_socket: Some(TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(shoal_proto::pack(
                "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                &context,
            ))),
        }),
        ..Default::default()
    }
}

/// Whether `vs` names `gw` in its `gateways` (`name`, in the VirtualService's namespace, or
/// `namespace/name`).
pub(crate) fn binds(vs: &Config<VirtualService>, gw: &Config<Gateway>) -> bool {
    vs.spec.gateways.iter().any(|reference| {
        let (ns, name) = split_reference(reference, &vs.meta.namespace);
        ns == gw.meta.namespace && name == gw.meta.name
    })
}

/// The VirtualServices exported to `proxy`'s namespace that are bound to `gw`.
pub(crate) fn bound_virtual_services<'a>(
    proxy: &'a Proxy,
    ctx: &'a PushContext,
    gw: &'a Config<Gateway>,
) -> impl Iterator<Item = &'a Arc<Config<VirtualService>>> + 'a {
    ctx.virtual_services
        .iter()
        .filter(|vs| exported_to(&vs.spec.export_to, &vs.meta.namespace, &proxy.namespace))
        .filter(move |vs| binds(vs, gw))
}

/// Whether a Gateway selecting this proxy has an `AUTO_PASSTHROUGH` server: it then gets
/// the SNI-DNAT clusters ([`super::cds`]) its sni-dnat chains proxy to.
pub fn has_auto_passthrough(proxy: &Proxy, ctx: &PushContext) -> bool {
    proxy.kind == crate::index::proxy::ProxyKind::Router
        && ctx
            .gateways_for(&proxy.namespace, &proxy.labels)
            .iter()
            .any(|gw| {
                gw.spec
                    .servers
                    .iter()
                    .any(|s| server_kind(s) == Some(ServerKind::AutoPassthrough))
            })
}

/// istiod's `builtAutoPassthroughFilterChains`: for every in-mesh service the server's hosts
/// cover, one chain per port (and per DestinationRule subset) that matches the SNI of
/// Istio mTLS to it, `outbound_.<port>_.<subset>_.<host>`, and Istio's mTLS ALPNs, and
/// proxies the still-encrypted connection to the SNI-DNAT cluster of that name (the local
/// endpoints; the TLS is the caller's sidecar's, ended by the destination's sidecar).
fn auto_passthrough_chains(
    server: &GatewayServer,
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
    chains: &mut Vec<TcpChain>,
) {
    let hosts = server_sni(server);
    let covered = |host: &str| hosts.is_empty() || hosts.iter().any(|h| wildcard_covers(h, host));
    for svc in &scope.services {
        let mesh_external = matches!(
            svc.source,
            crate::index::service::ServiceSource::ServiceEntry {
                mesh_internal: false,
                ..
            }
        );
        if mesh_external || !covered(&svc.hostname) {
            continue;
        }
        let dr = ctx.destination_rule(&proxy.namespace, &proxy.labels, svc);
        let subsets: Vec<&str> = std::iter::once("")
            .chain(
                dr.as_ref()
                    .map(|d| d.spec.subsets.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|s| s.name.as_str()),
            )
            .collect();
        for port in &svc.ports {
            for subset in &subsets {
                let name = sni_dnat_cluster_name(port.port.into(), subset, &svc.hostname);
                if chains.iter().any(|c| c.sni_hosts.first() == Some(&name)) {
                    continue;
                }
                chains.push(TcpChain {
                    destination_cidrs: Vec::new(),
                    sni_hosts: vec![name.clone()],
                    clusters: vec![(name, 1)],
                    terminate: None,
                    application_protocols: super::mtls::ALL_ISTIO_MTLS_ALPNS
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                });
            }
        }
    }
}

/// The TCP/TLS listeners of a gateway proxy.
pub fn keys(proxy: &Proxy, scope: &ProxyScope, ctx: &PushContext) -> Vec<ListenerKey> {
    // Listener port → chains, in Gateway and server order.
    let mut listeners: BTreeMap<u32, Vec<TcpChain>> = BTreeMap::new();
    // Ports whose chains pass Istio mTLS through: istiod builds them without the
    // gateway's authorization filters (the destination's sidecar enforces its own).
    let mut passthrough_ports: BTreeSet<u32> = BTreeSet::new();
    for gw in ctx.gateways_for(&proxy.namespace, &proxy.labels) {
        let gw_ref = format!("{}/{}", gw.meta.namespace, gw.meta.name);
        let bound: Vec<_> = bound_virtual_services(proxy, ctx, gw).collect();
        for server in &gw.spec.servers {
            let kind = server_kind(server);
            if matches!(kind, None | Some(ServerKind::Http)) {
                continue;
            }
            let port = server.port.number;
            let listener_port = gateway_listener_port(scope, port);
            let chains = listeners.entry(listener_port).or_default();
            if kind == Some(ServerKind::AutoPassthrough) {
                passthrough_ports.insert(listener_port);
                auto_passthrough_chains(server, proxy, scope, ctx, chains);
                continue;
            }
            if kind == Some(ServerKind::TerminatedHttp) {
                // One chain per server, routes or not (istiod's HTTPS server chain); a
                // second server with the same SNI on the port cannot be told apart.
                let sni = server_sni(server);
                if !chains.iter().any(|c| c.sni_hosts == sni) {
                    chains.push(TcpChain {
                        destination_cidrs: Vec::new(),
                        sni_hosts: sni,
                        clusters: Vec::new(),
                        terminate: termination(server, gw),
                        application_protocols: Vec::new(),
                    });
                }
                continue;
            }
            for vs in &bound {
                let ns = &vs.meta.namespace;
                let match_gateways_ok = |gws: &[String]| {
                    gws.is_empty()
                        || gws.iter().any(|g| {
                            let (gns, gname) = split_reference(g, ns);
                            format!("{gns}/{gname}") == gw_ref
                        })
                };
                let tcp_rule_applies = |rule: &shoal_common::model::TcpRoute| {
                    rule.matches.is_empty()
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
                        })
                };
                match kind {
                    Some(ServerKind::Tcp) => {
                        for rule in &vs.spec.tcp {
                            let applies = tcp_rule_applies(rule);
                            if applies && !chains.iter().any(|c| c.sni_hosts.is_empty()) {
                                chains.push(TcpChain {
                                    destination_cidrs: Vec::new(),
                                    sni_hosts: Vec::new(),
                                    clusters: clusters(&rule.route, ns, port, ctx),
                                    terminate: None,
                                    application_protocols: Vec::new(),
                                });
                            }
                        }
                    }
                    Some(ServerKind::TerminatedTcp) => {
                        // The first applicable `tcp` rule takes the server's decrypted
                        // connections (as the TCP server case does for plain ones).
                        let sni = server_sni(server);
                        for rule in &vs.spec.tcp {
                            let applies = tcp_rule_applies(rule);
                            if applies && !chains.iter().any(|c| c.sni_hosts == sni) {
                                chains.push(TcpChain {
                                    destination_cidrs: Vec::new(),
                                    sni_hosts: sni.clone(),
                                    clusters: clusters(&rule.route, ns, port, ctx),
                                    terminate: termination(server, gw),
                                    application_protocols: Vec::new(),
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
                                            let (sns, shost) = split_namespaced_host(sh);
                                            namespace_admits(sns, &gw.meta.namespace, ns)
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
                                    terminate: None,
                                    application_protocols: Vec::new(),
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
            let authz = if passthrough_ports.contains(&port) {
                super::authz::AuthzKey::default()
            } else {
                authz.clone()
            };
            ListenerKey::Outbound(OutboundListenerKey {
                name: listener_name("0.0.0.0", port),
                bind: "0.0.0.0".into(),
                port,
                http_route: None,
                tcp,
                fallthrough: OutboundTrafficMode::RegistryOnly,
                transparent: false,
                gateway: true,
                authz,
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
