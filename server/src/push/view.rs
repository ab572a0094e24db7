//! Views: proxies whose configuration is the same compute it once.
//!
//! What the generators produce for a proxy depends on the snapshot and on a few fields of
//! the proxy — its [`ViewKey`]: kind, namespace, labels, cluster, interception mode, pod
//! ports and locality; never its id, IP or pod name. Every stream whose proxy has the same
//! key shares one [`View`], which computes once per snapshot and subscription:
//!
//! - the proxy scope (per PushContext);
//! - each type's resources, encoded and shared by `Arc` (an [`Output`]): clusters,
//!   listeners and routes per PushContext (endpoint-only snapshots reuse them, but for
//!   clusters only while the workload identities behind the hosts stay the same), load
//!   assignments per snapshot — and as long as the PushContext is the same, only the
//!   assignments of services whose endpoint shards changed since the view's previous
//!   output are rebuilt (shards are shared by `Arc` until they change);
//! - the difference between consecutive outputs (a [`Diff`]), which every stream that held
//!   the previous output sends as it is.
//!
//! A push of a change to N proxies of one view therefore costs one generation plus N
//! writes. Generation runs on the blocking pool, at most one task per core at a time
//! ([`Generation`]), so that it never holds the workers that accept connections and read
//! ACKs. The generator cache below the views stays the source of truth per resource;
//! `SHOAL_CACHE_ASSERT=1` also checks every view output against the stream's own proxy
//! (see `Session::output`), proving the view key complete.

use crate::generate::cache::GeneratorCache;
use crate::generate::{Resource, Snapshot};
use crate::index::proxy::{Interception, Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use crate::push::chunks::Gathered;
use shoal_common::model::Locality;
use shoal_proto::{content_version, parse_outbound_cluster_name, XdsType};
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
}

impl ViewKey {
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
            kind,
            namespace,
            labels,
            cluster_id,
            interception,
            pod_ports,
            locality,
        } = proxy;
        ViewKey {
            kind: *kind,
            namespace: namespace.clone(),
            labels: labels.clone(),
            cluster_id: cluster_id.clone(),
            interception: *interception,
            pod_ports: pod_ports.clone(),
            locality: locality.clone(),
        }
    }
}

/// Requested resource names of a non-wildcard type, shared by the streams of a view that
/// requested the same names (see [`View::intern`]).
pub type Names = Arc<BTreeSet<String>>;

/// One type's resources for a view, ordered by name.
#[derive(Debug, Default)]
pub struct Output {
    resources: Vec<Arc<Resource>>,
    version: OnceLock<String>,
    /// The resources' response entries, gathered once for every stream.
    pub gathered: Gathered,
}

impl Output {
    /// An output of these resources.
    pub fn new(resources: Vec<Arc<Resource>>) -> Output {
        Output {
            resources: crate::generate::finish(resources),
            version: OnceLock::new(),
            gathered: Gathered::default(),
        }
    }

    /// The resources, ordered by name.
    pub fn resources(&self) -> &[Arc<Resource>] {
        &self.resources
    }

    /// The State-of-the-World version of the whole set: a hash over names and content
    /// versions, identical on every replica for the same content.
    pub fn version(&self) -> &str {
        self.version.get_or_init(|| {
            let mut buf = Vec::new();
            for r in &self.resources {
                buf.extend_from_slice(r.name.as_bytes());
                buf.push(0);
                buf.extend_from_slice(r.version.as_bytes());
                buf.push(0);
            }
            content_version(&buf)
        })
    }
}

/// What a proxy holds of one type: exactly a view output it was sent (shared, no per-stream
/// copy), or its own name → version map (a resuming delta proxy's initial versions, or a
/// held set the proxy changed by unsubscribing).
#[derive(Debug, Clone)]
pub enum Held {
    /// Exactly this output.
    Shared(Arc<Output>),
    /// These names at these versions.
    Own(BTreeMap<String, String>),
}

impl Default for Held {
    fn default() -> Self {
        Held::Own(BTreeMap::new())
    }
}

impl Held {
    /// How many resources are held.
    pub fn len(&self) -> usize {
        match self {
            Held::Shared(o) => o.resources.len(),
            Held::Own(m) => m.len(),
        }
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The proxy dropped `name` (unsubscribed): if it subscribes again, it must be sent
    /// again.
    pub fn forget(&mut self, name: &str) {
        if let Held::Shared(o) = self {
            if o.resources.iter().all(|r| r.name != name) {
                return;
            }
            *self = Held::Own(
                o.resources
                    .iter()
                    .map(|r| (r.name.clone(), r.version.clone()))
                    .collect(),
            );
        }
        if let Held::Own(m) = self {
            m.remove(name);
        }
    }
}

/// The difference between what a proxy holds and a new output.
#[derive(Debug, Default)]
pub struct Diff {
    /// Resources new or changed, by name.
    pub changed: Vec<Arc<Resource>>,
    /// Names held that the output no longer has.
    pub removed: Vec<String>,
    /// Resources held at their current version.
    pub unchanged: usize,
    /// The changed resources' response entries, gathered once for every stream sending
    /// this diff.
    pub gathered: Gathered,
}

impl Diff {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }

    /// What `cur` changes for a proxy holding `held`.
    pub fn between(held: &Held, cur: &Output) -> Diff {
        let mut diff = Diff::default();
        match held {
            Held::Shared(prev) if std::ptr::eq(prev.as_ref(), cur) => {
                diff.unchanged = cur.resources.len();
            }
            Held::Shared(prev) => {
                // Both ordered by name: one merge pass.
                let (mut a, mut b) = (prev.resources.iter().peekable(), cur.resources.iter());
                for r in b.by_ref() {
                    while let Some(p) = a.next_if(|p| p.name < r.name) {
                        diff.removed.push(p.name.clone());
                    }
                    match a.next_if(|p| p.name == r.name) {
                        Some(p) if Arc::ptr_eq(p, r) || p.version == r.version => {
                            diff.unchanged += 1
                        }
                        _ => diff.changed.push(r.clone()),
                    }
                }
                diff.removed.extend(a.map(|p| p.name.clone()));
            }
            Held::Own(map) => {
                for r in &cur.resources {
                    if map.get(&r.name) == Some(&r.version) {
                        diff.unchanged += 1;
                    } else {
                        diff.changed.push(r.clone());
                    }
                }
                let current: BTreeSet<&str> =
                    cur.resources.iter().map(|r| r.name.as_str()).collect();
                diff.removed = map
                    .keys()
                    .filter(|n| !current.contains(n.as_str()))
                    .cloned()
                    .collect();
            }
        }
        diff
    }
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

/// Every live view, by key. Views live as long as a stream holds them.
#[derive(Clone)]
pub struct Views {
    map: Arc<Mutex<HashMap<ViewKey, Weak<View>>>>,
    generation: Generation,
}

impl Views {
    /// Views generating through `generation`.
    pub fn new(generation: Generation) -> Views {
        Views {
            map: Arc::default(),
            generation,
        }
    }

    /// The view of a proxy (created for the first proxy of its key).
    pub fn view_for(&self, proxy: &Proxy) -> Arc<View> {
        let key = ViewKey::of(proxy);
        let mut map = lock(&self.map);
        if let Some(view) = map.get(&key).and_then(Weak::upgrade) {
            return view;
        }
        // Forget views whose streams are all gone, now and then (amortized O(1)).
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, v| v.strong_count() > 0);
        }
        let view = Arc::new(View {
            proxy: proxy.clone(),
            generation: self.generation.clone(),
            inner: Mutex::default(),
        });
        map.insert(key, Arc::downgrade(&view));
        view
    }

    /// How many views have streams.
    pub fn live(&self) -> usize {
        lock(&self.map)
            .values()
            .filter(|v| v.strong_count() > 0)
            .count()
    }

    /// The generation pool.
    pub fn generation(&self) -> &Generation {
        &self.generation
    }
}

/// The shared configuration of the proxies of one view key.
pub struct View {
    /// The first proxy of the view: generators read only its view-key fields.
    proxy: Proxy,
    generation: Generation,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    scope: Option<(Arc<PushContext>, Arc<ProxyScope>)>,
    names: Vec<(XdsType, Weak<BTreeSet<String>>)>,
    slots: HashMap<SlotKey, Slot>,
    /// The last diff computed per slot: (from, to, diff).
    diffs: HashMap<SlotKey, CachedDiff>,
}

/// A diff between two outputs, and the outputs it was computed between.
type CachedDiff = (Arc<Output>, Arc<Output>, Arc<Diff>);

/// A type and the identity of its requested names (0: wildcard).
type SlotKey = (XdsType, usize);

/// The slot of `ty` for `names` (ignored for wildcard types).
fn slot_key(ty: XdsType, names: &Names) -> SlotKey {
    if ty.is_wildcard_type() {
        (ty, 0)
    } else {
        (ty, Arc::as_ptr(names) as usize)
    }
}

/// One type's output for one set of names, and what it was computed from.
struct Slot {
    /// Keeps the names (and so the key's pointer) alive.
    names: Option<Names>,
    ctx: Arc<PushContext>,
    endpoints: Arc<crate::index::endpoints::EndpointIndex>,
    number: u64,
    cell: Arc<OnceCell<Arc<Output>>>,
}

impl Slot {
    /// Whether this output is still the one for `snap`: same PushContext, and for load
    /// assignments the same endpoints, for clusters the same workload identities behind
    /// the hosts (auto mTLS's SANs and sidecar checks).
    fn valid_for(&self, ty: XdsType, snap: &Snapshot) -> bool {
        Arc::ptr_eq(&self.ctx, &snap.ctx)
            && match ty {
                XdsType::Endpoint => Arc::ptr_eq(&self.endpoints, &snap.endpoints),
                XdsType::Cluster => {
                    self.endpoints.identities_epoch() == snap.endpoints.identities_epoch()
                }
                _ => true,
            }
    }
}

/// A previous output a new one may be derived from.
struct Prev {
    output: Arc<Output>,
    ctx: Arc<PushContext>,
    endpoints: Arc<crate::index::endpoints::EndpointIndex>,
}

impl View {
    /// The proxy scope for a PushContext, computed once per context.
    pub fn scope(&self, ctx: &Arc<PushContext>) -> Arc<ProxyScope> {
        let mut inner = lock(&self.inner);
        match &inner.scope {
            Some((c, s)) if Arc::ptr_eq(c, ctx) => s.clone(),
            _ => {
                let scope = Arc::new(ProxyScope::compute(&self.proxy, ctx));
                inner.scope = Some((ctx.clone(), scope.clone()));
                scope
            }
        }
    }

    /// The shared instance of a set of requested names of `ty`: streams of this view that
    /// request the same names share their outputs and diffs.
    pub fn intern(&self, ty: XdsType, names: BTreeSet<String>) -> Names {
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
        let key = slot_key(ty, names);
        let names = (!ty.is_wildcard_type()).then(|| names.clone());
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
                    let prev = slot.and_then(|s| {
                        Some(Prev {
                            output: s.cell.get()?.clone(),
                            ctx: s.ctx.clone(),
                            endpoints: s.endpoints.clone(),
                        })
                    });
                    let cell = Arc::new(OnceCell::new());
                    let fresh = Slot {
                        names: names.clone(),
                        ctx: snap.ctx.clone(),
                        endpoints: snap.endpoints.clone(),
                        number: snap.number,
                        cell: cell.clone(),
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
        cell.get_or_init(|| self.build(ty, names, scope, snap.clone(), prev))
            .await
            .clone()
    }

    /// What `cur` (an output of this view for `ty` and `names`) changes for a proxy holding
    /// `held`. Streams that held the same previous output share one diff.
    pub fn diff(&self, ty: XdsType, names: &Names, held: &Held, cur: &Arc<Output>) -> Arc<Diff> {
        let Held::Shared(prev) = held else {
            return Arc::new(Diff::between(held, cur));
        };
        let key = slot_key(ty, names);
        if let Some((from, to, d)) = lock(&self.inner).diffs.get(&key) {
            if Arc::ptr_eq(from, prev) && Arc::ptr_eq(to, cur) {
                return d.clone();
            }
        }
        let d = Arc::new(Diff::between(held, cur));
        lock(&self.inner)
            .diffs
            .insert(key, (prev.clone(), cur.clone(), d.clone()));
        d
    }

    async fn build(
        self: &Arc<Self>,
        ty: XdsType,
        names: Option<Names>,
        scope: Arc<ProxyScope>,
        snap: Arc<Snapshot>,
        prev: Option<Prev>,
    ) -> Arc<Output> {
        let view = self.clone();
        let cache = self.generation.cache.clone();
        self.generation
            .run(move || {
                let names: Vec<String> = names.iter().flat_map(|n| n.iter().cloned()).collect();
                let generate =
                    |names: &[String]| cache.generate(ty, &view.proxy, &scope, &snap, names);
                let reusable = prev
                    .as_ref()
                    .filter(|p| ty == XdsType::Endpoint && Arc::ptr_eq(&p.ctx, &snap.ctx));
                let Some(prev) = reusable else {
                    return Arc::new(Output::new(generate(&names)));
                };
                // Same PushContext: an assignment depends only on its service's endpoint
                // shards, which the index shares by `Arc` until they change. Rebuild the
                // assignments whose shards are not the same object, keep the rest.
                let stale = |name: &str| {
                    parse_outbound_cluster_name(name).is_none_or(|(_, _, host)| {
                        !same_shards(prev.endpoints.host(host), snap.endpoints.host(host))
                    })
                };
                let rebuild: Vec<String> = names.iter().filter(|n| stale(n)).cloned().collect();
                let mut resources = generate(&rebuild);
                resources.extend(
                    prev.output
                        .resources
                        .iter()
                        .filter(|r| !stale(&r.name))
                        .cloned(),
                );
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
    use crate::metrics::Metrics;
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

    #[tokio::test]
    async fn a_view_generates_once_and_an_endpoint_change_rebuilds_only_its_service() {
        let metrics = Metrics::new();
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
        let eds_names: BTreeSet<String> = cds
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
        let full = Output::new(v1.generation.cache.generate(
            XdsType::Endpoint,
            &p1,
            &v1.scope(&snap2.ctx),
            &snap2,
            &names.iter().cloned().collect::<Vec<_>>(),
        ));
        assert_eq!(full.version(), eds2.version());
    }

    /// Clusters depend on the workload identities behind their hosts (auto mTLS's SANs):
    /// an endpoint-only snapshot that changes them must not reuse the view's clusters.
    #[tokio::test]
    async fn clusters_follow_the_identities_behind_their_hosts() {
        let metrics = Metrics::new();
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
        let fresh = Output::new(view.generation.cache.generate(
            XdsType::Cluster,
            &proxy,
            &view.scope(&snap2.ctx),
            &snap2,
            &[],
        ));
        assert_eq!(fresh.version(), cds2.version());
    }

    fn res(name: &str, version: &str) -> Arc<Resource> {
        Arc::new(Resource::from_parts(
            name.into(),
            version.into(),
            Default::default(),
        ))
    }

    #[test]
    fn diff_of_shared_and_own_held_sets() {
        let prev = Arc::new(Output::new(vec![
            res("a", "1"),
            res("b", "1"),
            res("c", "1"),
        ]));
        let cur = Output::new(vec![res("b", "2"), res("c", "1"), res("d", "1")]);
        for held in [
            Held::Shared(prev.clone()),
            Held::Own(
                [("a", "1"), ("b", "1"), ("c", "1")]
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            ),
        ] {
            let d = Diff::between(&held, &cur);
            let changed: Vec<&str> = d.changed.iter().map(|r| r.name.as_str()).collect();
            assert_eq!(changed, ["b", "d"]);
            assert_eq!(d.removed, ["a"]);
            assert_eq!(d.unchanged, 1);
        }
        let same = Diff::between(&Held::Shared(prev.clone()), &prev);
        assert!(same.is_empty());
        assert_eq!(same.unchanged, 3);
    }

    #[test]
    fn forgetting_a_shared_name_copies_the_rest() {
        let out = Arc::new(Output::new(vec![res("a", "1"), res("b", "1")]));
        let mut held = Held::Shared(out.clone());
        held.forget("x");
        assert!(matches!(held, Held::Shared(_)), "nothing to forget");
        held.forget("a");
        let Held::Own(m) = &held else {
            panic!("a held set the proxy changed is its own")
        };
        assert_eq!(m.keys().collect::<Vec<_>>(), ["b"]);
        // Subscribing to `a` again sends it again.
        let d = Diff::between(&held, &out);
        assert_eq!(d.changed.len(), 1);
    }
}
