//! EDS: the ClusterLoadAssignment of each requested EDS cluster, from the EDS shards
//! (Kubernetes services) or the ServiceEntry's endpoints, filtered by subset labels and
//! grouped by locality.

use super::{cds::entry_port, socket_address, Resource};
use crate::endpoints::{EndpointIndex, HostShards};
use crate::proxy::Proxy;
use crate::push_context::{PushContext, ServiceSource, ServiceView};
use crate::scope::ProxyScope;
use shoal_common::model::{Locality, Resolution, ServicePort};
use shoal_proto::pb::envoy::config::core::v3::{HealthStatus, Locality as PbLocality};
use shoal_proto::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use shoal_proto::pb::google::protobuf::UInt32Value;
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
                let subset_labels = if subset.is_empty() {
                    BTreeMap::new()
                } else {
                    ctx.destination_rule(&proxy.namespace, &proxy.labels, &svc)
                        .and_then(|dr| {
                            dr.spec
                                .subsets
                                .iter()
                                .find(|s| s.name == subset)
                                .map(|s| s.labels.clone())
                        })?
                };
                let shards = endpoints.host(&svc.hostname).cloned();
                Some(EndpointsSource {
                    svc,
                    port,
                    subset_labels,
                    shards,
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
    let cla = match &key.source {
        Some(src) => load_assignment(&key.name, src),
        None => ClusterLoadAssignment {
            cluster_name: key.name.clone(),
            ..Default::default()
        },
    };
    Resource::new(XdsType::Endpoint, key.name.clone(), &cla)
}

/// One endpoint to send: address, port, locality, weight.
struct Target {
    address: String,
    port: u32,
    weight: Option<u32>,
}

fn load_assignment(name: &str, src: &EndpointsSource) -> ClusterLoadAssignment {
    let EndpointsSource {
        svc,
        port,
        subset_labels,
        shards,
    } = src;
    let port = *port;
    let matches = |labels: &BTreeMap<String, String>| {
        subset_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
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
                            });
                    }
                }
            }
            ServiceSource::ServiceEntry {
                endpoints,
                resolution,
            } => {
                if matches!(resolution, Resolution::Static | Resolution::None) {
                    for we in endpoints.iter().filter(|e| matches(&e.labels)) {
                        by_locality
                            .entry(parse_locality(we.locality.as_deref()))
                            .or_default()
                            .push(Target {
                                address: we.address.clone(),
                                port: entry_port(svc, svc_port, &we.ports),
                                weight: we.weight,
                            });
                    }
                }
            }
        }
    }
    let endpoints = by_locality
        .into_iter()
        .map(|(loc, mut targets)| {
            targets.sort_by(|a, b| (&a.address, a.port).cmp(&(&b.address, b.port)));
            targets.dedup_by(|a, b| a.address == b.address && a.port == b.port);
            LocalityLbEndpoints {
                locality: Some(PbLocality {
                    region: loc.region,
                    zone: loc.zone,
                    sub_zone: loc.subzone,
                }),
                lb_endpoints: targets
                    .into_iter()
                    .map(|t| LbEndpoint {
                        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                            address: Some(socket_address(&t.address, t.port)),
                            ..Default::default()
                        })),
                        health_status: HealthStatus::Healthy as i32,
                        load_balancing_weight: t
                            .weight
                            .filter(|w| *w > 0)
                            .map(|value| UInt32Value { value }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints,
        ..Default::default()
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

fn parse_locality(s: Option<&str>) -> Locality {
    let mut parts = s.unwrap_or_default().splitn(3, '/').map(str::to_string);
    Locality {
        region: parts.next().unwrap_or_default(),
        zone: parts.next().unwrap_or_default(),
        subzone: parts.next().unwrap_or_default(),
    }
}
