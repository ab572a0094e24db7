//! EDS: the ClusterLoadAssignment of each requested EDS cluster, from the EDS shards
//! (Kubernetes services) or the ServiceEntry's endpoints, filtered by subset labels and
//! grouped by locality, with the proxy-relative priorities and weights of locality load
//! balancing (see [`super::locality`]).

use super::locality::{self, LocalityLb};
use super::{cds::entry_port, mtls, socket_address, Resource};
use crate::index::destination_rule::effective_policy;
use crate::index::endpoints::{EndpointIndex, HostShards};
use crate::index::proxy::{parse_locality, Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use crate::index::scope::ProxyScope;
use crate::index::service::{ServiceSource, ServiceView};
use crate::index::tls_mode;
use shoal_common::model::{Locality, Resolution, ServicePort};
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
                let rule = dr.as_ref().map(|d| &d.spec);
                let subset_spec = if subset.is_empty() {
                    None
                } else {
                    // A subset no rule defines has no endpoints.
                    Some(rule?.subsets.iter().find(|s| s.name == subset)?)
                };
                let policy = effective_policy(
                    rule.and_then(|r| r.traffic_policy.as_deref()),
                    subset_spec.and_then(|s| s.traffic_policy.as_ref()),
                    u16::try_from(port).unwrap_or_default(),
                );
                let shards = endpoints.host(&svc.hostname).cloned();
                Some(EndpointsSource {
                    svc,
                    port,
                    subset_labels: subset_spec.map(|s| s.labels.clone()).unwrap_or_default(),
                    shards,
                    locality: locality::for_proxy(policy.as_ref(), proxy).map(Box::new),
                    weigh_localities: proxy.kind == ProxyKind::Proxyless,
                })
            });
            Some(EndpointsKey {
                name: name.clone(),
                source,
            })
        })
        .collect()
}

/// Builds one load assignment from its key alone.
pub fn build(key: &EndpointsKey) -> Resource {
    let (cla, workloads) = match &key.source {
        Some(src) => load_assignment(&key.name, src),
        None => (
            ClusterLoadAssignment {
                cluster_name: key.name.clone(),
                ..Default::default()
            },
            BTreeMap::new(),
        ),
    };
    let value = encode_with_workloads(&cla, &workloads);
    let any = shoal_proto::Any {
        type_url: XdsType::Endpoint.type_url().to_string(),
        value,
    };
    let version = shoal_proto::content_version(&any.value);
    Resource::from_parts(key.name.clone(), version, any)
}

/// Encodes a load assignment with each endpoint's `istio` metadata (`workload`, by the
/// endpoint's address and port) added beside the metadata
/// the endpoint already has. `Metadata.filter_metadata` is a protobuf map, which prost
/// encodes in hash order; an endpoint with both `envoy.transport_socket_match` and `istio`
/// would encode differently on each replica. So each entry goes in as its own occurrence
/// of the `metadata` field, which protobuf parsers merge (map entries included): the same
/// bytes everywhere, and the same message Envoy would decode from one map of two entries.
fn encode_with_workloads(cla: &ClusterLoadAssignment, workloads: &Workloads) -> Vec<u8> {
    use prost::encoding::{encode_key, encode_varint, WireType};
    use prost::Message as _;
    fn delimited(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }
    let mut out = ClusterLoadAssignment {
        endpoints: Vec::new(),
        ..cla.clone()
    }
    .encode_to_vec();
    for loc in &cla.endpoints {
        let mut loc_bytes = LocalityLbEndpoints {
            lb_endpoints: Vec::new(),
            ..loc.clone()
        }
        .encode_to_vec();
        for ep in &loc.lb_endpoints {
            let mut ep_bytes = ep.encode_to_vec();
            if let Some(workload) = workloads.get(&endpoint_socket(ep)) {
                // LbEndpoint.metadata is field 3.
                delimited(
                    3,
                    &istio_workload_metadata(workload).encode_to_vec(),
                    &mut ep_bytes,
                );
            }
            // LocalityLbEndpoints.lb_endpoints is field 2.
            delimited(2, &ep_bytes, &mut loc_bytes);
        }
        // ClusterLoadAssignment.endpoints is field 2.
        delimited(2, &loc_bytes, &mut out);
    }
    out
}

/// Endpoints' `istio.workload` values by address and port.
type Workloads = BTreeMap<(String, u32), String>;

fn endpoint_socket(ep: &LbEndpoint) -> (String, u32) {
    use shoal_proto::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier};
    match &ep.host_identifier {
        Some(HostIdentifier::Endpoint(e)) => {
            match e.address.as_ref().and_then(|a| a.address.as_ref()) {
                Some(address::Address::SocketAddress(sa)) => match sa.port_specifier {
                    Some(PortSpecifier::PortValue(p)) => (sa.address.clone(), p),
                    _ => (sa.address.clone(), 0),
                },
                _ => Default::default(),
            }
        }
        _ => Default::default(),
    }
}

/// `istio: {workload: "<workload>;<namespace>;<canonical service>;<revision>;<cluster>"}`,
/// istiod's compressed endpoint telemetry labels: the client's istio-proxy reports the
/// destination workload from it when the server has no sidecar or the request never got
/// there.
fn istio_workload_metadata(workload: &str) -> Metadata {
    let value = Value {
        kind: Some(value::Kind::StringValue(workload.to_string())),
    };
    Metadata {
        filter_metadata: std::iter::once((
            "istio".to_string(),
            Struct {
                fields: std::iter::once(("workload".to_string(), value)).collect(),
            },
        ))
        .collect(),
        typed_filter_metadata: Default::default(),
    }
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
    /// istiod's `istio.workload` metadata (Kubernetes endpoints).
    workload: Option<String>,
}

fn load_assignment(name: &str, src: &EndpointsSource) -> (ClusterLoadAssignment, Workloads) {
    let EndpointsSource {
        svc,
        port,
        subset_labels,
        shards,
        locality: locality_lb,
        weigh_localities,
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
    let label_priority = |labels: &BTreeMap<String, String>, loc: &Locality, cluster| {
        priority_labels.map_or(0, |p| {
            locality::label_priority(p, |k| locality::topology_label(labels, loc, cluster, k))
        })
    };
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
                                ),
                                istio_tls: tls_mode::pod_has_sidecar(&ep.labels),
                                workload: Some(workload_label(ep, &set.namespace, &set.cluster)),
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
                        let label_priority = label_priority(&we.labels, &loc, None);
                        by_locality.entry(loc).or_default().push(Target {
                            address: we.address.clone(),
                            port: entry_port(svc, svc_port, &we.ports),
                            weight: we.weight,
                            label_priority,
                            istio_tls: tls_mode::workload_entry_has_sidecar(we),
                            workload: None,
                        });
                    }
                }
            }
        }
    }
    let mut endpoints = Vec::with_capacity(by_locality.len());
    let mut workloads = Workloads::new();
    for (loc, mut targets) in by_locality {
        targets.sort_by(|a, b| (&a.address, a.port).cmp(&(&b.address, b.port)));
        targets.dedup_by(|a, b| a.address == b.address && a.port == b.port);
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
                lb_endpoints: targets
                    .into_iter()
                    .map(|mut t| {
                        if let Some(w) = t.workload.take() {
                            workloads.insert((t.address.clone(), t.port), w);
                        }
                        lb_endpoint(t)
                    })
                    .collect(),
                priority,
                ..Default::default()
            });
        }
    }
    if let Some(lb) = locality_lb {
        locality::apply(lb, &mut endpoints);
    }
    let cla = ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints,
        ..Default::default()
    };
    (cla, workloads)
}

/// istiod's endpoint metadata for auto mTLS: `envoy.transport_socket_match: {tlsMode:
/// istio}` on endpoints with a sidecar, which the cluster's `tlsMode-istio` transport socket
/// match selects.
fn tls_mode_metadata() -> Metadata {
    let tls_mode = Struct {
        fields: std::iter::once((
            mtls::TLS_MODE_KEY.to_string(),
            Value {
                kind: Some(value::Kind::StringValue(tls_mode::TLS_MODE_ISTIO.into())),
            },
        ))
        .collect(),
    };
    Metadata {
        filter_metadata: std::iter::once((mtls::TRANSPORT_SOCKET_MATCH.to_string(), tls_mode))
            .collect(),
        typed_filter_metadata: Default::default(),
    }
}

fn lb_endpoint(t: Target) -> LbEndpoint {
    LbEndpoint {
        metadata: t.istio_tls.then(tls_mode_metadata),
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(socket_address(&t.address, t.port)),
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
