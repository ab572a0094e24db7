//! Publishing the desired state to the bus: write only what changed, delete only what this
//! ingester owns and no longer wants (mark and sweep).
//!
//! Change detection compares a sha256 of the envelope *body* (the rmp-serde encoding of
//! the model object), never of the whole envelope, whose timestamp differs on every write.
//! At startup the publisher learns the hashes of what is already on the bus by decoding
//! each owned value with its bucket's model type and re-encoding the body the same way
//! the desired state is encoded. The encoding is deterministic (ordered maps only), so an
//! unchanged input after a restart hashes the same and writes nothing; a value that does
//! not decode (another schema, garbage) gets no hash and is simply overwritten.

use crate::error::IngestError;
use crate::state::{DesiredState, StateKey, StateObject};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use shoal_common::bus::{Bucket, BusError, StateBus, WatchEvent, MAX_VALUE_BYTES};
use shoal_common::envelope::Envelope;
use shoal_common::keys;
use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::{debug, info, warn};

/// What one publish round did (or, from [`Publisher::totals`], all rounds together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Keys written (new or changed values).
    pub writes: u64,
    /// Keys whose value was already on the bus, so not written.
    pub unchanged: u64,
    /// Owned keys deleted because they are no longer desired.
    pub deletes: u64,
    /// Keys that could not be written or deleted (logged; bus failures are retried).
    pub errors: u64,
}

impl PublishReport {
    /// Whether the round changed anything on the bus.
    pub fn changed(&self) -> bool {
        self.writes > 0 || self.deletes > 0
    }

    fn add(&mut self, other: &PublishReport) {
        self.writes += other.writes;
        self.unchanged += other.unchanged;
        self.deletes += other.deletes;
        self.errors += other.errors;
    }
}

/// What the publisher knows about one owned key on the bus.
#[derive(Debug, Clone, Copy)]
struct OnBus {
    /// sha256 of the body, `None` when the value on the bus did not decode.
    hash: Option<[u8; 32]>,
    /// The key's revision, for compare-and-set writes.
    revision: u64,
}

/// The keys a publisher writes and deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    /// Every `shoal-config` key (the config source of the fleet).
    pub config: bool,
    /// The `shoal-services` and `shoal-endpoints` keys of this cluster.
    pub cluster: Option<String>,
}

impl Ownership {
    /// Config and one cluster's services and endpoints (the file source).
    pub fn config_and_cluster(cluster: impl Into<String>) -> Ownership {
        Ownership {
            config: true,
            cluster: Some(cluster.into()),
        }
    }

    /// One cluster's services and endpoints.
    pub fn cluster(cluster: impl Into<String>) -> Ownership {
        Ownership {
            config: false,
            cluster: Some(cluster.into()),
        }
    }

    /// Every config key and nothing else.
    pub fn config() -> Ownership {
        Ownership {
            config: true,
            cluster: None,
        }
    }

    /// Whether a key is owned.
    pub fn owns(&self, bucket: Bucket, key: &str) -> bool {
        let own_cluster = |c: &str| self.cluster.as_deref() == Some(c);
        match bucket {
            Bucket::Config => self.config,
            Bucket::Services => {
                keys::parse_service_key(key).is_ok_and(|(cluster, _, _)| own_cluster(&cluster))
            }
            Bucket::Endpoints => {
                keys::parse_endpoints_key(key).is_ok_and(|(cluster, _, _, _)| own_cluster(&cluster))
            }
            Bucket::Meta => false,
        }
    }

    /// A short description for logs.
    fn describe(&self) -> String {
        match (&self.cluster, self.config) {
            (Some(c), true) => format!("config and cluster {c}"),
            (Some(c), false) => format!("cluster {c}"),
            (None, true) => "config".to_string(),
            (None, false) => "nothing".to_string(),
        }
    }
}

/// Whether this ingester may write: the seam for leader election between replicas of a
/// fleet. A publisher that does not lead writes nothing and retries once it leads.
#[derive(Debug, Clone)]
pub struct Leadership(tokio::sync::watch::Receiver<bool>);

impl Leadership {
    /// Always leading (a single ingester per fleet; no election yet).
    pub fn always() -> Leadership {
        Leadership(tokio::sync::watch::channel(true).1)
    }

    /// Leadership as decided by an election that updates `rx`.
    pub fn from_watch(rx: tokio::sync::watch::Receiver<bool>) -> Leadership {
        Leadership(rx)
    }

    /// Whether this ingester leads now.
    pub fn leads(&self) -> bool {
        *self.0.borrow()
    }
}

/// Writes a desired state to the bus: the keys of its [`Ownership`].
pub struct Publisher {
    bus: Arc<dyn StateBus>,
    fleet: String,
    epoch: u64,
    ownership: Ownership,
    leadership: Leadership,
    /// For logs.
    owner: String,
    on_bus: BTreeMap<StateKey, OnBus>,
    retry: bool,
    totals: PublishReport,
}

/// The buckets the publisher writes.
const BUCKETS: [Bucket; 3] = [Bucket::Config, Bucket::Services, Bucket::Endpoints];

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The body hash of a value on the bus, `None` when it does not decode.
fn body_hash(bucket: Bucket, key: &str, value: &[u8]) -> Option<[u8; 32]> {
    let body = StateObject::decode(bucket, value)
        .map_err(|e| e.to_string())
        .and_then(|o| o.ok_or_else(|| "bucket holds no model objects".to_string()))
        .and_then(|o| o.encode_body().map_err(|e| e.to_string()));
    match body {
        Ok(body) => Some(sha256(&body)),
        Err(error) => {
            debug!(%bucket, key, %error, "value on the bus does not decode; it will be replaced");
            None
        }
    }
}

impl Publisher {
    /// Reads the keys this publisher owns, and their values, from the bus: every config
    /// key and the services and endpoints of `cluster` (the file source's ownership).
    pub async fn load(
        bus: Arc<dyn StateBus>,
        fleet: impl Into<String>,
        epoch: u64,
        cluster: impl Into<String>,
    ) -> Result<Publisher, IngestError> {
        let ownership = Ownership::config_and_cluster(cluster);
        Publisher::load_owning(bus, fleet, epoch, ownership).await
    }

    /// Reads the keys of `ownership`, and their values, from the bus.
    pub async fn load_owning(
        bus: Arc<dyn StateBus>,
        fleet: impl Into<String>,
        epoch: u64,
        ownership: Ownership,
    ) -> Result<Publisher, IngestError> {
        let mut publisher = Publisher {
            bus,
            fleet: fleet.into(),
            epoch,
            owner: ownership.describe(),
            ownership,
            leadership: Leadership::always(),
            on_bus: BTreeMap::new(),
            retry: false,
            totals: PublishReport::default(),
        };
        for bucket in BUCKETS {
            if bucket == Bucket::Config && !publisher.ownership.config {
                continue;
            }
            if bucket != Bucket::Config && publisher.ownership.cluster.is_none() {
                continue;
            }
            publisher.load_bucket(bucket).await?;
        }
        debug!(
            keys = publisher.on_bus.len(),
            owner = %publisher.owner,
            "read owned state from the bus",
        );
        Ok(publisher)
    }

    /// Makes writes depend on leadership (the default is [`Leadership::always`]).
    pub fn set_leadership(&mut self, leadership: Leadership) {
        self.leadership = leadership;
    }

    /// One watch per bucket reads every value in one pass (a get per key would be a round
    /// trip per key); it is dropped once the initial values are in.
    async fn load_bucket(&mut self, bucket: Bucket) -> Result<(), IngestError> {
        let action = "reading owned state from the bus";
        let mut watch = self
            .bus
            .watch(bucket)
            .await
            .map_err(|source| IngestError::Bus { action, source })?;
        loop {
            match watch.next().await {
                Some(Ok(WatchEvent::Entry(entry))) => {
                    let key = (bucket, entry.key);
                    if entry.op == shoal_common::Op::Delete || !self.owns(bucket, &key.1) {
                        self.on_bus.remove(&key);
                        continue;
                    }
                    let hash = body_hash(bucket, &key.1, &entry.value);
                    let revision = entry.revision;
                    self.on_bus.insert(key, OnBus { hash, revision });
                }
                Some(Ok(WatchEvent::InitialDone)) => return Ok(()),
                Some(Err(source)) => return Err(IngestError::Bus { action, source }),
                None => {
                    let source = BusError::Op {
                        op: "watch",
                        bucket,
                        key: String::new(),
                        source: "the watch ended before delivering the initial values".into(),
                    };
                    return Err(IngestError::Bus { action, source });
                }
            }
        }
    }

    /// Whether a key is this publisher's to write and delete.
    pub fn owns(&self, bucket: Bucket, key: &str) -> bool {
        self.ownership.owns(bucket, key)
    }

    /// The owned keys currently on the bus (as far as this publisher knows).
    pub fn owned_keys(&self) -> impl Iterator<Item = &StateKey> {
        self.on_bus.keys()
    }

    /// Whether the last round left bus failures to retry even if the input does not change.
    pub fn needs_retry(&self) -> bool {
        self.retry
    }

    /// The counters of every round so far.
    pub fn totals(&self) -> PublishReport {
        self.totals
    }

    /// Makes the bus match `desired`: writes changed values, stamped `observed_at_ms`, and
    /// deletes owned keys that are not desired. Per-key failures are logged and counted,
    /// never fatal; keys that failed on the bus are retried next round.
    pub async fn publish(&mut self, desired: &DesiredState, observed_at_ms: u64) -> PublishReport {
        self.publish_scoped(desired, observed_at_ms, &|_| true)
            .await
    }

    /// Like [`Publisher::publish`] for part of the state: `desired` holds every desired key
    /// in scope, and only owned keys in scope are swept. A caller that recomputes only
    /// what changed (some namespaces) passes that scope; keys outside it are left alone.
    /// After a round with bus failures, the caller should publish everything again.
    pub async fn publish_scoped(
        &mut self,
        desired: &DesiredState,
        observed_at_ms: u64,
        in_scope: &(dyn Fn(&StateKey) -> bool + Sync),
    ) -> PublishReport {
        let mut report = PublishReport::default();
        if !self.leadership.leads() {
            debug!(owner = %self.owner, "not leading; publishing nothing");
            self.retry = true;
            return report;
        }
        let mut bus_failed = false;
        for (key, object) in desired {
            match self.write(key, object, observed_at_ms).await {
                Ok(true) => report.writes += 1,
                Ok(false) => report.unchanged += 1,
                Err(error) => {
                    warn!(%error, "publishing failed for this key; its previous value stays");
                    report.errors += 1;
                    bus_failed |= matches!(error, IngestError::Bus { .. });
                }
            }
        }
        // Reverse key order deletes endpoints before their service and config last.
        let unwanted: Vec<StateKey> = self
            .on_bus
            .keys()
            .rev()
            .filter(|k| !desired.contains_key(*k) && in_scope(k))
            .cloned()
            .collect();
        for key in unwanted {
            let (bucket, name) = &key;
            match self.bus.delete(*bucket, name).await {
                Ok(()) => {
                    self.on_bus.remove(&key);
                    report.deletes += 1;
                }
                Err(source) => {
                    let error = IngestError::Bus {
                        action: "deleting an unwanted key",
                        source,
                    };
                    warn!(%error, "delete failed; retrying next round");
                    report.errors += 1;
                    bus_failed = true;
                }
            }
        }
        self.retry = bus_failed;
        self.totals.add(&report);
        if report.changed() || report.errors > 0 {
            info!(
                writes = report.writes,
                deletes = report.deletes,
                unchanged = report.unchanged,
                errors = report.errors,
                owner = %self.owner,
                "published state"
            );
        }
        report
    }

    /// Writes one key if its body changed; `Ok(false)` when it did not.
    async fn write(
        &mut self,
        key: &StateKey,
        object: &StateObject,
        observed_at_ms: u64,
    ) -> Result<bool, IngestError> {
        let (bucket, name) = key;
        let encode_err = |source| IngestError::Encode {
            bucket: *bucket,
            key: name.clone(),
            source,
        };
        let body = object.encode_body().map_err(|e| encode_err(e.into()))?;
        let hash = sha256(&body);
        let current = self.on_bus.get(key).copied();
        if current.and_then(|c| c.hash) == Some(hash) {
            return Ok(false);
        }
        let value = Envelope::new(self.fleet.as_str(), self.epoch, observed_at_ms, object)
            .encode()
            .map_err(encode_err)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(IngestError::TooLarge {
                bucket: *bucket,
                key: name.clone(),
                size: value.len(),
                limit: MAX_VALUE_BYTES,
            });
        }
        // Compare-and-set against the revision last seen, so a write never silently
        // replaces a value someone else wrote (the groundwork for fencing by lease).
        let expected = current.map_or(0, |c| c.revision);
        match self.bus.update(*bucket, name, value.into(), expected).await {
            Ok(revision) => {
                let hash = Some(hash);
                self.on_bus.insert(key.clone(), OnBus { hash, revision });
                Ok(true)
            }
            Err(source) => {
                if matches!(source, BusError::RevisionMismatch { .. }) {
                    self.refresh(key).await;
                }
                Err(IngestError::Bus {
                    action: "writing a changed value",
                    source,
                })
            }
        }
    }

    /// Re-reads one key after someone else wrote it, so the next round compares against
    /// (and conditions its write on) what is really there.
    async fn refresh(&mut self, key: &StateKey) {
        let (bucket, name) = key;
        match self.bus.get(*bucket, name).await {
            Ok(Some(entry)) => {
                let hash = body_hash(*bucket, name, &entry.value);
                let revision = entry.revision;
                self.on_bus.insert(key.clone(), OnBus { hash, revision });
            }
            Ok(None) => {
                self.on_bus.remove(key);
            }
            Err(source) => {
                let error = IngestError::Bus {
                    action: "re-reading a key written concurrently",
                    source,
                };
                warn!(%error, "could not re-read key");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{CountingBus, Counts};
    use shoal_common::model::{ObjectMeta, Service, ServicePort};
    use shoal_common::Op;

    fn service(cluster: &str, name: &str, port: u16) -> (StateKey, StateObject) {
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
            }],
            selector: Default::default(),
            export_to: vec![],
        };
        (key, StateObject::Service(svc))
    }

    fn desired(items: &[(&str, u16)]) -> DesiredState {
        items.iter().map(|(n, p)| service("c1", n, *p)).collect()
    }

    async fn publisher(bus: &CountingBus) -> Publisher {
        Publisher::load(Arc::new(bus.clone()), "fleet", 0, "c1")
            .await
            .expect("load")
    }

    #[tokio::test]
    async fn writes_only_changed_values() {
        let bus = CountingBus::default();
        let mut p = publisher(&bus).await;
        let r = p.publish(&desired(&[("a", 80), ("b", 80)]), 1).await;
        assert_eq!((r.writes, r.unchanged), (2, 0));
        let r = p.publish(&desired(&[("a", 80), ("b", 81)]), 2).await;
        assert_eq!((r.writes, r.unchanged, r.deletes), (1, 1, 0));
        let r = p.publish(&desired(&[("a", 80), ("b", 81)]), 3).await;
        assert!(!r.changed());
        assert_eq!(
            bus.counts(),
            Counts {
                writes: 3,
                deletes: 0
            }
        );
        assert_eq!(p.totals().writes, 3);

        let entry = bus
            .inner
            .get(Bucket::Services, "c1.default.b")
            .await
            .unwrap()
            .unwrap();
        let env: Envelope<Service> = Envelope::decode(&entry.value).unwrap();
        assert_eq!(
            (env.fleet.as_str(), env.epoch, env.observed_at_ms),
            ("fleet", 0, 2)
        );
        assert_eq!(env.body.ports[0].port, 81);
    }

    #[tokio::test]
    async fn restart_with_unchanged_input_writes_nothing() {
        let bus = CountingBus::default();
        let state = desired(&[("a", 80), ("b", 80)]);
        publisher(&bus).await.publish(&state, 1).await;
        let before = bus.counts();
        let mut restarted = publisher(&bus).await;
        let r = restarted.publish(&state, 99).await;
        assert_eq!((r.writes, r.deletes, r.unchanged), (0, 0, 2));
        assert_eq!(bus.counts(), before);
    }

    #[tokio::test]
    async fn sweep_deletes_only_vanished_owned_keys() {
        let bus = CountingBus::default();
        let (other_key, other) = service("c2", "a", 80);
        let put = |key: &str, object: &StateObject| {
            let value = Envelope::new("fleet", 0, 0, object).encode().unwrap();
            (key.to_string(), bytes::Bytes::from(value))
        };
        let (k, v) = put(&other_key.1, &other);
        bus.inner.put(Bucket::Services, &k, v).await.unwrap();
        bus.inner
            .put(Bucket::Meta, "cluster.c1", "x".into())
            .await
            .unwrap();
        // Left over from an earlier run of this ingester: owned, not desired.
        let (stale_key, stale) = service("c1", "stale", 80);
        let (k, v) = put(&stale_key.1, &stale);
        bus.inner.put(Bucket::Services, &k, v).await.unwrap();
        bus.inner
            .put(Bucket::Config, "VirtualService.default.old", "junk".into())
            .await
            .unwrap();

        let mut p = publisher(&bus).await;
        let r = p.publish(&desired(&[("a", 80), ("b", 80)]), 1).await;
        assert_eq!((r.writes, r.deletes), (2, 2));
        let r = p.publish(&desired(&[("a", 80)]), 2).await;
        assert_eq!((r.writes, r.deletes), (0, 1));
        assert_eq!(
            bus.inner.keys(Bucket::Services).await.unwrap(),
            vec!["c1.default.a", "c2.default.a"]
        );
        assert!(bus.inner.keys(Bucket::Config).await.unwrap().is_empty());
        assert_eq!(
            bus.inner.keys(Bucket::Meta).await.unwrap(),
            vec!["cluster.c1"]
        );
    }

    #[tokio::test]
    async fn bus_failures_are_retried_next_round() {
        let bus = CountingBus::default();
        let mut p = publisher(&bus).await;
        p.publish(&desired(&[("a", 80), ("b", 80)]), 1).await;
        bus.set_failing(true);
        let r = p.publish(&desired(&[("a", 81)]), 2).await;
        assert_eq!((r.writes, r.deletes, r.errors), (0, 0, 2));
        assert!(p.needs_retry());
        bus.set_failing(false);
        let r = p.publish(&desired(&[("a", 81)]), 3).await;
        assert_eq!((r.writes, r.deletes, r.errors), (1, 1, 0));
        assert!(!p.needs_retry());
    }

    #[tokio::test]
    async fn too_large_value_fails_only_its_key() {
        let bus = CountingBus::default();
        let mut p = publisher(&bus).await;
        let mut state = desired(&[("big", 80), ("small", 80)]);
        p.publish(&state, 1).await;
        let (key, mut big) = service("c1", "big", 80);
        if let StateObject::Service(s) = &mut big {
            s.meta
                .labels
                .insert("blob".into(), "x".repeat(MAX_VALUE_BYTES));
        }
        state.insert(key, big);
        state.extend(desired(&[("small", 81)]));
        let r = p.publish(&state, 2).await;
        assert_eq!((r.writes, r.errors), (1, 1));
        assert!(
            !p.needs_retry(),
            "a size error is not retried until the input changes"
        );
        let entry = bus
            .inner
            .get(Bucket::Services, "c1.default.big")
            .await
            .unwrap()
            .unwrap();
        let env: Envelope<Service> = Envelope::decode(&entry.value).unwrap();
        assert!(env.body.meta.labels.is_empty(), "previous value stays");
    }

    #[tokio::test]
    async fn concurrent_write_is_detected_and_repaired() {
        let bus = CountingBus::default();
        let mut p = publisher(&bus).await;
        let state = desired(&[("a", 80)]);
        p.publish(&state, 1).await;
        // Someone else overwrites the key behind the publisher's back.
        let (_, other) = service("c1", "a", 9999);
        let value = Envelope::new("intruder", 0, 0, &other).encode().unwrap();
        bus.inner
            .put(Bucket::Services, "c1.default.a", value.into())
            .await
            .unwrap();
        let r = p.publish(&desired(&[("a", 81)]), 2).await;
        assert_eq!((r.writes, r.errors), (0, 1));
        assert!(p.needs_retry());
        let r = p.publish(&desired(&[("a", 81)]), 3).await;
        assert_eq!((r.writes, r.errors), (1, 0));
        let entry = bus
            .inner
            .get(Bucket::Services, "c1.default.a")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(entry.op, Op::Put);
        let env: Envelope<Service> = Envelope::decode(&entry.value).unwrap();
        assert_eq!(env.body.ports[0].port, 81);
    }

    #[tokio::test]
    async fn scoped_rounds_sweep_only_their_scope() {
        let bus = CountingBus::default();
        let mut p = publisher(&bus).await;
        let mut all = desired(&[("a", 80)]);
        let (_, b) = service("c1", "b", 80);
        let other_ns = (Bucket::Services, keys::service_key("c1", "other", "b"));
        all.insert(other_ns.clone(), b);
        p.publish(&all, 1).await;
        // A round for namespace `default` only, where `a` is gone: `other/b` stays.
        let in_default = |key: &StateKey| key.1.starts_with("c1.default.");
        let r = p.publish_scoped(&DesiredState::new(), 2, &in_default).await;
        assert_eq!((r.writes, r.deletes), (0, 1));
        assert_eq!(
            bus.inner.keys(Bucket::Services).await.unwrap(),
            vec![other_ns.1.clone()]
        );
        assert!(p.owned_keys().any(|key| key == &other_ns));
    }

    #[tokio::test]
    async fn ownership_limits_what_is_swept() {
        let bus = CountingBus::default();
        let (svc_key, svc) = service("c1", "a", 80);
        let value = Envelope::new("fleet", 0, 0, &svc).encode().unwrap();
        bus.inner
            .put(Bucket::Services, &svc_key.1, value.into())
            .await
            .unwrap();
        bus.inner
            .put(Bucket::Config, "Sidecar.default.s", "junk".into())
            .await
            .unwrap();
        let load = |ownership| Publisher::load_owning(Arc::new(bus.clone()), "fleet", 0, ownership);

        // A cluster's publisher never touches config, the config publisher never services.
        let mut cluster = load(Ownership::cluster("c1")).await.unwrap();
        assert!(!cluster.owns(Bucket::Config, "Sidecar.default.s"));
        assert!(!cluster.owns(Bucket::Services, "c2.default.a"));
        let r = cluster.publish(&DesiredState::new(), 1).await;
        assert_eq!(r.deletes, 1, "its service");
        assert_eq!(bus.inner.keys(Bucket::Config).await.unwrap().len(), 1);

        bus.inner
            .put(Bucket::Services, &svc_key.1, "junk".into())
            .await
            .unwrap();
        let mut config = load(Ownership::config()).await.unwrap();
        assert!(!config.owns(Bucket::Services, &svc_key.1));
        let r = config.publish(&DesiredState::new(), 2).await;
        assert_eq!(r.deletes, 1, "the config key");
        assert_eq!(bus.inner.keys(Bucket::Services).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_publisher_that_does_not_lead_writes_nothing_until_it_does() {
        let bus = CountingBus::default();
        let mut p = publisher(&bus).await;
        let (tx, rx) = tokio::sync::watch::channel(false);
        p.set_leadership(Leadership::from_watch(rx));
        let r = p.publish(&desired(&[("a", 80)]), 1).await;
        assert_eq!(r, PublishReport::default());
        assert!(p.needs_retry());
        assert_eq!(bus.counts(), Counts::default());
        tx.send_replace(true);
        let r = p.publish(&desired(&[("a", 80)]), 2).await;
        assert_eq!(r.writes, 1);
        assert!(!p.needs_retry());
    }
}
