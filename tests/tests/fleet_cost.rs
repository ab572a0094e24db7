//! What one fleet costs: memory of its two replicas (leader and standby) and the API
//! server connections they hold, by the number of clusters and objects it serves. The
//! numbers are in docs/operations.md ("Planning fleets").
//!
//! A measurement, not a check: ignored by default. Measure with release binaries:
//!
//! ```sh
//! cargo build --release -p shoal-ingester
//! SHOAL_BIN_DIR=target/release cargo test -p shoal-tests --test fleet_cost -- --ignored --nocapture
//! ```

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)]
mod harness;

use harness::{config_cluster, fleet_secret, namespace, BusRecorder, Ingester, POLL};
use serde_json::json;
use shoal_common::bus::Bucket;
use shoal_tests::kubeapi::KubeApiServer;
use shoal_tests::{eventually, NatsServer};
use std::collections::BTreeSet;
use std::time::Duration;

/// Fills a cluster with `services` Services in namespace `app`, each with an
/// EndpointSlice of `pods` ready endpoints and their Pods, on 10 Nodes.
fn populate(cluster: &KubeApiServer, services: usize, pods: usize) {
    cluster.apply(namespace("app", json!({}))).unwrap();
    for n in 0..10 {
        cluster
            .apply(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": format!("node-{n}"), "labels": {
                    "topology.kubernetes.io/region": "r", "topology.kubernetes.io/zone": format!("z{}", n % 3),
                }},
            }))
            .unwrap();
    }
    for s in 0..services {
        let name = format!("svc-{s}");
        let mut endpoints = Vec::new();
        for p in 0..pods {
            let pod = format!("{name}-{p}");
            let ip = format!("10.{}.{}.{}", s / 250, s % 250, p + 1);
            cluster
                .apply(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "namespace": "app",
                                 "labels": {"app": name, "version": "v1", "pod-template-hash": "abcde12345"}},
                    "spec": {"serviceAccountName": name, "nodeName": format!("node-{}", p % 10),
                             "containers": [{"name": "app", "image": "app:1"}]},
                    "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
                }))
                .unwrap();
            endpoints.push(json!({"addresses": [ip], "conditions": {"ready": true},
                                  "nodeName": format!("node-{}", p % 10),
                                  "targetRef": {"kind": "Pod", "name": pod, "namespace": "app"}}));
        }
        cluster
            .apply(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "app"},
                "spec": {"clusterIP": format!("10.96.{}.{}", s / 250, s % 250 + 1),
                         "selector": {"app": name},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                                   {"name": "grpc", "port": 9090, "targetPort": 9090}]},
            }))
            .unwrap();
        cluster
            .apply(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-abc"), "namespace": "app",
                             "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080}, {"name": "grpc", "port": 9090}],
                "endpoints": endpoints,
            }))
            .unwrap();
    }
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// One fleet (two replicas) serving the local cluster and `remotes` remote clusters, each
/// with `services` × `pods`: prints the replicas' memory and their API connections.
async fn measure(remotes: usize, services: usize, pods: usize) {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, services, pods);
    let mut clusters = Vec::new();
    for i in 0..remotes {
        let id = format!("remote-{i}");
        let server = KubeApiServer::builder().name(&id).start().await;
        populate(&server, services, pods);
        config
            .apply(fleet_secret(
                &format!("secret-{id}"),
                &[(&id, server.kubeconfig())],
                None,
            ))
            .unwrap();
        clusters.push(server);
    }
    let args = |id: &'static str| ["--fleet", "default", "--instance-id", id];
    let url = nats.url();
    let kc = config.kubeconfig();
    let mut replicas = [
        Ingester::start(&url, &kc, &args("cost-a")),
        Ingester::start(&url, &kc, &args("cost-b")),
    ];
    for r in replicas.iter_mut() {
        r.wait_ready().await;
    }
    let want = (remotes + 1) * services;
    eventually(Duration::from_secs(120), POLL, || {
        let have = bus.keys(Bucket::Services).len();
        async move {
            match have == want {
                true => Ok(()),
                false => Err(format!("{have} of {want} services on the bus")),
            }
        }
    })
    .await;
    bus.settle(Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rss = Vec::new();
    for r in &replicas {
        let leader = r.leads().await;
        rss.push((leader, rss_mib(r.pid().expect("running"))));
    }
    rss.sort_by_key(|(leader, _)| std::cmp::Reverse(*leader));
    // Connections: the distinct client addresses of the open watches, per replica.
    let per_replica = |server: &KubeApiServer| {
        let clients = server.watch_clients();
        let agents: BTreeSet<String> = clients.iter().map(|c| c.user_agent.clone()).collect();
        let connections: BTreeSet<_> = clients.iter().map(|c| c.source).collect();
        (
            clients.len() / agents.len().max(1),
            connections.len() / agents.len().max(1),
        )
    };
    let (local_watches, local_conns) = per_replica(&config);
    let remote = clusters.first().map(per_replica).unwrap_or((0, 0));
    println!(
        "| {} | {} × {} | {} | {:.0} | {:.0} | {} watches / {} connections | {} / {} |",
        remotes + 1,
        services,
        pods,
        (remotes + 1) * services * (pods + 2),
        rss[0].1,
        rss[1].1,
        local_watches,
        local_conns,
        remote.0,
        remote.1,
    );
}

#[tokio::test]
#[ignore = "a measurement for docs/operations.md; run with --ignored --nocapture"]
async fn what_one_fleet_costs() {
    println!(
        "| clusters | services × pods per cluster | objects | leader MiB | standby MiB | \
         local cluster, per replica | each remote cluster, per replica |"
    );
    println!("|---|---|---|---|---|---|---|");
    measure(0, 1, 1).await;
    measure(0, 200, 5).await;
    measure(3, 200, 5).await;
    measure(7, 200, 5).await;
    measure(1, 1000, 5).await;
}
