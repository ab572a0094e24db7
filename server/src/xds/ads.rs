//! The ADS gRPC service: State-of-the-World and delta streams on one port.

use super::delta::DeltaStream;
use super::limits::{self, Breach, IdentityStreams, SharedWarnLimiter};
use super::listener::{ConnectionBudget, ConnectionClose};
use super::registry::Registry;
use super::session::{Mode, Session};
use super::sotw::SotwStream;
use super::stream::{drive, DriveContext, StreamHandler};
use super::wire::{self, RequestStream, Responses};
use crate::push::pipeline::Published;
use crate::push::view::Views;
use crate::security::auth::{self, Authenticator, Credentials, Issuers};
use crate::security::ca::{Ca, CaResult};
use crate::security::reload::Reloading;
use crate::xds::metrics::XdsMetrics;
use futures::StreamExt;
use shoal_proto::istio_ca::{
    IstioCertificateRequest, IstioCertificateResponse, CREATE_CERTIFICATE_PATH,
};
use shoal_proto::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use shoal_proto::pb::google::protobuf::value::Kind;
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
    metrics: XdsMetrics,
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

/// Istio's default push concurrency (`PILOT_PUSH_THROTTLE`).
pub const DEFAULT_PUSH_CONCURRENCY: usize = 100;

/// How the ADS service serves: every setting the flags give it, each default stated once
/// ([`AdsConfig::default`], which the tests use; `app.rs` fills it from the flags).
pub struct AdsConfig {
    /// How many streams generate a push at the same time.
    pub push_concurrency: usize,
    /// Authenticates streams of TLS connections (see [`crate::security::auth`]).
    pub auth: Authenticator,
    /// Signs workload certificates (`CreateCertificate`, see [`crate::security::ca`]).
    pub ca: Option<Reloading<Ca>>,
    /// Time a started request message has to arrive completely (None: no limit).
    pub message_timeout: Option<std::time::Duration>,
    /// Streams one authenticated identity may open.
    pub max_streams_per_identity: usize,
}

impl Default for AdsConfig {
    fn default() -> Self {
        AdsConfig {
            push_concurrency: DEFAULT_PUSH_CONCURRENCY,
            auth: Authenticator::new(
                Issuers::default(),
                vec![auth::DEFAULT_AUDIENCE.to_string()],
                shoal_common::defaults::TRUST_DOMAIN,
            ),
            ca: None,
            message_timeout: Some(limits::DEFAULT_MESSAGE_TIMEOUT),
            max_streams_per_identity: limits::DEFAULT_MAX_STREAMS_PER_IDENTITY,
        }
    }
}

impl AdsService {
    /// A service pushing the snapshots published on `snapshots`, generating through
    /// `views` (whose generator cache the admin server's `/debug/cachez` shows).
    pub fn new(
        snapshots: watch::Receiver<Option<Published>>,
        registry: Registry,
        metrics: XdsMetrics,
        views: Views,
        config: AdsConfig,
    ) -> Self {
        AdsService {
            snapshots,
            registry,
            metrics,
            next_id: Arc::new(AtomicU64::new(1)),
            push_limit: Arc::new(Semaphore::new(config.push_concurrency.max(1))),
            views,
            auth: config.auth,
            refusals: SharedWarnLimiter::default(),
            ca: config.ca,
            message_timeout: config.message_timeout,
            identity_streams: IdentityStreams::new(config.max_streams_per_identity),
        }
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
                        .with_label_values(&[caller.source.as_str()])
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
        let count = |result: CaResult| {
            self.metrics
                .ca_requests
                .with_label_values(&[result.as_str()])
                .inc()
        };
        let Some(ca) = self.ca.as_ref().map(Reloading::get) else {
            return Status::unimplemented("this server signs no certificates (no --ca-dir)")
                .into_http();
        };
        let caller = match Credentials::of(&request).map(|c| self.auth.authenticate(&c)) {
            Some(Ok(caller)) => caller,
            Some(Err(error)) => {
                count(CaResult::Unauthenticated);
                return error.status().into_http();
            }
            None => {
                count(CaResult::Unauthenticated);
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
        // Which pods run on which node (impersonation), as of the newest snapshot.
        let endpoints = self
            .snapshots
            .borrow()
            .as_ref()
            .map(|p| p.snapshot.endpoints.clone());
        let mut requests =
            self.requests::<IstioCertificateRequest>(request.into_body(), MAX_CSR_BYTES, budget);
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            let _slot = slot;
            let outcome = match requests.next().await {
                Some(Ok(req)) => sign(&ca, &caller, &req, endpoints.as_deref()),
                Some(Err(status)) => Err((CaResult::BadRequest, status)),
                None => Err((CaResult::BadRequest, Status::invalid_argument("no request"))),
            };
            let reply = match outcome {
                Ok(response) => {
                    metrics
                        .ca_requests
                        .with_label_values(&[CaResult::Issued.as_str()])
                        .inc();
                    Ok(wire::Encoded::new(
                        &response,
                        &crate::push::chunks::Chunks::default(),
                    ))
                }
                Err((result, status)) => {
                    metrics
                        .ca_requests
                        .with_label_values(&[result.as_str()])
                        .inc();
                    tracing::info!(identities = ?caller.identities, %status, "certificate request refused");
                    Err(Box::new(status))
                }
            };
            let _ = tx.send(reply).await;
        });
        wire::response(rx)
    }
}

/// Signs one request of `caller`: its own identities, or for a node agent the identity it
/// impersonates, if a pod of it runs on the agent's node (see [`crate::security::ca`]).
fn sign(
    ca: &Ca,
    caller: &auth::Caller,
    req: &IstioCertificateRequest,
    endpoints: Option<&crate::index::endpoints::EndpointIndex>,
) -> Result<IstioCertificateResponse, (CaResult, Status)> {
    let impersonated = req
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get("ImpersonatedIdentity"))
        .filter(|v| !matches!(&v.kind, Some(Kind::StringValue(s)) if s.is_empty()));
    let identities = match impersonated {
        None => caller.identities.clone(),
        Some(v) => vec![impersonate(caller, v, endpoints)?],
    };
    ca.sign(&req.csr, &identities, req.validity_duration)
        .map(|cert_chain| IstioCertificateResponse { cert_chain })
        .map_err(|e| (e.result(), Status::invalid_argument(e.to_string())))
}

/// The identity a node agent may impersonate: `value` (a SPIFFE identity of the caller's
/// trust domain) when the caller is a node agent whose token names its node, and a pod of
/// that identity runs there.
fn impersonate(
    caller: &auth::Caller,
    value: &shoal_proto::pb::google::protobuf::Value,
    endpoints: Option<&crate::index::endpoints::EndpointIndex>,
) -> Result<auth::Identity, (CaResult, Status)> {
    let refuse = |result: CaResult, why: String| Err((result, Status::unauthenticated(why)));
    let Some(agent) = caller.identities.iter().find(|id| {
        crate::security::ca::NODE_AGENT_ACCOUNTS
            .iter()
            .any(|(ns, sa)| id.namespace == *ns && id.service_account == *sa)
    }) else {
        return refuse(
            CaResult::ImpersonationNotNodeAgent,
            format!(
                "impersonation (ImpersonatedIdentity) is allowed to node agents only, not to {}",
                caller.describe()
            ),
        );
    };
    let Some(node) = caller.node.as_deref() else {
        return refuse(
            CaResult::ImpersonationUnknownNode,
            "impersonation needs a token that names the caller's node (kubernetes.io.node)".into(),
        );
    };
    let requested = match &value.kind {
        Some(Kind::StringValue(s)) => auth::Identity::parse(s),
        _ => None,
    };
    let Some(target) = requested.filter(|id| id.trust_domain == agent.trust_domain) else {
        return refuse(
            CaResult::ImpersonationBadIdentity,
            format!(
                "ImpersonatedIdentity {value:?} is not a SPIFFE identity of trust domain {}",
                agent.trust_domain
            ),
        );
    };
    let on_node = endpoints.is_some_and(|index| {
        index.iter().any(|(_, shards)| {
            shards.values().any(|set| {
                set.namespace == target.namespace
                    && set
                        .endpoints
                        .iter()
                        .any(|ep| ep.node == node && ep.service_account == target.service_account)
            })
        })
    });
    if !on_node {
        return refuse(
            CaResult::ImpersonationNotOnNode,
            format!("no pod of {target} runs on node {node:?}"),
        );
    }
    Ok(target)
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

#[cfg(test)]
mod impersonation_tests {
    use super::*;
    use crate::index::endpoints::EndpointIndex;
    use crate::index::proxy::ProvenCluster;
    use crate::security::auth::{Caller, CredentialSource, Identity};
    use crate::testutil::{endpoint, slice};
    use shoal_proto::pb::google::protobuf::Value;

    fn id(ns: &str, sa: &str) -> Identity {
        Identity {
            trust_domain: "cluster.local".into(),
            namespace: ns.into(),
            service_account: sa.into(),
        }
    }

    fn caller(identity: Identity, node: Option<&str>) -> Caller {
        Caller {
            identities: vec![identity],
            source: CredentialSource::Token,
            cluster: ProvenCluster::Token("Kubernetes".into()),
            node: node.map(str::to_string),
        }
    }

    fn index() -> EndpointIndex {
        let mut index = EndpointIndex::default();
        let mut ep = endpoint("10.1.0.10", &[]);
        ep.node = "node-1".into();
        ep.service_account = "web".into();
        ep.pod = "web-1".into();
        index.upsert(
            "web.demo.svc.cluster.local",
            slice("demo", "web", "web-a", &[("http", 8080)], vec![ep]),
        );
        index
    }

    fn ask(caller: &Caller, who: &str) -> Result<Identity, CaResult> {
        let v = Value {
            kind: Some(Kind::StringValue(who.into())),
        };
        impersonate(caller, &v, Some(&index())).map_err(|(r, _)| r)
    }

    #[test]
    fn a_ztunnel_impersonates_only_pods_of_its_node() {
        let web = "spiffe://cluster.local/ns/demo/sa/web";
        let z1 = caller(id("istio-system", "ztunnel"), Some("node-1"));
        assert_eq!(ask(&z1, web), Ok(id("demo", "web")));
        let z2 = caller(id("istio-system", "ztunnel"), Some("node-2"));
        assert_eq!(ask(&z2, web), Err(CaResult::ImpersonationNotOnNode));
        assert_eq!(
            ask(&z1, "spiffe://cluster.local/ns/demo/sa/other"),
            Err(CaResult::ImpersonationNotOnNode)
        );
        assert_eq!(
            ask(&z1, "spiffe://other.domain/ns/demo/sa/web"),
            Err(CaResult::ImpersonationBadIdentity)
        );
        assert_eq!(ask(&z1, "web"), Err(CaResult::ImpersonationBadIdentity));
        let nameless = caller(id("istio-system", "ztunnel"), None);
        assert_eq!(ask(&nameless, web), Err(CaResult::ImpersonationUnknownNode));
        let app = caller(id("demo", "client"), Some("node-1"));
        assert_eq!(ask(&app, web), Err(CaResult::ImpersonationNotNodeAgent));
    }
}
