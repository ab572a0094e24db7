//! EDS: the ClusterLoadAssignment of each requested EDS cluster, from the EDS shards
//! (Kubernetes services) or the ServiceEntry's endpoints, filtered by subset labels and
//! grouped by locality, with the proxy-relative priorities and weights of locality load
//! balancing (see [`super::locality`]).

use super::locality::{self, LocalityLb};
use super::{cds::entry_port, mtls, socket_address, string_struct, Resource};
use crate::index::destination_rule::subset_policy;
use crate::index::endpoints::{EndpointIndex, HostShards};
use crate::index::network::{MeshNetworks, NetworkGateway, NetworkGateways};
use crate::index::peer_authentication::{self, MtlsMode};
use crate::index::proxy::{parse_locality, Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use crate::index::service::{ServiceSource, ServiceView};
use crate::index::tls_mode;
use shoal_common::model::{ClientTlsMode, Locality, Resolution, ServicePort, NETWORK_LABEL};
use shoal_proto::pb::envoy::config::core::v3::{HealthStatus, Locality as PbLocality, Metadata};
use shoal_proto::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use shoal_proto::pb::google::protobuf::{value, Struct, UInt32Value, Value};
use shoal_proto::{parse_outbound_cluster_name, XdsType};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Everything one load assignment is built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointsKey {
    /// The cluster name.
    pub name: String,
    /// Where its endpoints come from; `None` for an unknown service or subset (empty).
    pub source: Option<EndpointsSource>,
}

/// The inputs of a non-empty load assignment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointsSource {
    /// The service.
    pub svc: Arc<ServiceView>,
    /// The service port.
    pub port: u32,
    /// Labels endpoints must carry (empty: all).
    pub subset_labels: BTreeMap<String, String>,
    /// The service's EDS shards (Kubernetes services).
    pub shards: Option<Arc<HostShards>>,
    /// Locality load balancing for the proxy, when it changes anything (boxed: rare).
    pub locality: Option<Box<LocalityLb>>,
    /// Every locality carries its weight, as istiod always sends it: gRPC drops a
    /// locality without one (proxyless nodes); Envoy reads it only with locality-weighted
    /// load balancing.
    pub weigh_localities: bool,
    /// How the proxy's network splits the endpoints; `None` when no network has a gateway
    /// (every endpoint is sent as it is, as istiod does).
    pub network: Option<Box<NetworkSplit>>,
    /// `meshNetworks`, for the network of endpoints no label places (empty: none).
    pub mesh_networks: Arc<MeshNetworks>,
    /// The proxy sends HBONE: ambient endpoints (pods captured by ztunnel) are reached
    /// through `connect_originate` (see [`super::hbone`]).
    pub hbone: bool,
}

/// istiod's `EndpointsByNetworkFilter` inputs: endpoints of the proxy's network (and of
/// networks without a gateway) are sent as they are; each other network's endpoints are
/// replaced by that network's gateways, weighted by how many endpoints sit behind each —
/// only for a destination reached over Istio mutual TLS, since the gateway routes by the
/// SNI of that TLS; without it they are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NetworkSplit {
    /// The proxy's network (empty: none, and then every endpoint of a network with a
    /// gateway goes through it, as istiod's `forceGateway`).
    pub network: String,
    /// `REQUESTED_NETWORK_VIEW`: only endpoints of these networks (and of none) are sent;
    /// empty: all.
    pub view: Vec<String>,
    /// Every network's gateways.
    pub gateways: Arc<NetworkGateways>,
    /// Whether the destination is reached over Istio mutual TLS: its DestinationRule sets
    /// `ISTIO_MUTUAL`, or sets no TLS and auto mTLS is on.
    pub mtls: bool,
    /// The destination namespace's PeerAuthentications, consulted per endpoint (its
    /// workload's labels, its port) when the DestinationRule sets no TLS mode, as istiod's
    /// `mtlsChecker` does: an endpoint whose workload's mode is `DISABLE` cannot be reached
    /// through a gateway. `None`: the DestinationRule's mode decides alone.
    pub peer: Option<Arc<peer_authentication::NamespaceMtls>>,
}

impl NetworkSplit {
    /// Whether an endpoint of another network (its labels, its port) may be reached
    /// through its network's gateway: only over Istio mutual TLS.
    fn reachable(&self, istio_tls: bool, labels: &BTreeMap<String, String>, port: u32) -> bool {
        self.mtls
            && istio_tls
            && self
                .peer
                .as_ref()
                .is_none_or(|p| p.mode(labels, port) != MtlsMode::Disable)
    }
}

/// The load assignments for the requested cluster names the proxy may see. An unknown but
/// well-formed name gets an empty assignment, so Envoy's cluster warming completes instead
/// of waiting for the initial fetch timeout. A subset no DestinationRule defines has no
/// endpoints, as in Istio.
pub fn keys(
    names: &[String],
    proxy: &Proxy,
    scope: &ProxyScope,
    ctx: &PushContext,
    endpoints: &EndpointIndex,
) -> Vec<EndpointsKey> {
    names
        .iter()
        .filter_map(|name| {
            let (port, subset, host) = parse_outbound_cluster_name(name)?;
            let svc = scope
                .services
                .binary_search_by(|s| s.hostname.as_str().cmp(host))
                .ok()
                .map(|i| scope.services[i].clone());
            let source = svc.and_then(|svc| {
                let dr = ctx.destination_rule(&proxy.namespace, &proxy.labels, &svc);
                // A subset no rule defines has no endpoints.
                let (subset_spec, policy) = subset_policy(
                    dr.as_ref().map(|d| &d.spec),
                    subset,
                    u16::try_from(port).unwrap_or_default(),
                )?;
                let shards = endpoints.host(&svc.hostname).cloned();
                let network = network_split(proxy, ctx, &svc, policy.as_ref());
                Some(EndpointsSource {
                    network,
                    mesh_networks: ctx.mesh_networks.clone(),
                    svc,
                    port,
                    subset_labels: subset_spec.map(|s| s.labels.clone()).unwrap_or_default(),
                    shards,
                    locality: locality::for_proxy(
                        policy.as_ref(),
                        proxy,
                        &proxy_network(proxy, ctx),
                    )
                    .map(Box::new),
                    weigh_localities: proxy.kind == ProxyKind::Proxyless,
                    hbone: super::hbone::sends_hbone(proxy),
                })
            });
            Some(EndpointsKey {
                name: name.clone(),
                source,
            })
        })
        .collect()
}

/// The proxy's network: node metadata `NETWORK`, else its cluster's network (the
/// `topology.istio.io/network` label of the cluster's system namespace, what Istio's
/// injector would have set as `ISTIO_META_NETWORK`), else the `meshNetworks` network of its
/// cluster.
pub fn proxy_network(proxy: &Proxy, ctx: &PushContext) -> String {
    if !proxy.network.is_empty() {
        return proxy.network.clone();
    }
    if let Some(network) = ctx.cluster_networks.get(&proxy.cluster_id) {
        return network.clone();
    }
    ctx.mesh
        .mesh_networks
        .of_cluster(&proxy.cluster_id)
        .unwrap_or_default()
        .to_string()
}

/// The network split of a proxy's load assignments for `svc`, when any network has a
/// gateway.
fn network_split(
    proxy: &Proxy,
    ctx: &PushContext,
    svc: &ServiceView,
    policy: Option<&shoal_common::model::TrafficPolicy>,
) -> Option<Box<NetworkSplit>> {
    if ctx.network_gateways.is_empty() {
        return None;
    }
    // istiod's mtlsChecker: a DestinationRule TLS mode decides alone; without one, each
    // endpoint's workload PeerAuthentication does.
    let (mtls, peer) = match policy.and_then(|p| p.tls.as_ref()).map(|t| t.mode) {
        None => (
            ctx.mesh.enable_auto_mtls,
            Some(Arc::new(peer_authentication::namespace_workloads(
                ctx,
                &svc.namespace,
            ))),
        ),
        Some(mode) => (mode == ClientTlsMode::IstioMutual, None),
    };
    Some(Box::new(NetworkSplit {
        network: proxy_network(proxy, ctx),
        view: proxy.requested_network_view.clone(),
        gateways: ctx.network_gateways.clone(),
        mtls,
        peer,
    }))
}

/// Builds one load assignment from its key alone.
pub fn build(key: &EndpointsKey) -> Resource {
    let cla = match &key.source {
        Some(src) => load_assignment(&key.name, src),
        None => ClusterLoadAssignment {
            cluster_name: key.name.clone(),
            ..Default::default()
        },
    };
    Resource::new(XdsType::Endpoint, key.name.clone(), &cla)
}

/// istiod's `istio.workload` value of a Kubernetes endpoint: its workload (the Deployment
/// of a ReplicaSet pod, else the pod), namespace, canonical service and revision (from the
/// labels injection sets, else `app.kubernetes.io/*`, `app`/`version`, else the workload
/// name and no revision), and cluster. An endpoint without a pod (the API server) names
/// only its cluster.
fn workload_label(ep: &shoal_common::model::Endpoint, namespace: &str, cluster: &str) -> String {
    let pod_name = ep.pod.split('.').next().unwrap_or_default();
    if pod_name.is_empty() {
        return format!(";;;;{cluster}");
    }
    let workload = deployment_of(pod_name, &ep.labels);
    let label = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| ep.labels.get(*k).filter(|v| !v.is_empty()))
            .cloned()
    };
    let service = label(&[
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ])
    .unwrap_or_else(|| workload.to_string());
    let revision = label(&[
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ])
    // istiod does not send its default, `latest`.
    .filter(|r| r != "latest")
    .unwrap_or_default();
    format!("{workload};{namespace};{service};{revision};{cluster}")
}

/// The Deployment a pod belongs to, as istiod derives it from the ReplicaSet: the pod's
/// name without `-<pod-template-hash>-<suffix>`; other pods are their own workload.
fn deployment_of<'a>(pod: &'a str, labels: &BTreeMap<String, String>) -> &'a str {
    labels
        .get("pod-template-hash")
        .filter(|h| !h.is_empty())
        .and_then(|hash| pod.rfind(&format!("-{hash}-")).map(|i| &pod[..i]))
        .unwrap_or(pod)
}

/// One endpoint to send: address, port, weight, `failoverPriority` rank, whether it has a
/// sidecar (accepts Istio mutual TLS).
struct Target {
    address: String,
    port: u32,
    weight: Option<u32>,
    label_priority: u32,
    istio_tls: bool,
    /// Whether another network may reach it through a gateway (see
    /// [`NetworkSplit::reachable`]); only read when it is on another network.
    via_gateway: bool,
    /// istiod's `istio.workload` metadata (Kubernetes endpoints).
    workload: Option<String>,
    /// The endpoint's network (empty: none).
    network: String,
    /// The cluster it is in (empty for ServiceEntry endpoints).
    cluster: String,
    /// Reached over HBONE through `connect_originate` (an ambient pod, for a proxy that
    /// sends HBONE).
    tunnel: bool,
}

fn load_assignment(name: &str, src: &EndpointsSource) -> ClusterLoadAssignment {
    let EndpointsSource {
        svc,
        port,
        subset_labels,
        shards,
        locality: locality_lb,
        weigh_localities,
        network: split,
        mesh_networks,
        hbone,
    } = src;
    let port = *port;
    let matches = |labels: &BTreeMap<String, String>| {
        subset_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    let priority_labels = match locality_lb.as_deref() {
        Some(LocalityLb::Failover {
            labels: Some(p), ..
        }) => Some(p),
        _ => None,
    };
    let label_priority =
        |labels: &BTreeMap<String, String>,
         loc: &Locality,
         cluster: Option<&str>,
         network: &str| { rank(priority_labels, labels, loc, cluster, network) };
    let mut by_locality: BTreeMap<Locality, Vec<Target>> = BTreeMap::new();
    if let Some(svc_port) = svc.port(port) {
        match &svc.source {
            ServiceSource::Kubernetes => {
                for set in shards.iter().flat_map(|s| s.values()) {
                    let Some(target_port) = slice_port(svc_port, &set.ports) else {
                        continue;
                    };
                    for ep in set
                        .endpoints
                        .iter()
                        .filter(|e| e.ready && matches(&e.labels))
                    {
                        let network = endpoint_network(
                            set.network_of(ep),
                            &set.cluster,
                            &ep.address,
                            mesh_networks,
                        );
                        by_locality
                            .entry(ep.locality.clone())
                            .or_default()
                            .push(Target {
                                address: ep.address.clone(),
                                port: target_port,
                                weight: None,
                                label_priority: label_priority(
                                    &ep.labels,
                                    &ep.locality,
                                    Some(&set.cluster),
                                    &network,
                                ),
                                istio_tls: tls_mode::pod_has_sidecar(&ep.labels),
                                via_gateway: split.as_ref().is_some_and(|s| {
                                    s.reachable(
                                        tls_mode::pod_has_sidecar(&ep.labels),
                                        &ep.labels,
                                        target_port,
                                    )
                                }),
                                workload: Some(workload_label(ep, &set.namespace, &set.cluster)),
                                network,
                                cluster: set.cluster.clone(),
                                // istiod tunnels to an endpoint that takes HBONE unless it
                                // has a sidecar (Istio mTLS is used then).
                                tunnel: *hbone
                                    && ep.ambient
                                    && !tls_mode::pod_has_sidecar(&ep.labels),
                            });
                    }
                }
            }
            ServiceSource::ServiceEntry {
                endpoints,
                resolution,
                ..
            } => {
                if matches!(resolution, Resolution::Static | Resolution::None) {
                    for we in endpoints.iter().filter(|e| matches(&e.labels)) {
                        let loc = parse_locality(we.locality.as_deref().unwrap_or_default());
                        let network = endpoint_network(
                            we.network
                                .as_deref()
                                .or_else(|| we.labels.get(NETWORK_LABEL).map(String::as_str))
                                .unwrap_or_default(),
                            "",
                            &we.address,
                            mesh_networks,
                        );
                        let label_priority = label_priority(&we.labels, &loc, None, &network);
                        let port = entry_port(svc, svc_port, &we.ports);
                        let istio_tls = tls_mode::workload_entry_has_sidecar(we);
                        by_locality.entry(loc).or_default().push(Target {
                            address: we.address.clone(),
                            port,
                            weight: we.weight,
                            label_priority,
                            istio_tls,
                            via_gateway: split
                                .as_ref()
                                .is_some_and(|s| s.reachable(istio_tls, &we.labels, port)),
                            workload: None,
                            network,
                            cluster: String::new(),
                            tunnel: false,
                        });
                    }
                }
            }
        }
    }
    let mut endpoints = Vec::with_capacity(by_locality.len());
    for (loc, mut targets) in by_locality {
        targets.sort_by(|a, b| (&a.address, a.port).cmp(&(&b.address, b.port)));
        targets.dedup_by(|a, b| a.address == b.address && a.port == b.port);
        if let Some(split) = split.as_deref() {
            // A gateway endpoint ranks by its network and cluster alone (istiod gives it
            // only those labels).
            let no_labels = BTreeMap::new();
            let no_locality = Locality::default();
            targets = split_by_network(split, targets, |network, cluster| {
                rank(
                    priority_labels,
                    &no_labels,
                    &no_locality,
                    Some(cluster),
                    network,
                )
            });
        }
        // With `failoverPriority`, one group per label rank (istiod splits each locality's
        // endpoints the same way).
        let mut by_rank: BTreeMap<u32, Vec<Target>> = BTreeMap::new();
        for t in targets {
            by_rank.entry(t.label_priority).or_default().push(t);
        }
        for (priority, targets) in by_rank {
            endpoints.push(LocalityLbEndpoints {
                locality: Some(PbLocality {
                    region: loc.region.clone(),
                    zone: loc.zone.clone(),
                    sub_zone: loc.subzone.clone(),
                }),
                // istiod weighs each locality by its endpoints (1 each unless weighted);
                // Envoy reads it only with locality-weighted load balancing.
                load_balancing_weight: (locality_lb.is_some() || *weigh_localities).then(|| {
                    UInt32Value {
                        value: targets
                            .iter()
                            .map(|t| t.weight.filter(|w| *w > 0).unwrap_or(1))
                            .fold(0u32, u32::saturating_add),
                    }
                }),
                lb_endpoints: targets.into_iter().map(lb_endpoint).collect(),
                priority,
                ..Default::default()
            });
        }
    }
    if let Some(lb) = locality_lb {
        locality::apply(lb, &mut endpoints);
    }
    ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints,
        ..Default::default()
    }
}

/// An endpoint's `failoverPriority` rank (0 without one).
fn rank(
    priority_labels: Option<&locality::PriorityLabels>,
    labels: &BTreeMap<String, String>,
    loc: &Locality,
    cluster: Option<&str>,
    network: &str,
) -> u32 {
    priority_labels.map_or(0, |p| {
        locality::label_priority(p, |k| {
            locality::topology_label(labels, loc, cluster, Some(network), k)
        })
    })
}

/// An endpoint's network: what its labels (or its cluster's system namespace) say, else
/// the `meshNetworks` network of its cluster, else of its address.
fn endpoint_network(labelled: &str, cluster: &str, address: &str, nets: &MeshNetworks) -> String {
    if !labelled.is_empty() {
        return labelled.to_string();
    }
    nets.of_cluster(cluster)
        .or_else(|| nets.of_address(address))
        .unwrap_or_default()
        .to_string()
}

/// istiod's `EndpointsByNetworkFilter` on one locality's endpoints (sorted): see
/// [`NetworkSplit`]. Every weight is scaled by the gateways' scale factor so that an
/// endpoint's weight splits evenly among its network's gateways; gateway endpoints follow
/// the direct ones, in address order, with `tlsMode: istio` (the sidecar originates mTLS
/// to the gateway, which passes it through by SNI).
fn split_by_network(
    split: &NetworkSplit,
    targets: Vec<Target>,
    gateway_priority: impl Fn(&str, &str) -> u32,
) -> Vec<Target> {
    let scale = split.gateways.scale();
    let mut out = Vec::with_capacity(targets.len());
    let mut through: BTreeMap<&NetworkGateway, u32> = BTreeMap::new();
    for t in targets {
        if !split.view.is_empty() && !t.network.is_empty() && !split.view.contains(&t.network) {
            continue;
        }
        let weight = t
            .weight
            .filter(|w| *w > 0)
            .unwrap_or(1)
            .saturating_mul(scale);
        let gateways = split.gateways.select(&t.network, &t.cluster);
        let same = !split.network.is_empty() && split.network == t.network;
        if t.network.is_empty() || same || gateways.is_empty() {
            out.push(Target {
                weight: Some(weight),
                ..t
            });
            continue;
        }
        // The gateway routes by the SNI of Istio mTLS: without it there is no way in.
        if !t.via_gateway {
            continue;
        }
        let share = weight / u32::try_from(gateways.len()).unwrap_or(u32::MAX);
        for gw in gateways {
            *through.entry(gw).or_default() += share;
        }
    }
    for (gw, weight) in through {
        out.push(Target {
            address: gw.address.clone(),
            port: gw.port,
            weight: Some(weight.max(1)),
            label_priority: gateway_priority(&gw.network, &gw.cluster),
            istio_tls: true,
            via_gateway: true,
            workload: None,
            network: gw.network.clone(),
            cluster: gw.cluster.clone(),
            tunnel: false,
        });
    }
    out
}

/// istiod's endpoint metadata for auto mTLS: `envoy.transport_socket_match: {tlsMode:
/// istio}` on endpoints with a sidecar, which the cluster's `tlsMode-istio` transport socket
/// match selects.
fn tls_mode_metadata() -> Metadata {
    let tls_mode = string_struct(mtls::TLS_MODE_KEY, tls_mode::TLS_MODE_ISTIO);
    Metadata {
        filter_metadata: std::iter::once((mtls::TRANSPORT_SOCKET_MATCH.to_string(), tls_mode))
            .collect(),
        typed_filter_metadata: Default::default(),
    }
}

/// The endpoint metadata namespace that carries an endpoint's network.
pub const ISTIO_METADATA: &str = "istio";

fn lb_endpoint(t: Target) -> LbEndpoint {
    let mut metadata = t.istio_tls.then(tls_mode_metadata);
    // istiod's `istio` endpoint metadata: the endpoint's network, and `workload`
    // ("<workload>;<namespace>;<canonical service>;<revision>;<cluster>"), the compressed
    // telemetry labels the client's istio-proxy reports the destination from when the
    // server has no sidecar or the request never got there.
    let string = |v: &str| Value {
        kind: Some(value::Kind::StringValue(v.to_string())),
    };
    let mut istio = Vec::new();
    if !t.network.is_empty() {
        istio.push(("network".to_string(), string(&t.network)));
    }
    if let Some(workload) = &t.workload {
        istio.push(("workload".to_string(), string(workload)));
    }
    // Only a tunnelled endpoint needs its `<ip>:<port>` as a string (EDS builds every
    // endpoint of every assignment through here).
    let target = t
        .tunnel
        .then(|| super::hbone::join_host_port(&t.address, t.port));
    let mut extra: Vec<(String, Struct)> = target
        .as_deref()
        .map(super::hbone::endpoint_metadata)
        .unwrap_or_default();
    if !istio.is_empty() {
        extra.push((
            ISTIO_METADATA.to_string(),
            Struct {
                fields: super::ordered_map(istio),
            },
        ));
    }
    if !extra.is_empty() {
        let m = metadata.get_or_insert_with(Metadata::default);
        let mut entries: Vec<(String, Struct)> = m.filter_metadata.drain().collect();
        entries.append(&mut extra);
        // Maps encoded in key order, so every replica sends the same bytes.
        m.filter_metadata = super::ordered_map(entries);
    }
    let address = match &target {
        Some(target) => super::hbone::internal_address(target),
        None => socket_address(&t.address, t.port),
    };
    LbEndpoint {
        metadata,
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(address),
            ..Default::default()
        })),
        health_status: HealthStatus::Healthy as i32,
        load_balancing_weight: t
            .weight
            .filter(|w| *w > 0)
            .map(|value| UInt32Value { value }),
    }
}

/// The workload port of a slice for a service port: matched by port name, or the only
/// port of a single-port slice when the service port is unnamed.
fn slice_port(svc_port: &ServicePort, ports: &[shoal_common::model::EndpointPort]) -> Option<u32> {
    ports
        .iter()
        .find(|p| p.name == svc_port.name)
        .or_else(|| (ports.len() == 1 && svc_port.name.is_empty()).then(|| &ports[0]))
        .map(|p| u32::from(p.port))
}
