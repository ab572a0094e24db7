//! Proxyless gRPC: what gRPC's own xDS client gets, as istiod's `grpc` generator serves it
//! (node metadata `GENERATOR: grpc`, see [`crate::index::proxy::ProxyKind::Proxyless`]).
//!
//! gRPC names every resource it wants, and rejects a whole response for one field it does
//! not support, so nothing here is wildcard and nothing is Envoy-only:
//!
//! - **LDS**: per requested `<host>:<port>` (a short name such as `echo:7070` is also
//!   looked up as the service in the proxy's namespace, as istiod does), an `api_listener`
//!   whose HTTP connection manager has the fault filter then the router, and takes its
//!   routes over ADS from the table `outbound|<port>||<fqdn>`. Per requested server
//!   listener `xds.istio.io/grpc/lds/inbound/<ip>:<port>` (an xDS-enabled gRPC server) on
//!   one of the node's service ports, a listener on that address whose one filter chain
//!   is plaintext or mutual TLS (PeerAuthentication; gRPC has no PERMISSIVE, so it is
//!   plaintext unless the workload is labelled `security.istio.io/tlsMode: istio`, as
//!   istiod does), with an inline route table of non-forwarding routes, router last.
//!   AuthorizationPolicies become gRPC's RBAC filters (DENY, then ALLOW, as istiod's
//!   `buildRBAC`) from the same translation as Envoy's; a policy that translation would
//!   express with a matcher gRPC lacks (metadata, SNI), or a CUSTOM one, makes the listener
//!   refuse every call (fail closed), never allow more than the policy would.
//! - **RDS**: per requested `outbound|<port>||<host>`, the sidecar virtual host of that one
//!   service (VirtualService routes included), its domains keeping `:port` (gRPC matches the
//!   target's authority), route timeouts also as `max_stream_duration` (the field gRPC
//!   reads), per-route configs of filters gRPC lacks (CORS) left out, and retry policies
//!   without retries dropped (gRPC refuses `num_retries: 0`).
//! - **CDS**: per requested `outbound|<port>|<subset>|<host>`, an EDS cluster with the
//!   DestinationRule's load balancing (round robin, least request, ring hash), circuit
//!   breaking as `max_requests` (all gRPC reads), and TLS only for `ISTIO_MUTUAL`, through
//!   gRPC's certificate providers (`default`, `ROOTCA`) as istio-agent's bootstrap names them.
//! - **EDS**: as for sidecars ([`super::eds`]), every locality weighted (gRPC ignores a
//!   locality without a weight).

use super::authz::{self, AuthzKey, HTTP_RBAC_FILTER};
use super::http_route::FAULT_FILTER;
use super::lds::http_filter;
use super::rds::{self, SidecarRouteKey};
use super::{ads_config_source, mtls, socket_address, Resource};
use crate::index::destination_rule::subset_policy;
use crate::index::endpoints::EndpointIndex;
use crate::index::peer_authentication::{self, MtlsMode};
use crate::index::proxy::Proxy;
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use crate::index::service::{ServiceSource, ServiceView};
use crate::index::tls_mode;
use prost::Message as _;
use shoal_common::model::{AuthorizationAction, ClientTlsMode, SimpleLb, TrafficPolicy};
use shoal_proto::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds,
    cluster::{
        ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbConfig, LbPolicy, RingHashLbConfig,
    },
    CircuitBreakers, Cluster,
};
use shoal_proto::pb::envoy::config::listener::v3::{
    filter, ApiListener, Filter, FilterChain, Listener,
};
use shoal_proto::pb::envoy::config::rbac::v3::{
    permission, principal, rbac::Action as RbacAction, Permission, Policy, Principal, Rbac,
};
use shoal_proto::pb::envoy::config::route::v3::{
    route::Action, route_action::MaxStreamDuration, route_match::PathSpecifier,
    NonForwardingAction, Route, RouteConfiguration, RouteMatch, VirtualHost,
};
use shoal_proto::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use shoal_proto::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use shoal_proto::pb::envoy::extensions::filters::http::router::v3::Router;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    CertificateProviderPluginInstance, CertificateValidationContext, CommonTlsContext,
    DownstreamTlsContext, UpstreamTlsContext,
};
use shoal_proto::pb::google::protobuf::{BoolValue, UInt32Value, UInt64Value};
use shoal_proto::{outbound_cluster_name, parse_outbound_cluster_name, XdsType};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The prefix of a gRPC server's listener name (`xds.istio.io/grpc/lds/inbound/<ip>:<port>`,
/// istio-agent's `server_listener_resource_name_template`).
pub const SERVER_LISTENER_PREFIX: &str = "xds.istio.io/grpc/lds/inbound/";
/// The certificate provider instance istio-agent's gRPC bootstrap defines (file watcher).
const CERT_PROVIDER: &str = "default";
/// The instance's certificate chain and key.
const CERT_NAME: &str = "default";
/// The instance's CA bundle.
const ROOT_CA_NAME: &str = "ROOTCA";
const HCM_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const FAULT_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const HTTP_RBAC_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
/// gRPC's default ring size bounds are Envoy's; istiod's default minimum is 1024.
const DEFAULT_MIN_RING_SIZE: u64 = 1024;

/// Everything one proxyless resource is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GrpcKey {
    /// A client listener (`<host>:<port>`).
    Listener(ApiListenerKey),
    /// A server listener (`xds.istio.io/grpc/lds/inbound/<ip>:<port>`).
    ServerListener(ServerListenerKey),
    /// A route table (`outbound|<port>||<host>`): a sidecar table of one service, made
    /// gRPC's.
    Route(SidecarRouteKey),
    /// A cluster (`outbound|<port>|<subset>|<host>`).
    Cluster(GrpcClusterKey),
}

/// Inputs of a client listener.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ApiListenerKey {
    /// The requested name (`echo:7070`, `echo.default.svc.cluster.local:7070`).
    pub name: String,
    /// The service's address for the proxy's cluster (gRPC ignores it; istiod sets it).
    pub address: String,
    /// The service port.
    pub port: u16,
    /// The route table: `outbound|<port>||<fqdn>`.
    pub route: String,
}

/// Inputs of a server listener.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerListenerKey {
    /// The requested name.
    pub name: String,
    /// The address the server listens on (from the name; gRPC checks that they agree).
    pub host: String,
    /// The port.
    pub port: u16,
    /// Mutual TLS required (through the certificate providers), else plaintext.
    pub mtls: bool,
    /// The enforced AuthorizationPolicies that apply (dry-run and AUDIT ones left out:
    /// they decide nothing).
    pub authz: AuthzKey,
}

/// Inputs of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GrpcClusterKey {
    /// The cluster name, also its EDS service name.
    pub name: String,
    /// The effective traffic policy (subset over rule, port-level settings resolved).
    pub policy: Option<Box<TrafficPolicy>>,
    /// `ISTIO_MUTUAL`: the SANs the server certificate must carry (the rule's, else the
    /// service's workload identities).
    pub istio_mutual: Option<Vec<String>>,
}

/// The keys of `ty` for a proxyless node's requested `names`; `None` for the types served
/// as for sidecars (EDS; SDS, which only gateways get).
pub fn keys(
    ty: XdsType,
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
    endpoints: &EndpointIndex,
    names: &[String],
) -> Option<Vec<GrpcKey>> {
    let keys = match ty {
        XdsType::Listener => {
            let mut keys: Vec<GrpcKey> = listener_keys(proxy, scope, names)
                .into_iter()
                .map(GrpcKey::Listener)
                .collect();
            keys.extend(
                names
                    .iter()
                    .filter_map(|name| server_listener_key(name, proxy, scope, ctx))
                    .map(GrpcKey::ServerListener),
            );
            keys
        }
        XdsType::Route => names
            .iter()
            .filter_map(|name| route_key(name, proxy, scope, ctx))
            .map(GrpcKey::Route)
            .collect(),
        XdsType::Cluster => names
            .iter()
            .filter_map(|name| cluster_key(name, proxy, scope, ctx, endpoints))
            .map(GrpcKey::Cluster)
            .collect(),
        XdsType::Endpoint | XdsType::Secret | XdsType::Address | XdsType::Authorization => {
            return None
        }
    };
    Some(keys)
}

/// Builds one resource from its key alone.
pub fn build(key: &GrpcKey) -> Resource {
    match key {
        GrpcKey::Listener(k) => Resource::new(XdsType::Listener, k.name.clone(), &api_listener(k)),
        GrpcKey::ServerListener(k) => {
            Resource::new(XdsType::Listener, k.name.clone(), &server_listener(k))
        }
        GrpcKey::Route(k) => Resource::new(
            XdsType::Route,
            k.name.clone(),
            &grpc_routes(rds::sidecar_routes(k)),
        ),
        GrpcKey::Cluster(k) => Resource::new(XdsType::Cluster, k.name.clone(), &cluster(k)),
    }
}

// ---------------------------------------------------------------------------------------
// LDS

/// The FQDN a short or namespace-relative host stands for in the proxy's namespace, as
/// istiod's `tryFindFQDN`: `echo` and `echo.<ns>` and `echo.<ns>.svc` name
/// `echo.<ns>.svc.<domain>`.
fn expand_host(host: &str, proxy: &Proxy) -> Option<String> {
    let domain = proxy_domain(proxy);
    if !host.contains('.') {
        return Some(format!("{host}.{}.svc.{domain}", proxy.namespace));
    }
    let ns = &proxy.namespace;
    [format!(".{ns}"), format!(".{ns}.svc")]
        .iter()
        .find_map(|suffix| host.strip_suffix(suffix.as_str()))
        .map(|short| format!("{short}.{ns}.svc.{domain}"))
}

/// The cluster domain, from the node id's last field (`<ns>.svc.<domain>`), as istiod's
/// `DNSDomain`; `cluster.local` when the id does not say.
fn proxy_domain(proxy: &Proxy) -> String {
    let suffix = format!("{}.svc.", proxy.namespace);
    proxy
        .id
        .rsplit('~')
        .next()
        .and_then(|d| d.strip_prefix(suffix.as_str()))
        .filter(|d| !d.is_empty())
        .unwrap_or("cluster.local")
        .to_string()
}

/// The client listeners requested: for each `<host>[:<port>]`, the visible service the host
/// (or its expansion) names, on the port (every port without one), named `<host>:<port>`
/// as gRPC asked.
fn listener_keys(proxy: &Proxy, scope: &ProxyScope, names: &[String]) -> Vec<ApiListenerKey> {
    let mut out = Vec::new();
    for name in names {
        if name.starts_with(SERVER_LISTENER_PREFIX) {
            continue; // a server listener: `server_listener_key`
        }
        let (host, port) = match name.rsplit_once(':') {
            Some((host, port)) => match port.parse::<u16>() {
                Ok(port) => (host, Some(port)),
                Err(_) => continue,
            },
            None => (name.as_str(), None),
        };
        let candidates = std::iter::once(host.to_string()).chain(expand_host(host, proxy));
        let Some(svc) = candidates.filter_map(|h| find_service(scope, &h)).next() else {
            continue;
        };
        let address = svc
            .vip_for(&proxy.cluster_id)
            .unwrap_or("0.0.0.0")
            .to_string();
        for p in svc
            .ports
            .iter()
            .filter(|p| port.is_none_or(|n| n == p.port))
        {
            out.push(ApiListenerKey {
                name: format!("{host}:{}", p.port),
                address: address.clone(),
                port: p.port,
                route: outbound_cluster_name(p.port.into(), "", &svc.hostname),
            });
        }
    }
    out
}

fn find_service<'a>(scope: &'a ProxyScope, host: &str) -> Option<&'a Arc<ServiceView>> {
    scope
        .services
        .binary_search_by(|s| s.hostname.as_str().cmp(host))
        .ok()
        .map(|i| &scope.services[i])
}

fn api_listener(key: &ApiListenerKey) -> Listener {
    // Only what gRPC supports on clients: the fault filter, then the router (last). gRPC
    // rejects the listener for any filter it lacks (CORS) and ignores the HCM's other
    // settings.
    let hcm = HttpConnectionManager {
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_config_source()),
            route_config_name: key.route.clone(),
        })),
        http_filters: vec![
            http_filter(FAULT_FILTER, FAULT_TYPE, &HttpFault::default()),
            http_filter("envoy.filters.http.router", ROUTER_TYPE, &Router::default()),
        ],
        ..Default::default()
    };
    Listener {
        name: key.name.clone(),
        address: Some(socket_address(&key.address, key.port.into())),
        api_listener: Some(ApiListener {
            api_listener: Some(shoal_proto::pack(HCM_TYPE, &hcm)),
        }),
        ..Default::default()
    }
}

/// The key of a requested server listener: the node's own service port (by workload port,
/// as istiod's `ServiceTargets` by target port), else none.
fn server_listener_key(
    name: &str,
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
) -> Option<ServerListenerKey> {
    let addr = name.strip_prefix(SERVER_LISTENER_PREFIX)?;
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().ok()?;
    if host.is_empty() || !scope.inbound.iter().any(|p| p.port == port) {
        tracing::debug!(node = %proxy.id, %name, "no service port of the node for a gRPC server listener");
        return None;
    }
    let mode = peer_authentication::for_workload(ctx, &proxy.namespace, &proxy.labels)
        .for_port(port.into());
    // gRPC cannot serve both on one port (its filter chain matches see no TLS), so
    // PERMISSIVE is plaintext, unless clients will use mTLS anyway (auto mTLS to a
    // workload labelled as having Istio TLS), as istiod decides.
    let labelled_istio = proxy
        .labels
        .get(tls_mode::TLS_MODE_LABEL)
        .is_some_and(|m| m == tls_mode::TLS_MODE_ISTIO);
    let mtls = match mode {
        MtlsMode::Strict => true,
        MtlsMode::Permissive => labelled_istio,
        MtlsMode::Disable => false,
    };
    let mut authz = authz::applicable(ctx, proxy);
    authz.policies.retain(|p| {
        p.spec.action != AuthorizationAction::Audit
            && !p
                .meta
                .annotations
                .get(authz::DRY_RUN_ANNOTATION)
                .is_some_and(|v| matches!(v.as_str(), "true" | "True" | "TRUE" | "t" | "T" | "1"))
    });
    Some(ServerListenerKey {
        name: name.to_string(),
        host: host.to_string(),
        port,
        mtls,
        authz,
    })
}

fn server_listener(key: &ServerListenerKey) -> Listener {
    let mut filters = rbac_filters(key);
    // Last, as gRPC requires.
    filters.push(http_filter(
        "envoy.filters.http.router",
        ROUTER_TYPE,
        &Router::default(),
    ));
    // gRPC servers take routes inline only; a server route never forwards.
    let routes = RouteConfiguration {
        name: "inbound".into(),
        virtual_hosts: vec![VirtualHost {
            name: "inbound".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(Action::NonForwardingAction(NonForwardingAction {})),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let hcm = HttpConnectionManager {
        route_specifier: Some(RouteSpecifier::RouteConfig(routes)),
        http_filters: filters,
        ..Default::default()
    };
    let suffix = if key.mtls { "mtls" } else { "plaintext" };
    let chain = FilterChain {
        name: format!("inbound-{suffix}"),
        filters: vec![Filter {
            name: format!("inbound-hcm{suffix}"),
            config_type: Some(filter::ConfigType::TypedConfig(shoal_proto::pack(
                HCM_TYPE, &hcm,
            ))),
        }],
        transport_socket: key.mtls.then(|| {
            mtls::downstream_socket(&DownstreamTlsContext {
                // gRPC servers cannot match SANs: any client the mesh CA signed.
                common_tls_context: Some(certificate_provider_context(&[])),
                require_client_certificate: Some(BoolValue { value: true }),
                ..Default::default()
            })
        }),
        ..Default::default()
    };
    Listener {
        name: key.name.clone(),
        address: Some(socket_address(&key.host, key.port.into())),
        filter_chains: vec![chain],
        ..Default::default()
    }
}

/// gRPC's RBAC filters for the policies of a server listener: the DENY then the ALLOW
/// filter of the Envoy translation ([`authz::http_filters`], whose configs hold only
/// `rules` once dry-run and AUDIT policies are left out), under names of their own (gRPC
/// refuses two filters of one name). Anything gRPC could not evaluate as Envoy would
/// refuses every call instead.
fn rbac_filters(key: &ServerListenerKey) -> Vec<HttpFilter> {
    if key.authz.policies.is_empty() {
        return Vec::new();
    }
    let deny_all = || {
        vec![http_filter(
            HTTP_RBAC_FILTER,
            HTTP_RBAC_TYPE,
            &deny_all_rbac(),
        )]
    };
    if key
        .authz
        .policies
        .iter()
        .any(|p| p.spec.action == AuthorizationAction::Custom)
    {
        tracing::debug!(listener = %key.name, "CUSTOM authorization on a gRPC server: refusing every call");
        return deny_all();
    }
    let mut out = Vec::new();
    for mut filter in authz::http_filters(&key.authz) {
        let Some(http_filter::ConfigType::TypedConfig(any)) = &filter.config_type else {
            return deny_all();
        };
        let Ok(config) = HttpRbac::decode(any.value.as_slice()) else {
            return deny_all();
        };
        let Some(rules) = config
            .rules
            .as_ref()
            .filter(|_| config.shadow_rules.is_none())
        else {
            return deny_all();
        };
        if let Some(unsupported) = rules.policies.iter().find(|(_, p)| !grpc_evaluates(p)) {
            tracing::debug!(listener = %key.name, policy = %unsupported.0, "authorization rule gRPC cannot evaluate: refusing every call");
            return deny_all();
        }
        filter.name = match RbacAction::try_from(rules.action) {
            Ok(RbacAction::Deny) => format!("{HTTP_RBAC_FILTER}.DENY"),
            Ok(RbacAction::Allow) => HTTP_RBAC_FILTER.to_string(),
            _ => return deny_all(),
        };
        out.push(filter);
    }
    out
}

/// Whether gRPC's RBAC filter (gRFC A41) evaluates every matcher of a policy as Envoy
/// does.
fn grpc_evaluates(policy: &Policy) -> bool {
    fn permission_ok(p: &Permission) -> bool {
        use permission::Rule;
        match &p.rule {
            Some(Rule::AndRules(set) | Rule::OrRules(set)) => set.rules.iter().all(permission_ok),
            Some(Rule::NotRule(inner)) => permission_ok(inner),
            Some(
                Rule::Any(_)
                | Rule::Header(_)
                | Rule::UrlPath(_)
                | Rule::DestinationIp(_)
                | Rule::DestinationPort(_),
            ) => true,
            _ => false,
        }
    }
    fn principal_ok(p: &Principal) -> bool {
        use principal::Identifier;
        match &p.identifier {
            Some(Identifier::AndIds(set) | Identifier::OrIds(set)) => {
                set.ids.iter().all(principal_ok)
            }
            Some(Identifier::NotId(inner)) => principal_ok(inner),
            Some(
                Identifier::Any(_)
                | Identifier::Authenticated(_)
                | Identifier::DirectRemoteIp(_)
                | Identifier::RemoteIp(_)
                | Identifier::Header(_)
                | Identifier::UrlPath(_),
            ) => true,
            _ => false,
        }
    }
    policy.condition.is_none()
        && policy.checked_condition.is_none()
        && policy.permissions.iter().all(permission_ok)
        && policy.principals.iter().all(principal_ok)
}

/// An RBAC config that refuses every call (gRPC supports ALLOW and DENY only).
fn deny_all_rbac() -> HttpRbac {
    let policy = Policy {
        permissions: vec![Permission {
            rule: Some(permission::Rule::Any(true)),
        }],
        principals: vec![Principal {
            identifier: Some(principal::Identifier::Any(true)),
        }],
        ..Default::default()
    };
    HttpRbac {
        rules: Some(Rbac {
            action: RbacAction::Deny as i32,
            policies: std::iter::once(("deny-all-untranslated".to_string(), policy)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// RDS

fn route_key(
    name: &str,
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
) -> Option<SidecarRouteKey> {
    let (port, subset, host) = parse_outbound_cluster_name(name)?;
    if !subset.is_empty() {
        return None;
    }
    Some(rds::sidecar_key(name, Some(host), port, proxy, scope, ctx))
}

/// A sidecar route table made one gRPC accepts and reads.
fn grpc_routes(mut rc: RouteConfiguration) -> RouteConfiguration {
    for vh in &mut rc.virtual_hosts {
        vh.typed_per_filter_config
            .retain(|name, _| name == FAULT_FILTER);
        for route in &mut vh.routes {
            // gRPC rejects per-route configs of filters it does not have (CORS).
            route
                .typed_per_filter_config
                .retain(|name, _| name == FAULT_FILTER);
            let Some(Action::Route(action)) = route.action.as_mut() else {
                continue;
            };
            // gRPC reads the route's deadline from `max_stream_duration` (0: none), never
            // `timeout`, as istiod sets it for proxyless nodes.
            action.max_stream_duration = Some(MaxStreamDuration {
                max_stream_duration: action.timeout,
                ..Default::default()
            });
            // `attempts: 0` (no retries) is a policy gRPC refuses; no policy is the same.
            if action
                .retry_policy
                .as_ref()
                .is_some_and(|p| p.num_retries.is_some_and(|n| n.value == 0))
            {
                action.retry_policy = None;
            }
            // gRPC refuses a zero backoff base interval; without one it uses 25 ms, as
            // Envoy does.
            if let Some(p) = action.retry_policy.as_mut() {
                let zero = |d: &shoal_proto::pb::google::protobuf::Duration| {
                    d.seconds == 0 && d.nanos == 0
                };
                if p.retry_back_off
                    .as_ref()
                    .is_some_and(|b| b.base_interval.as_ref().is_none_or(zero))
                {
                    p.retry_back_off = None;
                }
            }
        }
    }
    rc
}

// ---------------------------------------------------------------------------------------
// CDS

fn cluster_key(
    name: &str,
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
    endpoints: &EndpointIndex,
) -> Option<GrpcClusterKey> {
    let (port, subset, host) = parse_outbound_cluster_name(name)?;
    let svc = find_service(scope, host)?;
    let port = u16::try_from(port).ok()?;
    svc.port(port.into())?;
    let dr = ctx.destination_rule(&proxy.namespace, &proxy.labels, svc);
    // As istiod: only the rule's subsets have clusters.
    let (_, policy) = subset_policy(dr.as_ref().map(|d| &d.spec), subset, port)?;
    // gRPC cannot know whether its server speaks Istio's mTLS (an xDS server, credentials
    // from the certificate providers), so TLS comes only from an explicit `ISTIO_MUTUAL`,
    // never from auto mTLS, as istiod does.
    let istio_mutual = policy
        .as_ref()
        .and_then(|p| p.tls.as_ref())
        .filter(|t| t.mode == ClientTlsMode::IstioMutual)
        .map(|t| {
            if t.subject_alt_names.is_empty() {
                service_identities(ctx, endpoints, svc)
            } else {
                t.subject_alt_names.clone()
            }
        });
    Some(GrpcClusterKey {
        name: name.to_string(),
        policy: policy.map(Box::new),
        istio_mutual,
    })
}

/// The SPIFFE identities of a service's workloads (istiod's `ServiceAccounts`), sorted.
fn service_identities(
    ctx: &PushContext,
    endpoints: &EndpointIndex,
    svc: &ServiceView,
) -> Vec<String> {
    let td = &ctx.mesh.trust_domain;
    let ids: BTreeSet<String> = match &svc.source {
        ServiceSource::Kubernetes => endpoints
            .identities(&svc.hostname)
            .map(|i| {
                i.accounts
                    .iter()
                    .map(|(ns, sa)| mtls::spiffe_id(td, ns, sa))
                    .collect()
            })
            .unwrap_or_default(),
        ServiceSource::ServiceEntry { endpoints, .. } => endpoints
            .iter()
            .filter_map(|e| e.service_account.as_deref().filter(|sa| !sa.is_empty()))
            .map(|sa| mtls::spiffe_id(td, &svc.namespace, sa))
            .collect(),
    };
    ids.into_iter().collect()
}

fn cluster(key: &GrpcClusterKey) -> Cluster {
    let mut c = Cluster {
        name: key.name.clone(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(ads_config_source()),
            service_name: key.name.clone(),
        }),
        ..Default::default()
    };
    let policy = key.policy.as_deref();
    load_balancing(&mut c, policy);
    // gRPC reads only `max_requests` of the circuit breakers (gRFC A32).
    let max_requests = policy
        .and_then(|p| p.connection_pool.as_ref())
        .and_then(|p| p.http.as_ref())
        .and_then(|h| h.http2_max_requests)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0);
    if let Some(value) = max_requests {
        c.circuit_breakers = Some(CircuitBreakers {
            thresholds: vec![Thresholds {
                max_requests: Some(UInt32Value { value }),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    if let Some(sans) = &key.istio_mutual {
        c.transport_socket = Some(mtls::upstream_socket(&UpstreamTlsContext {
            common_tls_context: Some(certificate_provider_context(sans)),
            ..Default::default()
        }));
    }
    c
}

/// istiod's `applyLoadBalancing` for gRPC: round robin (gRPC's default, also for what gRPC
/// lacks: random, passthrough), least request, or ring hash for a consistent hash (the
/// route carries the hash policy; Maglev becomes a ring, gRPC has no Maglev).
fn load_balancing(c: &mut Cluster, policy: Option<&TrafficPolicy>) {
    let Some(lb) = policy.and_then(|p| p.load_balancer.as_ref()) else {
        return;
    };
    if let Some(ch) = &lb.consistent_hash {
        let min = ch
            .ring_hash
            .as_ref()
            .and_then(|r| r.minimum_ring_size)
            .or(ch.minimum_ring_size)
            .filter(|s| *s > 0)
            .unwrap_or(DEFAULT_MIN_RING_SIZE);
        c.lb_policy = LbPolicy::RingHash as i32;
        c.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
            minimum_ring_size: Some(UInt64Value { value: min }),
            ..Default::default()
        }));
        return;
    }
    if matches!(
        lb.simple,
        Some(SimpleLb::LeastRequest | SimpleLb::LeastConn)
    ) {
        c.lb_policy = LbPolicy::LeastRequest as i32;
    }
}

/// TLS with the certificates of gRPC's certificate provider instance `default` (its chain
/// and key `default`, its CA bundle `ROOTCA`), as istio-agent's gRPC bootstrap defines it,
/// checking the peer's SANs (none: any peer the CA signed).
fn certificate_provider_context(sans: &[String]) -> CommonTlsContext {
    let instance = |certificate_name: &str| CertificateProviderPluginInstance {
        instance_name: CERT_PROVIDER.into(),
        certificate_name: certificate_name.into(),
    };
    CommonTlsContext {
        tls_certificate_provider_instance: Some(instance(CERT_NAME)),
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                // gRPC reads `match_subject_alt_names` (deprecated in Envoy), as istiod sets.
                #[allow(deprecated)]
                default_validation_context: Some(CertificateValidationContext {
                    match_subject_alt_names: mtls::exact_sans(sans),
                    ca_certificate_provider_instance: Some(instance(ROOT_CA_NAME)),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}
