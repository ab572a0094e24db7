//! Cluster sync status in `shoal-meta` (key `cluster.<id>`): an [`Envelope`] whose body
//! is a [`ClusterStatus`], rmp-serde encoded with named fields like every bus value.
//!
//! Written only when `synced` or `last_error` changes, compared with what is on the bus,
//! so a restart with an unchanged cluster writes nothing here either. Only the leader
//! writes, stamping its lease epoch; at the start of each term the status is read again.

use crate::lease::Leadership;
use serde::{Deserialize, Serialize};
use shoal_common::bus::{Bucket, StateBus};
use shoal_common::envelope::{now_ms, Envelope};
use shoal_common::keys;
use std::sync::Arc;
use tracing::{debug, warn};

/// The sync status of one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The cluster ID.
    pub cluster: String,
    /// Whether the cluster's initial sync completed (its objects are on the bus).
    pub synced: bool,
    /// The last watch or connection error, until the watch works again.
    pub last_error: Option<String>,
    /// Since when (ms since the Unix epoch) `synced` and `last_error` hold these values.
    pub since_ms: u64,
}

/// Writes one cluster's status when it changes.
pub struct StatusWriter {
    bus: Arc<dyn StateBus>,
    fleet: String,
    cluster: String,
    key: String,
    leadership: Leadership,
    /// What is on the bus: (synced, last_error); `None` when nothing (readable) is.
    current: Option<(bool, Option<String>)>,
    /// The epoch (term) `current` was read or written in.
    term: Option<u64>,
}

impl StatusWriter {
    /// Reads the status on the bus, so an unchanged status is not rewritten.
    pub async fn load(
        bus: Arc<dyn StateBus>,
        fleet: &str,
        cluster: &str,
        leadership: Leadership,
    ) -> StatusWriter {
        let mut writer = StatusWriter {
            bus,
            fleet: fleet.to_string(),
            cluster: cluster.to_string(),
            key: keys::cluster_status_key(cluster),
            term: leadership.current(),
            leadership,
            current: None,
        };
        writer.current = writer.read().await;
        writer
    }

    async fn read(&self) -> Option<(bool, Option<String>)> {
        match self.bus.get(Bucket::Meta, &self.key).await {
            // Another fleet's status (the cluster's previous owner) counts as absent: the
            // first `set` rewrites it as this fleet's.
            Ok(Some(entry)) => Envelope::<ClusterStatus>::decode(&entry.value)
                .ok()
                .filter(|e| e.fleet == self.fleet)
                .map(|e| (e.body.synced, e.body.last_error)),
            Ok(None) => None,
            Err(error) => {
                debug!(%error, cluster = %self.cluster, "cannot read cluster status; it will be rewritten");
                None
            }
        }
    }

    /// The epoch to write with, if leading; a new term reads the status again first (the
    /// previous leader may have written it since).
    async fn epoch(&mut self) -> Option<u64> {
        let epoch = self.leadership.current()?;
        if self.term != Some(epoch) {
            self.current = self.read().await;
            self.term = Some(epoch);
        }
        Some(epoch)
    }

    /// Publishes the status if it differs from what is on the bus.
    pub async fn set(&mut self, synced: bool, last_error: Option<String>) {
        let state = (synced, last_error);
        let Some(epoch) = self.epoch().await else {
            return;
        };
        if self.current.as_ref() == Some(&state) {
            return;
        }
        let status = ClusterStatus {
            cluster: self.cluster.clone(),
            synced: state.0,
            last_error: state.1.clone(),
            since_ms: now_ms(),
        };
        let value =
            match Envelope::new(self.fleet.as_str(), epoch, status.since_ms, &status).encode() {
                Ok(value) => value,
                Err(error) => {
                    warn!(%error, cluster = %self.cluster, "cannot encode cluster status");
                    return;
                }
            };
        match self.bus.put(Bucket::Meta, &self.key, value.into()).await {
            Ok(_) => self.current = Some(state),
            Err(error) => warn!(%error, cluster = %self.cluster, "cannot publish cluster status"),
        }
    }

    /// Removes the status (the cluster is no longer managed).
    pub async fn delete(&mut self) {
        if self.epoch().await.is_none() {
            return;
        }
        match self.bus.delete(Bucket::Meta, &self.key).await {
            Ok(()) => self.current = None,
            Err(error) => warn!(%error, cluster = %self.cluster, "cannot delete cluster status"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::CountingBus;

    #[tokio::test]
    async fn writes_only_changes_and_survives_restart() {
        let bus = CountingBus::default();
        let load = || StatusWriter::load(Arc::new(bus.clone()), "f", "c1", Leadership::always());
        let mut w = load().await;
        w.set(true, None).await;
        w.set(true, None).await;
        assert_eq!(bus.counts().writes, 1);
        let entry = bus
            .inner
            .get(Bucket::Meta, "cluster.c1")
            .await
            .unwrap()
            .unwrap();
        let status = Envelope::<ClusterStatus>::decode(&entry.value)
            .unwrap()
            .body;
        assert!(status.synced && status.last_error.is_none());
        assert_eq!(status.cluster, "c1");

        let mut restarted = load().await;
        restarted.set(true, None).await;
        assert_eq!(bus.counts().writes, 1, "unchanged after restart");
        restarted.set(true, Some("boom".into())).await;
        assert_eq!(bus.counts().writes, 2);
        restarted.delete().await;
        assert!(bus
            .inner
            .get(Bucket::Meta, "cluster.c1")
            .await
            .unwrap()
            .is_none());
    }
}
