//! The `StateBus` conformance suite against a real nats-server, one fresh server per case.
#![forbid(unsafe_code)]

use shoal_common::bus::conformance::run_all;
use shoal_common::bus::nats::{NatsBus, NatsOptions};
use shoal_common::StateBus;
use shoal_tests::NatsServer;
use std::sync::{Arc, Mutex};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_bus_conforms() {
    // The servers must outlive each case's bus; they are dropped (killed) at the end, and on
    // a failed case too, since the Vec is owned by this test.
    let servers: Arc<Mutex<Vec<NatsServer>>> = Arc::default();
    run_all(|| {
        let servers = servers.clone();
        async move {
            let server = NatsServer::start().await;
            let bus = NatsBus::connect(&NatsOptions::new(server.url()))
                .await
                .unwrap_or_else(|e| panic!("connecting to {}: {e}", server.url()));
            servers.lock().unwrap().push(server);
            Arc::new(bus) as Arc<dyn StateBus>
        }
    })
    .await;
    servers.lock().unwrap().clear();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_bus_works_on_a_three_node_cluster() {
    let cluster = NatsServer::cluster3().await;
    // One seed URL: the client learns the other nodes from the server (the comma-separated
    // list has its own test below).
    let mut opts = NatsOptions::new(cluster.nodes()[0].url());
    opts.replicas = 3;
    let bus = NatsBus::connect(&opts)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", opts.url));
    let bus: Arc<dyn StateBus> = Arc::new(bus);
    shoal_common::bus::conformance::initial_values_first(bus.clone()).await;
    shoal_common::bus::conformance::compare_and_set(bus).await;
}

#[tokio::test]
async fn nats_options_take_a_comma_separated_server_list() {
    // `NatsOptions::url` is documented as "server URL(s), comma-separated"; the first listed
    // server is down, so connecting proves the list was split and the second one tried.
    let live = NatsServer::start().await;
    let dead = format!("nats://127.0.0.1:{}", shoal_tests::ports::free_port());
    let url = format!("{dead},{}", live.url());
    let bus = NatsBus::connect(&NatsOptions::new(url.clone()))
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    shoal_common::bus::conformance::get_and_keys(Arc::new(bus)).await;
}

#[tokio::test]
async fn check_buckets_finds_a_purged_bucket() {
    use shoal_common::bus::nats::Loss;
    use shoal_common::bus::Bucket;
    let server = NatsServer::start().await;
    let bus = NatsBus::connect(&NatsOptions::new(server.url()))
        .await
        .expect("bus");
    bus.put(Bucket::Endpoints, "a", "1".into()).await.unwrap();
    bus.put(Bucket::Endpoints, "b", "1".into()).await.unwrap();
    bus.delete(Bucket::Endpoints, "b").await.unwrap();
    bus.put(Bucket::Endpoints, "a", "2".into()).await.unwrap();
    // Overwrites and deletes (markers) never lower the count.
    assert!(bus.check_buckets().await.unwrap().is_empty());
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("KV_shoal-endpoints").await.unwrap();
    stream.purge().await.unwrap();
    let losses = bus.data_losses().unwrap();
    assert_eq!(
        bus.check_buckets().await.unwrap(),
        vec![(Bucket::Endpoints, Loss::Purged)]
    );
    assert_eq!(*losses.borrow(), 1);
    // Reported once; what is written again counts from there.
    assert!(bus.check_buckets().await.unwrap().is_empty());
    bus.put(Bucket::Endpoints, "a", "3".into()).await.unwrap();
    assert!(bus.check_buckets().await.unwrap().is_empty());

    // Purged right after a write, before any check saw the count rise: the bucket this
    // handle wrote to is empty.
    bus.put(Bucket::Services, "s", "1".into()).await.unwrap();
    js.get_stream("KV_shoal-services")
        .await
        .unwrap()
        .purge()
        .await
        .unwrap();
    assert_eq!(
        bus.check_buckets().await.unwrap(),
        vec![(Bucket::Services, Loss::Purged)]
    );
    assert_eq!(*losses.borrow(), 2);
}
