//! RDS for sidecars (`"<port>"`): a virtual host per visible service, its domains, default
//! routes, and VirtualServices for the mesh.

use super::rds_gateway::{cluster_of, rds, route_action, vhost, vhost_names};
use crate::testutil::*;
use shoal_proto::pb::envoy::config::route::v3::route_match::PathSpecifier;
use shoal_proto::XdsType;
use std::collections::BTreeSet;

const REVIEWS: &str = "reviews.default.svc.cluster.local";

fn sidecar_mesh() -> Mesh {
    let mut reviews = service("default", "reviews", &[("http", 9080), ("http-alt", 8080)]);
    reviews.cluster_ips = vec!["10.96.0.10".into()];
    Mesh::new()
        .with_service(reviews)
        .with_service(service("default", "ratings", &[("http", 9080)]))
        .with_service(service("other", "details", &[("http", 9080)]))
        .with_service(service("default", "web", &[("http", 80)]))
        .with_config(service_entry(
            "default",
            "ext",
            r#"
hosts: [api.example.com]
addresses: [240.0.0.1]
ports: [{number: 9080, name: http, protocol: HTTP}]
resolution: DNS
"#,
        ))
}

fn proxy() -> crate::index::proxy::Proxy {
    sidecar_proxy("default", &[("app", "productpage")])
}

fn sorted(v: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn a_virtual_host_per_visible_service_with_the_port() {
    let rc = rds(&sidecar_mesh(), &proxy(), "9080");
    assert_eq!(
        vhost_names(&rc),
        [
            "api.example.com:9080",
            "details.other.svc.cluster.local:9080",
            "ratings.default.svc.cluster.local:9080",
            "reviews.default.svc.cluster.local:9080",
        ]
    );
    let rc = rds(&sidecar_mesh(), &proxy(), "80");
    assert_eq!(vhost_names(&rc), ["web.default.svc.cluster.local:80"]);
    let rc = rds(&sidecar_mesh(), &proxy(), "7777");
    assert!(rc.virtual_hosts.is_empty());
}

#[test]
fn domains_follow_istio() {
    let rc = rds(&sidecar_mesh(), &proxy(), "9080");
    // istiod's `SidecarIgnorePort`: Envoy ignores the port in host matching, so each
    // host is listed once, without `:port`.
    assert!(rc.ignore_port_in_host_matching);
    assert_eq!(
        vhost(&rc, &format!("{REVIEWS}:9080")).domains,
        sorted(&[
            "reviews",
            "reviews.default",
            "reviews.default.svc",
            REVIEWS,
            "10.96.0.10",
        ])
    );
    // Another namespace's service: no short name.
    assert_eq!(
        vhost(&rc, "details.other.svc.cluster.local:9080").domains,
        sorted(&[
            "details.other",
            "details.other.svc",
            "details.other.svc.cluster.local",
        ])
    );
    assert_eq!(
        vhost(&rc, "api.example.com:9080").domains,
        sorted(&["api.example.com", "240.0.0.1"])
    );
}

#[test]
fn default_route_goes_to_the_service_cluster() {
    let rc = rds(&sidecar_mesh(), &proxy(), "9080");
    let vh = vhost(&rc, &format!("{REVIEWS}:9080"));
    assert_eq!(vh.routes.len(), 1);
    let r = &vh.routes[0];
    assert_eq!(r.name, "default");
    assert_eq!(
        r.r#match.as_ref().unwrap().path_specifier,
        Some(PathSpecifier::Prefix("/".into()))
    );
    assert_eq!(cluster_of(r), format!("outbound|9080||{REVIEWS}"));
    let ra = route_action(r);
    let t = ra.timeout.as_ref().unwrap();
    assert_eq!((t.seconds, t.nanos), (0, 0));
    // istiod's `setTimeout`: gRPC deadlines (`grpc-timeout`) honoured, uncapped.
    #[allow(deprecated)]
    let grpc = ra.max_grpc_timeout.as_ref().map(|d| (d.seconds, d.nanos));
    assert_eq!(grpc, Some((0, 0)));
    let retry = ra.retry_policy.as_ref().unwrap();
    assert_eq!(retry.num_retries.as_ref().unwrap().value, 2);
}

#[test]
fn domains_are_never_shared_between_virtual_hosts() {
    let mesh = sidecar_mesh()
        .with_config(service_entry(
            "default",
            "ext-a",
            r#"
hosts: [a.example.com]
addresses: [240.0.0.5]
ports: [{number: 9080, name: http, protocol: HTTP}]
resolution: DNS
"#,
        ))
        .with_config(service_entry(
            "default",
            "ext-b",
            r#"
hosts: [b.example.com]
addresses: [240.0.0.5]
ports: [{number: 9080, name: http, protocol: HTTP}]
resolution: DNS
"#,
        ))
        // An entry named like a Kubernetes alias of reviews.
        .with_config(service_entry(
            "default",
            "alias",
            r#"
hosts: [reviews.default]
ports: [{number: 9080, name: http, protocol: HTTP}]
resolution: DNS
"#,
        ));
    let rc = rds(&mesh, &proxy(), "9080");
    let mut seen = BTreeSet::new();
    for vh in &rc.virtual_hosts {
        assert!(!vh.domains.is_empty(), "{}", vh.name);
        for d in &vh.domains {
            assert!(seen.insert(d.clone()), "domain {d} appears twice");
        }
    }
    assert!(seen.contains("240.0.0.5"));
    assert!(vhost(&rc, "a.example.com:9080")
        .domains
        .contains(&"240.0.0.5".to_string()));
    assert!(!vhost(&rc, "b.example.com:9080")
        .domains
        .contains(&"240.0.0.5".to_string()));
}

#[test]
fn mesh_virtual_services_replace_the_default_route() {
    let mesh = sidecar_mesh()
        .with_config(destination_rule(
            "default",
            "reviews",
            "host: reviews\nsubsets: [{name: v2, labels: {version: v2}}]",
        ))
        .with_config(virtual_service(
            "default",
            "reviews",
            r#"
hosts: [reviews]
http:
- name: jason
  match: [{headers: {end-user: {exact: jason}}}]
  route: [{destination: {host: reviews, subset: v2}}]
- name: rest
  route: [{destination: {host: reviews}}]
"#,
        ))
        .with_config(virtual_service(
            "default",
            "ratings",
            r#"
hosts: [ratings.default.svc.cluster.local]
gateways: [mesh, istio-system/public]
http: [{name: ratings-mesh, route: [{destination: {host: ratings}}]}]
"#,
        ))
        .with_config(virtual_service(
            "other",
            "details",
            r#"
hosts: [details]
gateways: [istio-system/public]
http: [{name: gateway-only, route: [{destination: {host: details}}]}]
"#,
        ));
    let rc = rds(&mesh, &proxy(), "9080");
    let names = |vh: &str| -> Vec<String> {
        vhost(&rc, vh)
            .routes
            .iter()
            .map(|r| r.name.clone())
            .collect()
    };
    assert_eq!(names(&format!("{REVIEWS}:9080")), ["jason", "rest"]);
    let jason = &vhost(&rc, &format!("{REVIEWS}:9080")).routes[0];
    assert_eq!(cluster_of(jason), format!("outbound|9080|v2|{REVIEWS}"));
    // No `timeout` in the rule: gRPC deadlines honoured uncapped (istiod's `setTimeout`).
    #[allow(deprecated)]
    let grpc = route_action(jason)
        .max_grpc_timeout
        .map(|d| (d.seconds, d.nanos));
    assert_eq!(grpc, Some((0, 0)));
    assert_eq!(
        names("ratings.default.svc.cluster.local:9080"),
        ["ratings-mesh"]
    );
    // Bound to a gateway only: sidecars keep the default route.
    assert_eq!(names("details.other.svc.cluster.local:9080"), ["default"]);
}

#[test]
fn virtual_service_export_to_limits_which_sidecars_use_it() {
    let mesh = sidecar_mesh().with_config(virtual_service(
        "other",
        "details",
        r#"
hosts: [details]
exportTo: ["."]
http: [{name: private, route: [{destination: {host: details}}]}]
"#,
    ));
    let from_default = rds(&mesh, &proxy(), "9080");
    assert_eq!(
        vhost(&from_default, "details.other.svc.cluster.local:9080").routes[0].name,
        "default"
    );
    let from_other = rds(&mesh, &sidecar_proxy("other", &[]), "9080");
    assert_eq!(
        vhost(&from_other, "details.other.svc.cluster.local:9080").routes[0].name,
        "private"
    );
}

#[test]
fn a_virtual_service_without_routes_on_a_port_keeps_the_default_route_there() {
    let mesh = sidecar_mesh().with_config(virtual_service(
        "default",
        "reviews",
        r#"
hosts: [reviews]
http:
- name: alt-only
  match: [{port: 8080}]
  route: [{destination: {host: reviews, port: {number: 8080}}}]
"#,
    ));
    let rc = rds(&mesh, &proxy(), "8080");
    assert_eq!(
        vhost(&rc, &format!("{REVIEWS}:8080")).routes[0].name,
        "alt-only"
    );
    let rc = rds(&mesh, &proxy(), "9080");
    let vh = vhost(&rc, &format!("{REVIEWS}:9080"));
    assert_eq!(vh.routes.len(), 1);
    assert_eq!(
        cluster_of(&vh.routes[0]),
        format!("outbound|9080||{REVIEWS}")
    );
}

#[test]
fn sidecar_route_destinations_default_to_the_listener_port() {
    let mesh = sidecar_mesh().with_config(virtual_service(
        "default",
        "reviews",
        r#"
hosts: [reviews]
http: [{route: [{destination: {host: reviews}}]}]
"#,
    ));
    let rc = rds(&mesh, &proxy(), "8080");
    assert_eq!(
        cluster_of(&vhost(&rc, &format!("{REVIEWS}:8080")).routes[0]),
        format!("outbound|8080||{REVIEWS}")
    );
}

#[test]
fn egress_listener_hosts_narrow_its_port() {
    let mesh = sidecar_mesh().with_config(sidecar(
        "default",
        "default",
        r#"
egress:
- port: {number: 9080, name: http, protocol: HTTP}
  captureMode: NONE
  hosts: ["./*"]
- hosts: ["*/*"]
"#,
    ));
    let rc = rds(&mesh, &proxy(), "9080");
    assert_eq!(
        vhost_names(&rc),
        [
            "api.example.com:9080",
            "ratings.default.svc.cluster.local:9080",
            "reviews.default.svc.cluster.local:9080",
        ]
    );
}

#[test]
fn route_names_follow_the_proxy_kind() {
    let snap = sidecar_mesh().snapshot();
    let names = |proxy: &crate::index::proxy::Proxy, names: &[&str]| -> Vec<String> {
        gen(XdsType::Route, proxy, &snap, names)
            .into_iter()
            .map(|r| r.name)
            .collect()
    };
    assert_eq!(
        names(&proxy(), &["http.80", "9080", "abc", "80"]),
        ["80", "9080"]
    );
    let gw = router_proxy("istio-system", &[]);
    assert_eq!(names(&gw, &["http.80", "9080", "http.x"]), ["http.80"]);
}

#[test]
fn wildcard_virtual_services_apply_to_the_services_they_cover() {
    let entry = |name: &str, host: &str| {
        service_entry(
            "default",
            name,
            &format!(
                "hosts: [{host}]\nports: [{{number: 9080, name: http, protocol: HTTP}}]\nresolution: DNS"
            ),
        )
    };
    let vs = |name: &str, host: &str| {
        virtual_service(
            "default",
            name,
            &format!(
                "hosts: [\"{host}\"]\nhttp: [{{name: {name}, route: [{{destination: {{host: \"{host}\"}}}}]}}]"
            ),
        )
    };
    let mesh = sidecar_mesh()
        .with_config(entry("a", "a.example.com"))
        .with_config(entry("b", "b.eu.example.com"))
        .with_config(vs("broad", "*.example.com"))
        .with_config(vs("narrow", "*.eu.example.com"))
        .with_config(vs("exact", "api.example.com"));
    let rc = rds(&mesh, &proxy(), "9080");
    let first = |vh: &str| vhost(&rc, vh).routes[0].name.clone();
    assert_eq!(first("a.example.com:9080"), "broad");
    assert_eq!(first("b.eu.example.com:9080"), "narrow");
    assert_eq!(first("api.example.com:9080"), "exact");
    // Kubernetes services are not under example.com.
    assert_eq!(first(&format!("{REVIEWS}:9080")), "default");
}

#[test]
fn only_http_ports_get_virtual_hosts() {
    let mesh = sidecar_mesh().with_service(service("default", "db", &[("tcp", 9080)]));
    let rc = rds(&mesh, &proxy(), "9080");
    assert!(!vhost_names(&rc).contains(&"db.default.svc.cluster.local:9080"));
    assert_eq!(rc.virtual_hosts.len(), 4);
}

/// Sidecar tables are encoded with every default virtual host copied from its shared
/// encoding (`generate::vhosts`): the bytes must be those of the table built whole, for
/// tables with VirtualService-claimed hosts, domain clashes (the shared host then is not
/// used), sidecars of the services' own and other namespaces, built and from the cache.
#[test]
fn shared_virtual_hosts_encode_the_table_built_whole() {
    use crate::generate::rds::{self, RouteKey};
    use crate::index::scope::ProxyScope;
    use prost::Message as _;
    let mesh = sidecar_mesh()
        .with_config(service_entry(
            "default",
            "alias",
            r#"
hosts: [reviews.default]
addresses: [10.96.0.10]
ports: [{number: 9080, name: http, protocol: HTTP}]
resolution: DNS
"#,
        ))
        .with_config(virtual_service(
            "default",
            "ratings",
            r#"
hosts: [ratings]
http:
- route: [{destination: {host: ratings}}]
  timeout: 3s
"#,
        ));
    let snap = mesh.snapshot();
    for proxy in [
        proxy(),
        sidecar_proxy("other", &[("app", "x")]),
        sidecar_proxy("default", &[("app", "y")]),
    ] {
        for _ in 0..2 {
            let generated = gen(XdsType::Route, &proxy, &snap, &["9080", "8080", "80"]);
            let scope = ProxyScope::compute(&proxy, &snap.ctx);
            let names: Vec<String> = ["9080", "8080", "80"].map(String::from).to_vec();
            let keys = rds::keys(&proxy, &scope, &snap.ctx, &names);
            assert_eq!(generated.len(), keys.len());
            for key in &keys {
                let RouteKey::Sidecar(key) = key else {
                    panic!("a sidecar key")
                };
                let resource = generated.iter().find(|r| r.name == key.name).unwrap();
                assert_eq!(
                    resource.any.value,
                    rds::sidecar_routes(key).encode_to_vec(),
                    "table {} for {}",
                    key.name,
                    proxy.namespace
                );
            }
        }
    }
}
