//! Which xDS types of which proxies a change can affect, so a push regenerates only those.
//!
//! Skipping is an optimisation, never a correctness shortcut: a stream that missed a
//! snapshot (snapshots coalesce) treats the next one as a full change, and every response
//! is still compared by version before it is sent.

use crate::index::proxy::ProxyKind;
use crate::index::scope::ProxyScope;
use crate::push::pipeline::ChangeSet;
use shoal_common::model::ConfigKind;
use shoal_proto::XdsType;
use std::collections::BTreeSet;

/// The types a change affects for a proxy of `kind` with `scope` (computed on the new
/// snapshot).
pub fn affected_types(
    changes: &ChangeSet,
    kind: ProxyKind,
    scope: &ProxyScope,
) -> BTreeSet<XdsType> {
    let all: BTreeSet<XdsType> = XdsType::ALL.into_iter().collect();
    // ztunnel's one mesh-wide view reads services, endpoints and authorization policies:
    // every change may be one of those.
    if changes.full || changes.services || kind == ProxyKind::Ztunnel {
        return all;
    }
    let mut out = BTreeSet::new();
    // A proxyless gRPC node reads what a sidecar reads (Sidecar scopes, no Gateways).
    let kind = match kind {
        ProxyKind::Proxyless => ProxyKind::Sidecar,
        k => k,
    };
    for k in &changes.config {
        match (k, kind) {
            // ServiceEntries and WorkloadEntries are services and endpoints.
            (ConfigKind::ServiceEntry | ConfigKind::WorkloadEntry, _) => return all,
            // The Gateway API becomes Gateways (listeners, the credentials they name) and
            // VirtualServices for gateways and, through Service parents, for sidecars.
            (
                ConfigKind::GatewayClass
                | ConfigKind::KubeGateway
                | ConfigKind::HTTPRoute
                | ConfigKind::GRPCRoute
                | ConfigKind::TCPRoute
                | ConfigKind::TLSRoute
                | ConfigKind::ReferenceGrant,
                _,
            ) => return all,
            // Namespace labels decide only which routes a Gateway listener admits
            // (`allowedRoutes` selectors); routes with Service parents never read them.
            (ConfigKind::Namespace, ProxyKind::Router) => {
                out.extend([XdsType::Listener, XdsType::Route]);
            }
            (ConfigKind::Namespace, ProxyKind::Sidecar) => {}
            // A Sidecar changes what a sidecar sees; gateways ignore Sidecars.
            (ConfigKind::Sidecar, ProxyKind::Sidecar) => return all,
            (ConfigKind::Sidecar, ProxyKind::Router) => {}
            // Gateways shape gateway listeners and routes; sidecars ignore them.
            (ConfigKind::Gateway, ProxyKind::Router) => {
                out.extend([XdsType::Listener, XdsType::Route]);
            }
            (ConfigKind::Gateway, ProxyKind::Sidecar) => {}
            // Credentials are served to gateways only; listeners name them, never embed them.
            (ConfigKind::Credential, ProxyKind::Router) => {
                out.insert(XdsType::Secret);
            }
            (ConfigKind::Credential, ProxyKind::Sidecar) => {}
            (_, ProxyKind::Proxyless | ProxyKind::Ztunnel) => return all,
            // HTTP rules shape route tables; `tcp`/`tls` rules shape listeners' filter
            // chains (sidecar outbound, gateway TCP/TLS servers): listeners only when a
            // VirtualService with such rules changed.
            (ConfigKind::VirtualService, _) => {
                out.insert(XdsType::Route);
                if changes.listener_rules {
                    out.insert(XdsType::Listener);
                }
            }
            // Inbound mTLS modes shape inbound listeners; a destination's mode decides
            // whether auto mTLS originates TLS to it (clusters), and so whether other
            // networks' endpoints are reached through their gateways (endpoints).
            (ConfigKind::PeerAuthentication, _) => {
                out.extend([XdsType::Listener, XdsType::Cluster, XdsType::Endpoint]);
            }
            // RBAC and `jwt_authn` filters live in inbound (and gateway) listeners.
            (ConfigKind::AuthorizationPolicy | ConfigKind::RequestAuthentication, _) => {
                out.insert(XdsType::Listener);
            }
            // Subsets and policies: clusters and their endpoints, and the routes that
            // carry a consistent hash's hash policy.
            (ConfigKind::DestinationRule, _) => {
                out.extend([XdsType::Cluster, XdsType::Endpoint, XdsType::Route]);
            }
        }
    }
    // Endpoints outside the proxy's scope cannot matter to it.
    let in_scope = |hosts: &BTreeSet<String>| {
        hosts.iter().any(|host| {
            scope
                .services
                .binary_search_by(|s| s.hostname.as_str().cmp(host))
                .is_ok()
        })
    };
    if in_scope(&changes.endpoints) {
        out.insert(XdsType::Endpoint);
    }
    // Service accounts and sidecars behind a destination shape its clusters' mutual TLS.
    if in_scope(&changes.identities) {
        out.insert(XdsType::Cluster);
    }
    // Who serves a Secret (workloads) and what a client certificate proves (token issuers)
    // decide which credentials a gateway gets.
    if kind == ProxyKind::Router && (changes.workloads || changes.token_issuers) {
        out.insert(XdsType::Secret);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::service::{ServiceSource, ServiceView};
    use std::sync::Arc;

    fn scope(hosts: &[&str]) -> ProxyScope {
        let services = hosts
            .iter()
            .map(|h| {
                Arc::new(ServiceView {
                    hostname: h.to_string(),
                    name: h.to_string(),
                    namespace: "ns".into(),
                    ports: vec![],
                    target_ports: Default::default(),
                    vips: vec![],
                    cluster_vips: Default::default(),
                    export_to: vec![],
                    source: ServiceSource::Kubernetes,
                    selector: Default::default(),
                })
            })
            .collect();
        ProxyScope {
            sidecar: None,
            services,
            outbound_policy: Default::default(),
            inbound: Vec::new(),
            gateway_ports: Default::default(),
        }
    }

    fn config(kinds: &[ConfigKind]) -> ChangeSet {
        ChangeSet {
            config: kinds.iter().copied().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn workloads_and_token_issuers_affect_gateway_credentials_only() {
        let s = scope(&[]);
        for changes in [
            ChangeSet {
                workloads: true,
                ..Default::default()
            },
            ChangeSet {
                token_issuers: true,
                ..Default::default()
            },
        ] {
            assert_eq!(
                affected_types(&changes, ProxyKind::Router, &s),
                [XdsType::Secret].into()
            );
            assert!(affected_types(&changes, ProxyKind::Sidecar, &s).is_empty());
        }
    }

    #[test]
    fn gateways_ignore_sidecars_and_sidecars_ignore_gateways() {
        let s = scope(&[]);
        assert!(affected_types(&config(&[ConfigKind::Sidecar]), ProxyKind::Router, &s).is_empty());
        assert!(affected_types(&config(&[ConfigKind::Gateway]), ProxyKind::Sidecar, &s).is_empty());
        assert_eq!(
            affected_types(&config(&[ConfigKind::Gateway]), ProxyKind::Router, &s),
            [XdsType::Listener, XdsType::Route].into()
        );
        assert_eq!(
            affected_types(&config(&[ConfigKind::Sidecar]), ProxyKind::Sidecar, &s).len(),
            XdsType::ALL.len()
        );
        // Namespace labels (Gateway API namespace selectors) reach gateways' listeners and
        // routes only.
        assert!(
            affected_types(&config(&[ConfigKind::Namespace]), ProxyKind::Sidecar, &s).is_empty()
        );
        assert_eq!(
            affected_types(&config(&[ConfigKind::Namespace]), ProxyKind::Router, &s),
            [XdsType::Listener, XdsType::Route].into()
        );
        // Credentials reach gateways' SDS only.
        assert!(
            affected_types(&config(&[ConfigKind::Credential]), ProxyKind::Sidecar, &s).is_empty()
        );
        assert_eq!(
            affected_types(&config(&[ConfigKind::Credential]), ProxyKind::Router, &s),
            [XdsType::Secret].into()
        );
    }

    #[test]
    fn per_type_impact() {
        let s = scope(&[]);
        assert_eq!(
            affected_types(
                &config(&[ConfigKind::VirtualService]),
                ProxyKind::Sidecar,
                &s
            ),
            [XdsType::Route].into()
        );
        assert_eq!(
            affected_types(
                &config(&[ConfigKind::DestinationRule]),
                ProxyKind::Router,
                &s
            ),
            [XdsType::Cluster, XdsType::Endpoint, XdsType::Route].into()
        );
        // jwt_authn filters (and fetched keys) live in inbound and gateway listeners.
        for kind in [ProxyKind::Sidecar, ProxyKind::Router] {
            assert_eq!(
                affected_types(&config(&[ConfigKind::RequestAuthentication]), kind, &s),
                [XdsType::Listener].into()
            );
        }
        let full = ChangeSet {
            full: true,
            ..Default::default()
        };
        assert_eq!(
            affected_types(&full, ProxyKind::Sidecar, &s).len(),
            XdsType::ALL.len()
        );
    }

    #[test]
    fn virtual_services_with_tcp_or_tls_rules_reach_listeners() {
        let s = scope(&[]);
        let mut c = config(&[ConfigKind::VirtualService]);
        c.listener_rules = true;
        for kind in [ProxyKind::Sidecar, ProxyKind::Router] {
            assert_eq!(
                affected_types(&c, kind, &s),
                [XdsType::Listener, XdsType::Route].into()
            );
        }
    }

    #[test]
    fn endpoints_outside_scope_are_skipped() {
        let s = scope(&["a.ns.svc.cluster.local", "b.ns.svc.cluster.local"]);
        let mut c = ChangeSet::default();
        c.endpoints.insert("z.other.svc.cluster.local".into());
        assert!(affected_types(&c, ProxyKind::Sidecar, &s).is_empty());
        c.endpoints.insert("b.ns.svc.cluster.local".into());
        assert_eq!(
            affected_types(&c, ProxyKind::Sidecar, &s),
            [XdsType::Endpoint].into()
        );
    }

    #[test]
    fn changed_workload_identities_reach_clusters() {
        let s = scope(&["a.ns.svc.cluster.local"]);
        let mut c = ChangeSet::default();
        c.endpoints.insert("z.other.svc.cluster.local".into());
        c.identities.insert("z.other.svc.cluster.local".into());
        assert!(affected_types(&c, ProxyKind::Sidecar, &s).is_empty());
        c.endpoints.insert("a.ns.svc.cluster.local".into());
        c.identities.insert("a.ns.svc.cluster.local".into());
        assert_eq!(
            affected_types(&c, ProxyKind::Router, &s),
            [XdsType::Cluster, XdsType::Endpoint].into()
        );
    }
}
