//! Watches: one task per watched kind, running a kube-rs `watcher` with the default
//! backoff, reducing each object as it arrives and sending the change to its cluster task.

use super::metrics::{KubeMetrics, WatchEvent, WatchKind};
use super::reduce::{self, CrdInfo, ObjKey, SecretData};
use super::store::Change;
use crate::error::InvalidObject;
use crate::selector::Labels;
use crate::task::TaskGuard;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret as KubeSecret;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use shoal_common::model::ClusterIssuer;
use shoal_common::model::{ConfigKind, ConfigObject};
use std::fmt::Debug;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// A change of some watched kind.
#[derive(Debug)]
pub enum Update {
    /// A Namespace (its labels).
    Namespace(Change<Labels>),
    /// A Service.
    Service(Change<Box<Service>>),
    /// An EndpointSlice.
    Slice(Change<Box<EndpointSlice>>),
    /// A Pod.
    Pod(Change<Box<Pod>>),
    /// A Node.
    Node(Change<Box<Node>>),
    /// An Istio CRD.
    Crd(Change<CrdInfo>),
    /// An Istio config object.
    Config(ConfigKind, Change<Box<ConfigObject>>),
    /// A multicluster Secret.
    Secret(Change<SecretData>),
    /// A root certificate ConfigMap (see [`super::ca_root`]).
    RootConfigMap(Change<Box<ConfigMap>>),
    /// A Secret that may hold a gateway credential (reduced to its credential keys).
    Credential(Change<Box<KubeSecret>>),
    /// The cluster's token issuer was read, or could not be (see [`super::issuer`]).
    Issuer(Result<ClusterIssuer, String>),
    /// The watch of `kind` failed (it retries with backoff); `None` when it works again.
    Health {
        /// The kind's metric label.
        kind: String,
        /// The error, or `None` once the watch delivers again.
        error: Option<String>,
    },
}

/// An update and the watch it comes from: the generation lets the receiver drop updates
/// of watches it has replaced.
#[derive(Debug)]
pub struct Tagged {
    /// The generation of the watch (its connection, or its config kind watch).
    pub generation: u64,
    /// The update.
    pub update: Update,
}

/// Where a watch sends its updates, and how it labels its metrics and logs.
#[derive(Clone)]
pub struct Sink {
    /// The cluster task's channel.
    pub tx: mpsc::Sender<Tagged>,
    /// The generation stamped on every update.
    pub generation: u64,
    /// The cluster, for metrics and logs.
    pub cluster: String,
    /// Metrics.
    pub metrics: KubeMetrics,
}

/// Starts a watch of `api`: every event becomes a [`Change`] built with `reduce`
/// (`Ok(None)`: not an object of interest, skipped) and `wrap`.
pub fn spawn<K, V>(
    api: Api<K>,
    config: watcher::Config,
    kind: WatchKind,
    sink: Sink,
    reduce: impl Fn(K) -> Result<Option<V>, InvalidObject> + Send + 'static,
    wrap: impl Fn(Change<V>) -> Update + Send + 'static,
) -> TaskGuard
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    V: Send + 'static,
{
    let task = async move {
        let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
        let mut failing = false;
        while let Some(item) = stream.next().await {
            let event = event_name(&item);
            sink.metrics.event(&sink.cluster, kind, event);
            let update = match item {
                Ok(event) => {
                    if failing {
                        failing = false;
                        debug!(cluster = %sink.cluster, %kind, "watch works again");
                        let health = Update::Health {
                            kind: kind.to_string(),
                            error: None,
                        };
                        if !send(&sink, health).await {
                            return;
                        }
                    }
                    match change(event, &reduce) {
                        Some(change) => wrap(change),
                        None => continue,
                    }
                }
                Err(error) => {
                    if is_expired(&error) {
                        // 410 Gone: the resource version is too old; the watcher relists.
                        debug!(cluster = %sink.cluster, %kind, "watch expired; relisting");
                        continue;
                    }
                    warn!(cluster = %sink.cluster, %kind, %error, "watch failed; retrying with backoff");
                    failing = true;
                    Update::Health {
                        kind: kind.to_string(),
                        error: Some(error.to_string()),
                    }
                }
            };
            if !send(&sink, update).await {
                return;
            }
        }
    };
    TaskGuard::new(tokio::spawn(task))
}

/// Sends an update; false when the receiving cluster task is gone.
async fn send(sink: &Sink, update: Update) -> bool {
    let tagged = Tagged {
        generation: sink.generation,
        update,
    };
    sink.tx.send(tagged).await.is_ok()
}

fn event_name<K>(item: &Result<Event<K>, watcher::Error>) -> WatchEvent {
    match item {
        Ok(Event::Init) => WatchEvent::Init,
        Ok(Event::InitApply(_)) => WatchEvent::InitApply,
        Ok(Event::InitDone) => WatchEvent::InitDone,
        Ok(Event::Apply(_)) => WatchEvent::Apply,
        Ok(Event::Delete(_)) => WatchEvent::Delete,
        Err(_) => WatchEvent::Error,
    }
}

fn is_expired(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

/// The change for a watcher event; `None` for objects `reduce` skips.
fn change<K: Resource, V>(
    event: Event<K>,
    reduce: &impl Fn(K) -> Result<Option<V>, InvalidObject>,
) -> Option<Change<V>> {
    let reduced = |obj: K| -> Option<(ObjKey, Result<V, InvalidObject>)> {
        let key = reduce::key_of(obj.meta());
        match reduce(obj) {
            Ok(Some(v)) => Some((key, Ok(v))),
            Ok(None) => None,
            Err(e) => Some((key, Err(e))),
        }
    };
    Some(match event {
        Event::Init => Change::Init,
        Event::InitApply(obj) => {
            let (key, value) = reduced(obj)?;
            Change::InitApply(key, value)
        }
        Event::InitDone => Change::InitDone,
        Event::Apply(obj) => {
            let (key, value) = reduced(obj)?;
            Change::Apply(key, value)
        }
        Event::Delete(obj) => Change::Delete(reduce::key_of(obj.meta())),
    })
}
