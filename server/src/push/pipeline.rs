//! The push pipeline's front half: watch the bus, apply entries to the local store, debounce,
//! and publish immutable snapshots. Endpoint-only changes reuse the current PushContext.

use crate::generate::Snapshot;
use crate::index::mesh_config::MeshSettings;
use crate::index::push_context::PushContext;
use crate::index::store::{ApplyError, Change, MeshState};
use crate::push::metrics::PushMetrics;
use futures::StreamExt;
use shoal_common::bus::{Bucket, BusError, StateBus, WatchEvent};
use shoal_common::credential::CredentialKeys;
use shoal_common::lease::LeaseError;
use shoal_common::model::ConfigKind;
use shoal_common::time::sleep_until;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Debounce settings, like Istio's `PILOT_DEBOUNCE_AFTER` / `PILOT_DEBOUNCE_MAX`, with a
/// shorter pair for batches of endpoint changes only (Istio's `PILOT_ENABLE_EDS_DEBOUNCE`
/// knob, here a window of its own): endpoints are what proxies wait for when pods come
/// and go, and an endpoint-only snapshot reuses the PushContext, so it is cheap to publish.
#[derive(Debug, Clone, Copy)]
pub struct Debounce {
    /// Quiet period after the last change before pushing.
    pub after: Duration,
    /// Longest a push may be delayed by a stream of changes.
    pub max: Duration,
    /// Quiet period when every pending change is an endpoint change.
    pub eds_after: Duration,
    /// Longest a stream of endpoint changes may delay a push: a churn storm is published
    /// at most once per this period (streams that are still busy merge snapshots).
    pub eds_max: Duration,
}

impl Default for Debounce {
    fn default() -> Self {
        Debounce {
            after: Duration::from_millis(100),
            max: Duration::from_secs(10),
            eds_after: Duration::from_millis(10),
            eds_max: Duration::from_millis(100),
        }
    }
}

/// The open debounce window: when the pending changes are published.
#[derive(Debug, Default)]
struct Window {
    /// (first change, last change), while changes are pending.
    open: Option<(Instant, Instant)>,
}

impl Window {
    /// A change arrived.
    fn touch(&mut self) {
        let now = Instant::now();
        self.open = Some(self.open.map_or((now, now), |(first, _)| (first, now)));
    }

    /// Publish as soon as possible (the initial state is loaded: readiness should not
    /// wait for a debounce window).
    fn expire(&mut self, d: &Debounce) {
        // A window opened `max` ago closes at once. (`checked_sub` because an Instant
        // cannot predate the clock's origin on every platform.)
        let now = Instant::now();
        let opened = now.checked_sub(d.max.max(d.eds_max)).unwrap_or(now);
        self.open = Some((opened, opened));
    }

    /// When the window closes, for pending changes that are endpoint changes only or not.
    fn deadline(&self, d: &Debounce, endpoints_only: bool) -> Option<Instant> {
        let (after, max) = if endpoints_only {
            (d.eds_after, d.eds_max)
        } else {
            (d.after, d.max)
        };
        self.open
            .map(|(first, last)| (last + after).min(first + max))
    }

    /// Closes the window; returns when it opened.
    fn close(&mut self) -> Option<Instant> {
        self.open.take().map(|(first, _)| first)
    }
}

/// The buckets a server watches: the state, and `shoal-meta` for the ingester leases whose
/// epochs fence writes of deposed leaders.
const WATCHED: [Bucket; 4] = [
    Bucket::Config,
    Bucket::Services,
    Bucket::Endpoints,
    Bucket::Meta,
];

/// How long after a bucket that lost its data is replayed the server keeps the keys that
/// the replay did not bring back: the ingesters re-create the bucket and publish
/// everything again within seconds, and each key they write counts as seen. Keys still
/// unseen then were deleted meanwhile.
pub const LOSS_SWEEP_GRACE: Duration = Duration::from_secs(30);

/// What a bucket watcher task sends to the pipeline.
enum Feed {
    /// The bucket lost its data (its stream is gone or was re-created): the next replay
    /// may be empty or partial, and is not taken for deletes at once.
    Lost(Bucket),
    /// The watch (re)started: a full replay of the bucket follows.
    Restart(Bucket),
    /// A watch event.
    Event(Bucket, WatchEvent),
}

/// What changed between a snapshot and the one before it, so that streams push only the
/// proxies and types a change can affect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeSet {
    /// Everything may have changed (first snapshot, or a bucket was resynced).
    pub full: bool,
    /// Istio config kinds that changed.
    pub config: BTreeSet<ConfigKind>,
    /// A VirtualService with `tcp`/`tls` rules changed: listeners too, not only routes.
    pub listener_rules: bool,
    /// Whether any Kubernetes service changed.
    pub services: bool,
    /// Service hostnames whose endpoints changed.
    pub endpoints: BTreeSet<String>,
    /// Of those, the hostnames whose workload identities changed (see
    /// `endpoints::HostIdentities`): their clusters change too.
    pub identities: BTreeSet<String>,
    /// The service accounts and labels of some namespace's workloads changed (see
    /// `endpoints::NamespaceWorkloads`): who may have gateway credentials.
    pub workloads: bool,
    /// The set of clusters with a published token issuer changed: which gateway
    /// credentials a client certificate may have (see `generate::sds`).
    pub token_issuers: bool,
}

impl ChangeSet {
    fn record(&mut self, change: &Change) {
        match change {
            Change::None => {}
            Change::Config(kind) => {
                self.config.insert(*kind);
            }
            Change::ListenerRules => {
                self.config.insert(ConfigKind::VirtualService);
                self.listener_rules = true;
            }
            Change::Service => self.services = true,
            Change::Endpoints(host) => {
                self.endpoints.insert(host.clone());
            }
            Change::EndpointIdentities(host) => {
                self.endpoints.insert(host.clone());
                self.identities.insert(host.clone());
            }
            Change::TokenIssuers => self.token_issuers = true,
        }
    }

    /// Whether a change touches what load assignments read from the PushContext (the
    /// kinds `push::impact` counts as affecting EDS, besides endpoints).
    fn touches_assignments(&self) -> bool {
        self.full
            || self.services
            || self.config.iter().any(|k| {
                matches!(
                    k,
                    ConfigKind::ServiceEntry
                        | ConfigKind::WorkloadEntry
                        | ConfigKind::Sidecar
                        | ConfigKind::DestinationRule
                        // Whether a destination takes Istio mTLS decides whether other
                        // networks' endpoints go through their gateways (`generate::eds`).
                        | ConfigKind::PeerAuthentication
                )
            })
    }

    /// Whether the PushContext depends on anything that changed.
    fn needs_context(&self) -> bool {
        self.full || self.services || self.token_issuers || !self.config.is_empty()
    }

    /// Whether only endpoints changed (a snapshot can keep the PushContext).
    pub fn endpoints_only(&self) -> bool {
        !self.needs_context()
    }
}

/// A published snapshot plus what changed since the previous one.
#[derive(Debug, Clone)]
pub struct Published {
    /// The snapshot.
    pub snapshot: Arc<Snapshot>,
    /// The newest ingester observation time among the changes in this snapshot.
    pub observed_at_ms: Option<u64>,
    /// What changed since snapshot `snapshot.number - 1`.
    pub changes: Arc<ChangeSet>,
    /// When this snapshot was published, in ms since the Unix epoch.
    pub published_at_ms: u64,
}

/// Longest wait between two attempts to re-create a broken bucket watch. Kept short: after
/// a NATS outage the next attempt is what resyncs the server.
const REWATCH_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait before re-watching a bucket that lost its data.
const LOST_RETRY: Duration = Duration::from_millis(500);

fn lost(error: &BusError) -> bool {
    matches!(error, BusError::Lost { .. })
}

/// Watches one bucket forever, re-creating the watch with backoff when it breaks.
async fn feed_bucket(bus: Arc<dyn StateBus>, bucket: Bucket, tx: mpsc::Sender<Feed>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match bus.watch(bucket).await {
            Ok(mut stream) => {
                if tx.send(Feed::Restart(bucket)).await.is_err() {
                    return;
                }
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(ev) => {
                            backoff = Duration::from_millis(100);
                            if tx.send(Feed::Event(bucket, ev)).await.is_err() {
                                return;
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%bucket, %error, "bus watch broke; re-watching");
                            if lost(&error) {
                                if tx.send(Feed::Lost(bucket)).await.is_err() {
                                    return;
                                }
                                // The ingesters re-create it within seconds: look again soon.
                                backoff = backoff.min(LOST_RETRY);
                            }
                            break;
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%bucket, %error, "cannot watch bus bucket; retrying");
                if lost(&error) {
                    if tx.send(Feed::Lost(bucket)).await.is_err() {
                        return;
                    }
                    backoff = backoff.min(LOST_RETRY);
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(REWATCH_MAX_BACKOFF);
    }
}

/// Which ingester fleets must have published their clusters before the first snapshot
/// (`--expect-fleets`), and how long to wait for them at most (`--sync-timeout`, like
/// Istio's `PILOT_REMOTE_CLUSTER_TIMEOUT`).
#[derive(Debug, Clone, Default)]
pub struct FleetGate {
    /// Fleets whose sync marker (`synced.<fleet>` in `shoal-meta`) must be on the bus.
    pub expect: BTreeSet<String>,
    /// After this, publish anyway (with a warning and `shoal_sync_timed_out` 1); `None`:
    /// wait forever.
    pub timeout: Option<Duration>,
}

/// Follows the bus connection: `shoal_bus_connected`, and a log line per transition.
async fn follow_connection(bus: Arc<dyn StateBus>, metrics: PushMetrics) {
    let mut conn = bus.connected();
    let mut was = true;
    loop {
        let up = *conn.borrow_and_update();
        metrics.bus_connected.set(i64::from(up));
        match (was, up) {
            (true, false) => tracing::warn!(
                "state bus unreachable: still serving the last state; proxies keep their \
                 configuration and streams"
            ),
            (false, true) => tracing::info!("state bus reachable again; resyncing"),
            _ => {}
        }
        was = up;
        if conn.changed().await.is_err() {
            return;
        }
    }
}

/// What the pipeline runs with, each default stated where the flags are (`app.rs`).
pub struct PipelineConfig {
    /// Debounce windows.
    pub debounce: Debounce,
    /// The mesh settings (`--mesh-config`), followed for changes.
    pub mesh: watch::Receiver<Arc<MeshSettings>>,
    /// Fleets to wait for before the first snapshot.
    pub gate: FleetGate,
    /// Opens sealed gateway credentials (`--credential-key-file`).
    pub credential_keys: Option<Arc<CredentialKeys>>,
    /// The JWKS fetcher (`security::jwks`): the pipeline sends the `jwksUri`s of each
    /// PushContext and receives the fetched key sets, pushed like a config change.
    pub jwks: Option<JwksLink>,
}

/// The pipeline's side of the JWKS fetcher.
pub struct JwksLink {
    /// The `jwksUri`s the current config names without inline keys.
    pub wanted: watch::Sender<BTreeSet<String>>,
    /// The fetched key sets by URI.
    pub keys: watch::Receiver<Arc<BTreeMap<String, Arc<str>>>>,
}

/// Runs the pipeline: publishes the first snapshot once every bucket's initial state is
/// loaded and every expected fleet has synced (or the gate's timeout passed), then a new
/// one after each debounced batch of changes. A change of the mesh settings is a full
/// change.
pub async fn run(
    bus: Arc<dyn StateBus>,
    config: PipelineConfig,
    metrics: PushMetrics,
    out: watch::Sender<Option<Published>>,
) {
    let PipelineConfig {
        debounce,
        mut mesh,
        gate,
        credential_keys,
        jwks,
    } = config;
    let (jwks_wanted, mut jwks_keys) = match jwks {
        Some(link) => (Some(link.wanted), Some(link.keys)),
        None => (None, None),
    };
    let (tx, mut rx) = mpsc::channel(1024);
    for bucket in WATCHED {
        tokio::spawn(feed_bucket(bus.clone(), bucket, tx.clone()));
    }
    drop(tx);
    tokio::spawn(follow_connection(bus.clone(), metrics.clone()));

    let mut p = Pipeline::new(mesh.borrow_and_update().clone(), debounce, metrics);
    p.state.credential_keys = credential_keys;
    p.gate(gate);
    let mut mesh_open = true;
    loop {
        let deadline = p.deadline();
        tokio::select! {
            _ = sleep_until(p.sync_deadline()) => p.sync_timed_out(),
            feed = rx.recv() => match feed {
                Some(Feed::Lost(bucket)) => p.lost(bucket),
                Some(Feed::Restart(bucket)) => p.restart(bucket),
                Some(Feed::Event(bucket, WatchEvent::Entry(entry))) => p.entry(bucket, &entry),
                Some(Feed::Event(bucket, WatchEvent::InitialDone)) => p.initial_done(bucket),
                None => return,
            },
            _ = sleep_until(deadline) => {
                p.sweep_due();
                if let Some(published) = p.assemble() {
                    if let Some(wanted) = &jwks_wanted {
                        let uris = jwks_uris(&published.snapshot.ctx);
                        wanted.send_if_modified(|w| {
                            let changed = *w != uris;
                            *w = uris;
                            changed
                        });
                    }
                    if out.send(Some(published)).is_err() {
                        return;
                    }
                    p.metrics.ready.set(1);
                }
            }
            changed = async { jwks_keys.as_mut()?.changed().await.ok() }, if jwks_keys.is_some() => {
                match (changed, &mut jwks_keys) {
                    (Some(()), Some(keys)) => p.jwks_changed(keys.borrow_and_update().clone()),
                    // The fetcher stopped: the keys fetched so far stay.
                    _ => jwks_keys = None,
                }
            }
            changed = mesh.changed(), if mesh_open => match changed {
                Ok(()) => p.mesh_changed(mesh.borrow_and_update().clone()),
                // The settings can no longer change.
                Err(_) => mesh_open = false,
            },
        }
    }
}

/// The `jwksUri`s of `ctx`'s RequestAuthentications whose keys are not inline.
fn jwks_uris(ctx: &PushContext) -> BTreeSet<String> {
    ctx.request_authentications
        .values()
        .flatten()
        .flat_map(|ra| &ra.spec.jwt_rules)
        .filter(|r| r.jwks.is_empty() && !r.jwks_uri.is_empty())
        .map(|r| r.jwks_uri.clone())
        .collect()
}

/// The pipeline's state between bus events.
struct Pipeline {
    debounce: Debounce,
    metrics: PushMetrics,
    state: MeshState,
    ctx: Arc<PushContext>,
    /// Buckets whose initial state has not been loaded yet: nothing is published before.
    initial_pending: BTreeSet<Bucket>,
    /// Keys seen during a replay, per bucket being resynced.
    resync: BTreeMap<Bucket, BTreeSet<String>>,
    /// Buckets that lost their data and have not been replayed since.
    lost: BTreeSet<Bucket>,
    /// Buckets replayed after a loss: the keys seen since, and when the keys still unseen
    /// are taken as deleted ([`LOSS_SWEEP_GRACE`]).
    deferred: BTreeMap<Bucket, (BTreeSet<String>, Instant)>,
    /// Buckets past their initial values: their entries are live changes, checked against
    /// the fleets' lease epochs. Replayed values are the latest per key and always apply.
    live: BTreeSet<Bucket>,
    /// What changed since the last snapshot.
    changes: ChangeSet,
    /// The newest ingester observation time among those changes.
    observed: Option<u64>,
    window: Window,
    number: u64,
    /// Expected fleets whose sync marker has not been seen yet.
    fleets_waiting: BTreeSet<String>,
    /// When to stop waiting for them (None: never).
    sync_deadline: Option<Instant>,
    /// Buckets whose watch has started at least once (later starts are restarts).
    watched: BTreeSet<Bucket>,
}

impl Pipeline {
    fn new(mesh: Arc<MeshSettings>, debounce: Debounce, metrics: PushMetrics) -> Pipeline {
        Pipeline {
            debounce,
            metrics,
            state: MeshState {
                mesh,
                ..MeshState::default()
            },
            ctx: Arc::new(PushContext::default()),
            initial_pending: WATCHED.into(),
            resync: BTreeMap::new(),
            lost: BTreeSet::new(),
            deferred: BTreeMap::new(),
            live: BTreeSet::new(),
            changes: ChangeSet {
                full: true,
                ..ChangeSet::default()
            },
            observed: None,
            window: Window::default(),
            number: 0,
            fleets_waiting: BTreeSet::new(),
            sync_deadline: None,
            watched: BTreeSet::new(),
        }
    }

    /// Waits for these fleets before the first snapshot.
    fn gate(&mut self, gate: FleetGate) {
        self.sync_deadline = gate.timeout.map(|t| Instant::now() + t);
        self.fleets_waiting = gate.expect;
        self.metrics
            .fleets_waiting
            .set(self.fleets_waiting.len() as i64);
        if !self.fleets_waiting.is_empty() {
            tracing::info!(
                fleets = ?self.fleets_waiting,
                timeout = ?self.sync_deadline.map(|d| d - Instant::now()),
                "waiting for the expected ingester fleets to sync before serving"
            );
        }
    }

    /// Whether the first snapshot may be published: every bucket loaded, every expected
    /// fleet synced (or given up on).
    fn may_publish(&self) -> bool {
        self.initial_pending.is_empty() && self.fleets_waiting.is_empty()
    }

    /// When to give up waiting for expected fleets, while waiting.
    fn sync_deadline(&self) -> Option<Instant> {
        self.sync_deadline
            .filter(|_| !self.fleets_waiting.is_empty())
    }

    /// The sync timeout passed: serve without the fleets still missing. Buckets no
    /// ingester has created yet (servers only read the bus, and never create one) hold
    /// nothing: they count as loaded, empty; what an ingester writes once it creates them
    /// arrives later, as their watch's replay.
    fn sync_timed_out(&mut self) {
        tracing::warn!(
            fleets = ?self.fleets_waiting,
            buckets_not_created = ?self.initial_pending,
            "expected ingester fleets did not sync within --sync-timeout; serving without them"
        );
        self.initial_pending.clear();
        self.fleets_waiting.clear();
        self.sync_deadline = None;
        self.metrics.fleets_waiting.set(0);
        self.metrics.sync_timed_out.set(1);
        self.gate_changed();
    }

    /// A fleet's sync marker arrived.
    fn fleet_synced(&mut self, fleet: &str) {
        if self.fleets_waiting.remove(fleet) {
            tracing::info!(%fleet, left = self.fleets_waiting.len(), "expected fleet synced");
            self.metrics
                .fleets_waiting
                .set(self.fleets_waiting.len() as i64);
            self.gate_changed();
        }
    }

    /// Publish at once when the first snapshot just became allowed.
    fn gate_changed(&mut self) {
        if self.number == 0 && self.may_publish() {
            tracing::info!(
                config = self.state.config.len(),
                services = self.state.services.len(),
                "initial state loaded from the bus"
            );
            self.window.expire(&self.debounce);
        }
    }

    /// When the pending changes (or a deferred sweep) are due.
    fn deadline(&self) -> Option<Instant> {
        let window = self
            .window
            .deadline(&self.debounce, self.changes.endpoints_only());
        let sweep = self.deferred.values().map(|(_, at)| *at).min();
        match (window, sweep) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A bucket lost its data: its next replay is not taken for deletes at once.
    fn lost(&mut self, bucket: Bucket) {
        if self.lost.insert(bucket) {
            tracing::warn!(
                %bucket,
                "bus bucket lost its data; keeping the last good state until the ingesters \
                 publish it again"
            );
        }
    }

    /// Takes the keys still unseen in buckets whose grace after a loss is over as deleted.
    fn sweep_due(&mut self) {
        let now = Instant::now();
        let due: Vec<Bucket> = self
            .deferred
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(b, _)| *b)
            .collect();
        for bucket in due {
            if let Some((seen, _)) = self.deferred.remove(&bucket) {
                let swept = self.sweep(bucket, &seen);
                tracing::info!(%bucket, swept, "grace after the bucket's data loss is over; unseen keys deleted");
            }
        }
    }

    /// Deletes the held keys of `bucket` that are not in `seen`; returns how many.
    fn sweep(&mut self, bucket: Bucket, seen: &BTreeSet<String>) -> usize {
        let gone: Vec<String> = self
            .state
            .keys(bucket)
            .into_iter()
            .filter(|k| !seen.contains(k))
            .collect();
        let count = gone.len();
        for key in gone {
            let tombstone = shoal_common::bus::Entry {
                key,
                value: Default::default(),
                revision: 0,
                op: shoal_common::bus::Op::Delete,
            };
            let epochs = self.endpoint_epochs();
            if let Ok((change, _)) = self.state.apply(bucket, &tombstone) {
                self.record(&change, None);
            }
            self.note_endpoint_epochs(epochs);
        }
        count
    }

    /// New JWKS key sets: the listeners of the workloads whose RequestAuthentications name
    /// them change, as for a RequestAuthentication change.
    fn jwks_changed(&mut self, keys: Arc<BTreeMap<String, Arc<str>>>) {
        self.state.jwks = keys;
        self.changes
            .config
            .insert(ConfigKind::RequestAuthentication);
        self.window.touch();
    }

    /// A cluster's network changed (its system namespace was relabelled, and the ingester
    /// republished its slices with the new network): proxies of that cluster without
    /// `NETWORK` metadata are on another network now, which every load assignment's
    /// network split reads through the PushContext (`PushContext::cluster_networks`).
    /// Rare, so a full push: the context is rebuilt and every load assignment regenerated.
    /// The endpoint index's (workloads, networks) epochs, taken before applying an entry.
    fn endpoint_epochs(&self) -> (u64, u64) {
        let e = &self.state.endpoints;
        (e.workloads_epoch(), e.networks_epoch())
    }

    /// Records what applying an entry moved since `before` ([`Self::endpoint_epochs`]):
    /// changed workloads reach gateway credentials; a changed cluster network is a full
    /// push.
    fn note_endpoint_epochs(&mut self, before: (u64, u64)) {
        let (workloads, networks) = self.endpoint_epochs();
        if workloads != before.0 {
            self.changes.workloads = true;
        }
        if networks != before.1 {
            tracing::info!("a cluster's network changed: full push");
            self.changes.full = true;
        }
    }

    fn mesh_changed(&mut self, mesh: Arc<MeshSettings>) {
        self.state.mesh = mesh;
        self.changes.full = true;
        self.window.touch();
    }

    /// A bucket's watch (re)started: a full replay follows.
    fn restart(&mut self, bucket: Bucket) {
        if !self.watched.insert(bucket) {
            self.metrics
                .bus_watch_restarts
                .with_label_values(&[bucket.name()])
                .inc();
        }
        self.resync.insert(bucket, BTreeSet::new());
        self.live.remove(&bucket);
    }

    /// One bus entry, of any bucket: applied to the state (or refused, keeping the
    /// previous value), and recorded as a change.
    fn entry(&mut self, bucket: Bucket, entry: &shoal_common::bus::Entry) {
        if let Some(seen) = self.resync.get_mut(&bucket) {
            seen.insert(entry.key.clone());
        }
        if let Some((seen, _)) = self.deferred.get_mut(&bucket) {
            seen.insert(entry.key.clone());
        }
        if bucket == Bucket::Meta && entry.op == shoal_common::bus::Op::Put {
            if let Some(fleet) = shoal_common::keys::parse_synced_key(&entry.key) {
                self.fleet_synced(&fleet);
            }
        }
        let epochs = self.endpoint_epochs();
        let applied = if self.live.contains(&bucket) {
            self.state.apply_live(bucket, entry)
        } else {
            self.state.apply(bucket, entry)
        };
        self.note_endpoint_epochs(epochs);
        let result = match applied {
            Ok((Change::None, _)) => "unchanged",
            Ok((change, observed)) => {
                self.record(&change, observed);
                "applied"
            }
            Err(ApplyError::Fenced {
                key,
                fleet,
                epoch,
                fleet_epoch,
                ..
            }) => {
                tracing::warn!(
                    %bucket,
                    %key,
                    %fleet,
                    epoch,
                    fleet_epoch,
                    "refusing a write of a deposed ingester leader (its epoch is older \
                     than the fleet's lease); previous value kept"
                );
                "fenced"
            }
            Err(
                error @ (ApplyError::EpochJump { .. }
                | ApplyError::Lease {
                    source: LeaseError::EpochJump { .. },
                    ..
                }),
            ) => {
                tracing::warn!(
                    %error,
                    "refusing an implausible lease epoch (a forged or corrupt write; no \
                     takeover raises the epoch that much); previous value kept"
                );
                "epoch_jump"
            }
            Err(error) => {
                tracing::warn!(%error, "skipping invalid bus entry; previous value kept");
                "invalid"
            }
        };
        self.metrics
            .bus_entries
            .with_label_values(&[bucket.name(), result])
            .inc();
    }

    fn record(&mut self, change: &Change, observed: Option<u64>) {
        self.changes.record(change);
        if let Some(o) = observed {
            self.observed = Some(self.observed.map_or(o, |x| x.max(o)));
        }
        self.window.touch();
    }

    /// A bucket's replay ended: keys held that the bus no longer has were deleted while
    /// the watch was down. The first time every bucket is loaded, publish at once.
    fn initial_done(&mut self, bucket: Bucket) {
        self.live.insert(bucket);
        if let Some(seen) = self.resync.remove(&bucket) {
            // After a loss the replay may be empty or partial: the sweep waits until the
            // ingesters had time to publish everything again.
            let after_loss = self.lost.remove(&bucket) || self.deferred.contains_key(&bucket);
            if after_loss {
                let at = Instant::now() + LOSS_SWEEP_GRACE;
                let (all, _) = self
                    .deferred
                    .entry(bucket)
                    .or_insert_with(|| (BTreeSet::new(), at));
                all.extend(seen);
                tracing::info!(
                    %bucket,
                    keys = all.len(),
                    grace_s = LOSS_SWEEP_GRACE.as_secs(),
                    "replayed a bucket after its data loss; keys not seen again are kept for the grace"
                );
            } else {
                self.sweep(bucket, &seen);
            }
        }
        if self.initial_pending.remove(&bucket) && self.initial_pending.is_empty() {
            if !self.fleets_waiting.is_empty() {
                tracing::info!(
                    fleets = ?self.fleets_waiting,
                    "bus loaded; still waiting for expected fleets to sync"
                );
            }
            self.gate_changed();
        }
    }

    /// The debounce window closed: the next snapshot, unless the initial state is still
    /// loading. Endpoint-only changes keep the PushContext; the endpoint shards are shared
    /// with the state until the next endpoint change.
    fn assemble(&mut self) -> Option<Published> {
        let first = self.window.close()?;
        if !self.may_publish() {
            return None;
        }
        self.metrics
            .debounce_seconds
            .observe(first.elapsed().as_secs_f64());
        if self.changes.needs_context() {
            let start = std::time::Instant::now();
            let mut ctx = PushContext::build(&self.state);
            ctx.share_unchanged(&self.ctx);
            // A VirtualService, Gateway or policy change: load assignments whose endpoints
            // did not change are the same (views keep them instead of rebuilding each).
            if !self.changes.touches_assignments() {
                ctx.keep_endpoint_inputs(&self.ctx);
            }
            self.ctx = Arc::new(ctx);
            self.metrics.push_context_builds.inc();
            self.metrics
                .network_gateways
                .set(i64::try_from(self.ctx.network_gateways.all().count()).unwrap_or(i64::MAX));
            self.metrics
                .push_context_build_seconds
                .observe(start.elapsed().as_secs_f64());
        }
        self.number += 1;
        tracing::debug!(number = self.number, changes = ?self.changes, "publishing snapshot");
        let changes = Arc::new(std::mem::take(&mut self.changes));
        Some(Published {
            snapshot: Arc::new(Snapshot {
                ctx: self.ctx.clone(),
                endpoints: self.state.endpoints.clone(),
                number: self.number,
            }),
            observed_at_ms: self.observed.take(),
            changes,
            published_at_ms: shoal_common::envelope::now_ms(),
        })
    }
}
