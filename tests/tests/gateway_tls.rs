//! End to end, Gateway TLS servers on a real Envoy configured by shoal; the clients (and
//! the passthrough backend) are OpenSSL's `s_client` / `s_server`:
//!
//! - `tls.mode: PASSTHROUGH` routes connections by SNI (VirtualService `tls` rules) to a
//!   TLS backend the gateway never decrypts, and closes connections whose SNI no rule names;
//! - `SIMPLE` / `MUTUAL` with `credentialName` terminate TLS with the certificate of a
//!   Kubernetes Secret in the gateway's namespace, delivered over SDS on the gateway's
//!   authenticated ADS stream, then route HTTP; `MUTUAL` refuses clients without a
//!   certificate; a Secret of another namespace is never served; a rotated Secret reaches
//!   Envoy without a restart; the gateway authenticates as its pods' service account
//!   (`istio-system/ingress`, the pods the Gateway's selector selects), which is what SDS
//!   authorizes (refusals of other identities: tests/tests/xds_auth.rs);
//! - over NATS, the Secret's key never appears in the bus's bytes (sealed by the ingester,
//!   opened by the server).
#![forbid(unsafe_code)]

use base64::Engine as _;
use shoal_tests::bootstrap::{bootstrap_with, with_xds_tls, AdsMode, Node, XdsTlsFiles};
use shoal_tests::grpc_xds::{bootstrap as grpc_bootstrap, GrpcBackends, GrpcClient, ProxylessNode};
use shoal_tests::http::Request;
use shoal_tests::pki::{Pem, TestCa};
use shoal_tests::ports::{free_addr, free_port, free_port_on, loopback};
use shoal_tests::process::Process;
use shoal_tests::{eventually, Backend, Envoy, NatsServer, ShoalIngester, ShoalServer};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const HOST: &str = "secure.example.com";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_passthrough_routes_by_sni() {
    let dir = tempfile::tempdir().expect("temp dir");
    let backend_ip = loopback(41);
    let backend_port = free_port_on(&[backend_ip]);
    let gateway_port = free_port_on(&[Ipv4Addr::UNSPECIFIED]);

    // A TLS backend with a certificate for the host, naming itself on `GET /`.
    let _backend = tls_backend(dir.path(), SocketAddr::from((backend_ip, backend_port))).await;

    let manifests = tempfile::tempdir().expect("manifest dir");
    std::fs::write(
        manifests.path().join("mesh.yaml"),
        format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: istio-system}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: secure, namespace: shop}}
spec:
  hosts: [{HOST}]
  ports: [{{number: 443, name: tls, protocol: TLS}}]
  resolution: STATIC
  endpoints: [{{address: {backend_ip}, ports: {{tls: {backend_port}}}}}]
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: l4, namespace: istio-system}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {gateway_port}, name: tls, protocol: TLS}}
    hosts: ["*.example.com"]
    tls: {{mode: PASSTHROUGH}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: secure, namespace: shop}}
spec:
  hosts: [{HOST}]
  gateways: [istio-system/l4]
  tls:
  - match: [{{sniHosts: [{HOST}]}}]
    route: [{{destination: {{host: {HOST}, port: {{number: 443}}}}}}]
"#
        ),
    )
    .expect("writing manifests");
    let shoal = ShoalServer::standalone(manifests.path()).await;
    let gateway = Envoy::start(&bootstrap_with(
        &Node::gateway(),
        free_port(),
        &[shoal.xds_addr()],
        AdsMode::Sotw,
    ))
    .await;
    gateway
        .wait_listener(&format!("0.0.0.0_{gateway_port}"))
        .await;

    // The SNI a rule names: the backend's own TLS session answers (end to end TLS).
    let page = eventually(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let out = s_client(gateway_port, HOST).await;
            if out.contains("s_server") || out.contains("Ciphers supported") {
                Ok(out)
            } else {
                Err(out)
            }
        },
    )
    .await;
    assert!(page.contains("Ciphers supported in s_server"), "{page}");
    // The certificate the client saw is the backend's: the gateway did not terminate TLS.
    assert!(
        page.contains(&format!("CN = {HOST}")) || page.contains(&format!("CN={HOST}")),
        "{page}"
    );
    assert!(
        gateway
            .stat_sum(&format!("|443||{HOST}.upstream_cx_total"))
            .await
            >= 1,
        "the gateway did not use the passthrough cluster"
    );

    // An SNI no rule names: the gateway closes the connection without a handshake.
    let other = s_client(gateway_port, "other.example.com").await;
    assert!(
        !other.contains("s_server"),
        "unmatched SNI reached the backend:\n{other}"
    );
    assert_eq!(gateway.stat_sum("update_rejected").await, 0);
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temp path")
}

async fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .await
        .expect("openssl runs (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openssl s_client` to the gateway with `sni`, sending `GET /`; what it printed.
async fn s_client(port: u16, sni: &str) -> String {
    s_client_with(port, sni, &[], "GET / HTTP/1.0\r\n\r\n").await
}

/// `openssl s_client` to the gateway with `sni` and more arguments, sending `request`;
/// what it printed.
async fn s_client_with(port: u16, sni: &str, args: &[&str], request: &str) -> String {
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            sni,
            "-ign_eof",
        ])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl s_client");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(request.as_bytes()).await;
    }
    match tokio::time::timeout(Duration::from_secs(5), child.wait_with_output()).await {
        Ok(Ok(out)) => format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        _ => "s_client timed out".into(),
    }
}

// ---------------------------------------------------------------------------------------
// TLS termination with credentialName

const WEB: &str = "web.example.com";

/// A Secret as Kubernetes stores it (`kubernetes.io/tls`, base64 `data`).
fn tls_secret(ns: &str, name: &str, pem: &Pem, ca: Option<&str>) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ca = ca
        .map(|c| format!("  ca.crt: {}\n", b64(c)))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         type: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n{ca}",
        b64(&pem.cert),
        b64(&pem.key),
    )
}

/// The mesh of the termination tests: an HTTP backend behind `web.example.com`, a Gateway
/// in istio-system with a SIMPLE server on `simple`, a MUTUAL one on `mutual` (both with
/// the Secret `web-cert`), and one on `foreign` naming `shop-cert`, a Secret that exists
/// only in namespace shop (where a Gateway names it, so it is on the bus). The gateway's
/// pod runs as `istio-system/ingress` behind its Service: the identity the gateway Envoy
/// authenticates with, and the one SDS serves `web-cert` to.
fn termination_manifests(backend: SocketAddr, simple: u16, mutual: u16, foreign: u16) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: istio-system}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: web, namespace: shop}}
spec:
  hosts: [web.shop.internal]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: {ip}, ports: {{http: {port}}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: istio-ingressgateway-1, namespace: istio-system, labels: {{istio: ingressgateway}}}}
spec: {{serviceAccountName: ingress, containers: [{{name: istio-proxy, image: envoy}}]}}
status: {{phase: Running, podIP: 10.2.0.1, podIPs: [{{ip: 10.2.0.1}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: istio-ingressgateway, namespace: istio-system}}
spec:
  selector: {{istio: ingressgateway}}
  ports: [{{name: https, port: {simple}, targetPort: {simple}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: istio-ingressgateway-1, namespace: istio-system, labels: {{kubernetes.io/service-name: istio-ingressgateway}}}}
addressType: IPv4
ports: [{{name: https, port: {simple}}}]
endpoints:
- addresses: ["10.2.0.1"]
  conditions: {{ready: true}}
  targetRef: {{kind: Pod, name: istio-ingressgateway-1, namespace: istio-system}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: public, namespace: istio-system}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: {simple}, name: https, protocol: HTTPS}}
    hosts: ["{WEB}"]
    tls: {{mode: SIMPLE, credentialName: web-cert}}
  - port: {{number: {mutual}, name: https-mtls, protocol: HTTPS}}
    hosts: ["{WEB}"]
    tls: {{mode: MUTUAL, credentialName: web-cert}}
  - port: {{number: {foreign}, name: https-foreign, protocol: HTTPS}}
    hosts: ["{WEB}"]
    tls: {{mode: SIMPLE, credentialName: shop-cert}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: shop-gateway, namespace: shop}}
spec:
  selector: {{app: shop-gateway}}
  servers:
  - port: {{number: 443, name: https, protocol: HTTPS}}
    hosts: ["{WEB}"]
    tls: {{mode: SIMPLE, credentialName: shop-cert}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: web, namespace: shop}}
spec:
  hosts: [{WEB}]
  gateways: [istio-system/public]
  http: [{{route: [{{destination: {{host: web.shop.internal, port: {{number: 80}}}}}}]}}]
"#,
        ip = backend.ip(),
        port = backend.port(),
    )
}

/// Everything the termination tests share: certificates, manifests, the backend.
struct Termination {
    dir: tempfile::TempDir,
    manifests: tempfile::TempDir,
    xds_ca: TestCa,
    client_ca: TestCa,
    simple: u16,
    mutual: u16,
    foreign: u16,
    _backend: Backend,
}

impl Termination {
    async fn new() -> Termination {
        let dir = tempfile::tempdir().expect("temp dir");
        let backend = Backend::start("web", free_addr()).await;
        let [simple, mutual, foreign] =
            std::array::from_fn(|_| free_port_on(&[Ipv4Addr::UNSPECIFIED]));
        let t = Termination {
            manifests: tempfile::tempdir().expect("manifest dir"),
            xds_ca: TestCa::new("mesh-root"),
            client_ca: TestCa::new("client-ca"),
            simple,
            mutual,
            foreign,
            _backend: backend,
            dir,
        };
        let mesh = termination_manifests(t._backend.addr(), simple, mutual, foreign);
        std::fs::write(t.manifests.path().join("mesh.yaml"), mesh).expect("manifests");
        t.xds_ca.server("shoal").write(t.dir.path(), "server");
        std::fs::write(t.dir.path().join("mesh-root.crt"), &t.xds_ca.cert_pem).unwrap();
        // Another namespace's Secret, with a certificate for a name of its own.
        let shop = TestCa::new("shop-ca").server_for("shop-only.example.com");
        std::fs::write(
            t.manifests.path().join("shop-secret.yaml"),
            tls_secret("shop", "shop-cert", &shop, None),
        )
        .unwrap();
        t
    }

    /// (Re)writes istio-system/web-cert with a certificate for web.example.com from a new
    /// CA (returned, as the file clients verify against), and the client CA.
    fn write_web_cert(&self, ca_name: &str) -> std::path::PathBuf {
        let ca = TestCa::new(ca_name);
        let secret = tls_secret(
            "istio-system",
            "web-cert",
            &ca.server_for(WEB),
            Some(&self.client_ca.cert_pem),
        );
        // Written aside and renamed in, so the file source never reads half a file.
        let tmp = self.manifests.path().join(".web-secret.tmp");
        std::fs::write(&tmp, secret).unwrap();
        std::fs::rename(&tmp, self.manifests.path().join("web-secret.yaml")).unwrap();
        let path = self.dir.path().join(format!("{ca_name}.crt"));
        std::fs::write(&path, &ca.cert_pem).unwrap();
        path
    }

    /// The arguments of a server with the secure xDS port at `tls` (client CA: the mesh).
    fn tls_args(&self, tls: SocketAddr) -> Vec<String> {
        let p = |n: &str| self.dir.path().join(n).display().to_string();
        vec![
            "--xds-tls-addr".into(),
            tls.to_string(),
            "--xds-tls-cert".into(),
            p("server.crt"),
            "--xds-tls-key".into(),
            p("server.key"),
            "--xds-client-ca".into(),
            p("mesh-root.crt"),
        ]
    }

    /// The ingress gateway, authenticated on the secure port as istio-system/ingress.
    async fn gateway(&self, tls: SocketAddr, mode: AdsMode) -> Envoy {
        let (cert, key) = self
            .xds_ca
            .workload("istio-system", "ingress")
            .write(self.dir.path(), "ingress");
        let files = XdsTlsFiles {
            ca: self.dir.path().join("mesh-root.crt"),
            cert,
            key,
        };
        let bootstrap = bootstrap_with(&Node::gateway(), free_port(), &[tls], mode);
        let envoy = Envoy::start(&with_xds_tls(&bootstrap, &files)).await;
        envoy
            .wait_listener(&format!("0.0.0.0_{}", self.simple))
            .await;
        envoy
    }
}

/// `GET /` for web.example.com on `port`, verifying the server against `ca`.
async fn https_get(port: u16, ca: &Path, extra: &[&str]) -> String {
    let mut args = vec!["-CAfile", path(ca), "-verify_return_error"];
    args.extend_from_slice(extra);
    s_client_with(
        port,
        WEB,
        &args,
        &format!("GET / HTTP/1.1\r\nHost: {WEB}\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// Whether the backend answered through the gateway.
fn reached_backend(out: &str) -> bool {
    out.contains("HTTP/1.1 200") && out.contains(r#""backend":"web""#)
}

/// Waits until `GET /` on `port`, verified against `ca`, reaches the backend.
async fn wait_https(port: u16, ca: &Path, extra: &[&str]) -> String {
    eventually(
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let out = https_get(port, ca, extra).await;
            if reached_backend(&out) {
                Ok(out)
            } else {
                Err(out)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_and_mutual_terminate_with_credential_name_and_rotate() {
    let t = Termination::new().await;
    let ca1 = t.write_web_cert("gateway-ca-1");
    let tls = free_addr();
    let mut args = vec![
        "--standalone".to_string(),
        t.manifests.path().display().to_string(),
    ];
    args.extend(t.tls_args(tls));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let shoal = ShoalServer::start(&args).await;
    let gateway = t.gateway(tls, AdsMode::Delta).await;

    // SIMPLE: the client verifies the Secret's certificate (issued by gateway-ca-1 for
    // web.example.com) and gets the HTTP route's backend answer.
    let out = wait_https(t.simple, &ca1, &[]).await;
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");

    // MUTUAL: a client with a certificate from the Secret's CA gets an answer; once that
    // works (the listener is up), one without a certificate gets none.
    let (client_cert, client_key) = t.client_ca.client("client").write(t.dir.path(), "client");
    wait_https(
        t.mutual,
        &ca1,
        &["-cert", path(&client_cert), "-key", path(&client_key)],
    )
    .await;
    let anonymous = https_get(t.mutual, &ca1, &[]).await;
    assert!(
        !reached_backend(&anonymous),
        "MUTUAL served a client without a certificate:\n{anonymous}"
    );
    // A certificate from another CA is refused too.
    let (other_cert, other_key) = TestCa::new("other")
        .client("client")
        .write(t.dir.path(), "other");
    let stranger = https_get(
        t.mutual,
        &ca1,
        &["-cert", path(&other_cert), "-key", path(&other_key)],
    )
    .await;
    assert!(
        !reached_backend(&stranger),
        "MUTUAL served an unknown client CA:\n{stranger}"
    );

    // The Secret of namespace shop is on the bus (a Gateway there names it) but never
    // reaches this istio-system gateway: its server has no certificate to offer.
    let certs = gateway.admin_get("/certs").await.expect("/certs");
    assert!(certs.contains(WEB), "{certs}");
    assert!(
        !certs.contains("shop-only.example.com"),
        "another namespace's Secret was served:\n{certs}"
    );
    let foreign = https_get(t.foreign, &ca1, &[]).await;
    assert!(!reached_backend(&foreign), "{foreign}");

    // Rotation: a new certificate in the Secret reaches the running Envoy.
    // (The same Envoy process throughout: this test never restarts it.)
    let rotated = std::time::Instant::now();
    let ca2 = t.write_web_cert("gateway-ca-2");
    let out = wait_https(t.simple, &ca2, &[]).await;
    eprintln!(
        "rotation: new certificate served {:?} after the Secret was written",
        rotated.elapsed()
    );
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
    assert_eq!(gateway.stat_sum("update_rejected").await, 0);
    drop(shoal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_streams_get_no_credentials() {
    // istiod's rule: credentials only to an authenticated proxy. A gateway on the
    // plaintext port gets its listeners but no certificate.
    let t = Termination::new().await;
    let ca1 = t.write_web_cert("gateway-ca-1");
    let shoal = ShoalServer::standalone(t.manifests.path()).await;
    let gateway = Envoy::start(&bootstrap_with(
        &Node::gateway(),
        free_port(),
        &[shoal.xds_addr()],
        AdsMode::Sotw,
    ))
    .await;
    let name = format!("0.0.0.0_{}", t.simple);
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            match gateway.admin_get("/config_dump").await {
                Ok(d) if d.contains(&name) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let out = https_get(t.simple, &ca1, &[]).await;
    assert!(!reached_backend(&out), "{out}");
    let certs = gateway.admin_get("/certs").await.expect("/certs");
    assert!(!certs.contains(WEB), "{certs}");
    let metrics = shoal.admin_get("/metrics").await.expect("metrics").body;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains(r#"shoal_sds_denied_total{reason="unauthenticated"} "#)
            && !metrics.contains(r#"shoal_sds_denied_total{reason="unauthenticated"} 0"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_cross_the_bus_sealed() {
    let t = Termination::new().await;
    let ca1 = t.write_web_cert("gateway-ca-1");
    let key_file = t.dir.path().join("credential.key");
    let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let key_arg = key_file.display().to_string();
    let nats = NatsServer::start().await;
    let _ingester = ShoalIngester::for_dir_with(
        &nats.url(),
        t.manifests.path(),
        &["--credential-key-file", &key_arg],
    );

    // Every message the config bucket's stream holds, as raw bytes.
    let client = async_nats::connect(nats.url()).await.expect("nats client");
    let js = async_nats::jetstream::new(client);
    let raw = eventually(
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let Ok(mut stream) = js.get_stream("KV_shoal-config").await else {
                return Err("no config bucket yet".to_string());
            };
            let info = stream
                .info()
                .await
                .map_err(|e| e.to_string())?
                .state
                .clone();
            let mut all = Vec::new();
            for seq in info.first_sequence..=info.last_sequence {
                if let Ok(m) = stream.get_raw_message(seq).await {
                    all.push((m.subject.to_string(), m.payload.to_vec()));
                }
            }
            let credentials = all.iter().filter(|(s, _)| s.contains("Credential")).count();
            if credentials >= 2 {
                Ok(all)
            } else {
                Err(format!("{credentials} credentials on the bus"))
            }
        },
    )
    .await;
    let secret = std::fs::read_to_string(t.manifests.path().join("web-secret.yaml")).unwrap();
    let secret_key = pem_body(&tls_secret_field(&secret, "tls.key"));
    for (subject, payload) in &raw {
        for needle in [
            secret_key.as_bytes(),
            b"PRIVATE KEY".as_slice(),
            &secret_key.as_bytes()[..24],
        ] {
            assert!(
                !payload.windows(needle.len()).any(|w| w == needle),
                "{subject} carries key material in the clear"
            );
        }
    }

    // A server with the key file opens them: the gateway terminates TLS with the Secret.
    let tls = free_addr();
    let mut args = vec![
        "--nats-url".to_string(),
        nats.url(),
        "--credential-key-file".into(),
        key_arg.clone(),
    ];
    args.extend(t.tls_args(tls));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _shoal = ShoalServer::start(&args).await;
    let _gateway = t.gateway(tls, AdsMode::Sotw).await;
    wait_https(t.simple, &ca1, &[]).await;
}

/// A base64 `data` field of a Secret manifest, decoded.
fn tls_secret_field(manifest: &str, field: &str) -> String {
    let line = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{field}: ")))
        .expect("field");
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(line)
            .unwrap(),
    )
    .unwrap()
}

/// The base64 body of a PEM block, on one line.
fn pem_body(pem: &str) -> String {
    pem.lines().filter(|l| !l.starts_with("-----")).collect()
}

// ---------------------------------------------------------------------------------------
// The Kubernetes Gateway API: a Gateway of class `istio` and HTTPRoutes, served to the
// Envoy labelled `gateway.networking.k8s.io/gateway-name` in the Gateway's namespace.

/// A Kubernetes Service `ns/name` on port 80 with one ready endpoint: `backend`.
fn service_with_backend(ns: &str, name: &str, backend: SocketAddr) -> String {
    service_with_port(ns, name, "http", backend)
}

/// A Kubernetes Service `ns/name` on port 80 named `port_name` (`grpc`: HTTP/2 upstream)
/// with one ready endpoint: `backend`.
fn service_with_port(ns: &str, name: &str, port_name: &str, backend: SocketAddr) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  selector: {{app: {name}}}
  ports: [{{name: {port_name}, port: 80, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: {port_name}, port: {port}}}]
endpoints:
- addresses: ["{ip}"]
  conditions: {{ready: true}}
---
"#,
        ip = backend.ip(),
        port = backend.port(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_http_routes_standalone() {
    gateway_api_http_routes(Plane::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_http_routes_through_nats() {
    gateway_api_http_routes(Plane::Nats).await;
}

/// Where the gateway's configuration comes from.
#[derive(Debug, Clone, Copy)]
enum Plane {
    /// `shoal-server --standalone` reads the manifests itself.
    Standalone,
    /// nats-server, `shoal-ingester` on the manifests, `shoal-server` on the bus.
    Nats,
}

/// A running control plane of either kind; stops on drop.
struct ControlPlane {
    server: ShoalServer,
    _bus: Option<(NatsServer, ShoalIngester)>,
}

impl ControlPlane {
    async fn start(plane: Plane, manifests: &Path) -> ControlPlane {
        match plane {
            Plane::Standalone => ControlPlane {
                server: ShoalServer::standalone(manifests).await,
                _bus: None,
            },
            Plane::Nats => {
                let nats = NatsServer::start().await;
                let ingester = ShoalIngester::for_dir(&nats.url(), manifests);
                let server = ShoalServer::with_nats(&nats.url()).await;
                ControlPlane {
                    server,
                    _bus: Some((nats, ingester)),
                }
            }
        }
    }
}

/// The HTTPRoute features on one gateway, with real traffic: path (segment-wise prefix,
/// exact, regex), header, query and method matches with the spec's precedence; request
/// and response header modifiers, redirect, URL rewrite, mirror; weights; a request
/// timeout; 500 for a missing Service and for another namespace's Service without a
/// ReferenceGrant, 200 with one; a listener that admits only its own namespace refuses a
/// route from another; a GRPCRoute routes a real gRPC client's calls by service, method
/// and header. Served by `plane`, to a gateway on delta ADS and then to one on SotW.
async fn gateway_api_http_routes(plane: Plane) {
    let a = Backend::start("a", free_addr()).await;
    let b = Backend::start("b", free_addr()).await;
    let c = Backend::start("c", free_addr()).await;
    let d = Backend::start("d", free_addr()).await;
    let m = Backend::start("m", free_addr()).await;
    let [http, same, sel] = std::array::from_fn(|_| free_port_on(&[Ipv4Addr::UNSPECIFIED]));
    let (grpc_a, grpc_b) = (free_addr(), free_addr());
    let _grpc = GrpcBackends::start(&[("grpc-a", grpc_a), ("grpc-b", grpc_b)]).await;
    let mut yaml = String::new();
    yaml.push_str(&service_with_port("infra", "grpc-a", "grpc", grpc_a));
    yaml.push_str(&service_with_port("infra", "grpc-b", "grpc", grpc_b));
    for (ns, name, backend) in [
        ("apps", "a", &a),
        ("apps", "b", &b),
        ("apps", "m", &m),
        ("data", "c", &c),
        ("data", "d", &d),
    ] {
        yaml.push_str(&service_with_backend(ns, name, backend.addr()));
    }
    yaml.push_str(&format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: web, namespace: infra}}
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    port: {http}
    protocol: HTTP
    hostname: "*.example.com"
    allowedRoutes: {{namespaces: {{from: All}}}}
  - {{name: same, port: {same}, protocol: HTTP}}
  - name: sel
    port: {sel}
    protocol: HTTP
    allowedRoutes: {{namespaces: {{from: Selector, selector: {{matchLabels: {{expose: "yes"}}}}}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: chosen, namespace: apps}}
spec:
  parentRefs: [{{name: web, namespace: infra, sectionName: sel}}]
  hostnames: [apps.example.com]
  rules: [{{backendRefs: [{{name: a, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: unchosen, namespace: data}}
spec:
  parentRefs: [{{name: web, namespace: infra, sectionName: sel}}]
  hostnames: [data.example.com]
  rules: [{{backendRefs: [{{name: d, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: apps-to-d, namespace: data}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: apps}}]
  to: [{{group: "", kind: Service, name: d}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: shop, namespace: apps}}
spec:
  parentRefs: [{{name: web, namespace: infra}}]
  hostnames: [shop.example.com, shop.other.org]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /a}}}}]
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{path: {{type: Exact, value: /a/exact}}}}]
    backendRefs: [{{name: b, port: 80}}]
  - matches: [{{path: {{type: RegularExpression, value: "/re/[0-9]+"}}}}]
    backendRefs: [{{name: b, port: 80}}]
  - matches: [{{path: {{value: /h}}}}]
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{path: {{value: /h}}, headers: [{{name: X-Version, value: "2"}}]}}]
    backendRefs: [{{name: b, port: 80}}]
  - matches: [{{path: {{value: /q}}, queryParams: [{{name: v, value: "2"}}]}}, {{path: {{value: /q}}, method: POST}}]
    backendRefs: [{{name: b, port: 80}}]
  - matches: [{{path: {{value: /mod}}}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: x-set, value: yes}}], remove: [x-drop]}}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{add: [{{name: x-resp, value: r}}]}}
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{path: {{value: /redirect}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{scheme: https, hostname: secure.example.com, statusCode: 302}}
  - matches: [{{path: {{value: /old}}}}]
    filters:
    - type: URLRewrite
      urlRewrite: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /new}}}}
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{path: {{value: /strip}}}}]
    filters:
    - type: URLRewrite
      urlRewrite: {{hostname: inner.example, path: {{type: ReplacePrefixMatch, replacePrefixMatch: /}}}}
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{path: {{value: /mirror}}}}]
    filters:
    - type: RequestMirror
      requestMirror: {{backendRef: {{name: m, port: 80}}}}
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{path: {{value: /split}}}}]
    backendRefs: [{{name: a, port: 80, weight: 50}}, {{name: b, port: 80, weight: 50}}]
  - matches: [{{path: {{value: /slow}}}}]
    timeouts: {{request: 300ms}}
    backendRefs: [{{name: a, port: 80}}]
  - matches: [{{path: {{value: /missing}}}}]
    backendRefs: [{{name: nope, port: 80}}]
  - matches: [{{path: {{value: /cross}}}}]
    backendRefs: [{{name: c, namespace: data, port: 80}}]
  - matches: [{{path: {{value: /granted}}}}]
    backendRefs: [{{name: d, namespace: data, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: outsider, namespace: apps}}
spec:
  parentRefs: [{{name: web, namespace: infra, sectionName: same}}]
  rules: [{{backendRefs: [{{name: a, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: echo, namespace: infra}}
spec:
  parentRefs: [{{name: web, sectionName: same}}]
  rules:
  - matches: [{{method: {{service: echo.Echo}}}}]
    backendRefs: [{{name: grpc-a, port: 80}}]
  - matches: [{{method: {{service: echo.Echo, method: Call}}, headers: [{{name: x-version, value: v2}}]}}]
    backendRefs: [{{name: grpc-b, port: 80}}]
"#
    ));
    let manifests = tempfile::tempdir().expect("manifest dir");
    std::fs::write(manifests.path().join("mesh.yaml"), yaml).expect("manifests");
    let namespaces = manifests.path().join("namespaces.yaml");
    std::fs::write(&namespaces, namespace_labels("apps")).expect("namespaces");
    let control = ControlPlane::start(plane, manifests.path()).await;
    let shoal = &control.server;
    for mode in [AdsMode::Delta, AdsMode::Sotw] {
        eprintln!("{plane:?}, gateway on {mode:?}");
        let ports = [http, same, sel];
        http_routes_served(shoal, mode, ports, &namespaces, [&a, &b, &c, &m]).await;
    }
}

/// Namespaces `apps` and `data`, with `expose: "yes"` on `exposed` only.
fn namespace_labels(exposed: &str) -> String {
    ["apps", "data"]
        .iter()
        .map(|ns| {
            let labels = if *ns == exposed { "{expose: \"yes\"}" } else { "{}" };
            format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}, labels: {labels}}}\n---\n")
        })
        .collect()
}

/// [`gateway_api_http_routes`]'s checks, on a fresh gateway Envoy on `mode`; the
/// listener ports are `http`, `same` and `sel`, and `namespaces` is the manifest of the
/// Namespaces ([`namespace_labels`]), rewritten to relabel them.
async fn http_routes_served(
    shoal: &ShoalServer,
    mode: AdsMode,
    [http, same, sel]: [u16; 3],
    namespaces: &Path,
    [a, b, c, m]: [&Backend; 4],
) {
    let node = Node {
        id: "router~127.0.0.1~web-istio-1.infra~infra.svc.cluster.local".into(),
        cluster: "web-istio".into(),
        namespace: "infra".into(),
        labels: vec![(
            "gateway.networking.k8s.io/gateway-name".into(),
            "web".into(),
        )],
        interception: None,
        service_account: "web-istio".into(),
    };
    let gateway = Envoy::start(&bootstrap_with(
        &node,
        free_port(),
        &[shoal.xds_addr()],
        mode,
    ))
    .await;
    gateway.wait_listener(&format!("0.0.0.0_{http}")).await;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, http));
    let send = |req: Request| async move { req.host("shop.example.com").send(addr).await };
    let backend_of = |r: &shoal_tests::http::Response| {
        r.json()
            .ok()
            .and_then(|j| j["backend"].as_str().map(String::from))
            .unwrap_or_else(|| format!("status {}", r.status))
    };
    // Routes arrive with the first push; wait for the first rule to answer.
    eventually(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            match send(Request::get("/a")).await {
                Ok(r) if r.status == 200 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // Paths: segment-wise prefix, exact over prefix, regex.
    for (path, want) in [
        ("/a", "a"),
        ("/a/x", "a"),
        ("/a/exact", "b"),
        ("/re/12", "b"),
    ] {
        let r = send(Request::get(path)).await.expect(path);
        assert_eq!(backend_of(&r), want, "{path}");
    }
    let r = send(Request::get("/ab")).await.expect("/ab");
    assert_eq!(r.status, 404, "/ab is not under the prefix /a");
    // Header, query and method matches win over a bare path of the same length.
    let r = send(Request::get("/h").header("x-version", "2"))
        .await
        .unwrap();
    assert_eq!(backend_of(&r), "b");
    assert_eq!(backend_of(&send(Request::get("/h")).await.unwrap()), "a");
    assert_eq!(
        backend_of(&send(Request::get("/q?v=2")).await.unwrap()),
        "b"
    );
    assert_eq!(send(Request::get("/q?v=3")).await.unwrap().status, 404);
    let mut post = Request::get("/q");
    post.method = "POST".into();
    assert_eq!(backend_of(&send(post).await.unwrap()), "b");
    // The host must be one both the listener and the route allow.
    let r = Request::get("/a")
        .host("shop.other.org")
        .send(addr)
        .await
        .unwrap();
    assert_eq!(
        r.status, 404,
        "shop.other.org is outside the listener's *.example.com"
    );

    // Filters.
    let r = send(Request::get("/mod").header("x-drop", "1"))
        .await
        .unwrap();
    let seen = r.json().expect("backend echo");
    assert_eq!(seen["headers"]["x-set"], "yes", "{seen}");
    assert!(seen["headers"].get("x-drop").is_none(), "{seen}");
    assert_eq!(r.header("x-resp"), Some("r"));
    let r = send(Request::get("/redirect/x")).await.unwrap();
    assert_eq!(r.status, 302);
    assert_eq!(
        r.header("location"),
        Some("https://secure.example.com/redirect/x")
    );
    let seen = send(Request::get("/old/x")).await.unwrap().json().unwrap();
    assert_eq!(seen["path"], "/new/x", "{seen}");
    let seen = send(Request::get("/strip/y"))
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(seen["path"], "/y", "{seen}");
    assert_eq!(seen["host"], "inner.example", "{seen}");
    let mirrored = m.requests();
    assert_eq!(
        backend_of(&send(Request::get("/mirror")).await.unwrap()),
        "a"
    );
    eventually(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async {
            if m.requests() > mirrored {
                Ok(())
            } else {
                Err("the mirror got nothing")
            }
        },
    )
    .await;

    // Weights: both halves get traffic.
    let (before_a, before_b) = (a.requests(), b.requests());
    for _ in 0..40 {
        send(Request::get("/split")).await.unwrap();
    }
    assert!(a.requests() - before_a >= 5 && b.requests() - before_b >= 5);

    // A request timeout.
    let r = send(Request::get("/slow").header("x-delay-ms", "2000"))
        .await
        .unwrap();
    assert_eq!(r.status, 504);

    // Missing and refused backends answer 500; a granted one answers.
    assert_eq!(send(Request::get("/missing")).await.unwrap().status, 500);
    assert_eq!(send(Request::get("/cross")).await.unwrap().status, 500);
    assert_eq!(c.requests(), 0);
    assert_eq!(
        backend_of(&send(Request::get("/granted")).await.unwrap()),
        "d"
    );

    // GRPCRoute, with a real gRPC client (plaintext HTTP/2 to the gateway): the exact
    // service/method match with a header wins over the service-wide one.
    let client = GrpcClient::start(&grpc_bootstrap(
        shoal.xds_addr(),
        &ProxylessNode {
            ip: "127.0.0.9",
            pod: "client-1",
            namespace: "infra",
            labels: &[],
        },
    ))
    .await;
    let target = format!("127.0.0.1:{same}");
    let calls = eventually(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let calls = client
                .call_with(&target, "insecure", 5, &[])
                .await
                .map_err(|e| e.to_string())?;
            if calls.only(&["grpc-a"]) {
                Ok(calls)
            } else {
                Err(format!("{calls:?}"))
            }
        },
    )
    .await;
    assert_eq!(calls.backends["grpc-a"], 5);
    let v2 = client
        .call_with(&target, "insecure", 5, &[("x-version", "v2")])
        .await
        .expect("gRPC calls");
    assert!(v2.only(&["grpc-b"]), "{v2:?}");

    // `same` admits routes of infra only: the apps route got nothing there.
    let other = SocketAddr::from((Ipv4Addr::LOCALHOST, same));
    let r = Request::get("/").host("x.example.com").send(other).await;
    assert!(
        r.as_ref().map_or(true, |r| r.status != 200),
        "a route from another namespace attached to a Same listener: {r:?}"
    );

    // `sel` admits the routes of namespaces labelled `expose: "yes"`: apps's, not data's
    // (404); relabelling the Namespaces flips it, and back.
    let sel = SocketAddr::from((Ipv4Addr::LOCALHOST, sel));
    let served = |apps: &'static str, data: &'static str| async move {
        eventually(
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async move {
                let mut got = Vec::new();
                for host in ["apps.example.com", "data.example.com"] {
                    let r = Request::get("/")
                        .host(host)
                        .send(sel)
                        .await
                        .map_err(|e| e.to_string())?;
                    got.push(backend_of(&r));
                }
                if got == [apps, data] {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                }
            },
        )
        .await
    };
    served("a", "status 404").await;
    let started = std::time::Instant::now();
    std::fs::write(namespaces, namespace_labels("data")).expect("relabel");
    served("status 404", "d").await;
    eprintln!("namespace relabel served in {:?}", started.elapsed());
    std::fs::write(namespaces, namespace_labels("apps")).expect("relabel back");
    served("a", "status 404").await;
    assert_eq!(gateway.stat_sum("update_rejected").await, 0);
}

/// Gateway API listeners beyond HTTP, through NATS (file ingester → bus → server), on one
/// gateway authenticated as its pods' service account: HTTPS terminated with the certificate of a `certificateRefs` Secret (through
/// the gateway credential path), TLS passed through by SNI (TLSRoute), and TCP (TCPRoute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_https_tls_passthrough_and_tcp() {
    let dir = tempfile::tempdir().expect("temp dir");
    let web = Backend::start("web", free_addr()).await;
    let [https, passthrough, tcp] = std::array::from_fn(|_| free_port_on(&[Ipv4Addr::UNSPECIFIED]));

    // The passthrough backend: an OpenSSL server with its own certificate for HOST.
    let vault_addr = SocketAddr::from((loopback(42), free_port_on(&[loopback(42)])));
    let _vault = tls_backend(dir.path(), vault_addr).await;

    let gateway_ca = TestCa::new("gateway-ca");
    let mut yaml = service_with_backend("apps", "web", web.addr());
    yaml.push_str(&service_with_backend("infra", "vault", vault_addr));
    yaml.push_str(&tls_secret(
        "infra",
        "web-cert",
        &gateway_ca.server_for(WEB),
        None,
    ));
    yaml.push_str(&format!(
        r#"
---
apiVersion: v1
kind: Pod
metadata: {{name: secure-istio-1, namespace: infra, labels: {{gateway.networking.k8s.io/gateway-name: secure}}}}
spec: {{serviceAccountName: secure-istio, containers: [{{name: istio-proxy, image: envoy}}]}}
status: {{phase: Running, podIP: 10.3.0.1, podIPs: [{{ip: 10.3.0.1}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: secure-istio, namespace: infra}}
spec:
  selector: {{gateway.networking.k8s.io/gateway-name: secure}}
  ports: [{{name: https, port: {https}, targetPort: {https}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: secure-istio-1, namespace: infra, labels: {{kubernetes.io/service-name: secure-istio}}}}
addressType: IPv4
ports: [{{name: https, port: {https}}}]
endpoints:
- addresses: ["10.3.0.1"]
  conditions: {{ready: true}}
  targetRef: {{kind: Pod, name: secure-istio-1, namespace: infra}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: secure, namespace: infra}}
spec:
  gatewayClassName: istio
  listeners:
  - name: https
    port: {https}
    protocol: HTTPS
    hostname: {WEB}
    tls: {{certificateRefs: [{{name: web-cert}}]}}
    allowedRoutes: {{namespaces: {{from: All}}}}
  - name: passthrough
    port: {passthrough}
    protocol: TLS
    tls: {{mode: Passthrough}}
  - name: tcp
    port: {tcp}
    protocol: TCP
    allowedRoutes: {{namespaces: {{from: All}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: web, namespace: apps}}
spec:
  parentRefs: [{{name: secure, namespace: infra, sectionName: https}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {{name: vault, namespace: infra}}
spec:
  parentRefs: [{{name: secure, sectionName: passthrough}}]
  hostnames: [{HOST}]
  rules: [{{backendRefs: [{{name: vault, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {{name: raw, namespace: apps}}
spec:
  parentRefs: [{{name: secure, namespace: infra, port: {tcp}}}]
  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]
"#
    ));
    let manifests = tempfile::tempdir().expect("manifest dir");
    std::fs::write(manifests.path().join("mesh.yaml"), yaml).expect("manifests");
    let ca_file = dir.path().join("gateway-ca.crt");
    std::fs::write(&ca_file, &gateway_ca.cert_pem).unwrap();

    // The secure xDS port, and the gateway authenticated as infra/secure-istio.
    let xds_ca = TestCa::new("mesh-root");
    xds_ca.server("shoal").write(dir.path(), "server");
    std::fs::write(dir.path().join("mesh-root.crt"), &xds_ca.cert_pem).unwrap();
    let p = |n: &str| dir.path().join(n).display().to_string();
    // Through NATS: the file ingester publishes the Gateway API objects and seals the
    // Secret a listener's certificateRefs names; the server opens it.
    let key_file = dir.path().join("credential.key");
    let key = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let key_arg = key_file.display().to_string();
    let nats = NatsServer::start().await;
    let _ingester = ShoalIngester::for_dir_with(
        &nats.url(),
        manifests.path(),
        &["--credential-key-file", &key_arg],
    );
    let tls = free_addr();
    let args = [
        "--nats-url".to_string(),
        nats.url(),
        "--credential-key-file".into(),
        key_arg.clone(),
        "--xds-tls-addr".into(),
        tls.to_string(),
        "--xds-tls-cert".into(),
        p("server.crt"),
        "--xds-tls-key".into(),
        p("server.key"),
        "--xds-client-ca".into(),
        p("mesh-root.crt"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _shoal = ShoalServer::start(&args).await;
    let (cert, key) = xds_ca
        .workload("infra", "secure-istio")
        .write(dir.path(), "secure-istio");
    let files = XdsTlsFiles {
        ca: dir.path().join("mesh-root.crt"),
        cert,
        key,
    };
    let node = Node {
        id: "router~127.0.0.1~secure-istio-1.infra~infra.svc.cluster.local".into(),
        cluster: "secure-istio".into(),
        namespace: "infra".into(),
        labels: vec![(
            "gateway.networking.k8s.io/gateway-name".into(),
            "secure".into(),
        )],
        interception: None,
        service_account: "secure-istio".into(),
    };
    let bootstrap = bootstrap_with(&node, free_port(), &[tls], AdsMode::Sotw);
    let gateway = Envoy::start(&with_xds_tls(&bootstrap, &files)).await;

    // HTTPS: the client verifies the Secret's certificate and reaches the route's backend.
    let out = wait_https(https, &ca_file, &[]).await;
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");

    // TLS passthrough by SNI: the backend's own certificate, end to end.
    let page = eventually(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let out = s_client(passthrough, HOST).await;
            if out.contains("Ciphers supported in s_server") {
                Ok(out)
            } else {
                Err(out)
            }
        },
    )
    .await;
    assert!(page.contains(&format!("CN = {HOST}")) || page.contains(&format!("CN={HOST}")));
    let other = s_client(passthrough, "other.example.com").await;
    assert!(
        !other.contains("s_server"),
        "unmatched SNI got through:\n{other}"
    );

    // TCP: the bytes reach the HTTP backend untouched.
    let answer = eventually(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let r = Request::get("/raw")
                .send(SocketAddr::from((Ipv4Addr::LOCALHOST, tcp)))
                .await
                .map_err(|e| e.to_string())?;
            r.json().map_err(|e| e.to_string())
        },
    )
    .await;
    assert_eq!(answer["backend"], "web");
    assert_eq!(answer["path"], "/raw");
    assert_eq!(gateway.stat_sum("update_rejected").await, 0);
}

/// An OpenSSL TLS server on `addr` with a new self-signed certificate for `HOST` (written
/// into `dir`); it answers `GET /` with a page naming itself (`-www`), so a client sees
/// whom it reached.
async fn tls_backend(dir: &Path, addr: SocketAddr) -> Process {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        &format!("/CN={HOST}"),
        "-keyout",
        path(&key),
        "-out",
        path(&cert),
    ])
    .await;
    let mut server = Command::new("openssl");
    server.args([
        "s_server",
        "-accept",
        &addr.to_string(),
        "-cert",
        path(&cert),
        "-key",
        path(&key),
        "-www",
        "-quiet",
    ]);
    Process::spawn(
        "openssl-s_server",
        server,
        tempfile::tempdir().expect("backend dir"),
        "openssl is needed (Debian package openssl)",
    )
}
