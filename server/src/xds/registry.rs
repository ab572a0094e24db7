//! The registry of connected proxies and their per-type sync state (`/debug/syncz`).

use crate::index::proxy::{Proxy, ProxyKind};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Sync state of one xDS type on one connection.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TypeStatus {
    /// Version of the last response sent.
    pub sent_version: String,
    /// Nonce of the last response sent.
    pub sent_nonce: String,
    /// Version the proxy last acknowledged.
    pub acked_version: String,
    /// Nonce the proxy last acknowledged.
    pub acked_nonce: String,
    /// Resources in the last response.
    pub resources: usize,
    /// Resources sent on this stream so far (cumulative; delta sends only changes).
    pub resources_sent: u64,
    /// Delta: resources the proxy already held at their current version when the stream
    /// started (`initial_resource_versions`), and so were not sent again.
    pub resumed: usize,
    /// The last NACK, if the proxy rejected a response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_nack: Option<Nack>,
}

/// A rejected response.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Nack {
    /// Nonce of the rejected response.
    pub nonce: String,
    /// Version the proxy kept.
    pub version: String,
    /// Envoy's error message.
    pub message: String,
}

/// One connected proxy.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionStatus {
    /// Connection id (unique within this replica).
    pub connection_id: String,
    /// The proxy's node id.
    pub node_id: String,
    /// `sidecar` or `router`.
    pub proxy_type: ProxyKind,
    /// The proxy's namespace.
    pub namespace: String,
    /// `sotw` or `delta`.
    pub mode: super::session::Mode,
    /// Per type URL.
    pub types: BTreeMap<String, TypeStatus>,
    /// The parsed proxy identity (for `/debug/config_dump`).
    #[serde(skip)]
    pub proxy: Proxy,
}

/// Shared registry. The lock is never held across an `.await`.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<Mutex<BTreeMap<String, ConnectionStatus>>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ConnectionStatus>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection.
    pub fn add(&self, id: &str, proxy: &Proxy, mode: super::session::Mode) {
        self.lock().insert(
            id.to_string(),
            ConnectionStatus {
                connection_id: id.to_string(),
                node_id: proxy.id.clone(),
                proxy_type: proxy.kind,
                namespace: proxy.namespace.clone(),
                mode,
                types: BTreeMap::new(),
                proxy: proxy.clone(),
            },
        );
    }

    /// Removes a connection.
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Updates one type's state of a connection.
    pub fn update(&self, id: &str, type_url: &str, f: impl FnOnce(&mut TypeStatus)) {
        if let Some(c) = self.lock().get_mut(id) {
            f(c.types.entry(type_url.to_string()).or_default());
        }
    }

    /// The connection of a proxy, by node id (the newest if it has several).
    pub fn find(&self, node_id: &str) -> Option<ConnectionStatus> {
        self.lock()
            .values()
            .rev()
            .find(|c| c.node_id == node_id)
            .cloned()
    }

    /// All connections, by id.
    pub fn snapshot(&self) -> Vec<ConnectionStatus> {
        self.lock().values().cloned().collect()
    }
}
