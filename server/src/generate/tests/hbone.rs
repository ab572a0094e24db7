//! HBONE origination (istiod with `PILOT_ENABLE_SENDING_HBONE`): istio-proxy sidecars and
//! gateways reach ambient pods through `connect_originate`; an upstream Envoy, whose
//! bootstrap may lack the internal listener extension, gets none of it.

use crate::generate::hbone::{CONNECT_ORIGINATE, HBONE_PORT, ORIGINAL_DST_METADATA};
use crate::generate::mtls::TRANSPORT_SOCKET_MATCH;
use crate::index::proxy::{IstioVersion, Proxy};
use crate::testutil::*;
use prost::Message;
use shoal_common::model::Endpoint;
use shoal_proto::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, LbConfig,
};
use shoal_proto::pb::envoy::config::core::v3::{address, Address};
use shoal_proto::pb::envoy::config::endpoint::v3::{lb_endpoint::HostIdentifier, LbEndpoint};
use shoal_proto::pb::envoy::config::listener::v3::{filter, listener::ListenerSpecifier};
use shoal_proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use shoal_proto::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use shoal_proto::pb::google::protobuf::value;
use shoal_proto::XdsType;

const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";

fn mesh() -> Mesh {
    let mut reviews = service("default", "reviews", &[("http", 9080)]);
    reviews.cluster_ips = vec!["10.96.0.10".into()];
    Mesh::new().with_service(reviews).with_slice(slice(
        "default",
        "reviews",
        "reviews-abc",
        &[("http", 8080)],
        vec![
            // Captured by ztunnel (istio-cni's annotation).
            Endpoint {
                ambient: true,
                ..endpoint("10.0.0.1", &[("app", "reviews")])
            },
            // Outside the mesh.
            endpoint("10.0.0.2", &[("app", "reviews")]),
            // A sidecar pod: Istio mTLS, never a tunnel.
            endpoint(
                "10.0.0.3",
                &[("app", "reviews"), ("security.istio.io/tlsMode", "istio")],
            ),
        ],
    ))
}

fn istio_proxy(mut p: Proxy) -> Proxy {
    p.istio_version = Some(IstioVersion::parse("1.26.0"));
    p.internal_listener = true;
    p
}

fn upstream_with_internal_listener(mut p: Proxy) -> Proxy {
    p.internal_listener = true;
    p
}

fn endpoints(p: &Proxy) -> Vec<LbEndpoint> {
    let mut cla = load_assignments(&gen(XdsType::Endpoint, p, &mesh().snapshot(), &[REVIEWS]));
    let cla = cla.remove(REVIEWS).expect("assignment");
    cla.endpoints
        .into_iter()
        .flat_map(|l| l.lb_endpoints)
        .collect()
}

fn address_of(e: &LbEndpoint) -> &Address {
    match &e.host_identifier {
        Some(HostIdentifier::Endpoint(ep)) => ep.address.as_ref().expect("address"),
        other => panic!("unexpected host identifier {other:?}"),
    }
}

fn string_field(e: &LbEndpoint, ns: &str, key: &str) -> Option<String> {
    let s = e.metadata.as_ref()?.filter_metadata.get(ns)?;
    match &s.fields.get(key)?.kind {
        Some(value::Kind::StringValue(v)) => Some(v.clone()),
        _ => None,
    }
}

#[test]
fn istio_proxy_tunnels_to_ambient_endpoints_only() {
    for p in [
        istio_proxy(captured_proxy(
            "default",
            "10.1.0.7",
            &[("app", "productpage")],
        )),
        istio_proxy(router_proxy("istio-system", &[("istio", "ingressgateway")])),
        // An upstream Envoy whose bootstrap loads the extension
        // (`SHOAL_INTERNAL_LISTENER: "true"`): the same, without istio-proxy's telemetry.
        upstream_with_internal_listener(captured_proxy(
            "default",
            "10.1.0.7",
            &[("app", "productpage")],
        )),
    ] {
        let eps = endpoints(&p);
        assert_eq!(eps.len(), 3, "{eps:?}");
        // The ambient pod: the internal listener, the pod's target port as its id and
        // as the tunnel's destination.
        match &address_of(&eps[0]).address {
            Some(address::Address::EnvoyInternalAddress(a)) => {
                assert_eq!(a.endpoint_id, "10.0.0.1:8080");
                assert_eq!(
                    format!("{:?}", a.address_name_specifier),
                    format!("Some(ServerListenerName({CONNECT_ORIGINATE:?}))")
                );
            }
            other => panic!("ambient endpoint not tunnelled: {other:?}"),
        }
        assert_eq!(
            string_field(&eps[0], ORIGINAL_DST_METADATA, "local").as_deref(),
            Some("10.0.0.1:8080")
        );
        assert_eq!(
            string_field(&eps[0], TRANSPORT_SOCKET_MATCH, "tunnel").as_deref(),
            Some("http")
        );
        // The others as before.
        assert_eq!(socket(address_of(&eps[1])), "10.0.0.2:8080");
        assert_eq!(socket(address_of(&eps[2])), "10.0.0.3:8080");
        assert_eq!(
            string_field(&eps[2], TRANSPORT_SOCKET_MATCH, "tlsMode").as_deref(),
            Some("istio")
        );
        assert_eq!(
            string_field(&eps[2], TRANSPORT_SOCKET_MATCH, "tunnel"),
            None
        );

        let cds = clusters(&gen(XdsType::Cluster, &p, &mesh().snapshot(), &[]));
        // The service cluster: `hbone` first, then what it had (auto mTLS here).
        let names: Vec<&str> = cds[REVIEWS]
            .transport_socket_matches
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(names, ["hbone", "tlsMode-istio", "tlsMode-disabled"]);
        // connect_originate: ORIGINAL_DST to 15008, TLS 1.3 with the workload
        // certificate and h2.
        let co = &cds[CONNECT_ORIGINATE];
        assert_eq!(
            co.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32
            ))
        );
        match &co.lb_config {
            Some(LbConfig::OriginalDstLbConfig(o)) => {
                assert_eq!(o.upstream_port_override.map(|v| v.value), Some(HBONE_PORT));
            }
            other => panic!("unexpected lb config {other:?}"),
        }
        let tls = match co
            .transport_socket
            .as_ref()
            .and_then(|t| t.config_type.as_ref())
        {
            Some(
                shoal_proto::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(
                    any,
                ),
            ) => UpstreamTlsContext::decode(&*any.value).expect("tls context"),
            other => panic!("no TLS on connect_originate: {other:?}"),
        };
        let common = tls.common_tls_context.expect("common");
        assert_eq!(common.alpn_protocols, ["h2"]);
        assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");

        let lds = listeners(&gen(XdsType::Listener, &p, &mesh().snapshot(), &[]));
        let l = &lds[CONNECT_ORIGINATE];
        assert!(matches!(
            l.listener_specifier,
            Some(ListenerSpecifier::InternalListener(_))
        ));
        assert_eq!(l.filter_chains[0].filters.len(), 1);
        let tcp = match &l.filter_chains[0].filters[0].config_type {
            Some(filter::ConfigType::TypedConfig(any)) => {
                TcpProxy::decode(&*any.value).expect("tcp proxy")
            }
            other => panic!("unexpected filter {other:?}"),
        };
        assert_eq!(
            tcp.tunneling_config.expect("tunneling").hostname,
            "%DOWNSTREAM_LOCAL_ADDRESS%"
        );
    }
}

#[test]
fn upstream_envoy_and_proxyless_get_no_tunnel() {
    for p in [
        captured_proxy("default", "10.1.0.7", &[("app", "productpage")]),
        istio_proxy(proxyless_proxy("default", &[])),
    ] {
        let eps = endpoints(&p);
        assert_eq!(socket(address_of(&eps[0])), "10.0.0.1:8080");
        assert_eq!(
            string_field(&eps[0], TRANSPORT_SOCKET_MATCH, "tunnel"),
            None
        );
        if p.kind == crate::index::proxy::ProxyKind::Proxyless {
            // Its clusters and listeners are gRPC's own (`generate::grpc`).
            continue;
        }
        let cds = clusters(&gen(XdsType::Cluster, &p, &mesh().snapshot(), &[]));
        assert!(!cds.contains_key(CONNECT_ORIGINATE));
        assert!(cds[REVIEWS]
            .transport_socket_matches
            .iter()
            .all(|m| m.name != "hbone"));
        let lds = listeners(&gen(XdsType::Listener, &p, &mesh().snapshot(), &[]));
        assert!(!lds.contains_key(CONNECT_ORIGINATE));
    }
}
