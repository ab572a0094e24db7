//! End to end, DestinationRule traffic policies through a real Envoy gateway:
//! - consistent hash: the same `x-user` header always reaches the same backend;
//! - outlier detection: a backend that answers 503 is ejected after consecutive errors
//!   and stops receiving traffic.
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
    out += r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ingress, namespace: demo}
spec:
  hosts: [sticky.test, flaky.test]
  gateways: [istio-system/ingress]
  http:
  - match: [{headers: {":authority": {prefix: sticky.test}}}]
    route: [{destination: {host: sticky.test}}]
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
"#;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_and_outlier_ejection() {
    let ips: Vec<_> = (21..=25).map(loopback).collect();
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
    drop(envoy);
    drop(cp);
}
