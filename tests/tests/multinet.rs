//! Multi-network end to end (issue 22), with real network isolation: two test networks
//! (two bridges, `MeshNet`s) with no route between their pod ranges. Network `net1` runs
//! `sleep`, `httpbin-a` and the east-west gateway `eastwest1`; network `net2` runs
//! `httpbin-b`, `httpbin-c` and the east-west gateway `eastwest`. Each gateway pod has a
//! second interface on the other network's bridge: its external address there (its
//! Service's `externalIPs`), the only address of its network the other one reaches.
//!
//! Two clusters, one Kubernetes API test server each, as in Istio's "multi-primary on
//! different networks": `c1` (the config cluster) is net1 and `c2` is net2, each by the
//! `topology.istio.io/network` label on its `istio-system` namespace (the meshed pods carry
//! no network label). `c1` holds its pods, its gateway, the `web` Service, the
//! `cross-network-gateway` Gateway and a multicluster Secret for `c2`; `httpbin` exists in
//! both clusters (one host, each cluster's EndpointSlice with its own endpoints). One shoal
//! ingester (`--source kube`, `--cluster-id c1`) watches both and publishes through
//! nats-server to one shoal server, which serves every proxy; each pod runs a certificate
//! agent and a real Envoy (sidecars captured by istio-iptables' rules, the gateways not)
//! whose node metadata names its cluster (`CLUSTER_ID`) and network (`NETWORK`), as Istio's
//! injector sets them — except `sleep`, which names no `NETWORK` and so takes its cluster's
//! (c1's label, net1). `sleep` uses delta ADS, the others SotW.
//!
//! - sleep → httpbin (only endpoint in net2): through net2's gateway's sni-dnat chain,
//!   mutual TLS end to end (httpbin sees sleep's SPIFFE ID); sleep cannot reach httpbin-b's
//!   IP. The other way, httpbin-b → web (only endpoint httpbin-a, net1) through net1's.
//! - With endpoints in both networks (one in net1, two in net2), traffic reaches both; the
//!   gateway endpoint weighs 2, the local one 1 (sent as it is only because sleep took
//!   c1's network).
//! - When c1's `istio-system` is relabelled net2, sleep (no `NETWORK`) is re-pushed as a
//!   net2 proxy (httpbin-b direct, no gateway); relabelled back, through the gateway again.
//! - When net2's gateway Service is deleted from `c2`, net2's endpoints are sent as they are
//!   (istiod's rule for a network without a gateway), and so are unreachable from net1.
//!
//! Needs root, iptables, Envoy, nats-server and the binaries (`cargo build --bins -p
//! shoal-server -p shoal-ingester -p shoal-tests`); fails without netns support unless
//! `SHOAL_SKIP_NETNS=1`.
#![forbid(unsafe_code)]

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)]
mod harness;

use harness::{namespace, remote_secret, Ingester};
use serde_json::{json, Value};
use shoal_tests::agent::{Agent, AgentConfig, Credential};
use shoal_tests::bootstrap::{bootstrap_with, with_sds, AdsMode, Node};
use shoal_tests::kubeapi::{istio_crd, KubeApiServer};
use shoal_tests::netns::{self, Pod, PROXY_UID};
use shoal_tests::pki::ServerPki;
use shoal_tests::ports::free_port_on;
use shoal_tests::process::Process;
use shoal_tests::{eventually, Envoy, MeshNet, NatsServer, ShoalServer};
use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

const CONVERGE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(200);
const NS: &str = "mn";
const HTTPBIN: &str = "httpbin.mn.svc.cluster.local";
const HTTPBIN_VIP: &str = "198.19.0.40";
const SNI: &str = "outbound_.8000_._.httpbin.mn.svc.cluster.local";
/// A service whose only endpoint is httpbin-a (net1).
const WEB: &str = "web.mn.svc.cluster.local";
const WEB_VIP: &str = "198.19.0.41";
const GATEWAY_SA: &str = "istio-eastwestgateway-service-account";

fn spiffe(ns: &str, sa: &str) -> String {
    format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
}

/// A proxy in a pod: its agent and Envoy (dropped first), and its app.
struct Proxied {
    envoy: Envoy,
    _agent: Agent,
    _app: Option<Process>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_network_calls_go_through_the_east_west_gateway() {
    if netns::skip_if_unavailable() {
        return;
    }
    let net1 = MeshNet::create();
    let net2 = MeshNet::create();
    let (host1, host2) = (net1.host_ip(), net2.host_ip());
    // One server for both networks: it listens on every address, each network's pods dial
    // its own host address.
    let xds_port = free_port_on(&[host1, host2]);
    let tls_port = free_port_on(&[host1, host2]);
    let pki = ServerPki::new();

    let sleep = net1.add_pod("sleep");
    let httpbin_a = net1.add_pod("httpbin-a");
    let httpbin_b = net2.add_pod("httpbin-b");
    let httpbin_c = net2.add_pod("httpbin-c");
    let eastwest = net2.add_pod("eastwest");
    let gateway_addr = net1.attach(&eastwest);
    // net1's gateway, reached from net2 on its address there.
    let eastwest1 = net1.add_pod("eastwest1");
    let gateway1_addr = net2.attach(&eastwest1);

    let pods = Pods {
        sleep: sleep.ip(),
        httpbin_a: httpbin_a.ip(),
        httpbin_b: httpbin_b.ip(),
        httpbin_c: httpbin_c.ip(),
        eastwest: eastwest.ip(),
        eastwest1: eastwest1.ip(),
        gateway_addr,
        gateway1_addr,
    };
    let c1 = KubeApiServer::builder().name("c1").start().await;
    let c2 = KubeApiServer::builder().name("c2").start().await;
    apply(&c2, pods.c2_objects(false));
    apply(&c1, pods.c1_objects(false));
    c1.apply(remote_secret(
        "istio-remote-secret-c2",
        &[("c2", c2.kubeconfig())],
    ))
    .expect("multicluster secret");

    // Through NATS: the ingester watches both clusters, the server reads the bus.
    let nats = NatsServer::start().await;
    let mut ingester = Ingester::start(&nats.url(), &c1.kubeconfig(), &["--cluster-id", "c1"]);
    ingester.wait_ready().await;
    let mut args = vec!["--nats-url".to_string(), nats.url()];
    args.extend(pki.server_args(SocketAddr::from((Ipv4Addr::UNSPECIFIED, tls_port))));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server =
        ShoalServer::start_with_xds(&args, SocketAddr::from((Ipv4Addr::UNSPECIFIED, xds_port)))
            .await;

    let ctx = Ctx {
        pki: &pki,
        tls_port,
        xds_port,
    };
    // The sidecars.
    let mut proxied = Vec::new();
    for (pod, host, place) in [
        (&sleep, host1, C1),
        (&httpbin_a, host1, C1),
        (&httpbin_b, host2, C2),
        (&httpbin_c, host2, C2),
    ] {
        pod.capture();
        let app = match pod.name() {
            "sleep" => None,
            name => Some(pod.http_server(name, 8000).await),
        };
        let app_label = if pod.name() == "sleep" {
            "sleep"
        } else {
            "httpbin"
        };
        let node = Node::captured(
            &pod.ip().to_string(),
            pod.name(),
            NS,
            &injected_labels(app_label),
        );
        let (agent, envoy) = ctx.start(pod, host, node, (NS, app_label), place).await;
        proxied.push(Proxied {
            envoy,
            _agent: agent,
            _app: app,
        });
    }
    // The east-west gateways: routers, not captured.
    let mut gateways = Vec::new();
    for (pod, host, place) in [(&eastwest, host2, C2), (&eastwest1, host1, C1)] {
        let node = Node {
            id: format!(
                "router~{}~{}.istio-system~istio-system.svc.cluster.local",
                pod.ip(),
                pod.name()
            ),
            cluster: "istio-eastwestgateway".into(),
            namespace: "istio-system".into(),
            labels: vec![
                ("istio".into(), "eastwestgateway".into()),
                ("topology.istio.io/network".into(), place.network.into()),
            ],
            interception: None,
            service_account: GATEWAY_SA.into(),
        };
        gateways.push(
            ctx.start(pod, host, node, ("istio-system", GATEWAY_SA), place)
                .await,
        );
    }
    let gateway = &gateways[0].1;
    let gateway1 = &gateways[1].1;
    let sleep_envoy = &proxied[0].envoy;

    // sleep → httpbin, whose only endpoint is in net2: through the gateway.
    let get = |path: &'static str| {
        let sleep = &sleep;
        async move {
            http_get(
                sleep,
                HTTPBIN,
                HTTPBIN_VIP,
                &format!("http://{HTTPBIN}:8000{path}"),
            )
            .await
        }
    };
    let body = eventually(CONVERGE, POLL, || async {
        match get("/headers").await {
            Ok((200, body)) if body["backend"] == "httpbin-b" => Ok(body),
            other => Err(format!("sleep -> httpbin: {other:?}")),
        }
    })
    .await;
    let xfcc = body["headers"]["x-forwarded-client-cert"]
        .as_str()
        .unwrap_or_default();
    assert!(
        xfcc.contains(&format!("URI={}", spiffe(NS, "sleep"))),
        "httpbin-b does not see sleep's identity (mTLS end to end): {body}"
    );
    // sleep's endpoint for httpbin is the gateway's address, port 15443, Istio mTLS.
    let clusters = sleep_envoy.admin_get("/clusters").await.expect("/clusters");
    let in_cluster = |addr: &str| {
        clusters
            .lines()
            .any(|l| l.starts_with(&format!("outbound|8000||{HTTPBIN}::{addr}")))
    };
    assert!(in_cluster(&format!("{gateway_addr}:15443")), "{clusters}");
    assert!(
        !in_cluster(&format!("{}:8000", pods.httpbin_b)),
        "{clusters}"
    );
    // The gateway proxied it on the SNI chain, to its local endpoint.
    let sni_cx = gateway
        .stat_sum(&format!("cluster.{SNI}.upstream_cx_total"))
        .await;
    assert!(sni_cx >= 1, "the gateway's {SNI} cluster saw no connection");
    assert!(
        gateway
            .stat_sum(&format!("tcp.{SNI}.downstream_cx_total"))
            .await
            >= 1
    );
    // The other way, through net1's gateway: httpbin-b (net2) calls `web`, whose only
    // endpoint is httpbin-a (net1); httpbin-a sees httpbin-b's identity.
    let body = eventually(CONVERGE, POLL, || async {
        match http_get(
            &httpbin_b,
            WEB,
            WEB_VIP,
            &format!("http://{WEB}:8000/reverse"),
        )
        .await
        {
            Ok((200, body)) if body["backend"] == "httpbin-a" => Ok(body),
            other => Err(format!("httpbin-b -> web: {other:?}")),
        }
    })
    .await;
    let xfcc = body["headers"]["x-forwarded-client-cert"]
        .as_str()
        .unwrap_or_default();
    assert!(
        xfcc.contains(&format!("URI={}", spiffe(NS, "httpbin"))),
        "httpbin-a does not see httpbin-b's identity: {body}"
    );
    assert!(
        gateway1
            .stat_sum("cluster.outbound_.8000_._.web.mn.svc.cluster.local.upstream_cx_total")
            .await
            >= 1
    );

    // The networks are isolated: httpbin-b's own address is unreachable from net1 (the
    // proxy uid is not captured, so this goes out as it is).
    let direct = sleep
        .run_as(
            PROXY_UID,
            PROXY_UID,
            &[
                "tcp-send",
                &format!("{}:8000", pods.httpbin_b),
                "x",
                "--timeout-ms",
                "1000",
            ],
        )
        .await;
    assert!(!direct.success(), "net1 reached a net2 pod: {direct:?}");

    // Endpoints in both networks (httpbin-a in c1, net1; httpbin-b and httpbin-c in c2,
    // net2): traffic reaches both networks.
    c1.apply(pods.httpbin_slice(C1, true))
        .expect("c1 httpbin slice");
    c2.apply(pods.httpbin_slice(C2, true))
        .expect("c2 httpbin slice");
    let mut seen = BTreeSet::new();
    let deadline = std::time::Instant::now() + CONVERGE;
    while !(seen.contains("httpbin-a") && seen.len() >= 2) {
        assert!(
            std::time::Instant::now() < deadline,
            "backends seen: {seen:?}"
        );
        if let Ok((200, body)) = get("/both").await {
            if let Some(b) = body["backend"].as_str() {
                seen.insert(b.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let clusters = sleep_envoy.admin_get("/clusters").await.expect("/clusters");
    // istiod's weighting: the gateway endpoint weighs the two endpoints behind it, the
    // local one its own. sleep has no NETWORK metadata: httpbin-a is local to it only
    // because it took c1's network (without it, every endpoint would go through a
    // gateway).
    for (addr, weight) in [
        (format!("{gateway_addr}:15443"), 2),
        (format!("{}:8000", pods.httpbin_a), 1),
    ] {
        let line = format!("outbound|8000||{HTTPBIN}::{addr}::weight::{weight}");
        assert!(clusters.lines().any(|l| l == line), "{line}\n{clusters}");
    }

    let gateways_known = || async {
        let metrics = server.admin_get("/metrics").await.expect("/metrics").text();
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("shoal_network_gateways "))
            .and_then(|n| n.trim().parse::<u64>().ok())
    };
    assert_eq!(gateways_known().await, Some(2));

    // c1's istio-system is relabelled net2: the ingester republishes c1's slices with it,
    // and sleep (no NETWORK metadata) is re-pushed as a net2 proxy: every httpbin endpoint
    // is on its network, so sent as it is, and none through net2's gateway. Relabelled
    // back to net1, it goes through the gateway again.
    let sleep_sees = |direct_b: bool| {
        let sleep_envoy = &sleep_envoy;
        async move {
            eventually(CONVERGE, POLL, || async {
                let clusters = sleep_envoy
                    .admin_get("/clusters")
                    .await
                    .map_err(|e| e.to_string())?;
                let has = |addr: String| {
                    clusters
                        .lines()
                        .any(|l| l.starts_with(&format!("outbound|8000||{HTTPBIN}::{addr}")))
                };
                let b = has(format!("{}:8000", pods.httpbin_b));
                let gw = has(format!("{gateway_addr}:15443"));
                if b == direct_b && gw != direct_b {
                    Ok(())
                } else {
                    Err(format!("direct httpbin-b {b}, gateway {gw}:\n{clusters}"))
                }
            })
            .await
        }
    };
    c1.apply(namespace(
        "istio-system",
        json!({"topology.istio.io/network": C2.network}),
    ))
    .expect("relabel c1");
    sleep_sees(true).await;
    c1.apply(namespace(
        "istio-system",
        json!({"topology.istio.io/network": C1.network}),
    ))
    .expect("relabel c1 back");
    sleep_sees(false).await;

    // net2 loses its gateway (its Service is deleted from c2): its endpoints are sent as
    // they are (istiod's rule; unreachable here, as the networks are isolated), while
    // net1's gateway stays.
    c2.delete("services", Some("istio-system"), "eastwest")
        .expect("delete net2's gateway service");
    eventually(CONVERGE, POLL, || async {
        let clusters = sleep_envoy
            .admin_get("/clusters")
            .await
            .map_err(|e| e.to_string())?;
        let direct = format!("outbound|8000||{HTTPBIN}::{}:8000", pods.httpbin_b);
        if clusters.lines().any(|l| l.starts_with(&direct)) {
            Ok(())
        } else {
            Err(format!("no {direct} yet:\n{clusters}"))
        }
    })
    .await;
    assert_eq!(gateways_known().await, Some(1));

    for (name, envoy) in [
        ("sleep", sleep_envoy),
        ("eastwest", gateway),
        ("eastwest1", gateway1),
    ] {
        assert_eq!(
            envoy.stat_sum("update_rejected").await,
            0,
            "{name} rejected config"
        );
    }
    drop(gateways);
}

/// What starting a proxy needs: the CA's PKI and the server's ports.
struct Ctx<'a> {
    pki: &'a ServerPki,
    tls_port: u16,
    xds_port: u16,
}

impl Ctx<'_> {
    /// Starts a pod's certificate agent (identity `sa`) and its Envoy in `place`, talking
    /// to the server at `host` (the pod's network's host address). `sleep` uses delta ADS.
    async fn start(
        &self,
        pod: &Pod,
        host: Ipv4Addr,
        node: Node,
        sa: (&str, &str),
        place: Place,
    ) -> (Agent, Envoy) {
        let mut config = AgentConfig::new(
            SocketAddr::from((host, self.tls_port)),
            &self.pki.ca.cert_pem,
            Credential::Certificate(self.pki.ca.workload(sa.0, sa.1)),
        );
        config.ttl = Some("1h".into());
        let mode = if pod.name() == "sleep" {
            AdsMode::Delta
        } else {
            AdsMode::Sotw
        };
        let xds = SocketAddr::from((host, self.xds_port));
        let agent = Agent::start_in_pod(pod, &config).await;
        let yaml = with_sds(
            &bootstrap_with(&node, netns::ADMIN_PORT, &[xds], mode),
            agent.socket(),
        )
        // As Istio's injector sets them: the pod's cluster, and its network (the label
        // of the cluster's system namespace). sleep sends no NETWORK, as a proxy not
        // injected by Istio: the server gives it its cluster's network (c1's label), so
        // its local httpbin endpoint is sent as it is, not through a gateway.
        .replace(
            "    CLUSTER_ID: Kubernetes\n",
            &if pod.name() == "sleep" {
                format!("    CLUSTER_ID: {}\n", place.cluster)
            } else {
                format!(
                    "    CLUSTER_ID: {}\n    NETWORK: {}\n",
                    place.cluster, place.network
                )
            },
        );
        let envoy = Envoy::start_in_pod(pod, &netns::admin_on(&yaml, pod.ip())).await;
        (agent, envoy)
    }
}

/// One GET from the pod's app, through its sidecar, resolving `host` to `vip`.
async fn http_get(pod: &Pod, host: &str, vip: &str, url: &str) -> anyhow::Result<(u16, Value)> {
    let resolve = format!("{host}={vip}");
    let args = [
        "http-get",
        url,
        "--resolve",
        &resolve,
        "--timeout-ms",
        "3000",
    ];
    let out = pod.run(&args).await;
    if !out.success() {
        anyhow::bail!("http-get {url}: {}", out.stderr.trim());
    }
    out.http()
}

/// The labels Istio's injector puts on a meshed pod. No network: the pod's cluster's
/// system namespace gives it.
fn injected_labels(app: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("app", app),
        ("security.istio.io/tlsMode", "istio"),
        ("service.istio.io/canonical-name", app),
    ]
}

/// A cluster and its network.
#[derive(Debug, Clone, Copy)]
struct Place {
    cluster: &'static str,
    network: &'static str,
}

/// The config cluster, network net1.
const C1: Place = Place {
    cluster: "c1",
    network: "net1",
};
/// The remote cluster, network net2.
const C2: Place = Place {
    cluster: "c2",
    network: "net2",
};

/// Applies `objects` in order (namespaces and CRDs come first).
fn apply(cluster: &KubeApiServer, objects: Vec<Value>) {
    for object in objects {
        if let Err(e) = cluster.apply(&object) {
            panic!("{}: applying {object}: {e}", cluster.name());
        }
    }
}

struct Pods {
    sleep: Ipv4Addr,
    httpbin_a: Ipv4Addr,
    httpbin_b: Ipv4Addr,
    httpbin_c: Ipv4Addr,
    eastwest: Ipv4Addr,
    eastwest1: Ipv4Addr,
    gateway_addr: Ipv4Addr,
    gateway1_addr: Ipv4Addr,
}

impl Pods {
    /// Cluster c1 (net1): the namespaces, sleep and httpbin-a, `httpbin` (its c1 slice:
    /// httpbin-a only with `both`), `web` (httpbin-a), net1's gateway and Istio's
    /// `cross-network-gateway`, which selects both networks' gateways.
    fn c1_objects(&self, both: bool) -> Vec<Value> {
        let mut out = vec![
            namespace(
                "istio-system",
                json!({"topology.istio.io/network": C1.network}),
            ),
            namespace(NS, json!({})),
            istio_crd("Gateway", "gateways"),
            json!({
                "apiVersion": "networking.istio.io/v1", "kind": "Gateway",
                "metadata": {"name": "cross-network-gateway", "namespace": "istio-system"},
                "spec": {
                    "selector": {"istio": "eastwestgateway"},
                    "servers": [{
                        "port": {"number": 15443, "name": "tls", "protocol": "TLS"},
                        "tls": {"mode": "AUTO_PASSTHROUGH"},
                        "hosts": ["*.local"],
                    }],
                },
            }),
            pod("sleep", "sleep", "sleep", self.sleep),
            pod("httpbin-a", "httpbin", "httpbin", self.httpbin_a),
            service("httpbin", HTTPBIN_VIP, Some(json!({"app": "httpbin"}))),
            self.httpbin_slice(C1, both),
            service("web", WEB_VIP, None),
            slice("web-1", "web", &[("httpbin-a", self.httpbin_a)]),
        ];
        out.extend(gateway(
            "eastwest1",
            C1.network,
            self.gateway1_addr,
            self.eastwest1,
        ));
        out
    }

    /// Cluster c2 (net2): the namespaces, httpbin-b and httpbin-c, `httpbin` (its c2
    /// slice: httpbin-b, and httpbin-c with `both`) and net2's gateway.
    fn c2_objects(&self, both: bool) -> Vec<Value> {
        let mut out = vec![
            namespace(
                "istio-system",
                json!({"topology.istio.io/network": C2.network}),
            ),
            namespace(NS, json!({})),
            pod("httpbin-b", "httpbin", "httpbin", self.httpbin_b),
            pod("httpbin-c", "httpbin", "httpbin", self.httpbin_c),
            service("httpbin", HTTPBIN_VIP, Some(json!({"app": "httpbin"}))),
            self.httpbin_slice(C2, both),
        ];
        out.extend(gateway(
            "eastwest",
            C2.network,
            self.gateway_addr,
            self.eastwest,
        ));
        out
    }

    /// `httpbin`'s EndpointSlice in a cluster: httpbin-b in c2, and with `both` httpbin-a
    /// in c1 and httpbin-c in c2 too.
    fn httpbin_slice(&self, place: Place, both: bool) -> Value {
        let endpoints: Vec<(&str, Ipv4Addr)> = match (place.cluster, both) {
            ("c1", false) => vec![],
            ("c1", true) => vec![("httpbin-a", self.httpbin_a)],
            (_, false) => vec![("httpbin-b", self.httpbin_b)],
            (_, true) => vec![("httpbin-b", self.httpbin_b), ("httpbin-c", self.httpbin_c)],
        };
        slice(&format!("httpbin-{}", place.cluster), "httpbin", &endpoints)
    }
}

/// A meshed pod of the test namespace, running at `ip`.
fn pod(name: &str, app: &'static str, sa: &str, ip: Ipv4Addr) -> Value {
    let labels: serde_json::Map<String, Value> = injected_labels(app)
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::from(v)))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"serviceAccountName": sa, "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]},
    })
}

/// A Service of the test namespace on port 8000.
fn service(name: &str, vip: &str, selector: Option<Value>) -> Value {
    let mut svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterIP": vip,
                 "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]},
    });
    if let Some(selector) = selector {
        svc["spec"]["selector"] = selector;
    }
    svc
}

/// An EndpointSlice of `service` (port 8000) with ready pod endpoints.
fn slice(name: &str, service: &str, endpoints: &[(&str, Ipv4Addr)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(pod, ip)| {
            json!({
                "addresses": [ip.to_string()], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
}

/// A network's east-west gateway, as Istio's `gen-eastwest-gateway.sh` deploys it: its
/// Service (labelled with the network, reached by the other network on its external IP,
/// port 15443) and its pod (labelled with the network too).
fn gateway(name: &str, network: &str, external: Ipv4Addr, ip: Ipv4Addr) -> [Value; 2] {
    let labels = json!({"istio": "eastwestgateway", "topology.istio.io/network": network});
    [
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "istio-system", "labels": labels},
            "spec": {"type": "LoadBalancer", "selector": labels,
                     "externalIPs": [external.to_string()],
                     "ports": [{"name": "tls", "port": 15443, "targetPort": 15443}]},
        }),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "istio-system", "labels": labels},
            "spec": {"serviceAccountName": GATEWAY_SA,
                     "containers": [{"name": "proxy", "image": "proxy"}]},
            "status": {"phase": "Running", "podIP": ip.to_string(),
                       "podIPs": [{"ip": ip.to_string()}]},
        }),
    ]
}
