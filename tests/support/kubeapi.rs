//! A Kubernetes-API-compatible test server: one [`KubeApiServer`] is one cluster, serving the
//! real list/watch protocol over plain HTTP/1.1 on `127.0.0.1`, so Kubernetes-facing code
//! (kube-rs clients, `kube::runtime::watcher`, reflectors, discovery) is tested against the
//! wire protocol rather than a mock of the client.
//!
//! ```no_run
//! # async fn example() {
//! use k8s_openapi::api::core::v1::Pod;
//! use shoal_tests::kubeapi::KubeApiServer;
//!
//! let cluster = KubeApiServer::start().await;
//! let pods: kube::Api<Pod> = kube::Api::namespaced(cluster.client(), "default");
//! cluster
//!     .apply(serde_json::json!({
//!         "apiVersion": "v1", "kind": "Pod",
//!         "metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}},
//!         "status": {"podIP": "10.0.0.1"},
//!     }))
//!     .unwrap();
//! assert!(pods.get_opt("web-1").await.unwrap().is_some());
//! let kubeconfig = cluster.kubeconfig(); // for a multicluster Secret
//! # }
//! ```
//!
//! # Resources
//!
//! core/v1 `namespaces`, `nodes`, `pods`, `services`, `serviceaccounts`, `secrets`,
//! `configmaps`; `apps/v1` `deployments`;
//! `discovery.k8s.io/v1` `endpointslices`; `coordination.k8s.io/v1` `leases`;
//! `apiextensions.k8s.io/v1` `customresourcedefinitions`; and the custom resources of every
//! CRD that exists, at each served version (Istio's `networking.istio.io` v1/v1beta1/v1alpha3
//! kinds, for example). A custom resource whose CRD does not exist is a 404, as on a real
//! server, and appears in discovery as soon as its CRD is created.
//!
//! # What is faithful to the real API server
//!
//! - **Paths and verbs**: namespaced and cluster-wide collections, objects, the `status`
//!   subresource; GET (get, list, watch), POST, PUT, PATCH, DELETE, DELETE on a collection;
//!   `dryRun=All`; the deprecated `/watch/` prefix.
//! - **Errors** are `Status` objects with the real codes, reasons and wording: 404 NotFound,
//!   409 AlreadyExists, 409 Conflict (stale `metadata.resourceVersion` on PUT/PATCH, failed
//!   delete preconditions), 422 Invalid, 400 BadRequest (bad selectors, bodies, parameters),
//!   410 Expired, 405, 415, 504 for a resourceVersion the server has not reached.
//! - **Resource versions**: one global counter per server (etcd's revision); every write gets
//!   a new one in `metadata.resourceVersion`; a list's `metadata.resourceVersion` is the
//!   revision it was read at. Writes that change nothing are no-ops (no new revision, no
//!   event). Create fills `uid`, `creationTimestamp`, `generation` (bumped when anything but
//!   metadata and status changes); setting `resourceVersion` on create is an error.
//! - **Lists**: `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`, `>`, `<`),
//!   `fieldSelector` (`metadata.name`, `metadata.namespace` and some per-kind fields;
//!   others are 400 "field label not supported"), `limit`/`continue` pagination with
//!   consistent snapshots (every page is read at the revision of the first page; a token
//!   older than the event history is 410 Expired), `remainingItemCount` without selectors,
//!   `resourceVersion` + `resourceVersionMatch` (`NotOlderThan`, `Exact`, and the legacy
//!   semantics when the match is unset), items in namespace/name order.
//! - **Watches**: chunked newline-delimited JSON events (`ADDED`, `MODIFIED`, `DELETED`,
//!   `BOOKMARK`, `ERROR`); `resourceVersion` unset or `0` starts with synthetic ADDED events
//!   for the current state; `resourceVersion=N` replays the events after N from a bounded
//!   history, and a version older than the history gets HTTP 200 and one `ERROR` event with a
//!   410 `Expired` Status, then the end of the stream (what kube-rs turns into a relist).
//!   `allowWatchBookmarks` gives periodic `BOOKMARK` events carrying only
//!   `metadata.resourceVersion`; `timeoutSeconds` ends the stream; selectors apply, with the
//!   watch cache's transitions (stops matching → DELETED with the previous state at the new
//!   revision, starts matching → ADDED). `sendInitialEvents=true` (streaming lists) sends the
//!   state as ADDED events and then a bookmark annotated `k8s.io/initial-events-end`.
//! - **Status subresource**: for kinds that have one (a CRD version declaring
//!   `subresources.status`, and the built-in kinds with a status), PUT and PATCH on
//!   `.../<name>/status` change only `.status` (anything else in the body is ignored), get a
//!   new resourceVersion and a `MODIFIED` event, and do not bump `metadata.generation`;
//!   [`KubeApiServer::status_writes_for`] counts them. Without a status subresource the
//!   path is a 404.
//! - **Who writes**: [`KubeApiServer::writes_for`] lists every write request to an object
//!   (create, update, patch, delete) with its `User-Agent` and answer code, as the audit log.
//! - **Who watches**: [`KubeApiServer::watch_clients`] lists every open watch with what the
//!   real server knows of its client and records in its audit log: the `User-Agent` header
//!   and the source address (no user: this server authenticates nobody), and what it
//!   watches (resource, namespace, label selector).
//! - **Discovery**: `/api`, `/api/v1`, `/apis`, `/apis/<group>`, `/apis/<group>/<version>`
//!   (with `status` subresources), aggregated discovery (`apidiscovery.k8s.io/v2`) when the
//!   `Accept` header asks for it, `/version`, `/healthz`, `/readyz`, `/livez`.
//!   `PartialObjectMetadata` responses when asked for (metadata-only gets, lists, watches).
//! - **Registry behavior worth having**: namespaced objects need their namespace to exist
//!   (404 otherwise); namespaces get the `kubernetes.io/metadata.name` label, the `kubernetes`
//!   finalizer and `status.phase: Active`; `default`, `kube-system`, `kube-public` cannot be
//!   deleted; CRDs are validated (`<plural>.<group>` name, one storage version, ...) and get
//!   an `Established` status; a new server already has the namespaces `default`,
//!   `kube-system`, `kube-public` and `kube-node-lease`.
//!
//! # What is simplified
//!
//! - No authentication or authorization: any token is accepted, nothing is forbidden.
//! - No admission, defaulting or schema validation beyond the above: objects are stored as
//!   sent (object names are checked as DNS names, labels are not validated on write).
//! - **Status is writable through the main resource** (convenient for tests that create Pods
//!   with an IP): a body without `status` keeps the stored one. The real server ignores
//!   status on the main resource for kinds with a status subresource; `/status` is served too.
//! - Deletes are immediate: no finalizers, grace periods, `deletionTimestamp` or garbage
//!   collection by owner references. Deleting a namespace deletes its objects at once (the
//!   real one is `Terminating` until the namespace controller empties it); deleting a CRD
//!   deletes its custom resources and ends their watches.
//! - Strategic merge patches are applied as JSON merge patches (lists are replaced, not
//!   merged by key); server-side apply is create-or-merge-patch without field ownership,
//!   `managedFields` or conflicts.
//! - No conversion between versions of a custom resource (like conversion strategy `None`):
//!   the object is the same, only `apiVersion` differs.
//! - JSON (and YAML request bodies) only: no protobuf, CBOR or `Table` output. HTTP/1.1 only.
//! - Watch bookmarks come every `bookmark_interval` (default 1 s) instead of about a minute,
//!   and no bookmark is sent right before `timeoutSeconds` ends a watch.
//! - `compact()` is a test control stronger than etcd compaction: it expires every revision
//!   handed out so far, so even up-to-date watches get 410 and relist.

mod discovery;
mod http;
mod patch;
mod selectors;
mod status;
mod store;
mod watch;

pub use status::ApiError;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::{Filter, ResourceDef, Store};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The namespaces a new cluster has.
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    lists: AtomicU64,
    watches_opened: AtomicU64,
    watches_open: AtomicU64,
    /// Per resource (`pods`, `gateways.networking.istio.io`): (lists, watches opened).
    per_resource: Mutex<BTreeMap<String, (u64, u64)>>,
    /// Per resource: PUT and PATCH requests to the `status` subresource (no-ops included).
    status_writes: Mutex<BTreeMap<String, u64>>,
    /// The clients of the open watches, by watch.
    watch_clients: Mutex<BTreeMap<u64, WatchClient>>,
    next_watch: AtomicU64,
    /// Every write request to an object (not its status), in arrival order.
    object_writes: Mutex<Vec<ObjectWrite>>,
}

/// A write request to an object (POST, PUT, PATCH, DELETE; not to its `status`), as the
/// real server's audit log records it, whether it succeeded or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectWrite {
    /// The request's `User-Agent` header.
    pub user_agent: String,
    /// The audit verb: `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: &'static str,
    /// The resource (named as for [`KubeApiServer::delete`]).
    pub resource: String,
    /// The namespace, if any.
    pub namespace: Option<String>,
    /// The object's name (empty for a create or a collection).
    pub name: String,
    /// The HTTP status of the answer.
    pub code: u16,
}

/// Who holds an open watch: what the real API server knows of a request's client and
/// records in its audit log (`userAgent`, `sourceIPs`), and what the watch is of. (This
/// server authenticates nobody, so there is no user.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchClient {
    /// The request's `User-Agent` header (empty when it had none).
    pub user_agent: String,
    /// The client's address.
    pub source: SocketAddr,
    /// The resource watched (named as for [`KubeApiServer::delete`]).
    pub resource: String,
    /// The namespace watched; `None` for all namespaces (or a cluster-scoped resource).
    pub namespace: Option<String>,
    /// The watch's `labelSelector`, if any.
    pub label_selector: Option<String>,
}

/// What the HTTP side and the handle share.
struct Shared {
    name: String,
    addr: SocketAddr,
    store: Mutex<Store>,
    /// The current revision; watches wait on it.
    revision: tokio::sync::watch::Sender<u64>,
    /// Bumped by `drop_watches`.
    drops: tokio::sync::watch::Sender<u64>,
    bookmark_interval: tokio::sync::watch::Sender<Duration>,
    counters: Counters,
    faults: Mutex<Faults>,
    /// Service-account issuer discovery: (issuer, JWKS); `None` serves 404 as an API
    /// server without it does.
    issuer: Mutex<Option<(String, Value)>>,
}

/// Injected faults (test controls).
#[derive(Debug, Default, Clone, Copy)]
struct Faults {
    /// Every request is answered with this status (a 5xx), while set.
    fail_with: Option<u16>,
    /// Every list (each page) is answered this late.
    list_delay: Duration,
}

impl Shared {
    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn issuer(&self) -> Option<(String, Value)> {
        self.issuer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn read<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        f(&self.store.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Runs a write and wakes the watches if the revision moved.
    fn write<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let (out, before, after) = {
            let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            let before = store.revision();
            let out = f(&mut store);
            (out, before, store.revision())
        };
        if after != before {
            self.revision.send_replace(after);
        }
        out
    }

    fn count(&self, res: &ResourceDef, list: bool) {
        let total = if list {
            &self.counters.lists
        } else {
            &self.counters.watches_opened
        };
        total.fetch_add(1, Ordering::Relaxed);
        if !list {
            self.counters.watches_open.fetch_add(1, Ordering::Relaxed);
        }
        let mut per = self
            .counters
            .per_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let entry = per.entry(res.qualified()).or_default();
        if list {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }

    fn count_status_write(&self, res: &ResourceDef) {
        let mut writes = self
            .counters
            .status_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *writes.entry(res.qualified()).or_default() += 1;
    }

    fn record_write(&self, write: ObjectWrite) {
        self.counters
            .object_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(write);
    }

    fn count_list(&self, res: &ResourceDef) {
        self.count(res, true);
    }

    fn count_watch(&self, res: &ResourceDef) {
        self.count(res, false);
    }

    /// Lists an open watch's client; returns the watch's ID (to unlist it).
    fn add_watch_client(&self, client: WatchClient) -> u64 {
        let id = self.counters.next_watch.fetch_add(1, Ordering::Relaxed);
        self.counters
            .watch_clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, client);
        id
    }
}

/// Options for [`KubeApiServer`]; start with [`KubeApiServer::builder`].
#[derive(Debug, Clone)]
pub struct KubeApiServerBuilder {
    name: Option<String>,
    addr: SocketAddr,
    history_limit: usize,
    bookmark_interval: Duration,
}

impl KubeApiServerBuilder {
    /// The cluster name used in [`KubeApiServer::kubeconfig`] (default `kubeapi-<port>`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// The address to listen on (default `127.0.0.1:0`, a free port).
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// How many events the watch history keeps (default 10 000); watches and continue tokens
    /// from before the oldest kept event get 410 Expired.
    pub fn history_limit(mut self, events: usize) -> Self {
        self.history_limit = events;
        self
    }

    /// How often watches that allow bookmarks get one (default 1 s).
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// Binds and starts serving; panics if the address cannot be bound.
    pub async fn start(self) -> KubeApiServer {
        let listener = TcpListener::bind(self.addr)
            .await
            .unwrap_or_else(|e| panic!("kubeapi: binding {}: {e}", self.addr));
        let addr = listener.local_addr().expect("kubeapi: local address");
        let name = self
            .name
            .unwrap_or_else(|| format!("kubeapi-{}", addr.port()));
        let mut store = Store::new(self.history_limit);
        if let Some(namespaces) = store.resource("", "namespaces") {
            for ns in SYSTEM_NAMESPACES {
                store
                    .create(
                        &namespaces,
                        "v1",
                        None,
                        json!({"metadata": {"name": ns}}),
                        false,
                    )
                    .expect("kubeapi: creating the system namespaces");
            }
        }
        let shared = Arc::new(Shared {
            name: name.clone(),
            addr,
            revision: tokio::sync::watch::Sender::new(store.revision()),
            store: Mutex::new(store),
            drops: tokio::sync::watch::Sender::new(0),
            bookmark_interval: tokio::sync::watch::Sender::new(self.bookmark_interval),
            counters: Counters::default(),
            faults: Mutex::default(),
            issuer: Mutex::new(None),
        });
        let task = tokio::spawn(http::serve(listener, shared.clone()));
        KubeApiServer {
            name,
            addr,
            shared,
            task: Some(task),
        }
    }
}

/// A running Kubernetes API test server (one cluster). Stops, closing every connection and
/// watch, when dropped.
pub struct KubeApiServer {
    name: String,
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl KubeApiServer {
    /// Starts a server with the default options on a free `127.0.0.1` port.
    pub async fn start() -> KubeApiServer {
        KubeApiServer::builder().start().await
    }

    /// Options for a server.
    pub fn builder() -> KubeApiServerBuilder {
        KubeApiServerBuilder {
            name: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(1),
        }
    }

    /// The cluster name (as in the kubeconfig).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig (YAML) whose current context points at this server, with a bearer token
    /// the server ignores and `default` as the namespace.
    pub fn kubeconfig(&self) -> String {
        let name = &self.name;
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url()}}],
            "users": [{"name": format!("{name}-user"), "user": {"token": "shoal-test-token"}}],
            "contexts": [{
                "name": name,
                "context": {"cluster": name, "user": format!("{name}-user"), "namespace": "default"},
            }],
            "current-context": name,
            "preferences": {},
        });
        shoal_common::yaml::to_string(&config).expect("a kubeconfig serializes")
    }

    /// A kube-rs client for this server (default namespace `default`). Needs a Tokio runtime.
    pub fn client(&self) -> kube::Client {
        let url = self.url().parse().expect("the server URL is a URI");
        kube::Client::try_from(kube::Config::new(url))
            .expect("a kube client for the test API server")
    }

    /// The current revision (the resourceVersion of the latest write).
    pub fn revision(&self) -> u64 {
        self.shared.read(Store::revision)
    }

    /// Finds the resource of a self-describing object (`apiVersion` + `kind`), its version,
    /// and its namespace (`metadata.namespace`, default `default`, for namespaced kinds).
    fn resolve(
        store: &Store,
        object: &Value,
    ) -> Result<(ResourceDef, String, Option<String>), ApiError> {
        let text = |field: &str| {
            object
                .get(field)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let (Some(api_version), Some(kind)) = (text("apiVersion"), text("kind")) else {
            return Err(ApiError::bad_request(
                "the object needs apiVersion and kind",
            ));
        };
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let res = store
            .resource_for_kind(group, kind)
            .filter(|r| r.serves(version))
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "NotFound",
                    format!("no resource of kind {kind} is served at {api_version}"),
                )
            })?;
        let namespace = res.namespaced.then(|| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or("default")
                .to_string()
        });
        Ok((res, version.to_string(), namespace))
    }

    fn write_object(
        &self,
        object: impl Serialize,
        op: impl FnOnce(&mut Store, &ResourceDef, &str, Option<&str>, Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let object =
            serde_json::to_value(object).map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.shared.write(|store| {
            let (res, version, namespace) = Self::resolve(store, &object)?;
            let written = op(store, &res, &version, namespace.as_deref(), object)?;
            Ok(store::present(&written, &res, &version))
        })
    }

    /// Creates an object (like POST): `object` is anything that serializes to a Kubernetes
    /// object with `apiVersion` and `kind` (a `k8s_openapi` type, a `DynamicObject` with
    /// types, or a `serde_json::Value`). Returns the stored object.
    pub fn create(&self, object: impl Serialize) -> Result<Value, ApiError> {
        self.write_object(object, |store, res, version, ns, object| {
            store.create(res, version, ns, object, false)
        })
    }

    /// Replaces an object (like PUT): a set `metadata.resourceVersion` must be the current
    /// one (409 Conflict otherwise); 404 if it does not exist.
    pub fn update(&self, object: impl Serialize) -> Result<Value, ApiError> {
        self.write_object(object, |store, res, version, ns, object| {
            let name = object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            store.update(res, version, ns, &name, object, false, false)
        })
    }

    /// Creates the object, or replaces the existing one whatever its resourceVersion
    /// (upsert). Writing an unchanged object is a no-op.
    pub fn apply(&self, object: impl Serialize) -> Result<Value, ApiError> {
        self.write_object(object, |store, res, version, ns, mut object| {
            let name = object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("resourceVersion");
            }
            if store.get(res, ns, &name).is_ok() {
                store.update(res, version, ns, &name, object, false, false)
            } else {
                store.create(res, version, ns, object, false)
            }
        })
    }

    /// Deletes an object; `resource` is a plural resource name, qualified by its group
    /// unless core: `pods`, `endpointslices.discovery.k8s.io`,
    /// `virtualservices.networking.istio.io`. Returns the last state of the object.
    pub fn delete(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.shared.write(|store| {
            let res = store
                .resource_named(resource)
                .ok_or_else(ApiError::no_route)?;
            let deleted = store.delete(
                &res,
                namespace,
                name,
                &store::Preconditions::default(),
                false,
            )?;
            Ok(store::present(&deleted, &res, res.preferred_version()))
        })
    }

    /// An object (at its resource's preferred version), if it exists; `resource` as for
    /// [`KubeApiServer::delete`].
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.shared.read(|store| {
            let res = store.resource_named(resource)?;
            let object = store.get(&res, namespace, name).ok()?;
            Some(store::present(&object, &res, res.preferred_version()))
        })
    }

    /// An object as a typed resource (`Pod`, `Service`, ...), if it exists.
    pub fn get_as<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let group = K::group(&());
        let plural = K::plural(&());
        let resource = if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        };
        let object = self.get(&resource, namespace, name)?;
        serde_json::from_value(object).ok()
    }

    /// The objects of a resource, in one namespace or (`None`) all, in key order.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.shared.read(|store| {
            let Some(res) = store.resource_named(resource) else {
                return Vec::new();
            };
            let filter = Filter {
                namespace: namespace.map(String::from),
                ..Filter::default()
            };
            let items = store
                .list(&res, &filter, None, None, None)
                .map(|p| p.items)
                .unwrap_or_default();
            items
                .iter()
                .map(|o| store::present(o, &res, res.preferred_version()))
                .collect()
        })
    }

    /// Ends every open watch stream now (cleanly, as when the API server closes them); the
    /// clients reconnect from the last resourceVersion they saw.
    pub fn drop_watches(&self) {
        self.shared.drops.send_modify(|generation| *generation += 1);
    }

    /// Discards the event history and expires every resourceVersion handed out so far:
    /// open watches get an `ERROR` event with a 410 Expired Status and end, and later watches,
    /// exact lists and continue tokens from an older version get 410 too, so clients relist.
    pub fn compact(&self) {
        self.shared.write(Store::compact);
    }

    /// Answers every request with `status` (e.g. 500, 503) from now on, until called with
    /// `None`: an overloaded or failing API server. Open watches are not ended (see
    /// [`KubeApiServer::drop_watches`]).
    pub fn fail_requests(&self, status: Option<u16>) {
        self.shared.faults().fail_with = status;
    }

    /// Answers every list request (each page) `delay` late from now on: a slow API
    /// server or a huge cluster. `Duration::ZERO` ends it.
    pub fn set_list_delay(&self, delay: Duration) {
        self.shared.faults().list_delay = delay;
    }

    /// Serves service-account issuer discovery (`/.well-known/openid-configuration` and
    /// `/openid/v1/jwks`) with this issuer name and key set.
    pub fn set_service_account_issuer(&self, issuer: &str, jwks: Value) {
        *self.shared.issuer.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((issuer.to_string(), jwks));
    }

    /// Changes how often watches get bookmarks (open watches included).
    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.shared.bookmark_interval.send_replace(interval);
    }

    /// HTTP requests received.
    pub fn requests(&self) -> u64 {
        self.shared.counters.requests.load(Ordering::Relaxed)
    }

    /// List requests served (every page counts), all resources.
    pub fn lists_served(&self) -> u64 {
        self.shared.counters.lists.load(Ordering::Relaxed)
    }

    /// Watches opened, all resources.
    pub fn watches_opened(&self) -> u64 {
        self.shared.counters.watches_opened.load(Ordering::Relaxed)
    }

    /// Watches open right now.
    pub fn open_watches(&self) -> u64 {
        self.shared.counters.watches_open.load(Ordering::Relaxed)
    }

    /// The clients of the watches open right now, in the order they were opened.
    pub fn watch_clients(&self) -> Vec<WatchClient> {
        self.shared
            .counters
            .watch_clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The distinct `User-Agent`s of the watches open right now.
    pub fn watching_agents(&self) -> std::collections::BTreeSet<String> {
        self.watch_clients()
            .into_iter()
            .map(|c| c.user_agent)
            .collect()
    }

    /// List requests served for one resource (named as for [`KubeApiServer::delete`]).
    pub fn lists_served_for(&self, resource: &str) -> u64 {
        let per = self
            .shared
            .counters
            .per_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        per.get(resource).map_or(0, |c| c.0)
    }

    /// Watches opened for one resource (named as for [`KubeApiServer::delete`]).
    pub fn watches_opened_for(&self, resource: &str) -> u64 {
        let per = self
            .shared
            .counters
            .per_resource
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        per.get(resource).map_or(0, |c| c.1)
    }

    /// PUT and PATCH requests received for the `status` subresource of one resource (named
    /// as for [`KubeApiServer::delete`]), whether or not they changed anything: what a
    /// client's status writes cost the API server.
    pub fn status_writes_for(&self, resource: &str) -> u64 {
        let writes = self
            .shared
            .counters
            .status_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        writes.get(resource).copied().unwrap_or(0)
    }

    /// The write requests received for objects of one resource (named as for
    /// [`KubeApiServer::delete`]), failed ones included, in arrival order: who wrote what.
    pub fn writes_for(&self, resource: &str) -> Vec<ObjectWrite> {
        let writes = self
            .shared
            .counters
            .object_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        writes
            .iter()
            .filter(|w| w.resource == resource)
            .cloned()
            .collect()
    }

    /// Stops serving and closes every connection (the handle's state stays readable).
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The CRD of an Istio networking kind (`plural` its resource), like Istio's: served in
/// v1alpha3, v1beta1 and v1 (stored), each with a `status` subresource, no schema.
pub fn istio_crd(kind: &str, plural: &str) -> Value {
    let version = |name: &str, storage: bool| {
        json!({"name": name, "served": true, "storage": storage,
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
               "subresources": {"status": {}}})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.networking.istio.io")},
        "spec": {
            "group": "networking.istio.io", "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                      "listKind": format!("{kind}List")},
            "versions": [version("v1alpha3", false), version("v1beta1", false), version("v1", true)],
        },
    })
}
