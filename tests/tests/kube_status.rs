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
    config_cluster, istio_crd, populate, remote_secret, virtual_service_crd, BusRecorder, Ingester,
    POLL, TIMEOUT,
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
    object_status_until(cluster, VIRTUAL_SERVICES, Some("shop"), "web", what, check).await
}

/// An object's status, once `check` holds for it.
async fn object_status_until(
    cluster: &KubeApiServer,
    resource: &str,
    namespace: Option<&str>,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let status = || {
        cluster
            .get(resource, namespace, name)
            .and_then(|o| o.get("status").cloned())
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

const GATEWAYS: &str = "gateways.gateway.networking.k8s.io";
/// What is deployed for a Gateway, by the resource name the test server's audit uses.
const DEPLOYED: [&str; 3] = ["serviceaccounts", "deployments.apps", "services"];

/// The Gateway `shop/web` of class `istio`, one HTTP listener on `port`.
fn kube_gateway(port: u16) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"gatewayClassName": "istio",
                 "listeners": [{"name": "http", "port": port, "protocol": "HTTP"}]},
    })
}

/// The writes to deployed objects so far.
fn deployment_writes(cluster: &KubeApiServer) -> Vec<shoal_tests::kubeapi::ObjectWrite> {
    DEPLOYED
        .iter()
        .flat_map(|r| cluster.writes_for(r))
        .collect()
}

/// Waits until `check` holds for the objects named `web-istio` (`None` where absent).
async fn deployed_until(
    cluster: &KubeApiServer,
    what: &str,
    check: impl Fn(&[Option<Value>]) -> bool,
) -> Vec<Option<Value>> {
    let objects = || -> Vec<Option<Value>> {
        DEPLOYED
            .iter()
            .map(|r| cluster.get(r, Some("shop"), "web-istio"))
            .collect()
    };
    eventually(TIMEOUT, POLL, || {
        let objects = objects();
        let ok = check(&objects);
        async move {
            match ok {
                true => Ok(()),
                false => Err(format!("waiting for {what}; objects: {objects:?}")),
            }
        }
    })
    .await;
    objects()
}

/// `--gateway-deployment`: a Gateway of class `istio` alone gets its ServiceAccount,
/// Deployment and LoadBalancer Service (`<gateway>-<class>`), owned by it and labelled as
/// istiod labels them; only the leader writes, a takeover writes nothing, a listener change
/// updates the Service alone, and deleting the Gateway deletes them.
#[tokio::test]
async fn gateway_api_gateways_are_deployed_by_the_leader() {
    let nats = NatsServer::start().await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "local");
    gateway_api_crds(
        &config,
        &[
            ("GatewayClass", "gatewayclasses", "Cluster"),
            ("Gateway", "gateways", "Namespaced"),
        ],
    );
    config.create(kube_gateway(80)).unwrap();
    // Another controller's class: not deployed.
    let mut other = kube_gateway(80);
    other["metadata"]["name"] = json!("other");
    other["spec"]["gatewayClassName"] = json!("someone-else");
    config.create(other).unwrap();
    // A Gateway whose Service name is taken by someone else's Service: that Service is
    // left alone (its ServiceAccount and Deployment are made).
    let mut taken = kube_gateway(80);
    taken["metadata"]["name"] = json!("taken");
    config.create(taken).unwrap();
    let theirs = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "taken-istio", "namespace": "shop"},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"name": "http", "port": 9}]},
    });
    config.create(theirs.clone()).unwrap();
    let uid = config.get(GATEWAYS, Some("shop"), "web").unwrap()["metadata"]["uid"].clone();

    let deploy = [
        "--gateway-deployment",
        "--gateway-proxy-image",
        "proxy:test",
    ];
    let start = |id: &str| {
        let args = [
            &["--cluster-id", "main", "--instance-id", id][..],
            &deploy[..],
        ]
        .concat();
        Ingester::start(&nats.url(), &config.kubeconfig(), &args)
    };
    let mut a = start("ingester-a");
    let mut b = start("ingester-b");
    a.wait_ready().await;
    b.wait_ready().await;
    let leader_pid = eventually_leader(&mut a, &mut b).await.0.pid();
    let a_leads = leader_pid == a.pid();
    let (leader_id, standby_id) = match a_leads {
        true => ("ingester-a", "ingester-b"),
        false => ("ingester-b", "ingester-a"),
    };

    let objects = deployed_until(&config, "the deployed objects", |o| {
        o.iter().all(Option::is_some)
    })
    .await;
    for object in objects.iter().flatten() {
        let meta = &object["metadata"];
        assert_eq!(
            meta["labels"]["gateway.networking.k8s.io/gateway-name"], "web",
            "{object}"
        );
        assert_eq!(
            meta["labels"]["gateway.istio.io/managed"], "istio.io-gateway-controller",
            "{object}"
        );
        assert_eq!(
            meta["ownerReferences"],
            json!([{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                    "name": "web", "uid": uid, "controller": true}]),
            "{object}"
        );
    }
    let [_, deployment, service] = &objects[..] else {
        unreachable!()
    };
    let deployment = deployment.as_ref().unwrap();
    assert_eq!(
        deployment["metadata"]["labels"]["istio.io/gateway-name"],
        "web"
    );
    assert_eq!(deployment["spec"]["replicas"], 1);
    let pod = &deployment["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"]["gateway.networking.k8s.io/gateway-name"],
        "web"
    );
    assert_eq!(pod["spec"]["serviceAccountName"], "web-istio");
    assert_eq!(pod["spec"]["containers"][0]["image"], "proxy:test");
    let service = service.as_ref().unwrap();
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    assert_eq!(
        service["spec"]["selector"],
        json!({"gateway.networking.k8s.io/gateway-name": "web"})
    );
    let ports = |s: &Value| -> Vec<u64> {
        s["spec"]["ports"]
            .as_array()
            .map(|p| p.iter().filter_map(|p| p["port"].as_u64()).collect())
            .unwrap_or_default()
    };
    assert_eq!(ports(service), [15021, 80]);
    assert!(
        config
            .get("deployments.apps", Some("shop"), "other-someone-else")
            .is_none(),
        "another controller's Gateway is not deployed"
    );

    // Five creates (three for web, two for taken), all by the leader; their Service
    // untouched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = deployment_writes(&config);
    let verbs: Vec<&str> = writes.iter().map(|w| w.verb).collect();
    assert_eq!(verbs, ["create"; 5], "{writes:?}");
    assert!(
        config
            .get("deployments.apps", Some("shop"), "taken-istio")
            .is_some(),
        "{writes:?}"
    );
    let service = config.get("services", Some("shop"), "taken-istio").unwrap();
    assert_eq!(
        service["spec"], theirs["spec"],
        "someone else's Service was changed"
    );
    assert!(
        writes
            .iter()
            .all(|w| w.user_agent.contains(leader_id) && w.code == 201),
        "{writes:?}"
    );

    // The leader dies; the standby takes over, finds everything in place, writes nothing.
    let (leader, standby) = match a_leads {
        true => (&mut a, &mut b),
        false => (&mut b, &mut a),
    };
    leader.kill().await;
    standby.wait_leader().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(deployment_writes(&config).len(), 5, "a takeover wrote");

    // A listener moves: the Service follows, nothing else is written.
    config.apply(kube_gateway(8080)).unwrap();
    deployed_until(&config, "the Service on the new port", |o| {
        o[2].as_ref().is_some_and(|s| ports(s) == [15021, 8080])
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = deployment_writes(&config);
    let update: Vec<(&str, &str)> = writes[5..]
        .iter()
        .map(|w| (w.verb, w.resource.as_str()))
        .collect();
    assert_eq!(update, [("patch", "services")], "{writes:?}");
    assert!(writes[5].user_agent.contains(standby_id), "{writes:?}");

    // The Gateway goes: so do its objects (the test server collects no garbage); the
    // other Gateway's stay.
    config.delete(GATEWAYS, Some("shop"), "web").unwrap();
    deployed_until(&config, "the objects deleted", |o| {
        o.iter().all(Option::is_none)
    })
    .await;
    assert!(config
        .get("deployments.apps", Some("shop"), "taken-istio")
        .is_some());
    let metrics = standby.metrics().await;
    for line in [
        "shoal_ingester_gateway_deployment_writes_total{result=\"created\"} 0",
        "shoal_ingester_gateway_deployment_writes_total{result=\"updated\"} 1",
        "shoal_ingester_gateway_deployment_writes_total{result=\"deleted\"} 3",
        // The taken Service, read once when it took over, not retried every few seconds.
        "shoal_ingester_gateway_deployment_writes_total{result=\"error\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
}

/// The GatewayClass `istio` of istiod's controller.
fn istio_class() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": "istio"},
        "spec": {"controllerName": "istio.io/gateway-controller"},
    })
}

/// The CRDs of the Gateway API kinds, with their scope and a `status` subresource.
fn gateway_api_crds(config: &KubeApiServer, kinds: &[(&str, &str, &str)]) {
    for (kind, plural, scope) in kinds {
        let mut crd = istio_crd(kind, plural);
        crd["metadata"]["name"] = json!(format!("{plural}.gateway.networking.k8s.io"));
        crd["spec"]["group"] = json!("gateway.networking.k8s.io");
        crd["spec"]["scope"] = json!(scope);
        config.create(crd).unwrap();
    }
}

const HTTP_ROUTES: &str = "httproutes.gateway.networking.k8s.io";
const GATEWAY_CLASSES: &str = "gatewayclasses.gateway.networking.k8s.io";

/// An HTTPRoute `shop/<name>` with one parent, hostnames and one backend.
fn http_route(name: &str, parent: &str, hostnames: Value, backend: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"parentRefs": [{"name": parent}], "hostnames": hostnames,
                 "rules": [{"backendRefs": [backend]}]},
    })
}

/// `(type, status, reason)` of each condition.
fn conditions(conditions: &Value) -> Vec<(String, String, String)> {
    conditions
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                    (s("type"), s("status"), s("reason"))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn condition(kind: &str, status: &str, reason: &str) -> (String, String, String) {
    (kind.into(), status.into(), reason.into())
}

/// One ingester of cluster `main` watching `config`, ready and leading.
async fn leading_ingester(nats: &NatsServer, config: &KubeApiServer) -> Ingester {
    let mut ingester = Ingester::start(
        &nats.url(),
        &config.kubeconfig(),
        &["--cluster-id", "main", "--instance-id", "ingester-a"],
    );
    ingester.wait_ready().await;
    ingester.wait_leader().await;
    ingester
}

/// The conditions of a route's one parent entry (shoal's), once it has one.
fn route_conditions(status: &Value) -> Vec<(String, String, String)> {
    match status["parents"].as_array().map(Vec::as_slice) {
        Some([parent]) if parent["controllerName"] == "istio.io/gateway-controller" => {
            conditions(&parent["conditions"])
        }
        _ => Vec::new(),
    }
}

/// Waits until the HTTPRoute `shop/<name>` has shoal's parent entry with exactly these
/// conditions (`what` says what is awaited); returns its status.
async fn shop_route_until(
    cluster: &KubeApiServer,
    name: &str,
    what: &str,
    expected: &[(String, String, String)],
) -> Value {
    object_status_until(cluster, HTTP_ROUTES, Some("shop"), name, what, |s| {
        route_conditions(s) == expected
    })
    .await
}

/// Gateway API status, as users read it with kubectl: the leader writes the GatewayClass's
/// `Accepted`, the Gateway's `Accepted`/`Programmed` with its address and listener status,
/// each route's parent conditions with the spec's reasons (a route shoal refuses names the
/// field); a ReferenceGrant resolves a
/// cross-namespace backend with one write; the standby writes nothing, before or after it
/// takes over; a Gateway whose Service loses its endpoints is no longer `Programmed`.
#[tokio::test]
async fn gateway_api_status_is_written_by_the_leader() {
    let nats = NatsServer::start().await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "local");
    populate(&config, "other", json!({}), "local");
    gateway_api_crds(
        &config,
        &[
            ("GatewayClass", "gatewayclasses", "Cluster"),
            ("Gateway", "gateways", "Namespaced"),
            ("HTTPRoute", "httproutes", "Namespaced"),
            ("ReferenceGrant", "referencegrants", "Namespaced"),
        ],
    );
    config.create(istio_class()).unwrap();
    let mut gateway = kube_gateway(80);
    gateway["spec"]["listeners"][0]["hostname"] = json!("*.example.com");
    config.create(gateway).unwrap();
    // The gateway's Service (as the deployment makes it) and a ready endpoint.
    config
        .create(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web-istio", "namespace": "shop"},
            "spec": {"clusterIP": "10.0.0.20", "ports": [{"name": "http", "port": 80}],
                     "selector": {"gateway.networking.k8s.io/gateway-name": "web"}},
        }))
        .unwrap();
    let gateway_slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-istio-1", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web-istio"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80}],
        "endpoints": [{"addresses": ["10.1.0.9"], "conditions": {"ready": true}}],
    });
    config.create(gateway_slice).unwrap();
    let web = json!({"name": "web", "port": 80});
    let hosts = json!(["a.example.com"]);
    for route in [
        http_route("ok", "web", hosts.clone(), web.clone()),
        http_route(
            "missing",
            "web",
            hosts.clone(),
            json!({"name": "nope", "port": 80}),
        ),
        http_route(
            "cross",
            "web",
            hosts.clone(),
            json!({"name": "web", "namespace": "other", "port": 80}),
        ),
        http_route("elsewhere", "web", json!(["a.example.org"]), web.clone()),
        http_route("ghost", "nowhere", hosts.clone(), web.clone()),
    ] {
        config.create(route).unwrap();
    }
    // A field shoal refuses: the route is not served, and its status says why.
    let mut refused = http_route("refused", "web", hosts.clone(), web.clone());
    refused["spec"]["rules"][0]["retry"] = json!({"attempts": 2});
    config.create(refused).unwrap();

    let start = |id: &str| {
        Ingester::start(
            &nats.url(),
            &config.kubeconfig(),
            &["--cluster-id", "main", "--instance-id", id],
        )
    };
    let mut a = start("ingester-a");
    let mut b = start("ingester-b");
    a.wait_ready().await;
    b.wait_ready().await;
    let a_leads = eventually_leader(&mut a, &mut b).await.0.pid() == a.pid();

    let class = object_status_until(
        &config,
        GATEWAY_CLASSES,
        None,
        "istio",
        "the class accepted",
        |s| conditions(&s["conditions"]) == [condition("Accepted", "True", "Accepted")],
    )
    .await;
    assert_eq!(
        class["conditions"][0]["message"],
        "Handled by Istio controller"
    );
    let status = object_status_until(
        &config,
        GATEWAYS,
        Some("shop"),
        "web",
        "the gateway programmed",
        |s| {
            conditions(&s["conditions"])
                == [
                    condition("Accepted", "True", "Accepted"),
                    condition("Programmed", "True", "Programmed"),
                ]
        },
    )
    .await;
    assert_eq!(
        status["addresses"],
        json!([{"type": "Hostname", "value": "web-istio.shop.svc.cluster.local"}])
    );
    let listener = &status["listeners"][0];
    assert_eq!(listener["name"], "http");
    // ok, missing and cross attach; elsewhere's hostname does not match.
    assert_eq!(listener["attachedRoutes"], 3, "{listener}");
    assert_eq!(
        listener["supportedKinds"],
        json!([{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"},
               {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}])
    );
    assert_eq!(
        conditions(&listener["conditions"]),
        [
            condition("Accepted", "True", "Accepted"),
            condition("Programmed", "True", "Programmed"),
            condition("ResolvedRefs", "True", "ResolvedRefs"),
            condition("Conflicted", "False", "NoConflicts"),
        ]
    );
    let accepted = condition("Accepted", "True", "Accepted");
    for (route, expected) in [
        (
            "ok",
            [
                accepted.clone(),
                condition("ResolvedRefs", "True", "ResolvedRefs"),
            ],
        ),
        (
            "missing",
            [
                accepted.clone(),
                condition("ResolvedRefs", "False", "BackendNotFound"),
            ],
        ),
        (
            "cross",
            [
                accepted.clone(),
                condition("ResolvedRefs", "False", "RefNotPermitted"),
            ],
        ),
        (
            "elsewhere",
            [
                condition("Accepted", "False", "NoMatchingListenerHostname"),
                condition("ResolvedRefs", "True", "ResolvedRefs"),
            ],
        ),
        (
            "ghost",
            [
                condition("Accepted", "False", "NoMatchingParent"),
                condition("ResolvedRefs", "True", "ResolvedRefs"),
            ],
        ),
    ] {
        let status = shop_route_until(&config, route, route, &expected).await;
        let parent = &status["parents"][0];
        assert_eq!(
            parent["parentRef"]["name"],
            if route == "ghost" { "nowhere" } else { "web" }
        );
        assert_eq!(parent["conditions"][0]["observedGeneration"], 1, "{status}");
    }
    let refused = object_status_until(
        &config,
        HTTP_ROUTES,
        Some("shop"),
        "refused",
        "refused",
        |s| {
            route_conditions(s).first() == Some(&condition("Accepted", "False", "UnsupportedValue"))
        },
    )
    .await;
    let message = refused["parents"][0]["conditions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("rules[0].retry"), "{message}");
    let missing = config.get(HTTP_ROUTES, Some("shop"), "missing").unwrap();
    assert_eq!(
        missing["status"]["parents"][0]["conditions"][1]["message"],
        "backend(nope.shop.svc.cluster.local) not found"
    );

    // Exactly one write per object, all by the leader.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = |c: &KubeApiServer| {
        [GATEWAY_CLASSES, GATEWAYS, HTTP_ROUTES].map(|r| c.status_writes_for(r))
    };
    assert_eq!(writes(&config), [1, 1, 6]);
    let (leader, standby) = match a_leads {
        true => (&mut a, &mut b),
        false => (&mut b, &mut a),
    };
    let written =
        |n: u64| format!("shoal_ingester_object_status_writes_total{{result=\"written\"}} {n}");
    assert!(leader.metrics().await.contains(&written(8)));
    assert!(standby.metrics().await.contains(&written(0)));

    // A ReferenceGrant resolves the cross-namespace backend: one write, that route's.
    config
        .create(json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": "shop-routes", "namespace": "other"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "shop"}],
                     "to": [{"group": "", "kind": "Service"}]},
        }))
        .unwrap();
    let resolved = [
        accepted.clone(),
        condition("ResolvedRefs", "True", "ResolvedRefs"),
    ];
    shop_route_until(&config, "cross", "the grant", &resolved).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(writes(&config), [1, 1, 7]);

    // The leader dies; the standby takes over, finds every status in place, writes nothing.
    leader.kill().await;
    standby.wait_leader().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(writes(&config), [1, 1, 7], "a takeover wrote");

    // The gateway's endpoints go: not Programmed, its address kept.
    config
        .delete(
            "endpointslices.discovery.k8s.io",
            Some("shop"),
            "web-istio-1",
        )
        .unwrap();
    let status = object_status_until(
        &config,
        GATEWAYS,
        Some("shop"),
        "web",
        "the gateway unprogrammed",
        |s| {
            conditions(&s["conditions"]).get(1)
                == Some(&condition("Programmed", "False", "AddressNotAssigned"))
        },
    )
    .await;
    assert_eq!(
        status["addresses"][0]["value"],
        "web-istio.shop.svc.cluster.local"
    );
    assert_eq!(status["conditions"][0]["reason"], "Accepted");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(writes(&config), [1, 2, 7]);
    assert!(standby.metrics().await.contains(&written(1)));
}

/// A Gateway of class `istio` in `infra` with `listeners` (YAML flow sequence).
fn gateway(name: &str, listeners: &str) -> Value {
    let listeners: Value = shoal_common::yaml::from_str(listeners).expect("listeners");
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": "infra"},
        "spec": {"gatewayClassName": "istio", "listeners": listeners},
    })
}

/// An HTTPRoute `<ns>/<name>` with `spec` (YAML).
fn route(ns: &str, name: &str, spec: &str) -> Value {
    let spec: Value = shoal_common::yaml::from_str(spec).expect("route spec");
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    })
}

/// The Gateway API conformance suite's core cases that check status alone, restated
/// here (the suite's own manifests and checks, read from gateway-api's
/// `conformance/tests`): GatewayWithAttachedRoutes, GatewayInvalidRouteKind,
/// HTTPRouteInvalidCrossNamespaceParentRef, HTTPRouteDisallowedKind,
/// HTTPRouteInvalidParentRefNotMatchingSectionName,
/// HTTPRouteInvalidParentRefNotMatchingListenerPort, HTTPRouteInvalidBackendRefUnknownKind
/// and HTTPRouteInvalidNonExistentBackendRef (their status part),
/// HTTPRouteInvalidCrossNamespaceBackendRef, and the ObservedGenerationBump cases of
/// GatewayClass, Gateway and HTTPRoute.
#[tokio::test]
async fn gateway_api_conformance_status_cases() {
    let nats = NatsServer::start().await;
    let config = config_cluster().await;
    populate(&config, "infra", json!({}), "local");
    populate(&config, "web", json!({}), "local");
    gateway_api_crds(
        &config,
        &[
            ("GatewayClass", "gatewayclasses", "Cluster"),
            ("Gateway", "gateways", "Namespaced"),
            ("HTTPRoute", "httproutes", "Namespaced"),
        ],
    );
    let class = istio_class();
    config.create(class.clone()).unwrap();
    let infra_only = "namespaces: {from: Selector, selector: {matchLabels: {kubernetes.io/metadata.name: infra}}}";
    for gw in [
        gateway(
            "attached-one",
            &format!("[{{name: http, port: 80, protocol: HTTP, allowedRoutes: {{kinds: [{{kind: HTTPRoute}}], {infra_only}}}}}]"),
        ),
        gateway(
            "attached-two",
            &format!("[{{name: http, port: 80, protocol: HTTP, hostname: foo.example.com, allowedRoutes: {{kinds: [{{kind: HTTPRoute}}], {infra_only}}}}}]"),
        ),
        gateway(
            "only-invalid-kind",
            "[{name: http, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: InvalidRoute}]}}]",
        ),
        gateway(
            "supported-and-invalid-kind",
            "[{name: http, port: 80, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}, {kind: InvalidRoute}]}}]",
        ),
        gateway("same-namespace", "[{name: http, port: 80, protocol: HTTP}]"),
        gateway(
            "tlsroutes-only",
            "[{name: tls, port: 443, protocol: TLS, tls: {mode: Passthrough}, allowedRoutes: {kinds: [{kind: TLSRoute}]}}]",
        ),
    ] {
        config.create(gw).unwrap();
    }
    let backend = "rules: [{backendRefs: [{name: web, port: 80}]}]";
    for r in [
        route("infra", "one", &format!("parentRefs: [{{name: attached-one}}]\n{backend}")),
        route("infra", "two-a", &format!("parentRefs: [{{name: attached-two}}]\n{backend}")),
        route(
            "infra",
            "two-b",
            &format!("parentRefs: [{{name: attached-two}}]\nhostnames: [foo.example.com]\n{backend}"),
        ),
        route(
            "infra",
            "not-accepted",
            &format!("parentRefs: [{{name: attached-two}}]\nhostnames: [bar.example.com]\n{backend}"),
        ),
        route("infra", "disallowed-kind", &format!("parentRefs: [{{name: tlsroutes-only}}]\n{backend}")),
        route(
            "infra",
            "wrong-section",
            &format!("parentRefs: [{{name: same-namespace, sectionName: nope}}]\n{backend}"),
        ),
        route(
            "infra",
            "wrong-port",
            &format!("parentRefs: [{{name: same-namespace, port: 81}}]\n{backend}"),
        ),
        route(
            "infra",
            "unknown-kind-backend",
            "parentRefs: [{name: same-namespace}]\nrules: [{backendRefs: [{group: unknown.example.com, kind: Unknown, name: web, port: 80}]}]",
        ),
        route(
            "infra",
            "missing-backend",
            "parentRefs: [{name: same-namespace}]\nrules: [{backendRefs: [{name: nope, port: 80}]}]",
        ),
        route(
            "infra",
            "cross-backend",
            "parentRefs: [{name: same-namespace}]\nrules: [{backendRefs: [{name: web, namespace: web, port: 80}]}]",
        ),
        route(
            "web",
            "cross-parent",
            &format!("parentRefs: [{{name: same-namespace, namespace: infra}}]\n{backend}"),
        ),
    ] {
        config.create(r).unwrap();
    }

    let _ingester = leading_ingester(&nats, &config).await;

    let listener_of = |gw: &str| {
        let gw = gw.to_string();
        let config = &config;
        async move {
            object_status_until(config, GATEWAYS, Some("infra"), &gw, &gw, |s| {
                s["listeners"][0]["conditions"].is_array()
            })
            .await["listeners"][0]
                .clone()
        }
    };
    let kinds = |l: &Value| -> Vec<String> {
        l["supportedKinds"]
            .as_array()
            .map(|k| {
                k.iter()
                    .filter_map(|k| k["kind"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let listener_condition = |l: &Value, kind: &str| -> (String, String) {
        conditions(&l["conditions"])
            .into_iter()
            .find(|(t, _, _)| t == kind)
            .map(|(_, s, r)| (s, r))
            .unwrap_or_default()
    };
    let holds = |reason: &str| ("True".to_string(), reason.to_string());

    // GatewayWithAttachedRoutes: 1 and 2 routes attached; a route whose hostname no
    // listener has is NoMatchingListenerHostname.
    let one = listener_of("attached-one").await;
    assert_eq!(
        (one["attachedRoutes"].as_u64(), kinds(&one)),
        (Some(1), vec!["HTTPRoute".to_string()]),
        "{one}"
    );
    assert_eq!(listener_condition(&one, "Accepted"), holds("Accepted"));
    assert_eq!(
        listener_condition(&one, "ResolvedRefs"),
        holds("ResolvedRefs")
    );
    let two = listener_of("attached-two").await;
    assert_eq!(two["attachedRoutes"], 2, "{two}");
    let route_reason = |ns: &'static str, name: &'static str, kind: &'static str| {
        let config = &config;
        async move {
            let status = object_status_until(config, HTTP_ROUTES, Some(ns), name, name, |s| {
                !route_conditions(s).is_empty()
            })
            .await;
            route_conditions(&status)
                .into_iter()
                .find(|(t, _, _)| t == kind)
                .map(|(_, s, r)| (s, r))
                .unwrap_or_default()
        }
    };
    let fails = |reason: &str| ("False".to_string(), reason.to_string());
    assert_eq!(
        route_reason("infra", "not-accepted", "Accepted").await,
        fails("NoMatchingListenerHostname")
    );

    // GatewayInvalidRouteKind: no supported kind and InvalidRouteKinds; HTTPRoute kept
    // beside an invalid kind.
    let only = listener_of("only-invalid-kind").await;
    assert!(kinds(&only).is_empty(), "{only}");
    assert_eq!(
        listener_condition(&only, "ResolvedRefs"),
        fails("InvalidRouteKinds")
    );
    assert_eq!(only["attachedRoutes"], 0);
    let both = listener_of("supported-and-invalid-kind").await;
    assert_eq!(kinds(&both), ["HTTPRoute"], "{both}");
    assert_eq!(
        listener_condition(&both, "ResolvedRefs"),
        fails("InvalidRouteKinds")
    );

    // HTTPRouteDisallowedKind, HTTPRouteInvalidCrossNamespaceParentRef: not allowed by the
    // listeners (references resolved), nothing attached.
    assert_eq!(
        route_reason("infra", "disallowed-kind", "Accepted").await,
        fails("NotAllowedByListeners")
    );
    assert_eq!(
        route_reason("web", "cross-parent", "Accepted").await,
        fails("NotAllowedByListeners")
    );
    assert_eq!(
        route_reason("web", "cross-parent", "ResolvedRefs").await,
        holds("ResolvedRefs")
    );
    assert_eq!(listener_of("tlsroutes-only").await["attachedRoutes"], 0);

    // HTTPRouteInvalidParentRefNotMatchingSectionName / ...ListenerPort.
    for name in ["wrong-section", "wrong-port"] {
        assert_eq!(
            route_reason("infra", name, "Accepted").await,
            fails("NoMatchingParent"),
            "{name}"
        );
    }

    // Backends: an unknown kind, a missing Service, another namespace's without a grant;
    // each route is still accepted.
    for (name, reason) in [
        ("unknown-kind-backend", "InvalidKind"),
        ("missing-backend", "BackendNotFound"),
        ("cross-backend", "RefNotPermitted"),
    ] {
        assert_eq!(
            route_reason("infra", name, "Accepted").await,
            holds("Accepted"),
            "{name}"
        );
        assert_eq!(
            route_reason("infra", name, "ResolvedRefs").await,
            fails(reason),
            "{name}"
        );
    }
    // same-namespace: the four routes above that reach its listener.
    assert_eq!(listener_of("same-namespace").await["attachedRoutes"], 3);

    // ObservedGenerationBump (GatewayClass, Gateway, HTTPRoute): a spec change bumps the
    // generation, and every condition follows it.
    let mut bumped = class;
    bumped["spec"]["description"] = json!("new");
    config.apply(bumped).unwrap();
    config
        .apply(gateway(
            "same-namespace",
            "[{name: http, port: 8080, protocol: HTTP}]",
        ))
        .unwrap();
    config
        .apply(route("infra", "one", "parentRefs: [{name: attached-one}]\nrules: [{backendRefs: [{name: web, port: 80, weight: 2}]}]"))
        .unwrap();
    let at_generation_2 = |conditions: &Value| {
        conditions
            .as_array()
            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["observedGeneration"] == 2))
    };
    object_status_until(
        &config,
        GATEWAY_CLASSES,
        None,
        "istio",
        "the class at generation 2",
        |s| at_generation_2(&s["conditions"]),
    )
    .await;
    object_status_until(
        &config,
        GATEWAYS,
        Some("infra"),
        "same-namespace",
        "the gateway at generation 2",
        |s| at_generation_2(&s["conditions"]) && at_generation_2(&s["listeners"][0]["conditions"]),
    )
    .await;
    object_status_until(
        &config,
        HTTP_ROUTES,
        Some("infra"),
        "one",
        "the route at generation 2",
        |s| at_generation_2(&s["parents"][0]["conditions"]),
    )
    .await;
}

/// A backend Service that exists only in a remote cluster the ingester watches resolves
/// (the proxies route to it there): `BackendNotFound` until that cluster is added, then
/// `ResolvedRefs`.
#[tokio::test]
async fn gateway_api_backends_in_remote_clusters_resolve() {
    let nats = NatsServer::start().await;
    let config = config_cluster().await;
    populate(&config, "shop", json!({}), "local");
    let east = KubeApiServer::builder().name("east").start().await;
    populate(&east, "shop", json!({}), "east");
    east.create(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {"clusterIP": "10.0.0.30", "ports": [{"name": "tcp", "port": 5432}]},
    }))
    .unwrap();
    gateway_api_crds(
        &config,
        &[
            ("GatewayClass", "gatewayclasses", "Cluster"),
            ("Gateway", "gateways", "Namespaced"),
            ("HTTPRoute", "httproutes", "Namespaced"),
        ],
    );
    config.create(kube_gateway(80)).unwrap();
    config
        .create(http_route(
            "remote",
            "web",
            json!([]),
            json!({"name": "db", "port": 5432}),
        ))
        .unwrap();
    let _ingester = leading_ingester(&nats, &config).await;
    let accepted = condition("Accepted", "True", "Accepted");
    let resolved = [
        accepted.clone(),
        condition("ResolvedRefs", "False", "BackendNotFound"),
    ];
    shop_route_until(&config, "remote", "BackendNotFound", &resolved).await;
    config
        .apply(remote_secret(
            "istio-remote-secret",
            &[("east", east.kubeconfig())],
        ))
        .unwrap();
    let resolved = [
        accepted.clone(),
        condition("ResolvedRefs", "True", "ResolvedRefs"),
    ];
    shop_route_until(&config, "remote", "resolved in east", &resolved).await;
}
