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

use crate::push::chunks::Chunks;
use bytes::{BufMut, Bytes, BytesMut};
use hyper::body::Body as _;
use hyper::body::Frame;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
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
                self.pending.extend(message.chunks);
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
pub struct RequestStream<M> {
    body: tonic::body::Body,
    buf: BytesMut,
    max: usize,
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
            done: false,
            _message: std::marker::PhantomData,
        }
    }
}

impl<M: prost::Message + Default> RequestStream<M> {
    /// The next complete message in the buffer, if any.
    fn take(&mut self) -> Option<Result<M, Status>> {
        if self.buf.len() < 5 {
            return None;
        }
        if self.buf[0] != 0 {
            self.done = true;
            self.buf = BytesMut::new();
            return Some(Err(Status::unimplemented(
                "compressed requests are not supported (grpc-encoding)",
            )));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.max {
            self.done = true;
            self.buf = BytesMut::new();
            return Some(Err(Status::out_of_range(format!(
                "request message of {len} bytes is over the limit of {} bytes",
                self.max
            ))));
        }
        if self.buf.len() < 5 + len {
            self.buf.reserve(5 + len - self.buf.len());
            return None;
        }
        let frame = self.buf.split_to(5 + len);
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
        Some(
            M::decode(&frame[5..])
                .map_err(|e| Status::invalid_argument(format!("cannot decode the request: {e}"))),
        )
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
                    self.buf = BytesMut::new();
                    Some(Err(Status::invalid_argument(
                        "request stream ended inside a message",
                    )))
                });
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.done = true,
                Poll::Ready(Some(Err(status))) => {
                    self.done = true;
                    self.buf = BytesMut::new();
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
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
    use std::sync::Arc;

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
}
