//! One cluster: its watches, its store, its publisher and its status, in one task.
//!
//! The task owns the keys of its cluster ID (services and endpoints whose first token is
//! the ID). Watches feed changes into the store; changed namespaces are recomputed and
//! published after a short debounce, through a [`Publisher`] that writes only changed
//! values. The config cluster's task also runs the [`ConfigSide`].
//!
//! Only while this replica leads its fleet ([`Leadership`]): a standby applies every watch
//! event to its store (its caches stay warm, and it counts as synced once they are) but
//! computes and writes nothing. A new term publishes everything that differs from the
//! bus, and while leading, another writer's change to an owned key brings a round forward.
//!
//! Only while this fleet owns the cluster ([`Owners`]): before its first write in a term
//! the leader claims the cluster; a cluster another live fleet owns is refused (nothing is
//! written, the state says `refused`) until that fleet releases it or its lease lapses. A
//! cluster taken over by another fleet stops being written at once.
//!
//! [`Owners`]: crate::coordination::ownership::Owners
//!
//! A new kubeconfig ([`ClusterHandle::rotate`]) starts a second connection with its own
//! store; only when every one of its watches has synced does it replace the first one,
//! which is then stopped. Both stores hold the same objects, so the swap writes nothing
//! and deletes nothing.

use super::ca_root;
use super::cluster_status::{MetaWriter, StatusWriter};
use super::config::ConfigSide;
use super::context::ClusterContext;
use super::issuer;
use super::metrics::{ClusterState, WatchKind};
use super::reduce;
use super::store::{Change, ClusterStore, Touched};
use super::watch::{self, Sink, Tagged, Update};
use crate::admit::normalize::SERVICE_NAME_LABEL;
use crate::coordination::lease::Leadership;
use crate::coordination::ownership::{ClaimError, OwnerEvents, Standing};
use crate::desired::scope::Dirty;
use crate::publish::{Ownership, Publisher};
use crate::task::TaskGuard;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::{Api, Client};
use shoal_common::envelope::now_ms;
use shoal_common::model::ClusterIssuer;
use shoal_common::time::sleep_until;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

/// Changes are published this long after the first one, so the events of one write (a
/// `kubectl apply`, a Pod and its EndpointSlice) are one round, and a churn storm is
/// rounds, not a write per event. Short, because it sits in series with the servers'
/// debounce, which is what batches pushes as istiod's `PILOT_DEBOUNCE_AFTER` does: at
/// 100 ms here too, a VirtualService waited 200 ms of debounce before any proxy had it,
/// against istiod's 100 ms.
const DEBOUNCE: Duration = Duration::from_millis(10);

/// A round with bus failures is retried after this long.
const RETRY: Duration = Duration::from_secs(1);

/// Capacity of a cluster task's update channel (watches wait when it is full).
const CHANNEL: usize = 1024;

/// The readiness component of a cluster.
pub fn readiness_name(cluster: &str) -> String {
    format!("cluster {cluster}")
}

/// What a cluster task is told.
enum Command {
    /// Use this client from now on, once it has synced.
    Rotate(Client),
    /// Stop watching and writing; the cluster's keys stay on the bus.
    Stop,
}

/// A running cluster task.
pub struct ClusterHandle {
    commands: mpsc::Sender<Command>,
    task: JoinHandle<()>,
}

impl ClusterHandle {
    /// Switches to a new client once it has synced.
    pub async fn rotate(&self, client: Client) {
        let _ = self.commands.send(Command::Rotate(client)).await;
    }

    /// Stops the task and waits for it: once this returns, nothing of the cluster is
    /// watched or written any more. Its keys stay on the bus (see [`super::orphans`] for
    /// what happens to them).
    pub async fn stop(self) {
        let _ = self.commands.send(Command::Stop).await;
        if let Err(error) = self.task.await {
            warn!(%error, "cluster task failed while stopping");
        }
    }

    /// Waits for the task to end (it ends only when stopped, or on a bug).
    pub async fn join(&mut self) {
        if let Err(error) = (&mut self.task).await {
            warn!(%error, "cluster task failed");
        }
    }
}

/// Starts a cluster task. With `config`, it is the config cluster: it also watches the
/// Istio CRDs and kinds and publishes config.
pub fn spawn(ctx: ClusterContext, id: String, client: Client, config: bool) -> ClusterHandle {
    let (commands, command_rx) = mpsc::channel(8);
    let task = tokio::spawn(async move {
        let task = ClusterTask::start(ctx, id, client, config).await;
        task.run(command_rx).await;
    });
    ClusterHandle { commands, task }
}

/// The watches of one client, feeding one store.
struct Connection {
    generation: u64,
    _watches: Vec<TaskGuard>,
}

/// This task's ownership of its cluster, as far as it knows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Claim {
    /// Not claimed in the current term (yet).
    Unclaimed,
    /// Claimed in the term of this epoch.
    Held(u64),
    /// Refused: the named fleet, whose lease is current, owns it.
    Refused(String),
}

/// A connection being brought up to replace the active one.
struct Pending {
    connection: Connection,
    store: ClusterStore,
}

struct ClusterTask {
    id: String,
    ctx: ClusterContext,
    publisher: Publisher,
    /// Followed for term changes: a new term publishes everything.
    leadership: Leadership,
    status: StatusWriter,
    /// The cluster's token issuer, as last read, and its writer.
    issuer: Option<ClusterIssuer>,
    issuer_writer: MetaWriter<ClusterIssuer>,
    /// The last error reading the issuer (logged when it changes).
    issuer_error: Option<String>,
    store: ClusterStore,
    active: Connection,
    pending: Option<Pending>,
    config: Option<ConfigSide>,
    next_generation: u64,
    tx: mpsc::Sender<Tagged>,
    rx: mpsc::Receiver<Tagged>,
    dirty: Dirty,
    /// When the oldest unpublished change was seen.
    observed_at_ms: Option<u64>,
    publish_at: Option<Instant>,
    /// Failing watches of the connections, by (generation, kind).
    errors: BTreeMap<(u64, String), String>,
    synced: bool,
    claim: Claim,
    owner_events: OwnerEvents,
    /// The state last reported in the metrics.
    reported: Option<ClusterState>,
}

impl ClusterTask {
    async fn start(ctx: ClusterContext, id: String, client: Client, config: bool) -> ClusterTask {
        ctx.metrics.cluster_state(&id, false);
        let publisher = ctx.publisher(Ownership::cluster(id.as_str()));
        let leadership = ctx.leadership.clone();
        let status =
            StatusWriter::load(ctx.bus.clone(), &ctx.fleet, &id, ctx.leadership.clone()).await;
        let issuer_writer =
            MetaWriter::load(ctx.bus.clone(), &ctx.fleet, &id, ctx.leadership.clone()).await;
        let (tx, rx) = mpsc::channel(CHANNEL);
        let ctx_owner_events = ctx.owners.events();
        let config = match config {
            true => Some(ConfigSide::start(&ctx, &id, client.clone(), tx.clone()).await),
            false => None,
        };
        let mut task = ClusterTask {
            store: ClusterStore::new(&id),
            active: Connection {
                generation: 0,
                _watches: Vec::new(),
            },
            id,
            ctx,
            publisher,
            leadership,
            status,
            issuer: None,
            issuer_writer,
            issuer_error: None,
            pending: None,
            config,
            next_generation: 0,
            tx,
            rx,
            dirty: Dirty::default(),
            observed_at_ms: None,
            publish_at: None,
            errors: BTreeMap::new(),
            synced: false,
            claim: Claim::Unclaimed,
            owner_events: ctx_owner_events,
            reported: None,
        };
        task.active = task.connect(client);
        info!(cluster = %task.id, "watching cluster");
        task
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut selectors_open = true;
        // The config side's Gateway API status reads the other clusters' Services too.
        let mut services_elsewhere = self.ctx.services.subscribe();
        let with_config = self.config.is_some();
        loop {
            let publish_at = self.publish_at;
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Rotate(client)) => self.rotate(client),
                    Some(Command::Stop) => return self.stop(),
                    // The handle is gone: the process is exiting; the bus stays as it is.
                    None => return,
                },
                Some(tagged) = self.rx.recv() => self.handle(tagged),
                changed = self.ctx.selectors.changed(), if selectors_open => match changed {
                    Ok(()) => {
                        self.dirty.add_all();
                        if let Some(config) = &mut self.config {
                            config.dirty.add_all();
                        }
                        self.schedule();
                    }
                    Err(_) => selectors_open = false,
                },
                () = sleep_until(publish_at), if publish_at.is_some() => self.publish().await,
                () = self.leadership.changed() => {
                    if self.ctx.leadership.leads() {
                        info!(cluster = %self.id, "leading: publishing what differs from the bus");
                        self.dirty.add_all();
                        if let Some(config) = &mut self.config {
                            config.dirty.add_all();
                        }
                        self.schedule_soon();
                    }
                }
                // Another writer changed an owned key: a full round puts it right.
                () = self.publisher.bus_changed() => self.schedule_soon(),
                () = self.owner_events.next() => self.owners_changed(),
                () = config_bus_changed(&mut self.config) => self.schedule_soon(),
                Ok(()) = services_elsewhere.changed(), if with_config => {
                    if let Some(config) = &mut self.config {
                        config.cluster_changed();
                    }
                    self.schedule();
                }
            }
        }
    }

    /// Starts the watches of a client, as a new generation.
    fn connect(&mut self, client: Client) -> Connection {
        self.next_generation += 1;
        let sink = Sink {
            tx: self.tx.clone(),
            generation: self.next_generation,
            cluster: self.id.clone(),
            metrics: self.ctx.metrics.clone(),
        };
        let cfg = watcher::Config::default;
        let watches = vec![
            watch::spawn(
                Api::<Namespace>::all(client.clone()),
                cfg(),
                WatchKind::Namespace,
                sink.clone(),
                |ns| Ok(Some(reduce::namespace(ns))),
                Update::Namespace,
            ),
            watch::spawn(
                Api::<Service>::all(client.clone()),
                cfg(),
                WatchKind::Service,
                sink.clone(),
                |svc| reduce::service(svc).map(|s| Some(Box::new(s))),
                Update::Service,
            ),
            watch::spawn(
                Api::<EndpointSlice>::all(client.clone()),
                cfg(),
                WatchKind::EndpointSlice,
                sink.clone(),
                |slice| reduce::endpoint_slice(slice).map(|s| Some(Box::new(s))),
                Update::Slice,
            ),
            watch::spawn(
                Api::<Pod>::all(client.clone()),
                cfg(),
                WatchKind::Pod,
                sink.clone(),
                |pod| Ok(Some(Box::new(reduce::pod(pod)))),
                Update::Pod,
            ),
            watch::spawn(
                Api::<Node>::all(client.clone()),
                cfg(),
                WatchKind::Node,
                sink.clone(),
                |node| Ok(Some(Box::new(reduce::node(node)))),
                Update::Node,
            ),
            issuer::spawn(client.clone(), sink),
        ];
        // Each connection distributes the root with its own client: a rotated kubeconfig
        // takes over with the rest of the connection.
        let watches = match &self.ctx.ca_root {
            Some(root) => {
                let mut watches = watches;
                watches.push(
                    ca_root::Distributor {
                        cluster: self.id.clone(),
                        client,
                        root: root.clone(),
                        selectors: self.ctx.selectors.clone(),
                        leadership: self.ctx.leadership.clone(),
                        owners: self.ctx.owners.clone(),
                        metrics: self.ctx.metrics.clone(),
                    }
                    .spawn(),
                );
                watches
            }
            None => watches,
        };
        Connection {
            generation: self.next_generation,
            _watches: watches,
        }
    }

    fn rotate(&mut self, client: Client) {
        info!(cluster = %self.id, "new kubeconfig; switching once the new connection has synced");
        // A rotation still syncing is superseded.
        if let Some(old) = self.pending.take() {
            let generation = old.connection.generation;
            self.errors.retain(|(g, _), _| *g != generation);
        }
        let connection = self.connect(client);
        self.pending = Some(Pending {
            connection,
            store: ClusterStore::new(&self.id),
        });
    }

    fn handle(&mut self, Tagged { generation, update }: Tagged) {
        match update {
            Update::Health { kind, error }
                if self.config.as_ref().is_some_and(|c| c.watches(&kind)) =>
            {
                if let Some(config) = &mut self.config {
                    config.handle(generation, Update::Health { kind, error });
                }
                self.schedule();
            }
            Update::Health { kind, error } => {
                let pending = self.pending.as_ref().map(|p| p.connection.generation);
                if generation != self.active.generation && Some(generation) != pending {
                    return; // from a connection that is gone
                }
                match error {
                    Some(error) => self.errors.insert((generation, kind), error),
                    None => self.errors.remove(&(generation, kind)),
                };
                self.schedule();
            }
            Update::Crd(_) | Update::Config(..) | Update::Credential(_) => {
                if let Some(config) = &mut self.config {
                    config.handle(generation, update);
                    if config.wants_round() {
                        self.schedule();
                    }
                }
            }
            Update::Secret(_) | Update::RootConfigMap(_) => {}
            Update::Issuer(result) => self.issuer_read(result),
            core if generation == self.active.generation => {
                let namespaces_changed = matches!(core, Update::Namespace(_));
                // What Gateway API statuses read: namespaces, backend Services, and the
                // endpoints of gateways' own Services (a slice names its Service; a
                // deleted one is looked up before it goes).
                let gateway_input = match &core {
                    Update::Namespace(_) | Update::Service(_) => Some(None),
                    Update::Slice(change) => Some(slice_service(&self.store, change)),
                    _ => None,
                };
                // The Service a change is of (`None`: a relist's start or end).
                let service = match &core {
                    Update::Service(
                        Change::Apply(key, _) | Change::InitApply(key, _) | Change::Delete(key),
                    ) => Some(Some(key.clone())),
                    Update::Service(_) => Some(None),
                    _ => None,
                };
                let endpoints_only = matches!(core, Update::Slice(_) | Update::Pod(_));
                let affects = apply(&mut self.store, core);
                match service {
                    Some(Some(key)) => {
                        let present = self.store.services.get(&key).is_some();
                        self.ctx.services.update(&self.id, &key, present);
                    }
                    Some(None) => self.share_services(),
                    None => {}
                }
                if let (Some(config), Some(slice)) = (self.config.as_mut(), gateway_input) {
                    if !matches!(affects, Affects::Nothing) {
                        match slice {
                            Some((ns, service)) => config.slice_changed(&ns, &service),
                            None => config.cluster_changed(),
                        }
                    }
                }
                // Namespace labels decide the selection of config too.
                if let Some(config) = self.config.as_mut().filter(|_| namespaces_changed) {
                    match &affects {
                        Affects::Nothing => {}
                        Affects::Namespace(ns) => config.dirty.add_namespace(ns),
                        Affects::All => config.dirty.add_all(),
                    }
                }
                match affects {
                    Affects::Nothing => return,
                    // The system namespace's labels name the cluster's network, which every
                    // endpoint set carries.
                    Affects::Namespace(ns)
                        if namespaces_changed && ns == self.ctx.system_namespace =>
                    {
                        self.dirty.add_all()
                    }
                    Affects::Namespace(ns) => self.dirty.add_namespace(&ns),
                    Affects::All => self.dirty.add_all(),
                }
                if endpoints_only {
                    self.schedule_within(DEBOUNCE);
                } else {
                    self.schedule();
                }
            }
            core => {
                let Some(pending) = &mut self.pending else {
                    return;
                };
                if generation != pending.connection.generation {
                    return;
                }
                apply(&mut pending.store, core);
                if pending.store.synced() {
                    self.swap();
                }
            }
        }
    }

    /// Tells the other cluster tasks (the config side's Gateway API status) which Services
    /// this cluster has.
    fn share_services(&self) {
        let keys = self.store.services.iter().map(|(k, _)| k.clone()).collect();
        self.ctx.services.set(&self.id, keys);
    }

    /// Makes the synced pending connection the active one and stops the old one.
    fn swap(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        self.store = pending.store;
        self.share_services();
        // Dropping the old connection aborts its watches.
        self.active = pending.connection;
        let generation = self.active.generation;
        self.errors.retain(|(g, _), _| *g == generation);
        info!(cluster = %self.id, "switched to the new kubeconfig");
        self.dirty.add_all();
        self.schedule();
    }

    /// Takes a read of the cluster's token issuer; a change is published with the status.
    fn issuer_read(&mut self, result: Result<ClusterIssuer, String>) {
        match result {
            Ok(issuer) => {
                if self.issuer_error.take().is_some() {
                    info!(cluster = %self.id, "token issuer readable again");
                }
                if self.issuer.as_ref() != Some(&issuer) {
                    info!(cluster = %self.id, issuer = %issuer.issuer, "token issuer read");
                    self.issuer = Some(issuer);
                    self.schedule();
                }
            }
            Err(error) => {
                if self.issuer_error.as_ref() != Some(&error) {
                    warn!(cluster = %self.id, %error, "cannot read the cluster's token issuer; proxies of this cluster cannot authenticate with tokens until it is read");
                    self.issuer_error = Some(error);
                }
            }
        }
        self.ctx
            .metrics
            .issuer_readable(&self.id, self.issuer_error.is_none());
    }

    fn schedule(&mut self) {
        self.observed_at_ms.get_or_insert_with(now_ms);
        if self.publish_at.is_none() {
            self.publish_at = Some(Instant::now() + DEBOUNCE);
        }
    }

    /// Standby: the caches stay warm and the cluster counts as synced once they are, but
    /// nothing is computed or written; a new term publishes everything.
    fn stand_by(&mut self) {
        self.observed_at_ms = None;
        self.dirty = Dirty::default();
        if self.store.synced() && !self.synced {
            self.synced = true;
            let services = self.store.services.values().count();
            info!(cluster = %self.id, services, "cluster synced (caches only: standby or refused)");
            self.ctx.readiness.synced(&readiness_name(&self.id));
        }
        self.report();
        if let Some(config) = &mut self.config {
            config.stand_by(&self.ctx, &self.store.namespaces);
        }
    }

    /// Like [`ClusterTask::schedule`], but also brings forward a round waiting to retry.
    fn schedule_soon(&mut self) {
        self.schedule_within(DEBOUNCE);
    }

    /// Publishes within `delay` (sooner if a round is already due).
    fn schedule_within(&mut self, delay: Duration) {
        self.observed_at_ms.get_or_insert_with(now_ms);
        let soon = Instant::now() + delay;
        self.publish_at = Some(self.publish_at.map_or(soon, |at| at.min(soon)));
    }

    /// The owner records changed (or a recheck is due): a claim another fleet took over
    /// ends at once; a refusal is tried again when the owner released the cluster or its
    /// lease lapsed.
    fn owners_changed(&mut self) {
        let standing = self.ctx.owners.standing(&self.id);
        match (&self.claim, &standing) {
            (Claim::Held(_), Standing::Mine) | (Claim::Refused(_), Standing::Taken(_)) => {}
            (Claim::Held(_), _) => {
                warn!(cluster = %self.id, ?standing, "this fleet no longer owns the cluster; not writing it until it is claimed again");
                self.claim = Claim::Unclaimed;
                self.schedule_soon();
            }
            (Claim::Refused(_), _) => self.schedule_soon(),
            (Claim::Unclaimed, _) => {}
        }
        self.report();
    }

    /// Whether this fleet owns the cluster in the current term, claiming it if needed.
    async fn owned(&mut self, epoch: u64) -> bool {
        // Another fleet wrote a key: check the owner record again before writing it back.
        let foreign = self.publisher.take_foreign_fleet();
        if self.claim == Claim::Held(epoch)
            && !foreign
            && self.ctx.owners.standing(&self.id) == Standing::Mine
        {
            return true;
        }
        match self.ctx.owners.claim(&self.id).await {
            Ok(()) => {
                if self.claim != Claim::Held(epoch) {
                    info!(cluster = %self.id, fleet = %self.ctx.fleet, epoch, "this fleet owns the cluster: publishing it");
                    // Everything is compared with the bus again.
                    self.dirty.add_all();
                }
                self.claim = Claim::Held(epoch);
                true
            }
            Err(ClaimError::Refused { owner, .. }) => {
                if self.claim != Claim::Refused(owner.clone()) {
                    warn!(
                        cluster = %self.id,
                        fleet = %self.ctx.fleet,
                        %owner,
                        "refusing to publish the cluster: another fleet whose lease is current owns it"
                    );
                }
                self.claim = Claim::Refused(owner);
                false
            }
            Err(ClaimError::NotLeading) => false,
            Err(error) => {
                warn!(cluster = %self.id, %error, "cannot claim the cluster; retrying");
                self.claim = Claim::Unclaimed;
                self.publish_at = Some(Instant::now() + RETRY);
                false
            }
        }
    }

    /// Reports the cluster's state in the metrics when it changed: refused (this leader
    /// was refused, or, on a standby, another live fleet owns it), else synced or syncing.
    fn report(&mut self) {
        let refused = match &self.claim {
            Claim::Refused(owner) if self.ctx.leadership.leads() => Some(owner.clone()),
            _ if self.ctx.leadership.leads() => None,
            _ => match self.ctx.owners.standing(&self.id) {
                Standing::Taken(owner) => Some(owner),
                _ => None,
            },
        };
        let state = match refused {
            Some(owner) => ClusterState::Refused { owner },
            None if self.synced => ClusterState::Synced,
            None => ClusterState::Syncing,
        };
        if self.reported.as_ref() == Some(&state) {
            return;
        }
        match &state {
            ClusterState::Refused { owner } => self.ctx.metrics.cluster_refused(&self.id, owner),
            other => self
                .ctx
                .metrics
                .cluster_state(&self.id, *other == ClusterState::Synced),
        }
        self.reported = Some(state);
    }

    async fn publish(&mut self) {
        self.publish_at = None;
        let Some(epoch) = self.ctx.leadership.current() else {
            self.claim = Claim::Unclaimed;
            return self.stand_by();
        };
        // The claim waits until there is something of the cluster to write: its first full
        // state (so that a cluster handed over to this fleet is rewritten right after the
        // claim), or a watch error for its status.
        let cluster_work = self.store.synced() || !self.errors.is_empty();
        let owned = cluster_work && self.owned(epoch).await;
        if cluster_work && !owned {
            // Refused: the cluster is not written, but its caches count for readiness and
            // the config side (no cluster's) goes on.
            self.dirty = Dirty::default();
            if self.store.synced() && !self.synced {
                self.synced = true;
                info!(cluster = %self.id, "cluster synced (caches only: refused)");
                self.ctx.readiness.synced(&readiness_name(&self.id));
            }
        }
        let observed_at_ms = self.observed_at_ms.take().unwrap_or_else(now_ms);
        let selectors = self.ctx.selectors.borrow().clone();
        let retry = owned && self.publisher.needs_retry();
        if owned && self.store.synced() && (retry || !self.dirty.is_empty()) {
            let mut dirty = std::mem::take(&mut self.dirty);
            if retry {
                dirty.add_all();
            }
            let desired =
                self.store
                    .desired(&self.id, &selectors, &dirty, &self.ctx.system_namespace);
            let report = self
                .publisher
                .publish_scoped(&desired, observed_at_ms, &|k| dirty.contains_key(k))
                .await;
            self.ctx.publish_metrics.published(&report);
            if !self.synced {
                self.synced = true;
                info!(cluster = %self.id, services = self.store.services.values().count(), "cluster synced");
                self.ctx.readiness.synced(&readiness_name(&self.id));
            }
        }
        self.report();
        let config_retry = self.publish_config_at(observed_at_ms).await;
        let config_error = self.config.as_ref().and_then(ConfigSide::last_error);
        if owned && (self.synced || !self.errors.is_empty() || config_error.is_some()) {
            let last_error = self
                .errors
                .iter()
                .next()
                .map(|((_, kind), error)| format!("{kind}: {error}"))
                .or(config_error);
            self.status.set(self.synced, last_error).await;
            if let Some(issuer) = &self.issuer {
                self.issuer_writer.put(issuer.clone()).await;
            }
        }
        let cluster_retry = owned && self.publisher.needs_retry();
        if cluster_retry || config_retry {
            let at = Instant::now() + RETRY;
            // (a failed claim may have asked for a retry already)
            self.publish_at = Some(self.publish_at.map_or(at, |t| t.min(at)));
        }
    }

    /// Publishes the config side (if any); returns whether it needs a retry.
    async fn publish_config_at(&mut self, observed_at_ms: u64) -> bool {
        let Some(config) = &mut self.config else {
            return false;
        };
        let selectors = self.ctx.selectors.borrow().clone();
        config
            .publish(&self.ctx, &self.store, &selectors, observed_at_ms)
            .await;
        config.needs_retry()
    }

    fn stop(mut self) {
        // Dropping the connections aborts their watches: nothing is written after this.
        self.pending = None;
        self.active._watches.clear();
        self.config = None;
        self.ctx.services.remove(&self.id);
        self.ctx.metrics.cluster_removed(&self.id);
        self.ctx.readiness.forget(&readiness_name(&self.id));
    }
}

/// [`Publisher::bus_changed`] of the config side, if any.
async fn config_bus_changed(config: &mut Option<ConfigSide>) {
    match config {
        Some(config) => config.bus_changed().await,
        None => std::future::pending().await,
    }
}

/// What a core change requires recomputing.
enum Affects {
    Nothing,
    Namespace(String),
    All,
}

/// The namespace and Service of the EndpointSlice a change is of, when known (a relist
/// touches many).
fn slice_service(
    store: &ClusterStore,
    change: &Change<Box<EndpointSlice>>,
) -> Option<(String, String)> {
    let service_of = |slice: &EndpointSlice| {
        slice
            .metadata
            .labels
            .as_ref()?
            .get(SERVICE_NAME_LABEL)
            .cloned()
    };
    let (key, service) = match change {
        Change::Apply(key, Ok(slice)) | Change::InitApply(key, Ok(slice)) => {
            (key, service_of(slice))
        }
        Change::Delete(key) => (key, store.slices.get(key).and_then(|s| service_of(s))),
        _ => return None,
    };
    Some((key.0.clone(), service?))
}

/// Applies a core (non-config) update to a store.
fn apply(store: &mut ClusterStore, update: Update) -> Affects {
    let touched = match update {
        // A Namespace's labels decide its own selection: it touches its namespace.
        Update::Namespace(change) => match store.namespaces.apply(change) {
            Touched::Key((_, name)) => return Affects::Namespace(name),
            other => other,
        },
        Update::Service(change) => store.services.apply(change),
        Update::Slice(change) => store.slices.apply(change),
        Update::Pod(change) => store.pods.apply(change),
        Update::Node(change) => store.nodes.apply(change),
        Update::Crd(_)
        | Update::Config(..)
        | Update::Secret(_)
        | Update::RootConfigMap(_)
        | Update::Credential(_)
        | Update::Issuer(_)
        | Update::Health { .. } => Touched::Nothing,
    };
    match touched {
        Touched::Nothing => Affects::Nothing,
        Touched::Key((ns, _)) if !ns.is_empty() => Affects::Namespace(ns),
        Touched::Key(_) | Touched::All => Affects::All,
    }
}
