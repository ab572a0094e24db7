//! EDS: endpoints from EndpointSlices and ServiceEntries, subsets, localities, ports.

use crate::testutil::*;
use shoal_common::model::Endpoint;
use shoal_proto::pb::envoy::config::core::v3::HealthStatus;
use shoal_proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use shoal_proto::XdsType;
use std::collections::BTreeMap;

const REVIEWS: &str = "reviews.default.svc.cluster.local";

fn eds(
    mesh: &Mesh,
    proxy: &crate::index::proxy::Proxy,
    names: &[&str],
) -> BTreeMap<String, ClusterLoadAssignment> {
    load_assignments(&gen(XdsType::Endpoint, proxy, &mesh.snapshot(), names))
}

fn one(mesh: &Mesh, name: &str) -> ClusterLoadAssignment {
    let mut m = eds(mesh, &sidecar_proxy("default", &[]), &[name]);
    let cla = m.remove(name).expect("requested assignment");
    assert_eq!(cla.cluster_name, name);
    cla
}

fn cluster(port: u16, subset: &str) -> String {
    format!("outbound|{port}|{subset}|{REVIEWS}")
}

fn versioned(address: &str, version: &str) -> Endpoint {
    endpoint(address, &[("app", "reviews"), ("version", version)])
}

fn reviews_mesh() -> Mesh {
    Mesh::new()
        .with_service(service(
            "default",
            "reviews",
            &[("http", 9080), ("http-admin", 9901)],
        ))
        .with_slice(slice(
            "default",
            "reviews",
            "reviews-abc",
            &[("http", 8080), ("http-admin", 15000)],
            vec![
                versioned("10.0.0.2", "v2"),
                versioned("10.0.0.1", "v1"),
                Endpoint {
                    ready: false,
                    ..versioned("10.0.0.9", "v1")
                },
            ],
        ))
        .with_config(destination_rule(
            "default",
            "reviews",
            r#"
host: reviews
subsets:
- {name: v1, labels: {version: v1}}
- {name: v2, labels: {version: v2}}
- {name: v3, labels: {version: v3}}
"#,
        ))
}

#[test]
fn endpoints_take_the_slice_port_of_the_same_name() {
    let mesh = reviews_mesh();
    assert_eq!(
        cla_addresses(&one(&mesh, &cluster(9080, ""))),
        [["10.0.0.1:8080", "10.0.0.2:8080"]]
    );
    assert_eq!(
        cla_addresses(&one(&mesh, &cluster(9901, ""))),
        [["10.0.0.1:15000", "10.0.0.2:15000"]]
    );
    let cla = one(&mesh, &cluster(9080, ""));
    for e in &cla.endpoints[0].lb_endpoints {
        assert_eq!(e.health_status, HealthStatus::Healthy as i32);
    }
}

#[test]
fn not_ready_endpoints_are_omitted() {
    let cla = one(&reviews_mesh(), &cluster(9080, ""));
    let all: Vec<String> = cla_addresses(&cla).concat();
    assert!(!all.iter().any(|a| a.starts_with("10.0.0.9")), "{all:?}");
}

#[test]
fn subsets_filter_by_labels() {
    let mesh = reviews_mesh();
    assert_eq!(
        cla_addresses(&one(&mesh, &cluster(9080, "v1"))),
        [["10.0.0.1:8080"]]
    );
    assert_eq!(
        cla_addresses(&one(&mesh, &cluster(9080, "v2"))),
        [["10.0.0.2:8080"]]
    );
    // A subset with no endpoints, and one no rule defines: empty, but answered.
    assert!(one(&mesh, &cluster(9080, "v3")).endpoints.is_empty());
    assert!(one(&mesh, &cluster(9080, "v9")).endpoints.is_empty());
}

#[test]
fn a_port_the_slice_does_not_serve_has_no_endpoints() {
    let mesh = Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_slice(slice(
            "default",
            "reviews",
            "s1",
            &[("other", 8080)],
            vec![versioned("10.0.0.1", "v1")],
        ));
    assert!(one(&mesh, &cluster(9080, "")).endpoints.is_empty());
    // A port the service does not have.
    assert!(one(&mesh, &cluster(1234, "")).endpoints.is_empty());
}

#[test]
fn unnamed_single_port_service_uses_the_only_slice_port() {
    let mesh = Mesh::new()
        .with_service(service("default", "reviews", &[("", 80)]))
        .with_slice(slice(
            "default",
            "reviews",
            "s1",
            &[("", 8080)],
            vec![versioned("10.0.0.1", "v1")],
        ));
    assert_eq!(
        cla_addresses(&one(&mesh, &cluster(80, ""))),
        [["10.0.0.1:8080"]]
    );
}

#[test]
fn endpoints_are_grouped_by_locality() {
    let mesh = Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_slice(slice(
            "default",
            "reviews",
            "s1",
            &[("http", 8080)],
            vec![
                endpoint_in("10.0.2.1", "us-west", "b"),
                endpoint_in("10.0.1.2", "us-east", "a"),
                endpoint_in("10.0.2.2", "us-west", "b"),
                endpoint_in("10.0.1.1", "us-east", "a"),
                endpoint_in("10.0.3.1", "us-west", "a"),
            ],
        ));
    let cla = one(&mesh, &cluster(9080, ""));
    let localities: Vec<(String, String)> = cla
        .endpoints
        .iter()
        .map(|l| {
            let loc = l.locality.as_ref().expect("locality");
            (loc.region.clone(), loc.zone.clone())
        })
        .collect();
    assert_eq!(
        localities,
        [
            ("us-east".to_string(), "a".to_string()),
            ("us-west".to_string(), "a".to_string()),
            ("us-west".to_string(), "b".to_string()),
        ]
    );
    assert_eq!(
        cla_addresses(&cla),
        [
            vec!["10.0.1.1:8080", "10.0.1.2:8080"],
            vec!["10.0.3.1:8080"],
            vec!["10.0.2.1:8080", "10.0.2.2:8080"],
        ]
    );
}

#[test]
fn slices_and_clusters_merge() {
    let mut east = slice(
        "default",
        "reviews",
        "reviews-east",
        &[("http", 8080)],
        vec![endpoint("10.1.0.1", &[]), endpoint("10.0.0.2", &[])],
    );
    east.cluster = "east".into();
    let mesh = Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_slice(slice(
            "default",
            "reviews",
            "reviews-a",
            &[("http", 8080)],
            vec![endpoint("10.0.0.1", &[])],
        ))
        .with_slice(slice(
            "default",
            "reviews",
            "reviews-b",
            &[("http", 8080)],
            // The same address as in the other cluster's slice: sent once.
            vec![endpoint("10.0.0.2", &[])],
        ))
        .with_slice(east);
    assert_eq!(
        cla_addresses(&one(&mesh, &cluster(9080, ""))),
        [["10.0.0.1:8080", "10.0.0.2:8080", "10.1.0.1:8080"]]
    );
}

#[test]
fn unknown_and_invisible_clusters_get_empty_assignments() {
    let mut private = service("other", "secret", &[("http", 80)]);
    private.export_to = vec![".".into()];
    let mesh = reviews_mesh().with_service(private).with_slice(slice(
        "other",
        "secret",
        "s1",
        &[("http", 80)],
        vec![endpoint("10.9.9.9", &[])],
    ));
    let names = [
        "outbound|80||nope.default.svc.cluster.local",
        "outbound|80||secret.other.svc.cluster.local",
        "not-a-cluster-name",
        "inbound|80||reviews.default.svc.cluster.local",
    ];
    let m = eds(&mesh, &sidecar_proxy("default", &[]), &names);
    // Malformed names are not Istio clusters: no resource at all.
    assert_eq!(
        m.keys().collect::<Vec<_>>(),
        [
            "outbound|80||nope.default.svc.cluster.local",
            "outbound|80||secret.other.svc.cluster.local",
        ]
    );
    for (name, cla) in &m {
        assert_eq!(&cla.cluster_name, name);
        assert!(cla.endpoints.is_empty(), "{name}");
    }
    // The owner's namespace sees it.
    let own = eds(
        &mesh,
        &sidecar_proxy("other", &[]),
        &["outbound|80||secret.other.svc.cluster.local"],
    );
    assert_eq!(
        cla_addresses(&own["outbound|80||secret.other.svc.cluster.local"]),
        [["10.9.9.9:80"]]
    );
}

#[test]
fn only_requested_names_are_returned() {
    let mesh = reviews_mesh();
    let m = eds(
        &mesh,
        &sidecar_proxy("default", &[]),
        &[
            &cluster(9080, "v1"),
            &cluster(9080, "v1"),
            &cluster(9901, ""),
        ],
    );
    assert_eq!(
        m.keys().cloned().collect::<Vec<_>>(),
        [cluster(9080, "v1"), cluster(9901, "")]
    );
    assert!(eds(&mesh, &sidecar_proxy("default", &[]), &[]).is_empty());
}

fn static_entry() -> Mesh {
    Mesh::new().with_config(service_entry(
        "default",
        "db",
        r#"
hosts: [db.internal]
ports:
- {number: 5432, name: pg, protocol: TCP, targetPort: 6432}
- {number: 9187, name: metrics, protocol: HTTP}
resolution: STATIC
endpoints:
- address: 10.0.0.2
  ports: {pg: 7000}
  locality: us-east/a
  weight: 3
  labels: {role: replica}
- address: 10.0.0.1
  locality: us-east/a
  labels: {role: primary}
"#,
    ))
}

#[test]
fn static_service_entry_endpoints() {
    let mesh = static_entry();
    let pg = one(&mesh, "outbound|5432||db.internal");
    // By port name, else targetPort.
    assert_eq!(cla_addresses(&pg), [["10.0.0.1:6432", "10.0.0.2:7000"]]);
    let loc = pg.endpoints[0].locality.as_ref().unwrap();
    assert_eq!((loc.region.as_str(), loc.zone.as_str()), ("us-east", "a"));
    let weights: Vec<Option<u32>> = pg.endpoints[0]
        .lb_endpoints
        .iter()
        .map(|e| e.load_balancing_weight.as_ref().map(|w| w.value))
        .collect();
    assert_eq!(weights, [None, Some(3)]);
    // Neither: the port number.
    assert_eq!(
        cla_addresses(&one(&mesh, "outbound|9187||db.internal")),
        [["10.0.0.1:9187", "10.0.0.2:9187"]]
    );
}

#[test]
fn static_service_entry_subsets() {
    let mesh = static_entry().with_config(destination_rule(
        "default",
        "db",
        r#"
host: db.internal
subsets: [{name: primary, labels: {role: primary}}]
"#,
    ));
    assert_eq!(
        cla_addresses(&one(&mesh, "outbound|5432|primary|db.internal")),
        [["10.0.0.1:6432"]]
    );
}

#[test]
fn workload_entries_selected_in_the_same_namespace_only() {
    let mesh = Mesh::new()
        .with_config(service_entry(
            "vm",
            "legacy",
            r#"
hosts: [legacy.vm.internal]
ports:
- {number: 80, name: http, protocol: HTTP, targetPort: 8000}
- {number: 81, name: admin, protocol: HTTP}
resolution: STATIC
workloadSelector: {labels: {app: legacy}}
endpoints: [{address: 10.5.0.1}]
"#,
        ))
        .with_config(workload_entry(
            "vm",
            "vm-1",
            r#"
address: 10.5.0.2
labels: {app: legacy, version: v1}
ports: {http: 9000}
"#,
        ))
        .with_config(workload_entry(
            "vm",
            "vm-2",
            "address: 10.5.0.3\nlabels: {app: legacy}",
        ))
        .with_config(workload_entry(
            "vm",
            "other-app",
            "address: 10.5.0.4\nlabels: {app: other}",
        ))
        .with_config(workload_entry(
            "elsewhere",
            "vm-x",
            "address: 10.5.0.5\nlabels: {app: legacy}",
        ));
    assert_eq!(
        cla_addresses(&one(&mesh, "outbound|80||legacy.vm.internal")),
        [["10.5.0.1:8000", "10.5.0.2:9000", "10.5.0.3:8000"]]
    );
    assert_eq!(
        cla_addresses(&one(&mesh, "outbound|81||legacy.vm.internal")),
        [["10.5.0.1:81", "10.5.0.2:81", "10.5.0.3:81"]]
    );
}

#[test]
fn dns_service_entries_have_no_eds_endpoints() {
    let mesh = Mesh::new().with_config(service_entry(
        "default",
        "ext",
        r#"
hosts: [api.example.com]
ports: [{number: 80, name: http, protocol: HTTP}]
resolution: DNS
endpoints: [{address: a.example.com}]
"#,
    ));
    // Endpoints are inline in the STRICT_DNS cluster; EDS answers empty if asked.
    assert!(one(&mesh, "outbound|80||api.example.com")
        .endpoints
        .is_empty());
}

/// Endpoints carry istiod's `istio.workload` label beside the auto-mTLS mark, and the
/// two-entry metadata map encodes to the same bytes every time (prost writes maps in hash
/// order; shoal writes each entry as its own occurrence).
#[test]
fn workload_metadata_is_istiods_and_deterministic() {
    use shoal_proto::pb::google::protobuf::value::Kind;
    let mut ep = endpoint(
        "10.0.0.1",
        &[
            ("app", "reviews"),
            ("version", "v2"),
            ("pod-template-hash", "7f9c"),
            ("security.istio.io/tlsMode", "istio"),
        ],
    );
    ep.pod = "reviews-v2-7f9c-abcde.default".into();
    let m = Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_slice(slice(
            "default",
            "reviews",
            "s1",
            &[("http", 9080)],
            vec![ep],
        ));
    let name = "outbound|9080||reviews.default.svc.cluster.local";
    let p = sidecar_proxy("default", &[]);
    let first = gen(XdsType::Endpoint, &p, &m.snapshot(), &[name]);
    for _ in 0..20 {
        let again = gen(XdsType::Endpoint, &p, &m.snapshot(), &[name]);
        assert_eq!(again[0].any.value, first[0].any.value);
    }
    let cla = &load_assignments(&first)[name];
    let md = cla.endpoints[0].lb_endpoints[0].metadata.as_ref().unwrap();
    assert_eq!(md.filter_metadata.len(), 2);
    let workload = &md.filter_metadata["istio"].fields["workload"].kind;
    assert_eq!(
        workload,
        &Some(Kind::StringValue(
            "reviews-v2;default;reviews;v2;Kubernetes".into()
        ))
    );
}
