//! What every ADS stream shares, SotW or delta: the proxy's identity, its view (scope and
//! generated resources shared with every proxy of the same view key), and the bookkeeping
//! behind `/debug/syncz` and metrics.

use super::limits::{self, WarnLimiter};
use super::registry::{Nack, Registry};
use crate::auth::{authorize, Caller};
use crate::generate::cache::compare;
use crate::generate::sds;
use crate::generate::{Resource, Snapshot};
use crate::metrics::Metrics;
use crate::proxy::{Proxy, ProxyKind};
use crate::scope::ProxyScope;
use crate::view::{Diff, Held, NameSet, Names, NamesChange, Output, View, Views};
use shoal_proto::pb::envoy::config::core::v3::Node;
use shoal_proto::XdsType;
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

/// One ADS stream's shared state.
pub(crate) struct Session {
    pub id: String,
    pub mode: Mode,
    proxy: Option<Proxy>,
    /// The view of the proxy's key, shared with every stream of the same key.
    view: Option<Arc<View>>,
    pub registry: Registry,
    pub metrics: Metrics,
    views: Views,
    /// Who opened the stream (secure port); `None` on the plaintext port.
    caller: Option<Caller>,
    /// Why the stream ended, counted when the session is dropped (`aborted` unless the
    /// stream's driver says otherwise: a panic).
    pub close_reason: &'static str,
    /// Rate limits of this stream's per-request warnings (see [`limits::WarnLimiter`]).
    warn_nack: WarnLimiter,
    warn_unsupported: WarnLimiter,
    warn_sds: WarnLimiter,
}

impl Session {
    pub fn new(
        id: String,
        mode: Mode,
        registry: Registry,
        metrics: Metrics,
        views: Views,
        caller: Option<Caller>,
    ) -> Session {
        Session {
            id,
            mode,
            proxy: None,
            view: None,
            registry,
            metrics,
            views,
            caller,
            close_reason: "aborted",
            warn_nack: WarnLimiter::default(),
            warn_unsupported: WarnLimiter::default(),
            warn_sds: WarnLimiter::default(),
        }
    }

    /// Whether the first request (with the node) has been seen.
    pub fn identified(&self) -> bool {
        self.proxy.is_some()
    }

    /// Identifies the proxy from the first request's node; later calls are no-ops.
    pub fn identify(&mut self, node: Option<&Node>) -> Result<(), Status> {
        if self.proxy.is_some() {
            return Ok(());
        }
        let proxy = Proxy::from_node(node).map_err(|e| Status::invalid_argument(e.to_string()))?;
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
        }
        tracing::info!(conn = %self.id, node = %proxy.id, kind = ?proxy.kind, mode = ?self.mode, "proxy connected");
        self.registry.add(&self.id, &proxy, self.mode);
        self.metrics
            .connections
            .with_label_values(&[kind_label(proxy.kind)])
            .inc();
        self.view = Some(self.views.view_for(&proxy));
        self.proxy = Some(proxy);
        Ok(())
    }

    /// The shared instance of a set of requested names (see [`View::intern`]). Called when
    /// a proxy changes what it asks for: SDS names it may not have are logged and counted
    /// here (and never resolved: see [`Session::output`] and `generate::sds`).
    pub fn intern(&mut self, ty: XdsType, names: NameSet) -> Names {
        if ty == XdsType::Secret {
            self.check_secret_names(names.iter());
        }
        self.share(ty, names)
    }

    /// [`Session::intern`] for names of which only `added` are new (a delta request's):
    /// only those are checked, so a request costs what it adds.
    pub fn intern_added<'a>(
        &mut self,
        ty: XdsType,
        names: NameSet,
        added: impl Iterator<Item = &'a String>,
    ) -> Names {
        if ty == XdsType::Secret {
            self.check_secret_names(added);
        }
        self.share(ty, names)
    }

    fn share(&self, ty: XdsType, names: NameSet) -> Names {
        match &self.view {
            Some(view) => view.intern(ty, names),
            None => Arc::new(names),
        }
    }

    fn check_secret_names<'a>(&mut self, names: impl Iterator<Item = &'a String>) {
        let Some(proxy) = &self.proxy else { return };
        for name in names {
            let denial = match (&self.caller, sds::check(name, proxy)) {
                (None, _) => sds::Denial::Unauthenticated,
                (Some(_), Err(denial)) => denial,
                (Some(_), Ok(_)) => continue,
            };
            self.metrics
                .sds_denied
                .with_label_values(&[denial.reason()])
                .inc();
            // Counted always, logged rate-limited: a request may name 100 000.
            let Some(suppressed) = self.warn_sds.check() else {
                continue;
            };
            let name = limits::truncate(name, limits::MAX_VERSION_BYTES);
            tracing::warn!(
                conn = %self.id, node = %proxy.id, namespace = %proxy.namespace, secret = %name,
                reason = denial.reason(), suppressed,
                "refusing a gateway credential (SDS): gateways get credentials of their own \
                 namespace, on the authenticated (TLS) xDS port"
            );
        }
    }

    /// The resources of `ty` (for `names` unless a wildcard type) in `snap`, from the
    /// proxy's view. Credentials (SDS) go to authenticated streams only, as istiod's. With the cache assert mode on, the view's output is checked against
    /// the resources generated for this stream's own proxy.
    pub async fn output(&self, ty: XdsType, snap: &Arc<Snapshot>, names: &Names) -> Arc<Output> {
        self.output_from(ty, snap, names, None).await
    }

    /// [`Session::output`] for names made from the stream's previous ones by `change`
    /// (derived from their output: see [`View::output_from`]).
    pub async fn output_from(
        &self,
        ty: XdsType,
        snap: &Arc<Snapshot>,
        names: &Names,
        change: Option<&NamesChange>,
    ) -> Arc<Output> {
        let (Some(proxy), Some(view)) = (&self.proxy, &self.view) else {
            return Arc::default();
        };
        if ty == XdsType::Secret && self.caller.is_none() {
            return Arc::default();
        }
        let out = view.output_from(ty, names, snap, change).await;
        if self.views.generation().cache().asserting() {
            let scope = ProxyScope::compute(proxy, &snap.ctx);
            let names: Vec<String> = names.iter().cloned().collect();
            let own = crate::generate::generate(ty, proxy, &scope, snap, &names);
            let shared = out.resources().iter().map(|r| r.as_ref());
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
    pub fn diff(&self, ty: XdsType, names: &Names, held: &Held, out: &Arc<Output>) -> Arc<Diff> {
        match &self.view {
            Some(view) => view.diff(ty, names, held, out),
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
        published: &crate::pipeline::Published,
        last: u64,
    ) -> std::collections::BTreeSet<XdsType> {
        let snap = &published.snapshot;
        let (Some(proxy), Some(view)) = (&self.proxy, &self.view) else {
            return Default::default();
        };
        if snap.number != last + 1 {
            return XdsType::ALL.into_iter().collect();
        }
        let scope = view.scope(&snap.ctx);
        super::impact::affected_types(&published.changes, proxy.kind, &scope)
    }

    /// Records a NACK: counted always, logged rate-limited, its message kept truncated to
    /// [`limits::MAX_NACK_DETAIL_BYTES`].
    pub fn nack(&mut self, ty: XdsType, nonce: &str, version: &str, message: &str) {
        self.metrics.nacks.with_label_values(&[ty.short()]).inc();
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
        self.registry
            .update(&self.id, ty.type_url(), |s| s.last_nack = Some(nack));
    }

    /// Records an ACK.
    pub fn ack(&self, ty: XdsType, nonce: &str, version: &str) {
        self.registry.update(&self.id, ty.type_url(), |s| {
            s.acked_version = limits::truncate(version, limits::MAX_VERSION_BYTES);
            s.acked_nonce = nonce.to_string();
        });
    }

    /// Records a response about to be sent.
    pub fn sent(
        &self,
        ty: XdsType,
        version: &str,
        nonce: &str,
        resources: &[Arc<Resource>],
        total: usize,
        observed_at_ms: Option<u64>,
    ) {
        let bytes: usize = resources.iter().map(|r| r.any.value.len()).sum();
        self.registry.update(&self.id, ty.type_url(), |s| {
            s.sent_version = version.to_string();
            s.sent_nonce = nonce.to_string();
            s.resources = total;
            s.resources_sent += resources.len() as u64;
        });
        self.metrics.pushes.with_label_values(&[ty.short()]).inc();
        self.metrics
            .push_bytes
            .with_label_values(&[ty.short()])
            .inc_by(bytes as u64);
        self.metrics
            .resources_sent
            .with_label_values(&[ty.short()])
            .inc_by(resources.len() as u64);
        if let Some(obs) = observed_at_ms {
            let lag_ms = shoal_common::envelope::now_ms().saturating_sub(obs);
            self.metrics
                .convergence_seconds
                .with_label_values(&[ty.short()])
                .observe(lag_ms as f64 / 1000.0);
        }
        tracing::debug!(conn = %self.id, ty = ty.short(), %version, %nonce, resources = resources.len(), bytes, "push");
    }
}

impl Drop for Session {
    /// Unregisters the stream, however it ended.
    fn drop(&mut self) {
        if let Some(p) = &self.proxy {
            self.metrics
                .connections
                .with_label_values(&[kind_label(p.kind)])
                .dec();
            tracing::info!(conn = %self.id, node = %p.id, reason = self.close_reason, "proxy disconnected");
        }
        self.metrics
            .streams_closed
            .with_label_values(&[self.close_reason])
            .inc();
        self.registry.remove(&self.id);
    }
}

fn kind_label(kind: ProxyKind) -> &'static str {
    match kind {
        ProxyKind::Sidecar => "sidecar",
        ProxyKind::Router => "router",
    }
}
