//! ADS State-of-the-World: one task per stream, answering requests and pushing snapshots.
//!
//! Request handling follows Istio's `shouldRespond`: an empty nonce is a new request; a nonce
//! other than the last one sent is stale and ignored; a matching nonce with `error_detail`
//! is a NACK (recorded, never retried in a loop); otherwise an ACK, answered only when the
//! requested names changed.

use super::registry::{Nack, Registry};
use crate::generate::{generate, Resource, Snapshot};
use crate::metrics::Metrics;
use crate::pipeline::Published;
use crate::proxy::Proxy;
use crate::scope::ProxyScope;
use futures::StreamExt;
use shoal_proto::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_server::AggregatedDiscoveryService, DeltaDiscoveryRequest,
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use shoal_proto::{content_version, XdsType};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// The ADS gRPC service.
#[derive(Clone)]
pub struct AdsService {
    snapshots: watch::Receiver<Option<Published>>,
    registry: Registry,
    metrics: Metrics,
    next_id: Arc<AtomicU64>,
}

impl AdsService {
    /// A service pushing the snapshots published on `snapshots`.
    pub fn new(
        snapshots: watch::Receiver<Option<Published>>,
        registry: Registry,
        metrics: Metrics,
    ) -> Self {
        AdsService {
            snapshots,
            registry,
            metrics,
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }
}

type ResponseStream<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let (tx, rx) = mpsc::channel(16);
        let conn = Connection {
            id: format!("{}-{}", peer, self.next_id.fetch_add(1, Ordering::Relaxed)),
            proxy: None,
            scope: None,
            watched: BTreeMap::new(),
            nonce: 0,
            registry: self.registry.clone(),
            metrics: self.metrics.clone(),
            tx,
        };
        tokio::spawn(conn.run(request.into_inner(), self.snapshots.clone()));
        Ok(Response::new(ReceiverStream::new(rx).boxed()))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "delta xDS is not supported yet; use SotW ADS (GRPC)",
        ))
    }
}

/// What one stream has asked for and been sent, per type.
#[derive(Debug, Default)]
struct Watched {
    /// Requested names, sorted (empty on a wildcard type = all).
    names: Vec<String>,
    /// Version and nonce of the last response.
    sent_version: Option<String>,
    sent_nonce: Option<String>,
}

struct Connection {
    id: String,
    proxy: Option<Proxy>,
    /// The proxy's scope and the snapshot number it was computed for.
    scope: Option<(u64, ProxyScope)>,
    watched: BTreeMap<XdsType, Watched>,
    nonce: u64,
    registry: Registry,
    metrics: Metrics,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
}

/// Why a stream ended.
enum End {
    /// The proxy closed the stream or the server is shutting down.
    Closed,
    /// The stream failed; tell the proxy why.
    Error(Status),
}

impl Connection {
    async fn run(
        mut self,
        mut requests: Streaming<DiscoveryRequest>,
        mut snapshots: watch::Receiver<Option<Published>>,
    ) {
        // Serve nothing until the initial state is loaded: an empty config would tear down
        // a proxy's working config.
        let current = match snapshots.wait_for(|s| s.is_some()).await {
            Ok(s) => s.clone(),
            Err(_) => return,
        };
        let mut current = current.map(|p| p.snapshot);
        let end = loop {
            tokio::select! {
                req = requests.next() => match req {
                    None => break End::Closed,
                    Some(Err(status)) => {
                        tracing::debug!(conn = %self.id, %status, "stream error");
                        break End::Closed;
                    }
                    Some(Ok(req)) => {
                        let Some(snap) = current.clone() else { continue };
                        if let Err(status) = self.on_request(req, &snap).await {
                            break End::Error(status);
                        }
                    }
                },
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        break End::Closed;
                    }
                    let published = snapshots.borrow_and_update().clone();
                    if let Some(p) = published {
                        current = Some(p.snapshot.clone());
                        if self.proxy.is_some() && self.push_all(&p.snapshot, p.observed_at_ms).await.is_err() {
                            break End::Closed;
                        }
                    }
                }
            }
        };
        if let End::Error(status) = end {
            tracing::warn!(conn = %self.id, %status, "closing xDS stream");
            let _ = self.tx.send(Err(status)).await;
        }
        if let Some(p) = &self.proxy {
            self.metrics
                .connections
                .with_label_values(&[kind_label(p)])
                .dec();
            tracing::info!(conn = %self.id, node = %p.id, "proxy disconnected");
        }
        self.registry.remove(&self.id);
    }

    async fn on_request(
        &mut self,
        req: DiscoveryRequest,
        snap: &Arc<Snapshot>,
    ) -> Result<(), Status> {
        if self.proxy.is_none() {
            let proxy = Proxy::from_node(req.node.as_ref())
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            tracing::info!(conn = %self.id, node = %proxy.id, kind = ?proxy.kind, "proxy connected");
            self.registry.add(&self.id, &proxy);
            self.metrics
                .connections
                .with_label_values(&[kind_label(&proxy)])
                .inc();
            self.proxy = Some(proxy);
        }
        let Some(ty) = XdsType::from_type_url(&req.type_url) else {
            tracing::warn!(conn = %self.id, type_url = %req.type_url, "ignoring request for an unsupported type");
            return Ok(());
        };
        let mut names = req.resource_names.clone();
        names.sort();
        names.dedup();
        let w = self.watched.entry(ty).or_default();
        if !req.response_nonce.is_empty() {
            if w.sent_nonce.as_deref() != Some(req.response_nonce.as_str()) {
                tracing::debug!(conn = %self.id, ty = ty.short(), nonce = %req.response_nonce, "stale nonce; ignoring");
                return Ok(());
            }
            if let Some(detail) = &req.error_detail {
                self.metrics.nacks.with_label_values(&[ty.short()]).inc();
                tracing::warn!(
                    conn = %self.id,
                    ty = ty.short(),
                    nonce = %req.response_nonce,
                    version = %req.version_info,
                    error = %detail.message,
                    "proxy rejected configuration (NACK)"
                );
                let nack = Nack {
                    nonce: req.response_nonce.clone(),
                    version: req.version_info.clone(),
                    message: detail.message.clone(),
                };
                self.registry
                    .update(&self.id, ty.type_url(), |s| s.last_nack = Some(nack));
                return Ok(());
            }
            self.registry.update(&self.id, ty.type_url(), |s| {
                s.acked_version = req.version_info.clone();
                s.acked_nonce = req.response_nonce.clone();
            });
            if w.names == names {
                return Ok(()); // A plain ACK.
            }
        }
        w.names = names;
        // A new request, or an ACK that changed the names: always answer.
        self.respond(ty, snap, true, None).await
    }

    async fn push_all(
        &mut self,
        snap: &Arc<Snapshot>,
        observed_at_ms: Option<u64>,
    ) -> Result<(), ()> {
        let types: Vec<XdsType> = self.watched.keys().copied().collect();
        for ty in types {
            self.respond(ty, snap, false, observed_at_ms)
                .await
                .map_err(|_| ())?;
        }
        Ok(())
    }

    /// Generates `ty` and sends it unless (`force` off and) the proxy already has this version.
    async fn respond(
        &mut self,
        ty: XdsType,
        snap: &Arc<Snapshot>,
        force: bool,
        observed_at_ms: Option<u64>,
    ) -> Result<(), Status> {
        let Some(proxy) = &self.proxy else {
            return Ok(());
        };
        if self.scope.as_ref().is_none_or(|(n, _)| *n != snap.number) {
            self.scope = Some((snap.number, ProxyScope::compute(proxy, &snap.ctx)));
        }
        let Some((_, scope)) = &self.scope else {
            return Ok(());
        };
        let Some(w) = self.watched.get(&ty) else {
            return Ok(());
        };
        let resources = generate(ty, proxy, scope, snap, &w.names);
        let version = response_version(&resources);
        if !force && w.sent_version.as_deref() == Some(version.as_str()) {
            self.metrics
                .pushes_unchanged
                .with_label_values(&[ty.short()])
                .inc();
            return Ok(());
        }
        self.nonce += 1;
        let nonce = format!("{}-{}", snap.number, self.nonce);
        let bytes: usize = resources.iter().map(|r| r.any.value.len()).sum();
        let count = resources.len();
        let response = DiscoveryResponse {
            version_info: version.clone(),
            resources: resources.into_iter().map(|r| r.any).collect(),
            type_url: ty.type_url().to_string(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        if let Some(w) = self.watched.get_mut(&ty) {
            w.sent_version = Some(version.clone());
            w.sent_nonce = Some(nonce.clone());
        }
        self.registry.update(&self.id, ty.type_url(), |s| {
            s.sent_version = version.clone();
            s.sent_nonce = nonce.clone();
            s.resources = count;
        });
        self.metrics.pushes.with_label_values(&[ty.short()]).inc();
        self.metrics
            .push_bytes
            .with_label_values(&[ty.short()])
            .inc_by(bytes as u64);
        if let Some(obs) = observed_at_ms {
            let lag_ms = shoal_common::envelope::now_ms().saturating_sub(obs);
            self.metrics
                .convergence_seconds
                .with_label_values(&[ty.short()])
                .observe(lag_ms as f64 / 1000.0);
        }
        tracing::debug!(conn = %self.id, ty = ty.short(), %version, %nonce, resources = count, bytes, "push");
        self.tx
            .send(Ok(response))
            .await
            .map_err(|_| Status::cancelled("stream closed"))
    }
}

/// The SotW version of a response: a hash over the names and content versions of its
/// resources, identical on every replica for the same content.
fn response_version(resources: &[Resource]) -> String {
    let mut buf = Vec::new();
    for r in resources {
        buf.extend_from_slice(r.name.as_bytes());
        buf.push(0);
        buf.extend_from_slice(r.version.as_bytes());
        buf.push(0);
    }
    content_version(&buf)
}

fn kind_label(p: &Proxy) -> &'static str {
    match p.kind {
        crate::proxy::ProxyKind::Sidecar => "sidecar",
        crate::proxy::ProxyKind::Router => "router",
    }
}
