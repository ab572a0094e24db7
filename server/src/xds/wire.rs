//! ADS on the wire: responses written as shared, pre-encoded bytes.
//!
//! A view's resources are encoded and gathered once per output or shared diff
//! ([`crate::push::chunks`]); a response is a small per-stream head (type URL, nonce, versions, removed names)
//! followed by those chunks. Protobuf allows the fields of a
//! message in any order and repeated fields in pieces, so the concatenation is the encoded
//! response. The response body hands the chunks to HTTP/2 as `Bytes` sharing the view's
//! buffers: pushing one output to N streams copies nothing per stream but the head, and no
//! stream keeps a buffer the size of its largest response after sending it (tonic's
//! encoder would, per stream).
//!
//! Requests are read from gRPC frames here too ([`RequestStream`]), so that a stream keeps
//! no buffer of its largest request either.

use super::limits::{Breach, BufferBudget, Exhausted};
use crate::push::chunks::{self, Chunks};
use bytes::{BufMut, Bytes, BytesMut};
use hyper::body::Body as _;
use hyper::body::Frame;
use prometheus::IntCounterVec;
use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::codegen::http;
use tonic::Status;

/// One encoded gRPC message (with its 5-byte length prefix), in chunks.
#[derive(Debug, Default)]
pub struct Encoded {
    chunks: Vec<Bytes>,
}

impl Encoded {
    /// A message made of `head` (a response without resources) and resource entries.
    pub fn new(head: &impl prost::Message, entries: &Chunks) -> Encoded {
        let head_len = head.encoded_len();
        let len = head_len + entries.len;
        let mut first = BytesMut::with_capacity(5 + head_len);
        first.put_u8(0); // not compressed
        first.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        head.encode_raw(&mut first);
        let mut chunks = Vec::with_capacity(1 + entries.chunks.len());
        chunks.push(first.freeze());
        chunks.extend(entries.chunks.iter().cloned());
        Encoded { chunks }
    }

    /// The message length its gRPC prefix declares (tests).
    #[cfg(test)]
    pub fn declared_len(&self) -> usize {
        let p = &self.chunks[0];
        u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize
    }

    /// The message decoded again (tests).
    #[cfg(test)]
    pub fn decode<M: prost::Message + Default>(&self) -> M {
        let mut all = BytesMut::new();
        for c in &self.chunks {
            all.extend_from_slice(c);
        }
        M::decode(&all[5..]).expect("an encoded response decodes")
    }
}

/// What a stream sends: messages, or the status that ends it (boxed: the channel's slots
/// are allocated in blocks per stream, and a `Status` is six times a message's size).
pub type Outgoing = Result<Encoded, Box<Status>>;

/// The sending half of a stream's responses.
pub type Responses = mpsc::Sender<Outgoing>;

/// A gRPC response body: the stream's encoded messages, then the status as trailers.
pub struct ResponseBody {
    rx: mpsc::Receiver<Outgoing>,
    pending: VecDeque<Bytes>,
    done: bool,
}

impl ResponseBody {
    /// A body sending what arrives on `rx`.
    pub fn new(rx: mpsc::Receiver<Outgoing>) -> ResponseBody {
        ResponseBody {
            rx,
            pending: VecDeque::new(),
            done: false,
        }
    }

    fn trailers(status: &Status) -> Frame<Bytes> {
        let mut headers = http::HeaderMap::new();
        if status.add_header(&mut headers).is_err() {
            headers.insert("grpc-status", http::HeaderValue::from_static("13"));
        }
        Frame::trailers(headers)
    }
}

impl hyper::body::Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(chunk) = self.pending.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(message))) => {
                coalesce(message.chunks, &mut self.pending);
                match self.pending.pop_front() {
                    Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                    None => {
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                }
            }
            Poll::Ready(Some(Err(status))) => {
                self.done = true;
                Poll::Ready(Some(Ok(Self::trailers(&status))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Ok(Self::trailers(&Status::ok("")))))
            }
        }
    }
}

/// Runs of chunks are copied into one frame's worth (HTTP/2's default largest frame) when
/// smaller: each body frame is one pass through hyper's and h2's send path (flow control,
/// the stream's queue, a DATA frame), which costs more than copying a few KiB. A small
/// push (an endpoint change: a head and one assignment) is then one frame; chunks of a
/// frame's size or more are passed on as the shared bytes they are.
fn coalesce(chunks: Vec<Bytes>, out: &mut VecDeque<Bytes>) {
    let mut at = 0;
    while at < chunks.len() {
        // The run [at, end): chunks that fit one frame together.
        let mut end = at;
        let mut len = 0;
        while end < chunks.len() && len + chunks[end].len() <= COALESCE {
            len += chunks[end].len();
            end += 1;
        }
        match end - at {
            // A chunk of a frame's size or more, or a run of one: sent as it is.
            0 | 1 => {
                out.push_back(chunks[at].clone());
                at += 1;
            }
            _ => {
                out.push_back(chunks::copied(&chunks[at..end], len));
                at = end;
            }
        }
    }
}

/// What [`coalesce`] gathers into one body frame: HTTP/2's default largest frame.
const COALESCE: usize = 16 << 10;

/// The HTTP response of a stream whose messages arrive on `rx`.
pub fn response(rx: mpsc::Receiver<Outgoing>) -> http::Response<tonic::body::Body> {
    let mut response = http::Response::new(tonic::body::Body::new(ResponseBody::new(rx)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A stream's request messages, decoded from the request body's gRPC frames. Holds only
/// the bytes of the message being received: once a message is decoded and nothing else is
/// pending, the buffer is released, so a proxy's large subscription request (a flat mesh's
/// EDS request names a thousand clusters) does not stay resident for the stream's life.
///
/// The buffer grows with the bytes that arrive, never with the length a prefix declares,
/// and those bytes count against the connection's [`BufferBudget`] until their message is
/// decoded; a started message must be complete within the message timeout. A breach ends
/// the stream with its status (`OutOfRange`, `ResourceExhausted`, `DeadlineExceeded`),
/// counted in `shoal_xds_limits_exceeded_total`. A failure of the request body itself (a
/// reset, a broken connection) is reported as `Cancelled`: there is nobody to answer.
pub struct RequestStream<M> {
    body: tonic::body::Body,
    buf: BytesMut,
    max: usize,
    /// Time a started message has to arrive completely (none: no deadline).
    message_timeout: Option<Duration>,
    /// When the message being received must be complete; set by its first byte.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The budget the buffered bytes count against, and how many are taken from it.
    budget: Option<Arc<BufferBudget>>,
    held: usize,
    /// `shoal_xds_limits_exceeded_total`, when counted.
    breaches: Option<IntCounterVec>,
    done: bool,
    _message: std::marker::PhantomData<fn() -> M>,
}

impl<M> RequestStream<M> {
    /// The messages of `body`, each at most `max` bytes.
    pub fn new(body: tonic::body::Body, max: usize) -> RequestStream<M> {
        RequestStream {
            body,
            buf: BytesMut::new(),
            max,
            message_timeout: None,
            deadline: None,
            budget: None,
            held: 0,
            breaches: None,
            done: false,
            _message: std::marker::PhantomData,
        }
    }

    /// Counts the bytes being received against `budget` (a connection's).
    pub fn with_budget(mut self, budget: Option<Arc<BufferBudget>>) -> Self {
        self.budget = budget;
        self
    }

    /// Ends the stream when a started message is not complete within `timeout`.
    pub fn with_message_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.message_timeout = timeout;
        self
    }

    /// Counts breaches in `breaches` (by [`Breach::label`]).
    pub fn counting(mut self, breaches: IntCounterVec) -> Self {
        self.breaches = Some(breaches);
        self
    }

    /// Makes the budget hold exactly `want` bytes: more is taken (or refused, taking
    /// nothing), less is given back.
    fn hold(&mut self, want: usize) -> Result<(), Exhausted> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        if want > self.held {
            budget.take(want - self.held)?;
        } else {
            budget.give(self.held - want);
        }
        self.held = want;
        Ok(())
    }

    /// Ends the stream for `breach` with `status`, releasing what it buffered.
    fn refuse(&mut self, breach: Breach, status: Status) -> Status {
        if let Some(breaches) = &self.breaches {
            breaches.with_label_values(&[breach.label()]).inc();
        }
        self.end();
        status
    }

    /// Ends the stream, releasing what it buffered.
    fn end(&mut self) {
        self.done = true;
        self.buf = BytesMut::new();
        self.deadline = None;
        let _ = self.hold(0);
    }
}

impl<M> Drop for RequestStream<M> {
    fn drop(&mut self) {
        let _ = self.hold(0);
    }
}

impl<M: prost::Message + Default> RequestStream<M> {
    /// The next complete message in the buffer, if any.
    fn take(&mut self) -> Option<Result<M, Status>> {
        if self.buf.len() < 5 {
            return None;
        }
        if self.buf[0] != 0 {
            self.end();
            return Some(Err(Status::unimplemented(
                "compressed requests are not supported (grpc-encoding)",
            )));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.max {
            let status = Status::out_of_range(format!(
                "request message of {len} bytes is over the limit of {} bytes",
                self.max
            ));
            return Some(Err(self.refuse(Breach::MessageSize, status)));
        }
        // Not complete: wait for more, without reserving what the prefix declares (a
        // caller declaring 16 MiB and sending nothing more must cost nothing).
        if self.buf.len() < 5 + len {
            return None;
        }
        let frame = self.buf.split_to(5 + len);
        // The next message (if any bytes of it are here) gets its own deadline.
        self.deadline = None;
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
        let _ = self.hold(self.buf.len());
        Some(
            M::decode(&frame[5..])
                .map_err(|e| Status::invalid_argument(format!("cannot decode the request: {e}"))),
        )
    }

    /// The status of a message not complete in time.
    fn timed_out(&mut self) -> Status {
        let declared = if self.buf.len() >= 5 {
            u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]).to_string()
        } else {
            "?".to_string()
        };
        let status = Status::deadline_exceeded(format!(
            "request message of {declared} bytes not complete within {:?} ({} bytes received)",
            self.message_timeout.unwrap_or_default(),
            self.buf.len()
        ));
        self.refuse(Breach::MessageTimeout, status)
    }
}

impl<M: prost::Message + Default> futures::Stream for RequestStream<M> {
    type Item = Result<M, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(message) = self.take() {
                return Poll::Ready(Some(message));
            }
            if self.done {
                return Poll::Ready(if self.buf.is_empty() {
                    None
                } else {
                    self.end();
                    Some(Err(Status::invalid_argument(
                        "request stream ended inside a message",
                    )))
                });
            }
            // A message has started: it must be complete in time.
            if !self.buf.is_empty() && self.deadline.is_none() {
                if let Some(timeout) = self.message_timeout {
                    self.deadline = Some(Box::pin(tokio::time::sleep(timeout)));
                }
            }
            if self.deadline.as_ref().is_some_and(|d| d.is_elapsed()) {
                return Poll::Ready(Some(Err(self.timed_out())));
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => {
                    let expired = self
                        .deadline
                        .as_mut()
                        .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                    if expired {
                        return Poll::Ready(Some(Err(self.timed_out())));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(None) => self.done = true,
                Poll::Ready(Some(Err(status))) => {
                    self.end();
                    return Poll::Ready(Some(Err(Status::cancelled(format!(
                        "the request stream failed: {}",
                        status.message()
                    )))));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let want = self.buf.len() + data.len();
                        if let Err(exhausted) = self.hold(want) {
                            let status = exhausted.status();
                            return Poll::Ready(Some(Err(self.refuse(exhausted.breach, status))));
                        }
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::Resource;
    use prost::Message as _;
    use shoal_proto::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryRequest, Resource as PbResource,
    };
    use shoal_proto::Any;

    fn resource(name: &str, size: usize) -> Arc<Resource> {
        Arc::new(Resource::from_parts(
            name.into(),
            format!("v-{name}"),
            Any {
                type_url: "type.googleapis.com/x".into(),
                value: vec![7; size],
            },
        ))
    }

    fn body_of(messages: &[DiscoveryRequest], frame: usize) -> tonic::body::Body {
        let mut wire = Vec::new();
        for m in messages {
            wire.push(0);
            wire.extend((m.encoded_len() as u32).to_be_bytes());
            m.encode(&mut wire).expect("encodes");
        }
        let frames: Vec<Result<Frame<Bytes>, Status>> = wire
            .chunks(frame)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )))
    }

    #[tokio::test]
    async fn requests_split_across_frames_decode_and_release_their_buffer() {
        use futures::StreamExt;
        let small = DiscoveryRequest {
            type_url: "t".into(),
            ..Default::default()
        };
        let big = DiscoveryRequest {
            resource_names: vec!["x".repeat(100_000)],
            ..Default::default()
        };
        let mut s = RequestStream::<DiscoveryRequest>::new(
            body_of(&[small.clone(), big.clone()], 7000),
            1 << 20,
        );
        assert_eq!(s.next().await.expect("one").expect("decodes"), small);
        assert_eq!(s.next().await.expect("two").expect("decodes"), big);
        assert_eq!(s.buf.capacity(), 0, "nothing kept once decoded");
        assert!(s.next().await.is_none());

        let mut s = RequestStream::<DiscoveryRequest>::new(body_of(&[big], 7000), 1000);
        let err = s
            .next()
            .await
            .expect("an error")
            .expect_err("over the limit");
        assert_eq!(err.code(), tonic::Code::OutOfRange);
        assert!(s.next().await.is_none(), "the stream ends after an error");
    }

    /// A length prefix over the limit is refused as soon as it arrives: nothing of the
    /// message is waited for or buffered.
    #[tokio::test]
    async fn an_oversized_request_is_refused_from_its_prefix() {
        use futures::StreamExt;
        let mut prefix = vec![0u8];
        prefix.extend(u32::MAX.to_be_bytes());
        prefix.extend(b"partial");
        let frames = futures::stream::iter(vec![Ok::<_, Status>(Frame::data(Bytes::from(prefix)))])
            .chain(futures::stream::pending());
        let body = tonic::body::Body::new(http_body_util::StreamBody::new(frames));
        let mut s =
            RequestStream::<DiscoveryRequest>::new(body, crate::xds::ads::MAX_REQUEST_BYTES);
        let err = tokio::time::timeout(std::time::Duration::from_secs(20), s.next())
            .await
            .expect("refused without waiting for the message")
            .expect("an item")
            .expect_err("over the limit");
        assert_eq!(err.code(), tonic::Code::OutOfRange);
        assert!(err.message().contains("16777216"), "{}", err.message());
        assert_eq!(s.buf.capacity(), 0, "nothing buffered");
    }

    /// A body that sends `chunks` and then stays open, sending nothing more.
    fn stalled(chunks: Vec<Vec<u8>>) -> tonic::body::Body {
        use futures::StreamExt;
        let frames = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, Status>(Frame::data(Bytes::from(c)))),
        )
        .chain(futures::stream::pending());
        tonic::body::Body::new(http_body_util::StreamBody::new(frames))
    }

    fn prefix(len: u32) -> Vec<u8> {
        let mut p = vec![0u8];
        p.extend(len.to_be_bytes());
        p
    }

    /// A prefix declaring the largest message, and a few bytes of it: the buffer holds what
    /// arrived (not the 16 MiB declared), the bytes count against the budget, and the
    /// stream ends with `DeadlineExceeded` when the message is not complete in time.
    #[tokio::test(start_paused = true)]
    async fn a_started_message_buffers_what_arrived_and_has_a_deadline() {
        use futures::StreamExt;
        let max = crate::xds::ads::MAX_REQUEST_BYTES;
        let budget = BufferBudget::process(1 << 20, None);
        let breaches = prometheus::IntCounterVec::new(prometheus::opts!("t", "t"), &["reason"])
            .expect("metric");
        let mut first = prefix(max as u32);
        first.extend([7u8; 100]);
        let mut s = RequestStream::<DiscoveryRequest>::new(stalled(vec![first]), max)
            .with_budget(Some(budget.clone()))
            .with_message_timeout(Some(std::time::Duration::from_secs(5)))
            .counting(breaches.clone());
        let waiting = tokio::time::timeout(std::time::Duration::from_secs(4), s.next()).await;
        assert!(waiting.is_err(), "still receiving before the deadline");
        assert!(s.buf.capacity() < 4096, "capacity {}", s.buf.capacity());
        assert_eq!(budget.used(), 105, "the bytes received are held");
        let err = s.next().await.expect("an item").expect_err("timed out");
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
        assert!(err.message().contains("16777216"), "{}", err.message());
        assert_eq!(budget.used(), 0, "released");
        assert_eq!(s.buf.capacity(), 0);
        assert_eq!(breaches.with_label_values(&["message_timeout"]).get(), 1);
        assert!(s.next().await.is_none(), "the stream ends");
    }

    /// Bytes over the connection's budget end the stream with `ResourceExhausted`, naming
    /// the budget; what it held is given back.
    #[tokio::test]
    async fn bytes_over_the_budget_end_the_stream() {
        use futures::StreamExt;
        let process = BufferBudget::process(1 << 20, None);
        let conn = BufferBudget::within(&process, 1000, Breach::ConnectionBuffer);
        let breaches = prometheus::IntCounterVec::new(prometheus::opts!("t", "t"), &["reason"])
            .expect("metric");
        let mut body = prefix(5000);
        body.extend([1u8; 600]);
        let mut s =
            RequestStream::<DiscoveryRequest>::new(stalled(vec![body, vec![2u8; 600]]), 1 << 20)
                .with_budget(Some(conn.clone()))
                .counting(breaches.clone());
        let err = s.next().await.expect("an item").expect_err("over budget");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
        assert!(err.message().contains("1000 bytes"), "{}", err.message());
        assert_eq!((conn.used(), process.used()), (0, 0));
        assert_eq!(breaches.with_label_values(&["connection_buffer"]).get(), 1);
        assert!(s.next().await.is_none());

        // Complete messages give their bytes back: many small ones pass a small budget.
        let small = DiscoveryRequest {
            type_url: "t".repeat(300),
            ..Default::default()
        };
        let many: Vec<DiscoveryRequest> = (0..20).map(|_| small.clone()).collect();
        let s = RequestStream::<DiscoveryRequest>::new(body_of(&many, 500), 1 << 20)
            .with_budget(Some(conn.clone()));
        let items: Vec<_> = s.collect().await;
        assert_eq!(items.len(), 20);
        assert!(items.iter().all(|i| i.is_ok()));
        assert_eq!(conn.used(), 0);
    }

    /// A failing request body (the client reset the stream) ends the stream as `Cancelled`,
    /// which the stream loop treats as "nobody to answer".
    #[tokio::test]
    async fn a_failed_body_is_cancelled() {
        use futures::StreamExt;
        let frames = futures::stream::iter(vec![
            Ok::<_, Status>(Frame::data(Bytes::from(prefix(10)))),
            Err(Status::internal("h2 reset")),
        ]);
        let budget = BufferBudget::process(100, None);
        let mut s = RequestStream::<DiscoveryRequest>::new(
            tonic::body::Body::new(http_body_util::StreamBody::new(frames)),
            1 << 20,
        )
        .with_budget(Some(budget.clone()));
        let err = s.next().await.expect("an item").expect_err("failed");
        assert_eq!(err.code(), tonic::Code::Cancelled);
        assert_eq!(budget.used(), 0);
    }

    fn frames_of(wire: Vec<u8>, sizes: Vec<usize>) -> tonic::body::Body {
        let mut frames = Vec::new();
        let mut rest = &wire[..];
        for size in sizes.into_iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (head, tail) = rest.split_at(size.clamp(1, rest.len()));
            frames.push(Ok::<_, Status>(Frame::data(Bytes::copy_from_slice(head))));
            rest = tail;
        }
        tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: shoal_common::proptest_cases(256),
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Arbitrary bytes in arbitrary frames (and valid messages with bytes flipped)
        /// decode to messages or errors, never a panic, and the stream always ends.
        #[test]
        fn prop_request_frames_never_panic(
            garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            names in proptest::collection::vec(".{0,20}", 0..10),
            flips in proptest::collection::vec((proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>()), 0..4),
            sizes in proptest::collection::vec(1usize..64, 1..4),
            valid_first in proptest::prelude::any::<bool>(),
        ) {
            let msg = DiscoveryRequest { resource_names: names, ..Default::default() };
            let mut wire = Vec::new();
            if valid_first {
                wire.push(0);
                wire.extend((msg.encoded_len() as u32).to_be_bytes());
                msg.encode(&mut wire).expect("encodes");
                for (at, byte) in flips {
                    let at = at % wire.len();
                    wire[at] ^= byte;
                }
            }
            wire.extend(garbage);
            let wire_len = wire.len();
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let items = rt.block_on(async {
                use futures::StreamExt;
                RequestStream::<DiscoveryRequest>::new(frames_of(wire, sizes), 4096)
                    .collect::<Vec<_>>()
                    .await
            });
            // Each item consumes at least a 5-byte prefix (or ends the stream).
            proptest::prop_assert!(items.len() <= wire_len / 5 + 1);
            // A framing error (compressed, oversized, truncated) ends the stream; a
            // message that does not decode does not desynchronize the frames after it.
            if let Some(at) = items.iter().position(|i| {
                i.as_ref().is_err_and(|e| e.code() != tonic::Code::InvalidArgument
                    || e.message().contains("ended inside"))
            }) {
                proptest::prop_assert_eq!(at, items.len() - 1, "a framing error ends the stream");
            }
        }
    }

    #[test]
    fn an_assembled_response_is_the_prost_encoding() {
        let resources = vec![
            resource("a", 10),
            resource("big", 100_000),
            resource("c", 20),
        ];
        let head = DeltaDiscoveryResponse {
            system_version_info: "v1".into(),
            type_url: "type.googleapis.com/x".into(),
            nonce: "1-1".into(),
            removed_resources: vec!["gone".into()],
            ..Default::default()
        };
        let gathered = crate::push::chunks::Gathered::default();
        let encoded = Encoded::new(&head, gathered.delta(&resources));
        let expected = DeltaDiscoveryResponse {
            resources: resources
                .iter()
                .map(|r| PbResource {
                    name: r.name.clone(),
                    version: r.version.clone(),
                    resource: Some(r.any.clone()),
                    ..Default::default()
                })
                .collect(),
            ..head.clone()
        };
        assert_eq!(encoded.decode::<DeltaDiscoveryResponse>(), expected);
        assert_eq!(encoded.declared_len(), expected.encoded_len());
        // The big entry is the resource's own buffer, not a copy.
        assert!(encoded
            .chunks
            .iter()
            .any(|c| c.as_ptr() == resources[1].delta_entry().as_ptr()));
        assert_eq!(encoded.chunks.len(), 4, "head, a, big, c");
        // Streams sending the same list share the gathered chunks.
        let again = Encoded::new(&head, gathered.delta(&resources));
        assert_eq!(encoded.chunks[1].as_ptr(), again.chunks[1].as_ptr());
    }

    #[test]
    fn small_chunks_are_sent_as_one_frame_and_big_ones_as_they_are() {
        let big = Bytes::from(vec![2u8; COALESCE + 1]);
        let chunks = vec![
            Bytes::from_static(b"head"),
            Bytes::from(vec![1u8; 100]),
            big.clone(),
            Bytes::from(vec![3u8; COALESCE - 10]),
            Bytes::from(vec![4u8; 20]),
            Bytes::from(vec![5u8; 5]),
        ];
        let whole: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
        let mut frames = VecDeque::new();
        coalesce(chunks, &mut frames);
        let lens: Vec<usize> = frames.iter().map(Bytes::len).collect();
        assert_eq!(lens, [104, COALESCE + 1, COALESCE - 10, 25]);
        assert_eq!(
            frames[1].as_ptr(),
            big.as_ptr(),
            "a big chunk is not copied"
        );
        let sent: Vec<u8> = frames.iter().flat_map(|c| c.to_vec()).collect();
        assert_eq!(sent, whole);
        // An endpoint push: a head and one assignment, one frame.
        let mut frames = VecDeque::new();
        coalesce(
            vec![Bytes::from_static(b"head"), Bytes::from(vec![1u8; 900])],
            &mut frames,
        );
        assert_eq!(frames.len(), 1);
    }
}
