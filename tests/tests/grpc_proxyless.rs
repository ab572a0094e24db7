//! Proxyless gRPC end to end: manifests on disk → `shoal-server --standalone` → gRPC's own
//! xDS client (the `grpcio` wheel from PyPI, `GENERATOR: grpc`) → plain gRPC backends.
//!
//! The client dials `xds:///echo.default.svc.cluster.local:7070` and `xds:///echo:7070`;
//! shoal serves what istiod's `grpc` generator serves (api_listeners, per-service route
//! tables, EDS clusters with DestinationRule subsets). Nothing may be rejected: shoal's
//! `shoal_xds_rejects_total` stays 0.
//!
//! Needs the binaries (`cargo build --workspace --bins`) and python3 with grpcio
//! (scripts/test.sh installs it).
#![forbid(unsafe_code)]

use shoal_tests::grpc_xds::{bootstrap, Calls, GrpcBackends, GrpcClient, ProxylessNode};
use shoal_tests::mesh::write_manifest;
use shoal_tests::ports::{free_port_on, loopback};
use shoal_tests::{eventually, ShoalServer};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Time for a fresh server and client to converge.
const CONVERGE: Duration = Duration::from_secs(20);
/// A manifest change must reach the client within this.
const PROPAGATE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(100);
const FQDN: &str = "xds:///echo.default.svc.cluster.local:7070";
const SHORT: &str = "xds:///echo:7070";

/// `(pod, version, loopback address)` of the echo pods; `echo-v1b` joins later.
const PODS: [(&str, &str, u8); 3] = [
    ("echo-v1", "v1", 2),
    ("echo-v2", "v2", 3),
    ("echo-v1b", "v1", 4),
];

fn workload(pods: &[(&str, &str, u8)], port: u16) -> String {
    let mut out = String::new();
    for (name, version, ip) in pods {
        out.push_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n\
             \x20   app: echo\n    version: {version}\nspec:\n  serviceAccountName: echo\n\
             \x20 containers:\n  - name: echo\n    image: example.com/echo\n\
             status:\n  phase: Running\n  podIP: 127.0.0.{ip}\n---\n"
        ));
    }
    out.push_str(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: echo-1\n\
         \x20 namespace: default\n  labels:\n    kubernetes.io/service-name: echo\n\
         addressType: IPv4\nports:\n- name: grpc\n  port: {port}\n  protocol: TCP\nendpoints:\n"
    ));
    for (name, _, ip) in pods {
        out.push_str(&format!(
            "- addresses: [\"127.0.0.{ip}\"]\n  conditions:\n    ready: true\n  targetRef:\n\
             \x20   kind: Pod\n    name: {name}\n    namespace: default\n"
        ));
    }
    out
}

fn virtual_service(default_subset: &str) -> String {
    format!(
        r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: echo
  namespace: default
spec:
  hosts: [echo]
  http:
  - name: fault
    match: [{{headers: {{x-fault: {{exact: "yes"}}}}}}]
    fault: {{abort: {{grpcStatus: RESOURCE_EXHAUSTED, percentage: {{value: 100}}}}}}
    route: [{{destination: {{host: echo, subset: v1}}}}]
  - name: no-retries
    match: [{{headers: {{x-no-retries: {{exact: "yes"}}}}}}]
    retries: {{attempts: 0}}
    route: [{{destination: {{host: echo, subset: v1}}}}]
  - name: v2-by-header
    match: [{{headers: {{x-version: {{exact: v2}}}}}}]
    route: [{{destination: {{host: echo, subset: v2}}}}]
  - name: split
    match: [{{headers: {{x-split: {{exact: "yes"}}}}}}]
    route:
    - {{destination: {{host: echo, subset: v1}}, weight: 50}}
    - {{destination: {{host: echo, subset: v2}}, weight: 50}}
  - name: default
    route: [{{destination: {{host: echo, subset: {default_subset}}}}}]
"#
    )
}

/// The subsets v1 and v2 of `echo`, with `policy` (YAML at the rule's `trafficPolicy`
/// level, indented for it) if not empty.
fn destination_rule(policy: &str) -> String {
    let policy = if policy.is_empty() {
        String::new()
    } else {
        format!("  trafficPolicy:\n{policy}")
    };
    format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: echo\n\
         \x20 namespace: default\nspec:\n  host: echo\n{policy}  subsets:\n  - name: v1\n\
         \x20   labels:\n      version: v1\n  - name: v2\n    labels:\n      version: v2\n"
    )
}

fn write_mesh(dir: &Path, port: u16) {
    write_manifest(
        dir,
        "echo.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n---\n\
         apiVersion: v1\nkind: Service\nmetadata:\n  name: echo\n  namespace: default\n\
         spec:\n  clusterIP: 10.96.0.70\n  selector:\n    app: echo\n  ports:\n\
         \x20 - name: grpc\n    port: 7070\n    targetPort: grpc\n",
    );
    write_manifest(dir, "pods.yaml", &workload(&PODS[..2], port));
    write_manifest(dir, "destinationrule.yaml", &destination_rule(""));
    write_manifest(dir, "virtualservice.yaml", &virtual_service("v1"));
}

/// A GRPCRoute on the Service echo (GAMMA): `x-canary: yes` to echo-canary, the rest to
/// echo.
const GAMMA_GRPC_ROUTE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: echo-canary, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 7070}]
  rules:
  - matches: [{headers: [{name: x-canary, value: "yes"}]}]
    backendRefs: [{name: echo-canary, port: 7070}]
  - backendRefs: [{name: echo, port: 7070}]
"#;

/// The Service echo-canary: echo-v2 alone.
fn canary_service(port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: echo-canary\n  namespace: default\n\
         spec:\n  clusterIP: 10.96.0.71\n  selector:\n    app: echo\n    version: v2\n  ports:\n\
         \x20 - name: grpc\n    port: 7070\n    targetPort: grpc\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: echo-canary-1\n\
         \x20 namespace: default\n  labels:\n    kubernetes.io/service-name: echo-canary\n\
         addressType: IPv4\nports:\n- name: grpc\n  port: {port}\n  protocol: TCP\nendpoints:\n\
         - addresses: [\"127.0.0.3\"]\n  conditions:\n    ready: true\n  targetRef:\n\
         \x20   kind: Pod\n    name: echo-v2\n    namespace: default\n"
    )
}

/// Polls `target` until a batch of `n` calls satisfies `ok`, and returns it.
async fn until(
    client: &GrpcClient,
    within: Duration,
    target: &str,
    n: u32,
    headers: &[(&str, &str)],
    ok: impl Fn(&Calls) -> bool,
) -> Calls {
    eventually(within, POLL, || async {
        let calls = client.call(target, n, headers).await?;
        if ok(&calls) {
            Ok(calls)
        } else {
            Err(anyhow::anyhow!("{target} {headers:?}: {calls:?}"))
        }
    })
    .await
}

const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Every stream of `node` has acknowledged the last response of each of `types`, none
/// rejected, and holds at least one resource of each (gRPC's side of the exchange, as
/// `/debug/syncz` records it). Returns the number of streams (gRPC runs an xDS client per
/// channel target).
async fn all_acked(server: &ShoalServer, node: &str, types: &[&str]) -> anyhow::Result<usize> {
    let syncz = server.syncz().await?;
    let streams: Vec<&serde_json::Value> = syncz
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["node_id"] == node)
        .collect();
    // No stream yet is not "all acknowledged": the node may not have connected.
    anyhow::ensure!(!streams.is_empty(), "no stream of {node} yet");
    for c in &streams {
        anyhow::ensure!(c["proxy_type"] == "proxyless", "{c}");
        for url in types {
            let t = &c["types"][*url];
            anyhow::ensure!(t["last_nack"].is_null(), "{url} rejected: {t}");
            anyhow::ensure!(
                t["sent_nonce"] == t["acked_nonce"] && t["resources"].as_u64() >= Some(1),
                "{url} not acknowledged: {t}"
            );
        }
    }
    Ok(streams.len())
}

/// The version of the listeners last sent to `node`'s (one) stream, once acknowledged.
async fn acked_lds(server: &ShoalServer, node: &str) -> anyhow::Result<String> {
    let syncz = server.syncz().await?;
    let t = syncz
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["node_id"] == node)
        .map(|c| c["types"][LDS].clone())
        .ok_or_else(|| anyhow::anyhow!("{node} not connected"))?;
    anyhow::ensure!(t["sent_nonce"] == t["acked_nonce"], "not acknowledged: {t}");
    Ok(t["sent_version"].as_str().unwrap_or_default().to_string())
}

async fn rejects(server: &ShoalServer) -> u64 {
    let text = server.admin_get("/metrics").await.expect("metrics").text();
    text.lines()
        .filter(|l| l.starts_with("shoal_xds_rejects_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_client_routes_through_shoal() {
    let port = free_port_on(&[loopback(2), loopback(3), loopback(4)]);
    let addr = |ip: u8| SocketAddr::from((loopback(ip), port));
    let _backends = GrpcBackends::start(
        &PODS
            .iter()
            .map(|(name, _, ip)| (*name, addr(*ip)))
            .collect::<Vec<_>>(),
    )
    .await;
    let dir = tempfile::tempdir().expect("manifest dir");
    write_mesh(dir.path(), port);
    let mut server = ShoalServer::standalone(dir.path()).await;
    let node = ProxylessNode {
        ip: "10.1.0.9",
        pod: "client-1",
        namespace: "default",
        labels: &[("app", "client")],
    };
    let node_id = node.id();
    let client = GrpcClient::start(&bootstrap(server.xds_addr(), &node)).await;

    // By FQDN and by short name: the default route, to subset v1.
    until(&client, CONVERGE, FQDN, 10, &[], |c| c.only(&["echo-v1"])).await;
    until(&client, CONVERGE, SHORT, 10, &[], |c| c.only(&["echo-v1"])).await;
    let streams = eventually(CONVERGE, POLL, || {
        all_acked(&server, &node_id, &[LDS, RDS, CDS, EDS])
    })
    .await;
    assert_eq!(streams, 2, "one xDS stream per target");
    // The config dump shows what the node asked for (its newest stream's names).
    let dump = server
        .admin_get(&format!("/debug/config_dump?proxy={node_id}"))
        .await
        .unwrap()
        .text();
    for want in ["echo:7070", "outbound|7070||echo.default.svc.cluster.local"] {
        assert!(dump.contains(want), "{want} not in {dump}");
    }

    // A header match routes to subset v2.
    let v2 = client.call(FQDN, 20, &[("x-version", "v2")]).await.unwrap();
    assert!(v2.only(&["echo-v2"]), "{v2:?}");

    // Fault injection (gRPC's fault filter): an abort with a gRPC status.
    let fault = client.call(FQDN, 1, &[("x-fault", "yes")]).await.unwrap();
    assert!(
        fault.backends.is_empty()
            && fault
                .errors
                .keys()
                .all(|e| e.starts_with("RESOURCE_EXHAUSTED")),
        "{fault:?}"
    );

    // Retries: Istio's default policy (2 retries, `unavailable` among the conditions)
    // hides a failure; `attempts: 0` does not.
    let retried = client.call(FQDN, 1, &[("x-fail-once", "a")]).await.unwrap();
    assert!(retried.only(&["echo-v1"]), "{retried:?}");
    let failed = client
        .call(FQDN, 1, &[("x-fail-once", "b"), ("x-no-retries", "yes")])
        .await
        .unwrap();
    assert!(
        failed.backends.is_empty() && failed.errors.keys().all(|e| e.starts_with("UNAVAILABLE")),
        "{failed:?}"
    );

    // A 50/50 split: each side within 50% ± 20% of 200 calls.
    let split = client.call(FQDN, 200, &[("x-split", "yes")]).await.unwrap();
    assert!(split.errors.is_empty(), "{split:?}");
    for pod in ["echo-v1", "echo-v2"] {
        let n = split.backends.get(pod).copied().unwrap_or_default();
        assert!((60..=140).contains(&n), "{pod}: {n} of 200 ({split:?})");
    }

    // An endpoint added reaches the live channel: v1 is now two pods, round robin.
    write_manifest(dir.path(), "pods.yaml", &workload(&PODS, port));
    until(&client, PROPAGATE, FQDN, 20, &[], |c| {
        c.only(&["echo-v1", "echo-v1b"]) && c.backends.len() == 2
    })
    .await;

    // A DestinationRule changed reaches it too: a consistent hash on `x-user` (ring hash,
    // the route's hash policy) keeps a user on one of v1's two pods.
    write_manifest(
        dir.path(),
        "destinationrule.yaml",
        &destination_rule(
            "    loadBalancer:\n      consistentHash:\n        httpHeaderName: x-user\n",
        ),
    );
    for user in ["alice", "bob"] {
        until(&client, PROPAGATE, FQDN, 20, &[("x-user", user)], |c| {
            c.only(&["echo-v1", "echo-v1b"]) && c.backends.len() == 1
        })
        .await;
    }

    // A route changed reaches it too.
    write_manifest(dir.path(), "virtualservice.yaml", &virtual_service("v2"));
    until(&client, PROPAGATE, SHORT, 10, &[], |c| c.only(&["echo-v2"])).await;

    // GAMMA: with the VirtualService gone, a GRPCRoute whose parent is the Service echo
    // routes the mesh's calls to echo: a header to the Service echo-canary (echo-v2 alone),
    // the rest to echo's pods.
    write_manifest(dir.path(), "virtualservice.yaml", GAMMA_GRPC_ROUTE);
    write_manifest(dir.path(), "canary.yaml", &canary_service(port));
    until(&client, PROPAGATE, FQDN, 10, &[("x-canary", "yes")], |c| {
        c.only(&["echo-v2"])
    })
    .await;
    until(&client, PROPAGATE, FQDN, 30, &[], |c| {
        c.errors.is_empty() && c.backends.len() == 3
    })
    .await;

    eventually(PROPAGATE, POLL, || {
        all_acked(&server, &node_id, &[LDS, RDS, CDS, EDS])
    })
    .await;
    // The client's own status (CSDS): every resource acknowledged, none rejected.
    let held = eventually(PROPAGATE, POLL, || client.all_acked()).await;
    assert!(held >= 8, "2 targets × LDS, RDS, CDS, EDS: {held}");
    assert_eq!(rejects(&server).await, 0, "gRPC rejected configuration");
    server.process().assert_running();
}

/// Service `echo-xds` (port 7071) with its one pod, `echo-xds-1` (service account `echo`)
/// at `127.0.0.<ip>:<port>`.
fn echo_xds(ip: u8, port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n---\n\
             apiVersion: v1\nkind: Service\nmetadata:\n  name: echo-xds\n  namespace: default\n\
             spec:\n  clusterIP: 10.96.0.71\n  selector:\n    app: echo-xds\n  ports:\n\
             \x20 - name: grpc\n    port: 7071\n    targetPort: {port}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata:\n  name: echo-xds-1\n  namespace: default\n\
             \x20 labels:\n    app: echo-xds\nspec:\n  serviceAccountName: echo\n\
             \x20 containers:\n  - name: echo\n    image: example.com/echo\n\
             status:\n  phase: Running\n  podIP: 127.0.0.{ip}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: echo-xds-1\n\
             \x20 namespace: default\n  labels:\n    kubernetes.io/service-name: echo-xds\n\
             addressType: IPv4\nports:\n- name: grpc\n  port: {port}\n  protocol: TCP\n\
             endpoints:\n- addresses: [\"127.0.0.{ip}\"]\n  conditions:\n    ready: true\n\
             \x20 targetRef:\n    kind: Pod\n    name: echo-xds-1\n    namespace: default\n"
    )
}

/// Service `<alias>` (port 7072) for the pod of [`echo_xds`], its EndpointSlice, and an
/// `ISTIO_MUTUAL` rule expecting the server to be service account `<sa>`.
fn alias_of_echo_xds(alias: &str, sa: &str, ip: u8, port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {alias}\n  namespace: default\n\
         spec:\n  selector:\n    app: echo-xds\n  ports:\n\
         \x20 - name: grpc\n    port: 7072\n    targetPort: {port}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {alias}-1\n\
         \x20 namespace: default\n  labels:\n    kubernetes.io/service-name: {alias}\n\
         addressType: IPv4\nports:\n- name: grpc\n  port: {port}\n  protocol: TCP\n\
         endpoints:\n- addresses: [\"127.0.0.{ip}\"]\n  conditions:\n    ready: true\n\
         \x20 targetRef:\n    kind: Pod\n    name: echo-xds-1\n    namespace: default\n---\n\
         apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: {alias}\n\
         \x20 namespace: default\nspec:\n  host: {alias}\n  trafficPolicy:\n    tls:\n\
         \x20     mode: ISTIO_MUTUAL\n      subjectAltNames: [spiffe://cluster.local/ns/default/sa/{sa}]\n"
    )
}

/// An xDS-enabled gRPC server (`grpc.server(xds=True)`) gets its inbound listener
/// `xds.istio.io/grpc/lds/inbound/<ip>:<port>` for its own service port and serves the
/// proxyless client; an AuthorizationPolicy allowing only namespace `frontend` then
/// refuses it (a plaintext caller proves no namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_xds_server_gets_its_listener() {
    let port = free_port_on(&[loopback(5)]);
    let dir = tempfile::tempdir().expect("manifest dir");
    write_manifest(dir.path(), "echo-xds.yaml", &echo_xds(5, port));
    let server = ShoalServer::standalone(dir.path()).await;
    let server_node = ProxylessNode {
        ip: "127.0.0.5",
        pod: "echo-xds-1",
        namespace: "default",
        labels: &[("app", "echo-xds")],
    };
    let server_id = server_node.id();
    let _xds_server = GrpcBackends::start_xds(
        "echo-xds",
        SocketAddr::from((loopback(5), port)),
        &bootstrap(server.xds_addr(), &server_node),
    )
    .await;
    let streams = eventually(CONVERGE, POLL, || all_acked(&server, &server_id, &[LDS])).await;
    assert_eq!(streams, 1);
    let client_node = ProxylessNode {
        ip: "10.1.0.9",
        pod: "client-1",
        namespace: "default",
        labels: &[("app", "client")],
    };
    let client = GrpcClient::start(&bootstrap(server.xds_addr(), &client_node)).await;
    let target = "xds:///echo-xds:7071";
    until(&client, CONVERGE, target, 10, &[], |c| {
        c.only(&["echo-xds"])
    })
    .await;

    write_manifest(
        dir.path(),
        "authz.yaml",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n\
         \x20 name: only-frontend\n  namespace: default\nspec:\n  selector:\n\
         \x20   matchLabels:\n      app: echo-xds\n  rules:\n  - from:\n    - source:\n\
         \x20       namespaces: [frontend]\n",
    );
    let refused = until(&client, PROPAGATE, target, 1, &[], |c| !c.errors.is_empty()).await;
    assert!(
        refused
            .errors
            .keys()
            .all(|e| e.starts_with("PERMISSION_DENIED")),
        "{refused:?}"
    );
    eventually(PROPAGATE, POLL, || all_acked(&server, &server_id, &[LDS])).await;
    assert_eq!(rejects(&server).await, 0, "gRPC rejected configuration");
}

/// Mutual TLS between a proxyless client and an xDS-enabled server, with workload
/// certificates from shoal's CA (`CreateCertificate` on its TLS port, as istio-agent asks)
/// read by gRPC's `file_watcher` certificate provider: a DestinationRule `ISTIO_MUTUAL` on
/// the client side (the server's identity checked), PeerAuthentication `STRICT` on the
/// server side, so a plaintext caller is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_mtls_with_certificates_from_shoals_ca() {
    use shoal_tests::grpc_xds::{bootstrap_with_certs, CertFiles};
    use shoal_tests::pki::{self, ServerPki};
    let port = free_port_on(&[loopback(6)]);
    let dir = tempfile::tempdir().expect("manifest dir");
    write_manifest(dir.path(), "echo-xds.yaml", &echo_xds(6, port));
    write_manifest(
        dir.path(),
        "security.yaml",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: echo-xds\n\
         \x20 namespace: default\nspec:\n  host: echo-xds\n  trafficPolicy:\n    tls:\n\
         \x20     mode: ISTIO_MUTUAL\n---\n\
         apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n\
         \x20 name: strict\n  namespace: default\nspec:\n  mtls:\n    mode: STRICT\n",
    );
    // Two more names for the same pod, whose rules expect its identity or another one.
    for (alias, sa) in [("echo-good", "echo"), ("echo-bad", "other")] {
        write_manifest(
            dir.path(),
            &format!("{alias}.yaml"),
            &alias_of_echo_xds(alias, sa, 6, port),
        );
    }
    let pki = ServerPki::new();
    let tls = shoal_tests::ports::free_addr();
    let mut args = vec!["--standalone".to_string(), dir.path().display().to_string()];
    args.extend(pki.server_args(tls));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ShoalServer::start(&args).await;
    // Each workload's certificate, issued by shoal's CA to the identity its bootstrap
    // certificate proves.
    let certs = |sa: &'static str| {
        let config = pki::client_config(&pki.ca.cert_pem, Some(&pki.ca.workload("default", sa)));
        let root = pki.ca.cert_pem.clone();
        async move {
            let channel = pki::tls_channel(tls, config).await.expect("TLS channel");
            let (chain, key) = pki::create_certificate(channel)
                .await
                .expect("a certificate");
            let dir = tempfile::tempdir().expect("certificate dir");
            let files = CertFiles::write(dir.path(), &chain, &key, &root);
            (dir, files)
        }
    };
    let (_server_certs_dir, server_certs) = certs("echo").await;
    let (_client_certs_dir, client_certs) = certs("client").await;

    let server_node = ProxylessNode {
        ip: "127.0.0.6",
        pod: "echo-xds-1",
        namespace: "default",
        labels: &[("app", "echo-xds")],
    };
    let server_id = server_node.id();
    let _xds_server = GrpcBackends::start_xds(
        "echo-xds",
        SocketAddr::from((loopback(6), port)),
        &bootstrap_with_certs(server.xds_addr(), &server_node, Some(&server_certs)),
    )
    .await;
    let client_node = ProxylessNode {
        ip: "10.1.0.9",
        pod: "client-1",
        namespace: "default",
        labels: &[("app", "client")],
    };
    let client_id = client_node.id();
    let client = GrpcClient::start(&bootstrap_with_certs(
        server.xds_addr(),
        &client_node,
        Some(&client_certs),
    ))
    .await;
    let target = "xds:///echo-xds:7071";
    until(&client, CONVERGE, target, 10, &[], |c| {
        c.only(&["echo-xds"])
    })
    .await;
    // The client checks the server's identity against the rule's subjectAltNames.
    until(&client, CONVERGE, "xds:///echo-good:7072", 5, &[], |c| {
        c.only(&["echo-xds"])
    })
    .await;
    let bad = client.call("xds:///echo-bad:7072", 1, &[]).await.unwrap();
    assert!(
        bad.backends.is_empty() && bad.errors.keys().all(|e| e.starts_with("UNAVAILABLE")),
        "{bad:?}"
    );

    // The server requires a client certificate: a caller speaking plaintext is refused.
    let plaintext = client.call_with(target, "insecure", 1, &[]).await.unwrap();
    assert!(
        plaintext.backends.is_empty() && !plaintext.errors.is_empty(),
        "{plaintext:?}"
    );

    // An AuthorizationPolicy allowing the client's identity lets it call; one allowing
    // another identity only refuses it.
    let allow = |sa: &str| {
        format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n\
             \x20 name: callers\n  namespace: default\nspec:\n  selector:\n\
             \x20   matchLabels:\n      app: echo-xds\n  rules:\n  - from:\n    - source:\n\
             \x20       principals: [cluster.local/ns/default/sa/{sa}]\n"
        )
    };
    let before = acked_lds(&server, &server_id).await.unwrap();
    write_manifest(dir.path(), "authz.yaml", &allow("client"));
    // The server has its listener with the policy (a new version, acknowledged).
    eventually(PROPAGATE, POLL, || async {
        let now = acked_lds(&server, &server_id).await?;
        anyhow::ensure!(now != before, "listener unchanged");
        Ok::<_, anyhow::Error>(())
    })
    .await;
    until(&client, PROPAGATE, target, 10, &[], |c| {
        c.only(&["echo-xds"])
    })
    .await;
    write_manifest(dir.path(), "authz.yaml", &allow("other"));
    let refused = until(&client, PROPAGATE, target, 1, &[], |c| !c.errors.is_empty()).await;
    assert!(
        refused
            .errors
            .keys()
            .all(|e| e.starts_with("PERMISSION_DENIED")),
        "{refused:?}"
    );

    eventually(PROPAGATE, POLL, || all_acked(&server, &server_id, &[LDS])).await;
    eventually(PROPAGATE, POLL, || {
        all_acked(&server, &client_id, &[LDS, RDS, CDS, EDS])
    })
    .await;
    eventually(PROPAGATE, POLL, || client.all_acked()).await;
    assert_eq!(rejects(&server).await, 0, "gRPC rejected configuration");
}
