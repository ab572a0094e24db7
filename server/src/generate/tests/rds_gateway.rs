//! RDS for gateways (`http.<port>`): binding, host intersection, merging, and the
//! translation of VirtualService HTTP rules.

use crate::testutil::*;
use shoal_proto::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier,
    redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier},
    route::Action,
    route_action::{ClusterSpecifier, HostRewriteSpecifier},
    route_match::PathSpecifier,
    RedirectAction, Route, RouteAction, RouteConfiguration, VirtualHost,
};
use shoal_proto::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use shoal_proto::XdsType;

pub(super) fn ingress() -> crate::index::proxy::Proxy {
    router_proxy("istio-system", &[("istio", "ingressgateway")])
}

/// The route table `name` generated for `proxy`.
pub(super) fn rds(
    mesh: &Mesh,
    proxy: &crate::index::proxy::Proxy,
    name: &str,
) -> RouteConfiguration {
    let mut m = route_configs(&gen(XdsType::Route, proxy, &mesh.snapshot(), &[name]));
    let rc = m.remove(name).expect("requested route table");
    assert_eq!(rc.name, name);
    assert_eq!(rc.validate_clusters.map(|b| b.value), Some(false));
    rc
}

pub(super) fn vhost<'a>(rc: &'a RouteConfiguration, name: &str) -> &'a VirtualHost {
    rc.virtual_hosts
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| {
            let names: Vec<_> = rc.virtual_hosts.iter().map(|v| &v.name).collect();
            panic!("no virtual host {name} in {names:?}")
        })
}

pub(super) fn vhost_names(rc: &RouteConfiguration) -> Vec<&str> {
    rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect()
}

pub(super) fn route_action(r: &Route) -> &RouteAction {
    match &r.action {
        Some(Action::Route(ra)) => ra,
        other => panic!("route {}: expected a route action, got {other:?}", r.name),
    }
}

/// The single cluster a route forwards to.
pub(super) fn cluster_of(r: &Route) -> &str {
    match &route_action(r).cluster_specifier {
        Some(ClusterSpecifier::Cluster(c)) => c,
        other => panic!("route {}: expected one cluster, got {other:?}", r.name),
    }
}

fn path(r: &Route) -> &PathSpecifier {
    r.r#match
        .as_ref()
        .and_then(|m| m.path_specifier.as_ref())
        .expect("path specifier")
}

fn gateway_mesh() -> Mesh {
    Mesh::new()
        .with_service(service("default", "web", &[("http", 80)]))
        .with_service(service("default", "api", &[("http", 8080), ("grpc", 9090)]))
        .with_config(gateway(
            "istio-system",
            "public",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*.example.com", "default/web.internal"]
"#,
        ))
}

fn vs(ns: &str, name: &str, gateways: &str, hosts: &str, host: &str) -> crate::testutil::Mesh {
    Mesh::new().with_config(virtual_service(
        ns,
        name,
        &format!(
            "hosts: {hosts}\ngateways: {gateways}\nhttp: [{{route: [{{destination: {{host: {host}}}}}]}}]"
        ),
    ))
}

fn merged(base: Mesh, extra: Mesh) -> Mesh {
    let mut m = base;
    for obj in extra.state.config.into_values() {
        m.add_config((*obj).clone());
    }
    m
}

#[test]
fn virtual_services_bind_by_name_in_their_namespace_or_by_ns_name() {
    let mesh = merged(
        merged(
            merged(
                gateway_mesh(),
                vs(
                    "istio-system",
                    "local-ref",
                    "[public]",
                    "[a.example.com]",
                    "web.default.svc.cluster.local",
                ),
            ),
            vs(
                "default",
                "qualified-ref",
                "[istio-system/public]",
                "[b.example.com]",
                "web",
            ),
        ),
        // `public` from default means default/public, which does not exist.
        vs("default", "wrong-ns", "[public]", "[c.example.com]", "web"),
    );
    let mesh = merged(
        mesh,
        vs("default", "mesh-only", "[mesh]", "[d.example.com]", "web"),
    );
    let rc = rds(&mesh, &ingress(), "http.80");
    assert_eq!(vhost_names(&rc), ["a.example.com:80", "b.example.com:80"]);
    let b = vhost(&rc, "b.example.com:80");
    // istiod ignores the port in gateway host matching: the host is the only domain.
    assert_eq!(b.domains, ["b.example.com"]);
    // Short destination hosts resolve in the VirtualService's namespace.
    assert_eq!(
        cluster_of(&b.routes[0]),
        "outbound|80||web.default.svc.cluster.local"
    );
}

#[test]
fn gateway_proxies_not_selected_get_no_virtual_hosts() {
    let mesh = merged(
        gateway_mesh(),
        vs(
            "default",
            "bound",
            "[istio-system/public]",
            "[a.example.com]",
            "web",
        ),
    );
    let other = router_proxy("istio-system", &[("istio", "other")]);
    assert!(rds(&mesh, &other, "http.80").virtual_hosts.is_empty());
    // Nor on a port the Gateway has no server on.
    assert!(rds(&mesh, &ingress(), "http.8080").virtual_hosts.is_empty());
}

#[test]
fn hosts_intersect_with_server_hosts() {
    let mesh = merged(
        merged(
            gateway_mesh(),
            vs(
                "default",
                "many",
                "[istio-system/public]",
                "[a.example.com, x.other.com, web.internal, \"*.sub.example.com\"]",
                "web",
            ),
        ),
        // `default/web.internal` admits only VirtualServices in default.
        vs(
            "other",
            "foreign",
            "[istio-system/public]",
            "[web.internal, z.example.com]",
            "web.default.svc.cluster.local",
        ),
    );
    let rc = rds(&mesh, &ingress(), "http.80");
    assert_eq!(
        vhost_names(&rc),
        [
            "*.sub.example.com:80",
            "a.example.com:80",
            "web.internal:80",
            "z.example.com:80",
        ]
    );
    assert_eq!(
        vhost(&rc, "*.sub.example.com:80").domains,
        ["*.sub.example.com"]
    );
}

#[test]
fn wildcard_virtual_service_hosts_take_the_server_hosts() {
    let mesh = Mesh::new()
        .with_service(service("default", "web", &[("http", 80)]))
        .with_config(gateway(
            "istio-system",
            "public",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["a.example.com", "./b.example.com"]
- port: {number: 81, name: http, protocol: HTTP}
  hosts: ["*"]
"#,
        ))
        .with_config(virtual_service(
            "istio-system",
            "catch-all",
            r#"
hosts: ["*"]
gateways: [public]
http: [{route: [{destination: {host: web.default.svc.cluster.local}}]}]
"#,
        ));
    let rc = rds(&mesh, &ingress(), "http.80");
    assert_eq!(vhost_names(&rc), ["a.example.com:80", "b.example.com:80"]);
    let rc = rds(&mesh, &ingress(), "http.81");
    assert_eq!(vhost_names(&rc), ["*:81"]);
    assert_eq!(rc.virtual_hosts[0].domains, ["*"]);
}

#[test]
fn virtual_services_sharing_a_host_merge_in_order() {
    let mesh = gateway_mesh()
        .with_config(virtual_service(
            "default",
            "b-second",
            r#"
hosts: [a.example.com]
gateways: [istio-system/public]
http:
- name: from-b
  route: [{destination: {host: web}}]
"#,
        ))
        .with_config(virtual_service(
            "default",
            "a-first",
            r#"
hosts: [a.example.com]
gateways: [istio-system/public]
http:
- name: from-a
  match: [{uri: {prefix: /api}}]
  route: [{destination: {host: api, port: {number: 8080}}}]
"#,
        ));
    let rc = rds(&mesh, &ingress(), "http.80");
    let names: Vec<&str> = vhost(&rc, "a.example.com:80")
        .routes
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["from-a", "from-b"]);
}

#[test]
fn virtual_service_export_to_applies_to_gateways() {
    let mesh = gateway_mesh()
        .with_config(virtual_service(
            "default",
            "private",
            r#"
hosts: [a.example.com]
gateways: [istio-system/public]
exportTo: ["."]
http: [{route: [{destination: {host: web}}]}]
"#,
        ))
        .with_config(virtual_service(
            "default",
            "to-gateway-ns",
            r#"
hosts: [b.example.com]
gateways: [istio-system/public]
exportTo: [istio-system]
http: [{route: [{destination: {host: web}}]}]
"#,
        ));
    // The gateway proxy runs in istio-system: only what is exported there applies.
    let rc = rds(&mesh, &ingress(), "http.80");
    assert_eq!(vhost_names(&rc), ["b.example.com:80"]);
}

pub(super) fn rules_mesh(http: &str) -> Mesh {
    gateway_mesh().with_config(virtual_service(
        "default",
        "rules",
        &format!("hosts: [a.example.com]\ngateways: [istio-system/public]\nhttp:\n{http}"),
    ))
}

pub(super) fn routes(mesh: &Mesh) -> Vec<Route> {
    let rc = rds(mesh, &ingress(), "http.80");
    vhost(&rc, "a.example.com:80").routes.clone()
}

#[test]
fn uri_matches() {
    let rs = routes(&rules_mesh(
        r#"
- name: m
  match:
  - uri: {exact: /exact}
  - uri: {prefix: /prefix}
  - uri: {regex: "/re/[0-9]+"}
  - uri: {prefix: /Case}
    ignoreUriCase: true
  route: [{destination: {host: web}}]
- name: catch-all
  route: [{destination: {host: web}}]
"#,
    ));
    assert_eq!(rs.len(), 5);
    assert_eq!(path(&rs[0]), &PathSpecifier::Path("/exact".into()));
    assert_eq!(path(&rs[1]), &PathSpecifier::Prefix("/prefix".into()));
    match path(&rs[2]) {
        PathSpecifier::SafeRegex(r) => assert_eq!(r.regex, "/re/[0-9]+"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rs[3]
            .r#match
            .as_ref()
            .unwrap()
            .case_sensitive
            .map(|b| b.value),
        Some(false)
    );
    assert_eq!(rs[0].r#match.as_ref().unwrap().case_sensitive, None);
    assert_eq!(path(&rs[4]), &PathSpecifier::Prefix("/".into()));
    assert_eq!(rs[4].name, "catch-all");
}

#[test]
fn header_and_method_matches() {
    let rs = routes(&rules_mesh(
        r#"
- match:
  - headers:
      x-exact: {exact: "yes"}
      X-Prefix: {prefix: pre}
      x-regex: {regex: "v[12]"}
    method: {exact: POST}
  route: [{destination: {host: web}}]
"#,
    ));
    let m = rs[0].r#match.as_ref().unwrap();
    let headers: Vec<(String, MatchPattern)> = m
        .headers
        .iter()
        .map(|h| match &h.header_match_specifier {
            Some(HeaderMatchSpecifier::StringMatch(sm)) => {
                (h.name.clone(), sm.match_pattern.clone().unwrap())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(headers.len(), 4);
    assert_eq!(
        headers[0],
        ("x-prefix".into(), MatchPattern::Prefix("pre".into()))
    );
    assert_eq!(
        headers[1],
        ("x-exact".into(), MatchPattern::Exact("yes".into()))
    );
    match &headers[2] {
        (name, MatchPattern::SafeRegex(r)) => {
            assert_eq!(name, "x-regex");
            assert_eq!(r.regex, "v[12]");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        headers[3],
        (":method".into(), MatchPattern::Exact("POST".into()))
    );
}

#[test]
fn destinations_weights_subsets_and_ports() {
    let rs = routes(&rules_mesh(
        r#"
- name: weighted
  match: [{uri: {prefix: /w}}]
  route:
  - destination: {host: web, subset: v1}
    weight: 90
  - destination: {host: web, subset: v2}
    weight: 10
  - destination: {host: web, subset: v3}
    weight: 0
- name: any-total
  match: [{uri: {prefix: /e}}]
  route:
  - destination: {host: web}
    weight: 2
  - destination: {host: api.default.svc.cluster.local, port: {number: 9090}}
    weight: 1
  - destination: {host: external.example.com}
    weight: 1
- name: multi-port-default
  match: [{uri: {prefix: /m}}]
  route: [{destination: {host: api}}]
- name: nowhere
  match: [{uri: {prefix: /n}}]
  route:
  - destination: {host: web}
    weight: 0
"#,
    ));
    let weights = |r: &Route| -> Vec<(String, u32)> {
        match &route_action(r).cluster_specifier {
            Some(ClusterSpecifier::WeightedClusters(wc)) => wc
                .clusters
                .iter()
                .map(|c| (c.name.clone(), c.weight.as_ref().unwrap().value))
                .collect(),
            other => panic!("{other:?}"),
        }
    };
    let web = "web.default.svc.cluster.local";
    assert_eq!(
        weights(&rs[0]),
        [
            (format!("outbound|80|v1|{web}"), 90),
            (format!("outbound|80|v2|{web}"), 10),
        ]
    );
    assert_eq!(
        weights(&rs[1]),
        [
            // Any positive total, as in Istio (Envoy splits by the sum).
            (format!("outbound|80||{web}"), 2),
            (
                "outbound|9090||api.default.svc.cluster.local".to_string(),
                1
            ),
            // Unknown hosts keep the listener port.
            ("outbound|80||external.example.com".to_string(), 1),
        ]
    );
    // A multi-port service without a destination port: the port traffic arrived on.
    assert_eq!(
        cluster_of(&rs[2]),
        "outbound|80||api.default.svc.cluster.local"
    );
    // A single destination takes all traffic whatever its weight, as in istiod.
    assert_eq!(cluster_of(&rs[3]), format!("outbound|80||{web}"));
}

#[test]
fn redirects() {
    let rs = routes(&rules_mesh(
        r#"
- match: [{uri: {prefix: /old}}]
  redirect: {uri: /new, authority: new.example.com, port: 8443, scheme: https, redirectCode: 302}
- match: [{uri: {prefix: /moved}}]
  redirect: {uri: /here}
- match: [{uri: {prefix: /marked}}]
  redirect: {uri: "%PREFIX()%/x"}
"#,
    ));
    let redirect = |r: &Route| -> RedirectAction {
        match &r.action {
            Some(Action::Redirect(ra)) => ra.clone(),
            other => panic!("{other:?}"),
        }
    };
    let r = redirect(&rs[0]);
    assert_eq!(r.host_redirect, "new.example.com");
    assert_eq!(r.port_redirect, 8443);
    assert_eq!(
        r.path_rewrite_specifier,
        Some(PathRewriteSpecifier::PathRedirect("/new".into()))
    );
    assert_eq!(
        r.scheme_rewrite_specifier,
        Some(SchemeRewriteSpecifier::SchemeRedirect("https".into()))
    );
    assert_eq!(r.response_code, RedirectResponseCode::Found as i32);
    let r = redirect(&rs[1]);
    assert_eq!(
        r.response_code,
        RedirectResponseCode::MovedPermanently as i32
    );
    assert_eq!(r.host_redirect, "");
    // The Gateway API prefix marker means nothing in a VirtualService's own redirect.
    assert_eq!(
        redirect(&rs[2]).path_rewrite_specifier,
        Some(PathRewriteSpecifier::PathRedirect("%PREFIX()%/x".into()))
    );
}

#[test]
fn rewrites_and_timeouts() {
    let rs = routes(&rules_mesh(
        r#"
- match: [{uri: {prefix: /v1/api}}]
  rewrite: {uri: /api, authority: api.internal}
  timeout: 1.5s
  route: [{destination: {host: api, port: {number: 8080}}}]
- route: [{destination: {host: web}}]
"#,
    ));
    let ra = route_action(&rs[0]);
    assert_eq!(ra.prefix_rewrite, "/api");
    assert_eq!(
        ra.host_rewrite_specifier,
        Some(HostRewriteSpecifier::HostRewriteLiteral(
            "api.internal".into()
        ))
    );
    let t = ra.timeout.as_ref().unwrap();
    assert_eq!((t.seconds, t.nanos), (1, 500_000_000));
    // No timeout: disabled (0), as in Istio.
    let t = route_action(&rs[1]).timeout.as_ref().unwrap();
    assert_eq!((t.seconds, t.nanos), (0, 0));
    assert_eq!(route_action(&rs[1]).prefix_rewrite, "");
    // istiod's `setTimeout`: a gRPC client's `grpc-timeout` is honoured up to the route's
    // timeout, uncapped without one.
    #[allow(deprecated)]
    let grpc = |i: usize| {
        route_action(&rs[i])
            .max_grpc_timeout
            .map(|d| (d.seconds, d.nanos))
    };
    assert_eq!(grpc(0), Some((1, 500_000_000)));
    assert_eq!(grpc(1), Some((0, 0)));
}

#[test]
fn retries() {
    let rs = routes(&rules_mesh(
        r#"
- match: [{uri: {prefix: /default}}]
  route: [{destination: {host: web}}]
- match: [{uri: {prefix: /off}}]
  retries: {attempts: 0}
  route: [{destination: {host: web}}]
- match: [{uri: {prefix: /custom}}]
  retries: {attempts: 5, perTryTimeout: 2s, retryOn: "gateway-error,connect-failure"}
  route: [{destination: {host: web}}]
- match: [{uri: {prefix: /codes}}]
  retries: {attempts: 3, retryOn: "5xx,429,503"}
  route: [{destination: {host: web}}]
- match: [{uri: {prefix: /attempts-only}}]
  retries: {attempts: 4}
  route: [{destination: {host: web}}]
"#,
    ));
    let default = route_action(&rs[0]).retry_policy.as_ref().unwrap();
    assert_eq!(
        default.retry_on,
        "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    );
    assert_eq!(default.num_retries.as_ref().unwrap().value, 2);
    // Current Istio: no status code is retried by default (a 503 is not).
    assert!(default.retriable_status_codes.is_empty());
    assert_eq!(default.host_selection_retry_max_attempts, 5);
    assert_eq!(
        default
            .retry_host_predicate
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        ["envoy.retry_host_predicates.previous_hosts"]
    );
    assert!(route_action(&rs[1]).retry_policy.is_none());
    let custom = route_action(&rs[2]).retry_policy.as_ref().unwrap();
    assert_eq!(custom.retry_on, "gateway-error,connect-failure");
    assert_eq!(custom.num_retries.as_ref().unwrap().value, 5);
    assert_eq!(custom.per_try_timeout.as_ref().unwrap().seconds, 2);
    assert!(custom.retriable_status_codes.is_empty());
    // Status codes in retryOn become retriable status codes, as Istio parses them.
    let codes = route_action(&rs[3]).retry_policy.as_ref().unwrap();
    assert_eq!(codes.retry_on, "5xx,retriable-status-codes");
    assert_eq!(codes.retriable_status_codes, [429, 503]);
    // Only attempts: the default conditions.
    let attempts = route_action(&rs[4]).retry_policy.as_ref().unwrap();
    assert_eq!(attempts.retry_on, default.retry_on);
    assert_eq!(attempts.num_retries.as_ref().unwrap().value, 4);
    assert!(attempts.retriable_status_codes.is_empty());
}

#[test]
fn match_port_and_gateway_filter_match_blocks() {
    let mesh = Mesh::new()
        .with_service(service("default", "web", &[("http", 80)]))
        .with_config(gateway(
            "istio-system",
            "public",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*"]
- port: {number: 8080, name: http, protocol: HTTP}
  hosts: ["*"]
"#,
        ))
        .with_config(gateway(
            "istio-system",
            "internal",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*"]
"#,
        ))
        .with_config(virtual_service(
            "default",
            "ports",
            r#"
hosts: [a.example.com]
gateways: [istio-system/public, istio-system/internal]
http:
- name: on-80
  match: [{port: 80, uri: {prefix: /a}}]
  route: [{destination: {host: web}}]
- name: on-8080
  match: [{port: 8080, uri: {prefix: /b}}]
  route: [{destination: {host: web}}]
- name: public-only
  match: [{gateways: [istio-system/public], uri: {prefix: /c}}]
  route: [{destination: {host: web}}]
- name: missing-gateway
  match: [{gateways: [istio-system/nope], uri: {prefix: /d}}]
  route: [{destination: {host: web}}]
"#,
        ));
    let names = |port: u32| -> Vec<String> {
        let rc = rds(&mesh, &ingress(), &format!("http.{port}"));
        vhost(&rc, &format!("a.example.com:{port}"))
            .routes
            .iter()
            .map(|r| r.name.clone())
            .collect()
    };
    assert_eq!(names(80), ["on-80", "public-only"]);
    assert_eq!(names(8080), ["on-8080", "public-only"]);
}
