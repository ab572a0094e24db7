//! Locality load balancing of a load assignment, relative to the calling proxy, as istiod's
//! `ApplyLocalityLoadBalancer` (`pilot/pkg/networking/core/loadbalancer/loadbalancer.go`):
//!
//! - `distribute`: the first entry whose `from` matches the proxy's locality sets each
//!   destination locality's weight (shared by the localities one wildcard matches, in
//!   proportion to their endpoints); localities it does not name get no endpoints.
//! - failover, only with outlier detection (else Envoy never leaves priority 0): endpoints
//!   are ordered by how many leading `failoverPriority` labels match the proxy's, then by
//!   locality — same region/zone/subzone 0, same region/zone 1, same region 2, another
//!   region 3, and a region other than the proxy region's `failover` target 4 — and the
//!   priorities are renumbered from 0 without gaps.
//!
//! [`for_proxy`] keeps only what changes the result, so proxies that get the same
//! assignment share one cache entry: with `distribute`, the shares for the proxy's
//! locality; with failover, the proxy's locality (and its `failover` target region) only
//! when region failover applies, and the proxy's value of each `failoverPriority` label.

use crate::index::proxy::{Proxy, LABEL_REGION, LABEL_SUBZONE, LABEL_ZONE};
use shoal_common::model::{Locality, LocalityLbSetting, TrafficPolicy};
use shoal_proto::pb::envoy::config::endpoint::v3::LocalityLbEndpoints;
use shoal_proto::pb::google::protobuf::UInt32Value;
use std::collections::{BTreeMap, BTreeSet};

/// The label istiod sets on proxies and endpoints to their cluster ID.
pub const LABEL_CLUSTER: &str = "topology.istio.io/cluster";
/// The label naming a workload's network; a `failoverPriority` led by it does not demote
/// endpoints of other networks below every label (istiod's `includesNetwork`).
const LABEL_NETWORK: &str = "topology.istio.io/network";

/// What the locality settings make of one load assignment for one proxy (part of the EDS
/// key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LocalityLb {
    /// `distribute`: the shares (destination locality → weight) of the first entry whose
    /// `from` matches the proxy's locality; `None` when none does (nothing changes).
    Distribute(Option<BTreeMap<String, u32>>),
    /// Failover by priorities.
    Failover {
        /// `failoverPriority`, with the value each label must have to match the proxy.
        labels: Option<PriorityLabels>,
        /// Priorities by locality (without `failoverPriority`, or with `failover` too).
        regions: Option<RegionFailover>,
    },
}

/// `failoverPriority` resolved for a proxy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PriorityLabels {
    /// Each label with the proxy's value (or the `key=value` override).
    pub labels: Vec<(String, String)>,
    /// The list starts with the network label: a mismatch there only ranks the endpoint
    /// after all of its own network's.
    pub network_first: bool,
}

/// Locality failover resolved for a proxy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegionFailover {
    /// The proxy's locality.
    pub proxy: Locality,
    /// The `failover` entry for the proxy's region: where its traffic goes next.
    pub to: Option<String>,
}

/// The locality setting that applies to a cluster (istiod's `GetEffectiveLbSetting`): the
/// rule's, unless `enabled: false`; without one, the mesh's, which is istiod's default
/// (`enabled: true`, nothing else).
fn effective(policy: Option<&TrafficPolicy>) -> Option<LocalityLbSetting> {
    match policy
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|l| l.locality_lb_setting.as_ref())
    {
        Some(s) if s.enabled == Some(false) => None,
        Some(s) => Some(s.clone()),
        None => Some(LocalityLbSetting::default()),
    }
}

/// What locality load balancing does to a cluster with this effective policy for this
/// proxy, on `network` (its metadata's, else its cluster's: `eds::proxy_network`); `None`
/// when it changes nothing.
pub fn for_proxy(
    policy: Option<&TrafficPolicy>,
    proxy: &Proxy,
    network: &str,
) -> Option<LocalityLb> {
    let setting = effective(policy)?;
    if !setting.distribute.is_empty() {
        let to = setting
            .distribute
            .iter()
            .find(|d| locality_match(&proxy.locality, &d.from))
            .map(|d| d.to.clone());
        return Some(LocalityLb::Distribute(to));
    }
    // Failover needs outlier detection: without it Envoy never sees a host fail.
    policy.and_then(|p| p.outlier_detection.as_ref())?;
    let labels = (!setting.failover_priority.is_empty()).then(|| PriorityLabels {
        labels: setting
            .failover_priority
            .iter()
            .map(|entry| match entry.split_once('=') {
                Some((label, value)) => (label.to_string(), value.to_string()),
                None => (
                    entry.clone(),
                    proxy_label(proxy, network, entry).to_string(),
                ),
            })
            .collect(),
        network_first: setting.failover_priority[0] == LABEL_NETWORK,
    });
    let regions = (labels.is_none() || !setting.failover.is_empty()).then(|| RegionFailover {
        proxy: proxy.locality.clone(),
        to: setting
            .failover
            .iter()
            .find(|f| f.from == proxy.locality.region)
            .map(|f| f.to.clone()),
    });
    Some(LocalityLb::Failover { labels, regions })
}

/// Whether a cluster gets `locality_weighted_lb_config` (istiod's `ApplyToCluster`): with
/// `distribute`, or with `failover`/`failoverPriority` and outlier detection.
pub fn weighted_localities(policy: Option<&TrafficPolicy>) -> bool {
    let Some(s) = effective(policy) else {
        return false;
    };
    let failover = policy.is_some_and(|p| p.outlier_detection.is_some());
    !s.distribute.is_empty()
        || (failover && (!s.failover.is_empty() || !s.failover_priority.is_empty()))
}

/// A label of the proxy as istiod sees it: its workload labels with its locality and
/// cluster and network added (`AugmentLabels`).
fn proxy_label<'a>(proxy: &'a Proxy, network: &'a str, key: &str) -> &'a str {
    topology_label(
        &proxy.labels,
        &proxy.locality,
        Some(&proxy.cluster_id),
        Some(network),
        key,
    )
}

/// A workload label with the topology labels istiod adds to proxies and endpoints
/// (region, zone and subzone when set, the cluster, the network) taking precedence; `""`
/// when absent.
pub fn topology_label<'a>(
    labels: &'a BTreeMap<String, String>,
    locality: &'a Locality,
    cluster: Option<&'a str>,
    network: Option<&'a str>,
    key: &str,
) -> &'a str {
    let topo = match key {
        LABEL_REGION => Some(locality.region.as_str()),
        LABEL_ZONE => Some(locality.zone.as_str()),
        LABEL_SUBZONE => Some(locality.subzone.as_str()),
        LABEL_CLUSTER => cluster,
        LABEL_NETWORK => network,
        _ => None,
    };
    match topo.filter(|v| !v.is_empty()) {
        Some(v) => v,
        None => labels.get(key).map(String::as_str).unwrap_or_default(),
    }
}

/// An endpoint's `failoverPriority` rank (istiod's `applyFailoverPriorityPerLocality`): 0
/// when every label matches the proxy's, else the number of labels from the first that
/// does not. `label` reads the endpoint's (topology-augmented) labels.
pub fn label_priority<'a>(p: &PriorityLabels, label: impl Fn(&str) -> &'a str) -> u32 {
    let lowest = p.labels.len() as u32;
    let mut adjust = 0;
    for (j, (key, want)) in p.labels.iter().enumerate() {
        if label(key) != want {
            if j == 0 && p.network_first {
                adjust = lowest;
                continue;
            }
            return lowest - j as u32 + adjust;
        }
    }
    adjust
}

/// Applies the settings to an assignment's locality groups. Each group's
/// `load_balancing_weight` is the sum of its endpoints' weights, and with `failoverPriority`
/// the groups are already split by label rank, carried in `priority`.
pub fn apply(lb: &LocalityLb, groups: &mut [LocalityLbEndpoints]) {
    match lb {
        LocalityLb::Distribute(Some(to)) => distribute(to, groups),
        LocalityLb::Distribute(None) => {}
        LocalityLb::Failover { labels, regions } => {
            if labels.is_some() {
                compact(groups);
            }
            if let Some(r) = regions {
                region_failover(r, groups);
            }
        }
    }
}

/// istiod's `applyLocalityWeights` for the proxy's matching `distribute` entry.
fn distribute(to: &BTreeMap<String, u32>, groups: &mut [LocalityLbEndpoints]) {
    let mut unmatched: BTreeSet<usize> = (0..groups.len()).collect();
    for (dest, share) in to {
        let matched: Vec<usize> = unmatched
            .iter()
            .copied()
            .filter(|i| locality_match(&group_locality(&groups[*i]), dest))
            .collect();
        let weight = |g: &LocalityLbEndpoints| g.load_balancing_weight.map_or(1, |w| w.value);
        let total: u64 = matched.iter().map(|i| u64::from(weight(&groups[*i]))).sum();
        for i in matched {
            unmatched.remove(&i);
            let w = u64::from(weight(&groups[i])) * u64::from(*share);
            if w > 0 {
                groups[i].load_balancing_weight = Some(UInt32Value {
                    value: w.div_ceil(total) as u32,
                });
            }
        }
    }
    for i in unmatched {
        groups[i].lb_endpoints.clear();
    }
}

/// istiod's `applyLocalityFailover`: the locality rank (0-4) under the priority already
/// set, then renumbered.
fn region_failover(r: &RegionFailover, groups: &mut [LocalityLbEndpoints]) {
    for g in groups.iter_mut() {
        let loc = group_locality(g);
        let mut rank = lb_priority(&r.proxy, &loc);
        if rank == 3 && r.to.as_ref().is_some_and(|to| *to != loc.region) {
            rank = 4;
        }
        g.priority = g.priority * 5 + rank;
    }
    compact(groups);
}

/// Renumbers priorities 0..N in order, without gaps (Envoy requires it).
fn compact(groups: &mut [LocalityLbEndpoints]) {
    let used: BTreeSet<u32> = groups.iter().map(|g| g.priority).collect();
    let rank: BTreeMap<u32, u32> = used.into_iter().zip(0..).collect();
    for g in groups.iter_mut() {
        g.priority = rank[&g.priority];
    }
}

/// istiod's `LbPriority`: 0 same subzone, 1 same zone, 2 same region, 3 elsewhere.
fn lb_priority(proxy: &Locality, ep: &Locality) -> u32 {
    match (
        proxy.region == ep.region,
        proxy.zone == ep.zone,
        proxy.subzone == ep.subzone,
    ) {
        (true, true, true) => 0,
        (true, true, false) => 1,
        (true, false, _) => 2,
        (false, _, _) => 3,
    }
}

/// istiod's `LocalityMatch`: a rule locality `region[/zone[/subzone]]`, where `*` or a
/// missing part matches anything (the region must be given or `*`).
pub fn locality_match(l: &Locality, rule: &str) -> bool {
    let mut parts = rule.split('/');
    let (region, zone, subzone) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    (region == "*" || l.region == region)
        && (zone.is_empty() || zone == "*" || l.zone == zone)
        && (subzone.is_empty() || subzone == "*" || l.subzone == subzone)
}

fn group_locality(g: &LocalityLbEndpoints) -> Locality {
    let l = g.locality.as_ref();
    Locality {
        region: l.map(|l| l.region.clone()).unwrap_or_default(),
        zone: l.map(|l| l.zone.clone()).unwrap_or_default(),
        subzone: l.map(|l| l.sub_zone.clone()).unwrap_or_default(),
    }
}
