//! The ADS gRPC service: State-of-the-World and delta streams on one port.

use super::delta::DeltaStream;
use super::limits::{self, Breach, IdentityStreams, SharedWarnLimiter};
use super::listener::{ConnectionBudget, ConnectionClose};
use super::registry::Registry;
use super::session::{Mode, Session};
use super::sotw::SotwStream;
use super::wire::{self, RequestStream, Responses};
use crate::generate::cache::GeneratorCache;
use crate::metrics::Metrics;
use crate::push::pipeline::Published;
use crate::push::view::{Generation, Views};
use crate::security::auth::{self, Authenticator, Credentials, Issuers};
use crate::security::ca::Ca;
use crate::security::reload::Reloading;
use futures::StreamExt;
use shoal_proto::istio_ca::{
    IstioCertificateRequest, IstioCertificateResponse, CREATE_CERTIFICATE_PATH,
};
use shoal_proto::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use shoal_proto::pb::google::protobuf::value::Kind;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, watch, Semaphore};
use tonic::codegen::http;
use tonic::Status;

/// The ADS gRPC service.
#[derive(Clone)]
pub struct AdsService {
    snapshots: watch::Receiver<Option<Published>>,
    registry: Registry,
    metrics: Metrics,
    next_id: Arc<AtomicU64>,
    push_limit: Arc<Semaphore>,
    views: Views,
    auth: Authenticator,
    /// Rate limit of the warnings about refused streams (shared by all streams).
    refusals: SharedWarnLimiter,
    /// The workload CA, when this server signs certificates.
    ca: Option<Reloading<Ca>>,
    /// Time a started request message has to arrive completely.
    message_timeout: Option<std::time::Duration>,
    /// Open streams per authenticated identity.
    identity_streams: IdentityStreams,
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
            views: Views::new(Generation::per_core(GeneratorCache::new(
                DEFAULT_CACHE_BYTES,
                GeneratorCache::assert_from_env(),
                metrics,
            ))),
            auth: Authenticator::new(
                Issuers::default(),
                vec![auth::DEFAULT_AUDIENCE.to_string()],
                shoal_common::defaults::TRUST_DOMAIN,
            ),
            refusals: SharedWarnLimiter::default(),
            ca: None,
            message_timeout: Some(limits::DEFAULT_MESSAGE_TIMEOUT),
            identity_streams: IdentityStreams::default(),
        }
    }

    /// Ends a stream whose request message is not complete `message_timeout` after its
    /// first byte (None: never), and lets one authenticated identity open at most
    /// `max_streams_per_identity` streams.
    pub fn with_stream_limits(
        mut self,
        message_timeout: Option<std::time::Duration>,
        max_streams_per_identity: usize,
    ) -> Self {
        self.message_timeout = message_timeout;
        self.identity_streams = IdentityStreams::new(max_streams_per_identity);
        self
    }

    /// A slot for one more stream of `caller`'s identity, or the status refusing it.
    fn identity_slot(&self, caller: &auth::Caller) -> Result<limits::IdentityStream, Box<Status>> {
        let identity = caller
            .identities
            .first()
            .map(ToString::to_string)
            .unwrap_or_default();
        self.identity_streams.open(&identity).ok_or_else(|| {
            self.metrics
                .limits_exceeded
                .with_label_values(&[Breach::IdentityStreams.label()])
                .inc();
            if let Some(suppressed) = limits::check_shared(&self.refusals) {
                tracing::warn!(%identity, max = self.identity_streams.max(), suppressed, "refusing xDS stream: too many streams of one identity");
            }
            Box::new(Status::resource_exhausted(format!(
                "{identity} has {} streams open on this server, the most allowed",
                self.identity_streams.max()
            )))
        })
    }

    /// Request messages of `body`: at most `max` bytes each, counted against the
    /// connection's budget while they arrive, each complete in time.
    fn requests<M>(
        &self,
        body: tonic::body::Body,
        max: usize,
        budget: Option<ConnectionBudget>,
    ) -> RequestStream<M> {
        RequestStream::new(body, max)
            .with_budget(budget.map(|b| b.0))
            .with_message_timeout(self.message_timeout)
            .counting(self.metrics.limits_exceeded.clone())
    }

    /// Signs workload certificates with `ca` (`CreateCertificate`, see [`crate::security::ca`]).
    pub fn with_ca(mut self, ca: Reloading<Ca>) -> Self {
        self.ca = Some(ca);
        self
    }

    /// Authenticates streams of TLS connections with `auth` (see [`crate::security::auth`]).
    pub fn with_auth(mut self, auth: Authenticator) -> Self {
        self.auth = auth;
        self
    }

    /// Uses these views (whose generator cache the admin server's `/debug/cachez` shows).
    pub fn with_views(mut self, views: Views) -> Self {
        self.views = views;
        self
    }

    /// Limits how many streams generate a push at the same time.
    pub fn with_push_concurrency(mut self, limit: usize) -> Self {
        self.push_limit = Arc::new(Semaphore::new(limit.max(1)));
        self
    }

    /// The service to serve (tonic routes, a tower service).
    pub fn into_server(self) -> AdsServer {
        AdsServer(self)
    }

    /// Starts a stream: its requests are decoded from the request body, its responses
    /// are written to the response body as they come (see [`super::wire`]).
    fn open<Req, H>(
        &self,
        request: http::Request<tonic::body::Body>,
        mode: Mode,
        handler: impl FnOnce(Session, Responses) -> H,
    ) -> http::Response<tonic::body::Body>
    where
        Req: prost::Message + Default + Send + 'static,
        H: StreamHandler<Req> + 'static,
    {
        let extensions = request.extensions();
        let peer = extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|c| c.remote_addr)
            .map(|a| a.to_string())
            .unwrap_or_else(|| "unknown".into());
        let id = format!("{peer}-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        // Streams of the secure port must authenticate; the plaintext port's are trusted.
        let caller = match Credentials::of(&request) {
            None => None,
            Some(creds) => match self.auth.authenticate(&creds) {
                Ok(caller) => {
                    self.metrics
                        .auth_accepted
                        .with_label_values(&[caller.source])
                        .inc();
                    Some(caller)
                }
                Err(error) => {
                    self.metrics
                        .auth_refused
                        .with_label_values(&[error.reason()])
                        .inc();
                    if let Some(suppressed) = limits::check_shared(&self.refusals) {
                        tracing::warn!(conn = %id, %error, suppressed, "refusing unauthenticated xDS stream");
                    }
                    return error.status().into_http();
                }
            },
        };
        let slot = match caller.as_ref().map(|c| self.identity_slot(c)) {
            Some(Err(refusal)) => return refusal.into_http(),
            Some(Ok(slot)) => Some(slot),
            None => None,
        };
        let session = Session::new(
            id,
            mode,
            self.registry.clone(),
            self.metrics.clone(),
            self.views.clone(),
            caller,
        );
        let ctx = DriveContext {
            snapshots: self.snapshots.clone(),
            close: extensions.get::<ConnectionClose>().map(|c| c.0.clone()),
            push_limit: self.push_limit.clone(),
            refusals: self.refusals.clone(),
        };
        let budget = extensions.get::<ConnectionBudget>().cloned();
        let requests = self.requests::<Req>(request.into_body(), MAX_REQUEST_BYTES, budget);
        let (tx, rx) = mpsc::channel(16);
        let stream = drive(handler(session, tx), requests, ctx);
        tokio::spawn(async move {
            // The identity's slot is held for as long as the stream runs.
            let _slot = slot;
            stream.await
        });
        wire::response(rx)
    }
}

impl AdsService {
    /// `CreateCertificate`: authenticates the caller as a stream would be, then signs its
    /// CSR for its own identity (see [`crate::security::ca`]).
    fn create_certificate(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> http::Response<tonic::body::Body> {
        let count = |result: &str| self.metrics.ca_requests.with_label_values(&[result]).inc();
        let Some(ca) = self.ca.as_ref().map(Reloading::get) else {
            return Status::unimplemented("this server signs no certificates (no --ca-dir)")
                .into_http();
        };
        let caller = match Credentials::of(&request).map(|c| self.auth.authenticate(&c)) {
            Some(Ok(caller)) => caller,
            Some(Err(error)) => {
                count("unauthenticated");
                return error.status().into_http();
            }
            None => {
                count("unauthenticated");
                return Status::unauthenticated("certificates are signed only on the TLS port")
                    .into_http();
            }
        };
        let slot = match self.identity_slot(&caller) {
            Ok(slot) => slot,
            Err(refusal) => return refusal.into_http(),
        };
        let metrics = self.metrics.clone();
        let budget = request.extensions().get::<ConnectionBudget>().cloned();
        let mut requests =
            self.requests::<IstioCertificateRequest>(request.into_body(), MAX_CSR_BYTES, budget);
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            let _slot = slot;
            let outcome = match requests.next().await {
                Some(Ok(req)) => sign(&ca, &caller, &req),
                Some(Err(status)) => Err(("bad_request", status)),
                None => Err(("bad_request", Status::invalid_argument("no request"))),
            };
            let reply = match outcome {
                Ok(response) => {
                    metrics.ca_requests.with_label_values(&["issued"]).inc();
                    Ok(wire::Encoded::new(
                        &response,
                        &crate::push::chunks::Chunks::default(),
                    ))
                }
                Err((result, status)) => {
                    metrics.ca_requests.with_label_values(&[result]).inc();
                    tracing::info!(identities = ?caller.identities, %status, "certificate request refused");
                    Err(Box::new(status))
                }
            };
            let _ = tx.send(reply).await;
        });
        wire::response(rx)
    }
}

/// Signs one request of `caller`: its own identities only.
fn sign(
    ca: &Ca,
    caller: &auth::Caller,
    req: &IstioCertificateRequest,
) -> Result<IstioCertificateResponse, (&'static str, Status)> {
    let impersonated = req
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get("ImpersonatedIdentity"))
        .is_some_and(|v| !matches!(&v.kind, Some(Kind::StringValue(s)) if s.is_empty()));
    if impersonated {
        return Err((
            "impersonation",
            Status::unauthenticated("impersonation (ImpersonatedIdentity) is not allowed"),
        ));
    }
    ca.sign(&req.csr, &caller.identities, req.validity_duration)
        .map(|cert_chain| IstioCertificateResponse { cert_chain })
        .map_err(|e| (e.reason(), Status::invalid_argument(e.to_string())))
}

/// Largest certificate request accepted.
const MAX_CSR_BYTES: usize = 64 << 10;

/// Largest request message accepted (a delta request subscribing to many names is big).
/// Checked against the gRPC length prefix as soon as it arrives; the message's bytes are
/// buffered only as they arrive ([`RequestStream`]).
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// The ADS gRPC service (`envoy.service.discovery.v3.AggregatedDiscoveryService`): both
/// methods, with responses written as shared pre-encoded bytes.
#[derive(Clone)]
pub struct AdsServer(AdsService);

/// The same service under Istio's certificate service name, so routing by service name
/// reaches `CreateCertificate` ([`AdsService::with_ca`]).
#[derive(Clone)]
pub struct CertificateServer(pub AdsServer);

impl tonic::server::NamedService for CertificateServer {
    const NAME: &'static str = "istio.v1.auth.IstioCertificateService";
}

impl tower_service::Service<http::Request<tonic::body::Body>> for CertificateServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        self.0.call(request)
    }
}

impl tonic::server::NamedService for AdsServer {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl tower_service::Service<http::Request<tonic::body::Body>> for AdsServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let response = match request.uri().path() {
            DELTA_PATH => {
                self.0
                    .open::<DeltaDiscoveryRequest, _>(request, Mode::Delta, DeltaStream::new)
            }
            SOTW_PATH => self
                .0
                .open::<DiscoveryRequest, _>(request, Mode::Sotw, SotwStream::new),
            CREATE_CERTIFICATE_PATH => self.0.create_certificate(request),
            path => Status::unimplemented(format!("no method {path}")).into_http(),
        };
        std::future::ready(Ok(response))
    }
}

/// What a stream needs from outside itself.
pub(crate) struct DriveContext {
    snapshots: watch::Receiver<Option<Published>>,
    /// Turns true when the connection is aged out or drained.
    close: Option<watch::Receiver<bool>>,
    push_limit: Arc<Semaphore>,
    /// Rate limit of the warning logged when a stream is refused.
    refusals: SharedWarnLimiter,
}

#[cfg(test)]
impl DriveContext {
    /// A context for driving a stream in-process (tests): no connection to close.
    pub(crate) fn for_tests(
        snapshots: watch::Receiver<Option<Published>>,
        push_limit: usize,
        refusals: SharedWarnLimiter,
    ) -> Self {
        DriveContext {
            snapshots,
            close: None,
            push_limit: Arc::new(Semaphore::new(push_limit)),
            refusals,
        }
    }
}

/// Drives a stream: waits for the first snapshot (serving nothing before the initial state
/// is loaded, since an empty config would tear down a proxy's working one), then
/// interleaves requests and snapshot pushes until either side ends or the connection is
/// closed. Pushes regenerate only the types a change affects, at most `push_limit` streams
/// at a time; a stream never queues more than one pending push (the watch channel keeps
/// only the newest snapshot).
pub(crate) async fn drive<Req, H, S>(mut handler: H, mut requests: S, ctx: DriveContext)
where
    H: StreamHandler<Req>,
    S: futures::Stream<Item = Result<Req, Status>> + Unpin,
{
    let DriveContext {
        mut snapshots,
        close,
        push_limit,
        refusals,
    } = ctx;
    let Ok(first) = snapshots.wait_for(|s| s.is_some()).await.map(|s| s.clone()) else {
        return;
    };
    let mut last = first.as_ref().map(|p| p.snapshot.number).unwrap_or(0);
    let mut current = first.map(|p| p.snapshot);
    let mut close = close;
    let (reason, error) = loop {
        tokio::select! {
            req = requests.next() => match req {
                None => break ("proxy_closed", None),
                // The request body failed (a reset, a broken connection): nobody to
                // answer.
                Some(Err(status)) if status.code() == tonic::Code::Cancelled => {
                    tracing::debug!(conn = %handler.session().id, %status, "stream error");
                    break ("stream_error", None);
                }
                // A request refused as it was read (too big, undecodable, a budget or
                // deadline passed): the proxy is told why, in the stream's status.
                Some(Err(status)) => break ("refused", Some(status)),
                Some(Ok(req)) => {
                    let Some(snap) = current.clone() else { continue };
                    if let Err(status) = handler.on_request(req, &snap).await {
                        break (failure_reason(&status), Some(status));
                    }
                }
            },
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break ("server_closed", None);
                }
                let published = snapshots.borrow_and_update().clone();
                let Some(mut p) = published else { continue };
                current = Some(p.snapshot.clone());
                let mut types = if handler.session().identified() {
                    handler.session().affected(&p, last)
                } else {
                    BTreeSet::new()
                };
                last = p.snapshot.number;
                if types.is_empty() {
                    continue;
                }
                let Ok(_permit) = push_limit.acquire().await else {
                    break ("server_closed", None);
                };
                // Snapshots published while this stream waited for its turn: push the
                // newest (its changes join these). The views have moved on to it, and
                // generating a superseded snapshot for this stream alone would cost a
                // whole output, however little changed.
                if snapshots.has_changed().unwrap_or(false) {
                    if let Some(newer) = snapshots.borrow_and_update().clone() {
                        if handler.session().identified() {
                            types.extend(handler.session().affected(&newer, last));
                        }
                        last = newer.snapshot.number;
                        current = Some(newer.snapshot.clone());
                        p = newer;
                    }
                }
                let mut failed = None;
                for ty in handler.watched_types().into_iter().filter(|t| types.contains(t)) {
                    if let Err(status) = handler.push(ty, &p.snapshot, p.observed_at_ms).await {
                        failed = Some(status);
                        break;
                    }
                }
                if let Some(status) = failed {
                    break (failure_reason(&status), Some(status));
                }
            }
            _ = connection_closed(&mut close) => {
                tracing::debug!(conn = %handler.session().id, "connection closing; ending stream");
                break ("server_closed", None);
            }
        }
    };
    // The session unregisters the stream and counts the reason when dropped, also when
    // this task panics (reason `aborted`).
    handler.session_mut().close_reason = reason;
    if let Some(status) = error {
        if status.code() != tonic::Code::Cancelled {
            if let Some(suppressed) = limits::check_shared(&refusals) {
                tracing::warn!(conn = %handler.session().id, %status, suppressed, "closing xDS stream");
            }
        }
        handler.fail(status).await;
    }
}

/// The close reason of a stream that ended with `status`: a response that could not be
/// written (the proxy is gone), or a refused request.
fn failure_reason(status: &Status) -> &'static str {
    if status.code() == tonic::Code::Cancelled {
        "send_failed"
    } else {
        "refused"
    }
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

#[cfg(test)]
mod merge_tests {
    //! A stream busy with a push never queues more: snapshots published meanwhile merge into
    //! one push of the newest.
    use super::*;
    use crate::generate::Snapshot;
    use crate::push::pipeline::ChangeSet;
    use shoal_proto::XdsType;
    use std::sync::Mutex;
    use tokio::sync::Notify;

    struct Recorder {
        session: Session,
        pushed: Arc<Mutex<Vec<(u64, XdsType)>>>,
        gate: Arc<Notify>,
    }

    #[tonic::async_trait]
    impl StreamHandler<()> for Recorder {
        fn session(&self) -> &Session {
            &self.session
        }
        fn session_mut(&mut self) -> &mut Session {
            &mut self.session
        }
        async fn on_request(&mut self, _req: (), _snap: &Arc<Snapshot>) -> Result<(), Status> {
            Ok(())
        }
        fn watched_types(&self) -> Vec<XdsType> {
            vec![XdsType::Cluster]
        }
        async fn push(
            &mut self,
            ty: XdsType,
            snap: &Arc<Snapshot>,
            _obs: Option<u64>,
        ) -> Result<(), Status> {
            self.pushed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((snap.number, ty));
            // Stay busy until the test lets this push finish.
            self.gate.notified().await;
            Ok(())
        }
        async fn fail(&mut self, _status: Status) {}
    }

    fn published(number: u64) -> Option<Published> {
        Some(Published {
            snapshot: Arc::new(Snapshot {
                ctx: Default::default(),
                endpoints: Default::default(),
                number,
            }),
            observed_at_ms: None,
            changes: Arc::new(ChangeSet {
                full: true,
                ..Default::default()
            }),
            published_at_ms: 0,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn snapshots_published_during_a_push_merge_into_one() {
        let metrics = Metrics::new();
        let cache = GeneratorCache::new(1 << 20, false, metrics.clone());
        let views = Views::new(Generation::new(cache, 1));
        let mut session = Session::new(
            "t".into(),
            Mode::Sotw,
            Registry::default(),
            metrics,
            views,
            None,
        );
        let node = crate::index::proxy::tests::node(
            "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local",
            "ns",
            &[],
        );
        session.identify(Some(&node)).expect("valid node");
        let pushed = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let handler = Recorder {
            session,
            pushed: pushed.clone(),
            gate: gate.clone(),
        };
        let (tx, rx) = watch::channel(published(1));
        let ctx = DriveContext {
            snapshots: rx,
            close: None,
            push_limit: Arc::new(Semaphore::new(10)),
            refusals: SharedWarnLimiter::default(),
        };
        let task = tokio::spawn(drive(
            handler,
            futures::stream::pending::<Result<(), Status>>(),
            ctx,
        ));
        let pushes = || pushed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Let the stream start on snapshot 1.
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;

        tx.send(published(2)).expect("stream alive");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(
            pushes(),
            vec![(2, XdsType::Cluster)],
            "snapshot 2 is being pushed"
        );
        // Busy: three more snapshots arrive.
        for n in 3..=5 {
            tx.send(published(n)).expect("stream alive");
        }
        gate.notify_one();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        gate.notify_one();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(
            pushes(),
            vec![(2, XdsType::Cluster), (5, XdsType::Cluster)],
            "3 and 4 merged into the push of 5"
        );
        task.abort();
    }

    /// A stream that waits for a push permit while newer snapshots arrive pushes the newest
    /// (with the changes of the ones it skipped), never a superseded one.
    #[tokio::test(start_paused = true)]
    async fn a_stream_waiting_for_its_turn_pushes_the_newest_snapshot() {
        let metrics = Metrics::new();
        let cache = GeneratorCache::new(1 << 20, false, metrics.clone());
        let views = Views::new(Generation::new(cache, 1));
        let mut session = Session::new(
            "t".into(),
            Mode::Sotw,
            Registry::default(),
            metrics,
            views,
            None,
        );
        let node = crate::index::proxy::tests::node(
            "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local",
            "ns",
            &[],
        );
        session.identify(Some(&node)).expect("valid node");
        let pushed = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let handler = Recorder {
            session,
            pushed: pushed.clone(),
            gate: gate.clone(),
        };
        let (tx, rx) = watch::channel(published(1));
        let push_limit = Arc::new(Semaphore::new(1));
        // Another stream holds the only permit.
        let busy = push_limit.clone().acquire_owned().await.expect("permit");
        let ctx = DriveContext {
            snapshots: rx,
            close: None,
            push_limit,
            refusals: SharedWarnLimiter::default(),
        };
        let task = tokio::spawn(drive(
            handler,
            futures::stream::pending::<Result<(), Status>>(),
            ctx,
        ));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        tx.send(published(2)).expect("stream alive");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        tx.send(published(3)).expect("stream alive");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        drop(busy);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        gate.notify_one();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(
            pushed.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            vec![(3, XdsType::Cluster)],
            "snapshot 2 was superseded while the stream waited"
        );
        task.abort();
    }
}
