//! Prometheus metrics of the server. Names are `shoal_*`; docs/metrics.md maps each to
//! the Istio `pilot_*` metric it corresponds to.

use prometheus::{
    histogram_opts, opts, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Registry,
};

/// The server's metrics, registered in their own registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
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
    /// Bus entries applied, by bucket and result (`applied`, `unchanged`, `invalid`, `fenced`,
    /// `epoch_jump`).
    pub bus_entries: IntCounterVec,
    /// PushContext builds.
    pub push_context_builds: IntCounter,
    /// PushContext build time.
    pub push_context_build_seconds: Histogram,
    /// Time from the ingester observing a change to the server pushing it, by xDS type.
    pub convergence_seconds: HistogramVec,
    /// Time a debounce window stayed open.
    pub debounce_seconds: Histogram,
    /// 1 once the initial state is loaded.
    pub ready: IntGauge,
    /// Generator cache hits.
    pub cache_hits: IntCounter,
    /// Generator cache misses (resources built).
    pub cache_misses: IntCounter,
    /// Generator cache entries (set on scrape).
    pub cache_entries: IntGauge,
    /// Generator cache weighted size in bytes (set on scrape).
    pub cache_bytes: IntGauge,
    /// Ended xDS streams, by reason.
    pub streams_closed: IntCounterVec,
    /// Views with connected proxies (set on scrape).
    pub views: IntGauge,
    /// 1 while the state bus (NATS) is connected, 0 while unreachable (degraded: serving
    /// the last state).
    pub bus_connected: IntGauge,
    /// Bucket watches re-created (after a broken watch or a NATS reconnection), by bucket.
    pub bus_watch_restarts: IntCounterVec,
    /// Expected fleets (`--expect-fleets`) not synced yet.
    pub fleets_waiting: IntGauge,
    /// 1 when the server became ready at `--sync-timeout` without every expected fleet.
    pub sync_timed_out: IntGauge,
    /// Streams on the secure port refused, by reason (see [`crate::security::auth::AuthError::reason`]).
    pub auth_refused: IntCounterVec,
    /// Streams on the secure port authenticated, by credential (`certificate`, `token`).
    pub auth_accepted: IntCounterVec,
    /// Gateway credentials (SDS names) refused to a proxy, by reason (see
    /// [`crate::generate::sds::Denial::reason`]).
    pub sds_denied: IntCounterVec,
    /// Reloads of the xDS serving certificate, by result (`ok`, `error`).
    pub tls_reloads: IntCounterVec,
    /// Clusters whose token issuer keys are loaded.
    pub token_issuers: IntGauge,
    /// Token issuer records refused, by reason (see [`crate::security::auth::IssuerRefusal::reason`]).
    pub token_issuers_refused: IntCounterVec,
    /// Certificate requests (`CreateCertificate`), by result.
    pub ca_requests: IntCounterVec,
    /// Loads of the workload CA's files, by result (`ok`, `error`).
    pub ca_reloads: IntCounterVec,
    /// When the workload CA's root certificate expires, Unix seconds.
    pub ca_root_expiry: IntGauge,
    /// When the workload CA's signing certificate expires, Unix seconds.
    pub ca_chain_expiry: IntGauge,
    /// When the secure port's serving certificate issued from the workload CA expires,
    /// Unix seconds.
    pub xds_serving_cert_expiry: IntGauge,
    /// Renewals of that certificate, by reason (`expiring`, `ca_changed`) and result.
    pub xds_serving_cert_renewals: IntCounterVec,
    /// Callers that hit a bound, by reason (see [`crate::xds::limits::Breach`]).
    pub limits_exceeded: IntCounterVec,
    /// Open xDS connections (both ports, proxies or not).
    pub open_connections: IntGauge,
    /// Bytes of xDS request messages being received (not yet complete).
    pub request_buffer_bytes: IntGauge,
}

/// Why an xDS stream ended (the `reason` label of `shoal_xds_streams_closed_total`).
pub const CLOSE_REASONS: [&str; 6] = [
    // The proxy ended its request stream (Envoy restarting, reconnecting).
    "proxy_closed",
    // The request stream failed (transport error, reset).
    "stream_error",
    // A request was refused (invalid node, bad request): the stream ends with an error.
    "refused",
    // A response could not be written: the proxy is gone.
    "send_failed",
    // The server closed it: connection aged out (--max-connection-age) or draining.
    "server_closed",
    // The stream task ended abnormally (a panic).
    "aborted",
];

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let m = Metrics {
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
            bus_entries: IntCounterVec::new(
                opts!(
                    "shoal_bus_entries_total",
                    "Bus entries received, by bucket and result."
                ),
                &["bucket", "result"],
            )
            .expect("valid metric"),
            push_context_builds: IntCounter::new(
                "shoal_push_context_builds_total",
                "PushContext rebuilds.",
            )
            .expect("valid metric"),
            push_context_build_seconds: Histogram::with_opts(histogram_opts!(
                "shoal_push_context_build_seconds",
                "Time to build a PushContext.",
                prometheus::exponential_buckets(0.0001, 4.0, 10).expect("valid buckets")
            ))
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
            debounce_seconds: Histogram::with_opts(histogram_opts!(
                "shoal_debounce_seconds",
                "How long debounce windows stayed open.",
                prometheus::exponential_buckets(0.01, 2.0, 12).expect("valid buckets")
            ))
            .expect("valid metric"),
            ready: IntGauge::new("shoal_ready", "1 once the initial state is loaded.")
                .expect("valid metric"),
            cache_hits: IntCounter::new("shoal_cache_hits_total", "Generator cache hits.")
                .expect("valid metric"),
            cache_misses: IntCounter::new(
                "shoal_cache_misses_total",
                "Generator cache misses (resources built).",
            )
            .expect("valid metric"),
            cache_entries: IntGauge::new("shoal_cache_entries", "Generator cache entries.")
                .expect("valid metric"),
            cache_bytes: IntGauge::new(
                "shoal_cache_bytes",
                "Generator cache size in bytes (resources plus per-entry overhead).",
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
            bus_connected: IntGauge::new(
                "shoal_bus_connected",
                "1 while the state bus (NATS) is connected; 0 while unreachable (degraded: \
                 serving the last state).",
            )
            .expect("valid metric"),
            bus_watch_restarts: IntCounterVec::new(
                opts!(
                    "shoal_bus_watch_restarts_total",
                    "Bucket watches re-created after a broken watch or a NATS reconnection \
                     (each replays the bucket), by bucket."
                ),
                &["bucket"],
            )
            .expect("valid metric"),
            fleets_waiting: IntGauge::new(
                "shoal_fleets_waiting",
                "Expected ingester fleets (--expect-fleets) whose sync marker is not on the \
                 bus yet; the server is not ready while this is above 0.",
            )
            .expect("valid metric"),
            sync_timed_out: IntGauge::new(
                "shoal_sync_timed_out",
                "1 when the server became ready at --sync-timeout without every expected \
                 fleet synced.",
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
            sds_denied: IntCounterVec::new(
                opts!(
                    "shoal_sds_denied_total",
                    "Gateway credentials (SDS resource names) a proxy asked for and may not \
                     have, by reason."
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
            tls_reloads: IntCounterVec::new(
                opts!(
                    "shoal_xds_tls_reloads_total",
                    "Loads of the xDS serving certificate and client CA, by result (ok, error)."
                ),
                &["result"],
            )
            .expect("valid metric"),
            ca_requests: IntCounterVec::new(
                opts!(
                    "shoal_ca_requests_total",
                    "Workload certificate requests, by result: issued, unauthenticated, \
                     impersonation, bad_request, bad_csr, bad_ttl, signing_error."
                ),
                &["result"],
            )
            .expect("valid metric"),
            ca_reloads: IntCounterVec::new(
                opts!(
                    "shoal_ca_reloads_total",
                    "Loads of the workload CA's files (--ca-dir), by result (ok, error)."
                ),
                &["result"],
            )
            .expect("valid metric"),
            ca_root_expiry: IntGauge::new(
                "shoal_ca_root_cert_expiry_timestamp",
                "When the workload CA's root certificate (root-cert.pem) expires, Unix seconds \
                 (Citadel's citadel_server_root_cert_expiry_timestamp).",
            )
            .expect("valid metric"),
            ca_chain_expiry: IntGauge::new(
                "shoal_ca_cert_chain_expiry_timestamp",
                "When the workload CA's signing certificate (ca-cert.pem) expires, Unix \
                 seconds: no certificate is issued after it (Citadel's \
                 citadel_server_cert_chain_expiry_timestamp).",
            )
            .expect("valid metric"),
            xds_serving_cert_expiry: IntGauge::new(
                "shoal_xds_serving_cert_expiry_timestamp",
                "When the TLS xDS port's serving certificate issued from the workload CA \
                 (--xds-dns-names) expires, Unix seconds; 0 when the certificate comes from \
                 --xds-tls-cert.",
            )
            .expect("valid metric"),
            xds_serving_cert_renewals: IntCounterVec::new(
                opts!(
                    "shoal_xds_serving_cert_renewals_total",
                    "Renewals of the TLS xDS port's serving certificate issued from the \
                     workload CA, by reason (expiring: half its lifetime passed; ca_changed: \
                     the CA in --ca-dir changed) and result (ok, error)."
                ),
                &["reason", "result"],
            )
            .expect("valid metric"),
            token_issuers: IntGauge::new(
                "shoal_token_issuers",
                "Clusters whose service-account token issuer keys are loaded.",
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
            token_issuers_refused: IntCounterVec::new(
                opts!(
                    "shoal_token_issuers_refused_total",
                    "Token issuer records refused, by reason (fenced: not written under its \
                     fleet's current lease epoch; unleased: its fleet has no lease; invalid: \
                     unusable keys)."
                ),
                &["reason"],
            )
            .expect("valid metric"),
            registry,
        };
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(m.connections.clone()),
            Box::new(m.pushes.clone()),
            Box::new(m.push_bytes.clone()),
            Box::new(m.pushes_unchanged.clone()),
            Box::new(m.resources_sent.clone()),
            Box::new(m.resources_resumed.clone()),
            Box::new(m.nacks.clone()),
            Box::new(m.bus_entries.clone()),
            Box::new(m.push_context_builds.clone()),
            Box::new(m.push_context_build_seconds.clone()),
            Box::new(m.convergence_seconds.clone()),
            Box::new(m.debounce_seconds.clone()),
            Box::new(m.ready.clone()),
            Box::new(m.cache_hits.clone()),
            Box::new(m.cache_misses.clone()),
            Box::new(m.cache_entries.clone()),
            Box::new(m.cache_bytes.clone()),
            Box::new(m.streams_closed.clone()),
            Box::new(m.views.clone()),
            Box::new(m.bus_connected.clone()),
            Box::new(m.bus_watch_restarts.clone()),
            Box::new(m.fleets_waiting.clone()),
            Box::new(m.sync_timed_out.clone()),
            Box::new(m.auth_refused.clone()),
            Box::new(m.auth_accepted.clone()),
            Box::new(m.sds_denied.clone()),
            Box::new(m.tls_reloads.clone()),
            Box::new(m.token_issuers.clone()),
            Box::new(m.token_issuers_refused.clone()),
            Box::new(m.ca_requests.clone()),
            Box::new(m.ca_reloads.clone()),
            Box::new(m.ca_root_expiry.clone()),
            Box::new(m.ca_chain_expiry.clone()),
            Box::new(m.xds_serving_cert_expiry.clone()),
            Box::new(m.xds_serving_cert_renewals.clone()),
            Box::new(m.limits_exceeded.clone()),
            Box::new(m.open_connections.clone()),
            Box::new(m.request_buffer_bytes.clone()),
        ];
        shoal_common::metrics::register_all(&m.registry, collectors);
        // Create the series of every known label value, so each documented metric shows
        // (at 0) from the first scrape: dashboards and alerts need no "absent" special case.
        for ty in ["cds", "eds", "lds", "rds", "sds"] {
            for v in [
                &m.pushes,
                &m.push_bytes,
                &m.pushes_unchanged,
                &m.resources_sent,
                &m.resources_resumed,
                &m.nacks,
            ] {
                v.with_label_values(&[ty]);
            }
            m.convergence_seconds.with_label_values(&[ty]);
        }
        for kind in ["sidecar", "router"] {
            m.connections.with_label_values(&[kind]);
        }
        for reason in CLOSE_REASONS {
            m.streams_closed.with_label_values(&[reason]);
        }
        for breach in crate::xds::limits::Breach::ALL {
            m.limits_exceeded.with_label_values(&[breach.label()]);
        }
        for reason in crate::security::auth::REFUSAL_REASONS {
            m.auth_refused.with_label_values(&[reason]);
        }
        for reason in crate::generate::sds::DENIAL_REASONS {
            m.sds_denied.with_label_values(&[reason]);
        }
        for reason in crate::security::auth::ISSUER_REFUSAL_REASONS {
            m.token_issuers_refused.with_label_values(&[reason]);
        }
        for source in ["certificate", "token"] {
            m.auth_accepted.with_label_values(&[source]);
        }
        for result in [
            "issued",
            "unauthenticated",
            "impersonation",
            "bad_request",
            "bad_csr",
            "bad_ttl",
            "signing_error",
        ] {
            m.ca_requests.with_label_values(&[result]);
        }
        for result in ["ok", "error"] {
            m.ca_reloads.with_label_values(&[result]);
            m.tls_reloads.with_label_values(&[result]);
            for reason in ["expiring", "ca_changed"] {
                m.xds_serving_cert_renewals
                    .with_label_values(&[reason, result]);
            }
        }
        for bucket in ["shoal-config", "shoal-services", "shoal-endpoints"] {
            for result in ["applied", "unchanged", "invalid"] {
                m.bus_entries.with_label_values(&[bucket, result]);
            }
        }
        for bucket in shoal_common::bus::Bucket::ALL {
            m.bus_watch_restarts.with_label_values(&[bucket.name()]);
        }
        // Connected until the bus says otherwise (an in-process bus always is).
        m.bus_connected.set(1);
        m
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        shoal_common::metrics::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
