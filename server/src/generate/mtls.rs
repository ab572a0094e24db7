//! Istio mutual TLS, as istiod writes it: the workload certificate (`default`) and the mesh
//! roots (`ROOTCA`) come over SDS from istio-agent on the `sds-grpc` cluster of the
//! bootstrap (`pkg/model/authentication.go`); the client side verifies the server's SPIFFE
//! identity against the destination's service accounts (`cluster_tls.go`), the server side
//! requires a client certificate of the mesh's trust domain (`authn/utils`).
//!
//! Every TLS context that uses the workload identity is built here.

use super::pb_duration;
use shoal_proto::pb::envoy::config::core::v3::{
    api_config_source::ApiType, config_source::ConfigSourceSpecifier, grpc_service,
    transport_socket, ApiConfigSource, ApiVersion, ConfigSource, GrpcService, TransportSocket,
};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol,
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    TlsParameters, UpstreamTlsContext,
};
use shoal_proto::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};
use shoal_proto::pb::google::protobuf::BoolValue;

/// The bootstrap cluster istio-agent serves SDS on.
pub const SDS_CLUSTER: &str = "sds-grpc";
/// The SDS name of the workload's certificate and key.
pub const SDS_DEFAULT: &str = "default";
/// The SDS name of the mesh's root certificates.
pub const SDS_ROOT: &str = "ROOTCA";

/// The endpoint metadata namespace `transport_socket_matches` read.
pub const TRANSPORT_SOCKET_MATCH: &str = "envoy.transport_socket_match";
/// The key in that namespace (`tlsMode`).
pub const TLS_MODE_KEY: &str = "tlsMode";

/// ALPN an in-mesh client offers on an HTTP/1 or TCP cluster (istiod's
/// `ALPNInMeshWithMxc`: metadata exchange is on by default).
pub const ALPN_IN_MESH: [&str; 2] = ["istio-peer-exchange", "istio"];
/// ALPN an in-mesh client offers on an HTTP/2 cluster (`ALPNInMeshH2WithMxc`).
pub const ALPN_IN_MESH_H2: [&str; 3] = ["istio-peer-exchange", "istio", "h2"];
/// ALPN an inbound mTLS chain serving HTTP offers (`ALPNHttp`).
const ALPN_INBOUND_HTTP: [&str; 2] = ["h2", "http/1.1"];
/// ALPN an inbound mTLS chain serving TCP offers (`ALPNDownstreamWithMxc`).
const ALPN_INBOUND_TCP: [&str; 3] = ["istio-peer-exchange", "h2", "http/1.1"];
/// The ALPN values a client connecting over Istio mTLS may offer (`allIstioMtlsALPNs`).
pub const ALL_ISTIO_MTLS_ALPNS: [&str; 5] = [
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];
/// The ALPN values of HTTP over Istio mTLS (`mtlsHTTPALPNs`).
pub const MTLS_HTTP_ALPNS: [&str; 3] = ["istio-http/1.0", "istio-http/1.1", "istio-h2"];
/// The ALPN values of TCP over Istio mTLS (`mtlsTCPWithMxcALPNs`).
pub const MTLS_TCP_ALPNS: [&str; 2] = ["istio-peer-exchange", "istio"];

/// The cipher suites an inbound mTLS chain accepts (istiod's `SupportedCiphers`).
const INBOUND_CIPHERS: [&str; 6] = [
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
];

const UPSTREAM_TLS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";
const DOWNSTREAM_TLS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";

/// Istio mutual TLS originated by an outbound cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IstioMutual {
    /// SNI: the rule's `sni`, else `outbound_.<port>_.<subset>_.<host>`.
    pub sni: String,
    /// SPIFFE identities the server may present (the rule's `subjectAltNames`, else the
    /// destination's service accounts), sorted.
    pub sans: Vec<String>,
    /// Auto mTLS (no TLS in the rule): only to endpoints with a sidecar.
    pub auto_detected: bool,
}

/// istiod's SNI for Istio mutual TLS to a cluster: `outbound_.<port>_.<subset>_.<host>`.
pub fn outbound_sni(port: u32, subset: &str, host: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{host}")
}

/// A secret from istio-agent's SDS server, referenced exactly as istiod references it: gRPC
/// to `sds-grpc`, node sent on the first message only, v3, and no initial fetch timeout
/// (the listener or cluster waits for its certificate rather than starting without it).
pub fn sds_secret(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: ApiType::Grpc as i32,
                    set_node_on_first_message_only: true,
                    transport_api_version: ApiVersion::V3 as i32,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: SDS_CLUSTER.into(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            resource_api_version: ApiVersion::V3 as i32,
            initial_fetch_timeout: Some(pb_duration(std::time::Duration::ZERO)),
            ..Default::default()
        }),
    }
}

/// The workload certificate plus the combined validation context: the `ROOTCA` roots and
/// the given SAN matchers (istiod's `CombinedValidationContext`).
fn workload_identity(ctx: &mut CommonTlsContext, san_matchers: Vec<StringMatcher>) {
    ctx.tls_certificate_sds_secret_configs = vec![sds_secret(SDS_DEFAULT)];
    ctx.validation_context_type = Some(ValidationContextType::CombinedValidationContext(
        CombinedCertificateValidationContext {
            #[allow(deprecated)] // istiod still sets `match_subject_alt_names`
            default_validation_context: Some(CertificateValidationContext {
                match_subject_alt_names: san_matchers,
                ..Default::default()
            }),
            validation_context_sds_secret_config: Some(sds_secret(SDS_ROOT)),
            ..Default::default()
        },
    ));
}

/// Exact-match SAN matchers (istiod's `StringToExactMatch`).
pub fn exact_sans(sans: &[String]) -> Vec<StringMatcher> {
    sans.iter()
        .map(|s| StringMatcher {
            match_pattern: Some(MatchPattern::Exact(s.clone())),
            ..Default::default()
        })
        .collect()
}

/// The SPIFFE identity of a service account.
pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

/// istiod's ISTIO_MUTUAL client context: TLS 1.2–1.3, the workload certificate, the
/// server checked against `sans` (the destination's identities) and the mesh roots, the
/// in-mesh ALPN.
pub fn upstream_istio_mutual(sni: &str, sans: &[String], h2: bool) -> UpstreamTlsContext {
    let mut common = CommonTlsContext {
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        alpn_protocols: if h2 {
            ALPN_IN_MESH_H2.iter().map(|s| s.to_string()).collect()
        } else {
            ALPN_IN_MESH.iter().map(|s| s.to_string()).collect()
        },
        ..Default::default()
    };
    workload_identity(&mut common, exact_sans(sans));
    UpstreamTlsContext {
        common_tls_context: Some(common),
        sni: sni.to_string(),
        ..Default::default()
    }
}

/// What an inbound mTLS chain serves: its ALPN differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboundProtocol {
    /// An HTTP connection manager.
    Http,
    /// A TCP proxy.
    Tcp,
}

/// istiod's inbound mTLS context (`BuildInboundTLS`): a client certificate is required and
/// must chain to the mesh roots with a SPIFFE identity of the trust domain.
pub fn inbound_mtls(trust_domain: &str, protocol: InboundProtocol) -> DownstreamTlsContext {
    let alpn: &[&str] = match protocol {
        InboundProtocol::Http => &ALPN_INBOUND_HTTP,
        InboundProtocol::Tcp => &ALPN_INBOUND_TCP,
    };
    let mut common = CommonTlsContext {
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            cipher_suites: INBOUND_CIPHERS.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
        alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    workload_identity(
        &mut common,
        vec![StringMatcher {
            match_pattern: Some(MatchPattern::Prefix(format!("spiffe://{trust_domain}/"))),
            ..Default::default()
        }],
    );
    DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    }
}

/// A client TLS transport socket.
pub fn upstream_socket(ctx: &UpstreamTlsContext) -> TransportSocket {
    tls_socket(shoal_proto::pack(UPSTREAM_TLS_TYPE, ctx))
}

/// A server TLS transport socket.
pub fn downstream_socket(ctx: &DownstreamTlsContext) -> TransportSocket {
    tls_socket(shoal_proto::pack(DOWNSTREAM_TLS_TYPE, ctx))
}

fn tls_socket(any: shoal_proto::Any) -> TransportSocket {
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any)),
    }
}

/// Envoy's plaintext transport socket (istiod's `RawBufferTransportSocket`).
pub fn raw_buffer_socket() -> TransportSocket {
    TransportSocket {
        name: "envoy.transport_sockets.raw_buffer".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(
            shoal_proto::Any {
                type_url:
                    "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"
                        .into(),
                value: Vec::new(),
            },
        )),
    }
}
