//! The same state, however it arrived, yields byte-identical resources and equal versions.

use crate::generate::Resource;
use crate::index::proxy::Proxy;
use crate::index::store::MeshState;
use crate::testutil::*;
use shoal_common::bus::{Bucket, Entry};
use shoal_common::model::ConfigObject;
use shoal_proto::{parse_outbound_cluster_name, XdsType};

/// Every object of a small but complete mesh, as bus entries.
fn entries(reverse_lists: bool) -> Vec<(Bucket, Entry)> {
    let mut out = Vec::new();
    for (ns, name, ports) in [
        (
            "default",
            "reviews",
            &[("http", 9080u16), ("grpc", 9090)][..],
        ),
        ("default", "ratings", &[("http", 9080)][..]),
        ("other", "details", &[("http-web", 80)][..]),
    ] {
        let mut svc = service(ns, name, ports);
        svc.cluster_ips = vec![format!("10.96.0.{}", name.len())];
        out.push((Bucket::Services, service_put(&svc)));
        let mut east = svc.clone();
        east.cluster = "east".into();
        east.cluster_ips = vec![format!("10.97.0.{}", name.len())];
        out.push((Bucket::Services, service_put(&east)));
        for (cluster, base) in [(CLUSTER, 1), ("east", 101)] {
            let mut eps: Vec<_> = (0..6)
                .map(|i| {
                    let mut e = endpoint_in(
                        &format!("10.{base}.{}.{i}", name.len()),
                        ["us-east", "us-west"][i % 2],
                        ["a", "b", "c"][i % 3],
                    );
                    e.labels = labels(&[("version", ["v1", "v2"][i % 2])]);
                    e
                })
                .collect();
            if reverse_lists {
                eps.reverse();
            }
            let mut set = slice(
                ns,
                name,
                &format!("{name}-{cluster}"),
                &ports.iter().map(|(n, p)| (*n, p + 1)).collect::<Vec<_>>(),
                eps,
            );
            set.cluster = cluster.into();
            out.push((Bucket::Endpoints, slice_put(&set)));
        }
    }
    let mut config: Vec<ConfigObject> = vec![
        destination_rule(
            "default",
            "reviews",
            r#"
host: reviews
trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}
subsets:
- {name: v1, labels: {version: v1}}
- {name: v2, labels: {version: v2}, trafficPolicy: {loadBalancer: {simple: RANDOM}}}
"#,
        ),
        virtual_service(
            "default",
            "reviews",
            r#"
hosts: [reviews]
http:
- match: [{headers: {end-user: {exact: jason}, x-a: {prefix: a}, x-b: {regex: b.*}}}]
  route: [{destination: {host: reviews, subset: v2}}]
- route:
  - {destination: {host: reviews, subset: v1}, weight: 75}
  - {destination: {host: reviews, subset: v2}, weight: 25}
"#,
        ),
        virtual_service(
            "other",
            "edge",
            r#"
hosts: ["*.example.com", bookinfo.example.com]
gateways: [istio-system/public]
http:
- match: [{uri: {prefix: /details}}]
  route: [{destination: {host: details}}]
"#,
        ),
        gateway(
            "istio-system",
            "public",
            r#"
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["*"]
- port: {number: 8080, name: http, protocol: HTTP}
  hosts: ["other/*.example.com"]
"#,
        ),
        sidecar(
            "default",
            "default",
            r#"
egress:
- port: {number: 9080, name: http, protocol: HTTP}
  captureMode: NONE
  hosts: ["./*", "other/*"]
- hosts: ["*/*"]
"#,
        ),
        service_entry(
            "default",
            "ext",
            r#"
hosts: [api.example.com, api2.example.com]
addresses: [240.0.0.1]
ports: [{number: 443, name: tls, protocol: TLS}, {number: 9080, name: http, protocol: HTTP}]
resolution: STATIC
workloadSelector: {labels: {app: ext}}
endpoints: [{address: 10.50.0.2, locality: us-east/a}, {address: 10.50.0.1, locality: us-west/b, weight: 2}]
"#,
        ),
        service_entry(
            "default",
            "dns",
            r#"
hosts: [dns.example.com]
ports: [{number: 80, name: http, protocol: HTTP}]
resolution: DNS
endpoints: [{address: b.example.com}, {address: a.example.com}]
"#,
        ),
        workload_entry("default", "vm-2", "address: 10.60.0.2\nlabels: {app: ext}"),
        workload_entry("default", "vm-1", "address: 10.60.0.1\nlabels: {app: ext}"),
    ];
    if reverse_lists {
        config.reverse();
    }
    out.extend(config.iter().map(|c| (Bucket::Config, config_put(c))));
    out
}

fn load(entries: &[(Bucket, Entry)]) -> MeshState {
    let mut state = MeshState::default();
    for (bucket, entry) in entries {
        state.apply(*bucket, entry).expect("fixture applies");
    }
    state
}

fn proxies() -> Vec<Proxy> {
    vec![
        sidecar_proxy("default", &[("app", "productpage")]),
        sidecar_proxy("other", &[]),
        router_proxy("istio-system", &[("istio", "ingressgateway")]),
    ]
}

/// Everything each proxy would be sent: CDS and LDS, then EDS for every EDS cluster and RDS
/// for every route table the listeners name (plus every sidecar port).
fn everything(state: &MeshState) -> Vec<Vec<Resource>> {
    let snap = snapshot_of(state);
    let mut out = Vec::new();
    for p in proxies() {
        let cds = gen(XdsType::Cluster, &p, &snap, &[]);
        let eds_names: Vec<String> = cds
            .iter()
            .filter(|r| parse_outbound_cluster_name(&r.name).is_some())
            .map(|r| r.name.clone())
            .collect();
        let eds_names: Vec<&str> = eds_names.iter().map(String::as_str).collect();
        let eds = gen(XdsType::Endpoint, &p, &snap, &eds_names);
        let lds = gen(XdsType::Listener, &p, &snap, &[]);
        let rds = gen(
            XdsType::Route,
            &p,
            &snap,
            &["http.80", "http.8080", "80", "443", "9080", "9090"],
        );
        assert!(!cds.is_empty() && !eds.is_empty() && !rds.is_empty());
        out.extend([cds, eds, lds, rds]);
    }
    out
}

#[test]
fn insertion_order_does_not_change_output() {
    let forward = entries(false);
    let reference = everything(&load(&forward));
    let reversed: Vec<_> = forward.iter().rev().cloned().collect();
    let mut rotated = forward.clone();
    rotated.rotate_left(forward.len() / 3);
    let mut interleaved: Vec<_> = forward.iter().step_by(2).cloned().collect();
    interleaved.extend(forward.iter().skip(1).step_by(2).cloned());
    let reversed_lists = entries(true);
    for (what, order) in [
        ("reversed", reversed),
        ("rotated", rotated),
        ("interleaved", interleaved),
        ("reversed lists", reversed_lists),
    ] {
        let got = everything(&load(&order));
        assert_eq!(got.len(), reference.len());
        for (a, b) in got.iter().zip(&reference) {
            let names = |v: &[Resource]| v.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
            assert_eq!(names(a), names(b), "{what}");
            for (x, y) in a.iter().zip(b) {
                assert_eq!(x.any, y.any, "{what}: {} differs", x.name);
                assert_eq!(x.version, y.version, "{what}: {}", x.name);
            }
        }
    }
}

#[test]
fn generating_twice_gives_the_same_bytes() {
    let state = load(&entries(false));
    assert_eq!(everything(&state), everything(&state));
}

#[test]
fn versions_are_content_hashes() {
    let state = load(&entries(false));
    for resources in everything(&state) {
        for r in resources {
            assert_eq!(r.version, shoal_proto::content_version(&r.any.value));
        }
    }
}
