//! The capture recipe of scripts/mesh-netns.sh, proven with static Envoy sidecars (no shoal):
//! pods are network namespaces with istio-iptables' nat rules and an Envoy as uid 1337 whose
//! bootstrap has Istio's two capture listeners, `virtualOutbound` (15001, original
//! destination passthrough) and `virtualInbound` (15006, passthrough from 127.0.0.6).
//!
//! Needs root and iptables (scripts/test.sh installs it); fails without them unless
//! `SHOAL_SKIP_NETNS=1`.
#![forbid(unsafe_code)]

use shoal_tests::netns::{self, Pod, PROXY_UID};
use shoal_tests::{Envoy, MeshNet};
use std::net::{Ipv4Addr, SocketAddr};

const OUTBOUND_CX: &str = "listener.0.0.0.0_15001.downstream_cx_total";
const INBOUND_CX: &str = "listener.0.0.0.0_15006.downstream_cx_total";
const PASSTHROUGH_CX: &str = "cluster.PassthroughCluster.upstream_cx_total";
const INBOUND_PASSTHROUGH_CX: &str = "cluster.InboundPassthroughCluster.upstream_cx_total";

/// A service: connections from the pod to `vip:port` go to `endpoint`.
struct Service {
    name: &'static str,
    vip: Ipv4Addr,
    port: u16,
    endpoint: SocketAddr,
}

/// A static sidecar bootstrap shaped like Istio's: admin on the pod IP, `virtualOutbound`
/// on 15001 (`use_original_dst`: hands connections to the listener of their original
/// destination, one per service `VIP_PORT` that binds no socket, else passes them through
/// to the original destination) and `virtualInbound` on 15006 (original destination
/// passthrough, connecting to the app from 127.0.0.6).
fn sidecar_bootstrap(pod: &Pod, services: &[Service]) -> String {
    let mut listeners = String::new();
    let mut clusters = String::new();
    for s in services {
        // As Istio does: one listener per service address that binds no socket;
        // virtualOutbound (use_original_dst) hands captured connections to it.
        listeners.push_str(&format!(
            r#"  - name: {vip}_{port}
    address:
      socket_address: {{ address: {vip}, port_value: {port} }}
    bind_to_port: false
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: {name}
          cluster: {name}
"#,
            vip = s.vip,
            port = s.port,
            name = s.name,
        ));
        clusters.push_str(&format!(
            r#"  - name: {name}
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: {ip}, port_value: {port} }}
"#,
            name = s.name,
            ip = s.endpoint.ip(),
            port = s.endpoint.port(),
        ));
    }
    format!(
        r#"node: {{ id: "sidecar~{ip}~{pod}.demo~demo.svc.cluster.local", cluster: {pod}.demo }}
admin:
  address:
    socket_address: {{ address: {ip}, port_value: {admin} }}
static_resources:
  listeners:
  - name: virtualOutbound
    address:
      socket_address: {{ address: 0.0.0.0, port_value: 15001 }}
    use_original_dst: true
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: PassthroughCluster
          cluster: PassthroughCluster
  - name: virtualInbound
    address:
      socket_address: {{ address: 0.0.0.0, port_value: 15006 }}
    listener_filters:
    - name: envoy.filters.listener.original_dst
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: InboundPassthroughCluster
          cluster: InboundPassthroughCluster
{listeners}  clusters:
  - name: PassthroughCluster
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 1s
  - name: InboundPassthroughCluster
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 1s
    upstream_bind_config:
      source_address: {{ address: {source}, port_value: 0 }}
{clusters}"#,
        ip = pod.ip(),
        pod = pod.name(),
        admin = netns::ADMIN_PORT,
        source = netns::INBOUND_PASSTHROUGH_SOURCE,
    )
}

/// The counters that show which way connections went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    outbound: u64,
    inbound: u64,
    passthrough: u64,
    inbound_passthrough: u64,
}

async fn counts(envoy: &Envoy) -> Counts {
    Counts {
        outbound: envoy.stat_sum(OUTBOUND_CX).await,
        inbound: envoy.stat_sum(INBOUND_CX).await,
        passthrough: envoy.stat_sum(PASSTHROUGH_CX).await,
        inbound_passthrough: envoy.stat_sum(INBOUND_PASSTHROUGH_CX).await,
    }
}

#[tokio::test]
async fn captured_traffic_goes_through_both_sidecars() {
    if netns::skip_if_unavailable() {
        return;
    }
    let net = MeshNet::create();
    let client = net.add_pod("client");
    let server = net.add_pod("server");
    client.capture();
    server.capture();
    server.capture(); // idempotent
    let rules = server.iptables_save();
    assert_eq!(
        rules.matches("-j ISTIO_INBOUND").count(),
        1,
        "capture twice installs the rules once:\n{rules}"
    );
    for rule in [
        "--to-ports 15001",
        "--to-ports 15006",
        "--uid-owner 1337 -j RETURN",
        "--gid-owner 1337 -j RETURN",
        "-s 127.0.0.6/32 -o lo -j RETURN",
        "--dport 15000 -j RETURN",
    ] {
        assert!(rules.contains(rule), "no {rule:?} in:\n{rules}");
    }

    let _http = server.http_server("server", 8080).await;
    let _echo = server.tcp_echo("server", 9000).await;
    let echo_vip = Ipv4Addr::new(198, 19, 0, 10);
    let client_envoy = Envoy::start_in_pod(
        &client,
        &sidecar_bootstrap(
            &client,
            &[Service {
                name: "echo",
                vip: echo_vip,
                port: 9000,
                endpoint: SocketAddr::from((server.ip(), 9000)),
            }],
        ),
    )
    .await;
    let server_envoy = Envoy::start_in_pod(&server, &sidecar_bootstrap(&server, &[])).await;
    let (c0, s0) = (counts(&client_envoy).await, counts(&server_envoy).await);

    // HTTP to the server pod's IP: the client's outbound passthrough, then the server's
    // inbound passthrough, which connects to the app from 127.0.0.6 (as in Istio).
    let url = format!("http://{}:8080/hello", server.ip());
    let out = client.run(&["http-get", &url, "-H", "x-test:1"]).await;
    out.expect_success("http-get through both sidecars");
    let (status, body) = out.http().unwrap();
    assert_eq!(status, 200, "{out:?}");
    assert_eq!(body["backend"], "server", "{body}");
    assert_eq!(body["path"], "/hello", "{body}");
    assert_eq!(body["headers"]["x-test"], "1", "{body}");
    assert_eq!(body["host"], format!("{}:8080", server.ip()), "{body}");
    let peer: SocketAddr = body["peer"].as_str().unwrap().parse().unwrap();
    assert_eq!(peer.ip(), netns::INBOUND_PASSTHROUGH_SOURCE, "{body}");
    // The original destination is kept: the app sees its own pod IP and port.
    assert_eq!(body["local"], format!("{}:8080", server.ip()), "{body}");

    // Plain TCP, the same way.
    let target = format!("{}:9000", server.ip());
    let out = client.run(&["tcp-send", &target, "hello"]).await;
    assert_eq!(out.expect_success("tcp-send").trim(), "server:hello");

    let (c1, s1) = (counts(&client_envoy).await, counts(&server_envoy).await);
    assert_eq!(
        c1.outbound - c0.outbound,
        2,
        "client outbound: {c0:?} -> {c1:?}"
    );
    assert_eq!(c1.passthrough - c0.passthrough, 2, "{c0:?} -> {c1:?}");
    assert_eq!(c1.inbound, c0.inbound, "client inbound: {c0:?} -> {c1:?}");
    assert_eq!(
        s1.inbound - s0.inbound,
        2,
        "server inbound: {s0:?} -> {s1:?}"
    );
    assert_eq!(
        s1.inbound_passthrough - s0.inbound_passthrough,
        2,
        "{s0:?} -> {s1:?}"
    );
    assert_eq!(
        s1.outbound, s0.outbound,
        "server outbound: {s0:?} -> {s1:?}"
    );

    // A ClusterIP exists nowhere: the connection is captured before a packet leaves the pod,
    // and the client's sidecar sends it to the service's endpoint (the server pod).
    let out = client
        .run(&["tcp-send", &format!("{echo_vip}:9000"), "via-vip"])
        .await;
    assert_eq!(
        out.expect_success("tcp-send to a VIP").trim(),
        "server:via-vip"
    );
    let (c2, s2) = (counts(&client_envoy).await, counts(&server_envoy).await);
    // virtualOutbound accepted it and handed it to the service's listener (which counts it).
    let vip_listener = format!("listener.{echo_vip}_9000.downstream_cx_total");
    assert_eq!(
        client_envoy.stat_sum(&vip_listener).await,
        1,
        "{vip_listener}"
    );
    assert_eq!(
        client_envoy
            .stat_sum("cluster.echo.upstream_cx_total")
            .await,
        1
    );
    assert_eq!(
        c2.passthrough, c1.passthrough,
        "not passthrough: {c1:?} -> {c2:?}"
    );
    assert_eq!(s2.inbound - s1.inbound, 1, "{s1:?} -> {s2:?}");
}

#[tokio::test]
async fn the_proxy_uid_and_calls_to_the_own_pod_are_not_captured() {
    if netns::skip_if_unavailable() {
        return;
    }
    let net = MeshNet::create();
    let client = net.add_pod("client");
    let server = net.add_pod("server");
    client.capture();
    server.capture();
    let _echo = server.tcp_echo("server", 9000).await;
    let client_envoy = Envoy::start_in_pod(&client, &sidecar_bootstrap(&client, &[])).await;
    let server_envoy = Envoy::start_in_pod(&server, &sidecar_bootstrap(&server, &[])).await;
    let (c0, s0) = (counts(&client_envoy).await, counts(&server_envoy).await);
    let target = format!("{}:9000", server.ip());

    // uid 1337 (what the sidecar runs as) leaves the client pod directly; the server pod
    // still captures it inbound.
    let out = client
        .run_as(PROXY_UID, PROXY_UID, &["tcp-send", &target, "as-1337"])
        .await;
    assert_eq!(
        out.expect_success("tcp-send as 1337").trim(),
        "server:as-1337"
    );
    let (c1, s1) = (counts(&client_envoy).await, counts(&server_envoy).await);
    assert_eq!(c1, c0, "the client's sidecar saw uid 1337's connection");
    assert_eq!(s1.inbound - s0.inbound, 1, "{s0:?} -> {s1:?}");

    // Another uid is captured.
    let out = client
        .run_as(1000, 1000, &["tcp-send", &target, "as-1000"])
        .await;
    assert_eq!(
        out.expect_success("tcp-send as 1000").trim(),
        "server:as-1000"
    );
    let c2 = counts(&client_envoy).await;
    assert_eq!(c2.outbound - c1.outbound, 1, "{c1:?} -> {c2:?}");

    // The app calling its own pod IP goes over lo, uncaptured both ways.
    let s2 = counts(&server_envoy).await;
    let out = server.run(&["tcp-send", &target, "self"]).await;
    assert_eq!(out.expect_success("tcp-send to self").trim(), "server:self");
    assert_eq!(counts(&server_envoy).await, s2);

    // The Envoy admin port is excluded from inbound capture: the test reaches it directly.
    let before = counts(&server_envoy).await;
    assert!(server_envoy.admin_get("/ready").await.is_ok());
    assert_eq!(counts(&server_envoy).await, before);
}

#[test]
fn networks_are_removed_when_a_test_panics() {
    if netns::skip_if_unavailable() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let panicked = std::thread::spawn(move || {
        let net = MeshNet::create();
        let pod = net.add_pod("doomed");
        pod.capture();
        tx.send((net.name().to_string(), net.host_ip())).unwrap();
        panic!("on purpose");
    })
    .join();
    assert!(panicked.is_err());
    let (name, host_ip) = rx.recv().unwrap();
    let namespaces = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let namespaces = String::from_utf8_lossy(&namespaces.stdout);
    assert!(
        !namespaces.contains(&format!("{name}-")),
        "left behind: {namespaces}"
    );
    let addrs = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .unwrap();
    let addrs = String::from_utf8_lossy(&addrs.stdout);
    assert!(
        !addrs.contains(&format!("{name}-h")) && !addrs.contains(&format!(" {host_ip}/")),
        "left behind: {addrs}"
    );
}
