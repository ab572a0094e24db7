//! Status reporting on rejected Istio config, with the ingester as a process against the
//! Kubernetes API test server: a rejected VirtualService gets the reason (naming the
//! field) in its `status`, fixing it clears it, and only the leader writes, only what the
//! status does not say yet — a restart writes nothing. An AuthorizationPolicy using fields
//! shoal does not enforce is published (shoal fails closed on them) and its status names
//! them.
//!
//! Run `cargo build --workspace --bins` first (the tests run the ingester binary).

#[path = "kube_ingest/harness.rs"]
#[allow(dead_code)] // shared with kube_ingest.rs
mod harness;

use harness::{
    config_cluster, istio_crd, populate, virtual_service_crd, BusRecorder, Ingester, POLL, TIMEOUT,
};
use serde_json::{json, Value};
use shoal_common::bus::Bucket;
use shoal_common::keys::config_key;
use shoal_common::model::{ConfigKind, ConfigObject};
use shoal_tests::kubeapi::KubeApiServer;
use shoal_tests::{eventually, NatsServer};
use std::time::Duration;

const VIRTUAL_SERVICES: &str = "virtualservices.networking.istio.io";

/// The VirtualService `shop/web`, with a URI match.
fn virtual_service(uri: Value) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"hosts": ["web.shop.svc.cluster.local"],
                 "http": [{"match": [{"uri": uri}],
                           "route": [{"destination": {"host": "web"}}]}]},
    })
}

/// The VirtualService's status, once `check` holds for it.
async fn status_until(
    cluster: &KubeApiServer,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let status = || {
        cluster
            .get(VIRTUAL_SERVICES, Some("shop"), "web")
            .and_then(|vs| vs.get("status").cloned())
            .unwrap_or(Value::Null)
    };
    eventually(TIMEOUT, POLL, || {
        let status = status();
        let ok = check(&status);
        async move {
            match ok {
                true => Ok(()),
                false => Err(format!("waiting for {what}; status: {status}")),
            }
        }
    })
    .await;
    status()
}

/// The `Reconciled` condition.
fn reconciled(status: &Value) -> Option<&Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Reconciled")
}

fn resource_version(cluster: &KubeApiServer) -> String {
    let vs = cluster.get(VIRTUAL_SERVICES, Some("shop"), "web").unwrap();
    vs["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn rejected_virtual_service_gets_a_status_that_clears_when_fixed() {
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "local");
    config.create(virtual_service_crd()).unwrap();
    config
        .create(virtual_service(json!({"regex": "(unclosed"})))
        .unwrap();
    let args = ["--cluster-id", "main"];
    let mut ingester = Ingester::start(&nats.url(), &config.kubeconfig(), &args);
    ingester.wait_ready().await;

    // Rejected: the reason, naming the field, where the author looks.
    let status = status_until(&config, "a rejection", |s| {
        reconciled(s).is_some_and(|c| c["status"] == "False")
    })
    .await;
    let condition = reconciled(&status).unwrap();
    assert_eq!(condition["reason"], "Rejected", "{status}");
    let message = condition["message"].as_str().unwrap();
    assert!(message.contains("http[0].match[0].uri"), "{message}");
    assert_eq!(condition["observedGeneration"], "1", "{status}");
    assert_eq!(status["observedGeneration"], "1", "{status}");
    assert_eq!(
        status["validationMessages"],
        json!([{"type": {"code": "IST0106", "name": "SchemaValidationError"}, "level": "ERROR",
                "documentationUrl": "https://istio.io/latest/docs/reference/config/analysis/ist0106/"}])
    );
    let key = config_key(ConfigKind::VirtualService, "shop", "web");
    assert!(
        !bus.state(Bucket::Config).contains_key(&key),
        "a rejected object is not published"
    );

    // Fixed: accepted, published, and the status says so.
    config
        .apply(virtual_service(json!({"prefix": "/api"})))
        .unwrap();
    let status = status_until(&config, "the rejection cleared", |s| {
        reconciled(s).is_some_and(|c| c["status"] == "True")
    })
    .await;
    let condition = reconciled(&status).unwrap();
    assert_eq!(
        (&condition["reason"], &condition["observedGeneration"]),
        (&json!("Accepted"), &json!("2")),
        "{status}"
    );
    assert!(status.get("validationMessages").is_none(), "{status}");
    bus.until("the fixed VirtualService on the bus", |b| {
        b.state(Bucket::Config).contains_key(&key)
    })
    .await;

    // Broken again: rejected again; the accepted version stays published.
    config
        .apply(virtual_service(json!({"regex": "[z-a]"})))
        .unwrap();
    status_until(&config, "the second rejection", |s| {
        reconciled(s).is_some_and(|c| c["status"] == "False" && c["observedGeneration"] == "3")
    })
    .await;
    let published: ConfigObject = bus.decode(Bucket::Config, &key).unwrap();
    assert!(format!("{published:?}").contains("/api"), "{published:?}");
    bus.settle(Duration::from_millis(500)).await;
    let writes = config.status_writes_for(VIRTUAL_SERVICES);
    assert_eq!(writes, 3, "one write per verdict change");
    let metrics = ingester.metrics().await;
    assert!(
        metrics.contains("shoal_ingester_object_status_writes_total{result=\"written\"} 3"),
        "{metrics}"
    );

    // A restart, now with a standby too: the status already says it, nothing is written.
    let version = resource_version(&config);
    ingester.kill().await;
    let mut first = Ingester::start(&nats.url(), &config.kubeconfig(), &args);
    let mut second = Ingester::start(&nats.url(), &config.kubeconfig(), &args);
    first.wait_ready().await;
    second.wait_ready().await;
    let (leader, standby) = eventually_leader(&mut first, &mut second).await;
    bus.settle(Duration::from_secs(1)).await;
    assert_eq!(
        config.status_writes_for(VIRTUAL_SERVICES),
        writes,
        "restart wrote a status"
    );
    assert_eq!(resource_version(&config), version);

    // The next rejection is written once, by the leader alone.
    config
        .apply(virtual_service(json!({"regex": "(again"})))
        .unwrap();
    status_until(&config, "the third rejection", |s| {
        reconciled(s).is_some_and(|c| c["observedGeneration"] == "4")
    })
    .await;
    bus.settle(Duration::from_millis(500)).await;
    assert_eq!(config.status_writes_for(VIRTUAL_SERVICES), writes + 1);
    let written =
        |m: &str| m.contains("shoal_ingester_object_status_writes_total{result=\"written\"} 1");
    assert!(written(&leader.metrics().await));
    assert!(standby
        .metrics()
        .await
        .contains("shoal_ingester_object_status_writes_total{result=\"written\"} 0"));
}

/// A DENY AuthorizationPolicy on Envoy metadata (`experimental.envoy.filters.*`, which
/// shoal does not enforce): refusing it would leave the workload open, so it is published,
/// and its status says which field shoal does not enforce and what it does instead.
#[tokio::test]
async fn partially_enforced_authorization_policy_is_published_and_says_so() {
    const POLICIES: &str = "authorizationpolicies.security.istio.io";
    let nats = NatsServer::start().await;
    let bus = BusRecorder::start(&nats.url()).await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "local");
    let mut crd = istio_crd("AuthorizationPolicy", "authorizationpolicies");
    crd["metadata"]["name"] = json!(POLICIES);
    crd["spec"]["group"] = json!("security.istio.io");
    config.create(crd).unwrap();
    config
        .create(json!({
            "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "require-jwt", "namespace": "shop"},
            "spec": {"action": "DENY",
                     "rules": [{"when": [{"key": "experimental.envoy.filters.a[b]",
                                          "values": ["c"]}]}]},
        }))
        .unwrap();
    let mut ingester =
        Ingester::start(&nats.url(), &config.kubeconfig(), &["--cluster-id", "main"]);
    ingester.wait_ready().await;

    let key = config_key(ConfigKind::AuthorizationPolicy, "shop", "require-jwt");
    bus.until("the policy on the bus", |b| {
        b.state(Bucket::Config).contains_key(&key)
    })
    .await;
    let status = || {
        config
            .get(POLICIES, Some("shop"), "require-jwt")
            .and_then(|p| p.get("status").cloned())
            .unwrap_or(Value::Null)
    };
    eventually(TIMEOUT, POLL, || {
        let status = status();
        async move {
            match reconciled(&status) {
                Some(c) if c["reason"] == "PartiallyEnforced" => Ok(()),
                _ => Err(format!("no PartiallyEnforced status yet: {status}")),
            }
        }
    })
    .await;
    let status = status();
    let condition = reconciled(&status).unwrap();
    assert_eq!(condition["status"], "True", "{status}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains(
            "rules[0].when[0] \"experimental.envoy.filters.a[b]\" (ignored, so the rule \
             denies more)"
        ),
        "{message}"
    );
    assert!(status.get("validationMessages").is_none(), "{status}");
    ingester.kill().await;
}

/// Waits until one of two ingesters leads; returns (leader, standby).
async fn eventually_leader<'a>(
    a: &'a mut Ingester,
    b: &'a mut Ingester,
) -> (&'a Ingester, &'a Ingester) {
    let mut leader = None;
    for _ in 0..(TIMEOUT.as_millis() / POLL.as_millis()) {
        if a.leads().await {
            leader = Some(true);
            break;
        }
        if b.leads().await {
            leader = Some(false);
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    match leader {
        Some(true) => (a, b),
        Some(false) => (b, a),
        None => panic!("no ingester leads"),
    }
}
