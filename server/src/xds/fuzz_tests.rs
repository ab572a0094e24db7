//! Property tests of the xDS request path: arbitrary request sequences on SotW and delta
//! streams (unknown type URLs, bogus and stale nonces, mismatched versions, NACKs with huge
//! messages, missing and changing nodes), driven in-process through the same `drive` loop
//! as a real stream. Every stream either keeps serving or ends with a clear status, never
//! panics, and keeps a bounded amount of state whatever it is sent.

use super::delta::DeltaStream;
use super::limits::{
    SharedWarnLimiter, MAX_NACK_DETAIL_BYTES, MAX_NAMES_PER_SUBSCRIPTION, MAX_VERSION_BYTES,
};
use super::registry::{ConnectionStatus, Registry};
use super::session::{Mode, Session};
use super::sotw::SotwStream;
use super::stream::{drive, DriveContext, StreamHandler};
use super::wire::Outgoing;
use crate::generate::cache::GeneratorCache;
use crate::generate::metrics::CacheMetrics;
use crate::index::proxy::tests::node;
use crate::push::pipeline::{ChangeSet, Published};
use crate::push::view::{Generation, Views};
use crate::testutil::*;
use crate::xds::metrics::XdsMetrics;
use proptest::prelude::*;
use shoal_proto::pb::envoy::config::core::v3::Node;
use shoal_proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use shoal_proto::pb::google::rpc::Status as RpcStatus;
use shoal_proto::XdsType;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;

const NODE_ID: &str = "sidecar~10.1.0.1~productpage-1.default~default.svc.cluster.local";
const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";
/// Only a guard against hanging forever; no test waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn published() -> Published {
    let mesh = Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_slice(slice(
            "default",
            "reviews",
            "reviews-1",
            &[("http", 9080)],
            vec![endpoint("10.0.0.1", &[])],
        ));
    Published {
        snapshot: Arc::new(mesh.snapshot()),
        observed_at_ms: None,
        changes: Arc::new(ChangeSet {
            full: true,
            ..Default::default()
        }),
        published_at_ms: 0,
    }
}

/// What a driven stream did.
struct Outcome {
    /// Everything it sent, in order.
    sent: Vec<Outgoing>,
    /// The registry entry of the stream after the last request was handled (`None` if the
    /// stream ended before, or never identified its proxy).
    status: Option<ConnectionStatus>,
    /// Whether the stream ended by itself (a refused request).
    ended: bool,
}

/// Drives one stream through `requests` on a fresh runtime and reports what it did.
fn run<Req, I, H>(
    mode: Mode,
    requests: I,
    make: impl FnOnce(Session, super::wire::Responses) -> H,
) -> Outcome
where
    Req: Send + 'static,
    I: IntoIterator<Item = Req> + Send + 'static,
    I::IntoIter: Send + 'static,
    H: StreamHandler<Req> + 'static,
{
    run_with(mode, requests, make, SharedWarnLimiter::default())
}

/// [`run`], with the refusal warnings' limiter shared with other streams.
fn run_with<Req, I, H>(
    mode: Mode,
    requests: I,
    make: impl FnOnce(Session, super::wire::Responses) -> H,
    refusals: SharedWarnLimiter,
) -> Outcome
where
    Req: Send + 'static,
    I: IntoIterator<Item = Req> + Send + 'static,
    I::IntoIter: Send + 'static,
    H: StreamHandler<Req> + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let metrics = XdsMetrics::register(&prometheus::Registry::new());
        let views = Views::new(Generation::new(
            GeneratorCache::new(
                1 << 20,
                false,
                CacheMetrics::register(&prometheus::Registry::new()),
            ),
            1,
        ));
        let registry = Registry::default();
        let session = Session::new(
            "fuzz-1".into(),
            mode,
            registry.clone(),
            metrics,
            views,
            None,
        );
        let (tx, mut rx) = mpsc::channel(16);
        let handler = make(session, tx);
        let (snap_tx, snap_rx) = watch::channel(Some(published()));
        // Signals once every request was handled: `drive` polls for the next request only
        // after the previous one is done.
        let (done_tx, done_rx) = oneshot::channel::<()>();
        let mut done_tx = Some(done_tx);
        let requests = futures::stream::iter(requests.into_iter().map(Ok::<Req, Status>)).chain(
            futures::stream::poll_fn(move |_| {
                if let Some(tx) = done_tx.take() {
                    let _ = tx.send(());
                }
                Poll::<Option<Result<Req, Status>>>::Pending
            }),
        );
        let sent = Arc::new(Mutex::new(Vec::new()));
        let collector = {
            let sent = sent.clone();
            tokio::spawn(async move {
                while let Some(out) = rx.recv().await {
                    sent.lock().unwrap_or_else(|p| p.into_inner()).push(out);
                }
            })
        };
        let mut task = tokio::spawn(drive(
            handler,
            Box::pin(requests),
            DriveContext::for_tests(snap_rx, 4, refusals),
        ));
        let (status, ended) = tokio::time::timeout(HANG_GUARD, async {
            tokio::select! {
                Ok(()) = done_rx => (registry.snapshot().into_iter().next(), false),
                joined = &mut task => {
                    joined.expect("the stream's task never panics");
                    (None, true)
                }
            }
        })
        .await
        .expect("the stream handles its requests");
        // Closing the snapshot channel ends a stream that is still serving.
        drop(snap_tx);
        if !ended {
            task.await.expect("the stream's task never panics");
        }
        collector.await.expect("collector");
        assert!(
            registry.snapshot().is_empty(),
            "a closed stream is unregistered"
        );
        let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|p| p.into_inner()));
        Outcome {
            sent,
            status,
            ended,
        }
    })
}

use futures::StreamExt as _;

/// Checks what every stream must satisfy, whatever it was sent.
fn check(outcome: &Outcome) -> Result<(), TestCaseError> {
    let errors: Vec<&Status> = outcome
        .sent
        .iter()
        .filter_map(|o| o.as_ref().err().map(|b| &**b))
        .collect();
    prop_assert!(errors.len() <= 1, "at most one status, ending the stream");
    if let Some(status) = errors.first() {
        prop_assert!(outcome.ended, "a status ends the stream");
        prop_assert!(
            outcome.sent.last().is_some_and(|o| o.is_err()),
            "the status is last"
        );
        prop_assert!(
            matches!(
                status.code(),
                tonic::Code::InvalidArgument | tonic::Code::PermissionDenied
            ),
            "unexpected status {status:?}"
        );
        prop_assert!(!status.message().is_empty(), "a status says why");
    }
    if let Some(conn) = &outcome.status {
        prop_assert!(
            conn.types.len() <= XdsType::ALL.len(),
            "{:?}",
            conn.types.keys()
        );
        for (url, t) in &conn.types {
            prop_assert!(
                XdsType::from_type_url(url).is_some(),
                "only served types: {url}"
            );
            prop_assert!(t.acked_version.len() <= MAX_VERSION_BYTES + 40);
            if let Some(n) = &t.last_nack {
                prop_assert!(n.message.len() <= MAX_NACK_DETAIL_BYTES + 40);
                prop_assert!(n.version.len() <= MAX_VERSION_BYTES + 40);
            }
        }
    }
    Ok(())
}

fn node_strategy() -> impl Strategy<Value = Option<Node>> {
    prop_oneof![
        3 => Just(None),
        3 => Just(Some(node(NODE_ID, "default", &[("app", "productpage")]))),
        1 => Just(Some(node(
            "router~10.1.0.9~gw-1.istio-system~istio-system.svc.cluster.local",
            "istio-system",
            &[("istio", "ingressgateway")],
        ))),
        1 => ".{0,30}".prop_map(|id| Some(node(&id, "default", &[]))),
        1 => Just(Some(Node::default())),
    ]
}

fn type_url_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(XdsType::ALL.to_vec()).prop_map(|t| t.type_url().to_string()),
        1 => Just("type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig".to_string()),
        1 => ".{0,40}",
    ]
}

fn name_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(REVIEWS.to_string()),
        Just("outbound|9080||ratings.default.svc.cluster.local".to_string()),
        Just("9080".to_string()),
        Just("*".to_string()),
        Just(String::new()),
        ".{0,20}",
    ]
}

/// Nonces: empty, one the stream really sent (`<snapshot>-<n>`), or garbage.
fn nonce_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(String::new()),
        4 => (1u64..6).prop_map(|n| format!("1-{n}")),
        1 => ".{0,12}",
    ]
}

fn text_strategy(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => ".{0,16}",
        1 => (0..max).prop_map(|n| "x".repeat(n)),
        1 => (0..max / 2).prop_map(|n| "é".repeat(n)),
    ]
}

fn error_strategy() -> impl Strategy<Value = Option<RpcStatus>> {
    prop_oneof![
        3 => Just(None),
        1 => (any::<i32>(), text_strategy(20_000)).prop_map(|(code, message)| Some(RpcStatus {
            code,
            message,
            details: vec![],
        })),
    ]
}

fn sotw_request() -> impl Strategy<Value = DiscoveryRequest> {
    (
        node_strategy(),
        type_url_strategy(),
        prop::collection::vec(name_strategy(), 0..8),
        nonce_strategy(),
        text_strategy(2_000),
        error_strategy(),
    )
        .prop_map(
            |(node, type_url, resource_names, response_nonce, version_info, error_detail)| {
                DiscoveryRequest {
                    node,
                    type_url,
                    resource_names,
                    response_nonce,
                    version_info,
                    error_detail,
                    ..Default::default()
                }
            },
        )
}

fn delta_request() -> impl Strategy<Value = DeltaDiscoveryRequest> {
    (
        node_strategy(),
        type_url_strategy(),
        prop::collection::vec(name_strategy(), 0..8),
        prop::collection::vec(name_strategy(), 0..4),
        prop::collection::vec((name_strategy(), ".{0,10}"), 0..4),
        nonce_strategy(),
        error_strategy(),
    )
        .prop_map(
            |(node, type_url, subscribe, unsubscribe, initial, response_nonce, error_detail)| {
                DeltaDiscoveryRequest {
                    node,
                    type_url,
                    resource_names_subscribe: subscribe,
                    resource_names_unsubscribe: unsubscribe,
                    initial_resource_versions: initial.into_iter().collect::<HashMap<_, _>>(),
                    response_nonce,
                    error_detail,
                    ..Default::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: shoal_common::proptest_cases(128), ..ProptestConfig::default() })]

    #[test]
    fn prop_sotw_request_sequences_never_panic(reqs in prop::collection::vec(sotw_request(), 1..24)) {
        let outcome = run(Mode::Sotw, reqs, SotwStream::new);
        check(&outcome)?;
    }

    #[test]
    fn prop_delta_request_sequences_never_panic(reqs in prop::collection::vec(delta_request(), 1..24)) {
        let outcome = run(Mode::Delta, reqs, DeltaStream::new);
        check(&outcome)?;
    }
}

fn sotw(node: Option<Node>, ty: XdsType, names: Vec<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        node,
        type_url: ty.type_url().to_string(),
        resource_names: names,
        ..Default::default()
    }
}

fn the_node() -> Option<Node> {
    Some(node(NODE_ID, "default", &[("app", "productpage")]))
}

fn decode(o: &Outgoing) -> DiscoveryResponse {
    o.as_ref().expect("a response").decode()
}

/// 10 000 hostile requests on one stream (NACKs of 64 KiB messages, unknown types, huge
/// versions, stale nonces): what the stream keeps stays small, and it keeps serving.
#[test]
fn a_hostile_stream_keeps_bounded_state() {
    let huge = "e".repeat(64 << 10);
    // Built as they are sent, so that the test itself holds one at a time.
    let hostile = (0..10_000u32).map(move |i| {
        match i % 4 {
            // A NACK of the response (nonce 1-1) with a 64 KiB message and version.
            0 => DiscoveryRequest {
                response_nonce: "1-1".into(),
                version_info: huge.clone(),
                error_detail: Some(RpcStatus {
                    code: 3,
                    message: huge.clone(),
                    details: vec![],
                }),
                ..sotw(None, XdsType::Cluster, vec![])
            },
            1 => DiscoveryRequest {
                type_url: format!("type.googleapis.com/bogus.{i}"),
                ..sotw(None, XdsType::Cluster, vec![])
            },
            2 => DiscoveryRequest {
                response_nonce: format!("stale-{i}"),
                version_info: huge.clone(),
                ..sotw(None, XdsType::Cluster, vec![])
            },
            // A different node on a later request is ignored (identity is the first's).
            _ => sotw(
                Some(node("router~1.2.3.4~x.y~y.svc", "y", &[])),
                XdsType::Listener,
                vec![],
            ),
        }
    });
    let reqs = std::iter::once(sotw(the_node(), XdsType::Cluster, vec![])).chain(hostile);
    let outcome = run(Mode::Sotw, reqs, SotwStream::new);
    assert!(!outcome.ended, "garbage is ignored, not fatal");
    let conn = outcome.status.expect("still connected");
    assert_eq!(conn.node_id, NODE_ID, "the first node stays");
    let size = serde_json::to_vec(&conn).expect("serializes").len();
    assert!(size < 4096, "registry entry is {size} bytes");
    let nack = conn.types[XdsType::Cluster.type_url()]
        .last_nack
        .clone()
        .expect("NACK recorded");
    assert!(nack.message.len() <= MAX_NACK_DETAIL_BYTES + 40);
    assert!(
        nack.message.ends_with("bytes truncated)"),
        "{}",
        &nack.message[1000..]
    );
    // One response to the first request, one to each Listener request, and nothing else.
    assert_eq!(outcome.sent.len(), 1 + 2500);
    assert_eq!(
        decode(&outcome.sent[0]).type_url,
        XdsType::Cluster.type_url()
    );
    assert_eq!(
        decode(&outcome.sent[1]).type_url,
        XdsType::Listener.type_url()
    );
}

#[test]
fn a_request_over_the_name_cap_is_refused_naming_the_cap() {
    let names: Vec<String> = (0..=MAX_NAMES_PER_SUBSCRIPTION)
        .map(|i| format!("outbound|80||s{i}.ns.svc.cluster.local"))
        .collect();
    let over = sotw(the_node(), XdsType::Endpoint, names.clone());
    let outcome = run(Mode::Sotw, vec![over], SotwStream::new);
    assert!(outcome.ended);
    let status = outcome.sent[0].as_ref().expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("100000"), "{}", status.message());

    // Delta: one request over the cap, and two requests over the cap together (on CDS
    // without its wildcard, whose output does not depend on names: fast to generate).
    let sub = |names: &[String], unsub: &[&str], node| DeltaDiscoveryRequest {
        node,
        type_url: XdsType::Cluster.type_url().to_string(),
        resource_names_subscribe: names.to_vec(),
        resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let outcome = run(
        Mode::Delta,
        vec![sub(&names, &[], the_node())],
        DeltaStream::new,
    );
    assert!(outcome.ended);
    let status = outcome.sent[0].as_ref().expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("100000"), "{}", status.message());
    let outcome = run(
        Mode::Delta,
        vec![
            sub(&[], &["*"], the_node()),
            sub(&names[..60_000], &[], None),
            sub(&names[60_000..], &[], None),
        ],
        DeltaStream::new,
    );
    assert!(outcome.ended);
    // The first request is answered; adding names to CDS changes nothing to send.
    assert_eq!(outcome.sent.len(), 2, "one response, then the status");
    let status = outcome.sent[1].as_ref().expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("100000"), "{}", status.message());
}

/// Counts the events logged through it.
#[derive(Clone, Default)]
struct Counter(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counter {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if *event.metadata().level() <= tracing::Level::WARN {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(event.metadata().name().to_string());
        }
    }
}

/// Makes every callsite interesting to this thread's scoped subscriber. A test running at
/// the same time on a thread with no subscriber (the default `NoSubscriber` says "never")
/// could otherwise leave a callsite cached as uninteresting, and its warnings would never
/// reach the counting layer: so the test binary's global default is a subscriber
/// interested in everything (it has no layers: events on other threads go nowhere), and
/// the interest of callsites registered before it is recomputed.
fn settle_interest() {
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        // Fails only if another global default exists, which serves as well.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
    tracing::callsite::rebuild_interest_cache();
}

/// A proxy NACKing and asking for unknown types in a loop is logged once per kind (then
/// at most once per `WARN_INTERVAL`), not once per request.
#[test]
fn warnings_of_a_looping_proxy_are_rate_limited() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let counter = Counter::default();
    let subscriber = tracing_subscriber::registry().with(counter.clone());
    let mut reqs = vec![sotw(the_node(), XdsType::Cluster, vec![])];
    for i in 0..1000 {
        reqs.push(DiscoveryRequest {
            response_nonce: "1-1".into(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: format!("bad cluster {i}"),
                details: vec![],
            }),
            ..sotw(None, XdsType::Cluster, vec![])
        });
        reqs.push(DiscoveryRequest {
            type_url: "type.googleapis.com/bogus".into(),
            ..sotw(None, XdsType::Cluster, vec![])
        });
    }
    let outcome = tracing::subscriber::with_default(subscriber, || {
        settle_interest();
        run(Mode::Sotw, reqs, SotwStream::new)
    });
    assert!(!outcome.ended);
    let warnings = counter.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        warnings.len(),
        2,
        "one NACK and one unknown-type warning: {warnings:?}"
    );
}

/// A proxy reconnecting in a loop with a refused request logs one warning, not one per
/// stream.
#[test]
fn refused_streams_of_a_reconnect_loop_are_logged_rate_limited() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let counter = Counter::default();
    let subscriber = tracing_subscriber::registry().with(counter.clone());
    let refusals = SharedWarnLimiter::default();
    tracing::subscriber::with_default(subscriber, || {
        settle_interest();
        for _ in 0..50 {
            let outcome = run_with(
                Mode::Sotw,
                vec![sotw(None, XdsType::Cluster, vec![])],
                SotwStream::new,
                refusals.clone(),
            );
            assert!(outcome.ended, "a request without a node is refused");
        }
    });
    let warnings = counter.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
}
