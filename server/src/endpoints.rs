//! EDS shards: endpoints indexed `service hostname → (cluster, slice) → endpoint set`.
//!
//! Updated incrementally as slices change; snapshots share unchanged hosts through `Arc`,
//! so an endpoint change never touches the PushContext or other services' shards.

use shoal_common::keys;
use shoal_common::model::EndpointSet;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The endpoint sets of one service hostname, by (cluster, slice).
pub type HostShards = BTreeMap<(String, String), Arc<EndpointSet>>;

/// All endpoint shards. Cloning is cheap (the map holds `Arc`s).
#[derive(Debug, Default, Clone)]
pub struct EndpointIndex {
    hosts: BTreeMap<String, Arc<HostShards>>,
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
        true
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
