//! The VirtualService HTTP features beyond routing, as istiod translates them: header
//! manipulation, fault injection, mirroring, CORS, direct responses, extended matches,
//! redirects with derived ports, retry options; and per-route filter configs encoded the
//! same way every time.

use super::rds_gateway::{route_action, routes, rules_mesh};
use crate::testutil::*;
use prost::Message;
use shoal_proto::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use shoal_proto::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, query_parameter_matcher::QueryParameterMatchSpecifier,
    route::Action, Route,
};
use shoal_proto::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
use shoal_proto::pb::envoy::extensions::filters::http::fault::v3::{
    fault_abort::ErrorType, HttpFault,
};
use shoal_proto::XdsType;

fn one(http: &str) -> Route {
    let rs = routes(&rules_mesh(http));
    assert_eq!(rs.len(), 1, "{rs:?}");
    rs.into_iter().next().unwrap()
}

#[test]
fn header_operations_set_add_remove() {
    let r = one(r#"
- route: [{destination: {host: web}}]
  headers:
    request: {set: {x-set: "1"}, add: {x-add: "2"}, remove: [x-gone]}
    response: {set: {x-resp: "3"}, remove: [server]}
"#);
    let ops: Vec<(String, String, i32)> = r
        .request_headers_to_add
        .iter()
        .map(|o| {
            let h = o.header.as_ref().unwrap();
            (h.key.clone(), h.value.clone(), o.append_action)
        })
        .collect();
    assert_eq!(
        ops,
        [
            (
                "x-set".into(),
                "1".into(),
                HeaderAppendAction::OverwriteIfExistsOrAdd as i32
            ),
            (
                "x-add".into(),
                "2".into(),
                HeaderAppendAction::AppendIfExistsOrAdd as i32
            ),
        ]
    );
    assert_eq!(r.request_headers_to_remove, ["x-gone"]);
    assert_eq!(
        r.response_headers_to_add[0].header.as_ref().unwrap().key,
        "x-resp"
    );
    assert_eq!(r.response_headers_to_remove, ["server"]);
}

#[test]
fn fault_and_cors_are_per_route_filter_configs() {
    let r = one(r#"
- route: [{destination: {host: web}}]
  fault:
    delay: {fixedDelay: 2s, percentage: {value: 50}}
    abort: {httpStatus: 418, percentage: {value: 12.5}}
  corsPolicy:
    allowOrigins: [{exact: "https://a.example"}, {regex: "https://.*\\.b\\.example"}]
    allowMethods: [GET, POST]
    allowHeaders: [x-a]
    exposeHeaders: [x-b]
    maxAge: 24h
    allowCredentials: true
"#);
    let mut keys: Vec<&String> = r.typed_per_filter_config.keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        ["envoy.filters.http.cors", "envoy.filters.http.fault"]
    );
    let fault =
        HttpFault::decode(&*r.typed_per_filter_config["envoy.filters.http.fault"].value).unwrap();
    let delay = fault.delay.unwrap();
    assert_eq!(delay.percentage.unwrap().numerator, 500_000); // of a million
    let abort = fault.abort.unwrap();
    assert_eq!(abort.error_type, Some(ErrorType::HttpStatus(418)));
    assert_eq!(abort.percentage.unwrap().numerator, 125_000);
    let cors =
        CorsPolicy::decode(&*r.typed_per_filter_config["envoy.filters.http.cors"].value).unwrap();
    assert_eq!(cors.allow_origin_string_match.len(), 2);
    assert_eq!(cors.allow_methods, "GET,POST");
    assert_eq!(cors.max_age, "86400");
    assert_eq!(cors.allow_credentials.map(|b| b.value), Some(true));
}

#[test]
fn routes_with_two_filter_configs_encode_identically_every_time() {
    let mesh = rules_mesh(
        r#"
- route: [{destination: {host: web}}]
  fault: {abort: {httpStatus: 503, percentage: {value: 1}}}
  corsPolicy: {allowOrigins: [{exact: "*"}]}
"#,
    );
    let snap = mesh.snapshot();
    let first = gen(
        XdsType::Route,
        &super::rds_gateway::ingress(),
        &snap,
        &["http.80"],
    );
    for _ in 0..50 {
        let again = gen(
            XdsType::Route,
            &super::rds_gateway::ingress(),
            &snap,
            &["http.80"],
        );
        assert_eq!(again[0].version, first[0].version);
        assert_eq!(again[0].any.value, first[0].any.value);
    }
}

#[test]
fn mirrors_with_percentages() {
    let r = one(r#"
- route: [{destination: {host: web}}]
  mirror: {host: api, port: {number: 8080}}
  mirrorPercentage: {value: 25}
"#);
    let m = &route_action(&r).request_mirror_policies;
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].cluster, "outbound|8080||api.default.svc.cluster.local");
    let pct = m[0]
        .runtime_fraction
        .as_ref()
        .unwrap()
        .default_value
        .unwrap();
    assert_eq!(pct.numerator, 250_000);
    let r = one(r#"
- route: [{destination: {host: web}}]
  mirrors:
  - destination: {host: api, port: {number: 8080}}
  - destination: {host: web}
    percentage: {value: 0}
"#);
    // No percentage: all of it; zero: none (istiod skips it).
    let m = &route_action(&r).request_mirror_policies;
    assert_eq!(m.len(), 1);
    assert_eq!(
        m[0].runtime_fraction
            .as_ref()
            .unwrap()
            .default_value
            .unwrap()
            .numerator,
        100
    );
}

#[test]
fn direct_responses() {
    let r = one("- directResponse: {status: 418, body: {string: teapot}}\n");
    match r.action {
        Some(Action::DirectResponse(d)) => {
            assert_eq!(d.status, 418);
            assert!(format!("{:?}", d.body).contains("teapot"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn extended_matches() {
    let r = one(r#"
- match:
  - headers: {x-present: {}, x-exact: {exact: a}}
    withoutHeaders: {x-debug: {}}
    queryParams: {q: {exact: "1"}, p: {}}
    scheme: {exact: https}
  route: [{destination: {host: web}}]
"#);
    let m = r.r#match.unwrap();
    let by_name = |n: &str| m.headers.iter().find(|h| h.name == n).unwrap().clone();
    assert_eq!(
        by_name("x-present").header_match_specifier,
        Some(HeaderMatchSpecifier::PresentMatch(true))
    );
    let debug = by_name("x-debug");
    assert!(debug.invert_match);
    assert_eq!(
        debug.header_match_specifier,
        Some(HeaderMatchSpecifier::PresentMatch(true))
    );
    assert!(by_name(":scheme").header_match_specifier.is_some());
    assert_eq!(m.query_parameters.len(), 2);
    let p = m.query_parameters.iter().find(|q| q.name == "p").unwrap();
    assert_eq!(
        p.query_parameter_match_specifier,
        Some(QueryParameterMatchSpecifier::PresentMatch(true))
    );
}

#[test]
fn source_label_matches_apply_only_to_matching_workloads() {
    let mesh = Mesh::new()
        .with_service(service("default", "web", &[("http", 80)]))
        .with_config(sidecar(
            "default",
            "egress",
            "egress: [{port: {number: 80, protocol: HTTP, name: http}, captureMode: NONE, hosts: ['./*']}]",
        ))
        .with_config(virtual_service(
            "default",
            "web",
            r#"
hosts: [web]
http:
- match: [{sourceLabels: {app: canary-client}, headers: {x: {exact: "1"}}}]
  route: [{destination: {host: web, subset: canary}}]
- route: [{destination: {host: web}}]
"#,
        ));
    let rds_for = |labels: &[(&str, &str)]| {
        let p = sidecar_proxy("default", labels);
        route_configs(&gen(XdsType::Route, &p, &mesh.snapshot(), &["80"]))
            .remove("80")
            .unwrap()
    };
    let canary = rds_for(&[("app", "canary-client")]);
    let other = rds_for(&[("app", "other")]);
    let count = |rc: &shoal_proto::pb::envoy::config::route::v3::RouteConfiguration| {
        rc.virtual_hosts[0].routes.len()
    };
    assert_eq!(count(&canary), 2);
    assert_eq!(count(&other), 1);
}

#[test]
fn redirect_derive_port_and_retry_options() {
    let r = one("- redirect: {uri: /x, derivePort: FROM_REQUEST_PORT, scheme: https}\n");
    match r.action {
        // Port 80 is the request's port here; https on 80 keeps it explicit.
        Some(Action::Redirect(ra)) => assert_eq!(ra.port_redirect, 80),
        other => panic!("{other:?}"),
    }
    let r = one(r#"
- route: [{destination: {host: web}}]
  retries: {attempts: 3, backoff: 250ms, retryRemoteLocalities: true, retryIgnorePreviousHosts: false}
"#);
    let p = route_action(&r).retry_policy.clone().unwrap();
    assert_eq!(
        p.retry_back_off.unwrap().base_interval.unwrap().nanos,
        250_000_000
    );
    assert!(p.retry_priority.is_some());
    assert!(p.retry_host_predicate.is_empty());
}
