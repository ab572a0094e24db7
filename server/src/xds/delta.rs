//! ADS delta (incremental) streams.
//!
//! Each resource carries its own version, a hash of its bytes. On a new stream the proxy's
//! `initial_resource_versions` seed what it holds, so a proxy that reconnects — to this
//! replica or any other, since replicas generate identical bytes — is sent only what really
//! changed. CDS and LDS are wildcard subscriptions; EDS and RDS follow
//! `resource_names_subscribe` / `resource_names_unsubscribe`.

use super::limits::MAX_NAMES_PER_SUBSCRIPTION;
use super::session::Session;
use super::sotw::too_many_names;
use super::stream::StreamHandler;
use super::subscription::{Subscription, Warming};
use super::wire::{Encoded, Responses};
use crate::generate::Snapshot;
use crate::push::view::{Held, NameSet, NamesChange};
use shoal_proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use shoal_proto::XdsType;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tonic::Status;

pub(crate) struct DeltaStream {
    session: Session,
    subs: BTreeMap<XdsType, Subscription>,
    warming: Warming,
    nonce: u64,
    tx: Responses,
}

impl DeltaStream {
    pub fn new(session: Session, tx: Responses) -> Self {
        DeltaStream {
            session,
            subs: BTreeMap::new(),
            warming: Warming::default(),
            nonce: 0,
            tx,
        }
    }

    /// After a CDS response: the assignments of the clusters it changed (see [`Warming`]).
    async fn resend_warming(
        &mut self,
        snap: &Arc<Snapshot>,
        observed_at_ms: Option<u64>,
    ) -> Result<(), Status> {
        if !self.warming.pending() || !self.subs.contains_key(&XdsType::Endpoint) {
            return Ok(());
        }
        self.respond(XdsType::Endpoint, snap, false, observed_at_ms, &[])
            .await
            .map(|_| ())
    }

    /// Sends what changed for `ty` since what the proxy holds. `force`: respond even when
    /// nothing changed (the first request of a type must be answered, or Envoy waits for
    /// its initial fetch timeout). Returns how many resources the proxy already held at
    /// their current version (and so were not sent). `asked`: the names an on-demand
    /// ztunnel's request just subscribed to; those that name nothing are answered in
    /// `removed_resources`, as istiod does (ztunnel waits until a name it asked for is
    /// answered, as a resource or a removal).
    async fn respond(
        &mut self,
        ty: XdsType,
        snap: &Arc<Snapshot>,
        force: bool,
        observed_at_ms: Option<u64>,
        asked: &[String],
    ) -> Result<usize, Status> {
        let Some(sub) = self.subs.get_mut(&ty) else {
            return Ok(0);
        };
        // A wildcard subscription of a non-wildcard type asks for no name in particular
        // (interned like any set of names, so its output is shared, not rebuilt per push).
        let (names, change) = if sub.wildcard && !self.session.wildcard(ty) {
            // ztunnel's types are wildcard per subscription (see `ProxyKind::wildcard`):
            // its wildcard is the name `*`.
            let all = match ty {
                XdsType::Address | XdsType::Authorization => {
                    std::iter::once(crate::generate::ambient::WILDCARD.to_string()).collect()
                }
                _ => NameSet::default(),
            };
            sub.change = None;
            (self.session.intern(ty, all, snap), None)
        } else {
            // Taken, not cloned: a first request's change names every resource (a
            // thousand names per proxy at once when a fleet connects).
            (sub.names.clone(), sub.change.take())
        };
        let output = self
            .session
            .output_from(ty, snap, &names, change.as_ref())
            .await;
        let Some(sub) = self.subs.get_mut(&ty) else {
            return Ok(0);
        };
        if ty == XdsType::Endpoint {
            self.warming.apply(&mut sub.held);
        }
        let diff = self.session.diff(ty, &names, &sub.held, &output, snap);
        // Answered: a resource of that name, or one with it among its aliases. (A set, so
        // a request of many names costs names + resources, not their product.)
        let unresolved: Vec<String> = if asked.is_empty() {
            Vec::new()
        } else {
            let answered: std::collections::HashSet<&str> = output
                .iter()
                .flat_map(|r| std::iter::once(&r.name).chain(&r.aliases))
                .map(String::as_str)
                .collect();
            asked
                .iter()
                .filter(|n| !answered.contains(n.as_str()))
                .cloned()
                .collect()
        };
        if diff.is_empty() && !force && unresolved.is_empty() {
            self.session.metrics.of(ty).pushes_unchanged.inc();
            // The proxy holds exactly this output: share it, so the next diff is against
            // the view's output (skipping what both share), not a pass over an own copy.
            sub.held = Held::Shared(output);
            return Ok(diff.unchanged);
        }
        sub.held = Held::Shared(output.clone());
        if ty == XdsType::Cluster {
            // Only an assignment the proxy holds must be sent again for its cluster to
            // warm; any other is sent when the proxy subscribes to it. (Recording every
            // cluster of a first response kept a thousand names per proxy while a fleet
            // connected.)
            let endpoints = self.subs.get(&XdsType::Endpoint).map(|s| &s.held);
            self.warming.clusters_sent(
                diff.changed
                    .iter()
                    .map(|r| r.name.as_str())
                    .filter(|name| endpoints.is_some_and(|held| held.contains(name))),
            );
        }
        self.nonce += 1;
        let nonce = format!("{}-{}", snap.number, self.nonce);
        let version = output.version().to_string();
        self.session.sent(
            ty,
            &version,
            &nonce,
            &diff.changed,
            output.len(),
            observed_at_ms,
        );
        let mut removed = diff.removed.clone();
        removed.extend(unresolved);
        let head = DeltaDiscoveryResponse {
            system_version_info: version,
            type_url: ty.type_url().to_string(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        };
        let entries = if diff.changed.len() == output.len() {
            output.delta_entries()
        } else {
            diff.gathered.delta(&diff.changed)
        };
        let response = Encoded::new(&head, entries);
        self.tx
            .send(Ok(response))
            .await
            .map_err(|_| Status::cancelled("stream closed"))?;
        Ok(diff.unchanged)
    }
}

#[tonic::async_trait]
impl StreamHandler<DeltaDiscoveryRequest> for DeltaStream {
    fn session(&self) -> &Session {
        &self.session
    }

    fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    async fn on_request(
        &mut self,
        mut req: DeltaDiscoveryRequest,
        snap: &Arc<Snapshot>,
    ) -> Result<(), Status> {
        let Some(ty) = self
            .session
            .begin_request(req.node.as_ref(), &req.type_url)?
        else {
            return Ok(());
        };
        for count in [
            req.resource_names_subscribe.len(),
            req.resource_names_unsubscribe.len(),
            req.initial_resource_versions.len(),
        ] {
            if count > MAX_NAMES_PER_SUBSCRIPTION {
                return Err(too_many_names(ty, count));
            }
        }
        let type_wildcard = self.session.wildcard(ty);
        let first = !self.subs.contains_key(&ty);
        let sub = self.subs.entry(ty).or_default();
        if first {
            // ztunnel's types are wildcard for a first request naming nothing (the legacy
            // wildcard ztunnel sends); it opts out by unsubscribing `*` (on demand).
            let ambient = matches!(ty, XdsType::Address | XdsType::Authorization);
            sub.wildcard = type_wildcard || (ambient && req.resource_names_subscribe.is_empty());
            sub.held = Held::Own(
                req.initial_resource_versions
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            if !sub.held.is_empty() {
                tracing::debug!(conn = %self.session.id, ty = ty.short(), held = sub.held.len(), "resuming with the proxy's resource versions");
            }
        }
        if !req.response_nonce.is_empty() {
            if self.session.last_sent(ty).1 == req.response_nonce {
                match &req.error_detail {
                    Some(detail) => self
                        .session
                        .nack(ty, &req.response_nonce, "", &detail.message),
                    None => self.session.ack(ty, &req.response_nonce, ""),
                }
            } else {
                tracing::debug!(conn = %self.session.id, ty = ty.short(), nonce = %req.response_nonce, "stale nonce");
            }
        }
        // What an on-demand ztunnel asks for by this request (see `respond`), before the
        // names are moved out of the request.
        let addresses: Vec<String> = if ty == XdsType::Address {
            req.resource_names_subscribe
                .iter()
                .filter(|n| n.as_str() != "*")
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        let mut changed = false;
        let mut names: Option<NameSet> = None;
        // What this request changes, so the new names' output is derived from the old. A
        // first set of names has nothing to be derived from: tracking it would keep a
        // second copy of a thousand names per proxy while a fleet connects.
        let derive = !sub.names.is_empty();
        let (mut added, mut removed) = (BTreeSet::new(), BTreeSet::new());
        // Moved, not cloned: the request's names become the subscription's.
        for name in std::mem::take(&mut req.resource_names_subscribe) {
            if name == "*" {
                changed |= !sub.wildcard;
                sub.wildcard = true;
            } else if (!sub.wildcard || !type_wildcard) && !sub.names.contains(&name) {
                let set = names.get_or_insert_with(|| (*sub.names).clone());
                let inserted = if derive {
                    set.insert(name.clone()) && added.insert(name)
                } else {
                    set.insert(name)
                };
                changed |= inserted;
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                changed |= sub.wildcard;
                sub.wildcard = false;
            }
            if sub.names.contains(name) {
                names
                    .get_or_insert_with(|| (*sub.names).clone())
                    .remove(name);
                removed.insert(name.clone());
                changed = true;
            }
            // The proxy dropped it: if subscribed again, it must be sent again.
            sub.held.forget(name);
        }
        // An on-demand ztunnel that names nothing yet still gets its node's workloads
        // (see `Session::intern`): its first set of names is interned even if empty.
        if first && ty == XdsType::Address && names.is_none() {
            names = Some((*sub.names).clone());
        }
        if let Some(names) = names {
            if names.len() > MAX_NAMES_PER_SUBSCRIPTION {
                return Err(too_many_names(ty, names.len()));
            }
            let interned = self.session.intern(ty, names, snap);
            self.session.requested(ty, &interned);
            let from = std::mem::replace(&mut sub.names, interned);
            // Every change is answered at once (which takes the change); one still pending
            // would make this one relative to names with no output: build it afresh then.
            sub.change = match sub.change.take() {
                None if derive => Some(NamesChange {
                    from,
                    added: added.into_iter().collect(),
                    removed: removed.into_iter().collect(),
                }),
                _ => None,
            };
        }
        let resuming = first && !sub.held.is_empty();
        // What an on-demand ztunnel asked for by this request (see `respond`): answered
        // even when already subscribed, as istiod answers every request. ztunnel asks
        // again for an address it was told names nothing (a workload, then a service by
        // that address), and waits until it is answered.
        let asked = if sub.wildcard { Vec::new() } else { addresses };
        // The request is not needed while its answer is generated (with a fleet
        // connecting, many wait for generation at once).
        drop(req);
        if first || changed || !asked.is_empty() {
            let force = first || !asked.is_empty();
            let unchanged = self.respond(ty, snap, force, None, &asked).await?;
            if resuming {
                self.session
                    .metrics
                    .of(ty)
                    .resources_resumed
                    .inc_by(unchanged as u64);
                self.session.resumed(ty, unchanged);
            }
            if ty == XdsType::Cluster {
                self.resend_warming(snap, None).await?;
            }
        }
        Ok(())
    }

    fn watched_types(&self) -> Vec<XdsType> {
        self.subs.keys().copied().collect()
    }

    async fn push(
        &mut self,
        ty: XdsType,
        snap: &Arc<Snapshot>,
        observed_at_ms: Option<u64>,
    ) -> Result<(), Status> {
        self.respond(ty, snap, false, observed_at_ms, &[]).await?;
        if ty == XdsType::Cluster {
            self.resend_warming(snap, observed_at_ms).await?;
        }
        Ok(())
    }

    async fn fail(&mut self, status: Status) {
        let _ = self.tx.send(Err(Box::new(status))).await;
    }
}
