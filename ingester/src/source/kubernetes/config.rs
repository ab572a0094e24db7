//! The Istio config of the config cluster: a watch of CustomResourceDefinitions decides
//! which kinds exist, each existing kind gets its own watch (of the served version, v1
//! preferred), and the objects are published to `shoal-config`.
//!
//! A missing CRD never blocks anything: its kind is simply not watched until the CRD
//! appears. When a CRD is removed, its kind's watch stops and its keys are deleted.
//!
//! With credential keys (`--credential-key-file`), Secrets are watched too, in every
//! namespace (service-account tokens and Helm releases excepted, by field selector), each
//! reduced to its credential keys; those a Gateway of their namespace names are published
//! sealed ([`crate::desired::credentials`]).
//!
//! Every object's verdict (accepted, partially enforced, or rejected and why) also goes to the
//! [`StatusBook`], whose [`StatusReporter`] writes it into the object's `status` when the
//! object was rejected (see [`super::object_status`]).

use super::context::ClusterContext;
use super::gateway_deploy::{DeployConfig, GatewayBook, GatewayDeployer};
use super::gateway_status::{self, GatewayStatuses, Rejection};
use super::metrics::WatchKind;
use super::object_status::{self, Selection, StatusBook, StatusReporter, Verdict};
use super::reduce::{self, CrdInfo};
use super::store::{
    key_config_kind, selected, Change, ClusterStore, ConfigStore, KindStore, Touched,
};
use super::watch::{self, Sink, Tagged, Update};
use crate::admit::istio;
use crate::desired::scope::Dirty;
use crate::desired::{credentials, StateKey, StateObject};
use crate::publish::{Ownership, Publisher};
use crate::selector::{DiscoverySelectors, Labels};
use crate::task::TaskGuard;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use kube::{Api, Client};
use shoal_common::credential::CredentialKeys;
use shoal_common::model::ConfigObject;
use shoal_common::model::{ConfigKind, ConfigSpec, GATEWAY_API_GROUP};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::{mpsc, watch as tokio_watch};
use tracing::{debug, info};

/// Secrets that never hold gateway credentials, left out of the watch.
const CREDENTIAL_FIELDS: &str =
    "type!=kubernetes.io/service-account-token,type!=helm.sh/release.v1";

/// The watch of the Secrets that may hold gateway credentials, and what it holds.
struct CredentialWatch {
    keys: Arc<CredentialKeys>,
    store: KindStore<Box<KubeSecret>>,
    _task: TaskGuard,
}

/// The readiness component of the config kinds.
pub const READINESS: &str = "istio config";

/// The watch of one config kind.
struct KindWatch {
    version: &'static str,
    generation: u64,
    _task: TaskGuard,
}

/// The config half of the config cluster's task.
pub struct ConfigSide {
    cluster: String,
    client: Client,
    publisher: Publisher,
    sink: Sink,
    store: ConfigStore,
    kinds: BTreeMap<ConfigKind, KindWatch>,
    /// The generation of the latest kind watch; each watch has its own.
    next_generation: u64,
    _crd_watch: TaskGuard,
    /// The namespaces whose config must be recomputed.
    pub dirty: Dirty,
    /// Failing watches by kind.
    errors: BTreeMap<String, String>,
    synced: bool,
    /// The status writes the objects need.
    statuses: StatusBook,
    /// The namespaces whose objects may get a status, for the reporter.
    selection: tokio_watch::Sender<Selection>,
    _reporter: TaskGuard,
    /// The Gateways to deploy, when `--gateway-deployment` is on, and the task deploying
    /// them.
    deployments: Option<(GatewayBook, TaskGuard)>,
    /// Gateway credentials, when the ingester has keys to seal them.
    credentials: Option<CredentialWatch>,
    /// The Gateway API objects' statuses, as watch events carry them.
    gateway_statuses: GatewayStatuses,
    /// Whether the Gateway API statuses must be recomputed (besides `dirty`).
    gateway_dirty: bool,
    /// The served resource of each watched kind, for status writes.
    resources: BTreeMap<ConfigKind, Arc<ApiResource>>,
}

impl ConfigSide {
    /// Loads the config publisher and starts the CRD watch.
    pub async fn start(
        ctx: &ClusterContext,
        cluster: &str,
        client: Client,
        tx: mpsc::Sender<Tagged>,
    ) -> ConfigSide {
        let publisher = ctx.publisher(Ownership::config());
        let sink = Sink {
            tx,
            generation: 0,
            cluster: cluster.to_string(),
            metrics: ctx.metrics.clone(),
        };
        let crd_watch = watch::spawn(
            Api::<CustomResourceDefinition>::all(client.clone()),
            watcher::Config::default(),
            WatchKind::Crd,
            sink.clone(),
            |crd| Ok(reduce::crd(crd)),
            Update::Crd,
        );
        let credentials = ctx.credential_keys.clone().map(|keys| CredentialWatch {
            keys,
            store: KindStore::new(cluster, WatchKind::CredentialSecret.as_str()),
            _task: watch::spawn(
                Api::<KubeSecret>::all(client.clone()),
                watcher::Config::default().fields(CREDENTIAL_FIELDS),
                WatchKind::CredentialSecret,
                sink.clone(),
                |s| Ok(Some(Box::new(credentials::reduce(s)))),
                Update::Credential,
            ),
        });
        let statuses = StatusBook::default();
        let (selection, selection_rx) = tokio_watch::channel(None);
        let reporter = StatusReporter::new(
            client.clone(),
            statuses.clone(),
            ctx.leadership.clone(),
            selection_rx,
            ctx.metrics.clone(),
            cluster,
        );
        let deployments = ctx.gateway_proxy_image.clone().map(|proxy_image| {
            let book = GatewayBook::default();
            let deployer = GatewayDeployer::new(
                client.clone(),
                DeployConfig {
                    proxy_image,
                    cluster_id: cluster.to_string(),
                },
                book.clone(),
                ctx.leadership.clone(),
                selection.subscribe(),
                ctx.metrics.clone(),
            );
            (book, TaskGuard::new(tokio::spawn(deployer.run())))
        });
        ConfigSide {
            cluster: cluster.to_string(),
            client,
            publisher,
            sink,
            store: ConfigStore::new(cluster),
            kinds: BTreeMap::new(),
            next_generation: 0,
            _crd_watch: crd_watch,
            dirty: Dirty::default(),
            errors: BTreeMap::new(),
            synced: false,
            statuses,
            selection,
            _reporter: TaskGuard::new(tokio::spawn(reporter.run())),
            deployments,
            credentials,
            gateway_statuses: GatewayStatuses::default(),
            gateway_dirty: false,
            resources: BTreeMap::new(),
        }
    }

    /// Whether a publishing round has work: config to recompute, or Gateway API statuses.
    pub fn wants_round(&self) -> bool {
        !self.dirty.is_empty() || self.gateway_dirty
    }

    /// Services or Namespaces of the config cluster changed: the Gateway API statuses
    /// (backends, gateway addresses) are recomputed.
    pub fn cluster_changed(&mut self) {
        self.gateway_dirty = true;
    }

    /// An EndpointSlice of `service` in `namespace` changed: the Gateway API statuses are
    /// recomputed only when it is a Gateway's own Service (`<gateway>-<class>`, whose
    /// endpoints decide `Programmed`), so endpoint churn elsewhere costs nothing here.
    pub fn slice_changed(&mut self, namespace: &str, service: &str) {
        let Some(gateways) = self.store.kinds.get(&ConfigKind::KubeGateway) else {
            return;
        };
        let of_a_gateway = gateways.in_namespace(namespace).any(|gw| match &gw.spec {
            ConfigSpec::KubeGateway(g) => service
                .strip_prefix(gw.meta.name.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|class| class == g.gateway_class_name),
            _ => false,
        });
        if of_a_gateway {
            self.gateway_dirty = true;
        }
    }

    /// Applies a CRD or config update.
    pub fn handle(&mut self, generation: u64, update: Update) {
        match update {
            Update::Crd(change) => {
                let touched = self.store.crds.apply(change);
                if self.store.crds.synced() && touched != Touched::Nothing {
                    self.reconcile_kinds();
                    // Also the first round after the CRDs are listed: it sweeps config
                    // keys of kinds whose CRD is gone since the last run.
                    self.dirty.add_all();
                }
            }
            Update::Config(kind, change) => {
                let current = self.kinds.get(&kind).map(|w| w.generation);
                if current != Some(generation) {
                    return; // from a watch that was replaced or stopped
                }
                let Some(store) = self.store.kinds.get_mut(&kind) else {
                    return;
                };
                if kind.group() == GATEWAY_API_GROUP || kind == ConfigKind::ServiceEntry {
                    self.gateway_dirty = true;
                }
                if let Change::Delete(key) = &change {
                    self.statuses.forget(kind, key);
                    self.gateway_statuses.forget(kind, key);
                    if let Some((book, _)) = &self.deployments {
                        match kind {
                            ConfigKind::KubeGateway => book.forget_gateway(key),
                            ConfigKind::GatewayClass => book.forget_class(&key.1),
                            _ => {}
                        }
                    }
                }
                if let (
                    Some((book, _)),
                    Change::Apply(key, Ok(c)) | Change::InitApply(key, Ok(c)),
                ) = (&self.deployments, &change)
                {
                    match &c.spec {
                        ConfigSpec::KubeGateway(g) => book.observe_gateway(key, g),
                        ConfigSpec::GatewayClass(class) => {
                            book.observe_class(&key.1, &class.controller_name);
                        }
                        _ => {}
                    }
                }
                let relisted = matches!(change, Change::InitDone);
                self.dirty.add_touched(&store.apply(change));
                // A relist ends with what exists: objects deleted while the watch was
                // down are forgotten too (they never got a Delete).
                if let (true, Some((book, _))) = (relisted, &self.deployments) {
                    match kind {
                        ConfigKind::KubeGateway => book.retain_gateways(|k| store.get(k).is_some()),
                        ConfigKind::GatewayClass => {
                            book.retain_classes(|name| store.iter().any(|((_, n), _)| n == name));
                        }
                        _ => {}
                    }
                }
            }
            Update::Credential(change) => {
                if let Some(c) = &mut self.credentials {
                    self.dirty.add_touched(&c.store.apply(change));
                }
            }
            Update::Health { kind, error } => {
                let current = ConfigKind::parse(&kind)
                    .map(|k| self.kinds.get(&k).map(|w| w.generation) == Some(generation));
                if current == Some(false) {
                    return; // from a watch that was replaced or stopped
                }
                match error {
                    Some(error) => self.errors.insert(kind, error),
                    None => self.errors.remove(&kind),
                };
            }
            _ => {}
        }
    }

    /// Whether a watch of this kind is one of the config side's.
    pub fn watches(&self, kind: &str) -> bool {
        kind == WatchKind::Crd.as_str()
            || ConfigKind::parse(kind).is_some()
            || (kind == WatchKind::CredentialSecret.as_str() && self.credentials.is_some())
    }

    /// A failing watch's error, if any.
    pub fn last_error(&self) -> Option<String> {
        let (kind, error) = self.errors.iter().next()?;
        Some(format!("{kind}: {error}"))
    }

    /// Starts, switches and stops kind watches to match the CRDs.
    fn reconcile_kinds(&mut self) {
        let wanted: BTreeMap<ConfigKind, (&'static str, String)> = self
            .store
            .crds
            .values()
            .filter_map(|crd: &CrdInfo| {
                let version = crd.preferred_version()?;
                Some((crd.kind, (version, crd.plural.clone())))
            })
            .collect();
        let gone: Vec<ConfigKind> = self
            .kinds
            .keys()
            .filter(|k| !wanted.contains_key(k))
            .copied()
            .collect();
        for kind in gone {
            info!(cluster = %self.cluster, %kind, "CRD removed; stopping its watch and deleting its config");
            self.kinds.remove(&kind);
            self.store.kinds.remove(&kind);
            self.statuses.forget_kind(kind);
            self.gateway_statuses.forget_kind(kind);
            self.resources.remove(&kind);
            self.gateway_dirty = true;
            if let Some((book, _)) = &self.deployments {
                match kind {
                    ConfigKind::KubeGateway => book.forget_gateways(),
                    ConfigKind::GatewayClass => book.retain_classes(|_| false),
                    _ => {}
                }
            }
            self.errors.remove(kind.as_str());
            self.dirty.add_all();
        }
        for (kind, (version, plural)) in wanted {
            if self.kinds.get(&kind).is_some_and(|w| w.version == version) {
                continue;
            }
            info!(cluster = %self.cluster, %kind, %version, "watching Istio config kind");
            self.start_kind(kind, version, &plural);
        }
    }

    /// Starts (or replaces) the watch of a kind. A replaced watch's objects stay in the
    /// store until the new watch's relist swaps them, so switching versions deletes
    /// nothing.
    fn start_kind(&mut self, kind: ConfigKind, version: &'static str, plural: &str) {
        self.next_generation += 1;
        let generation = self.next_generation;
        let gvk = GroupVersionKind::gvk(kind.group(), version, kind.kube_kind());
        let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &resource);
        let sink = Sink {
            generation,
            ..self.sink.clone()
        };
        let statuses = self.statuses.clone();
        let gateway_statuses = self.gateway_statuses.clone();
        let deployments = self.deployments.as_ref().map(|(book, _)| book.clone());
        let resource = Arc::new(resource);
        self.resources.insert(kind, resource.clone());
        let task = watch::spawn(
            api,
            watcher::Config::default(),
            WatchKind::Config(kind),
            sink,
            move |mut obj: DynamicObject| {
                let key = reduce::key_of(&obj.metadata);
                let generation = obj.metadata.generation;
                let uid = obj.metadata.uid.clone();
                let status = obj.data.get_mut("status").map(serde_json::Value::take);
                // A refused route's parents, read before the object is consumed.
                let raw_spec = (kind.group() == GATEWAY_API_GROUP)
                    .then(|| obj.data.get("spec").cloned())
                    .flatten();
                let config = reduce::config(kind, obj);
                let unenforced = match &config {
                    Ok(c) => istio::unenforced_fields(&c.spec).join("; "),
                    Err(_) => String::new(),
                };
                let verdict = match &config {
                    Err(e) => Verdict::Rejected(&e.reason),
                    Ok(_) if !unenforced.is_empty() => Verdict::PartiallyEnforced(&unenforced),
                    Ok(_) => Verdict::Accepted,
                };
                // The Gateway API's status has its own shape (per-parent route conditions,
                // listener conditions) that Istio's `Reconciled` condition and
                // `validationMessages` would not fit: a structural schema would prune them
                // and every event would ask for the write again. It is computed from the
                // whole config ([`super::gateway_status`]).
                if kind.group() == GATEWAY_API_GROUP {
                    let rejection = match &config {
                        Err(e) => Some(Rejection::new(&e.reason, raw_spec.as_ref())),
                        Ok(_) => None,
                    };
                    let event = gateway_status::Event {
                        generation,
                        status,
                        rejection,
                    };
                    gateway_statuses.observe(kind, key.clone(), event);
                } else {
                    statuses.observe(
                        kind,
                        &resource,
                        key.clone(),
                        generation,
                        status.as_ref(),
                        verdict,
                    );
                }
                if let Some(book) = deployments
                    .as_ref()
                    .filter(|_| kind == ConfigKind::KubeGateway)
                {
                    book.note_uid(&key, uid.as_deref());
                }
                config.map(|c| Some(Box::new(c)))
            },
            move |change| Update::Config(kind, change),
        );
        self.store
            .kinds
            .entry(kind)
            .or_insert_with(|| KindStore::new(&self.cluster, kind.as_str()));
        // A replaced watch's errors go with it; the new one reports its own.
        self.errors.remove(kind.as_str());
        self.kinds.insert(
            kind,
            KindWatch {
                version,
                generation,
                _task: task,
            },
        );
    }

    /// The sealed credentials of the dirty, selected namespaces: the Secrets a Gateway of
    /// their namespace names (Gateways known once their kind is listed).
    fn credential_entries(
        &self,
        c: &CredentialWatch,
        namespaces: &KindStore<Labels>,
        selectors: &DiscoverySelectors,
        dirty: &Dirty,
    ) -> Vec<(StateKey, StateObject)> {
        let Some(gateways) = self.store.kinds.get(&ConfigKind::Gateway) else {
            return Vec::new();
        };
        if !gateways.synced() || !c.store.synced() {
            return Vec::new();
        }
        // Gateway API Gateways name Secrets too; until their kind is listed (or when its
        // CRD is absent) only Istio Gateways' Secrets are known.
        let kube_gateways = self
            .store
            .kinds
            .get(&ConfigKind::KubeGateway)
            .filter(|g| g.synced())
            .into_iter()
            .flat_map(|g| g.values());
        let referenced = credentials::referenced(
            gateways
                .values()
                .chain(kube_gateways)
                .map(|g| (**g).clone()),
        );
        let secrets = dirty
            .select(|| c.store.namespaces())
            .into_iter()
            .filter(|ns| selected(namespaces, selectors, ns))
            .flat_map(|ns| {
                c.store
                    .in_namespace(ns)
                    .map(Box::as_ref)
                    .collect::<Vec<_>>()
            });
        credentials::entries(&self.cluster, secrets, &referenced, Some(&c.keys))
    }

    /// Recomputes the Gateway API objects' statuses and hands the writer those that
    /// differ; waits until the kinds, Services, EndpointSlices and Namespaces are listed,
    /// so that nothing is reported missing that is merely not listed yet.
    fn gateway_status(
        &mut self,
        ctx: &ClusterContext,
        cluster: &ClusterStore,
        selected: &BTreeSet<String>,
    ) {
        let kinds: Vec<&KindStore<Box<ConfigObject>>> = self
            .store
            .kinds
            .iter()
            .filter(|(k, _)| k.group() == GATEWAY_API_GROUP || **k == ConfigKind::ServiceEntry)
            .map(|(_, store)| store)
            .collect();
        let listed = kinds.iter().all(|k| k.synced())
            && cluster.services.synced()
            && cluster.slices.synced()
            && cluster.namespaces.synced();
        if !listed {
            self.gateway_dirty = true;
            return;
        }
        let config: Vec<&ConfigObject> = kinds
            .iter()
            .flat_map(|k| k.values())
            .map(Box::as_ref)
            .collect();
        let elsewhere =
            |ns: &str, name: &str| ctx.services.exists_elsewhere(&self.cluster, ns, name);
        let world = gateway_status::World {
            services: &cluster.services,
            slices: &cluster.slices,
            namespaces: &cluster.namespaces,
            selected,
            elsewhere: &elsewhere,
        };
        let rejected = self.gateway_statuses.rejected();
        let reports = gateway_status::reports(&config, &world, &rejected);
        let queued = self.gateway_statuses.reconcile(
            &reports,
            &self.resources,
            &self.statuses,
            &object_status::now_rfc3339(),
        );
        if queued > 0 {
            debug!(cluster = %self.cluster, queued, "Gateway API status writes queued");
        }
    }

    /// Whether the next round must publish everything (see [`Publisher::needs_retry`]).
    pub fn needs_retry(&self) -> bool {
        self.publisher.needs_retry()
    }

    /// Resolves when another writer changed an owned config key ([`Publisher::bus_changed`]).
    pub async fn bus_changed(&mut self) {
        self.publisher.bus_changed().await;
    }

    /// Standby: nothing is computed or written; the config counts as synced once the
    /// CRDs, the Namespaces and every kind are listed.
    pub fn stand_by(&mut self, ctx: &ClusterContext, namespaces: &KindStore<Labels>) {
        self.dirty = Dirty::default();
        if self.store.crds.synced() && namespaces.synced() {
            self.mark_synced(ctx, "Istio config synced (standby: caches only)");
        }
    }

    fn mark_synced(&mut self, ctx: &ClusterContext, message: &str) {
        let all_synced = self.store.kinds.values().all(KindStore::synced)
            && self.credentials.as_ref().is_none_or(|c| c.store.synced());
        if !self.synced && all_synced {
            self.synced = true;
            info!(cluster = %self.cluster, kinds = self.kinds.len(), "{message}");
            ctx.readiness.synced(READINESS);
        }
    }

    /// Publishes the dirty namespaces' config, once the CRDs and Namespaces are known.
    /// Keys of a kind whose first relist is still under way are neither written nor
    /// swept, so a kind that starts late never deletes what an earlier run published.
    pub async fn publish(
        &mut self,
        ctx: &ClusterContext,
        cluster: &ClusterStore,
        selectors: &DiscoverySelectors,
        observed_at_ms: u64,
    ) {
        let namespaces = &cluster.namespaces;
        if !self.store.crds.synced() || !namespaces.synced() {
            return;
        }
        let selected: BTreeSet<String> = namespaces
            .iter()
            .filter(|((_, ns), labels)| selectors.selects_namespace(ns, Some(labels)))
            .map(|((_, ns), _)| ns.clone())
            .collect();
        if std::mem::take(&mut self.gateway_dirty) || !self.dirty.is_empty() {
            self.gateway_status(ctx, cluster, &selected);
        }
        self.selection.send_if_modified(|current| {
            let changed = current.as_deref() != Some(&selected);
            if changed {
                *current = Some(Arc::new(selected));
            }
            changed
        });
        let retry = self.publisher.needs_retry();
        if retry || !self.dirty.is_empty() {
            let mut dirty = std::mem::take(&mut self.dirty);
            if retry {
                dirty.add_all();
            }
            let mut desired = self.store.desired(namespaces, selectors, &dirty);
            // The labels of the dirty, selected namespaces (Gateway API namespace selectors).
            desired.extend(
                dirty
                    .select(|| namespaces.iter().map(|((_, ns), _)| ns.as_str()).collect())
                    .into_iter()
                    .filter_map(|ns| {
                        let labels = namespaces.get(&(String::new(), ns.to_string()))?;
                        selectors
                            .selects_namespace(ns, Some(labels))
                            .then(|| crate::desired::namespace_entry(ns, labels))
                    }),
            );
            if let Some(c) = &self.credentials {
                desired.extend(self.credential_entries(c, namespaces, selectors, &dirty));
            }
            let store = &self.store;
            let credentials_known = self.credentials.as_ref().is_none_or(|c| c.store.synced());
            let in_scope = |key: &_| {
                dirty.contains_key(key)
                    && key_config_kind(key).is_none_or(|k| match k {
                        // Known once the Secrets are listed; none wanted without keys.
                        ConfigKind::Credential => credentials_known,
                        k => store.sweepable(k),
                    })
            };
            let report = self
                .publisher
                .publish_scoped(&desired, observed_at_ms, &in_scope)
                .await;
            ctx.publish_metrics.published(&report);
        }
        self.mark_synced(ctx, "Istio config synced");
    }
}
