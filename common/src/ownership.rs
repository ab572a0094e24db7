//! Which fleet publishes a cluster: one owner record per cluster ID in `shoal-meta`.
//!
//! The key `owner.<cluster>` ([`crate::keys::owner_key`]) holds an [`Envelope`] whose body
//! is an [`OwnerBody`]. Only the fleet it names writes a cluster's services, endpoints and
//! status; another fleet that is assigned the same cluster refuses to publish it while
//! that owner's lease is current. The record is only written with compare-and-set on its
//! revision, so two fleets can never both take a cluster. The protocol (claim, release,
//! handover, takeover from a dead fleet) is in docs/ingester.md and the ingester's
//! `ownership` module.

use crate::bus::{Entry, Op};
use crate::envelope::{Envelope, EnvelopeError};
use crate::keys;
use serde::{Deserialize, Serialize};

/// The value of a cluster's owner key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerBody {
    /// The cluster ID.
    pub cluster: String,
    /// The fleet that owns (or last owned) the cluster.
    pub fleet: String,
    /// The owner stopped publishing the cluster and left its keys for another fleet to
    /// take over: any fleet may claim it.
    pub released: bool,
    /// When the record took this value, in ms since the Unix epoch (the writer's clock).
    pub since_ms: u64,
}

/// Encodes an owner record, written by its own fleet with that fleet's lease epoch.
pub fn encode(epoch: u64, body: &OwnerBody) -> Result<Vec<u8>, EnvelopeError> {
    Envelope::new(body.fleet.as_str(), epoch, body.since_ms, body).encode()
}

/// Decodes the value of an owner key.
pub fn decode(value: &[u8]) -> Result<Envelope<OwnerBody>, EnvelopeError> {
    Envelope::decode(value)
}

/// An owner record as read from the bus, with its revision (for compare-and-set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    /// The record.
    pub body: OwnerBody,
    /// The revision of the owner key.
    pub revision: u64,
}

/// What a `shoal-meta` entry says about cluster ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerChange {
    /// The entry is not an owner key.
    NotOwner,
    /// The owner record of a cluster now holds this value.
    Set(String, OwnerRecord),
    /// The owner record of a cluster is gone (or unreadable: treated as absent, so the next
    /// claim rewrites it).
    Cleared(String),
}

/// Reads a `shoal-meta` entry as an owner record change.
pub fn owner_change(entry: &Entry) -> OwnerChange {
    let Some(cluster) = keys::parse_owner_key(&entry.key) else {
        return OwnerChange::NotOwner;
    };
    if entry.op == Op::Delete {
        return OwnerChange::Cleared(cluster);
    }
    match decode(&entry.value) {
        Ok(env) if env.body.cluster == cluster => OwnerChange::Set(
            cluster,
            OwnerRecord {
                body: env.body,
                revision: entry.revision,
            },
        ),
        _ => OwnerChange::Cleared(cluster),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(fleet: &str, released: bool) -> OwnerBody {
        OwnerBody {
            cluster: "east.1".into(),
            fleet: fleet.into(),
            released,
            since_ms: 5,
        }
    }

    fn entry(key: &str, value: Vec<u8>, op: Op) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
            revision: 7,
            op,
        }
    }

    #[test]
    fn round_trip_and_changes() {
        let b = body("edge", false);
        let env = decode(&encode(3, &b).unwrap()).unwrap();
        assert_eq!((env.fleet.as_str(), env.epoch, &env.body), ("edge", 3, &b));

        let key = keys::owner_key("east.1");
        let set = owner_change(&entry(&key, encode(3, &b).unwrap(), Op::Put));
        assert_eq!(
            set,
            OwnerChange::Set(
                "east.1".into(),
                OwnerRecord {
                    body: b,
                    revision: 7
                }
            )
        );
        assert_eq!(
            owner_change(&entry(&key, vec![], Op::Delete)),
            OwnerChange::Cleared("east.1".into())
        );
        assert_eq!(
            owner_change(&entry(&key, b"junk".to_vec(), Op::Put)),
            OwnerChange::Cleared("east.1".into())
        );
        // A record whose body names another cluster is not this cluster's.
        let other = OwnerBody {
            cluster: "west".into(),
            ..body("edge", true)
        };
        assert_eq!(
            owner_change(&entry(&key, encode(1, &other).unwrap(), Op::Put)),
            OwnerChange::Cleared("east.1".into())
        );
        assert_eq!(
            owner_change(&entry("lease.edge", vec![], Op::Put)),
            OwnerChange::NotOwner
        );
    }
}
