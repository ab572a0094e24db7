//! The push pipeline's front half: watch the bus, apply entries to the local store, debounce,
//! and publish immutable snapshots. Endpoint-only changes reuse the current PushContext.

use crate::generate::Snapshot;
use crate::metrics::Metrics;
use crate::push_context::{MeshSettings, PushContext};
use crate::store::{ApplyError, Change, MeshState};
use futures::StreamExt;
use shoal_common::bus::{Bucket, StateBus, WatchEvent};
use shoal_common::model::ConfigKind;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Debounce settings, like Istio's `PILOT_DEBOUNCE_AFTER` / `PILOT_DEBOUNCE_MAX`.
#[derive(Debug, Clone, Copy)]
pub struct Debounce {
    /// Quiet period after the last change before pushing.
    pub after: Duration,
    /// Longest a push may be delayed by a stream of changes.
    pub max: Duration,
}

impl Default for Debounce {
    fn default() -> Self {
        Debounce {
            after: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
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

/// What a bucket watcher task sends to the pipeline.
enum Feed {
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
        }
    }

    /// Whether the PushContext depends on anything that changed.
    fn needs_context(&self) -> bool {
        self.full || self.services || !self.config.is_empty()
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
                            break;
                        }
                    }
                }
            }
            Err(error) => tracing::warn!(%bucket, %error, "cannot watch bus bucket; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Runs the pipeline with Istio's default mesh settings.
pub async fn run(
    bus: Arc<dyn StateBus>,
    debounce: Debounce,
    metrics: Metrics,
    out: watch::Sender<Option<Published>>,
) {
    let (_keep, mesh) = watch::channel(Arc::new(MeshSettings::default()));
    run_with_mesh(bus, debounce, metrics, mesh, out).await
}

/// Runs the pipeline: publishes the first snapshot once every bucket's initial state is
/// loaded, then a new one after each debounced batch of changes. A change of the mesh
/// settings is a full change.
pub async fn run_with_mesh(
    bus: Arc<dyn StateBus>,
    debounce: Debounce,
    metrics: Metrics,
    mut mesh: watch::Receiver<Arc<MeshSettings>>,
    out: watch::Sender<Option<Published>>,
) {
    let (tx, mut rx) = mpsc::channel(1024);
    for bucket in WATCHED {
        tokio::spawn(feed_bucket(bus.clone(), bucket, tx.clone()));
    }
    drop(tx);

    let mut state = MeshState {
        mesh: mesh.borrow_and_update().clone(),
        ..MeshState::default()
    };
    let mut mesh_open = true;
    let mut ctx = Arc::new(PushContext::default());
    let mut initial_pending: BTreeSet<Bucket> = WATCHED.into();
    // Keys seen during a replay, per bucket being resynced.
    let mut resync: BTreeMap<Bucket, BTreeSet<String>> = BTreeMap::new();
    // Buckets past their initial values: their entries are live changes, checked against
    // the fleets' lease epochs. Replayed values are the latest per key and always apply.
    let mut live: BTreeSet<Bucket> = BTreeSet::new();
    let mut changes = ChangeSet {
        full: true,
        ..ChangeSet::default()
    };
    let mut observed: Option<u64> = None;
    let mut window: Option<(Instant, Instant)> = None; // (first change, last change)
    let mut number = 0u64;

    loop {
        let deadline =
            window.map(|(first, last)| (last + debounce.after).min(first + debounce.max));
        let feed = tokio::select! {
            feed = rx.recv() => match feed { Some(f) => Some(f), None => return },
            _ = sleep_until(deadline) => None,
            changed = mesh.changed(), if mesh_open => {
                match changed {
                    Ok(()) => {
                        state.mesh = mesh.borrow_and_update().clone();
                        changes.full = true;
                        let now = Instant::now();
                        window = Some(window.map_or((now, now), |(first, _)| (first, now)));
                    }
                    // The settings can no longer change.
                    Err(_) => mesh_open = false,
                }
                continue;
            }
        };
        match feed {
            Some(Feed::Restart(bucket)) => {
                resync.insert(bucket, BTreeSet::new());
                live.remove(&bucket);
            }
            Some(Feed::Event(bucket, WatchEvent::Entry(entry))) => {
                if let Some(seen) = resync.get_mut(&bucket) {
                    seen.insert(entry.key.clone());
                }
                let applied = if live.contains(&bucket) {
                    state.apply_live(bucket, &entry)
                } else {
                    state.apply(bucket, &entry)
                };
                match applied {
                    Ok((change, obs)) => {
                        let result = if change == Change::None {
                            "unchanged"
                        } else {
                            "applied"
                        };
                        metrics
                            .bus_entries
                            .with_label_values(&[bucket.name(), result])
                            .inc();
                        if change == Change::None {
                            continue;
                        }
                        changes.record(&change);
                        if let Some(o) = obs {
                            observed = Some(observed.map_or(o, |x| x.max(o)));
                        }
                        let now = Instant::now();
                        window = Some(window.map_or((now, now), |(first, _)| (first, now)));
                    }
                    Err(ApplyError::Fenced {
                        key,
                        fleet,
                        epoch,
                        fleet_epoch,
                        ..
                    }) => {
                        metrics
                            .bus_entries
                            .with_label_values(&[bucket.name(), "fenced"])
                            .inc();
                        tracing::warn!(
                            %bucket,
                            %key,
                            %fleet,
                            epoch,
                            fleet_epoch,
                            "refusing a write of a deposed ingester leader (its epoch is older \
                             than the fleet's lease); previous value kept"
                        );
                    }
                    Err(error) => {
                        metrics
                            .bus_entries
                            .with_label_values(&[bucket.name(), "invalid"])
                            .inc();
                        tracing::warn!(%error, "skipping invalid bus entry; previous value kept");
                    }
                }
            }
            Some(Feed::Event(bucket, WatchEvent::InitialDone)) => {
                live.insert(bucket);
                if let Some(seen) = resync.remove(&bucket) {
                    // A replay ended: keys we hold that the bus no longer has were deleted
                    // while we were not watching.
                    for key in state.keys(bucket).into_iter().filter(|k| !seen.contains(k)) {
                        let tombstone = shoal_common::bus::Entry {
                            key,
                            value: Default::default(),
                            revision: 0,
                            op: shoal_common::bus::Op::Delete,
                        };
                        if let Ok((change, _)) = state.apply(bucket, &tombstone) {
                            changes.record(&change);
                            let now = Instant::now();
                            window = Some(window.map_or((now, now), |(first, _)| (first, now)));
                        }
                    }
                }
                if initial_pending.remove(&bucket) && initial_pending.is_empty() {
                    tracing::info!(
                        config = state.config.len(),
                        services = state.services.len(),
                        "initial state loaded from the bus"
                    );
                    // Publish at once: readiness should not wait for a debounce window.
                    // A window opened `max` ago closes at once. (`checked_sub` because an
                    // Instant cannot predate the clock's origin on every platform.)
                    let now = Instant::now();
                    let opened = now.checked_sub(debounce.max).unwrap_or(now);
                    window = Some((opened, opened));
                }
            }
            None => {
                // The debounce window closed.
                let Some((first, _)) = window.take() else {
                    continue;
                };
                if !initial_pending.is_empty() {
                    continue;
                }
                metrics
                    .debounce_seconds
                    .observe(first.elapsed().as_secs_f64());
                if changes.needs_context() {
                    let start = std::time::Instant::now();
                    ctx = Arc::new(PushContext::build(&state));
                    metrics.push_context_builds.inc();
                    metrics
                        .push_context_build_seconds
                        .observe(start.elapsed().as_secs_f64());
                }
                number += 1;
                tracing::debug!(number, ?changes, "publishing snapshot");
                let changes = Arc::new(std::mem::take(&mut changes));
                let snapshot = Arc::new(Snapshot {
                    ctx: ctx.clone(),
                    endpoints: Arc::new(state.endpoints.clone()),
                    number,
                    changes: Some(changes.clone()),
                });
                let observed_at_ms = observed.take();
                let published_at_ms = shoal_common::envelope::now_ms();
                let published = Published {
                    snapshot,
                    observed_at_ms,
                    changes,
                    published_at_ms,
                };
                if out.send(Some(published)).is_err() {
                    return;
                }
                metrics.ready.set(1);
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
