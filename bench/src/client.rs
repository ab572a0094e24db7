//! Simulated proxies: gRPC ADS clients that behave like Envoy sidecars.
//!
//! Each proxy has its own HTTP/2 connection (its own tonic `Channel`), identifies itself
//! the way Istio's bootstrap does, subscribes to CDS and LDS (wildcard), then to EDS for
//! every EDS cluster it receives and to RDS for every route table its listeners name
//! (whatever the names: `8080`, `9080`, `<host>:<port>`), ACKs every response with its
//! nonce, and tracks every resource's version. When its stream breaks it reconnects to the
//! next server, resuming (delta) with the versions it holds, as Envoy does.
//!
//! Proxies keep only names and versions, never resource bodies; a response is inspected
//! once on receipt: for the benchmark's change markers, and (decoded once per distinct
//! version, shared by all proxies) for the EDS and RDS names it implies and for what Envoy
//! would reject it for ([`super::validate`]). A response with a resource Envoy would reject
//! is NACKed (`error_detail`) instead of ACKed and reported; the proxy still counts the
//! resource as received, so the benchmark goes on.

use super::validate;
use memchr::memmem;
use shoal_proto::pb::envoy::config::core::v3::Node;
use shoal_proto::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient, DeltaDiscoveryRequest,
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use shoal_proto::pb::google::protobuf::{value::Kind, Struct, Value};
use shoal_proto::pb::google::rpc::Status as RpcStatus;
use shoal_proto::XdsType;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

/// Which ADS variant the proxies speak.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// State of the world (`StreamAggregatedResources`).
    Sotw,
    /// Incremental (`DeltaAggregatedResources`).
    Delta,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Sotw => "sotw",
            Mode::Delta => "delta",
        })
    }
}

/// A change the coordinator is waiting for: the first response of type `ty` carrying
/// resource `resource` whose bytes contain `marker` counts as its receipt.
#[derive(Debug)]
pub struct ActiveChange {
    /// Change number (unique within a run).
    pub id: u64,
    /// The resource type that carries the change.
    pub ty: XdsType,
    /// The resource that carries it.
    pub resource: String,
    /// Bytes that appear in that resource only once the change is applied.
    pub marker: memmem::Finder<'static>,
}

/// What proxies report to the coordinator.
/// The server ended a stream cleanly (an OK status, no reset).
#[derive(Debug)]
pub struct ServerEnded;

impl std::fmt::Display for ServerEnded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the server ended the stream")
    }
}

impl std::error::Error for ServerEnded {}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A stream has everything: CDS, EDS for each EDS cluster, LDS, RDS for each route
    /// table, all ACKed.
    Configured {
        /// Proxy index.
        proxy: usize,
        /// Stream number of the proxy (0 for the first; reconnections count up).
        stream: u32,
        /// From the start of the connection attempt to fully configured.
        elapsed: Duration,
        /// Clusters held.
        clusters: usize,
        /// EDS assignments held.
        endpoints: usize,
        /// Listeners held.
        listeners: usize,
        /// Route tables held.
        routes: usize,
        /// Whether `virtualOutbound` and `virtualInbound` are among the listeners.
        capture_listeners: (bool, bool),
        /// `inbound|<port>||` clusters held.
        inbound_clusters: usize,
        /// A cluster a listener or route table refers to that the proxy does not hold
        /// (Envoy accepts it, but the traffic fails), if any, and how many there are.
        dangling: Option<(String, usize)>,
        /// What it holds, by name (proxy 0's first stream only).
        names: Option<Box<HeldNames>>,
        /// What it holds, as a fingerprint (to compare two servers' configurations).
        fingerprint: Fingerprint,
        /// A recording fleet's proxies: every resource held, with its bytes (never sent
        /// by a fleet process).
        #[serde(skip)]
        recording: Option<Vec<RecordedItem>>,
    },
    /// A proxy received an [`ActiveChange`].
    Observed {
        /// Proxy index.
        proxy: usize,
        /// The change's id.
        change: u64,
        /// Wall-clock receipt time, in µs since the Unix epoch.
        at_us: u64,
    },
    /// A stream ended with an error (it reconnects).
    StreamError {
        /// Proxy index.
        proxy: usize,
        /// Whether the connection itself (TCP connect and HTTP/2 handshake) failed, rather
        /// than a stream on an established connection.
        connect: bool,
        /// The server ended the stream cleanly (an OK status: its `--max-connection-age`,
        /// or a drain), which is not a reset.
        ended: bool,
        /// What happened.
        error: String,
    },
    /// The proxy NACKed a response: a resource Envoy would reject.
    Nack {
        /// Proxy index.
        proxy: usize,
        /// Why.
        error: String,
    },
    /// The proxy rejected nothing, but a response could not be understood.
    BadResponse {
        /// Proxy index.
        proxy: usize,
        /// What was wrong.
        error: String,
    },
}

impl Event {
    /// The index of the proxy the event is of.
    pub fn proxy_mut(&mut self) -> &mut usize {
        match self {
            Event::Configured { proxy, .. }
            | Event::Observed { proxy, .. }
            | Event::StreamError { proxy, .. }
            | Event::Nack { proxy, .. }
            | Event::BadResponse { proxy, .. } => proxy,
        }
    }
}

/// The names of what a proxy holds (for the report: what the server generated).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct HeldNames {
    /// Listeners.
    pub listeners: Vec<String>,
    /// Route tables.
    pub routes: Vec<String>,
    /// Clusters other than `outbound|...` ones.
    pub other_clusters: Vec<String>,
    /// How many `outbound|...` clusters.
    pub outbound_clusters: usize,
}

/// What a proxy holds, in two order-independent hashes: of the (type, name) pairs, and of
/// the (type, name, version) triples. Two proxies with equal fingerprints hold the same
/// resources (names), at the same versions (versions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint {
    /// Over names.
    pub names: u64,
    /// Over names and versions.
    pub versions: u64,
    /// Resources held.
    pub resources: usize,
}

/// One resource a recording proxy held when configured.
#[derive(Debug, Clone)]
pub struct RecordedItem {
    /// Its type.
    pub ty: XdsType,
    /// Its name.
    pub name: String,
    /// Its version, as the server sent it (delta).
    pub version: String,
    /// Its bytes (the `Any` value).
    pub value: Vec<u8>,
}

/// What determines a proxy's configuration besides the mesh: its namespace, its label
/// `app` and its interception mode. Proxies of one class get the same resources.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProxyClass {
    /// Node metadata `NAMESPACE`.
    pub namespace: String,
    /// Label `app`.
    pub app: String,
    /// Node metadata `INTERCEPTION_MODE`, when sent.
    pub interception: Option<String>,
}

impl std::fmt::Display for ProxyClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/app={}/{}",
            self.namespace,
            self.app,
            self.interception.as_deref().unwrap_or("REDIRECT")
        )
    }
}

/// Per-proxy counters the coordinator reads after a replica move.
#[derive(Debug, Default)]
pub struct ProxyCounters {
    /// Streams started so far.
    pub streams: AtomicU32,
    /// Index (in the fleet's server list) of the server of the latest stream.
    pub server: AtomicUsize,
    /// Resources held when the latest reconnection started.
    pub held_at_reconnect: AtomicU64,
    /// Resources received on reconnected streams (stream ≥ 1).
    pub received_after_reconnect: AtomicU64,
    /// Of those, resources the proxy already held at the same version: resent for nothing.
    pub resent: AtomicU64,
    /// Responses received (all streams).
    pub responses: AtomicU64,
    /// While the current stream is not configured: what it still lacks.
    pub pending: Mutex<Option<String>>,
}

/// Interns names and versions: all proxies hold mostly the same ones.
#[derive(Default)]
struct Interner {
    set: Mutex<HashSet<Arc<str>>>,
}

impl Interner {
    fn get(&self, s: &str) -> Arc<str> {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = set.get(s) {
            return v.clone();
        }
        let v: Arc<str> = Arc::from(s);
        set.insert(v.clone());
        v
    }
}

/// Resource version → what it implies.
type ByVersion<T> = Mutex<HashMap<Arc<str>, T>>;

/// What a cluster version implies.
#[derive(Clone)]
struct ClusterFacts {
    /// Its EDS service name (None: not an EDS cluster).
    eds: Option<Arc<str>>,
    /// Why Envoy would reject it.
    problem: Option<Arc<str>>,
}

/// What a listener version implies.
struct ListenerFacts {
    /// `ip:port`.
    address: Option<Arc<str>>,
    /// Route tables it names over RDS.
    routes: Vec<Arc<str>>,
    /// Clusters it sends to directly.
    clusters: Vec<Arc<str>>,
    /// Why Envoy would reject it.
    problem: Option<Arc<str>>,
}

/// What a route table version implies.
struct RouteFacts {
    /// Clusters it routes to.
    clusters: Vec<Arc<str>>,
    /// Why Envoy would reject it.
    problem: Option<Arc<str>>,
}

/// What a resource implies for the next subscriptions and for acceptance, decoded once
/// per version.
#[derive(Default)]
struct DecodeCache {
    clusters: ByVersion<ClusterFacts>,
    listeners: ByVersion<Arc<ListenerFacts>>,
    routes: ByVersion<Arc<RouteFacts>>,
}

/// Everything the proxies of one run share.
pub struct Fleet {
    mode: Mode,
    servers: Vec<SocketAddr>,
    connect_limit: Semaphore,
    active: watch::Receiver<Option<Arc<ActiveChange>>>,
    events: mpsc::UnboundedSender<Event>,
    interner: Interner,
    cache: DecodeCache,
    counters: Vec<ProxyCounters>,
    shutdown: watch::Receiver<bool>,
    /// Keep every received resource's bytes and report them when configured (the
    /// replay baseline's recording clients; delta only).
    record: bool,
    /// Proxy i first connects to server i mod servers (else every proxy starts on the first).
    spread: bool,
}

impl Fleet {
    /// A fleet of `proxies` proxies of `mode`, connecting first to `servers[0]` and moving
    /// to the next server when a stream breaks; at most `connect_concurrency` connection
    /// handshakes at a time.
    pub fn new(
        mode: Mode,
        servers: Vec<SocketAddr>,
        proxies: usize,
        connect_concurrency: usize,
        active: watch::Receiver<Option<Arc<ActiveChange>>>,
        events: mpsc::UnboundedSender<Event>,
        shutdown: watch::Receiver<bool>,
    ) -> Fleet {
        Fleet {
            mode,
            servers,
            connect_limit: Semaphore::new(connect_concurrency.max(1)),
            active,
            events,
            interner: Interner::default(),
            cache: DecodeCache::default(),
            counters: (0..proxies).map(|_| ProxyCounters::default()).collect(),
            shutdown,
            record: false,
            spread: false,
        }
    }

    /// With `on`, proxy i first connects to server i mod servers instead of the first.
    pub fn spread(mut self, on: bool) -> Fleet {
        self.spread = on;
        self
    }

    /// The same fleet, recording: each proxy keeps the bytes of every resource it receives
    /// (delta mode) and reports them in [`Event::Configured`].
    pub fn recording(mut self) -> Fleet {
        self.record = true;
        self
    }

    /// Per-proxy counters.
    pub fn counters(&self) -> &[ProxyCounters] {
        &self.counters
    }
}

/// Who a proxy is.
#[derive(Debug, Clone)]
pub struct ProxyIdentity {
    /// Index in the fleet.
    pub index: usize,
    /// Its namespace.
    pub namespace: String,
    /// Istio node id: `sidecar~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`.
    pub node_id: String,
    /// The pod's label `app`.
    pub app: String,
    /// Node metadata `INTERCEPTION_MODE`; None: not sent (Istio's default, iptables
    /// `REDIRECT`: a captured sidecar).
    pub interception: Option<String>,
}

impl ProxyIdentity {
    /// Proxy `index` in namespace `namespace`, labelled `app: client`, with
    /// `INTERCEPTION_MODE: NONE` (no traffic capture: only Sidecar egress listeners).
    pub fn new(index: usize, namespace: &str) -> ProxyIdentity {
        ProxyIdentity {
            index,
            namespace: namespace.to_string(),
            node_id: node_id(index, namespace),
            app: "client".to_string(),
            interception: Some("NONE".to_string()),
        }
    }

    /// The same proxy (same class) as another pod: node id and IP of pod `number`, which
    /// must differ from every other proxy's connected to the same server.
    pub fn with_node_number(mut self, number: usize) -> ProxyIdentity {
        self.node_id = node_id(number, &self.namespace);
        self
    }

    /// What determines its configuration besides the mesh.
    pub fn class(&self) -> ProxyClass {
        ProxyClass {
            namespace: self.namespace.clone(),
            app: self.app.clone(),
            interception: self.interception.clone(),
        }
    }

    /// The same proxy as a captured sidecar (no `INTERCEPTION_MODE`, as Istio's injector
    /// leaves it by default) labelled `app: <app>`.
    pub fn captured(mut self, app: &str) -> ProxyIdentity {
        self.app = app.to_string();
        self.interception = None;
        self
    }

    /// The node as Istio's bootstrap writes it.
    fn node(&self) -> Node {
        let s = |v: &str| Value {
            kind: Some(Kind::StringValue(v.to_string())),
        };
        let labels = Struct {
            fields: [("app".to_string(), s(&self.app))].into_iter().collect(),
        };
        let mut fields = vec![
            ("NAMESPACE".to_string(), s(&self.namespace)),
            ("CLUSTER_ID".to_string(), s("Kubernetes")),
            (
                "LABELS".to_string(),
                Value {
                    kind: Some(Kind::StructValue(labels)),
                },
            ),
        ];
        if let Some(mode) = &self.interception {
            fields.push(("INTERCEPTION_MODE".to_string(), s(mode)));
        }
        Node {
            id: self.node_id.clone(),
            cluster: format!("{}.{}", self.app, self.namespace),
            metadata: Some(Struct {
                fields: fields.into_iter().collect(),
            }),
            ..Default::default()
        }
    }
}

/// The node id of pod `number` in `namespace`, with IP `10.a.b.c` derived from the number
/// (`10.1.x.y` for the first 62 500).
fn node_id(number: usize, namespace: &str) -> String {
    let ip = format!(
        "10.{}.{}.{}",
        1 + (number / 62_500) % 250,
        (number / 250) % 250,
        number % 250 + 1
    );
    format!("sidecar~{ip}~pod-{number}.{namespace}~{namespace}.svc.cluster.local")
}

/// One type's state on a proxy.
#[derive(Default)]
struct TypeState {
    /// Name → version of what the proxy holds.
    held: HashMap<Arc<str>, Arc<str>>,
    /// SotW: the version of the last accepted response.
    version_info: String,
    /// Nonce of the last response.
    nonce: String,
    /// A response arrived on the current stream.
    received: bool,
    /// EDS and RDS: the names subscribed to.
    subscribed: BTreeSet<Arc<str>>,
}

/// Everything a proxy holds, kept across reconnections.
#[derive(Default)]
struct ProxyState {
    cds: TypeState,
    eds: TypeState,
    lds: TypeState,
    rds: TypeState,
    /// Gateway credentials (the simulated proxies subscribe to none).
    sds: TypeState,
    /// ztunnel's types (the simulated proxies are Envoys: never subscribed).
    wds: TypeState,
    wads: TypeState,
    configured: bool,
    last_observed: Option<u64>,
    /// Recording fleets: the bytes of the latest version of every resource received.
    bodies: HashMap<(XdsType, Arc<str>), Vec<u8>>,
}

impl ProxyState {
    fn ty(&mut self, ty: XdsType) -> &mut TypeState {
        match ty {
            XdsType::Cluster => &mut self.cds,
            XdsType::Endpoint => &mut self.eds,
            XdsType::Listener => &mut self.lds,
            XdsType::Route => &mut self.rds,
            XdsType::Secret => &mut self.sds,
            XdsType::Address => &mut self.wds,
            XdsType::Authorization => &mut self.wads,
        }
    }

    /// An order-independent hash of what the proxy holds.
    fn fingerprint(&self) -> Fingerprint {
        let mut fp = Fingerprint::default();
        for ty in ORDER {
            for (name, version) in &self.ty_ref(ty).held {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (ty.short(), &**name).hash(&mut h);
                fp.names = fp.names.wrapping_add(h.finish());
                version.hash(&mut h);
                fp.versions = fp.versions.wrapping_add(h.finish());
                fp.resources += 1;
            }
        }
        fp
    }

    fn ty_ref(&self, ty: XdsType) -> &TypeState {
        match ty {
            XdsType::Cluster => &self.cds,
            XdsType::Endpoint => &self.eds,
            XdsType::Listener => &self.lds,
            XdsType::Route => &self.rds,
            XdsType::Secret => &self.sds,
            XdsType::Address => &self.wds,
            XdsType::Authorization => &self.wads,
        }
    }

    /// Every resource held with its bytes (recording fleets).
    fn recording(&self) -> Vec<RecordedItem> {
        let mut out = Vec::with_capacity(self.held_total());
        for ty in ORDER {
            for (name, version) in &self.ty_ref(ty).held {
                if let Some(value) = self.bodies.get(&(ty, name.clone())) {
                    out.push(RecordedItem {
                        ty,
                        name: name.to_string(),
                        version: version.to_string(),
                        value: value.clone(),
                    });
                }
            }
        }
        out
    }

    fn held_total(&self) -> usize {
        self.cds.held.len() + self.eds.held.len() + self.lds.held.len() + self.rds.held.len()
    }

    fn is_configured(&self) -> bool {
        let dependent_ok = |t: &TypeState| {
            t.subscribed.is_empty()
                || (t.received && t.subscribed.iter().all(|n| t.held.contains_key(n)))
        };
        self.cds.received && self.lds.received && dependent_ok(&self.eds) && dependent_ok(&self.rds)
    }

    /// What the stream still lacks to be configured, for diagnostics.
    fn pending(&self) -> String {
        let mut parts = Vec::new();
        for (label, t, dependent) in [
            ("CDS", &self.cds, false),
            ("EDS", &self.eds, true),
            ("LDS", &self.lds, false),
            ("RDS", &self.rds, true),
        ] {
            if dependent && t.subscribed.is_empty() {
                continue;
            }
            if !t.received {
                parts.push(format!("no {label} response yet"));
                continue;
            }
            if dependent {
                let missing: Vec<&Arc<str>> = t
                    .subscribed
                    .iter()
                    .filter(|n| !t.held.contains_key(*n))
                    .collect();
                if let Some(first) = missing.first() {
                    parts.push(format!(
                        "{label}: {} of {} subscribed names never received, e.g. {first:?}",
                        missing.len(),
                        t.subscribed.len()
                    ));
                }
            }
        }
        parts.join("; ")
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Runs one proxy until the fleet shuts down.
pub async fn run_proxy(fleet: Arc<Fleet>, id: ProxyIdentity) {
    let mut state = ProxyState::default();
    let mut server = if fleet.spread { id.index } else { 0 };
    let mut backoff = Duration::from_millis(50);
    let mut shutdown = fleet.shutdown.clone();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let addr = fleet.servers[server % fleet.servers.len()];
        let started = Instant::now();
        let channel = {
            let _permit = tokio::select! {
                p = fleet.connect_limit.acquire() => p,
                _ = shutdown.wait_for(|s| *s) => return,
            };
            connect(addr).await
        };
        let connect_failed = channel.is_err();
        let result = match channel {
            Ok(channel) => {
                backoff = Duration::from_millis(50);
                let counters = &fleet.counters[id.index];
                counters
                    .server
                    .store(server % fleet.servers.len(), Ordering::Relaxed);
                let stream = counters.streams.fetch_add(1, Ordering::Relaxed);
                let mut proxy = Proxy {
                    fleet: &fleet,
                    id: &id,
                    state: &mut state,
                    stream,
                    started,
                };
                match fleet.mode {
                    Mode::Sotw => proxy.run_sotw(channel).await,
                    Mode::Delta => proxy.run_delta(channel).await,
                }
            }
            Err(e) => Err(e),
        };
        if *shutdown.borrow() {
            return;
        }
        let ended = result.as_ref().is_err_and(|e| e.is::<ServerEnded>());
        let error = match result {
            Ok(()) => "stream ended".to_string(),
            Err(e) => format!("{e:#}"),
        };
        let _ = fleet.events.send(Event::StreamError {
            proxy: id.index,
            connect: connect_failed,
            ended,
            error: format!("{addr}: {error}"),
        });
        // Like Envoy: back off, then try the next server.
        server += 1;
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

async fn connect(addr: SocketAddr) -> anyhow::Result<tonic::transport::Channel> {
    use anyhow::Context;
    // Envoy's HTTP/2 windows are large by default (256 MiB); tonic's are 64 KiB, which
    // would throttle big responses with flow-control round trips.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .context("xDS endpoint URL")?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(16 << 20))
        .initial_connection_window_size(Some(16 << 20));
    endpoint
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))
}

/// Maximum size of a response a proxy accepts.
const MAX_MESSAGE: usize = 256 << 20;

/// One stream of one proxy.
struct Proxy<'a> {
    fleet: &'a Fleet,
    id: &'a ProxyIdentity,
    state: &'a mut ProxyState,
    stream: u32,
    started: Instant,
}

/// The order Envoy subscribes in on a (re)connection.
const ORDER: [XdsType; 4] = [
    XdsType::Cluster,
    XdsType::Endpoint,
    XdsType::Listener,
    XdsType::Route,
];

impl Proxy<'_> {
    fn counters(&self) -> &ProxyCounters {
        &self.fleet.counters[self.id.index]
    }

    /// Resets per-stream state and, on a reconnection, records what the proxy holds.
    fn begin_stream(&mut self) {
        for ty in ORDER {
            self.state.ty(ty).received = false;
        }
        self.state.configured = false;
        if self.stream > 0 {
            self.counters()
                .held_at_reconnect
                .store(self.state.held_total() as u64, Ordering::Relaxed);
        }
    }

    /// Checks a received resource against the active change; counts resends.
    fn on_resource(&mut self, ty: XdsType, name: &str, version: &str, body: &[u8], at_us: u64) {
        if self.stream > 0 {
            let fleet = self.fleet;
            let c = &fleet.counters[self.id.index];
            c.received_after_reconnect.fetch_add(1, Ordering::Relaxed);
            if self
                .state
                .ty(ty)
                .held
                .get(name)
                .is_some_and(|v| &**v == version)
            {
                c.resent.fetch_add(1, Ordering::Relaxed);
            }
        }
        let active = self.fleet.active.borrow().clone();
        if let Some(change) = active {
            if change.ty == ty
                && change.resource == name
                && self.state.last_observed != Some(change.id)
                && change.marker.find(body).is_some()
            {
                self.state.last_observed = Some(change.id);
                let _ = self.fleet.events.send(Event::Observed {
                    proxy: self.id.index,
                    change: change.id,
                    at_us,
                });
            }
        }
    }

    /// The EDS names the held clusters imply.
    fn wanted_endpoints(&self) -> BTreeSet<Arc<str>> {
        // Every held cluster was decoded into the cache on receipt.
        let cache = self
            .fleet
            .cache
            .clusters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.state
            .cds
            .held
            .values()
            .filter_map(|v| cache.get(v).and_then(|c| c.eds.clone()))
            .collect()
    }

    /// The route table names the held listeners imply.
    fn wanted_routes(&self) -> BTreeSet<Arc<str>> {
        let cache = self
            .fleet
            .cache
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.state
            .lds
            .held
            .values()
            .filter_map(|v| cache.get(v))
            .flat_map(|l| l.routes.iter().cloned())
            .collect()
    }

    /// Listeners that share an address with another one: Envoy rejects the later one.
    fn duplicate_listener_address(&self) -> Option<String> {
        let cache = self
            .fleet
            .cache
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut seen: HashMap<&str, &str> = HashMap::new();
        let mut held: Vec<(&Arc<str>, &Arc<str>)> = self.state.lds.held.iter().collect();
        held.sort();
        for (name, version) in held {
            let Some(addr) = cache.get(version).and_then(|l| l.address.as_deref()) else {
                continue;
            };
            if let Some(other) = seen.insert(addr, name) {
                return Some(format!(
                    "listeners {other:?} and {name:?} have the same address {addr}"
                ));
            }
        }
        None
    }

    /// Decodes and checks a resource, once per version. Ok(Some(reason)): Envoy would
    /// reject it. Err: it is not even the right message.
    fn learn(
        &self,
        ty: XdsType,
        version: &Arc<str>,
        body: &[u8],
    ) -> Result<Option<Arc<str>>, String> {
        let intern = |s: &str| self.fleet.interner.get(s);
        let interned = |v: Vec<String>| -> Vec<Arc<str>> { v.iter().map(|s| intern(s)).collect() };
        let cache = &self.fleet.cache;
        match ty {
            XdsType::Cluster => {
                let mut cache = cache.clusters.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(c) = cache.get(version) {
                    return Ok(c.problem.clone());
                }
                let info = validate::cluster(body)?;
                let facts = ClusterFacts {
                    eds: info.eds.as_deref().map(intern),
                    problem: info.problem.map(Arc::from),
                };
                let problem = facts.problem.clone();
                cache.insert(version.clone(), facts);
                Ok(problem)
            }
            XdsType::Listener => {
                let mut cache = cache.listeners.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(l) = cache.get(version) {
                    return Ok(l.problem.clone());
                }
                let info = validate::listener(body)?;
                let facts = ListenerFacts {
                    address: info.address.as_deref().map(intern),
                    routes: interned(info.routes),
                    clusters: interned(info.clusters),
                    problem: info.problem.map(Arc::from),
                };
                let problem = facts.problem.clone();
                cache.insert(version.clone(), Arc::new(facts));
                Ok(problem)
            }
            XdsType::Route => {
                let mut cache = cache.routes.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = cache.get(version) {
                    return Ok(r.problem.clone());
                }
                let info = validate::route(body)?;
                let facts = RouteFacts {
                    clusters: interned(info.clusters),
                    problem: info.problem.map(Arc::from),
                };
                let problem = facts.problem.clone();
                cache.insert(version.clone(), Arc::new(facts));
                Ok(problem)
            }
            XdsType::Endpoint | XdsType::Secret | XdsType::Address | XdsType::Authorization => {
                Ok(None)
            }
        }
    }

    /// A cluster that a held listener or route table refers to and that the proxy does not
    /// hold, and how many such references there are.
    fn dangling_clusters(&self) -> Option<(String, usize)> {
        let cds = &self.state.cds.held;
        let mut first = None;
        let mut n = 0;
        {
            let cache = self
                .fleet
                .cache
                .listeners
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for (name, v) in &self.state.lds.held {
                for c in cache
                    .get(v)
                    .map(|l| l.clusters.as_slice())
                    .unwrap_or_default()
                {
                    if !cds.contains_key(c) {
                        n += 1;
                        first
                            .get_or_insert_with(|| format!("listener {name:?} uses cluster {c:?}"));
                    }
                }
            }
        }
        let cache = self
            .fleet
            .cache
            .routes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (name, v) in &self.state.rds.held {
            for c in cache
                .get(v)
                .map(|r| r.clusters.as_slice())
                .unwrap_or_default()
            {
                if !cds.contains_key(c) {
                    n += 1;
                    first.get_or_insert_with(|| format!("route table {name:?} uses cluster {c:?}"));
                }
            }
        }
        first.map(|f| (f, n))
    }

    /// What the proxy holds, by name.
    fn held_names(&self) -> HeldNames {
        let sorted = |t: &TypeState| {
            let mut v: Vec<String> = t.held.keys().map(|n| n.to_string()).collect();
            v.sort();
            v
        };
        let (outbound, other): (Vec<String>, Vec<String>) = sorted(&self.state.cds)
            .into_iter()
            .partition(|n| n.starts_with("outbound|"));
        HeldNames {
            listeners: sorted(&self.state.lds),
            routes: sorted(&self.state.rds),
            other_clusters: other,
            outbound_clusters: outbound.len(),
        }
    }

    fn nack(&self, error: String) {
        let _ = self.fleet.events.send(Event::Nack {
            proxy: self.id.index,
            error,
        });
    }

    fn bad_response(&self, error: String) {
        let _ = self.fleet.events.send(Event::BadResponse {
            proxy: self.id.index,
            error,
        });
    }

    fn check_configured(&mut self) {
        if self.state.configured {
            return;
        }
        if !self.state.is_configured() {
            let pending = self.state.pending();
            *self
                .counters()
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(pending);
            return;
        }
        self.state.configured = true;
        *self
            .counters()
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        let lds = &self.state.lds.held;
        let _ = self.fleet.events.send(Event::Configured {
            proxy: self.id.index,
            stream: self.stream,
            elapsed: self.started.elapsed(),
            clusters: self.state.cds.held.len(),
            endpoints: self.state.eds.held.len(),
            listeners: lds.len(),
            routes: self.state.rds.held.len(),
            capture_listeners: (
                lds.contains_key("virtualOutbound"),
                lds.contains_key("virtualInbound"),
            ),
            inbound_clusters: self
                .state
                .cds
                .held
                .keys()
                .filter(|n| n.starts_with("inbound|"))
                .count(),
            dangling: self.dangling_clusters(),
            names: (self.id.index == 0 && self.stream == 0).then(|| Box::new(self.held_names())),
            fingerprint: self.state.fingerprint(),
            recording: self.fleet.record.then(|| self.state.recording()),
        });
    }

    // -----------------------------------------------------------------------------------
    // State of the world

    async fn run_sotw(&mut self, channel: tonic::transport::Channel) -> anyhow::Result<()> {
        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(64);
        self.begin_stream();
        let mut node = Some(self.id.node());
        for ty in ORDER {
            let st = self.state.ty(ty);
            let wildcard = matches!(ty, XdsType::Cluster | XdsType::Listener);
            if !wildcard && st.subscribed.is_empty() {
                continue;
            }
            // A reconnection carries the last accepted version and the subscriptions, but
            // no nonce (nonces belong to the old stream).
            let req = DiscoveryRequest {
                version_info: st.version_info.clone(),
                node: node.take(),
                resource_names: st.subscribed.iter().map(|n| n.to_string()).collect(),
                type_url: ty.type_url().to_string(),
                ..Default::default()
            };
            let _ = tx.try_send(req);
        }
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let mut responses = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let mut shutdown = self.fleet.shutdown.clone();
        loop {
            let resp = tokio::select! {
                r = responses.message() => r?,
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            };
            let Some(resp) = resp else {
                return Err(ServerEnded.into());
            };
            let at_us = now_us();
            self.counters().responses.fetch_add(1, Ordering::Relaxed);
            for req in self.on_sotw_response(resp, at_us) {
                if tx.send(req).await.is_err() {
                    anyhow::bail!("request stream closed");
                }
            }
            self.check_configured();
        }
    }

    /// Applies a SotW response; returns the requests to send (subscription changes, then
    /// the ACK).
    fn on_sotw_response(&mut self, resp: DiscoveryResponse, at_us: u64) -> Vec<DiscoveryRequest> {
        let Some(ty) = XdsType::from_type_url(&resp.type_url) else {
            self.bad_response(format!("unknown type {}", resp.type_url));
            return Vec::new();
        };
        // SotW resources carry no name or version: the name is field 1 of every xDS
        // resource message, the version a hash of the bytes (equal bytes, equal version).
        let mut items = Vec::with_capacity(resp.resources.len());
        let mut problems = Vec::new();
        for any in &resp.resources {
            let Some(name) = field1_string(&any.value) else {
                self.bad_response(format!("a {} resource without a name", ty.short()));
                continue;
            };
            let mut h = std::collections::hash_map::DefaultHasher::new();
            any.value.hash(&mut h);
            let version = self.fleet.interner.get(&format!("{:016x}", h.finish()));
            let name = self.fleet.interner.get(name);
            self.on_resource(ty, &name, &version, &any.value, at_us);
            match self.learn(ty, &version, &any.value) {
                Ok(Some(problem)) => problems.push(problem.to_string()),
                Ok(None) => {}
                Err(e) => self.bad_response(e),
            }
            items.push((name, version));
        }
        {
            let st = self.state.ty(ty);
            match ty {
                // Wildcard types: the response is the whole set.
                XdsType::Cluster | XdsType::Listener => st.held = items.into_iter().collect(),
                // Others may be partial: what is not mentioned is kept.
                XdsType::Endpoint
                | XdsType::Route
                | XdsType::Secret
                | XdsType::Address
                | XdsType::Authorization => st.held.extend(items),
            }
            st.received = true;
            st.nonce = resp.nonce.clone();
        }
        if ty == XdsType::Listener {
            problems.extend(self.duplicate_listener_address());
        }
        let error_detail = self.reject(ty, &problems);
        if error_detail.is_none() {
            self.state.ty(ty).version_info = resp.version_info.clone();
        }
        let mut out = Vec::new();
        let dependent = match ty {
            XdsType::Cluster => Some((XdsType::Endpoint, self.wanted_endpoints())),
            XdsType::Listener => Some((XdsType::Route, self.wanted_routes())),
            _ => None,
        };
        if let Some((dep, wanted)) = dependent {
            let st = self.state.ty(dep);
            if st.subscribed != wanted {
                st.held.retain(|n, _| wanted.contains(n));
                st.subscribed = wanted;
                out.push(DiscoveryRequest {
                    version_info: st.version_info.clone(),
                    resource_names: st.subscribed.iter().map(|n| n.to_string()).collect(),
                    type_url: dep.type_url().to_string(),
                    response_nonce: st.nonce.clone(),
                    ..Default::default()
                });
            }
        }
        // ACK with the new version; NACK with the last accepted one.
        let st = self.state.ty(ty);
        out.push(DiscoveryRequest {
            version_info: st.version_info.clone(),
            resource_names: st.subscribed.iter().map(|n| n.to_string()).collect(),
            type_url: resp.type_url,
            response_nonce: resp.nonce,
            error_detail,
            ..Default::default()
        });
        out
    }

    /// The `error_detail` of a NACK for `problems` (None: ACK), reported to the
    /// coordinator.
    fn reject(&self, ty: XdsType, problems: &[String]) -> Option<RpcStatus> {
        let first = problems.first()?;
        let message = format!(
            "{} rejected ({} problem(s)): {first}",
            ty.short(),
            problems.len()
        );
        self.nack(message.clone());
        Some(RpcStatus {
            // INVALID_ARGUMENT, as Envoy sends.
            code: 3,
            message,
            ..Default::default()
        })
    }

    // -----------------------------------------------------------------------------------
    // Delta

    async fn run_delta(&mut self, channel: tonic::transport::Channel) -> anyhow::Result<()> {
        let (tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(64);
        self.begin_stream();
        let mut node = Some(self.id.node());
        for ty in ORDER {
            let st = self.state.ty(ty);
            let wildcard = matches!(ty, XdsType::Cluster | XdsType::Listener);
            if !wildcard && st.subscribed.is_empty() {
                continue;
            }
            // On a reconnection: what the proxy holds, so the server sends only changes.
            let req = DeltaDiscoveryRequest {
                node: node.take(),
                type_url: ty.type_url().to_string(),
                resource_names_subscribe: st.subscribed.iter().map(|n| n.to_string()).collect(),
                initial_resource_versions: st
                    .held
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            };
            let _ = tx.try_send(req);
        }
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let mut responses = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let mut shutdown = self.fleet.shutdown.clone();
        loop {
            let resp = tokio::select! {
                r = responses.message() => r?,
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            };
            let Some(resp) = resp else {
                return Err(ServerEnded.into());
            };
            let at_us = now_us();
            self.counters().responses.fetch_add(1, Ordering::Relaxed);
            for req in self.on_delta_response(resp, at_us) {
                if tx.send(req).await.is_err() {
                    anyhow::bail!("request stream closed");
                }
            }
            self.check_configured();
        }
    }

    /// Applies a delta response; returns the requests to send (subscription changes, then
    /// the ACK).
    fn on_delta_response(
        &mut self,
        resp: DeltaDiscoveryResponse,
        at_us: u64,
    ) -> Vec<DeltaDiscoveryRequest> {
        let Some(ty) = XdsType::from_type_url(&resp.type_url) else {
            self.bad_response(format!("unknown type {}", resp.type_url));
            return Vec::new();
        };
        let mut items = Vec::with_capacity(resp.resources.len());
        let mut problems = Vec::new();
        for r in &resp.resources {
            let body: &[u8] = r
                .resource
                .as_ref()
                .map(|a| a.value.as_slice())
                .unwrap_or(&[]);
            let name = self.fleet.interner.get(&r.name);
            let version = self.fleet.interner.get(&r.version);
            if self.fleet.record {
                self.state.bodies.insert((ty, name.clone()), body.to_vec());
            }
            self.on_resource(ty, &name, &version, body, at_us);
            match self.learn(ty, &version, body) {
                Ok(Some(problem)) => problems.push(problem.to_string()),
                Ok(None) => {}
                Err(e) => self.bad_response(e),
            }
            items.push((name, version));
        }
        {
            let st = self.state.ty(ty);
            st.held.extend(items);
            for name in &resp.removed_resources {
                st.held.remove(name.as_str());
            }
            st.received = true;
            st.nonce = resp.nonce.clone();
        }
        if ty == XdsType::Listener {
            problems.extend(self.duplicate_listener_address());
        }
        let error_detail = self.reject(ty, &problems);
        let mut out = Vec::new();
        let dependent = match ty {
            XdsType::Cluster => Some((XdsType::Endpoint, self.wanted_endpoints())),
            XdsType::Listener => Some((XdsType::Route, self.wanted_routes())),
            _ => None,
        };
        if let Some((dep, wanted)) = dependent {
            let st = self.state.ty(dep);
            if st.subscribed != wanted {
                let subscribe: Vec<String> = wanted
                    .difference(&st.subscribed)
                    .map(|n| n.to_string())
                    .collect();
                let unsubscribe: Vec<String> = st
                    .subscribed
                    .difference(&wanted)
                    .map(|n| n.to_string())
                    .collect();
                st.held.retain(|n, _| wanted.contains(n));
                st.subscribed = wanted;
                out.push(DeltaDiscoveryRequest {
                    type_url: dep.type_url().to_string(),
                    resource_names_subscribe: subscribe,
                    resource_names_unsubscribe: unsubscribe,
                    ..Default::default()
                });
            }
        }
        out.push(DeltaDiscoveryRequest {
            type_url: resp.type_url,
            response_nonce: resp.nonce,
            error_detail,
            ..Default::default()
        });
        out
    }
}

/// The string in field 1 of a protobuf message (every xDS resource's name), found by
/// walking the fields. None when absent or malformed.
fn field1_string(mut buf: &[u8]) -> Option<&str> {
    fn varint(buf: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = buf.split_first()?;
            *buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                varint(&mut buf)?;
            }
            1 => buf = buf.get(8..)?,
            5 => buf = buf.get(4..)?,
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                let value = buf.get(..len)?;
                if field == 1 {
                    return std::str::from_utf8(value).ok();
                }
                buf = &buf[len..];
            }
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use shoal_proto::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, Cluster};
    use shoal_proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

    #[test]
    fn finds_resource_names_in_the_bytes() {
        let cla = ClusterLoadAssignment {
            cluster_name: "outbound|8080||a.b.svc.cluster.local".into(),
            ..Default::default()
        };
        assert_eq!(
            field1_string(&cla.encode_to_vec()),
            Some("outbound|8080||a.b.svc.cluster.local")
        );
        let c = Cluster {
            name: "x".into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(3)),
            ..Default::default()
        };
        assert_eq!(field1_string(&c.encode_to_vec()), Some("x"));
        assert_eq!(field1_string(&[]), None);
        assert_eq!(field1_string(&[0x0a, 0x05, b'a']), None);
    }

    #[test]
    fn node_ids_follow_istio() {
        let p = ProxyIdentity::new(251, "ns-3");
        assert_eq!(
            p.node_id,
            "sidecar~10.1.1.2~pod-251.ns-3~ns-3.svc.cluster.local"
        );
        let node = p.node();
        let meta = node.metadata.unwrap();
        assert!(matches!(
            &meta.fields["NAMESPACE"].kind,
            Some(Kind::StringValue(ns)) if ns == "ns-3"
        ));
        assert!(matches!(
            &meta.fields["INTERCEPTION_MODE"].kind,
            Some(Kind::StringValue(m)) if m == "NONE"
        ));
        // Captured: no INTERCEPTION_MODE (Istio's default, REDIRECT), the service's label.
        let meta = p.captured("svc-2").node().metadata.unwrap();
        assert!(!meta.fields.contains_key("INTERCEPTION_MODE"));
        let Some(Kind::StructValue(labels)) = &meta.fields["LABELS"].kind else {
            panic!("LABELS is a struct");
        };
        assert!(matches!(
            &labels.fields["app"].kind,
            Some(Kind::StringValue(a)) if a == "svc-2"
        ));
    }
}
