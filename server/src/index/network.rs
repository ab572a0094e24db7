//! Multi-network meshes, as istiod models them (`pilot/pkg/model/network.go`, the kube
//! registry's `network.go`): which network each endpoint and proxy is on, and the east-west
//! gateways through which other networks reach a network's endpoints.
//!
//! - An endpoint's network: its pod's (or WorkloadEntry's) `topology.istio.io/network`
//!   label, else its cluster's (the label on the cluster's system namespace, published by
//!   the ingester with every endpoint set), else the `meshNetworks` network whose
//!   `fromRegistry` names its cluster or whose `fromCidr` holds its address.
//! - A proxy's network: node metadata `NETWORK` (istio-agent's `ISTIO_META_NETWORK`, which
//!   Istio's injector sets from the same labels), else its cluster's (the system namespace
//!   label its endpoint slices carry: `PushContext::cluster_networks`), else the
//!   `meshNetworks` network whose `fromRegistry` names its cluster.
//! - Network gateways: Services labelled `topology.istio.io/network` that listen on the
//!   gateway port (label `networking.istio.io/gatewayPort`, default 15443), one gateway
//!   per external address (load balancer ingress, external IPs); and `meshNetworks`
//!   gateways, by address or by `registryServiceName` (that Service's external addresses
//!   in the clusters `fromRegistry` names). Addresses that are not IPs are dropped, as
//!   istiod does without `RESOLVE_HOSTNAME_GATEWAYS`.

use serde::Deserialize;
use shoal_common::model::{Service, NETWORK_LABEL};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The label that moves a gateway Service's mTLS port off 15443.
pub const GATEWAY_PORT_LABEL: &str = "networking.istio.io/gatewayPort";
/// The port east-west gateways accept Istio mTLS on (istiod's `DefaultNetworkGatewayPort`).
pub const DEFAULT_GATEWAY_PORT: u16 = 15443;

/// MeshConfig `meshNetworks` (Istio's `MeshNetworks`): networks by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(default)]
pub struct MeshNetworks {
    /// The networks by name.
    pub networks: BTreeMap<String, MeshNetwork>,
}

/// One `meshNetworks` network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(default)]
pub struct MeshNetwork {
    /// What is on this network.
    pub endpoints: Vec<NetworkEndpoints>,
    /// How other networks reach it.
    pub gateways: Vec<MeshGateway>,
}

/// A `meshNetworks` endpoints entry: a whole cluster, or an address range.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NetworkEndpoints {
    /// Every endpoint of this cluster (registry) is on the network.
    pub from_registry: Option<String>,
    /// Endpoints whose address is in this CIDR are on the network.
    pub from_cidr: Option<String>,
}

/// A `meshNetworks` gateway: an address, or a Service of the network's registries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MeshGateway {
    /// The gateway's address.
    pub address: Option<String>,
    /// The gateway Service's hostname, in the clusters `fromRegistry` names.
    pub registry_service_name: Option<String>,
    /// The gateway's mTLS port.
    pub port: u32,
}

impl MeshNetworks {
    /// The network `fromRegistry` assigns to `cluster` (the first, as istiod warns).
    pub fn of_cluster(&self, cluster: &str) -> Option<&str> {
        self.networks
            .iter()
            .find(|(_, n)| {
                n.endpoints
                    .iter()
                    .any(|e| e.from_registry.as_deref() == Some(cluster))
            })
            .map(|(name, _)| name.as_str())
    }

    /// The network whose `fromCidr` holds `address`.
    pub fn of_address(&self, address: &str) -> Option<&str> {
        let ip: IpAddr = address.parse().ok()?;
        self.networks
            .iter()
            .find(|(_, n)| {
                n.endpoints
                    .iter()
                    .filter_map(|e| e.from_cidr.as_deref())
                    .any(|cidr| cidr_contains(cidr, ip))
            })
            .map(|(name, _)| name.as_str())
    }
}

/// Whether `cidr` (`a.b.c.d/n` or IPv6) holds `ip`; a malformed CIDR holds nothing.
fn cidr_contains(cidr: &str, ip: IpAddr) -> bool {
    let Some((net, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(len)) = (net.parse::<IpAddr>(), len.parse::<u32>()) else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// One east-west gateway of a network. Ordered by address and port first, as istiod's
/// `SortGateways` orders the gateway endpoints it sends.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkGateway {
    /// The address other networks reach it on.
    pub address: String,
    /// Its Istio mTLS port (15443 unless relabelled).
    pub port: u32,
    /// The network it leads into.
    pub network: String,
    /// The cluster its Service is in (empty for `meshNetworks` addresses).
    pub cluster: String,
}

/// Every network gateway of the mesh, indexed as istiod's `NetworkGateways`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NetworkGateways {
    by_network: BTreeMap<String, Vec<NetworkGateway>>,
    by_network_cluster: BTreeMap<(String, String), Vec<NetworkGateway>>,
    /// The least common multiple of the gateway counts per network and per
    /// (network, cluster): endpoint weights are scaled by it so that splitting one among
    /// a network's gateways stays whole (istiod's `GetLBWeightScaleFactor`).
    scale: u32,
}

impl NetworkGateways {
    /// The gateways of the services (every cluster's) and of `meshNetworks`.
    pub fn build<'a>(
        services: impl IntoIterator<Item = &'a Service>,
        mesh: &MeshNetworks,
    ) -> NetworkGateways {
        let mut all: BTreeSet<NetworkGateway> = BTreeSet::new();
        for (network, conf) in &mesh.networks {
            for gw in &conf.gateways {
                if let Some(address) = gw.address.as_deref().filter(|a| !a.is_empty()) {
                    all.insert(NetworkGateway {
                        address: address.to_string(),
                        port: gw.port,
                        network: network.clone(),
                        cluster: String::new(),
                    });
                }
            }
        }
        for svc in services {
            all.extend(service_gateways(svc, mesh));
        }
        let all: Vec<NetworkGateway> = all
            .into_iter()
            .filter(|g| {
                let ip = g.address.parse::<IpAddr>().is_ok();
                if !ip {
                    tracing::debug!(address = %g.address, network = %g.network,
                        "ignoring a network gateway whose address is not an IP");
                }
                ip && g.port > 0
            })
            .collect();
        let mut out = NetworkGateways::default();
        for gw in all {
            out.by_network
                .entry(gw.network.clone())
                .or_default()
                .push(gw.clone());
            out.by_network_cluster
                .entry((gw.network.clone(), gw.cluster.clone()))
                .or_default()
                .push(gw);
        }
        out.scale = out
            .by_network
            .values()
            .chain(out.by_network_cluster.values())
            .map(|g| u32::try_from(g.len()).unwrap_or(1))
            .fold(1, lcm);
        out
    }

    /// Whether any network has a gateway (istiod's `IsMultiNetworkEnabled`): without one,
    /// every endpoint is sent as it is.
    pub fn is_empty(&self) -> bool {
        self.by_network.is_empty()
    }

    /// The gateways that lead to `network`'s endpoints of `cluster`: those of the network
    /// in that cluster, else all of the network's (istiod's `selectNetworkGateways`).
    pub fn select(&self, network: &str, cluster: &str) -> &[NetworkGateway] {
        self.by_network_cluster
            .get(&(network.to_string(), cluster.to_string()))
            .or_else(|| self.by_network.get(network))
            .map_or(&[], Vec::as_slice)
    }

    /// The weight scale factor (at least 1).
    pub fn scale(&self) -> u32 {
        self.scale.max(1)
    }

    /// Every gateway, sorted.
    pub fn all(&self) -> impl Iterator<Item = &NetworkGateway> {
        self.by_network.values().flatten()
    }
}

/// The gateways a Service is: labelled with its network and listening on the gateway
/// port, or named by a `meshNetworks` gateway of its cluster's network.
fn service_gateways(svc: &Service, mesh: &MeshNetworks) -> Vec<NetworkGateway> {
    let with = |network: &str, port: u32| {
        svc.external_addresses
            .iter()
            .map(|address| NetworkGateway {
                address: address.clone(),
                port,
                network: network.to_string(),
                cluster: svc.cluster.clone(),
            })
            .collect::<Vec<_>>()
    };
    if let Some(network) = svc.meta.labels.get(NETWORK_LABEL).filter(|n| !n.is_empty()) {
        let port = match svc.meta.labels.get(GATEWAY_PORT_LABEL) {
            Some(p) => p.parse::<u16>().unwrap_or_else(|_| {
                tracing::warn!(service = %svc.hostname, value = %p,
                    "{GATEWAY_PORT_LABEL} is not a port; using {DEFAULT_GATEWAY_PORT}");
                DEFAULT_GATEWAY_PORT
            }),
            None => DEFAULT_GATEWAY_PORT,
        };
        // A gateway that does not listen on the mTLS port is no gateway for sidecars.
        if !svc.ports.iter().any(|p| p.port == port) {
            tracing::debug!(service = %svc.hostname, port,
                "service labelled as a network gateway does not listen on its gateway port");
            return Vec::new();
        }
        return with(network, u32::from(port));
    }
    let mut out = Vec::new();
    for (network, conf) in &mesh.networks {
        let in_network = conf
            .endpoints
            .iter()
            .any(|e| e.from_registry.as_deref() == Some(svc.cluster.as_str()));
        if !in_network {
            continue;
        }
        for gw in &conf.gateways {
            if gw.registry_service_name.as_deref() == Some(svc.hostname.as_str()) {
                out.extend(with(network, gw.port));
            }
        }
    }
    out
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u32, b: u32) -> u32 {
    if a == 0 || b == 0 {
        return a.max(b);
    }
    (a / gcd(a, b)).saturating_mul(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_common::model::{ObjectMeta, ServicePort};

    pub(crate) fn gateway_service(
        cluster: &str,
        network: &str,
        addresses: &[&str],
        port: u16,
    ) -> Service {
        Service {
            meta: ObjectMeta {
                name: "istio-eastwestgateway".into(),
                namespace: "istio-system".into(),
                labels: [(NETWORK_LABEL.to_string(), network.to_string())].into(),
                ..Default::default()
            },
            cluster: cluster.into(),
            hostname: "istio-eastwestgateway.istio-system.svc.cluster.local".into(),
            cluster_ips: vec![],
            ports: vec![ServicePort {
                name: "tls".into(),
                port,
                protocol: Default::default(),
                target_port: None,
            }],
            selector: Default::default(),
            export_to: vec![],
            external_addresses: addresses.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn labelled_services_and_mesh_networks_make_gateways() {
        let mesh: MeshNetworks = serde_saphyr::from_str(
            "networks:\n  net3:\n    endpoints: [{fromRegistry: c3}, {fromCidr: 10.3.0.0/16}]\n    gateways: [{address: 192.0.2.30, port: 15443}, {address: gw.example, port: 15443}]\n",
        )
        .unwrap();
        let s1 = gateway_service("c1", "net1", &["192.0.2.1", "192.0.2.2"], 15443);
        let s2 = gateway_service("c2", "net2", &["192.0.2.3"], 15443);
        // Labelled, but not listening on 15443: not a gateway.
        let s4 = gateway_service("c4", "net4", &["192.0.2.4"], 8443);
        let gws = NetworkGateways::build([&s1, &s2, &s4], &mesh);
        let addrs =
            |n, c| -> Vec<String> { gws.select(n, c).iter().map(|g| g.address.clone()).collect() };
        assert_eq!(addrs("net1", "c1"), ["192.0.2.1", "192.0.2.2"]);
        assert_eq!(addrs("net2", "other"), ["192.0.2.3"]);
        // meshNetworks gateways have no cluster; the hostname one is dropped.
        assert_eq!(addrs("net3", "c3"), ["192.0.2.30"]);
        assert!(gws.select("net4", "c4").is_empty());
        // lcm(2, 1, 1) over networks and (network, cluster).
        assert_eq!(gws.scale(), 2);
        assert_eq!(mesh.of_cluster("c3"), Some("net3"));
        assert_eq!(mesh.of_address("10.3.4.5"), Some("net3"));
        assert_eq!(mesh.of_address("10.4.4.5"), None);
        assert!(NetworkGateways::build([], &MeshNetworks::default()).is_empty());
    }

    #[test]
    fn registry_service_name_gateways_and_port_label() {
        let mesh: MeshNetworks = serde_saphyr::from_str(
            "networks:\n  net1:\n    endpoints: [{fromRegistry: c1}]\n    gateways: [{registryServiceName: gw.istio-system.svc.cluster.local, port: 15443}]\n",
        )
        .unwrap();
        let mut svc = gateway_service("c1", "", &["192.0.2.1"], 15443);
        svc.meta.labels.clear();
        svc.hostname = "gw.istio-system.svc.cluster.local".into();
        let gws = NetworkGateways::build([&svc], &mesh);
        assert_eq!(gws.select("net1", "c1").len(), 1);
        let mut relabelled = gateway_service("c2", "net2", &["192.0.2.2"], 16443);
        relabelled
            .meta
            .labels
            .insert(GATEWAY_PORT_LABEL.into(), "16443".into());
        let gws = NetworkGateways::build([&relabelled], &MeshNetworks::default());
        assert_eq!(gws.select("net2", "c2")[0].port, 16443);
    }
}
