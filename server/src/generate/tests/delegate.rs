//! VirtualService delegation, as istiod merges it: a root rule with `delegate` is replaced by
//! the child's rules, each child match ANDed with the root's, conflicting child rules
//! dropped, the child's settings first and the root rule's as defaults; at gateways and
//! sidecars; and a change of a child (or of its destinations) reaches the cached tables.

use super::rds_gateway::{cluster_of, rds, route_action, vhost};
use crate::generate::cache::GeneratorCache;
use crate::generate::metrics::CacheMetrics;
use crate::index::scope::ProxyScope;
use crate::testutil::*;
use shoal_proto::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, route_match::PathSpecifier, Route, RouteMatch,
};
use shoal_proto::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use shoal_proto::XdsType;

const API: &str = "outbound|8080||api.team.svc.cluster.local";
const RATINGS: &str = "outbound|9080||ratings.team.svc.cluster.local";
const WEB: &str = "outbound|80||web.default.svc.cluster.local";

fn base() -> Mesh {
    Mesh::new()
        .with_service(service("default", "web", &[("http", 80)]))
        .with_service(service("team", "api", &[("http", 8080)]))
        .with_service(service("team", "ratings", &[("http", 9080)]))
        .with_config(gateway(
            "istio-system",
            "public",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*"]
"#,
        ))
}

/// A gateway root in `default` delegating `/v2` (and `/beta` with a header) to `team/v2`.
const GATEWAY_ROOT: &str = r#"
hosts: [shop.example.com]
gateways: [istio-system/public]
http:
- name: v2
  match:
  - uri: {prefix: /v2}
  - uri: {prefix: /beta}
    headers: {x-beta: {exact: "1"}}
  timeout: 10s
  retries: {attempts: 5}
  headers: {request: {set: {x-root: "1"}}}
  delegate: {name: v2, namespace: team}
- route: [{destination: {host: web}}]
"#;

/// The child: short hosts resolve in its own namespace (`team`).
const CHILD: &str = r#"
http:
- name: api
  match: [{uri: {prefix: /v2/api}}]
  timeout: 3s
  route: [{destination: {host: api}}]
- name: elsewhere
  match: [{uri: {prefix: /other}}]
  route: [{destination: {host: api}}]
- name: beta-clash
  match: [{uri: {prefix: /beta}, headers: {x-beta: {exact: "2"}}}]
  route: [{destination: {host: api}}]
- name: user
  match: [{headers: {x-user: {exact: jason}}}]
  route: [{destination: {host: api}}]
- name: rest
  headers: {request: {set: {x-child: "1"}}}
  route: [{destination: {host: ratings}}]
"#;

fn gateway_mesh(child: &str) -> Mesh {
    base()
        .with_config(virtual_service("default", "root", GATEWAY_ROOT))
        .with_config(virtual_service("team", "v2", child))
}

fn ingress() -> crate::index::proxy::Proxy {
    router_proxy("istio-system", &[("istio", "ingressgateway")])
}

fn shop_routes(mesh: &Mesh) -> Vec<Route> {
    vhost(&rds(mesh, &ingress(), "http.80"), "shop.example.com:80")
        .routes
        .clone()
}

fn prefix(m: &RouteMatch) -> &str {
    match &m.path_specifier {
        Some(PathSpecifier::Prefix(p)) => p,
        Some(PathSpecifier::Path(p)) => p,
        other => panic!("expected a prefix or a path, got {other:?}"),
    }
}

/// `(name, exact value)` of a route match's header matchers.
fn headers(m: &RouteMatch) -> Vec<(String, String)> {
    m.headers
        .iter()
        .map(|h| {
            let value = match &h.header_match_specifier {
                Some(HeaderMatchSpecifier::StringMatch(s)) => match &s.match_pattern {
                    Some(MatchPattern::Exact(v)) => v.clone(),
                    other => panic!("expected an exact match, got {other:?}"),
                },
                other => panic!("expected a string match, got {other:?}"),
            };
            (h.name.clone(), value)
        })
        .collect()
}

/// A route's name, path, header matches and cluster.
type RouteSummary = (String, String, Vec<(String, String)>, String);

/// Name, path, headers and cluster of each route.
fn summary(routes: &[Route]) -> Vec<RouteSummary> {
    routes
        .iter()
        .map(|r| {
            let m = r.r#match.as_ref().expect("match");
            (
                r.name.clone(),
                prefix(m).to_string(),
                headers(m),
                cluster_of(r).to_string(),
            )
        })
        .collect()
}

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn child_matches_merge_with_the_roots_and_conflicts_are_dropped() {
    let rs = shop_routes(&gateway_mesh(CHILD));
    assert_eq!(
        summary(&rs),
        [
            // /v2/api lies within /v2 only.
            ("v2-api".into(), "/v2/api".into(), h(&[]), API.into()),
            // `elsewhere` (/other) and `beta-clash` (x-beta: 2) conflict with every root match.
            // A header-only child match is ANDed with each root match.
            (
                "v2-user".into(),
                "/v2".into(),
                h(&[("x-user", "jason")]),
                API.into()
            ),
            (
                "v2-user".into(),
                "/beta".into(),
                h(&[("x-beta", "1"), ("x-user", "jason")]),
                API.into()
            ),
            // A child rule without matches takes the root's.
            ("v2-rest".into(), "/v2".into(), h(&[]), RATINGS.into()),
            (
                "v2-rest".into(),
                "/beta".into(),
                h(&[("x-beta", "1")]),
                RATINGS.into()
            ),
            // The root's own rule stays in place after the delegated ones.
            (String::new(), "/".into(), h(&[]), WEB.into()),
        ]
    );
}

#[test]
fn child_settings_apply_and_the_roots_fill_in() {
    let rs = shop_routes(&gateway_mesh(CHILD));
    let api = route_action(&rs[0]);
    // The child's timeout wins; its missing retries and headers come from the root rule.
    assert_eq!(api.timeout.as_ref().map(|d| d.seconds), Some(3));
    assert_eq!(
        api.retry_policy
            .as_ref()
            .and_then(|p| p.num_retries.as_ref())
            .map(|n| n.value),
        Some(5)
    );
    let set = |r: &Route| -> Vec<String> {
        r.request_headers_to_add
            .iter()
            .map(|o| o.header.as_ref().expect("header").key.clone())
            .collect()
    };
    assert_eq!(set(&rs[0]), ["x-root"]);
    let rest = &rs[3];
    assert_eq!(rest.name, "v2-rest");
    assert_eq!(
        route_action(rest).timeout.as_ref().map(|d| d.seconds),
        Some(10)
    );
    // The child's headers replace the root rule's (istiod merges the field as a whole).
    assert_eq!(set(rest), ["x-child"]);
}

#[test]
fn a_child_not_exported_to_the_root_or_missing_drops_the_rule() {
    let hidden = format!("exportTo: [\".\"]\n{CHILD}");
    let rs = shop_routes(&gateway_mesh(&hidden));
    assert_eq!(
        summary(&rs),
        [(String::new(), "/".into(), h(&[]), WEB.into())]
    );
    let exported = format!("exportTo: [default]\n{CHILD}");
    assert_eq!(shop_routes(&gateway_mesh(&exported)).len(), 6);

    let missing = base().with_config(virtual_service("default", "root", GATEWAY_ROOT));
    assert_eq!(
        summary(&shop_routes(&missing)),
        [(String::new(), "/".into(), h(&[]), WEB.into())]
    );
    // A VirtualService with hosts is no delegate (istiod looks delegates up among the
    // host-less ones).
    let with_hosts = base()
        .with_config(virtual_service("default", "root", GATEWAY_ROOT))
        .with_config(virtual_service(
            "team",
            "v2",
            &format!("hosts: [other.example.com]\n{CHILD}"),
        ));
    assert_eq!(shop_routes(&with_hosts).len(), 1);
}

#[test]
fn one_level_only_a_childs_own_delegation_is_ignored() {
    let child = format!(
        "{CHILD}- match: [{{uri: {{prefix: /v2/deeper}}}}]\n  delegate: {{name: grandchild}}\n"
    );
    let mesh = gateway_mesh(&child).with_config(virtual_service(
        "team",
        "grandchild",
        "http: [{route: [{destination: {host: api}}]}]",
    ));
    assert_eq!(shop_routes(&mesh).len(), 6);
}

#[test]
fn sidecars_route_by_the_childs_rules() {
    let mesh = base()
        .with_config(virtual_service(
            "default",
            "web",
            r#"
hosts: [web]
http:
- match: [{uri: {prefix: /v2}}]
  delegate: {name: web-v2}
- route: [{destination: {host: web}}]
"#,
        ))
        .with_config(virtual_service(
            "default",
            "web-v2",
            r#"
http:
- match: [{uri: {exact: /v2/x}}]
  fault: {abort: {httpStatus: 418, percentage: {value: 100}}}
  route: [{destination: {host: ratings.team.svc.cluster.local}}]
- match: [{uri: {prefix: /v3}}]
  route: [{destination: {host: api.team.svc.cluster.local}}]
- route: [{destination: {host: api.team.svc.cluster.local}}]
"#,
        ));
    let proxy = sidecar_proxy("default", &[("app", "client")]);
    let rc = rds(&mesh, &proxy, "80");
    let rs = &vhost(&rc, "web.default.svc.cluster.local:80").routes;
    assert_eq!(
        summary(rs),
        [
            (String::new(), "/v2/x".into(), h(&[]), RATINGS.into()),
            (String::new(), "/v2".into(), h(&[]), API.into()),
            (String::new(), "/".into(), h(&[]), WEB.into()),
        ]
    );
    assert!(rs[0]
        .typed_per_filter_config
        .contains_key(crate::generate::http_route::FAULT_FILTER));
}

/// Route tables through one cache with checked hits (`SHOAL_CACHE_ASSERT` semantics): a
/// stale hit panics.
fn cached_shop_routes(cache: &GeneratorCache, mesh: &Mesh) -> Vec<Route> {
    let snap = mesh.snapshot();
    let proxy = ingress();
    let scope = ProxyScope::compute(&proxy, &snap.ctx);
    let out = cache.generate(
        XdsType::Route,
        &proxy,
        &scope,
        &snap,
        &["http.80".to_string()],
    );
    let out: Vec<_> = out.iter().map(|r| (**r).clone()).collect();
    let rc = route_configs(&out).remove("http.80").expect("http.80");
    vhost(&rc, "shop.example.com:80").routes.clone()
}

#[test]
fn a_change_of_the_child_or_its_destinations_reaches_cached_tables() {
    let cache = GeneratorCache::new(
        1 << 24,
        true,
        CacheMetrics::register(&prometheus::Registry::new()),
    );
    let first = cached_shop_routes(&cache, &gateway_mesh(CHILD));
    assert_eq!(cluster_of(&first[0]), API);
    // Same root, the child now sends /v2/api to ratings.
    let changed = CHILD.replacen("{host: api}", "{host: ratings}", 1);
    let second = cached_shop_routes(&cache, &gateway_mesh(&changed));
    assert_eq!(cluster_of(&second[0]), RATINGS);
    // Back again: a hit, rebuilt and compared.
    let third = cached_shop_routes(&cache, &gateway_mesh(CHILD));
    assert_eq!(third, first);
    // The child's destination changes its only port: the route follows.
    let moved = gateway_mesh(CHILD).with_service(service("team", "api", &[("http", 8081)]));
    let fourth = cached_shop_routes(&cache, &moved);
    assert_eq!(
        cluster_of(&fourth[0]),
        "outbound|8081||api.team.svc.cluster.local"
    );
}
