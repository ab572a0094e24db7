//! Pipeline tests: the first snapshot waits for every bucket's initial state, debouncing
//! (quiet period and maximum delay), and PushContext reuse on endpoint-only changes. Time is
//! tokio's paused clock: sleeps advance it instantly and deterministically.

use crate::push::metrics::PushMetrics;
use crate::push::pipeline::{self, Debounce, Published};
use crate::testutil::*;
use async_trait::async_trait;
use bytes::Bytes;
use shoal_common::bus::{Bucket, BusError, Entry, StateBus, WatchStream};
use shoal_common::MemoryBus;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

const DEBOUNCE: Debounce = Debounce {
    after: Duration::from_millis(100),
    max: Duration::from_secs(10),
    eds_after: Duration::from_millis(10),
    eds_max: Duration::from_millis(100),
};

/// A memory bus whose watch of one bucket does not start until the gate opens, so that
/// bucket's initial state arrives late.
struct GatedBus {
    inner: MemoryBus,
    gated: Bucket,
    open: watch::Receiver<bool>,
}

#[async_trait]
impl StateBus for GatedBus {
    async fn get(&self, bucket: Bucket, key: &str) -> Result<Option<Entry>, BusError> {
        self.inner.get(bucket, key).await
    }
    async fn put(&self, bucket: Bucket, key: &str, value: Bytes) -> Result<u64, BusError> {
        self.inner.put(bucket, key, value).await
    }
    async fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
        expected: u64,
    ) -> Result<u64, BusError> {
        self.inner.update(bucket, key, value, expected).await
    }
    async fn delete(&self, bucket: Bucket, key: &str) -> Result<(), BusError> {
        self.inner.delete(bucket, key).await
    }
    async fn keys(&self, bucket: Bucket) -> Result<Vec<String>, BusError> {
        self.inner.keys(bucket).await
    }
    async fn watch(&self, bucket: Bucket) -> Result<WatchStream, BusError> {
        if bucket == self.gated {
            let mut open = self.open.clone();
            let _ = open.wait_for(|o| *o).await;
        }
        self.inner.watch(bucket).await
    }
}

async fn write(bus: &dyn StateBus, bucket: Bucket, entry: Entry) {
    bus.put(bucket, &entry.key, entry.value)
        .await
        .expect("memory bus put");
}

/// Runs the pipeline on `bus` with Istio's default mesh settings and no expected fleets.
fn run(
    bus: Arc<dyn StateBus>,
    debounce: Debounce,
    gate: pipeline::FleetGate,
    metrics: PushMetrics,
) -> watch::Receiver<Option<Published>> {
    let (tx, rx) = watch::channel(None);
    let (keep, mesh) = watch::channel(Arc::new(crate::index::mesh_config::MeshSettings::default()));
    let config = pipeline::PipelineConfig {
        debounce,
        mesh,
        gate,
        credential_keys: None,
        jwks: None,
    };
    tokio::spawn(async move {
        let _keep = keep;
        pipeline::run(bus, config, metrics, tx).await
    });
    rx
}

fn start(bus: Arc<dyn StateBus>, debounce: Debounce) -> watch::Receiver<Option<Published>> {
    run(
        bus,
        debounce,
        pipeline::FleetGate::default(),
        PushMetrics::register(&prometheus::Registry::new()),
    )
}

/// Waits for the next snapshot.
async fn next(rx: &mut watch::Receiver<Option<Published>>) -> Published {
    rx.changed().await.expect("pipeline running");
    rx.borrow_and_update().clone().expect("a snapshot")
}

async fn seeded_bus() -> MemoryBus {
    let bus = MemoryBus::new();
    write(
        &bus,
        Bucket::Services,
        service_put(&service("default", "reviews", &[("http", 9080)])),
    )
    .await;
    write(
        &bus,
        Bucket::Endpoints,
        slice_put(&reviews_slice(&["10.0.0.1"])),
    )
    .await;
    write(
        &bus,
        Bucket::Config,
        config_put(&destination_rule("default", "reviews", "host: reviews")),
    )
    .await;
    bus
}

/// Publishes a service on the bus.
async fn put_service(bus: &MemoryBus, svc: &shoal_common::model::Service) {
    write(bus, Bucket::Services, service_put(svc)).await;
}

fn reviews_slice(addresses: &[&str]) -> shoal_common::model::EndpointSet {
    slice(
        "default",
        "reviews",
        "reviews-abc",
        &[("http", 8080)],
        addresses.iter().map(|a| endpoint(a, &[])).collect(),
    )
}

fn config_number(i: usize) -> Entry {
    config_put(&destination_rule(
        "default",
        &format!("dr-{i}"),
        &format!("host: svc-{i}"),
    ))
}

#[tokio::test(start_paused = true)]
async fn no_snapshot_until_every_bucket_is_loaded_then_one_at_once() {
    let (open, gate) = watch::channel(false);
    let bus = Arc::new(GatedBus {
        inner: seeded_bus().await,
        gated: Bucket::Endpoints,
        open: gate,
    });
    let mut rx = start(bus, DEBOUNCE);
    // Config and services are loaded; endpoints are not: nothing, however long we wait.
    sleep(Duration::from_secs(60)).await;
    assert!(rx.borrow().is_none());
    assert!(!rx.has_changed().unwrap());

    let opened = Instant::now();
    open.send(true).unwrap();
    let p = next(&mut rx).await;
    // Published at once, not after a debounce window.
    assert!(opened.elapsed() < DEBOUNCE.after, "{:?}", opened.elapsed());
    assert_eq!(p.snapshot.number, 1);
    assert!(p
        .snapshot
        .ctx
        .services
        .contains_key("reviews.default.svc.cluster.local"));
    assert!(p
        .snapshot
        .endpoints
        .host("reviews.default.svc.cluster.local")
        .is_some());
    assert_eq!(p.snapshot.ctx.destination_rules.len(), 1);
    // And nothing more without changes.
    sleep(Duration::from_secs(60)).await;
    assert!(!rx.has_changed().unwrap());
}

#[tokio::test(start_paused = true)]
async fn empty_buckets_still_give_a_first_snapshot() {
    let mut rx = start(Arc::new(MemoryBus::new()), DEBOUNCE);
    let p = next(&mut rx).await;
    assert_eq!(p.snapshot.number, 1);
    assert!(p.snapshot.ctx.services.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_changes_yields_one_snapshot_after_the_quiet_period() {
    let bus = Arc::new(seeded_bus().await);
    let mut rx = start(bus.clone(), DEBOUNCE);
    assert_eq!(next(&mut rx).await.snapshot.number, 1);

    let mut last = Instant::now();
    for i in 0..5 {
        if i > 0 {
            sleep(Duration::from_millis(50)).await;
            assert!(
                !rx.has_changed().unwrap(),
                "published mid-burst at change {i}"
            );
        }
        write(&*bus, Bucket::Config, config_number(i)).await;
        last = Instant::now();
    }
    let p = next(&mut rx).await;
    let quiet = last.elapsed();
    assert!(
        quiet >= DEBOUNCE.after && quiet < DEBOUNCE.after + Duration::from_millis(5),
        "{quiet:?}"
    );
    // One snapshot for the whole burst, holding every change.
    assert_eq!(p.snapshot.number, 2);
    assert_eq!(p.snapshot.ctx.destination_rules.len(), 6);
    sleep(Duration::from_secs(60)).await;
    assert!(!rx.has_changed().unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_continuous_stream_of_changes_is_cut_at_max() {
    let debounce = Debounce {
        max: Duration::from_secs(1),
        ..DEBOUNCE
    };
    let bus = Arc::new(seeded_bus().await);
    let mut rx = start(bus.clone(), debounce);
    assert_eq!(next(&mut rx).await.snapshot.number, 1);

    let first = Instant::now();
    let producer = {
        let bus = bus.clone();
        tokio::spawn(async move {
            for i in 0..60 {
                write(&*bus, Bucket::Config, config_number(i)).await;
                sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let p = next(&mut rx).await;
    let delay = first.elapsed();
    assert!(
        delay >= debounce.max && delay < debounce.max + Duration::from_millis(50),
        "{delay:?}"
    );
    assert_eq!(p.snapshot.number, 2);
    assert!(!producer.is_finished(), "the stream was still going");
    // Changes up to the cut are in (one every 50 ms from t=0 to t=1s).
    let n = p.snapshot.ctx.destination_rules.len() - 1;
    assert!((20..=21).contains(&n), "{n}");
    producer.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn endpoint_changes_reuse_the_push_context() {
    let bus = Arc::new(seeded_bus().await);
    let mut rx = start(bus.clone(), DEBOUNCE);
    let s1 = next(&mut rx).await.snapshot;

    write(
        &*bus,
        Bucket::Endpoints,
        slice_put(&reviews_slice(&["10.0.0.1", "10.0.0.2"])),
    )
    .await;
    let s2 = next(&mut rx).await.snapshot;
    assert_eq!(s2.number, 2);
    assert!(
        Arc::ptr_eq(&s1.ctx, &s2.ctx),
        "endpoint change rebuilt the context"
    );
    let host = "reviews.default.svc.cluster.local";
    let eps = |s: &crate::generate::Snapshot| {
        s.endpoints
            .host(host)
            .unwrap()
            .values()
            .next()
            .unwrap()
            .endpoints
            .len()
    };
    assert_eq!((eps(&s1), eps(&s2)), (1, 2));

    write(&*bus, Bucket::Config, config_number(1)).await;
    let s3 = next(&mut rx).await.snapshot;
    assert!(
        !Arc::ptr_eq(&s2.ctx, &s3.ctx),
        "config change reused the context"
    );
    assert_eq!(s3.ctx.destination_rules.len(), 2);
    // The new context shares the service views that did not change (cache keys hold them).
    let reviews = "reviews.default.svc.cluster.local";
    let same_view = |a: &crate::generate::Snapshot, b: &crate::generate::Snapshot| {
        Arc::ptr_eq(&a.ctx.services[reviews], &b.ctx.services[reviews])
    };
    assert!(same_view(&s2, &s3));

    put_service(&bus, &service("default", "ratings", &[("http", 9080)])).await;
    let s4 = next(&mut rx).await.snapshot;
    assert!(
        !Arc::ptr_eq(&s3.ctx, &s4.ctx),
        "service change reused the context"
    );
    assert_eq!(s4.ctx.services.len(), 2);
    assert!(same_view(&s3, &s4));

    // A changed service gets a view of its own.
    put_service(&bus, &service("default", "reviews", &[("http", 9081)])).await;
    let s5 = next(&mut rx).await.snapshot;
    assert!(!same_view(&s4, &s5));
    assert_eq!(s5.ctx.services[reviews].ports[0].port, 9081);
}

/// A cluster's network label changing (the ingester republishes the cluster's slices with
/// it) is not an endpoints-only change: proxies without `NETWORK` metadata move network,
/// so the context is rebuilt and every proxy is pushed.
#[tokio::test(start_paused = true)]
async fn a_cluster_network_change_is_a_full_push() {
    let bus = Arc::new(seeded_bus().await);
    let mut rx = start(bus.clone(), DEBOUNCE);
    let s1 = next(&mut rx).await.snapshot;
    assert!(s1.ctx.cluster_networks.is_empty());

    let mut labelled = reviews_slice(&["10.0.0.1"]);
    labelled.network = "net1".into();
    write(&*bus, Bucket::Endpoints, slice_put(&labelled)).await;
    let p2 = next(&mut rx).await;
    assert!(p2.changes.full, "a network change is a full push");
    assert!(!Arc::ptr_eq(&s1.ctx, &p2.snapshot.ctx));
    assert_eq!(
        p2.snapshot
            .ctx
            .cluster_networks
            .values()
            .collect::<Vec<_>>(),
        ["net1"]
    );

    // Endpoints changing under the same network keep the context.
    labelled.endpoints = reviews_slice(&["10.0.0.1", "10.0.0.2"]).endpoints;
    write(&*bus, Bucket::Endpoints, slice_put(&labelled)).await;
    let p3 = next(&mut rx).await;
    assert!(!p3.changes.full);
    assert!(Arc::ptr_eq(&p2.snapshot.ctx, &p3.snapshot.ctx));
}

#[tokio::test(start_paused = true)]
async fn unchanged_and_invalid_entries_publish_nothing() {
    let bus = Arc::new(seeded_bus().await);
    let mut rx = start(bus.clone(), DEBOUNCE);
    let s1 = next(&mut rx).await.snapshot;

    // The same value again, and a payload that does not decode.
    write(
        &*bus,
        Bucket::Services,
        service_put(&service("default", "reviews", &[("http", 9080)])),
    )
    .await;
    let mut garbage = config_number(7);
    garbage.value = Bytes::from_static(b"\xc1garbage");
    write(&*bus, Bucket::Config, garbage).await;
    sleep(Duration::from_secs(60)).await;
    assert!(!rx.has_changed().unwrap());

    // The pipeline goes on.
    write(&*bus, Bucket::Config, config_number(8)).await;
    let s2 = next(&mut rx).await.snapshot;
    assert_eq!(s2.number, s1.number + 1);
    assert_eq!(s2.ctx.destination_rules.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn deletes_are_changes() {
    let bus = Arc::new(seeded_bus().await);
    let mut rx = start(bus.clone(), DEBOUNCE);
    next(&mut rx).await;
    bus.delete(Bucket::Endpoints, &slice_put(&reviews_slice(&[])).key)
        .await
        .unwrap();
    let s = next(&mut rx).await.snapshot;
    assert!(s
        .endpoints
        .host("reviews.default.svc.cluster.local")
        .is_none());
}

/// The lease of fleet `test` (the fixtures' fleet, whose entries carry epoch 1).
fn lease(epoch: u64) -> Entry {
    let body = shoal_common::lease::LeaseBody {
        holder: "ingester-1".into(),
        epoch,
        renewed_at_ms: 1_000,
        ttl_ms: 10_000,
        since_revision: 0,
    };
    Entry {
        key: shoal_common::keys::lease_key("test"),
        value: Bytes::from(shoal_common::lease::encode("test", &body).unwrap()),
        revision: 0,
        op: shoal_common::bus::Op::Put,
    }
}

#[tokio::test(start_paused = true)]
async fn the_first_snapshot_waits_for_the_meta_bucket() {
    let (open, gate) = watch::channel(false);
    let bus = Arc::new(GatedBus {
        inner: seeded_bus().await,
        gated: Bucket::Meta,
        open: gate,
    });
    write(&*bus, Bucket::Meta, lease(2)).await;
    let mut rx = start(bus, DEBOUNCE);
    sleep(Duration::from_secs(60)).await;
    assert!(rx.borrow().is_none());
    open.send(true).unwrap();
    let p = next(&mut rx).await;
    // Initial values written at an older epoch than the lease are the current state.
    assert_eq!(p.snapshot.ctx.services.len(), 1);
    assert_eq!(p.snapshot.ctx.destination_rules.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn live_writes_of_a_deposed_leader_are_refused() {
    let bus = Arc::new(seeded_bus().await);
    write(&*bus, Bucket::Meta, lease(1)).await;
    let registry = prometheus::Registry::new();
    let metrics = PushMetrics::register(&registry);
    let mut rx = run(
        bus.clone(),
        DEBOUNCE,
        pipeline::FleetGate::default(),
        metrics.clone(),
    );
    let s1 = next(&mut rx).await.snapshot;

    // A new leader took the lease: the old one's writes (epoch 1) are refused.
    write(&*bus, Bucket::Meta, lease(2)).await;
    write(&*bus, Bucket::Config, config_number(1)).await;
    sleep(Duration::from_secs(60)).await;
    assert!(!rx.has_changed().unwrap());
    let text = shoal_common::metrics::render(&registry);
    assert!(
        text.contains(r#"shoal_bus_entries_total{bucket="shoal-config",result="fenced"} 1"#),
        "{text}"
    );

    // The new leader's writes apply.
    let mut current = config_number(2);
    let obj = destination_rule("default", "dr-2", "host: svc-2");
    current.value = Bytes::from(
        shoal_common::Envelope::new("test", 2, 1_000, &obj)
            .encode()
            .unwrap(),
    );
    write(&*bus, Bucket::Config, current).await;
    let s2 = next(&mut rx).await.snapshot;
    assert_eq!(s2.number, s1.number + 1);
    assert_eq!(s2.ctx.destination_rules.len(), 2);
}

fn gated(
    bus: Arc<dyn StateBus>,
    expect: &[&str],
    timeout: Option<Duration>,
    metrics: PushMetrics,
) -> watch::Receiver<Option<Published>> {
    let gate = pipeline::FleetGate {
        expect: expect.iter().map(|f| f.to_string()).collect(),
        timeout,
    };
    run(bus, DEBOUNCE, gate, metrics)
}

async fn mark_synced(bus: &dyn StateBus, fleet: &str) {
    let body = shoal_common::synced::SyncedBody {
        fleet: fleet.into(),
        since_ms: 1,
    };
    let value = shoal_common::synced::encode(0, &body).expect("encodes");
    bus.put(
        Bucket::Meta,
        &shoal_common::keys::synced_key(fleet),
        value.into(),
    )
    .await
    .expect("memory bus put");
}

#[tokio::test(start_paused = true)]
async fn the_first_snapshot_waits_for_every_expected_fleet() {
    let bus: Arc<dyn StateBus> = Arc::new(seeded_bus().await);
    mark_synced(&*bus, "east").await;
    let metrics = PushMetrics::register(&prometheus::Registry::new());
    let mut rx = gated(
        bus.clone(),
        &["east", "west"],
        Some(Duration::from_secs(30)),
        metrics.clone(),
    );
    sleep(Duration::from_secs(10)).await;
    assert!(rx.borrow().is_none(), "west has not synced: nothing served");
    assert_eq!(metrics.fleets_waiting.get(), 1);
    mark_synced(&*bus, "west").await;
    let p = next(&mut rx).await;
    assert_eq!(p.snapshot.ctx.services.len(), 1, "the whole mesh at once");
    assert_eq!(metrics.fleets_waiting.get(), 0);
    assert_eq!(metrics.sync_timed_out.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_sync_timeout_serves_without_missing_fleets() {
    let bus: Arc<dyn StateBus> = Arc::new(seeded_bus().await);
    let metrics = PushMetrics::register(&prometheus::Registry::new());
    let start = Instant::now();
    let mut rx = gated(
        bus,
        &["never"],
        Some(Duration::from_secs(30)),
        metrics.clone(),
    );
    let p = next(&mut rx).await;
    assert!(
        start.elapsed() >= Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(31),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(p.snapshot.ctx.services.len(), 1);
    assert_eq!(metrics.sync_timed_out.get(), 1);
    assert_eq!(metrics.fleets_waiting.get(), 0);
}

/// A memory bus that can lose all its data, as a nats-server that comes back without its
/// store: every open watch ends with `BusError::Lost` and the buckets start empty.
#[derive(Clone)]
struct LossyBus {
    inner: Arc<std::sync::Mutex<MemoryBus>>,
    losses: watch::Sender<u64>,
}

impl LossyBus {
    fn new(bus: MemoryBus) -> LossyBus {
        LossyBus {
            inner: Arc::new(std::sync::Mutex::new(bus)),
            losses: watch::channel(0).0,
        }
    }

    fn bus(&self) -> MemoryBus {
        self.inner.lock().unwrap().clone()
    }

    fn lose_everything(&self) {
        *self.inner.lock().unwrap() = MemoryBus::new();
        self.losses.send_modify(|n| *n += 1);
    }
}

#[async_trait]
impl StateBus for LossyBus {
    async fn get(&self, bucket: Bucket, key: &str) -> Result<Option<Entry>, BusError> {
        self.bus().get(bucket, key).await
    }
    async fn put(&self, bucket: Bucket, key: &str, value: Bytes) -> Result<u64, BusError> {
        self.bus().put(bucket, key, value).await
    }
    async fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
        expected: u64,
    ) -> Result<u64, BusError> {
        self.bus().update(bucket, key, value, expected).await
    }
    async fn delete(&self, bucket: Bucket, key: &str) -> Result<(), BusError> {
        self.bus().delete(bucket, key).await
    }
    async fn keys(&self, bucket: Bucket) -> Result<Vec<String>, BusError> {
        self.bus().keys(bucket).await
    }
    async fn watch(&self, bucket: Bucket) -> Result<WatchStream, BusError> {
        use futures::StreamExt;
        let stream = self.bus().watch(bucket).await?;
        let mut losses = self.losses.subscribe();
        let lost = futures::stream::once(async move {
            let _ = losses.changed().await;
            Err(BusError::Lost {
                bucket,
                reason: "test".into(),
            })
        });
        Ok(futures::stream::select(stream, lost)
            .take_while(|item| futures::future::ready(item.is_ok()))
            .chain(futures::stream::once(futures::future::ready(Err(
                BusError::Lost {
                    bucket,
                    reason: "test".into(),
                },
            ))))
            .boxed())
    }
}

/// After the bus loses its data, the server keeps every key through the empty replay,
/// applies what is written again, and deletes the keys nobody wrote again only after the
/// grace.
#[tokio::test(start_paused = true)]
async fn a_bus_that_lost_its_data_is_not_taken_for_mass_deletes() {
    let seeded = seeded_bus().await;
    write(
        &seeded,
        Bucket::Services,
        service_put(&service("default", "gone", &[("http", 80)])),
    )
    .await;
    let bus = LossyBus::new(seeded);
    let mut rx = start(Arc::new(bus.clone()), DEBOUNCE);
    let first = next(&mut rx).await;
    assert_eq!(first.snapshot.ctx.services.len(), 2);

    bus.lose_everything();
    sleep(Duration::from_secs(5)).await;
    let now = rx.borrow().clone().expect("a snapshot");
    assert_eq!(
        now.snapshot.number, first.snapshot.number,
        "nothing published"
    );

    // The ingester publishes again: `reviews` (changed) but not `gone`.
    write(
        &bus.bus(),
        Bucket::Services,
        service_put(&service("default", "reviews", &[("http", 9081)])),
    )
    .await;
    let p = next(&mut rx).await;
    assert_eq!(
        p.snapshot.ctx.services.len(),
        2,
        "gone is kept for the grace"
    );
    assert_eq!(p.snapshot.ctx.destination_rules.len(), 1);

    sleep(pipeline::LOSS_SWEEP_GRACE).await;
    let p = rx.borrow().clone().expect("a snapshot");
    assert_eq!(p.snapshot.ctx.services.len(), 1, "swept after the grace");
    assert!(
        p.snapshot.ctx.destination_rules.is_empty(),
        "not written again either"
    );
}

/// The JWKS link: after a snapshot, the pipeline names the `jwksUri`s its
/// RequestAuthentications need (inline keys not); fetched keys make a snapshot of their
/// own, marked as a RequestAuthentication change, whose PushContext holds them.
#[tokio::test(start_paused = true)]
async fn jwks_uris_are_asked_for_and_fetched_keys_are_pushed() {
    use shoal_common::model::ConfigKind;
    use std::collections::{BTreeMap, BTreeSet};
    const URI: &str = "https://issuer.example/jwks.json";
    let bus = Arc::new(seeded_bus().await);
    write(
        &*bus,
        Bucket::Config,
        config_put(&request_authentication(
            "default",
            "jwt",
            &format!("jwtRules: [{{issuer: a, jwksUri: \"{URI}\"}}, {{issuer: b, jwks: '{{\"keys\": []}}', jwksUri: \"https://inline.example/k\"}}]"),
        )),
    )
    .await;
    let (tx, mut rx) = watch::channel(None);
    let (keep, mesh) = watch::channel(Arc::new(crate::index::mesh_config::MeshSettings::default()));
    let (wanted_tx, mut wanted) = watch::channel(BTreeSet::new());
    let (keys, keys_rx) = watch::channel(Arc::new(BTreeMap::<String, Arc<str>>::new()));
    let config = pipeline::PipelineConfig {
        debounce: DEBOUNCE,
        mesh,
        gate: pipeline::FleetGate::default(),
        credential_keys: None,
        jwks: Some(pipeline::JwksLink {
            wanted: wanted_tx,
            keys: keys_rx,
        }),
    };
    tokio::spawn(async move {
        let _keep = keep;
        pipeline::run(
            bus,
            config,
            PushMetrics::register(&prometheus::Registry::new()),
            tx,
        )
        .await
    });
    let first = next(&mut rx).await;
    assert!(first.snapshot.ctx.jwks.is_empty());
    wanted.changed().await.expect("pipeline running");
    assert_eq!(
        *wanted.borrow_and_update(),
        BTreeSet::from([URI.to_string()])
    );

    keys.send_replace(Arc::new(BTreeMap::from([(
        URI.to_string(),
        Arc::from(r#"{"keys":[]}"#),
    )])));
    let p = next(&mut rx).await;
    assert!(p
        .changes
        .config
        .contains(&ConfigKind::RequestAuthentication));
    assert!(p.snapshot.ctx.jwks.contains_key(URI));
}
