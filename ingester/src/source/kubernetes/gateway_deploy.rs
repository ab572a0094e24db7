//! Automated deployment of Gateway API Gateways (`--gateway-deployment`), as istiod's
//! gateway deployment controller does it: for each Gateway of an Istio class (`istio`, or a
//! GatewayClass whose `controllerName` is `istio.io/gateway-controller`) the leader creates a
//! ServiceAccount, a Deployment (one replica of the proxy image) and a Service of type
//! LoadBalancer (the status port and the listeners' ports), all named `<gateway>-<class>`
//! and owned by the Gateway (`controller: true`), so Kubernetes garbage-collects them with it.
//!
//! - A Gateway with `spec.addresses` never gets here: admission refuses the field, so every
//!   Gateway shoal serves is one istiod would deploy.
//! - What each Gateway needs is computed from the watch events ([`GatewayBook`]); the
//!   [`GatewayDeployer`] compares it with the objects in the cluster and writes only what
//!   differs (a merge patch of the fields shoal sets; fields the API server or others add are
//!   left alone), so a relist, a restart or a takeover writes nothing.
//! - When a Gateway is deleted (or stops being of an Istio class) its objects are deleted
//!   explicitly too, those that carry shoal's `gateway.istio.io/managed` label and are owned
//!   by the Gateway; the owner references cover the Gateways deleted while no leader ran.
//! - Only the leader writes, only in namespaces the discovery selectors select, from its own
//!   task: a failed write is logged, counted and retried, and never holds up ingestion.

use super::metrics::{DeploymentWrite, KubeMetrics};
use super::object_status::Selection;
use super::reduce::ObjKey;
use crate::coordination::lease::Leadership;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use serde_json::{json, Value};
use shoal_common::model::{KubeGateway, GATEWAY_NAME_LABEL, ISTIO_CLASS, ISTIO_CONTROLLER};
use shoal_common::time::sleep_until;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The proxy image when `--gateway-proxy-image` is not given: Istio's, which runs the
/// gateway as istiod's deployment does (`pilot-agent proxy router`).
pub const DEFAULT_PROXY_IMAGE: &str = "docker.io/istio/proxyv2:1.24.2";
/// The label istiod puts on what it deploys, and shoal too: only objects carrying it are
/// ever changed or deleted.
pub const MANAGED_LABEL: &str = "gateway.istio.io/managed";
/// The value of [`MANAGED_LABEL`] (istiod's).
pub const MANAGED_VALUE: &str = "istio.io-gateway-controller";
/// The older gateway name label, which istiod still sets on its pods.
pub const ISTIO_GATEWAY_NAME_LABEL: &str = "istio.io/gateway-name";
const CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";
/// The port of the proxy's readiness endpoint (Istio's status port).
const STATUS_PORT: u32 = 15021;
/// A failed write is tried again after this long.
const RETRY: Duration = Duration::from_secs(5);
/// A request that takes longer than this counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Every deployed Gateway's objects are read again this often (reads only: what still
/// says what the Gateway asks for is not written), so an object deleted or edited by hand
/// is put back.
const RESYNC: Duration = Duration::from_secs(300);

/// Why a deployment request failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The API server refused the request.
    #[error("{reason} ({code}): {message}")]
    Api {
        /// The HTTP status.
        code: u16,
        /// The Status reason.
        reason: String,
        /// The Status message.
        message: String,
    },
    /// The request did not get an answer.
    #[error("request failed: {0}")]
    Client(#[source] kube::Error),
    /// The request took longer than [`WRITE_TIMEOUT`].
    #[error("timed out")]
    Timeout,
    /// An object did not convert.
    #[error("object does not convert: {0}")]
    Convert(#[source] serde_json::Error),
    /// An object of that name exists that no gateway controller manages.
    #[error("exists and is not managed by a gateway controller")]
    NotManaged,
}

/// What the deployed objects are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployConfig {
    /// The proxy container's image.
    pub proxy_image: String,
    /// The cluster ID the proxies announce (`ISTIO_META_CLUSTER_ID`).
    pub cluster_id: String,
}

/// A Gateway as the watch last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeenGateway {
    uid: String,
    spec: KubeGateway,
}

#[derive(Debug, Default)]
struct Book {
    gateways: BTreeMap<ObjKey, SeenGateway>,
    /// The uid of each Gateway the watch returned (the model has none): noted in the watch
    /// task, before its change reaches [`GatewayBook::observe_gateway`]. Pruned when the
    /// Gateway that carried it is forgotten; a uid noted since (the name recreated before
    /// the delete reached the book) is kept, or the new Gateway would never deploy. A
    /// Gateway that was never accepted keeps its entry until its name is seen again.
    uids: BTreeMap<ObjKey, String>,
    /// GatewayClass name → controller name.
    classes: BTreeMap<String, String>,
}

impl Book {
    /// Drops the noted uid of `key` if it is still `uid` (the forgotten Gateway's).
    fn forget_uid(&mut self, key: &ObjKey, uid: &str) {
        if self.uids.get(key).map(String::as_str) == Some(uid) {
            self.uids.remove(key);
        }
    }
}

/// The Gateways and GatewayClasses, updated from watch events (synchronously, in the watch
/// tasks) and read by the [`GatewayDeployer`]. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct GatewayBook {
    book: Arc<Mutex<Book>>,
    notify: Arc<Notify>,
}

impl GatewayBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes the uid of a Gateway the watch returned.
    pub fn note_uid(&self, key: &ObjKey, uid: Option<&str>) {
        if let Some(uid) = uid.filter(|u| !u.is_empty()) {
            let mut book = self.lock();
            if book.uids.get(key).map(String::as_str) != Some(uid) {
                book.uids.insert(key.clone(), uid.to_string());
            }
        }
    }

    /// Records an accepted version of a Gateway, in the order of the config side's
    /// changes (a rejected one keeps the previous good version's objects, as its config is
    /// kept).
    pub fn observe_gateway(&self, key: &ObjKey, spec: &KubeGateway) {
        let mut book = self.lock();
        let Some(uid) = book.uids.get(key).cloned() else {
            return; // no owner reference without a uid; every served object has one
        };
        let seen = SeenGateway {
            uid,
            spec: spec.clone(),
        };
        let changed = book.gateways.insert(key.clone(), seen.clone()) != Some(seen);
        drop(book);
        if changed {
            self.notify.notify_one();
        }
    }

    /// Forgets a deleted Gateway: its objects are deleted.
    pub fn forget_gateway(&self, key: &ObjKey) {
        let mut book = self.lock();
        let Some(gone) = book.gateways.remove(key) else {
            return;
        };
        book.forget_uid(key, &gone.uid);
        drop(book);
        self.notify.notify_one();
    }

    /// Keeps only the Gateways for which `keep` holds (after a relist, the ones it
    /// listed): the others' objects are deleted.
    pub fn retain_gateways(&self, keep: impl Fn(&ObjKey) -> bool) {
        let mut book = self.lock();
        let gone: Vec<(ObjKey, String)> = book
            .gateways
            .iter()
            .filter(|(key, _)| !keep(key))
            .map(|(key, g)| (key.clone(), g.uid.clone()))
            .collect();
        for (key, uid) in &gone {
            book.gateways.remove(key);
            book.forget_uid(key, uid);
        }
        if !gone.is_empty() {
            drop(book);
            self.notify.notify_one();
        }
    }

    /// Forgets every Gateway and uid: the kind's CRD is gone (so are its objects).
    pub fn forget_gateways(&self) {
        let mut book = self.lock();
        book.uids.clear();
        book.gateways.clear();
        drop(book);
        self.notify.notify_one();
    }

    /// Keeps only the GatewayClasses for which `keep` holds.
    pub fn retain_classes(&self, keep: impl Fn(&str) -> bool) {
        let mut book = self.lock();
        let before = book.classes.len();
        book.classes.retain(|name, _| keep(name));
        if book.classes.len() != before {
            drop(book);
            self.notify.notify_one();
        }
    }

    /// Records a GatewayClass's controller.
    pub fn observe_class(&self, name: &str, controller: &str) {
        let changed = self
            .lock()
            .classes
            .insert(name.to_string(), controller.to_string())
            .as_deref()
            != Some(controller);
        if changed {
            self.notify.notify_one();
        }
    }

    /// Forgets a deleted GatewayClass.
    pub fn forget_class(&self, name: &str) {
        if self.lock().classes.remove(name).is_some() {
            self.notify.notify_one();
        }
    }

    /// The objects every deployed Gateway of the selected namespaces needs.
    fn desired(&self, cfg: &DeployConfig, selected: &BTreeSet<String>) -> Desired {
        let book = self.lock();
        book.gateways
            .iter()
            .filter(|((ns, _), _)| selected.contains(ns))
            .filter(|(_, g)| is_istio_class(&g.spec.gateway_class_name, &book.classes))
            .map(|(key, g)| (key.clone(), gateway_objects(cfg, key, g)))
            .collect()
    }
}

/// Whether Gateways of this class are istiod's (and so shoal's) to deploy.
fn is_istio_class(class: &str, classes: &BTreeMap<String, String>) -> bool {
    class == ISTIO_CLASS || classes.get(class).map(String::as_str) == Some(ISTIO_CONTROLLER)
}

/// The three kinds deployed per Gateway, in creation order (the Deployment names the
/// ServiceAccount).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    ServiceAccount,
    Deployment,
    Service,
}

impl Part {
    const ALL: [Part; 3] = [Part::ServiceAccount, Part::Deployment, Part::Service];

    fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Part::ServiceAccount => ("", "v1", "ServiceAccount", "serviceaccounts"),
            Part::Deployment => ("apps", "v1", "Deployment", "deployments"),
            Part::Service => ("", "v1", "Service", "services"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    fn as_str(self) -> &'static str {
        match self {
            Part::ServiceAccount => "ServiceAccount",
            Part::Deployment => "Deployment",
            Part::Service => "Service",
        }
    }
}

/// One Gateway's objects: its uid (to recognize them) and each part's object.
#[derive(Debug, Clone, PartialEq)]
struct GatewayObjects {
    name: String,
    uid: String,
    objects: Vec<(Part, Value)>,
}

type Desired = BTreeMap<ObjKey, GatewayObjects>;

/// The name istiod gives a Gateway's objects.
pub fn deployment_name(gateway: &str, class: &str) -> String {
    format!("{gateway}-{class}")
}

/// The Service port name of a listener, as istiod derives it: dots become dashes, at most 63
/// characters, made unique with the port number.
fn port_name(listener: &str, port: u32, used: &mut BTreeSet<String>) -> String {
    let mut name: String = listener.replace('.', "-").chars().take(63).collect();
    if name.is_empty() {
        name = format!("port-{port}");
    }
    let mut candidate = name.clone();
    let mut suffix = format!("-{port}");
    while used.contains(&candidate) {
        let keep = 63usize.saturating_sub(suffix.len());
        candidate = format!("{}{suffix}", name.chars().take(keep).collect::<String>());
        suffix.push('x');
    }
    used.insert(candidate.clone());
    candidate
}

/// The ServiceAccount, Deployment and Service of one Gateway.
fn gateway_objects(cfg: &DeployConfig, key: &ObjKey, g: &SeenGateway) -> GatewayObjects {
    let (namespace, gateway) = key;
    let class = &g.spec.gateway_class_name;
    let name = deployment_name(gateway, class);
    let owner = json!([{
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "name": gateway,
        "uid": g.uid,
        "controller": true,
    }]);
    let metadata = |labels: Value| json!({"name": name, "namespace": namespace, "labels": labels, "ownerReferences": owner});
    let service_account = json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": metadata(json!({GATEWAY_NAME_LABEL: gateway, MANAGED_LABEL: MANAGED_VALUE})),
    });
    let field = |path: &str| json!({"valueFrom": {"fieldRef": {"fieldPath": path}}});
    let env = |name: &str, value: Value| {
        let mut e = value;
        e["name"] = json!(name);
        e
    };
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": metadata(json!({
            GATEWAY_NAME_LABEL: gateway,
            ISTIO_GATEWAY_NAME_LABEL: gateway,
            MANAGED_LABEL: MANAGED_VALUE,
        })),
        "spec": {
            "selector": {"matchLabels": {GATEWAY_NAME_LABEL: gateway}},
            "template": {
                "metadata": {
                    "labels": {
                        GATEWAY_NAME_LABEL: gateway,
                        ISTIO_GATEWAY_NAME_LABEL: gateway,
                        MANAGED_LABEL: MANAGED_VALUE,
                        "service.istio.io/canonical-name": name,
                        // The proxy is the pod's only container: no sidecar in it.
                        "sidecar.istio.io/inject": "false",
                    },
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "15020",
                        "prometheus.io/path": "/stats/prometheus",
                    },
                },
                "spec": {
                    "serviceAccountName": name,
                    // Listeners below 1024 without root or capabilities, as istiod does.
                    "securityContext": {"sysctls": [
                        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"},
                    ]},
                    "containers": [{
                        "name": "istio-proxy",
                        "image": cfg.proxy_image,
                        "args": ["proxy", "router", "--domain",
                                 "$(POD_NAMESPACE).svc.cluster.local"],
                        "ports": [
                            {"name": "status-port", "containerPort": STATUS_PORT, "protocol": "TCP"},
                            {"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"},
                        ],
                        "env": [
                            env("POD_NAME", field("metadata.name")),
                            env("POD_NAMESPACE", field("metadata.namespace")),
                            env("INSTANCE_IP", field("status.podIP")),
                            env("SERVICE_ACCOUNT", field("spec.serviceAccountName")),
                            env("ISTIO_META_WORKLOAD_NAME", json!({"value": name})),
                            env("ISTIO_META_CLUSTER_ID", json!({"value": cfg.cluster_id})),
                        ],
                        "readinessProbe": {
                            "httpGet": {"path": "/healthz/ready", "port": STATUS_PORT},
                            "periodSeconds": 15,
                            "failureThreshold": 4,
                        },
                        // Where the Istio agent looks for its token, the mesh root and its
                        // scratch space, as istiod's gateway template mounts them.
                        "volumeMounts": [
                            {"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"},
                            {"name": "credential-socket", "mountPath": "/var/run/secrets/credential-uds"},
                            {"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"},
                            {"name": "istio-envoy", "mountPath": "/etc/istio/proxy"},
                            {"name": "istio-data", "mountPath": "/var/lib/istio/data"},
                            {"name": "istio-podinfo", "mountPath": "/etc/istio/pod"},
                            {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
                            {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"},
                        ],
                    }],
                    "volumes": [
                        {"name": "workload-socket", "emptyDir": {}},
                        {"name": "credential-socket", "emptyDir": {}},
                        {"name": "workload-certs", "emptyDir": {}},
                        {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
                        {"name": "istio-data", "emptyDir": {}},
                        {"name": "istio-podinfo", "downwardAPI": {"items": [
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                        ]}},
                        // The token shoal's server verifies (audience istio-ca, 12 h).
                        {"name": "istio-token", "projected": {"sources": [{"serviceAccountToken": {
                            "path": "istio-token", "audience": "istio-ca", "expirationSeconds": 43200,
                        }}]}},
                        // The mesh root the ingester writes with --ca-root-cert.
                        {"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}},
                    ],
                },
            },
        },
    });
    let mut used = BTreeSet::from(["status-port".to_string()]);
    let mut ports = vec![json!({"name": "status-port", "port": STATUS_PORT,
                                "protocol": "TCP", "appProtocol": "tcp"})];
    let mut seen_ports = BTreeSet::new();
    for l in &g.spec.listeners {
        if !seen_ports.insert(l.port) {
            continue; // one Service port per port, as istiod does
        }
        ports.push(json!({
            "name": port_name(&l.name, l.port, &mut used),
            "port": l.port,
            "protocol": "TCP",
            "appProtocol": l.protocol.to_ascii_lowercase(),
        }));
    }
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": metadata(json!({
            GATEWAY_NAME_LABEL: gateway,
            CLASS_LABEL: class,
            MANAGED_LABEL: MANAGED_VALUE,
        })),
        "spec": {
            "type": "LoadBalancer",
            "selector": {GATEWAY_NAME_LABEL: gateway},
            "ports": ports,
        },
    });
    GatewayObjects {
        name,
        uid: g.uid.clone(),
        objects: vec![
            (Part::ServiceAccount, service_account),
            (Part::Deployment, deployment),
            (Part::Service, service),
        ],
    }
}

/// Whether `have` already says everything `want` says: every key of an object (recursively),
/// every element of a list (same length), equal scalars. What the API server or others add
/// (defaults, a clusterIP, annotations) does not count as a difference.
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| contains(hv, wv))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(hv, wv)| contains(hv, wv))
        }
        (h, w) => h == w,
    }
}

/// Whether an object in the cluster is shoal's (or istiod's) for the Gateway with `uid`:
/// labelled as managed and owned by that Gateway. Anything else is never changed or deleted.
fn is_managed_for(object: &Value, uid: &str) -> bool {
    let managed = object.pointer(&format!(
        "/metadata/labels/{}",
        MANAGED_LABEL.replace('/', "~1")
    )) == Some(&json!(MANAGED_VALUE));
    let owned = object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid));
    managed && owned
}

/// Writes the [`GatewayBook`]'s objects while this replica leads.
pub struct GatewayDeployer {
    client: Client,
    cfg: DeployConfig,
    book: GatewayBook,
    leadership: Leadership,
    selection: watch::Receiver<Selection>,
    metrics: KubeMetrics,
    /// What was last found or made true in the cluster, per Gateway: unchanged Gateways are
    /// not even read again. Cleared when leadership is lost (others may write meanwhile).
    applied: Desired,
}

impl GatewayDeployer {
    /// A deployer writing through `client` what `book` asks for, in the namespaces
    /// `selection` names.
    pub fn new(
        client: Client,
        cfg: DeployConfig,
        book: GatewayBook,
        leadership: Leadership,
        selection: watch::Receiver<Selection>,
        metrics: KubeMetrics,
    ) -> GatewayDeployer {
        GatewayDeployer {
            client,
            cfg,
            book,
            leadership,
            selection,
            metrics,
            applied: Desired::new(),
        }
    }

    /// Reconciles whenever the book, the leadership or the selection changes (and after a
    /// failure), until the task is dropped.
    pub async fn run(mut self) {
        let mut retry: Option<Instant> = None;
        let mut selection_open = true;
        let mut resync = tokio::time::interval_at(Instant::now() + RESYNC, RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Read every Gateway's objects again this round, not only the changed ones.
        let mut verify = false;
        loop {
            tokio::select! {
                () = self.book.notify.notified() => {}
                () = self.leadership.changed() => {}
                changed = self.selection.changed(), if selection_open => {
                    selection_open = changed.is_ok();
                }
                () = sleep_until(retry), if retry.is_some() => {}
                _ = resync.tick() => verify = true,
            }
            retry = None;
            if !self.leadership.leads() {
                self.applied.clear();
                continue;
            }
            let Some(selected) = self.selection.borrow().clone() else {
                continue;
            };
            let desired = self.book.desired(&self.cfg, &selected);
            if !self.reconcile(&desired, std::mem::take(&mut verify)).await {
                retry = Some(Instant::now() + RETRY);
            }
        }
    }

    /// Makes the cluster hold `desired`'s objects (read again only for changed Gateways,
    /// or all of them with `verify`), and deletes those of Gateways it no longer holds;
    /// false when something failed (to be retried).
    async fn reconcile(&mut self, desired: &Desired, verify: bool) -> bool {
        let mut ok = true;
        let gone: Vec<(ObjKey, GatewayObjects)> = self
            .applied
            .iter()
            .filter(|(k, _)| !desired.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, objects) in gone {
            if !self.leadership.leads() {
                return true; // the next term starts over
            }
            if self.delete(&key, &objects).await {
                self.applied.remove(&key);
            } else {
                ok = false;
            }
        }
        for (key, objects) in desired {
            if !verify && self.applied.get(key) == Some(objects) {
                continue;
            }
            if !self.leadership.leads() {
                return true;
            }
            if self.apply(key, objects).await {
                self.applied.insert(key.clone(), objects.clone());
            } else {
                ok = false;
            }
        }
        ok
    }

    fn api(&self, part: Part, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &part.resource())
    }

    /// Creates or updates one Gateway's objects; false when a write failed.
    async fn apply(&self, key: &ObjKey, objects: &GatewayObjects) -> bool {
        let (namespace, gateway) = key;
        let mut ok = true;
        for (part, want) in &objects.objects {
            let result = self.apply_one(*part, namespace, &objects.name, want).await;
            let kind = part.as_str();
            let name = &objects.name;
            match result {
                Ok(None) => {}
                Ok(Some(result)) => {
                    info!(%namespace, %gateway, %kind, %name, result = result.as_str(), "gateway object written");
                    self.metrics.gateway_deployment_written(result);
                }
                Err(error @ (DeployError::NotManaged | DeployError::Api { code: 422, .. })) => {
                    // Not retried every few seconds: someone else's object, or one the API
                    // server finds invalid (a name over 63 characters), takes a person to
                    // resolve. Read again when the Gateway changes, and at the next resync.
                    warn!(%namespace, %gateway, %kind, %name, %error, "cannot deploy the gateway object; left alone until the Gateway changes");
                    self.metrics
                        .gateway_deployment_written(DeploymentWrite::Error);
                }
                Err(error) => {
                    warn!(%namespace, %gateway, %kind, %name, %error, "cannot deploy the gateway object; retrying later");
                    self.metrics
                        .gateway_deployment_written(DeploymentWrite::Error);
                    ok = false;
                }
            }
        }
        ok
    }

    /// Creates the object, or patches it when it does not say what `want` says yet; the
    /// write made, if any.
    async fn apply_one(
        &self,
        part: Part,
        namespace: &str,
        name: &str,
        want: &Value,
    ) -> Result<Option<DeploymentWrite>, DeployError> {
        let api = self.api(part, namespace);
        let existing = timed(api.get_opt(name)).await?;
        match existing {
            None => {
                let mut body = want.clone();
                if part == Part::Deployment {
                    // One replica to start with; never reset later (an autoscaler or an
                    // operator may scale it).
                    body["spec"]["replicas"] = json!(1);
                }
                let object: DynamicObject =
                    serde_json::from_value(body).map_err(DeployError::Convert)?;
                timed(api.create(&PostParams::default(), &object)).await?;
                Ok(Some(DeploymentWrite::Created))
            }
            Some(existing) => {
                let have = serde_json::to_value(&existing).map_err(DeployError::Convert)?;
                if contains(&have, want) {
                    return Ok(None);
                }
                let managed = have.pointer(&format!(
                    "/metadata/labels/{}",
                    MANAGED_LABEL.replace('/', "~1")
                ));
                if managed != Some(&json!(MANAGED_VALUE)) {
                    // Someone else's object of that name: left alone, as istiod does.
                    return Err(DeployError::NotManaged);
                }
                timed(api.patch(name, &PatchParams::default(), &Patch::Merge(want))).await?;
                Ok(Some(DeploymentWrite::Updated))
            }
        }
    }

    /// Deletes a gone Gateway's objects (those still managed for it); false when a delete
    /// failed.
    async fn delete(&self, key: &ObjKey, objects: &GatewayObjects) -> bool {
        let (namespace, gateway) = key;
        let mut ok = true;
        for part in Part::ALL.into_iter().rev() {
            let kind = part.as_str();
            let name = &objects.name;
            let api = self.api(part, namespace);
            let result = async {
                let Some(existing) = timed(api.get_opt(name)).await? else {
                    return Ok(false);
                };
                let have = serde_json::to_value(&existing).map_err(DeployError::Convert)?;
                if !is_managed_for(&have, &objects.uid) {
                    return Ok(false);
                }
                match timed(api.delete(name, &DeleteParams::default())).await {
                    Ok(_) => Ok(true),
                    Err(DeployError::Api { code: 404, .. }) => Ok(false),
                    Err(e) => Err(e),
                }
            }
            .await;
            match result {
                Ok(false) => {
                    debug!(%namespace, %gateway, %kind, %name, "gateway object already gone")
                }
                Ok(true) => {
                    info!(%namespace, %gateway, %kind, %name, "gateway object deleted");
                    self.metrics
                        .gateway_deployment_written(DeploymentWrite::Deleted);
                }
                Err(error) => {
                    warn!(%namespace, %gateway, %kind, %name, %error, "cannot delete the gateway object; retrying later");
                    self.metrics
                        .gateway_deployment_written(DeploymentWrite::Error);
                    ok = false;
                }
            }
        }
        ok
    }
}

/// A Kubernetes request with [`WRITE_TIMEOUT`].
async fn timed<T>(
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, DeployError> {
    match tokio::time::timeout(WRITE_TIMEOUT, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(kube::Error::Api(status))) => Err(DeployError::Api {
            code: status.code,
            reason: status.reason,
            message: status.message,
        }),
        Ok(Err(error)) => Err(DeployError::Client(error)),
        Err(_) => Err(DeployError::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_common::model::Listener;

    fn cfg() -> DeployConfig {
        DeployConfig {
            proxy_image: "proxy:1".into(),
            cluster_id: "main".into(),
        }
    }

    fn listener(name: &str, port: u32, protocol: &str) -> Listener {
        Listener {
            name: name.into(),
            port,
            protocol: protocol.into(),
            ..Default::default()
        }
    }

    fn gateway(class: &str, listeners: Vec<Listener>) -> SeenGateway {
        SeenGateway {
            uid: "uid-1".into(),
            spec: KubeGateway {
                gateway_class_name: class.into(),
                listeners,
            },
        }
    }

    fn key() -> ObjKey {
        ("shop".into(), "web".into())
    }

    #[test]
    fn objects_are_named_labelled_and_owned_as_istiod_makes_them() {
        let g = gateway(
            "istio",
            vec![
                listener("http", 80, "HTTP"),
                listener("a.b", 443, "HTTPS"),
                listener("again", 80, "HTTP"),
            ],
        );
        let objects = gateway_objects(&cfg(), &key(), &g);
        assert_eq!(objects.name, "web-istio");
        for (part, object) in &objects.objects {
            assert_eq!(object["metadata"]["name"], "web-istio", "{part:?}");
            assert_eq!(object["metadata"]["namespace"], "shop");
            assert_eq!(
                object["metadata"]["labels"][GATEWAY_NAME_LABEL], "web",
                "{part:?}"
            );
            let owner = &object["metadata"]["ownerReferences"][0];
            assert_eq!(
                (&owner["kind"], &owner["uid"], &owner["controller"]),
                (&json!("Gateway"), &json!("uid-1"), &json!(true))
            );
            assert!(is_managed_for(object, "uid-1"));
            assert!(!is_managed_for(object, "uid-2"));
        }
        let deployment = &objects.objects[1].1;
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod_labels[GATEWAY_NAME_LABEL], "web");
        assert_eq!(pod_labels[ISTIO_GATEWAY_NAME_LABEL], "web");
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "proxy:1"
        );
        let service = &objects.objects[2].1;
        assert_eq!(service["spec"]["type"], "LoadBalancer");
        let ports: Vec<(&str, u64)> = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["port"].as_u64().unwrap()))
            .collect();
        assert_eq!(ports, [("status-port", 15021), ("http", 80), ("a-b", 443)]);
    }

    #[test]
    fn only_istio_classes_are_deployed() {
        let book = GatewayBook::default();
        let selected = BTreeSet::from(["shop".to_string()]);
        book.note_uid(&key(), Some("u"));
        book.observe_gateway(&key(), &gateway("other", vec![]).spec);
        assert!(book.desired(&cfg(), &selected).is_empty());
        book.observe_class("other", ISTIO_CONTROLLER);
        assert_eq!(book.desired(&cfg(), &selected).len(), 1);
        assert!(
            book.desired(&cfg(), &BTreeSet::new()).is_empty(),
            "not selected"
        );
        book.forget_class("other");
        assert!(book.desired(&cfg(), &selected).is_empty());
        book.observe_gateway(&key(), &gateway("istio", vec![]).spec);
        assert_eq!(book.desired(&cfg(), &selected).len(), 1);
        book.forget_gateway(&key());
        assert!(book.desired(&cfg(), &selected).is_empty());
        // A relist that no longer lists it, or its CRD gone: forgotten.
        book.observe_gateway(&key(), &gateway("istio", vec![]).spec);
        book.retain_gateways(|k| *k != key());
        assert!(book.desired(&cfg(), &selected).is_empty());
    }

    #[test]
    fn uids_are_pruned_with_their_gateway() {
        let book = GatewayBook::default();
        let spec = gateway("istio", vec![]).spec;
        book.note_uid(&key(), Some("u1"));
        book.observe_gateway(&key(), &spec);
        book.forget_gateway(&key());
        assert!(book.lock().uids.is_empty(), "deleted: its uid goes");

        // Recreated before the delete reached the book: the new uid stays, and the new
        // Gateway deploys with it.
        book.note_uid(&key(), Some("u1"));
        book.observe_gateway(&key(), &spec);
        book.note_uid(&key(), Some("u2"));
        book.forget_gateway(&key());
        assert_eq!(book.lock().uids.get(&key()).map(String::as_str), Some("u2"));
        book.observe_gateway(&key(), &spec);
        assert_eq!(book.lock().gateways[&key()].uid, "u2");

        // A relist that no longer lists it.
        book.retain_gateways(|k| *k != key());
        assert!(book.lock().uids.is_empty());
        assert!(book.lock().gateways.is_empty());
    }

    #[test]
    fn port_names_are_unique() {
        let mut used = BTreeSet::from(["status-port".to_string()]);
        assert_eq!(port_name("status-port", 80, &mut used), "status-port-80");
        assert_eq!(port_name("a.b", 81, &mut used), "a-b");
        assert_eq!(port_name("a-b", 82, &mut used), "a-b-82");
        assert_eq!(port_name(&"x".repeat(70), 83, &mut used).len(), 63);
    }

    #[test]
    fn what_the_server_adds_is_no_difference() {
        let want = json!({"spec": {"ports": [{"port": 80}], "type": "LoadBalancer"}});
        let have = json!({"spec": {"ports": [{"port": 80, "targetPort": 80}],
                                   "type": "LoadBalancer", "clusterIP": "10.0.0.1"}});
        assert!(contains(&have, &want));
        let moved = json!({"spec": {"ports": [{"port": 8080, "targetPort": 80}],
                                    "type": "LoadBalancer"}});
        assert!(!contains(&moved, &want));
        let more = json!({"spec": {"ports": [{"port": 80}, {"port": 81}], "type": "LoadBalancer"}});
        assert!(!contains(&more, &want));
    }
}
