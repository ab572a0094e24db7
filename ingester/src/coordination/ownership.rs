//! Cluster ownership between fleets: each cluster ID is published by one fleet, the one
//! its owner record in `shoal-meta` names ([`shoal_common::ownership`]).
//!
//! [`Owners`] follows the owner records and the fleets' leases with one watch of
//! `shoal-meta`, and writes owner records for this fleet, always with compare-and-set on
//! their revision and only while this replica leads its fleet:
//!
//! - **Claim** ([`Owners::claim`]), before the first write of a cluster in a term: a cluster
//!   without a record, or whose record is released, or whose owner's lease is not current
//!   (an abandoned fleet), becomes this fleet's. A cluster owned by another fleet whose
//!   lease is current is refused: nothing of it is written.
//! - **Release** ([`Owners::release`]) when this fleet stops serving a cluster: the record
//!   stays this fleet's, marked released, and the cluster's keys stay on the bus, for the
//!   fleet it moved to to claim and rewrite. Nothing is deleted in between.
//! - **Reclaim** ([`Owners::reclaim`]) of a record this fleet released, when no other fleet
//!   claimed it: then the cluster's keys are deleted, and the record with them
//!   ([`Owners::forget`]).
//!
//! A fleet's lease is **current** while its key keeps changing: its revision changed less
//! than a ttl ago on this replica's clock (counting from when this replica first saw that
//! revision, as a standby measures expiry; a released lease counts too, for the ttl its
//! standby needs to take over), and its last renewal is less than two ttls old by the
//! wall clock.

use crate::coordination::lease::Leadership;
use crate::task::TaskGuard;
use futures::StreamExt;
use shoal_common::bus::{Bucket, BusError, StateBus, WatchEvent};
use shoal_common::envelope::now_ms;
use shoal_common::keys;
use shoal_common::lease::{self, LeaseBody};
use shoal_common::ownership::{self, OwnerBody, OwnerChange, OwnerRecord};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How often waiters re-evaluate standings even without a change on the bus: a lease
/// expires by time, not by a write.
pub const RECHECK: Duration = Duration::from_secs(1);

/// Compare-and-set attempts of one claim or release before giving up for this round.
const ATTEMPTS: usize = 3;

/// Where a cluster stands for this fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// This fleet owns the cluster.
    Mine,
    /// Nobody owns it: no record, or its owner released it.
    Free,
    /// Another fleet owns it, but that fleet's lease is not current: it may be taken over.
    Abandoned(String),
    /// Another fleet owns it and its lease is current: this fleet must not publish it.
    Taken(String),
}

/// Why a claim or release did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another fleet whose lease is current owns the cluster.
    #[error("cluster {cluster:?} is owned by fleet {owner:?}, whose lease is current")]
    Refused {
        /// The cluster.
        cluster: String,
        /// The owning fleet.
        owner: String,
    },
    /// This replica does not lead its fleet (or its term ended).
    #[error("not leading")]
    NotLeading,
    /// The owner records were not read from the bus yet.
    #[error("the owner records are not loaded yet")]
    NotLoaded,
    /// The record kept changing under the compare-and-set.
    #[error("the owner record of cluster {0:?} keeps changing")]
    Contended(String),
    /// The bus failed.
    #[error("owner record of cluster {cluster:?}: {source}")]
    Bus {
        /// The cluster.
        cluster: String,
        /// The cause.
        #[source]
        source: BusError,
    },
}

/// The outcome of [`Owners::release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// The record is this fleet's and released.
    Released,
    /// Another fleet owns the cluster: nothing to release.
    NotMine(String),
}

/// A lease as this replica has seen it.
#[derive(Debug, Clone)]
struct SeenLease {
    body: Option<LeaseBody>,
    revision: u64,
    /// When this replica first saw this revision.
    seen: Instant,
    /// The lease's ttl (the last non-zero one seen: a released lease carries 0).
    ttl: Duration,
}

#[derive(Debug, Default)]
struct Table {
    owners: BTreeMap<String, OwnerRecord>,
    leases: BTreeMap<String, SeenLease>,
    loaded: bool,
}

struct Inner {
    bus: Arc<dyn StateBus>,
    fleet: String,
    leadership: Leadership,
    default_ttl: Duration,
    table: Mutex<Table>,
    /// Bumped on every change of an owner record or lease.
    changes: watch::Sender<u64>,
    _watch: Mutex<Option<TaskGuard>>,
}

/// The owner records and fleet leases of the bus, and this fleet's writes of owner
/// records. Cheap to clone; the watch stops when the last clone is dropped.
#[derive(Clone)]
pub struct Owners {
    inner: Arc<Inner>,
}

/// Wakes on every change of the owner records or leases, and at least every [`RECHECK`].
pub struct OwnerEvents {
    rx: watch::Receiver<u64>,
}

impl OwnerEvents {
    /// Resolves at the next change, or after [`RECHECK`]. Cancel-safe.
    pub async fn next(&mut self) {
        let _ = tokio::time::timeout(RECHECK, self.rx.changed()).await;
    }
}

impl Owners {
    /// Starts following `shoal-meta` for `fleet`, which writes while `leadership` leads.
    /// `default_ttl` is assumed for a fleet whose lease has not shown a ttl (this fleet's
    /// own `--lease-ttl`).
    pub fn start(
        bus: Arc<dyn StateBus>,
        fleet: &str,
        leadership: Leadership,
        default_ttl: Duration,
    ) -> Owners {
        let owners = Owners {
            inner: Arc::new(Inner {
                bus,
                fleet: fleet.to_string(),
                leadership,
                default_ttl,
                table: Mutex::default(),
                changes: watch::Sender::new(0),
                _watch: Mutex::new(None),
            }),
        };
        let weak = Arc::downgrade(&owners.inner);
        let task = TaskGuard::new(tokio::spawn(follow(weak)));
        *owners
            .inner
            ._watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(task);
        owners
    }

    /// This fleet.
    pub fn fleet(&self) -> &str {
        &self.inner.fleet
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the owner records and leases have been read from the bus once.
    pub async fn loaded(&self) {
        let mut rx = self.inner.changes.subscribe();
        while !self.table().loaded {
            let _ = tokio::time::timeout(RECHECK, rx.changed()).await;
        }
    }

    /// Whether the owner records have been read from the bus.
    pub fn is_loaded(&self) -> bool {
        self.table().loaded
    }

    /// A subscription to changes of the owner records and leases.
    pub fn events(&self) -> OwnerEvents {
        let mut rx = self.inner.changes.subscribe();
        rx.borrow_and_update();
        OwnerEvents { rx }
    }

    /// Where a cluster stands for this fleet, by the records read so far.
    pub fn standing(&self, cluster: &str) -> Standing {
        let table = self.table();
        self.standing_in(&table, table.owners.get(cluster), Instant::now())
    }

    /// The fleet that owns a cluster (released or not), by the records read so far.
    pub fn owner(&self, cluster: &str) -> Option<OwnerBody> {
        self.table().owners.get(cluster).map(|r| r.body.clone())
    }

    /// The clusters whose record names this fleet (released or not).
    pub fn mine(&self) -> Vec<String> {
        let table = self.table();
        table
            .owners
            .iter()
            .filter(|(_, r)| r.body.fleet == self.inner.fleet)
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// The other fleets whose lease is current: those that could take a released cluster.
    pub fn other_live_fleets(&self) -> Vec<String> {
        let table = self.table();
        let now = Instant::now();
        table
            .leases
            .keys()
            .filter(|f| **f != self.inner.fleet && self.live_in(&table, f, now))
            .cloned()
            .collect()
    }

    fn standing_in(&self, table: &Table, record: Option<&OwnerRecord>, now: Instant) -> Standing {
        match record {
            None => Standing::Free,
            Some(r) if r.body.released => Standing::Free,
            Some(r) if r.body.fleet == self.inner.fleet => Standing::Mine,
            Some(r) if self.live_in(table, &r.body.fleet, now) => {
                Standing::Taken(r.body.fleet.clone())
            }
            Some(r) => Standing::Abandoned(r.body.fleet.clone()),
        }
    }

    fn live_in(&self, table: &Table, fleet: &str, now: Instant) -> bool {
        let Some(lease) = table.leases.get(fleet) else {
            return false;
        };
        let window = lease.ttl;
        if now.duration_since(lease.seen) >= window {
            return false;
        }
        // A lease unreadable to this build counts while it keeps changing.
        lease.body.as_ref().is_none_or(|body| {
            let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
            now_ms().saturating_sub(body.renewed_at_ms) <= window_ms.saturating_mul(2)
        })
    }

    /// The current record of a cluster, read from the bus (not from the watch).
    async fn read(&self, cluster: &str) -> Result<Option<OwnerRecord>, ClaimError> {
        let key = keys::owner_key(cluster);
        let entry = self
            .inner
            .bus
            .get(Bucket::Meta, &key)
            .await
            .map_err(|source| ClaimError::Bus {
                cluster: cluster.to_string(),
                source,
            })?;
        Ok(
            entry.and_then(|entry| match ownership::owner_change(&entry) {
                OwnerChange::Set(_, record) => Some(record),
                _ => None,
            }),
        )
    }

    /// Writes this fleet's record with compare-and-set on `expected`; `Ok(false)` when
    /// the revision changed.
    async fn write(
        &self,
        cluster: &str,
        released: bool,
        expected: u64,
    ) -> Result<bool, ClaimError> {
        let Some(epoch) = self.inner.leadership.current() else {
            return Err(ClaimError::NotLeading);
        };
        let body = OwnerBody {
            cluster: cluster.to_string(),
            fleet: self.inner.fleet.clone(),
            released,
            since_ms: now_ms(),
        };
        let value = match ownership::encode(epoch, &body) {
            Ok(value) => value,
            Err(error) => {
                let source = BusError::Op {
                    op: "encode",
                    bucket: Bucket::Meta,
                    key: keys::owner_key(cluster),
                    source: Box::new(error),
                };
                return Err(ClaimError::Bus {
                    cluster: cluster.to_string(),
                    source,
                });
            }
        };
        let key = keys::owner_key(cluster);
        match self
            .inner
            .bus
            .update(Bucket::Meta, &key, value.into(), expected)
            .await
        {
            Ok(revision) => {
                self.record(cluster, OwnerRecord { body, revision });
                Ok(true)
            }
            Err(BusError::RevisionMismatch { .. }) => Ok(false),
            Err(source) => Err(ClaimError::Bus {
                cluster: cluster.to_string(),
                source,
            }),
        }
    }

    /// Applies this replica's own write at once (the watch delivers it later too).
    fn record(&self, cluster: &str, record: OwnerRecord) {
        {
            let mut table = self.table();
            let newer = table
                .owners
                .get(cluster)
                .is_none_or(|known| known.revision < record.revision);
            if newer {
                table.owners.insert(cluster.to_string(), record);
            }
        }
        self.inner.changes.send_modify(|n| *n += 1);
    }

    /// Makes this fleet the owner of `cluster`, unless another fleet whose lease is current
    /// owns it ([`ClaimError::Refused`]). Writes only when the record does not already
    /// name this fleet as owner. Only while leading.
    pub async fn claim(&self, cluster: &str) -> Result<(), ClaimError> {
        if !self.is_loaded() {
            return Err(ClaimError::NotLoaded);
        }
        for _ in 0..ATTEMPTS {
            if !self.inner.leadership.leads() {
                return Err(ClaimError::NotLeading);
            }
            let record = self.read(cluster).await?;
            let standing = {
                let table = self.table();
                self.standing_in(&table, record.as_ref(), Instant::now())
            };
            let previous = record.as_ref().map(|r| r.body.clone());
            match standing {
                Standing::Mine => {
                    if let Some(record) = record {
                        self.record(cluster, record);
                    }
                    return Ok(());
                }
                Standing::Taken(owner) => {
                    return Err(ClaimError::Refused {
                        cluster: cluster.to_string(),
                        owner,
                    })
                }
                Standing::Free | Standing::Abandoned(_) => {
                    let expected = record.as_ref().map_or(0, |r| r.revision);
                    if self.write(cluster, false, expected).await? {
                        match previous {
                            None => {
                                info!(%cluster, fleet = %self.inner.fleet, "claimed the cluster")
                            }
                            Some(p) if p.fleet == self.inner.fleet => {
                                info!(%cluster, fleet = %self.inner.fleet, "claimed the cluster back")
                            }
                            Some(p) if p.released => info!(
                                %cluster,
                                fleet = %self.inner.fleet,
                                previous = %p.fleet,
                                "took over the cluster released by its previous fleet"
                            ),
                            Some(p) => warn!(
                                %cluster,
                                fleet = %self.inner.fleet,
                                previous = %p.fleet,
                                "took over the cluster from a fleet whose lease is not current"
                            ),
                        }
                        return Ok(());
                    }
                }
            }
        }
        Err(ClaimError::Contended(cluster.to_string()))
    }

    /// Marks this fleet's record of `cluster` released (creating it when there is none):
    /// this fleet stopped publishing the cluster and leaves its keys for another fleet to
    /// take over. Only while leading.
    pub async fn release(&self, cluster: &str) -> Result<Released, ClaimError> {
        for _ in 0..ATTEMPTS {
            let record = self.read(cluster).await?;
            match &record {
                Some(r) if r.body.fleet != self.inner.fleet && !r.body.released => {
                    return Ok(Released::NotMine(r.body.fleet.clone()))
                }
                Some(r) if r.body.released => {
                    if r.body.fleet == self.inner.fleet {
                        return Ok(Released::Released);
                    }
                    return Ok(Released::NotMine(r.body.fleet.clone()));
                }
                _ => {}
            }
            let expected = record.as_ref().map_or(0, |r| r.revision);
            if self.write(cluster, true, expected).await? {
                info!(%cluster, fleet = %self.inner.fleet, "released the cluster; its keys stay for the fleet that takes it over");
                return Ok(Released::Released);
            }
        }
        Err(ClaimError::Contended(cluster.to_string()))
    }

    /// Takes back a cluster this fleet released, so that its keys can be deleted: true when
    /// the record is (again) this fleet's, false when another fleet has it now. A record
    /// that is gone counts as this fleet's. Only while leading.
    pub async fn reclaim(&self, cluster: &str) -> Result<bool, ClaimError> {
        for _ in 0..ATTEMPTS {
            let record = self.read(cluster).await?;
            match &record {
                Some(r) if r.body.fleet != self.inner.fleet => return Ok(false),
                Some(r) if !r.body.released => return Ok(true),
                _ => {}
            }
            let expected = record.as_ref().map_or(0, |r| r.revision);
            if self.write(cluster, false, expected).await? {
                return Ok(true);
            }
        }
        Err(ClaimError::Contended(cluster.to_string()))
    }

    /// Deletes the record of a cluster this fleet owns and no longer publishes (its keys
    /// are gone). Only while leading.
    pub async fn forget(&self, cluster: &str) -> Result<(), ClaimError> {
        if !self.inner.leadership.leads() {
            return Err(ClaimError::NotLeading);
        }
        match self.read(cluster).await? {
            Some(r) if r.body.fleet != self.inner.fleet => return Ok(()),
            None => return Ok(()),
            Some(_) => {}
        }
        self.inner
            .bus
            .delete(Bucket::Meta, &keys::owner_key(cluster))
            .await
            .map_err(|source| ClaimError::Bus {
                cluster: cluster.to_string(),
                source,
            })
    }
}

/// Applies a `shoal-meta` entry to the table; returns whether it was an owner record or
/// a lease.
fn apply(table: &mut Table, default_ttl: Duration, entry: &shoal_common::bus::Entry) -> bool {
    match ownership::owner_change(entry) {
        OwnerChange::Set(cluster, record) => {
            let newer = table
                .owners
                .get(&cluster)
                .is_none_or(|known| known.revision < record.revision);
            if newer {
                table.owners.insert(cluster, record);
            }
            return true;
        }
        OwnerChange::Cleared(cluster) => {
            if table
                .owners
                .get(&cluster)
                .is_some_and(|known| known.revision < entry.revision)
            {
                table.owners.remove(&cluster);
            }
            return true;
        }
        OwnerChange::NotOwner => {}
    }
    let Some(fleet) = keys::parse_lease_key(&entry.key) else {
        return false;
    };
    if entry.op == shoal_common::bus::Op::Delete {
        table.leases.remove(&fleet);
        return true;
    }
    let body = lease::decode(&entry.value).ok().map(|env| env.body);
    let known = table.leases.get(&fleet);
    if known.is_some_and(|l| l.revision == entry.revision) {
        return false;
    }
    let ttl = body
        .as_ref()
        .filter(|b| b.ttl_ms > 0)
        .map(|b| Duration::from_millis(b.ttl_ms))
        .or(known.map(|l| l.ttl))
        .unwrap_or(default_ttl);
    table.leases.insert(
        fleet,
        SeenLease {
            body,
            revision: entry.revision,
            seen: Instant::now(),
            ttl,
        },
    );
    true
}

/// Follows `shoal-meta` for as long as the [`Owners`] exist; a broken watch is opened
/// again (its initial values replace the owner records, leases keep their observation
/// times).
async fn follow(inner: std::sync::Weak<Inner>) {
    loop {
        let Some(owners) = inner.upgrade().map(|inner| Owners { inner }) else {
            return;
        };
        let bus = owners.inner.bus.clone();
        let default_ttl = owners.inner.default_ttl;
        drop(owners);
        match bus.watch(Bucket::Meta).await {
            Ok(mut stream) => {
                let mut initial: Option<BTreeMap<String, OwnerRecord>> = Some(BTreeMap::new());
                while let Some(item) = stream.next().await {
                    let Some(inner) = inner.upgrade() else {
                        return;
                    };
                    let owners = Owners { inner };
                    match item {
                        Ok(WatchEvent::Entry(entry)) => {
                            if let Some(fresh) = initial.as_mut() {
                                match ownership::owner_change(&entry) {
                                    OwnerChange::Set(cluster, record) => {
                                        fresh.insert(cluster, record);
                                    }
                                    OwnerChange::Cleared(cluster) => {
                                        fresh.remove(&cluster);
                                    }
                                    OwnerChange::NotOwner => {
                                        apply(&mut owners.table(), default_ttl, &entry);
                                    }
                                }
                                continue;
                            }
                            if apply(&mut owners.table(), default_ttl, &entry) {
                                owners.inner.changes.send_modify(|n| *n += 1);
                            }
                        }
                        Ok(WatchEvent::InitialDone) => {
                            if let Some(fresh) = initial.take() {
                                let mut table = owners.table();
                                table.owners = fresh;
                                table.loaded = true;
                                debug!(
                                    owners = table.owners.len(),
                                    leases = table.leases.len(),
                                    "owner records loaded"
                                );
                            }
                            owners.inner.changes.send_modify(|n| *n += 1);
                        }
                        Err(error) => {
                            warn!(%error, "the watch of owner records broke; watching again");
                            break;
                        }
                    }
                }
            }
            Err(error) => warn!(%error, "cannot watch owner records; retrying"),
        }
        tokio::time::sleep(RECHECK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordination::lease::Term;
    use shoal_common::bus::Op;
    use shoal_common::MemoryBus;

    const TTL: Duration = Duration::from_secs(10);

    fn leading(epoch: u64) -> (watch::Sender<Term>, Leadership) {
        let (tx, rx) = watch::channel(Term {
            leading: true,
            epoch,
            until: Some(Instant::now() + Duration::from_secs(3600)),
        });
        (tx, Leadership::from_watch(rx))
    }

    async fn put_lease(bus: &MemoryBus, fleet: &str, ttl_ms: u64) {
        let body = LeaseBody {
            holder: format!("{fleet}-0"),
            epoch: 1,
            renewed_at_ms: now_ms(),
            ttl_ms,
            since_revision: 0,
        };
        bus.put(
            Bucket::Meta,
            &keys::lease_key(fleet),
            lease::encode(fleet, &body).unwrap().into(),
        )
        .await
        .unwrap();
    }

    async fn fleet(bus: &MemoryBus, name: &str) -> (Owners, watch::Sender<Term>) {
        let (tx, leadership) = leading(1);
        put_lease(bus, name, 10_000).await;
        let owners = Owners::start(Arc::new(bus.clone()), name, leadership, TTL);
        owners.loaded().await;
        (owners, tx)
    }

    async fn record(bus: &MemoryBus, cluster: &str) -> Option<OwnerBody> {
        let entry = bus
            .get(Bucket::Meta, &keys::owner_key(cluster))
            .await
            .unwrap()?;
        (entry.op == Op::Put).then(|| ownership::decode(&entry.value).unwrap().body)
    }

    /// Waits until the watch of `owners` has seen what the bus holds.
    async fn settle(owners: &Owners, cluster: &str, expect: Standing) {
        tokio::time::timeout(Duration::from_secs(5), async {
            let mut events = owners.events();
            while owners.standing(cluster) != expect {
                events.next().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{cluster}: {:?}, want {expect:?}", owners.standing(cluster)));
    }

    #[tokio::test]
    async fn claim_refuse_release_and_hand_over() {
        let bus = MemoryBus::new();
        let (a, _ta) = fleet(&bus, "a").await;
        let (b, _tb) = fleet(&bus, "b").await;

        a.claim("east").await.unwrap();
        assert_eq!(record(&bus, "east").await.unwrap().fleet, "a");
        assert_eq!(a.standing("east"), Standing::Mine);
        // A second claim of its own cluster writes nothing.
        let revision = bus
            .get(Bucket::Meta, "owner.east")
            .await
            .unwrap()
            .unwrap()
            .revision;
        a.claim("east").await.unwrap();
        let again = bus
            .get(Bucket::Meta, "owner.east")
            .await
            .unwrap()
            .unwrap()
            .revision;
        assert_eq!(revision, again);

        // b is refused while a's lease is current, and writes nothing.
        settle(&b, "east", Standing::Taken("a".into())).await;
        let err = b.claim("east").await.unwrap_err();
        assert!(
            matches!(&err, ClaimError::Refused { owner, .. } if owner == "a"),
            "{err}"
        );
        assert_eq!(record(&bus, "east").await.unwrap().fleet, "a");
        assert_eq!(b.other_live_fleets(), vec!["a".to_string()]);

        // a releases it: b may take it over; a may not take it for deletion any more.
        assert_eq!(a.release("east").await.unwrap(), Released::Released);
        let released = record(&bus, "east").await.unwrap();
        assert!(released.released && released.fleet == "a");
        settle(&b, "east", Standing::Free).await;
        b.claim("east").await.unwrap();
        assert_eq!(record(&bus, "east").await.unwrap().fleet, "b");
        assert!(!a.reclaim("east").await.unwrap());
        assert_eq!(
            a.release("east").await.unwrap(),
            Released::NotMine("b".into())
        );
        a.forget("east").await.unwrap();
        assert_eq!(record(&bus, "east").await.unwrap().fleet, "b");
    }

    #[tokio::test]
    async fn a_released_cluster_nobody_claims_is_reclaimed_and_forgotten() {
        let bus = MemoryBus::new();
        let (a, _ta) = fleet(&bus, "a").await;
        // Release without any record: created released.
        assert_eq!(a.release("west").await.unwrap(), Released::Released);
        assert!(record(&bus, "west").await.unwrap().released);
        assert!(a.reclaim("west").await.unwrap());
        assert!(!record(&bus, "west").await.unwrap().released);
        a.forget("west").await.unwrap();
        assert!(record(&bus, "west").await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_of_a_fleet_whose_lease_expired_is_taken_over() {
        let bus = MemoryBus::new();
        let (a, _ta) = fleet(&bus, "a").await;
        a.claim("east").await.unwrap();
        let (b, _tb) = fleet(&bus, "b").await;
        settle(&b, "east", Standing::Taken("a".into())).await;
        // a stops renewing. A released lease still counts for a ttl (its standby takes over).
        put_lease(&bus, "a", 0).await;
        tokio::time::sleep(TTL / 2).await;
        assert_eq!(b.standing("east"), Standing::Taken("a".into()));
        assert!(b.claim("east").await.is_err());
        tokio::time::sleep(TTL / 2 + Duration::from_millis(10)).await;
        assert_eq!(b.standing("east"), Standing::Abandoned("a".into()));
        assert!(b.other_live_fleets().is_empty());
        b.claim("east").await.unwrap();
        assert_eq!(record(&bus, "east").await.unwrap().fleet, "b");
        // a comes back: refused (b renews its lease meanwhile).
        put_lease(&bus, "b", 10_000).await;
        put_lease(&bus, "a", 10_000).await;
        settle(&a, "east", Standing::Taken("b".into())).await;
        assert!(matches!(
            a.claim("east").await,
            Err(ClaimError::Refused { .. })
        ));
    }

    #[tokio::test]
    async fn only_a_leader_writes_records() {
        let bus = MemoryBus::new();
        let (tx, leadership) = leading(1);
        let a = Owners::start(Arc::new(bus.clone()), "a", leadership, TTL);
        a.loaded().await;
        tx.send_replace(Term::standby());
        assert!(matches!(a.claim("east").await, Err(ClaimError::NotLeading)));
        assert!(matches!(
            a.release("east").await,
            Err(ClaimError::NotLeading)
        ));
        assert!(record(&bus, "east").await.is_none());
    }
}
