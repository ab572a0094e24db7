//! The state bus: compacted key/value state with ordered change streams, shared by the
//! ingester (writer) and the servers (watchers).
//!
//! Two implementations behave the same and pass one conformance suite:
//! [`nats::NatsBus`] (JetStream KV, nats-server 2.9+) and [`memory::MemoryBus`]
//! (in-process, for standalone mode and unit tests).

pub mod memory;
pub mod nats;
pub mod nats_args;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

/// The buckets shoal keeps its state in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    /// Istio config, cluster-independent: `<kind>.<namespace>.<name>`.
    Config,
    /// Kubernetes Services: `<cluster>.<namespace>.<name>`.
    Services,
    /// EndpointSlices joined with pods and nodes: `<cluster>.<namespace>.<service>.<slice>`.
    Endpoints,
    /// Cluster status, leases and markers.
    Meta,
}

impl Bucket {
    /// All buckets.
    pub const ALL: [Bucket; 4] = [
        Bucket::Config,
        Bucket::Services,
        Bucket::Endpoints,
        Bucket::Meta,
    ];

    /// The JetStream KV bucket name.
    pub fn name(self) -> &'static str {
        match self {
            Bucket::Config => "shoal-config",
            Bucket::Services => "shoal-services",
            Bucket::Endpoints => "shoal-endpoints",
            Bucket::Meta => "shoal-meta",
        }
    }
}

impl std::fmt::Display for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a change did to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The key now holds `value`.
    Put,
    /// The key was deleted (`value` is empty).
    Delete,
}

/// One revision of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value (empty for deletes).
    pub value: Bytes,
    /// The bucket-wide revision of this change; increases with every write to the bucket.
    pub revision: u64,
    /// Put or delete.
    pub op: Op,
}

/// An event on a bucket watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key's latest value (initial state) or a change (after [`WatchEvent::InitialDone`]).
    Entry(Entry),
    /// Every key's value at watch start has been delivered; what follows are live changes.
    InitialDone,
}

/// A stream of watch events; an `Err` item means the watch broke and must be re-created.
pub type WatchStream = BoxStream<'static, Result<WatchEvent, BusError>>;

/// Errors of the state bus, each with the bucket and key it concerns.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The NATS server could not be reached.
    #[error("connecting to NATS at {url}: {source}")]
    Connect {
        /// The URL tried.
        url: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A bucket could not be created or opened.
    #[error("opening bucket {bucket}: {source}")]
    Bucket {
        /// The bucket.
        bucket: Bucket,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A compare-and-set write found another revision: someone else wrote the key.
    #[error("{bucket}/{key}: revision is not {expected} (written concurrently)")]
    RevisionMismatch {
        /// The bucket.
        bucket: Bucket,
        /// The key.
        key: String,
        /// The expected revision (0 = key must not exist).
        expected: u64,
    },
    /// A value exceeds the bus's size limit.
    #[error("{bucket}/{key}: value of {size} bytes exceeds the {limit}-byte limit")]
    TooLarge {
        /// The bucket.
        bucket: Bucket,
        /// The key.
        key: String,
        /// The value's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Any other failed operation.
    #[error("{op} {bucket}/{key}: {source}")]
    Op {
        /// What was attempted.
        op: &'static str,
        /// The bucket.
        bucket: Bucket,
        /// The key (empty for bucket-wide operations).
        key: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The largest value the bus accepts (NATS's default max payload is 1 MiB; leave room for
/// headers).
pub const MAX_VALUE_BYTES: usize = 1024 * 1024 - 4096;

/// Compacted key/value state with ordered watches. Implementations are cheap to clone via
/// `Arc` and safe to share between tasks.
#[async_trait]
pub trait StateBus: Send + Sync + 'static {
    /// The current value of a key, or `None` when absent or deleted.
    async fn get(&self, bucket: Bucket, key: &str) -> Result<Option<Entry>, BusError>;

    /// Writes a value unconditionally; returns the new revision.
    async fn put(&self, bucket: Bucket, key: &str, value: Bytes) -> Result<u64, BusError>;

    /// Writes a value only if the key's current revision is `expected` (0: the key must be
    /// absent or deleted); returns the new revision or [`BusError::RevisionMismatch`].
    async fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
        expected: u64,
    ) -> Result<u64, BusError>;

    /// Deletes a key (a no-op if absent).
    async fn delete(&self, bucket: Bucket, key: &str) -> Result<(), BusError>;

    /// All keys that currently hold a value, sorted.
    async fn keys(&self, bucket: Bucket) -> Result<Vec<String>, BusError>;

    /// Watches a bucket: first the latest entry of every key (deleted keys may appear as
    /// deletes), then [`WatchEvent::InitialDone`], then every change in revision order.
    async fn watch(&self, bucket: Bucket) -> Result<WatchStream, BusError>;

    /// Whether the bus is reachable now, as a channel that changes when it connects or
    /// disconnects. The default (an in-process bus) is always connected.
    fn connected(&self) -> tokio::sync::watch::Receiver<bool> {
        tokio::sync::watch::channel(true).1
    }
}

fn check_size(bucket: Bucket, key: &str, value: &Bytes) -> Result<(), BusError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(BusError::TooLarge {
            bucket,
            key: key.to_string(),
            size: value.len(),
            limit: MAX_VALUE_BYTES,
        });
    }
    Ok(())
}

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
