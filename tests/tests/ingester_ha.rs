//! Ingester replicas of one fleet: leader election through the lease in `shoal-meta`,
//! takeover after the leader is killed, and fencing of a deposed leader's writes — by the
//! servers (which refuse them) and by the new leader (which puts its values back).
//!
//! Processes: a Kubernetes API test server, a real nats-server, two `shoal-ingester
//! --source kube` of fleet `default`, a `shoal-server --nats-url`. Run `cargo build
//! --workspace --bins` first.

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)]
mod harness;

use harness::{config_cluster, populate, BusRecorder, Ingester, POLL};
use serde_json::{json, Value};
use shoal_common::bus::nats::{NatsBus, NatsOptions};
use shoal_common::bus::{Bucket, Op, StateBus};
use shoal_common::envelope::now_ms;
use shoal_common::lease::LeaseBody;
use shoal_common::model::Service;
use shoal_common::Envelope;
use shoal_tests::kubeapi::KubeApiServer;
use shoal_tests::{eventually, NatsServer, ShoalIngester, ShoalServer};
use std::time::{Duration, Instant};

/// The acceptance bound for a takeover after the leader dies.
const TAKEOVER: Duration = Duration::from_secs(15);

const LEASE: &str = "lease.default";

fn service(ns: &str, name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": "10.0.0.20", "selector": {"app": name},
                 "ports": [{"name": "http", "port": port, "targetPort": 8080}]},
    })
}

fn lease(bus: &BusRecorder) -> Option<LeaseBody> {
    bus.decode::<LeaseBody>(Bucket::Meta, LEASE)
}

/// The ports of a service in a server's `/debug/configz`, if it has the service.
async fn served_ports(server: &ShoalServer, hostname: &str) -> Option<Vec<u64>> {
    let configz = server.admin_get("/debug/configz").await.ok()?.json().ok()?;
    let services = configz.get("services")?.as_array()?;
    let svc = services.iter().find(|s| s["hostname"] == hostname)?;
    Some(
        svc["ports"]
            .as_array()?
            .iter()
            .filter_map(|p| p["port"].as_u64())
            .collect(),
    )
}

async fn wait_served(server: &ShoalServer, hostname: &str, ports: &[u64]) {
    eventually(Duration::from_secs(30), POLL, || async move {
        match served_ports(server, hostname).await {
            Some(p) if p == ports => Ok(()),
            other => Err(format!(
                "{hostname}: served ports {other:?}, want {ports:?}"
            )),
        }
    })
    .await;
}

/// `shoal_bus_entries_total{bucket="shoal-services",result="fenced"}` of a server.
async fn fenced_count(server: &ShoalServer) -> u64 {
    let text = server
        .admin_get("/metrics")
        .await
        .expect("server /metrics")
        .text();
    text.lines()
        .find(|l| {
            l.starts_with("shoal_bus_entries_total")
                && l.contains(r#"bucket="shoal-services""#)
                && l.contains(r#"result="fenced""#)
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn ha_args(id: &'static str) -> [&'static str; 6] {
    [
        "--fleet",
        "default",
        "--lease-ttl",
        "10s",
        "--instance-id",
        id,
    ]
}

/// Two replicas: one leads; kill -9 it and change Kubernetes at once; the standby takes
/// over within 15 s and publishes those changes; a write of the deposed leader's epoch is
/// refused by the server and put right by the new leader.
#[tokio::test]
async fn standby_takes_over_loses_nothing_and_fences_the_deposed_leader() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "r1");

    let mut a = Ingester::start(&nats.url(), &config.kubeconfig(), &ha_args("ingester-a"));
    let mut b = Ingester::start(&nats.url(), &config.kubeconfig(), &ha_args("ingester-b"));
    // Both become ready: the standby once its caches are synced.
    a.wait_ready().await;
    b.wait_ready().await;

    // Exactly one leads, and it holds the lease.
    bus.until("the lease", |b| lease(b).is_some()).await;
    let first = lease(&bus).unwrap();
    assert_eq!(first.epoch, 1);
    assert_eq!(first.ttl_ms, 10_000);
    let (mut leader, standby, standby_id) = match first.holder.as_str() {
        "ingester-a" => (a, b, "ingester-b"),
        "ingester-b" => (b, a, "ingester-a"),
        other => panic!("unexpected holder {other}"),
    };
    leader.wait_leader().await;
    assert!(!standby.leads().await, "both replicas lead");
    let metrics = standby.metrics().await;
    assert!(metrics.contains("shoal_ingester_ready 1"), "{metrics}");
    // The standby has read the lease (it reads it every second).
    eventually(Duration::from_secs(5), POLL, || {
        let standby = &standby;
        async move {
            let metrics = standby.metrics().await;
            match metrics.contains("\nshoal_ingester_lease_epoch 1") {
                true => Ok(()),
                false => Err(format!("standby metrics:\n{metrics}")),
            }
        }
    })
    .await;

    // A service created in Kubernetes reaches the bus, written at epoch 1.
    config.apply(service("shop", "api", 80)).unwrap();
    bus.until("the new service", |b| {
        b.keys(Bucket::Services)
            .contains(&"Kubernetes.shop.api".to_string())
    })
    .await;
    let api: Envelope<Service> = bus
        .envelope(Bucket::Services, "Kubernetes.shop.api")
        .unwrap();
    assert_eq!((api.fleet.as_str(), api.epoch), ("default", 1));
    let server = ShoalServer::with_nats(&nats.url()).await;
    wait_served(&server, "api.shop.svc.cluster.local", &[80]).await;
    wait_served(&server, "web.shop.svc.cluster.local", &[80]).await;

    // kill -9 the leader just after it renewed the lease (the longest wait for the
    // standby), then change Kubernetes while nobody leads.
    let mark = bus.mark();
    bus.until("a renewal", |b| {
        b.since(mark)
            .iter()
            .any(|e| e.bucket == Bucket::Meta && e.key == LEASE)
    })
    .await;
    leader.kill().await;
    let killed = Instant::now();
    config.apply(service("shop", "checkout", 8000)).unwrap();
    let mut web = service("shop", "web", 81);
    web["spec"]["clusterIP"] = json!("10.0.0.10");
    web["spec"]["selector"] = json!({"app": "web"});
    config.apply(web).unwrap();

    // The standby takes over within 15 s, with the next epoch.
    eventually(TAKEOVER, Duration::from_millis(20), || {
        let current = lease(&bus);
        async move {
            match current {
                Some(l) if l.holder == standby_id && l.epoch == 2 => Ok(()),
                other => Err(format!("lease: {other:?}")),
            }
        }
    })
    .await;
    let takeover = killed.elapsed();
    println!("takeover after the leader was killed: {takeover:?}");
    assert!(takeover < TAKEOVER, "{takeover:?}");
    assert!(standby.leads().await);

    // Nothing made during the handover is lost: both changes reach the bus, at epoch 2...
    bus.until("the handover's changes", |b| {
        let checkout = b.envelope::<Service>(Bucket::Services, "Kubernetes.shop.checkout");
        let web = b.envelope::<Service>(Bucket::Services, "Kubernetes.shop.web");
        checkout.is_some_and(|e| e.epoch == 2)
            && web.is_some_and(|e| e.epoch == 2 && e.body.ports[0].port == 81)
    })
    .await;
    println!(
        "changes on the bus after the leader was killed: {:?}",
        killed.elapsed()
    );
    // ...and an unchanged key is not rewritten by the new leader.
    let api: Envelope<Service> = bus
        .envelope(Bucket::Services, "Kubernetes.shop.api")
        .unwrap();
    assert_eq!(api.epoch, 1);
    wait_served(&server, "checkout.shop.svc.cluster.local", &[8000]).await;
    wait_served(&server, "web.shop.svc.cluster.local", &[81]).await;
    let metrics = standby.metrics().await;
    assert!(
        metrics.contains("shoal_ingester_lease_epoch 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("shoal_ingester_lease_transitions_total 1"),
        "{metrics}"
    );

    // The deposed leader wakes up (as a paused process would) and writes an owned key
    // with its epoch, 1.
    let nats_bus = NatsBus::connect(&NatsOptions::new(nats.url()))
        .await
        .expect("bus");
    let current: Envelope<Service> = bus
        .envelope(Bucket::Services, "Kubernetes.shop.web")
        .unwrap();
    let mut stale = current.body.clone();
    stale.ports[0].port = 9999;
    let zombie = Envelope::new("default", 1, now_ms(), &stale)
        .encode()
        .unwrap();
    assert_eq!(fenced_count(&server).await, 0);
    nats_bus
        .put(Bucket::Services, "Kubernetes.shop.web", zombie.into())
        .await
        .expect("the zombie write");
    let written = Instant::now();

    // The server refuses it: counted as fenced, the good value stays served...
    eventually(Duration::from_secs(10), POLL, || async {
        match fenced_count(&server).await {
            0 => Err("no fenced entry yet"),
            _ => Ok(()),
        }
    })
    .await;
    assert_eq!(
        served_ports(&server, "web.shop.svc.cluster.local").await,
        Some(vec![81])
    );
    // ...and the new leader puts its value back on the bus within a few seconds.
    eventually(Duration::from_secs(5), POLL, || {
        let web = bus.envelope::<Service>(Bucket::Services, "Kubernetes.shop.web");
        async move {
            match web {
                Some(e) if e.epoch == 2 && e.body.ports[0].port == 81 => Ok(()),
                other => Err(format!(
                    "web on the bus: {:?}",
                    other.map(|e| (e.epoch, e.body.ports[0].port))
                )),
            }
        }
    })
    .await;
    println!(
        "the deposed leader's write repaired after {:?}",
        written.elapsed()
    );
    // The repair is the value the server has: nothing changes there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        served_ports(&server, "web.shop.svc.cluster.local").await,
        Some(vec![81])
    );
    assert_eq!(fenced_count(&server).await, 1);
}

/// A replica stopped gracefully (SIGTERM) releases the lease: the standby takes over at
/// once, not after the lease's ttl.
#[tokio::test]
async fn a_graceful_stop_hands_over_at_once() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config: KubeApiServer = config_cluster().await;
    populate(&config, "shop", json!({}), "r1");
    let mut a = Ingester::start(&nats.url(), &config.kubeconfig(), &ha_args("ingester-a"));
    a.wait_leader().await;
    let mut b = Ingester::start(&nats.url(), &config.kubeconfig(), &ha_args("ingester-b"));
    b.wait_ready().await;
    assert!(!b.leads().await);

    let stopped = Instant::now();
    a.terminate().await;
    bus.until("the standby's lease", |bus| {
        lease(bus).is_some_and(|l| l.holder == "ingester-b" && l.epoch == 2)
    })
    .await;
    let took = stopped.elapsed();
    println!("handover after SIGTERM: {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// The file source runs without a lease (epoch 0): nothing is fenced, live changes apply.
#[tokio::test]
async fn the_file_source_needs_no_lease() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let manifest = |port: u16| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\n\
             spec: {{clusterIP: 10.0.0.10, ports: [{{name: http, port: {port}}}]}}\n"
        )
    };
    std::fs::write(dir.path().join("web.yaml"), manifest(80)).unwrap();
    let ingester = ShoalIngester::for_dir(&nats.url(), dir.path());
    let server = ShoalServer::with_nats(&nats.url()).await;
    wait_served(&server, "web.shop.svc.cluster.local", &[80]).await;
    let env: Envelope<Service> = bus
        .envelope(Bucket::Services, "Kubernetes.shop.web")
        .unwrap();
    assert_eq!(env.epoch, 0);

    std::fs::write(dir.path().join("web.yaml"), manifest(81)).unwrap();
    wait_served(&server, "web.shop.svc.cluster.local", &[81]).await;
    assert!(lease(&bus).is_none(), "the file source wrote a lease");
    assert_eq!(fenced_count(&server).await, 0);
    let metrics = ingester
        .admin_get("/metrics")
        .await
        .expect("ingester /metrics")
        .text();
    assert!(metrics.contains("\nshoal_ingester_leader 1"), "{metrics}");
}

/// `shoal_ingester_bus_writes_total{result}` of an ingester.
async fn bus_writes(ingester: &Ingester, result: &str) -> u64 {
    let label = format!(r#"result="{result}""#);
    ingester
        .metrics()
        .await
        .lines()
        .find(|l| l.starts_with("shoal_ingester_bus_writes_total") && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The leader is frozen (SIGSTOP) past its lease, then thawed (SIGCONT): the standby
/// writes within the lease bound, and the thawed old leader, whose caches then see
/// Kubernetes changes of the time it slept and after, writes and deletes nothing: its term
/// ended by its own clock before the standby could take over.
#[tokio::test]
async fn a_paused_leader_resumes_without_writing_or_deleting() {
    const TTL: Duration = Duration::from_secs(3);
    let args = |id| {
        [
            "--fleet",
            "default",
            "--lease-ttl",
            "3s",
            "--instance-id",
            id,
        ]
    };
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "r1");
    config.apply(service("shop", "api", 80)).unwrap();
    let mut a = Ingester::start(&nats.url(), &config.kubeconfig(), &args("ingester-a"));
    a.wait_leader().await;
    let mut b = Ingester::start(&nats.url(), &config.kubeconfig(), &args("ingester-b"));
    b.wait_ready().await;
    assert!(!b.leads().await);
    bus.until("api on the bus", |b| {
        b.keys(Bucket::Services)
            .contains(&"Kubernetes.shop.api".to_string())
    })
    .await;

    // Freeze the leader just after a renewal: the standby waits the longest.
    let mark = bus.mark();
    bus.until("a renewal", |b| {
        b.since(mark)
            .iter()
            .any(|e| e.bucket == Bucket::Meta && e.key == LEASE)
    })
    .await;
    // What it wrote and deleted so far (nothing changes in Kubernetes meanwhile).
    let (written, deleted) = (
        bus_writes(&a, "written").await,
        bus_writes(&a, "deleted").await,
    );
    a.pause().await;
    let paused = Instant::now();
    config.apply(service("shop", "checkout", 8000)).unwrap();

    // The standby takes over within the lease bound and writes the change.
    bus.until("the standby's write", |b| {
        b.envelope::<Service>(Bucket::Services, "Kubernetes.shop.checkout")
            .is_some_and(|e| e.epoch == 2)
    })
    .await;
    let took = paused.elapsed();
    println!("standby wrote {took:?} after the leader was frozen (lease ttl {TTL:?})");
    assert!(took < TTL + Duration::from_secs(2), "{took:?}");
    assert_eq!(
        lease(&bus).map(|l| (l.holder, l.epoch)),
        Some(("ingester-b".into(), 2))
    );

    // While the old leader sleeps, Kubernetes changes and deletes: the thawed process sees
    // these in its watches at once.
    config.delete("services", Some("shop"), "api").unwrap();
    let mut web = service("shop", "web", 81);
    web["spec"]["selector"] = json!({"app": "web"});
    config.apply(web).unwrap();
    tokio::time::sleep(TTL).await;
    let thawed_mark = bus.mark();
    a.resume().await;
    // ...and after it is thawed, too.
    config.apply(service("shop", "late", 9000)).unwrap();
    bus.until("the new leader's writes", |b| {
        let web = b.envelope::<Service>(Bucket::Services, "Kubernetes.shop.web");
        let late = b.envelope::<Service>(Bucket::Services, "Kubernetes.shop.late");
        !b.keys(Bucket::Services)
            .contains(&"Kubernetes.shop.api".to_string())
            && web.is_some_and(|e| e.epoch == 2 && e.body.ports[0].port == 81)
            && late.is_some_and(|e| e.epoch == 2)
    })
    .await;
    bus.settle(Duration::from_secs(2)).await;

    // The thawed leader stood down and wrote and deleted nothing.
    assert!(!a.leads().await);
    assert_eq!(
        bus_writes(&a, "written").await,
        written,
        "the thawed leader wrote"
    );
    assert_eq!(
        bus_writes(&a, "deleted").await,
        deleted,
        "the thawed leader deleted"
    );
    // Every state write since the thaw carries the new epoch; the one delete is b's.
    let since = bus.since(thawed_mark);
    for e in since.iter().filter(|e| e.bucket != Bucket::Meta) {
        if e.op == Op::Put {
            let env: Envelope<serde::de::IgnoredAny> = Envelope::decode(&e.value).unwrap();
            assert_eq!(
                env.epoch, 2,
                "{}/{} written at epoch {}",
                e.bucket, e.key, env.epoch
            );
        }
    }
    assert_eq!(
        lease(&bus).map(|l| (l.holder, l.epoch)),
        Some(("ingester-b".into(), 2))
    );
    let metrics = a.metrics().await;
    assert!(
        metrics.contains("shoal_ingester_lease_transitions_total 2"),
        "{metrics}"
    );
    drop(b);
}
