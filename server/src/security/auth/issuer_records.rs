//! Following the token issuer records (`issuer.<cluster>` in `shoal-meta`), fenced by the
//! lease of the fleet that wrote them.
//!
//! An issuer record decides whose tokens a server accepts, so a record nobody entitled
//! wrote would let its writer mint tokens for any identity. Like every other bus value, a
//! record carries its writer's fleet and lease epoch, and the server accepts it only from
//! the fleet's current lease:
//!
//! - **Live**, a record must carry exactly its fleet's current lease epoch. The lease and
//!   the records share the `shoal-meta` stream, so the lease of a term is always seen
//!   before the records written in it: an older epoch is a deposed leader's (or a replay of
//!   one), a newer one a lease this server never saw (or refused as an
//!   [`shoal_common::lease::epoch_jump`]).
//! - **Replayed** (a watch's initial values), a record may carry an older epoch only if
//!   it was written before the current term started (an earlier leader wrote it and
//!   nobody changed it since): its revision is below the lease's `since_revision`
//!   ([`shoal_common::lease::LeaseBody::since_revision`]). One written during the term
//!   with an older epoch is a deposed leader's or forged, and a newer epoch is never
//!   current.
//! - Its fleet must have a lease at all: only `kube` ingesters publish issuers, and they
//!   always run under one.
//!
//! Deletes carry no epoch and are applied as they come, as for the other buckets.

use super::{IssuerError, IssuerKeys, Issuers};
use crate::security::metrics::{IssuerRefusalReason, SecurityMetrics};
use futures::StreamExt;
use shoal_common::bus::Bucket;
use shoal_common::bus::{Entry, Op, StateBus, WatchEvent};
use shoal_common::envelope::Envelope;
use shoal_common::keys;
use shoal_common::lease::FleetEpochs;
use shoal_common::model::ClusterIssuer;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Why an issuer record was not loaded (the cluster's previous keys, if any, stay).
#[derive(Debug, thiserror::Error)]
pub enum IssuerRefusal {
    /// Not written under its fleet's current lease epoch.
    #[error(
        "written by fleet {fleet:?} at epoch {epoch}, but the fleet's lease is at epoch \
         {lease} (a deposed leader's or a forged record)"
    )]
    Fenced {
        /// The fleet in the record's envelope.
        fleet: String,
        /// The epoch in the record's envelope.
        epoch: u64,
        /// The fleet's lease epoch.
        lease: u64,
    },
    /// Its fleet has no lease, so no leader wrote it.
    #[error("written by fleet {fleet:?} at epoch {epoch}, which has no lease (a forged record)")]
    Unleased {
        /// The fleet in the record's envelope.
        fleet: String,
        /// The epoch in the record's envelope.
        epoch: u64,
    },
    /// The record is unusable.
    #[error(transparent)]
    Invalid(#[from] IssuerError),
}

impl IssuerRefusal {
    /// The metric label (`shoal_token_issuers_refused_total{reason}`).
    pub fn reason(&self) -> IssuerRefusalReason {
        match self {
            IssuerRefusal::Fenced { .. } => IssuerRefusalReason::Fenced,
            IssuerRefusal::Unleased { .. } => IssuerRefusalReason::Unleased,
            IssuerRefusal::Invalid(_) => IssuerRefusalReason::Invalid,
        }
    }
}

/// A decoded issuer record and who wrote it.
struct Record {
    fleet: String,
    epoch: u64,
    /// Its revision in `shoal-meta`.
    revision: u64,
    keys: Arc<IssuerKeys>,
}

/// What one entry of `shoal-meta` does to the issuers.
enum Step {
    /// Nothing (another key, or part of a replay).
    None,
    /// Load these keys for the cluster.
    Set(String, Arc<IssuerKeys>),
    /// Forget the cluster's keys.
    Remove(String),
    /// The record is refused.
    Refused(String, IssuerRefusal),
}

/// The issuer records of `shoal-meta` as one watch delivers them, with the fleets' lease
/// epochs from the same watch (see the module docs).
#[derive(Default)]
struct IssuerRecords {
    /// The lease epoch of each fleet; kept across re-watches, so a replay's lease is
    /// compared with the epoch known before ([`shoal_common::lease::epoch_jump`]).
    fleets: FleetEpochs,
    /// While a watch replays: the records seen so far, judged once the replay is complete.
    replay: Option<BTreeMap<String, Record>>,
}

impl IssuerRecords {
    /// A watch (re)starts: its initial values follow.
    fn restart(&mut self) {
        self.replay = Some(BTreeMap::new());
    }

    fn entry(&mut self, entry: &Entry) -> Step {
        match self.fleets.apply(entry) {
            Ok(true) => return Step::None,
            Ok(false) => {}
            // The state pipeline, which watches the same bucket, reports bad leases.
            Err(error) => {
                tracing::debug!(%error, "lease not used for fencing token issuers");
                return Step::None;
            }
        }
        let Some(cluster) = keys::parse_issuer_key(&entry.key) else {
            return Step::None;
        };
        let record = match entry.op {
            Op::Delete => None,
            Op::Put => match decode(&cluster, entry) {
                Ok(record) => Some(record),
                Err(error) => return Step::Refused(cluster, error.into()),
            },
        };
        if let Some(replay) = self.replay.as_mut() {
            match record {
                Some(record) => replay.insert(cluster, record),
                None => replay.remove(&cluster),
            };
            return Step::None;
        }
        let Some(record) = record else {
            return Step::Remove(cluster);
        };
        match self.fleets.epoch(&record.fleet) {
            Some(lease) if lease == record.epoch => Step::Set(cluster, record.keys),
            Some(lease) => Step::Refused(
                cluster,
                IssuerRefusal::Fenced {
                    fleet: record.fleet,
                    epoch: record.epoch,
                    lease,
                },
            ),
            None => Step::Refused(
                cluster,
                IssuerRefusal::Unleased {
                    fleet: record.fleet,
                    epoch: record.epoch,
                },
            ),
        }
    }

    /// The replay is complete: every issuer it holds that its fleet's lease admits, and
    /// the refused ones. `None` when no replay was under way.
    #[allow(clippy::type_complexity)]
    fn initial_done(
        &mut self,
    ) -> Option<(
        BTreeMap<String, Arc<IssuerKeys>>,
        Vec<(String, IssuerRefusal)>,
    )> {
        let replay = self.replay.take()?;
        let mut admitted = BTreeMap::new();
        let mut refused = Vec::new();
        for (cluster, record) in replay {
            let lease = self.fleets.epoch(&record.fleet);
            let term_start = self.fleets.term_start(&record.fleet).unwrap_or(0);
            match lease {
                Some(lease) if record.epoch == lease => {
                    admitted.insert(cluster, record.keys);
                }
                // An earlier leader's record, unchanged since the term started, is current.
                Some(lease) if record.epoch < lease && record.revision < term_start => {
                    admitted.insert(cluster, record.keys);
                }
                Some(lease) => refused.push((
                    cluster,
                    IssuerRefusal::Fenced {
                        fleet: record.fleet,
                        epoch: record.epoch,
                        lease,
                    },
                )),
                None => refused.push((
                    cluster,
                    IssuerRefusal::Unleased {
                        fleet: record.fleet,
                        epoch: record.epoch,
                    },
                )),
            }
        }
        Some((admitted, refused))
    }
}

fn decode(cluster: &str, entry: &Entry) -> Result<Record, IssuerError> {
    let env = Envelope::<ClusterIssuer>::decode(&entry.value)
        .map_err(|e| IssuerError::Decode(e.to_string()))?;
    if env.body.cluster != cluster {
        return Err(IssuerError::Decode(format!(
            "the record is cluster {:?}'s, not {cluster:?}'s",
            env.body.cluster
        )));
    }
    Ok(Record {
        keys: Arc::new(IssuerKeys::parse(&env.body)?),
        fleet: env.fleet,
        epoch: env.epoch,
        revision: entry.revision,
    })
}

fn refused(metrics: &SecurityMetrics, cluster: &str, refusal: &IssuerRefusal) {
    tracing::warn!(%cluster, error = %refusal, "refusing a token issuer record; the cluster's previous keys, if any, stay");
    metrics
        .token_issuers_refused
        .with_label_values(&[refusal.reason().as_str()])
        .inc();
}

/// Follows the issuer records in `shoal-meta` into `issuers`, forever. A broken watch is
/// re-created; its replay replaces the set only once complete, so issuers never vanish
/// during a reconnect. Refused records (see the module docs) are logged, counted and
/// skipped (the cluster's previous keys, if any, stay).
pub async fn follow_issuers(bus: Arc<dyn StateBus>, issuers: Issuers, metrics: SecurityMetrics) {
    let mut backoff = Duration::from_millis(100);
    let mut records = IssuerRecords::default();
    loop {
        match bus.watch(Bucket::Meta).await {
            Ok(mut stream) => {
                records.restart();
                while let Some(item) = stream.next().await {
                    let entry = match item {
                        Ok(WatchEvent::InitialDone) => {
                            if let Some((all, refusals)) = records.initial_done() {
                                for (cluster, refusal) in &refusals {
                                    refused(&metrics, cluster, refusal);
                                }
                                issuers.replace(all);
                                metrics.token_issuers.set(issuers.clusters().len() as i64);
                            }
                            continue;
                        }
                        Ok(WatchEvent::Entry(entry)) => entry,
                        Err(error) => {
                            tracing::warn!(%error, "issuer watch broke; re-watching");
                            break;
                        }
                    };
                    backoff = Duration::from_millis(100);
                    match records.entry(&entry) {
                        Step::None => continue,
                        Step::Set(cluster, keys) => {
                            tracing::info!(%cluster, issuer = %keys.issuer, keys = keys.keys.len(), "token issuer keys loaded");
                            issuers.write().insert(cluster, keys);
                        }
                        Step::Remove(cluster) => {
                            tracing::info!(%cluster, "token issuer removed");
                            issuers.remove(&cluster);
                        }
                        Step::Refused(cluster, refusal) => {
                            refused(&metrics, &cluster, &refusal);
                            continue;
                        }
                    }
                    metrics.token_issuers.set(issuers.clusters().len() as i64);
                }
            }
            Err(error) => tracing::warn!(%error, "cannot watch token issuers; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_common::lease::{self, LeaseBody};

    /// A usable key set (one P-256 key).
    fn jwks() -> String {
        use base64::Engine;
        let key = rcgen::KeyPair::generate().unwrap();
        let raw = key.public_key_raw();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": "k",
            "x": b64(&raw[1..33]), "y": b64(&raw[33..65]),
        }]})
        .to_string()
    }

    fn issuer(cluster: &str, fleet: &str, epoch: u64) -> Entry {
        issuer_at(cluster, fleet, epoch, 1)
    }

    fn issuer_at(cluster: &str, fleet: &str, epoch: u64, revision: u64) -> Entry {
        let record = ClusterIssuer {
            cluster: cluster.into(),
            issuer: "https://kubernetes.default.svc".into(),
            jwks: jwks(),
        };
        Entry {
            key: keys::issuer_key(cluster),
            value: Envelope::new(fleet, epoch, 1, &record)
                .encode()
                .unwrap()
                .into(),
            revision,
            op: Op::Put,
        }
    }

    fn lease(fleet: &str, epoch: u64) -> Entry {
        lease_since(fleet, epoch, 0)
    }

    /// A lease whose term started after revision `since`.
    fn lease_since(fleet: &str, epoch: u64, since: u64) -> Entry {
        let body = LeaseBody {
            holder: "ingester-0".into(),
            epoch,
            renewed_at_ms: 1,
            ttl_ms: 10_000,
            since_revision: since,
        };
        Entry {
            key: keys::lease_key(fleet),
            value: lease::encode(fleet, &body).unwrap().into(),
            revision: 1,
            op: Op::Put,
        }
    }

    fn reason(step: Step) -> &'static str {
        match step {
            Step::None => "none",
            Step::Set(..) => "set",
            Step::Remove(_) => "remove",
            Step::Refused(_, refusal) => refusal.reason().as_str(),
        }
    }

    #[test]
    fn a_replay_admits_records_up_to_their_fleets_lease() {
        let mut records = IssuerRecords::default();
        records.restart();
        // Records come before the lease in a replay (the lease is renewed last). The term
        // of epoch 3 started after revision 10.
        for entry in [
            issuer_at("old", "f", 2, 5),
            issuer_at("stale", "f", 2, 12),
            issuer_at("current", "f", 3, 11),
            issuer_at("ahead", "f", 4, 13),
            issuer_at("orphan", "nobody", 1, 14),
            lease_since("f", 3, 10),
        ] {
            assert_eq!(reason(records.entry(&entry)), "none");
        }
        let (admitted, refused) = records.initial_done().unwrap();
        assert_eq!(
            admitted.keys().collect::<Vec<_>>(),
            ["current", "old"],
            "an earlier leader's record, unchanged since the term started, is current"
        );
        let refused: Vec<_> = refused
            .iter()
            .map(|(c, r)| (c.as_str(), r.reason().as_str()))
            .collect();
        assert_eq!(
            refused,
            [
                ("ahead", "fenced"),
                ("orphan", "unleased"),
                ("stale", "fenced")
            ],
            "an older epoch written during the term is a deposed leader's or forged"
        );
        assert!(records.initial_done().is_none());
    }

    #[test]
    fn live_records_must_carry_the_current_lease_epoch() {
        let mut records = IssuerRecords::default();
        records.restart();
        records.entry(&lease("f", 3));
        records.initial_done().unwrap();
        assert_eq!(reason(records.entry(&issuer("east", "f", 3))), "set");
        // A deposed leader's (or a replayed old) record.
        assert_eq!(reason(records.entry(&issuer("east", "f", 2))), "fenced");
        // A record of a term whose lease was never seen.
        assert_eq!(reason(records.entry(&issuer("east", "f", 9))), "fenced");
        assert_eq!(
            reason(records.entry(&issuer("east", "other", 3))),
            "unleased"
        );
        assert_eq!(
            reason(records.entry(&issuer("east", "other", 0))),
            "unleased"
        );
        // Garbage, and a record filed under another cluster's key.
        let mut garbage = issuer("east", "f", 3);
        garbage.value = "junk".into();
        assert_eq!(reason(records.entry(&garbage)), "invalid");
        let mut misfiled = issuer("west", "f", 3);
        misfiled.key = keys::issuer_key("east");
        assert_eq!(reason(records.entry(&misfiled)), "invalid");

        // A takeover: the new lease first, then the new leader's record.
        records.entry(&lease("f", 4));
        assert_eq!(reason(records.entry(&issuer("east", "f", 4))), "set");
        assert_eq!(reason(records.entry(&issuer("east", "f", 3))), "fenced");

        // A forged lease far ahead is refused: its forged records are too, and the real
        // leader's still load.
        records.entry(&lease("f", 1 << 62));
        assert_eq!(
            reason(records.entry(&issuer("east", "f", 1 << 62))),
            "fenced"
        );
        assert_eq!(reason(records.entry(&issuer("east", "f", 4))), "set");

        let delete = Entry {
            value: Default::default(),
            op: Op::Delete,
            ..issuer("east", "f", 4)
        };
        assert_eq!(reason(records.entry(&delete)), "remove");
    }
}
