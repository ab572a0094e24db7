//! The server's local copy of the bus: every config object, service and endpoint set, keyed
//! as on the bus. Applying an entry reports what kind of state it changed, so the push
//! pipeline knows whether the PushContext must be rebuilt or only EDS shards changed.

use crate::index::endpoints::EndpointIndex;
use shoal_common::bus::{Bucket, Entry, Op};
use shoal_common::keys::{self, BusIdentity, ConfigId, ServiceId};
use shoal_common::lease::{FleetEpochs, LeaseError};
use shoal_common::model::{ConfigKind, ConfigObject, EndpointSet, Service};
use shoal_common::{Envelope, EnvelopeError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// An entry from the bus that could not be applied. The previous value (if any) stays.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The key does not follow the bucket's key scheme.
    #[error("{bucket}/{key}: {source}")]
    Key {
        /// Bucket.
        bucket: Bucket,
        /// Key.
        key: String,
        /// Cause.
        #[source]
        source: keys::KeyError,
    },
    /// The value is not a valid envelope of the bucket's type.
    #[error("{bucket}/{key}: {source}")]
    Payload {
        /// Bucket.
        bucket: Bucket,
        /// Key.
        key: String,
        /// Cause.
        #[source]
        source: EnvelopeError,
    },
    /// A lease key in `shoal-meta` whose value is unusable; the fleet's epoch stays.
    #[error("{bucket}/{key}: {source}")]
    Lease {
        /// Bucket.
        bucket: Bucket,
        /// Key.
        key: String,
        /// Cause.
        #[source]
        source: LeaseError,
    },
    /// A write from a deposed ingester leader: its epoch is older than its fleet's lease.
    #[error(
        "{bucket}/{key}: written by fleet {fleet:?} at epoch {epoch}, but the fleet's lease is \
         at epoch {fleet_epoch} (a deposed leader's write; refused)"
    )]
    Fenced {
        /// Bucket.
        bucket: Bucket,
        /// Key.
        key: String,
        /// The fleet in the envelope.
        fleet: String,
        /// The epoch in the envelope.
        epoch: u64,
        /// The fleet's current lease epoch.
        fleet_epoch: u64,
    },
    /// A write stamped with an epoch implausibly far above its fleet's lease
    /// ([`shoal_common::lease::epoch_jump`]): forged, not a newer leader's.
    #[error(
        "{bucket}/{key}: written by fleet {fleet:?} at epoch {epoch}, implausibly far above \
         the fleet's lease epoch {fleet_epoch} (forged or corrupt; refused)"
    )]
    EpochJump {
        /// Bucket.
        bucket: Bucket,
        /// Key.
        key: String,
        /// The fleet in the envelope.
        fleet: String,
        /// The epoch in the envelope.
        epoch: u64,
        /// The fleet's current lease epoch.
        fleet_epoch: u64,
    },
    /// The value's identity does not match its key.
    #[error("{bucket}/{key}: payload is for {found}, not for this key")]
    Mismatch {
        /// Bucket.
        bucket: Bucket,
        /// Key.
        key: String,
        /// What the payload says it is.
        found: String,
    },
}

/// Whether a config object shapes listeners beyond route tables: a VirtualService with
/// `tcp` or `tls` rules (sidecar outbound chains, gateway TCP/TLS servers).
fn shapes_listeners(obj: &ConfigObject) -> bool {
    matches!(&obj.spec, shoal_common::model::ConfigSpec::VirtualService(vs)
        if !vs.tcp.is_empty() || !vs.tls.is_empty())
}

/// What an applied entry changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing (same value, unknown delete, or the meta bucket).
    None,
    /// Istio config of this kind.
    Config(ConfigKind),
    /// A VirtualService whose `tcp` or `tls` rules (before or after) shape listeners.
    ListenerRules,
    /// A service (the PushContext depends on services).
    Service,
    /// Endpoints of this service hostname.
    Endpoints(String),
    /// Endpoints of this service hostname, and with them its workload identities (service
    /// accounts, sidecars): clusters change too (mutual TLS).
    EndpointIdentities(String),
    /// The set of clusters with a published token issuer (what a client certificate may
    /// have been issued for: gateway credentials, see `generate::sds`).
    TokenIssuers,
}

/// Everything a server knows, as last read from the bus.
#[derive(Debug, Default, Clone)]
pub struct MeshState {
    /// Istio config and gateway credentials by their key's identity.
    pub config: BTreeMap<ConfigId, Arc<ConfigObject>>,
    /// Services by their bus identity.
    pub services: BTreeMap<ServiceId, Arc<Service>>,
    /// EDS shards.
    pub endpoints: Arc<EndpointIndex>,
    /// The lease epoch of each ingester fleet, for fencing ([`MeshState::apply_live`]).
    pub fleets: FleetEpochs,
    /// Mesh-wide settings (from `--mesh-config`, not from the bus).
    pub mesh: Arc<crate::index::mesh_config::MeshSettings>,
    /// Opens the sealed gateway credentials (`--credential-key-file`); without it they
    /// stay sealed and are not served.
    pub credential_keys: Option<Arc<shoal_common::credential::CredentialKeys>>,
    /// The clusters whose token issuer is published (`issuer.<cluster>` in `shoal-meta`):
    /// the clusters whose tokens the servers accept, and so whose workloads the CA may have
    /// certified.
    pub token_issuers: BTreeSet<String>,
    /// Key sets fetched for RequestAuthentications' `jwksUri`s, by URI (not from the bus:
    /// `security::jwks`).
    pub jwks: Arc<BTreeMap<String, Arc<str>>>,
}

impl MeshState {
    /// Applies one bus entry. On error nothing changes.
    /// Returns the change and the writer's `observed_at_ms` (puts only).
    ///
    /// For the initial values of a watch (and resyncs), which are the latest value of
    /// each key: a value an earlier leader wrote and nobody changed since is current, so
    /// epochs are not checked. Live changes go through [`MeshState::apply_live`].
    pub fn apply(
        &mut self,
        bucket: Bucket,
        entry: &Entry,
    ) -> Result<(Change, Option<u64>), ApplyError> {
        self.apply_checked(bucket, entry, false)
    }

    /// Applies a live change: like [`MeshState::apply`], but a put stamped with an epoch
    /// older than its fleet's lease epoch is refused ([`ApplyError::Fenced`]): it comes
    /// from an ingester that was deposed and has not noticed yet. So is one stamped
    /// implausibly far above it ([`ApplyError::EpochJump`]): no leader writes with an
    /// epoch its lease never had.
    pub fn apply_live(
        &mut self,
        bucket: Bucket,
        entry: &Entry,
    ) -> Result<(Change, Option<u64>), ApplyError> {
        self.apply_checked(bucket, entry, true)
    }

    fn check_fence(
        &self,
        bucket: Bucket,
        entry: &Entry,
        fleet: &str,
        epoch: u64,
    ) -> Result<(), ApplyError> {
        match self.fleets.epoch(fleet) {
            Some(fleet_epoch) if shoal_common::lease::fenced(epoch, Some(fleet_epoch)) => {
                Err(ApplyError::Fenced {
                    bucket,
                    key: entry.key.clone(),
                    fleet: fleet.to_string(),
                    epoch,
                    fleet_epoch,
                })
            }
            Some(fleet_epoch) if shoal_common::lease::epoch_jump(Some(fleet_epoch), epoch) => {
                Err(ApplyError::EpochJump {
                    bucket,
                    key: entry.key.clone(),
                    fleet: fleet.to_string(),
                    epoch,
                    fleet_epoch,
                })
            }
            _ => Ok(()),
        }
    }

    /// Decodes a put's value, checks its writer's epoch (live changes) and that the value
    /// is what its key says: the one check every data bucket goes through.
    fn decode_checked<T>(
        &self,
        bucket: Bucket,
        entry: &Entry,
        id: &T::Id,
        fence: bool,
    ) -> Result<(T, u64), ApplyError>
    where
        T: BusIdentity + serde::de::DeserializeOwned,
    {
        let env = Envelope::<T>::decode(&entry.value).map_err(|source| ApplyError::Payload {
            bucket,
            key: entry.key.clone(),
            source,
        })?;
        if fence {
            self.check_fence(bucket, entry, &env.fleet, env.epoch)?;
        }
        let found = env.body.bus_id();
        if &found != id {
            return Err(ApplyError::Mismatch {
                bucket,
                key: entry.key.clone(),
                found: found.to_string(),
            });
        }
        Ok((env.body, env.observed_at_ms))
    }

    fn apply_checked(
        &mut self,
        bucket: Bucket,
        entry: &Entry,
        fence: bool,
    ) -> Result<(Change, Option<u64>), ApplyError> {
        let key_err = |source| ApplyError::Key {
            bucket,
            key: entry.key.clone(),
            source,
        };
        match bucket {
            Bucket::Config => {
                let id = keys::parse_config_key(&entry.key).map_err(key_err)?;
                let kind = id.kind;
                if entry.op == Op::Delete {
                    let removed = self.config.remove(&id);
                    return Ok((
                        match removed {
                            Some(old) if shapes_listeners(&old) => Change::ListenerRules,
                            Some(_) => Change::Config(kind),
                            None => Change::None,
                        },
                        None,
                    ));
                }
                let (obj, observed) =
                    self.decode_checked::<ConfigObject>(bucket, entry, &id, fence)?;
                if self.config.get(&id).is_some_and(|old| **old == obj) {
                    return Ok((Change::None, None));
                }
                let listeners = shapes_listeners(&obj);
                let old = self.config.insert(id, Arc::new(obj));
                let change = if listeners || old.is_some_and(|o| shapes_listeners(&o)) {
                    Change::ListenerRules
                } else {
                    Change::Config(kind)
                };
                Ok((change, Some(observed)))
            }
            Bucket::Services => {
                let id = keys::parse_service_key(&entry.key).map_err(key_err)?;
                if entry.op == Op::Delete {
                    let removed = self.services.remove(&id).is_some();
                    return Ok((
                        if removed {
                            Change::Service
                        } else {
                            Change::None
                        },
                        None,
                    ));
                }
                let (svc, observed) = self.decode_checked::<Service>(bucket, entry, &id, fence)?;
                if self.services.get(&id).is_some_and(|old| **old == svc) {
                    return Ok((Change::None, None));
                }
                self.services.insert(id, Arc::new(svc));
                Ok((Change::Service, Some(observed)))
            }
            Bucket::Endpoints => {
                let id = keys::parse_endpoints_key(&entry.key).map_err(key_err)?;
                let host = shoal_common::model::service_fqdn(&id.service, &id.namespace);
                let identities_before = self.endpoints.identities(&host).cloned();
                let change = |index: &EndpointIndex, host: String| {
                    if index.identities(&host) == identities_before.as_ref() {
                        Change::Endpoints(host)
                    } else {
                        Change::EndpointIdentities(host)
                    }
                };
                if entry.op == Op::Delete {
                    let removed =
                        Arc::make_mut(&mut self.endpoints).remove(&host, &id.cluster, &id.slice);
                    return Ok((
                        if removed {
                            change(&self.endpoints, host)
                        } else {
                            Change::None
                        },
                        None,
                    ));
                }
                let (set, observed) =
                    self.decode_checked::<EndpointSet>(bucket, entry, &id, fence)?;
                let changed = Arc::make_mut(&mut self.endpoints).upsert(&host, set);
                Ok((
                    if changed {
                        change(&self.endpoints, host)
                    } else {
                        Change::None
                    },
                    Some(observed),
                ))
            }
            // Cluster statuses change nothing here; leases set the fleets' epochs; issuer
            // keys say which clusters' tokens are accepted (their values are the
            // authenticator's, `crate::security::auth::follow_issuers`).
            Bucket::Meta => {
                self.fleets
                    .apply(entry)
                    .map_err(|source| ApplyError::Lease {
                        bucket,
                        key: entry.key.clone(),
                        source,
                    })?;
                let Some(cluster) = keys::parse_issuer_key(&entry.key) else {
                    return Ok((Change::None, None));
                };
                let changed = match entry.op {
                    Op::Put => self.token_issuers.insert(cluster),
                    Op::Delete => self.token_issuers.remove(&cluster),
                };
                Ok((
                    if changed {
                        Change::TokenIssuers
                    } else {
                        Change::None
                    },
                    None,
                ))
            }
        }
    }

    /// Keys currently held for a bucket, in the bus's key format (for resyncs).
    pub fn keys(&self, bucket: Bucket) -> Vec<String> {
        match bucket {
            Bucket::Config => self.config.keys().map(ConfigId::key).collect(),
            Bucket::Services => self.services.keys().map(ServiceId::key).collect(),
            Bucket::Endpoints => self.endpoints.bus_keys(),
            Bucket::Meta => {
                let mut all = self.fleets.keys();
                all.extend(self.token_issuers.iter().map(|c| keys::issuer_key(c)));
                all
            }
        }
    }
}
