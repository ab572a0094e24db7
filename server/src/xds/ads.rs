//! The ADS gRPC service: State-of-the-World and delta streams on one port.

use super::delta::DeltaStream;
use super::registry::Registry;
use super::session::{Mode, Session};
use super::sotw::SotwStream;
use crate::metrics::Metrics;
use crate::pipeline::Published;
use futures::StreamExt;
use shoal_proto::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_server::AggregatedDiscoveryService, DeltaDiscoveryRequest,
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
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

    fn session<T>(&self, request: &Request<T>, mode: Mode) -> Session {
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "unknown".into());
        let id = format!("{peer}-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        Session::new(id, mode, self.registry.clone(), self.metrics.clone())
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
        let stream = SotwStream::new(session, tx);
        tokio::spawn(stream.run(request.into_inner(), self.snapshots.clone()));
        Ok(Response::new(ReceiverStream::new(rx).boxed()))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let session = self.session(&request, Mode::Delta);
        let (tx, rx) = mpsc::channel(16);
        let stream = DeltaStream::new(session, tx);
        tokio::spawn(stream.run(request.into_inner(), self.snapshots.clone()));
        Ok(Response::new(ReceiverStream::new(rx).boxed()))
    }
}

/// Drives a stream: waits for the first snapshot (serving nothing before the initial state
/// is loaded, since an empty config would tear down a proxy's working one), then
/// interleaves requests and snapshot pushes until either side ends.
pub(crate) async fn drive<Req, H>(
    mut handler: H,
    mut requests: Streaming<Req>,
    mut snapshots: watch::Receiver<Option<Published>>,
) where
    H: StreamHandler<Req>,
{
    let Ok(first) = snapshots.wait_for(|s| s.is_some()).await.map(|s| s.clone()) else {
        return;
    };
    let mut current = first.map(|p| p.snapshot);
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
                if let Some(p) = published {
                    current = Some(p.snapshot.clone());
                    if handler.session().identified() {
                        if let Err(status) = handler.on_snapshot(&p.snapshot, p.observed_at_ms).await {
                            break Some(status);
                        }
                    }
                }
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

/// The protocol-specific half of a stream.
#[tonic::async_trait]
pub(crate) trait StreamHandler<Req>: Send {
    /// The shared session.
    fn session(&self) -> &Session;
    /// Handles one request.
    async fn on_request(
        &mut self,
        req: Req,
        snap: &Arc<crate::generate::Snapshot>,
    ) -> Result<(), Status>;
    /// Pushes a new snapshot.
    async fn on_snapshot(
        &mut self,
        snap: &Arc<crate::generate::Snapshot>,
        observed_at_ms: Option<u64>,
    ) -> Result<(), Status>;
    /// Ends the stream with an error status.
    async fn fail(&mut self, status: Status);
}
