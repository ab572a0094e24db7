//! The ingester lease of a fleet and fencing by its epoch.
//!
//! Replicas of one ingester fleet elect a leader through one key in `shoal-meta`:
//! `lease.<fleet>` ([`crate::keys::lease_key`]), an [`Envelope`] whose body is a
//! [`LeaseBody`]. It is only ever written with compare-and-set on its revision, and every
//! acquisition increments its `epoch`. The leader stamps that epoch into every envelope it
//! writes, so a reader that knows a fleet's current epoch can refuse the writes of a deposed
//! leader: [`fenced`]. [`FleetEpochs`] tracks the current epoch of every fleet from the
//! lease keys, for the servers and the ingester alike.
//!
//! **Epoch jumps.** A legitimate lease only ever goes up by one per acquisition: a replica
//! takes the lease with one more than the highest epoch it has seen, with compare-and-set
//! over the lease it read. A reader that follows the lease therefore sees +1 steps, or a
//! few at once when it missed some (a watch that was down across several takeovers). An
//! epoch far above the last one seen ([`epoch_jump`], more than [`MAX_EPOCH_STEP`]) is not
//! a takeover but a forged or corrupt lease: obeyed, it would fence every real write from
//! then on (an epoch of 2^62 is never reached again by +1 steps). Readers refuse it and
//! keep the epoch they knew.

use crate::bus::{Entry, Op};
use crate::envelope::{Envelope, EnvelopeError};
use crate::keys;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The value of a fleet's lease key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseBody {
    /// The instance ID of the ingester holding the lease.
    pub holder: String,
    /// The lease generation: incremented by every acquisition, never by a renewal.
    pub epoch: u64,
    /// When the holder last renewed the lease, in ms since the Unix epoch (its clock).
    pub renewed_at_ms: u64,
    /// How long after a renewal the lease stays valid; 0 means released.
    pub ttl_ms: u64,
    /// The revision the lease key had when this term took it (the compare-and-set
    /// expectation of the acquisition; 0: the key was absent). Everything written in this
    /// term to `shoal-meta`, the lease's own bucket, has a higher revision, so a record
    /// there with a lower revision and an older epoch is an earlier leader's, and one with
    /// a higher revision must carry this epoch. 0 in leases of older builds.
    #[serde(default)]
    pub since_revision: u64,
}

impl LeaseBody {
    /// Whether the lease has expired at `now_ms` by the wall clock: more than `ttl_ms`
    /// since the last renewal. Clocks of different hosts differ, so the elector uses this
    /// only with an allowance for skew (and otherwise measures expiry on its own clock).
    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.renewed_at_ms) > self.ttl_ms
    }

    /// Whether the holder gave the lease up (on shutdown): anyone may take it at once.
    pub fn is_released(&self) -> bool {
        self.ttl_ms == 0
    }
}

/// Encodes a lease as the value of its key: an envelope of `fleet` stamped with the
/// lease's own epoch and renewal time.
pub fn encode(fleet: &str, body: &LeaseBody) -> Result<Vec<u8>, EnvelopeError> {
    Envelope::new(fleet, body.epoch, body.renewed_at_ms, body).encode()
}

/// Decodes the value of a lease key.
pub fn decode(value: &[u8]) -> Result<Envelope<LeaseBody>, EnvelopeError> {
    Envelope::decode(value)
}

/// Whether a write stamped `entry_epoch` must be refused, given the current lease epoch
/// of its fleet (`None`: the fleet has no lease, so nothing is fenced). A write from an
/// earlier epoch comes from a leader that has been deposed. Epoch 0 (the file source and
/// standalone mode, which run without a lease) is therefore accepted only for a fleet
/// without a lease.
pub fn fenced(entry_epoch: u64, fleet_epoch: Option<u64>) -> bool {
    fleet_epoch.is_some_and(|current| entry_epoch < current)
}

/// The largest rise of a fleet's lease epoch between two observations that readers accept
/// (see the module docs). Each takeover adds one, so a thousand takeovers between two looks
/// at the lease — a watch down for hours while the fleet's replicas crash-looped — stay
/// within it, and a forged epoch (2^62) does not.
pub const MAX_EPOCH_STEP: u64 = 1000;

/// Whether a lease epoch of `seen` is an implausible jump from the epoch `known` last seen
/// (`None`: nothing seen yet, so nothing to compare with). A lower epoch is no jump: a
/// lease re-created after a data loss starts again from 1.
pub fn epoch_jump(known: Option<u64>, seen: u64) -> bool {
    known.is_some_and(|known| seen > known.saturating_add(MAX_EPOCH_STEP))
}

/// A lease key whose value cannot be used; the previously known epoch stays.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The value is not a lease envelope.
    #[error("lease {key}: {source}")]
    Payload {
        /// The key.
        key: String,
        /// The cause.
        #[source]
        source: EnvelopeError,
    },
    /// The envelope's fleet is not the fleet the key names.
    #[error("lease {key}: the value is the lease of fleet {found:?}")]
    Mismatch {
        /// The key.
        key: String,
        /// The fleet in the envelope.
        found: String,
    },
    /// The lease's epoch is an implausible jump from the one known ([`epoch_jump`]).
    #[error(
        "lease {key}: epoch {found} is more than {MAX_EPOCH_STEP} above the known epoch \
         {known} (forged or corrupt; refused, epoch {known} stays)"
    )]
    EpochJump {
        /// The key.
        key: String,
        /// The epoch known before.
        known: u64,
        /// The epoch in the lease.
        found: u64,
    },
}

/// The current lease epoch of every fleet, from the `lease.*` keys of `shoal-meta`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FleetEpochs {
    /// By fleet: the lease's epoch and [`LeaseBody::since_revision`].
    epochs: BTreeMap<String, (u64, u64)>,
}

impl FleetEpochs {
    /// Applies a `shoal-meta` entry: a lease put records its fleet's epoch (unless it is an
    /// [`epoch_jump`] from the known one), a lease delete forgets the fleet. Returns whether
    /// the key is a lease key (other keys are ignored).
    pub fn apply(&mut self, entry: &Entry) -> Result<bool, LeaseError> {
        let Some(fleet) = keys::parse_lease_key(&entry.key) else {
            return Ok(false);
        };
        if entry.op == Op::Delete {
            self.epochs.remove(&fleet);
            return Ok(true);
        }
        let env = decode(&entry.value).map_err(|source| LeaseError::Payload {
            key: entry.key.clone(),
            source,
        })?;
        if env.fleet != fleet {
            return Err(LeaseError::Mismatch {
                key: entry.key.clone(),
                found: env.fleet,
            });
        }
        let known = self.epoch(&fleet);
        if epoch_jump(known, env.body.epoch) {
            return Err(LeaseError::EpochJump {
                key: entry.key.clone(),
                known: known.unwrap_or_default(),
                found: env.body.epoch,
            });
        }
        self.epochs
            .insert(fleet, (env.body.epoch, env.body.since_revision));
        Ok(true)
    }

    /// The current epoch of a fleet, `None` when it has no lease.
    pub fn epoch(&self, fleet: &str) -> Option<u64> {
        self.epochs.get(fleet).map(|(epoch, _)| *epoch)
    }

    /// The `shoal-meta` revision the fleet's current term started after
    /// ([`LeaseBody::since_revision`]), `None` when it has no lease.
    pub fn term_start(&self, fleet: &str) -> Option<u64> {
        self.epochs.get(fleet).map(|(_, since)| *since)
    }

    /// Whether a write of `fleet` stamped `epoch` must be refused ([`fenced`]).
    pub fn fences(&self, fleet: &str, epoch: u64) -> bool {
        fenced(epoch, self.epoch(fleet))
    }

    /// The lease keys of the fleets known, in the bus's key format (for resyncs).
    pub fn keys(&self) -> Vec<String> {
        self.epochs.keys().map(|f| keys::lease_key(f)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(epoch: u64) -> LeaseBody {
        LeaseBody {
            holder: "ingester-0".into(),
            epoch,
            renewed_at_ms: 10_000,
            ttl_ms: 10_000,
            since_revision: 0,
        }
    }

    fn put(key: &str, fleet: &str, lease: &LeaseBody) -> Entry {
        Entry {
            key: key.into(),
            value: encode(fleet, lease).unwrap().into(),
            revision: 1,
            op: Op::Put,
        }
    }

    #[test]
    fn fencing_by_epoch() {
        // No lease: every epoch is accepted, including the file source's 0.
        assert!(!fenced(0, None));
        assert!(!fenced(7, None));
        // A lease: older epochs (and 0) are refused; the current and newer ones are not.
        assert!(fenced(0, Some(1)));
        assert!(fenced(2, Some(3)));
        assert!(!fenced(3, Some(3)));
        assert!(!fenced(4, Some(3)));
    }

    #[test]
    fn epoch_jumps() {
        assert!(
            !epoch_jump(None, u64::MAX),
            "nothing known: nothing to compare"
        );
        assert!(!epoch_jump(Some(5), 6));
        assert!(!epoch_jump(Some(5), 5 + MAX_EPOCH_STEP));
        assert!(epoch_jump(Some(5), 6 + MAX_EPOCH_STEP));
        assert!(epoch_jump(Some(5), 1 << 62));
        assert!(!epoch_jump(Some(5), 1), "a lease re-created after a loss");
        assert!(!epoch_jump(Some(u64::MAX), u64::MAX));
    }

    #[test]
    fn a_forged_epoch_jump_is_refused_and_the_known_epoch_stays() {
        let mut epochs = FleetEpochs::default();
        let key = keys::lease_key("f");
        // The first lease seen is the baseline, whatever its epoch.
        epochs.apply(&put(&key, "f", &body(7))).unwrap();
        assert!(matches!(
            epochs.apply(&put(&key, "f", &body(1 << 62))),
            Err(LeaseError::EpochJump { known: 7, found, .. }) if found == 1 << 62
        ));
        assert_eq!(epochs.epoch("f"), Some(7));
        // The real holder renews: fine; the next takeover: fine.
        epochs.apply(&put(&key, "f", &body(7))).unwrap();
        epochs.apply(&put(&key, "f", &body(8))).unwrap();
        assert_eq!(epochs.epoch("f"), Some(8));
    }

    #[test]
    fn expiry_and_release() {
        let lease = body(1);
        assert!(!lease.is_expired(10_000));
        assert!(!lease.is_expired(20_000));
        assert!(lease.is_expired(20_001));
        // A clock behind the holder's never sees it expired early.
        assert!(!lease.is_expired(0));
        assert!(!lease.is_released());
        assert!(LeaseBody { ttl_ms: 0, ..lease }.is_released());
    }

    #[test]
    fn round_trip() {
        let lease = body(3);
        let env = decode(&encode("east", &lease).unwrap()).unwrap();
        assert_eq!(
            (env.fleet.as_str(), env.epoch, env.body),
            ("east", 3, lease)
        );
    }

    #[test]
    fn fleet_epochs_follow_lease_keys() {
        let mut epochs = FleetEpochs::default();
        let key = keys::lease_key("east.1");
        assert!(epochs.apply(&put(&key, "east.1", &body(2))).unwrap());
        assert_eq!(epochs.epoch("east.1"), Some(2));
        assert!(epochs.fences("east.1", 1));
        assert!(!epochs.fences("east.1", 2));
        assert!(!epochs.fences("west", 0), "a fleet without a lease");
        assert_eq!(epochs.keys(), vec![key.clone()]);

        // Other meta keys are not leases, whatever their value.
        let status = Entry {
            key: "cluster.east".into(),
            value: "anything".into(),
            revision: 2,
            op: Op::Put,
        };
        assert!(!epochs.apply(&status).unwrap());

        // Garbage and a value of another fleet are errors that keep the known epoch.
        let garbage = Entry {
            value: "junk".into(),
            ..put(&key, "east.1", &body(9))
        };
        assert!(matches!(
            epochs.apply(&garbage),
            Err(LeaseError::Payload { .. })
        ));
        assert!(matches!(
            epochs.apply(&put(&key, "west", &body(9))),
            Err(LeaseError::Mismatch { .. })
        ));
        assert_eq!(epochs.epoch("east.1"), Some(2));

        let delete = Entry {
            value: Default::default(),
            op: Op::Delete,
            ..put(&key, "east.1", &body(2))
        };
        assert!(epochs.apply(&delete).unwrap());
        assert_eq!(epochs.epoch("east.1"), None);
    }
}
