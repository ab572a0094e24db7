//! The ingester's Kubernetes source, as a process (`shoal-ingester --source kube`), against
//! Kubernetes API test servers (one per cluster) and a real nats-server. Every assertion is
//! about what reaches the bus, read through a bus watch: keys, bodies, and the exact put
//! and delete operations during disruptions.
//!
//! Run `cargo build --workspace --bins` first (the tests run the ingester binary).

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)] // shared with ingester_ha.rs
mod harness;

use harness::{
    config_cluster, describe, eps_key, is_lease, istio_crd, namespace, populate, remote_secret,
    svc_key, virtual_service, virtual_service_crd, BusRecorder, ClusterStatus, Ingester, Recorded,
    POLL, TIMEOUT,
};
use serde_json::json;
use shoal_common::bus::{Bucket, Op};
use shoal_common::model::{ConfigObject, EndpointSet, Service};
use shoal_common::ownership::OwnerBody;
use shoal_tests::kubeapi::KubeApiServer;
use shoal_tests::{eventually, NatsServer};
use std::time::Duration;

// ----- tests ----------------------------------------------------------------------------

/// Two remote clusters from a secret; a kubeconfig rotation with neither gap nor
/// duplicate writes; removing one key deletes exactly that cluster's keys.
#[tokio::test]
async fn remote_clusters_from_secrets() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "local");
    let east = KubeApiServer::builder().name("east").start().await;
    populate(&east, "shop", json!({}), "east");
    let west = KubeApiServer::builder().name("west").start().await;
    populate(&west, "shop", json!({}), "west");

    let mut ingester =
        Ingester::start(&nats.url(), &config.kubeconfig(), &["--cluster-id", "main"]);
    ingester.wait_ready().await;
    config
        .apply(remote_secret(
            "istio-remote-secret",
            &[("east", east.kubeconfig()), ("west", west.kubeconfig())],
        ))
        .unwrap();
    bus.until("services of all three clusters", |b| {
        b.keys(Bucket::Services)
            == [
                svc_key("east", "shop"),
                svc_key("main", "shop"),
                svc_key("west", "shop"),
            ]
            && b.keys(Bucket::Endpoints).len() == 3
    })
    .await;
    for (cluster, region) in [("east", "east"), ("west", "west"), ("main", "local")] {
        let svc: Service = bus
            .decode(Bucket::Services, &svc_key(cluster, "shop"))
            .unwrap();
        assert_eq!(svc.cluster, cluster);
        assert_eq!(svc.hostname, "web.shop.svc.cluster.local");
        let set: EndpointSet = bus
            .decode(Bucket::Endpoints, &eps_key(cluster, "shop"))
            .unwrap();
        assert_eq!(set.cluster, cluster);
        let ep = &set.endpoints[0];
        assert_eq!(
            (ep.locality.region.as_str(), ep.locality.zone.as_str()),
            (region, &*format!("{region}-a"))
        );
        assert_eq!(ep.service_account, "web-sa");
        assert_eq!(ep.labels.get("version").map(String::as_str), Some("v1"));
    }
    bus.until("cluster statuses", |b| {
        ["cluster.east", "cluster.west", "cluster.main"]
            .iter()
            .all(|k| {
                b.decode::<ClusterStatus>(Bucket::Meta, k)
                    .is_some_and(|s| s.synced && s.last_error.is_none() && k.ends_with(&s.cluster))
            })
    })
    .await;
    let metrics = ingester.metrics().await;
    assert!(
        metrics.contains("shoal_ingester_clusters{state=\"synced\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("shoal_ingester_cluster_synced{cluster=\"east\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("shoal_ingester_ready 1"), "{metrics}");

    // Rotation: the east key now points at another server holding the same objects.
    let east2 = KubeApiServer::builder().name("east2").start().await;
    populate(&east2, "shop", json!({}), "east");
    bus.settle(Duration::from_millis(500)).await;
    let mark = bus.mark();
    config
        .apply(remote_secret(
            "istio-remote-secret",
            &[("east", east2.kubeconfig()), ("west", west.kubeconfig())],
        ))
        .unwrap();
    eventually(TIMEOUT, POLL, || {
        let (opened, open) = (east2.watches_opened(), east.open_watches());
        async move {
            if opened >= 5 && open == 0 {
                Ok(())
            } else {
                Err(format!(
                    "swap not done: east2 watches opened {opened}, east open {open}"
                ))
            }
        }
    })
    .await;
    bus.settle(Duration::from_millis(500)).await;
    let during = bus.since(mark);
    assert!(
        during.iter().all(|e| e.bucket == Bucket::Meta),
        "the swap wrote or deleted state:\n{}",
        describe(&during)
    );
    // The new connection is the live one: a change on the old server goes nowhere, one on
    // the new server reaches the bus.
    let mut svc = east.get("services", Some("shop"), "web").unwrap();
    svc["spec"]["ports"][0]["port"] = json!(81);
    east.update(svc).unwrap();
    let mut svc = east2.get("services", Some("shop"), "web").unwrap();
    svc["spec"]["ports"][0]["port"] = json!(82);
    east2.update(svc).unwrap();
    bus.until("east's port from the new server", |b| {
        b.decode::<Service>(Bucket::Services, &svc_key("east", "shop"))
            .is_some_and(|s| s.ports[0].port == 82)
    })
    .await;

    // Each cluster has its owner record, naming the (only) fleet.
    for cluster in ["east", "west", "main"] {
        let owner: OwnerBody = bus
            .decode(Bucket::Meta, &format!("owner.{cluster}"))
            .unwrap();
        assert_eq!((owner.fleet.as_str(), owner.released), ("default", false));
    }

    // Removing the west key deletes west's keys, status and owner record, nothing else:
    // no other fleet is live to take it over.
    let mark = bus.mark();
    config
        .apply(remote_secret(
            "istio-remote-secret",
            &[("east", east2.kubeconfig())],
        ))
        .unwrap();
    bus.until("west's keys deleted", |b| {
        b.keys(Bucket::Services) == [svc_key("east", "shop"), svc_key("main", "shop")]
            && !b.keys(Bucket::Endpoints).contains(&eps_key("west", "shop"))
            && !b.keys(Bucket::Meta).contains(&"cluster.west".to_string())
            && !b.keys(Bucket::Meta).contains(&"owner.west".to_string())
    })
    .await;
    bus.settle(Duration::from_millis(300)).await;
    let after = bus.since(mark);
    let deleted: Vec<&str> = after
        .iter()
        .filter(|e| e.op == Op::Delete)
        .map(|e| e.key.as_str())
        .collect();
    assert_eq!(deleted.len(), 4, "{}", describe(&after));
    assert!(
        deleted.iter().all(|k| k.contains("west")),
        "{}",
        describe(&after)
    );
    assert_eq!(
        bus.keys(Bucket::Endpoints),
        [eps_key("east", "shop"), eps_key("main", "shop")]
    );
    assert!(!ingester.metrics().await.contains("cluster=\"west\""));
}

/// Discovery selectors: a namespace relabelled out loses its objects (services,
/// endpoints, config), relabelled back gets them again; a mesh config edit applies too.
#[tokio::test]
async fn discovery_selectors_follow_namespace_labels() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    config.create(virtual_service_crd()).unwrap();
    populate(&config, "shop", json!({"mesh": "on"}), "r1");
    populate(&config, "other", json!({}), "r1");
    for ns in ["shop", "other"] {
        config.create(virtual_service(ns, "web")).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    std::fs::write(
        &mesh,
        "discoverySelectors:\n- matchLabels: {mesh: \"on\"}\n",
    )
    .unwrap();
    let mesh_arg = mesh.to_str().unwrap();
    let mut ingester = Ingester::start(
        &nats.url(),
        &config.kubeconfig(),
        &["--cluster-id", "c1", "--mesh-config", mesh_arg],
    );
    ingester.wait_ready().await;
    let shop_only = |b: &BusRecorder| {
        b.keys(Bucket::Services) == [svc_key("c1", "shop")]
            && b.keys(Bucket::Endpoints) == [eps_key("c1", "shop")]
            && b.keys(Bucket::Config) == ["VirtualService.shop.web"]
    };
    bus.until("only the selected namespace", shop_only).await;
    let vs: ConfigObject = bus
        .decode(Bucket::Config, "VirtualService.shop.web")
        .unwrap();
    assert_eq!(vs.meta.namespace, "shop");
    // The selected namespace's labels are on the bus (Gateway API namespace selectors),
    // the unselected one's are not; a relabel reaches them.
    assert_eq!(bus.namespace_keys(), ["Namespace.-.shop"]);
    config
        .apply(namespace("shop", json!({"mesh": "on", "expose": "yes"})))
        .unwrap();
    bus.until("shop's new label", |b| {
        b.decode::<ConfigObject>(Bucket::Config, "Namespace.-.shop")
            .is_some_and(|ns| {
                ns.meta.labels.get("expose").map(String::as_str) == Some("yes")
                    && ns.meta.labels.get("mesh").map(String::as_str) == Some("on")
            })
    })
    .await;

    config
        .apply(namespace("shop", json!({"mesh": "off"})))
        .unwrap();
    bus.until("nothing once shop is relabelled out", |b| {
        [Bucket::Services, Bucket::Endpoints, Bucket::Config]
            .iter()
            .all(|bucket| b.keys(*bucket).is_empty())
            && b.namespace_keys().is_empty()
    })
    .await;
    config
        .apply(namespace("shop", json!({"mesh": "on"})))
        .unwrap();
    bus.until("shop back", shop_only).await;

    // A mesh config edit: every namespace.
    std::fs::write(&mesh, "discoverySelectors: []\n").unwrap();
    bus.until("both namespaces", |b| {
        b.keys(Bucket::Services) == [svc_key("c1", "other"), svc_key("c1", "shop")]
            && b.keys(Bucket::Endpoints).len() == 2
            && b.keys(Bucket::Config) == ["VirtualService.other.web", "VirtualService.shop.web"]
            // Every namespace now (the API server's own ones too).
            && ["Namespace.-.other", "Namespace.-.shop", "Namespace.-.kube-system"]
                .iter()
                .all(|k| b.namespace_keys().iter().any(|n| n == k))
    })
    .await;
}

/// A CRD created after startup starts its kind; its removal deletes the kind's config.
/// A missing CRD does not hold back readiness.
#[tokio::test]
async fn crd_created_after_startup_starts_its_kind() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "r1");
    let mut ingester = Ingester::start(&nats.url(), &config.kubeconfig(), &[]);
    ingester.wait_ready().await;
    bus.until("the service", |b| !b.keys(Bucket::Services).is_empty())
        .await;
    assert!(bus.keys(Bucket::Config).is_empty());

    config.create(virtual_service_crd()).unwrap();
    config.create(virtual_service("shop", "web")).unwrap();
    bus.until("the VirtualService", |b| {
        b.keys(Bucket::Config) == ["VirtualService.shop.web"]
    })
    .await;
    assert!(config.watches_opened_for("virtualservices.networking.istio.io") >= 1);

    config
        .delete(
            "customresourcedefinitions.apiextensions.k8s.io",
            None,
            "virtualservices.networking.istio.io",
        )
        .unwrap();
    bus.until("the VirtualService deleted", |b| {
        b.keys(Bucket::Config).is_empty()
    })
    .await;
    // The kind can come back.
    config.create(virtual_service_crd()).unwrap();
    config.create(virtual_service("shop", "again")).unwrap();
    bus.until("the new VirtualService", |b| {
        b.keys(Bucket::Config) == ["VirtualService.shop.again"]
    })
    .await;

    // A CRD removed while no ingester runs: its config is swept at the next start.
    ingester.kill().await;
    config
        .delete(
            "customresourcedefinitions.apiextensions.k8s.io",
            None,
            "virtualservices.networking.istio.io",
        )
        .unwrap();
    let mut restarted = Ingester::start(&nats.url(), &config.kubeconfig(), &[]);
    restarted.wait_ready().await;
    bus.until("the VirtualService swept", |b| {
        b.keys(Bucket::Config).is_empty()
    })
    .await;
    assert_eq!(bus.keys(Bucket::Services), [svc_key("Kubernetes", "shop")]);

    // A security kind (RequestAuthentication, security.istio.io v1) the same way.
    let mut crd = istio_crd("RequestAuthentication", "requestauthentications");
    crd["metadata"]["name"] = json!("requestauthentications.security.istio.io");
    crd["spec"]["group"] = json!("security.istio.io");
    config.create(crd).unwrap();
    config
        .create(json!({
            "apiVersion": "security.istio.io/v1", "kind": "RequestAuthentication",
            "metadata": {"name": "jwt", "namespace": "shop"},
            "spec": {"jwtRules": [{"issuer": "testing@secure.istio.io",
                                   "jwksUri": "https://example.com/jwks.json"}]},
        }))
        .unwrap();
    bus.until("the RequestAuthentication", |b| {
        b.keys(Bucket::Config) == ["RequestAuthentication.shop.jwt"]
    })
    .await;

    // The Gateway API (gateway.networking.k8s.io) the same way: a cluster-scoped
    // GatewayClass (key namespace `-`), a Gateway (key kind `KubeGateway`), an HTTPRoute.
    for (kind, plural, scope) in [
        ("GatewayClass", "gatewayclasses", "Cluster"),
        ("Gateway", "gateways", "Namespaced"),
        ("HTTPRoute", "httproutes", "Namespaced"),
    ] {
        let mut crd = istio_crd(kind, plural);
        crd["metadata"]["name"] = json!(format!("{plural}.gateway.networking.k8s.io"));
        crd["spec"]["group"] = json!("gateway.networking.k8s.io");
        crd["spec"]["scope"] = json!(scope);
        config.create(crd).unwrap();
    }
    for object in [
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "istio"},
            "spec": {"controllerName": "istio.io/gateway-controller"},
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "shop"},
            "spec": {"gatewayClassName": "istio",
                     "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"parentRefs": [{"name": "gw"}],
                     "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]},
        }),
    ] {
        config.create(object).unwrap();
    }
    bus.until("the Gateway API objects", |b| {
        b.keys(Bucket::Config)
            == [
                "GatewayClass.-.istio",
                "HTTPRoute.shop.web",
                "KubeGateway.shop.gw",
                "RequestAuthentication.shop.jwt",
            ]
    })
    .await;
}

/// `--watch-config=false`: services and endpoints only; no CRD or Istio watch at all.
#[tokio::test]
async fn watch_config_false_publishes_no_config() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    config.create(virtual_service_crd()).unwrap();
    populate(&config, "shop", json!({}), "r1");
    config.create(virtual_service("shop", "web")).unwrap();
    let mut ingester =
        Ingester::start(&nats.url(), &config.kubeconfig(), &["--watch-config=false"]);
    ingester.wait_ready().await;
    bus.until("the service and endpoints", |b| {
        b.keys(Bucket::Services).len() == 1 && b.keys(Bucket::Endpoints).len() == 1
    })
    .await;
    bus.settle(Duration::from_millis(300)).await;
    assert!(bus.keys(Bucket::Config).is_empty());
    assert_eq!(
        config.watches_opened_for("customresourcedefinitions.apiextensions.k8s.io"),
        0
    );
}

/// Asserts that since `mark` nothing was deleted and nothing but `shoal-meta` was written.
fn nothing_deleted_or_written(bus: &BusRecorder, mark: usize, during_what: &str) {
    let during = bus.since(mark);
    let deletes: Vec<&Recorded> = during.iter().filter(|e| e.op == Op::Delete).collect();
    assert!(
        deletes.is_empty(),
        "deletes during {during_what}:\n{}",
        describe(&during)
    );
    assert!(
        during.iter().all(|e| e.bucket == Bucket::Meta),
        "writes during {during_what}:\n{}",
        describe(&during)
    );
}

/// Deletes the `shop/web` service and waits until its key is gone from the bus.
async fn still_watching(config: &KubeApiServer, bus: &BusRecorder) {
    config.delete("services", Some("shop"), "web").unwrap();
    bus.until("the service deleted", |b| {
        b.keys(Bucket::Services).is_empty()
    })
    .await;
}

/// A running ingester that has published one service of `shop` (with endpoints) and a
/// VirtualService, recorded from the bus, settled.
async fn one_service_published() -> (NatsServer, BusRecorder, KubeApiServer, Ingester) {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    config.create(virtual_service_crd()).unwrap();
    populate(&config, "shop", json!({}), "r1");
    config.create(virtual_service("shop", "web")).unwrap();
    let mut ingester = Ingester::start(&nats.url(), &config.kubeconfig(), &[]);
    ingester.wait_ready().await;
    bus.until("everything", |b| {
        b.keys(Bucket::Services).len() == 1
            && b.keys(Bucket::Endpoints).len() == 1
            && b.keys(Bucket::Config).len() == 1
    })
    .await;
    bus.settle(Duration::from_millis(500)).await;
    (nats, bus, config, ingester)
}

/// A pod that no EndpointSlice names is published as an endpoint set of its own (service
/// `-pod`, ambient's workload for it) with its IP, node, service account and istio-cni's
/// redirection, and deleted with the pod; a pod behind a Service gets no such set.
#[tokio::test]
async fn a_pod_behind_no_service_is_published_until_deleted() {
    let (_nats, bus, config, _ingester) = one_service_published().await;
    let lone = shoal_common::keys::endpoints_key(
        "Kubernetes",
        "shop",
        shoal_common::model::NO_SERVICE,
        "lone-1",
    );
    config
        .apply(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "lone-1", "namespace": "shop", "labels": {"app": "lone"},
                         "annotations": {"ambient.istio.io/redirection": "enabled"}},
            "spec": {"serviceAccountName": "lone-sa", "nodeName": "node-r1",
                     "containers": [{"name": "lone", "image": "lone:1"}]},
            "status": {"phase": "Running", "podIP": "10.1.0.9", "podIPs": [{"ip": "10.1.0.9"}],
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
    bus.until("the lone pod's endpoint set", |b| {
        b.keys(Bucket::Endpoints).contains(&lone)
    })
    .await;
    let set: EndpointSet = bus.decode(Bucket::Endpoints, &lone).unwrap();
    assert_eq!(set.service, shoal_common::model::NO_SERVICE);
    let ep = &set.endpoints[0];
    assert_eq!(
        (ep.address.as_str(), ep.pod.as_str(), ep.node.as_str()),
        ("10.1.0.9", "lone-1", "node-r1")
    );
    assert_eq!(ep.service_account, "lone-sa");
    assert!(ep.ambient && ep.ready, "{ep:?}");
    // The pod behind `web` is published through its slice only.
    assert_eq!(
        bus.keys(Bucket::Endpoints),
        [lone.clone(), eps_key("Kubernetes", "shop")]
    );
    config.delete("pods", Some("shop"), "lone-1").unwrap();
    bus.until("the lone pod's set deleted", |b| {
        b.keys(Bucket::Endpoints) == [eps_key("Kubernetes", "shop")]
    })
    .await;
}

/// Dropped watches and a 410 Gone relist (compaction) change nothing on the bus: no
/// delete of a live object, not even briefly, and no write either.
#[tokio::test]
async fn watch_disruptions_delete_nothing() {
    let (_nats, bus, config, _ingester) = one_service_published().await;
    let mark = bus.mark();

    let watches = config.watches_opened();
    config.drop_watches();
    eventually(TIMEOUT, POLL, || {
        let now = config.watches_opened();
        async move {
            // 7 watches: 5 core kinds, CRDs, VirtualServices (plus the secrets).
            if now >= watches + 7 {
                Ok(())
            } else {
                Err(format!("watches reopened: {} of 7", now - watches))
            }
        }
    })
    .await;

    let resources = [
        "namespaces",
        "services",
        "pods",
        "nodes",
        "endpointslices.discovery.k8s.io",
        "customresourcedefinitions.apiextensions.k8s.io",
        "virtualservices.networking.istio.io",
    ];
    let lists: Vec<u64> = resources
        .iter()
        .map(|r| config.lists_served_for(r))
        .collect();
    config.compact();
    config.drop_watches();
    eventually(TIMEOUT, POLL, || {
        let relisted: Vec<&str> = resources
            .iter()
            .zip(&lists)
            .filter(|(r, before)| config.lists_served_for(r) == **before)
            .map(|(r, _)| *r)
            .collect();
        async move {
            if relisted.is_empty() {
                Ok(())
            } else {
                Err(format!("not relisted yet: {relisted:?}"))
            }
        }
    })
    .await;
    bus.settle(Duration::from_millis(1000)).await;
    nothing_deleted_or_written(&bus, mark, "disruptions");
    still_watching(&config, &bus).await;
}

/// The Kubernetes API fails every request with 5xx (watches dropped meanwhile, so they
/// reconnect into the errors), then comes back slow (every list 2 s late) with its history
/// compacted (410 Gone, so everything relists slowly): no delete of a live object, not even
/// briefly, and no write either; changes still arrive afterwards.
#[tokio::test]
async fn api_errors_and_slow_lists_delete_nothing() {
    let (_nats, bus, config, _ingester) = one_service_published().await;
    let mark = bus.mark();

    // 5xx for everything, watches dropped into it, for 4 s (the watchers back off).
    let requests = config.requests();
    config.fail_requests(Some(503));
    config.drop_watches();
    tokio::time::sleep(Duration::from_secs(2)).await;
    config.fail_requests(Some(500));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failed = config.requests() - requests;
    assert!(failed > 0, "no request reached the failing server");

    // Back, but slow, and with every resourceVersion expired: every kind relists slowly.
    let resources = [
        "namespaces",
        "services",
        "pods",
        "nodes",
        "endpointslices.discovery.k8s.io",
        "customresourcedefinitions.apiextensions.k8s.io",
        "virtualservices.networking.istio.io",
    ];
    let lists: Vec<u64> = resources
        .iter()
        .map(|r| config.lists_served_for(r))
        .collect();
    config.set_list_delay(Duration::from_secs(2));
    config.compact();
    config.fail_requests(None);
    config.drop_watches();
    eventually(TIMEOUT, POLL, || {
        let relisted: Vec<&str> = resources
            .iter()
            .zip(&lists)
            .filter(|(r, before)| config.lists_served_for(r) == **before)
            .map(|(r, _)| *r)
            .collect();
        async move {
            if relisted.is_empty() {
                Ok(())
            } else {
                Err(format!("not relisted yet: {relisted:?}"))
            }
        }
    })
    .await;
    config.set_list_delay(Duration::ZERO);
    bus.settle(Duration::from_millis(1500)).await;
    println!("{failed} requests failed with 5xx; every kind relisted with 2 s lists");
    nothing_deleted_or_written(&bus, mark, "API faults");
    still_watching(&config, &bus).await;
}

/// A restarted ingester with an unchanged cluster writes nothing at all but its lease.
#[tokio::test]
async fn restart_with_unchanged_cluster_writes_nothing() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    config.create(virtual_service_crd()).unwrap();
    populate(&config, "shop", json!({}), "r1");
    config.create(virtual_service("shop", "web")).unwrap();
    let remote = KubeApiServer::builder().name("remote").start().await;
    populate(&remote, "shop", json!({}), "r2");
    config
        .apply(remote_secret(
            "istio-remote-secret",
            &[("remote", remote.kubeconfig())],
        ))
        .unwrap();

    let mut first = Ingester::start(&nats.url(), &config.kubeconfig(), &[]);
    first.wait_ready().await;
    bus.until("both clusters and config", |b| {
        b.keys(Bucket::Services).len() == 2
            && b.keys(Bucket::Endpoints).len() == 2
            && b.keys(Bucket::Config).len() == 1
            && b.keys_but_leases(Bucket::Meta)
                == [
                    "cluster.Kubernetes",
                    "cluster.remote",
                    "owner.Kubernetes",
                    "owner.remote",
                ]
    })
    .await;
    bus.settle(Duration::from_millis(500)).await;
    first.kill().await;

    let mark = bus.mark();
    let mut second = Ingester::start(&nats.url(), &config.kubeconfig(), &[]);
    second.wait_ready().await;
    // Another instance: it leads once the killed one's lease expires, and only then would
    // it write.
    second.wait_leader().await;
    eventually(TIMEOUT, POLL, || {
        let opened = remote.watches_opened();
        async move {
            // Both runs opened 5 watches on the remote cluster.
            if opened >= 10 {
                Ok(())
            } else {
                Err(format!("remote watches opened: {opened}"))
            }
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics = second.metrics().await;
    assert!(
        metrics.contains("shoal_ingester_cluster_synced{cluster=\"remote\"} 1"),
        "{metrics}"
    );
    // Nothing but the lease (taken over, then renewed).
    let events: Vec<Recorded> = bus
        .since(mark)
        .into_iter()
        .filter(|e| !(e.bucket == Bucket::Meta && is_lease(&e.key)))
        .collect();
    assert!(
        events.is_empty(),
        "the restart wrote:\n{}",
        describe(&events)
    );
    assert!(
        metrics.contains("shoal_ingester_bus_writes_total{result=\"written\"} 0"),
        "{metrics}"
    );

    // A remote cluster removed from its secret while no ingester runs is swept at start.
    second.kill().await;
    config
        .apply(remote_secret("istio-remote-secret", &[]))
        .unwrap();
    let mut third = Ingester::start(&nats.url(), &config.kubeconfig(), &[]);
    third.wait_ready().await;
    bus.until("the removed cluster's keys deleted", |b| {
        b.keys(Bucket::Services) == [svc_key("Kubernetes", "shop")]
            && b.keys(Bucket::Endpoints) == [eps_key("Kubernetes", "shop")]
            && b.keys_but_leases(Bucket::Meta) == ["cluster.Kubernetes", "owner.Kubernetes"]
    })
    .await;
}

/// An unreachable remote cluster (and one with an unusable kubeconfig) does not hold back
/// readiness past `--remote-cluster-timeout`; their statuses say what is wrong.
#[tokio::test]
async fn unreachable_remote_cluster_does_not_block_readiness() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "r1");
    let mut gone = KubeApiServer::builder().name("gone").start().await;
    let unreachable = gone.kubeconfig();
    gone.stop();
    drop(gone);
    config
        .apply(remote_secret(
            "istio-remote-secret",
            &[
                ("dead", unreachable),
                ("broken", "not: [a kubeconfig".to_string()),
            ],
        ))
        .unwrap();
    let started = std::time::Instant::now();
    let mut ingester = Ingester::start(
        &nats.url(),
        &config.kubeconfig(),
        &["--remote-cluster-timeout", "2s"],
    );
    ingester.wait_ready().await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "ready before the timeout"
    );
    assert!(bus
        .keys(Bucket::Services)
        .contains(&svc_key("Kubernetes", "shop")));
    bus.until("error statuses", |b| {
        ["cluster.dead", "cluster.broken"].iter().all(|k| {
            b.decode::<ClusterStatus>(Bucket::Meta, k)
                .is_some_and(|s| !s.synced && s.last_error.is_some())
        })
    })
    .await;
    let broken: ClusterStatus = bus.decode(Bucket::Meta, "cluster.broken").unwrap();
    assert!(broken.last_error.unwrap().contains("\"broken\""));
    let metrics = ingester.metrics().await;
    assert!(
        metrics.contains("shoal_ingester_clusters{state=\"syncing\"} 1"),
        "{metrics}"
    );
}

/// Against the cluster of `KUBECONFIG`, when set (read-only): the ingester syncs it (the
/// `kubernetes` service in `default` reaches the bus) and becomes ready, and a restart
/// deletes nothing of it.
///
/// Needs a real cluster, so it is ignored by default; run it with
/// `KUBECONFIG=~/.kube/config cargo test -p shoal-tests --test kube_ingest -- --ignored real_cluster`
/// (see docs/ingester.md, "Testing against a real cluster").
#[tokio::test]
#[ignore = "needs a real cluster: KUBECONFIG=... cargo test -p shoal-tests --test kube_ingest -- --ignored real_cluster"]
async fn real_cluster_when_kubeconfig_is_set() {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "this test reads a real cluster: set KUBECONFIG"
    );
    check_kubeconfig_cluster().await;
}

async fn check_kubeconfig_cluster() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    // The ingester inherits KUBECONFIG (which may list several files).
    let args = ["--cluster-id", "real", "--remote-cluster-timeout", "5s"];
    let start = || Ingester::start_with_env(&nats.url(), None, &args, tempfile::tempdir().unwrap());
    let mut ingester = start();
    ingester.wait_ready().await;
    let key = "real.default.kubernetes".to_string();
    bus.until("the kubernetes service", |b| {
        b.keys(Bucket::Services).contains(&key)
    })
    .await;
    let status: ClusterStatus = bus.decode(Bucket::Meta, "cluster.real").unwrap();
    assert!(status.synced, "{status:?}");

    ingester.kill().await;
    let mark = bus.mark();
    let mut restarted = start();
    restarted.wait_ready().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = bus.since(mark);
    assert!(
        !events.iter().any(|e| e.op == Op::Delete && e.key == key),
        "the restart deleted a live service:\n{}",
        describe(&events)
    );
}

/// Gateway credentials (`--credential-key-file`): the Secrets that Gateways of their own
/// namespace name are published sealed (the key never in the bus's bytes), keyed by their
/// cluster, follow rotations, and go when no Gateway names them any more; other Secrets
/// stay off the bus, and a credential key of the layout before clusters is swept.
#[tokio::test]
async fn gateway_credentials_are_published_sealed() {
    use base64::Engine as _;
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    config.apply(namespace("shop", json!({}))).unwrap();
    config.create(istio_crd("Gateway", "gateways")).unwrap();
    let gateway = json!({
        "apiVersion": "networking.istio.io/v1", "kind": "Gateway",
        "metadata": {"name": "public", "namespace": "istio-system"},
        "spec": {"selector": {"istio": "ingressgateway"}, "servers": [{
            "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
            "hosts": ["web.example.com"],
            "tls": {"mode": "SIMPLE", "credentialName": "web-cert"}}]},
    });
    config.create(gateway).unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let secret = |ns: &str, name: &str, key: &str| {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": ns},
               "type": "kubernetes.io/tls",
               "data": {"tls.crt": b64("CERTIFICATE"), "tls.key": b64(key)}})
    };
    config
        .apply(secret("istio-system", "web-cert", "PRIVATE-KEY-ONE"))
        .unwrap();
    config
        .apply(secret("istio-system", "unrelated", "PRIVATE-KEY-UNRELATED"))
        .unwrap();
    config
        .apply(secret("shop", "web-cert", "PRIVATE-KEY-SHOP"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("credential.key");
    let key = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    std::fs::write(&key_file, key).unwrap();
    let key_arg = key_file.display().to_string();
    // What an ingester of the layout before clusters left on the bus.
    let legacy = "Credential.istio-system.web-cert";
    {
        use shoal_common::bus::nats::{NatsBus, NatsOptions};
        use shoal_common::bus::StateBus;
        let raw = NatsBus::connect(&NatsOptions::new(nats.url()))
            .await
            .expect("bus");
        let old = shoal_common::Envelope::new(
            "default",
            0,
            shoal_common::envelope::now_ms(),
            ConfigObject {
                meta: shoal_common::model::ObjectMeta {
                    name: "web-cert".into(),
                    namespace: "istio-system".into(),
                    ..Default::default()
                },
                spec: shoal_common::model::ConfigSpec::Credential(Default::default()),
            },
        );
        raw.put(Bucket::Config, legacy, old.encode().unwrap().into())
            .await
            .expect("the legacy key");
    }
    let mut ingester = Ingester::start(
        &nats.url(),
        &config.kubeconfig(),
        &["--credential-key-file", &key_arg],
    );
    ingester.wait_ready().await;
    let credential = "Credential.Kubernetes.istio-system.web-cert";
    bus.until("the credential", |b| {
        b.keys(Bucket::Config).iter().any(|k| k == credential)
    })
    .await;
    assert_eq!(
        bus.keys(Bucket::Config),
        [credential, "Gateway.istio-system.public"]
    );
    let clear = |b: &BusRecorder| {
        b.since(0).iter().any(|r| {
            r.value
                .windows(b"PRIVATE-KEY".len())
                .any(|w| w == b"PRIVATE-KEY")
        })
    };
    let first = bus.state(Bucket::Config)[credential].clone();

    // Rotation: a new key in the Secret, a new sealed value.
    config
        .apply(secret("istio-system", "web-cert", "PRIVATE-KEY-TWO"))
        .unwrap();
    bus.until("the rotated credential", |b| {
        b.state(Bucket::Config)
            .get(credential)
            .is_some_and(|v| *v != first)
    })
    .await;

    // No Gateway names it any more: it leaves the bus.
    config
        .delete(
            "gateways.networking.istio.io",
            Some("istio-system"),
            "public",
        )
        .unwrap();
    bus.until("the credential deleted", |b| {
        b.keys(Bucket::Config).is_empty()
    })
    .await;
    assert!(!clear(&bus), "key material in the clear on the bus");
}
