//! Test helpers shared by the unit tests of several modules.

use crate::desired::{DesiredState, StateKey, StateObject};
use async_trait::async_trait;
use bytes::Bytes;
use shoal_common::bus::{Bucket, BusError, Entry, StateBus, WatchStream};
use shoal_common::keys;
use shoal_common::model::{ObjectMeta, Service, ServicePort};
use shoal_common::MemoryBus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Writes and deletes seen by a [`CountingBus`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub writes: u64,
    pub deletes: u64,
}

/// A [`MemoryBus`] that counts writes and deletes and can be made to fail them.
#[derive(Clone, Default)]
pub(crate) struct CountingBus {
    pub inner: MemoryBus,
    writes: Arc<AtomicU64>,
    deletes: Arc<AtomicU64>,
    failing: Arc<AtomicBool>,
}

impl CountingBus {
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            writes: self.writes.load(Ordering::SeqCst),
            deletes: self.deletes.load(Ordering::SeqCst),
        }
    }

    pub(crate) fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    fn check(&self, op: &'static str, bucket: Bucket, key: &str) -> Result<(), BusError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(BusError::Op {
                op,
                bucket,
                key: key.to_string(),
                source: "injected failure".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl StateBus for CountingBus {
    async fn get(&self, bucket: Bucket, key: &str) -> Result<Option<Entry>, BusError> {
        self.inner.get(bucket, key).await
    }

    async fn put(&self, bucket: Bucket, key: &str, value: Bytes) -> Result<u64, BusError> {
        self.check("put", bucket, key)?;
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.put(bucket, key, value).await
    }

    async fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
        expected: u64,
    ) -> Result<u64, BusError> {
        self.check("update", bucket, key)?;
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.update(bucket, key, value, expected).await
    }

    async fn delete(&self, bucket: Bucket, key: &str) -> Result<(), BusError> {
        self.check("delete", bucket, key)?;
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(bucket, key).await
    }

    async fn keys(&self, bucket: Bucket) -> Result<Vec<String>, BusError> {
        self.inner.keys(bucket).await
    }

    async fn watch(&self, bucket: Bucket) -> Result<WatchStream, BusError> {
        self.inner.watch(bucket).await
    }
}

/// A service `name` of `cluster` in `default` with one port, and its key.
pub(crate) fn service(cluster: &str, name: &str, port: u16) -> (StateKey, StateObject) {
    let key = (
        Bucket::Services,
        keys::service_key(cluster, "default", name),
    );
    let svc = Service {
        meta: ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            ..Default::default()
        },
        cluster: cluster.into(),
        hostname: format!("{name}.default.svc.cluster.local"),
        cluster_ips: vec![],
        ports: vec![ServicePort {
            name: "http".into(),
            port,
            protocol: Default::default(),
            target_port: None,
        }],
        selector: Default::default(),
        export_to: vec![],
        external_addresses: vec![],
    };
    (key, StateObject::Service(svc))
}

/// A desired state of `c1` services (name, port).
pub(crate) fn desired(items: &[(&str, u16)]) -> DesiredState {
    items.iter().map(|(n, p)| service("c1", n, *p)).collect()
}
