//! A fleet's sync marker: the key `synced.<fleet>` in `shoal-meta`
//! ([`crate::keys::synced_key`]) says that the fleet's ingester has published every one of
//! its clusters once (its readiness: each cluster synced, or a remote cluster's
//! `--remote-cluster-timeout` passed). Servers started with `--expect-fleets` stay unready
//! until every expected fleet has one, so a fresh install never serves an empty or partial
//! mesh. Written once per fleet (an ingester that finds it already there writes nothing).

use crate::envelope::{Envelope, EnvelopeError};
use serde::{Deserialize, Serialize};

/// The value of a fleet's sync marker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncedBody {
    /// The fleet.
    pub fleet: String,
    /// When the fleet first became synced, in ms since the Unix epoch (the writer's clock).
    pub since_ms: u64,
}

/// Encodes a sync marker, written by its own fleet with that fleet's lease epoch.
pub fn encode(epoch: u64, body: &SyncedBody) -> Result<Vec<u8>, EnvelopeError> {
    Envelope::new(body.fleet.as_str(), epoch, body.since_ms, body).encode()
}

/// Decodes the value of a sync marker.
pub fn decode(value: &[u8]) -> Result<Envelope<SyncedBody>, EnvelopeError> {
    Envelope::decode(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{parse_synced_key, synced_key};

    #[test]
    fn round_trips() {
        let body = SyncedBody {
            fleet: "east".into(),
            since_ms: 7,
        };
        let env = decode(&encode(3, &body).expect("encodes")).expect("decodes");
        assert_eq!((env.fleet.as_str(), env.epoch, env.body), ("east", 3, body));
        assert_eq!(
            parse_synced_key(&synced_key("east")).as_deref(),
            Some("east")
        );
        assert_eq!(parse_synced_key("lease.east"), None);
    }
}
