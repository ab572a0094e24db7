//! The PushContext: an immutable, indexed snapshot of services and Istio config that the
//! generators read. Rebuilt (off the hot path) only when config or services change; readers
//! hold an `Arc` and never lock.

use crate::destination_rule::{DestinationRuleIndex, MergedRule};
use crate::store::MeshState;
use shoal_common::credential::TlsCredential;
use shoal_common::model::{
    service_fqdn, AuthorizationPolicy, ConfigSpec, DestinationRule, Gateway, ObjectMeta,
    OutboundTrafficMode, PeerAuthentication, Protocol, Resolution, ServicePort, Sidecar,
    VirtualService, WorkloadEntry,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where a service comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServiceSource {
    /// A Kubernetes Service; endpoints come from the EDS shards.
    Kubernetes,
    /// A ServiceEntry host; endpoints come from the entry (and selected WorkloadEntries).
    ServiceEntry {
        /// How endpoints resolve.
        resolution: Resolution,
        /// The endpoints, sorted.
        endpoints: Vec<WorkloadEntry>,
        /// `location: MESH_INTERNAL`: the endpoints are mesh workloads (auto mTLS applies);
        /// `MESH_EXTERNAL`, the default, means they are not.
        mesh_internal: bool,
    },
}

/// A service as the generators see it: merged across clusters, keyed by hostname.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceView {
    /// The hostname (FQDN for Kubernetes services, the host for ServiceEntries).
    pub hostname: String,
    /// Short name (Kubernetes) or the host (ServiceEntry).
    pub name: String,
    /// Namespace of the Service / ServiceEntry.
    pub namespace: String,
    /// Ports, sorted by number.
    pub ports: Vec<ServicePort>,
    /// Workload port per service port, where it differs (ServiceEntry `targetPort`).
    pub target_ports: BTreeMap<u16, u16>,
    /// Virtual IPs across clusters.
    pub vips: Vec<String>,
    /// Virtual IPs by cluster ID (Kubernetes services): a proxy listens on its own
    /// cluster's ClusterIP, as istiod's `GetAddressForProxy`.
    pub cluster_vips: BTreeMap<String, Vec<String>>,
    /// Namespaces the service is exported to (empty = all).
    pub export_to: Vec<String>,
    /// Kubernetes or ServiceEntry.
    pub source: ServiceSource,
    /// The labels of the workloads behind the service (a Kubernetes Service's `selector`,
    /// a ServiceEntry's `workloadSelector`); empty = selects nothing.
    pub selector: BTreeMap<String, String>,
}

impl ServiceView {
    /// The port with this number.
    pub fn port(&self, number: u32) -> Option<&ServicePort> {
        self.ports.iter().find(|p| u32::from(p.port) == number)
    }

    /// The address a proxy in `cluster` reaches this service at: its cluster's ClusterIP,
    /// else the first VIP (other clusters', a ServiceEntry's), else none.
    pub fn vip_for(&self, cluster: &str) -> Option<&str> {
        self.cluster_vips
            .get(cluster)
            .and_then(|v| v.first())
            .or_else(|| self.vips.first())
            .map(String::as_str)
    }

    /// Whether a proxy in `namespace` may see this service.
    pub fn visible_to(&self, namespace: &str) -> bool {
        exported_to(&self.export_to, &self.namespace, namespace)
    }
}

/// Istio `exportTo` semantics: empty or `*` = everywhere, `.` = own namespace, `~` = nowhere.
pub fn exported_to(export_to: &[String], own_ns: &str, viewer_ns: &str) -> bool {
    export_to.is_empty()
        || export_to
            .iter()
            .any(|e| e == "*" || (e == "." && own_ns == viewer_ns) || e == viewer_ns)
}

/// A config object with its metadata, typed by spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config<T> {
    /// Name, namespace, labels.
    pub meta: ObjectMeta,
    /// The spec.
    pub spec: T,
}

/// The indexed snapshot.
#[derive(Debug, Default)]
pub struct PushContext {
    /// Services by hostname: the first definition of each host.
    pub services: BTreeMap<String, Arc<ServiceView>>,
    /// Further definitions of a host from other namespaces (ServiceEntries), in order: a
    /// proxy sees its own namespace's definition first (see `ProxyScope::compute`).
    pub shadowed: BTreeMap<String, Vec<Arc<ServiceView>>>,
    /// VirtualServices in istiod's precedence order: creation time, then name, then
    /// namespace (see `ObjectMeta::precedence`). Roots come merged with their delegates
    /// (`crate::delegation`).
    pub virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// Every DestinationRule, by `namespace/name`.
    pub destination_rules: BTreeMap<String, Arc<Config<DestinationRule>>>,
    /// DestinationRules indexed and merged as istiod does (see [`DestinationRuleIndex`]).
    pub destination_rule_index: DestinationRuleIndex,
    /// Gateways in (namespace, name) order.
    pub gateways: Vec<Arc<Config<Gateway>>>,
    /// Sidecars by namespace, in name order.
    pub sidecars: BTreeMap<String, Vec<Arc<Config<Sidecar>>>>,
    /// PeerAuthentications by namespace, oldest first (istiod's order: creation time, then
    /// name; see `crate::peer_authentication`).
    pub peer_authentications: BTreeMap<String, Vec<Arc<Config<PeerAuthentication>>>>,
    /// AuthorizationPolicies by namespace, in name order.
    pub authorization_policies: BTreeMap<String, Vec<Arc<Config<AuthorizationPolicy>>>>,
    /// Mesh-wide settings.
    pub mesh: Arc<MeshSettings>,
    /// Gateway credentials, opened, by (namespace, Secret name).
    pub credentials: BTreeMap<(String, String), Arc<TlsCredential>>,
}

/// The mesh-wide settings the generators read (Istio's MeshConfig subset).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeshSettings {
    /// Where sidecars send traffic for destinations outside the registry, unless their
    /// Sidecar says otherwise (`outboundTrafficPolicy.mode`).
    pub outbound_traffic_policy: OutboundTrafficMode,
    /// The namespace whose selector-less Sidecar applies mesh-wide (`rootNamespace`).
    pub root_namespace: String,
    /// The mesh's trust domain (`trustDomain`): the trust domain of the identities read
    /// from service-account tokens on the secure xDS port (read at startup), and of the
    /// SPIFFE identities mutual TLS verifies.
    pub trust_domain: String,
    /// Sidecars originate Istio mutual TLS to in-mesh destinations that a DestinationRule
    /// leaves without TLS settings (`enableAutoMtls`, default true).
    pub enable_auto_mtls: bool,
}

impl Default for MeshSettings {
    fn default() -> Self {
        MeshSettings {
            outbound_traffic_policy: OutboundTrafficMode::AllowAny,
            root_namespace: shoal_common::defaults::ROOT_NAMESPACE.into(),
            trust_domain: shoal_common::defaults::TRUST_DOMAIN.into(),
            enable_auto_mtls: true,
        }
    }
}

/// Resolves a host as written in config in `namespace` to a hostname: a short name
/// (no dots) becomes the FQDN of that service in the namespace.
pub fn resolve_host(host: &str, namespace: &str) -> String {
    if host.contains('.') || host.contains('*') {
        host.to_string()
    } else {
        service_fqdn(host, namespace)
    }
}

/// Whether a host pattern (`*`, `*.suffix`, or a hostname) covers `host`, as Istio's
/// `SubsetOf`: a wildcard also covers the narrower wildcards under it (`*.com` covers
/// `*.a.com`).
pub fn wildcard_covers(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => host.strip_prefix('*').unwrap_or(host).ends_with(suffix),
        None => pattern == host,
    }
}

/// The entry of `map` for `host`: the exact key, else the most specific wildcard key that
/// covers it (Istio's `MostSpecificHostMatch`).
pub fn most_specific<'a, V>(map: &'a BTreeMap<String, V>, host: &str) -> Option<&'a V> {
    map.get(host).or_else(|| {
        map.iter()
            .filter(|(k, _)| k.starts_with('*') && wildcard_covers(k, host))
            .max_by_key(|(k, _)| k.len())
            .map(|(_, v)| v)
    })
}

/// Whether every label of `selector` is in `labels` (an empty selector matches all).
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl PushContext {
    /// Builds the context from the store.
    pub fn build(state: &MeshState) -> PushContext {
        let mut ctx = PushContext {
            mesh: state.mesh.clone(),
            ..PushContext::default()
        };
        // Kubernetes services: merge clusters by hostname. The (cluster, ns, name) order makes
        // the merge deterministic: the first cluster's ports win, VIPs are unioned.
        for svc in state.services.values() {
            let view = ctx.services.entry(svc.hostname.clone()).or_insert_with(|| {
                let mut ports = svc.ports.clone();
                ports.sort_by_key(|p| p.port);
                Arc::new(ServiceView {
                    hostname: svc.hostname.clone(),
                    name: svc.meta.name.clone(),
                    namespace: svc.meta.namespace.clone(),
                    ports,
                    target_ports: BTreeMap::new(),
                    vips: Vec::new(),
                    cluster_vips: BTreeMap::new(),
                    export_to: svc.export_to.clone(),
                    source: ServiceSource::Kubernetes,
                    selector: svc.selector.clone(),
                })
            });
            let view = Arc::make_mut(view);
            if !svc.cluster_ips.is_empty() {
                view.cluster_vips
                    .entry(svc.cluster.clone())
                    .or_default()
                    .extend(svc.cluster_ips.iter().cloned());
            }
            for ip in &svc.cluster_ips {
                if !view.vips.contains(ip) {
                    view.vips.push(ip.clone());
                }
            }
        }

        let mut workload_entries: BTreeMap<String, Vec<(String, WorkloadEntry)>> = BTreeMap::new();
        for obj in state.config.values() {
            if let ConfigSpec::WorkloadEntry(we) = &obj.spec {
                workload_entries
                    .entry(obj.meta.namespace.clone())
                    .or_default()
                    .push((obj.meta.name.clone(), we.clone()));
            }
        }

        for obj in state.config.values() {
            let meta = obj.meta.clone();
            match &obj.spec {
                ConfigSpec::VirtualService(vs) => ctx.virtual_services.push(Arc::new(Config {
                    meta,
                    spec: vs.clone(),
                })),
                ConfigSpec::DestinationRule(dr) => {
                    let key = format!("{}/{}", meta.namespace, meta.name);
                    ctx.destination_rules.insert(
                        key,
                        Arc::new(Config {
                            meta,
                            spec: dr.clone(),
                        }),
                    );
                }
                ConfigSpec::Gateway(gw) => ctx.gateways.push(Arc::new(Config {
                    meta,
                    spec: gw.clone(),
                })),
                ConfigSpec::PeerAuthentication(pa) => ctx
                    .peer_authentications
                    .entry(meta.namespace.clone())
                    .or_default()
                    .push(Arc::new(Config {
                        meta,
                        spec: pa.clone(),
                    })),
                ConfigSpec::AuthorizationPolicy(ap) => ctx
                    .authorization_policies
                    .entry(meta.namespace.clone())
                    .or_default()
                    .push(Arc::new(Config {
                        meta,
                        spec: ap.clone(),
                    })),
                ConfigSpec::Sidecar(sc) => ctx
                    .sidecars
                    .entry(meta.namespace.clone())
                    .or_default()
                    .push(Arc::new(Config {
                        meta,
                        spec: sc.clone(),
                    })),
                ConfigSpec::ServiceEntry(se) => {
                    let mut endpoints = se.endpoints.clone();
                    if let Some(sel) = &se.workload_selector {
                        for (_, we) in workload_entries.get(&meta.namespace).into_iter().flatten() {
                            if labels_match(&sel.labels, &we.labels) {
                                endpoints.push(we.clone());
                            }
                        }
                    }
                    endpoints.sort_by(|a, b| a.address.cmp(&b.address));
                    let mut ports: Vec<ServicePort> = Vec::new();
                    let mut target_ports = BTreeMap::new();
                    for p in &se.ports {
                        let Ok(number) = u16::try_from(p.number) else {
                            continue;
                        };
                        ports.push(ServicePort {
                            name: p.name.clone(),
                            port: number,
                            protocol: Protocol::parse(&p.protocol),
                            target_port: None,
                        });
                        if let Some(t) = p.target_port.and_then(|t| u16::try_from(t).ok()) {
                            target_ports.insert(number, t);
                        }
                    }
                    ports.sort_by_key(|p| p.port);
                    let resolution = se.resolution.unwrap_or(Resolution::None);
                    for host in &se.hosts {
                        let view = || {
                            Arc::new(ServiceView {
                                hostname: host.clone(),
                                name: host.clone(),
                                namespace: meta.namespace.clone(),
                                ports: ports.clone(),
                                target_ports: target_ports.clone(),
                                vips: se.addresses.clone(),
                                cluster_vips: BTreeMap::new(),
                                export_to: se.export_to.clone(),
                                source: ServiceSource::ServiceEntry {
                                    resolution,
                                    endpoints: endpoints.clone(),
                                    mesh_internal: se.location.as_deref() == Some("MESH_INTERNAL"),
                                },
                                selector: se
                                    .workload_selector
                                    .as_ref()
                                    .map(|w| w.labels.clone())
                                    .unwrap_or_default(),
                            })
                        };
                        // A Kubernetes service of the same name keeps precedence, as in
                        // Istio. The same host defined in another namespace is kept too:
                        // which one a proxy sees depends on its namespace (see
                        // `ProxyScope`), as istiod resolves hosts per namespace.
                        match ctx.services.get(host) {
                            None => {
                                ctx.services.insert(host.clone(), view());
                            }
                            Some(first)
                                if first.namespace != meta.namespace
                                    && !ctx.shadowed.get(host).is_some_and(|v| {
                                        v.iter().any(|s| s.namespace == meta.namespace)
                                    }) =>
                            {
                                ctx.shadowed.entry(host.clone()).or_default().push(view());
                            }
                            Some(_) => {}
                        }
                    }
                }
                ConfigSpec::WorkloadEntry(_) => {}
                ConfigSpec::Credential(sealed) => {
                    let Some(keys) = &state.credential_keys else {
                        tracing::warn!(
                            secret = %format!("{}/{}", meta.namespace, meta.name),
                            "gateway credential on the bus, but no --credential-key-file to \
                             open it: not served"
                        );
                        continue;
                    };
                    match keys.open(&meta.namespace, &meta.name, sealed) {
                        Ok(c) => {
                            ctx.credentials
                                .insert((meta.namespace, meta.name), Arc::new(c));
                        }
                        Err(error) => tracing::warn!(
                            secret = %format!("{}/{}", meta.namespace, meta.name),
                            %error,
                            "gateway credential does not open: not served"
                        ),
                    }
                }
            }
        }
        let rules: Vec<_> = ctx.destination_rules.values().cloned().collect();
        ctx.destination_rule_index = DestinationRuleIndex::build(&rules, &ctx.mesh.root_namespace);
        ctx.virtual_services
            .sort_by(|a, b| a.meta.precedence().cmp(&b.meta.precedence()));
        for policies in ctx.peer_authentications.values_mut() {
            policies.sort_by(|a, b| a.meta.precedence().cmp(&b.meta.precedence()));
        }
        ctx.virtual_services = crate::delegation::merge_delegates(&ctx.virtual_services);
        ctx
    }

    /// The Sidecar that applies to a workload: the one in its namespace whose selector
    /// matches its labels, else the namespace's selector-less one, else the root
    /// namespace's selector-less one.
    pub fn sidecar_for(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        root_namespace: &str,
    ) -> Option<&Arc<Config<Sidecar>>> {
        let in_ns = self
            .sidecars
            .get(namespace)
            .map(Vec::as_slice)
            .unwrap_or_default();
        in_ns
            .iter()
            .find(|s| {
                s.spec
                    .workload_selector
                    .as_ref()
                    .is_some_and(|w| labels_match(&w.labels, labels))
            })
            .or_else(|| in_ns.iter().find(|s| s.spec.workload_selector.is_none()))
            .or_else(|| {
                self.sidecars
                    .get(root_namespace)
                    .and_then(|v| v.iter().find(|s| s.spec.workload_selector.is_none()))
            })
    }

    /// The DestinationRule that applies to a proxy's traffic to a service, as istiod
    /// looks it up (proxy namespace, service namespace, root namespace; `exportTo`,
    /// `workloadSelector`; several rules for a host merged).
    pub fn destination_rule(
        &self,
        proxy_namespace: &str,
        proxy_labels: &BTreeMap<String, String>,
        svc: &ServiceView,
    ) -> Option<Arc<MergedRule>> {
        self.destination_rule_index
            .for_proxy(proxy_namespace, proxy_labels, svc)
    }

    /// The Gateways whose selector matches a gateway proxy's labels. A Gateway without a
    /// selector applies to every gateway proxy, as in Istio.
    pub fn gateways_for(&self, labels: &BTreeMap<String, String>) -> Vec<&Arc<Config<Gateway>>> {
        self.gateways
            .iter()
            .filter(|g| labels_match(&g.spec.selector, labels))
            .collect()
    }
}
