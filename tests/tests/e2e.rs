//! End to end: manifests on disk → shoal → real Envoys → real HTTP backends.
//!
//! Two control planes run the same scenario (see `support/mesh.rs` for the mesh):
//! - `through_nats_with_two_replicas`: nats-server, one `shoal-ingester` following the
//!   manifest directory, two `shoal-server` replicas; the Envoys' bootstraps list both
//!   replicas. It ends with a failover: the gateway's replica is killed.
//! - `delta_through_nats_with_two_replicas`: the same with Envoys on delta ADS
//!   (`DELTA_GRPC`); at failover the gateway must resume on the other replica without being
//!   sent any resource it already holds.
//! - `standalone`: one `shoal-server --standalone DIR`.
//!
//! Needs the binaries: `cargo build --workspace --bins` first (scripts/test.sh does).
#![forbid(unsafe_code)]

use serde_json::Value;
use shoal_tests::bootstrap::{bootstrap_with, AdsMode, Node};
use shoal_tests::http::{Request, Response};
use shoal_tests::mesh::{SwitchTarget, TestMesh};
use shoal_tests::ports::free_port;
use shoal_tests::{eventually, Envoy, NatsServer, ShoalIngester, ShoalServer};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Time for a fresh control plane and Envoy to converge (startup, first pushes, warming).
const CONVERGE: Duration = Duration::from_secs(20);
/// A manifest change must reach Envoy within this (the ingester polls every 250 ms, the
/// server debounces 100 ms).
const PROPAGATE: Duration = Duration::from_secs(2);
/// After losing its replica, Envoy reconnects to another (0.1-1 s backoff, see the
/// bootstrap) and must receive changes again within this.
const FAILOVER: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_nats_with_two_replicas() {
    let mut mesh = TestMesh::start().await;
    let mut cp = ControlPlane::nats(&mesh).await;
    let proxies = Proxies::start(&mesh, &cp.xds_addrs(), AdsMode::Sotw).await;
    static_routing(&mesh, &proxies).await;
    dynamic_changes(&mut mesh, &proxies).await;
    failover(&mesh, &proxies, &mut cp, AdsMode::Sotw).await;
    proxies.assert_nothing_rejected().await;
    cp.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_through_nats_with_two_replicas() {
    let mut mesh = TestMesh::start().await;
    let mut cp = ControlPlane::nats(&mesh).await;
    let proxies = Proxies::start(&mesh, &cp.xds_addrs(), AdsMode::Delta).await;
    static_routing(&mesh, &proxies).await;
    dynamic_changes(&mut mesh, &proxies).await;
    failover(&mesh, &proxies, &mut cp, AdsMode::Delta).await;
    proxies.assert_nothing_rejected().await;
    cp.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone() {
    let mut mesh = TestMesh::start().await;
    let mut cp = ControlPlane::standalone(&mesh).await;
    let proxies = Proxies::start(&mesh, &cp.xds_addrs(), AdsMode::Sotw).await;
    static_routing(&mesh, &proxies).await;
    dynamic_changes(&mut mesh, &proxies).await;
    proxies.assert_nothing_rejected().await;
    cp.assert_running();
}

/// The control plane under test: NATS, an ingester and two replicas, or one standalone
/// server.
struct ControlPlane {
    // Held for its lifetime: dropping it kills the server.
    _nats: Option<NatsServer>,
    ingester: Option<ShoalIngester>,
    replicas: Vec<ShoalServer>,
}

impl ControlPlane {
    async fn nats(mesh: &TestMesh) -> ControlPlane {
        let nats = NatsServer::start().await;
        let ingester = ShoalIngester::for_dir(&nats.url(), mesh.dir());
        let url = nats.url();
        let (a, b) = tokio::join!(ShoalServer::with_nats(&url), ShoalServer::with_nats(&url));
        ControlPlane {
            _nats: Some(nats),
            ingester: Some(ingester),
            replicas: vec![a, b],
        }
    }

    async fn standalone(mesh: &TestMesh) -> ControlPlane {
        ControlPlane {
            _nats: None,
            ingester: None,
            replicas: vec![ShoalServer::standalone(mesh.dir()).await],
        }
    }

    fn xds_addrs(&self) -> Vec<SocketAddr> {
        self.replicas.iter().map(ShoalServer::xds_addr).collect()
    }

    /// Every process that should still run did not crash.
    fn assert_running(&mut self) {
        if let Some(ingester) = &mut self.ingester {
            ingester.process().assert_running();
        }
        // Killed replicas (no pid any more) are expected to be gone; the others must not be.
        for r in self.replicas.iter_mut() {
            if r.process().id().is_some() {
                r.process().assert_running();
            }
        }
    }
}

/// The two Envoys and where they take traffic.
struct Proxies {
    gateway: Envoy,
    sidecar: Envoy,
    /// The gateway listener (`0.0.0.0_<gateway_port>`), reached on 127.0.0.1.
    gateway_addr: SocketAddr,
    /// The sidecar's egress listener, `127.0.0.1:<egress_port>`.
    egress_addr: SocketAddr,
}

impl Proxies {
    async fn start(mesh: &TestMesh, xds: &[SocketAddr], mode: AdsMode) -> Proxies {
        let gateway_bootstrap = bootstrap_with(&Node::gateway(), free_port(), xds, mode);
        let sidecar_bootstrap = bootstrap_with(&Node::sidecar(), free_port(), xds, mode);
        let (gateway, sidecar) = tokio::join!(
            Envoy::start(&gateway_bootstrap),
            Envoy::start(&sidecar_bootstrap),
        );
        let proxies = Proxies {
            gateway,
            sidecar,
            gateway_addr: SocketAddr::from(([127, 0, 0, 1], mesh.gateway_port)),
            egress_addr: SocketAddr::from(([127, 0, 0, 1], mesh.egress_port)),
        };
        let gateway_listener = format!("0.0.0.0_{}", mesh.gateway_port);
        let egress_listener = format!("127.0.0.1_{}", mesh.egress_port);
        tokio::join!(
            proxies.gateway.wait_listener(&gateway_listener),
            proxies.sidecar.wait_listener(&egress_listener),
        );
        proxies
    }

    async fn assert_nothing_rejected(&self) {
        for (name, envoy) in [("gateway", &self.gateway), ("sidecar", &self.sidecar)] {
            let rejected = envoy.stat_sum("update_rejected").await;
            assert_eq!(
                rejected,
                0,
                "the {name} Envoy rejected {rejected} xDS updates; its stats:\n{}",
                envoy
                    .admin_get("/stats?filter=update_rejected")
                    .await
                    .unwrap_or_default()
            );
        }
    }
}

/// A request to the gateway, for the host the VirtualService (`hosts: ["*"]`) serves.
fn gw(path: &str) -> Request {
    Request::get(path).host("shop.example")
}

/// Sends a request and returns which backend answered, with its whole answer.
async fn backend_of(addr: SocketAddr, req: &Request) -> anyhow::Result<(String, Value)> {
    let r = req.send(addr).await?;
    if r.status != 200 {
        anyhow::bail!(
            "{} {}: status {} (flags {:?}) body {:?}",
            req.method,
            req.path,
            r.status,
            r.header("x-envoy-response-flags"),
            r.text()
        );
    }
    let body = r.json()?;
    let backend = body["backend"].as_str().unwrap_or_default().to_string();
    Ok((backend, body))
}

/// Waits until `req` to `addr` is answered by backend `want`; returns the answer.
async fn expect_backend(addr: SocketAddr, req: Request, want: &str, within: Duration) -> Value {
    eventually(within, POLL, || async {
        let (got, body) = backend_of(addr, &req).await?;
        if got == want {
            Ok(body)
        } else {
            Err(anyhow::anyhow!(
                "{} {} (Host {:?}) answered by {got:?}, want {want:?}",
                req.method,
                req.path,
                req.host
            ))
        }
    })
    .await
}

/// Everything the initial manifests promise, through both Envoys.
async fn static_routing(mesh: &TestMesh, p: &Proxies) {
    let g = p.gateway_addr;

    // Prefix routing; the first answer also proves the gateway has converged.
    let body = expect_backend(g, gw("/api/items"), "api-v1", CONVERGE).await;
    assert_eq!(body["path"], "/api/items");

    // Header routing, and the default route.
    expect_backend(g, gw("/").header("x-canary", "true"), "web-v2", CONVERGE).await;
    expect_backend(g, gw("/"), "web-v1", CONVERGE).await;

    // Weighted routing: 50/50 between the subsets.
    expect_backend(g, gw("/weighted"), "web-v1", CONVERGE).await;
    expect_backend(g, gw("/weighted"), "web-v2", CONVERGE).await;
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    const N: u32 = 200;
    for i in 0..N {
        let (backend, _) = backend_of(g, &gw(&format!("/weighted?i={i}")))
            .await
            .expect("weighted request");
        *counts.entry(backend).or_default() += 1;
    }
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["web-v1", "web-v2"],
        "{counts:?}"
    );
    for (backend, n) in &counts {
        assert!(
            (N / 4..=N * 3 / 4).contains(n),
            "{backend} got {n} of {N} weighted requests: {counts:?}"
        );
    }

    // URI rewrite: the backend sees the rewritten prefix, the rest of the path and query kept.
    let body = expect_backend(g, gw("/old/page?q=1"), "web-v1", CONVERGE).await;
    assert_eq!(body["path"], "/new/page?q=1");

    // Redirect: answered by Envoy itself.
    let r: Response = gw("/moved-away").send(g).await.expect("redirect request");
    assert_eq!(r.status, 301, "redirect status; body {:?}", r.text());
    assert_eq!(
        r.header("location"),
        Some("http://other.example/elsewhere"),
        "{:?}",
        r.headers
    );

    // Timeout and retries: in the route config, and retries happen.
    slow_route_config(&p.gateway, mesh.gateway_port).await;
    let before = mesh.backend("web-v1").requests();
    let r = gw("/slow").header("x-status", "503").send(g).await.unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        mesh.backend("web-v1").requests() - before,
        3,
        "attempts: 2 means 1 try + 2 retries"
    );

    // ServiceEntry with a STATIC endpoint, and one whose workloadSelector picks a
    // WorkloadEntry.
    let body = expect_backend(g, gw("/httpbin/get"), "httpbin", CONVERGE).await;
    assert_eq!(body["path"], "/httpbin/get");
    expect_backend(g, gw("/vm/status"), "vm", CONVERGE).await;
    expect_backend(g, gw("/switch"), SwitchTarget::Api.backend(), CONVERGE).await;

    // The sidecar's egress listener routes by Host header, by every name Istio accepts.
    let e = p.egress_addr;
    let port = mesh.egress_port;
    for host in [
        "api",
        "api.demo",
        &format!("api.demo.svc.cluster.local:{port}"),
    ] {
        let body = expect_backend(
            e,
            Request::get("/from-client").host(host),
            "api-v1",
            CONVERGE,
        )
        .await;
        assert_eq!(body["path"], "/from-client");
    }
    // GAMMA: an HTTPRoute whose parent is the Service web steers the sidecar's requests
    // for web under /gamma (whole segments) to api; the rest still reach web.
    let body = expect_backend(e, Request::get("/gamma/x").host("web"), "api-v1", CONVERGE).await;
    assert_eq!(body["path"], "/gamma/x");
    let req = Request::get("/gammax").host("web");
    let (backend, _) = eventually(CONVERGE, POLL, || backend_of(e, &req)).await;
    assert!(backend.starts_with("web-"), "/gammax went to {backend}");
    for host in ["web", &format!("web.demo:{port}")] {
        // The GAMMA route's catch-all: web's endpoints, v1 and v2 alike.
        let req = Request::get("/").host(host);
        let (backend, _) = eventually(CONVERGE, POLL, || backend_of(e, &req)).await;
        assert!(
            ["web-v1", "web-v2"].contains(&backend.as_str()),
            "{backend}"
        );
    }
}

/// The `slow` route of `http.<port>` has the VirtualService's timeout and retries.
async fn slow_route_config(gateway: &Envoy, port: u16) {
    let dump = gateway.config_dump().await;
    let route_name = format!("http.{port}");
    let routes: Vec<&Value> = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["dynamic_route_configs"].as_array().into_iter().flatten())
        .map(|rc| &rc["route_config"])
        .filter(|rc| rc["name"] == route_name.as_str())
        .flat_map(|rc| rc["virtual_hosts"].as_array().into_iter().flatten())
        .flat_map(|vh| vh["routes"].as_array().into_iter().flatten())
        .filter(|r| r["match"]["prefix"] == "/slow" || r["name"] == "slow")
        .collect();
    let route = routes.first().unwrap_or_else(|| {
        panic!(
            "no /slow route in {route_name}; routes: {}",
            dump_routes(&dump)
        )
    });
    let action = &route["route"];
    assert_eq!(action["timeout"], "3s", "{route}");
    let retry = &action["retry_policy"];
    assert_eq!(retry["num_retries"], 2, "{route}");
    assert_eq!(retry["per_try_timeout"], "1s", "{route}");
    assert!(
        retry["retry_on"]
            .as_str()
            .unwrap_or_default()
            .contains("5xx"),
        "{route}"
    );
}

fn dump_routes(dump: &Value) -> String {
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["@type"]
                .as_str()
                .unwrap_or_default()
                .ends_with("RoutesConfigDump")
        })
        .map(|c| serde_json::to_string_pretty(c).unwrap_or_default())
        .collect()
}

/// Changes to the manifest files reach the Envoys within [`PROPAGATE`].
async fn dynamic_changes(mesh: &mut TestMesh, p: &Proxies) {
    // A new endpoint (a new backend in the EndpointSlice) receives traffic.
    mesh.add_web_v1b().await;
    expect_backend(p.gateway_addr, gw("/"), "web-v1b", PROPAGATE).await;

    // A VirtualService edit changes where a prefix goes.
    mesh.write_virtual_service(SwitchTarget::Httpbin);
    expect_backend(
        p.gateway_addr,
        gw("/switch"),
        SwitchTarget::Httpbin.backend(),
        PROPAGATE,
    )
    .await;
}

/// Kills the replica the gateway is connected to: traffic goes on, and changes reach the
/// gateway again through the other replica.
async fn failover(mesh: &TestMesh, p: &Proxies, cp: &mut ControlPlane, mode: AdsMode) {
    let replicas = &mut cp.replicas;
    assert_eq!(replicas.len(), 2, "failover needs two replicas");
    let gateway_id = Node::gateway().id;
    let serving = eventually(CONVERGE, POLL, || async {
        let mut serving = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            if r.serves(&gateway_id).await? {
                serving.push(i);
            }
        }
        match serving[..] {
            [i] => Ok(i),
            _ => Err(anyhow::anyhow!(
                "the gateway should show in exactly one replica's /debug/syncz, shows in {serving:?}"
            )),
        }
    })
    .await;
    let other = 1 - serving;
    replicas[serving].kill().await;

    // Envoy keeps its config: traffic flows while it reconnects.
    for i in 0..20 {
        let (backend, _) = backend_of(p.gateway_addr, &gw(&format!("/?during-failover={i}")))
            .await
            .expect("traffic during failover");
        assert!(
            ["web-v1", "web-v1b"].contains(&backend.as_str()),
            "{backend}"
        );
    }
    let (backend, _) = backend_of(p.egress_addr, &Request::get("/").host("api"))
        .await
        .expect("sidecar traffic during failover");
    assert_eq!(backend, "api-v1");

    if mode == AdsMode::Delta {
        resumed_without_resends(&replicas[other], &gateway_id).await;
    }

    // A change after the failover arrives through the surviving replica.
    mesh.write_virtual_service(SwitchTarget::Vm);
    expect_backend(
        p.gateway_addr,
        gw("/switch"),
        SwitchTarget::Vm.backend(),
        FAILOVER,
    )
    .await;
    let survivor = &replicas[other];
    eventually(FAILOVER, POLL, || async {
        if survivor.serves(&gateway_id).await? {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "the gateway is not in the surviving replica's /debug/syncz"
            ))
        }
    })
    .await;
}

/// On the surviving replica, the reconnected delta gateway was sent no resource it already
/// held: every type it subscribed to shows resources resumed (matched by content hash from
/// `initial_resource_versions`) and none sent.
async fn resumed_without_resends(survivor: &ShoalServer, node_id: &str) {
    eventually(FAILOVER, POLL, || async {
        let body = survivor.admin_get("/debug/syncz").await?.body;
        let conns: Value = serde_json::from_slice(&body)?;
        let conn = conns
            .as_array()
            .and_then(|a| a.iter().find(|c| c["node_id"] == node_id))
            .ok_or_else(|| anyhow::anyhow!("the gateway is not on the surviving replica yet"))?;
        anyhow::ensure!(
            conn["mode"] == "delta",
            "the gateway should be on delta ADS: {conn}"
        );
        let types = conn["types"]
            .as_object()
            .ok_or_else(|| anyhow::anyhow!("no types in {conn}"))?;
        anyhow::ensure!(
            types.len() == 4,
            "not all four types subscribed yet: {conn}"
        );
        for (ty, status) in types {
            anyhow::ensure!(
                status["resources_sent"] == 0,
                "{ty}: the replica resent resources the gateway already held: {status}"
            );
            anyhow::ensure!(
                status["resumed"].as_u64().unwrap_or(0) > 0
                    && status["resumed"] == status["resources"],
                "{ty}: not every resource was resumed: {status}"
            );
        }
        Ok(())
    })
    .await;
}

/// After traffic through the NATS control plane, every documented metric of the server and
/// the ingester is exported, the ones traffic must move are non-zero, and each debug
/// endpoint shows the mesh (content, not just status).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_debug_endpoints() {
    let mesh = TestMesh::start().await;
    let cp = ControlPlane::nats(&mesh).await;
    let proxies = Proxies::start(&mesh, &cp.xds_addrs(), AdsMode::Sotw).await;
    static_routing(&mesh, &proxies).await;

    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .expect("docs/metrics.md");
    let server_metrics = documented_metrics(&docs, "## shoal-server");
    let ingester_metrics = documented_metrics(&docs, "## shoal-ingester");
    assert!(
        server_metrics.len() >= 10 && ingester_metrics.len() >= 4,
        "metrics.md sections parsed"
    );

    // Server: every documented name, summed over both replicas; traffic moved these.
    let mut server = BTreeMap::new();
    for r in &cp.replicas {
        let text = String::from_utf8(r.admin_get("/metrics").await.expect("server /metrics").body)
            .expect("utf-8 metrics");
        for (name, v) in parse_metrics(&text) {
            *server.entry(name).or_insert(0.0) += v;
        }
    }
    for name in &server_metrics {
        assert!(
            exported(&server, name),
            "documented server metric {name} is not exported"
        );
    }
    for name in [
        "shoal_xds_connections",
        "shoal_xds_pushes_total",
        "shoal_xds_push_bytes_total",
        "shoal_xds_resources_sent_total",
        "shoal_bus_entries_total",
        "shoal_push_context_builds_total",
        "shoal_debounce_seconds_count",
        "shoal_cache_misses_total",
        "shoal_cache_entries",
        "shoal_ready",
    ] {
        assert!(
            server.get(name).copied().unwrap_or(0.0) > 0.0,
            "server metric {name} is 0 after traffic"
        );
    }

    // Ingester (file source): every documented name but the Kubernetes-watch ones.
    let ingester = cp
        .ingester
        .as_ref()
        .expect("NATS control plane has an ingester");
    let text = String::from_utf8(
        ingester
            .admin_get("/metrics")
            .await
            .expect("ingester /metrics")
            .body,
    )
    .expect("utf-8 metrics");
    let ingester_values = parse_metrics(&text);
    // Only a Kubernetes source produces these (refusals need fleets of clusters).
    let kube_only = [
        "shoal_ingester_events_total",
        "shoal_ingester_cluster_synced",
        "shoal_ingester_cluster_refused",
        "shoal_ingester_issuer_readable",
        // The root certificate goes into namespaces of Kubernetes clusters.
        "shoal_ingester_ca_root_writes_total",
        "shoal_ingester_ca_root_reloads_total",
    ];
    for name in ingester_metrics
        .iter()
        .filter(|n| !kube_only.contains(&n.as_str()))
    {
        assert!(
            exported(&ingester_values, name),
            "documented ingester metric {name} is not exported"
        );
    }
    for name in ["shoal_ingester_bus_writes_total", "shoal_ingester_ready"] {
        assert!(
            ingester_values.get(name).copied().unwrap_or(0.0) > 0.0,
            "ingester metric {name} is 0 after publishing"
        );
    }

    // Debug endpoints, on each replica and on the one serving the gateway.
    let gateway_id = Node::gateway().id;
    let mut connected = 0;
    for r in &cp.replicas {
        let configz = json(r, "/debug/configz").await;
        let vs = configz["virtualServices"]
            .as_array()
            .expect("virtualServices");
        assert!(
            vs.iter().any(|v| v["name"] == "frontend"),
            "configz lacks demo/frontend: {configz}"
        );
        assert!(
            configz["services"]
                .as_array()
                .expect("services")
                .iter()
                .any(|s| s["hostname"] == "web.demo.svc.cluster.local"),
            "configz lacks the web service"
        );
        let endpointz = json(r, "/debug/endpointz").await;
        assert!(
            endpointz.to_string().contains("127.0.0.2"),
            "endpointz lacks web-v1's address: {endpointz}"
        );
        let push = json(r, "/debug/push_status").await;
        assert!(
            push["counts"]["services"].as_u64().unwrap_or(0) >= 4,
            "push_status counts: {push}"
        );
        assert_eq!(
            push["rejections"].as_array().map(Vec::len),
            Some(0),
            "push_status: {push}"
        );
        connected += push["proxies"]["connected"].as_u64().unwrap_or(0);
        let cachez = json(r, "/debug/cachez").await;
        if push["proxies"]["connected"].as_u64().unwrap_or(0) > 0 {
            assert!(
                cachez["entries"].as_u64().unwrap_or(0) > 0,
                "cachez: {cachez}"
            );
            assert!(
                cachez["misses"].as_u64().unwrap_or(0) > 0,
                "cachez: {cachez}"
            );
        }
        if r.serves(&gateway_id).await.unwrap_or(false) {
            let path = format!(
                "/debug/config_dump?proxy={}",
                gateway_id.replace('~', "%7E")
            );
            let dump = json(r, &path).await;
            let listeners = dump["listeners"].to_string();
            assert!(
                listeners.contains(&format!("0.0.0.0_{}", mesh.gateway_port)),
                "config_dump listeners: {listeners}"
            );
            assert!(
                dump["routes"]
                    .to_string()
                    .contains(&format!("http.{}", mesh.gateway_port)),
                "config_dump routes"
            );
            assert!(
                dump["clusters"].to_string().contains("outbound|"),
                "config_dump clusters"
            );
        }
    }
    assert_eq!(
        connected, 2,
        "the gateway and the sidecar, across both replicas"
    );
}

async fn json(server: &ShoalServer, path: &str) -> Value {
    let resp = server
        .admin_get(path)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(
        resp.status,
        200,
        "GET {path}: {}",
        String::from_utf8_lossy(&resp.body)
    );
    serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
}

/// The `shoal_*` metric names in the table of one section of docs/metrics.md.
fn documented_metrics(doc: &str, section: &str) -> Vec<String> {
    let body = doc.split(section).nth(1).unwrap_or_default();
    let body = body.split("\n## ").next().unwrap_or_default();
    body.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("shoal_"))
        .map(str::to_string)
        .collect()
}

/// Sample values summed per name (labels dropped; histograms keep `_count`/`_sum`).
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(name.to_string()).or_insert(0.0) += value;
    }
    out
}

/// Whether a documented name is exported (histograms export `_bucket`/`_sum`/`_count`).
fn exported(values: &BTreeMap<String, f64>, name: &str) -> bool {
    values.contains_key(name) || values.contains_key(&format!("{name}_count"))
}
