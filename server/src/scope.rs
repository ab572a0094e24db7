//! What a proxy can see: Istio's Sidecar egress `hosts` and `exportTo` rules.

use crate::proxy::{Proxy, ProxyKind};
use crate::push_context::{Config, PushContext, ServiceView};
use shoal_common::model::Sidecar;
use std::sync::Arc;

/// The namespace whose selector-less Sidecar applies mesh-wide (Istio's root namespace).
pub const ROOT_NAMESPACE: &str = "istio-system";

/// Whether one Sidecar `hosts` entry (`ns/host`) admits a service, for a Sidecar in
/// `sidecar_ns`. `.` is the Sidecar's namespace, `*` any namespace, `~` none; the host part
/// is `*`, `*.suffix`, or a hostname (short name or FQDN).
pub fn host_entry_matches(entry: &str, sidecar_ns: &str, svc: &ServiceView) -> bool {
    let (ns, host) = entry.split_once('/').unwrap_or(("*", entry));
    let ns_ok = match ns {
        "*" => true,
        "~" => false,
        "." => svc.namespace == sidecar_ns,
        other => svc.namespace == other,
    };
    ns_ok && hostname_matches(host, svc)
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

/// The services a proxy sees, sorted by hostname.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyScope {
    /// The Sidecar applied to the proxy, if any (sidecars only).
    pub sidecar: Option<Arc<Config<Sidecar>>>,
    /// Visible services, by hostname order.
    pub services: Vec<Arc<ServiceView>>,
}

impl ProxyScope {
    /// Computes the scope of a proxy.
    pub fn compute(proxy: &Proxy, ctx: &PushContext) -> ProxyScope {
        let sidecar = match proxy.kind {
            ProxyKind::Sidecar => ctx
                .sidecar_for(&proxy.namespace, &proxy.labels, ROOT_NAMESPACE)
                .cloned(),
            ProxyKind::Router => None,
        };
        let services = ctx
            .services
            .values()
            .filter(|svc| svc.visible_to(&proxy.namespace))
            .filter(|svc| match &sidecar {
                // No Sidecar, or one without egress listeners: everything exported to us.
                None => true,
                Some(sc) if sc.spec.egress.is_empty() => true,
                Some(sc) => sc.spec.egress.iter().any(|l| {
                    l.hosts
                        .iter()
                        .any(|h| host_entry_matches(h, &proxy.namespace, svc))
                }),
            })
            .cloned()
            .collect();
        ProxyScope { sidecar, services }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push_context::ServiceSource;
    use std::collections::BTreeMap;

    fn svc(name: &str, ns: &str) -> ServiceView {
        ServiceView {
            hostname: shoal_common::model::service_fqdn(name, ns),
            name: name.into(),
            namespace: ns.into(),
            ports: vec![],
            target_ports: BTreeMap::new(),
            vips: vec![],
            export_to: vec![],
            source: ServiceSource::Kubernetes,
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
