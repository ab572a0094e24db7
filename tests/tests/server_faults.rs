//! The xDS server's fault matrix (docs/reliability.md, "Server faults"), each against the
//! real processes:
//!
//! - `nats_outage`: nats-server killed for 60 s and restarted on the same port with its
//!   store: a real Envoy keeps its config, its stream and its traffic; the server stays
//!   ready on its last state and reports `shoal_bus_connected 0`; on return it resyncs
//!   without a single push; a change made during a second outage as long reaches Envoy within 2 s
//!   of NATS returning.
//! - `fresh_install_waits_for_expected_fleets`: with `--expect-fleets`, a server on an
//!   empty bus is not ready and sends a connected Envoy nothing until the fleet's ingester
//!   has synced; `--sync-timeout` makes it ready anyway, with `shoal_sync_timed_out 1`.
//! - the replica kill with many delta proxies is in the benchmark's crate
//!   (bench/tests/replica_kill.rs), whose load generator it drives.
//! - `sigterm_drains_gradually`: SIGTERM makes `/ready` fail at once and closes the proxy
//!   connections spread over `--drain-duration`.
//!
//! Needs the binaries: `cargo build --workspace --bins` first (scripts/test.sh does).
#![forbid(unsafe_code)]

use shoal_proto::pb::envoy::config::core::v3::Node as XdsNode;
use shoal_proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use shoal_proto::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use shoal_proto::XdsType;
use shoal_tests::bootstrap::{bootstrap_with, AdsMode, Node};
use shoal_tests::http::Request;
use shoal_tests::mesh::{SwitchTarget, TestMesh};
use shoal_tests::ports::free_port;
use shoal_tests::{eventually, Envoy, NatsServer, ShoalIngester, ShoalServer};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

const POLL: Duration = Duration::from_millis(50);
/// Time for a fresh control plane and Envoy to converge (startup, first pushes, warming).
const CONVERGE: Duration = Duration::from_secs(20);
/// The acceptance bound: a change made while NATS was down reaches the proxies within this
/// of NATS returning.
const AFTER_RETURN: Duration = Duration::from_secs(2);

/// The NATS outage of the first phase, in seconds (`SHOAL_TEST_NATS_OUTAGE_SECS` shortens
/// it for local iteration; CI runs the full minute).
fn outage() -> Duration {
    let secs = std::env::var("SHOAL_TEST_NATS_OUTAGE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

/// A request to the gateway, for the host the VirtualService (`hosts: ["*"]`) serves.
fn gw(path: &str) -> Request {
    Request::get(path).host("shop.example")
}

/// Which backend answered `req`.
async fn backend_of(addr: SocketAddr, req: &Request) -> anyhow::Result<String> {
    let r = req.send(addr).await?;
    anyhow::ensure!(
        r.status == 200,
        "{} {}: status {} body {:?}",
        req.method,
        req.path,
        r.status,
        r.text()
    );
    Ok(r.json()?["backend"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

async fn expect_backend(addr: SocketAddr, req: &Request, want: &str, within: Duration) {
    eventually(within, POLL, || async {
        let got = backend_of(addr, req).await?;
        anyhow::ensure!(
            got == want,
            "{} answered by {got:?}, want {want:?}",
            req.path
        );
        Ok(())
    })
    .await;
}

/// The sum of every sample of metric `name` (all label sets) on a server.
async fn metric(server: &ShoalServer, name: &str) -> f64 {
    let text = server
        .admin_get("/metrics")
        .await
        .expect("server /metrics")
        .text();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the server has sent no push for `quiet`; returns the push count.
async fn quiet_pushes(server: &ShoalServer, quiet: Duration) -> f64 {
    let mut last = metric(server, "shoal_xds_pushes_total").await;
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = metric(server, "shoal_xds_pushes_total").await;
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return now;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_outage() {
    let mesh = TestMesh::start().await;
    let mut nats = NatsServer::restartable().await;
    let mut ingester = ShoalIngester::for_dir(&nats.url(), mesh.dir());
    let mut server = ShoalServer::with_nats(&nats.url()).await;
    let gateway = Envoy::start(&bootstrap_with(
        &Node::gateway(),
        free_port(),
        &[server.xds_addr()],
        AdsMode::Delta,
    ))
    .await;
    let gw_addr = SocketAddr::from(([127, 0, 0, 1], mesh.gateway_port));
    let switch = gw("/switch");
    expect_backend(gw_addr, &switch, SwitchTarget::Api.backend(), CONVERGE).await;
    let pushes0 = quiet_pushes(&server, Duration::from_secs(1)).await;
    let closed0 = metric(&server, "shoal_xds_streams_closed_total").await;
    let restarts0 = metric(&server, "shoal_bus_watch_restarts_total").await;

    // Phase 1: NATS gone for a minute, nothing changes.
    nats.kill().await;
    let down = Instant::now();
    eventually(Duration::from_secs(10), POLL, || async {
        let connected = metric(&server, "shoal_bus_connected").await;
        anyhow::ensure!(connected == 0.0, "shoal_bus_connected is {connected}");
        Ok(())
    })
    .await;
    let ready = server.admin_get("/ready").await.expect("/ready");
    assert_eq!(
        ready.status,
        200,
        "ready on the last state: {}",
        ready.text()
    );
    assert!(ready.text().contains("degraded"), "{}", ready.text());
    while down.elapsed() < outage() {
        assert_eq!(
            backend_of(gw_addr, &switch)
                .await
                .expect("traffic during the outage"),
            SwitchTarget::Api.backend()
        );
        assert_eq!(
            gateway.stat("control_plane.connected_state").await,
            1,
            "Envoy's ADS stream stays up"
        );
        tokio::time::sleep(Duration::from_secs(5).min(outage())).await;
    }
    let back = Instant::now();
    nats.restart().await;
    eventually(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async {
            let connected = metric(&server, "shoal_bus_connected").await;
            let restarts = metric(&server, "shoal_bus_watch_restarts_total").await;
            anyhow::ensure!(
                connected == 1.0 && restarts >= restarts0 + 4.0,
                "connected {connected}, watch restarts {restarts} (before: {restarts0})"
            );
            Ok(())
        },
    )
    .await;
    let resynced = back.elapsed();
    let pushes1 = quiet_pushes(&server, Duration::from_secs(2)).await;
    eprintln!(
        "MEASURED nats outage of {:?}: bus reconnected and every bucket re-watched {:.2} s after \
         nats-server was restarted; pushes after the resync: {}",
        outage(),
        resynced.as_secs_f64(),
        pushes1 - pushes0
    );
    assert_eq!(pushes1, pushes0, "nothing changed: nothing pushed");
    assert_eq!(
        metric(&server, "shoal_xds_streams_closed_total").await,
        closed0,
        "no stream was closed"
    );

    // Phase 2: a change made while NATS is down reaches Envoy within 2 s of its return.
    nats.kill().await;
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    mesh.write_virtual_service(SwitchTarget::Httpbin);
    tokio::time::sleep(outage().saturating_sub(down.elapsed())).await;
    let back = Instant::now();
    nats.restart().await;
    let mut converged = None;
    while back.elapsed() < CONVERGE {
        if backend_of(gw_addr, &switch).await.ok().as_deref()
            == Some(SwitchTarget::Httpbin.backend())
        {
            converged = Some(back.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let converged = converged.expect("the change made during the outage never arrived");
    eprintln!(
        "MEASURED change made during a NATS outage of {:?} reached Envoy {:.2} s after \
         nats-server was restarted",
        outage(),
        converged.as_secs_f64()
    );
    assert!(
        converged <= AFTER_RETURN,
        "converged {converged:?} after NATS returned, want at most {AFTER_RETURN:?}"
    );
    assert_eq!(
        metric(&server, "shoal_xds_streams_closed_total").await,
        closed0,
        "no stream was closed"
    );
    ingester.process().assert_running();
    server.process().assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_install_waits_for_expected_fleets() {
    let mesh = TestMesh::start().await;
    let nats = NatsServer::start().await;
    let url = nats.url();
    let started = Instant::now();
    let mut server = ShoalServer::spawn(&[
        "--nats-url",
        &url,
        "--expect-fleets",
        "default",
        "--sync-timeout",
        "0s",
    ]);
    let mut timed = ShoalServer::spawn(&[
        "--nats-url",
        &url,
        "--expect-fleets",
        "default,absent",
        "--sync-timeout",
        "4s",
    ]);
    let gateway = Envoy::start(&bootstrap_with(
        &Node::gateway(),
        free_port(),
        &[server.xds_addr()],
        AdsMode::Delta,
    ))
    .await;

    // No ingester yet: not ready, nothing sent to the connected gateway.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ready = eventually(Duration::from_secs(10), POLL, || async {
        server.admin_get("/ready").await
    })
    .await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert!(ready.text().contains("expected fleet"), "{}", ready.text());
    assert_eq!(metric(&server, "shoal_fleets_waiting").await, 1.0);
    assert_eq!(metric(&server, "shoal_xds_pushes_total").await, 0.0);
    let listeners = gateway.listeners().await.expect("envoy listeners");
    assert!(
        listeners.iter().all(|l| !l.starts_with("0.0.0.0_")),
        "the gateway got listeners from an unready server: {listeners:?}"
    );

    // The timeout: ready without the fleets, and says so.
    timed.wait_ready().await;
    let timed_after = started.elapsed();
    assert!(timed_after >= Duration::from_secs(4), "{timed_after:?}");
    assert_eq!(metric(&timed, "shoal_sync_timed_out").await, 1.0);

    // The fleet syncs: ready, and the first snapshot is the whole mesh.
    let ingester_start = Instant::now();
    let mut ingester = ShoalIngester::for_dir(&url, mesh.dir());
    server.wait_ready().await;
    let ready_after = ingester_start.elapsed();
    assert_eq!(metric(&server, "shoal_sync_timed_out").await, 0.0);
    assert_eq!(metric(&server, "shoal_fleets_waiting").await, 0.0);
    let configz: serde_json::Value = server
        .admin_get("/debug/configz")
        .await
        .expect("configz")
        .json()
        .expect("configz JSON");
    assert_eq!(configz["snapshot"], 1, "{configz}");
    let services = configz["services"].as_array().map_or(0, Vec::len);
    assert!(
        services >= 4,
        "the first snapshot has the whole mesh: {configz}"
    );
    let gw_addr = SocketAddr::from(([127, 0, 0, 1], mesh.gateway_port));
    expect_backend(
        gw_addr,
        &gw("/switch"),
        SwitchTarget::Api.backend(),
        CONVERGE,
    )
    .await;
    eprintln!(
        "MEASURED fresh install: --sync-timeout 4s server ready {:.2} s after start; the \
         expecting server ready {:.2} s after the ingester started, first snapshot with {services} services",
        timed_after.as_secs_f64(),
        ready_after.as_secs_f64()
    );
    ingester.process().assert_running();
}

/// A sidecar node the server accepts (namespace `ns`).
fn xds_node(i: usize) -> XdsNode {
    XdsNode {
        id: format!(
            "sidecar~10.0.0.{}~p{i}.ns~ns.svc.cluster.local",
            i % 250 + 1
        ),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_gradually() {
    const STREAMS: usize = 30;
    const DRAIN: Duration = Duration::from_secs(4);
    let dir = tempfile::tempdir().expect("manifest dir");
    let mut server = ShoalServer::start(&[
        "--standalone",
        dir.path().to_str().expect("UTF-8 path"),
        "--drain-duration",
        "4s",
    ])
    .await;
    let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
    let mut requests = Vec::new();
    for i in 0..STREAMS {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", server.xds_addr()))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect to the xDS port");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(DeltaDiscoveryRequest {
            node: Some(xds_node(i)),
            type_url: XdsType::Cluster.type_url().to_string(),
            ..Default::default()
        })
        .expect("queue the request");
        requests.push(tx);
        let ended_tx = ended_tx.clone();
        tokio::spawn(async move {
            let mut client = AggregatedDiscoveryServiceClient::new(channel);
            let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
            if let Ok(resp) = client.delta_aggregated_resources(stream).await {
                let mut responses = resp.into_inner();
                while let Ok(Some(_)) = responses.message().await {}
            }
            let _ = ended_tx.send(Instant::now());
        });
    }
    eventually(Duration::from_secs(20), POLL, || async {
        let n = metric(&server, "shoal_xds_connections").await;
        anyhow::ensure!(n == STREAMS as f64, "{n} of {STREAMS} proxies connected");
        Ok(())
    })
    .await;

    let pid = server.process().id().expect("server running");
    let term = Instant::now();
    let status = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .expect("kill -TERM");
    assert!(status.success());
    let ready = eventually(
        Duration::from_secs(2),
        Duration::from_millis(20),
        || async {
            let r = server.admin_get("/ready").await?;
            anyhow::ensure!(r.status == 503, "/ready still {}", r.status);
            Ok(r)
        },
    )
    .await;
    assert!(ready.text().contains("draining"), "{}", ready.text());

    let mut at = Vec::new();
    while at.len() < STREAMS {
        let t = tokio::time::timeout(DRAIN + Duration::from_secs(10), ended.recv())
            .await
            .expect("every stream ends within the drain period and grace")
            .expect("stream tasks alive");
        at.push(t - term);
    }
    drop(requests);
    at.sort();
    let (first, last) = (at[0], at[STREAMS - 1]);
    let first_half = at.iter().filter(|d| **d < DRAIN / 2).count();
    eprintln!(
        "MEASURED SIGTERM drain over {DRAIN:?}: {STREAMS} streams closed from {:.2} s to {:.2} s \
         after SIGTERM, {first_half} in the first half",
        first.as_secs_f64(),
        last.as_secs_f64()
    );
    assert!(last <= DRAIN + Duration::from_secs(6), "{last:?}");
    assert!(
        last - first >= DRAIN / 2,
        "closes are spread over the drain period, not at once: {at:?}"
    );
    assert!(
        (STREAMS / 5..=STREAMS * 4 / 5).contains(&first_half),
        "about half close in each half of the drain period: {at:?}"
    );
    let exited = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if server.process().exited().is_some() {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert!(exited.is_ok(), "the server exits after the drain");
}
