//! Faults of the state bus itself: a nats-server that comes back without its data, and a
//! JetStream cluster node killed during churn. Real processes: nats-server(s),
//! `shoal-ingester`, `shoal-server`. Run `cargo build --workspace --bins` first.
//!
//! The numbers these tests print are the ones in docs/reliability.md.

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)]
mod harness;

use shoal_common::bus::nats::{NatsBus, NatsOptions};
use shoal_common::bus::{Bucket, StateBus};
use shoal_common::model::Service;
use shoal_common::Envelope;
use shoal_tests::{eventually, NatsServer, ShoalIngester, ShoalServer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The acceptance bound: healed within this long after NATS is back.
const HEALED: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

fn service_yaml(name: &str, port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec: {{clusterIP: 10.0.0.10, ports: [{{name: http, port: {port}}}]}}\n"
    )
}

/// Service hostname → ports, from a server's `/debug/configz`.
async fn served(server: &ShoalServer) -> Option<BTreeMap<String, Vec<u64>>> {
    let configz = server.admin_get("/debug/configz").await.ok()?.json().ok()?;
    let services = configz.get("services")?.as_array()?;
    Some(
        services
            .iter()
            .filter_map(|s| {
                let host = s["hostname"].as_str()?.to_string();
                let ports = s["ports"]
                    .as_array()?
                    .iter()
                    .filter_map(|p| p["port"].as_u64())
                    .collect();
                Some((host, ports))
            })
            .collect(),
    )
}

fn expect(pairs: &[(&str, u64)]) -> BTreeMap<String, Vec<u64>> {
    pairs
        .iter()
        .map(|(name, port)| (format!("{name}.shop.svc.cluster.local"), vec![*port]))
        .collect()
}

/// Watches what a server serves every 20 ms until stopped; counts the samples that lack
/// one of `hosts` (a delete pushed to proxies).
fn watch_for_missing(
    server: Arc<ShoalServer>,
    hosts: Vec<String>,
) -> (
    Arc<AtomicBool>,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let missing = Arc::new(AtomicUsize::new(0));
    let task = {
        let (stop, missing) = (stop.clone(), missing.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some(now) = served(&server).await {
                    if hosts.iter().any(|h| !now.contains_key(h)) {
                        eprintln!("server lacks a service: {now:?}");
                        missing.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    (stop, missing, task)
}

async fn ingester_metric(ingester: &ShoalIngester, prefix: &str) -> f64 {
    let text = ingester
        .admin_get("/metrics")
        .await
        .map(|r| r.text())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// NATS restarts with an empty store (its buckets gone) while a file-source ingester and a
/// server run, and a manifest changes during the outage. The ingester re-creates the
/// buckets and publishes everything again; the server keeps serving its last good state
/// the whole time (no service ever missing) and converges on the change.
#[tokio::test]
async fn nats_back_without_its_data_heals() {
    let mut nats = NatsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), service_yaml("web", 80)).unwrap();
    std::fs::write(dir.path().join("api.yaml"), service_yaml("api", 80)).unwrap();
    let ingester = ShoalIngester::for_dir(&nats.url(), dir.path());
    let server = Arc::new(ShoalServer::with_nats(&nats.url()).await);
    let before = expect(&[("api", 80), ("web", 80)]);
    eventually(Duration::from_secs(30), POLL, || {
        let server = server.clone();
        let before = before.clone();
        async move {
            match served(&server).await {
                Some(now) if now == before => Ok(()),
                other => Err(format!("served: {other:?}")),
            }
        }
    })
    .await;
    let (stop, missing, watcher) =
        watch_for_missing(server.clone(), before.keys().cloned().collect());

    // NATS loses its store; while it is down, web changes.
    let down = Duration::from_secs(2);
    let restart = nats.restart_empty(down);
    let change = async {
        tokio::time::sleep(down / 2).await;
        std::fs::write(dir.path().join("web.yaml"), service_yaml("web", 81)).unwrap();
    };
    tokio::join!(restart, change);
    let back = Instant::now();

    // Healed: the buckets exist again with every key, and the server serves the change.
    let after = expect(&[("api", 80), ("web", 81)]);
    let bus = NatsBus::connect(&NatsOptions::new(nats.url()))
        .await
        .expect("bus");
    eventually(HEALED + Duration::from_secs(10), POLL, || {
        let (server, bus, after) = (server.clone(), &bus, after.clone());
        async move {
            let keys = bus
                .keys(Bucket::Services)
                .await
                .map_err(|e| e.to_string())?;
            let web = bus
                .get(Bucket::Services, "Kubernetes.shop.web")
                .await
                .map_err(|e| e.to_string())?
                .map(|e| Envelope::<Service>::decode(&e.value).unwrap().body.ports[0].port);
            let now = served(&server).await;
            match (keys.len(), web, now) {
                (2, Some(81), Some(now)) if now == after => Ok(()),
                other => Err(format!("keys, web port on the bus, served: {other:?}")),
            }
        }
    })
    .await;
    let healed = back.elapsed();
    println!("healed {healed:?} after NATS came back without its data");
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    assert!(healed < HEALED, "healed after {healed:?}");
    assert_eq!(
        missing.load(Ordering::Relaxed),
        0,
        "the server served a state without a service during the outage"
    );
    assert!(
        ingester_metric(&ingester, "shoal_ingester_bus_heals_total").await >= 1.0,
        "no heal counted"
    );
    // Still live afterwards.
    std::fs::write(dir.path().join("api.yaml"), service_yaml("api", 82)).unwrap();
    let last = expect(&[("api", 82), ("web", 81)]);
    eventually(Duration::from_secs(10), POLL, || {
        let (server, last) = (server.clone(), last.clone());
        async move {
            match served(&server).await {
                Some(now) if now == last => Ok(()),
                other => Err(format!("served: {other:?}")),
            }
        }
    })
    .await;
}

/// A manifest rewritten in place (truncated, then written in three partial `write`s with
/// pauses longer than the poll interval between them), and an editor's companions
/// (vim's `.swp` and `4913` probe, a `~` backup with the old content) appearing and
/// vanishing: no delete of a live key ever reaches the bus, and the final content is
/// published.
#[tokio::test]
async fn in_place_and_partial_manifest_writes_delete_nothing() {
    use std::io::Write;
    let nats = NatsServer::start().await;
    let bus = harness::BusRecorder::start(&nats.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.yaml");
    let two = |web: u16| {
        format!(
            "{}---\n{}",
            service_yaml("web", web),
            service_yaml("api", 80)
        )
    };
    std::fs::write(&path, two(80)).unwrap();
    let _ingester = ShoalIngester::for_dir(&nats.url(), dir.path());
    let live = ["Kubernetes.shop.api", "Kubernetes.shop.web"];
    bus.until("both services", |b| b.keys(Bucket::Services) == live)
        .await;
    bus.settle(Duration::from_millis(500)).await;
    let mark = bus.mark();
    let pause = Duration::from_millis(600);

    // vim: the `4913` probe, a swap file, a backup of the old content.
    let probe = dir.path().join("4913");
    std::fs::write(&probe, "").unwrap();
    std::fs::remove_file(&probe).unwrap();
    let swap = dir.path().join(".shop.yaml.swp");
    std::fs::write(&swap, b"b0VIM 9.0\0\0\x01garbage").unwrap();
    std::fs::write(dir.path().join("shop.yaml~"), two(80)).unwrap();
    tokio::time::sleep(pause).await;

    // In place: truncate, then the new content in three writes, pausing in between.
    let content = two(81).into_bytes();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.flush().unwrap();
    tokio::time::sleep(pause).await;
    let (first, rest) = content.split_at(content.len() / 3);
    let (second, third) = rest.split_at(rest.len() / 2);
    for part in [first, second, third] {
        file.write_all(part).unwrap();
        file.flush().unwrap();
        tokio::time::sleep(pause).await;
    }
    drop(file);
    std::fs::remove_file(&swap).unwrap();
    std::fs::remove_file(dir.path().join("shop.yaml~")).unwrap();

    bus.until("web on port 81", |b| {
        b.decode::<Service>(Bucket::Services, "Kubernetes.shop.web")
            .is_some_and(|s| s.ports[0].port == 81)
    })
    .await;
    bus.settle(Duration::from_secs(1)).await;
    let during = bus.since(mark);
    let deletes: Vec<_> = during
        .iter()
        .filter(|e| e.op == shoal_common::bus::Op::Delete)
        .collect();
    assert!(
        deletes.is_empty(),
        "deletes during in-place writes:\n{}",
        harness::describe(&during)
    );
    assert_eq!(bus.keys(Bucket::Services), live);
}
