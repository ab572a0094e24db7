//! The write plan of a publish round: a pure function of the desired state, what the
//! publisher knows is on the bus, and the term's stamp. No bus is needed to compute or
//! test it; the publisher carries it out key by key while its term lasts.

use crate::desired::{DesiredState, StateKey, StateObject};
use crate::error::IngestError;
use sha2::{Digest, Sha256};
use shoal_common::bus::{Bucket, MAX_VALUE_BYTES};
use shoal_common::envelope::Envelope;
use std::collections::BTreeMap;
use tracing::debug;

/// What the publisher knows about one owned key on the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnBus {
    /// sha256 of the body, `None` when the value on the bus did not decode (or must be
    /// rewritten whatever its content).
    pub hash: Option<[u8; 32]>,
    /// The key's revision, for compare-and-set writes.
    pub revision: u64,
}

/// What every write of a round is stamped with.
#[derive(Debug, Clone, Copy)]
pub struct Stamp<'a> {
    /// The fleet writing.
    pub fleet: &'a str,
    /// The term's lease epoch (0 without a lease).
    pub epoch: u64,
    /// When the ingester saw the input, in ms since the Unix epoch.
    pub observed_at_ms: u64,
}

/// One write of a plan: a compare-and-set of `value` on `expected` (0: must be absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedWrite {
    /// The key.
    pub key: StateKey,
    /// The encoded envelope.
    pub value: Vec<u8>,
    /// sha256 of the body, recorded once written.
    pub hash: [u8; 32],
    /// The revision last seen for the key (0 when not on the bus).
    pub expected: u64,
}

/// What a round must do, in order: the writes (key order), then the deletes (reverse key
/// order: endpoints before their service, config last).
#[derive(Debug, Default)]
pub struct WritePlan {
    /// Changed or new values.
    pub writes: Vec<PlannedWrite>,
    /// Desired keys whose body is already on the bus.
    pub unchanged: u64,
    /// Owned keys on the bus, in scope, no longer desired.
    pub deletes: Vec<StateKey>,
    /// Desired keys that cannot be written (encoding failed, too large); their previous
    /// value stays.
    pub invalid: Vec<IngestError>,
}

/// The plan that makes the bus match `desired` (see [`WritePlan`]). `on_bus` holds the
/// owned keys on the bus; only those `in_scope` are swept.
pub fn plan(
    desired: &DesiredState,
    on_bus: &BTreeMap<StateKey, OnBus>,
    in_scope: &dyn Fn(&StateKey) -> bool,
    stamp: Stamp<'_>,
) -> WritePlan {
    let mut plan = WritePlan::default();
    for (key, object) in desired {
        match planned_write(key, object, on_bus.get(key).copied(), stamp) {
            Ok(Some(write)) => plan.writes.push(write),
            Ok(None) => plan.unchanged += 1,
            Err(error) => plan.invalid.push(error),
        }
    }
    plan.deletes = on_bus
        .keys()
        .rev()
        .filter(|k| !desired.contains_key(*k) && in_scope(k))
        .cloned()
        .collect();
    plan
}

/// The write of one key, `None` when its body is already on the bus.
fn planned_write(
    key: &StateKey,
    object: &StateObject,
    current: Option<OnBus>,
    stamp: Stamp<'_>,
) -> Result<Option<PlannedWrite>, IngestError> {
    let (bucket, name) = key;
    let encode_err = |source| IngestError::Encode {
        bucket: *bucket,
        key: name.clone(),
        source,
    };
    let body = object.encode_body().map_err(|e| encode_err(e.into()))?;
    let hash = sha256(&body);
    if current.and_then(|c| c.hash) == Some(hash) {
        return Ok(None);
    }
    let value = Envelope::new(stamp.fleet, stamp.epoch, stamp.observed_at_ms, object)
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
    Ok(Some(PlannedWrite {
        key: key.clone(),
        value,
        hash,
        expected: current.map_or(0, |c| c.revision),
    }))
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The body hash of a value on the bus, `None` when it does not decode.
pub(crate) fn body_hash(bucket: Bucket, key: &str, value: &[u8]) -> Option<[u8; 32]> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{desired, service};
    use shoal_common::model::Service;

    /// What is on the bus after `desired` was written, every key at `revision`.
    fn written(desired: &DesiredState, revision: u64) -> BTreeMap<StateKey, OnBus> {
        desired
            .iter()
            .map(|(key, object)| {
                let hash = Some(sha256(&object.encode_body().unwrap()));
                (key.clone(), OnBus { hash, revision })
            })
            .collect()
    }

    const STAMP: Stamp<'static> = Stamp {
        fleet: "fleet",
        epoch: 4,
        observed_at_ms: 7,
    };

    fn all(_: &StateKey) -> bool {
        true
    }

    #[test]
    fn an_empty_bus_gets_every_key_created() {
        let state = desired(&[("a", 80), ("b", 80)]);
        let plan = plan(&state, &BTreeMap::new(), &all, STAMP);
        assert_eq!(plan.writes.len(), 2);
        assert!(plan.writes.iter().all(|w| w.expected == 0));
        assert_eq!((plan.unchanged, plan.deletes.len()), (0, 0));
        let env: Envelope<Service> = Envelope::decode(&plan.writes[0].value).unwrap();
        assert_eq!(
            (env.fleet.as_str(), env.epoch, env.observed_at_ms),
            ("fleet", 4, 7)
        );
    }

    #[test]
    fn only_changed_bodies_are_written_on_the_revision_seen() {
        let on_bus = written(&desired(&[("a", 80), ("b", 80)]), 9);
        let plan = plan(&desired(&[("a", 80), ("b", 81)]), &on_bus, &all, STAMP);
        assert_eq!(plan.unchanged, 1);
        assert_eq!(plan.writes.len(), 1);
        assert_eq!(plan.writes[0].key.1, "c1.default.b");
        assert_eq!(plan.writes[0].expected, 9);
        assert!(plan.deletes.is_empty());
    }

    #[test]
    fn a_value_without_a_hash_is_rewritten_whatever_its_content() {
        let state = desired(&[("a", 80)]);
        let mut on_bus = written(&state, 3);
        on_bus.values_mut().for_each(|v| v.hash = None);
        let plan = plan(&state, &on_bus, &all, STAMP);
        assert_eq!((plan.writes.len(), plan.writes[0].expected), (1, 3));
    }

    #[test]
    fn deletes_are_in_scope_undesired_owned_keys_in_reverse_order() {
        let on_bus = written(&desired(&[("a", 80), ("b", 80), ("c", 80)]), 1);
        let plan = plan(&desired(&[("b", 80)]), &on_bus, &all, STAMP);
        let deleted: Vec<&str> = plan.deletes.iter().map(|k| k.1.as_str()).collect();
        assert_eq!(deleted, ["c1.default.c", "c1.default.a"]);
        let only_a = |k: &StateKey| k.1.ends_with(".a");
        let scoped = super::plan(&DesiredState::new(), &on_bus, &only_a, STAMP);
        assert_eq!(scoped.deletes.len(), 1);
        assert_eq!(scoped.deletes[0].1, "c1.default.a");
    }

    #[test]
    fn a_value_over_the_limit_is_invalid_and_others_proceed() {
        let mut state = desired(&[("small", 80)]);
        let (key, mut big) = service("c1", "big", 80);
        if let StateObject::Service(s) = &mut big {
            s.meta
                .labels
                .insert("blob".into(), "x".repeat(MAX_VALUE_BYTES));
        }
        state.insert(key, big);
        let plan = plan(&state, &BTreeMap::new(), &all, STAMP);
        assert_eq!(plan.writes.len(), 1);
        assert!(matches!(
            plan.invalid.as_slice(),
            [IngestError::TooLarge { .. }]
        ));
    }
}
