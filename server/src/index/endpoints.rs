//! EDS shards: endpoints indexed `service hostname → (cluster, slice) → endpoint set`.
//!
//! Updated incrementally as slices change; snapshots share unchanged hosts through `Arc`,
//! so an endpoint change never touches the PushContext or other services' shards.

use shoal_common::keys;
use shoal_common::model::EndpointSet;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

/// How many recent host changes an index lineage remembers (see
/// [`EndpointIndex::changed_since`]): more than a debounced batch of endpoint changes
/// usually holds; a view further behind rebuilds its assignments from scratch.
const CHANGE_LOG: usize = 4096;

/// The endpoint sets of one service hostname, by (cluster, slice).
pub type HostShards = BTreeMap<(String, String), Arc<EndpointSet>>;

/// Who runs behind a hostname, as outbound clusters need it for mutual TLS: the identities
/// the server may present, and whether every endpoint has a sidecar (auto mTLS to a
/// headless service is all or nothing, as in istiod). A change here changes clusters, not
/// only endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct HostIdentities {
    /// (namespace, service account) of the endpoints that have one.
    pub accounts: BTreeSet<(String, String)>,
    /// There are endpoints, and every one carries `security.istio.io/tlsMode: istio`.
    pub all_sidecars: bool,
}

impl HostIdentities {
    fn of(shards: &HostShards) -> HostIdentities {
        let mut out = HostIdentities {
            all_sidecars: true,
            ..Default::default()
        };
        let mut any = false;
        for set in shards.values() {
            for ep in &set.endpoints {
                any = true;
                out.all_sidecars &= crate::index::tls_mode::pod_has_sidecar(&ep.labels);
                if !ep.service_account.is_empty() {
                    out.accounts
                        .insert((set.namespace.clone(), ep.service_account.clone()));
                }
            }
        }
        out.all_sidecars &= any;
        out
    }
}

/// The workloads of one namespace of one cluster, as gateway credential authorization
/// reads them (`generate::sds`): each distinct (pod labels, service account) among the
/// endpoints, with how many endpoints carry it (so that removing one knows whether it was
/// the last). Endpoints without a service account are left out.
pub type NamespaceWorkloads = BTreeMap<(BTreeMap<String, String>, String), usize>;

/// All endpoint shards. Cloning is cheap (the maps hold `Arc`s).
#[derive(Debug, Default, Clone)]
pub struct EndpointIndex {
    hosts: BTreeMap<String, Arc<HostShards>>,
    identities: BTreeMap<String, Arc<HostIdentities>>,
    /// Counts changes of `identities`: two indexes of one lineage with the same count
    /// have the same identities (what clusters depend on).
    identities_epoch: u64,
    /// By (cluster, namespace).
    workloads: BTreeMap<(String, String), Arc<NamespaceWorkloads>>,
    /// Counts changes of the set of (labels, service account) of any namespace: two
    /// indexes of one lineage with the same count have the same workloads (what gateway
    /// credentials depend on).
    workloads_epoch: u64,
    /// Slices by cluster, then by the cluster network they carry (the ingester sets it
    /// from the cluster's system namespace label on every slice): a proxy without
    /// `NETWORK` metadata takes its cluster's network from here.
    networks: BTreeMap<String, BTreeMap<String, usize>>,
    /// Counts changes of any cluster's network (see [`EndpointIndex::cluster_networks`]).
    networks_epoch: u64,
    /// Counts changes of `hosts` in this index's lineage.
    revision: u64,
    /// The hosts recent revisions changed, shared by the copies of one lineage (the
    /// snapshots), so a view can rebuild only what changed since the copy it last used.
    log: Arc<Mutex<ChangeLog>>,
}

/// The hosts changed by the last [`CHANGE_LOG`] revisions of a lineage.
#[derive(Debug, Default)]
struct ChangeLog {
    /// The revision of the newest entry: only the copy at this revision may append.
    head: u64,
    /// (revision, host), consecutive revisions in order.
    entries: VecDeque<(u64, String)>,
}

impl EndpointIndex {
    /// Inserts or replaces a slice; returns whether anything changed.
    pub fn upsert(&mut self, host: &str, set: EndpointSet) -> bool {
        let id = (set.cluster.clone(), set.slice.clone());
        let shards = self.hosts.entry(host.to_string()).or_default();
        if shards.get(&id).is_some_and(|old| **old == set) {
            return false;
        }
        let set = Arc::new(set);
        let old = Arc::make_mut(shards).insert(id, set.clone());
        self.refresh_identities(host);
        self.count_workloads(old.as_deref(), Some(&set));
        self.count_networks(old.as_deref(), Some(&set));
        self.record(host);
        true
    }

    /// Logs a change of `host`'s shards.
    fn record(&mut self, host: &str) {
        if lock(&self.log).head != self.revision {
            // Another copy of this index changed first (snapshots never do): this copy
            // starts a lineage of its own, with no history.
            self.log = Arc::new(Mutex::new(ChangeLog {
                head: self.revision,
                entries: VecDeque::new(),
            }));
        }
        self.revision += 1;
        let mut log = lock(&self.log);
        log.head = self.revision;
        log.entries.push_back((self.revision, host.to_string()));
        if log.entries.len() > CHANGE_LOG {
            log.entries.pop_front();
        }
    }

    /// The hosts whose shards changed between `older` (an earlier copy of this index) and
    /// this index, in time proportional to their number; `None` when that is not known
    /// (another lineage, or too far back).
    pub fn changed_since(&self, older: &EndpointIndex) -> Option<BTreeSet<String>> {
        if !Arc::ptr_eq(&self.log, &older.log) || older.revision > self.revision {
            return None;
        }
        if older.revision == self.revision {
            return Some(BTreeSet::new());
        }
        let log = lock(&self.log);
        let first = log.entries.front()?.0;
        if first > older.revision + 1 {
            return None;
        }
        let from = usize::try_from(older.revision + 1 - first).ok()?;
        let to = usize::try_from(self.revision + 1 - first).ok()?;
        Some(
            log.entries
                .range(from..to.min(log.entries.len()))
                .map(|(_, host)| host.clone())
                .collect(),
        )
    }

    /// Moves the workload counts from `old` to `new` (slices of one service: the same
    /// cluster and namespace), bumping the epoch if a (labels, service account) appeared
    /// or disappeared.
    fn count_workloads(&mut self, old: Option<&EndpointSet>, new: Option<&EndpointSet>) {
        let Some(any) = new.or(old) else { return };
        let mut delta: BTreeMap<(&BTreeMap<String, String>, &str), isize> = BTreeMap::new();
        for (set, sign) in [(old, -1), (new, 1)] {
            for ep in set.iter().flat_map(|s| &s.endpoints) {
                if !ep.service_account.is_empty() {
                    *delta
                        .entry((&ep.labels, ep.service_account.as_str()))
                        .or_default() += sign;
                }
            }
        }
        delta.retain(|_, d| *d != 0);
        if delta.is_empty() {
            return;
        }
        let id = (any.cluster.clone(), any.namespace.clone());
        let workloads = Arc::make_mut(self.workloads.entry(id.clone()).or_default());
        let mut changed = false;
        for ((labels, account), d) in delta {
            let key = (labels.clone(), account.to_string());
            let count = workloads.get(&key).copied().unwrap_or(0) as isize + d;
            if count > 0 {
                changed |= workloads.insert(key, count as usize).is_none();
            } else {
                changed |= workloads.remove(&key).is_some();
            }
        }
        if workloads.is_empty() {
            self.workloads.remove(&id);
        }
        if changed {
            self.workloads_epoch += 1;
        }
    }

    /// Moves one slice's count from `old`'s cluster network to `new`'s, bumping the epoch
    /// if that changed the cluster's network.
    fn count_networks(&mut self, old: Option<&EndpointSet>, new: Option<&EndpointSet>) {
        let Some(cluster) = new.or(old).map(|s| s.cluster.clone()) else {
            return;
        };
        let before = self.cluster_network(&cluster).to_string();
        let counts = self.networks.entry(cluster.clone()).or_default();
        if let Some(old) = old {
            if let Some(n) = counts.get_mut(&old.network) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&old.network);
                }
            }
        }
        if let Some(new) = new {
            *counts.entry(new.network.clone()).or_default() += 1;
        }
        if counts.is_empty() {
            self.networks.remove(&cluster);
        }
        if self.cluster_network(&cluster) != before {
            self.networks_epoch += 1;
        }
    }

    /// A cluster's network, as its slices carry it: the one most slices carry (while the
    /// ingester republishes them after a label change, they disagree for a moment; the
    /// majority, then the name, decides, so the answer depends on the slices alone).
    /// Empty when unlabelled or without slices.
    pub fn cluster_network(&self, cluster: &str) -> &str {
        self.networks
            .get(cluster)
            .and_then(|counts| {
                counts
                    .iter()
                    .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            })
            .map(|(network, _)| network.as_str())
            .unwrap_or_default()
    }

    /// Every cluster's labelled network (see [`EndpointIndex::cluster_network`]).
    pub fn cluster_networks(&self) -> BTreeMap<String, String> {
        self.networks
            .keys()
            .map(|c| (c.clone(), self.cluster_network(c).to_string()))
            .filter(|(_, n)| !n.is_empty())
            .collect()
    }

    /// Changes with any cluster's network: two indexes of one lineage with the same count
    /// have the same [`EndpointIndex::cluster_networks`].
    pub fn networks_epoch(&self) -> u64 {
        self.networks_epoch
    }

    /// The workloads of a namespace of a cluster (none without endpoints).
    pub fn workloads(&self, cluster: &str, namespace: &str) -> Option<&Arc<NamespaceWorkloads>> {
        self.workloads
            .get(&(cluster.to_string(), namespace.to_string()))
    }

    /// Changes with the workloads of any namespace (see the field).
    pub fn workloads_epoch(&self) -> u64 {
        self.workloads_epoch
    }

    fn refresh_identities(&mut self, host: &str) {
        match self.hosts.get(host) {
            Some(shards) => {
                let ids = HostIdentities::of(shards);
                if self.identities.get(host).is_none_or(|old| **old != ids) {
                    self.identities.insert(host.to_string(), Arc::new(ids));
                    self.identities_epoch += 1;
                }
            }
            None => {
                if self.identities.remove(host).is_some() {
                    self.identities_epoch += 1;
                }
            }
        }
    }

    /// Changes with the workload identities behind any host (see the field).
    pub fn identities_epoch(&self) -> u64 {
        self.identities_epoch
    }

    /// The workload identities behind a hostname (none without endpoints).
    pub fn identities(&self, host: &str) -> Option<&Arc<HostIdentities>> {
        self.identities.get(host)
    }

    /// Removes a slice; returns whether it existed.
    pub fn remove(&mut self, host: &str, cluster: &str, slice: &str) -> bool {
        let Some(shards) = self.hosts.get_mut(host) else {
            return false;
        };
        let removed = Arc::make_mut(shards).remove(&(cluster.to_string(), slice.to_string()));
        if shards.is_empty() {
            self.hosts.remove(host);
        }
        if let Some(old) = &removed {
            self.refresh_identities(host);
            self.count_workloads(Some(old), None);
            self.count_networks(Some(old), None);
            self.record(host);
        }
        removed.is_some()
    }

    /// The shards of one hostname.
    pub fn host(&self, host: &str) -> Option<&Arc<HostShards>> {
        self.hosts.get(host)
    }

    /// All hostnames with endpoints and their shards.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<HostShards>)> {
        self.hosts.iter()
    }

    /// Bus keys of every slice held.
    pub fn bus_keys(&self) -> Vec<String> {
        self.hosts
            .values()
            .flat_map(|s| s.values())
            .map(|s| keys::endpoints_key(&s.cluster, &s.namespace, &s.service, &s.slice))
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{endpoint, slice};

    fn pod(ip: &str, sa: &str, labels: &[(&str, &str)]) -> shoal_common::model::Endpoint {
        let mut ep = endpoint(ip, labels);
        ep.service_account = sa.into();
        ep
    }

    #[test]
    fn workloads_are_counted_per_namespace_and_cluster() {
        let mut index = EndpointIndex::default();
        let gw = [("istio", "ingressgateway")];
        let two = slice(
            "istio-system",
            "gw",
            "gw-1",
            &[],
            vec![
                pod("10.0.0.1", "ingress", &gw),
                pod("10.0.0.2", "ingress", &gw),
            ],
        );
        assert!(index.upsert("gw.istio-system.svc.cluster.local", two));
        let epoch = index.workloads_epoch();
        let workloads = index.workloads("Kubernetes", "istio-system").unwrap();
        assert_eq!(workloads.len(), 1, "one distinct (labels, account)");
        assert_eq!(workloads.values().next(), Some(&2));
        assert!(index.workloads("east", "istio-system").is_none());

        // One of two pods goes: the workload is still there, nothing changed for SDS.
        let one = slice(
            "istio-system",
            "gw",
            "gw-1",
            &[],
            vec![pod("10.0.0.1", "ingress", &gw)],
        );
        assert!(index.upsert("gw.istio-system.svc.cluster.local", one.clone()));
        assert_eq!(index.workloads_epoch(), epoch);
        // The same pod behind a second service counts twice; removing one keeps it.
        let mut other = one.clone();
        other.service = "gw-admin".into();
        index.upsert("gw-admin.istio-system.svc.cluster.local", other);
        assert!(index.remove("gw.istio-system.svc.cluster.local", "Kubernetes", "gw-1"));
        assert_eq!(index.workloads_epoch(), epoch);
        // Relabelled: a new (labels, account), the old one gone.
        let mut relabelled = one.clone();
        relabelled.service = "gw-admin".into();
        relabelled.endpoints = vec![pod("10.0.0.1", "ingress", &[("app", "x")])];
        index.upsert("gw-admin.istio-system.svc.cluster.local", relabelled);
        assert!(index.workloads_epoch() > epoch);
        let workloads = index.workloads("Kubernetes", "istio-system").unwrap();
        assert_eq!(
            workloads
                .keys()
                .next()
                .unwrap()
                .0
                .get("app")
                .map(String::as_str),
            Some("x")
        );
        assert_eq!(workloads.len(), 1);
        // Gone entirely.
        let epoch = index.workloads_epoch();
        index.remove(
            "gw-admin.istio-system.svc.cluster.local",
            "Kubernetes",
            "gw-1",
        );
        assert!(index.workloads("Kubernetes", "istio-system").is_none());
        assert!(index.workloads_epoch() > epoch);
        // Endpoints without a service account carry no identity: not counted.
        let epoch = index.workloads_epoch();
        index.upsert(
            "x.ns.svc.cluster.local",
            slice("ns", "x", "x-1", &[], vec![endpoint("10.0.0.9", &gw)]),
        );
        assert_eq!(index.workloads_epoch(), epoch);
        assert!(index.workloads("Kubernetes", "ns").is_none());
    }
}
