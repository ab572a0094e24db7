//! A DestinationRule traffic policy applied to an outbound cluster, as istiod's
//! `applyTrafficPolicy` (`pilot/pkg/networking/core/cluster_traffic_policy.go`,
//! `cluster_tls.go`): connection pool (circuit breakers, timeouts, keepalive, HTTP
//! protocol options), outlier detection, load balancer, TLS origination.
//!
//! Every outbound cluster goes through here, with or without a policy: istiod's default
//! circuit breakers (all four thresholds at `u32::MAX`) apply to every one of them.

use super::mtls::{self, IstioMutual};
use super::{pb_duration, string_struct};
use crate::index::tls_mode;
use shoal_common::model::{
    ClientTlsMode, ClientTlsSettings, ConsistentHashLb, H2UpgradePolicy, OutlierDetection,
    Protocol, SimpleLb, TrafficPolicy,
};
use shoal_proto::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds,
    cluster::TransportSocketMatch,
    cluster::{
        common_lb_config::{LocalityConfigSpecifier, LocalityWeightedLbConfig},
        ClusterDiscoveryType, CommonLbConfig, DiscoveryType, LbConfig, LbPolicy, MaglevLbConfig,
        RingHashLbConfig,
    },
    CircuitBreakers, Cluster, OutlierDetection as PbOutlier, UpstreamConnectionOptions,
};
use shoal_proto::pb::envoy::config::core::v3::{
    data_source, transport_socket, DataSource, Http1ProtocolOptions, Http2ProtocolOptions,
    HttpProtocolOptions as CommonHttpOptions, TcpKeepalive, TransportSocket,
    UpstreamHttpProtocolOptions,
};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::ValidationContextType, tls_parameters::TlsProtocol,
    CertificateValidationContext, CommonTlsContext, TlsCertificate, TlsParameters,
    UpstreamTlsContext,
};
use shoal_proto::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{
        explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions,
        UseDownstreamHttpConfig,
    },
    HttpProtocolOptions,
};
use shoal_proto::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};
use shoal_proto::pb::envoy::r#type::v3::Percent;
use shoal_proto::pb::google::protobuf::{Struct, UInt32Value, UInt64Value};

/// The key of the upstream HTTP protocol options in `typed_extension_protocol_options`.
pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const HTTP_PROTOCOL_OPTIONS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// The CA bundle used for `tls.mode: SIMPLE` without `caCertificates` (istio-agent's
/// "system" roots; the path of Debian/Ubuntu's bundle, which Istio's proxy image uses).
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

fn u32v(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

/// A positive `int32` field as a `UInt32Value` (istiod ignores zero and negatives).
fn positive(v: Option<i32>) -> Option<u32> {
    v.filter(|v| *v > 0).map(|v| v as u32)
}

/// istiod's `getDefaultCircuitBreakerThresholds`: no limit on connections, pending
/// requests, requests or retries (Envoy's own defaults, 1024 and 3 retries, cause 503s under
/// load). `track_remaining` stays off (`DISABLE_TRACK_REMAINING_CB_METRICS` defaults to
/// true).
pub fn default_thresholds() -> Thresholds {
    Thresholds {
        max_connections: u32v(u32::MAX),
        max_pending_requests: u32v(u32::MAX),
        max_requests: u32v(u32::MAX),
        max_retries: u32v(u32::MAX),
        track_remaining: false,
        ..Default::default()
    }
}

/// Istio's default circuit breakers.
pub fn default_circuit_breakers() -> CircuitBreakers {
    CircuitBreakers {
        thresholds: vec![default_thresholds()],
        ..Default::default()
    }
}

/// HTTP/2 upstream.
pub fn set_h2(opts: &mut HttpProtocolOptions) {
    if opts.upstream_protocol_options.is_none() {
        opts.upstream_protocol_options = Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                    Http2ProtocolOptions::default(),
                )),
            },
        ));
    }
}

/// istiod's `passthroughHttpProtocolOptions` (Passthrough and InboundPassthrough clusters):
/// the upstream speaks what the downstream spoke (so h2c and gRPC to a host outside the
/// registry stay HTTP/2), and idle pooled connections close after 5 minutes.
pub fn passthrough_http_options() -> HttpProtocolOptions {
    HttpProtocolOptions {
        common_http_protocol_options: Some(CommonHttpOptions {
            idle_timeout: Some(pb_duration(std::time::Duration::from_secs(300))),
            ..Default::default()
        }),
        upstream_protocol_options: Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            UseDownstreamHttpConfig {
                http_protocol_options: Some(Http1ProtocolOptions::default()),
                http2_protocol_options: Some(Http2ProtocolOptions::default()),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// Stores the upstream HTTP protocol options on the cluster (one map entry only: prost
/// encodes maps in hash order). Envoy requires `upstream_protocol_options`: options that
/// set only common fields (a connection pool's `maxRequestsPerConnection`, idle timeout)
/// get explicit HTTP/1.1, as istiod's `clusterWrapper.build` does.
pub fn store_http_options(c: &mut Cluster, opts: Option<HttpProtocolOptions>) {
    if let Some(mut opts) = opts {
        if opts.upstream_protocol_options.is_none() {
            opts.upstream_protocol_options = Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                        Http1ProtocolOptions::default(),
                    )),
                },
            ));
        }
        set_http_protocol_options(c, &opts);
    }
}

/// Sets a cluster's upstream HTTP protocol options (its only typed extension protocol
/// options entry: prost encodes maps in hash order, so one entry keeps the bytes stable).
pub fn set_http_protocol_options(c: &mut Cluster, opts: &HttpProtocolOptions) {
    c.typed_extension_protocol_options.insert(
        HTTP_PROTOCOL_OPTIONS.to_string(),
        shoal_proto::pack(HTTP_PROTOCOL_OPTIONS_TYPE, opts),
    );
}

fn h2_options(opts: &mut HttpProtocolOptions) -> Option<&mut Http2ProtocolOptions> {
    match &mut opts.upstream_protocol_options {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(h2)),
        })) => Some(h2),
        _ => None,
    }
}

/// istiod's `shouldH2Upgrade`: an explicit `h2UpgradePolicy` decides (`useClientProtocol`
/// wins over it); the mesh default is not to upgrade.
fn should_h2_upgrade(policy: Option<&TrafficPolicy>) -> bool {
    let http = policy
        .and_then(|p| p.connection_pool.as_ref())
        .and_then(|p| p.http.as_ref());
    match http {
        Some(h) if h.use_client_protocol == Some(true) => false,
        Some(h) => h.h2_upgrade_policy == Some(H2UpgradePolicy::Upgrade),
        None => false,
    }
}

fn is_original_dst(c: &Cluster) -> bool {
    c.cluster_discovery_type
        == Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        ))
}

/// Applies a policy (or none) to an outbound cluster whose discovery type, load assignment
/// and HTTP/2-ness (for HTTP/2 and gRPC ports) are already set. `istio_mutual` is the Istio
/// mutual TLS the cluster originates (the rule's `ISTIO_MUTUAL`, or auto mTLS), if any.
pub fn apply(
    c: &mut Cluster,
    protocol: Protocol,
    policy: Option<&TrafficPolicy>,
    istio_mutual: Option<&IstioMutual>,
) {
    let mut opts: Option<HttpProtocolOptions> = None;
    if matches!(protocol, Protocol::Http2 | Protocol::Grpc) {
        set_h2(opts.get_or_insert_with(Default::default));
    }
    if should_h2_upgrade(policy) {
        set_h2(opts.get_or_insert_with(Default::default));
    }
    connection_pool(c, &mut opts, policy);
    if let Some(od) = policy.and_then(|p| p.outlier_detection.as_ref()) {
        outlier_detection(c, od);
    }
    load_balancer(c, policy);
    let h2 = opts.as_mut().and_then(h2_options).is_some();
    if let Some(m) = istio_mutual {
        istio_mutual_tls(c, m, h2);
    } else if let Some(tls) = policy.and_then(|p| p.tls.as_ref()) {
        tls_origination(c, &mut opts, tls, h2);
    }
    if is_original_dst(c) {
        c.lb_policy = LbPolicy::ClusterProvided as i32;
    }
    store_http_options(c, opts);
}

/// istiod's `applyConnectionPool`.
fn connection_pool(
    c: &mut Cluster,
    opts: &mut Option<HttpProtocolOptions>,
    policy: Option<&TrafficPolicy>,
) {
    let pool = policy.and_then(|p| p.connection_pool.as_ref());
    let http = pool.and_then(|p| p.http.as_ref());
    let tcp = pool.and_then(|p| p.tcp.as_ref());
    let mut t = default_thresholds();
    let mut idle_timeout = None;
    let mut max_requests_per_connection = None;
    let mut max_concurrent_streams = None;
    let mut max_connection_duration = None;
    if let Some(h) = http {
        if let Some(v) = positive(h.http2_max_requests) {
            t.max_requests = u32v(v);
        }
        if let Some(v) = positive(h.http1_max_pending_requests) {
            t.max_pending_requests = u32v(v);
        }
        if let Some(v) = positive(h.max_retries) {
            t.max_retries = u32v(v);
        }
        idle_timeout = h.idle_timeout;
        max_requests_per_connection = positive(h.max_requests_per_connection);
        max_concurrent_streams = positive(h.max_concurrent_streams);
    }
    if let Some(tcp) = tcp {
        if let Some(ct) = tcp.connect_timeout {
            c.connect_timeout = Some(pb_duration(ct.get()));
        }
        if let Some(v) = positive(tcp.max_connections) {
            t.max_connections = u32v(v);
        }
        max_connection_duration = tcp.max_connection_duration;
        if idle_timeout.is_none() {
            idle_timeout = tcp.idle_timeout;
        }
        if let Some(ka) = &tcp.tcp_keepalive {
            // An empty keepalive sets SO_KEEPALIVE with the OS defaults.
            let secs = |d: shoal_common::model::Duration| u32v(d.get().as_secs() as u32);
            c.upstream_connection_options = Some(UpstreamConnectionOptions {
                tcp_keepalive: Some(TcpKeepalive {
                    keepalive_probes: ka.probes.filter(|p| *p > 0).and_then(u32v),
                    keepalive_time: ka.time.and_then(secs),
                    keepalive_interval: ka.interval.and_then(secs),
                }),
                ..Default::default()
            });
        }
    }
    c.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![t],
        ..Default::default()
    });
    if idle_timeout.is_some()
        || max_requests_per_connection.is_some()
        || max_concurrent_streams.is_some()
        || max_connection_duration.is_some()
    {
        let o = opts.get_or_insert_with(Default::default);
        let common = o
            .common_http_protocol_options
            .get_or_insert_with(CommonHttpOptions::default);
        if let Some(d) = idle_timeout {
            common.idle_timeout = Some(pb_duration(d.get()));
        }
        if let Some(n) = max_requests_per_connection {
            common.max_requests_per_connection = u32v(n);
        }
        if let Some(d) = max_connection_duration {
            common.max_connection_duration = Some(pb_duration(d.get()));
        }
        if let (Some(h2), Some(n)) = (h2_options(o), max_concurrent_streams) {
            h2.max_concurrent_streams = u32v(n);
        }
    }
    if http.is_some_and(|h| h.use_client_protocol == Some(true)) {
        let o = opts.get_or_insert_with(Default::default);
        o.upstream_protocol_options = Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            UseDownstreamHttpConfig {
                http_protocol_options: Some(Http1ProtocolOptions::default()),
                http2_protocol_options: Some(Http2ProtocolOptions::default()),
                ..Default::default()
            },
        ));
    }
}

/// istiod's `applyOutlierDetection`: success-rate ejection off; each consecutive-error
/// detector enforced at 100 % when set above zero; the panic threshold is
/// `minHealthPercent` (0 when unset: ejection goes on however few hosts are left).
fn outlier_detection(c: &mut Cluster, od: &OutlierDetection) {
    let enforce = |v: u32| u32v(if v > 0 { 100 } else { 0 });
    let mut out = PbOutlier {
        enforcing_success_rate: u32v(0),
        ..Default::default()
    };
    if let Some(v) = od.consecutive_5xx_errors {
        out.consecutive_5xx = u32v(v);
        out.enforcing_consecutive_5xx = enforce(v);
    }
    if let Some(v) = od.consecutive_gateway_errors {
        out.consecutive_gateway_failure = u32v(v);
        out.enforcing_consecutive_gateway_failure = enforce(v);
    }
    if let Some(d) = od.interval {
        out.interval = Some(pb_duration(d.get()));
    }
    if let Some(d) = od.base_ejection_time {
        out.base_ejection_time = Some(pb_duration(d.get()));
    }
    if let Some(v) = positive(od.max_ejection_percent) {
        out.max_ejection_percent = u32v(v);
    }
    if od.split_external_local_origin_errors == Some(true) {
        out.split_external_local_origin_errors = true;
        if let Some(v) = od.consecutive_local_origin_failures.filter(|v| *v > 0) {
            out.consecutive_local_origin_failure = u32v(v);
            out.enforcing_consecutive_local_origin_failure = u32v(100);
        }
        out.enforcing_local_origin_success_rate = u32v(0);
    }
    c.outlier_detection = Some(out);
    let min_health = od.min_health_percent.unwrap_or(0);
    if min_health >= 0 {
        c.common_lb_config
            .get_or_insert_with(CommonLbConfig::default)
            .healthy_panic_threshold = Some(Percent {
            value: f64::from(min_health),
        });
    }
}

/// istiod's `applyLoadBalancer`. Locality settings reach the cluster only as
/// `locality_weighted_lb_config`; their priorities and weights are per proxy, in EDS.
fn load_balancer(c: &mut Cluster, policy: Option<&TrafficPolicy>) {
    if super::locality::weighted_localities(policy) {
        c.common_lb_config
            .get_or_insert_with(CommonLbConfig::default)
            .locality_config_specifier = Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(
            LocalityWeightedLbConfig::default(),
        ));
    }
    if is_original_dst(c) {
        return;
    }
    let lb = policy.and_then(|p| p.load_balancer.as_ref());
    c.lb_policy = match lb.and_then(|l| l.simple) {
        Some(SimpleLb::Random) => LbPolicy::Random,
        Some(SimpleLb::RoundRobin) => LbPolicy::RoundRobin,
        Some(SimpleLb::Passthrough) => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            ));
            c.load_assignment = None;
            c.eds_cluster_config = None;
            LbPolicy::ClusterProvided
        }
        // LEAST_CONN is the deprecated alias; unset is istiod's default, least request.
        _ => LbPolicy::LeastRequest,
    } as i32;
    if let Some(ch) = lb.and_then(|l| l.consistent_hash.as_ref()) {
        consistent_hash(c, ch);
    }
}

/// istiod's `ApplyRingHashLoadBalancer`.
fn consistent_hash(c: &mut Cluster, ch: &ConsistentHashLb) {
    let u64v = |value| Some(UInt64Value { value });
    if let Some(m) = &ch.maglev {
        c.lb_policy = LbPolicy::Maglev as i32;
        if let Some(size) = m.table_size.filter(|s| *s > 0) {
            c.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig {
                table_size: u64v(size),
            }));
        }
    } else if let Some(r) = &ch.ring_hash {
        c.lb_policy = LbPolicy::RingHash as i32;
        if let Some(size) = r.minimum_ring_size.filter(|s| *s > 0) {
            c.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
                minimum_ring_size: u64v(size),
                ..Default::default()
            }));
        }
    } else {
        c.lb_policy = LbPolicy::RingHash as i32;
        c.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
            minimum_ring_size: u64v(ch.minimum_ring_size.filter(|s| *s > 0).unwrap_or(1024)),
            ..Default::default()
        }));
    }
}

/// Istio mutual TLS (istiod's `ISTIO_MUTUAL` branch of `buildUpstreamClusterTLSContext`).
/// Auto-detected mTLS becomes istiod's `transport_socket_matches`: mTLS to endpoints
/// labelled `tlsMode: istio` (a sidecar), plaintext to the others — except on
/// `ORIGINAL_DST` clusters, which have no endpoint metadata to match on (there auto mTLS is
/// decided from all the endpoints at once, see `cds::keys`).
fn istio_mutual_tls(c: &mut Cluster, m: &IstioMutual, h2: bool) {
    let socket = mtls::upstream_socket(&mtls::upstream_istio_mutual(&m.sni, &m.sans, h2));
    if m.auto_detected && !is_original_dst(c) {
        c.transport_socket_matches = vec![
            TransportSocketMatch {
                name: format!("tlsMode-{}", tls_mode::TLS_MODE_ISTIO),
                r#match: Some(string_struct(mtls::TLS_MODE_KEY, tls_mode::TLS_MODE_ISTIO)),
                transport_socket: Some(socket),
            },
            TransportSocketMatch {
                name: "tlsMode-disabled".into(),
                r#match: Some(Struct::default()),
                transport_socket: Some(mtls::raw_buffer_socket()),
            },
        ];
    } else {
        c.transport_socket = Some(socket);
    }
}

/// TLS origination, `DISABLE`, `SIMPLE` and `MUTUAL` (istiod's `constructUpstreamTLS`).
/// istiod hands the certificate files to istio-agent's SDS; shoal has Envoy read them
/// directly, with the same verification. Without `sni` the request's host is sent
/// (`auto_sni`), and without `subjectAltNames` the certificate is checked against it
/// (`auto_san_validation`).
fn tls_origination(
    c: &mut Cluster,
    opts: &mut Option<HttpProtocolOptions>,
    tls: &ClientTlsSettings,
    h2: bool,
) {
    if !matches!(tls.mode, ClientTlsMode::Simple | ClientTlsMode::Mutual) {
        // DISABLE: plaintext. ISTIO_MUTUAL comes through `istio_mutual_tls`.
        return;
    }
    let file = |path: &str| DataSource {
        specifier: Some(data_source::Specifier::Filename(path.to_string())),
        ..Default::default()
    };
    let client_certificate = match (&tls.client_certificate, &tls.private_key) {
        (Some(cert), Some(key)) if tls.mode == ClientTlsMode::Mutual => vec![TlsCertificate {
            certificate_chain: Some(file(cert)),
            private_key: Some(file(key)),
            ..Default::default()
        }],
        // MUTUAL without both files is refused at ingest (as istiod's validation).
        _ => Vec::new(),
    };
    let insecure = tls.insecure_skip_verify == Some(true);
    let sni = tls.sni.clone().unwrap_or_default();
    let validation = if insecure {
        CertificateValidationContext::default()
    } else {
        #[allow(deprecated)]
        CertificateValidationContext {
            trusted_ca: Some(DataSource {
                specifier: Some(data_source::Specifier::Filename(
                    tls.ca_certificates
                        .clone()
                        .filter(|c| !c.is_empty())
                        .unwrap_or_else(|| SYSTEM_CA_BUNDLE.to_string()),
                )),
                ..Default::default()
            }),
            match_subject_alt_names: tls
                .subject_alt_names
                .iter()
                .map(|san| StringMatcher {
                    match_pattern: Some(MatchPattern::Exact(san.clone())),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    };
    let ctx = UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(TlsParameters {
                tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
                tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
                ..Default::default()
            }),
            tls_certificates: client_certificate,
            validation_context_type: Some(ValidationContextType::ValidationContext(validation)),
            alpn_protocols: if h2 { vec!["h2".into()] } else { Vec::new() },
            ..Default::default()
        }),
        sni: sni.clone(),
        ..Default::default()
    };
    c.transport_socket = Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(
            shoal_proto::pack(
                "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                &ctx,
            ),
        )),
    });
    let auto_sni = sni.is_empty();
    let auto_san = auto_sni && tls.subject_alt_names.is_empty() && !insecure;
    if auto_sni || auto_san {
        let o = opts.get_or_insert_with(Default::default);
        let u = o
            .upstream_http_protocol_options
            .get_or_insert_with(UpstreamHttpProtocolOptions::default);
        u.auto_sni |= auto_sni;
        u.auto_san_validation |= auto_san;
    }
}

/// The route's hash policy for a consistent hash (istiod's `ConsistentHashToHashPolicy`).
pub fn hash_policy(
    ch: &ConsistentHashLb,
) -> shoal_proto::pb::envoy::config::route::v3::route_action::HashPolicy {
    use shoal_proto::pb::envoy::config::route::v3::route_action::hash_policy::{
        ConnectionProperties, Cookie, Header, PolicySpecifier, QueryParameter,
    };
    use shoal_proto::pb::envoy::config::route::v3::route_action::HashPolicy;
    let specifier = if let Some(name) = &ch.http_header_name {
        PolicySpecifier::Header(Header {
            header_name: name.clone(),
            ..Default::default()
        })
    } else if let Some(c) = &ch.http_cookie {
        PolicySpecifier::Cookie(Cookie {
            name: c.name.clone(),
            ttl: c.ttl.map(|t| pb_duration(t.get())),
            path: c.path.clone().unwrap_or_default(),
            ..Default::default()
        })
    } else if let Some(name) = &ch.http_query_parameter_name {
        PolicySpecifier::QueryParameter(QueryParameter { name: name.clone() })
    } else {
        PolicySpecifier::ConnectionProperties(ConnectionProperties {
            source_ip: ch.use_source_ip.unwrap_or_default(),
        })
    };
    HashPolicy {
        policy_specifier: Some(specifier),
        ..Default::default()
    }
}
