//! What every ADS stream shares, SotW or delta: the proxy's identity, its view (scope and
//! generated resources shared with every proxy of the same view key), and the bookkeeping
//! behind `/debug/syncz` and metrics.

use super::limits::{self, WarnLimiter};
use super::registry::{Connection, Nack, Registry};
use crate::generate::cache::compare;
use crate::generate::sds;
use crate::generate::{Resource, Snapshot};
use crate::index::proxy::{Proxy, ProxyKind};
use crate::index::scope::ProxyScope;
use crate::push::view::{Diff, Held, NameSet, Names, NamesChange, Output, View, Views};
use crate::security::auth::{authorize, verified_identity, Caller};
use crate::xds::metrics::{CloseReason, XdsMetrics};
use shoal_proto::pb::envoy::config::core::v3::Node;
use shoal_proto::XdsType;
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::Status;

/// Which protocol variant a stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// State of the world.
    Sotw,
    /// Incremental.
    Delta,
}

/// What a stream knows once its proxy is identified: both or neither.
struct Identified {
    /// The proxy and this stream's per-type sync state (listed in the registry).
    conn: Arc<Connection>,
    /// The view of the proxy's key, shared with every stream of the same key.
    view: Arc<View>,
}

/// One ADS stream's shared state.
pub(crate) struct Session {
    pub id: String,
    pub mode: Mode,
    /// The proxy and its view, once the first request named the node.
    identified: Option<Identified>,
    pub registry: Registry,
    pub metrics: XdsMetrics,
    views: Views,
    /// Who opened the stream (secure port); `None` on the plaintext port.
    caller: Option<Caller>,
    /// Why the stream ended, counted when the session is dropped (`aborted` unless the
    /// stream's driver says otherwise: a panic).
    pub close_reason: CloseReason,
    /// Rate limits of this stream's per-request warnings (see [`limits::WarnLimiter`]).
    warn_nack: WarnLimiter,
    warn_unsupported: WarnLimiter,
    warn_sds: WarnLimiter,
    /// The requested gateway credentials refused, and why: a refusal is counted and logged
    /// when it starts (or its reason changes), not on every push.
    sds_denied: BTreeMap<String, sds::Denial>,
}

impl Session {
    pub fn new(
        id: String,
        mode: Mode,
        registry: Registry,
        metrics: XdsMetrics,
        views: Views,
        caller: Option<Caller>,
    ) -> Session {
        Session {
            id,
            mode,
            identified: None,
            registry,
            metrics,
            views,
            caller,
            close_reason: CloseReason::Aborted,
            warn_nack: WarnLimiter::default(),
            warn_unsupported: WarnLimiter::default(),
            warn_sds: WarnLimiter::default(),
            sds_denied: BTreeMap::new(),
        }
    }

    /// Whether a request of `ty` naming nothing means every resource, for this stream's
    /// proxy (never for proxyless gRPC: see [`crate::index::proxy::ProxyKind::wildcard`]).
    pub fn wildcard(&self, ty: XdsType) -> bool {
        match &self.identified {
            Some(i) => i.conn.proxy.kind.wildcard(ty),
            None => ty.is_wildcard_type(),
        }
    }

    /// Whether the first request (with the node) has been seen.
    pub fn identified(&self) -> bool {
        self.identified.is_some()
    }

    /// Identifies the proxy from the first request's node; later calls are no-ops.
    pub fn identify(&mut self, node: Option<&Node>) -> Result<(), Status> {
        if self.identified.is_some() {
            return Ok(());
        }
        let mut proxy =
            Proxy::from_node(node).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if let Some(caller) = &self.caller {
            if let Err(error) = authorize(&proxy, caller) {
                self.metrics
                    .auth_refused
                    .with_label_values(&[error.reason()])
                    .inc();
                // Logged (rate-limited) when the stream closes with this status.
                tracing::debug!(conn = %self.id, %error, "refusing xDS stream");
                return Err(error.status());
            }
            proxy.verified = Some(verified_identity(&proxy, caller));
        }
        tracing::info!(conn = %self.id, node = %proxy.id, kind = ?proxy.kind, mode = ?self.mode, "proxy connected");
        self.metrics
            .connections
            .with_label_values(&[proxy.kind.label()])
            .inc();
        let view = self.views.view_for(&proxy);
        let conn = Arc::new(Connection::new(self.id.clone(), proxy, self.mode));
        self.registry.add(conn.clone());
        self.identified = Some(Identified { conn, view });
        Ok(())
    }

    /// The shared instance of a set of requested names (see [`View::intern`]). SDS names a
    /// proxy may not have are counted and logged when an output is made for them
    /// ([`Session::output`]), not here.
    pub fn intern(&self, ty: XdsType, mut names: NameSet, snap: &Snapshot) -> Names {
        let Some(identified) = self.identified.as_ref() else {
            return Arc::new(names);
        };
        // An on-demand ztunnel also gets its node's workloads unasked (istiod's
        // `AdditionalPodSubscriptions`): it never names its own pods.
        let proxy = &identified.conn.proxy;
        if proxy.kind == ProxyKind::Ztunnel
            && ty == XdsType::Address
            && !proxy.node_name.is_empty()
            && !names.contains(crate::generate::ambient::WILDCARD)
        {
            names.insert(crate::generate::ambient::node_name(&proxy.node_name));
        }
        identified.view.for_type(ty, &snap.ctx).intern(ty, names)
    }

    /// Counts and logs the requested gateway credentials `snap` refuses this stream
    /// (`generate::sds` leaves them out of the output), each when its refusal starts or its
    /// reason changes. A name that merely names nothing (`not_found`: the Secret may not
    /// exist yet) is not a refusal. Logs name the caller and the Secret, never key material.
    fn note_secret_denials(&mut self, names: &Names, snap: &Snapshot) {
        let Some(Identified { conn, .. }) = &self.identified else {
            return;
        };
        let proxy = &conn.proxy;
        let mut denied = BTreeMap::new();
        for name in names.iter() {
            match sds::authorize(name, proxy, snap) {
                Ok(_) | Err(sds::Denial::NotFound) => {}
                Err(denial) => {
                    denied.insert(name.clone(), denial);
                }
            }
        }
        for (name, denial) in &denied {
            if self.sds_denied.get(name) == Some(denial) {
                continue;
            }
            self.metrics
                .sds_denied
                .with_label_values(&[denial.reason()])
                .inc();
            if let Some(suppressed) = self.warn_sds.check() {
                let caller = match &self.caller {
                    Some(c) => format!("{} ({})", c.describe(), c.source),
                    None => "unauthenticated (plaintext port)".to_string(),
                };
                let cluster = proxy
                    .verified
                    .as_ref()
                    .map(|v| v.cluster.to_string())
                    .unwrap_or_default();
                let secret = limits::truncate(name, limits::MAX_VERSION_BYTES);
                tracing::warn!(
                    conn = %self.id, node = %proxy.id, namespace = %proxy.namespace, %caller,
                    %cluster, %secret, reason = denial.reason(), suppressed,
                    "refusing a gateway credential (SDS): only to an authenticated gateway \
                     whose service account runs a workload serving the Secret, in the \
                     Secret's namespace and cluster"
                );
            }
        }
        self.sds_denied = denied;
    }

    /// The resources of `ty` (for `names` unless a wildcard type) in `snap`, from the
    /// proxy's view. Credentials (SDS) go to authenticated streams only, as istiod's, and
    /// only those `generate::sds` authorizes for the stream's verified identity (refusals
    /// counted here). With the cache assert mode on, the view's output is checked against
    /// the resources generated for this stream's own proxy.
    pub async fn output(
        &mut self,
        ty: XdsType,
        snap: &Arc<Snapshot>,
        names: &Names,
    ) -> Arc<Output> {
        self.output_from(ty, snap, names, None).await
    }

    /// [`Session::output`] for names made from the stream's previous ones by `change`
    /// (derived from their output: see [`View::output_from`]).
    pub async fn output_from(
        &mut self,
        ty: XdsType,
        snap: &Arc<Snapshot>,
        names: &Names,
        change: Option<&NamesChange>,
    ) -> Arc<Output> {
        if ty == XdsType::Secret {
            self.note_secret_denials(names, snap);
        }
        let Some(Identified { conn, view }) = &self.identified else {
            return Arc::default();
        };
        let proxy = &conn.proxy;
        if ty == XdsType::Secret && self.caller.is_none() {
            return Arc::default();
        }
        let out = view
            .for_type(ty, &snap.ctx)
            .output_from(ty, names, snap, change)
            .await;
        if self.views.generation().cache().asserting() {
            let scope = ProxyScope::compute(proxy, &snap.ctx);
            let names: Vec<String> = names.iter().cloned().collect();
            let own = crate::generate::generate(ty, proxy, &scope, snap, &names);
            let shared = out.iter().map(|r| r.as_ref());
            if let Some(mismatch) = compare(
                "view output",
                || {
                    format!(
                        "{} of proxy {} (the view key misses an input)",
                        ty.short(),
                        proxy.id
                    )
                },
                shared,
                &own,
            ) {
                mismatch.abort();
            }
        }
        out
    }

    /// What `out` changes for a proxy holding `held` (shared between the streams of a view).
    pub fn diff(
        &self,
        ty: XdsType,
        names: &Names,
        held: &Held,
        out: &Arc<Output>,
        snap: &Snapshot,
    ) -> Arc<Diff> {
        match self.identified.as_ref().map(|i| &i.view) {
            Some(view) => view.for_type(ty, &snap.ctx).diff(ty, names, held, out),
            None => Arc::new(Diff::between(held, out)),
        }
    }

    /// Starts handling a request: identifies the proxy on the first one, and parses the
    /// type URL (`None`: a type shoal does not serve, logged and ignored).
    pub fn begin_request(
        &mut self,
        node: Option<&Node>,
        type_url: &str,
    ) -> Result<Option<XdsType>, Status> {
        self.identify(node)?;
        let ty = XdsType::from_type_url(type_url);
        if ty.is_none() {
            if let Some(suppressed) = self.warn_unsupported.check() {
                let type_url = limits::truncate(type_url, limits::MAX_VERSION_BYTES);
                tracing::warn!(conn = %self.id, %type_url, suppressed, "ignoring request for an unsupported type");
            }
        }
        Ok(ty)
    }

    /// The types a published snapshot can affect for this proxy. `last` is the snapshot
    /// number this stream last saw: if it missed one, everything may have changed.
    pub fn affected(
        &self,
        published: &crate::push::pipeline::Published,
        last: u64,
    ) -> std::collections::BTreeSet<XdsType> {
        let snap = &published.snapshot;
        let Some(Identified { conn, view }) = &self.identified else {
            return Default::default();
        };
        let proxy = &conn.proxy;
        if snap.number != last + 1 {
            return XdsType::ALL.into_iter().collect();
        }
        let scope = view.scope(&snap.ctx);
        crate::push::impact::affected_types(&published.changes, proxy.kind, &scope)
    }

    /// Records a NACK: counted always, logged rate-limited, its message kept truncated to
    /// [`limits::MAX_NACK_DETAIL_BYTES`].
    pub fn nack(&mut self, ty: XdsType, nonce: &str, version: &str, message: &str) {
        self.metrics.of(ty).nacks.inc();
        let version = limits::truncate(version, limits::MAX_VERSION_BYTES);
        let message = limits::truncate(message, limits::MAX_NACK_DETAIL_BYTES);
        if let Some(suppressed) = self.warn_nack.check() {
            tracing::warn!(
                conn = %self.id, ty = ty.short(), %nonce, %version, error = %message, suppressed,
                "proxy rejected configuration (NACK)"
            );
        }
        let nack = Nack {
            nonce: nonce.into(),
            version,
            message,
        };
        self.update(ty, |s| s.last_nack = Some(nack));
    }

    /// Updates this stream's sync state of `ty` (a no-op until the proxy is identified,
    /// which every request handler does first).
    fn update(&self, ty: XdsType, f: impl FnOnce(&mut super::registry::TypeStatus)) {
        if let Some(i) = &self.identified {
            i.conn.update(ty, f);
        }
    }

    /// The version and nonce of the last response of `ty` (empty strings: none yet).
    pub fn last_sent(&self, ty: XdsType) -> (String, String) {
        match &self.identified {
            Some(i) => i.conn.last_sent(ty),
            None => Default::default(),
        }
    }

    /// Records the names a proxyless node now requests of `ty` (for `/debug/config_dump`;
    /// Envoys' are not kept: see `TypeStatus::requested`).
    pub fn requested(&self, ty: XdsType, names: &Names) {
        if let Some(i) = &self.identified {
            if i.conn.proxy.kind == crate::index::proxy::ProxyKind::Proxyless {
                i.conn.update(ty, |s| s.requested = Some(names.clone()));
            }
        }
    }

    /// Records how many resources a resuming delta stream already held (not sent again).
    pub fn resumed(&self, ty: XdsType, unchanged: usize) {
        self.update(ty, |s| s.resumed = unchanged);
    }

    /// Records an ACK.
    pub fn ack(&self, ty: XdsType, nonce: &str, version: &str) {
        self.update(ty, |s| {
            s.acked_version = limits::truncate(version, limits::MAX_VERSION_BYTES);
            s.acked_nonce = nonce.to_string();
        });
    }

    /// Records a response about to be sent.
    pub fn sent<'r>(
        &self,
        ty: XdsType,
        version: &str,
        nonce: &str,
        resources: impl IntoIterator<Item = &'r Arc<Resource>>,
        total: usize,
        observed_at_ms: Option<u64>,
    ) {
        let (count, bytes) = resources
            .into_iter()
            .fold((0usize, 0usize), |(n, b), r| (n + 1, b + r.any.value.len()));
        self.update(ty, |s| {
            s.sent_version = version.to_string();
            s.sent_nonce = nonce.to_string();
            s.resources = total;
            s.resources_sent += count as u64;
        });
        let m = self.metrics.of(ty);
        m.pushes.inc();
        m.push_bytes.inc_by(bytes as u64);
        m.resources_sent.inc_by(count as u64);
        if let Some(obs) = observed_at_ms {
            let lag_ms = shoal_common::envelope::now_ms().saturating_sub(obs);
            m.convergence_seconds.observe(lag_ms as f64 / 1000.0);
        }
        tracing::debug!(conn = %self.id, ty = ty.short(), %version, %nonce, resources = count, bytes, "push");
    }
}

impl Drop for Session {
    /// Unregisters the stream, however it ended.
    fn drop(&mut self) {
        if let Some(Identified { conn, .. }) = &self.identified {
            let p = &conn.proxy;
            self.metrics
                .connections
                .with_label_values(&[p.kind.label()])
                .dec();
            tracing::info!(conn = %self.id, node = %p.id, reason = self.close_reason.as_str(), "proxy disconnected");
        }
        self.metrics
            .streams_closed
            .with_label_values(&[self.close_reason.as_str()])
            .inc();
        self.registry.remove(&self.id);
    }
}
