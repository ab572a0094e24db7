//! NATS TLS and authentication, on both binaries, against a real nats-server: an ingester
//! (file source) publishes through a secured NATS and a server reads the state back and
//! serves it; wrong credentials and an untrusted server certificate end the process at
//! once with a message saying so.
//!
//! Processes: nats-server (config file with `tls {}` / `authorization {}`), `shoal-ingester
//! --source file:DIR`, `shoal-server --nats-url`. Run `cargo build --workspace --bins`
//! first. Certificates are generated here (rcgen): a CA, a server certificate for
//! 127.0.0.1, a client certificate, and a second CA that signed nothing shoal sees.
//!
//! `servers_are_read_only_on_the_bus` gives each binary its own NATS user with the
//! permission sets docs/operations.md documents (servers: read only), attacks the bus with
//! the server's credentials and with an all-powerful one, and runs a `kube` ingester
//! against the Kubernetes API test server.

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)] // shared with kube_ingest.rs
mod harness;

use shoal_common::bus::nats::{NatsAuth, NatsBus, NatsOptions};
use shoal_common::bus::{Bucket, StateBus};
use shoal_common::lease::{self, LeaseBody};
use shoal_common::model::ClusterIssuer;
use shoal_common::secret::Secret;
use shoal_common::{keys, Envelope};
use shoal_tests::pki::{Pem, ServerPki, TestCa, TokenSigner};
use shoal_tests::ports::free_addr;
use shoal_tests::shoal::failed_start;
use shoal_tests::{eventually, NatsServer, ShoalIngester, ShoalServer};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

/// The ingester's documented permission set is enough for a file-source ingester and a
/// server sharing one user (a server needs only its own subset: see
/// `servers_are_read_only_on_the_bus`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_permissions_are_enough() {
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{\n  users: [ {{ user: shoal, password: pw, {} }} ]\n}}\n",
        permissions(ingester_subjects)
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

/// The buckets' names, as their streams (`KV_<name>`) and subjects (`$KV.<name>.>`) use them.
const BUCKETS: [&str; 4] = [
    "shoal-config",
    "shoal-services",
    "shoal-endpoints",
    "shoal-meta",
];

/// What a server may publish, per bucket (docs/operations.md, "Securing NATS"): read the
/// stream's info, create (and, when the client re-creates it, delete) its watch
/// consumers, answer their flow control. No `$KV.` subject, no stream create, update,
/// purge or delete, no direct get.
fn server_subjects(bucket: &str) -> Vec<String> {
    vec![
        format!("$JS.API.STREAM.INFO.KV_{bucket}"),
        format!("$JS.API.CONSUMER.CREATE.KV_{bucket}"),
        format!("$JS.API.CONSUMER.CREATE.KV_{bucket}.>"),
        format!("$JS.API.CONSUMER.DELETE.KV_{bucket}.*"),
        format!("$JS.FC.KV_{bucket}.>"),
    ]
}

/// What an ingester may publish, per bucket: the server's subjects, and create the
/// bucket, read single keys, write and delete keys.
fn ingester_subjects(bucket: &str) -> Vec<String> {
    let mut subjects = server_subjects(bucket);
    subjects.extend([
        format!("$JS.API.STREAM.CREATE.KV_{bucket}"),
        format!("$JS.API.DIRECT.GET.KV_{bucket}.>"),
        format!("$KV.{bucket}.>"),
    ]);
    subjects
}

/// A nats-server `permissions` block allowing `subjects` (per bucket) and the inbox.
fn permissions(subjects: fn(&str) -> Vec<String>) -> String {
    let all: Vec<String> = BUCKETS
        .iter()
        .flat_map(|b| subjects(b))
        .map(|s| format!("\"{s}\""))
        .collect();
    format!(
        "permissions: {{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [\"_INBOX.>\"] }} }}",
        all.join(", ")
    )
}

fn user(name: &str) -> NatsAuth {
    NatsAuth::UserPassword {
        user: name.into(),
        password: Secret::new("pw"),
    }
}

/// `name{labels} N` from a metrics text (0 when absent).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn server_metrics(server: &ShoalServer) -> String {
    server
        .admin_get("/metrics")
        .await
        .map(|r| r.text())
        .unwrap_or_default()
}

/// The ports `server` serves for the `web` service of `shop`.
async fn web_ports(server: &ShoalServer) -> Option<Vec<u64>> {
    let configz = server.admin_get("/debug/configz").await.ok()?.json().ok()?;
    let services = configz.get("services")?.as_array()?;
    let web = services
        .iter()
        .find(|s| s["hostname"] == "web.shop.svc.cluster.local")?;
    Some(
        web["ports"]
            .as_array()?
            .iter()
            .filter_map(|p| p["port"].as_u64())
            .collect(),
    )
}

async fn wait_web_ports(server: &ShoalServer, want: &[u64]) {
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            match web_ports(server).await {
                Some(ports) if ports == want => Ok(()),
                other => Err(format!("web ports served: {other:?}")),
            }
        },
    )
    .await;
}

/// Waits until `series` in `server`'s metrics is `want`.
async fn wait_server_metric(server: &ShoalServer, series: &str, want: f64) {
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let now = metric(&server_metrics(server).await, series);
            (now == want)
                .then_some(())
                .ok_or(format!("{series} = {now}"))
        },
    )
    .await;
}

/// A server with the server's NATS user and a TLS port (so it follows token issuers).
fn spawn_server(url: &str, pki: &ServerPki) -> ShoalServer {
    let mut args: Vec<String> = [
        "--nats-url",
        url,
        "--nats-user",
        "server",
        "--nats-password",
        "pw",
    ]
    .map(String::from)
    .to_vec();
    args.extend(pki.server_args(free_addr()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ShoalServer::spawn(&args)
}

/// A record for `issuer.<cluster>`, written as `fleet` at `epoch`, with keys nobody trusts.
fn forged_issuer(cluster: &str, fleet: &str, epoch: u64) -> bytes::Bytes {
    let record = ClusterIssuer {
        cluster: cluster.into(),
        issuer: "https://kubernetes.default.svc.cluster.local".into(),
        jwks: TokenSigner::new("https://attacker", "evil")
            .jwks()
            .to_string(),
    };
    Envelope::new(fleet, epoch, 1, &record)
        .encode()
        .expect("encode")
        .into()
}

/// The finding of issue 18: with write access, a server identity could inject config, an
/// issuer, a lease that fences every real write, and purge a bucket. With the documented
/// read-only set a server still starts (before any bucket exists), becomes ready and
/// serves; every write it attempts is refused by NATS. Issuer records that no current
/// lease holder wrote, and a lease epoch that jumps implausibly, are refused by the
/// servers (and the ingester keeps leading and writing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_are_read_only_on_the_bus() {
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{\n  users: [\n    {{ user: ingester, password: pw, {} }},\n    \
         {{ user: server, password: pw, {} }},\n    {{ user: admin, password: pw }}\n  ]\n}}\n",
        permissions(ingester_subjects),
        permissions(server_subjects),
    ))
    .await;
    let url = nats.url();
    let cluster = harness::config_cluster().await;
    harness::populate(&cluster, "shop", serde_json::json!({}), "r1");
    let issuer = "https://kubernetes.default.svc.cluster.local";
    cluster.set_service_account_issuer(issuer, TokenSigner::new(issuer, "key-1").jwks());

    // The server starts first: it creates no bucket and says it waits for an ingester.
    let pki = ServerPki::new();
    let mut server = spawn_server(&url, &pki);
    let waiting = "waiting for an ingester to create the bucket";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.process().log().contains(waiting) {
        assert!(
            Instant::now() < deadline,
            "no {waiting:?} in the server's log:\n{}",
            server.process().log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut ingester = harness::Ingester::start(
        &url,
        &cluster.kubeconfig(),
        &["--nats-user", "ingester", "--nats-password", "pw"],
    );
    ingester.wait_ready().await;
    server.wait_ready().await;
    wait_web_ports(&server, &[80]).await;
    wait_server_metric(&server, "shoal_token_issuers", 1.0).await;
    let log = nats.process().log();
    assert!(
        !log.contains("Violation"),
        "the documented permission sets are not enough:\n{log}"
    );

    // With the server's credentials, every write and every stream change is refused.
    let admin = NatsBus::connect(&NatsOptions {
        auth: user("admin"),
        ..NatsOptions::new(url.clone())
    })
    .await
    .expect("admin connection");
    let lease_key = keys::lease_key("default");
    let lease_before = admin.get(Bucket::Meta, &lease_key).await.unwrap().unwrap();
    let held = lease::decode(&lease_before.value).unwrap().body;
    let endpoints_before = admin.keys(Bucket::Endpoints).await.unwrap();
    assert_eq!(endpoints_before.len(), 1, "{endpoints_before:?}");
    let client = async_nats::ConnectOptions::with_user_and_password("server".into(), "pw".into())
        .connect(url.as_str())
        .await
        .expect("server-credentialed client");
    let attempts = [
        "$KV.shoal-config.VirtualService.shop.forged",
        "$KV.shoal-meta.issuer.forged",
        "$KV.shoal-meta.lease.default",
        "$KV.shoal-endpoints.Kubernetes.shop.web.web-abc",
        "$JS.API.STREAM.PURGE.KV_shoal-endpoints",
        "$JS.API.STREAM.DELETE.KV_shoal-endpoints",
        "$JS.API.STREAM.UPDATE.KV_shoal-config",
        "$JS.API.STREAM.CREATE.KV_shoal-forged",
    ];
    let answers = futures::future::join_all(attempts.iter().map(|subject| {
        let client = client.clone();
        async move {
            let request = client.request(subject.to_string(), "{}".into());
            tokio::time::timeout(Duration::from_secs(2), request).await
        }
    }))
    .await;
    for (subject, answer) in attempts.iter().zip(&answers) {
        assert!(
            !matches!(answer, Ok(Ok(_))),
            "{subject}: answered {answer:?}"
        );
    }
    let log = nats.process().log();
    for subject in attempts {
        let line = format!("Publish Violation - User \"server\", Subject \"{subject}\"");
        assert!(log.contains(&line), "no {line:?} in:\n{log}");
    }
    let violations: Vec<&str> = log.lines().filter(|l| l.contains("Violation")).collect();
    assert!(
        violations.iter().all(|l| l.contains("User \"server\"")),
        "only the attacks are violations: {violations:#?}"
    );
    assert_eq!(
        admin.keys(Bucket::Endpoints).await.unwrap(),
        endpoints_before
    );
    assert!(admin
        .get(Bucket::Config, "VirtualService.shop.forged")
        .await
        .unwrap()
        .is_none());
    assert!(admin
        .get(Bucket::Meta, "issuer.forged")
        .await
        .unwrap()
        .is_none());
    println!(
        "server credentials: {} writes and stream changes refused",
        attempts.len()
    );

    // Issuer records from a stale epoch, from an epoch the lease never had, and from a
    // fleet without a lease (written here with full rights, as a compromised or deposed
    // writer would): refused live, and by a server that starts afterwards (replay).
    let forged = [
        ("stale", "default", held.epoch - 1, "fenced"),
        ("ahead", "default", held.epoch + 5, "fenced"),
        ("orphan", "evil", 1, "unleased"),
    ];
    for (cluster, fleet, epoch, _) in forged {
        admin
            .put(
                Bucket::Meta,
                &keys::issuer_key(cluster),
                forged_issuer(cluster, fleet, epoch),
            )
            .await
            .unwrap();
    }
    let replayed = spawn_server(&url, &pki);
    let mut replayed = replayed;
    replayed.wait_ready().await;
    for s in [&server, &replayed] {
        wait_server_metric(
            s,
            "shoal_token_issuers_refused_total{reason=\"fenced\"}",
            2.0,
        )
        .await;
        wait_server_metric(
            s,
            "shoal_token_issuers_refused_total{reason=\"unleased\"}",
            1.0,
        )
        .await;
        let text = server_metrics(s).await;
        assert_eq!(
            metric(&text, "shoal_token_issuers"),
            1.0,
            "only the real issuer"
        );
    }
    println!("forged issuer records refused: {forged:?}");

    // A lease 2^62 epochs ahead: refused by the servers, written over by the ingester,
    // which keeps leading and writing.
    let jump = LeaseBody {
        holder: "attacker".into(),
        epoch: held.epoch + (1 << 62),
        renewed_at_ms: shoal_common::envelope::now_ms(),
        ttl_ms: 60_000,
        since_revision: 0,
    };
    let forged_at = Instant::now();
    admin
        .put(
            Bucket::Meta,
            &lease_key,
            lease::encode("default", &jump).unwrap().into(),
        )
        .await
        .unwrap();
    let jump_series = "shoal_bus_entries_total{bucket=\"shoal-meta\",result=\"epoch_jump\"}";
    wait_server_metric(&server, jump_series, 1.0).await;
    eventually(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async {
            let entry = admin
                .get(Bucket::Meta, &lease_key)
                .await
                .map_err(|e| e.to_string())?;
            let now = entry.map(|e| lease::decode(&e.value).unwrap().body);
            match now {
                Some(l) if l.epoch == held.epoch && l.holder == held.holder => Ok(()),
                other => Err(format!("lease: {other:?}")),
            }
        },
    )
    .await;
    let written_back = forged_at.elapsed();
    let metrics = ingester.metrics().await;
    assert_eq!(
        metric(&metrics, "shoal_ingester_lease_epoch_refused_total"),
        1.0,
        "{metrics}"
    );
    assert!(metrics.contains("\nshoal_ingester_leader 1"), "{metrics}");
    println!(
        "the ingester wrote its lease (epoch {}) back over the jump after {written_back:?}",
        held.epoch
    );

    // The real ingester's writes still apply.
    cluster
        .apply(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.0.0.10", "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 81, "targetPort": 8080}]},
        }))
        .unwrap();
    wait_web_ports(&server, &[81]).await;
    wait_web_ports(&replayed, &[81]).await;
    let text = server_metrics(&server).await;
    for bucket in BUCKETS {
        let series = format!("shoal_bus_entries_total{{bucket=\"{bucket}\",result=\"fenced\"}}");
        assert_eq!(metric(&text, &series), 0.0, "{series}");
    }
    assert!(
        server
            .process()
            .log()
            .contains("refusing an implausible lease epoch"),
        "the server logs the refusal"
    );
}
