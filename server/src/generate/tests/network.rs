//! Multi-network load assignments, pinned against istiod's `EndpointsByNetworkFilter`
//! (`pilot/pkg/xds/endpoints/ep_filters.go`): own network as is, other networks through
//! their gateways weighted by endpoint count (scaled by the gateways' lcm), only for Istio
//! mTLS destinations; no gateway, no split; `REQUESTED_NETWORK_VIEW`.

use crate::index::network::MeshNetworks;
use crate::index::proxy::Proxy;
use crate::testutil::*;
use shoal_common::model::{EndpointSet, Service, NETWORK_LABEL};
use shoal_proto::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LbEndpoint};
use shoal_proto::pb::google::protobuf::value::Kind;
use shoal_proto::XdsType;
use std::sync::Arc;

const NAME: &str = "outbound|9080||reviews.default.svc.cluster.local";
const SIDECAR: &[(&str, &str)] = &[("security.istio.io/tlsMode", "istio")];

fn slice_in(cluster: &str, network: &str, name: &str, addresses: &[&str]) -> EndpointSet {
    EndpointSet {
        cluster: cluster.into(),
        network: network.into(),
        ..slice(
            "default",
            "reviews",
            name,
            &[("http", 8080)],
            addresses.iter().map(|a| endpoint(a, SIDECAR)).collect(),
        )
    }
}

fn east_west(cluster: &str, network: &str, addresses: &[&str]) -> Service {
    let mut svc = service("istio-system", "istio-eastwestgateway", &[("tls", 15443)]);
    svc.cluster = cluster.into();
    svc.meta.labels.insert(NETWORK_LABEL.into(), network.into());
    svc.external_addresses = addresses.iter().map(|a| a.to_string()).collect();
    svc
}

/// reviews: two endpoints in net1 (c1), three in net2 (c2); gateways 192.0.2.1 (net1) and
/// 192.0.2.2 (net2).
fn two_networks() -> Mesh {
    Mesh::new()
        .with_service(service("default", "reviews", &[("http", 9080)]))
        .with_slice(slice_in("c1", "net1", "a", &["10.1.0.1", "10.1.0.2"]))
        .with_slice(slice_in(
            "c2",
            "net2",
            "b",
            &["10.2.0.1", "10.2.0.2", "10.2.0.3"],
        ))
        .with_service(east_west("c1", "net1", &["192.0.2.1"]))
        .with_service(east_west("c2", "net2", &["192.0.2.2"]))
}

fn on(network: &str) -> Proxy {
    Proxy {
        network: network.into(),
        ..captured_proxy("default", "10.1.0.9", &[])
    }
}

fn cla(mesh: &Mesh, proxy: &Proxy) -> ClusterLoadAssignment {
    load_assignments(&gen(XdsType::Endpoint, proxy, &mesh.snapshot(), &[NAME]))
        .remove(NAME)
        .expect("assignment")
}

/// (address:port, weight, network metadata) of every endpoint.
fn endpoints(cla: &ClusterLoadAssignment) -> Vec<(String, u32, String)> {
    let addresses = cla_addresses(cla).concat();
    let eps: Vec<&LbEndpoint> = cla.endpoints.iter().flat_map(|l| &l.lb_endpoints).collect();
    addresses
        .into_iter()
        .zip(eps)
        .map(|(a, e)| {
            let network = e
                .metadata
                .as_ref()
                .and_then(|m| m.filter_metadata.get("istio"))
                .and_then(|s| s.fields.get("network"))
                .and_then(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            (
                a,
                e.load_balancing_weight.as_ref().map_or(0, |w| w.value),
                network,
            )
        })
        .collect()
}

fn ep(a: &str, w: u32, n: &str) -> (String, u32, String) {
    (a.to_string(), w, n.to_string())
}

#[test]
fn other_networks_are_reached_through_their_gateway_weighted_by_endpoints() {
    let mesh = two_networks();
    assert_eq!(
        endpoints(&cla(&mesh, &on("net1"))),
        [
            ep("10.1.0.1:8080", 1, "net1"),
            ep("10.1.0.2:8080", 1, "net1"),
            ep("192.0.2.2:15443", 3, "net2"),
        ]
    );
    assert_eq!(
        endpoints(&cla(&mesh, &on("net2"))),
        [
            ep("10.2.0.1:8080", 1, "net2"),
            ep("10.2.0.2:8080", 1, "net2"),
            ep("10.2.0.3:8080", 1, "net2"),
            ep("192.0.2.1:15443", 2, "net1"),
        ]
    );
    // The gateway endpoint takes Istio mTLS (the SNI routes it at the other side).
    let c = cla(&mesh, &on("net1"));
    let gw = c.endpoints[0].lb_endpoints.last().unwrap();
    let tls = gw.metadata.as_ref().unwrap();
    assert!(tls
        .filter_metadata
        .contains_key("envoy.transport_socket_match"));
}

#[test]
fn weights_split_evenly_among_a_networks_gateways() {
    // Two gateways for net2: weights are scaled by lcm(1, 2) = 2, each gateway takes half.
    let mesh = two_networks().with_service(east_west("c2", "net2", &["192.0.2.2", "192.0.2.3"]));
    assert_eq!(
        endpoints(&cla(&mesh, &on("net1"))),
        [
            ep("10.1.0.1:8080", 2, "net1"),
            ep("10.1.0.2:8080", 2, "net1"),
            ep("192.0.2.2:15443", 3, "net2"),
            ep("192.0.2.3:15443", 3, "net2"),
        ]
    );
}

#[test]
fn a_network_without_a_gateway_is_sent_as_it_is() {
    // net2 loses its gateway: its endpoints are assumed reachable (istiod keeps them).
    let mut mesh = two_networks();
    mesh.state
        .services
        .retain(|id, _| !(id.cluster == "c2" && id.name == "istio-eastwestgateway"));
    assert_eq!(
        cla_addresses(&cla(&mesh, &on("net1"))).concat(),
        [
            "10.1.0.1:8080",
            "10.1.0.2:8080",
            "10.2.0.1:8080",
            "10.2.0.2:8080",
            "10.2.0.3:8080"
        ]
    );
    // No gateway anywhere: no split at all, and no weights (the single-network bytes).
    let mut none = mesh.clone();
    none.state.services.retain(|id, _| id.name == "reviews");
    let c = cla(&none, &on("net1"));
    assert!(c.endpoints[0]
        .lb_endpoints
        .iter()
        .all(|e| e.load_balancing_weight.is_none()));
}

#[test]
fn without_istio_mtls_remote_endpoints_are_dropped() {
    let mesh = two_networks().with_config(peer_authentication(
        "default",
        "off",
        "mtls: {mode: DISABLE}",
    ));
    assert_eq!(
        cla_addresses(&cla(&mesh, &on("net1"))).concat(),
        ["10.1.0.1:8080", "10.1.0.2:8080"]
    );
    let plain = two_networks().with_config(destination_rule(
        "default",
        "reviews",
        "host: reviews\ntrafficPolicy: {tls: {mode: DISABLE}}",
    ));
    assert_eq!(
        cla_addresses(&cla(&plain, &on("net1"))).concat(),
        ["10.1.0.1:8080", "10.1.0.2:8080"]
    );
    // A remote endpoint without a sidecar cannot be reached through the gateway either.
    let mut no_sidecar = two_networks();
    let mut set = slice_in("c2", "net2", "b", &["10.2.0.1"]);
    set.endpoints[0].labels.clear();
    no_sidecar.add_slice(set);
    assert_eq!(
        cla_addresses(&cla(&no_sidecar, &on("net1"))).concat(),
        ["10.1.0.1:8080", "10.1.0.2:8080"]
    );
}

#[test]
fn a_proxy_without_a_network_goes_through_every_gateway() {
    // istiod's forceGateway: an unset proxy network sends labelled endpoints through
    // their network's gateway.
    assert_eq!(
        cla_addresses(&cla(&two_networks(), &on(""))).concat(),
        ["192.0.2.1:15443", "192.0.2.2:15443"]
    );
    // meshNetworks fromRegistry places the proxy's cluster.
    let mut mesh = two_networks();
    let mut settings = (*mesh.state.mesh).clone();
    settings.mesh_networks = serde_saphyr::from_str::<MeshNetworks>(
        "networks: {net1: {endpoints: [{fromRegistry: Kubernetes}]}}",
    )
    .unwrap();
    mesh.state.mesh = Arc::new(settings);
    assert_eq!(
        cla_addresses(&cla(&mesh, &on(""))).concat(),
        ["10.1.0.1:8080", "10.1.0.2:8080", "192.0.2.2:15443"]
    );
}

#[test]
fn pod_labels_and_mesh_networks_place_endpoints() {
    // A pod's own label wins over its cluster's network; meshNetworks places what no
    // label does.
    let mut mesh = two_networks();
    let mut set = slice_in("c3", "", "c", &["10.3.0.1", "10.3.0.2"]);
    set.endpoints[0]
        .labels
        .insert(NETWORK_LABEL.into(), "net1".into());
    mesh.add_slice(set);
    let mut settings = (*mesh.state.mesh).clone();
    settings.mesh_networks = serde_saphyr::from_str::<MeshNetworks>(
        "networks: {net2: {endpoints: [{fromCidr: 10.3.0.2/32}]}}",
    )
    .unwrap();
    mesh.state.mesh = Arc::new(settings);
    assert_eq!(
        endpoints(&cla(&mesh, &on("net1"))),
        [
            ep("10.1.0.1:8080", 1, "net1"),
            ep("10.1.0.2:8080", 1, "net1"),
            ep("10.3.0.1:8080", 1, "net1"),
            ep("192.0.2.2:15443", 4, "net2"),
        ]
    );
}

#[test]
fn requested_network_view_hides_other_networks() {
    let proxy = Proxy {
        requested_network_view: vec!["net1".into()],
        ..on("net1")
    };
    assert_eq!(
        cla_addresses(&cla(&two_networks(), &proxy)).concat(),
        ["10.1.0.1:8080", "10.1.0.2:8080"]
    );
}

// ---------------------------------------------------------------------------------------
// The east-west gateway: AUTO_PASSTHROUGH (istiod's sni-dnat listener chains and clusters)

const SNI: &str = "outbound_.9080_._.reviews.default.svc.cluster.local";
const SNI_V1: &str = "outbound_.9080_.v1_.reviews.default.svc.cluster.local";

fn east_west_mesh() -> Mesh {
    two_networks()
        .with_config(gateway(
            "istio-system",
            "cross-network-gateway",
            r#"
selector: {istio: eastwestgateway}
servers:
- port: {number: 15443, name: tls, protocol: TLS}
  tls: {mode: AUTO_PASSTHROUGH}
  hosts: ["*.local"]
"#,
        ))
        .with_config(destination_rule(
            "default",
            "reviews",
            "host: reviews\nsubsets: [{name: v1, labels: {version: v1}}]",
        ))
}

fn east_west_gateway(network: &str) -> Proxy {
    Proxy {
        network: network.into(),
        ..router_proxy("istio-system", &[("istio", "eastwestgateway")])
    }
}

#[test]
fn auto_passthrough_gets_istiods_sni_dnat_chains() {
    use shoal_proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        tcp_proxy::ClusterSpecifier, TcpProxy,
    };
    let mesh = east_west_mesh();
    let proxy = east_west_gateway("net2");
    let lds = listeners(&gen(XdsType::Listener, &proxy, &mesh.snapshot(), &[]));
    let l = lds.get("0.0.0.0_15443").expect("the 15443 listener");
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
    let mut snis = Vec::new();
    for chain in &l.filter_chains {
        let m = chain.filter_chain_match.as_ref().expect("a match");
        assert_eq!(
            m.application_protocols,
            [
                "istio",
                "istio-peer-exchange",
                "istio-http/1.0",
                "istio-http/1.1",
                "istio-h2"
            ]
        );
        assert!(chain.transport_socket.is_none(), "TLS passes through");
        // No RBAC on these chains, as istiod: the destination's sidecar enforces its own.
        assert_eq!(chain.filters.len(), 1);
        assert_eq!(chain.filters[0].name, "envoy.filters.network.tcp_proxy");
        let Some(shoal_proto::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(
            any,
        )) = &chain.filters[0].config_type
        else {
            panic!("typed config")
        };
        let tcp = <TcpProxy as prost::Message>::decode(&*any.value).unwrap();
        let [sni] = m.server_names.as_slice() else {
            panic!("one SNI per chain")
        };
        assert_eq!(tcp.stat_prefix, *sni);
        assert_eq!(
            tcp.cluster_specifier,
            Some(ClusterSpecifier::Cluster(sni.clone()))
        );
        snis.push(sni.clone());
    }
    assert!(snis.contains(&SNI.to_string()), "{snis:?}");
    assert!(snis.contains(&SNI_V1.to_string()), "{snis:?}");
    // The gateway's own Service is in the mesh too (istiod lists every in-mesh service).
    assert!(snis
        .iter()
        .all(|s| s.starts_with("outbound_.") && s.ends_with(".svc.cluster.local")));

    // Its clusters: EDS, named by the SNI, without TLS (the caller's mTLS passes through).
    let cds = clusters(&gen(XdsType::Cluster, &proxy, &mesh.snapshot(), &[]));
    for name in [SNI, SNI_V1] {
        let c = cds.get(name).unwrap_or_else(|| panic!("cluster {name}"));
        assert!(c.transport_socket.is_none() && c.transport_socket_matches.is_empty());
        assert!(c.eds_cluster_config.is_some());
    }
    // A sidecar gets none of them.
    let sidecar = clusters(&gen(XdsType::Cluster, &on("net1"), &mesh.snapshot(), &[]));
    assert!(!sidecar.contains_key(SNI));

    // Its endpoints: its own network's, as they are; net1's through net1's gateway.
    let eds = load_assignments(&gen(XdsType::Endpoint, &proxy, &mesh.snapshot(), &[SNI]));
    assert_eq!(
        cla_addresses(&eds[SNI]).concat(),
        [
            "10.2.0.1:8080",
            "10.2.0.2:8080",
            "10.2.0.3:8080",
            "192.0.2.1:15443"
        ]
    );
}

#[test]
fn a_gateway_without_auto_passthrough_gets_no_sni_dnat() {
    let mesh = two_networks();
    let proxy = east_west_gateway("net2");
    let cds = clusters(&gen(XdsType::Cluster, &proxy, &mesh.snapshot(), &[]));
    assert!(!cds.contains_key(SNI));
    let lds = listeners(&gen(XdsType::Listener, &proxy, &mesh.snapshot(), &[]));
    assert!(!lds.contains_key("0.0.0.0_15443"));
}

#[test]
fn endpoint_metadata_encodes_the_same_every_time() {
    // Two metadata namespaces (tlsMode and network) in a protobuf map: the bytes must not
    // depend on a hasher's order (replicas and the view cache compare them).
    let mesh = two_networks();
    let snap = mesh.snapshot();
    let first = gen(XdsType::Endpoint, &on("net1"), &snap, &[NAME]);
    for _ in 0..32 {
        let again = gen(XdsType::Endpoint, &on("net1"), &snap, &[NAME]);
        assert_eq!(again[0].any.value, first[0].any.value);
    }
}

#[test]
fn failover_priority_on_the_network_ranks_the_gateway_after_local_endpoints() {
    // failoverPriority [topology.istio.io/network]: the proxy's network first, the gateway
    // endpoint (other network) at the next priority.
    let mesh = two_networks().with_config(destination_rule(
        "default",
        "reviews",
        "host: reviews\ntrafficPolicy:\n  outlierDetection: {consecutive5xxErrors: 1}\n  loadBalancer:\n    localityLbSetting:\n      failoverPriority: [topology.istio.io/network]\n",
    ));
    let c = cla(&mesh, &on("net1"));
    let by_priority: Vec<(u32, Vec<String>)> = c
        .endpoints
        .iter()
        .map(|l| {
            let one = shoal_proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
                endpoints: vec![l.clone()],
                ..Default::default()
            };
            (l.priority, cla_addresses(&one).concat())
        })
        .collect();
    assert_eq!(
        by_priority,
        [
            (
                0,
                vec!["10.1.0.1:8080".to_string(), "10.1.0.2:8080".to_string()]
            ),
            (1, vec!["192.0.2.2:15443".to_string()]),
        ]
    );
    // A proxy without NETWORK metadata ranks by its cluster's network the same way.
    assert_eq!(cla(&mesh, &unlabelled_in("c1")), c);
}

/// A proxy without `NETWORK` metadata in c1, as a sidecar Istio did not inject.
fn unlabelled_in(cluster: &str) -> Proxy {
    Proxy {
        cluster_id: cluster.into(),
        ..on("")
    }
}

#[test]
fn a_proxy_without_network_metadata_takes_its_clusters_network() {
    // c1's system namespace is labelled net1 (its slices carry it): the proxy is split as
    // a net1 proxy — net1 endpoints direct, net2 through its gateway.
    let mesh = two_networks();
    assert_eq!(
        mesh.snapshot()
            .ctx
            .cluster_networks
            .get("c1")
            .map(String::as_str),
        Some("net1")
    );
    assert_eq!(
        endpoints(&cla(&mesh, &unlabelled_in("c1"))),
        [
            ep("10.1.0.1:8080", 1, "net1"),
            ep("10.1.0.2:8080", 1, "net1"),
            ep("192.0.2.2:15443", 3, "net2"),
        ]
    );
    // The same proxy in c2 is a net2 proxy.
    assert_eq!(
        cla_addresses(&cla(&mesh, &unlabelled_in("c2"))).concat(),
        [
            "10.2.0.1:8080",
            "10.2.0.2:8080",
            "10.2.0.3:8080",
            "192.0.2.1:15443"
        ]
    );
    // Metadata wins over the cluster's label.
    assert_eq!(
        cla_addresses(&cla(
            &mesh,
            &Proxy {
                network: "net2".into(),
                ..unlabelled_in("c1")
            }
        ))
        .concat(),
        [
            "10.2.0.1:8080",
            "10.2.0.2:8080",
            "10.2.0.3:8080",
            "192.0.2.1:15443"
        ]
    );
    // A cluster whose slices carry no network: no cluster network, every gateway.
    assert_eq!(
        cla_addresses(&cla(&mesh, &unlabelled_in("c9"))).concat(),
        ["192.0.2.1:15443", "192.0.2.2:15443"]
    );
}

#[test]
fn relabelling_a_clusters_network_moves_its_unlabelled_proxies() {
    // c1's system namespace moves to net2: the ingester republishes c1's slices with it.
    let mut mesh = two_networks();
    let before = mesh.snapshot();
    let epoch = before.endpoints.networks_epoch();
    mesh.add_slice(slice_in("c1", "net2", "a", &["10.1.0.1", "10.1.0.2"]));
    let after = mesh.snapshot();
    assert_ne!(
        after.endpoints.networks_epoch(),
        epoch,
        "the change is seen"
    );
    assert_eq!(
        after.ctx.cluster_networks.get("c1").map(String::as_str),
        Some("net2")
    );
    // Every endpoint is on the proxy's network now: all direct, no gateway.
    assert_eq!(
        cla_addresses(&cla(&mesh, &unlabelled_in("c1"))).concat(),
        [
            "10.1.0.1:8080",
            "10.1.0.2:8080",
            "10.2.0.1:8080",
            "10.2.0.2:8080",
            "10.2.0.3:8080"
        ]
    );
    // Republishing the same network changes nothing.
    let epoch = after.endpoints.networks_epoch();
    mesh.add_slice(slice_in("c1", "net2", "a", &["10.1.0.1"]));
    assert_eq!(mesh.snapshot().endpoints.networks_epoch(), epoch);
}

#[test]
fn a_workload_peer_authentication_disable_drops_its_remote_endpoints() {
    // net2's reviews: 10.2.0.1 is v1, 10.2.0.2 and 10.2.0.3 are v2; a PeerAuthentication
    // selecting v2 disables mTLS. istiod's mtlsChecker asks per endpoint: only v1 can be
    // reached through net2's gateway.
    let mut set = slice_in("c2", "net2", "b", &["10.2.0.1", "10.2.0.2", "10.2.0.3"]);
    for (i, ep) in set.endpoints.iter_mut().enumerate() {
        let version = if i == 0 { "v1" } else { "v2" };
        ep.labels.insert("version".into(), version.into());
    }
    let mesh = two_networks()
        .with_slice(set.clone())
        .with_config(peer_authentication(
            "default",
            "v2-plain",
            "selector: {matchLabels: {version: v2}}\nmtls: {mode: DISABLE}",
        ));
    assert_eq!(
        endpoints(&cla(&mesh, &on("net1"))),
        [
            ep("10.1.0.1:8080", 1, "net1"),
            ep("10.1.0.2:8080", 1, "net1"),
            ep("192.0.2.2:15443", 1, "net2"),
        ]
    );
    // The local network still gets every endpoint directly.
    assert_eq!(cla_addresses(&cla(&mesh, &on("net2"))).concat().len(), 4);
    // A port-level DISABLE on another port leaves the workload's 8080 in mTLS.
    let other_port = two_networks()
        .with_slice(set.clone())
        .with_config(peer_authentication(
            "default",
            "v2-plain",
            "selector: {matchLabels: {version: v2}}\nportLevelMtls: {9999: {mode: DISABLE}}",
        ));
    assert_eq!(
        endpoints(&cla(&other_port, &on("net1"))).last(),
        Some(&ep("192.0.2.2:15443", 3, "net2"))
    );
    // A port-level DISABLE on the endpoint's port drops the workloads it selects.
    let this_port = two_networks()
        .with_slice(set)
        .with_config(peer_authentication(
            "default",
            "v2-plain",
            "selector: {matchLabels: {version: v2}}\nportLevelMtls: {8080: {mode: DISABLE}}",
        ));
    assert_eq!(
        endpoints(&cla(&this_port, &on("net1"))).last(),
        Some(&ep("192.0.2.2:15443", 1, "net2"))
    );
    // A DestinationRule setting ISTIO_MUTUAL decides alone, as in istiod.
    let rule = mesh.with_config(destination_rule(
        "default",
        "reviews",
        "host: reviews\ntrafficPolicy: {tls: {mode: ISTIO_MUTUAL}}",
    ));
    assert_eq!(
        endpoints(&cla(&rule, &on("net1"))).last(),
        Some(&ep("192.0.2.2:15443", 3, "net2"))
    );
}
