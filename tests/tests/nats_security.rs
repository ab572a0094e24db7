//! NATS TLS and authentication, on both binaries, against a real nats-server: an ingester
//! (file source) publishes through a secured NATS and a server reads the state back and
//! serves it; wrong credentials and an untrusted server certificate end the process at
//! once with a message saying so.
//!
//! Processes: nats-server (config file with `tls {}` / `authorization {}`), `shoal-ingester
//! --source file:DIR`, `shoal-server --nats-url`. Run `cargo build --workspace --bins`
//! first. Certificates are generated here (rcgen): a CA, a server certificate for
//! 127.0.0.1, a client certificate, and a second CA that signed nothing shoal sees.

use shoal_tests::pki::{Pem, TestCa};
use shoal_tests::shoal::failed_start;
use shoal_tests::{eventually, NatsServer, ShoalIngester, ShoalServer};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The bound on a failed start: the connect timeout is 5 s and a retried unreachable
/// server takes 30 s, so anything under this proves the failure was not retried.
const FAIL_FAST: Duration = Duration::from_secs(10);

const MANIFESTS: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n---\n\
apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: demo\n\
spec:\n  type: ClusterIP\n  clusterIP: 10.0.0.10\n  selector:\n    app: web\n  ports:\n\
\x20 - name: http\n    port: 80\n    targetPort: 8080\n    protocol: TCP\n";

const HOSTNAME: &str = "web.demo.svc.cluster.local";

/// Test PKI files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("pki dir");
        let ca = TestCa::new("shoal test CA");
        std::fs::write(dir.path().join("ca.pem"), &ca.cert_pem).expect("writing the CA");
        let other = TestCa::new("some other CA").cert_pem;
        std::fs::write(dir.path().join("other-ca.pem"), other).expect("writing the CA");
        write_pair(dir.path(), "server", &ca.server("nats"));
        write_pair(dir.path(), "client", &ca.client("shoal"));
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// A `tls {}` block for nats-server; `verify` requires client certificates.
    fn server_block(&self, verify: bool) -> String {
        format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: {verify}\n  timeout: 5\n}}\n",
            self.path("server.pem"),
            self.path("server-key.pem"),
            self.path("ca.pem"),
        )
    }
}

/// Writes `<name>.pem` and `<name>-key.pem`.
fn write_pair(dir: &Path, name: &str, pem: &Pem) {
    std::fs::write(dir.join(format!("{name}.pem")), &pem.cert).expect("writing a certificate");
    std::fs::write(dir.join(format!("{name}-key.pem")), &pem.key).expect("writing a key");
}

fn manifests() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("manifest dir");
    std::fs::write(dir.path().join("mesh.yaml"), MANIFESTS).expect("writing manifests");
    dir
}

fn write_secret(dir: &Path, name: &str, value: &str) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, format!("{value}\n")).expect("writing secret file");
    path.display().to_string()
}

/// Starts an ingester publishing `manifests` and a server reading from NATS, both with
/// `security` flags, and waits until the server serves the manifests' service.
async fn publish_and_serve(nats_url: &str, security: &[&str]) {
    let dir = manifests();
    let source = format!("file:{}", dir.path().display());
    let admin = format!("127.0.0.1:{}", shoal_tests::ports::free_port());
    let mut args = vec![
        "--nats-url",
        nats_url,
        "--source",
        &source,
        "--admin-addr",
        &admin,
    ];
    args.extend(security);
    let mut ingester = ShoalIngester::start(&args);
    let mut args = vec!["--nats-url", nats_url];
    args.extend(security);
    let server = ShoalServer::start(&args).await;
    let served = eventually(Duration::from_secs(30), Duration::from_millis(100), || {
        let server = &server;
        async move {
            let configz = server.admin_get("/debug/configz").await?.json()?;
            let found = configz["services"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["hostname"] == HOSTNAME));
            anyhow::ensure!(found, "{HOSTNAME} not served yet: {configz}");
            Ok::<(), anyhow::Error>(())
        }
    });
    served.await;
    ingester.process().assert_running();
}

/// Both binaries' failing starts against `nats_url` with `security`: each exits within
/// [`FAIL_FAST`] printing `expected`, and never prints `secret`.
async fn both_fail_fast(nats_url: &str, security: &[&str], expected: &str, secret: &str) {
    let dir = manifests();
    let source = format!("file:{}", dir.path().display());
    let admin = format!("127.0.0.1:{}", shoal_tests::ports::free_port());
    let mut ingester = vec![
        "--nats-url",
        nats_url,
        "--source",
        &source,
        "--admin-addr",
        &admin,
    ];
    ingester.extend(security);
    let xds = format!("127.0.0.1:{}", shoal_tests::ports::free_port());
    let server_admin = format!("127.0.0.1:{}", shoal_tests::ports::free_port());
    let mut server = vec![
        "--nats-url",
        nats_url,
        "--xds-addr",
        &xds,
        "--admin-addr",
        &server_admin,
    ];
    server.extend(security);
    for (name, args) in [("shoal-ingester", ingester), ("shoal-server", server)] {
        let (took, text) = failed_start(name, &args, FAIL_FAST).await;
        eprintln!("{name} exited after {took:?}: {text}");
        assert!(
            text.contains(expected),
            "{name}: expected {expected:?} in:\n{text}"
        );
        assert!(!text.contains(secret), "{name} printed the secret:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_and_user_password() {
    let pki = Pki::new();
    let nats = NatsServer::start_with_config(&format!(
        "{}authorization {{\n  user: shoal\n  password: \"s3cret-pw\"\n}}\n",
        pki.server_block(true)
    ))
    .await;
    let password = write_secret(pki.dir.path(), "password", "s3cret-pw");
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client-key.pem"),
    );
    publish_and_serve(
        &nats.url(),
        &[
            "--nats-tls-ca",
            &ca,
            "--nats-tls-cert",
            &cert,
            "--nats-tls-key",
            &key,
            "--nats-user",
            "shoal",
            "--nats-password-file",
            &password,
        ],
    )
    .await;

    // A wrong password is refused at once, by both binaries, without printing it.
    let wrong = write_secret(pki.dir.path(), "wrong", "not-the-pw");
    both_fail_fast(
        &nats.url(),
        &[
            "--nats-tls-ca",
            &ca,
            "--nats-tls-cert",
            &cert,
            "--nats-tls-key",
            &key,
            "--nats-user",
            "shoal",
            "--nats-password-file",
            &wrong,
        ],
        "rejected shoal's credentials",
        "not-the-pw",
    )
    .await;

    // Without the client certificate, the server's `verify: true` refuses the connection.
    both_fail_fast(
        &nats.url(),
        &[
            "--nats-tls-ca",
            &ca,
            "--nats-user",
            "shoal",
            "--nats-password-file",
            &password,
        ],
        "TLS",
        "s3cret-pw",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_verified_tls_and_token() {
    let pki = Pki::new();
    let nats = NatsServer::start_with_config(&format!(
        "{}authorization {{\n  token: \"t0ken-value\"\n}}\n",
        pki.server_block(false)
    ))
    .await;
    let ca = pki.path("ca.pem");
    let token = write_secret(pki.dir.path(), "token", "t0ken-value");
    // tls:// asks for TLS by itself; the CA verifies the server.
    let tls_url = format!("tls://127.0.0.1:{}", nats.port());
    publish_and_serve(
        &tls_url,
        &["--nats-tls-ca", &ca, "--nats-token-file", &token],
    )
    .await;
    // The token as a flag, over a nats:// URL (TLS implied by --nats-tls-ca).
    publish_and_serve(
        &nats.url(),
        &["--nats-tls-ca", &ca, "--nats-token", "t0ken-value"],
    )
    .await;

    // A server certificate from a CA shoal does not trust: a TLS error at once.
    let other = pki.path("other-ca.pem");
    both_fail_fast(
        &nats.url(),
        &["--nats-tls-ca", &other, "--nats-token-file", &token],
        "TLS handshake with NATS failed",
        "t0ken-value",
    )
    .await;
    // A wrong token.
    both_fail_fast(
        &nats.url(),
        &["--nats-tls-ca", &ca, "--nats-token", "bad-t0ken"],
        "rejected shoal's credentials",
        "bad-t0ken",
    )
    .await;
    // No CA given: the system's roots do not know the test CA.
    both_fail_fast(
        &nats.url(),
        &["--nats-token-file", &token],
        "TLS handshake with NATS failed",
        "t0ken-value",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nkey() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().expect("seed");
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{\n  users: [ {{ nkey: \"{}\" }} ]\n}}\n",
        user.public_key()
    ))
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let seed_file = write_secret(dir.path(), "user.nk", &seed);
    publish_and_serve(&nats.url(), &["--nats-nkey", &seed_file]).await;

    // shoal insists on TLS when given a CA; this server has none.
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    both_fail_fast(
        &nats.url(),
        &["--nats-tls-ca", &ca, "--nats-nkey", &seed_file],
        "TLS handshake with NATS failed",
        &seed,
    )
    .await;

    let stranger = nkeys::KeyPair::new_user();
    let stranger_file = write_secret(dir.path(), "stranger.nk", &stranger.seed().expect("seed"));
    both_fail_fast(
        &nats.url(),
        &["--nats-nkey", &stranger_file],
        "rejected shoal's credentials",
        &stranger.seed().expect("seed"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_files_and_contradictions_are_named() {
    // No NATS needed: these fail before connecting.
    let url = "nats://127.0.0.1:1";
    both_fail_fast(
        url,
        &["--nats-tls-ca", "/nonexistent/ca.pem"],
        "--nats-tls-ca (SHOAL_NATS_TLS_CA) /nonexistent/ca.pem: cannot read it",
        "\u{0}",
    )
    .await;
    both_fail_fast(
        url,
        &[
            "--nats-user",
            "u",
            "--nats-password-file",
            "/nonexistent/pw",
        ],
        "--nats-password-file (SHOAL_NATS_PASSWORD_FILE) /nonexistent/pw",
        "\u{0}",
    )
    .await;
    both_fail_fast(
        url,
        &[
            "--nats-user",
            "u",
            "--nats-password",
            "pw-value",
            "--nats-token",
            "tok-value",
        ],
        "cannot be used with",
        "pw-value",
    )
    .await;
    both_fail_fast(
        url,
        &["--nats-tls-cert", "/c.pem"],
        "--nats-tls-key",
        "\u{0}",
    )
    .await;
}

/// The permissions docs/operations.md ("Securing NATS") documents for shoal's user.
const SHOAL_PERMISSIONS: &str = r#"permissions: {
      publish: { allow: ["$JS.API.>", "$JS.FC.>", "$KV.shoal-config.>", "$KV.shoal-services.>", "$KV.shoal-endpoints.>", "$KV.shoal-meta.>"] }
      subscribe: { allow: ["_INBOX.>"] }
    }"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_permissions_are_enough() {
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{\n  users: [ {{ user: shoal, password: pw, {SHOAL_PERMISSIONS} }} ]\n}}\n"
    ))
    .await;
    // Both binaries create buckets, publish, watch and read with only these permissions.
    publish_and_serve(
        &nats.url(),
        &["--nats-user", "shoal", "--nats-password", "pw"],
    )
    .await;
    let log = nats.process().log();
    assert!(
        // nats-server logs "Publish Violation" / "Subscription Violation".
        !log.contains("Violation"),
        "nats-server saw a permissions violation:\n{log}"
    );
}
