//! Mesh security end to end (issue 12): workload certificates from shoal's CA, served to
//! Envoy by istio-agent's stand-in (`shoal-test-agent`, over SDS on a Unix socket), mutual
//! TLS between sidecars, PeerAuthentication and AuthorizationPolicy.
//!
//! - `the_agent_serves_its_certificate_to_envoy_and_renews_it`: on the host, an agent and an
//!   Envoy whose TLS listeners take their secrets from it, one over SotW and one over delta
//!   SDS; the certificate is renewed at half its life and Envoy gets the new one.
//! - `sidecars_talk_mutual_tls_with_their_own_certificates`: the captured-pod harness
//!   (network namespaces, istio-iptables, Envoy as uid 1337, see captured.rs). Each meshed
//!   pod runs its app, an agent (as uid 1337, like istio-agent) and an Envoy whose bootstrap
//!   has the `sds-grpc` cluster on the agent's socket. The Envoys get their config from
//!   shoal's **plaintext** xDS port (the agent does not proxy xDS); the agents reach the CA
//!   on the TLS port, authenticated by a client certificate of their pod's identity (the
//!   standalone server has no cluster to verify service-account tokens against; the token
//!   path is tested in xds_auth.rs).
//!
//! Needs root, iptables, Envoy and the binaries (`bash scripts/test.sh`); the netns test
//! fails without netns support unless `SHOAL_SKIP_NETNS=1`.
#![forbid(unsafe_code)]

use serde_json::Value;
use shoal_tests::agent::{Agent, AgentConfig, Credential};
use shoal_tests::bootstrap::{bootstrap_with, with_sds, AdsMode, Node};
use shoal_tests::envoy::HeldCertificate;
use shoal_tests::mesh::write_manifest;
use shoal_tests::netns::{self, Pod};
use shoal_tests::pki::ServerPki;
use shoal_tests::ports::{free_addr, free_port, free_port_on};
use shoal_tests::process::Process;
use shoal_tests::{eventually, Envoy, MeshNet, ShoalServer};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tempfile::TempDir;

const CONVERGE: Duration = Duration::from_secs(30);
/// A manifest change reaches the sidecars within this.
const PROPAGATE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(200);

fn spiffe(ns: &str, sa: &str) -> String {
    format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
}

// ---------------------------------------------------------------------------------------
// The agent and Envoy, on the host

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_its_certificate_to_envoy_and_renews_it() {
    let pki = ServerPki::new();
    let tls = free_addr();
    let mut args = vec![
        "--standalone".to_string(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/mesh").to_string(),
    ];
    args.extend(pki.server_args(tls));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ShoalServer::start(&args).await;

    let web = spiffe("demo", "web");
    let mut config = AgentConfig::new(
        tls,
        &pki.ca.cert_pem,
        Credential::Certificate(pki.ca.workload("demo", "web")),
    );
    // Renewed every 2 s.
    config.ttl = Some("4s".into());
    let mut agent = Agent::start(&config).await;
    assert_eq!(agent.issued(), std::slice::from_ref(&web));

    let envoy = Envoy::start(&sds_listeners(free_port(), agent.socket())).await;
    // Both listeners hold the workload certificate (SotW and delta) and the root.
    let first = eventually::try_eventually(CONVERGE, POLL, || async {
        let held = envoy.certificates().await.map_err(|e| e.to_string())?;
        let own: Vec<&HeldCertificate> = held.iter().filter(|c| !c.is_ca).collect();
        let roots = held.iter().filter(|c| c.is_ca).count();
        if own.len() == 2 && own.iter().all(|c| c.uris == [web.clone()]) && roots == 2 {
            Ok(own
                .iter()
                .map(|c| c.serial.clone())
                .collect::<BTreeSet<_>>())
        } else {
            Err(format!("{held:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("Envoy did not get the agent's secrets: {e}"));

    // Renewed: a new certificate (same identity) reaches both listeners.
    agent.wait_issued(2, Duration::from_secs(10)).await;
    eventually::eventually(CONVERGE, POLL, || async {
        let held = envoy.certificates().await.map_err(|e| e.to_string())?;
        let own: Vec<&HeldCertificate> = held.iter().filter(|c| !c.is_ca).collect();
        if own.len() == 2
            && own
                .iter()
                .all(|c| !first.contains(&c.serial) && c.uris == [web.clone()])
        {
            Ok(())
        } else {
            Err(format!("not renewed in Envoy: {held:?} (first {first:?})"))
        }
    })
    .await;
    assert!(agent.issued().iter().all(|san| *san == web));
    assert_eq!(envoy.stat_sum("update_rejected").await, 0);
    assert!(envoy.stat_sum("sds.default.update_success").await >= 4);
    let metrics = server.admin_get("/metrics").await.expect("/metrics").text();
    assert!(
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix("shoal_ca_requests_total{result=\"issued\"} "))
            .any(|n| n.trim().parse::<f64>().is_ok_and(|n| n >= 2.0)),
        "{metrics}"
    );
}

/// The `secretsConfig` of istiod's transport sockets: `name` from the agent over `api_type`.
fn sds_secret(name: &str, api_type: &str) -> String {
    format!(
        "{{ name: {name}, sds_config: {{ api_config_source: {{ api_type: {api_type}, \
         set_node_on_first_message_only: true, transport_api_version: V3, \
         grpc_services: [{{ envoy_grpc: {{ cluster_name: sds-grpc }} }}] }}, \
         resource_api_version: V3 }} }}"
    )
}

/// A bootstrap with two mutual-TLS echo listeners whose certificate (`default`) and root
/// (`ROOTCA`) come from the agent at `socket`: one over SotW SDS, one over delta.
fn sds_listeners(admin_port: u16, socket: &Path) -> String {
    let mut listeners = String::new();
    for (name, api_type) in [("sotw", "GRPC"), ("delta", "DELTA_GRPC")] {
        listeners.push_str(&format!(
            r#"  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_certificate_sds_secret_configs:
            - {default}
            combined_validation_context:
              default_validation_context: {{}}
              validation_context_sds_secret_config: {root}
      filters:
      - name: envoy.filters.network.echo
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.echo.v3.Echo
"#,
            port = free_port(),
            default = sds_secret("default", api_type),
            root = sds_secret("ROOTCA", api_type),
        ));
    }
    let bootstrap = format!(
        "node:\n  id: sidecar~127.0.0.1~web-1.demo~demo.svc.cluster.local\n  cluster: web.demo\n\
         admin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}\n\
         static_resources:\n  clusters: []\n  listeners:\n{listeners}"
    );
    with_sds(&bootstrap, socket)
}

// ---------------------------------------------------------------------------------------
// The mesh, with captured pods

const NS: &str = "sec";
const HTTPBIN_VIP: &str = "198.19.0.30";
const ECHO_VIP: &str = "198.19.0.31";
const HTTPBIN: &str = "httpbin.sec.svc.cluster.local";
const ECHO: &str = "echo.sec.svc.cluster.local";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_talk_mutual_tls_with_their_own_certificates() {
    if netns::skip_if_unavailable() {
        return;
    }
    let mesh = SecureMesh::start().await;
    mesh.wait_converged().await;

    the_ca_certifies_the_caller_not_the_csr(&mesh);
    each_sidecar_holds_its_own_certificate(&mesh).await;
    traffic_between_sidecars_is_mutual_tls(&mesh).await;
    strict_refuses_plaintext(&mesh).await;
    authorization_by_principal(&mesh).await;

    mesh.assert_nothing_rejected().await;
}

/// Each sidecar's Envoy holds the certificate of its pod's service account, and trusts the
/// mesh root.
async fn each_sidecar_holds_its_own_certificate(mesh: &SecureMesh) {
    for (name, pod) in &mesh.meshed {
        let want = spiffe(NS, pod.sa);
        eventually(CONVERGE, POLL, || async {
            let held = pod.envoy.certificates().await.map_err(|e| e.to_string())?;
            let own = held.iter().any(|c| !c.is_ca && c.uris == [want.clone()]);
            let others = held
                .iter()
                .filter(|c| !c.is_ca && c.uris != [want.clone()])
                .count();
            match (own, others, held.iter().any(|c| c.is_ca)) {
                (true, 0, true) => Ok(()),
                _ => Err(format!("{name}: {held:?}")),
            }
        })
        .await;
    }
}

/// The `other` pod's agent asks for httpbin's identity in its CSR: the CA certifies the
/// caller (sa `other`), never what the CSR says.
fn the_ca_certifies_the_caller_not_the_csr(mesh: &SecureMesh) {
    assert_eq!(
        mesh.meshed["other"].agent.issued(),
        [spiffe(NS, "other")],
        "the other pod's certificate"
    );
}

/// HTTP and TCP from sleep to httpbin and echo are mutual TLS: sleep's outbound clusters
/// handshake, the servers' inbound listener handshakes, and httpbin's app sees sleep's
/// SPIFFE ID in `x-forwarded-client-cert` (istiod's inbound HCM: APPEND_FORWARD with the
/// URI of the peer certificate).
async fn traffic_between_sidecars_is_mutual_tls(mesh: &SecureMesh) {
    let (status, body) = mesh
        .get("sleep", &format!("http://{HTTPBIN}:8000/headers"))
        .await
        .expect("sleep -> httpbin");
    assert_eq!(status, 200, "{body}");
    let xfcc = body["headers"]["x-forwarded-client-cert"]
        .as_str()
        .unwrap_or_default();
    assert!(
        xfcc.contains(&format!("URI={}", spiffe(NS, "sleep"))),
        "httpbin does not see sleep's identity: {body}"
    );
    let out = mesh.meshed["sleep"]
        .pod
        .run(&["tcp-send", &format!("{ECHO_VIP}:9000"), "hello"])
        .await;
    assert_eq!(out.expect_success("sleep -> echo").trim(), "echo:hello");

    // Plaintext would handshake nowhere. (HTTP connections are pooled: the handshake may
    // have been the convergence check's.)
    for (pod, stat) in [
        (
            "sleep",
            format!("cluster.outbound|8000||{HTTPBIN}.ssl.handshake"),
        ),
        (
            "sleep",
            format!("cluster.outbound|9000||{ECHO}.ssl.handshake"),
        ),
        (
            "httpbin",
            "listener.0.0.0.0_15006.ssl.handshake".to_string(),
        ),
        ("echo", "listener.0.0.0.0_15006.ssl.handshake".to_string()),
    ] {
        if mesh.stat(pod, &stat).await == 0 {
            let stats = mesh.meshed[pod]
                .envoy
                .admin_get("/stats?filter=ssl.handshake")
                .await
                .unwrap_or_default();
            panic!("{pod}: no TLS handshake in {stat}; handshake stats:\n{stats}");
        }
    }
}

/// PERMISSIVE (no PeerAuthentication) accepts plaintext from a pod without a sidecar;
/// namespace-wide STRICT refuses it, while sidecars still get through.
async fn strict_refuses_plaintext(mesh: &SecureMesh) {
    let direct_http = format!("http://{}:8000/plain", mesh.meshed["httpbin"].pod.ip());
    let direct_tcp = format!("{}:9000", mesh.meshed["echo"].pod.ip());
    let (status, _) = mesh
        .get("external", &direct_http)
        .await
        .expect("PERMISSIVE: plaintext HTTP from outside the mesh");
    assert_eq!(status, 200);
    let out = mesh.external.run(&["tcp-send", &direct_tcp, "plain"]).await;
    assert_eq!(out.expect_success("PERMISSIVE tcp").trim(), "echo:plain");

    mesh.write(
        "strict.yaml",
        &format!(
            "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata:\n  name: default\n  namespace: {NS}\n\
             spec:\n  mtls:\n    mode: STRICT\n"
        ),
    );
    eventually(PROPAGATE, POLL, || async {
        match mesh.get("external", &direct_http).await {
            Ok((status, body)) => Err(format!("plaintext still accepted: {status} {body}")),
            Err(_) => Ok(()),
        }
    })
    .await;
    let out = mesh
        .external
        .run(&["tcp-send", &direct_tcp, "plain", "--timeout-ms", "2000"])
        .await;
    assert!(!out.success(), "STRICT accepted plaintext TCP: {out:?}");
    let (status, body) = mesh
        .get("sleep", &format!("http://{HTTPBIN}:8000/strict"))
        .await
        .expect("a sidecar under STRICT");
    assert_eq!(status, 200, "{body}");
    let out = mesh.meshed["sleep"]
        .pod
        .run(&["tcp-send", &format!("{ECHO_VIP}:9000"), "strict"])
        .await;
    assert_eq!(
        out.expect_success("sidecar TCP under STRICT").trim(),
        "echo:strict"
    );
}

/// AuthorizationPolicy ALLOW for sleep's principal on httpbin and echo: sleep gets 200 and
/// its echo, `other` (another sidecar, mutual TLS too) gets 403 and a reset.
async fn authorization_by_principal(mesh: &SecureMesh) {
    let mut policies = String::new();
    for app in ["httpbin", "echo"] {
        policies.push_str(&format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: {app}\n  namespace: {NS}\n\
             spec:\n  selector:\n    matchLabels:\n      app: {app}\n  action: ALLOW\n  rules:\n\
             \x20 - from:\n    - source:\n        principals: [\"cluster.local/ns/{NS}/sa/sleep\"]\n---\n"
        ));
    }
    mesh.write("authz.yaml", &policies);
    // Connections opened before a listener update keep the old filter chain while they
    // drain (as with istiod), so `other`'s first connection waits for the policy to be in.
    let principal = spiffe(NS, "sleep");
    for server in ["httpbin", "echo"] {
        eventually(PROPAGATE, POLL, || async {
            let dump = mesh.meshed[server]
                .envoy
                .admin_get("/config_dump")
                .await
                .map_err(|e| e.to_string())?;
            if dump.contains("rbac.v3.RBAC") && dump.contains(&principal) {
                Ok(())
            } else {
                Err(format!("{server} has no RBAC rule for {principal} yet"))
            }
        })
        .await;
    }
    let url = format!("http://{HTTPBIN}:8000/authz");
    eventually(PROPAGATE, POLL, || async {
        match mesh.get("other", &url).await {
            Ok((403, _)) => Ok(()),
            other => Err(format!("other -> httpbin: {other:?}")),
        }
    })
    .await;
    let (status, body) = mesh.get("sleep", &url).await.expect("sleep -> httpbin");
    assert_eq!(status, 200, "the allowed principal: {body}");

    let echo = format!("{ECHO_VIP}:9000");
    eventually(PROPAGATE, POLL, || async {
        let out = mesh.meshed["other"]
            .pod
            .run(&["tcp-send", &echo, "denied", "--timeout-ms", "2000"])
            .await;
        if out.success() {
            Err(format!("other -> echo passed: {out:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    let out = mesh.meshed["sleep"]
        .pod
        .run(&["tcp-send", &echo, "allowed"])
        .await;
    assert_eq!(out.expect_success("sleep -> echo").trim(), "echo:allowed");
    assert!(
        mesh.stat("echo", "rbac.denied").await >= 1,
        "echo's RBAC filter denied nothing"
    );
}

/// A pod in the mesh: its namespace, app, agent and sidecar.
struct MeshedPod {
    pod: Pod,
    sa: &'static str,
    // Dropped in this order: Envoy, then the agent it reads from, then the app.
    envoy: Envoy,
    agent: Agent,
    _app: Option<Process>,
}

struct SecureMesh {
    // Dropped first: the processes, then the pods, then the network.
    meshed: BTreeMap<&'static str, MeshedPod>,
    /// A pod outside the mesh: no sidecar, no capture.
    external: Pod,
    _server: ShoalServer,
    _pki: ServerPki,
    dir: TempDir,
    _net: MeshNet,
}

/// What runs in a meshed pod.
enum App {
    Client,
    Http(u16),
    Tcp(u16),
}

/// The meshed pods: name (also the app label and service account), app, and the identity
/// its agent's CSR asks for (`other` asks for httpbin's).
const PODS: [(&str, App, Option<&str>); 4] = [
    ("sleep", App::Client, None),
    ("other", App::Client, Some("httpbin")),
    ("httpbin", App::Http(8000), None),
    ("echo", App::Tcp(9000), None),
];

impl SecureMesh {
    async fn start() -> SecureMesh {
        let net = MeshNet::create();
        let host = net.host_ip();
        let xds = SocketAddr::from((host, free_port_on(&[host])));
        let tls = SocketAddr::from((host, free_port_on(&[host])));
        let pki = ServerPki::new();
        let dir = tempfile::tempdir().expect("manifest dir");

        let external = net.add_pod("external");
        let pods: Vec<(&'static str, Pod)> = PODS
            .iter()
            .map(|(name, _, _)| (*name, net.add_pod(name)))
            .collect();
        write_manifest(dir.path(), "mesh.yaml", &manifests(&pods));

        let mut args = vec!["--standalone".to_string(), dir.path().display().to_string()];
        args.extend(pki.server_args(tls));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = ShoalServer::start_with_xds(&args, xds).await;

        let mut meshed = BTreeMap::new();
        for ((name, pod), (_, app, ask)) in pods.into_iter().zip(PODS.iter()) {
            pod.capture();
            let app = match app {
                App::Client => None,
                App::Http(port) => Some(pod.http_server(name, *port).await),
                App::Tcp(port) => Some(pod.tcp_echo(name, *port).await),
            };
            let mut config = AgentConfig::new(
                tls,
                &pki.ca.cert_pem,
                Credential::Certificate(pki.ca.workload(NS, name)),
            );
            config.ttl = Some("1h".into());
            config.identity = ask.map(|sa| spiffe(NS, sa));
            let agent = Agent::start_in_pod(&pod, &config).await;
            let ip = pod.ip().to_string();
            let node = Node::captured(&ip, name, NS, &injected_labels(name));
            let yaml = with_sds(
                &bootstrap_with(&node, netns::ADMIN_PORT, &[xds], AdsMode::Sotw),
                agent.socket(),
            );
            let envoy = Envoy::start_in_pod(&pod, &netns::admin_on(&yaml, pod.ip())).await;
            let sa = name;
            meshed.insert(
                name,
                MeshedPod {
                    pod,
                    sa,
                    envoy,
                    agent,
                    _app: app,
                },
            );
        }
        SecureMesh {
            meshed,
            external,
            _server: server,
            _pki: pki,
            dir,
            _net: net,
        }
    }

    /// Until sleep reaches httpbin and echo through the sidecars.
    async fn wait_converged(&self) {
        eventually(CONVERGE, POLL, || async {
            let (status, body) = self
                .get("sleep", &format!("http://{HTTPBIN}:8000/"))
                .await
                .map_err(|e| e.to_string())?;
            if status != 200 {
                return Err(format!("httpbin: {status} {body}"));
            }
            let out = self.meshed["sleep"]
                .pod
                .run(&["tcp-send", &format!("{ECHO_VIP}:9000"), "ping"])
                .await;
            if !out.success() {
                return Err(format!("echo: {out:?}"));
            }
            Ok(())
        })
        .await;
    }

    fn pod(&self, name: &str) -> &Pod {
        match name {
            "external" => &self.external,
            name => &self.meshed[name].pod,
        }
    }

    /// One GET from a pod's app (through its sidecar, if it has one).
    async fn get(&self, pod: &str, url: &str) -> anyhow::Result<(u16, Value)> {
        let resolve = format!("{HTTPBIN}={HTTPBIN_VIP}");
        let args = [
            "http-get",
            url,
            "--resolve",
            &resolve,
            "--timeout-ms",
            "3000",
        ];
        let out = self.pod(pod).run(&args).await;
        if !out.success() {
            anyhow::bail!("http-get {url}: {}", out.stderr.trim());
        }
        out.http()
    }

    async fn stat(&self, pod: &str, name: &str) -> u64 {
        self.meshed[pod].envoy.stat_sum(name).await
    }

    fn write(&self, file: &str, content: &str) {
        write_manifest(self.dir.path(), file, content);
    }

    async fn assert_nothing_rejected(&self) {
        for (name, pod) in &self.meshed {
            let rejected = pod.envoy.stat_sum("update_rejected").await;
            assert_eq!(
                rejected,
                0,
                "the {name} sidecar rejected {rejected} updates:\n{}",
                pod.envoy
                    .admin_get("/stats?filter=update_rejected")
                    .await
                    .unwrap_or_default()
            );
        }
    }
}

/// The labels istio's injector puts on a meshed pod (and its proxy's `LABELS`).
fn injected_labels(app: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("app", app),
        ("security.istio.io/tlsMode", "istio"),
        ("service.istio.io/canonical-name", app),
    ]
}

/// The namespace, the httpbin and echo Services with their EndpointSlices, and every
/// meshed Pod with its injected labels and service account.
fn manifests(pods: &[(&'static str, Pod)]) -> String {
    let ip = |name: &str| {
        pods.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p.ip())
            .expect("a meshed pod")
    };
    let mut out = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n---\n");
    for (svc, vip, port_name, port) in [
        ("httpbin", HTTPBIN_VIP, "http", 8000),
        ("echo", ECHO_VIP, "tcp", 9000),
    ] {
        out.push_str(&format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {svc}\n  namespace: {NS}\n\
             spec:\n  clusterIP: {vip}\n  selector:\n    app: {svc}\n  ports:\n\
             \x20 - name: {port_name}\n    port: {port}\n    targetPort: {port}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-1\n\
             \x20 namespace: {NS}\n  labels:\n    kubernetes.io/service-name: {svc}\n\
             addressType: IPv4\nports:\n- name: {port_name}\n  port: {port}\n  protocol: TCP\n\
             endpoints:\n- addresses: [\"{ip}\"]\n  conditions:\n    ready: true\n  targetRef:\n\
             \x20   kind: Pod\n    name: {svc}\n    namespace: {NS}\n---\n",
            ip = ip(svc)
        ));
    }
    for (name, pod) in pods {
        let labels: String = injected_labels(name)
            .iter()
            .map(|(k, v)| format!("    {k}: {v}\n"))
            .collect();
        out.push_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\n  labels:\n{labels}\
             spec:\n  serviceAccountName: {name}\n  containers:\n  - name: app\n    image: app\n\
             status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n---\n",
            ip = pod.ip()
        ));
    }
    out
}
