//! Gateway semantics as istiod: listeners bind the gateway Service's targetPort, hosts are
//! matched without the port, short hosts expand in the VirtualService's namespace,
//! catch-all routes of merged VirtualServices go last, httpsRedirect; and at sidecars the
//! first VirtualService for a host wins, by creation time.

use super::rds_gateway::{cluster_of, ingress, rds, vhost, vhost_names};
use crate::testutil::*;
use shoal_common::model::TargetPort;
use shoal_proto::pb::envoy::config::route::v3::virtual_host::TlsRequirementType;
use shoal_proto::XdsType;

/// The ingress gateway's own Service: port 80 → targetPort 8080.
fn gateway_service() -> shoal_common::model::Service {
    let mut svc = service("istio-system", "istio-ingressgateway", &[("http2", 80)]);
    svc.selector = labels(&[("istio", "ingressgateway")]);
    svc.ports[0].target_port = Some(TargetPort::Number(8080));
    svc
}

fn mesh() -> Mesh {
    Mesh::new()
        .with_service(gateway_service())
        .with_service(service("shop", "web", &[("http", 80)]))
        .with_config(gateway(
            "istio-system",
            "public",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*"]
  tls: {httpsRedirect: false}
"#,
        ))
}

#[test]
fn listener_binds_the_gateway_services_target_port() {
    let snap = mesh().snapshot();
    let ls = listeners(&gen(XdsType::Listener, &ingress(), &snap, &[]));
    assert_eq!(ls.keys().collect::<Vec<_>>(), ["0.0.0.0_8080"]);
    let m = mesh().with_config(virtual_service(
        "shop",
        "web",
        "hosts: [web.example.com]\ngateways: [istio-system/public]\nhttp: [{route: [{destination: {host: web}}]}]",
    ));
    let rc = rds(&m, &ingress(), "http.8080");
    let vh = vhost(&rc, "web.example.com:80");
    // Ports are ignored in host matching: the host alone is the domain.
    assert_eq!(vh.domains, ["web.example.com"]);
    assert!(rc.ignore_port_in_host_matching);
    // A destination without a port resolves against the Gateway server port (80).
    assert_eq!(
        cluster_of(&vh.routes[0]),
        "outbound|80||web.shop.svc.cluster.local"
    );
}

#[test]
fn short_hosts_expand_in_the_virtual_service_namespace() {
    let m = Mesh::new()
        .with_service(service("shop", "web", &[("http", 80)]))
        .with_config(gateway(
            "istio-system",
            "public",
            "selector: {istio: ingressgateway}\nservers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['shop/*']}]",
        ))
        .with_config(virtual_service(
            "shop",
            "web",
            "hosts: [web]\ngateways: [istio-system/public]\nhttp: [{route: [{destination: {host: web}}]}]",
        ));
    let rc = rds(&m, &ingress(), "http.80");
    assert_eq!(vhost_names(&rc), ["web.shop.svc.cluster.local:80"]);
}

#[test]
fn catch_all_routes_of_merged_virtual_services_go_last() {
    let m = mesh()
        .with_config(virtual_service(
            "shop",
            "a-catch-all",
            "hosts: [web.example.com]\ngateways: [istio-system/public]\nhttp: [{route: [{destination: {host: web}}]}]",
        ))
        .with_config(virtual_service(
            "shop",
            "b-specific",
            "hosts: [web.example.com]\ngateways: [istio-system/public]\nhttp: [{match: [{uri: {prefix: /api}}], route: [{destination: {host: web, subset: api}}]}]",
        ));
    let rc = rds(&m, &ingress(), "http.8080");
    let routes = &vhost(&rc, "web.example.com:80").routes;
    assert_eq!(routes.len(), 2);
    assert_eq!(
        cluster_of(&routes[0]),
        "outbound|80|api|web.shop.svc.cluster.local"
    );
    assert_eq!(
        cluster_of(&routes[1]),
        "outbound|80||web.shop.svc.cluster.local"
    );
}

#[test]
fn https_redirect_requires_tls() {
    let m = Mesh::new()
        .with_service(service("shop", "web", &[("http", 80)]))
        .with_config(gateway(
            "istio-system",
            "public",
            "selector: {istio: ingressgateway}\nservers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*'], tls: {httpsRedirect: true}}]",
        ))
        .with_config(virtual_service(
            "shop",
            "web",
            "hosts: [web.example.com]\ngateways: [istio-system/public]\nhttp: [{route: [{destination: {host: web}}]}]",
        ));
    let rc = rds(&m, &ingress(), "http.80");
    assert_eq!(
        vhost(&rc, "web.example.com:80").require_tls,
        TlsRequirementType::All as i32
    );
}

#[test]
fn at_sidecars_the_oldest_virtual_service_for_a_host_wins() {
    let mut newer = virtual_service(
        "shop",
        "a-newer",
        "hosts: [web]\nhttp: [{route: [{destination: {host: web, subset: newer}}]}]",
    );
    newer.meta.created = Some(2_000);
    let mut older = virtual_service(
        "shop",
        "z-older",
        "hosts: [web]\nhttp: [{route: [{destination: {host: web, subset: older}}]}]",
    );
    older.meta.created = Some(1_000);
    let m = Mesh::new()
        .with_service(service("shop", "web", &[("http", 80)]))
        .with_config(sidecar(
            "shop",
            "egress",
            "egress: [{port: {number: 80, protocol: HTTP, name: http}, captureMode: NONE, hosts: ['./*']}]",
        ))
        .with_config(newer)
        .with_config(older);
    let rc = rds(&m, &sidecar_proxy("shop", &[]), "80");
    let vh = vhost(&rc, "web.shop.svc.cluster.local:80");
    assert_eq!(vh.routes.len(), 1);
    assert_eq!(
        cluster_of(&vh.routes[0]),
        "outbound|80|older|web.shop.svc.cluster.local"
    );
}

#[test]
fn tcp_and_tls_passthrough_servers() {
    let mut db = service("shop", "db", &[("tcp", 5432)]);
    db.cluster_ips = vec!["10.96.0.30".into()];
    let m = Mesh::new()
        .with_service(db)
        .with_service(service("shop", "secure", &[("https", 443)]))
        .with_config(gateway(
            "istio-system",
            "l4",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 31400, name: tcp, protocol: TCP}
  hosts: ["*"]
- port: {number: 443, name: tls, protocol: TLS}
  hosts: ["*.example.com"]
  tls: {mode: PASSTHROUGH}
"#,
        ))
        .with_config(virtual_service(
            "shop",
            "db",
            r#"
hosts: ["*"]
gateways: [istio-system/l4]
tcp:
- match: [{port: 31400}]
  route: [{destination: {host: db}}]
tls:
- match: [{sniHosts: [secure.example.com]}]
  route: [{destination: {host: secure}}]
"#,
        ));
    let snap = m.snapshot();
    let ls = listeners(&gen(XdsType::Listener, &ingress(), &snap, &[]));
    assert_eq!(
        ls.keys().collect::<Vec<_>>(),
        ["0.0.0.0_31400", "0.0.0.0_443"]
    );
    let tcp = &ls["0.0.0.0_31400"];
    assert!(tcp.bind_to_port.is_none(), "gateway listeners bind");
    assert_eq!(tcp.filter_chains.len(), 1);
    let tls = &ls["0.0.0.0_443"];
    assert_eq!(
        tls.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
    let m0 = tls.filter_chains[0].filter_chain_match.as_ref().unwrap();
    assert_eq!(m0.server_names, ["secure.example.com"]);
    // No chain matches other SNI values: the connection is closed, not passed through.
    assert!(tls.default_filter_chain.is_none());
}

#[test]
fn a_host_defined_in_several_namespaces_resolves_per_namespace() {
    let entry = |addr: &str| {
        format!(
            "hosts: [api.example.com]\nports: [{{number: 80, name: http, protocol: HTTP}}]\nresolution: STATIC\nendpoints: [{{address: {addr}}}]\nexportTo: ['.']\n"
        )
    };
    let m = Mesh::new()
        .with_config(service_entry("team-a", "api", &entry("10.0.0.1")))
        .with_config(service_entry("team-b", "api", &entry("10.0.0.2")));
    let snap = m.snapshot();
    let endpoints_for = |ns: &str| {
        let p = sidecar_proxy(ns, &[]);
        let names = ["outbound|80||api.example.com"];
        load_assignments(&gen(XdsType::Endpoint, &p, &snap, &names))
            .values()
            .map(|c| cla_addresses(c).concat())
            .collect::<Vec<_>>()
    };
    assert_eq!(endpoints_for("team-a"), [["10.0.0.1:80"]]);
    assert_eq!(endpoints_for("team-b"), [["10.0.0.2:80"]]);
    // Neither is exported elsewhere: no endpoints for a proxy in another namespace.
    assert!(endpoints_for("team-c").iter().all(|eps| eps.is_empty()));
}
