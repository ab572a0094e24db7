//! Test fixtures: builders for services, endpoint sets, Istio config and proxies, a mesh
//! state that turns into a [`Snapshot`], bus entries, and decoders for generated resources.

use crate::generate::{self, Resource, Snapshot};
use crate::index::proxy::{Interception, ProvenCluster, Proxy, ProxyKind, VerifiedIdentity};
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use crate::index::store::MeshState;
use bytes::Bytes;
use prost::Message;
use serde::de::DeserializeOwned;
use shoal_common::bus::{Entry, Op};
use shoal_common::keys;
use shoal_common::model::{
    service_fqdn, ConfigObject, ConfigSpec, Endpoint, EndpointPort, EndpointSet, Locality,
    ObjectMeta, Protocol, Service, ServicePort,
};
use shoal_common::Envelope;
use shoal_proto::pb::envoy::config::cluster::v3::Cluster;
use shoal_proto::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use shoal_proto::pb::envoy::config::listener::v3::{filter, Listener};
use shoal_proto::pb::envoy::config::route::v3::RouteConfiguration;
use shoal_proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use shoal_proto::XdsType;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The cluster id fixtures use.
pub const CLUSTER: &str = "Kubernetes";

/// A label map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: name.into(),
        namespace: ns.into(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// Kubernetes services and endpoints

/// A Kubernetes service in [`CLUSTER`]; each port is `(name, number)`, its protocol derived
/// from the name as Istio does.
pub fn service(ns: &str, name: &str, ports: &[(&str, u16)]) -> Service {
    Service {
        meta: meta(ns, name),
        cluster: CLUSTER.into(),
        hostname: service_fqdn(name, ns),
        cluster_ips: Vec::new(),
        ports: ports
            .iter()
            .map(|(n, p)| ServicePort {
                name: n.to_string(),
                port: *p,
                protocol: Protocol::from_port_name(n),
                target_port: None,
            })
            .collect(),
        selector: BTreeMap::new(),
        export_to: Vec::new(),
        external_addresses: Vec::new(),
    }
}

/// A ready endpoint with labels.
pub fn endpoint(address: &str, labels_: &[(&str, &str)]) -> Endpoint {
    Endpoint {
        address: address.into(),
        ready: true,
        labels: labels(labels_),
        service_account: String::new(),
        locality: Locality::default(),
        pod: String::new(),
        node: String::new(),
        ambient: false,
    }
}

/// An endpoint in a locality.
pub fn endpoint_in(address: &str, region: &str, zone: &str) -> Endpoint {
    Endpoint {
        locality: Locality {
            region: region.into(),
            zone: zone.into(),
            subzone: String::new(),
        },
        ..endpoint(address, &[])
    }
}

/// One EndpointSlice of a service in [`CLUSTER`]; ports are `(name, target port)`.
pub fn slice(
    ns: &str,
    svc: &str,
    slice: &str,
    ports: &[(&str, u16)],
    endpoints: Vec<Endpoint>,
) -> EndpointSet {
    EndpointSet {
        cluster: CLUSTER.into(),
        namespace: ns.into(),
        service: svc.into(),
        slice: slice.into(),
        ports: ports
            .iter()
            .map(|(n, p)| EndpointPort {
                name: n.to_string(),
                port: *p,
            })
            .collect(),
        endpoints,
        network: String::new(),
    }
}

// ---------------------------------------------------------------------------------------
// Istio config, written as the spec part of a manifest

fn spec<T: DeserializeOwned>(yaml: &str) -> T {
    shoal_common::yaml::from_str(yaml).unwrap_or_else(|e| panic!("bad fixture spec: {e}\n{yaml}"))
}

/// A config object from its spec.
pub fn config(ns: &str, name: &str, spec: ConfigSpec) -> ConfigObject {
    ConfigObject {
        meta: meta(ns, name),
        spec,
    }
}

/// A VirtualService from its spec in YAML.
pub fn virtual_service(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::VirtualService(spec(yaml)))
}

/// A DestinationRule from its spec in YAML.
pub fn destination_rule(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::DestinationRule(spec(yaml)))
}

/// A Gateway from its spec in YAML.
pub fn gateway(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::Gateway(spec(yaml)))
}

/// A Sidecar from its spec in YAML.
pub fn sidecar(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::Sidecar(spec(yaml)))
}

/// A ServiceEntry from its spec in YAML.
pub fn service_entry(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::ServiceEntry(spec(yaml)))
}

/// A PeerAuthentication from its spec in YAML.
pub fn peer_authentication(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::PeerAuthentication(spec(yaml)))
}

/// An AuthorizationPolicy from its spec in YAML.
pub fn authorization_policy(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::AuthorizationPolicy(spec(yaml)))
}

/// A RequestAuthentication from its spec in YAML.
pub fn request_authentication(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::RequestAuthentication(spec(yaml)))
}

/// A WorkloadEntry from its spec in YAML.
pub fn workload_entry(ns: &str, name: &str, yaml: &str) -> ConfigObject {
    config(ns, name, ConfigSpec::WorkloadEntry(spec(yaml)))
}

// ---------------------------------------------------------------------------------------
// Proxies

/// A sidecar proxy in `ns` with labels, without traffic capture (`INTERCEPTION_MODE:
/// NONE`): it gets only the listeners its Sidecar declares with `captureMode: NONE`.
pub fn sidecar_proxy(ns: &str, labels_: &[(&str, &str)]) -> Proxy {
    Proxy {
        id: format!("sidecar~10.1.0.1~app-1.{ns}~{ns}.svc.cluster.local"),
        kind: ProxyKind::Sidecar,
        ip: "10.1.0.1".into(),
        pod: format!("app-1.{ns}"),
        namespace: ns.into(),
        labels: labels(labels_),
        cluster_id: CLUSTER.into(),
        interception: Interception::None,
        pod_ports: BTreeMap::new(),
        locality: Locality::default(),
        service_account: None,
        verified: None,
        istio_version: None,
        internal_listener: false,
        network: String::new(),
        requested_network_view: Vec::new(),
        node_name: String::new(),
    }
}

/// A sidecar with Istio's default iptables capture (`INTERCEPTION_MODE` absent), at `ip`.
pub fn captured_proxy(ns: &str, ip: &str, labels_: &[(&str, &str)]) -> Proxy {
    Proxy {
        id: format!("sidecar~{ip}~app-1.{ns}~{ns}.svc.cluster.local"),
        ip: ip.into(),
        interception: Interception::Redirect,
        ..sidecar_proxy(ns, labels_)
    }
}

/// A proxyless gRPC application in `ns` with labels (node metadata `GENERATOR: grpc`).
pub fn proxyless_proxy(ns: &str, labels_: &[(&str, &str)]) -> Proxy {
    Proxy {
        kind: ProxyKind::Proxyless,
        ..sidecar_proxy(ns, labels_)
    }
}

/// A ztunnel (node id `ztunnel~…`) on node `node-1`.
pub fn ztunnel_proxy() -> Proxy {
    Proxy {
        id: "ztunnel~10.1.0.3~ztunnel-1.istio-system~istio-system.svc.cluster.local".into(),
        kind: ProxyKind::Ztunnel,
        ip: "10.1.0.3".into(),
        pod: "ztunnel-1.istio-system".into(),
        interception: Interception::None,
        ..router_proxy("istio-system", &[])
    }
}

/// A gateway proxy in `ns` with labels.
pub fn router_proxy(ns: &str, labels_: &[(&str, &str)]) -> Proxy {
    Proxy {
        id: format!("router~10.1.0.2~gw-1.{ns}~{ns}.svc.cluster.local"),
        kind: ProxyKind::Router,
        ip: "10.1.0.2".into(),
        pod: format!("gw-1.{ns}"),
        namespace: ns.into(),
        labels: labels(labels_),
        cluster_id: CLUSTER.into(),
        interception: Interception::None,
        pod_ports: BTreeMap::new(),
        locality: Locality::default(),
        service_account: None,
        verified: None,
        istio_version: None,
        internal_listener: false,
        network: String::new(),
        requested_network_view: Vec::new(),
        node_name: String::new(),
    }
}

/// `proxy` as the secure port leaves it once its caller is authorized: verified as the
/// service accounts `accounts` (of its namespace), of `cluster`.
pub fn verified_as(mut proxy: Proxy, accounts: &[&str], cluster: ProvenCluster) -> Proxy {
    proxy.verified = Some(VerifiedIdentity {
        service_accounts: accounts.iter().map(|a| a.to_string()).collect(),
        cluster,
    });
    proxy
}

// ---------------------------------------------------------------------------------------
// The mesh and snapshots

/// A mesh state under construction.
#[derive(Debug, Default, Clone)]
pub struct Mesh {
    /// The state, as the store would hold it.
    pub state: MeshState,
}

impl Mesh {
    /// An empty mesh.
    pub fn new() -> Mesh {
        Mesh::default()
    }

    /// Adds (or replaces) a service.
    pub fn with_service(mut self, svc: Service) -> Mesh {
        self.add_service(svc);
        self
    }

    /// Adds (or replaces) an endpoint set.
    pub fn with_slice(mut self, set: EndpointSet) -> Mesh {
        self.add_slice(set);
        self
    }

    /// Adds (or replaces) a config object.
    pub fn with_config(mut self, obj: ConfigObject) -> Mesh {
        self.add_config(obj);
        self
    }

    /// Adds (or replaces) a service.
    pub fn add_service(&mut self, svc: Service) {
        use shoal_common::keys::BusIdentity;
        self.state.services.insert(svc.bus_id(), Arc::new(svc));
    }

    /// Adds (or replaces) an endpoint set.
    pub fn add_slice(&mut self, set: EndpointSet) {
        let host = service_fqdn(&set.service, &set.namespace);
        Arc::make_mut(&mut self.state.endpoints).upsert(&host, set);
    }

    /// Adds (or replaces) a config object.
    pub fn add_config(&mut self, obj: ConfigObject) {
        let id = shoal_common::keys::ConfigId::of(&obj);
        self.state.config.insert(id, Arc::new(obj));
    }

    /// The snapshot the pipeline would publish for this state.
    pub fn snapshot(&self) -> Snapshot {
        snapshot_of(&self.state)
    }
}

/// The snapshot of a state.
pub fn snapshot_of(state: &MeshState) -> Snapshot {
    Snapshot {
        ctx: Arc::new(PushContext::build(state)),
        endpoints: state.endpoints.clone(),
        number: 1,
    }
}

/// Generates `ty` for a proxy from a snapshot, as the ADS server does.
pub fn gen(ty: XdsType, proxy: &Proxy, snap: &Snapshot, names: &[&str]) -> Vec<Resource> {
    let scope = ProxyScope::compute(proxy, &snap.ctx);
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    generate::generate(ty, proxy, &scope, snap, &names)
}

// ---------------------------------------------------------------------------------------
// Decoding generated resources

fn decode_all<M: Message + Default>(ty: XdsType, resources: &[Resource]) -> BTreeMap<String, M> {
    resources
        .iter()
        .map(|r| {
            assert_eq!(r.any.type_url, ty.type_url(), "{}", r.name);
            let m = M::decode(&*r.any.value)
                .unwrap_or_else(|e| panic!("{} does not decode: {e}", r.name));
            (r.name.clone(), m)
        })
        .collect()
}

/// Clusters by name.
pub fn clusters(resources: &[Resource]) -> BTreeMap<String, Cluster> {
    decode_all(XdsType::Cluster, resources)
}

/// Load assignments by name.
pub fn load_assignments(resources: &[Resource]) -> BTreeMap<String, ClusterLoadAssignment> {
    decode_all(XdsType::Endpoint, resources)
}

/// Listeners by name.
pub fn listeners(resources: &[Resource]) -> BTreeMap<String, Listener> {
    decode_all(XdsType::Listener, resources)
}

/// Route configurations by name.
pub fn route_configs(resources: &[Resource]) -> BTreeMap<String, RouteConfiguration> {
    decode_all(XdsType::Route, resources)
}

/// The `address:port` of every endpoint of an assignment, per locality, in order.
pub fn cla_addresses(cla: &ClusterLoadAssignment) -> Vec<Vec<String>> {
    cla.endpoints
        .iter()
        .map(|l| {
            l.lb_endpoints
                .iter()
                .map(|e| match &e.host_identifier {
                    Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                        socket(ep.address.as_ref().expect("endpoint address"))
                    }
                    other => panic!("unexpected host identifier {other:?}"),
                })
                .collect()
        })
        .collect()
}

/// `ip:port` of a socket address.
pub fn socket(addr: &shoal_proto::pb::envoy::config::core::v3::Address) -> String {
    use shoal_proto::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier};
    match &addr.address {
        Some(address::Address::SocketAddress(sa)) => match sa.port_specifier {
            Some(PortSpecifier::PortValue(p)) => format!("{}:{p}", sa.address),
            ref other => panic!("unexpected port specifier {other:?}"),
        },
        other => panic!("unexpected address {other:?}"),
    }
}

/// The HTTP connection manager of a listener's only filter chain.
pub fn hcm(l: &Listener) -> HttpConnectionManager {
    assert_eq!(l.filter_chains.len(), 1, "{}", l.name);
    let f = &l.filter_chains[0].filters[0];
    assert_eq!(f.name, "envoy.filters.network.http_connection_manager");
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => {
            HttpConnectionManager::decode(&*any.value).expect("HCM decodes")
        }
        other => panic!("unexpected filter config {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Bus entries

/// A put of `body` at `key`, in a current-schema envelope.
pub fn put<T: serde::Serialize>(key: String, body: &T) -> Entry {
    let env = Envelope::new("test", 1, 1_000, body);
    Entry {
        key,
        value: Bytes::from(env.encode().expect("fixture encodes")),
        revision: 0,
        op: Op::Put,
    }
}

/// A delete of `key`.
pub fn delete(key: String) -> Entry {
    Entry {
        key,
        value: Bytes::new(),
        revision: 0,
        op: Op::Delete,
    }
}

/// The bus put of a config object.
pub fn config_put(obj: &ConfigObject) -> Entry {
    put(keys::ConfigId::of(obj).key(), obj)
}

/// The bus put of a service.
pub fn service_put(svc: &Service) -> Entry {
    put(
        keys::service_key(&svc.cluster, &svc.meta.namespace, &svc.meta.name),
        svc,
    )
}

/// The bus put of an endpoint set.
pub fn slice_put(set: &EndpointSet) -> Entry {
    put(
        keys::endpoints_key(&set.cluster, &set.namespace, &set.service, &set.slice),
        set,
    )
}
