//! The live watch a leader keeps on its owned buckets, and what another writer's change
//! means to it: a deposed leader's write or someone's delete is put right at once (the
//! next round rewrites the key), a newer epoch means another replica leads.

use super::plan::{body_hash, OnBus};
use super::Ownership;
use crate::desired::StateKey;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use serde::de::IgnoredAny;
use shoal_common::bus::{Bucket, BusError, Entry, Op, WatchEvent};
use shoal_common::envelope::Envelope;
use shoal_common::lease::{epoch_jump, fenced};
use std::collections::{BTreeMap, BTreeSet};
use tracing::warn;

/// The watch of the owned buckets kept while leading an elected term, tagged by bucket.
pub(super) type LiveWatch = BoxStream<'static, (Bucket, Result<WatchEvent, BusError>)>;

/// What a publisher knows about its owned keys on the bus.
pub(super) type OnBusMap = BTreeMap<StateKey, OnBus>;

/// What an item of the live watch asks of the publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Live {
    /// Nothing to do (own write, a key not owned, nothing new).
    Quiet,
    /// Another writer changed an owned key: a full round puts it right.
    Round,
    /// The watch broke or ended: the bus must be read again.
    Broken,
}

/// The live-watch repair of one publisher (see the module docs).
pub(super) struct Repair {
    fleet: String,
    /// For logs.
    owner: String,
    /// The watch of the owned buckets, while leading an elected term.
    live: Option<LiveWatch>,
    /// Keys the publisher deleted whose delete the live watch has not delivered yet.
    own_deletes: BTreeSet<StateKey>,
    /// An owned key carries an epoch newer than this term's: another replica leads, so
    /// nothing more is written in this term.
    superseded: Option<u64>,
    /// Another fleet wrote an owned key since [`Repair::take_foreign_fleet`].
    foreign_fleet: bool,
}

impl Repair {
    pub(super) fn new(fleet: String, owner: String) -> Repair {
        Repair {
            fleet,
            owner,
            live: None,
            own_deletes: BTreeSet::new(),
            superseded: None,
            foreign_fleet: false,
        }
    }

    /// Forgets the watch and what it saw, before the bus is read again.
    pub(super) fn reset(&mut self) {
        self.live = None;
        self.own_deletes.clear();
        self.superseded = None;
    }

    /// Drops the watch (its term is over, or it broke).
    pub(super) fn stop(&mut self) {
        self.live = None;
    }

    /// Keeps `watch` (whose initial values have been read) to follow live changes.
    pub(super) fn follow(&mut self, watch: LiveWatch) {
        self.live = Some(watch);
    }

    /// The newer epoch another replica writes with, if one was seen in this term.
    pub(super) fn superseded(&self) -> Option<u64> {
        self.superseded
    }

    /// Whether another fleet wrote an owned key since the last call, and resets it.
    pub(super) fn take_foreign_fleet(&mut self) -> bool {
        std::mem::take(&mut self.foreign_fleet)
    }

    /// Records the publisher's own delete, so that the watch delivering it is no news.
    pub(super) fn deleted(&mut self, key: StateKey) {
        if self.live.is_some() {
            self.own_deletes.insert(key);
        }
    }

    /// The next item of the live watch; never resolves without one. Cancel-safe.
    pub(super) async fn next(&mut self) -> Option<(Bucket, Result<WatchEvent, BusError>)> {
        match self.live.as_mut() {
            Some(live) => live.next().await,
            None => std::future::pending().await,
        }
    }

    /// Handles what the live watch has delivered so far; returns whether a round is
    /// needed and whether the watch broke.
    pub(super) fn drain(
        &mut self,
        on_bus: &mut OnBusMap,
        ownership: &Ownership,
        epoch: u64,
        elected: bool,
    ) -> Live {
        let mut outcome = Live::Quiet;
        while let Some(live) = self.live.as_mut() {
            let Some(item) = live.next().now_or_never() else {
                break;
            };
            match self.on_item(on_bus, ownership, item, epoch, elected) {
                Live::Quiet => {}
                Live::Round => outcome = Live::Round,
                Live::Broken => return Live::Broken,
            }
        }
        outcome
    }

    /// Handles an item of the live watch.
    pub(super) fn on_item(
        &mut self,
        on_bus: &mut OnBusMap,
        ownership: &Ownership,
        item: Option<(Bucket, Result<WatchEvent, BusError>)>,
        epoch: u64,
        elected: bool,
    ) -> Live {
        match item {
            Some((bucket, Ok(WatchEvent::Entry(entry)))) => {
                match self.record(on_bus, ownership, bucket, entry, epoch, elected) {
                    true => Live::Round,
                    false => Live::Quiet,
                }
            }
            Some((_, Ok(WatchEvent::InitialDone))) => Live::Quiet,
            Some((bucket, Err(error))) => {
                warn!(%bucket, %error, owner = %self.owner, "the watch of owned keys broke; reading the bus again");
                self.live = None;
                Live::Broken
            }
            None => {
                warn!(owner = %self.owner, "the watch of owned keys ended; reading the bus again");
                self.live = None;
                Live::Broken
            }
        }
    }

    /// A live change of a key; returns whether it needs a publish round: another writer
    /// changed an owned key.
    pub(super) fn record(
        &mut self,
        on_bus: &mut OnBusMap,
        ownership: &Ownership,
        bucket: Bucket,
        entry: Entry,
        epoch: u64,
        elected: bool,
    ) -> bool {
        if !ownership.owns(bucket, &entry.key) {
            return false;
        }
        let key = (bucket, entry.key.clone());
        // The publisher's own write (it knows the revision), or older than what it knows.
        if on_bus
            .get(&key)
            .is_some_and(|known| entry.revision <= known.revision)
        {
            return false;
        }
        match entry.op {
            Op::Delete => {
                if self.own_deletes.remove(&key) || on_bus.remove(&key).is_none() {
                    return false;
                }
                warn!(
                    %bucket,
                    key = %key.1,
                    fleet = %self.fleet,
                    epoch,
                    "an owned key was deleted by another writer; publishing it again"
                );
                true
            }
            Op::Put => {
                self.own_deletes.remove(&key);
                let judged = self.judge(bucket, &key.1, &entry, epoch, elected);
                on_bus.insert(key, judged);
                true
            }
        }
    }

    /// What another writer's value means to the publisher in a term of `epoch`. Under an
    /// elected leadership, a value from an older epoch is a deposed leader's write and is
    /// replaced whatever its content (it gets no hash); one from a newer epoch means
    /// another replica leads now.
    pub(super) fn judge(
        &mut self,
        bucket: Bucket,
        key: &str,
        entry: &Entry,
        epoch: u64,
        elected: bool,
    ) -> OnBus {
        let revision = entry.revision;
        let head = Envelope::<IgnoredAny>::decode(&entry.value).ok();
        let written = head.as_ref().map(|h| (h.fleet.as_str(), h.epoch));
        match written {
            // Epochs are per fleet: another fleet's write is not compared with this term.
            Some((fleet, written)) if fleet != self.fleet => {
                if !self.foreign_fleet {
                    warn!(
                        %bucket,
                        key,
                        %fleet,
                        epoch = written,
                        own_fleet = %self.fleet,
                        "an owned key was written by another fleet"
                    );
                }
                self.foreign_fleet = true;
                OnBus {
                    hash: None,
                    revision,
                }
            }
            Some((fleet, written)) if elected && fenced(written, Some(epoch)) => {
                warn!(
                    %bucket,
                    key,
                    %fleet,
                    epoch = written,
                    leader_epoch = epoch,
                    "an owned key was written by a deposed leader; publishing this leader's value again"
                );
                OnBus {
                    hash: None,
                    revision,
                }
            }
            // No replica leads with an epoch that far ahead: forged or corrupt, replaced
            // like a deposed leader's write (servers refuse it too).
            Some((fleet, written)) if elected && epoch_jump(Some(epoch), written) => {
                warn!(
                    %bucket,
                    key,
                    %fleet,
                    epoch = written,
                    leader_epoch = epoch,
                    "an owned key carries an implausible epoch (forged or corrupt); \
                     publishing this leader's value again"
                );
                OnBus {
                    hash: None,
                    revision,
                }
            }
            Some((fleet, written)) if elected && written > epoch => {
                if self.superseded.is_none() {
                    warn!(
                        %bucket,
                        key,
                        %fleet,
                        epoch = written,
                        leader_epoch = epoch,
                        "an owned key was written with a newer epoch: another replica leads; \
                         writing nothing more in this term"
                    );
                }
                self.superseded = Some(written);
                OnBus {
                    hash: body_hash(bucket, key, &entry.value),
                    revision,
                }
            }
            _ => OnBus {
                hash: body_hash(bucket, key, &entry.value),
                revision,
            },
        }
    }
}
