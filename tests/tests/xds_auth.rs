//! The secure xDS port (istiod's 15012): TLS with a certificate reloaded from files, proxy
//! authentication by SPIFFE client certificate or by Kubernetes service-account token
//! (verified offline against the issuer keys the ingester reads from the cluster and
//! publishes on the bus), authorization of the node id against the identity, and gateway
//! credentials (SDS) only to the verified identity of the gateway's own pods, in the
//! Secret's cluster.
//!
//! Real processes: `shoal-server` (standalone, or reading a real nats-server),
//! `shoal-ingester` against the Kubernetes API test server serving issuer discovery, and a
//! gRPC ADS client over TLS standing in for Envoy/istio-agent (it shows the exact status
//! each refusal ends with).
//!
//! Run `cargo build --workspace --bins` first.

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)] // shared with kube_ingest.rs
mod harness;

use harness::{config_cluster, istio_crd, remote_secret, Ingester};
use prost::Message;
use serde_json::json;
use shoal_proto::pb::envoy::config::core::v3::data_source::Specifier;
use shoal_proto::pb::envoy::config::core::v3::Node;
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{secret, Secret};
use shoal_proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use shoal_proto::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use shoal_proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use shoal_proto::pb::google::protobuf::{value::Kind, Struct, Value};
use shoal_tests::kubeapi::KubeApiServer;
use shoal_tests::pki::{self, Pem, TestCa, TokenSigner};
use shoal_tests::ports::free_addr;
use shoal_tests::shoal::ShoalServer;
use shoal_tests::{eventually, NatsServer};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(30);
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// What a proxy presents besides its TLS client certificate.
#[derive(Default, Clone)]
struct Ask<'a> {
    /// The node's namespace.
    namespace: &'a str,
    /// Node metadata `SERVICE_ACCOUNT`.
    service_account: Option<&'a str>,
    /// `authorization: Bearer <token>`.
    token: Option<String>,
    /// The `clusterid` header istio-agent sends.
    cluster_id: Option<&'a str>,
}

/// Opens an ADS stream as a sidecar of `ask.namespace` and asks for clusters: the number
/// of clusters of the first response, or the status the stream ended with.
async fn ask_clusters(
    channel: tonic::transport::Channel,
    ask: Ask<'_>,
) -> Result<usize, tonic::Status> {
    let ns = ask.namespace;
    let mut fields = std::collections::HashMap::new();
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    fields.insert("NAMESPACE".to_string(), string(ns));
    if let Some(sa) = ask.service_account {
        fields.insert("SERVICE_ACCOUNT".to_string(), string(sa));
    }
    let request = DiscoveryRequest {
        node: Some(Node {
            id: format!("sidecar~10.1.0.9~app-1.{ns}~{ns}.svc.cluster.local"),
            metadata: Some(Struct { fields }),
            ..Node::default()
        }),
        type_url: shoal_proto::CLUSTER_TYPE.to_string(),
        ..DiscoveryRequest::default()
    };
    // Keep the request stream open until the first response.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(request).await.expect("queueing the request");
    let mut grpc = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = &ask.token {
        grpc.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header value"),
        );
    }
    if let Some(cluster) = ask.cluster_id {
        grpc.metadata_mut()
            .insert("clusterid", cluster.parse().expect("header value"));
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let mut responses = client.stream_aggregated_resources(grpc).await?.into_inner();
    let first = tokio::time::timeout(TIMEOUT, responses.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no response"))??
        .ok_or_else(|| tonic::Status::unknown("stream ended without a response"))?;
    drop(tx);
    Ok(first.resources.len())
}

/// A NATS server and a Kubernetes API server whose service-account issuer signs with
/// the returned signer, read by a ready ingester.
async fn token_issuer_mesh() -> (NatsServer, KubeApiServer, TokenSigner, Ingester) {
    let nats = NatsServer::start().await;
    let cluster = config_cluster().await;
    let signer = TokenSigner::new(ISSUER, "key-1");
    cluster.set_service_account_issuer(ISSUER, signer.jwks());
    let mut ingester = Ingester::start(&nats.url(), &cluster.kubeconfig(), &[]);
    ingester.wait_ready().await;
    (nats, cluster, signer, ingester)
}

/// Waits until `server` has loaded the (one) issuer the ingester published.
async fn wait_issuer_loaded(server: &ShoalServer) {
    eventually::eventually(TIMEOUT, Duration::from_millis(200), || async {
        let issuers = metric(server, "shoal_token_issuers", "").await;
        (issuers == 1.0)
            .then_some(())
            .ok_or("the issuer is not loaded yet")
    })
    .await;
}

/// `name{label="value"} N` from the server's /metrics (0 when absent).
async fn metric(server: &ShoalServer, name: &str, label: &str) -> f64 {
    let text = server.admin_get("/metrics").await.expect("/metrics").text();
    let series = match label {
        "" => format!("{name} "),
        label => format!("{name}{{{label}}} "),
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Asserts each `name{label="value"}` series has its count.
async fn assert_counts(server: &ShoalServer, name: &str, label: &str, counts: &[(&str, f64)]) {
    for (value, n) in counts {
        let series = format!("{label}=\"{value}\"");
        assert_eq!(
            metric(server, name, &series).await,
            *n,
            "{name}{{{series}}}"
        );
    }
}

/// Starts a server with TLS on a free port (plus the harness's plaintext port) and returns
/// it with its TLS address.
async fn tls_server(
    state: &[&str],
    dir: &Path,
    client_ca: Option<&Path>,
) -> (ShoalServer, SocketAddr) {
    let tls_addr = free_addr();
    let tls = tls_addr.to_string();
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let mut args: Vec<&str> = state.to_vec();
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    args.extend([
        "--xds-tls-addr",
        &tls,
        "--xds-tls-cert",
        cert,
        "--xds-tls-key",
        key,
    ]);
    let ca;
    if let Some(path) = client_ca {
        ca = path.to_str().unwrap().to_string();
        args.extend(["--xds-client-ca", &ca]);
    }
    (ShoalServer::start(&args).await, tls_addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_authenticate_and_the_node_must_be_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mesh root");
    ca.server("shoal one").write(dir.path(), "server");
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, &ca.cert_pem).unwrap();
    let mesh = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/mesh");
    let (server, addr) = tls_server(&["--standalone", mesh], dir.path(), Some(&ca_path)).await;

    let web = ca.workload("demo", "web");
    let channel = |client: Option<Pem>| {
        let config = pki::client_config(&ca.cert_pem, client.as_ref());
        async move { pki::tls_channel(addr, config).await.expect("TLS channel") }
    };
    let ask = |namespace, service_account| Ask {
        namespace,
        service_account,
        ..Ask::default()
    };

    // Its own namespace and service account: config.
    let clusters = ask_clusters(channel(Some(web.clone())).await, ask("demo", Some("web")))
        .await
        .expect("the workload's own config");
    assert!(clusters > 0, "a sidecar gets clusters");
    // Another namespace's node id: PermissionDenied, naming both sides.
    let denied = ask_clusters(channel(Some(web.clone())).await, ask("istio-system", None))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(
        denied
            .message()
            .contains("spiffe://cluster.local/ns/demo/sa/web")
            && denied.message().contains("istio-system"),
        "{denied:?}"
    );
    // Its namespace but another service account: PermissionDenied too.
    let denied = ask_clusters(channel(Some(web.clone())).await, ask("demo", Some("db")))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    // No certificate and no token: Unauthenticated.
    let refused = ask_clusters(channel(None).await, ask("demo", None))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("no credentials"), "{refused:?}");
    // A certificate from another CA does not get past the handshake.
    let stranger = TestCa::new("elsewhere").workload("demo", "web");
    let config = pki::client_config(&ca.cert_pem, Some(&stranger));
    let result = match pki::tls_channel(addr, config).await {
        Ok(channel) => ask_clusters(channel, ask("demo", None)).await.map(|_| ()),
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
    };
    assert!(
        result.is_err(),
        "a certificate of an unknown CA must be refused"
    );

    assert_eq!(
        metric(
            &server,
            "shoal_xds_auth_refused_total",
            "reason=\"forbidden\""
        )
        .await,
        2.0
    );
    assert_eq!(
        metric(
            &server,
            "shoal_xds_auth_refused_total",
            "reason=\"no_credentials\""
        )
        .await,
        1.0
    );
    assert!(
        metric(
            &server,
            "shoal_xds_auth_accepted_total",
            "source=\"certificate\""
        )
        .await
            >= 3.0
    );

    // The plaintext port (enabled explicitly by the harness) authenticates nothing, as
    // istiod's 15010.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", server.xds_addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    assert!(ask_clusters(plain, ask("istio-system", None)).await.is_ok());

    // /debug answers on localhost (the harness's admin address is 127.0.0.1).
    assert_eq!(server.admin_get("/debug/syncz").await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_is_reloaded_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mesh root");
    ca.server("shoal one").write(dir.path(), "server");
    let mesh = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/mesh");
    let (server, addr) = tls_server(&["--standalone", mesh], dir.path(), None).await;
    let first = pki::server_certificate(addr, pki::client_config(&ca.cert_pem, None))
        .await
        .expect("TLS handshake");

    // A broken pair (a certificate without its key yet) keeps the old one in use.
    let next = ca.server("shoal two");
    std::fs::write(dir.path().join("server.crt"), &next.cert).unwrap();
    eventually::eventually(TIMEOUT, Duration::from_millis(200), || async {
        let errors = metric(&server, "shoal_xds_tls_reloads_total", "result=\"error\"").await;
        (errors >= 1.0).then_some(()).ok_or("no failed reload yet")
    })
    .await;
    let during = pki::server_certificate(addr, pki::client_config(&ca.cert_pem, None))
        .await
        .expect("still serving the previous certificate");
    assert_eq!(during, first);

    std::fs::write(dir.path().join("server.key"), &next.key).unwrap();
    let renewed = eventually::try_eventually(TIMEOUT, Duration::from_millis(200), || async {
        let cert = pki::server_certificate(addr, pki::client_config(&ca.cert_pem, None))
            .await
            .map_err(|e| e.to_string())?;
        if cert == first {
            return Err("still the first certificate".to_string());
        }
        Ok(cert)
    })
    .await;
    assert!(renewed.is_ok(), "{renewed:?}");
    assert_eq!(
        metric(&server, "shoal_xds_tls_reloads_total", "result=\"ok\"").await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_are_verified_offline_against_the_published_issuer() {
    let (nats, cluster, signer, ingester) = token_issuer_mesh().await;

    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mesh root");
    ca.server("shoal").write(dir.path(), "server");
    let (server, addr) = tls_server(&["--nats-url", &nats.url()], dir.path(), None).await;
    wait_issuer_loaded(&server).await;

    let channel = || pki::tls_channel(addr, pki::client_config(&ca.cert_pem, None));
    let token = signer.token("shop", "web", "istio-ca");
    let with = |namespace, token: String, cluster_id| Ask {
        namespace,
        service_account: Some("web"),
        token: Some(token),
        cluster_id,
    };

    // The API server is not asked per connection: no TokenReview.
    let requests_before = cluster.requests();
    for _ in 0..20 {
        let ok = ask_clusters(
            channel().await.unwrap(),
            with("shop", token.clone(), Some("Kubernetes")),
        )
        .await;
        assert!(ok.is_ok(), "{ok:?}");
    }
    // Without istio-agent's clusterid header every cluster's keys are tried.
    assert!(
        ask_clusters(channel().await.unwrap(), with("shop", token.clone(), None))
            .await
            .is_ok()
    );
    let extra = cluster.requests() - requests_before;
    assert!(extra <= 2, "{extra} API requests during 21 authentications");

    let refused = |ns, token, cluster_id| async move {
        ask_clusters(channel().await.unwrap(), with(ns, token, cluster_id))
            .await
            .unwrap_err()
    };
    let denied = refused("bank", token.clone(), None).await;
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let wrong_audience = refused("shop", signer.token("shop", "web", "kubernetes"), None).await;
    assert_eq!(
        wrong_audience.code(),
        Code::Unauthenticated,
        "{wrong_audience:?}"
    );
    assert!(
        wrong_audience.message().contains("InvalidAudience"),
        "{wrong_audience:?}"
    );
    let forged = TokenSigner::new(ISSUER, "key-1").token("shop", "web", "istio-ca");
    let unknown = refused("shop", forged, None).await;
    assert_eq!(unknown.code(), Code::Unauthenticated, "{unknown:?}");
    assert!(
        unknown.message().contains("no cluster's issuer keys"),
        "{unknown:?}"
    );
    let elsewhere = refused("shop", token.clone(), Some("east")).await;
    assert_eq!(elsewhere.code(), Code::Unauthenticated, "{elsewhere:?}");

    assert_counts(
        &server,
        "shoal_xds_auth_refused_total",
        "reason",
        &[
            ("forbidden", 1.0),
            ("invalid_token", 1.0),
            ("unknown_issuer", 2.0),
        ],
    )
    .await;

    // A new signing key reaches the servers through the ingester (its refresh is minutes;
    // a restart reads it at once).
    drop(ingester);
    let rotated = TokenSigner::new(ISSUER, "key-2");
    cluster.set_service_account_issuer(ISSUER, rotated.jwks());
    let mut ingester = Ingester::start(&nats.url(), &cluster.kubeconfig(), &[]);
    ingester.wait_ready().await;
    let result = eventually::try_eventually(TIMEOUT, Duration::from_millis(200), || async {
        let token = rotated.token("shop", "web", "istio-ca");
        ask_clusters(channel().await.unwrap(), with("shop", token, None))
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gets_its_config_over_tls_with_its_workload_certificate_and_no_other() {
    use shoal_tests::bootstrap::{bootstrap, bootstrap_with, with_xds_tls};
    use shoal_tests::bootstrap::{AdsMode, Node, XdsTlsFiles};
    use shoal_tests::envoy::Envoy;
    use shoal_tests::ports::free_port;

    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mesh root");
    ca.server("shoal").write(dir.path(), "server");
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, &ca.cert_pem).unwrap();
    let mesh = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/mesh");
    let (server, addr) = tls_server(&["--standalone", mesh], dir.path(), Some(&ca_path)).await;

    // The xds-grpc cluster over TLS: the server verified against the mesh root, the proxy
    // presenting `client`, as istio-agent's Envoy reaches istiod's 15012.
    let over_tls = |bootstrap: String, client: Pem, name: &str| {
        let (cert, key) = client.write(dir.path(), name);
        let files = XdsTlsFiles {
            ca: ca_path.clone(),
            cert,
            key,
        };
        with_xds_tls(&bootstrap, &files)
    };
    // The examples' sidecar (demo/client-1) with the certificate of its own identity.
    let own = over_tls(
        bootstrap(&Node::sidecar(), free_port(), &[addr]),
        ca.workload("demo", "client"),
        "client",
    );
    // The gateway's node id (istio-system) with demo's certificate, on a delta stream:
    // refused.
    let other = over_tls(
        bootstrap_with(&Node::gateway(), free_port(), &[addr], AdsMode::Delta),
        ca.workload("demo", "intruder"),
        "intruder",
    );
    let (envoy, intruder) = tokio::join!(Envoy::start(&own), Envoy::start(&other));
    let clusters = |dump: &serde_json::Value| dump.to_string().matches("outbound|").count();
    let got = eventually::try_eventually(TIMEOUT, Duration::from_millis(200), || async {
        let n = clusters(&envoy.config_dump().await);
        (n > 0).then_some(n).ok_or("no outbound cluster yet")
    })
    .await;
    assert!(got.is_ok(), "the sidecar got no config over TLS: {got:?}");
    eventually::eventually(TIMEOUT, Duration::from_millis(200), || async {
        let denied = metric(
            &server,
            "shoal_xds_auth_refused_total",
            "reason=\"forbidden\"",
        )
        .await;
        (denied >= 1.0)
            .then_some(())
            .ok_or("the intruder was not refused yet")
    })
    .await;
    assert_eq!(
        clusters(&intruder.config_dump().await),
        0,
        "the intruder got config"
    );
}

/// Calls `CreateCertificate` on `channel` (as istio-agent does) with a new key's CSR;
/// returns the chain and the key (PEM), or the status.
async fn create_certificate(
    channel: tonic::transport::Channel,
    impersonate: Option<&str>,
) -> Result<(Vec<String>, String), tonic::Status> {
    shoal_tests::pki::create_certificate_as(channel, impersonate, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_signs_only_the_callers_own_identity_with_a_chain_the_mesh_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mesh root");
    ca.server("shoal").write(dir.path(), "server");
    let cacerts = dir.path().join("cacerts");
    ca.write_cacerts(&cacerts);
    // The client CA is a file of its own: rotating the signing CA below must not change
    // which client certificates the TLS port trusts.
    let ca_path = dir.path().join("client-ca.crt");
    std::fs::write(&ca_path, &ca.cert_pem).unwrap();
    let mesh = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/mesh");
    let cacerts_arg = cacerts.to_str().unwrap();
    let (server, addr) = tls_server(
        &["--standalone", mesh, "--ca-dir", cacerts_arg],
        dir.path(),
        Some(&ca_path),
    )
    .await;
    let channel = |client: Option<Pem>| {
        let config = pki::client_config(&ca.cert_pem, client.as_ref());
        async move { pki::tls_channel(addr, config).await.expect("TLS channel") }
    };

    // A workload authenticated by its (bootstrap) certificate gets a new one for itself.
    let (chain, key) = create_certificate(channel(Some(ca.workload("demo", "web"))).await, None)
        .await
        .expect("a certificate");
    assert_eq!(chain.last(), Some(&ca.cert_pem), "the root comes last");
    // The issued certificate is one the mesh trusts: it authenticates an xDS stream.
    let issued = Pem {
        cert: chain[0].clone(),
        key,
    };
    let ask = Ask {
        namespace: "demo",
        service_account: Some("web"),
        ..Ask::default()
    };
    assert!(ask_clusters(channel(Some(issued.clone())).await, ask)
        .await
        .is_ok());
    // Its only identity is the caller's own (the refusal names what it certifies).
    let other = Ask {
        namespace: "istio-system",
        ..Ask::default()
    };
    let denied = ask_clusters(channel(Some(issued)).await, other)
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(
        denied
            .message()
            .ends_with("the caller is spiffe://cluster.local/ns/demo/sa/web"),
        "{denied:?}"
    );

    // Someone else's identity: refused, as are callers without credentials.
    let impersonating = create_certificate(
        channel(Some(ca.workload("demo", "web"))).await,
        Some("spiffe://cluster.local/ns/bank/sa/admin"),
    )
    .await
    .unwrap_err();
    assert_eq!(
        impersonating.code(),
        Code::Unauthenticated,
        "{impersonating:?}"
    );
    let anonymous = create_certificate(channel(None).await, None)
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated, "{anonymous:?}");
    assert_counts(
        &server,
        "shoal_ca_requests_total",
        "result",
        &[
            ("issued", 1.0),
            ("impersonation_not_node_agent", 1.0),
            ("unauthenticated", 1.0),
        ],
    )
    .await;

    // A new CA in the directory signs from then on, without a restart.
    let next = TestCa::new("next root");
    next.write_cacerts(&cacerts);
    let rotated = eventually::try_eventually(TIMEOUT, Duration::from_millis(200), || async {
        let (chain, _) = create_certificate(channel(Some(ca.workload("demo", "web"))).await, None)
            .await
            .map_err(|e| e.to_string())?;
        (chain.last() == Some(&next.cert_pem))
            .then_some(())
            .ok_or_else(|| "still the first CA".to_string())
    })
    .await;
    assert!(rotated.is_ok(), "{rotated:?}");
    assert_eq!(
        metric(&server, "shoal_ca_reloads_total", "result=\"ok\"").await,
        2.0
    );
    // The expiry gauges show the CA in use (the test CAs keep rcgen's default validity,
    // to 4096-01-01).
    for gauge in [
        "shoal_ca_root_cert_expiry_timestamp",
        "shoal_ca_cert_chain_expiry_timestamp",
    ] {
        assert_eq!(
            metric(&server, gauge, "").await,
            67_090_118_400.0,
            "{gauge}"
        );
    }
}

/// `shoal-test-agent`, as istio-agent does, authenticates to the CA with its pod's
/// service-account token and gets a certificate for that identity, whatever its CSR asks for;
/// when the CA refuses (a token checked against another cluster's keys) it exits, printing
/// the gRPC status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_gets_a_certificate_for_its_token_identity_only() {
    use shoal_tests::agent::{Agent, AgentConfig, Credential};
    use shoal_tests::pki::ServerPki;

    let (nats, _cluster, signer, _ingester) = token_issuer_mesh().await;
    let pki = ServerPki::new();
    let tls = free_addr();
    let mut args = vec!["--nats-url".to_string(), nats.url()];
    args.extend(pki.server_args(tls));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ShoalServer::start(&args).await;
    wait_issuer_loaded(&server).await;

    let token = signer.token("shop", "web", "istio-ca");
    let mut config = AgentConfig::new(tls, &pki.ca.cert_pem, Credential::Token(token));
    config.identity = Some("spiffe://cluster.local/ns/shop/sa/admin".into());
    let agent = Agent::start(&config).await;
    assert_eq!(agent.issued(), ["spiffe://cluster.local/ns/shop/sa/web"]);

    config.cluster_id = Some("east".into());
    let (status, log) = Agent::run_to_exit(&config).await;
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("the CA refused the certificate request: status Unauthenticated"),
        "{log}"
    );
    assert_counts(
        &server,
        "shoal_ca_requests_total",
        "result",
        &[("issued", 1.0), ("unauthenticated", 1.0)],
    )
    .await;
}

/// Without --xds-tls-cert, the TLS port serves a certificate issued from the workload CA
/// for --xds-dns-names (istiod's own "DNS certificate"): a proxy trusting only the mesh
/// root (istio-agent with `istio-ca-root-cert`) connects and gets its config, and a new CA
/// in --ca-dir serves a certificate of its own to new connections without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_port_serves_a_certificate_from_the_workload_ca_and_follows_its_rotation() {
    use shoal_tests::ports::free_port;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mesh root");
    let cacerts = dir.path().join("cacerts");
    ca.write_cacerts(&cacerts);
    // Client certificates are verified with a file of their own (the first root), as
    // with --xds-tls-cert.
    let client_ca = dir.path().join("client-ca.crt");
    std::fs::write(&client_ca, &ca.cert_pem).unwrap();
    let mesh = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/mesh");
    let addr = free_addr();
    let tls = addr.to_string();
    let cacerts_arg = cacerts.to_str().unwrap();
    let mut args = vec![
        "--standalone",
        mesh,
        "--ca-dir",
        cacerts_arg,
        "--xds-tls-addr",
        &tls,
    ];

    // Without names, the server refuses to start, naming the flag.
    let admin = format!("127.0.0.1:{}", free_port());
    let mut no_names = args.clone();
    no_names.extend(["--admin-addr", &admin]);
    let (_, text) =
        shoal_tests::shoal::failed_start("shoal-server", &no_names, Duration::from_secs(10)).await;
    assert!(text.contains("--xds-dns-names"), "{text}");

    let client_ca_arg = client_ca.to_str().unwrap();
    args.extend([
        "--xds-dns-names",
        "localhost,shoal-server.istio-system.svc",
        "--xds-client-ca",
        client_ca_arg,
    ]);
    let server = ShoalServer::start(&args).await;
    let trusting = |root: &str| pki::client_config(root, Some(&ca.workload("demo", "web")));

    // Each name verifies; a name not given does not.
    for name in ["localhost", "shoal-server.istio-system.svc"] {
        let channel = pki::tls_channel_to(addr, name, trusting(&ca.cert_pem))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let ask = Ask {
            namespace: "demo",
            service_account: Some("web"),
            ..Ask::default()
        };
        let clusters = ask_clusters(channel, ask).await.expect("config over TLS");
        assert!(clusters > 0, "a sidecar gets clusters");
    }
    let other = pki::tls_channel_to(addr, "istiod.istio-system.svc", trusting(&ca.cert_pem)).await;
    assert!(other.is_err(), "a name not in --xds-dns-names verified");
    let first = pki::server_certificate(addr, trusting(&ca.cert_pem))
        .await
        .expect("TLS handshake");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as f64;
    let expiry = metric(&server, "shoal_xds_serving_cert_expiry_timestamp", "").await;
    assert!(
        (expiry - (now + 24.0 * 3600.0)).abs() < 300.0,
        "the serving certificate lives 24 h: expires {expiry}, now {now}"
    );

    // A new CA: new connections get a certificate from it, without a restart.
    let next = TestCa::new("next root");
    next.write_cacerts(&cacerts);
    let rotated = eventually::try_eventually(TIMEOUT, Duration::from_millis(200), || async {
        pki::server_certificate(addr, trusting(&next.cert_pem))
            .await
            .map_err(|e| format!("{e:#}"))
    })
    .await;
    let rotated = rotated.expect("a certificate from the new CA");
    assert_ne!(rotated, first);
    assert!(
        pki::server_certificate(addr, trusting(&ca.cert_pem))
            .await
            .is_err(),
        "the old root still verifies the port"
    );
    for (labels, n) in [
        ("reason=\"ca_changed\",result=\"ok\"", 1.0),
        ("reason=\"expiring\",result=\"ok\"", 0.0),
    ] {
        let renewals = metric(&server, "shoal_xds_serving_cert_renewals_total", labels).await;
        assert_eq!(renewals, n, "{labels}");
    }
}

// ---------------------------------------------------------------------------------------
// Gateway credentials (SDS) on the ADS stream

/// The gateway credential every test below asks for.
const WEB_CERT: &str = "kubernetes://web-cert";
/// Its private key, as the Secret holds it.
const WEB_KEY: &str = "-----BEGIN PRIVATE KEY-----\nWEB-CERT-KEY\n-----END PRIVATE KEY-----\n";

/// SotW or delta.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Sotw,
    Delta,
}

/// Opens an ADS stream as the ingress gateway of `ask.namespace` (node id
/// `router~...`, labels `istio: ingressgateway`, the ids a real gateway pod's would be) and
/// asks for [`WEB_CERT`] over `mode`: the private keys of the first response's secrets (an
/// empty list when nothing was served), or the status the stream ended with.
async fn ask_gateway_key(
    channel: tonic::transport::Channel,
    ask: &Ask<'_>,
    mode: Mode,
) -> Result<Vec<String>, tonic::Status> {
    let ns = ask.namespace;
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    let mut fields = std::collections::HashMap::new();
    fields.insert("NAMESPACE".to_string(), string(ns));
    let labels = Struct {
        fields: [("istio".to_string(), string("ingressgateway"))].into(),
    };
    fields.insert(
        "LABELS".to_string(),
        Value {
            kind: Some(Kind::StructValue(labels)),
        },
    );
    if let Some(sa) = ask.service_account {
        fields.insert("SERVICE_ACCOUNT".to_string(), string(sa));
    }
    let node = Node {
        id: format!("router~10.1.0.5~istio-ingressgateway-1.{ns}~{ns}.svc.cluster.local"),
        metadata: Some(Struct { fields }),
        ..Node::default()
    };
    let authenticate = |grpc: &mut tonic::metadata::MetadataMap| {
        if let Some(token) = &ask.token {
            grpc.insert(
                "authorization",
                format!("Bearer {token}").parse().expect("header value"),
            );
        }
        if let Some(cluster) = ask.cluster_id {
            grpc.insert("clusterid", cluster.parse().expect("header value"));
        }
    };
    let timeout = |e: tokio::time::error::Elapsed| tonic::Status::deadline_exceeded(e.to_string());
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let anys = match mode {
        Mode::Sotw => {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tx.send(DiscoveryRequest {
                node: Some(node),
                type_url: shoal_proto::SECRET_TYPE.to_string(),
                resource_names: vec![WEB_CERT.to_string()],
                ..DiscoveryRequest::default()
            })
            .await
            .expect("queueing the request");
            let mut grpc = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
            authenticate(grpc.metadata_mut());
            let mut responses = client.stream_aggregated_resources(grpc).await?.into_inner();
            let first = tokio::time::timeout(TIMEOUT, responses.message())
                .await
                .map_err(timeout)??
                .ok_or_else(|| tonic::Status::unknown("stream ended without a response"))?;
            drop(tx);
            first.resources
        }
        Mode::Delta => {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tx.send(DeltaDiscoveryRequest {
                node: Some(node),
                type_url: shoal_proto::SECRET_TYPE.to_string(),
                resource_names_subscribe: vec![WEB_CERT.to_string()],
                ..DeltaDiscoveryRequest::default()
            })
            .await
            .expect("queueing the request");
            let mut grpc = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
            authenticate(grpc.metadata_mut());
            let mut responses = client.delta_aggregated_resources(grpc).await?.into_inner();
            let first = tokio::time::timeout(TIMEOUT, responses.message())
                .await
                .map_err(timeout)??
                .ok_or_else(|| tonic::Status::unknown("stream ended without a response"))?;
            drop(tx);
            first
                .resources
                .into_iter()
                .filter_map(|r| r.resource)
                .collect()
        }
    };
    let mut keys = Vec::new();
    for any in anys {
        let s = Secret::decode(any.value.as_slice()).expect("a Secret");
        let Some(secret::Type::TlsCertificate(tc)) = s.r#type else {
            continue;
        };
        if let Some(Specifier::InlineBytes(key)) = tc.private_key.and_then(|d| d.specifier) {
            keys.push(String::from_utf8_lossy(&key).into_owned());
        }
    }
    Ok(keys)
}

/// Asserts that `ask` gets no key over SotW nor delta (the stream itself is accepted: the
/// caller is a valid identity of the namespace), with and without its SERVICE_ACCOUNT.
async fn assert_no_key<F, Fut>(channel: F, ask: Ask<'_>, who: &str)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = tonic::transport::Channel>,
{
    let without_sa = Ask {
        service_account: None,
        ..ask.clone()
    };
    for ask in [&ask, &without_sa] {
        for mode in [Mode::Sotw, Mode::Delta] {
            let keys = ask_gateway_key(channel().await, ask, mode)
                .await
                .unwrap_or_else(|e| panic!("{who} ({mode:?}): the stream was refused: {e:?}"));
            assert!(
                keys.is_empty(),
                "{who} ({mode:?}, SERVICE_ACCOUNT {:?}) got the gateway's private key",
                ask.service_account
            );
        }
    }
}

/// Waits until `ask` gets the gateway's key over both modes.
async fn wait_key<F, Fut>(channel: F, ask: &Ask<'_>)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = tonic::transport::Channel>,
{
    for mode in [Mode::Sotw, Mode::Delta] {
        let got = eventually::try_eventually(TIMEOUT, Duration::from_millis(200), || async {
            let keys = ask_gateway_key(channel().await, ask, mode)
                .await
                .map_err(|e| format!("{e:?}"))?;
            (keys == [WEB_KEY])
                .then_some(())
                .ok_or_else(|| format!("keys {keys:?}"))
        })
        .await;
        assert!(
            got.is_ok(),
            "the gateway's own identity ({mode:?}): {got:?}"
        );
    }
}

/// The gateway of `istio-system` as a cluster runs it: its pod (service account
/// `ingress`, label `istio: ingressgateway`) behind its Service; beside it prometheus,
/// running as `prometheus`.
fn run_gateway_pods(cluster: &KubeApiServer, ip_prefix: &str) {
    let pod = |name: &str, sa: &str, labels: serde_json::Value, ip: &str| {
        cluster
            .apply(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "istio-system", "labels": labels},
                "spec": {"serviceAccountName": sa, "containers": [{"name": "c", "image": "i"}]},
                "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
            }))
            .unwrap();
    };
    let service = |name: &str, selector: serde_json::Value, pod: &str, ip: &str| {
        cluster
            .apply(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "istio-system"},
                "spec": {"selector": selector,
                         "ports": [{"name": "https", "port": 443, "targetPort": 8443}]},
            }))
            .unwrap();
        cluster
            .apply(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-1"), "namespace": "istio-system",
                             "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "https", "port": 8443}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true},
                               "targetRef": {"kind": "Pod", "name": pod, "namespace": "istio-system"}}],
            }))
            .unwrap();
    };
    let gw_ip = format!("{ip_prefix}.1");
    let prom_ip = format!("{ip_prefix}.2");
    pod(
        "istio-ingressgateway-1",
        "ingress",
        json!({"istio": "ingressgateway"}),
        &gw_ip,
    );
    service(
        "istio-ingressgateway",
        json!({"istio": "ingressgateway"}),
        "istio-ingressgateway-1",
        &gw_ip,
    );
    pod(
        "prometheus-1",
        "prometheus",
        json!({"app": "prometheus"}),
        &prom_ip,
    );
    service(
        "prometheus",
        json!({"app": "prometheus"}),
        "prometheus-1",
        &prom_ip,
    );
}

/// Two clusters whose tokens the servers verify: the config cluster, holding the Gateway,
/// its Secret and its pods, and a remote cluster `east` running a gateway pod with the same
/// namespace and service account. Only the config cluster's gateway identity gets the key:
/// other service accounts of its namespace (with the gateway's node id, labels and
/// SERVICE_ACCOUNT or none), east's identical identity (whatever `clusterid` it sends),
/// and — while two clusters' tokens are accepted — a client certificate of the gateway's
/// identity (the CA could have issued it to east) get none, over SotW and delta; every
/// refusal is counted by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_credentials_go_to_the_gateways_own_token_identity_and_cluster_only() {
    use base64::Engine as _;
    let nats = NatsServer::start().await;
    let config = config_cluster().await;
    let config_signer = TokenSigner::new(ISSUER, "config-key");
    config.set_service_account_issuer(ISSUER, config_signer.jwks());
    let east = KubeApiServer::builder().name("east").start().await;
    let east_signer = TokenSigner::new(ISSUER, "east-key");
    east.set_service_account_issuer(ISSUER, east_signer.jwks());
    east.apply(harness::namespace("istio-system", json!({})))
        .unwrap();
    run_gateway_pods(&config, "10.2.0");
    run_gateway_pods(&east, "10.3.0");
    config.create(istio_crd("Gateway", "gateways")).unwrap();
    config
        .create(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "Gateway",
            "metadata": {"name": "public", "namespace": "istio-system"},
            "spec": {"selector": {"istio": "ingressgateway"}, "servers": [{
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["web.example.com"],
                "tls": {"mode": "SIMPLE", "credentialName": "web-cert"}}]},
        }))
        .unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    config
        .apply(json!({"apiVersion": "v1", "kind": "Secret",
                      "metadata": {"name": "web-cert", "namespace": "istio-system"},
                      "type": "kubernetes.io/tls",
                      "data": {"tls.crt": b64("-----BEGIN CERTIFICATE-----\nWEB\n-----END CERTIFICATE-----\n"),
                               "tls.key": b64(WEB_KEY)}}))
        .unwrap();
    config
        .create(remote_secret("remote-east", &[("east", east.kubeconfig())]))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("credential.key");
    std::fs::write(
        &key_file,
        base64::engine::general_purpose::STANDARD.encode([3u8; 32]),
    )
    .unwrap();
    let key_arg = key_file.to_str().unwrap();
    let mut ingester = Ingester::start(
        &nats.url(),
        &config.kubeconfig(),
        &["--credential-key-file", key_arg],
    );
    ingester.wait_ready().await;

    let ca = TestCa::new("mesh root");
    ca.server("shoal").write(dir.path(), "server");
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, &ca.cert_pem).unwrap();
    let nats_url = nats.url();
    let (server, addr) = tls_server(
        &["--nats-url", &nats_url, "--credential-key-file", key_arg],
        dir.path(),
        Some(&ca_path),
    )
    .await;
    eventually::eventually(TIMEOUT, Duration::from_millis(200), || async {
        let issuers = metric(&server, "shoal_token_issuers", "").await;
        (issuers == 2.0)
            .then_some(())
            .ok_or("both clusters' issuers are not loaded yet")
    })
    .await;
    let channel = |client: Option<Pem>| {
        let config = pki::client_config(&ca.cert_pem, client.as_ref());
        move || {
            let config = config.clone();
            async move { pki::tls_channel(addr, config).await.expect("TLS channel") }
        }
    };
    let token_of = |signer: &TokenSigner, sa: &'static str, cluster_id| Ask {
        namespace: "istio-system",
        service_account: Some(sa),
        token: Some(signer.token("istio-system", sa, "istio-ca")),
        cluster_id,
    };

    // The gateway's own token: its key, over SotW and delta, with or without its
    // SERVICE_ACCOUNT (once the bus has the Secret, the Gateway and the pods).
    let gateway = token_of(&config_signer, "ingress", Some("Kubernetes"));
    wait_key(channel(None), &gateway).await;
    wait_key(
        channel(None),
        &Ask {
            service_account: None,
            cluster_id: None,
            ..token_of(&config_signer, "ingress", None)
        },
    )
    .await;

    let before = denials(&server).await;
    // Other service accounts of the gateway's namespace, on the gateway's node id.
    for sa in ["default", "prometheus", "some-app"] {
        let ask = token_of(&config_signer, sa, Some("Kubernetes"));
        assert_no_key(channel(None), ask, &format!("istio-system/{sa}")).await;
    }
    // East's gateway: the same namespace and service account, another cluster.
    for cluster_id in [Some("east"), None] {
        let ask = token_of(&east_signer, "ingress", cluster_id);
        assert_no_key(channel(None), ask, "east's istio-system/ingress").await;
    }
    // A certificate of the gateway's identity names no cluster; with two clusters' tokens
    // accepted, it proves none.
    let certificate = Ask {
        namespace: "istio-system",
        service_account: Some("ingress"),
        ..Ask::default()
    };
    assert_no_key(
        channel(Some(ca.workload("istio-system", "ingress"))),
        certificate,
        "a certificate of istio-system/ingress",
    )
    .await;

    // Each refused stream counted once, by reason: 3 accounts x 2 modes x 2 metadata
    // variants; east's token 2 headers x 4; the certificate 4.
    assert_denials(
        &server,
        &before,
        &[
            ("not_gateway_identity", 12.0),
            ("other_cluster", 8.0),
            ("unproven_cluster", 4.0),
            ("unauthenticated", 0.0),
        ],
    )
    .await;
    assert_eq!(
        metric(
            &server,
            "shoal_xds_auth_refused_total",
            "reason=\"forbidden\""
        )
        .await,
        0.0,
        "the streams themselves are authorized"
    );
    drop(ingester);
}

/// The same with client certificates, in standalone mode (no token accepted, so a
/// certificate is the one cluster's): only the certificate of the gateway's pods' service
/// account gets the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_credentials_go_to_the_gateways_own_certificate_identity_only() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let mesh = tempfile::tempdir().unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let pod = |name: &str, sa: &str, labels: &str, ip: &str, svc: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: istio-system, labels: {labels}}}\n\
             spec: {{serviceAccountName: {sa}, containers: [{{name: c, image: i}}]}}\n\
             status: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: istio-system}}\n\
             spec: {{selector: {labels}, ports: [{{name: https, port: 443, targetPort: 8443}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {svc}-1, namespace: istio-system, labels: {{kubernetes.io/service-name: {svc}}}}}\n\
             addressType: IPv4\nports: [{{name: https, port: 8443}}]\n\
             endpoints: [{{addresses: [\"{ip}\"], conditions: {{ready: true}}, targetRef: {{kind: Pod, name: {name}, namespace: istio-system}}}}]\n---\n"
        )
    };
    let manifests = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: istio-system}}\n---\n\
         apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: public, namespace: istio-system}}\n\
         spec: {{selector: {{istio: ingressgateway}}, servers: [{{port: {{number: 443, name: https, protocol: HTTPS}}, \
         hosts: [web.example.com], tls: {{mode: SIMPLE, credentialName: web-cert}}}}]}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: web-cert, namespace: istio-system}}\n\
         type: kubernetes.io/tls\ndata: {{tls.crt: {crt}, tls.key: {key}}}\n---\n{gw}{prom}",
        crt = b64("-----BEGIN CERTIFICATE-----\nWEB\n-----END CERTIFICATE-----\n"),
        key = b64(WEB_KEY),
        gw = pod("istio-ingressgateway-1", "ingress", "{istio: ingressgateway}", "10.2.0.1", "istio-ingressgateway"),
        prom = pod("prometheus-1", "prometheus", "{app: prometheus}", "10.2.0.2", "prometheus"),
    );
    std::fs::write(mesh.path().join("gateway.yaml"), manifests).unwrap();
    let ca = TestCa::new("mesh root");
    ca.server("shoal").write(dir.path(), "server");
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, &ca.cert_pem).unwrap();
    let mesh_arg = mesh.path().to_str().unwrap();
    let (server, addr) = tls_server(&["--standalone", mesh_arg], dir.path(), Some(&ca_path)).await;
    let channel = |ns: &str, sa: &str| {
        let config = pki::client_config(&ca.cert_pem, Some(&ca.workload(ns, sa)));
        move || {
            let config = config.clone();
            async move { pki::tls_channel(addr, config).await.expect("TLS channel") }
        }
    };
    let ask = |sa| Ask {
        namespace: "istio-system",
        service_account: Some(sa),
        ..Ask::default()
    };
    wait_key(channel("istio-system", "ingress"), &ask("ingress")).await;
    let before = denials(&server).await;
    for sa in ["default", "prometheus", "some-app"] {
        assert_no_key(
            channel("istio-system", sa),
            ask(sa),
            &format!("istio-system/{sa}"),
        )
        .await;
    }
    assert_denials(
        &server,
        &before,
        &[("not_gateway_identity", 12.0), ("unproven_cluster", 0.0)],
    )
    .await;
}

/// Every `shoal_sds_denied_total` series, by reason.
async fn denials(server: &ShoalServer) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for reason in [
        "unauthenticated",
        "not_gateway",
        "unknown_name",
        "other_namespace",
        "unproven_cluster",
        "other_cluster",
        "not_gateway_identity",
    ] {
        let series = format!("reason=\"{reason}\"");
        out.insert(
            reason.to_string(),
            metric(server, "shoal_sds_denied_total", &series).await,
        );
    }
    out
}

/// Asserts how much each `shoal_sds_denied_total{reason}` grew since `before`.
async fn assert_denials(
    server: &ShoalServer,
    before: &std::collections::BTreeMap<String, f64>,
    grew: &[(&str, f64)],
) {
    let now = denials(server).await;
    for (reason, n) in grew {
        assert_eq!(
            now[*reason] - before[*reason],
            *n,
            "shoal_sds_denied_total{{reason=\"{reason}\"}}: {before:?} -> {now:?}"
        );
    }
}
