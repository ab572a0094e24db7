//! Fleets that partition the clusters: each cluster is watched by one fleet (its leader and
//! standby), published once under that fleet, moved to another fleet without a delete, and
//! never published by a second claimant while its owner is live.
//!
//! Processes: one Kubernetes API test server per cluster (the local cluster `main` and
//! four remote clusters), a real nats-server, two `shoal-ingester --source kube` fleets of
//! two replicas each (`default`: the local cluster, the Istio config and the remote
//! clusters of its Secrets, labelled or unlabelled; `edge`: remote clusters only), a
//! misconfigured third fleet, and a `shoal-server --nats-url`. Run `cargo build
//! --workspace --bins` first.

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)]
mod harness;

use harness::{
    config_cluster, describe, fleet_secret, is_lease, populate, BusRecorder, Ingester, Recorded,
    POLL, TIMEOUT,
};
use serde::de::IgnoredAny;
use serde_json::{json, Value};
use shoal_common::bus::{Bucket, Op};
use shoal_common::ownership::OwnerBody;
use shoal_common::Envelope;
use shoal_tests::kubeapi::KubeApiServer;
use shoal_tests::{eventually, NatsServer, ShoalServer};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the server's endpoints are sampled during a move.
const SAMPLE: Duration = Duration::from_millis(20);

const HOST: &str = "web.shop.svc.cluster.local";
const REMOTES: [&str; 4] = ["r1", "r2", "r3", "r4"];
const ALL: [&str; 5] = ["main", "r1", "r2", "r3", "r4"];

/// (fleet, instance) from an ingester's `User-Agent`
/// (`shoal-ingester/<version> (fleet <fleet>; instance <instance>)`).
fn agent(user_agent: &str) -> Option<(String, String)> {
    let inner = user_agent.split_once('(')?.1.strip_suffix(')')?;
    let (fleet, instance) = inner.split_once("; ")?;
    Some((
        fleet.strip_prefix("fleet ")?.to_string(),
        instance.strip_prefix("instance ")?.to_string(),
    ))
}

/// The ingester replicas (fleet, instance) with an open watch on `server`, other than
/// watches of Secrets, and how many watches each has open.
fn watchers(server: &KubeApiServer) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for client in server.watch_clients() {
        if client.resource == "secrets" {
            continue;
        }
        let who = agent(&client.user_agent)
            .unwrap_or_else(|| panic!("a watch from {:?}", client.user_agent));
        *out.entry(who).or_default() += 1;
    }
    out
}

fn replicas(fleet: &str) -> BTreeSet<(String, String)> {
    ["a", "b"]
        .iter()
        .map(|r| (fleet.to_string(), format!("{fleet}-{r}")))
        .collect()
}

/// Waits until exactly `expected` replicas watch `server`, each with the five core kinds.
async fn wait_watched_by(server: &KubeApiServer, expected: &BTreeSet<(String, String)>) {
    eventually(TIMEOUT, POLL, || {
        let now = watchers(server);
        let ok = now.keys().cloned().collect::<BTreeSet<_>>() == *expected
            && now.values().all(|n| *n >= 5);
        async move {
            match ok {
                true => Ok(()),
                false => Err(format!(
                    "{}: watched by {now:?}, want {expected:?}",
                    server.name()
                )),
            }
        }
    })
    .await;
}

/// The fleet that wrote a value on the bus.
fn writer(value: &[u8]) -> String {
    Envelope::<IgnoredAny>::decode(value)
        .expect("an envelope")
        .fleet
}

/// The cluster of a services or endpoints key.
fn cluster_of(key: &str) -> &str {
    key.split('.').next().unwrap_or_default()
}

/// Every services and endpoints key of `cluster`, by the fleet that wrote it.
fn writers_of(bus: &BusRecorder, cluster: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for bucket in [Bucket::Services, Bucket::Endpoints] {
        for (key, value) in bus.state(bucket) {
            if cluster_of(&key) == cluster {
                out.insert(format!("{bucket}/{key}"), writer(&value));
            }
        }
    }
    out
}

fn owner(bus: &BusRecorder, cluster: &str) -> Option<OwnerBody> {
    bus.decode(Bucket::Meta, &format!("owner.{cluster}"))
}

/// Whether every key of `cluster` (services, endpoints, status) is `fleet`'s, and its
/// owner record says so.
fn published_by(bus: &BusRecorder, cluster: &str, fleet: &str) -> bool {
    let keys = writers_of(bus, cluster);
    let status = bus
        .state(Bucket::Meta)
        .get(&format!("cluster.{cluster}"))
        .map(|v| writer(v));
    keys.len() == 2
        && keys.values().all(|f| f == fleet)
        && status.as_deref() == Some(fleet)
        && owner(bus, cluster).is_some_and(|o| o.fleet == fleet && !o.released)
}

/// The clusters with endpoints of `HOST` in a server's `/debug/endpointz` (a cluster
/// counts only with at least one endpoint).
fn clusters_in(endpointz: &Value) -> Option<BTreeSet<String>> {
    let sets = endpointz.get(HOST)?.as_array()?;
    Some(
        sets.iter()
            .filter(|s| s["endpoints"].as_array().is_some_and(|e| !e.is_empty()))
            .filter_map(|s| s["cluster"].as_str().map(String::from))
            .collect(),
    )
}

/// The clusters whose endpoints of `HOST` a server serves.
async fn served_clusters(admin: std::net::SocketAddr) -> Option<BTreeSet<String>> {
    let response = shoal_tests::http::get(admin, "/debug/endpointz")
        .await
        .ok()?;
    clusters_in(&response.json().ok()?)
}

/// Samples a server's endpoints every [`SAMPLE`] until stopped.
struct Sampler {
    samples: Arc<Mutex<Vec<Option<BTreeSet<String>>>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(admin: std::net::SocketAddr) -> Sampler {
        let samples: Arc<Mutex<Vec<Option<BTreeSet<String>>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (samples, stop) = (samples.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let sample = served_clusters(admin).await;
                    samples.lock().unwrap().push(sample);
                    tokio::time::sleep(SAMPLE).await;
                }
            })
        };
        Sampler {
            samples,
            stop,
            task,
        }
    }

    async fn finish(self) -> Vec<Option<BTreeSet<String>>> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        let samples = self.samples.lock().unwrap().clone();
        samples
    }
}

fn deletes(events: &[Recorded]) -> Vec<&Recorded> {
    events.iter().filter(|e| e.op == Op::Delete).collect()
}

#[tokio::test]
async fn fleets_partition_the_clusters_and_move_them_without_a_gap() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "main");
    let mut remotes = BTreeMap::new();
    for id in REMOTES {
        let server = KubeApiServer::builder().name(id).start().await;
        populate(&server, "shop", json!({}), id);
        remotes.insert(id, server);
    }
    let kubeconfig = |id: &str| remotes[id].kubeconfig();
    // r1 is unlabelled (the default fleet takes unlabelled Secrets), r2 labelled default,
    // r3 and r4 labelled edge. One Secret per cluster, so each moves on its own.
    let secret = |id: &str, fleet: Option<&str>| {
        fleet_secret(&format!("remote-{id}"), &[(id, kubeconfig(id))], fleet)
    };
    config.apply(secret("r1", None)).unwrap();
    config.apply(secret("r2", Some("default"))).unwrap();
    config.apply(secret("r3", Some("edge"))).unwrap();
    config.apply(secret("r4", Some("edge"))).unwrap();

    let default_args = |id: &'static str| {
        [
            "--fleet",
            "default",
            "--cluster-id",
            "main",
            "--handover-timeout",
            "3s",
            "--instance-id",
            id,
        ]
    };
    let edge_args = |id: &'static str| {
        [
            "--fleet",
            "edge",
            "--local-cluster=false",
            "--watch-config=false",
            "--instance-id",
            id,
        ]
    };
    let url = nats.url();
    let kc = config.kubeconfig();
    let mut fleet_default = [
        Ingester::start(&url, &kc, &default_args("default-a")),
        Ingester::start(&url, &kc, &default_args("default-b")),
    ];
    let mut fleet_edge = [
        Ingester::start(&url, &kc, &edge_args("edge-a")),
        Ingester::start(&url, &kc, &edge_args("edge-b")),
    ];
    for ingester in fleet_default.iter_mut().chain(fleet_edge.iter_mut()) {
        ingester.wait_ready().await;
    }

    // ----- each cluster on the bus once, with its fleet ---------------------------------
    let owners = [
        ("main", "default"),
        ("r1", "default"),
        ("r2", "default"),
        ("r3", "edge"),
        ("r4", "edge"),
    ];
    bus.until("every cluster published by its fleet", |b| {
        owners.iter().all(|(c, f)| published_by(b, c, f))
    })
    .await;
    let services: Vec<String> = bus.keys(Bucket::Services);
    assert_eq!(
        services,
        ALL.iter()
            .map(|c| format!("{c}.shop.web"))
            .collect::<Vec<_>>(),
        "one service per cluster, no duplicate under another cluster ID"
    );
    assert_eq!(bus.keys(Bucket::Endpoints).len(), 5);

    // ----- each API server is watched by one fleet: its leader and its standby ----------
    wait_watched_by(&config, &replicas("default")).await;
    for id in ["r1", "r2"] {
        wait_watched_by(&remotes[id], &replicas("default")).await;
    }
    for id in ["r3", "r4"] {
        wait_watched_by(&remotes[id], &replicas("edge")).await;
    }
    // On the local cluster the edge fleet reads only its own Secrets, by label.
    let edge_secret_watches: Vec<_> = config
        .watch_clients()
        .into_iter()
        .filter(|c| agent(&c.user_agent).is_some_and(|(f, _)| f == "edge"))
        .collect();
    assert_eq!(edge_secret_watches.len(), 2, "{edge_secret_watches:?}");
    for watch in &edge_secret_watches {
        assert_eq!(watch.resource, "secrets");
        assert_eq!(watch.namespace.as_deref(), Some("istio-system"));
        assert_eq!(
            watch.label_selector.as_deref(),
            Some("istio/multiCluster=true,shoal.io/fleet=edge")
        );
    }
    println!(
        "watches: main {:?}, r1 {:?}, r3 {:?}",
        watchers(&config),
        watchers(&remotes["r1"]),
        watchers(&remotes["r3"])
    );

    let server = ShoalServer::with_nats(&url).await;
    let all: BTreeSet<String> = ALL.iter().map(|c| c.to_string()).collect();
    eventually(TIMEOUT, POLL, || {
        let admin = server.admin_addr();
        let all = &all;
        async move {
            match served_clusters(admin).await {
                Some(c) if c == *all => Ok(()),
                other => Err(format!("served clusters: {other:?}")),
            }
        }
    })
    .await;

    // ----- labelling an unlabelled Secret for the fleet that has it changes nothing -------
    bus.settle(Duration::from_millis(500)).await;
    let mark = bus.mark();
    let opened = remotes["r1"].watches_opened();
    config.apply(secret("r1", Some("default"))).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    bus.settle(Duration::from_millis(500)).await;
    let during: Vec<Recorded> = bus
        .since(mark)
        .into_iter()
        .filter(|e| !is_lease(&e.key))
        .collect();
    assert!(
        during.is_empty(),
        "relabelling r1 for its own fleet:\n{}",
        describe(&during)
    );
    assert_eq!(remotes["r1"].watches_opened(), opened, "r1 was restarted");

    // ----- moving r2 from default to edge: relabel its Secret ----------------------------
    bus.settle(Duration::from_millis(500)).await;
    let mark = bus.mark();
    let sampler = Sampler::start(server.admin_addr());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let moved = Instant::now();
    config.apply(secret("r2", Some("edge"))).unwrap();
    bus.until("r2 published by edge", |b| published_by(b, "r2", "edge"))
        .await;
    let handover = moved.elapsed();
    wait_watched_by(&remotes["r2"], &replicas("edge")).await;
    let unwatched = moved.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let samples = sampler.finish().await;
    let during = bus.since(mark);
    println!(
        "r2 moved to edge: owned and rewritten by edge after {handover:?}, default's watches \
         closed after {unwatched:?}; {} samples of the server's endpoints, {} bus events, {} deletes",
        samples.len(),
        during.len(),
        deletes(&during).len()
    );
    assert!(
        deletes(&during).is_empty(),
        "deletes during the move:\n{}",
        describe(&during)
    );
    let missing: Vec<_> = samples
        .iter()
        .enumerate()
        .filter(|(_, s)| s.as_ref() != Some(&all))
        .collect();
    assert!(samples.len() >= 20, "{} samples", samples.len());
    assert!(
        missing.is_empty(),
        "samples without every cluster's endpoints: {missing:?}"
    );
    // The owner record went default (released) → edge; r2's keys were rewritten by edge only.
    let r2_owner_writes: Vec<(String, bool)> = during
        .iter()
        .filter(|e| e.bucket == Bucket::Meta && e.key == "owner.r2")
        .map(|e| {
            let o = Envelope::<OwnerBody>::decode(&e.value).unwrap().body;
            (o.fleet, o.released)
        })
        .collect();
    assert_eq!(
        r2_owner_writes,
        [("default".to_string(), true), ("edge".to_string(), false)]
    );
    let foreign: Vec<&Recorded> = during
        .iter()
        .filter(|e| {
            matches!(e.bucket, Bucket::Services | Bucket::Endpoints)
                && (cluster_of(&e.key) != "r2" || writer(&e.value) != "edge")
        })
        .collect();
    assert!(
        foreign.is_empty(),
        "writes other than edge's of r2:\n{}",
        describe(&during)
    );
    for (c, f) in [
        ("main", "default"),
        ("r1", "default"),
        ("r3", "edge"),
        ("r4", "edge"),
    ] {
        assert!(published_by(&bus, c, f), "{c} is not {f}'s any more");
    }
    // A change in r2 now reaches the bus through edge.
    let mut svc = remotes["r2"].get("services", Some("shop"), "web").unwrap();
    svc["spec"]["ports"][0]["port"] = json!(81);
    remotes["r2"].update(svc).unwrap();
    bus.until("r2's change, written by edge", |b| {
        b.envelope::<shoal_common::model::Service>(Bucket::Services, "r2.shop.web")
            .is_some_and(|e| e.fleet == "edge" && e.body.ports[0].port == 81)
    })
    .await;

    // ----- a misconfigured second claimant is refused and reported -----------------------
    config
        .apply(fleet_secret(
            "rogue-r3",
            &[("r3", kubeconfig("r3"))],
            Some("rogue"),
        ))
        .unwrap();
    let rogue_args = [
        "--fleet",
        "rogue",
        "--local-cluster=false",
        "--watch-config=false",
        "--instance-id",
        "rogue-a",
    ];
    let mark = bus.mark();
    let mut rogue = Ingester::start(&url, &kc, &rogue_args);
    rogue.wait_ready().await;
    eventually(TIMEOUT, POLL, || {
        let rogue = &rogue;
        async move {
            let metrics = rogue.metrics().await;
            match metrics.contains(r#"shoal_ingester_cluster_refused{cluster="r3",owner="edge"} 1"#)
                && metrics.contains(r#"shoal_ingester_clusters{state="refused"} 1"#)
            {
                true => Ok(()),
                false => Err(format!("rogue metrics:\n{metrics}")),
            }
        }
    })
    .await;
    let clusters: Value = serde_json::from_str(&rogue.get("/debug/clusters").await).unwrap();
    assert_eq!(
        clusters,
        json!({"r3": {"state": "refused", "owner": "edge"}})
    );
    // The rogue fleet's leader has taken its lease and stays refused.
    bus.until("the rogue lease", |b| {
        b.keys(Bucket::Meta).contains(&"lease.rogue".to_string())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rogue_writes: Vec<Recorded> = bus
        .since(mark)
        .into_iter()
        // Its own fleet records (lease, sync marker) are its to write; no cluster's.
        .filter(|e| {
            e.op == Op::Put
                && !is_lease(&e.key)
                && shoal_common::keys::parse_synced_key(&e.key).is_none()
                && writer(&e.value) == "rogue"
        })
        .collect();
    assert!(
        rogue_writes.is_empty(),
        "the refused fleet wrote:\n{}",
        describe(&rogue_writes)
    );
    assert!(published_by(&bus, "r3", "edge"));
    // It does not even watch the cluster.
    wait_watched_by(&remotes["r3"], &replicas("edge")).await;

    // ----- a cluster removed from every fleet: deleted after the handover timeout ---------
    let removed = Instant::now();
    config
        .delete("secrets", Some("istio-system"), "remote-r1")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        bus.keys(Bucket::Services)
            .contains(&"r1.shop.web".to_string()),
        "deleted before another fleet had --handover-timeout to take it"
    );
    assert!(owner(&bus, "r1").is_some_and(|o| o.released && o.fleet == "default"));
    bus.until("r1's keys deleted", |b| {
        writers_of(b, "r1").is_empty()
            && !b.keys(Bucket::Meta).contains(&"cluster.r1".to_string())
            && owner(b, "r1").is_none()
    })
    .await;
    let gone = removed.elapsed();
    println!("r1 removed from its Secret: keys deleted after {gone:?} (handover timeout 3s)");
    assert!(gone >= Duration::from_secs(3), "{gone:?}");
    wait_watched_by(&remotes["r1"], &BTreeSet::new()).await;

    // ----- an owner whose lease expired is taken over ------------------------------------
    for ingester in fleet_edge.iter_mut() {
        ingester.kill().await;
    }
    let killed = Instant::now();
    bus.until("r3 taken over by rogue", |b| published_by(b, "r3", "rogue"))
        .await;
    println!(
        "the edge fleet was killed; the rogue fleet took r3 over after {:?} (lease ttl 3s, counted from the last renewal)",
        killed.elapsed()
    );
    // Clusters nobody else is assigned keep the dead fleet's keys (and endpoints).
    assert!(published_by(&bus, "r2", "edge"));
    let clusters: Value = serde_json::from_str(&rogue.get("/debug/clusters").await).unwrap();
    assert_eq!(clusters, json!({"r3": {"state": "synced"}}));
    drop(fleet_default);
}
