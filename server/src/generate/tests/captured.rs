//! Captured sidecars (Istio's default interception): istiod's listener, cluster and route
//! names and the fields traffic depends on.

use super::rds_gateway::{rds, vhost_names};
use crate::index::proxy::Proxy;
use crate::testutil::*;
use prost::Message;
use shoal_common::model::TargetPort;
use shoal_proto::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType, LbPolicy},
    Cluster,
};
use shoal_proto::pb::envoy::config::listener::v3::{
    filter, listener_filter_chain_match_predicate::Rule, Filter, FilterChain, Listener,
    ListenerFilterChainMatchPredicate,
};
use shoal_proto::pb::envoy::config::route::v3::{route::Action, route_action::ClusterSpecifier};
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use shoal_proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::ClusterSpecifier as TcpCluster, TcpProxy,
};
use shoal_proto::pb::envoy::r#type::v3::Int32Range;
use shoal_proto::XdsType;
use std::collections::BTreeMap;

const POD_IP: &str = "10.1.0.7";

/// A bookinfo-like mesh: `reviews` (HTTP, VIP, targetPort 9080 → named `http-web`),
/// `mysql` (TCP), `cache` (no protocol: sniffed), `db-headless` (TCP, no VIP), and the
/// client pod's own service `productpage` (port 80 → targetPort 9080).
fn mesh() -> Mesh {
    let mut reviews = service("default", "reviews", &[("http", 9080)]);
    reviews.cluster_ips = vec!["10.96.0.10".into()];
    reviews.selector = labels(&[("app", "reviews")]);
    let mut mysql = service("default", "mysql", &[("tcp-mysql", 3306)]);
    mysql.cluster_ips = vec!["10.96.0.11".into()];
    let mut cache = service("default", "cache", &[("cache", 7000)]);
    cache.cluster_ips = vec!["10.96.0.12".into()];
    let headless = service("default", "db-headless", &[("tcp", 5432)]);
    let mut product = service(
        "default",
        "productpage",
        &[("http", 80), ("grpc-admin", 81)],
    );
    product.cluster_ips = vec!["10.96.0.13".into()];
    product.selector = labels(&[("app", "productpage")]);
    product.ports[0].target_port = Some(TargetPort::Number(9080));
    product.ports[1].target_port = Some(TargetPort::Name("admin".into()));
    Mesh::new()
        .with_service(reviews)
        .with_service(mysql)
        .with_service(cache)
        .with_service(headless)
        .with_service(product)
}

fn proxy() -> Proxy {
    let mut p = captured_proxy("default", POD_IP, &[("app", "productpage")]);
    p.pod_ports = BTreeMap::from([("admin".to_string(), 9901)]);
    p
}

fn lds(mesh: &Mesh, p: &Proxy) -> BTreeMap<String, Listener> {
    listeners(&gen(XdsType::Listener, p, &mesh.snapshot(), &[]))
}

fn cds(mesh: &Mesh, p: &Proxy) -> BTreeMap<String, Cluster> {
    clusters(&gen(XdsType::Cluster, p, &mesh.snapshot(), &[]))
}

fn typed<M: Message + Default>(f: &Filter) -> M {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => M::decode(&*any.value).expect("decodes"),
        other => panic!("unexpected filter config {other:?}"),
    }
}

/// The cluster a chain's tcp_proxy sends to.
fn tcp_cluster(c: &FilterChain) -> String {
    let f = c.filters.last().expect("a filter");
    assert_eq!(f.name, "envoy.filters.network.tcp_proxy", "{}", c.name);
    match typed::<TcpProxy>(f).cluster_specifier {
        Some(TcpCluster::Cluster(c)) => c,
        other => panic!("expected one cluster, got {other:?}"),
    }
}

fn chain_hcm(c: &FilterChain) -> HttpConnectionManager {
    let f = c.filters.last().expect("a filter");
    assert_eq!(f.name, "envoy.filters.network.http_connection_manager");
    typed(f)
}

fn rds_of(c: &FilterChain) -> String {
    match chain_hcm(c).route_specifier {
        Some(RouteSpecifier::Rds(r)) => r.route_config_name,
        other => panic!("expected RDS, got {other:?}"),
    }
}

fn chain<'a>(l: &'a Listener, name: &str) -> &'a FilterChain {
    l.filter_chains
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{}: no chain {name}", l.name))
}

#[test]
fn listener_names_are_istiods() {
    let l = lds(&mesh(), &proxy());
    let names: Vec<&str> = l.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "0.0.0.0_5432",
            "0.0.0.0_80",
            "0.0.0.0_81",
            "0.0.0.0_9080",
            "10.96.0.11_3306",
            "10.96.0.12_7000",
            "virtualInbound",
            "virtualOutbound",
        ]
    );
    // Nothing binds but the two capture listeners.
    for (name, l) in &l {
        let binds = l.bind_to_port.as_ref().is_none_or(|b| b.value);
        assert_eq!(binds, name.starts_with("virtual"), "{name}");
    }
}

#[test]
fn virtual_outbound_hands_over_and_passes_through_by_default() {
    let l = &lds(&mesh(), &proxy())["virtualOutbound"];
    assert_eq!(socket(l.address.as_ref().unwrap()), "0.0.0.0:15001");
    assert!(l.use_original_dst.as_ref().unwrap().value);
    let black = chain(l, "virtualOutbound-blackhole");
    assert_eq!(
        black
            .filter_chain_match
            .as_ref()
            .unwrap()
            .destination_port
            .unwrap()
            .value,
        15001
    );
    assert_eq!(tcp_cluster(black), "BlackHoleCluster");
    assert_eq!(
        tcp_cluster(chain(l, "virtualOutbound-catchall-tcp")),
        "PassthroughCluster"
    );
}

#[test]
fn registry_only_blackholes_unknown_destinations() {
    let m = mesh().with_config(sidecar(
        "istio-system",
        "default",
        "outboundTrafficPolicy: {mode: REGISTRY_ONLY}",
    ));
    let l = lds(&m, &proxy());
    assert_eq!(
        tcp_cluster(chain(&l["virtualOutbound"], "virtualOutbound-catchall-tcp")),
        "BlackHoleCluster"
    );
    let http = &l["0.0.0.0_9080"];
    assert_eq!(
        tcp_cluster(http.default_filter_chain.as_ref().unwrap()),
        "BlackHoleCluster"
    );
    let rc = rds(&m, &proxy(), "9080");
    assert_eq!(*vhost_names(&rc).last().unwrap(), "block_all");
    let block = rc.virtual_hosts.last().unwrap();
    assert!(matches!(
        block.routes[0].action,
        Some(Action::DirectResponse(ref d)) if d.status == 502
    ));
}

#[test]
fn http_ports_share_a_wildcard_listener_routed_by_rds() {
    let l = &lds(&mesh(), &proxy())["0.0.0.0_9080"];
    assert_eq!(l.filter_chains.len(), 1);
    let c = &l.filter_chains[0];
    let m = c.filter_chain_match.as_ref().unwrap();
    assert_eq!(m.application_protocols, ["http/1.1", "h2c"]);
    assert_eq!(rds_of(c), "9080");
    assert_eq!(chain_hcm(c).stat_prefix, "outbound_0.0.0.0_9080");
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.http_inspector"
    );
    let fallthrough = l.default_filter_chain.as_ref().unwrap();
    assert_eq!(fallthrough.name, "PassthroughFilterChain");
    assert_eq!(tcp_cluster(fallthrough), "PassthroughCluster");

    // The route table ends with istiod's catch-all to the original destination.
    let rc = rds(&mesh(), &proxy(), "9080");
    assert_eq!(
        vhost_names(&rc),
        ["reviews.default.svc.cluster.local:9080", "allow_any"]
    );
    let any = rc.virtual_hosts.last().unwrap();
    assert_eq!(any.domains, ["*"]);
    match &any.routes[0].action {
        Some(Action::Route(r)) => {
            assert_eq!(
                r.cluster_specifier,
                Some(ClusterSpecifier::Cluster("PassthroughCluster".into()))
            );
            #[allow(deprecated)]
            let grpc = r.max_grpc_timeout.map(|d| (d.seconds, d.nanos));
            assert_eq!(
                grpc,
                Some((0, 0)),
                "istiod's catch-all honours grpc-timeout"
            );
        }
        other => panic!("{other:?}"),
    }
    let reviews = &rc.virtual_hosts[0];
    assert!(rc.ignore_port_in_host_matching);
    for d in ["reviews", "reviews.default", "10.96.0.10"] {
        assert!(
            reviews.domains.contains(&d.to_string()),
            "{d}: {:?}",
            reviews.domains
        );
    }
}

#[test]
fn tcp_ports_listen_on_the_vip_with_tcp_proxy() {
    let l = &lds(&mesh(), &proxy())["10.96.0.11_3306"];
    assert_eq!(socket(l.address.as_ref().unwrap()), "10.96.0.11:3306");
    assert_eq!(l.filter_chains.len(), 1);
    assert!(l.default_filter_chain.is_none());
    assert!(l.listener_filters.is_empty());
    assert_eq!(
        tcp_cluster(&l.filter_chains[0]),
        "outbound|3306||mysql.default.svc.cluster.local"
    );
}

#[test]
fn ports_without_a_protocol_are_sniffed() {
    let l = &lds(&mesh(), &proxy())["10.96.0.12_7000"];
    assert_eq!(l.filter_chains.len(), 1);
    assert_eq!(
        rds_of(&l.filter_chains[0]),
        "cache.default.svc.cluster.local:7000"
    );
    assert_eq!(
        tcp_cluster(l.default_filter_chain.as_ref().unwrap()),
        "outbound|7000||cache.default.svc.cluster.local"
    );
    let rc = rds(&mesh(), &proxy(), "cache.default.svc.cluster.local:7000");
    assert_eq!(
        vhost_names(&rc),
        ["cache.default.svc.cluster.local:7000", "allow_any"]
    );
}

#[test]
fn headless_tcp_services_forward_to_the_original_destination() {
    let l = &lds(&mesh(), &proxy())["0.0.0.0_5432"];
    assert_eq!(
        tcp_cluster(&l.filter_chains[0]),
        "outbound|5432||db-headless.default.svc.cluster.local"
    );
    let c = &cds(&mesh(), &proxy())["outbound|5432||db-headless.default.svc.cluster.local"];
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32
        ))
    );
    assert_eq!(c.lb_policy, LbPolicy::ClusterProvided as i32);
    // An uncaptured proxy has no original destination to forward to: it keeps EDS.
    let plain = sidecar_proxy("default", &[]);
    let c = &cds(&mesh(), &plain)["outbound|5432||db-headless.default.svc.cluster.local"];
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
}

#[test]
fn virtual_inbound_has_a_chain_per_target_port_and_passthrough() {
    let l = &lds(&mesh(), &proxy())["virtualInbound"];
    assert_eq!(socket(l.address.as_ref().unwrap()), "0.0.0.0:15006");
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.original_dst"
    );
    // PERMISSIVE (no PeerAuthentication): each port and the passthrough have an mTLS and
    // a plaintext chain of one name.
    let mut names: Vec<&str> = l.filter_chains.iter().map(|c| c.name.as_str()).collect();
    names.dedup();
    // Service port 80 targets 9080; the named targetPort `admin` resolves through POD_PORTS.
    assert_eq!(
        names,
        [
            "virtualInbound-blackhole",
            "0.0.0.0_9080",
            "0.0.0.0_9901",
            "virtualInbound-catchall-http",
            "virtualInbound",
        ]
    );
    let http = chain(l, "0.0.0.0_9080");
    assert_eq!(
        http.filter_chain_match
            .as_ref()
            .unwrap()
            .destination_port
            .unwrap()
            .value,
        9080
    );
    let hcm = chain_hcm(http);
    assert_eq!(hcm.stat_prefix, "inbound_0.0.0.0_9080");
    let Some(RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier else {
        panic!("inbound routes are inline");
    };
    assert_eq!(rc.name, "inbound|9080||");
    assert_eq!(rc.virtual_hosts[0].name, "inbound|http|9080");
    match &rc.virtual_hosts[0].routes[0].action {
        Some(Action::Route(r)) => {
            assert_eq!(
                r.cluster_specifier,
                Some(ClusterSpecifier::Cluster("inbound|9080||".into()))
            );
            // istiod's `BuildDefaultHTTPInboundRoute`: no stream limit, grpc-timeout
            // honoured uncapped.
            let msd = r.max_stream_duration.as_ref().expect("max_stream_duration");
            let zero = |d: Option<&shoal_proto::pb::google::protobuf::Duration>| {
                d.map(|d| (d.seconds, d.nanos))
            };
            assert_eq!(zero(msd.max_stream_duration.as_ref()), Some((0, 0)));
            assert_eq!(zero(msd.grpc_timeout_header_max.as_ref()), Some((0, 0)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        tcp_cluster(chain(l, "virtualInbound")),
        "InboundPassthroughCluster"
    );
    assert_eq!(
        tcp_cluster(chain(l, "virtualInbound-blackhole")),
        "BlackHoleCluster"
    );
}

#[test]
fn inbound_clusters_bind_127_0_0_6_and_forward_to_the_original_destination() {
    let c = cds(&mesh(), &proxy());
    for name in [
        "inbound|9080||",
        "inbound|9901||",
        "InboundPassthroughCluster",
    ] {
        let cl = &c[name];
        assert_eq!(
            cl.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32
            )),
            "{name}"
        );
        let bind = cl.upstream_bind_config.as_ref().expect(name);
        assert_eq!(bind.source_address.as_ref().unwrap().address, "127.0.0.6");
    }
    // The gRPC port speaks HTTP/2 to the app.
    assert!(!c["inbound|9901||"]
        .typed_extension_protocol_options
        .is_empty());
    assert!(c["inbound|9080||"]
        .typed_extension_protocol_options
        .is_empty());
}

#[test]
fn sidecar_ingress_replaces_service_ports() {
    let m = mesh().with_config(sidecar(
        "default",
        "pp",
        r#"
workloadSelector: {labels: {app: productpage}}
ingress:
- port: {number: 9999, protocol: TCP, name: tcp-custom}
  defaultEndpoint: 127.0.0.1:8000
"#,
    ));
    let l = &lds(&m, &proxy())["virtualInbound"];
    // PERMISSIVE (no PeerAuthentication): each port and the passthrough have an mTLS and
    // a plaintext chain of one name.
    let mut names: Vec<&str> = l.filter_chains.iter().map(|c| c.name.as_str()).collect();
    names.dedup();
    assert_eq!(
        names,
        [
            "virtualInbound-blackhole",
            "0.0.0.0_9999",
            "virtualInbound-catchall-http",
            "virtualInbound",
        ]
    );
    let c = &cds(&m, &proxy())["inbound|9999||"];
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32))
    );
    let cla = c.load_assignment.as_ref().unwrap();
    assert_eq!(cla_addresses(cla), [["127.0.0.1:8000"]]);
}

#[test]
fn tcp_virtual_services_split_by_weight_and_match_subnets() {
    let m = mesh().with_config(virtual_service(
        "default",
        "mysql",
        r#"
hosts: [mysql]
tcp:
- match: [{destinationSubnets: [10.96.0.11/32], sourceLabels: {app: other}}]
  route: [{destination: {host: reviews, port: {number: 9080}}}]
- route:
  - {destination: {host: mysql, subset: v1}, weight: 80}
  - {destination: {host: mysql, subset: v2}, weight: 20}
"#,
    ));
    let l = &lds(&m, &proxy())["10.96.0.11_3306"];
    // The first rule's match is for another workload; the second takes every connection.
    assert_eq!(l.filter_chains.len(), 1);
    let tp: TcpProxy = typed(l.filter_chains[0].filters.last().unwrap());
    let Some(TcpCluster::WeightedClusters(w)) = tp.cluster_specifier else {
        panic!("expected weighted clusters");
    };
    let split: Vec<(String, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.weight))
        .collect();
    assert_eq!(
        split,
        [
            (
                "outbound|3306|v1|mysql.default.svc.cluster.local".to_string(),
                80
            ),
            (
                "outbound|3306|v2|mysql.default.svc.cluster.local".to_string(),
                20
            ),
        ]
    );

    // From the matching workload: a subnet chain first, then the weighted default.
    let mut other = proxy();
    other.labels = labels(&[("app", "other")]);
    let l = &lds(&m, &other)["10.96.0.11_3306"];
    assert_eq!(l.filter_chains.len(), 1);
    let m0 = l.filter_chains[0].filter_chain_match.as_ref().unwrap();
    assert_eq!(m0.prefix_ranges[0].address_prefix, "10.96.0.11");
    assert_eq!(
        tcp_cluster(&l.filter_chains[0]),
        "outbound|9080||reviews.default.svc.cluster.local"
    );
    assert!(l.default_filter_chain.is_some());
}

#[test]
fn uncaptured_sidecars_get_no_capture_listeners() {
    let l = lds(
        &mesh(),
        &sidecar_proxy("default", &[("app", "productpage")]),
    );
    assert!(l.is_empty(), "{:?}", l.keys().collect::<Vec<_>>());
    let c = cds(
        &mesh(),
        &sidecar_proxy("default", &[("app", "productpage")]),
    );
    assert!(!c.contains_key("InboundPassthroughCluster"));
    assert!(!c.keys().any(|n| n.starts_with("inbound|")));
    let rc = rds(&mesh(), &sidecar_proxy("default", &[]), "9080");
    assert!(!vhost_names(&rc).contains(&"allow_any"));
}

#[test]
fn a_workload_without_services_passes_inbound_traffic_through() {
    let p = captured_proxy("default", "10.1.0.9", &[("app", "nobody-selects-me")]);
    let l = &lds(&mesh(), &p)["virtualInbound"];
    // PERMISSIVE (no PeerAuthentication): each port and the passthrough have an mTLS and
    // a plaintext chain of one name.
    let mut names: Vec<&str> = l.filter_chains.iter().map(|c| c.name.as_str()).collect();
    names.dedup();
    assert_eq!(
        names,
        [
            "virtualInbound-blackhole",
            "virtualInbound-catchall-http",
            "virtualInbound"
        ]
    );
    // The TLS and HTTP inspectors run on every port but 15006 (the blackhole needs
    // neither), as istiod enables them.
    let names: Vec<&str> = l.listener_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.listener.original_dst",
            "envoy.filters.listener.tls_inspector",
            "envoy.filters.listener.http_inspector"
        ]
    );
    for f in &l.listener_filters[1..] {
        assert_eq!(
            f.filter_disabled,
            Some(ListenerFilterChainMatchPredicate {
                rule: Some(Rule::DestinationPortRange(Int32Range {
                    start: 15006,
                    end: 15007
                }))
            })
        );
    }
}

#[test]
fn tcp_listeners_use_the_proxys_own_cluster_vip() {
    let mut east = service("default", "mysql", &[("tcp-mysql", 3306)]);
    east.cluster = "east".into();
    east.cluster_ips = vec!["10.200.0.11".into()];
    let m = mesh().with_service(east);
    let here = lds(&m, &proxy());
    assert!(here.contains_key("10.96.0.11_3306"));
    assert!(!here.contains_key("10.200.0.11_3306"));
    let mut p = proxy();
    p.cluster_id = "east".into();
    let there = lds(&m, &p);
    assert!(there.contains_key("10.200.0.11_3306"));
    assert!(!there.contains_key("10.96.0.11_3306"));
    // Both ClusterIPs reach the service by HTTP-style domains elsewhere; the cluster is one.
    assert!(cds(&m, &p).contains_key("outbound|3306||mysql.default.svc.cluster.local"));
}

#[test]
fn tls_virtual_services_route_by_sni() {
    let mut api = service("default", "api", &[("https", 443)]);
    api.cluster_ips = vec!["10.96.0.20".into()];
    let m = mesh().with_service(api).with_config(virtual_service(
        "default",
        "api",
        r#"
hosts: [api]
tls:
- match: [{sniHosts: [api.default.svc.cluster.local], port: 443}]
  route: [{destination: {host: api, subset: v2}}]
"#,
    ));
    let l = &lds(&m, &proxy())["10.96.0.20_443"];
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
    let sni = l
        .filter_chains
        .iter()
        .find(|c| {
            c.filter_chain_match
                .as_ref()
                .is_some_and(|m| m.server_names == ["api.default.svc.cluster.local"])
        })
        .expect("an SNI chain");
    assert_eq!(
        tcp_cluster(sni),
        "outbound|443|v2|api.default.svc.cluster.local"
    );
    // Other TLS traffic to the VIP keeps the service's own cluster.
    assert_eq!(
        tcp_cluster(l.default_filter_chain.as_ref().unwrap()),
        "outbound|443||api.default.svc.cluster.local"
    );
}
