//! The connected proxies of this replica and each stream's per-type sync state, read by
//! `/debug/syncz`, `/debug/push_status` and `/debug/config_dump`.
//!
//! A stream's [`Connection`] is the one record of what it sent, what the proxy acknowledged
//! and what it rejected: the stream decides on nonces from it, and the registry lists the
//! same `Arc`, so the debug endpoints read the stream's own state, not a copy kept beside it.

use super::session::Mode;
use crate::index::proxy::{Proxy, ProxyKind};
use serde::Serialize;
use shoal_proto::XdsType;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Sync state of one xDS type on one connection.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TypeStatus {
    /// Version of the last response sent.
    pub sent_version: String,
    /// Nonce of the last response sent (empty: none sent yet).
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
    /// The names a proxyless gRPC node requested (it names every type's resources), for
    /// `/debug/config_dump`. Not in syncz, and not kept for Envoys (a sidecar's EDS names
    /// run to thousands; its dump derives them from its clusters).
    #[serde(skip)]
    pub requested: Option<crate::push::view::Names>,
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

/// One identified stream: its proxy and its per-type sync state, owned by the stream and
/// listed in the [`Registry`] while it lives. The lock is never held across an `.await`.
#[derive(Debug)]
pub struct Connection {
    /// Connection id (unique within this replica).
    pub id: String,
    /// The parsed proxy identity.
    pub proxy: Proxy,
    /// `sotw` or `delta`.
    pub mode: Mode,
    types: Mutex<BTreeMap<XdsType, TypeStatus>>,
}

impl Connection {
    /// A connection with nothing sent yet.
    pub fn new(id: String, proxy: Proxy, mode: Mode) -> Connection {
        Connection {
            id,
            proxy,
            mode,
            types: Mutex::default(),
        }
    }

    fn types(&self) -> MutexGuard<'_, BTreeMap<XdsType, TypeStatus>> {
        self.types.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Updates one type's state.
    pub fn update<R>(&self, ty: XdsType, f: impl FnOnce(&mut TypeStatus) -> R) -> R {
        f(self.types().entry(ty).or_default())
    }

    /// The version and nonce of the last response of `ty` (empty strings: none yet).
    pub fn last_sent(&self, ty: XdsType) -> (String, String) {
        match self.types().get(&ty) {
            Some(s) => (s.sent_version.clone(), s.sent_nonce.clone()),
            None => Default::default(),
        }
    }

    /// The names requested of `ty`, as far as they are kept (see
    /// [`TypeStatus::requested`]).
    pub fn requested(&self, ty: XdsType) -> Vec<String> {
        self.types()
            .get(&ty)
            .and_then(|s| s.requested.as_ref())
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// What `/debug/syncz` shows of this connection, now.
    pub fn status(&self) -> ConnectionStatus {
        ConnectionStatus {
            connection_id: self.id.clone(),
            node_id: self.proxy.id.clone(),
            proxy_type: self.proxy.kind,
            namespace: self.proxy.namespace.clone(),
            mode: self.mode,
            types: self
                .types()
                .iter()
                .map(|(ty, s)| (ty.type_url().to_string(), s.clone()))
                .collect(),
        }
    }
}

/// What `/debug/syncz` shows of one connected proxy.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionStatus {
    /// Connection id (unique within this replica).
    pub connection_id: String,
    /// The proxy's node id.
    pub node_id: String,
    /// `sidecar`, `router` or `proxyless`.
    pub proxy_type: ProxyKind,
    /// The proxy's namespace.
    pub namespace: String,
    /// `sotw` or `delta`.
    pub mode: Mode,
    /// Per type URL.
    pub types: BTreeMap<String, TypeStatus>,
}

/// The identified streams of this replica, by connection id. Locked only when a stream is
/// identified or ends, and when a debug endpoint lists them.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<Mutex<BTreeMap<String, Arc<Connection>>>>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Connection>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists a connection.
    pub fn add(&self, conn: Arc<Connection>) {
        self.lock().insert(conn.id.clone(), conn);
    }

    /// Removes a connection.
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// The connection of a proxy, by node id (the newest if it has several).
    pub fn find(&self, node_id: &str) -> Option<Arc<Connection>> {
        self.lock()
            .values()
            .rev()
            .find(|c| c.proxy.id == node_id)
            .cloned()
    }

    /// The state of every connection, by id.
    pub fn snapshot(&self) -> Vec<ConnectionStatus> {
        let conns: Vec<Arc<Connection>> = self.lock().values().cloned().collect();
        conns.iter().map(|c| c.status()).collect()
    }
}
