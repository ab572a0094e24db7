//! The mesh's root certificate in every namespace: istiod's namespace controller
//! (`pilot/pkg/serviceregistry/kube/controller/namespacecontroller.go`).
//!
//! istio-agent (and anything else that verifies the mesh's certificates) reads the root
//! from the ConfigMap `istio-ca-root-cert`, key `root-cert.pem`, in its own namespace. With
//! `--ca-root-cert FILE` the leader of the fleet keeps that ConfigMap in every namespace of
//! every cluster it publishes that passes the discovery selectors, as istiod does:
//!
//! - a missing ConfigMap is created (labelled `istio.io/config: "true"`), one whose
//!   `root-cert.pem` differs is updated (other keys and metadata are kept), so a deleted or
//!   edited one is put back;
//! - the file is re-read every [`FILE_INTERVAL`]; a new root is written everywhere
//!   (rotation);
//! - Kubernetes' own namespaces (`kube-public`, `kube-node-lease`, `local-path-storage`) are
//!   skipped; `kube-system` is not, as in Istio;
//! - nothing is deleted: a namespace that stops being selected keeps its ConfigMap (istiod
//!   does not delete it either).
//!
//! Only the leader writes, and only to clusters its fleet owns; a standby keeps its caches
//! warm and writes as soon as it leads. A write whose object changed meanwhile (409) is
//! retried from the newer object the watch brings. Watches: Namespaces, and ConfigMaps of
//! that one name (field selector), cluster-wide.

use super::metrics::{KubeMetrics, RootReload, RootWrite, WatchKind};
use super::reduce;
use super::store::{Change, KindStore};
use super::watch::{self, Sink, Tagged, Update};
use crate::coordination::lease::Leadership;
use crate::coordination::ownership::{Owners, Standing};
use crate::source::mesh_config::SelectorsRx;
use crate::task::TaskGuard;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use shoal_common::time::sleep_until;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The ConfigMap's name (Istio's `CACertNamespaceConfigMap`).
pub const CONFIG_MAP: &str = "istio-ca-root-cert";

/// The key of the root certificate in it (Istio's `CACertNamespaceConfigMapDataName`).
pub const KEY: &str = "root-cert.pem";

/// Namespaces never written (Istio's `inject.IgnoredNamespaces` minus `kube-system`).
const IGNORED: [&str; 3] = ["kube-public", "kube-node-lease", "local-path-storage"];

/// How often the root certificate file is checked for changes.
pub const FILE_INTERVAL: Duration = Duration::from_secs(2);

/// Changes are reconciled this long after the first one, so a burst is one round.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// A round with failed writes is retried after this long, doubled after each further
/// failed round up to [`MAX_RETRY`] (a cluster that forbids the writes is not hammered).
const RETRY: Duration = Duration::from_secs(1);

/// The longest wait between failed rounds.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// The root certificate(s) to distribute, PEM, as last read from the file.
pub type RootRx = tokio::sync::watch::Receiver<Arc<str>>;

/// Why the root certificate file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RootCertError {
    /// The file cannot be read.
    #[error("cannot read the root certificate {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no PEM certificate.
    #[error("{path} (--ca-root-cert) holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NotPem {
        /// The file.
        path: PathBuf,
    },
}

/// Reads the root certificate file: one or more PEM certificates.
pub fn load(path: &Path) -> Result<String, RootCertError> {
    let text = std::fs::read_to_string(path).map_err(|source| RootCertError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let begin = text.find("-----BEGIN CERTIFICATE-----");
    let end = text.rfind("-----END CERTIFICATE-----");
    match (begin, end) {
        (Some(b), Some(e)) if b < e => Ok(text),
        _ => Err(RootCertError::NotPem {
            path: path.to_path_buf(),
        }),
    }
}

/// Loads the root certificate file and follows it: the receiver has the current root, and
/// a changed file that is still a certificate replaces it. A file that becomes unreadable or
/// is not a certificate is logged and counted (`result="error"`); the previous root stays.
pub fn follow(path: PathBuf, metrics: KubeMetrics) -> Result<RootRx, RootCertError> {
    let root = load(&path)?;
    metrics.ca_root_reloaded(RootReload::Ok);
    info!(path = %path.display(), "distributing the root certificate to every selected namespace");
    let (tx, rx) = tokio::sync::watch::channel(Arc::<str>::from(root.as_str()));
    tokio::spawn(async move {
        let mut last = Ok(root);
        loop {
            tokio::time::sleep(FILE_INTERVAL).await;
            let read = load(&path).map_err(|e| e.to_string());
            if read == last {
                continue;
            }
            match &read {
                Ok(root) => {
                    metrics.ca_root_reloaded(RootReload::Ok);
                    info!(path = %path.display(), "root certificate changed; writing it everywhere");
                    tx.send_if_modified(|current| {
                        let changed = **current != **root;
                        if changed {
                            *current = Arc::from(root.as_str());
                        }
                        changed
                    });
                }
                Err(error) => {
                    metrics.ca_root_reloaded(RootReload::Error);
                    warn!(%error, "root certificate file unusable; still distributing the previous one");
                }
            }
            last = read;
            if tx.is_closed() {
                return;
            }
        }
    });
    Ok(rx)
}

/// What the distributor of one cluster needs.
pub struct Distributor {
    /// The cluster, for metrics and logs.
    pub cluster: String,
    /// The cluster's client.
    pub client: Client,
    /// The root to write.
    pub root: RootRx,
    /// Which namespaces are selected.
    pub selectors: SelectorsRx,
    /// Whether this replica writes.
    pub leadership: Leadership,
    /// Whether this fleet owns the cluster.
    pub owners: Owners,
    /// Metrics.
    pub metrics: KubeMetrics,
}

/// A ConfigMap as kept: the object without its managed fields.
fn reduce_config_map(mut cm: ConfigMap) -> ConfigMap {
    cm.metadata.managed_fields = None;
    cm
}

impl Distributor {
    /// Starts the watches and the writer of this cluster; they stop when the guard drops.
    pub fn spawn(self) -> TaskGuard {
        TaskGuard::new(tokio::spawn(self.run()))
    }

    async fn run(mut self) {
        let (tx, mut rx) = mpsc::channel(1024);
        let sink = Sink {
            tx,
            generation: 0,
            cluster: self.cluster.clone(),
            metrics: self.metrics.clone(),
        };
        let _watches = [
            watch::spawn(
                Api::<Namespace>::all(self.client.clone()),
                watcher::Config::default(),
                WatchKind::RootNamespace,
                sink.clone(),
                |ns| Ok(Some(reduce::namespace(ns))),
                Update::Namespace,
            ),
            watch::spawn(
                Api::<ConfigMap>::all(self.client.clone()),
                watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}")),
                WatchKind::RootConfigMap,
                sink,
                |cm| Ok(Some(Box::new(reduce_config_map(cm)))),
                Update::RootConfigMap,
            ),
        ];
        let mut state = State {
            namespaces: KindStore::new(&self.cluster, "Namespace"),
            config_maps: KindStore::new(&self.cluster, "ConfigMap"),
        };
        let mut owner_events = self.owners.events();
        let mut at: Option<Instant> = None;
        let (mut selectors_open, mut root_open) = (true, true);
        let mut failed_rounds: u32 = 0;
        let mut could_write = false;
        let soon = |at: &mut Option<Instant>| {
            at.get_or_insert_with(|| Instant::now() + DEBOUNCE);
        };
        loop {
            tokio::select! {
                received = rx.recv() => match received {
                    Some(Tagged { update, .. }) => {
                        if state.apply(update) {
                            soon(&mut at);
                        }
                    }
                    None => return,
                },
                changed = self.root.changed(), if root_open => match changed {
                    Ok(()) => soon(&mut at),
                    Err(_) => root_open = false,
                },
                // Fixed selectors (no --mesh-config) have no sender.
                changed = self.selectors.changed(), if selectors_open => match changed {
                    Ok(()) => soon(&mut at),
                    Err(_) => selectors_open = false,
                },
                () = self.leadership.changed() => soon(&mut at),
                () = owner_events.next() => {
                    // Owner records change for every cluster (and this wakes every second):
                    // a round only when this replica becomes able to write the cluster.
                    let may = self.may_write();
                    if may && !could_write {
                        soon(&mut at);
                    }
                    could_write = may;
                }
                () = sleep_until(at), if at.is_some() => {
                    at = None;
                    if self.reconcile(&mut state).await {
                        failed_rounds = 0;
                    } else {
                        let delay = RETRY.saturating_mul(1 << failed_rounds.min(6)).min(MAX_RETRY);
                        failed_rounds += 1;
                        at = Some(Instant::now() + delay);
                    }
                }
            }
        }
    }

    /// Whether this replica may write to the cluster now: it leads, and its fleet owns it.
    fn may_write(&self) -> bool {
        self.leadership.leads() && self.owners.standing(&self.cluster) == Standing::Mine
    }

    /// Writes what differs; returns false when a write failed (a retry is due).
    async fn reconcile(&self, state: &mut State) -> bool {
        let synced = state.namespaces.synced() && state.config_maps.synced();
        if !synced || !self.may_write() {
            return true;
        }
        let root = self.root.borrow().clone();
        let selectors = self.selectors.borrow().clone();
        let targets: Vec<String> = state
            .namespaces
            .iter()
            .filter(|((_, name), labels)| {
                !IGNORED.contains(&name.as_str()) && selectors.selects_namespace(name, Some(labels))
            })
            .map(|((_, name), _)| name.clone())
            .collect();
        let mut ok = true;
        for ns in targets {
            let key = (ns.clone(), CONFIG_MAP.to_string());
            let current = state.config_maps.get(&key);
            let up_to_date = current.is_some_and(|cm| {
                cm.data
                    .as_ref()
                    .and_then(|d| d.get(KEY))
                    .is_some_and(|v| *v == *root)
            });
            if up_to_date {
                continue;
            }
            // Stopping to lead in the middle of a round stops the writes.
            if !self.may_write() {
                return true;
            }
            match self.write(&ns, current.cloned(), &root).await {
                Written::Done(cm) => {
                    self.count(RootWrite::Written);
                    state
                        .config_maps
                        .apply(Change::Apply(key, Ok(Box::new(reduce_config_map(*cm)))));
                }
                Written::Skipped => {}
                Written::Retry => ok = false,
                Written::Failed => {
                    self.count(RootWrite::Failed);
                    ok = false;
                }
            }
        }
        ok
    }

    fn count(&self, result: RootWrite) {
        self.metrics.ca_root_written(&self.cluster, result);
    }

    /// Creates the ConfigMap in `ns`, or updates `current`'s root.
    async fn write(&self, ns: &str, current: Option<Box<ConfigMap>>, root: &str) -> Written {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), ns);
        let pp = PostParams {
            field_manager: Some("shoal-ingester".into()),
            ..PostParams::default()
        };
        let cluster = &self.cluster;
        match current {
            None => {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(CONFIG_MAP.into());
                cm.metadata.namespace = Some(ns.into());
                cm.metadata.labels = Some(BTreeMap::from([(
                    "istio.io/config".to_string(),
                    "true".to_string(),
                )]));
                cm.data = Some(BTreeMap::from([(KEY.to_string(), root.to_string())]));
                match api.create(&pp, &cm).await {
                    Ok(created) => {
                        info!(%cluster, namespace = ns, "root certificate ConfigMap created");
                        Written::Done(Box::new(created))
                    }
                    // Someone created it meanwhile: the watch brings it, then it is compared.
                    Err(kube::Error::Api(e)) if e.code == 409 => Written::Retry,
                    // The namespace is gone or terminating: nothing to write (as istiod).
                    Err(kube::Error::Api(e))
                        if e.code == 404 || (e.code == 403 && terminating(&e)) =>
                    {
                        debug!(%cluster, namespace = ns, "namespace gone or terminating; root certificate not written");
                        Written::Skipped
                    }
                    Err(error) => {
                        warn!(%cluster, namespace = ns, %error, "cannot create the root certificate ConfigMap; retrying");
                        Written::Failed
                    }
                }
            }
            Some(existing) => {
                let mut cm = *existing;
                cm.data
                    .get_or_insert_with(BTreeMap::new)
                    .insert(KEY.to_string(), root.to_string());
                match api.replace(CONFIG_MAP, &pp, &cm).await {
                    Ok(updated) => {
                        info!(%cluster, namespace = ns, "root certificate ConfigMap updated");
                        Written::Done(Box::new(updated))
                    }
                    // Changed (or deleted) meanwhile: the watch brings the newer state.
                    Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                        debug!(%cluster, namespace = ns, code = e.code, "root certificate ConfigMap changed meanwhile; retrying");
                        Written::Retry
                    }
                    Err(error) => {
                        warn!(%cluster, namespace = ns, %error, "cannot update the root certificate ConfigMap; retrying");
                        Written::Failed
                    }
                }
            }
        }
    }
}

/// The outcome of one write.
enum Written {
    /// The object as stored.
    Done(Box<ConfigMap>),
    /// Nothing to write after all.
    Skipped,
    /// A race; the next round (after the watch caught up) writes again.
    Retry,
    /// A failure, counted.
    Failed,
}

/// Whether a 403 is the API server refusing to create in a terminating namespace.
fn terminating(e: &kube::core::Status) -> bool {
    e.message.contains("because it is being terminated")
}

/// The watched state of one cluster.
struct State {
    namespaces: KindStore<crate::selector::Labels>,
    config_maps: KindStore<Box<ConfigMap>>,
}

impl State {
    /// Applies a watch update; returns whether anything observable changed.
    fn apply(&mut self, update: Update) -> bool {
        use super::store::Touched;
        let touched = match update {
            Update::Namespace(change) => self.namespaces.apply(change),
            Update::RootConfigMap(change) => self.config_maps.apply(change),
            // Watch health is logged by the watch itself; the writes retry on their own.
            _ => Touched::Nothing,
        };
        touched != Touched::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_accepts_only_pem_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("root-cert.pem");
        let missing = load(&path).unwrap_err().to_string();
        assert!(
            missing.contains("cannot read the root certificate"),
            "{missing}"
        );
        std::fs::write(
            &path,
            "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let not_pem = load(&path).unwrap_err().to_string();
        assert!(not_pem.contains("--ca-root-cert"), "{not_pem}");
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::write(&path, pem).unwrap();
        assert_eq!(load(&path).unwrap(), pem);
    }
}
