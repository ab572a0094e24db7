//! LDS: gateway listeners per Gateway server port, sidecar `captureMode: NONE` listeners.

use crate::testutil::*;
use shoal_proto::pb::envoy::config::listener::v3::Listener;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use shoal_proto::XdsType;
use std::collections::BTreeMap;

fn lds(mesh: &Mesh, proxy: &crate::index::proxy::Proxy) -> BTreeMap<String, Listener> {
    listeners(&gen(XdsType::Listener, proxy, &mesh.snapshot(), &[]))
}

fn rds_name(l: &Listener) -> String {
    match hcm(l).route_specifier {
        Some(RouteSpecifier::Rds(rds)) => {
            // istiod's RDS config source: ADS, and no initial fetch timeout (`0s`), so the
            // listener waits for its routes instead of answering 404 after 15 s.
            let source = rds.config_source.expect("config source");
            let timeout = source.initial_fetch_timeout.map(|d| (d.seconds, d.nanos));
            assert_eq!(timeout, Some((0, 0)), "{}: initial_fetch_timeout", l.name);
            rds.route_config_name
        }
        other => panic!("{}: expected RDS, got {other:?}", l.name),
    }
}

fn ingress() -> crate::index::proxy::Proxy {
    router_proxy(
        "istio-system",
        &[("istio", "ingressgateway"), ("app", "gw")],
    )
}

fn gateways() -> Mesh {
    Mesh::new()
        .with_config(gateway(
            "istio-system",
            "main",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*"]
- port: {number: 8080, name: http-alt, protocol: HTTP}
  hosts: ["a.example.com"]
- port: {number: 443, name: https, protocol: HTTPS}
  hosts: ["*"]
"#,
        ))
        .with_config(gateway(
            "default",
            "shares-port",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["b.example.com"]
"#,
        ))
        .with_config(gateway(
            "istio-system",
            "egress",
            r#"
selector: {istio: egressgateway}
servers:
- port: {number: 9000, name: http, protocol: HTTP}
  hosts: ["*"]
"#,
        ))
}

#[test]
fn gateway_listeners_for_selected_http_servers() {
    let ls = lds(&gateways(), &ingress());
    // 80 is shared by two Gateways: one listener. 443 (HTTPS) is not served yet; 9000
    // belongs to a Gateway selecting other proxies.
    assert_eq!(
        ls.keys().collect::<Vec<_>>(),
        ["0.0.0.0_80", "0.0.0.0_8080"]
    );
    for (port, l) in [(80, &ls["0.0.0.0_80"]), (8080, &ls["0.0.0.0_8080"])] {
        assert_eq!(
            socket(l.address.as_ref().unwrap()),
            format!("0.0.0.0:{port}")
        );
        assert_eq!(rds_name(l), format!("http.{port}"));
        let hcm = hcm(l);
        assert_eq!(hcm.use_remote_address.map(|b| b.value), Some(true));
        let filters: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            filters,
            [
                "envoy.filters.http.fault",
                "envoy.filters.http.cors",
                "envoy.filters.http.router"
            ]
        );
        assert_eq!(hcm.stream_idle_timeout.map(|d| d.seconds), Some(0));
        assert_eq!(hcm.upgrade_configs[0].upgrade_type, "websocket");
    }
}

#[test]
fn rds_has_istiods_zero_initial_fetch_timeout() {
    let ls = lds(&gateways(), &ingress());
    assert!(!ls.is_empty());
    for l in ls.values() {
        rds_name(l); // asserts `initial_fetch_timeout: 0s`
    }
}

#[test]
fn other_gateway_proxies_get_their_own_servers() {
    let egress = router_proxy("istio-system", &[("istio", "egressgateway")]);
    let ls = lds(&gateways(), &egress);
    assert_eq!(ls.keys().collect::<Vec<_>>(), ["0.0.0.0_9000"]);
    let none = router_proxy("istio-system", &[("istio", "unknown")]);
    assert!(lds(&gateways(), &none).is_empty());
}

#[test]
fn gateway_without_selector_applies_to_every_gateway_proxy() {
    let mesh = Mesh::new().with_config(gateway(
        "istio-system",
        "everywhere",
        r#"
servers:
- port: {number: 8000, name: http, protocol: HTTP}
  hosts: ["*"]
"#,
    ));
    let ls = lds(
        &mesh,
        &router_proxy("istio-system", &[("istio", "anything")]),
    );
    assert_eq!(ls.keys().collect::<Vec<_>>(), ["0.0.0.0_8000"]);
    // Never to sidecars.
    assert!(lds(&mesh, &sidecar_proxy("istio-system", &[])).is_empty());
}

#[test]
fn gateway_server_bind_address() {
    let mesh = Mesh::new().with_config(gateway(
        "istio-system",
        "bound",
        r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  bind: 127.0.0.2
  hosts: ["*"]
"#,
    ));
    let ls = lds(&mesh, &ingress());
    let l = &ls["127.0.0.2_80"];
    assert_eq!(socket(l.address.as_ref().unwrap()), "127.0.0.2:80");
    assert_eq!(rds_name(l), "http.80");
}

#[test]
fn sidecar_capture_mode_none_egress_listeners() {
    let mesh = Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_config(sidecar(
            "default",
            "default",
            r#"
egress:
- port: {number: 9080, name: http, protocol: HTTP}
  captureMode: NONE
  hosts: ["./*"]
- port: {number: 9090, name: http, protocol: HTTP}
  captureMode: NONE
  bind: 0.0.0.0
  hosts: ["./*"]
- port: {number: 9091, name: http, protocol: HTTP}
  captureMode: DEFAULT
  hosts: ["./*"]
- port: {number: 9092, name: tcp, protocol: TCP}
  captureMode: NONE
  hosts: ["./*"]
- hosts: ["istio-system/*"]
"#,
        ));
    let ls = lds(&mesh, &sidecar_proxy("default", &[]));
    assert_eq!(
        ls.keys().collect::<Vec<_>>(),
        ["0.0.0.0_9090", "127.0.0.1_9080"]
    );
    let l = &ls["127.0.0.1_9080"];
    assert_eq!(socket(l.address.as_ref().unwrap()), "127.0.0.1:9080");
    assert_eq!(rds_name(l), "9080");
    assert_eq!(hcm(l).use_remote_address.map(|b| b.value), Some(false));
    assert_eq!(rds_name(&ls["0.0.0.0_9090"]), "9090");
}

#[test]
fn sidecar_without_such_a_sidecar_gets_no_listeners() {
    let mesh = gateways().with_service(service("default", "reviews", &[("http", 9080)]));
    assert!(lds(&mesh, &sidecar_proxy("default", &[])).is_empty());
    let with_plain_sidecar = mesh.with_config(sidecar(
        "default",
        "default",
        "egress: [{hosts: [\"./*\"]}]",
    ));
    assert!(lds(&with_plain_sidecar, &sidecar_proxy("default", &[])).is_empty());
}
