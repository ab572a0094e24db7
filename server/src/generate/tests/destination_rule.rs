//! DestinationRule: which rule applies to a proxy (namespaces, exportTo, workloadSelector,
//! merging), and the traffic policy on its clusters, checked against what istiod emits.

use crate::testutil::*;
use prost::Message;
use shoal_proto::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType, LbConfig, LbPolicy},
    Cluster,
};
use shoal_proto::pb::envoy::config::core::v3::transport_socket::ConfigType;
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::ValidationContextType, UpstreamTlsContext,
};
use shoal_proto::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::UpstreamProtocolOptions, HttpProtocolOptions,
};
use shoal_proto::XdsType;
use std::collections::BTreeMap;

const HOST: &str = "reviews.default.svc.cluster.local";

fn cds(mesh: &Mesh, proxy: &crate::index::proxy::Proxy) -> BTreeMap<String, Cluster> {
    clusters(&gen(XdsType::Cluster, proxy, &mesh.snapshot(), &[]))
}

fn mesh_with(rules: &[(&str, &str, &str)]) -> Mesh {
    let mut mesh = Mesh::new().with_service(service("default", "reviews", &[("http", 9080)]));
    for (ns, name, yaml) in rules {
        mesh.add_config(destination_rule(ns, name, yaml));
    }
    mesh
}

fn name(subset: &str) -> String {
    format!("outbound|9080|{subset}|{HOST}")
}

fn lb(c: &Cluster) -> LbPolicy {
    LbPolicy::try_from(c.lb_policy).unwrap()
}

fn discovery(c: &Cluster) -> DiscoveryType {
    match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => DiscoveryType::try_from(t).unwrap(),
        _ => panic!("no discovery type"),
    }
}

fn http_options(c: &Cluster) -> HttpProtocolOptions {
    let any = &c.typed_extension_protocol_options
        ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    HttpProtocolOptions::decode(any.value.as_slice()).unwrap()
}

fn thresholds(c: &Cluster) -> [u32; 4] {
    let t = &c
        .circuit_breakers
        .as_ref()
        .expect("circuit breakers")
        .thresholds[0];
    assert!(!t.track_remaining, "{}", c.name);
    [
        t.max_connections.unwrap().value,
        t.max_pending_requests.unwrap().value,
        t.max_requests.unwrap().value,
        t.max_retries.unwrap().value,
    ]
}

const MAX: u32 = u32::MAX;

#[test]
fn every_outbound_cluster_has_istios_default_circuit_breakers() {
    let mesh = mesh_with(&[(
        "default",
        "reviews",
        "host: reviews\nsubsets: [{name: v1, labels: {version: v1}}]",
    )]);
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    for n in [name(""), name("v1"), "PassthroughCluster".to_string()] {
        assert_eq!(thresholds(&cs[&n]), [MAX; 4], "{n}");
    }
    // No rule at all: the same defaults.
    let cs = cds(&mesh_with(&[]), &sidecar_proxy("default", &[]));
    assert_eq!(thresholds(&cs[&name("")]), [MAX; 4]);
    assert_eq!(lb(&cs[&name("")]), LbPolicy::LeastRequest);
}

#[test]
fn connection_pool_as_istiod_maps_it() {
    let mesh = mesh_with(&[(
        "default",
        "reviews",
        r#"
host: reviews
trafficPolicy:
  connectionPool:
    tcp: {maxConnections: 100, connectTimeout: 30ms, maxConnectionDuration: 1h,
          tcpKeepalive: {probes: 3, time: 7200s, interval: 75s}}
    http: {http1MaxPendingRequests: 10, http2MaxRequests: 200, maxRequestsPerConnection: 1,
           maxRetries: 5, idleTimeout: 1m, h2UpgradePolicy: UPGRADE, maxConcurrentStreams: 7}
subsets:
- name: v1
  labels: {version: v1}
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 1}}}
"#,
    )]);
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let c = &cs[&name("")];
    assert_eq!(thresholds(c), [100, 10, 200, 5]);
    let ct = c.connect_timeout.unwrap();
    assert_eq!((ct.seconds, ct.nanos), (0, 30_000_000));
    let ka = c
        .upstream_connection_options
        .as_ref()
        .unwrap()
        .tcp_keepalive
        .unwrap();
    assert_eq!(ka.keepalive_probes.unwrap().value, 3);
    assert_eq!(ka.keepalive_time.unwrap().value, 7200);
    assert_eq!(ka.keepalive_interval.unwrap().value, 75);
    let o = http_options(c);
    let common = o.common_http_protocol_options.unwrap();
    assert_eq!(common.idle_timeout.unwrap().seconds, 60);
    assert_eq!(common.max_requests_per_connection.unwrap().value, 1);
    assert_eq!(common.max_connection_duration.unwrap().seconds, 3600);
    // h2UpgradePolicy: UPGRADE makes the HTTP/1.1 port speak HTTP/2, with the stream limit.
    match o.upstream_protocol_options {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(e)) => match e.protocol_config {
            Some(
                shoal_proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(h2),
            ) => assert_eq!(h2.max_concurrent_streams.unwrap().value, 7),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    // A subset's connection pool replaces the rule's as a whole (istiod's MergeTrafficPolicy):
    // the HTTP limits fall back to the defaults.
    assert_eq!(thresholds(&cs[&name("v1")]), [1, MAX, MAX, MAX]);
    assert_eq!(cs[&name("v1")].connect_timeout.unwrap().seconds, 10);
}

/// The circuit-breaking task's rule sets only common HTTP options: the cluster gets explicit
/// HTTP/1.1 (Envoy refuses HttpProtocolOptions without `upstream_protocol_options`), as
/// istiod's `clusterWrapper.build` fills it in.
#[test]
fn common_http_options_alone_get_explicit_http1() {
    let mesh = mesh_with(&[(
        "default",
        "reviews",
        r#"
host: reviews
trafficPolicy:
  connectionPool:
    tcp: {maxConnections: 1}
    http: {http1MaxPendingRequests: 1, maxRequestsPerConnection: 1}
"#,
    )]);
    let c = &cds(&mesh, &sidecar_proxy("default", &[]))[&name("")];
    assert_eq!(thresholds(c), [1, 1, MAX, MAX]);
    let o = http_options(c);
    assert_eq!(
        o.common_http_protocol_options
            .and_then(|c| c.max_requests_per_connection)
            .map(|v| v.value),
        Some(1)
    );
    match o.upstream_protocol_options {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(e)) => assert!(matches!(
            e.protocol_config,
            Some(
                shoal_proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig::HttpProtocolOptions(_),
            )
        )),
        other => panic!("{other:?}"),
    }
}

#[test]
fn use_client_protocol() {
    let mesh = mesh_with(&[(
        "default",
        "reviews",
        "host: reviews\ntrafficPolicy: {connectionPool: {http: {useClientProtocol: true, h2UpgradePolicy: UPGRADE}}}",
    )]);
    let c = &cds(&mesh, &sidecar_proxy("default", &[]))[&name("")];
    let o = http_options(c);
    assert!(matches!(
        o.upstream_protocol_options,
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(ref d))
            if d.http_protocol_options.is_some() && d.http2_protocol_options.is_some()
    ));
}

#[test]
fn outlier_detection_as_istiod_maps_it() {
    let mesh = mesh_with(&[(
        "default",
        "reviews",
        r#"
host: reviews
trafficPolicy:
  outlierDetection: {consecutive5xxErrors: 3, consecutiveGatewayErrors: 0, interval: 1s,
                     baseEjectionTime: 30s, maxEjectionPercent: 50,
                     splitExternalLocalOriginErrors: true, consecutiveLocalOriginFailures: 4}
subsets:
- {name: v1, labels: {version: v1}, trafficPolicy: {outlierDetection: {consecutive5xxErrors: 1, minHealthPercent: 25}}}
"#,
    )]);
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let c = &cs[&name("")];
    let od = c.outlier_detection.as_ref().unwrap();
    assert_eq!(od.consecutive_5xx.unwrap().value, 3);
    assert_eq!(od.enforcing_consecutive_5xx.unwrap().value, 100);
    assert_eq!(od.consecutive_gateway_failure.unwrap().value, 0);
    assert_eq!(od.enforcing_consecutive_gateway_failure.unwrap().value, 0);
    assert_eq!(od.enforcing_success_rate.unwrap().value, 0);
    assert_eq!(od.interval.unwrap().seconds, 1);
    assert_eq!(od.base_ejection_time.unwrap().seconds, 30);
    assert_eq!(od.max_ejection_percent.unwrap().value, 50);
    assert!(od.split_external_local_origin_errors);
    assert_eq!(od.consecutive_local_origin_failure.unwrap().value, 4);
    assert_eq!(
        od.enforcing_consecutive_local_origin_failure.unwrap().value,
        100
    );
    assert_eq!(od.enforcing_local_origin_success_rate.unwrap().value, 0);
    // istiod sets the panic threshold to minHealthPercent, 0 when unset.
    let panic = |c: &Cluster| {
        c.common_lb_config
            .as_ref()
            .unwrap()
            .healthy_panic_threshold
            .unwrap()
            .value
    };
    assert_eq!(panic(c), 0.0);
    let v1 = &cs[&name("v1")];
    assert_eq!(panic(v1), 25.0);
    assert_eq!(
        v1.outlier_detection
            .as_ref()
            .unwrap()
            .consecutive_5xx
            .unwrap()
            .value,
        1
    );
    assert!(v1.outlier_detection.as_ref().unwrap().interval.is_none());
}

#[test]
fn load_balancers() {
    let mesh = mesh_with(&[(
        "default",
        "reviews",
        r#"
host: reviews
trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}
subsets:
- {name: rr, labels: {v: a}, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}
- {name: random, labels: {v: a}, trafficPolicy: {loadBalancer: {simple: RANDOM}}}
- {name: lc, labels: {v: a}, trafficPolicy: {loadBalancer: {simple: LEAST_CONN}}}
- {name: pt, labels: {v: a}, trafficPolicy: {loadBalancer: {simple: PASSTHROUGH}}}
- {name: maglev, labels: {v: a}, trafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 65537}}}}}
- {name: ring, labels: {v: a}, trafficPolicy: {loadBalancer: {consistentHash: {httpQueryParameterName: q, ringHash: {minimumRingSize: 4096}}}}}
- {name: same, labels: {v: a}}
"#,
    )]);
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let ring = |c: &Cluster| match &c.lb_config {
        Some(LbConfig::RingHashLbConfig(r)) => r.minimum_ring_size.unwrap().value,
        other => panic!("{other:?}"),
    };
    assert_eq!(lb(&cs[&name("")]), LbPolicy::RingHash);
    assert_eq!(ring(&cs[&name("")]), 1024);
    assert_eq!(lb(&cs[&name("same")]), LbPolicy::RingHash);
    assert_eq!(lb(&cs[&name("rr")]), LbPolicy::RoundRobin);
    assert_eq!(lb(&cs[&name("random")]), LbPolicy::Random);
    assert_eq!(lb(&cs[&name("lc")]), LbPolicy::LeastRequest);
    let pt = &cs[&name("pt")];
    assert_eq!(lb(pt), LbPolicy::ClusterProvided);
    assert_eq!(discovery(pt), DiscoveryType::OriginalDst);
    assert!(pt.eds_cluster_config.is_none());
    let m = &cs[&name("maglev")];
    assert_eq!(lb(m), LbPolicy::Maglev);
    assert!(
        matches!(&m.lb_config, Some(LbConfig::MaglevLbConfig(c)) if c.table_size.unwrap().value == 65537)
    );
    assert_eq!(ring(&cs[&name("ring")]), 4096);
}

#[test]
fn port_level_settings_replace_the_rules_policy_for_their_port() {
    let mut mesh = Mesh::new().with_service(service(
        "default",
        "reviews",
        &[("http", 9080), ("http-admin", 9090)],
    ));
    mesh.add_config(destination_rule(
        "default",
        "reviews",
        r#"
host: reviews
trafficPolicy:
  loadBalancer: {simple: RANDOM}
  connectionPool: {tcp: {maxConnections: 5}}
  portLevelSettings:
  - port: {number: 9090}
    loadBalancer: {simple: ROUND_ROBIN}
subsets:
- name: v1
  labels: {version: v1}
  trafficPolicy:
    portLevelSettings:
    - port: {number: 9080}
      connectionPool: {tcp: {maxConnections: 9}}
"#,
    ));
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let c9080 = &cs[&name("")];
    assert_eq!(lb(c9080), LbPolicy::Random);
    assert_eq!(thresholds(c9080)[0], 5);
    // Port 9090: the port-level entry replaces everything, the connection pool included.
    let c9090 = &cs[&format!("outbound|9090||{HOST}")];
    assert_eq!(lb(c9090), LbPolicy::RoundRobin);
    assert_eq!(thresholds(c9090)[0], MAX);
    // The subset's port-level entry for 9080 replaces the four settings wholesale: the
    // rule's RANDOM is not inherited.
    let v1 = &cs[&name("v1")];
    assert_eq!(thresholds(v1)[0], 9);
    assert_eq!(lb(v1), LbPolicy::LeastRequest);
    // On 9090 the subset has no port entry: the rule's port-level policy applies.
    assert_eq!(
        lb(&cs[&format!("outbound|9090|v1|{HOST}")]),
        LbPolicy::RoundRobin
    );
}

#[test]
fn tls_simple_origination() {
    let mesh = mesh_with(&[(
        "default",
        "reviews",
        r#"
host: reviews
trafficPolicy: {tls: {mode: SIMPLE, caCertificates: /etc/certs/ca.pem, sni: reviews.example, subjectAltNames: [reviews.example]}}
subsets:
- {name: insecure, labels: {v: a}, trafficPolicy: {tls: {mode: SIMPLE, insecureSkipVerify: true}}}
- {name: plain, labels: {v: a}, trafficPolicy: {tls: {mode: DISABLE}}}
"#,
    )]);
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    let tls = |c: &Cluster| -> UpstreamTlsContext {
        let ts = c.transport_socket.as_ref().expect("transport socket");
        assert_eq!(ts.name, "envoy.transport_sockets.tls");
        let Some(ConfigType::TypedConfig(any)) = &ts.config_type else {
            panic!()
        };
        UpstreamTlsContext::decode(any.value.as_slice()).unwrap()
    };
    let t = tls(&cs[&name("")]);
    assert_eq!(t.sni, "reviews.example");
    let common = t.common_tls_context.unwrap();
    let Some(ValidationContextType::ValidationContext(v)) = common.validation_context_type else {
        panic!()
    };
    #[allow(deprecated)]
    let sans: Vec<_> = v
        .match_subject_alt_names
        .iter()
        .map(|m| format!("{:?}", m.match_pattern))
        .collect();
    assert_eq!(sans, [r#"Some(Exact("reviews.example"))"#]);
    assert!(format!("{:?}", v.trusted_ca).contains("/etc/certs/ca.pem"));
    // SNI set: no auto SNI.
    assert!(!cs[&name("")]
        .typed_extension_protocol_options
        .contains_key("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"));
    // insecureSkipVerify: no verification; no SNI: the request's host (auto_sni), and no
    // SAN check.
    let insecure = &cs[&name("insecure")];
    let t = tls(insecure);
    assert!(matches!(
        t.common_tls_context.unwrap().validation_context_type,
        Some(ValidationContextType::ValidationContext(ref v)) if v.trusted_ca.is_none()
    ));
    let u = http_options(insecure)
        .upstream_http_protocol_options
        .unwrap();
    assert!(u.auto_sni && !u.auto_san_validation);
    assert!(cs[&name("plain")].transport_socket.is_none());
}

#[test]
fn service_entry_resolution_none_is_eds_at_gateways() {
    let mesh = Mesh::new().with_config(service_entry(
        "default",
        "ext",
        "hosts: [ext.example.com]\nports: [{number: 80, name: http, protocol: HTTP}]\nresolution: NONE\nendpoints: [{address: 10.9.0.1}]",
    ));
    let name = "outbound|80||ext.example.com";
    let at_sidecar = &cds(&mesh, &sidecar_proxy("default", &[]))[name];
    assert_eq!(discovery(at_sidecar), DiscoveryType::OriginalDst);
    assert_eq!(lb(at_sidecar), LbPolicy::ClusterProvided);
    let at_gateway = &cds(&mesh, &router_proxy("istio-system", &[]))[name];
    assert_eq!(discovery(at_gateway), DiscoveryType::Eds);
    let snap = mesh.snapshot();
    let eds = load_assignments(&gen(
        XdsType::Endpoint,
        &router_proxy("istio-system", &[]),
        &snap,
        &[name],
    ));
    assert_eq!(cla_addresses(&eds[name]), [["10.9.0.1:80"]]);
}

// ---------------------------------------------------------------------------------------
// Which rule applies

fn lb_of(mesh: &Mesh, proxy: &crate::index::proxy::Proxy) -> LbPolicy {
    lb(&cds(mesh, proxy)[&name("")])
}

#[test]
fn proxy_namespace_then_service_namespace_then_root() {
    let mesh = mesh_with(&[
        ("istio-system", "root", "host: reviews.default.svc.cluster.local\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}"),
        ("default", "svc-ns", "host: reviews\ntrafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}"),
        ("client", "own", "host: reviews.default.svc.cluster.local\ntrafficPolicy: {loadBalancer: {simple: LEAST_REQUEST, consistentHash: null}}\nsubsets: [{name: mine, labels: {a: b}}]"),
    ]);
    // The client namespace's own rule wins for its proxies, with its subsets only.
    let client = cds(&mesh, &sidecar_proxy("client", &[]));
    assert_eq!(lb(&client[&name("")]), LbPolicy::LeastRequest);
    assert!(client.contains_key(&name("mine")));
    // Elsewhere the service namespace's rule.
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("other", &[])),
        LbPolicy::RoundRobin
    );
    assert!(!cds(&mesh, &sidecar_proxy("other", &[])).contains_key(&name("mine")));
    // Without one in the service namespace, the root namespace's.
    let root_only = mesh_with(&[(
        "istio-system",
        "root",
        "host: '*.svc.cluster.local'\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}",
    )]);
    assert_eq!(
        lb_of(&root_only, &sidecar_proxy("other", &[])),
        LbPolicy::Random
    );
}

#[test]
fn export_to_limits_who_sees_a_rule() {
    let mesh = mesh_with(&[(
        "default",
        "private",
        "host: reviews\nexportTo: ['.']\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}",
    )]);
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("default", &[])),
        LbPolicy::Random
    );
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("other", &[])),
        LbPolicy::LeastRequest
    );
    let mesh = mesh_with(&[(
        "default",
        "to-b",
        "host: reviews\nexportTo: [b]\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}",
    )]);
    assert_eq!(lb_of(&mesh, &sidecar_proxy("b", &[])), LbPolicy::Random);
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("c", &[])),
        LbPolicy::LeastRequest
    );
    // Not even its own namespace.
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("default", &[])),
        LbPolicy::LeastRequest
    );
}

#[test]
fn workload_selector_applies_to_matching_proxies_of_its_namespace() {
    let mesh = mesh_with(&[
        ("client", "for-web", "host: reviews.default.svc.cluster.local\nworkloadSelector: {matchLabels: {app: web}}\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}"),
        ("client", "all", "host: reviews.default.svc.cluster.local\ntrafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}"),
        ("default", "selected", "host: reviews\nworkloadSelector: {matchLabels: {app: web}}\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}"),
    ]);
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("client", &[("app", "web")])),
        LbPolicy::Random
    );
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("client", &[("app", "api")])),
        LbPolicy::RoundRobin
    );
    // A selector rule is never exported: a web proxy elsewhere gets no rule.
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("other", &[("app", "web")])),
        LbPolicy::LeastRequest
    );
}

#[test]
fn rules_for_one_host_merge_as_istiod_merges_them() {
    let mesh = mesh_with(&[
        ("default", "a", "host: reviews\nsubsets: [{name: v1, labels: {version: v1}}]"),
        ("default", "b", "host: reviews\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}\nsubsets: [{name: v2, labels: {version: v2}}, {name: v1, labels: {version: other}}]"),
        ("default", "c", "host: reviews\ntrafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}\nsubsets: [{name: v3, labels: {version: v3}}]"),
    ]);
    let cs = cds(&mesh, &sidecar_proxy("default", &[]));
    // Subsets unioned; the first traffic policy (in creation, then name order) wins: b's.
    for s in ["v1", "v2", "v3"] {
        assert_eq!(lb(&cs[&name(s)]), LbPolicy::Random, "{s}");
    }
    assert_eq!(lb(&cs[&name("")]), LbPolicy::Random);
    // The first v1 wins.
    let snap = mesh.snapshot();
    let mut m = mesh.clone();
    m.add_slice(slice(
        "default",
        "reviews",
        "s1",
        &[("http", 9080)],
        vec![
            endpoint("10.0.0.1", &[("version", "v1")]),
            endpoint("10.0.0.2", &[("version", "other")]),
        ],
    ));
    drop(snap);
    let snap = m.snapshot();
    let v1 = name("v1");
    let eds = load_assignments(&gen(
        XdsType::Endpoint,
        &sidecar_proxy("default", &[]),
        &snap,
        &[v1.as_str()],
    ));
    assert_eq!(cla_addresses(&eds[&v1]), [["10.0.0.1:9080"]]);
}

#[test]
fn rules_with_different_export_to_stay_separate() {
    let mesh = mesh_with(&[
        (
            "default",
            "a",
            "host: reviews\nexportTo: ['.']\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}",
        ),
        (
            "default",
            "b",
            "host: reviews\nexportTo: ['*']\ntrafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}",
        ),
    ]);
    // Other namespaces see only the exported rule (not merged into the private one).
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("other", &[])),
        LbPolicy::RoundRobin
    );
    // The own namespace gets both, unmerged; the last rule without a selector applies.
    assert_eq!(
        lb_of(&mesh, &sidecar_proxy("default", &[])),
        LbPolicy::RoundRobin
    );
}

#[test]
fn consistent_hash_reaches_the_route_and_drops_the_previous_hosts_predicate() {
    use shoal_proto::pb::envoy::config::route::v3::{
        route::Action, route_action::hash_policy::PolicySpecifier,
    };
    let mut mesh = mesh_with(&[(
        "default",
        "reviews",
        r#"
host: reviews
trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}
subsets:
- {name: v1, labels: {version: v1}, trafficPolicy: {loadBalancer: {consistentHash: {httpCookie: {name: c, ttl: 10s}}}}}
- {name: v2, labels: {version: v2}}
"#,
    )]);
    mesh.add_config(virtual_service(
        "default",
        "reviews",
        r#"
hosts: [reviews]
http:
- match: [{headers: {split: {exact: "yes"}}}]
  route:
  - {destination: {host: reviews, subset: v1}, weight: 50}
  - {destination: {host: reviews, subset: v2}, weight: 50}
- route: [{destination: {host: reviews}}]
"#,
    ));
    let proxy = captured_proxy("default", "10.1.0.9", &[]);
    let rds = route_configs(&gen(XdsType::Route, &proxy, &mesh.snapshot(), &["9080"]));
    let vh = rds["9080"]
        .virtual_hosts
        .iter()
        .find(|v| v.name.starts_with("reviews"))
        .expect("reviews virtual host");
    let action = |i: usize| match &vh.routes[i].action {
        Some(Action::Route(ra)) => ra.clone(),
        other => panic!("{other:?}"),
    };
    // Weighted: one hash policy per hashed destination (v1's cookie, v2 inherits the header);
    // the default retry policy keeps its previous-hosts predicate.
    let split = action(0);
    let specs: Vec<_> = split
        .hash_policy
        .iter()
        .map(|h| match &h.policy_specifier {
            Some(PolicySpecifier::Cookie(c)) => {
                format!("cookie {} {:?}", c.name, c.ttl.map(|t| t.seconds))
            }
            Some(PolicySpecifier::Header(h)) => format!("header {}", h.header_name),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(specs, ["cookie c Some(10)", "header x-user"]);
    assert_eq!(split.retry_policy.unwrap().retry_host_predicate.len(), 1);
    // Single destination: hashed, and retries may go back to the same host.
    let single = action(1);
    assert!(matches!(
        &single.hash_policy[..],
        [h] if matches!(&h.policy_specifier, Some(PolicySpecifier::Header(h)) if h.header_name == "x-user")
    ));
    let retry = single.retry_policy.unwrap();
    assert!(retry.retry_host_predicate.is_empty());
    assert_eq!(retry.num_retries.unwrap().value, 2);
}
