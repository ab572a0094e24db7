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

/// Waits until `server` serves exactly `want`.
async fn wait_served(server: &ShoalServer, want: &BTreeMap<String, Vec<u64>>, within: Duration) {
    eventually(within, POLL, || async move {
        match served(server).await {
            Some(now) if now == *want => Ok(()),
            other => Err(format!("served: {other:?}")),
        }
    })
    .await;
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
    wait_served(&server, &before, Duration::from_secs(30)).await;
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
    wait_served(&server, &last, Duration::from_secs(10)).await;
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

/// The name (`n0`..`n2`) of the node leading a bucket's stream.
async fn stream_leader(url: &str, bucket: Bucket) -> String {
    let client = async_nats::connect(url).await.expect("nats client");
    let js = async_nats::jetstream::new(client);
    let mut stream = js
        .get_stream(format!("KV_{}", bucket.name()))
        .await
        .expect("bucket stream");
    let info = stream.info().await.expect("stream info");
    info.cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .expect("a stream leader")
}

/// A three-node JetStream cluster with R3 buckets; the file-source ingester churns 30
/// services (created, then each changed twice) while the node leading the services
/// stream is killed. Every change the ingester had acknowledged reaches both servers (each
/// attached to a surviving node): their final state is exactly the last content of every
/// manifest, as is the bus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_cluster_node_killed_during_churn_loses_nothing() {
    const SERVICES: u16 = 30;
    let mut cluster = NatsServer::cluster3().await;
    let dir = tempfile::tempdir().unwrap();
    let write = |i: u16, port: u16| {
        std::fs::write(
            dir.path().join(format!("svc{i}.yaml")),
            service_yaml(&format!("svc{i}"), port),
        )
        .unwrap()
    };
    write(0, 1000);
    let ingester = ShoalIngester::start(&[
        "--nats-url",
        &cluster.url(),
        "--nats-replicas",
        "3",
        "--source",
        &format!("file:{}", dir.path().display()),
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    let seed = cluster.nodes()[0].url();
    let bus = NatsBus::connect(&NatsOptions {
        replicas: 3,
        ..NatsOptions::new(cluster.url())
    })
    .await
    .expect("bus");
    eventually(Duration::from_secs(30), POLL, || async {
        match bus.keys(Bucket::Services).await {
            Ok(keys) if keys.len() == 1 => Ok(()),
            other => Err(format!("services on the bus: {other:?}")),
        }
    })
    .await;
    let leader = stream_leader(&seed, Bucket::Services).await;
    let victim: usize = leader[1..].parse().expect("node name n<i>");
    let survivors: Vec<String> = (0..3)
        .filter(|i| *i != victim)
        .map(|i| cluster.nodes()[i].url())
        .collect();
    let servers = [
        ShoalServer::start(&["--nats-url", &survivors[0], "--nats-replicas", "3"]).await,
        ShoalServer::start(&["--nats-url", &survivors[1], "--nats-replicas", "3"]).await,
    ];

    // Churn: create every service, then change each twice; kill the leader half-way.
    let started = Instant::now();
    for round in 0..3u16 {
        for i in 0..SERVICES {
            write(i, 1000 + round * 100 + i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            if round == 1 && i == SERVICES / 2 {
                cluster.kill(victim).await;
                println!(
                    "killed {leader} (the services stream leader) at {:?}",
                    started.elapsed()
                );
            }
        }
    }
    let want: BTreeMap<String, Vec<u64>> = (0..SERVICES)
        .map(|i| {
            let host = format!("svc{i}.shop.svc.cluster.local");
            (host, vec![u64::from(1000 + 200 + i)])
        })
        .collect();
    for server in &servers {
        let want = want.clone();
        // (a new stream leader is elected and consumers re-created; on a loaded 2-core
        // machine that has taken 20 s)
        eventually(Duration::from_secs(45), POLL, || {
            let want = want.clone();
            async move {
                match served(server).await {
                    Some(now) if now == want => Ok(()),
                    Some(now) => {
                        let wrong: Vec<_> = want
                            .iter()
                            .filter(|(h, p)| now.get(*h) != Some(p))
                            .map(|(h, p)| (h.clone(), p.clone(), now.get(h).cloned()))
                            .collect();
                        Err(format!("{} wrong: {wrong:?}", wrong.len()))
                    }
                    None => Err("no configz".to_string()),
                }
            }
        })
        .await;
    }
    println!(
        "both servers converged {:?} after the churn started",
        started.elapsed()
    );
    let survivor = NatsBus::connect(&NatsOptions::new(survivors[0].clone()))
        .await
        .expect("bus");
    for i in 0..SERVICES {
        let key = format!("Kubernetes.shop.svc{i}");
        let entry = survivor
            .get(Bucket::Services, &key)
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("{key} missing on the bus"));
        let port = Envelope::<Service>::decode(&entry.value)
            .unwrap()
            .body
            .ports[0]
            .port;
        assert_eq!(port, 1200 + i, "{key} on the bus");
    }
    drop(ingester);
}

/// The same loss under a `kube` ingester that holds its fleet's lease (the lease key is
/// lost too): it stands down, takes a new lease and publishes everything in the new term;
/// the server keeps serving throughout and gets the change made in Kubernetes during the
/// outage.
#[tokio::test]
async fn nats_back_without_its_data_heals_under_a_lease() {
    use serde_json::json;
    let mut nats = NatsServer::start().await;
    let config = harness::config_cluster().await;
    harness::populate(&config, "shop", json!({}), "r1");
    let mut ingester = harness::Ingester::start(
        &nats.url(),
        &config.kubeconfig(),
        &["--lease-ttl", "10s", "--instance-id", "ingester-a"],
    );
    ingester.wait_leader().await;
    let server = Arc::new(ShoalServer::with_nats(&nats.url()).await);
    let web = |port: u16| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "shop"},
               "spec": {"clusterIP": "10.0.0.10", "selector": {"app": "web"},
                        "ports": [{"name": "http", "port": port, "targetPort": 8080}]}})
    };
    let before = expect(&[("web", 80)]);
    wait_served(&server, &before, Duration::from_secs(30)).await;
    let (stop, missing, watcher) =
        watch_for_missing(server.clone(), before.keys().cloned().collect());

    let down = Duration::from_secs(2);
    let restart = nats.restart_empty(down);
    let change = async {
        tokio::time::sleep(down / 2).await;
        config.apply(web(81)).unwrap();
    };
    tokio::join!(restart, change);
    let back = Instant::now();

    let after = expect(&[("web", 81)]);
    let bus = NatsBus::connect(&NatsOptions::new(nats.url()))
        .await
        .expect("bus");
    eventually(HEALED + Duration::from_secs(10), POLL, || {
        let (server, bus, after) = (server.clone(), &bus, after.clone());
        async move {
            let endpoints = bus
                .keys(Bucket::Endpoints)
                .await
                .map_err(|e| e.to_string())?;
            let lease = bus
                .get(Bucket::Meta, "lease.default")
                .await
                .map_err(|e| e.to_string())?;
            let now = served(&server).await;
            match (endpoints.len(), lease.is_some(), now) {
                (1, true, Some(now)) if now == after => Ok(()),
                other => Err(format!("endpoints, lease, served: {other:?}")),
            }
        }
    })
    .await;
    let healed = back.elapsed();
    println!("healed {healed:?} after NATS came back without its data (kube source, lease 10 s)");
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    assert!(healed < HEALED, "healed after {healed:?}");
    assert_eq!(
        missing.load(Ordering::Relaxed),
        0,
        "the server dropped a service"
    );
    let metrics = ingester.metrics().await;
    assert!(metrics.contains("shoal_ingester_leader 1"), "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("shoal_ingester_bus_heals_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// Whether `server` serves the endpoint of `web` that `harness::populate` creates.
async fn serves_web_endpoint(server: &ShoalServer) -> bool {
    match server.admin_get("/debug/endpointz").await {
        Ok(r) => r.text().contains("10.1.0.1"),
        Err(_) => false,
    }
}

/// `KV_shoal-endpoints` purged by someone with full rights on NATS (a stray admin
/// command, or the server identity of issue 18 before servers were read-only): the stream
/// stays, so no watch notices, and a replica started afterwards would replay an empty
/// bucket. The ingester's bus guard sees the stream's message count drop, counts a heal
/// and publishes everything again; a replica started right after the purge serves the
/// endpoints within a few seconds, and the replica that was up never stops serving them.
#[tokio::test]
async fn a_purged_bucket_is_published_again() {
    use serde_json::json;
    let nats = NatsServer::start().await;
    let config = harness::config_cluster().await;
    harness::populate(&config, "shop", json!({}), "r1");
    let mut ingester = harness::Ingester::start(&nats.url(), &config.kubeconfig(), &[]);
    ingester.wait_leader().await;
    let server = ShoalServer::with_nats(&nats.url()).await;
    eventually(Duration::from_secs(30), POLL, || async {
        serves_web_endpoint(&server)
            .await
            .then_some(())
            .ok_or("the endpoint is not served yet")
    })
    .await;

    let client = async_nats::connect(nats.url()).await.expect("nats client");
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream("KV_shoal-endpoints")
        .await
        .expect("endpoints stream");
    let purged = stream.purge().await.expect("purge");
    let purged_at = Instant::now();
    assert_eq!(purged.purged, 1, "{purged:?}");

    let fresh = ShoalServer::with_nats(&nats.url()).await;
    eventually(HEALED, POLL, || async {
        match (
            serves_web_endpoint(&fresh).await,
            serves_web_endpoint(&server).await,
        ) {
            (true, true) => Ok(()),
            (fresh, up) => Err(format!(
                "the endpoint served by the new replica: {fresh}, by the one that was up: {up}"
            )),
        }
    })
    .await;
    let healed = purged_at.elapsed();
    println!("healed {healed:?} after KV_shoal-endpoints was purged (a replica started after the purge serves the endpoints)");
    assert!(healed < HEALED, "healed after {healed:?}");
    let metrics = ingester.metrics().await;
    assert!(
        metrics.contains("shoal_ingester_bus_heals_total{bucket=\"shoal-endpoints\"} 1"),
        "{metrics}"
    );
}
