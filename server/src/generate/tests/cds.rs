//! CDS: cluster names, discovery types, load-balancer policy, protocol options, and what a
//! proxy may see (Sidecar egress hosts, exportTo).

use crate::testutil::*;
use shoal_proto::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType, LbPolicy},
    Cluster,
};
use shoal_proto::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use shoal_proto::XdsType;
use std::collections::BTreeMap;

const HTTP2_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

fn cds(mesh: &Mesh, proxy: &crate::index::proxy::Proxy) -> BTreeMap<String, Cluster> {
    clusters(&gen(XdsType::Cluster, proxy, &mesh.snapshot(), &[]))
}

fn discovery_type(c: &Cluster) -> DiscoveryType {
    match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => DiscoveryType::try_from(t).expect("known type"),
        ref other => panic!("{}: unexpected discovery type {other:?}", c.name),
    }
}

fn lb(c: &Cluster) -> LbPolicy {
    LbPolicy::try_from(c.lb_policy).expect("known lb policy")
}

fn names(cs: &BTreeMap<String, Cluster>) -> Vec<&str> {
    cs.keys().map(String::as_str).collect()
}

/// The service clusters only (without BlackHoleCluster and PassthroughCluster).
fn outbound(cs: &BTreeMap<String, Cluster>) -> Vec<&str> {
    cs.keys()
        .map(String::as_str)
        .filter(|n| n.starts_with("outbound|"))
        .collect()
}

fn reviews_mesh() -> Mesh {
    Mesh::new()
        .with_service(service(
            "default",
            "reviews",
            &[("http", 9080), ("grpc-api", 9090)],
        ))
        .with_config(destination_rule(
            "default",
            "reviews",
            r#"
host: reviews
subsets:
- name: v1
  labels: {version: v1}
- name: v2
  labels: {version: v2}
"#,
        ))
}

#[test]
fn a_cluster_per_service_port_and_per_subset() {
    let cs = cds(&reviews_mesh(), &sidecar_proxy("default", &[]));
    assert_eq!(
        names(&cs),
        [
            "BlackHoleCluster",
            "PassthroughCluster",
            "outbound|9080|v1|reviews.default.svc.cluster.local",
            "outbound|9080|v2|reviews.default.svc.cluster.local",
            "outbound|9080||reviews.default.svc.cluster.local",
            "outbound|9090|v1|reviews.default.svc.cluster.local",
            "outbound|9090|v2|reviews.default.svc.cluster.local",
            "outbound|9090||reviews.default.svc.cluster.local",
        ]
    );
    for (name, c) in &cs {
        assert_eq!(&c.name, name);
        assert!(c.connect_timeout.is_some(), "{name}");
    }
}

#[test]
fn fixed_clusters() {
    let cs = cds(&Mesh::new(), &sidecar_proxy("default", &[]));
    assert_eq!(names(&cs), ["BlackHoleCluster", "PassthroughCluster"]);
    assert_eq!(
        discovery_type(&cs["BlackHoleCluster"]),
        DiscoveryType::Static
    );
    let pt = &cs["PassthroughCluster"];
    assert_eq!(discovery_type(pt), DiscoveryType::OriginalDst);
    assert_eq!(lb(pt), LbPolicy::ClusterProvided);
    assert_passthrough_http_options(pt);
    let captured = cds(&Mesh::new(), &captured_proxy("default", "10.1.0.9", &[]));
    assert_passthrough_http_options(&captured["InboundPassthroughCluster"]);
}

/// istiod's `passthroughHttpProtocolOptions`: the downstream's protocol upstream (h2c and
/// gRPC to a host outside the registry stay HTTP/2), a 300 s idle timeout.
fn assert_passthrough_http_options(c: &Cluster) {
    use prost::Message;
    use shoal_proto::pb::envoy::extensions::upstreams::http::v3::{
        http_protocol_options::UpstreamProtocolOptions, HttpProtocolOptions,
    };
    let any = &c.typed_extension_protocol_options[HTTP2_OPTIONS];
    let o = HttpProtocolOptions::decode(&*any.value).expect("HttpProtocolOptions");
    let idle = o.common_http_protocol_options.and_then(|c| c.idle_timeout);
    assert_eq!(
        idle.map(|d| (d.seconds, d.nanos)),
        Some((300, 0)),
        "{}",
        c.name
    );
    match o.upstream_protocol_options {
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(d)) => {
            assert!(d.http_protocol_options.is_some(), "{}", c.name);
            assert!(d.http2_protocol_options.is_some(), "{}", c.name);
        }
        other => panic!("{}: {other:?}", c.name),
    }
}

#[test]
fn kubernetes_services_use_eds_over_ads() {
    let cs = cds(&reviews_mesh(), &sidecar_proxy("default", &[]));
    for name in outbound(&cs) {
        let c = &cs[name];
        assert_eq!(discovery_type(c), DiscoveryType::Eds, "{name}");
        let eds = c.eds_cluster_config.as_ref().expect("eds config");
        assert_eq!(eds.service_name, name);
        let source = eds.eds_config.as_ref().expect("eds_config");
        assert!(
            matches!(
                source.config_source_specifier,
                Some(ConfigSourceSpecifier::Ads(_))
            ),
            "{name}: {source:?}"
        );
        assert!(c.load_assignment.is_none(), "{name}");
    }
}

#[test]
fn static_service_entries_use_eds() {
    let mesh = Mesh::new().with_config(service_entry(
        "default",
        "db",
        r#"
hosts: [db.internal]
ports: [{number: 5432, name: tcp, protocol: TCP}]
resolution: STATIC
endpoints: [{address: 10.0.0.1}]
"#,
    ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let c = &cs["outbound|5432||db.internal"];
    assert_eq!(discovery_type(c), DiscoveryType::Eds);
    assert_eq!(
        c.eds_cluster_config.as_ref().unwrap().service_name,
        "outbound|5432||db.internal"
    );
}

#[test]
fn dns_service_entries_use_strict_dns_with_inline_endpoints() {
    let mesh = Mesh::new().with_config(service_entry(
        "default",
        "ext",
        r#"
hosts: [api.example.com]
ports:
- {number: 80, name: http, protocol: HTTP}
- {number: 443, name: https, protocol: HTTPS, targetPort: 8443}
resolution: DNS
endpoints:
- address: b.example.com
  ports: {http: 8080}
- address: a.example.com
"#,
    ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let http = &cs["outbound|80||api.example.com"];
    assert_eq!(discovery_type(http), DiscoveryType::StrictDns);
    assert!(http.eds_cluster_config.is_none());
    let cla = http.load_assignment.as_ref().expect("inline endpoints");
    assert_eq!(cla.cluster_name, "outbound|80||api.example.com");
    // By port name, else the port number.
    assert_eq!(
        cla_addresses(cla),
        [["a.example.com:80", "b.example.com:8080"]]
    );
    // No port of that name: the targetPort.
    let https = &cs["outbound|443||api.example.com"];
    assert_eq!(
        cla_addresses(https.load_assignment.as_ref().unwrap()),
        [["a.example.com:8443", "b.example.com:8443"]]
    );
}

#[test]
fn dns_service_entry_without_endpoints_resolves_its_host() {
    let mesh = Mesh::new().with_config(service_entry(
        "default",
        "ext",
        r#"
hosts: [api.example.com]
ports: [{number: 443, name: tls, protocol: TLS}]
resolution: DNS
"#,
    ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let c = &cs["outbound|443||api.example.com"];
    assert_eq!(discovery_type(c), DiscoveryType::StrictDns);
    assert_eq!(
        cla_addresses(c.load_assignment.as_ref().unwrap()),
        [["api.example.com:443"]]
    );
}

#[test]
fn dns_round_robin_is_logical_dns_with_one_address() {
    let mesh = Mesh::new().with_config(service_entry(
        "default",
        "ext",
        r#"
hosts: [api.example.com]
ports: [{number: 80, name: http, protocol: HTTP}]
resolution: DNS_ROUND_ROBIN
endpoints: [{address: b.example.com}, {address: a.example.com}]
"#,
    ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let c = &cs["outbound|80||api.example.com"];
    assert_eq!(discovery_type(c), DiscoveryType::LogicalDns);
    assert_eq!(
        cla_addresses(c.load_assignment.as_ref().unwrap()),
        [["a.example.com:80"]]
    );
}

#[test]
fn dns_subset_clusters_hold_only_the_subset() {
    let mesh = Mesh::new()
        .with_config(service_entry(
            "default",
            "ext",
            r#"
hosts: [api.example.com]
ports: [{number: 80, name: http, protocol: HTTP}]
resolution: DNS
endpoints:
- {address: a.example.com, labels: {version: v1}}
- {address: b.example.com, labels: {version: v2}}
"#,
        ))
        .with_config(destination_rule(
            "default",
            "ext",
            r#"
host: api.example.com
subsets:
- {name: v2, labels: {version: v2}}
- {name: v3, labels: {version: v3}}
"#,
        ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let addrs = |n: &str| cla_addresses(cs[n].load_assignment.as_ref().unwrap());
    assert_eq!(
        addrs("outbound|80||api.example.com"),
        [["a.example.com:80", "b.example.com:80"]]
    );
    assert_eq!(
        addrs("outbound|80|v2|api.example.com"),
        [["b.example.com:80"]]
    );
    assert_eq!(
        addrs("outbound|80|v3|api.example.com"),
        [Vec::<String>::new()]
    );
}

#[test]
fn resolution_none_is_original_dst() {
    let mesh = Mesh::new().with_config(service_entry(
        "default",
        "ext",
        r#"
hosts: [wiki.example.com]
ports: [{number: 80, name: http, protocol: HTTP}]
"#,
    ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let c = &cs["outbound|80||wiki.example.com"];
    assert_eq!(discovery_type(c), DiscoveryType::OriginalDst);
    assert_eq!(lb(c), LbPolicy::ClusterProvided);
    assert!(c.eds_cluster_config.is_none());
}

#[test]
fn lb_policy_from_destination_rule() {
    let mesh = Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_service(service("default", "ratings", &[("http", 9080)]))
        .with_service(service("default", "details", &[("http", 9080)]))
        .with_config(destination_rule(
            "default",
            "reviews",
            r#"
host: reviews.default.svc.cluster.local
trafficPolicy:
  loadBalancer: {simple: ROUND_ROBIN}
subsets:
- name: random
  labels: {version: v1}
  trafficPolicy:
    loadBalancer: {simple: RANDOM}
- name: inherits
  labels: {version: v2}
- name: empty-policy
  labels: {version: v3}
  trafficPolicy: {}
"#,
        ))
        .with_config(destination_rule(
            "default",
            "ratings",
            r#"
host: ratings
trafficPolicy:
  loadBalancer: {simple: LEAST_CONN}
"#,
        ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let policy = |n: &str| lb(&cs[n]);
    let reviews = "reviews.default.svc.cluster.local";
    assert_eq!(
        policy(&format!("outbound|9080||{reviews}")),
        LbPolicy::RoundRobin
    );
    assert_eq!(
        policy(&format!("outbound|9080|random|{reviews}")),
        LbPolicy::Random
    );
    assert_eq!(
        policy(&format!("outbound|9080|inherits|{reviews}")),
        LbPolicy::RoundRobin
    );
    // Istio merges subset policies field by field: no load balancer keeps the rule's.
    assert_eq!(
        policy(&format!("outbound|9080|empty-policy|{reviews}")),
        LbPolicy::RoundRobin
    );
    // LEAST_CONN is Envoy's least request; no rule at all is Istio's default, least request.
    assert_eq!(
        policy("outbound|9080||ratings.default.svc.cluster.local"),
        LbPolicy::LeastRequest
    );
    assert_eq!(
        policy("outbound|9080||details.default.svc.cluster.local"),
        LbPolicy::LeastRequest
    );
}

#[test]
fn http2_options_for_grpc_and_http2_ports_only() {
    let mesh = Mesh::new().with_service(service(
        "default",
        "api",
        &[
            ("http", 80),
            ("grpc", 9000),
            ("http2-x", 9001),
            ("tcp", 9002),
        ],
    ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let has_h2 = |port: u16| {
        let c = &cs[&format!("outbound|{port}||api.default.svc.cluster.local")];
        c.typed_extension_protocol_options
            .contains_key(HTTP2_OPTIONS)
    };
    assert!(!has_h2(80));
    assert!(has_h2(9000));
    assert!(has_h2(9001));
    assert!(!has_h2(9002));
    let c = &cs["outbound|9000||api.default.svc.cluster.local"];
    assert_eq!(c.typed_extension_protocol_options.len(), 1);
    assert_eq!(
        c.typed_extension_protocol_options[HTTP2_OPTIONS].type_url,
        format!("type.googleapis.com/{HTTP2_OPTIONS}")
    );
}

fn three_namespaces() -> Mesh {
    Mesh::new()
        .with_service(service("a", "one", &[("http", 80)]))
        .with_service(service("a", "two", &[("http", 80)]))
        .with_service(service("b", "one", &[("http", 80)]))
        .with_service(service("b", "two", &[("http", 80)]))
        .with_service(service("c", "one", &[("http", 80)]))
}

#[test]
fn without_sidecar_every_exported_service_is_visible() {
    let cs = cds(&three_namespaces(), &sidecar_proxy("a", &[]));
    assert_eq!(outbound(&cs).len(), 5);
}

#[test]
fn sidecar_egress_hosts_narrow_what_is_visible() {
    let mesh = three_namespaces().with_config(sidecar(
        "a",
        "default",
        r#"
egress:
- hosts: ["./*", "b/two.b.svc.cluster.local", "*/one.c.svc.cluster.local"]
"#,
    ));
    let cs = cds(&mesh, &sidecar_proxy("a", &[]));
    assert_eq!(
        outbound(&cs),
        [
            "outbound|80||one.a.svc.cluster.local",
            "outbound|80||one.c.svc.cluster.local",
            "outbound|80||two.a.svc.cluster.local",
            "outbound|80||two.b.svc.cluster.local",
        ]
    );
    // A gateway is never narrowed by Sidecars.
    let gw = cds(&mesh, &router_proxy("a", &[]));
    assert_eq!(outbound(&gw).len(), 5);
}

#[test]
fn sidecar_namespace_wildcard_and_union_of_listeners() {
    let mesh = three_namespaces().with_config(sidecar(
        "a",
        "default",
        r#"
egress:
- port: {number: 9080, protocol: HTTP, name: http}
  hosts: ["c/*"]
- hosts: ["b/*"]
"#,
    ));
    let cs = cds(&mesh, &sidecar_proxy("a", &[]));
    assert_eq!(
        outbound(&cs),
        [
            "outbound|80||one.b.svc.cluster.local",
            "outbound|80||one.c.svc.cluster.local",
            "outbound|80||two.b.svc.cluster.local",
        ]
    );
}

#[test]
fn sidecar_selection_prefers_workload_selector_then_namespace_then_root() {
    let mesh = three_namespaces()
        .with_config(sidecar(
            "a",
            "for-app",
            r#"
workloadSelector: {labels: {app: special}}
egress: [{hosts: ["c/*"]}]
"#,
        ))
        .with_config(sidecar("a", "default", "egress: [{hosts: [\"./*\"]}]"))
        .with_config(sidecar(
            "istio-system",
            "default",
            "egress: [{hosts: [\"b/*\"]}]",
        ));
    let special = cds(&mesh, &sidecar_proxy("a", &[("app", "special")]));
    assert_eq!(outbound(&special), ["outbound|80||one.c.svc.cluster.local"]);
    let plain = cds(&mesh, &sidecar_proxy("a", &[("app", "plain")]));
    assert_eq!(
        outbound(&plain),
        [
            "outbound|80||one.a.svc.cluster.local",
            "outbound|80||two.a.svc.cluster.local",
        ]
    );
    // No Sidecar in c: the root namespace's.
    let in_c = cds(&mesh, &sidecar_proxy("c", &[]));
    assert_eq!(
        outbound(&in_c),
        [
            "outbound|80||one.b.svc.cluster.local",
            "outbound|80||two.b.svc.cluster.local",
        ]
    );
}

#[test]
fn root_namespace_sidecar_dot_means_the_workload_namespace() {
    let mesh = three_namespaces().with_config(sidecar(
        "istio-system",
        "default",
        "egress: [{hosts: [\"./*\"]}]",
    ));
    let in_b = cds(&mesh, &sidecar_proxy("b", &[]));
    assert_eq!(
        outbound(&in_b),
        [
            "outbound|80||one.b.svc.cluster.local",
            "outbound|80||two.b.svc.cluster.local",
        ]
    );
}

#[test]
fn service_export_to_hides_services() {
    let mut mesh = Mesh::new();
    for (name, export) in [
        ("private", vec!["."]),
        ("public", vec!["*"]),
        ("hidden", vec!["~"]),
        ("to-b", vec!["b"]),
        ("to-c-and-self", vec!["c", "."]),
        ("default", vec![]),
    ] {
        let mut svc = service("a", name, &[("http", 80)]);
        svc.export_to = export.into_iter().map(String::from).collect();
        mesh.add_service(svc);
    }
    let seen = |ns: &str| -> Vec<String> {
        outbound(&cds(&mesh, &sidecar_proxy(ns, &[])))
            .iter()
            .map(|n| {
                n.split('|')
                    .nth(3)
                    .unwrap()
                    .split('.')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(seen("a"), ["default", "private", "public", "to-c-and-self"]);
    assert_eq!(seen("b"), ["default", "public", "to-b"]);
    assert_eq!(seen("c"), ["default", "public", "to-c-and-self"]);
    // Gateways obey exportTo too.
    let gw = outbound(&cds(&mesh, &router_proxy("istio-system", &[]))).len();
    assert_eq!(gw, 2);
}

#[test]
fn service_entry_export_to_hides_entries() {
    let mesh = Mesh::new()
        .with_config(service_entry(
            "a",
            "private",
            r#"
hosts: [private.example.com]
ports: [{number: 80, name: http, protocol: HTTP}]
resolution: DNS
exportTo: ["."]
"#,
        ))
        .with_config(service_entry(
            "a",
            "public",
            r#"
hosts: [public.example.com]
ports: [{number: 80, name: http, protocol: HTTP}]
resolution: DNS
"#,
        ));
    let in_a = cds(&mesh, &sidecar_proxy("a", &[]));
    assert_eq!(
        outbound(&in_a),
        [
            "outbound|80||private.example.com",
            "outbound|80||public.example.com",
        ]
    );
    let in_b = cds(&mesh, &sidecar_proxy("b", &[]));
    assert_eq!(outbound(&in_b), ["outbound|80||public.example.com"]);
}

#[test]
fn kubernetes_service_keeps_precedence_over_a_service_entry_of_the_same_host() {
    let mesh = Mesh::new()
        .with_service(service("a", "one", &[("http", 80)]))
        .with_config(service_entry(
            "a",
            "shadow",
            r#"
hosts: [one.a.svc.cluster.local]
ports: [{number: 8080, name: http, protocol: HTTP}]
resolution: DNS
"#,
        ));
    let cs = cds(&mesh, &sidecar_proxy("a", &[]));
    assert_eq!(outbound(&cs), ["outbound|80||one.a.svc.cluster.local"]);
    assert_eq!(
        discovery_type(&cs["outbound|80||one.a.svc.cluster.local"]),
        DiscoveryType::Eds
    );
}

#[test]
fn multicluster_service_merges_into_one_host() {
    let mut east = service("a", "one", &[("http", 80)]);
    east.cluster = "east".into();
    east.cluster_ips = vec!["10.96.0.2".into()];
    let mut west = service("a", "one", &[("http", 80)]);
    west.cluster_ips = vec!["10.96.0.1".into()];
    let mesh = Mesh::new().with_service(east).with_service(west);
    let snap = mesh.snapshot();
    let view = &snap.ctx.services["one.a.svc.cluster.local"];
    // Clusters merge in cluster-name order ("Kubernetes" < "east").
    assert_eq!(view.vips, ["10.96.0.1", "10.96.0.2"]);
    let cs = cds(&mesh, &sidecar_proxy("a", &[]));
    assert_eq!(outbound(&cs), ["outbound|80||one.a.svc.cluster.local"]);
}

#[test]
fn wildcard_destination_rules_apply_to_the_hosts_they_cover() {
    let entry = |name: &str, host: &str| {
        service_entry(
            "default",
            name,
            &format!(
                "hosts: [{host}]\nports: [{{number: 80, name: http, protocol: HTTP}}]\nresolution: STATIC\nendpoints: [{{address: 10.0.0.1, labels: {{v: one}}}}]"
            ),
        )
    };
    let dr = |name: &str, host: &str, lb: &str| {
        destination_rule(
            "default",
            name,
            &format!(
                "host: \"{host}\"\ntrafficPolicy: {{loadBalancer: {{simple: {lb}}}}}\nsubsets: [{{name: {name}, labels: {{v: one}}}}]"
            ),
        )
    };
    let mesh = Mesh::new()
        .with_config(entry("a", "a.example.com"))
        .with_config(entry("b", "b.eu.example.com"))
        .with_config(entry("c", "c.other.org"))
        .with_config(dr("broad", "*.example.com", "RANDOM"))
        .with_config(dr("narrow", "*.eu.example.com", "ROUND_ROBIN"));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    assert_eq!(lb(&cs["outbound|80||a.example.com"]), LbPolicy::Random);
    assert_eq!(
        lb(&cs["outbound|80||b.eu.example.com"]),
        LbPolicy::RoundRobin
    );
    assert_eq!(lb(&cs["outbound|80||c.other.org"]), LbPolicy::LeastRequest);
    assert!(cs.contains_key("outbound|80|broad|a.example.com"));
    assert!(cs.contains_key("outbound|80|narrow|b.eu.example.com"));
    assert!(!cs.contains_key("outbound|80|broad|b.eu.example.com"));
    // EDS finds the subset through the same rule.
    let cla = load_assignments(&gen(
        XdsType::Endpoint,
        &sidecar_proxy("default", &[]),
        &mesh.snapshot(),
        &["outbound|80|narrow|b.eu.example.com"],
    ));
    assert_eq!(
        cla_addresses(&cla["outbound|80|narrow|b.eu.example.com"]),
        [["10.0.0.1:80"]]
    );
}
