//! Proxyless gRPC (`GENERATOR: grpc`): only the requested names, and only what gRPC's xDS
//! client accepts (istiod's `grpcgen`).

use crate::index::proxy::Proxy;
use crate::testutil::*;
use prost::Message as _;
use shoal_proto::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, LbPolicy,
};
use shoal_proto::pb::envoy::config::route::v3::{route::Action, route_action::ClusterSpecifier};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use shoal_proto::XdsType;

const ECHO: &str = "echo.default.svc.cluster.local";

fn mesh() -> Mesh {
    let mut echo = service("default", "echo", &[("grpc", 7070), ("tcp", 9090)]);
    echo.cluster_ips = vec!["10.96.0.7".into()];
    Mesh::new()
        .with_service(echo)
        .with_service(service("other", "echo", &[("grpc", 7070)]))
        .with_slice(slice(
            "default",
            "echo",
            "echo-1",
            &[("grpc", 17070), ("tcp", 19090)],
            vec![
                endpoint("10.0.0.1", &[("version", "v1")]),
                endpoint("10.0.0.2", &[("version", "v2")]),
            ],
        ))
}

fn client() -> Proxy {
    proxyless_proxy("default", &[("app", "client")])
}

fn api_hcm(l: &shoal_proto::pb::envoy::config::listener::v3::Listener) -> HttpConnectionManager {
    let any = l
        .api_listener
        .as_ref()
        .and_then(|a| a.api_listener.as_ref())
        .expect("an api_listener");
    assert_eq!(
        any.type_url,
        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
    );
    HttpConnectionManager::decode(&*any.value).unwrap()
}

#[test]
fn listeners_only_for_the_names_asked_with_short_names_expanded() {
    let snap = mesh().snapshot();
    let p = client();
    assert!(
        gen(XdsType::Listener, &p, &snap, &[]).is_empty(),
        "LDS is not wildcard for gRPC"
    );
    let names = [
        "echo.default.svc.cluster.local:7070",
        "echo:7070",
        "echo.default:7070",
        "echo.other.svc.cluster.local:7070",
        "missing:7070",
        "echo:1234",
    ];
    let lds = listeners(&gen(XdsType::Listener, &p, &snap, &names));
    assert_eq!(
        lds.keys().collect::<Vec<_>>(),
        [
            "echo.default.svc.cluster.local:7070",
            "echo.default:7070",
            "echo.other.svc.cluster.local:7070",
            "echo:7070",
        ]
    );
    for (name, l) in &lds {
        assert!(
            l.filter_chains.is_empty() && l.listener_filters.is_empty(),
            "{name}"
        );
        let hcm = api_hcm(l);
        let filters: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            filters,
            ["envoy.filters.http.fault", "envoy.filters.http.router"],
            "{name}"
        );
        let Some(RouteSpecifier::Rds(rds)) = &hcm.route_specifier else {
            panic!("{name}: RDS expected");
        };
        let host = if name.contains("other") {
            "echo.other.svc.cluster.local"
        } else {
            ECHO
        };
        assert_eq!(rds.route_config_name, format!("outbound|7070||{host}"));
        assert!(rds
            .config_source
            .as_ref()
            .unwrap()
            .config_source_specifier
            .is_some());
    }
    assert_eq!(
        socket(lds["echo:7070"].address.as_ref().unwrap()),
        "10.96.0.7:7070"
    );
    // A host without a port: a listener per service port, as istiod.
    let all = listeners(&gen(XdsType::Listener, &p, &snap, &["echo"]));
    assert_eq!(all.keys().collect::<Vec<_>>(), ["echo:7070", "echo:9090"]);
}

#[test]
fn a_route_table_per_name_with_the_one_service() {
    let m = mesh().with_config(virtual_service(
        "default",
        "echo",
        r#"
hosts: [echo]
http:
- match: [{headers: {x-version: {exact: v2}}}]
  route: [{destination: {host: echo, subset: v2}}]
  timeout: 3s
  corsPolicy: {allowOrigins: [{exact: "https://a.example"}]}
- route:
  - {destination: {host: echo, subset: v1}, weight: 80}
  - {destination: {host: echo, subset: v2}, weight: 20}
  retries: {attempts: 0}
"#,
    ));
    let snap = m.snapshot();
    let name = format!("outbound|7070||{ECHO}");
    let rds = route_configs(&gen(XdsType::Route, &client(), &snap, &[&name, "7070"]));
    assert_eq!(
        rds.keys().collect::<Vec<_>>(),
        [&name],
        "only well-formed names"
    );
    let rc = &rds[&name];
    assert_eq!(rc.virtual_hosts.len(), 1, "only the service asked for");
    let vh = &rc.virtual_hosts[0];
    for d in [
        "echo:7070",
        "echo.default.svc.cluster.local:7070",
        "10.96.0.7:7070",
    ] {
        assert!(vh.domains.iter().any(|x| x == d), "{d} in {:?}", vh.domains);
    }
    assert!(
        !rc.ignore_port_in_host_matching,
        "gRPC matches its target host:port"
    );
    assert_eq!(vh.routes.len(), 2);
    let header = &vh.routes[0];
    assert!(
        header.typed_per_filter_config.is_empty(),
        "no CORS for gRPC"
    );
    let Some(Action::Route(a)) = &header.action else {
        panic!()
    };
    assert_eq!(
        a.cluster_specifier,
        Some(ClusterSpecifier::Cluster(format!(
            "outbound|7070|v2|{ECHO}"
        )))
    );
    let msd = a
        .max_stream_duration
        .as_ref()
        .unwrap()
        .max_stream_duration
        .unwrap();
    assert_eq!((msd.seconds, msd.nanos), (3, 0));
    let Some(Action::Route(split)) = &vh.routes[1].action else {
        panic!()
    };
    assert!(split.retry_policy.is_none(), "gRPC refuses num_retries 0");
    let Some(ClusterSpecifier::WeightedClusters(w)) = &split.cluster_specifier else {
        panic!("weighted clusters expected");
    };
    let weights: Vec<(String, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.weight.unwrap().value))
        .collect();
    assert_eq!(
        weights,
        [
            (format!("outbound|7070|v1|{ECHO}"), 80),
            (format!("outbound|7070|v2|{ECHO}"), 20)
        ]
    );
    // Without a VirtualService: the default route, the default retries kept.
    let rc = &route_configs(&gen(
        XdsType::Route,
        &client(),
        &mesh().snapshot(),
        &[&name],
    ))[&name];
    let Some(Action::Route(a)) = &rc.virtual_hosts[0].routes[0].action else {
        panic!()
    };
    assert_eq!(
        a.cluster_specifier,
        Some(ClusterSpecifier::Cluster(name.clone()))
    );
    assert_eq!(
        a.retry_policy.as_ref().unwrap().num_retries.unwrap().value,
        2
    );
}

#[test]
fn clusters_only_for_the_names_asked_with_subsets_lb_and_limits() {
    let m = mesh().with_config(destination_rule(
        "default",
        "echo",
        r#"
host: echo
trafficPolicy:
  loadBalancer: {simple: LEAST_REQUEST}
  connectionPool: {http: {http2MaxRequests: 7, http1MaxPendingRequests: 3}}
  outlierDetection: {consecutive5xxErrors: 3}
subsets:
- {name: v1, labels: {version: v1}}
- name: v2
  labels: {version: v2}
  trafficPolicy:
    loadBalancer: {consistentHash: {httpHeaderName: x-user}}
    tls: {mode: ISTIO_MUTUAL}
"#,
    ));
    let snap = m.snapshot();
    let p = client();
    assert!(
        gen(XdsType::Cluster, &p, &snap, &[]).is_empty(),
        "CDS is not wildcard for gRPC"
    );
    let (default, v1, v2) = (
        format!("outbound|7070||{ECHO}"),
        format!("outbound|7070|v1|{ECHO}"),
        format!("outbound|7070|v2|{ECHO}"),
    );
    let cds = clusters(&gen(
        XdsType::Cluster,
        &p,
        &snap,
        &[
            &default,
            &v2,
            &format!("outbound|7070|v9|{ECHO}"),
            "outbound|7070||nowhere",
        ],
    ));
    assert_eq!(cds.keys().collect::<Vec<_>>(), [&v2, &default]);
    let c = &cds[&default];
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
    assert_eq!(c.eds_cluster_config.as_ref().unwrap().service_name, default);
    assert_eq!(c.lb_policy, LbPolicy::LeastRequest as i32);
    let t = &c.circuit_breakers.as_ref().unwrap().thresholds;
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].max_requests.unwrap().value, 7);
    assert!(
        t[0].max_pending_requests.is_none(),
        "gRPC reads max_requests only"
    );
    assert!(c.outlier_detection.is_none() && c.transport_socket.is_none());
    assert!(c.connect_timeout.is_none() && c.typed_extension_protocol_options.is_empty());
    let c2 = &cds[&v2];
    assert_eq!(c2.lb_policy, LbPolicy::RingHash as i32);
    let ts = c2.transport_socket.as_ref().expect("ISTIO_MUTUAL");
    assert_eq!(ts.name, "envoy.transport_sockets.tls");
    let Some(shoal_proto::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
        any,
    )) = &ts.config_type
    else {
        panic!()
    };
    let tls = UpstreamTlsContext::decode(&*any.value).unwrap();
    let common = tls.common_tls_context.unwrap();
    assert!(
        common.tls_certificate_sds_secret_configs.is_empty(),
        "gRPC has no SDS"
    );
    let cert = common.tls_certificate_provider_instance.unwrap();
    assert_eq!(
        (cert.instance_name.as_str(), cert.certificate_name.as_str()),
        ("default", "default")
    );
    // v1 was not asked for.
    assert!(!cds.contains_key(&v1));
}

#[test]
fn endpoints_as_for_sidecars_with_weighted_localities() {
    let snap = mesh().snapshot();
    let name = format!("outbound|7070||{ECHO}");
    let eds = load_assignments(&gen(XdsType::Endpoint, &client(), &snap, &[&name]));
    let cla = &eds[&name];
    assert_eq!(cla_addresses(cla), [["10.0.0.1:17070", "10.0.0.2:17070"]]);
    assert_eq!(
        cla.endpoints[0].load_balancing_weight.unwrap().value,
        2,
        "gRPC drops a locality without a weight"
    );
}

#[test]
fn server_listeners_for_the_nodes_own_ports_with_mtls_and_fail_closed_authz() {
    use shoal_proto::pb::envoy::config::listener::v3::filter::ConfigType;
    let mut echo = service("default", "echo-server", &[("grpc", 7070)]);
    echo.selector = labels(&[("app", "echo")]);
    let mut m = mesh().with_service(echo);
    let server = proxyless_proxy("default", &[("app", "echo")]);
    let name = "xds.istio.io/grpc/lds/inbound/0.0.0.0:7070";
    let chain = |m: &Mesh| {
        let lds = listeners(&gen(
            XdsType::Listener,
            &server,
            &m.snapshot(),
            &[name, "xds.istio.io/grpc/lds/inbound/0.0.0.0:1111"],
        ));
        assert_eq!(
            lds.keys().collect::<Vec<_>>(),
            [name],
            "only the node's ports"
        );
        let l = &lds[name];
        assert_eq!(socket(l.address.as_ref().unwrap()), "0.0.0.0:7070");
        assert!(l.listener_filters.is_empty() && l.use_original_dst.is_none());
        assert_eq!(l.filter_chains.len(), 1);
        let fc = l.filter_chains[0].clone();
        let Some(ConfigType::TypedConfig(any)) = &fc.filters[0].config_type else {
            panic!()
        };
        (
            fc.clone(),
            HttpConnectionManager::decode(&*any.value).unwrap(),
        )
    };
    let (fc, hcm) = chain(&m);
    assert_eq!(fc.name, "inbound-plaintext");
    assert!(fc.transport_socket.is_none());
    let filters: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        filters,
        ["envoy.filters.http.router"],
        "no fault filter on servers"
    );
    let Some(RouteSpecifier::RouteConfig(rc)) = &hcm.route_specifier else {
        panic!("inline routes expected")
    };
    assert!(matches!(
        rc.virtual_hosts[0].routes[0].action,
        Some(Action::NonForwardingAction(_))
    ));

    m.add_config(peer_authentication(
        "default",
        "strict",
        "mtls: {mode: STRICT}",
    ));
    let (fc, _) = chain(&m);
    assert_eq!(fc.name, "inbound-mtls");
    assert!(fc.transport_socket.is_some());

    // AuthorizationPolicies: gRPC's RBAC filters, DENY before ALLOW, each named once.
    let names = |m: &Mesh| -> Vec<String> {
        chain(m)
            .1
            .http_filters
            .iter()
            .map(|f| f.name.clone())
            .collect()
    };
    m.add_config(authorization_policy(
        "default",
        "allow-some",
        "selector: {matchLabels: {app: echo}}\nrules: [{from: [{source: {namespaces: [default]}}]}]",
    ));
    assert_eq!(
        names(&m),
        ["envoy.filters.http.rbac", "envoy.filters.http.router"]
    );
    m.add_config(authorization_policy(
        "default",
        "deny-admin",
        "action: DENY\nrules: [{to: [{operation: {paths: [/admin.Admin/*]}}]}]",
    ));
    assert_eq!(
        names(&m),
        [
            "envoy.filters.http.rbac.DENY",
            "envoy.filters.http.rbac",
            "envoy.filters.http.router"
        ]
    );
    // A rule gRPC cannot evaluate (SNI): every call refused, never more allowed.
    m.add_config(authorization_policy(
        "default",
        "by-sni",
        "rules: [{when: [{key: connection.sni, values: [a.example]}]}]",
    ));
    let (_, hcm) = chain(&m);
    assert_eq!(hcm.http_filters.len(), 2);
    use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as FilterConfig;
    let Some(FilterConfig::TypedConfig(any)) = &hcm.http_filters[0].config_type else {
        panic!()
    };
    let rbac =
        shoal_proto::pb::envoy::extensions::filters::http::rbac::v3::Rbac::decode(&*any.value)
            .unwrap();
    let rules = rbac.rules.unwrap();
    assert_eq!(rules.action, 1, "DENY");
    assert_eq!(
        rules.policies.keys().collect::<Vec<_>>(),
        ["deny-all-untranslated"]
    );
    // A client node gets no server listener for a port that is not its own.
    assert!(gen(XdsType::Listener, &client(), &m.snapshot(), &[name]).is_empty());
}

/// gRPC cannot serve plaintext and mTLS on one port: PERMISSIVE is plaintext, unless the
/// workload is labelled as having Istio TLS (clients' auto mTLS), as istiod decides.
#[test]
fn permissive_servers_are_plaintext_unless_labelled_istio_tls() {
    let mut echo = service("default", "echo-server", &[("grpc", 7070)]);
    echo.selector = labels(&[("app", "echo")]);
    let m = mesh().with_service(echo).with_config(peer_authentication(
        "default",
        "permissive",
        "mtls: {mode: PERMISSIVE}",
    ));
    let name = "xds.istio.io/grpc/lds/inbound/10.0.0.1:7070";
    let chain_name = |p: &Proxy| {
        let lds = listeners(&gen(XdsType::Listener, p, &m.snapshot(), &[name]));
        assert_eq!(socket(lds[name].address.as_ref().unwrap()), "10.0.0.1:7070");
        lds[name].filter_chains[0].name.clone()
    };
    assert_eq!(
        chain_name(&proxyless_proxy("default", &[("app", "echo")])),
        "inbound-plaintext"
    );
    assert_eq!(
        chain_name(&proxyless_proxy(
            "default",
            &[("app", "echo"), ("security.istio.io/tlsMode", "istio")]
        )),
        "inbound-mtls"
    );
}
