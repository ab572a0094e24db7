//! The generator cache: encoded resources by generator key, in a size-bounded moka cache.
//!
//! Because a key holds everything its resource is built from, a hit can never be stale,
//! and proxies with the same view share one encoding. The cache is a [`Fingerprinted`]
//! one: moka's key is the key's 64-bit fingerprint, and each entry keeps its whole key,
//! compared on every hit. The shared virtual hosts of route tables ([`super::vhosts`])
//! use the same type. `SHOAL_CACHE_ASSERT=1` rebuilds every hit and aborts the process if
//! the bytes differ, proving in tests that no input is missing from a key.
//!
//! Why abort and not panic: a panic unwinds only the stream task that hit the entry (the
//! stream resets, the proxy reconnects, the test may still pass); an abort kills the
//! server, which every test notices. The comparison itself ([`compare`]) returns the
//! [`Mismatch`], so it is unit-tested without aborting.

use super::intern::Interner;
use super::{build, finish, side_keys, Key, Resource, Side, Snapshot};
use crate::generate::metrics::CacheMetrics;
use crate::hashing::fingerprint;
use crate::index::proxy::Proxy;
use crate::index::scope::ProxyScope;
use shoal_proto::{content_version, XdsType};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// Per-entry overhead counted on top of the resource bytes (key, bookkeeping).
const ENTRY_OVERHEAD: usize = 256;

/// How long an entry no generation asked for stays. The cache shares resources between
/// the views and parts generating one snapshot, which ask within seconds; what the
/// proxies hold lives on in the views' outputs. Superseded resources (every change makes
/// some) go after this, instead of filling the cache to its size bound. Each superseded
/// set can be large (a VirtualService change supersedes every namespace's route table of
/// its port: 10 MB with 1 000 services in 20 namespaces), so this stays short: with 60 s
/// and a change every 30 s, two superseded sets were always held.
const IDLE: Duration = Duration::from_secs(20);

/// A cache of generated resources.
#[derive(Clone)]
pub struct GeneratorCache {
    cache: Fingerprinted<Key, Arc<Resource>>,
    assert: bool,
    metrics: CacheMetrics,
}

impl GeneratorCache {
    /// A cache holding at most `max_bytes` of resources; `assert` rebuilds every hit and
    /// aborts the process on a difference (and turns the same check on for the shared
    /// virtual hosts of route tables, [`super::vhosts`]).
    pub fn new(max_bytes: u64, assert: bool, metrics: CacheMetrics) -> GeneratorCache {
        // Entries' keys hold Arcs into old snapshots too: idle entries go, so they don't
        // pin them.
        let cache = Fingerprinted::new(max_bytes, IDLE, |r: &Arc<Resource>| {
            r.any.value.len().saturating_add(ENTRY_OVERHEAD)
        });
        if assert {
            super::vhosts::check_hits();
        }
        GeneratorCache {
            cache,
            assert,
            metrics,
        }
    }

    /// Whether `SHOAL_CACHE_ASSERT` asks for checked hits.
    pub fn assert_from_env() -> bool {
        std::env::var("SHOAL_CACHE_ASSERT")
            .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    }

    /// Generates the resources of `ty` for a proxy, through the cache, ordered by name.
    pub fn generate(
        &self,
        ty: XdsType,
        proxy: &Proxy,
        scope: &ProxyScope,
        snap: &Snapshot,
        names: &[String],
    ) -> Vec<Arc<Resource>> {
        self.generate_side(Side::All, ty, proxy, scope, snap, names)
    }

    /// [`GeneratorCache::generate`] for one side of the resources (see [`Side`]).
    pub fn generate_side(
        &self,
        side: Side,
        ty: XdsType,
        proxy: &Proxy,
        scope: &ProxyScope,
        snap: &Snapshot,
        names: &[String],
    ) -> Vec<Arc<Resource>> {
        finish(
            side_keys(side, ty, proxy, scope, snap, names)
                .into_iter()
                .map(|k| self.get(k))
                .collect(),
        )
    }

    fn get(&self, key: Key) -> Arc<Resource> {
        let (resource, hit) =
            self.cache
                .get(&key, |k| *k == key, || (key.clone(), intern(build(&key))));
        if !hit {
            self.metrics.cache_misses.inc();
            return resource;
        }
        self.metrics.cache_hits.inc();
        if self.assert {
            if let Some(mismatch) = check_entry(&key, &resource) {
                mismatch.abort();
            }
        }
        resource
    }

    /// Whether hits are checked against a rebuild.
    pub fn asserting(&self) -> bool {
        self.assert
    }

    /// Entries and weighted size (bytes), for `/debug/cachez` and metrics.
    pub fn stats(&self) -> (u64, u64) {
        self.cache.stats()
    }
}

/// A size-bounded moka cache of values by key, stored under the key's 64-bit fingerprint.
/// Each entry keeps its whole key, compared on every hit: a fingerprint collision is a
/// miss, built and stored in the other's place. The key is not moka's because moka keeps
/// a removed entry's key in a tombstone until it rehashes a segment, and keys can be
/// large (a generator key holds a few KiB of service views and endpoint sets, which would
/// stay alive with it).
pub(crate) struct Fingerprinted<K, V> {
    cache: moka::sync::Cache<u64, Arc<Entry<K, V>>>,
}

/// An entry: the value and the whole key it was built from.
struct Entry<K, V> {
    key: K,
    value: V,
}

impl<K, V> Clone for Fingerprinted<K, V> {
    fn clone(&self) -> Self {
        Fingerprinted {
            cache: self.cache.clone(),
        }
    }
}

impl<K, V> Fingerprinted<K, V>
where
    K: Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A cache of at most `max_bytes`, a value weighing `weight(value)` bytes; entries no
    /// lookup asked for in `idle` go.
    pub(crate) fn new(max_bytes: u64, idle: Duration, weight: fn(&V) -> usize) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(max_bytes)
            .weigher(move |_fingerprint: &u64, e: &Arc<Entry<K, V>>| {
                u32::try_from(weight(&e.value)).unwrap_or(u32::MAX)
            })
            .time_to_idle(idle)
            .build();
        Fingerprinted { cache }
    }

    /// The value of the key that `lookup` hashes like and `is_key` recognizes, and whether
    /// it was a hit; on a miss `build` gives the key to keep and its value. `lookup` may
    /// be a borrowed form of the key: it must hash as the kept key does.
    pub(crate) fn get<Q: Hash + ?Sized>(
        &self,
        lookup: &Q,
        is_key: impl Fn(&K) -> bool,
        build: impl Fn() -> (K, V),
    ) -> (V, bool) {
        let fingerprint = fingerprint(lookup);
        // A hit reads the entry; `entry` (which builds a missing value once for all its
        // concurrent callers) costs twice a read, and most lookups hit.
        if let Some(entry) = self.cache.get(&fingerprint) {
            if is_key(&entry.key) {
                return (entry.value.clone(), true);
            }
        }
        let new_entry = || {
            let (key, value) = build();
            Arc::new(Entry { key, value })
        };
        let entry = self.cache.entry(fingerprint).or_insert_with(new_entry);
        if entry.is_fresh() {
            return (entry.into_value().value.clone(), false);
        }
        let entry = entry.into_value();
        if !is_key(&entry.key) {
            // Another key with the same fingerprint: build, and let the newer one stay.
            let fresh = new_entry();
            self.cache.insert(fingerprint, fresh.clone());
            return (fresh.value.clone(), false);
        }
        (entry.value.clone(), true)
    }

    /// Entries and weighted size (bytes).
    pub(crate) fn stats(&self) -> (u64, u64) {
        self.cache.run_pending_tasks();
        (self.cache.entry_count(), self.cache.weighted_size())
    }
}

/// Generated resources by content (see [`super::intern`]).
static RESOURCES: std::sync::LazyLock<Interner<Resource>> =
    std::sync::LazyLock::new(Interner::default);

/// The live resource equal to `r` (built for another key: e.g. the same route table for
/// the outbound parts of two namespaces), else `r`.
fn intern(r: Resource) -> Arc<Resource> {
    let h = fingerprint(&(&r.name, &r.version));
    RESOURCES.intern(h, r, |a, b| a == b)
}

/// The size and content hash of a list of resources, for the assert mode's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    /// How many resources.
    pub resources: usize,
    /// Their encoded bytes.
    pub bytes: usize,
    /// A hash over their names and contents.
    pub hash: String,
}

impl Digest {
    /// The digest of `resources`, in order.
    pub fn of<'a>(resources: impl IntoIterator<Item = &'a Resource>) -> Digest {
        let (mut count, mut bytes, mut buf) = (0, 0, Vec::new());
        for r in resources {
            count += 1;
            bytes += r.any.value.len();
            buf.extend_from_slice(r.name.as_bytes());
            buf.push(0);
            buf.extend_from_slice(r.any.type_url.as_bytes());
            buf.push(0);
            buf.extend_from_slice(&r.any.value);
            buf.push(0);
        }
        Digest {
            resources: count,
            bytes,
            hash: content_version(&buf),
        }
    }
}

/// What the assert mode found: served resources that differ from a fresh generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// What was checked (`generator cache entry`, `view output`).
    pub what: &'static str,
    /// Which one: the cache key, or the type and proxy.
    pub key: String,
    /// What would have been served.
    pub served: Digest,
    /// What a fresh generation gives.
    pub fresh: Digest,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stale {} for {}: served {} resources / {} bytes / {}, fresh {} resources / {} bytes / {}",
            self.what,
            self.key,
            self.served.resources,
            self.served.bytes,
            self.served.hash,
            self.fresh.resources,
            self.fresh.bytes,
            self.fresh.hash
        )
    }
}

impl Mismatch {
    /// Logs the mismatch and aborts the process (the cache assert mode's verdict: an input
    /// is missing from a cache or view key).
    pub fn abort(&self) -> ! {
        tracing::error!(
            what = self.what,
            key = %self.key,
            served_resources = self.served.resources,
            served_bytes = self.served.bytes,
            served_hash = %self.served.hash,
            fresh_resources = self.fresh.resources,
            fresh_bytes = self.fresh.bytes,
            fresh_hash = %self.fresh.hash,
            "cache assert: an input is missing from the key; aborting"
        );
        eprintln!("shoal cache assert failed: {self}");
        std::process::abort()
    }
}

/// Compares what would be served with a fresh generation; `Some` when they differ.
pub fn compare<'a, 'b>(
    what: &'static str,
    key: impl FnOnce() -> String,
    served: impl IntoIterator<Item = &'a Resource> + Clone,
    fresh: impl IntoIterator<Item = &'b Resource> + Clone,
) -> Option<Mismatch> {
    if served.clone().into_iter().eq(fresh.clone()) {
        return None;
    }
    Some(Mismatch {
        what,
        key: key(),
        served: Digest::of(served),
        fresh: Digest::of(fresh),
    })
}

/// Rebuilds `key` and compares it with the cached resource.
fn check_entry(key: &Key, cached: &Resource) -> Option<Mismatch> {
    let fresh = build(key);
    compare(
        "generator cache entry",
        || format!("{} (key {key:?})", cached.name),
        [cached],
        [&fresh],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

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
            .with_config(destination_rule(
                "a",
                "web",
                "host: web\nsubsets:\n- name: v1\n  labels: {version: v1}\n",
            ))
    }

    fn generate_all(cache: &GeneratorCache, proxy: &Proxy, snap: &Snapshot) -> Vec<Arc<Resource>> {
        let scope = ProxyScope::compute(proxy, &snap.ctx);
        let mut out = cache.generate(XdsType::Cluster, proxy, &scope, snap, &[]);
        let names: Vec<String> = out
            .iter()
            .map(|r| r.name.clone())
            .filter(|n| n.starts_with("outbound"))
            .collect();
        out.extend(cache.generate(XdsType::Endpoint, proxy, &scope, snap, &names));
        out
    }

    #[test]
    fn proxies_with_the_same_view_share_entries_and_output_matches_uncached() {
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics.clone());
        let snap = mesh().snapshot();
        let p1 = sidecar_proxy("a", &[("app", "one")]);
        let p2 = sidecar_proxy("a", &[("app", "two")]);
        let first = generate_all(&cache, &p1, &snap);
        let misses = metrics.cache_misses.get();
        assert!(misses > 0);
        let second = generate_all(&cache, &p2, &snap);
        assert_eq!(
            metrics.cache_misses.get(),
            misses,
            "the second proxy is served from cache"
        );
        assert_eq!(first, second);
        let scope = ProxyScope::compute(&p1, &snap.ctx);
        let cached: Vec<Resource> = cache
            .generate(XdsType::Cluster, &p1, &scope, &snap, &[])
            .iter()
            .map(|r| (**r).clone())
            .collect();
        assert_eq!(
            cached,
            super::super::generate(XdsType::Cluster, &p1, &scope, &snap, &[])
        );
    }

    #[test]
    fn a_change_misses_only_for_what_it_touches() {
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics.clone());
        let mut m = mesh();
        let proxy = sidecar_proxy("a", &[]);
        generate_all(&cache, &proxy, &m.snapshot());
        let before = metrics.cache_misses.get();
        // New endpoints for web: only web's load assignments are rebuilt.
        m.add_slice(slice(
            "a",
            "web",
            "web-1",
            &[("http", 8080)],
            vec![endpoint("10.0.0.2", &[])],
        ));
        generate_all(&cache, &proxy, &m.snapshot());
        let rebuilt = metrics.cache_misses.get() - before;
        assert_eq!(
            rebuilt, 2,
            "outbound|8080||web and outbound|8080|v1|web assignments"
        );
    }

    #[test]
    fn assert_mode_detects_a_stale_entry() {
        let snap = mesh().snapshot();
        let proxy = sidecar_proxy("a", &[]);
        let scope = ProxyScope::compute(&proxy, &snap.ctx);
        let keys = crate::generate::keys(XdsType::Cluster, &proxy, &scope, &snap, &[]);
        let key = keys.last().cloned().expect("a cluster key");
        let right = build(&key);
        assert_eq!(check_entry(&key, &right), None, "a fresh entry passes");
        // Simulate a key that failed to capture an input: a different resource under it.
        let wrong = build(&keys[0]);
        let m = check_entry(&key, &wrong).expect("a stale entry is detected");
        assert_eq!(m.what, "generator cache entry");
        assert!(m.key.contains(&wrong.name), "{m}");
        assert_eq!(m.served, Digest::of([&wrong]));
        assert_eq!(m.fresh, Digest::of([&right]));
        assert_ne!(m.served.hash, m.fresh.hash);
    }

    #[test]
    fn an_entry_of_another_key_with_the_same_fingerprint_is_a_miss() {
        let metrics = CacheMetrics::register(&prometheus::Registry::new());
        let cache = GeneratorCache::new(64 << 20, true, metrics.clone());
        let snap = mesh().snapshot();
        let proxy = sidecar_proxy("a", &[]);
        let scope = ProxyScope::compute(&proxy, &snap.ctx);
        let keys = crate::generate::keys(XdsType::Cluster, &proxy, &scope, &snap, &[]);
        let (a, b) = (keys[0].clone(), keys.last().cloned().expect("two keys"));
        assert_ne!(a, b);
        // b's entry where a's would be: as if their fingerprints collided.
        let value = Arc::new(build(&b));
        cache
            .cache
            .cache
            .insert(fingerprint(&a), Arc::new(Entry { key: b, value }));
        assert_eq!(*cache.get(a.clone()), build(&a), "a is built, not b served");
        assert_eq!(metrics.cache_misses.get(), 1);
        assert_eq!(*cache.get(a.clone()), build(&a));
        assert_eq!(metrics.cache_hits.get(), 1, "a's entry replaced b's");
    }

    #[test]
    fn digests_tell_outputs_apart() {
        let snap = mesh().snapshot();
        let proxy = sidecar_proxy("a", &[]);
        let scope = ProxyScope::compute(&proxy, &snap.ctx);
        let all = super::super::generate(XdsType::Cluster, &proxy, &scope, &snap, &[]);
        assert!(compare("view output", String::new, &all, &all).is_none());
        let fewer = &all[1..];
        let m = compare("view output", || "cds".into(), fewer, &all).expect("differs");
        assert_eq!(m.served.resources + 1, m.fresh.resources);
        assert!(m.served.bytes < m.fresh.bytes);
    }
}
