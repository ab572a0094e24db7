//! Metrics of the xDS streams and the callers behind them: connections, pushes, NACKs,
//! convergence, why streams ended, refused callers and certificate requests, and the
//! bounds on callers (`shoal_xds_*`, `shoal_sds_denied_total`, `shoal_ca_requests_total`).

use crate::generate::sds::DENIAL_REASONS;
use crate::index::proxy::ProxyKind;
use crate::security::auth::{CredentialSource, REFUSAL_REASONS};
use crate::security::ca::CaResult;
use crate::xds::limits::Breach;
use prometheus::core::Collector;
use prometheus::{
    histogram_opts, opts, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Registry,
};
use shoal_proto::XdsType;
use std::sync::Arc;

/// Why an xDS stream ended: the `reason` label of `shoal_xds_streams_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The proxy ended its request stream (Envoy restarting, reconnecting).
    ProxyClosed,
    /// The request stream failed (transport error, reset).
    StreamError,
    /// A request was refused (invalid node, bad request): the stream ends with an error.
    Refused,
    /// A response could not be written: the proxy is gone.
    SendFailed,
    /// The server closed it: connection aged out (--max-connection-age) or draining.
    ServerClosed,
    /// The stream task ended abnormally (a panic).
    Aborted,
}

impl CloseReason {
    /// Every reason.
    pub const ALL: [CloseReason; 6] = [
        CloseReason::ProxyClosed,
        CloseReason::StreamError,
        CloseReason::Refused,
        CloseReason::SendFailed,
        CloseReason::ServerClosed,
        CloseReason::Aborted,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::ProxyClosed => "proxy_closed",
            CloseReason::StreamError => "stream_error",
            CloseReason::Refused => "refused",
            CloseReason::SendFailed => "send_failed",
            CloseReason::ServerClosed => "server_closed",
            CloseReason::Aborted => "aborted",
        }
    }
}

/// The xDS streams' metrics. Cheap to clone.
#[derive(Clone)]
pub struct XdsMetrics {
    /// Connected proxies by type (`sidecar`, `router`).
    pub connections: IntGaugeVec,
    /// Responses sent by xDS type.
    pub pushes: IntCounterVec,
    /// Response bytes sent by xDS type.
    pub push_bytes: IntCounterVec,
    /// Pushes skipped because nothing changed, by xDS type.
    pub pushes_unchanged: IntCounterVec,
    /// Resources sent, by xDS type.
    pub resources_sent: IntCounterVec,
    /// Delta: resources a reconnecting proxy already held and was not sent again, by type.
    pub resources_resumed: IntCounterVec,
    /// NACKs received by xDS type.
    pub nacks: IntCounterVec,
    /// Time from the ingester observing a change to the server pushing it, by xDS type.
    pub convergence_seconds: HistogramVec,
    /// Ended xDS streams, by reason.
    pub streams_closed: IntCounterVec,
    /// Views with connected proxies (set on scrape).
    pub views: IntGauge,
    /// Streams on the secure port refused, by reason (see [`crate::security::auth::AuthError::reason`]).
    pub auth_refused: IntCounterVec,
    /// Streams on the secure port authenticated, by credential (`certificate`, `token`).
    pub auth_accepted: IntCounterVec,
    /// Gateway credentials (SDS names) refused to a proxy, by reason (see
    /// [`crate::generate::sds::Denial::reason`]).
    pub sds_denied: IntCounterVec,
    /// Certificate requests (`CreateCertificate`), by result.
    pub ca_requests: IntCounterVec,
    /// Callers that hit a bound, by reason (see [`crate::xds::limits::Breach`]).
    pub limits_exceeded: IntCounterVec,
    /// Open xDS connections (both ports, proxies or not).
    pub open_connections: IntGauge,
    /// Bytes of xDS request messages being received (not yet complete).
    pub request_buffer_bytes: IntGauge,
    /// The per-type series above, resolved once: a push touches four of them, and
    /// looking a series up by its label hashes the label under a lock each time.
    per_type: Arc<[TypeMetrics]>,
}

/// One xDS type's series of the per-type metrics.
pub struct TypeMetrics {
    /// `shoal_xds_pushes_total`.
    pub pushes: IntCounter,
    /// `shoal_xds_push_bytes_total`.
    pub push_bytes: IntCounter,
    /// `shoal_xds_pushes_unchanged_total`.
    pub pushes_unchanged: IntCounter,
    /// `shoal_xds_resources_sent_total`.
    pub resources_sent: IntCounter,
    /// `shoal_xds_resources_resumed_total`.
    pub resources_resumed: IntCounter,
    /// `shoal_xds_rejects_total`.
    pub nacks: IntCounter,
    /// `shoal_convergence_seconds`.
    pub convergence_seconds: Histogram,
}

impl XdsMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> XdsMetrics {
        let mut m = XdsMetrics {
            // Resolved below, once the vectors exist.
            per_type: Arc::new([]),
            connections: IntGaugeVec::new(
                opts!("shoal_xds_connections", "Connected proxies by proxy type."),
                &["proxy_type"],
            )
            .expect("valid metric"),
            pushes: IntCounterVec::new(
                opts!("shoal_xds_pushes_total", "xDS responses sent, by type."),
                &["type"],
            )
            .expect("valid metric"),
            push_bytes: IntCounterVec::new(
                opts!(
                    "shoal_xds_push_bytes_total",
                    "Bytes of xDS resources sent, by type."
                ),
                &["type"],
            )
            .expect("valid metric"),
            pushes_unchanged: IntCounterVec::new(
                opts!(
                    "shoal_xds_pushes_unchanged_total",
                    "Pushes skipped because the proxy already has the same resources, by type."
                ),
                &["type"],
            )
            .expect("valid metric"),
            resources_sent: IntCounterVec::new(
                opts!(
                    "shoal_xds_resources_sent_total",
                    "xDS resources sent, by type."
                ),
                &["type"],
            )
            .expect("valid metric"),
            resources_resumed: IntCounterVec::new(
                opts!(
                    "shoal_xds_resources_resumed_total",
                    "Delta: resources a reconnecting proxy already held and was not sent again."
                ),
                &["type"],
            )
            .expect("valid metric"),
            nacks: IntCounterVec::new(
                opts!(
                    "shoal_xds_rejects_total",
                    "NACKs received from proxies, by type."
                ),
                &["type"],
            )
            .expect("valid metric"),
            convergence_seconds: HistogramVec::new(
                histogram_opts!(
                    "shoal_convergence_seconds",
                    "Time from the ingester observing a change to the server sending it, by type.",
                    prometheus::exponential_buckets(0.001, 2.0, 16).expect("valid buckets")
                ),
                &["type"],
            )
            .expect("valid metric"),
            streams_closed: IntCounterVec::new(
                opts!(
                    "shoal_xds_streams_closed_total",
                    "Ended xDS streams, by reason: proxy_closed, stream_error, refused, \
                     send_failed, server_closed, aborted."
                ),
                &["reason"],
            )
            .expect("valid metric"),
            views: IntGauge::new(
                "shoal_views",
                "Views (proxies with the same view key share generated configuration) \
                 with connected proxies.",
            )
            .expect("valid metric"),
            auth_refused: IntCounterVec::new(
                opts!(
                    "shoal_xds_auth_refused_total",
                    "xDS streams refused on the secure port, by reason."
                ),
                &["reason"],
            )
            .expect("valid metric"),
            auth_accepted: IntCounterVec::new(
                opts!(
                    "shoal_xds_auth_accepted_total",
                    "xDS streams authenticated on the secure port, by credential \
                     (certificate, token)."
                ),
                &["source"],
            )
            .expect("valid metric"),
            sds_denied: IntCounterVec::new(
                opts!(
                    "shoal_sds_denied_total",
                    "Gateway credentials (SDS resource names) a proxy asked for and may not \
                     have, by reason."
                ),
                &["reason"],
            )
            .expect("valid metric"),
            ca_requests: IntCounterVec::new(
                opts!(
                    "shoal_ca_requests_total",
                    "Workload certificate requests, by result: issued, unauthenticated, \
                     impersonation_not_node_agent, impersonation_unknown_node, \
                     impersonation_bad_identity, impersonation_not_on_node, bad_request, \
                     bad_csr, bad_ttl, signing_error."
                ),
                &["result"],
            )
            .expect("valid metric"),
            limits_exceeded: IntCounterVec::new(
                opts!(
                    "shoal_xds_limits_exceeded_total",
                    "xDS callers that hit a bound, by reason: message_size, connection_buffer, \
                     unauthenticated_buffer, process_buffer, message_timeout, identity_streams \
                     (each ends a stream), connections, idle_connection (each closes a \
                     connection)."
                ),
                &["reason"],
            )
            .expect("valid metric"),
            open_connections: IntGauge::new(
                "shoal_xds_open_connections",
                "Open xDS connections, both ports (capped by --xds-max-connections).",
            )
            .expect("valid metric"),
            request_buffer_bytes: IntGauge::new(
                "shoal_xds_request_buffer_bytes",
                "Bytes of xDS request messages being received, not yet complete (capped by \
                 --xds-request-buffer).",
            )
            .expect("valid metric"),
        };
        let collectors: Vec<Box<dyn Collector>> = vec![
            Box::new(m.connections.clone()),
            Box::new(m.pushes.clone()),
            Box::new(m.push_bytes.clone()),
            Box::new(m.pushes_unchanged.clone()),
            Box::new(m.resources_sent.clone()),
            Box::new(m.resources_resumed.clone()),
            Box::new(m.nacks.clone()),
            Box::new(m.convergence_seconds.clone()),
            Box::new(m.streams_closed.clone()),
            Box::new(m.views.clone()),
            Box::new(m.auth_refused.clone()),
            Box::new(m.auth_accepted.clone()),
            Box::new(m.sds_denied.clone()),
            Box::new(m.ca_requests.clone()),
            Box::new(m.limits_exceeded.clone()),
            Box::new(m.open_connections.clone()),
            Box::new(m.request_buffer_bytes.clone()),
        ];
        shoal_common::metrics::register_all(registry, collectors);
        // Every known label value at 0 from the first scrape: dashboards and alerts need no
        // "absent" special case.
        m.per_type = Arc::new(XdsType::ALL.map(|ty| {
            let label = [ty.short()];
            TypeMetrics {
                pushes: m.pushes.with_label_values(&label),
                push_bytes: m.push_bytes.with_label_values(&label),
                pushes_unchanged: m.pushes_unchanged.with_label_values(&label),
                resources_sent: m.resources_sent.with_label_values(&label),
                resources_resumed: m.resources_resumed.with_label_values(&label),
                nacks: m.nacks.with_label_values(&label),
                convergence_seconds: m.convergence_seconds.with_label_values(&label),
            }
        }));
        for kind in [
            ProxyKind::Sidecar,
            ProxyKind::Router,
            ProxyKind::Proxyless,
            ProxyKind::Ztunnel,
        ] {
            m.connections.with_label_values(&[kind.label()]);
        }
        for reason in CloseReason::ALL {
            m.streams_closed.with_label_values(&[reason.as_str()]);
        }
        for breach in Breach::ALL {
            m.limits_exceeded.with_label_values(&[breach.label()]);
        }
        for reason in REFUSAL_REASONS {
            m.auth_refused.with_label_values(&[reason]);
        }
        for reason in DENIAL_REASONS {
            m.sds_denied.with_label_values(&[reason]);
        }
        for source in CredentialSource::ALL {
            m.auth_accepted.with_label_values(&[source.as_str()]);
        }
        for result in CaResult::ALL {
            m.ca_requests.with_label_values(&[result.as_str()]);
        }
        m
    }

    /// The per-type series of `ty`.
    pub fn of(&self, ty: XdsType) -> &TypeMetrics {
        &self.per_type[ty.index()]
    }
}
