//! istio-proxy's telemetry (node metadata `ISTIO_VERSION`) and version gates: what istiod
//! sends istio-proxy, and that an upstream Envoy gets none of it.

use crate::index::proxy::{IstioVersion, Proxy};
use crate::testutil::*;
use prost::Message;
use shoal_proto::pb::envoy::config::listener::v3::{filter, FilterChain, Listener};
use shoal_proto::pb::envoy::config::route::v3::route::Action;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use shoal_proto::XdsType;
use std::collections::BTreeMap;

fn mesh() -> Mesh {
    let mut reviews = service("default", "reviews", &[("http", 9080)]);
    reviews.cluster_ips = vec!["10.96.0.10".into()];
    let mut db = service("default", "db", &[("tcp", 5432)]);
    db.cluster_ips = vec!["10.96.0.11".into()];
    let mut own = service("default", "productpage", &[("http", 9080), ("grpc", 9090)]);
    own.selector = labels(&[("app", "productpage")]);
    Mesh::new()
        .with_service(reviews)
        .with_service(db)
        .with_service(own)
}

fn proxy(version: Option<&str>) -> Proxy {
    let mut p = captured_proxy(
        "default",
        "10.1.0.7",
        &[("app", "productpage"), ("version", "v2")],
    );
    p.istio_version = version.map(IstioVersion::parse);
    p.internal_listener = p.istio_version.is_some();
    p
}

fn lds(p: &Proxy) -> BTreeMap<String, Listener> {
    listeners(&gen(XdsType::Listener, p, &mesh().snapshot(), &[]))
}

fn hcm_of(c: &FilterChain) -> Option<HttpConnectionManager> {
    c.filters.iter().find_map(|f| match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any))
            if f.name == "envoy.filters.network.http_connection_manager" =>
        {
            HttpConnectionManager::decode(&*any.value).ok()
        }
        _ => None,
    })
}

fn names<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<String> {
    items.iter().map(|i| name(i).to_string()).collect()
}

const ISTIO_ONLY: [&str; 4] = [
    "istio.stats",
    "istio.metadata_exchange",
    "istio.alpn",
    "envoy.filters.http.grpc_stats",
];

#[test]
fn istio_proxy_gets_istiods_filters_in_istiods_order() {
    let l = lds(&proxy(Some("1.26.1")));
    // Outbound HTTP: metadata exchange first, grpc_stats and istio.alpn before fault
    // injection, istio.stats before the router; tracing and the UUID request id.
    let out = &l["0.0.0.0_9080"];
    let h = hcm_of(&out.filter_chains[0]).expect("an HTTP chain");
    assert_eq!(
        names(&h.http_filters, |f| &f.name),
        [
            "istio.metadata_exchange",
            "envoy.filters.http.grpc_stats",
            "istio.alpn",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "istio.stats",
            "envoy.filters.http.router",
        ]
    );
    let tracing = h.tracing.expect("tracing");
    assert_eq!(tracing.random_sampling.unwrap().value, 1.0);
    let tags = names(&tracing.custom_tags, |t| &t.tag);
    assert!(tags.contains(&"istio.mesh_id".to_string()));
    // Outbound listeners are shared by workloads: no per-workload tags there.
    assert!(!tags.contains(&"istio.canonical_service".to_string()));
    assert!(h.request_id_extension.is_some());
    // Outbound TCP: istio.stats before tcp_proxy.
    let tcp = &l["10.96.0.11_5432"].filter_chains[0];
    assert_eq!(
        names(&tcp.filters, |f| &f.name),
        ["istio.stats", "envoy.filters.network.tcp_proxy"]
    );
    // Inbound: TCP metadata exchange first on every chain; HTTP managers without
    // istio.alpn, with the workload's canonical service in the tracing tags.
    let inbound = &l["virtualInbound"];
    let http = inbound
        .filter_chains
        .iter()
        .find(|c| c.name == "0.0.0.0_9080")
        .unwrap();
    assert_eq!(http.filters[0].name, "istio.metadata_exchange");
    let h = hcm_of(http).unwrap();
    let filters = names(&h.http_filters, |f| &f.name);
    assert_eq!(filters.first().unwrap(), "istio.metadata_exchange");
    assert!(!filters.contains(&"istio.alpn".to_string()));
    assert_eq!(filters[filters.len() - 2], "istio.stats");
    let tags: Vec<_> = h.tracing.unwrap().custom_tags;
    let service = tags
        .iter()
        .find(|t| t.tag == "istio.canonical_service")
        .expect("canonical service tag");
    assert!(format!("{service:?}").contains("productpage"));
    // Clusters: alt_stat_name `<name>;`.
    let c = clusters(&gen(
        XdsType::Cluster,
        &proxy(Some("1.26.1")),
        &mesh().snapshot(),
        &[],
    ));
    let reviews = &c["outbound|9080||reviews.default.svc.cluster.local"];
    assert_eq!(
        reviews.alt_stat_name,
        "outbound|9080||reviews.default.svc.cluster.local;"
    );
}

/// An upstream Envoy (no `ISTIO_VERSION`) cannot load istio-proxy's filters: it gets none
/// of them, no alt_stat_name, and no tracing block (its bootstrap has no tracer either).
#[test]
fn upstream_envoy_gets_none_of_it() {
    let p = proxy(None);
    for (name, l) in lds(&p) {
        for c in l
            .filter_chains
            .iter()
            .chain(l.default_filter_chain.as_ref())
        {
            for f in &c.filters {
                assert!(!ISTIO_ONLY.contains(&f.name.as_str()), "{name}: {}", f.name);
            }
            if let Some(h) = hcm_of(c) {
                for f in &h.http_filters {
                    assert!(!ISTIO_ONLY.contains(&f.name.as_str()), "{name}: {}", f.name);
                }
                assert!(h.tracing.is_none() && h.request_id_extension.is_none());
            }
        }
    }
    for c in clusters(&gen(XdsType::Cluster, &p, &mesh().snapshot(), &[])).values() {
        assert!(c.alt_stat_name.is_empty(), "{}", c.name);
    }
}

/// The bytes are the same every time (hand-encoded Istio configs, structs in name order).
#[test]
fn istio_proxy_resources_are_deterministic() {
    let p = proxy(Some("1.26.1"));
    let first = gen(XdsType::Listener, &p, &mesh().snapshot(), &[]);
    for _ in 0..10 {
        let again = gen(XdsType::Listener, &p, &mesh().snapshot(), &[]);
        let a: Vec<_> = first.iter().map(|r| (&r.name, &r.any.value)).collect();
        let b: Vec<_> = again.iter().map(|r| (&r.name, &r.any.value)).collect();
        assert_eq!(a, b);
    }
}

/// The inbound route of an HTTP port (not gRPC).
fn inbound_retry_on(p: &Proxy) -> Option<String> {
    let l = &lds(p)["virtualInbound"];
    let c = l
        .filter_chains
        .iter()
        .find(|c| c.name == "0.0.0.0_9080")
        .unwrap();
    let Some(RouteSpecifier::RouteConfig(rc)) = hcm_of(c).unwrap().route_specifier else {
        panic!("inline routes")
    };
    match &rc.virtual_hosts[0].routes[0].action {
        Some(Action::Route(a)) => a.retry_policy.as_ref().map(|r| r.retry_on.clone()),
        _ => None,
    }
}

/// istiod's gate: `reset-before-request` for istio-proxy 1.24 and newer, and for proxies
/// naming no version (upstream Envoy); never on gRPC ports.
#[test]
fn inbound_retry_is_gated_on_the_proxy_version() {
    let reset = Some("reset-before-request".to_string());
    assert_eq!(inbound_retry_on(&proxy(None)), reset);
    assert_eq!(inbound_retry_on(&proxy(Some("1.24.0"))), reset);
    assert_eq!(inbound_retry_on(&proxy(Some("1.27-dev"))), reset);
    assert_eq!(inbound_retry_on(&proxy(Some("1.23.3"))), None);
}

/// Service clusters carry istiod's `istio.services` metadata (every proxy), in the same
/// bytes every time; istio-proxy's `alt_stat_name` is added without disturbing them.
#[test]
fn service_clusters_carry_istio_service_metadata() {
    use shoal_proto::pb::google::protobuf::value::Kind;
    for version in [None, Some("1.26.1")] {
        let p = proxy(version);
        let first = gen(XdsType::Cluster, &p, &mesh().snapshot(), &[]);
        for _ in 0..10 {
            let again = gen(XdsType::Cluster, &p, &mesh().snapshot(), &[]);
            let a: Vec<_> = first.iter().map(|r| &r.any.value).collect();
            let b: Vec<_> = again.iter().map(|r| &r.any.value).collect();
            assert_eq!(a, b);
        }
        let c = &clusters(&first)["outbound|9080||reviews.default.svc.cluster.local"];
        let istio = &c.metadata.as_ref().expect("metadata").filter_metadata["istio"];
        let Some(Kind::ListValue(services)) = &istio.fields["services"].kind else {
            panic!("services list")
        };
        let Some(Kind::StructValue(svc)) = &services.values[0].kind else {
            panic!("a service")
        };
        let field = |k: &str| match &svc.fields[k].kind {
            Some(Kind::StringValue(s)) => s.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(field("host"), "reviews.default.svc.cluster.local");
        assert_eq!(field("name"), "reviews");
        assert_eq!(field("namespace"), "default");
    }
}
