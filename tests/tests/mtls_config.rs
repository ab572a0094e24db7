//! Envoy accepts shoal's mutual TLS config: auto mTLS clusters (`transport_socket_matches`
//! with istiod's ISTIO_MUTUAL context) and STRICT inbound chains (the workload certificate
//! and roots over SDS), delivered over ADS to real sidecars, are taken without a NACK.
//!
//! Here nothing serves the bootstraps' `sds-grpc` socket (no istio-agent; the other tests'
//! Envoys get one from the test process), so — as with istiod — what references the SDS
//! secrets waits for them: the client's clusters stay warming, the server's
//! `virtualInbound` too. That is what the test checks besides acceptance, and why an Envoy
//! needs an SDS server on `sds-grpc` once mTLS is on (docs/sidecars.md). Traffic over mTLS
//! is checked end to end with an SDS server elsewhere.
//!
//! Needs root and the binaries (`cargo build --workspace --bins`); skipped without netns
//! support when `SHOAL_SKIP_NETNS=1`.
#![forbid(unsafe_code)]

use serde_json::Value;
use shoal_tests::bootstrap::{bootstrap, with_sds, Node};
use shoal_tests::netns::{self, MeshNet};
use shoal_tests::ports::free_port_on;
use shoal_tests::{eventually, Envoy, ShoalServer};
use std::net::SocketAddr;
use std::time::Duration;

const CONVERGE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);
const REVIEWS_CLUSTER: &str = "outbound|9080||reviews.shop.svc.cluster.local";

/// `shop` (STRICT) runs `reviews`; `legacy` (DISABLE) runs `old`. The `reviews` workload's
/// Sidecar limits it to `legacy`, so none of its clusters needs a certificate and its
/// listeners arrive.
const MANIFESTS: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Namespace
metadata: {name: legacy}
---
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec:
  clusterIP: 198.19.0.11
  selector: {app: reviews}
  ports: [{name: http, port: 9080, targetPort: 9080}]
---
apiVersion: v1
kind: Service
metadata: {name: old, namespace: legacy}
spec:
  clusterIP: 198.19.0.12
  selector: {app: old}
  ports: [{name: tcp, port: 8080, targetPort: 8080}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: shop}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: off, namespace: legacy}
spec:
  mtls: {mode: DISABLE}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews, namespace: shop}
spec:
  workloadSelector: {labels: {app: reviews}}
  egress: [{hosts: ["legacy/*"]}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_accepts_mtls_clusters_and_inbound_chains() {
    if netns::skip_if_unavailable() {
        return;
    }
    let net = MeshNet::create();
    let host = net.host_ip();
    let xds = SocketAddr::from((host, free_port_on(&[host])));
    let dir = tempfile::tempdir().expect("manifest dir");
    std::fs::write(dir.path().join("mesh.yaml"), MANIFESTS).unwrap();
    let dir_arg = dir.path().to_str().expect("UTF-8 dir").to_string();
    let _cp = ShoalServer::start_with_xds(&["--standalone", &dir_arg], xds).await;

    let sidecar = |name: &str, labels: &[(&str, &str)]| {
        let pod = net.add_pod(name);
        let node = Node::captured(&pod.ip().to_string(), name, "shop", labels);
        // An agent socket nobody serves.
        let yaml = with_sds(
            &bootstrap(&node, netns::ADMIN_PORT, &[xds]),
            std::path::Path::new("/nonexistent/shoal-test/agent.sock"),
        );
        let yaml = netns::admin_on(&yaml, pod.ip());
        (pod, yaml)
    };
    let (client_pod, client_yaml) = sidecar("client", &[("app", "client")]);
    let client = Envoy::start_in_pod(&client_pod, &client_yaml).await;
    let (server_pod, server_yaml) = sidecar("reviews", &[("app", "reviews")]);
    let server = Envoy::start_in_pod(&server_pod, &server_yaml).await;

    // The client: auto mTLS to `reviews` (STRICT namespace), accepted and waiting for the
    // workload certificate; plaintext to `old` (DISABLE namespace).
    let warming = eventually(CONVERGE, POLL, || async {
        let dump = client.config_dump().await;
        let warming = dump_entries(&dump, "dynamic_warming_clusters", "cluster");
        warming
            .iter()
            .find(|c| c["name"] == REVIEWS_CLUSTER)
            .cloned()
            .ok_or_else(|| format!("{REVIEWS_CLUSTER} not warming yet"))
    })
    .await;
    let matches = warming["transport_socket_matches"]
        .as_array()
        .expect("auto mTLS: transport socket matches");
    assert_eq!(matches[0]["name"], "tlsMode-istio");
    assert_eq!(matches[1]["name"], "tlsMode-disabled");
    let tls = &matches[0]["transport_socket"]["typed_config"];
    assert_eq!(
        tls["sni"],
        "outbound_.9080_._.reviews.shop.svc.cluster.local"
    );
    assert_eq!(
        tls["common_tls_context"]["tls_certificate_sds_secret_configs"][0]["sds_config"]
            ["api_config_source"]["grpc_services"][0]["envoy_grpc"]["cluster_name"],
        "sds-grpc"
    );
    assert_eq!(
        client.stat_sum("cluster_manager.cds.update_rejected").await,
        0
    );
    let old = dump_entries(
        &client.config_dump().await,
        "dynamic_active_clusters",
        "cluster",
    )
    .into_iter()
    .find(|c| c["name"] == "outbound|8080||old.legacy.svc.cluster.local")
    .expect("the plaintext cluster is active");
    assert!(old.get("transport_socket_matches").is_none());

    // The server: its clusters need no certificate, so its listeners arrive; the STRICT
    // `virtualInbound` is accepted and waits for its certificate.
    let inbound = eventually(CONVERGE, POLL, || async {
        let dump = server.config_dump().await;
        dump_entries(&dump, "dynamic_listeners", "")
            .into_iter()
            .find(|l| l["name"] == "virtualInbound")
            .ok_or_else(|| "no virtualInbound yet".to_string())
    })
    .await;
    assert_eq!(
        server
            .stat_sum("listener_manager.lds.update_rejected")
            .await,
        0
    );
    assert!(
        inbound.get("active_state").is_none(),
        "virtualInbound cannot be active without its certificate: {inbound}"
    );
    let chains = inbound["warming_state"]["listener"]["filter_chains"]
        .as_array()
        .expect("a warming virtualInbound");
    let port_chains: Vec<&Value> = chains
        .iter()
        .filter(|c| c["name"] == "0.0.0.0_9080")
        .collect();
    assert_eq!(port_chains.len(), 1, "STRICT: one mTLS chain per port");
    assert_eq!(
        port_chains[0]["filter_chain_match"]["transport_protocol"],
        "tls"
    );
    assert_eq!(
        port_chains[0]["transport_socket"]["typed_config"]["require_client_certificate"],
        true
    );
}

/// The entries of one section of a config dump (`dynamic_active_clusters`, ...), each
/// unwrapped from `field` (`cluster`) when given.
fn dump_entries(dump: &Value, section: &str, field: &str) -> Vec<Value> {
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.get(section))
        .filter_map(Value::as_array)
        .flatten()
        .map(|e| {
            if field.is_empty() {
                e.clone()
            } else {
                e[field].clone()
            }
        })
        .collect()
}
