//! RDS: route tables for gateway ports (`http.<port>`) and sidecar egress ports (`"<port>"`),
//! built from VirtualServices with Istio's semantics, and a default route for every visible
//! service that no VirtualService covers (sidecars).

use super::{pb_duration, Resource};
use crate::proxy::{Proxy, ProxyKind};
use crate::push_context::{
    exported_to, most_specific, resolve_host, wildcard_covers, Config, PushContext, ServiceSource,
    ServiceView,
};
use crate::scope::{host_entry_matches, ProxyScope};
use shoal_common::model::{
    Destination, Gateway, HttpMatchRequest, HttpRetry, HttpRoute, HttpRouteDestination,
    OutboundTrafficMode, StringMatch, VirtualService,
};
use shoal_proto::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier,
    redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier},
    retry_policy::{retry_host_predicate, RetryHostPredicate},
    route::Action,
    route_action::{ClusterSpecifier, HostRewriteSpecifier},
    route_match::PathSpecifier,
    weighted_cluster::ClusterWeight,
    DirectResponseAction, HeaderMatcher, RedirectAction, RetryPolicy, Route, RouteAction,
    RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster,
};
use shoal_proto::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use shoal_proto::pb::envoy::r#type::matcher::v3::{
    string_matcher::MatchPattern, RegexMatcher, StringMatcher,
};
use shoal_proto::pb::google::protobuf::{BoolValue, UInt32Value};
use shoal_proto::{outbound_cluster_name, XdsType};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Istio's default retry conditions.
const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
/// Istio's default number of retries when a route sets none.
const DEFAULT_RETRIES: u32 = 2;

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
    /// The proxy's Gateways that have a server on the port.
    pub gateways: Vec<Arc<Config<Gateway>>>,
    /// VirtualServices exported to the proxy's namespace and bound to one of `gateways`.
    pub virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// Ports of destination services, by hostname.
    pub destinations: DestinationPorts,
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
    /// The catch-all virtual host of a captured sidecar: `allow_any` to
    /// `PassthroughCluster`, or `block_all` (502) under `REGISTRY_ONLY`.
    pub catch_all: Option<OutboundTrafficMode>,
}

/// Service ports by hostname, for the destinations a set of VirtualServices names.
pub type DestinationPorts = BTreeMap<String, Vec<u16>>;

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
            ProxyKind::Router => {
                let port = name.strip_prefix("http.")?.parse().ok()?;
                Some(RouteKey::Gateway(gateway_key(name, port, proxy, ctx)))
            }
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
        })
        .collect()
}

/// Builds one route table from its key alone.
pub fn build(key: &RouteKey) -> Resource {
    let (name, rc) = match key {
        RouteKey::Gateway(k) => (&k.name, gateway_routes(k)),
        RouteKey::Sidecar(k) => (&k.name, sidecar_routes(k)),
    };
    Resource::new(XdsType::Route, name.clone(), &rc)
}

/// The ports of every service the VirtualServices route to.
fn destination_ports(vss: &[Arc<Config<VirtualService>>], ctx: &PushContext) -> DestinationPorts {
    let mut out = DestinationPorts::new();
    for vs in vss {
        for rule in &vs.spec.http {
            for d in &rule.route {
                let host = resolve_host(&d.destination.host, &vs.meta.namespace);
                if let Some(svc) = ctx.services.get(&host) {
                    out.insert(host, svc.ports.iter().map(|p| p.port).collect());
                }
            }
        }
    }
    out
}

/// How a route's destinations resolve: the namespace of the VirtualService (short hosts),
/// the port traffic arrived on (a destination's default port), and the services' ports.
struct RouteEnv<'a> {
    ns: &'a str,
    listener_port: u32,
    destinations: &'a DestinationPorts,
}

// ---------------------------------------------------------------------------------------
// Gateways

fn gateway_name_matches(reference: &str, vs_ns: &str, gw: &Config<Gateway>) -> bool {
    let (ns, name) = reference.split_once('/').unwrap_or((vs_ns, reference));
    ns == gw.meta.namespace && name == gw.meta.name
}

/// Whether a VirtualService host is admitted by a gateway server host (`ns/host` or `host`,
/// with `*` wildcards). Returns the host the virtual host is built for: the more specific.
fn gateway_host_match(
    server_host: &str,
    vs_host: &str,
    vs_ns: &str,
    gw_ns: &str,
) -> Option<String> {
    let (ns, host) = server_host.split_once('/').unwrap_or(("*", server_host));
    let ns_ok = match ns {
        "*" => true,
        "." => vs_ns == gw_ns,
        other => other == vs_ns,
    };
    if !ns_ok {
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

fn gateway_key(name: &str, port: u32, proxy: &Proxy, ctx: &PushContext) -> GatewayRouteKey {
    let gateways: Vec<Arc<Config<Gateway>>> = ctx
        .gateways_for(&proxy.labels)
        .into_iter()
        .filter(|gw| gw.spec.servers.iter().any(|s| s.port.number == port))
        .cloned()
        .collect();
    let virtual_services: Vec<_> = ctx
        .virtual_services
        .iter()
        .filter(|vs| exported_to(&vs.spec.export_to, &vs.meta.namespace, &proxy.namespace))
        .filter(|vs| {
            gateways.iter().any(|gw| {
                vs.spec
                    .gateways
                    .iter()
                    .any(|r| gateway_name_matches(r, &vs.meta.namespace, gw))
            })
        })
        .cloned()
        .collect();
    let destinations = destination_ports(&virtual_services, ctx);
    GatewayRouteKey {
        name: name.to_string(),
        port,
        gateways,
        virtual_services,
        destinations,
    }
}

fn gateway_routes(key: &GatewayRouteKey) -> RouteConfiguration {
    let GatewayRouteKey {
        name,
        port,
        gateways,
        virtual_services,
        destinations,
    } = key;
    let port = *port;
    // Virtual host → routes, merged across VirtualServices in precedence order, as Istio
    // merges VirtualServices that share a host on a gateway.
    let mut vhosts: BTreeMap<String, Vec<Route>> = BTreeMap::new();
    for vs in virtual_services {
        let bound: Vec<_> = gateways
            .iter()
            .filter(|gw| {
                vs.spec
                    .gateways
                    .iter()
                    .any(|r| gateway_name_matches(r, &vs.meta.namespace, gw))
            })
            .collect();
        if bound.is_empty() {
            continue;
        }
        let mut hosts = BTreeSet::new();
        for gw in &bound {
            for server in gw.spec.servers.iter().filter(|s| s.port.number == port) {
                for sh in &server.hosts {
                    for vh in &vs.spec.hosts {
                        if let Some(h) =
                            gateway_host_match(sh, vh, &vs.meta.namespace, &gw.meta.namespace)
                        {
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
        };
        let routes = vs_routes(vs, &env, |m| {
            m.gateways.is_empty()
                || m.gateways.iter().any(|g| {
                    gateway_names.iter().any(|n| {
                        let (ns, name) = g.split_once('/').unwrap_or((&vs.meta.namespace, g));
                        n == &format!("{ns}/{name}")
                    })
                })
        });
        for h in hosts {
            vhosts.entry(h).or_default().extend(routes.iter().cloned());
        }
    }
    let mut seen = BTreeSet::new();
    let virtual_hosts = vhosts
        .into_iter()
        .filter_map(|(host, routes)| {
            let domains: Vec<String> = if host == "*" {
                vec!["*".into()]
            } else {
                vec![host.clone(), format!("{host}:{port}")]
            };
            let domains = unique_domains(domains, &mut seen);
            (!domains.is_empty()).then(|| VirtualHost {
                name: format!("{host}:{port}"),
                domains,
                routes,
                ..Default::default()
            })
        })
        .collect();
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// Sidecars

fn sidecar_key(
    name: &str,
    only_host: Option<&str>,
    port: u32,
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
) -> SidecarRouteKey {
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
            svc.port(port).is_some_and(|p| p.protocol.is_http())
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
        virtual_services,
        destinations,
        catch_all: captured.then_some(scope.outbound_policy),
    }
}

fn sidecar_routes(key: &SidecarRouteKey) -> RouteConfiguration {
    let SidecarRouteKey {
        name,
        port,
        proxy_namespace,
        services,
        virtual_services,
        destinations,
        catch_all,
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
    let mut seen = BTreeSet::new();
    let mut virtual_hosts = Vec::new();
    for svc in services {
        // A VirtualService for the host, else for the most specific wildcard covering it.
        let mut routes: Vec<Route> = most_specific(&by_host, &svc.hostname)
            .into_iter()
            .flatten()
            .flat_map(|vs| {
                let env = RouteEnv {
                    ns: &vs.meta.namespace,
                    listener_port: port,
                    destinations,
                };
                vs_routes(vs, &env, |m| {
                    m.gateways.is_empty() || m.gateways.iter().any(|g| g == "mesh")
                })
            })
            .collect();
        // A VirtualService with no route on this port (all its matches are for other ports
        // or gateways) does not claim the service here, as in Istio: the default route stays.
        if routes.is_empty() {
            routes.push(default_route(&outbound_cluster_name(
                port,
                "",
                &svc.hostname,
            )));
        }
        let domains = unique_domains(service_domains(svc, port, proxy_namespace), &mut seen);
        if domains.is_empty() {
            continue;
        }
        virtual_hosts.push(VirtualHost {
            name: format!("{}:{port}", svc.hostname),
            domains,
            routes,
            ..Default::default()
        });
    }
    if let Some(policy) = catch_all {
        virtual_hosts.push(catch_all_virtual_host(*policy));
    }
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
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

/// The domains a sidecar reaches a service by, as Istio builds them: the FQDN, `name.ns`
/// and `name.ns.svc` (Kubernetes), the short name (same namespace only), the VIPs — each
/// also with `:port`.
fn service_domains(svc: &ServiceView, port: u32, proxy_ns: &str) -> Vec<String> {
    let mut names = vec![svc.hostname.clone()];
    if svc.source == ServiceSource::Kubernetes {
        if svc.namespace == proxy_ns {
            names.push(svc.name.clone());
        }
        names.push(format!("{}.{}", svc.name, svc.namespace));
        names.push(format!("{}.{}.svc", svc.name, svc.namespace));
    }
    names.extend(svc.vips.iter().cloned());
    names
        .into_iter()
        .flat_map(|n| [format!("{n}:{port}"), n])
        .collect()
}

/// Drops domains already used by an earlier virtual host: Envoy rejects a route table in
/// which two virtual hosts share a domain.
fn unique_domains(domains: Vec<String>, seen: &mut BTreeSet<String>) -> Vec<String> {
    let mut out: Vec<String> = domains
        .into_iter()
        .filter(|d| seen.insert(d.clone()))
        .collect();
    out.sort();
    out
}

fn default_route(cluster: &str) -> Route {
    Route {
        name: "default".into(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
            timeout: Some(pb_duration(std::time::Duration::ZERO)),
            retry_policy: Some(default_retry_policy()),
            ..Default::default()
        })),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// VirtualService → Envoy routes

/// Converts a VirtualService's HTTP rules; `applies` filters match blocks by their
/// `gateways` field. A rule whose every match block is filtered out yields no route.
fn vs_routes(
    vs: &Config<VirtualService>,
    env: &RouteEnv<'_>,
    applies: impl Fn(&HttpMatchRequest) -> bool,
) -> Vec<Route> {
    let mut out = Vec::new();
    for rule in &vs.spec.http {
        let action = action(rule, env);
        let name = rule.name.clone().unwrap_or_default();
        if rule.matches.is_empty() {
            out.push(route(
                &name,
                RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                },
                action.clone(),
            ));
            continue;
        }
        for m in &rule.matches {
            if !applies(m) || m.port.is_some_and(|p| p != env.listener_port) {
                continue;
            }
            out.push(route(&name, route_match(m), action.clone()));
        }
    }
    out
}

fn route(name: &str, m: RouteMatch, action: Action) -> Route {
    Route {
        name: name.to_string(),
        r#match: Some(m),
        action: Some(action),
        ..Default::default()
    }
}

fn route_match(m: &HttpMatchRequest) -> RouteMatch {
    let path_specifier = Some(match &m.uri {
        None => PathSpecifier::Prefix("/".into()),
        Some(StringMatch::Exact(p)) => PathSpecifier::Path(p.clone()),
        Some(StringMatch::Prefix(p)) => PathSpecifier::Prefix(p.clone()),
        Some(StringMatch::Regex(r)) => PathSpecifier::SafeRegex(regex(r)),
    });
    let mut headers: Vec<HeaderMatcher> = m
        .headers
        .iter()
        .map(|(name, sm)| header_matcher(name, sm))
        .collect();
    if let Some(sm) = &m.method {
        headers.push(header_matcher(":method", sm));
    }
    if let Some(sm) = &m.authority {
        headers.push(header_matcher(":authority", sm));
    }
    RouteMatch {
        path_specifier,
        headers,
        case_sensitive: m.ignore_uri_case.then_some(BoolValue { value: false }),
        ..Default::default()
    }
}

fn regex(r: &str) -> RegexMatcher {
    RegexMatcher {
        regex: r.to_string(),
        ..Default::default()
    }
}

fn header_matcher(name: &str, sm: &StringMatch) -> HeaderMatcher {
    let pattern = match sm {
        StringMatch::Exact(s) => MatchPattern::Exact(s.clone()),
        StringMatch::Prefix(s) => MatchPattern::Prefix(s.clone()),
        StringMatch::Regex(r) => MatchPattern::SafeRegex(regex(r)),
    };
    HeaderMatcher {
        name: name.to_ascii_lowercase(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(pattern),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn action(rule: &HttpRoute, env: &RouteEnv<'_>) -> Action {
    if let Some(r) = &rule.redirect {
        return Action::Redirect(RedirectAction {
            host_redirect: r.authority.clone().unwrap_or_default(),
            port_redirect: r.port.unwrap_or_default(),
            path_rewrite_specifier: r.uri.clone().map(PathRewriteSpecifier::PathRedirect),
            scheme_rewrite_specifier: r.scheme.clone().map(SchemeRewriteSpecifier::SchemeRedirect),
            response_code: redirect_code(r.redirect_code.unwrap_or(301)) as i32,
            ..Default::default()
        });
    }
    let mut ra = RouteAction {
        cluster_specifier: Some(cluster_specifier(&rule.route, env)),
        timeout: Some(pb_duration(
            rule.timeout.map(|t| t.get()).unwrap_or_default(),
        )),
        retry_policy: match &rule.retries {
            None => Some(default_retry_policy()),
            Some(r) if r.attempts == 0 => None,
            Some(r) => Some(retry_policy(r)),
        },
        ..Default::default()
    };
    if let Some(rw) = &rule.rewrite {
        if let Some(uri) = &rw.uri {
            ra.prefix_rewrite = uri.clone();
        }
        if let Some(auth) = &rw.authority {
            ra.host_rewrite_specifier =
                Some(HostRewriteSpecifier::HostRewriteLiteral(auth.clone()));
        }
    }
    Action::Route(ra)
}

/// Istio's default retry policy: 2 retries on connection errors and 503, preferring hosts
/// not tried yet.
fn default_retry_policy() -> RetryPolicy {
    RetryPolicy {
        retry_on: DEFAULT_RETRY_ON.into(),
        num_retries: Some(UInt32Value {
            value: DEFAULT_RETRIES,
        }),
        retriable_status_codes: vec![503],
        retry_host_predicate: vec![RetryHostPredicate {
            name: "envoy.retry_host_predicates.previous_hosts".into(),
            config_type: Some(retry_host_predicate::ConfigType::TypedConfig(
                shoal_proto::pack(
                    "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate",
                    &PreviousHostsPredicate {},
                ),
            )),
        }],
        host_selection_retry_max_attempts: 5,
        ..Default::default()
    }
}

/// A VirtualService retry policy: Istio's default with the given fields overridden. Numbers
/// in `retryOn` are status codes (Envoy's `retry_on` accepts only condition names).
fn retry_policy(r: &HttpRetry) -> RetryPolicy {
    let mut p = default_retry_policy();
    p.num_retries = Some(UInt32Value { value: r.attempts });
    if let Some(on) = r.retry_on.as_deref().filter(|s| !s.trim().is_empty()) {
        let (codes, conditions): (Vec<&str>, Vec<&str>) = on
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .partition(|s| s.parse::<u16>().is_ok_and(|c| (100..600).contains(&c)));
        p.retriable_status_codes = codes.iter().filter_map(|c| c.parse().ok()).collect();
        p.retry_on = conditions.join(",");
        if !p.retriable_status_codes.is_empty() && !conditions.contains(&"retriable-status-codes") {
            if !p.retry_on.is_empty() {
                p.retry_on.push(',');
            }
            p.retry_on.push_str("retriable-status-codes");
        }
    }
    if let Some(t) = r.per_try_timeout {
        p.per_try_timeout = Some(pb_duration(t.get()));
    }
    p
}

fn redirect_code(code: u32) -> RedirectResponseCode {
    match code {
        302 => RedirectResponseCode::Found,
        303 => RedirectResponseCode::SeeOther,
        307 => RedirectResponseCode::TemporaryRedirect,
        308 => RedirectResponseCode::PermanentRedirect,
        _ => RedirectResponseCode::MovedPermanently,
    }
}

/// The cluster of one destination: `outbound|<port>|<subset>|<fqdn>`. Without an explicit
/// port: the service's only port, else the port traffic arrived on.
fn destination_cluster(d: &Destination, env: &RouteEnv<'_>) -> String {
    let host = resolve_host(&d.host, env.ns);
    let port =
        d.port
            .as_ref()
            .map(|p| p.number)
            .unwrap_or_else(|| match env.destinations.get(&host) {
                Some(ports) if ports.len() == 1 => ports[0].into(),
                _ => env.listener_port,
            });
    outbound_cluster_name(port, d.subset.as_deref().unwrap_or_default(), &host)
}

fn cluster_specifier(dests: &[HttpRouteDestination], env: &RouteEnv<'_>) -> ClusterSpecifier {
    let weighted: Vec<(String, u32)> = if dests.iter().all(|d| d.weight.is_none()) {
        // Unweighted destinations split evenly; the first takes the remainder.
        let n = dests.len().max(1) as u32;
        dests
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    destination_cluster(&d.destination, env),
                    100 / n + u32::from(i == 0) * (100 % n),
                )
            })
            .collect()
    } else {
        dests
            .iter()
            .filter(|d| d.weight.unwrap_or(0) > 0)
            .map(|d| {
                (
                    destination_cluster(&d.destination, env),
                    d.weight.unwrap_or(0),
                )
            })
            .collect()
    };
    match weighted.as_slice() {
        [] => ClusterSpecifier::Cluster(super::cds::BLACKHOLE_CLUSTER.into()),
        [(single, _)] => ClusterSpecifier::Cluster(single.clone()),
        many => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: many
                .iter()
                .map(|(name, w)| ClusterWeight {
                    name: name.clone(),
                    weight: Some(UInt32Value { value: *w }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
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
