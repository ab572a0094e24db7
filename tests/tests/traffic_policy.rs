//! End to end, DestinationRule traffic policies through a real Envoy gateway:
//! - consistent hash: the same `x-user` header always reaches the same backend;
//! - outlier detection: a backend that answers 503 is ejected after consecutive errors
//!   and stops receiving traffic;
//! - circuit breaking (the istio.io task's DestinationRule: one connection, one pending
//!   request, one request per connection): concurrent slow requests overflow with 503s;
//! - connection pools: the clusters of every documented `connectionPool` field pass
//!   `envoy --mode validate`.
//!
//! One standalone `shoal-server` on a manifest directory; backends on 127.0.0.x behind
//! STATIC ServiceEntries. Needs the binaries: `cargo build --workspace --bins` first.
#![forbid(unsafe_code)]

use hyper::StatusCode;
use shoal_tests::bootstrap::{bootstrap, Node};
use shoal_tests::http::Request;
use shoal_tests::ports::{free_port, free_port_on, loopback};
use shoal_tests::{eventually, Backend, Envoy, ShoalServer};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

const CONVERGE: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(100);

fn service_entry(name: &str, host: &str, ips: &[std::net::Ipv4Addr], port: u16) -> String {
    let endpoints: String = ips
        .iter()
        .map(|ip| format!("  - address: {ip}\n    ports: {{http: {port}}}\n"))
        .collect();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: demo}}\n\
         spec:\n  hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n\
         \x20 ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints:\n{endpoints}---\n"
    )
}

fn manifests(gateway_port: u16, backend_port: u16) -> String {
    let mut out = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: istio-system}\n---\n",
    );
    out += &format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: ingress, namespace: istio-system}}\n\
         spec:\n  selector: {{istio: ingressgateway}}\n  servers:\n\
         \x20 - port: {{number: {gateway_port}, name: http, protocol: HTTP}}\n    hosts: ['*']\n---\n"
    );
    out += &service_entry(
        "sticky",
        "sticky.test",
        &[loopback(21), loopback(22), loopback(23)],
        backend_port,
    );
    out += &service_entry(
        "flaky",
        "flaky.test",
        &[loopback(24), loopback(25)],
        backend_port,
    );
    out += &service_entry("breaker", "breaker.test", &[loopback(26)], backend_port);
    out += r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ingress, namespace: demo}
spec:
  hosts: [sticky.test, flaky.test, breaker.test]
  gateways: [istio-system/ingress]
  http:
  - match: [{headers: {":authority": {prefix: sticky.test}}}]
    route: [{destination: {host: sticky.test}}]
  - match: [{headers: {":authority": {prefix: breaker.test}}}]
    route: [{destination: {host: breaker.test}}]
  - route: [{destination: {host: flaky.test}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: sticky, namespace: demo}
spec:
  host: sticky.test
  trafficPolicy:
    loadBalancer:
      consistentHash: {httpHeaderName: x-user}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: flaky, namespace: demo}
spec:
  host: flaky.test
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    outlierDetection:
      consecutive5xxErrors: 2
      interval: 1s
      baseEjectionTime: 5m
      maxEjectionPercent: 100
---
# The istio.io circuit-breaking task's rule.
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: breaker, namespace: demo}
spec:
  host: breaker.test
  trafficPolicy:
    connectionPool:
      tcp: {maxConnections: 1}
      http: {http1MaxPendingRequests: 1, maxRequestsPerConnection: 1}
"#;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_outlier_ejection_and_circuit_breaking() {
    let ips: Vec<_> = (21..=26).map(loopback).collect();
    let backend_port = free_port_on(&ips);
    let gateway_port = free_port_on(&[std::net::Ipv4Addr::UNSPECIFIED]);
    let mut sticky = Vec::new();
    for (i, ip) in ips[..3].iter().enumerate() {
        let addr = SocketAddr::from((*ip, backend_port));
        sticky.push(Backend::start(&format!("sticky-{i}"), addr).await);
    }
    let good = Backend::start("good", SocketAddr::from((ips[3], backend_port))).await;
    let bad = Backend::start_answering(
        "bad",
        SocketAddr::from((ips[4], backend_port)),
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    let breaker = Backend::start("breaker", SocketAddr::from((ips[5], backend_port))).await;

    let dir = tempfile::tempdir().expect("manifest dir");
    std::fs::write(
        dir.path().join("mesh.yaml"),
        manifests(gateway_port, backend_port),
    )
    .unwrap();
    let cp = ShoalServer::standalone(dir.path()).await;
    let envoy = Envoy::start(&bootstrap(&Node::gateway(), free_port(), &[cp.xds_addr()])).await;
    let gw = SocketAddr::from(([127, 0, 0, 1], gateway_port));

    // Consistent hash: every user sticks to one backend, and users spread.
    eventually(CONVERGE, POLL, || async {
        let r = Request::get("/").host("sticky.test").send(gw).await?;
        anyhow::ensure!(r.status == 200, "status {}", r.status);
        anyhow::Ok(())
    })
    .await;
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for user in 0..12 {
        for _ in 0..10 {
            let r = Request::get("/")
                .host("sticky.test")
                .header("x-user", &format!("user-{user}"))
                .send(gw)
                .await
                .expect("request");
            assert_eq!(r.status, 200, "{}", r.text());
            let backend = r.json().unwrap()["backend"].as_str().unwrap().to_string();
            seen.entry(format!("user-{user}"))
                .or_default()
                .insert(backend);
        }
    }
    for (user, backends) in &seen {
        assert_eq!(backends.len(), 1, "{user} reached {backends:?}");
    }
    let used: BTreeSet<_> = seen.values().flatten().collect();
    assert!(used.len() >= 2, "all users hashed to {used:?}");

    // Outlier detection: the 503 backend is ejected after two consecutive errors and then
    // receives nothing, every request reaching the healthy one.
    let ejected = eventually(
        Duration::from_secs(15),
        Duration::from_millis(20),
        || async {
            let before = bad.requests();
            for _ in 0..20 {
                Request::get("/").host("flaky.test").send(gw).await?;
            }
            anyhow::ensure!(
                bad.requests() == before,
                "the failing backend still got {} of 20 requests",
                bad.requests() - before
            );
            anyhow::Ok(bad.requests())
        },
    )
    .await;
    assert!(ejected >= 2, "ejected after {ejected} errors");
    let good_before = good.requests();
    for _ in 0..20 {
        let r = Request::get("/")
            .host("flaky.test")
            .send(gw)
            .await
            .expect("request");
        assert_eq!(r.status, 200);
    }
    assert_eq!(good.requests() - good_before, 20);
    assert_eq!(bad.requests(), ejected);
    let stats = envoy
        .admin_get("/stats?filter=outlier_detection.ejections_enforced_consecutive_5xx")
        .await
        .expect("stats");
    assert!(
        stats.contains(
            "outbound|80||flaky.test.outlier_detection.ejections_enforced_consecutive_5xx: 1"
        ),
        "{stats}"
    );

    // Circuit breaking: one connection and one pending request; of 8 concurrent slow
    // requests, those beyond them overflow at once with 503, the others are served.
    let slow = || async {
        Request::get("/")
            .host("breaker.test")
            .header("x-delay-ms", "1000")
            .send(gw)
            .await
            .map(|r| r.status)
            .map_err(|e| e.to_string())
    };
    let statuses = futures::future::join_all((0..8).map(|_| slow())).await;
    let ok = statuses.iter().filter(|s| **s == Ok(200)).count();
    let overflowed = statuses.iter().filter(|s| **s == Ok(503)).count();
    assert!(
        ok >= 1 && overflowed >= 1 && ok + overflowed == 8,
        "{statuses:?}"
    );
    assert!(breaker.requests() >= 1);
    let overflow = envoy
        .admin_get("/stats?filter=breaker.test.upstream_rq_pending_overflow")
        .await
        .expect("stats");
    assert!(
        !overflow.contains("upstream_rq_pending_overflow: 0"),
        "no pending overflow: {overflow}"
    );
    // The rule's HTTP options are valid Envoy config: nothing was rejected.
    let rejected = envoy.stat_sum("update_rejected").await;
    assert_eq!(rejected, 0, "the gateway rejected {rejected} xDS updates");
    drop(envoy);
    drop(cp);
}

// ---------------------------------------------------------------------------------------
// connectionPool → valid Envoy config

/// The connection pools of the matrix: each `trafficPolicy.connectionPool` field
/// docs/istio-compatibility.md lists as supported, alone (with the doc's example value),
/// then the circuit-breaking task's rule, then every field at once (with and without
/// `useClientProtocol`).
fn connection_pools() -> Vec<serde_json::Value> {
    const DOC: &str = include_str!("../../docs/istio-compatibility.md");
    let mut pools = Vec::new();
    let mut all = serde_json::json!({});
    for line in DOC.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || cells[2] != "supported" {
            continue;
        }
        let Some(field) = cells[1]
            .trim_matches('`')
            .strip_prefix("trafficPolicy.connectionPool.")
        else {
            continue;
        };
        let (side, name) = field.split_once('.').expect("tcp.x or http.x");
        let value: serde_json::Value =
            shoal_common::yaml::from_str(cells[3].trim_matches('`')).expect("example is YAML");
        pools.push(serde_json::json!({ side: { name: value.clone() } }));
        all[side][name] = value;
    }
    assert!(
        pools.len() >= 13,
        "the doc's connectionPool rows were not found: {pools:?}"
    );
    pools.push(serde_json::json!({
        "tcp": {"maxConnections": 1},
        "http": {"http1MaxPendingRequests": 1, "maxRequestsPerConnection": 1},
    }));
    let mut without_client_protocol = all.clone();
    if let Some(http) = without_client_protocol["http"].as_object_mut() {
        http.remove("useClientProtocol");
    }
    pools.push(all);
    pools.push(without_client_protocol);
    pools
}

/// One ServiceEntry (HTTP, HTTP2, GRPC and TCP ports) and its DestinationRule per pool and
/// TLS mode.
fn pool_manifests(pools: &[serde_json::Value]) -> (String, usize) {
    let mut out = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n---\n");
    let mut hosts = 0;
    for (i, pool) in pools.iter().enumerate() {
        for tls in ["", ", tls: {mode: ISTIO_MUTUAL}"] {
            let name = format!("pool-{i}-{}", if tls.is_empty() { "plain" } else { "mtls" });
            let host = format!("{name}.demo.mesh");
            out += &format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: demo}}\n\
                 spec:\n  hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n\
                 \x20 ports:\n  - {{number: 80, name: http, protocol: HTTP}}\n\
                 \x20 - {{number: 81, name: http2, protocol: HTTP2}}\n\
                 \x20 - {{number: 82, name: grpc, protocol: GRPC}}\n\
                 \x20 - {{number: 83, name: tcp, protocol: TCP}}\n\
                 \x20 endpoints: [{{address: 127.0.0.1}}]\n---\n\
                 apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: demo}}\n\
                 spec:\n  host: {host}\n  trafficPolicy: {{connectionPool: {pool}{tls}}}\n---\n"
            );
            hosts += 1;
        }
    }
    (out, hosts)
}

/// The clusters a sidecar of `demo` gets, over SotW ADS.
async fn sidecar_clusters(
    xds: SocketAddr,
) -> Vec<shoal_proto::pb::envoy::config::cluster::v3::Cluster> {
    use prost::Message;
    sidecar_resources(xds, shoal_proto::CLUSTER_TYPE, None)
        .await
        .iter()
        .map(|any| {
            shoal_proto::pb::envoy::config::cluster::v3::Cluster::decode(&*any.value)
                .expect("a Cluster")
        })
        .collect()
}

/// The first State-of-the-World response of `type_url` for the test's sidecar node, with
/// node metadata `ISTIO_VERSION` when given (istio-proxy).
async fn sidecar_resources(
    xds: SocketAddr,
    type_url: &str,
    istio_version: Option<&str>,
) -> Vec<shoal_proto::Any> {
    use shoal_proto::pb::envoy::config::core::v3::Node as XdsNode;
    use shoal_proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    use shoal_proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use shoal_proto::pb::google::protobuf::{value::Kind, Struct, Value};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{xds}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to xDS");
    let request = DiscoveryRequest {
        node: Some(XdsNode {
            id: "sidecar~10.9.0.1~client.demo~demo.svc.cluster.local".into(),
            metadata: istio_version.map(|v| Struct {
                fields: [(
                    "ISTIO_VERSION".to_string(),
                    Value {
                        kind: Some(Kind::StringValue(v.into())),
                    },
                )]
                .into_iter()
                .collect(),
            }),
            ..Default::default()
        }),
        type_url: type_url.into(),
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(request).expect("send");
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .expect("ADS stream")
        .into_inner();
    let response = tokio::time::timeout(CONVERGE, responses.message())
        .await
        .expect("a response in time")
        .expect("ADS response")
        .expect("a response");
    response.resources
}

/// A bootstrap holding `clusters` as static clusters, with the `xds-grpc` (ADS, which the
/// EDS clusters name) and `sds-grpc` (istio-agent's SDS, which the mTLS ones name) clusters
/// a sidecar's bootstrap has.
fn bootstrap_holding(
    clusters: Vec<shoal_proto::pb::envoy::config::cluster::v3::Cluster>,
) -> shoal_proto::pb::envoy::config::bootstrap::v3::Bootstrap {
    bootstrap_with(clusters, Vec::new())
}

/// A bootstrap holding `clusters` and `listeners` as static resources (plus the xDS and SDS
/// clusters they refer to), for `envoy --mode validate`.
fn bootstrap_with(
    clusters: Vec<shoal_proto::pb::envoy::config::cluster::v3::Cluster>,
    listeners: Vec<shoal_proto::pb::envoy::config::listener::v3::Listener>,
) -> shoal_proto::pb::envoy::config::bootstrap::v3::Bootstrap {
    use shoal_proto::pb::envoy::config::bootstrap::v3::{bootstrap, Bootstrap};
    use shoal_proto::pb::envoy::config::cluster::v3::{cluster, Cluster};
    use shoal_proto::pb::envoy::config::core::v3::{
        address, api_config_source::ApiType, grpc_service, socket_address, Address,
        ApiConfigSource, GrpcService, Node as XdsNode, SocketAddress,
    };
    use shoal_proto::pb::envoy::config::endpoint::v3::{
        lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
    };
    let static_cluster = |name: &str, port: u32| {
        Cluster {
        name: name.into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        typed_extension_protocol_options: [(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(),
            shoal_proto::pack(
                "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                &shoal_proto::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions {
                    upstream_protocol_options: Some(
                        shoal_proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                            shoal_proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::ExplicitHttpConfig {
                                protocol_config: Some(
                                    shoal_proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(Default::default()),
                                ),
                            },
                        ),
                    ),
                    ..Default::default()
                },
            ),
        )]
        .into_iter()
        .collect(),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(Address {
                            address: Some(address::Address::SocketAddress(SocketAddress {
                                address: "127.0.0.1".into(),
                                port_specifier: Some(socket_address::PortSpecifier::PortValue(
                                    port,
                                )),
                                ..Default::default()
                            })),
                        }),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    };
    let mut all = clusters;
    all.push(static_cluster("xds-grpc", 15010));
    all.push(static_cluster("sds-grpc", 15011));
    Bootstrap {
        node: Some(XdsNode {
            id: "sidecar~10.9.0.1~client.demo~demo.svc.cluster.local".into(),
            cluster: "client.demo".into(),
            ..Default::default()
        }),
        static_resources: Some(bootstrap::StaticResources {
            clusters: all,
            listeners,
            ..Default::default()
        }),
        dynamic_resources: Some(bootstrap::DynamicResources {
            ads_config: Some(ApiConfigSource {
                api_type: ApiType::Grpc as i32,
                transport_api_version: 2, // V3
                grpc_services: vec![GrpcService {
                    target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                        grpc_service::EnvoyGrpc {
                            cluster_name: "xds-grpc".into(),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// DestinationRule connection pools (every supported field, the circuit-breaking task's
/// rule, all at once) on HTTP, HTTP2, GRPC and TCP ports, with and without ISTIO_MUTUAL:
/// every cluster shoal generates is valid Envoy config (`envoy --mode validate` over a
/// bootstrap holding them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_pool_matrix_is_valid_envoy_config() {
    let pools = connection_pools();
    let (manifests, hosts) = pool_manifests(&pools);
    let dir = tempfile::tempdir().expect("manifest dir");
    std::fs::write(dir.path().join("pools.yaml"), manifests).expect("write manifests");
    let server = ShoalServer::standalone(dir.path()).await;

    let clusters = sidecar_clusters(server.xds_addr()).await;
    let pooled: Vec<_> = clusters
        .iter()
        .filter(|c| c.name.contains(".demo.mesh"))
        .collect();
    assert_eq!(pooled.len(), hosts * 4, "a cluster per host and port");
    let with_options = pooled
        .iter()
        .filter(|c| !c.typed_extension_protocol_options.is_empty())
        .count();
    assert!(
        with_options >= hosts * 2,
        "HTTP options on the HTTP/2 and gRPC ports at least ({with_options})"
    );
    let mtls = pooled
        .iter()
        .filter(|c| c.transport_socket.is_some())
        .count();
    assert_eq!(mtls, hosts * 2, "the ISTIO_MUTUAL half originates TLS");

    let path = dir.path().join("bootstrap.pb");
    std::fs::write(
        &path,
        prost::Message::encode_to_vec(&bootstrap_holding(clusters)),
    )
    .expect("write bootstrap");
    if let Err(out) = shoal_tests::envoy::validate(&path).await {
        panic!("Envoy rejects the generated clusters:\n{out}");
    }
}

/// istio-proxy's telemetry filters go only to a node that says it is istio-proxy
/// (`ISTIO_VERSION`): the listeners and clusters an upstream Envoy gets validate
/// (`envoy --mode validate`), and the istio-proxy flavour of the same listeners is exactly
/// what upstream Envoy cannot load (`istio.*` filters), which is why it is gated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_envoy_gets_config_it_loads_istio_proxy_gets_telemetry() {
    use prost::Message;
    use shoal_proto::pb::envoy::config::cluster::v3::Cluster;
    use shoal_proto::pb::envoy::config::listener::v3::Listener;
    let pools = connection_pools();
    let (manifests, _) = pool_manifests(&pools);
    let dir = tempfile::tempdir().expect("manifest dir");
    std::fs::write(dir.path().join("pools.yaml"), manifests).expect("write manifests");
    let server = ShoalServer::standalone(dir.path()).await;
    let decode = |anys: Vec<shoal_proto::Any>| -> Vec<Listener> {
        anys.iter()
            .map(|a| Listener::decode(&*a.value).expect("a Listener"))
            .collect()
    };
    let clusters: Vec<Cluster> = sidecar_clusters(server.xds_addr()).await;
    let upstream =
        decode(sidecar_resources(server.xds_addr(), shoal_proto::LISTENER_TYPE, None).await);
    assert!(upstream.len() > 4, "{} listeners", upstream.len());
    let path = dir.path().join("upstream.pb");
    std::fs::write(
        &path,
        bootstrap_with(clusters.clone(), upstream).encode_to_vec(),
    )
    .expect("write bootstrap");
    if let Err(out) = shoal_tests::envoy::validate(&path).await {
        panic!("upstream Envoy rejects the config shoal sends it:\n{out}");
    }

    let istio = decode(
        sidecar_resources(
            server.xds_addr(),
            shoal_proto::LISTENER_TYPE,
            Some("1.26.0"),
        )
        .await,
    );
    let path = dir.path().join("istio-proxy.pb");
    std::fs::write(&path, bootstrap_with(clusters, istio).encode_to_vec())
        .expect("write bootstrap");
    match shoal_tests::envoy::validate(&path).await {
        Ok(()) => panic!("upstream Envoy loaded istio-proxy's filters"),
        Err(out) => assert!(out.contains("istio."), "{out}"),
    }
}

/// HBONE origination (issue 21): the `connect_originate` listener and cluster and the
/// `hbone` transport socket match istio-proxy gets load in a real Envoy when its bootstrap
/// has the internal listener extension (istio-proxy's always has), and not without it —
/// which is why they go only to istio-proxy (`ISTIO_VERSION`), never to an upstream Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hbone_origination_loads_with_the_internal_listener_extension() {
    use prost::Message;
    use shoal_proto::pb::envoy::config::cluster::v3::Cluster;
    use shoal_proto::pb::envoy::config::core::v3::TypedExtensionConfig;
    use shoal_proto::pb::envoy::config::listener::v3::Listener;
    let pools = connection_pools();
    let (manifests, _) = pool_manifests(&pools);
    let dir = tempfile::tempdir().expect("manifest dir");
    std::fs::write(dir.path().join("pools.yaml"), manifests).expect("write manifests");
    let server = ShoalServer::standalone(dir.path()).await;
    let istio = Some("1.26.0");
    // istio-proxy's service clusters carry its telemetry too; what is checked here is the
    // HBONE part, so the upstream flavour of each service cluster gets istio-proxy's
    // transport socket matches (the `hbone` one first).
    let istio_clusters: Vec<Cluster> =
        sidecar_resources(server.xds_addr(), shoal_proto::CLUSTER_TYPE, istio)
            .await
            .iter()
            .map(|a| Cluster::decode(&*a.value).expect("a Cluster"))
            .collect();
    let connect = istio_clusters
        .iter()
        .find(|c| c.name == "connect_originate")
        .expect("istio-proxy gets connect_originate")
        .clone();
    let matches: BTreeMap<String, _> = istio_clusters
        .iter()
        .map(|c| (c.name.clone(), c.transport_socket_matches.clone()))
        .collect();
    let mut clusters = sidecar_clusters(server.xds_addr()).await;
    assert!(clusters.iter().all(|c| c.name != "connect_originate"));
    let mut tunnelled = 0;
    for c in clusters
        .iter_mut()
        .filter(|c| c.name.contains(".demo.mesh"))
    {
        let m = &matches[&c.name];
        if m.first().is_some_and(|m| m.name == "hbone") {
            tunnelled += 1;
            c.transport_socket = None;
            c.transport_socket_matches = m.clone();
        }
    }
    assert!(tunnelled > 0, "service clusters get the hbone match");
    clusters.push(connect);
    let listener: Vec<Listener> =
        sidecar_resources(server.xds_addr(), shoal_proto::LISTENER_TYPE, istio)
            .await
            .iter()
            .map(|a| Listener::decode(&*a.value).expect("a Listener"))
            .filter(|l| l.name == "connect_originate")
            .collect();
    assert_eq!(listener.len(), 1, "istio-proxy gets the internal listener");

    let mut with_extension = bootstrap_with(clusters.clone(), listener.clone());
    with_extension.bootstrap_extensions = vec![TypedExtensionConfig {
        name: "envoy.bootstrap.internal_listener".into(),
        typed_config: Some(shoal_proto::Any {
            type_url: "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener".into(),
            value: Vec::new(),
        }),
    }];
    let path = dir.path().join("hbone.pb");
    std::fs::write(&path, with_extension.encode_to_vec()).expect("write bootstrap");
    if let Err(out) = shoal_tests::envoy::validate(&path).await {
        panic!("Envoy with the internal listener extension rejects HBONE origination:\n{out}");
    }

    let path = dir.path().join("hbone-no-extension.pb");
    std::fs::write(&path, bootstrap_with(clusters, listener).encode_to_vec())
        .expect("write bootstrap");
    match shoal_tests::envoy::validate(&path).await {
        Ok(()) => panic!("Envoy loaded an internal listener without the extension"),
        Err(out) => assert!(out.to_lowercase().contains("internal"), "{out}"),
    }
}
