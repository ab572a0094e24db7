//! ADS State-of-the-World streams.
//!
//! Request handling follows Istio's `shouldRespond`: an empty nonce is a new request; a nonce
//! other than the last one sent is stale and ignored; a matching nonce with `error_detail`
//! is a NACK (recorded, never retried in a loop); otherwise an ACK, answered only when the
//! requested names changed. A push sends a type only if its content changed; EDS responses
//! on a push carry only the assignments that changed (non-root types may be partial).

use super::limits::MAX_NAMES_PER_SUBSCRIPTION;
use super::session::Session;
use super::stream::StreamHandler;
use super::subscription::{Subscription, Warming};
use super::wire::{Encoded, Responses};
use crate::generate::{Resource, Snapshot};
use crate::push::view::{Held, NameSet};
use shoal_proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use shoal_proto::XdsType;
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::Status;

pub(crate) struct SotwStream {
    session: Session,
    subs: BTreeMap<XdsType, Subscription>,
    warming: Warming,
    nonce: u64,
    tx: Responses,
}

impl SotwStream {
    pub fn new(session: Session, tx: Responses) -> Self {
        SotwStream {
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
        self.respond(XdsType::Endpoint, snap, false, observed_at_ms)
            .await
    }

    /// Generates `ty` and sends it. `force`: answer even if the proxy has this version (a
    /// request must always be answered). On a push (`!force`), EDS sends only changed
    /// assignments.
    async fn respond(
        &mut self,
        ty: XdsType,
        snap: &Arc<Snapshot>,
        force: bool,
        observed_at_ms: Option<u64>,
    ) -> Result<(), Status> {
        let Some(w) = self.subs.get(&ty) else {
            return Ok(());
        };
        let names = w.names.clone();
        let output = self.session.output(ty, snap, &names).await;
        let version = output.version();
        let Some(w) = self.subs.get_mut(&ty) else {
            return Ok(());
        };
        let owed = ty == XdsType::Endpoint && self.warming.pending();
        if owed {
            self.warming.apply(&mut w.held);
        }
        if !force && !owed && self.session.last_sent(ty).0 == version {
            self.session.metrics.of(ty).pushes_unchanged.inc();
            return Ok(());
        }
        let total = output.len();
        let partial;
        // The changed assignments only, or (`None`) the whole output.
        let (changed, entries): (Option<&[Arc<Resource>]>, _) = if !force && ty == XdsType::Endpoint
        {
            partial = self.session.diff(ty, &names, &w.held, &output, snap);
            (
                Some(&partial.changed),
                partial.gathered.sotw(&partial.changed),
            )
        } else {
            (None, output.sotw_entries())
        };
        if ty == XdsType::Cluster {
            // The view's shared diff: every stream of the view sent the same clusters.
            let changed = self.session.diff(ty, &names, &w.held, &output, snap);
            self.warming
                .clusters_sent(changed.changed.iter().map(|r| r.name.as_str()));
        }
        w.held = Held::Shared(output.clone());
        self.nonce += 1;
        let nonce = format!("{}-{}", snap.number, self.nonce);
        match changed {
            Some(changed) => self
                .session
                .sent(ty, version, &nonce, changed, total, observed_at_ms),
            None => self
                .session
                .sent(ty, version, &nonce, output.iter(), total, observed_at_ms),
        }
        let head = DiscoveryResponse {
            version_info: version.to_string(),
            type_url: ty.type_url().to_string(),
            nonce,
            ..Default::default()
        };
        let response = Encoded::new(&head, entries);
        self.tx
            .send(Ok(response))
            .await
            .map_err(|_| Status::cancelled("stream closed"))
    }
}

#[tonic::async_trait]
impl StreamHandler<DiscoveryRequest> for SotwStream {
    fn session(&self) -> &Session {
        &self.session
    }

    fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    async fn on_request(
        &mut self,
        mut req: DiscoveryRequest,
        snap: &Arc<Snapshot>,
    ) -> Result<(), Status> {
        let Some(ty) = self
            .session
            .begin_request(req.node.as_ref(), &req.type_url)?
        else {
            return Ok(());
        };
        if req.resource_names.len() > MAX_NAMES_PER_SUBSCRIPTION {
            return Err(too_many_names(ty, req.resource_names.len()));
        }
        // Moved, not cloned: the request's names become the subscription's.
        let names: NameSet = std::mem::take(&mut req.resource_names)
            .into_iter()
            .collect();
        let w = self.subs.entry(ty).or_default();
        let (_, sent_nonce) = self.session.last_sent(ty);
        // A nonce from before this stream (the proxy reconnected, perhaps from another
        // replica) is a new request for this type, as in Istio's shouldRespond.
        if !req.response_nonce.is_empty() && !sent_nonce.is_empty() {
            if sent_nonce != req.response_nonce {
                tracing::debug!(conn = %self.session.id, ty = ty.short(), nonce = %req.response_nonce, "stale nonce; ignoring");
                return Ok(());
            }
            if let Some(detail) = &req.error_detail {
                self.session
                    .nack(ty, &req.response_nonce, &req.version_info, &detail.message);
                return Ok(());
            }
            self.session.ack(ty, &req.response_nonce, &req.version_info);
            if *w.names == names {
                return Ok(()); // A plain ACK.
            }
        }
        if *w.names != names {
            w.names = self.session.intern(ty, names, snap);
            self.session.requested(ty, &w.names);
        }
        // The request is not needed while its answer is generated (with a fleet
        // connecting, many wait for generation at once).
        drop(req);
        self.respond(ty, snap, true, None).await?;
        if ty == XdsType::Cluster {
            self.resend_warming(snap, None).await?;
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
        self.respond(ty, snap, false, observed_at_ms).await?;
        if ty == XdsType::Cluster {
            self.resend_warming(snap, observed_at_ms).await?;
        }
        Ok(())
    }

    async fn fail(&mut self, status: Status) {
        let _ = self.tx.send(Err(Box::new(status))).await;
    }
}

/// The status refusing a request or subscription of `count` names (over the cap).
pub(crate) fn too_many_names(ty: XdsType, count: usize) -> Status {
    Status::invalid_argument(format!(
        "{} request names {count} resources; at most {MAX_NAMES_PER_SUBSCRIPTION} per subscription are served",
        ty.short()
    ))
}
