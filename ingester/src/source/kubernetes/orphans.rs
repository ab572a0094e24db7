//! Clusters that leave this fleet: handed over to the fleet that takes them, or deleted.
//!
//! When a cluster stops being this fleet's (its Secret was relabelled to another fleet or
//! deleted, or lost the cluster's key), its task stops first: nothing of it is watched or
//! written any more. Then the leader **retires** it ([`retire`]): its owner record is
//! marked released and its keys stay on the bus. If another fleet claims it within
//! `--handover-timeout`, that fleet rewrites the keys as its own and this fleet is done:
//! nothing was deleted. If nobody does, or no other fleet is live at all (a single-fleet
//! install: at once), the leader takes the record back and deletes the cluster's keys,
//! status and owner record.
//!
//! Clusters that left while no leader ran are found once the Secrets are first listed and
//! at the start of every term ([`candidates`]): every cluster ID on the bus that this fleet
//! does not manage and whose owner record names this fleet (without a record, whose values
//! this fleet wrote). Values and records of other fleets are never touched.

use super::cluster_status::{ClusterStatus, MetaRecord, MetaWriter};
use super::context::ClusterContext;
use crate::coordination::ownership::Released;
use crate::desired::DesiredState;
use crate::publish::Ownership;
use serde::de::IgnoredAny;
use shoal_common::bus::Bucket;
use shoal_common::envelope::{now_ms, Envelope};
use shoal_common::keys;
use shoal_common::model::ClusterIssuer;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Attempts of each bus step of a retirement before it is left to the next term's sweep.
const ATTEMPTS: u32 = 5;

/// Pause between attempts.
const RETRY: Duration = Duration::from_secs(1);

/// The cluster ID of a services, endpoints, cluster status or owner key.
pub fn cluster_of(bucket: Bucket, key: &str) -> Option<String> {
    match bucket {
        Bucket::Services => keys::parse_service_key(key).ok().map(|id| id.cluster),
        Bucket::Endpoints => keys::parse_endpoints_key(key).ok().map(|id| id.cluster),
        Bucket::Meta => keys::parse_owner_key(key)
            .or_else(|| keys::unescape(key.strip_prefix("cluster.")?).ok()),
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

/// The clusters on the bus that this fleet published (by their owner record, else by
/// the fleet in their values) and does not manage: the clusters to retire.
pub async fn candidates(ctx: &ClusterContext, managed: &BTreeSet<String>) -> Vec<String> {
    let mut all = Vec::new();
    for bucket in [Bucket::Services, Bucket::Endpoints, Bucket::Meta] {
        match ctx.bus.keys(bucket).await {
            Ok(keys) => all.extend(keys.into_iter().map(|k| (bucket, k))),
            Err(error) => {
                warn!(%error, "cannot list keys; clusters that left the fleet are looked for next term");
                return Vec::new();
            }
        }
    }
    let mut out = Vec::new();
    for (cluster, (bucket, key)) in unmanaged(all.iter().map(|(b, k)| (*b, k.as_str())), managed) {
        let fleet = match ctx.owners.owner(&cluster) {
            Some(owner) => Some(owner.fleet),
            // No owner record: values written before records existed, or a lost record.
            None if keys::parse_owner_key(&key).is_none() => {
                match ctx.bus.get(bucket, &key).await {
                    Ok(Some(entry)) => Envelope::<IgnoredAny>::decode(&entry.value)
                        .ok()
                        .map(|e| e.fleet),
                    _ => None,
                }
            }
            None => None,
        };
        if fleet.as_deref() == Some(ctx.fleet.as_str()) {
            out.push(cluster);
        }
    }
    out
}

/// Retires a cluster this fleet no longer serves (see the module docs); its task has
/// stopped. Only the leader retires; a retirement cut short (the term ended, the bus
/// failed) is done again by the next term's sweep.
pub async fn retire(ctx: ClusterContext, cluster: String, handover_timeout: Duration) {
    let owners = &ctx.owners;
    // 1. Release: the keys stay for the fleet that takes the cluster over.
    let mut attempt = 0;
    loop {
        attempt += 1;
        if !ctx.leadership.leads() {
            return;
        }
        match owners.release(&cluster).await {
            Ok(Released::Released) => break,
            Ok(Released::NotMine(owner)) => {
                debug!(%cluster, %owner, "another fleet owns the cluster; nothing to retire");
                return;
            }
            Err(error) if attempt < ATTEMPTS => {
                warn!(%cluster, %error, "cannot release the cluster; retrying");
                tokio::time::sleep(RETRY).await;
            }
            Err(error) => {
                warn!(%cluster, %error, "cannot release the cluster; trying again next term");
                return;
            }
        }
    }
    // 2. Wait for another fleet to claim it, as long as another fleet is live.
    let deadline = Instant::now() + handover_timeout;
    let mut events = owners.events();
    loop {
        if let Some(owner) = owners.owner(&cluster).filter(|o| o.fleet != ctx.fleet) {
            info!(%cluster, fleet = %ctx.fleet, to = %owner.fleet, "handed the cluster over; nothing deleted");
            return;
        }
        let others = owners.other_live_fleets();
        if others.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            info!(%cluster, live = ?others, timeout = ?handover_timeout, "no fleet took the cluster over in time");
            break;
        }
        if !ctx.leadership.leads() {
            return;
        }
        tokio::select! {
            () = events.next() => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
    // 3. Nobody took it: take the record back, then delete the keys, status and record.
    match owners.reclaim(&cluster).await {
        Ok(true) => {}
        Ok(false) => {
            info!(%cluster, "another fleet took the cluster over; nothing deleted");
            return;
        }
        Err(error) => {
            warn!(%cluster, %error, "cannot take the cluster back to delete it; trying again next term");
            return;
        }
    }
    let mut publisher = ctx.publisher(Ownership::cluster(cluster.as_str()));
    for attempt in 1..=ATTEMPTS {
        let report = publisher.publish(&DesiredState::new(), now_ms()).await;
        ctx.publish_metrics.published(&report);
        if !publisher.needs_retry() {
            info!(%cluster, deleted = report.deletes, "cluster is in no multicluster secret of any fleet; its keys are deleted");
            break;
        }
        if attempt == ATTEMPTS || !ctx.leadership.leads() {
            warn!(%cluster, "could not delete every key of the cluster; trying again next term");
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
    delete_record::<ClusterStatus>(&ctx, &cluster).await;
    delete_record::<ClusterIssuer>(&ctx, &cluster).await;
    if let Err(error) = owners.forget(&cluster).await {
        warn!(%cluster, %error, "cannot delete the cluster's owner record; trying again next term");
    }
}

/// Deletes the cluster's `T` record in `shoal-meta` (if this replica leads).
async fn delete_record<T: MetaRecord>(ctx: &ClusterContext, cluster: &str) {
    MetaWriter::<T>::load(ctx.bus.clone(), &ctx.fleet, cluster, ctx.leadership.clone())
        .await
        .delete()
        .await;
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
            (Bucket::Meta, keys::owner_key("owned.only")),
            (Bucket::Meta, keys::owner_key("east")),
            (Bucket::Services, "not-a-key".to_string()),
        ];
        let found = unmanaged(keys.iter().map(|(b, k)| (*b, k.as_str())), &managed);
        assert_eq!(
            found.keys().collect::<Vec<_>>(),
            vec!["gone.x", "old", "owned.only", "west"]
        );
        assert_eq!(
            found["west"],
            (Bucket::Endpoints, "west.ns.svc.slice".into())
        );
        assert_eq!(found["gone.x"], (Bucket::Services, gone));
    }
}
