//! EDS shards: endpoints indexed `service hostname → (cluster, slice) → endpoint set`.
//!
//! Updated incrementally as slices change; snapshots share unchanged hosts through `Arc`,
//! so an endpoint change never touches the PushContext or other services' shards.

use shoal_common::keys;
use shoal_common::model::EndpointSet;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

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

/// All endpoint shards. Cloning is cheap (the maps hold `Arc`s).
#[derive(Debug, Default, Clone)]
pub struct EndpointIndex {
    hosts: BTreeMap<String, Arc<HostShards>>,
    identities: BTreeMap<String, Arc<HostIdentities>>,
    /// Counts changes of `identities`: two indexes of one lineage with the same count
    /// have the same identities (what clusters depend on).
    identities_epoch: u64,
}

impl EndpointIndex {
    /// Inserts or replaces a slice; returns whether anything changed.
    pub fn upsert(&mut self, host: &str, set: EndpointSet) -> bool {
        let id = (set.cluster.clone(), set.slice.clone());
        let shards = self.hosts.entry(host.to_string()).or_default();
        if shards.get(&id).is_some_and(|old| **old == set) {
            return false;
        }
        Arc::make_mut(shards).insert(id, Arc::new(set));
        self.refresh_identities(host);
        true
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
        let removed = Arc::make_mut(shards)
            .remove(&(cluster.to_string(), slice.to_string()))
            .is_some();
        if shards.is_empty() {
            self.hosts.remove(host);
        }
        if removed {
            self.refresh_identities(host);
        }
        removed
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
