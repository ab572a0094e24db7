//! The test harness itself: processes start, answer, and go away.
#![forbid(unsafe_code)]

use shoal_tests::bootstrap::{bootstrap, Node};
use shoal_tests::ports::free_port;
use shoal_tests::{Envoy, NatsServer};

#[tokio::test]
async fn nats_server_starts_and_dies_on_kill() {
    let mut nats = NatsServer::start().await;
    let client = async_nats::connect(nats.url()).await.unwrap();
    client.flush().await.unwrap();
    nats.kill().await;
    assert!(async_nats::connect(nats.url()).await.is_err());
}

#[tokio::test]
async fn envoy_starts_with_a_shoal_bootstrap() {
    // No control plane is listening: Envoy still starts, and keeps retrying ADS.
    let xds = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let envoy = Envoy::start(&bootstrap(&Node::gateway(), free_port(), &[xds])).await;
    assert_eq!(envoy.stat_sum("update_rejected").await, 0);
    let dump = envoy.config_dump().await;
    assert!(dump.to_string().contains("xds-grpc"), "{dump}");
    assert!(envoy.listeners().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_cluster_replicates_a_stream_over_three_nodes() {
    use async_nats::jetstream::{self, stream};
    let cluster = NatsServer::cluster3().await;
    let js = jetstream::new(async_nats::connect(cluster.nodes()[0].url()).await.unwrap());
    let info = js
        .create_stream(stream::Config {
            name: "replicated".into(),
            subjects: vec!["r.>".into()],
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .cached_info()
        .clone();
    let cluster_info = info.cluster.expect("cluster info for a replicated stream");
    assert_eq!(cluster_info.replicas.len(), 2, "{cluster_info:?}");
}
