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
//!
//! Writes depend on [`Leadership`]: the file source always leads (epoch 0, no lease); the
//! Kubernetes source leads while it holds its fleet's lease
//! ([`crate::coordination::lease`]), stamps the lease epoch into every envelope, and checks
//! before every write that its term has not ended. Readers refuse live writes of older
//! epochs ([`shoal_common::lease::fenced`]), and so does the publisher: a deposed leader's
//! write to an owned key is put right at once.

pub mod metrics;
pub mod plan;
mod repair;

use crate::coordination::lease::Leadership;
use crate::desired::{DesiredState, StateKey};
use crate::error::IngestError;
use futures::StreamExt;
use plan::{body_hash, OnBus, PlannedWrite, Stamp};
use repair::{Live, OnBusMap, Repair};
use serde::de::IgnoredAny;
use shoal_common::bus::{Bucket, BusError, Entry, Op, StateBus, WatchEvent};
use shoal_common::envelope::Envelope;
use shoal_common::keys;
use std::collections::{BTreeMap, BTreeSet};
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
                keys::parse_service_key(key).is_ok_and(|id| own_cluster(&id.cluster))
            }
            Bucket::Endpoints => {
                keys::parse_endpoints_key(key).is_ok_and(|id| own_cluster(&id.cluster))
            }
            Bucket::Meta => false,
        }
    }

    /// A short description for logs.
    pub(crate) fn describe(&self) -> String {
        match (&self.cluster, self.config) {
            (Some(c), true) => format!("config and cluster {c}"),
            (Some(c), false) => format!("cluster {c}"),
            (None, true) => "config".to_string(),
            (None, false) => "nothing".to_string(),
        }
    }
}

/// Writes a desired state to the bus: the keys of its [`Ownership`].
///
/// Under an elected [`Leadership`] the publisher reads the bus anew at the start of every
/// term (the previous leader may have written since), writes with the term's epoch, and
/// keeps watching its buckets while it leads ([`repair`]): a write to an owned key by
/// anyone else (a deposed leader that has not noticed yet, someone deleting a key) is seen
/// at once and [`Publisher::bus_changed`] asks for a round that puts this leader's value
/// back.
pub struct Publisher {
    bus: Arc<dyn StateBus>,
    fleet: String,
    ownership: Ownership,
    leadership: Leadership,
    /// For logs.
    owner: String,
    on_bus: OnBusMap,
    /// The epoch `on_bus` was read for; a new epoch (term) reads the bus again first.
    /// `None`: not read yet, or the live watch broke.
    loaded: Option<u64>,
    /// The live watch of the owned buckets and what other writers did.
    repair: Repair,
    /// The bus's count of data losses ([`StateBus::data_losses`]), and its value when
    /// `on_bus` was read: a loss since then means nothing this publisher wrote may be on
    /// the bus any more, so it reads the bus again and publishes everything.
    losses: Option<tokio::sync::watch::Receiver<u64>>,
    loaded_losses: u64,
    /// The loss count [`Publisher::bus_changed`] last announced (once per loss).
    announced_losses: u64,
    retry: bool,
    totals: PublishReport,
}

/// Resolves when the bus's loss count is not `known`; never without a loss count.
async fn data_lost(losses: Option<tokio::sync::watch::Receiver<u64>>, known: u64) {
    let Some(mut losses) = losses else {
        return std::future::pending().await;
    };
    loop {
        if *losses.borrow_and_update() != known {
            return;
        }
        if losses.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// The buckets the publisher writes.
const BUCKETS: [Bucket; 3] = [Bucket::Config, Bucket::Services, Bucket::Endpoints];

impl Publisher {
    /// A publisher that reads the bus when it first publishes (under `leadership`: when
    /// it first leads).
    pub fn new(
        bus: Arc<dyn StateBus>,
        fleet: impl Into<String>,
        ownership: Ownership,
        leadership: Leadership,
    ) -> Publisher {
        let fleet = fleet.into();
        let owner = ownership.describe();
        let losses = bus.data_losses();
        Publisher {
            bus,
            losses,
            loaded_losses: 0,
            announced_losses: 0,
            repair: Repair::new(fleet.clone(), owner.clone()),
            fleet,
            owner,
            ownership,
            leadership,
            on_bus: BTreeMap::new(),
            loaded: None,
            retry: false,
            totals: PublishReport::default(),
        }
    }

    /// Reads the keys this publisher owns, and their values, from the bus: every config
    /// key and the services and endpoints of `cluster` (the file source's ownership).
    /// It always leads, with epoch 0 (no lease).
    pub async fn load(
        bus: Arc<dyn StateBus>,
        fleet: impl Into<String>,
        cluster: impl Into<String>,
    ) -> Result<Publisher, IngestError> {
        let ownership = Ownership::config_and_cluster(cluster);
        Publisher::load_owning(bus, fleet, ownership).await
    }

    /// Reads the keys of `ownership`, and their values, from the bus. It always leads,
    /// with epoch 0 (no lease), until [`Publisher::set_leadership`].
    pub async fn load_owning(
        bus: Arc<dyn StateBus>,
        fleet: impl Into<String>,
        ownership: Ownership,
    ) -> Result<Publisher, IngestError> {
        let mut publisher = Publisher::new(bus, fleet, ownership, Leadership::always());
        publisher.read_bus(0).await?;
        Ok(publisher)
    }

    /// Makes writes depend on leadership (the default is [`Leadership::always`]). A
    /// leadership with another epoch re-reads the bus before its first write.
    pub fn set_leadership(&mut self, leadership: Leadership) {
        self.leadership = leadership;
    }

    fn buckets(&self) -> Vec<Bucket> {
        BUCKETS
            .into_iter()
            .filter(|b| match b {
                Bucket::Config => self.ownership.config,
                _ => self.ownership.cluster.is_some(),
            })
            .collect()
    }

    /// Reads every owned value for a term of `epoch`: one watch per bucket delivers every
    /// value in one pass (a get per key would be a round trip per key). Under an elected
    /// leadership the watches are kept, to see other writers' changes live.
    async fn read_bus(&mut self, epoch: u64) -> Result<(), IngestError> {
        let action = "reading owned state from the bus";
        self.on_bus.clear();
        self.repair.reset();
        self.loaded = None;
        self.loaded_losses = self.losses.as_ref().map_or(0, |l| *l.borrow());
        self.announced_losses = self.loaded_losses;
        let elected = self.leadership.is_elected();
        let buckets = self.buckets();
        let mut streams = Vec::new();
        for bucket in &buckets {
            let bucket = *bucket;
            let watch = self
                .bus
                .watch(bucket)
                .await
                .map_err(|source| IngestError::Bus { action, source })?;
            streams.push(watch.map(move |item| (bucket, item)).boxed());
        }
        let mut merged = futures::stream::select_all(streams);
        let mut pending: BTreeSet<Bucket> = buckets.into_iter().collect();
        while !pending.is_empty() {
            match merged.next().await {
                Some((bucket, Ok(WatchEvent::Entry(entry)))) if pending.contains(&bucket) => {
                    self.record_initial(bucket, entry);
                }
                // A change after its bucket's initial values: live already.
                Some((bucket, Ok(WatchEvent::Entry(entry)))) => {
                    self.repair.record(
                        &mut self.on_bus,
                        &self.ownership,
                        bucket,
                        entry,
                        epoch,
                        elected,
                    );
                }
                Some((bucket, Ok(WatchEvent::InitialDone))) => {
                    pending.remove(&bucket);
                }
                Some((_, Err(source))) => return Err(IngestError::Bus { action, source }),
                None => {
                    let source = BusError::Op {
                        op: "watch",
                        bucket: pending.first().copied().unwrap_or(Bucket::Config),
                        key: String::new(),
                        source: "the watch ended before delivering the initial values".into(),
                    };
                    return Err(IngestError::Bus { action, source });
                }
            }
        }
        self.loaded = Some(epoch);
        if elected {
            self.repair.follow(merged.boxed());
        }
        debug!(
            keys = self.on_bus.len(),
            owner = %self.owner,
            epoch,
            "read owned state from the bus",
        );
        Ok(())
    }

    /// An initial value: the latest of its key, whichever epoch wrote it (a key that an
    /// earlier leader wrote and that did not change since is current).
    fn record_initial(&mut self, bucket: Bucket, entry: Entry) {
        let key = (bucket, entry.key);
        if entry.op == Op::Delete || !self.owns(bucket, &key.1) {
            self.on_bus.remove(&key);
            return;
        }
        // A value another fleet wrote (the previous owner of a cluster that moved to this
        // fleet) gets no hash: every such key is rewritten, so that each key carries the
        // fleet that owns it now. Its content is unchanged, so servers push nothing.
        let own = Envelope::<IgnoredAny>::decode(&entry.value).is_ok_and(|h| h.fleet == self.fleet);
        let hash = own
            .then(|| body_hash(bucket, &key.1, &entry.value))
            .flatten();
        let revision = entry.revision;
        self.on_bus.insert(key, OnBus { hash, revision });
    }

    /// Whether the bus lost data since `on_bus` was read.
    fn bus_lost_data(&self) -> bool {
        self.losses
            .as_ref()
            .is_some_and(|l| *l.borrow() != self.loaded_losses)
    }

    /// Handles what the live watch has delivered so far; returns whether a round is needed.
    fn drain_live(&mut self) -> bool {
        let epoch = self.loaded.unwrap_or(0);
        let elected = self.leadership.is_elected();
        match self
            .repair
            .drain(&mut self.on_bus, &self.ownership, epoch, elected)
        {
            Live::Quiet => false,
            Live::Round => true,
            Live::Broken => {
                self.loaded = None;
                true
            }
        }
    }

    /// Resolves when another writer changed an owned key (seen by the live watch, while
    /// leading an elected term): the caller should publish, in full ([`Publisher::needs_retry`]
    /// says so), which puts this leader's values back. Never resolves without a live
    /// watch. Cancel-safe, for `select!` loops.
    pub async fn bus_changed(&mut self) {
        loop {
            let losses = self.losses.as_ref().map_or(0, |l| *l.borrow());
            if losses != self.announced_losses {
                self.announced_losses = losses;
                if losses != self.loaded_losses {
                    self.retry = true;
                    return;
                }
            }
            let item = tokio::select! {
                item = self.repair.next() => item,
                () = data_lost(self.losses.clone(), self.announced_losses) => continue,
            };
            if self.leadership.current() != self.loaded {
                // The term this watch was opened for is over; the next one reads the bus
                // again (and watches anew).
                self.repair.stop();
                self.loaded = None;
                continue;
            }
            let epoch = self.loaded.unwrap_or(0);
            let elected = self.leadership.is_elected();
            match self
                .repair
                .on_item(&mut self.on_bus, &self.ownership, item, epoch, elected)
            {
                Live::Quiet => {}
                Live::Round => {
                    self.retry = true;
                    return;
                }
                Live::Broken => {
                    self.loaded = None;
                    self.retry = true;
                    return;
                }
            }
        }
    }

    /// Whether another fleet wrote an owned key since the last call (handling what the
    /// live watch delivered so far), and resets it. Writing the key back is right only if
    /// this fleet still owns the cluster: the caller checks that first.
    pub fn take_foreign_fleet(&mut self) -> bool {
        if self.drain_live() {
            self.retry = true;
        }
        self.repair.take_foreign_fleet()
    }

    /// Whether a key is this publisher's to write and delete.
    pub fn owns(&self, bucket: Bucket, key: &str) -> bool {
        self.ownership.owns(bucket, key)
    }

    /// The owned keys currently on the bus (as far as this publisher knows).
    pub fn owned_keys(&self) -> impl Iterator<Item = &StateKey> {
        self.on_bus.keys()
    }

    /// Whether the next round must publish everything, even if the input did not change:
    /// the last round left bus failures, another writer changed an owned key, or a new
    /// term started (its first round compares everything with the bus).
    pub fn needs_retry(&self) -> bool {
        if self.retry || self.bus_lost_data() {
            return true;
        }
        let current = self.leadership.current();
        current.is_some() && current != self.loaded
    }

    /// The counters of every round so far.
    pub fn totals(&self) -> PublishReport {
        self.totals
    }

    /// Makes the bus match `desired`: writes changed values, stamped `observed_at_ms`, and
    /// deletes owned keys that are not desired. Per-key failures are logged and counted,
    /// never fatal; keys that failed on the bus are retried next round.
    pub async fn publish(&mut self, desired: &DesiredState, observed_at_ms: u64) -> PublishReport {
        self.publish_in(desired, observed_at_ms, &|_| true, true)
            .await
    }

    /// Like [`Publisher::publish`] for part of the state: `desired` holds every desired key
    /// in scope, and only owned keys in scope are swept. A caller that recomputes only
    /// what changed (some namespaces) passes that scope; keys outside it are left alone.
    /// After a round with bus failures, the caller should publish everything again.
    ///
    /// Only while leading: the term's epoch is checked before every write and delete, and
    /// a round stops at once when the term ends.
    pub async fn publish_scoped(
        &mut self,
        desired: &DesiredState,
        observed_at_ms: u64,
        in_scope: &(dyn Fn(&StateKey) -> bool + Sync),
    ) -> PublishReport {
        self.publish_in(desired, observed_at_ms, in_scope, false)
            .await
    }

    /// A round; `full` when `desired` is the whole desired state.
    async fn publish_in(
        &mut self,
        desired: &DesiredState,
        observed_at_ms: u64,
        in_scope: &(dyn Fn(&StateKey) -> bool + Sync),
        full: bool,
    ) -> PublishReport {
        let mut report = PublishReport::default();
        let Some(epoch) = self.leadership.current() else {
            debug!(owner = %self.owner, "not leading; publishing nothing");
            self.retry = true;
            return report;
        };
        // A new term: what is on the bus now is what the previous leader left. After a
        // loss of the bus's data, the same: nothing written before may be there.
        let data_lost = self.bus_lost_data();
        if data_lost {
            warn!(owner = %self.owner, epoch, "the bus lost its data; reading it again and publishing everything");
        }
        let new_term = self.loaded != Some(epoch) || data_lost;
        if new_term {
            if let Err(error) = self.read_bus(epoch).await {
                warn!(%error, owner = %self.owner, epoch, "cannot read owned state from the bus; retrying");
                report.errors += 1;
                self.retry = true;
                self.totals.add(&report);
                return report;
            }
        }
        let foreign = self.drain_live();
        if let Some(newer) = self.repair.superseded() {
            debug!(owner = %self.owner, epoch, newer, "another replica leads; publishing nothing");
            self.retry = true;
            return report;
        }
        let stamp = Stamp {
            fleet: &self.fleet,
            epoch,
            observed_at_ms,
        };
        let plan = plan::plan(desired, &self.on_bus, in_scope, stamp);
        report.unchanged = plan.unchanged;
        for error in &plan.invalid {
            warn!(%error, "publishing failed for this key; its previous value stays");
            report.errors += 1;
        }
        let mut bus_failed = false;
        let mut lost = false;
        for write in plan.writes {
            if self.leadership.current() != Some(epoch) {
                lost = true;
                break;
            }
            match self.write(write, epoch).await {
                Ok(()) => report.writes += 1,
                Err(error) => {
                    warn!(%error, "publishing failed for this key; its previous value stays");
                    report.errors += 1;
                    bus_failed = true;
                }
            }
        }
        for key in plan.deletes {
            if lost || self.leadership.current() != Some(epoch) {
                lost = true;
                break;
            }
            let (bucket, name) = &key;
            match self.bus.delete(*bucket, name).await {
                Ok(()) => {
                    self.on_bus.remove(&key);
                    self.repair.deleted(key);
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
        if lost {
            warn!(
                owner = %self.owner,
                fleet = %self.fleet,
                epoch,
                "the lease term ended during a publish round; the rest is left to the leader"
            );
        }
        // After a new term or another writer's change, a full round follows if this one
        // covered only part of the keys.
        self.retry = bus_failed || lost || (!full && (new_term || foreign));
        self.totals.add(&report);
        if report.changed() || report.errors > 0 {
            info!(
                writes = report.writes,
                deletes = report.deletes,
                unchanged = report.unchanged,
                errors = report.errors,
                owner = %self.owner,
                epoch,
                "published state"
            );
        }
        report
    }

    /// Carries out one planned write: compare-and-set against the revision last seen, so
    /// a write never silently replaces a value someone else wrote.
    async fn write(&mut self, write: PlannedWrite, epoch: u64) -> Result<(), IngestError> {
        let PlannedWrite {
            key,
            value,
            hash,
            expected,
        } = write;
        let (bucket, name) = &key;
        match self.bus.update(*bucket, name, value.into(), expected).await {
            Ok(revision) => {
                let hash = Some(hash);
                self.on_bus.insert(key, OnBus { hash, revision });
                Ok(())
            }
            Err(source) => {
                if matches!(source, BusError::RevisionMismatch { .. }) {
                    self.refresh(&key, epoch).await;
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
    async fn refresh(&mut self, key: &StateKey, epoch: u64) {
        let (bucket, name) = key;
        match self.bus.get(*bucket, name).await {
            Ok(Some(entry)) => {
                let elected = self.leadership.is_elected();
                let judged = self.repair.judge(*bucket, name, &entry, epoch, elected);
                self.on_bus.insert(key.clone(), judged);
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
    use crate::coordination::lease::Term;
    use crate::desired::StateObject;
    use crate::testing::{desired, service, CountingBus, Counts};
    use shoal_common::bus::{Entry, MAX_VALUE_BYTES};
    use shoal_common::model::Service;
    use shoal_common::Op;
    use tokio::time::Instant;

    async fn publisher(bus: &CountingBus) -> Publisher {
        Publisher::load(Arc::new(bus.clone()), "fleet", "c1")
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
        let load = |ownership| Publisher::load_owning(Arc::new(bus.clone()), "fleet", ownership);

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

    fn elected(epoch: Option<u64>) -> (tokio::sync::watch::Sender<Term>, Leadership) {
        let term = match epoch {
            Some(epoch) => Term {
                leading: true,
                epoch,
                until: Some(Instant::now() + std::time::Duration::from_secs(3600)),
            },
            None => Term::standby(),
        };
        let (tx, rx) = tokio::sync::watch::channel(term);
        (tx, Leadership::from_watch(rx))
    }

    fn leading(epoch: u64) -> Term {
        Term {
            leading: true,
            epoch,
            until: Some(Instant::now() + std::time::Duration::from_secs(3600)),
        }
    }

    fn elected_publisher(bus: &CountingBus, leadership: Leadership) -> Publisher {
        Publisher::new(
            Arc::new(bus.clone()),
            "fleet",
            Ownership::config_and_cluster("c1"),
            leadership,
        )
    }

    async fn on_bus(bus: &CountingBus, name: &str) -> (Envelope<Service>, u64) {
        let entry = bus
            .inner
            .get(Bucket::Services, &keys::service_key("c1", "default", name))
            .await
            .unwrap()
            .expect("the key is on the bus");
        (Envelope::decode(&entry.value).unwrap(), entry.revision)
    }

    /// Writes a service as another writer would, stamped `epoch`.
    async fn intrude(bus: &CountingBus, name: &str, port: u16, epoch: u64) {
        let (key, object) = service("c1", name, port);
        let value = Envelope::new("fleet", epoch, 0, &object).encode().unwrap();
        bus.inner
            .put(Bucket::Services, &key.1, value.into())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_publisher_that_does_not_lead_writes_nothing_until_it_does() {
        let bus = CountingBus::default();
        let (tx, leadership) = elected(None);
        let mut p = elected_publisher(&bus, leadership);
        let r = p.publish(&desired(&[("a", 80)]), 1).await;
        assert_eq!(r, PublishReport::default());
        assert!(p.needs_retry());
        assert_eq!(bus.counts(), Counts::default());
        tx.send_replace(leading(3));
        assert!(p.needs_retry(), "a new term publishes everything");
        let r = p.publish(&desired(&[("a", 80)]), 2).await;
        assert_eq!(r.writes, 1);
        assert!(!p.needs_retry());
        let (env, _) = on_bus(&bus, "a").await;
        assert_eq!(env.epoch, 3, "every write carries the lease epoch");
    }

    #[tokio::test]
    async fn a_term_past_its_deadline_writes_nothing() {
        let bus = CountingBus::default();
        let (_tx, leadership) = elected(None);
        let mut p = elected_publisher(&bus, leadership);
        _tx.send_replace(Term {
            leading: true,
            epoch: 1,
            until: Some(Instant::now()),
        });
        let r = p.publish(&desired(&[("a", 80)]), 1).await;
        assert_eq!(r, PublishReport::default());
        assert_eq!(bus.counts(), Counts::default());
    }

    #[tokio::test]
    async fn a_new_term_publishes_only_what_differs_from_the_bus() {
        let bus = CountingBus::default();
        let (old_tx, old) = elected(Some(1));
        let mut old_leader = elected_publisher(&bus, old);
        old_leader
            .publish(&desired(&[("a", 80), ("b", 80), ("gone", 80)]), 1)
            .await;
        let (_, a_revision) = on_bus(&bus, "a").await;

        // The standby's caches have changes the old leader never published.
        let (tx, standby) = elected(None);
        let mut new_leader = elected_publisher(&bus, standby);
        let state = desired(&[("a", 80), ("b", 81), ("c", 80)]);
        assert_eq!(
            new_leader.publish(&state, 2).await,
            PublishReport::default()
        );
        old_tx.send_replace(Term::standby());
        tx.send_replace(leading(2));
        let r = new_leader.publish(&state, 3).await;
        assert_eq!((r.writes, r.unchanged, r.deletes), (2, 1, 1));
        // `a`, written in epoch 1 and unchanged, stays as it is: no rewrite per term.
        let (a, revision) = on_bus(&bus, "a").await;
        assert_eq!((a.epoch, revision), (1, a_revision));
        let (b, _) = on_bus(&bus, "b").await;
        assert_eq!((b.epoch, b.body.ports[0].port), (2, 81));

        // The deposed leader stops following the bus: the new leader's writes are no news.
        let quiet = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            old_leader.bus_changed(),
        );
        assert!(quiet.await.is_err(), "a deposed leader asked to publish");
        assert!(!old_leader.needs_retry());
        // And it writes nothing, even with a changed input.
        let before = bus.counts();
        let r = old_leader.publish(&desired(&[("a", 99)]), 4).await;
        assert_eq!(r, PublishReport::default());
        assert_eq!(bus.counts(), before);
    }

    #[tokio::test]
    async fn a_deposed_leaders_write_is_put_right_at_once() {
        let bus = CountingBus::default();
        let (_tx, leadership) = elected(Some(2));
        let mut p = elected_publisher(&bus, leadership);
        let state = desired(&[("a", 80), ("b", 80)]);
        p.publish(&state, 1).await;
        assert!(!p.needs_retry());

        // A deposed leader (epoch 1) wakes up and writes: another value, then the same one.
        for port in [9999, 80] {
            intrude(&bus, "a", port, 1).await;
            tokio::time::timeout(std::time::Duration::from_secs(5), p.bus_changed())
                .await
                .expect("the live watch sees the write");
            assert!(p.needs_retry());
            let r = p.publish_scoped(&DesiredState::new(), 2, &|_| false).await;
            assert_eq!(r, PublishReport::default(), "a scoped round leaves it");
            let r = p.publish(&state, 3).await;
            assert_eq!((r.writes, r.unchanged), (1, 1), "port {port}");
            let (a, _) = on_bus(&bus, "a").await;
            assert_eq!((a.epoch, a.body.ports[0].port), (2, 80));
            assert!(!p.needs_retry());
        }

        // A delete by someone else is put right too.
        bus.inner
            .delete(Bucket::Services, &keys::service_key("c1", "default", "b"))
            .await
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), p.bus_changed())
            .await
            .expect("the live watch sees the delete");
        let r = p.publish(&state, 4).await;
        assert_eq!(r.writes, 1);
        assert_eq!(on_bus(&bus, "b").await.0.epoch, 2);

        // This leader's own writes and deletes are not news.
        p.publish(&desired(&[("a", 81)]), 5).await;
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), p.bus_changed());
        assert!(quiet.await.is_err(), "own writes woke the publisher");
    }

    #[tokio::test]
    async fn a_newer_epoch_on_an_owned_key_ends_writing_in_this_term() {
        let bus = CountingBus::default();
        let (_tx, leadership) = elected(Some(2));
        let mut p = elected_publisher(&bus, leadership);
        p.publish(&desired(&[("a", 80)]), 1).await;
        // A leader of epoch 3 writes: this one has been deposed and does not know it yet.
        intrude(&bus, "a", 81, 3).await;
        tokio::time::timeout(std::time::Duration::from_secs(5), p.bus_changed())
            .await
            .expect("the live watch sees the write");
        let before = bus.counts();
        let r = p.publish(&desired(&[("a", 80), ("b", 80)]), 2).await;
        assert_eq!(r, PublishReport::default());
        assert_eq!(bus.counts(), before);
        assert_eq!(on_bus(&bus, "a").await.0.epoch, 3);
    }

    #[tokio::test]
    async fn an_implausible_epoch_on_an_owned_key_is_put_right_not_obeyed() {
        let bus = CountingBus::default();
        let (_tx, leadership) = elected(Some(2));
        let mut p = elected_publisher(&bus, leadership);
        let state = desired(&[("a", 80)]);
        p.publish(&state, 1).await;
        // Forged: no leader writes with an epoch 2^62 above the lease.
        intrude(&bus, "a", 9999, 1 << 62).await;
        tokio::time::timeout(std::time::Duration::from_secs(5), p.bus_changed())
            .await
            .expect("the live watch sees the write");
        let r = p.publish(&state, 2).await;
        assert_eq!(r.writes, 1, "still writing in this term");
        let (a, _) = on_bus(&bus, "a").await;
        assert_eq!((a.epoch, a.body.ports[0].port), (2, 80));
    }

    /// A bus whose writes take 400 ms.
    #[derive(Clone, Default)]
    struct SlowBus(CountingBus);

    #[async_trait::async_trait]
    impl StateBus for SlowBus {
        async fn get(&self, bucket: Bucket, key: &str) -> Result<Option<Entry>, BusError> {
            self.0.get(bucket, key).await
        }
        async fn put(
            &self,
            bucket: Bucket,
            key: &str,
            value: bytes::Bytes,
        ) -> Result<u64, BusError> {
            self.0.put(bucket, key, value).await
        }
        async fn update(
            &self,
            bucket: Bucket,
            key: &str,
            value: bytes::Bytes,
            expected: u64,
        ) -> Result<u64, BusError> {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            self.0.update(bucket, key, value, expected).await
        }
        async fn delete(&self, bucket: Bucket, key: &str) -> Result<(), BusError> {
            self.0.delete(bucket, key).await
        }
        async fn keys(&self, bucket: Bucket) -> Result<Vec<String>, BusError> {
            self.0.keys(bucket).await
        }
        async fn watch(&self, bucket: Bucket) -> Result<shoal_common::bus::WatchStream, BusError> {
            self.0.watch(bucket).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_stops_when_the_term_ends() {
        let bus = SlowBus::default();
        let (_tx, leadership) = elected(None);
        _tx.send_replace(Term {
            leading: true,
            epoch: 1,
            until: Some(Instant::now() + std::time::Duration::from_secs(1)),
        });
        let mut p = Publisher::new(
            Arc::new(bus.clone()),
            "fleet",
            Ownership::cluster("c1"),
            leadership,
        );
        let r = p
            .publish(
                &desired(&[("a", 80), ("b", 80), ("c", 80), ("d", 80), ("e", 80)]),
                1,
            )
            .await;
        // Writes start at 0, 400 and 800 ms; at 1200 ms the term is over.
        assert_eq!(r.writes, 3);
        assert_eq!(bus.0.counts().writes, 3);
        assert!(p.needs_retry());
    }
}
