//! ADS State-of-the-World protocol tests against a real tonic server on `127.0.0.1:0` and a
//! real gRPC client.
//!
//! "No response" is never asserted by waiting: a stream answers requests in order, so after
//! a request that must not be answered the test sends a probe that must be, and checks that
//! the probe's answer is the next message.

use super::ads::AdsConfig;
use super::{AdsService, Registry, TypeStatus};
use crate::generate::cache::GeneratorCache;
use crate::generate::metrics::CacheMetrics;
use crate::generate::Snapshot;
use crate::push::pipeline::{ChangeSet, Published};
use crate::push::view::{Generation, Views};
use crate::testutil::*;
use crate::xds::metrics::XdsMetrics;
use prost::Message;
use shoal_proto::pb::envoy::config::cluster::v3::Cluster;
use shoal_proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use shoal_proto::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient, DeltaDiscoveryRequest,
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use shoal_proto::pb::google::rpc::Status as RpcStatus;
use shoal_proto::XdsType;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::Channel;
use tonic::Streaming;

/// A node as the protocol tests send it: a sidecar without traffic capture
/// (`INTERCEPTION_MODE: NONE`), so its listeners are the Sidecar's bound ones, matching
/// [`sidecar_proxy`].
fn node(
    id: &str,
    ns: &str,
    labels: &[(&str, &str)],
) -> shoal_proto::pb::envoy::config::core::v3::Node {
    use shoal_proto::pb::google::protobuf::{value::Kind, Value};
    let mut n = crate::index::proxy::tests::node(id, ns, labels);
    if let Some(m) = n.metadata.as_mut() {
        m.fields.insert(
            "INTERCEPTION_MODE".into(),
            Value {
                kind: Some(Kind::StringValue("NONE".into())),
            },
        );
    }
    n
}

const NODE_ID: &str = "sidecar~10.1.0.1~productpage-1.default~default.svc.cluster.local";
const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";
const RATINGS: &str = "outbound|9080||ratings.default.svc.cluster.local";
/// Only a guard against hanging forever; no test waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(20);

struct Server {
    snapshots: watch::Sender<Option<Published>>,
    registry: Registry,
    client: AggregatedDiscoveryServiceClient<Channel>,
}

async fn server() -> Server {
    let (snapshots, rx) = watch::channel(None);
    let registry = Registry::default();
    let metrics = prometheus::Registry::new();
    let views = Views::new(Generation::per_core(GeneratorCache::new(
        1 << 24,
        GeneratorCache::assert_from_env(),
        CacheMetrics::register(&metrics),
    )));
    let ads = AdsService::new(
        rx,
        registry.clone(),
        XdsMetrics::register(&metrics),
        views,
        AdsConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ads.into_server())
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    Server {
        snapshots,
        registry,
        client,
    }
}

impl Server {
    fn publish(&self, snapshot: Snapshot, changes: ChangeSet) {
        self.snapshots.send_replace(Some(Published {
            snapshot: Arc::new(snapshot),
            observed_at_ms: None,
            changes: Arc::new(changes),
            published_at_ms: shoal_common::envelope::now_ms(),
        }));
    }

    async fn open(&self) -> Stream {
        let (tx, rx) = mpsc::channel(16);
        let responses = self
            .client
            .clone()
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("stream opens")
            .into_inner();
        Stream { tx, responses }
    }

    /// The sync status of `ty` on the only connection.
    fn status(&self, ty: XdsType) -> TypeStatus {
        let conns = self.registry.snapshot();
        assert_eq!(conns.len(), 1, "{conns:?}");
        conns[0]
            .types
            .get(ty.type_url())
            .cloned()
            .unwrap_or_default()
    }
}

struct Stream {
    tx: mpsc::Sender<DiscoveryRequest>,
    responses: Streaming<DiscoveryResponse>,
}

impl Stream {
    async fn send(&self, req: DiscoveryRequest) {
        self.tx.send(req).await.expect("request sent");
    }

    async fn recv(&mut self) -> DiscoveryResponse {
        match tokio::time::timeout(HANG_GUARD, self.responses.message()).await {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => panic!("stream ended"),
            Ok(Err(status)) => panic!("stream failed: {status}"),
            Err(_) => panic!("no response"),
        }
    }

    /// Receives the next response and checks its type.
    async fn recv_type(&mut self, ty: XdsType) -> DiscoveryResponse {
        let r = self.recv().await;
        assert_eq!(r.type_url, ty.type_url(), "unexpected response type");
        r
    }

    /// Requests `ty` afresh and receives the answer.
    async fn request(&mut self, ty: XdsType, names: &[&str]) -> DiscoveryResponse {
        self.send(request(ty, names)).await;
        self.recv_type(ty).await
    }

    /// ACKs `r` with `names` (without the node, as Envoy does with
    /// `set_node_on_first_message_only`).
    async fn ack(&self, r: &DiscoveryResponse, names: &[&str]) {
        self.send(DiscoveryRequest {
            node: None,
            version_info: r.version_info.clone(),
            response_nonce: r.nonce.clone(),
            ..request(type_of(r), names)
        })
        .await;
    }
}

fn type_of(r: &DiscoveryResponse) -> XdsType {
    XdsType::from_type_url(&r.type_url).expect("known type")
}

/// A request with the Istio node, as Envoy sends every request by default.
fn request(ty: XdsType, names: &[&str]) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(node(NODE_ID, "default", &[("app", "productpage")])),
        type_url: ty.type_url().to_string(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn decode<M: Message + Default>(r: &DiscoveryResponse) -> Vec<M> {
    r.resources
        .iter()
        .map(|a| {
            assert_eq!(a.type_url, r.type_url);
            M::decode(&*a.value).expect("resource decodes")
        })
        .collect()
}

fn mesh(reviews: &[&str]) -> Mesh {
    Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_service(service("default", "ratings", &[("http", 9080)]))
        .with_slice(slice(
            "default",
            "reviews",
            "reviews-1",
            &[("http", 9080)],
            reviews.iter().map(|a| endpoint(a, &[])).collect(),
        ))
        .with_slice(slice(
            "default",
            "ratings",
            "ratings-1",
            &[("http", 9080)],
            vec![endpoint("10.0.1.1", &[])],
        ))
        .with_config(sidecar(
            "default",
            "default",
            r#"
egress:
- port: {number: 9080, name: http, protocol: HTTP}
  captureMode: NONE
  hosts: ["./*"]
"#,
        ))
}

fn numbered(mesh: &Mesh, number: u64) -> Snapshot {
    Snapshot {
        number,
        ..mesh.snapshot()
    }
}

fn full() -> ChangeSet {
    ChangeSet {
        full: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn first_request_gets_a_versioned_response() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = s.open().await;
    let r = stream.request(XdsType::Cluster, &[]).await;
    assert!(!r.version_info.is_empty());
    assert!(!r.nonce.is_empty());
    let names: Vec<String> = decode::<Cluster>(&r).into_iter().map(|c| c.name).collect();
    assert!(names.contains(&REVIEWS.to_string()), "{names:?}");
    // The version is the content hash the generators agree on across replicas.
    let expected = gen(
        XdsType::Cluster,
        &sidecar_proxy("default", &[("app", "productpage")]),
        &numbered(&mesh(&["10.0.0.1"]), 1),
        &[],
    );
    let expected = crate::push::view::Output::new(expected.into_iter().map(Arc::new).collect());
    assert_eq!(r.version_info, expected.version());

    let conns = s.registry.snapshot();
    assert_eq!(conns.len(), 1);
    assert_eq!(conns[0].node_id, NODE_ID);
    assert_eq!(conns[0].namespace, "default");
    let st = s.status(XdsType::Cluster);
    assert_eq!(st.sent_nonce, r.nonce);
    assert_eq!(st.sent_version, r.version_info);
    assert_eq!(st.resources, names.len());
}

#[tokio::test]
async fn later_requests_may_omit_the_node() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = s.open().await;
    stream.request(XdsType::Cluster, &[]).await;
    stream
        .send(DiscoveryRequest {
            node: None,
            ..request(XdsType::Listener, &[])
        })
        .await;
    let r = stream.recv_type(XdsType::Listener).await;
    assert_eq!(r.resources.len(), 1);
}

#[tokio::test]
async fn an_ack_gets_no_response() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = s.open().await;
    let cds = stream.request(XdsType::Cluster, &[]).await;
    stream.ack(&cds, &[]).await;
    // The probe's answer comes next: the ACK was not answered.
    stream.request(XdsType::Listener, &[]).await;
    let st = s.status(XdsType::Cluster);
    assert_eq!(st.acked_nonce, cds.nonce);
    assert_eq!(st.acked_version, cds.version_info);
    assert!(st.last_nack.is_none());
}

#[tokio::test]
async fn a_nack_is_recorded_and_not_answered() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = s.open().await;
    let cds = stream.request(XdsType::Cluster, &[]).await;
    stream
        .send(DiscoveryRequest {
            version_info: String::new(),
            response_nonce: cds.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: "cluster rejected".into(),
                details: vec![],
            }),
            ..request(XdsType::Cluster, &[])
        })
        .await;
    stream.request(XdsType::Listener, &[]).await;
    let st = s.status(XdsType::Cluster);
    let nack = st.last_nack.expect("NACK recorded");
    assert_eq!(nack.nonce, cds.nonce);
    assert_eq!(nack.message, "cluster rejected");
    // A NACK is not an ACK.
    assert_eq!(st.acked_nonce, "");
}

#[tokio::test]
async fn a_stale_nonce_is_ignored() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = s.open().await;
    let first = stream.request(XdsType::Endpoint, &[REVIEWS]).await;
    // A new snapshot pushes a new EDS response; the first one's nonce is now stale.
    s.publish(numbered(&mesh(&["10.0.0.1", "10.0.0.2"]), 2), full());
    let pushed = stream.recv_type(XdsType::Endpoint).await;
    assert_ne!(pushed.nonce, first.nonce);
    // A NACK and a names change on the stale nonce: both ignored.
    stream
        .send(DiscoveryRequest {
            response_nonce: first.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: "late".into(),
                details: vec![],
            }),
            ..request(XdsType::Endpoint, &[REVIEWS])
        })
        .await;
    stream.ack(&first, &[REVIEWS, RATINGS]).await;
    stream.request(XdsType::Listener, &[]).await;
    let st = s.status(XdsType::Endpoint);
    assert!(st.last_nack.is_none());
    assert_eq!(st.acked_nonce, "");
    assert_eq!(st.sent_nonce, pushed.nonce);
}

#[tokio::test]
async fn an_eds_ack_with_new_names_is_answered() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = s.open().await;
    let r = stream.request(XdsType::Endpoint, &[REVIEWS]).await;
    let names: Vec<String> = decode::<ClusterLoadAssignment>(&r)
        .into_iter()
        .map(|c| c.cluster_name)
        .collect();
    assert_eq!(names, [REVIEWS]);
    stream.ack(&r, &[RATINGS, REVIEWS]).await;
    let r2 = stream.recv_type(XdsType::Endpoint).await;
    let names: Vec<String> = decode::<ClusterLoadAssignment>(&r2)
        .into_iter()
        .map(|c| c.cluster_name)
        .collect();
    assert_eq!(names, [RATINGS, REVIEWS]);
    assert_ne!(r2.nonce, r.nonce);
    assert_eq!(s.status(XdsType::Endpoint).acked_nonce, r.nonce);
}

/// A stream subscribed to every type, with everything ACKed.
async fn subscribed(s: &Server) -> Stream {
    let mut stream = s.open().await;
    for (ty, names) in [
        (XdsType::Cluster, &[][..]),
        (XdsType::Endpoint, &[REVIEWS, RATINGS][..]),
        (XdsType::Listener, &[][..]),
        (XdsType::Route, &["9080"][..]),
    ] {
        let r = stream.request(ty, names).await;
        assert!(!r.resources.is_empty(), "{ty:?}");
        stream.ack(&r, names).await;
    }
    stream
}

#[tokio::test]
async fn a_new_snapshot_pushes_only_what_changed() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = subscribed(&s).await;

    // An endpoint change, announced precisely.
    let changes = ChangeSet {
        endpoints: ["reviews.default.svc.cluster.local".to_string()].into(),
        ..Default::default()
    };
    s.publish(numbered(&mesh(&["10.0.0.1", "10.0.0.2"]), 2), changes);
    let eds = stream.recv_type(XdsType::Endpoint).await;
    // Only the assignment that changed.
    let clas = decode::<ClusterLoadAssignment>(&eds);
    assert_eq!(clas.len(), 1);
    assert_eq!(clas[0].cluster_name, REVIEWS);
    assert_eq!(
        cla_addresses(&clas[0]),
        [["10.0.0.1:9080", "10.0.0.2:9080"]]
    );
    stream.ack(&eds, &[REVIEWS, RATINGS]).await;
    // Nothing else was pushed: the probe's answer is next.
    stream.request(XdsType::Listener, &[]).await;

    // The same kind of change in a snapshot that says "everything may have changed" (and
    // skips numbers): content comparison still sends EDS alone.
    s.publish(numbered(&mesh(&["10.0.0.3"]), 5), full());
    let eds = stream.recv_type(XdsType::Endpoint).await;
    assert_eq!(decode::<ClusterLoadAssignment>(&eds).len(), 1);
    stream.ack(&eds, &[REVIEWS, RATINGS]).await;
    stream.request(XdsType::Listener, &[]).await;

    // A route change: RDS alone.
    let with_vs = mesh(&["10.0.0.3"]).with_config(virtual_service(
        "default",
        "reviews",
        "hosts: [reviews]\nhttp: [{name: vs, route: [{destination: {host: reviews}}]}]",
    ));
    s.publish(numbered(&with_vs, 6), full());
    let rds = stream.recv_type(XdsType::Route).await;
    stream.ack(&rds, &["9080"]).await;
    stream.request(XdsType::Cluster, &[]).await;

    // An identical snapshot: nothing at all.
    s.publish(numbered(&with_vs, 7), full());
    stream.request(XdsType::Listener, &[]).await;
}

/// A cluster that changed while its endpoints did not still gets its assignment: Envoy
/// warms an updated cluster until it receives it (go-control-plane#245).
#[tokio::test]
async fn a_changed_cluster_gets_its_assignment_again() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = subscribed(&s).await;

    // A DestinationRule changes the reviews cluster, not its endpoints.
    let with_dr = mesh(&["10.0.0.1"]).with_config(destination_rule(
        "default",
        "reviews",
        "host: reviews\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}",
    ));
    s.publish(numbered(&with_dr, 2), full());
    let cds = stream.recv_type(XdsType::Cluster).await;
    stream.ack(&cds, &[]).await;
    let eds = stream.recv_type(XdsType::Endpoint).await;
    let names: Vec<String> = decode::<ClusterLoadAssignment>(&eds)
        .into_iter()
        .map(|c| c.cluster_name)
        .collect();
    assert_eq!(names, [REVIEWS], "the changed cluster's assignment, only");
    stream.ack(&eds, &[REVIEWS, RATINGS]).await;
    // Owed once: nothing else follows.
    stream.request(XdsType::Listener, &[]).await;
}

/// The same on a delta stream: the changed cluster's assignment follows, at its version.
#[tokio::test]
async fn a_changed_cluster_gets_its_assignment_again_on_delta() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = Delta::open_as(&s, node(NODE_ID, "default", &[("app", "productpage")])).await;
    let cds = stream.subscribe(XdsType::Cluster, &[], &[], &[]).await;
    stream.ack(&cds).await;
    let eds = stream
        .subscribe(XdsType::Endpoint, &[REVIEWS, RATINGS], &[], &[])
        .await;
    assert_eq!(names(&eds), [RATINGS, REVIEWS]);
    stream.ack(&eds).await;

    let with_dr = mesh(&["10.0.0.1"]).with_config(destination_rule(
        "default",
        "reviews",
        "host: reviews\ntrafficPolicy: {loadBalancer: {simple: RANDOM}}",
    ));
    s.publish(numbered(&with_dr, 2), full());
    let cds = stream.recv(XdsType::Cluster).await;
    assert!(names(&cds).contains(&REVIEWS), "{:?}", names(&cds));
    stream.ack(&cds).await;
    let again = stream.recv(XdsType::Endpoint).await;
    assert_eq!(names(&again), [REVIEWS]);
    assert_eq!(again.resources[0].version, eds.resources[1].version);
}

#[tokio::test]
async fn a_bad_node_id_closes_the_stream_with_invalid_argument() {
    let s = server().await;
    s.publish(numbered(&mesh(&[]), 1), full());
    let mut stream = s.open().await;
    stream
        .send(DiscoveryRequest {
            node: Some(node("not-an-istio-node", "default", &[])),
            ..request(XdsType::Cluster, &[])
        })
        .await;
    let status = match tokio::time::timeout(HANG_GUARD, stream.responses.message()).await {
        Ok(Err(status)) => status,
        other => panic!("expected an error status, got {other:?}"),
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("not-an-istio-node"), "{status}");
    assert!(s.registry.snapshot().is_empty());
}

#[tokio::test]
async fn a_missing_node_closes_the_stream_with_invalid_argument() {
    let s = server().await;
    s.publish(numbered(&mesh(&[]), 1), full());
    let mut stream = s.open().await;
    stream
        .send(DiscoveryRequest {
            node: None,
            ..request(XdsType::Cluster, &[])
        })
        .await;
    match tokio::time::timeout(HANG_GUARD, stream.responses.message()).await {
        Ok(Err(status)) => assert_eq!(status.code(), tonic::Code::InvalidArgument),
        other => panic!("expected an error status, got {other:?}"),
    }
}

#[tokio::test]
async fn nothing_is_served_before_the_first_snapshot() {
    let s = server().await;
    let mut stream = s.open().await;
    stream.send(request(XdsType::Cluster, &[])).await;
    stream.send(request(XdsType::Listener, &[])).await;
    tokio::task::yield_now().await;
    // Requests are not even read before the first snapshot, so no proxy is registered.
    // (On its own this could pass by timing; the nonces below are the real check.)
    assert!(
        s.registry.snapshot().is_empty(),
        "request handled before any snapshot"
    );

    s.publish(numbered(&mesh(&["10.0.0.1"]), 7), full());
    // The first response is built from that snapshot, and the queued requests are answered
    // in order.
    let cds = stream.recv_type(XdsType::Cluster).await;
    assert!(cds.nonce.starts_with("7-"), "{}", cds.nonce);
    assert!(!cds.resources.is_empty());
    let lds = stream.recv_type(XdsType::Listener).await;
    assert!(lds.nonce.starts_with("7-"), "{}", lds.nonce);
}

#[tokio::test]
async fn closing_the_stream_unregisters_the_proxy() {
    let s = server().await;
    s.publish(numbered(&mesh(&[]), 1), full());
    let mut stream = s.open().await;
    stream.request(XdsType::Cluster, &[]).await;
    assert_eq!(s.registry.snapshot().len(), 1);
    let Stream { tx, mut responses } = stream;
    drop(tx);
    // The server ends its side once the request stream ends.
    let end = tokio::time::timeout(HANG_GUARD, responses.message()).await;
    assert!(matches!(end, Ok(Ok(None))), "{end:?}");
    // The server unregisters before it drops its end of the stream.
    assert!(s.registry.snapshot().is_empty());
}

#[tokio::test]
async fn a_nack_is_not_retried_with_the_same_content() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = s.open().await;
    let cds = stream.request(XdsType::Cluster, &[]).await;
    stream
        .send(DiscoveryRequest {
            response_nonce: cds.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: "rejected".into(),
                details: vec![],
            }),
            ..request(XdsType::Cluster, &[])
        })
        .await;
    // A new snapshot with the same clusters: the rejected version is not sent again.
    s.publish(numbered(&mesh(&["10.0.0.2"]), 2), full());
    stream.request(XdsType::Listener, &[]).await;
    // Different clusters: sent.
    let more = mesh(&["10.0.0.2"]).with_service(service("default", "details", &[("http", 9080)]));
    s.publish(numbered(&more, 3), full());
    let again = stream.recv_type(XdsType::Cluster).await;
    assert_ne!(again.version_info, cds.version_info);
}

#[tokio::test]
async fn unsupported_types_are_ignored() {
    let s = server().await;
    s.publish(numbered(&mesh(&[]), 1), full());
    let mut stream = s.open().await;
    stream
        .send(DiscoveryRequest {
            type_url: "type.googleapis.com/envoy.service.runtime.v3.Runtime".into(),
            ..request(XdsType::Cluster, &[])
        })
        .await;
    stream.request(XdsType::Cluster, &[]).await;
}

#[tokio::test]
async fn replicas_agree_on_versions() {
    let (a, b) = (server().await, server().await);
    a.publish(numbered(&mesh(&["10.0.0.1", "10.0.0.2"]), 1), full());
    b.publish(numbered(&mesh(&["10.0.0.2", "10.0.0.1"]), 40), full());
    let (mut sa, mut sb) = (a.open().await, b.open().await);
    for (ty, names) in [
        (XdsType::Cluster, &[][..]),
        (XdsType::Endpoint, &[REVIEWS, RATINGS][..]),
        (XdsType::Listener, &[][..]),
        (XdsType::Route, &["9080"][..]),
    ] {
        let (ra, rb) = (sa.request(ty, names).await, sb.request(ty, names).await);
        assert_eq!(ra.version_info, rb.version_info, "{ty:?}");
        assert_eq!(ra.resources, rb.resources, "{ty:?}");
        assert_ne!(ra.nonce, rb.nonce);
    }
}

fn with_gateway(base: Mesh, ports: &[u32]) -> Mesh {
    let servers: String = ports
        .iter()
        .map(|p| {
            format!("- port: {{number: {p}, name: http-{p}, protocol: HTTP}}\n  hosts: [\"*\"]\n")
        })
        .collect();
    base.with_config(gateway(
        "istio-system",
        "public",
        &format!("selector: {{istio: ingressgateway}}\nservers:\n{servers}"),
    ))
}

#[tokio::test]
async fn a_gateway_change_reaches_gateways_only() {
    let s = server().await;
    s.publish(
        numbered(&with_gateway(mesh(&["10.0.0.1"]), &[80]), 1),
        full(),
    );
    let mut sidecar = subscribed(&s).await;
    let mut gw = s.open().await;
    let gw_node = node(
        "router~10.1.0.9~gw-1.istio-system~istio-system.svc.cluster.local",
        "istio-system",
        &[("istio", "ingressgateway")],
    );
    let gw_request = |ty: XdsType, names: &[&str]| DiscoveryRequest {
        node: Some(gw_node.clone()),
        ..request(ty, names)
    };
    for (ty, names) in [
        (XdsType::Cluster, &[][..]),
        (XdsType::Listener, &[][..]),
        (XdsType::Route, &["http.80"][..]),
    ] {
        gw.send(gw_request(ty, names)).await;
        let r = gw.recv_type(ty).await;
        gw.ack(&r, names).await;
    }

    let changes = ChangeSet {
        config: [shoal_common::model::ConfigKind::Gateway].into(),
        ..Default::default()
    };
    s.publish(
        numbered(&with_gateway(mesh(&["10.0.0.1"]), &[80, 8080]), 2),
        changes,
    );
    // The gateway gets its new listener; its routes for port 80 did not change.
    let lds = gw.recv_type(XdsType::Listener).await;
    assert_eq!(lds.resources.len(), 2);
    gw.ack(&lds, &[]).await;
    gw.send(gw_request(XdsType::Cluster, &[])).await;
    gw.recv_type(XdsType::Cluster).await;
    // The sidecar gets nothing.
    sidecar.request(XdsType::Listener, &[]).await;
}

/// Istio's `shouldRespond` answers a request that carries a nonce on a stream that has
/// sent nothing for that type yet (a proxy reconnecting from another replica, which kept
/// its last nonce): "INIT/RECONNECT". shoal treats that nonce as stale and never answers,
/// so such a client waits forever for that type.
#[tokio::test]
async fn a_reconnecting_proxy_with_an_old_nonce_is_answered() {
    let s = server().await;
    s.publish(numbered(&mesh(&["10.0.0.1"]), 1), full());
    let mut stream = s.open().await;
    stream
        .send(DiscoveryRequest {
            version_info: "from-another-replica".into(),
            response_nonce: "other-replica-42".into(),
            ..request(XdsType::Cluster, &[])
        })
        .await;
    stream.send(request(XdsType::Listener, &[])).await;
    let first = stream.recv().await;
    assert_eq!(
        first.type_url,
        XdsType::Cluster.type_url(),
        "the reconnect request was not answered"
    );
}

/// A delta ADS stream; requests carry `node` (ztunnel's unless opened as another proxy).
struct Delta {
    node: shoal_proto::pb::envoy::config::core::v3::Node,
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
}

impl Delta {
    async fn open(s: &Server) -> Delta {
        Delta::open_as(s, node(ztunnel::ZTUNNEL, "istio-system", &[])).await
    }

    async fn open_as(s: &Server, node: shoal_proto::pb::envoy::config::core::v3::Node) -> Delta {
        let (tx, rx) = mpsc::channel(16);
        let responses = s
            .client
            .clone()
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("stream opens")
            .into_inner();
        Delta {
            node,
            tx,
            responses,
        }
    }

    async fn send(&self, req: DeltaDiscoveryRequest) {
        self.tx.send(req).await.expect("request sent");
    }

    async fn recv(&mut self, ty: XdsType) -> DeltaDiscoveryResponse {
        let r = match tokio::time::timeout(HANG_GUARD, self.responses.message()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("no response: {other:?}"),
        };
        assert_eq!(r.type_url, ty.type_url());
        r
    }

    async fn subscribe(
        &mut self,
        ty: XdsType,
        sub: &[&str],
        unsub: &[&str],
        held: &[(&str, &str)],
    ) -> DeltaDiscoveryResponse {
        self.send(DeltaDiscoveryRequest {
            node: Some(self.node.clone()),
            type_url: ty.type_url().into(),
            resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
            initial_resource_versions: held
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
        .await;
        self.recv(ty).await
    }

    async fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .await;
    }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
    r.resources.iter().map(|r| r.name.as_str()).collect()
}

// ---------------------------------------------------------------------------------------
// ztunnel: delta ADS, the two ambient types

mod ztunnel {
    use super::*;

    pub(super) const ZTUNNEL: &str =
        "ztunnel~10.1.0.3~ztunnel-1.istio-system~istio-system.svc.cluster.local";

    fn ambient_mesh(pods: &[(&str, &str)]) -> Mesh {
        let eps = pods
            .iter()
            .map(|(ip, name)| shoal_common::model::Endpoint {
                pod: name.to_string(),
                node: "node-1".into(),
                ambient: true,
                ..endpoint(ip, &[("app", "server")])
            })
            .collect();
        Mesh::new()
            .with_service(service("demo", "server", &[("tcp", 9000)]))
            .with_slice(slice("demo", "server", "server-a", &[("tcp", 8080)], eps))
            .with_config(authorization_policy(
                "demo",
                "allow",
                "rules: [{from: [{source: {namespaces: [demo]}}]}]\n",
            ))
    }

    #[tokio::test]
    async fn wildcard_updates_on_demand_and_resume() {
        let s = server().await;
        s.publish(
            numbered(&ambient_mesh(&[("10.1.0.10", "server-1")]), 1),
            full(),
        );
        let mut z = Delta::open(&s).await;
        // ztunnel's wildcard: no names (or `*`) on the first request.
        let a = z.subscribe(XdsType::Address, &[], &[], &[]).await;
        assert_eq!(
            names(&a),
            [
                "Kubernetes//Pod/demo/server-1",
                "demo/server.demo.svc.cluster.local"
            ]
        );
        z.ack(&a).await;
        let p = z.subscribe(XdsType::Authorization, &["*"], &[], &[]).await;
        assert_eq!(names(&p), ["demo/allow"]);
        z.ack(&p).await;

        // A new pod: only it is sent.
        let two = ambient_mesh(&[("10.1.0.10", "server-1"), ("10.1.0.11", "server-2")]);
        s.publish(numbered(&two, 2), full());
        let a2 = z.recv(XdsType::Address).await;
        assert_eq!(names(&a2), ["Kubernetes//Pod/demo/server-2"]);
        assert!(a2.removed_resources.is_empty());
        z.ack(&a2).await;
        // The pod goes: removed by name.
        s.publish(
            numbered(&ambient_mesh(&[("10.1.0.10", "server-1")]), 3),
            full(),
        );
        let a3 = z.recv(XdsType::Address).await;
        assert!(a3.resources.is_empty());
        assert_eq!(a3.removed_resources, ["Kubernetes//Pod/demo/server-2"]);
        z.ack(&a3).await;

        // Resume: a reconnecting ztunnel holding current versions gets none resent.
        let held: Vec<(String, String)> = a
            .resources
            .iter()
            .map(|r| (r.name.clone(), r.version.clone()))
            .collect();
        let held: Vec<(&str, &str)> = held.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let mut again = Delta::open(&s).await;
        let r = again.subscribe(XdsType::Address, &[], &[], &held).await;
        assert!(r.resources.is_empty(), "{:?}", names(&r));

        // On demand (`XDS_ON_DEMAND`): `*` unsubscribed, then addresses by IP.
        let mut od = Delta::open(&s).await;
        let r = od.subscribe(XdsType::Address, &["*"], &["*"], &[]).await;
        assert!(r.resources.is_empty());
        od.ack(&r).await;
        let r = od
            .subscribe(XdsType::Address, &["/10.1.0.10"], &[], &[])
            .await;
        assert_eq!(names(&r), ["Kubernetes//Pod/demo/server-1"]);
    }

    /// On demand, as istiod's `WorkloadGenerator` answers: the resource under its own
    /// name with its `<network>/<ip>` names as `aliases`; an address that names nothing
    /// answered in `removed_resources` (so ztunnel stops waiting for it); the resource
    /// removed under its own name when it goes.
    #[tokio::test]
    async fn on_demand_aliases_and_removals() {
        let s = server().await;
        let two = ambient_mesh(&[("10.1.0.10", "server-1"), ("10.1.0.11", "server-2")]);
        s.publish(numbered(&two, 1), full());
        let mut od = Delta::open(&s).await;
        let r = od.subscribe(XdsType::Address, &["*"], &["*"], &[]).await;
        od.ack(&r).await;
        let r = od
            .subscribe(XdsType::Address, &["/10.1.0.11"], &[], &[])
            .await;
        assert_eq!(names(&r), ["Kubernetes//Pod/demo/server-2"]);
        assert_eq!(r.resources[0].aliases, ["/10.1.0.11"]);
        assert!(r.removed_resources.is_empty());
        od.ack(&r).await;
        let r = od
            .subscribe(XdsType::Address, &["/10.9.9.9"], &[], &[])
            .await;
        assert!(r.resources.is_empty(), "{:?}", names(&r));
        assert_eq!(r.removed_resources, ["/10.9.9.9"]);
        od.ack(&r).await;
        // Asked again (ztunnel does): answered again; so is a name it holds.
        let r = od
            .subscribe(XdsType::Address, &["/10.9.9.9"], &[], &[])
            .await;
        assert_eq!(r.removed_resources, ["/10.9.9.9"]);
        od.ack(&r).await;
        let r = od
            .subscribe(XdsType::Address, &["/10.1.0.11"], &[], &[])
            .await;
        assert!(
            r.resources.is_empty() && r.removed_resources.is_empty(),
            "{r:?}"
        );
        od.ack(&r).await;
        // The pod asked for by address goes: removed by its own name.
        s.publish(
            numbered(&ambient_mesh(&[("10.1.0.10", "server-1")]), 2),
            full(),
        );
        let r = od.recv(XdsType::Address).await;
        assert!(r.resources.is_empty(), "{:?}", names(&r));
        assert_eq!(r.removed_resources, ["Kubernetes//Pod/demo/server-2"]);
        od.ack(&r).await;
        // It comes back at that address: sent again, as asked before.
        s.publish(numbered(&two, 3), full());
        let r = od.recv(XdsType::Address).await;
        assert_eq!(names(&r), ["Kubernetes//Pod/demo/server-2"]);
        assert_eq!(r.resources[0].aliases, ["/10.1.0.11"]);
    }

    /// A WorkloadEntry change pushes ztunnels (a config change of that kind alone): the
    /// entry appears with the ServiceEntry that selects it, and is removed when deleted.
    #[tokio::test]
    async fn workload_entries_push_ztunnels() {
        let s = server().await;
        let base = ambient_mesh(&[("10.1.0.10", "server-1")]).with_config(service_entry(
            "demo",
            "vm",
            "hosts: [vm.example.com]\nports: [{number: 80, name: http, protocol: HTTP}]\n\
             resolution: STATIC\nworkloadSelector: {labels: {app: vm}}\n",
        ));
        s.publish(numbered(&base, 1), full());
        let mut z = Delta::open(&s).await;
        let a = z.subscribe(XdsType::Address, &[], &[], &[]).await;
        z.ack(&a).await;
        let entry_change = || ChangeSet {
            config: [shoal_common::model::ConfigKind::WorkloadEntry].into(),
            ..Default::default()
        };
        let with_vm = base.clone().with_config(workload_entry(
            "demo",
            "vm-1",
            "address: 10.2.0.5\nlabels: {app: vm}\nserviceAccount: vm\n",
        ));
        s.publish(numbered(&with_vm, 2), entry_change());
        let r = z.recv(XdsType::Address).await;
        let uid = "Kubernetes/networking.istio.io/WorkloadEntry/demo/vm-1";
        assert_eq!(names(&r), [uid]);
        let address = shoal_proto::istio_workload::Address::decode(
            &*r.resources[0].resource.as_ref().unwrap().value,
        )
        .unwrap();
        let Some(shoal_proto::istio_workload::address::Type::Workload(w)) = address.r#type else {
            panic!("not a workload: {address:?}");
        };
        assert_eq!(
            w.services.keys().collect::<Vec<_>>(),
            ["demo/vm.example.com"]
        );
        z.ack(&r).await;
        s.publish(numbered(&base, 3), entry_change());
        let r = z.recv(XdsType::Address).await;
        assert!(r.resources.is_empty());
        assert_eq!(r.removed_resources, [uid]);
    }
}
