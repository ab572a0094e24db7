//! HBONE origination for sidecars and gateways: what istiod builds when sending HBONE is
//! on (`PILOT_ENABLE_SENDING_HBONE`, set by the ambient profile), so that a sidecar reaches
//! a pod captured by ztunnel with its own SPIFFE identity.
//!
//! The path of one connection to an ambient endpoint:
//! 1. the outbound cluster's load assignment names the endpoint by an internal address
//!    (`connect_originate`, endpoint id `<podIP>:<targetPort>`) with endpoint metadata
//!    `envoy.filters.listener.original_dst: {local: "<podIP>:<targetPort>"}` and
//!    `envoy.transport_socket_match: {tunnel: http}`;
//! 2. the cluster's `hbone` transport socket match (first) hands the connection to the
//!    internal listener through `internal_upstream`, passing that endpoint metadata along;
//! 3. the internal listener `connect_originate` restores the destination from it
//!    (`original_dst` listener filter) and its `tcp_proxy` tunnels the bytes in an HTTP/2
//!    CONNECT whose authority is that destination (`%DOWNSTREAM_LOCAL_ADDRESS%`);
//! 4. the `connect_originate` cluster (`ORIGINAL_DST`, port overridden to 15008) opens
//!    mutual TLS 1.3 with the proxy's own certificate (SDS `default`) to `<podIP>:15008`,
//!    where ztunnel terminates it.
//!
//! As in istiod, the server certificate is checked against the mesh roots only
//! (`connect_originate` carries no SAN matcher for sidecars and gateways); ztunnel checks
//! the caller's identity against its L4 policies.
//!
//! Internal listeners need Envoy's `envoy.bootstrap.internal_listener` bootstrap
//! extension, which istio-proxy's bootstrap always loads and an upstream Envoy's bootstrap
//! may not: without it Envoy rejects the listener. So only istio-proxy (node metadata
//! `ISTIO_VERSION`) and an upstream Envoy whose node metadata says it loads the extension
//! (`SHOAL_INTERNAL_LISTENER: "true"`, [`Proxy::internal_listener`]) get any of this;
//! every other proxy is served as before (plain TCP to ambient pods, see docs/ambient.md).

use super::mtls;
use super::traffic_policy::default_circuit_breakers;
use super::{pb_duration, string_struct, Resource};
use crate::index::proxy::{Proxy, ProxyKind};
use shoal_proto::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, LbConfig, LbPolicy, OriginalDstLbConfig,
    TransportSocketMatch,
};
use shoal_proto::pb::envoy::config::cluster::v3::Cluster;
use shoal_proto::pb::envoy::config::core::v3::{
    address, envoy_internal_address::AddressNameSpecifier, transport_socket, Address,
    EnvoyInternalAddress, Http2ProtocolOptions, TransportSocket,
};
use shoal_proto::pb::envoy::config::listener::v3::{
    filter,
    listener::{InternalListenerConfig, ListenerSpecifier},
    Filter, FilterChain, Listener,
};
use shoal_proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::{ClusterSpecifier, TunnelingConfig},
    TcpProxy,
};
use shoal_proto::pb::envoy::extensions::transport_sockets::internal_upstream::v3::{
    internal_upstream_transport::MetadataValueSource, InternalUpstreamTransport,
};
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    tls_parameters::TlsProtocol, TlsParameters,
};
use shoal_proto::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{
        explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions,
    },
    HttpProtocolOptions,
};
use shoal_proto::pb::envoy::r#type::metadata::v3::{metadata_kind, MetadataKind};
use shoal_proto::pb::google::protobuf::{BoolValue, Struct, UInt32Value};
use shoal_proto::XdsType;
use std::time::Duration;

/// Name of the internal listener and of the cluster that originate HBONE (istiod's).
pub const CONNECT_ORIGINATE: &str = "connect_originate";
/// The port ztunnel (and a sidecar's HBONE listener) terminates HBONE on.
pub const HBONE_PORT: u32 = 15008;
/// The endpoint metadata namespace the internal listener's `original_dst` filter reads.
pub const ORIGINAL_DST_METADATA: &str = "envoy.filters.listener.original_dst";
/// The transport socket match key of a tunnelled endpoint (istiod's `tunnel: http`).
pub const TUNNEL_KEY: &str = "tunnel";
/// The only tunnel protocol: HTTP CONNECT.
pub const TUNNEL_HTTP: &str = "http";

/// istiod's connect timeout for the tunnel (the mesh default).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// istiod's idle timeout of an HBONE connection (`hboneIdleTimeout`'s default).
const HBONE_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Whether the proxy is sent HBONE to ambient endpoints: a sidecar or a gateway whose
/// bootstrap loads the internal listener extension (istio-proxy, or an upstream Envoy that
/// says so; see the module docs).
pub fn sends_hbone(proxy: &Proxy) -> bool {
    matches!(proxy.kind, ProxyKind::Sidecar | ProxyKind::Router) && proxy.internal_listener
}

/// `<host>:<port>`, the host bracketed when it is IPv6 (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: u32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The address of a tunnelled endpoint: the `connect_originate` internal listener, the
/// endpoint id `<ip>:<port>` keeping endpoints apart.
pub fn internal_address(target: &str) -> Address {
    Address {
        address: Some(address::Address::EnvoyInternalAddress(
            EnvoyInternalAddress {
                address_name_specifier: Some(AddressNameSpecifier::ServerListenerName(
                    CONNECT_ORIGINATE.into(),
                )),
                endpoint_id: target.to_string(),
            },
        )),
    }
}

/// The endpoint metadata of a tunnelled endpoint, as `(namespace, struct)` entries: the
/// destination behind the tunnel, and the transport socket match that selects `hbone`.
pub fn endpoint_metadata(target: &str) -> Vec<(String, Struct)> {
    vec![
        (ORIGINAL_DST_METADATA.into(), string_struct("local", target)),
        (
            mtls::TRANSPORT_SOCKET_MATCH.into(),
            string_struct(TUNNEL_KEY, TUNNEL_HTTP),
        ),
    ]
}

/// istiod's `hbone` transport socket match: endpoints marked `tunnel: http` go to the
/// internal listener, their `original_dst` metadata passed along.
pub fn transport_socket_match() -> TransportSocketMatch {
    let host = || MetadataKind {
        kind: Some(metadata_kind::Kind::Host(metadata_kind::Host {})),
    };
    let upstream = InternalUpstreamTransport {
        passthrough_metadata: vec![MetadataValueSource {
            kind: Some(host()),
            name: ORIGINAL_DST_METADATA.into(),
        }],
        transport_socket: Some(mtls::raw_buffer_socket()),
    };
    TransportSocketMatch {
        name: "hbone".into(),
        r#match: Some(string_struct(TUNNEL_KEY, TUNNEL_HTTP)),
        transport_socket: Some(TransportSocket {
            name: "envoy.transport_sockets.internal_upstream".into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(shoal_proto::pack(
                "type.googleapis.com/envoy.extensions.transport_sockets.internal_upstream.v3.InternalUpstreamTransport",
                &upstream,
            ))),
        }),
    }
}

/// Puts the `hbone` match first on an EDS cluster of a proxy that sends HBONE; what the
/// cluster sent before (its matches, else its one transport socket, else plaintext) stays
/// for every other endpoint.
pub fn add_transport_socket_match(c: &mut Cluster) {
    let mut matches = vec![transport_socket_match()];
    if c.transport_socket_matches.is_empty() {
        matches.push(TransportSocketMatch {
            name: "default".into(),
            r#match: Some(Struct::default()),
            transport_socket: Some(
                c.transport_socket
                    .take()
                    .unwrap_or_else(mtls::raw_buffer_socket),
            ),
        });
    } else {
        matches.append(&mut c.transport_socket_matches);
    }
    c.transport_socket_matches = matches;
}

/// The `connect_originate` cluster: `ORIGINAL_DST` to port 15008, HTTP/2 with CONNECT,
/// mutual TLS 1.3 with the workload certificate and the mesh roots, ALPN `h2`.
pub fn cluster() -> Resource {
    let mut tls = mtls::upstream_istio_mutual("", &[], true);
    if let Some(common) = tls.common_tls_context.as_mut() {
        common.alpn_protocols = vec!["h2".into()];
        common.tls_params = Some(TlsParameters {
            tls_minimum_protocol_version: TlsProtocol::TlSv13 as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            ..Default::default()
        });
    }
    let opts = HttpProtocolOptions {
        common_http_protocol_options: Some(
            shoal_proto::pb::envoy::config::core::v3::HttpProtocolOptions {
                idle_timeout: Some(pb_duration(HBONE_IDLE_TIMEOUT)),
                ..Default::default()
            },
        ),
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions {
                    allow_connect: true,
                    ..Default::default()
                })),
            },
        )),
        ..Default::default()
    };
    let mut c = Cluster {
        name: CONNECT_ORIGINATE.into(),
        connect_timeout: Some(pb_duration(CONNECT_TIMEOUT)),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: LbPolicy::ClusterProvided as i32,
        lb_config: Some(LbConfig::OriginalDstLbConfig(OriginalDstLbConfig {
            upstream_port_override: Some(UInt32Value { value: HBONE_PORT }),
            ..Default::default()
        })),
        cleanup_interval: Some(pb_duration(Duration::from_secs(60))),
        circuit_breakers: Some(default_circuit_breakers()),
        transport_socket: Some(mtls::upstream_socket(&tls)),
        ..Default::default()
    };
    super::traffic_policy::set_http_protocol_options(&mut c, &opts);
    Resource::new(XdsType::Cluster, CONNECT_ORIGINATE.into(), &c)
}

/// The `connect_originate` internal listener: the destination restored from the endpoint
/// metadata, the bytes tunnelled in a CONNECT to it over the `connect_originate` cluster.
pub fn listener() -> Resource {
    let proxy = TcpProxy {
        stat_prefix: CONNECT_ORIGINATE.into(),
        cluster_specifier: Some(ClusterSpecifier::Cluster(CONNECT_ORIGINATE.into())),
        tunneling_config: Some(TunnelingConfig {
            hostname: "%DOWNSTREAM_LOCAL_ADDRESS%".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let l = Listener {
        name: CONNECT_ORIGINATE.into(),
        use_original_dst: Some(BoolValue { value: false }),
        listener_specifier: Some(ListenerSpecifier::InternalListener(
            InternalListenerConfig::default(),
        )),
        listener_filters: vec![super::lds::listener_filter(
            ORIGINAL_DST_METADATA,
            "type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
            Vec::new(),
            None,
        )],
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.tcp_proxy".into(),
                config_type: Some(filter::ConfigType::TypedConfig(shoal_proto::pack(
                    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    &proxy,
                ))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    Resource::new(XdsType::Listener, CONNECT_ORIGINATE.into(), &l)
}
