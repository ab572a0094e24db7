//! The ADS gRPC service: State-of-the-World and delta streams on one port.

use super::delta::DeltaStream;
use super::listener::ConnectionClose;
use super::registry::Registry;
use super::session::{Mode, Session};
use super::sotw::SotwStream;
use crate::generate::cache::GeneratorCache;
use crate::metrics::Metrics;
use crate::pipeline::Published;
use futures::StreamExt;
use shoal_proto::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_server::AggregatedDiscoveryService, DeltaDiscoveryRequest,
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// The ADS gRPC service.
#[derive(Clone)]
pub struct AdsService {
    snapshots: watch::Receiver<Option<Published>>,
    registry: Registry,
    metrics: Metrics,
    next_id: Arc<AtomicU64>,
    push_limit: Arc<Semaphore>,
    cache: GeneratorCache,
}

/// Default size bound of the generator cache.
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

/// Istio's default push concurrency (`PILOT_PUSH_THROTTLE`).
pub const DEFAULT_PUSH_CONCURRENCY: usize = 100;

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
            metrics: metrics.clone(),
            next_id: Arc::new(AtomicU64::new(1)),
            push_limit: Arc::new(Semaphore::new(DEFAULT_PUSH_CONCURRENCY)),
            cache: GeneratorCache::new(
                DEFAULT_CACHE_BYTES,
                GeneratorCache::assert_from_env(),
                metrics.clone(),
            ),
        }
    }

    /// Uses this generator cache (shared with the admin server's `/debug/cachez`).
    pub fn with_cache(mut self, cache: GeneratorCache) -> Self {
        self.cache = cache;
        self
    }

    /// Limits how many streams generate a push at the same time.
    pub fn with_push_concurrency(mut self, limit: usize) -> Self {
        self.push_limit = Arc::new(Semaphore::new(limit.max(1)));
        self
    }

    fn drive_context<T>(&self, request: &Request<T>) -> DriveContext {
        DriveContext {
            snapshots: self.snapshots.clone(),
            close: request
                .extensions()
                .get::<ConnectionClose>()
                .map(|c| c.0.clone()),
            push_limit: self.push_limit.clone(),
        }
    }

    fn session<T>(&self, request: &Request<T>, mode: Mode) -> Session {
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "unknown".into());
        let id = format!("{peer}-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        Session::new(
            id,
            mode,
            self.registry.clone(),
            self.metrics.clone(),
            self.cache.clone(),
        )
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
        let session = self.session(&request, Mode::Sotw);
        let (tx, rx) = mpsc::channel(16);
        let ctx = self.drive_context(&request);
        tokio::spawn(drive(
            SotwStream::new(session, tx),
            request.into_inner(),
            ctx,
        ));
        Ok(Response::new(ReceiverStream::new(rx).boxed()))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let session = self.session(&request, Mode::Delta);
        let (tx, rx) = mpsc::channel(16);
        let ctx = self.drive_context(&request);
        tokio::spawn(drive(
            DeltaStream::new(session, tx),
            request.into_inner(),
            ctx,
        ));
        Ok(Response::new(ReceiverStream::new(rx).boxed()))
    }
}

/// What a stream needs from outside itself.
pub(crate) struct DriveContext {
    snapshots: watch::Receiver<Option<Published>>,
    /// Turns true when the connection is aged out or drained.
    close: Option<watch::Receiver<bool>>,
    push_limit: Arc<Semaphore>,
}

/// Drives a stream: waits for the first snapshot (serving nothing before the initial state
/// is loaded, since an empty config would tear down a proxy's working one), then
/// interleaves requests and snapshot pushes until either side ends or the connection is
/// closed. Pushes regenerate only the types a change affects, at most `push_limit` streams
/// at a time; a stream never queues more than one pending push (the watch channel keeps
/// only the newest snapshot).
pub(crate) async fn drive<Req, H>(mut handler: H, mut requests: Streaming<Req>, ctx: DriveContext)
where
    H: StreamHandler<Req>,
{
    let DriveContext {
        mut snapshots,
        close,
        push_limit,
    } = ctx;
    let Ok(first) = snapshots.wait_for(|s| s.is_some()).await.map(|s| s.clone()) else {
        return;
    };
    let mut last = first.as_ref().map(|p| p.snapshot.number).unwrap_or(0);
    let mut current = first.map(|p| p.snapshot);
    let mut close = close;
    let error = loop {
        tokio::select! {
            req = requests.next() => match req {
                None => break None,
                Some(Err(status)) => {
                    tracing::debug!(conn = %handler.session().id, %status, "stream error");
                    break None;
                }
                Some(Ok(req)) => {
                    let Some(snap) = current.clone() else { continue };
                    if let Err(status) = handler.on_request(req, &snap).await {
                        break Some(status);
                    }
                }
            },
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break None;
                }
                let published = snapshots.borrow_and_update().clone();
                let Some(p) = published else { continue };
                current = Some(p.snapshot.clone());
                let types = if handler.session().identified() {
                    handler.session_mut().affected(&p, last)
                } else {
                    BTreeSet::new()
                };
                last = p.snapshot.number;
                if types.is_empty() {
                    continue;
                }
                let Ok(_permit) = push_limit.acquire().await else { break None };
                let mut failed = None;
                for ty in handler.watched_types().into_iter().filter(|t| types.contains(t)) {
                    if let Err(status) = handler.push(ty, &p.snapshot, p.observed_at_ms).await {
                        failed = Some(status);
                        break;
                    }
                }
                if failed.is_some() {
                    break failed;
                }
            }
            _ = connection_closed(&mut close) => {
                tracing::debug!(conn = %handler.session().id, "connection closing; ending stream");
                break None;
            }
        }
    };
    if let Some(status) = error {
        if status.code() != tonic::Code::Cancelled {
            tracing::warn!(conn = %handler.session().id, %status, "closing xDS stream");
        }
        handler.fail(status).await;
    }
    handler.session().close();
}

async fn connection_closed(close: &mut Option<watch::Receiver<bool>>) {
    match close {
        Some(rx) => {
            if rx.wait_for(|c| *c).await.is_err() {
                // The connection task is gone: nothing will signal; never fire.
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The protocol-specific half of a stream.
#[tonic::async_trait]
pub(crate) trait StreamHandler<Req>: Send {
    /// The shared session.
    fn session(&self) -> &Session;
    /// The shared session, mutably.
    fn session_mut(&mut self) -> &mut Session;
    /// Handles one request.
    async fn on_request(
        &mut self,
        req: Req,
        snap: &Arc<crate::generate::Snapshot>,
    ) -> Result<(), Status>;
    /// The types this stream has subscribed to, in push order.
    fn watched_types(&self) -> Vec<shoal_proto::XdsType>;
    /// Pushes one type of a new snapshot, if its content changed for this proxy.
    async fn push(
        &mut self,
        ty: shoal_proto::XdsType,
        snap: &Arc<crate::generate::Snapshot>,
        observed_at_ms: Option<u64>,
    ) -> Result<(), Status>;
    /// Ends the stream with an error status.
    async fn fail(&mut self, status: Status);
}
