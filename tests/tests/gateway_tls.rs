//! End to end: a Gateway TLS server with `tls.mode: PASSTHROUGH` routes connections by SNI
//! (VirtualService `tls` rules) to a TLS backend the gateway never decrypts, and closes
//! connections whose SNI no rule names. The backend and the client are OpenSSL's
//! `s_server` / `s_client`; the gateway is a real Envoy configured by a standalone shoal.
#![forbid(unsafe_code)]

use shoal_tests::bootstrap::{bootstrap_with, AdsMode, Node};
use shoal_tests::ports::{free_port, free_port_on, loopback};
use shoal_tests::process::Process;
use shoal_tests::{eventually, Envoy, ShoalServer};
use std::net::Ipv4Addr;
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

    // A TLS backend with a certificate for the host; it answers `GET /` with a page
    // naming itself (`-www`), so the client sees whom it reached.
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
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
        &format!("{backend_ip}:{backend_port}"),
        "-cert",
        path(&cert),
        "-key",
        path(&key),
        "-www",
        "-quiet",
    ]);
    let _backend = Process::spawn(
        "openssl-s_server",
        server,
        tempfile::tempdir().expect("backend dir"),
        "openssl is needed (Debian package openssl)",
    );

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
    let name = format!("0.0.0.0_{gateway_port}");
    eventually(
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            match gateway.admin_get("/listeners").await {
                Ok(l) if l.contains(&name) => Ok(()),
                other => Err(format!("gateway listeners: {other:?}")),
            }
        },
    )
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
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-servername",
            sni,
            "-ign_eof",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl s_client");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"GET / HTTP/1.0\r\n\r\n").await;
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
