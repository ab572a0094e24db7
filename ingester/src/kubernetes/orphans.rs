//! Keys of remote clusters that were removed while the ingester was not running.
//!
//! A removed secret key normally stops its cluster, which deletes its keys. If the key
//! disappears while no ingester runs, nobody would: so once the secrets are first listed,
//! every cluster ID on the bus that is neither the local cluster nor in a secret, and
//! whose values this fleet wrote, is swept (keys and status). Values of other fleets are
//! never touched. Only the leader sweeps: at the first listing of the secrets, and at the
//! start of every term.

use super::cluster::ClusterContext;
use crate::publish::Ownership;
use crate::state::DesiredState;
use crate::status::StatusWriter;
use serde::de::IgnoredAny;
use shoal_common::bus::Bucket;
use shoal_common::envelope::{now_ms, Envelope};
use shoal_common::keys;
use std::collections::{BTreeMap, BTreeSet};
use tracing::{info, warn};

/// The cluster ID of a services, endpoints or cluster status key.
pub fn cluster_of(bucket: Bucket, key: &str) -> Option<String> {
    match bucket {
        Bucket::Services => keys::parse_service_key(key).ok().map(|(c, _, _)| c),
        Bucket::Endpoints => keys::parse_endpoints_key(key).ok().map(|(c, _, _, _)| c),
        Bucket::Meta => keys::unescape(key.strip_prefix("cluster.")?).ok(),
        Bucket::Config => None,
    }
}

/// The cluster IDs on the bus that are not managed, with one key of each (to read which
/// fleet wrote it).
pub fn unmanaged<'a>(
    keys: impl IntoIterator<Item = (Bucket, &'a str)>,
    managed: &BTreeSet<String>,
) -> BTreeMap<String, (Bucket, String)> {
    let mut out = BTreeMap::new();
    for (bucket, key) in keys {
        if let Some(cluster) = cluster_of(bucket, key).filter(|c| !managed.contains(c)) {
            out.entry(cluster)
                .or_insert_with(|| (bucket, key.to_string()));
        }
    }
    out
}

/// Deletes the keys and status of clusters this fleet published that are not `managed`.
/// Only the leader sweeps; a standby sweeps when it starts leading.
pub async fn sweep(ctx: &ClusterContext, managed: &BTreeSet<String>) {
    if !ctx.leadership.leads() {
        return;
    }
    let mut all = Vec::new();
    for bucket in [Bucket::Services, Bucket::Endpoints, Bucket::Meta] {
        match ctx.bus.keys(bucket).await {
            Ok(keys) => all.extend(keys.into_iter().map(|k| (bucket, k))),
            Err(error) => {
                warn!(%error, "cannot list keys; removed clusters are swept next start");
                return;
            }
        }
    }
    let candidates = unmanaged(all.iter().map(|(b, k)| (*b, k.as_str())), managed);
    for (cluster, (bucket, key)) in candidates {
        let fleet = match ctx.bus.get(bucket, &key).await {
            Ok(Some(entry)) => Envelope::<IgnoredAny>::decode(&entry.value)
                .ok()
                .map(|e| e.fleet),
            _ => None,
        };
        if fleet.as_deref() != Some(ctx.fleet.as_str()) {
            continue;
        }
        info!(%cluster, "cluster is in no multicluster secret any more; deleting its keys");
        let mut publisher = ctx.publisher(Ownership::cluster(cluster.as_str()));
        let report = publisher.publish(&DesiredState::new(), now_ms()).await;
        ctx.metrics.published(&report);
        StatusWriter::load(
            ctx.bus.clone(),
            &ctx.fleet,
            &cluster,
            ctx.leadership.clone(),
        )
        .await
        .delete()
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_unmanaged_cluster_ids() {
        let managed: BTreeSet<String> = ["local".to_string(), "east".to_string()].into();
        let gone = keys::service_key("gone.x", "ns", "svc");
        let keys = [
            (Bucket::Services, "local.ns.svc".to_string()),
            (Bucket::Services, "east.ns.svc".to_string()),
            (Bucket::Endpoints, "west.ns.svc.slice".to_string()),
            (Bucket::Services, gone.clone()),
            (Bucket::Meta, "cluster.west".to_string()),
            (Bucket::Meta, keys::cluster_status_key("old")),
            (Bucket::Meta, "lease.default".to_string()),
            (Bucket::Services, "not-a-key".to_string()),
        ];
        let found = unmanaged(keys.iter().map(|(b, k)| (*b, k.as_str())), &managed);
        assert_eq!(
            found.keys().collect::<Vec<_>>(),
            vec!["gone.x", "old", "west"]
        );
        assert_eq!(
            found["west"],
            (Bucket::Endpoints, "west.ns.svc.slice".into())
        );
        assert_eq!(found["gone.x"], (Bucket::Services, gone));
    }
}
