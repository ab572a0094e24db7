//! Per-cluster records in `shoal-meta`: the sync status (key `cluster.<id>`, a
//! [`ClusterStatus`]) and the service-account token issuer (key `issuer.<id>`, a
//! [`ClusterIssuer`]), each an [`Envelope`] rmp-serde encoded with named fields like every
//! bus value.
//!
//! Written only when the record says something new (for the status: `synced` or
//! `last_error`), compared with what is on the bus, so a restart with an unchanged cluster
//! writes nothing here either. Only the leader writes, stamping its lease epoch; at the
//! start of each term the record is read again.

use crate::coordination::lease::Leadership;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shoal_common::bus::{Bucket, StateBus};
use shoal_common::envelope::{now_ms, Envelope};
use shoal_common::keys;
use shoal_common::model::ClusterIssuer;
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

/// A record about one cluster in `shoal-meta`, written by the leader when it changes.
pub trait MetaRecord: Serialize + DeserializeOwned + Clone + Send + Sync {
    /// What the record is, for logs.
    const WHAT: &'static str;
    /// Its key.
    fn key(cluster: &str) -> String;
    /// Whether `self` says the same as `other` (a timestamp alone is no change).
    fn same(&self, other: &Self) -> bool;
}

impl MetaRecord for ClusterStatus {
    const WHAT: &'static str = "cluster status";
    fn key(cluster: &str) -> String {
        keys::cluster_status_key(cluster)
    }
    fn same(&self, other: &Self) -> bool {
        (self.synced, &self.last_error) == (other.synced, &other.last_error)
    }
}

impl MetaRecord for ClusterIssuer {
    const WHAT: &'static str = "token issuer";
    fn key(cluster: &str) -> String {
        keys::issuer_key(cluster)
    }
    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

/// Writes one cluster's record of type `T` when it changes.
pub struct MetaWriter<T> {
    bus: Arc<dyn StateBus>,
    fleet: String,
    cluster: String,
    key: String,
    leadership: Leadership,
    /// What is on the bus; `None` when nothing (readable) is.
    current: Option<T>,
    /// The epoch (term) `current` was read or written in.
    term: Option<u64>,
}

/// Writes one cluster's sync status when it changes.
pub type StatusWriter = MetaWriter<ClusterStatus>;

impl<T: MetaRecord> MetaWriter<T> {
    /// Reads the record on the bus, so an unchanged one is not rewritten.
    pub async fn load(
        bus: Arc<dyn StateBus>,
        fleet: &str,
        cluster: &str,
        leadership: Leadership,
    ) -> MetaWriter<T> {
        let mut writer = MetaWriter {
            bus,
            fleet: fleet.to_string(),
            cluster: cluster.to_string(),
            key: T::key(cluster),
            term: leadership.current(),
            leadership,
            current: None,
        };
        writer.current = writer.read().await;
        writer
    }

    async fn read(&self) -> Option<T> {
        match self.bus.get(Bucket::Meta, &self.key).await {
            // Another fleet's record (the cluster's previous owner) counts as absent: the
            // first `put` rewrites it as this fleet's.
            Ok(Some(entry)) => Envelope::<T>::decode(&entry.value)
                .ok()
                .filter(|e| e.fleet == self.fleet)
                .map(|e| e.body),
            Ok(None) => None,
            Err(error) => {
                debug!(%error, cluster = %self.cluster, what = T::WHAT, "cannot read; it will be rewritten");
                None
            }
        }
    }

    /// The epoch to write with, if leading; a new term reads the record again first (the
    /// previous leader may have written it since).
    async fn epoch(&mut self) -> Option<u64> {
        let epoch = self.leadership.current()?;
        if self.term != Some(epoch) {
            self.current = self.read().await;
            self.term = Some(epoch);
        }
        Some(epoch)
    }

    /// Publishes `record` if it says something else than what is on the bus.
    pub async fn put(&mut self, record: T) {
        let Some(epoch) = self.epoch().await else {
            return;
        };
        if self.current.as_ref().is_some_and(|c| c.same(&record)) {
            return;
        }
        let now = now_ms();
        let value = match Envelope::new(self.fleet.as_str(), epoch, now, &record).encode() {
            Ok(value) => value,
            Err(error) => {
                warn!(%error, cluster = %self.cluster, what = T::WHAT, "cannot encode");
                return;
            }
        };
        match self.bus.put(Bucket::Meta, &self.key, value.into()).await {
            Ok(_) => self.current = Some(record),
            Err(error) => warn!(%error, cluster = %self.cluster, what = T::WHAT, "cannot publish"),
        }
    }

    /// Removes the record (the cluster is no longer managed).
    pub async fn delete(&mut self) {
        if self.epoch().await.is_none() {
            return;
        }
        match self.bus.delete(Bucket::Meta, &self.key).await {
            Ok(()) => self.current = None,
            Err(error) => warn!(%error, cluster = %self.cluster, what = T::WHAT, "cannot delete"),
        }
    }
}

impl MetaWriter<ClusterStatus> {
    /// Publishes the status if it differs from what is on the bus.
    pub async fn set(&mut self, synced: bool, last_error: Option<String>) {
        let status = ClusterStatus {
            cluster: self.cluster.clone(),
            synced,
            last_error,
            since_ms: now_ms(),
        };
        self.put(status).await
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
