//! The replay baseline: a minimal ADS server (`shoal-replay`, src/bin/shoal-replay.rs) that
//! answers each proxy with the resources shoal sent a proxy of the same class, recorded
//! earlier in the same run and encoded once when it starts.
//!
//! It does no generation: every recorded resource is encoded up front as the bytes of a
//! `resources` field of a response (a delta `Resource`, or a SotW `Any`), and a response is
//! those bytes, looked up by class, type and name, plus a few bytes of header (type URL,
//! nonce, version). The protocol is followed only as far as the benchmark's proxies need:
//!
//! - the first request of a stream names the node; its class ([`ProxyClass`]: namespace,
//!   label `app`, interception mode) selects the recording, an unknown class ends the
//!   stream with `NOT_FOUND`;
//! - CDS and LDS are wildcard: the first request of the type gets every recorded resource
//!   of the class (delta: minus those `initial_resource_versions` already has);
//! - EDS and RDS: delta, every subscribe gets the named resources that are recorded (and
//!   not already held); SotW, a request whose names differ from the last answered ones
//!   gets all the named resources that are recorded;
//! - ACKs and NACKs get nothing;
//! - on the admin address, `/push/endpoint?host=H&ip=A` pushes the assignments of service
//!   `H` (every port) with one more endpoint, `A`, and `/push/route?name=N&marker=M` the
//!   route tables named `N` with a request header of value `M`, to every delta stream
//!   that holds them, each distinct resource encoded once: the floor of what shoal's
//!   endpoint and VirtualService changes cost ([`Replay::push`]).
//!
//! The recording ([`Recording`], a protobuf file) holds each distinct resource once
//! (type, name, version, bytes) and, per class, the indices of the resources it holds.

use super::client::{ProxyClass, RecordedItem};
use anyhow::{bail, Context};
use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use shoal_proto::pb::envoy::config::core::v3::{address, HeaderValue, HeaderValueOption, Node};
use shoal_proto::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use shoal_proto::pb::envoy::config::route::v3::RouteConfiguration;
use shoal_proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse, Resource,
};
use shoal_proto::pb::google::protobuf::value::Kind;
use shoal_proto::{Any, XdsType};
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Status, Streaming};

// ---------------------------------------------------------------------------------------
// The recording

/// What the recording clients received from shoal, per proxy class.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Recording {
    /// Every distinct resource.
    #[prost(message, repeated, tag = "1")]
    pub resources: Vec<RecordedResource>,
    /// Every class.
    #[prost(message, repeated, tag = "2")]
    pub classes: Vec<RecordedClass>,
}

/// One resource as shoal sent it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RecordedResource {
    /// Its type URL.
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// Its name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Its version (delta).
    #[prost(string, tag = "3")]
    pub version: String,
    /// Its bytes (the `Any` value).
    #[prost(bytes = "vec", tag = "4")]
    pub value: Vec<u8>,
}

/// What the proxies of one class hold.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RecordedClass {
    /// Node metadata `NAMESPACE`.
    #[prost(string, tag = "1")]
    pub namespace: String,
    /// Label `app`.
    #[prost(string, tag = "2")]
    pub app: String,
    /// Node metadata `INTERCEPTION_MODE`, when sent.
    #[prost(string, optional, tag = "3")]
    pub interception: Option<String>,
    /// Indices in [`Recording::resources`] of everything the class holds, all types.
    #[prost(uint32, repeated, tag = "4")]
    pub resources: Vec<u32>,
}

impl Recording {
    /// Writes the recording to `path`; returns its size in bytes.
    pub fn write(&self, path: &Path) -> anyhow::Result<u64> {
        let bytes = self.encode_to_vec();
        std::fs::write(path, &bytes)
            .with_context(|| format!("writing the recording {}", path.display()))?;
        Ok(bytes.len() as u64)
    }

    /// Reads a recording written by [`Recording::write`].
    pub fn read(path: &Path) -> anyhow::Result<Recording> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading the recording {}", path.display()))?;
        Recording::decode(bytes.as_slice())
            .with_context(|| format!("decoding the recording {}", path.display()))
    }
}

/// Builds a [`Recording`], storing each distinct resource once.
#[derive(Default)]
pub struct RecordingBuilder {
    recording: Recording,
    index: HashMap<(XdsType, String, String), u32>,
}

impl RecordingBuilder {
    /// Adds what the proxies of `class` hold. A class added twice keeps the first.
    pub fn add_class(&mut self, class: &ProxyClass, items: Vec<RecordedItem>) {
        if self.recording.classes.iter().any(|c| {
            c.namespace == class.namespace
                && c.app == class.app
                && c.interception == class.interception
        }) {
            return;
        }
        let mut resources = Vec::with_capacity(items.len());
        for item in items {
            let key = (item.ty, item.name, item.version);
            let i = match self.index.get(&key) {
                Some(i) => *i,
                None => {
                    let i = self.recording.resources.len() as u32;
                    let (ty, name, version) = key.clone();
                    self.recording.resources.push(RecordedResource {
                        type_url: ty.type_url().to_string(),
                        name,
                        version,
                        value: item.value,
                    });
                    self.index.insert(key, i);
                    i
                }
            };
            resources.push(i);
        }
        self.recording.classes.push(RecordedClass {
            namespace: class.namespace.clone(),
            app: class.app.clone(),
            interception: class.interception.clone(),
            resources,
        });
    }

    /// The recording.
    pub fn finish(self) -> Recording {
        self.recording
    }
}

// ---------------------------------------------------------------------------------------
// The server's state

/// One resource, encoded once as the `resources` field (2) of a response.
struct Encoded {
    name: String,
    version: String,
    /// Field 2 of a `DeltaDiscoveryResponse`: a `Resource` with name, version and `Any`.
    delta: Bytes,
    /// Field 2 of a `DiscoveryResponse`: the `Any`.
    sotw: Bytes,
    /// The `Any` value's length (what shoal counts in `shoal_xds_push_bytes_total`).
    value_len: u64,
}

impl Encoded {
    /// `any`, named `name` at `version`, encoded for both protocols.
    fn new(name: String, version: String, any: Any) -> Encoded {
        let value_len = any.value.len() as u64;
        let mut sotw = BytesMut::new();
        prost::encoding::message::encode(2, &any, &mut sotw);
        let resource = Resource {
            name: name.clone(),
            version: version.clone(),
            resource: Some(any),
            ..Default::default()
        };
        let mut delta = BytesMut::new();
        prost::encoding::message::encode(2, &resource, &mut delta);
        Encoded {
            name,
            version,
            delta: delta.freeze(),
            sotw: sotw.freeze(),
            value_len,
        }
    }
}

/// Resources pushed to every stream that holds them ([`Replay::push`]): each new
/// resource under the name and recorded version it replaces, so that a stream takes the
/// one its class holds (route tables differ by namespace).
struct Pushed {
    ty: XdsType,
    replaced: HashMap<(String, String), Arc<Encoded>>,
}

/// What a push changes in the recorded resources.
#[derive(Debug, Clone)]
pub enum PushEdit {
    /// The assignments of a service (`outbound|<port>||<host>`, every port) get one more
    /// endpoint at `ip`: a copy of each one's first, on its port.
    Endpoint { host: String, ip: String },
    /// The route tables named `name` get a request header `x-bench-change: <marker>`.
    Route { name: String, marker: String },
}

impl PushEdit {
    fn ty(&self) -> XdsType {
        match self {
            PushEdit::Endpoint { .. } => XdsType::Endpoint,
            PushEdit::Route { .. } => XdsType::Route,
        }
    }

    fn applies_to(&self, name: &str) -> bool {
        match self {
            PushEdit::Endpoint { host, .. } => {
                name.starts_with("outbound|")
                    && name
                        .strip_suffix(host.as_str())
                        .is_some_and(|n| n.ends_with("||"))
            }
            PushEdit::Route { name: n, .. } => name == n,
        }
    }

    /// The resource `name`'s recorded `value`, edited.
    fn apply(&self, name: &str, value: &[u8]) -> Result<Vec<u8>, String> {
        let undecodable =
            |e: prost::DecodeError| format!("the recorded {name:?} does not decode: {e}");
        match self {
            PushEdit::Endpoint { ip, .. } => {
                let mut cla = ClusterLoadAssignment::decode(value).map_err(undecodable)?;
                let endpoints = &mut cla
                    .endpoints
                    .first_mut()
                    .ok_or_else(|| format!("the recorded assignment {name:?} has no locality"))?
                    .lb_endpoints;
                let mut added = endpoints
                    .first()
                    .cloned()
                    .ok_or_else(|| format!("the recorded assignment {name:?} has no endpoint"))?;
                let socket = match &mut added.host_identifier {
                    Some(lb_endpoint::HostIdentifier::Endpoint(e)) => {
                        match e.address.as_mut().and_then(|a| a.address.as_mut()) {
                            Some(address::Address::SocketAddress(socket)) => Some(socket),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                socket
                    .ok_or_else(|| format!("the first endpoint of {name:?} has no socket address"))?
                    .address = ip.clone();
                endpoints.push(added);
                Ok(cla.encode_to_vec())
            }
            PushEdit::Route { marker, .. } => {
                let mut rc = RouteConfiguration::decode(value).map_err(undecodable)?;
                rc.request_headers_to_add.push(HeaderValueOption {
                    header: Some(HeaderValue {
                        key: "x-bench-change".into(),
                        value: marker.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                Ok(rc.encode_to_vec())
            }
        }
    }
}

/// One class's resources of one type.
#[derive(Default)]
struct TypeSet {
    all: Vec<Arc<Encoded>>,
    by_name: HashMap<String, Arc<Encoded>>,
}

/// One class's resources, by type (in [`XdsType::ALL`] order).
#[derive(Default)]
struct ClassSet {
    types: [TypeSet; 7],
}

fn type_index(ty: XdsType) -> usize {
    match ty {
        XdsType::Cluster => 0,
        XdsType::Endpoint => 1,
        XdsType::Listener => 2,
        XdsType::Route => 3,
        XdsType::Secret => 4,
        XdsType::Address => 5,
        XdsType::Authorization => 6,
    }
}

/// Counters served on `/metrics` under shoal's names, so that the benchmark measures the
/// replay server as it measures shoal.
#[derive(Default)]
struct Stats {
    connections: AtomicI64,
    pushes: AtomicU64,
    push_bytes: AtomicU64,
    resources_sent: AtomicU64,
    unknown_class: AtomicU64,
}

/// Counts a stream while it lives.
struct StreamGuard<'a>(&'a Stats);

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The replay server's state: the recording, encoded.
pub struct Replay {
    classes: HashMap<ProxyClass, Arc<ClassSet>>,
    resources: usize,
    stats: Stats,
    /// Every distinct recorded resource (what [`Replay::push`] edits).
    recorded: Vec<(XdsType, Arc<Encoded>)>,
    /// Pushes, to every stream.
    pushes: broadcast::Sender<Arc<Pushed>>,
    /// Pushes made (their versions).
    pushed: AtomicU64,
}

impl Replay {
    /// Encodes every resource of `recording` once.
    pub fn new(recording: Recording) -> anyhow::Result<Replay> {
        let mut encoded = Vec::with_capacity(recording.resources.len());
        for r in recording.resources {
            let Some(ty) = XdsType::from_type_url(&r.type_url) else {
                bail!(
                    "recorded resource {:?} has unknown type {}",
                    r.name,
                    r.type_url
                );
            };
            let any = Any {
                type_url: r.type_url,
                value: r.value,
            };
            encoded.push((ty, Arc::new(Encoded::new(r.name, r.version, any))));
        }
        let mut classes = HashMap::new();
        for c in recording.classes {
            let mut set = ClassSet::default();
            for i in c.resources {
                let Some((ty, e)) = encoded.get(i as usize) else {
                    bail!(
                        "class {}/{}: resource index {i} out of range",
                        c.namespace,
                        c.app
                    );
                };
                let t = &mut set.types[type_index(*ty)];
                t.all.push(e.clone());
                t.by_name.insert(e.name.clone(), e.clone());
            }
            let class = ProxyClass {
                namespace: c.namespace,
                app: c.app,
                interception: c.interception,
            };
            classes.insert(class, Arc::new(set));
        }
        Ok(Replay {
            classes,
            resources: encoded.len(),
            stats: Stats::default(),
            recorded: encoded,
            pushes: broadcast::channel(16).0,
            pushed: AtomicU64::new(0),
        })
    }

    /// Pushes the recorded resources `edit` applies to, edited, as a new version, in one
    /// response to every delta stream that holds them: the work of a change without any of
    /// the generation. Each distinct recorded resource is edited and encoded once, its
    /// version the recorded one with `+replay-push-<n>` appended. Returns `replay-push-<n>`.
    pub fn push(&self, edit: &PushEdit) -> Result<String, String> {
        let ty = edit.ty();
        let n = self.pushed.fetch_add(1, Ordering::Relaxed) + 1;
        let version = format!("replay-push-{n}");
        let mut replaced = HashMap::new();
        for (_, old) in self
            .recorded
            .iter()
            .filter(|(t, e)| *t == ty && edit.applies_to(&e.name))
        {
            // The recorded `Any`, back from its encoding as field 2 of a SotW response.
            let any = DiscoveryResponse::decode(old.sotw.clone())
                .ok()
                .and_then(|r| r.resources.into_iter().next())
                .ok_or_else(|| format!("the recorded {:?} does not decode", old.name))?;
            let any = Any {
                value: edit.apply(&old.name, &any.value)?,
                ..any
            };
            // Distinct contents, distinct versions (route tables differ by namespace).
            let new = Encoded::new(old.name.clone(), format!("{}+{version}", old.version), any);
            replaced.insert((old.name.clone(), old.version.clone()), Arc::new(new));
        }
        if replaced.is_empty() {
            return Err(format!("no recorded resource matches {edit:?}"));
        }
        // No stream subscribed (no receiver) is no error: nobody holds them.
        let _ = self.pushes.send(Arc::new(Pushed { ty, replaced }));
        Ok(version)
    }

    /// Classes recorded.
    pub fn classes(&self) -> usize {
        self.classes.len()
    }

    /// Distinct resources recorded.
    pub fn resources(&self) -> usize {
        self.resources
    }

    /// `/metrics`, in the Prometheus text format, with shoal's metric names.
    pub fn metrics_text(&self) -> String {
        let s = &self.stats;
        format!(
            "shoal_xds_connections {}\nshoal_xds_pushes_total {}\nshoal_xds_push_bytes_total {}\n\
             shoal_xds_resources_sent_total {}\nshoal_replay_unknown_class_total {}\n",
            s.connections.load(Ordering::Relaxed),
            s.pushes.load(Ordering::Relaxed),
            s.push_bytes.load(Ordering::Relaxed),
            s.resources_sent.load(Ordering::Relaxed),
            s.unknown_class.load(Ordering::Relaxed),
        )
    }

    fn stream_started(&self) -> StreamGuard<'_> {
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        StreamGuard(&self.stats)
    }

    /// The class of the stream's node.
    fn class_of(&self, node: Option<&Node>) -> Result<Arc<ClassSet>, Status> {
        let class = node.and_then(class_of_node);
        match class.as_ref().and_then(|c| self.classes.get(c)) {
            Some(set) => Ok(set.clone()),
            None => {
                self.stats.unknown_class.fetch_add(1, Ordering::Relaxed);
                Err(Status::not_found(match class {
                    Some(c) => format!("no recording for proxy class {c}"),
                    None => "the first request names no node (or one without NAMESPACE)".into(),
                }))
            }
        }
    }

    /// A response: header (version, type URL, nonce), then the resources' bytes.
    fn frame(&self, ty: XdsType, nonce: u64, sotw: bool, items: &[&Arc<Encoded>]) -> Frame {
        let mut header = BytesMut::with_capacity(128);
        let nonce = nonce.to_string();
        if sotw {
            // The nonce doubles as the version: every answer is a new state for the proxy.
            prost::encoding::string::encode(1, &nonce, &mut header);
        }
        prost::encoding::string::encode(4, &ty.type_url().to_string(), &mut header);
        prost::encoding::string::encode(5, &nonce, &mut header);
        let mut chunks = Vec::with_capacity(items.len() + 1);
        chunks.push(header.freeze());
        let mut bytes = 0;
        for e in items {
            chunks.push(if sotw {
                e.sotw.clone()
            } else {
                e.delta.clone()
            });
            bytes += e.value_len;
        }
        let s = &self.stats;
        s.pushes.fetch_add(1, Ordering::Relaxed);
        s.push_bytes.fetch_add(bytes, Ordering::Relaxed);
        s.resources_sent
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        Frame(chunks)
    }
}

/// A node's class: metadata `NAMESPACE`, `LABELS.app`, `INTERCEPTION_MODE`.
fn class_of_node(node: &Node) -> Option<ProxyClass> {
    let fields = &node.metadata.as_ref()?.fields;
    let string = |k: &str| match fields.get(k).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    };
    let app = match fields.get("LABELS").and_then(|v| v.kind.as_ref()) {
        Some(Kind::StructValue(labels)) => {
            match labels.fields.get("app").and_then(|v| v.kind.as_ref()) {
                Some(Kind::StringValue(s)) => s.clone(),
                _ => String::new(),
            }
        }
        _ => String::new(),
    };
    Some(ProxyClass {
        namespace: string("NAMESPACE")?,
        app,
        interception: string("INTERCEPTION_MODE"),
    })
}

// ---------------------------------------------------------------------------------------
// gRPC: a codec that writes pre-encoded responses

/// An encoded response, in pieces: written one after the other, they are the message.
pub struct Frame(Vec<Bytes>);

/// Decodes requests with prost, encodes [`Frame`]s by copying their bytes.
struct ReplayCodec<D>(PhantomData<fn() -> D>);

impl<D> Default for ReplayCodec<D> {
    fn default() -> Self {
        ReplayCodec(PhantomData)
    }
}

impl<D: Message + Default + Send + 'static> Codec for ReplayCodec<D> {
    type Encode = Frame;
    type Decode = D;
    type Encoder = FrameEncoder;
    type Decoder = RequestDecoder<D>;

    fn encoder(&mut self) -> FrameEncoder {
        FrameEncoder
    }

    fn decoder(&mut self) -> RequestDecoder<D> {
        RequestDecoder(PhantomData)
    }
}

struct FrameEncoder;

impl Encoder for FrameEncoder {
    type Item = Frame;
    type Error = Status;

    fn encode(&mut self, item: Frame, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        for chunk in &item.0 {
            dst.put_slice(chunk);
        }
        Ok(())
    }
}

struct RequestDecoder<D>(PhantomData<fn() -> D>);

impl<D: Message + Default> Decoder for RequestDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("cannot decode the request: {e}")))
    }
}

type ResponseStream = ReceiverStream<Result<Frame, Status>>;
type CallResult = Result<tonic::Response<ResponseStream>, Status>;

/// `StreamAggregatedResources`.
struct SotwService(Arc<Replay>);

impl tonic::server::StreamingService<DiscoveryRequest> for SotwService {
    type Response = Frame;
    type ResponseStream = ResponseStream;
    type Future = std::future::Ready<CallResult>;

    fn call(&mut self, request: tonic::Request<Streaming<DiscoveryRequest>>) -> Self::Future {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(sotw_stream(self.0.clone(), request.into_inner(), tx));
        std::future::ready(Ok(tonic::Response::new(ReceiverStream::new(rx))))
    }
}

/// `DeltaAggregatedResources`.
struct DeltaService(Arc<Replay>);

impl tonic::server::StreamingService<DeltaDiscoveryRequest> for DeltaService {
    type Response = Frame;
    type ResponseStream = ResponseStream;
    type Future = std::future::Ready<CallResult>;

    fn call(&mut self, request: tonic::Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(delta_stream(self.0.clone(), request.into_inner(), tx));
        std::future::ready(Ok(tonic::Response::new(ReceiverStream::new(rx))))
    }
}

type Responses = mpsc::Sender<Result<Frame, Status>>;

/// The proxy class of a stream, resolved from its first request's node and kept; a node
/// of no recorded class ends the stream with the error (`None`).
async fn stream_class(
    replay: &Replay,
    class: &mut Option<Arc<ClassSet>>,
    node: Option<&Node>,
    tx: &Responses,
) -> Option<Arc<ClassSet>> {
    if let Some(set) = class {
        return Some(set.clone());
    }
    match replay.class_of(node) {
        Ok(set) => Some(class.insert(set).clone()),
        Err(status) => {
            let _ = tx.send(Err(status)).await;
            None
        }
    }
}

/// The type a request asks to be answered for: none for an unknown type URL or a NACK.
fn answered_type(type_url: &str, nack: bool) -> Option<XdsType> {
    XdsType::from_type_url(type_url).filter(|_| !nack)
}

async fn sotw_stream(
    replay: Arc<Replay>,
    mut requests: Streaming<DiscoveryRequest>,
    tx: Responses,
) {
    let _guard = replay.stream_started();
    let mut class: Option<Arc<ClassSet>> = None;
    let mut nonce = 0u64;
    // Per type, the names of the last answered request (wildcard types: empty).
    let mut answered: [Option<Vec<String>>; 7] = Default::default();
    while let Ok(Some(req)) = requests.message().await {
        let Some(set) = stream_class(&replay, &mut class, req.node.as_ref(), &tx).await else {
            return;
        };
        let Some(ty) = answered_type(&req.type_url, req.error_detail.is_some()) else {
            continue;
        };
        let types = &set.types[type_index(ty)];
        let slot = &mut answered[type_index(ty)];
        let items: Vec<&Arc<Encoded>> = if matches!(ty, XdsType::Cluster | XdsType::Listener) {
            if slot.is_some() {
                continue; // an ACK
            }
            *slot = Some(Vec::new());
            types.all.iter().collect()
        } else {
            let mut names = req.resource_names;
            names.sort();
            if slot.as_ref() == Some(&names) {
                continue; // an ACK
            }
            let items = names.iter().filter_map(|n| types.by_name.get(n)).collect();
            *slot = Some(names);
            items
        };
        nonce += 1;
        if tx
            .send(Ok(replay.frame(ty, nonce, true, &items)))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// What a delta stream handles next: a request, or a push ([`Replay::push`]).
enum Next<R> {
    Request(R),
    Push(Arc<Pushed>),
}

/// The stream's next request or push; `None` when the stream has ended.
async fn next<R: Message + Default + 'static>(
    requests: &mut Streaming<R>,
    pushes: &mut broadcast::Receiver<Arc<Pushed>>,
) -> Option<Next<R>> {
    loop {
        tokio::select! {
            req = requests.message() => return req.ok().flatten().map(Next::Request),
            pushed = pushes.recv() => match pushed {
                Ok(p) => return Some(Next::Push(p)),
                // A stream too slow for 16 pushes misses some; the benchmark's count of
                // receipts shows it.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            },
        }
    }
}

async fn delta_stream(
    replay: Arc<Replay>,
    mut requests: Streaming<DeltaDiscoveryRequest>,
    tx: Responses,
) {
    let _guard = replay.stream_started();
    let mut pushes = replay.pushes.subscribe();
    let mut class: Option<Arc<ClassSet>> = None;
    let mut nonce = 0u64;
    let mut started: HashSet<XdsType> = HashSet::new();
    // Per type, the names this stream subscribed to that were recorded: what a push reaches.
    let mut subscribed: [HashSet<String>; 7] = Default::default();
    while let Some(next) = next(&mut requests, &mut pushes).await {
        let req = match next {
            Next::Request(req) => req,
            Next::Push(p) => {
                let Some(set) = &class else { continue };
                let types = &set.types[type_index(p.ty)];
                let subscribed = &subscribed[type_index(p.ty)];
                // The pushed resources this stream holds, in the version its class holds.
                let mut items: Vec<&Arc<Encoded>> = p
                    .replaced
                    .iter()
                    .filter(|((name, version), _)| {
                        subscribed.contains(name)
                            && types
                                .by_name
                                .get(name)
                                .is_some_and(|e| e.version == *version)
                    })
                    .map(|(_, new)| new)
                    .collect();
                items.sort_by(|a, b| a.name.cmp(&b.name));
                if !items.is_empty() {
                    nonce += 1;
                    let frame = replay.frame(p.ty, nonce, false, &items);
                    if tx.send(Ok(frame)).await.is_err() {
                        return;
                    }
                }
                continue;
            }
        };
        let Some(set) = stream_class(&replay, &mut class, req.node.as_ref(), &tx).await else {
            return;
        };
        let Some(ty) = answered_type(&req.type_url, req.error_detail.is_some()) else {
            continue;
        };
        let types = &set.types[type_index(ty)];
        if !matches!(ty, XdsType::Cluster | XdsType::Listener) {
            let subscribed = &mut subscribed[type_index(ty)];
            for name in &req.resource_names_unsubscribe {
                subscribed.remove(name);
            }
            subscribed.extend(
                req.resource_names_subscribe
                    .iter()
                    .filter(|n| types.by_name.contains_key(*n))
                    .cloned(),
            );
        }
        let held = &req.initial_resource_versions;
        let fresh = |e: &&Arc<Encoded>| held.get(&e.name) != Some(&e.version);
        let first = started.insert(ty);
        let items: Vec<&Arc<Encoded>> = if matches!(ty, XdsType::Cluster | XdsType::Listener) {
            if !first {
                continue; // an ACK
            }
            types.all.iter().filter(fresh).collect()
        } else {
            if req.resource_names_subscribe.is_empty() {
                continue; // an ACK, or only unsubscribing
            }
            req.resource_names_subscribe
                .iter()
                .filter_map(|n| types.by_name.get(n))
                .filter(fresh)
                .collect()
        };
        nonce += 1;
        if tx
            .send(Ok(replay.frame(ty, nonce, false, &items)))
            .await
            .is_err()
        {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Serving

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Largest request accepted (a delta reconnection lists every resource held).
const MAX_REQUEST: usize = 64 << 20;

/// Serves ADS on `listener` until the process ends: one HTTP/2 connection per proxy, with
/// shoal-server's connection settings (hyper's HTTP/2 defaults, keepalive ping every 30 s).
pub async fn serve(replay: Arc<Replay>, listener: TcpListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                eprintln!("shoal-replay: accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(replay.clone(), stream));
    }
}

async fn connection(replay: Arc<Replay>, stream: TcpStream) {
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let replay = replay.clone();
        async move { Ok::<_, Infallible>(route(replay, req).await) }
    });
    let mut builder =
        hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let _ = builder
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .await;
}

async fn route(
    replay: Arc<Replay>,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<tonic::body::Body> {
    match req.uri().path() {
        SOTW_PATH => {
            tonic::server::Grpc::new(ReplayCodec::<DiscoveryRequest>::default())
                .apply_max_message_size_config(Some(MAX_REQUEST), None)
                .streaming(SotwService(replay), req)
                .await
        }
        DELTA_PATH => {
            tonic::server::Grpc::new(ReplayCodec::<DeltaDiscoveryRequest>::default())
                .apply_max_message_size_config(Some(MAX_REQUEST), None)
                .streaming(DeltaService(replay), req)
                .await
        }
        _ => Status::unimplemented("only ADS is served").into_http(),
    }
}

/// Serves `/ready` and `/metrics` (HTTP/1.1, one request per connection) until the process
/// ends.
pub async fn serve_admin(replay: Arc<Replay>, listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let replay = replay.clone();
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_secs(5), admin_request(&replay, stream)).await;
        });
    }
}

async fn admin_request(replay: &Replay, mut stream: TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 << 10 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buf);
    let target = request.split_whitespace().nth(1).unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (status, body) = match path {
        "/ready" => ("200 OK", "ready\n".to_string()),
        "/metrics" => ("200 OK", replay.metrics_text()),
        "/push/endpoint" | "/push/route" => {
            let param = |key: &str| {
                query
                    .split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.to_string())
            };
            let edit = match path {
                "/push/endpoint" => param("host")
                    .zip(param("ip"))
                    .map(|(host, ip)| PushEdit::Endpoint { host, ip }),
                _ => param("name")
                    .zip(param("marker"))
                    .map(|(name, marker)| PushEdit::Route { name, marker }),
            };
            match edit.map(|e| replay.push(&e)) {
                Some(Ok(version)) => ("200 OK", format!("{version}\n")),
                Some(Err(e)) => ("404 Not Found", format!("{e}\n")),
                None => (
                    "400 Bad Request",
                    "/push/endpoint needs host and ip, /push/route name and marker\n".to_string(),
                ),
            }
        }
        _ => ("404 Not Found", "not found\n".to_string()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };

    fn item(ty: XdsType, name: &str, version: &str) -> RecordedItem {
        RecordedItem {
            ty,
            name: name.into(),
            version: version.into(),
            value: format!("bytes of {name}").into_bytes(),
        }
    }

    #[test]
    fn recording_dedupes_and_frames_decode_as_responses() {
        let a = ProxyClass {
            namespace: "ns-0".into(),
            app: "client".into(),
            interception: Some("NONE".into()),
        };
        let b = ProxyClass {
            namespace: "ns-1".into(),
            ..a.clone()
        };
        let mut builder = RecordingBuilder::default();
        builder.add_class(
            &a,
            vec![
                item(XdsType::Cluster, "c1", "v1"),
                item(XdsType::Cluster, "c2", "v1"),
            ],
        );
        builder.add_class(&b, vec![item(XdsType::Cluster, "c1", "v1")]);
        let recording = builder.finish();
        assert_eq!(recording.resources.len(), 2);
        let recording = Recording::decode(recording.encode_to_vec().as_slice()).unwrap();
        let replay = Replay::new(recording).unwrap();
        assert_eq!((replay.classes(), replay.resources()), (2, 2));

        let set = &replay.classes[&a];
        let items: Vec<&Arc<Encoded>> = set.types[0].all.iter().collect();
        let bytes = |f: Frame| f.0.concat();
        let delta = DeltaDiscoveryResponse::decode(
            bytes(replay.frame(XdsType::Cluster, 7, false, &items)).as_slice(),
        )
        .unwrap();
        assert_eq!(delta.type_url, XdsType::Cluster.type_url());
        assert_eq!(delta.nonce, "7");
        let names: Vec<&str> = delta.resources.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["c1", "c2"]);
        assert_eq!(delta.resources[0].version, "v1");
        assert_eq!(
            delta.resources[1].resource.as_ref().unwrap().value,
            b"bytes of c2"
        );
        let sotw = DiscoveryResponse::decode(
            bytes(replay.frame(XdsType::Cluster, 8, true, &items)).as_slice(),
        )
        .unwrap();
        assert_eq!(
            (sotw.version_info.as_str(), sotw.nonce.as_str()),
            ("8", "8")
        );
        assert_eq!(sotw.resources.len(), 2);
        assert!(replay
            .metrics_text()
            .contains("shoal_xds_push_bytes_total 44\n"));
    }

    #[test]
    fn a_push_adds_one_endpoint_to_the_recorded_assignment() {
        use shoal_proto::pb::envoy::config::core::v3::{socket_address, Address, SocketAddress};
        use shoal_proto::pb::envoy::config::endpoint::v3::{
            Endpoint, LbEndpoint, LocalityLbEndpoints,
        };
        let endpoint = |ip: &str| LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: ip.into(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(8080)),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let name = "outbound|8080||svc-0.ns-0.svc.cluster.local";
        let cla = ClusterLoadAssignment {
            cluster_name: name.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![endpoint("10.16.0.1")],
                ..Default::default()
            }],
            ..Default::default()
        };
        let class = ProxyClass {
            namespace: "ns-0".into(),
            app: "svc-0".into(),
            interception: None,
        };
        let mut builder = RecordingBuilder::default();
        builder.add_class(
            &class,
            vec![RecordedItem {
                ty: XdsType::Endpoint,
                name: name.into(),
                version: "v1".into(),
                value: cla.encode_to_vec(),
            }],
        );
        let replay = Replay::new(builder.finish()).unwrap();
        let mut pushes = replay.pushes.subscribe();
        let edit = |host: &str| PushEdit::Endpoint {
            host: host.into(),
            ip: "10.250.100.100".into(),
        };
        assert_eq!(
            replay.push(&edit("svc-0.ns-0.svc.cluster.local")).unwrap(),
            "replay-push-1"
        );
        let pushed = pushes.try_recv().unwrap();
        assert_eq!(pushed.ty, XdsType::Endpoint);
        let keys: Vec<&(String, String)> = pushed.replaced.keys().collect();
        assert_eq!(keys, [&(name.to_string(), "v1".to_string())]);
        let entry = &pushed.replaced[keys[0]];
        // The entry is field 2 of a response: decoded alone, it is a response of one.
        let response = DeltaDiscoveryResponse::decode(entry.delta.clone()).unwrap();
        let resource = response.resources.into_iter().next().unwrap();
        assert_eq!(resource.version, "v1+replay-push-1");
        let sent =
            ClusterLoadAssignment::decode(resource.resource.unwrap().value.as_slice()).unwrap();
        let mut expected = cla.clone();
        expected.endpoints[0]
            .lb_endpoints
            .push(endpoint("10.250.100.100"));
        assert_eq!(sent, expected);
        // Another service's name ending in this one's is not this one.
        let err = replay
            .push(&edit("c-0.ns-0.svc.cluster.local"))
            .unwrap_err();
        assert!(err.contains("no recorded resource"), "{err}");
    }
}
