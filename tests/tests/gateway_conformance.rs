//! The core HTTPRoute cases of the Gateway API conformance suite (kubernetes-sigs/gateway-api
//! `conformance/tests`), ported as traffic tests: their manifests, restated for shoal, are
//! `tests/data/gateway-conformance/manifests/<case>.yaml`; their request/response pairs are
//! `tests/data/gateway-conformance/expectations.yaml`. Status conditions, which upstream
//! checks too, are not tested here.
//!
//! One control plane serves every case at once (`shoal-server --standalone`, and again
//! nats-server + `shoal-ingester` + `shoal-server`); one gateway Envoy per Gateway
//! the cases name (alternately on delta and SotW ADS, each Gateway on the other in the
//! second run), labelled
//! `gateway.networking.k8s.io/gateway-name` as istiod's deployments are; in-process echo
//! backends stand for the suite's (`infra-backend-v1..3`, `app-backend-v1..2`,
//! `web-backend`). The cases that share the suite's `same-namespace` Gateway are kept apart
//! by a hostname each (the suite runs them one after another instead). Each listener port
//! of a Gateway (and the parentRefs naming it) becomes a free port.
#![forbid(unsafe_code)]

use serde::Deserialize;
use serde_json::Value;
use shoal_tests::bootstrap::{bootstrap_with, AdsMode, Node};
use shoal_tests::http::{Request, Response};
use shoal_tests::ports::{free_addr, free_port, free_port_on};
use shoal_tests::{Backend, Envoy, NatsServer, ShoalIngester, ShoalServer};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const INFRA: &str = "gateway-conformance-infra";
const BACKENDS: [(&str, &str); 6] = [
    (INFRA, "infra-backend-v1"),
    (INFRA, "infra-backend-v2"),
    (INFRA, "infra-backend-v3"),
    ("gateway-conformance-app-backend", "app-backend-v1"),
    ("gateway-conformance-app-backend", "app-backend-v2"),
    ("gateway-conformance-web-backend", "web-backend"),
];
/// Services for a backend of another name: `web-backend-granted` keeps the reference-grant
/// case's grant away from the invalid-* cases' `web-backend`.
const SERVICE_ALIASES: [(&str, &str); 1] = [(
    "gateway-conformance-web-backend/web-backend-granted",
    "gateway-conformance-web-backend/web-backend",
)];
/// The suite's base Gateway most cases attach to.
const SAME_NAMESPACE: &str = "same-namespace";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    case: String,
    gateway: Option<String>,
    host: Option<String>,
    requests: Vec<Expect>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Expect {
    /// The suite's listener port the request goes to (default 80).
    port: Option<u64>,
    method: Option<String>,
    host: Option<String>,
    path: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    backend: Option<String>,
    status: Option<u16>,
    seen: Option<Seen>,
    #[serde(default)]
    set_response_headers: BTreeMap<String, String>,
    #[serde(default)]
    response_headers: BTreeMap<String, String>,
    #[serde(default)]
    absent_response_headers: Vec<String>,
    location: Option<String>,
    #[serde(default)]
    mirrored_to: Vec<String>,
    #[serde(default)]
    weights: BTreeMap<String, f64>,
    /// The share of requests each mirror must get a copy of (200 requests).
    #[serde(default)]
    mirrored_share: BTreeMap<String, f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Seen {
    path: Option<String>,
    host: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    absent: Vec<String>,
}

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/gateway-conformance")
}

/// `name` → `gateway-conformance-infra/name`; `ns/name` as it is.
fn backend_id(name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{INFRA}/{name}")
    }
}

/// The suite's base manifests: its two plain HTTP Gateways and its backends' Services (port
/// 8080, as the suite's) with one ready endpoint each.
fn base_manifests(backends: &BTreeMap<String, Backend>) -> Vec<Value> {
    let mut out = Vec::new();
    for (name, from) in [(SAME_NAMESPACE, "Same"), ("all-namespaces", "All")] {
        out.push(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": name, "namespace": INFRA},
            "spec": {"gatewayClassName": "istio", "listeners": [{
                "name": "http", "port": 80, "protocol": "HTTP",
                "allowedRoutes": {"namespaces": {"from": from}},
            }]},
        }));
    }
    let services = backends.iter().map(|(id, b)| (id.as_str(), b)).chain(
        SERVICE_ALIASES
            .iter()
            .map(|(alias, of)| (*alias, &backends[*of])),
    );
    for (id, b) in services {
        let (ns, name) = id.split_once('/').expect("ns/name");
        out.push(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": name}, "ports": [
                {"name": "http", "port": 8080, "targetPort": b.port()},
            ]},
        }));
        out.push(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": ns,
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": b.port()}],
            "endpoints": [{"addresses": [b.ip().to_string()], "conditions": {"ready": true}}],
        }));
    }
    out
}

/// The free port standing for each (Gateway, listener port of the suite).
type Ports = BTreeMap<(String, u64), u16>;

/// Gives every Gateway listener, and the parentRefs to it by port, a free port per
/// (Gateway, port): several listeners on one port still share it.
fn assign_ports(docs: &mut [Value]) -> Ports {
    let mut ports = Ports::new();
    for d in docs.iter_mut() {
        if d["kind"] != "Gateway" {
            continue;
        }
        let name = d["metadata"]["name"]
            .as_str()
            .expect("gateway name")
            .to_string();
        for l in d["spec"]["listeners"].as_array_mut().into_iter().flatten() {
            let Some(suite_port) = l["port"].as_u64() else {
                continue;
            };
            let port = *ports
                .entry((name.clone(), suite_port))
                .or_insert_with(|| free_port_on(&[Ipv4Addr::UNSPECIFIED]));
            l["port"] = port.into();
        }
    }
    for d in docs.iter_mut() {
        if d["kind"] != "HTTPRoute" {
            continue;
        }
        for p in d["spec"]["parentRefs"].as_array_mut().into_iter().flatten() {
            let key = (
                p["name"].as_str().unwrap_or_default().to_string(),
                p["port"].as_u64().unwrap_or_default(),
            );
            if let Some(port) = ports.get(&key) {
                p["port"] = (*port).into();
            }
        }
    }
    ports
}

/// Where a request of `case` goes: its gateway's port for the suite's `e.port` (80).
fn gateway_addr(ports: &Ports, case: &Case, e: &Expect) -> SocketAddr {
    let gw = case.gateway.as_deref().unwrap_or(SAME_NAMESPACE);
    let port = ports
        .get(&(gw.to_string(), e.port.unwrap_or(80)))
        .unwrap_or_else(|| panic!("{}: no listener of {gw} on {:?}", case.case, e.port));
    SocketAddr::from((Ipv4Addr::LOCALHOST, *port))
}

/// Every value of header `name` in `r`, comma-joined.
fn response_header(r: &Response, name: &str) -> Option<String> {
    let values: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

fn request(case: &Case, e: &Expect, port: u16) -> Request {
    let mut req = Request::get(&e.path);
    if let Some(m) = &e.method {
        req.method = m.clone();
    }
    if let Some(host) = e.host.as_ref().or(case.host.as_ref()) {
        req = req.host(&host.replace("{port}", &port.to_string()));
    }
    for (n, v) in &e.headers {
        req = req.header(n, v);
    }
    if !e.set_response_headers.is_empty() {
        let set: Vec<String> = e
            .set_response_headers
            .iter()
            .map(|(n, v)| format!("{n}:{v}"))
            .collect();
        req = req.header("x-echo-set-header", &set.join(","));
    }
    req
}

/// Checks one request/response pair; `Err` says how it differs.
async fn check(
    ports: &Ports,
    case: &Case,
    e: &Expect,
    backends: &BTreeMap<String, Backend>,
) -> Result<(), String> {
    let addr = gateway_addr(ports, case, e);
    if !e.weights.is_empty() {
        return check_weights(addr, case, e).await;
    }
    if !e.mirrored_share.is_empty() {
        return check_mirrored_share(addr, case, e, backends).await;
    }
    let mirrored_before: Vec<u64> = e
        .mirrored_to
        .iter()
        .map(|m| backends[&backend_id(m)].requests())
        .collect();
    let r = request(case, e, addr.port())
        .send(addr)
        .await
        .map_err(|err| format!("no answer: {err:#}"))?;
    let want = e.status.unwrap_or(200);
    if r.status != want {
        return Err(format!("status {} (want {want}): {}", r.status, r.text()));
    }
    let body = r.json().unwrap_or(Value::Null);
    if let Some(b) = &e.backend {
        let got = body["backend"].as_str().unwrap_or("none");
        if got != backend_id(b) {
            return Err(format!("answered by {got}, not {b}"));
        }
    }
    if let Some(seen) = &e.seen {
        let got = |field: &str| body[field].as_str().unwrap_or_default().to_string();
        if let Some(p) = &seen.path {
            if got("path") != *p {
                return Err(format!("backend saw path {}, not {p}", got("path")));
            }
        }
        if let Some(h) = &seen.host {
            if got("host") != *h {
                return Err(format!("backend saw host {}, not {h}", got("host")));
            }
        }
        let headers = &body["headers"];
        for (n, v) in &seen.headers {
            let got = headers[n.to_ascii_lowercase()].as_str();
            if got != Some(v.as_str()) {
                return Err(format!("backend saw {n}: {got:?}, not {v}"));
            }
        }
        for n in &seen.absent {
            if let Some(v) = headers.get(n.to_ascii_lowercase()) {
                return Err(format!("backend saw {n}: {v}, which should be gone"));
            }
        }
    }
    for (n, v) in &e.response_headers {
        let got = response_header(&r, n);
        if got.as_deref() != Some(v.as_str()) {
            return Err(format!("response {n}: {got:?}, not {v}"));
        }
    }
    for n in &e.absent_response_headers {
        if let Some(v) = response_header(&r, n) {
            return Err(format!("response {n}: {v}, which should be gone"));
        }
    }
    if let Some(l) = &e.location {
        // `{port}`: the gateway's port (the suite's 80, which a location leaves out).
        let l = &l.replace("{port}", &addr.port().to_string());
        let got = response_header(&r, "location");
        if got.as_deref() != Some(l.as_str()) {
            return Err(format!("location {got:?}, not {l}"));
        }
    }
    // A mirror's copy is sent on its own schedule: wait for it a little.
    let deadline = Instant::now() + Duration::from_secs(3);
    for (m, before) in e.mirrored_to.iter().zip(mirrored_before) {
        while backends[&backend_id(m)].requests() <= before {
            if Instant::now() > deadline {
                return Err(format!("{m} got no mirrored request"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// How far a share of `n` random picks, each with probability `p`, may stray from `p`:
/// four standard deviations, so that a correct proxy fails about once in 15 000 runs.
fn tolerance(p: f64, n: u32) -> f64 {
    4.0 * (p * (1.0 - p) / f64::from(n)).sqrt()
}

/// 200 requests; each backend's share is within [`tolerance`] of its weight (a weight of 0
/// gets none).
async fn check_weights(addr: SocketAddr, case: &Case, e: &Expect) -> Result<(), String> {
    const N: u32 = 200;
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..N {
        let r = request(case, e, addr.port())
            .send(addr)
            .await
            .map_err(|err| format!("no answer: {err:#}"))?;
        let b = r
            .json()
            .ok()
            .and_then(|j| j["backend"].as_str().map(String::from))
            .unwrap_or_else(|| format!("status {}", r.status));
        *counts.entry(b).or_default() += 1;
    }
    for (b, want) in &e.weights {
        let got = f64::from(counts.get(&backend_id(b)).copied().unwrap_or(0)) / f64::from(N);
        if (got - want).abs() > tolerance(*want, N) {
            return Err(format!(
                "{b} took {got} of the requests, not {want}: {counts:?}"
            ));
        }
    }
    let unexpected: Vec<&String> = counts
        .keys()
        .filter(|k| !e.weights.keys().any(|b| backend_id(b) == **k))
        .collect();
    if !unexpected.is_empty() {
        return Err(format!("unexpected answers: {counts:?}"));
    }
    Ok(())
}

/// 200 requests, each answered by `e.backend`; each mirror got copies of its share of them
/// (within [`tolerance`]).
async fn check_mirrored_share(
    addr: SocketAddr,
    case: &Case,
    e: &Expect,
    backends: &BTreeMap<String, Backend>,
) -> Result<(), String> {
    const N: u32 = 200;
    let mirrors: Vec<(&String, &Backend)> = e
        .mirrored_share
        .keys()
        .map(|m| (m, &backends[&backend_id(m)]))
        .collect();
    let before: Vec<u64> = mirrors.iter().map(|(_, b)| b.requests()).collect();
    for _ in 0..N {
        let r = request(case, e, addr.port())
            .send(addr)
            .await
            .map_err(|err| format!("no answer: {err:#}"))?;
        let got = r
            .json()
            .ok()
            .and_then(|j| j["backend"].as_str().map(String::from));
        let want = e.backend.as_deref().map(backend_id);
        if r.status != 200 || got != want {
            return Err(format!("status {}, answered by {got:?}", r.status));
        }
    }
    // Copies are sent on their own schedule: wait until the counts stop moving.
    let mut last: Vec<u64> = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now: Vec<u64> = mirrors.iter().map(|(_, b)| b.requests()).collect();
        if now == last {
            break;
        }
        last = now;
    }
    for (((m, _), want), (b, n)) in mirrors
        .iter()
        .zip(e.mirrored_share.values())
        .zip(before.iter().zip(&last))
    {
        let share = (n - b) as f64 / f64::from(N);
        if (share - want).abs() > tolerance(*want, N) {
            return Err(format!(
                "{m} got copies of {share} of the requests, not {want}"
            ));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_conformance_standalone() {
    conformance(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_conformance_through_nats() {
    conformance(true).await;
}

/// Every case, served by `shoal-server --standalone`, or `through_nats` by nats-server,
/// `shoal-ingester` and `shoal-server`.
async fn conformance(through_nats: bool) {
    let mut backends = BTreeMap::new();
    for (ns, name) in BACKENDS {
        let id = format!("{ns}/{name}");
        let b = Backend::start(&id, free_addr()).await;
        backends.insert(id, b);
    }
    let cases: Vec<Case> = shoal_common::yaml::from_str(
        &std::fs::read_to_string(data().join("expectations.yaml")).expect("expectations"),
    )
    .expect("expectations.yaml");

    let mut docs = base_manifests(&backends);
    let mut files: Vec<PathBuf> = std::fs::read_dir(data().join("manifests"))
        .expect("manifests")
        .map(|e| e.expect("manifest").path())
        .collect();
    files.sort();
    for f in &files {
        let mut text = std::fs::read_to_string(f).expect("manifest");
        // Manually managed EndpointSlices name a backend's address: `{<name>.ip}`,
        // `{<name>.port}` (of gateway-conformance-infra's backends).
        for (id, b) in &backends {
            let name = id.rsplit('/').next().unwrap_or(id);
            text = text
                .replace(&format!("{{{name}.ip}}"), &b.ip().to_string())
                .replace(&format!("{{{name}.port}}"), &b.port().to_string());
        }
        docs.extend(shoal_common::yaml::documents(&text).expect("manifest yaml"));
    }
    // The cases share one store: a name used twice would silently drop a case's object.
    let mut names = std::collections::BTreeSet::new();
    for d in &docs {
        let id = format!(
            "{} {}/{}",
            d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]
        );
        assert!(names.insert(id.clone()), "{id} is defined twice");
    }
    let ports = assign_ports(&mut docs);
    let yaml: Vec<String> = docs.iter().map(Value::to_string).collect();
    let manifests = tempfile::tempdir().expect("manifest dir");
    std::fs::write(
        manifests.path().join("conformance.yaml"),
        yaml.join("\n---\n"),
    )
    .expect("manifests");
    let (shoal, _bus) = if through_nats {
        let nats = NatsServer::start().await;
        let ingester = ShoalIngester::for_dir(&nats.url(), manifests.path());
        let server = ShoalServer::with_nats(&nats.url()).await;
        (server, Some((nats, ingester)))
    } else {
        (ShoalServer::standalone(manifests.path()).await, None)
    };

    // One Envoy per Gateway the cases use.
    let mut gateways: Vec<&str> = cases
        .iter()
        .map(|c| c.gateway.as_deref().unwrap_or(SAME_NAMESPACE))
        .collect();
    gateways.sort();
    gateways.dedup();
    let mut envoys = BTreeMap::new();
    for (i, gw) in gateways.iter().enumerate() {
        let node = Node {
            id: format!("router~127.0.0.1~{gw}-istio-1.{INFRA}~{INFRA}.svc.cluster.local"),
            cluster: format!("{gw}-istio"),
            namespace: INFRA.into(),
            labels: vec![(
                "gateway.networking.k8s.io/gateway-name".into(),
                gw.to_string(),
            )],
            interception: None,
            service_account: format!("{gw}-istio"),
        };
        // Alternately, and the other way round through NATS: each Gateway on both.
        let mode = if (i % 2 == 0) != through_nats {
            AdsMode::Delta
        } else {
            AdsMode::Sotw
        };
        let envoy = Envoy::start(&bootstrap_with(
            &node,
            free_port(),
            &[shoal.xds_addr()],
            mode,
        ))
        .await;
        envoys.insert(gw.to_string(), envoy);
    }
    for ((gw, _), port) in &ports {
        if let Some(envoy) = envoys.get(gw) {
            envoy.wait_listener(&format!("0.0.0.0_{port}")).await;
        }
    }

    // Routes arrive with the gateway's first route push: wait until each gateway's first
    // case answers, then every pair is checked once.
    let started = Instant::now();
    for gw in &gateways {
        let first = cases
            .iter()
            .find(|c| c.gateway.as_deref().unwrap_or(SAME_NAMESPACE) == *gw)
            .expect("a case");
        let e = &first.requests[0];
        shoal_tests::eventually(Duration::from_secs(15), Duration::from_millis(100), || {
            check(&ports, first, e, &backends)
        })
        .await;
    }
    eprintln!("gateways serving after {:?}", started.elapsed());

    let mut failed = Vec::new();
    let mut requests = 0;
    for case in &cases {
        let mut errors = Vec::new();
        let case_started = Instant::now();
        for e in &case.requests {
            requests += 1;
            if let Err(err) = check(&ports, case, e, &backends).await {
                errors.push(format!(
                    "  {} {} (host {:?}): {err}",
                    e.method.as_deref().unwrap_or("GET"),
                    e.path,
                    e.host.as_ref().or(case.host.as_ref())
                ));
            }
        }
        eprintln!(
            "{} {} ({:?})",
            if errors.is_empty() { "PASS" } else { "FAIL" },
            case.case,
            case_started.elapsed()
        );
        if !errors.is_empty() {
            failed.push(format!("{}:\n{}", case.case, errors.join("\n")));
        }
    }
    eprintln!(
        "{} cases, {requests} request/response pairs, {:?}",
        cases.len(),
        started.elapsed()
    );
    assert!(failed.is_empty(), "failing cases:\n{}", failed.join("\n"));
    for (gw, envoy) in &envoys {
        assert_eq!(envoy.stat_sum("update_rejected").await, 0, "{gw}");
    }
}
