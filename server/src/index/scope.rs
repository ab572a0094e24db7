//! What a proxy can see: Istio's Sidecar egress `hosts` and `exportTo` rules.

use crate::index::config::Config;
use crate::index::hosts::{labels_match, namespace_admits, split_namespaced_host};
use crate::index::proxy::{Proxy, ProxyKind};
use crate::index::push_context::PushContext;
use crate::index::service::{ServiceSource, ServiceView};
use shoal_common::model::{OutboundTrafficMode, Protocol, Sidecar, TargetPort};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Whether one Sidecar `hosts` entry (`ns/host`) admits a service, for a Sidecar in
/// `sidecar_ns`. `.` is the Sidecar's namespace, `*` any namespace, `~` none; the host part
/// is `*`, `*.suffix`, or a hostname (short name or FQDN).
pub fn host_entry_matches(entry: &str, sidecar_ns: &str, svc: &ServiceView) -> bool {
    let (ns, host) = split_namespaced_host(entry);
    namespace_admits(ns, sidecar_ns, &svc.namespace) && hostname_matches(host, svc)
}

fn hostname_matches(pattern: &str, svc: &ServiceView) -> bool {
    if pattern == "*" {
        return true;
    }
    if let Some(suffix) = pattern.strip_prefix('*') {
        return svc.hostname.ends_with(suffix);
    }
    pattern == svc.hostname || pattern == svc.name
}

/// What a proxy sees: its Sidecar, the services it can reach, where unknown destinations
/// go, and the workload ports it receives traffic on.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyScope {
    /// The Sidecar applied to the proxy, if any (sidecars only).
    pub sidecar: Option<Arc<Config<Sidecar>>>,
    /// Visible services, by hostname order.
    pub services: Vec<Arc<ServiceView>>,
    /// Where traffic to destinations outside the registry goes (Sidecar, else mesh).
    pub outbound_policy: OutboundTrafficMode,
    /// The workload ports the proxy receives traffic on, by port (sidecars only).
    pub inbound: Vec<InboundPort>,
    /// Gateways: the listener port of each Gateway server port — the `targetPort` of the
    /// gateway's Service port with that number, as istiod binds it (a Gateway on port 80
    /// in front of pods listening on 8080 listens on 8080). Ports no Service maps bind as
    /// themselves.
    pub gateway_ports: BTreeMap<u32, u32>,
}

/// One port a sidecar accepts inbound traffic on, as istiod derives it from the Services
/// (and ServiceEntries) that select the workload, or from the Sidecar's `ingress`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InboundPort {
    /// The workload port (a Service's `targetPort`).
    pub port: u16,
    /// The protocol, from the service port (or the ingress listener).
    pub protocol: Protocol,
    /// The service port's name (telemetry, route naming).
    pub port_name: String,
    /// The service this port was taken from, or `<sidecar>.<namespace>` for an ingress
    /// listener (telemetry metadata, as istiod's synthetic hostname).
    pub hostname: String,
    /// The ingress listener's `defaultEndpoint` (`127.0.0.1:8080`), if set; else traffic
    /// goes to the original destination (the pod IP and port).
    pub default_endpoint: Option<String>,
}

impl ProxyScope {
    /// Computes the scope of a proxy.
    pub fn compute(proxy: &Proxy, ctx: &PushContext) -> ProxyScope {
        let sidecar = match proxy.kind {
            // istiod gives proxyless gRPC nodes a SidecarScope too.
            ProxyKind::Sidecar | ProxyKind::Proxyless => ctx
                .sidecar_for(&proxy.namespace, &proxy.labels, &ctx.mesh.root_namespace)
                .cloned(),
            ProxyKind::Router | ProxyKind::Ztunnel => None,
        };
        let outbound_policy = sidecar
            .as_ref()
            .and_then(|s| s.spec.outbound_traffic_policy.as_ref())
            .and_then(|p| p.mode)
            .unwrap_or(ctx.mesh.outbound_traffic_policy);
        let admitted = |svc: &ServiceView| {
            svc.visible_to(&proxy.namespace)
                && match &sidecar {
                    // No Sidecar, or one without egress listeners: everything exported to us.
                    None => true,
                    Some(sc) if sc.spec.egress.is_empty() => true,
                    Some(sc) => sc.spec.egress.iter().any(|l| {
                        l.hosts
                            .iter()
                            .any(|h| host_entry_matches(h, &proxy.namespace, svc))
                    }),
                }
        };
        // A host defined in several namespaces: the proxy's own namespace's definition,
        // else the first one it may see.
        let services = ctx
            .services
            .iter()
            .filter_map(|(host, first)| {
                let all =
                    std::iter::once(first).chain(ctx.shadowed.get(host).into_iter().flatten());
                let visible: Vec<&Arc<ServiceView>> = all.filter(|s| admitted(s)).collect();
                visible
                    .iter()
                    .find(|s| s.namespace == proxy.namespace)
                    .or(visible.first())
                    .map(|s| Arc::clone(s))
            })
            .collect();
        let (inbound, gateway_ports) = match proxy.kind {
            ProxyKind::Sidecar | ProxyKind::Proxyless => (
                inbound_ports(proxy, sidecar.as_deref(), ctx),
                BTreeMap::new(),
            ),
            ProxyKind::Ztunnel => (Vec::new(), BTreeMap::new()),
            ProxyKind::Router => (
                Vec::new(),
                service_target_ports(proxy, ctx)
                    .into_iter()
                    .map(|(port, p)| (u32::from(port), u32::from(p.port)))
                    .collect(),
            ),
        };
        ProxyScope {
            sidecar,
            services,
            outbound_policy,
            inbound,
            gateway_ports,
        }
    }
}

/// The inbound ports of a sidecar. A Sidecar with `ingress` listeners declares them
/// outright; otherwise every port of every service that selects the workload, by its
/// `targetPort` (named ones resolved through the pod's ports, `POD_PORTS`). When two
/// services claim one workport, the first by hostname wins, as istiod keeps one chain per
/// port (istiod picks the oldest service; creation times are not on the bus).
fn inbound_ports(
    proxy: &Proxy,
    sidecar: Option<&Config<Sidecar>>,
    ctx: &PushContext,
) -> Vec<InboundPort> {
    let mut out: BTreeMap<u16, InboundPort> = BTreeMap::new();
    if let Some(sc) = sidecar.filter(|s| !s.spec.ingress.is_empty()) {
        for l in &sc.spec.ingress {
            let Ok(port) = u16::try_from(l.port.number) else {
                continue;
            };
            out.entry(port).or_insert_with(|| InboundPort {
                port,
                protocol: Protocol::parse(&l.port.protocol),
                port_name: l.port.name.clone(),
                hostname: format!("{}.{}", sc.meta.name, sc.meta.namespace),
                default_endpoint: l.default_endpoint.clone(),
            });
        }
        return out.into_values().collect();
    }
    for (_, port) in service_target_ports(proxy, ctx) {
        out.entry(port.port).or_insert(port);
    }
    out.into_values().collect()
}

/// The ports of the services that select a workload (in its namespace, by labels), each
/// with its workload port (`targetPort`, named ones through `POD_PORTS`), keyed by service
/// port; the first service by hostname wins a port.
fn service_target_ports(proxy: &Proxy, ctx: &PushContext) -> Vec<(u16, InboundPort)> {
    let mut out: Vec<(u16, InboundPort)> = Vec::new();
    for svc in ctx.services.values() {
        if svc.namespace != proxy.namespace
            || svc.selector.is_empty()
            || !labels_match(&svc.selector, &proxy.labels)
        {
            continue;
        }
        for p in &svc.ports {
            let target = match (&svc.source, &p.target_port) {
                (ServiceSource::ServiceEntry { .. }, _) => {
                    svc.target_ports.get(&p.port).copied().unwrap_or(p.port)
                }
                (_, None) => p.port,
                (_, Some(TargetPort::Number(n))) => *n,
                (_, Some(TargetPort::Name(name))) => match proxy.pod_ports.get(name) {
                    Some(n) => *n,
                    None => {
                        tracing::debug!(
                            proxy = %proxy.id,
                            service = %svc.hostname,
                            target_port = %name,
                            "named targetPort not in the proxy's POD_PORTS; no inbound chain"
                        );
                        continue;
                    }
                },
            };
            if out.iter().any(|(sp, _)| *sp == p.port) {
                continue;
            }
            out.push((
                p.port,
                InboundPort {
                    port: target,
                    protocol: p.protocol,
                    port_name: p.name.clone(),
                    hostname: svc.hostname.clone(),
                    default_endpoint: None,
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, ns: &str) -> ServiceView {
        ServiceView {
            hostname: shoal_common::model::service_fqdn(name, ns),
            name: name.into(),
            namespace: ns.into(),
            ports: vec![],
            target_ports: BTreeMap::new(),
            vips: vec![],
            cluster_vips: Default::default(),
            export_to: vec![],
            source: ServiceSource::Kubernetes,
            selector: BTreeMap::new(),
        }
    }

    #[test]
    fn sidecar_host_entries() {
        let s = svc("reviews", "prod");
        assert!(host_entry_matches("./*", "prod", &s));
        assert!(!host_entry_matches("./*", "dev", &s));
        assert!(host_entry_matches("prod/*", "dev", &s));
        assert!(host_entry_matches(
            "*/reviews.prod.svc.cluster.local",
            "dev",
            &s
        ));
        assert!(host_entry_matches("*/*.svc.cluster.local", "dev", &s));
        assert!(host_entry_matches("prod/reviews", "dev", &s));
        assert!(!host_entry_matches("~/*", "prod", &s));
        assert!(!host_entry_matches("dev/*", "prod", &s));
    }
}
