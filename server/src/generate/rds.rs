//! RDS: route tables for gateway ports (`http.<port>`) and sidecar egress ports (`"<port>"`),
//! built from VirtualServices with Istio's semantics, and a default route for every visible
//! service that no VirtualService covers (sidecars).

use super::gateway::{binds, bound_virtual_services};
use super::http_route::{destination_hosts, uses_source, vs_routes, RouteEnv, Source};
use super::vhosts::{self, service_domains, unique_domains};
use super::{pb_duration, Resource};
use crate::hashing::FastSet;
use crate::index::config::Config;
use crate::index::hosts::{
    exported_to, most_specific, namespace_admits, resolve_host, split_namespaced_host,
    split_reference, wildcard_covers,
};
use crate::index::proxy::{Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use crate::index::scope::{host_entry_matches, ProxyScope};
use crate::index::service::ServiceView;
use prost::Message as _;
use shoal_common::model::{Gateway, OutboundTrafficMode, VirtualService};
use shoal_proto::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier, route_match::PathSpecifier,
    virtual_host::TlsRequirementType, DirectResponseAction, Route, RouteAction, RouteConfiguration,
    RouteMatch, VirtualHost,
};
use shoal_proto::pb::google::protobuf::{BoolValue, UInt32Value};
use shoal_proto::{gateway_https_route_name, XdsType};
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;

/// Everything one route table is built from: the VirtualServices that can shape it and the
/// ports of the services they name as destinations (a destination without a port resolves
/// to the service's only port). Building reads nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RouteKey {
    /// A gateway port's table (`http.<port>`).
    Gateway(GatewayRouteKey),
    /// A sidecar egress port's table (`"<port>"`).
    Sidecar(SidecarRouteKey),
}

/// Inputs of a gateway route table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatewayRouteKey {
    /// Route table name.
    pub name: String,
    /// Listener port.
    pub port: u32,
    /// The Gateway server ports served on this listener port (each maps to it through the
    /// gateway Service's `targetPort`, or is the port itself).
    pub server_ports: Vec<u32>,
    /// The proxy's Gateways that have a server on the port.
    pub gateways: Vec<Arc<Config<Gateway>>>,
    /// VirtualServices exported to the proxy's namespace and bound to one of `gateways`.
    pub virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// Ports of destination services, by hostname.
    pub destinations: DestinationPorts,
    /// Consistent hashes of route destinations (DestinationRules seen by the proxy).
    pub hashes: DestinationHashes,
    /// The gateway workload, when a VirtualService matches on `sourceLabels` /
    /// `sourceNamespace` (else `None`, so gateways share the table).
    pub source: Option<Source>,
    /// The table of one TLS-terminating HTTPS server (`https.<port>.<port name>.<gw>.<ns>`):
    /// its port number and name (`gateways` is then its Gateway alone). `None`: the plain
    /// HTTP servers on the port (`http.<port>`).
    pub https_server: Option<(u32, String)>,
}

/// Inputs of a sidecar route table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SidecarRouteKey {
    /// Route table name.
    pub name: String,
    /// Listener port.
    pub port: u32,
    /// The proxy's namespace (short-name domains, exportTo).
    pub proxy_namespace: String,
    /// Services with an HTTP port `port` that the egress listener admits, by hostname.
    pub services: Vec<Arc<ServiceView>>,
    /// Mesh VirtualServices exported to the proxy's namespace that cover one of `services`.
    pub virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// Ports of destination services, by hostname.
    pub destinations: DestinationPorts,
    /// Consistent hashes of route destinations (DestinationRules seen by the proxy).
    pub hashes: DestinationHashes,
    /// The calling workload, when a VirtualService matches on `sourceLabels` /
    /// `sourceNamespace` (else `None`, so sidecars share the table).
    pub source: Option<Source>,
    /// The catch-all virtual host of a captured sidecar: `allow_any` to
    /// `PassthroughCluster`, or `block_all` (502) under `REGISTRY_ONLY`.
    pub catch_all: Option<OutboundTrafficMode>,
    /// A table for proxyless gRPC, which matches its target `host:port`: domains list
    /// `host:port` beside each host and the port counts in host matching. Envoy sidecars
    /// ignore the port and get the bare hosts, as istiod's `SidecarIgnorePort` (half the
    /// domains).
    pub proxyless: bool,
}

pub use super::http_route::DestinationPorts;
use crate::index::push_context::{destination_hashes, DestinationHashes};

/// The route tables requested, for this proxy.
pub fn keys(
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
    names: &[String],
) -> Vec<RouteKey> {
    names
        .iter()
        .filter_map(|name| match proxy.kind {
            ProxyKind::Router => match name.strip_prefix("http.") {
                Some(port) => Some(RouteKey::Gateway(gateway_key(
                    name,
                    port.parse().ok()?,
                    proxy,
                    scope,
                    ctx,
                ))),
                None => https_key(name, proxy, ctx).map(RouteKey::Gateway),
            },
            ProxyKind::Sidecar => {
                // `"<port>"`, or `"<host>:<port>"` for a sniffed service on its own VIP.
                let (host, port) = match name.rsplit_once(':') {
                    Some((host, port)) => (Some(host), port.parse().ok()?),
                    None => (None, name.parse().ok()?),
                };
                Some(RouteKey::Sidecar(sidecar_key(
                    name, host, port, proxy, scope, ctx,
                )))
            }
            // Served by `generate::grpc`; ztunnel has no routes.
            ProxyKind::Proxyless | ProxyKind::Ztunnel => None,
        })
        .collect()
}

/// Builds one route table from its key alone.
pub fn build(key: &RouteKey) -> Resource {
    match key {
        RouteKey::Gateway(k) => Resource::new(XdsType::Route, k.name.clone(), &gateway_routes(k)),
        RouteKey::Sidecar(k) => {
            Resource::from_encoded(XdsType::Route, k.name.clone(), sidecar_routes_encoded(k))
        }
    }
}

/// The ports of every service the VirtualServices route to.
fn destination_ports(vss: &[Arc<Config<VirtualService>>], ctx: &PushContext) -> DestinationPorts {
    let mut out = DestinationPorts::new();
    for vs in vss {
        for host in destination_hosts(vs) {
            if let Some(svc) = ctx.services.get(&host) {
                out.insert(host, svc.ports.iter().map(|p| p.port).collect());
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Gateways

/// Whether a VirtualService host is admitted by a gateway server host (`ns/host` or `host`,
/// with `*` wildcards). Returns the host the virtual host is built for: the more specific.
fn gateway_host_match(
    server_host: &str,
    vs_host: &str,
    vs_ns: &str,
    gw_ns: &str,
) -> Option<String> {
    let (ns, host) = split_namespaced_host(server_host);
    if !namespace_admits(ns, gw_ns, vs_ns) {
        return None;
    }
    if wildcard_covers(host, vs_host) {
        Some(vs_host.to_string())
    } else if wildcard_covers(vs_host, host) {
        Some(host.to_string())
    } else {
        None
    }
}

fn gateway_key(
    name: &str,
    port: u32,
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
) -> GatewayRouteKey {
    // The Gateway server ports this listener port serves (a Service's port → targetPort).
    let on_port = |n: u32| super::lds::gateway_listener_port(scope, n) == port;
    let gateways: Vec<Arc<Config<Gateway>>> = ctx
        .gateways_for(&proxy.namespace, &proxy.labels)
        .into_iter()
        .filter(|gw| gw.spec.servers.iter().any(|s| on_port(s.port.number)))
        .cloned()
        .collect();
    let mut server_ports: Vec<u32> = gateways
        .iter()
        .flat_map(|gw| gw.spec.servers.iter().map(|s| s.port.number))
        .filter(|n| on_port(*n))
        .collect();
    server_ports.sort_unstable();
    server_ports.dedup();
    let virtual_services: Vec<_> = ctx
        .virtual_services
        .iter()
        .filter(|vs| exported_to(&vs.spec.export_to, &vs.meta.namespace, &proxy.namespace))
        .filter(|vs| gateways.iter().any(|gw| binds(vs, gw)))
        .cloned()
        .collect();
    let destinations = destination_ports(&virtual_services, ctx);
    GatewayRouteKey {
        name: name.to_string(),
        port,
        server_ports,
        gateways,
        source: uses_source(&virtual_services).then(|| source_of(proxy)),
        hashes: destination_hashes(&virtual_services, &proxy.namespace, &proxy.labels, ctx),
        virtual_services,
        destinations,
        https_server: None,
    }
}

/// The key of an HTTPS server's table, `https.<port>.<port name>.<gateway>.<namespace>`,
/// if one of the proxy's Gateways has that TLS-terminating server.
fn https_key(name: &str, proxy: &Proxy, ctx: &PushContext) -> Option<GatewayRouteKey> {
    let gw = ctx
        .gateways_for(&proxy.namespace, &proxy.labels)
        .into_iter()
        .find_map(|gw| {
            let server = gw.spec.servers.iter().find(|s| {
                super::gateway::server_kind(s) == Some(super::gateway::ServerKind::TerminatedHttp)
                    && gateway_https_route_name(
                        s.port.number,
                        &s.port.name,
                        &gw.meta.name,
                        &gw.meta.namespace,
                    ) == name
            })?;
            Some((gw.clone(), server.port.clone()))
        });
    let (gw, port) = gw?;
    let virtual_services: Vec<_> = bound_virtual_services(proxy, ctx, &gw).cloned().collect();
    Some(GatewayRouteKey {
        name: name.to_string(),
        port: port.number,
        server_ports: vec![port.number],
        gateways: vec![gw],
        source: uses_source(&virtual_services).then(|| source_of(proxy)),
        hashes: destination_hashes(&virtual_services, &proxy.namespace, &proxy.labels, ctx),
        destinations: destination_ports(&virtual_services, ctx),
        virtual_services,
        https_server: Some((port.number, port.name)),
    })
}

fn gateway_routes(key: &GatewayRouteKey) -> RouteConfiguration {
    let GatewayRouteKey {
        name,
        port: _,
        server_ports,
        gateways,
        virtual_services,
        destinations,
        source,
        hashes,
        https_server,
    } = key;
    // The servers this table serves: the one HTTPS server, or the port's HTTP servers.
    let serves = |s: &shoal_common::model::GatewayServer| match https_server {
        Some((number, name)) => {
            s.port.number == *number
                && &s.port.name == name
                && super::gateway::server_kind(s)
                    == Some(super::gateway::ServerKind::TerminatedHttp)
        }
        None => {
            server_ports.contains(&s.port.number)
                && super::gateway::server_kind(s) == Some(super::gateway::ServerKind::Http)
        }
    };
    // Route matches and default destination ports refer to the Gateway server port.
    let port = server_ports.first().copied().unwrap_or(key.port);
    // Virtual host → routes, merged across VirtualServices in precedence order, as Istio
    // merges VirtualServices that share a host on a gateway.
    let mut vhosts: BTreeMap<String, Vec<Route>> = BTreeMap::new();
    let mut https_redirect: BTreeSet<String> = BTreeSet::new();
    for vs in virtual_services {
        let bound: Vec<_> = gateways.iter().filter(|gw| binds(vs, gw)).collect();
        if bound.is_empty() {
            continue;
        }
        let mut hosts = BTreeSet::new();
        for gw in &bound {
            for server in gw.spec.servers.iter().filter(|s| serves(s)) {
                let redirect = server.tls.as_ref().is_some_and(|t| t.https_redirect);
                for sh in &server.hosts {
                    for vh in &vs.spec.hosts {
                        // A short host names the service in the VirtualService's namespace.
                        let vh = resolve_host(vh, &vs.meta.namespace);
                        if let Some(h) =
                            gateway_host_match(sh, &vh, &vs.meta.namespace, &gw.meta.namespace)
                        {
                            if redirect {
                                https_redirect.insert(h.clone());
                            }
                            hosts.insert(h);
                        }
                    }
                }
            }
        }
        if hosts.is_empty() {
            continue;
        }
        let gateway_names: Vec<String> = bound
            .iter()
            .map(|g| format!("{}/{}", g.meta.namespace, g.meta.name))
            .collect();
        let env = RouteEnv {
            ns: &vs.meta.namespace,
            listener_port: port,
            destinations,
            source: source.as_ref(),
            hashes,
        };
        let routes = vs_routes(vs, &env, |m| {
            m.gateways.is_empty()
                || m.gateways.iter().any(|g| {
                    gateway_names.iter().any(|n| {
                        let (ns, name) = split_reference(g, &vs.meta.namespace);
                        n == &format!("{ns}/{name}")
                    })
                })
        });
        for h in hosts {
            vhosts.entry(h).or_default().extend(routes.iter().cloned());
        }
    }
    let mut seen = FastSet::default();
    let virtual_hosts = vhosts
        .into_iter()
        .filter_map(|(host, routes)| {
            // Ports are ignored in host matching (below), so the host alone is the domain.
            let domains = unique_domains(vec![host.clone()], &mut seen);
            (!domains.is_empty()).then(|| VirtualHost {
                name: format!("{host}:{port}"),
                domains,
                routes: catch_all_last(routes),
                require_tls: if https_redirect.contains(&host) {
                    TlsRequirementType::All as i32
                } else {
                    TlsRequirementType::None as i32
                },
                include_request_attempt_count: true,
                ..Default::default()
            })
        })
        .collect();
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        max_direct_response_body_size_bytes: Some(UInt32Value {
            value: super::lds::MAX_DIRECT_RESPONSE_BODY_BYTES,
        }),
        ignore_port_in_host_matching: true,
        ..Default::default()
    }
}

/// istiod's `SortVHostRoutes`: when several VirtualServices share a host on a gateway, the
/// catch-all routes (prefix `/` or regex `.*`, no header or query match) go last, other
/// routes keeping their order, so one VirtualService's catch-all cannot shadow another's
/// specific routes.
fn catch_all_last(routes: Vec<Route>) -> Vec<Route> {
    let is_catch_all = |r: &Route| {
        r.r#match.as_ref().is_some_and(|m| {
            let path = match &m.path_specifier {
                Some(PathSpecifier::Prefix(p)) => p == "/",
                Some(PathSpecifier::PathSeparatedPrefix(p)) => p == "/",
                Some(PathSpecifier::SafeRegex(r)) => r.regex == ".*",
                _ => false,
            };
            path && m.headers.is_empty() && m.query_parameters.is_empty()
        })
    };
    let (catch_all, specific): (Vec<Route>, Vec<Route>) =
        routes.into_iter().partition(is_catch_all);
    specific.into_iter().chain(catch_all).collect()
}

// ---------------------------------------------------------------------------------------
// Sidecars

/// The key of a sidecar route table (`only_host`: the table of one service's virtual
/// hosts). A proxyless gRPC node's services need no HTTP port protocol: gRPC always speaks
/// HTTP/2.
pub(crate) fn sidecar_key(
    name: &str,
    only_host: Option<&str>,
    port: u32,
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
) -> SidecarRouteKey {
    let any_protocol = proxy.kind == ProxyKind::Proxyless;
    let listener = scope.sidecar.as_ref().and_then(|s| {
        s.spec
            .egress
            .iter()
            .find(|l| l.port.as_ref().is_some_and(|p| p.number == port))
    });
    let services: Vec<Arc<ServiceView>> = scope
        .services
        .iter()
        .filter(|svc| {
            svc.port(port)
                .is_some_and(|p| any_protocol || p.protocol.is_http())
                && only_host.is_none_or(|h| h == svc.hostname)
                && listener.is_none_or(|l| {
                    l.hosts
                        .iter()
                        .any(|h| host_entry_matches(h, &proxy.namespace, svc))
                })
        })
        .cloned()
        .collect();
    let virtual_services: Vec<_> = ctx
        .virtual_services
        .iter()
        .filter(|vs| {
            let for_mesh =
                vs.spec.gateways.is_empty() || vs.spec.gateways.iter().any(|g| g == "mesh");
            for_mesh && exported_to(&vs.spec.export_to, &vs.meta.namespace, &proxy.namespace)
        })
        .filter(|vs| {
            vs.spec.hosts.iter().any(|h| {
                let h = resolve_host(h, &vs.meta.namespace);
                services
                    .iter()
                    .any(|svc| wildcard_covers(&h, &svc.hostname))
            })
        })
        .cloned()
        .collect();
    let destinations = destination_ports(&virtual_services, ctx);
    let captured = proxy.interception.captured();
    SidecarRouteKey {
        name: name.to_string(),
        port,
        proxy_namespace: proxy.namespace.clone(),
        services,
        source: uses_source(&virtual_services).then(|| source_of(proxy)),
        hashes: destination_hashes(&virtual_services, &proxy.namespace, &proxy.labels, ctx),
        virtual_services,
        destinations,
        catch_all: captured.then_some(scope.outbound_policy),
        proxyless: any_protocol,
    }
}

fn source_of(proxy: &Proxy) -> Source {
    Source {
        namespace: proxy.namespace.clone(),
        labels: proxy.labels.clone(),
    }
}

/// Builds a sidecar route table from its key.
pub(crate) fn sidecar_routes(key: &SidecarRouteKey) -> RouteConfiguration {
    let virtual_hosts = sidecar_hosts::<Infallible>(key, |_| None)
        .into_iter()
        .map(|host| match host {
            Host::Built(vh) => *vh,
            Host::Shared(never) => match never {},
        })
        .collect();
    RouteConfiguration {
        name: key.name.clone(),
        virtual_hosts,
        ..sidecar_table_fields(key)
    }
}

/// [`sidecar_routes`] encoded, with the services' default virtual hosts copied from their
/// shared encodings ([`vhosts`]): the same bytes, without building the virtual hosts no
/// VirtualService claims. Proxyless gRPC tables (`host:port` domains) build every one.
fn sidecar_routes_encoded(key: &SidecarRouteKey) -> Vec<u8> {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
    const VIRTUAL_HOSTS: u32 = 2;
    let hosts = sidecar_hosts(key, |svc| {
        (!key.proxyless).then(|| vhosts::default_host(svc, key.port, &key.proxy_namespace))
    });
    // `name` (field 1) comes before the virtual hosts and every other field after them, as
    // prost writes a message's fields.
    let head = RouteConfiguration {
        name: key.name.clone(),
        ..Default::default()
    };
    let tail = sidecar_table_fields(key);
    let bodies: Vec<std::borrow::Cow<'_, [u8]>> = hosts
        .iter()
        .map(|host| match host {
            Host::Built(vh) => std::borrow::Cow::Owned(vh.encode_to_vec()),
            Host::Shared(shared) => std::borrow::Cow::Borrowed(&shared.encoded[..]),
        })
        .collect();
    let len = head.encoded_len()
        + tail.encoded_len()
        + bodies
            .iter()
            .map(|b| 1 + encoded_len_varint(b.len() as u64) + b.len())
            .sum::<usize>();
    let mut buf = Vec::with_capacity(len);
    head.encode_raw(&mut buf);
    for body in &bodies {
        encode_key(VIRTUAL_HOSTS, WireType::LengthDelimited, &mut buf);
        encode_varint(body.len() as u64, &mut buf);
        buf.extend_from_slice(body);
    }
    tail.encode_raw(&mut buf);
    buf
}

/// A virtual host of a sidecar table: built for this table, or a service's default one,
/// shared (`S`: [`vhosts::DefaultHost`], or `Infallible` for a table built whole).
enum Host<S> {
    Built(Box<VirtualHost>),
    Shared(S),
}

/// A service's shared default virtual host, as a table takes it: whole, with its domains.
trait SharedHost {
    fn domains(&self) -> &[String];
}

impl SharedHost for Arc<vhosts::DefaultHost> {
    fn domains(&self) -> &[String] {
        &self.domains
    }
}

impl SharedHost for Infallible {
    fn domains(&self) -> &[String] {
        match *self {}
    }
}

/// The virtual hosts of a sidecar table, in order. A service's default virtual host (no
/// VirtualService route on the port) is `shared`'s, where it gives one and no earlier
/// virtual host of the table took one of its domains.
fn sidecar_hosts<S: SharedHost>(
    key: &SidecarRouteKey,
    shared: impl Fn(&ServiceView) -> Option<S>,
) -> Vec<Host<S>> {
    let SidecarRouteKey {
        port,
        proxy_namespace,
        services,
        virtual_services,
        destinations,
        source,
        catch_all,
        hashes,
        proxyless,
        ..
    } = key;
    let port = *port;
    // VirtualServices by resolved host.
    let mut by_host: BTreeMap<String, Vec<&Arc<Config<VirtualService>>>> = BTreeMap::new();
    for vs in virtual_services {
        for h in &vs.spec.hosts {
            by_host
                .entry(resolve_host(h, &vs.meta.namespace))
                .or_default()
                .push(vs);
        }
    }
    // A service has a handful of domains (name, FQDN, short forms, VIPs).
    let mut seen = FastSet::with_capacity_and_hasher(services.len() * 4, Default::default());
    let mut hosts = Vec::with_capacity(services.len() + 1);
    for svc in services {
        // A VirtualService for the host, else for the most specific wildcard covering it.
        // At sidecars the first VirtualService for a host (in precedence order) wins, as
        // in istiod: VirtualServices merge only on gateways.
        let routes: Vec<Route> = most_specific(&by_host, &svc.hostname)
            .into_iter()
            .flatten()
            .take(1)
            .flat_map(|vs| {
                let env = RouteEnv {
                    ns: &vs.meta.namespace,
                    listener_port: port,
                    destinations,
                    source: source.as_ref(),
                    hashes,
                };
                vs_routes(vs, &env, |m| {
                    m.gateways.is_empty() || m.gateways.iter().any(|g| g == "mesh")
                })
            })
            .collect();
        // A VirtualService with no route on this port (all its matches are for other ports
        // or gateways) does not claim the service here, as in Istio: the default route stays.
        if let Some(shared) = routes.is_empty().then(|| shared(svc)).flatten() {
            if shared.domains().iter().all(|d| !seen.contains(d)) {
                seen.extend(shared.domains().iter().cloned());
                hosts.push(Host::Shared(shared));
                continue;
            }
        }
        let domains = unique_domains(
            service_domains(svc, proxyless.then_some(port), proxy_namespace),
            &mut seen,
        );
        if domains.is_empty() {
            continue;
        }
        hosts.push(Host::Built(Box::new(vhosts::virtual_host(
            svc, port, domains, routes,
        ))));
    }
    if let Some(policy) = catch_all {
        hosts.push(Host::Built(Box::new(catch_all_virtual_host(*policy))));
    }
    hosts
}

/// A sidecar table's fields other than its name and virtual hosts.
fn sidecar_table_fields(key: &SidecarRouteKey) -> RouteConfiguration {
    RouteConfiguration {
        validate_clusters: Some(BoolValue { value: false }),
        max_direct_response_body_size_bytes: Some(UInt32Value {
            value: super::lds::MAX_DIRECT_RESPONSE_BODY_BYTES,
        }),
        ignore_port_in_host_matching: !key.proxyless,
        ..Default::default()
    }
}

/// istiod's catch-all virtual host of sidecar outbound route tables: requests for hosts no
/// service claims go to their original destination (`allow_any`), or get a 502
/// (`block_all`, `REGISTRY_ONLY`).
fn catch_all_virtual_host(policy: OutboundTrafficMode) -> VirtualHost {
    let (name, action) = match policy {
        OutboundTrafficMode::AllowAny => (
            "allow_any",
            Action::Route(RouteAction {
                cluster_specifier: Some(ClusterSpecifier::Cluster(
                    super::cds::PASSTHROUGH_CLUSTER.into(),
                )),
                timeout: Some(pb_duration(std::time::Duration::ZERO)),
                // As istiod: `grpc-timeout` honoured, without a cap.
                #[allow(deprecated)]
                max_grpc_timeout: Some(pb_duration(std::time::Duration::ZERO)),
                ..Default::default()
            }),
        ),
        OutboundTrafficMode::RegistryOnly => (
            "block_all",
            Action::DirectResponse(DirectResponseAction {
                status: 502,
                ..Default::default()
            }),
        ),
    };
    VirtualHost {
        name: name.into(),
        domains: vec!["*".into()],
        routes: vec![Route {
            name: name.into(),
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            action: Some(action),
            ..Default::default()
        }],
        include_request_attempt_count: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_hosts() {
        assert_eq!(
            gateway_host_match("*", "a.com", "ns", "gw"),
            Some("a.com".into())
        );
        assert_eq!(
            gateway_host_match("*.com", "a.com", "ns", "gw"),
            Some("a.com".into())
        );
        assert_eq!(
            gateway_host_match("a.com", "*", "ns", "gw"),
            Some("a.com".into())
        );
        assert_eq!(gateway_host_match("b.com", "a.com", "ns", "gw"), None);
        assert_eq!(gateway_host_match("other/*", "a.com", "ns", "gw"), None);
        assert_eq!(
            gateway_host_match("./*", "a.com", "gw", "gw"),
            Some("a.com".into())
        );
    }
}
