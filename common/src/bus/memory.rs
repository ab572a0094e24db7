//! In-memory [`StateBus`]: the same semantics as the NATS bus, inside one process.

use super::{check_size, Bucket, BusError, Entry, Op, StateBus, WatchEvent, WatchStream};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// An in-memory bus. Clones share state.
#[derive(Clone, Default)]
pub struct MemoryBus {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    buckets: HashMap<Bucket, BucketState>,
}

#[derive(Default)]
struct BucketState {
    /// Latest entry per key, tombstones included (as NATS keeps delete markers).
    entries: BTreeMap<String, Entry>,
    revision: u64,
    watchers: Vec<mpsc::UnboundedSender<Result<WatchEvent, BusError>>>,
}

impl BucketState {
    fn write(&mut self, key: &str, value: Bytes, op: Op) -> u64 {
        self.revision += 1;
        let entry = Entry {
            key: key.to_string(),
            value,
            revision: self.revision,
            op,
        };
        self.watchers
            .retain(|w| w.send(Ok(WatchEvent::Entry(entry.clone()))).is_ok());
        self.entries.insert(key.to_string(), entry);
        self.revision
    }

    fn live(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key).filter(|e| e.op == Op::Put)
    }
}

impl MemoryBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, bucket: Bucket, f: impl FnOnce(&mut BucketState) -> T) -> T {
        // A poisoned lock means a panic mid-write elsewhere; the map itself is still sound.
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(inner.buckets.entry(bucket).or_default())
    }
}

#[async_trait]
impl StateBus for MemoryBus {
    async fn get(&self, bucket: Bucket, key: &str) -> Result<Option<Entry>, BusError> {
        Ok(self.with(bucket, |b| b.live(key).cloned()))
    }

    async fn put(&self, bucket: Bucket, key: &str, value: Bytes) -> Result<u64, BusError> {
        check_size(bucket, key, &value)?;
        Ok(self.with(bucket, |b| b.write(key, value, Op::Put)))
    }

    async fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
        expected: u64,
    ) -> Result<u64, BusError> {
        check_size(bucket, key, &value)?;
        self.with(bucket, |b| {
            let current = b.live(key).map(|e| e.revision).unwrap_or(0);
            if current != expected {
                return Err(BusError::RevisionMismatch {
                    bucket,
                    key: key.to_string(),
                    expected,
                });
            }
            Ok(b.write(key, value, Op::Put))
        })
    }

    async fn delete(&self, bucket: Bucket, key: &str) -> Result<(), BusError> {
        self.with(bucket, |b| {
            if b.live(key).is_some() {
                b.write(key, Bytes::new(), Op::Delete);
            }
        });
        Ok(())
    }

    async fn keys(&self, bucket: Bucket) -> Result<Vec<String>, BusError> {
        Ok(self.with(bucket, |b| {
            b.entries
                .values()
                .filter(|e| e.op == Op::Put)
                .map(|e| e.key.clone())
                .collect()
        }))
    }

    async fn watch(&self, bucket: Bucket) -> Result<WatchStream, BusError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.with(bucket, |b| {
            // Snapshot and subscribe under one lock, so no change falls between them.
            let mut initial: Vec<&Entry> = b.entries.values().collect();
            initial.sort_by_key(|e| e.revision);
            for e in initial {
                let _ = tx.send(Ok(WatchEvent::Entry(e.clone())));
            }
            let _ = tx.send(Ok(WatchEvent::InitialDone));
            b.watchers.push(tx);
        });
        Ok(tokio_stream_from(rx))
    }
}

fn tokio_stream_from(mut rx: mpsc::UnboundedReceiver<Result<WatchEvent, BusError>>) -> WatchStream {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}
