//! Views: proxies whose configuration is the same compute it once.
//!
//! What the generators produce for a proxy depends on the snapshot and on a few fields of
//! the proxy — its [`ViewKey`]: kind, namespace, labels, cluster, interception mode, pod
//! ports and locality, and for gateways the identity the stream verified (gateway
//! credentials go by it); never its id, IP or pod name. Every stream whose proxy has the same
//! key shares one [`View`], which computes once per snapshot and subscription:
//!
//! - the proxy scope (per PushContext, kept across contexts with the same scope inputs);
//! - each type's resources, encoded and shared by `Arc` (an [`Output`]): clusters,
//!   listeners and routes per PushContext (endpoint-only snapshots reuse them, but for
//!   clusters only while the workload identities behind the hosts stay the same), load
//!   assignments per snapshot — and as long as the PushContext is the same, only the
//!   assignments of services whose endpoint shards changed since the view's previous
//!   output are rebuilt (shards are shared by `Arc` until they change);
//! - the difference between consecutive outputs (a [`Diff`]), which every stream that held
//!   the previous output sends as it is.
//!
//! Outputs keep their resources in runs shared by `Arc` ([`Output`]): an endpoint change
//! rebuilds only the subscribed names of the hosts that changed (the endpoint index logs
//! them), a delta request derives the new names' output from the old names' one, and a
//! diff skips shared runs. So what a change costs follows the change, not the size of a
//! subscription (up to `MAX_NAMES_PER_SUBSCRIPTION` names; docs/reliability.md).
//!
//! A push of a change to N proxies of one view therefore costs one generation plus N
//! writes. Generation runs on the blocking pool, at most one task per core at a time
//! ([`Generation`]), so that it never holds the workers that accept connections and read
//! ACKs. The generator cache below the views stays the source of truth per resource;
//! `SHOAL_CACHE_ASSERT=1` also checks every view output against the stream's own proxy
//! (see `Session::output`), proving the view key complete.

mod names;
mod output;

use crate::generate::cache::GeneratorCache;
use crate::generate::{Resource, Side, Snapshot};
use crate::hashing::fingerprint;
use crate::index::endpoints::EndpointIndex;
use crate::index::proxy::{Interception, IstioVersion, Proxy, ProxyKind, VerifiedIdentity};
use crate::index::push_context::{ContextId, PushContext};
use crate::index::scope::ProxyScope;
pub use names::NameSet;
pub use output::{Diff, Held, Output};
use shoal_common::model::Locality;
use shoal_proto::{parse_outbound_cluster_name, XdsType};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use tokio::sync::{OnceCell, Semaphore};

/// The proxy fields generated configuration depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ViewKey {
    kind: ProxyKind,
    namespace: String,
    labels: BTreeMap<String, String>,
    cluster_id: String,
    interception: Interception,
    pod_ports: BTreeMap<String, u16>,
    locality: Locality,
    network: String,
    requested_network_view: Vec<String>,
    /// Gateways only: SDS authorizes credentials by it, so streams of different verified
    /// identities never share an SDS output. Sidecars get no credentials, and no other
    /// generator reads it: leaving it out keeps their views shared.
    verified: Option<VerifiedIdentity>,
    /// istio-proxy's release: telemetry filters and version gates depend on it.
    istio_version: Option<IstioVersion>,
    /// Whether the proxy loads internal listeners: HBONE origination depends on it.
    internal_listener: bool,
}

impl ViewKey {
    /// The key of a sidecar's outbound part (see [`View::for_type`]): its labels cut down to
    /// `label_keys`, the keys config selects proxies by for their outbound configuration,
    /// and no pod ports (only inbound listeners and clusters read them).
    fn outbound_part(&self, label_keys: &BTreeSet<String>) -> ViewKey {
        ViewKey {
            labels: self
                .labels
                .iter()
                .filter(|(k, _)| label_keys.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            pod_ports: BTreeMap::new(),
            ..self.clone()
        }
    }

    /// The view key of a proxy.
    pub fn of(proxy: &Proxy) -> ViewKey {
        // Destructured so that a new proxy field does not compile until it is classified:
        // generator input (here) or identity only (ignored).
        let Proxy {
            id: _,
            ip: _,
            pod: _,
            // Checked when the stream is authorized; no generator reads it.
            service_account: _,
            verified,
            kind,
            namespace,
            labels,
            cluster_id,
            interception,
            pod_ports,
            locality,
            istio_version,
            internal_listener,
            // Load assignments split endpoints by the proxy's network (and the networks it
            // asks to see): part of the outbound part's key, so shared per network.
            network,
            requested_network_view,
            // Only ztunnel's on-demand names read it (`Session::intern`), not its view.
            node_name: _,
        } = proxy;
        if *kind == ProxyKind::Ztunnel {
            // One mesh-wide view: every ztunnel gets every address and policy (as from
            // istiod), and the ambient generators read nothing of the proxy.
            return ViewKey {
                kind: ProxyKind::Ztunnel,
                namespace: String::new(),
                labels: BTreeMap::new(),
                cluster_id: String::new(),
                interception: Interception::None,
                pod_ports: BTreeMap::new(),
                locality: Locality::default(),
                network: String::new(),
                requested_network_view: Vec::new(),
                verified: None,
                istio_version: None,
                internal_listener: false,
            };
        }
        ViewKey {
            kind: *kind,
            namespace: namespace.clone(),
            labels: labels.clone(),
            cluster_id: cluster_id.clone(),
            interception: *interception,
            pod_ports: pod_ports.clone(),
            locality: locality.clone(),
            network: network.clone(),
            requested_network_view: requested_network_view.clone(),
            verified: match kind {
                ProxyKind::Router => verified.clone(),
                ProxyKind::Sidecar | ProxyKind::Proxyless | ProxyKind::Ztunnel => None,
            },
            istio_version: *istio_version,
            internal_listener: *internal_listener,
        }
    }
}

/// Requested resource names of a non-wildcard type, shared by the streams of a view that
/// requested the same names (see [`View::intern`]).
pub type Names = Arc<NameSet>;

/// How a stream's requested names were made from the ones it had (a delta request's
/// subscribe and unsubscribe): the output for the new names is derived from the output for
/// the old ones, at the cost of the change rather than of every name.
#[derive(Debug, Clone)]
pub struct NamesChange {
    /// The names before.
    pub from: Names,
    /// Names in the new set that `from` does not have.
    pub added: Vec<String>,
    /// Names of `from` the new set does not have.
    pub removed: Vec<String>,
}

/// Runs generation off the connection workers: on the blocking pool, at most `permits`
/// tasks at a time, so a full push never starves accepts, handshakes and ACKs.
#[derive(Clone)]
pub struct Generation {
    cache: GeneratorCache,
    permits: Arc<Semaphore>,
}

impl Generation {
    /// Generation through `cache`, `parallelism` tasks at a time (at least one).
    pub fn new(cache: GeneratorCache, parallelism: usize) -> Generation {
        Generation {
            cache,
            permits: Arc::new(Semaphore::new(parallelism.max(1))),
        }
    }

    /// One task per core.
    pub fn per_core(cache: GeneratorCache) -> Generation {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Generation::new(cache, cores)
    }

    /// The generator cache.
    pub fn cache(&self) -> &GeneratorCache {
        &self.cache
    }

    /// Runs `f` on the blocking pool once a permit is free. A panic in `f` (a generator
    /// bug) resumes in the caller. (The cache assert mode aborts the process instead.)
    pub async fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let _permit = self.permits.acquire().await;
        match tokio::task::spawn_blocking(f).await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("generation task did not finish: {e}"),
        }
    }
}

/// Live views by key. A view lives as long as a stream (or, for a part, a view) holds it.
type ViewMap = Arc<Mutex<HashMap<ViewKey, Weak<View>>>>;

/// Every live view, by key, and every live outbound part.
#[derive(Clone)]
pub struct Views {
    map: ViewMap,
    /// Outbound parts by their key (see [`View::for_type`]); a separate map, since a part
    /// serves only the outbound types, whatever the labels of its first proxy.
    parts: ViewMap,
    generation: Generation,
}

impl Views {
    /// Views generating through `generation`.
    pub fn new(generation: Generation) -> Views {
        Views {
            map: Arc::default(),
            parts: Arc::default(),
            generation,
        }
    }

    /// The view of a proxy (created for the first proxy of its key).
    pub fn view_for(&self, proxy: &Proxy) -> Arc<View> {
        self.find_or_insert(&self.map, ViewKey::of(proxy), proxy)
    }

    fn find_or_insert(&self, map: &ViewMap, key: ViewKey, proxy: &Proxy) -> Arc<View> {
        let mut map = lock(map);
        if let Some(view) = map.get(&key).and_then(Weak::upgrade) {
            return view;
        }
        // Forget views whose streams are all gone, now and then (amortized O(1)).
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, v| v.strong_count() > 0);
        }
        let view = Arc::new(View {
            proxy: proxy.clone(),
            key: key.clone(),
            views: self.clone(),
            inner: Mutex::default(),
        });
        map.insert(key, Arc::downgrade(&view));
        view
    }

    /// How many views have streams.
    pub fn live(&self) -> usize {
        live(&self.map)
    }

    /// How many outbound parts views hold.
    pub fn live_parts(&self) -> usize {
        live(&self.parts)
    }

    /// The generation pool.
    pub fn generation(&self) -> &Generation {
        &self.generation
    }
}

fn live(map: &ViewMap) -> usize {
    lock(map).values().filter(|v| v.strong_count() > 0).count()
}

/// The shared configuration of the proxies of one view key.
pub struct View {
    /// The first proxy of the view: generators read only its view-key fields.
    proxy: Proxy,
    key: ViewKey,
    /// Where the view finds its outbound part, and its generation pool.
    views: Views,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    scope: Option<(ContextId, Arc<ProxyScope>)>,
    /// The outbound part for a PushContext (see [`View::for_type`]); `None`: the view is
    /// its own part (not kept as an `Arc` in itself: that cycle would never drop).
    part: Option<(ContextId, Option<Arc<View>>)>,
    /// A sidecar's inbound clusters and listener, per PushContext (see [`View::composed`]).
    inbound: HashMap<XdsType, (ContextId, Inbound)>,
    /// A sidecar's clusters and listeners: its part's outbound output with its inbound
    /// resources put in, and the two it was made from.
    composed: HashMap<XdsType, Composed>,
    names: Vec<(XdsType, Weak<NameSet>)>,
    slots: HashMap<SlotKey, Slot>,
    /// The last diff computed per slot: (from, to, diff).
    diffs: HashMap<SlotKey, CachedDiff>,
}

/// A sidecar view's own inbound resources of one type.
type Inbound = Arc<Vec<Arc<Resource>>>;

/// An output composed of a part's outbound output and a view's inbound resources.
struct Composed {
    outbound: Arc<Output>,
    inbound: Inbound,
    output: Arc<Output>,
}

/// The slot of a part's outbound side of a wildcard type (names are never at address 1).
const OUTBOUND_SLOT: usize = 1;

/// A diff between two outputs, and the outputs it was computed between. Held weakly: once
/// no stream holds the older output, the diff can serve nobody, and must not keep that
/// output (a whole previous configuration per view) alive.
type CachedDiff = (Weak<Output>, Weak<Output>, Arc<Diff>);

/// A type and the identity of its requested names (0: wildcard).
type SlotKey = (XdsType, usize);

/// The slot of `ty` for `names` (ignored for types wildcard to proxies of `kind`).
fn slot_key(kind: ProxyKind, ty: XdsType, names: &Names) -> SlotKey {
    if kind.wildcard(ty) {
        (ty, 0)
    } else {
        (ty, Arc::as_ptr(names) as usize)
    }
}

/// One type's output for one set of names, and what it was computed from.
struct Slot {
    /// Keeps the names (and so the key's pointer) alive.
    names: Option<Names>,
    /// The context it was made from (not the context itself: a view untouched by later
    /// changes would keep every context it was last built from alive).
    ctx: Stamp,
    endpoints: EndpointStamp,
    number: u64,
    cell: Arc<OnceCell<Arc<Output>>>,
    /// The requested names by service hostname, made when first needed and kept while
    /// the names are the same (see [`View::build`]).
    hosts: Arc<OnceLock<HostNames>>,
}

/// Requested EDS names by the service hostname they name (well-formed names only: the
/// others have no resource), as (the host's fingerprint, the name's position in the set),
/// sorted: one allocation, 16 bytes a name. (A map of hosts to cloned names allocated
/// every name again, and the first endpoint change after a fleet connected spent half of
/// its server CPU faulting that memory in on the generation threads.)
struct HostNames(Vec<(u64, u32)>);

impl HostNames {
    fn new(names: &NameSet) -> HostNames {
        let mut index: Vec<(u64, u32)> = names
            .iter()
            .enumerate()
            .filter_map(|(at, name)| {
                let (_, _, host) = parse_outbound_cluster_name(name)?;
                Some((fingerprint(host), u32::try_from(at).ok()?))
            })
            .collect();
        index.sort_unstable();
        HostNames(index)
    }

    /// The names of `host` in `names`, the set this index was made from (or an equal one).
    fn names<'a>(&'a self, names: &'a NameSet, host: &'a str) -> impl Iterator<Item = &'a String> {
        let key = fingerprint(host);
        let from = self.0.partition_point(|(k, _)| *k < key);
        self.0[from..]
            .iter()
            .take_while(move |(k, _)| *k == key)
            .filter_map(|(_, at)| names.get(*at as usize))
            // Hosts of one fingerprint: each keeps its own names.
            .filter(move |name| {
                parse_outbound_cluster_name(name).is_some_and(|(_, _, h)| h == host)
            })
    }
}

impl Slot {
    /// Whether this output is still the one for `snap`: same PushContext, and for load
    /// assignments the same endpoints, for clusters the same workload identities behind
    /// the hosts (auto mTLS's SANs and sidecar checks), for gateway credentials the same
    /// workloads (who serves a Secret).
    fn valid_for(&self, ty: XdsType, snap: &Snapshot) -> bool {
        self.ctx.id == snap.ctx.id
            && match ty {
                // Workloads come from the endpoints.
                XdsType::Endpoint | XdsType::Address => self
                    .endpoints
                    .index
                    .as_ref()
                    .is_some_and(|i| Arc::ptr_eq(i, &snap.endpoints)),
                XdsType::Cluster => self.endpoints.identities == snap.endpoints.identities_epoch(),
                XdsType::Secret => self.endpoints.workloads == snap.endpoints.workloads_epoch(),
                _ => true,
            }
    }
}

/// What an output records of the PushContext it was made from.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    id: ContextId,
    /// See [`PushContext::endpoint_inputs`].
    endpoint_inputs: u64,
}

impl Stamp {
    fn of(ctx: &PushContext) -> Stamp {
        Stamp {
            id: ctx.id,
            endpoint_inputs: ctx.endpoint_inputs,
        }
    }
}

/// What an output records of the endpoint index it was made from: the index itself only
/// for the types made from it (a later one is derived from it), else the epochs their
/// validity reads, so that outputs untouched by endpoint changes keep no old index alive.
struct EndpointStamp {
    index: Option<Arc<EndpointIndex>>,
    identities: u64,
    workloads: u64,
}

impl EndpointStamp {
    fn of(ty: XdsType, endpoints: &Arc<EndpointIndex>) -> EndpointStamp {
        EndpointStamp {
            index: matches!(ty, XdsType::Endpoint | XdsType::Address).then(|| endpoints.clone()),
            identities: endpoints.identities_epoch(),
            workloads: endpoints.workloads_epoch(),
        }
    }
}

/// A previous output a new one may be derived from.
struct Prev {
    output: Arc<Output>,
    ctx: Stamp,
    /// The endpoint index of a load assignment or address output.
    endpoints: Option<Arc<EndpointIndex>>,
    hosts: Arc<OnceLock<HostNames>>,
    /// `output` is for other names, that these were made from.
    names: Option<NamesChange>,
}

impl View {
    /// The view that makes this view's resources of `ty` under `ctx`. A sidecar's load
    /// assignments and routes are outbound configuration only: they come from its outbound
    /// part, shared by every sidecar view whose key is the same but for labels no config
    /// selects outbound configuration by, and for the pod's ports — in Istio's default mesh
    /// every sidecar of a namespace, whichever service it is a pod of. Clusters and
    /// listeners (which hold the inbound side too) and gateways' resources stay per view.
    /// The cache assert mode checks part outputs against the stream's own proxy, as every
    /// view output. A sidecar's clusters and listeners are composed: the part's outbound
    /// ones with the view's own inbound ones put in ([`View::composed`]).
    pub fn for_type(self: &Arc<Self>, ty: XdsType, ctx: &Arc<PushContext>) -> Arc<View> {
        if self.key.kind != ProxyKind::Sidecar || !matches!(ty, XdsType::Endpoint | XdsType::Route)
        {
            return self.clone();
        }
        self.part(ctx)
    }

    /// This sidecar view's outbound part under `ctx`: the view of its key with the labels
    /// no config selects outbound configuration by, and the pod's ports, left out.
    fn part(self: &Arc<Self>, ctx: &Arc<PushContext>) -> Arc<View> {
        if let Some((c, part)) = &lock(&self.inner).part {
            if *c == ctx.id {
                return part.clone().unwrap_or_else(|| self.clone());
            }
        }
        let key = self.key.outbound_part(&ctx.outbound_label_keys);
        let other = (key != self.key).then(|| {
            self.views
                .find_or_insert(&self.views.parts, key, &self.proxy)
        });
        lock(&self.inner).part = Some((ctx.id, other.clone()));
        other.unwrap_or_else(|| self.clone())
    }

    /// The proxy scope for a PushContext, computed once per context, and kept across
    /// contexts with the same scope inputs (a VirtualService or policy change recomputes
    /// no scope; see [`PushContext::scope_inputs`]).
    pub fn scope(&self, ctx: &Arc<PushContext>) -> Arc<ProxyScope> {
        let mut inner = lock(&self.inner);
        match &inner.scope {
            Some((inputs, s)) if *inputs == ctx.scope_inputs => s.clone(),
            _ => {
                let scope = Arc::new(ProxyScope::compute(&self.proxy, ctx));
                inner.scope = Some((ctx.scope_inputs, scope.clone()));
                scope
            }
        }
    }

    /// The shared instance of a set of requested names of `ty`: streams of this view that
    /// request the same names share their outputs and diffs.
    pub fn intern(&self, ty: XdsType, names: NameSet) -> Names {
        let mut inner = lock(&self.inner);
        inner.names.retain(|(_, w)| w.strong_count() > 0);
        let found = inner
            .names
            .iter()
            .filter(|(t, _)| *t == ty)
            .filter_map(|(_, w)| w.upgrade())
            .find(|n| **n == names);
        if let Some(n) = found {
            return n;
        }
        let n = Arc::new(names);
        inner.names.push((ty, Arc::downgrade(&n)));
        n
    }

    /// The resources of `ty` for `names` (ignored for wildcard types) in `snap`, generated
    /// once for every stream of the view.
    pub async fn output(
        self: &Arc<Self>,
        ty: XdsType,
        names: &Names,
        snap: &Arc<Snapshot>,
    ) -> Arc<Output> {
        self.output_from(ty, names, snap, None).await
    }

    /// [`View::output`], for names made from others by `change`: a new set of names gets
    /// its output from the other set's, when that one is for the same snapshot.
    pub async fn output_from(
        self: &Arc<Self>,
        ty: XdsType,
        names: &Names,
        snap: &Arc<Snapshot>,
        change: Option<&NamesChange>,
    ) -> Arc<Output> {
        if self.key.kind == ProxyKind::Sidecar && matches!(ty, XdsType::Cluster | XdsType::Listener)
        {
            return self.composed(ty, snap).await;
        }
        self.side_output(ty, Side::All, names, snap, change).await
    }

    /// A sidecar's clusters or listeners: its outbound part's output (generated once for
    /// every sidecar view of the part) with this view's inbound resources put in, sharing
    /// every run of the part's output they are not in.
    async fn composed(self: &Arc<Self>, ty: XdsType, snap: &Arc<Snapshot>) -> Arc<Output> {
        let part = self.part(&snap.ctx);
        let outbound = part
            .side_output(ty, Side::Outbound, &Names::default(), snap, None)
            .await;
        let inbound = self.inbound(ty, snap).await;
        if inbound.is_empty() {
            return outbound;
        }
        if let Some(c) = lock(&self.inner).composed.get(&ty) {
            if Arc::ptr_eq(&c.outbound, &outbound) && Arc::ptr_eq(&c.inbound, &inbound) {
                return c.output.clone();
            }
        }
        let output = Arc::new(outbound.with_changes(inbound.to_vec(), &[]));
        lock(&self.inner).composed.insert(
            ty,
            Composed {
                outbound,
                inbound,
                output: output.clone(),
            },
        );
        output
    }

    /// This view's inbound resources of `ty` under the snapshot's PushContext (they depend
    /// on nothing else: the services selecting the workload, its ports, its policies).
    async fn inbound(self: &Arc<Self>, ty: XdsType, snap: &Arc<Snapshot>) -> Inbound {
        if let Some((ctx, inbound)) = lock(&self.inner).inbound.get(&ty) {
            if *ctx == snap.ctx.id {
                return inbound.clone();
            }
        }
        let scope = self.scope(&snap.ctx);
        let (view, snap_) = (self.clone(), snap.clone());
        let generation = &self.views.generation;
        let cache = generation.cache.clone();
        let inbound = Arc::new(
            generation
                .run(move || {
                    cache.generate_side(Side::Inbound, ty, &view.proxy, &scope, &snap_, &[])
                })
                .await,
        );
        lock(&self.inner)
            .inbound
            .insert(ty, (snap.ctx.id, inbound.clone()));
        inbound
    }

    /// One side's output of `ty` for `names`, in a slot of this view.
    async fn side_output(
        self: &Arc<Self>,
        ty: XdsType,
        side: Side,
        names: &Names,
        snap: &Arc<Snapshot>,
        change: Option<&NamesChange>,
    ) -> Arc<Output> {
        let wildcard = self.key.kind.wildcard(ty);
        let key = match side {
            Side::Outbound if wildcard => (ty, OUTBOUND_SLOT),
            _ => slot_key(self.key.kind, ty, names),
        };
        let names = (!wildcard).then(|| names.clone());
        let scope = self.scope(&snap.ctx);
        let (cell, prev) = {
            let mut guard = lock(&self.inner);
            let inner = &mut *guard;
            match inner.slots.get_mut(&key) {
                Some(slot) if slot.valid_for(ty, snap) => {
                    slot.number = slot.number.max(snap.number);
                    (slot.cell.clone(), None)
                }
                // A stream behind the newest snapshot: generate for it alone.
                Some(slot) if slot.number > snap.number => (Arc::new(OnceCell::new()), None),
                slot => {
                    // Same key, same names: the names' index by host carries over.
                    let hosts = slot.as_ref().map(|s| s.hosts.clone()).unwrap_or_default();
                    let mut prev = slot.and_then(|s| {
                        Some(Prev {
                            output: s.cell.get()?.clone(),
                            ctx: s.ctx,
                            endpoints: s.endpoints.index.clone(),
                            hosts: s.hosts.clone(),
                            names: None,
                        })
                    });
                    // New names made from others whose output is for this snapshot.
                    // ztunnel's addresses are no function of each name alone once a name
                    // goes (a workload asked for by address, by its service and by its
                    // node is still asked for): built afresh then.
                    let derivable =
                        |c: &&NamesChange| ty != XdsType::Address || c.removed.is_empty();
                    if prev.is_none() && !wildcard {
                        prev = change.filter(derivable).and_then(|c| {
                            let from = inner.slots.get(&slot_key(self.key.kind, ty, &c.from))?;
                            if !from.valid_for(ty, snap) {
                                return None;
                            }
                            Some(Prev {
                                output: from.cell.get()?.clone(),
                                ctx: from.ctx,
                                endpoints: from.endpoints.index.clone(),
                                hosts: Arc::default(),
                                names: Some(c.clone()),
                            })
                        });
                    }
                    let cell = Arc::new(OnceCell::new());
                    let fresh = Slot {
                        names: names.clone(),
                        ctx: Stamp::of(&snap.ctx),
                        endpoints: EndpointStamp::of(ty, &snap.endpoints),
                        number: snap.number,
                        cell: cell.clone(),
                        hosts,
                    };
                    if inner.slots.insert(key, fresh).is_none() {
                        // A new set of names: drop the slots of names nobody requests.
                        inner.slots.retain(|_, s| {
                            s.names.as_ref().is_none_or(|n| Arc::strong_count(n) > 1)
                        });
                        inner
                            .diffs
                            .retain(|(t, p), _| *p == 0 || inner.slots.contains_key(&(*t, *p)));
                    }
                    (cell, prev)
                }
            }
        };
        cell.get_or_init(|| self.build(ty, side, names, scope, snap.clone(), prev))
            .await
            .clone()
    }

    /// What `cur` (an output of this view for `ty` and `names`) changes for a proxy holding
    /// `held`. Streams that held the same previous output share one diff.
    pub fn diff(&self, ty: XdsType, names: &Names, held: &Held, cur: &Arc<Output>) -> Arc<Diff> {
        let Held::Shared(prev) = held else {
            return Arc::new(Diff::between(held, cur));
        };
        let key = slot_key(self.key.kind, ty, names);
        // A live weak pointer's address is not reused, so equal addresses are the same
        // outputs.
        if let Some((from, to, d)) = lock(&self.inner).diffs.get(&key) {
            if std::ptr::eq(from.as_ptr(), Arc::as_ptr(prev))
                && std::ptr::eq(to.as_ptr(), Arc::as_ptr(cur))
            {
                return d.clone();
            }
        }
        let d = Arc::new(Diff::between(held, cur));
        let mut inner = lock(&self.inner);
        // Diffs from outputs no stream holds any more serve nobody.
        inner
            .diffs
            .retain(|_, (from, _, _)| from.strong_count() > 0);
        inner
            .diffs
            .insert(key, (Arc::downgrade(prev), Arc::downgrade(cur), d.clone()));
        d
    }

    async fn build(
        self: &Arc<Self>,
        ty: XdsType,
        side: Side,
        names: Option<Names>,
        scope: Arc<ProxyScope>,
        snap: Arc<Snapshot>,
        prev: Option<Prev>,
    ) -> Arc<Output> {
        let view = self.clone();
        let generation = &self.views.generation;
        let cache = generation.cache.clone();
        generation
            .run(move || {
                let generate = |names: &[String]| {
                    cache.generate_side(side, ty, &view.proxy, &scope, &snap, names)
                };
                let all =
                    || -> Vec<String> { names.iter().flat_map(|n| n.iter().cloned()).collect() };
                // Other names' output for this snapshot: take out what was unsubscribed, add
                // what was subscribed.
                if let Some(change) = prev.as_ref().and_then(|p| p.names.as_ref().map(|c| (p, c))) {
                    let (prev, change) = change;
                    let added = generate(&change.added);
                    return Arc::new(prev.output.with_changes(added, &change.removed));
                }
                // Load assignments read the context only through its endpoint inputs.
                let reusable = prev.as_ref().and_then(|p| {
                    let index = p.endpoints.as_ref()?;
                    (ty == XdsType::Endpoint && p.ctx.endpoint_inputs == snap.ctx.endpoint_inputs)
                        .then_some((p, index))
                });
                let Some((prev, prev_endpoints)) = reusable else {
                    return Arc::new(Output::new(generate(&all())));
                };
                // Same endpoint inputs: an assignment depends only on its service's endpoint
                // shards, which the index shares by `Arc` until they change. Rebuild the
                // assignments whose shards are not the same object, keep the rest.
                let stale = |name: &str| {
                    parse_outbound_cluster_name(name).is_none_or(|(_, _, host)| {
                        !same_shards(prev_endpoints.host(host), snap.endpoints.host(host))
                    })
                };
                // The hosts changed since the previous output, looked up in the names'
                // index by host: the cost follows the change, not the subscription.
                if let (Some(hosts), Some(requested)) =
                    (snap.endpoints.changed_since(prev_endpoints), &names)
                {
                    let by_host = prev.hosts.get_or_init(|| HostNames::new(requested));
                    let rebuild: Vec<String> = hosts
                        .iter()
                        .flat_map(|host| by_host.names(requested, host))
                        .filter(|name| stale(name))
                        .cloned()
                        .collect();
                    if rebuild.is_empty() {
                        return prev.output.clone();
                    }
                    let fresh = generate(&rebuild);
                    // Every name keeps its resource (else the output is built afresh).
                    if fresh.len() == rebuild.len() {
                        if let Some(out) = prev.output.replaced(fresh) {
                            return Arc::new(out);
                        }
                    }
                }
                let rebuild: Vec<String> = all().into_iter().filter(|n| stale(n)).collect();
                let mut resources = generate(&rebuild);
                resources.extend(prev.output.iter().filter(|r| !stale(&r.name)).cloned());
                Arc::new(Output::new(resources))
            })
            .await
    }
}

/// Whether two snapshots hold the same endpoint shards of a host (the same object: shards
/// are copied on write, and the older index is held by the slot, so the same pointer means
/// the same content).
fn same_shards(
    a: Option<&Arc<crate::index::endpoints::HostShards>>,
    b: Option<&Arc<crate::index::endpoints::HostShards>>,
) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::metrics::CacheMetrics;
    use crate::testutil::{endpoint, service, sidecar_proxy, slice, Mesh};

    fn mesh() -> Mesh {
        Mesh::new()
            .with_service(service("a", "web", &[("http", 8080)]))
            .with_service(service("b", "api", &[("http", 9080)]))
            .with_slice(slice(
                "a",
                "web",
                "web-1",
                &[("http", 8080)],
                vec![endpoint("10.0.0.1", &[])],
            ))
            .with_slice(slice(
                "b",
                "api",
                "api-1",
                &[("http", 9080)],
                vec![endpoint("10.0.1.1", &[])],
            ))
    }

    /// A view's outputs record which context and endpoint index they were made from but
    /// keep neither alive: in a soak, views a change does not touch would otherwise hold
    /// every context and index they were last built from (issue 19's RSS growth).
    #[tokio::test]
    async fn outputs_keep_no_old_context_or_endpoint_index_alive() {
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics);
        let views = Views::new(Generation::new(cache, 1));
        let view = views.view_for(&sidecar_proxy("a", &[("app", "client")]));
        let m = mesh();
        let snap = Arc::new(Snapshot {
            number: 1,
            ..m.snapshot()
        });
        let none = Names::default();
        let cds = view.output(XdsType::Cluster, &none, &snap).await;
        let lds = view.output(XdsType::Listener, &none, &snap).await;
        let (ctx, endpoints) = (Arc::downgrade(&snap.ctx), Arc::downgrade(&snap.endpoints));
        drop((snap, m));
        assert!(ctx.upgrade().is_none(), "the context outlived its snapshot");
        assert!(
            endpoints.upgrade().is_none(),
            "the endpoint index outlived its snapshot"
        );
        // The outputs themselves stay.
        assert!(!cds.resources().is_empty());
        drop(lds);
    }

    #[test]
    fn host_names_finds_each_hosts_names_across_runs() {
        // Enough names for several runs of the set, inserted out of order.
        let mut names = NameSet::default();
        for i in (0..700).rev() {
            names.insert(format!(
                "outbound|{}||svc-{}.ns.svc.cluster.local",
                80 + i % 3,
                i / 3
            ));
        }
        names.insert("not-a-cluster-name".to_string());
        let index = HostNames::new(&names);
        assert_eq!(index.0.len(), 700, "the malformed name is not indexed");
        let mut found: Vec<&String> = index.names(&names, "svc-7.ns.svc.cluster.local").collect();
        found.sort();
        assert_eq!(
            found,
            [
                "outbound|80||svc-7.ns.svc.cluster.local",
                "outbound|81||svc-7.ns.svc.cluster.local",
                "outbound|82||svc-7.ns.svc.cluster.local",
            ]
        );
        assert_eq!(
            index.names(&names, "svc-233.ns.svc.cluster.local").count(),
            1
        );
        assert_eq!(
            index.names(&names, "absent.ns.svc.cluster.local").count(),
            0
        );
        // An equal set built another way answers the same.
        let equal: NameSet = names.iter().cloned().collect();
        assert_eq!(index.names(&equal, "svc-7.ns.svc.cluster.local").count(), 3);
    }

    #[tokio::test]
    async fn a_view_generates_once_and_an_endpoint_change_rebuilds_only_its_service() {
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics.clone());
        let views = Views::new(Generation::new(cache, 1));
        let p1 = sidecar_proxy("a", &[("app", "client")]);
        let mut p2 = p1.clone();
        p2.id = "sidecar~10.9.9.9~other.a~a.svc.cluster.local".into();
        p2.ip = "10.9.9.9".into();
        let (v1, v2) = (views.view_for(&p1), views.view_for(&p2));
        assert!(Arc::ptr_eq(&v1, &v2), "id and IP are not part of the view");
        let other = views.view_for(&sidecar_proxy("b", &[("app", "client")]));
        assert!(!Arc::ptr_eq(&v1, &other), "the namespace is");

        let mut m = mesh();
        let first = m.snapshot();
        let snap1 = Arc::new(Snapshot {
            number: 1,
            ..first.clone()
        });
        let none = Names::default();
        let cds = v1.output(XdsType::Cluster, &none, &snap1).await;
        assert!(Arc::ptr_eq(
            &cds,
            &v2.output(XdsType::Cluster, &none, &snap1).await
        ));
        let eds_names: NameSet = cds
            .resources()
            .iter()
            .map(|r| r.name.clone())
            .filter(|n| n.starts_with("outbound|"))
            .collect();
        let names = v1.intern(XdsType::Endpoint, eds_names.clone());
        assert!(Arc::ptr_eq(
            &names,
            &v2.intern(XdsType::Endpoint, eds_names)
        ));
        let eds1 = v1.output(XdsType::Endpoint, &names, &snap1).await;
        assert_eq!(eds1.resources().len(), names.len());

        // Only web's endpoints change: the PushContext is kept, as the pipeline does.
        m.add_slice(slice(
            "a",
            "web",
            "web-1",
            &[("http", 8080)],
            vec![endpoint("10.0.0.2", &[])],
        ));
        let web = "web.a.svc.cluster.local";
        let snap2 = Arc::new(Snapshot {
            ctx: snap1.ctx.clone(),
            endpoints: m.snapshot().endpoints,
            // Snapshots in between (that did not concern this view's EDS) change nothing.
            number: 5,
        });
        assert!(
            Arc::ptr_eq(&cds, &v1.output(XdsType::Cluster, &none, &snap2).await),
            "clusters do not depend on endpoints"
        );
        let misses = metrics.cache_misses.get();
        let eds2 = v2.output(XdsType::Endpoint, &names, &snap2).await;
        assert_eq!(
            metrics.cache_misses.get() - misses,
            1,
            "only outbound|8080||web is rebuilt"
        );
        let held = Held::Shared(eds1.clone());
        let d = v1.diff(XdsType::Endpoint, &names, &held, &eds2);
        let changed: Vec<&str> = d.changed.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(changed, [format!("outbound|8080||{web}")]);
        assert!(d.removed.is_empty());
        assert!(
            Arc::ptr_eq(&d, &v2.diff(XdsType::Endpoint, &names, &held, &eds2)),
            "streams holding the same output share one diff"
        );
        // The incremental output is what a full generation gives.
        let full = Output::new(v1.views.generation.cache.generate(
            XdsType::Endpoint,
            &p1,
            &v1.scope(&snap2.ctx),
            &snap2,
            &names.iter().cloned().collect::<Vec<_>>(),
        ));
        assert_eq!(full.version(), eds2.version());
    }

    /// Sidecars of different services in one namespace (Istio's default mesh) share their
    /// load assignments and routes (one outbound part) but not their clusters and listeners
    /// (the inbound side is theirs); a label some config selects outbound configuration by
    /// splits the part, and only that label.
    #[tokio::test]
    async fn sidecars_of_one_namespace_share_their_outbound_part() {
        use crate::testutil::{captured_proxy, destination_rule};
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics);
        let views = Views::new(Generation::new(cache, 1));
        let mut web = captured_proxy("a", "10.0.0.1", &[("app", "web"), ("version", "v1")]);
        web.pod_ports = BTreeMap::from([("http".to_string(), 8080)]);
        let mut api = captured_proxy("a", "10.0.1.1", &[("app", "api"), ("version", "v1")]);
        api.pod_ports = BTreeMap::from([("http".to_string(), 9080)]);
        let (v_web, v_api) = (views.view_for(&web), views.view_for(&api));
        assert!(!Arc::ptr_eq(&v_web, &v_api));

        let selecting = |name: &str, app: &str, port: u16| {
            let mut svc = service("a", name, &[("http", port)]);
            svc.selector = BTreeMap::from([("app".to_string(), app.to_string())]);
            svc
        };
        let mut m = mesh()
            .with_service(selecting("web-in", "web", 8080))
            .with_service(selecting("api-in", "api", 9080));
        let snap = Arc::new(m.snapshot());
        let part = |v: &Arc<View>, ty, s: &Arc<Snapshot>| v.for_type(ty, &s.ctx);
        for ty in [XdsType::Endpoint, XdsType::Route] {
            assert!(Arc::ptr_eq(
                &part(&v_web, ty, &snap),
                &part(&v_api, ty, &snap)
            ));
        }
        for ty in [XdsType::Cluster, XdsType::Listener] {
            assert!(Arc::ptr_eq(&part(&v_web, ty, &snap), &v_web));
        }
        let cds = v_web
            .output(XdsType::Cluster, &Names::default(), &snap)
            .await;
        let eds_names: NameSet = cds
            .resources()
            .iter()
            .map(|r| r.name.clone())
            .filter(|n| n.starts_with("outbound|"))
            .collect();
        let names = part(&v_web, XdsType::Endpoint, &snap).intern(XdsType::Endpoint, eds_names);
        let eds = part(&v_web, XdsType::Endpoint, &snap)
            .output(XdsType::Endpoint, &names, &snap)
            .await;
        assert!(Arc::ptr_eq(
            &eds,
            &part(&v_api, XdsType::Endpoint, &snap)
                .output(XdsType::Endpoint, &names, &snap)
                .await
        ));
        assert_eq!(views.live_parts(), 1);
        // Clusters: the part's outbound ones, each view's own inbound ones put in; what a
        // generation for the proxy alone gives.
        let cds_api = v_api
            .output(XdsType::Cluster, &Names::default(), &snap)
            .await;
        for (proxy, out) in [(&web, &cds), (&api, &cds_api)] {
            let own = Output::new(v_web.views.generation.cache.generate(
                XdsType::Cluster,
                proxy,
                &ProxyScope::compute(proxy, &snap.ctx),
                &snap,
                &[],
            ));
            assert_eq!(own.version(), out.version());
        }
        assert!(cds.contains("inbound|8080||") && !cds.contains("inbound|9080||"));
        assert!(cds_api.contains("inbound|9080||") && !cds_api.contains("inbound|8080||"));
        assert_ne!(cds.version(), cds_api.version());
        // Their own inbound clusters (`InboundPassthroughCluster`, `inbound|<port>||`) are
        // runs of their own; every other run is one object in both.
        assert_eq!(cds.runs_apart_from(&cds_api), 1);
        assert_eq!(cds_api.runs_apart_from(&cds), 1);
        let lds = v_web
            .output(XdsType::Listener, &Names::default(), &snap)
            .await;
        let lds_api = v_api
            .output(XdsType::Listener, &Names::default(), &snap)
            .await;
        assert!(lds.contains("virtualInbound") && lds.contains("virtualOutbound"));
        assert_eq!(lds.runs_apart_from(&lds_api), 1, "virtualInbound");

        // A DestinationRule for the web pods only: `app` now selects outbound config.
        m.add_config(destination_rule(
            "a",
            "from-web",
            "host: api.b.svc.cluster.local\nworkloadSelector: {matchLabels: {app: web}}\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}\n",
        ));
        let snap2 = Arc::new(m.snapshot());
        assert!(!Arc::ptr_eq(
            &part(&v_web, XdsType::Endpoint, &snap2),
            &part(&v_api, XdsType::Endpoint, &snap2)
        ));
        let mut web2 = web.clone();
        web2.labels.insert("version".into(), "v2".into());
        assert!(
            Arc::ptr_eq(
                &part(&views.view_for(&web2), XdsType::Endpoint, &snap2),
                &part(&v_web, XdsType::Endpoint, &snap2)
            ),
            "`version` selects nothing"
        );
    }

    /// The outbound part is shared per network, not per proxy: sidecars of one namespace
    /// on one network share it, on another network (or asking for another network view)
    /// they do not — their load assignments differ once networks have gateways.
    #[tokio::test]
    async fn the_outbound_part_is_shared_per_network() {
        use crate::testutil::captured_proxy;
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics);
        let views = Views::new(Generation::new(cache, 1));
        let on = |ip: &str, app: &str, network: &str| Proxy {
            network: network.into(),
            ..captured_proxy("a", ip, &[("app", app)])
        };
        let web1 = views.view_for(&on("10.0.0.1", "web", "net1"));
        let api1 = views.view_for(&on("10.0.0.2", "api", "net1"));
        let web2 = views.view_for(&on("10.0.0.3", "web", "net2"));
        let narrow = views.view_for(&Proxy {
            requested_network_view: vec!["net1".into()],
            ..on("10.0.0.4", "web", "net1")
        });
        let snap = Arc::new(mesh().snapshot());
        let part = |v: &Arc<View>| v.for_type(XdsType::Endpoint, &snap.ctx);
        assert!(Arc::ptr_eq(&part(&web1), &part(&api1)));
        assert!(!Arc::ptr_eq(&part(&web1), &part(&web2)));
        assert!(!Arc::ptr_eq(&part(&web1), &part(&narrow)));
        assert_eq!(views.live_parts(), 3);
    }

    /// istio-proxy sidecars (`ISTIO_VERSION`) of different workloads still share their
    /// outbound part, and what a view sends each is what a generation for it alone gives
    /// (the per-workload tracing tags only go on its own inbound listener); an upstream
    /// Envoy of the same namespace and labels gets a view of its own.
    #[tokio::test]
    async fn istio_proxy_sidecars_share_their_outbound_part_too() {
        use crate::index::proxy::IstioVersion;
        use crate::testutil::captured_proxy;
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics);
        let views = Views::new(Generation::new(cache, 1));
        let istio = |app: &str, ip: &str| {
            let mut p = captured_proxy("a", ip, &[("app", app)]);
            p.istio_version = Some(IstioVersion::parse("1.26.0"));
            p.internal_listener = true;
            p
        };
        let (web, api) = (istio("web", "10.0.0.1"), istio("api", "10.0.1.1"));
        let mut upstream = web.clone();
        upstream.istio_version = None;
        upstream.internal_listener = false;
        let (v_web, v_api) = (views.view_for(&web), views.view_for(&api));
        assert!(!Arc::ptr_eq(&v_web, &views.view_for(&upstream)));
        let snap = Arc::new(mesh().snapshot());
        for ty in [XdsType::Endpoint, XdsType::Route] {
            assert!(Arc::ptr_eq(
                &v_web.for_type(ty, &snap.ctx),
                &v_api.for_type(ty, &snap.ctx)
            ));
        }
        for (proxy, view) in [(&web, &v_web), (&api, &v_api)] {
            for ty in [XdsType::Cluster, XdsType::Listener] {
                let out = view.output(ty, &Names::default(), &snap).await;
                let own = Output::new(v_web.views.generation.cache.generate(
                    ty,
                    proxy,
                    &ProxyScope::compute(proxy, &snap.ctx),
                    &snap,
                    &[],
                ));
                assert_eq!(own.version(), out.version(), "{ty:?} of {}", proxy.id);
            }
        }
        let lds = v_web
            .output(XdsType::Listener, &Names::default(), &snap)
            .await;
        let lds_api = v_api
            .output(XdsType::Listener, &Names::default(), &snap)
            .await;
        assert_eq!(lds.runs_apart_from(&lds_api), 1, "virtualInbound");
    }

    /// A view keeps its proxy scope across contexts whose scope inputs are the same (a
    /// VirtualService change), and computes it again when a Sidecar, a service or the
    /// mesh's outbound policy changed.
    #[test]
    fn scopes_survive_a_context_with_the_same_scope_inputs() {
        use crate::testutil::{sidecar, virtual_service};
        let cache = GeneratorCache::new(
            64 << 20,
            true,
            CacheMetrics::register(&prometheus::Registry::new()),
        );
        let views = Views::new(Generation::new(cache, 1));
        let proxy = sidecar_proxy("a", &[("app", "client")]);
        let view = views.view_for(&proxy);
        let mut m = mesh();
        let mut prev = Arc::new(PushContext::build(&m.state));
        let first = view.scope(&prev);
        // Each step: a change, and whether the scope may be kept.
        type Change = fn(&mut Mesh);
        let steps: [(&str, Change, bool); 4] = [
            (
                "a VirtualService",
                |m: &mut Mesh| {
                    m.add_config(virtual_service(
                        "a",
                        "web",
                        "hosts: [web.a.svc.cluster.local]\nhttp: [{route: [{destination: {host: web.a.svc.cluster.local}}]}]\n",
                    ))
                },
                true,
            ),
            (
                "a Sidecar",
                |m: &mut Mesh| {
                    m.add_config(sidecar("a", "default", "egress: [{hosts: [\"./*\"]}]\n"))
                },
                false,
            ),
            (
                "a service",
                |m: &mut Mesh| m.add_service(service("b", "db", &[("tcp", 5432)])),
                false,
            ),
            (
                "the outbound policy",
                |m: &mut Mesh| {
                    let mut mesh = (*m.state.mesh).clone();
                    mesh.outbound_traffic_policy =
                        shoal_common::model::OutboundTrafficMode::RegistryOnly;
                    m.state.mesh = Arc::new(mesh);
                },
                false,
            ),
        ];
        let mut last = first;
        for (what, change, kept) in steps {
            change(&mut m);
            let mut ctx = PushContext::build(&m.state);
            ctx.share_unchanged(&prev);
            let ctx = Arc::new(ctx);
            let scope = view.scope(&ctx);
            assert_eq!(Arc::ptr_eq(&scope, &last), kept, "after {what}");
            assert_eq!(*scope, ProxyScope::compute(&proxy, &ctx), "after {what}");
            (prev, last) = (ctx, scope);
        }
    }

    /// After a change that touched no load-assignment input (a VirtualService), the
    /// PushContext is new but its endpoint inputs are the same: an endpoint change then
    /// rebuilds only its service's assignment, not every subscribed one.
    #[tokio::test]
    async fn assignments_survive_a_context_that_kept_their_inputs() {
        use crate::testutil::virtual_service;
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics.clone());
        let views = Views::new(Generation::new(cache, 1));
        let view = views.view_for(&sidecar_proxy("a", &[("app", "client")]));
        let mut m = mesh();
        let snap1 = Arc::new(Snapshot {
            number: 1,
            ..m.snapshot()
        });
        let names = view.intern(
            XdsType::Endpoint,
            [
                "outbound|8080||web.a.svc.cluster.local".to_string(),
                "outbound|9080||api.b.svc.cluster.local".to_string(),
            ]
            .into_iter()
            .collect(),
        );
        let eds1 = view.output(XdsType::Endpoint, &names, &snap1).await;
        assert_eq!(eds1.len(), 2);

        m.add_config(virtual_service(
            "a",
            "web",
            "hosts: [web.a.svc.cluster.local]\nhttp: [{route: [{destination: {host: web.a.svc.cluster.local}}]}]\n",
        ));
        m.add_slice(slice(
            "a",
            "web",
            "web-1",
            &[("http", 8080)],
            vec![endpoint("10.0.0.2", &[])],
        ));
        let mut ctx2 = PushContext::build(&m.state);
        ctx2.keep_endpoint_inputs(&snap1.ctx);
        let snap2 = Arc::new(Snapshot {
            ctx: Arc::new(ctx2),
            endpoints: m.state.endpoints.clone(),
            number: 2,
        });
        let (hits, misses) = (metrics.cache_hits.get(), metrics.cache_misses.get());
        let eds2 = view.output(XdsType::Endpoint, &names, &snap2).await;
        assert_eq!(metrics.cache_misses.get() - misses, 1, "web's assignment");
        assert_eq!(
            metrics.cache_hits.get() - hits,
            0,
            "api's is kept, not looked up"
        );
        let d = Diff::between(&Held::Shared(eds1), &eds2);
        assert_eq!(d.changed.len(), 1);

        // A context whose inputs were not kept (a DestinationRule could have changed):
        // every assignment is generated again (from the cache).
        let snap3 = Arc::new(Snapshot {
            ctx: Arc::new(PushContext::build(&m.state)),
            endpoints: m.state.endpoints.clone(),
            number: 3,
        });
        let hits = metrics.cache_hits.get();
        view.output(XdsType::Endpoint, &names, &snap3).await;
        assert_eq!(metrics.cache_hits.get() - hits, 2);
    }

    /// Proxyless gRPC nodes name every listener and cluster they want: their outputs are
    /// per set of names (no wildcard slot), shared by the streams asking the same names.
    #[tokio::test]
    async fn proxyless_outputs_are_per_requested_names() {
        use crate::testutil::proxyless_proxy;
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics);
        let views = Views::new(Generation::new(cache, 1));
        let p1 = proxyless_proxy("a", &[("app", "client")]);
        let mut p2 = p1.clone();
        p2.id = "sidecar~10.9.9.9~other.a~a.svc.cluster.local".into();
        let (v1, v2) = (views.view_for(&p1), views.view_for(&p2));
        assert!(Arc::ptr_eq(&v1, &v2));
        assert!(!Arc::ptr_eq(
            &v1,
            &views.view_for(&sidecar_proxy("a", &[("app", "client")]))
        ));
        let snap = Arc::new(mesh().snapshot());
        let none = v1.intern(XdsType::Listener, NameSet::default());
        assert!(v1.output(XdsType::Listener, &none, &snap).await.is_empty());
        let web: NameSet = ["web:8080".to_string()].into_iter().collect();
        let api: NameSet = ["api.b.svc.cluster.local:9080".to_string()]
            .into_iter()
            .collect();
        let (n_web, n_api) = (
            v1.intern(XdsType::Listener, web.clone()),
            v1.intern(XdsType::Listener, api),
        );
        let out_web = v1.output(XdsType::Listener, &n_web, &snap).await;
        let out_api = v1.output(XdsType::Listener, &n_api, &snap).await;
        assert!(out_web.contains("web:8080") && !out_web.contains("api.b.svc.cluster.local:9080"));
        assert!(out_api.contains("api.b.svc.cluster.local:9080") && !out_api.contains("web:8080"));
        assert!(
            Arc::ptr_eq(
                &out_web,
                &v2.output(XdsType::Listener, &v2.intern(XdsType::Listener, web), &snap)
                    .await
            ),
            "the same names share one output"
        );
    }

    /// Clusters depend on the workload identities behind their hosts (auto mTLS's SANs):
    /// an endpoint-only snapshot that changes them must not reuse the view's clusters.
    #[tokio::test]
    async fn clusters_follow_the_identities_behind_their_hosts() {
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics);
        let views = Views::new(Generation::new(cache, 1));
        let proxy = sidecar_proxy("a", &[("app", "client")]);
        let view = views.view_for(&proxy);
        let mut m = mesh();
        let snap1 = Arc::new(Snapshot {
            number: 1,
            ..m.snapshot()
        });
        let none = Names::default();
        let cds1 = view.output(XdsType::Cluster, &none, &snap1).await;

        // web gets a pod with a sidecar and a service account; the PushContext is kept.
        let mut with_identity = endpoint("10.0.0.2", &[("security.istio.io/tlsMode", "istio")]);
        with_identity.service_account = "web".into();
        m.add_slice(slice(
            "a",
            "web",
            "web-1",
            &[("http", 8080)],
            vec![with_identity],
        ));
        let snap2 = Arc::new(Snapshot {
            ctx: snap1.ctx.clone(),
            endpoints: m.snapshot().endpoints,
            number: 2,
        });
        let cds2 = view.output(XdsType::Cluster, &none, &snap2).await;
        assert_ne!(cds1.version(), cds2.version(), "the SANs changed");
        let fresh = Output::new(view.views.generation.cache.generate(
            XdsType::Cluster,
            &proxy,
            &view.scope(&snap2.ctx),
            &snap2,
            &[],
        ));
        assert_eq!(fresh.version(), cds2.version());
    }

    #[tokio::test]
    async fn gateway_credentials_are_per_verified_identity_and_follow_the_workloads() {
        use crate::index::proxy::ProvenCluster;
        use crate::testutil::{config, gateway, router_proxy, verified_as, CLUSTER};
        use shoal_common::credential::{CredentialKeys, TlsCredential};
        use shoal_common::model::ConfigSpec;

        let keys = CredentialKeys::ephemeral();
        let cred = TlsCredential {
            cert_chain: Some("CERT".into()),
            private_key: Some("KEY".into()),
            ca_cert: None,
        };
        let gateway_pod = |labels: &[(&str, &str)]| {
            let mut ep = endpoint("10.0.0.1", labels);
            ep.service_account = "ingress".into();
            slice(
                "istio-system",
                "ingress",
                "ingress-1",
                &[("https", 8443)],
                vec![ep],
            )
        };
        let mut m = Mesh::new()
            .with_config(config(
                "istio-system",
                "web-cert",
                ConfigSpec::Credential(keys.seal(CLUSTER, "istio-system", "web-cert", &cred)),
            ))
            .with_config(gateway(
                "istio-system",
                "public",
                "selector: {istio: ingressgateway}\nservers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: [\"*\"], tls: {mode: SIMPLE, credentialName: web-cert}}]",
            ))
            .with_slice(gateway_pod(&[("istio", "ingressgateway")]));
        m.state.credential_keys = Some(Arc::new(keys));

        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics.clone());
        let views = Views::new(Generation::new(cache, 1));
        let node = router_proxy("istio-system", &[("istio", "ingressgateway")]);
        let token = || ProvenCluster::Token(CLUSTER.into());
        let gw = verified_as(node.clone(), &["ingress"], token());
        let intruder = verified_as(node.clone(), &["default"], token());
        let (v_gw, v_intruder) = (views.view_for(&gw), views.view_for(&intruder));
        assert!(
            !Arc::ptr_eq(&v_gw, &v_intruder),
            "gateways of different verified identities never share a view"
        );
        assert!(Arc::ptr_eq(
            &v_gw,
            &views.view_for(&verified_as(node, &["ingress"], token()))
        ));
        // Sidecars get no credentials: their views ignore the identity.
        let sidecar = sidecar_proxy("a", &[]);
        assert!(Arc::ptr_eq(
            &views.view_for(&sidecar),
            &views.view_for(&verified_as(sidecar.clone(), &["web"], token()))
        ));

        let snap1 = Arc::new(m.snapshot());
        let names = v_gw.intern(
            XdsType::Secret,
            ["kubernetes://web-cert".to_string()].into_iter().collect(),
        );
        let out = v_gw.output(XdsType::Secret, &names, &snap1).await;
        assert_eq!(out.resources().len(), 1);
        let names_i = v_intruder.intern(
            XdsType::Secret,
            ["kubernetes://web-cert".to_string()].into_iter().collect(),
        );
        assert!(v_intruder
            .output(XdsType::Secret, &names_i, &snap1)
            .await
            .resources()
            .is_empty());

        // An endpoint-only snapshot (same PushContext) in which the gateway pod lost the
        // label the Gateway selects: the output is rebuilt, without the credential.
        m.add_slice(gateway_pod(&[("istio", "other")]));
        let snap2 = Arc::new(Snapshot {
            ctx: snap1.ctx.clone(),
            endpoints: m.state.endpoints.clone(),
            number: 2,
        });
        assert_ne!(
            snap1.endpoints.workloads_epoch(),
            snap2.endpoints.workloads_epoch()
        );
        assert!(v_gw
            .output(XdsType::Secret, &names, &snap2)
            .await
            .resources()
            .is_empty());
    }
}
